-- pagedattn.cache: the page pool over KV cache tensors, and sequences that own
-- pages (refcounted sharing through fork, copy-on-write, clean out-of-pages).
--
--   local cache = pa.kv_cache{ num_pages = 1024, page_size = 16, kv_heads = 8,
--                              head_dim = 128, dtype = "bf16", device = dev, layers = 1 }
--   local s = cache:sequence()       -- an empty sequence
--   assert(s:append(100))            -- room for 100 tokens, length 100 (nil, err when out of pages)
--   local child = s:fork()           -- shares s's pages
--   cache:stats()                    -- free, used, shared pages, ...
--
-- Caller mistakes (a freed sequence, a negative count) raise errors naming the
-- argument; running out of pages returns nil, err and changes nothing.
-- Sequences are freed explicitly (s:free()); closing the cache frees them all.
local ffi = require "ffi"
local core = require "pagedattn.core"
local T = require "pagedattn.tensor"

local C, ctx, check = core.C, core.ctx, core.check
local is_tensor = T.is_tensor
local floor = math.floor

local M = {}

local Cache = {}
Cache.__index = Cache
M.Cache = Cache

local Sequence = {}
Sequence.__index = Sequence
M.Sequence = Sequence

local pool_box = ffi.new("pa_pool*[1]")
local id_box = ffi.new("int32_t[1]")
local params = ffi.new("pa_pool_params")
local stats_buf = ffi.new("pa_pool_stats")
local tensor_ptrs = ffi.typeof("pa_tensor*[?]")
local i32_array = ffi.typeof("int32_t[?]")
local u64_array = ffi.typeof("uint64_t[?]")
local prefix_params = ffi.new("pa_prefix_params")
local count_box = ffi.new("int64_t[1]")
local idle_box = ffi.new("int64_t[1]")

local function argerr(fname, name, msg, level)
  error("pagedattn." .. fname .. ": " .. name .. ": " .. msg, (level or 2) + 1)
end

local function whole(fname, name, v, min, level)
  if type(v) ~= "number" or v ~= floor(v) or v < min or v > 2147483647 then
    argerr(fname, name, "expected a whole number >= " .. min .. ", got " .. tostring(v), (level or 2) + 1)
  end
  return v
end

---------------------------------------------------------------------------
-- the cache (pool)

local cache_opts = {
  num_pages = true, page_size = true, kv_heads = true, head_dim = true, dtype = true,
  device = true, layers = true, k_cache = true, v_cache = true, k_caches = true, v_caches = true,
  k_scale = true, v_scale = true, k_scales = true, v_scales = true,
}

local fp8_dtypes = { fp8_e4m3 = true, fp8_e5m2 = true }
local float_box = ffi.new("float[1]")

-- One layer's scale for an fp8 cache, as the attention calls take it: a
-- number (positive and finite as an f32), or f32 [Hk] per kv head (a Lua
-- array becomes such a tensor on the caches' device, once).
local function layer_scale(F, name, x, hk, dev)
  if type(x) == "number" then
    float_box[0] = x
    if not (float_box[0] > 0 and float_box[0] < math.huge) then
      argerr(F, name, "expected a positive finite number (as an f32), got " .. tostring(x), 4)
    end
    return x
  end
  local t = x
  if type(x) == "table" and not is_tensor(x) then
    if #x ~= hk then argerr(F, name, #x .. " numbers for " .. hk .. " kv heads", 4) end
    for i = 1, hk do
      local v = x[i]
      float_box[0] = type(v) == "number" and v or 0
      if not (type(v) == "number" and float_box[0] > 0 and float_box[0] < math.huge) then
        argerr(F, name, "entry " .. i .. " is " .. tostring(v) .. ", not a positive finite number", 4)
      end
    end
    t = assert(T.from_table(x, { hk }, "f32", dev))
  elseif not is_tensor(x) then
    argerr(F, name, "expected a number, a list of " .. hk .. " numbers or an f32 tensor [" .. hk .. "], got " ..
      type(x), 4)
  end
  if t.dtype ~= "f32" or #t.shape ~= 1 or t.shape[1] ~= hk then
    argerr(F, name, "expected an f32 tensor [" .. hk .. "] (one scale per kv head), got " .. tostring(t), 4)
  end
  if t.device ~= dev then argerr(F, name, "on " .. t.device.name .. ", the caches on " .. dev.name, 4) end
  return t
end

-- The scales of every layer ({k = ..., v = ...} a layer) from the options:
-- k_scale / v_scale for every layer, or k_scales / v_scales, one a layer.
local function cache_scales(F, opts, ks)
  local any = opts.k_scale ~= nil or opts.v_scale ~= nil or opts.k_scales ~= nil or opts.v_scales ~= nil
  local out = {}
  if not any then return out end
  local first = ks[1]
  if not first or not fp8_dtypes[first.dtype] then
    argerr(F, opts.k_scale ~= nil and "k_scale" or opts.v_scale ~= nil and "v_scale" or
      opts.k_scales ~= nil and "k_scales" or "v_scales",
      "scales apply to fp8 caches (dtype fp8_e4m3 or fp8_e5m2), these are " .. (first and first.dtype or "absent"), 3)
  end
  local hk, dev = first.shape[3], first.device
  for _, kind in ipairs({ "k", "v" }) do
    local one, per = opts[kind .. "_scale"], opts[kind .. "_scales"]
    if one ~= nil and per ~= nil then
      argerr(F, kind .. "_scales", "give " .. kind .. "_scale (every layer) or " .. kind .. "_scales (one a layer), not both", 3)
    end
    if per ~= nil and (type(per) ~= "table" or is_tensor(per) or #per ~= #ks) then
      argerr(F, kind .. "_scales", "expected a list of " .. #ks .. " scales, one a layer", 3)
    end
    for l = 1, #ks do
      out[l] = out[l] or {}
      local x = per and per[l] or one
      if x ~= nil then
        out[l][kind] = layer_scale(F, per and (kind .. "_scales[" .. l .. "]") or (kind .. "_scale"), x, hk, dev)
      end
    end
  end
  return out
end

-- pa.kv_cache(opts): a page pool over new or given cache tensors.
--   new tensors: num_pages, page_size, kv_heads, head_dim, dtype ("f32"), device, layers (1)
--   given ones:  k_cache, v_cache (one layer) or k_caches, v_caches (lists, one pair per layer)
--   fp8 caches (dtype "fp8_e4m3" / "fp8_e5m2"): k_scale, v_scale (a number, a list
--     of Hk numbers or an f32 tensor [Hk]; default 1) for every layer, or
--     k_scales, v_scales (one of those a layer); the batch's calls pass them
--   bookkeeping only (no tensors, nothing to copy): num_pages, page_size, layers = 0
function M.kv_cache(opts)
  local F = "kv_cache"
  if type(opts) ~= "table" then argerr(F, "opts", "expected a table, got " .. type(opts)) end
  for k in pairs(opts) do
    if not cache_opts[k] then argerr(F, tostring(k), "unknown option") end
  end
  local ks, vs = opts.k_caches, opts.v_caches
  if opts.k_cache ~= nil or opts.v_cache ~= nil then
    if ks ~= nil or vs ~= nil then argerr(F, "k_cache", "give k_cache/v_cache or k_caches/v_caches, not both") end
    ks, vs = { opts.k_cache }, { opts.v_cache }
    if not is_tensor(opts.k_cache) then argerr(F, "k_cache", "expected a tensor, got " .. type(opts.k_cache)) end
    if not is_tensor(opts.v_cache) then argerr(F, "v_cache", "expected a tensor, got " .. type(opts.v_cache)) end
  end
  local owned = false
  if ks ~= nil or vs ~= nil then
    if type(ks) ~= "table" then argerr(F, "k_caches", "expected a list of tensors") end
    if type(vs) ~= "table" then argerr(F, "v_caches", "expected a list of tensors") end
    if #ks ~= #vs then argerr(F, "v_caches", #vs .. " tensors for " .. #ks .. " k_caches") end
    if #ks == 0 then argerr(F, "k_caches", "empty") end
    for i = 1, #ks do
      if not is_tensor(ks[i]) then argerr(F, "k_caches[" .. i .. "]", "expected a tensor, got " .. type(ks[i])) end
      if not is_tensor(vs[i]) then argerr(F, "v_caches[" .. i .. "]", "expected a tensor, got " .. type(vs[i])) end
    end
    for _, k in ipairs({ "kv_heads", "head_dim", "dtype", "device", "layers" }) do
      if opts[k] ~= nil then argerr(F, k, "not allowed with given cache tensors (their shape says it)") end
    end
  else
    local layers = opts.layers == nil and 1 or whole(F, "layers", opts.layers, 0)
    whole(F, "num_pages", opts.num_pages, 1)
    whole(F, "page_size", opts.page_size, 1)
    ks, vs = {}, {}
    if layers > 0 then
      local hk = whole(F, "kv_heads", opts.kv_heads, 1)
      local d = whole(F, "head_dim", opts.head_dim, 1)
      local shape = { opts.num_pages, opts.page_size, hk, d }
      for l = 1, layers do
        local k, err = T.new_tensor(shape, opts.dtype or "f32", opts.device, F)
        if not k then return nil, err end
        local v, verr = T.new_tensor(shape, opts.dtype or "f32", opts.device, F)
        if not v then return nil, verr end
        ks[l], vs[l] = k, v
      end
      owned = true
    end
  end

  local scales = cache_scales(F, opts, ks)
  local L = #ks
  local kp, vp = tensor_ptrs(L > 0 and L or 1), tensor_ptrs(L > 0 and L or 1)
  for i = 1, L do
    kp[i - 1] = T.live(ks[i], F, "k_caches[" .. i .. "]")
    vp[i - 1] = T.live(vs[i], F, "v_caches[" .. i .. "]")
  end
  C.pa_pool_params_init(params)
  params.num_pages = opts.num_pages or 0
  params.page_size = opts.page_size or 0
  params.num_layers = L
  params.k_caches, params.v_caches = kp, vp
  local ok, err = check(C.pa_pool_create(ctx, params, pool_box), F, 2)
  params.k_caches, params.v_caches = nil, nil
  if not ok then return nil, err end
  local handle = ffi.gc(pool_box[0], C.pa_pool_destroy)
  -- the pool borrows the tensors: t:free() must not pull them from under it
  for i = 1, L do
    ks[i].held_by = (ks[i].held_by or 0) + 1
    vs[i].held_by = (vs[i].held_by or 0) + 1
  end
  local first = ks[1]
  local self = setmetatable({
    handle = handle,
    num_pages = tonumber(C.pa_pool_num_pages(handle)),
    page_size = C.pa_pool_page_size(handle),
    layers = L,
    k_caches = ks, v_caches = vs,
    k_cache = first, v_cache = vs[1],
    device = first and first.device or nil,
    dtype = first and first.dtype or nil,
    kv_heads = first and first.shape[3] or nil,
    head_dim = first and first.shape[4] or nil,
    owns_tensors = owned,
    scales = scales, -- per layer: {k = k_scale, v = v_scale} of an fp8 cache (nil: 1)
    batches = setmetatable({}, { __mode = "k" }),
    pages_buf = i32_array(64), pages_cap = 64,
  }, Cache)
  return self
end

-- The scales of layer l (1-based) of an fp8 cache: k_scale, v_scale (a
-- number or an f32 tensor [Hk]; nil: 1).
function Cache:layer_scales(l)
  local s = self.scales[l or 1]
  if not s then return nil, nil end
  return s.k, s.v
end

-- level: where the error points (3 = the caller of the method that asks)
local function live_handle(cache, fname, level)
  local h = cache.handle
  if h == nil then error("pagedattn." .. fname .. ": cache: closed", level or 3) end
  return h
end
M.live_handle = live_handle

-- Frees the pool, its sequences and its batches (the cache tensors stay valid
-- as long as you hold them).
function Cache:close()
  if self.handle == nil then return end
  for b in pairs(self.batches) do b:close() end
  C.pa_pool_destroy(ffi.gc(self.handle, nil))
  self.handle = nil
  for i = 1, self.layers do
    self.k_caches[i].held_by = self.k_caches[i].held_by - 1
    self.v_caches[i].held_by = self.v_caches[i].held_by - 1
  end
end

-- Statistics as a table (into `t` when given, to avoid an allocation):
-- num_pages, page_size, free_pages, used_pages, shared_pages, page_refs,
-- peak_used_pages, sequences, tokens, cow_copies, and for the prefix cache
-- cached_pages, prefix_hits, prefix_misses, prefix_evictions (pages).
function Cache:stats(t)
  local h = live_handle(self, "stats")
  C.pa_pool_get_stats(h, stats_buf)
  local s = stats_buf
  t = t or {}
  t.num_pages, t.page_size = tonumber(s.num_pages), tonumber(s.page_size)
  t.free_pages, t.used_pages = tonumber(s.free_pages), tonumber(s.used_pages)
  t.shared_pages, t.page_refs = tonumber(s.shared_pages), tonumber(s.page_refs)
  t.peak_used_pages, t.sequences = tonumber(s.peak_used_pages), tonumber(s.sequences)
  t.tokens, t.cow_copies = tonumber(s.tokens), tonumber(s.cow_copies)
  t.cached_pages, t.prefix_hits = tonumber(s.cached_pages), tonumber(s.prefix_hits)
  t.prefix_misses, t.prefix_evictions = tonumber(s.prefix_misses), tonumber(s.prefix_evictions)
  return t
end

function Cache:free_pages()
  C.pa_pool_get_stats(live_handle(self, "free_pages"), stats_buf)
  return tonumber(stats_buf.free_pages)
end

-- The refcount of page `page` (0-based id).
function Cache:refcount(page)
  local h = live_handle(self, "refcount")
  local rc = C.pa_pool_page_refcount(h, page)
  if rc < 0 then argerr("refcount", "page", tostring(page) .. " is not in [0, " .. self.num_pages .. ")") end
  return rc
end

-- Slots of used pages that hold no token (internal fragmentation).
function Cache:unused_slots()
  return tonumber(C.pa_pool_unused_slots(live_handle(self, "unused_slots")))
end

-- Checks the pool's invariants; raises an error describing the first violation.
function Cache:validate()
  local st = C.pa_pool_validate(ctx, live_handle(self, "validate"))
  if st ~= 0 then error("pagedattn.validate: " .. core.last_error(), 2) end
  return true
end

---------------------------------------------------------------------------
-- automatic prefix caching (src/pagedattn.h explains the design)

-- Turns prefix caching on (true) or off (false: every page leaves the cache).
function Cache:enable_prefix_cache(on)
  local h = live_handle(self, "enable_prefix_cache")
  if type(on) ~= "boolean" then argerr("enable_prefix_cache", "on", "expected a boolean, got " .. type(on)) end
  local ok, err = check(C.pa_pool_prefix_cache(ctx, h, on and 1 or 0), "enable_prefix_cache")
  if not ok then return nil, err end
  self.prefix_caching = on
  return self
end

-- A uint64_t array from cdata (as it is) or a Lua list of whole numbers < 2^53.
local function u64_of(fname, name, v, n)
  if type(v) == "cdata" then return v end
  if type(v) ~= "table" then argerr(fname, name, "expected a uint64_t array or a list, got " .. type(v), 3) end
  if #v < n then argerr(fname, name, #v .. " entries, " .. n .. " needed", 3) end
  local a = u64_array(math.max(n, 1))
  for i = 1, n do
    local x = v[i]
    if type(x) ~= "number" or x < 0 or x ~= floor(x) or x >= 2 ^ 53 then
      argerr(fname, name .. "[" .. i .. "]", "expected a whole number in [0, 2^53), got " .. tostring(x), 3)
    end
    a[i - 1] = x
  end
  return a
end

-- Chain hashes of pages for the prefix cache: pa.prefix_hashes{num_pages =,
-- tokens = (token ids, num_pages * page_size of them; int32_t* or a list),
-- page_size =, or keys = (one per page; uint64_t* or a list), parent = (the
-- hash before the first page, default 0), out = (uint64_t*, optional)}.
-- Returns out (a uint64_t array of num_pages hashes).
function M.prefix_hashes(o)
  local F = "prefix_hashes"
  if type(o) ~= "table" then argerr(F, "opts", "expected a table, got " .. type(o)) end
  local n = whole(F, "num_pages", o.num_pages, 0)
  local tokens, keys = o.tokens, o.keys
  if (tokens == nil) == (keys == nil) then argerr(F, "tokens", "give tokens (with page_size) or keys, not both") end
  prefix_params.num_pages = n
  prefix_params.page_size = 0
  prefix_params.parent = o.parent or 0
  prefix_params.tokens, prefix_params.keys = nil, nil
  if tokens ~= nil then
    local ps = whole(F, "page_size", o.page_size, 1)
    prefix_params.page_size = ps
    if type(tokens) == "table" then
      if #tokens < n * ps then argerr(F, "tokens", #tokens .. " token ids for " .. n .. " pages of " .. ps) end
      local a = i32_array(math.max(n * ps, 1))
      for i = 1, n * ps do
        local x = tokens[i]
        if type(x) ~= "number" or x ~= floor(x) or x < -2147483648 or x > 2147483647 then
          argerr(F, "tokens[" .. i .. "]", "expected a 32-bit whole number, got " .. tostring(x))
        end
        a[i - 1] = x
      end
      tokens = a
    elseif type(tokens) ~= "cdata" then
      argerr(F, "tokens", "expected an int32_t array or a list, got " .. type(tokens))
    end
    prefix_params.tokens = tokens
  else
    keys = u64_of(F, "keys", keys, n)
    prefix_params.keys = keys
  end
  local out = o.out or u64_array(math.max(n, 1))
  local ok, err = check(C.pa_prefix_hashes(ctx, prefix_params, out), F)
  prefix_params.tokens, prefix_params.keys = nil, nil
  if not ok then return nil, err end
  return out
end
Cache.prefix_hashes = function(_, o) return M.prefix_hashes(o) end

-- How many of the n hashes, from the first, the cache holds, and how many of
-- those pages no sequence holds (attaching them takes them from the free
-- pages). Changes nothing.
function Cache:prefix_lookup(n, hashes)
  local h = live_handle(self, "prefix_lookup")
  whole("prefix_lookup", "n", n, 0)
  hashes = u64_of("prefix_lookup", "hashes", hashes, n)
  local m = C.pa_pool_prefix_lookup(h, n, hashes, idle_box)
  return tonumber(m), tonumber(idle_box[0])
end

-- A new, empty sequence.
function Cache:sequence()
  local ok, err = check(C.pa_seq_create(ctx, live_handle(self, "sequence"), id_box), "sequence")
  if not ok then return nil, err end
  return setmetatable({ cache = self, id = id_box[0] }, Sequence)
end

function Cache:__tostring()
  if self.handle == nil then return "pagedattn.kv_cache(closed)" end
  local s = self:stats()
  return string.format("pagedattn.kv_cache(%d pages of %d tokens, %d layer(s), %s; %d free)",
    self.num_pages, self.page_size, self.layers, self.device and self.device.name or "no tensors",
    s.free_pages)
end

---------------------------------------------------------------------------
-- sequences

local function seq_handle(self, fname)
  if self.id < 0 then error("pagedattn." .. fname .. ": seq: freed", 3) end
  return live_handle(self.cache, fname, 4)
end

-- Tokens in the sequence.
function Sequence:len()
  local n = C.pa_seq_len(seq_handle(self, "seq:len"), self.id)
  return tonumber(n)
end

-- Pages held (including pages reserved past the length).
function Sequence:num_pages()
  return tonumber(C.pa_seq_num_pages(seq_handle(self, "seq:num_pages"), self.id))
end

-- Tokens the held pages can take.
function Sequence:capacity()
  return self:num_pages() * self.cache.page_size
end

-- Pages that reserve(n) / append(n) would take from the pool now (including a
-- copy of a shared partial page).
function Sequence:pages_needed(n)
  local h = seq_handle(self, "seq:pages_needed")
  whole("seq:pages_needed", "n", n, 0)
  return tonumber(C.pa_seq_pages_needed(h, self.id, n))
end

-- The page ids (0-based) as a Lua array.
function Sequence:pages()
  local h = seq_handle(self, "seq:pages")
  local cache = self.cache
  local n = tonumber(C.pa_seq_pages(h, self.id, cache.pages_buf, cache.pages_cap))
  if n > cache.pages_cap then
    cache.pages_cap = n
    cache.pages_buf = i32_array(n)
    C.pa_seq_pages(h, self.id, cache.pages_buf, n)
  end
  local out, buf = {}, cache.pages_buf
  for i = 1, n do out[i] = buf[i - 1] end
  return out
end

-- Room for n more tokens, the length unchanged. Returns self, or nil, err.
function Sequence:reserve(n)
  local h = seq_handle(self, "seq:reserve")
  whole("seq:reserve", "n", n, 0)
  local ok, err = check(C.pa_seq_reserve(ctx, h, self.id, n), "seq:reserve")
  if not ok then return nil, err end
  return self
end

-- reserve(n), then the length grows by n. Returns self, or nil, err.
function Sequence:append(n)
  local h = seq_handle(self, "seq:append")
  whole("seq:append", "n", n, 0)
  local ok, err = check(C.pa_seq_append(ctx, h, self.id, n), "seq:append")
  if not ok then return nil, err end
  return self
end

-- A new sequence sharing this one's pages (copy-on-write).
function Sequence:fork()
  local h = seq_handle(self, "seq:fork")
  local ok, err = check(C.pa_seq_fork(ctx, h, self.id, id_box), "seq:fork")
  if not ok then return nil, err end
  return setmetatable({ cache = self.cache, id = id_box[0] }, Sequence)
end

-- Keeps the first len tokens; pages past them go back to the pool.
function Sequence:truncate(len)
  local h = seq_handle(self, "seq:truncate")
  whole("seq:truncate", "len", len, 0)
  check(C.pa_seq_truncate(ctx, h, self.id, len), "seq:truncate")
  return self
end

-- An empty sequence starts with the longest cached prefix of hashes[1..n]
-- (its pages shared, their tokens counted). Returns the pages matched.
function Sequence:prefix_attach(n, hashes)
  local h = seq_handle(self, "seq:prefix_attach")
  whole("seq:prefix_attach", "n", n, 0)
  hashes = u64_of("seq:prefix_attach", "hashes", hashes, n)
  local ok, err = check(C.pa_seq_prefix_attach(ctx, h, self.id, n, hashes, count_box), "seq:prefix_attach")
  if not ok then return nil, err end
  return tonumber(count_box[0])
end

-- Registers the sequence's full pages [first, first + n) (0-based) under
-- hashes[first .. first + n - 1] of the sequence's chain (a uint64_t array
-- indexed from 0, or a Lua list from 1). Returns the pages newly cached.
function Sequence:prefix_insert(first, n, hashes)
  local h = seq_handle(self, "seq:prefix_insert")
  whole("seq:prefix_insert", "first", first, 0)
  whole("seq:prefix_insert", "n", n, 0)
  hashes = u64_of("seq:prefix_insert", "hashes", hashes, first + n)
  local ok, err = check(C.pa_seq_prefix_insert(ctx, h, self.id, first, n, hashes + first, count_box),
    "seq:prefix_insert")
  if not ok then return nil, err end
  return tonumber(count_box[0])
end

-- Releases every page. Freeing twice is harmless.
function Sequence:free()
  if self.id < 0 or self.cache.handle == nil then
    self.id = -1
    return
  end
  check(C.pa_seq_free(ctx, self.cache.handle, self.id), "seq:free")
  self.id = -1
end
Sequence.close = Sequence.free

function Sequence:is_live()
  return self.id >= 0 and self.cache.handle ~= nil and C.pa_seq_len(self.cache.handle, self.id) >= 0
end

function Sequence:__tostring()
  if self.id < 0 then return "pagedattn.sequence(freed)" end
  return string.format("pagedattn.sequence(%d: %d tokens, %d pages)", self.id, self:len(), self:num_pages())
end

return M
