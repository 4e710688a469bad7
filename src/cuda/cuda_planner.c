/*
 * cuda_planner.c -- kernel choice and the parts of a call (cuda_planner.h).
 *
 * A call's sequences go to up to three kernel families: those with few
 * queries (the decode kernels' nq) to decode_mma (tensor cores) or decode.cu,
 * longer ones to prefill_ws / prefill_wgmma (Hopper) or prefill.cu
 * (mma.sync), else fallback.cu; decode may split into long and short
 * sequences, two launches. Each part's kernel is chosen up to three times as
 * its work becomes known (plan_part). What the kernels allow comes from the
 * variant table (cuda_variants.c); why each default is what it is:
 * docs/decode.md, docs/prefill.md, docs/planner.md.
 */
#include "cuda_planner.h"

#include <stdio.h>
#include <stdlib.h>

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/* The page ids a decode block holds: two slots of 768 in persistent blocks
 * (the next unit's load overlaps the current one), else 1024. */
#define DECODE_MAXP 1024
#define DECODE_MAXP_PERSIST 768

/* What the problem allows, decided once per call. */
typedef struct kind_rules {
    bool decode, prefill;
    int32_t decode_max_q; /* the decode kernels' queries a tile at most */
} kind_rules;

static kind_rules rules_of(const pa_attn_problem *p, const pa_cuda_tuning *t) {
    pa_variant d = pa_variant_of(PA_VK_DECODE), f = pa_variant_of(PA_VK_PREFILL);
    pa_variant_set(pa_variant_set(&d, PA_KEY_DTYPE, p->dtype), PA_KEY_D, p->head_dim);
    pa_variant_set(pa_variant_set(&f, PA_KEY_DTYPE, p->dtype), PA_KEY_D, p->head_dim);
    kind_rules k = {pa_variant_allows(&d) && !t->fallback, pa_variant_allows(&f) && !t->fallback,
                    pa_variant_key_max(PA_VK_DECODE, PA_KEY_NQ)};
    return k;
}
static pa_part_kind kind_of(kind_rules k, int32_t seqlen_q) {
    if (seqlen_q <= k.decode_max_q && k.decode) return PA_PART_DECODE;
    return k.prefill ? PA_PART_PREFILL : PA_PART_FALLBACK;
}

/* Whether warp-a-tile decode blocks of kpw keys a warp, `stages` stages and
 * minb blocks a SM pay as persistent blocks (a block takes its next unit of
 * four head tiles from a counter and loads it while the current one
 * streams): at 16 keys a warp, on units of at least PREP_STAGES stages
 * (which load the next unit without waiting), in at least two blocks' worth
 * of units a block slot, and not for a split call's short sequences (whose
 * blocks start as the long ones end). Measured shapes: docs/decode.md,
 * spec/planner_check.c. */
bool pa_hw_persist_pays(int kpw, int stages, int minb, int split, int64_t avg_keys, int64_t blocks, int sm_count) {
    return kpw == 16 && split != 2 && avg_keys >= (int64_t)PA_DECODE_PREP_STAGES(stages) * kpw &&
           blocks >= 2 * (int64_t)minb * sm_count;
}

/* The situation a kernel is chosen for. allow_ws: the warp-specialised
 * prefill or the persistent decode blocks may be chosen (the query tiles fill
 * the GPU). short_units (decode, one block a unit): the units are short, so
 * the blocks a SM count more than the stages a block; hw_keys > 0: and each
 * warp takes a head tile of its own, the units averaging that many keys.
 * nseq, seq_keys: the part's sequences and their average keys; split: 0 a
 * call's only decode part, 1 the long sequences of a split call, 2 its short
 * ones. pays / wide >= 0 force those two decisions (the enumeration of
 * pa_cuda_plan_variants); -1: from the numbers. */
typedef struct situation {
    pa_part_kind kind;
    int32_t max_q;
    bool allow_ws, short_units;
    int64_t hw_keys, nseq, seq_keys;
    int split;
    int pays, wide;
    bool tma_fits; /* prefill: the cache's rows are int32 TMA coordinates */
} situation;

/* The variant for a situation and the flags of its plan (kp; no launch facts yet). */
static void choose(const pa_attn_problem *p, const pa_cuda_caps *caps, const pa_cuda_tuning *t, const situation *s,
                   pa_variant *v, pa_kernel_plan *kp) {
    const int D = p->head_dim, G = p->group;
    const int32_t page = pa_variant_page_key(p->paged, p->page_size);
    memset(kp, 0, sizeof *kp);
    if (s->kind == PA_PART_DECODE) {
        pa_variant m = pa_variant_of(PA_VK_DECODE_MMA);
        pa_variant_set(pa_variant_set(&m, PA_KEY_DTYPE, p->dtype), PA_KEY_D, D);
        const bool mma = pa_variant_allows(&m) && t->decode_kernel != 1;
        const pa_vkind vk = mma ? PA_VK_DECODE_MMA : PA_VK_DECODE;
        int nq = 1;
        while (nq < s->max_q) nq *= 2;
        /* the heads of a GQA group share a tile, as many as its rows take */
        int gt = 1;
        for (int d = 1; d <= G; d++) {
            pa_variant r = pa_variant_of(vk);
            pa_variant_set(pa_variant_set(&r, PA_KEY_NQ, nq), PA_KEY_GT, d);
            if (!pa_variant_allows(&r)) break;
            if (G % d == 0) gt = d;
        }
        /* keys a warp and stage: the tuning's where the head dim takes 16 */
        pa_variant k16 = pa_variant_of(PA_VK_DECODE_MMA);
        pa_variant_set(pa_variant_set(&k16, PA_KEY_D, D), PA_KEY_KPW, 16);
        const bool kpw16_ok = pa_variant_allows(&k16);
        int kpw = kpw16_ok ? t->decode_kpw : 8;
        int stages = t->decode_stages > 0 ? t->decode_stages : kpw == 16 ? 3 : 4;
        int minb = 1;
        kp->short_kernel = mma && s->short_units;
        if (mma && s->short_units) {
            /* short units: each block runs one unit's whole chain, so more
             * resident blocks overlap more chains (8 keys a warp, three
             * blocks a SM); a warp a head tile over units of 96 keys or more
             * streams enough to take 16 keys a warp (two blocks a SM) */
            const int kpw_dflt = s->hw_keys >= 96 ? 16 : 8;
            kpw = kpw16_ok && (t->decode_short_kpw > 0 ? t->decode_short_kpw : kpw_dflt) >= 16 ? 16 : 8;
            stages = t->decode_short_stages;
            minb = t->decode_short_minb > 0 ? t->decode_short_minb : kpw == 16 ? 2 : 3;
        }
        pa_variant pv = pa_variant_of(PA_VK_DECODE_MMA);
        pa_variant_set(pa_variant_set(pa_variant_set(&pv, PA_KEY_KPW, kpw), PA_KEY_PERSIST, 1), PA_KEY_HW, 0);
        const bool persist_long = mma && pa_variant_allows(&pv) && s->allow_ws && t->decode_persist == 1;
        /* a warp a head tile in persistent blocks too, where that pays */
        const bool hw = mma && s->short_units && s->hw_keys > 0;
        const int head_tiles = p->kv_heads * (G / gt);
        const bool hw_pays = s->pays >= 0 ? kpw == 16 && s->pays == 1
                                          : pa_hw_persist_pays(kpw, stages, minb, s->split, s->hw_keys,
                                                               s->nseq * head_tiles / 4, caps->sm_count);
        const bool persist =
            persist_long || (hw && t->decode_persist == 1 &&
                             (t->decode_hw_persist == 2 || (t->decode_hw_persist == 1 && hw_pays)));
        kp->persistent = persist;
        kp->guided = t->decode_guided == 1;
        kp->tail_splits = !kp->guided;
        kp->first_pages = mma && p->paged && t->decode_first_pages == 1;
        kp->longest_first = kp->guided;
        /* one block a unit, paged caches: the splits of a query tile claim
         * its keys past their static stages (contiguous caches keep their
         * fixed ranges: claiming measured slower there) */
        kp->claim = mma && !persist_long && !kp->guided && p->paged && stages <= PA_DECODE_CLAIM_MAX_STAGES &&
                    t->decode_claim >= 1;
        kp->claim_stages = PA_DECODE_CLAIM_STATIC(stages);
        kp->hw = hw;
        /* eight warps a block, one block a SM, where the sequences are long
         * and few units a SM (a block runs a unit in half the time, so their
         * last units end closer together); never for a split call's long
         * sequences that fill under two blocks of four a SM (their ends leave
         * room for the short sequences' kernel) */
        const int64_t units = s->nseq * head_tiles;
        bool nw8 = false;
        if (persist_long && s->wide >= 0) {
            nw8 = s->wide == 1;
        } else if (persist_long && !(s->split == 1 && units <= 2 * (int64_t)caps->sm_count)) {
            const int64_t max_units = (int64_t)t->decode_wide_max_units * caps->sm_count;
            nw8 = t->decode_wide == 2 ||
                  (t->decode_wide == 1 && s->seq_keys >= t->decode_wide_min_keys && units <= max_units);
        }
        *v = pa_variant_of(vk);
        pa_variant_set(v, PA_KEY_DTYPE, p->dtype);
        pa_variant_set(v, PA_KEY_D, D);
        pa_variant_set(v, PA_KEY_NQ, nq);
        pa_variant_set(v, PA_KEY_GT, gt);
        pa_variant_set(v, PA_KEY_PAGE, page);
        pa_variant_set(v, PA_KEY_STAGES, stages);
        if (mma) {
            pa_variant_set(v, PA_KEY_MAXP, persist ? DECODE_MAXP_PERSIST : DECODE_MAXP);
            pa_variant_set(v, PA_KEY_KPW, kpw);
            pa_variant_set(v, PA_KEY_PERSIST, persist ? 1 : 0);
            pa_variant_set(v, PA_KEY_MINB, minb);
            pa_variant_set(v, PA_KEY_HW, hw ? 1 : 0);
            pa_variant_set(v, PA_KEY_NW, nw8 ? 8 : 4);
        } else {
            pa_variant_set(v, PA_KEY_MAXP, DECODE_MAXP);
        }
        kp->gt = gt;
        kp->q_tile = nq;
        kp->head_tiles = head_tiles;
    } else if (s->kind == PA_PART_PREFILL) {
        int gt = 1;
        for (int d = 1; d <= G; d++) {
            pa_variant r = pa_variant_of(PA_VK_PREFILL);
            if (!pa_variant_allows(pa_variant_set(&r, PA_KEY_GT, d))) break;
            if (G % d == 0) gt = d;
        }
        const int natural = p->softcap > 0.f || p->alibi != NULL || !(p->scale > 0.f);
        /* Hopper: the warp-specialised kernel where its producer loads K/V by
         * TMA and the query tiles fill the GPU (it does not split: allow_ws),
         * else wgmma, which splits and gathers with all its threads; TMA
         * where the pages hold 16 rows or more (or the cache is contiguous),
         * paged caches a box a page of all its columns (tma=2) */
        const int force = t->prefill_kernel;
        pa_variant h = pa_variant_of(PA_VK_PREFILL_WGMMA);
        pa_variant_set(pa_variant_set(&h, PA_KEY_DTYPE, p->dtype), PA_KEY_D, D);
        const bool hopper = caps->sm90a && pa_variant_allows(&h);
        pa_variant tv = pa_variant_of(PA_VK_PREFILL_WS);
        pa_variant_set(pa_variant_set(&tv, PA_KEY_PAGE, page), PA_KEY_TMA, 1);
        const bool tma = hopper && caps->tma && t->prefill_tma && pa_variant_allows(&tv) && s->tma_fits;
        const bool ws = hopper && (force ? force == 1 : s->allow_ws && tma);
        const bool wgmma = hopper && !ws && force != 3;
        *v = pa_variant_of(ws ? PA_VK_PREFILL_WS : wgmma ? PA_VK_PREFILL_WGMMA : PA_VK_PREFILL);
        pa_variant_set(v, PA_KEY_DTYPE, p->dtype);
        pa_variant_set(v, PA_KEY_D, D);
        pa_variant_set(v, PA_KEY_GT, gt);
        pa_variant_set(v, PA_KEY_PAGE, page);
        /* stages: the tuning's within what the kernel holds at this head dim */
        const int dflt = ws ? (D <= 128 ? 3 : 2) : wgmma ? 3 : 2;
        pa_variant sv = pa_variant_of(v->kind);
        pa_variant_set(&sv, PA_KEY_D, D);
        pa_variant_set(v, PA_KEY_STAGES, t->prefill_stages > 0 ? pa_variant_clamp(&sv, PA_KEY_STAGES, t->prefill_stages)
                                                                : dflt);
        pa_variant_set(v, PA_KEY_NATURAL, natural);
        if (ws) {
            pa_variant bv = pa_variant_of(PA_VK_PREFILL_WS);
            pa_variant_set(pa_variant_set(&bv, PA_KEY_PAGE, page), PA_KEY_TMA, 2);
            const int tma_kind = !tma ? 0 : p->paged && t->prefill_page_boxes && pa_variant_allows(&bv) ? 2 : 1;
            pa_variant_set(v, PA_KEY_TMA, tma_kind);
            kp->page_boxes = tma_kind == 2;
        } else if (!wgmma) {
            pa_variant_set(v, PA_KEY_MINB, t->prefill_minb > 0 ? t->prefill_minb : D <= 128 ? 2 : 1);
        }
        kp->gt = gt;
        kp->head_tiles = p->kv_heads * (G / gt);
        kp->longest_first = true;
        kp->no_split = ws;
        kp->ws = ws;
        kp->forced = force != 0;
        kp->tma_rows = ws && tma ? 1 : 0; /* (its rows: plan_kernel, from the kernel's tile) */
    } else {
        *v = pa_variant_of(PA_VK_FALLBACK);
        pa_variant_set(v, PA_KEY_DTYPE, p->dtype);
    }
}

/* The kernel of situation s, with its launch facts. */
static pa_status plan_kernel(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps,
                             const pa_cuda_tuning *t, const pa_cuda_kernels *k, situation s, pa_kernel_plan *kp) {
    pa_variant v;
    char name[192];
    pa_cuda_loaded m;
    pa_status st;
    for (;;) {
        choose(p, caps, t, &s, &v, kp);
        if (!pa_variant_name(&v, name, sizeof name) || !pa_variant_allows(&v))
            return pa_fail(ctx, PA_ERR_INTERNAL, "attention: the planner chose a kernel that does not exist (%s)", name);
        st = k->load(k->user, ctx, name, &m);
        if (st) return st;
        /* eight-warp blocks whose shared memory does not fit (A100): four */
        if (v.kind == PA_VK_DECODE_MMA && v.v[PA_KEY_NW] == 8 && m.info[1] > caps->smem_optin) {
            s.wide = 0;
            continue;
        }
        break;
    }
    kp->variant = m.name;
    kp->entry = pa_variant_entry(v.kind);
    const int D = p->head_dim, G = p->group;
    if (s.kind == PA_PART_DECODE) {
        kp->threads = m.info[0];
        kp->smem = m.info[1];
        kp->tokens = m.info[2];
        const int maxp = m.info[3];
        kp->max_chunk = 0;
        if (p->paged) {
            /* a range of c keys spans at most (c - 1) / page + 2 pages */
            int64_t c = (int64_t)(maxp - 1) * p->page_size;
            if (c > INT32_MAX) c = INT32_MAX;
            kp->max_chunk = (int)(c / kp->tokens * kp->tokens);
        }
    } else if (s.kind == PA_PART_PREFILL) {
        kp->threads = m.info[0];
        kp->smem = m.info[1];
        kp->tokens = m.info[2];
        kp->q_tile = m.info[3];
        kp->max_chunk = 0;
        /* TMA boxes: one a page, or one a tile (the kernel's keys) of larger
         * pages and contiguous caches */
        if (kp->tma_rows) kp->tma_rows = !p->paged || p->page_size >= kp->tokens ? kp->tokens : p->page_size;
    } else {
        const int rows = m.info[1], kt = m.info[2];
        kp->threads = m.info[0];
        kp->tokens = kt;
        kp->max_chunk = 0;
        kp->smem = 4 * (rows * D + kt * (D + 1) + kt * D + rows * kt + rows * D);
        kp->gt = G < rows ? G : rows;
        kp->q_tile = rows / kp->gt;
        kp->head_tiles = p->kv_heads * ((G + kp->gt - 1) / kp->gt);
    }
    if (kp->smem > caps->smem_optin)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: kernel %s needs %d bytes of shared memory, "
                       "the device allows %d", name, kp->smem, caps->smem_optin);
    int per_sm = 0;
    st = k->occupancy(k->user, ctx, &m, kp->entry, kp->threads, kp->smem, &kp->fn, &per_sm);
    if (st) return st;
    if (per_sm < 1)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: kernel %s cannot run on this device "
                       "(%d threads, %d bytes of shared memory)", name, kp->threads, kp->smem);
    kp->capacity = per_sm * caps->sm_count;
    kp->grid_cap = !kp->persistent ? 0
                   : t->decode_max_blocks > 0 && t->decode_max_blocks < kp->capacity ? t->decode_max_blocks
                                                                                     : kp->capacity;
    return PA_OK;
}

/* Whether sequence b is part pt's. */
static bool in_part(const pa_attn_problem *p, kind_rules rules, const pa_plan_part *pt, int32_t b) {
    const int32_t sq = p->h_seqlen_q[b], sk = p->h_seqlen_k[b];
    return sq > 0 && kind_of(rules, sq) == pt->kind && sk >= pt->key_lo && (pt->key_hi == 0 || sk < pt->key_hi);
}

/* Whether the short units' kernel may give each of its four warps a head
 * tile of its own (hw=1): the head tiles come in fours and the Q of four fit
 * the kernel's rows (the variant's rule), at most 4 rows a tile where q is
 * rotated in the call (an f32 q takes two rows a row). */
static bool hw_fits(const pa_attn_problem *p, const pa_kernel_plan *kp) {
    pa_variant v = pa_variant_of(PA_VK_DECODE_MMA);
    pa_variant_set(pa_variant_set(&v, PA_KEY_NQ, kp->q_tile), PA_KEY_GT, kp->gt);
    pa_variant_set(pa_variant_set(&v, PA_KEY_HW, 1), PA_KEY_NW, 4);
    return kp->head_tiles % 4 == 0 && pa_variant_allows(&v) && (p->rotary_cos == NULL || kp->q_tile * kp->gt <= 4);
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
                           const pa_cuda_tuning *t, const pa_cuda_kernels *k, kind_rules rules, pa_plan_part *pt) {
    situation s;
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
    pa_status st = plan_kernel(ctx, p, caps, t, k, s, &pt->kp);
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
                    hw_fits(p, &pt->kp);
    /* without hw: persistent blocks where the units are not short and fill more than a wave */
    const bool persist_kept = candidate && !short_units && tiles > pt->kp.grid_cap;
    if ((pt->kp.ws && !pt->kp.forced && tiles < pt->kp.capacity) ||
        (candidate && (tiles <= pt->kp.grid_cap || short_units || hw))) {
        s.allow_ws = false;
        s.short_units = candidate && (short_units || hw);
        s.hw_keys = hw ? avg_keys : 0;
        st = plan_kernel(ctx, p, caps, t, k, s, &pt->kp);
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
        st = plan_kernel(ctx, p, caps, t, k, s, &pt->kp);
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
    const kind_rules rules = rules_of(p, t);
    bool used[3] = {false, false, false};
    for (int32_t b = 0; b < p->batch; b++)
        if (p->h_seqlen_q[b] > 0) used[kind_of(rules, p->h_seqlen_q[b])] = true;
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

/* ---- the variants a shape may run (pa_kernel_variants_for) ---- */

typedef struct collect {
    void (*emit)(void *user, const char *name);
    void *user;
    char seen[64][160];
    int nseen;
} collect;

static void offer(collect *c, const pa_variant *v) {
    char name[160];
    if (!pa_variant_name(v, name, sizeof name) || !pa_variant_allows(v)) return;
    for (int i = 0; i < c->nseen; i++)
        if (strcmp(c->seen[i], name) == 0) return;
    if (c->nseen < 64) snprintf(c->seen[c->nseen++], sizeof c->seen[0], "%s", name);
    c->emit(c->user, name);
}

pa_status pa_cuda_plan_variants(pa_context *ctx, const pa_kernel_shape *shape, const pa_cuda_tuning *t,
                                const pa_cuda_caps *caps, void (*emit)(void *user, const char *name), void *user) {
    if (!shape) return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: NULL");
    if (shape->dtype < PA_F32 || shape->dtype > PA_BF16)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: dtype %d is not f32, f16 or bf16", shape->dtype);
    if (shape->head_dim < 1 || shape->head_dim > PA_MAX_HEAD_DIM || shape->kv_heads < 1 ||
        shape->heads < shape->kv_heads || shape->heads % shape->kv_heads != 0 || shape->page_size < 0 ||
        shape->seqlen_q < 1)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: head_dim %d, heads %d / kv_heads %d, page_size %d, "
                       "seqlen_q %d: not a shape of attention", shape->head_dim, shape->heads, shape->kv_heads,
                       shape->page_size, shape->seqlen_q);
    pa_attn_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = (pa_dtype)shape->dtype;
    p.head_dim = shape->head_dim;
    p.heads = shape->heads;
    p.kv_heads = shape->kv_heads;
    p.group = shape->heads / shape->kv_heads;
    p.paged = shape->page_size > 0;
    p.page_size = p.paged ? shape->page_size : 0;
    p.scale = shape->natural ? 0.f : 1.f;
    static const float one = 1.f;
    p.rotary_cos = shape->rotary ? &one : NULL;
    collect *c = calloc(1, sizeof *c);
    if (!c) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "kernel variants: out of host memory");
    c->emit = emit;
    c->user = user;
    const kind_rules rules = rules_of(&p, t);
    const int32_t max_nq = rules.decode_max_q;
    pa_variant v;
    pa_kernel_plan kp;
    situation s;
    memset(&s, 0, sizeof s);
    s.tma_fits = true;
    /* decode: the situations plan_part asks for (allow_ws, short units, hw
     * keys), the persistence of warp-a-tile blocks and eight warps either way */
    static const struct { bool allow_ws, short_units; int64_t hw_keys; } asks[] = {
        {true, false, 0}, {false, false, 0}, {false, true, 0}, {true, true, 0}, {false, true, 1}, {false, true, 96},
    };
    const bool decode = rules.decode && shape->seqlen_q <= max_nq;
    for (size_t a = 0; decode && a < sizeof asks / sizeof asks[0]; a++)
            for (int pays = 0; pays < 2; pays++)
                for (int wide = 0; wide < 2; wide++) {
                    s.kind = PA_PART_DECODE;
                    s.max_q = shape->seqlen_q;
                    s.allow_ws = asks[a].allow_ws;
                    s.short_units = asks[a].short_units;
                    s.hw_keys = asks[a].hw_keys;
                    s.pays = pays;
                    s.wide = wide;
                    choose(&p, caps, t, &s, &v, &kp);
                    if (!kp.hw || hw_fits(&p, &kp)) offer(c, &v);
                }
    const bool longer = !decode;
    for (int allow = 0; longer && rules.prefill && allow < 2; allow++)
        for (int fits = 0; fits < 2; fits++) {
            s.kind = PA_PART_PREFILL;
            s.allow_ws = allow;
            s.tma_fits = fits;
            choose(&p, caps, t, &s, &v, &kp);
            offer(c, &v);
        }
    if (longer && !rules.prefill) {
        s.kind = PA_PART_FALLBACK;
        choose(&p, caps, t, &s, &v, &kp);
        offer(c, &v);
    }
    free(c);
    return PA_OK;
}
