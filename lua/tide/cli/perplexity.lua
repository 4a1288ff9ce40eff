-- tide perplexity: perplexity and bits per byte of a model over a text file
-- (llama-perplexity's counterpart), and the KL divergence of one run against
-- the saved logits of another (its --kl-divergence-base workflow).
--
-- The file's text is tokenized whole (no BOS) and cut into windows of ctx - 1
-- tokens; each window runs as its own sequence as BOS + its tokens, and every
-- text token is scored from the window's prefix (the first from BOS alone),
-- so every token of the file is predicted exactly once and bits per byte =
-- total nats / ln 2 / bytes of the file. --batch windows run in one step.
--
-- --kld-base FILE: when FILE does not exist, this run's logits (float32, one
-- row per scored token) are written to it; when it exists, this run is
-- compared with it: mean KL(base || this run) per token, top-1 agreement and
-- the perplexity difference. The base file records the token ids, so a
-- different text or tokenizer is refused.
local args = require("tide.cli.args")

local spec = {
  model = { type = "string", meta = "DIR", required = true, help = "checkpoint directory (with its tokenizer)" },
  file = { type = "string", meta = "F", required = true, help = "UTF-8 text file to score" },
  ctx = { type = "number", meta = "N", default = 512, help = "window length in tokens, BOS included" },
  batch = { type = "number", meta = "N", default = 4, help = "windows per step" },
  kld_base = { type = "string", meta = "FILE", help = "save the logits here, or compare with them if FILE exists" },
  limit = { type = "number", meta = "N", help = "score only the first N tokens of the file" },
  reference = { type = "boolean", help = "run the golden scalar reference instead of the fast path" },
  index = { type = "string", meta = "MODE", default = "topk",
    help = "ratio-4 selection: topk (the trained indexer), dense (every compressed entry) or random:SEED" },
  threads = { type = "number", meta = "N", help = "OpenMP threads (default: OMP_NUM_THREADS or all cores)" },
  quiet = { type = "boolean", help = "no progress bar" },
  json = { type = "boolean", help = "print the result as one JSON object" },
}

local M = {
  summary = "perplexity and bits per byte over a text file; KL divergence against a saved run",
  usage = "usage: tide perplexity --model DIR --file F [--ctx N] [--batch N] [--kld-base FILE] [--limit N]\n"
    .. "                       [--reference] [--index topk|dense|random:SEED]\n" .. args.help(spec),
}

local MAGIC = "TIDEKLD1"

local function progress(quiet, done, total, nll, n)
  if quiet then return end
  local w = 30
  local f = total > 0 and done / total or 1
  local bar = string.rep("#", math.floor(f * w + 0.5))
  io.stderr:write(string.format("\r[%-" .. w .. "s] %d/%d tokens  ppl %.3f", bar, done, total,
    n > 0 and math.exp(nll / n) or 0 / 0))
  if done >= total then io.stderr:write("\n") end
  io.stderr:flush()
end

-- A deterministic random top-k for the `random` index mode: K distinct
-- visible entries per token (xorshift64*), written over the indexer's picks.
local function random_topk(seed)
  local ffi = require("ffi")
  local s = ffi.new("uint64_t[1]", seed ~= 0 and seed or 0x9E3779B97F4A7C15ULL)
  local function nxt(n)
    local x = s[0]
    x = bit.bxor(x, bit.rshift(x, 12))
    x = bit.bxor(x, bit.lshift(x, 25))
    x = bit.bxor(x, bit.rshift(x, 27))
    s[0] = x
    return tonumber((x * 0x2545F4914F6CDD1DULL) % n)
  end
  return function(_, topk, st)
    local K = topk:size(1)
    local p = ffi.cast("int32_t*", topk.data)
    for _, sp in ipairs(st.spans) do
      for j = 0, sp.n - 1 do
        local nvis = math.floor((sp.pos0 + j + 1) / 4)
        local row = p + (sp.first + j) * K
        if nvis > K then
          -- partial Fisher-Yates over 0..nvis-1 (K draws), kept in a small table
          local swap = {}
          for k = 0, K - 1 do
            local r = k + nxt(nvis - k)
            local a, b = swap[k] or k, swap[r] or r
            swap[r] = a
            row[k] = b
          end
        end
      end
    end
  end
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "perplexity")
  if #pos > 0 then args.fail("perplexity: unexpected argument '" .. pos[1] .. "'") end
  if o.ctx < 2 or o.ctx ~= math.floor(o.ctx) then args.fail("perplexity: --ctx must be an integer >= 2") end
  if o.batch < 1 or o.batch ~= math.floor(o.batch) then args.fail("perplexity: --batch must be an integer >= 1") end
  local index_mode, seed = o.index, 0
  if o.index:match("^random") then
    seed = tonumber(o.index:match("^random:(%d+)$") or (o.index == "random" and "1"))
    if not seed then args.fail("perplexity: --index random:SEED needs a number") end
    index_mode = "random"
  elseif o.index ~= "topk" and o.index ~= "dense" then
    args.fail("perplexity: --index must be topk, dense or random:SEED")
  end
  local f, ferr = io.open(o.file, "rb")
  if not f then args.fail("perplexity: " .. tostring(ferr), 1) end
  local text = f:read("*a")
  f:close()

  local tide = require("tide")
  local ffi = require("ffi")
  local core = require("tide.sampling.core")
  if o.threads then tide.threads(o.threads) end
  local ctx, B = o.ctx, o.batch
  local model, err = tide.model(o.model, {
    max_tokens = ctx * B,
    cache = { context = ctx, max_seqs = B + 1, seq_budget = B },
  })
  if not model then args.fail(err, 1) end
  if not model.tokenizer then args.fail("perplexity: " .. o.model .. " has no tokenizer", 1) end
  if o.reference then model:use_reference(true) end
  if index_mode == "dense" then model.net.index_mode = "dense"
  elseif index_mode == "random" then model.net.index_mode = random_topk(seed) end
  local V = model.vocab_size
  local bos = model.tokenizer.bos_id or 0
  local ids = model.tokenizer:encode(text, { add_special_tokens = false })
  local N = #ids
  local bytes = #text
  if o.limit and o.limit < N then
    N = math.floor(o.limit)
    -- bytes of the scored prefix: decode it (tokens are whole byte sequences)
    local part = {}
    for i = 1, N do part[i] = ids[i] end
    bytes = #model.tokenizer:decode(part, { skip_special_tokens = false })
  end
  if N == 0 then args.fail("perplexity: " .. o.file .. " holds no tokens", 1) end

  -- the KL base: compare when the file exists, else write it
  local base, out
  if o.kld_base then
    local bf = io.open(o.kld_base, "rb")
    if bf then
      local hdr = bf:read(8 + 12)
      if not hdr or hdr:sub(1, 8) ~= MAGIC then
        args.fail("perplexity: " .. o.kld_base .. " is not a tide KL base", 1)
      end
      local h = ffi.new("int32_t[3]")
      ffi.copy(h, hdr:sub(9), 12)
      if h[0] ~= V or h[1] ~= N then
        args.fail(string.format("perplexity: %s holds %d tokens of vocabulary %d; this run has %d of %d",
          o.kld_base, h[1], h[0], N, V), 1)
      end
      local bids = bf:read(4 * N)
      local want = ffi.new("int32_t[?]", N)
      for i = 1, N do want[i - 1] = ids[i] end
      if not bids or #bids ~= 4 * N or bids ~= ffi.string(want, 4 * N) then
        args.fail("perplexity: " .. o.kld_base .. " was made from other tokens (text or tokenizer differ)", 1)
      end
      base = { f = bf, nll = 0, kl = 0, agree = 0 }
    else
      local wf, werr = io.open(o.kld_base, "wb")
      if not wf then args.fail("perplexity: " .. tostring(werr), 1) end
      local h = ffi.new("int32_t[3]", V, N, ctx)
      wf:write(MAGIC, ffi.string(h, 12))
      local w = ffi.new("int32_t[?]", N)
      for i = 1, N do w[i - 1] = ids[i] end
      wf:write(ffi.string(w, 4 * N))
      out = wf
    end
  end

  local per = ctx - 1
  local nwin = math.ceil(N / per)
  local nll, done = 0, 0
  local brow = base and tide.zeros({ ctx, V }) or nil
  local t0 = tide.time()
  progress(o.quiet, 0, N, 0, 0)
  local w = 0
  while w < nwin do
    local entries, spans = {}, {}
    for k = 1, math.min(B, nwin - w) do
      local first = (w + k - 1) * per + 1
      local n = math.min(per, N - first + 1)
      local toks = { bos }
      for i = 1, n do toks[i + 1] = ids[first + i - 1] end
      local seq, serr = model:sequence()
      if not seq then args.fail("perplexity: " .. tostring(serr), 1) end
      entries[k] = { seq = seq, tokens = toks, logits = "all" }
      spans[k] = { first = first, n = n }
    end
    local res, serr = model:step(entries)
    if not res then args.fail("perplexity: " .. tostring(serr), 1) end
    for k, e in ipairs(entries) do
      local sp, lg = spans[k], res[k]
      local rows = lg:narrow(0, 0, sp.n)
      for i = 0, sp.n - 1 do
        local tgt = ids[sp.first + i]
        local r = core.row_logprobs(rows[i], tgt, base and 1 or 0)
        nll = nll - r.logprob
        if base then
          base.lse = (base.lse or 0) + r.lse
          base.top = base.top or {}
          base.top[i] = r.top[1].id
        end
      end
      if out then out:write(ffi.string(rows.data, sp.n * V * 4)) end
      if base then
        -- KL(base || new) over these rows = sum P_b (z_b - z_n) - lse_b + lse_n (rows of raw logits)
        local bytes_needed = sp.n * V * 4
        local s = base.f:read(bytes_needed)
        if not s or #s ~= bytes_needed then
          args.fail("perplexity: " .. o.kld_base .. " is truncated", 1)
        end
        local b = brow:narrow(0, 0, sp.n)
        ffi.copy(b.data, s, bytes_needed)
        local lse_b = 0
        for i = 0, sp.n - 1 do
          local r = core.row_logprobs(b[i], ids[sp.first + i], 1)
          lse_b = lse_b + r.lse
          base.nll = base.nll - r.logprob
          if r.top[1].id == base.top[i] then base.agree = base.agree + 1 end
        end
        base.kl = base.kl + b:softmax():mul(b:sub(rows)):sum() - lse_b + base.lse
        base.lse = 0
      end
      e.seq:free()
      done = done + sp.n
    end
    w = w + #entries
    progress(o.quiet, done, N, nll, done)
  end
  if out then out:close() end
  if base then base.f:close() end
  local secs = tide.time() - t0
  local ppl = math.exp(nll / N)
  local bpb = nll / math.log(2) / bytes
  local r = { tokens = N, bytes = bytes, ctx = ctx, windows = nwin, nll = nll / N, ppl = ppl, bpb = bpb,
    seconds = secs, index = o.index, reference = o.reference or false }
  if base then
    r.base_ppl = math.exp(base.nll / N)
    r.kl = base.kl / N
    r.top1 = base.agree / N
    r.delta_ppl = ppl - r.base_ppl
  end
  if o.json then
    local keys = {}
    for k in pairs(r) do keys[#keys + 1] = k end
    table.sort(keys)
    local parts = {}
    for _, k in ipairs(keys) do
      local v = r[k]
      parts[#parts + 1] = string.format("%q: %s", k, type(v) == "string" and string.format("%q", v)
        or type(v) == "boolean" and tostring(v) or string.format("%.9g", v))
    end
    print("{" .. table.concat(parts, ", ") .. "}")
  else
    print(string.format("%d tokens, %d bytes, %d windows of %d: perplexity %.4f, %.4f nats/token, "
      .. "%.4f bits/byte (%.1f s)", N, bytes, nwin, ctx, ppl, nll / N, bpb, secs))
    if out then print("saved the logits to " .. o.kld_base) end
    if base then
      print(string.format("vs %s: base perplexity %.4f, delta %+.4f (%+.3f%%); mean KL(base||run) %.3g "
        .. "nats/token; top-1 agreement %.3f%%", o.kld_base, r.base_ppl, r.delta_ppl,
        100 * r.delta_ppl / r.base_ppl, r.kl, 100 * r.top1))
    end
  end
  model:close()
  return 0
end

return M
