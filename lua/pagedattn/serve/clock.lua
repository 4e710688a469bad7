-- pagedattn.serve.clock: how long a step of the serving engine takes.
--
-- "model" clock: a step's time is its attention time times the model's
-- layers, plus the rest of the model from a cost model:
--   max(dense FLOPs / compute rate, weight bytes / read rate) + overhead
-- where the compute rate is the device's measured bf16 matmul rate (GPU) or
-- fp32 FMA peak (CPU) and the read rate its streaming-read rate, both from
-- pagedattn.ceilings (measured once per device, kept on disk). The attention
-- time is measured on the device for that step (the engine times its
-- attention calls); without attention layers (layers = 0) it is estimated
-- the same way as the rest: max(attention FLOPs / compute, KV bytes / read).
-- "steps" clock: every step lasts step_s seconds (deterministic schedules).
--
-- A model is a small table (copy one to describe yours):
--   layers, heads, kv_heads, head_dim, hidden, mlp (the gated MLP's inner
--   size), vocab, dtype (weights, and the KV cache unless kv_dtype),
--   kv_dtype (the KV cache's: dtype, or fp8_e4m3 / fp8_e5m2), tp (tensor parallel degree:
--   weights, FLOPs and heads split tp ways; communication is not modelled),
--   overhead_ms (a per-step constant: sampling, launches, the scheduler).
local M = {}

M.models = {
  -- small enough that a trace replays in seconds on 2 CPU cores
  tiny = { name = "tiny", layers = 2, heads = 4, kv_heads = 2, head_dim = 32, hidden = 128, mlp = 512,
    vocab = 1024, dtype = "f32", tp = 1, overhead_ms = 0 },
  -- Meta Llama 3 8B (config.json of the release)
  ["llama3-8b"] = { name = "llama3-8b", layers = 32, heads = 32, kv_heads = 8, head_dim = 128, hidden = 4096,
    mlp = 14336, vocab = 128256, dtype = "bf16", tp = 1, overhead_ms = 0 },
  -- Meta Llama 3 70B; tp = 8 GPUs by default (its bf16 weights need > 2 x 80 GB)
  ["llama3-70b"] = { name = "llama3-70b", layers = 80, heads = 64, kv_heads = 8, head_dim = 128, hidden = 8192,
    mlp = 28672, vocab = 128256, dtype = "bf16", tp = 8, overhead_ms = 0 },
}

local BYTES = { f32 = 4, f16 = 2, bf16 = 2 }
local KV_BYTES = { f32 = 4, f16 = 2, bf16 = 2, fp8_e4m3 = 1, fp8_e5m2 = 1 }

local REQUIRED = { "layers", "heads", "kv_heads", "head_dim", "hidden", "mlp", "vocab" }

-- A model by name, a path to a Lua file returning a table, or a table;
-- checked and completed (dtype bf16, tp 1, overhead_ms 0). Errors name the field.
function M.model(m)
  if type(m) == "string" then
    if M.models[m] then
      m = M.models[m]
    elseif m:match("%.lua$") then
      local chunk, err = loadfile(m)
      if not chunk then error("serve: model: " .. err, 0) end
      local ok, t = pcall(chunk)
      if not ok then error("serve: model " .. m .. ": " .. tostring(t), 0) end
      m = t
    else
      local names = {}
      for k in pairs(M.models) do names[#names + 1] = k end
      table.sort(names)
      error("serve: model: no preset '" .. m .. "' (presets: " .. table.concat(names, ", ") ..
        "; or a .lua file returning a table)", 0)
    end
  end
  if type(m) ~= "table" then error("serve: model: expected a name, a .lua file or a table, got " .. type(m), 0) end
  local out = {}
  for k, v in pairs(m) do out[k] = v end
  out.dtype = out.dtype or "bf16"
  out.kv_dtype = out.kv_dtype or out.dtype
  out.tp = out.tp or 1
  out.overhead_ms = out.overhead_ms or 0
  out.name = out.name or "custom"
  for _, k in ipairs(REQUIRED) do
    local v = out[k]
    if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
      error("serve: model " .. out.name .. ": " .. k .. ": expected a whole number >= 1, got " .. tostring(v), 0)
    end
  end
  if not BYTES[out.dtype] then error("serve: model " .. out.name .. ": dtype: f32, f16 or bf16, got " .. tostring(out.dtype), 0) end
  if not KV_BYTES[out.kv_dtype] then
    error("serve: model " .. out.name .. ": kv_dtype: f32, f16, bf16, fp8_e4m3 or fp8_e5m2, got " .. tostring(out.kv_dtype), 0)
  end
  if out.heads % out.kv_heads ~= 0 then
    error("serve: model " .. out.name .. ": heads (" .. out.heads .. ") must be a multiple of kv_heads (" .. out.kv_heads .. ")", 0)
  end
  if type(out.tp) ~= "number" or out.tp < 1 or out.tp ~= math.floor(out.tp) or out.heads % out.tp ~= 0 then
    error("serve: model " .. out.name .. ": tp: expected a whole number >= 1 dividing heads, got " .. tostring(out.tp), 0)
  end
  if type(out.overhead_ms) ~= "number" or out.overhead_ms < 0 then
    error("serve: model " .. out.name .. ": overhead_ms: expected a number >= 0", 0)
  end
  return out
end

-- Weights of one transformer layer (Llama: q, k, v, o projections and a
-- gated MLP of three matrices; norms are negligible), and of the LM head.
function M.layer_params(m)
  local qo = 2 * m.hidden * m.heads * m.head_dim
  local kv = 2 * m.hidden * m.kv_heads * m.head_dim
  return qo + kv + 3 * m.hidden * m.mlp
end

function M.params(m)
  -- the embedding table is looked up, not multiplied: it is counted in
  -- the total but neither read nor multiplied per step
  return M.layer_params(m) * m.layers + 2 * m.hidden * m.vocab
end

-- The KV cache's bytes per token of the whole model (all layers, k and v).
function M.kv_bytes_per_token(m)
  return 2 * m.layers * m.kv_heads * m.head_dim * KV_BYTES[m.kv_dtype or m.dtype]
end

-- The rates a clock needs from a device's ceilings: compute in FLOP/s
-- (matmul on a GPU, FMA on a CPU) and read in bytes/s.
function M.rates(ceilings, kind)
  local peak = kind == "cuda" and (ceilings.matmul_gflops or 0) or (ceilings.fma_gflops or 0)
  local read = ceilings.read_gbps or 0
  if not (peak > 0) then error("serve: clock: the device's compute ceiling was not measured (" ..
    (kind == "cuda" and "matmul_gflops" or "fma_gflops") .. " = 0): use --clock steps", 0) end
  if not (read > 0) then error("serve: clock: the device's read rate was not measured: use --clock steps", 0) end
  return { flops = peak * 1e9, bytes = read * 1e9 }
end

-- Seconds for the rest of the model (everything but attention) in a step
-- that runs `tokens` new tokens of which `logits` need the LM head.
function M.dense_seconds(m, rates, tokens, logits)
  local tp = m.tp
  local flops = (2 * tokens * M.layer_params(m) * m.layers + 2 * logits * m.hidden * m.vocab) / tp
  local bytes = (M.layer_params(m) * m.layers + m.hidden * m.vocab) * BYTES[m.dtype] / tp
  local compute, memory = flops / rates.flops, bytes / rates.bytes
  return compute > memory and compute or memory
end

-- Seconds of attention for one layer, estimated: sequences i with q[i] new
-- tokens attending causally to k[i] keys in all (q[i] <= k[i]).
function M.attention_estimate(m, rates, n, q, k)
  local hq, hk, d, bytes = m.heads / m.tp, math.max(1, m.kv_heads / m.tp), m.head_dim, KV_BYTES[m.kv_dtype or m.dtype]
  local flops, kv = 0, 0
  for i = 1, n do
    local qi, ki = q[i], k[i]
    -- query j of the new ones sees ki - qi + j keys: their sum is qi * (ki - qi) + qi (qi + 1) / 2
    local pairs = qi * (ki - qi) + qi * (qi + 1) / 2
    flops = flops + 4 * pairs * hq * d
    kv = kv + 2 * ki * hk * d * bytes
  end
  local compute, memory = flops / rates.flops, kv / rates.bytes
  return compute > memory and compute or memory
end

-- A step's modelled seconds.
--   attn_layer_s: measured attention seconds of one layer (nil: estimate)
--   tokens, logits, n, q, k: the step's shape (see attention_estimate)
function M.step_seconds(m, rates, attn_layer_s, tokens, logits, n, q, k)
  local attn = attn_layer_s or M.attention_estimate(m, rates, n, q, k)
  return attn * m.layers + M.dense_seconds(m, rates, tokens, logits) + m.overhead_ms * 1e-3
end

return M
