-- fuzz_server: `tide serve`'s request handling, through the real HTTP layer.
-- The server is built as the command builds it (tide.server.new: engine/http.c
-- over libmicrohttpd on a loopback port, the routes, the OpenAI validation
-- and mapping, tide batch's submit mapping) on the demo fuzz model, with an
-- API key and a sampler directory. Each input is sent over a TCP connection:
--   first byte even: the rest is sent as it is (request line, headers, body,
--     several pipelined requests: anything);
--   first byte odd: byte >> 1 picks a route (and, from 64 on, leaves the API
--     key out); the rest is that request's body, sent with a correct
--     Content-Length (so the mutations reach the JSON and its validation).
-- TIDE_FUZZ_VERBOSE=1 prints each answer's status and the start of its body.
-- The server's loop runs until the connection is closed: a request that is
-- accepted is handed to the engine and then cancelled (as when its client
-- leaves). Findings besides crashes and leaks (fuzz_fail aborts):
--   * a handler raising (the server answers 500 "internal error": bad input
--     must get a 4xx that says what is wrong);
--   * a JSON answer (tide's: libmicrohttpd's own answers to broken HTTP are
--     HTML) that is a 5xx other than 503, that is not a JSON object, or an
--     error without an OpenAI error object { error = { message, type, param,
--     code } };
--   * a request left behind: an active engine request, a job of the server,
--     a cache sequence, after its connection ended.
local ffi = require("ffi")
local bit = require("bit")
local cjson = require("cjson")
local common = require("fuzz_common")
common.no_sampler_files()

local tide = require("tide")
local model = common.model()
local eng = tide.engine(model, { budget = 64 })
local args = require("tide.cli.args")
local defaults = args.parse({ "--model", "m" }, require("tide.cli.serve").spec, "serve")

-- a sampler directory with one file (names are checked against it; loading
-- sampler files is not fuzzed: fuzz_common refuses them)
local tmp = (os.getenv("TMPDIR") or "/tmp") .. "/fuzz_server_samplers"
os.execute("mkdir -p '" .. tmp .. "'")
do
  local f = assert(io.open(tmp .. "/greedy.lua", "w"))
  f:write("return sampling.chain{ sampling.greedy() }\n")
  f:close()
end

local KEY = "fuzz-key"
local last_log = ""
local srv = assert(require("tide.server").new(model, eng, {
  host = "127.0.0.1", port = 0, api_key = KEY, name = "fuzz", samplers = tmp, defaults = defaults,
  context = 256, queue = 4, max_body = 3000, timeout = 2, log = function(m) last_log = m end,
}))

ffi.cdef [[
struct fuzz_sockaddr_in { uint16_t family; uint8_t port[2]; uint8_t addr[4]; uint8_t zero[8]; };
struct fuzz_pollfd { int fd; short events; short revents; };
int socket(int domain, int type, int protocol);
int connect(int fd, const void *addr, uint32_t len);
long send(int fd, const void *buf, size_t n, int flags);
long recv(int fd, void *buf, size_t n, int flags);
int close(int fd);
int poll(struct fuzz_pollfd *fds, unsigned long n, int timeout);
]]
local C = ffi.C
local AF_INET, SOCK_STREAM, MSG_NOSIGNAL, POLLIN = 2, 1, 0x4000, 1
local IDLE = 0.025
local VERBOSE = (os.getenv("TIDE_FUZZ_VERBOSE") or "0"):match("^[1-9]")

local addr = ffi.new("struct fuzz_sockaddr_in")
addr.family = AF_INET
addr.port[0], addr.port[1] = bit.rshift(srv.port, 8), bit.band(srv.port, 255)
addr.addr[0], addr.addr[1], addr.addr[2], addr.addr[3] = 127, 0, 0, 1
local pfd = ffi.new("struct fuzz_pollfd[1]")
local rbuf = ffi.new("char[65536]")

local ROUTES = {
  "POST /v1/chat/completions", "POST /v1/completions", "POST /tokenize", "POST /detokenize",
  "POST /chat/completions", "POST /completions", "GET /v1/models", "GET /health", "GET /metrics",
  "POST /v1/models", "GET /v1/chat/completions", "POST /nowhere",
}

local function request_bytes(data)
  local mode = data:byte(1) or 0
  local rest = data:sub(2)
  if mode % 2 == 0 then return rest end
  local pick = bit.rshift(mode, 1)
  local route = ROUTES[pick % 64 % #ROUTES + 1]
  local key = pick < 64 and ("Authorization: Bearer " .. KEY .. "\r\n") or ""
  return route .. " HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\nContent-Type: application/json\r\n" .. key
    .. "Content-Length: " .. #rest .. "\r\n\r\n" .. rest
end

-- the server's loop (tide.server's run, without its 50 ms idle wait): events
-- in, accepted requests cancelled; false once the connection is closed
local function serve_once()
  local ev = srv.http:next(1)
  while ev do
    if ev.kind == "request" then srv:_request(ev)
    elseif ev.kind == "closed" then srv:_closed(ev.id) end
    ev = srv.http:next(0)
  end
  if srv.n_jobs > 0 then srv:_stop_now() end
end

-- the answers on the connection: each is checked where it is JSON
local function check_answers(out)
  local pos = 1
  while true do
    local head_end = out:find("\r\n\r\n", pos, true)
    if not head_end then return end
    local head = out:sub(pos, head_end - 1)
    local status = tonumber(head:match("^HTTP/1%.%d (%d%d%d)"))
    if not status then return end
    local ctype = head:lower():match("\ncontent%-type: *([^\r\n;]*)")
    local len = tonumber(head:lower():match("\ncontent%-length: *(%d+)"))
    if not len then return end   -- a stream (chunked): cancelled, not checked
    local body = out:sub(head_end + 4, head_end + 3 + len)
    if #body < len then return end
    if VERBOSE then io.stderr:write("ANSWER ", status, " ", tostring(ctype), " ", body:sub(1, 150), "\n") end
    -- (libmicrohttpd answers malformed HTTP itself, in HTML: 400, 413, 505)
    if ctype == "application/json" then
      if status >= 500 and status ~= 503 then fuzz_fail("answer " .. status .. ": " .. body) end
      local ok, v = pcall(cjson.decode, body)
      if not ok or type(v) ~= "table" then fuzz_fail("answer " .. status .. " is not a JSON object: " .. body) end
      if status >= 400 then
        local e = v.error
        if type(e) ~= "table" or type(e.message) ~= "string" or e.message == "" or type(e.type) ~= "string"
          or e.param == nil or e.code == nil then
          fuzz_fail("answer " .. status .. " has no OpenAI error object: " .. body)
        end
      end
    end
    pos = head_end + 4 + len
  end
end

-- A connection to the server. libFuzzer's SIGALRM (its -timeout clock)
-- interrupts system calls, and a burst of short connections can use up the
-- local ports for a moment: both are retried; anything else is a finding.
local EINTR, EAGAIN, EADDRNOTAVAIL, EISCONN, EALREADY, EINPROGRESS = 4, 11, 99, 106, 114, 115
local function dial()
  for _ = 1, 1000 do
    local fd = C.socket(AF_INET, SOCK_STREAM, 0)
    if fd < 0 then fuzz_fail("socket failed: errno " .. ffi.errno()) end
    while true do
      if C.connect(fd, addr, ffi.sizeof(addr)) == 0 then return fd end
      local e = ffi.errno()
      if e == EISCONN then return fd end
      if e ~= EINTR and e ~= EALREADY and e ~= EINPROGRESS then
        C.close(fd)
        if e ~= EADDRNOTAVAIL and e ~= EAGAIN then fuzz_fail("cannot connect to the server: errno " .. e) end
        C.poll(nil, 0, 10)
        break
      end
      C.poll(nil, 0, 1)
    end
  end
  fuzz_fail("cannot connect to the server: no local port for 10 s")
end

return function(data)
  local req = request_bytes(data)
  local errors = srv.counters.errors
  local fd = dial()
  local off = 0
  while off < #req do
    local w = C.send(fd, ffi.cast("const char *", req) + off, #req - off, MSG_NOSIGNAL)
    if w <= 0 and ffi.errno() ~= EINTR then break end   -- the server closed first (413, a bad request line)
    if w > 0 then off = off + tonumber(w) end
  end

  -- read the answers until the server closes the connection, or until
  -- nothing happened for IDLE seconds (libmicrohttpd waits for the rest of
  -- an incomplete request, and keeps a connection alive after an answer)
  local got = {}
  local last = tide.time()
  pfd[0].fd, pfd[0].events = fd, POLLIN
  while true do
    local jobs = srv.n_jobs
    serve_once()
    local r = C.poll(pfd, 1, 1)
    local t = tide.time()
    if jobs > 0 then last = t end
    if r > 0 then
      local n = C.recv(fd, rbuf, 65536, 0)
      if n <= 0 then break end
      got[#got + 1] = ffi.string(rbuf, n)
      last = t
    elseif t - last > IDLE then
      break
    end
  end
  C.close(fd)
  -- every connection's state is freed once its client has gone (one that
  -- never is hangs here: libFuzzer's -timeout reports it)
  repeat serve_once() until srv.http:stats().open == 0
  if srv.counters.errors ~= errors then fuzz_fail("a handler raised (the answer was a 500): " .. last_log) end
  check_answers(table.concat(got))
  if srv.n_jobs ~= 0 or eng:active() ~= 0 then fuzz_fail("a request is left after its connection ended") end
  if model:cache_stats().seqs ~= 0 then fuzz_fail("a cache sequence is left after its request ended") end
end
