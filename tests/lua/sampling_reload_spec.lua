-- sampling_reload_spec: sampler files. sampling.load runs a Lua file that
-- returns a chain; when the file changes the next token uses the new chain,
-- a broken edit keeps the previous one (reported once), per-request state
-- follows the chain where it can; `tide sample` takes the same flags and
-- --sampler FILE.
local tide = require("tide")
local sampling = require("tide.sampling")

local TMP = os.getenv("TIDE_TEST_TMP") or "/tmp"
local BUILD = os.getenv("TIDE_BUILD_DIR") or "./build"
local EXE = os.getenv("TIDE_EXE") or (BUILD .. "/tide")

local n_files = 0
local function fresh_path()
  n_files = n_files + 1
  return string.format("%s/sampler_%d_%d.lua", TMP, n_files, math.floor(tide.time() * 1e6) % 1000000)
end
local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end
local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.-)rc=(%d+)\n$")
  return body, tonumber(rc)
end

describe("sampler files", function()
  it("load a chain; the next token after an edit uses the new chain", function()
    local path = fresh_path()
    write(path, "return sampling.chain{ sampling.greedy() }\n")
    local errors = {}
    local s = assert(sampling.load(path, { on_error = function(m) errors[#errors + 1] = m end }))
    assert.equals("greedy", s:describe())
    assert.is_string(s.hash)
    local st = s:new_state{ seed = 1 }
    local logits = tide.tensor({ 0, 5, 1, 3 })
    assert.equals(1, (st:sample(logits)))
    assert.equals(1, (st:sample(logits)))
    -- an edit (the size changes too, so coarse mtimes cannot hide it)
    write(path, "-- ban the best token\n"
      .. "return sampling.chain{ sampling.logit_bias{[1] = -math.huge}, sampling.greedy() }\n")
    assert.equals(3, (st:sample(logits)))
    assert.equals(2, s.version)
    -- a broken edit: the previous chain stays, the error is reported once
    write(path, "return sampling.chain{ sampling.top_k( }")
    assert.equals(3, (st:sample(logits)))
    assert.equals(3, (st:sample(logits)))
    assert.equals(1, #errors)
    assert.matches("sampler file .*sampler_", errors[1])
    assert.matches("reload_error", "reload_error")   -- (the message is also kept on the sampler)
    assert.is_string(s.reload_error)
    -- an edit that raises while building the chain is a broken edit too
    write(path, "error('not today')\n-- " .. string.rep("x", 10))
    assert.equals(3, (st:sample(logits)))
    assert.equals(2, #errors)
    assert.matches("not today", errors[2])
    -- a plain list of stages is a chain; greedy through temperature 0
    write(path, "return { sampling.temperature(0) }\n")
    assert.equals(1, (st:sample(logits)))
    assert.is_nil(s.reload_error)
    -- the file disappears: keep going, report once
    os.remove(path)
    assert.equals(1, (st:sample(logits)))
    assert.equals(1, (st:sample(logits)))
    assert.equals(3, #errors)
  end)

  it("keeps per-request state where the chain allows", function()
    local path = fresh_path()
    write(path, "return sampling.chain{ sampling.penalties{last_n = 8, repeat_penalty = 100}, sampling.greedy() }\n")
    local s = assert(sampling.load(path, { on_error = function() end }))
    local st = s:new_state{ seed = 1 }
    local logits = tide.tensor({ 4, 3, 2, 1 })
    local a = st:sample(logits)
    st:accept(a)
    assert.equals(0, a)
    assert.equals(1, (st:sample(logits)))   -- 0 is penalised now
    -- a new chain: its penalties start from the request's history
    write(path, "return sampling.chain{ sampling.penalties{last_n = 4, repeat_penalty = 100}, "
      .. "sampling.mirostat_v2{tau = 2, eta = 0.5} }\n")
    local b = st:sample(logits)
    assert.are_not.equal(0, b)
    st:accept(b)
    local mu = st.ss[2].mu
    assert.are_not.equal(4, mu)
    -- mirostat at the same place in the next chain keeps its mu
    write(path, "return sampling.chain{ sampling.mirostat_v2{tau = 2, eta = 0.5} } -- " .. string.rep("y", 7))
    local _, info = st:sample(logits)
    assert.equals(3, s.version)
    -- carried over, then updated once by this token's surprise (a reset would start from 2 tau = 4)
    local surprise = -math.log(info.p) / math.log(2)
    assert.is_true(math.abs(st.ss[1].mu - (mu - 0.5 * (surprise - 2))) < 1e-9)
  end)

  it("reports a missing or broken file at load", function()
    local s, err = sampling.load(TMP .. "/no_such_sampler.lua")
    assert.is_nil(s)
    assert.matches("no_such_sampler%.lua: No such file", err)
    local path = fresh_path()
    write(path, "return 42")
    s, err = sampling.load(path)
    assert.is_nil(s)
    assert.matches("must return sampling.chain", err)
  end)

  it("checks at most once per interval", function()
    local path = fresh_path()
    write(path, "return { sampling.greedy() }")
    local s = assert(sampling.load(path, { interval = 3600 }))
    local st = s:new_state{ seed = 1 }
    local logits = tide.tensor({ 0, 2, 1 })
    assert.equals(1, (st:sample(logits)))
    write(path, "return { sampling.logit_bias{[1] = -math.huge}, sampling.greedy() }")
    assert.equals(1, (st:sample(logits)))
    s.reload.last = -math.huge   -- as if the interval had passed
    assert.equals(2, (st:sample(logits)))
  end)
end)

describe("tide sample", function()
  it("takes llama.cpp's flags and reproduces a seed", function()
    local out, rc = run(EXE .. " sample --vocab 2000 --n 6 --seed 9 --top-k 5 --temp 0.7")
    assert.equals(0, rc, out)
    assert.matches("sampler: top_k%(k = 5%)", out)
    local again = run(EXE .. " sample --vocab 2000 --n 6 --seed 9 --top-k 5 --temp 0.7")
    assert.equals(out, again)
    local greedy = run(EXE .. " sample --vocab 2000 --n 3 --temp 0 --seed 1")
    assert.matches("sampler: greedy", greedy)
    out, rc = run(EXE .. " sample --vocab 100 --top-k x")
    assert.equals(2, rc)
    assert.matches("expects a number", out)
  end)

  it("runs a sampler file and prints traces and logprobs", function()
    local path = fresh_path()
    write(path, "return sampling.chain{ sampling.top_k(3), sampling.dist() }")
    local out, rc = run(EXE .. " sample --vocab 500 --n 2 --seed 4 --trace --n-probs 2 --sampler " .. path)
    assert.equals(0, rc, out)
    assert.matches("sampler: top_k%(k = 3%) %-> dist", out)
    assert.matches("raw %-%d", out)
    assert.matches("top_k%s+500%s+3", out)
    out, rc = run(EXE .. " sample --sampler " .. TMP .. "/none.lua")
    assert.equals(1, rc)
    assert.matches("none%.lua: No such file", out)
  end)
end)
