-- scripts/bench.lua: what `make bench` runs. Every scripts/bench_*.lua in
-- turn (or those named on the command line: tide scripts/bench.lua attn).
-- Each prints its own table with ratios against limits measured in the same run.
local dir = (arg[0]:match("^(.*)/[^/]*$") or ".")
local names = {}
if #arg > 0 then
  for i = 1, #arg do names[#names + 1] = "bench_" .. arg[i]:gsub("^bench_", ""):gsub("%.lua$", "") .. ".lua" end
else
  local p = io.popen('ls "' .. dir .. '" 2>/dev/null')
  for f in p:lines() do
    if f:match("^bench_[%w_]+%.lua$") then names[#names + 1] = f end
  end
  p:close()
  table.sort(names)
end
local failed = 0
for _, f in ipairs(names) do
  print(("=== %s ==="):format(f))
  local chunk, err = loadfile(dir .. "/" .. f)
  if not chunk then
    print("cannot load: " .. err)
    failed = failed + 1
  else
    local saved = arg
    _G.arg = { [0] = dir .. "/" .. f }
    local ok, e = xpcall(chunk, debug.traceback)
    _G.arg = saved
    if not ok then
      print("failed: " .. tostring(e))
      failed = failed + 1
    end
  end
  io.stdout:flush()
end
os.exit(failed == 0 and 0 or 1)
