-- Priority: like first-come-first-served, but requests are ordered by
-- `priority` (higher first), then by arrival. Decodes of every running
-- request go first; prompt chunks and admissions follow that order. When
-- the cache is full the running request with the lowest priority (latest
-- arrival among equals) is preempted, so a high-priority request is never
-- preempted while a lower one holds blocks.
local P = { name = "priority" }

local function order(a, b)
  if a.priority ~= b.priority then return a.priority > b.priority end
  return a.arrival < b.arrival
end

function P.schedule(view)
  local plan, budget = {}, view.budget
  local running = {}
  for _, r in ipairs(view.running) do running[#running + 1] = r end
  table.sort(running, order)
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
  table.sort(waiting, order)
  for _, r in ipairs(waiting) do
    if slots > 0 then queue[#queue + 1] = r; slots = slots - 1 end
  end
  table.sort(queue, order)
  for _, r in ipairs(queue) do
    if budget <= 0 then break end
    local n = math.min(r.pending, budget, view.chunk)
    plan[#plan + 1] = { req = r, n = n }
    budget = budget - n
  end
  return plan
end

function P.victim(view)
  local pick
  for _, r in ipairs(view.running) do
    if not pick or r.priority < pick.priority or (r.priority == pick.priority and r.arrival > pick.arrival) then
      pick = r
    end
  end
  return pick
end

-- The request that always advances (never preempted while others hold
-- blocks): the highest priority, oldest among equals.
function P.protect(view)
  local best
  for _, r in ipairs(view.running) do
    if not best or order(r, best) then best = r end
  end
  return best
end

return P
