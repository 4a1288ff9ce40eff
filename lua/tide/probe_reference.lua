-- tide.probe_reference: the golden reference harness and the decision dumps,
-- built as probes (tide.probe) on the DeepSeek-V4 points; the model's
-- use_reference / reference_report / reference_logits and step's
-- dump_topk / dump_routes options are thin calls into this file.
--
-- * Per-layer reference (m:use_reference{ layers }): model-wide probes at
--   attn_in / moe_in keep the sub-layer's input rows; at attn_out / moe_out
--   the golden scalar model (engine/ref/refmodel.c) recomputes the sub-layer
--   for each token from the same input, the fast path's rows are compared
--   with it and replaced by it.
-- * Whole-model reference (m:use_reference(true)): a probe at `final` feeds
--   each token through the reference model, a probe at `logits` puts the
--   reference's rows in place of the fast ones.
-- * Decision dumps: probes at attn_topk / moe_routes record, per layer and
--   position, the compressed entries and experts the step chose (the
--   reference's own decisions in whole-model reference mode).
local tide = require("tide")
local tffi = require("tide.ffi")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}

-- The reference state that follows `seq` from position 0 (made on its
-- first step; a fork or a sequence that started earlier has none).
local function ref_for(model, seq)
  model._refs = model._refs or setmetatable({}, { __mode = "k" })
  local r = model._refs[seq]
  if r then return r end
  if seq._noref then error("reference mode: this sequence was forked and has no reference state", 0) end
  if seq:len() ~= 0 then
    error("reference mode was switched on after this sequence started; start a new sequence", 0)
  end
  local box = ffi.new("tide_refmodel*[1]")
  check(C.tide_refmodel_new(box, model.ck._h))
  r = { h = ffi.gc(box[0], C.tide_refmodel_free) }
  model._refs[seq] = r
  return r
end
M.ref_for = ref_for

-- Record the reference's decisions of the token at position p it just
-- processed into dumps (dump[L][p + 1] = sorted list).
local selbuf, routebuf
local function ref_decisions(model, ref, p, dump_topk, dump_routes)
  local cfg = model.config
  if dump_topk then
    selbuf = selbuf or ffi.new("int32_t[?]", cfg.index_topk)
    for L = 0, model.net.n_layers - 1 do
      if cfg.ratios[L] == 4 then
        local n = check(C.tide_refmodel_last_topk(ref, L, selbuf, cfg.index_topk))
        local sel = {}
        for i = 0, n - 1 do sel[i + 1] = selbuf[i] end
        table.sort(sel)
        dump_topk[L] = dump_topk[L] or {}
        dump_topk[L][p + 1] = sel
      end
    end
  end
  if dump_routes then
    routebuf = routebuf or ffi.new("int32_t[64]")
    for L = 0, model.net.n_layers - 1 do
      local k = check(C.tide_refmodel_last_route(ref, L, routebuf, nil))
      local sel = {}
      for i = 0, k - 1 do sel[i + 1] = routebuf[i] end
      table.sort(sel)
      dump_routes[L] = dump_routes[L] or {}
      dump_routes[L][p + 1] = sel
    end
  end
end

-- ---------------------------------------------------------------- per layer
local function layer_probes(model, set)
  local errs = model._ref_err
  local d = model.net.d
  local tmp = tide.zeros({ d })
  local inputs = {}          -- [kind] = copy of the sub-layer input rows of the entry being run
  local layers = {}
  for L in pairs(set) do layers[#layers + 1] = L end
  local function keep(kind)
    inputs[kind] = {}
    return function(x, info) inputs[kind][info.entry] = x:clone() end
  end
  local function replace(kind)
    return function(a, info)
      local L = info.layer
      local inp = inputs[kind][info.entry]
      local ref = ref_for(model, info.seq).h
      local e = errs[L] or {}
      errs[L] = e
      local acc = e[kind] or { n = 0, sum = 0, max = 0, elems = 0, equal = 0 }
      e[kind] = acc
      for j = 0, info.n - 1 do
        local xr, ar, p = inp[j], a[j], info.pos0 + j
        if kind == "attn" then
          check(C.tide_refmodel_attn(ref, L, xr, p, tmp))
        else
          check(C.tide_refmodel_moe(ref, L, xr, info.ids[j], p, tmp))
        end
        local cmp = ar:compare(tmp, 0, 0)      -- rtol = atol = 0: n_bad counts unequal elements
        acc.n = acc.n + 1
        acc.sum = acc.sum + cmp.nmse
        if cmp.nmse > acc.max then acc.max = cmp.nmse end
        acc.elems = acc.elems + d
        acc.equal = acc.equal + (d - cmp.n_bad)
        check(C.tide_tensor_copy(ar, tmp))
      end
    end
  end
  return {
    { at = "attn_in", layers = layers, fn = keep("attn"), name = "reference" },
    { at = "attn_out", layers = layers, fn = replace("attn"), name = "reference" },
    { at = "moe_in", layers = layers, fn = keep("moe"), name = "reference" },
    { at = "moe_out", layers = layers, fn = replace("moe"), name = "reference" },
  }
end

-- ---------------------------------------------------------------- whole model
-- `final`: each token of the entry goes through the reference model (once:
-- a re-run of the same positions, after another entry's probe failed,
-- reuses what was kept); `logits`: the reference's rows replace the fast
-- ones. The step's dumps (st.dumps) record the reference's decisions.
local function whole_probes(model)
  local V = model.vocab_size
  local function feed(_, info)
    local r = ref_for(model, info.seq)
    local len = tonumber(C.tide_refmodel_length(r.h))
    if len == info.pos0 + info.n and r.kept_pos0 == info.pos0 then return end
    if len ~= info.pos0 then
      error(string.format("reference mode: the reference holds %d positions, the step starts at %d", len,
        info.pos0), 0)
    end
    local want = info.want
    local keep = want == "all" and tide.zeros({ info.n, V }) or (want and tide.zeros({ 1, V })) or nil
    local dumps = model._step_dumps
    for j = 0, info.n - 1 do
      local row = nil
      if keep then
        if want == "all" then row = keep[j] elseif j == info.n - 1 then row = keep[0] end
      end
      check(C.tide_refmodel_step(r.h, info.ids[j], row))
      if dumps then ref_decisions(model, r.h, info.pos0 + j, dumps.topk, dumps.routes) end
    end
    r.kept, r.kept_pos0 = keep, info.pos0
  end
  local function logits(_, info) return ref_for(model, info.seq).kept end
  return {
    { at = "final", fn = feed, name = "reference" },
    { at = "logits", fn = logits, name = "reference" },
  }
end

-- m:use_reference(spec): see Model:use_reference (lua/tide/model.lua).
function M.use(model, spec, level)
  level = (level or 1) + 1
  local mode
  if spec == false or spec == nil then
    mode = nil
  elseif spec == true or spec == "all" then
    mode = "all"
  elseif type(spec) == "number" or type(spec) == "table" then
    if type(spec) == "number" then spec = { spec } end
    mode = {}
    for _, L in ipairs(spec) do
      if type(L) ~= "number" or L < 0 or L >= model.net.n_layers then
        error("use_reference: layer " .. tostring(L) .. " out of range 0.." .. (model.net.n_layers - 1), level)
      end
      mode[L] = true
    end
  else
    error("use_reference(true | false | {layers...})", level)
  end
  if model._ref_handle then model._ref_handle:remove() end
  model._ref_handle = nil
  model._reference = mode
  model._ref_err = {}
  if mode == "all" then
    model._ref_handle = model:probe(whole_probes(model))
  elseif mode then
    model._ref_handle = model:probe(layer_probes(model, mode))
  end
  return model
end

-- See Model:reference_report.
function M.report(model)
  local out = {}
  for L, e in pairs(model._ref_err or {}) do
    out[L] = {}
    for k, v in pairs(e) do
      out[L][k] = { tokens = v.n, mean_nmse = v.n > 0 and v.sum / v.n or 0, max_nmse = v.max,
        equal = v.elems > 0 and v.equal / v.elems or 0 }
    end
  end
  return out
end

-- See Model:reference_logits.
function M.logits(model, tokens, opts)
  opts = opts or {}
  local T, V = #tokens, model.vocab_size
  local box = ffi.new("tide_refmodel*[1]")
  check(C.tide_refmodel_new(box, model.ck._h), 3)
  local ref = ffi.gc(box[0], C.tide_refmodel_free)
  local replay = opts.replay or {}
  local ids = ffi.new("int32_t[?]", math.max(model.config.index_topk, 64))
  local function rows(dump, L)
    if not dump then return nil end
    return dump[L] or dump[tostring(L)]
  end
  local out = tide.zeros({ T, V })
  for t = 0, T - 1 do
    for L = 0, model.net.n_layers - 1 do
      local rt = rows(replay.topk, L)
      if rt and rt[t + 1] then
        local r = rt[t + 1]
        for i = 1, #r do ids[i - 1] = r[i] end
        check(C.tide_refmodel_force_topk(ref, L, t, ids, #r), 3)
      end
      local rr = rows(replay.routes, L)
      if rr and rr[t + 1] then
        local r = rr[t + 1]
        for i = 1, #r do ids[i - 1] = r[i] end
        check(C.tide_refmodel_force_route(ref, L, t, ids), 3)
      end
    end
    check(C.tide_refmodel_step(ref, tokens[t + 1], out[t]), 3)
    if opts.dump_topk or opts.dump_routes then ref_decisions(model, ref, t, opts.dump_topk, opts.dump_routes) end
  end
  return out
end

-- ---------------------------------------------------------------- decision dumps
-- Probes recording the fast path's decisions of a step into dump_topk /
-- dump_routes: dump[L][position + 1] = sorted list (the entries a ratio-4
-- layer attends: the indexer's selection, or every visible entry on the
-- short path; the routed experts). Keyed by position, so they describe one
-- sequence (the m:logits / tide logits use).
function M.dump_probes(model, dump_topk, dump_routes)
  local list = {}
  if dump_topk then
    list[#list + 1] = { at = "attn_topk", name = "dump_topk", fn = function(topk, info)
      local L = info.layer
      local rowsL = dump_topk[L] or {}
      dump_topk[L] = rowsL
      local K = model.config.index_topk
      for j = 0, info.n - 1 do
        local p = info.pos0 + j
        local nvis = math.floor((p + 1) / 4)
        local sel = {}
        if topk and nvis > K then
          local row = ffi.cast("int32_t*", topk.data) + j * K
          for k = 0, K - 1 do
            if row[k] >= 0 then sel[#sel + 1] = row[k] end
          end
          table.sort(sel)
        else
          for k = 0, nvis - 1 do sel[#sel + 1] = k end
        end
        rowsL[p + 1] = sel
      end
    end }
  end
  if dump_routes then
    list[#list + 1] = { at = "moe_routes", name = "dump_routes", fn = function(rids, info)
      local L = info.layer
      local rowsL = dump_routes[L] or {}
      dump_routes[L] = rowsL
      local k = rids:size(1)
      local p = ffi.cast("int32_t*", rids.data)
      for t = 0, info.n - 1 do
        local sel = {}
        for i = 0, k - 1 do sel[#sel + 1] = p[t * k + i] end
        table.sort(sel)
        rowsL[info.pos0 + t + 1] = sel
      end
    end }
  end
  return list
end

return M
