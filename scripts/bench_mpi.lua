-- bench_mpi.lua: expert parallelism over MPI on the bench checkpoint
-- (docs/scale-out.md). Run it alone for the one-process figures, and under
-- mpirun for N ranks:
--   tide scripts/bench_mpi.lua [--model DIR] [--prompt 64] [--decode 16] [--out logits.f32]
--   mpirun -np 4 --oversubscribe build/tide scripts/bench_mpi.lua ...
-- Prints: the step times of a prefill and of decode steps, the time rank 0
-- waited on the exchange (the communication share of a step), the hidden-row
-- bytes per token per MoE layer against 2 x routed slots x hidden x 2 bytes
-- (bf16) x the share of slots that left rank 0, and every rank's routed-expert
-- bytes held and resident (pages this process touched). --out writes the last
-- logits, to compare runs with cmp.
local tide = require("tide")
local ffi = require("ffi")
local mpi = require("tide.mpi")

local root = (arg and arg[0] and arg[0]:match("^(.*)/scripts/[^/]*$")) or "."
local o = { model = root .. "/build/models/bench", prompt = 64, decode = 16, out = nil }
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--model" then i = i + 1; o.model = arg[i]
  elseif a == "--prompt" then i = i + 1; o.prompt = tonumber(arg[i])
  elseif a == "--decode" then i = i + 1; o.decode = tonumber(arg[i])
  elseif a == "--out" then i = i + 1; o.out = arg[i]
  else error("bench_mpi: unknown argument " .. a) end
  i = i + 1
end
local f = io.open(o.model .. "/config.json", "rb")
if not f then
  io.stderr:write("bench_mpi: no checkpoint at " .. o.model .. " (make it with: build/tide scripts/make_checkpoint.lua"
    .. " --preset bench --out " .. o.model .. ")\n")
  return
end
f:close()

local M = rawget(_G, "_TIDE_MPI")
local N = M and M.size or 1
local m = assert(tide.model(o.model, { max_tokens = math.max(o.prompt, 1), tokenizer = false,
  cache = { context = o.prompt + o.decode + 16, max_seqs = 1, seq_budget = 1 } }))
local cfg = m.config
local d, k, E = cfg.hidden_size, cfg.num_experts_per_tok, cfg.n_routed_experts
local V = m.vocab_size
local toks, x = {}, 11
for j = 1, o.prompt do
  x = (x * 1103515245 + 12345) % 2147483648
  toks[j] = x % V
end

local function stats() return M and M.stats() or { t_wait = 0, bytes_rows = 0, rows_remote = 0, rows_local = 0,
  tokens = 0, calls = 0, t_total = 0 } end

local s = m:sequence()
local s0 = stats()
local t0 = tide.time()
local out = m:step{ { seq = s, tokens = toks, logits = "last" } }
local t_pre = tide.time() - t0
local s1 = stats()
local steps, waits = {}, {}
local last = out[1]
for j = 1, o.decode do
  local sa = stats()
  local ta = tide.time()
  out = m:step{ { seq = s, tokens = { (j * 7919) % V }, logits = "last" } }
  steps[j] = tide.time() - ta
  waits[j] = stats().t_wait - sa.t_wait
  last = out[1]
end
local s2 = stats()

local function median(t)
  local c = {}
  for a, v in ipairs(t) do c[a] = v end
  table.sort(c)
  local n = #c
  if n == 0 then return 0 end
  return n % 2 == 1 and c[(n + 1) / 2] or (c[n / 2] + c[n / 2 + 1]) / 2
end
local function sum(t)
  local a = 0
  for _, v in ipairs(t) do a = a + v end
  return a
end

print(string.format("bench_mpi: %s, N = %d ranks, hidden %d, %d routed experts, k = %d, %d MoE layers, threads %d",
  o.model, N, d, E, k, cfg.num_hidden_layers, tide.threads()))
print(string.format("  prefill %d tokens: %.3f s, exchange wait %.3f s (%.1f%% of the step)", o.prompt, t_pre,
  s1.t_wait - s0.t_wait, 100 * (s1.t_wait - s0.t_wait) / t_pre))
print(string.format("  decode: median step %.1f ms, median exchange wait %.1f ms; wait share %.1f%% of %d steps",
  1e3 * median(steps), 1e3 * median(waits), 100 * sum(waits) / math.max(sum(steps), 1e-9), o.decode))
if M then
  local tok_layers = s2.tokens - s0.tokens
  local slots = s2.rows_local + s2.rows_remote - s0.rows_local - s0.rows_remote
  local remote = s2.rows_remote - s0.rows_remote
  local per = (s2.bytes_rows - s0.bytes_rows) / tok_layers
  print(string.format("  exchange: %.0f hidden-row bytes per token per MoE layer; 2 x k x hidden x 2 B = %d,"
    .. " x the remote share %.3f (%d of %d slots) = %.0f", per, 2 * k * d * 2, remote / slots, remote, slots,
    2 * k * d * 2 * remote / slots))
  print(string.format("  messages: %.0f bytes per token per MoE layer with headers and expert ids",
    ((s2.bytes_sent + s2.bytes_recv) - (s0.bytes_sent + s0.bytes_recv)) / tok_layers))
  local res = M.residency(1)
  for r = 0, N - 1 do
    local p = res[r]
    print(string.format("  rank %d: routed experts held %.1f MB in %d tensors, resident %.1f MB;"
      .. " the other ranks' experts resident here %.1f MB", r, p.bytes / 1e6, p.tensors, p.resident / 1e6,
      p.other_resident / 1e6))
  end
else
  local n, b, res = mpi.local_residency(m.ck)
  print(string.format("  one process: routed experts held %.1f MB in %d tensors, resident %.1f MB", b / 1e6, n,
    res / 1e6))
end
if o.out then
  local fo = assert(io.open(o.out, "wb"))
  fo:write(ffi.string(last.data, last:nbytes()))
  fo:close()
end
