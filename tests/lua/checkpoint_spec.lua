-- checkpoint_spec: tide.load / tide.save and the checkpoint object from Lua,
-- scripts/make_checkpoint.lua (presets, variants, --set, sharding,
-- determinism, the tokenizer copy), `tide inspect`, bad input (nil,
-- message naming the file and tensor), misuse (raises) and leaks.
local tide = require("tide")
local ffi = require("ffi")
local ck_mod = require("tide.checkpoint")

local ROOT = os.getenv("TIDE_SOURCE_DIR") or "."
local BUILD = os.getenv("TIDE_BUILD_DIR") or (ROOT .. "/build")
local EXE = os.getenv("TIDE_EXE") or (BUILD .. "/tide")
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/ckspec_" .. tostring(os.time()) .. "_"
  .. tostring(math.random(1e6))

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.-)rc=(%d+)\n$")
  return body, tonumber(rc)
end

local function make(out, ...)
  local a = { q(EXE), q(ROOT .. "/scripts/make_checkpoint.lua"), "--quiet", "--out", q(out) }
  for _, x in ipairs({ ... }) do a[#a + 1] = q(x) end
  return sh(table.concat(a, " "))
end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function bytes_of(t) return ffi.string(t.data, t:nbytes()) end

local TINY = TMP .. "/tiny"
local BF16 = TMP .. "/tiny_bf16"

describe("checkpoints", function()
  setup(function()
    sh("mkdir -p " .. q(TMP))
    local out, rc = make(TINY, "--preset", "tiny")
    assert.equals(0, rc, out)
    out, rc = make(BF16, "--preset", "tiny", "--variant", "bf16", "--set", "index_topk=16",
      "--set", "rope_scaling.factor=8")
    assert.equals(0, rc, out)
  end)

  teardown(function()
    sh("rm -rf " .. q(TMP))
  end)

  it("loads a generated checkpoint: config, views, names, infos, metadata", function()
    local ck = assert(tide.load(TINY))
    local c = ck.config
    assert.equals(256, c.hidden_size)
    assert.equals(1024, c.vocab_size)
    assert.same({ 0, 4, 128, 4, 0 }, c.compress_ratios)
    assert.equals("deepseek_v4", c.model_type)
    assert.is_true(c.norm_topk_prob)
    assert.is_false(c.tie_word_embeddings)
    assert.is_true(c.rope_scaling)
    assert.equals(256, c.rope_original_max_position_embeddings)
    assert.same({ 128, 128 }, c.weight_block_size)
    assert.equals(1e-6, c.rms_norm_eps)
    assert.equals(4, ck:layer_ratio(1))
    assert.equals(1, ck:layer_ratio(4)) -- the MTP block
    assert.has_error(function() ck:layer_ratio(5) end)
    local t = ck:tensor("layers.1.attn.wq_a.weight")
    assert.equals("f8e4m3", t:dtype_name())
    assert.same({ 128, 256 }, t:shape())
    assert.equals(1, t.readonly)
    local s = ck:tensor("layers.1.attn.wq_a.scale")
    assert.equals("e8m0", s:dtype_name())
    assert.same({ 1, 2 }, s:shape())
    assert.equals("i8", ck:tensor("layers.3.ffn.experts.63.w2.weight"):dtype_name())
    assert.same({ 256, 4 }, ck:tensor("layers.3.ffn.experts.63.w2.scale"):shape())
    assert.equals("i64", ck:tensor("layers.0.ffn.gate.tid2eid"):dtype_name())
    assert.is_true(ck:has("mtp.0.e_proj.weight"))
    assert.is_false(ck:has("layers.0.ffn.gate.bias"))
    local names = ck:names()
    assert.equals(ck:count(), #names)
    for i = 2, #names do assert.is_true(names[i - 1] < names[i]) end
    local info = ck:info("embed.weight")
    assert.equals("bf16", info.dtype)
    assert.same({ 1024, 256 }, info.shape)
    assert.equals(1024 * 256 * 2, info.nbytes)
    assert.truthy(info.shard:find("model.safetensors", 1, true))
    assert.equals("pt", ck:metadata().format)
    assert.equals(1, #ck:shards())
    local sum = ck:summary()
    assert.equals(#names, sum.tensors)
    assert.equals(960, sum.by_dtype.i8.count)
    assert.equals(#ck_mod.inventory(ck.cfg), ck:count())
    assert.truthy(ck:config_json():find("\"compress_ratios\"", 1, true))
    assert.truthy(tostring(ck):find("2107 tensors", 1, true))
    ck:prefault({ "embed.weight", "head.weight" }, { progress = false })
    ck:prefault(nil, { progress = false })
    -- views outlive the checkpoint; the handle is closed idempotently
    local emb = ck:tensor("embed.weight")
    ck:close()
    ck:close()
    assert.equals(256, emb:size(1))
    assert.is_true(emb[3][5] == emb[3][5])
    assert.has_error(function() ck:tensor("embed.weight") end, "checkpoint " .. TINY .. " is closed")
    assert.equals(256, ck.config.hidden_size) -- the config copy survives too
  end)

  it("raises on misuse, returns nil and a message on runtime failure", function()
    local ck = assert(tide.load(TINY))
    local ok, err = pcall(ck.tensor, ck, "layers.9.nope")
    assert.is_false(ok)
    assert.truthy(err:find("'layers.9.nope' not found", 1, true), err)
    assert.truthy(err:find(TINY, 1, true), err)
    assert.has_error(function() ck:info("nope") end)
    assert.has_error(function() ck:tensor(3) end)
    assert.has_error(function() ck:prefault({ "nope" }) end)
    assert.has_error(function() tide.load(42) end)
    assert.has_error(function() tide.load(TINY, "x") end)
    ck:close()
    local none, msg = tide.load(TMP .. "/does-not-exist")
    assert.is_nil(none)
    assert.truthy(msg:find("does-not-exist", 1, true), msg)
  end)

  it("reports corrupted checkpoints with the file and the tensor", function()
    local bad = TMP .. "/bad"
    sh("rm -rf " .. q(bad) .. " && cp -r " .. q(TINY) .. " " .. q(bad))
    local st = bad .. "/model.safetensors"
    local data = read(st)
    -- truncated data
    write(st, data:sub(1, #data - 1000))
    local ck, msg = tide.load(bad)
    assert.is_nil(ck)
    assert.truthy(msg:find(st, 1, true) and msg:find("truncated", 1, true) and msg:find("tensor '", 1, true), msg)
    -- header length past the end of the file
    write(st, "\255\255\0\0\0\0\0\0" .. data:sub(9, 200))
    ck, msg = tide.load(bad)
    assert.is_nil(ck)
    assert.truthy(msg:find("past the end of the file", 1, true), msg)
    -- a dtype that does not fit the byte range
    local hdr = data:gsub('"layers.0.attn.attn_sink":{"dtype":"F32"', '"layers.0.attn.attn_sink":{"dtype":"BF16"', 1)
    write(st, hdr)
    ck, msg = tide.load(bad)
    assert.is_nil(ck)
    assert.truthy(msg:find("'layers.0.attn.attn_sink'", 1, true) and msg:find("needs 8", 1, true), msg)
    -- an unsupported config value
    write(st, data)
    local cfg = read(bad .. "/config.json")
    write(bad .. "/config.json",
      (cfg:gsub('"compress_ratios": %[0, 4, 128, 4, 0%]', '"compress_ratios": [0, 4, 8, 4, 0]')))
    ck, msg = tide.load(bad)
    assert.is_nil(ck)
    assert.truthy(msg:find(bad .. "/config.json", 1, true) and msg:find("compress_ratios[2] = 8", 1, true), msg)
    -- ... and the config.json of make_checkpoint is refused the same way
    local out, rc = make(TMP .. "/never", "--preset", "tiny", "--set", "compress_ratios=[0,4,8,4,0]")
    assert.equals(1, rc)
    assert.truthy(out:find("compress_ratios[2] = 8", 1, true), out)
    sh("rm -rf " .. q(bad))
  end)

  it("writes safetensors with tide.save, strided views and metadata included", function()
    local path = TMP .. "/acts.safetensors"
    local a = tide.randn({ 5, 7 }, { seed = 1 })
    local tensors = {
      a = a, at = a:t(), h = tide.randn({ 3, 4 }, { seed = 2, dtype = "bf16" }), ids = tide.arange(6, "i64"),
      s = tide.tensor({ 1, 2, 3, 4 }, "f8e4m3"), half = tide.randn({ 4 }, { seed = 3, dtype = "f16" }),
    }
    assert.is_true(tide.save(path, tensors, { step = 3, note = "ok" }))
    local ck = assert(tide.load(path))
    for name, t in pairs(tensors) do
      local r = ck:tensor(name)
      assert.equals(t:dtype_name(), r:dtype_name())
      assert.same(t:shape(), r:shape())
      local c = t:is_contiguous() and t or t:contiguous()
      assert.equals(bytes_of(c), bytes_of(r), name)
    end
    assert.same({ step = "3", note = "ok" }, ck:metadata())
    assert.is_nil(ck.config)
    ck:close()
    -- misuse raises, I/O failure returns nil, message
    assert.has_error(function() tide.save(path, { x = 1 }) end)
    assert.has_error(function() tide.save(path, { [1] = a }) end)
    assert.has_error(function() tide.save(path) end)
    local ok, err = tide.save("/nonexistent-dir/x.safetensors", { a = a })
    assert.is_nil(ok)
    assert.truthy(err:find("/nonexistent-dir/x.safetensors", 1, true), err)
    -- the streaming writer
    local w = assert(ck_mod.writer(TMP .. "/w.safetensors"))
    w:declare("x", "f32", { 2, 2 })
    assert.has_error(function() w:write("y", a) end)
    assert.is_true(w:write("x", tide.ones(2, 2)))
    assert.is_true(w:finish())
    w:close()
    assert.has_error(function() w:declare("z", "f32", { 1 }) end)
  end)

  it("generates deterministic checkpoints: same seed, same bytes; other seed, other values", function()
    local again = TMP .. "/again"
    local other = TMP .. "/other"
    assert.equals(0, select(2, make(again, "--preset", "tiny")))
    assert.equals(0, select(2, make(other, "--preset", "tiny", "--seed", "2")))
    assert.equals(read(TINY .. "/model.safetensors"), read(again .. "/model.safetensors"))
    assert.equals(read(TINY .. "/config.json"), read(again .. "/config.json"))
    assert.equals(read(TINY .. "/config.json"), read(other .. "/config.json"))
    assert.are_not.equal(read(TINY .. "/model.safetensors"), read(other .. "/model.safetensors"))
    sh("rm -rf " .. q(again) .. " " .. q(other))
  end)

  it("shards with an index that matches the unsharded checkpoint", function()
    local sharded = TMP .. "/sharded"
    assert.equals(0, select(2, make(sharded, "--preset", "tiny", "--shards", "3")))
    local index = require("cjson").decode(read(sharded .. "/model.safetensors.index.json"))
    local one, three = assert(tide.load(TINY)), assert(tide.load(sharded))
    assert.equals(3, #three:shards())
    assert.equals(one:count(), three:count())
    local total, files = 0, {}
    for _, name in ipairs(one:names()) do
      local a, b = one:tensor(name), three:tensor(name)
      assert.equals(bytes_of(a), bytes_of(b), name)
      total = total + a:nbytes()
      local file = index.weight_map[name]
      assert.truthy(file, name)
      assert.equals(file, three:info(name).shard:match("[^/]*$"))
      files[file] = true
    end
    assert.equals(total, index.metadata.total_size)
    assert.truthy(files["model-00001-of-00003.safetensors"] and files["model-00003-of-00003.safetensors"])
    assert.equals(total, three:summary().index_total_size)
    one:close()
    three:close()
    sh("rm -rf " .. q(sharded))
  end)

  it("makes the bf16 variant and applies --set overrides", function()
    local ck = assert(tide.load(BF16))
    assert.equals(16, ck.config.index_topk)
    assert.equals(8, ck.config.rope_factor)
    assert.equals("", ck.config.quant_method)
    assert.equals(0, ck.config.linear_format)
    for _, name in ipairs(ck:names()) do
      assert.is_nil(name:match("%.scale$"), name)
      if name:match("%.weight$") then assert.equals("bf16", ck:info(name).dtype, name) end
    end
    -- the bf16 twin holds the unquantised values of the fp8 checkpoint
    local fp8 = assert(tide.load(TINY))
    local w8, s8 = fp8:tensor("layers.1.attn.wq_b.weight"), fp8:tensor("layers.1.attn.wq_b.scale")
    local wb = ck:tensor("layers.1.attn.wq_b.weight")
    local v8 = w8[5][7] * s8[0][0]
    assert.is_true(math.abs(v8 - wb[5][7]) <= math.abs(wb[5][7]) * 0.07 + 1e-6)
    ck:close()
    fp8:close()
  end)

  it("copies the DeepSeek tokenizer when the vocabulary is DeepSeek's", function()
    local tk = require("tide.tokenizer").default_path()
    local out = TMP .. "/vocab"
    assert.equals(0, select(2, make(out, "--preset", "tiny", "--set", "vocab_size=129280", "--header-only")))
    if tk then
      assert.equals(read(tk .. "/tokenizer.json"), read(out .. "/tokenizer.json"))
    else
      assert.is_nil(read(out .. "/tokenizer.json"))
    end
    assert.is_nil(read(TINY .. "/tokenizer.json"))
    local ck = assert(tide.load(out))
    assert.equals(129280, ck:info("embed.weight").shape[1])
    ck:close()
    sh("rm -rf " .. q(out))
  end)

  it("has a usable command line: errors, inspect", function()
    local out, rc = make(TMP .. "/x", "--preset", "huge")
    assert.equals(2, rc)
    assert.truthy(out:find("unknown preset 'huge'", 1, true), out)
    out, rc = sh(q(EXE) .. " " .. q(ROOT .. "/scripts/make_checkpoint.lua") .. " --preset tiny")
    assert.equals(2, rc)
    assert.truthy(out:find("--out", 1, true), out)
    out, rc = sh(q(EXE) .. " inspect --model " .. q(TINY))
    assert.equals(0, rc, out)
    assert.truthy(out:find("2,107 tensors", 1, true), out)
    assert.truthy(out:find("compress ratios: 0 4 128 4 | 0", 1, true), out)
    assert.truthy(out:find("\ni8 +960 +15,728,640 +15,728,640\n"), out)
    assert.truthy(out:find("\nlayers%.2%.attn%.compressor%.ape +f32 +%[128, 512%] +model%.safetensors\n"), out)
    local n = select(2, out:gsub("model%.safetensors\n", ""))
    assert.equals(2107, n)
    out, rc = sh(q(EXE) .. " inspect --model " .. q(TINY) .. " --no-tensors")
    assert.equals(0, rc)
    assert.is_nil(out:find("model.safetensors\n", 1, true))
    out, rc = sh(q(EXE) .. " inspect --model " .. q(TMP .. "/missing"))
    assert.equals(1, rc)
    assert.truthy(out:find("missing", 1, true), out)
  end)

  it("frees everything it allocates", function()
    collectgarbage()
    collectgarbage()
    local before = tide.alloc_stats()
    for _ = 1, 3 do
      local ck = assert(tide.load(TINY))
      local t = ck:tensor("embed.weight")
      assert.truthy(#ck:names() > 0 and ck:summary() and ck:shards() and t)
      ck:close()
      local bad = tide.load(TMP .. "/nothing")
      assert.is_nil(bad)
      local x = tide.zeros(300, 64)
      ck_mod.gen_weight(x, nil, ck_mod.seed(1, "x"), 0, 1)
      local q8, s8 = ck_mod.quant_fp8(x)
      local q4, s4 = ck_mod.quant_mxfp4(x)
      assert.same({ 3, 1 }, s8:shape())
      assert.same({ 300, 32 }, q4:shape())
      assert.same({ 300, 2 }, s4:shape())
      assert.same({ 300, 64 }, q8:shape())
    end
    collectgarbage()
    collectgarbage()
    local after = tide.alloc_stats()
    assert.equals(before.live_allocs, after.live_allocs)
    assert.equals(before.live_maps, after.live_maps)
    assert.equals(before.live_storages, after.live_storages)
  end)
end)
