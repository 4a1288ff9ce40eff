-- tide.models.deepseek_v4_mtp: DeepSeek-V4's multi-token-prediction block
-- (`mtp.0.*`, doc deepseek-v4.md 2.4) and greedy speculative decoding with it.
--
-- The block, for the entry at position p of a sequence:
--   e  = RMSNorm(embed[t_{p+1}]; enorm)             (the NEXT token)
--   h  = RMSNorm(H_p; hnorm), per mHC stream        (H_p: the main model's
--        residual streams at p before its hc_head, or, when drafting
--        recursively, the MTP block's own output streams)
--   X0 = e.e_proj^T (broadcast over the streams) + h.h_proj^T
--   X  = one block (attention + MoE) of the wiring in deepseek_v4.lua on X0
--   logits = head . RMSNorm(hc_head(X; mtp hc_head_*); mtp norm)  (predicts t_{p+2})
-- Rounding: every product and norm is rounded to bf16 like the main block's
-- (the golden reference, engine/ref/refmodel.c refm_mtp_token, rounds at the
-- same points); X0 is the bf16 sum of the two projections.
--
-- Cache: the block's attention keeps its own paged cache (one layer, the
-- MTP's compress ratio), with one sequence per main sequence. It holds only
-- entries computed from the main model's hidden states; recursive drafts run
-- on a fork of it that is dropped afterwards. A rejected verify step rolls the
-- main sequence back with Seq:truncate (tide_kvcache_seq_truncate).
local tide = require("tide")
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check
local dsv4 = require("tide.models.deepseek_v4")

local M = {}
local Mtp = {}
Mtp.__index = Mtp
M.Mtp = Mtp

local ROUND = 1
local TIDE_FULL = 1
local i32box = ffi.new("int32_t[1]")

-- The MTP block of a loaded model `m` (tide.model), or nil, err when the
-- checkpoint has none.
function M.new(m, opts)
  opts = opts or {}
  local net, ck, cfg = m.net, m.ck, m.config
  if (cfg.num_nextn_predict_layers or 0) < 1 or not ck:has("mtp.0.e_proj.weight") then
    return nil, "the checkpoint has no MTP block (mtp.0.*)"
  end
  local L = net.n_layers
  local cr = cfg.compress_ratios or {}
  local r = cr[L + 1] or 0
  r = r <= 1 and 1 or r
  if (r == 4 and not net.bufs.kvs4) or (r == 128 and not net.bufs.kvs128) then
    return nil, "MTP block with compress ratio " .. r .. " but no main layer of that ratio (unsupported)"
  end
  local P = "mtp.0."
  local l = dsv4.block_weights(net, ck, P, L, r, false)
  l.index = 0            -- layer 0 of the MTP's own cache
  l.mtp = true
  local T, d, hc = net.max_tokens, net.d, net.hc
  local function linear(name)
    local w = ck:tensor(name .. ".weight")
    local s = ck:has(name .. ".scale") and ck:tensor(name .. ".scale") or nil
    local box = ffi.new("tide_linear*[1]")
    check(C.tide_linear_new(box, w, s), 2)
    return ffi.gc(box[0], C.tide_linear_free)
  end
  local self = setmetatable({
    model = m, net = net, layer = l, ratio = r,
    e_proj = linear(P .. "e_proj"), h_proj = linear(P .. "h_proj"),
    enorm = ck:tensor(P .. "enorm.weight"), hnorm = ck:tensor(P .. "hnorm.weight"),
    norm = ck:tensor(P .. "norm.weight"),
    hc_head_fn = ck:tensor(P .. "hc_head_fn"), hc_head_base = ck:tensor(P .. "hc_head_base"),
    hc_head_scale = ck:tensor(P .. "hc_head_scale"),
    E = tide.zeros({ T, d }), E2 = tide.zeros({ T, d }),
    Hp = tide.zeros({ T, hc, d }),
    Hout = tide.zeros({ T, hc, d }),       -- the block's output streams (recursive drafting)
    ones = tide.zeros({ T, hc }), eye = tide.zeros({ T, hc, hc }),
    _rows = 0,
  }, Mtp)
  -- post = 1, comb = identity: hc_post then computes the bf16 sum E + Hp_j per stream
  local on, ey = ffi.cast("float*", self.ones.data), ffi.cast("float*", self.eye.data)
  for t = 0, T - 1 do
    for i = 0, hc - 1 do
      on[t * hc + i] = 1
      ey[(t * hc + i) * hc + i] = 1
    end
  end
  -- the cache: one layer of ratio r, sized like the main one
  local cc, keep = net:cache_config(opts.cache or m._cache_opts or {})
  local ratios = ffi.new("int32_t[1]", r)
  cc.n_layers = 1
  cc.ratios = ratios
  local cbox = ffi.new("tide_kvcache*[1]")
  if C.tide_kvcache_new(cbox, cc) < 0 then return nil, "MTP cache: " .. tffi.last_error() end
  self.cache = ffi.gc(cbox[0], C.tide_kvcache_free)
  self._keep = { keep, ratios }
  local bbox = ffi.new("tide_batch*[1]")
  check(C.tide_batch_new(bbox, T), 2)
  self.batch = ffi.gc(bbox[0], C.tide_batch_free)
  return self
end

-- A new empty MTP sequence id (freed with mtp:free(id)), or nil, err.
function Mtp:sequence()
  local rc = C.tide_kvcache_seq_new(self.cache, i32box)
  if rc == TIDE_FULL then return nil, "no free MTP sequence slot" end
  check(rc, 2)
  return i32box[0]
end
function Mtp:fork(id)
  local rc = C.tide_kvcache_seq_fork(self.cache, id, i32box)
  if rc == TIDE_FULL then return nil, "no free MTP sequence slot" end
  check(rc, 2)
  return i32box[0]
end
function Mtp:free(id) C.tide_kvcache_seq_free(self.cache, id) end
function Mtp:len(id) return tonumber(C.tide_kvcache_seq_len(self.cache, id)) end

function Mtp:_logit_buf(rows)
  if rows > self._rows then
    self._lg = tide.zeros({ rows, self.net.vocab })
    self._y = tide.zeros({ rows, self.net.d })
    self._rows = rows
  end
  return self._lg:narrow(0, 0, rows), self._y:narrow(0, 0, rows)
end

-- One MTP step over several sequences. entries: { seq = mtp id, hidden =
-- f32 [n, hc, d] (the streams at the entry's positions), tokens = { the
-- next token of each position }, logits = "last" | "all" | false }. The
-- entries run at positions len(seq) .. len(seq)+n-1. Returns, per entry,
-- its logits rows ([n, vocab] for "all", [vocab] for "last"; views valid
-- until the next step) and sets self.out to the output streams [T, hc, d]
-- (entry i's rows from res.first[i]). All or nothing: on an error every
-- MTP sequence stays as it was.
function Mtp:step(entries)
  local net, hc, d = self.net, self.net.hc, self.net.d
  local T, spans = 0, {}
  for i, e in ipairs(entries) do
    local n = #e.tokens
    if n < 1 then error("MTP step entry " .. i .. ": no tokens", 2) end
    if e.hidden:size(0) ~= n then error("MTP step entry " .. i .. ": hidden rows ~= tokens", 2) end
    for j = 1, n do
      local t = e.tokens[j]
      if type(t) ~= "number" or t < 0 or t >= net.vocab or t ~= math.floor(t) then
        error("MTP step entry " .. i .. ": bad token id " .. tostring(t), 2)
      end
    end
    spans[i] = { seq = e.seq, first = T, n = n, pos0 = self:len(e.seq), want = e.logits }
    T = T + n
  end
  if T > net.max_tokens then error("MTP step of " .. T .. " tokens exceeds max_tokens", 2) end
  local st = { T = T, spans = spans, cache = self.cache, batch = self.batch }
  net:begin_step(st)
  local v, b = st.v, self.batch
  check(C.tide_batch_clear(b), 2)
  for i, sp in ipairs(spans) do
    local e = entries[i]
    for j = 1, sp.n do st.ids[sp.first + j - 1] = e.tokens[j] end
    check(C.tide_tensor_copy(v.X:narrow(0, sp.first, sp.n), e.hidden), 2)
    check(C.tide_batch_add(b, sp.seq, sp.pos0, sp.n), 2)
  end
  local rc = C.tide_kvcache_prepare(self.cache, b)
  if rc == TIDE_FULL then return nil, "MTP cache full" end
  check(rc, 2)
  local ok, res = xpcall(function()
    local E, E2 = self.E:narrow(0, 0, T), self.E2:narrow(0, 0, T)
    local Hp = self.Hp:narrow(0, 0, T)
    local X2 = v.X:reshape(T * hc, d)
    -- h = hnorm per stream; Hp = h . h_proj^T
    check(C.tide_rmsnorm(X2, X2, self.hnorm, net.eps, ROUND))
    check(C.tide_linear_forward_ex(self.h_proj, Hp:reshape(T * hc, d), X2, ROUND))
    -- e = enorm(embed(next)); E2 = e . e_proj^T
    check(C.tide_embed(E, net.embed, v.ids))
    check(C.tide_rmsnorm(E, E, self.enorm, net.eps, ROUND))
    check(C.tide_linear_forward_ex(self.e_proj, E2, E, ROUND))
    -- X0_j = E2 + Hp_j (bf16)
    check(C.tide_hc_post(v.X, E2, Hp, self.ones:narrow(0, 0, T), self.eye:narrow(0, 0, T), ROUND))
    net:block(self.layer, st)
    check(C.tide_tensor_copy(self.Hout:narrow(0, 0, T), v.X))
    check(C.tide_hc_head(v.x, v.X, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, net.hccfg))
    check(C.tide_rmsnorm(v.x, v.x, self.norm, net.eps, ROUND))
    local rows = 0
    for _, sp in ipairs(spans) do rows = rows + (sp.want == "all" and sp.n or (sp.want and 1 or 0)) end
    local out = {}
    if rows > 0 then
      local lg, y = self:_logit_buf(rows)
      local r = 0
      for i, sp in ipairs(spans) do
        local n = sp.want == "all" and sp.n or (sp.want and 1 or 0)
        if n > 0 then
          check(C.tide_tensor_copy(y:narrow(0, r, n), v.x:narrow(0, sp.first + sp.n - n, n)))
          out[i] = { r, n }
          r = r + n
        end
      end
      net:head_logits(lg, y)
      for i, sp in ipairs(spans) do
        if out[i] then
          local r0, n = out[i][1], out[i][2]
          out[i] = sp.want == "all" and lg:narrow(0, r0, n) or lg[r0]
        end
      end
    end
    return out
  end, debug.traceback)
  if not ok then
    C.tide_kvcache_abort(self.cache, b)
    error(res, 0)
  end
  rc = C.tide_kvcache_commit(self.cache, b)
  if rc < 0 then
    C.tide_kvcache_abort(self.cache, b)
    check(rc, 2)
  end
  self.out = self.Hout:narrow(0, 0, T)
  self.first = {}
  for i, sp in ipairs(spans) do self.first[i] = sp.first end
  return res
end

-- ---------------------------------------------------------------- greedy speculation
-- Main-model step of `tokens` on seq with every row's logits, keeping the
-- main residual streams [n, hc, d] in `keepX` (the MTP's input).
local function main_step(m, seq, tokens, keepX, logits)
  local res, err = m:step({ { seq = seq, tokens = tokens, logits = logits } }, {
    after_forward = function(st)
      check(C.tide_tensor_copy(keepX:narrow(0, 0, #tokens), st.v.X:narrow(0, 0, #tokens)))
    end,
  })
  if not res then error("speculate: " .. tostring(err), 0) end
  return res[1]
end

-- Greedy generation of up to `n` tokens after `prompt` (a list of ids),
-- drafting up to k tokens per step with the MTP block (k = 0: plain
-- decoding, one token per step, no MTP). Returns the generated ids and stats
-- { steps, drafted, accepted }. opts:
--   seq, mseq   existing main / MTP sequences to use (left holding the prompt
--               and the generated tokens, possibly more); else fresh ones,
--               freed at the end
--   pick(row [, draft, j]) -> id [, stop]   chooses each committed token
--               from the main model's logits row, exactly once per token and
--               in order (default: argmax); when the row verifies a draft,
--               the draft and its index j in the step come along (a
--               rejection sampler uses them; greedy picks ignore them); a nil
--               id or a true stop ends generation
--   draft_pick(row, j) -> id   the MTP's pick of draft j (default: argmax)
--   drafts(n_out, drafts, k) -> drafts   replaces the MTP's drafts (tests)
--   policy      a draft policy (module or name under tide.scheduler.draft:
--               "fixed", "adaptive"; policy_opts go to its new) choosing
--               0..k drafts per step; without one every step drafts k
function Mtp:greedy(prompt, n, k, opts)
  opts = opts or {}
  local m = self.model
  local pick = opts.pick or M.argmax_row
  local dpick = opts.draft_pick or M.argmax_row
  local hc, d = self.net.hc, self.net.d
  if #prompt < 1 then error("greedy: empty prompt", 2) end
  if k < 0 or k > m.max_tokens - 1 then
    error("greedy: draft length " .. k .. " outside 0.." .. (m.max_tokens - 1), 2)
  end
  local seq = opts.seq or assert(m:sequence())
  local mseq = opts.mseq or (k > 0 and assert(self:sequence())) or nil
  local keepX = tide.zeros({ math.max(#prompt, k + 1), hc, d })
  local stats = { steps = 0, drafted = 0, accepted = 0 }
  local policy = opts.policy
  if type(policy) == "string" then policy = require("tide.scheduler.draft." .. policy) end
  local pstate = policy and policy.new(opts.policy_opts) or nil
  local out = {}
  local done = false
  local function commit(id, stop)
    if id == nil then done = true return end
    out[#out + 1] = id
    if stop or #out >= n then done = true end
  end
  local ok, err = pcall(function()
    -- prefill: main over the prompt in steps of max_tokens (every row's streams kept for the MTP)
    local P, mt = #prompt, m.max_tokens
    local keepP = tide.zeros({ P, hc, d })
    local lg
    for i = 1, P, mt do
      local nn = math.min(mt, P - i + 1)
      local ch = {}
      for j = 1, nn do ch[j] = prompt[i + j - 1] end
      lg = main_step(m, seq, ch, keepP:narrow(0, i - 1, nn), i + nn > P and "last" or false)
    end
    commit(pick(lg))
    if done then return end
    local pending = out[1]             -- the next token, chosen, not yet fed
    -- MTP catch-up inputs: streams of the positions whose next token is known
    local cX = tide.zeros({ math.max(#prompt, k + 1), hc, d })
    check(C.tide_tensor_copy(cX:narrow(0, 0, #prompt), keepP))
    local cn = #prompt
    local ctoks = {}
    for i = 2, #prompt do ctoks[#ctoks + 1] = prompt[i] end
    ctoks[#ctoks + 1] = pending
    while not done do
      stats.steps = stats.steps + 1
      local want = k
      if k > 0 and policy then
        want = policy.draft(pstate, { max = math.min(k, n - #out), steps = stats.steps - 1, rate = pstate.rate,
          load = 1 })
      end
      if k == 0 then
        lg = main_step(m, seq, { pending }, keepX, "last")
        commit(pick(lg))
        pending = out[#out]
      elseif want == 0 then
        -- the policy drafts nothing this step: a plain step; its streams wait for the next catch-up
        lg = main_step(m, seq, { pending }, keepX, "last")
        commit(pick(lg))
        if cn + 1 > cX:size(0) then
          local bigger = tide.zeros({ 2 * cX:size(0), hc, d })
          check(C.tide_tensor_copy(bigger:narrow(0, 0, cn), cX:narrow(0, 0, cn)))
          cX = bigger
        end
        check(C.tide_tensor_copy(cX:narrow(0, cn, 1), keepX:narrow(0, 0, 1)))
        if out[#out] then
          cn = cn + 1
          ctoks[cn] = out[#out]
          pending = out[#out]
        end
      else
        -- 1. MTP catch-up over the main streams; its last row drafts d1
        local at = 0
        while cn - at > mt do   -- a long prompt: leading chunks without logits
          local ch = {}
          for j = 1, mt do ch[j] = ctoks[at + j] end
          self:step({ { seq = mseq, hidden = cX:narrow(0, at, mt), tokens = ch, logits = false } })
          at = at + mt
        end
        if at > 0 then
          local rest = {}
          for j = at + 1, cn do rest[#rest + 1] = ctoks[j] end
          ctoks = rest
        end
        local mres = self:step({ { seq = mseq, hidden = cX:narrow(0, at, cn - at), tokens = ctoks, logits = "last" } })
        local drafts = { dpick(mres[1], 1) }
        cn = cn - at
        local kk = math.min(k, n - #out)
        kk = math.min(kk, want)
        if kk > 1 then
          -- 2. recursive drafts on a fork of the MTP sequence, dropped after
          local f = assert(self:fork(mseq))
          local okd, derr = pcall(function()
            local h = tide.zeros({ 1, hc, d })
            check(C.tide_tensor_copy(h, self.out:narrow(0, cn - 1, 1)))
            for j = 2, kk do
              local r = self:step({ { seq = f, hidden = h, tokens = { drafts[j - 1] }, logits = "last" } })
              drafts[j] = dpick(r[1], j)
              check(C.tide_tensor_copy(h, self.out:narrow(0, 0, 1)))
            end
          end)
          self:free(f)
          if not okd then error(derr, 0) end
        end
        -- tests replace the drafts (e.g. an oracle with chosen mistakes) to reach every path
        if opts.drafts then drafts = opts.drafts(#out, drafts, kk) end
        while #drafts > kk do drafts[#drafts] = nil end
        -- 3. verify pending + drafts in one main step
        local vt = { pending }
        for j = 1, #drafts do vt[j + 1] = drafts[j] end
        local p0 = seq:len()
        local rows = main_step(m, seq, vt, keepX, "all")
        local a = 0
        local n0 = #out
        while true do
          local id, stop = pick(rows[a], drafts[a + 1], a + 1)
          commit(id, stop)
          local match = id ~= nil and id == drafts[a + 1]
          if match then a = a + 1 end
          if done or not match then break end
        end
        stats.drafted = stats.drafted + #drafts
        stats.accepted = stats.accepted + a
        if policy then policy.observe(pstate, #drafts, a) end
        if a < #drafts then
          -- 4. rejection: roll the main cache back to the accepted prefix (pending + a drafts)
          local okt, terr = seq:truncate(p0 + a + 1)
          if not okt then error("speculate: " .. tostring(terr), 0) end
        end
        if not done then
          -- next catch-up: streams of pending, d1..da; their next tokens d1..da, corr
          cn = a + 1
          check(C.tide_tensor_copy(cX:narrow(0, 0, cn), keepX:narrow(0, 0, cn)))
          ctoks = {}
          for j = 1, cn do ctoks[j] = out[n0 + j] end
          pending = out[#out]
        end
      end
    end
  end)
  if not opts.seq then seq:free() end
  if mseq and not opts.mseq then self:free(mseq) end
  if not ok then error(err, 0) end
  return out, stats
end

-- Speculative sampling at temperature `temp` with the standard rule (Leviathan
-- et al. 2023; Chen et al. 2023): drafts are drawn from q = softmax(MTP row /
-- temp); draft d is accepted with probability min(1, p(d) / q(d)), p =
-- softmax(main row / temp); on rejection the token comes from the residual
-- max(0, p - q) normalised, drawn exactly by drawing x ~ p and keeping it with
-- probability max(0, 1 - q(x) / p(x)) (on average one extra draw per
-- rejection; every step is one C call over the row). The committed tokens
-- are distributed exactly as plain sampling at temp; unlike a chain pick they
-- are not the same bits as plain sampling with the same seed. Returns
-- { pick, draft_pick } for Mtp:greedy and the generator (tide_rng).
function M.rejection_sampler(vocab, kmax, temp, seed)
  if type(temp) ~= "number" or temp ~= temp or temp <= 0 then error("rejection_sampler: temperature must be > 0", 2) end
  local rng = ffi.new("tide_rng")
  C.tide_rng_seed(rng, seed or 0)
  local function cands()
    local b = ffi.new("tide_cands*[1]")
    check(C.tide_cands_new(b, vocab), 3)
    return ffi.gc(b[0], C.tide_cands_free)
  end
  local qc, pc = {}, cands()
  for j = 1, kmax do qc[j] = cands() end
  local function load(c, row)
    check(C.tide_cands_load(c, row, 0), 3)
    check(C.tide_cands_temperature(c, temp), 3)
    check(C.tide_cands_softmax(c), 3)
  end
  local function prob(c, id)
    local pos = C.tide_cands_find(c, id)
    return pos >= 0 and c.p[pos] or 0
  end
  local S = { rng = rng, rejected = 0, residual_draws = 0 }
  function S.draft_pick(row, j)
    local c = qc[j]
    load(c, row)
    return c.id[C.tide_cands_draw(c, rng)]
  end
  function S.pick(row, draft, j)
    load(pc, row)
    if draft ~= nil then
      local q = qc[j]
      local pd, qd = prob(pc, draft), prob(q, draft)
      if C.tide_rng_uniform(rng) * qd < pd then return draft end
      S.rejected = S.rejected + 1
      while true do
        local x = pc.id[C.tide_cands_draw(pc, rng)]
        S.residual_draws = S.residual_draws + 1
        local px = prob(pc, x)
        if C.tide_rng_uniform(rng) * px < px - prob(q, x) then return x end
      end
    end
    return pc.id[C.tide_cands_draw(pc, rng)]
  end
  return S
end

-- The greedy pick: the index of the largest logit (ties to the smaller id).
function M.argmax_row(row) return row:argmax() end

return M
