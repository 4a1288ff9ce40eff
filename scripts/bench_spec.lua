-- bench_spec.lua: speculative decoding with the MTP block through the engine
-- (docs/speculative.md). One run measures, for speculation off, k = 1..4 and
-- the adaptive policy (at most 4), greedy and at temperature 0.8, one request
-- at a time and 8 concurrent: generated tokens/s (wall time of eng:run(),
-- prefill of the short prompts included), the acceptance rate and the tokens
-- committed per verify step. Every configuration must give the same tokens
-- as speculation off (checked). Rounds are interleaved; medians are printed.
-- --cpu times with the process's CPU time instead of the wall clock (with
-- one thread, steadier on a machine shared with other jobs).
--   tide scripts/bench_spec.lua [--model DIR] [--tokens N] [--rounds R] [--threads T] [--cpu]
-- --cost instead times the verify side: one main-model step of n = 1..5
-- tokens of one sequence (at a context of --context positions) and one
-- MTP-block step, as multiples of the 1-token step; on the bench checkpoint
-- (Flash shapes, bandwidth-bound) this is what a draft costs.
--   tide scripts/bench_spec.lua --cost [--model DIR] [--context N] [--threads T]
-- --session instead times one tide.session generating --tokens tokens (EOS
-- ignored) after a short prompt: off, k = 1..4 and adaptive, greedy and 0.8
-- (the same tokens as off, checked), median of --rounds interleaved rounds.
--   tide scripts/bench_spec.lua --session [--model DIR] [--tokens N] [--rounds R] [--cpu]
-- The machine may be shared: expect +-20% on the rates.
local tide = require("tide")

local dir, n, rounds, threads, cost, ctx, clock = nil, 64, 3, 1, false, 512, tide.time
local session = false
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--model" then i = i + 1; dir = arg[i]
  elseif a == "--tokens" then i = i + 1; n = tonumber(arg[i])
  elseif a == "--rounds" then i = i + 1; rounds = tonumber(arg[i])
  elseif a == "--threads" then i = i + 1; threads = tonumber(arg[i])
  elseif a == "--context" then i = i + 1; ctx = tonumber(arg[i])
  elseif a == "--cost" then cost = true
  elseif a == "--session" then session = true
  elseif a == "--cpu" then clock = os.clock
  else error("bench_spec: unknown argument " .. a) end
  i = i + 1
end
tide.threads(threads)
dir = dir or "models/tide-tiny-en"

local function median(t)
  local s = {}
  for j, x in ipairs(t) do s[j] = x end
  table.sort(s)
  return s[math.floor((#s + 1) / 2)]
end

if session then
  local m = assert(tide.model(dir, { max_tokens = 16, cache = { context = n + 64, max_seqs = 4 } }))
  local cfgs = { 0, 1, 2, 3, 4, { max = 4, policy = "adaptive" } }
  local function name(d) return type(d) == "table" and "adaptive (4)" or (d == 0 and "off" or tostring(d)) end
  print("| sampling | draft k | tokens/s | x off | acceptance | tokens/verify step |")
  print("|---|---|---:|---:|---:|---:|")
  for _, smp in ipairs({ { temp = 0 }, { temp = 0.8 } }) do
    local times, last, ref = {}, {}, nil
    for _ = 1, rounds do
      for ci, d in ipairs(cfgs) do
        local s = assert(m:session{ print = false, sampler = smp, seed = 1, max_tokens = n,
          draft = d ~= 0 and d or nil })
        s:append("And it came to pass, when the king")
        s:_sync(false, "prefill")
        local t0 = clock()
        local r = s:generate{ ignore_eos = true }
        local dt = clock() - t0
        s:close()
        ref = ref or r.tokens
        assert(table.concat(ref, ",") == table.concat(r.tokens, ","), "draft " .. name(d) .. " changed the tokens")
        times[ci] = times[ci] or {}
        table.insert(times[ci], r.n_tokens / dt)
        last[ci] = r
      end
    end
    for ci, d in ipairs(cfgs) do
      local sp = last[ci].speculation
      print(string.format("| %s | %s | %.0f | %.2f | %s | %s |", smp.temp == 0 and "greedy" or "temp 0.8", name(d),
        median(times[ci]), median(times[ci]) / median(times[1]),
        sp and sp.acceptance and string.format("%.0f%%", 100 * sp.acceptance) or "-",
        sp and sp.tokens_per_step and string.format("%.2f", sp.tokens_per_step) or "-"))
    end
  end
  return
end

if cost then
  local C = tide.C
  local m = assert(tide.model(dir, { max_tokens = 16, tokenizer = false,
    cache = { context = ctx + 64, max_seqs = 4 } }))
  local d = assert(require("tide.models.deepseek_v4_mtp").new(m))
  local seq = assert(m:sequence())
  local toks = {}
  for j = 1, ctx do toks[j] = (j * 7919) % m.vocab_size end
  local _, err = m:feed(seq, toks, { logits = false })
  assert(not err, err)
  local hc, dd = m.net.hc, m.net.d
  local keep = tide.zeros({ 8, hc, dd })
  local reps = 7
  local t = {}
  for nn = 1, 5 do
    local xs = {}
    local vt = {}
    for j = 1, nn do vt[j] = (j * 31) % m.vocab_size end
    for r = 1, reps do
      local p0 = seq:len()
      local t0 = clock()
      assert(m:step({ { seq = seq, tokens = vt, logits = "all" } }, { after_forward = function(st)
        C.tide_tensor_copy(keep:narrow(0, 0, nn), st.v.X:narrow(0, 0, nn)) end }))
      xs[r] = clock() - t0
      assert(seq:truncate(p0))
    end
    t[nn] = median(xs)
  end
  local ms = d:sequence()
  local h = tide.zeros({ 1, hc, dd })
  local xs = {}
  for r = 1, reps do
    local f = d:fork(ms)
    local t0 = clock()
    d:step({ { seq = f, hidden = h, tokens = { 5 }, logits = "last" } })
    xs[r] = clock() - t0
    d:free(f)
  end
  local tm = median(xs)
  print(string.format("model %s, context %d, %d thread(s), median of %d, %s time", dir, ctx, threads, reps,
    clock == os.clock and "CPU" or "wall"))
  print("| step | ms | x 1-token step |")
  print("|---|---:|---:|")
  for nn = 1, 5 do
    print(string.format("| main model, %d token%s (verify k = %d) | %.2f | %.2f |", nn, nn > 1 and "s" or "", nn - 1,
      t[nn] * 1e3, t[nn] / t[1]))
  end
  print(string.format("| MTP block, 1 token (one draft) | %.2f | %.2f |", tm * 1e3, tm / t[1]))
  return
end

local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 512, max_seqs = 16 } }))
local PROMPTS = { "And the king said unto", "In the beginning God created the heaven", "A fool and his money",
  "The LORD is my shepherd; I shall not want.", "Blessed are the meek: for they", "And it came to pass, when the",
  "You will be married within a year", "Thou shalt not" }

-- one configuration: requests (1 at a time or all 8 at once, one engine,
-- as a server would run them) -> tokens/s, stats, outputs
local function run(draft, temp, conc)
  local outs, gen, t, drafted, accepted, vsteps, vtok = {}, 0, 0, 0, 0, 0, 0
  local groups = {}
  if conc == 1 then for j = 1, 4 do groups[j] = { j } end
  else groups[1] = {} for j = 1, 8 do groups[1][j] = j end end
  local eng = tide.engine(m, { budget = 64 })
  for _, g in ipairs(groups) do
    local hs = {}
    for _, j in ipairs(g) do
      hs[j] = assert(eng:submit{ prompt = PROMPTS[j], max_tokens = n, seed = j, ignore_eos = true,
        sampler = { temp = temp }, draft = draft })
    end
    local t0 = clock()
    eng:run()
    t = t + (clock() - t0)
    for j, h in pairs(hs) do
      local r = h:result()
      assert(r.status == "done", tostring(r.error))
      outs[j] = table.concat(r.tokens, ",")
      gen = gen + #r.tokens
      local sp = r.speculation
      if sp then
        drafted, accepted, vsteps = drafted + sp.drafted, accepted + sp.accepted, vsteps + sp.steps
        vtok = vtok + (sp.tokens_per_step or 0) * sp.steps
      end
    end
  end
  return gen / t, outs, drafted, accepted, vsteps, vtok
end

local CONFIGS = { { "off", nil }, { "1", 1 }, { "2", 2 }, { "3", 3 }, { "4", 4 },
  { "adaptive (4)", { max = 4, policy = "adaptive" } } }
run(2, 0, 8) -- warm-up
print(string.format("model %s, %d tokens per request, %d thread(s), median of %d interleaved rounds, %s time", dir, n,
  threads, rounds, clock == os.clock and "CPU" or "wall"))
print("| sampling | requests | draft k | tokens/s | x off | acceptance | tokens/verify step |")
print("|---|---|---|---:|---:|---:|---:|")
for _, temp in ipairs({ 0, 0.8 }) do
  for _, conc in ipairs({ 1, 8 }) do
    local rates, info, base = {}, {}, nil
    for _ = 1, rounds do
      for ci, c in ipairs(CONFIGS) do
        local tps, outs, dr, ac, vs, vt = run(c[2], temp, conc)
        if ci == 1 then base = base or outs end
        for j, o in pairs(outs) do
          assert(o == base[j], "k = " .. c[1] .. " differs from speculation off (request " .. j .. ")")
        end
        rates[ci] = rates[ci] or {}
        rates[ci][#rates[ci] + 1] = tps
        info[ci] = { dr, ac, vs, vt }
      end
    end
    local off = median(rates[1])
    for ci, c in ipairs(CONFIGS) do
      local r, x = median(rates[ci]), info[ci]
      print(string.format("| %s | %s | %s | %.0f | %.2f | %s | %s |", temp == 0 and "greedy" or "temp 0.8",
        conc == 1 and "1 at a time" or "8 at once", c[1], r, r / off,
        x[1] > 0 and string.format("%.0f%%", 100 * x[2] / x[1]) or "-",
        x[3] > 0 and string.format("%.2f", x[4] / x[3]) or "-"))
    end
  end
end
