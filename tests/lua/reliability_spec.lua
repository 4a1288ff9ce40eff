-- reliability_spec: nothing is lost on a crash or a kill.
--  * A session save killed (SIGKILL) at random moments, many of them in the
--    middle of writing, leaves the previous file or the new one, and it
--    loads with the tokens that file had.
--  * `tide batch` killed in the middle of a run leaves complete result
--    lines only; `--resume` keeps them, drops a cut last line, runs the rest,
--    and the file ends equal to an uninterrupted run's (timings aside).
--  * A short soak (scripts/soak.lua): every way a request can end, the
--    cache and the C allocation counters back to their baseline.
local tide = require("tide")
local cjson = require("cjson")
local ffi = require("ffi")
local tm = require("testmodels")

pcall(ffi.cdef, "int usleep(unsigned int usec);")

local V = 1024
local TINY = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/reliability_spec"
os.execute("rm -rf " .. tm.q(TMP) .. " && mkdir -p " .. tm.q(TMP))

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local t = f:read("*a")
  f:close()
  return t
end

local function exists(path) return read(path) ~= nil end

-- start a command in the background: its pid
local function spawn(cmd, log)
  local p = io.popen(cmd .. " > " .. tm.q(log) .. " 2>&1 & echo $!")
  local pid = tonumber(p:read("*l"))
  p:close()
  assert(pid, "no pid for " .. cmd)
  return pid
end

local function alive(pid) return os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0 end

local function kill9(pid)
  os.execute("kill -9 " .. pid .. " 2>/dev/null")
  -- the shell that started it is gone, so init reaps it; wait until it is
  for _ = 1, 6000 do
    if not alive(pid) then return end
    ffi.C.usleep(10000)
  end
  error("process " .. pid .. " survived SIGKILL")
end

-- wait (no time limit that a slow machine could hit: the condition or the
-- process's exit ends the wait) until cond() or the process is gone
local function wait_for(pid, cond)
  while not cond() do
    if not alive(pid) then return cond() end
    ffi.C.usleep(20000)
  end
  return true
end

local function tmp_files(dir, base)
  local out = {}
  local p = io.popen("ls -1 " .. tm.q(dir))
  for l in p:lines() do
    if l:sub(1, #base + 5) == base .. ".tmp-" then out[#out + 1] = dir .. "/" .. l end
  end
  p:close()
  return out
end

local CACHE = { context = 512, max_seqs = 2 }

describe("nothing lost on a kill", function()
  it("a session save killed at random moments leaves the old file or the new one, loadable", function()
    local child = write(TMP .. "/saver.lua", [[
local tide = require("tide")
local dir, path, ready = arg[1], arg[2], arg[3]
local m = assert(tide.model(dir, { max_tokens = 64, tokenizer = false, cache = { context = 512, max_seqs = 2 } }))
local s = m:session{ seed = 1, print = false, sampler = { temp = 0 } }
local toks = {}
for i = 1, 64 do toks[i] = (i * 7) % 1024 end
s:append(toks)
local n = 0
while true do
  assert(s:save(path))
  n = n + 1
  if n == 1 then local f = io.open(ready, "w") f:write("1") f:close() end
  -- a new token every 8 saves: the loop spends its time saving
  if n % 8 == 0 then s:append({ (n / 8 * 13) % 1024 }) end
end
]])
    local model = assert(tide.model(TINY, { max_tokens = 64, tokenizer = false, cache = CACHE }))
    local path, ready = TMP .. "/saved.tsess", TMP .. "/ready"
    math.randomseed(7)
    local kills, mid_write = 0, 0
    local seen, dead = {}, {}
    while kills < 40 and (kills < 6 or mid_write < 3) do
      os.remove(path)
      os.remove(ready)
      local pid = spawn(table.concat({ tm.q(tm.EXE), tm.q(child), tm.q(TINY), tm.q(path), tm.q(ready) }, " "),
        TMP .. "/saver.log")
      assert.is_true(wait_for(pid, function() return exists(ready) end),
        "the saver died: " .. (read(TMP .. "/saver.log") or ""))
      ffi.C.usleep(math.random(0, 400000))
      kill9(pid)
      kills = kills + 1
      -- a kill in the middle of a save leaves its PATH.tmp-PID (kept: the
      -- next save cleans them up, checked below)
      dead[#dead + 1] = pid
      for _, t in ipairs(tmp_files(TMP, "saved.tsess")) do
        if not seen[t] then seen[t], mid_write = true, mid_write + 1 end
      end
      -- the file is a whole save: it loads, with the tokens of that save
      local s, err = tide.session_load(model, path, { print = false })
      assert.is_truthy(s, err)
      local toks = s:tokens()
      assert.is_true(#toks >= 64, "tokens: " .. #toks)
      for i = 1, 64 do assert.equals((i * 7) % 1024, toks[i]) end
      for k = 1, #toks - 64 do assert.equals((k * 13) % 1024, toks[64 + k]) end
      s:close()
    end
    -- the kills did land in the middle of writes (else this proved nothing)
    assert.is_true(mid_write >= 3, string.format("only %d of %d kills hit a save in progress", mid_write, kills))

    -- the next save of that name removes the killed savers' temporary
    -- files once they are a minute old, and nothing else: not a live
    -- process's, not a fresh one, not another name's, not a non-PID suffix
    -- (a saver started more than a minute after a kill may have cleaned up
    -- already: then a killed saver's file is made here)
    local stale = tmp_files(TMP, "saved.tsess")
    if #stale == 0 then stale[1] = write(path .. ".tmp-" .. dead[1], "a killed saver's") end
    local sleeper = spawn("sleep 600", TMP .. "/sleep.log")
    local live = write(path .. ".tmp-" .. sleeper, "a live writer's")
    local dead_pid = stale[1]:match("(%d+)$")
    local other = write(TMP .. "/other.tsess.tmp-" .. dead_pid, "another name's")
    local word = write(path .. ".tmp-x" .. dead_pid, "not a PID")
    local old = table.concat({ live, other, word }, "' '")
    for _, f in ipairs(stale) do old = old .. "' '" .. f end
    os.execute("touch -d '2 minutes ago' '" .. old .. "'")
    local fresh_pid = tonumber(dead_pid) + 1
    while alive(fresh_pid) do fresh_pid = fresh_pid + 1 end
    local fresh = write(path .. ".tmp-" .. fresh_pid, "killed a moment ago")
    local s = model:session{ seed = 1, print = false }
    s:append({ 1, 2, 3 })
    assert.is_truthy(s:save(path))
    s:close()
    for _, f in ipairs(stale) do assert.is_false(exists(f), f .. " is still there") end
    for _, f in ipairs({ live, other, word, fresh }) do assert.is_true(exists(f), f .. " was removed") end
    os.execute("kill " .. sleeper .. " 2>/dev/null")
    for _, f in ipairs({ live, other, word, fresh }) do os.remove(f) end
    model:close()
  end)

  describe("tide batch --resume", function()
    local P = {}
    local lines = {}
    for i = 1, 36 do
      P[i] = tm.tokens(5 + (i * 7) % 40, V, 100 + i)
      lines[i] = cjson.encode({ tokens = P[i], max_tokens = 4 + i % 9, seed = 1000 + i, id = i,
        temp = i % 3 == 0 and 0 or 0.9, top_k = 40 })
    end
    lines[10] = '{"tokens": [1, 2], "max_tokens": 3,,}'   -- an error line is a result too
    local input = write(TMP .. "/requests.jsonl", table.concat(lines, "\n") .. "\n")
    local base = table.concat({ tm.q(tm.EXE), "batch --model", tm.q(TINY), "--input", tm.q(input),
      "--budget 16 --max-running 2 --threads 1 --output" }, " ")

    -- the result lines without what depends on timing or on batch composition
    local function results(path)
      local out = {}
      for l in (read(path) or ""):gmatch("([^\n]*)\n") do
        local r = cjson.decode(l)
        r.ttft, r.time, r.tokens_per_second, r.preemptions = nil, nil, nil, nil
        out[#out + 1] = r
      end
      return out
    end

    local ref_path = TMP .. "/ref.jsonl"
    local _, rc = tm.sh(base .. " " .. tm.q(ref_path))
    assert.equals(1, rc, "line 10 fails")
    local ref = results(ref_path)
    assert.equals(36, #ref)

    it("continues a killed run where it stopped; the result equals an uninterrupted run", function()
      local out = TMP .. "/killed.jsonl"
      os.remove(out)
      local pid = spawn(base .. " " .. tm.q(out), TMP .. "/batch.log")
      local function nlines() local _, n = (read(out) or ""):gsub("\n", "") return n end
      wait_for(pid, function() return nlines() >= 8 end)
      kill9(pid)
      local text = read(out) or ""
      local done = select(2, text:gsub("\n", ""))
      assert.is_true(done >= 8 and done < 36, "the kill came at " .. done .. " of 36 lines")
      -- complete lines only (flushed whole), in input order
      assert.equals("\n", text:sub(-1))
      -- as if the kill had cut the next line in the middle
      write(out, text .. '{"line": 40, "id": 3')
      local o2, rc2 = tm.sh(base .. " " .. tm.q(out) .. " --resume")
      assert.equals(1, rc2, "the whole job's status: line 10 failed\n" .. o2)
      assert.truthy(o2:find(done .. " request lines already had results", 1, true), o2)
      assert.truthy(o2:find("tide batch: " .. (36 - done) .. " requests", 1, true), o2)
      assert.same(ref, results(out))
      -- a finished file: nothing left to run, nothing changed
      local before = read(out)
      local o3, rc3 = tm.sh(base .. " " .. tm.q(out) .. " --resume")
      assert.equals(1, rc3, o3)
      assert.truthy(o3:find("36 request lines already had results in " .. out .. " (1 failed)", 1, true), o3)
      assert.truthy(o3:find("tide batch: 0 requests (0 failed)", 1, true), o3)
      assert.equals(before, read(out))
    end)

    it("refuses --resume without an output file and an output that is not a result file", function()
      local o1, rc1 = tm.sh(table.concat({ tm.q(tm.EXE), "batch --model", tm.q(TINY), "--input", tm.q(input),
        "--resume" }, " "))
      assert.equals(2, rc1)
      assert.truthy(o1:find("--resume needs --output FILE", 1, true), o1)
      local junk = write(TMP .. "/junk.jsonl", '{"line": 1}\nhello\n')
      local o2, rc2 = tm.sh(base .. " " .. tm.q(junk) .. " --resume")
      assert.equals(1, rc2)
      assert.truthy(o2:find("junk.jsonl line 2 is not a tide batch result", 1, true), o2)
      assert.equals('{"line": 1}\nhello\n', read(junk), "left as it was")
    end)
  end)

  it("a short soak: every way a request ends, the cache and the allocation counters back to baseline", function()
    local dir = tm.get("soak", { "--preset", "tiny", "--set", "n_routed_experts=8", "--set", "num_experts_per_tok=2" })
    local out, rc = tm.sh(table.concat({ tm.q(tm.EXE), tm.q(tm.ROOT .. "/scripts/soak.lua"), "--model", tm.q(dir),
      "--requests 120 --every 50" }, " "))
    assert.equals(0, rc, out)
    assert.truthy(out:find("soak: 120 requests in", 1, true), out)
  end)
end)
