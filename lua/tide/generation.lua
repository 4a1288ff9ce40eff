-- tide.generation: the per-request loop state that a generate command, the
-- batch engine and sessions share: sample a token from a logits row, accept
-- it, turn it into text, and stop on a stop token, a stop string (found in
-- the text even when it spans several tokens) or max_tokens; keep the
-- logprobs of each token when asked.
--
--   local g = generation.new{ sampler = s, seed = 1, max_tokens = 200, stop = {"\n\n"},
--                             tokenizer = tok, logprobs = 2 }
--   g:prompt(prompt_ids)
--   while not g.finish_reason do
--     local row = model_step(...)             -- f32 [V] logits of the last position
--     local tok, text = g:step(row)
--     io.write(text)                           -- text is safe to show: it never holds
--   end                                       -- the start of a stop string
--   print(g.finish_reason)                    -- "stop", "length" or "error" (g.error)
local sampling = require("tide.sampling")

local M = {}

local Gen = {}
Gen.__index = Gen
M.Generation = Gen

M.options = {
  n_predict = { type = "number", default = -1, help = "tokens to generate (-1 = until a stop)" },
  stop = { type = "list", meta = "S", help = "stop string (repeatable); not included in the output" },
  ignore_eos = { type = "boolean", help = "do not stop at the end-of-sequence token" },
}

-- new{ state = st | sampler = s (+ seed, logprobs, trace), max_tokens = n,
--      stop = {strings}, stop_tokens = {ids}, ignore_eos = bool,
--      tokenizer = tok | detokenize = function(id) -> bytes }
-- stop_tokens default to the tokenizer's eos id. Without a tokenizer or a
-- detokenize function, no text is produced (stop strings need one).
function M.new(o)
  o = o or {}
  local st = o.state
  if not st then
    if not o.sampler then error("generation.new: give state = sampler_state or sampler = sampler", 2) end
    st = o.sampler:new_state{ seed = o.seed, logprobs = o.logprobs, trace = o.trace, tokenizer = o.tokenizer }
  end
  local stops = {}
  for _, s in ipairs(o.stop or {}) do
    if type(s) ~= "string" or s == "" then error("generation.new: stop strings must be non-empty strings", 2) end
    stops[#stops + 1] = s
  end
  if #stops > 0 and not (o.tokenizer or o.detokenize) then
    error("generation.new: stop strings need a tokenizer or a detokenize function", 2)
  end
  local stop_tokens = {}
  local st_list = o.stop_tokens
  if st_list == nil and o.tokenizer and o.tokenizer.eos_id then st_list = { o.tokenizer.eos_id } end
  for _, id in ipairs(st_list or {}) do stop_tokens[id] = true end
  local maxlen = 0
  for _, s in ipairs(stops) do maxlen = math.max(maxlen, #s) end
  local self = setmetatable({
    state = st,
    max_tokens = (o.max_tokens and o.max_tokens >= 0) and o.max_tokens or nil,
    stops = stops, stop_max = maxlen,
    stop_tokens = stop_tokens, ignore_eos = o.ignore_eos or false,
    detokenize = o.detokenize,
    streamer = o.tokenizer and not o.detokenize and o.tokenizer:streamer({ skip_special_tokens = true }) or nil,
    streamer_vocab = o.tokenizer and o.tokenizer.vocab_size or 0,
    tokens = {}, pieces = {}, pending = "",
    logprobs = (o.logprobs or st.logprobs) and {} or nil,
    n_tokens = 0,
  }, Gen)
  return self
end

-- Parsed options (generation.options and sampling.options) -> new{} options.
function M.options_to_new(o, sampler, tokenizer)
  local so = sampling.state_options(o)
  return { sampler = sampler, seed = so.seed, logprobs = so.logprobs, trace = so.trace, tokenizer = tokenizer,
    max_tokens = o.n_predict or -1, stop = o.stop, ignore_eos = o.ignore_eos }
end

-- Feed the prompt to the sampler state (penalties and DRY see it).
function Gen:prompt(ids)
  self.state:accept(ids)
  return self
end

-- The longest suffix of s that is a proper prefix of a stop string.
local function held_back(self, s)
  for L = math.min(#s, self.stop_max - 1), 1, -1 do
    local tail = s:sub(-L)
    for _, stop in ipairs(self.stops) do
      if stop:sub(1, L) == tail then return L end
    end
  end
  return 0
end

local function emit(self, text)
  if text ~= "" then self.pieces[#self.pieces + 1] = text end
  return text
end

local function finish(self, reason)
  self.finish_reason = reason
  local out = self.pending
  if self.streamer then
    out = out .. self.streamer:flush()
  end
  self.pending = ""
  return emit(self, out)
end

-- Record a token (sampled here or elsewhere); returns the text that became
-- safe to show and the finish reason once the request ended.
function Gen:push(token, info)
  if self.finish_reason then error("push: the request has finished (" .. self.finish_reason .. ")", 2) end
  self.n_tokens = self.n_tokens + 1
  self.tokens[self.n_tokens] = token
  local piece = ""
  local is_stop = self.stop_tokens[token] and not self.ignore_eos
  if not is_stop then
    if self.detokenize then
      piece = self.detokenize(token) or ""
    elseif self.streamer then
      -- ids past the tokenizer's vocabulary (a model's padding rows) have no text
      piece = token < self.streamer_vocab and self.streamer:put(token) or ""
    end
  end
  if self.logprobs then
    local e = { token = token, text = piece }
    if info then
      e.p, e.raw_logprob, e.sampled_logprob = info.p, info.raw_logprob, info.sampled_logprob
      e.raw_top, e.sampled_top = info.raw_top, info.sampled_top
    end
    self.logprobs[#self.logprobs + 1] = e
  end
  if is_stop then
    self.stop_token = token
    return finish(self, "stop"), "stop"
  end
  local text = self.pending .. piece
  if #self.stops > 0 then
    -- the earliest complete stop string ends the text just before it
    local at, which
    for _, s in ipairs(self.stops) do
      local p = text:find(s, 1, true)
      if p and (not at or p < at) then at, which = p, s end
    end
    if at then
      self.pending = ""
      self.stop_string = which
      self.finish_reason = "stop"
      return emit(self, text:sub(1, at - 1)), "stop"
    end
    local hold = held_back(self, text)
    self.pending = text:sub(#text - hold + 1)
    text = text:sub(1, #text - hold)
  end
  local out = emit(self, text)
  if self.max_tokens and self.n_tokens >= self.max_tokens then
    return out .. finish(self, "length"), "length"
  end
  return out, nil
end

-- Sample from a logits row, accept the token, record it. Returns token,
-- text, finish reason; on a sampling error nil, "", "error" (g.error says
-- why; this request ends, the state stays usable). `choose(state, row) ->
-- token, info` replaces state:sample (speculative rejection sampling).
function Gen:step(row, choose)
  if self.finish_reason then error("step: the request has finished (" .. self.finish_reason .. ")", 2) end
  if self.max_tokens and self.n_tokens >= self.max_tokens then
    return nil, finish(self, "length"), "length"
  end
  local tok, info
  if choose then tok, info = choose(self.state, row) else tok, info = self.state:sample(row) end
  if not tok then
    self.error = info
    return nil, finish(self, "error"), "error"
  end
  self.state:accept(tok)
  local text, reason = self:push(tok, info)
  return tok, text, reason
end

-- End the request now (e.g. "cancelled"); returns the text still held back.
function Gen:stop(reason)
  if self.finish_reason then return "" end
  return finish(self, reason or "cancelled")
end

-- The text shown so far.
function Gen:text() return table.concat(self.pieces) end

function Gen:result()
  return { text = self:text(), tokens = self.tokens, n_tokens = self.n_tokens, finish_reason = self.finish_reason,
    stop_string = self.stop_string, stop_token = self.stop_token, error = self.error, logprobs = self.logprobs }
end

return M
