-- mirostat_v2: Mirostat v2 (Basu et al. 2021), as llama.cpp: keep the
-- candidates whose surprise -log2 p is at most mu (at least one), draw
-- from them renormalised, then move mu by eta * (tau - surprise of the
-- chosen token). mu starts at 2 tau. Ends the chain. Per-request state: mu.
--   sampling.mirostat_v2{tau = 5.0, eta = 0.1}
local core = require("tide.sampling.core")

local LN2 = math.log(2)

return function(o)
  o = o or {}
  local st = { name = "mirostat_v2", params = { "tau", "eta" }, final = true, tau = o.tau or 5.0, eta = o.eta or 0.1 }
  core.arg(st.tau, "mirostat_v2", "tau", nil, nil)
  core.arg(st.eta, "mirostat_v2", "eta", nil, nil)

  function st:init() return { mu = 2 * self.tau } end
  function st.save(_, s) return s.mu end
  function st.restore(_, s, v) s.mu = v end

  function st:apply(c, req, s)
    c:softmax()
    -- -log2 p <= mu  <=>  logit - lse >= -mu ln 2
    c:cut(c.lse - s.mu * LN2, 1)
    c:softmax()
    local pos = c:draw(req.rng)
    local surprise = -math.log(c.p[pos]) / LN2
    s.mu = s.mu - self.eta * (surprise - self.tau)
  end
  return st
end
