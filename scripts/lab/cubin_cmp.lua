-- scripts/lab/cubin_cmp.lua A B -- whether two cubins hold the same machine
-- code: compares every ELF section by name and bytes except the debug ones
-- (.debug_*, .nv_debug_*, and their relocations), which carry the line
-- table that -lineinfo writes and so move with any edit of a comment. The
-- .text.<kernel> sections are the SASS encodings themselves; .nv.info.*,
-- .nv.shared.*, .nv.constant* and the symbol table say registers, shared
-- memory, parameters and constants. Exit 0 and prints nothing when they
-- agree; else exit 1 and one line per section that differs or exists in
-- one file only. Either file may be a pagedattn kernel-cache file (a header,
-- then the cubin). Used by scripts/lab/sass_diff.sh where there is no
-- cuobjdump (this machine has none).
local function u16(s, o) return s:byte(o + 1) + s:byte(o + 2) * 256 end
local function u32(s, o) return u16(s, o) + u16(s, o + 2) * 65536 end
local function u64(s, o) return u32(s, o) + u32(s, o + 4) * 4294967296 end

local function sections(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  local at = s:find("\127ELF", 1, true)
  if at then s = s:sub(at) end
  assert(s:sub(1, 4) == "\127ELF" and s:byte(5) == 2, path .. ": not a 64-bit ELF file (a cubin)")
  local shoff, shentsize, shnum, shstrndx = u64(s, 0x28), u16(s, 0x3a), u16(s, 0x3c), u16(s, 0x3e)
  local hdr = {}
  for i = 0, shnum - 1 do
    local h = shoff + i * shentsize
    hdr[i] = { name = u32(s, h), type = u32(s, h + 4), off = u64(s, h + 0x18), size = u64(s, h + 0x20) }
  end
  local strtab = hdr[shstrndx].off
  local out, order = {}, {}
  for i = 0, shnum - 1 do
    local n = s:match("^[^%z]*", strtab + hdr[i].name + 1)
    local debug = n:match("^%.debug") or n:match("^%.nv_debug") or n:match("^%.rela?%.debug")
      or n:match("^%.rela?%.nv_debug")
    if n ~= "" and not debug then
      -- SHT_NOBITS (8) holds no bytes in the file: its size is what counts
      local bytes = hdr[i].type == 8 and ("nobits " .. hdr[i].size) or s:sub(hdr[i].off + 1, hdr[i].off + hdr[i].size)
      if out[n] then n = n .. "#" .. i end
      out[n] = bytes
      order[#order + 1] = n
    end
  end
  return out, order
end

local a, b = arg[1], arg[2]
if not a or not b then
  io.stderr:write("usage: cubin_cmp.lua A B\n")
  os.exit(2)
end
local sa, oa = sections(a)
local sb, ob = sections(b)
local bad = 0
for _, n in ipairs(oa) do
  if sb[n] == nil then
    print("only in " .. a .. ": " .. n); bad = bad + 1
  elseif sb[n] ~= sa[n] then
    print(string.format("differs: %s (%d / %d bytes)", n, #sa[n], #sb[n])); bad = bad + 1
  end
end
for _, n in ipairs(ob) do
  if sa[n] == nil then print("only in " .. b .. ": " .. n); bad = bad + 1 end
end
os.exit(bad == 0 and 0 or 1)
