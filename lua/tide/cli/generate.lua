-- tide generate: stream a continuation of a prompt. Text when the model
-- directory has a tokenizer, token ids otherwise; prefill and decode tokens/s
-- on stderr. Sampling flags follow llama.cpp's names (tide.sampling.options),
-- or --sampler FILE (a Lua chain, reloaded when the file changes).
local args = require("tide.cli.args")
local sampling = require("tide.sampling")

local spec = {
  model = { type = "string", meta = "DIR", help = "checkpoint directory (default: the default model, as `make run`)" },
  prompt = { type = "string", meta = "TEXT", help = "the prompt (encoded with the model's tokenizer, BOS first)" },
  tokens = { type = "string", meta = "IDS", help = "the prompt as token ids, comma or space separated" },
  max_tokens = { type = "number", meta = "N", default = 128, integer = true, min = 1,
    why_min = "the most tokens to generate; there is no unlimited setting", help = "tokens to generate at most" },
  n_predict = { type = "number", meta = "N", integer = true, min = 1,
    why_min = "the most tokens to generate; there is no unlimited setting", help = "same as --max-tokens" },
  stop = { type = "list", meta = "S", help = "stop string (repeatable); not printed" },
  ignore_eos = { type = "boolean", help = "do not stop at the end-of-sentence token" },
  chat = { type = "boolean", help = "wrap the prompt in the chat template (a user turn) first" },
  system = { type = "string", meta = "TEXT", help = "system prompt (with --chat)" },
  thinking = { type = "boolean", help = "with --chat on a v3.1-style template: open the reply with <think>" },
  threads = { type = "number", meta = "N", integer = true, min = 0, help = "OpenMP threads (0: all cores)" },
  chunk = { type = "number", meta = "N", default = 256, integer = true, min = 1, help = "prefill tokens per step" },
  ids = { type = "boolean", help = "print token ids even when there is a tokenizer" },
  draft = { type = "number", meta = "N", integer = true, min = 0, help = "speculative decoding: the MTP block "
    .. "drafts up to N tokens per step; same output as without (docs/speculative.md)" },
  draft_policy = { type = "string", meta = "NAME", help = "with --draft: how many tokens to draft per step, "
    .. "fixed (always N, the default) or adaptive (on the acceptance rate)" },
  show_logprobs = { type = "boolean", help = "after the text, print each token with its raw and sampled logprobs" },
}
for k, v in pairs(sampling.options) do if not spec[k] then spec[k] = v end end

local M = {
  summary = "generate a continuation of a prompt",
  usage = "usage: tide generate [--model DIR] (--prompt TEXT | --tokens IDS) [--max-tokens N] [--seed S]\n"
    .. "                     [sampling options | --sampler FILE] [--chat [--system TEXT]]\n" .. args.help(spec),
}

local function parse_ids(s)
  local ids = {}
  for w in s:gmatch("[^,%s]+") do
    local v = tonumber(w)
    if not v or v ~= math.floor(v) then
      args.fail("generate: '" .. w .. "' in --tokens is not a token id "
        .. "(expected whole numbers separated by commas or spaces)")
    end
    ids[#ids + 1] = v
  end
  if #ids == 0 then args.fail("generate: --tokens is empty") end
  return ids
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "generate")
  if #pos > 0 then args.fail("generate: unexpected argument '" .. pos[1] .. "'") end
  if (o.prompt == nil) == (o.tokens == nil) then
    args.fail("generate: give exactly one of --prompt TEXT or --tokens IDS")
  end
  local tide = require("tide")
  if o.threads then tide.threads(o.threads) end
  if not o.model then
    local derr
    o.model, derr = tide.default_model()
    if not o.model then args.fail("generate: no --model given and " .. tostring(derr), 1) end
    io.stderr:write("tide generate: using the default model ", o.model, " (--model DIR picks another)\n")
  end
  local max_new = o.n_predict or o.max_tokens
  local chunk = math.max(1, math.floor(o.chunk))
  -- a small probe of the prompt length decides the cache size
  local model, err = tide.model(o.model, { max_tokens = chunk,
    cache = { context = 4096, max_seqs = 2, seq_budget = 1 }, tokenizer = true })
  if not model then args.fail("cannot load the model: " .. tostring(err), 1) end
  local tok = model.tokenizer
  local ids
  if o.tokens then
    ids = parse_ids(o.tokens)
    for i, id in ipairs(ids) do
      if id < 0 or id >= model.vocab_size then
        args.fail(string.format("generate: token id %d (number %d in --tokens) is outside the vocabulary of %s (0..%d)",
          id, i, o.model, model.vocab_size - 1))
      end
    end
  else
    if not tok then args.fail("generate: " .. o.model .. " has no tokenizer.json; use --tokens", 1) end
    if o.chat then
      local msgs = {}
      if o.system then msgs[#msgs + 1] = { role = "system", content = o.system } end
      msgs[#msgs + 1] = { role = "user", content = o.prompt }
      ids = require("tide.chat").encode(tok, msgs, { add_generation_prompt = true, thinking = o.thinking })
    else
      ids = tok:encode(o.prompt)
    end
  end
  local need = #ids + max_new
  if need > 4096 then
    model:close()
    model, err = tide.model(o.model, { max_tokens = chunk, cache = { context = need, max_seqs = 2, seq_budget = 1 } })
    if not model then args.fail("cannot load the model: " .. tostring(err), 1) end
    tok = model.tokenizer
  end
  local sampler, serr = sampling.from_options(o, { tokenizer = tok })
  if not sampler then args.fail("generate: " .. tostring(serr), 1) end
  local gopts = require("tide.generation").options_to_new(o, sampler, (not o.ids) and tok or nil)
  gopts.max_tokens = max_new
  if not tok or o.ids then
    gopts.detokenize = function(id) return id .. " " end
    gopts.stop_tokens = { model.config.eos_token_id }
    if o.stop and #o.stop > 0 and not tok then args.fail("generate: --stop needs a tokenizer") end
  end
  local gen = require("tide.generation").new(gopts)
  gen:prompt(ids)
  local seq = assert(model:sequence())
  local t0 = tide.time()
  local t1
  local n = 0
  local sst
  if o.draft and o.draft > 0 then
    -- speculative: the MTP block drafts, the main model verifies; the sampler chain picks every
    -- committed token from the main model's row, once per token and in order, so the output is the
    -- same as without --draft for any sampler and seed
    local policy
    if o.draft_policy then
      local okp, pol = pcall(require, "tide.scheduler.draft." .. o.draft_policy)
      if not okp or type(pol) ~= "table" then
        args.fail("generate: --draft-policy " .. o.draft_policy .. ": no such policy (fixed, adaptive)")
      end
      policy = pol
    end
    local d, derr = require("tide.models.deepseek_v4_mtp").new(model)
    if not d then args.fail("generate: --draft: " .. tostring(derr), 1) end
    local ok, res, st = pcall(d.greedy, d, ids, max_new, o.draft, { seq = seq, policy = policy, pick = function(r)
      t1 = t1 or tide.time()
      local id, text, reason = gen:step(r)
      if text and text ~= "" then io.write(text); io.stdout:flush() end
      if id == nil then return nil end
      n = n + 1
      return id, reason ~= nil
    end })
    if not ok then args.fail("generate: " .. tostring(res), 1) end
    sst = st
  end
  local row
  if not sst then
    local ok
    ok, row = pcall(model.prefill, model, seq, ids, { chunk = chunk })
    if not ok then args.fail("generate: " .. tostring(row), 1) end
    t1 = tide.time()
  end
  while not sst do
    local id, text, reason = gen:step(row)
    if text and text ~= "" then io.write(text); io.stdout:flush() end
    if id == nil then break end
    n = n + 1
    if reason then break end
    local res, serr2 = model:step({ { seq = seq, tokens = { id }, logits = "last" } })
    if not res then io.stderr:write("\ntide generate: ", require("tide.errors").clean(tostring(serr2)), "\n") break end
    row = res[1]
  end
  local t2 = tide.time()
  io.write("\n")
  if gen.finish_reason == "error" then
    io.stderr:write("tide generate: ", require("tide.errors").clean(tostring(gen.error)), "\n")
    return 1
  end
  if o.show_logprobs and gen.logprobs then
    for i, e in ipairs(gen.logprobs) do
      io.write(string.format("%d\t%d\t%q\traw %.4f\tsampled %.4f\n", i - 1, e.token, e.text or "",
        e.raw_logprob or 0 / 0, e.sampled_logprob or 0 / 0))
    end
  end
  local pre = t1 - t0
  local dec = t2 - t1
  io.stderr:write(string.format("prefill: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s "
    .. "(%.2f tokens/s); finish: %s\n", #ids, pre, #ids / math.max(pre, 1e-9), n, dec,
    n / math.max(dec, 1e-9), tostring(gen.finish_reason)))
  if sst then
    io.stderr:write(string.format("draft: %d steps, %.2f tokens/step, %d drafted, %d accepted (%.1f%%)\n",
      sst.steps, n / math.max(sst.steps, 1), sst.drafted, sst.accepted,
      100 * sst.accepted / math.max(sst.drafted, 1)))
  end
  seq:free()
  model:close()
  return 0
end

return M
