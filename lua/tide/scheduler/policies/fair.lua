-- Fair: every running decode gets its token first; the rest of the budget
-- is shared evenly (water-filling: what one cannot use goes to the others)
-- between every request with prompt or recompute tokens to go, the running
-- ones and the waiting ones that free sequence slots admit, in arrival
-- order. So one long prompt cannot stall the others (llama.cpp issue 6607):
-- fairness bound, while k requests prefill with P tokens of budget left after
-- the decodes, each gets at least min(its pending tokens, chunk,
-- floor(P / k)) tokens per step, blocks permitting. Victim: the request with
-- the most positions in the cache, the latest arrival among equals.
local P = { name = "fair" }

local min, max, floor = math.min, math.max, math.floor

function P.schedule(view)
  local plan = view:plan()
  for _, r in ipairs(view.running) do
    if r.phase == "decode" then plan:add(r, 1) end
  end
  local queue = {}
  for _, r in ipairs(view.running) do
    if r.phase ~= "decode" then queue[#queue + 1] = r end
  end
  local slots = view.slots
  for _, r in ipairs(view.waiting) do
    if slots <= 0 then break end
    queue[#queue + 1] = r
    slots = slots - 1
  end
  -- water-filling of what the decodes left
  local share, left = {}, {}
  for i, r in ipairs(queue) do
    left[i] = min(r.pending, view.chunk)
    share[i] = 0
  end
  local budget, active = plan.left, #queue
  while budget > 0 and active > 0 do
    local each = max(1, floor(budget / active))
    active = 0
    for i = 1, #queue do
      if left[i] > 0 and budget > 0 then
        local n = min(each, left[i], budget)
        share[i], left[i], budget = share[i] + n, left[i] - n, budget - n
        if left[i] > 0 then active = active + 1 end
      end
    end
  end
  for i, r in ipairs(queue) do
    if share[i] > 0 and plan:add(r, share[i]) == 0 and r.running then
      plan:add(r, share[i], true)
    end
  end
  return plan
end

function P.victim(view)
  local pick
  for _, r in ipairs(view:candidates()) do
    if not pick or r.computed > pick.computed or (r.computed == pick.computed and r.arrival > pick.arrival) then
      pick = r
    end
  end
  return pick
end

return P
