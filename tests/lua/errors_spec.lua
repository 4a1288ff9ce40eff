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
