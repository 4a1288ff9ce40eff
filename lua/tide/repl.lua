-- tide.repl: the interactive session `tide` starts with no arguments.
-- Line editing, history and completion come from libedit (tide.lineedit);
-- chunks may span lines; `=expr` and bare expressions print their values;
-- errors print a traceback and the session goes on; `$ cmd` runs a shell
-- command. `tide` is a global.
local M = {}

local pretty = require("tide.pretty")

local function history_file()
  local h = os.getenv("TIDE_HISTORY")
  if h then return h ~= "" and h or nil end
  local home = os.getenv("HOME")
  return home and (home .. "/.tide_history") or nil
end

-- Completion candidates for the word before the cursor: globals, or the
-- fields/methods of the value the dotted prefix names.
local function completer(env)
  local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }
  return function(word)
    local prefix, sep, partial = word:match("^(.-)([%.:])([%w_]*)$")
    local out, seen = {}, {}
    local function add(k, suffix)
      if type(k) == "string" and k:match("^[%a_][%w_]*$") and not seen[k] then
        local key = (prefix and (prefix .. sep) or "") .. k
        if key:sub(1, #word) == word then
          seen[k] = true
          out[#out + 1] = key .. (suffix or "")
        end
      end
    end
    local function fields(v, depth)
      depth = depth or 0
      if depth > 3 then return end
      if type(v) == "table" then
        for k, x in pairs(v) do add(k, type(x) == "function" and (sep == ":" and "(" or nil) or nil) end
        local mt = getmetatable(v)
        if mt and type(mt.__index) == "table" then fields(mt.__index, depth + 1) end
        if mt and mt.__index and type(v._lazy) == "table" then
          for k in pairs(v._lazy) do add(k) end
        end
      elseif type(v) == "cdata" then
        local ok, tensor = pcall(require, "tide.tensor")
        if ok and tensor.is_tensor(v) then
          for k in pairs(tensor.methods) do add(k, sep == ":" and "(" or nil) end
          for _, k in ipairs({ "data", "storage", "sizes", "strides", "ndim", "dtype" }) do if sep == "." then add(k) end end
        end
      elseif type(v) == "string" then
        for k in pairs(string) do add(k, "(") end
      end
    end
    if prefix then
      local v = env
      for part in prefix:gmatch("[^%.:]+") do
        if type(v) ~= "table" and type(v) ~= "cdata" then v = nil break end
        local ok, x = pcall(function() return v[part] end)
        v = ok and x or nil
        if v == nil then break end
      end
      if v ~= nil then fields(v) end
    else
      for k in pairs(env) do add(k) end
      local mt = getmetatable(env)
      if mt and type(mt.__index) == "table" then for k in pairs(mt.__index) do add(k) end end
      for _, k in ipairs(KEYWORDS) do add(k) end
    end
    table.sort(out)
    return out
  end
end

-- Compile `src` as an expression first (so `1+1` prints 2), then as a
-- statement. Returns chunk, or nil + err, incomplete(bool).
local function compile(src)
  local expr = src:match("^%s*=(.*)$")
  if expr then src = "return " .. expr end
  -- the identity wrapper keeps every value and avoids a tail call, so an
  -- error raised by the expression still knows its line
  local f = loadstring("return (function(...) return ... end)(" .. src .. "\n)", "=stdin")
  if f then return f end
  local g, err = loadstring(src, "=stdin")
  if g then return g end
  if err and (err:match("<eof>") or err:match("unfinished long")) then return nil, err, true end
  return nil, err, false
end

local function print_results(n, ...)
  if n == 0 then return end
  local parts = {}
  for i = 1, n do parts[i] = pretty.format((select(i, ...))) end
  io.write(table.concat(parts, "\t"), "\n")
end

-- eval_line(env, src) -> ok, (incomplete) : used by run() and by tests
function M.eval(src)
  local f, err, incomplete = compile(src)
  if not f then return false, err, incomplete end
  setfenv(f, _G)
  local function pack(...) return select("#", ...), { ... } end
  local n, r = pack(xpcall(f, function(e)
    local tb = debug.traceback(tostring(e), 2)
    -- drop the REPL's own frames from the end of the traceback
    return (tb:gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
  end))
  if not r[1] then return false, r[2], false end
  print_results(n - 1, unpack(r, 2, n))
  return true
end

function M.run(opts)
  opts = opts or {}
  local tide = require("tide")
  _G.tide = tide
  local ok_le, le = pcall(require, "tide.lineedit")
  if not ok_le then le = nil end
  local interactive = le and le.isatty(0)
  local hist = history_file()
  if le then
    le.stifle(2000)
    if hist then le.read_history(hist) end
    le.set_completer(completer(_G))
  end
  local function readline(prompt)
    if le then return le.readline(prompt) end
    io.write(prompt)
    io.flush()
    return io.read("*l")
  end
  if interactive and not opts.quiet then
    print(string.format("tide %s  |  %s, %s, %d threads  |  `tide` is loaded; help: tide.help()",
      tide.version, jit and jit.version or "Lua", tide.cpu(), tide.threads()))
  end
  local buffer = nil
  while true do
    local line = readline(buffer and ">> " or "> ")
    if line == nil then
      if interactive then io.write("\n") end
      break
    end
    if le and line:match("%S") then
      le.add_history(line)
    end
    if not buffer and line:match("^%s*%$") then
      os.execute((line:gsub("^%s*%$", "")))
    else
      local src = buffer and (buffer .. "\n" .. line) or line
      if src:match("^%s*$") then
        buffer = nil
      else
        if le then le.arm_interrupt(true) end
        local ok, err, incomplete = M.eval(src)
        if le then le.arm_interrupt(false) end
        if ok then
          buffer = nil
        elseif incomplete then
          buffer = src
        else
          buffer = nil
          io.stderr:write(tostring(err), "\n")
        end
      end
    end
    io.stdout:flush()
  end
  if le and hist then le.write_history(hist) end
  return 0
end

return M
