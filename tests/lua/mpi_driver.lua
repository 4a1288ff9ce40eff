-- mpi_driver: what mpi_spec runs both as one process and under mpirun, so
-- the two outputs can be compared byte for byte.
--   tide tests/lua/mpi_driver.lua logits DIR OUT   prefill, decode, chunked and
--                                                   a two-sequence step: f32 logits
--   tide tests/lua/mpi_driver.lua engine DIR OUT   a batched engine run in a cache
--                                                   small enough to preempt: ids, logprobs
--   tide tests/lua/mpi_driver.lua loop DIR         decode steps until killed
local tide = require("tide")
local ffi = require("ffi")

local mode, dir, out = arg[1], arg[2], arg[3]

local function tokens(n, vocab, seed)
  local t, x = {}, seed
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[i] = x % vocab
  end
  return t
end

local function put(f, y) f:write(ffi.string(y.data, y:nbytes())) end

if mode == "logits" then
  local m = assert(tide.model(dir, { max_tokens = 64, tokenizer = false }))
  local V = m.vocab_size
  local toks = tokens(37, V, 7)
  local f = assert(io.open(out, "wb"))
  for _, mo in ipairs({ "prefill", "decode", "chunked:5" }) do put(f, m:logits(toks, { mode = mo })) end
  -- two sequences in one step: a prefill chunk and a decode token
  local a, b = m:sequence(), m:sequence()
  m:prefill(a, tokens(20, V, 3))
  local o = m:step{ { seq = a, tokens = { 5 }, logits = "last" },
    { seq = b, tokens = tokens(11, V, 9), logits = "all" } }
  put(f, o[1]); put(f, o[2])
  -- the model collected and loaded again (the followers unload and reload
  -- its experts; a new block may reuse a freed block's address)
  a, b, o, m = nil, nil, nil, nil   -- luacheck: ignore 311
  collectgarbage(); collectgarbage()
  m = assert(tide.model(dir, { max_tokens = 64, tokenizer = false }))
  put(f, m:logits(toks, { mode = "chunked:16" }))
  f:close()
  local mpi = rawget(_G, "_TIDE_MPI")
  if mpi then
    local s = mpi.stats()
    io.stderr:write(string.format("stats: calls %d local %d remote %d rows_bytes %d\n", s.calls, s.rows_local,
      s.rows_remote, s.bytes_rows))
  end
elseif mode == "engine" then
  local m = assert(tide.model(dir, { max_tokens = 32, tokenizer = false,
    cache = { swa_block = 16, page_tokens = 128, swa_blocks = 12, pages = 3, max_seqs = 8 } }))
  local eng = tide.engine(m, { budget = 16, policy = "fair" })
  local hs = {}
  for i, L in ipairs({ 150, 20, 90, 5, 120, 40 }) do
    hs[i] = assert(eng:submit{ tokens = tokens(L, m.vocab_size, i), max_tokens = 12 + i, seed = 100 + i,
      logprobs = 1, sampler = (i % 3 == 0) and { temp = 0 } or { temp = 0.9, top_k = 50 } })
  end
  eng:run()
  local f = assert(io.open(out, "wb"))
  for i, h in ipairs(hs) do
    local r = h:result()
    f:write(i, " ", r.finish_reason, " ", table.concat(r.tokens, ","), "\n")
    for k, lp in ipairs(r.logprobs) do f:write(string.format("  %d %a %a\n", k, lp.raw_logprob, lp.sampled_logprob)) end
  end
  f:write("preemptions ", eng:report().preemptions, "\n")
  f:close()
elseif mode == "loop" then
  local m = assert(tide.model(dir, { max_tokens = 16, tokenizer = false }))
  local s = m:sequence()
  m:prefill(s, tokens(8, m.vocab_size, 1))
  io.stdout:write("ready\n")
  io.stdout:flush()
  local t = 3
  while true do
    if s:len() > 200 then s:free(); s = m:sequence(); m:prefill(s, { 1, 2, 3 }) end
    local o = m:step{ { seq = s, tokens = { t }, logits = "last" } }
    t = (t * 7 + 1) % m.vocab_size
    local _ = o
  end
else
  error("usage: mpi_driver.lua logits|engine|loop DIR [OUT]")
end
