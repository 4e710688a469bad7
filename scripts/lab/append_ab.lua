-- scripts/lab/append_ab.lua "CFG|CFG|..." [WORKLOADS] [ROUNDS] -- an A/B of
-- rotary append kernels or settings in one process, on the bench's append
-- workload (bf16 k/v of 8 kv heads x 128 into a page-16 cache in random page
-- order, GPT-NeoX rotary, no queries; scripts/bench.lua's "rotary append"
-- rows). A CFG is field=value settings of the device's tuning separated by
-- commas ("-" for none; pagedattn.tuning), e.g.
-- "-|nvrtc_options=-DPA_APPEND_MINB=4". WORKLOADS: B x n new tokens, comma
-- separated (default 64x512,256x1). ROUNDS: default 3. PAGEDATTN_AB_KV: the
-- caches' dtype (default fp8_e4m3; bf16, fp8_e5m2). Each round runs every
-- workload under every config in turn: 0.05 s of untimed calls, then the
-- median of 15 timed calls (device events around the call's kernels), 1 ms
-- of sleep after each. Prints each round's median, the median of the
-- rounds, GB/s (k/v read in bf16, written in the cache's dtype) and whether
-- the config's cache bytes equal the first config's. Two libraries (a
-- change of the host's side too): run it once per library, alternating,
-- with PAGEDATTN_LIB. On the GPU machine:
--   . .gpu-deps/env.sh && . scripts/env.sh
--   luajit scripts/lab/append_ab.lua "-|nvrtc_options=-DPA_APPEND_MINB=4" 64x512 3
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local sweep = require "pagedattn.sweep"
local ab = require "scripts.lab.ab"

local H, HK, D, DT = 32, 8, 128, "bf16"
local KV = os.getenv("PAGEDATTN_AB_KV") or "fp8_e4m3"

ab.run({
  tool = "append_ab",
  title = ", caches " .. KV,
  workloads = "64x512,256x1",
  make = function(dev, name)
    local B, n = name:match("^(%d+)x(%d+)$")
    assert(B, "append_ab: a workload is BxN: '" .. name .. "'")
    local call, kc, vc, bytes = sweep.append_batch(pa, dev, tonumber(B), tonumber(n),
      { H = H, Hk = HK, D = D, dtype = DT, page = 16, kv_dtype = KV })
    return { kc = kc, vc = vc, bytes = bytes, call = call }
  end,
  -- a checksum of the caches' contents after the call into zeroed caches
  -- (they are up to 2 GiB, past what a Lua string holds; a read waits for
  -- the device's stream)
  look = function(wl)
    wl.kc:fill(0)
    wl.vc:fill(0)
    wl.call()
    local acc = ffi.new("uint64_t", 0)
    for _, t in ipairs({ wl.kc, wl.vc }) do
      local buf = ffi.new("uint8_t[?]", t.nbytes + 8)
      assert(core.C.pa_tensor_read(core.ctx, t.handle, 0, buf, t.numel) == 0, core.last_error())
      local w = ffi.cast("const uint64_t *", buf)
      for i = 0, math.floor(t.nbytes / 8) - 1 do acc = acc * 1099511628211ULL + w[i] end
    end
    return tostring(acc)
  end,
  compare = function(sum, first) return sum == first end,
  row = function(w, cfg, med, rounds, same, wl)
    return string.format("%-10s %-8s %-40s %8.1f us %7.1f GB/s  [%s]  bytes %s", w, KV, cfg:sub(1, 40), med * 1e6,
      wl.bytes / med / 1e9, rounds, same and "same" or "DIFFER")
  end,
})
