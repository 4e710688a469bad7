/*
 * append.cu -- rotary append, one pass: each new k row is rotated (RoPE,
 * interleaved GPT-J pairs or GPT-NeoX halves, rotary_dim <= head_dim) and
 * written with its v row into the cache slot of its position; each q row is
 * rotated into an f32 copy that the attention kernel reads instead of q.
 *
 * One warp per token (or per share of its heads, `split` warps a token,
 * when there are few tokens): its sequence is found once (its row divided
 * by the tokens a sequence where every sequence has as many, as
 * attention_with_kvcache's always do; else a 32-way search of the
 * sequences' prefixes, one round of loads per 32x narrowing) and so is its
 * page; then the k and v rows of its kv heads (or the q rows of its
 * heads), which lie next to each other in k_new / v_new / q and in the
 * cache slot, move with every load of a batch of heads in flight before any
 * store. (One warp per row, before: each row paid the binary search and the
 * block table's dependent round trips, and the kernel ran at 0.24 of the
 * read rate; docs/append.md.) The token's cos/sin rows are
 * staged once in shared memory for all its heads, in double (as f32 they
 * read 64 x 512 tokens 0.6 us slower; docs/append.md).
 *
 * 16-bit rows (rotate_rows8, where they allow): a lane takes 8 elements at
 * a time straight from memory (16-byte loads: GPT-J 4 pairs, GPT-NeoX 8
 * pairs from both halves) and stores them rotated as 16 bytes; 108-110 -> 84-89 us
 * at 64 x 512 tokens (H200). Otherwise the rows are staged in double
 * too and a lane rotates a pair (GPT-J: elements 2j, 2j + 1; GPT-NeoX: j,
 * j + half) from the same four values (the kernel is issue-bound: ~95
 * instructions an element when each lane rotated one element and loaded its
 * partner; 148 -> 110 us). The rotation is done in double and rounded once
 * to the dtype, as the CPU backend does, so both write the same cache
 * bytes.
 *
 * FP8 caches (PA_KV): the new rows go in as x * (1 / scale) of their kv
 * head in f32 (k rotated in f32), converted once, nearest even and
 * saturating: the host's definition (pa_fp8_scaled, pa_rotate_f32), so CPU
 * and GPU write the same bytes. New tokens take the 16-byte path where it
 * allows (8 elements a lane in, 8 bytes out: fp8x8), else the staged one
 * (a lane an element).
 *
 * Defines: PA_DTYPE (0 f32, 1 f16, 2 bf16); PA_KV (optional, the caches':
 * PA_DTYPE, or fp8); tuning (A/Bs by PAGEDATTN_NVRTC_OPTIONS):
 * PA_APPEND_MINB, PA_APPEND_KV (below).
 */
#ifndef PA_EMBED_ONLY
#include "common.cuh"

#ifndef PA_DTYPE
#error "PA_DTYPE must be defined"
#endif

#define WARPS 8
#ifndef PA_KV
#define PA_KV PA_DTYPE
#endif
#define FP8 PA_DT_IS_FP8(PA_KV)
/* blocks a SM the registers must allow, and v chunks a lane a pass of the
 * new tokens' 16-byte path (append_new8; its rotary items a lane a pass half
 * that). Four (64 registers, a few spills) for fp8 caches too since their
 * values are f32 arithmetic: 64 x 512 tokens e4m3 85.0 -> 77.0 us against
 * three (80 registers, none); five 98.9, two 103.6, four chunks a pass
 * 97.3 (H100, docs/fp8.md). */
#ifndef PA_APPEND_MINB
#define PA_APPEND_MINB 4
#endif
#ifndef PA_APPEND_KV
#define PA_APPEND_KV 2
#endif
#define STAGE 512 /* elements of a token's rows staged at once per warp (whole heads) */
#define MAX_HALF 128 /* rotary_dim / 2 <= head_dim / 2 <= 128 */

typedef pa_elem<PA_DTYPE> E;
#define ESZ (PA_DTYPE == PA_DT_F32 ? 4 : 2)

/* The cos/sin rows as staged (values of f32 or narrower tables, so exact
 * either way): double in the 16-bit modules; f32 in the fp8 ones, whose
 * keys rotate in f32 (q's f32 copy widens them, exactly). */
#if PA_DT_IS_FP8(PA_KV)
typedef float rot_t;
#else
typedef double rot_t;
#endif

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
 * time through the warp's stage x (pa_load8 where the rows allow). R32: the
 * pairs rotated in f32 (pa_rotate_f32: keys into an fp8 cache), else in
 * double. */
template <bool R32 = false, typename S>
__device__ __forceinline__ void rotate_rows(const pa_append_params &p, const void *src, i64 src0, int heads,
                                            double *x, const rot_t *cs, const rot_t *sn, int lane, S store) {
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
                if constexpr (R32) {
                    float f0, f1;
                    pa_rotate_f32((float)x[hh * D + d0], (float)x[hh * D + d1], (float)cs[j], (float)sn[j], f0, f1);
                    y0 = f0;
                    y1 = f1;
                } else {
                    rotate_pair(x[hh * D + d0], x[hh * D + d1], cs[j], sn[j], y0, y1);
                }
                store((i64)h0 * D + hh * D + d0, y0);
                store((i64)h0 * D + hh * D + d1, y1);
            });
        /* the elements past the rotary dim, as they are */
        if (rd < D)
            each(D - rd, [&](int hh, int t) { store((i64)h0 * D + hh * D + rd + t, x[hh * D + rd + t]); });
    }
}

/* x * s rounded to odd in f32, exactly as pa_f64_to_f32_odd((double)x * s)
 * (x an fp8 value, s an f32: the product has at most 28 bits, exact in
 * double) without the double: a truncated product and its residual by an
 * FMA, exact wherever the product is a normal f32 well above underflow (the
 * rest, rare, takes the double). Conversions to and from double issue 16 a
 * clock a SM on sm_80/90 (f32 FMAs 128), and they bound the fp8 widening. */
__device__ __forceinline__ float pa_mul_f32_odd(float x, float s) {
    const float r = __fmul_rz(x, s), a = fabsf(r);
    if (x == 0.f || (a >= __int_as_float(0x0d800000) /* 2^-100 */ && a < __int_as_float(0x7f7fffff))) {
        return __fmaf_rn(x, s, -r) != 0.f ? __uint_as_float(__float_as_uint(r) | 1u) : r;
    }
    return pa_f64_to_f32_odd((double)x * (double)s);
}

/* Element i of 8 packed 16-bit elements, as a T (double or f32: exact). */
template <typename T = double> __device__ __forceinline__ T elem8(const uint4 &v, int i) {
    const u32 w = i < 2 ? v.x : i < 4 ? v.y : i < 6 ? v.z : v.w; /* (i: a constant after unrolling) */
    return (T)E::load(&w, i & 1);
}

/* 8 results of a row, put one at a time: rounded once to the dtype
 * (pa_store_f64's rounding) and stored as 16 bytes (OUT_DT: a 16-bit cache
 * row) or as f32 (OUT_F32: the rotated q copy, 32 bytes). OUT_KV: an fp8
 * cache row, 8 bytes (fp8x8 below). */
enum { OUT_DT, OUT_F32, OUT_KV };
template <int O> struct out8;
template <> struct out8<OUT_DT> {
    u32 w[4];
    __device__ __forceinline__ void put(int i, double y) { E::store(&w[i >> 1], i & 1, pa_f64_to_f32_odd(y)); }
    __device__ __forceinline__ void put_odd(int i, float y) { E::store(&w[i >> 1], i & 1, y); } /* (y rounded to odd) */
    __device__ __forceinline__ void flush(char *row, int e) const {
        *(uint4 *)(row + (i64)e * 2) = make_uint4(w[0], w[1], w[2], w[3]);
    }
};
template <> struct out8<OUT_F32> {
    float f[8];
    __device__ __forceinline__ void put(int i, double y) { f[i] = (float)y; }
    __device__ __forceinline__ void flush(char *row, int e) const {
        float *o = (float *)row + e;
        *(float4 *)o = make_float4(f[0], f[1], f[2], f[3]);
        *(float4 *)(o + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
};
/* fp8: 1 / scale of kv head hk (the host's pa_fp8_inv_scale, uploaded with
 * the call's plan: one definition of the bytes for both backends) */
__device__ __forceinline__ float inv_scale(const pa_append_params &p, bool is_k, int hk) {
    return ((const float *)p.inv_scales)[(is_k ? 0 : p.kv_heads) + hk];
}

/* The fp8 codes of z0 (low byte) and z1: one cvt.rn.satfinite (nearest
 * even, saturating at the largest finite value: the host's pa_f32_to_fp8
 * wherever both are finite); a pair holding a NaN or an infinity takes the
 * host's code (NaN's sign) instead. sm_89+ (that conversion); before, the
 * host's code always. */
__device__ __forceinline__ u32 fp8_codes(float z0, float z1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const float inf = __int_as_float(0x7f800000);
    if (fabsf(z0) < inf && fabsf(z1) < inf) {
        unsigned short c;
        if constexpr (PA_KV == PA_DT_FP8_E4M3)
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c) : "f"(z1), "f"(z0));
        else
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(c) : "f"(z1), "f"(z0));
        return c;
    }
#endif
    return pa_f32_to_fp8<PA_KV>(z0) | (pa_f32_to_fp8<PA_KV>(z1) << 8);
}

/* 8 fp8 cache bytes of a 16-byte chunk, each the host's pa_fp8_scaled: z =
 * x inv rounded to f32, two of them into two codes by fp8_codes: three
 * operations an element in the source (multiply, finite test, half a
 * conversion) where the double definition's took about a dozen. */
struct fp8x8 {
    u32 w[2];
    float inv;
    __device__ __forceinline__ explicit fp8x8(float inv_) : w{0u, 0u}, inv(inv_) {}
    /* elements i and i + 1 (i even): x0 / scale and x1 / scale */
    __device__ __forceinline__ void put2(int i, float x0, float x1) {
        w[i >> 2] |= fp8_codes(__fmul_rn(x0, inv), __fmul_rn(x1, inv)) << (8 * (i & 3));
    }
    __device__ __forceinline__ void flush(char *row, int e) const { *(uint2 *)(row + e) = make_uint2(w[0], w[1]); }
};

/* Rotary chunks of a token's `heads` rows (rows8_pass's items) */
__device__ __forceinline__ int rows8_items(const pa_append_params &p, int heads) {
    const int D = p.head_dim, rd = p.rotary_dim;
    return PA_APPEND_ROWS8_ITEMS(heads, D, rd, p.interleaved);
}

/* Whether rotate_rows8 takes a warp's `heads` rows of a token (16-bit
 * dtypes): whole 16-byte chunks on both sides, rotary halves (GPT-NeoX) or
 * pairs (GPT-J) that fill them, and a chunk for every lane at least (with
 * fewer, e.g. a head a warp when `split` spreads few tokens' heads over many
 * warps, a lane per pair through the staging is faster: 256 x 1 tokens 7.1
 * against 7.8 us; docs/append.md). */
__device__ __forceinline__ bool rows8_ok(const pa_append_params &p, int heads, u64 src_byte, u64 dst_byte) {
    const int D = p.head_dim, rd = p.rotary_dim;
    return ESZ == 2 && D % 8 == 0 && PA_APPEND_ROWS8_RD(rd, p.interleaved) && ((src_byte | dst_byte) & 15) == 0 &&
           rows8_items(p, heads) >= PA_APPEND_ROWS8_MIN; /* rotate_rows8's chunks */
}

/* One pass of rotate_rows8 over a token's `heads` rows at src (16-bit dtype):
 * a lane's K items (a head's 16-byte chunk: GPT-J 4 adjacent pairs, GPT-NeoX
 * 8 first-half elements and their 8 partners, or 8 past the rotary dim),
 * items u0 + lane + 32 k. load() issues the pass's 16-byte loads; store()
 * rotates (rotate_pair's arithmetic, one rounding) and stores them into dst
 * (the same rows: the cache slot, or the f32 copy of q; out8<O> says how).
 * Apart, so that a token's first loads go out before its destination and
 * cos/sin are known. An fp8 cache (O = OUT_KV) scales each item by its
 * head's 1 / scale, the head h0 + hd[k]. */
template <int O, int K> struct rows8_pass {
    int e[K], cc[K], hd[K];
    uint4 a[K], b[K];
    bool ok[K];
    __device__ __forceinline__ void load(const pa_append_params &p, const char *src, int heads, int u0, int lane) {
        const int D = p.head_dim, rd = p.rotary_dim, half = rd >> 1;
        const int rot = p.interleaved ? rd / 8 : half / 8; /* rotary chunks a head */
        const int per = rot + (D - rd) / 8;                /* chunks a head */
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int u = u0 + lane + 32 * k, hh = u / per, c = u - hh * per;
            ok[k] = u < heads * per;
            cc[k] = c;
            hd[k] = hh;
            e[k] = hh * D + (c < rot || p.interleaved ? 8 * c : rd + 8 * (c - rot));
            if (ok[k]) {
                a[k] = *(const uint4 *)(src + (i64)e[k] * 2);
                if (c < rot && !p.interleaved) b[k] = *(const uint4 *)(src + (i64)(e[k] + half) * 2);
            }
        }
    }
    __device__ __forceinline__ void store(const pa_append_params &p, char *dst, const rot_t *cs, const rot_t *sn,
                                          int h0 = 0) const {
        const int rd = p.rotary_dim, half = rd >> 1;
        const int rot = p.interleaved ? rd / 8 : half / 8;
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (!ok[k]) break;
            const int c = cc[k];
            if constexpr (O == OUT_KV) {
                store_kv(p, dst, cs, sn, k, inv_scale(p, true, h0 + hd[k]));
            } else {
                out8<O> y;
                if (c >= rot) { /* past the rotary dim: as it is */
#pragma unroll
                    for (int i = 0; i < 8; i++) y.put(i, elem8(a[k], i));
                    y.flush(dst, e[k]);
                } else if (p.interleaved) { /* pairs (2i, 2i + 1) of the chunk: j = 4 c + i */
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        double y0, y1;
                        rotate_pair(elem8(a[k], 2 * i), elem8(a[k], 2 * i + 1), cs[4 * c + i], sn[4 * c + i], y0, y1);
                        y.put(2 * i, y0);
                        y.put(2 * i + 1, y1);
                    }
                    y.flush(dst, e[k]);
                } else { /* j = 8 c + i: a[k] the first half's elements, b[k] their partners */
                    out8<O> y1;
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        double r0, r1;
                        rotate_pair(elem8(a[k], i), elem8(b[k], i), cs[8 * c + i], sn[8 * c + i], r0, r1);
                        y.put(i, r0);
                        y1.put(i, r1);
                    }
                    y.flush(dst, e[k]);
                    y1.flush(dst, e[k] + half);
                }
            }
        }
    }
    /* item k into an fp8 cache (fp8x8), its head's 1 / scale inv */
    __device__ __forceinline__ void store_kv(const pa_append_params &p, char *dst, const rot_t *cs, const rot_t *sn,
                                             int k, float inv) const {
        const int rd = p.rotary_dim, half = rd >> 1;
        const int rot = p.interleaved ? rd / 8 : half / 8, c = cc[k];
        fp8x8 y(inv);
        if (c >= rot) { /* past the rotary dim: as it is */
#pragma unroll
            for (int i = 0; i < 8; i += 2) y.put2(i, elem8<float>(a[k], i), elem8<float>(a[k], i + 1));
            y.flush(dst, e[k]);
        } else if (p.interleaved) { /* pairs (2i, 2i + 1) of the chunk: j = 4 c + i */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float y0, y1;
                pa_rotate_f32(elem8<float>(a[k], 2 * i), elem8<float>(a[k], 2 * i + 1), cs[4 * c + i], sn[4 * c + i],
                              y0, y1);
                y.put2(2 * i, y0, y1);
            }
            y.flush(dst, e[k]);
        } else { /* j = 8 c + i: a[k] the first half's elements, b[k] their partners */
            fp8x8 y1(inv);
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                float r0, r1, t0, t1;
                pa_rotate_f32(elem8<float>(a[k], i), elem8<float>(b[k], i), cs[8 * c + i], sn[8 * c + i], r0, r1);
                pa_rotate_f32(elem8<float>(a[k], i + 1), elem8<float>(b[k], i + 1), cs[8 * c + i + 1],
                              sn[8 * c + i + 1], t0, t1);
                y.put2(i, r0, t0);
                y1.put2(i, r1, t1);
            }
            y.flush(dst, e[k]);
            y1.flush(dst, e[k] + half);
        }
    }
};

/* One pass of a plain copy of 16-byte chunks u0 + lane + 32 k of n (v rows,
 * and k rows without rotary), loads and stores apart as rows8_pass's. */
template <int K> struct copy8_pass {
    uint4 v[K];
    __device__ __forceinline__ void load(const char *src, int n, int u0, int lane) {
#pragma unroll
        for (int k = 0; k < K; k++)
            if (u0 + lane + 32 * k < n) v[k] = ((const uint4 *)src)[u0 + lane + 32 * k];
    }
    __device__ __forceinline__ void store(char *dst, int n, int u0, int lane) const {
#pragma unroll
        for (int k = 0; k < K; k++)
            if (u0 + lane + 32 * k < n) ((uint4 *)dst)[u0 + lane + 32 * k] = v[k];
    }
    /* into an fp8 cache: 8 elements of a chunk times its head's (h0 + the
     * chunk's head) 1 / scale, rounded once, 8 bytes a chunk */
    __device__ __forceinline__ void store_kv(const pa_append_params &p, char *dst, int n, int u0, int lane, int h0,
                                             bool is_k) const {
        const int per = p.head_dim >> 3; /* chunks a head */
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int u = u0 + lane + 32 * k;
            if (u >= n) break;
            fp8x8 y(inv_scale(p, is_k, h0 + u / per));
#pragma unroll
            for (int i = 0; i < 8; i += 2) y.put2(i, elem8<float>(v[k], i), elem8<float>(v[k], i + 1));
            y.flush(dst, 8 * u);
        }
    }
};

/* A token's `heads` rows at src (16-bit dtype) rotated into dst, pass by
 * pass; `first`: pass 0's loads, issued by the caller (its cos/sin staged
 * since). Where rows8_ok. */
template <int O, int K>
__device__ __forceinline__ void rotate_rows8(const pa_append_params &p, const char *src, char *dst, int heads,
                                             const rot_t *cs, const rot_t *sn, int lane,
                                             const rows8_pass<O, K> &first) {
    first.store(p, dst, cs, sn);
    const int n = rows8_items(p, heads);
    for (int u0 = 32 * K; u0 < n; u0 += 32 * K) {
        rows8_pass<O, K> r;
        r.load(p, src, heads, u0, lane);
        r.store(p, dst, cs, sn);
    }
}

/* Whether a new token's rows take the 16-byte path (append_new8): 16-bit
 * dtypes, D % 8 == 0, every row 16-byte aligned (the four bases are, and
 * rows are whole chunks), with rotary where rows8_ok's chunks allow it, or
 * without rotary. */
__device__ __forceinline__ bool new8_ok(const pa_append_params &p, int heads) {
    const int D = p.head_dim, rd = p.rotary_dim;
    const u64 bases = p.k_new | p.v_new | p.k_cache | p.v_cache;
    return ESZ == 2 && D % 8 == 0 && (bases & 15) == 0 &&
           (!p.rot_cos || (PA_APPEND_ROWS8_RD(rd, p.interleaved) && rows8_items(p, heads) >= PA_APPEND_ROWS8_MIN));
}

/* The position's cos/sin row (half <= MAX_HALF values of each) staged in
 * the warp's cs / sn for all the token's heads: rot_row loads it into a
 * lane's registers and puts it there apart, so that append_new8 has it in
 * flight with the page id and stages it after v's stores; stage_rot at once
 * (its loop, not rot_row's registers, in the other paths: ptxas spilled
 * less so, 108 against 128 bytes, when one kernel held both paths). */
struct rot_row {
    float c[MAX_HALF / 32], s[MAX_HALF / 32];
    __device__ __forceinline__ void load(const pa_append_params &p, i64 pos, int lane) {
        const int half = p.rotary_dim >> 1;
#pragma unroll
        for (int t = 0; t < MAX_HALF / 32; t++)
            if (lane + 32 * t < half) {
                c[t] = pa_load_any((const void *)p.rot_cos, p.rot_dtype, pos * half + lane + 32 * t);
                s[t] = pa_load_any((const void *)p.rot_sin, p.rot_dtype, pos * half + lane + 32 * t);
            }
    }
    __device__ __forceinline__ void put(const pa_append_params &p, rot_t *cs, rot_t *sn, int lane) const {
        const int half = p.rotary_dim >> 1;
#pragma unroll
        for (int t = 0; t < MAX_HALF / 32; t++)
            if (lane + 32 * t < half) {
                cs[lane + 32 * t] = c[t];
                sn[lane + 32 * t] = s[t];
            }
    }
};
__device__ __forceinline__ void stage_rot(const pa_append_params &p, i64 pos, rot_t *cs, rot_t *sn, int lane) {
    const int half = p.rotary_dim >> 1;
    for (int j = lane; j < half; j += 32) {
        cs[j] = pa_load_any((const void *)p.rot_cos, p.rot_dtype, pos * half + j);
        sn[j] = pa_load_any((const void *)p.rot_sin, p.rot_dtype, pos * half + j);
    }
}

/* New token n of sequence b (16-byte path, new8_ok): this warp's heads h0,
 * nh of its k (rotated where ROT) and v rows into their cache slot, the
 * token's cos/sin staged in cs / sn. A pass loads PA_APPEND_KV v chunks and
 * KK rotary items (or KV k chunks) a lane, all before its stores; pass 0's
 * before the sequence's meta where the rows are dense (row n), so that they
 * fly under the meta, block-table and cos/sin round trips (64 x 512 tokens
 * 83.7 -> 80.2 us; more in flight a warp, by more registers (spills at four
 * blocks a SM, or three blocks) or by cp.async into shared memory, was
 * slower: docs/append.md). */
template <int KK, bool ROT>
__device__ __forceinline__ void append_new8(const pa_append_params &p, i64 n, int b, int h0, int nh, rot_t *cs,
                                            rot_t *sn, int lane) {
    const int D = p.head_dim, nv = nh * D / 8;
    const int nk = ROT ? rows8_items(p, nh) : nv;
    constexpr int KV = PA_APPEND_KV, KP = ROT ? KK : KV; /* v chunks and k items a lane a pass */
    const int passes = max((nk + 32 * KP - 1) / (32 * KP), (nv + 32 * KV - 1) / (32 * KV));
    rows8_pass<FP8 ? OUT_KV : OUT_DT, ROT ? KK : 1> kr;
    copy8_pass<ROT ? 1 : KV> kc;
    copy8_pass<KV> vc;
    const char *ks = nullptr, *vs = nullptr;
    auto sources = [&](i64 row) {
        const i64 src = (row * p.kv_heads + h0) * (i64)D;
        ks = (const char *)p.k_new + src * 2;
        vs = (const char *)p.v_new + src * 2;
    };
    auto load = [&](int j) {
        if (ROT) kr.load(p, ks, nh, j * 32 * KK, lane);
        else kc.load(ks, nv, j * 32 * KV, lane);
        vc.load(vs, nv, j * 32 * KV, lane);
    };
    if (p.new_dense) {
        sources(n);
        load(0);
    }
    const pa_seq_meta m = ((const pa_seq_meta *)p.meta)[b];
    const i64 i = n - m.new_prefix;
    if (!p.new_dense) {
        sources(m.new_row + i);
        load(0);
    }
    const i64 pos = (i64)m.append_pos + i;
    i64 page, slot;
    if (p.block_table) {
        page = ((const int *)p.block_table)[(i64)b * p.bt_stride + pos / p.page_size];
        slot = pos % p.page_size;
    } else {
        page = m.cache_row;
        slot = pos;
    }
    /* cos/sin in flight with the page id; v's stores (which need only the
     * page) before they are staged, so that v's registers are free for the
     * rotation */
    rot_row rr;
    if (ROT) rr.load(p, pos, lane);
    const i64 dst = (page * p.page_stride + slot * p.row_stride + (i64)h0 * D) * (FP8 ? 1 : 2);
    char *kd = (char *)p.k_cache + dst, *vd = (char *)p.v_cache + dst;
    auto store_v = [&](int j) {
        if (FP8) vc.store_kv(p, vd, nv, j * 32 * KV, lane, h0, false);
        else vc.store(vd, nv, j * 32 * KV, lane);
    };
    store_v(0);
    if (ROT) {
        rr.put(p, cs, sn, lane);
        __syncwarp();
    }
    for (int j = 0;;) {
        if (ROT) kr.store(p, kd, cs, sn, h0);
        else if (FP8) kc.store_kv(p, kd, nv, j * 32 * KV, lane, h0, true);
        else kc.store(kd, nv, j * 32 * KV, lane);
        if (++j >= passes) break;
        load(j);
        store_v(j);
    }
}

/* fp8: element e of a token's rows of kv heads h0 .. (D each) into the
 * cache at element dst0 + e: pa_fp8_scaled by its head's 1 / scale (x an
 * f32 value). A lane's elements go head by head, so it divides once a head. */
struct fp8_store {
    const pa_append_params *p;
    void *cache;
    i64 dst0;
    int h0;
    bool is_k;
    int head = -1;
    float inv = 1.f;
    __device__ __forceinline__ void operator()(i64 e, double x) {
        const int hh = (int)e / p->head_dim; /* (e < a token's rows: 32 bits) */
        if (hh != head) {
            head = hh;
            inv = inv_scale(*p, is_k, h0 + hh);
        }
        ((u8 *)cache)[dst0 + e] = (u8)pa_fp8_scaled<PA_KV>((float)x, inv);
    }
};

/* The kernel: pa_append_new8 has append_new8 for the new tokens where
 * new8_ok, pa_append never (the host picks one by new8_ok's rule: without
 * append_new8 in the kernel the staged paths of a head a warp run 256 x 1
 * tokens 7.1 -> 6.9 us, 1024 x 1 13.1 -> 12.6; docs/append.md). */
template <bool NEW8> __device__ __forceinline__ void append_body(const pa_append_params &p) {
    __shared__ double s_x[WARPS][STAGE];
    __shared__ rot_t s_cs[WARPS][MAX_HALF], s_sn[WARPS][MAX_HALF];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 w = (i64)blockIdx.x * WARPS + warp;
    const i64 item = w / p.split; /* a new token, then a query token */
    const int share = (int)(w - item * p.split);
    const int D = p.head_dim;
    const pa_seq_meta *meta = (const pa_seq_meta *)p.meta;
    double *x = s_x[warp];
    rot_t *cs = s_cs[warp], *sn = s_sn[warp];
    /* this warp's heads of the token's `heads` */
    auto heads_of = [&](int heads, int &h0, int &nh) {
        const int per = (heads + p.split - 1) / p.split;
        h0 = min(heads, share * per);
        nh = min(heads, h0 + per) - h0;
    };

    if (item < p.total_new) {
        /* new token n: its k/v rows (all kv heads) -> its page slot */
        const i64 n = item;
        const int b = p.new_per_seq > 0 ? (int)(n / p.new_per_seq)
                                          : pa_warp_upper_index(p.batch, n, lane, [&](int i) { return meta[i].new_prefix; });
        /* this warp's heads h0 .. of the token's [kv_heads, D] rows, adjacent on both sides */
        int h0, nh;
        heads_of(p.kv_heads, h0, nh);
        if (NEW8 && new8_ok(p, nh)) {
            if (p.rot_cos) append_new8<PA_APPEND_KV / 2, true>(p, n, b, h0, nh, cs, sn, lane);
            else append_new8<1, false>(p, n, b, h0, nh, cs, sn, lane);
            return;
        }
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
        const i64 src = ((m.new_row + i) * p.kv_heads + h0) * (i64)D;
        const i64 dst = page * p.page_stride + slot * p.row_stride + (i64)h0 * D;
        if (p.rot_cos) stage_rot(p, pos, cs, sn, lane);
        if constexpr (FP8) {
            /* (a lane an element: x exact in double and f32, times its head's 1 / scale) */
            fp8_store vq{&p, (void *)p.v_cache, dst, h0, false};
            for (i64 e = lane; e < (i64)nh * D; e += 32) vq(e, (double)E::load((const void *)p.v_new, src + e));
            fp8_store kq{&p, (void *)p.k_cache, dst, h0, true};
            if (!p.rot_cos) {
                for (i64 e = lane; e < (i64)nh * D; e += 32) kq(e, (double)E::load((const void *)p.k_new, src + e));
                return;
            }
            __syncwarp(); /* cos/sin staged */
            rotate_rows<true>(p, (const void *)p.k_new, src, nh, x, cs, sn, lane, [&](i64 e, double v) { kq(e, v); });
            return;
        }
        copy_rows((char *)p.v_cache + dst * ESZ, (const char *)p.v_new + src * ESZ, (i64)nh * D, lane);
        if (!p.rot_cos) {
            copy_rows((char *)p.k_cache + dst * ESZ, (const char *)p.k_new + src * ESZ, (i64)nh * D, lane);
            return;
        }
        const char *ks = (const char *)p.k_new + src * ESZ;
        char *kd = (char *)p.k_cache + dst * ESZ;
        if (rows8_ok(p, nh, (u64)ks, (u64)kd)) {
            rows8_pass<OUT_DT, 2> first;
            first.load(p, ks, nh, 0, lane);
            __syncwarp(); /* cos/sin staged */
            rotate_rows8(p, ks, kd, nh, cs, sn, lane, first);
            return;
        }
        rotate_rows(p, (const void *)p.k_new, src, nh, x, cs, sn, lane,
                    [&](i64 e, double v) { pa_store_f64<PA_DTYPE>((void *)p.k_cache, dst + e, v); });
        return;
    }
    /* query token r: its q rows (all heads) -> rotated f32 copies; the
     * rows' first loads (16-byte path) before the sequence and cos/sin */
    const i64 r = item - p.total_new;
    if (r >= p.q_rows) return;
    int h0, nh;
    heads_of(p.heads, h0, nh);
    const i64 off = (r * p.heads + h0) * (i64)D;
    float *out = (float *)p.q_rot + off;
    const char *qs = (const char *)p.q + off * ESZ;
    const bool r8 = rows8_ok(p, nh, (u64)qs, (u64)out);
    rows8_pass<OUT_F32, 2> first;
    if (r8) first.load(p, qs, nh, 0, lane);
    const int b = p.q_per_seq > 0 ? (int)(r / p.q_per_seq)
                                  : pa_warp_upper_index(p.batch, r, lane, [&](int i) { return meta[i].q_start; });
    const pa_seq_meta m = meta[b];
    const i64 pos = (i64)m.append_pos + (p.rope_q_step ? r - m.q_start : 0);
    stage_rot(p, pos, cs, sn, lane);
    if (r8) {
        __syncwarp(); /* cos/sin staged */
        rotate_rows8(p, qs, (char *)out, nh, cs, sn, lane, first);
        return;
    }
    rotate_rows(p, (const void *)p.q, off, nh, x, cs, sn, lane, [&](i64 e, double v) { out[e] = (float)v; });
}

/* Four fp8 values times s, rounded once to q's 16-bit type, where the
 * product is exact in f32 and in that type (dq_exact_scale): the pass's
 * arithmetic without pa_mul_f32_odd's residual or a division. */
__device__ __forceinline__ bool dq_exact_scale(float s) {
    /* bf16: a power of two within 2^+-64 (an fp8 value has at most 4
     * significant bits, 2^-16 .. 2^16 in size: the product stays a normal
     * f32 and bf16 holds it); f16, whose exponents are fewer: 1 only */
    const u32 e = __float_as_uint(s) >> 23;
    if constexpr (PA_DTYPE == PA_DT_BF16) return (__float_as_uint(s) & 0x007fffffu) == 0u && e >= 63u && e <= 191u;
    return s == 1.f;
}
template <int KV> __device__ __forceinline__ void dq_exact4(u32 in, float s, u32 &lo, u32 &hi) {
    if constexpr (PA_DTYPE == PA_DT_BF16) {
        float x[4];
        pa_fp8x4_to_f32<KV>(in, x);
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] *= s;
        pa_f32x4_to_b16<PA_DT_BF16>(x, lo, hi);
    } else {
        pa_fp8x4_to_b16<KV, PA_DTYPE>(in, lo, hi); /* (s is 1) */
    }
}

/* The keys of block-table entry (b, j) = blockIdx.x's, widened from fp8
 * (pa_dequant_params), zeros past the sequence's last key (the entries past
 * its pages are not read): 8 elements a thread at a time, an 8-byte load, each
 * times its kv head's scale (exact, pa_mul_f32_odd) and rounded once, a 16-byte
 * store; a thread's DQ_UNROLL loads go out before its first conversion. Only
 * in the fp8 modules of a 16-bit q (elsewhere: nothing). */
#define DQ_UNROLL 4
#ifndef PA_DEQUANT_MUL
#define PA_DEQUANT_MUL 0
#endif
/* (PA_DEQUANT_EXACT) the exact-scale path below: the same values bit for
 * bit (the product is exact), fewer operations; chunked prefill over the
 * copy 1.8% faster in one H100 A/B (docs/fp8.md), so on; nvrtc_options
 * "-DPA_DEQUANT_EXACT=0" for A/Bs */
#ifndef PA_DEQUANT_EXACT
#define PA_DEQUANT_EXACT 1
#endif
extern "C" __global__ void __launch_bounds__(256) pa_dequant(const pa_dequant_params p) {
    if constexpr (FP8 && ESZ == 2) {
        const int b = (int)(blockIdx.x / (unsigned)p.width), j = (int)(blockIdx.x - (unsigned)b * (unsigned)p.width);
        const int keys = max(0, min(((const int *)p.seqlen)[b] - j * p.page_size, p.page_size));
        const i64 dst = (i64)blockIdx.x * p.page_stride;
        const int per = p.head_dim >> 3, row = p.kv_heads * per; /* chunks a head, a key */
        const int n = keys * row, all = p.page_size * row;
        /* the slots past the sequence's last key: zeros, not what the scratch
         * held (a kernel may load them with a tile; masked, but 0 * NaN is NaN) */
        for (int c = n + threadIdx.x; c < all; c += blockDim.x) {
            *(uint4 *)((char *)p.k_out + (dst + 8 * (i64)c) * 2) = make_uint4(0u, 0u, 0u, 0u);
            *(uint4 *)((char *)p.v_out + (dst + 8 * (i64)c) * 2) = make_uint4(0u, 0u, 0u, 0u);
        }
        if (n == 0) return;
        const i64 src = (i64)((const int *)p.block_table)[(i64)b * p.bt_stride + j] * p.page_stride;
        const u8 *kin = (const u8 *)p.k_cache + src, *vin = (const u8 *)p.v_cache + src;
        /* (PA_DEQUANT_MUL) a chunk's kv head, (cc / per) % kv_heads, by
         * multiplications: x / d = umulhi(x, ceil(2^32 / d)) wherever x d <
         * 2^32 (cc < 2^13 kv_heads, per <= 32: below 4096 kv heads); the two
         * divisions by run-time values a chunk are most of the pass's integer
         * work (ALU 83% busy, docs/fp8.md). Two H100 runs moved the chunked
         * prefill +1% and -6% (rows not alternated): not shown to help, so off
         * (nvrtc_options "-DPA_DEQUANT_MUL=1") */
        const u32 m_per = 0xffffffffu / (u32)per + 1u, m_hk = 0xffffffffu / (u32)p.kv_heads + 1u;
        /* where the block's threads are a whole number of key rows (every
         * bench and model shape: 8 kv heads x 128 dims are 128 chunks), a
         * thread's chunks all sit at one place of a row (c steps by the block
         * size, n is whole rows), so one kv head: its scales read once, and
         * where they are exact (dq_exact_scale: 1, the default, and any power
         * of two for bf16) the values widen without the residual */
        const bool one_head = blockDim.x % (unsigned)row == 0u;
        const int hk1 = one_head ? (int)(threadIdx.x % (unsigned)row) / per : 0;
        const float sk1 = p.k_scales ? ((const float *)p.k_scales)[hk1] : p.k_scale;
        const float sv1 = p.v_scales ? ((const float *)p.v_scales)[hk1] : p.v_scale;
        const bool exact_k = PA_DEQUANT_EXACT && one_head && dq_exact_scale(sk1);
        const bool exact_v = PA_DEQUANT_EXACT && one_head && dq_exact_scale(sv1);
        for (int c0 = threadIdx.x; c0 < 2 * n; c0 += DQ_UNROLL * blockDim.x) {
            uint2 raw[DQ_UNROLL];
#pragma unroll
            for (int u = 0; u < DQ_UNROLL; u++) {
                const int c = c0 + u * blockDim.x, cc = c >= n ? c - n : c;
                if (c < 2 * n) raw[u] = *(const uint2 *)((c >= n ? vin : kin) + 8 * (i64)cc);
            }
#pragma unroll
            for (int u = 0; u < DQ_UNROLL; u++) {
                const int c = c0 + u * blockDim.x;
                if (c >= 2 * n) break;
                const bool is_v = c >= n;
                const int cc = is_v ? c - n : c;
                if (is_v ? exact_v : exact_k) {
                    const float s = is_v ? sv1 : sk1;
                    uint4 o;
                    dq_exact4<PA_KV>(raw[u].x, s, o.x, o.y);
                    dq_exact4<PA_KV>(raw[u].y, s, o.z, o.w);
                    *(uint4 *)((char *)(is_v ? p.v_out : p.k_out) + (dst + 8 * (i64)cc) * 2) = o;
                    continue;
                }
                const u32 hd = per == 1 ? (u32)cc : __umulhi((u32)cc, m_per); /* cc / per */
                const int hk = !(PA_DEQUANT_MUL && p.kv_heads < 4096) ? (cc % row) / per /* (past the bound: divisions) */
                             : p.kv_heads == 1 ? 0 : (int)(hd - __umulhi(hd, m_hk) * (u32)p.kv_heads);
                const u64 sc = is_v ? p.v_scales : p.k_scales;
                const float s = sc ? ((const float *)sc)[hk] : (is_v ? p.v_scale : p.k_scale);
                float x[8];
                pa_fp8x4_to_f32<PA_KV>(raw[u].x, *(float(*)[4])x);
                pa_fp8x4_to_f32<PA_KV>(raw[u].y, *(float(*)[4])(x + 4));
                out8<OUT_DT> y;
#pragma unroll
                for (int i = 0; i < 8; i++) y.put_odd(i, pa_mul_f32_odd(x[i], s));
                y.flush((char *)(is_v ? p.v_out : p.k_out) + (dst + 8 * (i64)cc) * 2, 0);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, PA_APPEND_MINB) pa_append(const pa_append_params p) {
    append_body<false>(p);
}
extern "C" __global__ void __launch_bounds__(WARPS * 32, PA_APPEND_MINB) pa_append_new8(const pa_append_params p) {
    append_body<true>(p);
}

#endif /* PA_EMBED_ONLY */
