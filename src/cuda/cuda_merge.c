/*
 * cuda_merge.c -- the CUDA backend's merge of attention states and its row
 * copy (with rotary) of q, for pa_merge_states and the cascade: one launch
 * each of kernels/merge.cu, on the device's stream (nothing waits).
 */
#include "cuda_internal.h"

_Static_assert(sizeof(pa_merge_kstate) == 32, "pa_merge_kstate layout");
_Static_assert(sizeof(pa_merge_kparams) == 32 * PA_MERGE_STATES_MAX + 56, "pa_merge_kparams layout");
_Static_assert(sizeof(pa_rows_kparams) == 88, "pa_rows_kparams layout");
_Static_assert(PA_MERGE_STATES_MAX == PA_MERGE_MAX_STATES, "the core's and the kernel's state limits");

#define WARPS 4 /* merge.cu's block */

static const char *variant_of(pa_dtype dt) {
    return dt == PA_F32 ? "merge dtype=f32" : dt == PA_F16 ? "merge dtype=f16" : "merge dtype=bf16";
}

/* Blocks of WARPS warps for `items` warp-sized items, the grid capped (the
 * kernels loop over the rest). */
static unsigned grid_of(const cuda_impl *impl, int64_t items) {
    int64_t g = (items + WARPS - 1) / WARPS;
    const int64_t cap = (int64_t)impl->sm_count * 32;
    if (g > cap) g = cap;
    return (unsigned)(g > 0 ? g : 1);
}

static pa_status launch(pa_context *ctx, pa_device *dev, pa_dtype dt, const char *entry, void *params) {
    cuda_impl *impl = pa_cuda_impl(dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        pa_kmodule *m = NULL;
        CUfunction fn = NULL;
        st = pa_cuda_module(ctx, impl, variant_of(dt), &m);
        if (st == PA_OK) st = pa_cuda_function(ctx, impl, m, entry, 0, &fn);
        if (st == PA_OK) {
            const int64_t items = strcmp(entry, "pa_merge_states") == 0
                                      ? ((pa_merge_kparams *)params)->rows * ((pa_merge_kparams *)params)->heads
                                      : ((pa_rows_kparams *)params)->rows * ((pa_rows_kparams *)params)->heads;
            void *args[] = {params};
            CUresult r = pa_cu.cuLaunchKernel(fn, grid_of(impl, items), 1, 1, WARPS * 32, 1, 1, 0, impl->stream, args,
                                              NULL);
            if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, entry, __FILE__, __LINE__);
        }
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}

pa_status pa_cuda_merge(pa_context *ctx, const pa_merge_problem *p) {
    pa_merge_kparams k;
    memset(&k, 0, sizeof k);
    for (int s = 0; s < p->num_states; s++) {
        k.states[s].o = (pa_u64)(uintptr_t)p->states[s].o;
        k.states[s].lse = (pa_u64)(uintptr_t)p->states[s].lse;
        k.states[s].rows = (pa_u64)(uintptr_t)p->states[s].rows;
        k.states[s].lse_seq = p->states[s].lse_seq;
    }
    k.out = (pa_u64)(uintptr_t)p->out;
    k.out_lse = (pa_u64)(uintptr_t)p->out_lse;
    k.out_rows = (pa_u64)(uintptr_t)p->out_rows;
    k.rows = p->rows;
    k.out_lse_seq = p->out_lse_seq;
    k.num_states = p->num_states;
    k.heads = p->heads;
    k.head_dim = p->head_dim;
    k.states_f32 = p->state_dtype == PA_F32 && p->dtype != PA_F32;
    return launch(ctx, p->dev, p->dtype, "pa_merge_states", &k);
}

pa_status pa_cuda_gather_rows(pa_context *ctx, const pa_rows_problem *p) {
    pa_rows_kparams k;
    memset(&k, 0, sizeof k);
    k.src = (pa_u64)(uintptr_t)p->src;
    k.dst = (pa_u64)(uintptr_t)p->dst;
    k.row_map = (pa_u64)(uintptr_t)p->row_map;
    k.rot_cos = (pa_u64)(uintptr_t)p->rotary_cos;
    k.rot_sin = (pa_u64)(uintptr_t)p->rotary_sin;
    k.pos = (pa_u64)(uintptr_t)p->pos;
    k.pos_index = (pa_u64)(uintptr_t)p->pos_index;
    k.rows = p->rows;
    k.heads = p->heads;
    k.head_dim = p->head_dim;
    k.rotary_dim = p->rotary_dim;
    k.rot_dtype = (int32_t)p->rotary_dtype;
    k.interleaved = p->rotary_interleaved ? 1 : 0;
    return launch(ctx, p->dev, p->dtype, "pa_gather_rows", &k);
}
