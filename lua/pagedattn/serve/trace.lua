-- pagedattn.serve.trace: request traces for the serving engine. Public
-- formats are read as given, the format told by the file's first line:
--   Azure LLM inference CSV   TIMESTAMP,ContextTokens,GeneratedTokens
--                             (timestamps like 2023-11-16 18:15:46.6805900)
--   BurstGPT CSV              Timestamp,Model,Request tokens,Response tokens,...
--                             (Timestamp in seconds)
--   Mooncake JSONL            {"timestamp": ms, "input_length": n, "output_length": n,
--                              "hash_ids": [...]}: one id per block of `block_tokens`
--                             tokens (default 512); equal ids mean equal prefixes
-- and a synthetic generator (Poisson or bursty gamma arrivals, multi-turn
-- sessions whose prompts extend the previous turn's).
--
-- A request is a table: id (the trace's row order, from 1), arrival (seconds
-- from the first request), prompt_tokens, output_tokens, and optionally
-- priority (lower runs first under the priority policy), hash_ids and
-- block_tokens (Mooncake), tokens (the prompt's token ids, when a user has
-- them), segments ({ {id, len}, ... }: the prompt as runs of shared content,
-- the generator's form) and output_segment (the id its output is known by in
-- a later turn's prompt). The prefix cache hashes whichever it finds.
--
-- A malformed line is an error naming the file, the line and the field, and
-- nothing is returned: a replay never starts on half a trace.
local M = {}

local floor = math.floor

local function fail(file, line, field, msg)
  error(string.format("serve: trace %s line %d: %s: %s", file, line, field, msg), 0)
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Fields of one CSV line (RFC 4180 quotes), or nil, why.
local function csv_fields(line)
  local fields, i, n = {}, 1, #line
  while true do
    if line:sub(i, i) == '"' then
      local parts, j = {}, i + 1
      while true do
        local q = line:find('"', j, true)
        if not q then return nil, "unterminated quote" end
        parts[#parts + 1] = line:sub(j, q - 1)
        if line:sub(q + 1, q + 1) == '"' then
          parts[#parts + 1] = '"'
          j = q + 2
        else
          i = q + 1
          break
        end
      end
      fields[#fields + 1] = table.concat(parts)
      local c = line:sub(i, i)
      if c == "," then i = i + 1 elseif i > n then break else return nil, "text after a closing quote" end
    else
      local c = line:find(",", i, true)
      if c then
        fields[#fields + 1] = line:sub(i, c - 1)
        i = c + 1
      else
        fields[#fields + 1] = line:sub(i)
        break
      end
    end
  end
  return fields
end
M.csv_fields = csv_fields

-- Days from 1970-01-01 to a civil date (proleptic Gregorian), for timestamps
-- that carry no zone: only differences between rows matter.
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- "2023-11-16 18:15:46.6805900" (also with a T, a trailing Z or a +00:00
-- offset) -> seconds since 1970, or nil.
function M.parse_datetime(s)
  local y, mo, d, h, mi, sec, frac, rest =
    s:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)[T ](%d%d):(%d%d):(%d%d)(%.?%d*)(.*)$")
  if not y then return nil end
  y, mo, d, h, mi, sec = tonumber(y), tonumber(mo), tonumber(d), tonumber(h), tonumber(mi), tonumber(sec)
  if mo < 1 or mo > 12 or d < 1 or d > 31 or h > 23 or mi > 59 or sec > 60 then return nil end
  local offset = 0
  if rest ~= "" and rest ~= "Z" then
    local sign, oh, om = rest:match("^([+-])(%d%d):?(%d%d)$")
    if not sign then return nil end
    offset = (tonumber(oh) * 3600 + tonumber(om) * 60) * (sign == "+" and 1 or -1)
  end
  local f = 0
  if frac ~= "" and frac ~= "." then f = tonumber("0" .. frac) end
  return days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec + f - offset
end

-- a whole number >= min in a field, or a failure naming it
local function count_field(file, line, field, s, min)
  local v = tonumber(s)
  if v == nil or v ~= floor(v) or v < min or v > 2 ^ 31 - 1 then
    fail(file, line, field, string.format("expected a whole number >= %d, got '%s'", min, tostring(s)))
  end
  return v
end

local function priority_field(file, line, s)
  if s == nil or s == "" then return nil end
  local v = tonumber(s)
  if v == nil or v ~= v then fail(file, line, "priority", "expected a number, got '" .. tostring(s) .. "'") end
  return v
end

---------------------------------------------------------------------------
-- formats

local CSV_FORMATS = {
  { name = "azure", time = "TIMESTAMP", prompt = "ContextTokens", output = "GeneratedTokens",
    parse_time = function(s) return M.parse_datetime(trim(s)) end,
    time_what = "a date and time like 2023-11-16 18:15:46.6805900" },
  { name = "burstgpt", time = "Timestamp", prompt = "Request tokens", output = "Response tokens",
    parse_time = function(s) return tonumber(s) end,
    time_what = "seconds (a number)" },
}

local function read_csv(path, lines, fmt, header, opts, out)
  local col = {}
  for i, h in ipairs(header) do col[trim(h)] = i end
  local ti, pi, oi, pri = col[fmt.time], col[fmt.prompt], col[fmt.output], col.priority
  local rows, t0 = {}, nil
  for ln = 2, #lines do
    local text = lines[ln]
    if text:match("%S") then
      local f, why = csv_fields(text)
      if not f then fail(path, ln, "line", why) end
      if #f < #header then
        fail(path, ln, header[#f + 1] and trim(header[#f + 1]) or "line",
          string.format("missing (%d fields, the header has %d)", #f, #header))
      end
      local t = fmt.parse_time(f[ti])
      if not t then fail(path, ln, fmt.time, "expected " .. fmt.time_what .. ", got '" .. f[ti] .. "'") end
      local prompt = count_field(path, ln, fmt.prompt, trim(f[pi]), 1)
      local output = count_field(path, ln, fmt.output, trim(f[oi]), 0)
      rows[#rows + 1] = { id = #rows + 1, time = t, prompt_tokens = prompt, output_tokens = output,
                          priority = pri and priority_field(path, ln, trim(f[pri])) or nil, line = ln }
    end
  end
  return rows
end

local function read_mooncake(path, lines, opts)
  local json = require "dkjson"
  local rows = {}
  for ln = 1, #lines do
    local text = lines[ln]
    if text:match("%S") then
      local obj, _, err = json.decode(text, 1, json.null)
      if type(obj) ~= "table" then fail(path, ln, "line", "not a JSON object" .. (err and (" (" .. err .. ")") or "")) end
      local t = obj.timestamp
      if type(t) ~= "number" then fail(path, ln, "timestamp", "expected milliseconds (a number), got " .. tostring(t)) end
      local prompt = count_field(path, ln, "input_length", obj.input_length, 1)
      local output = count_field(path, ln, "output_length", obj.output_length, 0)
      local ids = obj.hash_ids
      if ids ~= nil and ids ~= json.null then
        if type(ids) ~= "table" then fail(path, ln, "hash_ids", "expected a list of block ids") end
        for k = 1, #ids do
          local v = ids[k]
          if type(v) ~= "number" or v ~= floor(v) or v < 0 or v >= 2 ^ 52 then
            fail(path, ln, "hash_ids", string.format("entry %d: expected a whole number >= 0, got %s", k, tostring(v)))
          end
        end
        local need = math.ceil(prompt / opts.block_tokens)
        if #ids > need then
          fail(path, ln, "hash_ids", string.format("%d ids for %d input tokens in blocks of %d (at most %d; " ..
            "is --trace-block right?)", #ids, prompt, opts.block_tokens, need))
        end
      else
        ids = nil
      end
      rows[#rows + 1] = { id = #rows + 1, time = t / 1000, prompt_tokens = prompt, output_tokens = output,
                          hash_ids = ids, block_tokens = ids and opts.block_tokens or nil,
                          priority = priority_field(path, ln, obj.priority ~= nil and tostring(obj.priority) or nil),
                          line = ln }
    end
  end
  return rows
end

-- The format of a trace from its first line: "azure", "burstgpt", "mooncake", or nil, why.
function M.detect(first_line)
  local line = first_line or ""
  if line:match("^%s*{") then return "mooncake" end
  local header = csv_fields(line)
  if header then
    local names = {}
    for _, h in ipairs(header) do names[trim(h)] = true end
    for _, fmt in ipairs(CSV_FORMATS) do
      if names[fmt.time] and names[fmt.prompt] and names[fmt.output] then return fmt.name, header end
    end
  end
  return nil, "unknown format (expected an Azure CSV header TIMESTAMP,ContextTokens,GeneratedTokens, " ..
    "a BurstGPT header with Timestamp, Request tokens and Response tokens, or Mooncake JSON lines)"
end

-- trace.read(path, opts) -> requests, info
--   opts.time_scale    inter-arrival times multiplied by this (2 = half the rate; default 1)
--   opts.requests      keep the first N requests (after skipping empty ones)
--   opts.block_tokens  Mooncake: tokens per hash id (default 512)
-- info: { format, rows, skipped (requests with 0 output tokens: BurstGPT's
-- failed requests; they produce nothing to time), duration }
function M.read(path, opts)
  opts = opts or {}
  local scale = opts.time_scale or 1
  if type(scale) ~= "number" or not (scale > 0) or scale == math.huge then
    error("serve: time_scale: expected a number > 0, got " .. tostring(scale), 2)
  end
  local block = opts.block_tokens or 512
  if type(block) ~= "number" or block < 1 or block ~= floor(block) then
    error("serve: trace_block: expected a whole number >= 1, got " .. tostring(block), 2)
  end
  local f, err = io.open(path, "rb")
  if not f then error("serve: trace: cannot open " .. tostring(err), 0) end
  local text = f:read("*a")
  f:close()
  local lines = {}
  for l in (text:gsub("\r\n", "\n") .. (text:sub(-1) == "\n" and "" or "\n")):gmatch("([^\n]*)\n") do
    lines[#lines + 1] = l
  end
  local first = 1
  while lines[first] and not lines[first]:match("%S") do first = first + 1 end
  if not lines[first] then error("serve: trace " .. path .. ": empty file", 0) end
  if first > 1 then
    -- keep line numbers true: blank leading lines stay, as blanks
    error("serve: trace " .. path .. " line 1: line: blank before the header", 0)
  end
  local name, header = M.detect(lines[1])
  if not name then error("serve: trace " .. path .. " line 1: header: " .. header, 0) end
  local rows
  if name == "mooncake" then
    rows = read_mooncake(path, lines, { block_tokens = block })
  else
    local fmt
    for _, c in ipairs(CSV_FORMATS) do if c.name == name then fmt = c end end
    rows = read_csv(path, lines, fmt, header, opts)
  end
  if #rows == 0 then error("serve: trace " .. path .. ": no requests after the header", 0) end
  -- arrivals from the first one, in order (a stable sort: the ids keep the rows' order)
  local order = {}
  for i, r in ipairs(rows) do order[i] = r end
  table.sort(order, function(a, b)
    if a.time ~= b.time then return a.time < b.time end
    return a.id < b.id
  end)
  local t0 = order[1].time
  local reqs, skipped = {}, 0
  for _, r in ipairs(order) do
    if r.output_tokens == 0 then
      skipped = skipped + 1
    elseif not opts.requests or #reqs < opts.requests then
      r.arrival = (r.time - t0) * scale
      r.time = nil
      reqs[#reqs + 1] = r
    end
  end
  if #reqs == 0 then error("serve: trace " .. path .. ": every request has 0 output tokens", 0) end
  return reqs, { format = name, rows = #rows, skipped = skipped, path = path,
                 duration = reqs[#reqs].arrival - reqs[1].arrival }
end

---------------------------------------------------------------------------
-- the synthetic generator

-- A standard normal variate (Box-Muller) and a gamma(k, 1) variate
-- (Marsaglia and Tsang; k < 1 through gamma(k + 1) * U^(1/k)).
local function normal(rng)
  local u1 = rng:uniform()
  if u1 < 1e-300 then u1 = 1e-300 end
  return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * rng:uniform())
end

local function gamma(rng, k)
  if k < 1 then
    local u = rng:uniform()
    if u < 1e-300 then u = 1e-300 end
    return gamma(rng, k + 1) * u ^ (1 / k)
  end
  local d = k - 1 / 3
  local c = 1 / math.sqrt(9 * d)
  while true do
    local x, v
    repeat
      x = normal(rng)
      v = 1 + c * x
    until v > 0
    v = v * v * v
    local u = rng:uniform()
    if u < 1 - 0.0331 * x ^ 4 or math.log(u) < 0.5 * x * x + d * (1 - v + math.log(v)) then return d * v end
  end
end
M.gamma = gamma

-- trace.synthetic(o) -> requests, info
--   o.requests N, o.rate (requests per second), o.seed
--   o.arrival "poisson" (default) or "gamma": gaps gamma-distributed with
--     coefficient of variation o.burstiness (default 2: bursts; 1 = Poisson)
--   o.prompt {lo, hi}, o.output {lo, hi}: uniform lengths (the new user text)
--   o.system S: a system prompt every request starts with (segment "system")
--   o.turns {lo, hi}: turns per session (default {1, 1}); turn j + 1 arrives
--     o.think_s seconds (mean, exponential) after turn j and its prompt is
--     turn j's prompt and output followed by new text: a shared prefix
--   o.priorities P: a priority in 0 .. P-1 for each session, uniform (default none)
function M.synthetic(o)
  local ref = require "pagedattn.reference"
  local rng = ref.rng(o.seed or 1)
  local N = o.requests
  if type(N) ~= "number" or N < 1 or N ~= floor(N) then error("serve: requests: expected a whole number >= 1", 2) end
  if type(o.rate) ~= "number" or not (o.rate > 0) then error("serve: rate: expected a number > 0", 2) end
  local arrival = o.arrival or "poisson"
  if arrival ~= "poisson" and arrival ~= "gamma" then error("serve: arrival: poisson or gamma, got " .. tostring(arrival), 2) end
  local cv = o.burstiness or 2
  if arrival == "gamma" and not (cv > 0) then error("serve: burstiness: expected a number > 0", 2) end
  local turns = o.turns or { 1, 1 }
  local think = o.think_s or 10
  local system = o.system or 0
  local function gap()
    if arrival == "poisson" then return -math.log(1 - rng:uniform()) / o.rate end
    local k = 1 / (cv * cv) -- shape; the mean gap stays 1 / rate
    return gamma(rng, k) / (k * o.rate)
  end
  local reqs, t, seg_id = {}, 0, 0
  local function new_segment() seg_id = seg_id + 1 return seg_id end
  local pending = {} -- later turns, by arrival
  while true do
    t = t + gap()
    if #pending >= N then
      -- enough once no later session can arrive before the N-th request
      table.sort(pending, function(a, b) return a.arrival < b.arrival end)
      if t > pending[N].arrival then break end
    end
    local nturns = rng:int(turns[1], turns[2])
    local prio = o.priorities and rng:int(0, o.priorities - 1) or nil
    local history, at = {}, t
    if system > 0 then history[1] = { 0, system } end -- segment 0: the shared system prompt
    for j = 1, nturns do
      local user = rng:int(o.prompt[1], o.prompt[2])
      local out = rng:int(o.output[1], o.output[2])
      local segs = {}
      for k, s in ipairs(history) do segs[k] = s end
      segs[#segs + 1] = { new_segment(), user }
      local len = 0
      for _, s in ipairs(segs) do len = len + s[2] end
      local r = { arrival = at, prompt_tokens = len, output_tokens = out, segments = segs,
                  output_segment = new_segment(), priority = prio, system_tokens = system, turn = j }
      pending[#pending + 1] = r
      history = {}
      for k, s in ipairs(segs) do history[k] = s end
      history[#history + 1] = { r.output_segment, out }
      at = at - math.log(1 - rng:uniform()) * think
    end
  end
  table.sort(pending, function(a, b) return a.arrival < b.arrival end)
  for i = 1, N do
    local r = pending[i]
    r.id = i
    reqs[i] = r
  end
  local t0 = reqs[1].arrival
  for _, r in ipairs(reqs) do r.arrival = r.arrival - t0 end
  return reqs, { format = "synthetic", rows = N, skipped = 0, duration = reqs[N].arrival }
end

return M
