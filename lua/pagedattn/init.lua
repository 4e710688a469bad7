-- pagedattn: a Lua-scriptable attention runtime (paged attention, page pools,
-- rotary append) over libpagedattn through LuaJIT's FFI.
--   local pa = require "pagedattn"
-- See README.md for the API.
local core = require "pagedattn.core"
local tensor = require "pagedattn.tensor"
local attention = require "pagedattn.attention"
local cache = require "pagedattn.cache"
require "pagedattn.batch" -- adds cache:batch()
require "pagedattn.tuning" -- adds dev:tuning(), dev:set_tuning{...}, dev:last_plan()

local pa = {
  version = require("ffi").string(core.C.pa_version()),
  -- seconds on a monotonic wall clock: time = pa.clock() - t0
  clock = core.C.pa_clock_seconds,
  library_path = core.library_path,
  device = tensor.device,
  tensor = tensor.tensor,
  from_table = tensor.from_table,
  randn = tensor.randn,
  is_tensor = tensor.is_tensor,
  attention_with_kvcache = attention.attention_with_kvcache,
  attention_varlen = attention.attention_varlen,
  merge_states = attention.merge_states,
  kv_cache = cache.kv_cache,
  prefix_hashes = cache.prefix_hashes,
}

return pa
