-- tide.sampling.core: the Lua face of the C sampling helpers. Stages use it
-- through the candidates object `c` they receive:
--   c.n, c.id[i], c.logit[i], c.p[i] (0-based, i < c.n; p valid after c:softmax())
--   c:top_k(k), c:top_p(p), c:min_p(p), ...  one C call each over the set
-- plus the per-request RNG, token histories and DRY breakers. See
-- docs/sampling.md for the semantics of each call.
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}

-- ---- candidates -------------------------------------------------------------
local Cands = {}
Cands.__index = Cands

-- Number of candidates left.
function Cands:size() return self.n end

-- Fill from a logits row (an f32 [V] tensor): ids 0..V-1. trace = true keeps
-- the raw row for tide_cands_trace_end's mass_raw.
function Cands:load(row, trace)
  check(C.tide_cands_load(self, row, trace and 1 or 0), 2)
  return self
end
-- Fill from Lua tables: set({ids...}, {logits...}) (ids distinct, < cap).
function Cands:set(ids, logits)
  local n = #ids
  if #logits ~= n then error("set(ids, logits): " .. n .. " ids but " .. #logits .. " logits", 2) end
  local a, l = ffi.new("int32_t[?]", math.max(n, 1)), ffi.new("float[?]", math.max(n, 1))
  for i = 1, n do
    a[i - 1] = ids[i]
    l[i - 1] = logits[i]
  end
  check(C.tide_cands_set(self, a, l, n), 2)
  return self
end
-- {id = p} of the current set (softmax), for tests and the REPL.
function Cands:probs()
  check(C.tide_cands_softmax(self), 2)
  local t = {}
  for i = 0, self.n - 1 do t[self.id[i]] = self.p[i] end
  return t
end

-- p[0..n) = softmax of the current logits (no-op when already computed).
function Cands:softmax() check(C.tide_cands_softmax(self), 2) return self end

local dbox = ffi.new("double[1]")
-- Entropy (nats) of softmax(logits).
function Cands:entropy()
  check(C.tide_cands_entropy(self, dbox), 2)
  return dbox[0]
end

-- Best m first in canonical order (logit desc, ties to the smaller id); nil = all.
function Cands:sort(m) check(C.tide_cands_sort(self, m or -1), 2) return self end
-- Keep positions [0, m).
function Cands:truncate(m) check(C.tide_cands_truncate(self, m), 2) return self end
function Cands:top_k(k) check(C.tide_cands_top_k(self, k), 2) return self end
function Cands:top_p(p, min_keep) check(C.tide_cands_top_p(self, p, min_keep or 1), 2) return self end
function Cands:min_p(p, min_keep) check(C.tide_cands_min_p(self, p, min_keep or 1), 2) return self end
-- Keep logit >= min_logit (at least min_keep, the best).
function Cands:cut(min_logit, min_keep) check(C.tide_cands_cut(self, min_logit, min_keep or 1), 2) return self end
function Cands:typical(p, min_keep) check(C.tide_cands_typical(self, p, min_keep or 1), 2) return self end
function Cands:top_n_sigma(n) check(C.tide_cands_top_n_sigma(self, n), 2) return self end
function Cands:xtc(threshold, min_keep) check(C.tide_cands_xtc(self, threshold, min_keep or 1), 2) return self end
function Cands:temperature(t) check(C.tide_cands_temperature(self, t), 2) return self end
function Cands:penalties(hist, repeat_, freq, present)
  check(C.tide_cands_penalties(self, hist.h, repeat_, freq or 0, present or 0), 2)
  return self
end
function Cands:dry(breakers, hist, multiplier, base, allowed_length, last_n)
  check(C.tide_cands_dry(self, breakers and breakers.d or nil, hist.h, multiplier, base, allowed_length, last_n), 2)
  return self
end
-- ids, biases: int32_t[m] / float[m] cdata arrays.
function Cands:bias(ids, bias, m) check(C.tide_cands_bias(self, ids, bias, m), 2) return self end

-- Choosing: each returns the position chosen (also c.selected).
function Cands:argmax() return check(C.tide_cands_argmax(self), 2) end
function Cands:draw(rng) return check(C.tide_cands_draw(self, rng), 2) end
function Cands:select(pos)
  if type(pos) ~= "number" or pos < 0 or pos >= self.n or pos % 1 ~= 0 then
    error("select(pos): position " .. tostring(pos) .. " outside 0.." .. (self.n - 1), 2)
  end
  self.selected = pos
  return pos
end

-- Position of a token, or nil.
function Cands:find(token)
  local p = C.tide_cands_find(self, token)
  if p < 0 then return nil end
  return p
end
function Cands:token(pos) return self.id[pos] end
-- logprob of position pos in softmax(logits)
function Cands:logprob(pos)
  check(C.tide_cands_softmax(self), 2)
  return self.logit[pos] - self.lse
end

-- After writing id[], logit[] or n directly (checks them; forgets what no
-- longer holds: sorted, probabilities).
function Cands:touch() check(C.tide_cands_touch(self), 2) return self end
function Cands:set_logit(pos, v)
  if pos < 0 or pos >= self.n then
    error("set_logit: position " .. tostring(pos) .. " outside 0.." .. (self.n - 1), 2)
  end
  if v ~= v or v == math.huge then error("set_logit: " .. tostring(v) .. " is not allowed (NaN, +inf)", 2) end
  self.logit[pos] = v
  self.has_p = 0
  self.sorted = 0
  self.selected = -1
  return self
end
-- Add delta to the logit of token (if it is a candidate); -math.huge bans it.
function Cands:boost(token, delta)
  local p = C.tide_cands_find(self, token)
  if p >= 0 then self:set_logit(p, self.logit[p] + delta) end
  return self
end
function Cands:ban(token) return self:boost(token, -math.huge) end

local topn_ids, topn_lps, topn_cap = nil, nil, 0
-- The n most likely candidates as {{id =, logit =, p =}, ...}, best first
-- (for looking at a set from a stage or the REPL; does not reorder).
function Cands:top(n)
  n = math.min(n or 10, self.n)
  if n > topn_cap then
    topn_cap = n
    topn_ids, topn_lps = ffi.new("int32_t[?]", n), ffi.new("float[?]", n)
  end
  local k = check(C.tide_cands_topn(self, n, topn_ids, topn_lps), 2)
  local out = {}
  for j = 0, k - 1 do
    local lp = topn_lps[j]
    out[j + 1] = { id = topn_ids[j], logit = lp + self.lse, p = math.exp(lp) }
  end
  return out
end

function Cands:__tostring()
  return string.format("tide.candidates(n = %d of %d%s%s)", self.n, self.n_vocab,
    self.sorted > 0 and (", sorted " .. self.sorted) or "", self.has_p == 1 and ", p" or "")
end

ffi.metatype("tide_cands", Cands)
M.Candidates = Cands

local cands_box = ffi.new("tide_cands*[1]")
-- A candidates set for rows of up to cap logits (freed by the GC or :close()).
function M.candidates(cap)
  check(C.tide_cands_new(cands_box, cap), 2)
  return ffi.gc(cands_box[0], C.tide_cands_free)
end

-- A small pool: sampling borrows a set for one call and gives it back, so
-- many requests share a few sets (each holds a few MB of scratch for a
-- 129k vocabulary) and a re-entered sample never clobbers another's set.
local pool = {}
function M.acquire(cap)
  for i = #pool, 1, -1 do
    local c = pool[i]
    if c.cap >= cap then
      table.remove(pool, i)
      return c
    end
  end
  return M.candidates(cap)
end
function M.release(c)
  if #pool < 4 then pool[#pool + 1] = c end
end
-- Free the pooled sets (their memory goes back at the next GC).
function M.drain()
  for i = #pool, 1, -1 do pool[i] = nil end
end

-- ---- RNG ----------------------------------------------------------------------
local Rng = {}
Rng.__index = Rng

local HEX = "%016x%016x%016x%016x"
function Rng:seed(s) C.tide_rng_seed(self, s) return self end
function Rng:next() return C.tide_rng_next(self) end
function Rng:uniform() return C.tide_rng_uniform(self) end
-- The four state words as 64 hex digits (what sessions save).
function Rng:state()
  local p = {}
  for i = 0, 3 do
    local w = self.s[i]
    p[i + 1] = string.format("%08x%08x", tonumber(w / 4294967296ULL), tonumber(w % 4294967296ULL))
  end
  return table.concat(p)
end
function Rng:set_state(hex)
  if type(hex) ~= "string" or not hex:match("^%x+$") or #hex ~= 64 then
    error("set_state: expected 64 hex digits, got " .. tostring(hex), 2)
  end
  local w = {}
  for i = 0, 3 do
    local hi = tonumber(hex:sub(i * 16 + 1, i * 16 + 8), 16)
    local lo = tonumber(hex:sub(i * 16 + 9, i * 16 + 16), 16)
    w[i] = ffi.cast("uint64_t", hi) * 4294967296ULL + lo
  end
  if w[0] == 0 and w[1] == 0 and w[2] == 0 and w[3] == 0 then error("set_state: the all-zero state is invalid", 2) end
  for i = 0, 3 do self.s[i] = w[i] end
  return self
end
function Rng:copy()
  local r = M.RngT()
  ffi.copy(r, self, ffi.sizeof(r))
  return r
end
function Rng:__tostring() return "tide.rng(" .. self:state() .. ")" end
M.RngT = ffi.metatype("tide_rng", Rng)
M.HEX = HEX

-- A generator seeded with s (a number up to 2^53, or a uint64 cdata).
function M.rng(s)
  local r = M.RngT()
  C.tide_rng_seed(r, s or 0)
  return r
end

-- A seed from the system (for seed = -1): /dev/urandom, else the clock.
function M.random_seed()
  local f = io.open("/dev/urandom", "rb")
  if f then
    local b = f:read(6)
    f:close()
    if b and #b == 6 then
      local v = 0
      for i = 1, 6 do v = v * 256 + b:byte(i) end
      return v
    end
  end
  return math.floor((C.tide_time() * 1e6) % 2 ^ 48)
end

-- ---- token histories ------------------------------------------------------------
local Hist = {}
Hist.__index = Hist
local hist_box = ffi.new("tide_hist*[1]")
local one_tok = ffi.new("int32_t[1]")

-- A history of the last `window` tokens (< 0: all), with per-token counts
-- when counts is true (what penalties read).
function M.history(window, counts)
  check(C.tide_hist_new(hist_box, window or -1, counts and 1 or 0), 2)
  return setmetatable({ h = ffi.gc(hist_box[0], C.tide_hist_free) }, Hist)
end

local function ids_array(t, level)
  if type(t) == "number" then
    one_tok[0] = t
    return one_tok, 1
  end
  if type(t) == "table" then
    local n = #t
    local a = ffi.new("int32_t[?]", math.max(n, 1))
    for i = 1, n do
      local v = t[i]
      if type(v) ~= "number" then error("token ids must be numbers, got " .. type(v), level + 1) end
      a[i - 1] = v
    end
    return a, n
  end
  local tensor = require("tide.tensor")
  if tensor.is_tensor(t) then
    local a = t:to("i32"):contiguous()
    return ffi.cast("int32_t*", a.data), a:numel(), a
  end
  error("expected a token id, a table of ids or an integer tensor, got " .. type(t), level + 1)
end
M.ids_array = ids_array

-- push(id), push({ids}) or push(i32/i64 tensor)
function Hist:push(t)
  local a, n, keep = ids_array(t, 2)
  check(C.tide_hist_push(self.h, a, n), 2)
  local _ = keep
  return self
end
function Hist:clear() C.tide_hist_clear(self.h) return self end
function Hist:len() return tonumber(C.tide_hist_len(self.h)) end
function Hist:window() return tonumber(C.tide_hist_window(self.h)) end
-- token `back` steps from the newest (0 = newest), nil past the start
function Hist:get(back)
  local v = tonumber(C.tide_hist_get(self.h, back or 0))
  return v >= 0 and v or nil
end
function Hist:count(token) return tonumber(C.tide_hist_count(self.h, token)) end
-- The window, oldest first, as a Lua table.
function Hist:tokens()
  local n = self:len()
  local a = ffi.new("int32_t[?]", math.max(n, 1))
  local k = tonumber(C.tide_hist_read(self.h, a, n))
  local out = {}
  for i = 0, k - 1 do out[i + 1] = a[i] end
  return out
end
-- Replace the content by the newest tokens of other that fit.
function Hist:assign(other) check(C.tide_hist_assign(self.h, other.h), 2) return self end
function Hist:close()
  if self.h ~= nil then
    C.tide_hist_free(ffi.gc(self.h, nil))
    self.h = nil
  end
end
function Hist:__tostring() return string.format("tide.history(%d tokens, window %d)", self:len(), self:window()) end
M.History = Hist

-- ---- DRY sequence breakers ---------------------------------------------------------
local Dry = {}
Dry.__index = Dry
local dry_box = ffi.new("tide_dry*[1]")

-- A set of breakers given as token sequences: breakers({{13}, {25, 30}}).
function M.dry_breakers(seqs)
  check(C.tide_dry_new(dry_box), 2)
  local d = setmetatable({ d = ffi.gc(dry_box[0], C.tide_dry_free) }, Dry)
  for _, s in ipairs(seqs or {}) do d:add(s) end
  return d
end
function Dry:add(seq)
  local a, n = ids_array(seq, 2)
  check(C.tide_dry_add_breaker(self.d, a, n), 2)
  return self
end
function Dry:count() return tonumber(C.tide_dry_count(self.d)) end

-- llama.cpp's preparation of string breakers (from koboldcpp): every token
-- whose text contains the string is a one-token breaker; every token whose
-- text ends with a proper prefix of the string becomes the head of a
-- breaker whose tail is the tokenization of the rest of the string (at most
-- 20 tokens). Strings longer than 40 bytes are cut. One pass over the
-- vocabulary per string, done once per tokenizer.
function M.dry_breakers_from_strings(tok, strings, d)
  d = d or M.dry_breakers()
  local n = tok.vocab_size
  local words = {}
  for id = 0, n - 1 do words[id] = tok:id_to_bytes(id) or "" end
  for _, s in ipairs(strings) do
    if #s > 40 then s = s:sub(1, 40) end
    if #s > 0 then
      local first = s:sub(1, 1)
      local tails = {}
      for id = 0, n - 1 do
        local w = words[id]
        if w:find(s, 1, true) then
          d:add({ id })
        else
          local pos = w:find(first, 1, true)
          while pos do
            local avail = #w - pos + 1
            if avail < #s and w:sub(pos) == s:sub(1, avail) then
              local rest = s:sub(avail + 1)
              local seq = tails[rest]
              if not seq then
                seq = tok:encode(rest, { add_special_tokens = false })
                while #seq > 20 do seq[#seq] = nil end
                tails[rest] = seq
              end
              local full = { id }
              for k = 1, #seq do full[k + 1] = seq[k] end
              d:add(full)
            end
            pos = w:find(first, pos + 1, true)
          end
        end
      end
    end
  end
  return d
end
M.Dry = Dry

-- ---- logprobs of a raw row ---------------------------------------------------------------
local lp_io = ffi.new("tide_logprobs")
local lp_ids, lp_vals, lp_cap = nil, nil, 0

-- For a logits row (f32 [V] tensor): the logprob and rank of `target` (or
-- nil) and the n_top most likely tokens {{id =, logprob =}, ...}.
-- Returns { logprob =, rank =, top =, lse = }.
function M.row_logprobs(row, target, n_top)
  n_top = n_top or 0
  if n_top > lp_cap then
    lp_cap = n_top
    lp_ids, lp_vals = ffi.new("int32_t[?]", n_top), ffi.new("float[?]", n_top)
  end
  lp_io.target = target or -1
  lp_io.n_top = n_top
  lp_io.top_ids = lp_ids
  lp_io.top_logprobs = lp_vals
  check(C.tide_logits_logprobs(row, lp_io), 2)
  local top = {}
  for j = 0, tonumber(lp_io.n_out) - 1 do top[j + 1] = { id = lp_ids[j], logprob = lp_vals[j] } end
  return {
    logprob = target and lp_io.target_logprob or nil,
    rank = target and tonumber(lp_io.target_rank) or nil,
    top = top,
    lse = lp_io.lse,
  }
end

-- ---- argument checks for stage constructors ------------------------------------------
-- arg(v, "top_p", "p", lo, hi): v must be a number in [lo, hi] (misuse
-- raises at the caller of the constructor).
function M.arg(v, stage, name, lo, hi, integer)
  if type(v) ~= "number" or v ~= v then
    error(stage .. ": " .. name .. " must be a number, got " .. tostring(v), 3)
  end
  if (lo and v < lo) or (hi and v > hi) then
    error(string.format("%s: %s = %s outside [%s, %s]", stage, name, tostring(v), tostring(lo or "-inf"),
      tostring(hi or "inf")), 3)
  end
  if integer and v % 1 ~= 0 then error(stage .. ": " .. name .. " must be an integer, got " .. tostring(v), 3) end
  return v
end

-- ---- traces -----------------------------------------------------------------------------
M.trace_rec = ffi.typeof("tide_cands_trace")

-- ---- files ------------------------------------------------------------------------------
local stamp = ffi.new("int64_t[2]")
-- mtime (ns) and size of a file, or nil, err.
function M.file_stamp(path)
  local rc = C.tide_file_stamp(path, stamp, stamp + 1)
  if rc < 0 then return nil, tffi.last_error() end
  return tonumber(stamp[0]), tonumber(stamp[1])
end
function M.hash(s)
  local h = C.tide_hash64(s, #s)
  return string.format("%08x%08x", tonumber(h / 4294967296ULL), tonumber(h % 4294967296ULL))
end

return M
