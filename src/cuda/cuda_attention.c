/*
 * cuda_attention.c -- attention on a CUDA device, one normalised problem
 * (pa_attn_problem) at a time:
 *
 *   1. plan: the planner (cuda_planner.h) chooses each part's kernel, loading
 *      the modules it asks for through the two callbacks below, and cuts the
 *      work list (a prefill over fp8 caches may be planned over a 16-bit
 *      copy of its keys: cuda_dequant.c);
 *   2. stage: the plan written into pinned staging, scratch and counters grown;
 *   3. queue: the plan's upload, the rotary append and each part's kernel
 *      (cuda_launch.c), bracketed by the timing events when timing is on, on
 *      the call's lane (cuda_staging.c: the cascade's shared level queues on
 *      lane 1, beside its suffix level on lane 0).
 *
 * Everything that may wait for the device or fail (module loads, function
 * look-ups, TMA descriptors, growing scratch) happens before the first
 * operation of the call is queued.
 */
#include "cuda_launch.h"

#include <stdio.h>

/* pa_cuda_kernels for the planner: modules from the device's cache. */
static pa_status load_kernel(void *user, pa_context *ctx, const char *variant, pa_cuda_loaded *out) {
    pa_kmodule *m;
    pa_status st = pa_cuda_module(ctx, user, variant, &m);
    if (st) return st;
    out->name = m->name;
    out->module = m;
    memcpy(out->info, m->info, sizeof out->info);
    return PA_OK;
}

static pa_status kernel_occupancy(void *user, pa_context *ctx, const pa_cuda_loaded *k, const char *entry,
                                  int threads, int smem, void **fn, int *blocks_per_sm) {
    CUfunction f;
    pa_status st = pa_cuda_function(ctx, user, k->module, entry, smem, &f);
    if (st) return st;
    *fn = f;
    CU_TRY(ctx, pa_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, f, threads, (size_t)smem));
    return PA_OK;
}

static pa_status queue(pa_context *ctx, cuda_impl *impl, CUstream stream, const pa_attn_problem *p,
                       const pa_cuda_plan *plan, int slot, const pa_cuda_buffers *bufs, CUfunction append_fn,
                       pa_dequant_plan *dq, CUfunction dequant_fn, pa_tma_maps maps[4]) {
    pa_status st = pa_cuda_timing_begin(ctx, impl, stream);
    if (st) return st;
    pa_cuda_buffers b = *bufs;
    st = pa_cuda_plan_upload(ctx, impl, stream, slot, plan->upload_bytes, &b.plan);
    if (st == PA_OK && dq->on) pa_cuda_dequant_bind_upload(dq, p, b.plan);
    if (st == PA_OK) st = pa_cuda_launch(ctx, stream, p, plan, &b, append_fn, dq, dequant_fn, maps);
    if (b.plan) {
        pa_status st_rel = pa_cuda_plan_release(ctx, impl, stream, slot);
        if (st == PA_OK) st = st_rel;
    }
    pa_status st_end = pa_cuda_timing_end(ctx, impl, stream);
    return st ? st : st_end;
}

/* The plan of p, or (fp8 caches, prefill that the Hopper kernels would run
 * over 16-bit caches: cuda_dequant.c) of dq's p16 with dq->on. */
static pa_status plan_call(pa_context *ctx, cuda_impl *impl, const pa_attn_problem *p, const pa_cuda_caps *caps,
                           const pa_cuda_kernels *kernels, pa_dequant_plan *dq, pa_cuda_plan *plan) {
    if (dq->ws8) { /* prefill_ws widening the fp8 pages itself: planned as over 16-bit caches */
        pa_cuda_tuning ws = impl->tuning;
        ws.prefill_kernel = 1;
        pa_attn_problem pv = *p;
        pv.cache_dtype = p->dtype;
        pv.k_scale = pv.v_scale = 1.f;
        pv.k_scales = pv.v_scales = NULL;
        pa_status st = pa_cuda_plan_make(ctx, &pv, caps, &ws, kernels, plan);
        if (st) return st;
        bool adopted = false;
        if (pa_cuda_dequant_fits(plan)) st = pa_cuda_dequant_ws8(ctx, kernels, p, plan, &adopted);
        if (st == PA_OK && adopted) {
            dq->on = false; /* no copy: the parts read p's pages */
            return PA_OK;
        }
        pa_cuda_plan_free(plan);
        if (st) return st;
    }
    if (dq->on && dq->f8) { /* prefill_f8 takes prefill_ws's work items: planned on it */
        pa_cuda_tuning ws = impl->tuning;
        ws.prefill_kernel = 1;
        pa_status st = pa_cuda_plan_make(ctx, &dq->p16, caps, &ws, kernels, plan);
        if (st) return st;
        if (pa_cuda_dequant_fits(plan)) st = pa_cuda_dequant_f8(ctx, kernels, &impl->tuning, p, dq, plan);
        else dq->f8 = false;
        if (st == PA_OK && dq->f8) return PA_OK;
        pa_cuda_plan_free(plan);
        if (st) return st;
    }
    if (dq->on) {
        pa_status st = pa_cuda_plan_make(ctx, &dq->p16, caps, &impl->tuning, kernels, plan);
        if (st) return st;
        if (pa_cuda_dequant_fits(plan)) return PA_OK;
        pa_cuda_plan_free(plan);
        dq->on = false;
    }
    return pa_cuda_plan_make(ctx, p, caps, &impl->tuning, kernels, plan);
}

static pa_status attend(pa_context *ctx, cuda_impl *impl, const pa_attn_problem *p) {
    const pa_cuda_caps caps = {impl->sm_count, impl->cc_major, impl->smem_optin, strcmp(impl->arch, "sm_90a") == 0,
                               pa_cu.cuTensorMapEncodeTiled != NULL, pa_cu.cuLaunchKernelEx != NULL};
    pa_dequant_plan dq;
    memset(&dq, 0, sizeof dq);
    pa_status st = PA_OK;
    if (pa_cuda_dequant_wanted(p, &caps, &impl->tuning)) st = pa_cuda_dequant_problem(ctx, p, &impl->tuning, &dq);
    pa_kmodule *append_mod = NULL;
    if (st == PA_OK && (p->total_new > 0 || (p->rotary_cos && p->total_q > 0) || dq.on)) {
        char variant[64];
        pa_variant v = pa_variant_of(PA_VK_APPEND);
        pa_variant_set(&v, PA_KEY_KV, pa_dtype_is_fp8(p->cache_dtype) ? (int32_t)p->cache_dtype : 0);
        pa_variant_name(pa_variant_set(&v, PA_KEY_DTYPE, p->dtype), variant, sizeof variant);
        st = pa_cuda_module(ctx, impl, variant, &append_mod);
    }
    const pa_cuda_kernels kernels = {impl, load_kernel, kernel_occupancy};
    pa_cuda_plan plan;
    if (st == PA_OK) st = plan_call(ctx, impl, p, &caps, &kernels, &dq, &plan);
    if (st) {
        pa_cuda_dequant_free(&dq);
        return st;
    }
    const pa_attn_problem *pp = dq.on ? &dq.p16 : p; /* what the parts read */
    CUfunction append_fn = NULL, dequant_fn = NULL;
    const char *append_entry = plan.append_new8 ? "pa_append_new8" : "pa_append";
    if (plan.append && plan.append_grid > 0) st = pa_cuda_function(ctx, impl, append_mod, append_entry, 0, &append_fn);
    if (st == PA_OK && dq.on) {
        st = pa_cuda_function(ctx, impl, dq.f8 ? dq.f8_module : append_mod, pa_cuda_dequant_entry(&dq), 0, &dequant_fn);
        pa_cuda_dequant_layout(&dq, p, &plan);
    }
    if (st == PA_OK) pa_cuda_append_scales_layout(p, &plan);
    void *host = NULL;
    int slot = 0;
    pa_cuda_buffers bufs = {0, 0, 0};
    cuda_lane *lane = pa_cuda_lane(impl, p);
    if (st == PA_OK) st = pa_cuda_staging(ctx, impl, plan.upload_bytes, &host, &slot);
    if (st == PA_OK) st = pa_cuda_scratch(ctx, lane, plan.scratch_bytes, &bufs.scratch);
    if (st == PA_OK && plan.ncounters > 0) st = pa_cuda_counters(ctx, lane, (size_t)plan.ncounters, &bufs.counters);
    if (st == PA_OK && dq.on) pa_cuda_dequant_bind_scratch(&dq, bufs.scratch);
    pa_tma_maps maps[4];
    if (st == PA_OK) st = pa_cuda_launch_prepare(ctx, pp, &plan, &impl->tuning, maps);
    if (st == PA_OK) {
        pa_cuda_plan_write(pp, &plan, host);
        if (dq.on) pa_cuda_dequant_write(&dq, p, host);
        pa_cuda_append_scales_write(p, &plan, host);
        impl->nlast = pa_cuda_records(&plan, append_mod ? append_mod->name : NULL, append_entry, &dq, p->batch, impl->last);
        st = queue(ctx, impl, lane->stream, p, &plan, slot, &bufs, append_fn, &dq, dequant_fn, maps);
    }
    pa_cuda_plan_free(&plan);
    pa_cuda_dequant_free(&dq);
    return st;
}

pa_status pa_cuda_attention(pa_context *ctx, const pa_attn_problem *p) {
    cuda_impl *impl = pa_cuda_impl(p->dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        st = attend(ctx, impl, p);
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}
