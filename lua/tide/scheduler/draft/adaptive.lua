-- Draft policy "adaptive": follows the recent acceptance rate (an exponential
-- average per drafted token). Draft nothing while the rate is below
-- `off_below` (then one token every `probe` steps, to notice when the text
-- becomes predictable again), otherwise as many tokens as the rate makes
-- worth it: with per-token acceptance a, draft j is reached with
-- probability a^j, so drafting stops at the first j where a^j < `min_reach`.
-- Off when more than `max_load` requests share the step (the verify rows
-- then cost real compute, not just weight reads). Contract: fixed.lua.
local P = { name = "adaptive" }

function P.new(opts)
  opts = opts or {}
  return { rate = nil, decay = opts.decay or 0.7, off_below = opts.off_below or 0.3, probe = opts.probe or 8,
    min_reach = opts.min_reach or 0.35, max_load = opts.max_load or 4, idle = 0 }
end

function P.draft(s, req)
  if req.max <= 0 or (req.load or 1) > s.max_load then return 0 end
  local a = s.rate
  if a == nil then return 1 end                       -- learn the rate first
  if a < s.off_below then
    s.idle = s.idle + 1
    if s.idle >= s.probe then s.idle = 0 return 1 end
    return 0
  end
  local k, reach = 1, a
  while k < req.max and reach * a >= s.min_reach do
    k = k + 1
    reach = reach * a
  end
  return k
end

function P.observe(s, drafted, accepted)
  if drafted <= 0 then return end
  local r = accepted / drafted
  s.rate = s.rate and (s.decay * s.rate + (1 - s.decay) * r) or r
end

return P
