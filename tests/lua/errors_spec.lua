-- errors_spec: what users read when they get something wrong. Every
-- subcommand is run as a subprocess with bad input (a missing file, a bad
-- option value, a token outside the vocabulary, a bad batch line, a sampler
-- stage that raises, ...); the message must name the input and must not
-- show tide's internals (no ".lua:" position, no traceback) unless asked
-- for with -v or TIDE_TRACEBACK=1. Every subcommand prints its usage for
-- --help and -h; --max-tokens refuses what it cannot mean.
local tm = require("testmodels")
local q, sh, EXE = tm.q, tm.sh, tm.EXE

local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/errors_spec"
os.execute("mkdir -p " .. q(TMP))
local TINY = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
local DEMO = tm.get("demo1", { "--preset", "demo", "--seed", "2" })
local NOPE = TMP .. "/no_such_thing"

local function write(name, text)
  local p = TMP .. "/" .. name
  local f = assert(io.open(p, "w"))
  f:write(text)
  f:close()
  return p
end

local RAISE = write("raise.lua", 'return sampling.chain{ function(c) error("my stage broke") end }\n')
local SYNTAX = write("syntax.lua", "return sampling.chain{ sampling.top_k(\n")
local FIVE = write("five.lua", "return 5\n")
local POLICY = write("policy.lua", 'return { name = "p", schedule = function(v) error("policy bug") end }\n')
local GARBAGE = write("garbage.safetensors", "this is not a checkpoint at all")
local LINES = write("requests.jsonl", table.concat({
  '{"tokens": [1, 2], "max_tokens": 2}',
  "{bad json",
  '{"tokens": [999999]}',
  '{"tokens": [1], "bogus": 1}',
  '{"tokens": [1], "sampler": "' .. RAISE .. '", "max_tokens": 2}',
}, "\n") .. "\n")

local function run(args, env)
  local parts = { q(EXE) }
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  return sh((env or "") .. table.concat(parts, " ") .. " < /dev/null")
end

-- A user-facing message: no Lua position (FILE.lua:LINE), no traceback.
local function clean(out, what)
  assert.is_nil(out:find("%.lua:%d"), what .. ": shows a Lua position:\n" .. out)
  assert.is_nil(out:find("stack traceback", 1, true), what .. ": shows a traceback:\n" .. out)
  assert.is_nil(out:find("lua/tide/", 1, true), what .. ": names tide's own files:\n" .. out)
end

-- { args, text the message must hold (the user's input, what was expected) }
local CASES = {
  { { "generate", "--model", NOPE, "--tokens", "1" }, { NOPE, "cannot load the model" } },
  { { "generate", "--model", TINY, "--tokens", "5000" }, { "5000", "--tokens", "0..1023" } },
  { { "generate", "--model", TINY, "--tokens", "1,abc" }, { "'abc'", "--tokens" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--max-tokens", "-5" }, { "--max-tokens", "'-5'", ">= 1" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--n-predict", "2.5" }, { "--n-predict", "whole number" } },
  { { "generate", "--model", TINY, "--prompt", "hi" }, { "tokenizer", "--tokens" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--sampler", RAISE, "--max-tokens", "2" },
    { "my stage broke", "raise.lua, line 1", "stage 1" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--sampler", SYNTAX }, { "syntax.lua, line 2" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--sampler", FIVE }, { "five.lua", "sampling.chain" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--sampler", NOPE .. ".lua" }, { NOPE .. ".lua" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--temp", "warm" }, { "--temp", "'warm'" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--samplers", "top_q" }, { "--samplers", "top_q" } },
  { { "generate", "--model", TINY, "--tokens", "1", "--logit-bias", "x" }, { "--logit-bias", "'x'" } },
  { { "generate", "--bogus" }, { "--bogus" } },
  { { "generate", "--model" }, { "--model", "needs a value" } },
  { { "logits", "--model", TINY, "--tokens", "1,5000", "--out", TMP .. "/x.f32" }, { "5000", "--tokens" } },
  { { "logits", "--model", TINY, "--tokens", "1", "--out", NOPE .. "/x.f32" }, { NOPE } },
  { { "logits", "--model", TINY, "--tokens", "1", "--out", TMP .. "/x.f32", "--mode", "sideways" }, { "--mode" } },
  { { "logits", "--tokens", "1", "--out", TMP .. "/x.f32" }, { "--model" } },
  { { "inspect", "--model", NOPE }, { NOPE } },
  { { "inspect", "--model", GARBAGE }, { GARBAGE } },
  { { "inspect", "--model", TINY, "--filter", "[" }, { "--filter", "'['" } },
  { { "tokenize", "--tokenizer", NOPE, "--text", "hi" }, { NOPE } },
  { { "tokenize", "--file", NOPE }, { NOPE } },
  { { "detokenize", "--ids", "1 abc" }, { "'abc'" } },
  { { "detokenize", "--tokenizer", DEMO, "--ids", "999999999" }, { "999999999" } },
  { { "sample", "--vocab", "0" }, { "--vocab", "'0'" } },
  { { "sample", "--n", "-1" }, { "--n", "'-1'" } },
  { { "sample", "--sampler", RAISE, "--vocab", "64" }, { "my stage broke", "raise.lua, line 1" } },
  { { "sample", "--model", TINY, "--tokens", "5000" }, { "5000", "--tokens" } },
  { { "sample", "--model", TINY, "--tokens", "1", "--vs", NOPE .. ".lua" }, { "--vs", NOPE .. ".lua" } },
  { { "sample", "--model", TINY, "--tokens", "1", "--sampler", RAISE }, { "my stage broke", "chain A" } },
  { { "sample", "--report", TMP .. "/r.html" }, { "--report", "--prompt" } },
  { { "batch", "--model", TINY, "--input", NOPE }, { NOPE, "cannot open" } },
  { { "batch", "--model", TINY, "--input", LINES, "--policy", "nosuch", "--quiet" }, { "nosuch" } },
  { { "batch", "--model", TINY, "--input", LINES, "--output", TMP .. "/p.jsonl", "--policy", POLICY, "--quiet" },
    { "policy bug", "policy.lua, line 1" } },
  { { "batch", "--model", TINY, "--input", LINES, "--output", TMP .. "/out.jsonl", "--quiet" },
    { "line 2: malformed JSON", "line 3: token 999999", "line 4: unknown field 'bogus'", "line 5:",
      "my stage broke" } },
  { { "chat", "--model", NOPE }, { NOPE } },
  { { "chat", "--model", DEMO, "--load", NOPE }, { "--load", NOPE } },
  { { "chat", "--model", DEMO, "--max-tokens", "-5" }, { "--max-tokens", "'-5'" } },
}

describe("error messages", function()
  for _, c in ipairs(CASES) do
    local label = table.concat(c[1], " "):gsub(TMP, "TMP"):gsub(os.getenv("TIDE_TEST_TMP") or "/tmp", "TMP")
    it("tide " .. label, function()
      local out, rc = run(c[1])
      assert.is_not.equals(0, rc, "should fail:\n" .. out)
      clean(out, label)
      for _, want in ipairs(c[2]) do
        assert.truthy(out:find(want, 1, true), label .. ": the message should mention " .. want .. ":\n" .. out)
      end
    end)
  end

  it("batch writes clean error records too", function()
    local text = assert(io.open(TMP .. "/out.jsonl")):read("*a")
    clean(text, "results file")
    assert.truthy(text:find('"line":5', 1, true), text)
  end)

  it("chat commands and replies fail without internals", function()
    local input = write("chat_in.txt", table.concat({ "/set temp warm", "/set colour 1", "/sampler " .. NOPE .. ".lua",
      "/load " .. NOPE, "/save " .. NOPE .. "/x.tsess", "/inspect 1 2 3 x", "/sampler " .. RAISE, "hello", "/quit" },
      "\n") .. "\n")
    local out, rc = sh(q(EXE) .. " chat --model " .. q(DEMO) .. " --max-tokens 2 < " .. q(input))
    assert.equals(0, rc, out)
    clean(out, "chat")
    for _, want in ipairs({ "/set temp: expected a number, got 'warm'", "unknown setting 'colour'", NOPE .. ".lua",
      "[load failed: " .. NOPE, "[save failed:", "[usage: /inspect", "[sampling failed:", "my stage broke" }) do
      assert.truthy(out:find(want, 1, true), "chat should say " .. want .. ":\n" .. out)
    end
  end)

  it("the REPL shows the user's frames and hides tide's", function()
    local input = write("repl_in.txt", 'tide.engine(5)\nx = tide.zeros("nine")\nprint("still here")\n')
    local out = sh(q(EXE) .. " < " .. q(input))
    assert.truthy(out:find("stdin:1: tide.engine(model, opts): a model (tide.model) expected", 1, true), out)
    assert.truthy(out:find("unknown dtype 'nine'", 1, true), out)
    assert.truthy(out:find("frames inside tide", 1, true), out)
    assert.truthy(out:find("still here", 1, true), out)
    assert.is_nil(out:find("lua/tide/", 1, true), out)
    -- TIDE_TRACEBACK=1: every frame
    out = sh("TIDE_TRACEBACK=1 " .. q(EXE) .. " < " .. q(input))
    assert.truthy(out:find("lua/tide/engine.lua:", 1, true), out)
  end)

  it("-v and TIDE_TRACEBACK=1 bring the traceback back", function()
    -- a command whose code raises a plain Lua error deep inside
    local dir = TMP .. "/cmds"
    os.execute("mkdir -p " .. q(dir .. "/tide/cli"))
    write("cmds/tide/cli/boom.lua", [[
local function deep() local t = nil; return t.field end
return { summary = "fails", usage = "usage: tide boom", run = function(argv)
  require("tide.cli.args").parse(argv, {}, "boom")
  local v = deep()
  return v
end }
]])
    local env = "LUA_PATH=" .. q(dir .. "/?.lua;;") .. " "
    local out, rc = run({ "boom" }, env)
    assert.equals(1, rc)
    assert.matches("^tide boom: .-attempt to index local 't'", out)
    assert.is_nil(out:find("stack traceback", 1, true), out)
    local ways = { { { "boom", "-v" }, "" }, { { "boom", "--verbose" }, "" }, { { "boom" }, "TIDE_TRACEBACK=1 " } }
    for _, v in ipairs(ways) do
      out, rc = run(v[1], env .. v[2])
      assert.equals(1, rc)
      assert.truthy(out:find("stack traceback", 1, true), out)
      assert.truthy(out:find("boom.lua:1: in ", 1, true), out)
    end
  end)
end)

describe("--help", function()
  local names = require("tide.cli").commands()
  it("lists the subcommands", function() assert.truthy(#names >= 8) end)
  for _, name in ipairs(names) do
    it("tide " .. name .. " --help and -h print the usage", function()
      for _, flag in ipairs({ "--help", "-h" }) do
        local out, rc = run({ name, flag })
        assert.equals(0, rc, out)
        assert.matches("^usage: tide " .. name:gsub("%p", "%%%0"), out)
        assert.is_nil(out:find("unknown option", 1, true), out)
      end
      -- before anything else is looked at
      local out, rc = run({ name, "--help", "--no-such-option" })
      assert.equals(0, rc, out)
    end)
  end
end)

describe("the default model", function()
  it("generate, chat and sample use it and say so", function()
    local env = "TIDE_MODEL=" .. q(TINY) .. " "
    local out, rc = run({ "generate", "--tokens", "1,2", "--max-tokens", "2", "--seed", "1" }, env)
    assert.equals(0, rc, out)
    assert.truthy(out:find("using the default model " .. TINY, 1, true), out)
    out, rc = run({ "sample", "--tokens", "1,2", "--n", "2" }, env)
    assert.equals(0, rc, out)
    assert.truthy(out:find("using the default model " .. TINY, 1, true), out)
    env = "TIDE_MODEL=" .. q(DEMO) .. " "
    out, rc = run({ "chat", "--max-tokens", "2" }, env)
    assert.equals(0, rc, out)
    assert.truthy(out:find("using the default model " .. DEMO, 1, true), out)
  end)

  it("tide.model() loads it", function()
    local out, rc = sh("TIDE_MODEL=" .. q(TINY) .. " " .. q(EXE) .. " -e " ..
      q("local m = assert(tide.model()); io.write(m.vocab_size)"))
    assert.equals(0, rc, out)
    assert.truthy(out:find("using the default model " .. TINY, 1, true), out)
    assert.truthy(out:find("1024$"), out)
  end)
end)
