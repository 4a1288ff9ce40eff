-- tide.cli: what the `tide` command does with its arguments.
--   tide                      the REPL
--   tide FILE.lua [args]      run a script (arg as luajit sets it)
--   tide -e CODE [FILE args]  run a chunk (luajit's options -e -l -i -v --)
--   tide --version | help [cmd]
--   tide SUBCOMMAND [args]    lua/tide/cli/<SUBCOMMAND>.lua, a module with
--                             { summary = "...", usage = "...", run = function(argv) }
local M = {}

local function lua_dir()
  local exe = rawget(_G, "_TIDE_EXE")
  if exe and exe.lua_dir then return exe.lua_dir end
  local src = debug.getinfo(1, "S").source:sub(2)
  return (src:match("^(.*)/tide/[^/]*$") or ".")
end

-- Subcommand names, from the files in lua/tide/cli/.
function M.commands()
  local dir = lua_dir() .. "/tide/cli"
  local names = {}
  local p = io.popen('ls "' .. dir .. '" 2>/dev/null')
  if p then
    for f in p:lines() do
      local n = f:match("^([%w_%-]+)%.lua$")
      if n and n ~= "args" then names[#names + 1] = n end
    end
    p:close()
  end
  table.sort(names)
  return names
end

local function load_command(name)
  if not name:match("^[%w_%-]+$") then return nil end
  local ok, mod = pcall(require, "tide.cli." .. name)
  if not ok then
    if tostring(mod):match("module 'tide%.cli%." .. name:gsub("%-", "%%-") .. "' not found") then return nil end
    error(mod, 0)
  end
  return mod
end

local function usage()
  local lines = {
    "usage: tide                      start the interactive REPL",
    "       tide FILE.lua [args...]   run a Lua script (tide is preloaded; arg as luajit sets it)",
    "       tide -e CODE [FILE [args...]]  run a chunk (then the script, if any)",
    "       tide -l MODULE, -i        require MODULE as a global; start the REPL afterwards",
    "       tide --version            print the version",
    "       tide help [COMMAND]       this help, or a command's help",
    "       tide COMMAND [args...]    run a command:",
  }
  for _, n in ipairs(M.commands()) do
    local ok, mod = pcall(load_command, n)
    local summary = (ok and type(mod) == "table" and mod.summary) or ""
    lines[#lines + 1] = string.format("           %-12s %s", n, summary)
  end
  return table.concat(lines, "\n")
end
M.usage = usage

-- Build the global `arg` the way luajit does: arg[0] = the script, arg[1..]
-- its arguments, arg[-1..] the options and the interpreter before it. With
-- no script (tide -e CODE) arg[0] is nil and everything is negative.
local function set_arg(argv, script_index)
  local a = {}
  for i = 0, table.maxn(argv) do a[i - script_index] = argv[i] end
  _G.arg = a
  return a
end

local function traceback(e)
  if type(e) ~= "string" then
    local ok, pretty = pcall(require, "tide.pretty")
    e = ok and pretty.format(e) or tostring(e)
  end
  -- the frames below the xpcall are tide.cli's own: leave them out
  return (debug.traceback(e, 2):gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
end

-- Run a loaded chunk with `tide` as a global; 0 on success, 1 (and the
-- error with a traceback on stderr) on failure.
local function run_chunk(chunk, ...)
  _G.tide = require("tide")
  local ok, err = xpcall(chunk, function(e)
    if e == nil then return nil end -- error() with no value: a quiet failure (busted uses it as exit(1))
    return traceback(e)
  end, ...)
  if not ok then
    if err ~= nil then io.stderr:write("tide: ", tostring(err), "\n") end
    return 1
  end
  return 0
end

local function arm()
  local ok, le = pcall(require, "tide.lineedit")
  if ok then le.arm_interrupt(true) end
end

local function file_exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

local function fail(msg, status)
  io.stderr:write("tide: ", msg, "\n")
  return status or 1
end

local function run_command(name, mod, argv)
  local rest = {}
  for i = 2, table.maxn(argv) do rest[#rest + 1] = argv[i] end
  set_arg(argv, 1)
  arm()
  local errors = require("tide.errors")
  local ok, res = xpcall(function() return mod.run(rest) end, function(e)
    -- errors raised as {tide_user_error = true, msg = ...} (tide.cli.args)
    -- are user errors; anything else was raised deeper (a misuse caught
    -- late, a bug): the message is cleaned of tide's file:line positions and
    -- the traceback kept for -v / TIDE_TRACEBACK=1
    if type(e) == "table" and (e.tide_user_error or e.tide_help) then return e end
    return { msg = errors.clean(e), traceback = traceback(e), status = 1 }
  end)
  if not ok then
    if res.tide_help then
      print(mod.usage or mod.summary or ("tide " .. name))
      return 0
    end
    local msg = tostring(res.msg):gsub("^" .. name:gsub("%p", "%%%0") .. ": ", "")
    if errors.traceback_wanted() and res.traceback then
      io.stderr:write("tide ", name, ": ", res.traceback, "\n")
    else
      io.stderr:write("tide ", name, ": ", errors.clean(msg), "\n")
    end
    return res.status or 1
  end
  return tonumber(res) or 0
end

local function help(name)
  if name then
    local mod = load_command(name)
    if not mod then return fail("no command '" .. name .. "' (try `tide help`)", 2) end
    print(mod.usage or mod.summary or ("tide " .. name))
    return 0
  end
  print(usage())
  return 0
end

local function version()
  local tide = require("tide")
  print("tide " .. tide.version .. " (" .. (jit and jit.version or "Lua") .. ", " .. tide.cpu() .. ")")
  return 0
end

-- argv[0] is the executable, argv[1..] its arguments (as main() got them).
function M.main(argv)
  -- under mpirun (N > 1) the ranks but 0 serve experts instead (tide.mpi)
  if require("tide.mpi").boot() then return 0 end
  local first = argv[1]
  if first == nil then
    return require("tide.repl").run()
  end
  if first == "help" then return help(argv[2]) end
  -- a subcommand, unless a file of that name is meant (`tide ./name`)
  if not first:match("^%-") and not first:find("/") and not first:match("%.lua$") then
    local mod = load_command(first)
    if mod then return run_command(first, mod, argv) end
    if not file_exists(first) then
      return fail("unknown command '" .. first .. "' (and no such file)\n" .. usage(), 2)
    end
  end
  -- luajit-style options, then an optional script and its arguments
  local chunks, i, interactive = {}, 1, false
  while argv[i] ~= nil do
    local a = argv[i]
    if a == "-e" or a == "-l" then
      local v = argv[i + 1]
      if v == nil then return fail(a .. " needs an argument\n" .. usage(), 2) end
      chunks[#chunks + 1] = { a, v }
      i = i + 2
    elseif a == "-i" then
      interactive = true
      i = i + 1
    elseif a == "-v" or a == "--version" then
      chunks[#chunks + 1] = { "-v" }
      i = i + 1
    elseif a == "-h" or a == "--help" then
      return help(nil)
    elseif a == "--" then
      i = i + 1
      break
    elseif a == "-" or a:sub(1, 1) ~= "-" then
      break
    else
      return fail("unknown option '" .. a .. "'\n" .. usage(), 2)
    end
  end
  local script = argv[i]
  set_arg(argv, script and i or table.maxn(argv) + 1)
  arm()
  for _, c in ipairs(chunks) do
    if c[1] == "-v" then
      version()
    elseif c[1] == "-l" then
      local ok, err = pcall(function() _G[c[2]] = require(c[2]) end)
      if not ok then return fail(tostring(err)) end
    else
      local chunk, err = loadstring(c[2], "=(command line)")
      if not chunk then return fail(err) end
      if run_chunk(chunk) ~= 0 then return 1 end
    end
  end
  if script then
    local chunk, err
    if script == "-" and argv[i - 1] ~= "--" then
      chunk, err = loadstring(io.read("*a"), "=stdin")
    else
      chunk, err = loadfile(script)
      if not chunk and not file_exists(script) then err = "cannot open " .. script end
    end
    if not chunk then return fail(tostring(err)) end
    local args = {}
    for k = i + 1, table.maxn(argv) do args[#args + 1] = argv[k] end
    if run_chunk(chunk, unpack(args, 1, table.maxn(argv) - i)) ~= 0 then return 1 end
  end
  if interactive then return require("tide.repl").run() end
  return 0
end

return M
