-- scripts/lab/decode_once.lua [B] [L] -- a few decode calls and nothing
-- else, for a profiler: the bench's decode workload shape (bf16, 32 query /
-- 8 kv heads, head dim 128, page 16 in random order), B sequences of L keys
-- (default 1024 x 64).
--   ncu -k regex:pa_decode --launch-skip 1 --launch-count 1 --section SpeedOfLight \
--     --section WarpStateStats luajit scripts/lab/decode_once.lua 1024 64
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local dev = assert(pa.device())
local B, L = tonumber(arg[1]) or 1024, tonumber(arg[2]) or 64
local HK, H, D = 8, 32, 128
local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, 16, arg[3] or "bf16")
local q = assert(pa.randn({ B, 1, H, D }, "bf16", dev, 3))
local opts = { block_table = bt, cache_seqlens = L }
for _ = 1, 3 do assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
dev:synchronize()
print(string.format("decode_once: %d x %d keys (%s caches), done", B, L, arg[3] or "bf16"))
