-- bench_sampling.lua: time per token of sampling chains on a 129,280-entry
-- vocabulary (DeepSeek-V4's), one thread, from Lua through the whole
-- state:sample + state:accept path, against the 0.5 ms target and against
-- the cost of one pass over the row (loading it into a candidates set, the
-- least any sampler does), measured in the same run.
--   tide scripts/bench_sampling.lua [--quick] [--vocab V]
-- Logits are synthetic: randn * sigma, 16 different rows cycled. Three
-- shapes, from what a model gives to the worst case for a nucleus:
--   peaked  sigma 8: entropy ~1-2 nats, the top-p 0.95 set has tens of tokens
--   broad   sigma 3: entropy ~7.7 nats, the top-p set has ~10^4 tokens
--   flat    sigma 1: entropy ~11 nats, the top-p set is ~3/4 of the vocabulary
-- Medians of several runs; the machine may be shared, so expect +-20%.
local tide = require("tide")
local sampling = tide.sampling
local core = require("tide.sampling.core")
local ffi = require("ffi")
local C = tide.C

-- CPU time of this thread: on a shared machine it counts only the cycles
-- this benchmark got, where wall time also counts the waits for a core.
ffi.cdef("struct tide_bench_ts { long tv_sec; long tv_nsec; }; int clock_gettime(int, struct tide_bench_ts *);")
local ts = ffi.new("struct tide_bench_ts")
local function cpu_time()
  ffi.C.clock_gettime(3, ts)   -- CLOCK_THREAD_CPUTIME_ID
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local quick, V = false, 129280
local i = 1
while arg and arg[i] do
  if arg[i] == "--quick" then quick = true
  elseif arg[i] == "--vocab" then i = i + 1; V = tonumber(arg[i])
  else error("unknown argument " .. arg[i]) end
  i = i + 1
end
local RUNS, TOKENS = quick and 3 or 7, quick and 50 or 200

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local shapes = { { "peaked", 8 }, { "broad", 3 }, { "flat", 1 } }
local rows = {}
for _, sh in ipairs(shapes) do
  local list = {}
  for k = 1, 16 do list[k] = tide.randn({ V }, { seed = 1000 * sh[2] + k, std = sh[2] }) end
  rows[sh[1]] = list
end

local function describe_shape(list)
  local c = core.candidates(V)
  c:load(list[1])
  local h = c:entropy()
  c:top_p(0.95, 1)
  return h, c.n
end

local function penalties() return sampling.penalties{ last_n = 64, repeat_penalty = 1.1, frequency = 0.1 } end
local chains = {
  { "typical: penalties, top-k 40, top-p 0.95, min-p 0.05, temp 0.8, dist", function()
    return sampling.chain{ penalties(), sampling.top_k(40), sampling.top_p(0.95), sampling.min_p(0.05),
      sampling.temperature(0.8), sampling.dist() }
  end },
  { "no top-k: penalties, top-p 0.95, min-p 0.05, temp 0.8, dist", function()
    return sampling.chain{ penalties(), sampling.top_p(0.95), sampling.min_p(0.05), sampling.temperature(0.8),
      sampling.dist() }
  end },
  { "greedy", function() return sampling.chain{ sampling.greedy() } end },
  { "dist only (softmax + draw over the whole row)", function() return sampling.chain{ sampling.dist() } end },
  { "llama.cpp default (from_options{})", function() return assert(sampling.from_options({})) end },
}

-- ms per token over TOKENS tokens, medians of RUNS: CPU time, wall time
local function time_chain(make, list, opts)
  local s = make()
  local cpu, wall = {}, {}
  for _ = 1, RUNS do
    local st = s:new_state{ seed = 1, logprobs = opts and opts.logprobs, trace = opts and opts.trace }
    st:accept({ 1, 2, 3, 4, 5, 6, 7, 8 })
    local t0, c0 = tide.time(), cpu_time()
    for k = 1, TOKENS do
      local tok = st:sample(list[(k - 1) % #list + 1])
      st:accept(tok)
    end
    cpu[#cpu + 1] = (cpu_time() - c0) / TOKENS * 1e3
    wall[#wall + 1] = (tide.time() - t0) / TOKENS * 1e3
    if opts and opts.trace then st:clear_trace() end
  end
  return median(cpu), median(wall)
end

-- one pass over the row: tide_cands_load (copy, ids, NaN/inf scan)
local function time_load(list)
  local c = core.candidates(V)
  local res = {}
  for _ = 1, RUNS do
    local c0 = cpu_time()
    for k = 1, TOKENS do C.tide_cands_load(c, list[(k - 1) % #list + 1], 0) end
    res[#res + 1] = (cpu_time() - c0) / TOKENS * 1e3
  end
  return median(res)
end

io.write(string.format("sampling, vocabulary %d, 1 thread, %s; medians of %d runs of %d tokens\n", V,
  tide.cpu(), RUNS, TOKENS))
io.write("times are CPU time of the sampling thread per token (wall time in brackets)\n")
tide.threads(1)
local load = {}
io.write("\n| logits | entropy (nats) | top-p 0.95 set | one pass over the row (load) |\n|---|---|---|---|\n")
for _, sh in ipairs(shapes) do
  local h, n = describe_shape(rows[sh[1]])
  load[sh[1]] = time_load(rows[sh[1]])
  io.write(string.format("| %s (sigma %g) | %.2f | %d | %.3f ms |\n", sh[1], sh[2], h, n, load[sh[1]]))
end

io.write("\n| chain | " .. table.concat((function()
  local t = {}
  for k, sh in ipairs(shapes) do t[k] = sh[1] end
  return t
end)(), " | ") .. " |\n|---|---|---|---|\n")
for _, ch in ipairs(chains) do
  local cells = {}
  for k, sh in ipairs(shapes) do
    local ms, wall = time_chain(ch[2], rows[sh[1]])
    cells[k] = string.format("%.3f ms (%.1f passes; wall %.3f)%s", ms, ms / load[sh[1]], wall,
      ms > 0.5 and " over" or "")
  end
  io.write("| " .. ch[1] .. " | " .. table.concat(cells, " | ") .. " |\n")
  io.stdout:flush()
end

io.write("\nextras on the typical chain, peaked logits:\n")
local base = time_chain(chains[1][2], rows.peaked)
local lp = time_chain(chains[1][2], rows.peaked, { logprobs = 5 })
local tr = time_chain(chains[1][2], rows.peaked, { trace = true })
io.write(string.format("  plain %.3f ms, with logprobs = 5 %.3f ms (+%.3f), with trace %.3f ms (+%.3f)\n", base, lp,
  lp - base, tr, tr - base))
local was = tide.reference_kernels(true)
local ref = time_chain(chains[1][2], rows.peaked)
local ref2 = time_chain(chains[2][2], rows.flat)
tide.reference_kernels(was)
io.write(string.format("  scalar reference kernels (TIDE_REF=1): typical/peaked %.3f ms, no-top-k/flat %.3f ms\n", ref,
  ref2))
io.write("target: < 0.5 ms per token\n")
