-- tide tokenize: text -> token ids with a Hugging Face tokenizer.json.
local args = require("tide.cli.args")

local spec = {
  tokenizer = { type = "string", meta = "PATH",
    help = "model dir or tokenizer.json (default $TIDE_TOKENIZER or the DeepSeek-V3 one in build-deps/)" },
  text = { type = "string", meta = "T", help = "the text to encode" },
  file = { type = "string", meta = "F", help = "read the text from a file (- = stdin)" },
  ids = { type = "boolean", help = "print ids on one line, space-separated (the default)" },
  pieces = { type = "boolean", help = "print one token per line: id, tab, vocabulary text (e.g. 'Ġthe')" },
  count = { type = "boolean", help = "print only the number of tokens" },
  special = { type = "boolean", default = true,
    help = "add BOS/EOS as the tokenizer config says (--no-special: do not)" },
  split_special = { type = "boolean", help = "encode special tokens found in the text as plain text" },
}

local M = {
  summary = "encode text to token ids",
  usage = "usage: tide tokenize [--tokenizer PATH] (--text T | --file F) [--ids | --pieces | --count] [--no-special]\n"
    .. args.help(spec),
}

local function read_file(path)
  if path == "-" then return io.read("*a") end
  local f, err = io.open(path, "rb")
  if not f then args.fail("tokenize: " .. tostring(err), 1) end
  local s = f:read("*a")
  f:close()
  return s
end

-- Shared by detokenize: open the tokenizer or fail with its message.
function M.open(path)
  local tk = require("tide.tokenizer")
  local tok, err = tk.new(path)
  if not tok then args.fail(err, 1) end
  return tok
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "tokenize")
  if #pos > 0 then args.fail("tokenize: unexpected argument '" .. pos[1] .. "' (use --text or --file)") end
  if (o.text == nil) == (o.file == nil) then args.fail("tokenize: give exactly one of --text T or --file F") end
  if o.pieces and o.count then args.fail("tokenize: --pieces and --count exclude each other") end
  local text = o.text or read_file(o.file)
  local tok = M.open(o.tokenizer)
  local ids = tok:encode(text, { add_special_tokens = o.special, split_special_tokens = o.split_special })
  if o.count then
    print(#ids)
  elseif o.pieces then
    local toks = tok:tokens(ids)
    local out = {}
    for i = 1, #ids do out[i] = ids[i] .. "\t" .. toks[i] end
    if #out > 0 then io.write(table.concat(out, "\n"), "\n") end
  else
    io.write(table.concat(ids, " "), "\n")
  end
  tok:close()
  return 0
end

return M
