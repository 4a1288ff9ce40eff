-- tide inspect --model DIR: what a checkpoint holds, from its headers only
-- (no tensor data is read): the config summary, tensor/element/byte counts
-- per dtype, and one line per tensor (name, dtype, shape, shard).
local args = require("tide.cli.args")

local spec = {
  model = { type = "string", meta = "DIR", required = true, help = "checkpoint directory or .safetensors file" },
  tensors = { type = "boolean", default = true, help = "list every tensor (--no-tensors: summary only)" },
  filter = { type = "string", meta = "PATTERN", help = "list only tensors whose name matches this Lua pattern" },
  check = { type = "boolean", default = true,
    help = "check the tensors against config.json (--no-check: list a checkpoint that fails it)" },
}

local M = {
  summary = "show a checkpoint's config, dtype counts and tensors",
  usage = "usage: tide inspect --model DIR [--no-tensors] [--filter PATTERN] [--no-check]\n" .. args.help(spec),
}

-- 1234567 -> "1,234,567"
local function commas(n)
  local s = string.format("%d", n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""):gsub("^%-,", "-"))
end

local function human(b)
  if b >= 1e9 then return string.format("%.2f GB", b / 1e9) end
  if b >= 1e6 then return string.format("%.2f MB", b / 1e6) end
  if b >= 1e3 then return string.format("%.1f kB", b / 1e3) end
  return string.format("%d B", b)
end

local function shape_str(s)
  local p = {}
  for i, v in ipairs(s) do p[i] = tostring(v) end
  return "[" .. table.concat(p, ", ") .. "]"
end

-- the config in a few lines (also tide.describe's long form of a model)
local function config_lines(c, given)
  local ratios = {}
  for i, r in ipairs(c.compress_ratios) do
    ratios[#ratios + 1] = (i == c.num_hidden_layers + 1 and "| " or "") .. tostring(r)
  end
  local fmt = { [0] = "bf16", "fp8", "fp4" }
  local q = c.quant_method ~= "" and string.format("%s (%s, %dx%d %s)", c.quant_method, c.quant_fmt,
    c.weight_block_size[1], c.weight_block_size[2], c.quant_scale_fmt) or "none"
  local rope = c.rope_scaling and string.format("%s x%g from %g positions, beta %g/%g", c.rope_scaling_type,
    c.rope_factor, c.rope_original_max_position_embeddings, c.rope_beta_fast, c.rope_beta_slow) or "no scaling"
  local lines = {
    string.format("%s (%s), vocab %s, hidden %d, %d layers + %d MTP, max positions %s", c.model_type, c.architecture,
      commas(c.vocab_size), c.hidden_size, c.num_hidden_layers, c.num_nextn_predict_layers,
      commas(c.max_position_embeddings)),
    string.format("attention: %d heads x %d (rope %d), q_lora %d, o_lora %d x %d groups, window %d, kv heads %d",
      c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.q_lora_rank, c.o_lora_rank, c.o_groups,
      c.sliding_window, c.num_key_value_heads),
    "compress ratios: " .. table.concat(ratios, " "),
    string.format("indexer: %d heads x %d, top-k %d; rope theta %g, compressed layers %g with %s", c.index_n_heads,
      c.index_head_dim, c.index_topk, c.rope_theta, c.compress_rope_theta, rope),
    string.format("moe: %d experts, %d per token, %d shared, width %d, %d hash layers, %s/%s, norm %s, scale %g, "
      .. "swiglu limit %g", c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size,
      c.num_hash_layers, c.scoring_func, c.topk_method, tostring(c.norm_topk_prob), c.routed_scaling_factor,
      c.swiglu_limit),
    string.format("mhc: %d streams, %d sinkhorn iterations, eps %g; rms eps %g; bos %d eos %d; tied embeddings %s",
      c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, c.bos_token_id, c.eos_token_id,
      tostring(c.tie_word_embeddings)),
    string.format("weights: quantization %s; linears %s, experts %s%s", q, fmt[c.linear_format], fmt[c.expert_format],
      c.expert_dtype ~= "" and (" (expert_dtype " .. c.expert_dtype .. ")") or ""),
  }
  if given then
    local defaulted = {}
    for _, k in ipairs({ "vocab_size", "hidden_size", "num_hidden_layers", "compress_ratios", "index_topk",
      "n_routed_experts", "num_hash_layers", "hc_mult", "rope_scaling", "sliding_window", "swiglu_limit",
      "routed_scaling_factor", "num_nextn_predict_layers", "max_position_embeddings", "rms_norm_eps" }) do
      if given[k] == nil then defaulted[#defaulted + 1] = k end
    end
    if #defaulted > 0 then
      lines[#lines + 1] = "defaults (absent from config.json): " .. table.concat(defaulted, ", ")
    end
  end
  return lines
end

M.config_lines = config_lines

function M.run(argv)
  local o, pos = args.parse(argv, spec, "inspect")
  if #pos > 0 then args.fail("inspect: unexpected argument '" .. pos[1] .. "' (use --model DIR)") end
  if o.filter then
    local okp, perr = pcall(string.match, "", o.filter)
    if not okp then
      args.fail("inspect: --filter '" .. o.filter .. "' is not a Lua pattern: " .. require("tide.errors").clean(perr))
    end
  end
  local ckpt = require("tide.checkpoint")
  local ck, err = ckpt.load(o.model, { config = false, check = o.check })
  if not ck then args.fail(err, 1) end
  local s = ck:summary()
  local out = {}
  local function say(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
  say("checkpoint %s: %d shard%s, %s tensors, %s (%s bytes), %s parameters", o.model, s.shards,
    s.shards == 1 and "" or "s", commas(s.tensors), human(s.bytes), commas(s.bytes), commas(s.parameters))
  if s.index_total_size >= 0 and s.index_total_size ~= s.bytes then
    say("  index metadata.total_size %s differs from the tensors' %s bytes", commas(s.index_total_size),
      commas(s.bytes))
  end
  if ck.config then
    local ok, cjson = pcall(require, "cjson")
    local given = ok and select(2, pcall(cjson.decode, ck:config_json())) or nil
    for _, l in ipairs(config_lines(ck.config, type(given) == "table" and given or nil)) do say("  %s", l) end
  else
    say("  no config.json")
  end
  say("%-8s %10s %18s %18s", "dtype", "tensors", "elements", "bytes")
  local names = {}
  for k in pairs(s.by_dtype) do names[#names + 1] = k end
  table.sort(names, function(a, b) return s.by_dtype[a].bytes > s.by_dtype[b].bytes end)
  for _, k in ipairs(names) do
    local d = s.by_dtype[k]
    say("%-8s %10s %18s %18s", k, commas(d.count), commas(d.elements), commas(d.bytes))
  end
  io.write(table.concat(out, "\n"), "\n")
  if o.tensors then
    local infos = ck:infos()
    local width = 20
    for _, i in ipairs(infos) do if #i.name > width then width = #i.name end end
    local lines = {}
    local shown = 0
    for _, i in ipairs(infos) do
      if not o.filter or i.name:match(o.filter) then
        shown = shown + 1
        lines[#lines + 1] = string.format("%-" .. width .. "s  %-7s %-18s %s", i.name, i.dtype, shape_str(i.shape),
          i.shard:match("[^/]*$"))
        if #lines >= 4096 then
          io.write(table.concat(lines, "\n"), "\n")
          lines = {}
        end
      end
    end
    if #lines > 0 then io.write(table.concat(lines, "\n"), "\n") end
    if o.filter then io.write(string.format("%d of %d tensors match '%s'\n", shown, #infos, o.filter)) end
  end
  ck:close()
  return 0
end

return M
