-- export.lua: turn the float32 export of a trained model (scripts/train/export.py) into a
-- checkpoint directory in the Hugging Face DeepSeek-V4 layout tide loads, in the formats
-- DeepSeek ships: FP8 e4m3 with 128x128 UE8M0 block scales for the dense matrices, MXFP4
-- routed experts, BF16 for embed/head/norms/gate/compressors/indexer weights_proj, F32 for
-- the mHC parameters, sinks, ape and gate.bias, I64 tid2eid (doc section 1.4/1.6). With
-- --variant bf16 every matrix is BF16 instead (the unquantised comparison).
--
--   tide scripts/train/export.lua --in build/train/f32 --out models/tide-tiny-en [--variant fp8|bf16]
--        [--tokenizer DIR]
-- The tensor list, names, shapes and formats come from tide's own inventory of the config
-- (tide.checkpoint.inventory), and the quantisers are tide's (checkpoint.quant_fp8/_mxfp4).
local tide = rawget(_G, "tide") or require("tide")
local args = require("tide.cli.args")
local ckpt = require("tide.checkpoint")
local cjson = require("cjson")

local spec = {
  ["in"] = { type = "string", meta = "DIR", required = true,
    help = "export.py output (config.json, model.f32.safetensors)" },
  out = { type = "string", meta = "DIR", required = true, help = "checkpoint directory to write" },
  variant = { type = "string", default = "fp8", help = "fp8 (FP8 linears, MXFP4 experts) or bf16" },
  tokenizer = { type = "string", meta = "DIR", help = "copy tokenizer.json and tokenizer_config.json from DIR" },
}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function main(argv)
  local o = args.parse(argv, spec, "export")
  local cfg = cjson.decode(read(o["in"] .. "/config.json"))
  if o.variant == "bf16" then
    cfg.quantization_config = nil
    cfg.expert_dtype = nil
  elseif o.variant ~= "fp8" then
    args.fail("export: --variant must be fp8 or bf16")
  end
  -- the config text: keys sorted, so the file is the same for the same model
  local keys = {}
  for k in pairs(cfg) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = "  " .. cjson.encode(k) .. ": " .. cjson.encode(cfg[k]) end
  local text = "{\n" .. table.concat(parts, ",\n") .. "\n}\n"
  local ccfg, err = ckpt.parse_config(text, o.out .. "/config.json")
  if not ccfg then args.fail("export: " .. tostring(err), 1) end
  local src = assert(tide.load(o["in"] .. "/model.f32.safetensors", { config = false, check = false }))
  os.execute("mkdir -p '" .. o.out .. "'")
  write(o.out .. "/config.json", text)
  local specs = ckpt.inventory(ccfg)
  local w = assert(ckpt.writer(o.out .. "/model.safetensors"))
  w:meta("format", "pt")
  for _, s in ipairs(specs) do w:declare(s.name, s.dtype, s.shape) end
  local i = 1
  while i <= #specs do
    local s = specs[i]
    if not src:has(s.name) then args.fail("export: " .. s.name .. " missing from the float32 export", 1) end
    local x = src:tensor(s.name)
    if s.format == "fp8" then
      local q, sc = ckpt.quant_fp8(x:contiguous())
      assert(w:write(s.name, q))
      assert(w:write(specs[i + 1].name, sc))
      i = i + 2
    elseif s.format == "fp4" then
      local q, sc = ckpt.quant_mxfp4(x:contiguous())
      assert(w:write(s.name, q))
      assert(w:write(specs[i + 1].name, sc))
      i = i + 2
    else
      assert(w:write(s.name, x:to(s.dtype)))
      i = i + 1
    end
  end
  assert(w:finish(false))
  if o.tokenizer then
    write(o.out .. "/tokenizer.json", read(o.tokenizer .. "/tokenizer.json"))
    write(o.out .. "/tokenizer_config.json", read(o.tokenizer .. "/tokenizer_config.json"))
  end
  io.stderr:write(string.format("export: %d tensors (%s) -> %s\n", #specs, o.variant, o.out))
  return 0
end

local ok, err = pcall(main, arg or {})
if not ok then
  if type(err) == "table" and err.tide_user_error then
    io.stderr:write(err.msg, "\n")
    os.exit(err.status or 2, true)
  end
  io.stderr:write("export: ", tostring(err), "\n")
  os.exit(1, true)
end
