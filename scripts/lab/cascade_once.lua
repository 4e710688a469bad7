-- scripts/lab/cascade_once.lua -- the cascade bench's shared workload (256
-- decodes forked from one 4096-token prompt, 512 tokens each of their own,
-- bf16, 32 / 8 heads, head dim 128, page 16), the plain call and the cascade
-- call three times each and nothing else, for a profiler; prints the suffix
-- level's plan. On the GPU machine:
--   ncu --clock-control none --metrics gpu__time_duration.sum -k regex:pa_ \
--     luajit scripts/lab/cascade_once.lua
local pa = require "pagedattn"
local dev = assert(pa.device("cuda"))
local B, P, S, ps, Hq, Hk, D, dtype = 256, 4096, 512, 16, 32, 8, 128, "bf16"
local cache = assert(pa.kv_cache { num_pages = P / ps + B * (S / ps + 1) + 64, page_size = ps, kv_heads = Hk,
  head_dim = D, dtype = dtype, device = dev })
local prompt = cache:sequence()
assert(prompt:append(P))
local b = cache:batch { capacity = B, cascade = true }
for i = 1, B do
  local s = assert(prompt:fork())
  assert(s:append(S - 1))
  b:add(s, 1)
end
assert(b:stage())
local q = pa.randn({ B, Hq, D }, dtype, dev, 3)
local out2 = pa.tensor({ B, Hq, D }, dtype, dev)
local po = { block_table = b.block_table, cu_seqlens_q = b.cu_seqlens_q, seqused_k = b.seqused_k,
  max_seqlen_q = 1, causal = true, out = pa.tensor({ B, Hq, D }, dtype, dev) }
for r = 1, 3 do
  assert(pa.attention_varlen(q, cache.k_cache, cache.v_cache, po))
  assert(b:attention(q, nil, nil, { out = out2 }))
  dev:synchronize()
  print("plan (the suffix level)", r, dev:last_plan())
end
