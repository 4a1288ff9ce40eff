-- scripts/bench_foundation.lua: what the foundation costs, measured against
-- the limits of this machine in the same run.
--   * one FFI call into tide from JIT-compiled Lua (a no-op, and a call that
--     passes a tensor header);
--   * one empty OpenMP parallel region (what every threaded kernel pays);
--   * bf16 -> f32 and fp8 -> f32 conversion throughput (tide_convert, AVX2
--     and scalar reference) against the read bandwidth (tide_bench_read_bw).
-- Every figure is the median of several runs; prints a markdown table.
-- Usage: tide scripts/bench_foundation.lua [--quick]
local tide = require("tide")
local C = tide.C

local quick = false
for i = 1, #arg do
  if arg[i] == "--quick" then quick = true end
end
local RUNS = quick and 3 or 7
local NCONV = quick and (8 * 1024 * 1024) or (64 * 1024 * 1024) -- elements converted per run
local BW_BYTES = quick and (64 * 1024 * 1024) or (256 * 1024 * 1024)

local function median(xs)
  table.sort(xs)
  local n = #xs
  if n % 2 == 1 then return xs[(n + 1) / 2] end
  return (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local function runs(f)
  local xs = {}
  for r = 1, RUNS do xs[r] = f() end
  return median(xs)
end

-- ns per FFI call, in a loop the JIT compiles
local function ffi_noop()
  local n = quick and 2e6 or 2e7
  local s = 0
  local t0 = C.tide_time()
  for i = 1, n do s = s + C.tide_bench_noop(i) end
  local dt = C.tide_time() - t0
  assert(s > 0)
  return dt / n * 1e9
end

local tensor = tide.zeros(4, 4)
local function ffi_tensor()
  local n = quick and 2e6 or 2e7
  local s = 0
  local t0 = C.tide_time()
  for _ = 1, n do s = s + C.tide_tensor_numel(tensor) end
  local dt = C.tide_time() - t0
  assert(s > 0)
  return dt / n * 1e9
end

-- µs per empty parallel region
local function omp_region()
  local n = quick and 2000 or 20000
  C.tide_bench_empty_parallel() -- wake the pool
  local t0 = C.tide_time()
  for _ = 1, n do C.tide_bench_empty_parallel() end
  return (C.tide_time() - t0) / n * 1e6
end

local function read_bw(threads)
  return runs(function() return C.tide_bench_read_bw(BW_BYTES, 1, threads) end)
end

-- conversion throughput: GB/s of source read, and of source + destination
local src_bf16 = tide.randn({ NCONV }, { seed = 1, dtype = "bf16" })
local src_fp8 = tide.randn({ NCONV }, { seed = 2, dtype = "f8e4m3" })
local dst = tide.zeros(NCONV) -- f32, pages already touched by the zero fill
local function conversion(src, dtype)
  local sbytes = NCONV * (dtype == C.TIDE_BF16 and 2 or 1)
  C.tide_convert(dst.data, C.TIDE_F32, src.data, dtype, NCONV) -- warm up
  local dt = runs(function()
    local t0 = C.tide_time()
    local rc = C.tide_convert(dst.data, C.TIDE_F32, src.data, dtype, NCONV)
    assert(rc == 0, tide.last_error())
    return C.tide_time() - t0
  end)
  return sbytes / dt / 1e9, (sbytes + NCONV * 4) / dt / 1e9
end

local function with_threads(n, f)
  local old = tide.threads()
  tide.threads(n)
  local a, b = f()
  tide.threads(old)
  return a, b
end

local T = math.max(2, tide.threads())
local rows = {}
local function row(name, one, many, note)
  rows[#rows + 1] = string.format("| %s | %s | %s | %s |", name, one, many, note or "")
end

row("FFI call into tide (`tide_bench_noop`)", string.format("%.1f ns", with_threads(1, function()
  return runs(ffi_noop)
end)), "n/a", "JIT-compiled Lua loop, per call")
row("FFI call passing a tensor (`tide_tensor_numel`)", string.format("%.1f ns", with_threads(1, function()
  return runs(ffi_tensor)
end)), "n/a", "per call")
row("empty OpenMP parallel region", string.format("%.2f µs", with_threads(1, function() return runs(omp_region) end)),
  string.format("%.2f µs", with_threads(T, function() return runs(omp_region) end)), "per region")

local bw1, bwT = read_bw(1), read_bw(T)
row(string.format("read bandwidth (`tide_bench_read_bw`, %d MiB)", BW_BYTES / 1048576),
  string.format("%.1f GB/s", bw1), string.format("%.1f GB/s", bwT), "the limit the rows below are measured against")

local function conv_row(name, src, dtype, ref)
  local old = C.tide_kernels_force_ref(ref and 1 or 0)
  local s1, m1 = with_threads(1, function() return conversion(src, dtype) end)
  local sT, mT = with_threads(T, function() return conversion(src, dtype) end)
  C.tide_kernels_force_ref(old)
  local function cell(s, m, bw)
    return string.format("%.1f GB/s read, %.1f GB/s moved (%.0f%% of read bw)", s, m, 100 * m / bw)
  end
  row(name, cell(s1, m1, bw1), cell(sT, mT, bwT), string.format("%d Mi elements", NCONV / 1048576))
end
local simd = C.tide_kernels_avx2() == 1 and "AVX2" or "generic"
conv_row("bf16 -> f32 (" .. simd .. ")", src_bf16, C.TIDE_BF16, false)
conv_row("fp8 e4m3 -> f32 (" .. simd .. ")", src_fp8, C.TIDE_F8E4M3, false)
conv_row("bf16 -> f32 (scalar reference)", src_bf16, C.TIDE_BF16, true)
conv_row("fp8 e4m3 -> f32 (scalar reference)", src_fp8, C.TIDE_F8E4M3, true)

print(string.format("tide %s, %s, %s, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s; median of %d runs%s", tide.version,
  jit.version, tide.cpu(), os.getenv("OMP_WAIT_POLICY") or "(default)", os.getenv("GOMP_SPINCOUNT") or "(default)",
  RUNS, quick and " (--quick: small sizes, noisy)" or ""))
print("")
print(string.format("| measurement | 1 thread | %d threads | note |", T))
print("|---|---|---|---|")
for _, r in ipairs(rows) do print(r) end
print("")
print("\"moved\" counts the bytes read plus the bytes written (f32 output). Outputs beyond 32 MiB are written")
print("with non-temporal stores, so reads and writes together can exceed the read-only bandwidth.")
