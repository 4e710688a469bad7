-- examples/sweep_page_size.lua -- does a small page cost anything? Decode and
-- prefill with pages of 1, 8, 16, 32, 64 and 256 tokens against an unpaged
-- (contiguous) cache, on whichever device is there; then two charts.
--
--   scripts/run examples/sweep_page_size.lua                 # ~2 minutes on 2 CPU cores
--   scripts/run examples/sweep_page_size.lua --preset large  # bigger sizes (CPU)
--   scripts/run examples/sweep_page_size.lua --device cuda   # the reference workload (GPU preset)
--
-- Writes results/page_size.csv (resumed when rerun: only missing points run),
-- results/page_size-decode.png and results/page_size-prefill.png (the
-- interquartile range of the repeats as error bars, the device and the shape
-- under the title). Every option of scripts/sweep.lua works here (--set,
-- --shard, --emit-jobs, ...); --svg draws SVG instead of PNG.
-- Shape: bf16, 32 query heads, 8 kv heads, head dim 128, pages in random order.
local sweep = require "pagedattn.sweep"

local PAGES = { "none", 1, 8, 16, 32, 64, 256 }

-- decode: `batch` sequences of `contexts` keys; prefill: causal, `seqlens` tokens
local function points(decode_batch, contexts, prefill_batch, seqlens)
  local shape = { heads = 32, kv_heads = 8, head_dim = 128, dtype = "bf16" }
  local function with_shape(axes)
    for k, v in pairs(shape) do axes[k] = v end
    return axes
  end
  return sweep.concat(
    sweep.product(with_shape { kind = "decode", batch = decode_batch, context = contexts, seqlen = 1,
                               page = PAGES }),
    sweep.product(with_shape { kind = "prefill", batch = prefill_batch, context = 0, seqlen = seqlens,
                               page = PAGES }))
end

local def = {
  name = "page_size",
  measure = sweep.attention, -- decode or prefill by the point's kind
  budget = 0.25,             -- seconds of timed repeats per point, after one warm-up call
  presets = {
    small = { points = points(4, { 512, 1024, 2048, 4096, 8192 }, 1, { 128, 256, 512, 1024 }) },
    large = { points = points(8, { 1024, 4096, 16384, 32768 }, 1, { 512, 1024, 2048, 4096 }), budget = 1 },
    -- docs/design.md's reference workload
    gpu = { points = points(64, { 1024, 4096, 16384, 32768 }, 1, { 1024, 2048, 4096, 8192 }), budget = 1 },
  },
  -- the sizes follow the device unless --preset says otherwise
  default_preset = function(dev) return dev.kind == "cuda" and "gpu" or "small" end,
}

-- scripts/sweep.lua loading this file (e.g. for jobs from --emit-jobs) only wants the table
if sweep.loading then return def end

-- run directly: our own flag, then the runner's
local argv, svg = {}, false
for _, a in ipairs(arg) do
  if a == "--svg" then svg = true else argv[#argv + 1] = a end
end
local r = sweep.main(argv, def, arg[0], "  --svg                draw the charts as SVG instead of PNG\n")
if not r.ran then os.exit(r.code) end
if r.summary.selected < r.summary.total then
  -- a shard or a subset: charts come from the merged CSV
  io.stderr:write("(no charts for a subset; run again without --shard/--point to draw them)\n")
  os.exit(r.code)
end

-- charts, and page size x against unpaged at the largest size
local csv = r.csv
local base = csv:gsub("%.csv$", "")
local ext = svg and ".svg" or ".png"
local onGPU = r.summary.sweep.preset == "gpu"
local charts = {
  { kind = "decode", x = "context", y = "gbps", title = "decode: GB/s of K/V read against context length" },
  { kind = "prefill", x = "seqlen", y = onGPU and "tflops" or "gflops",
    title = "causal prefill: " .. (onGPU and "TFLOP/s" or "GFLOP/s") .. " against sequence length" },
}
for _, c in ipairs(charts) do
  local out, err = sweep.plot {
    csv = csv, where = { kind = c.kind }, x = c.x, y = c.y, by = "page", logx = 2,
    ceiling = true, errorbars = true, title = c.title, output = base .. "-" .. c.kind .. ext,
  }
  print(out and ("chart: " .. out) or ("no chart: " .. err))
end

-- rate at each page size over the unpaged rate, at the largest size of each kind
local rows = sweep.read_csv(csv)
local best = {}
for _, row in ipairs(rows) do
  if row.sweep == "page_size" and row.status == "ok" then
    local size = tonumber(row.kind == "decode" and row.context or row.seqlen)
    local rate = tonumber(row.kind == "decode" and row.gbps or row.gflops)
    local b = best[row.kind]
    if not b or size > b.size then b = { size = size, rate = {} } best[row.kind] = b end
    if size == b.size then b.rate[row.page] = rate end
  end
end
for _, kind in ipairs({ "decode", "prefill" }) do
  local b = best[kind]
  if b and b.rate.none then
    local parts = {}
    for _, p in ipairs(PAGES) do
      local v = b.rate[tostring(p)]
      if v and p ~= "none" then parts[#parts + 1] = string.format("%s: %.2f", p, v / b.rate.none) end
    end
    print(string.format("%s at %s %d, rate over unpaged by page size: %s", kind,
      kind == "decode" and "context" or "seqlen", b.size, table.concat(parts, ", ")))
  end
end
os.exit(r.code)
