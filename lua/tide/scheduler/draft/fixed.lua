-- Draft policy "fixed": always draft the request's maximum (draft = { max = k }).
--
-- A draft policy (docs/speculative.md) is a module with
--   P.new(opts) -> state                   per request
--   P.draft(state, req) -> k               tokens to draft this step, 0..req.max;
--     req = { max = the request's limit, steps = speculative steps so far,
--             rate = recent acceptance per drafted token (nil before any draft),
--             load = requests running in the step (1 alone),
--             cost = nil or function(k) -> what a step drafting k tokens
--               costs in plain one-token steps, measured by the engine
--               (nil until measured) }
--   P.observe(state, drafted, accepted)    after each verified step
local P = { name = "fixed" }

function P.new() return {} end
function P.draft(_, req) return req.max end
function P.observe() end

return P
