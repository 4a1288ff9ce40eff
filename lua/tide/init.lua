-- tide: the Lua entry point. `local tide = require "tide"` gives tensors,
-- threads and allocation counters at once; the larger subsystems (model
-- loading, tokenizer, sampling, engine, sessions) load on first use.
local tffi = require("tide.ffi")
local tensor = require("tide.tensor")
local ffi, C = tffi.ffi, tffi.C

local tide = {}
tide.ffi = tffi
tide.C = C
tide.version = ffi.string(C.tide_version())

-- tensors
for _, k in ipairs({ "zeros", "empty", "ones", "full", "randn", "rand", "arange", "tensor", "from_pointer",
  "mmap", "is_tensor", "linear", "matmul", "manual_seed", "dtypes", "dtype_name", "format" }) do
  tide[k] = tensor[k]
end
tide.Tensor = tensor.Tensor

-- threads: tide.threads() -> n; tide.threads(n) sets and returns n
function tide.threads(n)
  if n ~= nil then
    if type(n) ~= "number" then error("threads(n): n must be a number", 2) end
    return C.tide_threads_set(n)
  end
  return C.tide_threads_get()
end

local statsbox = ffi.new("tide_alloc_stats")
-- live allocation counters (tests check they return to zero)
function tide.alloc_stats()
  C.tide_alloc_stats_get(statsbox)
  return {
    live_allocs = tonumber(statsbox.live_allocs), live_bytes = tonumber(statsbox.live_bytes),
    total_allocs = tonumber(statsbox.total_allocs), peak_bytes = tonumber(statsbox.peak_bytes),
    live_storages = tonumber(statsbox.live_storages), live_maps = tonumber(statsbox.live_maps),
    mapped_bytes = tonumber(statsbox.mapped_bytes),
  }
end

function tide.time() return C.tide_time() end
function tide.cpu() return ffi.string(C.tide_cpu_features()) end
-- tide.reference_kernels(true) forces every dispatched kernel to its scalar
-- reference (same as TIDE_REF=1); returns the previous setting.
function tide.reference_kernels(on) return C.tide_kernels_force_ref(on and 1 or 0) == 1 end
function tide.last_error() return tffi.last_error() end

function tide.help() print(require("tide.repl").help_text()) end

-- The model every entry point uses when none is given (`make run`, tide.model(),
-- tide chat, tide generate, tide serve): $TIDE_MODEL when set, else the
-- trained models/tide-tiny-en that ships in the tree, else build/models/demo,
-- generated on first use by scripts/make_checkpoint.lua (DeepSeek-V4 wiring
-- at tiny sizes, DeepSeek's real tokenizer, random weights). The one place
-- that decides it. Returns the directory, or nil, message when it cannot be made.
function tide.default_model(opts)
  opts = opts or {}
  local env = os.getenv("TIDE_MODEL")
  if env and env ~= "" then return env end
  local exe = rawget(_G, "_TIDE_EXE")
  local lua_dir = exe and exe.lua_dir or (debug.getinfo(1, "S").source:sub(2):match("^(.*)/tide/[^/]*$") or "lua")
  local root = lua_dir:match("^(.*)/lua/?$") or "."
  -- the trained model that ships in the tree (docs/training.md), else the
  -- random demo model, generated once
  local trained = root .. "/models/tide-tiny-en"
  local f = io.open(trained .. "/config.json", "rb")
  if f then f:close() return trained end
  local dir = root .. "/build/models/demo"
  f = io.open(dir .. "/config.json", "rb")
  if f then f:close() return dir end
  if opts.generate == false then return nil, "the default model " .. dir .. " has not been generated yet" end
  io.stderr:write("tide: generating the default model in " .. dir .. " (once)\n")
  local mk, lerr = loadfile(root .. "/scripts/make_checkpoint.lua")
  if not mk then return nil, "cannot generate the default model: " .. tostring(lerr) end
  local saved = rawget(_G, "arg")
  _G.arg = { [0] = root .. "/scripts/make_checkpoint.lua", "--preset", "demo", "--out", dir, "--quiet" }
  local ok, err = pcall(mk)
  _G.arg = saved
  if not ok then return nil, "cannot generate the default model: " .. tostring(err) end
  return dir
end

-- Subsystems loaded on first use: tide.<name> -> require(module)[field].
local lazy = {
  load = { "tide.checkpoint", "load" },
  save = { "tide.checkpoint", "save" },
  checkpoint = { "tide.checkpoint" },
  tokenizer = { "tide.tokenizer", "new" },
  sampling = { "tide.sampling" },
  generation = { "tide.generation" },
  model = { "tide.model" },
  engine = { "tide.engine", "new" },
  session_load = { "tide.session", "load" },
  session = { "tide.session" },
  inspect = { "tide.inspect" },
  attn = { "tide.attn" },
  ops = { "tide.ops" },
  quant = { "tide.quant" },
  chat = { "tide.chat" },
  describe = { "tide.describe", "long" },
  lab = { "tide.lab" },
}
tide._lazy = lazy

setmetatable(tide, {
  __index = function(t, k)
    local spec = lazy[k]
    if not spec then return nil end
    local mod = require(spec[1])
    local v = spec[2] and mod[spec[2]] or mod
    rawset(t, k, v)
    return v
  end,
})

return tide
