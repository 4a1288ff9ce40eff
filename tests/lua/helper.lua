-- busted helper: make `require "tide"` work whether the specs run inside the
-- tide executable or under plain luajit from the repository root.
package.path = "./lua/?.lua;./lua/?/init.lua;./tests/lua/?.lua;" .. package.path
if not os.getenv("TIDE_LIB") then
  local b = os.getenv("TIDE_BUILD_DIR") or "./build"
  -- tide.ffi looks for build/libtide.so next to lua/ by itself; only an
  -- out-of-tree build dir needs telling
  local f = io.open(b .. "/libtide.so", "rb")
  if f then f:close() end
end
