-- First come, first served. Every running request in decode gets its token
-- first (decode latency stays low); the remaining budget goes to prompt
-- chunks in arrival order, admitting waiting requests while sequence slots
-- are free. When the cache is full the most recently arrived running
-- request is preempted (it recomputes later).
--
-- A policy is a table { name, schedule = function(view) -> plan,
-- victim = function(view, plan) -> request view } (see docs/scheduling.md).
local P = { name = "fcfs" }

local function by_arrival(a, b) return a.arrival < b.arrival end

function P.schedule(view)
  local plan, budget = {}, view.budget
  local running = {}
  for _, r in ipairs(view.running) do running[#running + 1] = r end
  table.sort(running, by_arrival)
  -- decodes first
  for _, r in ipairs(running) do
    if r.phase == "decode" and budget > 0 then
      plan[#plan + 1] = { req = r, n = 1 }
      budget = budget - 1
    end
  end
  -- then prefill chunks: running ones, then waiting ones, oldest first
  local slots = view.max_running - #view.running
  local queue = {}
  for _, r in ipairs(running) do if r.phase == "prefill" then queue[#queue + 1] = r end end
  local waiting = {}
  for _, r in ipairs(view.waiting) do waiting[#waiting + 1] = r end
  table.sort(waiting, by_arrival)
  for _, r in ipairs(waiting) do
    if slots > 0 then queue[#queue + 1] = r; slots = slots - 1 end
  end
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
    if not pick or r.arrival > pick.arrival then pick = r end
  end
  return pick
end

return P
