-- tide.models.deepseek_v4: the DeepSeek-V4 forward pass, wired in Lua.
--
-- Read it top to bottom: `Net:forward` is the model (doc deepseek-v4.md 2.0),
-- `Net:attention` one attention sub-layer (2.2, in vLLM's CPU call order
-- 2.2.8), `Net:moe` one MoE sub-layer (2.3). Every heavy step is one C call
-- (linear kernels, tide.attn kernels over the paged cache, tide.ops kernels);
-- Lua only decides what runs in which order, per layer and per step, never
-- per element. Edit a layer's wiring by replacing `net.attention` /
-- `net.moe` (or one layer's `layer.attention`) with your own function of the
-- same signature.
--
-- Activations are f32 tensors holding bf16-valued numbers; every rounding
-- point of vLLM's CPU path (doc 6.21) is a flag of the kernel that produces
-- the value. Buffers are allocated once for `max_tokens` tokens per step and
-- narrowed per step: a step allocates nothing in C.
local tide = require("tide")
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}
local Net = {}
Net.__index = Net
M.Net = Net

local ROUND_LIN = 1          -- TIDE_LINEAR_ROUND_BF16
local ROUND_OPS = 1          -- TIDE_OPS_ROUND_BF16

local linbox = ffi.typeof("tide_linear*[1]")
local jobs2 = ffi.typeof("tide_linear_job[2]")

-- ---------------------------------------------------------------- probe points
-- The named points of this forward a probe (tide.probe) can attach to, in
-- the order a step passes them. Per point: per layer or not, writable or
-- read-only (the probe gets a copy), and the rows it sees (n = the entry's
-- tokens; d hidden size, hc residual streams, H heads, k routed experts).
M.POINTS = {
  embed       = { layered = false, write = true,  rows = "f32 [n, hc, d] the embedding in every stream" },
  attn_in     = { layered = true,  write = true,  rows = "f32 [n, d] attention input (after hc_pre, norm)" },
  attn_q      = { layered = true,  write = false, rows = "f32 [n, H, 512] queries (normed, RoPE'd)" },
  attn_shares = { layered = true,  write = false, rows = "f32 [n, H, 4] window, compressed, sink mass; lse" },
  attn_topk   = { layered = true,  write = false, rows = "i32 [n, K] selected C4 entries (-1 pads) or false;"
    .. " info.scores f32 [n, S] indexer scores" },
  attn_heads  = { layered = true,  write = true,  rows = "f32 [n, H, 512] per-head output before wo_a" },
  attn_out    = { layered = true,  write = true,  rows = "f32 [n, d] attention output (before hc_post)" },
  resid_attn  = { layered = true,  write = true,  rows = "f32 [n, hc, d] residual streams after attention" },
  moe_in      = { layered = true,  write = true,  rows = "f32 [n, d] MoE input (after hc_pre, norm)" },
  moe_routes  = { layered = true,  write = false, rows = "i32 [n, k] routed experts; info.weights f32 [n, k]" },
  moe_weights = { layered = true,  write = true,  rows = "f32 [n, k] routing weights; info.experts i32 [n, k]" },
  moe_out     = { layered = true,  write = true,  rows = "f32 [n, d] MoE output (before hc_post)" },
  resid_moe   = { layered = true,  write = true,  rows = "f32 [n, hc, d] residual streams after the MoE" },
  final       = { layered = false, write = true,  rows = "f32 [n, d] final hidden state (the head's input)" },
  logits      = { layered = false, write = true,  rows = "f32 [r, vocab] the logits rows the entry asked for" },
}
Net.points = M.POINTS

-- ---------------------------------------------------------------- config
local SCORING = { sqrtsoftplus = 0, sigmoid = 1, softmax = 2 }

-- Derived config fields the wiring and the cache use: per-layer ratios
-- (0-based, 1/4/128) and the scoring function's id. true, or nil, err.
function M.configure(cfg)
  local ratios = {}
  local cr = cfg.compress_ratios or {}
  for L = 0, (cfg.num_hidden_layers or 0) - 1 do
    local r = cr[L + 1] or 0
    ratios[L] = r <= 1 and 1 or r
  end
  cfg.ratios = ratios
  cfg.scoring_id = SCORING[cfg.scoring_func or "sqrtsoftplus"]
  if cfg.scoring_id == nil then return nil, "unsupported scoring_func '" .. tostring(cfg.scoring_func) .. "'" end
  return true
end

-- ---------------------------------------------------------------- weights
-- A linear handle over checkpoint tensor `name`.weight (+ .scale for FP8 and
-- MXFP4). Zero copy: the handle references the mmap'd tensors.
local function linear(ck, name)
  local w = ck:tensor(name .. ".weight")
  local s = ck:has(name .. ".scale") and ck:tensor(name .. ".scale") or nil
  local box = linbox()
  check(C.tide_linear_new(box, w, s), 3)
  return ffi.gc(box[0], C.tide_linear_free)
end

local function vec(ck, name) return ck:tensor(name) end

-- Two products on the same input x run as one call (one parallel region):
-- fused wq_a|wkv, compressor wkv|wgate. y1/y2 are the outputs (the same
-- buffer at two column offsets for the compressor's [kv | score] rows). The
-- job array is built once over the persistent buffers; a step only sets the
-- row count.
local function fused_pair(l1, l2, x, y1, off1, y2, off2)
  local j = jobs2()
  local ys = { [0] = { y1, off1 }, { y2, off2 } }
  for i = 0, 1 do
    j[i].l = i == 0 and l1 or l2
    j[i].x = ffi.cast("float*", x.data)
    j[i].ldx = tonumber(x.strides[0])
    j[i].y = ffi.cast("float*", ys[i][1].data) + ys[i][2]
    j[i].ldy = tonumber(ys[i][1].strides[0])
    j[i].m = 0
  end
  return { jobs = j, keep = { l1, l2, x, y1, y2 } }
end

local function run_pair(p, T, flags)
  p.jobs[0].m = T
  p.jobs[1].m = T
  check(C.tide_linear_forward_many(p.jobs, 2, flags), 3)
end

-- ---------------------------------------------------------------- construction
local function rope_for(cfg, compressed)
  local rc = ffi.new("tide_rope_config")
  rc.theta = compressed and cfg.compress_rope_theta or cfg.rope_theta
  rc.dim = 64
  if compressed and cfg.rope_scaling then
    rc.yarn = 1
    rc.yarn_factor = cfg.rope_factor
    rc.yarn_original_max = cfg.rope_original_max_position_embeddings
    rc.yarn_beta_fast = cfg.rope_beta_fast
    rc.yarn_beta_slow = cfg.rope_beta_slow
  end
  local box = ffi.new("tide_rope*[1]")
  check(C.tide_rope_new(box, rc), 3)
  return ffi.gc(box[0], C.tide_rope_free)
end

-- Opt-in int8 paths (docs/linear.md "int8 activations"): opts.q8, or when
-- it is nil TIDE_Q8 in the environment, is "off" (the default: the exact
-- invariant kernels), "experts", "dense" or "all":
--   experts  the routed experts (MXFP4): x rounded to int8 per 32 columns,
--            integer products with the e2m1 codes;
--   dense    the attention projections (wq_a, wkv, wq_b, wo_a, wo_b) and the
--            shared expert: an int8 copy of each weight made at load (per 64
--            columns), int8 x int8 products;
--   all      both, and the LM head the same way as dense.
-- The router gate, the compressors, the indexer and the MTP projections stay
-- exact.
-- Returns the linear policies of the routed experts and of the dense part.
local Q8_MODES = { off = { 0, 0 }, experts = { 2, 0 }, dense = { 0, 2 }, all = { 2, 2 } }
function M.q8_policies(opts)
  local v = opts and opts.q8
  if v == nil then v = os.getenv("TIDE_Q8") end
  if v == nil or v == "" or v == false then v = "off" end
  local p = Q8_MODES[v]
  if not p then error("tide.model: q8 = '" .. tostring(v) .. "' (expected off, experts, dense or all)", 0) end
  return p[1], p[2], v
end

-- own (expert parallelism, tide.mpi): nil for every expert and the shared
-- one, else a set { [e] = true, shared = bool } of what this process holds.
-- policy, spolicy: the linear policies of the routed and the shared experts.
local function moe_block(ck, cfg, P, own, policy, spolicy)
  local box = ffi.new("tide_moe*[1]")
  -- swiglu_limit <= 0 means no clamp (DeepSeek's reference); the block takes INFINITY for that
  local lim = cfg.swiglu_limit > 0 and cfg.swiglu_limit or math.huge
  check(C.tide_moe_new(box, cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size, lim), 3)
  local m = ffi.gc(box[0], C.tide_moe_free)
  local function ws(pre)
    local function one(n)
      local w = ck:tensor(pre .. n .. ".weight")
      local s = ck:has(pre .. n .. ".scale") and ck:tensor(pre .. n .. ".scale") or nil
      return w, s
    end
    local w1, s1 = one("w1")
    local w2, s2 = one("w2")
    local w3, s3 = one("w3")
    return w1, s1, w2, s2, w3, s3
  end
  for e = 0, cfg.n_routed_experts - 1 do
    if not own or own[e] then check(C.tide_moe_set_expert(m, e, ws(P .. "ffn.experts." .. e .. ".")), 3) end
  end
  if cfg.n_shared_experts > 0 and (not own or own.shared) then
    check(C.tide_moe_set_shared(m, ws(P .. "ffn.shared_experts.")), 3)
  end
  if (policy or 0) ~= 0 or (spolicy or 0) ~= 0 then check(C.tide_moe_set_policy(m, policy or 0, spolicy or 0), 3) end
  return m
end
M.moe_block = moe_block

-- Buffers for up to T tokens per step (f32 unless said).
local function buffers(cfg, T)
  local d, hc, H, D = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads, 512
  local has4, has128 = false, false
  for L = 0, cfg.num_hidden_layers - 1 do
    local r = cfg.ratios[L]
    has4 = has4 or r == 4
    has128 = has128 or r == 128
  end
  local nI, K = cfg.index_n_heads, cfg.index_topk
  local b = {
    ids = tide.zeros({ T }, "i32"),
    X = tide.zeros({ T, hc, d }),                 -- residual streams
    x = tide.zeros({ T, d }),                     -- sub-layer input
    a = tide.zeros({ T, d }),                     -- sub-layer output
    post = tide.zeros({ T, hc }), comb = tide.zeros({ T, hc, hc }),
    qr = tide.zeros({ T, cfg.q_lora_rank }),      -- q latent
    kv = tide.zeros({ T, D }),                    -- the window KV vector
    q = tide.zeros({ T, H, D }),
    o = tide.zeros({ T, H, D }),
    z = tide.zeros({ T, cfg.o_groups * cfg.o_lora_rank }),
    glog = tide.zeros({ T, cfg.n_routed_experts }),
    rids = tide.zeros({ T, cfg.num_experts_per_tok }, "i32"),
    rw = tide.zeros({ T, cfg.num_experts_per_tok }),
  }
  -- compressor rows [kv | score] (contiguous, one buffer per ratio)
  if has4 then b.kvs4 = tide.zeros({ T, 2 * 2 * D }) end
  if has128 then b.kvs128 = tide.zeros({ T, 2 * D }) end
  if has4 then
    b.ikvs = tide.zeros({ T, 2 * 2 * 128 })
    b.qi = tide.zeros({ T, nI, 128 })
    b.q8 = tide.zeros({ T, nI, 128 }, "u8")
    b.iw = tide.zeros({ T, nI })
    b.topk = tide.zeros({ T, K }, "i32")
  end
  return b
end

-- Narrowed views of every buffer for a step of T tokens.
local function views(bufs, T)
  local v = {}
  for k, t in pairs(bufs) do v[k] = t:narrow(0, 0, T) end
  return v
end

-- One block's weights and fused jobs (prefix P, e.g. "layers.3."; ratio r;
-- hash: routes by token id). The MTP block (deepseek_v4_mtp) builds its own
-- block with it.
function M.block_weights(net, ck, P, L, r, hash)
  local cfg, B, D = net.cfg, net.bufs, 512
  local l = {
    index = L, ratio = r,
    attn_norm = vec(ck, P .. "attn_norm.weight"), ffn_norm = vec(ck, P .. "ffn_norm.weight"),
    hc_attn_fn = vec(ck, P .. "hc_attn_fn"), hc_attn_base = vec(ck, P .. "hc_attn_base"),
    hc_attn_scale = vec(ck, P .. "hc_attn_scale"),
    hc_ffn_fn = vec(ck, P .. "hc_ffn_fn"), hc_ffn_base = vec(ck, P .. "hc_ffn_base"),
    hc_ffn_scale = vec(ck, P .. "hc_ffn_scale"),
    q_norm = vec(ck, P .. "attn.q_norm.weight"), kv_norm = vec(ck, P .. "attn.kv_norm.weight"),
    wq_a = linear(ck, P .. "attn.wq_a"), wkv = linear(ck, P .. "attn.wkv"),
    wq_b = linear(ck, P .. "attn.wq_b"), wo_a = linear(ck, P .. "attn.wo_a"), wo_b = linear(ck, P .. "attn.wo_b"),
    sink = vec(ck, P .. "attn.attn_sink"),
    gate = linear(ck, P .. "ffn.gate"),
    rope = r > 1 and net.rope_comp or net.rope_plain,
  }
  l.qkv = fused_pair(l.wq_a, l.wkv, B.x, B.qr, 0, B.kv, 0)
  if r > 1 then
    l.c_wkv, l.c_wgate = linear(ck, P .. "attn.compressor.wkv"), linear(ck, P .. "attn.compressor.wgate")
    l.c_ape, l.c_norm = vec(ck, P .. "attn.compressor.ape"), vec(ck, P .. "attn.compressor.norm.weight")
    local cw = (r == 4 and 2 or 1) * D
    l.kvs_name = r == 4 and "kvs4" or "kvs128"
    local kb = B[l.kvs_name]
    l.comp = fused_pair(l.c_wkv, l.c_wgate, B.x, kb, 0, kb, cw)
  end
  if r == 4 then
    l.i_wq_b = linear(ck, P .. "attn.indexer.wq_b")
    l.i_wproj = linear(ck, P .. "attn.indexer.weights_proj")
    l.ic_wkv, l.ic_wgate = linear(ck, P .. "attn.indexer.compressor.wkv"),
      linear(ck, P .. "attn.indexer.compressor.wgate")
    l.ic_ape = vec(ck, P .. "attn.indexer.compressor.ape")
    l.ic_norm = vec(ck, P .. "attn.indexer.compressor.norm.weight")
    l.icomp = fused_pair(l.ic_wkv, l.ic_wgate, B.x, B.ikvs, 0, B.ikvs, 256)
  end
  if hash then
    l.tid2eid = vec(ck, P .. "ffn.gate.tid2eid")
  else
    l.gate_bias = vec(ck, P .. "ffn.gate.bias")
  end
  local o = net.opts
  l.moe = moe_block(ck, cfg, P, o.experts and o.experts(P), net.experts_policy, net.dense_policy)
  if o.on_moe then o.on_moe(P, l.moe) end
  if net.dense_policy ~= 0 then
    for _, k in ipairs({ "wq_a", "wkv", "wq_b", "wo_a", "wo_b" }) do
      check(C.tide_linear_set_policy(l[k], net.dense_policy), 3)
    end
  end
  return l
end

function M.new(ck, opts)
  opts = opts or {}
  local cfg = ck.config
  local net = setmetatable({ ck = ck, cfg = cfg, opts = opts }, Net)
  net.experts_policy, net.dense_policy, net.q8 = M.q8_policies(opts)
  net.head_policy = net.q8 == "all" and 2 or 0
  net.d, net.hc, net.H = cfg.hidden_size, cfg.hc_mult, cfg.num_attention_heads
  net.n_layers = cfg.num_hidden_layers
  net.vocab = cfg.vocab_size
  net.eps = cfg.rms_norm_eps
  net.max_tokens = opts.max_tokens or 512
  net.scale = 1 / math.sqrt(512)
  net.iwscale = 1 / math.sqrt(128) / math.sqrt(cfg.index_n_heads)
  net.rope_plain = rope_for(cfg, false)
  net.rope_comp = rope_for(cfg, true)
  local hcc = ffi.new("tide_hc_cfg")
  hcc.iters, hcc.flags, hcc.rms_eps, hcc.hc_eps = cfg.hc_sinkhorn_iters, ROUND_OPS, cfg.rms_norm_eps, cfg.hc_eps
  net.hccfg = hcc
  local rcfg = ffi.new("tide_route_cfg")
  rcfg.scoring, rcfg.norm_topk, rcfg.routed_scale = cfg.scoring_id, cfg.norm_topk_prob and 1 or 0,
    cfg.routed_scaling_factor
  net.rcfg = rcfg
  net.bufs = buffers(cfg, net.max_tokens)
  net.embed = vec(ck, "embed.weight")
  net.norm = vec(ck, "norm.weight")
  net.hc_head_fn, net.hc_head_base, net.hc_head_scale = vec(ck, "hc_head_fn"), vec(ck, "hc_head_base"),
    vec(ck, "hc_head_scale")
  net.head = linear(ck, "head")
  if net.head_policy ~= 0 then check(C.tide_linear_set_policy(net.head, net.head_policy), 2) end
  net.layers = {}
  local progress = opts.progress
  for L = 0, net.n_layers - 1 do
    local l = M.block_weights(net, ck, "layers." .. L .. ".", L, cfg.ratios[L], L < cfg.num_hash_layers)
    net.layers[L] = l
    if progress then progress(L + 1, net.n_layers) end
  end
  return net
end

-- ---------------------------------------------------------------- the cache
-- Cache configuration for this model (ratios per layer); sizes from opts.
function Net:cache_config(o)
  local cfg = self.cfg
  local cc = ffi.new("tide_kvcache_config")
  local ratios = ffi.new("int32_t[?]", math.max(1, self.n_layers))
  for L = 0, self.n_layers - 1 do ratios[L] = cfg.ratios[L] end
  cc.n_layers = self.n_layers
  cc.ratios = ratios
  cc.head_dim, cc.rope_dim, cc.index_head_dim = 512, 64, 128
  cc.window = cfg.sliding_window
  cc.swa_block = o.swa_block or 64
  cc.page_tokens = o.page_tokens or 256
  cc.max_seqs = o.max_seqs or 16
  local ctx = o.context or 4096
  local pages_per_seq = math.ceil(ctx / cc.page_tokens)
  cc.pages = o.pages or (pages_per_seq * (o.seq_budget or 4))
  local win_blocks = math.ceil((cfg.sliding_window + self.max_tokens) / cc.swa_block) + 1
  cc.keep_swa_history = o.keep_swa_history and 1 or 0
  if o.swa_blocks then cc.swa_blocks = o.swa_blocks
  elseif o.keep_swa_history then cc.swa_blocks = math.ceil(ctx / cc.swa_block) * (o.seq_budget or 4)
  else cc.swa_blocks = win_blocks * cc.max_seqs end
  return cc, ratios
end

-- ---------------------------------------------------------------- one step
-- st: { T, batch (prepared), cache, v (views of the buffers), ids, and
--       probes (tide.probe) when a probe is attached: `if P then P:fire(point,
--       L, buffer) end` at each named point (M.POINTS) }
local function linear_fwd(l, y, x, flags)
  check(C.tide_linear_forward_ex(l, y, x, flags), 3)
end

-- One attention sub-layer (doc 2.2), vLLM's CPU call order (2.2.8). x is the
-- RMSNorm'ed input [T, d]; the output goes to v.a [T, d].
function Net:attention(l, st)
  local v, T, b, cache, L, rope = st.v, st.T, st.batch, st.cache, l.index, l.rope
  local P = st.probes
  -- 1. [qr | kv] = x . [wq_a ; wkv]^T, bf16 outputs
  run_pair(l.qkv, T, ROUND_LIN)
  local qr, kv = v.qr, v.kv
  -- 2. q_norm, kv_norm (weighted RMSNorm, bf16)
  check(C.tide_rmsnorm(qr, qr, l.q_norm, self.eps, ROUND_OPS))
  check(C.tide_rmsnorm(kv, kv, l.kv_norm, self.eps, ROUND_OPS))
  -- 3. q = qr . wq_b^T viewed [T, H, 512]; 4. per-head norm + RoPE, and the SWA insert
  local q = v.q
  linear_fwd(l.wq_b, st.q2d, qr, ROUND_LIN)
  check(C.tide_attn_q_prep(q, b, rope, self.eps))
  if P then P:fire("attn_q", L, q) end
  check(C.tide_attn_kv_insert(cache, L, kv, b, rope))
  -- 5. C4: the indexer (its compressor always; scoring only past the short path)
  local topk = nil
  if l.ratio == 4 then
    run_pair(l.icomp, T, ROUND_LIN)
    check(C.tide_attn_compress_indexer(cache, L, v.ikvs, l.ic_ape, l.ic_norm, self.eps, b, rope))
  end
  -- 6. the main compressor
  if l.ratio > 1 then
    run_pair(l.comp, T, ROUND_LIN)
    check(C.tide_attn_compress(cache, L, v[l.kvs_name], l.c_ape, l.c_norm, self.eps, b, rope))
  end
  -- 7. C4 top-k when some token sees more entries than index_topk (the
  -- scores go out only when a probe watches the selection).
  -- self.index_mode (a measurement switch, normally nil): "dense" attends to
  -- every visible entry; a function(L, topk, st) rewrites the indexer's picks.
  if l.ratio == 4 then
    local scores = P and P:wants("attn_topk", L) and tide.full({ T, math.max(1, st.max_visible4) }, 0 / 0) or nil
    if st.max_visible4 > self.cfg.index_topk and self.index_mode ~= "dense" then
      linear_fwd(l.i_wq_b, st.qi2d, qr, ROUND_LIN)
      linear_fwd(l.i_wproj, v.iw, v.x, ROUND_LIN)
      check(C.tide_attn_indexer_q(v.q8, v.iw, v.qi, v.iw, self.iwscale, b, rope))
      check(C.tide_attn_indexer_topk(cache, L, v.q8, v.iw, b, v.topk, scores))
      topk = v.topk
      if self.index_mode then self.index_mode(L, topk, st) end
    end
    if P then P:fire("attn_topk", L, topk or false, scores, "scores") end
  end
  -- 8. sparse attention over window + compressed entries, sink in the
  -- denominator (the mass statistics only when a probe watches them)
  local stats = P and P:wants("attn_shares", L) and self:_stats(T) or nil
  check(C.tide_attn_sparse(v.o, q, cache, L, b, topk, l.sink, self.scale, stats))
  if stats then P:fire("attn_shares", L, stats) end
  -- 9. inverse RoPE at the query position, grouped wo_a, wo_b
  check(C.tide_attn_o_unrope(v.o, v.o, b, rope))
  if P then P:fire("attn_heads", L, v.o) end
  check(C.tide_linear_forward_grouped(l.wo_a, v.z, st.o2d, self.cfg.o_groups, ROUND_LIN))
  linear_fwd(l.wo_b, v.a, v.z, ROUND_LIN)
end

-- One MoE sub-layer (doc 2.3): gate logits in f32, routing (hash layers by
-- token id), experts grouped per expert in C, shared expert, bf16 output.
function Net:moe(l, st)
  local v = st.v
  linear_fwd(l.gate, v.glog, v.x, 0)
  if l.tid2eid then
    check(C.tide_route_hash(v.rids, v.rw, v.glog, v.ids, l.tid2eid, self.rcfg))
  else
    check(C.tide_route_topk(v.rids, v.rw, v.glog, l.gate_bias, self.rcfg))
  end
  local P = st.probes
  if P then
    P:fire("moe_routes", l.index, v.rids, v.rw, "weights")
    P:fire("moe_weights", l.index, v.rw, v.rids, "experts")
  end
  -- opts.moe_exec: the same contract over several processes (tide.mpi)
  check((self.opts.moe_exec or C.tide_moe_forward)(l.moe, v.a, v.x, v.rids, v.rw, ROUND_OPS))
end

-- One block (attention then MoE, each between hc_pre and hc_post) on the
-- residual streams st.v.X.
function Net:block(l, st)
  local v, P, L = st.v, st.probes, l.index
  -- (A) attention
  check(C.tide_hc_pre(v.x, v.post, v.comb, v.X, l.hc_attn_fn, l.hc_attn_scale, l.hc_attn_base, self.hccfg))
  check(C.tide_rmsnorm(v.x, v.x, l.attn_norm, self.eps, ROUND_OPS))
  if P then P:fire("attn_in", L, v.x) end
  ;(l.attention or self.attention)(self, l, st)
  if P then P:fire("attn_out", L, v.a) end
  check(C.tide_hc_post(v.X, v.a, v.X, v.post, v.comb, ROUND_OPS))
  if P then P:fire("resid_attn", L, v.X) end
  -- (F) MoE
  check(C.tide_hc_pre(v.x, v.post, v.comb, v.X, l.hc_ffn_fn, l.hc_ffn_scale, l.hc_ffn_base, self.hccfg))
  check(C.tide_rmsnorm(v.x, v.x, l.ffn_norm, self.eps, ROUND_OPS))
  if P then P:fire("moe_in", L, v.x) end
  ;(l.moe_fn or self.moe)(self, l, st)
  if P then P:fire("moe_out", L, v.a) end
  check(C.tide_hc_post(v.X, v.a, v.X, v.post, v.comb, ROUND_OPS))
  if P then P:fire("resid_moe", L, v.X) end
end

-- The whole forward of a prepared step. st.T tokens, st.ids filled, st.batch
-- prepared on st.cache. Leaves the final normalised hidden rows in st.v.x.
function Net:forward(st)
  local v, P = st.v, st.probes
  -- embedding copied into the hc residual streams
  check(C.tide_embed(v.X, self.embed, v.ids))
  if P then P:fire("embed", nil, v.X) end
  for L = 0, self.n_layers - 1 do self:block(self.layers[L], st) end
  -- mHC head, final norm (the LM head runs on the rows the caller wants)
  check(C.tide_hc_head(v.x, v.X, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, self.hccfg))
  check(C.tide_rmsnorm(v.x, v.x, self.norm, self.eps, ROUND_OPS))
  if P then P:fire("final", nil, v.x) end
end

-- Attention mass statistics [T, H, 4] for a step a probe watches (one
-- buffer of max_tokens rows, made on first use), NaN where nothing wrote.
function Net:_stats(T)
  local b = self._statsbuf
  if not b then
    b = tide.zeros({ self.max_tokens, self.H, 4 })
    self._statsbuf = b
  end
  return b:narrow(0, 0, T):fill(0 / 0)
end

-- The family's per-step data, before the cache is prepared. st comes with
-- T, spans (per entry: first row, n, pos0, ...), cache and batch; this adds
-- the buffer views narrowed to T rows (st.v and the 2-D reshapes), st.ids
-- (int32_t* [T], the model fills it), st.hidden (the final hidden rows
-- [T, d] the LM head reads) and max_visible4, the most compressed C4 entries
-- a token of the step sees (the indexer runs only past index_topk).
function Net:begin_step(st)
  local T = st.T
  if T > self.max_tokens then error("step of " .. T .. " tokens exceeds max_tokens " .. self.max_tokens, 2) end
  local v = views(self.bufs, T)
  local cfg = self.cfg
  st.v = v
  st.q2d = v.q:reshape(T, cfg.num_attention_heads * 512)
  st.o2d = v.o:reshape(T, cfg.num_attention_heads * 512)
  if v.qi then st.qi2d = v.qi:reshape(T, cfg.index_n_heads * 128) end
  st.ids = ffi.cast("int32_t*", v.ids.data)
  st.ids_t = v.ids
  st.hidden = v.x
  local vis = 0
  for _, sp in ipairs(st.spans) do
    local n4 = math.floor((sp.pos0 + sp.n) / 4)
    if n4 > vis then vis = n4 end
  end
  st.max_visible4 = vis
  return st
end

-- The readout of residual streams (a logit lens): X f32 [n, hc, d] through
-- the mHC head, the final norm and the LM head, as the forward ends; returns
-- new tensors logits [n, vocab] and the hidden rows [n, d]. For the streams
-- after the last layer it gives the step's logits bit for bit.
function Net:readout(X)
  local n = X:size(0)
  local x = tide.zeros({ n, self.d })
  check(C.tide_hc_head(x, X, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, self.hccfg), 2)
  check(C.tide_rmsnorm(x, x, self.norm, self.eps, ROUND_OPS), 2)
  local y = tide.zeros({ n, self.vocab })
  self:head_logits(y, x)
  return y, x
end

-- logits rows: y [n, vocab] = x_rows . head^T (f32, not rounded)
function Net:head_logits(y, x)
  check(C.tide_linear_forward_ex(self.head, y, x, 0), 2)
end

return M
