-- fuzz_sampler: sampler option strings, as `tide generate/batch/sample`
-- take them: the input is split at whitespace into command-line words,
-- parsed against the sampling options, built into a chain, and the chain
-- samples three tokens from synthetic logits. An option refused (a user
-- error, or an error from the chain) is fine; a crash, an abort or a token
-- outside the vocabulary is not.
local common = require("fuzz_common")
local sampling = require("tide.sampling")
local args = require("tide.cli.args")
common.no_sampler_files()
local VOCAB = 512
local rows = { common.logits(VOCAB, 1), common.logits(VOCAB, 2), common.logits(VOCAB, 3) }

return function(data)
  local argv = {}
  for w in data:gmatch("%S+") do argv[#argv + 1] = w end
  local o = args.parse(argv, sampling.options, "fuzz")
  local s, err = sampling.from_options(o)
  if not s then error(err, 0) end
  local so = sampling.state_options(o)
  if so.seed == -1 then so.seed = 7 end
  local st = s:new_state(so)
  for i = 1, #rows do
    local tok, info = st:sample(rows[i])
    if not tok then error(info, 0) end
    if tok ~= math.floor(tok) or tok < 0 or tok >= VOCAB then
      fuzz_fail("token " .. tostring(tok) .. " from " .. s:describe())
    end
    st:accept(tok)
  end
  st:close()
end
