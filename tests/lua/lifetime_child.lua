-- lifetime_child.lua MODEL_DIR VARIANT: run by lifetime_spec.lua in a child
-- `tide` process. Builds every kind of object that borrows a C object (model,
-- sequences and forks, a session with snapshots, an engine with running and
-- waiting requests, tokenizers and streamers, checkpoint views and linear
-- handles over them, reference-mode state, a raw cache with a prepared
-- batch, sampler state) in an order that depends on VARIANT, drops or closes
-- some of them, and ends in one of several ways. At lua_close every
-- finalizer runs whatever the references between the objects, so the ones
-- still alive are finalized in an arbitrary order. The parent checks the
-- exit status and that no sanitizer spoke.
local D, variant = arg[1], tonumber(arg[2]) or 0
local tide = require("tide")
tide.threads(1)

local o = {}
local steps = {}

steps[#steps + 1] = function()
  o.m = assert(tide.model(D, { max_tokens = 16, cache = { context = 512, max_seqs = 24, seq_budget = 8 } }))
end
steps[#steps + 1] = function()
  -- many sequences, so that some are finalized after the cache
  o.seqs = {}
  for i = 1, 5 do
    local s = assert(o.m:sequence())
    o.m:step({ { seq = s, tokens = { 1 + i, 17, 300 + i }, logits = "last" } })
    o.seqs[#o.seqs + 1] = s
    o.seqs[#o.seqs + 1] = assert(s:fork())
  end
end
steps[#steps + 1] = function()
  o.sess = assert(o.m:session({ print = false, seed = 1, max_tokens = 3,
    sampler = { temp = 0.8, top_k = 20, repeat_penalty = 1.1, dry_multiplier = 0.5 } }))
  o.sess:say("Hello")
  o.fork = o.sess:fork()
end
steps[#steps + 1] = function()
  o.eng = tide.engine(o.m, { budget = 16, max_running = 2 })
  o.h1 = o.eng:submit({ prompt = "Once upon a time", max_tokens = 6, seed = 3 })
  o.h2 = o.eng:submit({ prompt = "The sea", max_tokens = 6, seed = 4 })
  o.h3 = o.eng:submit({ tokens = { 5, 6, 7 }, max_tokens = 6, seed = 5 })
  o.eng:step()
  o.eng:step()
end
steps[#steps + 1] = function()
  o.tok = assert(tide.tokenizer(D))
  o.st1 = o.tok:streamer()
  o.st2 = o.tok:streamer({ skip_special_tokens = true })
  o.st1:put(19923)
  o.mst = o.m.tokenizer:streamer()
end
steps[#steps + 1] = function()
  o.ck = assert(tide.load(D))
  o.view = o.ck:tensor("embed.weight")
  local w = o.ck:tensor("layers.0.attn.wq_a.weight")
  local s = o.ck:has("layers.0.attn.wq_a.scale") and o.ck:tensor("layers.0.attn.wq_a.scale") or nil
  o.lin = tide.quant.linear(w, s)
  o.lin2 = tide.quant.linear(w, s)
end
steps[#steps + 1] = function()
  o.m:use_reference({ 0 })
  o.rseq = assert(o.m:sequence())
  o.m:step({ { seq = o.rseq, tokens = { 3, 4 }, logits = "last" } })
  o.m:use_reference(false)
end
steps[#steps + 1] = function()
  o.cache = tide.attn.cache({ ratios = { 1, 4 }, pages = 4, max_seqs = 2 })
  o.cid = assert(o.cache:seq_new())
  o.batch = tide.attn.batch(8)
  o.batch:add(o.cid, 0, 3)
  assert(o.cache:prepare(o.batch))   -- left prepared
  o.cview = o.cache:view(0, "swa")
end

-- the model comes first (others need it); the rest in a variant's order
local order = { 1 }
local rest = {}
for i = 2, #steps do rest[#rest + 1] = i end
local x = variant * 7919 + 17
while #rest > 0 do
  x = (x * 1103515245 + 12345) % 2147483648
  order[#order + 1] = table.remove(rest, 1 + x % #rest)
end
for _, i in ipairs(order) do steps[i]() end

local function drop(keys)
  for _, k in ipairs(keys) do o[k] = nil end
  collectgarbage()
  collectgarbage()
end

local kind = variant % 6
if kind == 1 then
  -- the owners go first: what borrows from them keeps them alive
  drop({ "m", "tok", "ck", "cache" })
elseif kind == 2 then
  -- explicit closes, owners before borrowers
  o.tok:close()
  o.ck:close()
  o.cache:close()
  o.m:close()
  o.lin:close()
  drop({ "seqs" })
elseif kind == 3 then
  -- borrowers first, some closed, some collected
  o.eng:close()
  o.sess:close()
  o.st1:close()
  drop({ "seqs", "fork", "lin", "view", "batch", "cview" })
elseif kind == 4 then
  io.write("LIFETIME-OK\n")
  io.flush()
  os.exit(0, true)   -- closes the state, then exits
elseif kind == 5 then
  io.write("LIFETIME-OK\n")
  io.flush()
  error("LIFETIME-RAISE")   -- the command reports it and closes the state
end
-- kind 0: everything still alive at exit
io.write("LIFETIME-OK\n")
