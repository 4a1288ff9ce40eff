-- scripts/soak.lua: many engine requests ending every way a request can
-- end, checking that nothing is left behind.
--   tide scripts/soak.lua --model DIR [--requests 2000] [--seed 1] [--every 250] [--quiet]
-- DIR is a small generated checkpoint (make soak makes one: the tiny preset).
-- Requests have random prompts (1-32 tokens), random lengths (1-10 new
-- tokens), random samplers (greedy, temperature, top-k/top-p, and a sampler
-- that raises on some token), random stop tokens, random priorities; random
-- cancellations hit waiting and running requests; the cache is small, so
-- requests are preempted and resumed. Every --every requests the engine is
-- drained and checked against the baseline taken after a warm-up:
--   * the cache's free SWA blocks and pages and its sequence count,
--   * tide's live C allocations: the count exactly, the bytes within 1 MB
--     (scratch buffers grow to the largest request seen; Lua garbage
--     collected first),
--   * RSS (/proc/self/statm) and the Lua heap, which must stay flat
--     (at most +16 MB and +10% over the whole run).
-- Prints one line per checkpoint and a summary; exits 1 at the first
-- violation, naming it.
local args = require("tide.cli.args")
local tide = require("tide")
local sampling = tide.sampling

local spec = {
  model = { type = "string", meta = "DIR", required = true, help = "a small generated checkpoint" },
  requests = { type = "number", default = 2000, meta = "N", help = "requests to run" },
  seed = { type = "number", default = 1, help = "seed of the random choices" },
  every = { type = "number", default = 250, meta = "N", help = "drain and check every N requests" },
  in_flight = { type = "number", default = 8, meta = "N", help = "requests submitted and not yet finished" },
  quiet = { type = "boolean", help = "only the summary" },
}
local ok_args, o = pcall(args.parse, arg, spec, "soak")
if not ok_args then
  io.stderr:write("soak: ", type(o) == "table" and o.msg or tostring(o), "\n", args.help(spec), "\n")
  os.exit(2)
end

io.stdout:setvbuf("line")

local function fail(msg)
  io.stderr:write("soak: FAILED: ", msg, "\n")
  os.exit(1)
end

local function rss_mb()
  local f = io.open("/proc/self/statm", "rb")
  if not f then return 0 end
  local _, res = f:read("*a"):match("(%d+)%s+(%d+)")
  f:close()
  return tonumber(res) * 4096 / 2 ^ 20
end

local model = assert(tide.model(o.model, { max_tokens = 32, tokenizer = false,
  cache = { swa_block = 16, page_tokens = 128, swa_blocks = 24, pages = 4, max_seqs = 6 } }))
local V = model.vocab_size
local eng = tide.engine(model, { budget = 32, policy = "priority", patience = 8 })

-- xorshift: the run is reproducible from --seed
local rs = math.floor(o.seed) % 2147483647 + 1
local function rnd(n)
  rs = (rs * 48271) % 2147483647
  return rs % n
end

local n_raise = 0
local function raising_sampler(at)
  -- a chain whose first stage raises on its at-th call
  local calls = 0
  return sampling.chain{ function()
    calls = calls + 1
    if calls == at then n_raise = n_raise + 1 error("soak: this sampler raises on token " .. at) end
  end, sampling.dist() }
end

local function new_request()
  local n = 1 + rnd(32)
  local toks = {}
  for i = 1, n do toks[i] = rnd(V) end
  local kind = rnd(10)
  local sampler
  if kind < 3 then sampler = { temp = 0 }
  elseif kind < 6 then sampler = { temp = 0.8 }
  elseif kind < 8 then sampler = { temp = 1.0, top_k = 20, top_p = 0.9 }
  else sampler = raising_sampler(1 + rnd(6)) end
  local req = { tokens = toks, max_tokens = 1 + rnd(10), seed = rnd(1000000), sampler = sampler,
    priority = rnd(3), ignore_eos = rnd(2) == 0 }
  if rnd(4) == 0 then
    -- stop tokens: 24 random ids, so that some requests do stop on one
    req.stop = {}
    for i = 1, 24 do req.stop[i] = rnd(V) end
  end
  return req
end

local counts = { stop = 0, length = 0, cancelled = 0, error = 0, other = 0 }
local active = {}
local submitted, finished = 0, 0

local function collect()
  local i = 1
  while i <= #active do
    local h = active[i]
    if h:done() then
      local r = h:result()
      local k = r.finish_reason
      if r.status == "cancelled" then k = "cancelled" elseif r.error then k = "error" end
      if counts[k] then counts[k] = counts[k] + 1 else counts.other = counts.other + 1 end
      finished = finished + 1
      active[i] = active[#active]
      active[#active] = nil
    else
      i = i + 1
    end
  end
end

local function step()
  -- random cancellations of waiting and running requests
  for _, h in ipairs(active) do
    if not h:done() and rnd(60) == 0 then h:cancel() end
  end
  if eng:active() > 0 then eng:step() end
  collect()
end

local function drain()
  while eng:active() > 0 do step() end
  collect()
  if #active ~= 0 then fail(#active .. " handles not done after the engine drained") end
end

local function measure()
  collectgarbage()
  collectgarbage()
  local cs = model:cache_stats()
  local a = tide.alloc_stats()
  return { swa_free = cs.swa_free, pages_free = cs.pages_free, seqs = cs.seqs, allocs = tonumber(a.live_allocs),
    bytes = tonumber(a.live_bytes), rss = rss_mb(), lua_kb = collectgarbage("count") }
end

local function run_until(target)
  while submitted < target do
    while #active < o.in_flight and submitted < target do
      local h, err = eng:submit(new_request())
      if not h then fail("submit refused a request: " .. tostring(err)) end
      active[#active + 1] = h
      submitted = submitted + 1
    end
    step()
  end
  drain()
end

local t0 = tide.time()
-- warm-up: first-use caches (sampler scratch, kernels' buffers) fill here
run_until(math.min(20, o.requests))
local base = measure()
local first_rss = base.rss
if not o.quiet then
  print(string.format("soak: baseline after %d requests: %d free SWA blocks, %d free pages, %d sequences, "
    .. "%d live allocations (%.1f MB), RSS %.1f MB, Lua heap %.0f kB", submitted, base.swa_free, base.pages_free,
    base.seqs, base.allocs, base.bytes / 2 ^ 20, base.rss, base.lua_kb))
end
local max_rss = base.rss
while submitted < o.requests do
  run_until(math.min(o.requests, submitted + o.every))
  local m = measure()
  max_rss = math.max(max_rss, m.rss)
  if not o.quiet then
    print(string.format("soak: %5d requests: free SWA %d pages %d seqs %d, live allocations %d (%+d bytes), "
      .. "RSS %.1f MB, Lua heap %.0f kB, %d preemptions", submitted, m.swa_free, m.pages_free, m.seqs, m.allocs,
      m.bytes - base.bytes, m.rss, m.lua_kb, eng.stats.preemptions))
  end
  if m.swa_free ~= base.swa_free or m.pages_free ~= base.pages_free or m.seqs ~= base.seqs then
    fail(string.format("cache not back to baseline after %d requests: SWA free %d (was %d), pages free %d (was %d), "
      .. "sequences %d (was %d)", submitted, m.swa_free, base.swa_free, m.pages_free, base.pages_free, m.seqs,
      base.seqs))
  end
  -- the count must be back exactly; the bytes may differ by scratch buffers
  -- that grow to the largest request seen (bounded: 1 MB)
  if m.allocs ~= base.allocs or math.abs(m.bytes - base.bytes) > 2 ^ 20 then
    fail(string.format("live C allocations %d (%d bytes) after %d requests, baseline %d (%d bytes)", m.allocs, m.bytes,
      submitted, base.allocs, base.bytes))
  end
  if m.rss > first_rss * 1.10 + 16 then
    fail(string.format("RSS grew from %.1f MB to %.1f MB", first_rss, m.rss))
  end
  if m.lua_kb > base.lua_kb * 1.10 + 16384 then
    fail(string.format("the Lua heap grew from %.0f kB to %.0f kB", base.lua_kb, m.lua_kb))
  end
end
local dt = tide.time() - t0
local last = measure()
eng:close()
print(string.format("soak: %d requests in %.1f s: %d stopped (eos/stop token), %d reached max_tokens, %d cancelled, "
  .. "%d failed (%d sampler raises), %d preemptions, %d tokens generated; cache and live allocation count back to "
  .. "baseline at every check (live bytes %+d); RSS %.1f -> %.1f MB (max %.1f)", submitted, dt, counts.stop,
  counts.length, counts.cancelled, counts.error, n_raise, eng.stats.preemptions, eng.stats.generated,
  last.bytes - base.bytes, first_rss, last.rss, max_rss))
for _, k in ipairs({ "stop", "length", "cancelled", "error" }) do
  if o.requests >= 100 and counts[k] == 0 then fail("no request ended with '" .. k .. "'") end
end
if o.requests >= 100 and eng.stats.preemptions == 0 then fail("no preemption happened") end
model:close()
