-- Fair: decodes first, then the remaining budget is split evenly between
-- every request with prompt tokens to go (up to the free sequence slots), so
-- one long prompt cannot stall the others (llama.cpp #6607): each prefilling
-- request gets about budget / n tokens per step, and what one cannot use
-- goes to the others. Admission in arrival order. Fairness bound: while k
-- requests prefill, each gets at least floor(remaining budget / k) tokens
-- per step (or all it has left). The victim is the request that has used the
-- most cache (positions computed), latest arrival among equals.
local P = { name = "fair" }

local function by_arrival(a, b) return a.arrival < b.arrival end

function P.schedule(view)
  local plan, budget = {}, view.budget
  local running = {}
  for _, r in ipairs(view.running) do running[#running + 1] = r end
  table.sort(running, by_arrival)
  for _, r in ipairs(running) do
    if r.phase == "decode" and budget > 0 then
      plan[#plan + 1] = { req = r, n = 1 }
      budget = budget - 1
    end
  end
  local slots = view.max_running - #view.running
  local queue = {}
  for _, r in ipairs(running) do if r.phase == "prefill" then queue[#queue + 1] = r end end
  local waiting = {}
  for _, r in ipairs(view.waiting) do waiting[#waiting + 1] = r end
  table.sort(waiting, by_arrival)
  for _, r in ipairs(waiting) do
    if slots > 0 then queue[#queue + 1] = r; slots = slots - 1 end
  end
  -- water-filling: equal shares, leftovers redistributed
  local share = {}
  local left = {}
  for i, r in ipairs(queue) do left[i] = math.min(r.pending, view.chunk); share[i] = 0 end
  local active = #queue
  while budget > 0 and active > 0 do
    local each = math.max(1, math.floor(budget / active))
    active = 0
    for i = 1, #queue do
      if left[i] > 0 and budget > 0 then
        local n = math.min(each, left[i], budget)
        share[i] = share[i] + n
        left[i] = left[i] - n
        budget = budget - n
        if left[i] > 0 then active = active + 1 end
      end
    end
  end
  for i, r in ipairs(queue) do
    if share[i] > 0 then plan[#plan + 1] = { req = r, n = share[i] } end
  end
  return plan
end

function P.victim(view)
  local pick
  for _, r in ipairs(view.running) do
    if not pick or r.computed > pick.computed or (r.computed == pick.computed and r.arrival > pick.arrival) then
      pick = r
    end
  end
  return pick
end

return P
