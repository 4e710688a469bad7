-- scripts/lab/append_once.lua [CACHE_DTYPE] -- a few rotary appends and nothing
-- else, for a profiler: the bench's workload (64 sequences x 512 new tokens,
-- bf16, 8 kv heads, head dim 128, GPT-NeoX rotary, page 16 in random order),
-- caches in CACHE_DTYPE (default bf16; fp8_e4m3, fp8_e5m2).
--   ncu -k regex:pa_append --launch-skip 1 --launch-count 1 --set full luajit scripts/lab/append_once.lua
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local dev = assert(pa.device())
local B, n, HK, H, D, L = 64, 512, 8, 32, 128, 4096
local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, 16, arg[1] or "bf16")
local k = assert(pa.randn({ B, n, HK, D }, "bf16", dev, 4))
local v = assert(pa.randn({ B, n, HK, D }, "bf16", dev, 5))
local rc, rs = sweep.rope_tables(pa, dev, L, D / 2, "bf16")
local q = assert(pa.tensor({ B, 0, H, D }, "bf16", dev))
local opts = { block_table = bt, cache_seqlens = L - n, k = k, v = v, rotary_cos = rc, rotary_sin = rs,
  rotary_interleaved = false }
for _ = 1, 3 do assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
dev:synchronize()
print("append_once: done")
