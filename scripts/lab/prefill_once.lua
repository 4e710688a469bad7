-- scripts/lab/prefill_once.lua [--batch B] [--seqlen S] [--cached C] [--page P] [--calls N]
-- [--kv DTYPE] [--tuning F=V,...] [KERNEL...] --
-- a few causal prefill calls (bf16, 32 query / 8 kv heads, head dim 128: the
-- bench's workload; S new tokens a sequence after C cached keys, default 0:
-- the bench's chunked case is --batch 4 --seqlen 1024 --cached 8192) and
-- nothing else, for a profiler: per KERNEL ("default",
-- "ws", "wgmma", "mma": the tuning's prefill_kernel) N calls (default 3).
-- --kv fp8_e4m3 | fp8_e5m2: the caches in fp8 (k_scale 0.5, v_scale 0.25,
-- as the bench's rows).
--   ncu --set full --import-source yes -k regex:pa_prefill --launch-skip 2 --launch-count 1 \
--     -o /tmp/p luajit scripts/lab/prefill_once.lua --batch 4 --seqlen 2048
local ffi = require "ffi"
local pa = require "pagedattn"
local sweep = require "pagedattn.sweep"

local B, S, C, page, calls, kernels, tune, kv = 1, 8192, 0, 16, 3, {}, "-", nil
local i = 1
while i <= #arg do
  local a, v = arg[i], tonumber(arg[i + 1])
  if a == "--batch" or a == "--seqlen" or a == "--cached" or a == "--page" or a == "--calls" then
    if not v or v < 0 then io.stderr:write("prefill_once: " .. a .. " needs a number\n"); os.exit(2) end
    if a == "--batch" then B = v elseif a == "--seqlen" then S = v elseif a == "--cached" then C = v
    elseif a == "--page" then page = v else calls = v end
    i = i + 2
  elseif a == "--tuning" then
    tune = arg[i + 1] or "-"
    i = i + 2
  elseif a == "--kv" then
    kv = arg[i + 1]
    i = i + 2
  elseif a == "--help" or a == "-h" then
    print("usage: luajit scripts/lab/prefill_once.lua [--batch B] [--seqlen S] [--cached C] [--page P (0: contiguous)]"
      .. " [--calls N] [--kv fp8_e4m3|fp8_e5m2] [--tuning field=value,...] [KERNEL...]")
    os.exit(0)
  else
    kernels[#kernels + 1] = a
    i = i + 1
  end
end
if #kernels == 0 then kernels[1] = "default" end

local dev = assert(pa.device())
if dev.kind == "cuda" then dev:set_tuning(require("pagedattn.tuning").parse_configs(tune)[1].fields) end
local H, HK, D = 32, 8, 128
local kc, vc, bt = sweep.make_cache(pa, dev, B, S + C, HK, D, page, kv or "bf16")
local q = assert(pa.randn({ B, S, H, D }, "bf16", dev, 3))
local out = assert(pa.tensor({ B, S, H, D }, "bf16", dev))
local opts = { block_table = bt, cache_seqlens = S + C, causal = true, out = out, k_scale = kv and 0.5 or nil,
  v_scale = kv and 0.25 or nil }
for _, k in ipairs(kernels) do
  if dev.kind == "cuda" then dev:set_tuning({ prefill_kernel = k == "default" and "auto" or k }) end
  for _ = 1, calls do assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
  dev:synchronize()
  print(string.format("prefill_once: %d x %d after %d, page %d, kernel %s%s: %d calls",
    B, S, C, page, k, kv and (", " .. kv .. " caches") or "", calls))
end
