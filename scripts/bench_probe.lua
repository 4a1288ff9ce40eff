-- bench_probe.lua: what probes cost. Eight sequences decode together (one
-- token each per step, after a 32-token prompt); per step we time
--   none    no probe anywhere (the path every step without probes takes),
--   read1   one of the eight carries a read-only probe at resid_moe on every
--           layer that copies its rows out,
--   steer1  one of the eight adds a vector to its streams at two layers.
-- The modes run in turn, one step each, over identical sequences, and
-- the medians per step (process CPU time, steadier than wall time on a
-- shared machine; wall time too) are reported with their ratios to `none`.
-- To compare with another version of the Lua code run `--modes none` under
-- TIDE_LUA_DIR=<its lua/> and this one, alternately.
--   tide scripts/bench_probe.lua [--model DIR] [--rounds N] [--threads N] [--modes none,read1,steer1]
local tide = require("tide")

local root = (arg and arg[0] and arg[0]:match("^(.*)/scripts/[^/]*$")) or "."
local dir, rounds, modes = root .. "/build/models/demo", 40, { "none", "read1", "steer1" }
local i = 1
while arg and arg[i] do
  local a = arg[i]
  if a == "--model" then i = i + 1; dir = arg[i]
  elseif a == "--rounds" then i = i + 1; rounds = tonumber(arg[i])
  elseif a == "--threads" then i = i + 1; tide.threads(tonumber(arg[i]))
  elseif a == "--modes" then
    i = i + 1
    modes = {}
    for x in arg[i]:gmatch("[^,]+") do modes[#modes + 1] = x end
  else error("bench_probe: unknown argument " .. a) end
  i = i + 1
end
local f = io.open(dir .. "/config.json", "rb")
if f then f:close() else
  io.stderr:write("bench_probe: generating the demo model in " .. dir .. " (once)\n")
  local mk = assert(loadfile(root .. "/scripts/make_checkpoint.lua"))
  local saved = arg
  _G.arg = { [0] = "make_checkpoint.lua", "--preset", "demo", "--out", dir, "--quiet" }
  mk()
  _G.arg = saved
end

local B, STEPS = 8, 1
local m = assert(tide.model(dir, { max_tokens = B * 32, tokenizer = false,
  cache = { context = 32 + rounds * STEPS + 8, max_seqs = B * #modes, seq_budget = B * #modes } }))
local V = m.vocab_size
local nl = m.net.n_layers
local kept = {}
local read1 = { at = "resid_moe", fn = function(X, info) kept[info.layer] = X:clone() end }
local vec = tide.randn({ m.config.hc_mult, m.config.hidden_size }, { seed = 1 }):mul_(0.01)
local steer1 = { at = "resid_moe", layers = { 0, math.max(0, nl - 1) }, fn = function(X)
  require("tide.probe").add_rows(X, vec, 1)
end }
local PROBES = { none = nil, read1 = { read1 }, steer1 = { steer1 } }

local sets = {}
for _, mode in ipairs(modes) do
  local seqs, toks = {}, {}
  local entries = {}
  for b = 1, B do
    seqs[b] = assert(m:sequence())
    local t = {}
    for j = 1, 32 do t[j] = (b * 7919 + j * 104729) % V end
    entries[b] = { seq = seqs[b], tokens = t, logits = "last" }
    toks[b] = { (b * 31) % V }
  end
  assert(m:step(entries))
  local dec = {}
  for b = 1, B do dec[b] = { seq = seqs[b], tokens = toks[b], logits = "last" } end
  dec[1].probes = PROBES[mode]
  sets[mode] = { entries = dec, times = {}, cpu = {} }
end

for _ = 1, rounds do
  for _, mode in ipairs(modes) do
    local s = sets[mode]
    for _ = 1, STEPS do
      local t0, c0 = tide.time(), os.clock()
      local res = assert(m:step(s.entries))
      s.times[#s.times + 1] = tide.time() - t0
      s.cpu[#s.cpu + 1] = os.clock() - c0
      for b = 1, B do s.entries[b].tokens[1] = res[b]:argmax() end
    end
  end
end

assert(not sets.read1 or next(kept), "the read-only probe never ran")
local function median(t)
  local c = {}
  for k, v in ipairs(t) do c[k] = v end
  table.sort(c)
  local n = #c
  return n % 2 == 1 and c[(n + 1) / 2] or (c[n / 2] + c[n / 2 + 1]) / 2
end
local base = sets.none and median(sets.none.cpu)
io.write(string.format("bench_probe: %s, %d layers, batch of %d decode tokens, %d steps per mode, %d threads\n", dir,
  nl, B, rounds * STEPS, tide.threads()))
for _, mode in ipairs(modes) do
  local mc = median(sets[mode].cpu)
  io.write(string.format("  %-7s median step: %.3f ms cpu, %.3f ms wall%s\n", mode, mc * 1e3,
    median(sets[mode].times) * 1e3,
    base and mode ~= "none" and string.format("  (cpu x%.3f of none)", mc / base) or ""))
end
