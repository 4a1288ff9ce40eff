-- probe_spec: probes (tide.probe) on a generated tiny checkpoint. Every point
-- fires with its rows and positions only; read-only probes change nothing
-- (bitwise); a modifying probe changes only its own entry, in a batch, in
-- chunks, in sessions and in engine requests under preemption; a probe that
-- raises, returns a wrong shape or writes NaN ends only its own entry with a
-- clear error and the cache stays intact; the example scripts run.
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local probe = require("tide.probe")

local V = 1024
local DIR = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
local m = assert(tide.model(DIR, { max_tokens = 64, tokenizer = false, cache = { context = 1024, max_seqs = 8 } }))
local NL = m.net.n_layers

ffi.cdef [[ int memcmp(const void *a, const void *b, size_t n); ]]
local function same_bits(a, b)
  return a:numel() == b:numel() and ffi.C.memcmp(a.data, b.data, a:numel() * 4) == 0
end

local TA, TB, TC = tm.tokens(90, V, 1), tm.tokens(40, V, 2), tm.tokens(70, V, 3)

-- logits "all" of each token list, fed together in steps of `chunk`; probes[i] on entry i
local function run(lists, probes, chunk)
  chunk = chunk or 64
  local seqs, out, done = {}, {}, {}
  for i, t in ipairs(lists) do
    seqs[i] = assert(m:sequence())
    out[i] = tide.zeros({ #t, V })
    done[i] = 0
  end
  local errs = {}
  while true do
    local entries, who = {}, {}
    for i, t in ipairs(lists) do
      if done[i] < #t and not errs[i] then
        local n = math.min(math.floor(chunk / #lists), #t - done[i])
        entries[#entries + 1] = { seq = seqs[i], tokens = t, from = done[i] + 1, n = n, logits = "all",
          probes = probes and probes[i] }
        who[#entries] = i
      end
    end
    if #entries == 0 then break end
    local res = assert(m:step(entries))
    for j, i in ipairs(who) do
      if res.errors and res.errors[j] then
        errs[i] = res.errors[j]
      else
        out[i]:narrow(0, done[i], entries[j].n):copy(res[j])
        done[i] = done[i] + entries[j].n
      end
    end
  end
  local lens = {}
  for i, s in ipairs(seqs) do lens[i] = s:len() s:free() end
  return out, errs, lens
end

local PLAIN = run({ TA, TB, TC })

local ALL_POINTS = {}
for name in pairs(m.net.points) do ALL_POINTS[#ALL_POINTS + 1] = name end
table.sort(ALL_POINTS)

describe("probes", function()
  it("fire at every point with the entry's own rows and positions", function()
    local seen = {}
    local list = {}
    for _, name in ipairs(ALL_POINTS) do
      list[#list + 1] = { at = name, fn = function(t, info)
        local key = name .. ":" .. tostring(info.layer)
        local rec = seen[key] or { rows = 0, pos = {} }
        seen[key] = rec
        if t then
          assert.equals(info.n, t:size(0))
          rec.shape = t:size()
        end
        assert.equals(info.n, info.ids:size(0))
        for j = 0, info.n - 1 do
          rec.pos[info.pos0 + j] = true
          if name ~= "logits" then assert.equals(TB[info.pos0 + j + 1], info.ids[j]) end
        end
        rec.rows = rec.rows + info.n
      end }
    end
    local _, errs = run({ TA, TB, TC }, { nil, list, nil })
    assert.same({}, errs)
    local cfg = m.config
    local d, hc, H = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads
    assert.same({ 40, hc, d }, { seen["embed:nil"].rows, seen["embed:nil"].shape[2], seen["embed:nil"].shape[3] })
    for L = 0, NL - 1 do
      for _, p in ipairs({ "attn_in", "attn_out", "moe_in", "moe_out" }) do
        assert.equals(40, seen[p .. ":" .. L].rows, p .. " layer " .. L)
        assert.same({ 40 > 0 and seen[p .. ":" .. L].shape[1], d }, seen[p .. ":" .. L].shape)
      end
      for _, p in ipairs({ "resid_attn", "resid_moe" }) do assert.equals(hc, seen[p .. ":" .. L].shape[2]) end
      assert.equals(H, seen["attn_q:" .. L].shape[2])
      assert.equals(H, seen["attn_heads:" .. L].shape[2])
      assert.same(4, seen["attn_shares:" .. L].shape[3])
      assert.equals(cfg.num_experts_per_tok, seen["moe_routes:" .. L].shape[2])
      assert.equals(cfg.num_experts_per_tok, seen["moe_weights:" .. L].shape[2])
      if cfg.ratios[L] == 4 then assert.is_not_nil(seen["attn_topk:" .. L]) else
        assert.is_nil(seen["attn_topk:" .. L]) end
      for p = 0, 39 do assert.is_true(seen["resid_moe:" .. L].pos[p], "position " .. p) end
    end
    assert.equals(40, seen["final:nil"].rows)
    assert.equals(40, seen["logits:nil"].rows)
  end)

  it("that only read change nothing, bitwise, at every point", function()
    local copies = 0
    local list = {}
    for _, name in ipairs(ALL_POINTS) do
      list[#list + 1] = { at = name, fn = function(t) if t then local _ = t:clone() copies = copies + 1 end end }
    end
    local got, errs = run({ TA, TB, TC }, { list, list, list })
    assert.same({}, errs)
    for i = 1, 3 do assert.is_true(same_bits(got[i], PLAIN[i]), "entry " .. i) end
    assert.is_true(copies > 0)
    -- model-wide probes too
    local h = m:probe(list)
    got = run({ TA, TB, TC })
    h:remove()
    for i = 1, 3 do assert.is_true(same_bits(got[i], PLAIN[i]), "entry " .. i .. " (model-wide)") end
  end)

  it("that modify change only their own entry, the same in a batch, alone and in any chunking", function()
    local vec = tide.randn({ m.config.hc_mult, m.config.hidden_size }, { seed = 5 })
    local steer = { { at = "resid_moe", layers = { 1, 2 }, fn = function(X) probe.add_rows(X, vec, 0.5) end },
      { at = "attn_heads", layers = { 0 }, fn = function(o) o:select(1, 1):zero() end } }
    local batch, errs = run({ TA, TB, TC }, { nil, steer, nil })
    assert.same({}, errs)
    assert.is_true(same_bits(batch[1], PLAIN[1]))
    assert.is_true(same_bits(batch[3], PLAIN[3]))
    assert.is_false(same_bits(batch[2], PLAIN[2]))
    local alone = run({ TB }, { steer }, 7)
    assert.is_true(same_bits(alone[1], batch[2]), "steered alone in steps of 7 = steered in the batch")
  end)

  it("a probe that raises, returns a wrong shape or writes NaN ends only its entry; the cache stays intact", function()
    local cases = {
      { { at = "moe_out", layers = { 1 }, fn = function() error("boom") end }, "raised: .*boom" },
      { { at = "attn_in", layers = { 2 }, fn = function() return tide.zeros({ 3, 3 }) end }, "shape %[3, 3%]" },
      { { at = "resid_attn", layers = { 0 }, fn = function(X) X[0]:fill(0 / 0) end }, "NaN" },
      { { at = "attn_q", layers = { 0 }, fn = function(q) return q end }, "read%-only" },
      { { at = "logits", fn = function(l) l:fill(math.huge) end }, "NaN or infinity" },
    }
    local st0 = m:cache_stats()
    for _, c in ipairs(cases) do
      local got, errs, lens = run({ TA, TB, TC }, { nil, { c[1] }, nil })
      assert.is_true(same_bits(got[1], PLAIN[1]))
      assert.is_true(same_bits(got[3], PLAIN[3]))
      assert.matches(c[2], errs[2])
      assert.matches("positions 0%.%.", errs[2])
      assert.equals(0, lens[2], "the failed entry's first chunk did not run")
    end
    local st = m:cache_stats()
    assert.equals(st0.swa_free, st.swa_free)
    assert.equals(st0.pages_free, st.pages_free)
    -- a failure in a later chunk: the sequence keeps the chunks before it and goes on exactly
    local s = assert(m:sequence())
    assert(m:feed(s, TB, { to = 20 }))
    local calls = 0
    local ok, err = pcall(m.feed, m, s, TB, { from = 21, probes = { { at = "final", fn = function()
      calls = calls + 1
      error("late")
    end } } })
    assert.is_false(ok)
    assert.matches("late", err)
    assert.equals(20, s:len())
    local rows = tide.zeros({ 20, V })
    assert(m:feed(s, TB, { from = 21, on_logits = function(r, at) rows:narrow(0, at - 20, r:size(0)):copy(r) end }))
    assert.is_true(same_bits(rows, PLAIN[2]:narrow(0, 20, 20)))
    s:free()
    -- misuse is an error at the call
    local s2 = assert(m:sequence())
    local ok2, e2 = pcall(m.step, m, { { seq = s2, tokens = { 1 }, probes = { { at = "nowhere", fn = print } } } })
    assert.is_false(ok2)
    assert.matches("unknown point 'nowhere'.*resid_moe", e2)
    assert.has_error(function() m:step({ { seq = s2, tokens = { 1 }, probes = { { at = "attn_in", layers = { NL },
      fn = print } } } }) end)
    assert.has_error(function() m:step({ { seq = s2, tokens = { 1 }, probes = { { at = "final", layers = { 0 },
      fn = print } } } }) end)
    assert.has_error(function() m:probe({ at = "final" }) end)
    assert.equals(0, s2:len())
    s2:free()
  end)

  it("sessions carry their probes over every step; set_probes re-feeds the history", function()
    local sa = assert(m:session{ seed = 1, print = false, sampler = { temp = 0 }, ignore_eos = true })
    local sb = assert(m:session{ seed = 1, print = false, sampler = { temp = 0 }, ignore_eos = true })
    sa:append(TA)
    sb:append(TA)
    local seen = {}
    sb:set_probes({ { at = "final", fn = function(_, info)
      for j = 0, info.n - 1 do seen[info.pos0 + j] = true end
    end } })
    local ra, rb = sa:generate{ max_tokens = 8 }, sb:generate{ max_tokens = 8 }
    assert.same(ra.tokens, rb.tokens)
    for p = 0, #TA + 6 do assert.is_true(seen[p], "position " .. p) end
    sb:set_probes({ { at = "moe_out", layers = { 1 }, fn = function() error("session boom") end } })
    assert.has_error(function() sb:generate{ max_tokens = 2 } end)
    sb:set_probes(nil)
    local rc = sb:generate{ max_tokens = 4 }
    assert.equals(4, #rc.tokens)
    sa:close()
    sb:close()
  end)
end)

describe("probes on engine requests", function()
  local small = assert(tide.model(DIR, { max_tokens = 32, tokenizer = false,
    cache = { swa_block = 16, page_tokens = 128, swa_blocks = 12, pages = 3, max_seqs = 8 } }))
  local vec = tide.randn({ m.config.hc_mult, m.config.hidden_size }, { seed = 9 })
  local LENS = { 150, 20, 90, 5, 120, 40 }
  local function specs(probes_for)
    local out = {}
    for i, L in ipairs(LENS) do
      out[i] = { tokens = tm.tokens(L, V, i), max_tokens = 8 + i, seed = 100 + i, sampler = { temp = 0.9, top_k = 50 },
        probes = probes_for and probes_for(i) or nil }
    end
    return out
  end
  local function steer()
    return { { at = "resid_moe", layers = { 2 }, fn = function(X) probe.add_rows(X, vec, 1) end } }
  end
  local solo_cache = {}
  local function solo(spec, key)
    if key and solo_cache[key] then return solo_cache[key] end
    local eng = tide.engine(m, { budget = 16 })
    local h = assert(eng:submit(spec))
    eng:run()
    if key then solo_cache[key] = h:result() end
    return h:result()
  end

  it("a steered request is exact under preemption and leaves the others as they are", function()
    local calls = 0
    local function probes_for(i)
      if i == 3 then
        local p = steer()
        p[2] = { at = "embed", fn = function(_, info) calls = calls + info.n end }
        return p
      end
    end
    local eng = tide.engine(small, { budget = 16 })
    local hs = {}
    for i, s in ipairs(specs(probes_for)) do hs[i] = assert(eng:submit(s)) end
    eng:run()
    assert.is_true(eng:report().preemptions >= 2, "preemptions: " .. eng:report().preemptions)
    local plain = specs()
    for i, h in ipairs(hs) do
      local want = i == 3 and solo(specs(probes_for)[3]) or solo(plain[i], i)
      assert.same(want.tokens, h:result().tokens, "request " .. i)
    end
    assert.are_not.same(solo(plain[3], 3).tokens, hs[3]:result().tokens)
    if hs[3]:result().preemptions > 0 then
      assert.is_true(calls > LENS[3] + #hs[3]:result().tokens, "the probe ran again on recompute")
    end
  end)

  it("a failing probe ends its request with an error; the others finish exactly", function()
    local eng = tide.engine(small, { budget = 16 })
    local hs = {}
    local sp = specs(function(i)
      if i == 2 then return { { at = "moe_in", layers = { 1 }, fn = function(_, info)
        if info.pos0 + info.n > 25 then error("request 2 fails") end
      end } } end
    end)
    for i, s in ipairs(sp) do hs[i] = assert(eng:submit(s)) end
    eng:run()
    local r2 = hs[2]:result()
    assert.equals("error", r2.status)
    assert.matches("request 2 fails", r2.error)
    local plain = specs()
    for i, h in ipairs(hs) do
      if i ~= 2 then assert.same(solo(plain[i], i).tokens, h:result().tokens, "request " .. i) end
    end
    assert.has_error(function() eng:submit{ tokens = { 1 }, probes = { { at = "nowhere", fn = print } } } end)
    small:close()
  end)
end)

describe("the probe examples", function()
  local function script(name, args)
    local chunk = assert(loadfile(tm.ROOT .. "/scripts/" .. name))
    local saved = arg
    _G.arg = { [0] = name }
    for i, a in ipairs(args) do _G.arg[i] = a end
    local out = io.output()
    io.output("/dev/null")
    local ok, res = pcall(chunk)
    io.output(out)
    _G.arg = saved
    assert(ok, res)
    return res
  end
  local ids = "5,17,42,99,3,250,7,81,640,12,33,1000,2,48,77,300,15,9"

  it("probe_capture writes every layer's streams by position to safetensors", function()
    local path = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/probe_capture.safetensors"
    local saved = script("probe_capture.lua", { DIR, path, ids })
    local ck = assert(tide.load(path, { config = false }))
    local t = ck:tensor("resid_moe.1")
    assert.same({ 18, m.config.hc_mult, m.config.hidden_size }, t:size())
    assert.is_true(same_bits(t:contiguous(), saved["resid_moe.1"]))
    assert.is_nil(ck:has("resid_moe." .. NL) or nil)
  end)

  it("probe_logit_lens: the last layer's lens is the model's output, bit for bit", function()
    local r = script("probe_logit_lens.lua", { DIR, ids, "3" })
    assert.is_true(same_bits(r.lens[NL - 1], r.logits))
    assert.is_false(same_bits(r.lens[0], r.logits))
  end)

  it("probe_patch: patching the last streams restores the clean output exactly", function()
    -- the prompts differ in their first token: patching the last position alone does not undo that
    local r = script("probe_patch.lua", { DIR, ids, "6,17,42,99,3,250,7,81,640,12,33,1000,2,48,77,300,15,9" })
    assert.equals(1, r.restored[NL - 1])
    assert.is_true(r.restored[0] < 1)
  end)

  it("probe_ablate: a head and an expert, with a measurable effect", function()
    local h = script("probe_ablate.lua", { DIR, "head", "1", "0", ids })
    assert.is_true(h.kl > 0)
    -- an expert the last layer routes the last token to
    local s, ex = assert(m:sequence()), nil
    local list = {}
    for x in ids:gmatch("%d+") do list[#list + 1] = tonumber(x) end
    assert(m:feed(s, list, { probes = { { at = "moe_routes", layers = { NL - 1 }, fn = function(r, info)
      ex = r[info.n - 1][0]
    end } } }))
    s:free()
    local e = script("probe_ablate.lua", { DIR, "expert", tostring(NL - 1), tostring(ex), ids })
    assert.is_true(e.kl > 0)
  end)

  it("probe_steer: the steered request changes, the plain one is what it is alone", function()
    local r = script("probe_steer.lua", { DIR, "50", "1-2", "1,2,3,4,5,6", "7,8,9,10,11,12", "20,21,22" })
    assert.are_not.same(r.plain, r.steered)
    local eng = tide.engine(m, { budget = 64 })
    local h = eng:submit{ tokens = { 20, 21, 22 }, max_tokens = 12, seed = 1 }
    eng:run()
    assert.same(h:result().tokens, r.plain)
  end)
end)
