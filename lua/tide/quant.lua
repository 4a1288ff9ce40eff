-- tide.quant: quantised weights from Lua - dequantisation to f32 and
-- linear-layer handles (y = x . W^T) over f32, bf16, f16, FP8 and MXFP4
-- weights, with the grouped and batched forms. Every heavy step is one C
-- call; the weights are referenced by C, never copied.
--   local q = tide.quant
--   local lin = q.linear(w, scale)            -- scale only for FP8 / MXFP4
--   local y = lin:forward(x, { round_bf16 = true })
--   local z = lin:grouped(u, 8)                -- wo_a: 8 groups
--   q.forward_many({ { lin1, x, y1 }, { lin3, x, y3 } })
--   local f = q.dequant(w, scale, 0, 16)       -- rows 0..15 as f32
local tffi = require("tide.ffi")
local tensor = require("tide.tensor")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}

local FORMATS = { [0] = "f32", "bf16", "f16", "fp8", "mxfp4" }
M.formats = FORMATS
local BACKENDS = { auto = 0, ref = 1, avx2 = 2, dnnl = 3 }
local POLICIES = { invariant = 0, fast = 1, q8 = 2 }
local POLICY_NAMES = { [0] = "invariant", "fast", "q8" }

local i64box = ffi.new("int64_t[2]")
local intbox = ffi.new("int[1]")
local job_ct = ffi.typeof("tide_linear_job[?]")
local jobs_buf, jobs_cap = nil, 0

local Linear = {}
Linear.__index = Linear
M.Linear = Linear

local function flags_of(opts, level)
  if opts == nil then return 0 end
  if type(opts) ~= "table" then error("options must be a table", level + 1) end
  local f = 0
  if opts.round_bf16 then f = f + C.TIDE_LINEAR_ROUND_BF16 end
  if opts.accumulate then f = f + C.TIDE_LINEAR_ACCUMULATE end
  return f
end

local function shape_str(t)
  local d = {}
  for i = 0, t.ndim - 1 do d[#d + 1] = tostring(tonumber(t.sizes[i])) end
  return "[" .. table.concat(d, ", ") .. "]"
end

local function need_tensor(x, what, level)
  if not tensor.is_tensor(x) then error(what .. " must be a tide tensor", level + 1) end
end

-- A linear-layer handle over w (and scale for FP8 / MXFP4).
function M.linear(w, scale)
  need_tensor(w, "w", 2)
  if scale ~= nil then need_tensor(scale, "scale", 2) end
  local box = ffi.new("tide_linear*[1]")
  check(C.tide_linear_new(box, w, scale), 2)
  -- the handle references w's storage; Lua memory under a from_pointer
  -- tensor stays alive through the tensor's keepalive
  local self = setmetatable({ ptr = ffi.gc(box[0], C.tide_linear_free),
    _keep = tensor._keep[w], _keep_s = scale ~= nil and tensor._keep[scale] or nil }, Linear)
  check(C.tide_linear_info(self.ptr, i64box, i64box + 1, intbox), 2)
  self.n, self.k, self.format = tonumber(i64box[0]), tonumber(i64box[1]), FORMATS[intbox[0]]
  self.bytes = tonumber(C.tide_linear_weight_bytes(self.ptr))
  return self
end

local function live(self, level)
  if not self.ptr then error("linear handle is closed", level + 1) end
  return self.ptr
end

-- y = x . W^T. x: f32/bf16 [M, K] or [K]; opts.out: a preallocated y (f32
-- or bf16, [M, N]); opts.round_bf16, opts.accumulate (into opts.out);
-- opts.backend = "auto" (default, the handle's policy), "ref", "avx2", "dnnl".
function Linear:forward(x, opts)
  local p = live(self, 2)
  need_tensor(x, "x", 2)
  local y = opts and opts.out
  if y == nil then
    if opts and opts.accumulate then error("accumulate needs opts.out", 2) end
    y = x.ndim == 1 and tensor.zeros(self.n) or tensor.zeros(tonumber(x.sizes[0]), self.n)
  end
  local flags = flags_of(opts, 2)
  local backend = opts and opts.backend
  if backend == nil or backend == "auto" then
    check(C.tide_linear_forward_ex(p, y, x, flags), 2)
  else
    local b = BACKENDS[backend]
    if not b then error("unknown backend '" .. tostring(backend) .. "' (auto, ref, avx2, dnnl)", 2) end
    if flags ~= 0 then error("output flags need the auto backend", 2) end
    check(C.tide_linear_forward(p, y, x, b), 2)
  end
  return y
end

-- Grouped product (wo_a): W [G*n, k], x [M, G*k] -> y [M, G*n].
function Linear:grouped(x, groups, opts)
  local p = live(self, 2)
  need_tensor(x, "x", 2)
  if type(groups) ~= "number" then error("groups must be a number", 2) end
  local y = opts and opts.out
  if y == nil then
    if opts and opts.accumulate then error("accumulate needs opts.out", 2) end
    y = x.ndim == 1 and tensor.zeros(self.n) or tensor.zeros(tonumber(x.sizes[0]), self.n)
  end
  check(C.tide_linear_forward_grouped(p, y, x, groups, flags_of(opts, 2)), 2)
  return y
end

-- policy() -> "invariant" | "fast" | "q8"; policy(name) sets it (q8: int8
-- activations for MXFP4 weights, opt-in, docs/linear.md).
function Linear:policy(name)
  local p = live(self, 2)
  if name == nil then return POLICY_NAMES[C.tide_linear_get_policy(p)] end
  local v = POLICIES[name]
  if not v then error("unknown policy '" .. tostring(name) .. "' (invariant, fast, q8)", 2) end
  check(C.tide_linear_set_policy(p, v), 2)
  return name
end

function Linear:close()
  if self.ptr then
    local p = self.ptr
    self.ptr = nil
    ffi.gc(p, nil)
    C.tide_linear_free(p)
  end
end

Linear.__tostring = function(self)
  if not self.ptr then return "tide.quant.Linear (closed)" end
  return string.format("tide.quant.Linear %s [%d, %d] (%d bytes)", self.format, self.n, self.k, self.bytes)
end

-- Run independent products in one parallel region: jobs = { {lin, x, y}, ... }
-- with x f32 [m, K] and y f32 [m, N] (rows contiguous). opts.round_bf16 /
-- opts.accumulate apply to every job.
function M.forward_many(jobs, opts)
  if type(jobs) ~= "table" then error("jobs must be a list of {linear, x, y}", 2) end
  local n = #jobs
  if n > jobs_cap then
    jobs_cap = math.max(n, 2 * jobs_cap, 16)
    jobs_buf = job_ct(jobs_cap)
  end
  for i = 1, n do
    local j = jobs[i]
    local lin, x, y = j[1], j[2], j[3]
    if getmetatable(lin) ~= Linear then error("job " .. i .. ": not a tide.quant.Linear", 2) end
    need_tensor(x, "job " .. i .. " x", 2)
    need_tensor(y, "job " .. i .. " y", 2)
    if x.dtype ~= 0 or y.dtype ~= 0 then error("job " .. i .. ": x and y must be f32", 2) end
    local m = x.ndim == 2 and x.sizes[0] or 1
    local ym = y.ndim == 2 and y.sizes[0] or 1
    if x.sizes[x.ndim - 1] ~= lin.k or y.sizes[y.ndim - 1] ~= lin.n or m ~= ym then
      error(string.format("job %d: x %s, y %s do not fit a weight of N=%d x K=%d", i, shape_str(x),
        shape_str(y), lin.n, lin.k), 2)
    end
    if x.strides[x.ndim - 1] ~= 1 or y.strides[y.ndim - 1] ~= 1 then
      error("job " .. i .. ": x and y rows must be contiguous", 2)
    end
    local q = jobs_buf[i - 1]
    q.l = live(lin, 2)
    q.x = x.data
    q.ldx = x.ndim == 2 and x.strides[0] or lin.k
    q.y = y.data
    q.ldy = y.ndim == 2 and y.strides[0] or lin.n
    q.m = m
  end
  check(C.tide_linear_forward_many(jobs_buf, n, flags_of(opts, 2)), 2)
  -- the tensors were only borrowed for the call
  for i = 1, n do jobs_buf[i - 1].x, jobs_buf[i - 1].y = nil, nil end
end

-- f32 copy of rows [row0, row0 + nrows) of w (default: all rows), any
-- format tide_dequant takes (scale for FP8 / MXFP4).
function M.dequant(w, scale, row0, nrows)
  need_tensor(w, "w", 2)
  if scale ~= nil then need_tensor(scale, "scale", 2) end
  row0 = row0 or 0
  local last = w.ndim > 0 and tonumber(w.sizes[w.ndim - 1]) or 1
  local k = last
  local dt = tensor.dtype_name(w.dtype)
  if dt == "i8" or dt == "u8" then k = 2 * last end
  local rows = last > 0 and math.floor(w:numel() / last) or 0
  nrows = nrows or (rows - row0)
  if nrows < 0 then error(string.format("row0 = %d beyond the %d rows", row0, rows), 2) end
  local out = tensor.zeros(nrows, k)
  check(C.tide_dequant(out, w, scale, row0), 2)
  return out
end

return M
