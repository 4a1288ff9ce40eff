-- batch_cli_spec: `tide batch` as a subprocess on generated checkpoints. One
-- result line per request line in input order, bad lines reported with their
-- line numbers while the others run, results equal to the engine's in-process
-- results (ids, text, logprobs), a request too large for the cache refused,
-- a failing sampler ending only its line, the progress bar only when asked
-- (stderr is not a terminal here), stdin input, usage errors.
local tide = require("tide")
local cjson = require("cjson")
local tm = require("testmodels")

local V = 1024
local TINY = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
local DEMO = tm.get("demo1", { "--preset", "demo", "--seed", "2" })
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/batch_cli_spec"
os.execute("mkdir -p " .. tm.q(TMP))

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

local function read_lines(path)
  local out = {}
  for l in io.lines(path) do out[#out + 1] = cjson.decode(l) end
  return out
end

local function batch(args, stdin)
  local cmd = tm.q(tm.EXE) .. " batch " .. args .. " 2> " .. tm.q(TMP .. "/stderr")
  if stdin then cmd = cmd .. " < " .. tm.q(stdin) end
  local out, rc = tm.sh(cmd)
  local f = io.open(TMP .. "/stderr", "rb")
  local err = f and f:read("*a") or ""
  if f then f:close() end
  return out, rc, err
end

-- what the engine gives in-process for the same request
local function expected(model, req)
  local eng = tide.engine(model, { budget = 16 })
  local sampler = assert(require("tide.sampling").from_options(req.opts or {}, { tokenizer = model.tokenizer }))
  local h = assert(eng:submit{ tokens = req.tokens, prompt = req.prompt, max_tokens = req.max_tokens, seed = req.seed,
    stop = req.stop, logprobs = req.logprobs, sampler = sampler })
  eng:run()
  return h:result()
end

describe("tide batch", function()
  local model = assert(tide.model(TINY, { max_tokens = 16, tokenizer = false }))
  local P1, P2, P3 = tm.tokens(40, V, 1), tm.tokens(7, V, 2), tm.tokens(90, V, 3)
  local bad_sampler = write(TMP .. "/bad_sampler.lua", [[
local n = 0
return sampling.chain{ function() n = n + 1; if n == 3 then error("sampler failed on purpose") end end,
                       sampling.dist() }
]])
  local input = write(TMP .. "/requests.jsonl", table.concat({
    cjson.encode({ tokens = P1, max_tokens = 9, seed = 11, id = "first", logprobs = 2 }),
    cjson.encode({ tokens = P2, max_tokens = 6, seed = 12, temp = 0, priority = 3 }),
    '{"tokens": [1, 2, 3], "max_tokens": 4,,}',
    "",
    cjson.encode({ tokens = { 5, 6, V + 5 }, max_tokens = 4 }),
    cjson.encode({ tokens = { 5, 6 }, max_tokens = 4, temperature = 0.5 }),
    cjson.encode({ tokens = tm.tokens(300, V, 4), max_tokens = 300 }),
    cjson.encode({ tokens = P3, max_tokens = 12, seed = 13, top_k = 5, temp = 1.3 }),
    cjson.encode({ tokens = P2, max_tokens = 8, seed = 14, sampler = bad_sampler, id = 7 }),
    cjson.encode({ prompt = 3 }),
  }, "\n") .. "\n")

  it("writes one result per request line, in input order, with errors by line number", function()
    local _, rc, err = batch(table.concat({ "--model", tm.q(TINY), "--input", tm.q(input), "--output",
      tm.q(TMP .. "/out.jsonl"), "--budget 16 --max-running 3 --cache-pages 2 --policy fair" }, " "))
    assert.equals(1, rc, "some lines failed: exit status 1\n" .. err)
    local res = read_lines(TMP .. "/out.jsonl")
    assert.equals(9, #res, "blank lines are not requests")
    local lines = {}
    for i, r in ipairs(res) do lines[i] = r.line end
    assert.same({ 1, 2, 3, 5, 6, 7, 8, 9, 10 }, lines)
    -- the good ones equal the engine's own results
    local want1 = expected(model, { tokens = P1, max_tokens = 9, seed = 11, logprobs = 2 })
    assert.equals("first", res[1].id)
    assert.same(want1.tokens, res[1].tokens)
    assert.equals(want1.finish_reason, res[1].finish_reason)
    assert.equals(9, res[1].completion_tokens)
    assert.equals(40, res[1].prompt_tokens)
    assert.is_true(res[1].ttft > 0 and res[1].time >= res[1].ttft and res[1].tokens_per_second > 0)
    assert.equals(9, #res[1].logprobs)
    for k, e in ipairs(res[1].logprobs) do
      assert.equals(want1.tokens[k], e.token)
      assert.is_true(math.abs(e.logprob - want1.logprobs[k].raw_logprob) < 1e-5)
      assert.equals(2, #e.top)
    end
    assert.same(expected(model, { tokens = P2, max_tokens = 6, seed = 12, opts = { temp = 0 } }).tokens, res[2].tokens)
    assert.same(expected(model, { tokens = P3, max_tokens = 12, seed = 13, opts = { top_k = 5, temp = 1.3 } }).tokens,
      res[7].tokens)
    -- the bad lines, each with its line number
    assert.truthy(res[3].error:find("^line 3: malformed JSON"), res[3].error)
    assert.equals("line 5: token 1029 at index 2 is outside the vocabulary (0..1023)", res[4].error)
    assert.equals("line 6: unknown field 'temperature'", res[5].error)
    assert.truthy(res[6].error:find("^line 7: request of 600 positions .* more than the whole cache"), res[6].error)
    assert.truthy(res[8].error:find("sampler failed on purpose"), res[8].error)
    assert.equals(7, res[8].id)
    assert.equals(2, #res[8].tokens, "the failing request keeps what it generated")
    assert.equals("line 10: field 'prompt' must be a string", res[9].error)
    for _, k in ipairs({ 3, 5, 6, 7, 9, 10 }) do assert.truthy(err:find("line " .. k .. ": "), err) end
    assert.truthy(err:find("tide batch: 9 requests %(6 failed%)"), err)
    assert.falsy(err:find("\r", 1, true), "no progress bar when stderr is not a terminal")
  end)

  it("reads stdin, writes stdout, takes a policy file and draws the bar when asked", function()
    local good = write(TMP .. "/good.jsonl", cjson.encode({ tokens = P2, max_tokens = 5, seed = 1 }) .. "\n"
      .. cjson.encode({ tokens = P1, max_tokens = 3, seed = 2, stop = { 17 } }) .. "\n")
    local pol = write(TMP .. "/lifo.lua", [[
return { name = "lifo", schedule = function(view)
  local plan = view:plan()
  for i = #view.running, 1, -1 do plan:add(view.running[i], view.running[i].pending) end
  for i = #view.waiting, 1, -1 do plan:add(view.waiting[i], view.waiting[i].pending) end
  return plan
end }
]])
    local out, rc, err = batch(table.concat({ "--model", tm.q(TINY), "--input - --budget 16 --progress --threads 1",
      "--policy", tm.q(pol) }, " "), good)
    assert.equals(0, rc, err)
    local res = {}
    for l in out:gmatch("[^\n]+") do res[#res + 1] = cjson.decode(l) end
    assert.equals(2, #res)
    assert.same(expected(model, { tokens = P2, max_tokens = 5, seed = 1 }).tokens, res[1].tokens)
    assert.same(expected(model, { tokens = P1, max_tokens = 3, seed = 2, stop = { 17 } }).tokens, res[2].tokens)
    assert.truthy(err:find("batch %[#+%] 2/2 done"), err)
  end)

  it("writes text with a tokenizer and stops at stop strings", function()
    local dm = assert(tide.model(DEMO, { max_tokens = 16, cache = { context = 512, max_seqs = 4 } }))
    local free = expected(dm, { prompt = "Hello there", max_tokens = 10, seed = 3 })
    local stop = free.text:sub(4, 5)
    local f = write(TMP .. "/text.jsonl", cjson.encode({ prompt = "Hello there", max_tokens = 10, seed = 3 }) .. "\n"
      .. cjson.encode({ prompt = "Hello there", max_tokens = 10, seed = 3, stop = stop }) .. "\n")
    local _, rc, err = batch(table.concat({ "--model", tm.q(DEMO), "--input", tm.q(f), "--output",
      tm.q(TMP .. "/text_out.jsonl"), "--budget 16 --context 512 --quiet" }, " "))
    assert.equals(0, rc, err)
    assert.equals("", err, "--quiet: nothing on stderr")
    local res = read_lines(TMP .. "/text_out.jsonl")
    assert.equals(free.text, res[1].text)
    assert.same(free.tokens, res[1].tokens)
    assert.equals("stop", res[2].finish_reason)
    assert.equals(stop, res[2].stop_string)
    assert.equals(free.text:sub(1, (free.text:find(stop, 1, true)) - 1), res[2].text)
    dm:close()
  end)

  it("reports usage errors and unreadable inputs", function()
    local _, rc, err = batch("--model " .. tm.q(TINY))
    assert.equals(2, rc)
    assert.truthy(err:find("missing required option %-%-input"), err)
    _, rc, err = batch("--model " .. tm.q(TINY) .. " --input /nonexistent/x.jsonl")
    assert.equals(1, rc)
    assert.truthy(err:find("cannot open /nonexistent/x.jsonl"), err)
    _, rc, err = batch("--model " .. tm.q(TINY) .. " --input " .. tm.q(input) .. " --policy nope")
    assert.equals(1, rc)
    assert.truthy(err:find("unknown policy 'nope'"), err)
    _, rc, err = batch("--model " .. tm.q(TINY) .. " --input " .. tm.q(input) .. " --budget 0")
    assert.equals(2, rc)
    assert.truthy(err:find("%-%-budget must be an integer >= 1"), err)
  end)
end)
