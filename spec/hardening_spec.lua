-- spec/hardening_spec.lua -- what an adversarial run found (issue 46), one
-- describe per defect: each case failed before its fix. Runs on the CPU and
-- on "cpu:staged" (the CPU behind a discrete device's interface: the host
-- mirrors and uploads a GPU takes); the #gpu part repeats the checks whose
-- code the CUDA backend shares.
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local check = require "pagedattn.check"
local T = require "pagedattn.tensor"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/hardening_spec.lua"
local C, ctx = core.C, core.ctx
local MAX = 2 ^ 30 -- PA_MAX_SEQLEN

local function err_of(fn, ...) return H.error_of(fn, ...) end

-- Runs fn(dev) for the CPU and the staged CPU.
local function each_cpu(fn)
  for _, name in ipairs { "cpu", "cpu:staged" } do fn(assert(pa.device(name)), name) end
end

-- Key counts at and past the limit, on any device (one page, one kv head).
local function key_limits(dev)
  local D = 16
  local kc = pa.tensor({ 1, 1024, 1, D }, "f32", dev):fill(0.25)
  local vc = pa.tensor({ 1, 1024, 1, D }, "f32", dev):fill(3)
  local q = pa.tensor({ 1, 1, 1, D }, "f32", dev):fill(1)
  local bt = pa.tensor({ 1, 2 ^ 21 }, "i32", dev) -- 2^31 keys of page 0: legal to read
  -- past the limit: a clear error, whichever way the count arrives
  for _, n in ipairs { 2 ^ 31 - 1, 2 ^ 31 + 1, 2 ^ 32 + 1, MAX + 1 } do
    assert.matches("cache_seqlens: sequence 0 holds " .. string.format("%d", n) .. " keys.*2%^30",
      err_of(pa.attention_with_kvcache, q, kc, vc, { block_table = bt, cache_seqlens = n }))
  end
  -- i32 cache_seqlens near 2^31 plus appended tokens: refused, nothing written
  local k = pa.tensor({ 1, 4, 1, D }, "f32", dev):fill(7)
  local before = vc:to_table(0, 64)
  assert.matches("cache_seqlens: sequence 0 holds 2147483646 keys %+ 4 new",
    err_of(pa.attention_with_kvcache, pa.tensor({ 1, 4, 1, D }, "f32", dev), kc, vc,
      { k = k, v = k, block_table = bt, cache_seqlens = pa.from_table({ 2 ^ 31 - 2 }, { 1 }, "i32", dev) }))
  assert.same(before, vc:to_table(0, 64))
  -- varlen names seqused_k
  assert.matches("seqused_k: entry 0 is 1073741825 keys",
    err_of(pa.attention_varlen, pa.tensor({ 1, 1, D }, "f32", dev), kc, vc, { block_table = bt,
      cu_seqlens_q = { 0, 1 }, seqused_k = { MAX + 1 } }))
  -- at the limit: the right answer (every v is 3), from the window's keys only
  for _, ns in ipairs { 1, 0 } do
    local out, lse = pa.attention_with_kvcache(q, kc, vc, { block_table = bt, cache_seqlens = MAX,
      window_size = { 10, 0 }, num_splits = ns, return_softmax_lse = true })
    local o = out:to_table()
    for d = 1, D do assert.equal(3, o[d]) end
    -- 11 keys of score 0.25 * 16 * 0.25 = 1: lse = 1 + ln 11
    assert.near(1 + math.log(11), lse:to_table()[1], 1e-5)
  end
end

describe("hardening (issue 46)", function()
  describe("1. key counts near and past 2^31", function()
    it("are refused past 2^30 keys (PA_MAX_SEQLEN) and right at it, on cpu and cpu:staged", function()
      assert.equal(MAX, C.PA_MAX_SEQLEN)
      each_cpu(key_limits)
    end)

    it("a tile of more keys than one f32 sum holds stays right (every v is 3)", function()
      -- P V adds one key at a time: 2^24 equal keys used to stop the f32 sum (2.67 for 3)
      local dev = assert(pa.device("cpu"))
      local D = 16
      local kc = pa.tensor({ 1, 1024, 1, D }, "f32", dev):fill(0.01)
      local vc = pa.tensor({ 1, 1024, 1, D }, "f32", dev):fill(3)
      local q = pa.tensor({ 1, 1, 1, D }, "f32", dev):fill(1)
      local n = 2 ^ H.scale(24)
      local bt = pa.tensor({ 1, n / 1024 }, "i32", dev)
      local out, lse = pa.attention_with_kvcache(q, kc, vc,
        { block_table = bt, cache_seqlens = n, num_splits = 1, return_softmax_lse = true })
      local o = out:to_table()
      for d = 1, D do assert.near(3, o[d], 3e-6) end
      assert.near(math.log(n) + 0.04, lse:to_table()[1], 1e-5)
    end)

    it("tiles past the f32 fold length match the float64 reference", function()
      local rng = H.rng("hardening-fold")
      for i = 1, H.scale(3) do
        local seed = H.seed("hardening-fold", i)
        local c = check.random_case(H.rng("hardening-fold", i), {
          mode = "read", sq = rng:int(1, 3), B = 1, D = ({ 8, 16, 37 })[rng:int(1, 3)],
          group = ({ 1, 4 })[rng:int(1, 2)], Hk = 1, cached = rng:int(8193, 30000),
          page_size = ({ 0, 16, 256, 3 })[rng:int(1, 4)], num_splits = ({ 1, 0, 2 })[rng:int(1, 3)] })
        c.window, c.alibi, c.softcap = nil, nil, nil -- (the reference's time goes to the keys)
        H.assert_check(check.run(c, assert(pa.device("cpu")), H.rng("hardening-fold-data", i)), seed, SPEC)
      end
    end)
  end)

  describe("2. overflow in validation", function()
    it("a zero-row block table 2^62 wide is no overflow, and a call with nothing to do costs nothing", function()
      each_cpu(function(dev)
        local kc = pa.tensor({ 4, 16, 1, 8 }, "f32", dev)
        local q = pa.tensor({ 0, 1, 1, 8 }, "f32", dev)
        local out = assert(pa.attention_with_kvcache(q, kc, kc:clone(),
          { block_table = pa.tensor({ 0, 2 ^ 62 }, "i32", dev), cache_seqlens = 0 }))
        assert.same({ 0, 1, 1, 8 }, out.shape)
        -- 2^27 - 1 sequences of no query: returns at once (it took 13 s and 5 GB)
        local q0 = pa.tensor({ 2 ^ 27 - 1, 0, 1, 1 }, "f32", dev)
        local c1 = pa.tensor({ 1, 16, 1, 1 }, "f32", dev)
        local bt0 = pa.tensor({ 2 ^ 27 - 1, 0 }, "i32", dev)
        local t0 = pa.clock()
        assert(pa.attention_with_kvcache(q0, c1, c1:clone(), { block_table = bt0, cache_seqlens = 0 }))
        assert.is_true(pa.clock() - t0 < 0.5, "took " .. (pa.clock() - t0) .. " s")
        -- still checked: a wrong out is an error
        assert.matches("out: expected shape", err_of(pa.attention_with_kvcache, q0, c1, c1:clone(),
          { block_table = bt0, out = pa.tensor({ 1, 0, 1, 1 }, "f32", dev) }))
      end)
    end)

    it("pa_seq_pages_needed refuses n that would pass the limit (it wrapped to 0)", function()
      local cache = assert(pa.kv_cache { num_pages = 8, page_size = 4, layers = 0 })
      local s = assert(cache:sequence())
      assert(s:append(5))
      assert.equal(-1, tonumber(C.pa_seq_pages_needed(cache.handle, s.id, 0x7fffffffffffffffLL)))
      assert.equal(-1, tonumber(C.pa_seq_pages_needed(cache.handle, s.id, MAX - 4)))
      assert.equal(MAX / 4 - 2, tonumber(C.pa_seq_pages_needed(cache.handle, s.id, MAX - 5)))
      assert.equal(0, s:pages_needed(3))
      assert.equal(1, s:pages_needed(4))
      cache:close()
    end)
  end)

  describe("3. a view outlives its batch", function()
    it("fails with a clear error after b:close() or cache:close() (it read freed memory)", function()
      each_cpu(function(dev)
        for _, closer in ipairs { "batch", "cache" } do
          local cache = assert(pa.kv_cache { num_pages = 8, page_size = 4, kv_heads = 1, head_dim = 8,
            device = dev })
          local s = assert(cache:sequence())
          local b = assert(cache:batch())
          b:add(s, 5)
          assert(b:stage())
          local bt = b.block_table
          assert.same({ 0, 1 }, bt:to_table())
          if closer == "batch" then b:close() else cache:close() end
          assert.matches("to_table: tensor: its batch was closed", err_of(bt.to_table, bt))
          local q = pa.tensor({ 1, 1, 1, 8 }, "f32", dev)
          local kc = pa.tensor({ 8, 4, 1, 8 }, "f32", dev)
          assert.matches("attention_with_kvcache: block_table: its batch was closed",
            err_of(pa.attention_with_kvcache, q, kc, kc:clone(), { block_table = bt, cache_seqlens = 1 }))
          assert.matches("free: tensor: a view owned by its batch", err_of(bt.free, bt))
          if closer == "batch" then cache:close() end
        end
      end)
    end)
  end)

  describe("4. a failed stage changes nothing, its undo record included", function()
    it("unstage undoes the last good stage after a stage that raised", function()
      each_cpu(function(dev)
        local cache = assert(pa.kv_cache { num_pages = 16, page_size = 4, kv_heads = 1, head_dim = 8,
          device = dev })
        local s1, s2 = assert(cache:sequence()), assert(cache:sequence())
        local b = assert(cache:batch())
        b:add(s1, 3):add(s2, 6)
        assert(b:stage())
        local bt = b.block_table:to_table()
        b:clear():add(s1, 1):add(s1, 1) -- listed twice
        assert.matches("appears twice", err_of(b.stage, b))
        assert.same(bt, b.block_table:to_table())
        b:unstage()
        assert.same({ 0, 0 }, { s1:len(), s2:len() })
        assert.equal(16, cache:free_pages())
        cache:validate()
        cache:close()
      end)
    end)

    it("unstage refuses, changing nothing, when a sequence moved after the stage", function()
      -- (the failed plan used to leave {2 new, 2 pages} as the record, which the append then matched)
      local cache = assert(pa.kv_cache { num_pages = 16, page_size = 1, layers = 0 })
      local s1 = assert(cache:sequence())
      local b = assert(cache:batch { device = "cpu" })
      b:add(s1, 1)
      assert(b:stage())
      b:clear():add(s1, 2):add(s1, 2)
      assert.matches("appears twice", err_of(b.stage, b))
      assert(s1:append(1)) -- not staged: unstage must not drop it
      assert.matches("was freed or changed since it was staged", err_of(b.unstage, b))
      assert.equal(2, s1:len())
      cache:validate()
      cache:close()
    end)

    it("a stage that fails after growing its buffer leaves the last stage's views readable", function()
      each_cpu(function(dev)
        local cache = assert(pa.kv_cache { num_pages = 64, page_size = 1, kv_heads = 1, head_dim = 4,
          device = dev })
        local seqs = {}
        for i = 1, 40 do seqs[i] = assert(cache:sequence()) end
        local b = assert(cache:batch())
        b:add(seqs[1], 2)
        assert(b:stage())
        local before = b.block_table:to_table()
        b:clear()
        for i = 1, 40 do b:add(seqs[i], 200) end -- needs a bigger buffer, then runs out of pages
        local ok, err = b:stage()
        assert.is_nil(ok)
        assert.matches("out of pages", err)
        assert.same(before, b.block_table:to_table())
        assert.same({ 0, 2 }, b.cu_seqlens_q:to_table())
        b:unstage()
        assert.equal(0, seqs[1]:len())
        cache:validate()
        cache:close()
      end)
    end)
  end)

  describe("5. stale sequence ids", function()
    it("stay dead through 100,000 create/free cycles (they came back after 2,048)", function()
      local cache = assert(pa.kv_cache { num_pages = 8, page_size = 4, layers = 0 })
      local keep = assert(cache:sequence())
      assert(keep:append(3))
      local stale = assert(cache:sequence())
      local stale_id = stale.id
      stale:free()
      local h, box = cache.handle, ffi.new("int32_t[1]")
      for i = 1, H.scale(100000) do
        assert(C.pa_seq_create(ctx, h, box) == 0)
        if box[0] == stale_id or C.pa_seq_len(h, stale_id) ~= -1 then
          error("stale id " .. stale_id .. " is live again after " .. i .. " cycles")
        end
        assert(C.pa_seq_free(ctx, h, box[0]) == 0)
      end
      assert.equal(1, C.pa_seq_free(ctx, h, stale_id)) -- PA_ERR_ARGUMENT, and keep is untouched
      assert.equal(3, keep:len())
      cache:validate()
      cache:close()
    end)

    it("a batch holding a freed sequence refuses to stage it after many cycles", function()
      local cache = assert(pa.kv_cache { num_pages = 8, page_size = 4, layers = 0 })
      local s = assert(cache:sequence())
      local b = assert(cache:batch { device = "cpu" })
      b:add(s, 1)
      s:free()
      for i = 1, H.scale(5000) do
        local x = assert(cache:sequence())
        local ok, err = pcall(b.stage, b) -- must not stage x under the stale id
        if ok or not tostring(err):find("is not a live sequence", 1, true) then
          error("cycle " .. i .. ": the stale id staged sequence " .. x.id .. " (" .. tostring(err) .. ")")
        end
        x:free()
      end
      cache:close()
    end)
  end)

  describe("6. options used as given, or refused", function()
    it("a rotary table of 0 rows is refused and nothing is appended", function()
      each_cpu(function(dev)
        local kc = pa.tensor({ 1, 8, 1, 4 }, "f32", dev)
        local k = pa.tensor({ 1, 1, 1, 4 }, "f32", dev):fill(1)
        local cos = pa.tensor({ 0, 2 }, "f32", dev)
        assert.matches("rotary_cos: has 0 positions", err_of(pa.attention_with_kvcache,
          pa.tensor({ 1, 1, 1, 4 }, "f32", dev), kc, kc:clone(),
          { k = k, v = k, rotary_cos = cos, rotary_sin = cos, cache_seqlens = 0 }))
        assert.same({ 0, 0, 0, 0 }, kc:to_table(0, 4))
      end)
    end)

    it("softmax_scale = 0 and a denormal scale are used as given", function()
      for i, scale in ipairs { 0, 1e-40 } do
        local c = check.random_case(H.rng("hardening-scale", i), { dtype = "f32", mode = "read", B = 2 })
        c.softmax_scale = scale
        H.assert_check(check.run(c, assert(pa.device("cpu")), H.rng("hardening-scale-data", i)),
          H.seed("hardening-scale", i), SPEC)
      end
      -- scale 0: the plain mean of v over the keys
      local dev = assert(pa.device("cpu"))
      local kc = pa.randn({ 1, 4, 1, 2 }, "f32", dev, 1)
      local vc = pa.from_table({ 1, 2, 3, 4, 5, 6, 7, 8 }, { 1, 4, 1, 2 }, "f32", dev)
      local out = pa.attention_with_kvcache(pa.randn({ 1, 1, 1, 2 }, "f32", dev, 2), kc, vc,
        { softmax_scale = 0 })
      assert.same({ 4, 5 }, out:to_table())
    end)

    it("out-of-range numbers are reported as given, index arrays under their own name", function()
      local dev = assert(pa.device("cpu"))
      local q = pa.tensor({ 1, 1, 1, 4 }, "f32", dev)
      local kc = pa.tensor({ 1, 8, 1, 4 }, "f32", dev)
      local function e(opts) return err_of(pa.attention_with_kvcache, q, kc, kc:clone(), opts) end
      assert.matches("window_size: left: expected a whole number in %[%-1, 2%^31 %- 1%], got 2147483648",
        e { window_size = { 2 ^ 31, 0 } })
      assert.matches("window_size: right: .*got %-2", e { window_size = { 0, -2 } })
      assert.matches("num_splits: .*got 4294967296", e { num_splits = 2 ^ 32 })
      assert.matches("num_splits: .*got 1.5", e { num_splits = 1.5 })
      assert.matches("softmax_scale: 1e%+39 is not a finite float", e { softmax_scale = 1e39 })
      assert.matches("cache_seqlens: element 1 is 1.5, not a whole number", e { cache_seqlens = { 1.5 } })
      assert.matches("cache_seqlens: element 1 is 4294967296", e { cache_seqlens = { 2 ^ 32 } })
      assert.matches("block_table: row 1 entry 2 is 0.5", e { block_table = { { 0, 0.5 } }, cache_seqlens = 1 })
      assert.matches("max_seqlen_q: .*got 2147483648", err_of(pa.attention_varlen,
        pa.tensor({ 1, 1, 4 }, "f32", dev), kc, kc:clone(),
        { cu_seqlens_q = { 0, 1 }, seqused_k = { 1 }, max_seqlen_q = 2 ^ 31 }))
    end)
  end)

  describe("7. native memory the collector cannot see", function()
    it("a loop of dropped 16 MiB tensors stays bounded, and t:free() releases at once", function()
      local dev = assert(pa.device("cpu"))
      local function rss_mib()
        local f = io.open("/proc/self/status")
        if not f then return 0 end
        local kb = f:read("*a"):match("VmRSS:%s*(%d+)")
        f:close()
        return tonumber(kb) / 1024
      end
      collectgarbage("collect")
      local rss0, peak = rss_mib(), 0
      for _ = 1, H.scale(150) do
        pa.tensor({ 4 * 1024 * 1024 }, "f32", dev):fill(1) -- 16 MiB, touched
        peak = math.max(peak, rss_mib() - rss0)
      end
      local n = T.native_memory(dev)
      assert.is_true(n.collections > 0, "no collection was asked for")
      assert.is_true(n.live <= n.limit, "live " .. n.live .. " > limit " .. n.limit)
      -- the limit is 256 MiB at least; resident memory stays near it (it was 2.2 GB)
      assert.is_true(peak < 800, string.format("resident memory grew by %.0f MiB", peak))
      local t = pa.tensor({ 1024 * 1024 }, "f32", dev)
      local live = T.native_memory(dev).live
      t:free()
      assert.equal(live - 4 * 1024 * 1024, T.native_memory(dev).live)
      t:free() -- twice is harmless
      assert.matches("to_table: tensor: released by t:free%(%)", err_of(t.to_table, t))
      local cache = assert(pa.kv_cache { num_pages = 2, page_size = 2, kv_heads = 1, head_dim = 2, device = dev })
      assert.matches("free: tensor: a kv_cache's page pool uses it", err_of(cache.k_cache.free, cache.k_cache))
      cache:close()
      cache.k_cache:free()
    end)
  end)

  describe("8. threads", function()
    it("two threads reading the same caches write nothing shared (ThreadSanitizer)", function()
      local rc, out = H.sh("cc -print-file-name=libtsan.so")
      local tsan = rc == 0 and out:match("^(%S+)") or nil
      if not tsan or not tsan:find("/") then return pending("no ThreadSanitizer runtime (libtsan)") end
      if (os.getenv("PAGEDATTN_LIB") or ""):find("/debug/", 1, true) then
        -- (it builds the library once more, with TSan: the release pass of CI runs it)
        return pending("ThreadSanitizer build: run by the release pass")
      end
      local dir = H.tmpdir()
      local exe = dir .. "/threads_check"
      local lrc, list = H.sh("ls " .. H.root .. "/src/*.c " .. H.root .. "/src/core/*.c " .. H.root .. "/src/cpu/*.c " .. H.root .. "/src/cuda/*.c")
      assert(lrc == 0, list)
      rc, out = H.sh(string.format(
        "env -u LD_PRELOAD cc -std=gnu11 -O1 -g -fsanitize=thread -pthread -I'%s/src' -Wa,-I'%s/kernels' " ..
        "-o '%s' '%s/spec/threads_check.c' %s -lm -ldl", H.root, H.root, exe, H.root, (list:gsub("%s+", " "))))
      assert(rc == 0, "compiling spec/threads_check.c with -fsanitize=thread failed:\n" .. out)
      rc, out = H.sh("env -u LD_PRELOAD TSAN_OPTIONS=halt_on_error=1:exitcode=66 '" .. exe .. "'")
      H.sh("rm -rf '" .. dir .. "'")
      assert(rc == 0 and not out:find("WARNING: ThreadSanitizer", 1, true), out)
      assert.matches("2 threads x %d+ calls: same outputs", out)
    end)
  end)

  describe("9. large finite values", function()
    it("v near FLT_MAX gives a finite output where the exact one is finite (f32, bf16; splits; decode and prefill)", function()
      each_cpu(function(dev)
        for _, dt in ipairs { "f32", "bf16" } do
          for _, ns in ipairs { 1, 4 } do
            for _, sq in ipairs { 1, 40 } do
              local kc = pa.randn({ 2, 64, 2, 16 }, dt, dev, 1)
              local vc = pa.tensor({ 2, 64, 2, 16 }, dt, dev):fill(3e38)
              local q = pa.randn({ 2, sq, 4, 16 }, dt, dev, 2)
              local out = pa.attention_with_kvcache(q, kc, vc, { cache_seqlens = 64, num_splits = ns })
              local want = vc:to_table(0, 1)[1]
              for i, x in ipairs(out:to_table()) do
                if not (math.abs(x - want) <= want * 2 ^ -7) then
                  error(string.format("%s %s splits %d sq %d: element %d is %g, expected %g", dev.name, dt,
                    ns, sq, i, x, want))
                end
              end
            end
          end
        end
      end)
    end)
  end)

  describe("found by the fuzzers (spec/fuzz)", function()
    it("unstage after a fork refuses, leaving no shared page reserved", function()
      local c = assert(pa.kv_cache { num_pages = 8, page_size = 1, layers = 0 })
      local a = assert(assert(c:sequence()):append(2))
      assert(a:reserve(2))
      local b = c:batch { device = "cpu" }
      b:add(a, 2)
      assert(b:stage())
      local kid = assert(a:fork())
      assert.matches("batch: sequence %d+'s staged tokens are shared now", err_of(b.unstage, b))
      c:validate()
      assert.equal(4, a:len())
      assert(a:append(1)) -- into a page of its own: the fork's pages stay the fork's
      local theirs = {}
      for _, pg in ipairs(kid:pages()) do theirs[pg] = true end
      assert.is_nil(theirs[a:pages()[5]])
      c:validate()
      c:close()
    end)

    it("a CSR page list shorter than its keys need is refused, nothing written", function()
      local kc, vc = pa.tensor({ 8, 4, 1, 1 }):fill(1), pa.tensor({ 8, 4, 1, 1 }):fill(1)
      local q, k = pa.tensor({ 2, 1, 1, 1 }), pa.from_table({ 7, 9 }, { 2, 1, 1, 1 })
      assert.matches("kv_indptr: sequence 1 has 1 page, its 6 keys need 2", err_of(pa.attention_with_kvcache,
        q, kc, vc, { k = k, v = k, cache_seqlens = { 2, 5 }, kv_indptr = { 0, 2, 3 }, kv_indices = { 0, 3, 1 } }))
      assert.same({ 1, 1, 1, 1 }, kc:to_table(0, 4))
    end)

    it("a huge empty batch with a mis-shaped k is refused at once", function()
      local B, kc, k = 2 ^ 27 - 1, pa.tensor({ 4, 4, 1, 1 }), pa.tensor({ 1, 1, 1, 1 })
      local t0 = pa.clock()
      assert.matches("k: expected shape", err_of(pa.attention_with_kvcache, pa.tensor({ B, 0, 1, 1 }), kc,
        kc:clone(), { k = k, v = k, cache_seqlens = 0, block_table = pa.tensor({ B, 0 }, "i32") }))
      assert.is_true(pa.clock() - t0 < 0.1, "took " .. (pa.clock() - t0) .. " s")
    end)

    it("b:append_kv with opts not a table names opts", function()
      local c = assert(pa.kv_cache { num_pages = 4, page_size = 4, kv_heads = 1, head_dim = 2 })
      local b = c:batch()
      b:add(assert(c:sequence()), 1)
      assert(b:stage())
      local k = pa.tensor({ 1, 1, 2 })
      assert.matches("pagedattn.batch:append_kv: opts: ", err_of(b.append_kv, b, k, k, 5), 1, true)
      c:close()
    end)

    it("return_softmax_lse with a q of the wrong rank names q", function()
      local kc = pa.tensor({ 4, 4, 1, 8 })
      assert.matches("attention_varlen: q: ", err_of(pa.attention_varlen, pa.tensor({ 8 }), kc, kc:clone(),
        { cu_seqlens_q = { 0, 8 }, seqused_k = { 8 }, block_table = { { 0, 1 } }, return_softmax_lse = true }), 1, true)
    end)

    it("an empty q's lse is not allocated before q is checked", function()
      local kc = pa.tensor({ 4, 4, 1, 8 })
      assert.matches("attention_with_kvcache: q: ", err_of(pa.attention_with_kvcache,
        pa.tensor({ 1, 2 ^ 20, 2 ^ 20, 0 }), kc, kc:clone(), { return_softmax_lse = true }), 1, true)
    end)
  end)

  describe("on CUDA #gpu", function()
    local dev, why = G.device()
    if G.pending_without(pending, dev, why) then return end
    it("key counts are refused past 2^30 and right at it", function() key_limits(dev) end)
    it("v near the largest bf16 / f32 value gives a finite output (decode kernels, the fallback; splits)", function()
      -- D 128: the tensor-core decode; 40: the CUDA-core decode and the fallback (the
      -- tensor-core prefill kernels keep their softmax: kernels/attn_common.cuh says why)
      for _, dt in ipairs { "bf16", "f32" } do
        for _, D in ipairs { 128, 40 } do
          for _, sq in ipairs(D == 128 and dt == "bf16" and { 1, 3, 8 } or { 1, 3, 200 }) do
            for _, ns in ipairs { 0, 1, 4 } do
              local kc = pa.randn({ 2, 512, 2, D }, dt, dev, 1)
              local vc = pa.tensor({ 2, 512, 2, D }, dt, dev):fill(3e38)
              local q = pa.randn({ 2, sq, 8, D }, dt, dev, 2)
              local out = assert(pa.attention_with_kvcache(q, kc, vc, { cache_seqlens = 512, num_splits = ns, causal = true }))
              local want = vc:to_table(0, 1)[1]
              for i, x in ipairs(out:to_table()) do
                if not (math.abs(x - want) <= want * 2 ^ -6) then
                  error(string.format("%s D %d sq %d splits %d: element %d is %g, expected %g", dt, D, sq, ns, i, x, want))
                end
              end
            end
          end
        end
      end
    end)

    it("a view outlives its batch: a clear error", function()
      local cache = assert(pa.kv_cache { num_pages = 8, page_size = 4, kv_heads = 1, head_dim = 8, device = dev })
      local b = assert(cache:batch())
      b:add(assert(cache:sequence()), 5)
      assert(b:stage())
      local bt = b.block_table
      cache:close()
      assert.matches("its batch was closed", err_of(bt.to_table, bt))
    end)
  end)
end)
