/*
 * params.h -- the structs that the host code (src/cuda) hands to the kernels,
 * by value as a kernel parameter or through device memory.
 *
 * Both sides compile this file: the host as C11, the kernels as CUDA C++
 * through NVRTC. It uses only 32- and 64-bit scalars in naturally aligned
 * order, so that both compilers lay the structs out alike (the host checks the
 * sizes with static asserts). Device addresses travel as pa_u64.
 *
 * (The PA_EMBED_ONLY guard lets src/cuda/kernel_sources.c include this file
 * only to record the build dependency; see there.)
 */
#ifndef PA_KERNEL_PARAMS_H
#define PA_KERNEL_PARAMS_H
#ifndef PA_EMBED_ONLY

typedef long long pa_i64;
typedef unsigned long long pa_u64;
typedef int pa_i32;

/* Per-sequence facts that the append kernel needs, uploaded with every call
 * (from the core's h_... arrays). */
typedef struct pa_seq_meta {
    pa_i64 q_start;    /* first row of q / out (rows are [H, D] each) */
    pa_i64 new_row;    /* first row of k_new / v_new (rows are [Hk, D]) */
    pa_i64 new_prefix; /* index of its first new token among all new tokens */
    pa_i32 append_pos; /* key position of its first new token */
    pa_i32 cache_row;  /* contiguous caches: the cache's batch row */
} pa_seq_meta;

/* One thread block's work (times the head tiles, which blockIdx also picks):
 * queries [i0, i0 + q_tile) of sequence b against keys [k0, k1). It carries
 * the sequence's facts too, so that a block starts with one load. */
typedef struct pa_work {
    pa_i64 q_start;   /* sequence b's first row of q / out */
    pa_i64 lse_start; /* its lse offset of query 0, head 0 */
    pa_i64 part_row;  /* its first partial row: split-major rows
                         part_row + split * seqlen_q + i, each [H, D] */
    pa_i32 b, i0, k0, k1;
    pa_i32 split;   /* which of the nsplit key ranges of this query tile */
    pa_i32 nsplit;  /* 1: write out/lse directly; else partials + combine */
    pa_i32 counter; /* arrival counters of this split group: counter + head tile */
    pa_i32 seqlen_q, seqlen_k, cache_row;
} pa_work;

/* The attention kernels' parameters (decode and fallback). Element offsets:
 *   q, out: (row * heads + h) * head_dim + d
 *   caches: page * page_stride + slot * row_stride + hk * head_dim + d
 *           (contiguous caches: page = cache_row, slot = key position)
 *   lse:    lse_start + h * lse_head_stride + i                          */
typedef struct pa_attn_params {
    pa_u64 q;           /* dtype, or f32 when q_f32 (rotated q) */
    pa_u64 out;
    pa_u64 lse;         /* maybe 0 */
    pa_u64 k_cache, v_cache;
    pa_u64 block_table; /* i32 [batch, bt_stride]; 0 for contiguous caches */
    pa_u64 alibi;       /* maybe: f32 slopes */
    pa_u64 work;        /* pa_work[num_work] */
    pa_u64 part_o;      /* f32 [partial rows, heads, head_dim] */
    pa_u64 part_lse;    /* f32 [partial rows, heads], log2 units */
    pa_u64 counters;    /* u32, zero between calls (the last block resets) */
    pa_i64 bt_stride, lse_head_stride, alibi_batch_stride;
    pa_i64 page_stride, row_stride;
    pa_i32 batch, heads, kv_heads, group, head_dim, page_size;
    pa_i32 head_tiles;     /* blocks per work item: kv_heads * tiles per group */
    pa_i32 heads_per_tile; /* query heads of one GQA group per block */
    pa_i32 q_tile;         /* queries per block */
    pa_i32 num_work;
    pa_i32 q_f32;
    pa_i32 window_left, window_right; /* -1: unbounded */
    float scale, softcap;
    pa_i32 item_counter; /* persistent decode: counters[item_counter] hands out work units (zero between calls) */
    /* decode_mma: i32 [first_pages_items][PA_DECODE_FIRST_PAGES], the page
     * ids of work item i's first pages (from page k0 / page_size on; past
     * its last page 0), from the host's block table, so that a block's first
     * stages go out with its work item, not a round trip later; 0: none */
    pa_u64 first_pages;
    pa_i32 first_pages_items;
    /* decode_mma, one block per unit: 1 where the splits of each split query
     * tile share its keys past their first PA_DECODE_CLAIM_STATIC(stages)
     * stages, claiming them PA_DECODE_CLAIM_RUN stages at a time (split s:
     * k0 = the tile's first key + s * those stages, k1 = the tile's end; the
     * host makes every split tile that long); 0: each split its own [k0, k1) */
    pa_i32 claim;
    /* fp8 caches (the kernels' PA_KV): a key is k_cache x the k scale of its
     * kv head, a value v_cache x the v scale; k_scales / v_scales (maybe 0):
     * f32 [kv_heads], else every head has k_scale / v_scale */
    pa_u64 k_scales, v_scales;
    float k_scale, v_scale;
    /* 1: out is f32 whatever the dtype (the cascade's two levels, which its
     * merge rounds once to the dtype); 0: out has the dtype */
    pa_i32 out_f32, pad_;
} pa_attn_params;
#define PA_DECODE_FIRST_PAGES 32 /* page 16: the first 3 stages of 64 keys span 12 or 13 pages, of 128 keys 24 or 25 */
/* decode_mma's claims (at up to 4 pipeline stages): a split's static stages
 * (a run is claimed that many stages before it runs) and the stages a claim
 * takes */
#define PA_DECODE_CLAIM_STATIC(stages) (2 * (stages) + 2)
#define PA_DECODE_CLAIM_RUN 2
#define PA_DECODE_CLAIM_MAX_STAGES 4
/* decode_mma's persistent blocks: a unit of this many stages or more loads
 * the next one without waiting (the kernel's PREP_STAGES; the host's
 * hw_persist_pays) */
#define PA_DECODE_PREP_STAGES(stages) (3 * (stages) - 1)

/* append.cu's 16-byte rotary rows: a token's `heads` rows of head dim D and
 * rotary dim rd (il: GPT-J pairs, else GPT-NeoX halves) are
 * PA_APPEND_ROWS8_ITEMS 16-byte chunks; a warp takes them 16 bytes at a
 * time where PA_APPEND_ROWS8_RD and there are PA_APPEND_ROWS8_MIN. The
 * host picks the append kernel's entry point by the same rule. */
#define PA_APPEND_ROWS8_ITEMS(heads, D, rd, il) ((heads) * (((il) ? (rd) / 8 : (rd) / 16) + ((D) - (rd)) / 8))
#define PA_APPEND_ROWS8_RD(rd, il) ((rd) % ((il) ? 8 : 16) == 0) /* whole chunks */
#define PA_APPEND_ROWS8_MIN 32                                   /* chunks a warp at least */

/* TMA descriptors of the K and V caches (the driver's 128-byte CUtensorMap,
 * built by cuTensorMapEncodeTiled): the second parameter of prefill_ws.cu's
 * kernel, __grid_constant__ there. 3-D: head-dim elements, kv heads, cache
 * rows (page * page_size + slot), 128-byte swizzle, boxes of 64 elements x
 * 1 head x the kernel's TMA_ROWS rows (the host's kernel_plan.tma_rows). */
#ifdef __cplusplus
#define PA_ALIGN128 alignas(128)
#else
#define PA_ALIGN128 _Alignas(128)
#endif
typedef struct pa_tma_maps {
    PA_ALIGN128 pa_u64 k[16];
    PA_ALIGN128 pa_u64 v[16];
    /* q (rows of [heads, head_dim], the input type): 3-D (head-dim elements,
     * heads, q rows), 128-byte swizzle, boxes of 64 elements x the kernel's
     * GT heads x its QT queries; the producer loads the Q tile by it where
     * q_tma is set (else q is f32, the heads do not fill the tile's 128 rows,
     * or PAGEDATTN_PREFILL_TMA_Q=0: Q by cp.async) */
    PA_ALIGN128 pa_u64 q[16];
    /* out, as q, boxes of 64 elements x GT heads x QT / 2 queries (a
     * consumer's 64 rows): its rows leave by TMA where o_tma is set and the
     * tile's queries all exist (else 16-byte stores) */
    PA_ALIGN128 pa_u64 o[16];
    /* i32 [work items][PA_WS_BOXES]: each item's first K/V tile's box rows
     * (page * page_size + slot; unused boxes 0), from the host's block
     * table; 0: the producer loads the block table */
    pa_u64 first_boxes;
    pa_i32 q_tma, o_tma;
} pa_tma_maps;
#define PA_WS_BOXES 8 /* boxes a tile at most: 128 keys / 16-row pages (head dim 256: 64 / 16) */

/* Rotary append: new k (rotated) and v into their cache slots; q rotated
 * into an f32 copy. Rows: total_new * kv_heads of k/v, then q_rows * heads. */
typedef struct pa_append_params {
    pa_u64 k_new, v_new, k_cache, v_cache;
    pa_u64 block_table; /* 0: contiguous caches */
    pa_u64 meta;
    pa_u64 rot_cos, rot_sin; /* maybe 0: no rotary */
    pa_u64 q, q_rot;         /* q_rot: f32 copy of q, rotated (maybe 0) */
    pa_i64 bt_stride, page_stride, row_stride;
    pa_i64 total_new, q_rows;
    pa_i32 batch, heads, kv_heads, head_dim, page_size;
    pa_i32 rotary_dim, rot_dtype, interleaved, rope_q_step;
    pa_i32 split; /* warps per token: each takes a share of the token's heads */
    /* > 0: every sequence has this many new tokens (queries), in order from
     * row 0, so a token's sequence is its row / this (no search); 0: search */
    pa_i32 new_per_seq, q_per_seq;
    /* 1: each sequence's new rows follow the last one's (token n's k / v rows
     * are row n of k_new / v_new), so their loads need no meta */
    pa_i32 new_dense;
    /* fp8 caches (PA_KV): the new rows go in as x * (1 / scale) of their kv
     * head in f32, converted once (the host's pa_fp8_scaled); inv_scales:
     * f32 [2][kv_heads], the 1 / scale of each head's k then v
     * (pa_fp8_inv_scale), uploaded with the plan: one definition of the
     * bytes for both backends, and no reciprocal a chunk */
    pa_i32 unused_; /* (the pointer after it 8-byte aligned) */
    pa_u64 inv_scales;
} pa_append_params;

/* append.cu's pa_dequant (fp8 caches, prefill on the Hopper kernels): the
 * keys a call attends, page by page, widened into a 16-bit copy of the
 * caches: block-table entry (b, j) of the call (bt_stride apart) into copy
 * page b * width + j, the keys below seqlen[b] (i32 [batch]) of it, each
 * value fp8 * scale of its kv head rounded once to PA_DTYPE (the
 * reference's naive reading). Block b * width + j of the grid takes entry
 * (b, j). */
typedef struct pa_dequant_params {
    pa_u64 k_cache, v_cache, block_table, seqlen;
    pa_u64 k_out, v_out;
    pa_i64 bt_stride, page_stride; /* page_stride: elements a page (page_size * kv_heads * head_dim) */
    pa_i32 batch, width, kv_heads, head_dim, page_size, pad;
    float k_scale, v_scale;    /* every head's, where k_scales / v_scales are 0 */
    pa_u64 k_scales, v_scales; /* maybe 0: f32 [kv_heads] */
} pa_dequant_params;

/* merge.cu: attention states merged by their log-sum-exp (the core's
 * pa_merge_problem). Item r, head h writes output row out_rows[r] (0: r)
 * from state s's row rows[r] (rows 0: r; negative: empty there); o at
 * (row * heads + h) * head_dim, lse at
 * (row / lse_seq) * heads * lse_seq + h * lse_seq + row % lse_seq. */
#define PA_MERGE_STATES_MAX 32
typedef struct pa_merge_kstate {
    pa_u64 o, lse;
    pa_u64 rows;    /* maybe 0: i32 [rows] */
    pa_i64 lse_seq;
} pa_merge_kstate;

typedef struct pa_merge_kparams {
    pa_merge_kstate states[PA_MERGE_STATES_MAX];
    pa_u64 out, out_lse; /* out_lse maybe 0 */
    pa_u64 out_rows;     /* maybe 0: i32 [rows] */
    pa_i64 rows, out_lse_seq;
    pa_i32 num_states, heads, head_dim;
    pa_i32 states_f32; /* 1: the states' o are f32 (the cascade's levels), else PA_DTYPE as out */
} pa_merge_kparams;

/* merge.cu: rows of q copied, and rotated where rot_cos is given: dst row r
 * is src row s = (row_map ? row_map[r] : r), rotated at position
 * pos[pos_index ? pos_index[s] : s]. */
typedef struct pa_rows_kparams {
    pa_u64 src, dst, row_map, rot_cos, rot_sin, pos, pos_index;
    pa_i64 rows;
    pa_i32 heads, head_dim, rotary_dim, rot_dtype, interleaved, pad;
} pa_rows_kparams;

#endif /* PA_EMBED_ONLY */
#endif /* PA_KERNEL_PARAMS_H */
