-- scripts/probe_steer.lua: a control vector (activation steering) with probes.
--   tide scripts/probe_steer.lua MODEL [STRENGTH] [FIRST-LAST] [POSITIVE] [NEGATIVE] [PROMPT]
-- 1. The vector: the mean residual streams (resid_moe, [hc, d] per layer)
--    over a "positive" prompt minus those over a "negative" one, per layer.
-- 2. Steering: a probe adds STRENGTH x that layer's vector to every row of the
--    streams after each layer in FIRST..LAST (default: the middle layers).
-- 3. Two engine requests run in the same batched steps from the same prompt
--    and seed, one steered and one not: only the steered one changes (the
--    other is bit for bit what it would be alone).
-- Prompts are text (the model's tokenizer) or ids "5,17,42".
local tide = require("tide")
local probe = require("tide.probe")

local dir = arg[1]
if not dir then
  io.stderr:write("usage: tide scripts/probe_steer.lua MODEL [STRENGTH] [FIRST-LAST] [POSITIVE] [NEGATIVE] [PROMPT]\n")
  os.exit(2)
end
local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 1024, max_seqs = 4 } }))
local nl = m.net.n_layers
local strength = tonumber(arg[2] or "4")
local a, b = (arg[3] or ""):match("^(%d+)-(%d+)$")
local first, last = tonumber(a) or math.floor(nl / 3), tonumber(b) or math.floor(2 * nl / 3)
local function ids_of(s)
  if s:match("^[%d,]+$") then
    local t = {}
    for x in s:gmatch("%d+") do t[#t + 1] = tonumber(x) end
    return t
  end
  return assert(m.tokenizer, "the model has no tokenizer: give ids"):encode(s)
end
local pos = ids_of(arg[4] or "I love this, it is wonderful and happy")
local neg = ids_of(arg[5] or "I hate this, it is awful and sad")
local prompt = ids_of(arg[6] or "Today I feel")

-- 1. mean streams per layer over a prompt (a read-only use of the probe)
local function mean_streams(ids)
  local sum = {}
  local seq = assert(m:sequence())
  local _, err = m:feed(seq, ids, { logits = false, probes = { { at = "resid_moe", fn = function(X, info)
    local s = sum[info.layer]
    if not s then s = tide.zeros({ X:size(1), X:size(2) }) sum[info.layer] = s end
    for j = 0, info.n - 1 do s:add_(X[j]) end
  end } } })
  assert(not err, err)
  seq:free()
  for _, s in pairs(sum) do s:mul_(1 / #ids) end
  return sum
end
local mp, mn = mean_streams(pos), mean_streams(neg)
local vec = {}
for L = first, last do vec[L] = mp[L]:sub(mn[L]) end

-- 2. the steering probe: rows += strength * vec[L] at the chosen layers
local layers = {}
for L = first, last do layers[#layers + 1] = L end
local steer = { at = "resid_moe", layers = layers, name = "steer", fn = function(X, info)
  probe.add_rows(X, vec[info.layer], strength)
end }

-- 3. steered and plain requests in the same batched steps
local eng = tide.engine(m, { budget = 64 })
local hs = eng:submit{ tokens = prompt, max_tokens = 12, seed = 1, probes = { steer } }
local hp = eng:submit{ tokens = prompt, max_tokens = 12, seed = 1 }
eng:run()
local rs, rp = hs:result(), hp:result()
local function show(r)
  return r.text and string.format("%q", r.text) or table.concat(r.tokens, " ")
end
io.write(string.format("layers %d-%d, strength %g\n  steered: %s\n  plain:   %s\n", first, last, strength, show(rs),
  show(rp)))
return { steered = rs.tokens, plain = rp.tokens, vectors = vec, first = first, last = last }
