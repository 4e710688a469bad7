/*
 * merge.cu -- the cascade's two small kernels: attention states merged by
 * their log-sum-exp (pa_merge_states: one warp a (row, head), a lane a state
 * for the weights, the lanes across head_dim for the values), and rows of q
 * copied into the order of the shared level, rotated where asked
 * (pa_gather_rows: one warp a row's head). Shape constant: PA_DTYPE.
 */
#ifndef PA_EMBED_ONLY
#include "common.cuh"

#ifndef PA_DTYPE
#define PA_DTYPE PA_DT_BF16
#endif
typedef pa_elem<PA_DTYPE> E;

#define WARPS 4 /* a block's warps */

/* out = sum_s w_s o_s with w_s = exp(lse_s - m) / sum_t exp(lse_t - m),
 * m = max lse_s; an empty state (lse -inf, or no row) has weight 0 and its
 * o is not read; all empty: zeros and -inf. The weights are normalised
 * before the sum and the result kept between the states' values, so it is
 * finite wherever they are (a sum of weights that rounds past 1 took
 * FLT_MAX to inf). Every lane reads what it writes (its elements; lane 0
 * the lse after the warp's shuffles), so out may be a state's o where that
 * state's row is the output row. The
 * parameters stay in the constant bank (__grid_constant__): a lane indexes
 * the states with its lane number. */
extern "C" __global__ void __launch_bounds__(WARPS * 32) pa_merge_states(const __grid_constant__ pa_merge_kparams p) {
    const int lane = threadIdx.x & 31;
    const i64 pairs = p.rows * p.heads;
    const i64 stride = (i64)gridDim.x * WARPS;
    for (i64 item = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); item < pairs; item += stride) {
        const i64 r = item / p.heads;
        const int h = (int)(item - r * p.heads);
        const i64 ro = p.out_rows ? (i64)((const int *)p.out_rows)[r] : r; /* the output row */
        /* lane s: state s's row and lse */
        i64 row = -1;
        float lse = -PA_INF;
        if (lane < p.num_states) {
            const pa_merge_kstate &st = p.states[lane];
            row = st.rows ? (i64)((const int *)st.rows)[r] : r;
            if (row >= 0)
                lse = ((const float *)st.lse)[row / st.lse_seq * p.heads * st.lse_seq + (i64)h * st.lse_seq +
                                              row % st.lse_seq];
        }
        const bool nan = __any_sync(0xffffffffu, lse != lse);
        float m = lse;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float w = (lse == -PA_INF || m == -PA_INF) ? 0.f : expf(lse - m);
        float sum = w;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const float ws = w * inv;
        const i64 out_off = (ro * p.heads + h) * (i64)p.head_dim;
        /* a lane's elements d = 32 c + lane, c < DC: each state's loads all
         * out before its sums (a round trip a state, not one a state and 32
         * elements) */
        constexpr int DC = 256 / 32; /* (head dims up to 256: the core's PA_MAX_HEAD_DIM) */
        float acc[DC], lo[DC], hi[DC];
#pragma unroll
        for (int c = 0; c < DC; c++) acc[c] = 0.f, lo[c] = PA_INF, hi[c] = -PA_INF;
        for (int s = 0; s < p.num_states; s++) {
            const float wt = __shfl_sync(0xffffffffu, ws, s);
            const i64 rs = __shfl_sync(0xffffffffu, row, s);
            if (wt == 0.f) continue; /* (uniform over the warp) */
            const i64 at0 = (rs * p.heads + h) * (i64)p.head_dim + lane;
            float v[DC];
#pragma unroll
            for (int c = 0; c < DC; c++)
                if (32 * c + lane < p.head_dim)
                    v[c] = p.states_f32 ? ((const float *)p.states[s].o)[at0 + 32 * c]
                                        : E::load((const void *)p.states[s].o, at0 + 32 * c);
#pragma unroll
            for (int c = 0; c < DC; c++)
                if (32 * c + lane < p.head_dim) {
                    acc[c] += wt * v[c];
                    lo[c] = fminf(lo[c], v[c]);
                    hi[c] = fmaxf(hi[c], v[c]);
                }
        }
#pragma unroll
        for (int c = 0; c < DC; c++) {
            const int d = 32 * c + lane;
            if (d >= p.head_dim) break;
            float x = acc[c];
            if (nan) x = __int_as_float(0x7fc00000);
            else if (m == -PA_INF) x = 0.f;
            else if (x == x) x = x < lo[c] ? lo[c] : (x > hi[c] ? hi[c] : x); /* (NaN from an o stays) */
            E::store((void *)p.out, out_off + d, x);
        }
        __syncwarp();
        if (lane == 0 && p.out_lse) {
            const float l = nan ? __int_as_float(0x7fc00000) : m == -PA_INF ? -PA_INF : m + logf(sum);
            ((float *)p.out_lse)[ro / p.out_lse_seq * p.heads * p.out_lse_seq + (i64)h * p.out_lse_seq +
                                 ro % p.out_lse_seq] = l;
        }
    }
}

/* One warp a (row, head): head_dim elements copied (16 bytes a lane where
 * the row's head is 16-byte aligned: a warp a whole row, an element a lane
 * at a time, was latency-bound at 50 us for 256 rows of 32 x 128 bf16), or
 * rotated in double (as the host rotates: pairs (2j, 2j + 1) interleaved,
 * else (j, j + rotary_dim / 2); dims past rotary_dim copied) and rounded
 * once to the dtype. */
extern "C" __global__ void __launch_bounds__(WARPS * 32) pa_gather_rows(const pa_rows_kparams p) {
    const int lane = threadIdx.x & 31;
    const i64 stride = (i64)gridDim.x * WARPS;
    const i64 items = p.rows * p.heads;
    const int D = p.head_dim;
    for (i64 item = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5); item < items; item += stride) {
        const i64 r = item / p.heads;
        const int h = (int)(item - r * p.heads);
        const i64 s = p.row_map ? (i64)((const int *)p.row_map)[r] : r;
        const typename E::T *src = (const typename E::T *)p.src + (s * p.heads + h) * D;
        typename E::T *dst = (typename E::T *)p.dst + (r * p.heads + h) * D;
        const int first = p.rot_cos ? p.rotary_dim : 0; /* the dims copied as they are */
        if (first == 0 && ((D * (int)sizeof(typename E::T)) & 15) == 0 &&
            (((unsigned long long)src | (unsigned long long)dst) & 15) == 0) {
            const int n16 = D * (int)sizeof(typename E::T) / 16;
            for (int e = lane; e < n16; e += 32) ((uint4 *)dst)[e] = ((const uint4 *)src)[e];
            continue;
        }
        for (int e = first + lane; e < D; e += 32) dst[e] = src[e];
        if (!p.rot_cos) continue;
        const i64 pos = ((const int *)p.pos)[p.pos_index ? (i64)((const int *)p.pos_index)[s] : s];
        const int half = p.rotary_dim / 2;
        for (int d = lane; d < p.rotary_dim; d += 32) {
            /* the pair of d, and which of the two d is */
            const int j = p.interleaved ? d / 2 : (d < half ? d : d - half);
            const bool second = p.interleaved ? (d & 1) : d >= half;
            const int i0 = p.interleaved ? 2 * j : j, i1 = p.interleaved ? 2 * j + 1 : j + half;
            const double x0 = E::load(src, i0), x1 = E::load(src, i1);
            const double c = pa_load_any((const void *)p.rot_cos, p.rot_dtype, pos * half + j);
            const double sn = pa_load_any((const void *)p.rot_sin, p.rot_dtype, pos * half + j);
            pa_store_f64<PA_DTYPE>((void *)dst, d, second ? x0 * sn + x1 * c : x0 * c - x1 * sn);
        }
    }
}

#endif /* PA_EMBED_ONLY */
