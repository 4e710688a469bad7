/*
 * common.cuh -- what every kernel shares: integer types (NVRTC has no libc
 * headers), dtype conversions that round exactly like src/core/internal.h,
 * the Philox-4x32-10 + Box-Muller twin of pa_randn4, cp.async and a few PTX
 * helpers. Kernels are compiled at run time by NVRTC (src/cuda/cuda_kernels.c)
 * with their shape constants as -D defines.
 */
#ifndef PA_COMMON_CUH
#define PA_COMMON_CUH
#ifndef PA_EMBED_ONLY

#include "params.h"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

/* dtype codes: the values of pa_dtype */
#define PA_DT_F32 0
#define PA_DT_F16 1
#define PA_DT_BF16 2
#define PA_DT_FP8_E4M3 4
#define PA_DT_FP8_E5M2 5
#define PA_DT_IS_FP8(dt) ((dt) == PA_DT_FP8_E4M3 || (dt) == PA_DT_FP8_E5M2)

#define PA_LOG2E 1.4426950408889634f
#define PA_LN2 0.6931471805599453f
#define PA_INF __int_as_float(0x7f800000)

#define PA_DEV __device__ __forceinline__
__host__ __device__ constexpr int pa_cmax(int a, int b) { return a > b ? a : b; }
/* a compile-time flag passed as a value (a generic lambda's `auto` argument) */
template <bool B> struct pa_bool {
    static constexpr bool value = B;
};

/* ---- scalar conversions (round to nearest even, as the host does) ---- */

PA_DEV float pa_bf16_to_f32(u16 h) { return __uint_as_float((u32)h << 16); }

PA_DEV u16 pa_f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

PA_DEV float pa_f16_to_f32(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

PA_DEV u16 pa_f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* ---- fp8 (the host's src/core/internal.h says the formats) ----
 * Decoding is exact; encoding rounds to nearest even and saturates at the
 * largest finite value (infinities too), NaN stays NaN: the integer code of
 * the host's pa_f32_to_fp8, so both write the same bytes. */
PA_DEV float pa_fp8_e4m3_to_f32(u32 b) {
    const u32 sign = (b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(sign | 0x7fc00000u);
    if (e == 0u) return __uint_as_float(__float_as_uint((float)m * 0.001953125f) | sign); /* m 2^-9 */
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}
PA_DEV float pa_fp8_e5m2_to_f32(u32 b) { return pa_f16_to_f32((u16)((b & 0xffu) << 8)); }

template <int DT> PA_DEV u32 pa_f32_to_fp8(float f) {
    constexpr bool e4 = DT == PA_DT_FP8_E4M3;
    constexpr int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    const u32 u = __float_as_uint(f);
    const u32 sign = (u >> 24) & 0x80u;
    const u32 a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    if (a >= (e4 ? 0x43e00000u : 0x47600000u)) return sign | (e4 ? 0x7eu : 0x7bu);
    const int E = a >= 0x00800000u ? (int)(a >> 23) - 127 : -126;
    const u32 m = (a & 0x7fffffu) | (a >= 0x00800000u ? 0x800000u : 0u);
    int e = E < 1 - bias ? 1 - bias : E;
    const int sh = 23 - mbits + (e - E);
    if (sh > 24) return sign;
    u32 n = m >> sh;
    const u32 rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (n & 1u))) n++;
    if (n >= (2u << mbits)) {
        n >>= 1;
        e++;
    }
    if (n < (1u << mbits)) return sign | n;
    return sign | (((u32)(e + bias) << mbits) | (n - (1u << mbits)));
}

/* The fp8 append's value (the host's pa_fp8_scaled and pa_rotate_f32, so
 * both backends write the same bytes): x times its kv head's 1 / scale
 * (an f32, pa_fp8_inv_scale's), rounded to f32, then to fp8; a rotated
 * pair in f32, each product rounded and one FMA. */
template <int DT> PA_DEV u32 pa_fp8_scaled(float x, float inv) { return pa_f32_to_fp8<DT>(__fmul_rn(x, inv)); }
PA_DEV void pa_rotate_f32(float x0, float x1, float c, float s, float &y0, float &y1) {
    const float t0 = __fmul_rn(x1, s), t1 = __fmul_rn(x1, c);
    y0 = __fmaf_rn(x0, c, -t0);
    y1 = __fmaf_rn(x0, s, t1);
}

template <int DT> struct pa_elem;
template <> struct pa_elem<PA_DT_F32> {
    typedef float T;
    static PA_DEV float load(const void *p, i64 i) { return ((const float *)p)[i]; }
    static PA_DEV void store(void *p, i64 i, float v) { ((float *)p)[i] = v; }
};
template <> struct pa_elem<PA_DT_F16> {
    typedef u16 T;
    static PA_DEV float load(const void *p, i64 i) { return pa_f16_to_f32(((const u16 *)p)[i]); }
    static PA_DEV void store(void *p, i64 i, float v) { ((u16 *)p)[i] = pa_f32_to_f16(v); }
};
template <> struct pa_elem<PA_DT_BF16> {
    typedef u16 T;
    static PA_DEV float load(const void *p, i64 i) { return pa_bf16_to_f32(((const u16 *)p)[i]); }
    static PA_DEV void store(void *p, i64 i, float v) { ((u16 *)p)[i] = pa_f32_to_bf16(v); }
};

template <> struct pa_elem<PA_DT_FP8_E4M3> {
    typedef u8 T;
    static PA_DEV float load(const void *p, i64 i) { return pa_fp8_e4m3_to_f32(((const u8 *)p)[i]); }
    static PA_DEV void store(void *p, i64 i, float v) { ((u8 *)p)[i] = (u8)pa_f32_to_fp8<PA_DT_FP8_E4M3>(v); }
};
template <> struct pa_elem<PA_DT_FP8_E5M2> {
    typedef u8 T;
    static PA_DEV float load(const void *p, i64 i) { return pa_fp8_e5m2_to_f32(((const u8 *)p)[i]); }
    static PA_DEV void store(void *p, i64 i, float v) { ((u8 *)p)[i] = (u8)pa_f32_to_fp8<PA_DT_FP8_E5M2>(v); }
};

/* Whether fp8 of format KV widens through f16 pairs: e5m2 is an f16's upper
 * byte; e4m3 has the hardware's conversion from sm_89 on. */
template <int KV> PA_DEV constexpr bool pa_fp8_via_f16() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return true;
#else
    return KV == PA_DT_FP8_E5M2;
#endif
}

/* Four fp8 bytes (byte i of `in` is element i) as two packed f16 pairs
 * (element 0 in h0's low half), exactly; only where pa_fp8_via_f16. */
template <int KV> PA_DEV void pa_fp8x4_to_f16x2(u32 in, u32 &h0, u32 &h1) {
    if constexpr (KV == PA_DT_FP8_E5M2) {
        h0 = __byte_perm(in, 0u, 0x1404); /* bytes 0, 1 into the upper bytes of the halves */
        h1 = __byte_perm(in, 0u, 0x3424);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
        asm("{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; cvt.rn.f16x2.e4m3x2 %1, b; }"
            : "=r"(h0), "=r"(h1)
            : "r"(in));
#else
        h0 = h1 = 0u; /* (never: pa_fp8_via_f16 is false) */
#endif
    }
}

/* Four fp8 bytes as four floats, exactly: through f16 where
 * pa_fp8_via_f16, else by the scalar decode. */
template <int KV> PA_DEV void pa_fp8x4_to_f32(u32 in, float (&x)[4]) {
    if constexpr (pa_fp8_via_f16<KV>()) {
        u32 h0, h1;
        pa_fp8x4_to_f16x2<KV>(in, h0, h1);
        x[0] = pa_f16_to_f32((u16)(h0 & 0xffffu));
        x[1] = pa_f16_to_f32((u16)(h0 >> 16));
        x[2] = pa_f16_to_f32((u16)(h1 & 0xffffu));
        x[3] = pa_f16_to_f32((u16)(h1 >> 16));
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) x[i] = pa_elem<KV>::load(&in, i);
    }
}

/* Four floats rounded to nearest into two packed pairs of the 16-bit type
 * OUT (f16 or bf16; x[0] in lo's low half). */
template <int OUT> PA_DEV void pa_f32x4_to_b16(const float (&x)[4], u32 &lo, u32 &hi) {
    if constexpr (OUT == PA_DT_BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(x[1]), "f"(x[0]));
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x[3]), "f"(x[2]));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(x[1]), "f"(x[0]));
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x[3]), "f"(x[2]));
    }
}

/* Four fp8 bytes as two packed pairs of the 16-bit type OUT (f16 or bf16;
 * element 0 in lo's low half), exactly: every fp8 value is one of theirs
 * (bf16 from f32: exact). */
template <int KV, int OUT> PA_DEV void pa_fp8x4_to_b16(u32 in, u32 &lo, u32 &hi) {
    if constexpr (OUT == PA_DT_F16 && pa_fp8_via_f16<KV>()) {
        pa_fp8x4_to_f16x2<KV>(in, lo, hi);
    } else {
        float x[4];
        pa_fp8x4_to_f32<KV>(in, x);
        pa_f32x4_to_b16<OUT>(x, lo, hi);
    }
}

/* double -> f32 rounded to odd (toward zero, last bit set if inexact):
 * rounding that once more to f16/bf16 is the correctly rounded result from
 * double. The twin of the host's pa_f64_to_f32_odd. */
PA_DEV float pa_f64_to_f32_odd(double x) {
    const float nearest = (float)x;
    if (isinf(nearest) || (double)nearest == x) return nearest;
    return __uint_as_float(__float_as_uint(__double2float_rz(x)) | 1u);
}

/* A double stored with one correct rounding, as the host's pa_store_f64. */
template <int DT> PA_DEV void pa_store_f64(void *p, i64 i, double v) {
    if (DT == PA_DT_F32) ((float *)p)[i] = (float)v;
    else pa_elem<DT>::store(p, i, pa_f64_to_f32_odd(v));
}

/* Any float dtype chosen at run time (rotary tables, which may differ from q's). */
PA_DEV float pa_load_any(const void *p, int dt, i64 i) {
    return dt == PA_DT_F32 ? pa_elem<PA_DT_F32>::load(p, i)
         : dt == PA_DT_F16 ? pa_elem<PA_DT_F16>::load(p, i)
                           : pa_elem<PA_DT_BF16>::load(p, i);
}

/* 8 consecutive elements as floats: one 16-byte load for f16/bf16, two for
 * f32, one 8-byte load for fp8. p must be 16-byte aligned (fp8: 8-byte).
 * (pa_load8_or_zero below: zeros when !in.) */
template <int DT> PA_DEV void pa_load8(const void *p, float (&x)[8]) {
    if constexpr (PA_DT_IS_FP8(DT)) {
        const uint2 v = *(const uint2 *)p;
        float a[4], b[4];
        pa_fp8x4_to_f32<DT>(v.x, a);
        pa_fp8x4_to_f32<DT>(v.y, b);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[i] = a[i];
            x[4 + i] = b[i];
        }
    } else if (DT == PA_DT_F32) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
        x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
    } else {
        const uint4 v = *(const uint4 *)p;
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (DT == PA_DT_BF16) {
                x[2 * i] = __uint_as_float(w[i] << 16);
                x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                x[2 * i] = pa_f16_to_f32((u16)(w[i] & 0xffffu));
                x[2 * i + 1] = pa_f16_to_f32((u16)(w[i] >> 16));
            }
        }
    }
}

/* pa_load8, or zeros for a lane with nothing to load (in == false). */
template <int DT> PA_DEV void pa_load8_or_zero(bool in, const void *p, float (&x)[8]) {
    if (in) {
        pa_load8<DT>(p, x);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = 0.f;
    }
}

/* ---- small PTX helpers ---- */

/* 2^x; 2^-inf = 0. The softmax runs in base 2 with log2(e) folded into the scores. */
PA_DEV float pa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

PA_DEV float pa_ld_cg(const float *p) { /* through L2 only: data another block wrote */
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

PA_DEV u32 pa_smem_addr(const void *p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

/* 16 bytes global -> shared, asynchronously; with pred false the 16 bytes are
 * zero-filled and nothing is read (src must still be a valid address). */
PA_DEV void pa_cp_async16(void *smem, const void *gmem, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(pa_smem_addr(smem)),
                 "l"(gmem), "r"(pred ? 16 : 0)
                 : "memory");
}
PA_DEV void pa_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Programmatic dependent launch (sm_90+; elsewhere, and in a grid not
 * launched so, nothing): the kernel after this one in the stream, launched
 * with programmatic stream serialization, may start once every block of
 * this one has called pa_launch_dependents (or exited); pa_wait_prior_grid
 * waits until the kernel before this one has completed, its writes visible. */
PA_DEV void pa_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
PA_DEV void pa_wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
template <int N> PA_DEV void pa_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- Philox-4x32-10 and Box-Muller: the twin of pa_philox / pa_randn4 ---- */

PA_DEV void pa_philox(u64 counter, u64 key, u32 out[4]) {
    u32 c0 = (u32)counter, c1 = (u32)(counter >> 32), c2 = 0, c3 = 0;
    u32 k0 = (u32)key, k1 = (u32)(key >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        const u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
        const u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
        const u32 n0 = hi1 ^ c1 ^ k0;
        const u32 n2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Four standard normals of Philox block `block`, in double like the host. */
PA_DEV void pa_randn4(u64 block, u64 seed, double out[4]) {
    u32 r[4];
    pa_philox(block, seed, r);
    const double two_pi = 6.283185307179586476925;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const double u1 = ((double)r[2 * k] + 1.0) * (1.0 / 4294967296.0);
        const double u2 = (double)r[2 * k + 1] * (1.0 / 4294967296.0);
        const double rad = sqrt(-2.0 * log(u1));
        out[2 * k] = rad * cos(two_pi * u2);
        out[2 * k + 1] = rad * sin(two_pi * u2);
    }
}

/* ---- masking: the twin of pa_mask_range (src/core/internal.h) ----
 * Keys that query i of a sequence may attend: [*lo, *hi). */
PA_DEV void pa_mask_range(int window_left, int window_right, int seqlen_q, int seqlen_k, int i,
                          int *lo, int *hi) {
    const i64 r = (i64)i + seqlen_k - seqlen_q; /* bottom-right aligned diagonal */
    i64 l = 0, h = seqlen_k;
    if (window_left >= 0 && r - window_left > l) l = r - window_left;
    if (window_right >= 0 && r + window_right + 1 < h) h = r + window_right + 1;
    if (h < l) h = l;
    if (l > seqlen_k) l = h = seqlen_k;
    if (h < 0) l = h = 0;
    *lo = (int)l;
    *hi = (int)h;
}

/* Largest b in [0, n) with key(b) <= x, for nondecreasing keys with key(0)
 * <= x, by a whole warp: each round its lanes test 32 points of the range
 * (one round of loads per 32x narrowing, where a binary search takes log2 n
 * dependent loads). */
template <typename F> PA_DEV int pa_warp_upper_index(int n, i64 x, int lane, F key) {
    int lo = 0, hi = n; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        const int step = (hi - lo + 31) / 32;
        const int at = lo + lane * step;
        const unsigned le = __ballot_sync(0xffffffffu, lane == 0 || (at < hi && key(at) <= x));
        lo += (31 - __clz(le)) * step;
        hi = min(hi, lo + step);
    }
    return lo;
}

#endif /* PA_EMBED_ONLY */
#endif /* PA_COMMON_CUH */
