-- scripts/probe_capture.lua: record activations of one prompt into a
-- safetensors file with a probe (tide.probe, docs/probes.md).
--   tide scripts/probe_capture.lua MODEL OUT.safetensors [PROMPT] [POINT] [LAYERS]
-- PROMPT is text (the model's tokenizer) or ids "5,17,42"; POINT a probe
-- point (default resid_moe: the 4 mHC residual streams after each layer's
-- MoE); LAYERS "2-5" or "3" (default every layer). The file holds one tensor
-- per layer, "<point>.<L>" [T, ...] (rows in position order), and "tokens".
-- Rows are written by position, so a chunked prefill (or any re-run of a
-- position) fills the same rows: what a capture probe should do.
local tide = require("tide")

local dir, out = arg[1], arg[2]
if not dir or not out then
  io.stderr:write("usage: tide scripts/probe_capture.lua MODEL OUT.safetensors [PROMPT] [POINT] [LAYERS]\n")
  os.exit(2)
end
local prompt, point, layers = arg[3] or "The tide comes in", arg[4] or "resid_moe", arg[5]

local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 1024, max_seqs = 2 } }))
local ids = {}
if prompt:match("^[%d,]+$") then
  for x in prompt:gmatch("%d+") do ids[#ids + 1] = tonumber(x) end
else
  ids = assert(m.tokenizer, "the model has no tokenizer: give ids"):encode(prompt)
end
local list
if layers then
  local a, b = layers:match("^(%d+)-(%d+)$")
  a, b = tonumber(a or layers), tonumber(b or layers)
  list = {}
  for L = a, b do list[#list + 1] = L end
end

local T = #ids
local saved = {}
local probe = { at = point, layers = list, fn = function(rows, info)
  if not rows then return end   -- attn_topk on the short path: no selection
  local name = info.layer and (point .. "." .. info.layer) or point
  local t = saved[name]
  if not t then            -- [T, ...] like the rows
    local shape = rows:size()
    shape[1] = T
    t = tide.zeros(shape, rows.dtype == 0 and "f32" or "i32")
    saved[name] = t
  end
  t:narrow(0, info.pos0, info.n):copy(rows)
end }
-- the model's own chunked prefill, 16 tokens per step, the probe on this sequence
local seq = assert(m:sequence())
assert(m:feed(seq, ids, { chunk = 16, probes = { probe } }))
saved.tokens = tide.tensor(ids, "i32")
tide.save(out, saved, { point = point, prompt = prompt })
local n = 0
for _ in pairs(saved) do n = n + 1 end
io.write(string.format("captured %s over %d positions: %d tensors -> %s\n", point, T, n - 1, out))
return saved
