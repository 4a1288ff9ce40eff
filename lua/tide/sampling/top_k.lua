-- top_k: keep the k most likely candidates (Fan et al. 2018), in canonical
-- order (logit desc, ties to the smaller id). k <= 0 or k >= the number of
-- candidates keeps everything (llama.cpp: the same set).
--   sampling.top_k(40)
local core = require("tide.sampling.core")

return function(k)
  if type(k) == "table" then k = k.k end
  core.arg(k, "top_k", "k", nil, nil, true)
  return {
    name = "top_k", params = { "k" }, k = k,
    apply = function(self, c) c:top_k(self.k) end,
  }
end
