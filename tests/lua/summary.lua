-- busted output handler: the usual plain-terminal report, then one last line
-- "N passed, N failed, N skipped" that CI and make test understand.
return function(options)
  local busted = require("busted")
  local handler = require("busted.outputHandlers.plainTerminal")(options)
  busted.subscribe({ "suite", "end" }, function()
    local passed, failed = #handler.successes, #handler.failures + #handler.errors
    io.write(string.format("%d passed, %d failed, %d skipped\n", passed, failed, #handler.pendings))
    io.flush()
    return nil, true
  end)
  return handler
end
