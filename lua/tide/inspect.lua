-- tide.inspect: a look inside one step of the model, from Lua. For chosen
-- layers and tokens of a step it records what the sparse attention and the
-- router did:
--   * which compressed entries the lightning indexer selected (entry j of a
--     ratio-r layer pools positions j*r .. j*r+r-1) with their indexer scores,
--   * the share of each head's attention mass that went to the sliding
--     window, to the compressed entries and to the sink (per head and
--     averaged over the heads), and the log-sum-exp of the keys,
--   * the routed experts and their weights, for every layer.
--
--   local spec = { layers = { 1, 3 } }            -- nil: every layer
--   local res = model:step({ { seq = s, tokens = { id } } }, { inspect = spec })
--   local r = tide.inspect.report(model, spec, 0)  -- token 0 of the step
--   print(tide.inspect.format(r))                 -- a small table per layer
--
-- Sessions re-run a past token exactly to inspect it (s:inspect{...}); the
-- chat's /inspect prints the tables. It is built on probes (tide.probe) at
-- the attn_shares, attn_topk and moe_routes points: without an inspect spec
-- (or another probe there) a step passes no statistics or score buffers to
-- the kernels: it costs nothing.
local tide = require("tide")
local tffi = require("tide.ffi")
local ffi = tffi.ffi

local M = {}

local NAN = 0 / 0

local function layer_list(model, layers)
  local n = model.net.n_layers
  if layers == nil or layers == "all" then
    local out = {}
    for L = 0, n - 1 do out[#out + 1] = L end
    return out
  end
  if type(layers) == "number" then layers = { layers } end
  if type(layers) ~= "table" then error("inspect: layers must be a layer index, a list of them or nil", 4) end
  for _, L in ipairs(layers) do
    if type(L) ~= "number" or L ~= math.floor(L) or L < 0 or L >= n then
      error("inspect: layer " .. tostring(L) .. " out of range 0.." .. (n - 1), 4)
    end
  end
  return layers
end

-- Called by Model:step (opts.inspect = spec) after the step's views exist
-- and before the forward runs; returns the probes (tide.probe) that fill
-- the spec for every entry of the step:
--   T, tokens = { {seq =, pos =, id =}, ... } (per token of the step),
--   stats[L]  f32 [T, H, 4]  window mass, compressed mass, sink mass, lse
--             (NaN where the wiring did not write, e.g. a replaced attention)
--   scores[L] f32 [T, S]     indexer scores of entries j < S (ratio-4 layers;
--             NaN where the token was not scored: the short path)
--   topk[L]   i32 [T, K]     copy of the selection, or false when no token of
--             the step was scored (every entry is selected then)
--   routes[L] = { ids = i32 [T, k], weights = f32 [T, k] } for every layer
function M.arm(model, st, spec)
  if type(spec) ~= "table" then error("step: opts.inspect must be a table (see tide.inspect)", 3) end
  local cfg = model.config
  local T, H = st.T, cfg.num_attention_heads
  local layers = layer_list(model, spec.layers)
  spec.T = T
  spec.stats, spec.scores, spec.topk, spec.routes = {}, {}, {}, {}
  local tokens = {}
  for _, sp in ipairs(st.spans) do
    local sid = sp.seq.id
    for j = 0, sp.n - 1 do
      tokens[sp.first + j + 1] = { seq = sid, pos = sp.pos0 + j, id = st.ids[sp.first + j] }
    end
  end
  spec.tokens = tokens
  local S = math.max(1, st.max_visible4)
  local K = cfg.index_topk
  local function rows(t, info) return t:narrow(0, info.row, info.n) end
  local function shares(s, info)
    local L = info.layer
    spec.stats[L] = spec.stats[L] or tide.full({ T, H, 4 }, NAN)
    rows(spec.stats[L], info):copy(s)
  end
  local function topk(sel, info)
    local L = info.layer
    if info.scores then
      spec.scores[L] = spec.scores[L] or tide.full({ T, S }, NAN)
      rows(spec.scores[L], info):copy(info.scores)
    end
    if sel then
      if not spec.topk[L] then spec.topk[L] = tide.full({ T, K }, -1, "i32") end
      rows(spec.topk[L], info):copy(sel)
    elseif spec.topk[L] == nil then
      spec.topk[L] = false
    end
  end
  local function routes(ids, info)
    local L = info.layer
    local k = ids:size(1)
    local r = spec.routes[L]
    if not r then
      r = { ids = tide.zeros({ T, k }, "i32"), weights = tide.zeros({ T, k }) }
      spec.routes[L] = r
    end
    rows(r.ids, info):copy(ids)
    rows(r.weights, info):copy(info.weights)
  end
  -- every watched layer has stats (NaN until written); ratio-4 layers scores
  for _, L in ipairs(layers) do
    spec.stats[L] = tide.full({ T, H, 4 }, NAN)
    if cfg.ratios[L] == 4 then spec.scores[L] = tide.full({ T, S }, NAN) end
  end
  local list = {
    { at = "attn_shares", layers = layers, fn = shares, name = "inspect" },
    { at = "moe_routes", fn = routes, name = "inspect" },
  }
  local four = {}
  for _, L in ipairs(layers) do if cfg.ratios[L] == 4 then four[#four + 1] = L end end
  if #four > 0 then list[#list + 1] = { at = "attn_topk", layers = four, fn = topk, name = "inspect" } end
  return list
end

local function num(x)
  if x ~= x then return nil end
  return x
end

-- The report of token t (0-based index in the step) of an armed spec:
-- { position, id, seq, layers = { [L] = layer report }, routes = { [L] =
-- { experts = {...}, weights = {...} } } } with a layer report
-- { layer, ratio,
--   window = { first, last } (positions the window holds),
--   mass = { window, compressed, sink } (means over the heads),
--   heads = { {window =, compressed =, sink =, lse =}, ... } (head 1 first),
--   compressed = { visible = entries the token sees, scored = the indexer
--     ranked them (else every visible entry is used), selected = count,
--     entries = { {entry = j, first = j*r, last = j*r+r-1, score =}, ... }
--     (by score, best first, when scored; else by entry), scores = f32 view
--     [visible] of every visible entry's score when scored } or nil for
--   sliding-window-only layers }.
function M.report(model, spec, t)
  if type(spec) ~= "table" or not spec.T then error("inspect.report: spec has not been through a step", 2) end
  if type(t) ~= "number" or t < 0 or t >= spec.T then
    error("inspect.report: token " .. tostring(t) .. " out of range 0.." .. (spec.T - 1), 2)
  end
  local cfg = model.config
  local H, W, K = cfg.num_attention_heads, cfg.sliding_window, cfg.index_topk
  local tk = spec.tokens[t + 1]
  local p = tk.pos
  local out = { position = p, id = tk.id, seq = tk.seq, layers = {}, routes = {} }
  for L, stats in pairs(spec.stats) do
    local ratio = cfg.ratios[L]
    local lr = { layer = L, ratio = ratio, window = { first = math.max(0, p - W + 1), last = p } }
    local sp = ffi.cast("float*", stats.data) + t * H * 4
    local heads, sw, sc, ss = {}, 0, 0, 0
    for h = 0, H - 1 do
      local w, c, s, l = sp[h * 4], sp[h * 4 + 1], sp[h * 4 + 2], sp[h * 4 + 3]
      heads[h + 1] = { window = num(w), compressed = num(c), sink = num(s), lse = num(l) }
      sw, sc, ss = sw + w, sc + c, ss + s
    end
    lr.heads = heads
    lr.mass = { window = num(sw / H), compressed = num(sc / H), sink = num(ss / H) }
    if ratio > 1 then
      local nvis = math.floor((p + 1) / ratio)
      local comp = { visible = nvis, scored = false, entries = {} }
      local sel = {}
      local topk = spec.topk[L]
      if ratio == 4 and topk and nvis > K then
        comp.scored = true
        local row = ffi.cast("int32_t*", topk.data) + t * K
        local srow = spec.scores[L]
        local S = srow:size(1)
        local sptr = ffi.cast("float*", srow.data) + t * S
        for k = 0, K - 1 do
          local j = row[k]
          if j >= 0 then sel[#sel + 1] = { entry = j, score = j < S and num(sptr[j]) or nil } end
        end
        table.sort(sel, function(a, b)
          local x, y = a.score or -math.huge, b.score or -math.huge
          if x ~= y then return x > y end
          return a.entry < b.entry
        end)
        comp.scores = srow[t]:narrow(0, 0, math.min(nvis, S))
      else
        for j = 0, nvis - 1 do sel[#sel + 1] = { entry = j } end
      end
      for _, e in ipairs(sel) do
        e.first, e.last = e.entry * ratio, e.entry * ratio + ratio - 1
      end
      comp.entries = sel
      comp.selected = #sel
      lr.compressed = comp
    end
    out.layers[L] = lr
  end
  for L, rt in pairs(spec.routes) do
    local k = rt.ids:size(1)
    local ip = ffi.cast("int32_t*", rt.ids.data) + t * k
    local wp = ffi.cast("float*", rt.weights.data) + t * k
    local ex, wt = {}, {}
    for i = 0, k - 1 do ex[i + 1], wt[i + 1] = ip[i], wp[i] end
    out.routes[L] = { experts = ex, weights = wt }
  end
  return out
end

local function f3(x) return x and string.format("%.3f", x) or "-" end

local function label_of(r, tok)
  local s = ""
  if tok and r.id then
    local b = tok:id_to_bytes(r.id)
    if b then s = " " .. string.format("%q", b):gsub("\\\n", "\\n") end
  end
  return s
end

-- Text tables for a report. opts.layer = L: the details of one layer (per
-- head shares, the selected entries best first, opts.entries of them, default
-- 16); otherwise one line per layer. Experts are listed by weight, heaviest
-- first. opts.tokenizer labels the token.
function M.format(r, opts)
  opts = opts or {}
  local lines = {}
  local function say(...) lines[#lines + 1] = string.format(...) end
  local head = string.format("token %s at position %d%s", tostring(r.id), r.position, label_of(r, opts.tokenizer))
  if r.index then head = string.format("token #%d (%s)", r.index, head) end
  lines[1] = head
  local Ls = {}
  for L in pairs(r.layers) do Ls[#Ls + 1] = L end
  table.sort(Ls)
  local function experts(L, n)
    local rt = r.routes[L]
    if not rt then return "" end
    local order = {}
    for i = 1, #rt.experts do order[i] = i end
    table.sort(order, function(x, y)
      if rt.weights[x] ~= rt.weights[y] then return rt.weights[x] > rt.weights[y] end
      return rt.experts[x] < rt.experts[y]
    end)
    local parts = {}
    for i = 1, math.min(n, #order) do
      parts[i] = string.format("%d:%.2f", rt.experts[order[i]], rt.weights[order[i]])
    end
    return table.concat(parts, " ")
  end
  local L1 = opts.layer
  if L1 == nil then
    say("%5s %5s %7s %7s %7s  %-22s %s", "layer", "ratio", "window", "compr", "sink", "entries", "experts:weight")
    for _, L in ipairs(Ls) do
      local lr = r.layers[L]
      local ent = "-"
      local c = lr.compressed
      if c then
        ent = string.format("%d of %d%s", c.selected, c.visible, c.scored and " (indexer)" or "")
      end
      say("%5d %5d %7s %7s %7s  %-22s %s", L, lr.ratio, f3(lr.mass.window), lr.ratio > 1 and f3(lr.mass.compressed)
        or "-", f3(lr.mass.sink), ent, experts(L, 8))
    end
    return table.concat(lines, "\n")
  end
  local lr = r.layers[L1]
  if not lr then error("format: layer " .. tostring(L1) .. " is not in the report", 2) end
  say("layer %d, ratio %d, window %d..%d", L1, lr.ratio, lr.window.first, lr.window.last)
  say("%5s %7s %7s %7s %9s", "head", "window", "compr", "sink", "lse")
  for h, x in ipairs(lr.heads) do
    say("%5d %7s %7s %7s %9s", h - 1, f3(x.window), lr.ratio > 1 and f3(x.compressed) or "-", f3(x.sink),
      x.lse and string.format("%.3f", x.lse) or "-")
  end
  say("%5s %7s %7s %7s", "mean", f3(lr.mass.window), lr.ratio > 1 and f3(lr.mass.compressed) or "-", f3(lr.mass.sink))
  local c = lr.compressed
  if c then
    local n = opts.entries or 16
    if c.scored then
      say("compressed entries: the indexer selected %d of %d (best first)", c.selected, c.visible)
    else
      say("compressed entries: all %d visible entries are attended (no selection)", c.visible)
    end
    local parts = {}
    for i = 1, math.min(n, #c.entries) do
      local e = c.entries[i]
      parts[#parts + 1] = string.format("%d [%d..%d]%s", e.entry, e.first, e.last,
        e.score and string.format(" %.3f", e.score) or "")
    end
    if #c.entries > n then parts[#parts + 1] = string.format("... (%d more)", #c.entries - n) end
    for i = 1, #parts, 4 do
      say("  %s", table.concat(parts, ",  ", i, math.min(i + 3, #parts)))
    end
  end
  if r.routes[L1] then say("experts: %s", experts(L1, 64)) end
  return table.concat(lines, "\n")
end

return M
