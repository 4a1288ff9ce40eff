-- tide.tensor: the Lua face of tide_tensor. A tensor is a small GC-managed
-- header (shape, strides, data pointer) holding one reference to a storage
-- that C owns; dropping the last Lua reference releases it.
--
-- Indexing is 0-based, like the FFI and the C core, so token ids, positions
-- and tensor indices are the same numbers everywhere: logits[id] is the
-- logit of token `id`, and logits:argmax() is a token id.
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}
local methods = {}
local mt = {}

local Tensor = ffi.metatype("tide_tensor", mt)
M.Tensor = Tensor

local i64x4 = ffi.typeof("int64_t[4]")
local idxbuf = i64x4()
local dblbox = ffi.new("double[1]")
local cmpbox = ffi.new("tide_compare")

local DTYPES = { "f32", "bf16", "f16", "f8e4m3", "e8m0", "fp4", "i8", "u8", "i32", "i64" }
local DT = {}
for i, n in ipairs(DTYPES) do DT[n] = i - 1 end
DT.float = DT.f32; DT.float32 = DT.f32; DT.bfloat16 = DT.bf16; DT.half = DT.f16; DT.float16 = DT.f16
DT.int64 = DT.i64; DT.int32 = DT.i32; DT.int8 = DT.i8; DT.uint8 = DT.u8; DT.fp8 = DT.f8e4m3
M.dtypes = DT

local function is_tensor(x) return ffi.istype(Tensor, x) end
M.is_tensor = is_tensor

local function dtype_id(d, level)
  if d == nil then return DT.f32 end
  if type(d) == "number" and d >= 0 and d < #DTYPES then return d end
  local v = DT[d]
  if not v then
    error("unknown dtype '" .. tostring(d) .. "' (expected one of " .. table.concat(DTYPES, ", ") .. ")",
      (level or 2) + 1)
  end
  return v
end
M.dtype_id = dtype_id

function M.dtype_name(id) return DTYPES[id + 1] or "?" end

-- Collect a shape from (n1, n2, ...), ({n1, n2, ...}) or a tensor's shape;
-- a trailing string is a dtype. Returns ndim, int64_t[4], dtype-or-nil.
local function shape_args(level, ...)
  local n = select("#", ...)
  local args = { ... }
  local dtype
  if n > 0 and type(args[n]) == "string" then dtype = args[n]; n = n - 1 end
  local dims = args
  if n == 1 and type(args[1]) == "table" then dims = args[1]; n = #dims end
  if n > 4 then error("tensors have at most 4 dims, got " .. n, level + 1) end
  local sh = i64x4(1, 1, 1, 1)
  for i = 1, n do
    local v = dims[i]
    if type(v) ~= "number" or v < 0 or v ~= math.floor(v) then
      error("bad size '" .. tostring(v) .. "' in dim " .. (i - 1), level + 1)
    end
    sh[i - 1] = v
  end
  return n, sh, dtype
end

local function wrap_new(dtype, ndim, sh, level)
  local t = Tensor()
  check(C.tide_tensor_new(t, dtype, ndim, sh), level + 1)
  return t
end

-- tide.empty/zeros(2, 3 [, "bf16"]) or ({2, 3} [, dtype]): zero-filled.
function M.zeros(...)
  local nd, sh, dt = shape_args(2, ...)
  return wrap_new(dtype_id(dt, 2), nd, sh, 2)
end
M.empty = M.zeros

function M.ones(...)
  local t = M.zeros(...)
  check(C.tide_tensor_fill(t, 1), 2)
  return t
end

function M.full(shape, value, dtype)
  local nd, sh = shape_args(2, shape)
  local t = wrap_new(dtype_id(dtype, 2), nd, sh, 2)
  check(C.tide_tensor_fill(t, value), 2)
  return t
end

local seed_counter = 0
local function next_seed()
  seed_counter = seed_counter + 1
  return seed_counter
end
function M.manual_seed(s) seed_counter = s end

-- tide.randn({2, 3}, {seed = 1, mean = 0, std = 1, dtype = "f32"})
function M.randn(shape, opts)
  opts = opts or {}
  local nd, sh = shape_args(2, shape)
  local t = wrap_new(dtype_id(opts.dtype, 2), nd, sh, 2)
  check(C.tide_tensor_rand(t, opts.seed or next_seed(), C.TIDE_RAND_NORMAL, opts.mean or 0, opts.std or 1), 2)
  return t
end

-- tide.rand({2, 3}, {seed = 1, lo = 0, hi = 1, dtype = "f32"})
function M.rand(shape, opts)
  opts = opts or {}
  local nd, sh = shape_args(2, shape)
  local t = wrap_new(dtype_id(opts.dtype, 2), nd, sh, 2)
  check(C.tide_tensor_rand(t, opts.seed or next_seed(), C.TIDE_RAND_UNIFORM, opts.lo or 0, opts.hi or 1), 2)
  return t
end

-- tide.arange(n [, dtype]) = 0, 1, ..., n-1
function M.arange(n, dtype)
  local t = M.zeros(n, dtype or "i64")
  if t.dtype == DT.i64 then
    local p = ffi.cast("int64_t*", t.data)
    for i = 0, n - 1 do p[i] = i end
  else
    for i = 0, n - 1 do idxbuf[0] = i; C.tide_tensor_set(t, idxbuf, i) end
  end
  return t
end

-- Build from a (nested) Lua table of numbers: tide.tensor({{1, 2}, {3, 4}}, "bf16").
-- Also tide.tensor(2, 3, "f32") as a shorthand for zeros.
function M.tensor(data, ...)
  if type(data) ~= "table" then return M.zeros(data, ...) end
  local dtype = dtype_id(select(1, ...), 2)
  local shape, probe = {}, data
  while type(probe) == "table" do
    shape[#shape + 1] = #probe
    probe = probe[1]
    if #shape > 4 then error("tensors have at most 4 dims", 2) end
  end
  if #shape == 0 then shape = { 0 } end
  local flat, n = {}, 0
  local function walk(x, d)
    if d > #shape then
      if type(x) ~= "number" then error("non-number element " .. tostring(x) .. " in tensor data", 4) end
      n = n + 1; flat[n] = x
      return
    end
    if type(x) ~= "table" or #x ~= shape[d] then
      error("ragged table: expected " .. shape[d] .. " elements at depth " .. d, 4)
    end
    for i = 1, #x do walk(x[i], d + 1) end
  end
  walk(data, 1)
  local nd, sh = shape_args(2, shape)
  if dtype == DT.i64 or dtype == DT.i32 or dtype == DT.f32 then
    local t = wrap_new(dtype, nd, sh, 2)
    local ct = dtype == DT.i64 and "int64_t*" or dtype == DT.i32 and "int32_t*" or "float*"
    local p = ffi.cast(ct, t.data)
    for i = 1, n do p[i - 1] = flat[i] end
    return t
  end
  local f = wrap_new(DT.f32, nd, sh, 2)
  local p = ffi.cast("float*", f.data)
  for i = 1, n do p[i - 1] = flat[i] end
  local t = wrap_new(dtype, nd, sh, 2)
  check(C.tide_tensor_copy(t, f), 2)
  return t
end

-- Wrap memory Lua owns (an ffi array or a string kept alive by the caller):
-- tide.from_pointer(ptr, dtype, shape, keepalive). The tensor keeps
-- `keepalive` referenced through a side table, and so do its views (the C
-- storage of such a tensor cannot hold Lua memory alive by itself).
local keep = setmetatable({}, { __mode = "k" })
M._keep = keep   -- for wrappers of C objects that take such a tensor (tide.quant)
function M.from_pointer(ptr, dtype, shape, keepalive)
  local nd, sh = shape_args(2, shape)
  local t = Tensor()
  check(C.tide_tensor_wrap(t, ffi.cast("void*", ptr), dtype_id(dtype, 2), nd, sh, nil, nil), 2)
  if keepalive ~= nil then keep[t] = keepalive end
  return t
end

-- Load a whole raw file as a read-only mmap'd tensor of `dtype` and `shape`.
function M.mmap(path, dtype, shape, offset)
  local st = ffi.new("tide_storage*[1]")
  local rc = C.tide_storage_mmap(st, path)
  if rc < 0 then return nil, tffi.last_error() end
  local nd, sh = shape_args(2, shape)
  local t = Tensor()
  rc = C.tide_tensor_from_storage(t, st[0], offset or 0, dtype_id(dtype, 2), nd, sh)
  C.tide_storage_release(st[0])
  if rc < 0 then return nil, tffi.last_error() end
  return t
end

-- ---- queries ----
function methods:dim() return self.ndim end
function methods:numel() return tonumber(C.tide_tensor_numel(self)) end
function methods:dtype_name() return DTYPES[self.dtype + 1] end
methods.type = methods.dtype_name
function methods:is_contiguous() return C.tide_tensor_is_contiguous(self) == 1 end
function methods:nbytes() return tonumber(C.tide_tensor_nbytes(self)) end

function methods:shape()
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.sizes[i]) end
  return s
end

-- t:size() -> shape table; t:size(d) -> size of dim d (0-based)
function methods:size(d)
  if d == nil then return self:shape() end
  if d < 0 then d = d + self.ndim end
  if d < 0 or d >= self.ndim then error("dim " .. d .. " out of range for a " .. self.ndim .. "-d tensor", 2) end
  return tonumber(self.sizes[d])
end

-- t:stride() -> table of strides (elements); t:stride(d) -> stride of dim d
function methods:stride(d)
  if d ~= nil then
    if d < 0 then d = d + self.ndim end
    if d < 0 or d >= self.ndim then error("dim " .. d .. " out of range for a " .. self.ndim .. "-d tensor", 2) end
    return tonumber(self.strides[d])
  end
  local s = {}
  for i = 0, self.ndim - 1 do s[i + 1] = tonumber(self.strides[i]) end
  return s
end

-- A typed pointer to element 0 (e.g. t:ptr("float*")); default from dtype.
local PTR = { [0] = "float*", "uint16_t*", "uint16_t*", "uint8_t*", "uint8_t*", "uint8_t*", "int8_t*", "uint8_t*",
  "int32_t*", "int64_t*" }
function methods:ptr(ct) return ffi.cast(ct or PTR[self.dtype], self.data) end

local function norm_dim(t, d, level)
  if type(d) ~= "number" then error("dim must be a number", level + 1) end
  if d < 0 then d = d + t.ndim end
  return d
end

-- ---- views ----
function methods:narrow(dim, start, len)
  local v = Tensor()
  check(C.tide_tensor_narrow(v, self, norm_dim(self, dim, 2), start, len), 2)
  if keep[self] ~= nil then keep[v] = keep[self] end
  return v
end

function methods:select(dim, index)
  local v = Tensor()
  dim = norm_dim(self, dim, 2)
  if index < 0 and dim < self.ndim then index = index + tonumber(self.sizes[dim]) end
  check(C.tide_tensor_select(v, self, dim, index), 2)
  if keep[self] ~= nil then keep[v] = keep[self] end
  return v
end

function methods:transpose(d0, d1)
  local v = Tensor()
  check(C.tide_tensor_transpose(v, self, norm_dim(self, d0 or 0, 2), norm_dim(self, d1 or 1, 2)), 2)
  if keep[self] ~= nil then keep[v] = keep[self] end
  return v
end
function methods:t()
  if self.ndim ~= 2 then error("t() needs a 2-d tensor, got " .. self.ndim .. "-d", 2) end
  return self:transpose(0, 1)
end

function methods:reshape(...)
  local n = select("#", ...)
  local dims = { ... }
  if n == 1 and type(dims[1]) == "table" then dims = dims[1]; n = #dims end
  if n > 4 then error("tensors have at most 4 dims", 2) end
  local sh = i64x4()
  for i = 1, n do sh[i - 1] = dims[i] end
  local v = Tensor()
  check(C.tide_tensor_reshape(v, self, n, sh), 2)
  if keep[self] ~= nil then keep[v] = keep[self] end
  return v
end
methods.view = methods.reshape

function methods:view_dtype(dtype)
  local v = Tensor()
  check(C.tide_tensor_view_dtype(v, self, dtype_id(dtype, 2)), 2)
  if keep[self] ~= nil then keep[v] = keep[self] end
  return v
end

-- ---- data ----
function methods:clone(dtype)
  local v = Tensor()
  check(C.tide_tensor_clone(v, self, dtype and dtype_id(dtype, 2) or -1), 2)
  return v
end
function methods:contiguous()
  if C.tide_tensor_is_contiguous(self) == 1 then return self end
  return self:clone()
end
-- A copy in `dtype` (the tensor itself when it already has that dtype).
function methods:to(dtype)
  local d = dtype_id(dtype, 2)
  if d == self.dtype then return self end
  return self:clone(d)
end
function methods:copy(src)
  if type(src) == "table" then src = M.tensor(src) end
  check(C.tide_tensor_copy(self, src), 2)
  return self
end
function methods:fill(v) check(C.tide_tensor_fill(self, v), 2) return self end
function methods:zero() return self:fill(0) end
function methods:normal(seed, mean, std)
  check(C.tide_tensor_rand(self, seed or next_seed(), C.TIDE_RAND_NORMAL, mean or 0, std or 1), 2)
  return self
end
function methods:uniform(seed, lo, hi)
  check(C.tide_tensor_rand(self, seed or next_seed(), C.TIDE_RAND_UNIFORM, lo or 0, hi or 1), 2)
  return self
end

-- t:get(i, j, ...) -> number (0-based indices)
function methods:get(...)
  local n = select("#", ...)
  if n ~= self.ndim then error("get needs " .. self.ndim .. " indices, got " .. n, 2) end
  for i = 1, n do idxbuf[i - 1] = (select(i, ...)) end
  check(C.tide_tensor_get(self, idxbuf, dblbox), 2)
  return dblbox[0]
end
-- t:set(i, j, ..., value)
function methods:set(...)
  local n = select("#", ...) - 1
  if n ~= self.ndim then error("set needs " .. self.ndim .. " indices and a value", 2) end
  for i = 1, n do idxbuf[i - 1] = (select(i, ...)) end
  check(C.tide_tensor_set(self, idxbuf, (select(n + 1, ...))), 2)
  return self
end

function methods:item()
  if C.tide_tensor_numel(self) ~= 1 then error("item() needs a one-element tensor", 2) end
  for i = 0, 3 do idxbuf[i] = 0 end
  check(C.tide_tensor_get(self, idxbuf, dblbox), 2)
  return dblbox[0]
end

-- Nested Lua table of numbers (i64 values come back as Lua numbers).
function methods:totable()
  local nd = self.ndim
  if nd == 0 then return self:item() end
  local isint = self.dtype == DT.i64 or self.dtype == DT.i32 or self.dtype == DT.i8 or self.dtype == DT.u8
  local c = self:clone(isint and "i64" or "f32")
  local p = ffi.cast(isint and "int64_t*" or "float*", c.data)
  local sh = self:shape()
  local pos = 0
  local function build(d)
    local r = {}
    if d == nd then
      for i = 1, sh[d] do r[i] = tonumber(p[pos]); pos = pos + 1 end
    else
      for i = 1, sh[d] do r[i] = build(d + 1) end
    end
    return r
  end
  return build(1)
end

-- ---- small ops ----
local function out_like(t, dtype, level)
  local nd = t.ndim
  return wrap_new(dtype, nd, t.sizes, level + 1)
end

function methods:argmax()
  if self.ndim < 1 then error("argmax needs at least 1 dim", 2) end
  local out = wrap_new(DT.i64, math.max(self.ndim - 1, 0), self.sizes, 2)
  check(C.tide_tensor_argmax(out, self), 2)
  if self.ndim == 1 then return tonumber(ffi.cast("int64_t*", out.data)[0]) end
  return out
end

-- values (f32), indices (i64) of the k largest along the last dim, descending,
-- ties to the smaller index.
function methods:topk(k)
  if self.ndim < 1 then error("topk needs at least 1 dim", 2) end
  local sh = i64x4()
  for i = 0, self.ndim - 2 do sh[i] = self.sizes[i] end
  sh[self.ndim - 1] = k
  local v = wrap_new(DT.f32, self.ndim, sh, 2)
  local ix = wrap_new(DT.i64, self.ndim, sh, 2)
  check(C.tide_tensor_topk(v, ix, self, k), 2)
  return v, ix
end

function methods:softmax()
  local out = out_like(self, DT.f32, 2)
  check(C.tide_tensor_softmax(out, self), 2)
  return out
end

local OPS = { add = 0, sub = 1, mul = 2, div = 3 }
local function binary(a, b, op, level)
  if not is_tensor(a) then
    -- number (op) tensor
    if op == OPS.add then return binary(b, a, op, level + 1) end
    if op == OPS.mul then return binary(b, a, op, level + 1) end
    local out = out_like(b, b.dtype, level + 1)
    if op == OPS.sub then check(C.tide_tensor_affine(out, b, -1, a), level + 1) return out end
    check(C.tide_tensor_binary(out, M.full(b:shape(), a, "f32"), b, op), level + 1)
    return out
  end
  local out = out_like(a, a.dtype, level + 1)
  if type(b) == "number" then
    if op == OPS.add then check(C.tide_tensor_affine(out, a, 1, b), level + 1)
    elseif op == OPS.sub then check(C.tide_tensor_affine(out, a, 1, -b), level + 1)
    elseif op == OPS.mul then check(C.tide_tensor_affine(out, a, b, 0), level + 1)
    else check(C.tide_tensor_affine(out, a, 1 / b, 0), level + 1) end
    return out
  end
  if not is_tensor(b) then error("cannot combine a tensor with a " .. type(b), level + 1) end
  check(C.tide_tensor_binary(out, a, b, op), level + 1)
  return out
end

function methods:add(b) return (binary(self, b, OPS.add, 2)) end
function methods:sub(b) return (binary(self, b, OPS.sub, 2)) end
function methods:mul(b) return (binary(self, b, OPS.mul, 2)) end
function methods:div(b) return (binary(self, b, OPS.div, 2)) end
function methods:scale(alpha) return (binary(self, alpha, OPS.mul, 2)) end
-- in place
function methods:add_(b)
  if type(b) == "number" then check(C.tide_tensor_affine(self, self, 1, b), 2)
  else check(C.tide_tensor_binary(self, self, b, OPS.add), 2) end
  return self
end
function methods:mul_(b)
  if type(b) == "number" then check(C.tide_tensor_affine(self, self, b, 0), 2)
  else check(C.tide_tensor_binary(self, self, b, OPS.mul), 2) end
  return self
end

function methods:sum()
  check(C.tide_tensor_sum(self, dblbox), 2)
  return dblbox[0]
end
function methods:mean()
  local n = tonumber(C.tide_tensor_numel(self))
  return n > 0 and self:sum() / n or 0 / 0
end

-- Compare self (tested) with ref: returns a table {max_abs, max_rel, nmse,
-- cosine, max_ulp, n_bad, first_bad, nan_mismatch}.
function methods:compare(ref, rtol, atol)
  check(C.tide_tensor_compare(self, ref, rtol or 1e-5, atol or 1e-8, cmpbox), 2)
  return {
    max_abs = cmpbox.max_abs, max_rel = cmpbox.max_rel, nmse = cmpbox.nmse, cosine = cmpbox.cosine,
    max_ulp = cmpbox.max_ulp, n_bad = tonumber(cmpbox.n_bad), first_bad = tonumber(cmpbox.first_bad),
    nan_mismatch = tonumber(cmpbox.n_nan_mismatch),
  }
end
function methods:allclose(ref, rtol, atol)
  local s = methods.compare(self, ref, rtol, atol)
  return s.n_bad == 0, s
end
function methods:nmse(ref) return methods.compare(self, ref).nmse end
function methods:max_ulp(ref) return methods.compare(self, ref).max_ulp end

-- ---- printing (torch7 style: elided middle, dtype and shape footer) ----
-- One format for all the values shown: integers when every finite value
-- is one, else fixed point, or scientific when magnitudes call for it (the
-- rule numpy uses: max >= 1e8, min nonzero < 1e-4, or a ratio over 1e3).
local function special(v, w)
  local s = v ~= v and "nan" or (v > 0 and "inf" or "-inf")
  return string.rep(" ", math.max(w - #s, 0)) .. s
end
local function fmt_for(vals, isint)
  local mx, mn = 0, math.huge
  local allint, odd = true, false
  for _, v in ipairs(vals) do
    if v ~= v or math.abs(v) == math.huge then
      odd = true
    else
      local a = math.abs(v)
      if a > mx then mx = a end
      if a > 0 and a < mn then mn = a end
      if v ~= math.floor(v) then allint = false end
    end
  end
  if isint or (allint and mx < 1e9) then
    local w = math.max(#string.format("%d", mx) + 2, odd and 5 or 0)
    local f = "%" .. w .. "d"
    return function(v)
      if v ~= v or math.abs(v) == math.huge then return special(v, w) end
      return string.format(f, v)
    end
  end
  local sci = mx >= 1e8 or (mn < math.huge and (mn < 1e-4 or mx / mn > 1e3))
  local f, w = sci and "%11.4e" or "%10.4f", sci and 11 or 10
  return function(v)
    if v ~= v or math.abs(v) == math.huge then return special(v, w) end
    return string.format(f, v)
  end
end

local EDGE = 3
local function pick(n)
  -- indices to show along a dim of size n, with false marking the gap
  if n <= 2 * EDGE + 2 then
    local r = {}
    for i = 0, n - 1 do r[#r + 1] = i end
    return r
  end
  local r = {}
  for i = 0, EDGE - 1 do r[#r + 1] = i end
  r[#r + 1] = false
  for i = n - EDGE, n - 1 do r[#r + 1] = i end
  return r
end

local function get_at(t, idx)
  for i = 0, 3 do idxbuf[i] = idx[i + 1] or 0 end
  C.tide_tensor_get(t, idxbuf, dblbox)
  return dblbox[0]
end

local function matrix_lines(t, prefix, lines)
  -- t viewed as 2-d via prefix indices; last two dims printed
  local nd = t.ndim
  local rows = nd >= 2 and tonumber(t.sizes[nd - 2]) or 1
  local cols = tonumber(t.sizes[nd - 1])
  local rsel, csel = pick(rows), (cols > 12 and pick(cols) or pick(cols))
  local vals = {}
  local function idx(r, c)
    local ix = {}
    for i = 1, #prefix do ix[i] = prefix[i] end
    if nd >= 2 then ix[#ix + 1] = r end
    ix[#ix + 1] = c
    return ix
  end
  for _, r in ipairs(rsel) do
    if r then for _, c in ipairs(csel) do if c then vals[#vals + 1] = get_at(t, idx(r, c)) end end end
  end
  local isint = t.dtype > DT.fp4 -- the integer dtypes follow the float ones
  local f = fmt_for(vals, isint)
  for _, r in ipairs(rsel) do
    if not r then
      lines[#lines + 1] = " ..."
    else
      local parts = {}
      for _, c in ipairs(csel) do parts[#parts + 1] = c and f(get_at(t, idx(r, c))) or " ..." end
      lines[#lines + 1] = table.concat(parts, " ")
    end
  end
end

function M.format(t)
  if t.storage == nil then return "[tide.Tensor (empty header)]" end
  local nd = t.ndim
  local lines = {}
  local shape = t:shape()
  local numel = tonumber(C.tide_tensor_numel(t))
  if nd == 0 then
    lines[1] = tostring(get_at(t, {}))
  elseif numel == 0 then
    lines[1] = "(no elements)"
  elseif nd <= 2 then
    matrix_lines(t, {}, lines)
  else
    -- iterate over leading dims, eliding the middle of each
    local lead = {}
    for d = 1, nd - 2 do lead[d] = pick(shape[d]) end
    local function rec(d, prefix)
      if d > nd - 2 then
        local hdr = {}
        for i = 1, #prefix do hdr[i] = tostring(prefix[i]) end
        lines[#lines + 1] = "(" .. table.concat(hdr, ",") .. ",.,.) ="
        matrix_lines(t, prefix, lines)
        lines[#lines + 1] = ""
        return
      end
      for _, i in ipairs(lead[d]) do
        if not i then
          lines[#lines + 1] = "(...)"
          lines[#lines + 1] = ""
        else
          prefix[#prefix + 1] = i
          rec(d + 1, prefix)
          prefix[#prefix] = nil
        end
      end
    end
    rec(1, {})
  end
  local dims = {}
  for i = 1, nd do dims[i] = tostring(shape[i]) end
  local extra = ""
  if C.tide_tensor_is_contiguous(t) ~= 1 then extra = extra .. ", strided" end
  if t.readonly ~= 0 then extra = extra .. ", read-only" end
  lines[#lines + 1] = string.format("[tide.Tensor %s of size %s%s]", DTYPES[t.dtype + 1],
    nd == 0 and "scalar" or table.concat(dims, "x"), extra)
  return table.concat(lines, "\n")
end

-- ---- metatable ----
mt.__index = function(t, k)
  if type(k) == "number" then
    if t.ndim == 1 then
      if k < 0 then k = k + tonumber(t.sizes[0]) end
      idxbuf[0] = k
      check(C.tide_tensor_get(t, idxbuf, dblbox), 2)
      return dblbox[0]
    end
    return methods.select(t, 0, k)
  end
  return methods[k]
end

mt.__newindex = function(t, k, v)
  if type(k) ~= "number" then error("cannot set field '" .. tostring(k) .. "' of a tensor", 2) end
  if t.ndim == 1 then
    if k < 0 then k = k + tonumber(t.sizes[0]) end
    idxbuf[0] = k
    check(C.tide_tensor_set(t, idxbuf, v), 2)
    return
  end
  local row = methods.select(t, 0, k)
  if type(v) == "number" then check(C.tide_tensor_fill(row, v), 2)
  else methods.copy(row, v) end
end

mt.__len = function(t) return t.ndim > 0 and tonumber(t.sizes[0]) or 1 end
mt.__tostring = M.format
mt.__gc = C.tide_tensor_release
mt.__add = function(a, b) return (binary(a, b, OPS.add, 2)) end
mt.__sub = function(a, b) return (binary(a, b, OPS.sub, 2)) end
mt.__mul = function(a, b) return (binary(a, b, OPS.mul, 2)) end
mt.__div = function(a, b) return (binary(a, b, OPS.div, 2)) end
mt.__unm = function(a) return (binary(a, -1, OPS.mul, 2)) end

M.methods = methods

-- y = x . w^T through the linear-layer entry point (w is [N, K]).
function M.linear(x, w, backend)
  local nd = x.ndim
  local sh = i64x4()
  for i = 0, nd - 1 do sh[i] = x.sizes[i] end
  sh[nd - 1] = w.sizes[0]
  local y = wrap_new(DT.f32, nd, sh, 2)
  check(C.tide_matmul(y, x, w, backend or 0), 2)
  return y
end

-- a @ b for 2-d tensors (a [M, K], b [K, N]), through the linear entry point.
function M.matmul(a, b, backend)
  if a.ndim ~= 2 or b.ndim ~= 2 then error("matmul needs 2-d tensors", 2) end
  if a.sizes[1] ~= b.sizes[0] then
    error(string.format("matmul: inner sizes differ (%d vs %d)", tonumber(a.sizes[1]), tonumber(b.sizes[0])), 2)
  end
  local wt = b:t():clone(b.dtype == DT.f32 and "f32" or DT.f32)
  local y = wrap_new(DT.f32, 2, i64x4(a.sizes[0], b.sizes[1]), 2)
  check(C.tide_matmul(y, a, wt, backend or 0), 2)
  return y
end
methods.matmul = M.matmul

return M
