-- tide.attn: the paged KV cache, step batches, RoPE tables and the
-- DeepSeek-V4 attention kernels, for a Lua script that wires an attention
-- layer and for a REPL user poking at a cache. Every kernel is one C call on
-- tide tensors; nothing here allocates per call except the tensors a caller
-- asks for by leaving an optional `out` argument out (see docs/attention.md).
--
--   local attn = tide.attn
--   local cache = attn.cache({ ratios = { 0, 4, 128 }, swa_blocks = 64, pages = 32, max_seqs = 4 })
--   local rope = attn.rope({ theta = 160000, yarn = { factor = 16, original_max = 65536 } })
--   local b = attn.batch(512)
--   local s = cache:seq_new()
--   b:clear(); b:add(s, cache:len(s), 100)
--   assert(cache:prepare(b))
--   attn.q_prep(q, b, rope); attn.kv_insert(cache, 0, kv, b, rope) ...
--   cache:commit(b)
local tffi = require("tide.ffi")
local tensor = require("tide.tensor")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}

M.kinds = { swa = 0, main = 1, index = 2, state = 3, istate = 4 }
local KIND_NAMES = { [0] = "swa", "main", "index", "state", "istate" }

-- out-parameter boxes, created once
local i32box = ffi.new("int32_t[1]")
local i32box2 = ffi.new("int32_t[1]")
local i64box = ffi.new("int64_t[3]")
local f32x64 = ffi.new("float[64]")
local statsbox = ffi.new("tide_kvcache_stats")
local cachebox = ffi.new("tide_kvcache*[1]")
local batchbox = ffi.new("tide_batch*[1]")
local ropebox = ffi.new("tide_rope*[1]")
local i32arr = ffi.typeof("int32_t[?]")
local i64arr = ffi.typeof("int64_t[?]")
local Tensor = tensor.Tensor

local function kind_id(k, level)
  if type(k) == "number" then return k end
  local id = M.kinds[k]
  if not id then error("unknown cache region '" .. tostring(k) .. "' (swa, main, index, state, istate)", level + 1) end
  return id
end

-- ---- RoPE tables ----
local Rope = {}
Rope.__index = Rope

-- attn.rope{ theta = 10000 } or { theta = 160000, yarn = { factor, original_max,
-- beta_fast = 32, beta_slow = 1 } }; table_positions caps the cached table.
function M.rope(opts)
  opts = opts or {}
  local cfg = ffi.new("tide_rope_config")
  cfg.theta = opts.theta or 10000
  cfg.dim = opts.dim or 64
  if opts.yarn then
    cfg.yarn = 1
    cfg.yarn_factor = opts.yarn.factor or 16
    cfg.yarn_original_max = opts.yarn.original_max or opts.yarn.original_max_position_embeddings or 65536
    cfg.yarn_beta_fast = opts.yarn.beta_fast or 32
    cfg.yarn_beta_slow = opts.yarn.beta_slow or 1
  end
  cfg.table_positions = opts.table_positions or 0
  check(C.tide_rope_new(ropebox, cfg), 2)
  return setmetatable({ _r = ffi.gc(ropebox[0], C.tide_rope_free) }, Rope)
end

-- The 32 frequencies, as a Lua table.
function Rope:freqs()
  check(C.tide_rope_freqs(self._r, f32x64, 64), 2)
  local t = {}
  for i = 0, 31 do t[i + 1] = f32x64[i] end
  return t
end

-- cos/sin row of position p: two Lua tables of 32 values.
function Rope:cos_sin(p)
  check(C.tide_rope_cos_sin(self._r, p, f32x64, 64), 2)
  local c, s = {}, {}
  for i = 0, 31 do
    c[i + 1] = f32x64[i]
    s[i + 1] = f32x64[32 + i]
  end
  return c, s
end

-- Rotate x [.., 64] f32 in place at positions pos (i64 tensor), inverse if asked.
function Rope:apply(x, pos, inverse)
  check(C.tide_rope_apply(self._r, x, pos, inverse and 1 or 0), 2)
  return x
end

function Rope:close()
  if self._r then
    C.tide_rope_free(ffi.gc(self._r, nil))
    self._r = nil
  end
end

-- ---- batches ----
local Batch = {}
Batch.__index = Batch

function M.batch(max_tokens)
  check(C.tide_batch_new(batchbox, max_tokens or 512), 2)
  return setmetatable({ _b = ffi.gc(batchbox[0], C.tide_batch_free), max_tokens = max_tokens or 512 }, Batch)
end

function Batch:clear() check(C.tide_batch_clear(self._b), 2) return self end

-- n tokens of sequence `seq` at positions pos0 .. pos0 + n - 1
function Batch:add(seq, pos0, n)
  check(C.tide_batch_add(self._b, seq, pos0, n or 1), 2)
  return self
end

-- Replace the contents: seqs and pos as Lua tables (one entry per token) or
-- i32/i64 tensors.
function Batch:set(seqs, pos)
  local n, sp, pp
  if type(seqs) == "table" then
    n = #seqs
    if type(pos) ~= "table" or #pos ~= n then error("batch:set: seqs and pos must have the same length", 2) end
    sp, pp = i32arr(n), i64arr(n)
    for i = 1, n do
      sp[i - 1] = seqs[i]
      pp[i - 1] = pos[i]
    end
  else
    n = seqs:numel()
    if seqs.dtype ~= tensor.dtypes.i32 or pos.dtype ~= tensor.dtypes.i64 or pos:numel() ~= n
      or not seqs:is_contiguous() or not pos:is_contiguous() then
      error("batch:set: seqs must be an i32 tensor and pos an i64 tensor of the same size", 2)
    end
    sp, pp = ffi.cast("const int32_t*", seqs.data), ffi.cast("const int64_t*", pos.data)
  end
  check(C.tide_batch_set(self._b, n, sp, pp), 2)
  return self
end

function Batch:tokens() return C.tide_batch_tokens(self._b) end

-- sequence id and position of token t (0-based)
function Batch:token(t)
  check(C.tide_batch_token(self._b, t, i32box, i64box), 2)
  return i32box[0], tonumber(i64box[0])
end

-- positions as an i64 tensor [T] (into `out` when given)
function Batch:positions(out)
  out = out or tensor.zeros(self:tokens(), "i64")
  check(C.tide_batch_positions(self._b, out), 2)
  return out
end

-- per-token slot lists of a prepared batch: "swa" -> i64 [T, window];
-- "main"/"index" -> i64 [T] write slots
function Batch:slots(cache, layer, kind, out)
  local k = kind_id(kind or "swa", 2)
  if not out then
    if k == 0 then out = tensor.zeros({ self:tokens(), cache:stats().window }, "i64")
    else out = tensor.zeros(self:tokens(), "i64") end
  end
  check(C.tide_batch_slots(self._b, cache._c, layer, k, out), 2)
  return out
end

function Batch:close()
  if self._b then
    C.tide_batch_free(ffi.gc(self._b, nil))
    self._b = nil
  end
end

-- ---- the cache ----
local Cache = {}
Cache.__index = Cache

-- attn.cache{ ratios = {...} (per layer: 0/1, 4, 128), swa_blocks, pages,
-- max_seqs, window = 128, swa_block = 64, page_tokens = 256,
-- keep_swa_history = false }
function M.cache(opts)
  if type(opts) ~= "table" or type(opts.ratios) ~= "table" or #opts.ratios == 0 then
    error("attn.cache: opts.ratios must be a non-empty table of per-layer ratios", 2)
  end
  local n = #opts.ratios
  local ratios = i32arr(n)
  for i = 1, n do ratios[i - 1] = opts.ratios[i] end
  local cfg = ffi.new("tide_kvcache_config")
  cfg.n_layers = n
  cfg.ratios = ratios
  cfg.window = opts.window or 0
  cfg.swa_block = opts.swa_block or 0
  cfg.page_tokens = opts.page_tokens or 0
  cfg.swa_blocks = opts.swa_blocks or 64
  cfg.pages = opts.pages or 0
  cfg.max_seqs = opts.max_seqs or 1
  cfg.keep_swa_history = opts.keep_swa_history and 1 or 0
  local has_comp = false
  for i = 1, n do if opts.ratios[i] > 1 then has_comp = true end end
  if has_comp and not opts.pages then cfg.pages = 16 end
  check(C.tide_kvcache_new(cachebox, cfg), 2)
  return setmetatable({ _c = ffi.gc(cachebox[0], C.tide_kvcache_free), n_layers = n }, Cache)
end

function Cache:stats()
  check(C.tide_kvcache_stats_get(self._c, statsbox), 2)
  local s = statsbox
  return {
    swa_blocks = s.swa_blocks, swa_free = s.swa_free, pages = s.pages, pages_free = s.pages_free,
    max_seqs = s.max_seqs, seqs = s.seqs, bytes = tonumber(s.bytes), n_layers = s.n_layers,
    window = s.window, swa_block = s.swa_block, page_tokens = s.page_tokens,
    keep_swa_history = s.keep_swa_history == 1, step_active = s.step_active == 1,
  }
end

function Cache:ratio(layer) return check(C.tide_kvcache_layer_ratio(self._c, layer), 2) end

-- u8 [blocks, stride] byte view of a pool region (shares the cache's memory)
function Cache:view(layer, kind)
  local t = Tensor()
  check(C.tide_kvcache_view(self._c, layer, kind_id(kind or "swa", 2), t), 2)
  return t
end

function Cache:block_slots(layer, kind)
  return tonumber(check(tonumber(C.tide_kvcache_block_slots(self._c, layer, kind_id(kind or "swa", 2))), 2))
end

-- a new empty sequence id, or nil, message when every slot is taken
function Cache:seq_new()
  local rc = C.tide_kvcache_seq_new(self._c, i32box)
  if rc ~= 0 then return nil, tffi.last_error() end
  return i32box[0]
end

function Cache:seq_free(id) check(C.tide_kvcache_seq_free(self._c, id), 2) end

function Cache:len(id) return tonumber(check(tonumber(C.tide_kvcache_seq_len(self._c, id)), 2)) end

-- SWA blocks and pages the sequence references
function Cache:usage(id)
  check(C.tide_kvcache_seq_usage(self._c, id, i32box, i32box2), 2)
  return i32box[0], i32box2[0]
end

-- a copy-on-write fork (nil, message when no slot is free)
function Cache:fork(id)
  local rc = C.tide_kvcache_seq_fork(self._c, id, i32box)
  if rc < 0 then check(rc, 2) end
  if rc ~= 0 then return nil, tffi.last_error() end
  return i32box[0]
end
Cache.snapshot = Cache.fork

-- make `id` an exact copy of `src` (restore a snapshot)
function Cache:restore(id, src) check(C.tide_kvcache_seq_assign(self._c, id, src), 2) end
Cache.assign = Cache.restore

function Cache:set_length(id, len)
  local rc = C.tide_kvcache_seq_set_length(self._c, id, len)
  if rc < 0 then check(rc, 2) end
  if rc ~= 0 then return nil, tffi.last_error() end
  return true
end

-- first, rows, row_bytes of a sequence's region of one layer
function Cache:extent(id, layer, kind)
  check(C.tide_kvcache_seq_extent(self._c, id, layer, kind_id(kind, 2), i64box, i64box + 1, i64box + 2), 2)
  return tonumber(i64box[0]), tonumber(i64box[1]), tonumber(i64box[2])
end

-- the sequence's bytes of a region, u8 [rows, row_bytes] (into `out` if given)
function Cache:read(id, layer, kind, out)
  local _, rows, rb = self:extent(id, layer, kind)
  out = out or tensor.zeros({ rows, rb }, "u8")
  check(C.tide_kvcache_seq_read(self._c, id, layer, kind_id(kind, 2), out), 2)
  return out
end

function Cache:write(id, layer, kind, t)
  local rc = C.tide_kvcache_seq_write(self._c, id, layer, kind_id(kind, 2), t)
  if rc < 0 then check(rc, 2) end
  if rc ~= 0 then return nil, tffi.last_error() end
  return true
end

-- global slots of local indices (i32/i64 tensor), -1 kept
function Cache:map_slots(id, layer, kind, loc, out)
  out = out or tensor.zeros(loc:shape(), "i64")
  check(C.tide_kvcache_map_slots(self._c, id, layer, kind_id(kind, 2), loc, out), 2)
  return out
end

-- begin a step: true, or nil, message when the pools are full (nothing changed)
function Cache:prepare(b)
  local rc = C.tide_kvcache_prepare(self._c, b._b)
  if rc < 0 then check(rc, 2) end
  if rc ~= 0 then return nil, tffi.last_error() end
  return true
end

function Cache:commit(b) check(C.tide_kvcache_commit(self._c, b._b), 2) end
function Cache:abort(b) check(C.tide_kvcache_abort(self._c, b._b), 2) end

-- Run fn(cache, batch) inside a prepared step: commit on success; on a Lua
-- error abort (the cache is as before) and re-raise.
function Cache:step(b, fn)
  local ok, err = self:prepare(b)
  if not ok then return nil, err end
  local okf, e = pcall(fn, self, b)
  if not okf then
    C.tide_kvcache_abort(self._c, b._b)
    error(e, 0)
  end
  self:commit(b)
  return true
end

function Cache:close()
  if self._c then
    C.tide_kvcache_free(ffi.gc(self._c, nil))
    self._c = nil
  end
end

function Cache:__tostring()
  local s = self:stats()
  return string.format("tide.attn.cache(%d layers, SWA %d/%d blocks free, pages %d/%d free, %d/%d sequences)",
    s.n_layers, s.swa_free, s.swa_blocks, s.pages_free, s.pages, s.seqs, s.max_seqs)
end

-- ---- kernels (see attn.h for shapes and numerics) ----
function M.q_prep(q, b, rope, eps)
  check(C.tide_attn_q_prep(q, b._b, rope._r, eps or 1e-6), 2)
  return q
end

function M.kv_insert(cache, layer, kv, b, rope)
  check(C.tide_attn_kv_insert(cache._c, layer, kv, b._b, rope._r), 2)
end

function M.compress(cache, layer, kvs, ape, norm, b, rope, eps)
  check(C.tide_attn_compress(cache._c, layer, kvs, ape, norm, eps or 1e-6, b._b, rope._r), 2)
end

function M.compress_indexer(cache, layer, kvs, ape, norm, b, rope, eps)
  check(C.tide_attn_compress_indexer(cache._c, layer, kvs, ape, norm, eps or 1e-6, b._b, rope._r), 2)
end

-- q8 u8 [T, nI, 128] and w f32 [T, nI] from qi f32 [T, nI, 128] and w_raw;
-- wscale defaults to 128^-1/2 * nI^-1/2
function M.indexer_q(q8, w, qi, w_raw, b, rope, wscale)
  local nI = tonumber(qi.sizes[1])
  check(C.tide_attn_indexer_q(q8, w, qi, w_raw, wscale or (1 / math.sqrt(128) / math.sqrt(nI)), b._b, rope._r), 2)
  return q8, w
end

function M.indexer_topk(cache, layer, q8, w, b, topk, scores)
  check(C.tide_attn_indexer_topk(cache._c, layer, q8, w, b._b, topk, scores), 2)
  return topk
end

-- out f32 [T, H, 512]; topk (C4) or nil; stats f32 [T, H, 4] or nil; scale
-- defaults to 512^-1/2
function M.sparse(out, q, cache, layer, b, topk, sink, scale, stats)
  check(C.tide_attn_sparse(out, q, cache._c, layer, b._b, topk, sink, scale or (1 / math.sqrt(512)), stats), 2)
  return out
end

function M.o_unrope(out, inp, b, rope)
  check(C.tide_attn_o_unrope(out, inp or out, b._b, rope._r), 2)
  return out
end

-- kernels as cache methods too: cache:kv_insert(layer, kv, b, rope) ...
for _, name in ipairs({ "kv_insert", "compress", "compress_indexer", "indexer_topk" }) do
  local f = M[name]
  Cache[name] = function(self, ...) return f(self, ...) end
end

M.kind_names = KIND_NAMES
return M
