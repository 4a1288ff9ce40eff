-- cli_spec: the `tide` command run as a subprocess: scripts get `arg` exactly
-- as luajit gives it, -e/-l/-, --version, help, subcommand dispatch and its
-- errors, exit statuses; plain luajit can `require "tide"`; threads follow
-- tide.threads(n) and OMP_NUM_THREADS and do not change results.
local tide = require("tide")

local ROOT = os.getenv("TIDE_SOURCE_DIR") or "."
local BUILD = os.getenv("TIDE_BUILD_DIR") or (ROOT .. "/build")
local EXE = os.getenv("TIDE_EXE") or (BUILD .. "/tide")
local TMP = os.getenv("TIDE_TEST_TMP") or "/tmp"

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- run a shell command; returns stdout+stderr and the exit status
local function run(cmd, input)
  local full = cmd .. " 2>&1; echo \"rc=$?\""
  if input then
    local inf = TMP .. "/cli_spec_stdin"
    local f = assert(io.open(inf, "w"))
    f:write(input)
    f:close()
    full = "(" .. cmd .. ") < " .. q(inf) .. " 2>&1; echo \"rc=$?\""
  end
  local p = assert(io.popen(full))
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.-)rc=(%d+)\n$")
  return body, tonumber(rc)
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

-- what a script sees: every arg entry in index order, then `...`
local SHOW = write(TMP .. "/cli_show_arg.lua", [[
local lo, hi = 0, 0
for k in pairs(arg) do if k < lo then lo = k end if k > hi then hi = k end end
for k = lo, hi do io.write(k, "=", tostring(arg[k]), "\n") end
io.write("...=", table.concat({ ... }, ","), " n=", select("#", ...), "\n")
]])

describe("tide command", function()
  it("gives a script arg exactly as luajit does", function()
    for _, args in ipairs({ { SHOW, "a", "", "b c" }, { "-e", "x=1", SHOW, "p" }, { "--", SHOW, "-e" },
      { "-e", "io.write(tostring(arg[0]), ' ', arg[-1], ' ', arg[-2], '\\n')" } }) do
      local list = {}
      for i, a in ipairs(args) do list[i] = q(a) end
      local argv = table.concat(list, " ")
      local mine, rc1 = run(q(EXE) .. " " .. argv)
      local theirs, rc2 = run("luajit " .. argv)
      assert.equals(0, rc1, mine)
      assert.equals(rc2, rc1)
      -- the interpreter's own path differs, nothing else
      mine = mine:gsub("=" .. EXE:gsub("%p", "%%%0") .. "\n", "=INTERP\n")
      theirs = theirs:gsub("=luajit\n", "=INTERP\n")
      assert.equals(theirs, mine)
    end
  end)

  it("runs a script from stdin with -", function()
    local out, rc = run(q(EXE) .. " - x y", "print(arg[0], ...)")
    assert.equals(0, rc)
    assert.equals("-\tx\ty\n", out)
  end)

  it("preloads tide for scripts and -e", function()
    local out, rc = run(q(EXE) .. " -e " .. q("io.write(tide.zeros(2, 3):numel())"))
    assert.equals(0, rc)
    assert.equals("6", out)
  end)

  it("-l requires a module as a global, -v prints the version first", function()
    local out, rc = run(q(EXE) .. " -v -l string -e " .. q("io.write(type(string.rep))"))
    assert.equals(0, rc)
    assert.matches("^tide " .. tide.version:gsub("%p", "%%%0") .. " %(", out)
    assert.matches("function$", out)
  end)

  it("reports errors with a traceback and status 1", function()
    local out, rc = run(q(EXE) .. " -e " .. q("local function f() error('boom') end f()"))
    assert.equals(1, rc)
    assert.matches("^tide: %(command line%):1: boom\nstack traceback:", out)
    assert.matches("in function 'f'", out)
    assert.is_nil(out:find("cli.lua", 1, true), "tide.cli's frames are left out")
    out, rc = run(q(EXE) .. " " .. q(TMP .. "/no_such_script.lua"))
    assert.equals(1, rc)
    assert.matches("cannot open .*no_such_script%.lua", out)
    out, rc = run(q(EXE) .. " " .. q(write(TMP .. "/cli_syntax.lua", "x = = 1\n")))
    assert.equals(1, rc)
    assert.matches("cli_syntax%.lua:1:", out)
  end)

  it("passes os.exit statuses through", function()
    local _, rc = run(q(EXE) .. " -e 'os.exit(3)'")
    assert.equals(3, rc)
    _, rc = run(q(EXE) .. " -e 'os.exit(true)'")
    assert.equals(0, rc)
  end)

  it("prints its version and help", function()
    local out, rc = run(q(EXE) .. " --version")
    assert.equals(0, rc)
    assert.matches("^tide %d+%.%d+%.%d+ %(LuaJIT", out)
    out, rc = run(q(EXE) .. " help")
    assert.equals(0, rc)
    assert.matches("usage: tide", out)
    assert.matches("tide COMMAND", out)
  end)

  it("rejects an unknown command or option with a clear message and status 2", function()
    local out, rc = run(q(EXE) .. " frobnicate")
    assert.equals(2, rc)
    assert.matches("^tide: unknown command 'frobnicate'", out)
    out, rc = run(q(EXE) .. " help frobnicate")
    assert.equals(2, rc)
    assert.matches("no command 'frobnicate'", out)
    out, rc = run(q(EXE) .. " -Z")
    assert.equals(2, rc)
    assert.matches("unknown option '%-Z'", out)
    out, rc = run(q(EXE) .. " -e")
    assert.equals(2, rc)
    assert.matches("%-e needs an argument", out)
  end)

  it("dispatches subcommands to lua/tide/cli/<name>.lua", function()
    local dir = TMP .. "/cli_cmds"
    os.execute("mkdir -p " .. q(dir .. "/tide/cli"))
    write(dir .. "/tide/cli/hello.lua", [[
local args = require("tide.cli.args")
return {
  summary = "say hello",
  usage = "usage: tide hello [--times N] NAME",
  run = function(argv)
    local o, pos = args.parse(argv, { times = { type = "number", default = 1 } }, "hello")
    for _ = 1, o.times do io.write("hello ", pos[1] or "?", "\n") end
    return o.times == 3 and 3 or 0
  end,
}
]])
    local env = "LUA_PATH=" .. q(dir .. "/?.lua;;") .. " "
    local out, rc = run(env .. q(EXE) .. " hello --times 2 you")
    assert.equals(0, rc)
    assert.equals("hello you\nhello you\n", out)
    out, rc = run(env .. q(EXE) .. " hello --times=3 x")
    assert.equals("hello x\nhello x\nhello x\n", out)
    assert.equals(3, rc)
    out, rc = run(env .. q(EXE) .. " hello --bogus")
    assert.equals(2, rc)
    assert.equals("tide hello: unknown option --bogus\n", out)
    out, rc = run(env .. q(EXE) .. " hello --times many")
    assert.equals(2, rc)
    assert.matches("expects a number, got 'many'", out)
    out, rc = run(env .. q(EXE) .. " help hello")
    assert.equals(0, rc)
    assert.equals("usage: tide hello [--times N] NAME\n", out)
  end)
end)

describe("plain luajit", function()
  it("can require 'tide' with LUA_PATH pointing at lua/", function()
    local env = "LUA_PATH=" .. q(ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua;;") ..
      " TIDE_LIB=" .. q(BUILD .. "/libtide.so") .. " "
    if os.getenv("TIDE_PRELOAD") then env = env .. "LD_PRELOAD=" .. q(os.getenv("TIDE_PRELOAD")) .. " " end
    local out, rc = run(env .. "luajit -e " .. q("local tide = require 'tide'; tide.threads(2); " ..
      "print(tide.version, tide.randn({64, 64}):to('bf16'):numel(), " ..
      "tide.matmul(tide.ones(2, 3), tide.ones(3, 2))[1][1])"))
    assert.equals(0, rc, out)
    assert.equals(tide.version .. "\t4096\t3\n", out)
  end)
end)

describe("threads", function()
  it("tide.threads(n) sets the pool size, 0 restores the default", function()
    local old = tide.threads()
    assert.equals(1, tide.threads(1))
    assert.equals(1, tide.threads())
    assert.equals(2, tide.threads(2))
    assert.equals(2, tide.threads())
    tide.threads(0)
    assert.equals(old, tide.threads())
  end)

  it("OMP_NUM_THREADS sets the default", function()
    for _, n in ipairs({ 1, 2, 3 }) do
      local out, rc = run("OMP_NUM_THREADS=" .. n .. " " .. q(EXE) .. " -e " ..
        q("io.write(tide.threads(), ' ', tide.threads(5), ' ', tide.threads(0))"))
      assert.equals(0, rc)
      assert.equals(n .. " 5 " .. n, out)
    end
  end)

  it("idle threads spin briefly unless the user chose (libgomp reads what tide set)", function()
    -- OMP_DISPLAY_ENV=verbose makes libgomp print the settings it read when it was loaded
    local function spin(env)
      local out, rc = run("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose " .. env .. " " ..
        q(EXE) .. " -e " .. q("io.write('ran\\n')"))
      assert.equals(0, rc, out)
      assert.truthy(out:find("ran\n", 1, true), out)
      -- the last report counts: an executable linked against libtide runs itself again with the setting
      local n, policy
      for a in out:gmatch("GOMP_SPINCOUNT = '(%d+)'") do n = a end
      for a in out:gmatch("OMP_WAIT_POLICY = '(%a+)'") do policy = a end
      return n, policy
    end
    assert.equals(tide.ffi.DEFAULT_SPINCOUNT, (spin("")))
    assert.equals("1234", (spin("GOMP_SPINCOUNT=1234")))
    local n, policy = spin("OMP_WAIT_POLICY=active")
    assert.equals("ACTIVE", policy)
    assert.is_true(tonumber(n) > 1e6, n)
  end)

  it("give the same bytes with 1 and 2 threads", function()
    local old = tide.threads()
    local function work()
      local x = tide.randn({ 300, 1001 }, { seed = 11 })
      local w = tide.randn({ 1001, 65 }, { seed = 12 })
      return { x:to("bf16"), x:t():to("f8e4m3"), x:softmax(), x * 3 + 1, tide.matmul(x, w), tide.matmul(x, w, 1) }
    end
    tide.threads(1)
    local a = work()
    tide.threads(2)
    local b = work()
    tide.threads(old)
    for i = 1, #a do
      local c = a[i]:compare(b[i])
      assert.equals(0, c.max_abs, "result " .. i .. " differs")
      assert.equals(0, c.nan_mismatch)
    end
  end)
end)
