-- dist: draw the token from softmax(logits) of the candidates left, with the
-- request's generator (one uniform number per token). Ends the chain; a
-- chain without a final stage gets one of these appended.
--   sampling.dist()
-- A final stage chooses by setting c.selected (c:draw, c:argmax or
-- c:select(pos) do that); the chain stops after it.
return function()
  return {
    name = "dist", params = {}, final = true,
    apply = function(_, c, req) c:draw(req.rng) end,
  }
end
