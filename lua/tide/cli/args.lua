-- tide.cli.args: a small option parser shared by the subcommands.
-- spec = { name = { type = "string"|"number"|"boolean"|"list", default = ..., required = bool, help = "...",
--                   integer = bool, min = N (numbers) }, ... }
-- Options are --name VALUE, --name=VALUE, or --name for booleans (--no-name clears).
-- Every command also takes -h/--help (raises {tide_help = true}: tide.cli
-- prints the command's usage) and -v/--verbose (tracebacks on errors).
-- Unknown options and bad values raise a user error naming the option.
local M = {}

function M.fail(msg, status)
  error({ tide_user_error = true, msg = msg, status = status or 2 }, 0)
end

local function check_number(name, s, n, val)
  if s.integer and n ~= math.floor(n) then
    M.fail("option --" .. name .. " expects a whole number, got '" .. val .. "'")
  end
  if s.min and n < s.min then
    M.fail(string.format("option --%s expects a number >= %s, got '%s'%s", name, tostring(s.min), val,
      s.why_min and (" (" .. s.why_min .. ")") or ""))
  end
end

function M.parse(argv, spec, cmd)
  local out, pos = {}, {}
  for k, s in pairs(spec) do
    if s.default ~= nil then out[k] = s.default end
  end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--" then
      for j = i + 1, #argv do pos[#pos + 1] = argv[j] end
      break
    end
    if a == "--help" or a == "-h" then error({ tide_help = true }, 0) end
    if a == "--verbose" or a == "-v" then
      require("tide.errors").verbose = true
      i = i + 1
      goto continue
    end
    local name, val = a:match("^%-%-([%w%-_]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w%-_]+)$") end
    if name then
      local key = name:gsub("%-", "_")
      local s = spec[key]
      local neg = false
      if not s and key:match("^no_") and spec[key:sub(4)] and spec[key:sub(4)].type == "boolean" then
        key, s, neg = key:sub(4), spec[key:sub(4)], true
      end
      if not s then M.fail((cmd and (cmd .. ": ") or "") .. "unknown option --" .. name) end
      if s.type == "boolean" then
        if val ~= nil then out[key] = (val ~= "0" and val ~= "false" and val ~= "no")
        else out[key] = not neg end
      else
        if val == nil then
          i = i + 1
          val = argv[i]
          if val == nil then
            M.fail("option --" .. name .. " needs a value" .. (s.meta and (" (" .. s.meta .. ")") or ""))
          end
        end
        if s.type == "number" then
          local n = tonumber(val)
          if not n then M.fail("option --" .. name .. " expects a number, got '" .. val .. "'") end
          check_number(name, s, n, val)
          out[key] = n
        elseif s.type == "list" then
          out[key] = out[key] or {}
          if type(out[key]) ~= "table" then out[key] = {} end
          out[key][#out[key] + 1] = val
        else
          out[key] = val
        end
      end
    else
      pos[#pos + 1] = a
    end
    i = i + 1
    ::continue::
  end
  for k, s in pairs(spec) do
    if s.required and out[k] == nil then
      M.fail((cmd and (cmd .. ": ") or "") .. "missing required option --" .. k:gsub("_", "-")
        .. (s.meta and (" " .. s.meta) or "") .. (s.help and (" (" .. s.help .. ")") or ""))
    end
  end
  return out, pos
end

-- One line per option, for usage texts.
function M.help(spec)
  local keys = {}
  for k in pairs(spec) do keys[#keys + 1] = k end
  table.sort(keys)
  local lines = {}
  for _, k in ipairs(keys) do
    local s = spec[k]
    local flag = "--" .. k:gsub("_", "-") .. (s.type ~= "boolean" and (" " .. (s.meta or s.type:upper())) or "")
    local d = s.default ~= nil and (" (default " .. tostring(s.default) .. ")") or ""
    lines[#lines + 1] = string.format("  %-26s %s%s", flag, s.help or "", d)
  end
  return table.concat(lines, "\n")
end

return M
