-- tide.speculate: speculative decoding inside the engine (tide.engine) with
-- the checkpoint's MTP block (tide.models.deepseek_v4_mtp; docs/speculative.md).
--
-- A request submitted with draft = { max = k [, policy = "fixed" | "adaptive"
-- | file path | module, opts = {...}] } (or draft = k) may draft up to k
-- tokens at each decode step. Per step and request, its draft policy says how
-- many (0..k; it sees the request's recent acceptance and the step's load).
-- The drafts of every drafting request are made in batched MTP steps (one
-- catch-up step, then one step per further draft depth, on forks of the MTP
-- sequences); the main model verifies pending + drafts of every request in
-- the engine's one model step, with every other request's tokens; each
-- request's own sampler chain then picks its committed tokens from the verify
-- rows in order, accepting drafts while the pick equals them, and the main
-- sequence rolls back to the accepted prefix (tide_kvcache_seq_truncate).
--
-- Exactness: the chain sees, for every committed token, bitwise the row plain
-- decoding computes (batch and chunk invariance), once and in order, so a
-- request's tokens are the same bits as without drafting, for greedy and for
-- any sampler and seed. The MTP cache holds only entries computed from the
-- main model's residual streams of committed positions, so it too is what a
-- never-drafting run would hold; a preempted request drops it and rebuilds it
-- from the recomputed streams.
local tide = require("tide")
local tffi = require("tide.ffi")
local C, check = tffi.C, tffi.check

local M = {}

local new_mseq   -- (below)

local function is_int(x) return type(x) == "number" and x == math.floor(x) end

-- A draft policy from a name (lua/tide/scheduler/draft/NAME.lua), a file path
-- or a module table. Raises on misuse.
function M.load_policy(p, level)
  level = (level or 1) + 1
  if p == nil then p = "fixed" end
  local pol = p
  if type(p) == "string" then
    if p:find("/", 1, true) or p:match("%.lua$") then
      local chunk, err = loadfile(p)
      if not chunk then error("draft policy file " .. p .. ": " .. tostring(err), level) end
      local ok, r = pcall(chunk)
      if not ok then error("draft policy file " .. p .. " raised: " .. tostring(r), level) end
      pol = r
    else
      if not p:match("^[%w_]+$") then error("bad draft policy name '" .. p .. "'", level) end
      local ok, r = pcall(require, "tide.scheduler.draft." .. p)
      if not ok then error("unknown draft policy '" .. p .. "' (built-in: fixed, adaptive; or a file path)", level) end
      pol = r
    end
  end
  if type(pol) ~= "table" or type(pol.new) ~= "function" or type(pol.draft) ~= "function"
    or type(pol.observe) ~= "function" then
    error("a draft policy is a table with new, draft and observe functions", level)
  end
  return pol
end

-- Parse a request's (or the engine's default) draft field into
-- { max, policy, opts } or nil (no drafting). Raises on misuse.
function M.parse(x, level)
  level = (level or 1) + 1
  if x == nil or x == false or x == 0 then return nil end
  if is_int(x) then x = { max = x } end
  if type(x) ~= "table" then error("draft must be a number or { max = k, policy = ... }", level) end
  for k in pairs(x) do
    if k ~= "max" and k ~= "policy" and k ~= "opts" and k ~= "accept" then
      error("draft: unknown field '" .. tostring(k) .. "'", level)
    end
  end
  local k = x.max
  if not is_int(k) or k < 0 or k > 16 then error("draft.max must be an integer in 0..16", level) end
  if x.accept ~= nil and x.accept ~= "chain" and x.accept ~= "rejection" then
    error("draft.accept must be \"chain\" (the default) or \"rejection\"", level)
  end
  if k == 0 then return nil end
  return { max = k, policy = M.load_policy(x.policy, level), opts = x.opts, accept = x.accept or "chain" }
end

-- The engine's MTP block, or raises. Made on first use and kept on the model
-- (like the main cache, it is shared by every engine on the model).
local function block(eng)
  if eng.mtp then return eng.mtp end
  local model = eng.model
  local d = model._mtp
  if not d then
    -- its own one-layer cache: a sequence and a drafting fork per sequence slot, each with its window
    local cc = model.cache_cfg
    local co = { swa_block = cc.swa_block, page_tokens = cc.page_tokens, pages = cc.pages, max_seqs = 2 * cc.max_seqs }
    local err
    d, err = require("tide.models.deepseek_v4_mtp").new(model, { cache = co })
    if not d then error("draft: " .. tostring(err), 0) end
    model._mtp = d
  end
  eng.mtp = d
  eng.mtp_window = tonumber(model.cache_cfg.window)
  return d
end
M.block = block

-- Per-request state: r.spec. With accept = "rejection" the request's sampler
-- chain must be one whose distribution can be computed (raises otherwise).
function M.attach(eng, r, cfg)
  local rej = nil
  if cfg.accept == "rejection" then
    local state = r.gen and r.gen.state
    if not state then error("draft: accept = \"rejection\" is for engine requests", 0) end
    local why = state.sampler:distribution_problem()
    if why then
      error("draft: accept = \"rejection\" needs a sampler chain whose distribution can be computed; " .. why, 0)
    end
    -- a greedy chain: the rule is the exact pick (point masses), so keep that path and its bits
    local last = state.sampler.stages[#state.sampler.stages]
    if last.name ~= "greedy" then rej = { state = state, qc = {} } end
  end
  block(eng)
  local net = eng.model.net
  r.spec = {
    rejection = rej, accept = cfg.accept,
    max = cfg.max, policy = cfg.policy, pstate = cfg.policy.new(cfg.opts),
    mseq = nil,                        -- MTP sequence (nil until first needed / after preemption)
    X = tide.zeros({ 16, net.hc, net.d }), cn = 0,   -- main streams waiting for the MTP catch-up
    steps = 0, drafted = 0, accepted = 0, verify_tokens = 0,
  }
end

-- Drop the request's MTP state (preemption: rebuilt from the recomputed streams; end: freed).
function M.reset(eng, r)
  local s = r.spec
  if not s then return end
  if s.mseq then eng.mtp:free(s.mseq) end
  s.mseq, s.cn, s.base = nil, 0, nil
end

-- Streams [n, hc, d] of positions computed .. computed+n-1 join the catch-up rows.
local function keep_rows(s, X, n)
  if s.cn + n > s.X:size(0) then
    local cap = s.X:size(0)
    while cap < s.cn + n do cap = cap * 2 end
    local big = tide.zeros({ cap, s.X:size(1), s.X:size(2) })
    if s.cn > 0 then check(C.tide_tensor_copy(big:narrow(0, 0, s.cn), s.X:narrow(0, 0, s.cn))) end
    s.X = big
  end
  check(C.tide_tensor_copy(s.X:narrow(0, s.cn, n), X))
  s.cn = s.cn + n
end

M.keep_rows = keep_rows

-- The MTP catch-up entry of request r (rows first..first+n-1 of its waiting
-- streams; their next tokens are known: r.tokens). Position of row i: the MTP
-- sequence's length + i.
local function catchup_entry(eng, r, first, n, logits)
  local s = r.spec
  local base = eng.mtp:len(s.mseq) - first
  local toks = {}
  for i = first, first + n - 1 do toks[#toks + 1] = r.tokens[base + i + 2] end
  return { seq = s.mseq, hidden = s.X:narrow(0, first, n), tokens = toks, logits = logits }
end

-- Bring r's MTP sequence up to all but `keep` of its waiting rows, in steps
-- of at most max_tokens (no logits).
local function flush(eng, r, keep)
  local s = r.spec
  local mt = eng.model.max_tokens
  local done, full = 0, false
  while s.cn - done - keep > 0 do
    local n = math.min(mt, s.cn - done - keep)
    if not eng.mtp:step({ catchup_entry(eng, r, done, n, false) }) then full = true break end   -- MTP cache full
    done = done + n
  end
  if done > 0 then
    local rest = s.cn - done
    if rest > 0 then
      local tmp = tide.zeros({ rest, s.X:size(1), s.X:size(2) })
      check(C.tide_tensor_copy(tmp, s.X:narrow(0, done, rest)))
      check(C.tide_tensor_copy(s.X:narrow(0, 0, rest), tmp))
    end
    s.cn = rest
  end
  return not full
end

-- Drafting failed (an error in the MTP block): the request's MTP state
-- restarts empty at its current position (drafts are poorer until its
-- window refills; the output never depends on them).
local function restart(eng, r)
  local s = r.spec
  if s.mseq then eng.mtp:free(s.mseq) end
  s.mseq, s.cn, s.base = nil, 0, r.computed
end
M.restart = restart

-- A new MTP sequence for s, starting at s.base (the first position whose
-- streams are kept; earlier positions are empty and never attended), or nil.
function new_mseq(eng, s)
  local id = eng.mtp:sequence()
  if id and (s.base or 0) > 0 and C.tide_kvcache_seq_set_length(eng.mtp.cache, id, s.base) < 0 then
    eng.mtp:free(id)
    return nil
  end
  return id
end

-- A long wait without drafts (a prompt, or a policy drafting nothing) piles
-- up catch-up rows; bound them. With `known` (every kept row's next token is
-- in r.tokens) a compressed MTP layer catches up; without, it waits.
function M.trim(eng, r, known)
  local s = r.spec
  if s.cn < eng.model.max_tokens + eng.mtp_window then return end
  if eng.mtp.ratio == 1 then
    -- keep only the last window's streams and drop the MTP sequence. Its entries are per-position
    -- functions of these streams, and a draft attends only to the window before it, so restarting
    -- the MTP sequence there (positions before it empty) gives the same drafts, bit for bit.
    if s.mseq then eng.mtp:free(s.mseq) s.mseq = nil end
    local W = eng.mtp_window
    local tmp = tide.zeros({ W, s.X:size(1), s.X:size(2) })
    check(C.tide_tensor_copy(tmp, s.X:narrow(0, s.cn - W, W)))
    check(C.tide_tensor_copy(s.X:narrow(0, 0, W), tmp))
    s.base = r.computed - W
    s.cn = W
  elseif known then
    -- a compressed MTP layer needs every entry: catch up now
    s.mseq = s.mseq or new_mseq(eng, s)
    if s.mseq then flush(eng, r, 0) end
  end
end

-- Before the step: decide and make the drafts. entries: the engine's { r, n }
-- list (n may grow by the drafts). Sets e.drafts for drafting decode entries.
-- `fits(entries)` checks the cache. A draft policy that raises ends only its
-- request (ended: list of requests to finish with their message).
function M.plan(eng, entries, fits)
  local load, used = #entries, 0
  for _, e in ipairs(entries) do used = used + e.n end
  local room = eng.budget - used
  local want, ended = {}, {}
  for _, e in ipairs(entries) do
    local r = e.r
    local s = r.spec
    if s and r.seq then M.trim(eng, r, true) end
    -- (a request with probes never drafts: its probes would see rows that are rolled back)
    if s and e.n == 1 and #r.generated > 0 and r.computed + 1 == #r.tokens and not r.probes then
      local lim = math.min(s.max, r.max_tokens - #r.generated - 1, room, eng.model.max_tokens - 1)
      if eng.model.max_positions then lim = math.min(lim, eng.model.max_positions - #r.tokens - 1) end
      e.decode = true
      if lim > 0 then
        local ok, k = pcall(s.policy.draft, s.pstate,
          { max = lim, steps = s.steps, rate = s.pstate.rate, load = load, cost = eng.model._spec_cost_fn })
        if not ok then
          ended[#ended + 1] = { r, "draft policy: " .. tostring(k) }
        elseif not is_int(k) or k < 0 then
          ended[#ended + 1] = { r, "draft policy: draft() returned " .. tostring(k) .. ", not an integer >= 0" }
        elseif k > 0 then
          k = math.min(k, lim)
          want[#want + 1] = { e = e, k = k }
          room = room - k
        end
      end
    end
  end
  if #want == 0 then return ended end
  -- the drafts must fit the cache too; if not, nobody drafts this step
  for _, w in ipairs(want) do w.e.n = 1 + w.k end
  if not fits(entries) then
    for _, w in ipairs(want) do w.e.n = 1 end
    return ended
  end
  for _, w in ipairs(want) do w.e.n = 1 end
  local ok, err = pcall(M._draft, eng, want)
  if not ok then
    for _, w in ipairs(want) do
      if w.fork then eng.mtp:free(w.fork) w.fork = nil end
      w.e.drafts, w.e.n = nil, 1
      restart(eng, w.e.r)
    end
    eng.stats.draft_errors = (eng.stats.draft_errors or 0) + 1
    eng.last_draft_error = err
  end
  return ended
end

-- Draft j of a request from the MTP's logits row: its argmax, or with the
-- rejection rule a draw from q_j, the distribution the request's chain gives
-- for the row (with the committed history: drafts before j are not in it,
-- which only lowers acceptance), kept for the verify.
local function draft_of(s, row, j)
  local rj = s.rejection
  if not rj then return row:argmax() end
  local c = rj.qc[j]
  if not c then
    c = require("tide.sampling.core").candidates(row:numel())
    rj.qc[j] = c
  end
  rj.state:distribution(row, c)
  return c.id[c:draw(rj.state.rng)]
end

-- The rejection rule (Leviathan et al. 2023; Chen et al. 2023) for draft d
-- (the j-th, drawn from q = rj.qc[j]) on its verify row: p = the chain's
-- distribution of the row; d is kept with probability min(1, p(d)/q(d)),
-- else the token comes from max(0, p - q) normalised, drawn exactly by
-- drawing x ~ p and keeping it with probability max(0, 1 - q(x)/p(x)). The
-- generator is the request's. Returns a gen:step chooser.
local REJECT_DRAWS = 1000000   -- residual draws at most (then a draw from p; p ~= q makes this unreachable)
local function rejection_choose(rj, d, j)
  return function(state, row)
    local pc = rj.pc
    if not pc then
      pc = require("tide.sampling.core").candidates(row:numel())
      rj.pc = pc
    end
    state:distribution(row, pc)
    local q = rj.qc[j]
    local function prob(c, id)
      local pos = C.tide_cands_find(c, id)
      return pos >= 0 and c.p[pos] or 0
    end
    local rng = state.rng
    local pd = prob(pc, d)
    if rng:uniform() * prob(q, d) < pd then return state:chosen(row, pc, C.tide_cands_find(pc, d)) end
    rj.rejected = (rj.rejected or 0) + 1
    for _ = 1, REJECT_DRAWS do
      local pos = pc:draw(rng)
      local px = pc.p[pos]
      if rng:uniform() * px < px - prob(q, pc.id[pos]) then return state:chosen(row, pc, pos) end
    end
    return state:chosen(row, pc, pc:draw(rng))
  end
end

-- Make the drafts of `want` ({ e, k } per drafting request); sets e.drafts, e.n.
function M._draft(eng, want)
  local d = eng.mtp
  -- 1. catch-up: every drafting request's waiting streams; the last row drafts d1
  local batch, ready = {}, {}
  for _, w in ipairs(want) do
    local s = w.e.r.spec
    if not s.mseq then s.mseq = new_mseq(eng, s) end   -- nil: no free MTP slot, no drafts this step
    if s.mseq then ready[#ready + 1] = w end
  end
  if #ready == 0 then return end
  want = ready
  local share = math.max(1, math.floor(eng.model.max_tokens / #want))
  for _, w in ipairs(want) do
    local r = w.e.r
    -- long waits (a prompt) run ahead without logits
    if not flush(eng, r, math.min(r.spec.cn, share)) then return end
    batch[#batch + 1] = catchup_entry(eng, r, 0, r.spec.cn, "last")
  end
  local res = d:step(batch)
  if not res then return end   -- the MTP cache is full: no drafts this step
  for i, w in ipairs(want) do
    w.drafts = { draft_of(w.e.r.spec, res[i], 1) }
    w.h = d.out:narrow(0, d.first[i] + batch[i].hidden:size(0) - 1, 1):clone()
    w.e.r.spec.cn = 0
  end
  -- 2. further drafts on forks of the MTP sequences (dropped after)
  local deeper = {}
  for _, w in ipairs(want) do if w.k > 1 then deeper[#deeper + 1] = w end end
  if #deeper > 0 then
    for _, w in ipairs(deeper) do
      w.fork = d:fork(w.e.r.spec.mseq)
      if not w.fork then w.k = 1 end   -- no free MTP slot: one draft
    end
    local ok, err = pcall(function()
      for j = 2, eng.budget do
        local b, who = {}, {}
        for _, w in ipairs(deeper) do
          if w.k >= j and w.fork then
            b[#b + 1] = { seq = w.fork, hidden = w.h, tokens = { w.drafts[j - 1] }, logits = "last" }
            who[#who + 1] = w
          end
        end
        if #b == 0 then break end
        local rr = d:step(b)
        if not rr then break end   -- the MTP cache is full: the drafts so far
        for i, w in ipairs(who) do
          w.drafts[j] = draft_of(w.e.r.spec, rr[i], j)
          check(C.tide_tensor_copy(w.h, d.out:narrow(0, d.first[i], 1)))
        end
      end
    end)
    for _, w in ipairs(deeper) do
      if w.fork then d:free(w.fork) end
      w.fork = nil
    end
    if not ok then error(err, 0) end
  end
  for _, w in ipairs(want) do
    w.e.drafts = w.drafts
    w.e.n = 1 + #w.drafts
  end
end

-- What steps cost (a property of the model and the machine: kept on the
-- model, shared by its engines), measured on steps that run one decoding request alone, in
-- process CPU time (steadier than the wall clock on a shared machine): a
-- plain one-token step (t1) and a step drafting k tokens (MTP drafting and
-- the verify), as exponential averages. cost(k) = that step / t1, or from the
-- nearest measured k by a straight line through (0, 1); nil before t1.
local function ema(old, x) return old and (0.8 * old + 0.2 * x) or x end

function M.measure(eng, entries, t)
  if #entries ~= 1 or not entries[1].decode then return end
  local m = eng.model
  local c = m._spec_cost
  if not c then
    c = { k = {} }
    m._spec_cost = c
    m._spec_cost_fn = function(k)
      if not c.t1 then return nil end
      if c.k[k] then return c.k[k] / c.t1 end
      local near
      for j in pairs(c.k) do if not near or math.abs(j - k) < math.abs(near - k) then near = j end end
      if not near then return nil end
      return 1 + (c.k[near] / c.t1 - 1) * k / near
    end
  end
  local e = entries[1]
  if e.drafts then
    local k = #e.drafts
    c.k[k] = ema(c.k[k], t)
  else
    c.t1 = ema(c.t1, t)
  end
end

-- The model-step entry of a drafting request: pending + drafts, every row's logits.
function M.entry(e)
  local r = e.r
  local toks = { r.tokens[#r.tokens] }
  for j, t in ipairs(e.drafts) do toks[j + 1] = t end
  return { seq = r.seq, tokens = toks, n = #toks, logits = "all", probes = r.probes }
end

-- after_forward of the step: the main streams of every speculating request's
-- rows join its catch-up rows (drafting entries: all rows for now; the
-- rejected ones are dropped in commit).
-- (st.entries are the step's entries, each with .eng = the engine entry; a
-- step the model runs again without failed entries calls this again.)
function M.capture(st)
  for i, me in ipairs(st.entries) do
    local e = me.eng
    local s = e and e.r.spec
    if s then
      if e.cn0 then s.cn = e.cn0 else e.cn0 = s.cn end
      local sp = st.spans[i]
      keep_rows(s, st.v.X:narrow(0, sp.first, sp.n), sp.n)
    end
  end
end

-- After the step, for a drafting entry: the request's chain picks the
-- committed tokens from the verify rows in order (sample(r, row) -> the token
-- or nil when the request ended); the sequence rolls back to the accepted
-- prefix. Returns the number of tokens committed.
function M.commit(eng, e, rows, sample)
  local r = e.r
  local s = r.spec
  local k = #e.drafts
  local p0 = r.computed   -- the engine leaves it to this function
  local a, n = 0, 0
  local rj = s.rejection
  while true do
    -- (with the rejection rule, a draft's row picks by the rule; the bonus row by the chain)
    local tok = sample(eng, r, rows[a], rj and a < k and rejection_choose(rj, e.drafts[a + 1], a + 1) or nil)
    if tok == nil then break end
    n = n + 1
    if a < k and tok == e.drafts[a + 1] and r.status == "running" then a = a + 1 else break end
  end
  s.steps = s.steps + 1
  s.drafted = s.drafted + k
  s.accepted = s.accepted + a
  s.verify_tokens = s.verify_tokens + n
  eng.stats.drafted = eng.stats.drafted + k
  eng.stats.accepted = eng.stats.accepted + a
  eng.stats.spec_steps = eng.stats.spec_steps + 1
  if r.status == "running" then
    -- keep the streams of the accepted rows only (pending, d1..da)
    s.cn = e.cn0 + a + 1
    if a < k then
      local ok, err = r.seq:truncate(p0 + a + 1)
      if not ok then
        -- cannot roll back (should not happen): recompute from scratch, exact anyway
        eng.stats.spec_fallbacks = (eng.stats.spec_fallbacks or 0) + 1
        r.spec_fallback = err
        eng:_preempt(r)
        return n
      end
    end
    r.computed = p0 + a + 1
    r.swa_held, r.pages_held = r.seq:usage()
    local ok, err = pcall(s.policy.observe, s.pstate, k, a)
    if not ok then eng:_finish(r, "error", "draft policy: " .. tostring(err)) end
  end
  return n
end

-- The request's speculation figures (nil without drafting).
function M.report(r)
  local s = r.spec
  if not s then return nil end
  return { max = s.max, policy = s.policy.name, accept = s.accept ~= "chain" and s.accept or nil,
    steps = s.steps, drafted = s.drafted, accepted = s.accepted,
    acceptance = s.drafted > 0 and s.accepted / s.drafted or nil,
    tokens_per_step = s.steps > 0 and s.verify_tokens / s.steps or nil }
end

return M
