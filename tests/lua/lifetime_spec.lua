-- Lifetimes of everything that borrows a C object (docs/conventions.md,
-- "Ownership"): sequences and forks borrow the model's KV cache, sessions
-- and their snapshots and engines and their requests hold sequences,
-- streamers borrow a tokenizer, linear handles and views borrow a
-- checkpoint's mappings, reference-mode state borrows the checkpoint's
-- tensors, a prepared batch is linked to a raw cache. Every holder keeps
-- what it borrows alive in C (reference counts), so no order of explicit
-- closes, garbage collection or process exit (lua_close runs every
-- finalizer, whatever references the objects) touches freed memory. Under
-- `make asan-test` a use after free aborts the process; here the exit
-- status, the output and the allocation counters are checked as well.
local tide = require("tide")
local tm = require("testmodels")
local ffi = require("ffi")

local D = tm.get("demo_k8", { "--preset", "demo", "--set", "index_topk=8", "--seed", "5" })
tide.threads(1)

local function full_gc()
  for _ = 1, 3 do collectgarbage("collect") end
end

local function counters()
  local s = tide.alloc_stats()
  return { s.live_allocs, s.live_storages, s.live_maps }
end

-- Orders of 1..n in which every item comes at every position and every
-- pair comes both ways: the n rotations of 1..n and the n of n..1.
local function orders(n)
  local out = {}
  for r = 0, n - 1 do
    local a, b = {}, {}
    for i = 1, n do
      a[i] = (i - 1 + r) % n + 1
      b[i] = n - a[i] + 1
    end
    out[#out + 1], out[#out + 2] = a, b
  end
  return out
end

local function float_at(t, i) return ffi.cast("const float *", t.data)[i] end

describe("object lifetimes", function()
  local m
  setup(function()
    m = assert(tide.model(D, { max_tokens = 16, cache = { context = 512, max_seqs = 24, seq_budget = 8 } }))
  end)
  teardown(function()
    if m then m:close() end
  end)

  -- a web of holders over one model, each with a close and a check that it
  -- still works (or refuses cleanly) whatever was closed before
  local function web()
    local w = {}
    w.seq = assert(m:sequence())
    m:step({ { seq = w.seq, tokens = { 1, 2, 3 }, logits = "last" } })
    w.fork = assert(w.seq:fork())
    w.sess = assert(m:session({ print = false, seed = 1, max_tokens = 2,
      sampler = { temp = 0.8, repeat_penalty = 1.1 } }))
    w.sess:say("Hi")
    w.eng = tide.engine(m, { budget = 16, max_running = 1 })
    w.req = w.eng:submit({ tokens = { 5, 6, 7 }, max_tokens = 4, seed = 2 })
    w.eng:step()
    w.tok = assert(tide.tokenizer(D))
    w.st = w.tok:streamer()
    w.ck = assert(tide.load(D))
    w.lin = tide.quant.linear(w.ck:tensor("layers.0.attn.wq_a.weight"),
      w.ck:has("layers.0.attn.wq_a.scale") and w.ck:tensor("layers.0.attn.wq_a.scale") or nil)
    w.x = tide.ones({ 1, w.lin.k })
    w.y0 = w.lin:forward(w.x)
    w.hello = w.tok:decode({ 19923 })
    return w
  end

  local CLOSERS = {
    { "seq", function(w) w.seq:free() end },
    { "sess", function(w) w.sess:close() end },
    { "eng", function(w) w.eng:close() end },
    { "tok", function(w) w.tok:close() end },
    { "ck", function(w) w.ck:close() end },
  }
  -- what must keep working after any of the others closed
  local function check_rest(w, closed, name)
    if not closed.seq then assert.equals(3, w.seq:len(), name) end
    assert.equals(3, w.fork:len(), name)   -- never closed here
    if not closed.sess then
      assert.is_true(#w.sess:tokens() > 0, name)
    end
    if not closed.eng then w.eng:step() end
    if not closed.tok then
      assert.equals(w.hello, w.st:put(19923) .. w.st:flush(), name)
    else
      assert.has_error(function() w.st:put(19923) end)
    end
    -- the linear handle outlives the checkpoint handle it was made from
    local y = w.lin:forward(w.x)
    for i = 0, y:numel() - 1, 97 do assert.equals(float_at(w.y0, i), float_at(y, i), name) end
  end

  it("closed explicitly in every order, the rest keeps working", function()
    local base
    for pass, order in ipairs(orders(#CLOSERS)) do
      local w = web()
      local closed, names = {}, {}
      for _, k in ipairs(order) do names[#names + 1] = CLOSERS[k][1] end
      local name = table.concat(names, ",")
      for _, k in ipairs(order) do
        CLOSERS[k][2](w)
        closed[CLOSERS[k][1]] = true
        check_rest(w, closed, name)
      end
      w.st:close()
      w.lin:close()
      w.fork:free()
      w = nil   -- luacheck: ignore 311
      full_gc()
      local st = m:cache_stats()
      assert.equals(0, st.seqs, name)
      assert.equals(st.pages, st.pages_free, name)
      -- nothing of the web is left in C (the first pass warms caches up)
      if pass == 2 then base = counters() end
      if pass > 2 then assert.same(base, counters(), name) end
    end
  end)

  it("collected in every order, the last holder frees the C object", function()
    local groups = { "seqs", "sess", "eng", "tok", "ck" }
    local base
    for pass, order in ipairs(orders(#groups)) do
      local w = web()
      local held = {   -- luacheck: ignore 241
        seqs = { w.seq, w.fork }, sess = { w.sess }, eng = { w.eng, w.req },
        tok = { w.tok, w.st }, ck = { w.ck, w.lin },
      }
      w = nil   -- luacheck: ignore 311
      full_gc()
      for _, k in ipairs(order) do
        held[groups[k]] = nil
        full_gc()
      end
      local st = m:cache_stats()
      assert.equals(0, st.seqs)
      if pass == 2 then base = counters() end
      if pass > 2 then assert.same(base, counters()) end
    end
  end)

  it("a model dropped with live sequences is freed with the last one", function()
    full_gc()
    local before = counters()
    for _ = 1, 2 do
      local m2 = assert(tide.model(D, { max_tokens = 8, tokenizer = false,
        cache = { context = 256, max_seqs = 4, seq_budget = 2 } }))
      local s = assert(m2:sequence())
      m2:step({ { seq = s, tokens = { 1, 2 }, logits = "last" } })
      local f = assert(s:fork())
      m2 = nil   -- luacheck: ignore 311
      full_gc()
      assert.equals(2, f:len())   -- the cache lives on through the sequences
      s = nil   -- luacheck: ignore 311
      full_gc()
      assert.equals(2, f:len())
      f = nil   -- luacheck: ignore 311
      full_gc()
    end
    assert.same(before, counters())
  end)

  it("keeps Lua memory under from_pointer alive for views and linear handles", function()
    local function make()
      local buf = ffi.new("float[?]", 64)
      for i = 0, 63 do buf[i] = i + 0.5 end
      local t = tide.from_pointer(buf, "f32", { 8, 8 }, buf)
      return t:narrow(0, 2, 4):reshape(32):view_dtype("i32"), t:t(),
        tide.quant.linear(tide.from_pointer(buf, "f32", { 8, 8 }, buf))
    end
    local v, tt, lin = make()
    full_gc()
    -- churn: freed Lua memory would be reused by these
    local junk = {}   -- luacheck: ignore 241
    for i = 1, 2000 do junk[i] = ffi.new("float[64]", -i) end
    junk = nil   -- luacheck: ignore 311
    full_gc()
    local want = ffi.new("float[1]", 2 * 8 + 0 + 0.5)   -- element (2, 0) of the wrapped buffer
    assert.equals(ffi.cast("int32_t *", want)[0], v:get(0))
    assert.equals(3 * 8 + 1 + 0.5, tt:get(1, 3))   -- transposed: element (3, 1)
    local y = lin:forward(tide.ones({ 1, 8 }))
    assert.equals(32, float_at(y, 0))   -- row 0: 0.5 + 1.5 + ... + 7.5
  end)

  it("ends cleanly in a child process whatever is alive at exit and however it ends", function()
    local child = (os.getenv("TIDE_SOURCE_DIR") or ".") .. "/tests/lua/lifetime_child.lua"
    for v = 0, 5 do
      local out, rc = tm.sh(tm.q(tm.EXE) .. " " .. tm.q(child) .. " " .. tm.q(D) .. " " .. v)
      local raise = v % 6 == 5
      assert.equals(raise and 1 or 0, rc, "variant " .. v .. ":\n" .. out)
      assert.truthy(out:find("LIFETIME-OK", 1, true), "variant " .. v .. ":\n" .. out)
      if raise then assert.truthy(out:find("LIFETIME-RAISE", 1, true), out) end
      assert.falsy(out:find("Sanitizer", 1, true), "variant " .. v .. ":\n" .. out)
      assert.falsy(out:find("runtime error", 1, true), "variant " .. v .. ":\n" .. out)
    end
  end)
end)
