-- Sessions that speculate (tide.session with draft = k, docs/speculative.md)
-- on the trained model (its MTP block was trained, so drafts are both
-- accepted and rejected): every reply, the next logits and every cache byte
-- are the same as in a session that never drafted, greedy and sampled, and
-- stay so through say, undo, regen, truncate, fork and save/load; sessions
-- with probes do not draft; bad draft settings are refused; a raising draft
-- policy ends only its reply.
local tide = require("tide")
local ffi = require("ffi")
local C = tide.C
local session = require("tide.session")

pcall(ffi.cdef, [[ int memcmp(const void *a, const void *b, size_t n); ]])

local DIR = os.getenv("TIDE_TRAINED_MODEL") or "models/tide-tiny-en"
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/session_draft_spec"
os.execute("mkdir -p " .. TMP)
-- max_tokens 16: replies run past several verify steps, turns are fed in chunks
local m = assert(tide.model(DIR, { max_tokens = 16, cache = { context = 1024, max_seqs = 24 } }))

-- every cache region of a sequence, as bytes
local function cache_bytes(id)
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

local function same_bits(a, b)
  return a:numel() == b:numel() and ffi.C.memcmp(a.data, b.data, a:numel() * 4) == 0
end

-- a (drafting) and b (plain) hold the same tokens, cache bytes and next logits
local function same_state(a, b, what)
  assert.same(b:tokens(), a:tokens(), what .. ": tokens")
  a:_sync(false, "prefill")
  b:_sync(false, "prefill")
  assert.equals(#b:tokens(), a.seq:len(), what)
  assert.is_true(cache_bytes(b.seq.id) == cache_bytes(a.seq.id), what .. ": cache bytes differ")
  assert.is_true(same_bits(a.last_logits, b.last_logits), what .. ": next logits differ")
end

local function new(opts)
  local o = { print = false, max_tokens = 40, sampler = { temp = 0 }, seed = 5 }
  for k, v in pairs(opts or {}) do o[k] = v end
  return assert(m:session(o))
end

local U = { "Who was the king of Israel?", "And what did the LORD say unto him?", "Tell me of the prophets.",
  "What came to pass after that?" }

describe("sessions that speculate", function()
  it("generate the same tokens, logits and cache at every k, greedy and sampled", function()
    local acc, rej = 0, 0
    for _, sampler in ipairs({ { temp = 0 }, { temp = 0.8, top_k = 40 } }) do
      for k = 1, 4 do
        local a, b = new({ sampler = sampler }), new({ sampler = sampler })
        for _, s in ipairs({ a, b }) do s:append("And it came to pass, when the king") end
        local ra = a:generate({ max_tokens = 30, draft = k })
        local rb = b:generate({ max_tokens = 30 })
        assert.same(rb.tokens, ra.tokens, "k = " .. k)
        assert.equals(rb.text, ra.text)
        assert.equals(rb.finish_reason, ra.finish_reason)
        assert.is_nil(rb.speculation)
        local sp = ra.speculation
        assert.equals(k, sp.max)
        assert.is_true(sp.steps > 0 and sp.drafted > 0, "it drafted")
        assert.is_true(sp.tokens_per_step >= 1)
        acc, rej = acc + sp.accepted, rej + (sp.drafted - sp.accepted)
        same_state(a, b, "k = " .. k)
        -- a second reply after the first (the MTP state carried on)
        local ra2 = a:generate({ max_tokens = 20, draft = k })
        assert.same(b:generate({ max_tokens = 20 }).tokens, ra2.tokens)
        same_state(a, b, "k = " .. k .. ", second reply")
        assert.is_true(a:stats().speculation.drafted >= sp.drafted + ra2.speculation.drafted)
        a:close()
        b:close()
      end
    end
    assert.is_true(acc > 0 and rej > 0, "drafts were both accepted and rejected")
  end)

  it("stays exact through say, undo, regen, truncate, fork and save/load", function()
    local sampler = { temp = 0.8, top_k = 40 }
    local a, b = new({ sampler = sampler, draft = 3, max_tokens = 24 }), new({ sampler = sampler, max_tokens = 24 })
    local function both(fn, what)
      local ra, rb = fn(a), fn(b)
      if rb then
        assert.same(rb.tokens, ra.tokens, what)
        assert.equals(rb.finish_reason, ra.finish_reason, what)
        assert.is_table(ra.speculation, what .. ": a drafting reply")
        assert.is_nil(rb.speculation)
      end
      same_state(a, b, what)
    end
    both(function(s) return s:say(U[1]) end, "say 1")
    both(function(s) return s:say(U[2]) end, "say 2")
    both(function(s) s:undo() end, "undo")
    both(function(s) return s:say(U[3]) end, "say 3")
    both(function(s) return s:regen() end, "regen")
    both(function(s) return s:regen() end, "regen again")
    both(function(s) s:truncate(-7) end, "truncate")
    both(function(s) return s:generate({ max_tokens = 12 }) end, "generate after truncate")
    -- forks of both, each continuing
    local fa, fb = assert(a:fork()), assert(b:fork())
    local rfa, rfb = fa:say(U[4]), fb:say(U[4])
    assert.same(rfb.tokens, rfa.tokens, "fork")
    assert.is_table(rfa.speculation, "the fork drafts too")
    same_state(fa, fb, "fork")
    both(function(s) return s:say(U[4]) end, "the parent after the fork")
    fa:close()
    fb:close()
    -- save after speculation; the loaded session keeps drafting and stays exact
    assert(a:save(TMP .. "/a.tsess"))
    assert(b:save(TMP .. "/b.tsess"))
    local la = assert(session.load(m, TMP .. "/a.tsess", { print = false }))
    local lb = assert(session.load(m, TMP .. "/b.tsess", { print = false }))
    assert.equals(3, la.draft)
    assert.is_nil(lb.draft)
    local rla, rlb = la:say(U[1]), lb:say(U[1])
    assert.same(rlb.tokens, rla.tokens, "after load")
    assert.is_table(rla.speculation)
    same_state(la, lb, "after load")
    both(function(s) return s:say(U[1]) end, "the saved sessions go on")
    assert.same(a:tokens(), la:tokens())
    for _, s in ipairs({ a, b, la, lb }) do s:close() end
  end)

  it("does not draft with probes; refuses bad settings; a raising policy ends only its reply", function()
    local calls = 0
    local p = new({ draft = 2, probes = { { at = "final", fn = function() calls = calls + 1 end } } })
    p:append("And the king said unto")
    local r = p:generate({ max_tokens = 8 })
    assert.is_nil(r.speculation, "a session with probes does not draft")
    assert.is_true(calls > 0)
    p:close()
    local s, err = m:session({ draft = 99 })
    assert.is_nil(s)
    assert.matches("draft", err)
    local q = new()
    q:append("And the king said unto")
    assert.has_error(function() q:generate({ draft = "three" }) end)
    assert.has_error(function() q:set({ draft = { max = 2, what = 1 } }) end)
    assert.has_error(function() q:generate({ draft = { max = 2, accept = "rejection" } }) end,
      "draft: sessions take accept = \"chain\" only (the exact pick; docs/speculative.md)")
    q:set({ draft = 2 })
    assert.equals(2, q:generate({ max_tokens = 6 }).speculation.max)
    -- a draft policy that raises: the reply ends with the error, the session goes on
    local bad = { name = "bad", new = function() return {} end, draft = function() error("no drafts today") end,
      observe = function() end }
    local before = #q:tokens()
    local rb = q:generate({ max_tokens = 6, draft = { max = 2, policy = bad } })
    assert.equals("error", rb.finish_reason)
    assert.matches("no drafts today", rb.error)
    assert.equals(1, #rb.tokens, "the first pick (a plain step) stays; the policy fails before the next")
    assert.equals(before + 1, #q:tokens())
    local plain = new()
    plain:append(q:tokens())
    assert.same(plain:generate({ max_tokens = 6 }).tokens, q:generate({ max_tokens = 6, draft = 1 }).tokens)
    plain:close()
    q:close()
    assert.equals(0, m:cache_stats().seqs, "every sequence freed")
  end)

  it("tide chat --draft: the same replies, the figures in /stats", function()
    local tm = require("testmodels")
    local input = TMP .. "/chat.in"
    local f = assert(io.open(input, "w"))
    f:write("Who was the king?\n/undo\nAnd what did he say?\n/stats\n/quit\n")
    f:close()
    local function chat(extra)
      local out, rc = tm.sh(string.format("%s chat --model %s --max-tokens 16 --temp 0.8 --seed 3 --threads 1 %s < %s",
        tm.q(tm.EXE), tm.q(DIR), extra, tm.q(input)))
      assert.equals(0, rc, out)
      return out
    end
    local plain, drafted = chat(""), chat("--draft 2")
    local function replies(out)   -- without the figures and the timings
      return (out:gsub("drafts %(MTP.-\n", ""):gsub("[%d.]+ tokens/s", ""):gsub("in [%d.]+ s", ""))
    end
    assert.equals(replies(plain), replies(drafted))
    assert.matches("drafts %(MTP, up to 2%): %d+ drafted", drafted)
    assert.not_matches("drafts %(MTP", plain)
  end)
end)
