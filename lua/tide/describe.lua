-- tide.describe: how tide's objects introduce themselves. Each object gets a
-- one-line summary (its tostring, torch7 style: the kind, then the numbers
-- that matter, no newline) and a long form (x:describe(), or
-- tide.describe(x) for anything). The objects' own modules only hook these
-- in (Model.__tostring = describe.model, ...), so the wording lives here.
local M = {}

local function commas(n)
  local s = string.format("%d", n)
  local out = s:reverse():gsub("(%d%d%d)", "%1,"):reverse()
  return (out:gsub("^,", ""):gsub("^%-,", "-"))
end
M.commas = commas

-- 1234567 -> "1.2 MB" (decimal units, as disk sizes are quoted)
local function human(b)
  b = tonumber(b) or 0
  if b >= 1e9 then return string.format("%.2f GB", b / 1e9) end
  if b >= 1e6 then return string.format("%.1f MB", b / 1e6) end
  if b >= 1e3 then return string.format("%.1f kB", b / 1e3) end
  return string.format("%d B", b)
end
M.human = human

local function basename(p) return (tostring(p):gsub("/+$", ""):match("([^/]*)$")) end

-- ---------------------------------------------------------------- model
-- Layers by kind: "4 layers: 1 SWA, 2 C4, 1 C128".
local function layer_kinds(cfg, n)
  local c = { [1] = 0, [4] = 0, [128] = 0 }
  local other = 0
  for L = 0, n - 1 do
    local r = cfg.ratios and cfg.ratios[L] or 1
    if c[r] then c[r] = c[r] + 1 else other = other + 1 end
  end
  local parts = {}
  if c[1] > 0 then parts[#parts + 1] = c[1] .. " SWA" end
  if c[4] > 0 then parts[#parts + 1] = c[4] .. " C4" end
  if c[128] > 0 then parts[#parts + 1] = c[128] .. " C128" end
  if other > 0 then parts[#parts + 1] = other .. " other" end
  return string.format("%d layers (%s)", n, table.concat(parts, ", "))
end

-- Weight bytes by dtype, heaviest first: "fp8 12.1 MB, bf16 3.0 MB".
-- (MXFP4 weights are stored as packed i8 with e8m0 block scales)
local DTYPE_SHORT = { f8e4m3 = "fp8", i8 = "fp4", e8m0 = "e8m0 scales" }
local function by_dtype(summary)
  local names = {}
  for k in pairs(summary.by_dtype) do names[#names + 1] = k end
  table.sort(names, function(a, b) return summary.by_dtype[a].bytes > summary.by_dtype[b].bytes end)
  local parts = {}
  for _, k in ipairs(names) do parts[#parts + 1] = (DTYPE_SHORT[k] or k) .. " " .. human(summary.by_dtype[k].bytes) end
  return table.concat(parts, ", "), names
end

local function ck_summary(ck)
  if not ck or ck._h == nil then return nil end
  local ok, s = pcall(ck.summary, ck)
  return ok and s or nil
end

function M.model(m)
  if m.cache == nil then return "tide.model(closed)" end
  local cfg, n = m.config, m.net and m.net.n_layers or m.config.num_hidden_layers
  local parts = {
    string.format("%s %s", tostring(cfg.model_type or "?"), basename(m.name)),
    layer_kinds(cfg, n),
    "hidden " .. cfg.hidden_size,
    string.format("experts %d routed/%d used", cfg.n_routed_experts or 0, cfg.num_experts_per_tok or 0),
    "vocab " .. commas(m.vocab_size),
  }
  local s = ck_summary(m.ck)
  if s then parts[#parts + 1] = "weights " .. human(s.bytes) .. " (" .. by_dtype(s) .. ")" end
  local okc, cs = pcall(m.cache_stats, m)
  if okc then
    parts[#parts + 1] = string.format("cache %d seqs, window %d, %s", cs.max_seqs, cs.window, human(cs.bytes))
  end
  return "tide.model(" .. table.concat(parts, ", ") .. ")"
end

local function cache_lines(cs)
  return {
    string.format("cache: %d/%d sequences live, window %d positions, %s of storage", cs.seqs, cs.max_seqs, cs.window,
      human(cs.bytes)),
    string.format("  sliding window: %d/%d blocks free, %d positions per block%s", cs.swa_free, cs.swa_blocks,
      cs.swa_block, cs.keep_swa_history and " (history kept)" or ""),
    string.format("  compressed: %d/%d pages free, %d positions per page", cs.pages_free, cs.pages, cs.page_tokens),
  }
end

function M.model_long(m)
  local lines = { M.model(m) }
  if m.cache == nil then return lines[1] end
  local cfg = m.config
  lines[#lines + 1] = "directory: " .. tostring(m.name)
  local okc, cl = pcall(function() return require("tide.cli.inspect").config_lines(cfg) end)
  if okc then for _, l in ipairs(cl) do lines[#lines + 1] = l end end
  local ratios = {}
  local n = m.net and m.net.n_layers or cfg.num_hidden_layers
  for L = 0, n - 1 do ratios[#ratios + 1] = tostring(cfg.ratios and cfg.ratios[L] or "?") end
  lines[#lines + 1] = "layer ratios (0..." .. (n - 1) .. "): " .. table.concat(ratios, " ")
  local s = ck_summary(m.ck)
  if s then
    lines[#lines + 1] = string.format("weights: %s in %d tensors, %s parameters, %d shard%s", human(s.bytes),
      s.tensors, commas(s.parameters), s.shards, s.shards == 1 and "" or "s")
    local _, names = by_dtype(s)
    for _, k in ipairs(names) do
      local d = s.by_dtype[k]
      lines[#lines + 1] = string.format("  %-8s %6d tensors %16s elements %10s", k, d.count, commas(d.elements),
        human(d.bytes))
    end
  end
  local okcs, cs = pcall(m.cache_stats, m)
  if okcs then for _, l in ipairs(cache_lines(cs)) do lines[#lines + 1] = l end end
  lines[#lines + 1] = string.format("steps: up to %d tokens each; %s", m.max_tokens,
    m.tokenizer and ("tokenizer " .. M.tokenizer(m.tokenizer)) or "no tokenizer")
  return table.concat(lines, "\n")
end

function M.sequence(s)
  if not s._live then return string.format("tide.sequence(%d, freed)", s.id) end
  local ok, n = pcall(s.len, s)
  local oku, swa, pages = pcall(s.usage, s)
  return string.format("tide.sequence(%d, %s positions, %s window blocks, %s pages)", s.id, ok and n or "?",
    oku and swa or "?", oku and pages or "?")
end

-- The cache pointer (model.cache) from its pool statistics.
function M.cache(c)
  local tffi = require("tide.ffi")
  local st = tffi.ffi.new("tide_kvcache_stats")
  if tffi.C.tide_kvcache_stats_get(c, st) < 0 then return "tide.cache(?)" end
  return string.format("tide.cache(%d/%d sequences, %d/%d window blocks x %d, %d/%d pages x %d, window %d, %s)",
    st.seqs, st.max_seqs, st.swa_blocks - st.swa_free, st.swa_blocks, st.swa_block, st.pages - st.pages_free,
    st.pages, st.page_tokens, st.window, human(tonumber(st.bytes)))
end

-- ---------------------------------------------------------------- sessions
function M.session(s)
  if not s.seq then return string.format("tide.session(closed, %d tokens)", #s.toks) end
  local oku, swa, pages = pcall(s.seq.usage, s.seq)
  return string.format("tide.session(%d tokens, %d exchanges, seed %.0f, %s window blocks, %s pages, %d snapshots; %s)",
    #s.toks, #s.turns, tonumber(s.seed) or 0, oku and swa or "?", oku and pages or "?", #s.snaps,
    s.sampler:describe())
end

function M.session_long(s)
  local lines = { M.session(s) }
  lines[#lines + 1] = "model: " .. M.model(s.model)
  lines[#lines + 1] = "sampler: " .. s.sampler:describe()
  local st = s.settings and s:settings() or {}
  lines[#lines + 1] = string.format("max_tokens %s, ignore_eos %s, thinking %s, trace %s", tostring(st.max_tokens),
    tostring(st.ignore_eos), tostring(st.thinking), tostring(st.trace))
  if s.system then lines[#lines + 1] = string.format("system: %q", s.system) end
  local msgs = s.messages and s:messages() or {}
  for _, m in ipairs(msgs) do
    local t = m.content:gsub("\n", " ")
    if #t > 70 then t = t:sub(1, 67) .. "..." end
    lines[#lines + 1] = string.format("  %-9s %s", m.role .. ":", t)
  end
  return table.concat(lines, "\n")
end

function M.reply(r)
  local t = (r.text or ""):gsub("%s+", " ")
  if #t > 40 then t = t:sub(1, 37) .. "..." end
  return string.format("tide.reply(%d tokens, %s, %.1f tokens/s: %q)", r.n_tokens or 0, tostring(r.finish_reason),
    r.tokens_per_s or 0, t)
end

-- ---------------------------------------------------------------- engine
function M.engine(e)
  return string.format("tide.engine(policy %s, budget %d, %d running, %d waiting, %d steps, %d tokens generated)",
    tostring(e.policy and e.policy.name or "?"), e.budget, #e.running, #e.waiting, e.stats.steps, e.stats.generated)
end

function M.engine_long(e)
  local lines = { M.engine(e) }
  lines[#lines + 1] = "model: " .. M.model(e.model)
  lines[#lines + 1] = string.format("limits: chunk %d, max_running %d, window blocks %d, pages %d, patience %d",
    e.chunk, e.max_running, e.swa_cap, e.pages_cap, e.patience)
  local s = e.stats
  lines[#lines + 1] = string.format("so far: %d finished, %d preemptions, %d prefill + %d decode tokens", s.finished,
    s.preemptions, s.prefill_tokens, s.decode_tokens)
  for _, list in ipairs({ e.running, e.waiting }) do
    for _, r in ipairs(list) do lines[#lines + 1] = "  " .. M.request(r) end
  end
  return table.concat(lines, "\n")
end

function M.request(r)
  local fin = r.finish_reason and (", " .. tostring(r.finish_reason)) or ""
  return string.format("tide.request(%d %s%s, prompt %d tokens, %d/%d generated, priority %g, %d preemptions)",
    r.id, tostring(r.status), fin, r.n_prompt, #r.generated, r.max_tokens, r.priority, r.preemptions)
end

-- ---------------------------------------------------------------- samplers
local function stage_text(st)
  local parts = {}
  for _, k in ipairs(st.params or {}) do
    local v = st[k]
    if v ~= nil then parts[#parts + 1] = k .. " = " .. tostring(v) end
  end
  return tostring(st.name) .. (#parts > 0 and ("(" .. table.concat(parts, ", ") .. ")") or "")
end
M.stage_text = stage_text

function M.stage(st) return "tide.stage(" .. stage_text(st) .. (st.final and ", chooses the token" or "") .. ")" end

function M.sampler(s)
  local src = s.source and (" from " .. s.source) or ""
  return string.format("tide.sampler(%d stages%s: %s)", #s.stages, src, s:describe())
end

function M.sampler_long(s)
  local lines = { M.sampler(s) }
  for i, st in ipairs(s.stages) do
    lines[#lines + 1] = string.format("  %d. %s%s%s", i, stage_text(st), st.final and "  [chooses]" or "",
      st.user and "  [user stage, checked]" or "")
  end
  if s.reload_error then lines[#lines + 1] = "last reload failed: " .. s.reload_error end
  return table.concat(lines, "\n")
end

-- ---------------------------------------------------------------- files
function M.tokenizer(t)
  if t._h == nil then return "tide.tokenizer(closed)" end
  local v = tonumber(t.vocab_size)
  return string.format("tide.tokenizer(%s%s: %s)", basename(t.path or "?"), v and (", vocab " .. commas(v)) or "",
    t:describe())
end

function M.checkpoint(ck)
  if ck._h == nil then return "tide.checkpoint(" .. tostring(ck.path) .. ", closed)" end
  local s = ck_summary(ck)
  if not s then return "tide.checkpoint(" .. tostring(ck.path) .. ")" end
  return string.format("tide.checkpoint(%s, %d tensors, %d shard%s, %s, %s parameters: %s)", basename(ck.path),
    s.tensors, s.shards, s.shards == 1 and "" or "s", human(s.bytes), commas(s.parameters), by_dtype(s))
end

function M.checkpoint_long(ck)
  local lines = { M.checkpoint(ck) }
  if ck.config then
    local okc, cl = pcall(function() return require("tide.cli.inspect").config_lines(ck.config) end)
    if okc then for _, l in ipairs(cl) do lines[#lines + 1] = l end end
  end
  return table.concat(lines, "\n")
end

-- ---------------------------------------------------------------- any value
-- The long form of x: its describe() when it has one, else its summary.
function M.long(x)
  local mt = type(x) == "table" and getmetatable(x) or nil
  local function is(mod, field)
    local ok, m = pcall(require, mod)
    return ok and mt == m[field]
  end
  if mt then
    if is("tide.model", "Model") then return M.model_long(x) end
    if is("tide.session", "Session") then return M.session_long(x) end
    if is("tide.engine", "Engine") then return M.engine_long(x) end
    if is("tide.sampling", "Sampler") then return M.sampler_long(x) end
    if is("tide.checkpoint", "Checkpoint") then return M.checkpoint_long(x) end
  end
  if type(x) == "cdata" then
    local tffi = require("tide.ffi")
    if tffi.ffi.istype("tide_kvcache*", x) then return M.cache(x) end
  end
  return require("tide.pretty").format(x)
end

return M
