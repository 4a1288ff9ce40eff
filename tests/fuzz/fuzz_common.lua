-- fuzz_common: what the Lua fuzz targets share (loaded by lua_harness.c's
-- targets through package.path). Models are generated checkpoints under
-- $TIDE_FUZZ_MODELS, which scripts/fuzz.sh makes: "demo" (tiny layers,
-- DeepSeek's vocabulary and tokenizer) and "tiny" (a 1024-token vocabulary,
-- no tokenizer: small session files).
local M = {}

local models = {}
function M.model(preset)
  preset = preset or "demo"
  if models[preset] then return models[preset] end
  local root = os.getenv("TIDE_FUZZ_MODELS")
  if not root or root == "" then error("fuzz: set TIDE_FUZZ_MODELS (scripts/fuzz.sh does)", 0) end
  local dir = root .. "/" .. preset
  local m, err = require("tide").model(dir, { max_tokens = 64, cache = { context = 256, max_seqs = 4 } })
  if not m then error("fuzz: cannot load " .. dir .. ": " .. tostring(err), 0) end
  models[preset] = m
  return m
end

-- Sampler files are not fuzzed here (a line may name any path, /dev/zero
-- included; reading it is what the user asked for): a named file is refused.
function M.no_sampler_files()
  local sampling = require("tide.sampling")
  sampling.load = function(path) return nil, "sampler files are not fuzzed (" .. tostring(path) .. ")" end
end

-- Synthetic logits for trying a sampler: a fixed row of vocab values.
function M.logits(vocab, seed)
  local t = require("tide").zeros(vocab)
  t:normal(seed or 1, 0, 3)
  return t
end

return M
