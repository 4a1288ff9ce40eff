-- tide sample: the sampler lab. With a model (--model DIR, or the default
-- model when --prompt or --tokens is given) it shows how each stage of one
-- or two chains reshapes the next-token distribution of a prompt: bars of
-- the top candidates before the chain and after every stage, then the
-- tokens each chain generates from the same logits and seed (probability,
-- rank under the model, entropy), and with --report FILE.html the same as
-- pictures, plus the attention shares and expert load (tide.lab).
-- Without a model it runs a sampler on synthetic logits: step i draws from
-- randn(V) * sigma with seed logits-seed + i, so runs are reproducible.
local args = require("tide.cli.args")
local sampling = require("tide.sampling")

local spec = {
  model = { type = "string", meta = "DIR", help = "checkpoint directory (lab mode; default: the default model)" },
  prompt = { type = "string", meta = "TEXT", help = "lab mode: the prompt (the model's tokenizer)" },
  tokens = { type = "string", meta = "IDS", help = "lab mode: the prompt as token ids" },
  chat = { type = "boolean", help = "lab mode: wrap the prompt in the chat template (a user turn)" },
  vs = { type = "string", meta = "FILE", help = "lab mode: a second sampler file, run from the same logits and seed" },
  report = { type = "string", meta = "FILE.html", help = "lab mode: write an HTML report with pictures" },
  top = { type = "number", default = 8, integer = true, min = 1, meta = "N", help = "lab mode: candidates shown" },
  all_steps = { type = "boolean", help = "lab mode: bars for every step, not only the first" },
  vocab = { type = "number", default = 129280, integer = true, min = 1, meta = "V",
    help = "synthetic mode: vocabulary size of the synthetic logits" },
  n = { type = "number", default = 8, integer = true, min = 1, help = "tokens to sample" },
  sigma = { type = "number", default = 3, help = "synthetic mode: std of the logits (larger = more peaked)" },
  logits_seed = { type = "number", default = 1, help = "synthetic mode: seed of the synthetic logits" },
  delay = { type = "number", default = 0, min = 0, meta = "MS",
    help = "synthetic mode: pause between tokens (to edit a --sampler file meanwhile)" },
}
for k, v in pairs(sampling.options) do if not spec[k] then spec[k] = v end end

local M = {
  summary = "the sampler lab: see each stage reshape the next-token distribution",
  usage = "usage: tide sample [--model DIR] (--prompt TEXT | --tokens IDS) [--sampler A.lua | sampling options]\n"
    .. "                   [--vs B.lua] [--n N] [--top N] [--seed S] [--report FILE.html]\n"
    .. "       tide sample [--vocab V] [--n N] [--sigma S] [sampling options | --sampler FILE] [--trace]\n"
    .. "                   (no model: synthetic logits)\n" .. args.help(spec),
}

local function lab_mode(o)
  local tide = require("tide")
  if (o.prompt == nil) == (o.tokens == nil) then
    args.fail("sample: give exactly one of --prompt TEXT or --tokens IDS")
  end
  if not o.model then
    local derr
    o.model, derr = tide.default_model()
    if not o.model then args.fail("sample: no --model given and " .. tostring(derr), 1) end
    io.stderr:write("tide sample: using the default model ", o.model, " (--model DIR picks another)\n")
  end
  local model, err = tide.model(o.model, { max_tokens = 512, cache = { context = 4096, max_seqs = 8, seq_budget = 3 } })
  if not model then args.fail("sample: cannot load the model: " .. tostring(err), 1) end
  local prompt = o.prompt
  if o.tokens then
    prompt = {}
    for w in o.tokens:gmatch("[^,%s]+") do
      local v = tonumber(w)
      if not v or v ~= math.floor(v) then
        args.fail("sample: '" .. w .. "' in --tokens is not a token id (expected whole numbers)")
      end
      if v < 0 or v >= model.vocab_size then
        args.fail(string.format("sample: token id %d in --tokens is outside the vocabulary of %s (0..%d)", v, o.model,
          model.vocab_size - 1))
      end
      prompt[#prompt + 1] = v
    end
    if #prompt == 0 then args.fail("sample: --tokens is empty") end
  elseif not model.tokenizer then
    args.fail("sample: " .. o.model .. " has no tokenizer.json; give the prompt with --tokens", 1)
  end
  if #prompt == 0 then args.fail("sample: the prompt is empty") end
  local a, aerr = sampling.from_options(o, { tokenizer = model.tokenizer })
  if not a then args.fail("sample: " .. tostring(aerr), 1) end
  local b
  if o.vs then
    local berr
    b, berr = sampling.load(o.vs)
    if not b then args.fail("sample: --vs: " .. tostring(berr), 1) end
  end
  local seed = o.seed
  if seed == nil or seed == -1 then seed = 1 end
  local ok, res = pcall(require("tide.lab").run, model, { prompt = prompt, chat = o.chat, sampler = a, vs = b,
    seed = seed, steps = o.n, top = o.top, report = o.report, quiet = true })
  if not ok then args.fail("sample: " .. require("tide.errors").clean(res):gsub("^lab: ", ""), 1) end
  io.write(res:format({ all_steps = o.all_steps }), "\n")
  model:close()
  return 0
end

function M.run(argv)
  local o, pos = args.parse(argv, spec, "sample")
  if #pos > 0 then args.fail("sample: unexpected argument '" .. pos[1] .. "'") end
  if o.model or o.prompt or o.tokens then return lab_mode(o) end
  if o.vs or o.report then args.fail("sample: --vs and --report need a prompt (--prompt TEXT or --tokens IDS)") end
  local tide = require("tide")
  local s, err = sampling.from_options(o)
  if not s then args.fail("sample: " .. tostring(err), 1) end
  local so = sampling.state_options(o)
  local st = s:new_state(so)
  io.write("sampler: ", require("tide.errors").clean(s:describe()), "\nseed: ", string.format("%.0f", st.seed), "\n")
  local logits = tide.zeros(o.vocab)
  for i = 0, o.n - 1 do
    logits:normal(o.logits_seed + i, 0, o.sigma)
    local tok, info = st:sample(logits)
    if not tok then
      io.write(i, "\terror\t", require("tide.errors").clean(info), "\n")
      return 1
    end
    st:accept(tok)
    local line = string.format("%d\t%d\tp %.4f", i, tok, info.p or 0 / 0)
    if info.raw_logprob then
      line = line .. string.format("\traw %.4f\tsampled %.4f", info.raw_logprob, info.sampled_logprob)
    end
    io.write(line, "\n")
    io.stdout:flush()
    if o.delay > 0 then
      local ffi = require("ffi")
      if not pcall(ffi.typeof, "struct tide_sample_ts") then
        ffi.cdef("struct tide_sample_ts { long s; long ns; }; int nanosleep(const struct tide_sample_ts *, void *);")
      end
      local ts = ffi.new("struct tide_sample_ts", math.floor(o.delay / 1000), (o.delay % 1000) * 1000000)
      ffi.C.nanosleep(ts, nil)
    end
  end
  if o.trace then io.write(sampling.format_trace(st:trace()), "\n") end
  return 0
end

return M
