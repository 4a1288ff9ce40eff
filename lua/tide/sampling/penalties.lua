-- penalties: repetition, frequency and presence penalties over the last
-- last_n tokens of the request (llama.cpp's penalties sampler): for a token
-- seen c > 0 times in the window, its logit is divided by repeat_penalty
-- when positive (multiplied when negative; CTRL, Keskar et al. 2019, with
-- the usual sign fix), then lowered by c * frequency + presence (OpenAI's
-- definitions). last_n = -1 is the whole history, 0 switches it off.
-- The window sees what the request accepted: prompt tokens too when the
-- caller feeds them with state:accept(prompt), as llama.cpp does.
--   sampling.penalties{last_n = 64, repeat_penalty = 1.1}
-- (`repeat` is a Lua keyword, hence repeat_penalty; ["repeat"] works too.)
-- Per-request state: a window of the recent tokens with their counts in C.
local core = require("tide.sampling.core")

return function(o)
  o = o or {}
  local last_n = o.last_n or o.repeat_last_n or 64
  local rep = o.repeat_penalty or o["repeat"] or 1.0
  local freq = o.frequency or o.frequency_penalty or o.freq or 0
  local pres = o.presence or o.presence_penalty or o.present or 0
  core.arg(last_n, "penalties", "last_n", -1, nil, true)
  core.arg(rep, "penalties", "repeat_penalty", 1e-30, nil)
  core.arg(freq, "penalties", "frequency", nil, nil)
  core.arg(pres, "penalties", "presence", nil, nil)
  return {
    name = "penalties", params = { "last_n", "repeat_penalty", "frequency", "presence" },
    last_n = last_n, repeat_penalty = rep, frequency = freq, presence = pres,
    init = function(self, req)
      if self.last_n == 0 then return {} end
      local h = core.history(self.last_n, true)
      h:assign(req.log)   -- the newest last_n tokens the request has seen
      return { hist = h }
    end,
    accept = function(_, s, token)
      if s.hist then s.hist:push(token) end
    end,
    apply = function(self, c, _, s)
      if not s.hist then return end
      c:penalties(s.hist, self.repeat_penalty, self.frequency, self.presence)
    end,
  }
end
