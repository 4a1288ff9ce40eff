-- scripts/run.lua: what `make run` runs. Loads the built-in default model
-- (build/models/demo: DeepSeek-V4 layer wiring at tiny sizes with DeepSeek's
-- real 129,280-token vocabulary and tokenizer; generated on first run by
-- scripts/make_checkpoint.lua, deterministic, random weights) and streams a
-- generation with the default sampler. Random weights give random text: the
-- point is the whole path — tokenizer, chat template, paged caches, sparse
-- attention, MoE, sampler — running end to end.
--   tide scripts/run.lua [MODEL_DIR] [PROMPT]
local tide = require("tide")

local root = (arg and arg[0] and arg[0]:match("^(.*)/scripts/[^/]*$")) or "."
local dir = arg and arg[1] or (root .. "/build/models/demo")

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

if not exists(dir .. "/config.json") then
  io.stderr:write("run: generating the default model in " .. dir .. " (once)\n")
  local mk = assert(loadfile(root .. "/scripts/make_checkpoint.lua"))
  local saved = arg
  _G.arg = { [0] = root .. "/scripts/make_checkpoint.lua", "--preset", "demo", "--out", dir, "--quiet" }
  local ok, err = pcall(mk)
  _G.arg = saved
  if not ok then error("run: could not generate the default model: " .. tostring(err), 0) end
end

io.stderr:write(string.format("tide %s on %s, %d threads; model %s\n", tide.version, tide.cpu(), tide.threads(), dir))
local prompt = arg and arg[2] or "Write a haiku about the sea."
local gen = require("tide.cli.generate")
local rc = gen.run({ "--model", dir, "--prompt", prompt, "--chat", "--max-tokens", "48", "--seed", "42" })
os.exit(rc or 0)
