-- attn_spec: the Lua face of the KV cache and the attention kernels: a
-- two-layer attention step wired from Lua, sequences, fork/restore, byte
-- views and export, errors that name the problem, TIDE_FULL as nil+message,
-- abort on a Lua error, and no C allocation per kernel call.
local tide = require("tide")
local attn = tide.attn

local function fails(pat, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error matching '" .. pat .. "'")
  assert.matches(pat, tostring(err))
end

-- one layer's step from Lua: returns the attention output [T, H, 512]
local function layer_step(cache, L, b, rope, seed, bufs)
  local r = cache:ratio(L)
  local q, kv, out = bufs.q, bufs.kv, bufs.out
  q:normal(seed, 0, 1)
  kv:normal(seed + 1, 0, 1)
  attn.q_prep(q, b, rope)
  attn.kv_insert(cache, L, kv, b, rope)
  local topk
  if r == 4 then
    bufs.qi:normal(seed + 2, 0, 1)
    bufs.wr:uniform(seed + 3, 0, 1)
    attn.indexer_q(bufs.q8, bufs.w, bufs.qi, bufs.wr, b, rope)
    bufs.ikvs:normal(seed + 4, 0, 1)
    attn.compress_indexer(cache, L, bufs.ikvs, bufs.iape, bufs.inorm, b, rope)
    topk = bufs.topk
  end
  if r > 1 then
    local kvs = r == 4 and bufs.kvs4 or bufs.kvs128
    kvs:normal(seed + 5, 0, 1)
    attn.compress(cache, L, kvs, r == 4 and bufs.ape4 or bufs.ape128, bufs.norm, b, rope)
  end
  if topk then attn.indexer_topk(cache, L, bufs.q8, bufs.w, b, topk) end
  attn.sparse(out, q, cache, L, b, topk, bufs.sink, nil, bufs.stats)
  attn.o_unrope(out, out, b, rope)
  return out
end

local function make_bufs(T, H, nI)
  return {
    q = tide.zeros(T, H, 512), kv = tide.zeros(T, 512), out = tide.zeros(T, H, 512),
    stats = tide.zeros(T, H, 4), qi = tide.zeros(T, nI, 128), wr = tide.zeros(T, nI),
    q8 = tide.zeros({ T, nI, 128 }, "u8"), w = tide.zeros(T, nI), ikvs = tide.zeros(T, 512),
    kvs4 = tide.zeros(T, 2048), kvs128 = tide.zeros(T, 1024), topk = tide.zeros({ T, 16 }, "i32"),
    ape4 = tide.randn({ 4, 1024 }, { seed = 1 }), ape128 = tide.randn({ 128, 512 }, { seed = 2 }),
    iape = tide.randn({ 4, 256 }, { seed = 3 }), norm = tide.ones(512), inorm = tide.ones(128),
    sink = tide.zeros(H),
  }
end

describe("tide.attn", function()
  it("wires a C4 + C128 + SWA step from Lua", function()
    local cache = attn.cache({ ratios = { 4, 128, 0 }, swa_blocks = 16, pages = 4, max_seqs = 2 })
    local rope = attn.rope({ theta = 160000, yarn = { factor = 16, original_max = 256 } })
    local b = attn.batch(200)
    local s = cache:seq_new()
    assert.equals(0, s)
    local T, H = 130, 2
    local bufs = make_bufs(T, H, 4)
    b:add(s, 0, T)
    assert.equals(T, b:tokens())
    assert.is_true(cache:prepare(b))
    for L = 0, 2 do layer_step(cache, L, b, rope, 10 * L + 1, bufs) end
    local sl = b:slots(cache, 0, "swa")
    assert.same({ T, 128 }, sl:shape())
    assert.equals(-1, sl[0][1])
    cache:commit(b)
    assert.equals(T, cache:len(s))
    -- p = 129 sees one C128 entry: compressed mass > 0 (layer 1 ran second)
    -- stats of the last layer (SWA only): no compressed mass
    assert.equals(0, bufs.stats[T - 1][0][1])
    local first, rows, rb = cache:extent(s, 1, "main")
    assert.same({ 0, 1, 584 }, { first, rows, rb })
    local bytes = cache:read(s, 0, "swa")
    assert.same({ T, 584 }, bytes:shape())
    -- the byte view shares memory with the cache
    local v = cache:view(0, "swa")
    assert.same({ 16, 64 * 584 }, v:shape())
    assert.matches("SWA %d+/16 blocks free", tostring(cache))
  end)

  it("forks, restores and aborts on a Lua error", function()
    local cache = attn.cache({ ratios = { 0 }, swa_blocks = 8, max_seqs = 3, keep_swa_history = true })
    local rope = attn.rope({ theta = 10000 })
    local b = attn.batch(64)
    local bufs = make_bufs(10, 1, 4)
    local s = cache:seq_new()
    b:add(s, 0, 10)
    assert.is_true(cache:step(b, function(c, bb) layer_step(c, 0, bb, rope, 5, bufs) end))
    local snap = cache:snapshot(s)
    local before = cache:read(s, 0, "swa"):clone()
    b:clear():add(s, 10, 5)
    fails("boom", function() cache:step(b, function() error("boom") end) end)
    assert.equals(10, cache:len(s))
    assert.is_false(cache:stats().step_active)
    cache:restore(s, snap)
    assert.equals(0, cache:read(s, 0, "swa"):compare(before).max_abs)
    local nb, np = cache:usage(snap)
    assert.equals(1, nb)
    assert.equals(0, np)
  end)

  it("returns nil and a message when the pool is full", function()
    local cache = attn.cache({ ratios = { 0 }, swa_blocks = 1, max_seqs = 1 })
    local b = attn.batch(100)
    local s = cache:seq_new()
    assert.is_nil(cache:seq_new())
    b:add(s, 0, 100)
    local ok, err = cache:prepare(b)
    assert.is_nil(ok)
    assert.matches("needs 2 SWA blocks %(1 free%)", err)
    assert.equals(1, cache:stats().swa_free)
  end)

  it("names the problem on misuse", function()
    local cache = attn.cache({ ratios = { 0, 4 }, swa_blocks = 4, pages = 2 })
    local rope = attn.rope({})
    local b = attn.batch(4)
    local s = cache:seq_new()
    b:add(s, 0, 2)
    fails("not prepared", function() attn.kv_insert(cache, 0, tide.zeros(2, 512), b, rope) end)
    assert.is_true(cache:prepare(b))
    fails("kv has shape %[3, 512%]", function() attn.kv_insert(cache, 0, tide.zeros(3, 512), b, rope) end)
    fails("ratio 1", function()
      attn.compress(cache, 0, tide.zeros(2, 2048), tide.zeros(4, 1024), tide.ones(512), b, rope)
    end)
    fails("does not continue", function() attn.batch(4):add(s, 0, 1):add(s, 5, 1) end)
    fails("unknown cache region 'bogus'", function() cache:extent(s, 0, "bogus") end)
    fails("ratios", function() attn.cache({}) end)
    cache:abort(b)
  end)

  it("does not allocate in C per kernel call", function()
    local cache = attn.cache({ ratios = { 4 }, swa_blocks = 8, pages = 4 })
    local rope = attn.rope({ theta = 160000, yarn = { factor = 16, original_max = 256 } })
    local b = attn.batch(8)
    local bufs = make_bufs(1, 2, 4)
    local s = cache:seq_new()
    local function one(p)
      b:clear():add(s, p, 1)
      assert.is_true(cache:prepare(b))
      layer_step(cache, 0, b, rope, p, bufs)
      cache:commit(b)
    end
    for p = 0, 19 do one(p) end -- warm the grow-only scratch
    collectgarbage("collect")
    local before = tide.alloc_stats().total_allocs
    for p = 20, 59 do one(p) end
    assert.equals(before, tide.alloc_stats().total_allocs)
  end)

  it("gives RoPE tables and slot mapping to Lua", function()
    local plain = attn.rope({ theta = 10000 })
    local yarn = attn.rope({ theta = 160000, yarn = { factor = 16, original_max = 65536 } })
    local f, fy = plain:freqs(), yarn:freqs()
    assert.equals(1, f[1])
    assert.near(10000 ^ (-2 / 64), f[2], 1e-7)
    -- YaRN band for theta 160000, L0 65536: lo = 15, hi = 25 (doc 2.2.2)
    assert.near(160000 ^ (-20 / 64), fy[11], 1e-9)       -- i = 10 < lo: unchanged
    assert.near(160000 ^ (-60 / 64) / 16, fy[31], 1e-12) -- i = 30 > hi: divided by the factor
    local i = 20 -- halfway: ramp 0.5
    local fi = 160000 ^ (-2 * i / 64)
    assert.near(fi * 0.5 + fi / 16 * 0.5, fy[i + 1], fi * 1e-6)
    local c, s = plain:cos_sin(3)
    assert.near(math.cos(3), c[1], 1e-6)
    assert.near(math.sin(3), s[1], 1e-6)
    local x = tide.randn({ 2, 64 }, { seed = 4 })
    local x0 = x:clone()
    local pos = tide.tensor({ 5, 70000 }, "i64")
    yarn:apply(x, pos)
    yarn:apply(x, pos, true)
    assert.is_true(x:compare(x0).max_abs < 1e-5)
    local cache = attn.cache({ ratios = { 0 }, swa_blocks = 4 })
    local sq = cache:seq_new()
    assert.is_true(cache:set_length(sq, 70))
    local slots = cache:map_slots(sq, 0, "swa", tide.tensor({ -1, 0, 69, 200 }, "i64"))
    assert.equals(-1, slots[0])
    assert.equals(-1, slots[3])
    assert.equals(69 % 64, slots[2] % 64)
  end)
end)
