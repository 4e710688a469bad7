/*
 * prefill.cu -- paged prefill / chunked prefill attention on tensor cores
 * (f16, bf16; mma.sync, sm_80 and up): flash-attention 2's plan with K/V tiles
 * gathered from pages of any size.
 *
 * One block = one work item (sequence b, a tile of BM / GT queries, keys
 * [k0, k1)) x one head tile (kv head hk and GT query heads of its GQA group).
 * The BM rows of the tile are (query, head) pairs, row r = query i0 + r / GT,
 * head g0 + r % GT: the heads of a group share every K/V tile. Each of the
 * BM / 16 warps owns 16 rows; every warp walks all keys of the range.
 *  - Keys come in tiles of BN through a STAGES-deep cp.async ring (K and V of
 *    a tile in one stage). Each thread copies the same 16-byte column chunk of
 *    a few rows of every tile; at the start of each tile it resolves its rows'
 *    pages itself: page id from the block table (loaded a tile ahead, into
 *    registers), then the absolute 64-bit byte offset of the row. Rows past
 *    k1 are zero-filled and never read the block table: the last tile never
 *    looks past the last page holding a key.
 *  - S = Q K^T on m16n8k16 (Q and K by ldmatrix from padded rows:
 *    conflict-free), the online softmax in base 2 on the accumulator
 *    fragments (the scale folded into one FFMA per score unless PA_NATURAL:
 *    softcap, ALiBi or a non-positive scale need the scores in natural
 *    units), P rounded to the input type as the A operand of O += P V
 *    (V by ldmatrix.trans). Accumulation in f32 throughout.
 *  - Masks cost only where a tile crosses a row's key range: a warp whose 16
 *    rows all take the whole tile skips them. Tiles outside the work item's
 *    range (wholly masked by causality or the window) are never visited: the
 *    host plans [k0, k1) as the union of the tile's rows' ranges.
 *  - The epilogue stages O (f32) through shared memory; pa_write_rows writes
 *    out/lse or a split's partial and combines the splits (fused).
 *
 * FP8 caches (PA_KV fp8): the stages hold the cache's bytes; when a tile
 * lands, the block converts it (exactly) into one K/V tile of the input type
 * in the layout above, a barrier later the warps read it there. A key's
 * scale multiplies the raw scores, a value's the output.
 *
 * Defines: PA_DTYPE (1 f16, 2 bf16), PA_D (a multiple of 16, <= 256), PA_GT
 * (heads per tile), PA_PAGE (-1 contiguous, 0 any, else a power of two),
 * PA_STAGES, PA_NATURAL (0/1), PA_MINB (blocks per SM for __launch_bounds__);
 * PA_KV (optional: the caches' dtype, PA_DTYPE or fp8).
 */
#ifndef PA_EMBED_ONLY
#include "prefill_common.cuh"

#if !defined(PA_DTYPE) || !defined(PA_D) || !defined(PA_GT) || !defined(PA_PAGE) || \
    !defined(PA_STAGES) || !defined(PA_NATURAL) || !defined(PA_MINB)
#error "prefill.cu needs PA_DTYPE, PA_D, PA_GT, PA_PAGE, PA_STAGES, PA_NATURAL, PA_MINB"
#endif

#ifndef PA_KV
#define PA_KV PA_DTYPE
#endif

namespace {
constexpr int D = PA_D;
constexpr bool FP8 = PA_DT_IS_FP8(PA_KV);
constexpr int KVSZ = FP8 ? 1 : 2; /* bytes of a cache element */
constexpr int BM = 128;                   /* rows per block: 8 warps x 16 */
constexpr int NWARPS = BM / 16, NTHREADS = NWARPS * 32;
constexpr int BN = D <= 128 ? 64 : 32;    /* keys per tile */
constexpr int GT = PA_GT, QT = BM / GT, ROWS = QT * GT;
constexpr int ROWB = D * 2;               /* bytes of a row in global memory */
constexpr int RSTRIDE = ROWB + 16;        /* in shared memory: padded for ldmatrix */
constexpr int CPR = ROWB / 16;            /* 16-byte chunks per row */
constexpr int GROWB = D * KVSZ;           /* bytes of a row in the caches (and the copies) */
constexpr int GCPR = GROWB / 16;          /* copied 16-byte chunks per row */
constexpr int GSTRIDE = FP8 ? GROWB : RSTRIDE; /* a stage's rows (fp8: read by the conversion only) */
constexpr int CHUNKS = BN * GCPR;         /* per K (or V) tile */
constexpr int CPT = (CHUNKS + NTHREADS - 1) / NTHREADS; /* chunks per thread per tile */
constexpr int Q_BYTES = BM * RSTRIDE;
constexpr int CONV_BYTES = FP8 ? 2 * BN * RSTRIDE : 0; /* (fp8) the current tile in the input type */
constexpr int KV_STAGE = 2 * BN * GSTRIDE;
constexpr int OSTRIDE = D + 4;            /* f32 epilogue rows: conflict-free float2 stores */
constexpr int SMEM = pa_cmax(Q_BYTES + CONV_BYTES + PA_STAGES * KV_STAGE, BM * OSTRIDE * 4);

static_assert(D % 16 == 0 && D >= 16 && D <= 256, "head dim");
static_assert(PA_KV == PA_DTYPE || FP8, "caches: the input type or fp8");
static_assert(GT >= 1 && GT <= 16, "heads per tile");
static_assert(PA_STAGES >= 2, "pipeline depth");
static_assert(PA_PAGE <= 0 || (PA_PAGE & (PA_PAGE - 1)) == 0, "page size: a power of two");
} // namespace

extern "C" __constant__ int pa_prefill_info[4] = {NTHREADS, SMEM, BN, QT};

extern "C" __global__ void __launch_bounds__(NTHREADS, PA_MINB) pa_prefill(const pa_attn_params p) {
    extern __shared__ __align__(128) u8 smem[];
    __shared__ int s_flag;
    __shared__ pa_work s_w;
    __shared__ int s_lo[BM], s_hi[BM];
    __shared__ float s_slope[PA_NATURAL ? BM : 1];
    __shared__ float s_lse2[BM];
    u8 *s_q = smem, *s_conv = smem + Q_BYTES, *s_kv = smem + Q_BYTES + CONV_BYTES;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int head_tile = blockIdx.x % p.head_tiles;
    if (tid == 0) s_w = ((const pa_work *)p.work)[blockIdx.x / p.head_tiles];
    __syncthreads();
    const pa_work w = s_w;
    const int tiles_per_group = p.group / GT;
    const int hk = head_tile / tiles_per_group;
    const int g0 = (head_tile - hk * tiles_per_group) * GT;
    const int ps = PA_PAGE > 0 ? PA_PAGE : p.page_size;

    /* 1. rows: key ranges (clipped to the item's), ALiBi slopes; the Q tile */
    pa_prefill_rows<BM, GT, PA_NATURAL>(p, w, hk, g0, s_lo, s_hi, s_slope);
    pa_prefill_load_q<BM, GT, D>(p, w, hk, g0, tid, NTHREADS, [&](int r, int c) { return s_q + r * RSTRIDE + c * 16; });

    /* 2. the K/V pipeline. This thread's chunks of a tile: c = tid + i *
     * NTHREADS, row c / CPR, column chunk c % CPR. */
    const int nt = (w.k1 - w.k0 + BN - 1) / BN;
    const i64 head_bytes = (i64)hk * D * KVSZ;
    int pid[CPT]; /* page ids of this thread's rows of the next tile to issue */
    auto load_pids = [&](int t) {
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int c = tid + i * NTHREADS, tok = w.k0 + t * BN + c / GCPR;
            pid[i] = 0;
            if (PA_PAGE != -1 && c < CHUNKS && t < nt && tok < w.k1)
                pid[i] = ((const int *)p.block_table)[(i64)w.b * p.bt_stride + tok / ps];
        }
    };
    auto issue = [&](int t) {
        u8 *sk = s_kv + (t % PA_STAGES) * KV_STAGE, *sv = sk + BN * GSTRIDE;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int c = tid + i * NTHREADS, row = c / GCPR, ch = c - row * GCPR, tok = w.k0 + t * BN + row;
            if (CHUNKS % NTHREADS != 0 && c >= CHUNKS) break;
            const bool ok = tok < w.k1;
            i64 off = 0;
            if (ok) off = pa_key_offset<PA_PAGE, KVSZ>(p, w, tok, pid[i], ps, head_bytes) + ch * 16;
            const u32 dst = row * GSTRIDE + ch * 16;
            pa_cp_async16(sk + dst, (const u8 *)p.k_cache + off, ok);
            pa_cp_async16(sv + dst, (const u8 *)p.v_cache + off, ok);
        }
    };
    load_pids(0);
#pragma unroll
    for (int t = 0; t < PA_STAGES - 1; t++) {
        if (t < nt) {
            issue(t);
            load_pids(t + 1);
        }
        pa_cp_async_commit(); /* the first group also holds Q */
    }
    __syncthreads(); /* s_lo, s_hi, s_slope, the f32 Q rows */

    /* this lane's rows: R0 = warp * 16 + g, R1 = R0 + 8 */
    const int R0 = warp * 16 + (lane >> 2);
    pa_lane_rows rs = pa_lane_rows_init<GT, PA_NATURAL>(p, w, R0, s_lo, s_hi, s_slope);
    /* shared-memory addresses (u32) of this lane's ldmatrix rows */
    const u32 q_rows = pa_smem_addr(s_q) + (warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * RSTRIDE + 16 * (lane >> 4);
    const u32 kv_base = pa_smem_addr(FP8 ? s_conv : s_kv); /* (fp8: the converted tile) */
    const u32 k_lane = kv_base + (lane & 7) * RSTRIDE + 16 * (lane >> 3);
    const u32 v_lane = kv_base + BN * RSTRIDE + ((lane & 7) + 8 * ((lane >> 3) & 1)) * RSTRIDE + 16 * (lane >> 4);
    /* (an fp8 cache's key scale multiplies the raw scores, its value scale the output) */
    const float kscale = FP8 ? pa_k_scale(p, hk) : 1.f, vscale = FP8 ? pa_v_scale(p, hk) : 1.f;

    float o[D / 8][4];
    pa_zero(o);

    for (int t = 0; t < nt; t++) {
        pa_cp_async_wait<PA_STAGES - 2>();
        __syncthreads(); /* tile t landed; the buffer of tile t - 1 is free */
        if (t + PA_STAGES - 1 < nt) {
            issue(t + PA_STAGES - 1);
            load_pids(t + PA_STAGES);
        }
        pa_cp_async_commit();
        if constexpr (FP8) {
            /* tile t into the input type: 8 elements a thread at a time (an
             * 8-byte load, a 16-byte store), K's rows then V's */
            const u8 *src = s_kv + (t % PA_STAGES) * KV_STAGE;
            for (int e = tid; e < 2 * BN * CPR; e += NTHREADS) {
                const int rr = e / CPR, c = e - rr * CPR;
                const uint2 x = *(const uint2 *)(src + rr * GSTRIDE + c * 8);
                uint4 y;
                pa_fp8x4_to_b16<PA_KV, PA_DTYPE>(x.x, y.x, y.y);
                pa_fp8x4_to_b16<PA_KV, PA_DTYPE>(x.y, y.z, y.w);
                *(uint4 *)(s_conv + rr * RSTRIDE + c * 16) = y;
            }
            __syncthreads(); /* (the barrier above ordered the last tile's reads of s_conv) */
        }

        const u32 stage = FP8 ? 0 : (t % PA_STAGES) * KV_STAGE, sk = k_lane + stage, sv = v_lane + stage;
        /* S = Q K^T: 16 rows x BN keys per warp */
        float s[BN / 8][4];
#pragma unroll
        for (int n = 0; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 32; kk++) {
            u32 qa0[4], qa1[4];
            ldsm_x4(qa0, q_rows + kk * 64);
            ldsm_x4(qa1, q_rows + kk * 64 + 32);
#pragma unroll
            for (int n = 0; n < BN / 8; n++) {
                u32 b[4];
                ldsm_x4(b, sk + n * 8 * RSTRIDE + kk * 64);
                mma16816(s[n], qa0, b[0], b[1]);
                mma16816(s[n], qa1, b[2], b[3]);
            }
        }
        if (D % 32 != 0) { /* the last 16 of the head dim */
            u32 qa[4];
            ldsm_x4(qa, q_rows + (D / 32) * 64);
#pragma unroll
            for (int n = 0; n < BN / 8; n++) {
                u32 b[4]; /* lanes 16-31 repeat lanes 0-15's addresses: b[2], b[3] unused */
                ldsm_x4(b, sk + n * 8 * RSTRIDE + (D / 32) * 64 - 16 * (lane >> 4) * 2);
                mma16816(s[n], qa, b[0], b[1]);
            }
        }

        if constexpr (FP8)
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[n][j] *= kscale;
        /* scores -> exponents, masks, maxima; P = 2^(x c2 - e) as the A fragments of P V */
        float e0, e1;
        pa_softmax_tile<BN / 8, D / 8, PA_NATURAL>(p, rs, s, o, w.k0 + t * BN, e0, e1);
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            u32 pa[4];
            pa_p_fragment<BN / 8>(rs, s, ks, e0, e1, pa);
            /* O += P V: keys ks * 16 .. + 15, 16 dims per ldmatrix.trans */
#pragma unroll
            for (int dn = 0; dn < D / 16; dn++) {
                u32 b[4];
                ldsm_x4_trans(b, sv + ks * 16 * RSTRIDE + dn * 32);
                mma16816(o[2 * dn], pa, b[0], b[1]);
                mma16816(o[2 * dn + 1], pa, b[2], b[3]);
            }
        }
    }
    pa_cp_async_wait<0>();
    __syncthreads(); /* the stage buffers become the epilogue's */

    /* 3. normalise, stage O (f32) and the rows' log2-sum-exp */
    if constexpr (FP8)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) o[n][j] *= vscale;
    pa_stage_rows<D / 8>(rs, o, R0, (float *)smem, OSTRIDE, s_lse2);
    __syncthreads();
    pa_prefill_write<PA_DTYPE, D, GT>(p, w, ROWS, hk, g0, head_tile, (const float *)smem, OSTRIDE, s_lse2, NTHREADS,
                                      &s_flag);
}

#endif /* PA_EMBED_ONLY */
