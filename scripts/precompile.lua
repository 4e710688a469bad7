-- scripts/precompile.lua [--arch ARCH] [--list FILE] [--shard K/N] [--names] [VARIANT...] -- compiles
-- kernel variants through NVRTC into the disk cache ($PAGEDATTN_KERNEL_CACHE,
-- else $XDG_CACHE_HOME/pagedattn or ~/.cache/pagedattn), so that first calls
-- need not compile. With no variants named: the catalog (every kernel and
-- code path) and the benchmark's variants (decode and prefill). ARCH: "sm_90a", "sm_80", ...;
-- default: that of CUDA device 0 (needs the driver). --shard K/N: only every
-- N-th variant from the K-th (1-based), to run N compilers side by side.
-- --names: print the variants, one a line, and compile nothing.
--   scripts/run scripts/precompile.lua --arch sm_90a
local ffi = require "ffi"
local core = require "pagedattn.core"
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
if #variants == 0 then
  for j = 0, C.pa_kernel_catalog_size() - 1 do variants[#variants + 1] = ffi.string(C.pa_kernel_catalog_name(j)) end
  -- scripts/bench.lua: page 16, 256 and contiguous bf16 decode (D 128, 4 heads per kv head)
  for _, page in ipairs({ "16", "256", "contig" }) do
    for _, stages in ipairs({ 2, 3, 4 }) do
      variants[#variants + 1] = string.format("decode dtype=bf16 D=128 nq=1 gt=4 page=%s stages=%d maxp=1024",
        page, stages)
      for _, kpw in ipairs({ 8, 16 }) do
        variants[#variants + 1] = string.format(
          "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=%s stages=%d maxp=1024 kpw=%d persist=0 minb=1 hw=0 nw=4",
          page, stages, kpw)
      end
      -- short units (one block per unit, three blocks a SM; a warp a head
      -- tile or not; a warp a head tile at 16 keys a warp, two blocks a SM)
      if stages == 3 then
        for hw = 0, 1 do
          variants[#variants + 1] = string.format(
            "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=%s stages=3 maxp=1024 kpw=8 persist=0 minb=3 hw=%d nw=4",
            page, hw)
        end
        variants[#variants + 1] = string.format(
          "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=%s stages=3 maxp=1024 kpw=16 persist=0 minb=2 hw=1 nw=4", page)
        -- (and in persistent blocks, where they pay: hw_persist_pays)
        variants[#variants + 1] = string.format(
          "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=%s stages=3 maxp=768 kpw=16 persist=1 minb=2 hw=1 nw=4", page)
      end
      for _, nw in ipairs({ 4, 8 }) do
        variants[#variants + 1] = string.format(
          "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=%s stages=%d maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=%d",
          page, stages, nw)
      end
    end
  end
  -- Hopper prefill as the specs and the bench use it: f16/bf16, D 64/128/256,
  -- 1 or 4 heads per kv head (1 and 4 query heads per kv head), every page kind
  for _, dt in ipairs({ "bf16", "f16" }) do
    for _, D in ipairs({ 64, 128, 256 }) do
      for _, gt in ipairs({ 1, 4 }) do
        for _, page in ipairs({ "1", "16", "256", "any", "contig" }) do
          for _, natural in ipairs({ 0, 1 }) do
            variants[#variants + 1] = string.format("prefill_wgmma dtype=%s D=%d gt=%d page=%s stages=3 natural=%d",
              dt, D, gt, page, natural)
            -- ws: TMA where the pages hold 16 tokens or more (or the cache is contiguous)
            -- (paged: page boxes, tma=2, and tma=1 for PAGEDATTN_PREFILL_PAGE_BOXES=0)
            local tma = (page == "contig" or (tonumber(page) or 0) >= 16) and 1 or 0
            local ws = "prefill_ws dtype=%s D=%d gt=%d page=%s stages=%d natural=%d tma=%d"
            variants[#variants + 1] = string.format(ws, dt, D, gt, page, D <= 128 and 3 or 2, natural, tma)
            if (tonumber(page) or 0) >= 16 then
              variants[#variants + 1] = string.format(ws, dt, D, gt, page, D <= 128 and 3 or 2, natural, 2)
            end
          end
        end
      end
    end
  end
  -- and the bench's bf16 prefill on mma.sync (D 128, 4 heads per kv head; tuning variants)
  for _, page in ipairs({ "16", "256", "contig" }) do
    for _, sm in ipairs({ { 2, 2 }, { 2, 1 }, { 3, 1 } }) do
      variants[#variants + 1] = string.format("prefill dtype=bf16 D=128 gt=4 page=%s stages=%d natural=0 minb=%d",
        page, sm[1], sm[2])
    end
  end
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
