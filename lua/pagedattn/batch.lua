-- pagedattn.batch: staging one step of a serving loop. A batch collects
-- (sequence, new tokens) pairs, appends them to their sequences in one C call
-- (all or nothing), and leaves on the device the index tensors that the
-- attention calls take; its methods then append the new k/v (with RoPE) and
-- attend.
--
--   local b = cache:batch()          -- buffers reused from step to step
--   b:clear()
--   for i = 1, n do b:add(seqs[i], new_tokens[i]) end
--   assert(b:stage())                -- nil, err when the pool is out of pages
--   local out = b:attention(q, k, v, { rotary_cos = cos, rotary_sin = sin })
--
-- After stage(): b.size (B), b.total_q, b.max_seqlen_q, b.max_seqlen_k,
-- b.max_pages, and the i32 tensors b.block_table [B, max_pages],
-- b.cache_seqlens [B] (keys before the step), b.seqused_k [B] (after it),
-- b.cu_seqlens_q [B+1], b.positions [total_q], b.batch_indices [total_q],
-- b.kv_indptr [B+1], b.kv_indices [kv_indptr[B]], b.kv_last_page_len [B].
-- They are views into the batch's buffer: valid until its next stage().
--
-- The hot path (clear, add, stage) allocates nothing once the buffers have
-- grown, and compiles to traces (spec/batch_spec.lua checks it).
local ffi = require "ffi"
local core = require "pagedattn.core"
local T = require "pagedattn.tensor"
local cache_mod = require "pagedattn.cache"
local attention = require "pagedattn.attention"

local C, ctx, check = core.C, core.ctx, core.check
local Tensor, is_tensor = T.Tensor, T.is_tensor
local Cache, live_handle = cache_mod.Cache, cache_mod.live_handle
local floor = math.floor

local M = {}

local Batch = {}
Batch.__index = Batch
M.Batch = Batch

local batch_box = ffi.new("pa_batch*[1]")
local i32_array = ffi.typeof("int32_t[?]")
local info_t = ffi.typeof("pa_batch_info")

-- field name -> pa_batch_field, and whether it is 2-D
local FIELDS = {
  { "block_table", 0, true }, { "cache_seqlens", 1 }, { "seqused_k", 2 }, { "cu_seqlens_q", 3 },
  { "positions", 4 }, { "batch_indices", 5 }, { "kv_indptr", 6 }, { "kv_indices", 7 },
  { "kv_last_page_len", 8 },
  -- the two-level plan of a cascade batch (pagedattn.h: shared prefixes read once)
  { "prefix_block_table", 9, true }, { "prefix_seqused_k", 10 }, { "prefix_cu_seqlens_q", 11 },
  { "prefix_rows", 12 }, { "prefix_row_of", 13 }, { "suffix_block_table", 14, true },
  { "suffix_cache_seqlens", 15 }, { "suffix_seqused_k", 16 },
}
local cascade_info_t = ffi.typeof("pa_batch_cascade_info")
-- pa_cascade_fallback -> what b:cascade_info().last says
local FALLBACK = { [0] = "used", "off", "no groups", "alibi", "window", "rows" }

-- cache:batch{ capacity = 256, device = dev, csr = true, cascade = false }:
-- staging buffers for steps of up to `capacity` sequences (they grow when
-- needed). device: where the staged tensors live (default: the caches'
-- device; the CPU for a pool without tensors). csr = false skips the CSR form
-- (kv_indptr, kv_indices, kv_last_page_len stay empty): half the bytes per
-- step. cascade = true stages a two-level plan for prefixes that entries
-- share (found from their pages, or the groups given to add()), and
-- b:attention reads each shared prefix once; cascade_min_saved = N keeps
-- only the automatic groups that save at least N page reads a call.
function Cache:batch(opts)
  local F = "batch"
  opts = opts or {}
  if type(opts) ~= "table" then error("pagedattn.batch: opts: expected a table, got " .. type(opts), 2) end
  for k in pairs(opts) do
    if k ~= "capacity" and k ~= "device" and k ~= "csr" and k ~= "cascade" and k ~= "cascade_min_saved" then
      error("pagedattn.batch: " .. tostring(k) .. ": unknown option", 2)
    end
  end
  if opts.csr ~= nil and type(opts.csr) ~= "boolean" then
    error("pagedattn.batch: csr: expected a boolean, got " .. type(opts.csr), 2)
  end
  if opts.cascade ~= nil and type(opts.cascade) ~= "boolean" then
    error("pagedattn.batch: cascade: expected a boolean, got " .. type(opts.cascade), 2)
  end
  local min_saved = opts.cascade_min_saved
  if min_saved ~= nil then
    if not opts.cascade then
      error("pagedattn.batch: cascade_min_saved: applies to cascade = true batches", 2)
    end
    if type(min_saved) ~= "number" or min_saved < 0 or min_saved ~= floor(min_saved) or min_saved >= 2 ^ 53 then
      error("pagedattn.batch: cascade_min_saved: expected a whole number of page reads >= 0, got " ..
        tostring(min_saved), 2)
    end
  end
  local cap = opts.capacity or 64
  if type(cap) ~= "number" or cap < 1 or cap ~= floor(cap) then
    error("pagedattn.batch: capacity: expected a whole number >= 1, got " .. tostring(cap), 2)
  end
  local h = live_handle(self, F)
  local dev = opts.device or self.device or "cpu"
  if type(dev) == "string" then
    local d, err = T.device(dev)
    if not d then error("pagedattn.batch: device: " .. tostring(err), 2) end
    dev = d
  end
  if getmetatable(dev) ~= T.Device then error("pagedattn.batch: device: expected a device or a name", 2) end
  local flags = (opts.csr == false and C.PA_BATCH_NO_CSR or 0) + (opts.cascade and C.PA_BATCH_CASCADE or 0)
  local ok, err = check(C.pa_batch_create(ctx, h, dev.handle, flags, batch_box), F)
  if not ok then return nil, err end
  if min_saved and min_saved > 0 then
    local created = batch_box[0]
    ok, err = check(C.pa_batch_set_cascade_min_saved(ctx, created, min_saved), F)
    if not ok then
      C.pa_batch_destroy(created)
      return nil, err
    end
  end
  local b = setmetatable({
    cache = self,
    handle = ffi.gc(batch_box[0], C.pa_batch_destroy),
    device = dev,
    ids = i32_array(cap), counts = i32_array(cap), groups = i32_array(cap), cap = cap, labeled = false,
    seqs = {}, n = 0,
    info = info_t(),
    staged = false, staged_n = 0,
    size = 0, total_q = 0, max_seqlen_q = 0, max_seqlen_k = 0, max_pages = 0,
    num_indices = 0, new_pages = 0, cow_copies = 0,
    csr = opts.csr ~= false,
    cascade = opts.cascade == true,
    cascade_buf = opts.cascade and cascade_info_t() or nil,
    scratch = {},
  }, Batch)
  for _, f in ipairs(FIELDS) do
    -- borrowed views: no finalizer; `owner` keeps the batch (and its buffer) alive
    b[f[1]] = setmetatable({
      handle = C.pa_batch_tensor(b.handle, f[2]),
      shape = f[3] and { 0, 1 } or { 0 }, dtype = "i32", device = dev, numel = 0, owner = b,
    }, Tensor)
  end
  self.batches[b] = true
  return b
end

-- Forgets the pairs added so far (the sequences are not touched).
function Batch:clear()
  self.n = 0
  self.labeled = false
  self.staged = false
  return self
end

local function grow(self)
  local cap = self.cap * 2
  local ids, counts, groups = i32_array(cap), i32_array(cap), i32_array(cap)
  ffi.copy(ids, self.ids, self.cap * 4)
  ffi.copy(counts, self.counts, self.cap * 4)
  ffi.copy(groups, self.groups, self.cap * 4)
  self.ids, self.counts, self.groups, self.cap = ids, counts, groups, cap
end

-- Adds sequence `seq` with `n` new tokens (n >= 0; 0 = attend without appending).
-- group (cascade batches): entries added with the same number >= 0 form one
-- group, which shares the pages common to all of them; once any entry of a
-- step has a group, the step's groups are the given ones (an entry without
-- one is on its own), else they are found from the pages.
function Batch:add(seq, n, group)
  if type(n) ~= "number" or n < 0 or n > 2147483647 or n ~= floor(n) then
    error("pagedattn.batch:add: n: expected a whole number >= 0, got " .. tostring(n), 2)
  end
  local i = self.n
  if i >= self.cap then grow(self) end
  if group ~= nil then
    if not self.cascade then error("pagedattn.batch:add: group: the batch was made without cascade = true", 2) end
    if type(group) ~= "number" or group < 0 or group > 2147483647 or group ~= floor(group) then
      error("pagedattn.batch:add: group: expected a whole number >= 0, got " .. tostring(group), 2)
    end
    self.groups[i] = group
    self.labeled = true
  else
    self.groups[i] = -1
  end
  self.ids[i] = seq.id
  self.counts[i] = n
  self.seqs[i + 1] = seq
  self.n = i + 1
  return self
end

-- Number of pairs added since clear().
function Batch:count() return self.n end
-- The sequence and new-token count of entry i (1-based).
function Batch:entry(i)
  if i < 1 or i > self.n then error("pagedattn.batch:entry: i: " .. tostring(i) .. " is not in [1, " .. self.n .. "]", 2) end
  return self.seqs[i], self.counts[i - 1]
end

local function set1(t, n)
  t.shape[1] = n
  t.numel = n
end

-- Appends every entry's new tokens to its sequence (all or nothing) and writes
-- the index tensors. Returns self, or nil, err when the pool is out of pages
-- (then nothing changed). A dead sequence or a repeated one raises an error.
function Batch:stage()
  local h = self.handle
  if h == nil then error("pagedattn.batch:stage: batch: closed", 2) end
  if self.cache.handle == nil then error("pagedattn.batch:stage: cache: closed", 2) end
  local n = self.n
  local st
  if self.labeled then
    st = C.pa_batch_stage_groups(ctx, h, n, self.ids, self.counts, self.groups, self.info)
  else
    st = C.pa_batch_stage(ctx, h, n, self.ids, self.counts, self.info)
  end
  if st ~= 0 then
    self.staged = false
    return check(st, "batch:stage")
  end
  local info = self.info
  local B, W, Tq = info.batch, info.max_pages, info.total_q
  self.size, self.total_q, self.max_pages = B, Tq, W
  self.max_seqlen_q, self.max_seqlen_k = info.max_seqlen_q, info.max_seqlen_k
  self.num_indices, self.new_pages, self.cow_copies = info.num_indices, info.new_pages, info.cow_copies
  local bt = self.block_table
  bt.shape[1], bt.shape[2], bt.numel = B, W, B * W
  set1(self.cache_seqlens, B)
  set1(self.seqused_k, B)
  set1(self.cu_seqlens_q, B + 1)
  set1(self.positions, Tq)
  set1(self.batch_indices, Tq)
  if self.csr then
    set1(self.kv_indptr, B + 1)
    set1(self.kv_indices, info.num_indices)
    set1(self.kv_last_page_len, B)
  end
  if self.cascade then
    local ci = self.cascade_buf
    C.pa_batch_get_cascade(h, ci)
    local G = ci.groups
    local two = G > 0
    local pbt, sbt = self.prefix_block_table, self.suffix_block_table
    pbt.shape[1], pbt.shape[2], pbt.numel = G, ci.prefix_width, G * ci.prefix_width
    set1(self.prefix_seqused_k, G)
    set1(self.prefix_cu_seqlens_q, two and G + 1 or 0)
    set1(self.prefix_rows, two and ci.shared_q or 0)
    set1(self.prefix_row_of, two and Tq or 0)
    local rows = two and B or 0
    sbt.shape[1], sbt.shape[2], sbt.numel = rows, ci.suffix_width, rows * ci.suffix_width
    set1(self.suffix_cache_seqlens, rows)
    set1(self.suffix_seqused_k, rows)
    self.cascade_groups, self.shared_q = G, ci.shared_q
  end
  self.staged = true
  self.staged_n = n
  return self
end

-- Undoes the last stage() (lengths and the pages it took), e.g. after the
-- attention call that was to write the new tokens failed.
function Batch:unstage()
  if self.handle == nil then error("pagedattn.batch:unstage: batch: closed", 2) end
  check(C.pa_batch_unstage(ctx, self.handle), "batch:unstage")
  self.staged = false
  return self
end

local reserved_opts = { k_scale = true, v_scale = true, block_table = true, cu_seqlens_q = true, seqused_k = true,
  cache_seqlens = true, max_seqlen_q = true, k = true, v = true }

local function layer_caches(self, opts, fname)
  local cache = self.cache
  local layer = opts.layer or 1
  if type(layer) ~= "number" or layer < 1 or layer > cache.layers or layer ~= floor(layer) then
    error("pagedattn." .. fname .. ": layer: " .. tostring(layer) .. " is not in [1, " .. cache.layers .. "]", 3)
  end
  local sc = cache.scales[layer]
  return cache.k_caches[layer], cache.v_caches[layer], sc and sc.k, sc and sc.v
end

local function check_staged(self, fname)
  if not self.staged then error("pagedattn." .. fname .. ": batch: not staged (call stage() first)", 3) end
  if self.n ~= self.staged_n then
    error("pagedattn." .. fname .. ": batch: entries were added after stage()", 3)
  end
end

local function copy_opts(opts, fname)
  if opts ~= nil and type(opts) ~= "table" then
    error("pagedattn." .. fname .. ": opts: expected a table, got " .. type(opts), 3)
  end
  local o = {}
  for key, val in pairs(opts or {}) do
    if key == "k_scale" or key == "v_scale" then
      error("pagedattn." .. fname .. ": " .. key .. ": set by the cache (pa.kv_cache{" .. key .. " = ...})", 3)
    elseif reserved_opts[key] then
      error("pagedattn." .. fname .. ": " .. key .. ": set by the batch (pass k and v as arguments)", 3)
    end
    if key ~= "layer" then o[key] = val end
  end
  return o
end

-- out, lse = b:attention(q, k, v, opts): appends the new tokens' k and v
-- (rotated by opts.rotary_cos/rotary_sin when given) at their positions and
-- attends, through the contract functions:
--   q [total_q, H, D], k/v [total_q, Hk, D] (or nil when already appended
--     with append_kv): pa.attention_varlen, any mix of prefill chunks and decodes;
--   q [B, Sq, H, D], k/v [B, S_new, Hk, D]: pa.attention_with_kvcache, for
--     batches where every entry has the same number of new tokens.
-- opts: those of the contract functions, except the index tensors (the batch
-- sets them), plus layer (1-based, default 1). causal defaults to TRUE here:
-- a batch is a step of autoregressive decoding (and q is rotated only when
-- causal or windowed).
function Batch:attention(q, k, v, opts)
  local F = "batch:attention"
  check_staged(self, F)
  if not is_tensor(q) then error("pagedattn." .. F .. ": q: expected a tensor, got " .. type(q), 2) end
  local o = copy_opts(opts, F)
  local kc, vc
  kc, vc, o.k_scale, o.v_scale = layer_caches(self, opts or {}, F)
  if o.causal == nil then o.causal = true end
  if (k == nil) ~= (v == nil) then
    error("pagedattn." .. F .. ": " .. (k == nil and "k" or "v") .. ": missing (pass both k and v, or neither)", 2)
  end
  o.k, o.v = k, v
  o.block_table = self.block_table
  if #q.shape == 3 then
    if k == nil and o.rotary_cos ~= nil then
      error("pagedattn." .. F .. ": rotary_cos: needs k and v (rotation happens on append)", 2)
    end
    if self.cascade then
      o.block_table = nil
      return attention.batch_attention(self.handle, F, q, kc, vc, o)
    end
    o.cu_seqlens_q, o.seqused_k = self.cu_seqlens_q, self.seqused_k
    o.max_seqlen_q = self.max_seqlen_q
    return attention.attention_varlen(q, kc, vc, o)
  elseif #q.shape == 4 then
    if k ~= nil then
      local s_new = k.shape and k.shape[2]
      if self.total_q ~= self.size * (s_new or -1) or self.max_seqlen_q ~= s_new then
        error("pagedattn." .. F .. ": k: shape [B, S_new, Hk, D] needs every entry to have S_new new tokens " ..
              "(use q [total_q, H, D] for mixed batches)", 2)
      end
      o.cache_seqlens = self.cache_seqlens
    else
      o.cache_seqlens = self.seqused_k
    end
    if self.cascade then
      o.block_table, o.cache_seqlens = nil, nil
      return attention.batch_attention(self.handle, F, q, kc, vc, o)
    end
    return attention.attention_with_kvcache(q, kc, vc, o)
  end
  error("pagedattn." .. F .. ": q: expected [total_q, H, D] or [B, Sq, H, D], got " .. #q.shape .. " dimensions", 2)
end

-- ok = b:append_kv(k, v, opts): writes the new tokens' k (rotated with
-- opts.rotary_cos/rotary_sin) and v [total_q, Hk, D] into their pages without
-- attention (opts: rotary_cos, rotary_sin, rotary_interleaved, layer).
-- Attend later with b:attention(q, nil, nil, opts).
-- (Built on attention_varlen with a dummy query per token that sees one key.)
function Batch:append_kv(k, v, opts)
  local F = "batch:append_kv"
  check_staged(self, F)
  if not is_tensor(k) then error("pagedattn." .. F .. ": k: expected a tensor, got " .. type(k), 2) end
  if not is_tensor(v) then error("pagedattn." .. F .. ": v: expected a tensor, got " .. type(v), 2) end
  if #k.shape ~= 3 then error("pagedattn." .. F .. ": k: expected [total_q, Hk, D], got " .. #k.shape .. " dimensions", 2) end
  opts = opts or {}
  if type(opts) ~= "table" then error("pagedattn." .. F .. ": opts: expected a table, got " .. type(opts), 2) end
  local kc, vc, k_scale, v_scale = layer_caches(self, opts, F)
  local o = { k = k, v = v, k_scale = k_scale, v_scale = v_scale, window_size = { 0, 0 }, block_table = self.block_table,
    cu_seqlens_q = self.cu_seqlens_q, seqused_k = self.seqused_k, max_seqlen_q = self.max_seqlen_q,
    rotary_cos = opts.rotary_cos, rotary_sin = opts.rotary_sin,
    rotary_interleaved = opts.rotary_interleaved }
  for key in pairs(opts) do
    if key ~= "rotary_cos" and key ~= "rotary_sin" and key ~= "rotary_interleaved" and key ~= "layer" then
      error("pagedattn." .. F .. ": " .. tostring(key) .. ": unknown option", 2)
    end
  end
  local key = k.shape[1] .. "x" .. k.shape[2] .. "x" .. k.shape[3] .. k.dtype
  local s = self.scratch
  if s.key ~= key then
    s.q = T.new_tensor(k.shape, k.dtype, k.device, F)
    s.out = T.new_tensor(k.shape, k.dtype, k.device, F)
    s.key = key
  end
  o.out = s.out
  local out, err = attention.attention_varlen(s.q, kc, vc, o)
  if not out then return nil, err end
  return true
end

-- What the last stage planned and the last attention did (cascade batches):
-- groups, grouped (entries in them), shared_q (their queries), prefix_width,
-- suffix_width, prefix_pages (shared pages, each read once), saved_pages
-- (page reads saved: per group (entries - 1) x its pages), max_grouped_pos,
-- last ("used", or why the last b:attention made the plain call: "off",
-- "no groups", "alibi", "window", "rows") and calls (attention calls it made).
function Batch:cascade_info()
  if self.handle == nil then error("pagedattn.batch:cascade_info: batch: closed", 2) end
  local ci = cascade_info_t()
  C.pa_batch_get_cascade(self.handle, ci)
  return {
    groups = ci.groups, grouped = ci.grouped, shared_q = ci.shared_q, prefix_width = ci.prefix_width,
    suffix_width = ci.suffix_width, max_grouped_pos = ci.max_grouped_pos,
    prefix_pages = tonumber(ci.prefix_pages), saved_pages = tonumber(ci.saved_pages),
    last = FALLBACK[ci.last_fallback] or tostring(ci.last_fallback), calls = ci.last_calls,
  }
end

-- Frees the staging buffers. The views (b.block_table, ...) die with them:
-- using one afterwards is an error naming it.
function Batch:close()
  if self.handle == nil then return end
  for _, f in ipairs(FIELDS) do
    local view = self[f[1]]
    view.handle = nil
    view.dead = "its batch was closed"
  end
  C.pa_batch_destroy(ffi.gc(self.handle, nil))
  self.handle = nil
  self.staged = false
  if self.cache.batches then self.cache.batches[self] = nil end
end

function Batch:__tostring()
  return string.format("pagedattn.batch(%d entries%s)", self.n,
    self.staged and string.format(", staged: %d new tokens, %d pages wide", self.total_q, self.max_pages) or "")
end

return M
