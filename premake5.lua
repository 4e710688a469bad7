-- premake5.lua -- the build of libpagedattn.
-- Works with Debian's premake4 (`premake4 --file=premake5.lua gmake`) and with
-- premake5 (`premake5 gmake2`); it keeps to the API both understand.
--   release: build/lib/libpagedattn.so        (make -C build config=release)
--   debug:   build/debug/lib/libpagedattn.so  (AddressSanitizer + UBSan)
-- Kernels in kernels/ are not compiled here: NVRTC compiles them at run time.

local function when(cfg)
  if filter then filter("configurations:" .. cfg) else configuration(cfg) end
end
-- keep symbols (premake4 strips release builds otherwise): profilers need them
local function keep_symbols()
  if symbols then symbols "On" else flags { "Symbols" } end
end
local function always()
  if filter then filter({}) else configuration({}) end
end

solution "pagedattn"
  configurations { "release", "debug" }
  location "build"
  language "C"

project "pagedattn"
  kind "SharedLib"
  location "build"
  files { "src/*.h", "src/*.c", "src/core/*.c", "src/core/*.h", "src/cpu/*.c", "src/cpu/*.h",
          "src/cpu/*.inc", "src/cuda/*.c", "src/cuda/*.h" }
  includedirs { "src" }
  buildoptions { "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                 "-fno-strict-aliasing", "-pthread", "-fvisibility=default" }
  -- src/cuda/kernel_sources.c embeds kernels/ with the assembler's .incbin,
  -- which looks for the files on this include path
  buildoptions { "-Wa,-I" .. path.getdirectory(_SCRIPT) .. "/kernels" }
  -- never unmapped: LuaJIT closes the library (dlclose) while the CPU
  -- backend's worker threads may still sit in its code, which crashed a
  -- busted run at exit
  linkoptions { "-pthread", "-Wl,-z,nodelete" }
  links { "m", "dl", "pthread" }
  keep_symbols()

  when "release"
    targetdir "build/lib"
    objdir "build/obj/release"
    buildoptions { "-O3", "-g" }
    defines { "NDEBUG" }

  when "debug"
    targetdir "build/debug/lib"
    objdir "build/obj/debug"
    buildoptions { "-O1", "-g", "-fno-omit-frame-pointer",
                   "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined" }
    linkoptions { "-fsanitize=address,undefined" }
  always()
