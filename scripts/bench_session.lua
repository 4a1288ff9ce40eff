-- bench_session.lua: what sessions cost on top of the model, on the demo
-- checkpoint (tiny layers, DeepSeek's 129,280-token vocabulary and
-- tokenizer; generated under /tmp when missing, or --model DIR):
--   * a decoded token through s:generate against a bare model:step +
--     state:sample loop (the session's own per-token work),
--   * undo and regen with snapshots against the re-prefill fallback,
--   * fork, save (file size), session_load (import against replay),
--   * the model identity hash, and s:inspect of the latest and of an
--     earlier token against one plain step.
--   tide scripts/bench_session.lua [--quick] [--model DIR] [--threads N]
-- Medians of several runs; the machine may be shared, so expect +-20%.
local tide = require("tide")
local sampling = tide.sampling

local quick, dir, threads = false, nil, 1
local i = 1
while arg and arg[i] do
  if arg[i] == "--quick" then quick = true
  elseif arg[i] == "--model" then i = i + 1; dir = arg[i]
  elseif arg[i] == "--threads" then i = i + 1; threads = tonumber(arg[i])
  else error("unknown argument " .. arg[i]) end
  i = i + 1
end
local RUNS = quick and 3 or 7
tide.threads(threads)

if not dir then
  dir = "/tmp/tide-bench-session-demo"
  local f = io.open(dir .. "/config.json")
  if f then f:close() else
    local root = (arg[0]:match("^(.*)/scripts/[^/]*$") or ".")
    local exe = rawget(_G, "_TIDE_EXE") and _TIDE_EXE.exe or "tide"
    assert(os.execute(string.format("'%s' '%s/scripts/make_checkpoint.lua' --quiet --preset demo --out '%s'", exe,
      root, dir)) == 0, "make_checkpoint failed")
  end
end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end
local function timed(fn)
  local xs = {}
  for _ = 1, RUNS do
    local t0 = tide.time()
    fn()
    xs[#xs + 1] = tide.time() - t0
  end
  return median(xs)
end

local t0 = tide.time()
local m = assert(tide.model(dir, { max_tokens = 64, cache = { context = 2048, max_seqs = 32, seq_budget = 16 } }))
local t_load = tide.time() - t0
local SAMPLER = { temp = 1, top_k = 40, top_p = 0.95, min_p = 0.05 }
local PROMPT = "Tell me a story about a lighthouse keeper who finds a message in a bottle on a stormy night."
local rows = {}
local function row(what, v, note) rows[#rows + 1] = string.format("| %s | %s | %s |", what, v, note or "") end
local function ms(x) return string.format("%.2f ms", x * 1e3) end

print(string.format("model %s: %d layers, vocab %d, %d threads; loaded in %.2f s", dir, m.net.n_layers, m.vocab_size,
  tide.threads(), t_load))

-- 1. per-token cost: bare loop against s:generate
local N = quick and 32 or 96
local base_toks = m.tokenizer:encode(PROMPT)
local per = { bare = {}, sess = {} }
timed(function()
  local seq = assert(m:sequence())
  local st = assert(sampling.from_options(SAMPLER)):new_state({ seed = 1 })
  st:accept(base_toks)
  local lg = assert(m:prefill(seq, base_toks))
  local t1 = tide.time()
  for _ = 1, N do
    local id = st:sample(lg)
    st:accept(id)
    lg = m:step({ { seq = seq, tokens = { id } } })[1]
  end
  local list = per.bare
  list[#list + 1] = (tide.time() - t1) / N
  seq:free()
end)
timed(function()
  local s = assert(m:session{ seed = 1, sampler = SAMPLER, print = false, max_tokens = N, ignore_eos = true })
  s:append(base_toks)
  s:_sync(false)
  local t1 = tide.time()
  s:generate()
  local list = per.sess
  list[#list + 1] = (tide.time() - t1) / N
  s:close()
end)
local bare_tok, sess_tok = median(per.bare), median(per.sess)
row("decoded token, bare step + sample loop", ms(bare_tok), N .. " tokens after a " .. #base_toks .. "-token prompt")
row("decoded token, s:generate", ms(sess_tok), string.format("session overhead %+.3f ms per token",
  (sess_tok - bare_tok) * 1e3))

-- a conversation of ~300 tokens to go back in
local function conversation(snaps)
  local s = assert(m:session{ seed = 3, sampler = SAMPLER, print = false, max_tokens = 40, snapshots = snaps })
  for _, u in ipairs({ PROMPT, "What did the message say?", "Who wrote it, and why?", "How did he answer?",
    "And then?" }) do s:say(u) end
  return s
end
local s = conversation(4)
local n = s:len()
local function undo_redo(sess)
  -- the time of undo + the next sync (what the next turn pays), then put it back
  local t1 = tide.time()
  sess:undo()
  sess:_sync(false)
  local dt = tide.time() - t1
  sess:say("And then?")
  return dt
end
local xs = {}
for _ = 1, RUNS do xs[#xs + 1] = undo_redo(s) end
row("undo at " .. n .. " tokens, with snapshots", ms(median(xs)),
  "restore the snapshot at the turn start (+ at most 1 token to feed)")
local s0 = conversation(0)
xs = {}
for _ = 1, RUNS do xs[#xs + 1] = undo_redo(s0) end
row("undo at " .. n .. " tokens, snapshots = 0", ms(median(xs)), "re-prefill of the whole history (the fallback)")
s0:close()
xs = {}
for _ = 1, RUNS do
  local t1 = tide.time()
  s:regen()
  xs[#xs + 1] = tide.time() - t1
end
row("regen of a 40-token reply", ms(median(xs)), "restore + 40 decoded tokens")

-- inspection
local t_plain = timed(function()
  local b = assert(s.seq:fork())
  m:step({ { seq = b, tokens = { 1 } } })
  b:free()
end)
local t_ins = timed(function()
  local b = assert(s.seq:fork())
  m:step({ { seq = b, tokens = { 1 } } }, { inspect = {} })
  b:free()
end)
row("one-token step, plain", ms(t_plain), "fork + step + free")
row("one-token step, inspect every layer", ms(t_ins), "stats, scores and routes buffers and copies")
local t_last = timed(function() s:inspect{} end)
row("s:inspect{} (latest token, not yet fed)", ms(t_last), "one step on a fork of the sequence")
local mid = math.floor(s:len() / 2)
local t_mid = timed(function() s:inspect{ token = mid } end)
row("s:inspect{token = " .. mid .. "}", ms(t_mid), "re-fed from the nearest snapshot (or position 0)")

-- fork
local before = m:cache_stats()
local forks = {}
local t_fork = timed(function() forks[#forks + 1] = assert(s:fork()) end)
local after = m:cache_stats()
row("fork", ms(t_fork), string.format("%d window blocks and %d pages taken by %d forks (shared copy-on-write)",
  before.swa_free - after.swa_free, before.pages_free - after.pages_free, #forks))
for _, f in ipairs(forks) do f:close() end

-- identity, save, load
local t1 = tide.time()
require("tide.session").model_identity(m)
row("model identity (first call, cached after)", ms(tide.time() - t1), "hashes config, tensor index, sampled bytes")
local P = os.tmpname()
local t_save = timed(function() assert(s:save(P)) end)
local fh = io.open(P, "rb")
local size = fh:seek("end")
fh:close()
row("save at " .. s:len() .. " tokens", ms(t_save), string.format("%.1f kB file", size / 1e3))
local t_imp = timed(function()
  local l = assert(tide.session_load(m, P, { print = false }))
  l:_sync(false)
  l:close()
end)
local t_rep = timed(function()
  local l = assert(tide.session_load(m, P, { print = false, replay = true }))
  l:_sync(false)
  l:close()
end)
row("session_load, import", ms(t_imp), "cache rows written back, logits from the file")
row("session_load, replay", ms(t_rep), "the tokens prefilled again")
os.remove(P)

s:close()

print("| measurement | median | note |")
print("|---|---|---|")
for _, r in ipairs(rows) do print(r) end
