/*
 * cuda_worklist.c -- a part's query tiles cut into work items (sequence,
 * query tile, key range; launched times the head tiles), their launch order,
 * the lists the host writes beside them, and the upload of a whole plan.
 * Pure host code (cuda_planner.h). Why the work is cut and ordered so:
 * docs/planner.md.
 */
#include "cuda_planner.h"

#include <stdlib.h>

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
#define MAX_SPLITS 1024

/* The next piece of a key range with `rem` keys left, when `left` keys (x
 * head tiles) of the whole list are not cut yet: about left / div, a
 * multiple of `align`, at least `cmin`, at most `cap` (0: no bound), and the
 * whole rest when what would remain is under half a piece. */
static int64_t guided_piece(int64_t rem, int64_t left, int64_t div, int64_t cmin, int64_t align, int64_t cap) {
    int64_t c = ALIGN_UP(left / div, align);
    if (c < cmin) c = cmin;
    if (cap > 0 && c > cap) c = cap;
    if (rem - c < c / 2 && (cap == 0 || rem <= cap)) c = rem;
    return c < rem ? c : rem;
}

/* The pieces of c keys (c >= 1) that a range of len keys takes: at least
 * one. Asked of every query tile several times a plan, so without a division
 * where the range fits one piece and in 32 bits otherwise (64-bit divisions
 * dominated the host's time of short-sequence calls: docs/planner.md). */
static inline int64_t pieces(int64_t len, int64_t c) {
    if (len <= c) return 1;
    if (((uint64_t)len | (uint64_t)c) <= UINT32_MAX) return (int64_t)(((uint32_t)len - 1u) / (uint32_t)c) + 1;
    return (len - 1) / c + 1;
}

/* The split length every query tile of a plan starts from: forced
 * (split_chunk) or the plan's auto_chunk, a multiple of the kernel's stage;
 * 0 where it depends on the tile (no_split, num_splits). */
static int64_t base_chunk(const pa_attn_problem *p, const pa_kernel_plan *kp, int64_t forced_chunk,
                          int64_t auto_chunk) {
    if (kp->no_split || (forced_chunk <= 0 && p->num_splits > 0)) return 0;
    const int64_t c = ALIGN_UP(forced_chunk > 0 ? forced_chunk : auto_chunk, kp->tokens);
    return c < 1 ? 1 : c;
}

/* A query tile's split length (the guided pieces aside), for a tile of len
 * keys: forced, from the problem's num_splits, or the plan's (base); a
 * multiple of the kernel's stage, under the page-id cap. */
static int64_t tile_chunk(const pa_attn_problem *p, const pa_kernel_plan *kp, int64_t len, int64_t base) {
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
        /* as many pieces as the page-id cap needs, of equal length (a capped
         * piece and a short rest leave the blocks unequal work) */
        const int64_t k = len > 0 ? (len + kp->max_chunk - 1) / kp->max_chunk : 1;
        chunk = ALIGN_UP((len + k - 1) / k, kp->tokens);
        if (chunk > kp->max_chunk) chunk = kp->max_chunk;
    }
    return chunk < 1 ? 1 : chunk;
}

/* Splits: where the tiles alone give fewer blocks than the GPU holds at once,
 * into about one wave of equal blocks; beyond a wave (decode), where splitting
 * fills the last wave better. Every block pays a start-up and a merge, so
 * fewer, longer blocks win whenever there are enough of them. Claims: where
 * kp->claim and every split tile has claim_stages stages for each split;
 * split s of a tile [lo, hi) is then the item [lo + s * claim_stages stages,
 * hi), whose block runs its static stages and then claims stages from
 * lo + nsplit * claim_stages stages on, with a claim counter after the
 * tile's arrival counters. */
void pa_plan_rule(const pa_attn_problem *p, const pa_kernel_plan *kp, const pa_cuda_tuning *t,
                  const pa_tile_range *tiles, int64_t ntiles, pa_work_rule *r) {
    int64_t total_len = 0, max_len = 0;
    for (int64_t i = 0; i < ntiles; i++) {
        const int64_t len = tiles[i].hi - tiles[i].lo;
        total_len += len;
        if (len > max_len) max_len = len;
    }
    const int64_t forced_chunk = t->split_chunk;
    const double waves = t->split_waves;
    int64_t auto_chunk = max_len > 0 ? max_len : 1;
    /* Guided (decode): blocks take the units in list order, so the list is
     * cut into pieces of about 1 / (guide x capacity) of the keys (x head
     * tiles) not yet cut: long pieces while much work remains, short ones at
     * the end, so that the blocks end within a short piece of each other. */
    const bool guided = kp->guided && p->num_splits == 0 && forced_chunk == 0 && total_len > 0;
    /* (persistent blocks: 512 keys, the least that loads the next unit without waiting) */
    const int64_t gmin =
        ALIGN_UP(t->decode_min_chunk > 0 ? (int64_t)t->decode_min_chunk : kp->persistent ? 512 : 256, kp->tokens);
    const int64_t gdiv = (int64_t)t->decode_guide * kp->capacity;
    const int64_t capacity = pa_plan_capacity(p, t, kp->capacity);
    if (!guided && p->num_splits == 0 && forced_chunk == 0 && total_len > 0 && ntiles * kp->head_tiles < capacity) {
        /* the shortest chunk whose blocks still fit the wave(s) */
        const double budget = waves * (double)capacity;
        for (int k = 2; k <= MAX_SPLITS; k++) {
            int64_t c = ALIGN_UP((max_len + k - 1) / k, kp->tokens);
            int64_t blocks = 0;
            for (int64_t i = 0; i < ntiles; i++) blocks += pieces(tiles[i].hi - tiles[i].lo, c) * kp->head_tiles;
            if ((double)blocks > budget) break;
            auto_chunk = c;
            if (c <= kp->tokens) break;
        }
    } else if (p->num_splits == 0 && forced_chunk == 0 && total_len > 0 && kp->tail_splits) {
        /* More than a wave: the last wave may run nearly empty. Model the
         * time of k splits as waves x (chunk + start-up), the start-up
         * counted as TAIL_STARTUP keys, and take the best k (1 unless
         * splitting fills waves better). */
        enum { TAIL_STARTUP = 128, TAIL_MAX_SPLITS = 8 };
        double best = -1.0;
        int64_t prev_c = 0;
        for (int k = 1; k <= TAIL_MAX_SPLITS; k++) {
            const int64_t c = ALIGN_UP((max_len + k - 1) / k, kp->tokens);
            if (k > 1 && c >= prev_c) break; /* no shorter than k - 1 splits */
            prev_c = c;
            /* k splits cost at least (keys x head tiles) / (c x capacity)
             * waves of c + start-up, a bound that grows with k: once it
             * reaches the best, no k does better */
            const double keys_ht = (double)total_len * (double)kp->head_tiles;
            if (best >= 0.0 && keys_ht * (double)(c + TAIL_STARTUP) / ((double)c * kp->capacity) >= best + 0.5) break;
            int64_t blocks = 0;
            for (int64_t i = 0; i < ntiles; i++) blocks += pieces(tiles[i].hi - tiles[i].lo, c) * kp->head_tiles;
            const int64_t nwaves = (blocks + kp->capacity - 1) / kp->capacity;
            const double cost = (double)nwaves * (double)(c + TAIL_STARTUP);
            if (best < 0.0 || cost < best) {
                best = cost;
                auto_chunk = c;
            }
            if (c <= kp->tokens) break;
        }
    }
    /* claims where every split of a split tile has claim_min keys and its
     * static stages (the claims' lead) */
    const int64_t claim_min = t->decode_claim_min;
    const int64_t claim_keys = (int64_t)kp->claim_stages * kp->tokens;
    const int64_t base = base_chunk(p, kp, forced_chunk, auto_chunk);
    bool claims = kp->claim && !guided, any_split = false;
    for (int64_t i = 0; claims && i < ntiles; i++) {
        const int64_t len = tiles[i].hi - tiles[i].lo;
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

int64_t pa_plan_items(const pa_attn_problem *p, const pa_kernel_plan *kp, const pa_work_rule *r,
                      const pa_tile_range *tiles, int64_t ntiles, pa_work *items, int64_t *part_rows,
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
            const int64_t piece = guided && len > 0
                                      ? guided_piece(tiles[t].hi - pos, left, gdiv, gmin, kp->tokens, kp->max_chunk)
                                      : chunk;
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

/* ---- order ---- */

static int by_length_desc(const void *a, const void *b) {
    const pa_work *x = a, *y = b;
    const int32_t lx = x->k1 - x->k0, ly = y->k1 - y->k0;
    return lx < ly ? 1 : lx > ly ? -1 : 0;
}

/* prefill_ws's order: whole sequences, the one with the longest item first,
 * each sequence's items longest first: the blocks resident at one time then
 * read the K/V of few sequences (docs/prefill.md: L2 hits 74 -> 86 % at
 * 4 x 2048), and the last blocks are still short ones. */
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

size_t pa_plan_order_scratch(int64_t nwork, int32_t batch) {
    const size_t n = (size_t)(nwork > 0 ? nwork : 1);
    return n * (sizeof(pa_work) + sizeof(order_key)) + (n + 2) * sizeof(int64_t) + (size_t)batch * sizeof(int32_t) +
           64;
}

static void order_by_sequence(const pa_attn_problem *p, pa_work *items, int64_t n, void *scratch) {
    pa_work *tmp = scratch;
    order_key *keys = (order_key *)(tmp + (n ? n : 1));
    int32_t *seq_len = (int32_t *)(keys + (n ? n : 1));
    memset(seq_len, 0, sizeof *seq_len * (size_t)p->batch);
    for (int64_t i = 0; i < n; i++) {
        const int32_t len = items[i].k1 - items[i].k0;
        if (len > seq_len[items[i].b]) seq_len[items[i].b] = len;
    }
    for (int64_t i = 0; i < n; i++) keys[i] = (order_key){seq_len[items[i].b], items[i].b, items[i].k1 - items[i].k0, i};
    qsort(keys, (size_t)n, sizeof *keys, by_sequence_then_length);
    for (int64_t i = 0; i < n; i++) tmp[i] = items[keys[i].at];
    memcpy(items, tmp, sizeof *items * (size_t)n);
}

/* Split-major: the blocks that share a tile's claims launch a grid / nsplit
 * apart, not next to each other (likely on one GPC, whose SMs stream alike;
 * docs/decode.md). */
static void order_split_major(pa_work *items, int64_t n, void *scratch) {
    int32_t nsplit = 1;
    for (int64_t i = 0; i < n; i++)
        if (items[i].nsplit > nsplit) nsplit = items[i].nsplit;
    pa_work *copy = scratch;
    int64_t *at = (int64_t *)(copy + (n ? n : 1));
    memset(at, 0, sizeof *at * ((size_t)nsplit + 1));
    memcpy(copy, items, sizeof *copy * (size_t)n);
    for (int64_t i = 0; i < n; i++) at[copy[i].split + 1]++;
    for (int32_t sp = 0; sp < nsplit; sp++) at[sp + 1] += at[sp];
    for (int64_t i = 0; i < n; i++) items[at[copy[i].split]++] = copy[i];
}

void pa_plan_order(const pa_attn_problem *p, const pa_plan_part *pt, bool claim_order, bool ws_order, void *scratch,
                   pa_work *items) {
    int64_t rows, counters;
    pa_plan_items(p, &pt->kp, &pt->rule, pt->tiles, pt->ntiles, items, &rows, &counters);
    for (int64_t i = 0; i < pt->nwork; i++) {
        items[i].part_row += pt->rows0;
        items[i].counter += (int32_t)pt->counters0;
    }
    if (pt->rule.claims && claim_order) order_split_major(items, pt->nwork, scratch);
    if (pt->kp.ws && ws_order) {
        order_by_sequence(p, items, pt->nwork, scratch);
        return;
    }
    if (pt->kp.longest_first) qsort(items, (size_t)pt->nwork, sizeof *items, by_length_desc);
}

/* prefill_ws with TMA boxes of a paged cache: each work item's first K/V
 * tile's box rows (page * page_size + slot, one a box: PA_WS_BOXES at most),
 * so that the producer issues the first boxes without waiting for the block
 * table; from the host's block table; unused boxes 0. */
void pa_plan_first_boxes(const pa_attn_problem *p, const pa_plan_part *pt, const pa_work *items, int32_t *rows) {
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
 * pt->npaged work items' key ranges (those a block runs first), from the
 * host's block table; past an item's last page 0. A block then issues its
 * first stages as soon as its work item is there. */
void pa_plan_first_pages(const pa_attn_problem *p, const pa_plan_part *pt, const pa_work *items, int32_t *ids) {
    const int ps = p->page_size;
    for (int64_t i = 0; i < pt->npaged; i++) {
        const pa_work *w = &items[i];
        const int32_t *bt = p->h_block_table + (int64_t)w->b * p->bt_stride;
        const int32_t first = w->k0 / ps, last = w->k1 > w->k0 ? (w->k1 - 1) / ps : first - 1;
        for (int j = 0; j < PA_DECODE_FIRST_PAGES; j++)
            ids[i * PA_DECODE_FIRST_PAGES + j] = first + j <= last ? bt[first + j] : 0;
    }
}

/* ---- the upload ---- */

void pa_cuda_plan_write(const pa_attn_problem *p, const pa_cuda_plan *plan, void *host) {
    pa_seq_meta *meta = host;
    int64_t new_prefix = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        pa_seq_meta *mb = &meta[b];
        memset(mb, 0, sizeof *mb);
        mb->q_start = p->h_q_start[b];
        mb->new_row = p->h_new_start_row[b];
        mb->new_prefix = new_prefix;
        new_prefix += p->h_num_new[b];
        mb->append_pos = p->h_append_pos[b];
        mb->cache_row = p->paged ? 0 : (p->h_cache_batch_idx ? p->h_cache_batch_idx[b] : b);
    }
    for (int i = 0; i < plan->nparts; i++) {
        const pa_plan_part *pt = &plan->parts[i];
        pa_work *items = (pa_work *)((char *)host + plan->work_off) + pt->work0;
        pa_plan_order(p, pt, plan->claim_order, plan->ws_order, plan->order_scratch, items);
        if (pt->boxes0 >= 0)
            pa_plan_first_boxes(p, pt, items, (int32_t *)((char *)host + plan->boxes_off) + pt->boxes0 * PA_WS_BOXES);
        if (pt->pages0 >= 0)
            pa_plan_first_pages(p, pt, items,
                                (int32_t *)((char *)host + plan->pages_off) + pt->pages0 * PA_DECODE_FIRST_PAGES);
    }
}
