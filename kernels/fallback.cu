/*
 * fallback.cu -- attention for every problem the decode kernel does not take
 * (long queries, head dims that are not a multiple of 8), until the
 * tensor-core prefill lands: simple and correct rather than fast.
 *
 * A block takes up to ROWS (query, head) rows of one kv head -- q_tile
 * queries x heads_per_tile heads of the GQA group -- and walks the keys of its
 * work item KT at a time: K and V rows gathered into shared memory (each row's
 * page resolved from the block table as an absolute 64-bit offset), scores,
 * online softmax, P.V, all in f32 in shared memory. Split-KV and the combine
 * are pa_write_rows' (fused). Head dim at run time (<= 256).
 *
 * Defines: PA_DTYPE (q and out), PA_KV (the caches': PA_DTYPE when absent,
 * or an fp8 dtype: keys k_cache x k_scale, values v_cache x v_scale).
 */
#ifndef PA_EMBED_ONLY
#include "attn_common.cuh"

#ifndef PA_DTYPE
#error "PA_DTYPE must be defined"
#endif

#define NTHREADS 128
#define ROWS 16
#define KT 32

#ifndef PA_KV
#define PA_KV PA_DTYPE
#endif

typedef pa_elem<PA_DTYPE> E;
typedef pa_elem<PA_KV> EKV; /* the caches' elements */
#define FP8 PA_DT_IS_FP8(PA_KV)

/* Dynamic shared memory (floats): Q[ROWS][D], K[KT][D+1] (padded: the score
 * loop reads K down a column), V[KT][D], S[ROWS][KT], O[ROWS][D]. */
extern "C" __constant__ int pa_fallback_info[3] = {NTHREADS, ROWS, KT};

extern "C" __global__ void __launch_bounds__(NTHREADS) pa_attend(const pa_attn_params p) {
    extern __shared__ __align__(16) float sm[];
    __shared__ pa_work w;
    __shared__ float s_m[ROWS], s_l[ROWS], s_alpha[ROWS], s_slope[ROWS];
    __shared__ int s_lo[ROWS], s_hi[ROWS], s_flag;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int D = p.head_dim, G = p.group, gt = p.heads_per_tile;
    const int head_tile = blockIdx.x % p.head_tiles;
    if (tid == 0) w = ((const pa_work *)p.work)[blockIdx.x / p.head_tiles];
    __syncthreads();
    const int tiles_per_group = (G + gt - 1) / gt;
    const int hk = head_tile / tiles_per_group;
    const int g0 = (head_tile - hk * tiles_per_group) * gt;
    const int rows = p.q_tile * gt;

    float *Q = sm;
    float *K = Q + ROWS * D;
    float *V = K + KT * (D + 1);
    float *S = V + KT * D;
    float *O = S + ROWS * KT;

    /* rows: key range, ALiBi slope, q (scaled), empty state */
    if (tid < ROWS) {
        const int r = tid, qi = w.i0 + r / gt, g = g0 + r % gt;
        int lo = 0, hi = 0;
        float slope = 0.f;
        if (r < rows && qi < w.seqlen_q && g < G) {
            pa_mask_range(p.window_left, p.window_right, w.seqlen_q, w.seqlen_k, qi, &lo, &hi);
            lo = max(lo, w.k0);
            hi = min(hi, w.k1);
            if (p.alibi) slope = ((const float *)p.alibi)[(i64)w.b * p.alibi_batch_stride + hk * G + g];
        }
        s_lo[r] = lo;
        s_hi[r] = hi;
        s_slope[r] = slope;
        s_m[r] = -PA_INF;
        s_l[r] = 0.f;
    }
    for (int e = tid; e < ROWS * D; e += NTHREADS) {
        const int r = e / D, d = e - r * D, qi = w.i0 + r / gt, g = g0 + r % gt;
        float v = 0.f;
        if (r < rows && qi < w.seqlen_q && g < G) {
            const i64 off = ((w.q_start + qi) * p.heads + hk * G + g) * (i64)D + d;
            v = p.q_f32 ? ((const float *)p.q)[off] : E::load((const void *)p.q, off);
        }
        /* (an fp8 cache's key scale goes into q, its value scale into the output) */
        Q[e] = v * (FP8 ? p.scale * pa_k_scale(p, hk) : p.scale);
        O[e] = 0.f;
    }
    __syncthreads();

    const int *bt = p.block_table ? (const int *)p.block_table + (i64)w.b * p.bt_stride : 0;
    for (int kc = w.k0; kc < w.k1; kc += KT) {
        /* gather KT keys: one warp per key row, its page resolved here */
        for (int t = warp; t < KT; t += NTHREADS / 32) {
            const int tok = kc + t;
            if (tok < w.k1) {
                i64 off;
                if (bt) {
                    const int pg = tok / p.page_size;
                    off = (i64)bt[pg] * p.page_stride + (i64)(tok - pg * p.page_size) * p.row_stride;
                } else {
                    off = (i64)w.cache_row * p.page_stride + (i64)tok * p.row_stride;
                }
                off += (i64)hk * D;
                for (int d = lane; d < D; d += 32) {
                    K[t * (D + 1) + d] = EKV::load((const void *)p.k_cache, off + d);
                    V[t * D + d] = EKV::load((const void *)p.v_cache, off + d);
                }
            } else {
                for (int d = lane; d < D; d += 32) {
                    K[t * (D + 1) + d] = 0.f;
                    V[t * D + d] = 0.f;
                }
            }
        }
        __syncthreads();
        /* scores, base 2 */
        for (int e = tid; e < ROWS * KT; e += NTHREADS) {
            const int r = e / KT, t = e - r * KT, tok = kc + t;
            float x = -PA_INF;
            if (tok >= s_lo[r] && tok < s_hi[r]) {
                const float *qr = Q + r * D, *kr = K + t * (D + 1);
                float a = 0.f;
                for (int d = 0; d < D; d++) a = fmaf(qr[d], kr[d], a);
                if (p.softcap > 0.f) a = p.softcap * tanhf(a / p.softcap);
                if (p.alibi) {
                    const int qi = w.i0 + r / gt;
                    a -= s_slope[r] * fabsf((float)(qi + w.seqlen_k - w.seqlen_q - tok));
                }
                x = a * PA_LOG2E;
            }
            S[e] = x;
        }
        __syncthreads();
        /* online softmax, one thread per row */
        if (tid < ROWS) {
            const int r = tid;
            float bx = -PA_INF;
            for (int t = 0; t < KT; t++) bx = fmaxf(bx, S[r * KT + t]);
            const float mx = fmaxf(s_m[r], bx + pa_headroom<PA_DTYPE>());
            if (mx == -PA_INF) {
                for (int t = 0; t < KT; t++) S[r * KT + t] = 0.f;
                s_alpha[r] = 1.f;
            } else {
                const float alpha = pa_exp2(s_m[r] - mx);
                float sum = 0.f;
                for (int t = 0; t < KT; t++) {
                    const float pt = pa_exp2(S[r * KT + t] - mx);
                    S[r * KT + t] = pt;
                    sum += pt;
                }
                s_l[r] = s_l[r] * alpha + sum;
                s_m[r] = mx;
                s_alpha[r] = alpha;
            }
        }
        __syncthreads();
        for (int e = tid; e < ROWS * D; e += NTHREADS) {
            const int r = e / D, d = e - r * D;
            float acc = O[e] * s_alpha[r];
            for (int t = 0; t < KT; t++) acc = fmaf(S[r * KT + t], V[t * D + d], acc);
            O[e] = acc;
        }
        __syncthreads();
    }

    auto o_of = [&](int r, int d) {
        if (FP8) return s_l[r] > 0.f ? O[r * D + d] / s_l[r] * pa_v_scale(p, hk) : 0.f;
        return s_l[r] > 0.f ? O[r * D + d] / s_l[r] : 0.f;
    };
    auto lse2_of = [&](int r) { return s_l[r] > 0.f ? s_m[r] + pa_log2(s_l[r]) : -PA_INF; };
    pa_write_rows<PA_DTYPE>(p, w, rows, gt, hk, g0, head_tile, o_of, lse2_of, &s_flag);
}

#endif /* PA_EMBED_ONLY */
