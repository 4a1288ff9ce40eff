-- scripts/run.lua: what `make run` runs. Loads the trained default model
-- (models/tide-tiny-en: DeepSeek-V4's architecture at tiny sizes, trained on
-- the King James Bible and the fortune(6) collections by scripts/train/, in
-- DeepSeek's FP8 / MXFP4 formats; see docs/training.md) and streams a
-- continuation of a prompt with the default sampler: readable (if old-fashioned)
-- English, produced by every path of the engine — tokenizer, paged caches,
-- sliding window, compressed and top-k sparse attention, mHC, MoE, sampler.
--   tide scripts/run.lua [MODEL_DIR] [PROMPT]
-- The random generator (scripts/make_checkpoint.lua) stays for the tests.
local tide = require("tide")

local dir = arg and arg[1]
if not dir then
  local err
  dir, err = tide.default_model()   -- the one place that decides the default model
  if not dir then error("run: " .. tostring(err), 0) end
end
io.stderr:write(string.format("tide %s on %s, %d threads; model %s\n", tide.version, tide.cpu(), tide.threads(), dir))
local prompt = arg and arg[2] or "And it came to pass, when the king heard"
local gen = require("tide.cli.generate")
local rc = gen.run({ "--model", dir, "--prompt", prompt, "--max-tokens", "96", "--seed", "42" })
os.exit(rc or 0)
