/*
 * cuda_dequant.c -- prefill over fp8 caches on the Hopper kernels.
 *
 * The warp-specialised Hopper kernels (prefill_ws, prefill_wgmma) read
 * 16-bit caches only; over fp8 caches the planner's choice is the mma.sync
 * kernel, at 0.35-0.44 of their TFLOP/s (docs/fp8.md). Prefill is
 * compute-bound: the keys a call reads are few bytes next to its FLOPs
 * (8192 causal queries over 8192 keys: 0.55 TFLOP, 17 MB of fp8 K and V).
 * So a paged call whose 16-bit form would run on the Hopper kernels alone
 * gets the keys it attends widened into a 16-bit copy first (pa_dequant,
 * append.cu, launched by cuda_launch.c: block-table entry (b, j) into copy page b * width + j, each
 * value fp8 * scale of its kv head rounded once to q's dtype, what the
 * reference's naive reading does), and its parts run on the copy with scale
 * 1. The copy lives in the call's scratch, its block table and the
 * sequences' key counts in the call's upload; the append (if any) writes the
 * fp8 caches first, as ever. Tuning prefill_fp8 = 0 turns it off; a copy
 * larger than prefill_fp8_max_mb (K and V; the scratch keeps its size after
 * the call) leaves the call on the fp8 bytes.
 */
#include "cuda_launch.h"

#include <stdlib.h>

#define ALIGN256(n) (((n) + 255) & ~(size_t)255)

bool pa_cuda_dequant_wanted(const pa_attn_problem *p, const pa_cuda_caps *caps, const pa_cuda_tuning *t) {
    if (!t->prefill_fp8 || !pa_dtype_is_fp8(p->cache_dtype) || !caps->sm90a) return false;
    if (p->dtype != PA_F16 && p->dtype != PA_BF16) return false;
    if (!p->paged || !p->block_table || !p->h_seqlen_k || p->head_dim % 8 != 0) return false;
    if ((((uintptr_t)p->k_cache | (uintptr_t)p->v_cache) & 7) != 0) return false; /* (8-byte loads) */
    /* prefill-shaped (decode kernels take up to 8 queries a sequence, and
     * read the fp8 bytes themselves); the plan decides the rest */
    return p->total_q > 0 && p->max_seqlen_q > 8;
}

pa_status pa_cuda_dequant_problem(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_tuning *t,
                                  pa_dequant_plan *dq) {
    memset(dq, 0, sizeof *dq);
    int64_t width = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        const int64_t pages = ((int64_t)p->h_seqlen_k[b] + p->page_size - 1) / p->page_size;
        if (pages > width) width = pages;
    }
    if (width < 1) width = 1;
    if (width > p->bt_stride || (int64_t)p->batch * width > INT32_MAX) return PA_OK; /* (stays on fp8) */
    const size_t n = (size_t)p->batch * (size_t)width;
    const size_t copy = n * (size_t)p->page_size * (size_t)p->kv_heads * (size_t)p->head_dim * pa_dtype_size(p->dtype);
    if (2 * copy > ((size_t)t->prefill_fp8_max_mb << 20)) return PA_OK; /* (the scratch would hold it after the call) */
    dq->width = (int32_t)width;
    dq->h_table = malloc((n > 0 ? n : 1) * sizeof(int32_t));
    if (!dq->h_table) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: %zu bytes of host memory", n * 4);
    for (size_t i = 0; i < n; i++) dq->h_table[i] = (int32_t)i;
    dq->copy_bytes = copy;
    pa_attn_problem *q = &dq->p16;
    *q = *p;
    q->cache_dtype = p->dtype;
    q->k_scale = q->v_scale = 1.f;
    q->k_scales = q->v_scales = NULL;
    q->num_pages = (int64_t)n;
    q->bt_stride = width;
    q->h_block_table = dq->h_table;
    dq->on = true;
    return PA_OK;
}

bool pa_cuda_dequant_fits(const pa_cuda_plan *plan) {
    if (plan->nparts < 1) return false;
    for (int i = 0; i < plan->nparts; i++) {
        const pa_plan_part *pt = &plan->parts[i];
        if (pt->kind != PA_PART_PREFILL || strncmp(pt->kp.variant, "prefill_w", 9) != 0) return false;
    }
    return true;
}

void pa_cuda_dequant_layout(pa_dequant_plan *dq, const pa_attn_problem *p, pa_cuda_plan *plan) {
    dq->scratch_off = ALIGN256(plan->scratch_bytes);
    plan->scratch_bytes = dq->scratch_off + 2 * ALIGN256(dq->copy_bytes);
    dq->upload_off = ALIGN256(plan->upload_bytes);
    plan->upload_bytes = dq->upload_off + ((size_t)p->batch + (size_t)p->batch * (size_t)dq->width) * sizeof(int32_t);
}

void pa_cuda_dequant_write(const pa_dequant_plan *dq, const pa_attn_problem *p, void *host) {
    int32_t *at = (int32_t *)((char *)host + dq->upload_off);
    memcpy(at, p->h_seqlen_k, (size_t)p->batch * sizeof(int32_t));
    memcpy(at + p->batch, dq->h_table, (size_t)p->batch * (size_t)dq->width * sizeof(int32_t));
}

void pa_cuda_dequant_bind_scratch(pa_dequant_plan *dq, CUdeviceptr scratch) {
    dq->p16.k_cache = (void *)(uintptr_t)(scratch + dq->scratch_off);
    dq->p16.v_cache = (void *)(uintptr_t)(scratch + dq->scratch_off + ALIGN256(dq->copy_bytes));
}

void pa_cuda_dequant_bind_upload(pa_dequant_plan *dq, const pa_attn_problem *p, CUdeviceptr plan) {
    dq->seqlen = plan + dq->upload_off;
    dq->p16.block_table = (const int32_t *)(uintptr_t)(plan + dq->upload_off + (size_t)p->batch * sizeof(int32_t));
}

void pa_cuda_dequant_free(pa_dequant_plan *dq) {
    free(dq->h_table);
    dq->h_table = NULL;
}
