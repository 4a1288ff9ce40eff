-- First come, first served. Running requests go first, oldest first: each
-- decode gets its token, each prompt (or recompute) chunk its full size,
-- newer running requests giving way when the blocks are short. Then waiting requests are admitted strictly in arrival
-- order: when the oldest waiting one does not fit (blocks, sequence slots,
-- budget), nobody behind it is admitted this step. Victim: the latest
-- arrival (a just-planned admission is deferred before anyone is preempted,
-- as it is the newest). Contract: requests are admitted in arrival order;
-- see docs/scheduling.md.
local P = { name = "fcfs" }

local function older(a, b) return a.arrival < b.arrival end

function P.schedule(view)
  local plan = view:plan()
  for _, r in ipairs(view.running) do
    if r.phase == "decode" then plan:add(r, 1) end
  end
  for _, r in ipairs(view.running) do
    if r.phase ~= "decode" then plan:claim(r, r.pending, older) end
  end
  for _, r in ipairs(view.waiting) do
    if plan:add(r, r.pending) == 0 then break end
  end
  return plan
end

function P.victim(view)
  local pick
  for _, r in ipairs(view:candidates()) do
    if not pick or r.arrival > pick.arrival then pick = r end
  end
  return pick
end

return P
