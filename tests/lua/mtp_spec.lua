-- The MTP block (mtp.0.*, doc 2.4) against the golden reference, and greedy
-- speculative decoding with it: the same tokens as plain decoding at every
-- draft length, the main cache after rejections bitwise equal to a run that
-- never drafted, and the draft paths (all accepted, a rejection at each
-- position) reached with an oracle.
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local mtp = require("tide.models.deepseek_v4_mtp")
local C = require("tide.ffi").C

local V = 1024

local function per_position(a, b)
  local T = a:size(0)
  local nm = {}
  for t = 0, T - 1 do nm[t + 1] = a[t]:compare(b[t]).nmse end
  local worst = 0
  for _, x in ipairs(nm) do if x > worst then worst = x end end
  table.sort(nm)
  return nm[math.floor((T + 1) / 2)], worst
end

-- Plain greedy decoding, one token per step: the generated ids.
local function plain(m, prompt, n)
  local s = assert(m:sequence())
  local out = {}
  local lg = m:feed(s, prompt)
  out[1] = lg:argmax()
  while #out < n do
    lg = m:feed(s, { out[#out] })
    out[#out + 1] = lg:argmax()
  end
  s:free()
  return out
end

-- every cache region of a sequence, as bytes
local function cache_bytes(m, id)
  local i64 = ffi.new("int64_t[3]")
  local parts = {}
  for L = 0, m.net.n_layers - 1 do
    for kind = 0, 4 do
      if C.tide_kvcache_seq_extent(m.cache, id, L, kind, i64, i64 + 1, i64 + 2) >= 0 and i64[1] > 0 then
        local t = tide.zeros({ tonumber(i64[1]), tonumber(i64[2]) }, "u8")
        assert(C.tide_kvcache_seq_read(m.cache, id, L, kind, t) >= 0)
        parts[#parts + 1] = L .. ":" .. kind .. ":" .. tonumber(i64[0]) .. ":" .. ffi.string(t.data, t:numel())
      end
    end
  end
  return table.concat(parts, "|")
end

describe("the MTP block", function()
  -- ratios [0, 4, 128, 4] + an SWA-only MTP block; FP8 + MXFP4 weights
  local A = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
  local m = assert(tide.model(A, { max_tokens = 64, tokenizer = false, cache = { context = 512, max_seqs = 8 } }))
  local d = assert(mtp.new(m))
  local hc, dim = m.net.hc, m.net.d
  local fast_mtp, mtp_toks

  it("matches the golden reference on the main model's streams, and recursively on its own", function()
    local T = 40
    local toks = tm.tokens(T + 1, V, 5)
    local prompt = {}
    for i = 1, T do prompt[i] = toks[i] end
    local X = tide.zeros({ T, hc, dim })
    local s = assert(m:sequence())
    assert(m:step({ { seq = s, tokens = prompt, logits = false } },
      { after_forward = function(st) C.tide_tensor_copy(X, st.v.X) end }))
    s:free()
    local nxt = {}
    for i = 1, T do nxt[i] = toks[i + 1] end
    local ms = assert(d:sequence())
    local fast = d:step({ { seq = ms, hidden = X, tokens = nxt, logits = "all" } })[1]
    fast = fast:clone()
    fast_mtp, mtp_toks = fast, toks
    local Hf = d.out:clone()
    local box = ffi.new("tide_refmodel*[1]")
    assert(C.tide_refmodel_new(box, m.ck._h) == 0)
    local ref = ffi.gc(box[0], C.tide_refmodel_free)
    local rl = tide.zeros({ T, V })
    local Hr = tide.zeros({ hc, dim })
    for t = 0, T - 1 do
      assert(C.tide_refmodel_mtp(ref, X[t], nxt[t + 1], rl[t], t == T - 1 and Hr or nil) == 0)
    end
    local med, worst = per_position(fast, rl)
    assert.is_true(med < 3e-4, "median NMSE " .. med)
    assert.is_true(worst < 5e-3, "worst NMSE " .. worst)
    -- the block's output streams agree too, and feeding them back (drafting) still matches
    local c = Hf[T - 1]:compare(Hr)
    assert.is_true(c.nmse < 1e-3, "output streams NMSE " .. c.nmse)
    local r1 = d:step({ { seq = ms, hidden = Hf:narrow(0, T - 1, 1), tokens = { 7 }, logits = "last" } })[1]
    local rr = tide.zeros({ V })
    assert(C.tide_refmodel_mtp(ref, Hf[T - 1], 7, rr, nil) == 0)
    assert.is_true(r1:compare(rr).nmse < 2e-3, "recursive step NMSE " .. r1:compare(rr).nmse)
    -- bad input changes nothing
    local n0 = d:len(ms)
    assert.has_error(function() d:step({ { seq = ms, hidden = Hf:narrow(0, 0, 1), tokens = { V } } }) end)
    assert.equals(n0, d:len(ms))
    d:free(ms)
  end)

  it("matches the independent NumPy implementation (its own main model, free-running)", function()
    assert.is_not_nil(fast_mtp)
    local dir = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/mtp_spec_np"
    os.execute("mkdir -p " .. tm.q(dir))
    local out, rc = tm.sh(table.concat({ "/usr/bin/python3", tm.q(tm.ROOT .. "/tests/ref/dsv4_numpy.py"), "--model",
      tm.q(A), "--tokens", table.concat(mtp_toks, ","), "--out", tm.q(dir .. "/mtp.f32"), "--mtp" }, " "))
    assert.equals(0, rc, out)
    local T = #mtp_toks - 1
    local np = assert(tide.mmap(dir .. "/mtp.f32", "f32", { T, V }))
    -- its main model runs free (no replayed decisions): a near-tie route may flip at a few positions
    local nm = {}
    for t = 0, T - 1 do nm[t + 1] = fast_mtp[t]:compare(np[t]).nmse end
    table.sort(nm)
    assert.is_true(nm[math.floor((T + 1) / 2)] < 1e-3, "median NMSE vs numpy " .. nm[math.floor((T + 1) / 2)])
    assert.is_true(nm[math.ceil(0.9 * T)] < 3e-2, "90th percentile NMSE vs numpy " .. nm[math.ceil(0.9 * T)])
    assert.is_true(nm[T] < 0.1, "worst NMSE vs numpy " .. nm[T])
  end)

  it("the reference main model exposes its streams, and a model without MTP is refused", function()
    local box = ffi.new("tide_refmodel*[1]")
    assert(C.tide_refmodel_new(box, m.ck._h) == 0)
    local ref = ffi.gc(box[0], C.tide_refmodel_free)
    local H = tide.zeros({ hc, dim })
    assert(C.tide_refmodel_step(ref, 3, nil) == 0)
    assert(C.tide_refmodel_hidden(ref, H) == 0)
    assert.is_true(H:compare(tide.zeros({ hc, dim })).nmse > 0)
    local B = tm.get("nomtp", { "--preset", "tiny", "--seed", "2", "--set", "num_nextn_predict_layers=0" })
    local mb = assert(tide.model(B, { max_tokens = 16, tokenizer = false }))
    local x, err = mtp.new(mb)
    assert.is_nil(x)
    assert.matches("no MTP block", err)
  end)

  local prompt = tm.tokens(23, V, 9)
  local N = 14
  local base = plain(m, prompt, N)

  it("greedy speculation gives the plain tokens at every draft length", function()
    for k = 0, 4 do
      local out, st = d:greedy(prompt, N, k)
      assert.same(base, out, "k = " .. k)
      if k > 0 then assert.is_true(st.drafted > 0 and st.steps < N + 1) end
    end
  end)

  it("draft policies: fixed drafts k; adaptive turns off when nothing is accepted, up when all is", function()
    local out, st = d:greedy(prompt, N, 3, { policy = "fixed" })
    assert.same(base, out)
    assert.is_true(st.drafted >= 3 * (st.steps - 1))
    out, st = d:greedy(prompt, N, 4, { policy = "adaptive" })
    assert.same(base, out)
    -- random MTP weights: nothing is accepted, so after the first draft only probes remain
    assert.is_true(st.drafted <= 3, "adaptive drafted " .. st.drafted)
    local oracle = function(n_out, _, kk)
      local dr = {}
      for j = 1, kk do dr[j] = base[n_out + j] or 0 end
      return dr
    end
    out, st = d:greedy(prompt, N, 4, { policy = "adaptive", drafts = oracle })
    assert.same(base, out)
    assert.equals(st.drafted, st.accepted)
    assert.is_true(st.steps <= 5, "adaptive with perfect drafts took " .. st.steps .. " steps")
  end)

  it("with a sampler chain picking each committed token, sampled output is the same with and without drafts", function()
    local sampling = require("tide.sampling")
    local smp = assert(sampling.from_options({ temp = 1.5, top_k = 40, seed = 3 }))
    local function run(k)
      local st = smp:new_state({ seed = 11 })
      return (d:greedy(prompt, N, k, { pick = function(row) return (st:sample(row)) end }))
    end
    local ref = run(0)
    for _, k in ipairs({ 1, 3 }) do assert.same(ref, run(k), "k = " .. k) end
  end)

  it("the rejection rule samples the main model's distribution (chi-square), the drafts alone do not", function()
    -- the rule on the real rows of one position: p = the main model's row
    -- after P, t1; q = the MTP block's row for the same token (drafted from
    -- the main streams of P); 4000 draws of draft + accept/resample
    local temp, R = 0.7, 4000
    local P = tm.tokens(5, V, 21)
    local t1 = 17
    local all = {}
    for i, t in ipairs(P) do all[i] = t end
    all[#all + 1] = t1
    local prow = m:logits(all)[#all - 1]:clone()
    local X = tide.zeros({ #P, hc, dim })
    local s = assert(m:sequence())
    assert(m:step({ { seq = s, tokens = P, logits = false } },
      { after_forward = function(st) C.tide_tensor_copy(X, st.v.X) end }))
    s:free()
    local ms = assert(d:sequence())
    local nxt = {}
    for i = 2, #all do nxt[#nxt + 1] = all[i] end
    local qrow = d:step({ { seq = ms, hidden = X, tokens = nxt, logits = "last" } })[1]:clone()
    d:free(ms)
    -- the exact distribution at this temperature
    local cb = ffi.new("tide_cands*[1]")
    assert(C.tide_cands_new(cb, V) == 0)
    local c = ffi.gc(cb[0], C.tide_cands_free)
    assert(C.tide_cands_load(c, prow, 0) == 0 and C.tide_cands_temperature(c, temp) == 0)
    assert(C.tide_cands_softmax(c) == 0)
    local p = {}
    for i = 0, V - 1 do p[c.id[i]] = c.p[i] end
    local got, drafted = {}, {}
    local S = mtp.rejection_sampler(V, 1, temp, 7)
    for _ = 1, R do
      local x = S.draft_pick(qrow, 1)
      drafted[x] = (drafted[x] or 0) + 1
      local y = S.pick(prow, x, 1)
      got[y] = (got[y] or 0) + 1
    end
    -- bins: tokens expected at least 5 times, the rest pooled
    local ids = {}
    for id = 0, V - 1 do ids[#ids + 1] = id end
    table.sort(ids, function(a, b) return p[a] > p[b] end)
    local function chi2(obs)
      local x2, bins, rest_e, rest_o = 0, 0, 0, 0
      for _, id in ipairs(ids) do
        local e = R * p[id]
        if e >= 5 then
          x2 = x2 + ((obs[id] or 0) - e) ^ 2 / e
          bins = bins + 1
        else
          rest_e, rest_o = rest_e + e, rest_o + (obs[id] or 0)
        end
      end
      if rest_e > 0 then x2, bins = x2 + (rest_o - rest_e) ^ 2 / rest_e, bins + 1 end
      local df = bins - 1
      local a = 2 / (9 * df)
      return x2, df * (1 - a + 3.09 * math.sqrt(a)) ^ 3   -- the 0.999 quantile (Wilson-Hilferty)
    end
    local x2, crit = chi2(got)
    assert.is_true(S.rejected > R / 20 and S.rejected < R, "rejections " .. S.rejected .. " of " .. R)
    assert.is_true(x2 < crit, string.format("chi-square %.1f >= %.1f", x2, crit))
    local x2d, critd = chi2(drafted)
    assert.is_true(x2d > critd, string.format("the drafts alone pass: chi-square %.1f < %.1f", x2d, critd))
    -- end to end through Mtp:greedy: the rule sees the same rows (a few seeds)
    for seed = 1, 12 do
      local S2 = mtp.rejection_sampler(V, 1, temp, seed)
      local rows = {}
      local first = true
      local out = d:greedy(P, 2, 1, { draft_pick = function(r, j)
          rows.q = r:clone()
          return S2.draft_pick(r, j)
        end,
        pick = function(r, dr, j)
          if first then first = false return t1 end   -- condition on the first token
          rows.p = r:clone()
          return S2.pick(r, dr, j)
        end })
      assert.equals(t1, out[1])
      assert.equals(0, rows.p:compare(prow).max_abs)
      assert.equals(0, rows.q:compare(qrow).max_abs)
    end
  end)

  it("accepts an oracle's drafts, rejects one at each position; the cache matches plain decoding", function()
    for _, km in ipairs({ { 1, 0 }, { 1, 1 }, { 2, 2 }, { 3, 0 }, { 3, 1 }, { 4, 3 } }) do
      do   -- miss 0: all right; j: the j-th draft of every step is wrong
        local k, miss = km[1], km[2]
        local s = assert(m:sequence())
        local out, st = d:greedy(prompt, N, k, { seq = s, drafts = function(n_out, _, kk)
          local dr = {}
          for j = 1, kk do
            dr[j] = base[n_out + j] or 0
            if j == miss then dr[j] = (dr[j] + 1) % V end
          end
          return dr
        end })
        assert.same(base, out, "k = " .. k .. " miss = " .. miss)
        if miss == 0 then assert.equals(st.drafted, st.accepted) else assert.is_true(st.accepted < st.drafted) end
        -- the main cache equals a sequence that was fed the same tokens one by one
        local all = {}
        for i, t in ipairs(prompt) do all[i] = t end
        for _, t in ipairs(out) do all[#all + 1] = t end
        local n = s:len()
        local p = assert(m:sequence())
        m:feed(p, all, { to = n, chunk = 1, logits = false })
        assert.equals(n, p:len())
        assert.is_true(cache_bytes(m, s.id) == cache_bytes(m, p.id), "cache bytes k = " .. k .. " miss = " .. miss)
        p:free()
        s:free()
      end
    end
  end)

  it("snapshots, restores and forks around speculative steps act as around plain ones", function()
    -- what sessions do (undo = restore a snapshot, fork = share blocks): a snapshot taken before
    -- speculative steps that roll back past the window's block edge (blocks it shares are released
    -- and taken back) keeps its bytes; restoring it and decoding again, or forking after the
    -- speculation and decoding on, gives the plain bits; every block returns to the pool
    local st0 = m:cache_stats()
    local long = tm.tokens(180, V, 31)
    local s = assert(m:sequence())
    m:feed(s, long, { logits = false })
    local snap = assert(s:fork())
    local before = cache_bytes(m, snap.id)
    local n = 20
    local out = d:greedy({ 7 }, n, 3, { seq = s, drafts = function(n_out, _, kk)
      local dr = {}
      for j = 1, kk do dr[j] = (n_out + j) % 3 == 0 and 5 or (n_out * 7 + j) % V end
      return dr
    end })
    assert.equals(before, cache_bytes(m, snap.id), "the snapshot changed")
    -- the plain reference: the same tokens one by one
    local all = {}
    for i, t in ipairs(long) do all[i] = t end
    all[#all + 1] = 7
    for _, t in ipairs(out) do all[#all + 1] = t end
    local p = assert(m:sequence())
    m:feed(p, all, { to = s:len(), logits = false })
    assert.equals(cache_bytes(m, p.id), cache_bytes(m, s.id))
    -- fork after the speculation; decode on both and on the reference
    local f = assert(s:fork())
    local nxt = { 11, 12, 13 }
    local lf = m:feed(f, nxt):clone()
    local ls = m:feed(s, nxt):clone()
    local lp = m:feed(p, nxt)
    assert.equals(0, lf:compare(lp).max_abs)
    assert.equals(0, ls:compare(lp).max_abs)
    -- undo: back to the snapshot, the same as never having generated
    s:assign(snap)
    assert.equals(before, cache_bytes(m, s.id))
    local q = assert(m:sequence())
    m:feed(q, long, { logits = false })
    local la = m:feed(s, nxt):clone()
    assert.equals(0, la:compare(m:feed(q, nxt)).max_abs)
    for _, x in ipairs({ s, snap, p, f, q }) do x:free() end
    local st = m:cache_stats()
    assert.equals(st0.swa_free, st.swa_free)
    assert.equals(st0.pages_free, st.pages_free)
  end)

  it("tide generate --draft N prints the same text as without and reports the acceptance", function()
    local ids = table.concat(tm.tokens(9, V, 4), ",")
    local base_cmd = table.concat({ tm.q(tm.EXE), "generate", "--model", tm.q(A), "--tokens", ids, "--max-tokens", "12",
      "--seed", "5", "--temp", "0.9" }, " ")
    local plain_out, rc = tm.sh(base_cmd .. " 2>/dev/null")
    assert.equals(0, rc, plain_out)
    local spec_out, rc2 = tm.sh(base_cmd .. " --draft 3 2>/dev/null")
    assert.equals(0, rc2, spec_out)
    assert.equals(plain_out, spec_out)
    local err = tm.sh(base_cmd .. " --draft 3 2>&1 >/dev/null")
    assert.matches("draft: %d+ steps, [%d.]+ tokens/step, %d+ drafted, %d+ accepted", err)
    local ad = tm.sh(base_cmd .. " --draft 3 --draft-policy adaptive 2>/dev/null")
    assert.equals(plain_out, ad)
    local bad, rc3 = tm.sh(base_cmd .. " --draft 3 --draft-policy nope 2>&1")
    assert.is_true(rc3 ~= 0)
    assert.matches("no such policy", bad)
  end)
end)
