-- spec/helpers.lua -- shared by the specs: seeds (printed, overridable), the
-- size scale, devices, and assertions with readable messages.
--   PAGEDATTN_SEED=N        base seed (default: the time; printed once)
--   PAGEDATTN_SPEC_SCALE=x  multiplies the number of random cases (default 1)
local ref = require "pagedattn.reference"

local H = {}

local base_seed = tonumber(os.getenv("PAGEDATTN_SEED") or "") or (os.time() % 1000000) * 1000
if not _G.__pagedattn_seed_printed then
  io.stderr:write(string.format("specs: base seed %d (rerun with PAGEDATTN_SEED=%d)\n", base_seed, base_seed))
  _G.__pagedattn_seed_printed = true
end
H.base_seed = base_seed

function H.scale(n)
  local s = tonumber(os.getenv("PAGEDATTN_SPEC_SCALE") or "") or 1
  return math.max(1, math.floor(n * s + 0.5))
end

-- A seed for case `i` of suite `name`: stable for a base seed.
function H.seed(name, i)
  local h = 0
  for k = 1, #name do h = (h * 31 + name:byte(k)) % 1000003 end
  return base_seed + h * 1000 + (i or 0)
end

function H.rng(name, i)
  return ref.rng(H.seed(name, i))
end

function H.rerun(spec_file)
  return string.format("rerun: PAGEDATTN_SEED=%d scripts/test %s", base_seed, spec_file)
end

-- Asserts a pagedattn.check result, with the case, its seed and how to rerun.
function H.assert_check(r, seed, spec_file)
  local check = require "pagedattn.check"
  if not r.ok then
    error(string.format("%s\n  case: %s\n  seed: %d\n  %s", r.report, check.describe(r.case),
      seed, H.rerun(spec_file)), 2)
  end
end

-- Calls fn and returns the error message it raised (fails if it raised none).
function H.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error, got none")
  return tostring(err)
end

-- ---- shell, files, devices: what several specs need ----

-- The repository root (busted runs there; scripts/env.sh exports it).
H.root = os.getenv("PAGEDATTN_ROOT") or (function()
  local p = io.popen("pwd")
  local d = p:read("*l")
  p:close()
  return d
end)()

-- Runs shell commands side by side (each started before any is read; their
-- output must be small, or a later one blocks on its pipe); returns, per
-- command, { exit status, output (stdout + stderr) }.
function H.sh_all(cmds)
  local pipes, out = {}, {}
  for i, cmd in ipairs(cmds) do pipes[i] = io.popen("(" .. cmd .. ") 2>&1; echo \"__rc=$?\"") end
  for i, p in ipairs(pipes) do
    local text = p:read("*a")
    p:close()
    out[i] = { tonumber(text:match("__rc=(%d+)%s*$")), (text:gsub("__rc=%d+%s*$", "")) }
  end
  return out
end

-- Runs a shell command; returns its exit status and output (stdout + stderr).
function H.sh(cmd)
  local r = H.sh_all({ cmd })[1]
  return r[1], r[2]
end

-- The CPUs this process may use (nproc), at least 1.
function H.cpus()
  local _, n = H.sh("nproc")
  return math.max(1, tonumber(n:match("%d+")) or 1)
end

function H.have(cmd) return H.sh("command -v " .. cmd .. " >/dev/null") == 0 end

function H.tmpdir()
  local p = io.popen("mktemp -d")
  local d = p:read("*l")
  p:close()
  return d
end

function H.read_file(path) -- nil when missing
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

function H.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- Runs fn with environment variables set (false: unset), restoring them after
-- (the library reads its PAGEDATTN_* tuning variables at each call).
H.with_env = require("pagedattn.sweep").with_env

return H
