-- tide logits: the logits of every position of a token sequence, as raw
-- little-endian float32 [T, vocab] in a file; prints "T vocab" on stdout.
-- The discrete decisions (indexer selections of ratio-4 layers, routed
-- experts) can be dumped as JSON so a checker can replay them in a reference.
local args = require("tide.cli.args")

local spec = {
  model = { type = "string", meta = "DIR", required = true, help = "checkpoint directory" },
  tokens = { type = "string", meta = "IDS", required = true, help = "token ids, comma or space separated" },
  out = { type = "string", meta = "FILE", required = true, help = "where the float32 [T, vocab] logits go" },
  mode = { type = "string", meta = "M", default = "prefill",
    help = "prefill (one step; steps of 4096 beyond), decode (one token per step) or chunked:N" },
  dump_topk = { type = "string", meta = "FILE",
    help = "JSON {\"layers\": {L: [[entries...] per token]}}: compressed entries each ratio-4 layer attended" },
  dump_routes = { type = "string", meta = "FILE",
    help = "JSON {\"layers\": {L: [[experts...] per token]}}: routed experts of every layer" },
  reference = { type = "boolean", help = "compute with the golden scalar reference instead of the fast path" },
  threads = { type = "number", meta = "N", help = "OpenMP threads (default: OMP_NUM_THREADS or all cores)" },
}

local M = {
  summary = "write the logits of every position of a token sequence",
  usage = "usage: tide logits --model DIR --tokens 0,5,17,... --out FILE [--mode prefill|decode|chunked:N]\n"
    .. "                   [--dump-topk FILE] [--dump-routes FILE] [--reference]\n" .. args.help(spec),
}

local function parse_ids(s)
  local ids = {}
  for w in s:gmatch("[^,%s]+") do
    local v = tonumber(w)
    if not v or v ~= math.floor(v) then args.fail("logits: bad token id '" .. w .. "' in --tokens") end
    ids[#ids + 1] = v
  end
  if #ids == 0 then args.fail("logits: --tokens is empty") end
  return ids
end

-- {"layers": {"3": [[...], ...]}} with layers as string keys, sorted.
local function write_dump(path, dump)
  local layers = {}
  for L in pairs(dump) do layers[#layers + 1] = L end
  table.sort(layers)
  local parts = {}
  for _, L in ipairs(layers) do
    local rows = {}
    for i, r in ipairs(dump[L]) do rows[i] = "[" .. table.concat(r, ",") .. "]" end
    parts[#parts + 1] = string.format('"%d": [%s]', L, table.concat(rows, ","))
  end
  local f, err = io.open(path, "wb")
  if not f then args.fail("logits: " .. tostring(err), 1) end
  f:write('{"layers": {', table.concat(parts, ", "), "}}\n")
  f:close()
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "logits")
  if #pos > 0 then args.fail("logits: unexpected argument '" .. pos[1] .. "'") end
  local tide = require("tide")
  if o.threads then tide.threads(o.threads) end
  local ids = parse_ids(o.tokens)
  local T = #ids
  local chunk
  -- prefill is one step; past 4096 tokens it runs in steps of 4096 to bound
  -- the activation buffers (the logits are bitwise the same either way)
  if o.mode == "prefill" then chunk = math.min(T, 4096)
  elseif o.mode == "decode" then chunk = 1
  else
    chunk = tonumber(o.mode:match("^chunked:(%d+)$"))
    if not chunk or chunk < 1 then args.fail("logits: --mode must be prefill, decode or chunked:N") end
  end
  chunk = math.min(chunk, T)
  local model, err = tide.model(o.model, {
    max_tokens = chunk, tokenizer = false,
    cache = { context = T, max_seqs = 2, seq_budget = 1 },
  })
  if not model then args.fail("logits: cannot load the model: " .. tostring(err), 1) end
  for i, id in ipairs(ids) do
    if id < 0 or id >= model.vocab_size then
      args.fail(string.format("logits: token id %d (number %d in --tokens) is outside the vocabulary of %s (0..%d)",
        id, i, o.model, model.vocab_size - 1))
    end
  end
  if o.reference then model:use_reference(true) end
  local topk = o.dump_topk and {} or nil
  local routes = o.dump_routes and {} or nil
  local ok, logits = pcall(model.logits, model, ids, {
    mode = o.mode == "prefill" and "chunked:" .. chunk or o.mode,
    step = { dump_topk = topk, dump_routes = routes },
  })
  if not ok then args.fail("logits: " .. tostring(logits), 1) end
  local f, ferr = io.open(o.out, "wb")
  if not f then args.fail("logits: " .. tostring(ferr), 1) end
  local ffi = require("ffi")
  f:write(ffi.string(logits.data, T * model.vocab_size * 4))
  f:close()
  if topk then write_dump(o.dump_topk, topk) end
  if routes then write_dump(o.dump_routes, routes) end
  print(T .. " " .. model.vocab_size)
  model:close()
  return 0
end

return M
