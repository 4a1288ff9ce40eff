-- tensor_spec: the Lua face of tensors: construction, t[i][j], #t, tables in
-- and out, printing, views, small ops, arithmetic, matmul, misuse errors that
-- name the problem, and allocation counters that return to zero after GC.
local tide = require("tide")

local function live()
  collectgarbage("collect")
  collectgarbage("collect")
  local s = tide.alloc_stats()
  return s.live_allocs, s.live_bytes, s.live_storages
end

-- pcall(f) must fail with a message matching `pat`
local function fails(pat, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error matching '" .. pat .. "'")
  assert.is_string(err)
  assert.matches(pat, err)
  return err
end

describe("tensors from Lua", function()
  it("index from 0 with t[i][j] and t[i], and #t is the first size", function()
    local t = tide.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.equals(2, #t)
    assert.equals(6, t[1][2])
    assert.equals(1, t[0][0])
    assert.equals(6, t[1][-1])
    assert.same({ 4, 5, 6 }, t[1]:totable())
    t[0][1] = 20
    t[1] = 7 -- a whole row
    assert.same({ { 1, 20, 3 }, { 7, 7, 7 } }, t:totable())
    t[0] = { 9, 8, 7 }
    assert.same({ 9, 8, 7 }, t[0]:totable())
    assert.equals(3, #tide.zeros(3, 2))
    assert.equals(8, t:get(0, 1))
    t:set(0, 1, -1)
    assert.equals(-1, t:get(0, 1))
  end)

  it("round-trip nested tables in every dtype", function()
    local data = { { 1, -2, 0.5 }, { 4, 0, -6 } }
    for _, dt in ipairs({ "f32", "bf16", "f16", "f8e4m3", "i8", "i32", "i64" }) do
      local t = tide.tensor(data, dt)
      assert.equals(dt, t:dtype_name())
      local want = data
      if dt == "i8" or dt == "i32" or dt == "i64" then want = { { 1, -2, 0 }, { 4, 0, -6 } } end
      assert.same(want, t:totable(), dt)
    end
    assert.same({ 0, 0.5, 6, -6 }, tide.tensor({ 0, 0.5, 6, -6 }, "fp4"):totable())
    assert.same({ { { 1 }, { 2 } } }, tide.tensor({ { { 1 }, { 2 } } }):totable())
    assert.same({ 0, 1, 2, 3 }, tide.arange(4):totable())
    assert.same({}, tide.tensor({}):totable())
  end)

  it("report shape, strides, dtype and size", function()
    local t = tide.zeros(2, 3, 4, "bf16")
    assert.same({ 2, 3, 4 }, t:shape())
    assert.same({ 12, 4, 1 }, t:stride())
    assert.equals(4, t:size(2))
    assert.equals(4, t:size(-1))
    assert.equals(3, t:dim())
    assert.equals(24, t:numel())
    assert.equals(48, t:nbytes())
    assert.is_true(t:is_contiguous())
    assert.is_false(t:transpose(0, 2):is_contiguous())
    assert.same({ 2, 3 }, tide.zeros({ 2, 3 }):shape())
  end)

  it("make views that share data without copying", function()
    local before = select(2, live())
    local t = tide.arange(12, "f32"):reshape(3, 4)
    local after_make = select(2, live())
    local v = t:narrow(1, 1, 2)
    local s = t:select(0, 2)
    local tr = t:t()
    local r = t:view(4, 3)
    local u8 = t:view_dtype("u8")
    assert.equals(after_make, select(2, live()), "views allocated memory")
    assert.same({ { 1, 2 }, { 5, 6 }, { 9, 10 } }, v:totable())
    assert.same({ 8, 9, 10, 11 }, s:totable())
    assert.same({ 0, 4, 8 }, tr[0]:totable())
    assert.same({ 3, 16 }, { #u8, u8:size(1) })
    v[2][1] = 100
    assert.equals(100, t[2][2])
    assert.equals(100, tr[2][2])
    assert.equals(100, r[3][1])
    assert.equals(100, s[2])
    t, v, s, tr, r, u8 = nil, nil, nil, nil, nil, nil -- luacheck: no unused (dropped for the GC)
    assert.equals(before, select(2, live()))
  end)

  it("convert between dtypes with :to and :clone", function()
    -- 1 + 2^-8 is a bf16 tie (to even: 1), exact in f16; 65520 ties to
    -- f16 infinity; e4m3 saturates at 448
    local x = tide.tensor({ 1.00390625, 65520, 1e-9, -3.5 })
    assert.same({ 1.00390625, 1 / 0, 0, -3.5 }, x:to("f16"):totable())
    assert.same({ 1, 65536, -3.5 }, { x:to("bf16")[0], x:to("bf16")[1], x:to("bf16")[3] })
    assert.same({ 1, 448, 0, -3.5 }, x:to("f8e4m3"):totable())
    assert.equals(x, x:to("f32"))
    assert.are_not.equal(x, x:clone())
  end)

  it("prints like torch7: values, elided middle, dtype and shape footer", function()
    local s = tostring(tide.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }))
    assert.equals("  1   2   3\n  4   5   6\n[tide.Tensor f32 of size 2x3]", s)
    local big = tostring(tide.randn({ 20, 30 }, { seed = 1 }))
    assert.matches("%.%.%.", big)
    assert.matches("%[tide%.Tensor f32 of size 20x30%]$", big)
    local lines = 0
    for _ in big:gmatch("\n") do lines = lines + 1 end
    assert.is_true(lines <= 8, "the middle rows are elided")
    assert.matches("%(1,%.,%.%) =", tostring(tide.zeros(2, 2, 2, "bf16")))
    assert.matches("strided%]$", tostring(tide.zeros(2, 3):t()))
    assert.matches("1%.0000e%-05", tostring(tide.tensor({ 1e-5, 3 })))
    assert.matches("inf +nan +%-1", tostring(tide.tensor({ 1 / 0, 0 / 0, -1 })))
    assert.matches("size scalar%]", tostring(tide.tensor({ 5 })[0] and tide.tensor({ { 5 } })[0]:select(0, 0)))
    assert.matches("no elements", tostring(tide.zeros(0)))
  end)

  it("argmax, topk (ties to the smaller index) and softmax", function()
    local x = tide.tensor({ 1, 5, 3, 5, 0 })
    assert.equals(1, x:argmax())
    local v, i = x:topk(3)
    assert.same({ 5, 5, 3 }, v:totable())
    assert.same({ 1, 3, 2 }, i:totable())
    local m = tide.tensor({ { 0, 0 }, { 2, 1 } })
    assert.same({ 0, 0 }, m:argmax():totable())
    local p = tide.tensor({ 0, math.log(3) }):softmax()
    assert.is_true(math.abs(p[0] - 0.25) < 1e-6 and math.abs(p[1] - 0.75) < 1e-6)
    assert.is_true(math.abs(tide.randn({ 3, 7 }, { seed = 3 }):softmax()[2]:sum() - 1) < 1e-6)
  end)

  it("does elementwise arithmetic with tensors and numbers", function()
    local a = tide.tensor({ 1, 2, 3 })
    local b = tide.tensor({ 4, 5, 6 })
    assert.same({ 5, 7, 9 }, (a + b):totable())
    assert.same({ -3, -3, -3 }, (a - b):totable())
    assert.same({ 4, 10, 18 }, (a * b):totable())
    assert.same({ 4, 2.5, 2 }, (b / a):totable())
    assert.same({ 11, 12, 13 }, (a + 10):totable())
    assert.same({ 9, 8, 7 }, (10 - a):totable())
    assert.same({ 2, 4, 6 }, (2 * a):totable())
    assert.same({ 6, 3, 2 }, (6 / a):totable())
    assert.same({ -1, -2, -3 }, (-a):totable())
    assert.same({ 0.5, 1, 1.5 }, a:scale(0.5):totable())
    a:add_(1):mul_(2)
    assert.same({ 4, 6, 8 }, a:totable())
    assert.equals(18, a:sum())
    assert.equals(6, a:mean())
    assert.same({ 4, 6, 8 }, (a:to("bf16") + 0):totable())
  end)

  it("multiplies matrices through the linear entry point", function()
    local a = tide.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    local b = tide.tensor({ { 1, 0 }, { 0, 1 }, { 1, 1 } })
    assert.same({ { 4, 5 }, { 10, 11 } }, tide.matmul(a, b):totable())
    assert.same({ { 4, 5 }, { 10, 11 } }, a:matmul(b):totable())
    -- y = x . w^T
    assert.same({ { 14, 32 }, { 32, 77 } }, tide.linear(a, a):totable())
    local x, w = tide.randn({ 5, 33 }, { seed = 1 }), tide.randn({ 33, 7 }, { seed = 2 })
    local y = tide.matmul(x, w)
    local y_ref = tide.matmul(x, w, 1) -- the scalar reference backend
    assert.is_true(y:nmse(y_ref) < 1e-10)
    local s = 0
    for k = 0, 32 do s = s + x[4][k] * w[k][6] end
    assert.is_true(math.abs(y[4][6] - s) < 1e-4)
  end)

  it("compares tensors for tests: allclose, NMSE, max ULP", function()
    local ref = tide.tensor({ 1, 2, 3, 4 })
    local x = tide.tensor({ 1, 2, 3, 4.001 })
    local ok, st = x:allclose(ref, 0, 1e-2)
    assert.is_true(ok)
    assert.is_false((x:allclose(ref, 0, 1e-4)))
    assert.equals(3, st.first_bad == -1 and 3 or st.first_bad)
    assert.is_true(x:nmse(ref) > 0 and x:nmse(ref) < 1e-7)
    assert.equals(0, ref:to("bf16"):max_ulp(ref))
  end)

  it("raises errors that name the problem, and never crashes", function()
    local t = tide.zeros(2, 3)
    fails("index 5 out of range for dim 0 of size 2", function() return t[5] end)
    fails("index 3 out of range for dim 0 of size 3", function() return t[0][3] end)
    fails("shape mismatch: a %[2, 3%] vs b %[3, 2%]", function() return t + tide.zeros(3, 2) end)
    fails("unknown dtype 'f64'", tide.zeros, 2, "f64")
    fails("unknown dtype 'nope'", function() return t:to("nope") end)
    fails("bad size '%-1' in dim 0", tide.zeros, -1)
    fails("at most 4 dims", tide.zeros, 1, 1, 1, 1, 1)
    fails("narrow%(1, 2, 5%) outside size 3", function() return t:narrow(1, 2, 5) end)
    fails("cannot reshape %[2, 3%] %(6 elements%) to 4 elements", function() return t:reshape(2, 2) end)
    fails("reshape needs a contiguous tensor", function() return t:t():reshape(6) end)
    fails("ragged table", tide.tensor, { { 1, 2 }, { 3 } })
    fails("non%-number element", tide.tensor, { 1, "x" })
    fails("inner sizes differ %(3 vs 2%)", tide.matmul, t, t)
    fails("cannot set field 'foo'", function() t.foo = 1 end)
    fails("get needs 2 indices", function() return t:get(1) end)
    fails("item%(%) needs a one%-element tensor", function() return t:item() end)
    fails("k = 9 outside 0..3", function() return t:topk(9) end)
    fails("cannot combine a tensor with a string", function() return t + "x" end)
    fails("threads%(n%): n must be a number", tide.threads, "x")
    -- the error is raised at the caller's line
    local err = fails("tensor_spec.lua:%d+:", function() return t[7] end)
    assert.is_nil(err:find("tensor.lua", 1, true))
    -- the tensor is still usable afterwards
    assert.same({ 0, 0, 0 }, t[1]:totable())
  end)

  it("returns every allocation once the tensors are garbage", function()
    local a0, b0, s0 = live()
    do
      local keep = {}
      for i = 1, 50 do
        local x = tide.randn({ 17, 9 }, { seed = i })
        keep[#keep + 1] = x:to("bf16"):t()
        keep[#keep + 1] = (x * 2 + 1):softmax():topk(3)
        keep[#keep + 1] = tide.matmul(x, x:t())
        keep[#keep + 1] = tostring(x)
      end
      local a1 = live()
      assert.is_true(a1 > a0)
    end
    local a2, b2, s2 = live()
    assert.same({ a0, b0, s0 }, { a2, b2, s2 })
  end)

  it("maps a file read-only", function()
    local path = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/tensor_spec.bin"
    local f = assert(io.open(path, "wb"))
    f:write(string.rep("\0\0\128\63", 6)) -- six f32 1.0
    f:close()
    local t = assert(tide.mmap(path, "f32", { 2, 3 }))
    assert.same({ { 1, 1, 1 }, { 1, 1, 1 } }, t:totable())
    assert.matches("read%-only%]$", tostring(t))
    fails("read%-only", function() t[0][0] = 2 end)
    local none, err = tide.mmap("/nonexistent/file", "f32", { 1 })
    assert.is_nil(none)
    assert.matches("cannot open '/nonexistent/file'", err)
    local short, err2 = tide.mmap(path, "f32", { 7 })
    assert.is_nil(short)
    assert.matches("do not fit a storage of 24 bytes", err2)
  end)

  it("seeded random numbers repeat, and differ by seed", function()
    local a = tide.randn({ 100 }, { seed = 7 })
    local b = tide.randn({ 100 }, { seed = 7 })
    local c = tide.randn({ 100 }, { seed = 8 })
    assert.equals(0, a:compare(b).max_abs)
    assert.is_true(a:compare(c).max_abs > 0)
    local u = tide.rand({ 1000 }, { seed = 1, lo = 2, hi = 3 })
    local v, i = u:topk(1)
    assert.is_true(v[0] < 3 and u[u:argmax()] == v[0] and i[0] == u:argmax())
  end)
end)
