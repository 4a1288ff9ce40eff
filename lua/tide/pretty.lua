-- tide.pretty: how the REPL shows values: tensors as torch7 did, tide's
-- objects by their one-line summary (tide.describe), tables nested with
-- sorted keys and a depth/size limit, strings quoted.
local M = {}

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") end

local function fmt(v, depth, seen, indent)
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if t == "cdata" then
    local ok, tensor = pcall(require, "tide.tensor")
    if ok and tensor.is_tensor(v) then return tensor.format(v) end
    local okf, tffi = pcall(require, "tide.ffi")
    if okf and tffi.ffi.istype("tide_kvcache*", v) then return require("tide.describe").cache(v) end
    return tostring(v)
  end
  if t ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] then return "<cycle>" end
  if depth > 3 then return "{...}" end
  -- an object (a table with a metatable) inside another value: its fields
  -- are its business; show that it is there, not its insides
  if mt and depth > 0 then return "{...}" end
  seen[v] = true
  local keys, n = {}, #v
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "number" or ta == "string" then return a < b end
    return tostring(a) < tostring(b)
  end)
  local items = {}
  local limit = 40
  for i = 1, math.min(n, limit) do items[#items + 1] = fmt(v[i], depth + 1, seen, indent .. "  ") end
  if n > limit then items[#items + 1] = "... (" .. n .. " items)" end
  for i, k in ipairs(keys) do
    if i > limit then items[#items + 1] = "... (" .. #keys .. " keys)" break end
    local ks = is_ident(k) and k or ("[" .. fmt(k, depth + 1, seen, indent) .. "]")
    items[#items + 1] = ks .. " = " .. fmt(v[k], depth + 1, seen, indent .. "  ")
  end
  seen[v] = nil
  if #items == 0 then return "{}" end
  local one = "{ " .. table.concat(items, ", ") .. " }"
  if #one <= 78 and not one:find("\n") then return one end
  return "{\n" .. indent .. "  " .. table.concat(items, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

function M.format(v) return fmt(v, 0, {}, "") end

return M
