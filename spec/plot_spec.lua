-- spec/plot_spec.lua -- scripts/plot: renders PNG and SVG charts from a small
-- sweep CSV with gnuplot and checks the files (PNG signature, SVG root element,
-- non-trivial size); reading concatenated CSVs; clear errors. Without gnuplot
-- the rendering specs are reported pending (scripts/setup installs it).
local sweep = require "pagedattn.sweep"

local H = require "helpers"
local root, sh, read = H.root, H.sh, H.read_file
local plot = "luajit " .. root .. "/scripts/plot"
local Q = sweep.shell_quote

local have_gnuplot = sh("command -v gnuplot >/dev/null") == 0

-- A small CSV as the runner writes it: two shard files concatenated (so the
-- header repeats), a failed point, a row cut short by a kill.
local function sample_csv(path)
  local S = sweep.define { name = "demo", measure = function() end,
    axes = { kind = { "decode", "prefill" }, context = { 512, 1024, 2048, 4096 }, page = { "none", 1, 16, 256 } } }
  local header = sweep.csv_line(S.header)
  local out = { header }
  local function row(values, status, gbps, gflops, err)
    local r = { sweep = "demo", status = status, median_s = "0.001", min_s = "0.0009", max_s = "0.0012",
                gbps = gbps, gflops = gflops, ratio = gbps and tostring(gbps / 40) or "",
                ceil_read_gbps = "40", ceil_peak_gflops = "250", device = "cpu", version = "0.1.0", error = err }
    for k, v in pairs(values) do r[k] = tostring(v) end
    local fields = {}
    for i, c in ipairs(S.header) do fields[i] = r[c] or "" end
    return sweep.csv_line(fields)
  end
  for n, pt in ipairs(S.points) do
    local v = pt.values
    if n == #S.points / 2 + 1 then out[#out + 1] = header end -- the second shard file starts
    local page = tonumber(v.page) or 0
    local rate = 30 - 4000 / v.context - (page == 1 and 3 or 0)
    if v.page == 16 and v.context == 2048 and v.kind == "decode" then
      out[#out + 1] = row(v, "error", nil, nil, "out of memory, in \"decode\"")
    else
      out[#out + 1] = row(v, "ok", rate, rate * 4)
    end
  end
  out[#out + 1] = "demo,decode,512,1,ok,0.00" -- cut short
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(out, "\n"))
  f:close()
end

describe("scripts/plot", function()
  local dir, csv
  setup(function()
    local p = io.popen("mktemp -d")
    dir = p:read("*l")
    p:close()
    csv = dir .. "/demo.csv"
    sample_csv(csv)
  end)
  teardown(function() sh("rm -rf " .. Q(dir)) end)

  local function render(args)
    local rc, out = sh(plot .. " " .. Q(csv) .. " " .. args)
    return rc, out
  end

  it("reads the concatenated CSV: repeated header skipped, the cut-short row dropped", function()
    local rows, bad = sweep.read_csv(csv)
    assert.are.equal(32, #rows)
    assert.are.equal(1, bad)
    assert.are.same({ "kind", "context", "page" }, rows[1]._axes)
  end)

  local it_gp = have_gnuplot and it or pending

  it_gp("renders a PNG: GB/s against context length per page size", function()
    local out_png = dir .. "/decode.png"
    local rc, out = render("--where kind=decode -x context -y gbps --by page --logx --ceiling -o " .. Q(out_png))
    assert.are.equal(0, rc, out)
    local data = read(out_png)
    assert.is_not_nil(data, "no file " .. out_png)
    assert.are.equal("\137PNG\r\n\26\n", data:sub(1, 8))
    assert.is_true(#data > 5000, "a suspiciously small PNG: " .. #data .. " bytes")
  end)

  it_gp("renders an SVG: TFLOP/s against context, categorical page sizes on x", function()
    local out_svg = dir .. "/prefill.svg"
    local rc, out = render("--where kind=prefill -x page -y tflops --by context --errorbars -o " .. Q(out_svg))
    assert.are.equal(0, rc, out)
    local data = read(out_svg)
    assert.is_not_nil(data, "no file " .. out_svg)
    assert.is_true(#data > 5000, "a suspiciously small SVG: " .. #data .. " bytes")
    local root_tag = data:gsub("<%?xml.-%?>", "", 1):gsub("<!%-%-.-%-%->", ""):match("^%s*<(%w+)")
    assert.are.equal("svg", root_tag)
    assert.matches("</svg>%s*$", data)
    assert.matches("unpaged", data, 1, true) -- page "none" is labelled as the baseline
    assert.matches("TFLOP/s", data, 1, true)
  end)

  it_gp("names a default output after the CSV and the y column", function()
    local rc, out = render("--where kind=decode -x context -y ratio --by page")
    assert.are.equal(0, rc, out)
    assert.are.equal(dir .. "/demo-ratio.png", out:match("[^\n]+"))
    assert.are.equal("\137PNG", read(dir .. "/demo-ratio.png"):sub(1, 4))
  end)

  it("says which column tells apart rows that land on one spot", function()
    local rc, out = render("-x context -y gbps --by page -o " .. Q(dir .. "/x.png"))
    assert.are_not.equal(0, rc)
    assert.matches("differ in kind %(decode vs prefill%)", out)
  end)

  it("says when a column is missing", function()
    local rc, out = render("-x context -y nope -o " .. Q(dir .. "/y.png"))
    assert.are_not.equal(0, rc)
    assert.matches("no column 'nope'", out, 1, true)
  end)
end)

-- Decode rows as the runner writes them: page (none, 1, 16, 256) x context, the
-- shape heads 32, head_dim 128, a device, and timed repeats whose median is
-- 2 ms, quartiles 1.5 and 2.5 ms, extremes 1 and 4 ms. `old`: without the
-- q1_s, q3_s columns, as files written before they existed.
local function shaped_csv(path, old)
  local cols = { "sweep", "heads", "head_dim", "context", "page", "status", "median_s", "min_s", "max_s" }
  if not old then cols[#cols + 1] = "q1_s" cols[#cols + 1] = "q3_s" end
  for _, c in ipairs({ "spread", "repeats", "gbps", "gflops", "bound", "ratio", "ceil_read_gbps",
                       "ceil_peak_gflops", "ceil_peak_kind", "device", "device_desc", "version", "host",
                       "finished", "error" }) do cols[#cols + 1] = c end
  local out = { sweep.csv_line(cols) }
  for _, context in ipairs({ 1024, 4096 }) do
    for _, page in ipairs({ "none", 1, 16, 256 }) do
      local r = { sweep = "shaped", heads = "32", head_dim = "128", context = tostring(context),
                  page = tostring(page), status = "ok", median_s = "0.002", min_s = "0.001", max_s = "0.004",
                  q1_s = "0.0015", q3_s = "0.0025", spread = "0.5", repeats = "9",
                  gbps = tostring(context / 100 + (tonumber(page) or 0) / 10), gflops = "1", bound = "memory",
                  device = "cpu", device_desc = "Test CPU, 2 threads" }
      local fields = {}
      for i, c in ipairs(cols) do fields[i] = r[c] or "" end
      out[#out + 1] = sweep.csv_line(fields)
    end
  end
  H.write_file(path, table.concat(out, "\n") .. "\n")
end

-- The gnuplot script scripts/plot wrote for `args` (--keep-script), and its data rows by series.
local function plot_script(csv, args)
  local rc, out = sh(plot .. " " .. Q(csv) .. " --keep-script " .. args)
  assert.are.equal(0, rc, out)
  local path = out:match("gnuplot script: (%S+)")
  assert.is_not_nil(path, out)
  local text = read(path)
  os.remove(path)
  local series, cur = {}, nil
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do
    if l:match("^%$s%d+ << EOD$") then cur = {} series[#series + 1] = cur
    elseif l == "EOD" then cur = nil
    elseif cur then
      if l == "" then cur[#cur + 1] = "break"
      else
        local x, y, lo, hi = l:match("^(%S+) (%S+) (%S+) (%S+)$")
        cur[#cur + 1] = { x = tonumber(x), y = tonumber(y), lo = tonumber(lo), hi = tonumber(hi) }
      end
    end
  end
  return text, series
end

describe("scripts/plot charts", function()
  local dir, csv, old_csv
  setup(function()
    dir = H.tmpdir()
    csv, old_csv = dir .. "/shaped.csv", dir .. "/old.csv"
    shaped_csv(csv)
    shaped_csv(old_csv, true)
  end)
  teardown(function() sh("rm -rf " .. Q(dir)) end)

  local it_gp = have_gnuplot and it or pending

  it_gp("draw a category such as page 'none' apart from the numeric x axis, not on its line", function()
    local text, series = plot_script(csv, "-x page -y gbps --by context --logx -o " .. Q(dir .. "/p.png"))
    assert.are.equal(2, #series)
    for _, s in ipairs(series) do
      -- the unpaged point, a break in the line, then the page sizes at their own values
      assert.are.equal(5, #s)
      assert.are.equal("break", s[2])
      assert.is_true(s[1].x < 1, "the category sits left of the smallest page: " .. s[1].x)
      assert.are.same({ 1, 16, 256 }, { s[3].x, s[4].x, s[5].x })
    end
    assert.matches('set logscale x 2', text, 1, true)
    assert.matches('"unpaged" ' .. string.format("%.10g", series[1][1].x), text, 1, true)
  end)

  it_gp("draw the interquartile range as error bars, also from CSVs without the quartile columns", function()
    for _, path in ipairs({ csv, old_csv }) do
      for _, y in ipairs({ "gbps", "ms" }) do
        local _, series = plot_script(path, "-x context -y " .. y .. " --by page --errorbars -o " .. Q(dir .. "/e.png"))
        for _, s in ipairs(series) do
          for _, p in ipairs(s) do
            -- median 2 ms, quartiles 1.5 and 2.5 ms: a rate spans med/q3 .. med/q1, a time q1/med .. q3/med
            local lo, hi = 2 / 2.5, 2 / 1.5
            if y == "ms" then lo, hi = 1.5 / 2, 2.5 / 2 end
            assert.near(lo, p.lo / p.y, 1e-6, path .. " " .. y)
            assert.near(hi, p.hi / p.y, 1e-6, path .. " " .. y)
          end
        end
      end
    end
  end)

  it_gp("name the device and the shape under the title", function()
    local text = plot_script(csv, "-x context -y gbps --by page --title 'decode' -o " .. Q(dir .. "/t.png"))
    local title = text:match('\nset title "([^\n]*)"\n')
    assert.are.equal("decode\\ncpu (Test CPU, 2 threads)\\nheads 32, head_dim 128", title)
    local svg = dir .. "/t.svg"
    local rc, out = sh(plot .. " " .. Q(csv) .. " -x page -y gbps --by context -o " .. Q(svg))
    assert.are.equal(0, rc, out)
    local data = read(svg)
    assert.matches("Test CPU, 2 threads", data, 1, true)
    assert.matches("heads 32, head_dim 128", data, 1, true)
  end)

  it("--help names every option its parser accepts", function()
    local sources = { read(root .. "/scripts/plot") or "", read(root .. "/lua/pagedattn/sweep/plot_cli.lua") or "" }
    local flags, seen = {}, {}
    for _, src in ipairs(sources) do
      for lit in src:gmatch('"(%-%-?[%a][%w-]*)"') do
        if not seen[lit] then
          seen[lit] = true
          local _, out = sh(string.format("%s %s -x a -y b %s 2 -o %s", plot, Q(dir .. "/none.csv"), lit,
            Q(dir .. "/h.png")))
          if not out:find("unknown option", 1, true) then flags[#flags + 1] = lit end
        end
      end
    end
    assert.is_true(#flags >= 15, "found only " .. #flags .. " options: " .. table.concat(flags, " "))
    local rc, help = sh(plot .. " --help")
    assert.are.equal(0, rc, help)
    local missing = {}
    for _, flag in ipairs(flags) do
      if not help:find(flag:gsub("%-", "%%-") .. "%f[^%w-]") then missing[#missing + 1] = flag end
    end
    table.sort(missing)
    assert.are.same({}, missing)
  end)
end)
