-- make_checkpoint.lua: write a deterministic random DeepSeek-V4 checkpoint
-- directory in exactly the Hugging Face layout (config.json, safetensors
-- shards with the names, shapes and dtypes of deepseek-v4.md 1.6, an index
-- when sharded, the tokenizer when the vocabulary is DeepSeek's).
--
--   tide scripts/make_checkpoint.lua --preset tiny --out /tmp/tiny
--   tide scripts/make_checkpoint.lua --preset tiny --variant bf16 --set index_topk=16 --out /tmp/t16
--   tide scripts/make_checkpoint.lua --preset flash --header-only --out /tmp/flash   (sparse stand-in)
--
-- Presets: tiny (doc 5), demo (tiny layers, DeepSeek vocabulary and
-- tokenizer), bench (Flash layer shapes, 4 layers, 16 experts, 32k vocab,
-- ~1.9 GB), flash and pro (the real configs; use --header-only).
-- The same options give the same bytes: every tensor's values depend only on
-- the seed and its name.
local tide = rawget(_G, "tide") or require("tide")
local args = require("tide.cli.args")
local ckpt = require("tide.checkpoint")
local cjson = require("cjson")
local ffi = require("ffi")

local spec = {
  preset = { type = "string", meta = "NAME", help = "tiny | demo | bench | flash | pro" },
  config = { type = "string", meta = "FILE", help = "start from this config.json instead of a preset" },
  variant = { type = "string", default = "fp8", help = "fp8 (FP8 linears, MXFP4 experts) or bf16 (every matrix BF16)" },
  seed = { type = "number", default = 1, help = "random seed" },
  shards = { type = "number", help = "number of shards (default: 46 for flash, 64 for pro, else 1)" },
  header_only = { type = "boolean", help = "write headers only; the data sections are sparse holes" },
  set = { type = "list", meta = "KEY=VALUE", help = "override a config field (VALUE is JSON; a.b for nested)" },
  tokenizer = { type = "string", meta = "PATH",
    help = "copy tokenizer.json (+ tokenizer_config.json) from PATH; 'none' to skip" },
  out = { type = "string", meta = "DIR", required = true, help = "output directory (created)" },
  quiet = { type = "boolean", help = "print nothing on success" },
}
local USAGE = "usage: tide scripts/make_checkpoint.lua (--preset NAME | --config FILE) --out DIR [options]\n"
  .. args.help(spec)

-- ---- presets (Hugging Face field names) ----
local function quant() return {
  quant_method = "fp8", fmt = "e4m3", weight_block_size = { 128, 128 }, scale_fmt = "ue8m0",
  activation_scheme = "dynamic",
} end

local function base()
  return {
    architectures = { "DeepseekV4ForCausalLM" }, model_type = "deepseek_v4", torch_dtype = "bfloat16",
    num_key_value_heads = 1, head_dim = 512, qk_rope_head_dim = 64, sliding_window = 128,
    rope_theta = 10000, compress_rope_theta = 160000, index_head_dim = 128, n_shared_experts = 1,
    scoring_func = "sqrtsoftplus", topk_method = "noaux_tc", norm_topk_prob = true, swiglu_limit = 10.0,
    hidden_act = "silu", hc_mult = 4, hc_sinkhorn_iters = 20, hc_eps = 1e-6, rms_norm_eps = 1e-6,
    tie_word_embeddings = false, attention_bias = false, bos_token_id = 0, eos_token_id = 1,
    quantization_config = quant(), expert_dtype = "fp4",
  }
end

local function merge(t, extra)
  for k, v in pairs(extra) do t[k] = v end
  return t
end

local PRESETS = {}
function PRESETS.tiny()
  return merge(base(), {
    vocab_size = 1024, hidden_size = 256, num_hidden_layers = 4, num_attention_heads = 4, q_lora_rank = 128,
    o_lora_rank = 64, o_groups = 2, compress_ratios = { 0, 4, 128, 4, 0 },
    rope_scaling = { type = "yarn", factor = 16, original_max_position_embeddings = 256, beta_fast = 32,
      beta_slow = 1 },
    max_position_embeddings = 4096, index_n_heads = 8, index_topk = 512, n_routed_experts = 64,
    num_experts_per_tok = 6, moe_intermediate_size = 128, num_hash_layers = 1, routed_scaling_factor = 1.5,
    num_nextn_predict_layers = 1,
  })
end
function PRESETS.demo() return merge(PRESETS.tiny(), { vocab_size = 129280 }) end

local function flash_yarn()
  return { type = "yarn", factor = 16, original_max_position_embeddings = 65536, beta_fast = 32, beta_slow = 1 }
end
function PRESETS.flash()
  local r = { 0, 0 }
  for _ = 1, 20 do r[#r + 1] = 4; r[#r + 1] = 128 end
  r[#r + 1] = 4; r[#r + 1] = 0
  return merge(base(), {
    vocab_size = 129280, hidden_size = 4096, num_hidden_layers = 43, num_attention_heads = 64, q_lora_rank = 1024,
    o_lora_rank = 1024, o_groups = 8, compress_ratios = r, rope_scaling = flash_yarn(),
    max_position_embeddings = 1048576, index_n_heads = 64, index_topk = 512, n_routed_experts = 256,
    num_experts_per_tok = 6, moe_intermediate_size = 2048, num_hash_layers = 3, routed_scaling_factor = 1.5,
    num_nextn_predict_layers = 1,
  })
end
function PRESETS.pro()
  local r = { 128, 128 }
  for L = 2, 60 do r[#r + 1] = (L % 2 == 0) and 4 or 128 end
  r[#r + 1] = 0
  return merge(base(), {
    vocab_size = 129280, hidden_size = 7168, num_hidden_layers = 61, num_attention_heads = 128, q_lora_rank = 1536,
    o_lora_rank = 1024, o_groups = 16, compress_ratios = r, rope_scaling = flash_yarn(),
    max_position_embeddings = 1048576, index_n_heads = 64, index_topk = 1024, n_routed_experts = 384,
    num_experts_per_tok = 6, moe_intermediate_size = 3072, num_hash_layers = 3, routed_scaling_factor = 2.5,
    num_nextn_predict_layers = 1,
  })
end
function PRESETS.bench()
  return merge(PRESETS.flash(), {
    vocab_size = 32768, num_hidden_layers = 4, compress_ratios = { 0, 4, 128, 4 }, n_routed_experts = 16,
    num_hash_layers = 1, num_nextn_predict_layers = 0,
  })
end
local DEFAULT_SHARDS = { flash = 46, pro = 64 }

-- ---- deterministic JSON (sorted keys, 2-space indent) ----
local function num(v)
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  for p = 15, 17 do
    local s = string.format("%." .. p .. "g", v)
    if tonumber(s) == v then return s end
  end
  return string.format("%.17g", v)
end

local function encode(v, indent)
  indent = indent or ""
  if v == cjson.null or v == nil then return "null" end
  local ty = type(v)
  if ty == "boolean" then return tostring(v) end
  if ty == "number" then return num(v) end
  if ty == "string" then return cjson.encode(v) end
  if ty ~= "table" then error("cannot encode a " .. ty .. " in JSON") end
  if #v > 0 or next(v) == nil then
    local flat = true
    for _, x in ipairs(v) do if type(x) == "table" then flat = false end end
    local parts = {}
    for i, x in ipairs(v) do parts[i] = encode(x, indent .. "  ") end
    if flat then return "[" .. table.concat(parts, ", ") .. "]" end
    return "[\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  local parts = {}
  for i, k in ipairs(keys) do parts[i] = cjson.encode(k) .. ": " .. encode(v[k], indent .. "  ") end
  return "{\n" .. indent .. "  " .. table.concat(parts, ",\n" .. indent .. "  ") .. "\n" .. indent .. "}"
end

-- ---- files ----
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

local function write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- ---- initialisation: activations of order one, every path alive ----
-- Matrices: std 1/sqrt(fan_in), so each projection keeps its input's scale
-- (N(0, 0.02) would make the attention and expert outputs vanish at these
-- sizes). Embeddings std 1 (the first mHC rms-normalises anyway); norms 1 +-
-- 0.09; hc_*_fn std 1/sqrt(hc d) so the mixing logits are ~N(0,1) and pre,
-- post and the Sinkhorn matrix vary per token; attn_sink N(0,1)-like; ape
-- std 0.5 (the compressor's pooling weights differ per position);
-- gate.bias std 0.1; scales 1 +- 0.09; bases std 0.1.
local function init_for(s, cfg)
  local n = s.name
  if s.kind == "embed" then return 0, 1 end
  if s.kind == "weight" then return 0, 1 / math.sqrt(s.cols) end
  if s.kind == "norm" then return 1, 0.05 end
  if n:match("_fn$") then return 0, 1 / math.sqrt(cfg.hc_mult * cfg.hidden_size) end
  if n:match("_base$") then return 0, 0.1 end
  if n:match("_scale$") then return 1, 0.05 end
  if n:match("attn_sink$") then return 0, 1 end
  if n:match("ape$") then return 0, 0.5 end
  if n:match("gate%.bias$") then return 0, 0.1 end
  error("no init rule for " .. n)
end

local release = tide.C.tide_tensor_release

local function generate(w, specs, i, seed, cfg)
  local s = specs[i]
  local tseed = ckpt.seed(seed, s.name)
  local t = tide.zeros(s.shape, s.dtype)
  if s.kind == "ids" then
    ckpt.gen_ids(t, tseed, cfg.n_routed_experts)
    assert(w:write(s.name, t))
    release(t)
    return i + 1
  end
  local mean, std = init_for(s, cfg)
  local nxt = specs[i + 1]
  if s.kind == "weight" and nxt and nxt.kind == "scale" then
    local sc = tide.zeros(nxt.shape, nxt.dtype)
    ckpt.gen_weight(t, sc, tseed, mean, std)
    assert(w:write(s.name, t))
    assert(w:write(nxt.name, sc))
    release(t)
    release(sc)
    return i + 2
  end
  ckpt.gen_weight(t, nil, tseed, mean, std)
  assert(w:write(s.name, t))
  release(t)
  return i + 1
end

-- split the inventory into n shards of about equal bytes, in order
local function split(specs, n)
  local function bytes(s)
    local e = 1
    for _, d in ipairs(s.shape) do e = e * d end
    return e * tide.ffi.C.tide_dtype_bits(tide.dtypes[s.dtype]) / 8
  end
  local total = 0
  for _, s in ipairs(specs) do s.bytes = bytes(s); total = total + s.bytes end
  if n > #specs then args.fail("make_checkpoint: " .. n .. " shards for " .. #specs .. " tensors", 1) end
  local groups, acc, g = {}, 0, 1
  groups[1] = {}
  for i, s in ipairs(specs) do
    local left = #specs - i + 1
    -- a scale stays with its weight; never leave a later shard empty
    if #groups[g] > 0 and g < n and s.kind ~= "scale" and (acc >= total * g / n or left <= n - g) then
      g = g + 1
      groups[g] = {}
    end
    table.insert(groups[g], s)
    acc = acc + s.bytes
  end
  return groups, total
end

local function set_field(cfg, key, value)
  local v
  local ok, dec = pcall(cjson.decode, value)
  if ok then v = dec else v = value end
  local t = cfg
  local parts = {}
  for p in key:gmatch("[^%.]+") do parts[#parts + 1] = p end
  if #parts == 0 then args.fail("make_checkpoint: bad --set '" .. key .. "'") end
  for i = 1, #parts - 1 do
    if type(t[parts[i]]) ~= "table" then t[parts[i]] = {} end
    t = t[parts[i]]
  end
  t[parts[#parts]] = v
end

local function main(argv)
  local o, pos = args.parse(argv, spec, "make_checkpoint")
  if #pos > 0 then args.fail("make_checkpoint: unexpected argument '" .. pos[1] .. "'\n" .. USAGE) end
  if (o.preset == nil) == (o.config == nil) then
    args.fail("make_checkpoint: give one of --preset or --config\n" .. USAGE)
  end
  local cfg
  if o.preset then
    local mk = PRESETS[o.preset]
    if not mk then args.fail("make_checkpoint: unknown preset '" .. o.preset .. "' (tiny, demo, bench, flash, pro)") end
    cfg = mk()
  else
    local text, err = read_file(o.config)
    if not text then args.fail("make_checkpoint: " .. tostring(err), 1) end
    local ok, dec = pcall(cjson.decode, text)
    if not ok or type(dec) ~= "table" then args.fail("make_checkpoint: " .. o.config .. " is not a JSON object", 1) end
    cfg = dec
  end
  if o.variant == "bf16" then
    cfg.quantization_config = nil
    cfg.expert_dtype = nil
  elseif o.variant ~= "fp8" then
    args.fail("make_checkpoint: --variant must be fp8 or bf16")
  end
  for _, kv in ipairs(o.set or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if not k then args.fail("make_checkpoint: --set expects KEY=VALUE, got '" .. kv .. "'") end
    set_field(cfg, k, v)
  end
  local text = encode(cfg) .. "\n"
  local ccfg, ctab = ckpt.parse_config(text, o.out .. "/config.json")
  if not ccfg then args.fail("make_checkpoint: " .. ctab, 1) end
  local t0 = tide.time()
  local specs = ckpt.inventory(ccfg)
  local nshards = o.shards or DEFAULT_SHARDS[o.preset] or 1
  if nshards < 1 or nshards ~= math.floor(nshards) then args.fail("make_checkpoint: --shards must be >= 1") end
  local groups, total = split(specs, nshards)

  os.execute("mkdir -p " .. q(o.out))
  -- remove what an earlier run may have left (other shard counts)
  local p = io.popen("ls " .. q(o.out) .. " 2>/dev/null")
  for f in p:lines() do
    if f:match("^model.*%.safetensors$") or f == "model.safetensors.index.json" then os.remove(o.out .. "/" .. f) end
  end
  p:close()
  write_file(o.out .. "/config.json", text)

  local seed = ffi.new("uint64_t", o.seed)
  local weight_map = {}
  for g, list in ipairs(groups) do
    local file = nshards == 1 and "model.safetensors" or string.format("model-%05d-of-%05d.safetensors", g, nshards)
    local w = assert(ckpt.writer(o.out .. "/" .. file))
    w:meta("format", "pt")
    for _, s in ipairs(list) do
      w:declare(s.name, s.dtype, s.shape)
      weight_map[s.name] = file
    end
    if o.header_only then
      assert(w:finish(true))
    else
      local i = 1
      while i <= #list do i = generate(w, list, i, seed, ctab) end
      assert(w:finish(false))
    end
  end
  if nshards > 1 then
    write_file(o.out .. "/model.safetensors.index.json",
      encode({ metadata = { total_size = total }, weight_map = weight_map }) .. "\n")
  end

  -- the tokenizer, when the vocabulary is DeepSeek's (or asked for)
  local tok = o.tokenizer
  if tok == nil and ctab.vocab_size == 129280 then tok = require("tide.tokenizer").default_path() end
  if tok and tok ~= "none" then
    local dir = tok:match("%.json$") and (tok:match("^(.*)/[^/]*$") or ".") or tok
    local main_file = tok:match("%.json$") and tok or (dir .. "/tokenizer.json")
    local data, err = read_file(main_file)
    if not data then args.fail("make_checkpoint: cannot read the tokenizer: " .. tostring(err), 1) end
    write_file(o.out .. "/tokenizer.json", data)
    if file_exists(dir .. "/tokenizer_config.json") then
      write_file(o.out .. "/tokenizer_config.json", read_file(dir .. "/tokenizer_config.json"))
    end
  end
  if not o.quiet then
    io.stderr:write(string.format("make_checkpoint: %s: %d tensors, %.3f GB in %d shard%s%s (%.1f s)\n", o.out, #specs,
      total / 1e9, nshards, nshards == 1 and "" or "s", o.header_only and " (header only)" or "", tide.time() - t0))
  end
  return 0
end

local ok, err = pcall(main, arg or {})
if not ok then
  if type(err) == "table" and err.tide_user_error then
    io.stderr:write(err.msg, "\n")
    os.exit(err.status or 2, true)
  end
  io.stderr:write("make_checkpoint: ", tostring(err), "\n")
  os.exit(1, true)
end
