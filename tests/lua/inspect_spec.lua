-- Looking inside the sparse attention: s:inspect re-runs a past token
-- exactly (same logits bits), reports the indexer's selection with scores,
-- the window / compressed / sink shares per head and the routed experts;
-- the selections and routes are the fast path's own (its decision dumps),
-- the numbers do not depend on the step's batch, and a step that does not
-- ask passes no buffers to the kernels.
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local inspect = require("tide.inspect")

pcall(ffi.cdef, [[ int memcmp(const void *a, const void *b, size_t n); ]])

local D = tm.get("demo_k8", { "--preset", "demo", "--set", "index_topk=8", "--seed", "5" })
tide.threads(1)
local m = assert(tide.model(D, { max_tokens = 24, cache = { context = 1024, max_seqs = 16, seq_budget = 12 } }))
local K = m.config.index_topk

local function same_bits(a, b)
  return a:numel() == b:numel() and ffi.C.memcmp(a.data, b.data, a:numel() * 4) == 0
end

local function sorted(t)
  local o = {}
  for i, v in ipairs(t) do o[i] = v end
  table.sort(o)
  return o
end

local s = assert(m:session{ seed = 2, max_tokens = 30, print = false, sampler = { temp = 1, top_k = 0, top_p = 1,
  min_p = 0 } })
s:say("Tell me a story about a lighthouse keeper who finds a message in a bottle on a stormy night.")
s:say("What was written in the message, and who had sent it across the sea?")
local toks = s:tokens()
local n = #toks

-- the fast path's logits and decisions for every position, in one pass
local dumps = { topk = {}, routes = {} }
local all = m:logits(toks, { step = { dump_topk = dumps.topk, dump_routes = dumps.routes } })

local function check_report(rep, idx)
  assert.equals(idx, rep.index)
  assert.equals(idx, rep.position)
  assert.equals(toks[idx + 1], rep.id)
  for L = 0, m.net.n_layers - 1 do
    local lr = rep.layers[L]
    assert.equals(m.config.ratios[L], lr.ratio)
    assert.equals(math.max(0, idx - 127), lr.window.first)
    for h, x in ipairs(lr.heads) do
      local total = x.window + x.compressed + x.sink
      assert.is_true(math.abs(total - 1) < 1e-5, ("layer %d head %d: shares sum to %g"):format(L, h, total))
      if lr.ratio == 1 then assert.equals(0, x.compressed) end
    end
    if lr.ratio > 1 then
      local c = lr.compressed
      local nvis = math.floor((idx + 1) / lr.ratio)
      assert.equals(nvis, c.visible)
      -- the fast path's own selection at this position (sorted entry list)
      local ents = {}
      for i, e in ipairs(c.entries) do
        ents[i] = e.entry
        assert.equals(e.entry * lr.ratio, e.first)
        assert.equals(e.entry * lr.ratio + lr.ratio - 1, e.last)
        assert.is_true(e.entry >= 0 and e.entry < nvis)
      end
      if lr.ratio == 4 then
        assert.same(dumps.topk[L][idx + 1], sorted(ents))
        if nvis > K then
          assert.is_true(c.scored)
          assert.equals(K, c.selected)
          -- best first, and no unselected entry scores higher than a selected one
          local chosen, worst = {}, math.huge
          for i, e in ipairs(c.entries) do
            chosen[e.entry] = true
            if i > 1 then assert.is_true(e.score <= c.entries[i - 1].score) end
            worst = math.min(worst, e.score)
          end
          assert.equals(nvis, c.scores:size(0))
          for j = 0, nvis - 1 do
            if not chosen[j] then assert.is_true(c.scores[j] <= worst) end
          end
        end
      else
        assert.equals(nvis, c.selected)
      end
    end
    assert.same(dumps.routes[L][idx + 1], sorted(rep.routes[L].experts))
    assert.equals(m.config.num_experts_per_tok, #rep.routes[L].weights)
  end
end

describe("inspection", function()
  it("re-runs the latest token exactly and reports the selection, shares and routes the fast path used", function()
    assert.is_true(n > 4 * (K + 2), "the conversation must reach the indexer's scoring: " .. n)
    local rep, logits = s:inspect{}
    s:_sync(false)
    assert.is_true(same_bits(logits, s.last_logits), "the re-run's logits differ")
    check_report(rep, n - 1)
    assert.is_true(rep.layers[1].compressed.scored)
  end)

  it("re-runs an earlier token from the nearest snapshot or from scratch", function()
    for _, idx in ipairs({ 3, 40, 61, n - 30 }) do
      local rep, logits = s:inspect{ token = idx }
      assert.is_true(same_bits(logits, all[idx]), "token " .. idx .. ": the re-run's logits differ")
      check_report(rep, idx)
    end
    local rep = s:inspect{ token = -2, layer = 3 }
    assert.equals(n - 2, rep.index)
    assert.is_not_nil(rep.layers[3])
    assert.is_nil(rep.layers[1])
    assert.has_error(function() s:inspect{ token = n } end)
    assert.has_error(function() s:inspect{ layer = 99 } end)
  end)

  it("numbers do not depend on the step's batch: a 50-token step reports what single-token re-runs do", function()
    local seq = assert(m:sequence())
    local part = {}
    for i = 1, 24 do part[i] = toks[i] end
    assert(m:step({ { seq = seq, tokens = part, logits = false } }))
    part = {}
    for i = 25, 48 do part[#part + 1] = toks[i] end
    local spec = { layers = { 1, 2 } }
    assert(m:step({ { seq = seq, tokens = part, logits = false } }, { inspect = spec }))
    seq:free()
    assert.equals(24, spec.T)
    for t = 0, 23, 7 do
      local a = inspect.report(m, spec, t)
      local b = s:inspect{ token = 24 + t, layers = { 1, 2 } }
      assert.equals(24 + t, a.position)
      for _, L in ipairs({ 1, 2 }) do
        assert.same(b.layers[L].heads, a.layers[L].heads)
        assert.same(b.layers[L].compressed.entries, a.layers[L].compressed.entries)
      end
      assert.same(b.routes, a.routes)
    end
  end)

  it("leaves the session as it was, and steps that do not ask arm no probes", function()
    local net = m.net
    local orig = net.attention
    local asked, plain = 0, 0
    net.attention = function(self, l, st)
      if st.probes and st.probes:wants("attn_shares", l.index) then asked = asked + 1 else plain = plain + 1 end
      return orig(self, l, st)
    end
    local ok, err = pcall(function()
      local b = assert(s:fork())
      local before = { len = s:len(), fed = s.fed, rng = s.state:rng_state(), snaps = #s.snaps }
      b:say("And then?")
      assert.equals(0, asked)
      assert.is_true(plain > 0)
      plain = 0
      s:inspect{ token = 50 }
      assert.equals(m.net.n_layers, asked)   -- the inspected token's step only
      assert.is_true(plain > 0)              -- the re-feed before it asked for nothing
      assert.same(before, { len = s:len(), fed = s.fed, rng = s.state:rng_state(), snaps = #s.snaps })
      b:undo()
      local r1, r2 = s:say("And then?"), b:say("And then?")
      assert.same(r2.tokens, r1.tokens)
      b:close()
    end)
    net.attention = orig
    assert(ok, err)
  end)

  it("formats a table per layer and a detailed view of one layer", function()
    local rep = s:inspect{}
    local t = inspect.format(rep, { tokenizer = m.tokenizer })
    assert.matches("token #%d+", t)
    for L = 0, m.net.n_layers - 1 do assert.matches("\n%s+" .. L .. "%s+" .. m.config.ratios[L] .. "%s", t) end
    assert.matches("(indexer)", t, 1, true)
    local d = inspect.format(rep, { layer = 1 })
    assert.matches("layer 1, ratio 4", d, 1, true)
    assert.matches("the indexer selected " .. K .. " of", d, 1, true)
    assert.matches("mean", d, 1, true)
    assert.matches("experts:", d, 1, true)
    assert.has_error(function() inspect.format({ layers = {}, routes = {}, position = 0 }, { layer = 7 }) end)
  end)
end)
