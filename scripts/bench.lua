-- scripts/bench.lua [--quick] [--decode | --prefill] [--ceiling-seconds S] [--head-dim D] --
-- CUDA decode and rotary append against the GPU's streaming-read rate, and
-- prefill against its bf16 matmul rate (cuBLAS), measured in the same run
-- (docs/design.md workloads: bf16, 32 query / 8 kv heads, head dim 128; page 16 in
-- random page order, page 256, and contiguous caches).
--   decode: GB/s = bytes of K/V read (decode) or of k/v read + written
--   (append) per second of kernel time.
--   prefill: TFLOP/s = 4 * H * D flops per attended (query, key) pair (the
--   causal mask's pairs counted exactly) per second of kernel time; "x short"
--   and "x sust" are the ratios to the matmul's short (cool GPU) and
--   sustained (power cap) rates; "page 16 vs unpaged" is the slowdown of the
--   paged cache. Each workload's three layouts run in four alternating
--   rounds (--quick: two), the fastest kept (the GPU's clock drifts within a
--   run).
--   Kernel time: device events around each call's kernels, with the call's
--   kernels held until all are queued (pa_device_timing), median of many
--   calls after warm-up. "wall" is the whole call seen from Lua (validation,
--   launches, the held stream, the wait for the kernels) for comparison;
--   "loop" (decode) is the time per call of a loop of calls queued back to
--   back and one wait at the end, as a serving loop calls: near the kernel
--   time when the host does not wait for the device within a call.
--   --decode / --prefill: only that section (default both); --quick: fewer
--   calls, shorter ceilings; --ceiling-seconds S: how long each ceiling runs;
--   --head-dim 64|256: the same workloads at another head dim (default 128).
--   --configs "decode_kpw=8|decode_wide=0,decode_hw=0": extra runs of the
--   page-16 decode workloads with those tuning fields set (pagedattn.tuning;
--   "-": as it is), each config's rows tagged with it; "kernel_dir=/tmp/k2"
--   compares kernel sources in one process;
--   --config-layouts 16,256,0: the layouts of those runs (page sizes, 0
--   unpaged; default 16);
--   --prefill-configs: the same for the page-16 prefill workloads;
--   --append-configs: the same for the rotary append rows (and the fp8 64x512 row);
--   --decode-workloads 8x16384,8x65536: more page-16 decode workloads (B x
--   keys), in the main table and in every config's run (fits of time against
--   bytes: a fixed cost per call and a streaming rate); a workload
--   "64x4096+512x64" is one batch of both (mixed lengths, shuffled).
--   FP8 caches (issue 49): after each decode workload's bf16 rows, the same at
--   page 16 over fp8_e4m3 and fp8_e5m2 caches (GB/s count fp8 bytes; "x bf16"
--   lines: tokens a second against the page-16 bf16 row), the rotary append
--   writing fp8 (bytes: bf16 k/v read, fp8 written), and each prefill
--   workload at page 16 over an e4m3 cache (TFLOP/s against bf16's);
--   --no-fp8 leaves them out.
--   scripts/run scripts/bench.lua
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep" -- shared: decode_batch, make_cache, stats
local tuning = require "pagedattn.tuning"

local quick, only, ceiling_seconds, head_dim = false, nil, nil, 128
local fp8 = true
local configs = { decode = {}, prefill = {}, append = {} }
local config_layouts_text, decode_workloads_text = "16", ""
local usage = "usage: scripts/run scripts/bench.lua [--quick] [--decode | --prefill] [--ceiling-seconds S] " ..
  "[--head-dim D] [--configs C] [--prefill-configs C] [--append-configs C] [--config-layouts 16,256,0] " ..
  "[--decode-workloads BxL,...] [--no-fp8]"
do
  local i = 1
  while i <= #arg do
    local a = arg[i]
    if a == "--quick" then quick = true
    elseif a == "--no-fp8" then fp8 = false
    elseif a == "--decode" or a == "--prefill" then
      if only and only ~= a:sub(3) then only = "both" else only = a:sub(3) end
    elseif a == "--ceiling-seconds" then
      i = i + 1
      ceiling_seconds = tonumber(arg[i])
      if not ceiling_seconds or ceiling_seconds <= 0 then
        io.stderr:write("bench: --ceiling-seconds needs a number > 0\n")
        os.exit(2)
      end
    elseif a == "--head-dim" then
      i = i + 1
      head_dim = tonumber(arg[i])
      if head_dim ~= 64 and head_dim ~= 128 and head_dim ~= 256 then
        io.stderr:write("bench: --head-dim takes 64, 128 or 256\n")
        os.exit(2)
      end
    elseif a == "--configs" or a == "--prefill-configs" or a == "--append-configs" then
      i = i + 1
      local ok, list = pcall(tuning.parse_configs, arg[i])
      if not ok or #list == 0 then
        io.stderr:write("bench: ", a, ": ", ok and "no config" or tostring(list), "\n")
        os.exit(2)
      end
      configs[a == "--configs" and "decode" or a == "--prefill-configs" and "prefill" or "append"] = list
    elseif a == "--config-layouts" then
      i = i + 1
      config_layouts_text = arg[i] or ""
    elseif a == "--decode-workloads" then
      i = i + 1
      decode_workloads_text = arg[i] or ""
    elseif a == "--help" or a == "-h" then
      print(usage)
      os.exit(0)
    else
      io.stderr:write("bench: unknown argument '" .. a .. "' (--help)\n")
      os.exit(2)
    end
    i = i + 1
  end
end
local run_decode = only == nil or only == "both" or only == "decode"
local run_prefill = only == nil or only == "both" or only == "prefill"

local dev, err = pa.device("cuda")
if not dev then
  print("bench: no CUDA device: " .. tostring(err))
  os.exit(0)
end
local C, ctx = core.C, core.ctx
local secs = ffi.new("double[1]")

-- Median kernel seconds and median wall seconds of fn over `iters` calls
-- (fewer when `budget` seconds of calls have passed, but at least 3).
local function time_calls(fn, iters, budget)
  assert(C.pa_device_timing(ctx, dev.handle, 1) == 0, core.last_error())
  for _ = 1, 3 do fn() end -- warm-up: compilation, module load, scratch
  local kt, wt = {}, {}
  local start = pa.clock()
  for i = 1, iters do
    local t0 = pa.clock()
    fn()
    assert(C.pa_device_timing_last(ctx, dev.handle, secs) == 0, core.last_error()) -- waits
    wt[i] = pa.clock() - t0
    kt[i] = secs[0]
    if budget and i >= 3 and pa.clock() - start > budget then break end
  end
  assert(C.pa_device_timing(ctx, dev.handle, 0) == 0)
  return sweep.stats(kt).median, sweep.stats(wt).median, kt
end

-- Seconds per call of `iters` calls queued back to back (timing off), then one wait.
local function loop_calls(fn, iters)
  collectgarbage() -- (a tensor collected mid-loop would wait for the device)
  for _ = 1, 3 do fn() end -- (untimed: what the first calls after the timed ones pay once)
  dev:synchronize()
  local t0 = pa.clock()
  for _ = 1, iters do fn() end
  dev:synchronize()
  return (pa.clock() - t0) / iters
end

-- Untimed calls of `call` for `seconds` (default 0.15, before each row is
-- timed; the settling before a table takes longer): freeing the last
-- row's caches (tens of GB for the mixed batches) slows the GPU for tens of
-- ms (a 16 x 4096 + 256 x 256 call right after a 32 x 4096 + 1024 x 128 row:
-- 931-956 us timed against 152-154 before it, H200; docs/measuring.md).
local function steady(call, seconds)
  local t0 = pa.clock()
  repeat loop_calls(call, 5) until pa.clock() - t0 >= (seconds or 0.15)
end

-- Runs fn once per tuning config of `list` (tuning.parse_configs), with its
-- fields set on the device; fn gets the config's text.
local function with_configs(list, fn)
  for _, c in ipairs(list) do
    dev:with_tuning(c.fields, fn, c.name)
  end
end

local H, HK, D, DT = 32, 8, head_dim, "bf16"
local ESZ = 2

-- K/V caches for B sequences of L keys: paged (random page order) or contiguous (page 0).
local function make_cache(B, L, page)
  return sweep.make_cache(pa, dev, B, L, HK, D, page, DT)
end

local function layout(page) return page == 0 and "unpaged" or ("page " .. page) end

print(string.format("pagedattn %s bench on %s%s", pa.version, dev.description, D ~= 128 and (", head dim " .. D) or ""))
local ceil = assert(dev:ceilings(ceiling_seconds or (quick and 0.3 or 1.0)))
local read = ceil.read_gbps
local mm_short, mm_sust = ceil.matmul_gflops / 1e3, ceil.matmul_sustained_gflops / 1e3 -- TFLOP/s
local function ceiling_lines()
  local lines = {
    string.format("ceilings: streaming read %.1f GB/s; device copy %.1f GB/s (read + write); read/copy %.3f",
      ceil.read_gbps, ceil.copy_gbps, ceil.read_gbps / ceil.copy_gbps),
  }
  if mm_short > 0 then
    lines[#lines + 1] = string.format("          bf16 matmul %.1f TFLOP/s short, %.1f TFLOP/s sustained (%.3f)",
      mm_short, mm_sust, mm_sust / mm_short)
  else
    lines[#lines + 1] = "          bf16 matmul: none (prefill ratios are '-')"
  end
  if ceil.matmul_note then lines[#lines + 1] = "          matmul: " .. ceil.matmul_note end
  return lines
end
for _, l in ipairs(ceiling_lines()) do print(l) end

---------------------------------------------------------------------------
-- decode and rotary append: memory-bound, judged by GB/s over the read rate

local decode_rows = {}
local decode_header = string.format("%-34s %-10s %8s %10s %9s %7s %10s %10s", "workload", "layout", "GB",
  "kernel us", "GB/s", "x read", "wall us", "loop us")
-- A row whose timed calls took longer than its loop of the same calls (which
-- adds the host's time, never removes the kernel's) ran in a slow state of
-- the GPU that comes and goes (docs/measuring.md): marked, rerun it.
local function decode_row(name, lay, bytes, kernel_s, wall_s, loop_s)
  local gbps = bytes / kernel_s / 1e9
  local r = string.format("%-34s %-10s %8.3f %10.1f %9.1f %7.3f %10.1f %10.1f%s", name, lay, bytes / 1e9,
    kernel_s * 1e6, gbps, gbps / read, wall_s * 1e6, loop_s * 1e6,
    kernel_s > 1.08 * loop_s and "  (unsteady: kernel > loop)" or "")
  decode_rows[#decode_rows + 1] = r
  print(r)
  io.stdout:flush()
end

local iters = quick and 10 or 40
local config_layouts = {}
for p in config_layouts_text:gmatch("%d+") do
  config_layouts[#config_layouts + 1] = tonumber(p)
end
-- A decode workload from its name, "64x4096" (B sequences x L keys) or
-- "64x4096+512x64" (one batch of both; sweep.decode_batch)
local function workload(name)
  return name:find("%d+x%d+") and { name = name } or nil
end
local workloads = { workload("64x4096"), workload("8x32768"), workload("256x1024") }
-- the page-16 workloads of the sweeps: these and --decode-workloads
local extra_workloads, page16_workloads = {}, { unpack(workloads) }
for w in decode_workloads_text:gmatch("[%dx+]+") do
  local wl = workload(w)
  if wl then
    extra_workloads[#extra_workloads + 1] = wl
    page16_workloads[#page16_workloads + 1] = wl
  end
end

-- One decode call of workload wl at `page` (its tensors live as long as
-- the function), and the bytes of K/V it reads; kv: the caches' dtype (nil: DT)
local function decode_call(wl, page, kv)
  local call, _, bytes = sweep.decode_batch(pa, dev, wl.name, { H = H, Hk = HK, D = D, dtype = DT, page = page,
    kv_dtype = kv, k_scale = kv and 0.5 or nil, v_scale = kv and 0.25 or nil })
  return call, bytes
end

local function decode(wl, page, label, kv)
  local call, bytes = decode_call(wl, page, kv)
  steady(call)
  local k, w = time_calls(call, iters)
  decode_row("decode " .. wl.name .. (kv and (" " .. kv) or "") .. (label or ""), layout(page), bytes, k, w,
    loop_calls(call, iters))
  call = nil
  collectgarbage()
  collectgarbage()
  return k
end
local fp8_notes = {} -- fp8 against bf16, same run

-- rotary append: B sequences x n new tokens (k rotated, k and v written into
-- their pages), no queries
local function append(B, n, page, tag, kv)
  local call, _, _, bytes = sweep.append_batch(pa, dev, B, n, { H = H, Hk = HK, D = D, dtype = DT, page = page,
    kv_dtype = kv })
  steady(call)
  local kt, w = time_calls(call, iters)
  decode_row(string.format("rotary append %dx%d tokens%s%s", B, n, kv and (" -> " .. kv) or "", tag or ""), layout(page),
    bytes, kt, w, loop_calls(call, iters))
  collectgarbage()
  return kt
end

-- Untimed calls of a decode workload for `seconds`, in batches queued back
-- to back: the first point after the ceilings read 3-6 % below the same
-- point measured later in every run (docs/measuring.md), the
-- device still settling after the sustained matmul.
local function settle(wl, page, seconds)
  local call = decode_call(wl, page)
  steady(call, seconds)
  call = nil
  collectgarbage()
  collectgarbage()
end

if run_decode then
  local settle_s = quick and 0.1 or 0.5
  settle(workloads[1], 16, settle_s)
  print()
  print(string.format("(decode: %.1f s of untimed calls of the first workload before the table)", settle_s))
  print(decode_header)
  for _, wl in ipairs(workloads) do
    local t16
    for _, page in ipairs({ 16, 256, 0 }) do
      local k = decode(wl, page)
      t16 = t16 or k
    end
    if fp8 then
      for _, kv in ipairs({ "fp8_e4m3", "fp8_e5m2" }) do
        local k = decode(wl, 16, nil, kv)
        fp8_notes[#fp8_notes + 1] = string.format("decode %s page 16, %s: x %.2f bf16's tokens/s", wl.name, kv, t16 / k)
      end
    end
  end
  for _, wl in ipairs(extra_workloads) do decode(wl, 16) end
  local a1, a2 = append(64, 512, 16), append(256, 1, 16)
  if fp8 then
    local f1, f2 = append(64, 512, 16, nil, "fp8_e4m3"), append(256, 1, 16, nil, "fp8_e4m3")
    fp8_notes[#fp8_notes + 1] = string.format("rotary append writing fp8_e4m3: 64x512 %.1f us (bf16 %.1f), " ..
      "256x1 %.1f us (bf16 %.1f)", f1 * 1e6, a1 * 1e6, f2 * 1e6, a2 * 1e6)
  end
  with_configs(configs.append, function(config)
    append(64, 512, 16, " [" .. config .. "]")
    append(256, 1, 16, " [" .. config .. "]")
    if fp8 then append(64, 512, 16, " [" .. config .. "]", "fp8_e4m3") end
  end)
  -- tuning sweeps
  with_configs(configs.decode, function(config)
    for _, wl in ipairs(page16_workloads) do
      for _, page in ipairs(config_layouts) do decode(wl, page, " [" .. config .. "]") end
    end
  end)
end

---------------------------------------------------------------------------
-- prefill and chunked prefill: compute-bound, judged by TFLOP/s over the
-- matmul's rates. q is given whole and k/v are already in the cache (no
-- append): cache_seqlens = all keys, causal bottom-right aligned.

-- (query, key) pairs a causal (bottom-right aligned) or full mask lets
-- through: query i of Sq sees keys j <= i + Sk - Sq.
local function attended_pairs(Sq, Sk, causal)
  if not causal then return Sq * Sk end
  local n = 0
  local first = Sk - Sq + 1 -- keys seen by query 0
  if first >= 1 then
    n = Sq * (first - 1) + Sq * (Sq + 1) / 2
  else -- more queries than keys: the first -first + 1 queries see nothing
    local seeing = Sq + first - 1
    n = seeing * (seeing + 1) / 2
  end
  return n
end

local prefill_rows, prefill_notes = {}, {}
local prefill_header = string.format("%-40s %-10s %8s %10s %9s %8s %8s %10s", "workload", "layout", "TFLOP",
  "kernel ms", "TFLOP/s", "x short", "x sust", "wall ms")
local function ratio(x, c) return c > 0 and string.format("%8.3f", x / c) or string.format("%8s", "-") end
local function prefill_row(name, lay, flops, kernel_s, wall_s)
  local tflops = flops / kernel_s / 1e12
  local r = string.format("%-40s %-10s %8.3f %10.3f %9.1f %s %s %10.3f", name, lay, flops / 1e12,
    kernel_s * 1e3, tflops, ratio(tflops, mm_short), ratio(tflops, mm_sust), wall_s * 1e3)
  prefill_rows[#prefill_rows + 1] = r
  print(r)
  io.stdout:flush()
end

local prefill_workloads = {
  { name = "prefill 8192 causal, batch 1", B = 1, Sq = 8192, Sk = 8192 },
  { name = "prefill 4 x 2048 causal", B = 4, Sq = 2048, Sk = 2048 },
  { name = "chunked prefill 4 x 1024 new on 8192", B = 4, Sq = 1024, Sk = 9216 },
}
local prefill_iters = quick and 5 or 20
local prefill_budget = quick and 1.5 or 4 -- seconds of timed calls per point, at most

local function prefill_flops(wl) return 4.0 * H * D * wl.B * attended_pairs(wl.Sq, wl.Sk, true) end

-- Kernel and wall seconds of one prefill workload at one layout (untimed
-- calls instead, for `settle_s` seconds, when given); kv: the caches' dtype
local function prefill_time(wl, page, settle_s, kv)
  local kc, vc, bt = sweep.make_cache(pa, dev, wl.B, wl.Sk, HK, D, page, kv or DT)
  local q = assert(pa.randn({ wl.B, wl.Sq, H, D }, DT, dev, 3))
  local out = assert(pa.tensor({ wl.B, wl.Sq, H, D }, DT, dev))
  local opts = { block_table = bt, cache_seqlens = wl.Sk, causal = true, out = out, k_scale = kv and 0.5 or nil,
    v_scale = kv and 0.25 or nil }
  local call = function() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
  local k, w
  if settle_s then
    steady(call, settle_s)
  else
    k, w = time_calls(call, prefill_iters, prefill_budget)
  end
  kc, vc, bt, q, out, call = nil, nil, nil, nil, nil, nil
  collectgarbage()
  collectgarbage()
  return k, w
end

-- One row: a workload at one layout.
local function prefill(wl, page, label)
  local k, w = prefill_time(wl, page)
  prefill_row(wl.name .. (label or ""), layout(page), prefill_flops(wl), k, w)
  return k
end

if run_prefill then
  -- The GPU comes from the sustained matmul at its power cap: the first
  -- prefill points read up to 20 % low (8192 causal page 16 at 462-474
  -- against 532-562 later in the same run; docs/measuring.md). So
  -- untimed calls first, and each workload's layouts measured in alternating
  -- rounds (16, 256, unpaged, 16, 256, unpaged, ...), the fastest kept: the
  -- page-16 vs unpaged ratio is then not the order's. Four rounds: with two,
  -- that ratio still moved by +-4 % between runs (+4.6 % in the bench
  -- where ncu's medians of the same kernels gave +1.2 %).
  local settle_s = quick and 0.2 or 1.0
  local rounds = quick and 2 or 4
  prefill_time(prefill_workloads[1], 16, settle_s)
  print()
  print(string.format("(prefill: %.1f s of untimed calls of the first workload before the table; each layout's " ..
    "kernel time the best of %d alternating rounds)", settle_s, rounds))
  print(prefill_header)
  for _, wl in ipairs(prefill_workloads) do
    local t, wt = {}, {}
    for _ = 1, rounds do
      for _, page in ipairs({ 16, 256, 0 }) do
        local k, w = prefill_time(wl, page)
        if not t[page] or k < t[page] then t[page], wt[page] = k, w end
      end
    end
    for _, page in ipairs({ 16, 256, 0 }) do
      prefill_row(wl.name, layout(page), prefill_flops(wl), t[page], wt[page])
    end
    local note = string.format("%-40s page 16 vs unpaged: %+.1f %% kernel time (target <= +3 %%); page 256: %+.1f %%",
      wl.name, (t[16] / t[0] - 1) * 100, (t[256] / t[0] - 1) * 100)
    prefill_notes[#prefill_notes + 1] = note
    print(note)
    if fp8 then
      -- (the default: the Hopper kernels over a 16-bit copy of the keys where
      -- they apply; and mma.sync over the fp8 bytes, prefill_fp8 = 0)
      local k, w = prefill_time(wl, 16, nil, "fp8_e4m3")
      prefill_row(wl.name .. " fp8_e4m3", layout(16), prefill_flops(wl), k, w)
      local note = string.format("%s page 16, fp8_e4m3 cache: x %.2f bf16's TFLOP/s", wl.name, t[16] / k)
      local km, wm = dev:with_tuning({ prefill_fp8 = 0 }, function() return prefill_time(wl, 16, nil, "fp8_e4m3") end)
      prefill_row(wl.name .. " fp8_e4m3 mma", layout(16), prefill_flops(wl), km, wm)
      note = note .. string.format(" (prefill_fp8 = 0, mma.sync over the fp8 bytes: x %.2f)", t[16] / km)
      -- prefill_fp8 = 2: Q and P in e4m3 on the fp8 tensor cores (prefill_f8;
      -- its error: scripts/lab/prefill_f8_error.lua, docs/fp8.md)
      local ok8, k8, w8 = pcall(dev.with_tuning, dev, { prefill_fp8 = 2 }, function()
        return prefill_time(wl, 16, nil, "fp8_e4m3")
      end)
      if ok8 and (dev:last_plan() or ""):find("| pa_prefill_f8 ", 1, true) then
        prefill_row(wl.name .. " fp8_e4m3 f8", layout(16), prefill_flops(wl), k8, w8)
        note = note .. string.format("; prefill_fp8 = 2, Q and P in e4m3: x %.2f", t[16] / k8)
      else
        note = note .. "; prefill_fp8 = 2: not applied" .. (ok8 and "" or " (" .. tostring(k8) .. ")")
      end
      -- prefill_fp8 = 3: prefill_ws widening the fp8 pages in the block (no copy)
      local okw, kw, ww = pcall(dev.with_tuning, dev, { prefill_fp8 = 3 }, function()
        return prefill_time(wl, 16, nil, "fp8_e4m3")
      end)
      if okw and (dev:last_plan() or ""):find("prefill_ws [^\n]*kv=fp8_e4m3") then
        prefill_row(wl.name .. " fp8_e4m3 ws8", layout(16), prefill_flops(wl), kw, ww)
        note = note .. string.format("; prefill_fp8 = 3, widened in the block: x %.2f", t[16] / kw)
      else
        note = note .. "; prefill_fp8 = 3: not applied" .. (okw and "" or " (" .. tostring(kw) .. ")")
      end
      fp8_notes[#fp8_notes + 1] = note
    end
  end
  with_configs(configs.prefill, function(config)
    for _, wl in ipairs(prefill_workloads) do prefill(wl, 16, " [" .. config .. "]") end
  end)

  -- One attention_varlen call over a mixed batch (issue 5, item 3): 4 chunks
  -- of 512 new queries onto 4096 cached keys next to 64 decodes of 4096
  -- keys, page 16, against the same two parts called alone. The library
  -- sends each part to its kernel, one after the other on the stream: the
  -- mixed call should cost the sum of the parts, no more.
  local NP, CH, CTX, ND = 4, 512, 4096, 64
  local NB = NP + ND
  local kc, vc, bt_all = make_cache(NB, CTX + CH, 16)
  local per = math.ceil((CTX + CH) / 16)
  local ids = bt_all:to_table() -- its pages in random order; each part takes its sequences' rows
  -- a varlen call over sequences first .. last (1-based) of the batch
  local function part(first, last)
    local cu, used, rows, total = { 0 }, {}, {}, 0
    for b = first, last do
      local nq = b <= NP and CH or 1
      total = total + nq
      cu[#cu + 1] = total
      used[#used + 1] = CTX + (b <= NP and CH or 0)
      for j = 1, per do rows[#rows + 1] = ids[(b - 1) * per + j] end
    end
    local q = assert(pa.randn({ total, H, D }, DT, dev, 5))
    local o = {
      cu_seqlens_q = assert(pa.from_table(cu, { #cu }, "i32", dev)),
      seqused_k = assert(pa.from_table(used, { #used }, "i32", dev)),
      block_table = assert(pa.from_table(rows, { last - first + 1, per }, "i32", dev)),
      max_seqlen_q = first <= NP and CH or 1, causal = true,
      out = assert(pa.tensor({ total, H, D }, DT, dev)),
    }
    return function() assert(pa.attention_varlen(q, kc, vc, o)) end
  end
  local t_mix = time_calls(part(1, NB), prefill_iters, prefill_budget)
  local t_pre = time_calls(part(1, NP), prefill_iters, prefill_budget)
  local t_dec = time_calls(part(NP + 1, NB), prefill_iters, prefill_budget)
  local pre_flops = 4.0 * H * D * NP * attended_pairs(CH, CTX + CH, true)
  local dec_bytes = 2.0 * ND * CTX * HK * D * ESZ
  local note = string.format("mixed varlen batch (%d x %d new on %d keys + %d decodes of %d keys, page 16): " ..
    "%.1f us; parts alone %.1f us (prefill, %.1f TFLOP/s) + %.1f us (decode, %.3f x read) = %.1f us; mixed / sum %.3f",
    NP, CH, CTX, ND, CTX, t_mix * 1e6, t_pre * 1e6, pre_flops / t_pre / 1e12, t_dec * 1e6,
    dec_bytes / t_dec / 1e9 / read, (t_pre + t_dec) * 1e6, t_mix / (t_pre + t_dec))
  prefill_notes[#prefill_notes + 1] = note
  print(note)
  kc, vc = nil, nil
  collectgarbage()
end

print()
print("summary (kernel time; x read = GB/s over the streaming-read rate of this run; x short / x sust =")
print("TFLOP/s over the bf16 matmul's short / sustained rate of this run)")
for _, l in ipairs(ceiling_lines()) do print(l) end
if run_decode then
  print(decode_header)
  for _, r in ipairs(decode_rows) do print(r) end
end
if run_prefill then
  print(prefill_header)
  for _, r in ipairs(prefill_rows) do print(r) end
  for _, r in ipairs(prefill_notes) do print(r) end
end
if #fp8_notes > 0 then
  print("fp8 caches against bf16 (same run; targets, H200: decode >= 0.95 x read counting fp8 bytes, ~1.9x bf16's")
  print("tokens/s; prefill >= bf16's TFLOP/s; rotary append writing fp8 >= 0.8 x read):")
  for _, r in ipairs(fp8_notes) do print(r) end
end
