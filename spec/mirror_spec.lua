-- Host mirrors of i32 index tensors (src/core/tensor.c): on a device the host
-- cannot address, attention validates and plans from the host copy that the
-- library kept when it wrote a tensor from host data, instead of downloading
-- it (which waits for the device) -- and never from a stale copy: every other
-- write (a device-to-device copy from an unmirrored tensor, a write through
-- the address that data_ptr handed out) makes it download again.
--
-- Runs on "cpu:staged" (the CPU backend behind a discrete device's interface,
-- so CI covers the paths a GPU takes) and, tagged #gpu, on the CUDA device
-- (PAGEDATTN_GPU_SPEC_DEVICE picks another), with a check there that calls
-- queue without waiting for the device.
-- Rerun a failure with the printed seed: PAGEDATTN_SEED=N scripts/test spec/mirror_spec.lua
local ffi = require "ffi"
local pa = require "pagedattn"
local core = require "pagedattn.core"
local ref = require "pagedattn.reference"
local G = require "gpu_helpers"
local H = require "helpers"

local SPEC = "spec/mirror_spec.lua"
-- exported by the library, not in its header (a counter for the specs)
local C = core.C
local function downloads() return tonumber(C.pa_debug_index_downloads()) end

local cpu = assert(pa.device("cpu"))

-- max |a - b| over two flat tables of the same length
local function max_diff(a, b)
  assert.equal(#a, #b)
  return ref.max_abs_diff(a, b)
end

local function near(got, want, tol, what)
  local d = max_diff(got, want)
  if not (d <= tol) then
    error(string.format("%s: max |diff| %.3g > %.3g\n  %s", what, d, tol, H.rerun(SPEC)), 2)
  end
end

-- Counts the index downloads that fn makes.
local function count(fn)
  local before = downloads()
  local r = fn()
  return downloads() - before, r
end

-- A small paged decode problem on dev: B sequences, f32, random caches (the
-- same values on every device for a seed).
local B, HQ, HK, D, PS, NP, W = 3, 4, 2, 16, 4, 24, 5
local function problem(dev, seed)
  return {
    dev = dev,
    q = assert(pa.randn({ B, 1, HQ, D }, "f32", dev, seed)),
    kc = assert(pa.randn({ NP, PS, HK, D }, "f32", dev, seed + 1)),
    vc = assert(pa.randn({ NP, PS, HK, D }, "f32", dev, seed + 2)),
  }
end

-- A random block table [B, W] (distinct pages) and lengths within it.
local function tables(rng)
  local ids = {}
  for i = 1, NP do ids[i] = i - 1 end
  rng:shuffle(ids)
  local bt, lens = {}, {}
  for i = 1, B * W do bt[i] = ids[i] end
  for b = 1, B do lens[b] = rng:int(1, W * PS) end
  return bt, lens
end

-- The tables as i32 tensors on dev, written from the host.
local function upload(bt, lens, dev)
  return assert(pa.from_table(bt, { B, W }, "i32", dev)), assert(pa.from_table(lens, { B }, "i32", dev))
end

local function attend(p, bt, cs)
  local out = assert(pa.tensor({ B, 1, HQ, D }, "f32", p.dev))
  assert(pa.attention_with_kvcache(p.q, p.kc, p.vc, { block_table = bt, cache_seqlens = cs, out = out }))
  return out:to_table()
end

-- What attention gives on the same device with fresh tensors of these tables.
local function truth(p, bt, lens)
  return attend(p, upload(bt, lens, p.dev))
end

-- Writes values into a fresh i32 tensor in two partial writes: it holds them,
-- but no mirror (a partial write over unknown contents keeps none).
local function unmirrored(values, shape, dev)
  local t = assert(pa.tensor(shape, "i32", dev))
  local half = math.floor(#values / 2)
  local a, b = {}, {}
  for i = 1, half do a[i] = values[i] end
  for i = half + 1, #values do b[i - half] = values[i] end
  assert(t:write(a, 0))
  assert(t:write(b, half))
  return t
end

local function mirror_cases(dev, name)
  local staged = dev.name == "cpu:staged"
  local tol = staged and 1e-6 or 1e-4 -- CUDA vs CPU kernels: f32 rounding
  local same = staged and 1e-6 or 1e-5 -- the same call twice on the device
  -- (the GPU specs' dry run on the plain CPU: it reads index tensors where
  -- they are, so there are no downloads to count)
  local function downloads_counted()
    if dev.name ~= "cpu" then return true end
    pending("the dry run on the CPU reads index tensors in place: no downloads to count")
  end

  -- a case's problem on dev, its rng, and its first tables (uploaded)
  local function setup(label)
    local seed = H.seed(label .. " " .. name)
    local rng = ref.rng(seed)
    local p = problem(dev, seed)
    local bt, lens = tables(rng)
    local dbt, dcs = upload(bt, lens, dev)
    return p, rng, bt, lens, dbt, dcs, seed
  end

  it("attention with tables written from the host does not download them, and is right", function()
    local p, _, bt, lens, dbt, dcs, seed = setup("mirror tables")
    local pc = problem(cpu, seed)
    local want = attend(pc, upload(bt, lens, cpu))
    local n, got = count(function() return attend(p, dbt, dcs) end)
    assert.equal(0, n)
    near(got, want, tol, "paged decode on " .. name .. " vs the CPU")
    -- the varlen form: cu_seqlens_q and seqused_k too (Lua arrays become tensors)
    local q3 = assert(pa.randn({ B, HQ, D }, "f32", dev, seed + 3))
    local q3c = assert(pa.randn({ B, HQ, D }, "f32", cpu, seed + 3))
    local cu = { 0, 1, 2, 3 }
    local o = { block_table = dbt, cu_seqlens_q = cu, seqused_k = lens }
    local nv, out = count(function() return assert(pa.attention_varlen(q3, p.kc, p.vc, o)) end)
    assert.equal(0, nv)
    local oc = { block_table = assert(pa.from_table(bt, { B, W }, "i32", cpu)), cu_seqlens_q = cu, seqused_k = lens }
    near(out:to_table(), assert(pa.attention_varlen(q3c, pc.kc, pc.vc, oc)):to_table(), tol, "varlen on " .. name)
  end)

  it("a device-to-device copy from an unmirrored tensor: attention downloads the new contents", function()
    if not downloads_counted() then return end
    local p, rng, bt, lens, dbt, dcs = setup("mirror copy")
    local bt2, lens2 = tables(rng)
    local old = attend(p, dbt, dcs)
    dbt:copy_from(unmirrored(bt2, { B, W }, dev))
    dcs:copy_from(unmirrored(lens2, { B }, dev))
    local n, got = count(function() return attend(p, dbt, dcs) end)
    assert.equal(2, n)
    local want = truth(p, bt2, lens2)
    near(got, want, same, "after the copies")
    assert.is_true(max_diff(old, want) > 1e-3, "the new tables should change the result")
    -- an unmirrored table stays so: every call downloads it
    assert.equal(2, (count(function() return attend(p, dbt, dcs) end)))
    -- a full write from the host mirrors it again
    assert(dbt:write(bt))
    assert(dcs:write(lens))
    local n2, back = count(function() return attend(p, dbt, dcs) end)
    assert.equal(0, n2)
    near(back, old, same, "written back")
  end)

  it("a copy from a mirrored tensor carries the mirror", function()
    local p, rng, _, _, dbt, dcs = setup("mirror copy mirrored")
    local bt2, lens2 = tables(rng)
    attend(p, dbt, dcs)
    dbt:copy_from(assert(pa.from_table(bt2, { B, W }, "i32", dev)))
    dcs:copy_from(assert(pa.from_table(lens2, { B }, "i32", dev)))
    local n, got = count(function() return attend(p, dbt, dcs) end)
    assert.equal(0, n)
    near(got, truth(p, bt2, lens2), same, "after copies from mirrored tensors")
  end)

  it("partial writes keep a mirror up to date; fills make one", function()
    local p, rng, bt, lens, dbt, dcs = setup("mirror partial")
    attend(p, dbt, dcs)
    -- sequence 2 gets other pages (the spare ones past B * W) and every
    -- sequence a new length
    local spare = {}
    for i = B * W + 1, NP do spare[#spare + 1] = i - 1 end
    local row = {}
    for j = 1, W do row[j] = spare[(j - 1) % #spare + 1] end
    assert(dbt:write(row, W))
    for j = 1, W do bt[W + j] = row[j] end
    local l2 = { rng:int(1, W * PS), rng:int(1, W * PS) }
    assert(dcs:write(l2, 1))
    lens[2], lens[3] = l2[1], l2[2]
    local n, got = count(function() return attend(p, dbt, dcs) end)
    assert.equal(0, n)
    near(got, truth(p, bt, lens), same, "after partial writes")
    -- fill: every sequence the same length
    assert(pa.tensor({ B }, "i32", dev)) -- (a tensor never written: no mirror, not used)
    dcs:fill(7)
    local nf, gotf = count(function() return attend(p, dbt, dcs) end)
    assert.equal(0, nf)
    near(gotf, truth(p, bt, { 7, 7, 7 }), same, "after a fill")
  end)

  -- The call raises an error naming the block table entry (a Lua pattern)
  -- and writes nothing.
  local function refused(p, dbt, dcs, entry)
    local out = assert(pa.tensor({ B, 1, HQ, D }, "f32", p.dev))
    local ok, err = pcall(pa.attention_with_kvcache, p.q, p.kc, p.vc,
      { block_table = dbt, cache_seqlens = dcs, out = out })
    assert.is_false(ok, "a page outside the pool was not refused")
    assert.matches("block_table: entry " .. entry, tostring(err))
    for _, x in ipairs(out:to_table()) do assert.equal(0, x) end
  end

  -- attention with dbt against what fresh tables give, dbt's call last: its
  -- check is the one the context keeps when the next step changes dbt
  local function kept(p, dbt, dcs, want_bt, want_lens, what)
    local want = truth(p, want_bt, want_lens)
    near(attend(p, dbt, dcs), want, same, what)
  end

  it("the page-id check is kept between calls and follows every change of the table", function()
    local p, _, bt, lens, dbt, dcs = setup("mirror page check")
    attend(p, dbt, dcs) -- checked once; later calls reuse the check
    -- a partial write puts a page past the pool where sequence 1 starts
    assert(dbt:write({ NP }, W))
    refused(p, dbt, dcs, "%[1, 0%] is " .. NP .. ", outside the pool of " .. NP)
    assert(dbt:write({ bt[W + 1] }, W))
    kept(p, dbt, dcs, bt, lens, "page written back")
    -- a -1 past sequence 0's pages passes until its length reaches it
    lens[1] = 2 * PS
    assert(dcs:write({ lens[1] }, 0))
    assert(dbt:write({ -1 }, 3))
    local bt_hole = { unpack(bt) }
    bt_hole[4] = -1
    kept(p, dbt, dcs, bt_hole, lens, "a -1 past the used pages")
    lens[1] = 3 * PS + 1
    assert(dcs:write({ lens[1] }, 0))
    refused(p, dbt, dcs, "%[0, 3%] is %-1")
    assert(dbt:write({ bt[4] }, 3))
    kept(p, dbt, dcs, bt, lens, "the hole filled")
    -- a fill
    dbt:fill(-5)
    refused(p, dbt, dcs, "%[0, 0%] is %-5")
    assert(dbt:write(bt))
    kept(p, dbt, dcs, bt, lens, "written back whole")
    -- the same table, just checked against the whole pool, against a pool of one page
    local small = { dev = dev, q = p.q, kc = assert(pa.randn({ 1, PS, HK, D }, "f32", dev, 7)),
      vc = assert(pa.randn({ 1, PS, HK, D }, "f32", dev, 8)) }
    refused(small, dbt, dcs, "%[%d, %d%] is %d+, outside the pool of 1 pages")
    kept(p, dbt, dcs, bt, lens, "the whole pool again")
  end)

  it("a tensor whose address was handed out is never mirrored again", function()
    if not downloads_counted() then return end
    local p, rng, bt, lens, dbt, dcs = setup("mirror exposed")
    local bt2 = tables(rng)
    assert.equal(0, (count(function() return attend(p, dbt, dcs) end)))
    local ptr = dbt:data_ptr()
    if staged then
      -- staged memory is host memory: write behind the library's back, as a
      -- user's kernel would through the device address
      local raw = ffi.cast("int32_t *", ptr)
      for i = 1, B * W do raw[i - 1] = bt2[i] end
      local n, got = count(function() return attend(p, dbt, dcs) end)
      assert.equal(1, n)
      near(got, truth(p, bt2, lens), same, "after a write through the address")
    end
    -- even a full write from the host does not make it trusted again
    assert(dbt:write(bt))
    local n, got = count(function() return attend(p, dbt, dcs) end)
    assert.equal(1, n)
    near(got, truth(p, bt, lens), same, "after writing it back")
  end)

  it("batch staging over many steps: the views' mirrors match the device, and are used", function()
    if not downloads_counted() then return end
    local seed = H.seed("mirror batch " .. name)
    local rng = ref.rng(seed)
    local Hk, group, Dh, ps = 2, 2, 16, 3
    local c = assert(pa.kv_cache{ num_pages = 1000, page_size = ps, kv_heads = Hk, head_dim = Dh,
      dtype = "f32", device = dev, layers = 1 })
    local bt = c:batch({ capacity = 1 }) -- grows
    local seqs = { c:sequence() }
    local kc, vc = c.k_caches[1], c.v_caches[1]
    for step = 1, 24 do
      if #seqs < 40 and rng:uniform() < 0.6 then
        local parent = seqs[rng:int(1, #seqs)]
        seqs[#seqs + 1] = rng:uniform() < 0.5 and assert(parent:fork()) or c:sequence()
      end
      bt:clear()
      local total = 0
      for _, s in ipairs(seqs) do
        local n = s:len() < 60 and (step == 1 and 5 or rng:int(0, 3)) or 0
        bt:add(s, n)
        total = total + n
      end
      if total == 0 then
        -- a step with no query rows runs nothing: the download checks below need one
        seqs[#seqs + 1] = c:sequence()
        bt:add(seqs[#seqs], 1)
      end
      -- one step with 300 more (empty) entries: the staging buffer grows
      local extra = {}
      if step == 12 then
        for i = 1, 300 do extra[i] = c:sequence(); bt:add(extra[i], 0) end
      end
      assert(bt:stage())
      local T = bt.total_q
      local q = assert(pa.randn({ T, Hk * group, Dh }, "f32", dev, seed + step))
      local k = assert(pa.randn({ T, Hk, Dh }, "f32", dev, seed + 100 + step))
      local v = assert(pa.randn({ T, Hk, Dh }, "f32", dev, seed + 200 + step))
      local n, out = count(function() return assert(bt:attention(q, k, v)) end)
      assert.equal(0, n, "step " .. step .. ": the staged views were downloaded")
      -- the same call with fresh tensors of what the device holds (appending
      -- the same k/v again at the same places changes nothing)
      local fresh = {}
      for _, f in ipairs({ "block_table", "cu_seqlens_q", "seqused_k" }) do
        local view = bt[f]
        fresh[f] = assert(pa.from_table(view:to_table(), view.shape, "i32", dev))
      end
      local want = assert(pa.attention_varlen(q, kc, vc, { k = k, v = v, causal = true,
        block_table = fresh.block_table, cu_seqlens_q = fresh.cu_seqlens_q, seqused_k = fresh.seqused_k,
        max_seqlen_q = bt.max_seqlen_q }))
      near(out:to_table(), want:to_table(), same, string.format("step %d (seed %d)", step, seed))
      if step % 8 == 0 then
        -- a view overwritten on the device: downloaded (and right) until the next stage
        bt.seqused_k:copy_from(unmirrored(bt.seqused_k:to_table(), bt.seqused_k.shape, dev))
        local n2, again = count(function() return assert(bt:attention(q, nil, nil)) end)
        assert.equal(1, n2)
        near(again:to_table(), want:to_table(), same, "after overwriting seqused_k")
      end
      for _, s in ipairs(extra) do s:free() end
    end
    c:validate()
    bt:close()
    c:close()
  end)
end

describe("host mirrors on cpu:staged", function()
  local staged = assert(pa.device("cpu:staged"))

  it("is a device of its own that the core reaches by copies", function()
    assert.equal("cpu:staged", staged.name)
    assert.equal("cpu", staged.kind)
    assert.are_not.equal(cpu, staged)
    assert.equal(staged, pa.device("cpu:staged"))
    local t = assert(pa.from_table({ 1, 2, 3, 4 }, { 4 }, "f32", staged))
    assert.same({ 1, 2, 3, 4 }, t:to_table())
  end)

  it("the CPU device needs no mirror: attention reads its tables in place", function()
    local seed = H.seed("mirror cpu")
    local rng = ref.rng(seed)
    local p = problem(cpu, seed)
    local bt, lens = tables(rng)
    local dbt = assert(pa.tensor({ B, W }, "i32", cpu))
    dbt:copy_from(unmirrored(bt, { B, W }, cpu))
    local n, got = count(function() return attend(p, dbt, assert(pa.from_table(lens, { B }, "i32", cpu))) end)
    assert.equal(0, n)
    near(got, truth(p, bt, lens), 0, "cpu")
  end)

  mirror_cases(staged, "cpu:staged")
end)

describe("#gpu host mirrors on the GPU", function()
  local dev, why = G.device()
  if G.pending_without(pending, dev, why) then return end

  mirror_cases(dev, dev.name)

  it("decode calls with mirrored tables queue without waiting for the device", function()
    if dev.kind ~= "cuda" then
      pending("the dry run on the CPU: its calls do not queue on a device")
      return
    end
    -- batch 64 x 4096 keys, bf16, 32/8 heads, D 128, pages of 16 in random order
    local Bq, L, Hq, Hk, Dh, page = 64, 4096, 32, 8, 128, 16
    local per = L / page
    local np = Bq * per
    local kc = assert(pa.randn({ np, page, Hk, Dh }, "bf16", dev, 1))
    local vc = assert(pa.randn({ np, page, Hk, Dh }, "bf16", dev, 2))
    local q = assert(pa.randn({ Bq, 1, Hq, Dh }, "bf16", dev, 3))
    local out = assert(pa.tensor({ Bq, 1, Hq, Dh }, "bf16", dev))
    local ids = {}
    for i = 1, np do ids[i] = i - 1 end
    ref.rng(H.seed("mirror timing")):shuffle(ids)
    local btab = assert(pa.from_table(ids, { Bq, per }, "i32", dev))
    local lens = {}
    for b = 1, Bq do lens[b] = L end
    local cs = assert(pa.from_table(lens, { Bq }, "i32", dev))
    local opts = { block_table = btab, cache_seqlens = cs, out = out }
    local function call() assert(pa.attention_with_kvcache(q, kc, vc, opts)) end
    for _ = 1, 3 do call() end -- compile, load, grow scratch
    collectgarbage() -- (a tensor collected mid-measure would wait for the device)
    collectgarbage()
    dev:synchronize()
    -- one call at a time
    local t0 = pa.clock()
    for _ = 1, 5 do call(); dev:synchronize() end
    local single = (pa.clock() - t0) / 5
    -- three calls queued back to back, then the wait for them
    local before = downloads()
    t0 = pa.clock()
    for _ = 1, 3 do call() end
    local queued = pa.clock() - t0
    dev:synchronize()
    local total = pa.clock() - t0
    -- a loop of 20 calls: per call, against one call with its wait
    t0 = pa.clock()
    for _ = 1, 20 do call() end
    dev:synchronize()
    local loop = (pa.clock() - t0) / 20
    io.stderr:write(string.format(
      "  decode 64x4096 bf16: one call + wait %.1f us; 3 calls queued in %.1f us, done after %.1f us; loop of 20: %.1f us per call\n",
      single * 1e6, queued * 1e6, total * 1e6, loop * 1e6))
    assert.equal(0, downloads() - before)
    assert.is_true(queued < 0.5 * total,
      string.format("queueing 3 calls took %.1f us of the %.1f us they ran: the host waited for the device", queued * 1e6, total * 1e6))
  end)
end)
