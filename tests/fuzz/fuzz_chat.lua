-- fuzz_chat: the chat template renderer and the reply parser. The input's
-- first byte picks the options (style v3 / v3.1, generation prompt,
-- thinking); the rest is decoded as JSON and rendered as a message list,
-- then encoded with the tokenizer; the raw input is also parsed as a
-- generated reply in both styles. An input refused with an error is fine.
local common = require("fuzz_common")
local chat = require("tide.chat")
local cjson = require("cjson")
local tok = require("tide").tokenizer()

return function(data)
  local flags = data:byte(1) or 0
  local body = data:sub(2)
  for _, style in ipairs({ "v3", "v3.1" }) do
    local ok, r = pcall(chat.parse_reply, data, { style = style })
    if ok and type(r) ~= "table" then fuzz_fail("parse_reply returned " .. type(r)) end
  end
  local ok, messages = pcall(cjson.decode, body)
  if not ok then return end
  local opts = { style = flags % 2 == 0 and "v3" or "v3.1", add_generation_prompt = flags % 4 >= 2,
    thinking = flags % 8 >= 4 }
  local text = chat.render(messages, opts)
  if type(text) ~= "string" then fuzz_fail("render returned " .. type(text)) end
  if flags % 16 >= 8 then chat.encode(tok, messages, opts) end
  local _ = common
end
