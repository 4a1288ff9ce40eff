-- tide.sampling: samplers as editable Lua. A sampler is a chain of stages
-- (one small module each in lua/tide/sampling/); a request samples through
-- its own state (RNG, token history, stage state such as mirostat's mu):
--
--   local sampling = tide.sampling
--   local s = sampling.chain{ sampling.penalties{last_n = 64, repeat_penalty = 1.1},
--                             sampling.top_k(40), sampling.min_p(0.05),
--                             sampling.temperature(0.8), sampling.dist() }
--   local st = s:new_state{ seed = 42, logprobs = 5 }
--   st:accept(prompt_ids)                 -- penalties see the prompt (llama.cpp does the same)
--   local tok, info = st:sample(logits)   -- logits: an f32 [V] tensor row
--   st:accept(tok)
--
-- sampling.load("sampler.lua") gives a sampler that re-reads the file when
-- it changes (checked before each token); sampling.from_options(opts) builds
-- one from llama.cpp-style options (sampling.options is the spec for
-- tide.cli.args). See docs/sampling.md.
local tffi = require("tide.ffi")
local core = require("tide.sampling.core")
local tensor = require("tide.tensor")
local ffi, C = tffi.ffi, tffi.C

local M = {}
M.core = core
M.rng = core.rng
M.history = core.history
M.candidates = core.candidates

-- Stage constructors, loaded on first use: sampling.top_p -> require("tide.sampling.top_p").
local STAGES = { "greedy", "dist", "temperature", "dynatemp", "top_k", "top_p", "min_p", "typical", "top_n_sigma",
  "xtc", "dry", "penalties", "logit_bias", "mirostat", "mirostat_v2" }
M.stage_names = STAGES
local is_stage_name = {}
for _, n in ipairs(STAGES) do is_stage_name[n] = true end
-- Stages made by these constructors are trusted to leave the candidates
-- consistent; any other stage is checked (tide_cands_touch) after it runs.
local builtin = setmetatable({}, { __mode = "k" })
-- Stages print as tide.stage(top_k(k = 40)); a stage table that already
-- has a metatable keeps it.
local Stage = { __tostring = function(st) return require("tide.describe").stage(st) end }
M.Stage = Stage
setmetatable(M, {
  __index = function(t, k)
    if is_stage_name[k] then
      local f = require("tide.sampling." .. k)
      local function make(...)
        local st = f(...)
        builtin[st] = true
        if type(st) == "table" and getmetatable(st) == nil then setmetatable(st, Stage) end
        return st
      end
      rawset(t, k, make)
      return make
    end
    return nil
  end,
})

-- ---- stages and chains ------------------------------------------------------------

local function describe_stage(st)
  local parts = {}
  for _, k in ipairs(st.params or {}) do
    local v = st[k]
    if v ~= nil then parts[#parts + 1] = k .. " = " .. tostring(v) end
  end
  return st.name .. (#parts > 0 and ("(" .. table.concat(parts, ", ") .. ")") or "")
end

-- A plain function(c, req) as a stage.
local function function_stage(fn)
  local info = debug.getinfo(fn, "S")
  local where = (info.short_src or "?") .. ":" .. (info.linedefined or 0)
  return { name = "lua@" .. where, params = {}, user = true, fn = fn,
    apply = function(self, c, req) return self.fn(c, req) end }
end

-- Check a stage table and mark it; `builtin` stages are trusted to leave
-- the candidates consistent, others are checked after they run.
local function as_stage(x, i, level)
  if type(x) == "function" then return function_stage(x) end
  if type(x) ~= "table" or type(x.apply) ~= "function" then
    error("stage " .. i .. " is not a stage (a table with apply(self, c, req, s), or a function(c, req)); got "
      .. type(x), level + 1)
  end
  if type(x.name) ~= "string" then x.name = "stage" .. i end
  if getmetatable(x) == nil then setmetatable(x, Stage) end
  return x
end

local Sampler = {}
Sampler.__index = Sampler
M.Sampler = Sampler

-- sampling.chain{stage, ...}: stages run in order; a chain whose last stage
-- does not choose a token gets sampling.dist() appended.
function M.chain(list, opts)
  if type(list) ~= "table" then error("chain{...}: expected a table of stages", 2) end
  if getmetatable(list) == Sampler then return list end
  local stages = {}
  for i, x in ipairs(list) do
    if getmetatable(x) == Sampler then
      for _, s in ipairs(x.stages) do stages[#stages + 1] = s end
    else
      stages[#stages + 1] = as_stage(x, i, 2)
    end
  end
  for i, st in ipairs(stages) do
    if st.final and i < #stages then
      error("stage " .. i .. " (" .. st.name .. ") chooses the token and must be the last of the chain", 2)
    end
  end
  if #stages == 0 or not stages[#stages].final then stages[#stages + 1] = M.dist() end
  for _, st in ipairs(stages) do st.user = not builtin[st] end
  return setmetatable({ stages = stages, version = 1, name = opts and opts.name }, Sampler)
end

function Sampler:describe()
  local parts = {}
  for _, st in ipairs(self.stages) do parts[#parts + 1] = describe_stage(st) end
  return table.concat(parts, " -> ")
end
Sampler.__tostring = function(self) return require("tide.describe").sampler(self) end

-- ---- per-request state --------------------------------------------------------------

local State = {}
State.__index = State
M.State = State

local function stage_key(stages, i)
  local name, k = stages[i].name, 0
  for j = 1, i do
    if stages[j].name == name then k = k + 1 end
  end
  return name .. "#" .. k
end

-- Per-stage states for the sampler's current chain, seeded from the log;
-- `carry` maps stage keys to values saved from the previous chain.
local function build_stage_states(self, carry)
  local S = self.sampler
  local ss = {}
  for i, st in ipairs(S.stages) do
    local s = st.init and st:init(self) or false
    ss[i] = s
    if carry and st.restore and s then
      local v = carry[stage_key(S.stages, i)]
      if v ~= nil then st:restore(s, v) end
    end
  end
  self.ss = ss
  self.version = S.version
  self.stages = S.stages
end

local function saved_values(self)
  local out = {}
  for i, st in ipairs(self.stages or {}) do
    if st.save and self.ss[i] then out[stage_key(self.stages, i)] = st:save(self.ss[i]) end
  end
  return out
end

-- The most entries a top-N list may ask for (logprobs, n_probs, trace_top):
-- more than any vocabulary in sight, and a bound on the buffers a state
-- allocates for them (8 bytes each).
M.MAX_TOP = 1048576
function M.is_top_count(v)
  return type(v) == "number" and v >= 0 and v <= M.MAX_TOP and v == math.floor(v)
end

-- sampler:new_state{seed = n (-1 or nil: random), logprobs = N, trace = bool,
--                   trace_top = N, tokenizer = tok}
-- trace_top = N (with trace) also records the N most likely candidates of
-- the raw row and after every stage (what the sampler lab draws).
function Sampler:new_state(opts)
  opts = opts or {}
  local seed = opts.seed
  if seed == nil or seed == -1 then seed = core.random_seed() end
  if type(seed) ~= "number" and not ffi.istype("uint64_t", seed) then
    error("new_state: seed must be a number, got " .. type(seed), 2)
  end
  if opts.logprobs ~= nil and not M.is_top_count(opts.logprobs) then
    error("new_state: logprobs must be an integer in 0.." .. M.MAX_TOP .. ", got " .. tostring(opts.logprobs), 2)
  end
  if opts.trace_top ~= nil and not M.is_top_count(opts.trace_top) then
    error("new_state: trace_top must be an integer in 0.." .. M.MAX_TOP .. ", got " .. tostring(opts.trace_top), 2)
  end
  local st = setmetatable({
    sampler = self,
    seed = seed,
    rng = core.rng(seed),
    rng_saved = core.RngT(),
    log = core.history(-1, false),
    tokenizer = opts.tokenizer,
    logprobs = opts.logprobs,
    trace_on = opts.trace and true or false,
    trace_top = opts.trace_top and opts.trace_top > 0 and math.floor(opts.trace_top) or nil,
    traces = {},
    n_sampled = 0,
  }, State)
  build_stage_states(st, nil)
  if st.logprobs and st.logprobs > 0 then
    st.lp_ids = ffi.new("int32_t[?]", st.logprobs)
    st.lp_vals = ffi.new("float[?]", st.logprobs)
  end
  if st.trace_top then
    st.tt_ids = ffi.new("int32_t[?]", st.trace_top)
    st.tt_vals = ffi.new("float[?]", st.trace_top)
  end
  return st
end

function State:__tostring()
  return string.format("tide.sampling_state(seed %.0f, %d tokens, %d sampled; %s)", tonumber(self.seed) or 0,
    self.log:len(), self.n_sampled, self.sampler:describe())
end

-- Feed tokens to the request's history (and to stages that watch it:
-- penalties). A number, a table of ids or an integer tensor.
function State:accept(tokens)
  local a, n, keep = core.ids_array(tokens, 2)
  tffi.check(C.tide_hist_push(self.log.h, a, n), 2)
  for i, st in ipairs(self.stages) do
    if st.accept then
      local s = self.ss[i]
      for j = 0, n - 1 do st:accept(s, a[j], self) end
    end
  end
  local _ = keep
  return self
end
-- Same as accept: the name says the tokens are the prompt.
State.accept_prompt = State.accept

-- The request's tokens so far (prompt included when accepted), oldest first.
function State:tokens() return self.log:tokens() end

local trace_rec = core.trace_rec()
local function trace_row(name, r)
  return { stage = name, n_in = tonumber(r.n_in), n_out = tonumber(r.n_out), mass_in = r.mass_in,
    mass_raw = r.mass_raw, entropy = r.entropy }
end

-- The self.trace_top best candidates of the current set: {{id =, p =}, ...}
-- (tide_cands_topn neither reorders nor drops candidates).
local function top_now(self, c)
  local k = tffi.check(C.tide_cands_topn(c, self.trace_top, self.tt_ids, self.tt_vals))
  local out = {}
  for j = 0, k - 1 do out[j + 1] = { id = self.tt_ids[j], p = math.exp(self.tt_vals[j]) } end
  return out
end

local function run_chain(self, c, tr)
  local stages, ss = self.stages, self.ss
  for i = 1, #stages do
    local st = stages[i]
    self.current_stage = i
    if tr then tffi.check(C.tide_cands_trace_begin(c)) end
    st:apply(c, self, ss[i])
    if st.user then tffi.check(C.tide_cands_touch(c)) end
    if tr then
      tffi.check(C.tide_cands_trace_end(c, trace_rec))
      local row = trace_row(st.name, trace_rec)
      row.index = i
      if self.trace_top then row.top = top_now(self, c) end
      tr.stages[#tr.stages + 1] = row
    end
    if c.selected >= 0 then break end
  end
  self.current_stage = nil
  if c.selected < 0 then error("no stage chose a token (the last stage must call c:draw, c:argmax or c:select)", 0) end
end

local function top_list(ids, vals, k)
  local out = {}
  for j = 0, k - 1 do out[j + 1] = { id = ids[j], logprob = vals[j] } end
  return out
end

-- token, info = state:sample(row): row is an f32 [V] (or [1, V]) tensor of
-- logits; nothing is copied into Lua. On failure (a stage raised, the row
-- holds NaN or +inf) returns nil, message and the state is as before the
-- call (the generator is rewound). info.p is the probability of the token
-- in the distribution it was drawn from; with logprobs = N:
--   info.raw_logprob, info.raw_top       the model's distribution (softmax of
--                                        the row, before any stage)
--   info.sampled_logprob, info.sampled_top  the distribution after the whole
--                                        chain, the one the token came from
-- (top lists: N entries {id =, logprob =}, most likely first).
-- what state:sample and state:chosen report for the token at position pos
-- of the candidate set c: its probability, and the logprobs when asked for
local function pick_info(self, row, c, pos, token)
  local info = { n_candidates = c.n }
  if c.has_p == 1 then info.p = c.p[pos] end
  local n = self.logprobs
  if n then
    tffi.check(C.tide_cands_softmax(c))
    info.p = c.p[pos]
    info.sampled_logprob = c.logit[pos] - c.lse
    local k = n > 0 and C.tide_cands_topn(c, n, self.lp_ids, self.lp_vals) or 0
    info.sampled_top = top_list(self.lp_ids, self.lp_vals, k)
    local raw = core.row_logprobs(row, token, n)
    info.raw_logprob, info.raw_rank, info.raw_top = raw.logprob, raw.rank, raw.top
  end
  return info
end

function State:sample(row)
  if not tensor.is_tensor(row) then error("sample(row): row must be a tide tensor of f32 logits", 2) end
  local S = self.sampler
  if S.source then S:check_reload() end
  if self.version ~= S.version then
    local carry = saved_values(self)
    build_stage_states(self, carry)
  end
  local nv = row.ndim > 0 and tonumber(row.sizes[row.ndim - 1]) or 1
  local c = core.acquire(nv)
  ffi.copy(self.rng_saved, self.rng, 32)
  local rc = C.tide_cands_load(c, row, self.trace_on and 1 or 0)
  if rc < 0 then
    core.release(c)
    return nil, "sampling: " .. tffi.last_error()
  end
  local tr
  if self.trace_on then
    local h = ffi.new("double[1]")
    tffi.check(C.tide_cands_entropy(c, h))
    tr = { step = self.n_sampled, n = nv, entropy = h[0], stages = {} }
    if self.trace_top then tr.raw_top = top_now(self, c) end
  end
  local ok, err = pcall(run_chain, self, c, tr)
  if not ok then
    local i = self.current_stage
    self.current_stage = nil
    ffi.copy(self.rng, self.rng_saved, 32)
    core.release(c)
    local where = i and string.format("stage %d (%s)", i, self.stages[i].name) or "chain"
    return nil, "sampling: " .. where .. " failed: " .. tostring(err)
  end
  local pos = c.selected
  local token = c.id[pos]
  local info = pick_info(self, row, c, pos, token)
  if tr then
    tr.token = token
    tr.p = info.p or (C.tide_cands_softmax(c) == 0 and c.p[pos]) or nil
    self.traces[#self.traces + 1] = tr
  end
  core.release(c)
  self.n_sampled = self.n_sampled + 1
  return token, info
end

-- The stages whose distribution state:distribution can give: each is a
-- function of the row and the history alone (no generator, no value that
-- changes with the token drawn), and the chain ends with dist or greedy.
M.DISTRIBUTION_STAGES = { temperature = true, top_k = true, top_p = true, min_p = true, typical = true,
  top_n_sigma = true, logit_bias = true, penalties = true, dry = true, dynatemp = true, dist = true, greedy = true }

-- nil when state:distribution works for this chain, else why not (the stage).
function Sampler:distribution_problem()
  for i, st in ipairs(self.stages) do
    if st.user or not M.DISTRIBUTION_STAGES[st.name] then
      return string.format("stage %d (%s) %s", i, tostring(st.name), st.user and "is a Lua function"
        or "draws from the generator or keeps a value that follows the drawn token")
    end
  end
end

-- kind = state:distribution(row, c): the distribution this state's chain
-- would draw the next token from, into the candidate set c (core.candidates),
-- without drawing, touching the generator or changing any state. kind is
-- "dist" (c holds the candidates left with their probabilities c.p) or
-- "greedy" (c.selected is the token's position: a point mass). Raises for a
-- chain sampler:distribution_problem() refuses.
function State:distribution(row, c)
  local S = self.sampler
  if self.version ~= S.version then build_stage_states(self, saved_values(self)) end
  local why = S:distribution_problem()
  if why then error("distribution: " .. why, 2) end
  tffi.check(C.tide_cands_load(c, row, 0), 2)
  local stages, ss = self.stages, self.ss
  for i = 1, #stages do
    local st = stages[i]
    if st.final then
      if st.name == "greedy" then
        c:argmax()
        return "greedy"
      end
      break
    end
    st:apply(c, self, ss[i])
  end
  c.selected = -1
  c:softmax()
  return "dist"
end

-- token, info = state:chosen(row, c, pos): commit to position pos of the
-- distribution c that state:distribution(row, c) made (a token chosen by a
-- rule outside the chain, e.g. speculative rejection sampling): the same
-- info as state:sample gives (info.p, logprobs), counted as sampled. The
-- history is not touched (the caller accepts the token, as after sample).
function State:chosen(row, c, pos)
  local token = c.id[pos]
  local info = pick_info(self, row, c, pos, token)
  self.n_sampled = self.n_sampled + 1
  return token, info
end

-- The trace records so far (trace = true): one per sampled token,
-- { step, token, p, n, entropy, stages = {{stage, index, n_in, n_out,
-- mass_in, mass_raw, entropy}, ...} }; with trace_top = N also raw_top and
-- each stage's top: the N best candidates {{id =, p =}, ...}.
function State:trace() return self.traces end
function State:clear_trace() self.traces = {} return self end

-- The generator's four state words as 64 hex digits, and back.
function State:rng_state() return self.rng:state() end
function State:set_rng_state(hex)
  self.rng:set_state(hex)
  return self
end

-- Everything needed to continue this request exactly: generator, token
-- history and stage values (mirostat's mu). A plain table (serialisable).
function State:snapshot()
  return { rng = self.rng:state(), tokens = self.log:tokens(), stages = saved_values(self), seed = self.seed,
    n_sampled = self.n_sampled, chain = self.sampler:describe() }
end
function State:restore(snap)
  if type(snap) ~= "table" or type(snap.rng) ~= "string" then error("restore(snapshot): bad snapshot", 2) end
  self.rng:set_state(snap.rng)
  self.log:clear()
  if snap.tokens and #snap.tokens > 0 then self.log:push(snap.tokens) end
  self.n_sampled = snap.n_sampled or 0
  build_stage_states(self, snap.stages)
  return self
end
-- Back to the start: the seed's generator, no history.
function State:reset()
  self.rng:seed(self.seed)
  self.log:clear()
  self.n_sampled = 0
  self.traces = {}
  build_stage_states(self, nil)
  return self
end

function State:close()
  self.log:close()
  for i = 1, #self.stages do
    local s = self.ss[i]
    if type(s) == "table" and s.hist then s.hist:close() end
  end
end

-- ---- sampler files and hot reload --------------------------------------------------------

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

-- Run a sampler file: a Lua chunk that returns a chain (or a list of
-- stages). It sees `sampling` and `tide` as globals.
local function compile(path)
  local src, err = read_file(path)
  if not src then return nil, "sampler file " .. tostring(err) end
  local chunk, cerr = loadstring(src, "@" .. path)
  if not chunk then return nil, "sampler file " .. cerr end
  local env = setmetatable({ sampling = M, tide = package.loaded["tide"] or require("tide") }, { __index = _G })
  setfenv(chunk, env)
  local ok, res = pcall(chunk)
  if not ok then return nil, "sampler file " .. path .. ": " .. tostring(res) end
  if type(res) ~= "table" then
    return nil, "sampler file " .. path .. " must return sampling.chain{...}, got " .. type(res)
  end
  local ok2, s = pcall(M.chain, res)
  if not ok2 then return nil, "sampler file " .. path .. ": " .. tostring(s) end
  return s, core.hash(src)
end

-- sampling.load(path [, {interval = seconds, on_error = fn(msg)}]): a sampler
-- from a file, re-read when its mtime or size changes (checked at most once
-- per `interval` seconds, default every token, a stat costs ~1 us). A file
-- that fails to load keeps the previous chain; the error goes to on_error
-- (default: stderr) once per change of the file. Returns nil, err when the
-- first load fails.
function M.load(path, opts)
  if type(path) ~= "string" then error("load(path): path must be a string", 2) end
  opts = opts or {}
  local mt, size = core.file_stamp(path)
  if not mt then
    local fh, ferr = io.open(path, "rb")
    if fh then fh:close() end
    return nil, "sampler file " .. tostring(ferr or size)
  end
  local s, hash = compile(path)
  if not s then return nil, hash end
  s.source = path
  s.hash = hash
  s.reload = { mtime = mt, size = size, interval = opts.interval or 0, last = -math.huge,
    on_error = opts.on_error or function(msg) io.stderr:write("tide: ", msg, " (keeping the previous sampler)\n") end }
  return s
end

-- Re-read the file if it changed. Returns true when the chain changed;
-- false (and the error) when it did not or the new file failed.
function Sampler:check_reload()
  local r = self.reload
  if not r then return false end
  if r.interval > 0 then
    local now = C.tide_time()
    if now - r.last < r.interval then return false end
    r.last = now
  end
  local mt, size = core.file_stamp(self.source)
  if not mt then
    if not r.missing then
      r.missing = true
      self.reload_error = "sampler file " .. tostring(size)
      r.on_error(self.reload_error)
    end
    return false, self.reload_error
  end
  r.missing = false
  if mt == r.mtime and size == r.size then return false end
  r.mtime, r.size = mt, size
  local s, hash = compile(self.source)
  if not s then
    self.reload_error = hash
    r.on_error(hash)
    return false, hash
  end
  self.stages = s.stages
  self.hash = hash
  self.version = self.version + 1
  self.reload_error = nil
  return true
end

-- ---- options (llama.cpp's names and defaults) --------------------------------------------

M.DEFAULT_ORDER = "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"

M.options = {
  temp = { type = "number", default = 0.8, help = "temperature (0 = greedy)" },
  top_k = { type = "number", default = 40, help = "top-k (0 = off)" },
  top_p = { type = "number", default = 0.95, help = "top-p / nucleus (1 = off)" },
  min_p = { type = "number", default = 0.05, help = "min-p (0 = off)" },
  typical_p = { type = "number", default = 1.0, help = "locally typical sampling (1 = off)" },
  top_nsigma = { type = "number", default = -1, help = "top-n-sigma (<= 0 = off)" },
  xtc_probability = { type = "number", default = 0.0, help = "XTC probability (0 = off)" },
  xtc_threshold = { type = "number", default = 0.1, help = "XTC threshold (> 0.5 = off)" },
  xtc_p = { type = "number", meta = "P", help = "same as --xtc-probability" },
  xtc_t = { type = "number", meta = "T", help = "same as --xtc-threshold" },
  dry_multiplier = { type = "number", default = 0.0, help = "DRY multiplier (0 = off)" },
  dry_base = { type = "number", default = 1.75, help = "DRY base" },
  dry_allowed_length = { type = "number", default = 2, help = "DRY: repeats up to this long are free" },
  dry_penalty_last_n = { type = "number", default = -1, help = "DRY window (-1 = whole history, 0 = off)" },
  dry_sequence_breaker = { type = "list", meta = "S",
    help = "DRY sequence breaker (repeatable; 'none' clears; default \\n : \" *)" },
  repeat_penalty = { type = "number", default = 1.0, help = "repetition penalty (1 = off)" },
  repeat_last_n = { type = "number", default = 64, help = "penalty window (-1 = whole history, 0 = off)" },
  frequency_penalty = { type = "number", default = 0.0, help = "frequency penalty" },
  presence_penalty = { type = "number", default = 0.0, help = "presence penalty" },
  mirostat = { type = "number", default = 0, help = "mirostat version (0 = off, 1, 2)" },
  mirostat_lr = { type = "number", default = 0.1, help = "mirostat learning rate (eta)" },
  mirostat_ent = { type = "number", default = 5.0, help = "mirostat target surprise (tau)" },
  dynatemp_range = { type = "number", default = 0.0, help = "dynamic temperature range (0 = off)" },
  dynatemp_exp = { type = "number", default = 1.0, help = "dynamic temperature exponent" },
  min_keep = { type = "number", default = 0, help = "candidates the truncating stages always keep" },
  samplers = { type = "string", meta = "LIST",
    help = "stage order, ';'-separated (default " .. M.DEFAULT_ORDER .. ")" },
  logit_bias = { type = "list", meta = "ID(+|-)BIAS", help = "logit bias, e.g. 15043+1 or 13-inf (repeatable)" },
  seed = { type = "number", default = -1, help = "random seed (-1 = random)" },
  sampler = { type = "string", meta = "FILE", help = "sampler file (a Lua chain, reloaded when it changes)" },
  trace = { type = "boolean", help = "record per-stage candidates, mass and entropy for each token" },
  n_probs = { type = "number", default = 0, help = "top-N logprobs per token (raw and after the chain)" },
}

local ALIASES = {
  penalties = "penalties", e = "penalties", dry = "dry", d = "dry", top_n_sigma = "top_n_sigma",
  s = "top_n_sigma", top_k = "top_k", k = "top_k", typ_p = "typ_p", typical_p = "typ_p", typical = "typ_p",
  y = "typ_p", top_p = "top_p", nucleus = "top_p", p = "top_p", min_p = "min_p", m = "min_p", xtc = "xtc",
  x = "xtc", temperature = "temperature", temp = "temperature", t = "temperature",
}

local function parse_bias(list)
  local map = {}
  for _, e in ipairs(list or {}) do
    local id, sign, val = tostring(e):match("^%s*(%d+)%s*([%+%-])%s*(.-)%s*$")
    local v = val and (val == "inf" and math.huge or tonumber(val))
    if not id or not v then error("--logit-bias: expected TOKEN+BIAS or TOKEN-BIAS, got '" .. tostring(e) .. "'", 0) end
    map[tonumber(id)] = (map[tonumber(id)] or 0) + (sign == "-" and -v or v)
  end
  return map
end

local function opt(o, k)
  local v = o[k]
  if v == nil then v = M.options[k].default end
  return v
end

-- A sampler from options parsed with M.options (defaults fill what is
-- missing). ctx.tokenizer resolves DRY breakers. With --sampler FILE the
-- file decides and the stage options are ignored. --temp 0 is greedy
-- (after logit bias, penalties and DRY). Stages that would do nothing are
-- left out. Returns the sampler, or nil, err.
function M.from_options(o, ctx)
  o, ctx = o or {}, ctx or {}
  if o.sampler then return M.load(o.sampler, ctx.load) end
  local ok, res = pcall(function()
    local st = {}
    if o.logit_bias and #o.logit_bias > 0 then st[#st + 1] = M.logit_bias(parse_bias(o.logit_bias)) end
    local mk = opt(o, "min_keep")
    local temp = opt(o, "temp")
    local miro = opt(o, "mirostat")
    local function add(name)
      if name == "penalties" then
        local rp, fp, pp, n = opt(o, "repeat_penalty"), opt(o, "frequency_penalty"), opt(o, "presence_penalty"),
          opt(o, "repeat_last_n")
        if n ~= 0 and (rp ~= 1 or fp ~= 0 or pp ~= 0) then
          st[#st + 1] = M.penalties{ last_n = n, repeat_penalty = rp, frequency = fp, presence = pp }
        end
      elseif name == "dry" then
        local mult = opt(o, "dry_multiplier")
        if mult ~= 0 and opt(o, "dry_penalty_last_n") ~= 0 then
          local br = o.dry_sequence_breaker
          if br and #br == 1 and br[1] == "none" then br = {} end
          st[#st + 1] = M.dry{ multiplier = mult, base = opt(o, "dry_base"),
            allowed_length = opt(o, "dry_allowed_length"), penalty_last_n = opt(o, "dry_penalty_last_n"),
            breakers = br, tokenizer = ctx.tokenizer }
        end
      elseif name == "top_n_sigma" then
        if opt(o, "top_nsigma") > 0 then st[#st + 1] = M.top_n_sigma(opt(o, "top_nsigma")) end
      elseif name == "top_k" then
        if opt(o, "top_k") > 0 then st[#st + 1] = M.top_k(opt(o, "top_k")) end
      elseif name == "typ_p" then
        if opt(o, "typical_p") < 1 then st[#st + 1] = M.typical(opt(o, "typical_p"), mk) end
      elseif name == "top_p" then
        if opt(o, "top_p") < 1 then st[#st + 1] = M.top_p(opt(o, "top_p"), mk) end
      elseif name == "min_p" then
        if opt(o, "min_p") > 0 then st[#st + 1] = M.min_p(opt(o, "min_p"), mk) end
      elseif name == "xtc" then
        local xp = o.xtc_p or opt(o, "xtc_probability")
        local xt = o.xtc_t or opt(o, "xtc_threshold")
        if xp > 0 and xt <= 0.5 then st[#st + 1] = M.xtc(xp, xt, mk) end
      elseif name == "temperature" then
        if opt(o, "dynatemp_range") > 0 then
          st[#st + 1] = M.dynatemp{ temp = temp, range = opt(o, "dynatemp_range"), exponent = opt(o, "dynatemp_exp") }
        elseif temp ~= 1 then
          st[#st + 1] = M.temperature(temp)
        end
      end
    end
    if miro == 1 or miro == 2 then
      if temp ~= 1 then st[#st + 1] = M.temperature(temp) end
      st[#st + 1] = miro == 1 and M.mirostat{ tau = opt(o, "mirostat_ent"), eta = opt(o, "mirostat_lr") }
        or M.mirostat_v2{ tau = opt(o, "mirostat_ent"), eta = opt(o, "mirostat_lr") }
    elseif miro ~= 0 then
      error("--mirostat must be 0, 1 or 2, got " .. tostring(miro), 0)
    elseif temp <= 0 then
      add("penalties")
      add("dry")
      st[#st + 1] = M.greedy()
    else
      local order = o.samplers or M.DEFAULT_ORDER
      for name in order:gmatch("[^;,%s]+") do
        local n = ALIASES[name]
        if not n then error("--samplers: unknown stage '" .. name .. "'", 0) end
        add(n)
      end
      st[#st + 1] = M.dist()
    end
    return M.chain(st)
  end)
  if not ok then return nil, tostring(res) end
  return res
end

-- The new_state options that come from the same parsed options.
function M.state_options(o)
  o = o or {}
  local n = opt(o, "n_probs")
  if not M.is_top_count(n) then
    error("--n-probs: expected an integer in 0.." .. M.MAX_TOP .. ", got " .. tostring(n), 0)
  end
  return { seed = opt(o, "seed"), trace = o.trace or false, logprobs = n > 0 and n or nil }
end

-- ---- traces ------------------------------------------------------------------------------

-- A small table for a list of trace records (state:trace()), or one record.
function M.format_trace(t, tok)
  if type(t) ~= "table" then error("format_trace: expected state:trace() or one of its records", 2) end
  if t.stages then t = { t } end
  local lines = {}
  for _, r in ipairs(t) do
    local label = tok and tok.id_to_bytes and tok:id_to_bytes(r.token)
    lines[#lines + 1] = string.format("step %d: token %s%s, p %.4f", r.step or 0, tostring(r.token),
      label and string.format(" %q", label) or "", r.p or 0 / 0)
    lines[#lines + 1] = string.format("  %-22s %8s %8s %9s %9s %8s", "stage", "in", "kept", "mass(in)", "mass(raw)",
      "entropy")
    lines[#lines + 1] = string.format("  %-22s %8s %8d %9s %9s %8.3f", "(raw logits)", "", r.n or 0, "", "",
      r.entropy or 0 / 0)
    for _, s in ipairs(r.stages) do
      lines[#lines + 1] = string.format("  %-22s %8d %8d %9.4f %9.4f %8.3f", s.stage:sub(1, 22), s.n_in, s.n_out,
        s.mass_in, s.mass_raw, s.entropy)
    end
  end
  return table.concat(lines, "\n")
end

-- ---- logprobs for scoring ---------------------------------------------------------------

-- The logprob (and rank, 0 = most likely) of `target` in the distribution
-- of a raw logits row, with the n_top best tokens: what model:score needs
-- per position. Returns { logprob =, rank =, top = {{id =, logprob =}, ...}, lse = }.
function M.logprob(row, target, n_top)
  if not tensor.is_tensor(row) then error("logprob(row, target): row must be a tide tensor", 2) end
  return core.row_logprobs(row, target, n_top)
end

-- Per-row logprobs of targets[i] under logits[i] (an f32 [T, V] tensor, or a
-- list of [V] rows): { {token =, logprob =, rank =, top =}, ... } and the sum.
function M.score_rows(logits, targets, n_top)
  local list = {}
  local total = 0
  local T = tensor.is_tensor(logits) and logits:size(0) or #logits
  if #targets ~= T then error("score_rows: " .. T .. " rows but " .. #targets .. " targets", 2) end
  for i = 1, T do
    local row = tensor.is_tensor(logits) and logits:select(0, i - 1) or logits[i]
    local r = core.row_logprobs(row, targets[i], n_top)
    list[i] = { token = targets[i], logprob = r.logprob, rank = r.rank, top = r.top }
    total = total + r.logprob
  end
  return list, total
end

return M
