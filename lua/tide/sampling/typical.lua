-- typical: locally typical sampling (Meister et al. 2023, as llama.cpp's
-- typical_p): rank candidates by how far their surprise -log p is from the
-- entropy H of the distribution, keep the closest ones until their mass
-- exceeds p, at least min_keep of them. p >= 1 keeps everything. The
-- survivors keep their order (llama.cpp leaves them in surprise order; the
-- set and the distribution are the same).
--   sampling.typical(0.9)
local core = require("tide.sampling.core")

return function(p, min_keep)
  if type(p) == "table" then p, min_keep = p.p, p.min_keep end
  core.arg(p, "typical", "p", nil, nil)
  core.arg(min_keep or 1, "typical", "min_keep", 0, nil, true)
  return {
    name = "typical", params = { "p", "min_keep" }, p = p, min_keep = min_keep or 1,
    apply = function(self, c) c:typical(self.p, self.min_keep) end,
  }
end
