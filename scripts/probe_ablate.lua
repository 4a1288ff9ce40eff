-- scripts/probe_ablate.lua: ablations with probes. Zero one attention head's
-- output (attn_heads: the per-head output before the output projection) or
-- drop one routed expert (moe_weights: its routing weight set to 0, so it
-- contributes nothing), on one layer, and measure how the prompt's
-- next-token distribution moves (KL divergence from the intact model, and
-- the top token before and after).
--   tide scripts/probe_ablate.lua MODEL head|expert LAYER INDEX [PROMPT]
-- PROMPT is text (the model's tokenizer) or ids "5,17,42".
local tide = require("tide")

local dir, kind, L, idx = arg[1], arg[2] or "head", tonumber(arg[3] or "0"), tonumber(arg[4] or "0")
if not dir or (kind ~= "head" and kind ~= "expert") then
  io.stderr:write("usage: tide scripts/probe_ablate.lua MODEL head|expert LAYER INDEX [PROMPT]\n")
  os.exit(2)
end
local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 1024, max_seqs = 2 } }))
local prompt = arg[5] or "Once upon a time there was"
local ids = {}
if prompt:match("^[%d,]+$") then
  for x in prompt:gmatch("%d+") do ids[#ids + 1] = tonumber(x) end
else
  ids = assert(m.tokenizer, "the model has no tokenizer: give ids"):encode(prompt)
end

local ablate
if kind == "head" then
  -- rows [n, H, 512]: zero head idx of every token
  ablate = { at = "attn_heads", layers = { L }, fn = function(o) o:select(1, idx):zero() end }
else
  -- rows [n, k] weights, info.experts [n, k] ids: weight 0 where expert idx was routed
  ablate = { at = "moe_weights", layers = { L }, fn = function(w, info)
    local e = info.experts
    for t = 0, w:size(0) - 1 do
      for k = 0, w:size(1) - 1 do
        if e[t][k] == idx then w[t][k] = 0 end
      end
    end
  end }
end

local function run(probes)
  local seq = assert(m:sequence())
  local row = assert(m:feed(seq, ids, { probes = probes })):clone()
  seq:free()
  return row
end
local base, abl = run(), run({ ablate })
local p, q = base:softmax(), abl:softmax()
-- KL(p || q) = sum p (log p - log q)
local pp, qp = p:totable(), q:totable()
local kl = 0
for i = 1, #pp do
  if pp[i] > 0 then kl = kl + pp[i] * (math.log(pp[i]) - math.log(math.max(qp[i], 1e-30))) end
end
local top0, top1 = base:argmax(), abl:argmax()
io.write(string.format("ablate %s %d at layer %d: KL %.4g nats, top token %d -> %d\n", kind, idx, L, kl, top0, top1))
return { kl = kl, base = base, ablated = abl, top = { top0, top1 } }
