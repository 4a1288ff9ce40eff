-- The opt-in int8 paths (tide.model(dir, { q8 = "experts" | "dense" | "all" })
-- or TIDE_Q8=...; kernels/linear_q8.h, docs/linear.md): bad
-- values are refused, the accuracy cost on the trained model stays small
-- (KL against the exact path with `tide perplexity --kld-base`), and the
-- batch and thread invariances hold in those modes too.
local tide = require("tide")
local ffi = require("ffi")
local cjson = require("cjson")

local DIR = os.getenv("TIDE_TRAINED_MODEL") or "models/tide-tiny-en"
local FIX = "tests/fixtures/trained/"
local BUILD = os.getenv("TIDE_BUILD_DIR") or "build"
local EXE = os.getenv("TIDE_EXE") or (BUILD .. "/tide")
local TMP = os.getenv("TIDE_TEST_TMP") or (BUILD .. "/test-tmp")

local function sh(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("*a")
  local ok = p:close()
  return ok, out
end

local function bits(t) return ffi.string(t.data, t:nbytes()) end

describe("q8 = experts | dense | all", function()
  it("refuses an unknown mode, naming the choices", function()
    local ok, err = pcall(tide.model, DIR, { q8 = "int4", tokenizer = false })
    assert.is_false(ok)
    assert.matches("q8 = 'int4' %(expected off, experts, dense or all%)", tostring(err))
  end)

  it("costs little accuracy on the trained model (KL against the exact path)", function()
    os.execute("mkdir -p " .. TMP)
    local base = TMP .. "/q8_base.kld"
    os.remove(base)
    local cmd = EXE .. " perplexity --model " .. DIR .. " --file " .. FIX .. "heldout_slice.txt --ctx 256"
      .. " --batch 2 --quiet --json --threads 1 --kld-base " .. base
    local ok, out = sh("TIDE_Q8=off " .. cmd)
    assert(ok, out)
    for _, env in ipairs({ "TIDE_Q8=experts", "TIDE_Q8=dense", "TIDE_Q8=all" }) do
      local ok2, out2 = sh(env .. " " .. cmd)
      assert(ok2, out2)
      local r = cjson.decode(out2:match("{.*}"))
      -- the path ran (the logits moved) and moved little
      assert.is_true(r.kl > 0, env .. " gave the exact logits: the path did not run")
      assert.is_true(r.kl < 1e-3, env .. ": KL " .. r.kl .. " nats/token")
      assert.is_true(r.top1 >= 0.99, env .. ": top-1 agreement " .. r.top1)
      assert.is_true(math.abs(r.ppl / r.base_ppl - 1) < 0.01, env .. ": perplexity " .. r.ppl .. " vs " .. r.base_ppl)
    end
    os.remove(base)
  end)

  it("keeps batch and thread invariance", function()
    local m = assert(tide.model(DIR, { q8 = "all", max_tokens = 64,
      cache = { context = 128, max_seqs = 4 } }))
    local a = { 5, 77, 300, 12, 9, 1000, 42 }
    local b = { 8, 16, 3000, 7 }
    local old = tide.threads()
    -- alone, 1 thread
    tide.threads(1)
    local s1 = assert(m:sequence())
    local alone = bits(assert(m:step({ { seq = s1, tokens = a } }))[1])
    local alone2 = bits(assert(m:step({ { seq = s1, tokens = { 99 } } }))[1])
    s1:free()
    -- in a batch with another sequence, 2 threads
    tide.threads(2)
    local s2, s3 = assert(m:sequence()), assert(m:sequence())
    local r = assert(m:step({ { seq = s3, tokens = b }, { seq = s2, tokens = a } }))
    assert.are.equal(alone, bits(r[2]))
    r = assert(m:step({ { seq = s2, tokens = { 99 } }, { seq = s3, tokens = { 4 } } }))
    assert.are.equal(alone2, bits(r[1]))
    tide.threads(old)
    s2:free()
    s3:free()
    -- and the exact model gives other bits (the mode reached the experts)
    local e = assert(tide.model(DIR, { q8 = "off", max_tokens = 64,
      cache = { context = 128, max_seqs = 4 } }))
    local s4 = assert(e:sequence())
    assert.are_not.equal(alone, bits(assert(e:step({ { seq = s4, tokens = a } }))[1]))
    s4:free()
  end)
end)
