-- tide.server.json: JSON for the server. Decoding is lua-cjson; encoding is
-- here so that empty arrays stay [] (mark them with json.array) and floats
-- keep float32 precision. Also a UTF-8 check (JSON text must be UTF-8).
local cjson = require("cjson")

local M = { null = cjson.null }

local ARRAY = {}
function M.array(t) return setmetatable(t or {}, ARRAY) end

local function num(v)
  if v ~= v or v == math.huge or v == -math.huge then
    -- JSON has no infinities: a logprob of -inf is written as a very negative number
    return v ~= v and "null" or (v > 0 and "3.4028234663852886e+38" or "-3.4028234663852886e+38")
  end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  return string.format("%.9g", v)
end

local encode
function encode(v, out)
  local ty = type(v)
  if ty == "string" then out[#out + 1] = cjson.encode(v)
  elseif ty == "number" then out[#out + 1] = num(v)
  elseif ty == "boolean" then out[#out + 1] = v and "true" or "false"
  elseif v == nil or v == cjson.null then out[#out + 1] = "null"
  elseif ty == "table" then
    if getmetatable(v) == ARRAY or v[1] ~= nil then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        encode(v[i], out)
      end
      out[#out + 1] = "]"
    else
      out[#out + 1] = "{"
      local first = true
      -- keys in a stable order: the listed ones first (t.__order), then sorted
      local keys = {}
      local order = rawget(v, "__order")
      local seen = {}
      if order then for _, k in ipairs(order) do if v[k] ~= nil then keys[#keys + 1] = k; seen[k] = true end end end
      local rest = {}
      for k in pairs(v) do
        if k ~= "__order" and not seen[k] then rest[#rest + 1] = tostring(k) end
      end
      table.sort(rest)
      for _, k in ipairs(rest) do keys[#keys + 1] = k end
      for _, k in ipairs(keys) do
        if not first then out[#out + 1] = "," end
        first = false
        out[#out + 1] = cjson.encode(k)
        out[#out + 1] = ":"
        encode(v[k], out)
      end
      out[#out + 1] = "}"
    end
  else
    out[#out + 1] = cjson.encode(tostring(v))
  end
end

function M.encode(v)
  local out = {}
  encode(v, out)
  return table.concat(out)
end

-- decode(text) -> value, or nil, message.
function M.decode(s)
  local ok, v = pcall(cjson.decode, s)
  if not ok then return nil, (tostring(v):gsub("^Expected", "expected")) end
  return v
end

-- Is s valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF)?
-- Every valid multi-byte sequence is replaced by an ASCII byte (so pieces
-- never join), then any byte >= 0x80 left over is an error.
local PATTERNS = {
  "\240[\144-\191][\128-\191][\128-\191]", "[\241-\243][\128-\191][\128-\191][\128-\191]",
  "\244[\128-\143][\128-\191][\128-\191]",
  "\224[\160-\191][\128-\191]", "[\225-\236][\128-\191][\128-\191]", "\237[\128-\159][\128-\191]",
  "[\238-\239][\128-\191][\128-\191]",
  "[\194-\223][\128-\191]",
}
function M.valid_utf8(s)
  if not s:find("[\128-\255]") then return true end
  for _, p in ipairs(PATTERNS) do s = s:gsub(p, "a") end
  return not s:find("[\128-\255]")
end

-- s with each invalid UTF-8 byte replaced by U+FFFD.
function M.sanitize_utf8(s)
  if M.valid_utf8(s) then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local j = s:find("[\128-\255]", i)
    if not j then out[#out + 1] = s:sub(i) break end
    if j > i then out[#out + 1] = s:sub(i, j - 1) end
    local len
    for _, p in ipairs(PATTERNS) do
      local a, b = s:find("^" .. p, j)
      if a then len = b - a + 1 break end
    end
    if len then out[#out + 1] = s:sub(j, j + len - 1); i = j + len
    else out[#out + 1] = "\239\191\189"; i = j + 1 end
  end
  return table.concat(out)
end

return M
