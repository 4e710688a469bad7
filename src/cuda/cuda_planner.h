/*
 * cuda_planner.h -- the CUDA backend's planner: for one normalised problem
 * (pa_attn_problem), the device's capabilities and the tuning, it chooses the
 * kernel variant of each part of the batch and cuts the work list. Pure host
 * code: no driver calls, no environment; what it must know of a kernel
 * variant (threads, shared bytes, keys a stage, page-id cap, blocks a SM) it
 * asks of the caller through pa_cuda_kernels (the backend loads the module;
 * spec/planner_check.c answers from a table). Every allocation is reported.
 *
 *   cuda_choice.c    kernel choice: the family, the variant, its launch facts
 *   cuda_planner.c   the parts of a call, the plan's layout
 *   cuda_worklist.c  query tiles cut into work items, their order, the lists
 *                    written beside them
 */
#ifndef PA_CUDA_PLANNER_H
#define PA_CUDA_PLANNER_H

#include "cuda_variants.h"
#include "../../kernels/params.h"

/* What the planner knows of the device. */
typedef struct pa_cuda_caps {
    int sm_count, cc_major;
    int smem_optin; /* shared bytes a block may opt into */
    bool sm90a;     /* kernels compile for sm_90a (wgmma, TMA) */
    bool tma;       /* the driver encodes TMA descriptors */
    bool launch_ex; /* the driver launches with attributes (programmatic launch) */
} pa_cuda_caps;

/* A loaded kernel variant. */
typedef struct pa_cuda_loaded {
    const char *name; /* the variant, as the loader keeps it (lives as long as the device) */
    void *module;     /* the loader's */
    int info[4];      /* the kind's launch facts: decode {threads, smem, keys a stage, page ids},
                         prefill {threads, smem, keys a stage, queries a tile}, fallback {threads, rows, keys} */
} pa_cuda_loaded;

/* The kernels, as the caller provides them. */
typedef struct pa_cuda_kernels {
    void *user;
    /* Loads a variant (compiling it if need be). */
    pa_status (*load)(void *user, pa_context *ctx, const char *variant, pa_cuda_loaded *out);
    /* Entry point `entry` of a loaded variant, launched at threads and smem
     * bytes: its handle for the launch and how many of its blocks a SM holds. */
    pa_status (*occupancy)(void *user, pa_context *ctx, const pa_cuda_loaded *k, const char *entry, int threads,
                           int smem, void **fn, int *blocks_per_sm);
} pa_cuda_kernels;

/* Which kernel family a sequence runs on. */
typedef enum pa_part_kind { PA_PART_DECODE, PA_PART_PREFILL, PA_PART_FALLBACK } pa_part_kind;

/* The kernel chosen for a part, with its launch shape. */
typedef struct pa_kernel_plan {
    const char *variant, *entry;
    void *fn;
    int threads, smem;
    int tokens;    /* keys a pipeline stage: split lengths are multiples */
    int max_chunk; /* keys one block may take (its page ids must fit); 0: any */
    int gt, q_tile, head_tiles;
    int capacity;  /* blocks resident at once on the whole GPU */
    int grid_cap;  /* persistent: blocks launched at most */
    bool longest_first; /* order the work items by length, longest first */
    bool no_split;      /* one work item per query tile (the kernel writes out/lse directly) */
    bool tail_splits;   /* more than a wave of tiles: split where that fills the last wave better */
    bool ws;            /* prefill_ws: it never splits, so fewer tiles than slots go to prefill_wgmma */
    bool forced;        /* tuning chose the prefill kernel */
    bool persistent;    /* decode_mma persist=1: a resident wave of blocks takes the units from a counter */
    bool short_kernel;  /* decode_mma for short units, one block a unit */
    bool hw;            /* decode_mma hw=1: a warp a head tile, four a block */
    bool guided;        /* key ranges cut into pieces that shrink towards the end of the list */
    bool first_pages;   /* decode_mma, paged: the work items' first page ids listed */
    bool claim;         /* decode_mma, one block a unit: splits may claim their tile's keys */
    int claim_stages;   /* a claiming split's static stages */
    int tma_rows;       /* > 0: K/V tiles by TMA, boxes of this many cache rows */
    bool page_boxes;    /* TMA boxes of all columns (tma=2), else of 64 */
} pa_kernel_plan;

/* A query tile's keys: the union of its queries' ranges. */
typedef struct pa_tile_range {
    int32_t b, i0, lo, hi;
} pa_tile_range;

/* How a part's query tiles are cut into work items (pa_plan_rule). */
typedef struct pa_work_rule {
    int64_t base;   /* the split length every tile starts from (0: per tile) */
    bool guided;    /* guided pieces (gmin, gdiv; guide_total: keys x head tiles to cut) */
    int64_t gmin, gdiv, guide_total;
    bool claims;    /* the splits claim their keys (claim_keys static keys each) */
    int64_t claim_keys;
} pa_work_rule;

/* One launch: the sequences of one kernel kind (decode: maybe split by length). */
typedef struct pa_plan_part {
    pa_part_kind kind;
    pa_kernel_plan kp;
    pa_tile_range *tiles;
    int64_t ntiles, nwork, part_rows, ncounters;
    int64_t work0, rows0, counters0; /* offsets in the call's work list, partial rows, counters */
    int64_t boxes0;                  /* prefill_ws: its items' first boxes in the call's list; -1: none */
    int64_t pages0, npaged;          /* decode_mma: its first items' first page ids in the call's list; -1: none */
    pa_work_rule rule;
    int32_t key_lo, key_hi; /* decode split by length: key_lo <= keys < key_hi (key_hi 0: any) */
    int64_t short_tiles;    /* query tiles of sequences under decode_persist_min_keys keys */
    int64_t blocks;         /* the grid */
    bool overlap;           /* launched programmatically in the previous part's tail */
} pa_plan_part;

/* A call's plan: its launches and the layout of its upload and scratch. */
typedef struct pa_cuda_plan {
    pa_plan_part parts[4];
    int nparts;
    bool attend, rotate_q, append;
    int64_t nwork, part_rows, ncounters, nboxed, npaged;
    /* the upload (pinned staging -> the slot's device buffer) */
    size_t work_off, boxes_off, pages_off, upload_bytes;
    /* fp8 appends: the kv heads' 1 / scale in double, k's then v's, at
     * inv_off of the upload (cuda_launch.c's, after the plan's); 0: none */
    size_t inv_off;
    /* device scratch */
    size_t part_o_off, part_lse_off, q_rot_off, scratch_bytes;
    /* the append launch (append_grid 0: none) */
    int64_t append_grid;
    int append_split;
    bool append_new8;
    int32_t new_per_seq, q_per_seq;
    bool new_dense;
    /* orders of the list (from the tuning) and their scratch */
    bool claim_order, ws_order;
    void *order_scratch;
} pa_cuda_plan;

/* Plans a call. On failure nothing is left to free. */
pa_status pa_cuda_plan_make(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps,
                            const pa_cuda_tuning *t, const pa_cuda_kernels *k, pa_cuda_plan *plan);
/* Writes the upload at `host` (upload_bytes): the sequences' facts, the
 * work list in its launch order, the first-page and first-box lists. */
void pa_cuda_plan_write(const pa_attn_problem *p, const pa_cuda_plan *plan, void *host);
void pa_cuda_plan_free(pa_cuda_plan *plan);

/* The kernel variants the planner may choose for a shape on a device with
 * caps, whatever the batch: emit(user, name) once each. */
pa_status pa_cuda_plan_variants(pa_context *ctx, const pa_kernel_shape *shape, const pa_cuda_tuning *t,
                                const pa_cuda_caps *caps, void (*emit)(void *user, const char *name), void *user);

/* ---- cuda_choice.c: kernel choice (the planner's own files share it) ---- */

/* Which kernel family a sequence runs on: what the problem allows, decided
 * once a call, and the family of a sequence of seqlen_q queries. */
typedef struct pa_kind_rules {
    bool decode, prefill;
    int32_t decode_max_q; /* the decode kernels' queries a tile at most */
} pa_kind_rules;
pa_kind_rules pa_plan_kind_rules(const pa_attn_problem *p, const pa_cuda_tuning *t);
pa_part_kind pa_plan_kind_of(pa_kind_rules k, int32_t seqlen_q);

/* The situation a kernel is chosen for. allow_ws: the warp-specialised
 * prefill or the persistent decode blocks may be chosen (the query tiles fill
 * the GPU). short_units (decode, one block a unit): the units are short, so
 * the blocks a SM count more than the stages a block; hw_keys > 0: and each
 * warp takes a head tile of its own, the units averaging that many keys.
 * nseq, seq_keys: the part's sequences and their average keys; split: 0 a
 * call's only decode part, 1 the long sequences of a split call, 2 its short
 * ones. pays / wide >= 0 force those two decisions (the enumeration of
 * pa_cuda_plan_variants); -1: from the numbers. */
typedef struct pa_situation {
    pa_part_kind kind;
    int32_t max_q;
    bool allow_ws, short_units;
    int64_t hw_keys, nseq, seq_keys;
    int split;
    int pays, wide;
    bool tma_fits; /* prefill: the cache's rows are int32 TMA coordinates */
} pa_situation;
/* The kernel of situation s, with its launch facts (kp). */
pa_status pa_plan_kernel(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps, const pa_cuda_tuning *t,
                         const pa_cuda_kernels *k, pa_situation s, pa_kernel_plan *kp);
/* Whether a warp a head tile fits part plan kp (its q tile, GQA tile, head tiles). */
bool pa_plan_hw_fits(const pa_attn_problem *p, const pa_kernel_plan *kp);

/* Whether call p runs on lane 1, beside lane 0: it asks for it (the
 * cascade's shared level: pa_attn_problem.lane) and the tuning lets the
 * levels overlap (cascade_overlap). The planner and the queueing both ask. */
static inline bool pa_lane_beside(const pa_attn_problem *p, const pa_cuda_tuning *t) {
    return p->lane == 1 && t->cascade_overlap;
}

/* The blocks of `capacity` (what the GPU holds at once) that a call may
 * count on: all, or for a call on lane 1 beside lane 0 (pa_lane_beside)
 * cascade_share percent, so that its tiles split over that share and leave
 * the rest to the suffix level's decode. */
static inline int64_t pa_plan_capacity(const pa_attn_problem *p, const pa_cuda_tuning *t, int64_t capacity) {
    if (!pa_lane_beside(p, t)) return capacity;
    const int64_t c = capacity * t->cascade_share / 100;
    return c > 0 ? c : 1;
}

/* ---- cuda_worklist.c: the work list of a part (spec/planner_check.c tests these) ---- */

/* The rule that cuts a part's query tiles (kp: its kernel plan). */
void pa_plan_rule(const pa_attn_problem *p, const pa_kernel_plan *kp, const pa_cuda_tuning *t,
                  const pa_tile_range *tiles, int64_t ntiles, pa_work_rule *r);
/* The work list of rule r: returns the number of items (writes them when
 * `items` is not NULL), and the partial rows and arrival counters the splits need. */
int64_t pa_plan_items(const pa_attn_problem *p, const pa_kernel_plan *kp, const pa_work_rule *r,
                      const pa_tile_range *tiles, int64_t ntiles, pa_work *items, int64_t *part_rows,
                      int64_t *ncounters);
/* Writes part pt's items at `items` in their launch order (claiming splits
 * split-major when claim_order, prefill_ws by sequence when ws_order), its
 * partial rows and counters placed after the earlier parts'. scratch:
 * pa_plan_order_scratch(pt->nwork, p->batch) bytes. */
void pa_plan_order(const pa_attn_problem *p, const pa_plan_part *pt, bool claim_order, bool ws_order, void *scratch,
                   pa_work *items);
size_t pa_plan_order_scratch(int64_t nwork, int32_t batch);
/* The lists written beside the work: prefill_ws's first boxes, decode_mma's first page ids. */
void pa_plan_first_boxes(const pa_attn_problem *p, const pa_plan_part *pt, const pa_work *items, int32_t *rows);
void pa_plan_first_pages(const pa_attn_problem *p, const pa_plan_part *pt, const pa_work *items, int32_t *ids);
/* Whether warp-a-tile decode blocks pay as persistent blocks (cuda_choice.c). */
bool pa_hw_persist_pays(int kpw, int stages, int minb, int split, int64_t avg_keys, int64_t blocks, int sm_count);

#endif /* PA_CUDA_PLANNER_H */
