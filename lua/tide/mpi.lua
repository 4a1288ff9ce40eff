-- tide.mpi: expert parallelism over MPI (docs/scale-out.md).
--
--   mpirun -np 4 build/tide generate --model DIR --prompt "..." --seed 1
--
-- Every rank runs the same command. Rank 0 runs it (the CLI, the engine, the
-- sampler, the whole network); the other ranks only hold routed experts and
-- answer rank 0's MoE requests (C: engine/mpi/tide_mpi.c). Which rank holds
-- which expert is a placement script (lua/tide/placement/*.lua, or the file
-- in $TIDE_PLACEMENT or opts.placement of tide.model). Rank 0 holds every
-- tensor but the other ranks' routed experts; a follower holds only its
-- routed experts. The logits are bitwise those of one process.
--
-- Nothing here is loaded unless tide runs under mpirun with more than one
-- rank (tide.cli calls M.boot first).
local tffi = require("tide.ffi")
local ffi, C = tffi.ffi, tffi.C

local M = {}

-- The declarations of engine/mpi/tide_mpi.h (between its CDEF markers; a
-- spec checks they agree).
M.cdef = [[
typedef struct tide_mpi_stats {
  int64_t calls;
  int64_t tokens;
  int64_t rows_local;
  int64_t rows_remote;
  int64_t bytes_sent;
  int64_t bytes_recv;
  int64_t bytes_rows;
  double t_total;
  double t_local;
  double t_shared;
  double t_wait;
  double t_combine;
} tide_mpi_stats;
int tide_mpi_init(int32_t *rank, int32_t *size);
int tide_mpi_finalize(void);
int tide_mpi_set_timeout(double seconds);
int tide_mpi_register(tide_moe *m, int32_t model, int32_t block, const int32_t *owner, int32_t E);
int tide_mpi_unregister(int32_t model);
void tide_mpi_forget(const tide_moe *m);
int tide_mpi_moe_forward(tide_moe *m, tide_tensor *out, const tide_tensor *x, const tide_tensor *ids,
                         const tide_tensor *weights, int flags);
int tide_mpi_control(const char *text, int64_t n);
int tide_mpi_reply_recv(int32_t from, const char **text, int64_t *n);
int tide_mpi_follow(const char **text, int64_t *n);
int tide_mpi_reply(const char *text, int64_t n);
int tide_mpi_stats_get(tide_mpi_stats *out);
void tide_mpi_stats_reset(void);
int64_t tide_mpi_resident_bytes(const void *p, int64_t n);
]]

-- The world size mpirun gives this process (Open MPI, MPICH / PMI), or 1.
function M.world_size()
  for _, v in ipairs({ "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE" }) do
    local n = tonumber(os.getenv(v) or "")
    if n then return n end
  end
  return 1
end

local lib
local textbox = ffi.new("const char*[1]")
local lenbox = ffi.new("int64_t[1]")

local function load_lib()
  if lib then return lib end
  local dir = tffi.lib_path:match("^(.*)/[^/]*$") or "."
  local path = os.getenv("TIDE_MPI_LIB")
  if not path or path == "" then path = dir .. "/libtide_mpi.so" end
  ffi.cdef(M.cdef)
  -- global: Open MPI's plugins look up libmpi's symbols in the global scope
  local ok, l = pcall(ffi.load, path, true)
  if not ok then
    error("tide: running under mpirun, but the MPI library " .. path .. " cannot be loaded (" .. tostring(l)
      .. "); install libopenmpi-dev and rebuild (make build)", 0)
  end
  lib = l
  return lib
end

local function mcheck(rc, level)
  if rc < 0 then error(tffi.last_error(), (level or 1) + 1) end
  return rc
end

-- Called by tide.cli before anything else. Under mpirun with N > 1: MPI is
-- initialised; on a follower the expert server runs here and true is
-- returned when rank 0 stops it (the command line is not run). Otherwise
-- (one process) false, and nothing was loaded.
function M.boot()
  if M.world_size() <= 1 then return false end
  local L = load_lib()
  local r, n = ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
  if L.tide_mpi_init(r, n) < 0 then error(tffi.last_error(), 0) end
  M.rank, M.size = r[0], n[0]
  if M.size <= 1 then return false end
  _G._TIDE_MPI = M
  if M.rank ~= 0 then
    M.follow()
    return true
  end
  return false
end

-- ---------------------------------------------------------------- placement
-- A placement script returns function(info) -> owner, where info = { ranks,
-- experts, blocks (their names, "layers.0." ...), n_blocks, config } and
-- owner is either owner[e] (e = 0 .. experts-1, the same for every block)
-- or owner[b][e] per block b = 0 .. n_blocks-1; each value a rank 0 ..
-- ranks-1. Returns the per-block owner lists (0-based arrays), or nil, err.
function M.placement(spec, info)
  local fn, src = spec, nil
  if spec == nil or spec == "" then spec = "contiguous" end
  if type(spec) == "string" then
    src = spec
    local chunk, err
    if spec:find("/") or spec:match("%.lua$") then
      chunk, err = loadfile(spec)
    else
      local ok, mod = pcall(require, "tide.placement." .. spec)
      if not ok then
        if tostring(mod):find("not found", 1, true) then
          return nil, "no placement '" .. spec .. "': not a file, and not a script in lua/tide/placement/"
            .. " (contiguous, round_robin, balanced)"
        end
        return nil, "placement '" .. spec .. "': " .. tostring(mod)
      end
      chunk = function() return mod end
    end
    if not chunk then return nil, "placement " .. spec .. ": " .. tostring(err) end
    local ok, f = pcall(chunk)
    if not ok then return nil, "placement " .. spec .. ": " .. tostring(f) end
    fn = f
  end
  src = src or "function"
  if type(fn) ~= "function" then return nil, "placement " .. src .. " must return a function(info) -> owner" end
  local ok, owner = pcall(fn, info)
  if not ok then return nil, "placement " .. src .. ": " .. tostring(owner) end
  if type(owner) ~= "table" then return nil, "placement " .. src .. " returned " .. type(owner) .. ", not a table" end
  local per_block = type(owner[0]) == "table"
  local out = {}
  local held = {}
  for r = 0, info.ranks - 1 do held[r] = 0 end
  for b = 0, info.n_blocks - 1 do
    local o = per_block and owner[b] or owner
    if type(o) ~= "table" then
      return nil, string.format("placement %s: block %d (%s) has no owner table", src, b, info.blocks[b])
    end
    local list = {}
    for e = 0, info.experts - 1 do
      local r = o[e]
      if r == nil then
        return nil, string.format("placement %s: expert %d of block %d (%s) is on no rank", src, e, b, info.blocks[b])
      end
      if type(r) ~= "number" or r ~= math.floor(r) or r < 0 or r >= info.ranks then
        return nil, string.format("placement %s: expert %d of block %d (%s) is placed on rank %s, but the run has"
          .. " %d ranks (0..%d)", src, e, b, info.blocks[b], tostring(r), info.ranks, info.ranks - 1)
      end
      list[e] = r
      held[r] = held[r] + 1
    end
    out[b] = list
  end
  return out, held
end

-- ---------------------------------------------------------------- rank 0
local model_ids = 0
M.loads = {}   -- per model: the followers' load reports

local function block_names(ck, cfg)
  local names = {}
  local n = cfg.num_hidden_layers or 0
  for L = 0, n - 1 do names[L] = "layers." .. L .. "." end
  for j = 0, (cfg.num_nextn_predict_layers or 0) - 1 do
    if ck:has("mtp." .. j .. ".ffn.gate.weight") then names[n + j] = "mtp." .. j .. "." end
  end
  return names, n + (cfg.num_nextn_predict_layers or 0)
end

-- The routed experts of a block this rank does not hold.
local function complement(own, E)
  local c = {}
  for e = 0, E - 1 do if not own[e] then c[e] = true end end
  return c
end

local function routed_names(P, e)
  return { P .. "ffn.experts." .. e .. ".w1", P .. "ffn.experts." .. e .. ".w2", P .. "ffn.experts." .. e .. ".w3" }
end

-- Tensors and bytes of the routed experts `own` (block name -> set) in ck,
-- and the bytes of those tensors this process has touched.
local function routed_bytes(ck, blocks, nb, own_of)
  local n, bytes, resident = 0, 0, 0
  for b = 0, nb - 1 do
    local P = blocks[b]
    if P then
      for e in pairs(own_of(P)) do
        if type(e) == "number" then
          for _, w in ipairs(routed_names(P, e)) do
            for _, suf in ipairs({ ".weight", ".scale" }) do
              if ck:has(w .. suf) then
                local t = ck:tensor(w .. suf)
                local tb = ck:info(w .. suf).nbytes
                n, bytes = n + 1, bytes + tb
                if lib then
                  local rb = tonumber(lib.tide_mpi_resident_bytes(t.data, tb))
                  resident = rb >= 0 and resident + rb or resident
                end
              end
            end
          end
        end
      end
    end
  end
  return n, bytes, resident
end

local function mb(x) return string.format("%.1f MB", x / 1e6) end

-- tide.model under mpirun: the opts the family's constructor takes for this
-- rank (rank 0: every tensor but the other ranks' routed experts; each MoE
-- block registered for the exchange). The followers load their experts
-- first; their reports are printed on stderr.
function M.model_opts(ck, opts)
  local L = load_lib()
  local cfg = ck.config
  local blocks, nb = block_names(ck, cfg)
  local info = { ranks = M.size, experts = cfg.n_routed_experts, blocks = blocks, n_blocks = nb, config = cfg }
  local owner, held = M.placement(opts.placement or os.getenv("TIDE_PLACEMENT"), info)
  if not owner then
    -- every rank says it (the followers then wait for rank 0's stop), and
    -- rank 0 raises
    M.control("fail\t" .. held)
    error("tide.model: " .. held, 0)
  end
  if not ck.path then error("tide.model under mpirun needs a checkpoint opened from a path", 0) end
  model_ids = model_ids + 1
  local id = model_ids
  -- the load request: model id, path, experts, then one owner line per block
  local lines = { string.format("load\t%d\t%d\t%d\t%s", id, nb, cfg.n_routed_experts, ck.path) }
  for b = 0, nb - 1 do
    lines[#lines + 1] = (blocks[b] or "-") .. "\t" .. table.concat(owner[b], ",", 0, cfg.n_routed_experts - 1)
  end
  local t0 = C.tide_time()
  M.control(table.concat(lines, "\n"))
  local index = {}
  for b = 0, nb - 1 do if blocks[b] then index[blocks[b]] = b end end
  local mine = {}
  for b = 0, nb - 1 do
    local s = { shared = true }
    for e = 0, cfg.n_routed_experts - 1 do if owner[b][e] == 0 then s[e] = true end end
    mine[b] = s
  end
  local arrays = {}
  for b = 0, nb - 1 do
    local a = ffi.new("int32_t[?]", cfg.n_routed_experts)
    for e = 0, cfg.n_routed_experts - 1 do a[e] = owner[b][e] end
    arrays[b] = a
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.experts = function(P)
    local b = index[P]
    if not b then error("tide.mpi: MoE block " .. P .. " is not in the placement", 0) end
    return mine[b]
  end
  -- each block is registered as it is built, and forgotten when it is freed;
  -- when the model's last block goes, the followers drop their experts
  local live = 0
  o.on_moe = function(P, moe)
    mcheck(L.tide_mpi_register(moe, id, index[P], arrays[index[P]], cfg.n_routed_experts), 2)
    live = live + 1
    ffi.gc(moe, function(p)
      L.tide_mpi_forget(p)
      C.tide_moe_free(p)
      live = live - 1
      if live == 0 then
        M._rank0[id] = nil
        pcall(M.control, "unload\t" .. id)
      end
    end)
  end
  o.moe_exec = L.tide_mpi_moe_forward
  -- the followers' reports (before rank 0 builds its network, so a failed
  -- load on a follower leaves nothing half done on rank 0)
  local reports = { [0] = { experts = held[0] } }
  for r = 1, M.size - 1 do
    local rep = M.reply(r)
    local f = {}
    for x in (rep .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
    if f[1] ~= "ok" then error("tide.model: rank " .. r .. ": " .. (f[2] or rep), 0) end
    reports[r] = { tensors = tonumber(f[2]), bytes = tonumber(f[3]), seconds = tonumber(f[4]), experts = tonumber(f[5]),
      shards = f[6] }
  end
  local n0, b0 = routed_bytes(ck, blocks, nb, function(P) return mine[index[P]] end)
  reports[0].tensors, reports[0].bytes, reports[0].seconds = n0, b0, C.tide_time() - t0
  M.loads[id] = reports
  if os.getenv("TIDE_MPI_QUIET") ~= "1" then
    for r = 0, M.size - 1 do
      local p = reports[r]
      io.stderr:write(string.format("tide mpi: rank %d of %d: %d routed experts over %d blocks, %d tensors, %s%s\n",
        r, M.size, p.experts, nb, p.tensors, mb(p.bytes),
        r == 0 and " (and every non-routed tensor)" or string.format(", loaded in %.3f s", p.seconds)))
    end
  end
  M._rank0 = M._rank0 or {}
  M._rank0[id] = { ck = ck, blocks = blocks, nb = nb, E = cfg.n_routed_experts,
    own = function(P) return mine[index[P]] end }
  return o
end

function M.control(text)
  mcheck(load_lib().tide_mpi_control(text, #text), 2)
end

function M.reply(from)
  mcheck(load_lib().tide_mpi_reply_recv(from, textbox, lenbox), 2)
  return ffi.string(textbox[0], lenbox[0])
end

-- Counters of the exchange on rank 0 since the last reset (tide_mpi_stats).
function M.stats()
  local s = ffi.new("tide_mpi_stats")
  mcheck(load_lib().tide_mpi_stats_get(s), 2)
  local t = {}
  for _, f in ipairs({ "calls", "tokens", "rows_local", "rows_remote", "bytes_sent", "bytes_recv", "bytes_rows",
    "t_total", "t_local", "t_shared", "t_wait", "t_combine" }) do t[f] = tonumber(s[f]) end
  return t
end

function M.stats_reset() load_lib().tide_mpi_stats_reset() end

-- Every rank's routed-expert bytes held and resident (touched), as
-- { [rank] = { tensors, bytes, resident } } for model number `id` (1: the
-- first model loaded).
function M.residency(id)
  id = id or 1
  local m = M._rank0 and M._rank0[id]
  if not m then error("tide.mpi.residency: no model " .. tostring(id), 2) end
  local out = {}
  local n, b, res = routed_bytes(m.ck, m.blocks, m.nb, m.own)
  local _, _, other = routed_bytes(m.ck, m.blocks, m.nb, function(P) return complement(m.own(P), m.E) end)
  out[0] = { tensors = n, bytes = b, resident = res, other_resident = other }
  M.control("report\t" .. id)
  for r = 1, M.size - 1 do
    local f = {}
    for x in (M.reply(r) .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
    out[r] = { tensors = tonumber(f[2]), bytes = tonumber(f[3]), resident = tonumber(f[4]),
      other_resident = tonumber(f[5]) }
  end
  return out
end

-- One process: tensors, bytes and resident bytes of every routed expert of
-- checkpoint ck (the figure the ranks' shares are compared with).
function M.local_residency(ck)
  load_lib()
  local blocks, nb = block_names(ck, ck.config)
  local all = {}
  for e = 0, ck.config.n_routed_experts - 1 do all[e] = true end
  return routed_bytes(ck, blocks, nb, function() return all end)
end

-- ---------------------------------------------------------------- followers
local function split(s, sep)
  local out = {}
  for x in (s .. sep):gmatch("(.-)" .. sep) do out[#out + 1] = x end
  return out
end

-- Load this rank's experts for a load request; returns the reply text.
local function follow_load(state, text)
  local lines = split(text, "\n")
  local h = split(lines[1], "\t")
  local id, nb, E, path = tonumber(h[2]), tonumber(h[3]), tonumber(h[4]), h[5]
  local t0 = C.tide_time()
  local ck, err = require("tide.checkpoint").load(path)
  if not ck then return "error\t" .. tostring(err) end
  local dsv4 = require("tide.models.deepseek_v4")
  local count = { n = 0, bytes = 0 }
  local held = {}
  -- a view of ck that counts the tensors the blocks take
  local proxy = {
    config = ck.config,
    has = function(_, name) return ck:has(name) end,
    tensor = function(_, name)
      count.n = count.n + 1
      count.bytes = count.bytes + ck:info(name).nbytes
      local t = ck:tensor(name)
      held[#held + 1] = t
      return t
    end,
  }
  local moes, arrays, experts = {}, {}, 0
  local names, owns = {}, {}
  local L = load_lib()
  for b = 0, nb - 1 do
    local f = split(lines[b + 2], "\t")
    local P = f[1]
    local owners = split(f[2], ",")
    if #owners ~= E then return "error\tblock " .. b .. ": " .. #owners .. " owners for " .. E .. " experts" end
    local own = { shared = false }
    local a = ffi.new("int32_t[?]", E)
    local any = false
    for e = 0, E - 1 do
      a[e] = tonumber(owners[e + 1])
      if a[e] == M.rank then own[e], any = true, true; experts = experts + 1 end
    end
    if P ~= "-" then
      names[b], owns[P] = P, own
      local ok, moe = pcall(dsv4.moe_block, proxy, ck.config, P, own)
      if not ok then return "error\t" .. tostring(moe) end
      local rc = L.tide_mpi_register(moe, id, b, a, E)
      if rc < 0 then return "error\t" .. tffi.last_error() end
      moes[b], arrays[b] = moe, a
    end
    local _ = any
  end
  state.models[id] = { ck = ck, moes = moes, arrays = arrays, held = held, count = count, names = names, nb = nb,
    owns = owns, E = E }
  return string.format("ok\t%d\t%d\t%.6f\t%d", count.n, count.bytes, C.tide_time() - t0, experts)
end

local function follow_report(state, id)
  local m = state.models[id]
  if not m then return "error\tno model " .. tostring(id) end
  local res = 0
  local L = load_lib()
  for _, t in ipairs(m.held) do
    local rb = tonumber(L.tide_mpi_resident_bytes(t.data, t:nbytes()))
    if rb > 0 then res = res + rb end
  end
  local _, _, other = routed_bytes(m.ck, m.names, m.nb, function(P) return complement(m.owns[P], m.E) end)
  return string.format("ok\t%d\t%d\t%d\t%d", m.count.n, m.count.bytes, res, other)
end

-- The expert server: answer MoE requests (in C) and control texts (here)
-- until rank 0 says stop.
function M.follow()
  local L = load_lib()
  local state = { models = {} }
  while true do
    mcheck(L.tide_mpi_follow(textbox, lenbox))
    local text = ffi.string(textbox[0], lenbox[0])
    local kind = text:match("^([^\t\n]*)")
    if kind == "stop" then break
    elseif kind == "fail" then
      io.stderr:write("tide: MPI rank " .. M.rank .. ": " .. text:sub(6) .. "\n")
    elseif kind == "load" then
      local ok, rep = pcall(follow_load, state, text)
      if not ok then rep = "error\t" .. tostring(rep) end
      if rep:match("^error") then io.stderr:write("tide: MPI rank " .. M.rank .. ": " .. rep:sub(7) .. "\n") end
      mcheck(L.tide_mpi_reply(rep, #rep))
    elseif kind == "unload" then
      local id = tonumber(text:match("\t(%d+)"))
      L.tide_mpi_unregister(id or -1)
      state.models[id or -1] = nil
      collectgarbage()
    elseif kind == "report" then
      local ok, rep = pcall(follow_report, state, tonumber(text:match("\t(%d+)")))
      if not ok then rep = "error\t" .. tostring(rep) end
      mcheck(L.tide_mpi_reply(rep, #rep))
    else
      io.stderr:write("tide: MPI rank " .. M.rank .. ": unknown control text '" .. kind .. "' from rank 0\n")
      mcheck(L.tide_mpi_reply("error", 5))
    end
  end
  L.tide_mpi_finalize()
end

return M
