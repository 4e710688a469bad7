/*
 * cuda_backend.c -- the CUDA device: the primary context and one stream per
 * device, device memory, host/device copies, fills, synchronisation, the
 * measured ceilings (the matmul one in cuda_blas.c), and device-side timing.
 * Attention lives in cuda_attention.c, the kernels' compilation in
 * cuda_kernels.c.
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

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ---- context, scratch, staging ---- */

pa_status pa_cuda_enter(pa_context *ctx, cuda_impl *impl) {
    CU_TRY(ctx, pa_cu.cuCtxPushCurrent(impl->cuctx));
    return PA_OK;
}

void pa_cuda_leave(cuda_impl *impl) {
    (void)impl;
    CUcontext popped;
    pa_cu.cuCtxPopCurrent(&popped);
}

static size_t grow(size_t have, size_t need, size_t floor_bytes) {
    size_t n = have + have / 2;
    if (n < need) n = need;
    if (n < floor_bytes) n = floor_bytes;
    return (n + 4095) & ~(size_t)4095;
}

/* A device buffer that kernels on the stream read, grown to `need` bytes (at
 * least `floor`): once the stream has drained, since queued kernels may
 * still read the old one. */
static pa_status regrow(pa_context *ctx, cuda_impl *impl, CUdeviceptr *buf, size_t *have, size_t need,
                        size_t floor_bytes, const char *what) {
    CU_TRY(ctx, pa_cu.cuStreamSynchronize(impl->stream));
    if (*buf) pa_cu.cuMemFree(*buf);
    *buf = 0;
    *have = 0;
    const size_t n = grow(0, need, floor_bytes);
    CUresult r = pa_cu.cuMemAlloc(buf, n);
    if (r != CUDA_SUCCESS) {
        *buf = 0;
        return pa_fail(ctx, r == CUDA_ERROR_OUT_OF_MEMORY ? PA_ERR_OUT_OF_MEMORY : PA_ERR_DEVICE,
                       "attention: cannot allocate %zu bytes of device memory for %s", n, what);
    }
    *have = n;
    return PA_OK;
}

pa_status pa_cuda_scratch(pa_context *ctx, cuda_impl *impl, size_t bytes, CUdeviceptr *out) {
    if (bytes > impl->scratch_bytes) {
        pa_status st = regrow(ctx, impl, &impl->scratch, &impl->scratch_bytes, bytes, (size_t)1 << 20, "scratch");
        if (st) return st;
    }
    *out = impl->scratch;
    return PA_OK;
}

pa_status pa_cuda_counters(pa_context *ctx, cuda_impl *impl, size_t n, CUdeviceptr *out) {
    if (n * 4 > impl->counters_bytes) {
        pa_status st = regrow(ctx, impl, &impl->counters, &impl->counters_bytes, n * 4, 4096 * 4, "counters");
        if (st) return st;
        CUresult r = pa_cu.cuMemsetD32Async(impl->counters, 0, impl->counters_bytes / 4, impl->stream);
        if (r != CUDA_SUCCESS) {
            pa_cu.cuMemFree(impl->counters);
            impl->counters = 0;
            impl->counters_bytes = 0;
            return pa_cu_fail(ctx, r, "cuMemsetD32Async(counters)", __FILE__, __LINE__);
        }
    }
    *out = impl->counters;
    return PA_OK;
}

pa_status pa_cuda_staging(pa_context *ctx, cuda_impl *impl, size_t bytes, void **out, int *slot) {
    const int i = impl->staging_next;
    cuda_staging *s = &impl->staging[i];
    if (s->pending) { /* the last upload from it must have left */
        CU_TRY(ctx, pa_cu.cuEventSynchronize(s->done));
        s->pending = false;
    }
    if (bytes > s->bytes) {
        if (s->host) pa_cu.cuMemFreeHost(s->host);
        s->host = NULL;
        s->bytes = 0;
        size_t n = grow(0, bytes, (size_t)64 << 10);
        CU_TRY(ctx, pa_cu.cuMemHostAlloc(&s->host, n, CU_MEMHOSTALLOC_PORTABLE));
        s->bytes = n;
    }
    *out = s->host;
    *slot = i;
    return PA_OK;
}

/* Slot `slot`'s upload is queued on `stream`: mark when it has left, and move
 * the ring on. */
static pa_status staging_queued(pa_context *ctx, cuda_impl *impl, int slot, CUstream stream) {
    cuda_staging *s = &impl->staging[slot];
    CUresult r = pa_cu.cuEventRecord(s->done, stream);
    if (r != CUDA_SUCCESS) {
        /* the copy is queued but cannot be tracked: let it finish */
        pa_cu.cuStreamSynchronize(stream);
        return pa_cu_fail(ctx, r, "cuEventRecord(staging)", __FILE__, __LINE__);
    }
    s->pending = true;
    impl->staging_next = (slot + 1) % PA_STAGING_SLOTS;
    return PA_OK;
}

pa_status pa_cuda_staging_upload(pa_context *ctx, cuda_impl *impl, int slot, CUdeviceptr dst,
                                 size_t bytes, const char *what) {
    CUresult r = pa_cu.cuMemcpyHtoDAsync(dst, impl->staging[slot].host, bytes, impl->stream);
    if (r != CUDA_SUCCESS) return pa_cu_fail(ctx, r, what, __FILE__, __LINE__);
    return staging_queued(ctx, impl, slot, impl->stream);
}

pa_status pa_cuda_plan_upload(pa_context *ctx, cuda_impl *impl, int slot, size_t bytes, CUdeviceptr *dev) {
    cuda_staging *s = &impl->staging[slot];
    *dev = 0;
    if (bytes > s->dev_bytes) {
        s->used_recorded = false; /* (the stream drains first) */
        pa_status st = regrow(ctx, impl, &s->dev, &s->dev_bytes, bytes, (size_t)64 << 10, "the plan");
        if (st) return st;
    }
    CUresult r = CUDA_SUCCESS;
    if (s->used_recorded) r = pa_cu.cuStreamWaitEvent(impl->copy_stream, s->used, 0);
    if (r == CUDA_SUCCESS) r = pa_cu.cuMemcpyHtoDAsync(s->dev, s->host, bytes, impl->copy_stream);
    if (r != CUDA_SUCCESS) return pa_cu_fail(ctx, r, "cuMemcpyHtoDAsync(attention plan)", __FILE__, __LINE__);
    pa_status st = staging_queued(ctx, impl, slot, impl->copy_stream);
    if (st) return st;
    r = pa_cu.cuStreamWaitEvent(impl->stream, s->done, 0);
    if (r != CUDA_SUCCESS) {
        /* the kernels cannot be ordered after the copy: let it finish */
        pa_cu.cuStreamSynchronize(impl->copy_stream);
        return pa_cu_fail(ctx, r, "cuStreamWaitEvent(attention plan)", __FILE__, __LINE__);
    }
    *dev = s->dev;
    return PA_OK;
}

pa_status pa_cuda_plan_release(pa_context *ctx, cuda_impl *impl, int slot) {
    cuda_staging *s = &impl->staging[slot];
    CUresult r = pa_cu.cuEventRecord(s->used, impl->stream);
    if (r != CUDA_SUCCESS) {
        /* the next upload to this slot cannot wait for the kernels: wait here */
        s->used_recorded = false;
        pa_cu.cuStreamSynchronize(impl->stream);
        return pa_cu_fail(ctx, r, "cuEventRecord(attention plan used)", __FILE__, __LINE__);
    }
    s->used_recorded = true;
    return PA_OK;
}

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
    const size_t es = pa_dtype_size(t->dtype);
    if (es == 4) r = pa_cu.cuMemsetD32Async(p, bits, (size_t)t->numel, impl->stream);
    else if (es == 2) r = pa_cu.cuMemsetD16Async(p, (uint16_t)bits, (size_t)t->numel, impl->stream);
    else r = pa_cu.cuMemsetD8Async(p, (unsigned char)bits, (size_t)t->numel, impl->stream);
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
    CUresult r = pa_cu.cuStreamSynchronize(impl->stream);
    if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuStreamSynchronize", __FILE__, __LINE__);
    pa_cuda_leave(impl);
    return st;
}

static pa_status cuda_attention(pa_context *ctx, const pa_attn_problem *p) {
    return pa_cuda_attention(ctx, p);
}

/* ---- ceilings ---- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct ceiling_run {
    cuda_impl *impl;
    CUevent e0, e1;
    CUfunction read_fn;
    unsigned grid;
    CUdeviceptr buf, sink;
    size_t bytes;
} ceiling_run;

/* Times one pass (0: streaming read of the buffer; 1: copy of one half to
 * the other) with device events; returns bytes moved per second. */
static pa_status time_pass(pa_context *ctx, ceiling_run *c, int mode, double *rate) {
    cuda_impl *impl = c->impl;
    CU_TRY(ctx, pa_cu.cuEventRecord(c->e0, impl->stream));
    double moved;
    if (mode == 0) {
        long long n16 = (long long)(c->bytes / 16);
        void *args[] = {&c->buf, &n16, &c->sink};
        CU_TRY(ctx, pa_cu.cuLaunchKernel(c->read_fn, c->grid, 1, 1, 512, 1, 1, 0, impl->stream, args, NULL));
        moved = (double)n16 * 16;
    } else {
        size_t half = c->bytes / 2;
        CU_TRY(ctx, pa_cu.cuMemcpyDtoDAsync(c->buf + half, c->buf, half, impl->stream));
        moved = 2.0 * (double)half; /* read + write */
    }
    CU_TRY(ctx, pa_cu.cuEventRecord(c->e1, impl->stream));
    CU_TRY(ctx, pa_cu.cuEventSynchronize(c->e1));
    float ms = 0;
    CU_TRY(ctx, pa_cu.cuEventElapsedTime(&ms, c->e0, c->e1));
    *rate = ms > 0 ? moved / (ms * 1e-3) : 0;
    return PA_OK;
}

static pa_status run_ceilings(pa_context *ctx, cuda_impl *impl, ceiling_run *c, double seconds,
                              pa_ceilings *out) {
    pa_kmodule *m;
    pa_status st = pa_cuda_module(ctx, impl, "util", &m);
    if (st) return st;
    st = pa_cuda_function(ctx, impl, m, "pa_read_stream", 0, &c->read_fn);
    if (st) return st;
    int per_sm = 0;
    CU_TRY(ctx, pa_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c->read_fn, 512, 0));
    c->grid = (unsigned)(impl->sm_count * (per_sm > 0 ? per_sm : 1));
    /* a buffer far beyond the L2 (2 GiB, less when memory is short), not zeros */
    size_t free_b = 0, total_b = 0;
    CU_TRY(ctx, pa_cu.cuMemGetInfo(&free_b, &total_b));
    size_t bytes = (size_t)2 << 30;
    if (bytes > free_b / 4) bytes = free_b / 4 / (1 << 20) * (1 << 20);
    if (bytes < ((size_t)64 << 20))
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "ceilings: too little free device memory (%zu bytes)", free_b);
    CU_TRY(ctx, pa_cu.cuMemAlloc(&c->buf, bytes + 256));
    c->sink = c->buf + bytes;
    c->bytes = bytes;
    CU_TRY(ctx, pa_cu.cuMemsetD8Async(c->buf, 0x5a, bytes + 256, impl->stream));
    for (int mode = 0; mode < 2; mode++) {
        double best = 0, rate = 0, start = now_seconds();
        int passes = 0;
        st = time_pass(ctx, c, mode, &rate); /* warm-up */
        if (st) return st;
        do {
            st = time_pass(ctx, c, mode, &rate);
            if (st) return st;
            if (rate > best) best = rate;
            passes++;
        } while (now_seconds() - start < seconds || passes < 3);
        if (mode == 0) out->read_gbps = best / 1e9;
        else out->copy_gbps = best / 1e9;
    }
    out->seconds = seconds;
    return PA_OK;
}

static pa_status cuda_measure_ceilings(pa_context *ctx, pa_device *dev, double seconds, pa_ceilings *out) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        ceiling_run c;
        memset(&c, 0, sizeof c);
        c.impl = impl;
        CUresult r = pa_cu.cuEventCreate(&c.e0, CU_EVENT_DEFAULT);
        if (r == CUDA_SUCCESS) r = pa_cu.cuEventCreate(&c.e1, CU_EVENT_DEFAULT);
        if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuEventCreate", __FILE__, __LINE__);
        if (st == PA_OK) st = run_ceilings(ctx, impl, &c, seconds, out);
        pa_cu.cuStreamSynchronize(impl->stream);
        if (c.buf) pa_cu.cuMemFree(c.buf);
        if (st == PA_OK) st = pa_cuda_matmul_ceiling(ctx, impl, seconds, out); /* cuda_blas.c */
        if (c.e0) pa_cu.cuEventDestroy(c.e0);
        if (c.e1) pa_cu.cuEventDestroy(c.e1);
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}

/* ---- timing ---- */

static pa_status timing_device(pa_context *ctx, pa_device *dev, cuda_impl **impl) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (dev->kind != PA_DEVICE_CUDA)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "timing: %s is not a CUDA device", dev->name);
    *impl = pa_cuda_impl(dev);
    return PA_OK;
}

static pa_status timing_setup(pa_context *ctx, cuda_impl *impl) {
    if (!impl->t_start) {
        CU_TRY(ctx, pa_cu.cuEventCreate(&impl->t_start, CU_EVENT_DEFAULT));
        CU_TRY(ctx, pa_cu.cuEventCreate(&impl->t_end, CU_EVENT_DEFAULT));
    }
    if (!impl->hold) {
        pa_kmodule *m;
        pa_status st = pa_cuda_module(ctx, impl, "util", &m);
        if (st == PA_OK) st = pa_cuda_function(ctx, impl, m, "pa_hold", 0, &impl->hold);
        if (st) return st;
    }
    return PA_OK;
}

static pa_status cuda_timing(pa_context *ctx, pa_device *dev, int on) {
    cuda_impl *impl = NULL;
    pa_status st = timing_device(ctx, dev, &impl);
    if (st) return st;
    pthread_mutex_lock(&impl->lock);
    st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        if (on) st = timing_setup(ctx, impl);
        if (st == PA_OK) impl->timing = on != 0;
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}

static pa_status cuda_timing_last(pa_context *ctx, pa_device *dev, double *seconds) {
    cuda_impl *impl = NULL;
    pa_status st = timing_device(ctx, dev, &impl);
    if (st) return st;
    pthread_mutex_lock(&impl->lock);
    if (!impl->timed) {
        st = pa_fail(ctx, PA_ERR_ARGUMENT, "timing: no attention call was timed on %s yet "
                     "(turn timing on first)", dev->name);
    } else if ((st = pa_cuda_enter(ctx, impl)) == PA_OK) {
        float ms = 0;
        CUresult r = pa_cu.cuEventSynchronize(impl->t_end);
        if (r == CUDA_SUCCESS) r = pa_cu.cuEventElapsedTime(&ms, impl->t_start, impl->t_end);
        if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuEventElapsedTime", __FILE__, __LINE__);
        *seconds = ms * 1e-3;
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}

/* A timed call: hold the stream (a bounded wait on the device) while the
 * host queues the call's work, so that its kernels run back to back as in a
 * steady stream of calls; the events bracket the kernels only. */
pa_status pa_cuda_timing_begin(pa_context *ctx, cuda_impl *impl) {
    if (!impl->timing) return PA_OK;
    const char *env = getenv("PAGEDATTN_TIMING_HOLD_US");
    unsigned long long ns = (unsigned long long)((env && *env ? atof(env) : 50.0) * 1000.0);
    void *args[] = {&ns};
    CU_TRY(ctx, pa_cu.cuLaunchKernel(impl->hold, 1, 1, 1, 1, 1, 1, 0, impl->stream, args, NULL));
    CU_TRY(ctx, pa_cu.cuEventRecord(impl->t_start, impl->stream));
    return PA_OK;
}

pa_status pa_cuda_timing_end(pa_context *ctx, cuda_impl *impl) {
    if (!impl->timing) return PA_OK;
    CU_TRY(ctx, pa_cu.cuEventRecord(impl->t_end, impl->stream));
    impl->timed = true;
    return PA_OK;
}

/* ---- the device ---- */

static void cuda_destroy(pa_device *dev) {
    cuda_impl *impl = pa_cuda_impl(dev);
    if (impl) {
        if (pa_cu.cuCtxPushCurrent(impl->cuctx) == CUDA_SUCCESS) {
            if (impl->stream) pa_cu.cuStreamSynchronize(impl->stream);
            pa_cuda_modules_free(impl);
            if (impl->scratch) pa_cu.cuMemFree(impl->scratch);
            if (impl->counters) pa_cu.cuMemFree(impl->counters);
            if (impl->copy_stream) pa_cu.cuStreamSynchronize(impl->copy_stream);
            for (int i = 0; i < PA_STAGING_SLOTS; i++) {
                if (impl->staging[i].host) pa_cu.cuMemFreeHost(impl->staging[i].host);
                if (impl->staging[i].done) pa_cu.cuEventDestroy(impl->staging[i].done);
                if (impl->staging[i].used) pa_cu.cuEventDestroy(impl->staging[i].used);
                if (impl->staging[i].dev) pa_cu.cuMemFree(impl->staging[i].dev);
            }
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

static const pa_backend_ops cuda_ops = {
    "cuda",
    cuda_alloc,
    cuda_free,
    cuda_upload,
    cuda_download,
    cuda_copy,
    cuda_fill,
    cuda_fill_randn,
    cuda_attention,
    cuda_synchronize,
    cuda_measure_ceilings,
    cuda_destroy,
    cuda_timing,
    cuda_timing_last,
};

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
    if (impl->cc_major < 8)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED,
                       "device: cuda:%d (%s) has compute capability %d.%d; pagedattn needs 8.0 or newer",
                       index, name, impl->cc_major, impl->cc_minor);
    int image_kind = 0;
    pa_cuda_pick_arch(impl->cc_major, impl->cc_minor, impl->arch, sizeof impl->arch, &image_kind);
    CU_TRY(ctx, pa_cu.cuDevicePrimaryCtxRetain(&impl->cuctx, impl->cudev));
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st) return st;
    CUresult r = pa_cu.cuStreamCreate(&impl->stream, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS) r = pa_cu.cuStreamCreate(&impl->copy_stream, CU_STREAM_NON_BLOCKING);
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

/* The backend's extras (pagedattn_lab.h's kernel catalog and compiler). */
static void *cuda_proc(const char *name) {
    if (strcmp(name, "kernel_catalog_size") == 0) return (void *)pa_cuda_kernel_catalog_size;
    if (strcmp(name, "kernel_catalog_name") == 0) return (void *)pa_cuda_kernel_catalog_name;
    if (strcmp(name, "kernel_compile") == 0) return (void *)pa_cuda_kernel_compile;
    return NULL;
}

const pa_backend_reg pa_cuda_backend = {
    "cuda", "\"cuda\", \"cuda:N\"", 64, cuda_parse, pa_cuda_usable, cuda_device_create, cuda_proc,
};
