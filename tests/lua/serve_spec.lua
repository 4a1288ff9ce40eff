-- serve_spec: `tide serve` as a subprocess on loopback (a random free port),
-- on the generated demo checkpoint (DeepSeek's tokenizer). Clients are Node
-- scripts (tests/js/serve_client.js): the official `openai` npm client for
-- chat/completions, streamed and not, logprobs and usage; 16 concurrent
-- streams with different seeds, each equal to the same request run alone by
-- `tide batch`; a client dropping mid-stream (its blocks come back, the
-- other stream is unaffected); hostile input, each with its status while the
-- server keeps serving; SIGTERM ends the server with status 0.
local cjson = require("cjson")
local tm = require("testmodels")
local openai = require("tide.server.openai")

local DEMO = tm.get("demo1", { "--preset", "demo", "--seed", "2" })
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/serve_spec"
local KEY = "test-key-123"
local CONTEXT = 512
os.execute("rm -rf " .. tm.q(TMP) .. " && mkdir -p " .. tm.q(TMP .. "/samplers"))

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end
local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

write(TMP .. "/samplers/greedy_test.lua", "return sampling.chain{ sampling.greedy() }\n")

local NODE_OK
do
  local _, rc = tm.sh("node -e \"require('" .. tm.ROOT .. "/build-deps/node_modules/openai')\"")
  NODE_OK = rc == 0
end

-- start a server (files TMP/NAME.*): its pid and port; the shell records its exit status
local function start(name, extra, model)
  local base = TMP .. "/" .. name
  local pf, rcf = base .. ".port", base .. ".rc"
  os.remove(pf)
  os.remove(rcf)
  local cmd = string.format("%s serve --model %s --port 0 --port-file %s --api-key %s --sampler-dir %s "
    .. "--context %d --timeout 3 --max-body 262144 %s", tm.q(tm.EXE), tm.q(model or DEMO), tm.q(pf), KEY,
    tm.q(TMP .. "/samplers"), CONTEXT, extra)
  os.execute(string.format("sh -c '%s > %s 2>&1 & echo $! > %s; wait $!; echo $? > %s' > /dev/null 2>&1 &",
    cmd:gsub("'", "'\\''"), tm.q(base .. ".log"), tm.q(base .. ".pid"), tm.q(rcf)))
  for _ = 1, 600 do
    local p = read(pf)
    if p and tonumber(p) then return tonumber(read(base .. ".pid")), tonumber(p) end
    os.execute("sleep 0.1")
  end
  error("tide serve did not start: " .. tostring(read(base .. ".log")))
end

-- the exit status of server NAME, waiting up to `secs`
local function exit_status(name, secs)
  for _ = 1, secs * 10 do
    local rc = read(TMP .. "/" .. name .. ".rc")
    if rc and rc:match("%d") then return rc:match("%d+") end
    os.execute("sleep 0.1")
  end
end

local function client(mode, port, pid)
  local js = tm.q(tm.ROOT .. "/tests/js/serve_client.js")
  local out, rc = tm.sh(string.format("node %s %s %d %s %s", js, mode, port, KEY, tostring(pid or "")))
  local ok, r = pcall(cjson.decode, out:match("[^\n]*\n?$") or out)
  if not ok or rc ~= 0 then error("client " .. mode .. " failed (rc " .. tostring(rc) .. "): " .. out) end
  return r
end

-- what `tide batch` gives for the same requests (lines mapped by the server's own code)
local tok = require("tide.tokenizer").new(DEMO)
local ctx = { tokenizer = tok, vocab = 129280, context = CONTEXT, samplers = TMP .. "/samplers", defaults = {},
  sampler_cache = {} }
local function batch_tokens(cases)
  local names, lines = {}, {}
  for name, c in pairs(cases) do
    local body = {}
    for k, v in pairs(c.body) do if k ~= "stream" then body[k] = v end end
    local line, meta = (c.kind == "chat" and openai.chat_line or openai.completion_line)(body, ctx)
    assert(line, meta and meta.body and meta.body.error and meta.body.error.message)
    names[#names + 1] = name
    lines[#lines + 1] = cjson.encode(line)
  end
  write(TMP .. "/batch.jsonl", table.concat(lines, "\n") .. "\n")
  -- --max-running 1: each request runs alone
  local out, rc = tm.sh(string.format("%s batch --model %s --input %s --output %s --context %d --max-running 1 --quiet",
    tm.q(tm.EXE), tm.q(DEMO), tm.q(TMP .. "/batch.jsonl"), tm.q(TMP .. "/batch.out"), CONTEXT))
  assert(rc == 0, out)
  local res = {}
  local i = 0
  for l in io.lines(TMP .. "/batch.out") do
    i = i + 1
    res[names[i]] = cjson.decode(l)
  end
  return res
end

local function stream_ids(c)
  local ids, text, finish, usage = {}, {}, nil, nil
  for _, ch in ipairs(c.chunks) do
    if ch.usage ~= cjson.null and ch.usage then usage = ch.usage end
    local choice = ch.choices[1]
    if choice then
      for _, id in ipairs(choice.token_ids or {}) do ids[#ids + 1] = id end
      local t = choice.text or (choice.delta and choice.delta.content)
      if type(t) == "string" then text[#text + 1] = t end
      if choice.finish_reason ~= cjson.null then finish = choice.finish_reason end
    end
  end
  return ids, table.concat(text), finish, usage
end

-- POST a JSON body with curl: status, decoded body (or the raw text), raw text
local function post(port, path, body)
  local bf, of = TMP .. "/post.json", TMP .. "/post.out"
  write(bf, type(body) == "string" and body or cjson.encode(body))
  local code = tm.sh(string.format("curl -s -N -o %s -w '%%{http_code}' -H 'Authorization: Bearer %s' "
    .. "-H 'Content-Type: application/json' --data-binary @%s http://127.0.0.1:%d%s", tm.q(of), KEY, tm.q(bf), port,
    path))
  local text = read(of) or ""
  local ok, v = pcall(cjson.decode, text)
  return tonumber(code:match("%d+")), ok and v or text, text
end

local PID, PORT = start("main", "--parallel 16")

describe("tide serve", function()
  it("answers the openai client: chat and completions, streamed and not, logprobs, usage, 16 streams", function()
    assert(NODE_OK, "node or the openai npm package is missing" .. " (scripts/deps.sh installs both)")
    local r = client("openai", PORT)
    assert.is_nil(r.fatal)
    local want = batch_tokens(r.cases)
    -- non-streamed
    local chat = r.cases.chat.result
    assert.equal("chat.completion", chat.object)
    assert.same(want.chat.tokens, chat.choices[1].token_ids)
    assert.equal(want.chat.text, chat.choices[1].message.content)
    assert.equal("assistant", chat.choices[1].message.role)
    assert.equal("length", chat.choices[1].finish_reason)
    assert.same({ prompt_tokens = want.chat.prompt_tokens, completion_tokens = 5, total_tokens = want.chat.prompt_tokens
      + 5 }, chat.usage)
    local lp = chat.choices[1].logprobs.content
    assert.equal(5, #lp)
    for i, e in ipairs(lp) do
      assert.equal(want.chat.tokens[i], e.id)
      assert.near(want.chat.logprobs[i].logprob, e.logprob, 1e-5)
      assert.equal(2, #e.top_logprobs)
      assert.near(want.chat.logprobs[i].top[1].logprob, e.top_logprobs[1].logprob, 1e-5)
    end
    local comp = r.cases.completion.result
    assert.equal("text_completion", comp.object)
    assert.same(want.completion.tokens, comp.choices[1].token_ids)
    assert.equal(want.completion.text, comp.choices[1].text)
    assert.equal(5, #comp.choices[1].logprobs.tokens)
    assert.equal(5, #comp.choices[1].logprobs.token_logprobs)
    -- streamed
    for _, name in ipairs({ "chat_stream", "completion_stream" }) do
      local ids, text, finish, usage = stream_ids(r.cases[name])
      assert.same(want[name].tokens, ids)
      assert.equal(want[name].text, text)
      assert.equal("length", finish)
      if name == "chat_stream" then
        assert.same({ prompt_tokens = want[name].prompt_tokens, completion_tokens = 5,
          total_tokens = want[name].prompt_tokens + 5 }, usage)
      end
    end
    -- 16 concurrent streams, each equal to the request alone
    local distinct = {}
    for i = 0, 15 do
      local name = "many" .. i
      local ids = stream_ids(r.cases[name])
      assert.same(want[name].tokens, ids)
      distinct[table.concat(ids, ",")] = true
    end
    local n = 0
    for _ in pairs(distinct) do n = n + 1 end
    assert.is_true(n >= 8, "different seeds give different streams")
    assert.equal("demo1", r.models[1].id)
  end)

  it("cancels a request whose client leaves mid-stream and frees its blocks; the other stream is unaffected", function()
    assert(NODE_OK, "node is missing" .. " (scripts/deps.sh installs both)")
    local r = client("drop", PORT)
    assert.is_nil(r.fatal)
    assert.is_true(r.dropped_after_chunks >= 2)
    assert.equal(0, r.metrics.tide_requests_running)
    assert.equal(0, r.metrics['tide_cache_swa_blocks{state="used"}'])
    assert.equal((r.before.tide_requests_cancelled_total or 0) + 1, r.metrics.tide_requests_cancelled_total)
    assert.is_true(r.freed_ms < 10000)
    -- B as tide batch gives it
    local ids = {}
    assert.equal(200, r.b.status)
    assert.equal("[DONE]", r.b.events[#r.b.events])
    for i = 1, #r.b.events - 1 do
      local ev = cjson.decode(r.b.events[i])
      for _, id in ipairs(ev.choices[1] and ev.choices[1].token_ids or {}) do ids[#ids + 1] = id end
    end
    local want = batch_tokens({ b = { kind = "completion", body = r.b.body } })
    assert.same(want.b.tokens, ids)
    -- the dropped request generated far less than its 400 tokens
    assert.is_true(r.metrics.tide_generation_tokens_total - (r.before.tide_generation_tokens_total or 0) < 100)
  end)

  it("gives each kind of bad input its status and error object, and keeps serving", function()
    assert(NODE_OK, "node is missing" .. " (scripts/deps.sh installs both)")
    local r = client("bad", PORT)
    assert.is_nil(r.fatal)
    local function check(name, status, code)
      local e = r[name]
      assert.is_table(e, name)
      assert.equal(status, e.status, name)
      assert.is_table(e.error, name .. ": an OpenAI error object")
      assert.is_string(e.error.message, name)
      assert.is_string(e.error.type, name)
      if code then assert.equal(code, e.error.code, name) end
    end
    check("malformed", 400, "invalid_json")
    check("not_object", 400, "invalid_json")
    check("wrong_type", 400)
    check("wrong_type2", 400, "invalid_type")
    check("unknown_field", 400, "unknown_field")
    check("unknown_msg_field", 400, "unknown_field")
    check("too_long", 400, "context_length_exceeded")
    assert.matches("512", r.too_long.error.message)
    assert.matches("100000", r.too_long.error.message)
    check("ids_out_of_range", 400, "invalid_token")
    check("ids_negative", 400, "invalid_token")
    check("detok_out_of_range", 400, "invalid_token")
    check("bias_out_of_range", 400)
    check("invalid_utf8", 400, "invalid_utf8")
    assert.equal(400, r.lone_surrogate.status)
    check("sampler_path", 400, "invalid_sampler")
    check("sampler_abs", 400, "invalid_sampler")
    check("sampler_missing", 400, "invalid_sampler")
    assert.equal(200, r.sampler_ok.status)
    check("no_key", 401, "invalid_api_key")
    check("wrong_key", 401, "invalid_api_key")
    assert.equal(200, r.health_no_key.status)
    check("not_found", 404)
    check("wrong_method", 405)
    assert.equal(413, r.huge_declared.status)
    assert.equal("body_too_large", cjson.decode(r.huge_declared.body).error.code)
    assert.equal(413, r.huge_chunked.status)
    assert.equal(200, r.during_loris)
    -- headers that stop coming: closed after the 3 s idle timeout
    assert.equal(3, r.loris.parts_sent)
    assert.is_true(r.loris.closed_ms > 3000 and r.loris.closed_ms < 12000, "closed after the timeout")
    assert.is_true(r.garbage.closed)
    assert.is_true(r.nohttp.closed)
    assert.is_true(r.long_header.status == 431 or r.long_header.status == 413 or r.long_header.status == 400
      or r.long_header.closed)
    assert.equal(200, r.health_after)
    assert.equal(200, r.completion_after)
  end)

  it("stops on SIGTERM with status 0", function()
    os.execute("kill -TERM " .. PID)
    assert.equal("0", exit_status("main", 30), read(TMP .. "/main.log"))
    assert.matches("stopped", read(TMP .. "/main.log"))
  end)

  it("answers 503 + Retry-After when the queue is full; SIGTERM ends running streams within --shutdown", function()
    assert(NODE_OK, "node is missing" .. " (scripts/deps.sh installs both)")
    local pid, port = start("queue", "--parallel 1 --queue 1 --shutdown 1")
    local r = client("queue", port, pid)
    assert.is_nil(r.fatal)
    assert.equal(200, r.a_status)
    assert.equal(200, r.b_status)
    assert.equal(503, r.c.status)
    assert.equal("1", r.c.retry)
    assert.equal("queue_full", r.c.error.code)
    assert.is_true(r.a_tokens < 400)
    assert.is_true(r.a_ended_ms < 15000, "the running stream ended after the signal")
    assert.equal("0", exit_status("queue", 30), read(TMP .. "/queue.log"))
  end)

  it("takes a request's draft over --draft (0..4 or {max, policy}), reports its speculation, refuses bad values",
    function()
    -- the trained model has an MTP block; drafting never changes a token (docs/speculative.md)
    local trained = os.getenv("TIDE_TRAINED_MODEL") or (tm.ROOT .. "/models/tide-tiny-en")
    local pid, port = start("draft", "--parallel 4 --draft 2", trained)
    local function body(extra)
      local b = { prompt = "And the king said unto", max_tokens = 24, temperature = 0, return_token_ids = true }
      for k, v in pairs(extra) do b[k] = v end
      return b
    end
    local function ids(r) return r.choices[1].token_ids end
    local st, plain = post(port, "/v1/completions", body({ draft = 0 }))
    assert.equal(200, st)
    assert.is_nil(plain.usage.speculation, "draft 0: no drafting")
    local st2, def = post(port, "/v1/completions", body({}))
    assert.equal(200, st2)
    assert.same(ids(plain), ids(def))
    local sp = def.usage.speculation
    assert.equal(2, sp.max, "the server's --draft 2")
    assert.equal("fixed", sp.policy)
    assert.is_true(sp.drafted > 0 and sp.accepted > 0 and sp.accepted <= sp.drafted)
    assert.near(sp.accepted / sp.drafted, sp.acceptance, 1e-9)
    assert.is_true(sp.tokens_per_step > 1)
    local st3, obj = post(port, "/v1/completions", body({ draft = { max = 3, policy = "adaptive" } }))
    assert.equal(200, st3)
    assert.same(ids(plain), ids(obj))
    assert.equal(3, obj.usage.speculation.max)
    assert.equal("adaptive", obj.usage.speculation.policy)
    -- sampled: the same draws with and without drafts
    local _, s0 = post(port, "/v1/completions", body({ temperature = 0.8, seed = 7, draft = 0 }))
    local _, s4 = post(port, "/v1/completions", body({ temperature = 0.8, seed = 7, draft = 4 }))
    assert.same(ids(s0), ids(s4))
    assert.equal(4, s4.usage.speculation.max)
    -- the rejection rule: greedy the same ids; sampled its own draws, reported; a stateful chain refused
    local _, gr = post(port, "/v1/completions", body({ draft = { max = 2, accept = "rejection" } }))
    assert.same(ids(plain), ids(gr))
    local str, sr = post(port, "/v1/completions", body({ temperature = 0.8, seed = 7,
      draft = { max = 2, accept = "rejection" } }))
    assert.equal(200, str)
    assert.equal(24, #ids(sr))
    assert.equal("rejection", sr.usage.speculation.accept)
    local stm, em = post(port, "/v1/completions", body({ temperature = 0.8, mirostat = 2,
      draft = { max = 2, accept = "rejection" } }))
    assert.equal(400, stm)
    assert.matches("mirostat", em.error.message)
    -- chat
    local msgs = { { role = "user", content = "Who was the king?" } }
    local _, c0 = post(port, "/v1/chat/completions", { messages = msgs, max_tokens = 16, temperature = 0,
      return_token_ids = true, draft = 0 })
    local stc, c1 = post(port, "/v1/chat/completions", { messages = msgs, max_tokens = 16, temperature = 0,
      return_token_ids = true, draft = { max = 1 } })
    assert.equal(200, stc)
    assert.same(ids(c0), ids(c1))
    assert.equal(1, c1.usage.speculation.max)
    -- streamed: the usage chunk carries the figures
    local sts, _, text = post(port, "/v1/completions", body({ stream = true, stream_options = { include_usage = true },
      draft = 3 }))
    assert.equal(200, sts)
    local sids, usage = {}, nil
    for line in text:gmatch("data: ([^\n]+)") do
      if line ~= "[DONE]" then
        local ch = cjson.decode(line)
        if type(ch.usage) == "table" then usage = ch.usage end
        for _, id in ipairs(ch.choices[1] and ch.choices[1].token_ids or {}) do sids[#sids + 1] = id end
      end
    end
    assert.same(ids(plain), sids)
    assert.equal(3, usage.speculation.max)
    -- bad values: an OpenAI 400 naming the field, nothing runs
    for _, bad in ipairs({ 5, -1, 1.5, "2", true, { max = 2, policy = "/tmp/x.lua" }, { max = 2, what = 1 },
      { policy = "fixed" }, { max = 9 }, { 1 }, { max = 2, accept = "maybe" } }) do
      local stb, e = post(port, "/v1/completions", body({ draft = bad }))
      assert.equal(400, stb, cjson.encode(bad))
      assert.equal("draft", e.error.param, cjson.encode(bad))
      assert.equal("invalid_type", e.error.code)
      assert.matches("draft", e.error.message)
    end
    local stok, again = post(port, "/v1/completions", body({}))
    assert.equal(200, stok)
    assert.same(ids(plain), ids(again))
    -- the same request line through tide batch's mapping keeps the object
    local line = assert(openai.completion_line(body({ draft = { max = 2, policy = "adaptive" } }), ctx))
    local req = assert(require("tide.cli.batch").to_request(line, {}, {}, tok))
    assert.same({ max = 2, policy = "adaptive" }, req.draft)
    os.execute("kill -TERM " .. pid)
    assert.equal("0", exit_status("draft", 30), read(TMP .. "/draft.log"))
  end)
end)
