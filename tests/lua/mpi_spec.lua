-- mpi_spec: expert parallelism over MPI (tide.mpi, docs/scale-out.md). The
-- same driver (mpi_driver.lua) runs as one process and under mpirun with 2,
-- 3 and 4 ranks on generated checkpoints; the outputs must be equal byte for
-- byte: logits in prefill, decode, chunked prefill and a mixed step; a
-- batched engine run that preempts; `tide generate` with a seed. Bad
-- placements are refused on every rank; a killed rank or one that stops
-- answering ends the run with a message naming it, within a bound.
local tm = require("testmodels")
local mpi = require("tide.mpi")

local EXE, ROOT, q = tm.EXE, tm.ROOT, tm.q
local MPIRUN = os.getenv("TIDE_MPIRUN") or ""
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/mpi"
os.execute("mkdir -p " .. q(TMP))
local DRIVER = ROOT .. "/tests/lua/mpi_driver.lua"
local DIR = tm.get("tiny1", { "--preset", "tiny", "--seed", "1" })

-- Open MPI as root, more ranks than cores, loopback only, 1 thread per rank
local ENV = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1"
  .. " TIDE_MPI_QUIET=1"

-- In a sanitizer build (make asan-test) the ranks keep every ASan/UBSan
-- check but the leak check: Open MPI's components, dlopen'd and closed
-- again, keep allocations past MPI_Finalize that LeakSanitizer cannot
-- attribute to a library (their frames are "<unknown module>"), and full
-- stacks make the ranks too slow. The one-process runs of the same driver
-- keep the leak check.
local RANK_ENV = ""
local asan = os.getenv("ASAN_OPTIONS")
if asan and asan ~= "" then RANK_ENV = "ASAN_OPTIONS=" .. q(asan .. ":detect_leaks=0") end

local function mpirun(n, args, env)
  assert(MPIRUN ~= "", "mpirun was not found at configure time (scripts/deps.sh installs openmpi-bin)")
  return string.format("%s %s %s timeout 300 %s -np %d --oversubscribe %s %s", ENV, RANK_ENV, env or "", q(MPIRUN), n,
    q(EXE), args)
end

local function read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function run(cmd)
  local out, rc = tm.sh(cmd)
  return out, rc
end

local single = {}
local function single_run(mode)
  if not single[mode] then
    local out = TMP .. "/" .. mode .. ".1"
    local o, rc = run(ENV .. " " .. q(EXE) .. " " .. q(DRIVER) .. " " .. mode .. " " .. q(DIR) .. " " .. q(out))
    assert(rc == 0, o)
    single[mode] = read(out)
  end
  return single[mode]
end

local function same_bytes(a, b, what)
  assert.equals(#a, #b, what .. ": sizes differ")
  if a ~= b then
    local i = 1
    while a:byte(i) == b:byte(i) do i = i + 1 end
    error(what .. ": first difference at byte " .. i, 2)
  end
end

describe("tide over MPI", function()
  it("declares the functions of tide_mpi.h to the FFI exactly", function()
    local h = read(ROOT .. "/engine/mpi/tide_mpi.h")
    local body = assert(h:match("TIDE_MPI_CDEF_BEGIN %*/(.-)/%* TIDE_MPI_CDEF_END"))
    local function norm(s)
      s = s:gsub("/%*.-%*/", ""):gsub("%s+", " ")
      return (s:gsub(" ?([;,(){}*]) ?", "%1"):gsub("^ ", ""):gsub(" $", ""))
    end
    assert.equals(norm(body), norm(mpi.cdef))
  end)

  it("gives the single-process logits bit for bit at 2, 3 and 4 ranks (prefill, decode, chunked, mixed step;"
    .. " contiguous, balanced by measured load, round-robin)", function()
    local ref = single_run("logits")
    -- a measured load: the routes of a short text
    local routes = TMP .. "/routes.json"
    local o0, rc0 = run(ENV .. " " .. q(EXE) .. " logits --model " .. q(DIR) .. " --tokens 3,14,15,92,65,35,89,79"
      .. " --out " .. q(TMP .. "/routes.f32") .. " --dump-routes " .. q(routes))
    assert(rc0 == 0, o0)
    for _, case in ipairs({ { 2, "" }, { 3, "TIDE_PLACEMENT=balanced TIDE_EXPERT_LOAD=" .. q(routes) },
      { 4, "TIDE_PLACEMENT=round_robin" } }) do
      local out = TMP .. "/logits." .. case[1]
      local o, rc = run(mpirun(case[1], q(DRIVER) .. " logits " .. q(DIR) .. " " .. q(out), case[2]))
      assert(rc == 0, o)
      same_bytes(ref, read(out), case[1] .. " ranks")
      -- rows really travelled: some (token, slot) rows were computed elsewhere
      local remote = tonumber(o:match("remote (%d+)"))
      assert.is_true(remote and remote > 0, o)
      local rb = tonumber(o:match("rows_bytes (%d+)"))
      -- bf16 rows there and back: 2 x remote slots x hidden (256) x 2 bytes
      assert.equals(2 * remote * 256 * 2, rb)
    end
  end)

  it("gives the single-process engine results bit for bit with preemption (2 and 4 ranks)", function()
    local ref = single_run("engine")
    local pre = tonumber(ref:match("preemptions (%d+)"))
    assert.is_true(pre >= 2, "the run must preempt (" .. tostring(pre) .. ")")
    for _, n in ipairs({ 2, 4 }) do
      local out = TMP .. "/engine." .. n
      local o, rc = run(mpirun(n, q(DRIVER) .. " engine " .. q(DIR) .. " " .. q(out)))
      assert(rc == 0, o)
      same_bytes(ref, read(out), n .. " ranks")
    end
  end)

  it("generates the same text through `tide generate`, with a seed and with MTP drafting", function()
    local model = ROOT .. "/models/tide-tiny-en"
    local base = "generate --model " .. q(model) .. " --prompt 'And the king said' --max-tokens 24"
    for _, extra in ipairs({ " --temp 0.8 --seed 3", " --temp 0 --draft 3" }) do
      local args = base .. extra
      local ref, rc = run(ENV .. " " .. q(EXE) .. " " .. args .. " 2>/dev/null")
      assert(rc == 0, ref)
      local got, rc2 = run(mpirun(2, args) .. " 2>/dev/null")
      assert(rc2 == 0, got)
      assert.equals(ref, got, extra)
      assert.is_true(#ref > 20)
    end
  end)

  it("refuses a placement that leaves an expert on no rank or names an unknown rank, on every rank", function()
    local bad = {
      missing = "return function(info) local o = {} for e = 1, info.experts - 1 do o[e] = 0 end return o end",
      unknown = "return function(info) local o = {} for e = 0, info.experts - 1 do o[e] = e % 7 end return o end",
    }
    local expect = { missing = "expert 0 of block 0 %(layers%.0%.%) is on no rank",
      unknown = "is placed on rank %d, but the run has 2 ranks" }
    for name, src in pairs(bad) do
      local path = TMP .. "/place_" .. name .. ".lua"
      local f = assert(io.open(path, "w"))
      f:write(src)
      f:close()
      local o, rc = run(mpirun(2, q(DRIVER) .. " logits " .. q(DIR) .. " " .. q(TMP .. "/never"),
        "TIDE_PLACEMENT=" .. q(path)))
      assert.is_not.equals(0, rc)
      -- (the ranks' stderr lines may interleave)
      assert.is_truthy(o:find("tide.model: placement " .. path .. ": ", 1, true), o)
      assert.is_truthy(o:find("MPI rank 1: placement " .. path .. ": ", 1, true), o)
      local _, n = o:gsub(expect[name], "")
      assert.is_true(n >= 2, o)
    end
  end)

  -- Start the endless driver, then signal rank 1 (found by a mark in its
  -- environment) once the run is going; returns the output and the seconds
  -- from the signal to the end of mpirun.
  local function signal_rank1(sig, env)
    local mark = "m" .. tostring(os.time()) .. math.random(1e6)
    local out = TMP .. "/sig." .. mark
    local cmd = mpirun(2, q(DRIVER) .. " loop " .. q(DIR), "TIDE_TEST_MARK=" .. mark .. " " .. (env or ""))
    local script = table.concat({
      "(" .. cmd .. ") > " .. q(out) .. " 2>&1 &",
      "MP=$!",
      "for i in $(seq 1 600); do grep -q ready " .. q(out) .. " && break; sleep 0.1; done",
      "sleep 0.5",
      "for e in /proc/[0-9]*/environ; do",
      "  if tr '\\0' '\\n' < $e 2>/dev/null | grep -qx TIDE_TEST_MARK=" .. mark
        .. " && tr '\\0' '\\n' < $e 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then",
      "    p=${e#/proc/}; kill -" .. sig .. " ${p%/environ}; fi",
      "done 2>/dev/null",
      "t0=$(date +%s%N); wait $MP; rc=$?; t1=$(date +%s%N)",
      "echo \"rc=$rc ms=$(( (t1 - t0) / 1000000 ))\"",
    }, "\n")
    local o = run(script)
    local log = read(out)
    os.remove(out)
    return log, tonumber(o:match("rc=(%d+)")), tonumber(o:match("ms=(%d+)")), o
  end

  it("ends every rank with a message naming the rank when one is killed", function()
    local log, rc, ms, o = signal_rank1("KILL")
    assert.is_truthy(log:find("ready", 1, true), log .. o)
    assert.is_not.equals(0, rc)
    assert.is_not.equals(124, rc, "timed out: " .. log)
    assert.is_truthy(log:match("process rank 1 .* exited on signal 9"), log)
    assert.is_true(ms < 10000, ms .. " ms")
  end)

  it("ends every rank with a message naming the rank when one stops answering", function()
    local log, rc, ms, o = signal_rank1("STOP", "TIDE_MPI_TIMEOUT=2")
    assert.is_truthy(log:find("ready", 1, true), log .. o)
    assert.is_not.equals(0, rc)
    assert.is_not.equals(124, rc, "timed out: " .. log)
    assert.is_truthy(log:find("tide: MPI rank 0 of 2: MoE exchange: no answer from rank 1 within 2 s", 1, true), log)
    assert.is_true(ms < 2000 + 8000, ms .. " ms")
  end)
end)
