-- tide.session: one conversation timeline over a model. A session owns a
-- sequence in the model's cache (window KV, compressed KV, compressor state),
-- its token history, its sampler state (RNG included) and a few snapshots of
-- its own past, so it can undo, regenerate, fork and be saved.
--
--   local s = model:session{ system = "Be brief.", seed = 1, sampler = { temp = 0.7 } }
--   s:say("Hello!")          -- appends a user turn, streams the reply, returns its text
--   s:undo()                 -- drop the last exchange
--   s:regen()                -- resample the last reply
--   local b = s:fork()       -- an independent branch sharing the cache prefix
--   s:peek(5)                -- the 5 most likely next tokens, nothing committed
--   s:append("raw text"); s:generate{ max_tokens = 20 }
--   s:save("chat.tsess"); tide.session_load(model, "chat.tsess")
--
-- Exactness: the session's cache always holds exactly its token history.
-- Going back (undo, regen, a template that rewrites history) restores the
-- nearest snapshot at or before the common prefix and re-prefills from there;
-- the model is batch and chunk invariant, so the result is bitwise what a
-- fresh session fed the same tokens would hold.
local tide = require("tide")
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}
local Session = {}
Session.__index = Session
M.Session = Session

local MAX_SNAPSHOTS = 4

local function copy_list(t)
  local o = {}
  for i, v in ipairs(t) do o[i] = v end
  return o
end

-- ---------------------------------------------------------------- construction
-- opts: system (text), sampler (chain, file, or options table), seed,
-- max_tokens (per reply, default 512), thinking (v3.1 templates), style,
-- snapshots (how many to keep, default 4), stream (function(text) called as
-- reply text arrives; default io.write when opts.print ~= false), print.
function M.new(model, opts)
  opts = opts or {}
  local seq, err = model:sequence()
  if not seq then return nil, err end
  local sampling = require("tide.sampling")
  local sampler = opts.sampler
  if sampler == nil or (type(sampler) == "table" and not sampler.new_state) then
    sampler = sampling.from_options(sampler or {})
  elseif type(sampler) == "string" then
    sampler = sampling.load(sampler)
  end
  local s = setmetatable({
    model = model, seq = seq, toks = {}, sampler = sampler, seed = opts.seed,
    system = opts.system, thinking = opts.thinking, style = opts.style,
    max_tokens = opts.max_tokens or 512, max_snapshots = opts.snapshots or MAX_SNAPSHOTS,
    snapshots = {},       -- { pos = n, seq = Sequence } sorted by pos
    turns = {},           -- { start = token index before the user turn, reply = index where the reply starts }
    messages = {},        -- the conversation as chat messages
    last_logits = nil,    -- copy of the logits of the last token (for peek and the next draw)
    stats = { prefill_tokens = 0, decode_tokens = 0, t_prefill = 0, t_decode = 0 },
    print = opts.print ~= false, stream = opts.stream,
  }, Session)
  s.state = sampler:new_state({ seed = opts.seed })
  if opts.system then s.messages[1] = { role = "system", content = opts.system } end
  return s
end

-- ---------------------------------------------------------------- the token timeline
local function lcp(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do if a[i] ~= b[i] then return i - 1 end end
  return n
end

function Session:_snapshot()
  local n = #self.toks
  local last = self.snapshots[#self.snapshots]
  if last and last.pos == n then return end
  local f = self.seq:fork()
  if not f then return end   -- no slot: snapshots are only an optimisation
  self.snapshots[#self.snapshots + 1] = { pos = n, seq = f, logits = self.last_logits }
  while #self.snapshots > self.max_snapshots do
    table.remove(self.snapshots, 1).seq:free()
  end
end

-- Feed tokens to the cache (in steps of the model's max_tokens); keeps the
-- last token's logits.
function Session:_feed(toks, first)
  first = first or 1
  local n = #toks - first + 1
  if n <= 0 then return end
  local part = {}
  for i = first, #toks do part[#part + 1] = toks[i] end
  local t0 = tide.time()
  local last, err = self.model:prefill(self.seq, part)
  if not last then error("session: " .. tostring(err), 0) end
  self.last_logits = last:clone()
  for _, v in ipairs(part) do self.toks[#self.toks + 1] = v end
  self.stats.prefill_tokens = self.stats.prefill_tokens + n
  self.stats.t_prefill = self.stats.t_prefill + (tide.time() - t0)
end

-- Make the cache hold exactly `target` (a token list): keep the common
-- prefix, go back to the nearest snapshot at or before it when needed, and
-- feed the rest.
function Session:_sync(target)
  local keep = lcp(self.toks, target)
  if keep < #self.toks then
    -- rewind: the nearest snapshot at or before `keep`
    local snap
    for i = #self.snapshots, 1, -1 do
      if self.snapshots[i].pos <= keep then snap = self.snapshots[i] break end
    end
    if snap then
      self.seq:assign(snap.seq)
      self.last_logits = snap.logits
      local toks = {}
      for i = 1, snap.pos do toks[i] = self.toks[i] end
      self.toks = toks
    else
      self.seq:free()
      local s, err = self.model:sequence()
      if not s then error("session: " .. tostring(err), 0) end
      self.seq = s
      self.toks = {}
      self.last_logits = nil
    end
    -- snapshots past the rewind point describe a timeline that is gone
    for i = #self.snapshots, 1, -1 do
      if self.snapshots[i].pos > #self.toks then table.remove(self.snapshots, i).seq:free() end
    end
  end
  self:_feed(target, #self.toks + 1)
end

-- ---------------------------------------------------------------- raw text and generation
-- Append text (encoded without special tokens) or a list of ids.
function Session:append(x)
  local toks
  if type(x) == "string" then
    local tok = self.model.tokenizer
    if not tok then error("append(text): the model has no tokenizer; give ids", 2) end
    toks = tok:encode(x, { add_special_tokens = #self.toks == 0 })
  elseif type(x) == "table" then
    toks = x
  else
    error("append(text | ids)", 2)
  end
  local target = copy_list(self.toks)
  for _, v in ipairs(toks) do target[#target + 1] = v end
  self:_sync(target)
  return #toks
end

local function emit(self, text)
  if text == "" then return end
  if self.stream then self.stream(text)
  elseif self.print then io.write(text); io.flush() end
end

-- Sample up to max_tokens tokens after the current history and feed them.
-- opts: max_tokens, stop (strings, and ids as stop tokens), ignore_eos,
-- on_token(id, text) (return false to stop), logprobs = N.
-- Returns the generated ids, their text and the finish reason.
function Session:generate(opts)
  opts = opts or {}
  if not self.last_logits then error("generate: nothing to continue (append a prompt first)", 2) end
  local model = self.model
  local tok = model.tokenizer
  local stop_str, stop_ids = {}, {}
  local eos = model.config.eos_token_id
  if type(eos) == "number" and eos >= 0 then stop_ids[1] = eos end
  for _, x in ipairs(opts.stop or {}) do
    if type(x) == "number" then stop_ids[#stop_ids + 1] = x else stop_str[#stop_str + 1] = x end
  end
  local gen = require("tide.generation").new{
    state = self.state, max_tokens = opts.max_tokens or self.max_tokens, stop = stop_str, stop_tokens = stop_ids,
    ignore_eos = opts.ignore_eos, tokenizer = tok,
    detokenize = (not tok) and function(id) return id .. " " end or nil,
  }
  self.gen = gen
  self.interrupted = false
  local t0 = tide.time()
  local out = {}
  while true do
    local id, text, reason = gen:step(self.last_logits)
    if id == nil then
      if reason == "error" then error("sampler: " .. tostring(gen.error), 0) end
      emit(self, text or "")
      break
    end
    out[#out + 1] = id
    emit(self, text)
    -- feed the token so the cache holds the whole history (and the next
    -- token's logits are ready)
    local res, err = model:step({ { seq = self.seq, tokens = { id }, logits = "last" } })
    if not res then error("session: " .. tostring(err), 0) end
    self.toks[#self.toks + 1] = id
    self.last_logits = res[1]:clone()
    self.stats.decode_tokens = self.stats.decode_tokens + 1
    if reason then break end
    if opts.on_token and opts.on_token(id, text) == false then emit(self, gen:stop("stopped")) break end
    if self.interrupted then emit(self, gen:stop("interrupted")) break end
  end
  self.stats.t_decode = self.stats.t_decode + (tide.time() - t0)
  return out, gen:text(), gen.finish_reason
end

-- ---------------------------------------------------------------- chat turns
function Session:_style()
  local tok = self.model.tokenizer
  if self.style then return self.style end
  return tok and require("tide.chat").detect_style(tok.chat_template) or "v3"
end

-- Tokens of a new user turn given the history (the template's delta).
function Session:_user_turn_tokens(text)
  local chat = require("tide.chat")
  local tok = self.model.tokenizer
  if not tok then error("say: the model has no tokenizer (use append/generate with ids)", 3) end
  local msgs = {}
  local first = #self.toks == 0
  if first and self.system then msgs[1] = { role = "system", content = self.system } end
  msgs[#msgs + 1] = { role = "user", content = text }
  local o = { add_generation_prompt = true, tokenizer = tok, style = self:_style(), thinking = self.thinking }
  if not first then o.bos_token = "" end
  local rendered = chat.render(msgs, o)
  local ids = tok:encode(rendered, { add_special_tokens = false })
  -- a reply cut short (max_tokens, Ctrl-C) is closed the way the template closes turns
  local eos = self.model.config.eos_token_id
  if not first and type(eos) == "number" and self.toks[#self.toks] ~= eos then table.insert(ids, 1, eos) end
  return ids
end

-- Append a user turn and generate the reply (streamed). Returns the reply
-- text (reasoning and tool calls parsed by tide.chat.parse_reply are in
-- s.last_reply).
function Session:say(text, opts)
  if type(text) ~= "string" then error("say(text): text must be a string", 2) end
  opts = opts or {}
  local start = #self.toks
  self:_snapshot()
  local ids = self:_user_turn_tokens(text)
  local target = copy_list(self.toks)
  for _, v in ipairs(ids) do target[#target + 1] = v end
  self:_sync(target)
  self:_snapshot()
  local turn = { start = start, reply = #self.toks, user = text }
  self.turns[#self.turns + 1] = turn
  self.messages[#self.messages + 1] = { role = "user", content = text }
  local _, reply = self:generate(opts)
  turn.stop = #self.toks
  self.messages[#self.messages + 1] = { role = "assistant", content = reply }
  self.last_reply = require("tide.chat").parse_reply(reply, { style = self:_style() })
  if self.print and not self.stream then io.write("\n") end
  return reply
end

-- Drop the last exchange (user turn and reply). Returns false when there is
-- none.
function Session:undo()
  local turn = table.remove(self.turns)
  if not turn then return false end
  table.remove(self.messages)
  table.remove(self.messages)
  local target = {}
  for i = 1, turn.start do target[i] = self.toks[i] end
  self:_sync(target)
  return true
end

-- Resample the last reply (the RNG continues, so the reply differs unless
-- the distribution is degenerate). Returns the new reply text.
function Session:regen(opts)
  local turn = self.turns[#self.turns]
  if not turn then error("regen: no reply to regenerate", 2) end
  table.remove(self.messages)
  local target = {}
  for i = 1, turn.reply do target[i] = self.toks[i] end
  self:_sync(target)
  local _, reply = self:generate(opts)
  turn.stop = #self.toks
  self.messages[#self.messages + 1] = { role = "assistant", content = reply }
  if self.print and not self.stream then io.write("\n") end
  return reply
end

-- An independent branch: the cache prefix is shared copy-on-write, the
-- sampler state (RNG included) is copied.
function Session:fork()
  local seq, err = self.seq:fork()
  if not seq then return nil, err end
  local f = setmetatable({}, Session)
  for k, v in pairs(self) do f[k] = v end
  f.seq = seq
  f.toks = copy_list(self.toks)
  f.turns = {}
  for i, t in ipairs(self.turns) do f.turns[i] = { start = t.start, reply = t.reply, stop = t.stop, user = t.user } end
  f.messages = {}
  for i, m in ipairs(self.messages) do f.messages[i] = { role = m.role, content = m.content } end
  f.snapshots = {}
  f.state = self.sampler:new_state({ seed = self.seed })
  f.state:restore(self.state:snapshot())
  f.stats = { prefill_tokens = 0, decode_tokens = 0, t_prefill = 0, t_decode = 0 }
  return f
end

-- The n most likely next tokens { {id =, p =, text =}, ... }, committing nothing.
function Session:peek(n)
  n = n or 5
  if not self.last_logits then return {} end
  local probs = self.last_logits:softmax()
  local vals, idx = probs:topk(n)
  local tok = self.model.tokenizer
  local out = {}
  for i = 0, vals:size(0) - 1 do
    local id = tonumber(idx[i]:item())
    out[#out + 1] = { id = id, p = vals[i]:item(), text = tok and tok:decode({ id }) or nil }
  end
  return out
end

-- The token history (a copy).
function Session:tokens() return copy_list(self.toks) end

function Session:text()
  local tok = self.model.tokenizer
  if not tok then return table.concat(self.toks, " ") end
  return tok:decode(self.toks, { skip_special_tokens = false })
end

function Session:close()
  for _, sn in ipairs(self.snapshots) do sn.seq:free() end
  self.snapshots = {}
  if self.seq then self.seq:free() end
  self.seq = nil
end

return M
