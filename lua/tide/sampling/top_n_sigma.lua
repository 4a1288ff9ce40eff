-- top_n_sigma: keep the candidates whose logit is within n standard
-- deviations of the largest (Tang et al., "Top-nσ: Not All Logits Are You
-- Need", 2024; llama.cpp's top-n-sigma): mean and std over the finite
-- logits, keep logit >= max - n * std. n <= 0 keeps everything.
--   sampling.top_n_sigma(1.0)
local core = require("tide.sampling.core")

return function(n)
  if type(n) == "table" then n = n.n end
  core.arg(n, "top_n_sigma", "n", nil, nil)
  return {
    name = "top_n_sigma", params = { "n" }, n = n,
    apply = function(self, c) c:top_n_sigma(self.n) end,
  }
end
