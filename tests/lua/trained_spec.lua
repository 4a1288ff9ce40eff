-- The trained model that ships in models/tide-tiny-en (scripts/train/,
-- docs/training.md): it loads in DeepSeek's formats, its tokenizer agrees
-- with the JavaScript reference and round-trips, greedy decoding reproduces
-- stored ids, it predicts held-out text (bits per byte within a bound), and
-- the fast path agrees with the golden scalar reference on that text.
local tide = require("tide")
local cjson = require("cjson")

local DIR = os.getenv("TIDE_TRAINED_MODEL") or "models/tide-tiny-en"
local FIX = "tests/fixtures/trained/"
local BUILD = os.getenv("TIDE_BUILD_DIR") or "build"
local EXE = os.getenv("TIDE_EXE") or (BUILD .. "/tide")
local TMP = os.getenv("TIDE_TEST_TMP") or (BUILD .. "/test-tmp")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("*a")
  local ok = p:close()
  return ok, out
end

-- `tide perplexity ... --json` as a table
local function perplexity(extra)
  local ok, out = sh(EXE .. " perplexity --model " .. DIR .. " --file " .. FIX .. "heldout_slice.txt --ctx 256"
    .. " --batch 2 --quiet --json --threads 1 " .. extra)
  assert(ok, out)
  return cjson.decode(out:match("{.*}"))
end

-- greedy ids after `prompt`, n of them, by stepping the model
local function greedy(m, prompt, n)
  local ids = m.tokenizer:encode(prompt)
  local seq = assert(m:sequence())
  local logits = assert(m:prefill(seq, ids))
  local out = {}
  for i = 1, n do
    local id = logits:argmax()
    out[i] = id
    logits = assert(m:step({ { seq = seq, tokens = { id } } }))[1]
  end
  seq:free()
  return out
end

describe("the trained model " .. DIR, function()
  local m = assert(tide.model(DIR, { max_tokens = 256, cache = { context = 512, max_seqs = 4 } }))
  local slice = read(FIX .. "heldout_slice.txt")

  it("is a DeepSeek-V4 checkpoint in DeepSeek's formats with every path of the architecture", function()
    local c = m.config
    assert.are.equal(4096, c.vocab_size)
    assert.are.same({ 0, 4, 128, 4, 0 }, c.compress_ratios)
    assert.are.equal(1, c.num_nextn_predict_layers)
    assert.are.equal(1, c.num_hash_layers)
    assert.is_true(c.index_topk < 64)          -- the indexer selects at a few hundred tokens
    local ck = assert(tide.load(DIR))
    assert.are.equal("f8e4m3", ck:tensor("layers.1.attn.wq_b.weight"):dtype_name())
    assert.are.equal("e8m0", ck:tensor("layers.1.attn.wq_b.scale"):dtype_name())
    assert.are.equal("i8", ck:tensor("layers.2.ffn.experts.0.w1.weight"):dtype_name())
    assert.are.equal("bf16", ck:tensor("embed.weight"):dtype_name())
    assert.are.equal("i64", ck:tensor("layers.0.ffn.gate.tid2eid"):dtype_name())
    assert.is_true(ck:has("mtp.0.e_proj.weight"))
    ck:close()
  end)

  it("tokenizes held-out text as the JavaScript reference does, and decodes it back", function()
    local want = cjson.decode(read(FIX .. "heldout_slice.ids.json"))
    local ids = m.tokenizer:encode(slice, { add_special_tokens = false })
    assert.are.equal(want.n, #ids)
    assert.are.same(want.ids, ids)
    assert.are.equal(slice, m.tokenizer:decode(ids))
    local with_bos = m.tokenizer:encode("In the beginning")
    assert.are.equal(0, with_bos[1])
  end)

  it("continues a fixed prompt greedily with the stored ids", function()
    local want = cjson.decode(read(FIX .. "greedy.json"))
    local got = greedy(m, want.prompt, #want.ids)
    assert.are.same(want.ids, got)
    -- and it is English the tokenizer decodes to words
    assert.is_truthy(m.tokenizer:decode(got):match("%a+ %a+ %a+"))
  end)

  it("predicts held-out text: bits per byte within the bound", function()
    local r = perplexity("")
    assert.are.equal(#slice, r.bytes)
    local bound = cjson.decode(read(FIX .. "greedy.json")).bpb_bound
    assert.is_true(r.bpb <= bound, string.format("bpb %.4f > %.4f", r.bpb, bound))
    -- a model that learned nothing would be near log2(4096) / bytes per token
    assert.is_true(r.bpb < 2.5)
  end)

  it("fast path against the golden reference on held-out text: KL <= 1e-4, top-1 >= 99%", function()
    os.execute("mkdir -p " .. TMP)
    local base = TMP .. "/trained_ref.kld"
    os.remove(base)
    local ref = perplexity("--limit 300 --reference --kld-base " .. base)
    local fast = perplexity("--limit 300 --kld-base " .. base)
    os.remove(base)
    assert.are.equal(300, fast.tokens)
    assert.is_true(fast.kl <= 1e-4, "mean KL " .. fast.kl)
    assert.is_true(fast.top1 >= 0.99, "top-1 agreement " .. fast.top1)
    assert.is_true(math.abs(fast.ppl - ref.ppl) / ref.ppl < 0.01)
  end)

  it("perplexity: windows batched or not give the same numbers; the --index switch changes them", function()
    local t = perplexity("--limit 300")
    local one = perplexity("--limit 300 --batch 1")
    assert.are.equal(t.nll, one.nll)
    assert.are.equal("topk", t.index)
    local d = perplexity("--limit 300 --index dense")
    assert.are_not.equal(d.nll, t.nll)
  end)
end)
