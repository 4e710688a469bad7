/*
 * decode_mma.cu -- paged decode attention on tensor cores (f16, bf16): the
 * decode kernel's plan (see decode.cu) with the arithmetic on mma.sync
 * m16n8k16, because the CUDA-core version spends more instructions per key
 * than the SMs can issue at full memory bandwidth.
 *
 * One block = one work item (sequence b, keys [k0, k1)) x one head tile: kv
 * head hk with GT of its query heads for NQ queries, ROWS = NQ * GT <= 16 rows,
 * padded to the 16 rows of an MMA tile (padding rows are all masked).
 *  - Page ids of the range go to shared memory first; the absolute 64-bit byte
 *    offset of each K/V row of a stage is computed once (one thread per row,
 *    a stage ahead, in a two-entry ring) and the 16-byte cp.async copies of the
 *    STAGES-deep pipeline add only their chunk offset to it.
 *  - Each of the 4 warps takes 8 keys of every 32-key stage (small stages:
 *    more of them fit, so more bytes are in flight per SM): S = Q K^T with
 *    m16n8k16 (Q fragments loaded once, K by ldmatrix from padded rows, so
 *    conflict-free), the online softmax in base 2 on the accumulator
 *    fragments, P rounded to the input type as the A operand of O += P V with
 *    m16n8k8 (V by ldmatrix.trans). Accumulation in f32 throughout.
 *  - The warps' states are merged through shared memory, one row per warp
 *    and vector stores, into out/lse or the split's partial;
 *    pa_split_arrival combines the splits (fused).
 *
 * PA_PERSIST=1 (docs/decode.md): the blocks stay resident and
 * take units (work item x head tile) from a counter in global memory, so a
 * block on a faster SM takes more of them. Near the end of a unit the next
 * one's work item, page ids, rows and Q are loaded into the other of two
 * slots by cp.async, nothing waiting on them, and the copies run on from
 * the end of one unit into the next: a block pays its start-up once, not
 * per unit.
 *
 * PA_HW=1 (short units; docs/decode.md):
 * each warp takes a head tile of its own, the block's unit being four head
 * tiles of a work item; a stage holds the same KPW keys of all four, each
 * warp keeps its tile's softmax whole and writes its rows from its
 * fragments: no merge of the warps, four times the stages per block start.
 * With PA_PERSIST too: the counter hands out units of four
 * head tiles, loaded while the current four stream (the host takes it at
 * 16 keys a warp on units of PREP_STAGES stages or more: hw_persist_pays).
 *
 * p.claim (one block per unit, docs/decode.md): the splits of
 * a query tile run their first CS stages and then take the tile's other
 * keys CRUN stages at a time from a counter (claimed CS stages ahead, their
 * page ids loaded per stage), so that a block on a faster SM takes more.
 *
 * Defines: PA_DTYPE (1 f16, 2 bf16), PA_D (a multiple of 32, <= 128), PA_NQ,
 * PA_GT (NQ * GT <= 16), PA_PAGE (-1 contiguous, 0 any, else a power of two),
 * PA_STAGES, PA_MAXP, PA_KPW (8, 16), PA_PERSIST (0, 1), PA_MINB (blocks a SM
 * the registers must allow: 1, or more for short units, whose rate is set
 * by how many units' start-up chains overlap), PA_HW (0, 1: a warp a head
 * tile; NQ * GT <= 8, <= 4 for a rotated f32 q), PA_NW (warps a block: 4,
 * or 8 with PA_PERSIST, one block a SM with twice the keys a stage, so the
 * blocks' last units end closer together; docs/decode.md); PA_KV (optional):
 * the caches' dtype, PA_DTYPE or an fp8 one (head dims 64 and 128).
 *
 * FP8 caches (PA_KV fp8): the stages hold the cache's bytes (half the
 * copies of a 16-bit cache), and the MMAs' K and V fragments are converted
 * in registers, right after their ldmatrix from the fp8 rows (every fp8
 * value is exact in f16 and bf16). ldmatrix moves 16-bit elements, that is
 * fp8 pairs, so two dimensions are permuted, each where it costs least:
 *   Q K^T: a lane's K fragment holds bytes 4t .. 4t + 3 of a row (t = lane %
 *   4), dims 4t, 4t + 1 where the MMA wants 2t, 2t + 1 and 4t + 2, 4t + 3
 *   where it wants 2t + 8, 2t + 9; q's fragments are permuted the same way
 *   once a unit (fp8_permute_q: the dot product is the same sum);
 *   P V: a transposed fp8 matrix gives a lane keys 2t, 2t + 1 of dims 2g,
 *   2g + 1 (g = lane / 4), a byte permute makes them the B fragments of two
 *   8-dim tiles, one of the even dims of 16, one of the odd; so a lane's
 *   accumulators hold dims 16c + 4t .. 16c + 4t + 3 of each 16 (in o[2c][0],
 *   o[2c + 1][0], o[2c][1], o[2c + 1][1]), which the epilogue stores where
 *   they belong.
 * A bf16 q over an fp8 cache runs its MMAs in f16 (QS, PA_FP8_F16_MMA): an fp8 pair widens
 * to an f16 pair in one instruction (e4m3: cvt.rn.f16x2.e4m3x2, e5m2: a
 * byte permute), to a bf16 pair in four (through f32), and the widening of
 * K and V kept the ALU pipe the busiest (three H100 leases: 1-8% faster,
 * docs/fp8.md). Each
 * row of q is scaled into f16 by a power of two once a unit (qs_scales), P
 * is stored in f16 with 15 of headroom above its max (hr).
 * The stage's rows are swizzled for ldmatrix (fp8_chunk_at). A key's scale
 * goes into q's (qk_scale), a value's into the output. (Before: each warp
 * converted its rows of a stage into a 16-bit copy in shared memory for the
 * 16-bit fragment code: three more bytes of shared-memory traffic per byte
 * of cache, 0.57-0.63 of the read rate at 64 x 4096 keys on an H100.)
 */
#ifndef PA_EMBED_ONLY
#include "attn_common.cuh"
#include "mma.cuh"

#if !defined(PA_DTYPE) || !defined(PA_D) || !defined(PA_NQ) || !defined(PA_GT) || \
    !defined(PA_PAGE) || !defined(PA_STAGES) || !defined(PA_MAXP) || !defined(PA_KPW) || !defined(PA_PERSIST) || \
    !defined(PA_MINB) || !defined(PA_HW) || !defined(PA_NW)
#error "decode_mma.cu needs PA_DTYPE, PA_D, PA_NQ, PA_GT, PA_PAGE, PA_STAGES, PA_MAXP, PA_KPW, PA_PERSIST, PA_MINB, PA_HW, PA_NW"
#endif

#define NWARPS PA_NW
#define NTHREADS (32 * NWARPS)
#ifndef PA_KV
#define PA_KV PA_DTYPE
#endif

#include "decode_mma_shape.cuh"
#include "decode_mma_fp8.cuh"

extern "C" __constant__ int pa_decode_mma_info[4] = {NTHREADS, SMEM, T, PA_MAXP};

/* The byte offset of 16-byte chunk c in row r of a shared memory tile */
PA_DEV int chunk_at(int r, int c) { return (SWZ ? (c ^ (r & 7)) : c) * 16; }
extern "C" __global__ void __launch_bounds__(NTHREADS, PA_MINB) pa_decode_mma(const pa_attn_params p) {
    extern __shared__ __align__(128) u8 smem[];
    __shared__ int s_flag, s_next;
    __shared__ __align__(16) pa_work s_w[NSLOT];
    __shared__ int s_unit[NSLOT]; /* the unit a slot holds (work item x head tile), -1: none */
    /* its head tile and the tile's kv head (HW: each warp's tile's) */
    __shared__ int s_ht[NSLOT][HW ? NWARPS : 1], s_hk[NSLOT][HW ? NWARPS : 1];
    __shared__ int s_lo[NSLOT][16], s_hi[NSLOT][16];
    __shared__ float s_ml[16 * NWARPS * 2];
    __shared__ int s_ckb[CAN_CLAIM ? CR : 1]; /* claimed stages' first keys; -1: the end */
    __shared__ int s_cpg[CAN_CLAIM ? CR : 1][CAN_CLAIM ? PPS : 1]; /* and their page ids */
    i64 *s_rowoff = (i64 *)(smem + PAGES_BYTES);
    u8 *s_q = smem + PAGES_BYTES + ROWOFF_BYTES;
    u8 *s_merge8 = s_q + Q_BYTES; /* (fp8: the warps' merge) */
    u8 *s_kv = smem + KV_OFF;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tiles_per_group = p.group / GT;
    const int ps = PA_PAGE > 0 ? PA_PAGE : p.page_size;
    const int units = p.num_work * p.head_tiles;
    const bool natural = p.softcap > 0.f || p.alibi != 0;
    /* claim: the block's item claims stages past its first CS (set once its
     * work item is there) */
    bool claim = false;
    auto pages_of = [&](int j) { return (int *)smem + j * PA_MAXP; };
    /* the next unit's index less gridDim.x (persistent blocks; HW: in
     * blocks' units of CU head tiles), and the unit (head tile) it starts at */
    auto fetch_unit = [&]() {
        u32 *counter = (u32 *)p.counters + p.item_counter;
        const u32 f = atomicAdd(counter, 1u);
        if (f == (u32)(units / CU) - 1u) *counter = 0u;
        return f;
    };
    auto unit_at = [&](u32 f) { return ((int)gridDim.x + (int)f) * CU; };
    /* stages a unit runs; PERSIST: at least STAGES, so that the copies
     * running ahead (STAGES - 1 stages, their row offsets one more) never
     * reach past the next unit (the extra stages copy nothing: zero-filled,
     * masked); claim: until a stage finds no key (the loop breaks) */
    auto stages_of = [&](int j) {
        const pa_work &w = s_w[j];
        const int n = (w.k1 - w.k0 + T - 1) / T;
        return PERSIST ? max(n, PA_STAGES) : CAN_CLAIM && claim ? 0x3fffffff : n;
    };

    /* Slot j's unit u (thread 0) and its heads, so that neither the row
     * offsets of every stage, nor Q's loads, nor a unit's start divide by
     * the run-time tile counts */
    auto set_unit = [&](int j, int u) {
        s_unit[j] = u < units ? u : -1;
#pragma unroll
        for (int t = 0; t < (HW ? NWARPS : 1); t++) {
            const int ht = (u + t) % p.head_tiles;
            s_ht[j][t] = ht;
            s_hk[j][t] = ht / tiles_per_group;
        }
    };
    /* the first query head in the group of slot j's tile t */
    auto g0_of = [&](int j, int t) { return (s_ht[j][t] - s_hk[j][t] * tiles_per_group) * GT; };
    /* A unit into slot j: its work item (first; a barrier before load_rest) */
    auto load_item = [&](int j, int u) {
        const bool ok = u < units;
        if (tid == 0) set_unit(j, u);
        if (ok && tid < 16) ((u32 *)&s_w[j])[tid] = ((const u32 *)p.work)[(i64)(u / p.head_tiles) * 16 + tid];
    };
    /* The Q tile of slot j's unit (set_unit's heads, after a barrier) into
     * s_q, unscaled, in the input type; the rotated f32 q as hi + lo, rows
     * 16.. holding lo (HW: the slot's NWARPS tiles, ROWS rows each). async:
     * a q in the input type by cp.async (the caller commits and waits) */
    auto load_q = [&](int j, bool async) {
        const pa_work &w = s_w[j];
        for (int e = tid; e < QROWS * CPR; e += NTHREADS) {
            const int r = e / CPR, c = e - r * CPR;
            const int lr = HW ? r % ROWS : r, qi = lr / GT; /* the row in its tile */
            uint4 v = make_uint4(0, 0, 0, 0), vlo = v;
            if ((HW ? r < NWARPS * ROWS : r < ROWS) && qi < w.seqlen_q) {
                const int t = HW ? r / ROWS : 0, hk = s_hk[j][t], g0 = g0_of(j, t);
                const i64 off = ((w.q_start + qi) * p.heads + hk * p.group + g0 + lr % GT) * (i64)D + c * 8;
                if (p.q_f32) {
                    /* q = hi + lo, both in the input type: S = hi K^T + lo K^T
                     * keeps the rotated q's f32 precision (rounding q alone
                     * would cost up to |s| * 2^-9 in bf16) */
                    float x[8];
                    u32 h[4], l[4];
                    pa_load8<PA_DT_F32>((const float *)p.q + off, x);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        h[i] = pack2(x[2 * i], x[2 * i + 1]);
                        l[i] = pack2(x[2 * i] - unpack_lo(h[i]), x[2 * i + 1] - unpack_hi(h[i]));
                    }
                    v = make_uint4(h[0], h[1], h[2], h[3]);
                    vlo = make_uint4(l[0], l[1], l[2], l[3]);
                } else if (async) {
                    pa_cp_async16(s_q + r * RSTRIDE + chunk_at(r, c), (const u16 *)p.q + off, true);
                    continue;
                } else {
                    v = *(const uint4 *)((const u16 *)p.q + off);
                }
            }
            *(uint4 *)(s_q + r * RSTRIDE + chunk_at(r, c)) = v;
            /* (read only then; never with 32 rows of Q) */
            if (p.q_f32 && QROWS == 16) *(uint4 *)(s_q + (16 + r) * RSTRIDE + chunk_at(r, c)) = vlo;
        }
    };
    /* The ALiBi slope (log2 units) of row r of slot j's work item's head
     * tile (kv head hk, its first query head of the group g0) */
    auto slope_of = [&](int j, int hk, int g0, int r) {
        const pa_work &w = s_w[j];
        if (!p.alibi || r >= ROWS || r / GT >= w.seqlen_q) return 0.f;
        return ((const float *)p.alibi)[(i64)w.b * p.alibi_batch_stride + hk * p.group + g0 + r % GT] * PA_LOG2E;
    };
    /* The rest of slot j (after a barrier since load_item): page ids of keys
     * [k0, k1) (never past the last page holding a key), the rows' key ranges
     * and Q when with_q. async: the page ids and Q by
     * cp.async, all in flight at once (the caller commits and waits): a
     * block's start waits one round trip for them, not one per load. */
    auto load_rest = [&](int j, bool with_q, bool async, int from = 0) {
        if (s_unit[j] < 0) return;
        const pa_work &w = s_w[j];
        /* (claim: only the static stages' page ids) */
        const int k1 = CAN_CLAIM && claim ? min(w.k1, w.k0 + CS * T) : w.k1;
        if (async) pa_load_page_ids<PA_PAGE, NTHREADS, true>(p, w.b, w.k0, k1, ps, pages_of(j), from);
        else pa_load_page_ids<PA_PAGE, NTHREADS>(p, w.b, w.k0, k1, ps, pages_of(j));
        if (tid < 16) {
            /* (a row's key range: the same for every head tile) */
            const int r = tid, qi = r / GT;
            int lo = 0, hi = 0;
            if (r < ROWS && qi < w.seqlen_q) {
                pa_mask_range(p.window_left, p.window_right, w.seqlen_q, w.seqlen_k, qi, &lo, &hi);
                lo = max(lo, w.k0);
                hi = min(hi, w.k1);
            }
            s_lo[j][r] = lo;
            s_hi[j][r] = hi;
        }
        if (with_q) load_q(j, async);
    };

    /* Row offsets (bytes from the cache base; -1: nothing to copy) of the
     * stream's stages, one stage ahead of their copies, in ring entry
     * G % 2 for global stage G. The cursor (slot rj, stage rs of its unit)
     * walks the stream: it crosses into the other slot at the end of a unit
     * (PERSIST; else it runs dry) */
    int rj = 0, rs = 0;
    auto row_offsets = [&](int G) {
        const bool valid = rj < NSLOT && s_unit[rj] >= 0;
        if (tid < R) {
            i64 off = -1;
            if (valid) {
                const pa_work &w = s_w[rj];
                /* (HW: row tid is key tid % KPW of the unit's head tile tid / KPW) */
                const int key = HW ? tid % KPW : tid;
                const int hk = s_hk[rj][HW ? tid / KPW : 0];
                if (CAN_CLAIM && claim && rs >= CS) {
                    /* a claimed stage: its first key and page ids from the ring */
                    const int kb = s_ckb[rs % CR], tok = kb + key;
                    if (kb >= 0 && tok < w.k1) {
                        const int page = PA_PAGE == -1 ? 0 : s_cpg[rs % CR][tok / ps - kb / ps];
                        off = pa_key_offset<PA_PAGE, KVSZ>(p, w, tok, page, ps, (i64)hk * D * KVSZ);
                    }
                } else {
                    const int tok = w.k0 + rs * T + key;
                    if (tok < w.k1) {
                        const int page = PA_PAGE == -1 ? 0 : pages_of(rj)[tok / ps - w.k0 / ps];
                        off = pa_key_offset<PA_PAGE, KVSZ>(p, w, tok, page, ps, (i64)hk * D * KVSZ);
                    }
                }
            }
            s_rowoff[(G & 1) * R + tid] = off;
        }
        if (valid && ++rs >= stages_of(rj)) {
            rj = PERSIST ? rj ^ 1 : NSLOT;
            rs = 0;
        }
    };
    /* The copies: lanes in groups of LINE, each group one 16 * LINE-byte
     * piece (a whole 128-byte line at head dims that are multiples of 64) of
     * one row per instruction; a thread's rows are g + GROUPS * r, so it
     * loads RPT row offsets per stage and adds the pieces as immediates. */
    const int cp_g = tid / LINE, cp_sub = tid % LINE;
    auto issue = [&](int G) {
        u8 *sbase = s_kv + (G % PA_STAGES) * KV_STAGE;
        const i64 *ro = s_rowoff + (G & 1) * R;
#pragma unroll
        for (int r = 0; r < RPT; r++) {
            const int row = cp_g + GROUPS * r;
            const i64 off = ro[row];
            const bool ok = off >= 0;
            const i64 src = (ok ? off : 0) + cp_sub * 16;
            const u8 *gk = (const u8 *)p.k_cache + src, *gv = (const u8 *)p.v_cache + src;
            /* chunks cp_sub + LINE h: at 16 keys per warp LINE is 8, so the
             * swizzle moves only the low 3 bits (cp_sub), h stays an immediate
             * (fp8: h is 0) */
            u8 *sk = sbase + row * GSTRIDE + (FP8 ? fp8_chunk_at(row, cp_sub) : chunk_at(row, cp_sub)), *sv = sk + R * GSTRIDE;
#pragma unroll
            for (int h = 0; h < GCPR / LINE; h++) {
                pa_cp_async16(sk + h * LINE * 16, gk + h * LINE * 16, ok);
                pa_cp_async16(sv + h * LINE * 16, gv + h * LINE * 16, ok);
            }
        }
    };

    /* 1. the first unit (blockIdx.x; HW: NWARPS head tiles a block): its
     * work item, with its first page ids where the host listed them
     * (p.first_pages) */
    int j = 0;
    const int unit0 = (int)blockIdx.x * CU;
    load_item(0, unit0);
    /* a launch after this one (programmatic, the short units of a call that
     * also has long ones: cuda_attention.c) may take the SMs this grid
     * leaves: one block per unit, every block is running; persistent blocks
     * say so once they know their unit is their last (below) */
    if (!PERSIST) pa_launch_dependents();
    const int item0 = unit0 / p.head_tiles;
    const bool listed = PA_PAGE != -1 && p.first_pages != 0 && item0 < p.first_pages_items;
    if (listed && tid >= 32 && tid < 32 + PA_DECODE_FIRST_PAGES)
        pages_of(0)[tid - 32] = ((const int *)p.first_pages)[(i64)item0 * PA_DECODE_FIRST_PAGES + tid - 32];
    __syncthreads();
    if (CAN_CLAIM) claim = p.claim != 0 && s_unit[0] >= 0 && s_w[0].nsplit > 1;
    /* Early: the first STAGES stages' keys lie in the listed pages (or the
     * cache is contiguous), so the stages go out now and the other page ids,
     * the rows and Q follow in one group of copies waited for before the
     * first stage is used; else all of them first (one more round trip
     * before the first stage). */
    const pa_work &w0 = s_w[0];
    const bool early = PA_PAGE == -1 ||
                       (listed && (min(w0.k1, w0.k0 + PA_STAGES * T) - 1) / ps - w0.k0 / ps < PA_DECODE_FIRST_PAGES);
    load_rest(0, !p.q_f32 || !early, true, PA_PAGE != -1 && early ? PA_DECODE_FIRST_PAGES : 0);
    pa_cp_async_commit();
    if (!early) {
        pa_cp_async_wait<0>();
        __syncthreads();
    }
    /* 2. the pipeline's first stages */
    int G = 0; /* the stream's stage that the block consumes next */
#pragma unroll
    for (int st = 0; st < PA_STAGES - 1; st++) {
        row_offsets(st);
        __syncthreads();
        issue(st);
        pa_cp_async_commit();
    }
    row_offsets(PA_STAGES - 1);
    if (early) {
        if (p.q_f32 && s_unit[0] >= 0) load_q(0, false); /* (plain loads: while the stages fly) */
        pa_cp_async_wait<PA_STAGES - 1>(); /* the page ids, rows and Q (the first group) */
        __syncthreads();
    }

    const int g = lane >> 2, t4 = lane & 3;
    float qinv0 = 1.f, qinv1 = 1.f; /* (QS) 2^-c of rows g, g + 8 (decode_mma_fp8.cuh) */
    /* the s_q row of MMA row lr (HW: this warp's ROWS rows, the padding
     * rows repeating them: masked, but finite) */
    auto q_row = [&](int lr) { return HW ? warp * ROWS + lr % ROWS : lr; };
    /* this lane's Q fragments of the unit in s_q, kept for the whole unit */
    u32 qa[D / 16][4];
    auto load_qa = [&]() {
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            const int mi = lane >> 3;
            const int r = q_row((lane & 7) + 8 * (mi & 1));
            ldmatrix_x4(qa[ks], s_q + r * RSTRIDE + chunk_at(r, ks * 2 + (mi >> 1)));
            if constexpr (FP8) fp8_permute_q(qa[ks], lane);
        }
        if constexpr (QS) {
            qs_scales(qa, qinv0, qinv1);
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) qs_to_f16(qa[ks], qinv0, qinv1);
        }
    };
    for (bool first = true;; first = false) {
        /* 3. a unit: slot j, its Q in s_q (a rotated f32 q is loaded here:
         * its lo half stays in use while the unit runs) */
        if (PERSIST && !first && p.q_f32) {
            load_q(j, false);
            __syncthreads();
        }
        const pa_work &w = s_w[j];
        /* (HW: this warp's head tile's) */
        const int head_tile = s_ht[j][HW ? warp : 0], hk = s_hk[j][HW ? warp : 0], g0 = g0_of(j, HW ? warp : 0);
        const int nst = stages_of(j), k0 = w.k0;
        /* (QS: P in f16 up to 2^15, so that the max may rise by 15 before
         * a rescale, and a p of 2^-39 of the max is not lost) */
        constexpr float hr = QS ? -15.f : pa_headroom<PA_DTYPE>();
        /* this lane's rows (g, g + 8), kept for the whole unit */
        const int lo0 = s_lo[j][g], hi0 = s_hi[j][g], lo1 = s_lo[j][g + 8], hi1 = s_hi[j][g + 8];
        /* (persistent blocks in bf16 or f16 load the next unit's while the
         * last unit's output is merged, below) */
        if (!PERSIST || first || p.q_f32) load_qa();
        /* (an fp8 cache's key scale goes into q's, its value scale into the output) */
        const float qk_scale = (natural ? p.scale : p.scale * PA_LOG2E) * (FP8 ? pa_k_scale(p, hk) : 1.f);
        const float vscale = FP8 ? pa_v_scale(p, hk) : 1.f;
        const int diag0 = (g / GT) + w.seqlen_k - w.seqlen_q, diag1 = ((g + 8) / GT) + w.seqlen_k - w.seqlen_q;
        const float slope0 = slope_of(j, hk, g0, g), slope1 = slope_of(j, hk, g0, g + 8);

        /* The unit after this one goes into the other slot, while this one
         * runs: one fetch of the unit counter per unit run (blockIdx.x came
         * free), `units` fetches in all; the last resets the counter for the
         * next call. A unit of PREP_STAGES stages or more does it inside its
         * stage loop without waiting on any load (below); a shorter one here,
         * waiting, while its first stages are in flight. */
        const bool prep_async = PERSIST && nst >= PREP_STAGES;
        u32 fetched = 0;
        if (PERSIST && !prep_async) {
            __syncthreads(); /* Q fragments and rows read: s_q and the other slot are free */
            if (tid == 0) s_next = unit_at(fetch_unit());
            __syncthreads();
            load_item(j ^ 1, s_next);
            __syncthreads();
            if (s_next >= units) pa_launch_dependents(); /* this unit is the block's last */
            load_rest(j ^ 1, !p.q_f32, false); /* the loop's first barrier precedes every reader */
        }

        float o[D / 8][4];
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        float m0 = -PA_INF, m1 = -PA_INF, l0 = 0.f, l1 = 0.f; /* rows g, g + 8; l: this lane's part */

        /* claim: the split tile's keys past its splits' static stages, from
         * pool0 on, CRUN stages a claim from its claim counter (thread 0: cq,
         * the claim in flight; rb, the current run's first key, -1: none) */
        u32 *const claim_ctr = (u32 *)p.counters + w.counter + p.head_tiles + head_tile;
        const i64 pool0 = w.k0 + (i64)(w.nsplit - w.split) * CS * T;
        u32 cq = 0;
        i64 rb = -1;
        bool claiming = true;
        /* One stage's claim work: the page ids of stage st + 2 STAGES - 1
         * (its first key came a stage ago), then (thread 0) the first key of
         * stage st + 2 STAGES (a new run: from the claim taken two stages
         * ago), and at every other stage the claim of the run starting at
         * stage st + CS. A stage past the keys ends the claims: the counter
         * only grows, so every later claim fails too. */
        auto claim_step = [&](int st) {
            const int xp = st + 2 * PA_STAGES - 1;
            if (xp >= CS) {
                const int kb = s_ckb[xp % CR]; /* (PPS ids at most: one pass of the block) */
                if (kb >= 0) pa_load_page_ids<PA_PAGE, NTHREADS, true>(p, w.b, kb, min(kb + T, w.k1), ps, s_cpg[xp % CR]);
            }
            if (tid == 0) {
                const int xk = st + 2 * PA_STAGES;
                if (xk >= CS) {
                    const int j = (xk - CS) % CRUN;
                    if (j == 0) rb = claiming ? pool0 + (i64)cq * CRUN * T : -1; /* (cq: two stages old) */
                    const i64 k = rb + (i64)j * T;
                    const int kb = rb >= 0 && k < w.k1 ? (int)k : -1;
                    if (kb < 0) claiming = false;
                    s_ckb[xk % CR] = kb;
                }
                if (claiming && st % CRUN == 0) cq = atomicAdd(claim_ctr, 1u);
            }
        };

        for (int st = 0; st < nst; st++, G++) {
            pa_cp_async_wait<PA_STAGES - 2>();
            __syncthreads(); /* stage G landed; buffer (G - 1) % STAGES and ring entry (G + STAGES) & 1 are free */
            if (CAN_CLAIM && claim) {
                if (st >= CS && s_ckb[st % CR] < 0) break; /* (block-uniform) */
                claim_step(st);
            }
            if (prep_async) {
                /* the next unit without waiting, as late as that allows (a unit
                 * taken early is one another block could have taken): from
                 * stage pst = nst - PREP_STAGES, the counter (its result used a
                 * stage later), the work item by cp.async (in this stage's
                 * group: landed STAGES - 1 stages later), then page ids, Q and
                 * rows, landed by stage pst + 2 STAGES - 1, where the row
                 * offsets reach the next unit (stage nst - STAGES) */
                const int pst = nst - PREP_STAGES;
                if (st == pst && tid == 0) fetched = fetch_unit();
                if (st == pst + 1 && tid == 0) {
                    const int next = unit_at(fetched);
                    set_unit(j ^ 1, next);
                    if (next < units) {
                        const u8 *src = (const u8 *)p.work + (i64)(next / p.head_tiles) * sizeof(pa_work);
#pragma unroll
                        for (int c = 0; c < (int)sizeof(pa_work) / 16; c++)
                            pa_cp_async16((u8 *)&s_w[j ^ 1] + 16 * c, src + 16 * c, true);
                    }
                }
                if (st == pst + 2 && s_unit[j ^ 1] < 0) pa_launch_dependents(); /* the block's last unit */
                if (st == pst + PA_STAGES) load_rest(j ^ 1, !p.q_f32, true);
            }
            /* The copies of stage G + STAGES - 1 into the buffer stage G - 1
             * left (free since the barrier above), and the row offsets of
             * the stage after. (Past the unit's end, PERSIST copies the next
             * unit's rows, and else there is nothing to copy.) */
            auto copies_ahead = [&]() {
                if (PERSIST || st + PA_STAGES - 1 < nst) issue(G + PA_STAGES - 1);
                pa_cp_async_commit();
                if (PERSIST || st + PA_STAGES < nst) row_offsets(G + PA_STAGES);
            };
            if (!LATE) copies_ahead();

            const u8 *sk = s_kv + (G % PA_STAGES) * KV_STAGE + warp * KPW * GSTRIDE;
            const u8 *sv = sk + R * GSTRIDE;
            const int kr = lane & 7, kc = lane >> 3; /* ldmatrix: this lane's row (of 8) and chunk (of 4) */
            /* S = Q K^T for this warp's KPW keys, NT tiles of 8; two accumulators
             * per tile: two dependent MMA chains of half the length */
            float s[NT][4], s2[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) s[n][i] = s2[n][i] = 0.f;
            if constexpr (VPRE) {
                /* (every K fragment first, then the MMAs: the form measured
                 * with V's loads early; elsewhere the loop below, whose code
                 * ptxas makes differently in this form for a warp a head tile) */
                u32 kf[D / 32][NT][4];
#pragma unroll
                for (int kk = 0; kk < D / 32; kk++)
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        if constexpr (FP8) fp8_kfrag(sk, kk, n, kf[kk][n], lane);
                        else ldmatrix_x4(kf[kk][n], sk + (n * 8 + kr) * RSTRIDE + chunk_at(kr, kk * 4 + kc));
                    }
#pragma unroll
                for (int kk = 0; kk < D / 32; kk++)
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        mma16816_t<MT>(s[n], qa[2 * kk], kf[kk][n][0], kf[kk][n][1]);
                        mma16816_t<MT>(s2[n], qa[2 * kk + 1], kf[kk][n][2], kf[kk][n][3]);
                    }
            } else {
#pragma unroll
                for (int kk = 0; kk < D / 32; kk++) {
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        u32 b[4];
                        if constexpr (FP8) fp8_kfrag(sk, kk, n, b, lane);
                        else ldmatrix_x4(b, sk + (n * 8 + kr) * RSTRIDE + chunk_at(kr, kk * 4 + kc));
                        mma16816_t<MT>(s[n], qa[2 * kk], b[0], b[1]);
                        mma16816_t<MT>(s2[n], qa[2 * kk + 1], b[2], b[3]);
                    }
                }
            }
            /* VPRE: V's fragments before the softmax, so that they are there
             * when P is (the loads need no result of it; unused elsewhere) */
            u32 vf[D / 16][4]; /* (fp8: the first D / 32, raw) */
            if constexpr (VPRE) {
                const int vr = kr + 8 * (kc & 1);
#pragma unroll
                for (int dq = 0; dq < (FP8 ? D / 32 : D / 16); dq++) {
                    if constexpr (FP8) ldmatrix_x4_trans(vf[dq], sv + vr * GSTRIDE + fp8_chunk_at(vr, dq * 2 + (kc >> 1)));
                    else ldmatrix_x4_trans(vf[dq], sv + vr * RSTRIDE + chunk_at(vr, dq * 2 + (kc >> 1)));
                }
            }
            if (p.q_f32) { /* the residual of the rounded q (block-uniform) */
#pragma unroll
                for (int kk = 0; kk < D / 32; kk++) {
                    u32 a[2][4];
                    const int mi = lane >> 3, r = 16 + q_row((lane & 7) + 8 * (mi & 1));
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        ldmatrix_x4(a[h], s_q + r * RSTRIDE + chunk_at(r, (2 * kk + h) * 2 + (mi >> 1)));
                        if constexpr (FP8) fp8_permute_q(a[h], lane);
                        if constexpr (QS) qs_to_f16(a[h], qinv0, qinv1);
                    }
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        u32 b[4];
                        if constexpr (FP8) fp8_kfrag(sk, kk, n, b, lane);
                        else ldmatrix_x4(b, sk + (n * 8 + kr) * RSTRIDE + chunk_at(kr, kk * 4 + kc));
                        mma16816_t<MT>(s[n], a[0], b[0], b[1]);
                        mma16816_t<MT>(s2[n], a[1], b[2], b[3]);
                    }
                }
            }
            /* scale, softcap, ALiBi, masks (base 2); s[n][0..1] row g, s[n][2..3] row g + 8 */
            const int kb =
                (CAN_CLAIM && claim && st >= CS ? s_ckb[st % CR] : k0 + st * T) + (HW ? 0 : warp * KPW);
            float mx0 = -PA_INF, mx1 = -PA_INF; /* this stage's maxima */
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int i = 0; i < (LOWER ? 2 : 4); i++) {
                    const int tok = kb + n * 8 + 2 * t4 + (i & 1);
                    const bool upper = i >= 2;
                    /* (QS: (s 2^-c) qk_scale, two products, so that a small
                     * qk_scale and a large c cannot underflow together) */
                    float x = QS ? (s[n][i] + s2[n][i]) * (upper ? qinv1 : qinv0) * qk_scale
                                 : (s[n][i] + s2[n][i]) * qk_scale;
                    if (natural) {
                        if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
                        x *= PA_LOG2E;
                        if (p.alibi) x -= (upper ? slope1 : slope0) * fabsf((float)((upper ? diag1 : diag0) - tok));
                    }
                    const bool ok = upper ? (tok >= lo1 && tok < hi1) : (tok >= lo0 && tok < hi0);
                    x = ok ? x : -PA_INF;
                    s[n][i] = x;
                    if (upper) mx1 = fmaxf(mx1, x);
                    else mx0 = fmaxf(mx0, x);
                }
            }
            /* (QS: the max less 15 rounded up, so that P <= 2^15 stays below
             * f16's 65504 where scores of 2^24 .. 2^29 round it by up to 16) */
            auto headed = [&](float m) { return QS ? __fadd_ru(m, hr) : m + hr; };
            mx0 = fmaxf(m0, headed(pa_quad_max(mx0)));
            if (!LOWER) mx1 = fmaxf(m1, headed(pa_quad_max(mx1)));
            /* new maxima: rescale what is accumulated (rarely, once the max settles) */
            const float alpha0 = mx0 == -PA_INF ? 1.f : pa_exp2(m0 - mx0);
            const float alpha1 = LOWER || mx1 == -PA_INF ? 1.f : pa_exp2(m1 - mx1);
            m0 = mx0;
            m1 = mx1;
            if (__any_sync(0xffffffffu, alpha0 != 1.f || alpha1 != 1.f)) {
                l0 *= alpha0;
                l1 *= alpha1;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[n][0] *= alpha0;
                    o[n][1] *= alpha0;
                    if (!LOWER) {
                        o[n][2] *= alpha1;
                        o[n][3] *= alpha1;
                    }
                }
            }
            /* P (input type) as the A operand of the P V product */
            u32 pa[2 * NT];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float p0 = mx0 == -PA_INF ? 0.f : pa_exp2(s[n][0] - mx0);
                const float p1 = mx0 == -PA_INF ? 0.f : pa_exp2(s[n][1] - mx0);
                const float p2 = LOWER || mx1 == -PA_INF ? 0.f : pa_exp2(s[n][2] - mx1);
                const float p3 = LOWER || mx1 == -PA_INF ? 0.f : pa_exp2(s[n][3] - mx1);
                l0 += p0 + p1;
                l1 += p2 + p3;
                pa[2 * n] = pack2_t<MT>(p0, p1);
                pa[2 * n + 1] = pack2_t<MT>(p2, p3);
            }
            if constexpr (NT == 1) {
                /* O += P V (k = 8 keys): four 8-dim tiles per ldmatrix.trans */
                const u32 a[2] = {pa[0], pa[1]};
#pragma unroll
                for (int dq = 0; dq < D / 32; dq++) {
                    u32 b[4];
                    if constexpr (FP8) {
                        if (dq >= D / 64) break; /* (fp8: a chunk is 16 dims, four chunks an ldmatrix) */
                        ldmatrix_x4_trans(b, sv + kr * GSTRIDE + fp8_chunk_at(kr, dq * 4 + kc));
#pragma unroll
                        for (int i = 0; i < 4; i++) { /* chunk c = 4 dq + i: tiles 2c (even dims), 2c + 1 */
                            u32 e, od;
                            fp8_vfrag(b[i], e, od);
                            mma1688_t<MT>(o[8 * dq + 2 * i], a, e);
                            mma1688_t<MT>(o[8 * dq + 2 * i + 1], a, od);
                        }
                    } else {
                        ldmatrix_x4_trans(b, sv + kr * RSTRIDE + chunk_at(kr, dq * 4 + kc));
#pragma unroll
                        for (int i = 0; i < 4; i++) mma1688_t<MT>(o[4 * dq + i], a, b[i]);
                    }
                }
            } else {
                /* O += P V (k = 16 keys): two 8-dim tiles per ldmatrix.trans
                 * (keys 0-7 / 8-15 x dims 0-7 / 8-15) */
                const int vr = kr + 8 * (kc & 1);
                const u32 a[4] = {pa[0], pa[1], pa[NT > 1 ? 2 : 0], pa[NT > 1 ? 3 : 1]};
#pragma unroll
                for (int dq = 0; dq < D / 16; dq++) {
                    u32 b[4];
                    if constexpr (FP8) {
                        /* chunks 2 dq, 2 dq + 1 (32 dims): b[2h] keys 0-7, b[2h + 1]
                         * keys 8-15 of chunk c = 2 dq + h: tiles 2c (even dims), 2c + 1 */
                        if (dq >= D / 32) break;
                        if constexpr (VPRE) {
#pragma unroll
                            for (int i = 0; i < 4; i++) b[i] = vf[dq][i];
                        } else {
                            ldmatrix_x4_trans(b, sv + vr * GSTRIDE + fp8_chunk_at(vr, dq * 2 + (kc >> 1)));
                        }
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            u32 e0, od0, e1, od1;
                            fp8_vfrag(b[2 * h], e0, od0);
                            fp8_vfrag(b[2 * h + 1], e1, od1);
                            mma16816_t<MT>(o[4 * dq + 2 * h], a, e0, e1);
                            mma16816_t<MT>(o[4 * dq + 2 * h + 1], a, od0, od1);
                        }
                        continue;
                    }
                    if constexpr (VPRE) {
                        b[0] = vf[dq][0];
                        b[1] = vf[dq][1];
                        b[2] = vf[dq][2];
                        b[3] = vf[dq][3];
                    } else {
                        ldmatrix_x4_trans(b, sv + vr * RSTRIDE + chunk_at(vr, dq * 2 + (kc >> 1)));
                    }
                    mma16816_t<MT>(o[2 * dq], a, b[0], b[1]);
                    mma16816_t<MT>(o[2 * dq + 1], a, b[2], b[3]);
                }
            }
            if (LATE) copies_ahead();
        }
        if constexpr (HW) {
            /* 4. (HW) out and lse straight from this warp's fragments: its
             * rows' whole softmax state (an unsplit unit), row g only (ROWS
             * <= 8), the arithmetic of the merge below for one warp */
            l0 = pa_quad_sum(l0);
            const int qi = w.i0 + g / GT, gq = g0 + g % GT;
            if (g < ROWS && qi < w.seqlen_q && gq < p.group) {
                const int h = hk * p.group + gq;
                const bool none = m0 == -PA_INF;
                const i64 dst = ((w.q_start + qi) * p.heads + h) * (i64)D + 2 * t4;
                const bool vec = (p.out & 3) == 0;
                /* one reciprocal a row, not D / 4 divisions a lane: each
                 * IEEE division is a slow-path call site, which cost 1024 x
                 * 64 keys ~7 us of its 92 one block a unit, ~11 persistent
                 * (H200, docs/decode.md); a fully masked row stays
                 * zeros whatever its masked V rows held (0 * inf) */
                const float inv = 1.f / l0; /* (inf where none: unused) */
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    if constexpr (FP8) {
                        /* dims 16c + 4t .. + 3 of chunk c = n / 2 (the header), at the even n */
                        if (n & 1) continue;
                        const float sc = none ? 0.f : inv * vscale;
                        const float x[4] = {o[n][0] * sc, o[n + 1][0] * sc, o[n][1] * sc, o[n + 1][1] * sc};
                        const i64 at = dst - 2 * t4 + 8 * n + 4 * t4;
                        if (!p.out_f32 && (p.out & 7) == 0) {
                            *(uint2 *)((u16 *)p.out + at) = make_uint2(pack2(x[0], x[1]), pack2(x[2], x[3]));
                        } else {
#pragma unroll
                            for (int i = 0; i < 4; i++) pa_store_out<PA_DTYPE>(p, at + i, x[i]);
                        }
                        continue;
                    }
                    float a = none ? 0.f : o[n][0] * inv, b = none ? 0.f : o[n][1] * inv;
                    if (FP8) {
                        a *= vscale;
                        b *= vscale;
                    }
                    if (!p.out_f32 && vec) {
                        *(u32 *)((u16 *)p.out + dst + n * 8) = pack2(a, b);
                    } else {
                        pa_store_out<PA_DTYPE>(p, dst + n * 8, a);
                        pa_store_out<PA_DTYPE>(p, dst + n * 8 + 1, b);
                    }
                }
                if (t4 == 0 && p.lse) pa_store_lse(p, w, h, qi, none ? -PA_INF : m0 + pa_log2(l0));
            }
            /* (PERSIST) the next unit: its Q fragments (landed stages ago,
             * seen since a stage top's barrier; qa is free); a rotated q is
             * loaded at the unit's start, over s_q, which this unit's last
             * stage may still read in another warp */
            if (!PERSIST || s_unit[j ^ 1] < 0) break;
            if (p.q_f32) __syncthreads();
            else load_qa();
            j ^= 1;
            continue;
        }
        /* 4. merge the warps through the buffer of the stage just consumed
         * (PERSIST: free until the next iteration's copies; the next unit's
         * stages are in flight in the others), else through the drained
         * stage buffers: o[warp][16][D], (m, l)[row][warp] */
        if (!PERSIST) pa_cp_async_wait<0>();
        __syncthreads();
        /* the next unit's Q fragments (in s_q since this unit's start, or
         * since a stage of it; qa is free: every warp is past its last
         * Q K^T), loaded under the merge instead of after it */
        if (PERSIST && !p.q_f32 && s_unit[j ^ 1] >= 0) load_qa();
        l0 = pa_quad_sum(l0);
        l1 = pa_quad_sum(l1);
        float *sm_o = (float *)(FP8 ? s_merge8 : PERSIST ? s_kv + ((G - 1) % PA_STAGES) * KV_STAGE : s_kv);
        float *sm_ml = s_ml;
        /* (only the ROWS real rows of the 16: at ROWS 4, a quarter of the stores) */
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            if constexpr (FP8) { /* dims 16c + 4t .. + 3 of chunk c = n / 2 (the header), at the even n */
                if (n & 1) continue;
                const int col = n * 8 + 4 * t4;
                if (g < ROWS)
                    *(float4 *)(sm_o + (warp * 16 + g) * D + col) = make_float4(o[n][0], o[n + 1][0], o[n][1], o[n + 1][1]);
                if (g + 8 < ROWS)
                    *(float4 *)(sm_o + (warp * 16 + g + 8) * D + col) =
                        make_float4(o[n][2], o[n + 1][2], o[n][3], o[n + 1][3]);
                continue;
            }
            const int col = n * 8 + 2 * t4;
            if (g < ROWS) *(float2 *)(sm_o + (warp * 16 + g) * D + col) = make_float2(o[n][0], o[n][1]);
            if (g + 8 < ROWS) *(float2 *)(sm_o + (warp * 16 + g + 8) * D + col) = make_float2(o[n][2], o[n][3]);
        }
        if (t4 == 0) {
            sm_ml[(g * NWARPS + warp) * 2] = m0;
            sm_ml[(g * NWARPS + warp) * 2 + 1] = l0;
            sm_ml[((g + 8) * NWARPS + warp) * 2] = m1;
            sm_ml[((g + 8) * NWARPS + warp) * 2 + 1] = l1;
        }
        __syncthreads();
        /* 5. out and lse, or the split's partial: warp y writes rows y, y + 4,
         * ...; each lane V adjacent elements of a row (one vector store), the
         * row's weights computed once (the merge of pa_merged_o in the same
         * order; a per-element loop with run-time divisions took ~1 us per
         * unit, the copies of the next unit stalled behind it) */
        constexpr int V = D / 32;
        const bool vec_out = (p.out & (2 * V - 1)) == 0;
        for (int r = warp; r < ROWS; r += NWARPS) {
            const int qi = w.i0 + r / GT, gq = g0 + r % GT;
            if (qi >= w.seqlen_q || gq >= p.group) continue;
            const int h = hk * p.group + gq;
            float mx = -PA_INF;
#pragma unroll
            for (int y = 0; y < NWARPS; y++) mx = fmaxf(mx, sm_ml[(r * NWARPS + y) * 2]);
            float acc[V], l = 0.f;
#pragma unroll
            for (int v = 0; v < V; v++) acc[v] = 0.f;
            if (mx != -PA_INF) {
#pragma unroll
                for (int y = 0; y < NWARPS; y++) {
                    const float wt = pa_exp2(sm_ml[(r * NWARPS + y) * 2] - mx);
                    l += sm_ml[(r * NWARPS + y) * 2 + 1] * wt;
                    const float *src = sm_o + (y * 16 + r) * D + lane * V;
                    float x[V];
                    if constexpr (V == 4) *(float4 *)x = *(const float4 *)src;
                    else if constexpr (V == 2) *(float2 *)x = *(const float2 *)src;
                    else
#pragma unroll
                        for (int v = 0; v < V; v++) x[v] = src[v];
#pragma unroll
                    for (int v = 0; v < V; v++) acc[v] += x[v] * wt;
                }
                const float inv = 1.f / l; /* l >= 1: the row's top key weighs 1 */
#pragma unroll
                for (int v = 0; v < V; v++) acc[v] *= inv;
                if (FP8)
#pragma unroll
                    for (int v = 0; v < V; v++) acc[v] *= vscale;
            }
            const float lse2 = mx == -PA_INF ? -PA_INF : mx + pa_log2(l);
            if (w.nsplit == 1) {
                const i64 dst = ((w.q_start + qi) * p.heads + h) * (i64)D + lane * V;
                if (V == 4 && vec_out && !p.out_f32) {
                    *(uint2 *)((u16 *)p.out + dst) = make_uint2(pack2(acc[0], acc[1]), pack2(acc[2 % V], acc[3 % V]));
                } else if (V == 2 && vec_out && !p.out_f32) {
                    *(u32 *)((u16 *)p.out + dst) = pack2(acc[0], acc[1 % V]);
                } else {
#pragma unroll
                    for (int v = 0; v < V; v++) pa_store_out<PA_DTYPE>(p, dst + v, acc[v]);
                }
                if (lane == 0 && p.lse) pa_store_lse(p, w, h, qi, lse2);
            } else {
                const i64 prow = (w.part_row + (i64)w.split * w.seqlen_q + qi) * p.heads + h;
                float *dst = (float *)p.part_o + prow * D + lane * V;
#pragma unroll
                for (int v = 0; v < V; v++) dst[v] = acc[v];
                if (lane == 0) ((float *)p.part_lse)[prow] = lse2;
            }
        }
        /* (claim: thread 0 waits for its last claims, which must precede
         * its arrival; the last arrival resets the claim counter) */
        if (CAN_CLAIM && claim && tid == 0) s_flag = (int)cq;
        if (w.nsplit > 1) pa_split_arrival<PA_DTYPE>(p, w, ROWS, GT, hk, g0, head_tile, &s_flag);
        if (CAN_CLAIM && claim && tid == 0 && s_flag) *claim_ctr = 0u;
        if (!PERSIST || s_unit[j ^ 1] < 0) break;
        /* (no barrier: the next unit's first stage begins with one, and
         * nothing before it writes what the output above reads: the merge
         * area takes copies after that barrier, s_ml and this slot are
         * rewritten stages later) */
        j ^= 1;
    }
    pa_cp_async_wait<0>(); /* (copies of nothing may still be in flight) */
    /* launched after another grid programmatically: this grid ends after
     * that one, so what follows in the stream waits for both */
    pa_wait_prior_grid();
}

#endif /* PA_EMBED_ONLY */
