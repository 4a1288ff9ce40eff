-- Sessions on a generated model with DeepSeek's tokenizer: every way of
-- going back or sideways (undo, regen, fork, truncate, save/load in a new
-- process, interrupts) leaves the cache, the logits and the sampled tokens
-- bitwise what a fresh session fed the same tokens would have. Conversations
-- run past the sliding window (128), a C128 entry and the indexer's top-k
-- (index_topk = 8, so ratio-4 layers select from position 35 on).
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local session = require("tide.session")

pcall(ffi.cdef, [[ int memcmp(const void *a, const void *b, size_t n); ]])

local D = tm.get("demo_k8", { "--preset", "demo", "--set", "index_topk=8", "--seed", "5" })
tide.threads(1)
-- max_tokens 24: turns are fed in several steps, fresh prefills in others
local m = assert(tide.model(D, { max_tokens = 24, cache = { context = 1024, max_seqs = 32, seq_budget = 24 } }))

local U = {
  "Tell me a story about a lighthouse keeper who finds a message in a bottle on a stormy night.",
  "What was written in the message, and who had sent it across the sea?",
  "Describe the keeper's reply, and how he managed to send it back.",
  "Now summarise the whole story in three short sentences, please.",
}
local SAMPLER = { temp = 1.0, top_k = 0, top_p = 1, min_p = 0 }

local function same_bits(a, b)
  return a:numel() == b:numel() and ffi.C.memcmp(a.data, b.data, a:numel() * 4) == 0
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- every exportable cache byte of a sequence, per layer and region
local KINDS = { "swa", "main", "index", "state", "istate" }
local function export(seq)
  local out = {}
  local box = ffi.new("int64_t[3]")
  for L = 0, m.net.n_layers - 1 do
    local r = m.config.ratios[L]
    for k = 0, 4 do
      if k == 0 or (r > 1 and (k == 1 or k == 3)) or (r == 4 and (k == 2 or k == 4)) then
        tide.C.tide_kvcache_seq_extent(m.cache, seq.id, L, k, box, box + 1, box + 2)
        local rows, rb = tonumber(box[1]), tonumber(box[2])
        local t = tide.zeros({ math.max(rows, 1), rb }, "u8"):narrow(0, 0, rows)
        if rows > 0 then assert(tide.C.tide_kvcache_seq_read(m.cache, seq.id, L, k, t) == 0) end
        out[L .. "." .. KINDS[k + 1]] = rows > 0 and ffi.string(t.data, rows * rb) or ""
      end
    end
  end
  return out
end

local function fresh(toks)
  local seq = assert(m:sequence())
  local row = assert(m:prefill(seq, toks)):clone()
  local bytes = export(seq)
  seq:free()
  return row, bytes
end

-- the session's cache and logits = a fresh prefill of its tokens
local function assert_exact(s, what)
  s:_sync(false)
  local row, bytes = fresh(s:tokens())
  assert.is_true(same_bits(s.last_logits, row), (what or "") .. ": logits differ from a fresh prefill")
  local mine = export(s.seq)
  for k, v in pairs(bytes) do
    assert.is_true(mine[k] == v, (what or "") .. ": cache region " .. k .. " differs from a fresh prefill")
  end
end

local function new(o)
  o = o or {}
  local opts = { seed = o.seed or 1, sampler = o.sampler or SAMPLER, max_tokens = o.max_tokens or 16, print = false,
    snapshots = o.snapshots, interrupt = o.interrupt, system = o.system }
  return assert(m:session(opts))
end

describe("sessions", function()
  it("say, undo and regen keep the cache bitwise equal to a fresh prefill of the tokens", function()
    local s = new{ system = "You are a patient storyteller.", max_tokens = 30 }
    s:say(U[1])
    assert_exact(s, "after one exchange")
    s:say(U[2])
    s:say(U[3])
    assert.is_true(s:len() > 150, "the conversation should pass the window: " .. s:len())
    assert_exact(s, "after three exchanges")
    assert.is_true(s:undo())
    assert_exact(s, "after undo")
    s:regen()
    assert_exact(s, "after regen")
    s:say(U[4])
    assert_exact(s, "after undo, regen and another exchange")
    s:close()
  end)

  it("undo: the session continues exactly as one that never had the exchange (generator and mirostat too)", function()
    local miro = { mirostat = 2, mirostat_ent = 3 }
    for _, snaps in ipairs({ 4, 0 }) do
      local a = new{ sampler = miro, snapshots = snaps }
      local b = new{ sampler = miro }
      a:say(U[1])
      b:say(U[1])
      local after_first = a.state:snapshot()
      a:say(U[2])
      assert.is_true(a:undo())
      local undone = a.state:snapshot()
      assert.equals(after_first.rng, undone.rng)
      assert.same(after_first.stages, undone.stages)
      local ra, rb = a:say(U[3]), b:say(U[3])
      assert.is_true(same_list(ra.tokens, rb.tokens), "snapshots " .. snaps .. ": the replies differ")
      assert.is_true(same_list(a:tokens(), b:tokens()))
      assert.same(b.state:snapshot().stages, a.state:snapshot().stages)
      assert_exact(a, "snapshots " .. snaps)
      a:close()
      b:close()
    end
  end)

  it("regen draws again, as a fresh session with that generator state would", function()
    local a = new{}
    local r1 = a:say(U[1])
    local rng = a.state:rng_state()
    local prompt = {}
    for i = 1, a.turns[1].reply do prompt[i] = a.toks[i] end
    local r2 = a:regen()
    assert.is_false(same_list(r1.tokens, r2.tokens), "regen repeated the reply")
    assert.equals(#prompt + r2.n_tokens, a:len())
    local f = new{}
    f:append(prompt)
    f.state:set_rng_state(rng)
    local r3 = f:generate()
    assert.is_true(same_list(r2.tokens, r3.tokens), "a fresh session with the same generator state differs")
    assert_exact(a, "after regen")
    a:close()
    f:close()
  end)

  it("fork: the branches share the prefix's blocks and continue as fresh sessions fed their tokens", function()
    local a = new{ seed = 3 }
    a:say(U[1])
    a:say(U[2])
    local before = m:cache_stats()
    local b = assert(a:fork())
    local after = m:cache_stats()
    assert.equals(before.swa_free, after.swa_free)      -- nothing copied at the fork
    assert.equals(before.pages_free, after.pages_free)
    assert.equals(before.seqs + 1, after.seqs)
    local ra, rb = a:say(U[3]), b:say(U[4])
    local f1, f2 = new{ seed = 3 }, new{ seed = 3 }
    for _, f in ipairs({ f1, f2 }) do
      f:say(U[1])
      f:say(U[2])
    end
    assert.is_true(same_list(f1:say(U[3]).tokens, ra.tokens), "branch a differs from a fresh session")
    assert.is_true(same_list(f2:say(U[4]).tokens, rb.tokens), "branch b differs from a fresh session")
    assert_exact(a, "branch a")
    assert_exact(b, "branch b")
    -- the branch undoes into the shared past on its own
    assert.is_true(b:undo())
    assert.is_true(b:undo())
    assert.equals(a.turns[2].start, b:len())
    assert_exact(b, "branch b after two undos")
    for _, s in ipairs({ a, b, f1, f2 }) do s:close() end
  end)

  it("saves and loads in a new process that continues identically (tokens, settings, generator)", function()
    local P = tm.TMP .. "/session_spec.tsess"
    local sopts = { temp = 0.9, top_k = 50, repeat_penalty = 1.1 }
    local a = new{ sampler = sopts, seed = 7, system = "Be brief." }
    a:say(U[1])
    local r2 = a:say(U[2])
    assert.is_true(a:save(P))
    local rng, describe = a.state:rng_state(), a.sampler:describe()
    local r3 = a:say(U[3])
    local script = tm.TMP .. "/session_spec_load.lua"
    local f = assert(io.open(script, "w"))
    f:write(string.format([[
tide.threads(1)
local m = assert(tide.model(%q, { max_tokens = 24, cache = { context = 1024, max_seqs = 8 } }))
local s = assert(tide.session_load(m, %q, { print = false }))
print("loaded " .. s.loaded)
print("rng " .. s.state:rng_state())
print("sampler " .. s.sampler:describe())
print("system " .. tostring(s.system))
local function ids(r) return table.concat(r.tokens, ",") end
print("reply3 " .. ids(s:say(%q)))
s:undo()
s:undo()
print("reply2 " .. ids(s:say(%q)))
]], D, P, U[3], U[2]))
    f:close()
    local out, rc = tm.sh(tm.q(tm.EXE) .. " " .. tm.q(script))
    assert.equals(0, rc, out)
    assert.equals("imported", out:match("loaded (%S+)"))
    assert.equals(rng, out:match("rng (%x+)"))
    assert.equals(describe, out:match("sampler ([^\n]+)"))
    assert.equals("Be brief.", out:match("system ([^\n]+)"))
    assert.equals(table.concat(r3.tokens, ","), out:match("reply3 ([%d,]+)"))
    -- undone twice back before U[2], the generator is where it was then: the same reply
    assert.equals(table.concat(r2.tokens, ","), out:match("reply2 ([%d,]+)"))
    a:close()
  end)

  it("session_load imports the same bits a replay computes, and refuses another model's file", function()
    local P = tm.TMP .. "/session_spec2.tsess"
    local a = new{ seed = 9 }
    a:say(U[1])
    a:say(U[2])
    assert.is_true(a:save(P))
    local imp = assert(session.load(m, P, { print = false }))
    local rep = assert(session.load(m, P, { print = false, replay = true }))
    assert.equals("imported", imp.loaded)
    assert.equals("replayed", rep.loaded)
    imp:_sync(false)
    rep:_sync(false)
    assert.is_true(same_bits(imp.last_logits, rep.last_logits))
    assert.is_true(same_bits(imp.last_logits, a.last_logits))
    assert.same(export(a.seq), export(imp.seq))
    assert.same(export(a.seq), export(rep.seq))
    assert.is_true(same_list(imp:say(U[3]).tokens, a:say(U[3]).tokens))
    -- another model (same shapes, other weights) is refused, naming both
    local O = tm.get("demo_k8_other", { "--preset", "demo", "--set", "index_topk=8", "--seed", "6" })
    local mo = assert(tide.model(O, { max_tokens = 24, tokenizer = false, cache = { context = 256, max_seqs = 2 } }))
    local s, err = session.load(mo, P)
    assert.is_nil(s)
    assert.matches("was made for model", err, 1, true)
    assert.matches("the weights differ", err, 1, true)
    assert.matches(O, err, 1, true)
    mo:close()
    -- not a session file, a missing file
    local s2, err2 = session.load(m, D .. "/model.safetensors")
    assert.is_nil(s2)
    assert.matches("not a tide session file", err2, 1, true)
    local s3, err3 = session.load(m, tm.TMP .. "/no_such.tsess")
    assert.is_nil(s3)
    assert.is_string(err3)
    for _, x in ipairs({ a, imp, rep }) do x:close() end
  end)

  it("peek shows the raw distribution and commits nothing", function()
    local s = new{}
    s:say(U[1])
    local rng, n = s.state:rng_state(), s:len()
    local p = s:peek(5)
    assert.equals(5, #p)
    local row = fresh(s:tokens())
    assert.equals(row:argmax(), p[1].id)
    local sum = 0
    for i = 1, #p do
      sum = sum + p[i].p
      if i > 1 then assert.is_true(p[i].p <= p[i - 1].p) end
      assert.is_string(p[i].text)
    end
    assert.is_true(sum > 0 and sum <= 1)
    assert.equals(rng, s.state:rng_state())
    assert.equals(n, s:len())
    s:close()
  end)

  it("an interrupt stops a reply between tokens, or drops a turn being fed; the session stays exact", function()
    local stop = false
    local s = new{ interrupt = function() return stop end }
    local n = 0
    local r = s:say(U[1], { on_token = function()
      n = n + 1
      if n == 3 then stop = true end
    end })
    assert.equals("interrupted", r.finish_reason)
    assert.equals(3, r.n_tokens)
    stop = false
    s:say(U[2])
    assert_exact(s, "after an interrupted reply")
    -- interrupted while a long turn is fed (several steps): nothing changes
    local len, rng, turns = s:len(), s.state:rng_state(), #s.turns
    stop = true
    local r2 = s:say(U[1] .. " " .. U[2] .. " " .. U[3])
    assert.equals("interrupted", r2.finish_reason)
    assert.equals(0, r2.n_tokens)
    assert.equals(len, s:len())
    assert.equals(turns, #s.turns)
    assert.equals(rng, s.state:rng_state())
    stop = false
    s:say(U[4])
    assert_exact(s, "after an interrupted turn")
    s:close()
  end)

  it("snapshots are bounded and only an optimisation; close gives every slot back", function()
    local base = m:cache_stats().seqs
    local s = new{ snapshots = 2 }
    local ref = new{ snapshots = 0 }
    for i = 1, 4 do
      s:say(U[i])
      ref:say(U[i])
      assert.is_true(#s.snaps <= 2)
    end
    -- the second undo goes back past every snapshot kept: re-prefill
    assert.is_true(s:undo())
    assert.is_true(s:undo())
    assert.is_true(ref:undo())
    assert.is_true(ref:undo())
    assert.is_true(same_list(s:say(U[4]).tokens, ref:say(U[4]).tokens))
    assert_exact(s, "after undoing past the snapshots")
    s:truncate(-5)
    assert_exact(s, "after truncate")
    s:close()
    ref:close()
    assert.equals(base, m:cache_stats().seqs)
  end)

  it("when the pool runs out, snapshots are given back and the replies stay the same", function()
    -- 9 window blocks and 3 pages: one conversation and hardly any snapshot fit
    local small = assert(tide.model(D, { max_tokens = 24, cache = { context = 512, max_seqs = 8, pages = 3,
      swa_blocks = 9 } }))
    local s = assert(small:session{ seed = 1, sampler = SAMPLER, max_tokens = 16, print = false, snapshots = 4 })
    local relieve, given = s._relieve, 0
    s._relieve = function(self)
      given = given + 1
      return relieve(self)
    end
    local ref = new{ snapshots = 0 }
    for i = 1, 4 do
      assert.is_true(same_list(s:say(U[i]).tokens, ref:say(U[i]).tokens), "turn " .. i)
    end
    assert.is_true(given > 0, "the pool never ran out: the test does not test")
    assert.is_true(s:undo())
    assert.is_true(ref:undo())
    assert.is_true(same_list(s:say(U[1]).tokens, ref:say(U[1]).tokens))
    s:close()
    ref:close()
    small:close()
  end)

  it("a reply does not depend on the thread count", function()
    local out = {}
    for _, th in ipairs({ 1, 2 }) do
      tide.threads(th)
      local s = new{ seed = 11, max_tokens = 8 }
      out[th] = s:say(U[2]).tokens
      s:close()
    end
    tide.threads(1)
    assert.is_true(same_list(out[1], out[2]))
  end)

  it("applies the chat template: the first turn as chat.encode renders it, then the template's deltas", function()
    local chat = require("tide.chat")
    local tok = m.tokenizer
    local s = new{ system = "Be brief.", max_tokens = 6 }
    s:say(U[1])
    s:say(U[2])
    local t1, t2 = s.turns[1], s.turns[2]
    local want1 = chat.encode(tok, { { role = "system", content = "Be brief." }, { role = "user", content = U[1] } },
      { add_generation_prompt = true })
    assert.same(want1, { unpack(s.toks, 1, t1.reply) })
    -- a reply cut at max_tokens is closed with EOS, then USER ... ASSISTANT
    local want2 = tok:encode(chat.tokens.user .. U[2] .. chat.tokens.assistant, { add_special_tokens = false })
    if s.toks[t1.stop] ~= m.config.eos_token_id then table.insert(want2, 1, m.config.eos_token_id) end
    assert.same(want2, { unpack(s.toks, t2.start + 1, t2.reply) })
    local msgs = s:messages()
    assert.equals(5, #msgs)
    assert.same({ "system", "user", "assistant", "user", "assistant" },
      { msgs[1].role, msgs[2].role, msgs[3].role, msgs[4].role, msgs[5].role })
    assert.equals(U[2], msgs[4].content)
    assert.matches(U[1], s:text(), 1, true)
    s:close()
  end)

  it("sampler files and custom chains: swapped in place, saved by path, a custom chain must be given back", function()
    local sampling = require("tide.sampling")
    local path = tm.TMP .. "/session_spec_sampler.lua"
    local f = assert(io.open(path, "w"))
    f:write("return sampling.chain{ sampling.top_k(7), sampling.temperature(0.6), sampling.dist() }\n")
    f:close()
    local s = new{}
    s:say(U[1])
    local rng = s.state:rng_state()
    assert.is_true(s:set_sampler(path))
    assert.equals(rng, s.state:rng_state())
    assert.equals("file", s.sampler_spec.kind)
    local P = tm.TMP .. "/session_spec3.tsess"
    assert.is_true(s:save(P))
    local l = assert(session.load(m, P, { print = false }))
    assert.equals(s.sampler:describe(), l.sampler:describe())
    assert.is_true(same_list(s:say(U[2]).tokens, l:say(U[2]).tokens))
    -- a chain of Lua stages cannot be written down: load asks for it
    local c = new{ sampler = sampling.chain{ function(cands) local _ = cands end, sampling.greedy() } }
    c:say(U[1])
    assert.is_true(c:save(P))
    local none, err = session.load(m, P)
    assert.is_nil(none)
    assert.matches("custom sampler chain", err, 1, true)
    local back = assert(session.load(m, P, { print = false, sampler = c.sampler }))
    assert.is_true(same_list(c:say(U[2]).tokens, back:say(U[2]).tokens))
    for _, x in ipairs({ s, l, c, back }) do x:close() end
  end)

  it("settings: /set-style changes keep the generator and history; bad input raises and changes nothing", function()
    local s = new{}
    s:say(U[1])
    local rng = s.state:rng_state()
    s:set{ temp = 0.5, ["top-k"] = 20, max_tokens = 4 }
    assert.equals(rng, s.state:rng_state())
    assert.matches("top_k%(k = 20%)", s.sampler:describe())
    assert.matches("temperature%(t = 0.5%)", s.sampler:describe())
    assert.equals(4, s:say(U[2]).n_tokens)
    s:set{ seed = 42 }
    assert.equals(require("tide.sampling").rng(42):state(), s.state:rng_state())
    assert.has_error(function() s:set{ no_such_knob = 1 } end)
    local n = s:len()
    assert.has_error(function() s:append({ 1, 2, m.vocab_size }) end)
    assert.equals(n, s:len())
    assert.has_error(function() s:say(42) end)
    local e = new{}
    assert.has_error(function() e:regen() end)
    assert.has_error(function() e:generate() end)
    assert.is_false(e:undo())
    assert.same({}, e:peek(3))
    s:close()
    e:close()
  end)
end)
