-- luacheck configuration for tide (`make lint`). Code runs under LuaJIT.
std = "luajit"
max_line_length = 120
-- the tide executable sets these before any module runs
read_globals = { "_TIDE_EXE" }
files["tests/lua"] = { std = "+busted" }
-- scripts run inside `tide`, where `tide` is a global
files["scripts"] = { read_globals = { "tide" } }
exclude_files = { "build", "build-*" }
-- DeepSeek's chat markers are 3 bytes per character: literal transcripts run past 120 bytes
files["tests/lua/chat_spec.lua"] = { max_line_length = 200 }
