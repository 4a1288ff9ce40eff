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

function tide.help()
  print([[
tide: a CPU inference engine for DeepSeek-V4-class models, driven from LuaJIT.
Tensors (0-based indices, like the C core):
  t = tide.zeros(2, 3)            tide.tensor({{1, 2}, {3, 4}}, "bf16")
  tide.randn({4, 4}, {seed = 1})  t:shape()  #t  t[i][j]  t:narrow(d, start, len)
  t:to("bf16")  t:argmax()  t:topk(5)  t:softmax()  a + b  tide.matmul(a, b)
Threads:  tide.threads(), tide.threads(2)
Memory:   tide.alloc_stats()
Commands: run `tide help` in a shell for the subcommands.]])
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
