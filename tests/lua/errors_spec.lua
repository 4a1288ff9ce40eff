-- errors_spec: the rows of docs/errors.md that no other spec backs. Bad
-- sampler option strings, bad session files, bad request submissions: each
-- gets a message naming the input, and changes nothing (the model's cache
-- and tide's live allocations are as they were, the model still runs).
local tide = require("tide")
local sampling = require("tide.sampling")
local args = require("tide.cli.args")
local tm = require("testmodels")

local V = 1024
local TINY = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/errors_spec"
os.execute("rm -rf " .. tm.q(TMP) .. " && mkdir -p " .. tm.q(TMP))

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local t = f:read("*a")
  f:close()
  return t
end

-- the user-error message args.parse raises
local function parse_error(argv)
  local ok, e = pcall(args.parse, argv, sampling.options, "generate")
  assert.is_false(ok)
  assert.is_true(type(e) == "table" and e.tide_user_error, "a user error")
  return e.msg, e.status
end

describe("bad sampler options", function()
  it("are refused with the option named", function()
    local msg, status = parse_error({ "--temp", "hot" })
    assert.equals("option --temp expects a number, got 'hot'", msg)
    assert.equals(2, status)
    assert.equals("generate: unknown option --top-q", (parse_error({ "--top-q", "3" })))
    assert.equals("option --top-k needs a value", (parse_error({ "--top-k" })))
    local s, err = sampling.from_options({ mirostat = 3 })
    assert.is_nil(s)
    assert.equals("--mirostat must be 0, 1 or 2, got 3", err)
    s, err = sampling.from_options({ samplers = "top_k;warp" })
    assert.is_nil(s)
    assert.equals("--samplers: unknown stage 'warp'", err)
    s, err = sampling.from_options({ logit_bias = { "15043*2" } })
    assert.is_nil(s)
    assert.equals("--logit-bias: expected TOKEN+BIAS or TOKEN-BIAS, got '15043*2'", err)
    -- top-N lists: an integer up to sampling.MAX_TOP, so no option sizes a
    -- buffer of gigabytes (the sampler fuzzer found --n-probs 23e7)
    for _, v in ipairs({ 23e7, 2.5, -1 }) do
      local ok, e = pcall(sampling.state_options, { n_probs = v })
      assert.is_false(ok)
      assert.equals("--n-probs: expected an integer in 0..1048576, got " .. tostring(v), e)
    end
    assert.equals(1048576, sampling.state_options({ n_probs = 1048576 }).logprobs)
    local chain = assert(sampling.from_options({}))
    assert.has_error(function() chain:new_state({ logprobs = 2 ^ 40 }) end,
      "new_state: logprobs must be an integer in 0..1048576, got 1099511627776")
    assert.has_error(function() chain:new_state({ trace = true, trace_top = 1.5 }) end,
      "new_state: trace_top must be an integer in 0..1048576, got 1.5")
  end)

  it("from the command line: status 2 for a malformed option, 1 for a refused value", function()
    local out, rc = tm.sh(tm.q(tm.EXE) .. " sample --vocab 50 --n 1 --temp hot")
    assert.equals(2, rc, out)
    assert.truthy(out:find("option --temp expects a number, got 'hot'", 1, true), out)
    out, rc = tm.sh(tm.q(tm.EXE) .. " sample --vocab 50 --n 1 --samplers 'k;warp'")
    assert.equals(1, rc, out)
    assert.truthy(out:find("unknown stage 'warp'", 1, true), out)
  end)
end)

describe("bad tokenizer_config.json", function()
  -- a small byte-level BPE tokenizer (the fuzz seed) with bad configs
  local seed = read(tm.ROOT .. "/tests/fuzz/corpus/tokenizer_load/bytelevel_bpe")
  local json = seed:sub(1, seed:find("\0", 1, true) - 1)
  local function load_with(name, cfg)
    local dir = TMP .. "/tok_" .. name
    os.execute("mkdir -p " .. tm.q(dir))
    write(dir .. "/tokenizer.json", json)
    write(dir .. "/tokenizer_config.json", cfg)
    local before = tide.alloc_stats().live_allocs
    local t, err = tide.tokenizer(dir)
    if not t then assert.equals(before, tide.alloc_stats().live_allocs, "a refused file leaves nothing") end
    return t, err, dir
  end

  it("is refused naming the file and the field", function()
    local t, err = load_with("ok", '{"bos_token": "<|bos|>", "add_bos_token": true}')
    local dir
    assert.is_truthy(t, err)
    t:close()
    t, err, dir = load_with("malformed", '{"bos_token": ')
    assert.is_nil(t)
    assert.truthy(err:find(dir .. "/tokenizer_config.json", 1, true), err)
    t, err = load_with("oov", '{"bos_token": "<|nope|>"}')
    assert.is_nil(t)
    assert.truthy(err:find("field 'bos_token': token '<|nope|>' is not in the vocabulary", 1, true), err)
    t, err = load_with("nobos", '{"add_bos_token": true}')
    assert.is_nil(t)
    assert.truthy(err:find("'add_bos_token' is true but there is no bos_token", 1, true), err)
  end)
end)

describe("bad session files and requests", function()
  local model = assert(tide.model(TINY, { max_tokens = 32, tokenizer = false,
    cache = { context = 256, max_seqs = 2 } }))
  local good = TMP .. "/good.tsess"
  do
    local s = model:session{ seed = 1, print = false, sampler = { temp = 0 } }
    s:append(tm.tokens(6, V, 1))
    assert(s:save(good))
    s:close()
  end
  local data = read(good)

  local function state()
    collectgarbage()
    collectgarbage()
    local st = model:cache_stats()
    return { st.swa_free, st.pages_free, st.seqs, tonumber(tide.alloc_stats().live_allocs) }
  end

  -- the file is refused with a message naming it and containing `frag`,
  -- and nothing changed
  local function refused(path, frag)
    local before = state()
    local s, err = tide.session_load(model, path, { print = false })
    assert.is_nil(s)
    assert.truthy(err:find(path, 1, true), err)
    assert.truthy(err:find(frag, 1, true), err)
    assert.same(before, state())
  end

  it("session_load refuses what is not a whole session file of this model", function()
    refused(TMP .. "/missing.tsess", "No such file")
    refused(write(TMP .. "/text.tsess", "hello, I am not a session\n"), "session_load")
    refused(write(TMP .. "/truncated.tsess", data:sub(1, #data - 100)), "truncated")
    local plain = TMP .. "/plain.safetensors"
    assert(tide.save(plain, { x = tide.zeros({ 4 }) }))
    refused(plain, "is not a tide session file")
    -- a manifest that is not JSON, and one of another format version
    local function with_manifest(name, text, version)
      local t = tide.tensor({ string.byte(text, 1, -1) }, "u8")
      local p = TMP .. "/" .. name
      assert(tide.save(p, { manifest = t }, { format = "tide.session", version = version or "1" }))
      return p
    end
    refused(with_manifest("badjson.tsess", "{\"version\": 1,"), "bad manifest")
    refused(with_manifest("version.tsess", "{\"version\": 99}"), "format version 99")
    -- the good file still loads, and the model runs on
    local s = assert(tide.session_load(model, good, { print = false }))
    assert.equals(6, s:len())
    s:close()
  end)

  it("a submitted request with bad tokens, sizes or options raises and leaves the engine as it was", function()
    local eng = tide.engine(model, { budget = 16 })
    local before = state()
    assert.has_error(function() eng:submit{ tokens = {} } end, "submit: the prompt is empty")
    assert.has_error(function() eng:submit{ tokens = { 1, V } } end,
      "submit: token 1024 at index 1 is outside the vocabulary (0..1023)")
    assert.has_error(function() eng:submit{ tokens = { 1, 2.5 } } end)
    assert.has_error(function() eng:submit{ tokens = { 1 }, max_tokens = 0 } end,
      "submit: max_tokens must be an integer >= 1")
    assert.has_error(function() eng:submit{ tokens = { 1 }, colour = "red" } end, "submit: unknown field 'colour'")
    local h, err = eng:submit{ tokens = { 1 }, max_tokens = 100000 }
    assert.is_nil(h)
    assert.truthy(err:find("beyond the model's max_position_embeddings", 1, true)
      or err:find("more than the whole cache", 1, true), err)
    assert.equals(0, eng:active())
    assert.same(before, state())
    -- and it still runs a good one
    local ok = assert(eng:submit{ tokens = { 1, 2, 3 }, max_tokens = 2, seed = 1 })
    eng:run()
    assert.equals(2, #ok:result().tokens)
    eng:close()
  end)

  it("token ids given to the tokenizer-less CLI are checked", function()
    local out, rc = tm.sh(tm.q(tm.EXE) .. " logits --model " .. tm.q(TINY) .. " --tokens 0,5," .. V
      .. " --out " .. tm.q(TMP .. "/l.f32"))
    assert.are_not.equals(0, rc)
    assert.truthy(out:find(tostring(V), 1, true), out)
  end)
end)

-- (second part: what users read; subprocess sweep)
-- errors_spec: what users read when they get something wrong. Every
-- subcommand is run as a subprocess with bad input (a missing file, a bad
-- option value, a token outside the vocabulary, a bad batch line, a sampler
-- stage that raises, ...); the message must name the input and must not
-- show tide's internals (no ".lua:" position, no traceback) unless asked
-- for with -v or TIDE_TRACEBACK=1. Every subcommand prints its usage for
-- --help and -h; --max-tokens refuses what it cannot mean.
local q, sh, EXE = tm.q, tm.sh, tm.EXE

os.execute("mkdir -p " .. q(TMP))
local DEMO = tm.get("demo1", { "--preset", "demo", "--seed", "2" })
local NOPE = TMP .. "/no_such_thing"

local function put(name, text)
  local p = TMP .. "/" .. name
  local f = assert(io.open(p, "w"))
  f:write(text)
  f:close()
  return p
end

local RAISE = put("raise.lua", 'return sampling.chain{ function(c) error("my stage broke") end }\n')
local SYNTAX = put("syntax.lua", "return sampling.chain{ sampling.top_k(\n")
local FIVE = put("five.lua", "return 5\n")
local POLICY = put("policy.lua", 'return { name = "p", schedule = function(v) error("policy bug") end }\n')
local GARBAGE = put("garbage.safetensors", "this is not a checkpoint at all")
local LINES = put("requests.jsonl", table.concat({
  '{"tokens": [1, 2], "max_tokens": 2}',
  "{bad json",
  '{"tokens": [999999]}',
  '{"tokens": [1], "bogus": 1}',
  '{"tokens": [1], "sampler": "' .. RAISE .. '", "max_tokens": 2}',
}, "\n") .. "\n")

local function run(argv, env)
  local parts = { q(EXE) }
  for _, a in ipairs(argv) do parts[#parts + 1] = q(a) end
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
    local input = put("chat_in.txt", table.concat({ "/set temp warm", "/set colour 1", "/sampler " .. NOPE .. ".lua",
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
    local input = put("repl_in.txt", 'tide.engine(5)\nx = tide.zeros("nine")\nprint("still here")\n')
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
    put("cmds/tide/cli/boom.lua", [[
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
