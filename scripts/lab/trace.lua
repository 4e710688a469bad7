-- scripts/lab/trace.lua -- what the kernel timelines share
-- (decode_timeline.lua, prefill_timeline.lua): the CUDA device, the patched
-- kernel directory (TRACE_DIR), a call's event time with the normal and the
-- patched kernel, and the %globaltimer stamps the patched kernel writes into
-- `out` (a u64 as 8 bf16 values, one byte each, least significant first).
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"

local M = {}
M.dev = assert(pa.device("cuda"))
M.dir = os.getenv("TRACE_DIR") or error("TRACE_DIR: the patched kernel directory (see the top of the script)")
local C, ctx = core.C, core.ctx
local secs = ffi.new("double[1]")

-- Median device-event time of n calls, after 3 untimed ones.
function M.evt_time(call, n)
  assert(C.pa_device_timing(ctx, M.dev.handle, 1) == 0)
  for _ = 1, 3 do call() end
  local t = {}
  for i = 1, n do
    call()
    assert(C.pa_device_timing_last(ctx, M.dev.handle, secs) == 0)
    t[i] = secs[0]
  end
  assert(C.pa_device_timing(ctx, M.dev.handle, 0) == 0)
  table.sort(t)
  return t[math.floor(n / 2) + 1]
end

-- The call's event time with the normal and with the patched kernel (n calls
-- each), then one call of the patched kernel into `out`, zeroed first: its
-- stamps. Returns both times.
function M.run(call, out, n)
  local tn = M.evt_time(call, n)
  local tt
  M.dev:with_tuning({ kernel_dir = M.dir }, function()
    tt = M.evt_time(call, n)
    out:fill(0)
    M.dev:synchronize()
    call()
    M.dev:synchronize()
  end)
  return tn, tt
end

-- The u64 stamp at element `base` (0-based) of v, out's values read as a Lua array.
function M.u64(v, base)
  local x = 0
  for j = 7, 0, -1 do x = x * 256 + v[base + j + 1] end
  return x
end

-- The p-quantile of a sorted array.
function M.pct(a, p) return a[math.max(1, math.min(#a, math.floor(p * #a + 0.5)))] end

return M
