-- workbench_spec: the workbench a user meets first. Objects print a one-line
-- summary with the numbers that matter and a long form on request; the REPL
-- shows the summary instead of the insides; help() lists the entry points;
-- the sampler lab's terminal view on a generated checkpoint (and that it
-- samples exactly what generation samples); its HTML report opened in
-- headless Chromium: a screenshot that is not blank and shows the bars, the
-- SVG pictures in the DOM, nothing fetched from the network.
local tide = require("tide")
local ffi = require("ffi")
local tm = require("testmodels")
local repl = require("tide.repl")
local pretty = require("tide.pretty")
local q, sh, EXE = tm.q, tm.sh, tm.EXE

local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/workbench_spec"
os.execute("mkdir -p " .. q(TMP))
local DEMO = tm.get("demo1", { "--preset", "demo", "--seed", "2" })

local function write(name, text)
  local p = TMP .. "/" .. name
  local f = assert(io.open(p, "w"))
  f:write(text)
  f:close()
  return p
end

local function one_line(s, kind)
  assert.equals("string", type(s))
  assert.is_nil(s:find("\n", 1, true), "more than one line: " .. s)
  assert.matches("^tide%." .. kind .. "%(.*%)$", s)
  return s
end

local function has(s, ...)
  for _, want in ipairs({ ... }) do assert.truthy(s:find(want, 1, true), "'" .. want .. "' missing from: " .. s) end
end

describe("objects introduce themselves", function()
  local m = assert(tide.model(DEMO, { max_tokens = 64, cache = { context = 512, max_seqs = 6 } }))
  local cfg = m.config

  it("the model: family, layers and ratios, hidden size, experts, vocabulary, weights, cache", function()
    local s = one_line(tostring(m), "model")
    has(s, "deepseek_v4", "4 layers (1 SWA, 2 C4, 1 C128)", "hidden " .. cfg.hidden_size,
      string.format("experts %d routed/%d used", cfg.n_routed_experts, cfg.num_experts_per_tok), "vocab 129,280",
      "weights ", "bf16 ", "fp8 ", "fp4 ", "cache 6 seqs, window " .. cfg.sliding_window)
    local long = m:describe()
    assert.truthy(select(2, long:gsub("\n", "")) >= 10, long)
    has(long, s, "layer ratios (0...3): 1 4 128 4", "compressed: ", "sliding window: ", "tokenizer")
    -- the REPL prints the summary, not the tables inside
    assert.equals(s, pretty.format(m))
    local out = { text = "" }
    function out:write(...) self.text = self.text .. table.concat({ ... }) end
    _G.workbench_m = m
    assert.is_true(repl.eval("workbench_m", out))
    assert.equals(s .. "\n", out.text)
    out.text = ""
    assert.is_true(repl.eval("workbench_m:describe()", out))
    assert.equals(long .. "\n", out.text)
    out.text = ""
    assert.is_true(repl.eval("==workbench_m", out))
    assert.equals(long .. "\n", out.text)
    -- inside a table, objects stay one line
    local t = pretty.format({ model = m, n = 1 })
    assert.truthy(select(2, t:gsub("\n", "")) <= 4, t)
    _G.workbench_m = nil
  end)

  it("checkpoints, tokenizers, caches, sequences", function()
    has(one_line(tostring(m.ck), "checkpoint"), "demo1", "2107 tensors", "1 shard", "parameters")
    has(one_line(tostring(m.tokenizer), "tokenizer"), "vocab 128,815", "BPE")
    local seq = assert(m:sequence())
    assert.truthy(m:prefill(seq, { 0, 5, 17 }))
    has(one_line(tostring(seq), "sequence"), "3 positions", "1 window blocks")
    has(one_line(pretty.format(m.cache), "cache"), "1/6 sequences", "window " .. cfg.sliding_window)
    seq:free()
    has(tostring(seq), "freed")
  end)

  it("sessions and replies", function()
    local s = assert(m:session{ seed = 3, max_tokens = 3, print = false, sampler = { temp = 0.7, top_k = 20 } })
    has(one_line(tostring(s), "session"), "0 tokens", "seed 3", "top_k(k = 20)")
    local r = s:say("Hi")
    has(one_line(tostring(r), "reply"), "3 tokens", "length")
    has(one_line(tostring(s), "session"), "1 exchanges")
    local long = s:describe()
    has(long, "user:", "assistant:", "max_tokens 3")
    s:close()
    has(tostring(s), "closed")
  end)

  it("the engine and its requests", function()
    local e = tide.engine(m, { budget = 32, policy = "fair" })
    local h = e:submit{ tokens = { 0, 5 }, max_tokens = 2, seed = 1 }
    has(one_line(tostring(e), "engine"), "policy fair", "budget 32", "1 waiting")
    has(one_line(tostring(h), "request"), "waiting", "prompt 2 tokens", "0/2 generated")
    e:run()
    has(one_line(tostring(h), "request"), "done", "2/2 generated")
    has(e:describe(), "limits: chunk 32", "1 finished")
    e:close()
  end)

  it("sampler chains, stages and states", function()
    local sp = tide.sampling
    local chain = sp.chain{ sp.top_k(40), sp.min_p(0.05), sp.temperature(0.8) }
    has(one_line(tostring(chain), "sampler"), "4 stages", "top_k(k = 40) -> min_p(p = 0.05")
    has(one_line(tostring(chain.stages[1]), "stage"), "top_k(k = 40)")
    has(one_line(tostring(chain.stages[4]), "stage"), "dist", "chooses the token")
    has(one_line(tostring(chain:new_state{ seed = 9 }), "sampling_state"), "seed 9")
    has(tide.describe(chain), "1. top_k(k = 40)", "4. dist  [chooses]")
    -- a user stage given as a table gets a summary too
    local user = sp.chain{ { name = "mine", apply = function() end } }
    has(tostring(user.stages[1]), "tide.stage(mine)")
  end)

  it("help() lists the entry points with an example each", function()
    local h = repl.help_text()
    has(h, "tide.model()", "m:session", "s:say(", "s:peek(", "s:inspect", "tide.lab(", "tide.engine(", "e:submit",
      "tide.sampling.chain", "tok:encode", "tide.load(", "tide.randn(", "describe(x)")
    local out = sh("printf 'help()\\n' | " .. q(EXE))
    has(out, "tide.lab(s")
  end)
end)

describe("the sampler lab", function()
  local B = write("b.lua", "return sampling.chain{ sampling.top_k(3), sampling.temperature(0.5) }\n")

  it("shows the distribution stage by stage and the tokens of two chains", function()
    local out, rc = sh(q(EXE) .. " sample --model " .. q(DEMO) .. " --tokens 0,1234,5678 --top-k 20 --vs " .. q(B)
      .. " --n 3 --top 4 --seed 5")
    assert.equals(0, rc, out)
    has(out, "sampler lab: 3 prompt tokens, seed 5, 2 chains", "chain A: top_k(k = 20)", "chain B: top_k(k = 3) -> ",
      "model (129,280 candidates, entropy ", "after top_k (20 of 129,280 kept", "after top_k (3 of 129,280 kept",
      "after temperature (3 of 3 kept", "<- chosen", "█", "chain A: token", "chain B: token")
    -- four candidates per block; three steps per chain
    local blockA = out:match("after top_k %(20 of 129,280 kept[^\n]*\n(.-)\n  after")
    assert.truthy(blockA, out)
    assert.equals(4, select(2, blockA:gsub("\n", "")) + 1)
    local rows = {}
    for n in out:gmatch("\n%s+(%d+)  | ") do rows[#rows + 1] = tonumber(n) end
    assert.same({ 1, 2, 3 }, rows)
  end)

  it("samples exactly what generation samples (tracing changes nothing)", function()
    local m = assert(tide.model(DEMO, { max_tokens = 64, cache = { context = 512, max_seqs = 6 } }))
    local res = tide.lab(m, { prompt = { 0, 1234, 5678 }, sampler = { top_k = 20, temp = 0.9 }, seed = 5, steps = 4,
      quiet = true, inspect = false })
    local ids = {}
    for i, s in ipairs(res.chains[1].steps) do ids[i] = s.token end
    local out, rc = sh(q(EXE) .. " generate --model " .. q(DEMO) .. " --tokens 0,1234,5678 --top-k 20 --temp 0.9 "
      .. "--seed 5 --max-tokens 4 --ids --ignore-eos 2>/dev/null")
    assert.equals(0, rc, out)
    assert.equals(table.concat(ids, " "), out:match("^%s*(.-)%s*$"))
    -- the recorded distributions are consistent
    for _, s in ipairs(res.chains[1].steps) do
      local last = s.stages[#s.stages]
      assert.equals(20, s.stages[1].n_out)
      local sum = 0
      for _, e in ipairs(last.top) do sum = sum + e.p end
      assert.truthy(sum <= 1 + 1e-6 and sum > 0)
      assert.truthy(s.rank >= 0 and s.p > 0 and s.p <= 1)
    end
    has(one_line(tostring(res), "lab"), "3 prompt tokens", "seed 5", "A 4 tokens")
    m:close()
  end)

  it("runs on a session without changing it", function()
    local m = assert(tide.model(DEMO, { max_tokens = 64, cache = { context = 512, max_seqs = 6 } }))
    local s = assert(m:session{ seed = 2, max_tokens = 2, print = false })
    s:say("Hello")
    local before, seqs = s:tokens(), m:cache_stats().seqs
    local res = tide.lab(s, { vs = { temp = 0.2, top_k = 5 }, steps = 3, quiet = true })
    assert.equals(2, #res.chains)
    assert.equals(#before, #res.prompt)
    assert.same(before, s:tokens())
    assert.equals(seqs, m:cache_stats().seqs)
    has(res:format(), "chain A: " .. s.sampler:describe(), "chain B: top_k(k = 5)")
    -- attention shares and expert counts from chain A's decode steps
    assert.equals(2, res.attention.n)
    assert.equals(2, res.load.n)
    s:close()
    m:close()
  end)

  it("runs from tide chat on the conversation (/lab)", function()
    local input = write("chat_lab.txt", "hello\n/lab 2\n/lab 0\n/quit\n")
    local out, rc = sh(q(EXE) .. " chat --model " .. q(DEMO) .. " --max-tokens 2 --top-k 10 < " .. q(input))
    assert.equals(0, rc, out)
    has(out, "sampler lab: ", "chain A: top_k(k = 10)", "after top_k (10 of 129,280 kept",
      "[usage: /lab [N] [FILE.html]]")
  end)
end)

-- ---------------------------------------------------------------- PNG check
-- Decode a non-interlaced 8-bit RGB/RGBA PNG (what Chromium writes) with
-- zlib; returns width, height, bytes per pixel and the unfiltered rows.
local function read_png(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  assert.equals("\137PNG\r\n\26\n", data:sub(1, 8))
  local pos, idat = 9, {}
  local w, h, depth, ctype, interlace
  local function u32(p) local a, b, c, d = data:byte(p, p + 3) return ((a * 256 + b) * 256 + c) * 256 + d end
  while pos < #data do
    local len, typ = u32(pos), data:sub(pos + 4, pos + 7)
    local body = data:sub(pos + 8, pos + 7 + len)
    if typ == "IHDR" then
      w, h = u32(pos + 8), u32(pos + 12)
      depth, ctype, interlace = body:byte(9), body:byte(10), body:byte(13)
    elseif typ == "IDAT" then
      idat[#idat + 1] = body
    end
    pos = pos + 12 + len
  end
  assert.equals(8, depth)
  assert.equals(0, interlace)
  local bpp = ({ [2] = 3, [6] = 4 })[ctype]
  assert.truthy(bpp, "color type " .. tostring(ctype))
  pcall(ffi.cdef, "int uncompress(uint8_t *dest, unsigned long *destLen, const uint8_t *source, "
    .. "unsigned long sourceLen);")
  local z = ffi.load("libz.so.1")
  local src = table.concat(idat)
  local stride = w * bpp
  local n = (stride + 1) * h
  local raw = ffi.new("uint8_t[?]", n)
  local len = ffi.new("unsigned long[1]", n)
  assert.equals(0, z.uncompress(raw, len, src, #src))
  local img = ffi.new("uint8_t[?]", stride * h)
  for y = 0, h - 1 do
    local ft, row, prev = raw[y * (stride + 1)], raw + y * (stride + 1) + 1, img + (y - 1) * stride
    local out = img + y * stride
    for x = 0, stride - 1 do
      local a = x >= bpp and out[x - bpp] or 0
      local b = y > 0 and prev[x] or 0
      local c = (x >= bpp and y > 0) and prev[x - bpp] or 0
      local v = row[x]
      if ft == 1 then v = v + a elseif ft == 2 then v = v + b elseif ft == 3 then v = v + math.floor((a + b) / 2)
      elseif ft == 4 then
        local p = a + b - c
        local pa, pb, pc = math.abs(p - a), math.abs(p - b), math.abs(p - c)
        v = v + ((pa <= pb and pa <= pc) and a or (pb <= pc and b or c))
      end
      out[x] = v % 256
    end
  end
  return w, h, bpp, img
end

describe("the lab's HTML report in headless Chromium", function()
  local CHROMIUM = "chromium"
  local function chromium(args)
    local profile = TMP .. "/chromium-profile"
    os.execute("rm -rf " .. q(profile))
    return sh("timeout 120 " .. CHROMIUM .. " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      .. "--disable-background-networking --disable-component-update --disable-sync --user-data-dir=" .. q(profile)
      .. " " .. args .. " 2>/dev/null")
  end

  local REPORT = TMP .. "/lab.html"
  local B = write("b2.lua", "return sampling.chain{ sampling.top_k(5), sampling.temperature(0.4) }\n")

  it("is written by tide sample --report, self-contained", function()
    os.remove(REPORT)
    local out, rc = sh(q(EXE) .. " sample --model " .. q(DEMO) .. " --prompt " .. q("The sea is") .. " --vs " .. q(B)
      .. " --n 4 --top 6 --report " .. q(REPORT))
    assert.equals(0, rc, out)
    has(out, "report: " .. REPORT)
    local html = assert(io.open(REPORT)):read("*a")
    -- nothing to fetch: no scripts, links, images or URLs but the SVG namespace
    local stripped = html:gsub('xmlns="http://www%.w3%.org/2000/svg"', "")
    for _, bad in ipairs({ "http:", "https:", "<script", "<link", "<img", "url(", "@import" }) do
      assert.is_nil(stripped:find(bad, 1, true), "the report refers to " .. bad)
    end
    -- per stage bars for both chains, lines over the generation, heatmaps
    local _, nsvg = html:gsub("<svg ", "")
    local _, nheat = html:gsub('<svg class="heat"', "")
    assert.truthy(nsvg >= 2 * 3 + 2 * 3 + 4, "svg count " .. nsvg)
    assert.equals(4, nheat)
    has(html, "chain A: ", "chain B: top_k(k = 5)", "Attention: where each head", "Router: expert load")
  end)

  it("renders: the DOM holds the SVGs, the screenshot is not blank and shows the bars", function()
    local url = "file://" .. REPORT
    local dom, rc = chromium("--dump-dom " .. q(url))
    assert.equals(0, rc, dom)
    local _, nsvg = dom:gsub("<svg ", "")
    assert.truthy(nsvg >= 16, "svg elements in the DOM: " .. nsvg)
    has(dom, "The next token, stage by stage", "Over the generation", "<rect", "<polyline")
    local png = TMP .. "/lab.png"
    os.remove(png)
    local out
    out, rc = chromium("--window-size=1200,1600 --screenshot=" .. q(png) .. " " .. q(url))
    assert.equals(0, rc, out)
    local w, h, bpp, img = read_png(png)
    assert.equals(1200, w)
    assert.equals(1600, h)
    local nonwhite, blue, orange = 0, 0, 0
    for i = 0, w * h - 1 do
      local r, g, b = img[i * bpp], img[i * bpp + 1], img[i * bpp + 2]
      if r < 240 or g < 240 or b < 240 then nonwhite = nonwhite + 1 end
      if math.abs(r - 74) < 12 and math.abs(g - 123) < 12 and math.abs(b - 208) < 12 then blue = blue + 1 end
      if math.abs(r - 208) < 12 and math.abs(g - 105) < 12 and math.abs(b - 74) < 12 then orange = orange + 1 end
    end
    -- text, frames and bars cover a fair part of the page; the bars are there
    assert.truthy(nonwhite > 0.03 * w * h, "non-white pixels: " .. nonwhite)
    assert.truthy(blue > 2000, "bar pixels: " .. blue)
    assert.truthy(orange > 200, "chosen-token bar pixels: " .. orange)
  end)
end)
