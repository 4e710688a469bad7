/*
 * cuda_loader.c -- opens the CUDA driver (libcuda.so.1) and NVRTC with dlopen
 * at run time and resolves the entry points the backend uses. Nothing here
 * (or anywhere in libpagedattn) links against CUDA, so the library loads on
 * machines without a GPU, a driver or a toolkit; pa_cuda_usable says why
 * CUDA cannot be used there.
 *
 * Driver symbols come from cuGetProcAddress with CUDA 12 semantics, which
 * returns the right ABI version of each (cuMemAlloc -> cuMemAlloc_v2, ...);
 * plain dlsym of the versioned name is the fallback for old drivers.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

pa_cuda_driver pa_cu;
pa_nvrtc pa_rtc;

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static bool driver_ok;
static char driver_why[512];

static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static bool nvrtc_ok;
static char nvrtc_why[1024];
static int nvrtc_ver;

typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int cuda_version, uint64_t flags,
                                int *status);

#define SYM(name, versioned) {#name, versioned, (void **)&pa_cu.name, true}
#define OPT(name, versioned) {#name, versioned, (void **)&pa_cu.name, false}

static void load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(driver_why, sizeof driver_why, "cannot open libcuda.so.1, the NVIDIA driver (%s)",
                 e ? e : "not found");
        return;
    }
    get_proc_fn get_proc = (get_proc_fn)dlsym(h, "cuGetProcAddress_v2");
    const struct {
        const char *name, *versioned;
        void **slot;
        bool required;
    } syms[] = {
        SYM(cuInit, "cuInit"),
        SYM(cuDriverGetVersion, "cuDriverGetVersion"),
        SYM(cuGetErrorName, "cuGetErrorName"),
        SYM(cuGetErrorString, "cuGetErrorString"),
        SYM(cuDeviceGetCount, "cuDeviceGetCount"),
        SYM(cuDeviceGet, "cuDeviceGet"),
        SYM(cuDeviceGetName, "cuDeviceGetName"),
        SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
        SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
        SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        SYM(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
        SYM(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
        SYM(cuStreamCreate, "cuStreamCreate"),
        SYM(cuStreamDestroy, "cuStreamDestroy_v2"),
        SYM(cuStreamSynchronize, "cuStreamSynchronize"),
        OPT(cuStreamWaitValue32, "cuStreamWaitValue32_v2"),
        SYM(cuStreamWaitEvent, "cuStreamWaitEvent"),
        SYM(cuEventCreate, "cuEventCreate"),
        SYM(cuEventDestroy, "cuEventDestroy_v2"),
        SYM(cuEventRecord, "cuEventRecord"),
        SYM(cuEventSynchronize, "cuEventSynchronize"),
        SYM(cuEventElapsedTime, "cuEventElapsedTime"),
        SYM(cuMemGetInfo, "cuMemGetInfo_v2"),
        SYM(cuMemAlloc, "cuMemAlloc_v2"),
        SYM(cuMemFree, "cuMemFree_v2"),
        SYM(cuMemHostAlloc, "cuMemHostAlloc"),
        SYM(cuMemFreeHost, "cuMemFreeHost"),
        SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
        SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
        SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
        SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
        SYM(cuMemsetD8Async, "cuMemsetD8Async"),
        SYM(cuMemsetD16Async, "cuMemsetD16Async"),
        SYM(cuMemsetD32Async, "cuMemsetD32Async"),
        SYM(cuModuleLoadData, "cuModuleLoadData"),
        SYM(cuModuleUnload, "cuModuleUnload"),
        SYM(cuModuleGetFunction, "cuModuleGetFunction"),
        SYM(cuModuleGetGlobal, "cuModuleGetGlobal_v2"),
        SYM(cuFuncGetAttribute, "cuFuncGetAttribute"),
        SYM(cuFuncSetAttribute, "cuFuncSetAttribute"),
        SYM(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
        SYM(cuLaunchKernel, "cuLaunchKernel"),
        OPT(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled"),
        OPT(cuLaunchKernelEx, "cuLaunchKernelEx"),
        OPT(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"),
        OPT(cuStreamCreateWithPriority, "cuStreamCreateWithPriority"),
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *fn = NULL;
        int found = 0;
        if (get_proc && get_proc(syms[i].name, &fn, 12000, 0, &found) != CUDA_SUCCESS) fn = NULL;
        if (!fn) fn = dlsym(h, syms[i].versioned);
        if (!fn && syms[i].required) {
            snprintf(driver_why, sizeof driver_why,
                     "the NVIDIA driver (libcuda.so.1) lacks %s: too old for this library",
                     syms[i].name);
            memset(&pa_cu, 0, sizeof pa_cu);
            return; /* the handle stays open: harmless, and dlclose of libcuda is unwise */
        }
        *syms[i].slot = fn;
    }
    CUresult r = pa_cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *name = "?";
        pa_cu.cuGetErrorName(r, &name);
        snprintf(driver_why, sizeof driver_why, "cuInit failed: %s%s", name,
                 r == CUDA_ERROR_NO_DEVICE ? " (no CUDA device)" : "");
        return;
    }
    int count = 0;
    r = pa_cu.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count < 1) {
        snprintf(driver_why, sizeof driver_why, "the driver reports no CUDA device");
        return;
    }
    driver_ok = true;
}

bool pa_cuda_driver_ready(char *why, size_t why_len) {
    pthread_once(&driver_once, load_driver);
    if (!driver_ok && why && why_len) snprintf(why, why_len, "%s", driver_why);
    return driver_ok;
}

void *pa_dlopen_syms(const char *path, const pa_sym *syms, size_t n, char *err, size_t err_len) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, err_len, "%s", e ? e : "not found");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot && syms[i].required) {
            snprintf(err, err_len, "%s lacks %s", path, syms[i].name);
            for (size_t j = 0; j < n; j++) *syms[j].slot = NULL;
            dlclose(h);
            return NULL;
        }
    }
    return h;
}

/* ---- NVRTC ---- */

#define RTC(name) {#name, (void **)&pa_rtc.name, true}

static bool try_nvrtc(const char *path, char *err, size_t err_len) {
    const pa_sym syms[] = {
        RTC(nvrtcGetErrorString), RTC(nvrtcVersion), RTC(nvrtcGetNumSupportedArchs),
        RTC(nvrtcGetSupportedArchs), RTC(nvrtcCreateProgram), RTC(nvrtcDestroyProgram),
        RTC(nvrtcCompileProgram), RTC(nvrtcGetProgramLogSize), RTC(nvrtcGetProgramLog),
        RTC(nvrtcGetPTXSize), RTC(nvrtcGetPTX), RTC(nvrtcGetCUBINSize), RTC(nvrtcGetCUBIN),
    };
    void *h = pa_dlopen_syms(path, syms, sizeof syms / sizeof syms[0], err, err_len);
    if (!h) return false;
    int major = 0, minor = 0;
    if (pa_rtc.nvrtcVersion(&major, &minor) != 0 || major < 11) {
        snprintf(err, err_len, "%s is NVRTC %d.%d; 11.0 or newer is needed", path, major, minor);
        memset(&pa_rtc, 0, sizeof pa_rtc);
        dlclose(h);
        return false;
    }
    nvrtc_ver = major * 10 + minor;
    /* NVRTC opens libnvrtc-builtins by soname; when we found NVRTC by path,
     * the builtins beside it may not be on the search path: open them first
     * (by their soname they then resolve to this copy). */
    Dl_info info;
    if (dladdr((void *)pa_rtc.nvrtcVersion, &info) && info.dli_fname) {
        char dir[1024], builtins[1200];
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            snprintf(builtins, sizeof builtins, "%s/libnvrtc-builtins.so.%d.%d", dir, major, minor);
            dlopen(builtins, RTLD_NOW | RTLD_GLOBAL); /* failure is fine: then by soname */
        }
    }
    return true;
}

static bool search_toolkit(const char *stem, bool (*try_open)(const char *path, char *err, size_t err_len),
                           char *err, size_t err_len) {
    /* the soname first (the loader's path), then the toolkit's usual places */
    static const char *const places[] = {"%s.so.13", "%s.so.12", "%s.so",
                                         "/usr/local/cuda/lib64/%s.so.13", "/usr/local/cuda/lib64/%s.so.12",
                                         "/usr/local/cuda/lib64/%s.so", "/usr/local/cuda/lib/%s.so.13"};
    char path[700];
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
        snprintf(path, sizeof path, places[i], stem);
        if (try_open(path, err, err_len)) return true;
    }
    const char *home = getenv("CUDA_HOME");
    if (!home || !*home) home = getenv("CUDA_PATH");
    if (home && *home) {
        static const char *const subdirs[] = {"lib64", "lib"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/%s/%s.so", home, subdirs[i], stem);
            if (try_open(path, err, err_len)) return true;
        }
    }
    return false;
}

bool pa_cuda_open_toolkit_lib(const char *env, const char *stem, const char *what,
                              bool (*try_open)(const char *path, char *err, size_t err_len), char *why,
                              size_t why_len) {
    const char *path = getenv(env);
    char err[400] = "";
    if (path && *path) {
        if (try_open(path, err, sizeof err)) return true;
        snprintf(why, why_len, "%s: $%s=%.200s: %s", what, env, path, err);
        return false;
    }
    if (search_toolkit(stem, try_open, err, sizeof err)) return true;
    snprintf(why, why_len, "%s (%s.so.13) not found: install the CUDA toolkit's %s, or set %s to its path (last error: %s)",
             what, stem, what, env, err);
    return false;
}

static void load_nvrtc(void) {
    nvrtc_ok = pa_cuda_open_toolkit_lib("PAGEDATTN_NVRTC", "libnvrtc", "NVRTC", try_nvrtc, nvrtc_why, sizeof nvrtc_why);
}

bool pa_nvrtc_ready(char *why, size_t why_len) {
    pthread_once(&nvrtc_once, load_nvrtc);
    if (!nvrtc_ok && why && why_len) snprintf(why, why_len, "%s", nvrtc_why);
    return nvrtc_ok;
}

int pa_nvrtc_version(void) { return nvrtc_ok ? nvrtc_ver : 0; }

bool pa_cuda_usable(char *why, size_t why_len) {
    if (!pa_cuda_driver_ready(why, why_len)) return false;
    return pa_nvrtc_ready(why, why_len);
}

pa_status pa_cu_fail(pa_context *ctx, CUresult r, const char *call, const char *file, int line) {
    const char *name = NULL, *desc = NULL;
    if (pa_cu.cuGetErrorName) pa_cu.cuGetErrorName(r, &name);
    if (pa_cu.cuGetErrorString) pa_cu.cuGetErrorString(r, &desc);
    const char *base = strstr(file, "src/"); /* the path from the source root */
    return pa_fail(ctx, r == CUDA_ERROR_OUT_OF_MEMORY ? PA_ERR_OUT_OF_MEMORY : PA_ERR_DEVICE,
                   "%s failed: %s (%s) [%s:%d]", call, name ? name : "CUDA error",
                   desc ? desc : "no description", base ? base : file, line);
}
