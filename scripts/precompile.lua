-- scripts/precompile.lua [--arch ARCH] [--list FILE] [--shard K/N] [--names] [VARIANT...] -- compiles
-- kernel variants through NVRTC into the disk cache ($PAGEDATTN_KERNEL_CACHE,
-- else $XDG_CACHE_HOME/pagedattn or ~/.cache/pagedattn), so that first calls
-- need not compile. With no variants named: the catalog (every kernel and
-- code path) and the variants the planner may choose for the benchmark's and
-- the GPU specs' shapes (the library lists them: pagedattn.tuning.variants_for),
-- at the default tuning and the tuning the benchmark sweeps. ARCH: "sm_90a",
-- "sm_80", ...; default: that of CUDA device 0 (without one: the variants of
-- both, compiled for sm_90a). --shard K/N: only every N-th variant from the
-- K-th (1-based), to run N compilers side by side. --names: print the
-- variants, one a line, and compile nothing.
--   scripts/run scripts/precompile.lua --arch sm_90a
local ffi = require "ffi"
local core = require "pagedattn.core"
local tuning = require "pagedattn.tuning"
local C = core.C

local arch, list, variants = nil, nil, {}
local shard_k, shard_n = 1, 1
local names_only = false
local i = 1
while i <= #arg do
  if arg[i] == "--arch" then arch = arg[i + 1]; i = i + 2
  elseif arg[i] == "--names" then names_only = true; i = i + 1
  elseif arg[i] == "--list" then list = arg[i + 1]; i = i + 2
  elseif arg[i] == "--shard" then
    local k, n = tostring(arg[i + 1]):match("^(%d+)/(%d+)$")
    shard_k, shard_n = tonumber(k), tonumber(n)
    if not shard_k or shard_n < 1 or shard_k < 1 or shard_k > shard_n then
      io.stderr:write("precompile: --shard wants K/N with 1 <= K <= N, got ", tostring(arg[i + 1]), "\n")
      os.exit(2)
    end
    i = i + 2
  else variants[#variants + 1] = arg[i]; i = i + 1 end
end
if list then
  for line in io.lines(list) do
    line = line:gsub("#.*", ""):match("^%s*(.-)%s*$")
    if line ~= "" then variants[#variants + 1] = line end
  end
end

-- The shapes to compile ahead: scripts/bench.lua's decode (bf16, 32 / 8 heads
-- of 128, pages of 16 and 256, contiguous) at the tuning its sweeps try, its
-- mma.sync prefill configurations, its fp8 rows, and Hopper prefill as the specs and the
-- bench use it (f16/bf16, head dims 64/128/256, 1 or 4 heads a kv head, every
-- kind of page, softcap or not; by default, a box a page of 64 columns, and
-- prefill_ws forced).
local function bench_shapes()
  local out = {}
  local function add(shape, t) out[#out + 1] = { shape = shape, tuning = t } end
  for _, page in ipairs({ 16, 256, 0 }) do
    local decode = { dtype = "bf16", head_dim = 128, heads = 32, kv_heads = 8, page_size = page, seqlen_q = 1 }
    add(decode, nil)
    for _, stages in ipairs({ 2, 3, 4 }) do
      for _, kpw in ipairs({ 8, 16 }) do add(decode, { decode_stages = stages, decode_kpw = kpw }) end
      add(decode, { decode_kernel = "simt", decode_stages = stages })
    end
    local prefill = { dtype = "bf16", head_dim = 128, heads = 32, kv_heads = 8, page_size = page, seqlen_q = 2048 }
    for _, sm in ipairs({ { 2, 2 }, { 2, 1 }, { 3, 1 } }) do
      add(prefill, { prefill_kernel = "mma", prefill_stages = sm[1], prefill_minb = sm[2] })
    end
    -- fp8 caches (the bench's fp8 rows, gpu_fp8_spec's shapes): decode, prefill, and the
    -- CUDA-core decode at head dim 256
    for _, kv in ipairs({ "fp8_e4m3", "fp8_e5m2" }) do
      for _, base in ipairs({ decode, prefill }) do
        local s = {}
        for k, v in pairs(base) do s[k] = v end
        s.kv_dtype = kv
        add(s, nil)
      end
      add({ dtype = "bf16", head_dim = 256, heads = 32, kv_heads = 8, page_size = page, seqlen_q = 1, kv_dtype = kv }, nil)
    end
  end
  for _, dt in ipairs({ "bf16", "f16" }) do
    for _, D in ipairs({ 64, 128, 256 }) do
      for _, group in ipairs({ 1, 4 }) do
        for _, page in ipairs({ 1, 16, 256, 3, 0 }) do
          for _, natural in ipairs({ false, true }) do
            local s = { dtype = dt, head_dim = D, heads = 8 * group, kv_heads = 8, page_size = page, seqlen_q = 2048,
              natural = natural }
            add(s, nil)
            add(s, { prefill_page_boxes = 0 })
            add(s, { prefill_kernel = "ws" }) -- (the specs force it: the cp.async gather at small pages)
          end
        end
      end
    end
  end
  return out
end

if #variants == 0 then
  for j = 0, C.pa_kernel_catalog_size() - 1 do variants[#variants + 1] = ffi.string(C.pa_kernel_catalog_name(j)) end
  local archs = { arch }
  if not arch then
    -- the device's, or both kinds where there is none
    local ok = tuning.variants_for({ head_dim = 128, heads = 1, kv_heads = 1 }, nil, nil)
    if not ok then archs = { "sm_90a", "sm_80" } end
  end
  for _, a in ipairs(archs) do
    for _, s in ipairs(bench_shapes()) do
      local names, err = tuning.variants_for(s.shape, s.tuning, a)
      if not names then io.stderr:write("precompile: ", err, "\n"); os.exit(1) end
      for _, v in ipairs(names) do variants[#variants + 1] = v end
    end
  end
  arch = arch or (#archs > 1 and "sm_90a" or nil)
end

local unique, seen = {}, {}
for _, v in ipairs(variants) do
  if not seen[v] then seen[v] = true; unique[#unique + 1] = v end
end

if names_only then
  for _, v in ipairs(unique) do print(v) end
  os.exit(0)
end

local cached = ffi.new("int[1]")
local failed = 0
for j = shard_k, #unique, shard_n do
  local v = unique[j]
  local t0 = os.clock()
  local st = C.pa_kernel_compile(core.ctx, v, arch, 1, cached)
  if st ~= 0 then
    failed = failed + 1
    print(string.format("FAIL %s: %s", v, core.last_error()))
  else
    print(string.format("%-7s %-72s %.2fs", cached[0] == 1 and "cached" or "built", v, os.clock() - t0))
  end
end
os.exit(failed == 0 and 0 or 1)
