-- pagedattn.sweep.env: environment-variable configs for tuning runs
-- (scripts/bench.lua, A/B micro-benchmarks): parsing "A=1,B=2|C=3" and
-- running a function with some variables set, restored after.
local M = {}

-- Configs of environment variables from text "A=1,B=2|C=3" ("-": a config
-- of none), for tuning runs: { { name = "A=1,B=2", vars = { A = "1", B = "2" } }, ... }
function M.env_configs(text)
  local configs = {}
  for c in (text or ""):gmatch("[^|]+") do
    local vars = {}
    if c ~= "-" then
      for kv in c:gmatch("[^,]+") do
        local k, v = kv:match("^%s*([%w_]+)=(.*)$")
        if not k then error("a config's setting is VAR=VALUE, got '" .. kv .. "'", 2) end
        vars[k] = v
      end
    end
    configs[#configs + 1] = { name = c, vars = vars }
  end
  return configs
end

-- Runs fn with environment variables set (false: unset), restoring them
-- after, also after an error (the library reads its PAGEDATTN_* variables at
-- each call, so a tuning run can switch them between calls).
function M.with_env(vars, fn)
  local ffi = require "ffi"
  pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")
  local saved = {}
  for k, v in pairs(vars) do
    saved[k] = os.getenv(k) or false
    if v then ffi.C.setenv(k, v, 1) else ffi.C.unsetenv(k) end
  end
  local ok, err = pcall(fn)
  for k, v in pairs(saved) do
    if v then ffi.C.setenv(k, v, 1) else ffi.C.unsetenv(k) end
  end
  if not ok then error(err, 0) end
end

return M
