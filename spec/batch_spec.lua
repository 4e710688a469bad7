-- Specs of batch staging (lua/pagedattn/batch.lua over src/core/batch.c): the
-- staged tables of a known batch, errors, all-or-nothing staging, unstage,
-- attention through a staged batch against the float64 reference over several
-- steps (prefill chunks, decodes, forks with copy-on-write, rotary, layers),
-- and a check that the staging loop compiles to traces without NYI or aborts.
-- Rerun a failure with the printed seed: PAGEDATTN_SEED=N scripts/test spec/batch_spec.lua
local pa = require "pagedattn"
local G = require "gpu_helpers"
local ref = require "pagedattn.reference"
local H = require "helpers"

local SPEC = "spec/batch_spec.lua"
local cpu = assert(pa.device("cpu"))

local function grow(seq, n) assert(seq:append(n)) return seq end

describe("batch staging", function()
  local function staged_tables(dev)
    local c = assert(pa.kv_cache{ num_pages = 20, page_size = 4, layers = 0 })
    local a = grow(c:sequence(), 5)   -- pages 0, 1
    local b = grow(c:sequence(), 0)
    local d = grow(c:sequence(), 8)   -- pages 2, 3
    local bt = c:batch({ capacity = 1, device = dev }) -- grows
    assert.equal(dev, bt.device)
    bt:add(a, 1):add(b, 6):add(d, 0)
    assert.equal(3, bt:count())
    assert.equal(bt, bt:stage())
    assert.same({ 3, 7, 6, 8, 2 }, { bt.size, bt.total_q, bt.max_seqlen_q, bt.max_seqlen_k, bt.max_pages })
    assert.same({ 6, 2, 0 }, { bt.num_indices, bt.new_pages, bt.cow_copies })
    assert.same({ 3, 2 }, bt.block_table.shape)
    assert.same({ 0, 1, 4, 5, 2, 3 }, bt.block_table:to_table())
    assert.same({ 5, 0, 8 }, bt.cache_seqlens:to_table())
    assert.same({ 6, 6, 8 }, bt.seqused_k:to_table())
    assert.same({ 0, 1, 7, 7 }, bt.cu_seqlens_q:to_table())
    assert.same({ 5, 0, 1, 2, 3, 4, 5 }, bt.positions:to_table())
    assert.same({ 0, 1, 1, 1, 1, 1, 1 }, bt.batch_indices:to_table())
    assert.same({ 0, 2, 4, 6 }, bt.kv_indptr:to_table())
    assert.same({ 0, 1, 4, 5, 2, 3 }, bt.kv_indices:to_table())
    assert.same({ 2, 2, 4 }, bt.kv_last_page_len:to_table())
    assert.same({ 6, 6, 8 }, { a:len(), b:len(), d:len() })
    -- an empty sequence in the CSR form, and an empty batch
    local e = c:sequence()
    bt:clear():add(e, 0)
    assert(bt:stage())
    assert.same({ 1, 1 }, bt.block_table.shape)
    assert.same({ 0 }, bt.block_table:to_table())
    assert.same({ 0, 0 }, bt.kv_indptr:to_table())
    assert.same({ 0 }, bt.kv_last_page_len:to_table())
    assert.same({}, bt.kv_indices:to_table())
    bt:clear()
    assert(bt:stage())
    assert.same({ 0, 1 }, bt.block_table.shape)
    assert.same({ 0 }, bt.cu_seqlens_q:to_table())
    -- a batch wider than the first buffer: it grows (and stays correct)
    local many = {}
    bt:clear()
    for i = 1, 300 do many[i] = c:sequence(); bt:add(many[i], 0) end
    bt:add(a, 0)
    assert(bt:stage())
    local indptr = bt.kv_indptr:to_table()
    assert.equal(301, #bt.cache_seqlens:to_table())
    assert.same({ 0, 2 }, { indptr[301], indptr[302] })
    assert.same({ 0, 1 }, bt.kv_indices:to_table())
    c:validate()
    c:close()
  end

  it("stages the tables of a mixed batch", function() staged_tables(cpu) end)

  it("skips the CSR form when asked (csr = false)", function()
    local c = assert(pa.kv_cache{ num_pages = 20, page_size = 4, layers = 0 })
    local a = grow(c:sequence(), 5)
    local bt = c:batch({ csr = false })
    bt:add(a, 3)
    assert(bt:stage())
    assert.same({ 0, 1 }, bt.block_table:to_table())
    assert.same({ 0, 3 }, bt.cu_seqlens_q:to_table())
    assert.same({ 5, 6, 7 }, bt.positions:to_table())
    assert.same({ 0, 0, 0 }, { bt.kv_indptr.numel, bt.kv_indices.numel, bt.kv_last_page_len.numel })
    assert.equal(0, bt.num_indices)
    assert.matches("csr: expected a boolean", H.error_of(c.batch, c, { csr = 1 }))
    c:close()
  end)

  it("names what is wrong", function()
    local c = assert(pa.kv_cache{ num_pages = 20, page_size = 4, layers = 0 })
    local a = c:sequence()
    local bt = c:batch()
    assert.matches("batch:add: n: expected a whole number >= 0, got %-1", H.error_of(bt.add, bt, a, -1))
    assert.matches("batch:add: n: expected a whole number >= 0, got 0.5", H.error_of(bt.add, bt, a, 0.5))
    bt:add(a, 1):add(a, 2)
    assert.matches("seqs: sequence " .. a.id .. " appears twice %(entries 0 and 1%)", H.error_of(bt.stage, bt))
    assert.equal(0, a:len())
    local dead = c:sequence()
    local dead_id = dead.id
    dead:free()
    bt:clear():add(a, 1)
    bt.seqs[2], bt.ids[1], bt.counts[1], bt.n = dead, dead_id, 1, 2 -- what add() would store
    assert.matches("seqs: entry 1 %(" .. dead_id .. "%) is not a live sequence", H.error_of(bt.stage, bt))
    assert.equal(0, a:len())
    assert.matches("batch:attention: batch: not staged", H.error_of(bt.attention, bt, pa.tensor({ 1, 1, 1 })))
    assert.matches("capacity: expected a whole number >= 1", H.error_of(c.batch, c, { capacity = 0 }))
    assert.matches("colour: unknown option", H.error_of(c.batch, c, { colour = 1 }))
    c:close()
    assert.matches("batch:stage: batch: closed", H.error_of(bt.stage, bt))
  end)

  it("stages all or nothing when the pool runs out, and unstages", function()
    local c = assert(pa.kv_cache{ num_pages = 6, page_size = 4, layers = 0 })
    local a = grow(c:sequence(), 6)
    local b = assert(a:fork())   -- shares pages 0, 1 (1 is partial)
    local d = grow(c:sequence(), 3)
    local bt = c:batch()
    -- a and b both write into shared page 1: only the first copies it
    bt:add(a, 1):add(b, 1)
    local before = c:stats()
    assert(bt:stage())
    assert.equal(1, bt.new_pages)
    assert.equal(1, bt.cow_copies)
    assert.equal(before.cow_copies + 1, c:stats().cow_copies)
    assert(bt:unstage())
    assert.same({ 6, 6 }, { a:len(), b:len() })
    assert.equal(before.free_pages - 1, c:free_pages()) -- the copy stays (same contents)
    assert.matches("nothing staged to undo", H.error_of(bt.unstage, bt))
    -- too much: nothing changes
    local st = c:stats()
    local pa_, pb, pd = a:pages(), b:pages(), d:pages()
    bt:clear():add(a, 4):add(d, 9):add(b, 2)
    local r, err = bt:stage()
    assert.is_nil(r)
    assert.matches("out of pages: the batch needs 3 more pages %(0 of them copies of shared pages%), the pool has 2 free of 6", err)
    assert.same(st, c:stats())
    assert.same({ pa_, pb, pd }, { a:pages(), b:pages(), d:pages() })
    assert.same({ 6, 6, 3 }, { a:len(), b:len(), d:len() })
    assert.is_false(bt.staged)
    -- a sequence that changed since its stage cannot be unstaged
    bt:clear():add(d, 1)
    assert(bt:stage())
    d:truncate(1)
    assert.matches("changed since it was staged", H.error_of(bt.unstage, bt))
    c:validate()
    c:close()
  end)

  ---------------------------------------------------------------------------
  -- attention through a staged batch, step by step, against the reference.
  -- The reference sees each sequence's history as a contiguous cache built
  -- from what earlier steps appended (shadows), so wrong pages, a missed
  -- copy-on-write or wrong positions all show up in the outputs.

  local function rotary_tables(n, rd, dtype)
    local half, cs, sn = rd / 2, {}, {}
    for p = 0, n - 1 do
      for j = 0, half - 1 do
        local th = p * 10000 ^ (-2 * j / rd)
        cs[p * half + j + 1] = ref.round(math.cos(th), dtype)
        sn[p * half + j + 1] = ref.round(math.sin(th), dtype)
      end
    end
    return ref.tensor({ n, half }, cs), ref.tensor({ n, half }, sn)
  end

  -- One step of the reference: entries {shadow = {k = rows, v = rows}, before, n}.
  -- two_calls: as b:append_kv then b:attention(q, nil, nil): k is rotated on
  -- append, q is not rotated.
  local function ref_step(entries, q, k, v, Hk, D, dtype, ropts, two_calls)
    local B, maxk = #entries, 1
    for _, e in ipairs(entries) do maxk = math.max(maxk, e.before + e.n) end
    local tok = Hk * D
    local function caches()
      local kd, vd = {}, {}
      for i = 1, B * maxk * tok do kd[i], vd[i] = 0, 0 end
      for b, e in ipairs(entries) do
        for t = 1, e.before do
          local base = ((b - 1) * maxk + t - 1) * tok
          local kr, vr = e.shadow.k[t], e.shadow.v[t]
          for x = 1, tok do kd[base + x], vd[base + x] = kr[x], vr[x] end
        end
      end
      return ref.tensor({ B, maxk, Hk, D }, kd), ref.tensor({ B, maxk, Hk, D }, vd)
    end
    local cu, used = { 0 }, {}
    for b, e in ipairs(entries) do cu[b + 1] = cu[b] + e.n; used[b] = e.before + e.n end
    local function run(precision)
      local kc, vc = caches()
      local o = { cu_seqlens_q = cu, seqused_k = used, k = k, v = v, causal = true,
        precision = precision, cache_dtype = dtype }
      for key, val in pairs(ropts) do o[key] = val end
      if two_calls then
        local dummy = ref.tensor({ q.shape[1], Hk, D })
        o.causal, o.window_size = false, { 0, 0 }
        ref.attention_varlen(dummy, kc, vc, o)
        o = { cu_seqlens_q = cu, seqused_k = used, causal = true, precision = precision, cache_dtype = dtype }
      end
      local out = ref.attention_varlen(q, kc, vc, o)
      return out, kc, vc
    end
    local exact, kc, vc = run("f64")
    local naive = run(dtype)
    -- the appended (rotated, rounded) rows extend the histories
    for b, e in ipairs(entries) do
      for t = e.before, e.before + e.n - 1 do
        local base = ((b - 1) * maxk + t) * tok
        local kr, vr = {}, {}
        for x = 1, tok do kr[x], vr[x] = kc.data[base + x], vc.data[base + x] end
        e.shadow.k[t + 1], e.shadow.v[t + 1] = kr, vr
      end
    end
    return exact, ref.max_abs_diff(naive.data, exact.data)
  end

  local function flat_shape(t) -- [B, S, H, D] data as [B*S, H, D]
    return ref.tensor({ t.shape[1] * t.shape[2], t.shape[3], t.shape[4] }, t.data)
  end

  local function run_steps(seed, form, dtype, layers, dev)
    local rng = ref.rng(seed)
    local Hk, group, D, ps = 2, 2, 16, 3
    local Hq = Hk * group
    local c = assert(pa.kv_cache{ num_pages = 80, page_size = ps, kv_heads = Hk, head_dim = D,
      dtype = dtype, device = dev, layers = layers })
    local rd = rng:uniform() < 0.5 and D or 8
    local rcos, rsin = rotary_tables(64, rd, dtype)
    local dcos = assert(pa.from_table(rcos.data, rcos.shape, dtype, dev))
    local dsin = assert(pa.from_table(rsin.data, rsin.shape, dtype, dev))
    local interleaved = rng:uniform() < 0.5
    local ropts = { rotary_cos = rcos, rotary_sin = rsin, rotary_interleaved = interleaved }
    local dopts = { rotary_cos = dcos, rotary_sin = dsin, rotary_interleaved = interleaved }
    local bt = c:batch()
    local seqs = {} -- { seq, shadows[layer] = {k = {}, v = {}} }
    local function new_entry(seq, from)
      local sh = {}
      for l = 1, layers do
        sh[l] = { k = {}, v = {} }
        if from then
          for t = 1, seq:len() do sh[l].k[t], sh[l].v[t] = from.shadows[l].k[t], from.shadows[l].v[t] end
        end
      end
      local e = { seq = seq, shadows = sh }
      seqs[#seqs + 1] = e
      return e
    end
    new_entry(c:sequence())
    for step = 1, 7 do
      -- fork now and then (prefix sharing; partial pages get copied on write)
      if step == 2 or (step > 2 and rng:uniform() < 0.3) then
        local parent = seqs[rng:int(1, #seqs)]
        new_entry(assert(parent.seq:fork()), parent)
      end
      bt:clear()
      local entries = {}
      local uniform = (form == "kvcache") and (step == 1 and 7 or 1) or nil
      for _, e in ipairs(seqs) do
        -- step 1 leaves a partial page (7 % 3) that the fork at step 2 shares
        -- and step 2 writes into: a copy on write every time
        local n = uniform or (step == 1 and 7 or (rng:uniform() < 0.5 and 1 or rng:int(step == 2 and 1 or 0, 5)))
        if form == "append_kv" and n == 0 then n = 1 end
        bt:add(e.seq, n)
        entries[#entries + 1] = { e = e, before = e.seq:len(), n = n }
      end
      assert(bt:stage())
      local T = bt.total_q
      for l = 1, layers do
        for _, en in ipairs(entries) do en.shadow = en.e.shadows[l] end
        local q = ref.randn({ T, Hq, D }, rng, dtype)
        local k = ref.randn({ T, Hk, D }, rng, dtype)
        local v = ref.randn({ T, Hk, D }, rng, dtype)
        local want, naive_err = ref_step(entries, q, k, v, Hk, D, dtype, ropts, form == "append_kv")
        local o = { layer = l }
        for key, val in pairs(dopts) do o[key] = val end
        local out
        if form == "kvcache" then
          local B, S = #entries, uniform
          local q4 = assert(pa.from_table(q.data, { B, S, Hq, D }, dtype, dev))
          local k4 = assert(pa.from_table(k.data, { B, S, Hk, D }, dtype, dev))
          local v4 = assert(pa.from_table(v.data, { B, S, Hk, D }, dtype, dev))
          out = assert(bt:attention(q4, k4, v4, o))
        else
          local qd = assert(pa.from_table(q.data, q.shape, dtype, dev))
          local kd = assert(pa.from_table(k.data, k.shape, dtype, dev))
          local vd = assert(pa.from_table(v.data, v.shape, dtype, dev))
          if form == "append_kv" then
            assert(bt:append_kv(kd, vd, o))
            o.rotary_cos, o.rotary_sin, o.rotary_interleaved = nil, nil, nil
            out = assert(bt:attention(qd, nil, nil, o))
          else
            out = assert(bt:attention(qd, kd, vd, o))
          end
        end
        local err = ref.max_abs_diff(out:to_table(), want.data)
        local tol = ref.tolerance(dtype, naive_err)
        if not (err <= tol) then
          error(string.format("%s %s on %s, %d layer(s), step %d, layer %d: max |err| %.3g > tolerance %.3g\n  seed %d\n  %s",
            form, dtype, dev.name, layers, step, l, err, tol, seed, H.rerun(SPEC)), 0)
        end
      end
      c:validate()
    end
    assert.is_true(c:stats().cow_copies > 0, "the steps should have copied a shared page")
    c:close()
  end

  local STEP_CASES = {
    { "varlen", "f32", 1 }, { "varlen", "bf16", 2 }, { "kvcache", "f32", 1 },
    { "kvcache", "f16", 2 }, { "append_kv", "f32", 2 },
  }
  describe("attention through a staged batch, against the reference", function()
    for _, case in ipairs(STEP_CASES) do
      local form, dtype, layers = case[1], case[2], case[3]
      it(string.format("%s, %s, %d layer(s)", form, dtype, layers), function()
        for i = 1, H.scale(2) do run_steps(H.seed("batch-" .. form .. dtype .. layers, i), form, dtype, layers, cpu) end
      end)
    end

    it("refuses what the batch sets, and mismatched shapes", function()
      local c = assert(pa.kv_cache{ num_pages = 8, page_size = 4, kv_heads = 1, head_dim = 4, device = cpu })
      local s1, s2 = grow(c:sequence(), 2), grow(c:sequence(), 3)
      local bt = c:batch()
      bt:add(s1, 1):add(s2, 2)
      assert(bt:stage())
      local q = pa.tensor({ 3, 1, 4 })
      local k = pa.tensor({ 3, 1, 4 })
      assert.matches("block_table: set by the batch", H.error_of(bt.attention, bt, q, k, k, { block_table = q }))
      assert.matches("layer: 2 is not in %[1, 1%]", H.error_of(bt.attention, bt, q, k, pa.tensor({ 3, 1, 4 }), { layer = 2 }))
      assert.matches("v: missing", H.error_of(bt.attention, bt, q, k, nil))
      assert.matches("needs every entry to have S_new new tokens",
        H.error_of(bt.attention, bt, pa.tensor({ 2, 1, 1, 4 }), pa.tensor({ 2, 1, 1, 4 }), pa.tensor({ 2, 1, 1, 4 })))
      bt:add(s1, 1)
      assert.matches("entries were added after stage", H.error_of(bt.attention, bt, q, k, k))
      c:close()
    end)
  end)

  -- the same on "cpu:staged", the CPU reached by copies: the tables are
  -- uploaded and attention plans from their host mirrors, as on a GPU
  describe("on cpu:staged", function()
    local staged = assert(pa.device("cpu:staged"))
    it("stages the tables of a mixed batch", function() staged_tables(staged) end)
    for _, case in ipairs(STEP_CASES) do
      local form, dtype, layers = case[1], case[2], case[3]
      it(string.format("attention %s, %s, %d layer(s), against the reference", form, dtype, layers), function()
        run_steps(H.seed("batch-staged-" .. form .. dtype .. layers), form, dtype, layers, staged)
      end)
    end
  end)

  -- the same on a CUDA device: staged tables uploaded, copies on write made by
  -- the device, attention by its kernels
  describe("on CUDA #gpu", function()
    local cuda, why = pa.device("cuda")
    if G.pending_without(pending, cuda, why) then return end
    it("stages the tables of a mixed batch", function() staged_tables(cuda) end)
    for _, case in ipairs(STEP_CASES) do
      local form, dtype, layers = case[1], case[2], case[3]
      it(string.format("attention %s, %s, %d layer(s), against the reference", form, dtype, layers), function()
        for i = 1, H.scale(2) do run_steps(H.seed("batch-" .. form .. dtype .. layers, i), form, dtype, layers, cuda) end
      end)
    end
  end)

  ---------------------------------------------------------------------------
  -- the staging loop must compile: no NYI, no trace abort in its code

  for _, cascade in ipairs { false, true } do
  it("compiles the staging loop to traces without NYI or aborts" .. (cascade and " (cascade: 256 forks of a prompt)" or ""), function()
    if not (jit and jit.status()) then
      pending("the JIT is off in this LuaJIT")
      return
    end
    local jutil = require "jit.util"
    -- jit.vmdef only names error codes; some installs lack it on the path
    local has_vmdef, vmdef = pcall(require, "jit.vmdef")
    if not has_vmdef then vmdef = { traceerr = {}, ffnames = {}, bcnames = "" } end
    local c = assert(pa.kv_cache{ num_pages = 16384, page_size = 16, layers = 0 }) -- room for 120 + 8 x 50 steps
    local seqs = {}
    local rng = ref.rng(H.seed("batch-jit", 1))
    -- (cascade: every step plans one group sharing the prompt's 64 pages)
    local prompt = cascade and grow(c:sequence(), 1024)
    for i = 1, 256 do seqs[i] = grow(cascade and assert(prompt:fork()) or c:sequence(), rng:int(1, cascade and 200 or 600)) end
    local bt = c:batch({ capacity = 256, cascade = cascade })

    -- the loop under test, as a serving loop would write it
    local function stage_steps(steps)
      for _ = 1, steps do
        bt:clear()
        for i = 1, #seqs do bt:add(seqs[i], 1) end
        local ok, err = bt:stage()
        if not ok then error(err) end
      end
    end

    local watched = { ["batch.lua"] = true, ["cache.lua"] = true, ["batch_spec.lua"] = true }
    local library = { ["batch.lua"] = true, ["cache.lua"] = true }
    local function where(func, pc)
      local info = jutil.funcinfo(func, pc)
      local src = info.source or "?"
      return src:match("([^/]+)$") or src, info.currentline or info.linedefined or 0
    end
    local problems, traced, starts = {}, 0, {}
    local function on_trace(what, tr, func, pc, otr, oex)
      if what == "start" then
        starts[tr] = { where(func, pc) }
      elseif what == "stop" then
        local s = starts[tr]
        if s and watched[s[1]] then
          traced = traced + 1
          -- LuaJIT 2.1 ends a trace at a builtin it cannot compile and
          -- "stitches" the next one after it: an NYI that does not abort
          if jutil.traceinfo(tr).linktype == "stitch" then
            local fi = jutil.funcinfo(func, pc)
            local name = fi.ffid and vmdef.ffnames[fi.ffid] or fi.loc or "?"
            problems[#problems + 1] = string.format("trace %d started at %s:%d stitches around %s (NYI)",
              tr, s[1], s[2], name)
          end
        end
      elseif what == "abort" then
        local file, line = where(func, pc)
        local s = starts[tr] or { "?", 0 }
        local msg = vmdef.traceerr[otr] or ("trace error " .. tostring(otr) .. " (" .. tostring(oex) .. ")")
        if type(oex) == "number" and msg:find("bytecode", 1, true) then
          oex = vmdef.bcnames:sub(oex * 6 + 1, oex * 6 + 6):gsub(" +$", "")
          msg = msg:gsub("%%d", "%%s")
        end
        if type(oex) == "number" or type(oex) == "string" then msg = string.format(msg, oex) end
        -- an abort inside the library's staging code is a problem; one in this
        -- harness's driver loop (e.g. "loop unroll limit reached" when a trace
        -- that began in Batch:add runs into the loop around it) is the JIT
        -- picking its trace boundaries, and depends on hot counters that other
        -- specs in the same process have warmed: LuaJIT retries elsewhere.
        -- "error thrown or hook called during recording" is a finalizer (an
        -- earlier spec's tensor collected by a GC step) or a hook running
        -- while the trace records, not the code: LuaJIT records it again (CI
        -- failed once on it at batch.lua:123; a loop that never compiles
        -- still fails "no trace" below)
        local recerr = otr == 0 or msg:find("hook called during recording", 1, true)
        if not recerr and (library[file] or (watched[s[1]] and msg:find("NYI", 1, true))) then
          problems[#problems + 1] = string.format("trace %d started at %s:%d aborted at %s:%d: %s",
            tr, s[1], s[2], file, line, msg)
        end
      end
    end
    collectgarbage("collect") -- run the finalizers of earlier specs' garbage now, not while recording
    jit.flush()
    jit.attach(on_trace, "trace")
    local ok, err = pcall(stage_steps, 120)
    jit.attach(on_trace)
    assert(ok, err)
    assert(#problems == 0, "the staging loop does not compile cleanly:\n  " .. table.concat(problems, "\n  "))
    assert(traced > 0, "no trace of the staging loop was recorded")
    -- and, compiled, a step allocates nothing that the GC has to collect,
    -- measured over 50 steps in which the JIT recorded no trace: a trace
    -- compiled meanwhile (a side trace whose exit just got hot) allocates its
    -- own GC objects once, not per step (CI saw 20 bytes per step once under
    -- ASan, not with the same seed again). Such a window is measured again,
    -- up to 8 times (the JIT settled within 4 in every run tried).
    local recorded = 0
    local function on_record(what) if what == "start" then recorded = recorded + 1 end end
    local grown, clean
    for _ = 1, 8 do
      collectgarbage("collect")
      collectgarbage("stop")
      recorded = 0
      jit.attach(on_record, "trace")
      local kb = collectgarbage("count")
      stage_steps(50)
      grown = (collectgarbage("count") - kb) * 1024
      jit.attach(on_record)
      collectgarbage("restart")
      clean = recorded == 0
      if clean then break end
    end
    assert(clean, "the JIT kept recording traces in every 50-step window of the staging loop")
    assert(grown < 50 * 16, string.format("staging allocated %.0f bytes per step", grown / 50))
    if cascade then assert.equal(1, bt:cascade_info().groups) end
    c:validate()
    c:close()
  end)
  end
end)
