#!/usr/bin/env node
// tokenizer_golden.js - token ids of a text file under the trained model's tokenizer, from the
// JavaScript reference (@lenml/tokenizers, a port of Hugging Face's tokenizers), for comparing
// with tide's own tokenizer.
//
//   node scripts/train/tokenizer_golden.js MODEL_DIR FILE > ids.json     {"n": N, "ids": [...]} (no BOS)
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..", "..");
const mods = path.join(root, "build-deps", "node_modules");
const { TokenizerLoader } = require(path.join(mods, "@lenml/tokenizers"));

const [dir, file] = process.argv.slice(2);
if (!dir || !file) {
  console.error("usage: tokenizer_golden.js MODEL_DIR FILE");
  process.exit(2);
}
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const text = fs.readFileSync(file, "utf8");
const ids = tok.encode(text, { add_special_tokens: false });
process.stdout.write(JSON.stringify({ n: ids.length, ids: Array.from(ids) }) + "\n");
