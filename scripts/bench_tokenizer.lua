-- bench_tokenizer.lua: encode throughput (MB/s, one thread) of tide's
-- tokenizer over a few MB of mixed English and code, against the JavaScript
-- reference (@lenml/tokenizers, run with node in the same run), and decode
-- throughput (tokens/s). Prints a markdown table for the README.
--   tide scripts/bench_tokenizer.lua [MB] [TOKENIZER_DIR]
-- The corpus is built from this repository's own sources and docs (C, Lua,
-- Markdown), repeated to MB megabytes (default 4).
local tide = require("tide")
local ffi, C = tide.ffi.ffi, tide.C

local root = (arg and arg[0] and arg[0]:match("^(.*)/scripts/[^/]*$")) or "."
local MB = tonumber(arg and arg[1]) or 4
local dir = (arg and arg[2]) or require("tide.tokenizer").default_path()
if not dir then error("no tokenizer: run scripts/deps.sh (or pass a model dir)") end

local function read(p)
  local f = io.open(p, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- English (Markdown docs) and code (C and Lua sources), interleaved.
local function corpus(bytes)
  local files = {}
  local p = io.popen("cd '" .. root .. "' && ls engine/*.c engine/*.h lua/tide/*.lua scripts/*.lua docs/*.md"
    .. " README.md 2>/dev/null")
  for f in p:lines() do files[#files + 1] = f end
  p:close()
  table.sort(files)
  local parts, n = {}, 0
  for _, f in ipairs(files) do
    local s = read(root .. "/" .. f)
    if s then
      parts[#parts + 1] = s
      n = n + #s
    end
  end
  assert(n > 0, "no source files found under " .. root)
  local base = table.concat(parts, "\n")
  local out = {}
  local have = 0
  while have < bytes do
    out[#out + 1] = base
    have = have + #base
  end
  return table.concat(out):sub(1, bytes), n
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local box = ffi.new("tide_tokenizer*[1]")
tide.ffi.check(C.tide_tokenizer_load(box, dir))
local tok = ffi.gc(box[0], C.tide_tokenizer_free)
local text, unique = corpus(math.floor(MB * 1024 * 1024))
local nbytes = #text

local ids = ffi.gc(ffi.new("tide_tok_ids"), C.tide_tok_ids_free)
local function encode_rate(flags, reps)
  local rates = {}
  for _ = 1, reps do
    local t0 = tide.time()
    tide.ffi.check(C.tide_tokenizer_encode(tok, text, nbytes, flags, ids))
    rates[#rates + 1] = nbytes / 1e6 / (tide.time() - t0)
  end
  return median(rates)
end

local NO_CACHE = 8
encode_rate(0, 1) -- warm up (page faults, cache)
local enc = encode_rate(0, 5)
local enc_nc = encode_rate(NO_CACHE, 3)
local ntok = tonumber(ids.n)

-- decode: the whole id array at once, and id by id through a streamer
local txt = ffi.gc(ffi.new("tide_tok_text"), C.tide_tok_text_free)
local dec_rates = {}
for _ = 1, 5 do
  local t0 = tide.time()
  tide.ffi.check(C.tide_tokenizer_decode(tok, ids.ids, ids.n, 0, txt))
  dec_rates[#dec_rates + 1] = ntok / (tide.time() - t0)
end
assert(ffi.string(txt.data, txt.len) == text, "decode(encode(corpus)) is not the corpus")
local dec = median(dec_rates)

local sbox = ffi.new("tide_tok_streamer*[1]")
tide.ffi.check(C.tide_tok_streamer_new(sbox, tok, 0))
local st = ffi.gc(sbox[0], C.tide_tok_streamer_free)
local pbox, lbox = ffi.new("const char*[1]"), ffi.new("int64_t[1]")
local stream_rates = {}
for _ = 1, 3 do
  local t0 = tide.time()
  local total = 0
  local p = ids.ids
  for i = 0, ntok - 1 do
    C.tide_tok_streamer_put(st, p[i], pbox, lbox)
    total = total + lbox[0]
  end
  C.tide_tok_streamer_flush(st, pbox, lbox)
  stream_rates[#stream_rates + 1] = ntok / (tide.time() - t0)
  assert(total + lbox[0] == nbytes, "streamed bytes differ from the corpus")
end
local stream = median(stream_rates)

-- the JavaScript reference on the same text, same machine, same run
local js, js_tokens
do
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb"))
  f:write(text)
  f:close()
  local name = dir:find("llama2", 1, true) and "llama2" or "deepseek_v3"
  local cmd = ("node '%s/scripts/tokenizer_golden.js' bench %s '%s' 3 2>&1"):format(root, name, tmp)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  os.remove(tmp)
  local ms, n = out:match("^([%d%.]+) (%d+)")
  if ms then
    js = nbytes / 1e6 / (tonumber(ms) / 1000)
    js_tokens = tonumber(n)
  else
    io.stderr:write("bench_tokenizer: the JavaScript reference did not run: ", out, "\n")
  end
end

print(("tokenizer: %s"):format(ffi.string(C.tide_tokenizer_describe(tok))))
print(("corpus: %.1f MB of English (Markdown) and code (C, Lua) from this repository"
  .. " (%d unique bytes, repeated), %d tokens"):format(nbytes / 1e6, unique, ntok))
if js_tokens and js_tokens ~= ntok then
  print(("WARNING: the reference produced %d tokens, tide %d"):format(js_tokens, ntok))
end
print("")
print("| tokenizer (1 thread) | encode MB/s | vs JS reference | decode tokens/s | streaming decode tokens/s |")
print("|---|---:|---:|---:|---:|")
print(("| tide (pre-token cache on) | %.1f | %s | %.3g | %.3g |"):format(enc,
  js and ("%.1fx"):format(enc / js) or "n/a", dec, stream))
print(("| tide (cache off) | %.1f | %s | | |"):format(enc_nc, js and ("%.1fx"):format(enc_nc / js) or "n/a"))
print(("| @lenml/tokenizers (node %s) | %s | 1.0x | | |"):format(
  (io.popen("node --version 2>/dev/null"):read("*l") or "?"), js and ("%.2f"):format(js) or "n/a"))
print("")
print(("targets: encode >= 20 MB/s: %s; >= 10x the reference: %s"):format(enc >= 20 and "met" or "NOT met",
  js and (enc / js >= 10 and "met" or "NOT met") or "not measured"))
