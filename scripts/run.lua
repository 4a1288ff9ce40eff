-- scripts/run.lua: what `make run` runs. Until a model can generate, a short
-- tour of the tensor core: conversions, a matmul through the linear entry
-- point, and the thread pool.
local tide = require("tide")
print(string.format("tide %s on %s, %d threads", tide.version, tide.cpu(), tide.threads()))
local x = tide.randn({ 4, 8 }, { seed = 1 })
print(x)
print("as bf16:")
print(x:to("bf16"))
local w = tide.randn({ 8, 3 }, { seed = 2 })
local y = tide.matmul(x, w)
print("x @ w:")
print(y)
local probs = y[0]:softmax()
print("softmax of row 0:", probs, "argmax", probs:argmax())
