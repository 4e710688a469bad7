-- scripts/lab/host_loop.lua -- the host's time per attention call, where the
-- kernel is shorter than the call: 2000 rotary appends of one token to each
-- of 256 sequences (bf16, 8 kv heads, head dim 128, a 256 x 256 block table
-- of pages of 16) queued back to back with one wait at the end, timing off;
-- prints the median of 5 such loops. To compare two builds of the library,
-- run it with PAGEDATTN_LIB set to each in turn.
--   luajit scripts/lab/host_loop.lua (after . scripts/env.sh; a CUDA device)
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"
local dev = pa.device()
local B, L, H, HK, D, DT = 256, 4096, 32, 8, 128, "bf16"
local kc, vc, bt = sweep.make_cache(pa, dev, B, L, HK, D, 16, DT)
local rc, rs = sweep.rope_tables(pa, dev, L, D / 2, DT)
local q = assert(pa.tensor({ B, 0, H, D }, DT, dev))
local opts = {
  block_table = bt, cache_seqlens = L - 1, rotary_cos = rc, rotary_sin = rs, rotary_interleaved = false,
  k = assert(pa.randn({ B, 1, HK, D }, DT, dev, 4)), v = assert(pa.randn({ B, 1, HK, D }, DT, dev, 5)),
  out = assert(pa.tensor({ B, 0, H, D }, DT, dev)),
}
local function call() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
local function loop(n)
  dev:synchronize()
  collectgarbage()
  collectgarbage("stop") -- (a tensor collected mid-loop would wait for the device)
  local t0 = pa.clock()
  for _ = 1, n do call() end
  dev:synchronize()
  collectgarbage("restart")
  return (pa.clock() - t0) / n
end
for _ = 1, 20 do call() end -- compile, load, grow scratch
local t = {}
for r = 1, 5 do t[r] = loop(2000) end
table.sort(t)
print(string.format("%s on %s: rotary append %dx1, calls back to back: %.1f us a call (median of 5 loops of 2000)",
  os.getenv("PAGEDATTN_LIB") or "pagedattn", dev.name, B, t[3] * 1e6))
