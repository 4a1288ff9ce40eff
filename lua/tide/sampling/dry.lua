-- dry: "don't repeat yourself" (p-e-w, text-generation-webui; llama.cpp's
-- port of koboldcpp's version): a token that would extend a repetition of
-- the end of the text of length L >= allowed_length gets its logit lowered
-- by multiplier * base^(L - allowed_length). Repetitions are found over
-- the last penalty_last_n tokens (-1: all) and never reach back across a
-- sequence breaker; a token that is a breaker on its own is never
-- penalised. multiplier = 0 switches it off.
--   sampling.dry{multiplier = 0.8, base = 1.75, allowed_length = 2,
--                penalty_last_n = -1, breakers = {"\n", ":", "\"", "*"}}
-- Breakers are strings (turned into token sequences the way llama.cpp does,
-- which needs the tokenizer: tokenizer = tok here or in new_state{}) or
-- token sequences (breaker_ids = {{13}, {25, 30}}).
local core = require("tide.sampling.core")

local DEFAULT = { "\n", ":", "\"", "*" }

return function(o)
  o = o or {}
  local st = {
    name = "dry", params = { "multiplier", "base", "allowed_length", "penalty_last_n" },
    multiplier = o.multiplier or 0.0, base = o.base or 1.75, allowed_length = o.allowed_length or 2,
    penalty_last_n = o.penalty_last_n or o.last_n or -1,
    breakers = o.breakers or (o.breaker_ids and {} or DEFAULT), breaker_ids = o.breaker_ids,
    tokenizer = o.tokenizer,
    default_breakers = o.breakers == nil and o.breaker_ids == nil,
    by_tokenizer = setmetatable({}, { __mode = "k" }),
  }
  core.arg(st.multiplier, "dry", "multiplier", nil, nil)
  core.arg(st.base, "dry", "base", nil, nil)
  core.arg(st.allowed_length, "dry", "allowed_length", 0, nil, true)
  core.arg(st.penalty_last_n, "dry", "penalty_last_n", -1, nil, true)
  if type(st.breakers) ~= "table" then error("dry: breakers must be a table of strings", 2) end

  -- The breakers as token sequences, built once per tokenizer.
  function st:resolve(tok)
    if self.multiplier == 0 then return nil end
    local key = tok or self
    local d = self.by_tokenizer[key]
    if d then return d end
    d = core.dry_breakers(self.breaker_ids)
    if #self.breakers > 0 then
      if tok then
        core.dry_breakers_from_strings(tok, self.breakers, d)
      elseif not self.default_breakers then
        error("dry: sequence breakers given as strings need a tokenizer (tokenizer = tok in sampling.dry{} or in "
          .. "new_state{}), or give them as token ids with breaker_ids", 0)
      end
      -- the default breakers without a tokenizer: none (documented)
    end
    self.by_tokenizer[key] = d
    return d
  end

  function st:init(req)
    return { breakers = self:resolve(self.tokenizer or req.tokenizer) }
  end

  function st:apply(c, req, s)
    if self.multiplier == 0 then return end
    c:dry(s.breakers, req.log, self.multiplier, self.base, self.allowed_length, self.penalty_last_n)
  end
  return st
end
