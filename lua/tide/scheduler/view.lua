-- tide.scheduler.view: what a scheduling policy sees each step, and the plan
-- builder the built-in policies use. docs/scheduling.md is the contract.
--
--   function P.schedule(view)
--     local plan = view:plan()
--     for _, r in ipairs(view.running) do
--       if r.phase == "decode" then plan:add(r, 1) end
--     end
--     for _, r in ipairs(view.waiting) do
--       if plan:add(r, r.pending) == 0 then break end
--     end
--     return plan
--   end
--
-- A view is a plain table built by the engine for one call; request views in
-- it (r) are the engine's read-only copies of each request's state. Nothing a
-- policy does to a view changes the engine: its only effect is the plan it
-- returns (and the victim it names).
local M = {}

local View = {}
View.__index = View
M.View = View

local Plan = {}
Plan.__index = Plan
M.Plan = Plan

local ceil, min, max = math.ceil, math.min, math.max

-- A new view (the engine calls this). f holds the fields listed in
-- docs/scheduling.md.
function M.new(f)
  return setmetatable(f, View)
end

-- New cache blocks r needs to run n more tokens: swa, pages.
function View:need(r, n)
  local len, B, pt = r.computed, self.swa_block, self.page_tokens
  local swa = ceil((len + n) / B) - ceil(len / B)
  local pages = self.paged and (ceil((len + n) / pt) - ceil(len / pt)) or 0
  return swa, pages
end

-- The most tokens (<= want) r can run with `swa` free SWA blocks and `pages`
-- free pages.
function View:fit(r, want, swa, pages)
  local len, B, pt = r.computed, self.swa_block, self.page_tokens
  local n = min(want, (ceil(len / B) + swa) * B - len)
  if self.paged then n = min(n, (ceil(len / pt) + pages) * pt - len) end
  return max(0, n)
end

-- Is r in the plan p (a builder or any list of entries)?
local function entry_of(p, r)
  for _, e in ipairs(p) do
    local x = e.req
    if x == r or (type(x) == "table" and x.id == r.id) or x == r.id then return e end
  end
  return nil
end
M.entry_of = entry_of

-- Who may give way when the step does not fit (victim() is called with a
-- view holding `plan`, the step as it stands): running requests and
-- requests of the plan that hold no sequence yet, the anchor excepted.
function View:candidates()
  local out = {}
  for _, r in ipairs(self.running) do
    if not r.protected then out[#out + 1] = r end
  end
  for _, e in ipairs(self.plan or {}) do
    local r = e.req
    if not r.running and not r.protected then out[#out + 1] = r end
  end
  return out
end

-- A plan builder: an array of { req = r, n = tokens } that keeps what is
-- left of the step (tokens, free blocks, free sequence slots) as entries are
-- added. It is a valid return value of schedule().
function View:plan()
  return setmetatable({ view = self, left = self.budget, swa = self.free.swa, pages = self.free.pages,
    slots = self.slots, _in = {} }, Plan)
end

-- Add up to n tokens of r (default: as many as it has pending). n is cut to
-- r.pending, the tokens left in the step and, for prompt chunks, view.chunk.
-- A request that does not hold a sequence needs a free slot; every entry but
-- a decode is also cut to the blocks still free, unless `force`: a forced
-- entry or a decode that does not fit makes the engine ask the policy's
-- victim() for requests to give way (docs/scheduling.md). Returns the tokens
-- added (0 when none).
function Plan:add(r, n, force)
  local v = self.view
  if self._in[r.id] then error("plan:add: request " .. tostring(r.id) .. " is already in the plan", 2) end
  n = min(n or r.pending, r.pending, self.left, v.chunk)
  if n < 1 then return 0 end
  if not r.running and self.slots <= 0 and not force then return 0 end
  if not force and r.phase ~= "decode" then
    n = v:fit(r, n, self.swa, self.pages)
    if n < 1 then return 0 end
  end
  local s, p = v:need(r, n)
  self.swa, self.pages = self.swa - s, self.pages - p
  if not r.running then self.slots = self.slots - 1 end
  self.left = self.left - n
  local e = { req = r, n = n }
  self[#self + 1] = e
  self._in[r.id] = e
  return n
end

-- How many of n tokens of r (cut like add() cuts them) would fit the blocks
-- still free, without adding anything.
function Plan:fits(r, n)
  local v = self.view
  n = min(n or r.pending, r.pending, self.left, v.chunk)
  if n < 1 then return 0 end
  return v:fit(r, n, self.swa, self.pages)
end

-- Add r's chunk, making room by rank: when the chunk (up to n tokens) does
-- not fit the free blocks, or r needs a sequence slot and none is free, and
-- running requests that `before(r, x)` ranks below r (the anchor excepted)
-- hold blocks, r claims what it would fit once they gave way, as a forced
-- entry: the policy's victim() should then pick the lowest-ranked first.
-- Otherwise a plain add(). Returns the tokens added.
function Plan:claim(r, n, before)
  local v = self.view
  local want = min(n or r.pending, r.pending, self.left, v.chunk)
  if want < 1 then return 0 end
  local now = v:fit(r, want, self.swa, self.pages)
  local need_slot = not r.running and self.slots <= 0
  if now < want or need_slot then
    local swa, pages, lower = 0, 0, 0
    for _, x in ipairs(v.running) do
      if x ~= r and not x.protected and before(r, x) then
        lower = lower + 1
        swa, pages = swa + x.swa_held, pages + x.pages_held
        local e = self._in[x.id]
        if e then
          local s, p = v:need(x, e.n)
          swa, pages = swa + s, pages + p
        end
      end
    end
    if lower > 0 then
      local could = v:fit(r, want, self.swa + swa, self.pages + pages)
      if could > 0 and (could > now or need_slot) then return self:add(r, could, true) end
    end
  end
  return self:add(r, want)
end

-- Tokens of r already in this plan (0 when it is not there).
function Plan:tokens_of(r)
  local e = self._in[r.id]
  return e and e.n or 0
end

return M
