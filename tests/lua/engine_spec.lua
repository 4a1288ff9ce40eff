-- engine_spec: continuous batching on a generated tiny checkpoint. Requests
-- together give bitwise what each gives alone (ids and logprobs) under every
-- built-in policy and thread count; a cache small enough to force repeated
-- preemption changes no output and rebuilds the cache and compressor state
-- byte for byte; cancellation returns blocks; the policies' contracts
-- (arrival order, priority order, the fairness bound) hold; the progress
-- guarantee survives a policy that starves a request; errors (policies,
-- samplers, callbacks, oversized requests) stay local.
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local engine = require("tide.engine")
local sampling = require("tide.sampling")
local view_mod = require("tide.scheduler.view")
local C = tide.C

local V = 1024
local DIR = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
-- a roomy cache for the solo runs; a tiny one (blocks of 16 positions,
-- pages of 128) where six requests cannot all fit
local big = assert(tide.model(DIR, { max_tokens = 32, tokenizer = false, cache = { context = 1024, max_seqs = 8 } }))
local small = assert(tide.model(DIR, { max_tokens = 32, tokenizer = false,
  cache = { swa_block = 16, page_tokens = 128, swa_blocks = 12, pages = 3, max_seqs = 8 } }))

local LENS = { 150, 20, 90, 5, 120, 40 }
local function requests(extra)
  local out = {}
  for i, L in ipairs(LENS) do
    out[i] = { tokens = tm.tokens(L, V, i), max_tokens = 24 + i, seed = 100 + i, logprobs = 2,
      sampler = (i % 3 == 0) and { temp = 0 } or { temp = 0.9, top_k = 50 } }
    for k, v in pairs(extra or {}) do out[i][k] = v end
  end
  return out
end

-- what each request gives alone (one engine per request, the big cache)
local function solo_of(model, specs, budget)
  local out = {}
  for i, spec in ipairs(specs) do
    local eng = tide.engine(model, { budget = budget or 16 })
    local h = assert(eng:submit(spec))
    eng:run()
    out[i] = h:result()
  end
  return out
end
local SOLO = solo_of(big, requests())

local function same_result(a, b, what)
  assert.same(a.tokens, b.tokens, what .. ": ids differ")
  assert.equals(a.finish_reason, b.finish_reason, what)
  assert.equals(#a.logprobs, #b.logprobs, what)
  for k = 1, #a.logprobs do
    local x, y = a.logprobs[k], b.logprobs[k]
    assert.equals(x.raw_logprob, y.raw_logprob, what .. ": raw logprob of token " .. k)
    assert.equals(x.sampled_logprob, y.sampled_logprob, what .. ": sampled logprob of token " .. k)
    assert.same(x.raw_top, y.raw_top, what .. ": raw top of token " .. k)
  end
end

local function run_all(model, opts, specs)
  local st0 = model:cache_stats()
  local eng = tide.engine(model, opts)
  local hs = {}
  for i, spec in ipairs(specs) do hs[i] = assert(eng:submit(spec)) end
  eng:run()
  local st = model:cache_stats()
  assert.equals(st0.swa_free, st.swa_free, "SWA blocks returned")
  assert.equals(st0.pages_free, st.pages_free, "pages returned")
  assert.equals(st0.seqs, st.seqs, "sequences freed")
  return eng, hs
end

local function stats_free(m)
  local s = m:cache_stats()
  return s.swa_free, s.pages_free, s.seqs
end

-- every cache byte of a sequence (each layer and region), as one string
local function dump_seq(model, seq)
  local c = model.cache
  local parts = {}
  local first, rows, rb = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  for L = 0, model.net.n_layers - 1 do
    local r = C.tide_kvcache_layer_ratio(c, L)
    local kinds = r == 4 and { 0, 1, 2, 3, 4 } or (r == 128 and { 0, 1, 3 } or { 0 })
    for _, kind in ipairs(kinds) do
      assert(C.tide_kvcache_seq_extent(c, seq.id, L, kind, first, rows, rb) == 0, tide.ffi.last_error())
      local n, w = tonumber(rows[0]), tonumber(rb[0])
      parts[#parts + 1] = string.format("%d/%d/%d/%d:", L, kind, tonumber(first[0]), n)
      if n > 0 then
        local t = tide.zeros({ n, w }, "u8")
        assert(C.tide_kvcache_seq_read(c, seq.id, L, kind, t) == 0, tide.ffi.last_error())
        parts[#parts + 1] = ffi.string(t.data, n * w)
      end
    end
  end
  return table.concat(parts)
end

describe("tide.engine", function()
  it("runs N concurrent seeded requests exactly as each alone, under every policy", function()
    for _, pol in ipairs({ "fcfs", "priority", "fair" }) do
      local specs = requests()
      for i, s in ipairs(specs) do s.priority = i % 3 end
      local eng, hs = run_all(big, { budget = 16, policy = pol }, specs)
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], pol .. " request " .. i) end
      local rep = eng:report()
      assert.is_true(rep.steps < 120, pol .. ": requests really shared steps (" .. rep.steps .. ")")
      assert.equals(0, rep.full_retries)
    end
  end)

  it("gives the same bits with 1 thread as with 2", function()
    local n = tide.threads()
    tide.threads(1)
    local ok, err = pcall(function()
      local _, hs = run_all(big, { budget = 16, policy = "fair" }, requests())
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "1 thread, request " .. i) end
    end)
    tide.threads(n)
    assert(ok, err)
  end)

  it("preempts repeatedly in a tiny cache without changing any output", function()
    for _, pol in ipairs({ "fcfs", "priority", "fair" }) do
      local specs = requests()
      for i, s in ipairs(specs) do s.priority = i % 3 end
      local eng, hs = run_all(small, { budget = 16, policy = pol }, specs)
      local rep = eng:report()
      assert.is_true(rep.preemptions >= 3, pol .. ": only " .. rep.preemptions .. " preemptions")
      assert.equals(0, rep.full_retries, "the block count agrees with the cache")
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], pol .. " (tiny cache) request " .. i) end
    end
  end)

  it("rebuilds a preempted request's caches and compressor state byte for byte", function()
    -- dumps of every request's sequence at each token, alone and under preemption
    local function dumps(specs, opts)
      local d = {}
      for i, s in ipairs(specs) do
        d[i] = {}
        s.on_token = function(h) d[i][#h.generated] = dump_seq(small, h.seq) end
      end
      local _, hs = run_all(small, opts, specs)
      return d, hs
    end
    local alone = {}
    for i, s in ipairs(requests()) do
      local d = dumps({ s }, { budget = 16 })
      alone[i] = d[1]
    end
    local d, hs = dumps(requests(), { budget = 16, policy = "fair" })
    local checked = 0
    for i, h in ipairs(hs) do
      if h.preemptions > 0 then
        for k, bytes in pairs(d[i]) do
          assert.is_true(bytes == alone[i][k], "request " .. i .. " differs at token " .. k)
          checked = checked + 1
        end
      end
    end
    assert.is_true(checked > 20, "too few preempted tokens checked (" .. checked .. ")")
  end)

  it("returns a cancelled request's blocks at once, and the others go on unchanged", function()
    local specs = requests()
    local st0 = { stats_free(big) }
    local eng = tide.engine(big, { budget = 16, max_running = 4 })
    local hs = {}
    for i, s in ipairs(specs) do hs[i] = assert(eng:submit(s)) end
    for _ = 1, 12 do eng:step() end
    local victim = hs[1]
    assert.equals("running", victim.status)
    local swa, pages = victim.seq:usage()
    assert.is_true(swa > 0 and pages > 0)
    local a, b, n = stats_free(big)
    assert.is_true(victim:cancel())
    local a2, b2, n2 = stats_free(big)
    assert.equals(a + swa, a2)
    assert.equals(b + pages, b2)
    assert.equals(n - 1, n2)
    assert.is_false(victim:cancel())
    -- a waiting request: nothing to return, it just leaves
    local waiting = hs[6]
    assert.equals("waiting", waiting.status)
    assert.is_true(waiting:cancel())
    assert.same({ a2, b2, n2 }, { stats_free(big) })
    eng:run()
    assert.same(st0, { stats_free(big) })
    assert.equals("cancelled", victim:result().finish_reason)
    assert.equals("cancelled", waiting:result().finish_reason)
    for i = 2, 5 do same_result(hs[i]:result(), SOLO[i], "request " .. i .. " next to a cancelled one") end
  end)

  it("streams through an iterator and a callback", function()
    local specs = requests()
    local seen = {}
    specs[2].on_token = function(_, id) seen[#seen + 1] = id end
    local eng = tide.engine(big, { budget = 16 })
    local hs = {}
    for i, s in ipairs(specs) do hs[i] = assert(eng:submit(s)) end
    local got = {}
    for id, text in hs[4]:stream() do
      got[#got + 1] = id
      assert.equals("", text)     -- no tokenizer: no text
    end
    assert.is_true(hs[4]:done())
    assert.same(SOLO[4].tokens, got)
    -- the others progressed while request 4 streamed; finish them
    eng:run()
    assert.same(SOLO[2].tokens, seen)
    -- a stream opened after the fact replays what was generated
    local again = {}
    for id in hs[2]:stream() do again[#again + 1] = id end
    assert.same(SOLO[2].tokens, again)
    local r = hs[4]:result()
    assert.is_true(r.ttft > 0 and r.time >= r.ttft)
    assert.is_true(r.tokens_per_second > 0)
    assert.equals(LENS[4], r.prompt_tokens)
    assert.equals(#SOLO[4].tokens, r.completion_tokens)
  end)

  it("stops at stop tokens and eos", function()
    assert.equals("length", SOLO[1].finish_reason)
    local s = requests()[1]
    local third = SOLO[1].tokens[3]
    s.stop = { third }
    local eng = tide.engine(big, { budget = 16 })
    local h = assert(eng:submit(s))
    eng:run()
    local r = h:result()
    assert.equals("stop", r.finish_reason)
    assert.equals(third, r.tokens[#r.tokens])
    assert.is_true(#r.tokens <= 3)
    -- the same token as the engine's eos
    eng = tide.engine(big, { budget = 16, eos = { third } })
    h = assert(eng:submit(requests()[1]))
    eng:run()
    assert.equals("stop", h:result().finish_reason)
    -- ignore_eos runs to max_tokens
    h = assert(eng:submit(requests({ ignore_eos = true })[1]))
    eng:run()
    assert.same(SOLO[1].tokens, h:result().tokens)
  end)

  describe("policies", function()
    it("fcfs admits in arrival order", function()
      local specs = requests()
      local eng, hs = run_all(small, { budget = 16, policy = "fcfs" }, specs)
      local _ = eng
      for i = 2, #hs do
        assert.is_true(hs[i].step_admit >= hs[i - 1].step_admit, "request " .. i .. " admitted before " .. (i - 1))
      end
    end)

    it("priority serves higher priorities first and preempts the lowest", function()
      local specs = requests()
      for i, s in ipairs(specs) do s.priority = i <= 3 and 0 or 5 end   -- the last three are urgent
      local _, hs = run_all(big, { budget = 16, policy = "priority", max_running = 2, patience = 10000 }, specs)
      for hi = 4, 6 do
        for lo = 1, 3 do
          assert.is_true(hs[hi].step_first < hs[lo].step_first,
            string.format("urgent %d (step %d) after %d (step %d)", hi, hs[hi].step_first, lo, hs[lo].step_first))
        end
      end
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "priority request " .. i) end
      -- an urgent request arriving when the cache is full takes the room of the
      -- lowest one (the oldest, the anchor, keeps its blocks whatever its rank)
      local mid = assert(tide.model(DIR, { max_tokens = 32, tokenizer = false,
        cache = { swa_block = 16, page_tokens = 128, swa_blocks = 20, pages = 4, max_seqs = 8 } }))
      local eng = tide.engine(mid, { budget = 16, policy = "priority", patience = 10000 })
      local lows = {}
      for i, k in ipairs({ 2, 3 }) do
        local s = requests()[k]
        s.max_tokens = 60
        lows[i] = assert(eng:submit(s))
      end
      local bound = 0
      while not (lows[1].seq and lows[2].seq and lows[2].computed > 100) do
        eng:step()
        bound = bound + 1
        assert.is_true(bound < 60, "the low requests never ran together")
      end
      local s = requests()[5]
      s.priority = 9
      local urgent = assert(eng:submit(s))
      local at = eng.step_no
      eng:run()
      -- 120 prompt tokens at 15 a step (one decode shares the budget)
      assert.is_true(urgent.step_first - at <= 10, "urgent first token after " .. (urgent.step_first - at) .. " steps")
      assert.equals(0, urgent.preemptions)
      assert.equals(0, lows[1].preemptions)
      assert.is_true(lows[2].preemptions >= 1)
      local alone = requests()[2]
      alone.max_tokens = 60
      same_result(lows[1]:result(), solo_of(big, { alone })[1], "anchor")
      same_result(urgent:result(), SOLO[5], "urgent")
    end)

    it("fair bounds the wait of short prompts behind a long one", function()
      local function first_steps(pol)
        local eng = tide.engine(big, { budget = 32, policy = pol, patience = 10000 })
        local long = assert(eng:submit{ tokens = tm.tokens(600, V, 9), max_tokens = 2, seed = 1 })
        local shorts = {}
        for i = 1, 3 do shorts[i] = assert(eng:submit{ tokens = tm.tokens(8, V, 20 + i), max_tokens = 2, seed = i }) end
        eng:run()
        local worst = 0
        for _, h in ipairs(shorts) do worst = math.max(worst, h.step_first) end
        return worst, long.step_first
      end
      local fair_short, fair_long = first_steps("fair")
      local fcfs_short = first_steps("fcfs")
      -- 32 tokens over 4 prefilling requests: 8 each, the whole short prompt
      assert.equals(1, fair_short)
      assert.is_true(fcfs_short >= 600 / 32, "fcfs short prompts waited " .. fcfs_short .. " steps")
      assert.is_true(fair_long <= math.ceil((600 - 3 * 8) / 32) + 3, "long prompt done at step " .. fair_long)
    end)

    it("fair gives each prefilling request its share of the budget (the bound, on synthetic views)", function()
      local fair = engine.load_policy("fair")
      local seed = 7
      local function rnd(n)
        seed = (seed * 1103515245 + 12345) % 2147483648
        return math.floor(seed / 65536) % n
      end
      local tested = 0
      for _ = 1, 300 do
        local budget = 1 + rnd(64)
        local chunk = 1 + rnd(budget)
        local running, waiting, k_dec = {}, {}, 0
        local nr, nw = rnd(6), rnd(6)
        local id = 0
        local function req(is_running)
          id = id + 1
          local decode = is_running and rnd(2) == 0
          local pending = decode and 1 or 1 + rnd(100)
          return { id = id, arrival = id, priority = 0, running = is_running, computed = is_running and 10 or 0,
            pending = pending, phase = decode and "decode" or "prefill", n_tokens = 10 + pending,
            swa_held = is_running and 1 or 0, pages_held = is_running and 1 or 0 }
        end
        for i = 1, nr do running[i] = req(true); if running[i].phase == "decode" then k_dec = k_dec + 1 end end
        for i = 1, nw do waiting[i] = req(false) end
        local slots = rnd(4)
        local v = view_mod.new{ step = 1, budget = budget, chunk = chunk, slots = slots,
          free = { swa = 1000, pages = 1000 }, swa_block = 64, page_tokens = 256, paged = true,
          running = running, waiting = waiting }
        local plan = fair.schedule(v)
        local got, total = {}, 0
        for _, e in ipairs(plan) do got[e.req.id] = e.n; total = total + e.n end
        assert.is_true(total <= budget)
        -- the prefilling set: running ones, then waiting ones that free slots admit
        local pre = {}
        for _, r in ipairs(running) do if r.phase ~= "decode" then pre[#pre + 1] = r end end
        for i = 1, math.min(slots, #waiting) do pre[#pre + 1] = waiting[i] end
        local left = budget - math.min(k_dec, budget)
        for _, r in ipairs(pre) do
          local bound = math.min(r.pending, chunk, math.floor(left / #pre))
          assert.is_true((got[r.id] or 0) >= bound,
            string.format("request got %d < bound %d (budget %d, %d prefilling)", got[r.id] or 0, bound, budget, #pre))
          if bound > 0 and #pre > 1 then tested = tested + 1 end
        end
      end
      assert.is_true(tested > 100, "only " .. tested .. " bounds tested")
    end)

    it("loads a user policy file", function()
      local path = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/engine_spec_sjf.lua"
      local f = assert(io.open(path, "wb"))
      f:write([[
-- shortest job first: fewest tokens still to compute, one request at a time
return { name = "sjf", schedule = function(view)
  local all = {}
  for _, r in ipairs(view.running) do all[#all + 1] = r end
  for _, r in ipairs(view.waiting) do all[#all + 1] = r end
  table.sort(all, function(a, b)
    if a.running ~= b.running then return a.running end
    if a.n_prompt ~= b.n_prompt then return a.n_prompt < b.n_prompt end
    return a.arrival < b.arrival
  end)
  local plan = view:plan()
  if all[1] then plan:add(all[1], all[1].pending) end
  return plan
end }
]])
      f:close()
      local eng, hs = run_all(big, { budget = 16, policy = path, max_running = 1, patience = 10000 }, requests())
      assert.equals("sjf", eng.policy.name)
      local order = {}
      for i, h in ipairs(hs) do order[i] = i; local _ = h end
      table.sort(order, function(a, b) return hs[a].step_first < hs[b].step_first end)
      for j = 2, #order do
        assert.is_true(LENS[order[j - 1]] <= LENS[order[j]], "shortest first")
      end
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "sjf request " .. i) end
    end)
  end)

  describe("progress", function()
    it("finishes every request under a policy that starves the oldest", function()
      -- always and only the newest request; its victim is always the anchor
      local starve = { name = "starve", schedule = function(view)
        local newest
        for _, r in ipairs(view.running) do if not newest or r.arrival > newest.arrival then newest = r end end
        for _, r in ipairs(view.waiting) do if not newest or r.arrival > newest.arrival then newest = r end end
        local plan = view:plan()
        plan:add(newest, newest.pending, true)
        return plan
      end, victim = function(view) return view.anchor end }
      local eng, hs = run_all(small, { budget = 16, policy = starve, patience = 3 }, requests())
      local rep = eng:report()
      assert.is_true(rep.forced > 0, "the guarantee had to step in")
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "starved set, request " .. i) end
    end)

    it("runs at least one token per step whatever the policy plans", function()
      local lazy = { name = "lazy", schedule = function() return {} end }
      local eng = tide.engine(big, { budget = 16, policy = lazy })
      local hs = {}
      for i, s in ipairs(requests()) do hs[i] = assert(eng:submit(s)) end
      while eng:active() > 0 do assert.is_true(eng:step() > 0) end
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "lazy policy, request " .. i) end
      assert.equals(0, eng:step())
    end)

    it("keeps the anchor advancing at least every `patience` steps", function()
      -- the oldest request is never scheduled by the policy
      local shun = { name = "shun", schedule = function(view)
        local plan = view:plan()
        for _, r in ipairs(view.running) do if not r.protected then plan:add(r, r.pending) end end
        for _, r in ipairs(view.waiting) do if not r.protected then plan:add(r, r.pending) end end
        return plan
      end }
      local steps = {}
      local specs = requests()
      specs[1].on_token = function(h) steps[#steps + 1] = h.engine.step_no end
      local eng = tide.engine(big, { budget = 16, policy = shun, patience = 5 })
      local hs = {}
      for i, s in ipairs(specs) do hs[i] = assert(eng:submit(s)) end
      for _ = 1, 1000 do
        if eng:active() == 0 then break end
        eng:step()
      end
      assert.equals(0, eng:active(), "the shunned request never finished")
      for k = 2, #steps do
        assert.is_true(steps[k] - steps[k - 1] <= 5, "anchor waited " .. (steps[k] - steps[k - 1]) .. " steps")
      end
      same_result(hs[1]:result(), SOLO[1], "shunned anchor")
    end)
  end)

  describe("errors", function()
    it("names a policy that raises or plans badly, and the engine goes on", function()
      local mode = "raise"
      local bad = { name = "bad", schedule = function(view)
        if mode == "raise" then error("boom") end
        local r = view.waiting[1] or view.running[1]
        if mode == "type" then return 42 end
        if mode == "unknown" then return { { req = 999, n = 1 } } end
        if mode == "twice" then return { { req = r, n = 1 }, { req = r.id, n = 1 } } end
        if mode == "budget" then
          local plan = {}
          for _, x in ipairs(view.waiting) do plan[#plan + 1] = { req = x, n = 5 } end
          return plan
        end
        if mode == "fraction" then return { { req = r, n = 1.5 } } end
        if mode == "chunk" then return { { req = r, n = 12 } } end
        return {}
      end }
      local eng = tide.engine(big, { budget = 16, chunk = 8, policy = bad })
      local hs = {}
      for i, s in ipairs(requests()) do hs[i] = assert(eng:submit(s)) end
      local expect = {
        raise = "policy bad: schedule%(%) raised: .*boom",
        type = "schedule%(%) must return a list",
        unknown = "names request 999, which is not active",
        twice = "appears twice",
        budget = "30 tokens, more than the budget of 16",
        fraction = "n must be an integer",
        chunk = "exceed the chunk limit %(8%)",
      }
      for m, pat in pairs(expect) do
        mode = m
        local ok, err = pcall(eng.step, eng)
        assert.is_false(ok, m)
        assert.truthy(tostring(err):find(pat), m .. ": " .. tostring(err))
      end
      assert.equals(0, #eng.running, "nothing was admitted")
      assert.equals(0, eng.step_no, "failed steps are not counted")
      eng:set_policy("fcfs")
      eng:run()
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "after a bad policy, request " .. i) end
      -- a victim() that raises or names someone who cannot give way
      for _, vmode in ipairs({ "raise", "waiting" }) do
        local pol = { name = "v", schedule = engine.load_policy("fcfs").schedule, victim = function()
          if vmode == "raise" then error("no victim") end
          return 12345
        end }
        local e2 = tide.engine(small, { budget = 16, policy = pol })
        for _, s in ipairs(requests()) do assert(e2:submit(s)) end
        local ok, err = pcall(e2.run, e2)
        assert.is_false(ok)
        assert.truthy(tostring(err):find(vmode == "raise" and "victim%(%) raised: .*no victim"
          or "neither running nor in the plan"), tostring(err))
        e2:set_policy("fcfs")
        e2:run()
        assert.equals(0, e2:active())
      end
    end)

    it("refuses bad policy names and files clearly", function()
      assert.has_error(function() tide.engine(big, { policy = "nope" }) end,
        "engine: unknown policy 'nope' (built-in: fcfs, priority, fair; or give a file path)")
      local ok, err = pcall(tide.engine, big, { policy = "/nonexistent/p.lua" })
      assert.is_false(ok)
      assert.truthy(err:find("cannot load policy file /nonexistent/p.lua"))
      local path = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/engine_spec_bad.lua"
      local f = assert(io.open(path, "wb"))
      f:write("return 3\n")
      f:close()
      ok, err = pcall(tide.engine, big, { policy = path })
      assert.is_false(ok)
      assert.truthy(err:find("must be a table with a schedule%(view%) function"))
    end)

    it("ends only the request whose sampler or callback raises", function()
      local specs = requests()
      local calls = 0
      specs[2].sampler = sampling.chain{ function(c)
        calls = calls + 1
        if calls == 5 then error("sampler exploded") end
        local _ = c
      end, sampling.greedy() }
      specs[3].on_token = function(h) if #h.generated == 3 then error("callback exploded") end end
      local _, hs = run_all(small, { budget = 16, policy = "fair" }, specs)
      local r2, r3 = hs[2]:result(), hs[3]:result()
      assert.equals("error", r2.finish_reason)
      assert.truthy(r2.error:find("sampler exploded"), r2.error)
      assert.equals(4, #r2.tokens)
      assert.equals("error", r3.finish_reason)
      assert.truthy(r3.error:find("on_token: .*callback exploded"), r3.error)
      assert.same({ SOLO[3].tokens[1], SOLO[3].tokens[2], SOLO[3].tokens[3] }, r3.tokens)
      for _, i in ipairs({ 1, 4, 5, 6 }) do same_result(hs[i]:result(), SOLO[i], "neighbour " .. i) end
    end)

    it("refuses at submission a request larger than the whole cache", function()
      local eng = tide.engine(small, { budget = 16 })
      local h, err = eng:submit{ tokens = tm.tokens(300, V, 1), max_tokens = 100 }
      assert.is_nil(h)
      assert.equals("request of 400 positions (prompt 300 + max_tokens 100) needs 10 SWA blocks and 4 pages, more "
        .. "than the whole cache this engine may use (12 SWA blocks, 3 pages)", err)
      h, err = eng:submit{ tokens = { 1, 2 }, max_tokens = 5000 }
      assert.is_nil(h)
      assert.truthy(err:find("max_position_embeddings %(4096%)"))
      -- an engine limited to fewer blocks than the cache holds
      local e2 = tide.engine(big, { budget = 16, pages = 1 })
      h, err = e2:submit{ tokens = tm.tokens(300, V, 1), max_tokens = 10 }
      assert.is_nil(h)
      assert.truthy(err:find("1 pages%)"))
      assert.equals(0, eng:active() + e2:active())
      -- misuse raises
      assert.has_error(function() eng:submit{ tokens = {} } end, "submit: the prompt is empty")
      assert.has_error(function() eng:submit{ tokens = { 1, V } } end,
        "submit: token 1024 at index 1 is outside the vocabulary (0..1023)")
      assert.has_error(function() eng:submit{ tokens = { 1 }, max_token = 3 } end, "submit: unknown field 'max_token'")
      assert.has_error(function() eng:submit{ prompt = "hi" } end, "submit: the model has no tokenizer; give tokens")
      assert.has_error(function() tide.engine(big, { budget = 64 }) end)
    end)

    it("limits an engine to the blocks it is given", function()
      -- the big cache, but an engine allowed only the tiny cache's worth
      local st = big:cache_stats()
      local eng = tide.engine(big, { budget = 16, swa_blocks = 4, pages = 2 })
      local hs = {}
      for i, s in ipairs(requests()) do hs[i] = assert(eng:submit(s)) end
      local most_swa, most_pages = 0, 0
      while eng:active() > 0 do
        eng:step()
        local now = big:cache_stats()
        most_swa = math.max(most_swa, st.swa_free - now.swa_free)
        most_pages = math.max(most_pages, st.pages_free - now.pages_free)
      end
      assert.is_true(most_swa <= 4 and most_pages <= 2, most_swa .. " SWA blocks, " .. most_pages .. " pages")
      assert.is_true(eng:report().preemptions > 0)
      for i, h in ipairs(hs) do same_result(h:result(), SOLO[i], "limited engine, request " .. i) end
    end)
  end)
end)

describe("tide.engine with a tokenizer", function()
  local demo = tm.get("demo1", { "--preset", "demo", "--seed", "2" })
  local m = assert(tide.model(demo, { max_tokens = 16, cache = { context = 512, max_seqs = 4 } }))

  it("streams text that adds up to the result, and stops at a stop string", function()
    local function run(prompt, stop)
      local eng = tide.engine(m, { budget = 16 })
      local h = assert(eng:submit{ prompt = prompt, max_tokens = 12, seed = 5, sampler = { temp = 0.8 }, stop = stop })
      local parts = {}
      for id, text in h:stream() do
        assert.is_true(id == false or type(id) == "number")
        parts[#parts + 1] = text
      end
      return h, table.concat(parts)
    end
    local h, text = run("Hello there", nil)
    assert.equals(h:text(), text)
    local r = h:result()
    assert.equals(text, r.text)
    assert.equals(12, #r.tokens)
    -- stop at a piece of what came out: the text ends before it
    local piece = text:sub(3, 4)
    local h2, text2 = run("Hello there", { piece })
    assert.equals("stop", h2:result().finish_reason)
    assert.equals(piece, h2:result().stop_string)
    assert.equals(text2, h2:text())
    assert.equals(text:sub(1, (text:find(piece, 1, true)) - 1), text2)
  end)
end)
