-- tide batch: run a file of requests through the batching engine. One JSON
-- request per input line, one JSON result per request line, in input order
-- (error lines included); a progress bar on stderr when it is a terminal and
-- a summary line at the end. Sampling options given on the command line are
-- the defaults of every line; a line's own fields override them.
local args = require("tide.cli.args")
local sampling = require("tide.sampling")
local cjson = require("cjson")
local errors = require("tide.errors")
local ffi = require("ffi")

local spec = {
  model = { type = "string", meta = "DIR", required = true, help = "checkpoint directory" },
  input = { type = "string", meta = "FILE", required = true,
    help = "requests, one JSON object per line ('-' = stdin)" },
  output = { type = "string", meta = "FILE", default = "-",
    help = "results, one JSON object per line ('-' = stdout)" },
  policy = { type = "string", meta = "NAME|FILE", default = "fcfs",
    help = "scheduling policy: fcfs, priority, fair or a Lua file" },
  budget = { type = "number", meta = "N", default = 256, help = "tokens per step" },
  chunk = { type = "number", meta = "N", help = "most prompt tokens of one request per step (default: the budget)" },
  max_running = { type = "number", meta = "N", default = 16, help = "requests holding a sequence at once" },
  context = { type = "number", meta = "N", default = 4096, help = "positions per sequence the cache is sized for" },
  cache_pages = { type = "number", meta = "N",
    help = "compressed cache pages (default: 4 sequences at --context)" },
  cache_swa_blocks = { type = "number", meta = "N",
    help = "sliding-window cache blocks (default: a window per sequence)" },
  patience = { type = "number", meta = "N",
    help = "the oldest request runs at least every N steps (default 32)" },
  threads = { type = "number", meta = "N", help = "OpenMP threads" },
  draft = { type = "number", meta = "N", integer = true, min = 0,
    help = "speculative decoding: the MTP block drafts up to N tokens per step (a line's \"draft\" wins; "
      .. "same output)" },
  draft_policy = { type = "string", meta = "NAME|FILE",
    help = "with --draft: fixed (default), adaptive or a Lua file" },
  max_tokens = { type = "number", meta = "N", default = 128, help = "tokens to generate for lines without max_tokens" },
  progress = { type = "boolean",
    help = "show the progress bar even when stderr is not a terminal (--no-progress: never)" },
  quiet = { type = "boolean", help = "no summary line on stderr" },
  resume = { type = "boolean",
    help = "keep the results already in --output FILE and run only the request lines without one" },
}
for k, v in pairs(sampling.options) do if not spec[k] then spec[k] = v end end

local M = {
  summary = "run a JSONL file of requests through the batching engine",
  usage = "usage: tide batch --model DIR --input requests.jsonl [--output results.jsonl] [--policy NAME|FILE]\n"
    .. "                  [--budget N] [--max-running N] [--cache-pages N] [--threads N] [sampling defaults]\n"
    .. "A request line: {\"prompt\": TEXT | \"tokens\": [ids], \"max_tokens\": N, \"seed\": S, \"stop\": [...],\n"
    .. "  \"priority\": P, \"logprobs\": N | true, \"ignore_eos\": bool, \"id\": any, \"sampler\": FILE,\n"
    .. "  \"draft\": N or {\"max\": N, \"policy\": NAME|FILE, \"accept\": \"chain\"|\"rejection\"}\n"
    .. "  (speculative decoding, as --draft),\n"
    .. "  and sampling options by their option names (\"temp\", \"top_k\", \"top_p\", \"min_p\", ...)}.\n"
    .. "A result line: {\"line\", \"id\", \"finish_reason\", \"text\", \"tokens\", \"prompt_tokens\",\n"
    .. "  \"completion_tokens\", \"ttft\", \"time\", \"tokens_per_second\", \"preemptions\", \"speculation\" (with\n"
    .. "  drafts: max, policy, steps, drafted, accepted, acceptance, tokens_per_step), \"logprobs\"} or\n"
    .. "  {\"line\", \"id\", \"error\"}. Exit status 1 when some line failed.\n"
    .. "Each result line is written whole and flushed as soon as it and the lines before it are done;\n"
    .. "after a crash or a kill, --resume keeps the complete result lines and runs the rest.\n" .. args.help(spec),
}

-- ---------------------------------------------------------------- JSON out
-- Results are written with a fixed key order; arrays are marked so that an
-- empty one is written [] (lua-cjson 2.1 writes {}).
local ARRAY = {}
local function array(t) return setmetatable(t, ARRAY) end

local function num(v)
  if v ~= v or v == math.huge or v == -math.huge then return "null" end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  return string.format("%.6g", v)
end

local encode
local function encode_obj(keys, t)
  local parts = {}
  for _, k in ipairs(keys) do
    local v = t[k]
    if v ~= nil then parts[#parts + 1] = cjson.encode(k) .. ":" .. encode(v) end
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

function encode(v)
  local ty = type(v)
  if ty == "number" then return num(v) end
  if ty == "string" then return cjson.encode(v) end
  if ty == "boolean" then return tostring(v) end
  if v == nil or v == cjson.null then return "null" end
  if ty == "table" then
    if getmetatable(v) == ARRAY then
      local parts = {}
      for i = 1, #v do parts[i] = encode(v[i]) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    if v.__keys then return encode_obj(v.__keys, v) end
    return cjson.encode(v)
  end
  return cjson.encode(tostring(v))
end
M.encode = encode

local RESULT_KEYS = { "line", "id", "finish_reason", "stop_string", "text", "tokens", "prompt_tokens",
  "completion_tokens", "ttft", "time", "tokens_per_second", "preemptions", "speculation", "logprobs", "error" }
local SPEC_KEYS = { "max", "policy", "accept", "steps", "drafted", "accepted", "acceptance", "tokens_per_step" }
local LP_KEYS = { "token", "text", "logprob", "sampled_logprob", "top", "sampled_top" }
local TOP_KEYS = { "id", "logprob" }

local function tops(list)
  if not list then return nil end
  local out = array({})
  for i, e in ipairs(list) do out[i] = { __keys = TOP_KEYS, id = e.id, logprob = e.logprob } end
  return out
end

local function result_record(line, uid, res)
  local rec = { __keys = RESULT_KEYS, line = line, id = uid, finish_reason = res.finish_reason,
    stop_string = res.stop_string, text = res.text, tokens = array(res.tokens), prompt_tokens = res.prompt_tokens,
    completion_tokens = res.completion_tokens, ttft = res.ttft, time = res.time,
    tokens_per_second = res.tokens_per_second, preemptions = res.preemptions, error = res.error }
  if res.speculation then
    rec.speculation = { __keys = SPEC_KEYS }
    for k, v in pairs(res.speculation) do rec.speculation[k] = v end
  end
  if res.logprobs then
    local lp = array({})
    for i, e in ipairs(res.logprobs) do
      lp[i] = { __keys = LP_KEYS, token = e.token, text = e.text, logprob = e.raw_logprob,
        sampled_logprob = e.sampled_logprob, top = tops(e.raw_top), sampled_top = tops(e.sampled_top) }
    end
    rec.logprobs = lp
  end
  return rec
end

-- ---------------------------------------------------------------- JSON in
local REQ_KEYS = { prompt = "string", tokens = "ids", max_tokens = "int", n_predict = "int", seed = "number",
  stop = "stop", priority = "number", logprobs = "logprobs", n_probs = "int", ignore_eos = "boolean",
  id = "any", sampler = "string", draft = "draft" }

local function is_int(v) return type(v) == "number" and v == math.floor(v) end

-- A request line -> the engine's submit{} table, or nil, message.
-- `defaults` are the parsed command-line options (sampling defaults).
local function to_request(obj, defaults, sampler_cache, tokenizer)
  if type(obj) ~= "table" or obj[1] ~= nil then return nil, "a request must be a JSON object" end
  local opts = {}
  for k, v in pairs(defaults) do if sampling.options[k] then opts[k] = v end end
  local req = {}
  for k, v in pairs(obj) do
    local kind = REQ_KEYS[k]
    local so = sampling.options[k]
    if v == cjson.null then -- luacheck: ignore 542 (null: the default)
    elseif kind == "string" then
      if type(v) ~= "string" then return nil, "field '" .. k .. "' must be a string" end
    elseif kind == "int" then
      if not is_int(v) then return nil, "field '" .. k .. "' must be an integer" end
      if k == "n_probs" and not sampling.is_top_count(v) then
        return nil, "field 'n_probs' must be an integer in 0.." .. sampling.MAX_TOP
      end
    elseif kind == "number" then
      if type(v) ~= "number" then return nil, "field '" .. k .. "' must be a number" end
    elseif kind == "boolean" then
      if type(v) ~= "boolean" then return nil, "field '" .. k .. "' must be true or false" end
    elseif kind == "ids" then
      if type(v) ~= "table" then return nil, "field 'tokens' must be a list of token ids" end
      for i, id in ipairs(v) do
        if not is_int(id) then return nil, string.format("tokens[%d] is not an integer", i - 1) end
      end
    elseif kind == "stop" then
      local list = type(v) == "table" and v or { v }
      for _, s in ipairs(list) do
        if type(s) ~= "string" and not is_int(s) then return nil, "field 'stop' must hold strings or token ids" end
      end
    elseif kind == "logprobs" then
      if type(v) ~= "boolean" and not (is_int(v) and sampling.is_top_count(v)) then
        return nil, "field 'logprobs' must be true, false or an integer in 0.." .. sampling.MAX_TOP
      end
    elseif kind == "draft" then
      -- N, or {"max": N, "policy": NAME} (tide.speculate.parse checks the values at submit)
      if type(v) == "table" then
        if v[1] ~= nil then return nil, "field 'draft' must be an integer or {\"max\": N, \"policy\": NAME}" end
        for dk, dv in pairs(v) do
          if dk == "max" then
            if not is_int(dv) then return nil, "field 'draft': max must be an integer" end
          elseif dk == "policy" or dk == "accept" then
            if type(dv) ~= "string" then return nil, "field 'draft': " .. dk .. " must be a string" end
          else
            return nil, "field 'draft': unknown field '" .. tostring(dk) .. "' (max, policy, accept)"
          end
        end
        v = { max = v.max, policy = v.policy, accept = v.accept }
      elseif not is_int(v) then
        return nil, "field 'draft' must be an integer or {\"max\": N, \"policy\": NAME}"
      end
    elseif kind == "any" then
      if type(v) == "table" then return nil, "field 'id' must be a string or a number" end
    elseif so then
      if k == "logit_bias" and type(v) == "table" and v[1] == nil then
        -- {"15043": 1.5} -> llama.cpp's "15043+1.5"
        local list = {}
        for id, b in pairs(v) do
          if type(b) ~= "number" then return nil, "logit_bias values must be numbers" end
          list[#list + 1] = tostring(id) .. (b < 0 and "-" or "+") .. (math.abs(b) == math.huge and "inf"
            or tostring(math.abs(b)))
        end
        v = list
      elseif so.type == "list" then
        if type(v) == "string" then v = { v } end
        if type(v) ~= "table" then return nil, "field '" .. k .. "' must be a list of strings" end
      elseif so.type == "number" and type(v) ~= "number" then
        return nil, "field '" .. k .. "' must be a number"
      elseif so.type == "string" and type(v) ~= "string" then
        return nil, "field '" .. k .. "' must be a string"
      elseif so.type == "boolean" and type(v) ~= "boolean" then
        return nil, "field '" .. k .. "' must be true or false"
      end
    else
      return nil, "unknown field '" .. tostring(k) .. "'"
    end
    if v ~= cjson.null then
      if so then opts[k] = v else req[k] = v end
    end
  end
  if obj.sampler ~= nil and obj.sampler ~= cjson.null then opts.sampler = obj.sampler end
  if (req.prompt == nil) == (req.tokens == nil) then return nil, "give exactly one of 'prompt' or 'tokens'" end
  -- the sampler (one per distinct file)
  local sampler, err
  if opts.sampler then
    sampler = sampler_cache[opts.sampler]
    if not sampler then
      sampler, err = sampling.load(opts.sampler)
      if not sampler then return nil, "sampler " .. opts.sampler .. ": " .. tostring(err) end
      sampler_cache[opts.sampler] = sampler
    end
  else
    sampler, err = sampling.from_options(opts, { tokenizer = tokenizer })
    if not sampler then return nil, tostring(err) end
  end
  local lp = req.logprobs
  if lp == nil and req.n_probs and req.n_probs > 0 then lp = req.n_probs end
  if lp == nil and defaults.n_probs and defaults.n_probs > 0 then lp = defaults.n_probs end
  local seed = obj.seed
  if seed == nil or seed == cjson.null then seed = defaults.seed end
  return {
    prompt = req.prompt, tokens = req.tokens, max_tokens = req.max_tokens or req.n_predict or defaults.max_tokens,
    seed = seed, stop = req.stop, priority = req.priority, logprobs = lp or nil, ignore_eos = req.ignore_eos,
    sampler = sampler, draft = req.draft,
  }, nil, req.id
end
M.to_request = to_request   -- shared with tide serve (lua/tide/server/openai.lua)

-- One input line -> (request, nil, id) or (nil, message, id). Used by run()
-- and by the fuzz target tests/fuzz/fuzz_batch.lua.
function M.parse_line(text, defaults, sampler_cache, tokenizer)
  local okd, obj = pcall(cjson.decode, text)
  if not okd then return nil, "malformed JSON: " .. tostring(obj):gsub("^Expected", "expected") end
  return to_request(obj, defaults, sampler_cache, tokenizer)
end
M.spec = spec

-- ---------------------------------------------------------------- resume
-- The results already in `path` (for --resume): a set of the request line
-- numbers they answer, and the bytes of the complete result lines. A last
-- line without its newline (the writer was killed in the middle of it) is
-- not a result; it is cut off, so the file ends with a complete line before
-- the new results are appended. Returns done, n, n_failed (results that are
-- errors), or nil, message.
function M.read_results(path)
  local f = io.open(path, "rb")
  if not f then return {}, 0, 0 end   -- nothing written yet
  local text = f:read("*a")
  f:close()
  local keep = text:match("^.*\n") or ""
  local done, n, n_failed = {}, 0, 0
  local no = 0
  for l in keep:gmatch("([^\n]*)\n") do
    no = no + 1
    if l:match("%S") then
      local ok, rec = pcall(cjson.decode, l)
      if not ok or type(rec) ~= "table" or not is_int(rec.line) then
        return nil, string.format("%s line %d is not a tide batch result", path, no)
      end
      if not done[rec.line] then
        n = n + 1
        if rec.error ~= nil then n_failed = n_failed + 1 end
      end
      done[rec.line] = true
    end
  end
  if #keep < #text then
    local tmp = path .. ".resume-tmp"
    local w, err = io.open(tmp, "wb")
    if not w then return nil, "cannot rewrite " .. path .. ": " .. tostring(err) end
    local okw, werr = w:write(keep)
    if okw then okw, werr = w:close() else w:close() end
    if not okw then os.remove(tmp) return nil, "cannot rewrite " .. path .. ": " .. tostring(werr) end
    local okr, rerr = os.rename(tmp, path)
    if not okr then os.remove(tmp) return nil, "cannot rewrite " .. path .. ": " .. tostring(rerr) end
  end
  return done, n, n_failed
end

-- ---------------------------------------------------------------- progress
local isatty
do
  local ok = pcall(ffi.cdef, "int isatty(int fd);")
  local _ = ok
  isatty = function(fd)
    local okc, r = pcall(function() return ffi.C.isatty(fd) end)
    return okc and r == 1
  end
end

local function progress_bar(total, show, now)
  local bar = { total = total, show = show, last = -1, t0 = now() }
  function bar.update(done, running, tokens, final)
    if not bar.show then return end
    local t = now()
    if not final and t - bar.last < 0.1 then return end
    bar.last = t
    local w = 30
    local filled = total > 0 and math.floor(w * done / total) or w
    local rate = tokens / math.max(t - bar.t0, 1e-9)
    io.stderr:write(string.format("\rbatch [%s%s] %d/%d done, %d running, %d tokens, %.1f tokens/s ",
      string.rep("#", filled), string.rep(".", w - filled), done, total, running, tokens, rate))
    if final then io.stderr:write("\n") end
    io.stderr:flush()
  end
  return bar
end

-- ---------------------------------------------------------------- run
function M.run(argv)
  local o, pos = args.parse(argv, spec, "batch")
  if #pos > 0 then args.fail("batch: unexpected argument '" .. pos[1] .. "'") end
  local function posint(name, v)
    if v ~= nil and (not is_int(v) or v < 1) then
      args.fail("batch: --" .. name:gsub("_", "-") .. " must be an integer >= 1")
    end
  end
  for _, k in ipairs({ "budget", "chunk", "max_running", "context", "cache_pages", "cache_swa_blocks", "patience",
    "threads", "max_tokens" }) do posint(k, o[k]) end
  local tide = require("tide")
  if o.threads then tide.threads(o.threads) end
  local now = tide.time
  -- read every line first (errors are per line)
  local inf
  if o.input == "-" then inf = io.stdin else
    local err
    inf, err = io.open(o.input, "rb")
    if not inf then args.fail("batch: cannot open " .. tostring(err), 1) end
  end
  local done_lines, n_done, failed_before = {}, 0, 0
  if o.resume then
    if o.output == "-" then args.fail("batch: --resume needs --output FILE (the results so far)") end
    local derr
    done_lines, derr, failed_before = M.read_results(o.output)
    if not done_lines then args.fail("batch: --resume: " .. derr, 1) end
  end
  local lines = {}
  local n = 0
  for l in inf:lines() do
    n = n + 1
    if l:match("%S") then
      if done_lines[n] then n_done = n_done + 1 else lines[#lines + 1] = { line = n, text = l } end
    end
  end
  if inf ~= io.stdin then inf:close() end
  local model, merr = tide.model(o.model, { max_tokens = o.budget, cache = { context = o.context,
    max_seqs = o.max_running, pages = o.cache_pages, swa_blocks = o.cache_swa_blocks } })
  if not model then args.fail("batch: cannot load the model: " .. tostring(merr), 1) end
  local draft = o.draft and o.draft > 0 and { max = o.draft, policy = o.draft_policy } or nil
  local okp, eng = pcall(tide.engine, model, { budget = o.budget, chunk = o.chunk, policy = o.policy,
    patience = o.patience, draft = draft })
  if not okp then args.fail("batch: " .. tostring(eng):gsub("^engine: ", ""), 1) end
  local out
  if o.output == "-" then out = io.stdout else
    local err
    out, err = io.open(o.output, o.resume and "ab" or "wb")
    if not out then args.fail("batch: cannot write " .. tostring(err), 1) end
  end
  -- submit everything; bad lines get their error now
  local samplers = {}
  local failed = 0
  local slots = {}   -- per request line: { line, id, handle | record }
  for i, L in ipairs(lines) do
    local s = { line = L.line }
    slots[i] = s
    local req, err, uid = M.parse_line(L.text, o, samplers, model.tokenizer)
    s.id = uid
    if req then
      local oks, h, serr = pcall(eng.submit, eng, req)
      if not oks then err = tostring(h):gsub("^submit: ", "")
      elseif not h then err = serr
      else s.handle = h end
    end
    if err then
      err = errors.clean(err)
      s.record = { __keys = RESULT_KEYS, line = L.line, id = uid, error = "line " .. L.line .. ": " .. err }
      io.stderr:write("tide batch: line ", L.line, ": ", err, "\n")
      failed = failed + 1
    end
  end
  -- run, writing results in input order as soon as a prefix is complete
  local show = o.progress
  if show == nil then show = isatty(2) end
  local bar = progress_bar(#slots, show, now)
  local next_out, done, tokens = 1, 0, 0
  local sum_ttft, n_ttft = 0, 0
  local function flush_ready()
    while next_out <= #slots do
      local s = slots[next_out]
      if not s.record then
        if not s.handle:done() then break end
        local res = s.handle:result()
        if res.error then res.error = errors.clean(tostring(res.error)) end
        s.record = result_record(s.line, s.id, res)
        if res.ttft then sum_ttft, n_ttft = sum_ttft + res.ttft, n_ttft + 1 end
        if res.error then
          failed = failed + 1
          io.stderr:write("tide batch: line ", s.line, ": ", tostring(res.error), "\n")
        end
      end
      -- one write of the whole line, flushed: a kill leaves complete lines
      -- (and at most a cut last line, which --resume drops)
      out:write(encode(s.record) .. "\n")
      out:flush()
      s.record, s.handle = true, nil
      next_out = next_out + 1
    end
  end
  for _, s in ipairs(slots) do if s.record then done = done + 1 end end
  flush_ready()
  local t0 = now()
  local ok, err = pcall(function()
    while eng:active() > 0 do
      local before = eng.stats.finished
      eng:step()
      tokens = eng.stats.generated
      if eng.stats.finished ~= before then
        done = done + (eng.stats.finished - before)
        flush_ready()
      end
      bar.update(done, #eng.running, tokens)
    end
  end)
  local elapsed = now() - t0
  if not ok then
    -- the engine stopped (a failing policy): every unfinished request gets the error
    err = errors.clean(err)
    io.stderr:write((show and "\n" or ""), "tide batch: ", err, "\n")
    for _, s in ipairs(slots) do
      if s.handle and not s.handle:done() then s.handle:cancel() end
      if s.handle then s.handle.error = s.handle.error or ("engine stopped: " .. tostring(err)) end
    end
    flush_ready()
  end
  bar.update(done, 0, eng.stats.generated, true)
  if out ~= io.stdout then out:close() end
  if not o.quiet then
    local rep = eng:report()
    if o.resume then
      io.stderr:write(string.format("tide batch: --resume: %d request lines already had results in %s (%d failed)\n",
        n_done, o.output, failed_before))
    end
    io.stderr:write(string.format("tide batch: %d requests (%d failed) in %.2f s: %d tokens generated (%.1f tokens/s), "
      .. "mean time to first token %.3f s, %d steps, %d preemptions, Lua scheduling %.2f%% of step time\n", #slots,
      failed, elapsed, rep.generated, rep.generated / math.max(elapsed, 1e-9), n_ttft > 0 and sum_ttft / n_ttft or 0,
      rep.steps, rep.preemptions, 100 * rep.sched_share))
    if rep.spec_steps > 0 then
      io.stderr:write(string.format("tide batch: drafts: %d drafted, %d accepted (%.1f%%) in %d verify steps\n",
        rep.drafted, rep.accepted, 100 * rep.acceptance, rep.spec_steps))
    end
  end
  eng:close()
  model:close()
  -- after --resume the status is the whole job's (the lines run before too)
  return (failed > 0 or failed_before > 0 or not ok) and 1 or 0
end

return M
