-- scripts/probe_logit_lens.lua: the logit lens. What would the model say if
-- the forward stopped after layer L? A probe keeps the residual streams
-- after each layer's MoE (resid_moe) of the prompt's last token; each goes
-- through the model's own readout (mHC head, final norm, LM head:
-- net:readout) and we print the top tokens per layer. After the last layer
-- the lens is the model's real output, bit for bit.
--   tide scripts/probe_logit_lens.lua MODEL [PROMPT] [TOP]
-- PROMPT is text (the model's tokenizer) or ids "5,17,42".
local tide = require("tide")

local dir = arg[1]
if not dir then
  io.stderr:write("usage: tide scripts/probe_logit_lens.lua MODEL [PROMPT] [TOP]\n")
  os.exit(2)
end
local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 1024, max_seqs = 2 } }))
local prompt, top = arg[2] or "The capital of France is", tonumber(arg[3] or "5")
local ids = {}
if prompt:match("^[%d,]+$") then
  for x in prompt:gmatch("%d+") do ids[#ids + 1] = tonumber(x) end
else
  ids = assert(m.tokenizer, "the model has no tokenizer: give ids"):encode(prompt)
end

local last = #ids - 1          -- position of the last token
local streams = {}             -- [L] = [1, hc, d] copy at the last position
local seq = assert(m:sequence())
local logits = assert(m:feed(seq, ids, { probes = { { at = "resid_moe", fn = function(X, info)
  if last >= info.pos0 and last < info.pos0 + info.n then
    streams[info.layer] = X:narrow(0, last - info.pos0, 1):clone()
  end
end } } })):clone()
seq:free()

local function label(id)
  local b = m.tokenizer and m.tokenizer:id_to_bytes(id)
  return b and string.format("%q", b) or tostring(id)
end
local lens = {}
for L = 0, m.net.n_layers - 1 do
  local lg = m.net:readout(streams[L])[0]
  lens[L] = lg
  local v, ix = lg:topk(top)
  local parts = {}
  for k = 0, top - 1 do parts[#parts + 1] = string.format("%s %.2f", label(ix[k]), v[k]) end
  io.write(string.format("layer %2d: %s\n", L, table.concat(parts, ", ")))
end
return { lens = lens, logits = logits }
