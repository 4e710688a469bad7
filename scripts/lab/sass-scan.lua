-- scripts/lab/sass-scan.lua [--windows | --overlap] CUBIN... -- where the wgmma waits of a kernel sit, read
-- straight from a cubin's SASS encodings (this machine has nvcc and ptxas but
-- no cuobjdump or nvdisasm). Prints, per kernel, the instruction index of each
-- block barrier (BAR), cp.async commit (LDGDEPBAR), wgmma fence
-- (WARPGROUP.ARRIVE), run of HGMMAs, and wgmma wait (WARPGROUP.DEPBAR, with
-- its group count), so that one sees e.g. whether the wait for P V is still
-- after the softmax. Encodings matched on sm_90a against cuobjdump -sass
-- (docs/prefill.md).
--   cd kernels && nvcc -arch=sm_90a -cubin -std=c++17 -DPA_DTYPE=2 -DPA_D=128 \
--     -DPA_GT=4 -DPA_PAGE=16 -DPA_STAGES=3 -DPA_NATURAL=0 -o /tmp/k.cubin prefill_wgmma.cu
--   luajit scripts/lab/sass-scan.lua /tmp/k.cubin
-- A CUBIN may be a file of the kernel cache (a header, then the cubin).
-- --overlap: one line per kernel, each wait for S (WG.DEPBAR <= 1) to the
-- next wait for everything (<= 0) as "instructions/MUFUs": the exponentials
-- ptxas placed under P V(t - 1) (main's loop at head dim 128: 191/20 of the
-- step's 66; fewer free registers move them after the wait).
-- --windows: one line per kernel instead, its instruction count and the
-- instructions from each wgmma fence to the next wait (prefill_ws's loop:
-- 109 at head dim 128), flagged "serialised" where ptxas issued the wgmmas
-- one at a time (most windows under 20 instructions; its C7511 remark,
-- which NVRTC does not print). scripts/lab/wgmma_windows.sh compiles
-- variants through NVRTC and runs this.
local function u16(s, o) return s:byte(o + 1) + s:byte(o + 2) * 256 end
local function u32(s, o) return u16(s, o) + u16(s, o + 2) * 65536 end
local function u64(s, o) return u32(s, o) + u32(s, o + 4) * 4294967296 end -- offsets and sizes: exact below 2^53

local windows = arg[1] == "--windows"
local overlap = arg[1] == "--overlap"
if windows or overlap then table.remove(arg, 1) end

local function scan(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  local at = s:find("\127ELF", 1, true) -- the kernel cache's files start with a header
  if at then s = s:sub(at) end
  assert(s:sub(1, 4) == "\127ELF" and s:byte(5) == 2, path .. ": not a 64-bit ELF file (a cubin)")
  local shoff, shentsize, shnum, shstrndx = u64(s, 0x28), u16(s, 0x3a), u16(s, 0x3c), u16(s, 0x3e)
  local secs = {}
  for i = 0, shnum - 1 do
    local h = shoff + i * shentsize
    secs[i] = { name = u32(s, h), off = u64(s, h + 0x18), size = u64(s, h + 0x20) }
  end
  local strtab = secs[shstrndx].off
  local function name_of(o) return s:match("^[^%z]*", strtab + o + 1) end
  for i = 0, shnum - 1 do
    local n = name_of(secs[i].name)
    if n:sub(1, 6) == ".text." then
      local off, size = secs[i].off, secs[i].size
      local line = { string.format("%s: %d instructions", n:sub(7), size / 16) }
      local say = (windows or overlap) and function() end or print
      local w1, mufu, spans = nil, 0, {}
      local arrive, short, count = nil, 0, 0
      say(line[1])
      local prev
      for k = 0, size / 16 - 1 do
        local o = off + 16 * k
        local lo0, lo1 = u32(s, o), u32(s, o + 4)
        local op = lo0 % 4096
        local what
        if op == 0x9c5 then
          -- WARPGROUP.ARRIVE: first word 0x79c5; WARPGROUP.DEPBAR.LE gsb0, N: 0x00008000000079c5
          if lo1 == 0x8000 then
            what = string.format("WG.DEPBAR gsb0 <= %d", math.floor(u32(s, o + 8) / 256) % 256)
          else
            what = "WG.ARRIVE"
          end
        elseif op == 0x9f0 or op == 0xdf0 then
          what = "HGMMA"
        elseif op == 0xb1d then
          what = "BAR"
        elseif op == 0x9af then
          what = "LDGDEPBAR"
        elseif op == 0x308 then -- MUFU (encoding matched against ncu's SASS)
          mufu = mufu + 1
        end
        if what and what:sub(1, 9) == "WG.DEPBAR" then
          if what:sub(-1) == "1" then
            w1, mufu = k, 0
          elseif w1 then
            spans[#spans + 1] = string.format("%d/%d", k - w1, mufu)
            w1 = nil
          end
        end
        if what and not (what == "HGMMA" and prev == "HGMMA") then say(string.format("  %6d  %s", k, what)) end
        if what == "WG.ARRIVE" then
          arrive = k
        elseif what and what:sub(1, 9) == "WG.DEPBAR" and arrive then
          line[#line + 1] = tostring(k - arrive)
          count, short, arrive = count + 1, short + (k - arrive < 20 and 1 or 0), nil
        end
        if what then prev = what end
      end
      if windows then
        print(table.concat(line, " ") .. (short * 2 > count and "  (serialised)" or ""))
      elseif overlap then
        print(line[1] .. " " .. table.concat(spans, " "))
      end
    end
  end
end

if #arg == 0 then
  io.stderr:write("usage: luajit scripts/lab/sass-scan.lua [--windows | --overlap] CUBIN...\n")
  os.exit(2)
end
for _, p in ipairs(arg) do scan(p) end
