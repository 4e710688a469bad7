-- Bad input: each mistake raises an error that names the offending argument,
-- points at the caller's line, and leaves the caches exactly as they were.
local pa = require "pagedattn"
local H = require "helpers"

local cpu = assert(pa.device("cpu"))
local SPEC_FILE = "attention_errors_spec.lua"

-- A valid paged decode-with-append setup: B=3, H=4, Hk=2, D=8, page 4, 12 pages.
local function setup()
  local s = {}
  s.q = pa.randn({ 3, 2, 4, 8 }, "bf16", cpu, 1)
  s.k_cache = pa.randn({ 12, 4, 2, 8 }, "bf16", cpu, 2)
  s.v_cache = pa.randn({ 12, 4, 2, 8 }, "bf16", cpu, 3)
  s.opts = {
    k = pa.randn({ 3, 2, 2, 8 }, "bf16", cpu, 4),
    v = pa.randn({ 3, 2, 2, 8 }, "bf16", cpu, 5),
    block_table = pa.from_table({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, { 3, 4 }, "i32", cpu),
    cache_seqlens = pa.from_table({ 5, 0, 9 }, { 3 }, "i32", cpu),
    causal = true,
  }
  s.before_k, s.before_v = s.k_cache:to_table(), s.v_cache:to_table()
  return s
end

local function call(s)
  local out, lse = pa.attention_with_kvcache(s.q, s.k_cache, s.v_cache, s.opts)
  return out, lse -- not a tail call: errors must point at this line
end

-- The call fails naming `arg`, at this spec's line, and changes no cache.
local function expect_error(s, arg, pattern)
  s.before_k, s.before_v = s.k_cache:to_table(), s.v_cache:to_table()
  local err = H.error_of(call, s)
  assert.truthy(err:find(SPEC_FILE, 1, true), "error does not point at the caller: " .. err)
  assert.truthy(err:find("attention_with_kvcache: " .. arg .. ":", 1, true),
    "error does not name " .. arg .. ": " .. err)
  if pattern then assert.truthy(err:find(pattern), "error '" .. err .. "' lacks " .. pattern) end
  assert.same(s.before_k, s.k_cache:to_table(), "k_cache changed by a failed call")
  assert.same(s.before_v, s.v_cache:to_table(), "v_cache changed by a failed call")
  return err
end

describe("attention_with_kvcache rejects bad input and changes nothing", function()
  it("the valid setup works and appends (so the checks below can fail)", function()
    local s = setup()
    assert.truthy(call(s))
    assert.are_not.same(s.before_k, s.k_cache:to_table())
  end)

  it("q with the wrong number of dimensions", function()
    local s = setup()
    s.q = pa.randn({ 3, 4, 8 }, "bf16", cpu, 1)
    expect_error(s, "q", "4 dimensions")
  end)

  it("a cache of the wrong dtype", function()
    local s = setup()
    s.v_cache = pa.randn({ 12, 4, 2, 8 }, "f16", cpu, 3)
    expect_error(s, "v_cache", "dtype f16")
  end)

  it("a wrong head dim in k", function()
    local s = setup()
    s.opts.k = pa.randn({ 3, 2, 2, 6 }, "bf16", cpu, 4)
    expect_error(s, "k", "expected shape")
  end)

  it("a block table entry outside the pool, in the last sequence", function()
    local s = setup()
    s.opts.block_table = pa.from_table({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 11 }, { 3, 4 }, "i32", cpu)
    expect_error(s, "block_table", "outside the pool")
  end)

  it("a negative block table entry", function()
    local s = setup()
    s.opts.block_table = pa.from_table({ 0, -1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, { 3, 4 }, "i32", cpu)
    expect_error(s, "block_table", "is %-1")
  end)

  it("the most negative block table entry, after valid ones", function()
    local s = setup()
    s.opts.block_table = pa.from_table({ 0, 1, 2, 3, 4, 5, 6, 7, 8, -2147483648, 10, 11 }, { 3, 4 }, "i32", cpu)
    expect_error(s, "block_table", "entry %[2, 1%] is %-2147483648")
  end)

  it("entries past a sequence's last page are not read (so not checked)", function()
    local s = setup()
    -- sequence 1 holds 0 + 2 tokens: one page; the other columns are garbage
    s.opts.block_table = pa.from_table({ 0, 1, 2, 3, 4, -7, 99, 1e6, 8, 9, 10, 11 }, { 3, 4 }, "i32", cpu)
    assert.truthy(call(s))
  end)

  it("cache_seqlens + new tokens beyond the table's capacity", function()
    local s = setup()
    s.opts.cache_seqlens = pa.from_table({ 5, 0, 15 }, { 3 }, "i32", cpu) -- 15 + 2 > 4 * 4
    expect_error(s, "cache_seqlens", "capacity")
  end)

  it("H not a multiple of Hk", function()
    local s = setup()
    s.q = pa.randn({ 3, 2, 3, 8 }, "bf16", cpu, 1)
    expect_error(s, "q", "not a multiple")
  end)

  it("k without v", function()
    local s = setup()
    s.opts.v = nil
    expect_error(s, "v", "missing")
  end)

  it("rotary tables without new k/v", function()
    local s = setup()
    s.opts.k, s.opts.v = nil, nil
    s.opts.rotary_cos = pa.randn({ 32, 4 }, "f32", cpu, 6)
    s.opts.rotary_sin = pa.randn({ 32, 4 }, "f32", cpu, 7)
    expect_error(s, "rotary_cos", "needs new k and v")
  end)

  it("rotary tables too short for the positions", function()
    local s = setup()
    s.opts.rotary_cos = pa.randn({ 8, 4 }, "f32", cpu, 6)
    s.opts.rotary_sin = pa.randn({ 8, 4 }, "f32", cpu, 7)
    expect_error(s, "rotary_cos", "needs position 10")
  end)

  it("a missing tensor", function()
    local s = setup()
    s.k_cache = nil
    local err = H.error_of(call, s)
    assert.truthy(err:find("k_cache: expected a tensor, got nil", 1, true), err)
  end)

  it("an unknown option (a typo)", function()
    local s = setup()
    s.opts.casual = true
    expect_error(s, "casual", "unknown option")
  end)

  it("a mistake found deep inside the package still points at the caller", function()
    local s = setup()
    s.opts.block_table = { { 0, 1 }, "row" }
    expect_error(s, "block_table", "row 2 is not a table")
  end)

  it("a bad element in a Lua table given for an index tensor", function()
    local s = setup()
    s.opts.cache_seqlens = { 5, 0, "x" }
    local err = H.error_of(call, s)
    assert.truthy(err:find("element 3", 1, true), err)
  end)

  -- A varlen call with total_q rows of q and new k/v, 2 sequences on 4 pages;
  -- it fails naming `arg`, and the cache is as before.
  local function expect_varlen_error(total_q, seqused_k, arg)
    local q = pa.randn({ total_q, 4, 8 }, "f32", cpu, 1)
    local kc, vc = pa.randn({ 4, 4, 2, 8 }, "f32", cpu, 2), pa.randn({ 4, 4, 2, 8 }, "f32", cpu, 3)
    local before = kc:to_table()
    local err = H.error_of(pa.attention_varlen, q, kc, vc, {
      cu_seqlens_q = { 0, 2, 4 }, seqused_k = seqused_k, block_table = { { 0, 1 }, { 2, 3 } },
      k = pa.randn({ total_q, 2, 8 }, "f32", cpu, 4), v = pa.randn({ total_q, 2, 8 }, "f32", cpu, 5),
    })
    assert.truthy(err:find("attention_varlen: " .. arg .. ":", 1, true), err)
    assert.same(before, kc:to_table())
  end

  it("varlen: cu_seqlens_q that does not cover q", function()
    expect_varlen_error(5, { 3, 4 }, "cu_seqlens_q")
  end)

  it("varlen: seqused_k smaller than the new tokens", function()
    expect_varlen_error(4, { 3, 1 }, "seqused_k")
  end)
end)
