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
 *
 * prefill_fp8 = 2 (opt-in): where every part would run on prefill_ws (planned
 * so: the tuning forces it) at head dim 128 without softcap or ALiBi, the
 * parts run prefill_f8 instead, the products on the e4m3 tensor cores, over
 * tiles that its pa_f8_tiles entry writes in place of the copy (K as it is,
 * V transposed: prefill_f8.cu), with the call's own scales. Q and P in e4m3
 * are not within the tolerance rule (docs/fp8.md states the error).
 *
 * prefill_fp8 = 3 (opt-in: correct, 0.60x bf16's speed on an H100,
 * docs/fp8.md): where every part would run on
 * prefill_ws with TMA (head dim 128, pages of 16 or more, no softcap or
 * ALiBi), the parts run prefill_ws kv= over the fp8 pages themselves: a
 * warpgroup of the block widens each tile (exactly) for the 16-bit products,
 * the scales applied in f32 (prefill_ws.cu). No copy, no pass before.
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
    /* (prefill_fp8 = 3 needs no copy: wanted whatever the copy's size) */
    dq->ws8 = t->prefill_fp8 == 3 && p->head_dim == 128 && p->page_size >= 16 &&
              (p->page_size & (p->page_size - 1)) == 0 && p->softcap <= 0.f && !p->alibi &&
              (((uintptr_t)p->k_cache | (uintptr_t)p->v_cache) & 15) == 0;
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
    /* the tiles (prefill_fp8 = 2): 128 keys x 128 bytes a tile, K and V^T;
     * 16-byte rows for its copies */
    const int64_t ntile = (width * p->page_size + 127) / 128;
    dq->f8 = t->prefill_fp8 == 2 && p->head_dim == 128 && p->softcap <= 0.f && !p->alibi && p->scale > 0.f &&
             (((uintptr_t)p->k_cache | (uintptr_t)p->v_cache) & 15) == 0 &&
             (int64_t)p->batch * p->kv_heads * ntile <= INT32_MAX;
    dq->ntile = (int32_t)ntile;
    dq->tile_bytes = (size_t)p->batch * (size_t)p->kv_heads * (size_t)ntile * 16384u;
    if (dq->f8 && 2 * dq->tile_bytes > ((size_t)t->prefill_fp8_max_mb << 20)) dq->f8 = false;
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

const char *pa_cuda_dequant_entry(const pa_dequant_plan *dq) { return dq->f8 ? "pa_f8_tiles" : "pa_dequant"; }

int64_t pa_cuda_dequant_grid(const pa_dequant_plan *dq, int32_t batch) {
    return dq->f8 ? (int64_t)batch * dq->p16.kv_heads * dq->ntile : (int64_t)batch * dq->width;
}

bool pa_cuda_dequant_fits(const pa_cuda_plan *plan) {
    if (plan->nparts < 1) return false;
    for (int i = 0; i < plan->nparts; i++) {
        const pa_plan_part *pt = &plan->parts[i];
        if (pt->kind != PA_PART_PREFILL || strncmp(pt->kp.variant, "prefill_w", 9) != 0) return false;
    }
    return true;
}

/* A part's kernel swapped for variant v's entry (prefill_fp8 = mode chose
 * it): loaded, one block a SM at least, kp's kernel fields set; m its module. */
static pa_status swap_kernel(pa_context *ctx, const pa_cuda_kernels *k, const pa_variant *v, const char *entry,
                             int mode, pa_kernel_plan *kp, pa_cuda_loaded *m) {
    char name[112];
    void *fn = NULL;
    int blocks = 0;
    if (!pa_variant_name(v, name, sizeof name) || !pa_variant_allows(v))
        return pa_fail(ctx, PA_ERR_INTERNAL, "attention: prefill_fp8 = %d chose a kernel that does not exist (%s)", mode,
                       name);
    pa_status st = k->load(k->user, ctx, name, m);
    if (st == PA_OK) st = k->occupancy(k->user, ctx, m, entry, m->info[0], m->info[1], &fn, &blocks);
    if (st) return st;
    if (blocks < 1)
        return pa_fail(ctx, PA_ERR_INTERNAL, "attention: %s does not fit on a SM (%d bytes of shared memory)", name,
                       m->info[1]);
    kp->variant = m->name;
    kp->entry = entry;
    kp->fn = fn;
    kp->threads = m->info[0];
    kp->smem = m->info[1];
    return PA_OK;
}

pa_status pa_cuda_dequant_f8(pa_context *ctx, const pa_cuda_kernels *k, const pa_cuda_tuning *t,
                             const pa_attn_problem *p, pa_dequant_plan *dq, pa_cuda_plan *plan) {
    if (!dq->f8) return PA_OK;
    for (int i = 0; i < plan->nparts; i++) {
        const pa_kernel_plan *kp = &plan->parts[i].kp;
        if (!kp->ws || !strstr(kp->variant, " natural=0")) {
            dq->f8 = false;
            return PA_OK;
        }
    }
    for (int i = 0; i < plan->nparts; i++) {
        pa_plan_part *pt = &plan->parts[i];
        pa_kernel_plan *kp = &pt->kp;
        pa_variant v = pa_variant_of(PA_VK_PREFILL_F8);
        pa_variant_set(pa_variant_set(&v, PA_KEY_DTYPE, p->dtype), PA_KEY_D, 128);
        pa_variant_set(pa_variant_set(&v, PA_KEY_GT, kp->gt), PA_KEY_KV, p->cache_dtype);
        pa_variant_set(&v, PA_KEY_STAGES, t->prefill_stages > 0 ? pa_variant_clamp(&v, PA_KEY_STAGES, t->prefill_stages) : 4);
        pa_cuda_loaded m;
        pa_status st = swap_kernel(ctx, k, &v, "pa_prefill_f8", 2, kp, &m);
        if (st) return st;
        kp->tma_rows = 0; /* (no tensor maps, no first boxes) */
        kp->page_boxes = false;
        pt->boxes0 = -1;
        dq->f8_module = m.module;
    }
    dq->copy_bytes = dq->tile_bytes;
    dq->p16.k_scale = p->k_scale;
    dq->p16.v_scale = p->v_scale;
    dq->p16.k_scales = p->k_scales;
    dq->p16.v_scales = p->v_scales;
    return PA_OK;
}

pa_status pa_cuda_dequant_ws8(pa_context *ctx, const pa_cuda_kernels *k, const pa_attn_problem *p,
                              pa_cuda_plan *plan, bool *adopted) {
    *adopted = false;
    const int32_t rows = p->page_size < 128 ? p->page_size : 128; /* (prefill_ws.cu's TMA_ROWS) */
    for (int i = 0; i < plan->nparts; i++) {
        const pa_kernel_plan *kp = &plan->parts[i].kp;
        if (!kp->ws || kp->tma_rows != rows || !strstr(kp->variant, " natural=0")) return PA_OK;
    }
    for (int i = 0; i < plan->nparts; i++) {
        pa_kernel_plan *kp = &plan->parts[i].kp;
        pa_variant v = pa_variant_of(PA_VK_PREFILL_WS);
        pa_variant_set(pa_variant_set(&v, PA_KEY_DTYPE, p->dtype), PA_KEY_D, 128);
        pa_variant_set(pa_variant_set(&v, PA_KEY_GT, kp->gt), PA_KEY_PAGE, pa_variant_page_key(true, p->page_size));
        pa_variant_set(pa_variant_set(&v, PA_KEY_STAGES, 2), PA_KEY_NATURAL, 0);
        pa_variant_set(pa_variant_set(&v, PA_KEY_TMA, 1), PA_KEY_KV, p->cache_dtype);
        pa_cuda_loaded m;
        pa_status st = swap_kernel(ctx, k, &v, "pa_prefill_ws", 3, kp, &m);
        if (st) return st;
        kp->page_boxes = false;
    }
    *adopted = true;
    return PA_OK;
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
