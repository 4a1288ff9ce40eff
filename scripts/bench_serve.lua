-- scripts/bench_serve.lua: `tide serve` under load against the engine alone
-- (the path `tide batch` runs) on the same requests.
--   * R requests of PROMPT random token ids, GEN generated tokens each
--     (ignore_eos, tide's default sampler, a seed each), kept CONC at a time
--     in flight (closed loop) for CONC = 1, 4, 16;
--   * engine: in this process, each request mapped exactly as the server maps
--     it, token times taken when the token is sampled;
--   * server: `tide serve` in a subprocess, a Node client
--     (scripts/bench_serve_client.js) streaming over loopback, token times
--     taken when the SSE chunk arrives;
--   * requests/s, output tokens/s, time to first token p50/p99, inter-token
--     latency p50/p99.
-- Usage: tide scripts/bench_serve.lua [--model DIR] [--quick] [--prompt N] [--gen N] [--threads N]
-- The default model is the bench checkpoint (made under build/ when missing).
local tide = require("tide")
local cjson = require("cjson")

local quick, model_dir, PROMPT, GEN = false, nil, nil, nil
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--quick" then quick = true
  elseif a == "--model" then model_dir = arg[i + 1]; i = i + 1
  elseif a == "--prompt" then PROMPT = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--gen" then GEN = tonumber(arg[i + 1]); i = i + 1
  elseif a == "--threads" then tide.threads(tonumber(arg[i + 1])); i = i + 1
  else error("bench_serve: unknown argument " .. a) end
  i = i + 1
end
PROMPT = PROMPT or (quick and 32 or 64)
GEN = GEN or (quick and 8 or 32)
local CONC = { 1, 4, 16 }
local function n_requests(c) return math.max(c * 2, quick and 2 or 4) end

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end
local build = os.getenv("TIDE_BUILD_DIR") or "build"
local exe = (rawget(_G, "_TIDE_EXE") or {}).exe or (build .. "/tide")
model_dir = model_dir or (build .. "/models/bench")
if not exists(model_dir .. "/config.json") then
  io.stderr:write("bench_serve: writing the bench checkpoint to ", model_dir, " (~2 GB, once)\n")
  local cmd = string.format("%s scripts/make_checkpoint.lua --preset bench --quiet --out %s", exe, model_dir)
  assert(os.execute(cmd) == 0 or exists(model_dir .. "/config.json"), "make_checkpoint failed: " .. cmd)
end

local function loadavg()
  local f = io.open("/proc/loadavg", "rb")
  if not f then return "?" end
  local s = f:read("*l")
  f:close()
  return s:match("^(%S+ %S+ %S+)") or s
end

local function pct(xs, p)
  if #xs == 0 then return 0 / 0 end
  local s = {}
  for k, v in ipairs(xs) do s[k] = v end
  table.sort(s)
  local k = math.max(1, math.min(#s, math.ceil(p / 100 * #s)))
  return s[k]
end

local CONTEXT = PROMPT + GEN
local V
do
  local f = assert(io.open(model_dir .. "/config.json", "rb"))
  V = cjson.decode(f:read("*a")).vocab_size
  f:close()
end
local function bodies(c)
  local out = {}
  for r = 1, n_requests(c) do
    local t, x = {}, r * 7919 + c
    for k = 1, PROMPT do
      x = (x * 1103515245 + 12345) % 2147483648
      t[k] = math.floor(x / 65536) % V
    end
    out[r] = { prompt = t, max_tokens = GEN, seed = 1000 + r, ignore_eos = true }
  end
  return out
end

local function summary(wall, recs)
  local ttft, gaps, tokens = {}, {}, 0
  for _, r in ipairs(recs) do
    ttft[#ttft + 1] = r.ttft
    for _, g in ipairs(r.gaps) do gaps[#gaps + 1] = g end
    tokens = tokens + r.tokens
  end
  return { rps = #recs / wall, tps = tokens / wall, ttft50 = pct(ttft, 50), ttft99 = pct(ttft, 99),
    itl50 = pct(gaps, 50), itl99 = pct(gaps, 99), tokens = tokens, wall = wall }
end

-- ---------------------------------------------------------------- the engine alone
local openai = require("tide.server.openai")
local sampling = require("tide.sampling")
local defaults = {}
for k, o in pairs(sampling.options) do defaults[k] = o.default end

local engine_res = {}
do
  local m = assert(tide.model(model_dir, { max_tokens = 256, cache = { context = CONTEXT, max_seqs = 16 } }))
  local eng = tide.engine(m, { budget = 256 })
  local ctx = { tokenizer = m.tokenizer, vocab = m.vocab_size, context = CONTEXT, defaults = defaults,
    sampler_cache = {} }
  for _, c in ipairs(CONC) do
    local list = bodies(c)
    local recs, next_i, t0 = {}, 1, tide.time()
    local function submit()
      local body = list[next_i]
      next_i = next_i + 1
      local line = assert(openai.completion_line(body, ctx))
      local spec = assert(openai.to_spec(line, ctx))
      local rec = { t0 = tide.time(), gaps = {}, tokens = 0 }
      spec.on_token = function(_, id)
        if id == false then return end
        local t = tide.time()
        if rec.last then rec.gaps[#rec.gaps + 1] = t - rec.last else rec.ttft = t - rec.t0 end
        rec.last = t
        rec.tokens = rec.tokens + 1
      end
      rec.h = assert(eng:submit(spec))
      recs[#recs + 1] = rec
    end
    while next_i <= #list and eng:active() < c do submit() end
    while eng:active() > 0 do
      eng:step()
      while next_i <= #list and eng:active() < c do submit() end
    end
    engine_res[c] = summary(tide.time() - t0, recs)
    io.stderr:write(string.format("bench_serve: engine, %d concurrent: %.2f req/s\n", c, engine_res[c].rps))
  end
  eng:close()
  m:close()
end

-- ---------------------------------------------------------------- the server
local server_res = {}
do
  local tmp = os.tmpname()
  local pf = tmp .. ".port"
  local cmd = string.format("%s serve --model %s --port 0 --port-file %s --parallel 16 --context %d --budget 256 "
    .. "--quiet", exe, model_dir, pf, CONTEXT)
  os.execute(string.format("sh -c '%s & echo $! > %s.pid; wait' > /dev/null 2>&1 &", cmd, tmp))
  local port
  for _ = 1, 1200 do
    local f = io.open(pf, "rb")
    if f then port = tonumber(f:read("*a")); f:close() end
    if port then break end
    os.execute("sleep 0.1")
  end
  assert(port, "bench_serve: the server did not start")
  local pidf = io.open(tmp .. ".pid", "rb")
  local pid = pidf and tonumber(pidf:read("*a"))
  if pidf then pidf:close() end
  local root = (arg[0]:match("^(.*)/scripts/[^/]*$")) or "."
  for _, c in ipairs(CONC) do
    local bf = tmp .. ".bodies"
    local f = assert(io.open(bf, "wb"))
    f:write(cjson.encode(bodies(c)))
    f:close()
    local p = io.popen(string.format("node %s/scripts/bench_serve_client.js %d %d %s", root, port, c, bf))
    local out = p:read("*a")
    p:close()
    local r = cjson.decode(out)
    assert(not r.fatal, r.fatal)
    server_res[c] = summary(r.wall, r.results)
    io.stderr:write(string.format("bench_serve: server, %d concurrent: %.2f req/s\n", c, server_res[c].rps))
    os.remove(bf)
  end
  if pid then os.execute("kill -TERM " .. pid) end
  os.remove(pf)
  os.remove(tmp .. ".pid")
  os.remove(tmp)
end

print(string.format("\nbench_serve: %s, prompt %d tokens, %d generated, %d threads; load average %s", model_dir,
  PROMPT, GEN, tide.threads(), loadavg()))
print("| streams | path | req/s | output tok/s | TTFT p50 / p99 (ms) | inter-token p50 / p99 (ms) |")
print("|---|---|---|---|---|---|")
for _, c in ipairs(CONC) do
  for _, row in ipairs({ { "engine (tide batch)", engine_res[c] }, { "tide serve", server_res[c] } }) do
    local s = row[2]
    print(string.format("| %d | %s | %.2f | %.1f | %.0f / %.0f | %.0f / %.0f |", c, row[1], s.rps, s.tps,
      s.ttft50 * 1e3, s.ttft99 * 1e3, s.itl50 * 1e3, s.itl99 * 1e3))
  end
end
for _, c in ipairs(CONC) do
  print(string.format("server / engine at %d: output tok/s %.2f, TTFT p50 %+.0f ms", c,
    server_res[c].tps / engine_res[c].tps, (server_res[c].ttft50 - engine_res[c].ttft50) * 1e3))
end
