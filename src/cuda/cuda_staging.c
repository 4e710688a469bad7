/*
 * cuda_staging.c -- a CUDA device's context for a call, its lanes (queues
 * with their own per-call scratch and arrival counters on the device), and
 * the ring of pinned staging buffers that uploads go through (tensor writes,
 * attention plans).
 */
#define _GNU_SOURCE
#include "cuda_internal.h"
#include "cuda_planner.h" /* (pa_lane_beside) */

#include <stdlib.h>

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

/* A device buffer grown to `need` bytes (at least `floor`); the caller has
 * drained the streams whose queued kernels may still read the old one. */
static pa_status regrow(pa_context *ctx, CUdeviceptr *buf, size_t *have, size_t need, size_t floor_bytes,
                        const char *what) {
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

CUresult pa_cuda_lanes_sync(cuda_impl *impl) {
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < PA_LANES && r == CUDA_SUCCESS; i++)
        if (impl->lanes[i].stream) r = pa_cu.cuStreamSynchronize(impl->lanes[i].stream);
    return r;
}

cuda_lane *pa_cuda_lane(cuda_impl *impl, const pa_attn_problem *p) {
    return &impl->lanes[pa_lane_beside(p, &impl->tuning) ? 1 : 0];
}

/* Lane `to` waits for what lane `from` has queued so far. Fork and join
 * always queue it, whatever the tuning says now: a call between them may
 * have gone to lane 1 under another tuning. */
static pa_status lane_order(pa_context *ctx, pa_device *dev, int from, int to, const char *what) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        CUresult r = pa_cu.cuEventRecord(impl->lanes[from].mark, impl->lanes[from].stream);
        if (r == CUDA_SUCCESS) r = pa_cu.cuStreamWaitEvent(impl->lanes[to].stream, impl->lanes[from].mark, 0);
        if (r != CUDA_SUCCESS) {
            /* `to` cannot be ordered after `from`: let `from` finish */
            pa_cu.cuStreamSynchronize(impl->lanes[from].stream);
            st = pa_cu_fail(ctx, r, what, __FILE__, __LINE__);
        }
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}

pa_status pa_cuda_lane_fork(pa_context *ctx, pa_device *dev) {
    return lane_order(ctx, dev, 0, 1, "cuEventRecord/cuStreamWaitEvent(lane fork)");
}

pa_status pa_cuda_lane_join(pa_context *ctx, pa_device *dev) {
    return lane_order(ctx, dev, 1, 0, "cuEventRecord/cuStreamWaitEvent(lane join)");
}

pa_status pa_cuda_scratch(pa_context *ctx, cuda_lane *L, size_t bytes, CUdeviceptr *out) {
    if (bytes > L->scratch_bytes) {
        CU_TRY(ctx, pa_cu.cuStreamSynchronize(L->stream));
        pa_status st = regrow(ctx, &L->scratch, &L->scratch_bytes, bytes, (size_t)1 << 20, "scratch");
        if (st) return st;
    }
    *out = L->scratch;
    return PA_OK;
}

pa_status pa_cuda_counters(pa_context *ctx, cuda_lane *L, size_t n, CUdeviceptr *out) {
    if (n * 4 > L->counters_bytes) {
        CU_TRY(ctx, pa_cu.cuStreamSynchronize(L->stream));
        pa_status st = regrow(ctx, &L->counters, &L->counters_bytes, n * 4, 4096 * 4, "counters");
        if (st) return st;
        CUresult r = pa_cu.cuMemsetD32Async(L->counters, 0, L->counters_bytes / 4, L->stream);
        if (r != CUDA_SUCCESS) {
            pa_cu.cuMemFree(L->counters);
            L->counters = 0;
            L->counters_bytes = 0;
            return pa_cu_fail(ctx, r, "cuMemsetD32Async(counters)", __FILE__, __LINE__);
        }
    }
    *out = L->counters;
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

pa_status pa_cuda_plan_upload(pa_context *ctx, cuda_impl *impl, CUstream stream, int slot, size_t bytes,
                              CUdeviceptr *dev) {
    cuda_staging *s = &impl->staging[slot];
    *dev = 0;
    if (bytes > s->dev_bytes) {
        s->used_recorded = false; /* (every lane drains first: the last plan in it may be either's) */
        CU_TRY(ctx, pa_cuda_lanes_sync(impl));
        pa_status st = regrow(ctx, &s->dev, &s->dev_bytes, bytes, (size_t)64 << 10, "the plan");
        if (st) return st;
    }
    CUresult r = CUDA_SUCCESS;
    if (s->used_recorded) r = pa_cu.cuStreamWaitEvent(impl->copy_stream, s->used, 0);
    if (r == CUDA_SUCCESS) r = pa_cu.cuMemcpyHtoDAsync(s->dev, s->host, bytes, impl->copy_stream);
    if (r != CUDA_SUCCESS) return pa_cu_fail(ctx, r, "cuMemcpyHtoDAsync(attention plan)", __FILE__, __LINE__);
    pa_status st = staging_queued(ctx, impl, slot, impl->copy_stream);
    if (st) return st;
    r = pa_cu.cuStreamWaitEvent(stream, s->done, 0);
    if (r != CUDA_SUCCESS) {
        /* the kernels cannot be ordered after the copy: let it finish */
        pa_cu.cuStreamSynchronize(impl->copy_stream);
        return pa_cu_fail(ctx, r, "cuStreamWaitEvent(attention plan)", __FILE__, __LINE__);
    }
    *dev = s->dev;
    return PA_OK;
}

pa_status pa_cuda_plan_release(pa_context *ctx, cuda_impl *impl, CUstream stream, int slot) {
    cuda_staging *s = &impl->staging[slot];
    CUresult r = pa_cu.cuEventRecord(s->used, stream);
    if (r != CUDA_SUCCESS) {
        /* the next upload to this slot cannot wait for the kernels: wait here */
        s->used_recorded = false;
        pa_cu.cuStreamSynchronize(stream);
        return pa_cu_fail(ctx, r, "cuEventRecord(attention plan used)", __FILE__, __LINE__);
    }
    s->used_recorded = true;
    return PA_OK;
}

void pa_cuda_staging_free(cuda_impl *impl) {
    pa_cuda_lanes_sync(impl);
    for (int i = 0; i < PA_LANES; i++) {
        cuda_lane *L = &impl->lanes[i];
        if (L->scratch) pa_cu.cuMemFree(L->scratch);
        if (L->counters) pa_cu.cuMemFree(L->counters);
        if (L->mark) pa_cu.cuEventDestroy(L->mark);
        if (i > 0 && L->stream) pa_cu.cuStreamDestroy(L->stream); /* (lane 0's is the device's) */
    }
    for (int i = 0; i < PA_STAGING_SLOTS; i++) {
        if (impl->staging[i].host) pa_cu.cuMemFreeHost(impl->staging[i].host);
        if (impl->staging[i].done) pa_cu.cuEventDestroy(impl->staging[i].done);
        if (impl->staging[i].used) pa_cu.cuEventDestroy(impl->staging[i].used);
        if (impl->staging[i].dev) pa_cu.cuMemFree(impl->staging[i].dev);
    }
}
