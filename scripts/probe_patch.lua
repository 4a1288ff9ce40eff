-- scripts/probe_patch.lua: activation patching between two prompts of the
-- same length. Run the clean prompt and record a point's rows at every layer;
-- then, layer by layer, run the corrupted prompt with a probe that puts the
-- clean rows of one position in place of its own, and see how far that moves
-- the corrupted run's last-position logits back towards the clean ones
-- (restored = 1 - dist(patched, clean) / dist(corrupted, clean), L2 over the
-- logits). Patching the last position's streams after the last layer
-- restores everything: restored = 1 there, exactly.
--   tide scripts/probe_patch.lua MODEL [CLEAN] [CORRUPTED] [POINT] [POSITION]
-- Prompts are text (the model's tokenizer) or ids "5,17,42"; POINT defaults
-- to resid_moe, POSITION to the last one.
local tide = require("tide")

local dir = arg[1]
if not dir then
  io.stderr:write("usage: tide scripts/probe_patch.lua MODEL [CLEAN] [CORRUPTED] [POINT] [POSITION]\n")
  os.exit(2)
end
local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 1024, max_seqs = 2 } }))
local function ids_of(s)
  if s:match("^[%d,]+$") then
    local t = {}
    for x in s:gmatch("%d+") do t[#t + 1] = tonumber(x) end
    return t
  end
  return assert(m.tokenizer, "the model has no tokenizer: give ids"):encode(s)
end
local clean = ids_of(arg[2] or "The Eiffel Tower is in the city of")
local corrupt = ids_of(arg[3] or "The Colosseum is in the city of")
assert(#clean == #corrupt, "the two prompts must have the same number of tokens")
local point = arg[4] or "resid_moe"
local P = tonumber(arg[5] or (#clean - 1))

-- last-position logits of a prompt with the given probes
local function run(ids, probes)
  local seq = assert(m:sequence())
  local row = assert(m:feed(seq, ids, { probes = probes })):clone()
  seq:free()
  return row
end

local rec = {}                 -- [L] = the clean run's rows at position P
local base_clean = run(clean, { { at = point, fn = function(x, info)
  if P >= info.pos0 and P < info.pos0 + info.n then rec[info.layer] = x:narrow(0, P - info.pos0, 1):clone() end
end } })
local base_corrupt = run(corrupt)
local function dist(a, b) return math.sqrt(a:sub(b):mul(a:sub(b)):sum()) end
local d0 = dist(base_corrupt, base_clean)

local restored = {}
for L = 0, m.net.n_layers - 1 do
  local patched = run(corrupt, { { at = point, layers = { L }, fn = function(x, info)
    if P >= info.pos0 and P < info.pos0 + info.n then x:narrow(0, P - info.pos0, 1):copy(rec[L]) end
  end } })
  restored[L] = d0 > 0 and 1 - dist(patched, base_clean) / d0 or 1
  io.write(string.format("patch %s at layer %2d, position %d: restored %.3f\n", point, L, P, restored[L]))
end
return { restored = restored, clean = base_clean, corrupt = base_corrupt }
