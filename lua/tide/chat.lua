-- tide.chat: DeepSeek's chat format, as text (then ids through a tokenizer).
--   local chat = tide.chat
--   local text = chat.render({ {role = "user", content = "Hi"} }, { add_generation_prompt = true })
--   local ids  = chat.encode(tok, messages, { add_generation_prompt = true })
--   local r    = chat.parse_reply(generated_text)  -- {content, reasoning, tool_calls}
--
-- Two styles, each a line-by-line reading of a Jinja template DeepSeek ships
-- in tokenizer_config.json (tide has no Jinja engine; the golden tests
-- compare "v3" with the JavaScript reference rendering the real template):
--  "v3"   DeepSeek-V3's template: BOS, the system prompt(s) joined by blank
--         lines, <｜User｜>/<｜Assistant｜> turns closed by
--         <｜end▁of▁sentence｜>, tool calls as
--         <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>,
--         tool results in <｜tool▁outputs▁begin｜>...<｜tool▁outputs▁end｜>.
--         Its quirks are kept on purpose (with a single tool call the
--         template writes no <｜tool▁calls▁end｜>; the "first call" flag is
--         never reset), so ids match what transformers would feed the model.
--  "v3.1" The hybrid thinking template of DeepSeek-V3.1 (same tokenizer
--         family as V4): the assistant turn opens with <think> (thinking)
--         or </think> (non-thinking), tool calls are
--         <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>, and
--         earlier turns' reasoning is dropped.
-- With opts.tokenizer the style follows that tokenizer's chat_template
-- ("v3.1" when it mentions </think>), and BOS comes from it.
local M = {}

local BOS = "<｜begin▁of▁sentence｜>"
local EOS = "<｜end▁of▁sentence｜>"
local USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
local CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
local CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
local OUTS_BEGIN, OUTS_END = "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>"
local OUT_BEGIN, OUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
local THINK, UNTHINK = "<think>", "</think>"

M.tokens = {
  bos = BOS, eos = EOS, user = USER, assistant = ASSISTANT, tool_calls_begin = CALLS_BEGIN,
  tool_calls_end = CALLS_END, tool_call_begin = CALL_BEGIN, tool_call_end = CALL_END, tool_sep = SEP,
  tool_outputs_begin = OUTS_BEGIN, tool_outputs_end = OUTS_END, tool_output_begin = OUT_BEGIN,
  tool_output_end = OUT_END, think = THINK, end_think = UNTHINK,
}
M.styles = { "v3", "v3.1" }

-- JSON null from lua-cjson counts as "none", like nil (messages often come
-- from JSON).
local cjson_null
do
  local ok, cjson = pcall(require, "cjson")
  if ok then cjson_null = cjson.null end
end
local function none(v) return v == nil or (cjson_null ~= nil and v == cjson_null) end

local function str(v, what, level)
  if type(v) ~= "string" then error(what .. " must be a string, got " .. type(v), level + 1) end
  return v
end

local VALID_ROLE = { system = true, user = true, assistant = true, tool = true }

local function check_messages(messages, level)
  if type(messages) ~= "table" then error("messages must be a list of {role=..., content=...}", level + 1) end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" then error(("messages[%d] must be a table"):format(i), level + 1) end
    if not VALID_ROLE[m.role] then
      error(("messages[%d].role must be system, user, assistant or tool, got %s"):format(i, tostring(m.role)),
        level + 1)
    end
    local has_calls = type(m.tool_calls) == "table" and #m.tool_calls > 0
    if none(m.content) then
      if not (m.role == "assistant" and has_calls) then
        error(("messages[%d].content is missing (only an assistant turn with tool_calls may omit it)"):format(i),
          level + 1)
      end
    elseif type(m.content) ~= "string" then
      error(("messages[%d].content must be a string, got %s"):format(i, type(m.content)), level + 1)
    end
    if has_calls then
      for k, call in ipairs(m.tool_calls) do
        local f = type(call) == "table" and call["function"]
        if type(f) ~= "table" or type(f.name) ~= "string" then
          error(("messages[%d].tool_calls[%d] needs function.name"):format(i, k), level + 1)
        end
        if type(f.arguments) ~= "string" then
          error(("messages[%d].tool_calls[%d].function.arguments must be a JSON string"):format(i, k), level + 1)
        end
      end
    end
  end
end

local function system_prompt(messages)
  local parts = {}
  for _, m in ipairs(messages) do
    if m.role == "system" then parts[#parts + 1] = m.content end
  end
  return table.concat(parts, "\n\n")
end

-- DeepSeek-V3's template.
local function render_v3(messages, bos, gen)
  local out = { bos, system_prompt(messages) }
  local function w(s) out[#out + 1] = s end
  local is_first, is_tool, is_output_first = false, false, true
  for _, m in ipairs(messages) do
    if m.role == "user" then
      is_tool = false
      w(USER .. m.content)
    elseif m.role == "assistant" and none(m.content) then
      is_tool = false
      for _, call in ipairs(m.tool_calls) do
        local f = call["function"]
        local body = (call.type or "function") .. SEP .. f.name .. "\n```json\n" .. f.arguments .. "\n```" .. CALL_END
        if not is_first then
          w(ASSISTANT .. CALLS_BEGIN .. CALL_BEGIN .. body)
          is_first = true
        else
          w("\n" .. CALL_BEGIN .. body)
          w(CALLS_END .. EOS)
        end
      end
    elseif m.role == "assistant" then
      if is_tool then
        w(OUTS_END .. m.content .. EOS)
        is_tool = false
      else
        w(ASSISTANT .. m.content .. EOS)
      end
    elseif m.role == "tool" then
      is_tool = true
      if is_output_first then
        w(OUTS_BEGIN .. OUT_BEGIN .. m.content .. OUT_END)
        is_output_first = false
      else
        w("\n" .. OUT_BEGIN .. m.content .. OUT_END)
      end
    end
  end
  if is_tool then w(OUTS_END) end
  if gen and not is_tool then w(ASSISTANT) end
  return table.concat(out)
end

-- DeepSeek-V3.1's hybrid thinking template.
local function render_v31(messages, bos, gen, thinking)
  local out = { bos, system_prompt(messages) }
  local function w(s) out[#out + 1] = s end
  local is_tool, is_last_user = false, false
  for _, m in ipairs(messages) do
    local has_calls = type(m.tool_calls) == "table" and #m.tool_calls > 0
    if m.role == "user" then
      is_tool, is_last_user = false, true
      w(USER .. m.content)
    elseif m.role == "assistant" and has_calls then
      if is_last_user then w(ASSISTANT .. UNTHINK) end
      is_last_user, is_tool = false, false
      local is_first = false
      for _, call in ipairs(m.tool_calls) do
        local f = call["function"]
        local body = CALL_BEGIN .. f.name .. SEP .. f.arguments .. CALL_END
        if not is_first then
          w((none(m.content) and "" or m.content) .. CALLS_BEGIN .. body)
          is_first = true
        else
          w(body)
        end
      end
      w(CALLS_END .. EOS)
    elseif m.role == "assistant" then
      if is_last_user then
        w(ASSISTANT .. ((m.prefix and thinking) and THINK or UNTHINK))
      end
      is_last_user = false
      if is_tool then
        w(m.content .. EOS)
        is_tool = false
      else
        local content = m.content
        local a, b = content:find(UNTHINK, 1, true)
        if a then content = content:sub(b + 1) end -- earlier reasoning is not replayed
        w(content .. EOS)
      end
    elseif m.role == "tool" then
      is_last_user, is_tool = false, true
      w(OUT_BEGIN .. m.content .. OUT_END)
    end
  end
  if gen and is_last_user and not is_tool then w(ASSISTANT .. (thinking and THINK or UNTHINK)) end
  return table.concat(out)
end

-- The style a chat_template string implies.
function M.detect_style(template)
  if type(template) == "string" and template:find(UNTHINK, 1, true) then return "v3.1" end
  return "v3"
end

-- render(messages, opts) -> string. opts:
--   add_generation_prompt  end with the assistant opening (default false)
--   style                  "v3" | "v3.1" (default: from opts.tokenizer, else "v3")
--   thinking               v3.1: open the reply with <think> (default false)
--   bos_token              default DeepSeek's BOS (or the tokenizer's)
--   tokenizer              a tide.tokenizer to take BOS and the style from
function M.render(messages, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("render(messages, opts): opts must be a table", 2) end
  check_messages(messages, 2)
  local tok = opts.tokenizer
  local style = opts.style or (tok and M.detect_style(tok.chat_template)) or "v3"
  local bos = opts.bos_token
  if bos == nil and tok and tok.bos_id then bos = tok:id_to_token(tok.bos_id) end
  bos = bos or BOS
  str(bos, "opts.bos_token", 2)
  local gen = opts.add_generation_prompt and true or false
  if style == "v3" then return render_v3(messages, bos, gen) end
  if style == "v3.1" then return render_v31(messages, bos, gen, opts.thinking and true or false) end
  error("unknown chat style '" .. tostring(style) .. "' (v3 or v3.1)", 2)
end

-- encode(tok, messages, opts) -> ids: render with tok, then encode without
-- adding special tokens again (the text already starts with BOS).
function M.encode(tok, messages, opts)
  if type(tok) ~= "table" or type(tok.encode) ~= "function" then
    error("encode(tok, messages): tok must be a tide.tokenizer", 2)
  end
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.tokenizer = tok
  local ok, text = pcall(M.render, messages, o)
  if not ok then error(text, 2) end
  return tok:encode(text, { add_special_tokens = false }), text
end

-- parse_reply(text, opts) -> { content = ..., reasoning = ... or nil,
-- tool_calls = { {type, name, arguments}, ... } or nil }: split a generated
-- assistant turn back into parts. opts.style as in render (the v3 call
-- layout is TYPE<sep>NAME + a ```json block, v3.1 is NAME<sep>ARGS).
function M.parse_reply(text, opts)
  str(text, "parse_reply(text): text", 2)
  local style = (opts and opts.style) or "v3"
  local r = {}
  local e = text:find(EOS, 1, true)
  if e then text = text:sub(1, e - 1) end
  local a, b = text:find(UNTHINK, 1, true)
  if a then
    local reasoning = text:sub(1, a - 1)
    if reasoning:sub(1, #THINK) == THINK then reasoning = reasoning:sub(#THINK + 1) end
    r.reasoning = reasoning
    text = text:sub(b + 1)
  end
  local cb = text:find(CALLS_BEGIN, 1, true)
  if cb then
    local calls = {}
    local rest = text:sub(cb + #CALLS_BEGIN)
    text = text:sub(1, cb - 1)
    local pos = 1
    while true do
      local s1, s2 = rest:find(CALL_BEGIN, pos, true)
      if not s1 then break end
      local e1, e2 = rest:find(CALL_END, s2 + 1, true)
      local body = rest:sub(s2 + 1, (e1 or #rest + 1) - 1)
      local x, y = body:find(SEP, 1, true)
      local call = {}
      if x then
        local head, tail = body:sub(1, x - 1), body:sub(y + 1)
        if style == "v3" then
          call.type = head
          local name, args = tail:match("^(.-)\n```json\n(.*)\n```$")
          call.name, call.arguments = name or tail, args or ""
        else
          call.type, call.name, call.arguments = "function", head, tail
        end
      else
        call.type, call.name, call.arguments = "function", body, ""
      end
      calls[#calls + 1] = call
      if not e1 then break end
      pos = e2 + 1
    end
    r.tool_calls = calls
  end
  r.content = text
  return r
end

return M
