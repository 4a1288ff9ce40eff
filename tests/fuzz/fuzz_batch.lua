-- fuzz_batch: a `tide batch` request line (every line of the input, as the
-- command splits it): parsed as the command parses it, and when accepted,
-- submitted to an engine on the fuzz model and cancelled (submit checks
-- what parsing cannot: token ids against the vocabulary, sizes against the
-- cache). A refused line is fine; what crashes, aborts or leaks is not.
local common = require("fuzz_common")
local batch = require("tide.cli.batch")
local args = require("tide.cli.args")
common.no_sampler_files()
local model = common.model()
local eng = require("tide").engine(model, { budget = 64 })
local defaults = args.parse({ "--model", "m", "--input", "i" }, batch.spec, "batch")

return function(data)
  for line in data:gmatch("[^\n]+") do
    local req = batch.parse_line(line, defaults, {}, model.tokenizer)
    if req then
      local ok, h = pcall(eng.submit, eng, req)
      if ok and h then h:cancel() end
    end
  end
  if eng:active() ~= 0 then fuzz_fail("a cancelled request is still active") end
end
