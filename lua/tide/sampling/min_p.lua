-- min_p: keep the candidates whose probability is at least p times that of
-- the most likely one (llama.cpp: logit >= max + log p), at least min_keep
-- of them. p <= 0 keeps everything.
--   sampling.min_p(0.05)        sampling.min_p{p = 0.1, min_keep = 2}
local core = require("tide.sampling.core")

return function(p, min_keep)
  if type(p) == "table" then p, min_keep = p.p, p.min_keep end
  core.arg(p, "min_p", "p", nil, nil)
  core.arg(min_keep or 1, "min_p", "min_keep", 0, nil, true)
  return {
    name = "min_p", params = { "p", "min_keep" }, p = p, min_keep = min_keep or 1,
    apply = function(self, c) c:min_p(self.p, self.min_keep) end,
  }
end
