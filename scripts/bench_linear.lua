-- scripts/bench_linear.lua: the quantised linear kernels against the limits
-- of this machine, measured in the same run.
--   * M = 1 (decode): GB/s of weight bytes read, and the share of the read
--     bandwidth (tide_bench_read_bw) with 1 and with all threads. A weight
--     smaller than 256 MiB is swept as several copies, so it comes from
--     DRAM and not from the L3 (32 MiB per CCD; two threads may sit on two).
--   * M = 2, 4, 8 (decode of a few sequences): the same sweep, GB/s and
--     GFLOP/s with all threads.
--   * M = 64 and M = 256 (prefill): GFLOP/s of the invariant kernels, of
--     oneDNN f32 on f32 weights of the same shape, and of the FAST policy
--     (oneDNN on dequantised panels of the real format).
-- Rows marked "q8" run the opt-in int8 policy (docs/linear.md); their GB/s
-- count the bytes that policy reads (FP8: the int8 copy, 1.0625 bytes/weight).
-- Every figure is the median of several runs; prints markdown tables.
-- TIDE_NO_AVX512=1 in the environment measures the AVX2 kernels on a CPU
-- that has the AVX-512 ones (the header says which ran).
-- Usage: tide scripts/bench_linear.lua [--quick] [--decode]
--   --decode: only the M <= 8 table (and the bandwidth), a minute or so
local tide = require("tide")
local q = tide.quant
local C = tide.C
local ffi = require("ffi")

local quick, decode_only = false, false
for i = 1, #arg do
  if arg[i] == "--quick" then quick = true end
  if arg[i] == "--decode" then decode_only = true end
end
local RUNS = quick and 3 or 5
local BW_BYTES = quick and (64 * 1048576) or (256 * 1048576)
local MIN_SWEEP = (quick and 128 or 256) * 1048576 -- bytes of distinct weights per M = 1 sweep
local MIN_TIME = quick and 0.05 or 0.2

local function median(xs)
  table.sort(xs)
  local n = #xs
  if n % 2 == 1 then return xs[(n + 1) / 2] end
  return (xs[n / 2] + xs[n / 2 + 1]) / 2
end

-- seconds per call of f (median over RUNS, each run repeated for MIN_TIME)
local function timeit(f, calls_per_f)
  f() -- warm up
  local xs = {}
  for r = 1, RUNS do
    local n, t0 = 0, tide.time()
    local dt
    repeat
      f()
      n = n + 1
      dt = tide.time() - t0
    until dt >= MIN_TIME
    xs[r] = dt / (n * (calls_per_f or 1))
  end
  return median(xs)
end

local function with_threads(n, f)
  local old = tide.threads()
  tide.threads(n)
  local a, b = f()
  tide.threads(old)
  return a, b
end

local T = math.max(2, tide.threads())

-- a random weight of the given format: tensors w, scale
local function make_weight(fmt, n, k, seed)
  if fmt == "fp8" then
    local w = tide.randn({ n, k }, { seed = seed, std = 64, dtype = "f8e4m3" })
    return w, tide.full({ math.ceil(n / 128), math.ceil(k / 128) }, 2 ^ -10, "e8m0")
  elseif fmt == "mxfp4" then
    local w = tide.randn({ n, k / 2 }, { seed = seed, std = 64, dtype = "f8e4m3" }):view_dtype("u8")
    return w, tide.full({ n, k / 32 }, 2 ^ -6, "e8m0")
  end
  return tide.randn({ n, k }, { seed = seed, std = 0.02, dtype = fmt }), nil
end

local shapes = {
  { name = "wq_b", fmt = "fp8", n = 32768, k = 1024 },
  { name = "wo_b", fmt = "fp8", n = 4096, k = 8192 },
  { name = "wq_b", fmt = "fp8", n = 32768, k = 1024, policy = "q8" },
  { name = "wo_b", fmt = "fp8", n = 4096, k = 8192, policy = "q8" },
  { name = "expert w1", fmt = "mxfp4", n = 2048, k = 4096 },
  { name = "expert w1", fmt = "mxfp4", n = 2048, k = 4096, policy = "q8" },
  { name = "expert w2", fmt = "mxfp4", n = 4096, k = 2048, policy = "q8" },
  { name = "head", fmt = "bf16", n = quick and 16384 or 129280, k = 4096 },
  { name = "K=N=4096", fmt = "fp8", n = 4096, k = 4096 },
  { name = "K=N=4096", fmt = "mxfp4", n = 4096, k = 4096 },
  { name = "K=N=4096", fmt = "mxfp4", n = 4096, k = 4096, policy = "q8" },
  { name = "K=N=4096", fmt = "bf16", n = 4096, k = 4096 },
  { name = "K=N=4096", fmt = "f32", n = 4096, k = 4096 },
}

local bw1 = with_threads(1, function()
  local xs = {}
  for r = 1, RUNS do xs[r] = C.tide_bench_read_bw(BW_BYTES, 1, 1) end
  return median(xs)
end)
local bwT = with_threads(T, function()
  local xs = {}
  for r = 1, RUNS do xs[r] = C.tide_bench_read_bw(BW_BYTES, 1, T) end
  return median(xs)
end)

-- distinct copies of a weight, enough to leave the caches in one sweep
local function sweep_copies(sh)
  local copies = { q.linear(make_weight(sh.fmt, sh.n, sh.k, 1)) }
  local ncopies = math.max(1, math.ceil(MIN_SWEEP / copies[1].bytes))
  for c = 2, ncopies do copies[c] = q.linear(make_weight(sh.fmt, sh.n, sh.k, c)) end
  if sh.policy then
    for c = 1, ncopies do
      copies[c]:policy(sh.policy)
      -- the bytes a forward reads now (an int8 copy for the non-MXFP4 formats)
      copies[c].bytes = tonumber(C.tide_linear_weight_bytes(copies[c].ptr))
    end
  end
  return copies
end

local function close_all(copies)
  for c = 1, #copies do copies[c]:close() end
  collectgarbage()
end

-- GB/s of weight bytes read by forwards over all copies at M rows of x
local function sweep_rate(copies, sh, M, nt)
  local x, y = tide.randn({ M, sh.k }, { seed = 7 }), tide.zeros(M, sh.n)
  local opts = { out = y }
  local function sweep()
    for c = 1, #copies do copies[c]:forward(x, opts) end
  end
  local t = with_threads(nt, function() return timeit(sweep, #copies) end)
  return copies[1].bytes / t / 1e9
end

-- the format column: "mxfp4 q8" for the opt-in int8-activation policy
local function fmt_label(sh) return sh.policy and (sh.fmt .. " " .. sh.policy) or sh.fmt end

local rows, drows = {}, {}
local notes = {}
local DECODE_MS = { 2, 4, 8 }
for _, sh in ipairs(shapes) do
  local copies = sweep_copies(sh)
  local lin, bytes = copies[1], copies[1].bytes
  local flop_per_byte = 2 * sh.n * sh.k / bytes
  -- M = 1, 1 and T threads
  local g1 = sweep_rate(copies, sh, 1, 1)
  local gT = sweep_rate(copies, sh, 1, T)
  -- M = 2, 4, 8 with T threads
  local dcells = { string.format("%.1f (%.0f%%)", gT, 100 * gT / bwT) }
  for _, M in ipairs(DECODE_MS) do
    local g = sweep_rate(copies, sh, M, T)
    dcells[#dcells + 1] = string.format("%.1f (%.0f%%) %.0f", g, 100 * g / bwT, g * flop_per_byte * M)
  end
  drows[#drows + 1] = string.format("| %s %dx%d | %s | %s |", sh.name, sh.n, sh.k, fmt_label(sh),
    table.concat(dcells, " | "))
  if not decode_only then
    -- prefill: invariant kernels, oneDNN f32 on f32 weights, FAST policy
    local w, s = make_weight(sh.fmt, sh.n, sh.k, 1)
    local wf = lin.format == "f32" and w or q.dequant(w, s)
    local lf = q.linear(wf)
    local cells = {}
    for _, M in ipairs({ 64, 256 }) do
      local x, y = tide.randn({ M, sh.k }, { seed = 8 }), tide.zeros(M, sh.n)
      local flop = 2 * M * sh.n * sh.k
      local opts = { out = y }
      local dopts = { out = y, backend = "dnnl" }
      local ti = with_threads(T, function() return timeit(function() lin:forward(x, opts) end) end)
      local ok, td = pcall(with_threads, T, function() return timeit(function() lf:forward(x, dopts) end) end)
      local tf
      if ok and lin.format ~= "f32" then
        lin:policy("fast")
        tf = with_threads(T, function() return timeit(function() lin:forward(x, opts) end) end)
        lin:policy(sh.policy or "invariant")
      end
      cells[#cells + 1] = string.format("%.0f / %s / %s", flop / ti / 1e9, ok and string.format("%.0f", flop / td / 1e9)
        or "n/a", tf and string.format("%.0f", flop / tf / 1e9) or "=")
      if ok and td < ti then notes[#notes + 1] = string.format("%s %s M=%d: oneDNN f32 faster (%.2fx)", sh.name, sh.fmt,
          M, ti / td) end
    end
    rows[#rows + 1] = string.format("| %s %dx%d | %s | %.1f | %.1f (%.0f%%) | %.1f (%.0f%%) | %s | %s |", sh.name, sh.n,
      sh.k, fmt_label(sh), bytes / 1048576, g1, 100 * g1 / bw1, gT, 100 * gT / bwT, cells[1], cells[2])
    lf:close()
  end
  close_all(copies)
end

print(string.format("tide %s, %s, %s, linear kernels %s, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s, "
  .. "DNNL_MAX_CPU_ISA=%s; median of %d runs%s", tide.version, jit.version, tide.cpu(),
  ffi.string(C.tide_linear_isa()), os.getenv("OMP_WAIT_POLICY") or "(default)",
  os.getenv("GOMP_SPINCOUNT") or "(default)", os.getenv("DNNL_MAX_CPU_ISA") or "(default)", RUNS,
  quick and " (--quick: short runs, small head)" or ""))
print(string.format("read bandwidth (tide_bench_read_bw, %d MiB): %.1f GB/s with 1 thread, %.1f GB/s with %d threads",
  BW_BYTES / 1048576, bw1, bwT, T))
if not decode_only then
  print("")
  print(string.format("| weight | format | MiB | M=1 GB/s, 1 thread | M=1 GB/s, %d threads | M=64 GFLOP/s | %s |", T,
    "M=256 GFLOP/s"))
  print("|---|---|---|---|---|---|---|")
  for _, r in ipairs(rows) do print(r) end
  print("")
  print(string.format("GFLOP/s cells: invariant kernels / oneDNN f32 on f32 weights / FAST policy (oneDNN on "
    .. "dequantised panels), %d threads. Percentages: of the read bandwidth with the same thread count.", T))
  print("oneDNN picks its ISA at run time (AVX-512 where the CPU has it); DNNL_MAX_CPU_ISA=AVX2 in the environment")
  print("compares it on the terms of the AVX2 target the invariant kernels are written for.")
  for _, n in ipairs(notes) do print("note: " .. n) end
end
print("")
print(string.format("| weight | format | M=1 GB/s, %d threads | M=2 GB/s, GFLOP/s | M=4 | M=8 |", T))
print("|---|---|---|---|---|---|")
for _, r in ipairs(drows) do print(r) end
print("")
print(string.format("Decode table: GB/s of weight bytes read (share of the %d-thread read bandwidth) and GFLOP/s,", T))
print(string.format("%d threads, weights swept from DRAM.", T))
