-- spec/nvrtc_worker.lua ARCH LIST -- compiles the kernel variants named in
-- the file LIST (one a line) for ARCH; prints a line "failed NAME: ERROR"
-- for each that does not compile, then "compiled N". A line "NAME<tab>DIR"
-- compiles through the disk cache in DIR (the cubin is kept there), any
-- other without the cache. nvrtc_spec runs one a CPU, side by side: NVRTC
-- compiles on one thread.
local ffi = require "ffi"
local core = require "pagedattn.core"
local with_env = require("pagedattn.sweep").with_env
local C = core.C
local cached = ffi.new("int[1]")
local n = 0
for line in io.lines(arg[2]) do
  local name, dir = line:match("^([^\t]*)\t(.*)$")
  name = name or line
  local st
  with_env({ PAGEDATTN_KERNEL_CACHE = dir or false }, function()
    st = C.pa_kernel_compile(core.ctx, name, arg[1], dir and 1 or 0, cached)
  end)
  if st ~= 0 then io.write("failed ", name, ": ", core.last_error(), "\n") end
  n = n + 1
end
io.write("compiled ", n, "\n")
