-- tide.repl: the interactive session `tide` starts with no arguments.
-- Line editing, history and completion come from libedit (tide.lineedit);
-- chunks may span lines; `=expr` and bare expressions print their values;
-- errors print a traceback and the session goes on; Ctrl-C cancels the line
-- being typed or interrupts the running chunk; Ctrl-D leaves; `$ cmd` runs a
-- shell command. `tide` is a global, and so are help() (the main entry
-- points, one example each) and describe(x) (the long form of any object;
-- tide's objects print a one-line summary).
local M = {}

local pretty = require("tide.pretty")
local errors = require("tide.errors")

local HELP = [[
tide: a CPU inference engine for DeepSeek-V4-class models. Objects print a
one-line summary; describe(x) or x:describe() gives the long form.
  m = tide.model()                       the default model (or tide.model("DIR", {max_tokens = 256}))
  s = m:session{ seed = 1 }              a conversation: s:say("Hello!")  s:undo()  s:regen()  s:fork()
  s:peek(5)                              the 5 most likely next tokens, nothing committed
  s:inspect{ layer = 1 }                 attention and routing of the latest token (tide.inspect.format)
  tide.lab(s, { vs = {temp = 0.3} })     sampler lab: how each stage reshapes the distribution (bars)
  tide.lab(s, { report = "lab.html" })   the same as an HTML report with pictures
  e = tide.engine(m, { budget = 256 })   batching: h = e:submit{ prompt = "Once", max_tokens = 32 }
  for _, t in h:stream() do io.write(t) end
  sp = tide.sampling.chain{ tide.sampling.top_k(40), tide.sampling.temperature(0.8) }
  tok = m.tokenizer                      tok:encode("Hello")  tok:decode({ 19923 })
  ck = tide.load("DIR")                  a checkpoint: ck:summary()  ck:tensor("embed.weight")
  t = tide.randn({4, 4}, { seed = 1 })   tensors: t:to("bf16")  t:topk(3)  tide.matmul(t, t)
  tide.threads(2)  tide.alloc_stats()    threads, live allocations
  =expr prints a value, ==expr its long form; $ cmd runs a shell command; `tide help` in a shell lists
  the subcommands.
Errors show what went wrong in your code; TIDE_TRACEBACK=1 shows tide's own frames too.]]

function M.help_text() return HELP end

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

-- The history file: $TIDE_HISTORY (empty = none), else ~/.tide_history.
function M.history_file()
  local h = os.getenv("TIDE_HISTORY")
  if h then return h ~= "" and h or nil end
  local home = os.getenv("HOME")
  return home and (home .. "/.tide_history") or nil
end

-- Completion candidates for `word` (the text before the cursor back to the
-- last separator): globals and keywords, or the fields and methods of the
-- value a dotted prefix names ("tide.ze", "t:so", "tide.ffi.C"). Functions
-- get a "(" appended so a unique match is ready for its arguments.
function M.complete(word, env)
  env = env or _G
  local prefix, sep, partial = word:match("^(.-)([%.:])([%w_]*)$")
  local out, seen = {}, {}
  local lead = prefix and (prefix .. sep) or ""
  local want = prefix and partial or word
  local function add(k, v)
    if type(k) ~= "string" or seen[k] or not k:match("^[%a_][%w_]*$") then return end
    if k:sub(1, #want) ~= want then return end
    if sep == ":" and type(v) ~= "function" then return end
    seen[k] = true
    out[#out + 1] = lead .. k .. (type(v) == "function" and "(" or "")
  end
  local function fields(v, depth)
    if depth > 3 then return end
    if type(v) == "table" then
      for k, x in pairs(v) do add(k, x) end
      local mt = getmetatable(v)
      if mt and type(mt.__index) == "table" then fields(mt.__index, depth + 1) end
      -- tide.<lazy>: modules loaded on first use, offered before they load
      if type(rawget(v, "_lazy")) == "table" then
        for k in pairs(v._lazy) do add(k, true) end
      end
    elseif type(v) == "cdata" then
      local ok, tensor = pcall(require, "tide.tensor")
      if ok and tensor.is_tensor(v) then
        for k, f in pairs(tensor.methods) do add(k, f) end
        if sep == "." then
          for _, k in ipairs({ "data", "storage", "sizes", "strides", "ndim", "dtype", "nib", "readonly" }) do
            add(k, true)
          end
        end
      end
    elseif type(v) == "string" then
      for k, f in pairs(string) do add(k, f) end
    end
  end
  if prefix then
    local v = env
    for part in prefix:gmatch("[^%.:]+") do
      if not part:match("^[%a_][%w_]*$") then v = nil break end
      local ok, x = pcall(function() return v[part] end)
      v = ok and x or nil
      if v == nil then break end
    end
    if v ~= nil then fields(v, 0) end
  else
    for k, v in pairs(env) do add(k, v) end
    local mt = getmetatable(env)
    if mt and type(mt.__index) == "table" then for k, v in pairs(mt.__index) do add(k, v) end end
    for _, k in ipairs(KEYWORDS) do add(k, true) end
  end
  table.sort(out)
  return out
end

-- Compile `src` as an expression list first (so `1+1` prints 2), then as a
-- statement. Returns chunk, or nil, message, incomplete.
function M.compile(src)
  -- ==expr: the long form of the value (tide.describe)
  local long = src:match("^%s*==(.*)$")
  if long then src = "return require('tide.describe').long(" .. long .. "\n)" end
  local expr = src:match("^%s*=(.*)$")
  if expr then src = "return " .. expr end
  if loadstring("return " .. src .. "\n", "=stdin") then
    -- the identity wrapper keeps every value and avoids a tail call, so an
    -- error raised by the expression still knows its line
    local f = loadstring("return (function(...) return ... end)(" .. src .. "\n)", "=stdin")
    if f then return f end
  end
  local g, err = loadstring(src, "=stdin")
  if g then return g end
  -- more input can finish a block, a long string or a long comment, never
  -- a short string
  local incomplete = err:match("'<eof>'$") ~= nil and not err:match("unfinished string")
  return nil, err, incomplete
end

local function traceback(e)
  local tb = debug.traceback(type(e) == "string" and e or pretty.format(e), 2)
  -- drop the REPL's own frames from the end of the traceback
  tb = tb:gsub("\n%s*%[C%]: in function 'xpcall'.*$", "")
  return tb
end

-- Run `src` (a complete chunk) in the global environment and print what it
-- returns. Returns true, or false, message, incomplete.
function M.eval(src, out, le)
  out = out or io.stdout
  local f, err, incomplete = M.compile(src)
  if not f then return false, err, incomplete end
  setfenv(f, _G)
  -- Loops typed at the prompt run in the interpreter, where the Ctrl-C hook
  -- is seen; JIT-compiled code never checks hooks. Functions the chunk
  -- defines or calls are still compiled.
  if jit then jit.off(f) end
  if le then le.arm_interrupt(true) end
  local function pack(...) return select("#", ...), { ... } end
  local n, r = pack(xpcall(f, traceback))
  if le then le.arm_interrupt(false) end
  if not r[1] then return false, r[2], false end
  if n == 2 and type(r[2]) == "string" and r[2]:find("\n", 1, true) then
    -- one text of several lines (x:describe(), a format() result): as text
    out:write(r[2], "\n")
  elseif n > 1 then
    local parts = {}
    for i = 2, n do parts[#parts + 1] = pretty.format(r[i]) end
    out:write(table.concat(parts, "\t"), "\n")
  end
  return true
end

function M.run(opts)
  opts = opts or {}
  local tide = require("tide")
  _G.tide = tide
  if rawget(_G, "help") == nil then _G.help = function() print(HELP) end end
  if rawget(_G, "describe") == nil then _G.describe = function(x) print(require("tide.describe").long(x)) end end
  local ok_le, le = pcall(require, "tide.lineedit")
  if not ok_le then le = nil end
  local interactive = le and le.isatty(0) or false
  local hist = interactive and M.history_file() or nil
  if le and interactive then
    le.stifle(2000)
    if hist then le.read_history(hist) end
    le.set_completer(function(word) return M.complete(word, _G) end)
  end
  local function readline(prompt)
    if le then return le.readline(prompt) end
    io.write(prompt)
    io.flush()
    return io.read("*l")
  end
  if interactive and not opts.quiet then
    print(string.format("tide %s  |  %s, %s, %d threads  |  `tide` is loaded; help()",
      tide.version, jit and jit.version or "Lua", tide.cpu(), tide.threads()))
  end
  local buffer = nil
  while true do
    local line = readline(buffer and ">> " or "> ")
    if line == nil then -- Ctrl-D or end of input
      if interactive then io.write("\n") end
      break
    end
    if line == false then -- Ctrl-C at the prompt: drop the line and any unfinished chunk
      buffer = nil
    else
      if interactive and line:match("%S") then
        le.add_history(line)
        if hist then le.write_history(hist) end
      end
      if not buffer and line:match("^%s*%$") then
        os.execute((line:gsub("^%s*%$", "")))
      else
        local src = buffer and (buffer .. "\n" .. line) or line
        if src:match("^%s*$") then
          buffer = nil
        else
          -- pcall: a Ctrl-C landing just after the chunk, while its
          -- results print, must not end the session either
          local pok, ok, err, incomplete = pcall(M.eval, src, io.stdout, le)
          if not pok then ok, err, incomplete = false, ok, false end
          if ok then
            buffer = nil
          elseif incomplete then
            buffer = src
          else
            buffer = nil
            io.stderr:write(errors.user_traceback(tostring(err)), "\n")
          end
        end
      end
    end
    io.stdout:flush()
  end
  return 0
end

return M
