-- testmodels: generated checkpoints shared by the specs. A model is made once
-- per build (under $TIDE_TEST_TMP/models/NAME) by scripts/make_checkpoint.lua
-- with the given options; concurrent spec processes generate into private
-- directories and rename into place, so nobody sees a half-written model.
local M = {}

local ROOT = os.getenv("TIDE_SOURCE_DIR") or "."
local EXE = os.getenv("TIDE_EXE") or "./build/tide"
local TMP = (os.getenv("TIDE_TEST_TMP") or "/tmp") .. "/models"
M.ROOT, M.EXE, M.TMP = ROOT, EXE, TMP

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
M.q = q

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

-- Run a shell command: its output (stdout and stderr) and exit status
-- (LuaJIT's popen close does not return the status, so the shell prints it).
function M.sh(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return (out:gsub("__rc=%d+%s*$", "")), rc or 1
end

-- The directory of model `name` made with make_checkpoint arguments `args`.
function M.get(name, args)
  local dir = TMP .. "/" .. name
  if exists(dir .. "/config.json") then return dir end
  os.execute("mkdir -p " .. q(TMP))
  local tmp = dir .. ".tmp" .. tostring(os.time()) .. math.random(1e9)
  local parts = { q(EXE), q(ROOT .. "/scripts/make_checkpoint.lua"), "--quiet", "--out", q(tmp) }
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  local out, rc = M.sh(table.concat(parts, " "))
  if rc ~= 0 then error("make_checkpoint failed: " .. out) end
  -- first one wins; a loser's copy is identical (deterministic) and removed
  if not os.rename(tmp, dir) then os.execute("rm -rf " .. q(tmp)) end
  return dir
end

-- Deterministic token ids in [0, vocab).
function M.tokens(n, vocab, seed)
  local t = {}
  local x = seed or 12345
  for i = 1, n do
    x = (x * 1103515245 + 12345) % 2147483648
    t[i] = x % vocab
  end
  return t
end

return M
