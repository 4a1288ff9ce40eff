-- tide sample: run a sampler on synthetic logits, no model needed: try a
-- chain from the command line flags or a sampler file, see the tokens,
-- their logprobs and the per-stage trace. Step i draws from randn(V) *
-- sigma with seed logits-seed + i, so runs are reproducible.
local args = require("tide.cli.args")
local sampling = require("tide.sampling")

local spec = {
  vocab = { type = "number", default = 129280, meta = "V", help = "vocabulary size of the synthetic logits" },
  n = { type = "number", default = 8, help = "tokens to sample" },
  sigma = { type = "number", default = 3, help = "std of the synthetic logits (larger = more peaked)" },
  logits_seed = { type = "number", default = 1, help = "seed of the synthetic logits" },
  delay = { type = "number", default = 0, meta = "MS",
    help = "pause between tokens (to edit a --sampler file meanwhile)" },
}
for k, v in pairs(sampling.options) do spec[k] = v end

local M = {
  summary = "try a sampler on synthetic logits",
  usage = "usage: tide sample [--vocab V] [--n N] [--sigma S] [sampling options | --sampler FILE]\n" .. args.help(spec),
}

function M.run(argv)
  local o, pos = args.parse(argv, spec, "sample")
  if #pos > 0 then args.fail("sample: unexpected argument '" .. pos[1] .. "'") end
  if o.vocab < 1 or o.vocab % 1 ~= 0 then args.fail("sample: --vocab must be a positive integer") end
  local tide = require("tide")
  local s, err = sampling.from_options(o)
  if not s then args.fail("sample: " .. tostring(err), 1) end
  local so = sampling.state_options(o)
  local st = s:new_state(so)
  io.write("sampler: ", s:describe(), "\nseed: ", string.format("%.0f", st.seed), "\n")
  local logits = tide.zeros(o.vocab)
  for i = 0, o.n - 1 do
    logits:normal(o.logits_seed + i, 0, o.sigma)
    local tok, info = st:sample(logits)
    if not tok then
      io.write(i, "\terror\t", info, "\n")
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
