-- tide.ops: the model-level kernels of tide/ops.h on tide tensors (RMSNorm,
-- embedding, mHC, routing, SwiGLU) and the MoE block object. Each function
-- is one C call writing into the output tensor it is given and returning
-- it; passing nil for an output allocates a fresh one (handy in the REPL,
-- never on a hot path). Rounding to bf16 (where vLLM rounds) is on unless
-- `round` is false. Misuse (shapes, dtypes, bad ids) raises with tide's
-- message.
--   local ops = tide.ops
--   ops.rmsnorm(x, x, w, 1e-6)                       -- in place
--   local cfg = ops.hc_cfg({ iters = 20 })           -- once per model
--   ops.hc_pre(x, post, comb, X, fn, scale, base, cfg)
--   local moe = ops.moe(256, 4096, 2048, 10.0)
--   moe:set_expert(e, w1, s1, w2, s2, w3, s3); moe:forward(out, x, ids, weights)
local tffi = require("tide.ffi")
local tensor = require("tide.tensor")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}

local ROUND = C.TIDE_OPS_ROUND_BF16
local Tensor = tensor.Tensor
local i64x4 = ffi.typeof("int64_t[4]")
local hc_cfg_t = ffi.typeof("tide_hc_cfg")
local route_cfg_t = ffi.typeof("tide_route_cfg")
local moebox = ffi.new("tide_moe*[1]")
local statsbox = ffi.new("tide_moe_stats")
local infobox = { e = ffi.new("int32_t[1]"), d = ffi.new("int64_t[1]"), i = ffi.new("int64_t[1]"),
  s = ffi.new("int64_t[1]"), n = ffi.new("int32_t[1]") }

M.SCORING = { sqrtsoftplus = C.TIDE_SCORE_SQRTSOFTPLUS, sigmoid = C.TIDE_SCORE_SIGMOID, softmax = C.TIDE_SCORE_SOFTMAX }

local function flags(round) return round == false and 0 or ROUND end

local function is_tensor(x) return ffi.istype(Tensor, x) end

local function need_tensor(x, what, level)
  if not is_tensor(x) then error(what .. " must be a tide tensor, got " .. type(x), level + 1) end
  return x
end

-- a new f32 tensor of the given sizes (convenience outputs)
local function new_f32(level, ...)
  local dims = { ... }
  local sh = i64x4(1, 1, 1, 1)
  for i = 1, #dims do sh[i - 1] = dims[i] end
  local t = Tensor()
  check(C.tide_tensor_new(t, 0, #dims, sh), level + 1)
  return t
end

local function shape_of(t)
  local s = {}
  for i = 0, t.ndim - 1 do s[i + 1] = tonumber(t.sizes[i]) end
  return s
end

-- ops.rmsnorm(out, x, w, eps, round) -> out: x / rms(x) * w over the last dim;
-- w bf16/f32 [n] or nil (weight-free); out may be x.
function M.rmsnorm(out, x, w, eps, round)
  need_tensor(x, "rmsnorm: x", 2)
  out = out or new_f32(2, unpack(shape_of(x)))
  check(C.tide_rmsnorm(out, x, w, eps or 1e-6, flags(round)), 2)
  return out
end

-- ops.round_bf16(t) -> t: every f32 element rounded to bf16 precision.
function M.round_bf16(t)
  check(C.tide_ops_round_bf16(need_tensor(t, "round_bf16: t", 2)), 2)
  return t
end

-- ops.embed(out, table, ids [, hc]) -> out [T, d] (or [T, hc, d] when out is
-- nil and hc is given: every stream a copy). ids: i32/i64 tensor or a Lua
-- array of ids.
function M.embed(out, tab, ids, hc)
  need_tensor(tab, "embed: table", 2)
  if type(ids) == "table" then ids = tensor.tensor(ids, "i64") end
  need_tensor(ids, "embed: ids", 2)
  if out == nil then
    local T, d = tonumber(ids.sizes[0]), tonumber(tab.sizes[1])
    out = hc and new_f32(2, T, hc, d) or new_f32(2, T, d)
  end
  check(C.tide_embed(out, tab, ids), 2)
  return out
end

-- ops.hc_cfg({ iters = 20, rms_eps = 1e-6, hc_eps = 1e-6, round = true }):
-- the constants of the mHC kernels as a reusable cdata.
function M.hc_cfg(o)
  o = o or {}
  local c = hc_cfg_t()
  c.iters = o.iters or 20
  c.flags = flags(o.round)
  c.rms_eps = o.rms_eps or 1e-6
  c.hc_eps = o.hc_eps or 1e-6
  return c
end
local default_hc = M.hc_cfg()

-- ops.hc_pre(x, post, comb, X, fn, scale, base [, cfg]) -> x, post, comb.
-- X [T, hc, d]; outputs x [T, d], post [T, hc], comb [T, hc, hc] (nil: new).
function M.hc_pre(x, post, comb, X, fn, scale, base, cfg)
  need_tensor(X, "hc_pre: X", 2)
  local T, hc, d = tonumber(X.sizes[0]), tonumber(X.sizes[1]), tonumber(X.sizes[2])
  x = x or new_f32(2, T, d)
  post = post or new_f32(2, T, hc)
  comb = comb or new_f32(2, T, hc, hc)
  check(C.tide_hc_pre(x, post, comb, X, fn, scale, base, cfg or default_hc), 2)
  return x, post, comb
end

-- ops.hc_post(out, a, X, post, comb, round) -> out [T, hc, d]; out may be X.
function M.hc_post(out, a, X, post, comb, round)
  need_tensor(X, "hc_post: X", 2)
  out = out or new_f32(2, unpack(shape_of(X)))
  check(C.tide_hc_post(out, a, X, post, comb, flags(round)), 2)
  return out
end

-- ops.hc_head(y, X, fn, scale, base [, cfg]) -> y [T, d].
function M.hc_head(y, X, fn, scale, base, cfg)
  need_tensor(X, "hc_head: X", 2)
  y = y or new_f32(2, tonumber(X.sizes[0]), tonumber(X.sizes[2]))
  check(C.tide_hc_head(y, X, fn, scale, base, cfg or default_hc), 2)
  return y
end

-- ops.route_cfg({ scoring = "sqrtsoftplus", norm_topk = true, routed_scale = 1 }):
-- the routing constants as a reusable cdata.
function M.route_cfg(o)
  o = o or {}
  local c = route_cfg_t()
  local s = o.scoring or "sqrtsoftplus"
  local v = type(s) == "number" and s or M.SCORING[s]
  if v == nil then error("route_cfg: unknown scoring '" .. tostring(s) .. "'", 2) end
  c.scoring = v
  c.norm_topk = o.norm_topk == false and 0 or 1
  c.routed_scale = o.routed_scale or 1
  return c
end
local default_route = M.route_cfg()

-- the [T, k] outputs: given, or new when `ids` is a number k
local function route_outputs(ids, weights, logits, level)
  if type(ids) == "number" then
    local T = tonumber(logits.ndim == 1 and 1 or logits.sizes[0])
    local k = ids
    ids = Tensor()
    check(C.tide_tensor_new(ids, C.TIDE_I32, 2, i64x4(T, k, 1, 1)), level + 1)
    weights = weights or new_f32(level + 1, T, k)
  end
  return need_tensor(ids, "ids", level + 1), need_tensor(weights, "weights", level + 1)
end

-- ops.route_topk(ids, weights, logits, bias, cfg) -> ids, weights. ids i32
-- [T, k], weights f32 [T, k] (or pass k as `ids` to get new ones). Experts
-- of a token in descending order of score + bias, ties to the smaller id.
function M.route_topk(ids, weights, logits, bias, cfg)
  need_tensor(logits, "route_topk: logits", 2)
  ids, weights = route_outputs(ids, weights, logits, 2)
  check(C.tide_route_topk(ids, weights, logits, bias, cfg or default_route), 2)
  return ids, weights
end

-- ops.route_hash(ids, weights, logits, tokens, tid2eid, cfg) -> ids, weights:
-- experts tid2eid[tokens[t]] in that row's order.
function M.route_hash(ids, weights, logits, tokens, tid2eid, cfg)
  need_tensor(logits, "route_hash: logits", 2)
  if type(tokens) == "table" then tokens = tensor.tensor(tokens, "i64") end
  ids, weights = route_outputs(ids, weights, logits, 2)
  check(C.tide_route_hash(ids, weights, logits, tokens, tid2eid, cfg or default_route), 2)
  return ids, weights
end

-- ops.swiglu(out, gate, up, limit, round) -> out: silu(min(g, L)) *
-- clamp(u, -L, L); limit nil = no clamp; out may be gate or up.
function M.swiglu(out, gate, up, limit, round)
  need_tensor(gate, "swiglu: gate", 2)
  out = out or new_f32(2, unpack(shape_of(gate)))
  check(C.tide_swiglu(out, gate, up, limit or math.huge, flags(round)), 2)
  return out
end

-- ---- the MoE block ----
local Moe = {}
Moe.__index = Moe

local function moe_h(self, level)
  local h = self._h
  if h == nil then error("moe block is closed", (level or 2) + 1) end
  return h
end

-- ops.moe(n_experts, dim, inter, swiglu_limit) -> a MoE block (limit nil: none).
function M.moe(n_experts, dim, inter, limit)
  check(C.tide_moe_new(moebox, n_experts, dim, inter, limit or math.huge), 2)
  local h = ffi.gc(moebox[0], C.tide_moe_free)
  return setmetatable({ _h = h, n_experts = n_experts, dim = dim, inter = inter }, Moe)
end

-- moe:set_expert(e, w1, s1, w2, s2, w3, s3): 0-based e; scales nil for
-- f32/bf16 weights. The tensors stay referenced by the block.
function Moe:set_expert(e, w1, s1, w2, s2, w3, s3)
  check(C.tide_moe_set_expert(moe_h(self, 2), e, w1, s1, w2, s2, w3, s3), 2)
  return self
end

function Moe:set_shared(w1, s1, w2, s2, w3, s3)
  check(C.tide_moe_set_shared(moe_h(self, 2), w1, s1, w2, s2, w3, s3), 2)
  return self
end

-- moe:forward(out, x, ids, weights, round) -> out [T, dim]; out may be x.
function Moe:forward(out, x, ids, weights, round)
  local h = moe_h(self, 2)
  need_tensor(x, "moe:forward: x", 2)
  out = out or new_f32(2, unpack(shape_of(x)))
  check(C.tide_moe_forward(h, out, x, ids, weights, flags(round)), 2)
  return out
end

-- moe:stats() -> table of the last step (tokens, rows, n_active, max_rows,
-- weight_bytes, scratch_bytes, t_gather, t_up, t_act, t_down, t_combine, t_total)
function Moe:stats()
  check(C.tide_moe_stats_get(moe_h(self, 2), statsbox), 2)
  local s = statsbox
  return {
    tokens = tonumber(s.tokens), rows = tonumber(s.rows), n_active = s.n_active, max_rows = s.max_rows,
    weight_bytes = tonumber(s.weight_bytes), scratch_bytes = tonumber(s.scratch_bytes),
    t_gather = s.t_gather, t_up = s.t_up, t_act = s.t_act, t_down = s.t_down, t_combine = s.t_combine,
    t_total = s.t_total,
  }
end

-- moe:expert_rows([out]) -> i32 tensor [E]: rows per expert in the last step.
function Moe:expert_rows(out)
  local h = moe_h(self, 2)
  if out == nil then
    out = Tensor()
    check(C.tide_tensor_new(out, C.TIDE_I32, 1, i64x4(self.n_experts, 1, 1, 1)), 2)
  end
  if out.dtype ~= C.TIDE_I32 or not out:is_contiguous() then
    error("moe:expert_rows: out must be a contiguous i32 tensor", 2)
  end
  check(C.tide_moe_expert_rows(h, ffi.cast("int32_t *", out.data), out:numel()), 2)
  return out
end

-- moe:info() -> { n_experts, dim, inter, sinter, n_set }
function Moe:info()
  local b = infobox
  check(C.tide_moe_info(moe_h(self, 2), b.e, b.d, b.i, b.s, b.n), 2)
  return { n_experts = b.e[0], dim = tonumber(b.d[0]), inter = tonumber(b.i[0]), sinter = tonumber(b.s[0]),
    n_set = b.n[0] }
end

-- idempotent; the GC frees an unclosed block
function Moe:close()
  local h = self._h
  if h ~= nil then
    self._h = nil
    ffi.gc(h, nil)
    C.tide_moe_free(h)
  end
end

M.Moe = Moe

return M
