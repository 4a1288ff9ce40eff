-- repl_spec: the REPL's pieces without a terminal: how a line compiles
-- (expression, statement, unfinished), what it prints, what TAB offers, and
-- how values are pretty-printed. test_repl.c drives the whole thing through
-- a pseudo-terminal.
local tide = require("tide")
local repl = require("tide.repl")
local pretty = require("tide.pretty")

-- a file-like sink for eval's output
local function sink()
  local s = { text = "" }
  function s:write(...)
    for i = 1, select("#", ...) do self.text = self.text .. tostring((select(i, ...))) end
  end
  return s
end

describe("repl", function()
  before_each(function() _G.tide = tide end)

  it("prints bare expressions and =expr, and runs statements quietly", function()
    local out = sink()
    assert.is_true(repl.eval("1 + 1", out))
    assert.is_true(repl.eval("=2 * 3", out))
    assert.is_true(repl.eval("repl_spec_x = 5", out))
    assert.is_true(repl.eval("repl_spec_x, 'a', nil", out))
    assert.is_true(repl.eval("print", sink()))
    assert.equals('2\n6\n5\t"a"\tnil\n', out.text)
    assert.equals(5, _G.repl_spec_x)
    _G.repl_spec_x = nil
  end)

  it("says when a chunk is unfinished, and when it is simply wrong", function()
    for _, src in ipairs({ "for i = 1, 3 do", "function f(x)", "x = [[abc", "--[[ note", "t = {", "if x then" }) do
      local ok, err, incomplete = repl.eval(src, sink())
      assert.is_false(ok)
      assert.is_true(incomplete, src .. " should be unfinished: " .. tostring(err))
    end
    for _, src in ipairs({ "x = = 1", "end", "x = 'abc", "1 +* 2", "1) + (2" }) do
      local ok, err, incomplete = repl.eval(src, sink())
      assert.is_false(ok, src)
      assert.is_false(incomplete, src .. " should be an error")
      assert.matches("stdin:", err)
    end
    assert.is_true(repl.eval("for i = 1, 2 do\nrepl_spec_y = i\nend", sink()))
    assert.equals(2, _G.repl_spec_y)
    _G.repl_spec_y = nil
  end)

  it("returns runtime errors with a traceback that starts at the error", function()
    local ok, err, incomplete = repl.eval("local function g() error('boom') end g()", sink())
    assert.is_false(ok)
    assert.is_false(incomplete)
    assert.matches("^stdin:1: boom\nstack traceback:", err)
    assert.matches("in function 'g'", err)
    assert.is_nil(err:find("repl.lua", 1, true), "the REPL's own frames are left out")
    local ok2, err2 = repl.eval("error({code = 1})", sink())
    assert.is_false(ok2)
    assert.matches("{ code = 1 }", err2)
    local ok3, err3 = repl.eval("=tide.zeros(2)[5]", sink())
    assert.is_false(ok3)
    assert.matches("index 5 out of range", err3)
  end)

  it("completes globals, keywords, fields, tensor methods and lazy modules", function()
    local env = { alpha = 1, alps = function() end, beta = { gamma = 1, delta = function() end }, tide = tide,
      t = tide.zeros(2) }
    setmetatable(env, { __index = { inherited = 1 } })
    assert.same({ "alpha", "alps(", "and" }, repl.complete("a", env))
    assert.same({ "inherited" }, repl.complete("inh", env))
    assert.same({ "while" }, repl.complete("whi", env))
    assert.same({ "beta.delta(", "beta.gamma" }, repl.complete("beta.", env))
    assert.same({ "beta:delta(" }, repl.complete("beta:", env))
    assert.same({ "tide.zeros(" }, repl.complete("tide.zer", env))
    assert.same({ "t:softmax(" }, repl.complete("t:softm", env))
    assert.same({ "t.ndim" }, repl.complete("t.ndi", env))
    -- entries of tide that load on first use are offered before they load
    assert.is_nil(rawget(tide, "sampling"))
    assert.same({ "tide.sampling" }, repl.complete("tide.sampl", env))
    assert.is_nil(rawget(tide, "sampling"), "completion must not load the module")
    assert.same({}, repl.complete("nothing.here", env))
    assert.same({}, repl.complete("tide.zeros.x", env))
  end)

  it("pretty-prints tables (sorted, nested, bounded) and tensors", function()
    assert.equals("{ 1, 2, a = 1, b = { c = true } }", pretty.format({ 1, 2, a = 1, b = { c = true } }))
    assert.equals('{ [true] = 1, ["a b"] = "x" }', pretty.format({ [true] = 1, ["a b"] = "x" }))
    local cyc = {}
    cyc.self = cyc
    assert.equals("{ self = <cycle> }", pretty.format(cyc))
    assert.equals("{ { { { {...} } } } }", pretty.format({ { { { { 1 } } } } }))
    local long = {}
    for i = 1, 100 do long[i] = i end
    assert.matches("%.%.%. %(100 items%)", pretty.format(long))
    assert.matches("\n", pretty.format({ a = string.rep("x", 90) }))
    assert.equals(tostring(tide.zeros(2)), pretty.format(tide.zeros(2)))
    assert.equals('"q\\"s"', pretty.format('q"s'))
  end)

  it("keeps history in $TIDE_HISTORY, or nowhere when it is empty", function()
    -- the specs run with TIDE_HISTORY set to "" (see CMakeLists.txt)
    assert.is_nil(repl.history_file())
  end)
end)
