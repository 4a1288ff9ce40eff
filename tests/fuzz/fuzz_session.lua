-- fuzz_session: session files (tide.session_load). The input is written to
-- a file and loaded into the fuzz model; a loaded session is then used (one
-- token generated, the last exchange undone) and closed. A file refused
-- with a message is fine; a crash, an abort, a sanitizer report or a leak
-- is not.
local common = require("fuzz_common")
local ffi = require("ffi")
pcall(ffi.cdef, "int getpid(void);")
common.no_sampler_files()
local model = common.model("tiny")
local path = (os.getenv("TMPDIR") or "/tmp") .. "/tide-fuzz-session-" .. ffi.C.getpid() .. ".tsess"

return function(data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  local s = require("tide").session_load(model, path, { print = false, stream = false })
  if not s then return end
  local ok, err = pcall(function()
    if s:len() > 0 then s:generate{ max_tokens = 1, stream = false } end
    s:undo()
  end)
  s:close()
  if not ok then error(err, 0) end
end
