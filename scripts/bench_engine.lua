-- scripts/bench_engine.lua: the batching engine on the `bench` checkpoint
-- (Flash layer shapes, 4 layers, ~1.9 GB; made under build/ when missing).
--   * generated tokens/s against the number of concurrent requests (1, 2, 4,
--     8, 16), each with a 256-token prompt and 128 generated tokens
--     (ignore_eos, temperature 0.8, its own seed), all submitted at once;
--     the decode rate (steps that ran no prompt tokens) and the time per step;
--   * time to first token under that load (mean and worst), and, at the
--     highest concurrency, under the `fair` policy too;
--   * the share of each step spent in Lua scheduling (view, policy, checks,
--     admission, the step's token lists; target < 2%) and in sampling.
-- The read bandwidth of this machine is measured in the same run. Medians of
-- several runs; prints a markdown table.
-- Usage: tide scripts/bench_engine.lua [--quick] [--threads N] [--model DIR] [--runs N] [--conc 1,2,4,8,16]
--   [--no-fair]   (--conc: the concurrencies; --no-fair: skip the fair-policy run)
local tide = require("tide")
local C = tide.C

local quick, model_dir, runs, conc, fair = false, nil, nil, nil, true
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--quick" then quick = true
  elseif a == "--threads" then tide.threads(tonumber(arg[i + 1])); i = i + 1
  elseif a == "--model" then model_dir = arg[i + 1]; i = i + 1
  elseif a == "--runs" then runs = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--conc" then
    conc = {}
    for c in arg[i + 1]:gmatch("%d+") do conc[#conc + 1] = tonumber(c) end
    i = i + 1
  elseif a == "--no-fair" then fair = false
  else error("bench_engine: unknown argument " .. a) end
  i = i + 1
end
local PROMPT = quick and 64 or 256
local GEN = quick and 16 or 128
local CONC = conc or (quick and { 1, 4, 16 } or { 1, 2, 4, 8, 16 })
local RUNS = runs or (quick and 1 or 3)
local BUDGET = 256

local function median(xs)
  local s = {}
  for k, v in ipairs(xs) do s[k] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

local function loadavg()
  local f = io.open("/proc/loadavg", "rb")
  if not f then return "?" end
  local s = f:read("*l")
  f:close()
  return s:match("^(%S+ %S+ %S+)") or s
end

-- the bench checkpoint (deterministic: the same options give the same bytes)
local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end
local build = os.getenv("TIDE_BUILD_DIR") or "build"
model_dir = model_dir or (build .. "/models/bench")
if not exists(model_dir .. "/config.json") then
  io.stderr:write("bench_engine: writing the bench checkpoint to ", model_dir, " (~2 GB, once)\n")
  local exe = (rawget(_G, "_TIDE_EXE") or {}).exe or (build .. "/tide")
  local cmd = string.format("%s scripts/make_checkpoint.lua --preset bench --quiet --out %s", exe, model_dir)
  assert(os.execute(cmd) == 0 or exists(model_dir .. "/config.json"), "make_checkpoint failed: " .. cmd)
end

local threads = tide.threads()
local bw = C.tide_bench_read_bw(256 * 2 ^ 20, 3, threads)
local load0 = loadavg()
local max_conc = CONC[#CONC]
local m = assert(tide.model(model_dir, { max_tokens = BUDGET, prefault = true, tokenizer = false,
  cache = { context = PROMPT + GEN, max_seqs = max_conc, seq_budget = max_conc } }))
local V = m.vocab_size

local function prompt(n, seed)
  local t, x = {}, seed
  for k = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[k] = math.floor(x / 65536) % V
  end
  return t
end

-- one run: c requests submitted at once, the engine stepped to the end
local function run(c, policy)
  local eng = tide.engine(m, { budget = BUDGET, policy = policy })
  local hs = {}
  for k = 1, c do
    hs[k] = assert(eng:submit{ tokens = prompt(PROMPT, 1000 + k), max_tokens = GEN, seed = k, ignore_eos = true,
      sampler = { temp = 0.8 } })
  end
  local t0 = tide.time()
  local t_dec, n_dec, steps = 0, 0, 0
  while eng:active() > 0 do
    local pre = eng.stats.prefill_tokens
    local gen = eng.stats.generated
    local ts = tide.time()
    eng:step()
    local dt = tide.time() - ts
    steps = steps + 1
    if eng.stats.prefill_tokens == pre then
      t_dec = t_dec + dt
      n_dec = n_dec + (eng.stats.generated - gen)
    end
  end
  local wall = tide.time() - t0
  local rep = eng:report()
  local ttft, worst = 0, 0
  for _, h in ipairs(hs) do
    local r = h:result()
    assert(r.completion_tokens == GEN, "a request stopped early")
    ttft = ttft + r.ttft
    worst = math.max(worst, r.ttft)
  end
  return {
    tps = rep.generated / wall, dec = t_dec > 0 and n_dec / t_dec or 0 / 0, ttft = ttft / c, ttft_max = worst,
    step_ms = 1e3 * rep.t_total / rep.steps, sched = rep.sched_share, sample = rep.sample_share,
    sched_us = 1e6 * rep.t_sched / rep.steps, steps = steps,
  }
end

run(1, "fcfs")   -- warm up (pages, scratch buffers, traces)
local rows = {}
local function measure(c, policy)
  local all = {}
  for r = 1, RUNS do all[r] = run(c, policy) end
  local out = { c = c, policy = policy }
  for _, k in ipairs({ "tps", "dec", "ttft", "ttft_max", "step_ms", "sched", "sample", "sched_us", "steps" }) do
    local xs = {}
    for r = 1, RUNS do xs[r] = all[r][k] end
    out[k] = median(xs)
  end
  rows[#rows + 1] = out
  io.stderr:write(string.format("  %2d requests (%s): %.1f tokens/s, decode %.1f\n", c, policy, out.tps, out.dec))
end
for _, c in ipairs(CONC) do measure(c, "fcfs") end
if fair then measure(max_conc, "fair") end

print(string.format("## tide engine on %s (%d threads, %s prompts of %d tokens, %d generated; budget %d)",
  model_dir, threads, "random", PROMPT, GEN, BUDGET))
print(string.format("read bandwidth %.1f GB/s; load average before %s, after %s; medians of %d run(s)", bw,
  load0, loadavg(), RUNS))
print("")
print("| requests | policy | generated tok/s | decode tok/s | TTFT mean (s) | TTFT worst (s) | ms / step "
  .. "| Lua scheduling | per step | sampling |")
print("|---|---|---|---|---|---|---|---|---|---|")
for _, r in ipairs(rows) do
  print(string.format("| %d | %s | %.1f | %.1f | %.2f | %.2f | %.1f | %.2f%% | %.0f us | %.2f%% |", r.c, r.policy,
    r.tps, r.dec, r.ttft, r.ttft_max, r.step_ms, 100 * r.sched, r.sched_us, 100 * r.sample))
end
m:close()
