/*
 * ws_common.cuh -- what the warp-specialised Hopper kernels (prefill_ws.cu,
 * prefill_f8.cu) share: mbarriers, TMA and bulk copies, and the named
 * barriers of their two consumer warpgroups (ping-pong on the tensor cores).
 */
#ifndef PA_WS_COMMON_CUH
#define PA_WS_COMMON_CUH
#ifndef PA_EMBED_ONLY

#include "common.cuh"

/* ---- mbarriers (shared memory, CTA scope) ---- */
PA_DEV void mbar_init(u64 *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(pa_smem_addr(bar)), "r"(count) : "memory");
}
PA_DEV void mbar_arrive(u64 *bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(pa_smem_addr(bar))
                 : "memory");
}
/* The K and V rings of STAGES slots: each slot's "full" barrier takes
 * full_count arrivals (the producer's), its "empty" one an arrival per
 * consumer warp (two warpgroups: 8). */
template <int STAGES>
PA_DEV void mbar_init_rings(u64 (&full_k)[STAGES], u64 (&full_v)[STAGES], u64 (&empty_k)[STAGES],
                            u64 (&empty_v)[STAGES], int full_count) {
    for (int s = 0; s < STAGES; s++) {
        mbar_init(&full_k[s], full_count);
        mbar_init(&full_v[s], full_count);
        mbar_init(&empty_k[s], 8);
        mbar_init(&empty_v[s], 8);
    }
}
/* one arrival once every cp.async this thread issued before has landed */
PA_DEV void mbar_arrive_cp_async(u64 *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(pa_smem_addr(bar)) : "memory");
}
/* until the phase of parity `parity` has completed */
PA_DEV void mbar_wait(u64 *bar, u32 parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(pa_smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
/* one arrival that also expects `bytes` of asynchronous (TMA) writes */
PA_DEV void mbar_arrive_expect_tx(u64 *bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(pa_smem_addr(bar)), "r"(bytes)
                 : "memory");
}
/* A TMA box of the 3-D map (column c0, kv head c1, cache row c2) into
 * shared memory at dst, completing on bar (transaction bytes). */
PA_DEV void tma_load(u32 dst, const void *map, int c0, int c1, int c2, u64 *bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
                 "[%5];\n" ::"r"(dst),
                 "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(pa_smem_addr(bar))
                 : "memory");
}

/* A page box (tma=2): the 5-D map's box at 8-row group c4 of kv head c3
 * (all of its columns). */
PA_DEV void tma_load_page(u32 dst, const void *map, int c3, int c4, u64 *bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %2, %2, "
                 "%3, %4}], [%5];\n" ::"r"(dst),
                 "l"((u64)map), "r"(0), "r"(c3), "r"(c4), "r"(pa_smem_addr(bar))
                 : "memory");
}

/* A TMA box of the 3-D map from shared memory at src to (c0, c1, c2), in
 * this thread's bulk group (tma_store_commit_wait_read: until the group has
 * read shared memory; the global writes complete on their own). */
PA_DEV void tma_store(const void *map, int c0, int c1, int c2, u32 src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"((u64)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}
PA_DEV void tma_store_commit_wait_read() {
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* A bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned)
 * from global memory at src into shared memory at dst, completing on bar
 * (transaction bytes): no tensor map, the bytes already in their layout. */
PA_DEV void bulk_load(u32 dst, const void *src, u32 bytes, u64 *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"((u64)src), "r"(bytes), "r"(pa_smem_addr(bar))
                 : "memory");
}

/* the consumers' own barrier (named barrier 1, 256 threads) */
PA_DEV void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
/* Ping-pong of the consumers' products: named barrier 2 + c is consumer c's
 * turn; it waits on its own (128 threads) until the other one, having issued
 * its products, arrives (128 more). */
PA_DEV void turn_wait(int c) {
    if (c == 0) asm volatile("bar.sync 2, 256;\n" ::: "memory");
    else asm volatile("bar.sync 3, 256;\n" ::: "memory");
}
PA_DEV void turn_pass(int c) {
    if (c == 0) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    else asm volatile("bar.arrive 2, 256;\n" ::: "memory");
}

#endif /* PA_EMBED_ONLY */
#endif /* PA_WS_COMMON_CUH */
