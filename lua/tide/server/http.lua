-- tide.server.http: the Lua face of the C HTTP layer (engine/http.c,
-- libmicrohttpd underneath). Nothing here blocks on a client: the C side
-- reads requests on its own thread and buffers what is sent.
--
--   local http = require("tide.server.http")
--   local srv = assert(http.start{ host = "127.0.0.1", port = 0 })
--   local ev = srv:next(100)        -- nil, or { kind = "request" | "closed" | "signal", ... }
--   srv:respond(ev.id, 200, { ["Content-Type"] = "text/plain" }, "hi\n")
--   srv:stream(id, 200, headers); srv:send(id, bytes); srv:finish(id)
--   srv:close()
local tffi = require("tide.ffi")
local ffi, C = tffi.ffi, tffi.C

local M = {}
local Server = {}
Server.__index = Server
M.Server = Server

local GONE = 2
local KINDS = { [1] = "request", [2] = "closed", [3] = "signal" }

-- start{ host, port, max_body, max_buffer, max_connections, timeout,
-- threads, too_large_body } -> server, or nil, message (cannot bind).
function M.start(o)
  o = o or {}
  local opts = ffi.new("tide_http_opts")
  opts.host = o.host or "127.0.0.1"
  opts.port = o.port or 0
  opts.max_body = o.max_body or 0
  opts.max_buffer = o.max_buffer or 0
  opts.max_connections = o.max_connections or 0
  opts.timeout = o.timeout or 0
  opts.threads = o.threads or 0
  opts.too_large_body = o.too_large_body
  local pp = ffi.new("tide_http*[1]")
  local rc = C.tide_http_start(pp, opts)
  if rc < 0 then return nil, tffi.last_error() end
  return setmetatable({ h = pp[0], ev = ffi.new("tide_http_event") }, Server)
end

local function handle(self)
  if self.h == nil then error("http server: closed", 3) end
  return self.h
end

function Server:port() return C.tide_http_port(handle(self)) end

-- "name: value\n" lines -> { name = value } (names lower-case; a repeated
-- header keeps its values joined with ", ").
local function parse_headers(s)
  local t = {}
  for name, value in s:gmatch("([^:\n]+): ?([^\n]*)\n") do
    t[name] = t[name] and (t[name] .. ", " .. value) or value
  end
  return t
end

-- The next event or nil (waiting up to timeout_ms). Strings are copied.
function Server:next(timeout_ms)
  local ev = self.ev
  local got = C.tide_http_next(handle(self), ev, timeout_ms or 0)
  if got < 0 then error("http server: " .. tffi.last_error(), 2) end
  if got == 0 then return nil end
  local kind = KINDS[ev.kind]
  if kind == "signal" then return { kind = kind, signal = ev.signal } end
  local e = { kind = kind, id = tonumber(ev.id) }
  if kind == "request" then
    e.method = ffi.string(ev.method)
    e.path = ffi.string(ev.path)
    e.query = ffi.string(ev.query)
    e.headers = parse_headers(ffi.string(ev.headers))
    e.body = ffi.string(ev.body, ev.body_len)
    e.peer = ffi.string(ev.peer)
  end
  return e
end

local function header_text(h)
  if h == nil then return nil end
  if type(h) == "string" then return h end
  local parts = {}
  for k, v in pairs(h) do
    local ks, vs = tostring(k), tostring(v)
    if ks:find("[\r\n:]") or vs:find("[\r\n]") then error("http server: bad header " .. ks, 3) end
    parts[#parts + 1] = ks .. ": " .. vs .. "\r\n"
  end
  table.sort(parts)
  return table.concat(parts)
end

-- Each returns true, or false when the request is gone (its client left).
function Server:respond(id, status, headers, body)
  body = body or ""
  local rc = C.tide_http_respond(handle(self), id, status, header_text(headers), body, #body)
  if rc < 0 then error("http server: " .. tffi.last_error(), 2) end
  return rc ~= GONE
end

function Server:stream(id, status, headers)
  local rc = C.tide_http_stream(handle(self), id, status, header_text(headers))
  if rc < 0 then error("http server: " .. tffi.last_error(), 2) end
  return rc ~= GONE
end

function Server:send(id, bytes)
  local rc = C.tide_http_send(handle(self), id, bytes, #bytes)
  if rc < 0 then error("http server: " .. tffi.last_error(), 2) end
  return rc ~= GONE
end

function Server:finish(id)
  local rc = C.tide_http_end(handle(self), id)
  if rc < 0 then error("http server: " .. tffi.last_error(), 2) end
  return rc ~= GONE
end

function Server:abort(id) return C.tide_http_abort(handle(self), id) ~= GONE end

function Server:pending(id) return tonumber(C.tide_http_pending(handle(self), id)) end

function Server:stats()
  local st = ffi.new("tide_http_stats")
  C.tide_http_get_stats(handle(self), st)
  return { open = tonumber(st.open), requests = tonumber(st.requests), bytes_sent = tonumber(st.bytes_sent),
    dropped_slow = tonumber(st.dropped_slow), rejected_large = tonumber(st.rejected_large) }
end

-- SIGINT/SIGTERM become { kind = "signal" } events.
function Server:catch_signals() tffi.check(C.tide_http_catch_signals(handle(self)), 2) end

-- Stop accepting connections.
function Server:quiesce() C.tide_http_quiesce(handle(self)) end

function Server:close()
  if self.h ~= nil then
    C.tide_http_free(self.h)
    self.h = nil
  end
end

return M
