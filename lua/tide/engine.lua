-- tide.engine: continuous batching of many requests over one model. Each step
-- a policy (a Lua file under lua/tide/scheduler/policies/, or your own)
-- chooses which requests decode and which prompt chunks prefill within a
-- token budget, and who gives way when the cache runs out; the engine runs
-- all scheduled tokens in one model:step, samples every request that reached
-- the end of its tokens with its own sampler and seed, and streams tokens.
--
--   local eng = tide.engine(model, { budget = 256, policy = "fair" })
--   local h = assert(eng:submit{ tokens = ids, max_tokens = 32, seed = 1, sampler = { temp = 0.7 } })
--   for id, text in h:stream() do io.write(text) end      -- steps the engine as needed
--   eng:run()                                              -- until every request is done
--   print(h:result().finish_reason, h:result().ttft)
--
-- Exactness: a request's tokens do not depend on what else runs. The forward
-- is bitwise batch/chunk invariant (docs/design.md 1) and each request owns
-- its sampler state and generator, which only move when that request samples;
-- a preempted request releases its blocks and later recomputes its whole
-- history (prompt and generated tokens) from position 0, which rebuilds its
-- caches and compressor state bit for bit (its probes run again over the
-- recomputed positions, with the same rows). Progress: the oldest active
-- request (the anchor) is never preempted and runs at least every `patience`
-- steps, and every step runs at least one token, so every request finishes.
-- docs/scheduling.md has the policy contract and the guarantees.
local tide = require("tide")
local view_mod = require("tide.scheduler.view")

local M = {}
local Engine = {}
Engine.__index = Engine
M.Engine = Engine
local Request = {}
Request.__index = Request
M.Request = Request

local now = tide.time
local min, floor = math.min, math.floor

local refresh   -- refresh(r): bring r's view up to date (below)

local function is_int(x) return type(x) == "number" and x == floor(x) and x > -2 ^ 53 and x < 2 ^ 53 end

-- ---------------------------------------------------------------- policies
M.BUILTIN = { "fcfs", "priority", "fair" }

local function check_policy(pol, what, level)
  if type(pol) == "function" then pol = { schedule = pol } end
  if type(pol) ~= "table" or type(pol.schedule) ~= "function" then
    error("engine: " .. what .. " must be a table with a schedule(view) function", level + 1)
  end
  if pol.victim ~= nil and type(pol.victim) ~= "function" then
    error("engine: " .. what .. ": victim must be a function", level + 1)
  end
  return pol
end

-- A policy from a name (a built-in), a file path (a Lua chunk returning the
-- policy table) or a table / schedule function. Raises on misuse.
function M.load_policy(p, level)
  level = (level or 1) + 1
  if p == nil then p = "fcfs" end
  if type(p) == "table" or type(p) == "function" then
    local pol = check_policy(p, "policy", level)
    pol.name = pol.name or "custom"
    return pol
  end
  if type(p) ~= "string" then error("engine: policy must be a name, a file path or a table", level) end
  if p:find("/", 1, true) or p:match("%.lua$") then
    local chunk, err = loadfile(p)
    if not chunk then error("engine: cannot load policy file " .. p .. ": " .. tostring(err), level) end
    local ok, pol = pcall(chunk)
    if not ok then error("engine: policy file " .. p .. " raised: " .. tostring(pol), level) end
    pol = check_policy(pol, "policy file " .. p, level)
    pol.name = pol.name or p:match("([^/]+)%.lua$") or p
    return pol
  end
  if not p:match("^[%w_]+$") then error("engine: bad policy name '" .. p .. "'", level) end
  local ok, pol = pcall(require, "tide.scheduler.policies." .. p)
  if not ok then
    error("engine: unknown policy '" .. p .. "' (built-in: " .. table.concat(M.BUILTIN, ", ")
      .. "; or give a file path)", level)
  end
  pol = check_policy(pol, "policy " .. p, level)
  pol.name = pol.name or p
  return pol
end

-- A sampler from what a request gives: a sampler object, a file path, an
-- options table with llama.cpp's names (temp, top_k, ...), or nil (defaults).
-- Returns the sampler or nil, err.
function M.sampler_of(x, tokenizer)
  local sampling = require("tide.sampling")
  if x == nil then return sampling.from_options({}, { tokenizer = tokenizer }) end
  if type(x) == "string" then return sampling.load(x) end
  if type(x) == "table" and x.new_state then return x end
  if type(x) == "table" then return sampling.from_options(x, { tokenizer = tokenizer }) end
  return nil, "sampler must be a sampler, a file path or an options table"
end

-- ---------------------------------------------------------------- construction
-- tide.engine(model, opts) or tide.engine(dir, opts) (then the model is
-- loaded with max_tokens = budget and opts.cache, and closed by eng:close()).
-- opts:
--   budget       tokens per step (default model.max_tokens, at most that)
--   chunk        most prompt tokens of one request per step (default budget)
--   policy       "fcfs" (default), "priority", "fair", a file path or a table
--   max_running  requests holding a sequence at once (default: the cache's slots)
--   swa_blocks, pages   cache blocks this engine may hold (default: all)
--   patience     the anchor (oldest request) runs at least every this many
--                steps whatever the policy says (default 32)
--   eos          stop token ids (default { config.eos_token_id }); false: none
--   detokenize   false: no text even when the model has a tokenizer
--   draft        every request's default draft (see submit; a request's own wins)
-- Returns the engine; with a directory, nil, err when it cannot be loaded.
function M.new(model, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("tide.engine(model, opts): opts must be a table", 2) end
  local owns = false
  if type(model) == "string" then
    local m, err = require("tide.model").load(model, { max_tokens = opts.budget or 256, cache = opts.cache,
      tokenizer = opts.tokenizer })
    if not m then return nil, err end
    model, owns = m, true
  end
  if type(model) ~= "table" or type(model.step) ~= "function" or not model.cache then
    error("tide.engine(model, opts): a model (tide.model) expected", 2)
  end
  local function int_opt(name, default, lo, hi)
    local v = opts[name]
    if v == nil then return default end
    if not is_int(v) or v < lo or (hi and v > hi) then
      error(string.format("tide.engine: %s must be an integer in %d..%s, got %s", name, lo, hi and tostring(hi) or "",
        tostring(v)), 3)
    end
    return v
  end
  local st = model:cache_stats()
  local budget = int_opt("budget", model.max_tokens, 1, model.max_tokens)
  local eng = setmetatable({
    model = model, owns_model = owns,
    budget = budget,
    chunk = int_opt("chunk", budget, 1, budget),
    max_running = int_opt("max_running", st.max_seqs, 1, st.max_seqs),
    swa_cap = int_opt("swa_blocks", st.swa_blocks, 1, st.swa_blocks),
    pages_cap = int_opt("pages", st.pages, 0, st.pages),
    patience = int_opt("patience", 32, 1, nil),
    policy = M.load_policy(opts.policy, 2),
    tokenizer = opts.detokenize ~= false and model.tokenizer or nil,
    requests = {},       -- active requests by id
    running = {},        -- requests holding a sequence, in arrival order
    waiting = {},        -- requests without one, in arrival order
    next_id = 1, step_no = 0,
    stats = { steps = 0, tokens = 0, prefill_tokens = 0, decode_tokens = 0, sampled = 0, generated = 0, preemptions = 0,
      deferred = 0, forced = 0, full_retries = 0, finished = 0, drafted = 0, accepted = 0, spec_steps = 0,
      t_total = 0, t_sched = 0, t_model = 0, t_sample = 0, t_draft = 0 },
  }, Engine)
  local eos = opts.eos
  if eos == nil then
    local e = model.config and model.config.eos_token_id
    eos = type(e) == "number" and { e } or {}
  elseif eos == false then
    eos = {}
  elseif type(eos) ~= "table" then
    error("tide.engine: eos must be a list of token ids or false", 2)
  end
  eng.eos = eos
  eng.paged = model:_has_compressed()
  eng.draft = require("tide.speculate").parse(opts.draft, 2)
  return eng
end

function Engine:set_policy(p)
  self.policy = M.load_policy(p, 2)
  return self
end

-- ---------------------------------------------------------------- submission
local SPEC_KEYS = { prompt = true, tokens = true, max_tokens = true, sampler = true, seed = true, stop = true,
  priority = true, logprobs = true, trace = true, ignore_eos = true, on_token = true, tag = true, probes = true,
  draft = true }

-- eng:submit{ prompt = TEXT | tokens = {ids}, max_tokens = N (default 128),
--   sampler = sampler | file path | options table (temp, top_k, ...) | nil,
--   seed = S (nil or -1: random), stop = {strings and/or token ids},
--   priority = P (higher first under "priority"), logprobs = N | true,
--   trace = bool, ignore_eos = bool, on_token = function(h, id, text), tag = any,
--   probes = { probe, ... } (tide.probe: on this request's rows only; a
--   failing probe ends this request with finish_reason "error"),
--   draft = k | { max = k, policy = "fixed" | "adaptive" | file | table, opts = {},
--   accept = "chain" | "rejection" } (speculative decoding with the MTP block,
--   same tokens; "rejection": the same distribution instead; tide.speculate;
--   0 or false: none even when the engine has a default) }
-- Returns a handle. Misuse (bad types, unknown fields, ids outside the
-- vocabulary) raises; a request that could never fit (beyond the model's
-- positions or larger than the whole cache) gives nil, message.
function Engine:submit(spec)
  if type(spec) ~= "table" then error("submit{...}: a table expected", 2) end
  for k in pairs(spec) do
    if not SPEC_KEYS[k] then error("submit: unknown field '" .. tostring(k) .. "'", 2) end
  end
  local model = self.model
  local toks = spec.tokens
  if toks == nil then
    if type(spec.prompt) ~= "string" then error("submit: give prompt (text) or tokens (a list of ids)", 2) end
    if not model.tokenizer then error("submit: the model has no tokenizer; give tokens", 2) end
    toks = model.tokenizer:encode(spec.prompt)
  elseif spec.prompt ~= nil then
    error("submit: give prompt or tokens, not both", 2)
  end
  if type(toks) ~= "table" then error("submit: tokens must be a list of ids", 2) end
  if #toks == 0 then error("submit: the prompt is empty", 2) end
  local vocab = model.vocab_size
  for i = 1, #toks do
    local id = toks[i]
    if not is_int(id) or id < 0 or id >= vocab then
      error(string.format("submit: token %s at index %d is outside the vocabulary (0..%d)", tostring(id), i - 1,
        vocab - 1), 2)
    end
  end
  local max_new = spec.max_tokens or 128
  if not is_int(max_new) or max_new < 1 then error("submit: max_tokens must be an integer >= 1", 2) end
  local prio = spec.priority or 0
  if type(prio) ~= "number" or prio ~= prio then error("submit: priority must be a number", 2) end
  if spec.on_token ~= nil and type(spec.on_token) ~= "function" then error("submit: on_token must be a function", 2) end
  local logprobs = spec.logprobs
  if logprobs == true then logprobs = 0 elseif logprobs == false then logprobs = nil end
  if logprobs ~= nil and (not is_int(logprobs) or logprobs < 0) then
    error("submit: logprobs must be true or an integer >= 0", 2)
  end
  local stop_str, stop_ids = {}, {}
  if not spec.ignore_eos then
    for _, id in ipairs(self.eos) do stop_ids[#stop_ids + 1] = id end
  end
  if spec.stop ~= nil then
    local list = type(spec.stop) == "table" and spec.stop or { spec.stop }
    for _, x in ipairs(list) do
      if is_int(x) then stop_ids[#stop_ids + 1] = x
      elseif type(x) == "string" and x ~= "" then stop_str[#stop_str + 1] = x
      else error("submit: stop entries must be non-empty strings or token ids", 2) end
    end
    if #stop_str > 0 and not self.tokenizer then error("submit: stop strings need a tokenizer", 2) end
  end
  -- can it ever run?
  local total = #toks + max_new
  if model.max_positions and total > model.max_positions then
    return nil, string.format("request of %d positions (prompt %d + max_tokens %d) is beyond the model's "
      .. "max_position_embeddings (%d)", total, #toks, max_new, model.max_positions)
  end
  local swa, pages = model:cache_peak(total, self.chunk)
  if swa > self.swa_cap or pages > self.pages_cap then
    return nil, string.format("request of %d positions (prompt %d + max_tokens %d) needs %d SWA blocks and %d pages, "
      .. "more than the whole cache this engine may use (%d SWA blocks, %d pages)", total, #toks, max_new, swa, pages,
      self.swa_cap, self.pages_cap)
  end
  local probes = require("tide.probe").compile(model, spec.probes, 2)
  local draft = self.draft
  if spec.draft ~= nil then draft = require("tide.speculate").parse(spec.draft, 2) end
  local sampler, serr = M.sampler_of(spec.sampler, model.tokenizer)
  if not sampler then error("submit: " .. tostring(serr), 2) end
  local gen = require("tide.generation").new{
    sampler = sampler, seed = spec.seed, logprobs = logprobs, trace = spec.trace,
    max_tokens = max_new, stop = stop_str, stop_tokens = stop_ids,
    tokenizer = self.tokenizer,
  }
  local id = self.next_id
  self.next_id = id + 1
  local r = setmetatable({
    engine = self, id = id, tag = spec.tag, arrival = id, priority = prio,
    tokens = {}, n_prompt = #toks, generated = {}, texts = {}, tail = "",
    computed = 0, max_tokens = max_new, gen = gen, on_token = spec.on_token, probes = probes,
    status = "waiting", preemptions = 0, last_step = self.step_no, swa_held = 0, pages_held = 0,
    t_submit = now(),
  }, Request)
  for i = 1, #toks do r.tokens[i] = toks[i] end
  if draft then require("tide.speculate").attach(self, r, draft) end
  gen:prompt(r.tokens)
  r.view = {}
  refresh(r)
  self.requests[id] = r
  self.waiting[#self.waiting + 1] = r
  return r
end

-- ---------------------------------------------------------------- views
local function phase_of(r)
  local pending = #r.tokens - r.computed
  if #r.generated == 0 then return "prefill" end
  return pending == 1 and "decode" or "recompute"
end

-- Bring r's view up to date (after any change of r).
function refresh(r)
  local v = r.view
  v.id, v.tag, v.arrival, v.priority = r.id, r.tag, r.arrival, r.priority
  v.n_prompt, v.max_tokens = r.n_prompt, r.max_tokens
  v.n_tokens = #r.tokens
  v.computed = r.computed
  v.pending = #r.tokens - r.computed
  v.generated = #r.generated
  v.running = r.seq ~= nil
  v.phase = phase_of(r)
  v.preemptions = r.preemptions
  v.last_step = r.last_step
  v.swa_held, v.pages_held = r.swa_held, r.pages_held
  v.protected = false
end

-- The oldest active request: never preempted, runs at least every
-- `patience` steps.
function Engine:_anchor()
  local a, b = self.running[1], self.waiting[1]
  if a and b then return a.arrival < b.arrival and a or b end
  return a or b
end

-- Blocks free for this engine now and sequence slots it may still take.
function Engine:_free()
  local st = self.model:cache_stats()
  local used_swa, used_pages = 0, 0
  for _, r in ipairs(self.running) do
    used_swa = used_swa + r.swa_held
    used_pages = used_pages + r.pages_held
  end
  local swa = min(st.swa_free, self.swa_cap - used_swa)
  local pages = min(st.pages_free, self.pages_cap - used_pages)
  local slots = min(self.max_running - #self.running, st.max_seqs - st.seqs)
  return swa, pages, slots
end

function Engine:_view(entries)
  local running, waiting = {}, {}
  for i, r in ipairs(self.running) do running[i] = r.view end
  for i, r in ipairs(self.waiting) do waiting[i] = r.view end
  local anchor = self:_anchor()
  if anchor then anchor.view.protected = true end
  local swa, pages, slots = self:_free()
  local cc = self.model.cache_cfg
  local v = view_mod.new{
    step = self.step_no, budget = self.budget, chunk = self.chunk, max_running = self.max_running,
    patience = self.patience, slots = slots, free = { swa = swa, pages = pages },
    capacity = { swa = self.swa_cap, pages = self.pages_cap },
    swa_block = cc.swa_block, page_tokens = cc.page_tokens, window = cc.window, paged = self.paged,
    running = running, waiting = waiting, anchor = anchor and anchor.view or nil,
  }
  if entries then
    local plan = {}
    for i, e in ipairs(entries) do plan[i] = { req = e.r.view, n = e.n } end
    v.plan = plan
  end
  return v
end

-- ---------------------------------------------------------------- plans
local function pname(self) return "policy " .. tostring(self.policy.name or "?") end

-- The request an entry or a victim names: a request view, a handle or an id.
function Engine:_named(x)
  if type(x) == "table" then x = x.id end
  return self.requests[x]
end

-- Validate schedule()'s result into engine entries { r = request, n = tokens }.
-- Raises (nothing changed) on a bad plan.
function Engine:_resolve(plan)
  if type(plan) ~= "table" then
    error(string.format("%s: schedule() must return a list of { req =, n = } entries, got %s", pname(self),
      type(plan)), 0)
  end
  local out, used, seen = {}, 0, {}
  for i, e in ipairs(plan) do
    if type(e) ~= "table" then
      error(string.format("%s: plan entry %d is a %s, not a table", pname(self), i, type(e)), 0)
    end
    local r = self:_named(e.req)
    if not r then
      error(string.format("%s: plan entry %d names request %s, which is not active", pname(self), i,
        tostring(type(e.req) == "table" and e.req.id or e.req)), 0)
    end
    if seen[r] then error(string.format("%s: request %d appears twice in the plan", pname(self), r.id), 0) end
    seen[r] = true
    local pending = #r.tokens - r.computed
    local n = e.n
    if n == nil then n = min(pending, self.chunk) end
    if not is_int(n) or n < 0 then
      error(string.format("%s: plan entry %d (request %d): n must be an integer >= 0, got %s", pname(self), i, r.id,
        tostring(n)), 0)
    end
    n = min(n, pending)
    if n > 1 and n > self.chunk then
      error(string.format("%s: plan entry %d (request %d): %d tokens exceed the chunk limit (%d)", pname(self), i,
        r.id, n, self.chunk), 0)
    end
    if n >= 1 then
      out[#out + 1] = { r = r, n = n }
      used = used + n
    end
  end
  if used > self.budget then
    error(string.format("%s: the plan holds %d tokens, more than the budget of %d", pname(self), used, self.budget), 0)
  end
  return out
end

-- The progress guarantee: an empty plan, or an anchor left out for
-- `patience` steps, puts the anchor first (others trimmed to the budget).
function Engine:_guarantee(entries)
  local anchor = self:_anchor()
  if not anchor then return end
  for _, e in ipairs(entries) do if e.r == anchor then return end end
  if #entries > 0 and self.step_no - anchor.last_step < self.patience then return end
  local n = min(#anchor.tokens - anchor.computed, self.chunk)
  table.insert(entries, 1, { r = anchor, n = n })
  self.stats.forced = self.stats.forced + 1
  local total = 0
  for _, e in ipairs(entries) do total = total + e.n end
  while total > self.budget do
    local last = entries[#entries]
    local cut = min(last.n, total - self.budget)
    last.n = last.n - cut
    total = total - cut
    if last.n == 0 then entries[#entries] = nil end
  end
end

-- Does the step fit the blocks and slots free for the engine?
function Engine:_fits(entries)
  local swa, pages, slots = self:_free()
  local model = self.model
  for _, e in ipairs(entries) do
    local r = e.r
    local s, p = model:cache_need(r.computed, e.n)
    swa, pages = swa - s, pages - p
    if not r.seq then slots = slots - 1 end
  end
  return swa >= 0 and pages >= 0 and slots >= 0
end

local function remove(list, r)
  for i = 1, #list do
    if list[i] == r then table.remove(list, i) return true end
  end
  return false
end

-- insert r into list keeping arrival order
local function insert_ordered(list, r)
  local pos = #list + 1
  while pos > 1 and list[pos - 1].arrival > r.arrival do pos = pos - 1 end
  table.insert(list, pos, r)
end

-- Release r's cache blocks; it waits and recomputes its whole history
-- (prompt + generated tokens) when scheduled again.
function Engine:_preempt(r)
  if r.spec then require("tide.speculate").reset(self, r) end
  r.seq:free()
  r.seq = nil
  r.computed = 0
  r.swa_held, r.pages_held = 0, 0
  r.preemptions = r.preemptions + 1
  r.status = "waiting"
  self.stats.preemptions = self.stats.preemptions + 1
  remove(self.running, r)
  insert_ordered(self.waiting, r)
  refresh(r)
end

-- Choose who gives way: the policy's victim(view, plan), checked, or the
-- latest arrival among the candidates (running requests and planned ones
-- without a sequence, the anchor excluded). nil when there is none.
function Engine:_victim(entries)
  local anchor = self:_anchor()
  local cand = {}
  for _, r in ipairs(self.running) do if r ~= anchor then cand[r] = true end end
  for _, e in ipairs(entries) do
    if not e.r.seq and e.r ~= anchor then cand[e.r] = true end
  end
  if next(cand) == nil then return nil end
  local pick
  if self.policy.victim then
    local view = self:_view(entries)
    local ok, v = pcall(self.policy.victim, view, view.plan)
    if not ok then error(pname(self) .. ": victim() raised: " .. tostring(v), 0) end
    if v ~= nil then
      local r = self:_named(v)
      if not r or (not cand[r] and r ~= anchor) then
        error(string.format("%s: victim() returned %s, which is neither running nor in the plan", pname(self),
          tostring(type(v) == "table" and v.id or v)), 0)
      end
      if r ~= anchor then pick = r end
    end
  end
  if not pick then
    for r in pairs(cand) do
      if not pick or r.arrival > pick.arrival then pick = r end
    end
  end
  return pick
end

-- Make the step fit: victims give way until it does. `extra` forces that
-- many more (the cache said full although the count said it fits).
function Engine:_make_room(entries, extra)
  extra = extra or 0
  while extra > 0 or not self:_fits(entries) do
    local v = self:_victim(entries)
    if not v then
      error(string.format("engine: the step does not fit the cache even with only request %d in it (the cache is "
        .. "held by sequences outside this engine?)", self:_anchor().id), 0)
    end
    for i, e in ipairs(entries) do
      if e.r == v then table.remove(entries, i) break end
    end
    if v.seq then self:_preempt(v) else self.stats.deferred = self.stats.deferred + 1 end
    extra = extra - 1
  end
end

-- ---------------------------------------------------------------- one step
-- Run one scheduling step: the policy's plan, one forward over every
-- scheduled token, sampling. Returns the number of tokens run (0 when no
-- request is active). A policy that raises or returns a bad plan raises
-- here with a message naming it; nothing ran, and the engine can go on
-- (e.g. after set_policy).
function Engine:step()
  if #self.running == 0 and #self.waiting == 0 then return 0 end
  local t0 = now()
  local stats = self.stats
  self.step_no = self.step_no + 1
  for _, r in ipairs(self.running) do refresh(r) end
  local view = self:_view()
  local ok, plan = pcall(self.policy.schedule, view)
  if not ok then
    self.step_no = self.step_no - 1
    error(pname(self) .. ": schedule() raised: " .. tostring(plan), 0)
  end
  local entries
  ok, entries = pcall(self._resolve, self, plan)
  if not ok then
    self.step_no = self.step_no - 1
    error(entries, 0)
  end
  self:_guarantee(entries)
  self:_make_room(entries)
  if #entries == 0 then
    -- every entry gave way: the anchor runs alone rather than nobody
    self:_guarantee(entries)
    self:_make_room(entries)
  end
  -- admit: scheduled requests without a sequence get one (slots counted above)
  local model = self.model
  for _, e in ipairs(entries) do
    local r = e.r
    if not r.seq then
      local s, err = model:sequence()
      if not s then error("engine: " .. tostring(err), 0) end
      r.seq = s
      r.status = "running"
      r.t_start = r.t_start or now()
      r.step_admit = r.step_admit or self.step_no
      remove(self.waiting, r)
      insert_ordered(self.running, r)
    end
  end
  -- speculation: drafting requests verify pending + drafts (tide.speculate)
  local spec, sopts, cpu0
  for _, e in ipairs(entries) do if e.r.spec then spec = require("tide.speculate") break end end
  if spec then
    local td = now()
    cpu0 = os.clock()
    local ended = spec.plan(self, entries, function(es) return self:_fits(es) end)
    self.stats.t_draft = self.stats.t_draft + (now() - td)
    for _, x in ipairs(ended) do
      for i, e in ipairs(entries) do
        if e.r == x[1] then table.remove(entries, i) break end
      end
      self:_finish(x[1], "error", x[2])
    end
    sopts = { after_forward = spec.capture }
  end
  local me, res
  local t_model = 0
  while true do
    me = {}
    for i, e in ipairs(entries) do
      -- the request's next span of tokens (the same spans m:feed runs)
      local r, n, c = e.r, e.n, e.r.computed
      if e.drafts then
        me[i] = spec.entry(e)
      else
        me[i] = { seq = r.seq, tokens = r.tokens, from = c + 1, n = n,
          logits = (c + n == #r.tokens) and "last" or false, probes = r.probes }
      end
      me[i].eng = e
      e.cn0 = nil
    end
    if #me == 0 then res = {} break end   -- every entry ended before the step (a draft policy)
    local tm = now()
    res = model:step(me, sopts)
    t_model = t_model + (now() - tm)
    if res then break end
    -- the cache disagreed with the count: someone else took blocks
    stats.full_retries = stats.full_retries + 1
    self:_make_room(entries, 1)
  end
  local t1 = now()
  if spec then spec.measure(self, entries, os.clock() - cpu0) end
  -- a request whose probe failed did not run: it ends with the error
  local failed = res.errors
  if failed then
    for i, e in ipairs(entries) do
      if failed[i] then self:_finish(e.r, "error", failed[i]) end
    end
  end
  -- advance every entry, then sample (a callback may cancel another request)
  local ran = 0
  for i, e in ipairs(entries) do
    local r = e.r
    if failed and failed[i] then goto continue end
    if e.drafts then
      stats.decode_tokens = stats.decode_tokens + e.n   -- pending + drafts; computed moves in spec.commit
    elseif #r.generated > 0 and e.n == 1 and r.computed + 1 == #r.tokens then
      stats.decode_tokens = stats.decode_tokens + 1
    else
      stats.prefill_tokens = stats.prefill_tokens + e.n
    end
    if not e.drafts then r.computed = r.computed + e.n end
    r.last_step = self.step_no
    if not e.drafts then r.swa_held, r.pages_held = r.seq:usage() end
    ran = ran + e.n
    ::continue::
  end
  for i, e in ipairs(entries) do
    if res[i] then
      if e.drafts then
        if e.r.status == "running" then spec.commit(self, e, res[i], self._sample) end
      else
        self:_sample(e.r, res[i])
      end
    end
  end
  local t2 = now()
  stats.steps = stats.steps + 1
  stats.tokens = stats.tokens + ran
  stats.t_model = stats.t_model + t_model
  stats.t_sched = stats.t_sched + (t1 - t0 - t_model)
  stats.t_sample = stats.t_sample + (t2 - t1)
  stats.t_total = stats.t_total + (t2 - t0)
  return ran
end

-- Sample r's next token from its logits row with its own sampler state; a
-- sampler (or on_token callback) that raises ends only this request.
function Engine:_sample(r, row, choose)
  if r.status ~= "running" then return end   -- cancelled by a callback earlier in this step
  local ok, tok, text, reason = pcall(r.gen.step, r.gen, row, choose)
  if not ok then
    self:_finish(r, "error", "sampling: " .. tostring(tok))
    return
  end
  self.stats.sampled = self.stats.sampled + 1
  if tok == nil then
    if reason == "error" then
      r.tail = r.tail .. (text or "")
      self:_finish(r, "error", r.gen.error)
    else
      self:_finish(r, reason or "length")
    end
    return
  end
  self.stats.generated = self.stats.generated + 1
  local t = now()
  r.t_first = r.t_first or t
  r.step_first = r.step_first or self.step_no
  r.t_last = t
  local k = #r.generated + 1
  r.generated[k] = tok
  r.texts[k] = text
  r.tokens[#r.tokens + 1] = tok
  if r.on_token then
    local okc, cerr = pcall(r.on_token, r, tok, text)
    if not okc then
      self:_finish(r, "error", "on_token: " .. tostring(cerr))
      return tok
    end
  end
  if reason and r.status == "running" then self:_finish(r, reason) end
  return tok
end

-- End r: its blocks go back to the pool now.
function Engine:_finish(r, reason, err)
  if r.status == "done" or r.status == "error" or r.status == "cancelled" then return end
  if r.seq then r.seq:free() end
  r.seq = nil
  if r.spec then require("tide.speculate").reset(self, r) end
  r.swa_held, r.pages_held = 0, 0
  remove(self.running, r)
  remove(self.waiting, r)
  self.requests[r.id] = nil
  r.finish_reason = reason
  r.error = err
  r.status = err and "error" or (reason == "cancelled" and "cancelled" or "done")
  r.t_done = now()
  r.step_done = self.step_no
  local tail = r.gen:stop(reason)
  if tail ~= "" then r.tail = r.tail .. tail end
  self.stats.finished = self.stats.finished + 1
  if r.tail ~= "" and r.on_token then pcall(r.on_token, r, false, r.tail) end
end

-- Step until no request is active, or until stop() returns true (checked
-- before each step). Returns the number of steps run.
function Engine:run(stop)
  local n = 0
  while #self.running > 0 or #self.waiting > 0 do
    if stop and stop() then break end
    self:step()
    n = n + 1
  end
  return n
end

-- Active requests (waiting or running).
function Engine:active() return #self.running + #self.waiting end

-- Time shares since the engine started: t_sched is the Lua scheduling of
-- each step (view, policy, checks, admission, batch lists; with drafting
-- also the MTP drafting, t_draft of it), t_model the forward (model:step),
-- t_sample the sampling and streaming. drafted / accepted / spec_steps and
-- acceptance: speculative decoding (tide.speculate).
function Engine:report()
  local s = self.stats
  local out = {}
  for k, v in pairs(s) do out[k] = v end
  out.sched_share = s.t_total > 0 and s.t_sched / s.t_total or 0
  out.sample_share = s.t_total > 0 and s.t_sample / s.t_total or 0
  out.acceptance = s.drafted > 0 and s.accepted / s.drafted or nil
  return out
end

-- Cancel every active request; close the model when the engine loaded it.
function Engine:close()
  local list = {}
  for _, r in ipairs(self.running) do list[#list + 1] = r end
  for _, r in ipairs(self.waiting) do list[#list + 1] = r end
  for _, r in ipairs(list) do self:_finish(r, "cancelled") end
  if self.owns_model then self.model:close() end
end

-- ---------------------------------------------------------------- handles
-- h:cancel(): end the request now; its cache blocks return to the pool.
-- false when it had already finished.
function Request:cancel()
  if self:done() then return false end
  self.engine:_finish(self, "cancelled")
  return true
end

function Request:done() return self.status == "done" or self.status == "error" or self.status == "cancelled" end

-- for id, text in h:stream() do ... end: each generated token and the text
-- it made safe to show, stepping the engine while the request has nothing
-- new. When the request ends without a token (cancelled, a failing sampler)
-- and text was still held back, a last pair (false, text) carries it.
function Request:stream()
  local i = 0
  local tail_sent = false
  return function()
    while true do
      if i < #self.generated then
        i = i + 1
        return self.generated[i], self.texts[i]
      end
      if self:done() then
        if not tail_sent and self.tail ~= "" then
          tail_sent = true
          return false, self.tail
        end
        return nil
      end
      if self.engine:step() == 0 and not self:done() then
        error("stream: the engine has nothing to run but request " .. self.id .. " is not done", 2)
      end
    end
  end
end

-- The text generated so far (stop strings excluded), or nil without a tokenizer.
function Request:text()
  if not self.engine.tokenizer then return nil end
  return table.concat(self.texts) .. self.tail
end

-- The result record (what `tide batch` writes): ids, text, finish reason,
-- error, logprobs (when asked), ttft (s from submission to the first token),
-- tokens_per_second (decode rate after the first token), time (s from
-- submission to the end), preemptions, speculation (with drafting: max,
-- policy, steps, drafted, accepted, acceptance, tokens_per_step).
function Request:result()
  local n = #self.generated
  local ids = {}
  for i = 1, n do ids[i] = self.generated[i] end
  local tps
  if n > 1 and self.t_last > self.t_first then tps = (n - 1) / (self.t_last - self.t_first) end
  return {
    id = self.id, tag = self.tag, status = self.status, tokens = ids, text = self:text(),
    finish_reason = self.finish_reason, error = self.error, stop_string = self.gen.stop_string,
    prompt_tokens = self.n_prompt, completion_tokens = n,
    ttft = self.t_first and (self.t_first - self.t_submit) or nil,
    queued = self.t_start and (self.t_start - self.t_submit) or nil,
    time = self.t_done and (self.t_done - self.t_submit) or nil,
    tokens_per_second = tps, preemptions = self.preemptions,
    step_admit = self.step_admit, step_first = self.step_first, step_done = self.step_done,
    logprobs = self.gen.logprobs,
    speculation = self.spec and require("tide.speculate").report(self) or nil,
  }
end

-- one-line summaries and the long form live in tide.describe
Engine.__tostring = function(e) return require("tide.describe").engine(e) end
function Engine:describe() return require("tide.describe").engine_long(self) end
Request.__tostring = function(r) return require("tide.describe").request(r) end

setmetatable(M, { __call = function(_, ...) return M.new(...) end })
return M
