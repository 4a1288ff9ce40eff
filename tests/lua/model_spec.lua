-- The DeepSeek-V4 model wired in Lua, on generated tiny checkpoints: the fast
-- path against the golden scalar reference and the independent NumPy one
-- (decisions replayed, doc section 8), bitwise invariances (prefill = decode =
-- chunked, alone = in a batch, fork = original), errors that leave the model
-- usable, and the `tide logits` contract.
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")

local V = 1024

-- per-position NMSE and cosine of two [T, V] tensors
local function per_position(a, b)
  local T = a:size(0)
  local nm, cos = {}, {}
  for t = 0, T - 1 do
    local c = a[t]:compare(b[t])
    nm[t + 1], cos[t + 1] = c.nmse, c.cosine
  end
  local sorted = {}
  for i, v in ipairs(nm) do sorted[i] = v end
  table.sort(sorted)
  local worst, mincos = 0, 1
  for i = 1, T do
    if nm[i] > worst then worst = nm[i] end
    if cos[i] < mincos then mincos = cos[i] end
  end
  return { median = sorted[math.floor((T + 1) / 2)], worst = worst, mincos = mincos }
end

local function same_bits(a, b)
  local n = a:numel() * 4
  return a:numel() == b:numel() and ffi.C.memcmp(a.data, b.data, n) == 0
end
ffi.cdef [[ int memcmp(const void *a, const void *b, size_t n); ]]

local function rows_equal(a, ra, b, rb, n)
  for i = 0, n - 1 do
    if not same_bits(a[ra + i], b[rb + i]) then return false, i end
  end
  return true
end

describe("the DeepSeek-V4 model", function()
  -- real formats (FP8 + MXFP4), hash layer 0, ratios [0, 4, 128, 4], a top-k
  -- of 16 so the indexer really selects from position 67 on
  local A = tm.get("tk16", { "--preset", "tiny", "--set", "index_topk=16", "--seed", "7" })
  -- bf16 weights, no hash layers, another ratio pattern and top-k
  local B = tm.get("bf16_r", { "--preset", "tiny", "--variant", "bf16", "--seed", "3", "--set", "num_hash_layers=0",
    "--set", "compress_ratios=[4,128,0,4,0]", "--set", "index_topk=24" })

  local mA = assert(tide.model(A, { max_tokens = 128, tokenizer = false, cache = { context = 2200, max_seqs = 8 } }))
  local toks = tm.tokens(300, V, 1)

  local fast
  local dumps = { topk = {}, routes = {} }
  it("prefill, token-by-token decode and chunked prefill give bitwise equal logits", function()
    fast = mA:logits(toks, { mode = "prefill", step = { dump_topk = dumps.topk, dump_routes = dumps.routes } })
    for _, mode in ipairs({ "decode", "chunked:7", "chunked:64" }) do
      local other = mA:logits(toks, { mode = mode })
      assert.is_true(same_bits(fast, other), mode .. " differs from prefill")
    end
  end)

  it("gives bitwise the same logits with 1 and 2 threads", function()
    local t = tm.tokens(160, V, 17)
    local n0 = tide.threads()
    tide.threads(1)
    local one = mA:logits(t, { mode = "chunked:40" })
    tide.threads(2)
    local two = mA:logits(t, { mode = "chunked:40" })
    tide.threads(n0)
    assert.is_true(same_bits(one, two), "1 vs 2 threads differ")
  end)

  it("matches the golden reference at every position, across the window, C128 entries and real top-k", function()
    -- the dumps hold every decision of the fast path: the reference replays them
    assert.equals(300, #dumps.topk[1])
    assert.equals(300, #dumps.routes[3])
    local ref = mA:reference_logits(toks, { replay = dumps })
    local s = per_position(fast, ref)
    assert.is_true(s.median < 3e-4, "median NMSE " .. s.median)
    assert.is_true(s.worst < 2e-3, "worst NMSE " .. s.worst)
    assert.is_true(s.mincos > 0.999, "min cosine " .. s.mincos)
    -- and free-running (its own decisions), most positions still agree closely
    local free = mA:reference_logits(toks)
    local f = per_position(fast, free)
    assert.is_true(f.median < 1e-3, "free-running median NMSE " .. f.median)
  end)

  it("matches the independent NumPy implementation with the decisions replayed", function()
    local py = "/usr/bin/python3"
    local out, rc = tm.sh(py .. " -c 'import numpy'")
    assert.equals(0, rc, "python3-numpy is required (scripts/deps.sh installs it): " .. out)
    local dir = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/model_spec_np"
    os.execute("mkdir -p " .. tm.q(dir))
    local cjson = require("cjson")
    local function dump(path, d)
      local layers = {}
      for L, rows in pairs(d) do layers[tostring(L)] = rows end
      local f = assert(io.open(path, "wb"))
      f:write(cjson.encode({ layers = layers }))
      f:close()
    end
    dump(dir .. "/topk.json", dumps.topk)
    dump(dir .. "/routes.json", dumps.routes)
    local n = 200
    local ids = {}
    for i = 1, n do ids[i] = toks[i] end
    out, rc = tm.sh(table.concat({ py, tm.q(tm.ROOT .. "/tests/ref/dsv4_numpy.py"), "--model", tm.q(A),
      "--tokens", table.concat(ids, ","), "--out", tm.q(dir .. "/np.f32"), "--replay-topk", tm.q(dir .. "/topk.json"),
      "--replay-routes", tm.q(dir .. "/routes.json") }, " "))
    assert.equals(0, rc, out)
    local np = assert(tide.mmap(dir .. "/np.f32", "f32", { n, V }))
    local s = per_position(fast:narrow(0, 0, n), np)
    assert.is_true(s.median < 3e-4, "median NMSE vs numpy " .. s.median)
    assert.is_true(s.worst < 2e-3, "worst NMSE vs numpy " .. s.worst)
  end)

  it("bf16 weights, no hash layers, ratios [4, 128, 0, 4]: fast path against the reference", function()
    local mB = assert(tide.model(B, { max_tokens = 64, tokenizer = false }))
    local tb = tm.tokens(180, V, 2)
    local d = { topk = {}, routes = {} }
    local f = mB:logits(tb, { mode = "chunked:50", step = { dump_topk = d.topk, dump_routes = d.routes } })
    assert.is_true(same_bits(f, mB:logits(tb, { mode = "chunked:13" })))
    local r = mB:reference_logits(tb, { replay = d })
    local s = per_position(f, r)
    assert.is_true(s.median < 3e-4, "median NMSE " .. s.median)
    assert.is_true(s.worst < 2e-3, "worst NMSE " .. s.worst)
    mB:close()
  end)

  it("a request gives the same logits alone or in a batch with others (bitwise)", function()
    local ta, tb = tm.tokens(150, V, 3), tm.tokens(260, V, 4)
    local alone_a, alone_b = mA:logits(ta), mA:logits(tb)
    local sa, sb = mA:sequence(), mA:sequence()
    -- a schedule mixing prefill chunks and decode tokens of both
    local plan = { { 80, 37 }, { 1, 60 }, { 30, 1 }, { 39, 80 }, { 0, 82 } }
    local ia, ib = 0, 0
    for _, p in ipairs(plan) do
      local entries = {}
      local na, nb = p[1], p[2]
      local ea, eb
      if na > 0 then
        local part = {}
        for j = 1, na do part[j] = ta[ia + j] end
        ea = #entries + 1
        entries[ea] = { seq = sa, tokens = part, logits = "all" }
      end
      if nb > 0 then
        local part = {}
        for j = 1, nb do part[j] = tb[ib + j] end
        eb = #entries + 1
        entries[eb] = { seq = sb, tokens = part, logits = "all" }
      end
      local res = assert(mA:step(entries))
      if ea then assert.is_true(rows_equal(res[ea], 0, alone_a, ia, na), "request A differs in a batch") end
      if eb then assert.is_true(rows_equal(res[eb], 0, alone_b, ib, nb), "request B differs in a batch") end
      ia, ib = ia + na, ib + nb
    end
    assert.equals(150, sa:len())
    assert.equals(260, sb:len())
    sa:free()
    sb:free()
  end)

  it("a fork continues exactly like the original; the original is untouched by the fork's tokens", function()
    local pre, cont, other = tm.tokens(140, V, 5), tm.tokens(20, V, 6), tm.tokens(20, V, 7)
    local s = mA:sequence()
    mA:prefill(s, pre)
    local f = assert(s:fork())
    mA:prefill(f, other)                       -- the fork goes elsewhere first
    local g = assert(s:fork())
    local la = mA:step({ { seq = s, tokens = cont, logits = "all" } })[1]:clone()
    local lg = mA:step({ { seq = g, tokens = cont, logits = "all" } })[1]:clone()
    assert.is_true(same_bits(la, lg), "fork differs from the original")
    local full = {}
    for i, v in ipairs(pre) do full[i] = v end
    for i, v in ipairs(cont) do full[#pre + i] = v end
    local fresh = mA:logits(full)
    assert.is_true(rows_equal(la, 0, fresh, #pre, #cont), "original changed by its fork")
    s:free(); f:free(); g:free()
  end)

  it("decode across the C4 entry 511/512 and the first real top-k (p = 2047, 2051) equals prefill", function()
    local m = assert(tide.model(tm.get("tiny1", { "--preset", "tiny", "--seed", "1" }),
      { max_tokens = 512, tokenizer = false, cache = { context = 2100, max_seqs = 2 } }))
    local t = tm.tokens(2060, V, 8)
    local s = m:sequence()
    local head = {}
    for i = 1, 2040 do head[i] = t[i] end
    local all = m:logits(t)                       -- prefill in steps of 512
    m:prefill(s, head)
    for i = 2041, 2060 do
      local row = m:step({ { seq = s, tokens = { t[i] } } })[1]
      assert.is_true(same_bits(row, all[i - 1]), "decode at position " .. (i - 1) .. " differs from prefill")
    end
    m:close()
  end)

  it("bad input is a clear error and the model stays usable", function()
    local s = mA:sequence()
    mA:prefill(s, tm.tokens(10, V, 9))
    assert.has_error(function() mA:step({ { seq = s, tokens = { V } } }) end,
      "step entry 1: token id 1024 at index 0 is outside the vocabulary (0..1023)")
    assert.has_error(function() mA:step({ { seq = s, tokens = { -1 } } }) end)
    assert.equals(10, s:len())
    -- positions past max_position_embeddings
    local saved = mA.max_positions
    mA.max_positions = 12
    local ok, err = pcall(mA.step, mA, { { seq = s, tokens = { 1, 2, 3 } } })
    mA.max_positions = saved
    assert.is_false(ok)
    assert.matches("beyond max_position_embeddings %(12%)", err)
    assert.equals(10, s:len())
    -- the sequence continues as if nothing had happened
    local row = mA:step({ { seq = s, tokens = { 5 } } })[1]:clone()
    local ref = tm.tokens(10, V, 9)
    ref[11] = 5
    assert.is_true(same_bits(row, mA:logits(ref)[10]))
    s:free()
  end)

  it("a full cache refuses the step and changes nothing; a shorter one then runs", function()
    local m = assert(tide.model(A, { max_tokens = 512, tokenizer = false,
      cache = { context = 256, seq_budget = 1, max_seqs = 2 } }))
    local s = m:sequence()
    local res, err = m:step({ { seq = s, tokens = tm.tokens(300, V, 10) } })
    assert.is_nil(res)
    assert.matches("cache full", err)
    assert.equals(0, s:len())
    local st = m:cache_stats()
    assert.equals(st.pages, st.pages_free)
    local row = assert(m:step({ { seq = s, tokens = tm.tokens(200, V, 10) } }))[1]:clone()
    s:free()
    assert.is_true(same_bits(row, m:logits(tm.tokens(200, V, 10))[199]))
    m:close()
  end)

  it("a Lua error inside the wiring aborts the step and leaves the cache as it was", function()
    local s = mA:sequence()
    local pre = tm.tokens(64, V, 11)
    mA:prefill(s, pre)
    local net = mA.net
    local orig = net.moe
    net.moe = function(self, l, st)
      if l.index == 2 then error("boom in layer 2") end
      return orig(self, l, st)
    end
    local ok, err = pcall(mA.step, mA, { { seq = s, tokens = tm.tokens(40, V, 12) } })
    net.moe = orig
    assert.is_false(ok)
    assert.matches("boom in layer 2", err)
    assert.equals(64, s:len())
    local cont = tm.tokens(40, V, 12)
    local got = mA:step({ { seq = s, tokens = cont, logits = "all" } })[1]:clone()  -- views live until the next step
    local full = {}
    for i, v in ipairs(pre) do full[i] = v end
    for i, v in ipairs(cont) do full[64 + i] = v end
    assert.is_true(rows_equal(got, 0, mA:logits(full), 64, 40))
    s:free()
  end)

  it("an unsupported architecture or config is refused with a message naming it", function()
    local dir = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/model_spec_arch"
    os.execute("rm -rf " .. tm.q(dir) .. " && cp -r " .. tm.q(A) .. " " .. tm.q(dir))
    local f = assert(io.open(dir .. "/config.json", "rb"))
    local cfg = f:read("*a")
    f:close()
    f = assert(io.open(dir .. "/config.json", "wb"))
    f:write((cfg:gsub('"deepseek_v4"', '"llama"')))
    f:close()
    local m, err = tide.model(dir)
    assert.is_nil(m)
    assert.matches("llama", err)
  end)

  it("use_reference per layer: with the same inputs, sub-layer outputs are bitwise equal almost everywhere", function()
    -- both paths round to bf16 at the same points, so only accumulation-order
    -- flips differ; a missing or extra rounding point or quantisation step
    -- makes most elements differ
    local m = assert(tide.model(A, { max_tokens = 64, tokenizer = false }))
    m:use_reference({ 0, 1, 2, 3 })
    local t = tm.tokens(100, V, 13)
    local lr = m:logits(t, { mode = "chunked:64" })
    local rep = m:reference_report()
    for L = 0, 3 do
      assert.equals(100, rep[L].attn.tokens)
      assert.is_true(rep[L].attn.equal > 0.85, "layer " .. L .. " attention equal fraction " .. rep[L].attn.equal)
      assert.is_true(rep[L].moe.equal > 0.95, "layer " .. L .. " MoE equal fraction " .. rep[L].moe.equal)
      assert.is_true(rep[L].attn.mean_nmse < 1e-5, "layer " .. L .. " attention NMSE " .. rep[L].attn.mean_nmse)
    end
    m:use_reference(false)
    local s = per_position(m:logits(t), lr)
    assert.is_true(s.median < 1e-3)
    m:close()
  end)

  it("score(prompt, continuation) gives each continuation token's logprob under the raw distribution", function()
    local p, c = tm.tokens(70, V, 15), tm.tokens(30, V, 16)
    local list, total = mA:score(p, c, { top = 2, chunk = 17 })
    assert.equals(30, #list)
    local all = {}
    for i, v in ipairs(p) do all[i] = v end
    for i, v in ipairs(c) do all[70 + i] = v end
    local lg = mA:logits(all)
    local sum = 0
    for i = 1, 30 do
      local row = lg[70 + i - 2]
      local lse = math.log(row:softmax():get(c[i])) - row:get(c[i])   -- -lse
      local want = row:get(c[i]) + lse
      assert.is_true(math.abs(list[i].logprob - want) < 1e-4, "token " .. i)
      assert.equals(c[i], list[i].token)
      assert.equals(2, #list[i].top)
      sum = sum + list[i].logprob
    end
    assert.is_true(math.abs(total - sum) < 1e-6)
  end)

  it("tide logits writes [T, vocab] float32 and the decision dumps as JSON", function()
    local dir = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/model_spec_cli"
    os.execute("mkdir -p " .. tm.q(dir))
    local ids = tm.tokens(90, V, 14)
    local cmd = table.concat({ tm.q(tm.EXE), "logits", "--model", tm.q(A), "--tokens", table.concat(ids, ","),
      "--out", tm.q(dir .. "/l.f32"), "--mode", "chunked:32", "--dump-topk", tm.q(dir .. "/t.json"),
      "--dump-routes", tm.q(dir .. "/r.json") }, " ")
    local out, rc = tm.sh(cmd)
    assert.equals(0, rc, out)
    assert.equals("90 1024\n", out)
    local l = assert(tide.mmap(dir .. "/l.f32", "f32", { 90, V }))
    assert.is_true(same_bits(l, mA:logits(ids)))
    local cjson = require("cjson")
    local t = cjson.decode(assert(io.open(dir .. "/t.json")):read("*a"))
    local r = cjson.decode(assert(io.open(dir .. "/r.json")):read("*a"))
    local keys = {}
    for x in pairs(t.layers) do keys[#keys + 1] = x end
    table.sort(keys)
    assert.same({ "1", "3" }, keys)
    assert.equals(90, #t.layers["1"])
    assert.same({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 }, t.layers["3"][64])  -- p = 63: 16 visible
    assert.equals(16, #t.layers["3"][90])                    -- p = 89: 22 visible, 16 chosen
    assert.equals(90, #r.layers["0"])
    assert.equals(6, #r.layers["2"][1])
    out, rc = tm.sh(table.concat({ tm.q(tm.EXE), "logits", "--model", tm.q(A), "--tokens", "1,2,5000", "--out",
      tm.q(dir .. "/x.f32") }, " "))
    assert.is_true(rc ~= 0)
    assert.matches("outside the vocabulary", out)
  end)
end)
