-- xtc: "exclude top choices" (from text-generation-webui, as llama.cpp):
-- with probability `probability` per token, if two or more candidates have
-- probability >= threshold, remove all of them except the least likely,
-- unless fewer than min_keep would remain. The coin is drawn from the
-- request's generator, so a seed reproduces it. threshold > 0.5 switches it
-- off (at most one candidate can be above).
--   sampling.xtc{probability = 0.5, threshold = 0.1}
local core = require("tide.sampling.core")

return function(probability, threshold, min_keep)
  if type(probability) == "table" then
    probability, threshold, min_keep = probability.probability, probability.threshold, probability.min_keep
  end
  core.arg(probability, "xtc", "probability", nil, nil)
  core.arg(threshold or 0.1, "xtc", "threshold", nil, nil)
  core.arg(min_keep or 1, "xtc", "min_keep", 0, nil, true)
  return {
    name = "xtc", params = { "probability", "threshold", "min_keep" },
    probability = probability, threshold = threshold or 0.1, min_keep = min_keep or 1,
    apply = function(self, c, req)
      if self.probability <= 0 or self.threshold > 0.5 or c.n < 2 then return end
      if req.rng:uniform() > self.probability then return end
      c:xtc(self.threshold, self.min_keep)
    end,
  }
end
