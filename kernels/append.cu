/*
 * append.cu -- rotary append, one pass: each new k row is rotated (RoPE,
 * interleaved GPT-J pairs or GPT-NeoX halves, rotary_dim <= head_dim) and
 * written with its v row into the cache slot of its position; each q row is
 * rotated into an f32 copy that the attention kernel reads instead of q.
 *
 * One warp per token (or per share of its heads, `split` warps a token,
 * when there are few tokens): its sequence is found once (a 32-way search of
 * the sequences' prefixes, one round of loads per 32x narrowing) and so is
 * its page; then the k and v rows of its kv heads (or the q rows of its
 * heads), which lie next to each other in k_new / v_new / q and in the
 * cache slot, move with every load of a batch of heads in flight before any
 * store. (One warp per row, before: each row paid the binary search and the
 * block table's dependent round trips, and the kernel ran at 0.24 of the
 * read rate; kernels/NOTES.md, session 10.) The token's cos/sin rows are
 * staged once in shared memory for all its heads, in double, and so are the
 * rows (each value converted once, not once per use).
 *
 * A lane rotates a pair (GPT-J: elements 2j, 2j + 1; GPT-NeoX: j, j + half)
 * from the same four values (the kernel is issue-bound: ~95 instructions an
 * element when each lane rotated one element and loaded its partner; 148 ->
 * 110 us at 64 x 512 tokens). The rotation is done in double and rounded
 * once to the dtype, as the CPU backend does, so both write the same cache
 * bytes.
 *
 * Defines: PA_DTYPE (0 f32, 1 f16, 2 bf16).
 */
#ifndef PA_EMBED_ONLY
#include "common.cuh"

#ifndef PA_DTYPE
#error "PA_DTYPE must be defined"
#endif

#define WARPS 8
#define STAGE 512 /* elements of a token's rows staged at once per warp (whole heads) */
#define MAX_HALF 128 /* rotary_dim / 2 <= head_dim / 2 <= 128 */

typedef pa_elem<PA_DTYPE> E;
#define ESZ (PA_DTYPE == PA_DT_F32 ? 4 : 2)

/* A rotated pair (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), in double without
 * fused multiply-adds, so that the rounding is the host's. */
__device__ __forceinline__ void rotate_pair(double x0, double x1, double c, double s, double &y0, double &y1) {
    y0 = __dadd_rn(__dmul_rn(x0, c), -__dmul_rn(x1, s));
    y1 = __dadd_rn(__dmul_rn(x0, s), __dmul_rn(x1, c));
}

/* n elements from src to dst (a token's rows), 16 bytes a lane where both
 * allow: all of a lane's loads (up to 4 per pass) before its stores. */
__device__ __forceinline__ void copy_rows(char *dst, const char *src, i64 n, int lane) {
    if (((n * ESZ) & 15) == 0 && ((((u64)dst) | ((u64)src)) & 15) == 0) {
        const int nv = (int)(n * ESZ / 16);
        for (int i0 = 0; i0 < nv; i0 += 32 * 4) {
            uint4 v[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i0 + lane + 32 * k < nv) v[k] = ((const uint4 *)src)[i0 + lane + 32 * k];
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i0 + lane + 32 * k < nv) ((uint4 *)dst)[i0 + lane + 32 * k] = v[k];
        }
    } else {
        for (i64 e = lane; e < n; e += 32) ((typename E::T *)dst)[e] = ((const typename E::T *)src)[e];
    }
}

/* A token's `heads` rows of D elements from src (dtype) rotated into dst
 * (store(i, value) for element i of those rows), a batch of whole heads at a
 * time through the warp's stage x (pa_load8 where the rows allow). */
template <typename S>
__device__ __forceinline__ void rotate_rows(const pa_append_params &p, const void *src, i64 src0, int heads,
                                            double *x, const double *cs, const double *sn, int lane, S store) {
    const int D = p.head_dim, per = STAGE / D; /* heads a batch */
    /* (16-bit dtypes: 8 elements a load; f32's element loads are whole lines already) */
    const bool vec = ESZ == 2 && D % 8 == 0 && ((((u64)src) + (u64)src0 * ESZ) & 15) == 0;
    const int rd = p.rotary_dim, half = rd >> 1;
    for (int h0 = 0; h0 < heads; h0 += per) {
        const int n = min(per, heads - h0) * D, nh = n / D;
        const i64 at = src0 + (i64)h0 * D;
        __syncwarp(); /* the previous batch's reads of x are done */
        if (vec) {
            for (int c = lane; c < n / 8; c += 32) {
                float f[8];
                pa_load8<PA_DTYPE>((const char *)src + (at + c * 8) * ESZ, f);
#pragma unroll
                for (int k = 0; k < 8; k++) x[c * 8 + k] = f[k];
            }
        } else {
            for (int e = lane; e < n; e += 32) x[e] = E::load(src, at + e);
        }
        __syncwarp();
        /* body(hh, t) for t = 0 .. count - 1 of each head hh of the batch,
         * item lane + 32 k of nh * count: (hh, t) stepped on, no division */
        auto each = [&](int count, auto body) {
            int hh = lane / count, t = lane - hh * count;
            for (int q = lane; q < nh * count; q += 32) {
                body(hh, t);
                t += 32;
                while (t >= count) {
                    t -= count;
                    hh++;
                }
            }
        };
        /* the pairs, one a lane (GPT-J: elements 2j, 2j + 1; GPT-NeoX: j, j + half) */
        if (half > 0)
            each(half, [&](int hh, int j) {
                const int d0 = p.interleaved ? 2 * j : j, d1 = p.interleaved ? 2 * j + 1 : j + half;
                double y0, y1;
                rotate_pair(x[hh * D + d0], x[hh * D + d1], cs[j], sn[j], y0, y1);
                store((i64)h0 * D + hh * D + d0, y0);
                store((i64)h0 * D + hh * D + d1, y1);
            });
        /* the elements past the rotary dim, as they are */
        if (rd < D)
            each(D - rd, [&](int hh, int t) { store((i64)h0 * D + hh * D + rd + t, x[hh * D + rd + t]); });
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) pa_append(const pa_append_params p) {
    __shared__ double s_x[WARPS][STAGE];
    __shared__ double s_cs[WARPS][MAX_HALF], s_sn[WARPS][MAX_HALF];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 w = (i64)blockIdx.x * WARPS + warp;
    const i64 item = w / p.split; /* a new token, then a query token */
    const int share = (int)(w - item * p.split);
    const int D = p.head_dim, half = p.rotary_dim >> 1;
    const pa_seq_meta *meta = (const pa_seq_meta *)p.meta;
    double *x = s_x[warp], *cs = s_cs[warp], *sn = s_sn[warp];
    /* this warp's heads of the token's `heads` */
    auto heads_of = [&](int heads, int &h0, int &nh) {
        const int per = (heads + p.split - 1) / p.split;
        h0 = min(heads, share * per);
        nh = min(heads, h0 + per) - h0;
    };
    /* the position's cos/sin row, staged for all the token's heads */
    auto stage_rot = [&](i64 pos) {
        for (int j = lane; j < half; j += 32) {
            cs[j] = pa_load_any((const void *)p.rot_cos, p.rot_dtype, pos * half + j);
            sn[j] = pa_load_any((const void *)p.rot_sin, p.rot_dtype, pos * half + j);
        }
    };

    if (item < p.total_new) {
        /* new token n: its k/v rows (all kv heads) -> its page slot */
        const i64 n = item;
        const int b = pa_warp_upper_index(p.batch, n, lane, [&](int i) { return meta[i].new_prefix; });
        const pa_seq_meta m = meta[b];
        const i64 i = n - m.new_prefix;
        const i64 pos = (i64)m.append_pos + i;
        i64 page, slot;
        if (p.block_table) {
            page = ((const int *)p.block_table)[(i64)b * p.bt_stride + pos / p.page_size];
            slot = pos % p.page_size;
        } else {
            page = m.cache_row;
            slot = pos;
        }
        /* the token's rows: [kv_heads, D], adjacent on both sides; this warp's heads h0 .. */
        int h0, nh;
        heads_of(p.kv_heads, h0, nh);
        const i64 src = ((m.new_row + i) * p.kv_heads + h0) * (i64)D;
        const i64 dst = page * p.page_stride + slot * p.row_stride + (i64)h0 * D;
        if (p.rot_cos) stage_rot(pos);
        copy_rows((char *)p.v_cache + dst * ESZ, (const char *)p.v_new + src * ESZ, (i64)nh * D, lane);
        if (!p.rot_cos) {
            copy_rows((char *)p.k_cache + dst * ESZ, (const char *)p.k_new + src * ESZ, (i64)nh * D, lane);
            return;
        }
        rotate_rows(p, (const void *)p.k_new, src, nh, x, cs, sn, lane,
                    [&](i64 e, double v) { pa_store_f64<PA_DTYPE>((void *)p.k_cache, dst + e, v); });
        return;
    }
    /* query token r: its q rows (all heads) -> rotated f32 copies */
    const i64 r = item - p.total_new;
    if (r >= p.q_rows) return;
    const int b = pa_warp_upper_index(p.batch, r, lane, [&](int i) { return meta[i].q_start; });
    const pa_seq_meta m = meta[b];
    const i64 pos = (i64)m.append_pos + (p.rope_q_step ? r - m.q_start : 0);
    int h0, nh;
    heads_of(p.heads, h0, nh);
    const i64 off = (r * p.heads + h0) * (i64)D;
    stage_rot(pos);
    float *out = (float *)p.q_rot + off;
    rotate_rows(p, (const void *)p.q, off, nh, x, cs, sn, lane, [&](i64 e, double v) { out[e] = (float)v; });
}

#endif /* PA_EMBED_ONLY */
