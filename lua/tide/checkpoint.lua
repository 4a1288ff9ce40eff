-- tide.checkpoint: checkpoints as DeepSeek publishes them (config.json and
-- safetensors shards), opened lazily with zero-copy tensor views; the
-- config as a Lua table; tide.save and a streaming writer; the helpers
-- scripts/make_checkpoint.lua uses (inventory, random weights, quantisers).
--
--   local ck = assert(tide.load("ckpt/dir"))
--   ck.config.hidden_size, ck:tensor("layers.0.attn.wq_a.weight"), ck:names()
--   tide.save("acts.safetensors", { h = t }, { step = "3" })
local tffi = require("tide.ffi")
local tensor = require("tide.tensor")
local ffi, C, check = tffi.ffi, tffi.C, tffi.check

local M = {}

local Tensor = tensor.Tensor
local ckbox = ffi.new("tide_ckpt*[1]")
local wbox = ffi.new("tide_st_writer*[1]")
local infobox = ffi.new("tide_ckpt_info")
local shardbox = ffi.new("tide_ckpt_shard_info")
local sumbox = ffi.new("tide_ckpt_summary")
local lenbox = ffi.new("int64_t[1]")
local specbox = ffi.new("tide_tensor_spec*[1]")
local i64x4 = ffi.typeof("int64_t[4]")
local Config = ffi.typeof("tide_config")

local cjson_ok, cjson = pcall(require, "cjson")

local function dtype_name(d) return tensor.dtype_name(d) end

local function shape_of(ndim, arr)
  local s = {}
  for i = 0, ndim - 1 do s[i + 1] = tonumber(arr[i]) end
  return s
end

-- ---- the config as a table ----
-- Field names come from the library's own layout table, so a field added
-- to tide_config appears here with no Lua change.
local config_fields
local function fields()
  if config_fields then return config_fields end
  config_fields = {}
  local n = ffi.new("int[1]")
  local rows = C.tide_abi_layout(n)
  for i = 0, n[0] - 1 do
    if ffi.string(rows[i].type) == "tide_config" and rows[i].field ~= nil then
      local f = ffi.string(rows[i].field)
      if f:sub(-1) ~= "_" then config_fields[#config_fields + 1] = f end
    end
  end
  return config_fields
end

-- tide_config (cdata or pointer) -> a plain table with every field.
function M.config_table(cfg)
  local t = {}
  for _, f in ipairs(fields()) do
    local v = cfg[f]
    if type(v) == "cdata" then
      local ty = tostring(ffi.typeof(v))
      if ty:find("char", 1, true) then
        v = ffi.string(v)
      elseif f == "compress_ratios" then
        local list = {}
        for i = 0, cfg.n_compress_ratios - 1 do list[i + 1] = v[i] end
        v = list
      elseif ty:find("%[%d+%]") then
        local list = {}
        for i = 0, tonumber(ty:match("%[(%d+)%]")) - 1 do list[i + 1] = tonumber(v[i]) end
        v = list
      else
        v = tonumber(v)
      end
    end
    t[f] = v
  end
  return t
end

-- Parse config.json text: returns a tide_config cdata and its table, or nil
-- and the message (naming `path`, the field and the expectation).
function M.parse_config(text, path)
  if type(text) ~= "string" then error("parse_config(text): text must be a string", 2) end
  local cfg = Config()
  local rc = C.tide_config_parse(cfg, text, #text, path)
  if rc < 0 then return nil, tffi.last_error() end
  return cfg, M.config_table(cfg)
end

-- The compress ratio of block L (1, 4 or 128; MTP blocks after the main ones).
function M.layer_ratio(cfg, L)
  return check(C.tide_config_layer_ratio(cfg, L), 2)
end

local KIND = { [0] = "weight", "scale", "norm", "embed", "param", "ids" }
local FORMAT = { [0] = "bf16", "fp8", "fp4" }
M.formats = FORMAT

-- Every tensor a config implies: a list of {name, dtype, shape, kind,
-- layer, format, rows, cols} in the fixed inventory order.
function M.inventory(cfg)
  if type(cfg) == "table" then error("inventory(cfg): pass the tide_config cdata (ck.cfg), not the table", 2) end
  check(C.tide_config_inventory(cfg, specbox, lenbox), 2)
  local p = ffi.gc(specbox[0], C.tide_free)
  local out = {}
  for i = 0, tonumber(lenbox[0]) - 1 do
    local s = p[i]
    out[i + 1] = {
      name = ffi.string(s.name), dtype = dtype_name(s.dtype), dtype_id = s.dtype, shape = shape_of(s.ndim, s.shape),
      kind = KIND[s.kind], layer = s.layer, format = FORMAT[s.format], rows = tonumber(s.rows),
      cols = tonumber(s.cols),
    }
  end
  C.tide_free(ffi.gc(p, nil))
  return out
end

-- ---- opened checkpoints ----
local Ckpt = {}
Ckpt.__index = Ckpt

local function handle(self, level)
  local h = self._h
  if h == nil then error("checkpoint " .. tostring(self.path) .. " is closed", (level or 2) + 1) end
  return h
end

local function info_table(ck)
  return {
    name = ffi.string(infobox.name), dtype = dtype_name(infobox.dtype), shape = shape_of(infobox.ndim, infobox.shape),
    shard = ffi.string(infobox.shard), shard_index = infobox.shard_index, offset = tonumber(infobox.offset),
    nbytes = tonumber(infobox.nbytes), checkpoint = ck.path,
  }
end

-- tide.load(path [, opts]): a checkpoint directory (config.json + shards) or
-- one .safetensors file. opts.config = false accepts a directory without
-- config.json; opts.check = false skips checking the tensors against the
-- config. Returns the checkpoint, or nil and a message naming the file, the
-- tensor and the expectation.
function M.load(path, opts)
  if type(path) ~= "string" then error("tide.load(path): path must be a string", 2) end
  if opts ~= nil and type(opts) ~= "table" then error("tide.load(path, opts): opts must be a table", 2) end
  opts = opts or {}
  local flags = 0
  if opts.config == false then flags = flags + C.TIDE_CKPT_CONFIG_OPTIONAL end
  if opts.check == false then flags = flags + C.TIDE_CKPT_NO_MODEL_CHECK end
  local rc = C.tide_ckpt_open(ckbox, path, flags)
  if rc < 0 then return nil, tffi.last_error() end
  local self = setmetatable({ _h = ffi.gc(ckbox[0], C.tide_ckpt_free), path = path }, Ckpt)
  local cfg = C.tide_ckpt_config(self._h)
  if cfg ~= nil then
    self.cfg = Config(cfg[0]) -- a copy: valid after close
    self.config = M.config_table(self.cfg)
  end
  return self
end

-- A read-only zero-copy view of tensor `name` (raises naming the tensor when
-- it is missing). The view keeps the file mapped even after close().
function Ckpt:tensor(name)
  if type(name) ~= "string" then error("ck:tensor(name): name must be a string", 2) end
  local t = Tensor()
  check(C.tide_ckpt_tensor(handle(self), name, t), 2)
  return t
end

function Ckpt:has(name)
  if type(name) ~= "string" then error("ck:has(name): name must be a string", 2) end
  return C.tide_ckpt_find(handle(self), name) >= 0
end

function Ckpt:count() return tonumber(C.tide_ckpt_count(handle(self))) end

-- Every tensor name, in byte order.
function Ckpt:names()
  local h = handle(self)
  local out = {}
  for i = 0, tonumber(C.tide_ckpt_count(h)) - 1 do
    C.tide_ckpt_info_at(h, i, infobox)
    out[i + 1] = ffi.string(infobox.name)
  end
  return out
end

-- {name, dtype, shape, shard, shard_index, offset, nbytes} from the header.
function Ckpt:info(name)
  if type(name) ~= "string" then error("ck:info(name): name must be a string", 2) end
  local h = handle(self)
  local i = C.tide_ckpt_find(h, name)
  if i < 0 then error("tensor '" .. name .. "' not found in " .. self.path, 2) end
  C.tide_ckpt_info_at(h, i, infobox)
  return info_table(self)
end

-- All infos at once (index order), for listings.
function Ckpt:infos()
  local h = handle(self)
  local out = {}
  for i = 0, tonumber(C.tide_ckpt_count(h)) - 1 do
    C.tide_ckpt_info_at(h, i, infobox)
    out[i + 1] = info_table(self)
  end
  return out
end

local function decode_meta(p)
  if p == nil then return {} end
  local s = ffi.string(p)
  if cjson_ok then return cjson.decode(s) end
  local t = {}
  for k, v in s:gmatch('"([^"]*)":"([^"]*)"') do t[k] = v end
  return t
end

-- Shards: a list of {path, file_size, header_bytes, n_tensors, tensor_bytes, metadata}.
function Ckpt:shards()
  local h = handle(self)
  local out = {}
  for i = 0, C.tide_ckpt_shard_count(h) - 1 do
    C.tide_ckpt_shard_at(h, i, shardbox)
    out[i + 1] = {
      path = ffi.string(shardbox.path), file_size = tonumber(shardbox.file_size),
      header_bytes = tonumber(shardbox.header_bytes), n_tensors = tonumber(shardbox.n_tensors),
      tensor_bytes = tonumber(shardbox.tensor_bytes), metadata = decode_meta(shardbox.metadata_json),
    }
  end
  return out
end

-- The __metadata__ of shard i (0-based, default 0) as a table of strings.
function Ckpt:metadata(i)
  local h = handle(self)
  i = i or 0
  if type(i) ~= "number" or i < 0 or i >= C.tide_ckpt_shard_count(h) then
    error("ck:metadata(i): shard index " .. tostring(i) .. " out of range", 2)
  end
  C.tide_ckpt_shard_at(h, i, shardbox)
  return decode_meta(shardbox.metadata_json)
end

-- The raw config.json text (nil without one).
function Ckpt:config_json()
  local p = C.tide_ckpt_config_json(handle(self), lenbox)
  if p == nil then return nil end
  return ffi.string(p, tonumber(lenbox[0]))
end

function Ckpt:layer_ratio(L)
  handle(self)
  if not self.cfg then error("checkpoint has no config", 2) end
  return check(C.tide_config_layer_ratio(self.cfg, L), 2)
end

-- Counts per dtype ({count, elements, bytes} keyed by dtype name) and totals.
function Ckpt:summary()
  check(C.tide_ckpt_summary_get(handle(self), sumbox), 2)
  local by = {}
  for d = 0, 9 do
    if sumbox.count_by_dtype[d] > 0 then
      by[dtype_name(d)] = {
        count = tonumber(sumbox.count_by_dtype[d]), elements = tonumber(sumbox.elements_by_dtype[d]),
        bytes = tonumber(sumbox.bytes_by_dtype[d]),
      }
    end
  end
  return {
    path = self.path, shards = sumbox.n_shards, tensors = tonumber(sumbox.n_tensors),
    bytes = tonumber(sumbox.tensor_bytes), parameters = tonumber(sumbox.parameters),
    index_total_size = tonumber(sumbox.index_total_size), by_dtype = by,
  }
end

-- Fault in the listed tensors' pages (nil = all) with a progress bar on a
-- terminal. opts.progress = true | false | nil (auto).
function Ckpt:prefault(names, opts)
  local h = handle(self)
  local mode = C.TIDE_PROGRESS_AUTO
  if opts and opts.progress == true then mode = C.TIDE_PROGRESS_ALWAYS end
  if opts and opts.progress == false then mode = C.TIDE_PROGRESS_NEVER end
  if names == nil then
    check(C.tide_ckpt_prefault(h, nil, 0, mode), 2)
    return
  end
  local idx = ffi.new("int64_t[?]", #names)
  for i, n in ipairs(names) do
    local k = C.tide_ckpt_find(h, n)
    if k < 0 then error("tensor '" .. tostring(n) .. "' not found in " .. self.path, 2) end
    idx[i - 1] = k
  end
  check(C.tide_ckpt_prefault(h, idx, #names, mode), 2)
end

-- Idempotent; tensors already taken stay valid.
function Ckpt:close()
  local h = self._h
  if h == nil then return end
  self._h = nil
  C.tide_ckpt_free(ffi.gc(h, nil))
end

function Ckpt:__tostring() return require("tide.describe").checkpoint(self) end
function Ckpt:describe() return require("tide.describe").checkpoint_long(self) end

M.Checkpoint = Ckpt

-- ---- writing ----
local Writer = {}
Writer.__index = Writer

local function whandle(self, level)
  if self._h == nil then error("writer for " .. self.path .. " is closed", (level or 2) + 1) end
  return self._h
end

-- A streaming writer (see tide_st_writer in checkpoint.h): declare every
-- tensor, write each once, finish. Returns nil, message if the file cannot
-- be created.
function M.writer(path)
  if type(path) ~= "string" then error("writer(path): path must be a string", 2) end
  local rc = C.tide_st_writer_new(wbox, path)
  if rc < 0 then return nil, tffi.last_error() end
  return setmetatable({ _h = ffi.gc(wbox[0], C.tide_st_writer_free), path = path }, Writer)
end

function Writer:meta(key, value)
  check(C.tide_st_writer_meta(whandle(self), tostring(key), tostring(value)), 2)
end

function Writer:declare(name, dtype, shape)
  local sh = i64x4()
  for i, v in ipairs(shape) do sh[i - 1] = v end
  check(C.tide_st_writer_declare(whandle(self), name, tensor.dtype_id(dtype, 2), #shape, sh), 2)
end

-- Writes may fail for I/O reasons: nil, message; a bad tensor raises.
function Writer:write(name, t)
  if not tensor.is_tensor(t) then error("writer:write(name, t): t must be a tensor", 2) end
  local rc = C.tide_st_writer_write(whandle(self), name, t)
  if rc == C.TIDE_E_IO then return nil, tffi.last_error() end
  check(rc, 2)
  return true
end

function Writer:bytes() return tonumber(C.tide_st_writer_data_bytes(whandle(self))) end

function Writer:finish(header_only)
  local rc = C.tide_st_writer_finish(whandle(self), header_only and 1 or 0)
  self:close()
  if rc == C.TIDE_E_IO then return nil, tffi.last_error() end
  check(rc, 2)
  return true
end

function Writer:close()
  local h = self._h
  if h == nil then return end
  self._h = nil
  C.tide_st_writer_free(ffi.gc(h, nil))
end

-- tide.save(path, tensors, metadata): write a safetensors file. `tensors` maps
-- names to tensors (any dtype, any strides); metadata maps strings to
-- strings. The data is laid out as Hugging Face's writer does (dtype, then
-- name). Returns true, or nil and a message on an I/O failure.
function M.save(path, tensors, metadata)
  if type(path) ~= "string" then error("tide.save(path, tensors): path must be a string", 2) end
  if type(tensors) ~= "table" then error("tide.save(path, tensors): tensors must be a table name -> tensor", 2) end
  if metadata ~= nil and type(metadata) ~= "table" then error("tide.save: metadata must be a table", 2) end
  local names = {}
  for k, v in pairs(tensors) do
    if type(k) ~= "string" then error("tide.save: tensor names must be strings, got " .. type(k), 2) end
    if not tensor.is_tensor(v) then error("tide.save: '" .. k .. "' is not a tensor", 2) end
    names[#names + 1] = k
  end
  table.sort(names)
  local w, err = M.writer(path)
  if not w then return nil, err end
  local ok, res, msg = pcall(function()
    if metadata then
      local keys = {}
      for k in pairs(metadata) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      for _, k in ipairs(keys) do w:meta(k, metadata[k]) end
    end
    for _, n in ipairs(names) do
      local t = tensors[n]
      w:declare(n, t.dtype, t:shape())
    end
    for _, n in ipairs(names) do
      local r, e = w:write(n, tensors[n])
      if not r then return nil, e end
    end
    return w:finish(false)
  end)
  w:close()
  if not ok then error(res, 2) end
  return res, msg
end

-- ---- generator helpers ----
-- A per-tensor seed (a uint64 cdata) from a checkpoint seed and a name.
function M.seed(seed, name) return C.tide_ckpt_seed(seed, name) end

-- Fill t (and its scale companion for FP8 / MXFP4) with random weights of
-- standard deviation `std` around `mean`.
function M.gen_weight(t, scale, seed, mean, std)
  check(C.tide_ckpt_gen_weight(t, scale, seed, mean or 0, std or 1), 2)
  return t
end

-- Rows of k distinct ids in [0, n_values).
function M.gen_ids(t, seed, n_values)
  check(C.tide_ckpt_gen_ids(t, seed, n_values), 2)
  return t
end

-- f32 [n, k] -> f8e4m3 [n, k] and e8m0 [ceil(n/128), ceil(k/128)].
function M.quant_fp8(x)
  local n, k = x:size(0), x:size(1)
  local q = tensor.zeros(n, k, "f8e4m3")
  local s = tensor.zeros(math.ceil(n / 128), math.ceil(k / 128), "e8m0")
  check(C.tide_ckpt_quant_fp8(q, s, x), 2)
  return q, s
end

-- f32 [n, k] -> i8 [n, k/2] (e2m1 pairs) and e8m0 [n, k/32].
function M.quant_mxfp4(x)
  local n, k = x:size(0), x:size(1)
  local q = tensor.zeros(n, math.floor(k / 2), "i8")
  local s = tensor.zeros(n, math.floor(k / 32), "e8m0")
  check(C.tide_ckpt_quant_mxfp4(q, s, x), 2)
  return q, s
end

return M
