-- tide.engine: continuous batching over one model. Requests are submitted,
-- and each step a policy (a Lua file under lua/tide/scheduler/policies/, or
-- your own) decides which requests decode, which prompt chunks prefill, and
-- who gives up its cache blocks when the cache runs out. The engine builds
-- the step (tokens of every scheduled request, one model:step), samples each
-- request that finished its pending tokens with its own sampler and seed,
-- and streams the tokens.
--
--   local eng = tide.engine(model, { budget = 256, policy = "fair" })
--   local h = eng:submit{ prompt = "Hello", max_tokens = 32, seed = 1, sampler = { temp = 0.7 } }
--   for id, text in h:stream() do io.write(text) end      -- drives eng:step()
--   eng:run()                                              -- until every request is done
--
-- Exactness: a request's tokens do not depend on what else runs (the model is
-- batch invariant and each request owns its sampler state and RNG), so N
-- requests together give what each gives alone, and a preempted request is
-- recomputed (its whole history re-prefilled) into exactly the state it lost.
-- The policy contract is in docs/scheduling.md.
local tide = require("tide")

local M = {}
local Engine = {}
Engine.__index = Engine
local Request = {}
Request.__index = Request
M.Request = Request

local function now() return tide.time() end

-- ---------------------------------------------------------------- policies
local function load_policy(p)
  if p == nil then p = "fcfs" end
  if type(p) == "table" then return p end
  if type(p) ~= "string" then error("engine: policy must be a name, a file path or a table", 3) end
  if p:match("%.lua$") or p:find("/") then
    local chunk, err = loadfile(p)
    if not chunk then error("engine: cannot load policy file " .. p .. ": " .. tostring(err), 3) end
    local ok, pol = pcall(chunk)
    if not ok then error("engine: policy file " .. p .. " raised: " .. tostring(pol), 3) end
    if type(pol) ~= "table" or type(pol.schedule) ~= "function" then
      error("engine: policy file " .. p .. " must return a table with a schedule(view) function", 3)
    end
    return pol
  end
  local ok, pol = pcall(require, "tide.scheduler.policies." .. p)
  if not ok then error("engine: unknown policy '" .. p .. "' (" .. tostring(pol) .. ")", 3) end
  return pol
end
M.load_policy = load_policy

-- ---------------------------------------------------------------- construction
-- opts: budget (tokens per step, default model.max_tokens), policy (name,
-- file or table), max_running (requests holding a sequence at once, default
-- the cache's sequence slots), chunk (largest prefill chunk of one request
-- per step, default budget), eos (token ids that end a request; default the
-- model's eos_token_id), detokenize (default true when the model has a
-- tokenizer).
function M.new(model, opts)
  opts = opts or {}
  if type(model) ~= "table" or not model.step then error("tide.engine(model, opts): model expected", 2) end
  local stats = model:cache_stats()
  local eng = setmetatable({
    model = model,
    budget = math.min(opts.budget or model.max_tokens, model.max_tokens),
    policy = load_policy(opts.policy),
    max_running = math.min(opts.max_running or stats.max_seqs, stats.max_seqs),
    chunk = opts.chunk,
    requests = {}, waiting = {}, running = {}, done = {},
    next_id = 1, steps = 0, arrivals = 0,
    tokenizer = opts.detokenize ~= false and model.tokenizer or nil,
    eos = opts.eos,
    stats = { steps = 0, tokens = 0, t_model = 0, t_sched = 0, t_sample = 0, preemptions = 0, t_total = 0 },
  }, Engine)
  if eng.eos == nil then
    local e = model.config.eos_token_id
    eng.eos = {}
    if type(e) == "number" and e >= 0 then eng.eos[e] = true end
  elseif type(eng.eos) == "table" then
    local set = {}
    for _, v in ipairs(eng.eos) do set[v] = true end
    eng.eos = set
  end
  eng.capacity = stats
  return eng
end

-- ---------------------------------------------------------------- submission
-- Blocks a request of n positions needs at most (pages of its compressed
-- caches, SWA blocks when the cache keeps history, else the window).
function Engine:_footprint(n)
  local c = self.capacity
  local pages = math.ceil(n / c.page_tokens)
  local swa
  if c.keep_swa_history then swa = math.ceil(n / c.swa_block)
  else swa = math.ceil((c.window + self.budget) / c.swa_block) + 1 end
  return pages, swa
end

-- A sampler from what a request gives: a sampler object, a file path, an
-- options table with llama.cpp's names (temp, top_k, ...), or nil (defaults).
function M.sampler_of(x, model)
  local sampling = require("tide.sampling")
  if x == nil then return sampling.from_options({}, { tokenizer = model.tokenizer }) end
  if type(x) == "string" then return sampling.load(x) end
  if type(x) == "table" and x.new_state then return x end
  if type(x) == "table" then return sampling.from_options(x, { tokenizer = model.tokenizer }) end
  return nil, "sampler must be a sampler, a file path or an options table"
end

-- eng:submit{ prompt = TEXT | tokens = {ids}, max_tokens = N (default 128),
--   sampler = chain | file path | options table (temp, top_k, ...) | nil,
--   seed = S, stop = {strings or ids}, priority = P (higher first),
--   logprobs = N, trace = bool, ignore_eos = bool,
--   on_token = function(h, id, text), tag = anything }
-- Returns a handle. Misuse raises; a request that can never fit the cache is
-- refused with nil, message.
function Engine:submit(spec)
  if type(spec) ~= "table" then error("submit{...}: a table expected", 2) end
  local model = self.model
  local toks = spec.tokens
  if toks == nil then
    if type(spec.prompt) ~= "string" then error("submit: give prompt (text) or tokens (ids)", 2) end
    if not model.tokenizer then error("submit: the model has no tokenizer; give tokens", 2) end
    toks = model.tokenizer:encode(spec.prompt)
  end
  if type(toks) ~= "table" or #toks == 0 then error("submit: empty prompt", 2) end
  local vocab = model.vocab_size
  for i, id in ipairs(toks) do
    if type(id) ~= "number" or id < 0 or id >= vocab or id ~= math.floor(id) then
      error(string.format("submit: token %s at index %d is outside the vocabulary (0..%d)", tostring(id), i - 1,
        vocab - 1), 2)
    end
  end
  local max_new = spec.max_tokens or 128
  local total = #toks + max_new
  if total > model.max_positions then
    return nil, string.format("request needs %d positions, beyond max_position_embeddings (%d)", total,
      model.max_positions)
  end
  local pages, swa = self:_footprint(total)
  if pages > self.capacity.pages or swa > self.capacity.swa_blocks then
    return nil, string.format("request of %d positions (prompt %d + max_tokens %d) needs %d pages and %d SWA "
      .. "blocks, more than the whole cache (%d pages, %d SWA blocks)", total, #toks, max_new, pages, swa,
      self.capacity.pages, self.capacity.swa_blocks)
  end
  local sampler, serr = M.sampler_of(spec.sampler, model)
  if not sampler then error("submit: " .. tostring(serr), 2) end
  self.arrivals = self.arrivals + 1
  local r = setmetatable({
    engine = self, id = self.next_id, tag = spec.tag,
    prompt = {}, tokens = {}, generated = {}, n_prompt = #toks, computed = 0,
    max_tokens = max_new, priority = spec.priority or 0, arrival = self.arrivals,
    sampler = sampler, seed = spec.seed, on_token = spec.on_token,
    status = "waiting", finish_reason = nil, preemptions = 0, waited = 0,
    t_submit = now(), text_parts = {},
  }, Request)
  for i, id in ipairs(toks) do r.prompt[i] = id; r.tokens[i] = id end
  -- stop: strings end the text before them; numbers are stop tokens (with eos)
  local stop_str, stop_ids = {}, {}
  for id in pairs(self.eos) do stop_ids[#stop_ids + 1] = id end
  for _, x in ipairs(spec.stop or {}) do
    if type(x) == "number" then stop_ids[#stop_ids + 1] = x else stop_str[#stop_str + 1] = x end
  end
  r.gen = require("tide.generation").new{
    sampler = sampler, seed = spec.seed, logprobs = spec.logprobs, trace = spec.trace,
    max_tokens = max_new, stop = stop_str, stop_tokens = stop_ids, ignore_eos = spec.ignore_eos,
    tokenizer = self.tokenizer,
  }
  r.gen:prompt(r.prompt)
  self.next_id = self.next_id + 1
  self.requests[r.id] = r
  self.waiting[#self.waiting + 1] = r
  return r
end

-- ---------------------------------------------------------------- the view a policy sees
local function req_view(r)
  return {
    id = r.id, priority = r.priority, arrival = r.arrival, tag = r.tag,
    n_prompt = r.n_prompt, n_tokens = #r.tokens, computed = r.computed, pending = #r.tokens - r.computed,
    generated = #r.generated, max_tokens = r.max_tokens, waited = r.waited, preemptions = r.preemptions,
    running = r.seq ~= nil,
    -- "decode": one sampled token to feed; "prefill": a prompt (or a
    -- preempted history) still going in
    phase = (#r.generated > 0 and r.computed + 1 >= #r.tokens) and "decode" or "prefill",
  }
end

function Engine:_view()
  local v = { budget = self.budget, step = self.steps, max_running = self.max_running, chunk = self.chunk or self.budget,
    running = {}, waiting = {}, cache = self.model:cache_stats() }
  for i, r in ipairs(self.running) do v.running[i] = req_view(r) end
  for i, r in ipairs(self.waiting) do v.waiting[i] = req_view(r) end
  return v
end

-- ---------------------------------------------------------------- preemption and finishing
function Engine:_remove(list, r)
  for i, x in ipairs(list) do
    if x == r then table.remove(list, i) return true end
  end
  return false
end

-- Release r's cache blocks; it goes back to waiting and will recompute its
-- whole history (prompt + generated) when scheduled again.
function Engine:_preempt(r)
  if r.seq then r.seq:free() end
  r.seq = nil
  r.computed = 0
  r.preemptions = r.preemptions + 1
  self.stats.preemptions = self.stats.preemptions + 1
  self:_remove(self.running, r)
  r.status = "waiting"
  -- keep arrival order among waiting requests
  local pos = #self.waiting + 1
  for i, w in ipairs(self.waiting) do
    if w.arrival > r.arrival then pos = i break end
  end
  table.insert(self.waiting, pos, r)
end

function Engine:_finish(r, reason, err)
  r.finish_reason = reason
  r.error = err
  r.status = err and "error" or (reason == "cancelled" and "cancelled" or "done")
  r.t_done = now()
  if r.seq then r.seq:free() end
  r.seq = nil
  if r.gen and not r.gen.finish_reason then
    local tail = r.gen:stop(reason)
    if tail ~= "" then r.text_parts[#r.text_parts + 1] = tail; r.pending_text = (r.pending_text or "") .. tail end
  end
  self:_remove(self.running, r)
  self:_remove(self.waiting, r)
  self.done[#self.done + 1] = r
end

-- ---------------------------------------------------------------- one step
-- Validate a policy's plan: entries { req = view or request or id, n = tokens }.
function Engine:_resolve(plan)
  local out, used, seen = {}, 0, {}
  for i, e in ipairs(plan) do
    local id = type(e.req) == "table" and e.req.id or e.req or e.id
    local r = self.requests[id]
    if not r or r.status == "done" or r.status == "error" or r.status == "cancelled" then
      error(string.format("policy %s: plan entry %d names request %s, which is not active", self.policy.name or "?", i,
        tostring(id)), 0)
    end
    if seen[id] then error("policy: request " .. id .. " appears twice in one plan", 0) end
    seen[id] = true
    local pending = #r.tokens - r.computed
    local n = math.min(e.n or pending, pending)
    if n >= 1 then
      out[#out + 1] = { r = r, n = n }
      used = used + n
    end
  end
  if used > self.budget then
    error(string.format("policy %s: plan of %d tokens exceeds the budget of %d", self.policy.name or "?", used,
      self.budget), 0)
  end
  return out
end

-- The victim to preempt when the cache is full: the policy's choice, or the
-- most recently arrived running request. Progress guarantee: one running
-- request is protected (the policy's `protect(view)`, default the oldest
-- arrival) and is never preempted while another request holds a sequence, so
-- it always advances; every request in turn becomes the protected one, so
-- nothing livelocks.
function Engine:_victim(plan)
  local view = self:_view()
  local holders = {}
  for _, r in ipairs(self.running) do if r.seq then holders[#holders + 1] = r end end
  if #holders == 0 then return nil end
  local protected
  if self.policy.protect then
    local ok, p = pcall(self.policy.protect, view)
    if ok and p then protected = self.requests[type(p) == "table" and p.id or p] end
  end
  if not protected then
    for _, r in ipairs(holders) do
      if not protected or r.arrival < protected.arrival then protected = r end
    end
  end
  local pick
  if self.policy.victim then
    local ok, v = pcall(self.policy.victim, view, plan)
    if ok and v then pick = self.requests[type(v) == "table" and v.id or v] end
  end
  if not pick or not pick.seq or (pick == protected and #holders > 1) then
    pick = nil
    for _, r in ipairs(holders) do
      if r ~= protected and (not pick or r.arrival > pick.arrival) then pick = r end
    end
  end
  return pick or protected
end

-- Run one scheduling step. Returns the number of tokens the model ran (0 when
-- there was nothing to do).
function Engine:step()
  local t0 = now()
  self.steps = self.steps + 1
  local plan
  local view = self:_view()
  if #view.running == 0 and #view.waiting == 0 then return 0 end
  plan = self:_resolve(self.policy.schedule(view) or {})
  -- admit: scheduled requests without a sequence get one
  local admitted = {}
  for _, e in ipairs(plan) do
    local r = e.r
    if not r.seq then
      if #self.running >= self.max_running then
        e.skip = true
      else
        local s = self.model:sequence()
        if not s then e.skip = true else
          r.seq = s
          r.status = "running"
          if not r.t_start then r.t_start = now() end
          self:_remove(self.waiting, r)
          self.running[#self.running + 1] = r
          admitted[#admitted + 1] = r
        end
      end
    end
  end
  for _, r in ipairs(self.waiting) do r.waited = r.waited + 1 end
  local t_sched = now() - t0
  -- run; on a full cache preempt victims until the step fits
  local res, entries
  while true do
    entries = {}
    for _, e in ipairs(plan) do
      if not e.skip and e.r.seq then
        local r = e.r
        local part = {}
        for j = 1, e.n do part[j] = r.tokens[r.computed + j] end
        local finishes = r.computed + e.n == #r.tokens
        entries[#entries + 1] = { seq = r.seq, tokens = part, logits = finishes and "last" or false, req = r, n = e.n }
      end
    end
    if #entries == 0 then break end
    local tm = now()
    local err
    res, err = self.model:step(entries)
    self.stats.t_model = self.stats.t_model + (now() - tm)
    if res then break end
    local victim = self:_victim(plan)
    if not victim then error("engine: the cache is full and no request can be preempted (" .. tostring(err) .. ")", 0) end
    self:_preempt(victim)
    for _, e in ipairs(plan) do if e.r == victim then e.skip = true end end
  end
  if not res then
    self.stats.t_sched = self.stats.t_sched + t_sched
    return 0
  end
  -- advance, sample, stream
  local ts = now()
  local ran = 0
  for i, e in ipairs(entries) do
    local r = e.req
    r.computed = r.computed + e.n
    ran = ran + e.n
    local lg = res[i]
    if lg then self:_sample(r, lg) end
  end
  self.stats.t_sample = self.stats.t_sample + (now() - ts)
  self.stats.steps = self.stats.steps + 1
  self.stats.tokens = self.stats.tokens + ran
  self.stats.t_sched = self.stats.t_sched + t_sched
  self.stats.t_total = self.stats.t_total + (now() - t0)
  return ran
end

-- Sample the next token of r from its logits row (its own sampler state and
-- RNG); a sampler that raises ends only this request.
function Engine:_sample(r, row)
  local tok, text, reason = r.gen:step(row)
  if tok == nil then
    if reason == "error" then self:_finish(r, "error", r.gen.error) else self:_finish(r, reason or "length") end
    return
  end
  if not r.t_first then r.t_first = now() end
  r.generated[#r.generated + 1] = tok
  r.tokens[#r.tokens + 1] = tok
  if text ~= "" then r.text_parts[#r.text_parts + 1] = text end
  r.pending_text = (r.pending_text or "") .. text
  r.new_tokens = r.new_tokens or {}
  r.new_tokens[#r.new_tokens + 1] = tok
  if r.on_token then
    local okc, cerr = pcall(r.on_token, r, tok, text)
    if not okc then self:_finish(r, "error", "on_token: " .. tostring(cerr)) return end
  end
  if reason then self:_finish(r, reason) end
end

-- Step until every request is done (or `until_fn()` is true).
function Engine:run(until_fn)
  while #self.running > 0 or #self.waiting > 0 do
    if until_fn and until_fn() then break end
    self:step()
  end
end

-- ---------------------------------------------------------------- handles
function Request:cancel()
  if self.status == "done" or self.status == "error" or self.status == "cancelled" then return false end
  self.engine:_finish(self, "cancelled")
  return true
end

function Request:done() return self.status == "done" or self.status == "error" or self.status == "cancelled" end

-- for id, text in h:stream() do ... end: yields each generated token (and its
-- detokenized text) as it arrives, stepping the engine as needed.
function Request:stream()
  local queue, qi = {}, 1
  return function()
    while true do
      if self.new_tokens and #self.new_tokens > 0 then
        for _, t in ipairs(self.new_tokens) do queue[#queue + 1] = t end
        self.new_tokens = {}
      end
      if qi <= #queue then
        local t = queue[qi]
        qi = qi + 1
        local text = ""
        if qi > #queue then text = self.pending_text or ""; self.pending_text = "" end
        return t, text
      end
      if self:done() then
        local tail = self.pending_text
        self.pending_text = ""
        if tail and tail ~= "" then return -1, tail end
        return nil
      end
      self.engine:step()
    end
  end
end

-- The text generated so far (stop strings excluded).
function Request:text() return table.concat(self.text_parts) end

-- The result record (what `tide batch` writes).
function Request:result()
  local t_first = self.t_first and (self.t_first - self.t_submit) or nil
  local dur = (self.t_done or now()) - (self.t_first or self.t_submit)
  local n = #self.generated
  return {
    id = self.id, tag = self.tag, tokens = self.generated, text = self.engine.tokenizer and self:text() or nil,
    finish_reason = self.finish_reason, error = self.error, prompt_tokens = self.n_prompt,
    completion_tokens = n, ttft = t_first, tokens_per_second = (n > 1 and dur > 0) and (n - 1) / dur or nil,
    preemptions = self.preemptions, logprobs = self.gen and self.gen.logprobs or nil,
    stop_string = self.gen and self.gen.stop_string or nil,
  }
end

-- Share of engine time spent in Lua scheduling and sampling vs the model.
function Engine:report()
  local s = self.stats
  return {
    steps = s.steps, tokens = s.tokens, preemptions = s.preemptions,
    t_total = s.t_total, t_model = s.t_model, t_sched = s.t_sched, t_sample = s.t_sample,
    sched_share = s.t_total > 0 and s.t_sched / s.t_total or 0,
  }
end

setmetatable(M, { __call = function(_, ...) return M.new(...) end })
return M
