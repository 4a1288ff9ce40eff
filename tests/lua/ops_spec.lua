-- ops_spec: tide.ops from Lua: each wrapper against a small computation done
-- here, outputs written in place, misuse errors that name the problem, the
-- MoE object (batch vs single tokens bitwise, stats, close), no garbage per
-- call on the hot path, and allocation counters back to zero.
local tide = require("tide")
local ops = tide.ops

local function live()
  collectgarbage("collect")
  collectgarbage("collect")
  local s = tide.alloc_stats()
  return s.live_allocs, s.live_storages
end

local function fails(pat, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error matching '" .. pat .. "'")
  assert.matches(pat, err)
end

local function bf16(v) return tide.tensor({ v }):to("bf16"):to("f32")[0] end

local function sigm(v) return 1 / (1 + math.exp(-v)) end

describe("tide.ops", function()
  it("is reached lazily as tide.ops", function()
    assert.equals(require("tide.ops"), tide.ops)
  end)

  it("rmsnorm matches the formula, in place, with and without weights", function()
    local x = tide.tensor({ { 1, 2, 3, 4 }, { -1, 0.5, 0, 2 } })
    local w = tide.tensor({ 1, 0.5, 2, 1 }, "bf16")
    local out = ops.rmsnorm(nil, x, w, 1e-6, false)
    for r = 0, 1 do
      local ss = 0
      for i = 0, 3 do ss = ss + x[r][i] ^ 2 end
      local rs = 1 / math.sqrt(ss / 4 + 1e-6)
      for i = 0, 3 do
        assert.is_true(math.abs(out[r][i] - x[r][i] * rs * w[i]) < 1e-6)
      end
    end
    local y = x:clone()
    assert.equals(y, ops.rmsnorm(y, y, nil, 1e-6)) -- returns out; rounds by default
    local plain = ops.rmsnorm(nil, x, nil, 1e-6, false)
    for i = 0, 3 do assert.equals(bf16(plain[0][i]), y[0][i]) end
    fails("same shape", ops.rmsnorm, tide.zeros(2, 3), x, nil, 1e-6)
    fails("w has shape %[3%]", ops.rmsnorm, nil, x, tide.zeros(3), 1e-6)
  end)

  it("embed gathers rows, copies them into every stream and checks ids", function()
    local tab = tide.randn({ 10, 6 }, { seed = 3, dtype = "bf16" })
    local out = ops.embed(nil, tab, { 4, 0, 9 })
    assert.same({ 3, 6 }, out:shape())
    for i = 0, 5 do assert.equals(tab[9][i], out[2][i]) end
    local X = ops.embed(nil, tab, tide.tensor({ 2, 7 }, "i32"), 4)
    assert.same({ 2, 4, 6 }, X:shape())
    for s = 0, 3 do assert.equals(tab[7][5], X[1][s][5]) end
    fails("token id 10 at position 1 is outside the vocabulary of 10", ops.embed, nil, tab, { 1, 10 })
  end)

  it("hc_pre / hc_post / hc_head follow the doc on a hand-checked case", function()
    -- hc = 2, d = 2, fn = 0 so the mixes come from base alone
    local X = tide.tensor({ { { 1, 2 }, { 3, -4 } } })
    local fn = tide.zeros(8, 4)
    local l3 = math.log(3)
    local base = tide.tensor({ 0, l3, 0, l3, 0, l3, 0, 0 })
    local scale = tide.tensor({ 1, 1, 1 })
    local cfg = ops.hc_cfg({ iters = 1, hc_eps = 0, round = false })
    local x, post, comb = ops.hc_pre(nil, nil, nil, X, fn, scale, base, cfg)
    assert.is_true(math.abs(x[0][0] - 2.75) < 1e-6 and math.abs(x[0][1] + 2) < 1e-6)
    assert.is_true(math.abs(post[0][0] - 1) < 1e-6 and math.abs(post[0][1] - 1.5) < 1e-6)
    local want = { { 1 / 3, 3 / 5 }, { 2 / 3, 2 / 5 } }
    for i = 0, 1 do
      for j = 0, 1 do assert.is_true(math.abs(comb[0][i][j] - want[i + 1][j + 1]) < 1e-6) end
    end
    -- post: out_j = post_j a + sum_i comb_ij X_i, in place into X
    local a = tide.tensor({ { 10, 20 } })
    local want0 = post[0][0] * 10 + comb[0][0][0] * 1 + comb[0][1][0] * 3
    ops.hc_post(X, a, X, post, comb, false)
    assert.is_true(math.abs(X[0][0][0] - want0) < 1e-5)
    -- head: g_i = sigmoid(base_i) + eps with fn = 0
    local y = ops.hc_head(nil, X, tide.zeros(2, 4), tide.tensor({ 1 }), tide.tensor({ 0, l3 }),
      ops.hc_cfg({ hc_eps = 0, round = false }))
    assert.is_true(math.abs(y[0][1] - (0.5 * X[0][0][1] + 0.75 * X[0][1][1])) < 1e-5)
    fails("hc = 1 streams", ops.hc_pre, nil, nil, nil, tide.zeros(1, 1, 4), fn, scale, base)
  end)

  it("route_topk breaks ties toward the smaller expert and orders by score + bias", function()
    local logits = tide.tensor({ { 0, 1, 3, 1, 3, -2, 3, 0 } })
    local ids, w = ops.route_topk(4, nil, logits, nil, ops.route_cfg({ routed_scale = 1.5 }))
    assert.same({ { 2, 4, 6, 1 } }, ids:totable())
    local s3, s1 = math.sqrt(math.log(1 + math.exp(3))), math.sqrt(math.log(1 + math.exp(1)))
    assert.is_true(math.abs(w[0][0] - 1.5 * s3 / (3 * s3 + s1)) < 1e-6)
    local bias = tide.tensor({ 0, 0, 0, 0, 0, 10, 0, 0 })
    ops.route_topk(ids, w, logits, bias, ops.route_cfg({ scoring = "sigmoid", norm_topk = false }))
    assert.same({ { 5, 2, 4, 6 } }, ids:totable())
    assert.is_true(math.abs(w[0][0] - sigm(-2)) < 1e-6)
    fails("unknown scoring", ops.route_cfg, { scoring = "relu" })
  end)

  it("route_hash reads tid2eid by token id and names bad ids", function()
    local t2e = tide.tensor({ { 0, 1 }, { 3, 2 }, { 1, 3 } }, "i64")
    local logits = tide.randn({ 2, 4 }, { seed = 5 })
    local ids = ops.route_hash(2, nil, logits, { 2, 1 }, t2e)
    assert.same({ { 1, 3 }, { 3, 2 } }, ids:totable())
    fails("token id 3 at position 1", ops.route_hash, 2, nil, logits, { 0, 3 }, t2e)
    t2e[1][0] = 9
    fails("tid2eid%[1%]%[0%] = 9", ops.route_hash, 2, nil, logits, { 0, 1 }, t2e)
  end)

  it("swiglu clamps the gate above and the up projection both ways", function()
    local g = tide.tensor({ { 20, -30, 1 } })
    local u = tide.tensor({ { 1, 2, -25 } })
    local h = ops.swiglu(nil, g, u, 10, false)
    local s = function(v) return v / (1 + math.exp(-v)) end
    assert.is_true(math.abs(h[0][0] - s(10)) < 1e-5)
    assert.is_true(math.abs(h[0][1] - 2 * s(-30)) < 1e-15)
    assert.is_true(math.abs(h[0][2] - -10 * s(1)) < 1e-5)
    assert.is_true(math.abs(ops.swiglu(nil, g, u)[0][0] - bf16(s(20))) < 1e-9) -- no limit, rounded
  end)

  it("runs a MoE block: batch = single tokens bitwise, stats, errors, close", function()
    local a0, s0 = live()
    do
      local E, d, inter, k, T = 6, 40, 24, 2, 9
      local moe = ops.moe(E, d, inter, 10)
      for e = 0, E - 1 do
        local w1 = tide.randn({ inter, d }, { seed = 10 + e, std = 0.3, dtype = "bf16" })
        local w2 = tide.randn({ d, inter }, { seed = 20 + e, std = 0.3, dtype = "bf16" })
        local w3 = tide.randn({ inter, d }, { seed = 30 + e, std = 0.3, dtype = "bf16" })
        moe:set_expert(e, w1, nil, w2, nil, w3, nil)
      end
      collectgarbage("collect") -- the block holds the weights
      moe:set_shared(tide.randn({ 16, d }, { seed = 1, std = 0.3, dtype = "bf16" }), nil,
        tide.randn({ d, 16 }, { seed = 2, std = 0.3, dtype = "bf16" }), nil,
        tide.randn({ 16, d }, { seed = 3, std = 0.3, dtype = "bf16" }), nil)
      assert.same({ n_experts = E, dim = d, inter = inter, sinter = 16, n_set = E }, moe:info())
      local x = tide.randn({ T, d }, { seed = 7 }):to("bf16"):to("f32")
      local logits = tide.randn({ T, E }, { seed = 8 })
      local ids, w = ops.route_topk(k, nil, logits, nil, ops.route_cfg({ routed_scale = 1.5 }))
      local out = moe:forward(nil, x, ids, w)
      local st = moe:stats()
      assert.equals(T, st.tokens)
      assert.equals(T * k, st.rows)
      local rows, active = moe:expert_rows(), 0
      for e = 0, E - 1 do if rows[e] > 0 then active = active + 1 end end
      assert.equals(active, st.n_active)
      local one = tide.zeros(1, d)
      for t = 0, T - 1 do
        moe:forward(one, x:narrow(0, t, 1), ids:narrow(0, t, 1), w:narrow(0, t, 1))
        assert.same(out[t]:totable(), one[0]:totable(), "token " .. t)
      end
      local bad = ids:clone()
      bad[3][1] = E
      fails("token 3 slot 1 selects expert 6", moe.forward, moe, out, x, bad, w)
      moe:close()
      moe:close()
      fails("closed", moe.forward, moe, out, x, ids, w)
    end
    local a1, s1 = live()
    assert.equals(a0, a1)
    assert.equals(s0, s1)
  end)

  it("makes no garbage per call when outputs are given", function()
    local x = tide.randn({ 4, 64 }, { seed = 1 })
    local y = tide.zeros(4, 64)
    local g, u = tide.randn({ 4, 64 }, { seed = 2 }), tide.randn({ 4, 64 }, { seed = 3 })
    local cfgr = ops.route_cfg()
    local ids, w = ops.route_topk(2, nil, x, nil, cfgr)
    for _ = 1, 200 do ops.rmsnorm(y, x, nil, 1e-6) end -- warm up / compile
    collectgarbage("collect")
    collectgarbage("stop")
    local before = collectgarbage("count")
    for _ = 1, 2000 do
      ops.rmsnorm(y, x, nil, 1e-6)
      ops.swiglu(y, g, u, 10)
      ops.route_topk(ids, w, x, nil, cfgr)
    end
    local grown = collectgarbage("count") - before
    collectgarbage("restart")
    assert.is_true(grown < 8, "grew by " .. grown .. " KB")
  end)
end)
