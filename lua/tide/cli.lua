-- tide.cli: what the `tide` command does with its arguments.
--   tide                      the REPL
--   tide FILE.lua [args]      run a script (arg as luajit sets it)
--   tide -e CODE [args]       run a chunk
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
    "       tide FILE.lua [args...]   run a Lua script (tide is preloaded)",
    "       tide -e CODE [args...]    run a Lua chunk",
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

-- Build the global `arg` the way luajit does: arg[0] = script, arg[1..] the
-- script's arguments, negative indices the interpreter and options.
local function set_arg(argv, script_index)
  local a = {}
  for i = 0, #argv do a[i - script_index] = argv[i] end
  _G.arg = a
  return a
end

local function run_chunk(chunk, name, args)
  local tide = require("tide")
  _G.tide = tide
  local ok, err = xpcall(function() return chunk(unpack(args)) end, debug.traceback)
  if not ok then
    io.stderr:write("tide: ", tostring(err), "\n")
    return 1
  end
  return 0
end

local function arm()
  local ok, le = pcall(require, "tide.lineedit")
  if ok then le.arm_interrupt(true) end
end

function M.main(argv)
  local first = argv[1]
  if first == nil then
    return require("tide.repl").run()
  end
  if first == "--version" or first == "-v" then
    local tide = require("tide")
    print("tide " .. tide.version .. " (" .. (jit and jit.version or "Lua") .. ", " .. tide.cpu() .. ")")
    return 0
  end
  if first == "help" or first == "--help" or first == "-h" then
    local name = argv[2]
    if name then
      local mod = load_command(name)
      if not mod then
        io.stderr:write("tide: no command '" .. name .. "'\n" .. usage() .. "\n")
        return 2
      end
      print(mod.usage or mod.summary or ("tide " .. name))
      return 0
    end
    print(usage())
    return 0
  end
  if first == "-e" then
    local code = argv[2]
    if not code then
      io.stderr:write("tide: -e needs a chunk of code\n")
      return 2
    end
    set_arg(argv, 2)
    local chunk, err = loadstring(code, "=(command line)")
    if not chunk then
      io.stderr:write("tide: ", err, "\n")
      return 1
    end
    arm()
    local args = {}
    for i = 3, #argv do args[#args + 1] = argv[i] end
    return run_chunk(chunk, "-e", args)
  end
  if first:match("%.lua$") or first:find("/") or first == "-" then
    local a = set_arg(argv, 1)
    local chunk, err
    if first == "-" then chunk, err = loadstring(io.read("*a"), "=stdin")
    else chunk, err = loadfile(first) end
    if not chunk then
      io.stderr:write("tide: ", tostring(err), "\n")
      return 1
    end
    arm()
    local args = {}
    for i = 1, #a do args[i] = a[i] end
    return run_chunk(chunk, first, args)
  end
  local mod = load_command(first)
  if not mod then
    io.stderr:write("tide: unknown command or file '" .. first .. "'\n" .. usage() .. "\n")
    return 2
  end
  local rest = {}
  for i = 2, #argv do rest[#rest + 1] = argv[i] end
  set_arg(argv, 1)
  arm()
  local ok, res = xpcall(function() return mod.run(rest) end, function(e)
    -- errors raised as {usage = true, msg = ...} or plain strings are user
    -- errors: no traceback unless TIDE_DEBUG is set
    if type(e) == "table" and e.tide_user_error then return e end
    if type(e) == "string" and not os.getenv("TIDE_DEBUG") and e:match("^tide") then return { msg = e, tide_user_error = true } end
    return debug.traceback(e, 2)
  end)
  if not ok then
    if type(res) == "table" then
      io.stderr:write("tide ", first, ": ", tostring(res.msg), "\n")
      return res.status or 1
    end
    io.stderr:write("tide ", first, ": ", tostring(res), "\n")
    return 1
  end
  return tonumber(res) or 0
end

return M
