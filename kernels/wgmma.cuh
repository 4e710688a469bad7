/*
 * wgmma.cuh -- Hopper warpgroup MMA (sm_90a), m64nNk16, f32 accumulation, the
 * input type of PA_DTYPE (f16 or bf16): fence / commit / wait, the operand
 * fences that keep the compiler from moving register accesses across them,
 * shared-memory descriptors, and (wgmma_ops.cuh, generated) the products:
 *   pa_wgmma_ss<N>(d, desc_a, desc_b, accumulate): A and B from shared memory
 *     (both K-major: Q K^T).
 *   pa_wgmma_rs<N>(d, a, desc_b, accumulate): A from registers (the mma.sync
 *     A fragment layout per warp), B from shared memory MN-major (P V).
 * d[N / 8][4]: the accumulator fragment (column group i of 8: d[i][0..3] =
 * rows g, g, g + 8, g + 8 of the warp's 16, columns 8i + 2 t4 + {0, 1, 0, 1}),
 * as mma.sync's m16n8 accumulators.
 */
#ifndef PA_WGMMA_CUH
#define PA_WGMMA_CUH
#ifndef PA_EMBED_ONLY

#include "common.cuh"

#if PA_DTYPE == PA_DT_BF16
#define PA_WGMMA_TYPE "bf16"
#else
#define PA_WGMMA_TYPE "f16"
#endif

PA_DEV void pa_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
PA_DEV void pa_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> PA_DEV void pa_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/* generic-proxy writes to shared memory (st.shared, cp.async) -> visible to wgmma */
PA_DEV void pa_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int M> PA_DEV void pa_fence_operands(float (&d)[M][4]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+f"(d[i][j])::"memory");
}
/* The A fragments of an RS wgmma are read while it runs, but the compiler
 * sees them dead once it is issued; fencing them after the wait that retires
 * the wgmma keeps them live (untouched) until then. */
template <int M> PA_DEV void pa_fence_operands(u32 (&d)[M][4]) {
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(d[i][j])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle: address and the two
 * byte offsets in 16-byte units (the tile's base 1024-byte aligned). */
PA_DEV u64 pa_wgmma_desc(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes) {
    return (u64)((smem_addr & 0x3ffff) >> 4) | ((u64)(lbo_bytes >> 4) << 16) | ((u64)(sbo_bytes >> 4) << 32) |
           (1ull << 62);
}

#include "wgmma_ops.cuh"

#endif /* PA_EMBED_ONLY */
#endif /* PA_WGMMA_CUH */
