-- tide detokenize: token ids -> text.
local args = require("tide.cli.args")

local spec = {
  tokenizer = { type = "string", meta = "PATH",
    help = "model dir or tokenizer.json (default $TIDE_TOKENIZER or the DeepSeek-V3 one in build-deps/)" },
  ids = { type = "string", meta = "IDS", help = "ids separated by spaces or commas" },
  file = { type = "string", meta = "F", help = "read ids from a file (- = stdin, the default)" },
  skip_special = { type = "boolean", help = "drop special tokens (BOS, EOS, ...)" },
  stream = { type = "boolean", help = "decode id by id with the streaming detokenizer, flushing after each" },
}

local M = {
  summary = "decode token ids to text",
  usage = "usage: tide detokenize [--tokenizer PATH] [--ids \"1 2 3\" | --file F] [--skip-special] [--stream]\n"
    .. args.help(spec),
}

function M.run(argv)
  local o, pos = args.parse(argv, spec, "detokenize")
  local src = o.ids
  if src and o.file then args.fail("detokenize: give --ids or --file, not both") end
  if #pos > 0 then src = (src and (src .. " ") or "") .. table.concat(pos, " ") end
  if not src then
    local path = o.file or "-"
    if path == "-" then src = io.read("*a")
    else
      local f, err = io.open(path, "rb")
      if not f then args.fail("detokenize: " .. tostring(err), 1) end
      src = f:read("*a")
      f:close()
    end
  end
  local ids = {}
  for w in src:gmatch("[^%s,%[%]]+") do
    local v = tonumber(w)
    if not v or v ~= math.floor(v) then args.fail("detokenize: '" .. w .. "' is not a token id", 1) end
    ids[#ids + 1] = v
  end
  local tok = require("tide.cli.tokenize").open(o.tokenizer)
  local opts = { skip_special_tokens = o.skip_special }
  if o.stream then
    local s = tok:streamer(opts)
    for _, id in ipairs(ids) do
      local ok, piece = pcall(s.put, s, id)
      if not ok then args.fail("detokenize: " .. tostring(piece), 1) end
      io.write(piece)
      io.stdout:flush()
    end
    io.write(s:flush(), "\n")
  else
    local ok, text = pcall(tok.decode, tok, ids, opts)
    if not ok then args.fail("detokenize: " .. tostring(text), 1) end
    io.write(text, "\n")
  end
  tok:close()
  return 0
end

return M
