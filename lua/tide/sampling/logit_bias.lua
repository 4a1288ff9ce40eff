-- logit_bias: add a bias to the logits of given tokens (OpenAI's logit_bias,
-- llama.cpp's --logit-bias); -math.huge bans a token.
--   sampling.logit_bias{[15043] = 1.5, [13] = -math.huge}
--   sampling.logit_bias{{15043, 1.5}, {13, -math.huge}}
local ffi = require("ffi")

return function(map)
  if type(map) ~= "table" then error("logit_bias: expected a table of token -> bias", 2) end
  local pairs_ = {}
  if #map > 0 and type(map[1]) == "table" then
    for _, e in ipairs(map) do pairs_[#pairs_ + 1] = { e[1], e[2] } end
  else
    for k, v in pairs(map) do pairs_[#pairs_ + 1] = { k, v } end
    table.sort(pairs_, function(a, b) return a[1] < b[1] end)
  end
  local n = #pairs_
  local ids, vals = ffi.new("int32_t[?]", math.max(n, 1)), ffi.new("float[?]", math.max(n, 1))
  for i, e in ipairs(pairs_) do
    local id, b = e[1], e[2]
    if type(id) ~= "number" or id < 0 or id % 1 ~= 0 then error("logit_bias: bad token id " .. tostring(id), 2) end
    if type(b) ~= "number" or b ~= b or b == math.huge then
      error("logit_bias: bias of token " .. id .. " must be a number below +inf, got " .. tostring(b), 2)
    end
    ids[i - 1], vals[i - 1] = id, b
  end
  return {
    name = "logit_bias", params = { "n" }, n = n, entries = pairs_, ids = ids, vals = vals,
    apply = function(self, c) c:bias(self.ids, self.vals, self.n) end,
  }
end
