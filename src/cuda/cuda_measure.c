/*
 * cuda_measure.c -- the laboratory's measurements on a CUDA device: its
 * ceilings (a streaming read and a device copy here, the bf16 matmul in
 * cuda_blas.c) and device-side timing of attention calls (pa_device_timing).
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <stdlib.h>
#include <time.h>

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

pa_status pa_cuda_measure_ceilings(pa_context *ctx, pa_device *dev, double seconds, pa_ceilings *out) {
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

pa_status pa_cuda_timing(pa_context *ctx, pa_device *dev, int on) {
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

pa_status pa_cuda_timing_last(pa_context *ctx, pa_device *dev, double *seconds) {
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
pa_status pa_cuda_timing_begin(pa_context *ctx, cuda_impl *impl, CUstream stream) {
    if (!impl->timing) return PA_OK;
    unsigned long long ns = (unsigned long long)impl->tuning.timing_hold_us * 1000ull;
    void *args[] = {&ns};
    CU_TRY(ctx, pa_cu.cuLaunchKernel(impl->hold, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
    CU_TRY(ctx, pa_cu.cuEventRecord(impl->t_start, stream));
    return PA_OK;
}

pa_status pa_cuda_timing_end(pa_context *ctx, cuda_impl *impl, CUstream stream) {
    if (!impl->timing) return PA_OK;
    CU_TRY(ctx, pa_cu.cuEventRecord(impl->t_end, stream));
    impl->timed = true;
    return PA_OK;
}

