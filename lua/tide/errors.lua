-- tide.errors: error messages as users see them. A message names the
-- user's input (file, option, token, line, stage) and what was expected; the
-- place inside tide's own Lua where it was raised ("…/lua/tide/model.lua:658:")
-- says nothing to a user and is left out. A position in the user's own file
-- (a sampler or a policy file) is kept, written "FILE, line N:". The full
-- traceback stays available: TIDE_TRACEBACK=1 (or TIDE_DEBUG), or -v /
-- --verbose on a subcommand's command line (sets M.verbose).
local M = {}

M.verbose = false

-- True when the user asked for tracebacks.
function M.traceback_wanted()
  if M.verbose then return true end
  local t = os.getenv("TIDE_TRACEBACK")
  if t and t ~= "" and t ~= "0" then return true end
  return os.getenv("TIDE_DEBUG") ~= nil
end

-- Is this chunk name one of tide's own files (lua/tide/..., scripts/)?
local function internal(path)
  if path:match("lua/tide/") or path:match("^tide/") then return true end
  -- Lua shortens long chunk names to "...tail": tide's own files keep "/tide/" in the tail
  if path:match("^%.%.%.") and path:match("/tide/[%w_/]*%.lua$") then return true end
  if path:match("scripts/[%w_]+%.lua$") then return true end
  return false
end
M.internal = internal

-- A message without tide's internal file:line prefixes and without any
-- traceback. Non-string errors are formatted with tide.pretty.
function M.clean(e)
  if type(e) == "table" and e.tide_user_error then e = e.msg end
  if type(e) ~= "string" then
    local ok, pretty = pcall(require, "tide.pretty")
    e = ok and pretty.format(e) or tostring(e)
  end
  e = e:gsub("\nstack traceback:.*$", "")
  e = e:gsub("([^%s:\"'(]*%.lua):(%d+)(:?)%s*", function(path, line, colon)
    if internal(path) then return colon == ":" and "" or path:match("[^/]*$") end
    return path .. ", line " .. line .. (colon == ":" and ": " or "")
  end)
  e = e:gsub("%[string \"[^\"]*\"%]:%d+:%s*", "")
  -- the C core names its function first ("tide_ckpt_open: ..."): not for users
  e = e:gsub("tide_[%w_]+: ", "")
  -- ... and so do a few of its internal helpers ("open_shard: FILE: ...")
  e = e:gsub("^[%l%d]+_[%l%d_]*: (/)", "%1")
  return e
end

-- A traceback with tide's own frames dropped (what the REPL shows for an
-- error in the user's code): "message\nstack traceback:\n\t(user frames)".
-- With TIDE_TRACEBACK the whole traceback is returned unchanged.
function M.user_traceback(tb)
  if M.traceback_wanted() then return tb end
  local msg, rest = tb:match("^(.-)\nstack traceback:\n(.*)$")
  if not msg then return M.clean(tb) end
  local keep, hidden = {}, 0
  for line in rest:gmatch("[^\n]+") do
    local src = line:match("^%s*([^:]+%.lua):%d+:") or line:match("^%s*(%[C%]):")
    if src and (internal(src) or src == "[C]") then
      hidden = hidden + 1
    else
      keep[#keep + 1] = line
    end
  end
  if hidden > 0 then
    keep[#keep + 1] = string.format("\t(%d frames inside tide; TIDE_TRACEBACK=1 shows them)", hidden)
  end
  return M.clean(msg) .. "\nstack traceback:\n" .. table.concat(keep, "\n")
end

return M
