-- NVRTC compiles every kernel variant of the catalog for sm_80 and sm_90a, and
-- the disk cache of compiled kernels survives corrupt files. Needs NVRTC only
-- (no GPU, no driver): runs in CI; where NVRTC is missing it is reported
-- as pending with the reason.
local ffi = require "ffi"
local core = require "pagedattn.core"
local C = core.C

local PA_ERR_COMPILE, PA_ERR_UNSUPPORTED = 6, 4

local function compile(variant, arch, use_cache)
  local cached = ffi.new("int[1]")
  local st = C.pa_kernel_compile(core.ctx, variant, arch, use_cache and 1 or 0, cached)
  return st, core.last_error(), cached[0] == 1
end

local H = require "helpers"
local with_env = H.with_env
local tmpdir, write_file = H.tmpdir, H.write_file
local function read_file(path) return assert(H.read_file(path)) end

local function ls(dir)
  local files = {}
  local p = io.popen("ls -1 '" .. dir .. "' 2>/dev/null")
  for line in p:lines() do files[#files + 1] = line end
  p:close()
  return files
end

describe("NVRTC kernel compilation", function()
  local st, err = compile("util", "sm_80", false)
  if st == PA_ERR_UNSUPPORTED then
    pending("NVRTC not found: " .. err)
    return
  end

  local n = tonumber(C.pa_kernel_catalog_size())
  -- Under the ASan/UBSan build (PAGEDATTN_BUILD=debug) one variant in 8, from
  -- a seed-drawn offset: NVRTC's work is the same in both builds (the
  -- sanitizers watch only the library's few lines around it), and the
  -- release pass of the same run compiles all of them.
  local stride = os.getenv("PAGEDATTN_BUILD") == "debug" and 8 or 1
  local offset = H.seed("nvrtc catalog", 1) % stride
  -- Compiles names for arch, one worker process a CPU (NVRTC compiles on one
  -- thread: the catalog for both archs, one variant at a time, took 670 s on
  -- a 2-core machine like CI's); "NAME\tDIR" through the disk cache in DIR,
  -- others without it (spec/nvrtc_worker.lua). Returns the failures' messages.
  local workers = math.min(H.cpus(), 8)
  local function compile_all(names, arch)
    local dir, cmds = tmpdir(), {}
    for w = 1, math.min(workers, #names) do
      local list = {}
      for i = w, #names, workers do list[#list + 1] = names[i] end
      write_file(dir .. "/" .. w, table.concat(list, "\n") .. "\n")
      cmds[w] = string.format("luajit '%s/spec/nvrtc_worker.lua' %s '%s/%d'", H.root, arch, dir, w)
    end
    local failed, got = {}, 0
    for w, r in ipairs(H.sh_all(cmds)) do
      local rc, out = r[1], r[2]
      local count = tonumber(out:match("compiled (%d+)%s*$"))
      if rc ~= 0 or not count or out:find("failed ", 1, true) then
        failed[#failed + 1] = "worker " .. w .. " (rc " .. tostring(rc) .. "): " .. out
      end
      got = got + (count or 0)
    end
    os.execute("rm -rf '" .. dir .. "'")
    if got ~= #names then failed[#failed + 1] = string.format("%d of %d variants compiled", got, #names) end
    return failed
  end

  for _, arch in ipairs({ "sm_80", "sm_90a" }) do
    it("compiles every kernel variant of the catalog for " .. arch ..
      (stride > 1 and string.format(" (one in %d under the debug build)", stride) or ""), function()
      assert.is_true(n >= 10)
      local names = {}
      for i = offset, n - 1, stride do names[#names + 1] = ffi.string(C.pa_kernel_catalog_name(i)) end
      local failed = compile_all(names, arch)
      assert(#failed == 0, table.concat(failed, "\n\n"))
    end)
  end

  -- the variants the planner picks for the reference workload (bf16, 32 / 8
  -- heads of 128; decode and prefill at pages of 16, 256 and contiguous), as
  -- the library lists them for precompile: the bench's kernels compile
  it("compiles the planner's variants of the reference workload for sm_90a", function()
    local tuning = require "pagedattn.tuning"
    local names, n = {}, 0
    for _, page in ipairs({ 16, 256, 0 }) do
      for _, q in ipairs({ 1, 2048 }) do
        local list = assert(tuning.variants_for({ dtype = "bf16", head_dim = 128, heads = 32, kv_heads = 8,
          page_size = page, seqlen_q = q }, nil, "sm_90a"))
        for k, name in ipairs(list) do
          n = n + 1
          if (k - 1 - offset) % stride == 0 then names[#names + 1] = name end -- (every one in the release pass; above)
        end
      end
    end
    assert.is_true(n >= 20)
    local failed = compile_all(names, "sm_90a")
    assert(#failed == 0, table.concat(failed, "\n\n"))
  end)

  it("rejects malformed variant names, saying what is wrong", function()
    local cases = {
      { "decode dtype=bf16", "D= missing" },
      { "decode dtype=i8 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024", "dtype=i8" },
      { "decode dtype=bf16 D=100 nq=1 gt=4 page=16 stages=3 maxp=1024", "D=100" },
      { "decode dtype=bf16 D=128 nq=4 gt=4 page=16 stages=3 maxp=1024", "nq * gt" },
      { "decode dtype=bf16 D=128 nq=1 gt=4 page=12 stages=3 maxp=1024", "page=12" },
      { "prefill_ws dtype=bf16 D=128 gt=4 page=8 stages=3 natural=0 tma=1", "tma=1 takes" },
      { "prefill_ws dtype=bf16 D=128 gt=4 page=8 stages=3 natural=0 tma=2", "tma=2 (page boxes)" },
      { "prefill_ws dtype=bf16 D=128 gt=4 page=contig stages=3 natural=0 tma=2", "tma=2 (page boxes)" },
      { "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0 tma=3", "tma=3" },
      { "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=16 persist=0 minb=1 hw=0 nw=8",
        "nw=8 (eight warps a block) takes persist=1" },
      { "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0 nw=6", "nw=6" },
      { "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=1 nw=8",
        "hw=1 (a warp a head tile) takes nw=4" },
      { "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=8 persist=1 minb=1 hw=0 nw=4",
        "persist=1 takes kpw=16 (or hw=1)" },
      { "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=768 kpw=16 persist=1 minb=1 hw=0", "nw= missing" },
      { "util extra=1", "unexpected" },
      { "matmul", "unknown kind" },
    }
    for _, c in ipairs(cases) do
      local s, e = compile(c[1], "sm_90a", false)
      assert.equal(1, s) -- PA_ERR_ARGUMENT
      assert(e:find(c[2], 1, true), "'" .. c[1] .. "' gave: " .. e)
    end
    local s, e = compile("util", "gfx90a", false)
    assert.equal(1, s)
    assert.truthy(e:find("arch", 1, true), e)
  end)

  it("reports a compile error with the NVRTC log and the file", function()
    local dir = tmpdir()
    local src = core.root .. "/kernels"
    for _, name in ipairs(ls(src)) do
      if name:match("%.cuh?$") or name:match("%.h$") then
        write_file(dir .. "/" .. name, read_file(src .. "/" .. name))
      end
    end
    write_file(dir .. "/util.cu", read_file(src .. "/util.cu") .. "\nint broken(;\n")
    with_env({ PAGEDATTN_KERNEL_DIR = dir }, function()
      local s, e = compile("util", "sm_90a", false)
      assert.equal(PA_ERR_COMPILE, s)
      assert(e:find("util.cu", 1, true) and e:find("error", 1, true), e)
    end)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("compiles a kernel directory's own files: a header the embedded set lacks, and without files its kernel does not need", function()
    -- (another tree's kernels, A/B'd in one process, may add or drop a header)
    local dir = tmpdir()
    local src = core.root .. "/kernels"
    for _, name in ipairs({ "params.h", "common.cuh" }) do write_file(dir .. "/" .. name, read_file(src .. "/" .. name)) end
    write_file(dir .. "/zz_extra.cuh", "#define PA_ZZ_EXTRA 7\n")
    write_file(dir .. "/util.cu", '#include "zz_extra.cuh"\nstatic_assert(PA_ZZ_EXTRA == 7, "the extra header");\n'
      .. read_file(src .. "/util.cu"))
    with_env({ PAGEDATTN_KERNEL_DIR = dir }, function()
      local s, e = compile("util", "sm_90a", false)
      assert(s == 0, e)
      -- a kernel whose file the directory lacks: an error naming the directory and the file
      s, e = compile("merge dtype=f16", "sm_90a", false)
      assert.equal(1, s)
      assert(e:find("PAGEDATTN_KERNEL_DIR", 1, true) and e:find(dir, 1, true) and e:find("merge.cu", 1, true), e)
    end)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("takes more NVRTC options from PAGEDATTN_NVRTC_OPTIONS (in the cache key), and says which are wrong", function()
    local dir = tmpdir()
    with_env({ PAGEDATTN_KERNEL_CACHE = dir }, function()
      local s, e = compile("util", "sm_90a", true)
      assert(s == 0, e)
      local before = #ls(dir)
      with_env({ PAGEDATTN_NVRTC_OPTIONS = "-Xptxas -O2 no-lineinfo" }, function()
        local s2, e2, cached = compile("util", "sm_90a", true)
        assert(s2 == 0, e2)
        assert.is_false(cached) -- other options, another image
      end)
      assert.equal(before + 1, #ls(dir))
      with_env({ PAGEDATTN_NVRTC_OPTIONS = "--no-such-option" }, function()
        local s3, e3 = compile("util", "sm_90a", false)
        assert.equal(PA_ERR_COMPILE, s3)
        assert(e3:find("no-such-option", 1, true), e3)
      end)
      with_env({ PAGEDATTN_NVRTC_OPTIONS = string.rep("-w ", 17) }, function()
        local s4, e4 = compile("util", "sm_90a", false)
        assert(s4 ~= 0 and e4:find("PAGEDATTN_NVRTC_OPTIONS: more than 16 options", 1, true), e4)
      end)
      with_env({ PAGEDATTN_NVRTC_OPTIONS = string.rep("x", 600) }, function()
        local s5, e5 = compile("util", "sm_90a", false)
        assert(s5 ~= 0 and e5:find("PAGEDATTN_NVRTC_OPTIONS: longer than", 1, true), e5)
      end)
    end)
    os.execute("rm -rf '" .. dir .. "'")
  end)

  -- ptxas may issue a kernel's wgmmas one at a time after a change that looks
  -- harmless (its C7511 remark, which NVRTC does not print; nvcc's ptxas can
  -- disagree), and the Hopper prefill kernel then runs 33-50 % slower
  -- (docs/prefill.md). The variants the library picks for bf16
  -- prefill on Hopper must keep them pipelined: scripts/lab/sass-scan.lua
  -- --windows reads the cubin (scripts/lab/wgmma_windows.sh does the same
  -- for any variant).
  -- (one head a kv head too: the last V tile's zero fill by TMA serialised
  -- those at page boxes while every four-head variant stayed pipelined)
  it("keeps the wgmmas of the default Hopper prefill variants pipelined (sm_90a)", function()
    if stride > 1 then
      pending("the release pass checks the machine code (NVRTC's output does not depend on the library's build)")
      return
    end
    local dir = tmpdir()
    local scan = core.root .. "/scripts/lab/sass-scan.lua"
    local variants, lines = {}, {}
    for _, D in ipairs({ 64, 128, 256 }) do
      for _, page in ipairs({ "16", "contig" }) do
        for _, variant in ipairs({ { 0, 4 }, { 1, 4 }, { 0, 1 }, { 1, 1 } }) do
          local natural, gt = variant[1], variant[2]
          local v = string.format("prefill_ws dtype=bf16 D=%d gt=%d page=%s stages=%d natural=%d tma=%d", D, gt,
            page, D <= 128 and 3 or 2, natural, page == "contig" and 1 or 2)
          variants[#variants + 1] = v
          lines[#lines + 1] = v .. "\t" .. dir .. "/" .. #variants -- a cache of its own: one file, this variant's
        end
      end
    end
    -- and over fp8 caches, widened in the block (tuning prefill_fp8 = 3)
    for _, fmt in ipairs({ "fp8_e4m3", "fp8_e5m2" }) do
      for _, dg in ipairs({ { "bf16", 4 }, { "f16", 1 } }) do
        local v = string.format("prefill_ws dtype=%s D=128 gt=%d page=16 stages=2 natural=0 tma=1 kv=%s", dg[1], dg[2],
          fmt)
        variants[#variants + 1] = v
        lines[#lines + 1] = v .. "\t" .. dir .. "/" .. #variants
      end
    end
    local failed = compile_all(lines, "sm_90a")
    assert(#failed == 0, table.concat(failed, "\n\n"))
    local bad = {}
    for i, v in ipairs(variants) do
      local files = ls(dir .. "/" .. i)
      assert.equal(1, #files)
      local p = assert(io.popen("luajit '" .. scan .. "' --windows '" .. dir .. "/" .. i .. "/" .. files[1] .. "'"))
      local out = p:read("*a")
      p:close()
      local windows = out:match("pa_prefill_ws: %d+ instructions ([%d ]+)")
      local nwin = windows and select(2, windows:gsub("%d+", "")) or 0 -- 3 at head dim 256, 9 at 128
      if nwin < 3 or out:find("serialised", 1, true) then bad[#bad + 1] = v .. ": " .. out end
    end
    os.execute("rm -rf '" .. dir .. "'")
    assert.equal(28, #variants)
    assert(#bad == 0, "wgmmas serialised (or no wgmma found):\n" .. table.concat(bad, "\n"))
  end)

  it("caches compiled kernels on disk; corrupt, truncated or foreign files are ignored and replaced", function()
    local dir = tmpdir()
    with_env({ PAGEDATTN_KERNEL_CACHE = dir }, function()
      local s, e, cached = compile("append dtype=f16", "sm_80", true)
      assert.equal(0, s, e)
      assert.is_false(cached)
      local files = ls(dir)
      assert.equal(1, #files)
      assert.truthy(files[1]:match("^sm_80%-%x+%.bin$"), files[1])
      local path = dir .. "/" .. files[1]
      local good = read_file(path)
      s, e, cached = compile("append dtype=f16", "sm_80", true)
      assert.equal(0, s, e)
      assert.is_true(cached)
      -- another variant: another file
      s, e, cached = compile("append dtype=bf16", "sm_80", true)
      assert.is_false(cached)
      assert.equal(2, #ls(dir))
      local damaged = {
        good:sub(1, 20),                                            -- truncated header
        good:sub(1, #good - 100),                                   -- truncated payload
        good:sub(1, 200) .. string.rep("\0", 64) .. good:sub(265),  -- corrupt payload
        "not a kernel at all",                                      -- foreign
        "",                                                          -- empty
      }
      for i, bad in ipairs(damaged) do
        write_file(path, bad)
        s, e, cached = compile("append dtype=f16", "sm_80", true)
        assert.equal(0, s, e)
        assert(not cached, "damaged cache file " .. i .. " was trusted")
        assert.equal(good, read_file(path)) -- rewritten whole
      end
      -- no temporary files left behind
      for _, f in ipairs(ls(dir)) do assert.falsy(f:find("tmp", 1, true), f) end
    end)
    with_env({ PAGEDATTN_KERNEL_CACHE = "off" }, function()
      local s, e, cached = compile("append dtype=f16", "sm_80", true)
      assert.equal(0, s, e)
      assert.is_false(cached)
    end)
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("generated kernel sources", function()
  it("kernels/wgmma_ops.cuh is what kernels/gen_wgmma.lua writes (regenerate it, never edit it)", function()
    local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/[^/]*$") or "."
    local f = assert(io.open(root .. "/kernels/wgmma_ops.cuh", "rb"))
    local committed = f:read("*a")
    f:close()
    local p = assert(io.popen("luajit '" .. root .. "/kernels/gen_wgmma.lua'"))
    local generated = p:read("*a")
    p:close()
    assert.is_true(#generated > 1000, "the generator wrote nothing")
    assert.are.equal(generated, committed)
  end)
end)
