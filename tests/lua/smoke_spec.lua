-- smoke_spec: the Lua binding loads, and a tensor round-trips through C.
local tide = require("tide")

describe("tide", function()
  it("loads and reports a version", function()
    assert.is_string(tide.version)
    assert.is_true(#tide.version > 0)
  end)
  it("round-trips a table through a tensor", function()
    local t = tide.tensor({ { 1, 2 }, { 3, 4 } })
    assert.same({ { 1, 2 }, { 3, 4 } }, t:totable())
    assert.same({ 2, 2 }, t:shape())
  end)
end)
