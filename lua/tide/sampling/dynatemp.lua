-- dynatemp: entropy-based dynamic temperature (llama.cpp's temp_ext, after
-- kalomaze's DynaTemp): with range > 0 the temperature moves within
-- [max(0, temp - range), temp + range] with the normalised entropy of the
-- current candidates, t = lo + (hi - lo) * (H / log n)^exponent: confident
-- distributions are sharpened, uncertain ones flattened. range <= 0 is a
-- plain temperature.
--   sampling.dynatemp{temp = 0.8, range = 0.5, exponent = 1}
local core = require("tide.sampling.core")

return function(o)
  o = o or {}
  local temp, range, exponent = o.temp or 0.8, o.range or 0, o.exponent or 1
  core.arg(temp, "dynatemp", "temp", nil, nil)
  core.arg(range, "dynatemp", "range", nil, nil)
  core.arg(exponent, "dynatemp", "exponent", nil, nil)
  return {
    name = "dynatemp", params = { "temp", "range", "exponent" }, temp = temp, range = range, exponent = exponent,
    apply = function(self, c)
      if self.range <= 0 then
        c:temperature(self.temp)
        return
      end
      if c.n <= 1 then return end
      local lo, hi = math.max(0, self.temp - self.range), self.temp + self.range
      local h = c:entropy() / math.log(c.n)
      c:temperature(lo + (hi - lo) * h ^ self.exponent)
    end,
  }
end
