-- greedy: choose the most likely candidate (ties: the smaller id). Ends the
-- chain.
--   sampling.greedy()
return function()
  return {
    name = "greedy", params = {}, final = true,
    apply = function(_, c) c:argmax() end,
  }
end
