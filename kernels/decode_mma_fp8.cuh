/*
 * decode_mma_fp8.cuh -- decode_mma's pieces for fp8 caches (decode_mma.cu
 * includes it after decode_mma_shape.cuh; its header gives the layout): the
 * stage swizzle of fp8 rows, the MMAs' input type, q's fragments permuted as
 * an fp8 K fragment's dims are, K and V fragments widened from fp8 rows, and
 * (QS) q's rows scaled into f16.
 */
#ifndef PA_EMBED_ONLY
#ifndef PA_DECODE_MMA_FP8_CUH
#define PA_DECODE_MMA_FP8_CUH

/* The byte offset of 16-byte chunk c in row r of an fp8 stage: 8 chunks a row (D 128) or 4 (D 64, two
 * rows a 128-byte line) */
PA_DEV int fp8_chunk_at(int r, int c) { return (GCPR == 8 ? c ^ (r & 7) : c ^ ((r >> 1) & 3)) * 16; }

/* The MMAs' input type: q's, but f16 for a bf16 q over an fp8 cache (QS;
 * decode_mma.cu's header says why): 1-8% off the fp8 decode's time on three
 * H100 leases (docs/fp8.md). PA_FP8_F16_MMA=0 (tuning nvrtc_options
 * "-DPA_FP8_F16_MMA=0") keeps the MMAs in bf16, for A/Bs. */
#ifndef PA_FP8_F16_MMA
#define PA_FP8_F16_MMA 1
#endif
constexpr int MT = FP8 && PA_FP8_F16_MMA ? PA_DT_F16 : PA_DTYPE;
constexpr bool QS = MT != PA_DTYPE;

/* (fp8) q's fragment a (m16n8k16's A: a[0], a[2] row g dims 2t.., 2t + 8..;
 * a[1], a[3] row g + 8) with its dims permuted as an fp8 K fragment's are
 * (decode_mma.cu's header): a[0] takes dims 4t, 4t + 1 (pair 2t), a[2] dims
 * 4t + 2, 4t + 3 (pair 2t + 1); pair P sits in lane P % 4's a[0] (P < 4) or a[2] */
PA_DEV void fp8_permute_q(u32 (&a)[4], int lane) {
    const int t4 = lane & 3, base = lane & ~3, s0 = base + ((2 * t4) & 3), s1 = base + ((2 * t4 + 1) & 3);
    const bool hi = t4 >= 2;
#pragma unroll
    for (int r = 0; r < 2; r++) { /* rows g (a[0], a[2]) and g + 8 (a[1], a[3]) */
        const u32 x0 = __shfl_sync(0xffffffffu, a[r], s0), y0 = __shfl_sync(0xffffffffu, a[r + 2], s0);
        const u32 x1 = __shfl_sync(0xffffffffu, a[r], s1), y1 = __shfl_sync(0xffffffffu, a[r + 2], s1);
        a[r] = hi ? y0 : x0;
        a[r + 2] = hi ? y1 : x1;
    }
}
/* (fp8) K fragments b[0..3] of keys n * 8 .. + 7 (ldmatrix row kr = lane %
 * 8), dims 32 kk .. 32 kk + 31 permuted: two fp8 chunks (lanes 0-7 and 8-15
 * give their rows), converted */
PA_DEV void fp8_kfrag(const u8 *sk, int kk, int n, u32 (&b)[4], int lane) {
    const int kr = lane & 7, kc = (lane >> 3) & 1;
    u32 r[2];
    ldmatrix_x2(r, sk + (n * 8 + kr) * GSTRIDE + fp8_chunk_at(kr, 2 * kk + kc));
    pa_fp8x4_to_b16<PA_KV, MT>(r[0], b[0], b[1]);
    pa_fp8x4_to_b16<PA_KV, MT>(r[1], b[2], b[3]);
}
/* (fp8) a transposed fp8 matrix's register (keys 2t, 2t + 1 of dims 2g,
 * 2g + 1) as B fragments: e of the even dims' tile, od of the odd */
PA_DEV void fp8_vfrag(u32 x, u32 &e, u32 &od) { pa_fp8x4_to_b16<PA_KV, MT>(__byte_perm(x, 0u, 0x3120), e, od); }

/* (QS) q's rows in f16: row g times 2^c0, row g + 8 times 2^c1, c chosen so
 * that the row's largest |element| lies in [2^15, 2^16) (below 65504): every
 * element within 2^-29 of it is exact in f16, a smaller one rounds to f16's
 * subnormal step, 2^-40 of the largest; the scores are scaled back by 2^-c,
 * exactly. A row holding inf or NaN keeps c = 0, a row of zeros or
 * subnormals takes c = 126. The kernel keeps qinv0 = 2^-c0 and qinv1 (2^c
 * from it by one subtraction: the fp8 kernel is at the register limit). */
PA_DEV float qs_inv2(float x) { return __uint_as_float((254u << 23) - __float_as_uint(x)); }
PA_DEV void qs_to_f16(u32 (&a)[4], float qinv0, float qinv1) {
    const float f0 = qs_inv2(qinv0), f1 = qs_inv2(qinv1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float f = i & 1 ? f1 : f0;
        a[i] = pack2_t<PA_DT_F16>(__uint_as_float(a[i] << 16) * f, __uint_as_float(a[i] & 0xffff0000u) * f);
    }
}
PA_DEV float qs_scale_of(u32 e) { /* e: a bf16's magnitude bits */
    const int E = (int)(e >> 7), c = E >= 255 ? 0 : min(142 - E, 126);
    return __uint_as_float((u32)(127 - c) << 23);
}
PA_DEV void qs_scales(const u32 (&qf)[D / 16][4], float &qinv0, float &qinv1) {
    u32 e0 = 0, e1 = 0; /* the largest |element| bits of rows g, g + 8 (bf16 in each half) */
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        e0 = __vmaxu2(e0, __vmaxu2(qf[ks][0] & 0x7fff7fffu, qf[ks][2] & 0x7fff7fffu));
        e1 = __vmaxu2(e1, __vmaxu2(qf[ks][1] & 0x7fff7fffu, qf[ks][3] & 0x7fff7fffu));
    }
    e0 = max(e0 & 0xffffu, e0 >> 16);
    e1 = max(e1 & 0xffffu, e1 >> 16);
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) { /* the quad holds the row */
        e0 = max(e0, __shfl_xor_sync(0xffffffffu, e0, x));
        e1 = max(e1, __shfl_xor_sync(0xffffffffu, e1, x));
    }
    qinv0 = qs_scale_of(e0);
    qinv1 = qs_scale_of(e1);
}

#endif /* PA_DECODE_MMA_FP8_CUH */
#endif /* PA_EMBED_ONLY */
