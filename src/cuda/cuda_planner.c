/*
 * cuda_planner.c -- the parts of a CUDA call (cuda_planner.h): a call's
 * sequences go to up to three kernel families (cuda_choice.c), decode maybe
 * split into long and short sequences, two launches; each part's kernel is
 * chosen up to three times as its work becomes known (plan_part); then the
 * parts' places in the work list, the rotary append's launch, and the
 * layout of the upload and the scratch. Why: docs/decode.md, docs/planner.md.
 */
#include "cuda_planner.h"

#include <stdlib.h>

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/* Whether sequence b is part pt's. */
static bool in_part(const pa_attn_problem *p, pa_kind_rules rules, const pa_plan_part *pt, int32_t b) {
    const int32_t sq = p->h_seqlen_q[b], sk = p->h_seqlen_k[b];
    return sq > 0 && pa_plan_kind_of(rules, sq) == pt->kind && sk >= pt->key_lo && (pt->key_hi == 0 || sk < pt->key_hi);
}

/* Whether `blocks` warp-a-tile blocks fill the GPU (`capacity` at once) well
 * enough: at least hw_min_waves hundredths of a wave, and for units that are
 * not short (the persistent blocks' otherwise) not a partial second wave,
 * 1.0-1.5 waves, which lose to the persistent blocks (docs/decode.md). */
static bool hw_waves_ok(const pa_cuda_tuning *t, int64_t blocks, int capacity, bool short_units) {
    const int64_t pct = blocks * 100 / (capacity > 0 ? capacity : 1);
    return pct >= t->decode_hw_min_waves && (short_units || pct <= 100 || pct >= 150);
}

static void plan_list(const pa_attn_problem *p, const pa_cuda_tuning *t, pa_plan_part *pt) {
    pa_plan_rule(p, &pt->kp, t, pt->tiles, pt->ntiles, &pt->rule);
    pt->nwork = pa_plan_items(p, &pt->kp, &pt->rule, pt->tiles, pt->ntiles, NULL, &pt->part_rows, &pt->ncounters);
}

/* Plans part pt (kind, key_lo, key_hi set): its kernel, query tiles and work count. */
static pa_status plan_part(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps,
                           const pa_cuda_tuning *t, const pa_cuda_kernels *k, pa_kind_rules rules, pa_plan_part *pt) {
    pa_situation s;
    memset(&s, 0, sizeof s);
    s.kind = pt->kind;
    s.pays = s.wide = -1;
    s.tma_fits = (int64_t)p->num_pages * p->page_size < ((int64_t)1 << 31);
    int64_t sum_keys = 0;
    for (int32_t b = 0; b < p->batch; b++)
        if (in_part(p, rules, pt, b)) {
            if (p->h_seqlen_q[b] > s.max_q) s.max_q = p->h_seqlen_q[b];
            s.nseq++;
            sum_keys += p->h_seqlen_k[b];
        }
    s.seq_keys = s.nseq > 0 ? sum_keys / s.nseq : 0;
    s.split = pt->key_lo > 0 ? 1 : pt->key_hi > 0 ? 2 : 0;
    s.allow_ws = true;
    pa_status st = pa_plan_kernel(ctx, p, caps, t, k, s, &pt->kp);
    if (st) return st;
    const int qt = pt->kp.q_tile;
    const int32_t min_keys = t->decode_persist_min_keys;
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
     * persistent decode blocks to one block a unit (the split fills one wave
     * and each block runs one unit). So do units shorter than
     * persist_min_keys on average: a persistent block fetches its next unit a
     * few stages before it needs it, which such units cannot cover; resident
     * blocks of their own overlap that chain. The query tile is the same. */
    const int64_t tiles = pt->ntiles * pt->kp.head_tiles;
    const bool short_units = tile_keys < pt->ntiles * (int64_t)min_keys;
    /* a warp a head tile (hw_fits) for short units and for units under
     * hw_max_keys on average, planned with the short units' kernel */
    const int64_t avg_keys = pt->ntiles > 0 && tile_keys >= pt->ntiles ? tile_keys / pt->ntiles : 1; /* (>= 1) */
    const bool candidate = pt->kp.persistent && !pt->kp.guided;
    const bool hw = candidate && t->decode_hw >= 1 && (short_units || avg_keys < t->decode_hw_max_keys) &&
                    pa_plan_hw_fits(p, &pt->kp);
    /* without hw: persistent blocks where the units are not short and fill more than a wave */
    const bool persist_kept = candidate && !short_units && tiles > pt->kp.grid_cap;
    if ((pt->kp.ws && !pt->kp.forced && tiles < pa_plan_capacity(p, t, pt->kp.capacity)) ||
        (candidate && (tiles <= pt->kp.grid_cap || short_units || hw))) {
        s.allow_ws = false;
        s.short_units = candidate && (short_units || hw);
        s.hw_keys = hw ? avg_keys : 0;
        st = pa_plan_kernel(ctx, p, caps, t, k, s, &pt->kp);
        if (st) return st;
        if (pt->kp.q_tile != qt) return pa_fail(ctx, PA_ERR_INTERNAL, "attention: query tiles differ");
    }
    pt->tiles = malloc(sizeof *pt->tiles * (size_t)(pt->ntiles ? pt->ntiles : 1));
    if (!pt->tiles) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    int64_t i = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        const int32_t sq = p->h_seqlen_q[b], sk = p->h_seqlen_k[b];
        if (!in_part(p, rules, pt, b)) continue;
        for (int32_t i0 = 0; i0 < sq; i0 += qt) {
            const int32_t last = (i0 + qt < sq ? i0 + qt : sq) - 1;
            int32_t lo0, hi0, lo1, hi1;
            pa_mask_range(p, sq, sk, i0, &lo0, &hi0);
            pa_mask_range(p, sq, sk, last, &lo1, &hi1);
            pa_tile_range tr = {b, i0, lo0 < lo1 ? lo0 : lo1, hi0 > hi1 ? hi0 : hi1};
            if (tr.hi < tr.lo) tr.hi = tr.lo;
            pt->tiles[i++] = tr;
        }
    }
    plan_list(p, t, pt);
    /* a warp a head tile only on unsplit items (a split writes partials) and
     * where its blocks fill enough of the GPU (hw_waves_ok; decode_hw 2 also
     * where not): else what the part runs without it */
    if (pt->kp.hw && (pt->part_rows > 0 || pt->rule.claims ||
                      (t->decode_hw < 2 &&
                       !hw_waves_ok(t, pt->nwork * pt->kp.head_tiles / 4, pt->kp.capacity, short_units)))) {
        s.allow_ws = persist_kept;
        s.short_units = short_units;
        s.hw_keys = 0;
        st = pa_plan_kernel(ctx, p, caps, t, k, s, &pt->kp);
        if (st) return st;
        plan_list(p, t, pt);
    }
    if (pt->nwork * pt->kp.head_tiles > INT32_MAX)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: %lld blocks exceed the grid limit",
                       (long long)(pt->nwork * pt->kp.head_tiles));
    return PA_OK;
}

/* Decode of short and long sequences in one call: the persistent blocks
 * wait on each short unit's chain, and the short units' kernel runs a long
 * unit whole in one block. Where the plan of the whole part is either kernel
 * and at least a wave of units belongs to sequences under persist_min_keys
 * while others are longer, the long and the short sequences are two parts,
 * two launches (docs/decode.md). */
static bool split_short(const pa_cuda_tuning *t, const pa_plan_part *pt) {
    return pt->kind == PA_PART_DECODE && (pt->kp.persistent || pt->kp.short_kernel) && t->decode_split_short == 1 &&
           pt->short_tiles < pt->ntiles && pt->short_tiles * pt->kp.head_tiles >= pt->kp.capacity;
}

/* Whether the append kernel's new tokens take its 16-byte path, as the
 * kernel's new8_ok decides for a warp of `per` kv heads (append.cu): then
 * pa_append_new8, else pa_append. */
static bool append_new8(const pa_attn_problem *p, int per) {
    const int D = p->head_dim, rd = p->rotary_dim, il = p->rotary_interleaved;
    const uintptr_t bases = (uintptr_t)p->k_new | (uintptr_t)p->v_new | (uintptr_t)p->k_cache | (uintptr_t)p->v_cache;
    if (p->total_new <= 0 || p->dtype == PA_F32 || D % 8 != 0 || (bases & 15) != 0) return false;
    if (!p->rotary_cos) return true;
    return PA_APPEND_ROWS8_RD(rd, il) && PA_APPEND_ROWS8_ITEMS(per, D, rd, il) >= PA_APPEND_ROWS8_MIN;
}

/* The rotary append's launch: a warp a token (all its heads' rows); few
 * tokens: `split` warps a token, each a share of its heads, up to a warp a
 * head, until the warps would fill the SMs (32 resident a SM). */
static pa_status plan_append(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps, pa_cuda_plan *plan) {
    const int64_t q_rows = plan->rotate_q ? p->total_q : 0, tokens = p->total_new + q_rows;
    const int cap = p->total_new > 0 ? p->kv_heads : p->heads;
    int split = 1;
    while (split < cap && tokens * split < (int64_t)caps->sm_count * 32) split *= 2;
    plan->append_split = split < cap ? split : cap;
    plan->append_grid = (tokens * plan->append_split + 7) / 8; /* 8 warps a block */
    if (plan->append_grid > INT32_MAX)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "append: %lld tokens are too many", (long long)tokens);
    plan->append_new8 = append_new8(p, (p->kv_heads + plan->append_split - 1) / plan->append_split);
    /* as many new tokens (queries) in every sequence, in order: the kernel
     * finds a token's sequence by a division, not a search (0: not so) */
    const int32_t B = p->batch;
    int32_t new_per_seq = B > 0 ? p->h_num_new[0] : 0, q_per_seq = B > 0 ? p->h_seqlen_q[0] : 0;
    bool new_dense = true; /* each sequence's new rows right after the last one's */
    int64_t new_prefix = 0;
    for (int32_t b = 0; b < B; b++) {
        if (p->h_num_new[b] > 0 && p->h_new_start_row[b] != new_prefix) new_dense = false;
        new_prefix += p->h_num_new[b];
        if (p->h_num_new[b] != new_per_seq) new_per_seq = 0;
        if (p->h_seqlen_q[b] != q_per_seq || p->h_q_start[b] != (int64_t)b * q_per_seq) q_per_seq = 0;
    }
    plan->new_per_seq = new_per_seq;
    plan->q_per_seq = plan->rotate_q ? q_per_seq : 0;
    plan->new_dense = new_dense;
    return PA_OK;
}

void pa_cuda_plan_free(pa_cuda_plan *plan) {
    for (int i = 0; i < plan->nparts; i++) free(plan->parts[i].tiles);
    free(plan->order_scratch);
    memset(plan, 0, sizeof *plan);
}

/* The parts: one for each kernel kind some sequence needs (decode: two where
 * short and long sequences are mixed, split_short), with their places in the
 * call's work list, partial rows, counters and lists. */
static pa_status plan_parts(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps,
                            const pa_cuda_tuning *t, const pa_cuda_kernels *k, pa_cuda_plan *plan) {
    const pa_kind_rules rules = pa_plan_kind_rules(p, t);
    bool used[3] = {false, false, false};
    for (int32_t b = 0; b < p->batch; b++)
        if (p->h_seqlen_q[b] > 0) used[pa_plan_kind_of(rules, p->h_seqlen_q[b])] = true;
    for (int kind = 0; kind < 3; kind++) {
        if (!used[kind]) continue;
        pa_plan_part *pt = &plan->parts[plan->nparts++];
        pt->kind = (pa_part_kind)kind;
        pa_status st = plan_part(ctx, p, caps, t, k, rules, pt);
        if (st == PA_OK && split_short(t, pt)) {
            /* this part: the long sequences; the next: the short ones */
            free(pt->tiles);
            memset(pt, 0, sizeof *pt);
            pt->kind = PA_PART_DECODE;
            pt->key_lo = t->decode_persist_min_keys;
            st = plan_part(ctx, p, caps, t, k, rules, pt);
            pa_plan_part *sp = &plan->parts[plan->nparts++];
            sp->kind = PA_PART_DECODE;
            sp->key_hi = t->decode_persist_min_keys;
            if (st == PA_OK) st = plan_part(ctx, p, caps, t, k, rules, sp);
        }
        if (st) return st;
    }
    size_t order_max = 0;
    for (int i = 0; i < plan->nparts; i++) {
        pa_plan_part *pt = &plan->parts[i];
        pa_kernel_plan *kp = &pt->kp;
        pt->work0 = plan->nwork;
        pt->rows0 = plan->part_rows;
        pt->counters0 = plan->ncounters;
        pt->boxes0 = -1;
        if (kp->ws && kp->tma_rows > 0 && p->paged && t->prefill_first_boxes) {
            pt->boxes0 = plan->nboxed;
            plan->nboxed += pt->nwork;
        }
        pt->pages0 = -1;
        if (kp->first_pages) {
            /* the items whose units the blocks run first (at most 1024 of
             * them where each block runs one: 64 KB of the plan) */
            int64_t first_units = pt->nwork * kp->head_tiles;
            const int64_t first_cap = (int64_t)kp->grid_cap * (kp->hw ? 4 : 1);
            if (kp->persistent && first_units > first_cap) first_units = first_cap;
            pt->npaged = (first_units + kp->head_tiles - 1) / kp->head_tiles;
            if (pt->npaged > 1024) pt->npaged = 1024;
            pt->pages0 = plan->npaged;
            plan->npaged += pt->npaged;
        }
        plan->nwork += pt->nwork;
        plan->part_rows += pt->part_rows;
        plan->ncounters += pt->ncounters + (kp->persistent ? 1 : 0); /* the last: its unit counter */
        /* the grid: the work items times their head tiles (four a warp-a-tile
         * block); persistent blocks each take units until none are left */
        pt->blocks = pt->nwork * kp->head_tiles / (kp->hw ? 4 : 1);
        if (kp->persistent && pt->blocks > kp->grid_cap) pt->blocks = kp->grid_cap;
        /* a split call's short sequences start while the long ones' blocks
         * end: launched programmatically after them, they take the SMs the
         * persistent blocks leave (sm_90+) */
        pt->overlap = i > 0 && pt->key_hi > 0 && plan->parts[i - 1].nwork > 0 && caps->cc_major >= 9 &&
                      caps->launch_ex && t->decode_overlap == 1;
        if ((pt->rule.claims && t->decode_claim_order == 1) || (kp->ws && t->prefill_order)) {
            const size_t need = pa_plan_order_scratch(pt->nwork, p->batch);
            if (need > order_max) order_max = need;
        }
    }
    plan->claim_order = t->decode_claim_order == 1;
    plan->ws_order = t->prefill_order != 0;
    if (order_max > 0 && !(plan->order_scratch = malloc(order_max)))
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    return PA_OK;
}

pa_status pa_cuda_plan_make(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps,
                            const pa_cuda_tuning *t, const pa_cuda_kernels *k, pa_cuda_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->attend = p->total_q > 0;
    plan->rotate_q = p->rotary_cos != NULL && plan->attend;
    plan->append = p->total_new > 0 || plan->rotate_q;
    pa_status st = plan->attend ? plan_parts(ctx, p, caps, t, k, plan) : PA_OK;
    if (st == PA_OK && plan->append) st = plan_append(ctx, p, caps, plan);
    if (st) {
        pa_cuda_plan_free(plan);
        return st;
    }
    /* the upload and the scratch */
    const int64_t H = p->heads, D = p->head_dim;
    const size_t meta_bytes = sizeof(pa_seq_meta) * (size_t)p->batch;
    plan->work_off = ALIGN_UP(meta_bytes, 256);
    plan->boxes_off = ALIGN_UP(plan->work_off + sizeof(pa_work) * (size_t)plan->nwork, 256);
    plan->pages_off = ALIGN_UP(plan->boxes_off + sizeof(int32_t) * PA_WS_BOXES * (size_t)plan->nboxed, 256);
    plan->upload_bytes = plan->pages_off + sizeof(int32_t) * PA_DECODE_FIRST_PAGES * (size_t)plan->npaged;
    plan->part_o_off = 0;
    plan->part_lse_off = plan->part_o_off + ALIGN_UP((size_t)plan->part_rows * H * D * 4, 256);
    plan->q_rot_off = plan->part_lse_off + ALIGN_UP((size_t)plan->part_rows * H * 4, 256);
    plan->scratch_bytes = plan->q_rot_off + (plan->rotate_q ? (size_t)p->total_q * H * D * 4 : 0);
    return PA_OK;
}

