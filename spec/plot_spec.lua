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
