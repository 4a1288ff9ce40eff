-- bench_spec.lua: speculative decoding with the MTP block (docs/speculative.md):
-- decode tokens/s, tokens per step and draft acceptance at k = 0 (plain) .. 4
-- and at 4 under the adaptive policy; greedy, single request, one run of each
-- after a warm-up (the time includes the prompt's prefill, the same for all).
--   tide scripts/bench_spec.lua [--model DIR] [--tokens N] [--prompt N] [--threads T]
-- Without --model: the default model (generated once; random weights, so
-- acceptance is near zero there and the numbers show the cost side only).
-- The machine may be shared: expect +-20% on the rates.
local tide = require("tide")
local mtp = require("tide.models.deepseek_v4_mtp")

local dir, n, plen, threads = nil, 64, 32, 1
local i = 1
while arg and arg[i] do
  if arg[i] == "--model" then i = i + 1; dir = arg[i]
  elseif arg[i] == "--tokens" then i = i + 1; n = tonumber(arg[i])
  elseif arg[i] == "--prompt" then i = i + 1; plen = tonumber(arg[i])
  elseif arg[i] == "--threads" then i = i + 1; threads = tonumber(arg[i])
  else error("unknown argument " .. arg[i]) end
  i = i + 1
end
tide.threads(threads)
dir = dir or assert(tide.default_model())
local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = plen + n + 16, max_seqs = 4 } }))
local d = assert(mtp.new(m))
local prompt = {}
local x = 7
for j = 1, plen do
  x = (x * 1103515245 + 12345) % 2147483648
  prompt[j] = x % m.vocab_size
end
d:greedy(prompt, 4, 1)   -- warm-up
print(string.format("model %s, prompt %d, %d tokens, %d thread(s)", dir, plen, n, threads))
print("k\ttokens/s\ttokens/step\taccepted\tdrafted\trate")
local base
for k = 0, 5 do
  -- k = 5: the adaptive draft policy with at most 4 drafts
  local t0 = tide.time()
  local out, st = d:greedy(prompt, n, math.min(k, 4), { policy = k == 5 and "adaptive" or nil })
  local dt = tide.time() - t0
  base = base or out
  assert(#out == #base, "different lengths")
  for j = 1, #out do assert(out[j] == base[j], "k = " .. k .. " differs from plain decoding at " .. j) end
  print(string.format("%s\t%.2f\t%.2f\t%d\t%d\t%.1f%%", k == 5 and "4 adaptive" or tostring(k), #out / dt,
    #out / math.max(st.steps + 1, 1), st.accepted, st.drafted, 100 * st.accepted / math.max(st.drafted, 1)))
end
