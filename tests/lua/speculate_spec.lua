-- Speculative decoding inside the engine (tide.speculate, docs/speculative.md)
-- on the trained model (its MTP block was trained, so drafts are accepted
-- and rejected): every request's tokens, logprobs and finish reason are the
-- same bits with and without drafting, at every k, greedy and sampled, alone
-- and 6 at a time, under preemption in a tiny cache; a draft policy that
-- raises ends only its request; the figures reach the results and the stats.
local tide = require("tide")

local DIR = os.getenv("TIDE_TRAINED_MODEL") or "models/tide-tiny-en"

local big = assert(tide.model(DIR, { max_tokens = 32, cache = { context = 512, max_seqs = 8 } }))
local small = assert(tide.model(DIR, { max_tokens = 32,
  cache = { swa_block = 16, page_tokens = 128, swa_blocks = 20, pages = 6, max_seqs = 8 } }))

local PROMPTS = { "And the king said unto", "In the beginning God created the heaven", "A fool and his money",
  "The LORD is my shepherd; I shall not want.", "Blessed are the meek:", "And it came to pass, when" }

local function requests(extra)
  local out = {}
  for i, p in ipairs(PROMPTS) do
    out[i] = { prompt = p, max_tokens = 20 + 3 * i, seed = 10 + i, logprobs = 2,
      sampler = (i % 2 == 0) and { temp = 0 } or { temp = 0.8, top_k = 40 } }
    for k, v in pairs(extra or {}) do out[i][k] = v end
  end
  return out
end

local function run(model, opts, specs)
  local st0 = model:cache_stats()
  local eng = tide.engine(model, opts)
  local hs = {}
  for i, s in ipairs(specs) do hs[i] = assert(eng:submit(s)) end
  eng:run()
  local st = model:cache_stats()
  assert.equals(st0.swa_free, st.swa_free, "SWA blocks returned")
  assert.equals(st0.pages_free, st.pages_free, "pages returned")
  assert.equals(st0.seqs, st.seqs, "sequences freed")
  local res = {}
  for i, h in ipairs(hs) do res[i] = h:result() end
  return res, eng
end

local function same(a, b, what)
  assert.same(a.tokens, b.tokens, what .. ": ids differ")
  assert.equals(a.finish_reason, b.finish_reason, what)
  assert.equals(#a.logprobs, #b.logprobs, what)
  for k = 1, #a.logprobs do
    assert.equals(a.logprobs[k].raw_logprob, b.logprobs[k].raw_logprob, what .. ": logprob of token " .. k)
  end
end

describe("speculative decoding in the engine", function()
  local BASE = run(big, { budget = 32 }, requests())

  it("gives the same bits at every draft length, alone and batched, greedy and sampled", function()
    local acc, drafted = 0, 0
    for shift = 0, 1 do   -- request i drafts up to 1 + (i + shift) % 4: every k, every request twice
      local specs = requests()
      for i, sp in ipairs(specs) do sp.draft = 1 + (i + shift) % 4 end
      local res, eng = run(big, { budget = 32 }, specs)
      local rep = eng:report()
      acc, drafted = acc + rep.accepted, drafted + rep.drafted
      assert.is_true(rep.drafted > 0 and rep.spec_steps > 0)
      for i = 1, #PROMPTS do
        local k = 1 + (i + shift) % 4
        same(res[i], BASE[i], "k = " .. k .. " request " .. i)
        local sp = res[i].speculation
        assert.equals(k, sp.max)
        assert.is_true(sp.drafted >= sp.accepted and sp.steps > 0)
        assert.is_true(sp.tokens_per_step >= 1 and sp.tokens_per_step <= k + 1)
      end
    end
    assert.is_true(acc > 0 and acc < drafted, "accepted " .. acc .. " of " .. drafted)
    -- alone (one request per engine), with the adaptive policy
    for i = 1, 2 do
      local res = run(big, { budget = 32 }, { requests({ draft = { max = 3, policy = "adaptive" } })[i] })
      same(res[1], BASE[i], "alone, adaptive, request " .. i)
    end
    -- an engine-wide default, overridden per request
    local specs = requests()
    specs[2].draft = 0
    local res = run(big, { budget = 32, draft = 2 }, specs)
    for i = 1, #PROMPTS do same(res[i], BASE[i], "engine default, request " .. i) end
    assert.is_nil(res[2].speculation)
    assert.equals(2, res[1].speculation.max)
  end)

  it("preemption in a tiny cache changes nothing", function()
    -- four requests past the window (9 blocks of 16 each); the cache holds two
    local function long(extra)
      local out = {}
      for i = 1, 4 do
        out[i] = { prompt = PROMPTS[i] .. " " .. PROMPTS[i + 1], max_tokens = 120, seed = i, logprobs = 1,
          ignore_eos = true, sampler = (i % 2 == 0) and { temp = 0 } or { temp = 0.8 } }
        for k, v in pairs(extra or {}) do out[i][k] = v end
      end
      return out
    end
    local LB = run(big, { budget = 32 }, long())
    local res, eng = run(small, { budget = 16, policy = "fair" }, long({ draft = 3 }))
    local rep = eng:report()
    assert.is_true(rep.preemptions >= 2, "only " .. rep.preemptions .. " preemptions")
    assert.is_true(rep.accepted > 0)
    for i = 1, 4 do same(res[i], LB[i], "tiny cache, k = 3, request " .. i) end
  end)

  it("tide batch --draft: the same results, with the figures in each record", function()
    local tm = require("testmodels")
    local cjson = require("cjson")
    local dir = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/speculate_spec"
    os.execute("mkdir -p " .. tm.q(dir))
    local f = assert(io.open(dir .. "/in.jsonl", "wb"))
    f:write('{"prompt": "And the king said unto", "max_tokens": 16, "temp": 0}\n')
    f:write('{"prompt": "A fool and his money", "max_tokens": 16, "temp": 0.8, "seed": 3, "draft": 0}\n')
    f:close()
    local function batch(extra)
      local out, rc = tm.sh(table.concat({ tm.q(tm.EXE), "batch", "--model", tm.q(DIR), "--input",
        tm.q(dir .. "/in.jsonl"), "--no-progress", extra }, " ") .. " 2>" .. tm.q(dir .. "/err.txt"))
      assert.equals(0, rc, out)
      local recs = {}
      for line in out:gmatch("[^\n]+") do recs[#recs + 1] = cjson.decode(line) end
      return recs
    end
    local plain, drafted = batch(""), batch("--draft 3")
    for i = 1, 2 do assert.same(plain[i].tokens, drafted[i].tokens) end
    assert.equals(3, drafted[1].speculation.max)
    assert.is_true(drafted[1].speculation.steps > 0)
    assert.is_nil(drafted[2].speculation)   -- the line's "draft": 0 wins
    local ef = assert(io.open(dir .. "/err.txt", "rb"))
    assert.matches("drafts: %d+ drafted, %d+ accepted", ef:read("*a"))
    ef:close()
  end)

  it("a long stretch without drafts keeps one window of streams; the drafts after it are the same bits", function()
    -- drafts only after 165 steps: the kept streams pass the window and the MTP sequence restarts
    -- there, unless the engine is told to keep everything; acceptance counts tell the drafts apart
    local late = { name = "late", new = function() return { n = 0 } end, observe = function() end,
      draft = function(st) st.n = st.n + 1 return (st.n > 165 and st.n % 3 == 0) and 2 or 0 end }
    local function go(keep_all)
      local eng = tide.engine(big, { budget = 32 })
      local hs = {}
      for i = 1, 2 do
        hs[i] = eng:submit{ prompt = PROMPTS[i], max_tokens = 200, seed = i, ignore_eos = true,
          sampler = { temp = i == 1 and 0 or 0.8 }, draft = { max = 2, policy = late } }
      end
      if keep_all then eng.mtp_window = 1e9 end
      eng:run()
      local out = {}
      for i, h in ipairs(hs) do out[i] = h:result() end
      return out
    end
    local a, b = go(false), go(true)
    for i = 1, 2 do
      assert.same(a[i].tokens, b[i].tokens)
      assert.is_true(a[i].speculation.drafted > 10)
      assert.equals(b[i].speculation.drafted, a[i].speculation.drafted)
      assert.equals(b[i].speculation.accepted, a[i].speculation.accepted)
    end
  end)

  it("a draft policy that raises ends only its request", function()
    local n = 0
    local bad = { name = "bad", new = function() return {} end, observe = function() end,
      draft = function() n = n + 1 if n > 3 then error("no more drafts") end return 2 end }
    local badobs = { name = "badobs", new = function() return {} end, draft = function() return 1 end,
      observe = function() error("cannot observe") end }
    local specs = requests({ draft = 2 })
    specs[3].draft = { max = 2, policy = bad }
    specs[5].draft = { max = 2, policy = badobs }
    local res = run(big, { budget = 32 }, specs)
    assert.equals("error", res[3].status)
    assert.matches("draft policy: .*no more drafts", res[3].error)
    assert.equals("error", res[5].status)
    assert.matches("draft policy: .*cannot observe", res[5].error)
    for _, i in ipairs({ 1, 2, 4, 6 }) do same(res[i], BASE[i], "neighbour " .. i) end
    -- tokens before the failure are the plain ones
    for j, t in ipairs(res[3].tokens) do assert.equals(BASE[3].tokens[j], t) end
    -- an error in the MTP block costs drafts, never tokens: the requests restart their MTP state
    local eng0 = tide.engine(big, { budget = 32 })
    local hs = {}
    for i = 1, 2 do hs[i] = eng0:submit(requests({ draft = 2 })[i]) end
    local step, calls = eng0.mtp.step, 0
    eng0.mtp.step = function(...)
      calls = calls + 1
      if calls == 3 then error("MTP broke") end
      return step(...)
    end
    eng0:run()
    eng0.mtp.step = nil
    assert.equals(1, eng0.stats.draft_errors)
    assert.matches("MTP broke", eng0.last_draft_error)
    for i = 1, 2 do same(hs[i]:result(), BASE[i], "after an MTP error, request " .. i) end
    -- the only request's policy raises: that step runs nothing, the engine goes on
    local eng1 = tide.engine(big, { budget = 32 })
    local lone = eng1:submit{ prompt = PROMPTS[1], max_tokens = 8, draft = { max = 2, policy = bad } }
    eng1:run()
    assert.equals("error", lone:result().status)
    -- misuse is refused at submit
    local eng = tide.engine(big, {})
    assert.has_error(function() eng:submit{ prompt = "x", draft = -1 } end)
    assert.has_error(function() eng:submit{ prompt = "x", draft = { max = 2, policy = "nope" } } end)
    assert.has_error(function() eng:submit{ prompt = "x", draft = { max = 2, extra = 1 } } end)
  end)

  it("accept = rejection: greedy the same bits, sampled the same distribution (chi-square), stateful chains refused",
    function()
    -- greedy: the rule with point masses is the exact pick
    local g = requests()
    for _, sp in ipairs(g) do sp.sampler = { temp = 0 } end
    local gbase = run(big, { budget = 32 }, g)
    for _, sp in ipairs(g) do sp.draft = { max = 3, accept = "rejection" } end
    local gres = run(big, { budget = 32 }, g)
    for i = 1, #g do same(gbase[i], gres[i], "greedy, request " .. i) end
    -- chains with a stage that draws or follows the drawn token are refused, naming it
    local eng = tide.engine(big, { budget = 32 })
    assert.has_error(function()
      eng:submit{ prompt = "x", sampler = { temp = 0.8, mirostat = 2 }, draft = { max = 2, accept = "rejection" } }
    end, "draft: accept = \"rejection\" needs a sampler chain whose distribution can be computed; stage 2 "
      .. "(mirostat_v2) draws from the generator or keeps a value that follows the drawn token")
    assert.has_error(function() eng:submit{ prompt = "x", draft = { max = 2, accept = "maybe" } } end)
    eng:close()
    -- sampled: tokens 2..4 (verified from drafts) of R requests, each with its own seed, against plain
    -- sampling with other seeds: a two-sample chi-square per position; the same test tells plain
    -- sampling at another temperature apart (it has the power to fail)
    local R = 800
    local wide = assert(tide.model(DIR, { max_tokens = 64, cache = { context = 64, max_seqs = 32 } }))
    local function sample(first, temp, draft)
      local specs = {}
      for i = 1, R do
        specs[i] = { prompt = "And the king said unto", max_tokens = 4, seed = first + i, ignore_eos = true,
          sampler = { temp = temp, top_k = 20 }, draft = draft }
      end
      local res = run(wide, { budget = 64 }, specs)
      local counts, drafted, accepted = { {}, {}, {}, {} }, 0, 0
      for _, r in ipairs(res) do
        assert.equals(4, #r.tokens)
        for pos = 1, 4 do counts[pos][r.tokens[pos]] = (counts[pos][r.tokens[pos]] or 0) + 1 end
        if r.speculation then drafted, accepted = drafted + r.speculation.drafted, accepted + r.speculation.accepted end
      end
      return counts, drafted, accepted
    end
    local function chi2(a, b)   -- equal sample sizes
      local x2, bins, ra, rb = 0, 0, 0, 0
      local ids = {}
      for id in pairs(a) do ids[id] = true end
      for id in pairs(b) do ids[id] = true end
      for id in pairs(ids) do
        local x, y = a[id] or 0, b[id] or 0
        if x + y >= 10 then
          x2, bins = x2 + (x - y) ^ 2 / (x + y), bins + 1
        else
          ra, rb = ra + x, rb + y
        end
      end
      if ra + rb > 0 then x2, bins = x2 + (ra - rb) ^ 2 / (ra + rb), bins + 1 end
      local df = math.max(bins - 1, 1)
      local w = 2 / (9 * df)
      return x2, df * (1 - w + 3.09 * math.sqrt(w)) ^ 3   -- the 0.999 quantile (Wilson-Hilferty)
    end
    local plain = sample(0, 1.0, nil)
    local rej, drafted, accepted = sample(10 * R, 1.0, { max = 3, accept = "rejection" })
    local _, cdrafted, caccepted = sample(20 * R, 1.0, { max = 3 })
    local hot = sample(30 * R, 1.5, nil)
    assert.is_true(drafted - accepted > R / 10, "drafts rejected: " .. (drafted - accepted))
    assert.is_true(accepted / drafted > caccepted / cdrafted, string.format(
      "the rule accepts more than the chain pick: %.3f vs %.3f", accepted / drafted, caccepted / cdrafted))
    for pos = 2, 4 do
      local x2, crit = chi2(plain[pos], rej[pos])
      assert.is_true(x2 < crit, string.format("token %d: chi-square %.1f >= %.1f", pos, x2, crit))
    end
    local x2h, crith = chi2(plain[2], hot[2])
    assert.is_true(x2h > crith, string.format("temperature 1.5 passes: chi-square %.1f < %.1f", x2h, crith))
    wide:close()
  end)
end)
