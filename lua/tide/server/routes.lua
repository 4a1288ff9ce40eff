-- tide.server.routes: what each URL does. A route is
--   { method = "GET" | "POST", path = "/exact/path", handler = function(srv, req) ... end,
--     open = true (no API key needed) }
-- req = { id, method, path, query, headers (lower-case names), body (bytes),
--         peer, json = function() -> value or nil, error }.
-- A handler answers with srv:reply(req, status, table) / srv:fail(req, openai.err(...)),
-- or hands the request to the engine with srv:generate(req, line, meta)
-- (line: a `tide batch` request line, meta: see openai.meta). Raising gives a
-- 500 to that client and the server goes on. Add a route by adding an entry.
local openai = require("tide.server.openai")
local json = require("tide.server.json")
local err = openai.err

local R = {}

local function body_json(_, req)
  if not json.valid_utf8(req.body) then
    return nil, err(400, "the request body is not valid UTF-8", nil, "invalid_utf8")
  end
  local v, e = json.decode(req.body)
  if v == nil then return nil, err(400, "malformed JSON: " .. tostring(e), nil, "invalid_json") end
  if type(v) ~= "table" or (next(v) ~= nil and v[1] ~= nil) then
    return nil, err(400, "the request body must be a JSON object", nil, "invalid_json")
  end
  return v
end
R.body_json = body_json

local function completions(kind)
  return function(srv, req)
    local body, e = body_json(srv, req)
    if not body then return srv:fail(req, e) end
    local line, meta
    if kind == "chat" then line, meta = openai.chat_line(body, srv.ctx)
    else line, meta = openai.completion_line(body, srv.ctx) end
    if not line then return srv:fail(req, meta) end
    return srv:generate(req, line, meta)
  end
end

R[#R + 1] = { method = "POST", path = "/v1/chat/completions", handler = completions("chat") }
R[#R + 1] = { method = "POST", path = "/v1/completions", handler = completions("completion") }
R[#R + 1] = { method = "POST", path = "/chat/completions", handler = completions("chat") }
R[#R + 1] = { method = "POST", path = "/completions", handler = completions("completion") }

local function models(srv, req)
  srv:reply(req, 200, { object = "list", data = { { id = srv.name, object = "model", created = srv.started,
    owned_by = "tide", meta = { context = srv.ctx.context, vocab = srv.ctx.vocab, parallel = srv.parallel } } } })
end
R[#R + 1] = { method = "GET", path = "/v1/models", handler = models }
R[#R + 1] = { method = "GET", path = "/models", handler = models }

R[#R + 1] = { method = "GET", path = "/health", open = true, handler = function(srv, req)
  if srv.stopping then return srv:reply(req, 503, { status = "shutting down" }) end
  srv:reply(req, 200, { status = "ok" })
end }

R[#R + 1] = { method = "GET", path = "/metrics", handler = function(srv, req)
  srv:reply_text(req, 200, srv:metrics_text(), "text/plain; version=0.0.4")
end }

-- llama-server's /tokenize: {"content": TEXT, "add_special": bool, "with_pieces": bool}
R[#R + 1] = { method = "POST", path = "/tokenize", handler = function(srv, req)
  local body, e = body_json(srv, req)
  if not body then return srv:fail(req, e) end
  for k in pairs(body) do
    if k ~= "content" and k ~= "add_special" and k ~= "with_pieces" and k ~= "model" then
      return srv:fail(req, err(400, "unknown field '" .. tostring(k) .. "'", k, "unknown_field"))
    end
  end
  if not srv.ctx.tokenizer then return srv:fail(req, err(400, "this model has no tokenizer")) end
  if type(body.content) ~= "string" then return srv:fail(req, err(400, "'content' must be a string", "content")) end
  if body.add_special ~= nil and type(body.add_special) ~= "boolean" then
    return srv:fail(req, err(400, "'add_special' must be true or false", "add_special"))
  end
  local tok = srv.ctx.tokenizer
  local ids = tok:encode(body.content, { add_special_tokens = body.add_special == true })
  local out = json.array()
  if body.with_pieces == true then
    for i, id in ipairs(ids) do out[i] = { id = id, piece = tok:decode({ id }) } end
  else
    for i, id in ipairs(ids) do out[i] = id end
  end
  srv:reply(req, 200, { tokens = out })
end }

R[#R + 1] = { method = "POST", path = "/detokenize", handler = function(srv, req)
  local body, e = body_json(srv, req)
  if not body then return srv:fail(req, e) end
  for k in pairs(body) do
    if k ~= "tokens" and k ~= "model" then
      return srv:fail(req, err(400, "unknown field '" .. tostring(k) .. "'", k, "unknown_field"))
    end
  end
  if not srv.ctx.tokenizer then return srv:fail(req, err(400, "this model has no tokenizer")) end
  local ids = body.tokens
  if type(ids) ~= "table" or (next(ids) ~= nil and ids[1] == nil) then
    return srv:fail(req, err(400, "'tokens' must be a list of token ids", "tokens"))
  end
  local vocab = srv.ctx.tokenizer.vocab_size
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= vocab then
      return srv:fail(req, err(400, string.format("tokens[%d] = %s is outside the vocabulary (0..%d)", i - 1,
        tostring(id), vocab - 1), "tokens", "invalid_token"))
    end
  end
  local text = srv.ctx.tokenizer:decode(ids)
  text = json.sanitize_utf8(text)
  srv:reply(req, 200, { content = text })
end }

return R
