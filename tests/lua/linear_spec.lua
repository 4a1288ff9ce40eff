-- linear_spec: tide.quant from Lua - dequantisation, linear handles over
-- every format, the grouped and batched forms, output options, policies,
-- misuse errors at the caller's line, and no leaked allocations.
local tide = require("tide")
local q = tide.quant

local function fails(pattern, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok)
  assert.is_truthy(tostring(err):find(pattern), "error '" .. tostring(err) .. "' lacks '" .. pattern .. "'")
  return err
end

local function same_bits(a, b)
  assert.same(a:shape(), b:shape())
  local n = a:numel()
  local pa, pb = a:ptr("uint32_t*"), b:ptr("uint32_t*")
  for i = 0, n - 1 do
    if pa[i] ~= pb[i] then return false, i end
  end
  return true
end

-- an FP8 weight of N x K with scale 2^-4 everywhere, and its f32 values
local function fp8_weight(n, k, seed)
  local w = tide.randn({ n, k }, { seed = seed, std = 8, dtype = "f8e4m3" })
  local s = tide.full({ math.ceil(n / 128), math.ceil(k / 128) }, 1 / 16, "e8m0")
  return w, s
end

describe("tide.quant", function()
  it("dequantises FP8, MXFP4 and plain weights", function()
    local w, s = fp8_weight(130, 200, 1)
    local f = q.dequant(w, s)
    assert.same({ 130, 200 }, f:shape())
    -- (values, not bits: the scaled copy turns -0 into +0, dequant keeps -0)
    assert.equals(0, f:compare(w:to("f32") * (1 / 16)).max_abs)
    local rows = q.dequant(w, s, 128, 2)
    assert.is_true((same_bits(rows, f:narrow(0, 128, 2):contiguous())))
    local b = tide.randn({ 3, 5 }, { seed = 2, dtype = "bf16" })
    assert.is_true((same_bits(q.dequant(b), b:to("f32"))))
    -- MXFP4: bytes 0x21 = codes 1 (0.5) then 2 (1.0); scale 2^1
    local m = tide.full({ 2, 16 }, 0x21, "u8")
    local ms = tide.full({ 2, 1 }, 2, "e8m0")
    local mf = q.dequant(m, ms)
    assert.same({ 2, 32 }, mf:shape())
    assert.equals(1, mf[0][0])
    assert.equals(2, mf[1][31])
  end)

  it("computes x . W^T for every format, bitwise the same as f32 weights holding the dequantised values", function()
    local x = tide.randn({ 9, 200 }, { seed = 3 }):to("bf16"):to("f32")
    local w, s = fp8_weight(70, 200, 4)
    local lin = q.linear(w, s)
    assert.equals("fp8", lin.format)
    assert.equals(70, lin.n)
    assert.equals(200, lin.k)
    local y = lin:forward(x)
    local yr = lin:forward(x, { backend = "ref" })
    assert.is_true(y:nmse(yr) < 1e-10)
    -- dequantised values are exact, so an f32 weight gives the same bits
    local lf = q.linear(q.dequant(w, s))
    assert.is_true((same_bits(y, lf:forward(x))))
    -- a row alone is bitwise the row inside the batch
    local one = lin:forward(x[4])
    assert.is_true((same_bits(one, y[4]:contiguous())))
    for _, dt in ipairs({ "f32", "bf16", "f16" }) do
      local lw = q.linear(tide.randn({ 33, 200 }, { seed = 5, std = 0.1, dtype = dt }))
      assert.equals(dt, lw.format)
      assert.is_true(lw:forward(x):nmse(lw:forward(x, { backend = "ref" })) < 1e-10)
    end
  end)

  it("rounds to bf16 and accumulates into an output", function()
    local x = tide.randn({ 4, 128 }, { seed = 6 })
    local lin = q.linear(fp8_weight(40, 128, 7))
    local y = lin:forward(x)
    local yb = lin:forward(x, { round_bf16 = true })
    assert.is_true((same_bits(yb, y:to("bf16"):to("f32"))))
    local acc = tide.ones(4, 40)
    lin:forward(x, { out = acc, accumulate = true })
    assert.is_true((same_bits(acc, y + 1)))
  end)

  it("runs grouped products and batches of jobs", function()
    local G, n, k = 2, 64, 128
    local w, s = fp8_weight(G * n, k, 8)
    local lin = q.linear(w, s)
    local x = tide.randn({ 5, G * k }, { seed = 9 })
    local y = lin:grouped(x, G)
    local f = q.dequant(w, s)
    for g = 0, G - 1 do
      local lg = q.linear(f:narrow(0, g * n, n):contiguous())
      local yg = lg:forward(x:narrow(1, g * k, k):contiguous())
      assert.is_true((same_bits(yg, y:narrow(1, g * n, n):contiguous())))
    end
    -- forward_many: two handles on one x (a fused pair), another on a slice
    local l1, l3 = q.linear(fp8_weight(50, 128, 10)), q.linear(fp8_weight(30, 128, 11))
    local xs = tide.randn({ 3, 128 }, { seed = 12 })
    local y1, y3, y4 = tide.zeros(3, 50), tide.zeros(3, 30), tide.zeros(1, 30)
    q.forward_many({ { l1, xs, y1 }, { l3, xs, y3 }, { l3, xs:narrow(0, 2, 1), y4 } }, { round_bf16 = true })
    assert.is_true((same_bits(y1, l1:forward(xs, { round_bf16 = true }))))
    assert.is_true((same_bits(y3, l3:forward(xs, { round_bf16 = true }))))
    assert.is_true((same_bits(y4, l3:forward(xs[2], { round_bf16 = true }):reshape(1, 30))))
  end)

  it("switches policies and reports misuse at the caller's line", function()
    local lin = q.linear(fp8_weight(20, 128, 13))
    assert.equals("invariant", lin:policy())
    assert.equals("fast", lin:policy("fast"))
    assert.equals("fast", lin:policy())
    lin:policy("invariant")
    fails("unknown policy 'quick'", lin.policy, lin, "quick")
    fails("do not fit a weight of N=20 x K=128", lin.forward, lin, tide.zeros(2, 127))
    fails("unknown backend 'gpu'", lin.forward, lin, tide.zeros(2, 128), { backend = "gpu" })
    fails("groups = 3 must be > 0 and divide", lin.grouped, lin, tide.zeros(2, 128), 3)
    fails("job 1: x %[2, 64%], y %[2, 20%] do not fit", q.forward_many,
      { { lin, tide.zeros(2, 64), tide.zeros(2, 20) } })
    fails("needs a scale tensor", q.linear, tide.zeros(4, 4, "f8e4m3"))
    fails("linear_spec.lua:%d+:", function()
      local y = lin:forward(tide.zeros(3)) -- not a tail call, so the caller's line is known
      return y
    end)
    lin:close()
    lin:close()
    fails("linear handle is closed", lin.forward, lin, tide.zeros(128))
    assert.equals("tide.quant.Linear (closed)", tostring(lin))
  end)

  it("frees every handle and buffer", function()
    collectgarbage()
    collectgarbage()
    local before = tide.alloc_stats()
    do
      local w, s = fp8_weight(64, 256, 14)
      for _ = 1, 20 do
        local lin = q.linear(w, s)
        local y = lin:forward(tide.randn({ 17, 256 }, { seed = 1 }))
        assert.equals(64, y:shape()[2])
        q.dequant(w, s, 3, 5)
      end
    end
    collectgarbage()
    collectgarbage()
    local after = tide.alloc_stats()
    assert.equals(before.live_allocs, after.live_allocs)
    assert.equals(before.live_bytes, after.live_bytes)
  end)
end)
