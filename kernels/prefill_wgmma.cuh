/*
 * prefill_wgmma.cuh -- the steps the two Hopper prefill kernels share
 * (prefill_wgmma.cu, prefill_ws.cu): the products of one warpgroup's 64 rows
 * on wgmma, and the softmax of a tile while the previous tile's P V runs.
 * Tiles live in shared memory in the 128-byte swizzle layout (64-column
 * blocks of rows x 128 bytes; prefill_wgmma.cu's header comment).
 */
#ifndef PA_PREFILL_WGMMA_CUH
#define PA_PREFILL_WGMMA_CUH
#ifndef PA_EMBED_ONLY

#include "prefill_common.cuh"
#include "wgmma.cuh"

/* Byte offset of 16-byte chunk ch of row r in a tile of `rows` rows in the
 * 128-byte swizzle layout: 64-column blocks of rows x 128 bytes, chunk c of
 * row r at c ^ (r % 8) within its 128-byte line. */
PA_DEV u32 pa_swz(int rows, int r, int ch) {
    return (u32)((ch >> 3) * rows * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

/* A K or V tile's layout in shared memory: 8-row atoms of 128-byte lines
 * (1024 bytes, 128-byte swizzle); the atom of rows 8 g .. 8 g + 7 and
 * columns 64 b .. 64 b + 63 at g GS_ + b BS_. The default (pa_kv_rows):
 * 64-column blocks of BN rows, as pa_swz lays them out; prefill_ws.cu's
 * page boxes (tma=2) put each 8 rows' column blocks side by side. */
template <u32 GS_, u32 BS_> struct pa_kv_layout {
    static constexpr u32 GS = GS_, BS = BS_;
};
template <int BN> using pa_kv_rows = pa_kv_layout<1024, BN * 128>;

/* Issue S = Q K^T for warpgroup wg's 64 rows of the BM-row Q tile at q_addr
 * and the BN-key K tile at k_addr (both K-major; K in layout L), 16 columns
 * of the head dim per wgmma. Not committed. */
template <int D, int BM, int BN, class L = pa_kv_rows<BN>, int NK = BN>
PA_DEV void pa_wg_qk(float (&s)[BN / 8][4], u32 q_addr, int wg, u32 k_addr) {
    static_assert(NK == BN || (NK % 64 == 0 && NK < BN), "the first NK keys: whole n64 products");
    float(&sk)[NK / 8][4] = reinterpret_cast<float(&)[NK / 8][4]>(s[0]); /* NK < BN: s's first NK columns */
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const u32 blk = kk >> 2, sub = (kk & 3) * 32;
        const u64 da = pa_wgmma_desc(q_addr + blk * BM * 128 + wg * 64 * 128 + sub, 16, 1024);
        const u64 db = pa_wgmma_desc(k_addr + blk * L::BS + sub, 16, L::GS);
        pa_wgmma_ss<NK>(sk, da, db, kk > 0);
    }
}

/* Issue O += P V for the BN-key V tile at v_addr (MN-major; layout L), P
 * from registers, 16 keys (two 8-row atoms) per wgmma; the first NK keys
 * only where the rest of P is 0. Not committed. */
template <int D, int BN, class L = pa_kv_rows<BN>, int NK = BN>
PA_DEV void pa_wg_pv(float (&o)[D / 8][4], const u32 (&pa)[BN / 16][4], u32 v_addr) {
#pragma unroll
    for (int ks = 0; ks < NK / 16; ks++)
        pa_wgmma_rs<D>(o, pa[ks], pa_wgmma_desc(v_addr + ks * 2 * L::GS, L::BS, L::GS), 1);
}

/* The tiles [t0, t1) of a block whose keys start at kbase that every row of
 * the block takes whole (no range checks), from the warps' tightest ranges
 * (wlo, whi of each warp, gathered in s_w[2][nwarps]). */
PA_DEV void pa_interior_tiles(const int *s_w, int nwarps, int kbase, int bn, int nt, int &t0, int &t1) {
    int lo = 0, hi = 0x7fffffff;
    for (int i = 0; i < nwarps; i++) {
        lo = max(lo, s_w[i]);
        hi = min(hi, s_w[nwarps + i]);
    }
    t0 = lo > kbase ? (lo - kbase + bn - 1) / bn : 0;
    t1 = hi > kbase ? (hi - kbase) / bn : 0;
    t0 = min(t0, nt);
    t1 = max(t0, min(t1, nt));
}

/* The softmax of the tile whose scores s (keys from kt) have landed, while
 * P V of the previous tile may still run (WITH_PV): P in place of the
 * scores; then, once that P V has retired, O rescaled and P packed into pa
 * for the next P V. */
/* LIFT: P times 2^LIFT (prefill_f8.cu: P in e4m3 keeps its small values);
 * pack(s, pa): P into the fragments of the next P V (NP of them). */
template <int BN, int NATURAL, bool WITH_PV, int MASK, int NO, int LIFT, int NP, class Pack>
PA_DEV void pa_wg_softmax_with(const pa_attn_params &p, pa_lane_rows &rs, float (&s)[BN / 8][4], float (&o)[NO][4],
                               u32 (&pa)[NP][4], int kt, Pack pack) {
    float e0, e1, alpha0, alpha1;
    const bool rescale = pa_softmax_scores<BN / 8, NATURAL, MASK>(p, rs, s, kt, e0, e1, alpha0, alpha1);
    if constexpr (LIFT != 0) pa_p_exp<BN / 8>(rs, s, e0 - (float)LIFT, e1 - (float)LIFT);
    else pa_p_exp<BN / 8>(rs, s, e0, e1);
    if constexpr (WITH_PV) {
        pa_wgmma_wait<0>();
        pa_fence_operands(o);
        pa_fence_operands(pa); /* P(t - 1) stayed live (and untouched) until P V(t - 1) retired */
    }
    if (rescale) pa_rescale_o(o, alpha0, alpha1);
    pack(s, pa);
}
template <int BN, int NATURAL, bool WITH_PV, int MASK, int NO>
PA_DEV void pa_wg_softmax(const pa_attn_params &p, pa_lane_rows &rs, float (&s)[BN / 8][4], float (&o)[NO][4],
                          u32 (&pa)[BN / 16][4], int kt) {
    pa_wg_softmax_with<BN, NATURAL, WITH_PV, MASK, NO, 0>(p, rs, s, o, pa, kt,
                                                          [](const float (&x)[BN / 8][4], u32 (&a)[BN / 16][4]) {
#pragma unroll
                                                              for (int ks = 0; ks < BN / 16; ks++)
                                                                  pa_pack_p<BN / 8>(x, ks, a[ks]);
                                                          });
}

/* P V of the last tile, issued and waited for. */
template <int D, int BN, class L = pa_kv_rows<BN>, int NK = BN>
PA_DEV void pa_wg_pv_last(float (&o)[D / 8][4], const u32 (&pa)[BN / 16][4], u32 v_addr) {
    pa_fence_operands(o);
    pa_wgmma_fence();
    pa_wg_pv<D, BN, L, NK>(o, pa, v_addr);
    pa_wgmma_commit();
    pa_wgmma_wait<0>();
    pa_fence_operands(o);
}

/* A warpgroup's own epilogue, from its registers (no block barrier, no f32
 * staging): its 64 rows of O, normalised and rounded to the input type, into
 * the swizzled tile at smem (BM rows, the Q tile's layout: the warpgroup's
 * own Q rows are free once its last S has completed), and their lse straight
 * to global memory. The warpgroup then syncs and pa_write_rows_swz copies
 * the rows out. Rows as pa_write_rows_single. */
template <int D, int BM, int GT>
PA_DEV void pa_stage_rows_swz(const pa_attn_params &p, const pa_work &w, int hk, int g0, pa_lane_rows &r,
                              const float (&o)[D / 8][4], int R0, u8 *smem) {
    constexpr int ROWS = BM / GT * GT;
    const int t4 = (threadIdx.x & 31) & 3, R1 = R0 + 8;
    float inv0, inv1;
    pa_lane_rows_end(r, inv0, inv1);
#pragma unroll
    for (int n = 0; n < D / 8; n++) { /* chunk n of each row: bytes 4 t4 .. 4 t4 + 3 */
        *(u32 *)(smem + pa_swz(BM, R0, n) + 4 * t4) = pack2(o[n][0] * inv0, o[n][1] * inv0);
        *(u32 *)(smem + pa_swz(BM, R1, n) + 4 * t4) = pack2(o[n][2] * inv1, o[n][3] * inv1);
    }
    if (t4 == 0 && p.lse) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int R = k ? R1 : R0, qi = w.i0 + R / GT;
            if (R >= ROWS || qi >= w.seqlen_q) continue;
            pa_store_lse(p, w, hk * p.group + g0 + R % GT, qi, pa_lane_lse2(r, k));
        }
    }
}

/* pa_stage_rows_swz's rows straight to an f32 out (p.out_f32: the
 * cascade's levels), two floats a store, and their lse; nothing staged. */
template <int D, int BM, int GT>
PA_DEV void pa_write_rows_f32(const pa_attn_params &p, const pa_work &w, int hk, int g0, pa_lane_rows &r,
                              const float (&o)[D / 8][4], int R0) {
    constexpr int ROWS = BM / GT * GT;
    const int t4 = (threadIdx.x & 31) & 3;
    float inv[2];
    pa_lane_rows_end(r, inv[0], inv[1]);
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int R = R0 + 8 * k, qi = w.i0 + R / GT, h = hk * p.group + g0 + R % GT;
        if (R >= ROWS || qi >= w.seqlen_q) continue;
        float *dst = (float *)p.out + ((w.q_start + qi) * p.heads + h) * (i64)D + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; n++) *(float2 *)(dst + 8 * n) = make_float2(o[n][2 * k] * inv[k], o[n][2 * k + 1] * inv[k]);
        if (t4 == 0 && p.lse) pa_store_lse(p, w, h, qi, pa_lane_lse2(r, k));
    }
}

/* Rows r0 .. r0 + NROWS - 1 of the swizzled tile at smem (pa_stage_rows_swz)
 * to out, by threads tid = 0 .. NTHR - 1: every chunk read first, then one
 * 16-byte store each where out is aligned, else element by element. */
template <int D, int BM, int GT, int NROWS, int NTHR>
PA_DEV void pa_write_rows_swz(const pa_attn_params &p, const pa_work &w, int hk, int g0, const u8 *smem, int r0,
                              int tid) {
    constexpr int C = D / 8, ROWS = BM / GT * GT, PER = NROWS * C / NTHR;
    static_assert(NROWS * C % NTHR == 0, "whole chunks per thread");
    const bool vec = (p.out & 15) == 0;
    uint4 v[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = tid + i * NTHR;
        v[i] = *(const uint4 *)(smem + pa_swz(BM, r0 + e / C, e % C));
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = tid + i * NTHR, r = r0 + e / C, c = e % C, qi = w.i0 + r / GT;
        if (r >= ROWS || qi >= w.seqlen_q) continue;
        const i64 dst = ((w.q_start + qi) * p.heads + hk * p.group + g0 + r % GT) * (i64)D + c * 8;
        if (vec) {
            *(uint4 *)((u16 *)p.out + dst) = v[i];
        } else {
            const u32 x[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
            for (int j = 0; j < 8; j++) ((u16 *)p.out)[dst + j] = (u16)(x[j / 2] >> (16 * (j % 2)));
        }
    }
}

#endif /* PA_EMBED_ONLY */
#endif /* PA_PREFILL_WGMMA_CUH */
