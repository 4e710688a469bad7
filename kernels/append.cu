/*
 * append.cu -- rotary append, one pass: each new k row is rotated (RoPE,
 * interleaved GPT-J pairs or GPT-NeoX halves, rotary_dim <= head_dim) and
 * written with its v row into the cache slot of its position; each q row is
 * rotated into an f32 copy that the attention kernel reads instead of q.
 *
 * One warp per row of head_dim elements; v rows (and k rows without rotary)
 * move 16 bytes per lane where the row allows, rotated k rows one element per
 * lane. The rotation is done in double and rounded once to the dtype, as the
 * CPU backend does, so both write the same cache bytes.
 *
 * Defines: PA_DTYPE (0 f32, 1 f16, 2 bf16).
 */
#ifndef PA_EMBED_ONLY
#include "common.cuh"

#ifndef PA_DTYPE
#error "PA_DTYPE must be defined"
#endif

#define WARPS 8
#define MAX_D 256

typedef pa_elem<PA_DTYPE> E;
#define ESZ (PA_DTYPE == PA_DT_F32 ? 4 : 2)

/* The rotated value of element d of a row held in x (f32, shared), at a
 * position whose cos/sin row starts at cs_off. */
__device__ __forceinline__ double rotated(const pa_append_params &p, const float *x, int d,
                                          i64 cs_off) {
    const int half = p.rotary_dim >> 1;
    if (d >= p.rotary_dim) return x[d];
    int j, partner;
    bool first; /* d is the first of its pair */
    if (p.interleaved) {
        j = d >> 1;
        first = (d & 1) == 0;
        partner = first ? d + 1 : d - 1;
    } else {
        first = d < half;
        j = first ? d : d - half;
        partner = first ? d + half : d - half;
    }
    const double c = pa_load_any((const void *)p.rot_cos, p.rot_dtype, cs_off + j);
    const double s = pa_load_any((const void *)p.rot_sin, p.rot_dtype, cs_off + j);
    const double a = x[d], b = x[partner];
    /* (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), without fused multiply-adds so
     * that the rounding is the host's */
    return first ? __dadd_rn(__dmul_rn(a, c), -__dmul_rn(b, s))
                 : __dadd_rn(__dmul_rn(b, s), __dmul_rn(a, c));
}

/* Copies one row of D elements, 16 bytes at a time when aligned. */
__device__ __forceinline__ void copy_row(void *dst, const void *src, int D, int lane) {
    if (((D * ESZ) & 15) == 0) {
        const int n = D * ESZ / 16;
        for (int i = lane; i < n; i += 32) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    } else {
        for (int d = lane; d < D; d += 32) ((typename E::T *)dst)[d] = ((const typename E::T *)src)[d];
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) pa_append(const pa_append_params p) {
    __shared__ float s_row[WARPS][MAX_D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 row = (i64)blockIdx.x * WARPS + warp;
    const int D = p.head_dim;
    const pa_seq_meta *meta = (const pa_seq_meta *)p.meta;
    float *x = s_row[warp];
    const i64 kv_rows = p.total_new * p.kv_heads;

    if (row < kv_rows) {
        /* k/v row (new token n, kv head hk) -> its page slot */
        const i64 n = row / p.kv_heads;
        const int hk = (int)(row - n * p.kv_heads);
        const int b = pa_upper_index(p.batch, n, [&](int i) { return meta[i].new_prefix; });
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
        const i64 src = ((m.new_row + i) * p.kv_heads + hk) * (i64)D;
        const i64 dst = page * p.page_stride + slot * p.row_stride + (i64)hk * D;
        copy_row((char *)p.v_cache + dst * ESZ, (const char *)p.v_new + src * ESZ, D, lane);
        if (!p.rot_cos) {
            copy_row((char *)p.k_cache + dst * ESZ, (const char *)p.k_new + src * ESZ, D, lane);
            return;
        }
        /* element-wise, all 32 lanes busy (16-byte lanes measured slower:
         * half of them idle at head dim 128) */
        for (int d = lane; d < D; d += 32) x[d] = E::load((const void *)p.k_new, src + d);
        __syncwarp();
        const i64 cs_off = pos * (p.rotary_dim >> 1);
        for (int d = lane; d < D; d += 32)
            pa_store_f64<PA_DTYPE>((void *)p.k_cache, dst + d, rotated(p, x, d, cs_off));
        return;
    }
    /* q row (query r, head h) -> rotated f32 copy */
    const i64 qrow = row - kv_rows;
    if (qrow >= p.q_rows * p.heads) return;
    const i64 r = qrow / p.heads;
    const int b = pa_upper_index(p.batch, r, [&](int i) { return meta[i].q_start; });
    const pa_seq_meta m = meta[b];
    const i64 pos = (i64)m.append_pos + (p.rope_q_step ? r - m.q_start : 0);
    const i64 off = qrow * (i64)D;
    for (int d = lane; d < D; d += 32) x[d] = E::load((const void *)p.q, off + d);
    __syncwarp();
    const i64 cs_off = pos * (p.rotary_dim >> 1);
    float *out = (float *)p.q_rot + off;
    for (int d = lane; d < D; d += 32) out[d] = (float)rotated(p, x, d, cs_off);
}

#endif /* PA_EMBED_ONLY */
