-- top_p: nucleus sampling (Holtzman et al., "The Curious Case of Neural Text
-- Degeneration", 2019) with llama.cpp's semantics: keep the smallest set of
-- the most likely candidates whose probabilities add up to at least p, and
-- at least min_keep of them. p >= 1 keeps everything.
--
--   sampling.top_p(0.95)        sampling.top_p{p = 0.9, min_keep = 2}
--
-- This file is also the model for writing a stage. A stage is a table with
--   name     shown in traces and by sampler:describe()
--   params   the fields describe() prints, in order
--   apply    function(self, c, req, s) that changes the candidates c in place
-- and optionally init/accept for per-request state (see penalties.lua,
-- mirostat.lua) or final = true when it chooses the token (see dist.lua).
-- c is the candidates set (tide.sampling.core): c.n candidates, token ids
-- c.id[i], logits c.logit[i] and, after c:softmax(), probabilities c.p[i]
-- (i = 0 .. c.n - 1). req is the request's state (req.rng, req.log: the
-- tokens so far). Work over the whole vocabulary is one C call on c (here
-- c:top_p); a stage may loop in Lua over a few dozen survivors. A plain
-- function(c, req) works as a stage too.
local core = require("tide.sampling.core")

local function apply(self, c)
  if self.p >= 1 then return end   -- p = 1 switches the stage off, as in llama.cpp
  -- One C call: softmax, then the best candidates in canonical order (logit
  -- desc, ties to the smaller id) until their mass reaches p, found with a
  -- heap among the best 256 or a histogram of the mass beyond, then a pass
  -- that keeps them. For a small set the same thing reads, in Lua:
  --   c:softmax(); c:sort()
  --   local acc, keep = 0, c.n
  --   for i = 0, c.n - 1 do
  --     acc = acc + c.p[i]
  --     if acc >= self.p and i + 1 >= self.min_keep then keep = i + 1; break end
  --   end
  --   c:truncate(keep)
  c:top_p(self.p, self.min_keep)
end

return function(p, min_keep)
  if type(p) == "table" then p, min_keep = p.p, p.min_keep end
  core.arg(p, "top_p", "p", 0, math.huge)
  core.arg(min_keep or 1, "top_p", "min_keep", 0, nil, true)
  return { name = "top_p", params = { "p", "min_keep" }, p = p, min_keep = min_keep or 1, apply = apply }
end
