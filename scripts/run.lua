-- scripts/run.lua: what `make run` runs. Loads the default model
-- (tide.default_model(); today build/models/demo: DeepSeek-V4 layer wiring at tiny sizes with DeepSeek's
-- real 129,280-token vocabulary and tokenizer; generated on first run by
-- scripts/make_checkpoint.lua, deterministic, random weights) and streams a
-- generation with the default sampler. Random weights give random text: the
-- point is the whole path — tokenizer, chat template, paged caches, sparse
-- attention, MoE, sampler — running end to end.
--   tide scripts/run.lua [MODEL_DIR] [PROMPT]
local tide = require("tide")

local dir = arg and arg[1]
if not dir then
  local err
  dir, err = tide.default_model()   -- the one place that decides the default model
  if not dir then error("run: " .. tostring(err), 0) end
end
io.stderr:write(string.format("tide %s on %s, %d threads; model %s\n", tide.version, tide.cpu(), tide.threads(), dir))
local prompt = arg and arg[2] or "Write a haiku about the sea."
local gen = require("tide.cli.generate")
local rc = gen.run({ "--model", dir, "--prompt", prompt, "--chat", "--max-tokens", "48", "--seed", "42" })
os.exit(rc or 0)
