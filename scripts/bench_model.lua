-- bench_model.lua: the whole model on the `bench` checkpoint (Flash's layer
-- shapes: d 4096, 64 heads, q_lora 1024, o_lora 1024 x 8 groups, experts of
-- 2048 MXFP4 with an FP8 shared expert; 4 layers [SWA, C4, C128, C4], 16
-- experts, a 32k vocabulary; ~2 GB, generated under build/models/bench if
-- missing). Reports, in one run:
--   prefill tokens/s of a 512-token prompt;
--   decode tokens/s at context 0, 4K and 32K, and as a fraction of the
--   bandwidth roofline: (weight + KV bytes the step actually reads) / (read
--   bandwidth measured in the same run);
--   the share of a decode step spent outside C (Lua wiring, FFI calls);
--   peak RSS against the checkpoint's size.
-- Contexts of 4K and 32K are made with tide_kvcache_seq_set_length (pages
-- allocated, contents zero): decode's work does not depend on the values
-- (every visible entry is scored, K are attended), so the timing is that of
-- a real context without prefilling 32K tokens first. --real-context
-- prefills them instead (slow).
-- --profile [B] instead times every C call of B-sequence decode steps
-- (default 1) and sums them per sub-layer (see profile below), with the
-- GFLOP/s of each product-bound sub-layer against the f32 FMA peak
-- (tide_bench_fma_peak) and the step against its floor, max(bytes read /
-- read bandwidth, multiply-adds / FMA peak), both measured in the same run.
--   tide scripts/bench_model.lua [--quick] [--real-context] [--model DIR] [--threads N] [--profile [B]]
local tide = require("tide")
local ffi = require("ffi")
local C = tide.C

local root = (arg and arg[0] and arg[0]:match("^(.*)/scripts/[^/]*$")) or "."
local opts = { quick = false, real = false, model = root .. "/build/models/bench", threads = nil, profile = nil }
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--quick" then opts.quick = true
  elseif a == "--real-context" then opts.real = true
  elseif a == "--model" then i = i + 1; opts.model = arg[i]
  elseif a == "--threads" then i = i + 1; opts.threads = tonumber(arg[i])
  elseif a == "--profile" then
    opts.profile = 1
    if tonumber(arg[i + 1]) then i = i + 1; opts.profile = tonumber(arg[i]) end
  else error("bench_model: unknown argument " .. a) end
  i = i + 1
end
if opts.threads then tide.threads(opts.threads) end

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end
if not exists(opts.model .. "/config.json") then
  io.stderr:write("bench_model: generating the bench checkpoint in " .. opts.model .. " (~2 GB, once)\n")
  local mk = assert(loadfile(root .. "/scripts/make_checkpoint.lua"))
  local saved = arg
  _G.arg = { [0] = "make_checkpoint.lua", "--preset", "bench", "--out", opts.model, "--quiet" }
  mk()
  _G.arg = saved
end

local function median(t)
  local s = {}
  for k, v in ipairs(t) do s[k] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

local function rss_kb(field)
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  for l in f:lines() do
    local v = l:match("^" .. field .. ":%s+(%d+)")
    if v then f:close() return tonumber(v) end
  end
  f:close()
  return 0
end

-- ---- --profile: where a decode step's time goes. A second instance of the
-- model is built through a proxy of the C library that times every call
-- (wall clock) and files it under a sub-layer: linear calls by the handle
-- or job array they run, the rest by function. The shared expert runs
-- inside tide_moe_forward; its share is estimated by timing its three
-- products alone at the same row count, rotating over the layers so they
-- come from DRAM as in a step. B sequences decode one token each per step.
local function profile(B)
  local tffi = require("tide.ffi")
  local realC = tffi.C
  local clock = realC.tide_time
  local acc, ncalls, by_handle = {}, {}, {}
  local function addr(p) return tostring(tonumber(ffi.cast("uintptr_t", p))) end
  local by_fn = {
    tide_attn_sparse = "sparse attention", tide_attn_q_prep = "sparse attention",
    tide_attn_kv_insert = "sparse attention", tide_attn_o_unrope = "sparse attention",
    tide_attn_compress = "compressors + indexer", tide_attn_compress_indexer = "compressors + indexer",
    tide_attn_indexer_q = "compressors + indexer", tide_attn_indexer_topk = "compressors + indexer",
    tide_hc_pre = "mHC (pre, post, head)", tide_hc_post = "mHC (pre, post, head)",
    tide_hc_head = "mHC (pre, post, head)",
    tide_rmsnorm = "RMSNorm", tide_route_topk = "MoE gate + routing", tide_route_hash = "MoE gate + routing",
    tide_moe_forward = "MoE experts (routed + shared)", tide_embed = "embedding",
  }
  local lin_fn = { tide_linear_forward_ex = true, tide_linear_forward_many = true, tide_linear_forward_grouped = true }
  local proxy = setmetatable({}, { __index = function(t, k)
    local f = realC[k]
    if type(f) ~= "cdata" then return f end
    local wf = function(a1, ...)
      local a = clock()
      local r = f(a1, ...)
      local dt = clock() - a
      local cat = by_fn[k] or (lin_fn[k] and by_handle[addr(a1)]) or ("other C (" .. k .. ")")
      acc[cat] = (acc[cat] or 0) + dt
      ncalls[cat] = (ncalls[cat] or 0) + 1
      return r
    end
    rawset(t, k, wf)
    return wf
  end })
  tffi.C = proxy
  package.loaded["tide.models.deepseek_v4"] = nil
  package.loaded["tide.model"] = nil
  local pm = assert(require("tide.model").load(opts.model, { max_tokens = math.max(16, B), tokenizer = false,
    cache = { context = 512, max_seqs = B + 1, seq_budget = B } }))
  tffi.C = realC
  local net, cfg = pm.net, pm.config
  by_handle[addr(net.head)] = "LM head"
  for L = 0, net.n_layers - 1 do
    local l = net.layers[L]
    for _, h in ipairs({ l.qkv.jobs, l.wq_b, l.wo_a, l.wo_b }) do by_handle[addr(h)] = "attention projections" end
    for _, h in ipairs({ l.comp and l.comp.jobs, l.icomp and l.icomp.jobs, l.i_wq_b, l.i_wproj }) do
      if h then by_handle[addr(h)] = "compressors + indexer" end
    end
    by_handle[addr(l.gate)] = "MoE gate + routing"
  end
  local V = cfg.vocab_size
  local seqs = {}
  for b = 1, B do seqs[b] = pm:sequence() end
  local function step(k)
    local e = {}
    for b = 1, B do e[b] = { seq = seqs[b], tokens = { (k * 131 + b * 17) % V } } end
    pm:step(e)
  end
  for k = 1, 3 do step(k) end
  -- the limits of this machine, measured now: f32 FMA throughput and read
  -- bandwidth with the threads the steps use
  local peak = realC.tide_bench_fma_peak(0.3, tide.threads())
  local bw = realC.tide_bench_read_bw(256 * 1048576, 3, tide.threads())
  for key in pairs(acc) do acc[key], ncalls[key] = 0, 0 end
  local nt = opts.quick and 8 or 24
  local st = ffi.new("tide_moe_stats")
  local routed_rows, expert_bytes = 0, 0
  local a = tide.time()
  for k = 1, nt do
    step(k + 3)
    for L = 0, net.n_layers - 1 do
      realC.tide_moe_stats_get(net.layers[L].moe, st)
      routed_rows, expert_bytes = routed_rows + tonumber(st.rows), expert_bytes + tonumber(st.weight_bytes)
    end
  end
  local total = tide.time() - a
  -- multiply-adds per step (2 flops each) and weight bytes read per step of
  -- the products; attention scores and the small ops are left out
  local nbox, kbox, fbox = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int[1]")
  local function macs(l)
    if not l then return 0 end
    assert(realC.tide_linear_info(l, nbox, kbox, fbox) == 0)
    return tonumber(nbox[0]) * tonumber(kbox[0])
  end
  local function wbytes(l) return l and tonumber(realC.tide_linear_weight_bytes(l)) or 0 end
  local flops, wread = {}, 0
  local function add(cat, l)
    flops[cat] = (flops[cat] or 0) + 2 * B * macs(l)
    wread = wread + wbytes(l)
  end
  for L = 0, net.n_layers - 1 do
    local l = net.layers[L]
    for _, h in ipairs({ l.wq_a, l.wkv, l.wq_b, l.wo_a, l.wo_b }) do add("attention projections", h) end
    for _, h in ipairs({ l.c_wkv, l.c_wgate, l.ic_wkv, l.ic_wgate }) do add("compressors + indexer", h) end
    wread = wread + wbytes(l.gate)
  end
  add("LM head", net.head)
  -- routed experts: rows x (w1, w3: hidden -> inter; w2: inter -> hidden)
  flops["MoE routed experts (+ gather, SwiGLU, combine)"] = 2 * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    * routed_rows / nt
  wread = wread + expert_bytes / nt -- routed (active) + shared, as the block counts them
  -- the shared expert alone: its three products at B rows, as in the block
  local sh = 0
  if cfg.n_shared_experts > 0 then
    local q = tide.quant
    local lins = {}
    for L = 0, net.n_layers - 1 do
      local P = "layers." .. L .. ".ffn.shared_experts."
      local function one(n)
        local s = pm.ck:has(P .. n .. ".scale") and pm.ck:tensor(P .. n .. ".scale") or nil
        return q.linear(pm.ck:tensor(P .. n .. ".weight"), s)
      end
      lins[L] = { one("w1"), one("w3"), one("w2") }
    end
    local si = lins[0][1].n
    local xd, xi = tide.randn({ B, cfg.hidden_size }, { seed = 3 }), tide.randn({ B, si }, { seed = 4 })
    local yg, yu, yd = tide.zeros(B, si), tide.zeros(B, si), tide.zeros(B, cfg.hidden_size)
    local reps = opts.quick and 4 or 8
    local t0 = tide.time()
    for _ = 1, reps do
      for L = 0, net.n_layers - 1 do
        q.forward_many({ { lins[L][1], xd, yg }, { lins[L][2], xd, yu } }, { round_bf16 = true })
        lins[L][3]:forward(xi, { out = yd, round_bf16 = true })
      end
    end
    sh = (tide.time() - t0) / reps
    for L = 0, net.n_layers - 1 do
      for _, h in ipairs(lins[L]) do
        flops["MoE shared expert (timed alone)"] = (flops["MoE shared expert (timed alone)"] or 0)
          + 2 * B * tonumber(h.n) * tonumber(h.k)
      end
    end
    for L = 0, net.n_layers - 1 do for _, h in ipairs(lins[L]) do h:close() end end
  end
  local rows, csum = {}, 0
  for k, v in pairs(acc) do
    csum = csum + v
    if ncalls[k] > 0 then rows[#rows + 1] = { k, v / nt } end
  end
  local moe = "MoE experts (routed + shared)"
  if acc[moe] and sh > 0 then
    local m = acc[moe] / nt
    for _, r in ipairs(rows) do
      if r[1] == moe then r[1], r[2] = "MoE routed experts (+ gather, SwiGLU, combine)", m - sh end
    end
    rows[#rows + 1] = { "MoE shared expert (timed alone)", sh }
  end
  rows[#rows + 1] = { "outside C (Lua wiring, FFI)", (total - csum) / nt }
  table.sort(rows, function(x, y) return x[2] > y[2] end)
  local step_ms = total / nt * 1e3
  print(string.format("decode profile: %d sequence(s) x 1 token per step, %d steps, %d threads: %.2f ms per step "
    .. "(%.1f tokens/s)", B, nt, tide.threads(), step_ms, B / (total / nt)))
  print("")
  print("| sub-layer | ms per step | share | GFLOP/s | of the FMA peak |")
  print("|---|---:|---:|---:|---:|")
  local fsum = 0
  for _, r in ipairs(rows) do
    local f = flops[r[1]]
    local rate = f and r[2] > 0 and f / r[2] / 1e9
    fsum = fsum + (f or 0)
    print(string.format("| %s | %.3f | %.1f%% | %s | %s |", r[1], r[2] * 1e3, 100 * r[2] * 1e3 / step_ms,
      rate and string.format("%.1f", rate) or "", rate and string.format("%.0f%%", 100 * rate / peak) or ""))
  end
  local t_flop, t_bytes = fsum / (peak * 1e9), wread / (bw * 1e9)
  print("")
  print(string.format("limits measured in this run with %d thread(s): f32 FMA peak %.1f GFLOP/s, read bandwidth "
    .. "%.1f GB/s", tide.threads(), peak, bw))
  print(string.format("the step's products: %.2f GFLOP (%.1f ms at the FMA peak), %.0f MB of weights (%.1f ms at the "
    .. "read bandwidth)", fsum / 1e9, t_flop * 1e3, wread / 1e6, t_bytes * 1e3))
  print(string.format("floor max(%.1f, %.1f) = %.1f ms per step (%.1f tokens/s): this step takes %.2fx its floor",
    t_flop * 1e3, t_bytes * 1e3, math.max(t_flop, t_bytes) * 1e3, B / math.max(t_flop, t_bytes),
    (total / nt) / math.max(t_flop, t_bytes)))
  if net.q8 then
    print("(the q8 policy's int8 products do not run on f32 FMAs: the FMA floor does not bind them)")
  end
  for b = 1, B do seqs[b]:free() end
  pm:close()
end

if opts.profile then
  profile(opts.profile)
  return
end

local contexts = opts.quick and { 0, 4096 } or { 0, 4096, 32768 }
local maxctx = contexts[#contexts] + 600
local t0 = tide.time()
local m = assert(tide.model(opts.model, { max_tokens = 512, tokenizer = false,
  cache = { context = maxctx, max_seqs = 3, seq_budget = 2 } }))
local cfg = m.config
local t_load = tide.time() - t0
local ckbytes = m.ck:summary().bytes

print(string.format("bench_model: %s, %d layers (ratios %s), d %d, %d experts (k %d), vocab %d, %.2f GB; "
  .. "%d threads; load %.2f s; q8 %s", opts.model, cfg.num_hidden_layers, table.concat(cfg.compress_ratios, ","),
  cfg.hidden_size, cfg.n_routed_experts,
  cfg.num_experts_per_tok, cfg.vocab_size, ckbytes / 1e9, tide.threads(), t_load, m.net.q8 or "off"))

local bw = C.tide_bench_read_bw(512 * 1024 * 1024, 5, tide.threads())
local fma_peak = C.tide_bench_fma_peak(0.5, tide.threads())
print(string.format("read bandwidth (%d threads, measured now): %.1f GB/s; f32 FMA peak: %.1f GFLOP/s", tide.threads(),
  bw, fma_peak))

local V = cfg.vocab_size
local function toks(n, seed)
  local t, x = {}, seed
  for k = 1, n do x = (x * 1103515245 + 12345) % 2147483648; t[k] = x % V end
  return t
end

-- ---- prefill: a 512-token prompt, fresh sequence each run
local pre = {}
for r = 1, opts.quick and 2 or 3 do
  local s = m:sequence()
  local a = tide.time()
  assert(m:prefill(s, toks(512, r)))
  pre[r] = 512 / (tide.time() - a)
  s:free()
end
local prefill_tps = median(pre)
-- a prompt token's products (2 flops per multiply-add): the attention and
-- compressor projections, the shared expert and its routed experts (the
-- head runs for the last token only; attention scores are left out)
local prefill_flops
do
  local nb, kb, fb = ffi.new("int64_t[1]"), ffi.new("int64_t[1]"), ffi.new("int[1]")
  local f = 0
  for L = 0, m.net.n_layers - 1 do
    local l = m.net.layers[L]
    for _, h in ipairs({ l.wq_a, l.wkv, l.wq_b, l.wo_a, l.wo_b, l.c_wkv, l.c_wgate, l.ic_wkv, l.ic_wgate }) do
      if h then
        assert(C.tide_linear_info(h, nb, kb, fb) == 0)
        f = f + 2 * tonumber(nb[0]) * tonumber(kb[0])
      end
    end
  end
  local ex = 2 * 3 * cfg.hidden_size * cfg.moe_intermediate_size
  prefill_flops = f + m.net.n_layers * ex * (cfg.num_experts_per_tok + (cfg.n_shared_experts or 0))
end

-- ---- bytes a decode step reads
local net = m.net
local function lin_bytes(l) return l and tonumber(C.tide_linear_weight_bytes(l)) or 0 end
local moe_stats = ffi.new("tide_moe_stats")
local function step_bytes(ctx, moe_bytes)
  local W, K = cfg.sliding_window, cfg.index_topk
  local w, kv = 0, 0
  local n = ctx + 1
  for L = 0, net.n_layers - 1 do
    local l = net.layers[L]
    w = w + lin_bytes(l.wq_a) + lin_bytes(l.wkv) + lin_bytes(l.wq_b) + lin_bytes(l.wo_a) + lin_bytes(l.wo_b)
      + lin_bytes(l.gate) + 2 * (2 + cfg.hc_mult) * cfg.hc_mult * cfg.hc_mult * cfg.hidden_size * 4
    kv = kv + math.min(W, n) * 584
    if l.ratio > 1 then w = w + lin_bytes(l.c_wkv) + lin_bytes(l.c_wgate) end
    if l.ratio == 4 then
      w = w + lin_bytes(l.ic_wkv) + lin_bytes(l.ic_wgate)
      local ne = math.floor(n / 4)
      if ne > K then
        w = w + lin_bytes(l.i_wq_b) + lin_bytes(l.i_wproj)
        kv = kv + ne * 132 + K * 584
      else
        kv = kv + ne * 584
      end
    elseif l.ratio == 128 then
      kv = kv + math.floor(n / 128) * 584
    end
  end
  w = w + moe_bytes + lin_bytes(net.head) + cfg.hidden_size * 2
  return w, kv
end

-- ---- decode at each context
local rows = {}
local outside, peak_main
for _, ctx in ipairs(contexts) do
  local s = m:sequence()
  if ctx > 0 then
    if opts.real then
      assert(m:prefill(s, toks(ctx, 7)))
    else
      local rc = C.tide_kvcache_seq_set_length(m.cache, s.id, ctx)
      assert(rc == 0, tide.last_error())
    end
  end
  local nt = opts.quick and 8 or 16
  local last = 1
  -- warm up (first touch of the experts this context picks)
  for k = 1, 3 do last = m:step({ { seq = s, tokens = { (last * 31 + k) % V } } })[1]:argmax() end
  local times, moe_b = {}, 0
  for k = 1, nt do
    local a = tide.time()
    local res = m:step({ { seq = s, tokens = { (last * 31 + k) % V } } })
    times[k] = tide.time() - a
    last = res[1]:argmax()
    for L = 0, net.n_layers - 1 do
      C.tide_moe_stats_get(net.layers[L].moe, moe_stats)
      moe_b = moe_b + tonumber(moe_stats.weight_bytes)
    end
  end
  local dt = median(times)
  local wb, kvb = step_bytes(ctx, moe_b / nt)
  rows[#rows + 1] = { ctx = ctx, tps = 1 / dt, ms = dt * 1e3, wb = wb, kvb = kvb,
    roof = (wb + kvb) / (bw * 1e9) / dt }
  if ctx == contexts[#contexts] then peak_main = rss_kb("VmHWM") * 1024 end
  s:free()
end

local peak = peak_main or rss_kb("VmHWM") * 1024
m:close()
collectgarbage()
-- Time outside C: the same decode steps with every C call timed, on a
-- second instance of the model built through a timing proxy of the C
-- library (an upper bound: the wrapper's own cost counts as outside).
do
  local nt = opts.quick and 8 or 16
  -- time outside C: the same steps with every C call timed (an upper bound:
  -- the timing wrapper's own cost counts as outside)
  local tffi = require("tide.ffi")
  local realC = tffi.C
  local sum = 0
  local clock = realC.tide_time
  local proxy = setmetatable({}, { __index = function(t, k)
    local f = realC[k]
    if type(f) ~= "cdata" then return f end
    local wf = function(...)
      local a = clock()
      local r = f(...)
      sum = sum + (clock() - a)
      return r
    end
    rawset(t, k, wf)
    return wf
  end })
  tffi.C = proxy
  package.loaded["tide.models.deepseek_v4"] = nil
  package.loaded["tide.model"] = nil
  local pm = assert(require("tide.model").load(opts.model, { max_tokens = 16, tokenizer = false,
    cache = { context = 256, max_seqs = 2, seq_budget = 1 } }))
  tffi.C = realC
  local ps = pm:sequence()
  pm:step({ { seq = ps, tokens = { 1 } } })
  for k = 1, 3 do pm:step({ { seq = ps, tokens = { k } } }) end
  sum = 0
  local a = tide.time()
  for k = 1, nt do pm:step({ { seq = ps, tokens = { (k * 17) % V } } }) end
  local total = tide.time() - a
  outside = (total - sum) / total
  pm:close()
end

print()
print("| measurement | value | note |")
print("|---|---:|---|")
print(string.format("| prefill, 512-token prompt | %.1f tokens/s | median of %d, steps of 512 tokens; %.2f GFLOP of "
  .. "products per token, %.0f%% of the f32 FMA peak (%.1f tokens/s at the peak) |", prefill_tps, #pre,
  prefill_flops / 1e9, 100 * prefill_tps * prefill_flops / (fma_peak * 1e9), fma_peak * 1e9 / prefill_flops))
for _, r in ipairs(rows) do
  print(string.format("| decode at context %s | %.2f tokens/s (%.1f ms) | reads %.0f MB weights + %.2f MB KV "
    .. "per token; %.0f%% of the bandwidth roofline |", r.ctx >= 1024 and (math.floor(r.ctx / 1024) .. "K")
    or tostring(r.ctx), r.tps, r.ms, r.wb / 1e6, r.kvb / 1e6, r.roof * 100))
end
print(string.format("| decode time outside C kernels | %.2f%% | upper bound: includes the timing wrapper's own cost |",
  outside * 100))
print(string.format("| peak RSS | %.2f GB | checkpoint %.2f GB (weights mmap'd, in RSS once touched), plus caches "
  .. "and buffers |", peak / 1e9, ckbytes / 1e9))
