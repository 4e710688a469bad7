/*
 * prefill_common.cuh -- what the two prefill kernels (prefill.cu on mma.sync,
 * prefill_wgmma.cu on Hopper's wgmma) share: the rows of a tile, the online
 * softmax on accumulator fragments, and the epilogue's staging.
 *
 * Both hold S and O in the m16n8 accumulator layout: per 8-column group n,
 * x[n][0..1] are row g (columns 2 t4, 2 t4 + 1) and x[n][2..3] row g + 8 of
 * the warp's 16 rows (g = lane / 4, t4 = lane % 4). Rows of a block are
 * (query, head) pairs: row r = query w.i0 + r / GT, head g0 + r % GT.
 * The including file defines PA_DTYPE and PA_NATURAL.
 */
#ifndef PA_PREFILL_COMMON_CUH
#define PA_PREFILL_COMMON_CUH
#ifndef PA_EMBED_ONLY

#include "attn_common.cuh"
#include "mma.cuh"

/* Key ranges of the block's rows (clipped to the item's [k0, k1); empty for
 * padding rows) and, when natural, their ALiBi slopes (base 2); by threads
 * tid = 0 .. nthr - 1 (default: the whole block). */
template <int BM, int GT, int NATURAL>
__device__ void pa_prefill_rows(const pa_attn_params &p, const pa_work &w, int hk, int g0, int *s_lo, int *s_hi,
                                float *s_slope, int tid = -1, int nthr = 0) {
    constexpr int ROWS = BM / GT * GT;
    if (tid < 0) {
        tid = threadIdx.x;
        nthr = blockDim.x;
    }
    for (int r = tid; r < BM; r += nthr) {
        const int qi = w.i0 + r / GT;
        const bool in = r < ROWS && qi < w.seqlen_q;
        int lo = 0, hi = 0;
        if (in) {
            pa_mask_range(p.window_left, p.window_right, w.seqlen_q, w.seqlen_k, qi, &lo, &hi);
            lo = max(lo, w.k0);
            hi = min(hi, w.k1);
            if (hi < lo) hi = lo;
        }
        s_lo[r] = lo;
        s_hi[r] = hi;
        if (NATURAL)
            s_slope[r] = p.alibi && in
                             ? ((const float *)p.alibi)[(i64)w.b * p.alibi_batch_stride + hk * p.group + g0 + r % GT] *
                                   PA_LOG2E
                             : 0.f;
    }
}

/* The Q tile: row r of the block (query w.i0 + r / GT, head g0 + r % GT), 16-byte
 * chunk c, to smem_at(r, c); padding rows and queries past seqlen_q are
 * zeros. The rotated f32 q is rounded to the input type and stored; the
 * input-type q is copied with cp.async (the caller commits the group). */
template <int BM, int GT, int D, typename F>
__device__ void pa_prefill_load_q(const pa_attn_params &p, const pa_work &w, int hk, int g0, int tid, int nthr,
                                  F smem_at) {
    constexpr int CPR = D / 8, ROWS = BM / GT * GT;
    for (int e = tid; e < BM * CPR; e += nthr) {
        const int r = e / CPR, c = e - r * CPR, qi = w.i0 + r / GT;
        const bool in = r < ROWS && qi < w.seqlen_q;
        const i64 off = in ? ((w.q_start + qi) * p.heads + hk * p.group + g0 + r % GT) * (i64)D + c * 8 : 0;
        u8 *dst = smem_at(r, c);
        if (p.q_f32) {
            float x[8];
            pa_load8_or_zero<PA_DT_F32>(in, (const float *)p.q + off, x);
            *(uint4 *)dst = make_uint4(pack2(x[0], x[1]), pack2(x[2], x[3]), pack2(x[4], x[5]), pack2(x[6], x[7]));
        } else {
            pa_cp_async16(dst, (const u16 *)p.q + off, in);
        }
    }
}

/* A lane's two rows (R0 = its warp's first row + g, R1 = R0 + 8) and the
 * running softmax state. Scores become base-2 exponents: x * c2 unless
 * NATURAL (then softcap and ALiBi apply on natural units first, c2 = 1). */
struct pa_lane_rows {
    int lo0, hi0, lo1, hi1;
    int wlo, whi;     /* the warp's tightest range: tiles inside it need no mask */
    int diag0, diag1; /* ALiBi: key position of each row's query */
    float slope0, slope1;
    float c2, c2b;    /* rows R0, R1: scale * log2(e), or 1 when natural (one value
                         but in prefill_f8.cu, whose rows each carry q's own scale) */
    float m0, m1;     /* running maxima (score units) */
    float l0, l1;     /* this lane's part of the row sums */
};

template <int GT, int NATURAL>
PA_DEV pa_lane_rows pa_lane_rows_init(const pa_attn_params &p, const pa_work &w, int R0, const int *s_lo,
                                      const int *s_hi, const float *s_slope) {
    pa_lane_rows r;
    const int R1 = R0 + 8;
    r.lo0 = s_lo[R0];
    r.hi0 = s_hi[R0];
    r.lo1 = s_lo[R1];
    r.hi1 = s_hi[R1];
    r.wlo = max(r.lo0, r.lo1);
    r.whi = min(r.hi0, r.hi1);
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
        r.wlo = max(r.wlo, __shfl_xor_sync(0xffffffffu, r.wlo, x));
        r.whi = min(r.whi, __shfl_xor_sync(0xffffffffu, r.whi, x));
    }
    r.diag0 = w.i0 + R0 / GT + w.seqlen_k - w.seqlen_q;
    r.diag1 = w.i0 + R1 / GT + w.seqlen_k - w.seqlen_q;
    r.slope0 = NATURAL ? s_slope[R0] : 0.f;
    r.slope1 = NATURAL ? s_slope[R1] : 0.f;
    r.c2 = r.c2b = NATURAL ? 1.f : p.scale * PA_LOG2E;
    r.m0 = r.m1 = -PA_INF;
    r.l0 = r.l1 = 0.f;
    return r;
}

/* One key tile [kt, kt + 8 NG) of scores s (raw Q K^T): transforms and masks
 * them, updates the maxima and rescales the row sums; returns in e0 / e1 what
 * to subtract from x * c2 for the exponent of P, in alpha0 / alpha1 the factor
 * for O, and whether any row of the warp needs it (else both are exactly 1). */
/* MASK: 2 = test per warp whether the tile needs the row ranges (the
 * compiler predicates the range checks into every tile then), 1 = apply
 * them, 0 = the caller knows every row takes the whole tile. */
template <int NG, int NATURAL, int MASK = 2>
PA_DEV bool pa_softmax_scores(const pa_attn_params &p, pa_lane_rows &r, float (&s)[NG][4], int kt, float &e0,
                              float &e1, float &alpha0, float &alpha1) {
    const int t4 = (threadIdx.x & 31) & 3;
    const bool masked = MASK == 1 || (MASK == 2 && (kt < r.wlo || kt + 8 * NG > r.whi)); /* warp-uniform */
    float mx0 = r.m0, mx1 = r.m1;
#pragma unroll
    for (int n = 0; n < NG; n++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int tok = kt + n * 8 + 2 * t4 + (j & 1);
            const bool upper = j >= 2;
            float x = s[n][j];
            if (NATURAL) {
                x *= p.scale;
                if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
                x *= PA_LOG2E;
                if (p.alibi) x -= (upper ? r.slope1 : r.slope0) * fabsf((float)((upper ? r.diag1 : r.diag0) - tok));
            }
            if (masked) {
                const bool ok = upper ? (tok >= r.lo1 && tok < r.hi1) : (tok >= r.lo0 && tok < r.hi0);
                x = ok ? x : -PA_INF;
            }
            s[n][j] = x;
            if (upper) mx1 = fmaxf(mx1, x);
            else mx0 = fmaxf(mx0, x);
        }
    }
    mx0 = pa_quad_max(mx0);
    mx1 = pa_quad_max(mx1);
    /* -inf maxima (nothing seen yet) subtract 0: every exponent is -inf -> 0 */
    e0 = mx0 == -PA_INF ? 0.f : mx0 * r.c2;
    e1 = mx1 == -PA_INF ? 0.f : mx1 * r.c2b;
    /* alpha: exactly 1 while the maxima stay, 0 from -inf */
    alpha0 = alpha1 = 1.f;
    const bool rescale = __any_sync(0xffffffffu, mx0 != r.m0 || mx1 != r.m1);
    if (rescale) {
        alpha0 = pa_exp2(r.m0 * r.c2 - e0);
        alpha1 = pa_exp2(r.m1 * r.c2b - e1);
        r.l0 *= alpha0;
        r.l1 *= alpha1;
    }
    r.m0 = mx0;
    r.m1 = mx1;
    return rescale;
}

template <int N> PA_DEV void pa_zero(float (&a)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++) a[n][0] = a[n][1] = a[n][2] = a[n][3] = 0.f;
}

template <int NO> PA_DEV void pa_rescale_o(float (&o)[NO][4], float alpha0, float alpha1) {
#pragma unroll
    for (int n = 0; n < NO; n++) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
    }
}

/* pa_softmax_scores, and O rescaled at once (O not in flight). */
template <int NG, int NO, int NATURAL>
PA_DEV void pa_softmax_tile(const pa_attn_params &p, pa_lane_rows &r, float (&s)[NG][4], float (&o)[NO][4], int kt,
                            float &e0, float &e1) {
    float alpha0, alpha1;
    if (pa_softmax_scores<NG, NATURAL>(p, r, s, kt, e0, e1, alpha0, alpha1)) pa_rescale_o(o, alpha0, alpha1);
}

/* P = 2^(x c2 - e) in place of the scores, adding to the row sums. */
template <int NG> PA_DEV void pa_p_exp(pa_lane_rows &r, float (&s)[NG][4], float e0, float e1) {
#pragma unroll
    for (int n = 0; n < NG; n++) {
        s[n][0] = pa_exp2(fmaf(s[n][0], r.c2, -e0));
        s[n][1] = pa_exp2(fmaf(s[n][1], r.c2, -e0));
        s[n][2] = pa_exp2(fmaf(s[n][2], r.c2b, -e1));
        s[n][3] = pa_exp2(fmaf(s[n][3], r.c2b, -e1));
        r.l0 += s[n][0] + s[n][1];
        r.l1 += s[n][2] + s[n][3];
    }
}

/* P (from pa_p_exp) of key columns 16 ks .. 16 ks + 15 as the A fragment
 * (input type) of O += P V. */
template <int NG> PA_DEV void pa_pack_p(const float (&s)[NG][4], int ks, u32 (&a)[4]) {
    a[0] = pack2(s[2 * ks][0], s[2 * ks][1]);
    a[1] = pack2(s[2 * ks][2], s[2 * ks][3]);
    a[2] = pack2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
    a[3] = pack2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
}

/* P of key columns 16 ks .. 16 ks + 15 as the A fragment (input type) of
 * O += P V, adding to the row sums. */
template <int NG>
PA_DEV void pa_p_fragment(pa_lane_rows &r, const float (&s)[NG][4], int ks, float e0, float e1, u32 (&a)[4]) {
    float pr[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        pr[h][0] = pa_exp2(fmaf(s[2 * ks + h][0], r.c2, -e0));
        pr[h][1] = pa_exp2(fmaf(s[2 * ks + h][1], r.c2, -e0));
        pr[h][2] = pa_exp2(fmaf(s[2 * ks + h][2], r.c2b, -e1));
        pr[h][3] = pa_exp2(fmaf(s[2 * ks + h][3], r.c2b, -e1));
        r.l0 += pr[h][0] + pr[h][1];
        r.l1 += pr[h][2] + pr[h][3];
    }
    a[0] = pack2(pr[0][0], pr[0][1]);
    a[1] = pack2(pr[0][2], pr[0][3]);
    a[2] = pack2(pr[1][0], pr[1][1]);
    a[3] = pack2(pr[1][2], pr[1][3]);
}

/* The epilogue's start: the lane's row sums completed over its quad, and
 * the factors that normalise its rows of O (0 for a row that saw no key). */
PA_DEV void pa_lane_rows_end(pa_lane_rows &r, float &inv0, float &inv1) {
    r.l0 = pa_quad_sum(r.l0);
    r.l1 = pa_quad_sum(r.l1);
    inv0 = r.l0 > 0.f ? 1.f / r.l0 : 0.f;
    inv1 = r.l1 > 0.f ? 1.f / r.l1 : 0.f;
}
/* Then the log2-sum-exp of row R0 (k = 0) or R0 + 8 (k = 1); -inf: no key. */
PA_DEV float pa_lane_lse2(const pa_lane_rows &r, int k) {
    const float m = k ? r.m1 : r.m0;
    return m == -PA_INF ? -PA_INF : m * (k ? r.c2b : r.c2) + pa_log2(k ? r.l1 : r.l0);
}

/* Epilogue: the lane's rows of O, normalised, into s_o (f32, row stride
 * ostride) and their log2-sum-exp into s_lse2 (-inf: no key). */
template <int NO>
PA_DEV void pa_stage_rows(pa_lane_rows &r, const float (&o)[NO][4], int R0, float *s_o, int ostride, float *s_lse2) {
    const int t4 = (threadIdx.x & 31) & 3, R1 = R0 + 8;
    float inv0, inv1;
    pa_lane_rows_end(r, inv0, inv1);
#pragma unroll
    for (int n = 0; n < NO; n++) {
        const int col = n * 8 + 2 * t4;
        *(float2 *)(s_o + R0 * ostride + col) = make_float2(o[n][0] * inv0, o[n][1] * inv0);
        *(float2 *)(s_o + R1 * ostride + col) = make_float2(o[n][2] * inv1, o[n][3] * inv1);
    }
    if (t4 == 0) {
        s_lse2[R0] = pa_lane_lse2(r, 0);
        s_lse2[R1] = pa_lane_lse2(r, 1);
    }
}

/* The epilogue's write for a block that is its rows' only split, by threads
 * tid0 = 0 .. nthr - 1 of the block (a subset, e.g. the consumer warps of a
 * warp-specialised kernel): out from s_o (f32, normalised, row stride
 * ostride), 8 elements per 16-byte store where out is aligned, and lse from
 * s_lse2 (log2 units, -inf: no key). Rows as pa_write_rows. */
template <int DT, int D, int GT>
__device__ void pa_write_rows_single(const pa_attn_params &p, const pa_work &w, int rows, int hk, int g0,
                                     const float *s_o, int ostride, const float *s_lse2, int tid0, int nthr) {
    constexpr int C = D / 8;
    static_assert(D % 8 == 0, "head dim");
    const bool vec = (p.out & 15) == 0;
    for (int e = tid0; e < rows * C; e += nthr) {
        const int r = e / C, c = e - r * C, qi = w.i0 + r / GT;
        if (qi >= w.seqlen_q) continue;
        const int h = hk * p.group + g0 + r % GT;
        const float *src = s_o + r * ostride + c * 8;
        const i64 dst = ((w.q_start + qi) * p.heads + h) * (i64)D + c * 8;
        if (DT != PA_DT_F32 && p.out_f32) {
            if (vec) {
                *(float4 *)((float *)p.out + dst) = *(const float4 *)src;
                *(float4 *)((float *)p.out + dst + 4) = *(const float4 *)(src + 4);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) ((float *)p.out)[dst + j] = src[j];
            }
        } else if (vec) {
            const float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
            *(uint4 *)((u16 *)p.out + dst) = make_uint4(pack2(a.x, a.y), pack2(a.z, a.w), pack2(b.x, b.y), pack2(b.z, b.w));
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) pa_elem<DT>::store((void *)p.out, dst + j, src[j]);
        }
        if (c == 0 && p.lse) pa_store_lse(p, w, h, qi, s_lse2[r]);
    }
}

/* The prefill epilogue's write of a block's rows from s_o (f32, normalised,
 * row stride ostride) and s_lse2: out/lse directly when the block is its
 * rows' only split, else the split's partial and the fused combine. */
template <int DT, int D, int GT>
__device__ void pa_prefill_write(const pa_attn_params &p, const pa_work &w, int rows, int hk, int g0, int head_tile,
                                 const float *s_o, int ostride, const float *s_lse2, int nthreads, int *s_flag) {
    if (w.nsplit == 1)
        pa_write_rows_single<DT, D, GT>(p, w, rows, hk, g0, s_o, ostride, s_lse2, threadIdx.x, nthreads);
    else
        pa_write_rows<DT>(
            p, w, rows, GT, hk, g0, head_tile, [&](int r, int d) { return s_o[r * ostride + d]; },
            [&](int r) { return s_lse2[r]; }, s_flag);
}

#endif /* PA_EMBED_ONLY */
#endif /* PA_PREFILL_COMMON_CUH */
