-- tide_kvcache_seq_truncate (Seq:truncate): rolling a sequence back within
-- its last step leaves every cache region (sliding window, compressed
-- entries, indexer keys, both compressor rings) byte-equal to a sequence fed
-- only the kept tokens, and the next steps give the same bits. Steps start
-- around the window's block edges and the ratio-4 / ratio-128 boundaries;
-- with and without a fork sharing the blocks (a released SWA block is then
-- still referenced, or back in the free list).
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local C = require("tide.ffi").C

local V = 1024

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

local function slice(t, a, b)
  local o = {}
  for i = a, b do o[#o + 1] = t[i] end
  return o
end

describe("tide_kvcache_seq_truncate", function()
  -- ratios [0, 4, 128, 4]; window 128 in blocks of 16 so the window's first block moves often
  local A = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
  local m = assert(tide.model(A, { max_tokens = 64, tokenizer = false,
    cache = { context = 512, max_seqs = 8, swa_block = 16 } }))
  local toks = tm.tokens(330, V, 11)

  -- a sequence fed toks[1..n] (chunks of 64)
  local function fed(n)
    local s = assert(m:sequence())
    if n > 0 then
      local _, err = m:feed(s, toks, { to = n, logits = false })
      assert(not err, err)
    end
    return s
  end
  local function same_next(a, b, from)
    local la = m:feed(a, toks, { from = from, to = from + 2 })
    la = la:clone()
    local lb = m:feed(b, toks, { from = from, to = from + 2 })
    assert.equals(0, la:compare(lb).max_abs)
    assert.equals(cache_bytes(m, b.id), cache_bytes(m, a.id))
  end

  it("rolls back to every length within the step, bytes as if never fed", function()
    local cases = 0
    for ci, p0 in ipairs({ 0, 3, 14, 62, 126, 127, 141, 254, 256 }) do
      local base = fed(p0)
      for ni, n in ipairs({ 1, 2, 5, 8 }) do
        for L = p0, p0 + n - 1, n > 2 and 2 or 1 do
          do
            -- (unshared only past the window, where a released block must come back from the free list)
            local shared = p0 < 128 or (ci + ni + L) % 2 == 0
            local a = shared and assert(base:fork()) or fed(p0)
            assert(m:step({ { seq = a, tokens = slice(toks, p0 + 1, p0 + n), logits = "all" } }))
            local okt, terr = a:truncate(L)
            assert(okt, terr)
            assert.equals(L, a:len())
            local ref = assert(base:fork())
            if L > p0 then
              local _, ferr = m:feed(ref, toks, { from = p0 + 1, to = L, logits = false })
              assert(not ferr, ferr)
            end
            assert.equals(cache_bytes(m, ref.id), cache_bytes(m, a.id), "p0 " .. p0 .. " n " .. n .. " L " .. L)
            same_next(a, ref, L + 1)
            a:free()
            ref:free()
            cases = cases + 1
          end
        end
      end
      base:free()
    end
    assert.is_true(cases > 40)
    -- everything returned
    local st = m:cache_stats()
    assert.equals(0, st.seqs)
    assert.equals(st.swa_blocks, st.swa_free)
    assert.equals(st.pages, st.pages_free)
  end)

  it("refuses what it cannot restore, changing nothing", function()
    local a = fed(130)
    local before = cache_bytes(m, a.id)
    local ok, err = a:truncate(131)
    assert.is_nil(ok)
    assert.matches("outside 0%.%.130", err)
    ok, err = a:truncate(100)               -- fed in chunks: 100 is before the last step (128..129)
    assert.is_nil(ok)
    assert.matches("before its last step", err)
    assert.is_true(a:truncate(129))          -- within it: fine
    assert(m:step({ { seq = a, tokens = slice(toks, 130, 131), logits = false } }))
    local b = fed(5)                         -- another step on the cache: the record is gone
    ok, err = a:truncate(130)
    assert.is_nil(ok)
    assert.matches("no roll%-back record", err)
    assert.equals(131, a:len())
    -- a step of 12 tokens overwrote ring rows that most lengths inside it need
    local c = fed(140)
    assert(m:step({ { seq = c, tokens = slice(toks, 141, 152), logits = false } }))
    local c0 = cache_bytes(m, c.id)
    ok, err = c:truncate(142)
    assert.is_nil(ok)
    assert.matches("overwrote compressor rows", err)
    assert.equals(c0, cache_bytes(m, c.id))
    assert.equals(152, c:len())
    a:free() b:free() c:free()
    local s = fed(130)
    assert.equals(before, cache_bytes(m, s.id))
    s:free()
  end)
end)
