/*
 * prefill_ws.cu -- paged prefill on Hopper with warp specialisation (sm_90a;
 * f16, bf16; head dim 64, 128 or 256): flash-attention 3's division of labour
 * with the paged gather of prefill_wgmma.cu.
 *
 * Three warpgroups per block. The producer (warpgroup 0, 56 registers)
 * resolves pages and gathers K and V tiles with cp.async into a ring of
 * STAGES slots, each K and V slot with a "full" mbarrier (the producer's
 * copies landed: cp.async.mbarrier.arrive.noinc, one arrival per producer
 * thread) and an "empty" one (both consumers are done with it: one arrival
 * per consumer warp). Two consumer warpgroups (224 registers) own 64 rows of
 * (query, head) pairs each and run the loop of prefill_wgmma.cu -- S(t)
 * and P V(t - 1) back to back, the softmax of tile t under P V(t - 1) --
 * without any block-wide barrier, the gather's instructions out of their
 * issue slots. The consumers take turns on the tensor cores (ping-pong on
 * two named barriers, flash-attention 3's schedule): a consumer issues S(t)
 * and P V(t - 1) in its turn and passes the turn as soon as they are issued
 * (the other's products queue behind them), then runs the softmax of S(t)
 * once S(t) alone has completed, under its own P V(t - 1) and the other's
 * products. (Passing the turn once both products had completed measured
 * 1.4-3.8 % slower with today's loop; docs/prefill.md.)
 *
 * Each producer thread copies one row of every tile (TPR threads per row),
 * so it resolves one page per tile: its page id loaded a tile ahead, one
 * absolute 64-bit offset; rows past k1 are zero-filled and never read the
 * block table.
 *
 * Work items are never split (the host plans one item per query tile): the
 * epilogue writes out/lse directly, consumers only.
 *
 * A block's start and end (docs/prefill.md): thread 0
 * issues the Q tile's TMA boxes as soon as it has read the work item, warp
 * 0 the first K/V tile's boxes from rows the host listed (no block-table
 * round trip first), and each consumer's rows of O leave by TMA stores from
 * its staged half of the Q tile.
 *
 * Page boxes (PA_TMA 2, pages of 16 rows or more): one TMA box per page
 * holds all of its rows' columns (a 5-D map: 64 elements, 8 rows, column
 * blocks, kv heads, 8-row groups), where tma=1 issues one box per page and
 * 64 columns; the K/V tiles then hold each 8 rows' column blocks side by
 * side (KVL below: pa_kv_layout's GS D / 64 x 1024, BS 1024), which the
 * wgmma descriptors read as well as the default layout. Half the boxes at
 * head dim 128 (8 instead of 16 a K or V tile at page 16).
 *
 * fp8 caches (PA_KV e4m3 or e5m2; head dim 128, pages of 16 rows or more,
 * tma=1, two stages; tuning prefill_fp8 = 3, docs/fp8.md): the keys are
 * widened in the block, by a warpgroup of its own. Producer warp 0 loads each
 * K and V tile's fp8 rows (a TMA box a page, 128 bytes a row, unswizzled)
 * into a ring of two staging slots; warps 1-3 (after Q) widen each staged
 * tile into the 16-bit slot the consumers read, in the layout the 16-bit TMA
 * boxes give (rows past the sequence's end as zeros), each fp8 value exactly
 * (every fp8 value is a 16-bit value); the key scale goes into the scores'
 * factor and the value scale into the output, in f32. The two rings apart,
 * the loads run ahead of the widening, and the widening ahead of the
 * consumers (the widening in the producer's own ring order measured 3x
 * slower: docs/fp8.md). The consumers' code is the 16-bit kernel's.
 * Measured 0.60x bf16's speed (H100), the cause not yet located: opt-in.
 *
 * Defines: PA_DTYPE, PA_D (64, 128, 256), PA_GT, PA_PAGE (-1 contiguous, 0
 * any, else a power of two), PA_STAGES (>= 2), PA_NATURAL (0/1), PA_TMA (0
 * the cp.async gather, 1 TMA boxes of 64 columns, 2 page boxes); PA_KV
 * (optional): the caches' dtype, PA_DTYPE or an fp8 one.
 */
#ifndef PA_EMBED_ONLY
#include "prefill_wgmma.cuh"
#include "ws_common.cuh"

#if !defined(PA_DTYPE) || !defined(PA_D) || !defined(PA_GT) || !defined(PA_PAGE) || !defined(PA_STAGES) || \
    !defined(PA_NATURAL) || !defined(PA_TMA)
#error "prefill_ws.cu needs PA_DTYPE, PA_D, PA_GT, PA_PAGE, PA_STAGES, PA_NATURAL, PA_TMA"
#endif
#ifndef PA_KV
#define PA_KV PA_DTYPE
#endif

namespace {
constexpr int D = PA_D;
constexpr int BM = 128, NTHREADS = 384;  /* producer + two consumers of 64 rows */
constexpr int BN = D <= 128 ? 128 : 64;  /* keys per tile */
constexpr int GT = PA_GT, QT = BM / GT;
constexpr int CPR = D / 8;               /* 16-byte chunks per row */
constexpr int TPR = 128 / BN;            /* producer threads per row of a tile */
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;     /* one K (or V) tile */
/* TMA: cache rows per box (a page, or a whole tile of a larger page or a
 * contiguous cache); tiles start at a multiple of it (keys before k0 masked) */
constexpr int TMA_ROWS = PA_PAGE == -1 || PA_PAGE >= BN ? BN : PA_PAGE;
constexpr int KALIGN = PA_TMA && PA_PAGE > 0 ? TMA_ROWS : 1;
/* a cache row past every map's rows (a map's rows are 128 bytes or more
 * apart, so below 256 GiB of memory they are fewer): a box from there is all
 * TMA zero fill */
constexpr int OOB_ROW = 0x7ffff000;
/* fp8 caches: the staging ring of fp8 tiles (K and V, STG8 slots each) */
constexpr bool KV8 = PA_DT_IS_FP8(PA_KV);
constexpr int STG8 = 2, TILE8 = BN * D;
constexpr int WIDEN_THREADS = 96; /* producer warps 1-3 */
constexpr int SMEM = 1024 /* alignment */ + Q_BYTES + 2 * PA_STAGES * KV_BYTES + (KV8 ? 2 * STG8 * TILE8 : 0);
/* Q and O by TMA (where the host built their maps, maps.q_tma / o_tma):
 * boxes of GT heads x QT queries, which fill the tile's rows only where GT
 * divides BM */
constexpr bool TMA_QO = PA_TMA && QT * GT == BM;
/* the K/V tiles' layout (prefill_wgmma.cuh): page boxes put each 8 rows'
 * column blocks side by side */
constexpr bool PAGE_BOX = PA_TMA == 2;
using KVL = pa_kv_layout<PAGE_BOX ? D / 64 * 1024 : 1024, PAGE_BOX ? 1024 : BN * 128>;
/* registers a thread: the producer gives some up, the consumers take them
 * (setmaxnreg). The consumers' increase waits until the block's registers
 * cover it, for ever where they cannot: the block launches with
 * LAUNCH_REGS a thread (__launch_bounds__(NTHREADS, 1)), and 128 x 48 +
 * 256 x 232 = 65536 > 384 x 168 hung a GPU run. Measured (docs/prefill.md):
 * 40 / 232 and 24 / 240 (the producer spilling) were 4-6 % slower at
 * 4 x 2048 than 56 / 224. */
constexpr int LAUNCH_REGS = 65536 / NTHREADS / 8 * 8, PRODUCER_REGS = 56, CONSUMER_REGS = 224;

static_assert(D == 64 || D == 128 || D == 256, "head dim: 64, 128 or 256");
static_assert(128 % BN == 0 && CPR % TPR == 0, "copy mapping");
static_assert(GT >= 1 && GT <= 16, "heads per tile");
static_assert(PA_STAGES >= 2 && PA_STAGES <= 4, "pipeline depth");
static_assert(PA_PAGE <= 0 || (PA_PAGE & (PA_PAGE - 1)) == 0, "page size: a power of two");
static_assert(!PA_TMA || PA_PAGE == -1 || PA_PAGE >= 16, "TMA: contiguous caches or pages of 16 rows or more");
static_assert(!PAGE_BOX || PA_PAGE >= 16, "page boxes: pages of 16 rows or more");
static_assert(PA_KV == PA_DTYPE || (KV8 && D == 128 && PA_TMA == 1 && PA_PAGE >= 16 && !PA_NATURAL && PA_STAGES == 2),
              "fp8 caches: head dim 128, tma=1 over pages of 16 rows or more, natural=0, two stages");
static_assert(SMEM <= 227 * 1024 - 2048, "shared memory (the static part beside it)");
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= NTHREADS * LAUNCH_REGS && PRODUCER_REGS % 8 == 0 &&
                  CONSUMER_REGS % 8 == 0,
              "setmaxnreg: the consumers' registers must come from the block's own");
} // namespace

extern "C" __constant__ int pa_prefill_ws_info[4] = {NTHREADS, SMEM, BN, QT};

#if PA_TMA
/* (fp8) Producer warp 0: each tile's fp8 rows into the staging ring, lane j
 * box j (a page, or a tile of larger pages: TMA_ROWS rows of 128 bytes) from
 * cache row `row` (tile 0's; box_row(t): tile t's, as the 16-bit loads take
 * them); boxes past the sequence's last key are not loaded (the widening
 * writes zeros there). */
template <class BoxRow>
PA_DEV void ws8_load(const pa_tma_maps &maps, const pa_work &w, int hk, int kbase, int nt, int lane, int row,
                     BoxRow box_row, u32 k8, u32 v8, u64 *full8_k, u64 *full8_v, u64 *empty8_k, u64 *empty8_v) {
    for (int t = 0; t < nt; t++) {
        const int s = t % STG8;
        const u32 ph = (u32)(t / STG8) & 1u;
        const int nkeys = min(BN, w.k1 - (kbase + t * BN));
        const int nbox = (nkeys + TMA_ROWS - 1) / TMA_ROWS;
        const u32 bytes = (u32)nbox * TMA_ROWS * D;
        const u32 at = (u32)lane * TMA_ROWS * D;
        const int next = box_row(t + 1);
        mbar_wait(&empty8_k[s], ph ^ 1u);
        if (lane == 0) mbar_arrive_expect_tx(&full8_k[s], bytes);
        __syncwarp();
        if (lane < nbox) tma_load(k8 + s * TILE8 + at, maps.k, 0, hk, row, &full8_k[s]);
        mbar_wait(&empty8_v[s], ph ^ 1u);
        if (lane == 0) mbar_arrive_expect_tx(&full8_v[s], bytes);
        __syncwarp();
        if (lane < nbox) tma_load(v8 + s * TILE8 + at, maps.v, 0, hk, row, &full8_v[s]);
        row = next;
    }
}

/* (fp8) Producer warps 1-3 (thread i of WIDEN_THREADS): each staged tile
 * widened into the consumers' slot of the same tile, rows from nkeys on as
 * zeros. A 16-byte fp8 chunk c of row r (dims 16 c ..) becomes 16-bit chunks
 * 2 c and 2 c + 1 of the row, in the 16-bit TMA boxes' layout (64-column
 * blocks of BN rows, chunk x of row r at x ^ (r % 8)). */
PA_DEV void ws8_widen_tile(u8 *smem, u32 src_off, u32 dst_off, int nkeys, int i) {
    using KVL = pa_kv_rows<BN>;
    const u8 *src = smem + src_off;
    u8 *dst = smem + dst_off;
#pragma unroll 2
    for (int e = i; e < BN * D / 16; e += WIDEN_THREADS) {
        const int r = e >> 3, c = e & 7;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (r < nkeys) x = *(const uint4 *)(src + r * D + c * 16);
        u32 h[8];
        pa_fp8x4_to_b16<PA_KV, PA_DTYPE>(x.x, h[0], h[1]);
        pa_fp8x4_to_b16<PA_KV, PA_DTYPE>(x.y, h[2], h[3]);
        pa_fp8x4_to_b16<PA_KV, PA_DTYPE>(x.z, h[4], h[5]);
        pa_fp8x4_to_b16<PA_KV, PA_DTYPE>(x.w, h[6], h[7]);
        u8 *row = dst + (c >> 2) * KVL::BS + (r >> 3) * KVL::GS + (r & 7) * 128;
        const int x0 = (2 * c) & 7;
        *(uint4 *)(row + ((x0 ^ (r & 7)) << 4)) = make_uint4(h[0], h[1], h[2], h[3]);
        *(uint4 *)(row + (((x0 + 1) ^ (r & 7)) << 4)) = make_uint4(h[4], h[5], h[6], h[7]);
    }
}
PA_DEV void ws8_widen(u8 *smem, u32 k8_off, u32 v8_off, const pa_work &w, int kbase, int nt, int i, u64 *full8_k,
                      u64 *full8_v, u64 *empty8_k, u64 *empty8_v, u64 *full_k, u64 *full_v, u64 *empty_k,
                      u64 *empty_v) {
    const u32 k_off = Q_BYTES, v_off = Q_BYTES + PA_STAGES * KV_BYTES;
    for (int t = 0; t < nt; t++) {
        const int s8 = t % STG8, s = t % PA_STAGES;
        const u32 ph8 = (u32)(t / STG8) & 1u, ph = (u32)(t / PA_STAGES) & 1u;
        const int nkeys = min(BN, w.k1 - (kbase + t * BN));
        mbar_wait(&full8_k[s8], ph8);
        mbar_wait(&empty_k[s], ph ^ 1u); /* a fresh barrier passes parity 1 */
        ws8_widen_tile(smem, k8_off + s8 * TILE8, k_off + s * KV_BYTES, nkeys, i);
        mbar_arrive(&empty8_k[s8]);
        pa_fence_proxy_async(); /* the stores -> the consumers' wgmma (async proxy) */
        mbar_arrive(&full_k[s]);
        mbar_wait(&full8_v[s8], ph8);
        mbar_wait(&empty_v[s], ph ^ 1u);
        ws8_widen_tile(smem, v8_off + s8 * TILE8, v_off + s * KV_BYTES, nkeys, i);
        mbar_arrive(&empty8_v[s8]);
        pa_fence_proxy_async();
        mbar_arrive(&full_v[s]);
    }
}
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
    pa_prefill_ws(const pa_attn_params p, const __grid_constant__ pa_tma_maps maps) {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap(); /* wgmma and setmaxnreg need sm_90a (other targets compile a stub) */
#else
    extern __shared__ __align__(128) u8 smem_raw[];
    __shared__ pa_work s_w;
    __shared__ int s_lo[BM], s_hi[BM];
    __shared__ float s_slope[PA_NATURAL ? BM : 1];
    __shared__ __align__(8) u64 bar_q, full_k[PA_STAGES], full_v[PA_STAGES], empty_k[PA_STAGES],
        empty_v[PA_STAGES], v_last;
    /* (fp8) the staging ring: loaded (TMA bytes) and widened (WIDEN_THREADS arrivals) */
    __shared__ __align__(8) u64 full8_k[STG8], full8_v[STG8], empty8_k[STG8], empty8_v[STG8];
    const u32 raw = pa_smem_addr(smem_raw), base = (raw + 1023u) & ~1023u; /* swizzle period */
    u8 *smem = smem_raw + (base - raw);
    const u32 q_addr = base, k_addr = base + Q_BYTES, v_addr = k_addr + PA_STAGES * KV_BYTES;

    const int tid = threadIdx.x, wg = tid >> 7;
    const int item = blockIdx.x / p.head_tiles, head_tile = blockIdx.x % p.head_tiles;
    const int tiles_per_group = p.group / GT;
    const int hk = head_tile / tiles_per_group;
    const int g0 = (head_tile - hk * tiles_per_group) * GT;
    const bool q_tma = TMA_QO && maps.q_tma;
    /* warp 0, lane j: box j of the first K/V tile, from the host (where it
     * gave them): loaded beside the work item, not after it */
    constexpr int NBOX = PA_TMA ? BN / TMA_ROWS : 1;
    static_assert(NBOX >= 1 && NBOX <= PA_WS_BOXES, "one box per lane");
#if PA_TMA
    const bool first_boxes = maps.first_boxes != 0;
    int first_row = 0;
    if (first_boxes && tid < NBOX) first_row = ((const int *)maps.first_boxes)[(i64)item * PA_WS_BOXES + tid];
#endif
    if (tid == 0) {
        const pa_work w0 = ((const pa_work *)p.work)[item];
        s_w = w0;
        /* Q by TMA: this thread's expect_tx; else with TMA warps 1-3 load Q
         * (warp 0 issues K/V at once), without it the producer warpgroup */
        mbar_init(&bar_q, q_tma ? 1 : PA_TMA ? 96 : 128);
        /* TMA: the issuing thread's expect_tx; fp8: each widening thread */
        mbar_init_rings(full_k, full_v, empty_k, empty_v, KV8 ? WIDEN_THREADS : PA_TMA ? 1 : 128);
        if constexpr (KV8) {
            for (int i = 0; i < STG8; i++) {
                mbar_init(&full8_k[i], 1);
                mbar_init(&full8_v[i], 1);
                mbar_init(&empty8_k[i], WIDEN_THREADS);
                mbar_init(&empty8_v[i], WIDEN_THREADS);
            }
        }
        mbar_init(&v_last, 1); /* TMA: the last tile's V, before its rows past k1 are zeroed */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        if (q_tma) { /* the whole Q tile at once, rows (query, head) as pa_swz lays them out */
            mbar_arrive_expect_tx(&bar_q, Q_BYTES);
            for (int blk = 0; blk < D / 64; blk++)
                tma_load(q_addr + blk * BM * 128, maps.q, blk * 64, hk * p.group + g0, (int)(w0.q_start + w0.i0),
                         &bar_q);
        }
    }
    __syncthreads();
    const pa_work w = s_w;
    const int kbase = w.k0 - w.k0 % KALIGN; /* tile t holds keys kbase + t BN .. + BN - 1 */
    const int nt = (w.k1 - kbase + BN - 1) / BN;
    /* the last block-wide barrier was the one above: the producer starts on
     * the first tile while the consumers find their rows' key ranges */

    if (wg == 0) {
        /* ---- producer ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
        const int ps = PA_PAGE > 0 ? PA_PAGE : p.page_size;
        /* Q (swizzled): cp.async, or the rotated f32 q rounded and stored;
         * with TMA by warps 1-3 only, so that warp 0's first page ids and
         * boxes do not queue behind Q's copies (they were issued 2.7 us after
         * the roles part, now 1.0; docs/prefill.md) */
        auto load_q = [&](int t0, int nthr) {
            pa_prefill_load_q<BM, GT, D>(p, w, hk, g0, t0, nthr, [&](int r, int c) { return smem + pa_swz(BM, r, c); });
            if (p.q_f32) {
                pa_fence_proxy_async(); /* the stores -> the consumers' wgmma (async proxy), as prefill_wgmma.cu does */
                mbar_arrive(&bar_q);    /* release: the stores above */
            } else {
                mbar_arrive_cp_async(&bar_q);
            }
        };

#if PA_TMA
        if constexpr (KV8) {
            const u32 k8_addr = v_addr + PA_STAGES * KV_BYTES, v8_addr = k8_addr + STG8 * TILE8;
            if (tid >= 32) { /* warps 1-3: Q, then the widening */
                if (!q_tma) {
                    load_q(tid - 32, 96);
                    pa_cp_async_wait<0>();
                }
                ws8_widen(smem, k8_addr - base, v8_addr - base, w, kbase, nt, tid - 32, full8_k, full8_v, empty8_k,
                          empty8_v, full_k, full_v, empty_k, empty_v);
                return;
            }
        }
        /* K/V tiles by TMA: warp 0 issues one box per page (or tile) and 64
         * columns. The last tile's V rows past k1 must be zeros (P is 0
         * there, but 0 x a NaN left in memory would not be): TMA fills the
         * boxes of pages past k1 with them where k1 ends a page and GT > 1
         * (a box far past the map's rows), else the warp zeroes them once
         * the boxes have landed (docs/prefill.md). */
        if (tid >= 32) {
            if (!q_tma) {
                load_q(tid - 32, 96);
                pa_cp_async_wait<0>();
            }
            return;
        }
        /* Lane j issues box j of each tile (a tile holds BN / TMA_ROWS
         * boxes): the boxes' page ids load in parallel, a tile ahead (the
         * first tile's from the host's list, where it gave one). */
        const int lane = tid;
        auto box_row = [&](int t) { /* the map row of this lane's box of tile t (0: no box) */
            const int tok = kbase + t * BN + lane * TMA_ROWS;
            if (t >= nt || lane >= NBOX || tok >= w.k1) return 0;
            if (PA_PAGE == -1) return w.cache_row * ps + tok;
            const int pid = ((const int *)p.block_table)[(i64)w.b * p.bt_stride + tok / ps];
            return pid * ps + tok % ps;
        };
        /* this lane's box (cache row `row`, the tile's rows from lane x
         * TMA_ROWS) into the tile at dst: one page box, or a box per 64 columns */
        auto load_box = [&](u32 dst, const void *map, int row, u64 *bar) {
            const u32 at = dst + lane * (TMA_ROWS / 8) * KVL::GS;
            if constexpr (PAGE_BOX) {
                tma_load_page(at, map, hk, row / 8, bar);
            } else {
                for (int blk = 0; blk < D / 64; blk++) tma_load(at + blk * KVL::BS, map, blk * 64, hk, row, bar);
            }
        };
        int row = first_boxes ? first_row : box_row(0);
        if constexpr (KV8) {
            const u32 k8_addr = v_addr + PA_STAGES * KV_BYTES, v8_addr = k8_addr + STG8 * TILE8;
            ws8_load(maps, w, hk, kbase, nt, lane, row, box_row, k8_addr, v8_addr, full8_k, full8_v, empty8_k, empty8_v);
            return;
        }
        for (int t = 0; t < nt; t++) {
            const int s = t % PA_STAGES;
            const u32 ph = (u32)(t / PA_STAGES) & 1u;
            const int tok0 = kbase + t * BN, nkeys = min(BN, w.k1 - tok0);
            const int nbox = (nkeys + TMA_ROWS - 1) / TMA_ROWS; /* boxes holding keys: never a page past k1 */
            const u32 box_bytes = (D / 64) * TMA_ROWS * 128, bytes = (u32)nbox * box_bytes;
            const u32 ks = k_addr + s * KV_BYTES, vs = v_addr + s * KV_BYTES;
            const int next = box_row(t + 1); /* used next iteration: its latency hides behind this one */
            mbar_wait(&empty_k[s], ph ^ 1u); /* a fresh barrier passes parity 1 */
            if (lane == 0) mbar_arrive_expect_tx(&full_k[s], bytes);
            __syncwarp(); /* the expected bytes before any box lands */
            if (lane < nbox) load_box(ks, maps.k, row, &full_k[s]);
            mbar_wait(&empty_v[s], ph ^ 1u);
            /* the last tile's V: where its keys end at a box's end (pages
             * below a tile: every box either all keys or none), the boxes
             * without keys load from row OOB_ROW, past any map's rows, and
             * TMA fills them with zeros: no wait, no stores, no fence on
             * the way to the consumers' last P V (4 x 2048: -5 %); else
             * its rows past k1 are zeroed once the boxes have landed. Not
             * at one head a kv head (GT 1): there ptxas then serialised the
             * consumers' wgmmas at page boxes (pages 16 and 32), and every
             * other form of this code tried serialised some GT 4 variant
             * (docs/prefill.md) */
            const bool oob_fill = GT > 1 && TMA_ROWS < BN && nkeys % TMA_ROWS == 0;
            const bool tail = nkeys < BN && !oob_fill;
            u64 *vbar = tail ? &v_last : &full_v[s];
            if (lane == 0) mbar_arrive_expect_tx(vbar, oob_fill ? (u32)NBOX * box_bytes : bytes);
            __syncwarp();
            if (lane < nbox) load_box(vs, maps.v, row, vbar);
            else if (oob_fill && lane < NBOX) load_box(vs, maps.v, OOB_ROW, vbar);
            if (tail) { /* only the last tile: v_last completes once */
                mbar_wait(&v_last, 0);
                u8 *vt = smem + Q_BYTES + (PA_STAGES + s) * KV_BYTES;
                for (int e = lane; e < (BN - nkeys) * (D / 64) * 8; e += 32) {
                    const int c = e % 8, rb = e / 8, r = nkeys + rb % (BN - nkeys), blk = rb / (BN - nkeys);
                    *(uint4 *)(vt + (r / 8) * KVL::GS + blk * KVL::BS + (r % 8) * 128 + c * 16) = make_uint4(0, 0, 0, 0);
                }
                pa_fence_proxy_async(); /* the zeros -> the consumers' wgmma */
                __syncwarp();
                if (lane == 0) mbar_arrive(&full_v[s]);
            }
            row = next;
        }
        return;
#else
        load_q(tid, 128);
        const int row = tid / TPR, sub = tid % TPR;
        const i64 head_bytes = (i64)hk * D * 2;
        auto page_of = [&](int t) {
            const int tok = kbase + t * BN + row;
            return PA_PAGE != -1 && t < nt && tok < w.k1 ? ((const int *)p.block_table)[(i64)w.b * p.bt_stride + tok / ps]
                                                         : 0;
        };
        int pid = page_of(0);
        for (int t = 0; t < nt; t++) {
            const int s = t % PA_STAGES;
            const u32 ph = (u32)(t / PA_STAGES) & 1u;
            const int tok = kbase + t * BN + row;
            const bool ok = tok < w.k1;
            const i64 off = ok ? pa_key_offset<PA_PAGE>(p, w, tok, pid, ps, head_bytes) : 0;
            pid = page_of(t + 1);
            const u8 *gk = (const u8 *)p.k_cache + off, *gv = (const u8 *)p.v_cache + off;
            mbar_wait(&empty_k[s], ph ^ 1u); /* a fresh barrier passes parity 1 */
#pragma unroll 4
            for (int i = 0; i < CPR / TPR; i++) {
                const int ch = sub + TPR * i;
                pa_cp_async16(smem + Q_BYTES + s * KV_BYTES + pa_swz(BN, row, ch), gk + ch * 16, ok);
            }
            mbar_arrive_cp_async(&full_k[s]);
            mbar_wait(&empty_v[s], ph ^ 1u);
#pragma unroll 4
            for (int i = 0; i < CPR / TPR; i++) {
                const int ch = sub + TPR * i;
                pa_cp_async16(smem + Q_BYTES + (PA_STAGES + s) * KV_BYTES + pa_swz(BN, row, ch), gv + ch * 16, ok);
            }
            mbar_arrive_cp_async(&full_v[s]);
        }
        pa_cp_async_wait<0>(); /* nothing in flight when the thread exits */
        return;
#endif
    }

    /* ---- consumers ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
    const int ctid = tid - 128, lane = tid & 31, cwarp = ctid >> 5, cw = cwarp >> 2;
    const int R0 = cw * 64 + (cwarp & 3) * 16 + (lane >> 2);
    pa_prefill_rows<BM, GT, PA_NATURAL>(p, w, hk, g0, s_lo, s_hi, s_slope, ctid, 256);
    consumers_sync();
    pa_lane_rows rs = pa_lane_rows_init<GT, PA_NATURAL>(p, w, R0, s_lo, s_hi, s_slope);
    if constexpr (KV8) { /* the key scale, into the scores' factor (natural=0 only) */
        const float ks = p.k_scales ? ((const float *)p.k_scales)[hk] : p.k_scale;
        rs.c2 *= ks;
        rs.c2b *= ks;
    }
    /* tiles every row takes whole run without range checks (uniform over
     * both consumers: the step variants hold different wgmma instructions) */
    __shared__ int s_wr[24];
    const int warp_hi = (int)__reduce_max_sync(0xffffffffu, (unsigned)max(rs.hi0, rs.hi1)); /* its rows end by then */
    if (lane == 0) {
        s_wr[cwarp] = rs.wlo;
        s_wr[8 + cwarp] = rs.whi;
        s_wr[16 + cwarp] = warp_hi;
    }
    consumers_sync();
    int ti0, ti1;
    pa_interior_tiles(s_wr, 8, kbase, BN, nt, ti0, ti1);
    /* head dim 128: the last tile peeled from the loop (a third variant in
     * the loop slows every step by 9-12 %; head dim 64 and the
     * natural variants (ALiBi, softcap) serialise their products then), and
     * where its keys from BN / 2 on are masked for all of this consumer's
     * rows (a causal diagonal), its S and P V over the first half only */
    constexpr bool PEEL = D == 128 && !PA_NATURAL;
    const int chi = max(max(s_wr[16 + 4 * cw], s_wr[17 + 4 * cw]), max(s_wr[18 + 4 * cw], s_wr[19 + 4 * cw]));
    const bool half_last = PEEL && nt > 1 && chi <= kbase + (nt - 1) * BN + BN / 2;

    float o[D / 8][4];
    pa_zero(o);
    float s[BN / 8][4];
    u32 pa[BN / 16][4];
    auto release = [&](u64 *bar) { /* this warp is done with a slot */
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };
    auto v_tile = [&](int t) { return v_addr + (t % PA_STAGES) * KV_BYTES; }; /* V(t) must have landed */
    mbar_wait(&bar_q, 0);
    if (cw == 1) turn_pass(1); /* consumer 0 issues first */
    /* one iteration; WITH_PV false for tile 0 only (peeled, see prefill_wgmma.cu) */
    auto step = [&](int t, auto with_pv, auto masked, auto half) {
        constexpr bool WITH_PV = decltype(with_pv)::value;
        constexpr int NK = decltype(half)::value && BN >= 128 ? BN / 2 : BN; /* half: head dim 128 only (PEEL) */
        const int st = t % PA_STAGES;
        mbar_wait(&full_k[st], (u32)(t / PA_STAGES) & 1u);
        if constexpr (WITH_PV) mbar_wait(&full_v[(t - 1) % PA_STAGES], (u32)((t - 1) / PA_STAGES) & 1u);
        pa_fence_proxy_async(); /* the copies (generic proxy) -> wgmma (async proxy) */

        pa_fence_operands(s);
        pa_fence_operands(o);
        turn_wait(cw);
        pa_wgmma_fence();
        pa_wg_qk<D, BM, BN, KVL, NK>(s, q_addr, cw, k_addr + st * KV_BYTES);
        pa_wgmma_commit();
        if constexpr (WITH_PV) {
            pa_wg_pv<D, BN, KVL>(o, pa, v_tile(t - 1));
            pa_wgmma_commit();
        }
        turn_pass(cw); /* issued: the other consumer's products queue behind these */
        pa_wgmma_wait<WITH_PV ? 1 : 0>(); /* S(t) has completed; P V(t - 1) may still run */
        pa_fence_operands(s);
        if constexpr (NK < BN) { /* the masked half: defined here, so the last tile's P is not kept live */
#pragma unroll
            for (int n = NK / 8; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = -PA_INF;
        }
        release(&empty_k[st]);
        pa_wg_softmax<BN, PA_NATURAL, WITH_PV, decltype(masked)::value ? 1 : 0>(p, rs, s, o, pa, kbase + t * BN);
        if constexpr (WITH_PV) release(&empty_v[(t - 1) % PA_STAGES]); /* P V(t - 1) retired in the softmax */
    };
    constexpr pa_bool<false> F{};
    constexpr pa_bool<true> T{};
    /* (head dim 256: masked always; the split costs spills at 168 registers) */
    if (nt > 0) {
        if (D <= 128 && ti0 == 0 && ti1 > 0) step(0, F, F, F); /* tile 0 interior */
        else step(0, F, T, F);
    }
    for (int t = 1; t < (PEEL ? nt - 1 : nt); t++) {
        if (D <= 128 && t >= ti0 && t < ti1) step(t, T, F, F);
        else step(t, T, T, F);
    }
    if constexpr (PEEL) {
        if (nt > 1) {
            if (nt - 1 >= ti0 && nt - 1 < ti1) step(nt - 1, T, F, F);
            else if (half_last) step(nt - 1, T, T, T);
            else step(nt - 1, T, T, F);
        }
    }
    if (nt > 0) {
        mbar_wait(&full_v[(nt - 1) % PA_STAGES], (u32)((nt - 1) / PA_STAGES) & 1u);
        pa_fence_proxy_async();
        if constexpr (PEEL) {
            if (half_last) pa_wg_pv_last<D, BN, KVL, BN / 2>(o, pa, v_tile(nt - 1));
            else pa_wg_pv_last<D, BN, KVL>(o, pa, v_tile(nt - 1));
        } else {
            pa_wg_pv_last<D, BN, KVL>(o, pa, v_tile(nt - 1));
        }
    }

    if constexpr (KV8) { /* the value scale, into O */
        const float vs = p.v_scales ? ((const float *)p.v_scales)[hk] : p.v_scale;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) o[n][j] *= vs;
    }
    /* epilogue, each consumer on its own (consumer 0's under consumer 1's
     * last products): its rows of O rounded into its own rows of the Q tile
     * (free: its last S has completed), then out from there */
    if (p.out_f32) {
        pa_write_rows_f32<D, BM, GT>(p, w, hk, g0, rs, o, R0);
    } else {
        pa_stage_rows_swz<D, BM, GT>(p, w, hk, g0, rs, o, R0, smem);
        /* by TMA where every row of the tile is a query (and the host built the
         * map): one thread's boxes instead of 8 loads and stores a thread */
        const bool o_tma = TMA_QO && maps.o_tma && w.i0 + QT <= w.seqlen_q;
        if (o_tma) pa_fence_proxy_async(); /* this thread's rows -> the TMA store (async proxy) */
        if (cw == 0) asm volatile("bar.sync 4, 128;\n" ::: "memory");
        else asm volatile("bar.sync 5, 128;\n" ::: "memory");
        if (!o_tma) {
            pa_write_rows_swz<D, BM, GT, 64, 128>(p, w, hk, g0, smem, cw * 64, ctid & 127);
        } else if ((ctid & 127) == 0) {
            for (int blk = 0; blk < D / 64; blk++)
                tma_store(maps.o, blk * 64, hk * p.group + g0, (int)(w.q_start + w.i0 + cw * (QT / 2)),
                          q_addr + blk * BM * 128 + cw * 64 * 128);
            tma_store_commit_wait_read();
        }
    }
    if (cw == 0) turn_wait(0); /* consumer 1's last pass (each waits nt times, consumer 0 is passed nt + 1) */
#endif
}

#endif /* PA_EMBED_ONLY */
