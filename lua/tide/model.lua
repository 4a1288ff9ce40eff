-- tide.model: a loaded model = checkpoint + network wiring (lua/tide/models/)
-- + paged KV cache + tokenizer, and the step protocol around them.
--
--   local m = tide.model("path/to/DeepSeek-V4-Flash", { max_tokens = 256 })
--   local s = m:sequence()                         -- one timeline in the cache
--   local logits = m:prefill(s, { 0, 19923, 14 })  -- [vocab] f32 of the last token
--   local out = m:step{ { seq = s, tokens = { 42 }, logits = "last" } }
--   m:logits({ 0, 5, 17 }, { mode = "chunked:2" }) -- [T, vocab], a fresh sequence
--
-- This file loads, hands out sequences and runs steps; everything specific
-- to a model family (its derived config, cache layout, per-step data, the
-- forward, its probe points) is in lua/tide/models/<family>.lua. A step
-- (m:step) runs the flattened tokens of several sequences at once, prefill
-- chunks and decode tokens mixed: validate -> batch -> begin_step ->
-- prepare -> forward -> logits -> commit. An error anywhere in the network (a
-- bad edit of the wiring) aborts the step and leaves every sequence exactly
-- as it was; a failing probe (tide.probe) ends only its own entry. Results
-- for a token do not depend on the other tokens of the step, the chunking,
-- or the thread count (docs/design.md 1). m:feed is the one chunked-prefill
-- loop; reference mode and decision dumps are probes (tide.probe_reference).
local tide = require("tide")
local tffi = require("tide.ffi")
local probe = require("tide.probe")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}
local Model = {}
Model.__index = Model
M.Model = Model
local Seq = {}
Seq.__index = Seq
M.Sequence = Seq

local TIDE_FULL = 1
local i32box = ffi.new("int32_t[1]")
local i32x2 = ffi.new("int32_t[2]")

-- Family dispatch: model_type / architectures -> wiring module. A family
-- module gives configure(cfg) (derived config fields, or nil, err), new(ck,
-- opts) -> net, and the net's cache_config, begin_step, forward and
-- head_logits (docs/model.md).
local FAMILIES = {
  deepseek_v4 = "tide.models.deepseek_v4",
  DeepseekV4ForCausalLM = "tide.models.deepseek_v4",
}

local function family_of(cfg)
  local mt = cfg.model_type
  if mt and FAMILIES[mt] then return FAMILIES[mt] end
  local arch = cfg.architectures
  if type(arch) == "table" then
    for _, a in ipairs(arch) do if FAMILIES[a] then return FAMILIES[a] end end
  end
  return nil
end

-- ---------------------------------------------------------------- loading
-- tide.model(path_or_checkpoint [, opts]) -> model, or nil, err when the
-- checkpoint cannot be opened. opts:
--   max_tokens   tokens per step (buffers are sized for it; default 512)
--   cache        { context = positions per sequence (4096), max_seqs (16),
--                  seq_budget = sequences at full context the pool holds (4),
--                  pages, swa_blocks, page_tokens, swa_block, keep_swa_history }
--   tokenizer    false to skip loading the model directory's tokenizer
--   prefault     true: touch every weight page up front (progress bar on a tty)
function M.load(path, opts)
  if type(path) == "table" and not path.tensor and opts == nil then path, opts = nil, path end
  if path == nil then -- tide.model(): the default model (tide.default_model), named on stderr
    local derr
    path, derr = tide.default_model()
    if not path then return nil, derr end
    io.stderr:write("tide: using the default model " .. path .. "\n")
  end
  opts = opts or {}
  local ck, err
  if type(path) == "table" and path.tensor then
    ck = path
  else
    ck, err = require("tide.checkpoint").load(path)
    if not ck then return nil, err end
  end
  local cfg = ck.config
  if not cfg then return nil, "tide.model: " .. tostring(path) .. " has no config.json" end
  local fam = family_of(cfg)
  if not fam then
    return nil, string.format("tide.model: unsupported architecture %s (model_type %s); tide runs deepseek_v4",
      type(cfg.architectures) == "table" and table.concat(cfg.architectures, ",") or tostring(cfg.architectures),
      tostring(cfg.model_type))
  end
  local family = require(fam)
  local ok, e = family.configure(cfg)
  if not ok then return nil, "tide.model: " .. tostring(e) end
  if opts.prefault and ck.prefault then ck:prefault() end
  -- under mpirun with N > 1: this rank's experts and the exchange (tide.mpi)
  if rawget(_G, "_TIDE_MPI") then opts = require("tide.mpi").model_opts(ck, opts) end
  local net = family.new(ck, opts)
  local cc, keep = net:cache_config(opts.cache or {})
  local cbox = ffi.new("tide_kvcache*[1]")
  local rc = C.tide_kvcache_new(cbox, cc)
  if rc < 0 then return nil, "tide.model: " .. tffi.last_error() end
  local cache = ffi.gc(cbox[0], C.tide_kvcache_free)
  local bbox = ffi.new("tide_batch*[1]")
  check(C.tide_batch_new(bbox, net.max_tokens))
  local m = setmetatable({
    ck = ck, config = cfg, net = net, cache = cache, cache_cfg = cc, _keep = keep,
    batch = ffi.gc(bbox[0], C.tide_batch_free),
    vocab_size = net.vocab, max_tokens = net.max_tokens,
    max_positions = cfg.max_position_embeddings,
    _seqs = {},          -- live Sequence objects by id (weak values)
    _probes = nil,       -- compiled model-wide probes (m:probe, use_reference)
    _reference = nil,    -- nil, "all", or a set of layer indices (probe_reference)
    _logit_rows = 0,
    name = ck.path or tostring(path),
  }, Model)
  setmetatable(m._seqs, { __mode = "v" })
  if opts.tokenizer ~= false and type(path) == "string" then
    local okt, tok = pcall(function() return require("tide.tokenizer").new(path) end)
    if okt and tok then m.tokenizer = tok end
  end
  return m
end

-- ---------------------------------------------------------------- sequences
-- A sequence is one timeline in the cache (a request, a conversation branch).
local function wrap_seq(model, id)
  local s = setmetatable({ model = model, id = id, _live = true }, Seq)
  model._seqs[id] = s
  -- The sequence holds a C reference to the cache, given back by _release,
  -- so its finalizer may run after the cache's (at lua_close every one runs).
  C.tide_kvcache_retain(model.cache)
  -- Free the cache slot when the object is collected (deferred while a step
  -- runs); Seq:free removes this finalizer. The closure must not reference
  -- s: LuaJIT keeps finalizers strongly, so s would never be collected.
  s._gc = ffi.gc(ffi.new("int32_t[1]", id), function() model:_release(id) end)
  return s
end

function Model:_release(id)
  if self._stepping then
    self._pending_free = self._pending_free or {}
    self._pending_free[#self._pending_free + 1] = id
    return
  end
  C.tide_kvcache_seq_free(self.cache, id)
  C.tide_kvcache_free(self.cache)   -- the sequence's reference (wrap_seq)
  if self._refs then self._refs[id] = nil end
end

-- A new empty sequence, or nil, "no free sequence slot" (a recoverable state).
function Model:sequence()
  local rc = C.tide_kvcache_seq_new(self.cache, i32box)
  if rc == TIDE_FULL then return nil, "no free sequence slot (cache max_seqs)" end
  check(rc, 2)
  return wrap_seq(self, i32box[0])
end

function Seq:len() return tonumber(C.tide_kvcache_seq_len(self.model.cache, self.id)) end

-- An independent branch that continues exactly like this one (cache pages
-- shared copy-on-write, compressor state copied).
function Seq:fork()
  if not self._live then error("fork of a freed sequence", 2) end
  local rc = C.tide_kvcache_seq_fork(self.model.cache, self.id, i32box)
  if rc == TIDE_FULL then return nil, "no free sequence slot (cache max_seqs)" end
  check(rc, 2)
  local f = wrap_seq(self.model, i32box[0])
  if self.model._refs and self.model._refs[self] then
    f._noref = true   -- the reference model's dense state cannot be forked
  end
  return f
end

-- Make this sequence an exact copy of `other` (restore a snapshot).
function Seq:assign(other)
  check(C.tide_kvcache_seq_assign(self.model.cache, self.id, other.id), 2)
  return self
end

-- Roll back to length `len` within the last step (tide_kvcache_seq_truncate:
-- exactly the cache of a sequence fed only its first len tokens). true, or
-- nil, err when the cache cannot (another step ran since, or len is before
-- the last step); nothing changes then.
function Seq:truncate(len)
  if self.model._refs and self.model._refs[self] then
    return nil, "truncate: the reference model's state cannot roll back"
  end
  if C.tide_kvcache_seq_truncate(self.model.cache, self.id, len) < 0 then return nil, tffi.last_error() end
  return true
end

-- Cache blocks this sequence holds: swa_blocks, pages.
function Seq:usage()
  check(C.tide_kvcache_seq_usage(self.model.cache, self.id, i32x2, i32x2 + 1), 2)
  return i32x2[0], i32x2[1]
end

-- Return the sequence's blocks to the pool. Idempotent.
function Seq:free()
  if not self._live then return end
  self._live = false
  ffi.gc(self._gc, nil)
  self.model._seqs[self.id] = nil
  self.model:_release(self.id)
end

function Model:cache_stats()
  local st = ffi.new("tide_kvcache_stats")
  check(C.tide_kvcache_stats_get(self.cache, st), 2)
  return {
    swa_blocks = st.swa_blocks, swa_free = st.swa_free, pages = st.pages, pages_free = st.pages_free,
    max_seqs = st.max_seqs, seqs = st.seqs, bytes = tonumber(st.bytes), page_tokens = st.page_tokens,
    swa_block = st.swa_block, window = st.window, keep_swa_history = st.keep_swa_history == 1,
  }
end

-- Cache blocks a step of n tokens allocates for a sequence (not forked) of
-- committed length len: new SWA blocks, new compressed pages (what prepare
-- takes from the pools; blocks out of the window come back only at commit).
function Model:cache_need(len, n)
  local cc = self.cache_cfg
  local B, pt = cc.swa_block, cc.page_tokens
  local swa = math.ceil((len + n) / B) - math.ceil(len / B)
  local pages = 0
  if self:_has_compressed() then pages = math.ceil((len + n) / pt) - math.ceil(len / pt) end
  return swa, pages
end

-- The most blocks one sequence ever holds while it grows to `total`
-- positions in steps of at most `n_step` tokens: SWA blocks (held between
-- prepare and commit: the window plus the step, or everything when the
-- cache keeps history) and compressed pages.
function Model:cache_peak(total, n_step)
  local cc = self.cache_cfg
  local B, pt = cc.swa_block, cc.page_tokens
  local swa = math.ceil(total / B)
  if cc.keep_swa_history == 0 then
    swa = math.min(swa, math.floor((cc.window + math.min(n_step, total) - 2) / B) + 2)
  end
  local pages = self:_has_compressed() and math.ceil(total / pt) or 0
  return swa, pages
end

function Model:_has_compressed()
  if self._n_comp == nil then
    local n = 0
    for L = 0, self.cache_cfg.n_layers - 1 do if self.cache_cfg.ratios[L] > 1 then n = n + 1 end end
    self._n_comp = n
  end
  return self._n_comp > 0
end

-- ---------------------------------------------------------------- probes
-- m:probe(p) or m:probe{ p1, p2, ... }: probes (tide.probe) on every
-- sequence of every step from now on. Returns a handle; h:remove() detaches
-- them. Misuse (unknown point, layer out of range) raises.
function Model:probe(list)
  local compiled = probe.compile(self, list, 2)
  if not compiled then error("probe: nothing to attach", 2) end
  self._probes = self._probes or {}
  local mine = {}
  for _, pr in ipairs(compiled) do
    self._probes[#self._probes + 1] = pr
    mine[pr] = true
  end
  local model = self
  return { remove = function()
    local keep = {}
    for _, pr in ipairs(model._probes or {}) do if not mine[pr] then keep[#keep + 1] = pr end end
    model._probes = #keep > 0 and keep or nil
  end }
end

-- ---------------------------------------------------------------- reference
-- m:use_reference(true | "all")   whole forward through the golden reference
-- m:use_reference({3, 5})         the attention and MoE of layers 3 and 5
-- m:use_reference(false)          the fast path only
-- The reference follows each sequence from position 0 (its dense state), so
-- switch it on before the sequences you want to measure start. The fast path
-- still runs (it keeps the cache); per layer, m:reference_report() gives the
-- fast path's error against the reference on what ran since. Built on
-- model-wide probes (lua/tide/probe_reference.lua).
function Model:use_reference(spec) return require("tide.probe_reference").use(self, spec, 2) end

-- Per-layer error of the fast path against the reference since
-- use_reference, on the sub-layer output (both paths get the same input):
-- { [L] = { attn = { tokens =, mean_nmse =, max_nmse =, equal = }, moe = {...} } }
-- where `equal` is the fraction of output elements that are bitwise equal:
-- both paths round to bf16 at the same points, so it stays near 1 unless a
-- rounding point or a quantisation step differs (then it falls far).
function Model:reference_report() return require("tide.probe_reference").report(self) end

-- Logits of every position of `tokens` computed by the golden reference
-- alone (a fresh reference state, nothing of the fast path), as [T, vocab].
-- opts.replay = { topk = dump, routes = dump } forces the reference to take
-- the given discrete decisions (the tables `dump_topk` / `dump_routes` of a
-- step, or the parsed JSON of `tide logits --dump-*`: layers -> per-position
-- lists), so the continuous numbers of two implementations can be compared
-- with near-ties held equal (doc section 8). opts.dump_topk / dump_routes
-- record the reference's own decisions.
function Model:reference_logits(tokens, opts) return require("tide.probe_reference").logits(self, tokens, opts) end

-- ---------------------------------------------------------------- steps
-- A step entry: { seq = Sequence, tokens = {ids...} | id, from = i, n = m,
-- logits = "last" | "all" | false }. The entry runs tokens[from .. from+n-1]
-- (from defaults to 1, n to the rest of the list), so a caller feeding a long
-- list in chunks passes the list itself, not copies of its parts.
local function span_of(e, i)
  local t = e.tokens
  if type(t) == "number" then return { t }, 1, 1 end
  if type(t) ~= "table" then error("step entry " .. i .. " needs tokens (a list of ids)", 4) end
  local from = e.from or 1
  if type(from) ~= "number" or from ~= math.floor(from) or from < 1 then
    error("step entry " .. i .. ": from must be an index >= 1", 4)
  end
  local n = e.n or (#t - from + 1)
  if type(n) ~= "number" or n ~= math.floor(n) or n < 0 or from + n - 1 > #t then
    error(string.format("step entry %d: tokens %s..%s are not in the list of %d", i, tostring(from),
      tostring(from + (tonumber(n) or 0) - 1), #t), 4)
  end
  return t, from, n
end

-- Check every entry before anything changes; returns the step's spans
-- { seq, toks, from, n, first (row in the step), pos0, want } and the
-- number of tokens and of logits rows. Raises at the caller of step.
function Model:_validate(entries)
  local vocab, maxpos = self.vocab_size, self.max_positions
  local spans, T, rows, seen = {}, 0, 0, {}
  for i, e in ipairs(entries) do
    local s = e.seq
    if getmetatable(s) ~= Seq or s.model ~= self then
      error("step entry " .. i .. ": seq is not a sequence of this model", 3)
    end
    if not s._live then error("step entry " .. i .. ": the sequence was freed", 3) end
    if seen[s.id] then error("step entry " .. i .. ": sequence " .. s.id .. " appears twice in one step", 3) end
    seen[s.id] = true
    local toks, from, n = span_of(e, i)
    if n == 0 then error("step entry " .. i .. ": no tokens", 3) end
    for j = from, from + n - 1 do
      local id = toks[j]
      if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= vocab then
        error(string.format("step entry %d: token id %s at index %d is outside the vocabulary (0..%d)", i,
          tostring(id), j - from, vocab - 1), 3)
      end
    end
    local len = s:len()
    if len + n > maxpos then
      error(string.format("step entry %d: positions %d..%d go beyond max_position_embeddings (%d)", i, len,
        len + n - 1, maxpos), 3)
    end
    local want = e.logits
    if want == nil then want = "last" end
    if want ~= "all" and want ~= "last" and want ~= false then
      error("step entry " .. i .. ": logits must be \"last\", \"all\" or false", 3)
    end
    local probes = e.probes and probe.compile(self, e.probes, 3) or nil
    spans[i] = { seq = s, toks = toks, from = from, n = n, first = T, pos0 = len, want = want, probes = probes }
    T = T + n
    if want == "all" then rows = rows + n elseif want then rows = rows + 1 end
  end
  if T > self.max_tokens then
    error(string.format("step of %d tokens exceeds max_tokens (%d): split it", T, self.max_tokens), 3)
  end
  return spans, T, rows
end

-- Run one step. entries: array of step entries (above; an entry may carry
-- probes = { probe, ... }, see tide.probe); a sequence appears at most once.
-- Returns an array of logits tensors per entry ([vocab] for "last",
-- [n, vocab] for "all", nil for false), views valid until the next step, or
-- nil, message when the cache is full (nothing changed). Bad input (token
-- id, position, unknown sequence, a bad probe spec) raises an error, nothing
-- changed. When an entry's probe fails (raises, returns a wrong shape,
-- writes NaN), that entry did not run (its sequence is unchanged) and
-- res.errors[i] says why; the others ran as if it had not been there.
-- opts:
--   probes      probes for every entry of this step
--   dump_topk / dump_routes   tables filled with the decisions, per layer
--               and position (see reference_logits)
--   inspect     a spec (tide.inspect.arm): it gets the step's attention mass
--               shares, indexer scores, selections and routes
--
-- The protocol: validate -> batch (ids and the cache's batch) -> the
-- family's begin_step (its per-step views) -> probes armed -> prepare the
-- cache (all or nothing) -> net:forward -> logits -> commit. An error in the
-- forward aborts the cache's step: every sequence stays as it was.
function Model:step(entries, opts)
  opts = opts or {}
  local spans, T, rows = self:_validate(entries)
  if T == 0 then return {} end
  local shared = self:_step_probes(opts)
  local cache, b = self.cache, self.batch
  local st = { T = T, spans = spans, entries = entries, cache = cache, batch = b }
  self.net:begin_step(st)
  local ids = st.ids
  check(C.tide_batch_clear(b), 2)
  for _, sp in ipairs(spans) do
    local toks, first, from = sp.toks, sp.first, sp.from - 1
    for j = 1, sp.n do ids[first + j - 1] = toks[from + j] end
    check(C.tide_batch_add(b, sp.seq.id, sp.pos0, sp.n), 2)
  end
  if opts.inspect then
    local list = require("tide.inspect").arm(self, st, opts.inspect)
    shared = shared or {}
    for _, pr in ipairs(probe.compile(self, list, 2)) do shared[#shared + 1] = pr end
  end
  local P = probe.arm(self, st, shared)
  local rc = C.tide_kvcache_prepare(cache, b)
  if rc == TIDE_FULL then return nil, "cache full" end
  check(rc, 2)
  self._stepping = true
  self._step_dumps = self._reference == "all" and (opts.dump_topk or opts.dump_routes)
    and { topk = opts.dump_topk, routes = opts.dump_routes } or nil
  local ok, res = xpcall(function()
    self.net:forward(st)
    if opts.after_forward then opts.after_forward(st) end   -- e.g. the MTP block reads st.v.X
    return self:_logits(st, rows)
  end, debug.traceback)
  self._step_dumps = nil
  if not ok then
    C.tide_kvcache_abort(cache, b)
    self._stepping = false
    self:_flush_frees()
    if P and P.failed then return self:_without(entries, P.failed, opts) end
    error(res, 0)
  end
  rc = C.tide_kvcache_commit(cache, b)
  self._stepping = false
  self:_flush_frees()
  if rc < 0 then
    C.tide_kvcache_abort(cache, b)
    check(rc, 2)
  end
  return res
end

-- The probes every entry of a step gets: the model's own, the step's
-- opts.probes and the decision dumps (compiled), or nil.
function Model:_step_probes(opts)
  local list = nil
  local function add(compiled)
    if not compiled then return end
    list = list or {}
    for _, pr in ipairs(compiled) do list[#list + 1] = pr end
  end
  add(self._probes)
  add(opts.probes and probe.compile(self, opts.probes, 3))
  if (opts.dump_topk or opts.dump_routes) and self._reference ~= "all" then
    add(probe.compile(self, require("tide.probe_reference").dump_probes(self, opts.dump_topk, opts.dump_routes), 3))
  end
  return list
end

-- A step whose probes failed for some entries: the cache was put back, so
-- run it again without them (batch invariance: the others' results are the
-- same bits). Returns the results with res.errors[i] for the failed ones.
function Model:_without(entries, failed, opts)
  local keep, where = {}, {}
  for i, e in ipairs(entries) do
    if not failed[i] then
      keep[#keep + 1] = e
      where[#keep] = i
    end
  end
  local out = { errors = {} }
  for i, msg in pairs(failed) do out.errors[i] = msg end
  if #keep == 0 then return out end
  local sub, err = self:step(keep, opts)
  if not sub then return nil, err end
  for j, i in ipairs(where) do
    out[i] = sub[j]
    if sub.errors and sub.errors[j] then out.errors[i] = sub.errors[j] end
  end
  return out
end

function Model:_flush_frees()
  local p = self._pending_free
  if not p then return end
  self._pending_free = nil
  for _, id in ipairs(p) do self:_release(id) end
end

-- The logits buffer grows to the rows a step asks for (a vocabulary row is
-- large: 129280 floats), and keeps its size.
function Model:_logit_buf(rows)
  if rows > self._logit_rows then
    self._logits_t = tide.zeros({ rows, self.vocab_size })
    self._ybuf = tide.zeros({ rows, self.net.d })
    self._logit_rows = rows
  end
  return self._logits_t:narrow(0, 0, rows), self._ybuf:narrow(0, 0, rows)
end

-- The logits rows the entries asked for: the wanted rows of the family's
-- final hidden state (st.hidden [T, d]) gathered, then one head call.
function Model:_logits(st, rows)
  local out = {}
  if rows == 0 then return out end
  local lg, y = self:_logit_buf(rows)
  local x = st.hidden
  local r = 0
  for _, sp in ipairs(st.spans) do
    if sp.want == "all" then
      check(C.tide_tensor_copy(y:narrow(0, r, sp.n), x:narrow(0, sp.first, sp.n)))
      r = r + sp.n
    elseif sp.want then
      check(C.tide_tensor_copy(y:narrow(0, r, 1), x:narrow(0, sp.first + sp.n - 1, 1)))
      r = r + 1
    end
  end
  self.net:head_logits(lg, y)
  local P = st.probes
  r = 0
  for i, sp in ipairs(st.spans) do
    if sp.want == "all" then
      out[i] = lg:narrow(0, r, sp.n)
      sp.lfirst, sp.lrows = r, sp.n
      r = r + sp.n
    elseif sp.want then
      out[i] = lg[r]
      sp.lfirst, sp.lrows = r, 1
      r = r + 1
    end
  end
  if P then P:fire("logits", nil, lg) end
  return out
end

-- ---------------------------------------------------------------- feeding
-- m:feed(seq, tokens [, opts]) -> logits, or nil, err: run tokens[from..to]
-- on `seq` in steps of at most `chunk` tokens (chunked prefill; the result
-- is bitwise the same whatever the chunk). The one chunk loop of tide: the
-- model's conveniences and sessions use it, the engine runs the same
-- { tokens, from, n } spans one scheduling step at a time. opts:
--   from, to     1-based bounds in `tokens` (default 1, #tokens)
--   chunk        tokens per step (default max_tokens)
--   logits       "last" (default): the last token's row [vocab] is returned;
--                "all": every chunk's rows go to on_logits; false: none
--   on_logits    function(rows [m, vocab], offset) per chunk with "all"
--                (offset: 0-based index in tokens of the chunk's first row)
--   on_chunk     function(done) after each committed chunk (done: the index
--                in tokens of the last token fed)
--   stop         function() -> true to stop between chunks (returns nil,
--                "stopped"; the tokens fed so far stay)
--   on_full      function() -> true when it made room and the step should be
--                retried (sessions give back snapshots); else nil, "cache full"
--   probes       probes on this sequence (tide.probe); a failing probe
--                raises here, the chunk it failed in did not run
--   step         options of every step (see Model:step)
-- The returned row is a view valid until the next step.
function Model:feed(seq, tokens, opts)
  opts = opts or {}
  local from, to = opts.from or 1, opts.to or #tokens
  local chunk = opts.chunk or self.max_tokens
  local want = opts.logits
  if want == nil then want = opts.on_logits and "all" or "last" end
  local last
  local entry = { { seq = seq, tokens = tokens, from = from, n = 0, logits = false,
    probes = opts.probes and probe.compile(self, opts.probes, 2) } }
  local e = entry[1]
  local i = from
  while i <= to do
    local m = math.min(chunk, to - i + 1)
    e.from, e.n = i, m
    local final = i + m > to
    if want == "all" then e.logits = "all" else e.logits = final and want or false end
    local res, err = self:step(entry, opts.step)
    while not res do
      if not (opts.on_full and opts.on_full()) then return nil, err end
      res, err = self:step(entry, opts.step)
    end
    if res.errors then error(res.errors[1], 0) end
    if want == "all" then
      if opts.on_logits then opts.on_logits(res[1], i - 1) end
      if final then last = res[1][m - 1] end
    elseif final and want then
      last = res[1]
    end
    i = i + m
    if opts.on_chunk then opts.on_chunk(i - 1) end
    if not final and opts.stop and opts.stop() then return nil, "stopped" end
  end
  return last
end

-- Feed tokens to a sequence (m:feed with its defaults; opts.on_logits makes
-- every row go to the callback); returns the last token's logits [vocab].
Model.prefill = Model.feed

-- Logits of every position of `tokens` in a fresh sequence, as [T, vocab]
-- f32 (a new tensor). opts.mode: "prefill" (steps of max_tokens),
-- "decode" (one token per step) or "chunked:N".
function Model:logits(tokens, opts)
  opts = opts or {}
  local mode = opts.mode or "prefill"
  local chunk
  if mode == "prefill" then chunk = self.max_tokens
  elseif mode == "decode" then chunk = 1
  else
    chunk = tonumber(tostring(mode):match("^chunked:(%d+)$"))
    if not chunk or chunk < 1 then
      error("logits: mode must be prefill, decode or chunked:N, got " .. tostring(mode), 2)
    end
  end
  if chunk > self.max_tokens then error("logits: chunk " .. chunk .. " exceeds max_tokens " .. self.max_tokens, 2) end
  local out = tide.zeros({ #tokens, self.vocab_size })
  local seq, err = self:sequence()
  if not seq then return nil, err end
  local ok, e = pcall(function()
    local _, ferr = self:feed(seq, tokens, { chunk = chunk, logits = "all", step = opts.step,
      on_logits = function(rows, at) check(C.tide_tensor_copy(out:narrow(0, at, rows:size(0)), rows)) end })
    if ferr then error(ferr, 0) end
  end)
  seq:free()
  if not ok then error(e, 0) end
  return out
end

-- Scoring a continuation: the logprob of each continuation token given
-- everything before it, under the model's raw distribution (no sampler).
-- prompt / continuation: text (the model's tokenizer; BOS before the prompt)
-- or lists of ids. opts.top = N adds the N most likely tokens per position.
-- Returns { {token =, logprob =, rank =, top =}, ... }, the sum of the
-- logprobs, and the continuation's ids.
function Model:score(prompt, continuation, opts)
  opts = opts or {}
  local tok = self.tokenizer
  local function ids_of(x, first)
    if type(x) == "table" then return x end
    if type(x) ~= "string" then error("score(prompt, continuation): text or lists of ids", 3) end
    if not tok then error("score: the model has no tokenizer; give ids", 3) end
    return tok:encode(x, { add_special_tokens = first })
  end
  local p, c = ids_of(prompt, true), ids_of(continuation, false)
  if #p == 0 then error("score: the prompt must hold at least one token", 2) end
  if #c == 0 then return {}, 0, c end
  local all = {}
  for i, v in ipairs(p) do all[i] = v end
  for i, v in ipairs(c) do all[#p + i] = v end
  local seq, err = self:sequence()
  if not seq then return nil, err end
  local rows = tide.zeros({ #c, self.vocab_size })
  local ok, e = pcall(function()
    -- the prompt but its last token needs no logits; then every row that predicts a continuation token
    local _, ferr
    if #p > 1 then
      _, ferr = self:feed(seq, all, { to = #p - 1, chunk = opts.chunk, logits = false })
      if ferr then error(ferr, 0) end
    end
    _, ferr = self:feed(seq, all, { from = #p, to = #all - 1, chunk = opts.chunk, logits = "all",
      on_logits = function(r, at) check(C.tide_tensor_copy(rows:narrow(0, at - (#p - 1), r:size(0)), r)) end })
    if ferr then error(ferr, 0) end
  end)
  seq:free()
  if not ok then error(e, 0) end
  local list, total = require("tide.sampling").score_rows(rows, c, opts.top or 0)
  return list, total, c
end

-- A chat session over this model (tide.session): s:say(text), s:undo(), ...
function Model:session(opts) return require("tide.session").new(self, opts) end

function Model:close()
  for _, s in pairs(self._seqs) do s:free() end
  self._refs, self._probes, self._ref_handle = nil, nil, nil
end

-- one-line summaries and the long form live in tide.describe
Model.__tostring = function(m) return require("tide.describe").model(m) end
function Model:describe() return require("tide.describe").model_long(self) end
Seq.__tostring = function(s) return require("tide.describe").sequence(s) end

setmetatable(M, { __call = function(_, ...) return M.load(...) end })
return M
