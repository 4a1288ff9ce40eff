-- tide.server: the loop of `tide serve`. One thread: take the HTTP events the
-- C layer queued (tide.server.http), dispatch them to routes
-- (tide.server.routes), run one engine step, send every streaming request
-- what it generated, answer finished ones; repeat. Waits on the socket layer
-- only while the engine is idle.
--
--   local srv = require("tide.server").new(model, engine, opts)
--   srv:run()                       -- until SIGINT/SIGTERM (after catch_signals)
local tide = require("tide")
local http = require("tide.server.http")
local json = require("tide.server.json")
local openai = require("tide.server.openai")

local M = {}
local Srv = {}
Srv.__index = Srv
M.Server = Srv

local now = tide.time

-- opts: host, port, api_key, name, samplers (dir), defaults (serve options),
-- context, queue (most waiting requests), shutdown (seconds), routes, http
-- limits (max_body, max_buffer, max_connections, timeout), log (function).
function M.new(model, eng, opts)
  local self = setmetatable({
    model = model, eng = eng, opts = opts, name = opts.name or "tide",
    api_key = opts.api_key, queue = opts.queue or 64, parallel = eng.max_running,
    routes = {}, jobs = {}, n_jobs = 0, next_cid = 0, started = os.time(),
    fingerprint = "tide-" .. tide.version,
    log = opts.log or function() end,
    counters = { responses = {}, requests = {}, prompt_tokens = 0, completion_tokens = 0, cancelled = 0,
      step_seconds = 0, steps = 0, last_step = 0, errors = 0 },
  }, Srv)
  self.ctx = { tokenizer = model.tokenizer, vocab = model.vocab_size, context = opts.context,
    max_positions = model.max_positions, samplers = opts.samplers, defaults = opts.defaults or {}, sampler_cache = {} }
  for _, r in ipairs(opts.routes or require("tide.server.routes")) do
    self.routes[r.method .. " " .. r.path] = r
    self.routes[r.path] = true
  end
  local too_large = json.encode(openai.err(413, string.format("the request body is larger than %d bytes",
    opts.max_body or 1048576), nil, "body_too_large").body)
  local h, e = http.start{ host = opts.host, port = opts.port, max_body = opts.max_body, max_buffer = opts.max_buffer,
    max_connections = opts.max_connections, timeout = opts.timeout, too_large_body = too_large }
  if not h then return nil, e end
  self.http = h
  self.port = h:port()
  return self
end

-- ---------------------------------------------------------------- replies
local JSON_CT = "application/json"

function Srv:_count(status)
  local c = self.counters.responses
  c[status] = (c[status] or 0) + 1
end

function Srv:reply(req, status, obj, headers)
  local h = { ["Content-Type"] = JSON_CT }
  for k, v in pairs(headers or {}) do h[k] = v end
  self:_count(status)
  return self.http:respond(req.id, status, h, json.encode(obj))
end

function Srv:reply_text(req, status, text, ctype)
  self:_count(status)
  return self.http:respond(req.id, status, { ["Content-Type"] = ctype or "text/plain" }, text)
end

-- e: an openai.err(...) result
function Srv:fail(req, e)
  return self:reply(req, e.status, e.body, e.headers)
end

-- ---------------------------------------------------------------- requests
local function bearer(headers)
  local a = headers["authorization"]
  if a then return a:match("^[Bb]earer%s+(.-)%s*$") end
  return headers["x-api-key"]
end

function Srv:_dispatch(req)
  local r = self.routes[req.method .. " " .. req.path]
  if not r then
    if self.routes[req.path] then
      return self:fail(req, openai.err(405, "method " .. req.method .. " is not allowed on " .. req.path, nil,
        "method_not_allowed"))
    end
    return self:fail(req, openai.err(404, "no route " .. req.method .. " " .. req.path, nil, "not_found"))
  end
  if self.api_key and not r.open and bearer(req.headers) ~= self.api_key then
    return self:fail(req, openai.err(401, "invalid or missing API key (Authorization: Bearer KEY)", nil,
      "invalid_api_key", "invalid_request_error"))
  end
  local c = self.counters.requests
  c[req.path] = (c[req.path] or 0) + 1
  return r.handler(self, req)
end

function Srv:_request(ev)
  local req = ev
  req.json = function() return require("tide.server.routes").body_json(self, req) end
  local ok, e = pcall(self._dispatch, self, req)
  if not ok then
    self.counters.errors = self.counters.errors + 1
    self.log("handler error on " .. req.method .. " " .. req.path .. ": " .. tostring(e))
    pcall(self.fail, self, req, openai.err(500, "internal error: " .. tostring(e)))
  end
end

-- Hand a validated request (a batch line and its meta) to the engine.
function Srv:generate(req, line, meta)
  if self.stopping then
    return self:fail(req, openai.err(503, "the server is shutting down", nil, "shutting_down", nil,
      { ["Retry-After"] = "5" }))
  end
  if #self.eng.waiting >= self.queue then
    return self:fail(req, openai.err(503, string.format("the queue is full (%d requests waiting)", #self.eng.waiting),
      nil, "queue_full", nil, { ["Retry-After"] = "1" }))
  end
  local spec, e = openai.to_spec(line, self.ctx)
  if not spec then return self:fail(req, e) end
  local ok, h, serr = pcall(self.eng.submit, self.eng, spec)
  if not ok then return self:fail(req, openai.err(400, (tostring(h):gsub("^submit: ", "")))) end
  if not h then return self:fail(req, openai.err(400, serr, nil, "context_length_exceeded")) end
  self.next_cid = self.next_cid + 1
  local job = { id = req.id, h = h, meta = meta, created = os.time(), model = meta.model or self.name,
    fingerprint = self.fingerprint, sent = 0, text_off = 0, t_sent = now() }
  job.cid = (meta.kind == "chat" and "chatcmpl-" or "cmpl-") .. self.started .. "-" .. self.next_cid
  self.jobs[req.id] = job
  self.n_jobs = self.n_jobs + 1
  self.counters.prompt_tokens = self.counters.prompt_tokens + h.n_prompt
  if meta.stream then
    self:_count(200)
    local hdr = { ["Content-Type"] = "text/event-stream", ["Cache-Control"] = "no-cache" }
    if not self.http:stream(req.id, 200, hdr) then
      self:_drop(job)
      return
    end
    if meta.kind == "chat" then
      if not self.http:send(req.id, openai.chunk(job, { role = "assistant", text = "" })) then self:_drop(job) end
    end
  end
end

-- The client left (or reads too slowly): cancel its request, blocks back now.
function Srv:_drop(job)
  if self.jobs[job.id] ~= job then return end
  self.jobs[job.id] = nil
  self.n_jobs = self.n_jobs - 1
  if not job.h:done() then
    job.h:cancel()
    self.counters.cancelled = self.counters.cancelled + 1
  end
  self.http:abort(job.id)
end

function Srv:_closed(id)
  local job = self.jobs[id]
  if job then self:_drop(job) end
end

-- ---------------------------------------------------------------- streaming
-- What the job has not sent yet, as chunks; the end when the request is done.
function Srv:_pump(job)
  local h, m = job.h, job.meta
  local tok = self.ctx.tokenizer
  if not m.stream then
    if not h:done() then return end
    local res = h:result()
    self.jobs[job.id] = nil
    self.n_jobs = self.n_jobs - 1
    self.counters.completion_tokens = self.counters.completion_tokens + res.completion_tokens
    if res.error or res.status ~= "done" then
      return self:fail({ id = job.id }, openai.err(500, "generation failed: " .. tostring(res.error or res.status)))
    end
    res.text = json.sanitize_utf8(res.text or "")
    return self:reply({ id = job.id }, 200, openai.response(job, res, tok))
  end
  local parts = {}
  local n = #h.generated
  local recs = h.gen.logprobs
  while job.sent < n do
    local i = job.sent + 1
    job.sent = i
    local text = h.texts[i] or ""
    local f = {}
    if text ~= "" then f.text = json.sanitize_utf8(text) end
    if m.token_ids then f.token_ids = { h.generated[i] } end
    if m.logprobs and recs and recs[i] then
      if m.kind == "chat" then f.logprobs = openai.chat_logprobs(tok, recs, i, i, m.logprobs)
      else f.logprobs, job.text_off = openai.completion_logprobs(tok, recs, i, i, m.logprobs, job.text_off) end
    end
    if f.text or f.token_ids or f.logprobs then parts[#parts + 1] = openai.chunk(job, f) end
  end
  if h:done() then
    local res = h:result()
    if h.tail ~= "" then parts[#parts + 1] = openai.chunk(job, { text = json.sanitize_utf8(h.tail) }) end
    if res.error or res.status ~= "done" then
      parts[#parts + 1] = "data: " .. json.encode(openai.err(500, "generation failed: "
        .. tostring(res.error or res.status)).body) .. "\n\n"
    else
      parts[#parts + 1] = openai.chunk(job, { finish_reason = openai.FINISH[res.finish_reason] or res.finish_reason })
    end
    if m.include_usage then parts[#parts + 1] = openai.chunk(job, { usage = openai.usage(res) }) end
    parts[#parts + 1] = "data: [DONE]\n\n"
    self.jobs[job.id] = nil
    self.n_jobs = self.n_jobs - 1
    self.counters.completion_tokens = self.counters.completion_tokens + res.completion_tokens
    if self.http:send(job.id, table.concat(parts)) then self.http:finish(job.id) end
    return
  end
  -- a comment line after a second of silence (queued, long prompt): SSE
  -- clients ignore it, and writing it is how a client that left is noticed
  local t = now()
  if #parts == 0 and t - (job.t_sent or 0) > 1 then parts[1] = ": waiting\n\n" end
  if #parts > 0 then
    job.t_sent = t
    if not self.http:send(job.id, table.concat(parts)) then self:_drop(job) end
  end
end

function Srv:_pump_all()
  local list = {}
  for _, job in pairs(self.jobs) do list[#list + 1] = job end
  for _, job in ipairs(list) do
    local ok, e = pcall(self._pump, self, job)
    if not ok then
      self.log("stream error: " .. tostring(e))
      self:_drop(job)
    end
  end
end

-- ---------------------------------------------------------------- metrics
function Srv:metrics_text()
  local eng, c = self.eng, self.counters
  local st = self.model:cache_stats()
  local hs = self.http:stats()
  local L = {}
  local function metric(name, typ, help, value, labels)
    if help then
      L[#L + 1] = "# HELP " .. name .. " " .. help
      L[#L + 1] = "# TYPE " .. name .. " " .. typ
    end
    L[#L + 1] = name .. (labels or "") .. " " .. string.format(value == math.floor(value) and "%d" or "%.6g", value)
  end
  local first = true
  local codes = {}
  for code in pairs(c.responses) do codes[#codes + 1] = code end
  table.sort(codes)
  for _, code in ipairs(codes) do
    metric("tide_http_responses_total", "counter", first and "HTTP responses by status" or nil, c.responses[code],
      '{code="' .. code .. '"}')
    first = false
  end
  if first then metric("tide_http_responses_total", "counter", "HTTP responses by status", 0, '{code="200"}') end
  first = true
  local paths = {}
  for p in pairs(c.requests) do paths[#paths + 1] = p end
  table.sort(paths)
  for _, p in ipairs(paths) do
    metric("tide_requests_total", "counter", first and "requests by route" or nil, c.requests[p],
      '{path="' .. p .. '"}')
    first = false
  end
  metric("tide_http_requests_read_total", "counter", "complete HTTP requests read", hs.requests)
  metric("tide_http_open_requests", "gauge", "requests being read, waiting for an answer or streaming", hs.open)
  metric("tide_http_bytes_sent_total", "counter", "response bytes handed to the sockets", hs.bytes_sent)
  metric("tide_http_dropped_slow_total", "counter", "streams dropped because the client read too slowly",
    hs.dropped_slow)
  metric("tide_http_body_too_large_total", "counter", "requests refused with 413", hs.rejected_large)
  metric("tide_prompt_tokens_total", "counter", "prompt tokens of accepted requests", c.prompt_tokens)
  metric("tide_generation_tokens_total", "counter", "tokens generated", eng.stats.generated)
  metric("tide_completion_tokens_total", "counter", "tokens of answered requests", c.completion_tokens)
  metric("tide_requests_running", "gauge", "requests holding cache blocks", #eng.running)
  metric("tide_requests_waiting", "gauge", "queue depth: requests waiting for the engine", #eng.waiting)
  metric("tide_requests_cancelled_total", "counter", "requests cancelled because their client left", c.cancelled)
  metric("tide_engine_steps_total", "counter", "engine steps", c.steps)
  metric("tide_engine_step_seconds_total", "counter", "time spent in engine steps", c.step_seconds)
  metric("tide_engine_step_seconds_last", "gauge", "the last engine step's time", c.last_step)
  metric("tide_engine_tokens_total", "counter", "tokens run through the model (prefill and decode)", eng.stats.tokens)
  metric("tide_preemptions_total", "counter", "requests preempted (blocks released, recomputed later)",
    eng.stats.preemptions)
  metric("tide_draft_tokens_total", "counter", "speculative decoding: tokens the MTP block drafted and those accepted",
    eng.stats.drafted, '{state="drafted"}')
  metric("tide_draft_tokens_total", "counter", nil, eng.stats.accepted, '{state="accepted"}')
  metric("tide_draft_verify_steps_total", "counter", "speculative decoding: verify steps (pending token + drafts)",
    eng.stats.spec_steps)
  metric("tide_cache_swa_blocks", "gauge", "sliding-window cache blocks", st.swa_blocks, '{state="total"}')
  metric("tide_cache_swa_blocks", "gauge", nil, st.swa_blocks - st.swa_free, '{state="used"}')
  metric("tide_cache_pages", "gauge", "compressed cache pages", st.pages, '{state="total"}')
  metric("tide_cache_pages", "gauge", nil, st.pages - st.pages_free, '{state="used"}')
  metric("tide_cache_sequences", "gauge", "cache sequence slots", st.max_seqs, '{state="total"}')
  metric("tide_cache_sequences", "gauge", nil, st.seqs, '{state="used"}')
  metric("tide_cache_usage_ratio", "gauge", "share of sliding-window blocks in use",
    st.swa_blocks > 0 and (st.swa_blocks - st.swa_free) / st.swa_blocks or 0)
  return table.concat(L, "\n") .. "\n"
end

-- ---------------------------------------------------------------- loop
function Srv:catch_signals() self.http:catch_signals() end

function Srv:_stop_now()
  for _, job in pairs(self.jobs) do
    if not job.h:done() then job.h:cancel() end
    if job.meta.stream then self.http:finish(job.id) else self.http:abort(job.id) end
  end
  self.jobs = {}
  self.n_jobs = 0
end

-- Serve until a signal (then finish running requests for up to
-- opts.shutdown seconds, cancel the rest) or until should_stop() is true.
function Srv:run(should_stop)
  local eng = self.eng
  local deadline
  while true do
    local busy = eng:active() > 0 or self.n_jobs > 0
    local ev = self.http:next(busy and 0 or 50)
    while ev do
      if ev.kind == "request" then self:_request(ev)
      elseif ev.kind == "closed" then self:_closed(ev.id)
      elseif ev.kind == "signal" then
        if self.stopping then
          deadline = now()   -- a second signal: stop now
        else
          self.stopping = true
          deadline = now() + (self.opts.shutdown or 10)
          self.log(string.format("signal %d: no new connections; finishing %d request(s) (at most %gs)", ev.signal,
            self.n_jobs, self.opts.shutdown or 10))
          self.http:quiesce()
        end
      end
      ev = self.http:next(0)
    end
    if eng:active() > 0 then
      local t0 = now()
      local ok, e = pcall(eng.step, eng)
      local dt = now() - t0
      local c = self.counters
      c.steps, c.step_seconds, c.last_step = c.steps + 1, c.step_seconds + dt, dt
      if not ok then
        -- a policy failure: every active request ends with the error
        self.log("engine: " .. tostring(e))
        for _, job in pairs(self.jobs) do
          if not job.h:done() then job.h:cancel(); job.h.error = "engine: " .. tostring(e) end
        end
      end
    end
    self:_pump_all()
    if self.stopping and (self.n_jobs == 0 or now() >= deadline) then break end
    if should_stop and should_stop(self) then break end
  end
  self:_stop_now()
  return 0
end

function Srv:close()
  self:_stop_now()
  if self.http then self.http:close() end
  self.http = nil
end

return M
