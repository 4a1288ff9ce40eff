-- temperature: divide every logit by t (t < 1 sharpens, t > 1 flattens).
-- t <= 0 keeps only the most likely candidate (greedy), as llama.cpp.
--   sampling.temperature(0.8)
local core = require("tide.sampling.core")

return function(t)
  if type(t) == "table" then t = t.t or t.temp end
  core.arg(t, "temperature", "t", -math.huge, math.huge)
  return {
    name = "temperature", params = { "t" }, t = t,
    apply = function(self, c) c:temperature(self.t) end,
  }
end
