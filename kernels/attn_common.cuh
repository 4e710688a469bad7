/*
 * attn_common.cuh -- the epilogue that the attention kernels share: write a
 * block's rows as the final out/lse, or as the partial result of one key split;
 * the last block of a split group to arrive then combines the partials over
 * their log-sum-exp (flash decoding's combine, fused: no second launch).
 *
 * Rows of a block: row r is query w.i0 + r / gt of sequence w.b, head
 * hk * group + g0 + r % gt. Partial rows of a sequence are split-major:
 * (part_row + split * seqlen_q + query) * heads + head. Partial lse values are
 * in log2 units; -inf marks a split that saw no key of that row.
 */
#ifndef PA_ATTN_COMMON_CUH
#define PA_ATTN_COMMON_CUH
#ifndef PA_EMBED_ONLY

#include "common.cuh"

PA_DEV float pa_log2(float x) {
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The softmax headroom of the decode kernels, the fallback and the split
 * combine, in log2 units: running maxima are kept 30 above the scores'
 * maxima, so that each probability is at most 2^-30 and their sum over a
 * sequence's keys (at most 2^30, PA_MAX_SEQLEN; in every warp, lane group
 * and split) at most 1. O's accumulators then stay within max |v|: a V near
 * the largest bf16 or f32 value gives a finite output where the exact one
 * is finite. The factor is a power of two common to O and l, so O / l and
 * lse = m + log2(l) do not change; only probabilities below 2^-96 of the
 * largest, far under f32's rounding, go to zero. None for f16: its largest
 * value cannot overflow an f32 sum, and P, cast to f16 for the P V product,
 * would lose its small values to the shift. The tensor-core prefill kernels
 * keep their softmax: the same offset there (an FMA's immediate) made ptxas
 * serialise the wgmmas of the gt = 1 warp-specialised variants
 * (spec/nvrtc_spec.lua), a cost every MHA prefill would pay. */
template <int DT> constexpr float pa_headroom() { return DT == PA_DT_F16 ? 0.f : 30.f; }

/* Max / sum over the 4 lanes of a quad (lanes 4g .. 4g + 3: one row of an
 * m16n8 accumulator fragment). */
PA_DEV float pa_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
PA_DEV float pa_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* lse of row (query qi, head h) of a work item's output from its
 * log2-sum-exp l2 (-inf: the row saw no key), in natural units. */
PA_DEV void pa_store_lse(const pa_attn_params &p, const pa_work &w, int h, int qi, float l2) {
    ((float *)p.lse)[w.lse_start + h * p.lse_head_stride + qi] = l2 == -PA_INF ? -PA_INF : l2 * PA_LN2;
}

/* Element off of out := x: in the dtype DT, or in f32 where p.out_f32 (the
 * cascade's levels: its merge rounds them once, as a plain call would). */
template <int DT> PA_DEV void pa_store_out(const pa_attn_params &p, i64 off, float x) {
    if (DT != PA_DT_F32 && p.out_f32) ((float *)p.out)[off] = x;
    else pa_elem<DT>::store((void *)p.out, off, x);
}

/* Up to 4 floats through L2 only (data another block wrote) */
template <int V> PA_DEV void pa_ld_cg_v(const float *p, float (&x)[V]) {
    if constexpr (V == 4) {
        asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                     : "l"(p));
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) x[i] = pa_ld_cg(p + i);
    }
}

/* The last block of a split group: out/lse of its rows from the nsplit
 * partials. One thread per V elements of a row; the partials are read 8
 * splits at a time, all loads of a batch independent (one L2 round trip per
 * batch, not per split), and merged with a running maximum. */
template <int DT, int V>
__device__ void pa_combine_splits(const pa_attn_params &p, const pa_work &w, int rows, int gt, int hk, int g0) {
    constexpr int BATCH = 8;
    const int D = p.head_dim, H = p.heads, DV = D / V;
    const float *po = (const float *)p.part_o, *pl = (const float *)p.part_lse;
    const i64 split_stride = (i64)w.seqlen_q * H;
    for (int e = threadIdx.x; e < rows * DV; e += blockDim.x) {
        const int r = e / DV, d = (e - r * DV) * V;
        const int qi = w.i0 + r / gt, g = g0 + r % gt;
        if (qi >= w.seqlen_q || g >= p.group) continue;
        const int h = hk * p.group + g;
        const i64 row0 = (w.part_row + qi) * H + h;
        /* (the splits' weights shifted by the headroom: their sum stays <= 1) */
        constexpr float hs = pa_headroom<DT>();
        float m = -PA_INF, l = 0.f, acc[V];
#pragma unroll
        for (int i = 0; i < V; i++) acc[i] = 0.f;
        for (int s0 = 0; s0 < w.nsplit; s0 += BATCH) {
            float ls[BATCH], os[BATCH][V];
#pragma unroll
            for (int b = 0; b < BATCH; b++) {
                const i64 prow = row0 + (i64)(s0 + b) * split_stride;
                ls[b] = -PA_INF;
#pragma unroll
                for (int i = 0; i < V; i++) os[b][i] = 0.f;
                if (s0 + b < w.nsplit) {
                    ls[b] = pa_ld_cg(pl + prow);
                    pa_ld_cg_v<V>(po + prow * D + d, os[b]);
                }
            }
#pragma unroll
            for (int b = 0; b < BATCH; b++) {
                if (ls[b] == -PA_INF) continue; /* that split saw no key of this row */
                const float mn = fmaxf(m, ls[b] + hs);
                const float a = pa_exp2(m - mn), c = pa_exp2(ls[b] - mn); /* m = -inf: a = 0 */
                l = l * a + c;
#pragma unroll
                for (int i = 0; i < V; i++) acc[i] = acc[i] * a + c * os[b][i];
                m = mn;
            }
        }
        const i64 out0 = ((w.q_start + qi) * H + h) * (i64)D + d;
        const float inv = l > 0.f ? 1.f / l : 0.f; /* one reciprocal, not V divisions */
#pragma unroll
        for (int i = 0; i < V; i++) pa_store_out<DT>(p, out0 + i, acc[i] * inv);
        if (d == 0 && p.lse) pa_store_lse(p, w, h, qi, l > 0.f ? m + pa_log2(l) : -PA_INF);
    }
}

/* Row r of a block merged over the n partial states of its warps (or lane
 * groups): (m, l) of part y at ml[(r * n + y) * 2], base 2. Its log2-sum-exp
 * (-inf when no part saw a key), and one element of its normalised output
 * from the parts' unnormalised values part(y). */
PA_DEV float pa_merged_lse2(const float *ml, int n, int r) {
    float mx = -PA_INF;
    for (int y = 0; y < n; y++) mx = fmaxf(mx, ml[(r * n + y) * 2]);
    if (mx == -PA_INF) return -PA_INF;
    float l = 0.f;
    for (int y = 0; y < n; y++) l += ml[(r * n + y) * 2 + 1] * pa_exp2(ml[(r * n + y) * 2] - mx);
    return mx + pa_log2(l);
}
template <typename F> PA_DEV float pa_merged_o(const float *ml, int n, int r, F part) {
    float mx = -PA_INF;
    for (int y = 0; y < n; y++) mx = fmaxf(mx, ml[(r * n + y) * 2]);
    if (mx == -PA_INF) return 0.f;
    float l = 0.f, acc = 0.f;
    for (int y = 0; y < n; y++) {
        const float wt = pa_exp2(ml[(r * n + y) * 2] - mx);
        l += ml[(r * n + y) * 2 + 1] * wt;
        acc += part(y) * wt;
    }
    return acc / l;
}

/* A split's partial rows are written (by every thread of the block): publish
 * them and count the arrival; the last block of the group combines. */
template <int DT>
__device__ void pa_split_arrival(const pa_attn_params &p, const pa_work &w, int rows, int gt, int hk, int g0,
                                 int head_tile, int *s_flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 *counter = (u32 *)p.counters + w.counter + head_tile;
        const u32 prev = atomicAdd(counter, 1u);
        const bool last = prev == (u32)(w.nsplit - 1);
        if (last) *counter = 0; /* ready for the next call: nobody else touches it now */
        *s_flag = last;
    }
    __syncthreads();
    if (!*s_flag) return;
    __threadfence();
    if (p.head_dim % 4 == 0) pa_combine_splits<DT, 4>(p, w, rows, gt, hk, g0);
    else pa_combine_splits<DT, 1>(p, w, rows, gt, hk, g0);
}

/* get_o(r, d): normalised output of row r, element d; get_lse2(r): its
 * log2-sum-exp (-inf when the row saw no key). s_flag: one shared int. */
template <int DT, typename FO, typename FL>
__device__ void pa_write_rows(const pa_attn_params &p, const pa_work &w, int rows, int gt, int hk, int g0, int head_tile, FO get_o,
                              FL get_lse2, int *s_flag) {
    const int D = p.head_dim, H = p.heads;
    const int total = rows * D;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        const int r = e / D, d = e - r * D;
        const int qi = w.i0 + r / gt, g = g0 + r % gt;
        if (qi >= w.seqlen_q || g >= p.group) continue;
        const int h = hk * p.group + g;
        const float o = get_o(r, d);
        if (w.nsplit == 1) {
            pa_store_out<DT>(p, ((w.q_start + qi) * H + h) * (i64)D + d, o);
            if (d == 0 && p.lse) pa_store_lse(p, w, h, qi, get_lse2(r));
        } else {
            const i64 prow = (w.part_row + (i64)w.split * w.seqlen_q + qi) * H + h;
            ((float *)p.part_o)[prow * D + d] = o;
            if (d == 0) ((float *)p.part_lse)[prow] = get_lse2(r);
        }
    }
    if (w.nsplit > 1) pa_split_arrival<DT>(p, w, rows, gt, hk, g0, head_tile, s_flag);
}

/* Absolute byte offset of key tok's row in either cache (64-bit, from the
 * page id itself: never a difference between pages); head_bytes: the kv
 * head's offset within a row; ESZ: bytes an element (2, or 1 for fp8).
 * PAGE == -1: contiguous caches. */
template <int PAGE, int ESZ = 2>
PA_DEV i64 pa_key_offset(const pa_attn_params &p, const pa_work &w, int tok, int page, int ps, i64 head_bytes) {
    const i64 row = PAGE == -1 ? (i64)w.cache_row * p.page_stride + (i64)tok * p.row_stride
                               : (i64)page * p.page_stride + (i64)(tok - tok / ps * ps) * p.row_stride;
    return row * ESZ + head_bytes;
}

/* The scales of kv head hk's fp8 cache entries (1 for other caches: the
 * host passes 1 and no per-head arrays). */
PA_DEV float pa_k_scale(const pa_attn_params &p, int hk) {
    return p.k_scales ? ((const float *)p.k_scales)[hk] : p.k_scale;
}
PA_DEV float pa_v_scale(const pa_attn_params &p, int hk) {
    return p.v_scales ? ((const float *)p.v_scales)[hk] : p.v_scale;
}

/* Loads the page ids of keys [k0, k1) of sequence b into s_pages (one per
 * page, from the block table's row), never reading the table past the last
 * page that holds a key; returns that row's index of s_pages[0]. PAGE == -1: a
 * contiguous cache, nothing to load. Threads 0 to NTHREADS - 1 take part.
 * ASYNC: by cp.async (4 bytes each), every thread's copies in flight at once;
 * the caller commits, waits and synchronises. from: the first `from` ids are
 * there already (s_pages[0, from) untouched). */
template <int PAGE, int NTHREADS, bool ASYNC = false>
__device__ int pa_load_page_ids(const pa_attn_params &p, int b, int k0, int k1, int ps, int *s_pages, int from = 0) {
    int first_page = 0;
    if (PAGE != -1 && k1 > k0) {
        first_page = k0 / ps;
        const int npages = (k1 - 1) / ps - first_page + 1;
        const int *bt = (const int *)p.block_table + (i64)b * p.bt_stride + first_page;
        for (int i = from + (int)threadIdx.x; i < npages; i += NTHREADS) {
            if (ASYNC)
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(pa_smem_addr(s_pages + i)), "l"(bt + i)
                             : "memory");
            else s_pages[i] = bt[i];
        }
    }
    return first_page;
}

#endif /* PA_EMBED_ONLY */
#endif /* PA_ATTN_COMMON_CUH */
