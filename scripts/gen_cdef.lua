-- gen_cdef.lua HEADER OUT.c: turn tide.h into a C file that embeds the
-- declarations LuaJIT's ffi.cdef needs (returned by tide_cdef()), and the
-- layout of every struct in them as the C compiler sees it (tide_abi_layout(),
-- which the specs compare with ffi.sizeof/ffi.offsetof).
-- Only the text between TIDE_CDEF_BEGIN and TIDE_CDEF_END is used; quoted
-- #include lines there are followed; comments and preprocessor lines dropped.
local header, out = arg[1], arg[2]
assert(header and out, "usage: gen_cdef.lua tide.h out.c")

local dir = header:match("^(.*)/[^/]*$") or "."

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function strip_comments(s)
  s = s:gsub("/%*.-%*/", function(c)
    local _, n = c:gsub("\n", "")
    return string.rep("\n", n)
  end)
  return (s:gsub("//[^\n]*", ""))
end

local function expand(path, depth)
  assert(depth < 8, "include nesting too deep at " .. path)
  local lines = {}
  for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do
    local inc = line:match('^%s*#%s*include%s+"([^"]+)"')
    if inc then
      lines[#lines + 1] = expand(dir .. "/" .. inc, depth + 1)
    elseif not line:match("^%s*#") then
      lines[#lines + 1] = line
    end
  end
  return table.concat(lines, "\n")
end

local text = read(header)
local body = text:match("/%* TIDE_CDEF_BEGIN %*/(.-)/%* TIDE_CDEF_END %*/")
assert(body, "markers TIDE_CDEF_BEGIN/END not found in " .. header)
-- Write the body to a temporary expansion: includes are resolved relative to
-- the main header's directory.
local parts = {}
for line in (body .. "\n"):gmatch("([^\n]*)\n") do
  local inc = line:match('^%s*#%s*include%s+"([^"]+)"')
  if inc then
    parts[#parts + 1] = expand(dir .. "/" .. inc, 1)
  elseif not line:match("^%s*#") then
    parts[#parts + 1] = line
  end
end
local cdef = strip_comments(table.concat(parts, "\n"))
-- the section headers wrap their bodies in include guards and extern "C"; drop
-- any stray preprocessor text and collapse blank runs
cdef = cdef:gsub("\n%s*\n+", "\n")

local lits = {}
for line in (cdef .. "\n"):gmatch("([^\n]*)\n") do
  if line:match("%S") then
    lits[#lits + 1] = '  "' .. line:gsub("\\", "\\\\"):gsub('"', '\\"') .. '\\n"'
  end
end

-- ---- struct layouts ----------------------------------------------------
-- Find `typedef struct|union [tag] { ... } NAME;` and `struct|union tag { ... };`
-- at the top level and list their members. A parse this cannot follow fails
-- the build (the generated offsetof() would not compile), never silently.
local function split_top(src, sepchar)
  -- split on sepchar outside (), [] and {}
  local pieces, depth, cur = {}, 0, {}
  for ch in src:gmatch(".") do
    if ch == "(" or ch == "[" or ch == "{" then depth = depth + 1
    elseif ch == ")" or ch == "]" or ch == "}" then depth = depth - 1 end
    if ch == sepchar and depth == 0 then
      pieces[#pieces + 1] = table.concat(cur)
      cur = {}
    else
      cur[#cur + 1] = ch
    end
  end
  pieces[#pieces + 1] = table.concat(cur)
  return pieces
end

local function declarator_name(d)
  local fp = d:match("%(%s*%*%s*([%a_][%w_]*)%s*%)")
  if fp then return fp, false end
  local flex = d:match("%[%s*%]%s*$") ~= nil
  d = d:gsub("%b[]", "")
  return d:match("([%a_][%w_]*)%s*$"), flex
end

local members_of
-- members of one struct body: list of {name, flex}
members_of = function(struct_body, list)
  for _, decl in ipairs(split_top(struct_body, ";")) do
    decl = decl:gsub("^%s+", ""):gsub("%s+$", "")
    if decl ~= "" then
      local inner_kw, inner, after = decl:match("^(%a+)[^{]-(%b{})(.*)$")
      if inner_kw == "struct" or inner_kw == "union" then
        after = after:gsub("^%s+", "")
        if after == "" then
          members_of(inner:sub(2, -2), list)  -- anonymous: its members belong to us
        else
          for _, d in ipairs(split_top(after, ",")) do
            local name, flex = declarator_name(d)
            if name then list[#list + 1] = { name = name, flex = flex } end
          end
        end
      elseif not decl:match("^%s*enum%s") or decl:find("[%w_]%s*$") then
        if decl:match("^%s*enum%s[^{]*%b{}") then decl = decl:gsub("%b{}", "") end
        for k, d in ipairs(split_top(decl, ",")) do
          if not d:find(":") then -- bit-fields have no offsetof
            local name, flex = declarator_name(k == 1 and d or (" " .. d))
            if name then list[#list + 1] = { name = name, flex = flex } end
          end
        end
      end
    end
  end
  return list
end

local structs = {}
do
  local pos = 1
  while true do
    local s, e, kw = cdef:find("%f[%w_](struct)%f[^%w_]", pos)
    local su, eu = cdef:find("%f[%w_](union)%f[^%w_]", pos)
    if su and (not s or su < s) then s, e, kw = su, eu, "union" end
    if not s then break end
    local before = cdef:sub(1, s - 1)
    local is_typedef = before:match("typedef%s*$") ~= nil
    local tag, lb = cdef:match("^%s*([%a_][%w_]*)%s*()%{", e + 1)
    if not tag then lb = cdef:match("^%s*()%{", e + 1) end
    -- only top-level definitions (depth 0 braces before s)
    local _, opens = before:gsub("{", "")
    local _, closes = before:gsub("}", "")
    if lb and opens == closes then
      local sbody = cdef:match("^%b{}", lb)
      local after = cdef:sub(lb + #sbody)
      local name
      if is_typedef then
        name = after:match("^%s*([%a_][%w_]*)%s*;")
      elseif tag then
        name = kw .. " " .. tag
      end
      if name then
        structs[#structs + 1] = { name = name, members = members_of(sbody:sub(2, -2), {}) }
      end
      pos = lb + #sbody
    else
      pos = e + 1
    end
  end
end

local rows = {}
for _, st in ipairs(structs) do
  local t = st.name
  rows[#rows + 1] = string.format('  {"%s", NULL, 0, (int64_t)sizeof(%s), (int64_t)_Alignof(%s)},', t, t, t)
  for _, m in ipairs(st.members) do
    rows[#rows + 1] = string.format('  {"%s", "%s", (int64_t)offsetof(%s, %s), %s, 0},', t, m.name, t, m.name,
      m.flex and "-1" or string.format("(int64_t)sizeof(((%s *)0)->%s)", t, m.name))
  end
end

local f = assert(io.open(out, "wb"))
f:write("/* generated by scripts/gen_cdef.lua from tide.h: do not edit */\n")
f:write("#include <stddef.h>\n#include \"", header:match("[^/]*$"), "\"\n")
f:write("static const char tide_cdef_text[] =\n")
f:write(table.concat(lits, "\n"), ";\n")
f:write("const char *tide_cdef(void) { return tide_cdef_text; }\n")
f:write("static const tide_abi_row tide_abi_rows[] = {\n", table.concat(rows, "\n"), "\n};\n")
f:write("const tide_abi_row *tide_abi_layout(int *n) {\n",
  "  if (n) *n = (int)(sizeof tide_abi_rows / sizeof tide_abi_rows[0]);\n",
  "  return tide_abi_rows;\n}\n")
f:close()
