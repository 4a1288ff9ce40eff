-- tide.ffi: load libtide and its declarations. The declarations come from the
-- library itself (tide_cdef(), generated from tide.h at build time), so the
-- binding can never drift from the C it calls.
local ffi = require("ffi")

local M = { ffi = ffi }

local function file_exists(p)
  local f = io.open(p, "rb")
  if f then f:close() return true end
  return false
end

local function this_dir()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then
    return src:sub(2):match("^(.*)/[^/]*$") or "."
  end
  return "."
end

-- Where is libtide.so? Inside the `tide` command it is already loaded (the
-- executable links it). Otherwise: $TIDE_LIB, then build/ next to lua/.
local function find_library()
  local exe = rawget(_G, "_TIDE_EXE")
  if exe and exe.lib_path and file_exists(exe.lib_path) then return exe.lib_path end
  local env = os.getenv("TIDE_LIB")
  if env and env ~= "" then return env end
  local root = this_dir() .. "/../.."
  for _, cand in ipairs({ root .. "/build/libtide.so", "./build/libtide.so" }) do
    if file_exists(cand) then return cand end
  end
  return "tide"
end

M.lib_path = find_library()

-- How long an idle OpenMP thread spins before it sleeps. libgomp reads its
-- environment once, when it is loaded, which is here (libtide brings it in).
-- Its default spin (300,000 iterations, milliseconds on current CPUs) is
-- right on a machine that does nothing else; on a shared one, a thread that
-- spins while its partner waits for a core turns every parallel region into
-- a scheduler time slice, and decode on 2 threads ran 3-5x slower than
-- with short spins (docs/design.md, "Threads on a shared machine"). A user's
-- OMP_WAIT_POLICY or GOMP_SPINCOUNT always wins.
M.DEFAULT_SPINCOUNT = "10000" -- keep equal to TIDE_DEFAULT_SPINCOUNT in engine/cli/main.c
if (os.getenv("OMP_WAIT_POLICY") or "") == "" and (os.getenv("GOMP_SPINCOUNT") or "") == "" then
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
  pcall(function() ffi.C.setenv("GOMP_SPINCOUNT", M.DEFAULT_SPINCOUNT, 0) end)
end

local ok, lib = pcall(ffi.load, M.lib_path)
if not ok then
  error("tide: cannot load the C library (" .. tostring(lib) .. "); build it with `make build` or set TIDE_LIB", 0)
end
M.C = lib

local declared = pcall(ffi.typeof, "tide_tensor")
if not declared then
  ffi.cdef("const char *tide_cdef(void);")
  local text = ffi.string(lib.tide_cdef())
  text = text:gsub("const char %*tide_cdef%(void%);\n", "")
  ffi.cdef(text)
end

-- Turn a failing status into a Lua error that carries tide's message.
-- `level` follows error(): 2 = the caller of the function that called check.
function M.check(rc, level)
  if rc < 0 then
    error(ffi.string(lib.tide_last_error()), (level or 1) + 1)
  end
  return rc
end

-- Return `nil, message` for a failing status (runtime failures: a missing
-- file, a full cache), or rc itself.
function M.result(rc)
  if rc < 0 then return nil, ffi.string(lib.tide_last_error()) end
  return rc
end

function M.last_error()
  return ffi.string(lib.tide_last_error())
end

return M
