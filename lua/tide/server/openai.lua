-- tide.server.openai: OpenAI request bodies -> engine submissions, and
-- engine results -> OpenAI response objects and stream chunks.
--
-- A request is first turned into a `tide batch` request line (the same
-- table a line of requests.jsonl decodes to), then into the engine's
-- submit{} spec by tide batch's own mapping (tide.cli.batch.to_request), so
-- a request gives bitwise the tokens `tide batch` gives for that line.
-- openai.to_line is exposed for that comparison.
local json = require("tide.server.json")
local sampling = require("tide.sampling")
local batch = require("tide.cli.batch")

local M = {}
local null = json.null
M.MAX_DRAFT = 4   -- most draft tokens a request may ask for

-- ---------------------------------------------------------------- errors
-- An error result: { status, body = { error = { message, type, param, code } }, headers }.
function M.err(status, message, param, code, typ, headers)
  return { status = status, headers = headers, body = { error = { message = message,
    type = typ or (status >= 500 and "server_error" or "invalid_request_error"), param = param or null,
    code = code or null } } }
end
local err = M.err

-- ---------------------------------------------------------------- fields
local function is_int(v) return type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 end
local function is_num(v) return type(v) == "number" and v == v and v > -math.huge and v < math.huge end

-- field -> checker(v) returning an error message or nil
local function int_in(lo, hi)
  return function(v)
    if not is_int(v) or v < lo or (hi and v > hi) then
      return string.format("must be an integer in %d..%s", lo, hi and tostring(hi) or "")
    end
  end
end
local function num_in(lo, hi)
  return function(v)
    if not is_num(v) or v < lo or v > hi then return string.format("must be a number in %g..%g", lo, hi) end
  end
end
local function bool(v) if type(v) ~= "boolean" then return "must be true or false" end end
local function str(v) if type(v) ~= "string" then return "must be a string" end end
local function any() end

local COMMON = {
  model = str, max_tokens = int_in(1), temperature = num_in(0, 2), top_p = num_in(0, 1),
  top_k = int_in(0), min_p = num_in(0, 1), seed = int_in(-1 - 2 ^ 52, 2 ^ 52),
  stop = function(v)
    local list = type(v) == "table" and v or { v }
    if type(v) ~= "string" and (type(v) ~= "table" or (next(v) ~= nil and v[1] == nil)) then
      return "must be a string or a list of strings"
    end
    if #list > 16 then return "may hold at most 16 strings" end
    for _, s in ipairs(list) do
      if type(s) ~= "string" or s == "" then return "must hold non-empty strings" end
    end
  end,
  presence_penalty = num_in(-2, 2), frequency_penalty = num_in(-2, 2),
  logit_bias = function(v)
    if type(v) ~= "table" or (next(v) ~= nil and v[1] ~= nil) then return "must be an object {token id: bias}" end
  end,
  n = int_in(1, 1), stream = bool,
  stream_options = function(v)
    if type(v) ~= "table" or v[1] ~= nil then return "must be an object" end
    for k, x in pairs(v) do
      if k ~= "include_usage" then return "has an unknown field '" .. tostring(k) .. "'" end
      if type(x) ~= "boolean" then return "include_usage must be true or false" end
    end
  end,
  user = str, n_probs = int_in(0, 20), sampler = str, return_token_ids = bool, ignore_eos = bool,
  priority = function(v) if not is_num(v) then return "must be a number" end end,
  -- speculative decoding per request (docs/speculative.md): k, or {max = k, policy = built-in name,
  -- accept = "chain" | "rejection"};
  -- 0 turns off the server's --draft default. A policy is never a file path here.
  draft = function(v)
    if is_int(v) then
      if v < 0 or v > M.MAX_DRAFT then return "must be an integer in 0.." .. M.MAX_DRAFT .. " or {max, policy}" end
      return
    end
    if type(v) ~= "table" or v[1] ~= nil then
      return "must be an integer in 0.." .. M.MAX_DRAFT .. " or {max, policy}"
    end
    for k, x in pairs(v) do
      if k == "max" then
        if not is_int(x) or x < 0 or x > M.MAX_DRAFT then return "max must be an integer in 0.." .. M.MAX_DRAFT end
      elseif k == "policy" then
        if x ~= "fixed" and x ~= "adaptive" then return "policy must be \"fixed\" or \"adaptive\"" end
      elseif k == "accept" then
        if x ~= "chain" and x ~= "rejection" then return "accept must be \"chain\" or \"rejection\"" end
      else
        return "has an unknown field '" .. tostring(k) .. "' (max, policy, accept)"
      end
    end
    if v.max == nil then return "needs max" end
  end,
}
local CHAT = { messages = any, max_completion_tokens = int_in(1), logprobs = bool, top_logprobs = int_in(0, 20) }
local COMPLETION = {
  prompt = any, logprobs = int_in(0, 20),
  echo = function(v) if v ~= false then return "is not supported (only false)" end end,
  suffix = function(v) if v ~= null then return "is not supported" end end, best_of = int_in(1, 1),
}
-- tide's sampler options by their names (temp, typical_p, dry_multiplier, ...)
local TIDE = {}
for k, o in pairs(sampling.options) do
  if not COMMON[k] and k ~= "trace" then
    if o.type == "number" then TIDE[k] = function(v) if not is_num(v) then return "must be a number" end end
    elseif o.type == "string" then TIDE[k] = str
    elseif o.type == "boolean" then TIDE[k] = bool
    elseif o.type == "list" then
      TIDE[k] = function(v)
        if type(v) == "string" then return end
        if type(v) ~= "table" then return "must be a string or a list of strings" end
        for _, s in ipairs(v) do if type(s) ~= "string" then return "must hold strings" end end
      end
    end
  end
end

local function check_fields(body, extra)
  for k, v in pairs(body) do
    if type(k) ~= "string" then return err(400, "request body must be a JSON object") end
    local chk = extra[k] or COMMON[k] or TIDE[k]
    if not chk then return err(400, "unknown field '" .. k .. "'", k, "unknown_field") end
    if v ~= null then
      local msg = chk(v)
      if msg then return err(400, "'" .. k .. "' " .. msg, k, "invalid_type") end
    end
  end
end

local function val(body, k)
  local v = body[k]
  if v == null then return nil end
  return v
end

-- ---------------------------------------------------------------- mapping
-- ctx: { tokenizer, vocab, context, max_positions, samplers (dir or nil),
--        defaults (parsed serve options: sampling defaults, max_tokens) }

local function sampler_path(ctx, name)
  if not ctx.samplers then
    return nil, err(400, "this server has no sampler directory (start it with --sampler-dir DIR)", "sampler")
  end
  local base = name:gsub("%.lua$", "")
  if not base:match("^[%w_%-]+$") then
    return nil, err(400, "sampler must be the name of a file in the server's sampler directory (letters, digits, "
      .. "'_', '-'), got '" .. name .. "'", "sampler", "invalid_sampler")
  end
  local p = ctx.samplers .. "/" .. base .. ".lua"
  local f = io.open(p, "rb")
  if not f then
    return nil, err(400, "no sampler '" .. base .. "' in the server's sampler directory", "sampler", "invalid_sampler")
  end
  f:close()
  return p
end

-- The common part: body fields -> a batch line (ids already encoded).
local function fill_line(body, ctx, ids, line)
  local vocab = ctx.vocab
  for i, id in ipairs(ids) do
    if not is_int(id) or id < 0 or id >= vocab then
      return err(400, string.format("token %s at index %d is outside the vocabulary (0..%d)", tostring(id), i - 1,
        vocab - 1), "prompt", "invalid_token")
    end
  end
  if #ids == 0 then return err(400, "the prompt is empty", "prompt") end
  line.tokens = ids
  local limit = ctx.context
  if ctx.max_positions and ctx.max_positions < limit then limit = ctx.max_positions end
  local mt = val(body, "max_tokens") or val(body, "max_completion_tokens") or ctx.defaults.max_tokens
  if mt == nil then
    mt = limit - #ids
    if mt < 1 then
      return err(400, string.format("this model's context is %d tokens; the prompt alone has %d tokens", limit, #ids),
        "messages", "context_length_exceeded")
    end
  end
  if #ids + mt > limit then
    return err(400, string.format("this model's context is %d tokens, but %d were requested (%d in the prompt, "
      .. "%d for the completion)", limit, #ids + mt, #ids, mt), "max_tokens", "context_length_exceeded")
  end
  line.max_tokens = mt
  local seed = val(body, "seed")
  if seed ~= nil then line.seed = seed end
  local stop = val(body, "stop")
  if stop ~= nil then line.stop = type(stop) == "string" and { stop } or stop end
  line.ignore_eos = val(body, "ignore_eos")
  line.priority = val(body, "priority")
  line.n_probs = val(body, "n_probs")
  local d = val(body, "draft")
  if type(d) == "table" then line.draft = { max = d.max, policy = d.policy, accept = d.accept } else line.draft = d end
  -- sampler options: OpenAI names, then tide's own names
  local t = val(body, "temperature")
  if t ~= nil and val(body, "temp") ~= nil then return err(400, "give temperature or temp, not both", "temp") end
  if t ~= nil then line.temp = t end
  for _, k in ipairs({ "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty" }) do
    if val(body, k) ~= nil then line[k] = body[k] end
  end
  local lb = val(body, "logit_bias")
  if lb then
    local b = {}
    for k, v in pairs(lb) do
      local id = tonumber(k)
      if not (type(k) == "string" and k:match("^%d+$") and id < vocab) then
        return err(400, "logit_bias: '" .. tostring(k) .. "' is not a token id in 0.." .. (vocab - 1), "logit_bias")
      end
      if not is_num(v) or v < -100 or v > 100 then
        return err(400, "logit_bias: the bias of token " .. k .. " must be a number in -100..100", "logit_bias")
      end
      b[k] = v
    end
    if next(b) then line.logit_bias = b end
  end
  for k in pairs(TIDE) do
    if k ~= "sampler" and val(body, k) ~= nil then line[k] = body[k] end
  end
  local s = val(body, "sampler")
  if s ~= nil then
    local p, e = sampler_path(ctx, s)
    if not p then return e end
    line.sampler = p
  end
end

-- Validate a chat body; returns line, meta or nil, error.
function M.chat_line(body, ctx)
  if type(body) ~= "table" or body[1] ~= nil then return nil, err(400, "request body must be a JSON object") end
  local e = check_fields(body, CHAT)
  if e then return nil, e end
  local msgs = val(body, "messages")
  if type(msgs) ~= "table" or msgs[1] == nil then
    return nil, err(400, "'messages' must be a non-empty list of messages", "messages")
  end
  for i, m in ipairs(msgs) do
    if type(m) ~= "table" or m[1] ~= nil then
      return nil, err(400, "messages[" .. (i - 1) .. "] must be an object", "messages")
    end
    for k, v in pairs(m) do
      if k ~= "role" and k ~= "content" and k ~= "name" and k ~= "tool_calls" and k ~= "tool_call_id" then
        return nil, err(400, "messages[" .. (i - 1) .. "]: unknown field '" .. tostring(k) .. "'", "messages",
          "unknown_field")
      end
      if k == "content" and type(v) == "table" then
        -- [{type = "text", text = ...}] parts: text only
        local parts = {}
        for j, p in ipairs(v) do
          if type(p) ~= "table" or p.type ~= "text" or type(p.text) ~= "string" then
            return nil, err(400, "messages[" .. (i - 1) .. "].content[" .. (j - 1) .. "]: only text parts are "
              .. "supported", "messages")
          end
          parts[#parts + 1] = p.text
        end
        m.content = table.concat(parts)
      end
    end
    if type(m.content) == "string" and not json.valid_utf8(m.content) then
      return nil, err(400, "messages[" .. (i - 1) .. "].content is not valid UTF-8", "messages", "invalid_utf8")
    end
  end
  if not ctx.tokenizer then return nil, err(400, "this model has no tokenizer: use /v1/completions with token ids") end
  local lp, top = val(body, "logprobs"), val(body, "top_logprobs")
  if top ~= nil and not lp then
    return nil, err(400, "top_logprobs needs logprobs: true", "top_logprobs")
  end
  local ok, ids = pcall(require("tide.chat").encode, ctx.tokenizer, msgs, { add_generation_prompt = true })
  if not ok then return nil, err(400, tostring(ids):gsub("^[^:]*:%d+: ", ""), "messages") end
  local line = {}
  e = fill_line(body, ctx, ids, line)
  if e then return nil, e end
  if lp then line.logprobs = top or 0 end
  return line, M.meta(body, "chat", lp and (top or 0) or (line.n_probs ~= nil and line.n_probs > 0 and line.n_probs))
end

-- Validate a completions body; returns line, meta or nil, error.
function M.completion_line(body, ctx)
  if type(body) ~= "table" or body[1] ~= nil then return nil, err(400, "request body must be a JSON object") end
  local e = check_fields(body, COMPLETION)
  if e then return nil, e end
  local p = val(body, "prompt")
  local ids
  if type(p) == "table" and #p == 1 and (type(p[1]) == "string" or type(p[1]) == "table") then p = p[1] end
  if type(p) == "string" then
    if not ctx.tokenizer then
      return nil, err(400, "this model has no tokenizer: give the prompt as token ids", "prompt")
    end
    if not json.valid_utf8(p) then return nil, err(400, "the prompt is not valid UTF-8", "prompt", "invalid_utf8") end
    ids = ctx.tokenizer:encode(p)
  elseif type(p) == "table" and p[1] ~= nil then
    for i, x in ipairs(p) do
      if not is_int(x) then
        return nil, err(400, "prompt must be a string, a list of token ids, or a list holding one of these "
          .. "(prompt[" .. (i - 1) .. "] is not a token id; several prompts are not supported)", "prompt")
      end
    end
    ids = p
  else
    return nil, err(400, "'prompt' must be a string or a list of token ids", "prompt")
  end
  local line = {}
  e = fill_line(body, ctx, ids, line)
  if e then return nil, e end
  local lp = val(body, "logprobs")
  if lp ~= nil then line.logprobs = lp end
  return line, M.meta(body, "completion", lp or (line.n_probs ~= nil and line.n_probs > 0 and line.n_probs))
end

function M.meta(body, kind, lp)
  local so = val(body, "stream_options")
  return { kind = kind, stream = val(body, "stream") == true, include_usage = so and so.include_usage or false,
    token_ids = val(body, "return_token_ids") == true, logprobs = lp or nil, model = val(body, "model") }
end

-- A batch line -> the engine's submit spec (tide batch's own mapping).
function M.to_spec(line, ctx)
  local spec, e = batch.to_request(line, ctx.defaults, ctx.sampler_cache, ctx.tokenizer)
  if not spec then return nil, err(400, e) end
  return spec
end

-- ---------------------------------------------------------------- responses
local function token_text(tok, id)
  if not tok then return "" end
  local ok, s = pcall(tok.decode, tok, { id })
  if not ok then return "" end
  s = json.sanitize_utf8(s)
  return s
end
local function token_bytes(tok, id)
  local out = json.array()
  if not tok then return out end
  local ok, s = pcall(tok.id_to_bytes, tok, id)
  if ok and type(s) == "string" then for i = 1, #s do out[i] = s:byte(i) end end
  return out
end

-- Logprob entries i..j of a request (generation records) in the chat format.
function M.chat_logprobs(tok, recs, i, j, k)
  local content = json.array()
  for n = i, j do
    local r = recs[n]
    if not r then break end
    local tops = json.array()
    for t = 1, math.min(k, r.raw_top and #r.raw_top or 0) do
      local e = r.raw_top[t]
      tops[t] = { token = token_text(tok, e.id), logprob = e.logprob, bytes = token_bytes(tok, e.id), id = e.id }
    end
    content[#content + 1] = { token = token_text(tok, r.token), logprob = r.raw_logprob or null,
      bytes = token_bytes(tok, r.token), top_logprobs = tops, id = r.token }
  end
  return { content = content }
end

-- ... and in the completions format ({tokens, token_logprobs, top_logprobs, text_offset}).
function M.completion_logprobs(tok, recs, i, j, k, offset)
  local out = { tokens = json.array(), token_logprobs = json.array(), top_logprobs = json.array(),
    text_offset = json.array() }
  local off = offset or 0
  for n = i, j do
    local r = recs[n]
    if not r then break end
    local s = token_text(tok, r.token)
    out.tokens[#out.tokens + 1] = s
    out.token_logprobs[#out.token_logprobs + 1] = r.raw_logprob or null
    local tops = {}
    for t = 1, math.min(k, r.raw_top and #r.raw_top or 0) do
      tops[token_text(tok, r.raw_top[t].id)] = r.raw_top[t].logprob
    end
    out.top_logprobs[#out.top_logprobs + 1] = tops
    out.text_offset[#out.text_offset + 1] = off
    off = off + #s
  end
  return out, off
end

local FINISH = { stop = "stop", length = "length", cancelled = "stop" }
M.FINISH = FINISH

-- usage, with tide's `speculation` figures when the request drafted
-- ({max, policy, steps, drafted, accepted, acceptance, tokens_per_step}).
function M.usage(res)
  local u = { prompt_tokens = res.prompt_tokens, completion_tokens = res.completion_tokens,
    total_tokens = res.prompt_tokens + res.completion_tokens }
  local sp = res.speculation
  if sp then
    u.speculation = { max = sp.max, policy = sp.policy, accept = sp.accept, steps = sp.steps, drafted = sp.drafted,
      accepted = sp.accepted, acceptance = sp.acceptance, tokens_per_step = sp.tokens_per_step }
  end
  return u
end

-- The whole (non-streamed) answer of a finished request.
function M.response(job, res, tok)
  local m = job.meta
  local choice = { index = 0, finish_reason = FINISH[res.finish_reason] or res.finish_reason, logprobs = null }
  local k = m.logprobs
  if m.kind == "chat" then
    choice.message = { role = "assistant", content = res.text or "" }
    if k and res.logprobs then choice.logprobs = M.chat_logprobs(tok, res.logprobs, 1, #res.logprobs, k) end
  else
    choice.text = res.text or ""
    if k and res.logprobs then choice.logprobs = M.completion_logprobs(tok, res.logprobs, 1, #res.logprobs, k) end
  end
  if m.token_ids then choice.token_ids = json.array(res.tokens) end
  return { id = job.cid, object = m.kind == "chat" and "chat.completion" or "text_completion", created = job.created,
    model = job.model, system_fingerprint = job.fingerprint, choices = { choice }, usage = M.usage(res),
    __order = { "id", "object", "created", "model" } }
end

-- One stream chunk (a "data: {...}\n\n" line). fields: text, finish_reason,
-- role (chat's first chunk), logprobs (already formatted), token_ids, usage.
function M.chunk(job, f)
  local m = job.meta
  local c = { id = job.cid, created = job.created, model = job.model, system_fingerprint = job.fingerprint,
    __order = { "id", "object", "created", "model" } }
  if f.usage then
    c.choices = json.array()
    c.usage = f.usage
  else
    local choice = { index = 0, finish_reason = f.finish_reason or null, logprobs = f.logprobs or null }
    if m.kind == "chat" then
      local d = {}
      if f.role then d.role = f.role end
      if f.text then d.content = f.text end
      choice.delta = d
    else
      choice.text = f.text or ""
    end
    if f.token_ids then choice.token_ids = json.array(f.token_ids) end
    c.choices = { choice }
    if m.include_usage then c.usage = null end
  end
  c.object = m.kind == "chat" and "chat.completion.chunk" or "text_completion"
  return "data: " .. json.encode(c) .. "\n\n"
end

return M
