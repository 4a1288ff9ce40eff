-- Priority: requests are ordered by `priority` (higher first), then by
-- arrival. Every running decode gets its token first (decode latency stays
-- low whatever the priority); then prompt (or recompute) chunks of running
-- requests and admissions of waiting ones, in that order. A request whose
-- chunk does not fit the free blocks claims it anyway when a lower-ranked
-- request holds a sequence: the victim rule then preempts the lowest-ranked
-- one to make room. A waiting request that cannot be admitted stops the
-- admissions (nobody of lower rank overtakes it). Victim: the lowest
-- priority, the latest arrival among equals. Contract: no request runs a
-- prompt chunk or is admitted while one of higher priority waits for room
-- (the engine's progress guarantee aside, docs/scheduling.md).
local P = { name = "priority" }

local function before(a, b)
  if a.priority ~= b.priority then return a.priority > b.priority end
  return a.arrival < b.arrival
end
P.before = before

-- The best waiting request not taken yet (a scan: admissions stop at the
-- first refusal, so a long queue costs O(queue) per step, not a sort).
local function best(waiting, taken)
  local b
  for _, r in ipairs(waiting) do
    if not taken[r] and (not b or before(r, b)) then b = r end
  end
  return b
end

function P.schedule(view)
  local plan = view:plan()
  local running = {}
  for i, r in ipairs(view.running) do running[i] = r end
  table.sort(running, before)
  for _, r in ipairs(running) do
    if r.phase == "decode" then plan:add(r, 1) end
  end
  for _, r in ipairs(running) do
    if r.phase ~= "decode" then plan:claim(r, r.pending, before) end
  end
  local taken = {}
  while plan.left >= 1 do
    local r = best(view.waiting, taken)
    if not r or plan:claim(r, r.pending, before) == 0 then break end
    taken[r] = true
  end
  return plan
end

function P.victim(view)
  local pick
  for _, r in ipairs(view:candidates()) do
    if not pick or before(pick, r) then pick = r end
  end
  return pick
end

return P
