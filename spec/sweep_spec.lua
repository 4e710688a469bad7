-- spec/sweep_spec.lua -- the sweep runner (pagedattn.sweep, scripts/sweep.lua):
-- points and sharding, job emission, resume after an interruption, failed
-- points, CSV merging by concatenation, and the ready-made decode/prefill
-- measures on the CPU. Nothing here depends on timing values.
local sweep = require "pagedattn.sweep"

local H = require "helpers"
local root, sh, tmpdir, read, write = H.root, H.sh, H.tmpdir, H.read_file, H.write_file
local runner = "luajit " .. root .. "/scripts/sweep.lua"
local Q = sweep.shell_quote

local function lines(text)
  local out = {}
  for l in (text or ""):gmatch("[^\n]+") do out[#out + 1] = l end
  return out
end

-- a sweep whose measure records the points it ran and takes no time
local function counting_sweep(ran, extra)
  local def = {
    name = "synthetic",
    axes = { context = { 128, 256, 512 }, page = { "none", 1, 16 }, batch = 2 },
    measure = function(p, env)
      ran[#ran + 1] = sweep.describe_point(env.sweep, p, true)
      return { run = function() end, bytes = 1e6 * p.context, flops = 1e3 }
    end,
    warmup = 0, repeats = 1, budget = 0,
  }
  for k, v in pairs(extra or {}) do def[k] = v end
  return def
end

local quick = { ceilings = false, progress = "none", device = "cpu" }
local function with(t, more)
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  for k, v in pairs(more or {}) do r[k] = v end
  return r
end

describe("sweep points", function()
  it("enumerates the product, first axis outermost, with stable keys", function()
    local S = sweep.define(counting_sweep({}))
    assert.are.equal(9, #S.points)
    assert.are.same({ "batch", "context", "page" }, S.axes)
    assert.are.equal("sweep,batch,context,page,status", table.concat(S.header, ",", 1, 5))
    assert.are.same({ batch = 2, context = 128, page = "none" }, S.points[1].values)
    assert.are.same({ batch = 2, context = 128, page = 1 }, S.points[2].values)
    assert.are.same({ batch = 2, context = 512, page = 16 }, S.points[9].values)
    local seen = {}
    for i, pt in ipairs(S.points) do
      assert.are.equal(i, pt.index)
      assert.is_nil(seen[pt.key])
      seen[pt.key] = true
    end
  end)

  it("takes a list of points, presets, --set overrides and --only filters", function()
    local pts = sweep.concat(sweep.product { kind = "decode", context = { 1, 2 } },
                             sweep.product { kind = "prefill", seqlen = { 3, 4, 5 } })
    local def = { name = "mixed", points = pts, measure = function() end,
                  presets = { tiny = { points = sweep.product { kind = "decode", context = 7 } } } }
    local S = sweep.define(def)
    assert.are.same({ "kind", "context", "seqlen" }, S.axes)
    assert.are.equal(5, #S.points)
    assert.are.equal(1, #sweep.define(def, { preset = "tiny" }).points)
    assert.has_error(function() sweep.define(def, { preset = "nope" }) end,
      "pagedattn.sweep: no preset 'nope' (presets: tiny)")
    local O = sweep.define(def, { set = { context = { 8, 9 } }, only = { kind = { "decode" } } })
    assert.are.equal(2, #O.points)
    assert.are.same({ kind = "decode", context = 9 }, O.points[2].values)
  end)

  it("rejects axes named like result columns", function()
    assert.has_error(function()
      sweep.define { name = "x", axes = { status = { 1 } }, measure = function() end }
    end, "pagedattn.sweep: axis 'status' is the name of a result column")
  end)
end)

describe("sharding", function()
  it("splits the points into n disjoint slices that cover them all, for several n", function()
    local def = counting_sweep({}, { axes = { a = { 1, 2, 3, 4, 5, 6, 7 }, b = { "x", "y", "z" } } })
    local S = sweep.define(def)
    assert.are.equal(21, #S.points)
    for _, n in ipairs({ 1, 2, 3, 4, 5, 8, 21, 30 }) do
      local owner = {}
      local sizes = {}
      for i = 1, n do
        local slice = sweep.select(S, { shard = { i, n } })
        sizes[i] = #slice
        for _, pt in ipairs(slice) do
          assert.is_nil(owner[pt.key], "point " .. pt.index .. " in two shards of " .. n)
          owner[pt.key] = i
        end
      end
      for _, pt in ipairs(S.points) do
        assert.is_not_nil(owner[pt.key], "point " .. pt.index .. " in no shard of " .. n)
      end
      -- round robin: sizes differ by at most one
      local lo, hi = math.huge, 0
      for i = 1, n do lo, hi = math.min(lo, sizes[i]), math.max(hi, sizes[i]) end
      assert.is_true(hi - lo <= 1)
    end
  end)

  it("parses I/N and refuses what is out of range", function()
    assert.are.same({ 3, 8 }, sweep.parse_shard("3/8"))
    for _, bad in ipairs({ "0/8", "9/8", "1/0", "x", "1-8" }) do
      assert.is_nil(sweep.parse_shard(bad))
    end
  end)

  it("runs shards into separate CSVs that concatenate into the whole sweep", function()
    local dir = tmpdir()
    local ran = {}
    local def = counting_sweep(ran)
    for i = 1, 3 do
      sweep.run(def, with(quick, { csv = dir .. "/shard" .. i .. ".csv", shard = { i, 3 } }))
    end
    assert.are.equal(9, #ran)
    -- merge by concatenation: the repeated headers are skipped by every reader
    assert.are.equal(0, (sh(string.format("cat %s/shard1.csv %s/shard2.csv %s/shard3.csv > %s/all.csv",
      dir, dir, dir, dir))))
    local rows, bad = sweep.read_csv(dir .. "/all.csv")
    assert.are.equal(9, #rows)
    assert.are.equal(0, bad)
    local again = {}
    local s = sweep.run(counting_sweep(again), with(quick, { csv = dir .. "/all.csv" }))
    assert.are.equal(0, #again)
    assert.are.equal(9, s.skipped)
    -- --merge writes one header and one row per point
    local n = sweep.merge(dir .. "/merged.csv", { dir .. "/all.csv", dir .. "/shard2.csv" })
    assert.are.equal(9, n)
    local text = read(dir .. "/merged.csv")
    local headers = 0
    for _, l in ipairs(lines(text)) do if l:match("^sweep,") then headers = headers + 1 end end
    assert.are.equal(1, headers)
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("resume", function()
  it("after an interruption runs only the missing points", function()
    local dir = tmpdir()
    local csv = dir .. "/r.csv"
    local first = {}
    local def = counting_sweep(first)
    local inner = def.measure
    def.measure = function(p, env)
      if #first == 4 then error("interrupted!") end -- what Ctrl-C raises in LuaJIT
      return inner(p, env)
    end
    local ok, err = pcall(sweep.run, def, with(quick, { csv = csv }))
    assert.is_false(ok)
    assert.matches("interrupted!", tostring(err))
    local rows = sweep.read_csv(csv)
    assert.are.equal(4, #rows) -- the interrupted point is not recorded
    for _, r in ipairs(rows) do assert.are.equal("ok", r.status) end

    local second = {}
    local s = sweep.run(counting_sweep(second), with(quick, { csv = csv }))
    assert.are.equal(4, s.skipped)
    assert.are.equal(5, #second)
    -- together: every point exactly once
    local all = {}
    for _, d in ipairs(first) do all[d] = (all[d] or 0) + 1 end
    for _, d in ipairs(second) do all[d] = (all[d] or 0) + 1 end
    local S = sweep.define(counting_sweep({}))
    for _, pt in ipairs(S.points) do
      assert.are.equal(1, all[sweep.describe_point(S, pt.values, true)])
    end
    assert.are.equal(9, #sweep.read_csv(csv))
    sh("rm -rf " .. Q(dir))
  end)

  it("after the process died mid-sweep (scripts/sweep.lua), and past a row cut short", function()
    local dir = tmpdir()
    local file, csv, log = dir .. "/s.lua", dir .. "/out.csv", dir .. "/ran.log"
    write(file, [[
local sweep = require "pagedattn.sweep"
local die_at = tonumber(os.getenv("DIE_AT") or "")
local n = 0
return sweep.script {
  name = "dies",
  axes = { x = { 1, 2, 3, 4, 5, 6 } },
  measure = function(p)
    n = n + 1
    if n == die_at then os.exit(9) end
    local f = io.open(os.getenv("RAN_LOG"), "a") f:write(p.x, "\n") f:close()
    return { run = function() end, flops = 1 }
  end,
  warmup = 0, repeats = 1, budget = 0,
}
]])
    local function cmd(env)
      return string.format("cd %s && %s RAN_LOG=%s %s %s --csv %s --no-ceilings --progress lines",
        Q(dir), env, Q(log), runner, Q(file), Q(csv))
    end
    local rc = sh(cmd("DIE_AT=4"))
    assert.are.equal(9, rc)
    assert.are.same({ "1", "2", "3" }, lines(read(log)))
    -- a kill in the middle of a write leaves a partial line: it is dropped, its point reruns
    local f = assert(io.open(csv, "ab"))
    f:write("dies,3,ok,0.1")
    f:close()
    local rows, bad = sweep.read_csv(csv)
    assert.are.equal(3, #rows)
    assert.are.equal(1, bad)
    os.remove(log)
    local rc2, out = sh(cmd(""))
    assert.are.equal(0, rc2, out)
    assert.are.same({ "4", "5", "6" }, lines(read(log)))
    assert.matches("3 of 6 points already in", out)
    rows = sweep.read_csv(csv)
    assert.are.equal(6, #rows)
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("failed points", function()
  it("are recorded with their error, and the sweep goes on", function()
    local dir = tmpdir()
    local csv = dir .. "/f.csv"
    local ran = {}
    local def = counting_sweep(ran)
    local inner = def.measure
    def.measure = function(p, env)
      if p.page == 1 and p.context == 256 then error('page 1, "256": no luck\nsecond line', 0) end
      if p.page == 16 and p.context == 512 then return nil, "out of memory" end
      return inner(p, env)
    end
    local s = sweep.run(def, with(quick, { csv = csv }))
    assert.are.equal(9, s.ran)
    assert.are.equal(2, s.failed)
    assert.are.equal(7, s.ok)
    local rows = sweep.read_csv(csv)
    assert.are.equal(9, #rows)
    local errors = {}
    for _, r in ipairs(rows) do
      if r.status == "error" then errors[#errors + 1] = r.error end
    end
    assert.are.same({ 'page 1, "256": no luck | second line', "out of memory" }, errors)
    -- not retried by default, retried with retry_failed
    local again = {}
    assert.are.equal(0, sweep.run(counting_sweep(again), with(quick, { csv = csv })).ran)
    local s3 = sweep.run(counting_sweep(again), with(quick, { csv = csv, retry_failed = true }))
    assert.are.equal(2, s3.ran)
    assert.are.equal(2, #again)
    sh("rm -rf " .. Q(dir))
  end)

  it("reports a metric that is not a declared column", function()
    local dir = tmpdir()
    local def = counting_sweep({}, {
      axes = { x = { 1, 2 } }, columns = { "pages_read" },
      measure = function(p)
        return { run = function() end, bytes = 1, metrics = p.x == 1 and { pages_read = 5 } or { typo = 1 } }
      end,
    })
    local s = sweep.run(def, with(quick, { csv = dir .. "/m.csv" }))
    assert.are.equal(1, s.ok)
    local rows = sweep.read_csv(dir .. "/m.csv")
    assert.are.equal("5", rows[1].pages_read)
    assert.matches("metric 'typo'", rows[2].error)
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("rows", function()
  it("carry the device, the library version, timing statistics and the ratio to the ceiling", function()
    local dir = tmpdir()
    local def = counting_sweep({}, { axes = { x = { 1 } }, repeats = 5,
      measure = function() return { run = function() end, bytes = 2e9, flops = 1e9, bound = "memory" } end })
    sweep.run(def, with(quick, { csv = dir .. "/c.csv", ceilings = { read_gbps = 100, peak_gflops = 10,
      peak_kind = "fma_f32" } }))
    local r = sweep.read_csv(dir .. "/c.csv")[1]
    local pa = require "pagedattn"
    assert.are.equal("cpu", r.device)
    assert.are.equal(pa.device("cpu").description, r.device_desc)
    assert.are.equal(pa.version, r.version)
    assert.are.equal("5", r.repeats)
    assert.is_true(tonumber(r.min_s) <= tonumber(r.median_s) and tonumber(r.median_s) <= tonumber(r.max_s))
    assert.are.equal("memory", r.bound)
    assert.are.equal("100", r.ceil_read_gbps)
    assert.near(tonumber(r.gbps) / 100, tonumber(r.ratio), 1e-4 * tonumber(r.ratio))
    sh("rm -rf " .. Q(dir))
  end)

  it("round-trip through CSV quoting", function()
    local fields = { "a", "b,c", 'say "hi"', " pad", "" }
    assert.are.same(fields, sweep.parse_csv_line(sweep.csv_line(fields)))
    assert.is_nil(sweep.parse_csv_line('a,"open'))
  end)

  it("the statistics: median, extremes, relative interquartile spread", function()
    local st = sweep.stats({ 4, 1, 3, 2, 5 })
    assert.are.equal(3, st.median)
    assert.are.equal(1, st.min)
    assert.are.equal(5, st.max)
    assert.near(2 / 3, st.spread, 1e-12)
  end)
end)

describe("progress", function()
  it("prints one line per point with an ETA when not on a terminal, a bar on one", function()
    local dir = tmpdir()
    for _, mode in ipairs({ "lines", "bar" }) do
      local buf = {}
      local out = { write = function(_, ...) for _, s in ipairs({ ... }) do buf[#buf + 1] = s end end,
                    flush = function() end }
      sweep.run(counting_sweep({}), with(quick, { csv = dir .. "/" .. mode .. ".csv", progress = mode, out = out }))
      local text = table.concat(buf)
      assert.matches("%[9/9%]", text)
      assert.matches("ETA", text)
      if mode == "bar" then assert.matches("\r\27%[K%[#+%.*%] %d/9", text) end
    end
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("job emission", function()
  local dir, file, csv

  before_each(function()
    dir = tmpdir()
    file, csv = dir .. "/jobs.lua", dir .. "/jobs.csv"
    write(file, [[
local sweep = require "pagedattn.sweep"
return {
  name = "jobs",
  axes = { a = { 1, 2, 3 }, b = { "x", "y" } },
  measure = function(p) return { run = function() end, flops = p.a } end,
  warmup = 0, repeats = 1, budget = 0,
}
]])
  end)
  after_each(function() sh("rm -rf " .. Q(dir)) end)

  local function emit(args)
    local rc, out = sh(string.format("cd %s && %s %s --csv %s --no-ceilings --device cpu --emit-jobs %s 2>/dev/null",
      Q(dir), runner, Q(file), Q(csv), args or ""))
    assert.are.equal(0, rc, out)
    return lines(out)
  end

  it("prints one runnable command per point; the jobs' CSVs merge into the sweep", function()
    local jobs = emit()
    assert.are.equal(6, #jobs)
    for i, j in ipairs(jobs) do
      assert.matches("--point " .. i .. " ", j, 1, true)
      assert.matches("--no-ceilings", j, 1, true)
      assert.matches("--device cpu", j, 1, true)
    end
    -- run them the way GNU parallel would: each line is a shell command
    for _, j in ipairs(jobs) do
      local rc, out = sh("cd / && " .. j .. " --progress none")
      assert.are.equal(0, rc, out)
    end
    local parts = sweep.list_csv(dir .. "/jobs.parts")
    assert.are.equal(6, #parts)
    for _, p in ipairs(parts) do assert.are.equal(1, #sweep.read_csv(p)) end
    -- nothing left to emit: the parts count as done
    assert.are.equal(0, #emit())
    assert.are.equal(0, (sh(string.format("cat %s/jobs.parts/*.csv > %s", Q(dir), Q(csv)))))
    local rows = sweep.read_csv(csv)
    assert.are.equal(6, #rows)
    local rc, out = sh(string.format("cd %s && %s %s --csv %s --no-ceilings --progress lines", Q(dir), runner,
      Q(file), Q(csv)))
    assert.are.equal(0, rc, out)
    assert.matches("6 of 6 points already in", out)
  end)

  it("prints one command per shard with --shards N, and leaves out points already done", function()
    local jobs = emit("--shards 4")
    assert.are.equal(4, #jobs)
    for i, j in ipairs(jobs) do assert.matches("--shard " .. i .. "/4 ", j, 1, true) end
    -- 6 points over 4 shards: shards 1 and 2 hold two, 3 and 4 one; run shard 3 and 4
    for i = 3, 4 do assert.are.equal(0, (sh("cd / && " .. jobs[i] .. " --progress none"))) end
    local left = emit("--shards 4")
    assert.are.equal(2, #left)
    assert.matches("--shard 1/4", left[1], 1, true)
    assert.matches("--shard 2/4", left[2], 1, true)
    local per_point = emit()
    assert.are.equal(4, #per_point) -- points 3 and 4 (shards 3, 4) are done
  end)

  it("through scripts/run: stdout holds only the jobs (the build's messages go to stderr)", function()
    local rc, out = sh(string.format("cd %s && %s/scripts/run %s/scripts/sweep.lua %s --csv %s --no-ceilings " ..
      "--device cpu --emit-jobs 2>/dev/null", Q(dir), root, root, Q(file), Q(csv)))
    assert.are.equal(0, rc, out)
    local got = lines(out)
    assert.are.equal(6, #got, out)
    for _, l in ipairs(got) do assert.matches("^luajit ", l) end
  end)

  it("lists the points with their state", function()
    local rc, out = sh(string.format("cd %s && %s %s --csv %s --list --shard 2/2", Q(dir), runner, Q(file), Q(csv)))
    assert.are.equal(0, rc, out)
    assert.are.same({ "2\ttodo\ta=1 b=y", "4\ttodo\ta=2 b=y", "6\ttodo\ta=3 b=y" }, lines(out))
  end)
end)

describe("ready-made measures", function()
  it("time decode and prefill over paged and unpaged caches on the CPU", function()
    local dir = tmpdir()
    local def = {
      name = "tiny",
      points = sweep.concat(
        sweep.product { kind = "decode", batch = 2, context = 40, page = { "none", 1, 16 } },
        sweep.product { kind = "prefill", batch = 1, seqlen = 24, context = { 0, 8 }, page = { 0, 3 } }),
      measure = sweep.attention,
      warmup = 1, repeats = 2, budget = 0,
    }
    local s = sweep.run(def, with(quick, { csv = dir .. "/t.csv", preset = nil,
      ceilings = { read_gbps = 10, peak_gflops = 100, peak_kind = "fma_f32" } }))
    assert.are.equal(7, s.ok, "failed points: see " .. dir .. "/t.csv")
    for _, r in ipairs(sweep.read_csv(dir .. "/t.csv")) do
      assert.are.equal("ok", r.status)
      assert.is_true(tonumber(r.gbps) > 0 and tonumber(r.gflops) > 0 and tonumber(r.ratio) > 0)
      assert.are.equal(r.kind == "decode" and "memory" or "compute", r.bound)
    end
    sh("rm -rf " .. Q(dir))
  end)

  it("count the work: K/V bytes for decode, unmasked pairs for causal prefill", function()
    local pa = require "pagedattn"
    local env = { pa = pa, device = pa.device("cpu") }
    local d = sweep.decode({ batch = 2, context = 10, heads = 4, kv_heads = 2, head_dim = 8, dtype = "f32", page = 4 }, env)
    assert.are.equal(2 * 2 * 10 * 2 * 8 * 4, d.bytes)
    local p = sweep.prefill({ seqlen = 4, context = 3, heads = 2, kv_heads = 1, head_dim = 8, page = 2 }, env)
    -- queries see 4, 5, 6, 7 keys
    assert.are.equal(4 * 2 * 8 * (4 + 5 + 6 + 7), p.flops)
  end)
end)

describe("tuning helpers (scripts/bench.lua, scripts/lab/decode_ab.lua)", function()
  it("decode_batch: one call over a mixed batch writes every output and counts its K/V bytes", function()
    local pa = require "pagedattn"
    local dev = pa.device("cpu")
    local o = { H = 4, Hk = 2, D = 8, dtype = "f32" }
    assert.is_nil(sweep.decode_batch(pa, dev, "none", with(o, { page = 4 })))
    for _, page in ipairs({ 0, 3, 16 }) do
      local call, out, bytes = sweep.decode_batch(pa, dev, "2x9+1x20", with(o, { page = page }))
      assert.are.equal(2 * (2 * 9 + 20) * 2 * 8 * 4, bytes)
      assert.are.same({ 3, 1, 4, 8 }, out.shape)
      out:fill(0 / 0)
      call()
      for i, x in ipairs(out:to_table()) do
        assert(x == x and x ~= 0, "page " .. page .. ": output " .. i .. " not written: " .. tostring(x))
      end
    end
  end)

  it("env_configs parses A=1,B=2|C=3 ('-': none) and refuses a setting without '='", function()
    local c = sweep.env_configs("A=1,B=x=2|-|C=")
    assert.are.same({ { name = "A=1,B=x=2", vars = { A = "1", B = "x=2" } }, { name = "-", vars = {} },
      { name = "C=", vars = { C = "" } } }, c)
    assert.are.same({}, sweep.env_configs(nil))
    assert.has_error(function() sweep.env_configs("A=1,oops") end)
  end)

  it("with_env sets and unsets variables for a call, and restores them after, also after an error", function()
    local a, b = "PAGEDATTN_SPEC_WITH_ENV_A", "PAGEDATTN_SPEC_WITH_ENV_B"
    sweep.with_env({ [a] = "outer" }, function()
      local seen = {}
      assert.has_error(function()
        sweep.with_env({ [a] = false, [b] = "inner" }, function()
          seen.a, seen.b = os.getenv(a), os.getenv(b)
          error("boom")
        end)
      end)
      assert.are.same({ b = "inner" }, seen)
      assert.are.equal("outer", os.getenv(a))
      assert.is_nil(os.getenv(b))
    end)
    assert.is_nil(os.getenv(a))
  end)
end)

describe("a misspelt axis", function()
  it("in --set or --only is an error that names it and lists the sweep's axes", function()
    local def = counting_sweep({})
    for _, key in ipairs({ "set", "only" }) do
      local ok, err = pcall(sweep.define, def, { [key] = { contxt = { 1024 } } })
      assert.is_false(ok, key .. " with a misspelt axis was accepted")
      assert.matches("no axis 'contxt'", tostring(err), 1, true)
      assert.matches("batch, context, page", tostring(err), 1, true)
    end
    -- a real axis still works
    assert.are.equal(3, #sweep.define(def, { set = { context = { 1, 2, 3 } }, only = { page = { 16 } } }).points)
  end)

  it("on the command line exits with the message and writes no CSV", function()
    local dir = tmpdir()
    local file, csv = dir .. "/s.lua", dir .. "/s.csv"
    write(file, [[
return { name = "s", axes = { context = { 1, 2 }, page = { 16 } },
         measure = function() return { run = function() end, flops = 1 } end,
         warmup = 0, repeats = 1, budget = 0 }
]])
    for _, flag in ipairs({ "--set", "--only" }) do
      local rc, out = sh(string.format("cd %s && %s %s --csv %s --no-ceilings --progress none %s pgae=1",
        Q(dir), runner, Q(file), Q(csv), flag))
      assert.are_not.equal(0, rc, out)
      assert.matches(flag .. " pgae=...: sweep 's' has no axis 'pgae' (its axes: context, page)", out, 1, true)
      assert.is_nil(read(csv), flag .. " wrote " .. csv)
    end
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("ceilings", function()
  -- a private cache directory, so that the spec neither reads nor writes the user's
  local function run_once(dir, name, more)
    local buf = {}
    local out = { write = function(_, ...) for _, s in ipairs({ ... }) do buf[#buf + 1] = s end end,
                  flush = function() end }
    local o = { csv = dir .. "/" .. name .. ".csv", device = "cpu", ceilings_seconds = 0.02,
                ceilings_dir = dir .. "/cache", progress = "lines", out = out }
    sweep.run(counting_sweep({}, { axes = { context = { 1 } } }), with(o, more))
    return table.concat(buf), sweep.read_csv(dir .. "/" .. name .. ".csv")[1]
  end

  it("are measured once per device and reused by the next runs; --refresh-ceilings measures again", function()
    local dir = tmpdir()
    local text1, row1 = run_once(dir, "a")
    assert.matches("measured the ceilings of cpu", text1, 1, true)
    local text2, row2 = run_once(dir, "b")
    assert.matches("(cached; --refresh-ceilings", text2, 1, true)
    assert.is_nil(text2:find("measured the ceilings", 1, true))
    assert.is_true(tonumber(row1.ceil_read_gbps) > 0)
    assert.are.equal(row1.ceil_read_gbps, row2.ceil_read_gbps)
    assert.are.equal(row1.ceil_peak_gflops, row2.ceil_peak_gflops)
    local text3 = run_once(dir, "c", { refresh_ceilings = true })
    assert.matches("measured the ceilings of cpu", text3, 1, true)
    sh("rm -rf " .. Q(dir))
  end)

  it("from the command line: cached across runs, --refresh-ceilings measures again", function()
    local dir = tmpdir()
    local file = dir .. "/s.lua"
    write(file, [[
return { name = "s", axes = { x = { 1 } }, measure = function() return { run = function() end, bytes = 1 } end,
         warmup = 0, repeats = 1, budget = 0 }
]])
    local function cmd(csv, more)
      return sh(string.format("cd %s && XDG_CACHE_HOME=%s %s %s --csv %s --device cpu --ceilings 0.02 " ..
        "--progress lines %s", Q(dir), Q(dir .. "/xdg"), runner, Q(file), Q(dir .. "/" .. csv), more or ""))
    end
    local rc1, out1 = cmd("a.csv")
    assert.are.equal(0, rc1, out1)
    assert.matches("measured the ceilings of cpu", out1, 1, true)
    local rc2, out2 = cmd("b.csv")
    assert.are.equal(0, rc2, out2)
    assert.matches("(cached;", out2, 1, true)
    local rc3, out3 = cmd("c.csv", "--refresh-ceilings")
    assert.are.equal(0, rc3, out3)
    assert.matches("measured the ceilings of cpu", out3, 1, true)
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("timing statistics in rows", function()
  it("hold the quartiles of the timed repeats, and spread is their distance over the median", function()
    local st = sweep.stats({ 4, 1, 3, 2, 5 })
    assert.are.equal(2, st.q1)
    assert.are.equal(4, st.q3)
    local dir = tmpdir()
    local n = 0
    local def = counting_sweep({}, { axes = { x = { 1 } }, repeats = 9, measure = function()
      -- the timed calls take 0, 1, ..., 8 ms: quartiles near 2 and 6 ms
      return { run = function()
        local pa = require "pagedattn"
        local t0 = pa.clock()
        while pa.clock() - t0 < (n % 10) * 1e-3 do end
        n = n + 1
      end, bytes = 1 }
    end })
    sweep.run(def, with(quick, { csv = dir .. "/q.csv", warmup = 1, max_repeats = 9 }))
    local r = sweep.read_csv(dir .. "/q.csv")[1]
    local q1, med, q3 = tonumber(r.q1_s), tonumber(r.median_s), tonumber(r.q3_s)
    assert.is_not_nil(q1, "no q1_s column")
    assert.is_not_nil(q3, "no q3_s column")
    assert.is_true(tonumber(r.min_s) <= q1 and q1 < med and med < q3 and q3 <= tonumber(r.max_s))
    assert.near((q3 - q1) / med, tonumber(r.spread), 1e-4)
    sh("rm -rf " .. Q(dir))
  end)
end)

describe("--help", function()
  -- every option literal in the runner's sources that the parser accepts
  local function accepted_flags()
    local files = { root .. "/lua/pagedattn/sweep.lua" }
    local p = io.popen("ls " .. Q(root .. "/lua/pagedattn/sweep") .. "/*.lua 2>/dev/null")
    for f in p:lines() do
      if not f:match("/plot[%w_]*%.lua$") then files[#files + 1] = f end
    end
    p:close()
    local flags, seen = {}, {}
    for _, f in ipairs(files) do
      for lit in (read(f) or ""):gmatch('"(%-%-?[%a][%w-]*)"') do
        if not seen[lit] then
          seen[lit] = true
          local ok, err = sweep.parse_args({ lit, "1" })
          if ok or not tostring(err):match("^unknown option") then flags[#flags + 1] = lit end
        end
      end
    end
    table.sort(flags)
    return flags
  end

  it("of scripts/sweep.lua names every option its parser accepts", function()
    local flags = accepted_flags()
    assert.is_true(#flags >= 20, "found only " .. #flags .. " options: " .. table.concat(flags, " "))
    local rc, help = sh(runner .. " --help")
    assert.are.equal(0, rc, help)
    local missing = {}
    for _, flag in ipairs(flags) do
      if not help:find(flag:gsub("%-", "%%-") .. "%f[^%w-]") then missing[#missing + 1] = flag end
    end
    assert.are.same({}, missing)
    assert.matches("--max-repeats N", help, 1, true)
  end)
end)
