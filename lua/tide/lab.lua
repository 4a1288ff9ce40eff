-- tide.lab: the sampler lab. For a prompt on a model (or a session's
-- conversation so far) it runs one or more sampler chains from the same
-- logits and the same seed, and records, for every generated token, how each
-- stage reshaped the next-token distribution (the top candidates with their
-- probabilities after each stage, the candidates kept, the entropy), the
-- chosen token's probability and its rank under the model's own
-- distribution. It shows that as terminal bars, and as an HTML report with
-- pictures (tide.report) that also holds the attention inspector's window /
-- compressed / sink shares per layer and head, and the router's expert load
-- per layer, over the first chain's generation.
--
--   local r = tide.lab(s, { vs = { temp = 0.3 }, steps = 8 })   -- a session
--   local r = tide.lab(m, { prompt = "Once upon", sampler = "a.lua", vs = "b.lua", report = "lab.html" })
--   print(r:format())                -- the terminal view (tide.lab prints it unless quiet = true)
--
-- Nothing the lab does changes the session or the model's other sequences:
-- it prefills the prompt on a sequence of its own and forks it per chain.
local tide = require("tide")
local tffi = require("tide.ffi")
local sampling = require("tide.sampling")
local ffi = tffi.ffi

local M = {}
local Result = {}
Result.__index = Result
M.Result = Result

local function copy_row(row)
  local t = tide.empty({ row:numel() })
  ffi.copy(t.data, row.data, row:numel() * 4)
  return t
end

-- A short printable label for a token: its text with newlines, tabs and
-- control bytes made visible, at most `width` characters (bytes) long.
local function label(tok, id, width)
  width = width or 16
  if not tok then return "#" .. tostring(id) end
  local ok, s = pcall(tok.decode, tok, { id })
  if not ok or s == nil then return "#" .. tostring(id) end
  s = s:gsub("\n", "\\n"):gsub("\t", "\\t"):gsub("[%z\1-\31\127]", function(c)
    return c == "\127" and "^?" or ("^" .. string.char(c:byte() + 64))
  end)
  if s == "" then s = "#" .. tostring(id) end
  if #s > width then
    -- cut on a UTF-8 boundary
    local cut = width
    while cut > 1 and s:byte(cut + 1) and s:byte(cut + 1) >= 0x80 and s:byte(cut + 1) < 0xC0 do cut = cut - 1 end
    s = s:sub(1, cut) .. "~"
  end
  return s
end
M.label = label

-- A chain spec (sampler, file path, options table, list of stages) ->
-- sampler, its name; raises a user-readable message naming `which`.
local function make_sampler(x, which, tok)
  local s, err
  if x == nil then
    s, err = sampling.from_options({}, { tokenizer = tok })
  elseif type(x) == "string" then
    s, err = sampling.load(x)
  elseif type(x) == "table" and getmetatable(x) == sampling.Sampler then
    s = x
  elseif type(x) == "table" and (x[1] ~= nil) then
    local ok, r = pcall(sampling.chain, x)
    if ok then s = r else err = r end
  elseif type(x) == "table" then
    s, err = sampling.from_options(x, { tokenizer = tok })
  else
    err = "expected a sampler, a sampler file, an options table or a list of stages, got " .. type(x)
  end
  if not s then error(which .. ": " .. tostring(err), 0) end
  return s
end

-- tide.lab(model | session, opts) -> Result (and the terminal view printed
-- unless opts.quiet). opts:
--   prompt      text (the model's tokenizer; chat = true wraps it in the chat
--               template) or a list of token ids; a session gives its tokens
--   sampler     chain A (default: the session's sampler, else the default options)
--   vs          chain B, run from the same logits with the same seed; or
--   chains      { {name =, sampler =}, ... } for any number of chains
--   seed        (default 1)     steps   tokens to generate per chain (default 8)
--   top         candidates shown per stage (default 8)
--   inspect     false: no attention / router statistics (default: on)
--   report      path of an HTML report to write
function M.run(x, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("lab(x, opts): opts must be a table", 2) end
  local model, prompt, base_sampler
  local Session = require("tide.session").Session
  local Model = require("tide.model").Model
  if getmetatable(x) == Session then
    model = x.model
    prompt = x:tokens()
    base_sampler = x.sampler
    if #prompt == 0 then error("lab: the session has no tokens yet; say something first (s:say(...))", 2) end
  elseif getmetatable(x) == Model then
    model = x
  else
    error("lab(x, opts): x must be a model (tide.model) or a session (m:session)", 2)
  end
  local tok = model.tokenizer
  if opts.prompt ~= nil then
    if type(opts.prompt) == "string" then
      if not tok then error("lab: the model has no tokenizer; give the prompt as token ids", 2) end
      if opts.chat then
        prompt = require("tide.chat").encode(tok, { { role = "user", content = opts.prompt } },
          { add_generation_prompt = true })
      else
        prompt = tok:encode(opts.prompt)
      end
    elseif type(opts.prompt) == "table" then
      prompt = opts.prompt
    else
      error("lab: prompt must be text or a list of token ids", 2)
    end
  end
  if not prompt or #prompt == 0 then error("lab: give a prompt (opts.prompt)", 2) end
  for i, id in ipairs(prompt) do
    if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= model.vocab_size then
      error(string.format("lab: prompt token %s (number %d) is outside the vocabulary (0..%d)", tostring(id), i,
        model.vocab_size - 1), 2)
    end
  end
  local chains = {}
  if opts.chains then
    for i, c in ipairs(opts.chains) do
      chains[i] = { name = c.name or ("chain " .. string.char(64 + i)),
        sampler = make_sampler(c.sampler, "chain " .. i, tok) }
    end
  else
    chains[1] = { name = "A", sampler = make_sampler(opts.sampler or base_sampler, "sampler", tok) }
    if opts.vs ~= nil then chains[2] = { name = "B", sampler = make_sampler(opts.vs, "vs", tok) } end
  end
  if #chains == 0 then error("lab: no chains to run", 2) end
  local steps = opts.steps or 8
  local top = opts.top or 8
  if type(steps) ~= "number" or steps < 1 or steps ~= math.floor(steps) then
    error("lab: steps must be a whole number >= 1", 2)
  end
  if type(top) ~= "number" or top < 1 or top ~= math.floor(top) then
    error("lab: top must be a whole number >= 1", 2)
  end
  local seed = opts.seed or 1
  local eos = model.config and model.config.eos_token_id

  -- the prompt, once
  local seq, serr = model:sequence()
  if not seq then error("lab: " .. tostring(serr), 2) end
  local ok, row = pcall(model.prefill, model, seq, prompt)
  if not ok or not row then
    seq:free()
    error("lab: the prompt could not be run: " .. tostring(ok and "no logits" or row), 2)
  end
  local first = copy_row(row)
  local res = setmetatable({ model = model, prompt = prompt, seed = seed, steps = steps, top = top, chains = {},
    tokenizer = tok }, Result)
  local inspect_on = opts.inspect ~= false
  local cfg = model.config
  local H = cfg.num_attention_heads
  local nL = model.net.n_layers
  local attn = inspect_on and { n = 0, sum = {} } or nil
  local load = inspect_on and { n = 0, counts = {} } or nil
  local okrun, err = pcall(function()
    for ci, ch in ipairs(chains) do
      local st = ch.sampler:new_state({ seed = seed, trace = true, trace_top = top, tokenizer = tok })
      st:accept(prompt)
      local fork = assert(seq:fork())
      local cur = first
      local out = { name = ch.name, sampler = ch.sampler:describe(), steps = {}, text = {} }
      for step = 1, steps do
        local id, info = st:sample(cur)
        if not id then error("chain " .. ch.name .. ", step " .. step .. ": " .. tostring(info), 0) end
        local tr = st:trace()[#st:trace()]
        local raw = sampling.logprob(cur, id, 0)
        local last = tr.stages[#tr.stages]
        local final_entropy = tr.entropy
        for _, sr in ipairs(tr.stages) do if sr.n_out > 0 then final_entropy = sr.entropy end end
        out.steps[step] = {
          token = id, text = label(tok, id, 24), p = tr.p or info.p, rank = raw.rank, raw_p = math.exp(raw.logprob),
          entropy = tr.entropy, final_entropy = final_entropy, n = tr.n, raw_top = tr.raw_top,
          stages = tr.stages, kept = last and last.n_in or tr.n,
        }
        st:accept(id)
        if eos and id == eos then out.stopped = "eos" break end
        if step < steps then
          local spec = (inspect_on and ci == 1) and { layers = nil } or nil
          local r, e = model:step({ { seq = fork, tokens = { id }, logits = "last" } },
            spec and { inspect = spec } or nil)
          if not r then error(e, 0) end
          cur = copy_row(r[1])
          if spec then
            local rep = require("tide.inspect").report(model, spec, 0)
            attn.n = attn.n + 1
            for L = 0, nL - 1 do
              local lr = rep.layers[L]
              if lr then
                attn.sum[L] = attn.sum[L] or {}
                for h = 1, H do
                  local a = attn.sum[L][h] or { window = 0, compressed = 0, sink = 0, n = 0 }
                  local hd = lr.heads[h]
                  if hd.window then
                    a.window, a.compressed, a.sink = a.window + hd.window, a.compressed + (hd.compressed or 0),
                      a.sink + (hd.sink or 0)
                    a.n = a.n + 1
                  end
                  attn.sum[L][h] = a
                end
              end
              local rt = rep.routes[L]
              if rt then
                load.counts[L] = load.counts[L] or {}
                for _, e2 in ipairs(rt.experts) do load.counts[L][e2] = (load.counts[L][e2] or 0) + 1 end
              end
            end
            load.n = load.n + 1
          end
        end
      end
      st:close()
      fork:free()
      res.chains[ci] = out
    end
  end)
  seq:free()
  if not okrun then error("lab: " .. tostring(err), 2) end
  res.attention, res.load = attn, load
  if opts.report then
    local okw, werr = res:write_report(opts.report)
    if not okw then error("lab: " .. tostring(werr), 2) end
    res.report = opts.report
  end
  if not opts.quiet then print(res:format(opts)) end
  return res
end

-- ---------------------------------------------------------------- terminal
local BLOCKS = { "▏", "▎", "▍", "▌", "▋", "▊", "▉", "█" }
local function bar(p, width)
  local units = math.floor(math.max(0, math.min(1, p)) * width * 8 + 0.5)
  local full, part = math.floor(units / 8), units % 8
  local s = string.rep("█", full) .. (part > 0 and BLOCKS[part] or "")
  if s == "" and p > 0 then s = "▏" end
  return s
end
M.bar = bar

-- The terminal width of a label: UTF-8 code points, two columns for the
-- wide (CJK, Hangul, full-width) ranges.
local function width_of(s)
  local n = 0
  for ch in s:gmatch("[%z\1-\127\194-\244][\128-\191]*") do
    local b1 = ch:byte(1)
    local cp = b1
    if b1 >= 0xF0 then cp = 0x10000 elseif b1 >= 0xE0 then
      cp = (b1 - 0xE0) * 4096 + ((ch:byte(2) or 128) - 128) * 64 + ((ch:byte(3) or 128) - 128)
    end
    local wide = (cp >= 0x1100 and cp <= 0x115F) or (cp >= 0x2E80 and cp <= 0xA4CF) or (cp >= 0xAC00 and cp <= 0xD7A3)
      or (cp >= 0xF900 and cp <= 0xFAFF) or (cp >= 0xFE30 and cp <= 0xFE4F) or (cp >= 0xFF00 and cp <= 0xFF60)
      or (cp >= 0xFFE0 and cp <= 0xFFE6) or cp >= 0x1F300
    n = n + (wide and 2 or 1)
  end
  return n
end
local function pad(s, w) return s .. string.rep(" ", math.max(0, w - width_of(s))) end

local function same_top(a, b)
  if not a or not b or #a ~= #b then return false end
  for i = 1, #a do
    if a[i].id ~= b[i].id or math.abs(a[i].p - b[i].p) > 1e-7 then return false end
  end
  return true
end

-- The largest probability shown for a step: bars of one step share it as
-- their full length, so stages compare by length.
local function step_max(s)
  local mx = 0
  for _, e in ipairs(s.raw_top or {}) do if e.p > mx then mx = e.p end end
  for _, sr in ipairs(s.stages) do for _, e in ipairs(sr.top or {}) do if e.p > mx then mx = e.p end end end
  return mx > 0 and mx or 1
end
M.step_max = step_max

local function bars_block(lines, title, list, chosen, w, mx)
  lines[#lines + 1] = "  " .. title
  for _, e in ipairs(list or {}) do
    lines[#lines + 1] = string.format("    %s %s %.4f%s", pad(e.label, 18), pad(bar(e.p / mx, w), w), e.p,
      e.id == chosen and "  <- chosen" or "")
  end
end

-- The terminal view: for the first step (opts.all_steps: every step) of
-- each chain, the top candidates as bars before the chain and after each
-- stage; then one line per step and chain: the token, its probability in
-- the distribution it was drawn from, its rank under the model, the entropy
-- before and after the chain.
function Result:format(opts)
  opts = opts or {}
  local w = opts.bar_width or 30
  local tok = self.tokenizer
  local lines = {}
  lines[#lines + 1] = string.format("sampler lab: %d prompt tokens, seed %s, %d chain%s", #self.prompt,
    tostring(self.seed), #self.chains, #self.chains == 1 and "" or "s")
  for _, ch in ipairs(self.chains) do
    lines[#lines + 1] = ""
    lines[#lines + 1] = string.format("chain %s: %s", ch.name, ch.sampler)
    local upto = opts.all_steps and #ch.steps or math.min(1, #ch.steps)
    for i = 1, upto do
      local s = ch.steps[i]
      local mx = step_max(s)
      lines[#lines + 1] = string.format(" step %d: chose %s (id %d), p %.4f, model rank %d; a full bar is p = %.4f", i,
        s.text, s.token, s.p or 0, s.rank, mx)
      local function lab_list(list)
        local out = {}
        for j, e in ipairs(list or {}) do out[j] = { id = e.id, p = e.p, label = label(tok, e.id) } end
        return out
      end
      bars_block(lines, string.format("model (%s candidates, entropy %.3f)", M.commas(s.n), s.entropy),
        lab_list(s.raw_top), s.token, w, mx)
      local prev = s.raw_top
      for _, sr in ipairs(s.stages) do
        local title = string.format("after %s (%s of %s kept, entropy %.3f)", sr.stage, M.commas(sr.n_out),
          M.commas(sr.n_in), sr.entropy)
        if same_top(prev, sr.top) then
          lines[#lines + 1] = "  " .. title .. ": distribution unchanged"
        else
          bars_block(lines, title, lab_list(sr.top), s.token, w, mx)
        end
        prev = sr.top
      end
    end
  end
  lines[#lines + 1] = ""
  local head = { string.format("%4s", "step") }
  for _, ch in ipairs(self.chains) do
    head[#head + 1] = pad(string.format("chain %s: token", ch.name), 18) .. string.format(" %6s %5s %11s", "p",
      "rank", "entropy")
  end
  lines[#lines + 1] = table.concat(head, "  | ")
  for i = 1, self.steps do
    local row = { string.format("%4d", i) }
    local any = false
    for _, ch in ipairs(self.chains) do
      local s = ch.steps[i]
      if s then
        any = true
        row[#row + 1] = pad(s.text, 18) .. string.format(" %6.3f %5d %5.2f>%5.2f", s.p or 0, s.rank, s.entropy,
          s.final_entropy)
      else
        row[#row + 1] = pad("", 18) .. string.rep(" ", 25)
      end
    end
    if not any then break end
    lines[#lines + 1] = table.concat(row, "  | ")
  end
  if self.report then lines[#lines + 1] = "report: " .. self.report end
  return table.concat(lines, "\n")
end

M.commas = function(n) return require("tide.describe").commas(n) end

Result.__tostring = function(r)
  local parts = {}
  for _, ch in ipairs(r.chains) do parts[#parts + 1] = ch.name .. " " .. #ch.steps .. " tokens" end
  return string.format("tide.lab(%d prompt tokens, seed %s: %s%s)", #r.prompt, tostring(r.seed),
    table.concat(parts, ", "), r.report and (", report " .. r.report) or "")
end

-- ---------------------------------------------------------------- report
function Result:html()
  local rep = require("tide.report")
  local tok = self.tokenizer
  local sections = {}
  -- per stage the candidate distribution, chains side by side (first step)
  local cols = {}
  for _, ch in ipairs(self.chains) do
    local s = ch.steps[1]
    local svgs = {}
    local function items(list)
      local out = {}
      for j, e in ipairs(list or {}) do
        out[j] = { label = label(tok, e.id, 14), value = e.p, mark = e.id == s.token,
          note = string.format("id %d, p %.5f%s", e.id, e.p, e.id == s.token and " (chosen)" or "") }
      end
      return out
    end
    local mx = step_max(s)
    svgs[#svgs + 1] = rep.bars(items(s.raw_top), { title = string.format("model: %s candidates, entropy %.3f",
      M.commas(s.n), s.entropy), max = mx })
    for _, sr in ipairs(s.stages) do
      svgs[#svgs + 1] = rep.bars(items(sr.top), { title = string.format("after %s: %s kept, entropy %.3f",
        sr.stage, M.commas(sr.n_out), sr.entropy), max = mx })
    end
    cols[#cols + 1] = string.format('<div class="chain"><h3>chain %s: %s</h3><p>step 1 chose <b>%s</b> '
      .. '(p %.4f, model rank %d); a full bar is p = %.4f</p>%s</div>', rep.esc(ch.name), rep.esc(ch.sampler),
      rep.esc(s.text), s.p or 0, s.rank, mx, table.concat(svgs, "\n"))
  end
  sections[#sections + 1] = { title = "The next token, stage by stage (same logits, same seed)",
    html = '<div class="cols">' .. table.concat(cols, "\n") .. "</div>" }
  -- over the generation
  cols = {}
  for _, ch in ipairs(self.chains) do
    local ent, fent, p, rank, spans = {}, {}, {}, {}, {}
    for i, s in ipairs(ch.steps) do
      ent[i], fent[i], p[i], rank[i] = s.entropy, s.final_entropy, s.p or 0, s.rank
      local a = 0.15 + 0.6 * (s.p or 0)
      spans[#spans + 1] = string.format('<span class="tok" style="background: rgba(74,123,208,%.2f)" '
        .. 'title="step %d: id %d, p %.4f, model rank %d">%s</span>', a, i, s.token, s.p or 0, s.rank, rep.esc(s.text))
    end
    cols[#cols + 1] = string.format('<div class="chain"><h3>chain %s</h3><p class="gen">%s</p>%s%s%s</div>',
      rep.esc(ch.name), table.concat(spans),
      rep.lines({ { name = "model entropy", values = ent }, { name = "after the chain", values = fent } },
        { title = "entropy per step (nats)" }),
      rep.lines({ { name = "p of the chosen token", values = p, class = "s3" } },
        { title = "probability of the chosen token", ymax = 1 }),
      rep.lines({ { name = "rank (0 = most likely)", values = rank, class = "s2" } },
        { title = "model rank of the chosen token (log scale)", log = true }))
  end
  sections[#sections + 1] = { title = "Over the generation", html = '<div class="cols">' .. table.concat(cols, "\n")
    .. "</div>" }
  -- attention shares and expert load (chain A's decode steps)
  local cfg = self.model.config
  if self.attention and self.attention.n > 0 then
    local H, nL = cfg.num_attention_heads, self.model.net.n_layers
    local maps = {}
    for _, kind in ipairs({ "window", "compressed", "sink" }) do
      local vals = {}
      for L = 0, nL - 1 do
        local r = {}
        for h = 1, H do
          local a = self.attention.sum[L] and self.attention.sum[L][h]
          r[h] = (a and a.n > 0) and a[kind] / a.n or 0 / 0
        end
        vals[L + 1] = r
      end
      maps[#maps + 1] = rep.heatmap(vals, { title = kind .. " share", max = 1, xlabel = "head 0.." .. (H - 1),
        row_label = function(i) return string.format("L%d r%d", i - 1, cfg.ratios[i - 1]) end,
        col_label = function(j) return "head " .. (j - 1) end })
    end
    sections[#sections + 1] = { title = string.format("Attention: where each head's mass went (mean over %d "
      .. "decode steps of chain %s)", self.attention.n, self.chains[1].name),
      html = '<div class="cols">' .. table.concat(maps, "\n") .. "</div>" }
  end
  if self.load and self.load.n > 0 then
    local E, nL = cfg.n_routed_experts, self.model.net.n_layers
    local vals = {}
    for L = 0, nL - 1 do
      local r = {}
      for e = 1, E do r[e] = (self.load.counts[L] and self.load.counts[L][e - 1] or 0) / self.load.n end
      vals[L + 1] = r
    end
    sections[#sections + 1] = { title = string.format("Router: expert load per layer (share of %d tokens routed to "
      .. "each expert)", self.load.n),
      html = rep.heatmap(vals, { title = "expert load", xlabel = "expert 0.." .. (E - 1),
        row_label = function(i) return "L" .. (i - 1) end, col_label = function(j) return "expert " .. (j - 1) end }) }
  end
  local ptxt = tok and tok:decode(self.prompt) or table.concat(self.prompt, " ")
  if #ptxt > 400 then ptxt = ptxt:sub(1, 400) .. "..." end
  local meta = string.format("%s\nprompt (%d tokens): %s\nseed %s, %d steps per chain, top %d candidates shown",
    tostring(self.model), #self.prompt, ptxt, tostring(self.seed), self.steps, self.top)
  return rep.page("tide sampler lab", meta, sections)
end

function Result:write_report(path)
  return require("tide.report").write(path, self:html())
end

setmetatable(M, { __call = function(_, ...) return M.run(...) end })
return M
