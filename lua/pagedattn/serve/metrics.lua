-- pagedattn.serve.metrics: per-request records and the summary a paper
-- reports (TTFT, TPOT, end-to-end latency percentiles in ms, throughput,
-- goodput under SLOs, prefix-cache hit rate), and writing them as CSV / JSON.
--
-- Definitions (times in seconds of the engine's clock; a token produced by a
-- step exists when the step ends):
--   ttft   first token - arrival          queue  first scheduled - arrival
--   tpot   (finish - first token) / (output tokens - 1); none for 1 token
--   e2e    finish - arrival
--   percentiles: linear interpolation between order statistics (numpy's
--   default), so p50 of {1, 2, 3, 4} is 2.5
--   throughput: requests and output tokens per second over the span from
--   the first arrival to the last finish
--   goodput: requests per second over that span that met every SLO given
--   (ttft <= slo_ttft_ms and tpot <= slo_tpot_ms; a 1-token request has no
--   tpot and meets that SLO)
local M = {}

M.REQUEST_COLUMNS = {
  "id", "arrival_s", "first_token_s", "finish_s", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms",
  "prompt_tokens", "output_tokens", "cached_tokens", "preemptions", "priority",
}

-- The record of a finished request (the engine's request table).
function M.record(r)
  local tpot
  if r.output_tokens > 1 then tpot = (r.finish - r.first_token) / (r.output_tokens - 1) * 1e3 end
  return {
    id = r.id, arrival_s = r.arrival, first_token_s = r.first_token, finish_s = r.finish,
    ttft_ms = (r.first_token - r.arrival) * 1e3, tpot_ms = tpot, e2e_ms = (r.finish - r.arrival) * 1e3,
    queue_ms = (r.first_scheduled - r.arrival) * 1e3, prompt_tokens = r.prompt_tokens,
    output_tokens = r.output_tokens, cached_tokens = r.cached_tokens or 0, preemptions = r.preemptions or 0,
    priority = r.priority,
  }
end

-- q-quantile (0..1) of a list of numbers by linear interpolation; nil when empty.
function M.quantile(values, q)
  local s = {}
  for i = 1, #values do s[i] = values[i] end
  if #s == 0 then return nil end
  table.sort(s)
  local pos = 1 + (#s - 1) * q
  local lo = math.floor(pos)
  local hi = math.min(lo + 1, #s)
  return s[lo] + (s[hi] - s[lo]) * (pos - lo)
end

local function dist(values)
  if #values == 0 then return nil end
  local sum = 0
  for i = 1, #values do sum = sum + values[i] end
  return { p50 = M.quantile(values, 0.5), p90 = M.quantile(values, 0.9), p99 = M.quantile(values, 0.99),
           mean = sum / #values, max = M.quantile(values, 1) }
end
M.dist = dist

-- summary(records, opts) -> table
--   opts.slo_ttft_ms, opts.slo_tpot_ms   SLOs for goodput (nil: not applied)
--   opts.prefix {hits, misses, evictions} (pool counters, in pages), opts.extra
--   (fields copied into the summary as they are)
function M.summary(records, opts)
  opts = opts or {}
  local ttft, tpot, e2e, queue = {}, {}, {}, {}
  local first, last = math.huge, -math.huge
  local out_tokens, prompt_tokens, cached, good, preempt = 0, 0, 0, 0, 0
  for _, r in ipairs(records) do
    ttft[#ttft + 1] = r.ttft_ms
    e2e[#e2e + 1] = r.e2e_ms
    queue[#queue + 1] = r.queue_ms
    if r.tpot_ms then tpot[#tpot + 1] = r.tpot_ms end
    if r.arrival_s < first then first = r.arrival_s end
    if r.finish_s > last then last = r.finish_s end
    out_tokens = out_tokens + r.output_tokens
    prompt_tokens = prompt_tokens + r.prompt_tokens
    cached = cached + r.cached_tokens
    preempt = preempt + r.preemptions
    local ok = true
    if opts.slo_ttft_ms and r.ttft_ms > opts.slo_ttft_ms then ok = false end
    if opts.slo_tpot_ms and r.tpot_ms and r.tpot_ms > opts.slo_tpot_ms then ok = false end
    if ok then good = good + 1 end
  end
  local span = #records > 0 and last - first or 0
  local s = {
    requests = #records,
    duration_s = span,
    ttft_ms = dist(ttft), tpot_ms = dist(tpot), e2e_ms = dist(e2e), queue_ms = dist(queue),
    throughput = {
      requests_per_s = span > 0 and #records / span or nil,
      output_tokens_per_s = span > 0 and out_tokens / span or nil,
      total_tokens_per_s = span > 0 and (out_tokens + prompt_tokens) / span or nil,
    },
    prompt_tokens = prompt_tokens, output_tokens = out_tokens, preemptions = preempt,
    goodput = {
      slo_ttft_ms = opts.slo_ttft_ms, slo_tpot_ms = opts.slo_tpot_ms,
      requests = good, fraction = #records > 0 and good / #records or nil,
      requests_per_s = span > 0 and good / span or nil,
    },
    prefix_cache = {
      cached_tokens = cached,
      cached_token_fraction = prompt_tokens > 0 and cached / prompt_tokens or 0,
    },
  }
  if opts.prefix then
    local p = opts.prefix
    s.prefix_cache.hits, s.prefix_cache.misses, s.prefix_cache.evictions = p.hits, p.misses, p.evictions
    s.prefix_cache.hit_rate = (p.hits + p.misses) > 0 and p.hits / (p.hits + p.misses) or 0
  end
  for k, v in pairs(opts.extra or {}) do s[k] = v end
  return s
end

---------------------------------------------------------------------------
-- files

local function fmt(v)
  if v == nil then return "" end
  if type(v) == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.9g", v)
  end
  local s = tostring(v)
  if s:find('[,"\n]') then s = '"' .. s:gsub('"', '""') .. '"' end
  return s
end

-- One row per request, in id order (the trace's row order), with
-- REQUEST_COLUMNS; an empty field is a value that does not exist (tpot of a
-- 1-token request, a priority the trace did not give).
function M.write_requests_csv(path, records)
  local rows = {}
  for i, r in ipairs(records) do rows[i] = r end
  table.sort(rows, function(a, b) return a.id < b.id end)
  local f, err = io.open(path, "wb")
  if not f then error("serve: requests_out: cannot write " .. tostring(err), 0) end
  f:write(table.concat(M.REQUEST_COLUMNS, ","), "\n")
  local line = {}
  for _, r in ipairs(rows) do
    for k, c in ipairs(M.REQUEST_COLUMNS) do line[k] = fmt(r[c]) end
    f:write(table.concat(line, ","), "\n")
  end
  f:close()
end

-- The summary as JSON (lua-dkjson), keys in a fixed order for diffs.
function M.encode_summary(s)
  local json = require "dkjson"
  local order = { "requests", "duration_s", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "throughput", "goodput",
    "prefix_cache", "p50", "p90", "p99", "mean", "max", "requests_per_s", "output_tokens_per_s",
    "total_tokens_per_s", "slo_ttft_ms", "slo_tpot_ms", "fraction", "hit_rate", "hits", "misses",
    "evictions", "cached_tokens", "cached_token_fraction", "prompt_tokens", "output_tokens", "preemptions",
    "cascade", "steps_shared", "steps", "groups_per_shared_step", "page_reads_saved_fraction",
    "attention_ms_per_step", "plain_attention_ms_per_step", "attention_saved_fraction", "modelled_s_saved" }
  return json.encode(s, { indent = true, keyorder = order })
end

function M.write_summary_json(path, s)
  local f, err = io.open(path, "wb")
  if not f then error("serve: summary_out: cannot write " .. tostring(err), 0) end
  f:write(M.encode_summary(s), "\n")
  f:close()
end

return M
