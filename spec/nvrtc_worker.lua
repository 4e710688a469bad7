-- spec/nvrtc_worker.lua ARCH LIST -- compiles the kernel variants named in
-- the file LIST (one a line) for ARCH, without the disk cache; prints a line
-- "failed NAME: ERROR" for each that does not compile, then "compiled N".
-- nvrtc_spec runs one a CPU, side by side: NVRTC compiles on one thread.
local ffi = require "ffi"
local core = require "pagedattn.core"
local C = core.C
local cached = ffi.new("int[1]")
local n = 0
for name in io.lines(arg[2]) do
  if C.pa_kernel_compile(core.ctx, name, arg[1], 0, cached) ~= 0 then
    io.write("failed ", name, ": ", core.last_error(), "\n")
  end
  n = n + 1
end
io.write("compiled ", n, "\n")
