-- tide chat --model DIR: a chat front end over tide.session. Lines typed
-- are user turns; the reply streams as it is sampled. Line editing and
-- history come from libedit (the `tide` executable); Ctrl-C stops the
-- current generation (the session stays usable: the reply so far is kept),
-- Ctrl-C at the prompt drops the line, Ctrl-D leaves. Commands start with
-- "/" (/help lists them). Piped input (not a terminal) works too: one line
-- per turn or command, no prompt.
local args = require("tide.cli.args")
local sampling = require("tide.sampling")
local errors = require("tide.errors")

local spec = {
  model = { type = "string", meta = "DIR",
    help = "checkpoint directory with tokenizer.json (default: the default model, as `make run`)" },
  system = { type = "string", meta = "TEXT", help = "system prompt" },
  max_tokens = { type = "number", meta = "N", default = 512, integer = true, min = 1,
    why_min = "the most tokens per reply; there is no unlimited setting", help = "tokens per reply at most" },
  n_predict = { type = "number", meta = "N", integer = true, min = 1,
    why_min = "the most tokens per reply; there is no unlimited setting", help = "same as --max-tokens" },
  stop = { type = "list", meta = "S", help = "stop string (repeatable)" },
  ignore_eos = { type = "boolean", help = "do not stop a reply at the end-of-sentence token" },
  thinking = { type = "boolean", help = "v3.1-style templates: open replies with <think>" },
  context = { type = "number", meta = "N", default = 4096, integer = true, min = 1,
    help = "positions per conversation the cache is sized for" },
  chunk = { type = "number", meta = "N", default = 256, integer = true, min = 1, help = "prefill tokens per step" },
  threads = { type = "number", meta = "N", integer = true, min = 0, help = "OpenMP threads (0: all cores)" },
  load = { type = "string", meta = "PATH", help = "start from a saved session (/save)" },
  snapshots = { type = "number", meta = "N", default = 4, integer = true, min = 0,
    help = "cache snapshots kept per branch (undo/regen speed)" },
  draft = { type = "number", meta = "N", integer = true, min = 0,
    help = "speculative decoding: the MTP block drafts up to N tokens per step (same replies)" },
  draft_policy = { type = "string", meta = "NAME|FILE",
    help = "with --draft: fixed (default), adaptive or a Lua file" },
}
for k, v in pairs(sampling.options) do
  if not spec[k] and k ~= "n_probs" then spec[k] = v end
end

local M = {
  summary = "chat with a model: streaming replies, /undo /regen /fork /save /load /inspect ...",
  usage = "usage: tide chat [--model DIR] [--sampler FILE] [--system TEXT] [--seed S] [sampling options]\n"
    .. "  type a message to get a reply; /help inside lists the commands\n" .. args.help(spec),
}

local HELP = [[
commands:
  /help                 this list
  /undo                 drop the last exchange (your message and the reply)
  /regen                resample the last reply
  /fork                 branch the conversation here (a new branch becomes current)
  /switch N             go to branch N (/branches lists them)
  /branches             the branches and their lengths
  /sampler FILE         use the sampler file FILE (reloaded when it changes)
  /set [KEY VALUE]      show the settings, or set one: temp, top_k, top_p, min_p,
                        repeat_penalty, presence_penalty, frequency_penalty, seed,
                        max_tokens, mirostat, ... (llama.cpp's option names)
  /peek [N]             the N most likely next tokens (nothing is committed)
  /inspect [L] [T]      the sparse attention and routing of token T (default the
                        latest): all layers, or layer L in detail
  /trace [N]            the sampler trace of the last token (or the last N)
  /lab [N] [FILE.html]  the sampler lab on the conversation: how each stage of the
                        sampler reshapes the next token's distribution, N tokens
                        (default 4), optionally an HTML report
  /stats                tokens, cache blocks, speed
  /history              the conversation so far
  /ids [N]              token ids of the last reply (or of the last N tokens)
  /system TEXT          set the system prompt (used from the next /clear)
  /clear                start the conversation over (settings kept)
  /save PATH            save the session (tokens, caches, sampler state)
  /load PATH            load a saved session into the current branch
  /lua                  a Lua REPL with the session as `s` (Ctrl-D comes back)
  /quit                 leave (so does Ctrl-D)
Ctrl-C stops a reply being generated.]]

local COMMANDS = { "/help", "/undo", "/regen", "/fork", "/switch", "/branches", "/sampler", "/set", "/peek", "/inspect",
  "/trace", "/lab", "/stats", "/history", "/ids", "/system", "/clear", "/save", "/load", "/lua", "/quit", "/exit" }

-- Control bytes a model emits must not drive the terminal (escape
-- sequences): they are shown as ^X; newlines and tabs pass.
local function sanitize(text)
  return (text:gsub("[%z\1-\8\11-\31\127]", function(c)
    local b = c:byte()
    return b == 127 and "^?" or ("^" .. string.char(b + 64))
  end))
end

local function history_file()
  local h = os.getenv("TIDE_CHAT_HISTORY")
  if h then return h ~= "" and h or nil end
  if os.getenv("TIDE_HISTORY") == "" then return nil end
  local home = os.getenv("HOME")
  return home and (home .. "/.tide_chat_history") or nil
end

-- "0.7" -> 0.7, "true" -> true, else the text
local function value_of(s)
  if s == "true" or s == "on" then return true end
  if s == "false" or s == "off" then return false end
  local n = tonumber(s)
  if n then return n end
  if s == "inf" then return math.huge end
  if s == "-inf" then return -math.huge end
  return s
end

local function sorted_keys(t)
  local k = {}
  for x in pairs(t) do k[#k + 1] = x end
  table.sort(k, function(a, b) return tostring(a) < tostring(b) end)
  return k
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "chat")
  if #pos > 0 then args.fail("chat: unexpected argument '" .. pos[1] .. "'") end
  local tide = require("tide")
  if o.threads then tide.threads(o.threads) end
  if not o.model then
    local derr
    o.model, derr = tide.default_model()
    if not o.model then args.fail("chat: no --model given and " .. tostring(derr), 1) end
    io.stderr:write("tide chat: using the default model ", o.model, " (--model DIR picks another)\n")
  end
  local ok_le, le = pcall(require, "tide.lineedit")
  if not ok_le then le = nil end
  local interactive = le and le.isatty(0) or false
  -- Ctrl-C is polled between tokens, never raised inside a step
  if le then le.arm_interrupt(false) end
  local out = io.stdout
  local function say(fmt, ...)
    out:write(string.format(fmt, ...), "\n")
    out:flush()
  end
  local function warn(msg)
    if not errors.traceback_wanted() then msg = errors.clean(msg) end
    io.stderr:write(msg, "\n")
    io.stderr:flush()
  end

  local model, err = tide.model(o.model, { max_tokens = math.max(1, math.floor(o.chunk)),
    cache = { context = o.context, max_seqs = 16 } })
  if not model then args.fail("chat: cannot load the model: " .. tostring(err), 1) end
  if not model.tokenizer then args.fail("chat: " .. o.model .. " has no tokenizer.json", 1) end
  local tok = model.tokenizer

  local function write(text)
    out:write(sanitize(text))
    out:flush()
  end
  local function interrupt() return le ~= nil and le.interrupted() end
  local draft = o.draft and o.draft > 0 and { max = o.draft, policy = o.draft_policy } or nil
  local sess_opts = { stream = write, interrupt = interrupt, draft = draft }

  -- the sampler: a file, or the options given (only those that differ from
  -- the defaults are kept, so /set shows what was chosen)
  local sopts = {}
  for k, v in pairs(sampling.options) do
    if k ~= "sampler" and k ~= "seed" and k ~= "trace" and k ~= "n_probs" and o[k] ~= nil and o[k] ~= v.default then
      sopts[k] = o[k]
    end
  end
  local s
  if o.load then
    s, err = tide.session_load(model, o.load, sess_opts)
    if not s then
      args.fail("chat: cannot load the session --load " .. o.load .. ": " .. errors.clean(tostring(err)), 1)
    end
  else
    s, err = model:session{ system = o.system, sampler = o.sampler or sopts, seed = o.seed,
      max_tokens = o.n_predict or o.max_tokens, stop = o.stop, ignore_eos = o.ignore_eos, thinking = o.thinking,
      snapshots = o.snapshots, trace = true, stream = write, interrupt = interrupt, draft = draft }
    if not s then args.fail("chat: " .. tostring(err), 1) end
  end
  local branches, cur = { s }, 1

  local hist = interactive and history_file() or nil
  local function chat_completer(word)
    local res = {}
    if word:sub(1, 1) == "/" then
      for _, c in ipairs(COMMANDS) do
        if c:sub(1, #word) == word then res[#res + 1] = c .. " " end
      end
    end
    return res
  end
  local function setup_lineedit()
    if not (le and interactive) then return end
    le.stifle(2000)
    if hist then le.read_history(hist) end
    le.set_completer(chat_completer)
  end
  setup_lineedit()
  local function readline(prompt)
    if le then return le.readline(prompt) end
    out:write(prompt)
    out:flush()
    return io.read("*l")
  end

  local function reply_done(r)
    if r.finish_reason == "interrupted" then
      write("\n[interrupted]\n")
    elseif r.finish_reason == "error" then
      write("\n[sampling failed: " .. errors.clean(tostring(r.error)) .. "]\n")
    else
      write("\n")
    end
    if le then le.interrupted() end   -- a late Ctrl-C must not cancel the next line
  end

  if interactive then
    say("tide chat | %s | %s | /help for commands, Ctrl-D to leave", o.model, s.sampler:describe())
    if s.loaded then say("loaded %d tokens, %d exchanges (%s)", s:len(), #s.turns, s.loaded) end
  end

  local cmd = {}
  function cmd.help() say("%s", HELP) end
  function cmd.undo()
    local n = s:len()
    if s:undo() then say("[undone: %d tokens dropped, %d left]", n - s:len(), s:len())
    else say("[nothing to undo]") end
  end
  function cmd.regen()
    if #s.turns == 0 then say("[no reply to regenerate]") return end
    reply_done(s:regen())
  end
  function cmd.fork()
    local f, ferr = s:fork()
    if not f then say("[fork failed: %s]", errors.clean(tostring(ferr))) return end
    branches[#branches + 1] = f
    say("[branch %d forked from branch %d at %d tokens; /switch %d goes back]", #branches, cur, f:len(), cur)
    cur, s = #branches, f
  end
  function cmd.switch(a)
    local n = tonumber(a)
    if not n or not branches[n] then say("[no branch %s: /branches lists them]", tostring(a)) return end
    cur, s = n, branches[n]
    say("[branch %d: %d tokens, %d exchanges]", n, s:len(), #s.turns)
  end
  function cmd.branches()
    for i, b in ipairs(branches) do
      local last = b.turns[#b.turns]
      say("%s %d: %d tokens, %d exchanges%s", i == cur and "*" or " ", i, b:len(), #b.turns,
        last and string.format(", last: %q", last.user:sub(1, 40)) or "")
    end
  end
  function cmd.sampler(a)
    if not a or a == "" then say("[sampler: %s]", errors.clean(s.sampler:describe())) return end
    local okk, e = s:set_sampler(a)
    if not okk then say("[sampler not changed: %s]", errors.clean(tostring(e))) return end
    say("[sampler: %s (reloaded when %s changes)]", errors.clean(s.sampler:describe()), a)
  end
  function cmd.set(a)
    if not a or a == "" then
      local st = s:settings()
      say("sampler: %s", st.sampler)
      if st.file then say("  from file %s", st.file) end
      for _, k in ipairs(sorted_keys(st.options or {})) do say("  %s = %s", k, tostring(st.options[k])) end
      say("max_tokens = %s, seed = %s, ignore_eos = %s, thinking = %s", tostring(st.max_tokens),
        string.format("%.0f", st.seed), tostring(st.ignore_eos), tostring(st.thinking))
      return
    end
    local k, v = a:match("^(%S+)%s+(.-)%s*$")
    if not k then say("[usage: /set KEY VALUE]") return end
    local so = sampling.options[k:gsub("%-", "_")]
    local want = so and so.type or (k == "max_tokens" or k == "seed") and "number" or nil
    if want == "number" and type(value_of(v)) ~= "number" then
      say("[/set %s: expected a number, got '%s']", k, v)
      return
    end
    s:set({ [k] = value_of(v) })
    say("[%s = %s; sampler: %s]", k, v, s.sampler:describe())
  end
  function cmd.peek(a)
    local n = tonumber(a) or 10
    for i, p in ipairs(s:peek(n)) do
      say("%3d  %7d  %8.5f  %s", i, p.id, p.p, sanitize(string.format("%q", p.text or "")))
    end
  end
  function cmd.inspect(a)
    local L, T
    for w in (a or ""):gmatch("%S+") do
      local v = tonumber(w)
      if not v then say("[usage: /inspect [LAYER] [TOKEN]]") return end
      if L == nil then L = v else T = v end
    end
    if #s.toks == 0 then say("[nothing to inspect yet]") return end
    local rep, ierr = s:inspect({ layer = L, token = T })
    if not rep then say("[inspect failed: %s]", errors.clean(tostring(ierr))) return end
    say("%s", sanitize(require("tide.inspect").format(rep, { layer = L, tokenizer = tok })))
  end
  function cmd.trace(a)
    local t = s:trace(tonumber(a) or 1)
    if #t == 0 then say("[no trace yet]") return end
    say("%s", sanitize(sampling.format_trace(t, tok)))
  end
  function cmd.lab(a)
    local n, file
    for w in (a or ""):gmatch("%S+") do
      if tonumber(w) then n = tonumber(w) else file = w end
    end
    if #s.toks == 0 then say("[nothing to look at yet: say something first]") return end
    if n and (n < 1 or n ~= math.floor(n)) then say("[usage: /lab [N] [FILE.html]]") return end
    local okl, res = pcall(require("tide.lab").run, s, { steps = n or 4, report = file, quiet = true })
    if not okl then say("[lab failed: %s]", errors.clean(tostring(res))) return end
    say("%s", sanitize(res:format()))
  end
  function cmd.stats()
    local st = s:stats()
    local pool = st.pool
    say("branch %d of %d: %d tokens (%d in the cache), %d exchanges, %d snapshots", cur, #branches, st.tokens,
      st.cached, st.turns, st.snapshots)
    say("cache blocks: %d window blocks, %d compressed pages (snapshots: %d, %d); pool: %d/%d window blocks, "
      .. "%d/%d pages in use, %d/%d sequences", st.swa_blocks, st.pages, st.snapshot_swa_blocks, st.snapshot_pages,
      pool.swa_blocks - pool.swa_free, pool.swa_blocks, pool.pages - pool.pages_free, pool.pages, pool.seqs,
      pool.max_seqs)
    say("prefill: %d tokens, %.1f tokens/s; decode: %d tokens, %.2f tokens/s", st.prefill_tokens,
      st.prefill_tokens_per_s, st.decode_tokens, st.decode_tokens_per_s)
    if st.last then
      say("last reply: %d tokens in %.2f s (%.2f tokens/s), %s", st.last.tokens, st.last.seconds, st.last.tokens_per_s,
        tostring(st.last.finish_reason))
    end
    local sp = st.speculation
    if sp and sp.steps > 0 then
      say("drafts (MTP, up to %d): %d drafted, %d accepted (%.1f%%), %.2f tokens per verify step", sp.max, sp.drafted,
        sp.accepted, 100 * (sp.acceptance or 0), sp.tokens_per_step or 0)
    end
  end
  function cmd.history()
    for _, m in ipairs(s:messages()) do say("%s: %s", m.role, sanitize(m.content)) end
  end
  function cmd.ids(a)
    local ids
    local n = tonumber(a)
    if n then
      ids = {}
      for i = math.max(1, s:len() - n + 1), s:len() do ids[#ids + 1] = s.toks[i] end
    else
      ids = s.last and s.last.tokens or {}
    end
    local parts = {}
    for i, v in ipairs(ids) do parts[i] = tostring(v) end
    say("ids: %s", table.concat(parts, " "))
  end
  function cmd.system(a)
    s.system = (a and a ~= "") and a or nil
    say("[system prompt %s; it applies to a new conversation (/clear)]", s.system and "set" or "cleared")
  end
  function cmd.clear()
    s:truncate(0)
    say("[conversation cleared]")
  end
  function cmd.save(a)
    if not a or a == "" then say("[usage: /save PATH]") return end
    local okk, e = s:save(a)
    if not okk then say("[save failed: %s]", errors.clean(tostring(e))) return end
    say("[saved %d tokens, %d exchanges to %s]", s:len(), #s.turns, a)
  end
  function cmd.load(a)
    if not a or a == "" then say("[usage: /load PATH]") return end
    local ns, e = tide.session_load(model, a, sess_opts)
    if not ns then say("[load failed: %s]", errors.clean(tostring(e))) return end
    s:close()
    branches[cur], s = ns, ns
    say("[loaded %d tokens, %d exchanges from %s (%s)]", s:len(), #s.turns, a, s.loaded)
    if s.warning then say("[note: %s]", s.warning) end
  end
  function cmd.lua()
    local repl = require("tide.repl")
    _G.s, _G.model, _G.branches = s, model, branches
    say("[Lua REPL: `s` is this branch's session, `model` the model, `branches` all branches; "
      .. "Ctrl-D returns to the chat]")
    if le and interactive then le.clear_history() end
    repl.run({ quiet = true })
    if le then le.arm_interrupt(false) end
    if le and interactive then le.clear_history() end
    setup_lineedit()
    -- adopt a session the user made current in Lua (s = s:fork(), ...)
    local ns = rawget(_G, "s")
    if ns ~= s and getmetatable(ns) == require("tide.session").Session and ns.model == model then
      branches[#branches + 1] = ns
      cur, s = #branches, ns
      say("[the session in `s` is now branch %d]", cur)
    end
    say("[back to the chat]")
  end
  cmd.exit = function() return "quit" end
  cmd.quit = cmd.exit

  while true do
    local line = readline("you> ")
    if line == nil then
      if interactive then out:write("\n") end
      break
    end
    if line ~= false then
      if interactive and line:match("%S") then
        le.add_history(line)
        if hist then le.write_history(hist) end
      end
      local name, rest = line:match("^%s*/(%a+)%s*(.-)%s*$")
      if name then
        local f = cmd[name]
        if not f then
          say("[unknown command /%s: /help lists them]", name)
        else
          local okc, res = xpcall(function() return f(rest) end, debug.traceback)
          if not okc then
            local msg = errors.traceback_wanted() and tostring(res) or errors.clean(res)
            warn("[/" .. name .. " failed: " .. msg .. "]")
          elseif res == "quit" then
            break
          end
        end
      elseif line:match("%S") then
        if le then le.interrupted() end
        local okc, res = xpcall(function() return s:say(line) end, debug.traceback)
        if okc then reply_done(res) else
          warn("[error: " .. (errors.traceback_wanted() and tostring(res) or errors.clean(res)) .. "]")
        end
      end
    end
    out:flush()
  end
  for _, b in ipairs(branches) do b:close() end
  model:close()
  return 0
end

return M
