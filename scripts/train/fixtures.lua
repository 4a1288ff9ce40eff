-- fixtures.lua: the stored expectations of tests/lua/trained_spec.lua for the shipped model:
-- the greedy continuation of a fixed prompt, and the bits-per-byte bound on the held-out
-- slice (the measured value + 0.02). Rerun after retraining.
--   tide scripts/train/fixtures.lua [MODEL_DIR]
local tide = require("tide")
local cjson = require("cjson")
local dir = arg[1] or "models/tide-tiny-en"
local FIX = "tests/fixtures/trained/"
local PROMPT = "And God said unto Moses,"
local N = 24

local m = assert(tide.model(dir, { max_tokens = 256, cache = { context = 512, max_seqs = 4 } }))
local ids = m.tokenizer:encode(PROMPT)
local seq = assert(m:sequence())
local logits = assert(m:prefill(seq, ids))
local out = {}
for i = 1, N do
  out[i] = logits:argmax()
  logits = assert(m:step({ { seq = seq, tokens = { out[i] } } }))[1]
end
seq:free()
local exe = arg[-1] or "build/tide"
local p = assert(io.popen(exe .. " perplexity --model " .. dir .. " --file " .. FIX
  .. "heldout_slice.txt --ctx 256 --batch 2 --quiet --json --threads 1"))
local r = cjson.decode(p:read("*a"):match("{.*}"))
p:close()
local bound = math.floor((r.bpb + 0.02) * 1000 + 0.5) / 1000
local f = assert(io.open(FIX .. "greedy.json", "wb"))
f:write(string.format('{"prompt": %s, "text": %s, "ids": [%s], "bpb": %.4f, "bpb_bound": %.3f}\n',
  cjson.encode(PROMPT), cjson.encode(m.tokenizer:decode(out)), table.concat(out, ", "), r.bpb, bound))
f:close()
io.stderr:write(string.format("fixtures: %q -> %q; held-out slice %.4f bits/byte (bound %.3f)\n", PROMPT,
  m.tokenizer:decode(out), r.bpb, bound))
