-- tide serve: an OpenAI-compatible HTTP server over the batching engine.
-- The sockets are libmicrohttpd's (engine/http.c); the routes, validation
-- and the mapping onto tide.engine are Lua (lua/tide/server/).
local args = require("tide.cli.args")
local sampling = require("tide.sampling")

local spec = {
  model = { type = "string", meta = "DIR",
    help = "checkpoint directory (default: the model `make run` uses, tide.default_model())" },
  host = { type = "string", meta = "ADDR", default = "127.0.0.1", help = "address to listen on (numeric IPv4/IPv6)" },
  port = { type = "number", meta = "N", default = 8080, help = "TCP port (0: any free port; see --port-file)" },
  port_file = { type = "string", meta = "FILE", help = "write the bound port to FILE once listening" },
  policy = { type = "string", meta = "NAME|FILE", default = "fcfs",
    help = "scheduling policy: fcfs, priority, fair or a Lua file" },
  api_key = { type = "string", meta = "KEY",
    help = "require 'Authorization: Bearer KEY' (default $TIDE_API_KEY; none when unset)" },
  parallel = { type = "number", meta = "N", default = 8, help = "requests running at once (cache sequences)" },
  context = { type = "number", meta = "N", default = 4096, help = "positions per request (prompt + completion)" },
  budget = { type = "number", meta = "N", default = 256, help = "tokens per engine step" },
  chunk = { type = "number", meta = "N", help = "most prompt tokens of one request per step (default: the budget)" },
  cache_pages = { type = "number", meta = "N", help = "compressed cache pages (default: sized for --parallel)" },
  queue = { type = "number", meta = "N", default = 64, help = "most requests waiting; more get 503 + Retry-After" },
  sampler_dir = { type = "string", meta = "DIR",
    help = "directory of sampler files a request may name with \"sampler\": NAME (never a path)" },
  name = { type = "string", meta = "ID", help = "the model id /v1/models shows (default: the directory's name)" },
  max_body = { type = "number", meta = "BYTES", default = 1048576, help = "largest request body (larger: 413)" },
  max_buffer = { type = "number", meta = "BYTES", default = 4194304,
    help = "unsent bytes a stream may hold before its client is dropped as too slow" },
  max_connections = { type = "number", meta = "N", default = 256, help = "open connections at once" },
  timeout = { type = "number", meta = "S", default = 30, help = "idle connection timeout (slow headers, keep-alive)" },
  shutdown = { type = "number", meta = "S", default = 10,
    help = "on SIGINT/SIGTERM, finish running requests for at most S seconds, then cancel them" },
  threads = { type = "number", meta = "N", help = "OpenMP threads" },
  draft = { type = "number", meta = "N", integer = true, min = 0,
    help = "speculative decoding: the MTP block drafts up to N tokens per step (same output)" },
  draft_policy = { type = "string", meta = "NAME|FILE",
    help = "with --draft: fixed (default), adaptive or a Lua file" },
  max_tokens = { type = "number", meta = "N",
    help = "completion tokens when a request gives none (default: up to the context)" },
  quiet = { type = "boolean", help = "no log lines on stderr" },
}
for k, v in pairs(sampling.options) do if not spec[k] then spec[k] = v end end

local M = {
  summary = "serve the OpenAI API (chat, completions, streaming) over the batching engine",
  usage = "usage: tide serve [--model DIR] [--host 127.0.0.1] [--port 8080] [--policy NAME|FILE] [--api-key KEY]\n"
    .. "                  [--parallel N] [--context N] [--sampler-dir DIR] [sampling defaults]\n"
    .. "Endpoints: POST /v1/chat/completions, /v1/completions (stream: true for SSE), GET /v1/models, /health,\n"
    .. "/metrics (Prometheus), POST /tokenize, /detokenize. docs/server.md has the details.\n" .. args.help(spec),
}
M.spec = spec   -- (tests/fuzz/fuzz_server.lua parses the defaults as the command does)

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

-- the model `make run` uses (tide.default_model decides it), said on stderr
local function default_model()
  local dir, derr = require("tide").default_model()
  if not dir then args.fail("serve: no --model given and " .. tostring(derr), 1) end
  io.stderr:write("tide serve: using the default model ", dir, " (--model DIR picks another)\n")
  return dir
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "serve")
  if #pos > 0 then args.fail("serve: unexpected argument '" .. pos[1] .. "'") end
  local function int(name, lo)
    local v = o[name]
    if v ~= nil and (v ~= math.floor(v) or v < lo) then
      args.fail("serve: --" .. name:gsub("_", "-") .. " must be an integer >= " .. lo)
    end
  end
  for _, k in ipairs({ "parallel", "context", "budget", "chunk", "cache_pages", "threads", "max_tokens", "max_body",
    "max_buffer", "max_connections", "timeout" }) do int(k, 1) end
  int("port", 0)
  int("queue", 0)
  if o.port > 65535 then args.fail("serve: --port must be in 0..65535") end
  if o.sampler_dir then
    local dir = o.sampler_dir:gsub("/+$", "")
    if dir == "" or not exists(dir) then
      args.fail("serve: --sampler-dir " .. o.sampler_dir .. " is not a directory", 1)
    end
    o.sampler_dir = dir
  end
  local tide = require("tide")
  if o.threads then tide.threads(o.threads) end
  local dir = o.model or default_model()
  local log = o.quiet and function() end or function(msg) io.stderr:write("tide serve: ", msg, "\n") end
  local model, merr = tide.model(dir, { max_tokens = o.budget, cache = { context = o.context, max_seqs = o.parallel,
    pages = o.cache_pages, swa_blocks = nil } })
  if not model then args.fail("serve: " .. tostring(merr), 1) end
  local okp, eng = pcall(tide.engine, model, { budget = o.budget, chunk = o.chunk, policy = o.policy,
    draft = o.draft and o.draft > 0 and { max = o.draft, policy = o.draft_policy } or nil })
  if not okp then args.fail("serve: " .. tostring(eng):gsub("^engine: ", ""), 1) end
  local server = require("tide.server")
  local api_key = o.api_key or os.getenv("TIDE_API_KEY")
  if api_key == "" then api_key = nil end
  local srv, serr = server.new(model, eng, {
    host = o.host, port = o.port, api_key = api_key, name = o.name or dir:gsub("/+$", ""):match("([^/]+)$"),
    samplers = o.sampler_dir, defaults = o, context = o.context, queue = o.queue, shutdown = o.shutdown,
    max_body = o.max_body, max_buffer = o.max_buffer, max_connections = o.max_connections, timeout = o.timeout,
    log = log,
  })
  if not srv then
    eng:close()
    model:close()
    args.fail("serve: " .. tostring(serr), 1)
  end
  srv:catch_signals()
  if o.port_file then
    local f = io.open(o.port_file .. ".tmp", "w")
    if f then
      f:write(tostring(srv.port), "\n")
      f:close()
      os.rename(o.port_file .. ".tmp", o.port_file)
    end
  end
  log(string.format("listening on http://%s:%d (model %s, %d parallel, context %d, policy %s%s)", o.host:find(":")
    and ("[" .. o.host .. "]") or o.host, srv.port, srv.name, eng.max_running, o.context, eng.policy.name or "?",
    api_key and ", API key required" or ""))
  local rc = srv:run()
  srv:close()
  eng:close()
  model:close()
  log("stopped")
  return rc
end

return M
