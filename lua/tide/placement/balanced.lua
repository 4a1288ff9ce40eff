-- A placement by measured expert load (tide.mpi): per MoE block, every rank
-- holds the same number of experts (give or take one), and the busiest
-- experts are dealt out first, each to the rank with the least load so far
-- that still has room (longest-processing-time first).
-- The load comes from $TIDE_EXPERT_LOAD: a routes file as
--   tide logits --model DIR --tokens IDS --out /dev/null --dump-routes routes.json
-- writes it ({"layers": {"L": [[experts of token 1], ...]}}), on text like
-- the text the run will see. Blocks without counts (the MTP block) fall back
-- to contiguous blocks.
local cjson = require("cjson")

return function(info)
  local path = os.getenv("TIDE_EXPERT_LOAD")
  if not path or path == "" then error("balanced placement: set TIDE_EXPERT_LOAD to a --dump-routes file", 0) end
  local f, err = io.open(path, "rb")
  if not f then error("balanced placement: " .. tostring(err), 0) end
  local ok, doc = pcall(cjson.decode, f:read("*a"))
  f:close()
  if not ok or type(doc) ~= "table" or type(doc.layers) ~= "table" then
    error("balanced placement: " .. path .. " is not a routes file ({\"layers\": {...}})", 0)
  end
  local N, E = info.ranks, info.experts
  local owner = {}
  for b = 0, info.n_blocks - 1 do
    local L = info.blocks[b] and info.blocks[b]:match("^layers%.(%d+)%.$")
    local rows = L and doc.layers[L]
    local o = {}
    if type(rows) ~= "table" then
      for e = 0, E - 1 do o[e] = math.floor(e * N / E) end
    else
      local load = {}
      for e = 0, E - 1 do load[e] = 0 end
      for _, sel in ipairs(rows) do
        for _, e in ipairs(sel) do
          if load[e] then load[e] = load[e] + 1 end
        end
      end
      local order = {}
      for e = 0, E - 1 do order[e + 1] = e end
      table.sort(order, function(a, c) return load[a] > load[c] or (load[a] == load[c] and a < c) end)
      local room, got = {}, {}
      for r = 0, N - 1 do
        room[r] = math.floor(E / N) + (r < E % N and 1 or 0)
        got[r] = 0
      end
      for _, e in ipairs(order) do
        local best
        for r = 0, N - 1 do
          if room[r] > 0 and (best == nil or got[r] < got[best]) then best = r end
        end
        o[e] = best
        room[best] = room[best] - 1
        got[best] = got[best] + load[e]
      end
    end
    owner[b] = o
  end
  return owner
end
