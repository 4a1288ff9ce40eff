-- tide.probe: read and steer the forward pass from Lua, per request, inside
-- batched steps. A probe is a function attached to one sequence (a step
-- entry, a session, an engine request, or every sequence of a model) at one
-- named point of the forward; it receives a tensor view of that sequence's
-- rows only and may read them, copy them out or change them in place.
--
--   local pr = { at = "resid_moe", layers = { 2, 3 }, fn = function(t, info)
--     -- t: f32 [n, hc, d], rows of positions info.pos0 .. info.pos0 + n - 1
--   end }
--   m:step{ { seq = s, tokens = ids, probes = { pr } } }
--   m:session{ probes = { pr } };  eng:submit{ prompt = "...", probes = { pr } }
--   local h = m:probe(pr)   -- every sequence of every step; h:remove()
--
-- The points are the model family's (net.points; docs/probes.md lists
-- DeepSeek-V4's). A point is writable or read-only: at a read-only point the
-- probe gets a copy, so nothing it does reaches the forward. With no probe
-- attached a step passes one nil test per point and allocates nothing.
--
-- Failure isolation: a probe that raises, returns a tensor of the wrong shape
-- or leaves NaN/infinity in its rows fails its own entry. The step is batched
-- and the cache is written as the layers run, so the step is aborted (the
-- cache goes back to its state before the step, for every sequence) and run
-- again without the failing entries; the others' results are bitwise what
-- they would have been (batch invariance). A probe may therefore be called
-- more than once for the same positions (after another entry's failure, and
-- when an engine request recomputes after preemption): a probe that records
-- should key what it records by position (info.pos0), so a re-run overwrites.
local tffi = require("tide.ffi")
local ffi, C = tffi.ffi, tffi.C
local tensor = require("tide.tensor")

local M = {}

local dbl = ffi.new("double[1]")
local is_tensor = tensor.is_tensor
local NONE = -1          -- the layer key of points that are not per layer

-- ---------------------------------------------------------------- specs
-- Check one probe spec against the model's points; returns the compiled
-- probe { at, layers = set | nil (every layer), fn, name, write }.
local function compile_one(net, p, level)
  if type(p) ~= "table" then error("probe: a probe is a table { at =, fn = [, layers =] }", level) end
  local pts = net.points
  local meta = pts[p.at]
  if not meta then
    local names = {}
    for k in pairs(pts) do names[#names + 1] = k end
    table.sort(names)
    error("probe: unknown point '" .. tostring(p.at) .. "' (points: " .. table.concat(names, ", ") .. ")", level)
  end
  local fn = p.fn
  if type(fn) ~= "function" and not (type(fn) == "table" and getmetatable(fn) and getmetatable(fn).__call) then
    error("probe at " .. p.at .. ": fn must be a function", level)
  end
  local layers = p.layers
  if p.layer ~= nil then layers = { p.layer } end
  local set
  if layers ~= nil then
    if not meta.layered then error("probe at " .. p.at .. ": this point is not per layer (no layers)", level) end
    if type(layers) == "number" then layers = { layers } end
    if type(layers) ~= "table" then error("probe at " .. p.at .. ": layers must be a list of layer indices", level) end
    set = {}
    for _, L in ipairs(layers) do
      if type(L) ~= "number" or L ~= math.floor(L) or L < 0 or L >= net.n_layers then
        error("probe at " .. p.at .. ": layer " .. tostring(L) .. " out of range 0.." .. (net.n_layers - 1), level)
      end
      set[L] = true
    end
  end
  local c = { at = p.at, layers = set, fn = fn, write = meta.write, layered = meta.layered,
    name = p.name or p.at }
  return c
end

-- Compile a list of probe specs (or nil). Raises at `level` on misuse.
function M.compile(model, list, level)
  level = (level or 1) + 1
  if list == nil then return nil end
  if type(list) ~= "table" then error("probes must be a list of probes", level) end
  if list._compiled then return list end
  if list.at ~= nil then list = { list } end
  local out = { _compiled = true }
  for i, p in ipairs(list) do out[i] = compile_one(model.net, p, level + 1) end
  return #out > 0 and out or nil
end

-- ---------------------------------------------------------------- a step's probes
local Probes = {}
Probes.__index = Probes
M.Probes = Probes

local function add(P, pr, sp)
  local byL = P.hooks[pr.at]
  if not byL then byL = {} P.hooks[pr.at] = byL end
  local function put(L)
    local list = byL[L]
    if not list then list = {} byL[L] = list end
    list[#list + 1] = { probe = pr, span = sp }
  end
  if not pr.layered then put(NONE)
  elseif pr.layers then for L in pairs(pr.layers) do put(L) end
  else for L = 0, P.n_layers - 1 do put(L) end end
end

-- Arm a step: st.spans (with .probes, compiled) and `shared` (compiled
-- probes for every entry: the model's own and the step's opts.probes).
-- Sets st.probes, or leaves it nil when no probe is attached anywhere.
function M.arm(model, st, shared)
  local any = shared ~= nil
  if not any then
    for _, sp in ipairs(st.spans) do if sp.probes then any = true break end end
  end
  if not any then return nil end
  local P = setmetatable({ hooks = {}, n_layers = model.net.n_layers, points = model.net.points, st = st,
    failed = nil }, Probes)
  for i, sp in ipairs(st.spans) do
    sp.index = i
    if shared then for _, pr in ipairs(shared) do add(P, pr, sp) end end
    if sp.probes then for _, pr in ipairs(sp.probes) do add(P, pr, sp) end end
  end
  st.probes = P
  return P
end

-- Does any probe watch `point` at layer L? (The family asks before it
-- computes something only a probe needs, such as attention statistics.)
function Probes:wants(point, L)
  local byL = self.hooks[point]
  return byL ~= nil and byL[L or NONE] ~= nil
end

local function finite(t)
  if C.tide_tensor_sum(t, dbl) ~= 0 then return true end
  local s = dbl[0]
  return s == s and s ~= math.huge and s ~= -math.huge
end

local function shape_str(t)
  local p = {}
  for d = 0, t.ndim - 1 do p[#p + 1] = tostring(t:size(d)) end
  return "[" .. table.concat(p, ", ") .. "]"
end

local FAIL = setmetatable({}, { __tostring = function() return "probe failed" end })
M.FAIL = FAIL

-- Record that `sp`'s probe failed and abort the forward.
function Probes:fail(sp, pr, L, msg)
  self.failed = self.failed or {}
  local where = pr.name .. (pr.layered and (" at layer " .. tostring(L)) or "")
  self.failed[sp.index] = string.format("probe %s (positions %d..%d) %s", where, sp.pos0, sp.pos0 + sp.n - 1, msg)
  error(FAIL, 0)
end

-- Run the probes of `point` at layer L (nil for points that are not per
-- layer) over buf, a [T, ...] buffer of the step (or false: nothing to
-- show, e.g. no indexer selection). aux / auxname: a second [T, ...] buffer
-- handed to the probe as a copy in info[auxname]. Rows are the entry's
-- tokens (first .. first + n - 1), or for the "logits" point the entry's
-- logits rows (sp.lfirst, sp.lrows).
function Probes:fire(point, L, buf, aux, auxname)
  local byL = self.hooks[point]
  if not byL then return end
  local list = byL[L or NONE]
  if not list then return end
  local logits = point == "logits"
  for k = 1, #list do
    local h = list[k]
    local pr, sp = h.probe, h.span
    local first, n, pos0 = sp.first, sp.n, sp.pos0
    if logits then
      first, n = sp.lfirst, sp.lrows
      if sp.want ~= "all" then pos0 = sp.pos0 + sp.n - 1 end
    end
    if n and n > 0 then
      local rows = buf and buf:narrow(0, first, n) or false
      if rows and not pr.write then rows = rows:clone() end
      local info = { point = point, layer = L, seq = sp.seq, entry = sp.index, pos0 = pos0, n = n, row = first,
        want = sp.want, ids = self.st.ids_t:narrow(0, sp.first, sp.n) }
      if aux then info[auxname] = aux:narrow(0, first, n):clone() end
      local was_finite = pr.write and rows and rows.dtype == 0 and finite(rows)
      local ok, ret = pcall(pr.fn, rows, info)
      if not ok then self:fail(sp, pr, L, "raised: " .. tostring(ret)) end
      if ret ~= nil then
        if not pr.write then
          self:fail(sp, pr, L, "returned a value at the read-only point " .. point)
        end
        if not is_tensor(ret) or not rows or ret.ndim ~= rows.ndim or ret:numel() ~= rows:numel() then
          self:fail(sp, pr, L, "returned " .. (is_tensor(ret) and ("a tensor of shape " .. shape_str(ret)) or
            type(ret)) .. "; the point's rows are " .. (rows and shape_str(rows) or "absent"))
        end
        for d = 0, rows.ndim - 1 do
          if ret:size(d) ~= rows:size(d) then
            self:fail(sp, pr, L, "returned a tensor of shape " .. shape_str(ret) .. "; the point's rows are "
              .. shape_str(rows))
          end
        end
        if C.tide_tensor_copy(rows, ret) ~= 0 then self:fail(sp, pr, L, "returned a tensor tide cannot copy") end
      end
      if was_finite and not finite(rows) then
        self:fail(sp, pr, L, "wrote NaN or infinity at " .. point)
      end
    end
  end
end

-- ---------------------------------------------------------------- helpers for probes
-- Add alpha * vec (f32 [d], or [hc, d] for the residual streams) to every
-- row of t (f32 [n, ...]): one C call per row.
function M.add_rows(t, vec, alpha)
  local n = t:size(0)
  local v = vec
  if alpha and alpha ~= 1 then v = vec:scale(alpha) end
  local row_numel = t:numel() / math.max(n, 1)
  if v:numel() ~= row_numel then
    error(string.format("add_rows: the vector has %d elements, a row has %d", v:numel(), row_numel), 2)
  end
  local dims = {}
  for d = 1, t.ndim - 1 do dims[d] = t:size(d) end
  v = v:reshape(dims)
  for i = 0, n - 1 do t[i]:add_(v) end
  return t
end

return M
