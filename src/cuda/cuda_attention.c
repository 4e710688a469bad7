/*
 * cuda_attention.c -- attention on a CUDA device: plans the kernels for one
 * normalised problem (pa_attn_problem) and queues them on the device stream:
 *
 *   1. one upload of the per-sequence facts and the work list (pinned staging);
 *   2. rotary append (append.cu) when there are new k/v or q must be rotated;
 *   3. attention, in up to two launches: sequences with <= 8 queries on a
 *      decode kernel, decode_mma.cu (tensor cores; f16/bf16, head dim a
 *      multiple of 32 up to 128) or else decode.cu (CUDA cores; head dim a
 *      multiple of 8); longer ones on prefill_wgmma.cu (Hopper; f16/bf16,
 *      head dim 64, 128 or 256) or prefill.cu (mma.sync; f16/bf16, head dim
 *      a multiple of 16 up to 256), else fallback.cu. A mixed
 *      attention_varlen batch thus runs each part on its kernel. Each kernel
 *      splits the keys where its tiles alone would not fill the GPU and
 *      combines the splits in the same launch.
 *
 * Work items are planned on the host from the core's host arrays; each item
 * is a (sequence, query tile, key range), launched times the head tiles.
 * Everything that may wait for the device (module loads and function
 * look-ups, growing scratch) happens before the first operation of the call
 * is queued.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>

_Static_assert(sizeof(pa_seq_meta) == 32, "pa_seq_meta layout");
_Static_assert(sizeof(pa_work) == 64, "pa_work layout");
_Static_assert(sizeof(pa_attn_params) == 232, "pa_attn_params layout");
_Static_assert(sizeof(pa_append_params) == 200, "pa_append_params layout");

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define MAX_SPLITS 1024

static const char *dtype_str(pa_dtype d) { return d == PA_F32 ? "f32" : d == PA_F16 ? "f16" : "bf16"; }

static int env_int(const char *name, int dflt, int lo, int hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    int x = atoi(v);
    return x < lo ? lo : x > hi ? hi : x;
}

/* The attention kernel chosen for a problem, with its launch shape. */
typedef struct kernel_plan {
    CUfunction fn;
    int threads, smem;
    int tokens;      /* keys per pipeline step: split lengths are multiples */
    int max_chunk;   /* keys one block may take (its page ids must fit); 0: any */
    int gt, q_tile, head_tiles;
    int capacity;    /* blocks resident at once on the whole GPU */
    int grid_cap;    /* persistent: blocks launched at most (capacity; PAGEDATTN_DECODE_BLOCKS: fewer, specs) */
    bool longest_first; /* order the work items by length, longest first */
    bool no_split;      /* one work item per query tile (the kernel writes out/lse directly) */
    bool tail_splits;   /* more than a wave of tiles: split when that fills the last wave better */
    bool ws;            /* prefill_ws: it never splits, so fewer tiles than slots go to prefill_wgmma */
    bool forced;        /* PAGEDATTN_PREFILL_KERNEL chose the prefill kernel */
    bool persistent;    /* decode_mma persist=1: at most a resident wave of blocks takes the units from a counter */
    bool short_kernel;  /* decode_mma for short units, one block per unit (plan_kernel's short_units) */
    bool hw;            /* decode_mma hw=1: a warp a head tile, a block four of them (plan_part) */
    bool guided;        /* decode: key ranges cut into pieces that shrink towards the end of the list */
    bool first_pages;   /* decode_mma of a paged cache: the work items' first page ids listed (PA_DECODE_FIRST_PAGES) */
    bool claim;         /* decode_mma, one block per unit: splits may claim their tile's keys (plan_work) */
    bool claim_required; /* PAGEDATTN_DECODE_CLAIM=2 (specs): a split decode call that does not claim fails */
    int claim_stages;    /* a claiming split's static stages (PA_DECODE_CLAIM_STATIC) */
    int tma_rows;       /* > 0: K/V tiles by TMA, boxes of this many cache rows */
    bool page_boxes;    /* TMA boxes of all columns (tma=2: a 5-D K/V map), else of 64 */
} kernel_plan;

/* Which kernel a sequence runs on. */
typedef enum { K_DECODE, K_PREFILL, K_FALLBACK } kernel_kind;

/* What the problem allows, decided once per call (the environment is read
 * here, not per sequence). */
typedef struct kind_rules {
    bool decode, prefill;
} kind_rules;

static kind_rules rules_of(const pa_attn_problem *p) {
    const bool fallback = pa_env_flag("PAGEDATTN_CUDA_FALLBACK");
    kind_rules k = {p->head_dim % 8 == 0 && !fallback,
                    p->dtype != PA_F32 && p->head_dim % 16 == 0 && p->head_dim <= 256 && !fallback};
    return k;
}
static kernel_kind kind_of(kind_rules k, int32_t seqlen_q) {
    if (seqlen_q <= 8 && k.decode) return K_DECODE;
    return k.prefill ? K_PREFILL : K_FALLBACK;
}

static void page_key(const pa_attn_problem *p, char *page, size_t n) {
    if (!p->paged) snprintf(page, n, "contig");
    else if ((p->page_size & (p->page_size - 1)) == 0 && p->page_size <= (1 << 20))
        snprintf(page, n, "%d", p->page_size);
    else snprintf(page, n, "any");
}

/* Whether warp-a-tile decode blocks (hw) of kpw keys a warp, `stages`
 * stages and minb blocks a SM run persistent by default: a block takes its
 * next unit of four head tiles from a counter and loads it while the
 * current one streams, where one block a unit pays each unit's start (work
 * item, page ids, the first stages' round trip) with its memory idle. It
 * pays (kernels/NOTES.md, session 35; page 16, same process, one block a
 * unit / persistent) at 16 keys a warp, on units averaging avg_keys of at
 * least PA_DECODE_PREP_STAGES (8 at 3 stages), which load the next unit
 * without waiting (512 x 96 keys 64.6 / 68.2 us, 512 x 112 72.2 /
 * 75.9; 512 x 128 80.0 / 75.1, 512 x 192 109.4 / 106.2, 1024 x 256 265.0 /
 * 261.5, 2048 x 128 277.1 / 270.6), in `blocks` of at least two a block at
 * minb a SM (128 x 128 23.6 / 25.2, 200 x 128 37.0 / 38.9, 256 x 256 73.0 /
 * 73.3; 384 x 128 61.7 / 58.6), and not on the short sequences of a split
 * call (split 2), whose blocks start as the long ones end (32 x 4096 + 1024
 * x 128 258.1 / 262.3, 16 x 4096 + 512 x 128 137.9 / 140.0). 8 keys a warp
 * lost everywhere (1024 x 64 91.5 / 93.3, 2048 x 64 167.3 / 170.2, 1024 x
 * 32 58.6 / 70.3). */
static bool hw_persist_pays(int kpw, int stages, int minb, int split, int64_t avg_keys, int64_t blocks,
                            int sm_count) {
    return kpw == 16 && split != 2 && avg_keys >= (int64_t)PA_DECODE_PREP_STAGES(stages) * kpw &&
           blocks >= 2 * (int64_t)minb * sm_count;
}

/* The kernel of one kind for a problem whose sequences of that kind have at
 * most max_q queries, with its launch shape. allow_ws: the warp-specialised
 * prefill or the persistent decode blocks may be chosen (the caller asks for
 * them only when the query tiles fill the GPU). short_units (decode, one
 * block per unit): the units are short, so the blocks a SM count more than
 * the stages a block (plan_part); hw_keys > 0: and each warp takes a head
 * tile of its own, the units averaging that many keys (plan_part, hw_fits).
 * nseq, seq_keys: the part's sequences and their average keys, which with
 * split (plan_part: 0 a call's only decode part, 1 the long sequences of a
 * split call, 2 its short ones) decide the persistent blocks' eight warps
 * and the warp-a-tile blocks' persistence (below). */
static pa_status plan_kernel(pa_context *ctx, cuda_impl *impl, const pa_attn_problem *p, kernel_kind kind,
                             int32_t max_q, bool allow_ws, bool short_units, int64_t hw_keys, int64_t nseq,
                             int64_t seq_keys, int split, kernel_plan *kp) {
    const int D = p->head_dim, G = p->group;
    char variant[192], page[16];
    pa_kmodule *m;
    pa_status st;
    page_key(p, page, sizeof page);
    kp->hw = false;
    if (kind == K_DECODE) {
        /* PAGEDATTN_DECODE_KERNEL=simt|mma forces a decode kernel (tests, benchmarks) */
        const char *force = getenv("PAGEDATTN_DECODE_KERNEL");
        const bool mma = p->dtype != PA_F32 && D % 32 == 0 && D <= 128 && !(force && strcmp(force, "simt") == 0);
        int nq = 1;
        while (nq < max_q) nq *= 2;
        const int max_rows = mma ? 16 : 8;
        int gt = 1;
        for (int d = 1; d <= G && d * nq <= max_rows; d++)
            if (G % d == 0) gt = d;
        /* tensor cores: 16 keys per warp and stage at head dims 64 and 128
         * (3 stages of 32 KB: two blocks per SM), else 8 (4 stages: measured
         * best on the H200, kernels/NOTES.md); PAGEDATTN_DECODE_KPW=8|16 */
        int kpw = D % 64 == 0 ? (env_int("PAGEDATTN_DECODE_KPW", 16, 8, 16) >= 16 ? 16 : 8) : 8;
        int stages = env_int("PAGEDATTN_DECODE_STAGES", kpw == 16 ? 3 : 4, 2, 8);
        int minb = 1;
        kp->short_kernel = mma && short_units;
        if (mma && short_units) {
            /* short units: each block runs one unit's whole chain (work
             * item, page ids, rows, output), so more resident blocks overlap
             * more chains: 8 keys a warp and 3 stages of 17 KB, three blocks
             * a SM where 16 keys a warp fit two (page 16, 268 MB: 1024 x 64
             * keys 171 -> 129 us, 512 x 128 105 -> 100; kernels/NOTES.md,
             * session 19). A warp a head tile (hw) over units of 96 keys
             * or more: 16 keys a warp, two blocks a SM (page 16, same
             * process: 512 x 128 keys 86.7 -> 81.7 us, 32 x 4096 + 1024 x
             * 128 271.5 -> 263.2; 1024 x 64 94.5 -> 93.7; session 20).
             * PAGEDATTN_DECODE_SHORT_KPW, _STAGES, _MINB (the blocks a SM
             * the registers must allow; default 3 at 8 keys a warp, 2 at
             * 16) */
            const int kpw_dflt = hw_keys >= 96 ? 16 : 8;
            kpw = D % 64 == 0 && env_int("PAGEDATTN_DECODE_SHORT_KPW", kpw_dflt, 8, 16) >= 16 ? 16 : 8;
            stages = env_int("PAGEDATTN_DECODE_SHORT_STAGES", 3, 2, 8);
            minb = env_int("PAGEDATTN_DECODE_SHORT_MINB", kpw == 16 ? 2 : 3, 1, 4);
        }
        /* persistent blocks at 16 keys per warp (PAGEDATTN_DECODE_PERSIST=0:
         * one block per unit): two slots of page ids, 768 each, to keep two
         * blocks per SM. PAGEDATTN_DECODE_GUIDED=1: the guided pieces
         * (plan_work; measured slower, kernels/NOTES.md, session 7) */
        const bool persist_env = env_int("PAGEDATTN_DECODE_PERSIST", 1, 0, 1) == 1;
        const bool persist_long = mma && kpw == 16 && allow_ws && persist_env;
        /* a warp a head tile (hw, below) in persistent blocks too, where
         * that pays (hw_persist_pays). PAGEDATTN_DECODE_HW_PERSIST=0: never;
         * 2 (specs): wherever hw runs. The same blocks a SM, the same plan
         * (the rules below take persist_long). */
        const bool hw = mma && short_units && hw_keys > 0;
        const int hw_persist = env_int("PAGEDATTN_DECODE_HW_PERSIST", 1, 0, 2);
        const int head_tiles = p->kv_heads * (G / gt);
        const bool hw_pays = hw_persist_pays(kpw, stages, minb, split, hw_keys, nseq * head_tiles / 4, impl->sm_count);
        const bool persist = persist_long || (hw && persist_env && (hw_persist == 2 || (hw_persist == 1 && hw_pays)));
        kp->persistent = persist;
        kp->guided = env_int("PAGEDATTN_DECODE_GUIDED", 0, 0, 1) == 1;
        kp->tail_splits = !kp->guided;
        kp->first_pages = mma && p->paged && env_int("PAGEDATTN_DECODE_FIRST_PAGES", 1, 0, 1) == 1;
        kp->longest_first = kp->guided;
        /* one block per unit, paged caches: the splits of a query tile claim
         * its keys past their first 2 x stages + 2 stages, two stages at a
         * time, so that a block on a faster SM takes more of them
         * (kernels/NOTES.md, session 17); a claim is taken that many stages
         * before its stages run. (Contiguous caches keep their fixed ranges:
         * claiming, 8 x 32768 and 16 x 16384 unpaged measured 1-4 us slower.)
         * PAGEDATTN_DECODE_CLAIM=0: fixed ranges; 2 (specs): a call whose
         * splits cannot claim fails, so that a spec knows it tested them. */
        const int claim_env = env_int("PAGEDATTN_DECODE_CLAIM", 1, 0, 2);
        kp->claim = mma && !persist_long && !kp->guided && p->paged && stages <= PA_DECODE_CLAIM_MAX_STAGES &&
                    claim_env >= 1;
        kp->claim_stages = PA_DECODE_CLAIM_STATIC(stages);
        kp->claim_required = claim_env == 2;
        kp->hw = hw;
        /* persistent blocks of eight warps, one a SM, 128 keys a stage (the
         * same bytes in flight a SM as two blocks of four): a block runs a
         * unit in half the time, so where each has few units their last ones
         * end closer together. Where the nseq sequences (a query tile each)
         * average seq_keys >= PAGEDATTN_DECODE_WIDE_MIN_KEYS (default 1024:
         * eight stages, the least that loads the next unit without waiting),
         * in at most PAGEDATTN_DECODE_WIDE_MAX_UNITS units a SM (default 6).
         * Page 16, same process, four warps / eight (kernels/NOTES.md,
         * session 22): 64 x 4096 keys 246.5 / 245.4 us, 48 x 4096 194.7 /
         * 188.3, 20 x 8192 190.5 / 167.0, 64 x 8192 484.7 / 479.1, 96 x 4096
         * 363.6 / 363.0; many units a block lose (256 x 1024, 15.5 a block:
         * 250.1 / 251.1). Never for the long sequences of a split call whose
         * units fill under two blocks of four a SM (those run one block a
         * unit): the short sequences' kernel starts in the room their ends
         * leave, and one block of eight a SM holds most of its shared memory
         * (32 x 4096 + 1024 x 128 keys 264.0 / 268.7; 64 x 4096 + 512 x 64,
         * more units, 294.4 / 290.2). Four where their shared memory does
         * not fit (A100) or PAGEDATTN_DECODE_WIDE=0; 2 (specs): eight at any
         * length and count (the split case aside), and a call that cannot
         * have them fails. */
        const int64_t units = nseq * head_tiles;
        int nw = 4, wide = 0;
        if (persist_long && !(split == 1 && units <= 2 * (int64_t)impl->sm_count)) {
            wide = env_int("PAGEDATTN_DECODE_WIDE", 1, 0, 2);
            const int64_t max_units =
                (int64_t)env_int("PAGEDATTN_DECODE_WIDE_MAX_UNITS", 6, 0, 1 << 20) * impl->sm_count;
            if (wide == 2 || (wide == 1 && seq_keys >= env_int("PAGEDATTN_DECODE_WIDE_MIN_KEYS", 1024, 0, INT32_MAX) &&
                              units <= max_units))
                nw = 8;
        }
        for (;;) {
            if (mma)
                snprintf(variant, sizeof variant,
                         "decode_mma dtype=%s D=%d nq=%d gt=%d page=%s stages=%d maxp=%d kpw=%d persist=%d minb=%d "
                         "hw=%d nw=%d",
                         dtype_str(p->dtype), D, nq, gt, page, stages, persist ? 768 : 1024, kpw, persist ? 1 : 0,
                         minb, kp->hw ? 1 : 0, nw);
            else
                snprintf(variant, sizeof variant, "decode dtype=%s D=%d nq=%d gt=%d page=%s stages=%d maxp=%d",
                         dtype_str(p->dtype), D, nq, gt, page, stages, 1024);
            st = pa_cuda_module(ctx, impl, variant, &m);
            if (st) return st;
            if (nw == 8 && m->info[1] > impl->smem_optin) {
                if (wide == 2)
                    return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: PAGEDATTN_DECODE_WIDE=2 (specs), but kernel %s "
                                   "needs %d bytes of shared memory, the device allows %d", variant, m->info[1],
                                   impl->smem_optin);
                nw = 4;
                continue;
            }
            break;
        }
        kp->threads = m->info[0];
        kp->smem = m->info[1];
        kp->tokens = m->info[2];
        const int maxp = m->info[3];
        kp->max_chunk = 0;
        if (p->paged) {
            /* a range of c keys spans at most (c - 1) / page + 2 pages */
            int64_t c = (int64_t)(maxp - 1) * p->page_size;
            if (c > INT32_MAX) c = INT32_MAX;
            kp->max_chunk = (int)(c / kp->tokens * kp->tokens);
        }
        kp->gt = gt;
        kp->q_tile = nq;
        kp->head_tiles = head_tiles;
        st = pa_cuda_function(ctx, impl, m, mma ? "pa_decode_mma" : "pa_decode", kp->smem, &kp->fn);
    } else if (kind == K_PREFILL) {
        /* the heads of a GQA group share a tile (up to 16 of them) */
        int gt = 1;
        for (int d = 1; d <= G && d <= 16; d++)
            if (G % d == 0) gt = d;
        const int natural = p->softcap > 0.f || p->alibi != NULL || !(p->scale > 0.f);
        /* Hopper (head dims 64, 128, 256): the warp-specialised kernel where
         * its producer loads K/V by TMA and the query tiles fill the GPU (it
         * does not split: allow_ws), else wgmma, which splits and gathers
         * with all its threads (kernels/NOTES.md, session 5: ws + TMA 1.2-1.5x
         * wgmma's rate, ws with the cp.async gather below it);
         * PAGEDATTN_PREFILL_KERNEL=ws|wgmma|mma forces one. TMA: one box per
         * page (or per tile) and 64 columns, where pages hold 16 tokens or
         * more (a power of two) or the cache is contiguous;
         * PAGEDATTN_PREFILL_TMA=0 keeps ws's cp.async gather. Paged caches:
         * one box per page with all of its columns (tma=2, kernels/NOTES.md
         * session 12), PAGEDATTN_PREFILL_PAGE_BOXES=0 a box per 64 columns. */
        const char *force = getenv("PAGEDATTN_PREFILL_KERNEL");
        if (force && !*force) force = NULL;
        const bool hopper = strcmp(impl->arch, "sm_90a") == 0 && (D == 64 || D == 128 || D == 256);
        const bool pow2 = (p->page_size & (p->page_size - 1)) == 0;
        const bool tma = hopper && pa_cu.cuTensorMapEncodeTiled != NULL && env_int("PAGEDATTN_PREFILL_TMA", 1, 0, 1) &&
                         (!p->paged || (p->page_size >= 16 && pow2 && p->page_size <= (1 << 20))) &&
                         (int64_t)p->num_pages * p->page_size < ((int64_t)1 << 31); /* TMA coordinates: int32 */
        const bool ws = hopper && (force ? strcmp(force, "ws") == 0 : allow_ws && tma);
        const bool wgmma = hopper && !ws && !(force && strcmp(force, "mma") == 0);
        kp->page_boxes = false; /* (a second plan of the same part may leave ws) */
        if (ws) {
            /* shared memory holds 4 stages at head dim 64, 3 at 128, 2 at 256 */
            const int stages = env_int("PAGEDATTN_PREFILL_STAGES", D <= 128 ? 3 : 2, 2, D <= 64 ? 4 : D <= 128 ? 3 : 2);
            const int tma_kind = !tma ? 0 : p->paged && env_int("PAGEDATTN_PREFILL_PAGE_BOXES", 1, 0, 1) ? 2 : 1;
            snprintf(variant, sizeof variant, "prefill_ws dtype=%s D=%d gt=%d page=%s stages=%d natural=%d tma=%d",
                     dtype_str(p->dtype), D, gt, page, stages, natural, tma_kind);
            kp->page_boxes = tma_kind == 2;
        } else if (wgmma) {
            /* 3: S reads tile t, P V tile t - 1, tile t + 1 loads */
            const int stages = env_int("PAGEDATTN_PREFILL_STAGES", 3, 3, 4);
            snprintf(variant, sizeof variant, "prefill_wgmma dtype=%s D=%d gt=%d page=%s stages=%d natural=%d",
                     dtype_str(p->dtype), D, gt, page, stages, natural);
        } else {
            const int stages = env_int("PAGEDATTN_PREFILL_STAGES", 2, 2, 4);
            const int minb = env_int("PAGEDATTN_PREFILL_MINB", D <= 128 ? 2 : 1, 1, 4);
            snprintf(variant, sizeof variant, "prefill dtype=%s D=%d gt=%d page=%s stages=%d natural=%d minb=%d",
                     dtype_str(p->dtype), D, gt, page, stages, natural, minb);
        }
        st = pa_cuda_module(ctx, impl, variant, &m);
        if (st) return st;
        kp->threads = m->info[0];
        kp->smem = m->info[1];
        kp->tokens = m->info[2];
        kp->q_tile = m->info[3];
        kp->max_chunk = 0;
        kp->gt = gt;
        kp->head_tiles = p->kv_heads * (G / gt);
        kp->longest_first = true;
        kp->no_split = ws;
        kp->ws = ws;
        kp->forced = force != NULL;
        /* TMA boxes: one per page, or one per tile (the kernel's BN keys) of
         * larger pages and contiguous caches */
        if (ws && tma) kp->tma_rows = !p->paged || p->page_size >= kp->tokens ? kp->tokens : p->page_size;
        st = pa_cuda_function(ctx, impl, m, ws ? "pa_prefill_ws" : wgmma ? "pa_prefill_wgmma" : "pa_prefill",
                              kp->smem, &kp->fn);
    } else {
        snprintf(variant, sizeof variant, "fallback dtype=%s", dtype_str(p->dtype));
        st = pa_cuda_module(ctx, impl, variant, &m);
        if (st) return st;
        const int rows = m->info[1], kt = m->info[2];
        kp->threads = m->info[0];
        kp->tokens = kt;
        kp->max_chunk = 0;
        kp->smem = 4 * (rows * D + kt * (D + 1) + kt * D + rows * kt + rows * D);
        kp->gt = G < rows ? G : rows;
        kp->q_tile = rows / kp->gt;
        kp->head_tiles = p->kv_heads * ((G + kp->gt - 1) / kp->gt);
        st = pa_cuda_function(ctx, impl, m, "pa_attend", kp->smem, &kp->fn);
    }
    if (st) return st;
    if (kp->smem > impl->smem_optin)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: kernel %s needs %d bytes of shared memory, "
                       "the device allows %d", variant, kp->smem, impl->smem_optin);
    int per_sm = 0;
    CU_TRY(ctx, pa_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kp->fn, kp->threads,
                                                                 (size_t)kp->smem));
    if (per_sm < 1)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: kernel %s cannot run on this device "
                       "(%d threads, %d bytes of shared memory)", variant, kp->threads, kp->smem);
    kp->capacity = per_sm * impl->sm_count;
    kp->grid_cap = kp->persistent ? env_int("PAGEDATTN_DECODE_BLOCKS", kp->capacity, 1, kp->capacity) : 0;
    return PA_OK;
}

/* The next piece of a key range with `rem` keys left, when `left` keys (x
 * head tiles) of the whole list are not cut yet: about left / div, a
 * multiple of `align`, at least `cmin`, at most `cap` (0: no bound), and
 * the whole rest when what would remain is under half a piece. */
static int64_t guided_piece(int64_t rem, int64_t left, int64_t div, int64_t cmin, int64_t align, int64_t cap) {
    int64_t c = ALIGN_UP(left / div, align);
    if (c < cmin) c = cmin;
    if (cap > 0 && c > cap) c = cap;
    if (rem - c < c / 2 && (cap == 0 || rem <= cap)) c = rem;
    return c < rem ? c : rem;
}

/* A query tile's keys: the union of its queries' ranges (ranges only move
 * right as the query index grows). */
typedef struct tile_range {
    int32_t b, i0, lo, hi;
} tile_range;

/* The pieces of c keys (c >= 1) that a range of len keys takes: at least
 * one. The plan asks this of every query tile several times, so without a
 * division where the range fits in one piece and in 32 bits otherwise (a
 * 64-bit division takes 40-90 cycles on some x86 hosts: at 1024 short
 * sequences the passes over the tiles took ~90 of a call's ~150 us of host
 * time on the H200 machine, mostly dividing; kernels/NOTES.md session 21). */
static inline int64_t pieces(int64_t len, int64_t c) {
    if (len <= c) return 1;
    if (((uint64_t)len | (uint64_t)c) <= UINT32_MAX) return (int64_t)(((uint32_t)len - 1u) / (uint32_t)c) + 1;
    return (len - 1) / c + 1;
}

/* The split length that every query tile of a plan starts from: forced
 * (PAGEDATTN_SPLIT_CHUNK) or the plan's auto_chunk, a multiple of the
 * kernel's stage; 0 where it depends on the tile (no_split, num_splits). */
static int64_t base_chunk(const pa_attn_problem *p, const kernel_plan *kp, int64_t forced_chunk, int64_t auto_chunk) {
    if (kp->no_split || (forced_chunk <= 0 && p->num_splits > 0)) return 0;
    const int64_t c = ALIGN_UP(forced_chunk > 0 ? forced_chunk : auto_chunk, kp->tokens);
    return c < 1 ? 1 : c;
}

/* A query tile's split length (the guided pieces aside), for a tile of len
 * keys: forced (PAGEDATTN_SPLIT_CHUNK), from the problem's num_splits, or
 * the plan's (base: base_chunk); a multiple of the kernel's stage, under
 * the page-id cap. */
static int64_t tile_chunk(const pa_attn_problem *p, const kernel_plan *kp, int64_t len, int64_t base) {
    if (base > 0 && (kp->max_chunk == 0 || base <= kp->max_chunk)) return base;
    int64_t chunk;
    if (base > 0) {
        chunk = base;
    } else if (kp->no_split) {
        chunk = ALIGN_UP(len > 0 ? len : 1, kp->tokens);
    } else {
        const int64_t want = p->num_splits < MAX_SPLITS ? p->num_splits : MAX_SPLITS;
        chunk = ALIGN_UP((len + want - 1) / want, kp->tokens);
    }
    if (kp->max_chunk > 0 && chunk > kp->max_chunk) {
        /* as many pieces as the page-id cap needs, of equal length (a
         * capped piece and a short rest left the blocks unequal work:
         * 64 x 16384 at page 16 read 0.88 of the read rate, not 0.95) */
        const int64_t k = len > 0 ? (len + kp->max_chunk - 1) / kp->max_chunk : 1;
        chunk = ALIGN_UP((len + k - 1) / k, kp->tokens);
        if (chunk > kp->max_chunk) chunk = kp->max_chunk;
    }
    return chunk < 1 ? 1 : chunk;
}

/* How a part's query tiles are cut into work items (plan_rule), so that the
 * list is written (plan_items) without deciding it again. */
typedef struct work_rule {
    int64_t base;       /* base_chunk */
    bool guided;        /* guided pieces (gmin, gdiv; total_len x head tiles to cut) */
    int64_t gmin, gdiv, guide_total;
    bool claims;        /* the splits claim their keys (claim_keys static keys each) */
    int64_t claim_keys;
} work_rule;

/* The rule of the work list: every query tile's key range cut into splits.
 * Claims (r->claims): where kp->claim and every split tile has
 * kp->claim_stages stages for each split; split s of a tile [lo, hi) is
 * then the item [lo + s * claim_stages stages, hi), whose block runs its
 * static stages and then claims stages from lo + nsplit * claim_stages
 * stages on, with a claim counter after the tile's arrival counters. */
static void plan_rule(const pa_attn_problem *p, const kernel_plan *kp, const tile_range *tiles, int64_t ntiles,
                      work_rule *r) {
    /* Splits: when the tiles alone give fewer blocks than the GPU holds at
     * once, into about one wave of equal blocks; beyond a wave (decode only),
     * when splitting fills the last wave better (below). Each block pays a
     * start-up (its work item, page ids, Q, the first stages' latency) and a
     * merge, which measurements put at several microseconds: fewer, longer
     * blocks win whenever there are enough of them. */
    int64_t total_len = 0, max_len = 0;
    for (int64_t t = 0; t < ntiles; t++) {
        const int64_t len = tiles[t].hi - tiles[t].lo;
        total_len += len;
        if (len > max_len) max_len = len;
    }
    const int forced_chunk = env_int("PAGEDATTN_SPLIT_CHUNK", 0, 0, INT32_MAX);
    const double waves = env_int("PAGEDATTN_SPLIT_WAVES", 1, 1, 64);
    int64_t auto_chunk = max_len > 0 ? max_len : 1;
    /* Guided (decode): blocks take the units in list order (persistent
     * blocks from a counter, or else the GPU's block scheduler as slots
     * free), so the list is cut into pieces of about 1 / (GUIDE x capacity)
     * of the keys (x head tiles) not yet cut, at least
     * PAGEDATTN_DECODE_MIN_CHUNK keys: long pieces while much work remains,
     * short ones at the end, so that the blocks end within a short piece of
     * each other (the SMs do not stream at equal rates). */
    const bool guided = kp->guided && p->num_splits == 0 && forced_chunk == 0 && total_len > 0;
    /* (persistent blocks: 512 keys, 8 stages, the least that loads the next unit without waiting) */
    const int64_t gmin =
        ALIGN_UP(env_int("PAGEDATTN_DECODE_MIN_CHUNK", kp->persistent ? 512 : 256, 1, INT32_MAX), kp->tokens);
    const int64_t gdiv = (int64_t)env_int("PAGEDATTN_DECODE_GUIDE", 2, 1, 64) * kp->capacity;
    if (!guided && p->num_splits == 0 && forced_chunk == 0 && total_len > 0 &&
        ntiles * kp->head_tiles < kp->capacity) { /* (guided: the pieces below) */
        /* the shortest chunk whose blocks still fit the wave(s) */
        const double budget = waves * kp->capacity;
        for (int k = 2; k <= MAX_SPLITS; k++) {
            int64_t c = ALIGN_UP((max_len + k - 1) / k, kp->tokens);
            int64_t blocks = 0;
            for (int64_t t = 0; t < ntiles; t++) blocks += pieces(tiles[t].hi - tiles[t].lo, c) * kp->head_tiles;
            if ((double)blocks > budget) break;
            auto_chunk = c;
            if (c <= kp->tokens) break;
        }
    } else if (p->num_splits == 0 && forced_chunk == 0 && total_len > 0 && kp->tail_splits) {
        /* More than a wave: the last wave may run nearly empty (512 blocks
         * on 396 slots take two full block times). Model the time of k splits
         * as waves x (chunk + start-up), the start-up counted as TAIL_STARTUP
         * keys, and take the best k (1 unless splitting fills waves better). */
        enum { TAIL_STARTUP = 128, TAIL_MAX_SPLITS = 8 };
        double best = -1.0;
        int64_t prev_c = 0;
        for (int k = 1; k <= TAIL_MAX_SPLITS; k++) {
            const int64_t c = ALIGN_UP((max_len + k - 1) / k, kp->tokens);
            if (k > 1 && c >= prev_c) break; /* no shorter than k - 1 splits */
            prev_c = c;
            /* k splits cost at least (blocks >= the keys / c) keys x head
             * tiles / (c x capacity) waves of c + start-up, a bound that
             * grows with k: once it reaches the best, no k does better, and
             * many short tiles (whose splits only add waves) skip the passes */
            const double keys_ht = (double)total_len * (double)kp->head_tiles;
            if (best >= 0.0 && keys_ht * (double)(c + TAIL_STARTUP) / ((double)c * kp->capacity) >= best + 0.5) break;
            int64_t blocks = 0;
            for (int64_t t = 0; t < ntiles; t++) blocks += pieces(tiles[t].hi - tiles[t].lo, c) * kp->head_tiles;
            const int64_t nwaves = (blocks + kp->capacity - 1) / kp->capacity;
            const double cost = (double)nwaves * (double)(c + TAIL_STARTUP);
            if (best < 0.0 || cost < best) {
                best = cost;
                auto_chunk = c;
            }
            if (c <= kp->tokens) break;
        }
    }
    /* (claims where every split of a split tile has at least
     * PAGEDATTN_DECODE_CLAIM_MIN keys, default 4096: 8 x 8192, 2048 keys a
     * split, measured 71.6 us fixed and 73.6 claiming; 8192 keys a split
     * gain; kernels/NOTES.md session 17) */
    const int64_t claim_min = env_int("PAGEDATTN_DECODE_CLAIM_MIN", 4096, 0, INT32_MAX);
    /* (the static stages: the claims' lead; longer ones, 50-90 % of each
     * split, measured slower, kernels/NOTES.md session 17) */
    const int64_t claim_keys = (int64_t)kp->claim_stages * kp->tokens;
    const int64_t base = base_chunk(p, kp, forced_chunk, auto_chunk);
    bool claims = kp->claim && !guided, any_split = false;
    for (int64_t t = 0; claims && t < ntiles; t++) {
        const int64_t len = tiles[t].hi - tiles[t].lo;
        const int64_t ns = pieces(len, tile_chunk(p, kp, len, base));
        if (ns > 1) any_split = true;
        if (ns > 1 && (len < ns * claim_keys || len < ns * claim_min)) claims = false;
    }
    r->base = base;
    r->guided = guided;
    r->gmin = gmin;
    r->gdiv = gdiv;
    r->guide_total = total_len * kp->head_tiles;
    r->claims = claims && any_split;
    r->claim_keys = claim_keys;
}

/* The work list of rule r: returns the number of items (writes them when
 * `items` is not NULL), and the partial rows and arrival counters the
 * splits need. */
static int64_t plan_items(const pa_attn_problem *p, const kernel_plan *kp, const work_rule *r,
                          const tile_range *tiles, int64_t ntiles, pa_work *items, int64_t *part_rows,
                          int64_t *ncounters) {
    const int64_t base = r->base, gmin = r->gmin, gdiv = r->gdiv, claim_keys = r->claim_keys;
    const bool guided = r->guided, claims = r->claims;
    int64_t guide_left = r->guide_total;
    int64_t n = 0, counters = 0, rows = 0, first_item = 0;
    int32_t cur_b = -1, max_split_b = 1;
    for (int64_t t = 0; t <= ntiles; t++) {
        if (t == ntiles || tiles[t].b != cur_b) { /* close the previous sequence */
            if (cur_b >= 0 && max_split_b > 1) {
                if (items)
                    for (int64_t i = first_item; i < n; i++) items[i].part_row = rows;
                rows += (int64_t)max_split_b * p->h_seqlen_q[cur_b];
            }
            if (t == ntiles) break;
            cur_b = tiles[t].b;
            max_split_b = 1;
            first_item = n;
        }
        const int64_t len = tiles[t].hi - tiles[t].lo;
        const int64_t chunk = tile_chunk(p, kp, len, base);
        int64_t ns = pieces(len, chunk);
        const int64_t guide_at = guide_left;
        if (guided && len > 0) {
            ns = 0;
            for (int64_t rem = len; rem > 0; ns++) {
                const int64_t c = guided_piece(rem, guide_left, gdiv, gmin, kp->tokens, kp->max_chunk);
                rem -= c;
                guide_left -= c * kp->head_tiles;
            }
        }
        if (ns > max_split_b) max_split_b = (int32_t)ns;
        const int32_t counter = ns > 1 ? (int32_t)counters : 0;
        if (ns > 1) counters += (claims ? 2 : 1) * kp->head_tiles; /* (claims: then the claim counters) */
        const int32_t b = tiles[t].b;
        int64_t pos = tiles[t].lo, left = guide_at;
        for (int64_t s = 0; s < ns; s++) {
            const int64_t piece =
                guided && len > 0 ? guided_piece(tiles[t].hi - pos, left, gdiv, gmin, kp->tokens, kp->max_chunk) : chunk;
            left -= piece * kp->head_tiles;
            if (items) {
                pa_work *w = &items[n];
                memset(w, 0, sizeof *w);
                w->q_start = p->h_q_start[b];
                w->lse_start = p->h_lse_start[b];
                w->b = b;
                w->i0 = tiles[t].i0;
                w->k0 = (int32_t)pos;
                w->k1 = (int32_t)(pos + piece < tiles[t].hi ? pos + piece : tiles[t].hi);
                if (claims && ns > 1) {
                    w->k0 = (int32_t)(tiles[t].lo + s * claim_keys);
                    w->k1 = tiles[t].hi;
                }
                if (len == 0) w->k0 = w->k1 = tiles[t].lo;
                w->split = (int32_t)s;
                w->nsplit = (int32_t)ns;
                w->counter = counter;
                w->seqlen_q = p->h_seqlen_q[b];
                w->seqlen_k = p->h_seqlen_k[b];
                w->cache_row = p->paged ? 0 : (p->h_cache_batch_idx ? p->h_cache_batch_idx[b] : b);
            }
            pos += piece;
            n++;
        }
    }
    *part_rows = rows;
    *ncounters = counters;
    return n;
}

/* One TMA descriptor (3-D, or `rank`-D) of the call's dtype: dims innermost
 * first, the strides of the outer ones in bytes, 128-byte swizzle. */
static pa_status tma_map_rank(pa_context *ctx, const pa_attn_problem *p, int rank, const void *base,
                              const uint64_t *dims, const uint64_t *strides, const uint32_t *box, pa_u64 *out) {
    const int dtype = p->dtype == PA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const uint32_t unit[5] = {1, 1, 1, 1, 1};
    CUtensorMap m;
    CUresult r = pa_cu.cuTensorMapEncodeTiled(&m, dtype, (uint32_t)rank, (void *)base, dims, strides, box, unit,
                                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return pa_cu_fail(ctx, r, "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    memcpy(out, m.opaque, sizeof m.opaque);
    return PA_OK;
}
static pa_status tma_map(pa_context *ctx, const pa_attn_problem *p, const void *base, const uint64_t *dims,
                         const uint64_t *strides, const uint32_t *box, pa_u64 *out) {
    return tma_map_rank(ctx, p, 3, base, dims, strides, box, out);
}

/* prefill_ws.cu's TMA descriptors (kernels/params.h). The K and V caches:
 * 3-D (head-dim elements, kv heads, cache rows = page * page_size + slot;
 * contiguous caches: batch row * S_cache + position), boxes of 64 elements x
 * 1 head x kp->tma_rows rows, what the producer loads per page (or tile);
 * with page boxes (tma=2) 5-D, a box of kp->tma_rows rows with all columns.
 * q, unless it is the rotated f32 copy (q_f32) or the tile's GT heads x QT
 * queries do not fill its 128 rows: (head-dim elements, heads, q rows),
 * boxes of 64 elements x GT heads x QT queries, so that the Q tile lands in
 * one transaction instead of ~20 cp.async a producer thread (the consumers
 * waited ~2.8 us for it at a block's start, kernels/NOTES.md session 9).
 * out, the same way (boxes of QT / 2 queries: each consumer's rows), where
 * the tile's rows leave by TMA stores. */
static pa_status tma_maps(pa_context *ctx, const pa_attn_problem *p, const kernel_plan *kp, bool q_f32,
                          pa_tma_maps *out) {
    const uint64_t D = (uint64_t)p->head_dim;
    const uint64_t dims[3] = {D, (uint64_t)p->kv_heads, (uint64_t)p->num_pages * (uint64_t)p->page_size};
    const uint64_t strides[2] = {D * 2, (uint64_t)p->kv_heads * D * 2}; /* bytes */
    const uint32_t box[3] = {64, 1, (uint32_t)kp->tma_rows};
    pa_status st;
    if (kp->page_boxes) {
        /* page boxes: (64 elements, 8 rows, 64-column blocks, kv heads, 8-row
         * groups), a box of a page's rows (or a tile's), every column block,
         * landing as the kernel's KVL layout (each 8 rows' blocks side by side) */
        const uint64_t row = (uint64_t)p->kv_heads * D * 2;
        const uint64_t pdims[5] = {64, 8, D / 64, (uint64_t)p->kv_heads, dims[2] / 8};
        const uint64_t pstrides[4] = {row, 128, D * 2, 8 * row};
        const uint32_t pbox[5] = {64, 8, (uint32_t)(D / 64), 1, (uint32_t)kp->tma_rows / 8};
        st = tma_map_rank(ctx, p, 5, p->k_cache, pdims, pstrides, pbox, out->k);
        if (st == PA_OK) st = tma_map_rank(ctx, p, 5, p->v_cache, pdims, pstrides, pbox, out->v);
    } else {
        st = tma_map(ctx, p, p->k_cache, dims, strides, box, out->k);
        if (st == PA_OK) st = tma_map(ctx, p, p->v_cache, dims, strides, box, out->v);
    }
    /* the tile's rows are GT heads x QT queries, and q rows are int32 coordinates */
    const bool rows = kp->gt * kp->q_tile == 128 && p->total_q < ((int64_t)1 << 31);
    out->q_tma = st == PA_OK && rows && !q_f32 && ((uintptr_t)p->q & 15) == 0 &&
                 env_int("PAGEDATTN_PREFILL_TMA_Q", 1, 0, 1);
    const uint64_t qdims[3] = {D, (uint64_t)p->heads, (uint64_t)p->total_q};
    const uint64_t qstrides[2] = {D * 2, (uint64_t)p->heads * D * 2};
    if (out->q_tma) {
        const uint32_t qbox[3] = {64, (uint32_t)kp->gt, (uint32_t)kp->q_tile};
        st = tma_map(ctx, p, p->q, qdims, qstrides, qbox, out->q);
    }
    out->o_tma = st == PA_OK && rows && ((uintptr_t)p->out & 15) == 0 && env_int("PAGEDATTN_PREFILL_TMA_O", 1, 0, 1);
    if (out->o_tma) {
        const uint32_t obox[3] = {64, (uint32_t)kp->gt, (uint32_t)kp->q_tile / 2};
        st = tma_map(ctx, p, p->out, qdims, qstrides, obox, out->o);
    }
    return st;
}

/* One attention launch: the sequences of one kernel kind. */
typedef struct attn_part {
    kernel_kind kind;
    kernel_plan kp;
    tile_range *tiles;
    int64_t ntiles, nwork, part_rows, ncounters;
    int64_t work0, rows0, counters0; /* offsets in the call's work list, partial rows, counters */
    int64_t boxes0; /* its first item's first-tile box rows in the call's list of them; -1: none */
    int64_t pages0, npaged; /* decode_mma: its first items' first page ids (npaged items) in the call's list; -1: none */
    work_rule rule;         /* how its tiles are cut (plan_rule; rule.claims: its splits claim their keys) */
    int32_t key_lo, key_hi; /* decode split by length: sequences of key_lo <= keys < key_hi (key_hi 0: any) */
    int64_t short_tiles;    /* query tiles of sequences under persist_min_keys() keys */
} attn_part;

/* Decode: persistent blocks only where the query tiles average at least
 * this many keys; a split call parts its sequences here (split_short). */
static int32_t persist_min_keys(void) { return env_int("PAGEDATTN_DECODE_PERSIST_MIN_KEYS", 256, 0, INT32_MAX); }

/* Whether sequence b is part pt's. */
static bool in_part(const pa_attn_problem *p, kind_rules rules, const attn_part *pt, int32_t b) {
    const int32_t sq = p->h_seqlen_q[b], sk = p->h_seqlen_k[b];
    return sq > 0 && kind_of(rules, sq) == pt->kind && sk >= pt->key_lo && (pt->key_hi == 0 || sk < pt->key_hi);
}

/* prefill_ws with TMA boxes of a paged cache: each work item's first K/V
 * tile's box rows (page * page_size + slot, one per box: PA_WS_BOXES at
 * most), so that the producer issues the first boxes without waiting for the
 * block table (a dependent round trip of ~1 us at a block's start; the
 * later tiles' page ids load a tile ahead). From the host's block table (the
 * rows the core validated); unused boxes 0. PAGEDATTN_PREFILL_FIRST_BOXES=0:
 * none (the producer loads the first tile's page ids too). */
static bool has_first_boxes(const pa_attn_problem *p, const attn_part *pt) {
    return pt->kp.ws && pt->kp.tma_rows > 0 && p->paged && env_int("PAGEDATTN_PREFILL_FIRST_BOXES", 1, 0, 1);
}
static void write_first_boxes(const pa_attn_problem *p, const attn_part *pt, const pa_work *items, int32_t *rows) {
    const int tr = pt->kp.tma_rows, nbox = pt->kp.tokens / tr, ps = p->page_size;
    for (int64_t i = 0; i < pt->nwork; i++) {
        const pa_work *w = &items[i];
        const int32_t *bt = p->h_block_table + (int64_t)w->b * p->bt_stride;
        const int32_t kbase = w->k0 - w->k0 % tr; /* the kernel's first tile (KALIGN = tma_rows) */
        for (int j = 0; j < PA_WS_BOXES; j++) {
            const int32_t tok = kbase + j * tr;
            rows[i * PA_WS_BOXES + j] = j < nbox && tok < w->k1 ? bt[tok / ps] * ps + tok % ps : 0;
        }
    }
}

/* decode_mma: the first PA_DECODE_FIRST_PAGES page ids of the first
 * pt->npaged work items' key ranges (those a block runs first: every item
 * where each block runs one, the first grid's worth of units where they are
 * persistent), from the host's block table; past an item's last page 0. A
 * block then issues its first stages as soon as its work item is there
 * (kernels/NOTES.md, session 16). PAGEDATTN_DECODE_FIRST_PAGES=0: none. */
static void write_first_pages(const pa_attn_problem *p, const attn_part *pt, const pa_work *items, int32_t *ids) {
    const int ps = p->page_size;
    for (int64_t i = 0; i < pt->npaged; i++) {
        const pa_work *w = &items[i];
        const int32_t *bt = p->h_block_table + (int64_t)w->b * p->bt_stride;
        const int32_t first = w->k0 / ps, last = w->k1 > w->k0 ? (w->k1 - 1) / ps : first - 1;
        for (int j = 0; j < PA_DECODE_FIRST_PAGES; j++)
            ids[i * PA_DECODE_FIRST_PAGES + j] = first + j <= last ? bt[first + j] : 0;
    }
}

static int by_length_desc(const void *a, const void *b) {
    const pa_work *x = a, *y = b;
    const int32_t lx = x->k1 - x->k0, ly = y->k1 - y->k0;
    return lx < ly ? 1 : lx > ly ? -1 : 0;
}

/* prefill_ws's order: whole sequences, the one with the longest item first,
 * each sequence's items longest first. The blocks resident at one time then
 * read the K/V of few sequences (4 x 2048: L2 hit rate 74 -> 86 %, DRAM
 * fills halved, 1-1.5 % faster; kernels/NOTES.md session 13), and the last
 * blocks are still short ones. PAGEDATTN_PREFILL_ORDER=0: longest first over
 * all items (the order before). */
typedef struct order_key {
    int32_t seq_len, b, len;
    int64_t at;
} order_key;
static int by_sequence_then_length(const void *a, const void *b) {
    const order_key *x = a, *y = b;
    if (x->seq_len != y->seq_len) return x->seq_len < y->seq_len ? 1 : -1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return x->at < y->at ? -1 : x->at > y->at ? 1 : 0;
}
/* false: out of host memory (the items keep their order; any order is correct) */
static bool order_by_sequence(const pa_attn_problem *p, pa_work *items, int64_t n) {
    int32_t *seq_len = calloc((size_t)p->batch, sizeof *seq_len);
    order_key *keys = malloc(sizeof *keys * (size_t)(n ? n : 1));
    pa_work *tmp = malloc(sizeof *tmp * (size_t)(n ? n : 1));
    const bool ok = seq_len && keys && tmp;
    if (ok) {
        for (int64_t i = 0; i < n; i++) {
            const int32_t len = items[i].k1 - items[i].k0;
            if (len > seq_len[items[i].b]) seq_len[items[i].b] = len;
        }
        for (int64_t i = 0; i < n; i++)
            keys[i] = (order_key){seq_len[items[i].b], items[i].b, items[i].k1 - items[i].k0, i};
        qsort(keys, (size_t)n, sizeof *keys, by_sequence_then_length);
        for (int64_t i = 0; i < n; i++) tmp[i] = items[keys[i].at];
        memcpy(items, tmp, sizeof *items * (size_t)n);
    }
    free(seq_len);
    free(keys);
    free(tmp);
    return ok;
}

/* The head tiles a decode block runs at once: four a warp-a-tile block, one a warp each */
static int block_tiles(const kernel_plan *kp) { return kp->hw ? 4 : 1; }

/* Whether the short units' kernel may give each of its four warps a head
 * tile of its own (decode_mma hw=1): all four on the same keys a stage (8
 * or 16: a stage's rows are four tiles' keys), each keeping its tile's softmax whole,
 * so a unit (a work item's four head tiles) has no merge of the warps
 * through shared memory, and a short sequence streams 4 times the stages
 * per block start-up (kernels/NOTES.md, session 20). The head tiles come in
 * fours and the Q of four fit the kernel's 32 rows of Q: at most 8 rows a
 * tile, 4 where q is rotated in the call (an f32 q takes two rows a row).
 * Its blocks must fill enough of the GPU (hw_waves_ok); plan_part checks
 * that, and that no item splits, once the work is planned. kp: the part's
 * plan (its query and head tiles are the short kernel's, and the persistent
 * blocks' too). PAGEDATTN_DECODE_HW=0: never;
 * 2 (specs): wherever it fits, and a decode call where it fits nowhere
 * fails, so that a spec knows it tested it. */
static bool hw_fits(const pa_attn_problem *p, const kernel_plan *kp) {
    return kp->head_tiles % 4 == 0 && kp->q_tile * kp->gt <= (p->rotary_cos != NULL ? 4 : 8);
}

/* Whether `blocks` warp-a-tile blocks fill the GPU (`capacity` at once)
 * well enough: at least PAGEDATTN_DECODE_HW_MIN_WAVES hundredths of a wave
 * (default 50), and for units that are not short (the persistent blocks'
 * otherwise) not a partial second wave, 1.0-1.5 waves (page 16, same
 * process, without hw / with: short units, the short units' kernel, 100 x
 * 64 keys at 0.5 waves 19.8 / 15.4 us, 200 x 64 at 1.0 33.0 / 28.1, 240 x
 * 64 at 1.2 36.4 / 33.3, 180 x 192 at 1.4 54.2 / 51.2; longer units, the
 * persistent blocks, 66 x 256 at 0.5 26.0 / 26.0, 100 x 256 at 0.76 42.1 /
 * 33.3, 132 x 256 at 1.0 46.6 / 41.2, 160 x 256 at 1.2 54.5 / 62.4, 184 x
 * 256 at 1.4 63.0 / 64.4, 180 x 320 at 1.4 73.4 / 76.8, 200 x 256 at 1.5
 * 71.0 / 65.1; kernels/NOTES.md, session 21). */
static bool hw_waves_ok(int64_t blocks, int capacity, bool short_units) {
    const int64_t pct = blocks * 100 / (capacity > 0 ? capacity : 1);
    return pct >= env_int("PAGEDATTN_DECODE_HW_MIN_WAVES", 50, 0, 100000) && (short_units || pct <= 100 || pct >= 150);
}

/* Part pt's work rule and its count of items, partial rows and counters,
 * for its kernel plan and query tiles (the list: write_part). */
static void plan_list(const pa_attn_problem *p, attn_part *pt) {
    plan_rule(p, &pt->kp, pt->tiles, pt->ntiles, &pt->rule);
    pt->nwork = plan_items(p, &pt->kp, &pt->rule, pt->tiles, pt->ntiles, NULL, &pt->part_rows, &pt->ncounters);
}

/* Plans part `pt` (kind already set): its kernel, query tiles and work count. */
static pa_status plan_part(pa_context *ctx, cuda_impl *impl, const pa_attn_problem *p, kind_rules rules,
                           attn_part *pt) {
    int32_t max_q = 0;
    int64_t nseq = 0, sum_keys = 0; /* (the part's average keys a sequence: plan_kernel's wide blocks) */
    for (int32_t b = 0; b < p->batch; b++)
        if (in_part(p, rules, pt, b)) {
            if (p->h_seqlen_q[b] > max_q) max_q = p->h_seqlen_q[b];
            nseq++;
            sum_keys += p->h_seqlen_k[b];
        }
    const int64_t seq_keys = nseq > 0 ? sum_keys / nseq : 0;
    const int split = pt->key_lo > 0 ? 1 : pt->key_hi > 0 ? 2 : 0; /* (a split call's long / short part: plan_kernel) */
    pa_status st = plan_kernel(ctx, impl, p, pt->kind, max_q, true, false, 0, nseq, seq_keys, split, &pt->kp);
    if (st) return st;
    const int qt = pt->kp.q_tile;
    const int32_t min_keys = persist_min_keys();
    int64_t tile_keys = 0; /* keys of the query tiles (each its sequence's) */
    for (int32_t b = 0; b < p->batch; b++)
        if (in_part(p, rules, pt, b)) {
            const int64_t n = (p->h_seqlen_q[b] + qt - 1) / qt;
            pt->ntiles += n;
            tile_keys += n * p->h_seqlen_k[b];
            if (p->h_seqlen_k[b] < min_keys) pt->short_tiles += n;
        }
    /* Fewer query tiles than the GPU holds blocks: prefill_ws, which never
     * splits, gives way to the kernel that splits them over a wave; the
     * persistent decode blocks to one block per unit, since the split fills
     * one wave and each block would run one unit (measured ~1 % faster
     * there, kernels/NOTES.md; guided pieces keep them: many units). So do
     * units shorter than PAGEDATTN_DECODE_PERSIST_MIN_KEYS on average
     * (default 256, four stages): a persistent block fetches its next unit
     * (counter, work item, page ids) a few stages before it needs it, which
     * such units cannot cover, so each waits for that chain; resident blocks
     * of their own overlap it (page 16, 268 MB: 1024 x 64 keys 229.8 -> 172.9
     * us, 512 x 128 126.0 -> 104.0; 256 x 256 82.2 against 83.7; session 18).
     * The query tile is the same: ntiles stands. */
    const int64_t tiles = pt->ntiles * pt->kp.head_tiles;
    const bool short_units = tile_keys < pt->ntiles * (int64_t)min_keys;
    /* a warp a head tile (hw_fits) for short units and for units of fewer
     * than PAGEDATTN_DECODE_HW_MAX_KEYS keys on average (default 512),
     * where it beats the persistent blocks by 6-11 % (page 16, 256 x 256 -
     * 1024 x 384 keys; kernels/NOTES.md, session 21); planned with the
     * short units' kernel, one block per unit */
    const int hw_mode = env_int("PAGEDATTN_DECODE_HW", 1, 0, 2);
    const int64_t avg_keys = pt->ntiles > 0 && tile_keys >= pt->ntiles ? tile_keys / pt->ntiles : 1; /* (>= 1) */
    const bool candidate = pt->kp.persistent && !pt->kp.guided;
    const bool hw = candidate && hw_mode >= 1 &&
                    (short_units || avg_keys < env_int("PAGEDATTN_DECODE_HW_MAX_KEYS", 512, 0, INT32_MAX)) &&
                    hw_fits(p, &pt->kp);
    /* without hw: persistent blocks where the units are not short and fill more than a wave */
    const bool persist_kept = candidate && !short_units && tiles > pt->kp.grid_cap;
    if ((pt->kp.ws && !pt->kp.forced && tiles < pt->kp.capacity) ||
        (candidate && (tiles <= pt->kp.grid_cap || short_units || hw))) {
        const bool short_kernel = candidate && (short_units || hw);
        st = plan_kernel(ctx, impl, p, pt->kind, max_q, false, short_kernel, hw ? avg_keys : 0, nseq, seq_keys, split,
                         &pt->kp);
        if (st) return st;
        if (pt->kp.q_tile != qt) return pa_fail(ctx, PA_ERR_INTERNAL, "attention: query tiles differ");
    }
    pt->tiles = malloc(sizeof *pt->tiles * (size_t)(pt->ntiles ? pt->ntiles : 1));
    if (!pt->tiles) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    int64_t t = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        const int32_t sq = p->h_seqlen_q[b], sk = p->h_seqlen_k[b];
        if (!in_part(p, rules, pt, b)) continue;
        for (int32_t i0 = 0; i0 < sq; i0 += qt) {
            const int32_t last = (i0 + qt < sq ? i0 + qt : sq) - 1;
            int32_t lo0, hi0, lo1, hi1;
            pa_mask_range(p, sq, sk, i0, &lo0, &hi0);
            pa_mask_range(p, sq, sk, last, &lo1, &hi1);
            tile_range tr = {b, i0, lo0 < lo1 ? lo0 : lo1, hi0 > hi1 ? hi0 : hi1};
            if (tr.hi < tr.lo) tr.hi = tr.lo;
            pt->tiles[t++] = tr;
        }
    }
    plan_list(p, pt);
    /* a warp a head tile only on unsplit items (a split, e.g. at the
     * page-id cap, writes partials) and where its blocks fill enough of the
     * GPU (hw_waves_ok; HW=2 also where not): else what the part runs
     * without it, the short units' kernel or the persistent blocks (or one
     * block per unit: few tiles) */
    if (pt->kp.hw && (pt->part_rows > 0 || pt->rule.claims ||
                      (hw_mode < 2 && !hw_waves_ok(pt->nwork * pt->kp.head_tiles / 4, pt->kp.capacity, short_units)))) {
        st = plan_kernel(ctx, impl, p, pt->kind, max_q, persist_kept, short_units, 0, nseq, seq_keys, split,
                         &pt->kp);
        if (st) return st;
        plan_list(p, pt);
    }
    if (pt->kind == K_DECODE && pt->kp.claim_required && !pt->kp.persistent && !pt->rule.claims)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: PAGEDATTN_DECODE_CLAIM=2 (specs), but this call's decode "
                       "blocks do not claim their keys (no split tile, or one too short for its splits)");
    if (pt->nwork * pt->kp.head_tiles > INT32_MAX)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: %lld blocks exceed the grid limit",
                       (long long)(pt->nwork * pt->kp.head_tiles));
    return PA_OK;
}

/* Writes part pt's work items at `items` (its share of the call's list),
 * with its partial rows and counters placed after the earlier parts'. */
static void write_part(const pa_attn_problem *p, const attn_part *pt, pa_work *items) {
    int64_t rows, counters;
    plan_items(p, &pt->kp, &pt->rule, pt->tiles, pt->ntiles, items, &rows, &counters);
    for (int64_t i = 0; i < pt->nwork; i++) {
        items[i].part_row += pt->rows0;
        items[i].counter += (int32_t)pt->counters0;
    }
    if (pt->rule.claims && env_int("PAGEDATTN_DECODE_CLAIM_ORDER", 1, 0, 1) == 1) {
        /* split-major: the blocks that share a tile's claims launch a grid /
         * nsplit apart, not next to each other (likely on one GPC, whose
         * SMs stream alike: 8 x 32768 took 251.8-252.2 us so, 249.8-250.3
         * split-major, 252.9-254.6 without claims; kernels/NOTES.md).
         * PAGEDATTN_DECODE_CLAIM_ORDER=0: sequence-major.
         * (Without host memory for the copy the order stays: same results.) */
        int32_t nsplit = 1;
        for (int64_t i = 0; i < pt->nwork; i++)
            if (items[i].nsplit > nsplit) nsplit = items[i].nsplit;
        pa_work *copy = malloc(sizeof *copy * (size_t)pt->nwork);
        int64_t *at = calloc((size_t)nsplit + 1, sizeof *at);
        if (copy && at) {
            memcpy(copy, items, sizeof *copy * (size_t)pt->nwork);
            for (int64_t i = 0; i < pt->nwork; i++) at[copy[i].split + 1]++;
            for (int32_t sp = 0; sp < nsplit; sp++) at[sp + 1] += at[sp];
            for (int64_t i = 0; i < pt->nwork; i++) items[at[copy[i].split]++] = copy[i];
        }
        free(copy);
        free(at);
    }
    if (pt->kp.ws && env_int("PAGEDATTN_PREFILL_ORDER", 1, 0, 1) && order_by_sequence(p, items, pt->nwork)) return;
    if (pt->kp.longest_first) qsort(items, (size_t)pt->nwork, sizeof *items, by_length_desc);
}

/* Decode of short and long sequences in one call: the persistent blocks
 * wait on each short unit's chain (counter, work item, page ids: a unit
 * shorter than PREP_STAGES cannot load the next one while it streams), and
 * the short units' kernel runs a long unit whole in one block. Where the
 * plan of the whole part is either kernel and at least a wave of units
 * (capacity) belongs to sequences of fewer than
 * PAGEDATTN_DECODE_PERSIST_MIN_KEYS keys while others are longer, the long
 * sequences and the short ones are planned as two parts, two launches (page
 * 16, same process: 64 x 4096 + 512 x 64 keys 369.1-370.5 -> 315.0-315.4
 * us, 256 x 1024 + 1024 x 64 547.7 -> 377.3-379.1, 32 x 4096 + 1024 x 128
 * 331 -> 312-313; kernels/NOTES.md, session 19; the second launch starts
 * in the first one's tail: run, PAGEDATTN_DECODE_OVERLAP).
 * PAGEDATTN_DECODE_SPLIT_SHORT=0: one part; 2 (specs): a decode call that
 * is not split fails, so that a spec knows it tested the split. The
 * length that parts them: persist_min_keys(). */
static bool split_short(const attn_part *pt) {
    return pt->kind == K_DECODE && (pt->kp.persistent || pt->kp.short_kernel) &&
           env_int("PAGEDATTN_DECODE_SPLIT_SHORT", 1, 0, 1) == 1 && pt->short_tiles < pt->ntiles &&
           pt->short_tiles * pt->kp.head_tiles >= pt->kp.capacity;
}

/* Whether the append kernel's new tokens take its 16-byte path, as the
 * kernel's new8_ok decides for a warp of `per` kv heads (append.cu): then
 * pa_append_new8, else pa_append, which lacks that path (and runs a head a
 * warp faster for it). */
static bool append_new8(const pa_attn_problem *p, int per) {
    const int D = p->head_dim, rd = p->rotary_dim, il = p->rotary_interleaved;
    const uintptr_t bases = (uintptr_t)p->k_new | (uintptr_t)p->v_new | (uintptr_t)p->k_cache | (uintptr_t)p->v_cache;
    if (p->total_new <= 0 || p->dtype == PA_F32 || D % 8 != 0 || (bases & 15) != 0) return false;
    if (!p->rotary_cos) return true;
    return PA_APPEND_ROWS8_RD(rd, il) && PA_APPEND_ROWS8_ITEMS(per, D, rd, il) >= PA_APPEND_ROWS8_MIN;
}

static pa_status run(pa_context *ctx, cuda_impl *impl, const pa_attn_problem *p, pa_kmodule *append_mod) {
    const int32_t B = p->batch, H = p->heads, Hk = p->kv_heads, D = p->head_dim;
    const bool attend = p->total_q > 0;
    const bool rotate_q = p->rotary_cos != NULL && attend;
    const bool append = p->total_new > 0 || rotate_q;
    pa_status st = PA_OK;

    /* the parts: one per kernel kind that some sequence needs (decode: two
     * where short and long sequences are mixed, split_short) */
    attn_part parts[4];
    int nparts = 0;
    memset(parts, 0, sizeof parts);
    int64_t nwork = 0, part_rows = 0, ncounters = 0, nboxed = 0, npaged = 0;
    if (attend) {
        const kind_rules rules = rules_of(p);
        bool used[3] = {false, false, false};
        for (int32_t b = 0; b < B; b++)
            if (p->h_seqlen_q[b] > 0) used[kind_of(rules, p->h_seqlen_q[b])] = true;
        bool split = false, hw = false;
        for (int k = 0; k < 3 && st == PA_OK; k++) {
            if (!used[k]) continue;
            attn_part *pt = &parts[nparts++];
            pt->kind = (kernel_kind)k;
            st = plan_part(ctx, impl, p, rules, pt);
            if (st == PA_OK && split_short(pt)) {
                /* this part: the long sequences; the next: the short ones */
                split = true;
                const int32_t cut = persist_min_keys();
                free(pt->tiles);
                memset(pt, 0, sizeof *pt);
                pt->kind = K_DECODE;
                pt->key_lo = cut;
                st = plan_part(ctx, impl, p, rules, pt);
                attn_part *sp = &parts[nparts++];
                sp->kind = K_DECODE;
                sp->key_hi = cut;
                if (st == PA_OK) st = plan_part(ctx, impl, p, rules, sp);
            }
        }
        /* their places in the call's work list, partial rows, counters and lists */
        for (int i = 0; st == PA_OK && i < nparts; i++) {
            attn_part *pt = &parts[i];
            pt->work0 = nwork;
            pt->rows0 = part_rows;
            pt->counters0 = ncounters;
            pt->boxes0 = -1;
            if (has_first_boxes(p, pt)) {
                pt->boxes0 = nboxed;
                nboxed += pt->nwork;
            }
            pt->pages0 = -1;
            if (pt->kp.first_pages) {
                /* the items whose units the blocks run first (at most 1024 of
                 * them where each block runs one: 64 KB of the plan) */
                int64_t first_units = pt->nwork * pt->kp.head_tiles;
                const int64_t first_cap = (int64_t)pt->kp.grid_cap * block_tiles(&pt->kp);
                if (pt->kp.persistent && first_units > first_cap) first_units = first_cap;
                pt->npaged = (first_units + pt->kp.head_tiles - 1) / pt->kp.head_tiles;
                if (pt->npaged > 1024) pt->npaged = 1024;
                pt->pages0 = npaged;
                npaged += pt->npaged;
            }
            hw = hw || pt->kp.hw;
            nwork += pt->nwork;
            part_rows += pt->part_rows;
            ncounters += pt->ncounters + (pt->kp.persistent ? 1 : 0); /* the last: its unit counter */
        }
        if (st == PA_OK && used[K_DECODE] && env_int("PAGEDATTN_DECODE_SPLIT_SHORT", 1, 0, 2) == 2 &&
            !split)
            st = pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: PAGEDATTN_DECODE_SPLIT_SHORT=2 (specs), but this call's "
                         "decode sequences are not split into short and long ones");
        if (st == PA_OK && used[K_DECODE] && !hw && env_int("PAGEDATTN_DECODE_HW", 1, 0, 2) == 2)
            st = pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: PAGEDATTN_DECODE_HW=2 (specs), but no decode block of "
                         "this call gives its warps a head tile each (not the short units' kernel, split items, "
                         "head tiles not in fours, or too many rows a tile)");
        if (st) {
            for (int i = 0; i < nparts; i++) free(parts[i].tiles);
            return st;
        }
    }

    /* staging (host, pinned) and scratch (device) layouts */
    const size_t meta_bytes = sizeof(pa_seq_meta) * (size_t)B;
    const size_t work_off = ALIGN_UP(meta_bytes, 256);
    const size_t boxes_off = ALIGN_UP(work_off + sizeof(pa_work) * (size_t)nwork, 256);
    const size_t pages_off = ALIGN_UP(boxes_off + sizeof(int32_t) * PA_WS_BOXES * (size_t)nboxed, 256);
    const size_t upload_bytes = pages_off + sizeof(int32_t) * PA_DECODE_FIRST_PAGES * (size_t)npaged; /* the plan */
    const size_t part_o_off = 0;
    const size_t part_lse_off = part_o_off + ALIGN_UP((size_t)part_rows * H * D * 4, 256);
    const size_t q_rot_off = part_lse_off + ALIGN_UP((size_t)part_rows * H * 4, 256);
    const size_t scratch_bytes = q_rot_off + (rotate_q ? (size_t)p->total_q * H * D * 4 : 0);

    void *host = NULL;
    int slot = 0;
    CUdeviceptr dev_scratch = 0, counters = 0;
    st = pa_cuda_staging(ctx, impl, upload_bytes, &host, &slot);
    if (st == PA_OK) st = pa_cuda_scratch(ctx, impl, scratch_bytes, &dev_scratch);
    if (st == PA_OK && ncounters > 0) st = pa_cuda_counters(ctx, impl, (size_t)ncounters, &counters);
    if (st) {
        for (int i = 0; i < nparts; i++) free(parts[i].tiles);
        return st;
    }
    pa_seq_meta *meta = host;
    int64_t new_prefix = 0;
    /* as many new tokens (queries) in every sequence, in order: the append
     * kernel finds a token's sequence by a division, not a search (0: not so) */
    int32_t new_per_seq = B > 0 ? p->h_num_new[0] : 0, q_per_seq = B > 0 ? p->h_seqlen_q[0] : 0;
    bool new_dense = true; /* each sequence's new rows right after the last one's */
    for (int32_t b = 0; b < B; b++) {
        pa_seq_meta *mb = &meta[b];
        memset(mb, 0, sizeof *mb);
        mb->q_start = p->h_q_start[b];
        mb->new_row = p->h_new_start_row[b];
        mb->new_prefix = new_prefix;
        if (p->h_num_new[b] > 0 && mb->new_row != new_prefix) new_dense = false;
        new_prefix += p->h_num_new[b];
        mb->append_pos = p->h_append_pos[b];
        mb->cache_row = p->paged ? 0 : (p->h_cache_batch_idx ? p->h_cache_batch_idx[b] : b);
        if (p->h_num_new[b] != new_per_seq) new_per_seq = 0;
        if (p->h_seqlen_q[b] != q_per_seq || p->h_q_start[b] != (int64_t)b * q_per_seq) q_per_seq = 0;
    }
    for (int i = 0; i < nparts; i++) {
        pa_work *items = (pa_work *)((char *)host + work_off) + parts[i].work0;
        write_part(p, &parts[i], items);
        free(parts[i].tiles);
        if (parts[i].boxes0 >= 0)
            write_first_boxes(p, &parts[i], items,
                              (int32_t *)((char *)host + boxes_off) + parts[i].boxes0 * PA_WS_BOXES);
        if (parts[i].pages0 >= 0)
            write_first_pages(p, &parts[i], items,
                              (int32_t *)((char *)host + pages_off) + parts[i].pages0 * PA_DECODE_FIRST_PAGES);
    }

    const int64_t page_stride = (int64_t)p->page_size * Hk * D; /* contiguous: S_cache rows */
    const int64_t row_stride = (int64_t)Hk * D;

    /* Nothing below waits for the device (see the top of this file). */
    st = pa_cuda_timing_begin(ctx, impl);
    if (st) return st;
    CUdeviceptr plan = 0;
    st = pa_cuda_plan_upload(ctx, impl, slot, upload_bytes, &plan);
    CUresult r;

    if (st == PA_OK && append) {
        pa_append_params ap;
        memset(&ap, 0, sizeof ap);
        ap.k_new = (pa_u64)(uintptr_t)p->k_new;
        ap.v_new = (pa_u64)(uintptr_t)p->v_new;
        ap.k_cache = (pa_u64)(uintptr_t)p->k_cache;
        ap.v_cache = (pa_u64)(uintptr_t)p->v_cache;
        ap.block_table = p->paged ? (pa_u64)(uintptr_t)p->block_table : 0;
        ap.meta = plan;
        ap.rot_cos = (pa_u64)(uintptr_t)p->rotary_cos;
        ap.rot_sin = (pa_u64)(uintptr_t)p->rotary_sin;
        ap.q = (pa_u64)(uintptr_t)p->q;
        ap.q_rot = rotate_q ? dev_scratch + q_rot_off : 0;
        ap.bt_stride = p->bt_stride;
        ap.page_stride = page_stride;
        ap.row_stride = row_stride;
        ap.total_new = p->total_new;
        ap.q_rows = rotate_q ? p->total_q : 0;
        ap.batch = B;
        ap.heads = H;
        ap.kv_heads = Hk;
        ap.head_dim = D;
        ap.page_size = p->page_size;
        ap.rotary_dim = p->rotary_dim;
        ap.rot_dtype = (pa_i32)p->rotary_dtype;
        ap.interleaved = p->rotary_interleaved;
        ap.rope_q_step = p->rope_q_step;
        const int64_t tokens = p->total_new + ap.q_rows;
        /* a warp per token (all its heads' rows); few tokens: `split` warps
         * a token, each with a share of its heads, up to a warp per head,
         * until the warps would fill the SMs: 32 resident a SM (4 blocks of
         * 8 warps, 48 KB of shared memory each; kernels/NOTES.md, session 10) */
        const int cap = p->total_new > 0 ? Hk : H;
        int split = 1;
        while (split < cap && tokens * split < (int64_t)impl->sm_count * 32) split *= 2;
        ap.split = split < cap ? split : cap;
        ap.new_per_seq = new_per_seq;
        ap.q_per_seq = rotate_q ? q_per_seq : 0;
        ap.new_dense = new_dense;
        const int64_t grid = (tokens * ap.split + 7) / 8; /* 8 warps a block */
        void *args[] = {&ap};
        const bool new8 = append_new8(p, (Hk + ap.split - 1) / ap.split);
        CUfunction append_fn = NULL;
        if (grid > INT32_MAX)
            st = pa_fail(ctx, PA_ERR_UNSUPPORTED, "append: %lld tokens are too many", (long long)tokens);
        else if (grid > 0)
            st = pa_cuda_function(ctx, impl, append_mod, new8 ? "pa_append_new8" : "pa_append", 0, &append_fn);
        if (st == PA_OK && grid > 0) {
            r = pa_cu.cuLaunchKernel(append_fn, (unsigned)grid, 1, 1, 256, 1, 1, 0, impl->stream, args, NULL);
            if (r != CUDA_SUCCESS) st = pa_cu_fail(ctx, r, "cuLaunchKernel(pa_append)", __FILE__, __LINE__);
        }
    }

    for (int i = 0; st == PA_OK && i < nparts; i++) {
        const kernel_plan *kp = &parts[i].kp;
        if (parts[i].nwork == 0) continue;
        pa_attn_params ap;
        memset(&ap, 0, sizeof ap);
        ap.q = rotate_q ? dev_scratch + q_rot_off : (pa_u64)(uintptr_t)p->q;
        ap.q_f32 = rotate_q;
        ap.out = (pa_u64)(uintptr_t)p->out;
        ap.lse = (pa_u64)(uintptr_t)p->lse;
        ap.k_cache = (pa_u64)(uintptr_t)p->k_cache;
        ap.v_cache = (pa_u64)(uintptr_t)p->v_cache;
        ap.block_table = p->paged ? (pa_u64)(uintptr_t)p->block_table : 0;
        ap.alibi = (pa_u64)(uintptr_t)p->alibi;
        ap.work = plan + work_off + sizeof(pa_work) * (size_t)parts[i].work0;
        ap.part_o = dev_scratch + part_o_off;
        ap.part_lse = dev_scratch + part_lse_off;
        ap.counters = counters;
        ap.bt_stride = p->bt_stride;
        ap.lse_head_stride = p->lse_head_stride;
        ap.alibi_batch_stride = p->alibi_batch_stride;
        ap.page_stride = page_stride;
        ap.row_stride = row_stride;
        ap.batch = B;
        ap.heads = H;
        ap.kv_heads = Hk;
        ap.group = p->group;
        ap.head_dim = D;
        ap.page_size = p->page_size;
        ap.head_tiles = kp->head_tiles;
        ap.heads_per_tile = kp->gt;
        ap.q_tile = kp->q_tile;
        ap.num_work = (pa_i32)parts[i].nwork;
        ap.window_left = p->window_left;
        ap.window_right = p->window_right;
        ap.scale = p->scale;
        ap.softcap = p->softcap;
        ap.item_counter = (pa_i32)(kp->persistent ? parts[i].counters0 + parts[i].ncounters : 0);
        ap.claim = parts[i].rule.claims;
        if (parts[i].pages0 >= 0) {
            ap.first_pages = plan + pages_off + sizeof(int32_t) * PA_DECODE_FIRST_PAGES * (size_t)parts[i].pages0;
            ap.first_pages_items = (pa_i32)parts[i].npaged;
        }
        pa_tma_maps maps;
        memset(&maps, 0, sizeof maps);
        if (kp->tma_rows > 0) st = tma_maps(ctx, p, kp, ap.q_f32 != 0, &maps);
        if (parts[i].boxes0 >= 0)
            maps.first_boxes = plan + boxes_off + sizeof(int32_t) * PA_WS_BOXES * (size_t)parts[i].boxes0;
        if (st) break;
        void *args[] = {&ap, &maps}; /* the second: prefill_ws only (a kernel of one parameter reads one) */
        int64_t blocks = parts[i].nwork * kp->head_tiles / block_tiles(kp);
        if (kp->persistent && blocks > kp->grid_cap) blocks = kp->grid_cap; /* each takes units until none are left */
        /* the short sequences of a split decode call (split_short) start
         * while the long ones' blocks end: launched programmatically after
         * them, they take the SMs the persistent blocks leave (decode_mma
         * says when: pa_launch_dependents) and end after them
         * (pa_wait_prior_grid), reading nothing they write (sm_90+;
         * PAGEDATTN_DECODE_OVERLAP=0: one after the other) */
        const bool overlap = i > 0 && parts[i].key_hi > 0 && parts[i - 1].nwork > 0 && impl->cc_major >= 9 &&
                             pa_cu.cuLaunchKernelEx != NULL && env_int("PAGEDATTN_DECODE_OVERLAP", 1, 0, 1) == 1;
        if (overlap) {
            CUlaunchAttribute attr;
            memset(&attr, 0, sizeof attr);
            attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmatic_stream_serialization = 1;
            const CUlaunchConfig cfg = {(unsigned)blocks, 1, 1, (unsigned)kp->threads, 1, 1, (unsigned)kp->smem,
                                        impl->stream, &attr, 1};
            r = pa_cu.cuLaunchKernelEx(&cfg, kp->fn, args, NULL);
        } else {
            r = pa_cu.cuLaunchKernel(kp->fn, (unsigned)blocks, 1, 1, (unsigned)kp->threads, 1, 1,
                                     (unsigned)kp->smem, impl->stream, args, NULL);
        }
        if (r != CUDA_SUCCESS)
            st = pa_cu_fail(ctx, r, overlap ? "cuLaunchKernelEx(attention)" : "cuLaunchKernel(attention)", __FILE__,
                            __LINE__);
    }
    if (plan) {
        pa_status st_rel = pa_cuda_plan_release(ctx, impl, slot);
        if (st == PA_OK) st = st_rel;
    }
    pa_status st_end = pa_cuda_timing_end(ctx, impl);
    return st ? st : st_end;
}

pa_status pa_cuda_attention(pa_context *ctx, const pa_attn_problem *p) {
    if (p->cache_dtype != p->dtype) /* (the kernels' fp8 forms are not planned here yet) */
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: %s caches are not supported by the CUDA backend yet",
                       pa_dtype_name(p->cache_dtype));
    cuda_impl *impl = pa_cuda_impl(p->dev);
    pthread_mutex_lock(&impl->lock);
    pa_status st = pa_cuda_enter(ctx, impl);
    if (st == PA_OK) {
        pa_kmodule *append_mod = NULL;
        if (p->total_new > 0 || (p->rotary_cos && p->total_q > 0)) {
            char variant[64];
            snprintf(variant, sizeof variant, "append dtype=%s", dtype_str(p->dtype));
            st = pa_cuda_module(ctx, impl, variant, &append_mod);
        }
        if (st == PA_OK) st = run(ctx, impl, p, append_mod);
        pa_cuda_leave(impl);
    }
    pthread_mutex_unlock(&impl->lock);
    return st;
}
