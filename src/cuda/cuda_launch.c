/*
 * cuda_launch.c -- a planned attention call's launches: the TMA descriptors
 * of prefill_ws, the kernels' parameter structs (kernels/params.h) and the
 * launches on the device's stream. Nothing here chooses: the plan
 * (cuda_planner.h) says what runs where.
 */
#define _GNU_SOURCE
#include "cuda_launch.h"

#include <stdio.h>

_Static_assert(sizeof(pa_seq_meta) == 32, "pa_seq_meta layout");
_Static_assert(sizeof(pa_work) == 64, "pa_work layout");
_Static_assert(sizeof(pa_attn_params) == 240, "pa_attn_params layout");
_Static_assert(sizeof(pa_append_params) == 184, "pa_append_params layout");

/* One TMA descriptor of the call's dtype (rank 3 or 5): dims innermost
 * first, the strides of the outer ones in bytes, 128-byte swizzle; or (raw)
 * of bytes, unswizzled (the fp8 caches' rows for prefill_ws kv=). */
static pa_status tma_map_of(pa_context *ctx, const pa_attn_problem *p, bool raw, int rank, const void *base,
                            const uint64_t *dims, const uint64_t *strides, const uint32_t *box, pa_u64 *out) {
    const int dtype = raw                 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                      : p->dtype == PA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const uint32_t unit[5] = {1, 1, 1, 1, 1};
    CUtensorMap m;
    CUresult r = pa_cu.cuTensorMapEncodeTiled(&m, dtype, (uint32_t)rank, (void *)base, dims, strides, box, unit,
                                              CU_TENSOR_MAP_INTERLEAVE_NONE,
                                              raw ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return pa_cu_fail(ctx, r, "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    memcpy(out, m.opaque, sizeof m.opaque);
    return PA_OK;
}
static pa_status tma_map(pa_context *ctx, const pa_attn_problem *p, int rank, const void *base, const uint64_t *dims,
                         const uint64_t *strides, const uint32_t *box, pa_u64 *out) {
    return tma_map_of(ctx, p, false, rank, base, dims, strides, box, out);
}

/* prefill_ws.cu's TMA descriptors (kernels/params.h). The K and V caches:
 * 3-D (head-dim elements, kv heads, cache rows = page * page_size + slot;
 * contiguous caches: batch row * S_cache + position), boxes of 64 elements x
 * 1 head x kp->tma_rows rows, what the producer loads a page (or tile); with
 * page boxes (tma=2) 5-D, a box of kp->tma_rows rows with all columns. q,
 * unless it is the rotated f32 copy or the tile's GT heads x QT queries do
 * not fill its 128 rows: (head-dim elements, heads, q rows), boxes of 64
 * elements x GT heads x QT queries, so that the Q tile lands in one
 * transaction. out, the same way (boxes of QT / 2 queries: each consumer's
 * rows). fp8 caches (prefill_ws kv=, widened in the block): bytes, boxes of
 * whole rows x 1 head x kp->tma_rows rows, unswizzled. */
static pa_status tma_maps(pa_context *ctx, const pa_attn_problem *p, const pa_kernel_plan *kp,
                          const pa_cuda_tuning *t, bool q_f32, pa_tma_maps *out) {
    const uint64_t D = (uint64_t)p->head_dim;
    const uint64_t dims[3] = {D, (uint64_t)p->kv_heads, (uint64_t)p->num_pages * (uint64_t)p->page_size};
    const uint64_t strides[2] = {D * 2, (uint64_t)p->kv_heads * D * 2}; /* bytes */
    const uint32_t box[3] = {64, 1, (uint32_t)kp->tma_rows};
    pa_status st;
    if (pa_dtype_is_fp8(p->cache_dtype)) {
        const uint64_t strides8[2] = {D, (uint64_t)p->kv_heads * D};
        const uint32_t box8[3] = {(uint32_t)D, 1, (uint32_t)kp->tma_rows};
        st = tma_map_of(ctx, p, true, 3, p->k_cache, dims, strides8, box8, out->k);
        if (st == PA_OK) st = tma_map_of(ctx, p, true, 3, p->v_cache, dims, strides8, box8, out->v);
    } else if (kp->page_boxes) {
        /* page boxes: (64 elements, 8 rows, 64-column blocks, kv heads, 8-row
         * groups), a box of a page's rows (or a tile's), every column block,
         * landing as the kernel's KVL layout (each 8 rows' blocks side by side) */
        const uint64_t row = (uint64_t)p->kv_heads * D * 2;
        const uint64_t pdims[5] = {64, 8, D / 64, (uint64_t)p->kv_heads, dims[2] / 8};
        const uint64_t pstrides[4] = {row, 128, D * 2, 8 * row};
        const uint32_t pbox[5] = {64, 8, (uint32_t)(D / 64), 1, (uint32_t)kp->tma_rows / 8};
        st = tma_map(ctx, p, 5, p->k_cache, pdims, pstrides, pbox, out->k);
        if (st == PA_OK) st = tma_map(ctx, p, 5, p->v_cache, pdims, pstrides, pbox, out->v);
    } else {
        st = tma_map(ctx, p, 3, p->k_cache, dims, strides, box, out->k);
        if (st == PA_OK) st = tma_map(ctx, p, 3, p->v_cache, dims, strides, box, out->v);
    }
    /* the tile's rows are GT heads x QT queries, and q rows are int32 coordinates */
    const bool rows = kp->gt * kp->q_tile == 128 && p->total_q < ((int64_t)1 << 31);
    out->q_tma = st == PA_OK && rows && !q_f32 && ((uintptr_t)p->q & 15) == 0 && t->prefill_tma_q;
    const uint64_t qdims[3] = {D, (uint64_t)p->heads, (uint64_t)p->total_q};
    const uint64_t qstrides[2] = {D * 2, (uint64_t)p->heads * D * 2};
    if (out->q_tma) {
        const uint32_t qbox[3] = {64, (uint32_t)kp->gt, (uint32_t)kp->q_tile};
        st = tma_map(ctx, p, 3, p->q, qdims, qstrides, qbox, out->q);
    }
    /* (an f32 out, the cascade's levels, leaves from the registers) */
    const bool out16 = p->out_dtype == p->dtype;
    out->o_tma = st == PA_OK && rows && out16 && ((uintptr_t)p->out & 15) == 0 && t->prefill_tma_o;
    if (out->o_tma) {
        const uint32_t obox[3] = {64, (uint32_t)kp->gt, (uint32_t)kp->q_tile / 2};
        st = tma_map(ctx, p, 3, p->out, qdims, qstrides, obox, out->o);
    }
    return st;
}

void pa_cuda_append_scales_layout(const pa_attn_problem *p, pa_cuda_plan *plan) {
    plan->inv_off = 0;
    if (!plan->append || p->total_new == 0 || !pa_dtype_is_fp8(p->cache_dtype)) return;
    plan->inv_off = (plan->upload_bytes + 255) & ~(size_t)255;
    plan->upload_bytes = plan->inv_off + 2 * (size_t)p->kv_heads * sizeof(float);
}

void pa_cuda_append_scales_write(const pa_attn_problem *p, const pa_cuda_plan *plan, void *host) {
    if (!plan->inv_off) return;
    float *inv = (float *)((char *)host + plan->inv_off);
    for (int32_t h = 0; h < p->kv_heads; h++) {
        /* (the CPU's append takes the same reciprocals: the same bytes in the cache) */
        inv[h] = pa_fp8_inv_scale(p->h_k_scales[h]);
        inv[p->kv_heads + h] = pa_fp8_inv_scale(p->h_v_scales[h]);
    }
}

pa_status pa_cuda_launch_prepare(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_plan *plan,
                                 const pa_cuda_tuning *t, pa_tma_maps maps[4]) {
    for (int i = 0; i < plan->nparts; i++) {
        memset(&maps[i], 0, sizeof maps[i]);
        const pa_kernel_plan *kp = &plan->parts[i].kp;
        if (kp->tma_rows > 0 && plan->parts[i].nwork > 0) {
            pa_status st = tma_maps(ctx, p, kp, t, plan->rotate_q, &maps[i]);
            if (st) return st;
        }
    }
    return PA_OK;
}

static pa_status launch_append(pa_context *ctx, CUstream stream, const pa_attn_problem *p, const pa_cuda_plan *plan,
                               const pa_cuda_buffers *buf, CUfunction fn) {
    pa_append_params ap;
    memset(&ap, 0, sizeof ap);
    ap.k_new = (pa_u64)(uintptr_t)p->k_new;
    ap.v_new = (pa_u64)(uintptr_t)p->v_new;
    ap.k_cache = (pa_u64)(uintptr_t)p->k_cache;
    ap.v_cache = (pa_u64)(uintptr_t)p->v_cache;
    ap.block_table = p->paged ? (pa_u64)(uintptr_t)p->block_table : 0;
    ap.meta = buf->plan;
    ap.rot_cos = (pa_u64)(uintptr_t)p->rotary_cos;
    ap.rot_sin = (pa_u64)(uintptr_t)p->rotary_sin;
    ap.q = (pa_u64)(uintptr_t)p->q;
    ap.q_rot = plan->rotate_q ? buf->scratch + plan->q_rot_off : 0;
    ap.bt_stride = p->bt_stride;
    ap.page_stride = (int64_t)p->page_size * p->kv_heads * p->head_dim; /* contiguous: S_cache rows */
    ap.row_stride = (int64_t)p->kv_heads * p->head_dim;
    ap.total_new = p->total_new;
    ap.q_rows = plan->rotate_q ? p->total_q : 0;
    ap.batch = p->batch;
    ap.heads = p->heads;
    ap.kv_heads = p->kv_heads;
    ap.head_dim = p->head_dim;
    ap.page_size = p->page_size;
    ap.rotary_dim = p->rotary_dim;
    ap.rot_dtype = (pa_i32)p->rotary_dtype;
    ap.interleaved = p->rotary_interleaved;
    ap.rope_q_step = p->rope_q_step;
    ap.split = plan->append_split;
    ap.new_per_seq = plan->new_per_seq;
    ap.q_per_seq = plan->q_per_seq;
    ap.new_dense = plan->new_dense;
    /* (fp8 caches; the kernel's PA_KV says whether it reads them) */
    ap.inv_scales = plan->inv_off ? buf->plan + plan->inv_off : 0;
    void *args[] = {&ap};
    CUresult r = pa_cu.cuLaunchKernel(fn, (unsigned)plan->append_grid, 1, 1, 256, 1, 1, 0, stream, args, NULL);
    if (r != CUDA_SUCCESS) return pa_cu_fail(ctx, r, "cuLaunchKernel(pa_append)", __FILE__, __LINE__);
    return PA_OK;
}

/* The widening of the keys into dq's 16-bit copy (cuda_dequant.c): a block a
 * block-table entry. */
static pa_status launch_dequant(pa_context *ctx, CUstream stream, const pa_attn_problem *p, const pa_dequant_plan *dq,
                               CUfunction fn) {
    if (p->batch == 0) return PA_OK;
    pa_dequant_params dp;
    memset(&dp, 0, sizeof dp);
    dp.k_cache = (pa_u64)(uintptr_t)p->k_cache;
    dp.v_cache = (pa_u64)(uintptr_t)p->v_cache;
    dp.block_table = (pa_u64)(uintptr_t)p->block_table;
    dp.seqlen = dq->seqlen;
    dp.k_out = (pa_u64)(uintptr_t)dq->p16.k_cache;
    dp.v_out = (pa_u64)(uintptr_t)dq->p16.v_cache;
    dp.bt_stride = p->bt_stride;
    dp.page_stride = (int64_t)p->page_size * p->kv_heads * p->head_dim;
    dp.batch = p->batch;
    dp.width = dq->width;
    dp.kv_heads = p->kv_heads;
    dp.head_dim = p->head_dim;
    dp.page_size = p->page_size;
    dp.k_scale = p->k_scale;
    dp.v_scale = p->v_scale;
    dp.k_scales = (pa_u64)(uintptr_t)p->k_scales;
    dp.v_scales = (pa_u64)(uintptr_t)p->v_scales;
    void *args[] = {&dp};
    const unsigned grid = (unsigned)pa_cuda_dequant_grid(dq, p->batch);
    CUresult r = pa_cu.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, args, NULL);
    if (r != CUDA_SUCCESS) {
        char what[48];
        snprintf(what, sizeof what, "cuLaunchKernel(%s)", pa_cuda_dequant_entry(dq));
        return pa_cu_fail(ctx, r, what, __FILE__, __LINE__);
    }
    return PA_OK;
}

static pa_status launch_part(pa_context *ctx, CUstream stream, const pa_attn_problem *p, const pa_cuda_plan *plan,
                             const pa_plan_part *pt, const pa_cuda_buffers *buf, pa_tma_maps *maps) {
    const pa_kernel_plan *kp = &pt->kp;
    pa_attn_params ap;
    memset(&ap, 0, sizeof ap);
    ap.q = plan->rotate_q ? buf->scratch + plan->q_rot_off : (pa_u64)(uintptr_t)p->q;
    ap.q_f32 = plan->rotate_q;
    ap.out = (pa_u64)(uintptr_t)p->out;
    ap.out_f32 = p->out_dtype == PA_F32 && p->dtype != PA_F32;
    ap.lse = (pa_u64)(uintptr_t)p->lse;
    ap.k_cache = (pa_u64)(uintptr_t)p->k_cache;
    ap.v_cache = (pa_u64)(uintptr_t)p->v_cache;
    ap.block_table = p->paged ? (pa_u64)(uintptr_t)p->block_table : 0;
    ap.alibi = (pa_u64)(uintptr_t)p->alibi;
    ap.work = buf->plan + plan->work_off + sizeof(pa_work) * (size_t)pt->work0;
    ap.part_o = buf->scratch + plan->part_o_off;
    ap.part_lse = buf->scratch + plan->part_lse_off;
    ap.counters = buf->counters;
    ap.bt_stride = p->bt_stride;
    ap.lse_head_stride = p->lse_head_stride;
    ap.alibi_batch_stride = p->alibi_batch_stride;
    ap.page_stride = (int64_t)p->page_size * p->kv_heads * p->head_dim;
    ap.row_stride = (int64_t)p->kv_heads * p->head_dim;
    ap.batch = p->batch;
    ap.heads = p->heads;
    ap.kv_heads = p->kv_heads;
    ap.group = p->group;
    ap.head_dim = p->head_dim;
    ap.page_size = p->page_size;
    ap.head_tiles = kp->head_tiles;
    ap.heads_per_tile = kp->gt;
    ap.q_tile = kp->q_tile;
    ap.num_work = (pa_i32)pt->nwork;
    ap.window_left = p->window_left;
    ap.window_right = p->window_right;
    ap.scale = p->scale;
    ap.softcap = p->softcap;
    ap.item_counter = (pa_i32)(kp->persistent ? pt->counters0 + pt->ncounters : 0);
    ap.claim = pt->rule.claims;
    ap.k_scale = p->k_scale;
    ap.v_scale = p->v_scale;
    ap.k_scales = (pa_u64)(uintptr_t)p->k_scales;
    ap.v_scales = (pa_u64)(uintptr_t)p->v_scales;
    if (pt->pages0 >= 0) {
        ap.first_pages = buf->plan + plan->pages_off + sizeof(int32_t) * PA_DECODE_FIRST_PAGES * (size_t)pt->pages0;
        ap.first_pages_items = (pa_i32)pt->npaged;
    }
    if (pt->boxes0 >= 0)
        maps->first_boxes = buf->plan + plan->boxes_off + sizeof(int32_t) * PA_WS_BOXES * (size_t)pt->boxes0;
    void *args[] = {&ap, maps}; /* the second: prefill_ws only (a kernel of one parameter reads one) */
    CUresult r;
    if (pt->overlap) {
        /* programmatic: its blocks start as the previous launch's end (the
         * kernel waits for it with pa_wait_prior_grid) */
        CUlaunchAttribute attr;
        memset(&attr, 0, sizeof attr);
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmatic_stream_serialization = 1;
        const CUlaunchConfig cfg = {(unsigned)pt->blocks, 1, 1, (unsigned)kp->threads, 1, 1, (unsigned)kp->smem,
                                    stream, &attr, 1};
        r = pa_cu.cuLaunchKernelEx(&cfg, (CUfunction)kp->fn, args, NULL);
    } else {
        r = pa_cu.cuLaunchKernel((CUfunction)kp->fn, (unsigned)pt->blocks, 1, 1, (unsigned)kp->threads, 1, 1,
                                 (unsigned)kp->smem, stream, args, NULL);
    }
    if (r != CUDA_SUCCESS)
        return pa_cu_fail(ctx, r, pt->overlap ? "cuLaunchKernelEx(attention)" : "cuLaunchKernel(attention)", __FILE__,
                          __LINE__);
    return PA_OK;
}

pa_status pa_cuda_launch(pa_context *ctx, CUstream stream, const pa_attn_problem *p, const pa_cuda_plan *plan,
                         const pa_cuda_buffers *buf, CUfunction append_fn, const pa_dequant_plan *dq,
                         CUfunction dequant_fn, pa_tma_maps maps[4]) {
    pa_status st = PA_OK;
    if (plan->append && plan->append_grid > 0) st = launch_append(ctx, stream, p, plan, buf, append_fn);
    const pa_attn_problem *pp = p;
    if (dq && dq->on) {
        if (st == PA_OK) st = launch_dequant(ctx, stream, p, dq, dequant_fn);
        pp = &dq->p16;
    }
    for (int i = 0; st == PA_OK && i < plan->nparts; i++)
        if (plan->parts[i].nwork > 0) st = launch_part(ctx, stream, pp, plan, &plan->parts[i], buf, &maps[i]);
    return st;
}

int pa_cuda_records(const pa_cuda_plan *plan, const char *append_variant, const char *append_entry,
                    const pa_dequant_plan *dq, int32_t batch, pa_cuda_launch_record out[PA_LAUNCH_RECORDS]) {
    int n = 0;
    if (plan->append && plan->append_grid > 0)
        out[n++] = (pa_cuda_launch_record){append_variant, append_entry, plan->append_grid, 256, 0, 0, 0, plan->append_split,
                                           false, false, false, false, 0, 0, 0};
    if (dq && dq->on && batch > 0) {
        /* (the f8 tiles: an entry of the parts' module) */
        const int64_t grid = pa_cuda_dequant_grid(dq, batch);
        out[n++] = (pa_cuda_launch_record){dq->f8 ? plan->parts[0].kp.variant : append_variant, pa_cuda_dequant_entry(dq),
                                           grid, 256, 0, grid, 0, 0, false, false, false, false, 0, 0, 0};
    }
    for (int i = 0; i < plan->nparts; i++) {
        const pa_plan_part *pt = &plan->parts[i];
        const pa_kernel_plan *kp = &pt->kp;
        if (pt->nwork > 0)
            out[n++] = (pa_cuda_launch_record){kp->variant, kp->entry, pt->blocks, kp->threads, kp->smem, pt->nwork,
                                               kp->head_tiles, 0, pt->part_rows > 0, pt->rule.claims, kp->persistent,
                                               pt->overlap, kp->tma_rows, pt->key_lo, pt->key_hi};
    }
    return n;
}

pa_status pa_cuda_describe(pa_context *ctx, const pa_cuda_launch_record *r, int n, char *out, size_t len) {
    size_t at = 0;
    if (len > 0) out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const int w = r[i].split > 0
                          ? snprintf(out + at, len - at, "%s | %s grid=%lld threads=%d split=%d\n", r[i].variant,
                                     r[i].entry, (long long)r[i].grid, r[i].threads, r[i].split)
                          : snprintf(out + at, len - at,
                                     "%s | %s grid=%lld threads=%d smem=%d items=%lld head_tiles=%d splits=%d "
                                     "claims=%d persistent=%d overlap=%d tma_rows=%d keys=%d..%d\n",
                                     r[i].variant, r[i].entry, (long long)r[i].grid, r[i].threads, r[i].smem,
                                     (long long)r[i].items, r[i].head_tiles, r[i].splits, r[i].claims, r[i].persistent,
                                     r[i].overlap, r[i].tma_rows, r[i].key_lo, r[i].key_hi);
        if (w < 0 || (size_t)w >= len - at)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "last plan: %zu bytes of out are too few", len);
        at += (size_t)w;
    }
    return PA_OK;
}
