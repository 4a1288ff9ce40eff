-- scripts/bench_ops.lua: what the model-level kernels cost (tide.ops), with
-- Flash shapes (d = 4096, hc = 4, E = 256 scores, k = 6), against the read
-- bandwidth measured in the same run:
--   * RMSNorm, mHC pre / post / head, routing, SwiGLU: microseconds per token
--     at T = 1 and T = 64; hc_pre at T = 1 also with 86 distinct fn tensors
--     in turn (129 MiB, beyond the caches, as in a decode step of Flash);
--   * the MoE block: 16 experts of 2048 x 4096 MXFP4 + an FP8 shared expert,
--     k = 6, at T = 1 and T = 64, with the linear kernels of this build, split
--     into the products (the linear layers' time) and the block's own work
--     (grouping, gathering, SwiGLU, combining); the same block with f32
--     experts, whose products go to oneDNN, shows the block at a bandwidth-
--     bound product speed.
-- Medians of several runs. Usage: tide scripts/bench_ops.lua [--quick] [--full] [--no-moe]
--   --quick: fewer runs, no MXFP4 T = 64 step; --full: 3 runs of that step;
--   --no-moe: the per-token kernels only.
local tide = require("tide")
local ops = tide.ops
local C = tide.C

local quick, full, no_moe = false, false, false
for i = 1, #arg do
  if arg[i] == "--quick" then quick = true end
  if arg[i] == "--full" then full = true end
  if arg[i] == "--no-moe" then no_moe = true end
end
local RUNS = quick and 3 or 7

local function median(xs)
  table.sort(xs)
  local n = #xs
  if n % 2 == 1 then return xs[(n + 1) / 2] end
  return (xs[n / 2] + xs[n / 2 + 1]) / 2
end

-- seconds per call of f(): the median and the best of `runs` runs of `reps`
-- calls each (on a shared machine the best shows what the code can do)
local function timeit(f, reps, runs)
  f()
  local xs = {}
  for r = 1, runs or RUNS do
    local t0 = C.tide_time()
    for _ = 1, reps do f() end
    xs[r] = (C.tide_time() - t0) / reps
  end
  local m = median(xs)
  return m, xs[1]
end

local threads = tide.threads()
local BW = 256 * 1024 * 1024
local bw = median({ C.tide_bench_read_bw(BW, 1, threads), C.tide_bench_read_bw(BW, 1, threads),
  C.tide_bench_read_bw(BW, 1, threads) })
print(("threads %d, read bandwidth %.1f GB/s, kernels %s"):format(threads, bw,
  C.tide_kernels_avx2() == 1 and "avx2" or "reference"))

local d, hc, E, k, inter = 4096, 4, 256, 6, 2048
local NSITES = 86 -- mHC sites of Flash (43 layers x 2): 129 MiB of fn, beyond the caches
local mix = (2 + hc) * hc
local rows = {}
local function row(name, T, sec, best, note)
  rows[#rows + 1] = ("| %s | %d | %.2f | %.2f | %s |"):format(name, T, sec / T * 1e6, best / T * 1e6, note or "")
end

for _, T in ipairs({ 1, 64 }) do
  local reps = T == 1 and 200 or 10
  local x = tide.randn({ T, d }, { seed = 1 }):to("bf16"):to("f32")
  local y = tide.zeros(T, d)
  local w = tide.randn({ d }, { seed = 2, dtype = "bf16" })
  local t, b = timeit(function() ops.rmsnorm(y, x, w, 1e-6) end, reps)
  row("rmsnorm (bf16 weight)", T, t, b)
  local X = tide.randn({ T, hc, d }, { seed = 3 }):to("bf16"):to("f32")
  local fn = tide.randn({ mix, hc * d }, { seed = 4, std = 0.01 })
  local scale, base = tide.tensor({ 1, 1, 1 }), tide.randn({ mix }, { seed = 5, std = 0.5 })
  local post, comb = tide.zeros(T, hc), tide.zeros(T, hc, hc)
  local cfg = ops.hc_cfg({ iters = 20 })
  local t_pre, b_pre = timeit(function() ops.hc_pre(y, post, comb, X, fn, scale, base, cfg) end, reps)
  row("hc_pre (fn cached)", T, t_pre, b_pre, ("fn %.1f MiB; %.1f GFLOP/s (best %.1f)"):format(mix * hc * d * 4 / 2 ^ 20,
    2 * mix * hc * d * T / t_pre / 1e9, 2 * mix * hc * d * T / b_pre / 1e9))
  if T == 1 then
    local fns = {}
    for i = 1, NSITES do fns[i] = tide.randn({ mix, hc * d }, { seed = 100 + i, std = 0.01 }) end
    local j = 0
    local tr, br = timeit(function()
      j = j % NSITES + 1
      ops.hc_pre(y, post, comb, X, fns[j], scale, base, cfg)
    end, NSITES)
    row("hc_pre (86 fn in turn)", T, tr, br, ("%.1f GB/s of fn = %.0f%% of read bandwidth (best %.0f%%)"):format(
      mix * hc * d * 4 / tr / 1e9, mix * hc * d * 4 / tr / 1e9 / bw * 100, mix * hc * d * 4 / br / 1e9 / bw * 100))
    fns = nil -- luacheck: ignore
    collectgarbage("collect")
  end
  local Xo = tide.zeros(T, hc, d)
  row("hc_post", T, timeit(function() ops.hc_post(Xo, y, X, post, comb) end, reps))
  local hfn, hbase, hs = tide.randn({ hc, hc * d }, { seed = 6, std = 0.01 }), tide.randn({ hc }, { seed = 7 }),
    tide.tensor({ 1 })
  row("hc_head", T, timeit(function() ops.hc_head(y, X, hfn, hs, hbase, cfg) end, reps))
  local logits = tide.randn({ T, E }, { seed = 8 })
  local bias = tide.randn({ E }, { seed = 9, std = 0.1 })
  local ids, wts = ops.route_topk(k, nil, logits, bias)
  local rcfg = ops.route_cfg({ routed_scale = 1.5 })
  row("route_topk (E 256, k 6)", T, timeit(function() ops.route_topk(ids, wts, logits, bias, rcfg) end, reps))
  local gu = tide.randn({ T * (k + 1), 2 * inter }, { seed = 10, std = 3 })
  local g, u = gu:narrow(1, 0, inter), gu:narrow(1, inter, inter)
  local h = tide.zeros(T * (k + 1), inter)
  row("swiglu (7 x 2048 per token)", T, timeit(function() ops.swiglu(h, g, u, 10) end, reps))
end

print()
print("| kernel | T | µs per token (median) | best | note |")
print("|---|---|---|---|---|")
for _, r in ipairs(rows) do print(r) end

if no_moe then return end

-- ---- the MoE block ----
local NE = 16
local function make_moe(fmt)
  local moe = ops.moe(NE, d, inter, 10)
  local function weight(n, kk, seed)
    if fmt == "f32" then return tide.randn({ n, kk }, { seed = seed, std = 0.02 }), nil end
    local wq = tide.zeros({ n, kk / 2 }, "i8")
    C.tide_tensor_rand(wq, seed, C.TIDE_RAND_UNIFORM, -128, 128)
    return wq, tide.full({ n, kk / 32 }, 2 ^ -6, "e8m0")
  end
  for e = 0, NE - 1 do
    local w1, s1 = weight(inter, d, 10 * e + 1)
    local w2, s2 = weight(d, inter, 10 * e + 2)
    local w3, s3 = weight(inter, d, 10 * e + 3)
    moe:set_expert(e, w1, s1, w2, s2, w3, s3)
  end
  local function shared(n, kk, seed)
    if fmt == "f32" then return tide.randn({ n, kk }, { seed = seed, std = 0.02 }), nil end
    return tide.randn({ n, kk }, { seed = seed, std = 0.5, dtype = "f8e4m3" }),
      tide.full({ math.ceil(n / 128), math.ceil(kk / 128) }, 2 ^ -4, "e8m0")
  end
  local a, as = shared(inter, d, 1)
  local b, bs = shared(d, inter, 2)
  local c, cs = shared(inter, d, 3)
  moe:set_shared(a, as, b, bs, c, cs)
  collectgarbage("collect")
  return moe
end

local function moe_step(moe, T, runs)
  local x = tide.randn({ T, d }, { seed = 11 }):to("bf16"):to("f32")
  local out = tide.zeros(T, d)
  local logits = tide.randn({ T, NE }, { seed = 12 })
  local ids, wts = ops.route_topk(k, nil, logits, nil, ops.route_cfg({ routed_scale = 1.5 }))
  moe:forward(out, x, ids, wts) -- warm up: scratch, pages
  local all = {}
  for r = 1, runs do
    moe:forward(out, x, ids, wts)
    all[r] = moe:stats()
  end
  table.sort(all, function(p, q) return p.t_total < q.t_total end)
  return all[math.floor((#all + 1) / 2)]
end

print()
print("| MoE block (16 x 2048x4096, k 6, + shared) | T | step ms | products ms |"
  .. " block's own µs (gather, act, combine) | weights read | GB/s | of read bw |")
print("|---|---|---|---|---|---|---|---|")
local function moe_row(name, T, s)
  local prod = s.t_up + s.t_down
  local own = s.t_total - prod
  print(("| %s | %d | %.1f | %.1f | %.0f (%.0f, %.0f, %.0f) | %.0f MB (%d experts + shared) | %.1f | %.0f%% |"):format(
    name, T, s.t_total * 1e3, prod * 1e3, own * 1e6, s.t_gather * 1e6, s.t_act * 1e6, s.t_combine * 1e6,
    s.weight_bytes / 1e6, s.n_active, s.weight_bytes / s.t_total / 1e9, s.weight_bytes / s.t_total / 1e9 / bw * 100))
end

do
  local moe = make_moe("mxfp4")
  moe_row("MXFP4 + FP8 shared", 1, moe_step(moe, 1, quick and 1 or 3))
  if not quick then moe_row("MXFP4 + FP8 shared", 64, moe_step(moe, 64, full and 3 or 1)) end
  moe:close()
  collectgarbage("collect")
end
do
  local moe = make_moe("f32")
  moe_row("f32 experts (oneDNN products)", 1, moe_step(moe, 1, quick and 3 or 5))
  moe_row("f32 experts (oneDNN products)", 64, moe_step(moe, 64, quick and 3 or 5))
  moe:close()
  collectgarbage("collect")
end
