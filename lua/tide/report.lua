-- tide.report: self-contained HTML pages with inline SVG pictures (no
-- scripts, no fonts or styles from the network): what the sampler lab
-- (tide.lab) writes with --report. Small drawing helpers (horizontal bars,
-- per-step lines and bars, heatmaps) and a page assembler.
local M = {}

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;",
    ["'"] = "&#39;" }))
end
M.esc = esc

local function f(x) return string.format("%.2f", x) end

-- Horizontal bars: items = { {label =, value = 0..1, note =, mark = bool}, ... }.
-- opts.title, opts.width (px), opts.max (the value of a full bar, default 1).
function M.bars(items, opts)
  opts = opts or {}
  local W, lw, rw, bh = opts.width or 360, 110, 52, 16
  local bw = W - lw - rw
  local H = 22 + #items * (bh + 4) + 4
  local max = opts.max or 1
  local out = { string.format('<svg class="bars" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
    .. 'viewBox="0 0 %d %d" role="img">', W, H, W, H) }
  out[#out + 1] = string.format('<text x="0" y="14" class="t">%s</text>', esc(opts.title or ""))
  for i, it in ipairs(items) do
    local y = 22 + (i - 1) * (bh + 4)
    local w = math.max(0, math.min(1, (it.value or 0) / max)) * bw
    out[#out + 1] = string.format('<text x="%d" y="%s" class="l" text-anchor="end">%s</text>', lw - 6,
      f(y + bh - 4), esc(it.label))
    out[#out + 1] = string.format('<rect x="%d" y="%d" width="%s" height="%d" class="%s"><title>%s</title></rect>',
      lw, y, f(math.max(w, 0.5)), bh, it.mark and "bar mark" or "bar", esc(it.note or ""))
    out[#out + 1] = string.format('<text x="%s" y="%s" class="v">%.3f</text>', f(lw + w + 4), f(y + bh - 4),
      it.value or 0)
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n")
end

-- Lines over steps: series = { {name =, values = {...}, class =}, ... }.
-- opts.title, opts.ylabel, opts.width, opts.height, opts.ymax, opts.log (log10 y).
function M.lines(series, opts)
  opts = opts or {}
  local W, H = opts.width or 420, opts.height or 180
  local L, R, T, B = 44, 10, 24, 26
  local n, ymax = 1, opts.ymax or 0
  for _, s in ipairs(series) do
    n = math.max(n, #s.values)
    for _, v in ipairs(s.values) do
      local y = opts.log and math.log10(1 + v) or v
      if y == y and y > ymax then ymax = y end
    end
  end
  if ymax <= 0 then ymax = 1 end
  local function X(i) return L + (n > 1 and (i - 1) / (n - 1) or 0.5) * (W - L - R) end
  local function Y(v)
    local y = opts.log and math.log10(1 + v) or v
    return T + (1 - y / ymax) * (H - T - B)
  end
  local out = { string.format('<svg class="lines" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
    .. 'viewBox="0 0 %d %d" role="img">', W, H, W, H) }
  out[#out + 1] = string.format('<text x="0" y="14" class="t">%s</text>', esc(opts.title or ""))
  out[#out + 1] = string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>', L, H - B, W - R, H - B)
  out[#out + 1] = string.format('<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>', L, T, L, H - B)
  local top = opts.log and (10 ^ ymax - 1) or ymax
  out[#out + 1] = string.format('<text x="%d" y="%d" class="a" text-anchor="end">%s</text>', L - 4, T + 4,
    string.format(top >= 100 and "%.0f" or "%.2f", top))
  out[#out + 1] = string.format('<text x="%d" y="%d" class="a" text-anchor="end">0</text>', L - 4, H - B)
  out[#out + 1] = string.format('<text x="%d" y="%d" class="a">step 1..%d</text>', L, H - 8, n)
  if opts.ylabel then
    out[#out + 1] = string.format('<text x="%d" y="%d" class="a" text-anchor="end">%s</text>', W - R, T - 2,
      esc(opts.ylabel))
  end
  for k, s in ipairs(series) do
    local pts = {}
    for i, v in ipairs(s.values) do
      if v == v then pts[#pts + 1] = f(X(i)) .. "," .. f(Y(v)) end
    end
    local cls = s.class or ("s" .. k)
    out[#out + 1] = string.format('<polyline points="%s" class="line %s"/>', table.concat(pts, " "), cls)
    for i, v in ipairs(s.values) do
      if v == v then
        out[#out + 1] = string.format('<circle cx="%s" cy="%s" r="2.5" class="dot %s"><title>%s step %d: %.4g'
          .. '</title></circle>', f(X(i)), f(Y(v)), cls, esc(s.name), i, v)
      end
    end
    out[#out + 1] = string.format('<text x="%d" y="%d" class="k %s">%s</text>', W - R - 150, T + 12 + (k - 1) * 13,
      cls, esc(s.name))
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n")
end

-- A heatmap: rows x cols values in 0..max (opts.max, default the largest).
-- opts.title, opts.row_label(i), opts.col_label(j), opts.cell (px).
function M.heatmap(values, opts)
  opts = opts or {}
  local rows = #values
  local cols = 0
  local max = opts.max or 0
  for _, r in ipairs(values) do
    cols = math.max(cols, #r)
    if not opts.max then for _, v in ipairs(r) do if v == v and v > max then max = v end end end
  end
  if max <= 0 then max = 1 end
  local cell = opts.cell or math.max(4, math.min(24, math.floor(720 / math.max(cols, 1))))
  local L, T = 56, 24
  local W, H = math.max(L + cols * cell + 8, 260), T + rows * cell + 20
  -- label every row when rows are tall enough for the text, else every k-th
  local every = math.ceil(12 / cell)
  local out = { string.format('<svg class="heat" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
    .. 'viewBox="0 0 %d %d" role="img">', W, H, W, H) }
  out[#out + 1] = string.format('<text x="0" y="14" class="t">%s</text>', esc(opts.title or ""))
  for i, r in ipairs(values) do
    local y = T + (i - 1) * cell
    if (i - 1) % every == 0 then
      out[#out + 1] = string.format('<text x="%d" y="%s" class="a" text-anchor="end">%s</text>', L - 4,
        f(y + math.max(cell, 10) * 0.75), esc(opts.row_label and opts.row_label(i) or tostring(i - 1)))
    end
    for j = 1, cols do
      local v = r[j]
      local a = (v and v == v) and math.max(0, math.min(1, v / max)) or 0
      -- white to deep blue; missing values grey
      local col = (v and v == v) and string.format("rgb(%d,%d,%d)", math.floor(255 - 225 * a),
        math.floor(255 - 170 * a), math.floor(255 - 60 * a)) or "#ddd"
      out[#out + 1] = string.format('<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s, %s: %s'
        .. '</title></rect>', L + (j - 1) * cell, y, cell - 1, cell - 1, col,
        esc(opts.row_label and opts.row_label(i) or ("row " .. (i - 1))),
        esc(opts.col_label and opts.col_label(j) or ("col " .. (j - 1))),
        (v and v == v) and string.format("%.3f", v) or "-")
    end
  end
  out[#out + 1] = string.format('<text x="%d" y="%d" class="a">%s; white 0, darkest %s</text>', L, H - 4,
    esc(opts.xlabel or string.format("0..%d", cols - 1)), string.format("%.3g", max))
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n")
end

local CSS = [[
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
.meta { color: #555; font-family: monospace; white-space: pre-wrap; }
.cols { display: grid; grid-template-columns: repeat(auto-fit, minmax(380px, 1fr)); gap: 16px; }
.chain { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; }
.chain h3 { font-size: 15px; margin: 4px 0 8px; font-family: monospace; }
svg { display: block; margin: 6px 0; }
svg text { font: 11px monospace; fill: #333; } svg .t { font: bold 12px sans-serif; }
.bar { fill: #4a7bd0; } .bar.mark { fill: #d0694a; } .axis { stroke: #888; }
svg polyline.line { fill: none; stroke-width: 1.6; }
.s1 { stroke: #4a7bd0; fill: #4a7bd0; } .s2 { stroke: #d0694a; fill: #d0694a; }
.s3 { stroke: #3a9a5a; fill: #3a9a5a; } svg text.k { font: 11px sans-serif; stroke: none; }
.tok { font-family: monospace; white-space: pre-wrap; padding: 1px 0; border-radius: 2px; }
.gen { line-height: 1.9; }
]]

-- A page: sections = { {title =, html =}, ... }.
function M.page(title, meta, sections)
  local out = { "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
    "<title>" .. esc(title) .. "</title>", "<style>" .. CSS .. "</style></head><body>",
    "<h1>" .. esc(title) .. "</h1>" }
  if meta then out[#out + 1] = '<div class="meta">' .. esc(meta) .. "</div>" end
  for _, s in ipairs(sections) do
    out[#out + 1] = "<h2>" .. esc(s.title) .. "</h2>"
    out[#out + 1] = s.html
  end
  out[#out + 1] = "</body></html>"
  return table.concat(out, "\n") .. "\n"
end

function M.write(path, html)
  local fh, err = io.open(path, "wb")
  if not fh then return nil, "cannot write the report " .. tostring(err) end
  fh:write(html)
  fh:close()
  return true
end

return M
