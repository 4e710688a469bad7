-- scripts/fuzz.lua -- the long fuzzing runs, by hand (CI runs short ones:
-- spec/fuzz_spec.lua). Prints the seed, progress and a summary; exits 1 on
-- the first violation, with the case and the command that reruns it.
--   scripts/run scripts/fuzz.lua attention|pool|all [--iters N] [--seed S]
--                                [--device cpu|cpu:staged|cuda] [--case I] [--strict]
--   --iters   attention: calls (default 20000); pool: operations (default 100000)
--   --seed    default: the time (printed; the same seed gives the same run)
--   --case    run case I of the run alone (pool: the I-th pool)
--   --strict  also the cases of the library bugs the fuzzers step around
--             (spec/fuzz/attention.lua, KNOWN_BUGS)
io.stdout:setvbuf("line")
local which = arg[1]
local opts = { device = "cpu" }
local i = 2
while arg[i] do
  local a = arg[i]
  if a == "--iters" then opts.iters = tonumber(arg[i + 1]); i = i + 2
  elseif a == "--seed" then opts.seed = tonumber(arg[i + 1]); i = i + 2
  elseif a == "--device" then opts.device = arg[i + 1]; i = i + 2
  elseif a == "--case" then opts.case = tonumber(arg[i + 1]); i = i + 2
  elseif a == "--strict" then opts.strict = true; i = i + 1
  else which = nil; break end
end
if which ~= "attention" and which ~= "pool" and which ~= "all" then
  io.stderr:write("usage: scripts/run scripts/fuzz.lua attention|pool|all [--iters N] [--seed S]" ..
    " [--device cpu|cpu:staged|cuda] [--case I] [--strict]\n")
  os.exit(2)
end
opts.seed = opts.seed or os.time()
print(string.format("fuzz %s on %s, seed %d (rerun: scripts/run scripts/fuzz.lua %s --seed %d%s --device %s)",
  which, opts.device, opts.seed, which, opts.seed, opts.iters and (" --iters " .. opts.iters) or "", opts.device))

local function go(name, default_iters, every)
  local fuzz = require("spec.fuzz." .. name)
  local ok, s = pcall(fuzz.run, { seed = opts.seed, iters = opts.iters or default_iters, device = opts.device,
    case = opts.case, strict = opts.strict, log = print, log_every = every })
  if not ok then
    print(tostring(s))
    os.exit(1)
  end
  print(fuzz.report(s))
end

if which == "attention" or which == "all" then go("attention", 20000, 1000) end
if which == "pool" or which == "all" then go("pool", 100000, 10000) end
