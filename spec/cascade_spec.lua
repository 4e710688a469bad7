-- spec/cascade_spec.lua -- shared prefixes read once (batch{cascade = true}):
-- the groups the stage plans from the pool's pages (forks of forks, partial
-- shared pages, groups of one, the caller's groups), and b:attention's two
-- levels against the plain call and the float64 reference on random sharing
-- structures with every option that makes sense with them (and the plain
-- call, named, for those that do not), on cpu and cpu:staged.
local pa = require "pagedattn"
local ref = require "pagedattn.reference"
local H = require "helpers"

local SPEC = "spec/cascade_spec.lua"

local function to_ref(t) return ref.tensor(t.shape, t:to_table()) end
local function pick(rng, list) return list[rng:int(1, #list)] end
local function chance(rng, p) return rng:uniform() < p end

local function ints(t)
  local v = t:to_table()
  return v
end

-- Rotary tables [n, dim / 2] (f32), as a model would have them.
local function rotary_tables(n, dim, dev)
  local cs, sn = {}, {}
  for pos = 0, n - 1 do
    for j = 0, dim / 2 - 1 do
      local theta = pos * 10000 ^ (-2 * j / dim)
      cs[#cs + 1], sn[#sn + 1] = math.cos(theta), math.sin(theta)
    end
  end
  return pa.from_table(cs, { n, dim / 2 }, "f32", dev), pa.from_table(sn, { n, dim / 2 }, "f32", dev)
end

-- A random sharing structure on a pool: roots, forks, forks of forks (some
-- grown before forking again), truncations into shared pages, lone
-- sequences. Returns the live sequences (bookkeeping only: the caches are
-- filled afterwards).
local function random_structure(rng, cache, ps)
  local live = {}
  for _ = 1, rng:int(1, 3) do
    local s = cache:sequence()
    assert(s:append(rng:int(0, 6 * ps + 2)))
    live[#live + 1] = s
  end
  for _ = 1, rng:int(2, 10) do
    local s = pick(rng, live)
    local u = rng:uniform()
    if u < 0.55 then
      local c = assert(s:fork())
      if chance(rng, 0.5) then assert(c:append(rng:int(1, 3 * ps))) end
      live[#live + 1] = c
    elseif u < 0.7 and s:len() > 0 then
      s:truncate(rng:int(0, s:len()))
    elseif u < 0.85 then
      assert(s:append(rng:int(1, 2 * ps)))
    else
      local n = cache:sequence()
      assert(n:append(rng:int(0, 4 * ps)))
      live[#live + 1] = n
    end
  end
  return live
end

describe("shared prefixes (batch{cascade = true})", function()
  it("groups forks of forks by the page reads they save, one level each", function()
    local c = assert(pa.kv_cache { num_pages = 512, page_size = 4, layers = 0 })
    local b = c:batch { cascade = true, device = "cpu" }
    local sys = c:sequence()
    assert(sys:append(32)) -- 8 whole pages
    local others, conv = {}, sys:fork()
    assert(conv:append(80)) -- 20 more pages
    for i = 1, 4 do others[i] = sys:fork() end
    local x, y = conv:fork(), conv:fork()
    b:clear()
    for i = 1, 4 do b:add(others[i], 1) end
    b:add(x, 1):add(y, 1)
    assert(b:stage())
    local ci = b:cascade_info()
    -- the four share the system prompt (saving 3 x 8 reads); x and y share
    -- it and the conversation, 28 pages (saving 28, more than 2 x 8 joining)
    assert.equal(2, ci.groups)
    assert.equal(6, ci.grouped)
    assert.equal(8 + 28, ci.prefix_pages)
    assert.equal(3 * 8 + 28, ci.saved_pages)
    assert.equal(28, ci.prefix_width)
    assert.same({ 32, 112 }, ints(b.prefix_seqused_k))
    assert.same({ 0, 4, 6 }, ints(b.prefix_cu_seqlens_q))
    assert.same({ 0, 1, 2, 3, 4, 5 }, ints(b.prefix_rows))
    assert.same({ 0, 1, 2, 3, 4, 5 }, ints(b.prefix_row_of))
    local sys_pages, conv_pages = sys:pages(), conv:pages()
    local pbt = ints(b.prefix_block_table)
    for j = 1, 8 do assert.equal(sys_pages[j], pbt[j]) end
    for j = 9, 28 do assert.equal(0, pbt[j]) end -- padding
    for j = 1, 28 do assert.equal(conv_pages[j], pbt[28 + j]) end
    -- the suffixes: each entry's own page (its new token), past the prefix
    assert.same({ 1, 1, 1, 1, 1, 1 }, ints(b.suffix_seqused_k))
    assert.same({ 0, 0, 0, 0, 0, 0 }, ints(b.suffix_cache_seqlens))
    -- with one other entry only, the system prompt's group would be one entry: none
    b:clear():add(others[1], 1):add(x, 1):add(y, 1)
    assert(b:stage())
    ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(2, ci.grouped)
    assert.same({ -1, 0, 1 }, ints(b.prefix_row_of))
    c:close()
  end)

  it("shares only whole pages from before the step, and needs two entries with new tokens", function()
    local c = assert(pa.kv_cache { num_pages = 256, page_size = 4, layers = 0 })
    local b = c:batch { cascade = true, device = "cpu" }
    local root = c:sequence()
    assert(root:append(10)) -- pages 0, 1 whole, page 2 holds 2 tokens
    local a, d, e = root:fork(), root:fork(), root:fork()
    b:clear():add(a, 1):add(d, 3):add(e, 0) -- e attends without new tokens: not in a group
    assert(b:stage())
    local ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(2, ci.grouped)
    assert.equal(2, ci.prefix_width) -- the partial page was copied for a and d: their own
    assert.same({ 8 }, ints(b.prefix_seqused_k))
    assert.same({ 3, 5, 10 }, ints(b.suffix_seqused_k))
    assert.same({ 2, 2, 10 }, ints(b.suffix_cache_seqlens))
    assert.equal(12, ci.max_grouped_pos) -- d's last new token
    -- a sequence that shares nothing, and a lone one: no groups
    local f = c:sequence()
    assert(f:append(9))
    b:clear():add(f, 1):add(a, 1)
    assert(b:stage())
    assert.equal(0, b:cascade_info().groups)
    assert.equal(0, b.prefix_block_table.shape[1])
    assert.equal(0, b.suffix_block_table.shape[1])
    -- truncated into a shared page: only the pages whole for every member
    local g = root:fork()
    g:truncate(6) -- page 1 is now partial for g (it is still root's page)
    local h = root:fork()
    b:clear():add(g, 1):add(h, 1)
    assert(b:stage())
    ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.same({ 4 }, ints(b.prefix_seqused_k))
    c:validate()
    c:close()
  end)

  it("takes the caller's groups (the pages common to each), and refuses them on a plain batch", function()
    local c = assert(pa.kv_cache { num_pages = 256, page_size = 2, layers = 0 })
    local b = c:batch { cascade = true, device = "cpu" }
    local r1, r2 = c:sequence(), c:sequence()
    assert(r1:append(8))
    assert(r2:append(6))
    local a1, a2, a3 = r1:fork(), r1:fork(), r1:fork()
    local b1, b2 = r2:fork(), r2:fork()
    assert(a3:append(2))
    local a4 = a3:fork()
    -- group 7 holds a1, a2, a3, a4 (4 pages common), group 3 holds b1 and a
    -- stranger (nothing common: no group), b2 alone
    b:clear():add(a1, 1, 7):add(b1, 1, 3):add(a2, 1, 7):add(a3, 2, 7):add(r1, 1, 3):add(b2, 1):add(a4, 1, 7)
    assert(b:stage())
    local ci = b:cascade_info()
    assert.equal(1, ci.groups)
    assert.equal(4, ci.grouped)
    assert.same({ 8 }, ints(b.prefix_seqused_k))
    assert.same({ 0, 5 }, ints(b.prefix_cu_seqlens_q))
    assert.same({ 0, 2, 3, 4, 7 }, ints(b.prefix_rows))
    -- the next step without groups: found from the pages again (r1 with the a's, r2's forks)
    b:clear():add(a1, 1):add(b1, 1):add(a2, 1):add(b2, 1):add(r1, 1)
    assert(b:stage())
    ci = b:cascade_info()
    assert.equal(2, ci.groups)
    local plain = c:batch { device = "cpu" }
    assert.matches("group: the batch was made without cascade = true", H.error_of(function() plain:add(a1, 1, 0) end))
    assert.matches("group: expected a whole number >= 0", H.error_of(function() b:add(a1, 1, -1) end))
    assert.matches("cascade: expected a boolean", H.error_of(function() c:batch { cascade = 1 } end))
    c:close()
  end)

  for _, name in ipairs { "cpu", "cpu:staged" } do
    it("gives the plain call's results (float64 reference, tolerance rule) on random sharing structures on " .. name,
      function()
      local dev = assert(pa.device(name))
      local used, reasons = 0, {}
      local cases = H.scale(36)
      for case = 1, cases do
        local seed = H.seed("cascade-" .. name, case)
        local rng = ref.rng(seed)
        local dtype = pick(rng, { "f32", "f32", "bf16", "f16" })
        local ps = pick(rng, { 1, 3, 4, 16 })
        local Hk, G, D = pick(rng, { 1, 2 }), pick(rng, { 1, 2, 4 }), pick(rng, { 8, 16, 32 })
        local Hq = Hk * G
        local cache = assert(pa.kv_cache { num_pages = 600, page_size = ps, kv_heads = Hk, head_dim = D,
          dtype = dtype, device = dev })
        local live = random_structure(rng, cache, ps)
        -- the keys: random, in the dtype (shared pages hold one copy)
        cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, dtype, dev, seed))
        cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, dtype, dev, seed + 1))
        local form4 = chance(rng, 0.2)
        local b = cache:batch { cascade = true }
        local labels = chance(rng, 0.25)
        local entries = {}
        rng:shuffle(live)
        local s_new = rng:int(1, 3)
        for i = 1, #live do
          if chance(rng, 0.85) then
            local n = form4 and s_new or pick(rng, { 1, 1, 1, 0, 2, 5 })
            local grp = labels and chance(rng, 0.8) and rng:int(0, 2) or nil
            b:add(live[i], n, grp)
            entries[#entries + 1] = live[i]
          end
        end
        if #entries == 0 then b:add(live[1], form4 and s_new or 1); entries[1] = live[1] end
        assert(b:stage())
        local T, B = b.total_q, b.size
        -- options
        local o = {}
        if chance(rng, 0.2) then
          o.causal = false
          if chance(rng, 0.5) then o.window_size = { -1, rng:int(0, 3) } end
        end
        if chance(rng, 0.3) then o.softcap = pick(rng, { 2, 10 }) end
        if chance(rng, 0.2) then o.softmax_scale = 0.05 + rng:uniform() end
        if chance(rng, 0.2) then o.num_splits = rng:int(1, 3) end
        if chance(rng, 0.6) then o.return_softmax_lse = true end
        local info0 = b:cascade_info()
        local wl = -1
        if chance(rng, 0.15) then
          wl = chance(rng, 0.5) and rng:int(0, 3) or info0.max_grouped_pos + rng:int(0, 4)
          o.window_size = { wl, o.window_size and o.window_size[2] or -1 }
        end
        if chance(rng, 0.1) then
          local sl = {}
          for h = 1, Hq do sl[h] = 0.25 * h end
          o.alibi_slopes = pa.from_table(sl, { Hq }, "f32", dev)
        end
        -- the plain call where the levels would not give its results
        local want = info0.groups == 0 and "no groups" or o.alibi_slopes and "alibi"
          or (wl >= 0 and wl < info0.max_grouped_pos) and "window" or "used"
        local appended = not form4 and chance(rng, 0.15) -- k/v appended first (append_kv), then attention
        local rot = T > 0 and chance(rng, 0.4)
        local rotdim = rot and 2 * rng:int(1, D / 2) or nil
        local cos, sin
        if rot then
          cos, sin = rotary_tables(b.max_seqlen_k + 2, rotdim, dev)
          o.rotary_cos, o.rotary_sin = cos, sin
          if chance(rng, 0.5) then o.rotary_interleaved = false end
        end
        local qshape = form4 and { B, s_new, Hq, D } or { T, Hq, D }
        local kshape = form4 and { B, s_new, Hk, D } or { T, Hk, D }
        local q = pa.randn(qshape, dtype, dev, seed + 2)
        local k, v = pa.randn(kshape, dtype, dev, seed + 3), pa.randn(kshape, dtype, dev, seed + 4)
        local k0, v0 = cache.k_cache:clone(), cache.v_cache:clone()
        local function run(fn)
          if appended then
            local ao = { rotary_cos = o.rotary_cos, rotary_sin = o.rotary_sin, rotary_interleaved = o.rotary_interleaved }
            assert(b:append_kv(k, v, ao))
            local oo = {}
            for key, val in pairs(o) do oo[key] = val end
            oo.rotary_cos, oo.rotary_sin, oo.rotary_interleaved = nil, nil, nil
            return fn(nil, nil, oo)
          end
          return fn(k, v, o)
        end
        -- the cascade
        local out1, lse1 = run(function(kk, vv, oo) return b:attention(q, kk, vv, oo) end)
        assert(out1, lse1)
        local info = b:cascade_info()
        local what = string.format("case %d (seed %d, %s page %d H %d/%d D %d, %d entries, %s, info %d groups %d grouped)",
          case, seed, dtype, ps, Hq, Hk, D, B, form4 and "with_kvcache" or "varlen", info.groups, info.grouped)
        assert(info.last == want, what .. ": the call ran '" .. info.last .. "', expected '" .. want .. "'")
        if info.last == "used" then used = used + 1 else reasons[info.last] = (reasons[info.last] or 0) + 1 end
        local k1, v1 = cache.k_cache:to_table(), cache.v_cache:to_table()
        -- the plain call on the same tables, from the same caches
        cache.k_cache:copy_from(k0)
        cache.v_cache:copy_from(v0)
        local out2 = run(function(kk, vv, oo)
          local po = { k = kk, v = vv, block_table = b.block_table, causal = oo.causal ~= false }
          for key, val in pairs(oo) do if key ~= "causal" then po[key] = val end end
          if form4 then
            po.cache_seqlens = kk and b.cache_seqlens or b.seqused_k
            return assert(pa.attention_with_kvcache(q, cache.k_cache, cache.v_cache, po))
          end
          po.cu_seqlens_q, po.seqused_k = b.cu_seqlens_q, b.seqused_k
          return assert(pa.attention_varlen(q, cache.k_cache, cache.v_cache, po))
        end)
        assert(ref.max_abs_diff(k1, cache.k_cache:to_table()) == 0, what .. ": the caches differ from the plain call's")
        assert(ref.max_abs_diff(v1, cache.v_cache:to_table()) == 0, what .. ": the caches differ from the plain call's")
        -- the reference, from the caches before the step (after append_kv's append when it ran first)
        local rk, rv
        if appended then
          rk, rv = to_ref(cache.k_cache), to_ref(cache.v_cache)
        else
          rk, rv = to_ref(k0), to_ref(v0)
        end
        local ro = { block_table = to_ref(b.block_table), causal = o.causal ~= false, softcap = o.softcap,
          softmax_scale = o.softmax_scale, window_size = o.window_size,
          alibi_slopes = o.alibi_slopes and to_ref(o.alibi_slopes) }
        if not appended then
          ro.k, ro.v = to_ref(k), to_ref(v)
          if rot then
            ro.rotary_cos, ro.rotary_sin, ro.rotary_interleaved = to_ref(cos), to_ref(sin), o.rotary_interleaved
          end
        end
        local f = ref.attention_varlen
        if form4 then
          f = ref.attention_with_kvcache
          ro.cache_seqlens = to_ref(appended and b.seqused_k or b.cache_seqlens)
        else
          ro.cu_seqlens_q, ro.seqused_k = to_ref(b.cu_seqlens_q), to_ref(b.seqused_k)
        end
        local rq = to_ref(q)
        local exact, exact_lse = f(rq, ref.copy(rk), ref.copy(rv), ro)
        ro.precision, ro.cache_dtype = dtype, dtype
        local naive, naive_lse = f(rq, ref.copy(rk), ref.copy(rv), ro)
        local tol = ref.tolerance(dtype, ref.max_abs_diff(naive.data, exact.data))
        local err1 = ref.max_abs_diff(out1:to_table(), exact.data)
        local err2 = ref.max_abs_diff(out2:to_table(), exact.data)
        assert(err1 <= tol, string.format("%s: cascade err %g > tolerance %g (plain call: %g)\n  %s", what, err1, tol,
          err2, H.rerun(SPEC)))
        if lse1 then
          local ltol = ref.tolerance("f32", ref.max_abs_diff(naive_lse.data, exact_lse.data))
          local lerr = ref.max_abs_diff(lse1:to_table(), exact_lse.data)
          assert(lerr <= ltol, string.format("%s: lse err %g > tolerance %g\n  %s", what, lerr, ltol, H.rerun(SPEC)))
        end
        cache:validate()
        cache:close()
      end
      -- most cases must have run the two levels, or this spec proves little
      assert(used >= cases * 0.4, string.format("only %d of %d cases ran the two levels (%s)", used, cases,
        (function()
          local parts = {}
          for r, n in pairs(reasons) do parts[#parts + 1] = r .. " " .. n end
          return table.concat(parts, ", ")
        end)()))
    end)
  end

  it("rotates q where the plain call does (each token's position when causal or windowed, else its entry's first)",
    function()
    local dev = assert(pa.device("cpu:staged"))
    for case, mode in ipairs { "causal", "none", "right", "causal", "none", "right" } do
      local seed = H.seed("cascade-rotary", case)
      local rng = ref.rng(seed)
      local cache = assert(pa.kv_cache { num_pages = 128, page_size = 4, kv_heads = 2, head_dim = 16, device = dev })
      local root = cache:sequence()
      assert(root:append(13))
      cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, "f32", dev, seed))
      cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, "f32", dev, seed + 1))
      local kids = { root:fork(), root:fork(), root:fork() }
      local b = cache:batch { cascade = true }
      b:clear():add(kids[1], 3):add(root, 1):add(kids[2], 4):add(kids[3], 2)
      assert(b:stage())
      local T = b.total_q
      local cos, sin = rotary_tables(b.max_seqlen_k + 1, case > 3 and 8 or 16, dev)
      local o = { rotary_cos = cos, rotary_sin = sin, rotary_interleaved = case % 2 == 0, return_softmax_lse = true,
        causal = mode == "causal", window_size = mode == "right" and { -1, 1 } or nil }
      local q = pa.randn({ T, 4, 16 }, "f32", dev, seed + 2)
      local k, v = pa.randn({ T, 2, 16 }, "f32", dev, seed + 3), pa.randn({ T, 2, 16 }, "f32", dev, seed + 4)
      local rk, rv = to_ref(cache.k_cache), to_ref(cache.v_cache)
      local out, lse = assert(b:attention(q, k, v, o))
      assert.equal("used", b:cascade_info().last)
      assert.equal(3, b:cascade_info().calls) -- the append, the two levels
      local exact, exact_lse = ref.attention_varlen(to_ref(q), rk, rv, { block_table = to_ref(b.block_table),
        cu_seqlens_q = to_ref(b.cu_seqlens_q), seqused_k = to_ref(b.seqused_k), k = to_ref(k), v = to_ref(v),
        rotary_cos = to_ref(cos), rotary_sin = to_ref(sin), rotary_interleaved = o.rotary_interleaved,
        causal = o.causal, window_size = o.window_size })
      local err, lerr = ref.max_abs_diff(out:to_table(), exact.data), ref.max_abs_diff(lse:to_table(), exact_lse.data)
      assert(err <= 2e-5 and lerr <= 2e-5, string.format("%s (seed %d): err %g, lse err %g (%s)", mode, seed, err, lerr,
        H.rerun(SPEC)))
      cache:close()
    end
  end)

  it("changes nothing on a caller's mistake, and makes one plain call where the levels do not apply", function()
    local dev = assert(pa.device("cpu"))
    local cache = assert(pa.kv_cache { num_pages = 64, page_size = 4, kv_heads = 2, head_dim = 8, device = dev })
    local root = cache:sequence()
    assert(root:append(12))
    cache.k_cache:copy_from(pa.randn(cache.k_cache.shape, "f32", dev, 1))
    cache.v_cache:copy_from(pa.randn(cache.v_cache.shape, "f32", dev, 2))
    local a, c = root:fork(), root:fork()
    local b = cache:batch { cascade = true }
    b:clear():add(a, 1):add(c, 1)
    assert(b:stage())
    local q = pa.randn({ 2, 4, 8 }, "f32", dev, 3)
    local k, v = pa.randn({ 2, 2, 8 }, "f32", dev, 4), pa.randn({ 2, 2, 8 }, "f32", dev, 5)
    local cos, sin = rotary_tables(12, 8, dev) -- one position short of the new tokens' 12
    local before = cache.k_cache:to_table()
    local function e(...) return H.error_of(b.attention, b, ...) end
    assert.matches("rotary_cos: has 12 positions, sequence 0 needs position 12",
      e(q, k, v, { rotary_cos = cos, rotary_sin = sin }))
    assert.matches("out: dtype bf16", e(q, k, v, { out = pa.tensor({ 2, 4, 8 }, "bf16", dev) }))
    assert.matches("q: 3 heads is not a multiple", e(pa.randn({ 2, 3, 8 }, "f32", dev, 6), k, v))
    assert.matches("block_table: set by the batch", e(q, k, v, { block_table = b.block_table }))
    assert.matches("k: expected shape %[2, 2, 8%]", e(q, pa.randn({ 3, 2, 8 }, "f32", dev, 7), v))
    assert.same(before, cache.k_cache:to_table())
    assert.same({ 12, 12 }, ints(b.cache_seqlens))
    local out = assert(b:attention(q, k, v, { alibi_slopes = { 0.5, 1, 1.5, 2 } }))
    assert.equal("alibi", b:cascade_info().last)
    assert.equal(1, b:cascade_info().calls)
    assert.equal(2, out.shape[1])
    assert(b:attention(q, nil, nil))
    assert.equal("used", b:cascade_info().last)
    assert.equal(2, b:cascade_info().calls)
    cache:close()
  end)
end)
