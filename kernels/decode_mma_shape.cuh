/*
 * decode_mma_shape.cuh -- the shape of a decode_mma block (decode_mma.cu
 * includes it after its variant's defines): the compile-time layout of its
 * warps, stages and shared memory, derived from PA_D, PA_NQ, PA_GT, PA_KPW,
 * PA_NW, PA_PERSIST, PA_HW, PA_PAGE, PA_STAGES and PA_KV, and the rules a
 * variant must keep (static_asserts). The kernel and its helpers stay in
 * decode_mma.cu.
 */
#ifndef PA_EMBED_ONLY
#ifndef PA_DECODE_MMA_SHAPE_CUH
#define PA_DECODE_MMA_SHAPE_CUH

namespace {
constexpr int D = PA_D;
constexpr int NQ = PA_NQ, GT = PA_GT, ROWS = NQ * GT;
constexpr int KPW = PA_KPW;             /* keys per warp and stage: 8 or 16 */
constexpr int NT = KPW / 8;             /* 8-key MMA tiles per warp and stage */
/* PA_HW: each warp its own head tile (NWARPS of them, a block's unit), all
 * warps on the same KPW keys a stage; else the warps share one head tile,
 * KPW keys each */
constexpr bool HW = PA_HW != 0;
constexpr int R = KPW * NWARPS;         /* K (and V) rows a stage: warp w's at w KPW.. */
constexpr int T = HW ? KPW : R;         /* keys per stage */
constexpr bool FP8 = PA_DT_IS_FP8(PA_KV);
constexpr int KVSZ = FP8 ? 1 : 2;       /* bytes of a cache element */
constexpr int ROWB = D * 2;             /* bytes of a K/V row in the input type */
constexpr int CPR = ROWB / 16;          /* its 16-byte chunks */
constexpr int GROWB = D * KVSZ;         /* bytes of a K/V row in the caches (and the copies) */
constexpr int GCPR = GROWB / 16;        /* copied 16-byte chunks per row */
/* Shared memory rows, conflict-free for ldmatrix: at 8 keys per warp padded
 * by 16 bytes; at 16 (twice the stage, so bytes count) unpadded, chunk c of
 * row r at c ^ (r % 8) */
constexpr bool SWZ = KPW == 16;
constexpr int RSTRIDE = SWZ ? ROWB : ROWB + 16;
/* a stage's rows: as above, or fp8 rows unpadded, chunk c of row r at
 * fp8_chunk_at(r, c) (decode_mma.cu): eight rows' chunk c in eight
 * different 16-byte bank groups, as ldmatrix wants */
constexpr int GSTRIDE = FP8 ? GROWB : RSTRIDE;
constexpr int LINE = GCPR % 8 == 0 ? 8 : 4; /* chunks a lane group copies per instruction */
constexpr int GROUPS = NTHREADS / LINE; /* lane groups of the block */
constexpr int RPT = R / GROUPS;         /* rows per thread and stage */
constexpr int KV_STAGE = 2 * R * GSTRIDE;
constexpr bool PERSIST = PA_PERSIST != 0;
constexpr int NSLOT = PERSIST ? 2 : 1; /* units held at once: the running one and the next */
constexpr int PAGES_BYTES = PA_PAGE == -1 ? 0 : NSLOT * PA_MAXP * 4;
constexpr int ROWOFF_BYTES = 2 * R * 8; /* ring of two stages' row offsets */
constexpr int Q_BYTES = 2 * 16 * RSTRIDE; /* Q, and the rounding residual of a rotated (f32) q */
constexpr int MERGE_BYTES = NWARPS * 16 * D * 4; /* the warps' o; their (m, l) in static shared memory */
/* fp8: the warps' merge (an fp8 stage is too small for it) */
constexpr int MERGE8_BYTES = FP8 ? MERGE_BYTES : 0;
constexpr int KV_OFF = PAGES_BYTES + ROWOFF_BYTES + Q_BYTES + MERGE8_BYTES;
constexpr int SMEM = KV_OFF + (PERSIST || HW || FP8 ? PA_STAGES * KV_STAGE : pa_cmax(PA_STAGES * KV_STAGE, MERGE_BYTES));

static_assert(PA_DTYPE == PA_DT_F16 || PA_DTYPE == PA_DT_BF16, "tensor cores: f16 or bf16");
static_assert(D % 32 == 0 && D >= 32 && D <= 128, "head dim");
static_assert(ROWS >= 1 && ROWS <= 16, "rows per block");
static_assert(KPW == 8 || (KPW == 16 && CPR % 8 == 0), "keys per warp: 8, or 16 at head dims 64 and 128");
static_assert(GCPR % LINE == 0 && R % GROUPS == 0, "copy mapping");
static_assert(!FP8 || GCPR == LINE, "fp8 rows: one piece a lane group (the swizzle moves whole pieces)");
static_assert(PA_KV == PA_DTYPE || (FP8 && D % 64 == 0), "caches: the input type, or fp8 at head dims 64 and 128");
static_assert(!HW || NWARPS * ROWS <= 32, "a warp a head tile: every Q in 32 rows");
/* rows of s_q that load_q fills: the tiles' Q (HW: four tiles of ROWS rows;
 * beyond 16 rows they take the place of a rotated q's lo half, which the
 * host then never passes) */
constexpr int QROWS = HW && NWARPS * ROWS > 16 ? 32 : 16;
static_assert(PA_STAGES >= 2, "pipeline depth");
static_assert(NWARPS == 4 || (NWARPS == 8 && PERSIST && !HW), "warps a block: 4, or 8 for persistent blocks");
static_assert(!PERSIST || HW || FP8 || MERGE_BYTES <= KV_STAGE, "persistent blocks merge in a stage buffer");
/* the units that the counter hands out (HW: a block's NWARPS head tiles of a
 * work item) are CU of the units that s_unit names (a work item's head tile) */
constexpr int CU = HW ? NWARPS : 1;
/* a unit this long loads the next one without waiting: its counter at stage
 * pst, its work item by cp.async at pst + 1 (landed STAGES - 1 stages later,
 * where the rest is asked for), its page ids STAGES - 1 more, in time for the
 * row offsets, which reach the next unit at stage nst - STAGES */
constexpr int PREP_STAGES = PA_DECODE_PREP_STAGES(PA_STAGES);
/* LATE: a stage's copies (of the stage STAGES - 1 ahead) go out after its
 * arithmetic, not before it. A block of four warps that runs on alone near
 * the end waits on each stage's chain of shared-memory loads, MMAs and
 * shuffles, which the copies' issue then no longer precedes (1 GB calls
 * 1-2 us faster). Eight warps (two a scheduler) and the short units of a
 * warp a head tile, whose blocks run a few stages each, lose by it
 * (docs/decode.md). */
constexpr bool LATE = !HW && NWARPS == 4;
/* VPRE: the persistent kernel of four warps loads a stage's V fragments
 * right after Q K^T, before the softmax (32 more registers: 206 -> 232);
 * the same lone-block chain, 0.7-1.1 us shorter a call at 256 x 1024 and
 * 128 x 2048 keys, no change elsewhere (docs/decode.md) */
constexpr bool VPRE = PERSIST && !HW && NWARPS == 4 && NT == 2;
static_assert(PA_PAGE <= 0 || (PA_PAGE & (PA_PAGE - 1)) == 0, "page size: a power of two");
static_assert(KV_OFF % 128 == 0 || KV_OFF % 16 == 0, "alignment");
/* Claimed stages (p.claim, one block per unit; docs/decode.md): a split
 * runs CS = 2 STAGES + 2 stages of its own, then claims runs
 * of CRUN = 2 stages from its tile's counter. The run starting at stage X is
 * claimed (an atomic) at stage X - CS; two stages later (where the next
 * claim is taken: one result in flight, read two stages after its atomic)
 * the result gives its stages' first keys (X - 2 STAGES), a stage later
 * each stage's page ids are copied, landing where its row offsets are made
 * (X - STAGES); its rows are copied at X - STAGES + 1 and used at X. CR
 * stages of first keys and page ids are in flight. */
constexpr int CS = PA_DECODE_CLAIM_STATIC(PA_STAGES), CRUN = PA_DECODE_CLAIM_RUN, CR = CS;
static_assert(CS - 2 * PA_STAGES == CRUN, "a claim's result is read where the next claim is taken");
constexpr bool CAN_CLAIM = !PERSIST && !HW && PA_STAGES <= PA_DECODE_CLAIM_MAX_STAGES;
/* Rows 8-15 of the MMA tiles (each lane's second row, g + 8) are padding
 * where a tile has 8 rows or fewer (decode's 4 query heads a kv head; HW:
 * each warp's tile): the softmax leaves them out, half of its work per
 * stage (their P 0, their o and l 0 and m -inf, never read). The blocks
 * that end last run on alone, at the pace of their stages' arithmetic:
 * 256 x 1024 keys 254.3 -> 252.0 us, 128 x 2048 251.0 -> 248.6 (page 16,
 * H200; docs/decode.md) */
constexpr bool LOWER = ROWS <= 8;
/* page ids a stage of T keys spans (from any key) */
constexpr int PPS = PA_PAGE == -1 ? 1 : PA_PAGE > 0 ? (T - 1) / PA_PAGE + 2 : T + 1;
} // namespace

#endif /* PA_DECODE_MMA_SHAPE_CUH */
#endif /* PA_EMBED_ONLY */
