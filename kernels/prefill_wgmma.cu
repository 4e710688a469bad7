/*
 * prefill_wgmma.cu -- paged prefill / chunked prefill attention on Hopper's
 * warpgroup MMA (sm_90a; f16, bf16; head dim 64, 128 or 256): the plan of
 * prefill.cu with the two products on wgmma.mma_async.
 *
 * One block = one work item x one head tile, as in prefill.cu: BM = 128 rows
 * of (query, head) pairs, two warpgroups of 64 rows each.
 *  - Q, K and V tiles live in shared memory in wgmma's 128-byte-swizzled
 *    layout: per 64 columns of the head dim a block of rows of 128 bytes,
 *    16-byte chunk c of row r stored at chunk c ^ (r % 8). The cp.async
 *    gather writes that layout directly: each thread resolves the pages of
 *    its rows of every tile itself (page ids a tile ahead, absolute 64-bit
 *    offsets; rows past k1 zero-filled, the block table never read past the
 *    last page holding a key).
 *  - S = Q K^T: wgmma m64nBNk16 with both operands from shared memory
 *    (K-major). O += P V: P from registers (the accumulator fragment of S,
 *    rounded to the input type: the same layout as mma.sync's A operand) and
 *    V from shared memory read MN-major (transposed by the hardware).
 *  - Per key tile t: wait for its copies (one barrier); refill the ring slot
 *    of tile t - 2 with tile t + STAGES - 2; issue S(t) and P V(t - 1); the
 *    online softmax of tile t (prefill_common.cuh) runs under P V(t - 1);
 *    rescale O, pack P(t). Copies run under the products.
 *  - Epilogue as prefill.cu: O staged through shared memory, pa_write_rows
 *    writes out/lse or the split's partial and combines the splits.
 *
 * Defines: PA_DTYPE (1 f16, 2 bf16), PA_D (64, 128 or 256), PA_GT, PA_PAGE
 * (-1 contiguous, 0 any, else a power of two), PA_STAGES (>= 3), PA_NATURAL
 * (0/1).
 */
#ifndef PA_EMBED_ONLY
#include "prefill_wgmma.cuh"

#if !defined(PA_DTYPE) || !defined(PA_D) || !defined(PA_GT) || !defined(PA_PAGE) || !defined(PA_STAGES) || \
    !defined(PA_NATURAL)
#error "prefill_wgmma.cu needs PA_DTYPE, PA_D, PA_GT, PA_PAGE, PA_STAGES, PA_NATURAL"
#endif

namespace {
constexpr int D = PA_D;
constexpr int BM = 128, NTHREADS = 256; /* two warpgroups of 64 rows */
constexpr int BN = D <= 128 ? 128 : 32; /* keys per tile (3 stages fit) */
constexpr int GT = PA_GT, QT = BM / GT, ROWS = QT * GT;
constexpr int CPR = D / 8;              /* 16-byte chunks per row */
constexpr int TPR = NTHREADS / BN;     /* copying threads per row of a tile */
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;    /* one K (or V) tile */
constexpr int STAGE_BYTES = 2 * KV_BYTES;
constexpr int OSTRIDE = D + 4;
constexpr int SMEM = 1024 /* alignment */ + pa_cmax(Q_BYTES + PA_STAGES * STAGE_BYTES, BM * OSTRIDE * 4 + BM * 4);
static_assert(3 * BM * 4 <= STAGE_BYTES, "row ranges and slopes fit in a ring slot");

static_assert(D == 64 || D == 128 || D == 256, "head dim: 64, 128 or 256");
static_assert(NTHREADS % BN == 0 && CPR % TPR == 0 && TPR % 2 == 0, "copy mapping: whole 32-byte sectors per row");
static_assert(GT >= 1 && GT <= 16, "heads per tile");
static_assert(PA_STAGES >= 3, "pipeline depth: tile t in use by S, t - 1 by P V, t + 1 loading");
static_assert(PA_PAGE <= 0 || (PA_PAGE & (PA_PAGE - 1)) == 0, "page size: a power of two");
} // namespace

extern "C" __constant__ int pa_prefill_wgmma_info[4] = {NTHREADS, SMEM, BN, QT};

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) pa_prefill_wgmma(const pa_attn_params p) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap(); /* wgmma needs sm_90a; the host dispatches here only there (other targets compile a stub) */
#else
    extern __shared__ __align__(128) u8 smem_raw[];
    __shared__ int s_flag;
    __shared__ pa_work s_w;
    /* the swizzle pattern repeats every 1024 bytes: tiles start on that */
    const u32 raw = pa_smem_addr(smem_raw), base = (raw + 1023u) & ~1023u;
    u8 *smem = smem_raw + (base - raw);
    const u32 q_addr = base, kv_addr = base + Q_BYTES;
    /* Every byte counts at 3 stages of head dim 128 (225 KB of the 227), so
     * the rows' ranges and slopes borrow the last ring slot, which is first
     * filled after they have been read into registers (iteration 0), and the
     * epilogue's lse rows follow its O rows. */
    int *s_lo = (int *)(smem + Q_BYTES + (PA_STAGES - 1) * STAGE_BYTES), *s_hi = s_lo + BM;
    float *s_slope = (float *)(s_hi + BM);
    float *s_lse2 = (float *)(smem + BM * OSTRIDE * 4);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int head_tile = blockIdx.x % p.head_tiles;
    if (tid == 0) s_w = ((const pa_work *)p.work)[blockIdx.x / p.head_tiles];
    __syncthreads();
    const pa_work w = s_w;
    const int tiles_per_group = p.group / GT;
    const int hk = head_tile / tiles_per_group;
    const int g0 = (head_tile - hk * tiles_per_group) * GT;
    const int ps = PA_PAGE > 0 ? PA_PAGE : p.page_size;

    /* 1. rows, and the Q tile (swizzled) */
    pa_prefill_rows<BM, GT, PA_NATURAL>(p, w, hk, g0, s_lo, s_hi, s_slope);
    pa_prefill_load_q<BM, GT, D>(p, w, hk, g0, tid, NTHREADS, [&](int r, int c) { return smem + pa_swz(BM, r, c); });

    /* 2. the K/V ring. Each thread copies one row of every tile: row
     * tid / TPR, chunks tid % TPR + TPR * i (neighbouring lanes fill each
     * 32-byte sector), so it resolves one page per tile: its page id loaded a
     * tile ahead, one absolute 64-bit offset. */
    const int nt = (w.k1 - w.k0 + BN - 1) / BN;
    const i64 head_bytes = (i64)hk * D * 2;
    const int my_row = tid / TPR, my_sub = tid % TPR;
    int pid = 0; /* page id of this thread's row of the next tile to issue */
    auto load_pid = [&](int t) {
        const int tok = w.k0 + t * BN + my_row;
        pid = 0;
        if (PA_PAGE != -1 && t < nt && tok < w.k1) pid = ((const int *)p.block_table)[(i64)w.b * p.bt_stride + tok / ps];
    };
    auto issue = [&](int t) {
        u8 *sk = smem + Q_BYTES + (t % PA_STAGES) * STAGE_BYTES, *sv = sk + KV_BYTES;
        const int tok = w.k0 + t * BN + my_row;
        const bool ok = tok < w.k1;
        const i64 off = ok ? pa_key_offset<PA_PAGE>(p, w, tok, pid, ps, head_bytes) : 0;
        /* past k1: nothing is read (src-size 0), the address stays in the
         * cache's first row; the chunks are immediates from one pointer */
        const u8 *gk = (const u8 *)p.k_cache + off + my_sub * 16, *gv = (const u8 *)p.v_cache + off + my_sub * 16;
#pragma unroll
        for (int i = 0; i < CPR / TPR; i++) {
            const u32 dst = pa_swz(BN, my_row, my_sub + TPR * i);
            pa_cp_async16(sk + dst, gk + i * TPR * 16, ok);
            pa_cp_async16(sv + dst, gv + i * TPR * 16, ok);
        }
    };
    load_pid(0);
#pragma unroll
    for (int t = 0; t < PA_STAGES - 2; t++) {
        if (t < nt) {
            issue(t);
            load_pid(t + 1);
        }
        pa_cp_async_commit(); /* the first group also holds Q */
    }
    __syncthreads(); /* s_lo, s_hi, s_slope */

    const int R0 = wg * 64 + (warp & 3) * 16 + (lane >> 2);
    pa_lane_rows rs = pa_lane_rows_init<GT, PA_NATURAL>(p, w, R0, s_lo, s_hi, s_slope);
    /* tiles every row takes whole run without range checks (block-uniform:
     * the two step variants hold different wgmma instructions) */
    __shared__ int s_wr[2 * (NTHREADS / 32)];
    if (lane == 0) {
        s_wr[warp] = rs.wlo;
        s_wr[NTHREADS / 32 + warp] = rs.whi;
    }

    float o[D / 8][4];
    pa_zero(o);
    float s[BN / 8][4];

    /* Iteration t: S(t) = Q K(t)^T and O += P(t - 1) V(t - 1) issued back to
     * back; the softmax of tile t runs while P V(t - 1) does; then O is
     * rescaled and P(t) packed for the next iteration. Every group is waited
     * for within its iteration (a wgmma group in flight across the loop's back
     * edge makes ptxas serialise every wgmma of the kernel, C7514). */
    u32 pa[BN / 16][4];
    auto v_tile = [&](int t) { return kv_addr + (t % PA_STAGES) * STAGE_BYTES + KV_BYTES; };
    /* One iteration; WITH_PV false for tile 0 only (peeled: a conditional
     * P V with an unconditional commit compiles to a dummy wgmma group, and
     * waiting for "all but the last group" then waits for P V too, which
     * serialised the softmax after it). */
    auto step = [&](int t, auto with_pv, auto masked) {
        constexpr bool WITH_PV = decltype(with_pv)::value;
        pa_cp_async_wait<PA_STAGES - 3>();
        pa_fence_proxy_async(); /* this thread's copies (and Q stores) -> the async proxy */
        __syncthreads();        /* tile t landed for every thread; everybody is done with tile t - 2 */

        const u32 kt_addr = kv_addr + (t % PA_STAGES) * STAGE_BYTES;
        pa_fence_operands(s);
        pa_fence_operands(o);
        pa_wgmma_fence();
        pa_wg_qk<D, BM, BN>(s, q_addr, wg, kt_addr);
        pa_wgmma_commit();
        if constexpr (WITH_PV) {
            pa_wg_pv<D, BN>(o, pa, v_tile(t - 1));
            pa_wgmma_commit();
        }
        /* the copies of tile t + STAGES - 2, into the ring slot of tile t - 2,
         * issued while the tensor cores work */
        if (t + PA_STAGES - 2 < nt) {
            issue(t + PA_STAGES - 2);
            load_pid(t + PA_STAGES - 1);
        }
        pa_cp_async_commit();
        if constexpr (WITH_PV) pa_wgmma_wait<1>(); /* S(t); P V(t - 1) runs on */
        else pa_wgmma_wait<0>();
        pa_fence_operands(s);

        pa_wg_softmax<BN, PA_NATURAL, WITH_PV, decltype(masked)::value ? 1 : 0>(p, rs, s, o, pa, w.k0 + t * BN);
    };
    int ti0 = 0, ti1 = 0; /* s_wr was written before step 0's barrier (no tiles: no barrier, nothing to read) */
    if (nt > 0) {
        step(0, pa_bool<false>{}, pa_bool<true>{});
        pa_interior_tiles(s_wr, NTHREADS / 32, w.k0, BN, nt, ti0, ti1);
    }
    for (int t = 1; t < nt; t++) {
        if (t >= ti0 && t < ti1) step(t, pa_bool<true>{}, pa_bool<false>{});
        else step(t, pa_bool<true>{}, pa_bool<true>{});
    }
    if (nt > 0) pa_wg_pv_last<D, BN>(o, pa, v_tile(nt - 1));
    pa_cp_async_wait<0>();
    __syncthreads(); /* the tiles' memory becomes the epilogue's */

    /* 3. normalise, stage O (f32) and the rows' log2-sum-exp, write */
    pa_stage_rows<D / 8>(rs, o, R0, (float *)smem, OSTRIDE, s_lse2);
    __syncthreads();
    pa_prefill_write<PA_DTYPE, D, GT>(p, w, ROWS, hk, g0, head_tile, (const float *)smem, OSTRIDE, s_lse2, NTHREADS,
                                      &s_flag);
#endif
}

#endif /* PA_EMBED_ONLY */
