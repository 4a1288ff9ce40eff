-- scripts/bench_attn.lua: DeepSeek-V4 sparse attention on this machine,
-- against the limits measured in the same run (read bandwidth) and a
-- straightforward dense implementation of the same math.
--   * decode, one Flash-shaped C4 layer (64 heads x 512, window 128, 512
--     selected compressed entries) with simulated caches at context 4K, 64K
--     and 1M: time per token of the sparse attention kernel, KV bytes read,
--     GB/s; the lightning indexer's scoring + top-k over n/4 entries (132 B
--     each): time, GB/s, GFLOP/s; the same attention done densely (keys
--     gathered to f32, scores and P.V through tide.linear, softmax op);
--   * prefill: a 4096-token chunk (as 4 x 1024-token steps) through one C4
--     layer's attention kernels, tokens/s and GFLOP/s of the sparse kernel.
-- Medians of several runs. Usage: tide scripts/bench_attn.lua [--quick] [--threads N]
local tide = require("tide")
local attn = tide.attn
local ffi, C = tide.ffi.ffi, tide.C

local quick = false
for i = 1, #arg do
  if arg[i] == "--quick" then quick = true end
  if arg[i] == "--threads" then tide.threads(tonumber(arg[i + 1])) end
end
local RUNS = quick and 3 or 7
local H, W, K, NI = 64, 128, 512, 64

local function median(xs)
  table.sort(xs)
  local n = #xs
  if n % 2 == 1 then return xs[(n + 1) / 2] end
  return (xs[n / 2] + xs[n / 2 + 1]) / 2
end
local function timeit(f, reps)
  reps = reps or 1
  f() -- warm
  local xs = {}
  for r = 1, RUNS do
    local t0 = C.tide_time()
    for _ = 1, reps do f() end
    xs[r] = (C.tide_time() - t0) / reps
  end
  return median(xs)
end

local threads = tide.threads()
local bw = C.tide_bench_read_bw(quick and 128 * 2 ^ 20 or 512 * 2 ^ 20, 3, threads)

-- realistic stored bytes: fp8 codes of |x| < 8 (no NaN), scales 2^-4, bf16 rope dims
local function fill_pages(cache, layer, kind, rows_per_page, row_data, row_extra)
  local v = cache:view(layer, kind)
  local pages, stride = tonumber(v.sizes[0]), tonumber(v.sizes[1])
  local one = ffi.new("uint8_t[?]", stride)
  local seed = 12345
  local function rnd()
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed
  end
  for e = 0, rows_per_page - 1 do
    local d = one + e * row_data
    for i = 0, row_data - 1 do d[i] = bit.band(rnd(), 0xD7) end -- exponent < 11, no 0x7F
    if kind == "swa" or kind == "main" then
      for i = 448, 575, 2 do d[i] = 0; d[i + 1] = 0x3F end -- bf16 ~0.5
      local s = one + rows_per_page * row_data + e * row_extra
      for t = 0, 6 do s[t] = 127 - 4 end
      s[7] = 0
    else
      local s = ffi.cast("float*", one + rows_per_page * row_data + e * row_extra)
      s[0] = 1 / 64
    end
  end
  local base = ffi.cast("uint8_t*", v.data)
  for p = 0, pages - 1 do ffi.copy(base + p * stride, one, stride) end
end


-- ---- decode at several contexts ----
local contexts = quick and { 4096, 65536 } or { 4096, 65536, 1048576 }
local results = {}
for _, n in ipairs(contexts) do
  local pages = math.floor(n / 256) + 2
  local cache = attn.cache({ ratios = { 4 }, swa_blocks = 4, pages = pages, max_seqs = 1 })
  fill_pages(cache, 0, "swa", 64, 576, 8)
  fill_pages(cache, 0, "main", 64, 576, 8)
  fill_pages(cache, 0, "index", 64, 128, 4)
  local s = cache:seq_new()
  assert(cache:set_length(s, n))
  local b = attn.batch(1)
  b:add(s, n, 1)
  assert(cache:prepare(b))
  local q = tide.randn({ 1, H, 512 }, { seed = 1 })
  local rope = attn.rope({ theta = 160000, yarn = { factor = 16, original_max = 65536 } })
  attn.q_prep(q, b, rope)
  local out = tide.zeros(1, H, 512)
  local sink = tide.zeros(H)
  -- 512 distinct entries spread over the visible ones
  local nvis = math.floor((n + 1) / 4)
  local topk = tide.zeros({ 1, K }, "i32")
  local tp = ffi.cast("int32_t*", topk.data)
  for i = 0, K - 1 do tp[i] = math.floor(i * (nvis - 1) / (K - 1)) end
  local t_attn = timeit(function() attn.sparse(out, q, cache, 0, b, topk, sink) end, 20)
  local kv_bytes = (W + K) * 584
  -- indexer: q8 from a random query, scores over n/4 entries + top-512
  local qi, wr = tide.randn({ 1, NI, 128 }, { seed = 2 }), tide.rand({ 1, NI }, { seed = 3 })
  local q8, w = tide.zeros({ 1, NI, 128 }, "u8"), tide.zeros(1, NI)
  attn.indexer_q(q8, w, qi, wr, b, rope)
  local tk = tide.zeros({ 1, K }, "i32")
  local reps = n >= 1048576 and 1 or n >= 65536 and 3 or 20
  local t_idx = timeit(function() attn.indexer_topk(cache, 0, q8, w, b, tk) end, reps)
  local idx_bytes = nvis * 132
  local idx_flops = nvis * NI * 128 * 2
  -- dense comparison of the same attention: gathered f32 keys, two GEMMs
  local t_dense
  if n == contexts[1] then
    local nk = W + K
    local keys = tide.randn({ nk, 512 }, { seed = 4 }):to("bf16"):to("f32")
    local keys_t = keys:t():contiguous()
    local q2 = q:reshape(H, 512)
    t_dense = timeit(function()
      local sc = tide.linear(q2, keys):scale(1 / math.sqrt(512))
      local p = sc:softmax()
      local o = tide.linear(p, keys_t)
      return o
    end, 5)
  end
  results[#results + 1] = { n = n, t_attn = t_attn, kv = kv_bytes, t_idx = t_idx, ib = idx_bytes, if_ = idx_flops,
    t_dense = t_dense }
  cache:abort(b)
  cache:close()
  collectgarbage("collect")
end

print(("threads %d, read bandwidth %.1f GB/s (measured now), kernels: %s"):format(threads, bw,
  tide.C.tide_kernels_avx2() == 1 and "avx2" or "reference"))
print("")
print("| context | sparse attention µs/token | KV bytes/token | GB/s (% of bw) | attn GFLOP/s"
  .. " | indexer ms/token | indexer MB read | indexer GB/s (% of bw) | indexer GFLOP/s |")
print("|---|---|---|---|---|---|---|---|---|")
for _, r in ipairs(results) do
  local gbs = r.kv / r.t_attn / 1e9
  local flops = 4 * H * 512 * (W + K)
  print(("| %d | %.0f | %d | %.2f (%.1f%%) | %.1f | %.2f | %.1f | %.2f (%.1f%%) | %.1f |"):format(r.n, r.t_attn * 1e6,
    r.kv, gbs, 100 * gbs / bw, flops / r.t_attn / 1e9, r.t_idx * 1e3, r.ib / 1e6, r.ib / r.t_idx / 1e9,
    100 * r.ib / r.t_idx / 1e9 / bw, r.if_ / r.t_idx / 1e9))
end
local r1, rn = results[1], results[#results]
print("")
print(("sparse attention %dK -> %dK: x%.2f (must stay <= 1.2)"):format(math.floor(r1.n / 1024),
  math.floor(rn.n / 1024), rn.t_attn / r1.t_attn))
if r1.t_dense then
  print(("dense implementation of the same math (f32 keys, tide.linear + softmax): %.0f µs/token,"
    .. " x%.1f the sparse kernel"):format(r1.t_dense * 1e6, r1.t_dense / r1.t_attn))
end

-- ---- prefill: a 4096-token chunk through one C4 layer ----
do
  local T, CH = quick and 1024 or 4096, 1024
  local cache = attn.cache({ ratios = { 4 }, swa_blocks = math.floor(T / 64) + 2, pages = math.floor(T / 256) + 2,
    max_seqs = 1, keep_swa_history = true })
  local rope = attn.rope({ theta = 160000, yarn = { factor = 16, original_max = 65536 } })
  local s = cache:seq_new()
  local b = attn.batch(CH)
  local q, out = tide.zeros(CH, H, 512), tide.zeros(CH, H, 512)
  local kv, kvs, ikvs = tide.zeros(CH, 512), tide.zeros(CH, 2048), tide.zeros(CH, 512)
  local qi, wr = tide.zeros(CH, NI, 128), tide.zeros(CH, NI)
  local q8, w, topk = tide.zeros({ CH, NI, 128 }, "u8"), tide.zeros(CH, NI), tide.zeros({ CH, K }, "i32")
  local ape, iape = tide.randn({ 4, 1024 }, { seed = 5 }), tide.randn({ 4, 256 }, { seed = 6 })
  local norm, inorm, sink = tide.ones(512), tide.ones(128), tide.zeros(H)
  local t_sparse, t_all, flops = 0, 0, 0
  for c0 = 0, T - 1, CH do
    b:clear():add(s, c0, CH)
    assert(cache:prepare(b))
    q:normal(c0 + 1, 0, 1); kv:normal(c0 + 2, 0, 1); kvs:normal(c0 + 3, 0, 1); ikvs:normal(c0 + 4, 0, 1)
    qi:normal(c0 + 5, 0, 1); wr:uniform(c0 + 6, 0, 1)
    local t0 = C.tide_time()
    attn.q_prep(q, b, rope)
    attn.kv_insert(cache, 0, kv, b, rope)
    attn.indexer_q(q8, w, qi, wr, b, rope)
    attn.compress_indexer(cache, 0, ikvs, iape, inorm, b, rope)
    attn.compress(cache, 0, kvs, ape, norm, b, rope)
    attn.indexer_topk(cache, 0, q8, w, b, topk)
    local t1 = C.tide_time()
    attn.sparse(out, q, cache, 0, b, topk, sink)
    local t2 = C.tide_time()
    attn.o_unrope(out, out, b, rope)
    local t3 = C.tide_time()
    t_sparse = t_sparse + (t2 - t1)
    t_all = t_all + (t3 - t0)
    for p = c0, c0 + CH - 1 do
      local nk = math.min(p + 1, W) + math.min(math.floor((p + 1) / 4), K)
      flops = flops + 4 * H * 512 * nk
    end
    cache:commit(b)
  end
  print("")
  print(("prefill of a %d-token chunk (steps of %d), one C4 layer, 64 heads: sparse attention %.0f tokens/s"
    .. " (%.1f GFLOP/s); all attention kernels of the layer %.0f tokens/s"):format(T, CH, T / t_sparse,
    flops / t_sparse / 1e9, T / t_all))
end
