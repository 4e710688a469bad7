/*
 * mma.cuh -- tensor-core building blocks shared by the decode and prefill
 * kernels (sm_80 and up): ldmatrix from shared memory, mma.sync m16n8k16 with
 * f32 accumulation, and packing two floats into the input type. The including
 * file defines PA_DTYPE (PA_DT_F16 or PA_DT_BF16).
 */
#ifndef PA_MMA_CUH
#define PA_MMA_CUH
#ifndef PA_EMBED_ONLY

#include "common.cuh"

#if PA_DTYPE != PA_DT_F16 && PA_DTYPE != PA_DT_BF16
#error "tensor cores: PA_DTYPE must be f16 or bf16"
#endif

/* From a shared-memory address (u32): base + constant offsets fold into the
 * instruction instead of occupying registers. */
PA_DEV void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
PA_DEV void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
PA_DEV void ldsm_x2(u32 (&r)[2], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
PA_DEV void ldmatrix_x4(u32 (&r)[4], const void *smem) { ldsm_x4(r, pa_smem_addr(smem)); }
PA_DEV void ldmatrix_x2(u32 (&r)[2], const void *smem) { ldsm_x2(r, pa_smem_addr(smem)); }
PA_DEV void ldmatrix_x4_trans(u32 (&r)[4], const void *smem) { ldsm_x4_trans(r, pa_smem_addr(smem)); }
/* c += a b: m16n8k16, A row-major 16x16, B "col" 16x8 (8 columns of 16), f32;
 * A and B of type DT (f16 or bf16) */
template <int DT> PA_DEV void mma16816_t(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (DT == PA_DT_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
PA_DEV void mma16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) { mma16816_t<PA_DTYPE>(c, a, b0, b1); }
/* c += a b: m16n8k8 (A 16x8, B 8x8: a P V product of 8 keys) */
template <int DT> PA_DEV void mma1688_t(float (&c)[4], const u32 (&a)[2], u32 b) {
    if constexpr (DT == PA_DT_BF16)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
    else
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
}
/* two floats -> the 16-bit type DT, packed: lo in the low half */
template <int DT> PA_DEV u32 pack2_t(float lo, float hi) {
    u32 r;
    if constexpr (DT == PA_DT_BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
/* ... into the input type */
PA_DEV u32 pack2(float lo, float hi) { return pack2_t<PA_DTYPE>(lo, hi); }
/* the halves of a packed pair, back to f32 */
PA_DEV float unpack_lo(u32 v) {
#if PA_DTYPE == PA_DT_BF16
    return pa_bf16_to_f32((u16)(v & 0xffffu));
#else
    return pa_f16_to_f32((u16)(v & 0xffffu));
#endif
}
PA_DEV float unpack_hi(u32 v) {
#if PA_DTYPE == PA_DT_BF16
    return pa_bf16_to_f32((u16)(v >> 16));
#else
    return pa_f16_to_f32((u16)(v >> 16));
#endif
}

#endif /* PA_EMBED_ONLY */
#endif /* PA_MMA_CUH */
