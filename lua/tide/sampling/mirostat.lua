-- mirostat: Mirostat v1 (Basu et al., "Mirostat: a neural text decoding
-- algorithm that directly controls perplexity", 2021), as llama.cpp: keeps
-- the surprise (-log2 p of the chosen token) near tau by a top-k whose k is
-- estimated from the Zipf exponent of the m most likely candidates, with mu
-- (starting at 2 tau) updated by the learning rate eta after each token.
-- Ends the chain (it draws the token). Per-request state: mu.
--   sampling.mirostat{tau = 5.0, eta = 0.1, m = 100}
local core = require("tide.sampling.core")

local LN2 = math.log(2)

return function(o)
  o = o or {}
  local st = { name = "mirostat", params = { "tau", "eta", "m" }, final = true,
    tau = o.tau or 5.0, eta = o.eta or 0.1, m = o.m or 100 }
  core.arg(st.tau, "mirostat", "tau", nil, nil)
  core.arg(st.eta, "mirostat", "eta", nil, nil)
  core.arg(st.m, "mirostat", "m", 2, nil, true)

  function st:init() return { mu = 2 * self.tau } end
  function st.save(_, s) return s.mu end
  function st.restore(_, s, v) s.mu = v end

  function st:apply(c, req, s)
    c:softmax()
    c:sort(math.min(self.m, c.n))
    -- Zipf exponent from the m most likely: least squares of
    -- log(p_i / p_i+1) against log((i + 2) / (i + 1))
    local stb, stt = 0, 0
    for i = 0, math.min(self.m - 1, c.n - 1) - 1 do
      local t = math.log((i + 2) / (i + 1))
      local b = math.log(c.p[i] / c.p[i + 1])
      if b == b and b < math.huge then
        stb = stb + t * b
        stt = stt + t * t
      end
    end
    local s_hat = stt > 0 and stb / stt or 1
    local eps = s_hat - 1
    local k = ((eps * 2 ^ s.mu) / (1 - c.n_vocab ^ (-eps))) ^ (1 / s_hat)
    if k ~= k or k > c.n then k = c.n end
    c:top_k(math.max(math.floor(k), 1))
    c:softmax()
    local pos = c:draw(req.rng)
    local surprise = -math.log(c.p[pos]) / LN2
    s.mu = s.mu - self.eta * (surprise - self.tau)
  end
  return st
end
