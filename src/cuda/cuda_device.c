/*
 * cuda_device.c -- the CUDA device: its opening (the primary context, one
 * stream, the tuning read once), device memory, host/device copies, fills,
 * synchronisation, the tuning's get and set, the backend table and the
 * registry's entry with the backend's extras. Attention: cuda_attention.c;
 * the staging ring and scratch: cuda_staging.c; ceilings and timing:
 * cuda_measure.c; kernels: cuda_variants.c, cuda_compile.c, cuda_modules.c.
 *
 * All work of a device goes to its one stream, in order; downloads and
 * synchronize wait for it. Uploads of up to PA_STAGED_UPLOAD_MAX bytes are
 * copied into pinned staging and queued without waiting (the caller's buffer
 * is free again on return; the stream orders the copy before later work);
 * bigger ones wait. The device lock guards what calls share (the module
 * cache, scratch, staging, timing state).
 */
#define _GNU_SOURCE
#include "cuda_internal.h"
#include "cuda_launch.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- memory ---- */

static pa_status cuda_alloc(pa_context *ctx, pa_device *dev, size_t bytes, void **out) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUdeviceptr p = 0;
    CUresult r = pa_cu.cuMemAlloc(&p, bytes);
    if (r == CUDA_SUCCESS) {
        /* zero-filled, in stream order: later work on the stream sees zeros */
        r = pa_cu.cuMemsetD8Async(p, 0, bytes, impl->stream);
        if (r != CUDA_SUCCESS) {
            pa_cu.cuMemFree(p);
            st = pa_cu_fail(ctx, r, "cuMemsetD8Async(new tensor)", __FILE__, __LINE__);
        }
    } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        size_t free_b = 0, total_b = 0;
        pa_cu.cuMemGetInfo(&free_b, &total_b);
        st = pa_fail(ctx, PA_ERR_OUT_OF_MEMORY,
                     "tensor: cannot allocate %zu bytes on %s (%zu of %zu bytes free)", bytes,
                     dev->name, free_b, total_b);
    } else {
        st = pa_cu_fail(ctx, r, "cuMemAlloc(tensor)", __FILE__, __LINE__);
    }
    pa_cuda_leave(impl);
    if (st == PA_OK) *out = (void *)(uintptr_t)p;
    return st;
}

static void cuda_free(pa_device *dev, void *ptr) {
    cuda_impl *impl = pa_cuda_impl(dev);
    if (pa_cu.cuCtxPushCurrent(impl->cuctx) != CUDA_SUCCESS) return;
    pa_cu.cuStreamSynchronize(impl->stream); /* queued work may still use it */
    pa_cu.cuMemFree((CUdeviceptr)(uintptr_t)ptr);
    pa_cuda_leave(impl);
}

/* Uploads up to this size go through the pinned staging ring (no wait). */
#define PA_STAGED_UPLOAD_MAX ((size_t)1 << 20)

static pa_status cuda_upload(pa_context *ctx, pa_device *dev, void *dst, const void *src, size_t n) {
    cuda_impl *impl = pa_cuda_impl(dev);
    if (n <= PA_STAGED_UPLOAD_MAX) {
        pthread_mutex_lock(&impl->lock);
        pa_status st = pa_cuda_enter(ctx, impl);
        if (st == PA_OK) {
            void *host = NULL;
            int slot = 0;
            st = pa_cuda_staging(ctx, impl, n, &host, &slot);
            if (st == PA_OK) {
                memcpy(host, src, n); /* src is the caller's again on return */
                st = pa_cuda_staging_upload(ctx, impl, slot, (CUdeviceptr)(uintptr_t)dst, n,
                                            "cuMemcpyHtoDAsync(tensor write)");
            }
            pa_cuda_leave(impl);
        }
        pthread_mutex_unlock(&impl->lock);
        return st;
    }
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUresult r = pa_cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, n, impl->stream);
    if (r == CUDA_SUCCESS) r = pa_cu.cuStreamSynchronize(impl->stream); /* src is the caller's again */
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuMemcpyHtoDAsync(tensor write)", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    return st;
}

static pa_status cuda_download(pa_context *ctx, pa_device *dev, void *dst, const void *src, size_t n) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUresult r = pa_cu.cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, n, impl->stream);
    if (r == CUDA_SUCCESS) r = pa_cu.cuStreamSynchronize(impl->stream);
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuMemcpyDtoHAsync(tensor read)", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    return st;
}

static pa_status cuda_copy(pa_context *ctx, pa_device *dev, void *dst, const void *src, size_t n) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUresult r = pa_cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n,
                                         impl->stream);
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuMemcpyDtoDAsync(tensor copy)", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    return st;
}

/* A fill is a memset of the value's bit pattern, rounded once (pa_store_f64). */
static pa_status cuda_fill(pa_context *ctx, pa_tensor *t, double value) {
    cuda_impl *impl = pa_cuda_impl(t->dev);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)t->data;
    CUresult r;
    uint32_t bits = 0; /* 1-, 2- or 4-byte pattern in its low bytes (little-endian) */
    pa_store_f64(&bits, t->dtype, 0, value);
    if (pa_dtype_size(t->dtype) == 4) r = pa_cu.cuMemsetD32Async(p, bits, (size_t)t->numel, impl->stream);
    else if (pa_dtype_size(t->dtype) == 2) r = pa_cu.cuMemsetD16Async(p, (uint16_t)bits, (size_t)t->numel, impl->stream);
    else r = pa_cu.cuMemsetD8Async(p, (unsigned char)bits, (size_t)t->numel, impl->stream); /* fp8 */
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuMemsetAsync(fill)", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    return st;
}

static pa_status launch_randn(pa_context *ctx, cuda_impl *impl, pa_tensor *t, uint64_t seed) {
    pa_kmodule *m;
    pa_status st = pa_cuda_module(ctx, impl, "util", &m);
    if (st) return st;
    const char *entry = t->dtype == PA_F32 ? "pa_randn_f32" : t->dtype == PA_F16 ? "pa_randn_f16"
                      : t->dtype == PA_BF16 ? "pa_randn_bf16" : t->dtype == PA_FP8_E4M3 ? "pa_randn_fp8_e4m3"
                                                                                    : "pa_randn_fp8_e5m2";
    CUfunction fn;
    st = pa_cuda_function(ctx, impl, m, entry, 0, &fn);
    if (st) return st;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)t->data;
    long long n = t->numel;
    unsigned long long s = seed;
    const int64_t blocks4 = (n + 3) / 4; /* one thread per Philox block */
    int64_t grid = (blocks4 + 255) / 256;
    if (grid > (int64_t)impl->sm_count * 64) grid = (int64_t)impl->sm_count * 64;
    void *args[] = {&p, &n, &s};
    CU_TRY(ctx, pa_cu.cuLaunchKernel(fn, (unsigned)grid, 1, 1, 256, 1, 1, 0, impl->stream, args, NULL));
    return PA_OK;
}

static pa_status cuda_fill_randn(pa_context *ctx, pa_tensor *t, uint64_t seed) {
    cuda_impl *impl = pa_cuda_impl(t->dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        st = launch_randn(ctx, impl, t, seed);
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}

static pa_status cuda_synchronize(pa_context *ctx, pa_device *dev) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUresult r = pa_cuda_lanes_sync(impl);
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuStreamSynchronize", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    return st;
}

/* ---- the device ---- */

static void cuda_destroy(pa_device *dev) {
    cuda_impl *impl = pa_cuda_impl(dev);
    if (impl) {
        if (pa_cu.cuCtxPushCurrent(impl->cuctx) == CUDA_SUCCESS) {
            if (impl->stream) pa_cu.cuStreamSynchronize(impl->stream);
            pa_cuda_modules_free(impl);
            if (impl->copy_stream) pa_cu.cuStreamSynchronize(impl->copy_stream);
            pa_cuda_staging_free(impl);
            if (impl->t_start) pa_cu.cuEventDestroy(impl->t_start);
            if (impl->t_end) pa_cu.cuEventDestroy(impl->t_end);
            if (impl->stream) pa_cu.cuStreamDestroy(impl->stream);
            if (impl->copy_stream) pa_cu.cuStreamDestroy(impl->copy_stream);
            pa_cuda_leave(impl);
        }
        if (impl->cuctx) pa_cu.cuDevicePrimaryCtxRelease(impl->cudev);
        pthread_mutex_destroy(&impl->lock);
        free(impl);
    }
    free(dev);
}

/* ---- tuning and the last plan ---- */

static pa_status cuda_get_tuning(pa_context *ctx, pa_device *dev, pa_cuda_tuning *out, int defaults) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pthread_mutex_lock(&impl->lock);
    *out = defaults ? impl->tuning_open : impl->tuning;
    pthread_mutex_unlock(&impl->lock);
    (void)ctx;
    return PA_OK;
}

static pa_status cuda_set_tuning(pa_context *ctx, pa_device *dev, const pa_cuda_tuning *t) {
    pa_status st = pa_cuda_tuning_check(ctx, t);
    if (st) return st;
    cuda_impl *impl = pa_cuda_impl(dev);
    pthread_mutex_lock(&impl->lock);
    impl->tuning = *t;
    pthread_mutex_unlock(&impl->lock);
    return PA_OK;
}

static pa_status cuda_last_plan(pa_context *ctx, pa_device *dev, char *out, size_t len) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_describe(ctx, impl->last, impl->nlast, out, len);
    pthread_mutex_unlock(&impl->lock);
    return st;
}

/* The tuning a device opens with: the defaults, and the deployment's
 * kernel directory and NVRTC options. */
static pa_status open_tuning(pa_context *ctx, cuda_impl *impl) {
    pa_cuda_tuning *t = &impl->tuning_open;
    pa_cuda_tuning_set_defaults(t);
    const char *dir = getenv("PAGEDATTN_KERNEL_DIR"), *opts = getenv("PAGEDATTN_NVRTC_OPTIONS");
    if (dir && strlen(dir) >= sizeof t->kernel_dir)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_KERNEL_DIR: longer than %d characters",
                       (int)sizeof t->kernel_dir - 1);
    if (opts && strlen(opts) >= sizeof t->nvrtc_options)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_NVRTC_OPTIONS: longer than %d characters",
                       (int)sizeof t->nvrtc_options - 1);
    if (opts && pa_nvrtc_option_words(opts) < 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "PAGEDATTN_NVRTC_OPTIONS: more than %d options", PA_NVRTC_EXTRA);
    snprintf(t->kernel_dir, sizeof t->kernel_dir, "%s", dir ? dir : "");
    snprintf(t->nvrtc_options, sizeof t->nvrtc_options, "%s", opts ? opts : "");
    impl->tuning = *t;
    return PA_OK;
}

static const pa_backend_ops cuda_ops = {
    "cuda",
    cuda_alloc,
    cuda_free,
    cuda_upload,
    cuda_download,
    cuda_copy,
    cuda_fill,
    cuda_fill_randn,
    pa_cuda_attention,
    cuda_synchronize,
    pa_cuda_measure_ceilings,
    cuda_destroy,
    pa_cuda_timing,
    pa_cuda_timing_last,
    cuda_get_tuning,
    cuda_set_tuning,
    cuda_last_plan,
    pa_cuda_merge,
    pa_cuda_gather_rows,
    pa_cuda_lane_fork,
    pa_cuda_lane_join,
};

/* Lane 1's stream (the cascade's shared level) at the greatest priority:
 * when its kernel and lane 0's become ready together, the block scheduler
 * gives the shared level's few blocks their SMs first and lane 0's
 * persistent decode blocks fill the rest (at one priority two streams
 * gained little, as if the decode had taken every SM first: docs/cascade.md). */
static CUresult lane_stream(CUstream *out) {
    int least = 0, greatest = 0;
    if (pa_cu.cuCtxGetStreamPriorityRange && pa_cu.cuStreamCreateWithPriority &&
        pa_cu.cuCtxGetStreamPriorityRange(&least, &greatest) == CUDA_SUCCESS)
        return pa_cu.cuStreamCreateWithPriority(out, CU_STREAM_NON_BLOCKING, greatest);
    return pa_cu.cuStreamCreate(out, CU_STREAM_NON_BLOCKING);
}

static pa_status device_setup(pa_context *ctx, cuda_impl *impl, int index, pa_device *dev) {
    CU_TRY(ctx, pa_cu.cuDeviceGet(&impl->cudev, index));
    char name[128] = "CUDA device";
    CU_TRY(ctx, pa_cu.cuDeviceGetName(name, sizeof name, impl->cudev));
    CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&impl->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, impl->cudev));
    CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&impl->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, impl->cudev));
    CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&impl->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, impl->cudev));
    CU_TRY(ctx, pa_cu.cuDeviceGetAttribute(&impl->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, impl->cudev));
    size_t total = 0;
    CU_TRY(ctx, pa_cu.cuDeviceTotalMem(&total, impl->cudev));
    pa_status st = open_tuning(ctx, impl);
    if (st) return st;
    if (impl->cc_major < 8)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED,
                       "device: cuda:%d (%s) has compute capability %d.%d; pagedattn needs 8.0 or newer",
                       index, name, impl->cc_major, impl->cc_minor);
    int image_kind = 0;
    pa_cuda_pick_arch(impl->cc_major, impl->cc_minor, impl->arch, sizeof impl->arch, &image_kind);
    CU_TRY(ctx, pa_cu.cuDevicePrimaryCtxRetain(&impl->cuctx, impl->cudev));
    st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUresult r = pa_cu.cuStreamCreate(&impl->stream, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS) r = pa_cu.cuStreamCreate(&impl->copy_stream, CU_STREAM_NON_BLOCKING);
    impl->lanes[0].stream = impl->stream;
    if (r == CUDA_SUCCESS) r = lane_stream(&impl->lanes[1].stream);
    for (int i = 0; i < PA_LANES && r == CUDA_SUCCESS; i++)
        r = pa_cu.cuEventCreate(&impl->lanes[i].mark, CU_EVENT_DISABLE_TIMING);
    for (int i = 0; i < PA_STAGING_SLOTS && r == CUDA_SUCCESS; i++) {
        r = pa_cu.cuEventCreate(&impl->staging[i].done, CU_EVENT_DISABLE_TIMING);
        if (r == CUDA_SUCCESS) r = pa_cu.cuEventCreate(&impl->staging[i].used, CU_EVENT_DISABLE_TIMING);
    }
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuStreamCreate/cuEventCreate", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    if (st) return st;
    snprintf(dev->name, sizeof dev->name, "cuda:%d", index);
    snprintf(dev->description, sizeof dev->description, "%s (compute %d.%d, %d SMs, %.1f GiB)", name,
             impl->cc_major, impl->cc_minor, impl->sm_count, (double)total / (1024.0 * 1024 * 1024));
    return PA_OK;
}

static pa_status cuda_device_create(pa_context *ctx, int index, pa_device **out) {
    *out = NULL;
    char why[1024];
    if (!pa_cuda_usable(why, sizeof why))
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "device: cuda is not available: %s", why);
    int count = 0;
    CU_TRY(ctx, pa_cu.cuDeviceGetCount(&count));
    if (index >= count)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "device: cuda:%d does not exist (%d CUDA device%s)",
                       index, count, count == 1 ? "" : "s");
    pa_device *dev = calloc(1, sizeof *dev);
    cuda_impl *impl = calloc(1, sizeof *impl);
    if (!dev || !impl) {
        free(dev);
        free(impl);
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "device: out of host memory");
    }
    pthread_mutex_init(&impl->lock, NULL);
    dev->kind = PA_DEVICE_CUDA;
    dev->index = index;
    dev->host_accessible = false;
    dev->num_threads = 0;
    dev->ops = &cuda_ops;
    dev->impl = impl;
    impl->setup_ns = &dev->setup_ns;
    pa_status st = device_setup(ctx, impl, index, dev);
    if (st) {
        cuda_destroy(dev);
        return st;
    }
    *out = dev;
    return PA_OK;
}

/* ---- the registry's entry (src/backends.c) ---- */

static int cuda_parse(const char *rest) {
    if (rest[0] == '\0') return 0;
    if (rest[0] != ':' || rest[1] < '0' || rest[1] > '9') return -1;
    char *end = NULL;
    long v = strtol(rest + 1, &end, 10);
    return *end == '\0' && v >= 0 && v < 1024 ? (int)v : -1;
}

/* pa_kernel_variants_for: the planner's choices for a shape, one a line. */
typedef struct variant_list {
    char *out;
    size_t len, at;
    int count;
    bool full;
} variant_list;

static void list_variant(void *user, const char *name) {
    variant_list *l = user;
    const size_t n = strlen(name);
    if (l->at + n + 2 > l->len) {
        l->full = true;
        return;
    }
    memcpy(l->out + l->at, name, n);
    l->out[l->at + n] = '\n';
    l->at += n + 1;
    l->out[l->at] = '\0';
    l->count++;
}

static pa_status cuda_variants_for(pa_context *ctx, const pa_kernel_shape *shape, const pa_cuda_tuning *tuning,
                                   const char *arch, char *out, size_t out_len, int *count) {
    if (!out || out_len == 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: NULL or empty");
    out[0] = '\0';
    if (count) *count = 0;
    pa_cuda_tuning t;
    if (tuning) {
        pa_status st = pa_cuda_tuning_check(ctx, tuning);
        if (st) return st;
        t = *tuning;
    } else {
        pa_cuda_tuning_set_defaults(&t);
    }
    char dev_arch[32];
    if (!arch || !*arch) {
        int kind = 0;
        pa_status st = pa_cuda_device0_arch(ctx, "kernel variants", dev_arch, sizeof dev_arch, &kind);
        if (st) return st;
        arch = dev_arch;
    }
    /* (any other chip: the kernels it runs are those of sm_80, and the TMA
     * and programmatic launches are the driver's, present since CUDA 12) */
    const bool sm90a = strcmp(arch, "sm_90a") == 0;
    const pa_cuda_caps caps = {1, sm90a ? 9 : 8, 1 << 30, sm90a, true, true};
    variant_list l = {out, out_len, 0, 0, false};
    pa_status st = pa_cuda_plan_variants(ctx, shape, &t, &caps, list_variant, &l);
    if (st == PA_OK && l.full)
        st = pa_fail(ctx, PA_ERR_ARGUMENT, "kernel variants: %zu bytes of out are too few", out_len);
    if (count) *count = l.count;
    return st;
}

/* The backend's extras (pagedattn_lab.h's kernel catalog and compiler, the
 * tuning's fields, the planner's variants for a shape). */
static void *cuda_proc(const char *name) {
    if (strcmp(name, "kernel_catalog_size") == 0) return (void *)pa_cuda_kernel_catalog_size;
    if (strcmp(name, "kernel_catalog_name") == 0) return (void *)pa_cuda_kernel_catalog_name;
    if (strcmp(name, "kernel_compile") == 0) return (void *)pa_cuda_kernel_compile;
    if (strcmp(name, "kernel_variants_for") == 0) return (void *)cuda_variants_for;
    if (strcmp(name, "tuning_field_count") == 0) return (void *)pa_cuda_tuning_field_count_impl;
    if (strcmp(name, "tuning_field") == 0) return (void *)pa_cuda_tuning_field_impl;
    if (strcmp(name, "tuning_defaults") == 0) return (void *)pa_cuda_tuning_set_defaults;
    return NULL;
}

const pa_backend_reg pa_cuda_backend = {
    "cuda", "\"cuda\", \"cuda:N\"", 64, cuda_parse, pa_cuda_usable, cuda_device_create, cuda_proc,
};

