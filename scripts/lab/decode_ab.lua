-- scripts/lab/decode_ab.lua "CFG|CFG|..." [WORKLOADS] [ROUNDS] -- an A/B of
-- decode kernels or settings in one process (docs/measuring.md: the
-- method of every decode A/B). A CFG is field=value settings of the
-- device's tuning separated by commas ("-" for none; pagedattn.tuning),
-- e.g. "-|decode_wide=0|kernel_dir=/tmp/k_old".
-- WORKLOADS: B x L, comma separated (default 256x1024,128x2048,64x4096);
-- a "+" joins two into one batch (64x4096+512x64); a suffix "/s" makes the
-- pages sequential, "/u" the cache unpaged (else page 16 in random order).
-- ROUNDS: default 3. PAGEDATTN_AB_KV: the caches' dtype (default bf16, as
-- q; fp8_e4m3, fp8_e5m2). Each round runs every workload under every config in
-- turn: 0.05 s of untimed calls, then the median of 15 timed calls (device
-- events around the call's kernels) with 1 ms of sleep after each (calls
-- back to back drove some boards to their power limit: 250 -> 275 us over
-- seconds, docs/measuring.md). The table gives each round's
-- median, the median of the rounds, and max |d| of each config's output
-- against the first config's, each written over NaN (bit-for-bit changes
-- say 0, an unwritten output inf; a config that should change nothing and
-- does is caught here). On the GPU machine:
--   . .gpu-deps/env.sh && . scripts/env.sh
--   luajit scripts/lab/decode_ab.lua "-|decode_kpw=8" 256x1024,64x4096
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local ref = require "pagedattn.reference"
local ab = require "scripts.lab.ab"

local H, HK, D, DT = 32, 8, 128, "bf16"
local KV = os.getenv("PAGEDATTN_AB_KV")

ab.run({
  tool = "decode_ab",
  workloads = "256x1024,128x2048,64x4096",
  -- A workload ("BxL[+BxL...]", a suffix /s: sequential pages, /u: unpaged):
  -- its call (its tensors live as long as it) and its out tensor.
  make = function(dev, name)
    local spec, mode = name:match("^([%dx+]+)/?(%a?)$")
    assert(spec, "decode_ab: a workload is BxL[+BxL][/s|/u]: '" .. name .. "'")
    local call, out = sweep.decode_batch(pa, dev, spec, { H = H, Hk = HK, D = D, dtype = DT, kv_dtype = KV,
      page = mode == "u" and 0 or 16, order = mode == "s" and "sequential" or nil })
    return { out = out, call = call }
  end,
  look = function(wl)
    wl.out:fill(0 / 0) -- (an output the config leaves unwritten shows as NaN)
    wl.call()
    return wl.out:to_table()
  end,
  compare = function(o, first) return ref.max_abs_diff(o, first) end,
  row = function(w, cfg, med, rounds, d)
    return string.format("%-22s %-44s %8.1f  [%s]  max|d| %.3g", w, cfg:sub(1, 44), med * 1e6, rounds, d)
  end,
})
