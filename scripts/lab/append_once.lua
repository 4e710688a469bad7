-- scripts/lab/append_once.lua [CACHE_DTYPE] -- a few rotary appends and nothing
-- else, for a profiler: the bench's workload (64 sequences x 512 new tokens,
-- bf16, 8 kv heads, head dim 128, GPT-NeoX rotary, page 16 in random order;
-- sweep.append_batch), caches in CACHE_DTYPE (default bf16; fp8_e4m3,
-- fp8_e5m2: scales 0.5 and 0.25, until 2026-12-07 1).
--   ncu -k regex:pa_append --launch-skip 1 --launch-count 1 --set full luajit scripts/lab/append_once.lua
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local dev = assert(pa.device())
local call = sweep.append_batch(pa, dev, 64, 512, { H = 32, Hk = 8, D = 128, dtype = "bf16", page = 16,
  kv_dtype = arg[1] })
for _ = 1, 3 do call() end
dev:synchronize()
print("append_once: done")
