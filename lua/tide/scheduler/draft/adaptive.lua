-- Draft policy "adaptive": drafts as many tokens as pay for themselves.
--
-- It keeps the recent per-token acceptance a (exponential averages of the
-- drafts accepted and of the drafts tested: drafts after the first rejection
-- in a step are not tested). With k drafts a step commits 1 + a + ... + a^k
-- tokens on average. When the engine measures what a step costs
-- (req.cost(k): a step drafting k tokens, MTP drafting included, in units of
-- a plain one-token step), the policy takes the k with the most tokens per
-- unit of time, and drafts nothing unless that beats plain decoding by
-- `margin`; without measurements it drafts while the chance of reaching the
-- next draft stays above `min_reach`. While drafting does not pay (or a is
-- below `off_below`) it drafts one token after `probe` steps to notice when
-- the text becomes predictable again, waiting twice as long after each probe
-- that did not pay (at most `probe_max`). When even drafts that are always
-- accepted could not gain `explore` (a model whose verify steps cost about
-- as much per token as plain ones), it only re-measures every `recheck` steps. Off when more than
-- `max_load` requests share the step (their verify rows then cost real
-- compute).
-- Contract: fixed.lua.
local P = { name = "adaptive" }

function P.new(opts)
  opts = opts or {}
  return { rate = nil, acc = 0, tried = 0, decay = opts.decay or 0.8, off_below = opts.off_below or 0.3,
    probe = opts.probe or 8, min_reach = opts.min_reach or 0.35, max_load = opts.max_load or 4,
    margin = opts.margin or 0.05, idle = 0, wait = opts.probe or 8, probe_max = opts.probe_max or 128,
    recheck = opts.recheck or 512, explore = opts.explore or 0.15 }
end

local function idle(s, wait)
  s.idle = s.idle + 1
  if s.idle < (wait or s.wait) then return 0 end
  s.idle = 0
  if not wait then s.wait = math.min(2 * s.wait, s.probe_max) end
  return 1
end

function P.draft(s, req)
  if req.max <= 0 or (req.load or 1) > s.max_load then return 0 end
  if req.cost then
    -- could drafting pay even with every draft accepted? (a clear gain, not noise)
    local hopeless = true
    for k = 1, req.max do
      local c = req.cost(k)
      if not c or (k + 1) / c > 1 + s.explore then hopeless = false break end
    end
    if hopeless then return idle(s, s.recheck) end
  end
  local a = s.rate
  if a == nil then return 1 end                       -- learn the rate first
  if a < s.off_below then return idle(s) end
  if req.cost then
    local best, value = 0, 1 + s.margin
    local reach, tokens = 1, 1
    for k = 1, req.max do
      reach = reach * a
      tokens = tokens + reach
      local c = req.cost(k)
      if c and tokens / c > value then best, value = k, tokens / c end
    end
    if best == 0 then return idle(s) end
    s.idle, s.wait = 0, s.probe
    return best
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
  local tried = accepted + (accepted < drafted and 1 or 0)
  s.acc = s.decay * s.acc + accepted
  s.tried = s.decay * s.tried + tried
  s.rate = s.acc / s.tried
end

return P
