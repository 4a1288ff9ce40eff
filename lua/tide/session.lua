-- tide.session: one conversation timeline over a model. A session owns a
-- sequence in the model's cache (window KV, compressed KV, compressor state),
-- its token history, its sampler state (RNG included) and a few snapshots of
-- its own past, so it can undo, regenerate, fork, be inspected and be saved.
--
--   local s = model:session{ system = "Be brief.", seed = 1, sampler = { temp = 0.7 } }
--   s:say("Hello!")          -- appends a user turn, streams the reply, returns it
--   s:undo()                 -- drop the last exchange
--   s:regen()                -- resample the last reply
--   local b = s:fork()       -- an independent branch sharing the cache prefix
--   s:peek(5)                -- the 5 most likely next tokens, nothing committed
--   s:append("raw text"); s:generate{ max_tokens = 20 }
--   s:inspect{ layer = 1 }   -- the sparse attention and routing of the last token
--   s:save("chat.tsess"); tide.session_load(model, "chat.tsess")
--
-- How it stays exact. The token list is the truth; the cache follows it
-- lazily: `fed` tokens of the list are in the cache, the rest are fed (in
-- steps of the model's max_tokens) when logits are next needed. Going back
-- (undo, regen, truncate) restores the nearest snapshot at or before the new
-- end (a frozen fork of the sequence, sharing its blocks copy-on-write) or,
-- without one, starts a new sequence; the missing tokens are fed again. The
-- forward is bitwise invariant to chunking and batching (docs/design.md 1),
-- so the cache, the logits and every sampled token are then bitwise what a
-- fresh session fed the same tokens would have. Snapshots are only an
-- optimisation (they cost a sequence slot each; their number is bounded).
-- The sampler state's token history always equals the session's tokens
-- (prompt and template tokens included, as llama.cpp feeds its samplers).
local tide = require("tide")
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}
local Session = {}
Session.__index = Session
M.Session = Session

M.MAX_SNAPSHOTS = 4
M.FORMAT = "tide.session"
M.VERSION = 1

local TIDE_FULL = 1
local KINDS = { { "swa", 0 }, { "main", 1 }, { "index", 2 }, { "state", 3 }, { "istate", 4 } }

local function copy_list(t, n)
  local o = {}
  for i = 1, n or #t do o[i] = t[i] end
  return o
end

local function deep_copy(v)
  if type(v) ~= "table" then return v end
  local o = {}
  for k, x in pairs(v) do o[k] = deep_copy(x) end
  return o
end

-- Decode ids, leaving out those past the tokenizer's vocabulary (a model's
-- padding rows, which only an untrained model samples).
local function decode(tok, ids, opts)
  local V, keep = tok.vocab_size, ids
  for _, id in ipairs(ids) do
    if id >= V then
      keep = {}
      for _, x in ipairs(ids) do if x < V then keep[#keep + 1] = x end end
      break
    end
  end
  return tok:decode(keep, opts)
end
M.decode = decode

-- ---------------------------------------------------------------- replies
-- What say / regen / generate return: the text shown, the ids, why it
-- ended, timing; for chat turns the parsed parts (content, reasoning,
-- tool_calls, from tide.chat.parse_reply). tostring(r) is a one-line
-- summary, so a REPL that prints the value does not repeat the text.
local Reply = {}
Reply.__index = Reply
M.Reply = Reply
Reply.__tostring = function(r) return require("tide.describe").reply(r) end

-- ---------------------------------------------------------------- samplers
local OPTION_ALIAS = { temperature = "temp", n_predict = "max_tokens" }

local function norm_key(k) return (tostring(k):gsub("%-", "_")) end

-- A sampler and its description (what save writes) from what the user gave:
-- nil or an options table (llama.cpp names: temp, top_k, ... see
-- tide.sampling.options), a sampler file path, a sampler (tide.sampling
-- chain, possibly loaded from a file) or a list of stages.
local function resolve_sampler(x, tok)
  local sampling = require("tide.sampling")
  if x == nil then x = {} end
  if type(x) == "string" then
    local s, err = sampling.load(x)
    if not s then return nil, err end
    return s, { kind = "file", path = x, hash = s.hash }
  end
  if getmetatable(x) == sampling.Sampler then
    if x.source then return x, { kind = "file", path = x.source, hash = x.hash } end
    return x, { kind = "chain", describe = x:describe() }
  end
  if type(x) ~= "table" then return nil, "sampler must be an options table, a file name or a sampler" end
  if x[1] ~= nil then
    local ok, s = pcall(sampling.chain, x)
    if not ok then return nil, tostring(s) end
    return s, { kind = "chain", describe = s:describe() }
  end
  local o = {}
  for k, v in pairs(x) do
    local nk = norm_key(k)
    nk = OPTION_ALIAS[nk] or nk
    if nk ~= "max_tokens" and nk ~= "seed" then
      if not sampling.options[nk] then return nil, "unknown sampler option '" .. tostring(k) .. "'" end
      o[nk] = deep_copy(v)
    end
  end
  if o.sampler then return resolve_sampler(o.sampler, tok) end
  local s, err = sampling.from_options(o, { tokenizer = tok })
  if not s then return nil, err end
  return s, { kind = "options", options = o }
end
M.resolve_sampler = resolve_sampler

-- The sampler state without its token history (the session's tokens are
-- the history): generator, stage values (mirostat's mu), count.
local function sstate(st)
  local sn = st:snapshot()
  sn.tokens = nil
  return sn
end

-- ---------------------------------------------------------------- construction
-- model:session(opts) / M.new(model, opts). opts:
--   system       system prompt (chat turns)
--   sampler      options table (temp, top_k, ...), sampler file, or sampler
--   seed         RNG seed (nil or -1: random; s.seed tells which)
--   max_tokens   tokens per reply at most (default 512)
--   stop         stop strings; ignore_eos: do not stop at the EOS token
--   thinking     v3.1 templates: open replies with <think>
--   style        chat template style ("v3", "v3.1"; default from the tokenizer)
--   snapshots    snapshots kept at most (default 4; 0 = none, always re-prefill)
--   trace        record the sampler trace of each token of the last reply
--   stream       function(text) called as reply text arrives; default
--                io.write unless print = false
--   interrupt    function() -> true to stop the current generation (polled
--                between tokens and prefill steps)
--   probes       probes (tide.probe) on every step of this session's
--                sequence, prompt and replies alike (see s:set_probes)
--   draft        speculative decoding by default in generate/say/regen: k
--                or { max = k, policy = ... } as in tide.engine's submit
--                (docs/speculative.md); the same tokens as without
-- Returns the session, or nil, message when the cache has no free sequence
-- slot or the sampler cannot be built.
function M.new(model, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("session(opts): opts must be a table", 2) end
  local probes = require("tide.probe").compile(model, opts.probes, 2)
  local sampler, spec = resolve_sampler(opts.sampler, model.tokenizer)
  if not sampler then return nil, "session: " .. tostring(spec) end
  local seq, err = model:sequence()
  if not seq then return nil, "session: " .. tostring(err) end
  local seed = opts.seed
  if seed == nil and type(opts.sampler) == "table" then seed = opts.sampler.seed end
  local s = setmetatable({
    model = model, seq = seq, toks = {}, fed = 0,
    last_logits = nil, logits_at = -1,  -- logits after the first logits_at tokens
    sampler = sampler, sampler_spec = spec,
    system = opts.system, thinking = opts.thinking, style = opts.style,
    max_tokens = opts.max_tokens or 512, stop = opts.stop, ignore_eos = opts.ignore_eos or false,
    max_snapshots = opts.snapshots or M.MAX_SNAPSHOTS,
    snaps = {},          -- snapshot objects { pos, seq, logits, refs } by pos (shared with forks)
    turns = {},          -- { start, reply, stop, user, s_before, s_reply } per exchange
    trace_on = opts.trace and true or false,
    counters = { prefill_tokens = 0, decode_tokens = 0, t_prefill = 0, t_decode = 0 },
    print = opts.print ~= false, stream = opts.stream, interrupt = opts.interrupt,
    probes = probes,     -- compiled probes every step of the sequence carries
  }, Session)
  s.state = sampler:new_state({ seed = seed, trace = s.trace_on, tokenizer = model.tokenizer })
  s.seed = s.state.seed
  if opts.draft ~= nil then
    local ok, derr = pcall(s._set_draft, s, opts.draft)
    if not ok then
      seq:free()
      return nil, "session: " .. tostring(derr)
    end
  end
  return s
end

-- s:set_probes(list | nil): attach probes (tide.probe) to this session, or
-- none. The cache was computed under the old probes, so it is dropped (and
-- the snapshots with it): the next operation feeds the whole history again
-- with the new probes, which therefore see every position. Forks made
-- later carry the same probes.
function Session:set_probes(list)
  self.probes = require("tide.probe").compile(self.model, list, 2)
  self:_rewind_cache(0)
  self.logits_at = -1
  return self
end

-- ---------------------------------------------------------------- logits
-- The logits after the last fed token live in a buffer the session owns
-- (one memcpy per token, no allocation); snapshots and forks take their own
-- copies, restored snapshots lend theirs (never written).
local function copy_row(row)
  local t = tide.empty({ row:numel() })
  ffi.copy(t.data, row.data, row:numel() * 4)
  return t
end

function Session:_keep_logits(row)
  local b = self._lbuf
  local n = row:numel()
  if not b or b:numel() ~= n then
    b = tide.empty({ n })
    self._lbuf = b
  end
  if row:is_contiguous() then ffi.copy(b.data, row.data, n * 4) else b:copy(row) end
  self.last_logits = b
end

-- The current logits as a tensor nobody will overwrite.
function Session:_frozen_logits()
  local l = self.last_logits
  if l ~= nil and l == self._lbuf then return copy_row(l) end
  return l
end

-- ---------------------------------------------------------------- snapshots
local function snap_release(sn)
  sn.refs = sn.refs - 1
  if sn.refs == 0 and sn.seq then
    sn.seq:free()
    sn.seq = nil
  end
end

function Session:_drop_snapshot(i)
  snap_release(table.remove(self.snaps, i))
end

-- Freeze the cache as it is now (fed tokens), unless there is a snapshot
-- there already, the logits of that point are not at hand, or no slot is
-- free (snapshots are an optimisation).
function Session:_snapshot()
  local pos = self.fed
  if self.max_snapshots <= 0 or pos == 0 or self.logits_at ~= pos then return end
  local last = self.snaps[#self.snaps]
  if last and last.pos >= pos then return end
  local f = self.seq:fork()
  if not f then return end
  self.snaps[#self.snaps + 1] = { pos = pos, seq = f, logits = self:_frozen_logits(), refs = 1 }
  while #self.snaps > self.max_snapshots do self:_drop_snapshot(1) end
end

-- The cache pool is full: give back the oldest snapshot. false if none.
function Session:_relieve()
  if #self.snaps == 0 then return false end
  self:_drop_snapshot(1)
  return true
end

-- ---------------------------------------------------------------- the token timeline
function Session:_interrupted()
  if self.interrupt ~= nil and self.interrupt() then return true end
  local le = self._le_poll
  return le ~= nil and le.interrupted() or false
end

-- Run fn with Ctrl-C polled instead of raised. In the REPL (tide's line
-- editing armed to raise "interrupted" in running Lua code) a Ctrl-C that
-- landed anywhere in a session operation could leave it half done; here it
-- only sets a flag that the generation checks between tokens and steps, so
-- s:say() at the prompt stops cleanly with finish_reason "interrupted".
local function polled(self, fn, ...)
  local le = package.loaded["tide.lineedit"]
  local armed = le and le.arm_interrupt and le.arm_interrupt(false)
  if not armed then return fn(self, ...) end
  self._le_poll = le
  local res = { pcall(fn, self, ...) }
  self._le_poll = nil
  le.arm_interrupt(true)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- The sampler's history must be the token list; an operation cut short by
-- an error may have left one token more on one side: mend it.
function Session:_mend()
  if self.state.log:len() ~= #self.toks then
    local sn = sstate(self.state)
    self.state:restore({ rng = sn.rng, stages = sn.stages, n_sampled = sn.n_sampled, tokens = self.toks })
  end
end

-- Bring the cache up to the token list. With `interruptible`, the interrupt
-- callback is polled between steps and false is returned when it fired
-- (the cache then holds a prefix; the caller rewinds). `kind` says where the
-- time goes in the statistics ("prefill" or "decode"). When the pool is
-- full, snapshots are given back one by one before giving up.
function Session:_sync(interruptible, kind)
  local n = #self.toks
  -- the sequence's own length is the authority (an error may have cut an
  -- operation between a step and the bookkeeping)
  local len = self.seq:len()
  if len ~= self.fed then
    self.fed = len
    self:_spec_reset()
  end
  if self.fed > n then self:_rewind_cache(n) end
  if n == 0 or (self.fed == n and self.logits_at == n) then return true end
  local t0 = tide.time()
  if self.fed == n then
    -- the logits of this point were lost (an operation cut short): feed
    -- the last token again from the nearest snapshot or from scratch
    self:_rewind_cache(n - 1)
  end
  local fed0 = self.fed
  local row, err = self.model:feed(self.seq, self.toks, {
    from = self.fed + 1, logits = "last", probes = self.probes,
    on_chunk = function(done) self.fed = done end,
    stop = interruptible and function() return self:_interrupted() end or nil,
    on_full = function() return self:_relieve() end,
    step = self:_step_opts(),
  })
  if self._spec then require("tide.speculate").trim(self._spec_eng, self:_spec_req(), false) end
  local done = true
  if row then
    self:_keep_logits(row)
    self.logits_at = self.fed
  elseif err == "stopped" then
    done = false
  else
    error("session: " .. tostring(err) .. " (no snapshot left to give back)", 0)
  end
  local st = self.counters
  if kind == "decode" then
    st.decode_tokens = st.decode_tokens + (self.fed - fed0)
    st.t_decode = st.t_decode + (tide.time() - t0)
  else
    st.prefill_tokens = st.prefill_tokens + (self.fed - fed0)
    st.t_prefill = st.t_prefill + (tide.time() - t0)
  end
  return done
end

-- Make the cache hold at most the first n tokens: the nearest snapshot at or
-- before n, or a new empty sequence. Snapshots past n are dropped.
function Session:_rewind_cache(n)
  if self.fed <= n then return end
  local snap
  for i = #self.snaps, 1, -1 do
    local sn = self.snaps[i]
    if sn.pos <= n and sn.seq then snap = sn break end
  end
  if snap then
    self.seq:assign(snap.seq)
    self.fed, self.last_logits, self.logits_at = snap.pos, snap.logits, snap.pos
  else
    self.seq:free()
    local seq, err = self.model:sequence()
    if not seq then error("session: " .. tostring(err), 0) end
    self.seq = seq
    self.fed, self.last_logits, self.logits_at = 0, nil, -1
  end
  for i = #self.snaps, 1, -1 do
    if self.snaps[i].pos > n then self:_drop_snapshot(i) end
  end
  self:_spec_reset()
end

-- Keep the first n tokens. The sampler's history follows; its generator and
-- stage values are `sn` (a sstate) or stay as they are.
function Session:_truncate(n, sn)
  if n < #self.toks then
    for i = #self.toks, n + 1, -1 do self.toks[i] = nil end
    self:_rewind_cache(n)
  end
  sn = sn or sstate(self.state)
  self.state:restore({ rng = sn.rng, stages = sn.stages, n_sampled = sn.n_sampled, tokens = self.toks })
end

-- Append ids to the history (and the sampler's); they are fed when needed.
function Session:_push(ids)
  local V = self.model.vocab_size
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= V then
      error(string.format("session: token id %s at index %d is outside the vocabulary (0..%d)", tostring(id), i - 1,
        V - 1), 3)
    end
  end
  for _, id in ipairs(ids) do self.toks[#self.toks + 1] = id end
  if #ids > 0 then self.state:accept(ids) end
end

-- ---------------------------------------------------------------- speculation
-- Drafting with the MTP block (docs/speculative.md) reuses tide.speculate:
-- the session is its one request (r below: its tokens, sequence and fed
-- count) and a small stand-in for the engine. The MTP state (r.spec: its
-- sequence and the main streams waiting for its catch-up) follows the fed
-- tokens; whenever the cache goes back (undo, regen, truncate, fork, load)
-- it restarts empty at the new position, which changes drafts, never tokens.

-- The session's default draft (a number or { max, policy, opts }, nil: none).
function Session:_set_draft(x)
  local cfg = require("tide.speculate").parse(x, 3)
  if cfg then self:_spec_engine() end   -- raises when the model has no MTP block
  self.draft = cfg and x or nil
  -- the MTP state starts now, so it sees the positions fed from here on (the next prompt's)
  if cfg and not self.probes then self:_spec_state(cfg) end
  if not cfg and self._spec then
    self:_spec_free()
    self._spec = nil
  end
end

function Session:_spec_engine()
  local a = self._spec_eng
  if a then return a end
  a = { model = self.model, budget = self.model.max_tokens, stats = { drafted = 0, accepted = 0, spec_steps = 0 } }
  function a._preempt(_, r) r.fallback = true end             -- a refused roll-back: the session rewinds
  function a._finish(_, r, reason, err) r.status, r.error = reason, err end   -- a raising draft policy
  require("tide.speculate").block(a)
  self._spec_eng = a
  return a
end

-- The stand-in request for the current state.
function Session:_spec_req()
  return { spec = self._spec, tokens = self.toks, seq = self.seq, computed = self.fed, status = "running" }
end

-- The MTP state for cfg (made on first use, restarting at the fed position).
function Session:_spec_state(cfg)
  if cfg.accept == "rejection" then
    -- with the rule the reply would depend on the MTP state, which restarts at every undo
    error("draft: sessions take accept = \"chain\" only (the exact pick; docs/speculative.md)", 0)
  end
  local a = self:_spec_engine()
  local sp = self._spec
  if not sp then
    local r = self:_spec_req()
    require("tide.speculate").attach(a, r, cfg)
    sp = r.spec
    sp.base = self.fed
    self._spec = sp
  elseif sp.max ~= cfg.max or sp.policy ~= cfg.policy then
    sp.max = cfg.max
    if sp.policy ~= cfg.policy then sp.policy, sp.pstate = cfg.policy, cfg.policy.new(cfg.opts) end
  end
  return sp
end

-- The cache went back or was replaced: the MTP state restarts empty at the fed position.
function Session:_spec_reset()
  if self._spec and self._spec_eng then
    require("tide.speculate").restart(self._spec_eng, self:_spec_req())
  end
end

-- Give the MTP sequence back (close; fork's copy must not share it).
function Session:_spec_free()
  if self._spec then self:_spec_reset() end
end

-- step options of the session's own steps: with an MTP state, the main
-- streams of every fed position join its catch-up rows
function Session:_step_opts()
  local sp = self._spec
  if not sp then return nil end
  -- (a step that fails after its forward leaves rows too many: _spec_step notices and restarts)
  return { after_forward = function(st)
    local sp1 = st.spans[1]
    require("tide.speculate").keep_rows(sp, st.v.X:narrow(0, sp1.first, sp1.n), sp1.n)
  end }
end

-- One speculative step after a pick: draft k tokens, verify pending + drafts
-- in one main step, let `pick(row)` (the reply's generation) choose the
-- committed tokens from the rows in order, roll the cache back to the
-- accepted prefix. Returns false when it did not run (the caller takes a
-- plain step), else true, and r (status ~= "running" when a pick ended the
-- reply or the draft policy failed: r.error).
function Session:_spec_step(sp, lim, pick)
  local spec = require("tide.speculate")
  local a = self._spec_eng
  local model = self.model
  -- the MTP state must cover exactly the fed positions (an operation cut short may have broken that)
  local mlen = sp.mseq and a.mtp:len(sp.mseq) or (sp.base or 0)
  if mlen + sp.cn ~= self.fed then self:_spec_reset() end
  local r = self:_spec_req()
  spec.trim(a, r, true)
  local ok, k = pcall(sp.policy.draft, sp.pstate,
    { max = lim, steps = sp.steps, rate = sp.pstate.rate, load = 1, cost = model._spec_cost_fn })
  if not ok then return true, { status = "error", error = "draft policy: " .. tostring(k) } end
  if type(k) ~= "number" or k ~= math.floor(k) or k < 0 then
    return true, { status = "error",
      error = "draft policy: draft() returned " .. tostring(k) .. ", not an integer >= 0" }
  end
  k = math.min(k, lim)
  if k == 0 then return false end
  local e = { r = r, n = 1 }
  local okd, derr = pcall(spec._draft, a, { { e = e, k = k } })
  if not okd then
    a.stats.draft_errors = (a.stats.draft_errors or 0) + 1
    self.last_draft_error = derr
    self:_spec_reset()
    return false
  end
  if not e.drafts then return false end   -- no MTP slot or room: a plain step
  local p0 = self.fed
  local ent = spec.entry(e)
  ent.eng = e   -- spec.capture keeps the streams of every verified row (e.cn0: the rows before)
  local step = { after_forward = spec.capture }
  local res = model:step({ ent }, step)
  while not res and self:_relieve() do res = model:step({ ent }, step) end
  if not res then
    -- no room for the drafts: the catch-up rows of the drafted step are back in the MTP
    -- sequence, the main cache is unchanged; a plain step follows
    return false
  end
  local rows = res[1]
  local acc0 = sp.accepted
  spec.commit(a, e, rows, function(_, rr, row)
    if rr.status ~= "running" then return nil end
    local id, stop = pick(row)
    if stop then rr.status = "done" end
    return id
  end)
  local acc = sp.accepted - acc0
  local keep = p0 + acc + 1
  sp.cn = e.cn0 + acc + 1
  if r.fallback or (self.seq:len() > keep and not self.seq:truncate(keep)) then
    -- the roll-back was refused (it should not be): back to a snapshot or an empty sequence
    self.fed = self.seq:len()
    self:_rewind_cache(keep)
    self:_spec_reset()
  else
    self.fed = keep
    self:_keep_logits(rows[acc])
    self.logits_at = keep
  end
  return true, r
end

-- ---------------------------------------------------------------- raw text and generation
-- Append text (encoded without special tokens, except BOS when the session
-- is empty) or a list of ids. Returns the number of tokens appended. The
-- tokens are fed lazily (with the next generate, peek, ...).
function Session:append(x)
  local toks
  if type(x) == "string" then
    local tok = self.model.tokenizer
    if not tok then error("append(text): the model has no tokenizer; give ids", 2) end
    toks = tok:encode(x, { add_special_tokens = #self.toks == 0 })
  elseif type(x) == "table" then
    toks = x
  else
    error("append(text | ids): got " .. type(x), 2)
  end
  self:_push(toks)
  return #toks
end

local function default_writer(text)
  io.write(text)
  io.flush()
end

function Session:_writer(opts)
  if opts.stream ~= nil then return opts.stream or nil end
  if self.stream then return self.stream end
  if self.print then return default_writer end
  return nil
end

-- Sample after the current history until a stop. Returns a Reply.
function Session:_generate(opts)
  local model = self.model
  local tok = model.tokenizer
  local eos = model.config.eos_token_id
  local stop_ids = {}
  if type(eos) == "number" and eos >= 0 then stop_ids[1] = eos end
  local stops = {}
  for _, x in ipairs(opts.stop or self.stop or {}) do
    if type(x) == "number" then stop_ids[#stop_ids + 1] = x else stops[#stops + 1] = x end
  end
  local ignore = opts.ignore_eos
  if ignore == nil then ignore = self.ignore_eos end
  local gen = require("tide.generation").new{
    state = self.state, max_tokens = opts.max_tokens or self.max_tokens, stop = stops, stop_tokens = stop_ids,
    ignore_eos = ignore, tokenizer = tok,
    detokenize = (not tok) and function(id) return id .. " " end or nil,
  }
  local write = self:_writer(opts)
  local function emit(text)
    if write and text and text ~= "" then write(text) end
  end
  if self.trace_on then self.state:clear_trace() end
  -- speculative decoding: this call's draft, else the session's; never with probes
  local dcfg
  local dx = opts.draft
  if dx == nil then dx = self.draft end
  if dx ~= nil and not self.probes then
    dcfg = require("tide.speculate").parse(dx, 4)
    if dcfg then self:_spec_state(dcfg) end
  end
  local sp = dcfg and self._spec
  local sp0 = sp and { steps = sp.steps, drafted = sp.drafted, accepted = sp.accepted,
    tokens = sp.verify_tokens }
  local t0 = tide.time()
  local ids = {}
  local reason, failure
  local first = true
  -- a pick from a verify row: the same generation call as a plain step's
  local function pick(row)
    local id, text, r = gen:step(row)
    if id == nil then
      emit(text)
      reason = r
      return nil, true
    end
    self.toks[#self.toks + 1] = id
    ids[#ids + 1] = id
    emit(text)
    if r then reason = r return id, true end
    if opts.on_token and opts.on_token(id, text, self) == false then
      emit(gen:stop("stopped"))
      reason = "stopped"
      return id, true
    end
    return id, false
  end
  while true do
    if sp and not first and self.fed + 1 == #self.toks and self.logits_at == self.fed then
      if self:_interrupted() then
        emit(gen:stop("interrupted"))
        reason = "interrupted"
        break
      end
      local lim = math.min(sp.max, gen.max_tokens - gen.n_tokens - 1, self.model.max_tokens - 1)
      if self.model.max_positions then lim = math.min(lim, self.model.max_positions - #self.toks - 1) end
      if lim > 0 then
        local td = tide.time()
        local fed0 = self.fed
        local ran, rr = self:_spec_step(sp, lim, pick)
        local st = self.counters
        st.decode_tokens = st.decode_tokens + math.max(0, self.fed - fed0)
        st.t_decode = st.t_decode + (tide.time() - td)
        if ran then
          if rr.status == "error" then
            failure = rr.error
            emit(gen:stop("error"))
            reason = "error"
            break
          end
          if reason then break end
          goto continue
        end
      end
    end
    do
    -- feed what the cache lacks (the prompt at first, then each new token)
    local synced = self:_sync(first, first and "prefill" or "decode")
    first = false
    if not synced or self:_interrupted() then
      emit(gen:stop("interrupted"))
      reason = "interrupted"
      break
    end
    local id, text, r = gen:step(self.last_logits)
    if id == nil then
      emit(text)
      reason = r
      break
    end
    -- the sampler state accepted id; the cache takes it with the next sync
    self.toks[#self.toks + 1] = id
    ids[#ids + 1] = id
    emit(text)
    if r then reason = r break end
    if opts.on_token and opts.on_token(id, text, self) == false then
      emit(gen:stop("stopped"))
      reason = "stopped"
      break
    end
    end
    ::continue::
  end
  local dt = tide.time() - t0
  local r = setmetatable({
    text = gen:text(), tokens = ids, n_tokens = #ids, finish_reason = reason or gen.finish_reason,
    error = failure or gen.error, stop_string = gen.stop_string, seconds = dt,
    tokens_per_s = #ids / math.max(dt, 1e-9),
  }, Reply)
  if sp then
    -- this reply's drafting: verify steps, drafts made and accepted, tokens per verify step
    local n, d, acc = sp.steps - sp0.steps, sp.drafted - sp0.drafted, sp.accepted - sp0.accepted
    local vt = sp.verify_tokens - sp0.tokens
    r.speculation = { max = sp.max, policy = sp.policy.name, steps = n, drafted = d, accepted = acc,
      acceptance = d > 0 and acc / d or nil, tokens_per_step = n > 0 and vt / n or nil }
  end
  self.last = r
  return r
end

-- Raw completion: sample after the current history. opts: max_tokens,
-- stop (strings; numbers are stop token ids), ignore_eos, stream
-- (function(text), or false for silence), on_token(id, text, s) (return
-- false to stop). Returns a Reply ({text, tokens, n_tokens, finish_reason:
-- "stop" | "length" | "interrupted" | "stopped" | "error" (r.error), ...}).
function Session:generate(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("generate(opts): opts must be a table", 2) end
  if #self.toks == 0 then error("generate: nothing to continue (append a prompt first)", 2) end
  self:_mend()
  return polled(self, self._generate, opts)
end

-- ---------------------------------------------------------------- chat turns
function Session:_style()
  if self.style then return self.style end
  local tok = self.model.tokenizer
  return tok and require("tide.chat").detect_style(tok.chat_template) or "v3"
end

-- Tokens of a new user turn: the template's delta after the history. The
-- replies kept in the history are the sampled tokens (as llama.cpp keeps
-- them), not a re-encoding of their text; a reply cut short (max_tokens,
-- Ctrl-C) is closed with EOS the way the template closes turns.
function Session:_user_turn_tokens(text)
  local chat = require("tide.chat")
  local tok = self.model.tokenizer
  local first = #self.toks == 0
  local msgs = {}
  if first and self.system then msgs[1] = { role = "system", content = self.system } end
  msgs[#msgs + 1] = { role = "user", content = text }
  local o = { add_generation_prompt = true, tokenizer = tok, style = self:_style(), thinking = self.thinking }
  if not first then o.bos_token = "" end
  local ids = tok:encode(chat.render(msgs, o), { add_special_tokens = false })
  local eos = self.model.config.eos_token_id
  local lt = self.turns[#self.turns]
  if lt and lt.stop == #self.toks and type(eos) == "number" and self.toks[#self.toks] ~= eos then
    table.insert(ids, 1, eos)
  end
  return ids
end

local function finish_chat_reply(self, r)
  local chat = require("tide.chat")
  local p = chat.parse_reply(r.text, { style = self:_style() })
  r.content, r.reasoning, r.tool_calls = p.content, p.reasoning, p.tool_calls
  local write = self:_writer({})
  if write == default_writer then write("\n") end
  return r
end

-- Append a user turn and generate the reply (streamed). opts as generate.
-- Returns a Reply (r.text, r.content, r.reasoning, ...). Interrupted while
-- the turn is fed (a long prompt), the turn is dropped again and the reply
-- has finish_reason "interrupted" and no tokens.
function Session:say(text, opts)
  if type(text) ~= "string" then error("say(text): text must be a string", 2) end
  if not self.model.tokenizer then error("say: the model has no tokenizer (use append/generate with ids)", 2) end
  self:_mend()
  return polled(self, self._say, text, opts or {})
end

function Session:_say(text, opts)
  local start = #self.toks
  local before = sstate(self.state)
  self:_snapshot()
  self:_push(self:_user_turn_tokens(text))
  if not self:_sync(true, "prefill") then
    self:_truncate(start, before)
    local r = setmetatable({ text = "", tokens = {}, n_tokens = 0, finish_reason = "interrupted", seconds = 0,
      tokens_per_s = 0 }, Reply)
    self.last = r
    return r
  end
  self:_snapshot()
  local turn = { start = start, reply = #self.toks, user = text, s_before = before, s_reply = sstate(self.state) }
  self.turns[#self.turns + 1] = turn
  local r = self:_generate(opts)
  turn.stop = #self.toks
  return finish_chat_reply(self, r)
end

-- Drop the last exchange (user turn and reply, and anything after them):
-- tokens, cache and sampler state (generator included) are as they were
-- before it, so the session continues exactly as if it had never happened.
-- Returns false when there is no exchange.
function Session:undo()
  local turn = table.remove(self.turns)
  if not turn then return false end
  self:_truncate(turn.start, turn.s_before)
  return true
end

-- Resample the last reply: back to where the reply started (history,
-- stage values as they were then) with the generator continuing, so the
-- new reply is another draw. Returns the new Reply.
function Session:regen(opts)
  if not self.turns[#self.turns] then error("regen: no reply to regenerate", 2) end
  self:_mend()
  return polled(self, self._regen, opts or {})
end

function Session:_regen(opts)
  local turn = self.turns[#self.turns]
  local cur = sstate(self.state)
  self:_truncate(turn.reply, { rng = cur.rng, stages = turn.s_reply.stages, n_sampled = cur.n_sampled })
  local r = self:_generate(opts)
  turn.stop = #self.toks
  return finish_chat_reply(self, r)
end

-- Keep the first n tokens (raw editing; exchanges past n are dropped). The
-- sampler's generator and stage values continue. Negative n counts from the
-- end (-1 drops the last token).
function Session:truncate(n)
  if type(n) ~= "number" or n ~= math.floor(n) then error("truncate(n): n must be an integer", 2) end
  if n < 0 then n = #self.toks + n end
  if n < 0 or n > #self.toks then error("truncate: " .. n .. " is outside 0.." .. #self.toks, 2) end
  while self.turns[#self.turns] and self.turns[#self.turns].reply > n do table.remove(self.turns) end
  local lt = self.turns[#self.turns]
  if lt and lt.stop and lt.stop > n then lt.stop = n end
  self:_truncate(n)
  return self
end

-- An independent branch: the cache is shared copy-on-write (and so are the
-- snapshots of the common past), the sampler state (generator included) is
-- copied; both continue exactly as a fresh session fed their tokens would.
-- Returns nil, message when no sequence slot is free.
function Session:fork()
  local seq, err = self.seq:fork()
  while not seq and self:_relieve() do seq, err = self.seq:fork() end
  if not seq then return nil, "fork: " .. tostring(err) end
  local f = setmetatable({}, Session)
  for k, v in pairs(self) do f[k] = v end
  f.seq = seq
  f._lbuf = nil
  f.last_logits = self:_frozen_logits()
  f.toks = copy_list(self.toks)
  f.turns = deep_copy(self.turns)
  f.snaps = {}
  for i, sn in ipairs(self.snaps) do
    sn.refs = sn.refs + 1
    f.snaps[i] = sn
  end
  f.sampler_spec = deep_copy(self.sampler_spec)
  f.state = self.sampler:new_state({ seed = self.state.seed, trace = self.trace_on, tokenizer = self.model.tokenizer })
  f.state:restore(self.state:snapshot())
  f.counters = { prefill_tokens = 0, decode_tokens = 0, t_prefill = 0, t_decode = 0 }
  f.last = nil
  -- the MTP state is not shared: the branch's restarts at its position
  f._spec, f._spec_eng = nil, nil
  if f.draft and not f.probes then f:_spec_state(require("tide.speculate").parse(f.draft)) end
  return f
end

-- ---------------------------------------------------------------- looking
-- The n most likely next tokens under the model's raw distribution (no
-- sampler), committing nothing: { {id =, p =, logprob =, text =}, ... }.
function Session:peek(n)
  n = n or 5
  if type(n) ~= "number" or n < 1 then error("peek(n): n must be a positive number", 2) end
  if #self.toks == 0 then return {} end
  self:_sync(false, "prefill")
  local r = require("tide.sampling").logprob(self.last_logits, 0, math.min(n, self.model.vocab_size))
  local tok = self.model.tokenizer
  local out = {}
  for i, e in ipairs(r.top) do
    out[i] = { id = e.id, logprob = e.logprob, p = math.exp(e.logprob), text = tok and decode(tok, { e.id }) or nil }
  end
  return out
end

-- The token history (a copy) and its text.
function Session:tokens() return copy_list(self.toks) end
function Session:len() return #self.toks end

function Session:text()
  local tok = self.model.tokenizer
  if not tok then return table.concat(self.toks, " ") end
  return decode(tok, self.toks, { skip_special_tokens = false })
end

-- The conversation as chat messages (system, then user/assistant turns; the
-- assistant content is the decoded reply without special tokens).
function Session:messages()
  local tok = self.model.tokenizer
  local out = {}
  if self.system then out[1] = { role = "system", content = self.system } end
  for _, t in ipairs(self.turns) do
    out[#out + 1] = { role = "user", content = t.user }
    if t.stop then
      local ids = {}
      for i = t.reply + 1, t.stop do ids[#ids + 1] = self.toks[i] end
      out[#out + 1] = { role = "assistant",
        content = tok and decode(tok, ids, { skip_special_tokens = true }) or table.concat(ids, " ") }
    end
  end
  return out
end

-- Counters: tokens, exchanges, cache blocks held (this sequence and the
-- snapshots), prefill/decode token counts and rates.
function Session:stats()
  local st = self.counters
  local swa, pages = self.seq:usage()
  local snap_swa, snap_pages = 0, 0
  for _, sn in ipairs(self.snaps) do
    if sn.seq then
      local a, b = sn.seq:usage()
      snap_swa, snap_pages = snap_swa + a, snap_pages + b
    end
  end
  local cs = self.model:cache_stats()
  return {
    tokens = #self.toks, cached = self.fed, turns = #self.turns, snapshots = #self.snaps,
    swa_blocks = swa, pages = pages, snapshot_swa_blocks = snap_swa, snapshot_pages = snap_pages,
    pool = cs,
    prefill_tokens = st.prefill_tokens, decode_tokens = st.decode_tokens,
    prefill_tokens_per_s = st.prefill_tokens / math.max(st.t_prefill, 1e-9),
    decode_tokens_per_s = st.decode_tokens / math.max(st.t_decode, 1e-9),
    last = self.last and { tokens = self.last.n_tokens, seconds = self.last.seconds,
      tokens_per_s = self.last.tokens_per_s, finish_reason = self.last.finish_reason,
      speculation = self.last.speculation } or nil,
    speculation = self._spec and require("tide.speculate").report({ spec = self._spec }) or nil,
  }
end

-- The sampler trace records of the last reply (trace = true), or of its
-- last n tokens.
function Session:trace(n)
  local t = self.state:trace()
  if not n then return t end
  local out = {}
  for i = math.max(1, #t - n + 1), #t do out[#out + 1] = t[i] end
  return out
end

-- ---------------------------------------------------------------- settings
-- Change sampler options (llama.cpp names, e.g. {temp = 0.7, top_k = 20});
-- also max_tokens, seed (reseeds the generator), stop, ignore_eos,
-- thinking, trace. Sampler options rebuild the chain from the options the
-- session had (a file or custom sampler is replaced by an options chain).
-- The sampler state carries over (history, generator, stage values).
function Session:set(o)
  if type(o) ~= "table" then error("set{...}: expected a table of settings", 2) end
  local sopts, touched = {}, false
  if self.sampler_spec.kind == "options" then sopts = deep_copy(self.sampler_spec.options) end
  local reseed
  for k, v in pairs(o) do
    local nk = norm_key(k)
    nk = OPTION_ALIAS[nk] or nk
    if nk == "max_tokens" then
      if type(v) ~= "number" then error("set: max_tokens must be a number", 2) end
      self.max_tokens = v
    elseif nk == "seed" then
      if type(v) ~= "number" then error("set: seed must be a number", 2) end
      reseed = v
    elseif nk == "stop" then self.stop = v
    elseif nk == "ignore_eos" then self.ignore_eos = v and true or false
    elseif nk == "thinking" then self.thinking = v and true or false
    elseif nk == "system" then self.system = v
    elseif nk == "draft" then
      local ok, err = pcall(self._set_draft, self, v)
      if not ok then error("set: " .. tostring(err), 2) end
    elseif nk == "trace" then
      self.trace_on = v and true or false
      self.state.trace_on = self.trace_on
    elseif require("tide.sampling").options[nk] and nk ~= "sampler" then
      sopts[nk] = v
      touched = true
    else
      error("set: unknown setting '" .. tostring(k) .. "'", 2)
    end
  end
  if touched then
    local ok, err = self:set_sampler(sopts)
    if not ok then error("set: " .. tostring(err), 2) end
  end
  if reseed then
    local sn = sstate(self.state)
    sn.rng = require("tide.sampling").rng(reseed):state()
    self.state:restore({ rng = sn.rng, stages = sn.stages, n_sampled = sn.n_sampled, tokens = self.toks })
    self.state.seed = reseed
    self.seed = reseed
  end
  return self
end

-- Replace the sampler (options table, file or sampler); the state carries
-- over. Returns true, or nil, message (the old sampler stays).
function Session:set_sampler(x)
  local s, spec = resolve_sampler(x, self.model.tokenizer)
  if not s then return nil, spec end
  local snap = self.state:snapshot()
  local st = s:new_state({ seed = self.state.seed, trace = self.trace_on, tokenizer = self.model.tokenizer })
  st:restore(snap)
  st.traces = self.state.traces
  self.sampler, self.sampler_spec, self.state = s, spec, st
  return true
end

-- The current settings (what /set shows and save writes).
function Session:settings()
  local o = {
    max_tokens = self.max_tokens, seed = self.seed, stop = self.stop, ignore_eos = self.ignore_eos,
    thinking = self.thinking and true or false, trace = self.trace_on, sampler = self.sampler:describe(),
    sampler_kind = self.sampler_spec.kind, draft = self.draft,
  }
  if self.sampler_spec.kind == "options" then
    o.options = deep_copy(self.sampler_spec.options)
  elseif self.sampler_spec.kind == "file" then
    o.file = self.sampler_spec.path
  end
  return o
end

-- ---------------------------------------------------------------- inspection
-- A look inside the sparse attention and the router for one past token:
-- opts.token = index in the history (0-based; negative counts from the end;
-- default -1, the latest), opts.layers = list (default every layer) or
-- opts.layer = L. The token is run again, exactly, on a scratch branch (the
-- nearest snapshot or this sequence, plus the tokens in between), with the
-- kernels' statistics switched on; the session is not changed. Returns the
-- tide.inspect report ({position, id, index, text, layers = {[L] = ...},
-- routes = {[L] = ...}}; see tide.inspect) and the re-run's logits ([vocab]).
function Session:inspect(opts)
  opts = opts or {}
  local n = #self.toks
  if n == 0 then error("inspect: the session has no tokens", 2) end
  local idx = opts.token or -1
  if type(idx) ~= "number" or idx ~= math.floor(idx) then error("inspect: token must be an integer index", 2) end
  if idx < 0 then idx = n + idx end
  if idx < 0 or idx >= n then error("inspect: token " .. tostring(opts.token) .. " is outside 0.." .. (n - 1), 2) end
  local layers = opts.layers
  if opts.layer ~= nil then layers = { opts.layer } end
  -- the best starting point: this sequence if it holds no more than idx
  -- tokens, else the latest snapshot at or before idx
  local from, base = 0, nil
  if self.fed <= idx then from, base = self.fed, self.seq end
  for _, sn in ipairs(self.snaps) do
    if sn.seq and sn.pos <= idx and sn.pos > from then from, base = sn.pos, sn.seq end
  end
  local scratch, err
  if base then scratch, err = base:fork() else scratch, err = self.model:sequence() end
  while not scratch and #self.snaps > 0 do
    local keep = base
    -- give back a snapshot we are not starting from
    local dropped = false
    for i, sn in ipairs(self.snaps) do
      if sn.seq ~= keep then self:_drop_snapshot(i) dropped = true break end
    end
    if not dropped then break end
    if base then scratch, err = base:fork() else scratch, err = self.model:sequence() end
  end
  if not scratch then return nil, "inspect: " .. tostring(err) end
  local spec = { layers = layers }
  local ok, res = pcall(function()
    if from < idx then
      local _, e = self.model:feed(scratch, self.toks, { from = from + 1, to = idx, logits = false,
        probes = self.probes })
      if e then error(e, 0) end
    end
    local r, e = self.model:step({ { seq = scratch, tokens = self.toks, from = idx + 1, n = 1, logits = "last",
      probes = self.probes } }, { inspect = spec })
    if not r then error(e, 0) end
    if r.errors then error(r.errors[1], 0) end
    return copy_row(r[1])
  end)
  scratch:free()
  if not ok then error("inspect: " .. tostring(res), 0) end
  local rep = require("tide.inspect").report(self.model, spec, 0)
  rep.index = idx
  local tok = self.model.tokenizer
  if tok then rep.text = decode(tok, { rep.id }) end
  return rep, res
end

-- ---------------------------------------------------------------- model identity
local function hex64(h)
  return string.format("%08x%08x", tonumber(h / 4294967296ULL), tonumber(h % 4294967296ULL))
end

local function hash_bytes(p, n) return C.tide_hash64(p, n) end

-- What a session file records about the model it was made with, and what
-- session_load compares. Cheap on any checkpoint size (computed once per
-- model): FNV-1a 64 hashes of
--   config  - the config.json text,
--   index   - every tensor's name, dtype, shape and byte size, in file order,
--   weights - the bytes of norm.weight and of every layer's attn_norm and
--             ffn_norm weights, and the first and last 64 KiB of
--             embed.weight and head.weight (under 2 MB read on any model),
-- and id = the hash of the three.
function M.model_identity(model)
  if model._identity then return model._identity end
  local ck = model.ck
  local cj = ck:config_json() or ""
  local h_config = hex64(hash_bytes(cj, #cj))
  local parts = {}
  for _, i in ipairs(ck:infos()) do
    parts[#parts + 1] = i.name .. "|" .. i.dtype .. "|" .. table.concat(i.shape, "x") .. "|" .. i.nbytes
  end
  local idx = table.concat(parts, "\n")
  local h_index = hex64(hash_bytes(idx, #idx))
  local names = { "norm.weight" }
  for L = 0, model.net.n_layers - 1 do
    names[#names + 1] = "layers." .. L .. ".attn_norm.weight"
    names[#names + 1] = "layers." .. L .. ".ffn_norm.weight"
  end
  local hs = {}
  for _, nm in ipairs(names) do
    if ck:has(nm) then
      local t = ck:tensor(nm)
      hs[#hs + 1] = hex64(hash_bytes(t.data, t:nbytes()))
    end
  end
  local EDGE = 65536
  for _, nm in ipairs({ "embed.weight", "head.weight" }) do
    if ck:has(nm) then
      local t = ck:tensor(nm)
      local nb = t:nbytes()
      local k = math.min(EDGE, nb)
      local p = ffi.cast("const uint8_t*", t.data)
      hs[#hs + 1] = hex64(hash_bytes(p, k)) .. hex64(hash_bytes(p + (nb - k), k))
    end
  end
  local ws = table.concat(hs)
  local h_weights = hex64(hash_bytes(ws, #ws))
  local all = h_config .. h_index .. h_weights
  model._identity = { config = h_config, index = h_index, weights = h_weights, id = hex64(hash_bytes(all, #all)),
    name = model.name }
  return model._identity
end

-- ---------------------------------------------------------------- persistence
local json
local function get_json()
  if json then return json end
  local ok, cjson = pcall(require, "cjson")
  if not ok then error("sessions need lua-cjson (scripts/deps.sh installs it)", 0) end
  json = cjson.new()
  json.encode_sparse_array(true)
  return json
end

-- cjson prints numbers with at most 14 digits: every number that would not
-- survive that (fractions, large integers such as seeds, inf, nan) is
-- written as { ["$f64"] = "%a" text } and read back bit-exactly.
local F64 = "$f64"
local function pack_numbers(v)
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 1e14 then return v end
    if v ~= v then return { [F64] = "nan" } end
    if v == math.huge then return { [F64] = "inf" } end
    if v == -math.huge then return { [F64] = "-inf" } end
    return { [F64] = string.format("%a", v) }
  end
  if type(v) ~= "table" then return v end
  local o = {}
  for k, x in pairs(v) do o[k] = pack_numbers(x) end
  return o
end
local function unpack_numbers(v)
  if type(v) ~= "table" then return v end
  local f = v[F64]
  if type(f) == "string" then
    if f == "nan" then return 0 / 0 end
    if f == "inf" then return math.huge end
    if f == "-inf" then return -math.huge end
    return tonumber(f)
  end
  local o = {}
  for k, x in pairs(v) do o[k] = unpack_numbers(x) end
  return o
end

local function bytes_tensor(s)
  local t = tide.zeros({ #s }, "u8")
  ffi.copy(t.data, s, #s)
  return t
end

local function region_list(model)
  local out = {}
  for L = 0, model.net.n_layers - 1 do
    local r = model.config.ratios[L]
    for _, k in ipairs(KINDS) do
      local name, kind = k[1], k[2]
      if kind == 0 or (r > 1 and (kind == 1 or kind == 3)) or (r == 4 and (kind == 2 or kind == 4)) then
        out[#out + 1] = { layer = L, kind = kind, name = L .. "." .. name }
      end
    end
  end
  return out
end

local i64x3 = ffi.new("int64_t[3]")
local function extent(model, id, L, kind)
  check(C.tide_kvcache_seq_extent(model.cache, id, L, kind, i64x3, i64x3 + 1, i64x3 + 2), 3)
  return tonumber(i64x3[0]), tonumber(i64x3[1]), tonumber(i64x3[2])
end

local function cache_geometry(model)
  local cs = model:cache_stats()
  return { swa_block = cs.swa_block, page_tokens = cs.page_tokens, window = cs.window,
    keep_swa_history = cs.keep_swa_history }
end

-- The session's default draft as the manifest keeps it (a policy given as
-- a table is not saved: the loaded session drafts with the default policy).
local function saved_draft(x)
  if type(x) ~= "table" then return x end
  return { max = x.max, policy = type(x.policy) == "string" and x.policy or nil }
end

-- Write the session to `path`: one safetensors file holding the tokens, the
-- logits of the last position, every layer's cache rows (sliding window
-- still held, compressed entries, indexer keys, compressor state) and the
-- manifest (JSON: the model's identity, the settings, the sampler and its
-- state, the exchanges). Returns true, or nil, message on an I/O failure.
function Session:save(path)
  if type(path) ~= "string" then error("save(path): path must be a string", 2) end
  self:_sync(false, "prefill")
  local model = self.model
  local n = #self.toks
  local tensors = {}
  if n > 0 then
    tensors.tokens = tide.tensor(self.toks, "i32")
    tensors.logits = self.last_logits
  end
  local extents = {}
  for _, rg in ipairs(region_list(model)) do
    local first, rows, rb = extent(model, self.seq.id, rg.layer, rg.kind)
    extents[rg.name] = { first, rows, rb }
    if rows > 0 then
      local t = tide.zeros({ rows, rb }, "u8")
      check(C.tide_kvcache_seq_read(model.cache, self.seq.id, rg.layer, rg.kind, t), 2)
      tensors["cache." .. rg.name] = t
    end
  end
  local id = M.model_identity(model)
  local sn = sstate(self.state)
  local turns = {}
  for i, t in ipairs(self.turns) do
    turns[i] = { start = t.start, reply = t.reply, stop = t.stop, user = t.user, s_before = t.s_before,
      s_reply = t.s_reply }
  end
  local manifest = {
    format = M.FORMAT, version = M.VERSION, created = os.date("!%Y-%m-%dT%H:%M:%SZ"),
    model = id, n_tokens = n, vocab_size = model.vocab_size,
    cache = { geometry = cache_geometry(model), extents = extents },
    sampler = { spec = self.sampler_spec, state = sn, seed = self.state.seed, describe = self.sampler:describe() },
    settings = { system = self.system, max_tokens = self.max_tokens, stop = self.stop, ignore_eos = self.ignore_eos,
      thinking = self.thinking, style = self.style, snapshots = self.max_snapshots, trace = self.trace_on,
      draft = saved_draft(self.draft) },
    turns = turns,
  }
  local text = get_json().encode(pack_numbers(manifest))
  tensors.manifest = bytes_tensor(text)
  return require("tide.checkpoint").save(path, tensors,
    { format = M.FORMAT, version = tostring(M.VERSION), model = id.id, tokens = tostring(n) })
end

local function read_manifest(ck, path)
  local meta = ck:metadata(0)
  if meta.format ~= M.FORMAT or not ck:has("manifest") then
    return nil, "session_load: " .. path .. " is not a tide session file"
  end
  local t = ck:tensor("manifest")
  local ok, man = pcall(get_json().decode, ffi.string(t.data, t:nbytes()))
  if ok then man = unpack_numbers(man) end
  if not ok or type(man) ~= "table" then return nil, "session_load: " .. path .. ": bad manifest: " .. tostring(man) end
  if man.version ~= M.VERSION then
    return nil, "session_load: " .. path .. " has format version " .. tostring(man.version) .. ", this tide reads "
      .. M.VERSION
  end
  return man
end

-- tide.session_load(model, path [, opts]) -> session, or nil, message.
-- Refuses a file made for another model (its identity differs) with a
-- message naming both. opts: sampler (replaces the saved one; needed when
-- the session was saved with a custom chain of Lua stages), replay = true
-- (re-prefill the tokens instead of importing the saved cache rows; the
-- result is the same bits), and the session options (stream, print,
-- interrupt, snapshots). The cache rows are imported when the model's cache
-- has the saved geometry (window, block and page sizes, history mode);
-- otherwise the tokens are fed again. s.loaded says which: "imported" or
-- "replayed".
function M.load(model, path, opts)
  opts = opts or {}
  if type(path) ~= "string" then error("session_load(model, path): path must be a string", 2) end
  local ck, err = require("tide.checkpoint").load(path, { config = false, check = false })
  if not ck then return nil, "session_load: " .. tostring(err) end
  local man, merr = read_manifest(ck, path)
  if not man then ck:close() return nil, merr end
  local id = M.model_identity(model)
  local mid = man.model or {}
  if mid.id ~= id.id then
    local why = {}
    if mid.config ~= id.config then why[#why + 1] = "config.json differs" end
    if mid.index ~= id.index then why[#why + 1] = "the tensor list differs" end
    if mid.weights ~= id.weights then why[#why + 1] = "the weights differ" end
    ck:close()
    return nil, string.format("session_load: %s was made for model %s (id %s), not for %s (id %s): %s", path,
      tostring(mid.name), tostring(mid.id), tostring(model.name), id.id, table.concat(why, ", "))
  end
  local set = man.settings or {}
  local sampler = opts.sampler
  local spec = man.sampler.spec
  if sampler == nil then
    if spec.kind == "options" then
      sampler = spec.options
    elseif spec.kind == "file" then
      sampler = spec.path
    else
      ck:close()
      return nil, "session_load: " .. path .. " was saved with a custom sampler chain (" .. tostring(spec.describe)
        .. "); pass it as session_load(model, path, { sampler = ... })"
    end
  end
  local o = {
    system = set.system, sampler = sampler, seed = man.sampler.seed, max_tokens = set.max_tokens, stop = set.stop,
    ignore_eos = set.ignore_eos, thinking = set.thinking, style = set.style, trace = set.trace,
    snapshots = opts.snapshots or set.snapshots,
    stream = opts.stream, print = opts.print, interrupt = opts.interrupt,
  }
  if opts.draft ~= nil then o.draft = opts.draft else o.draft = set.draft end
  local s, serr = M.new(model, o)
  if not s then ck:close() return nil, "session_load: " .. tostring(serr) end
  local ok, e = pcall(function()
    local n = man.n_tokens
    if n > 0 then
      local tt = ck:tensor("tokens")
      local p = ffi.cast("const int32_t*", tt.data)
      local toks = {}
      for i = 0, n - 1 do toks[i + 1] = p[i] end
      s.toks = toks
    end
    local sn = man.sampler.state
    s.state:restore({ rng = sn.rng, stages = sn.stages, n_sampled = sn.n_sampled, tokens = s.toks })
    if spec.kind == "file" and type(sampler) == "string" and s.sampler.hash ~= spec.hash then
      s.warning = "the sampler file " .. spec.path .. " changed since the session was saved"
    end
    for i, t in ipairs(man.turns or {}) do
      s.turns[i] = { start = t.start, reply = t.reply, stop = t.stop, user = t.user, s_before = t.s_before,
        s_reply = t.s_reply }
    end
    s.loaded = n == 0 and "imported" or "replayed"
    if n > 0 and not opts.replay and s:_import(ck, man) then s.loaded = "imported" end
  end)
  ck:close()
  if not ok then
    s:close()
    return nil, "session_load: " .. path .. ": " .. tostring(e)
  end
  return s
end

-- Import the saved cache rows into the session's (empty) sequence. Returns
-- false (nothing imported, the sequence empty) when the geometry differs or
-- the pool lacks room; the tokens are then fed again on first use.
function Session:_import(ck, man)
  local model = self.model
  local g, mg = cache_geometry(model), man.cache.geometry
  for k, v in pairs(g) do
    if mg[k] ~= v then return false end
  end
  local n = man.n_tokens
  local rc = C.tide_kvcache_seq_set_length(model.cache, self.seq.id, n)
  while rc == TIDE_FULL and self:_relieve() do rc = C.tide_kvcache_seq_set_length(model.cache, self.seq.id, n) end
  if rc == TIDE_FULL then return false end
  check(rc, 2)
  local ok = true
  for _, rg in ipairs(region_list(model)) do
    local want = man.cache.extents[rg.name]
    local first, rows, rb = extent(model, self.seq.id, rg.layer, rg.kind)
    if not want or want[1] ~= first or want[2] ~= rows or want[3] ~= rb then ok = false break end
    if rows > 0 then
      local t = ck:tensor("cache." .. rg.name)
      check(C.tide_kvcache_seq_write(model.cache, self.seq.id, rg.layer, rg.kind, t), 2)
    end
  end
  if not ok or not ck:has("logits") then
    -- start over empty: the tokens are fed again
    self.seq:free()
    self.seq = assert(model:sequence())
    return false
  end
  self.fed = n
  self.last_logits = copy_row(ck:tensor("logits"))
  self.logits_at = n
  return true
end

-- Give the sequence and the snapshots back to the cache. Idempotent.
function Session:close()
  self:_spec_free()
  self._spec = nil
  for i = #self.snaps, 1, -1 do self:_drop_snapshot(i) end
  if self.seq then self.seq:free() end
  self.seq = nil
end

Session.__tostring = function(s) return require("tide.describe").session(s) end
function Session:describe() return require("tide.describe").session_long(self) end

return M
