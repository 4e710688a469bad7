/*
 * cuda_choice.c -- the CUDA planner's kernel choice (cuda_planner.h): which
 * kernel family a sequence runs on, the variant of each part's kernel for
 * the situation its work puts it in, with the launch facts the kernels give
 * (pa_cuda_kernels), and every variant the choice can reach for a shape
 * (pa_kernel_variants_for). What the kernels allow comes from the variant
 * table (cuda_variants.c); why each default is what it is: docs/decode.md,
 * docs/prefill.md, docs/planner.md.
 */
#include "cuda_planner.h"

#include <stdio.h>
#include <stdlib.h>

/* The page ids a decode block holds: two slots of 768 in persistent blocks
 * (the next unit's load overlaps the current one), else 1024. */
#define DECODE_MAXP 1024
#define DECODE_MAXP_PERSIST 768

/* The kv key of a problem: its caches' dtype where they are fp8, else 0
 * (the dtype's own). */
static int32_t kv_key(const pa_attn_problem *p) { return pa_dtype_is_fp8(p->cache_dtype) ? (int32_t)p->cache_dtype : 0; }

/* What the problem allows, decided once per call. */
pa_kind_rules pa_plan_kind_rules(const pa_attn_problem *p, const pa_cuda_tuning *t) {
    pa_variant d = pa_variant_of(PA_VK_DECODE), f = pa_variant_of(PA_VK_PREFILL);
    pa_variant_set(pa_variant_set(&d, PA_KEY_DTYPE, p->dtype), PA_KEY_D, p->head_dim);
    pa_variant_set(pa_variant_set(&f, PA_KEY_DTYPE, p->dtype), PA_KEY_D, p->head_dim);
    pa_variant_set(&d, PA_KEY_KV, kv_key(p));
    pa_variant_set(&f, PA_KEY_KV, kv_key(p));
    pa_kind_rules k = {pa_variant_allows(&d) && !t->fallback, pa_variant_allows(&f) && !t->fallback,
                    pa_variant_key_max(PA_VK_DECODE, PA_KEY_NQ)};
    return k;
}
pa_part_kind pa_plan_kind_of(pa_kind_rules k, int32_t seqlen_q) {
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


/* The variant for a situation and the flags of its plan (kp; no launch facts yet). */
static void choose(const pa_attn_problem *p, const pa_cuda_caps *caps, const pa_cuda_tuning *t, const pa_situation *s,
                   pa_variant *v, pa_kernel_plan *kp) {
    const int D = p->head_dim, G = p->group;
    const int32_t page = pa_variant_page_key(p->paged, p->page_size);
    const int32_t kv = kv_key(p);
    memset(kp, 0, sizeof *kp);
    if (s->kind == PA_PART_DECODE) {
        pa_variant m = pa_variant_of(PA_VK_DECODE_MMA);
        pa_variant_set(pa_variant_set(&m, PA_KEY_DTYPE, p->dtype), PA_KEY_D, D);
        pa_variant_set(&m, PA_KEY_KV, kv);
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
        /* (fp8 caches: 4 stages at 16 keys a warp too, half a 16-bit stage's
         * bytes each: two blocks a SM still fit; not measured yet) */
        int stages = t->decode_stages > 0 ? t->decode_stages : kpw == 16 && kv == 0 ? 3 : 4;
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
         * fixed ranges: claiming measured slower there; so did fp8 caches,
         * whose claims of two stages hold half the bytes: e4m3, 8 x 32768,
         * 232.1 against 190.1 us, H200, docs/fp8.md; decode_claim 2 claims
         * there too) */
        const bool claim_pays = t->decode_claim == 2 || (t->decode_claim == 1 && !pa_dtype_is_fp8(p->cache_dtype));
        kp->claim =
            mma && !persist_long && !kp->guided && p->paged && stages <= PA_DECODE_CLAIM_MAX_STAGES && claim_pays;
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
            /* (auto: never over fp8 caches, where eight warps were slower:
             * e4m3, 64 x 4096 206.7 against 187.8 us, 8 x 32768 233.1
             * against 226.4; H100, docs/fp8.md) */
            nw8 = t->decode_wide == 2 || (t->decode_wide == 1 && !pa_dtype_is_fp8(p->cache_dtype) &&
                                          s->seq_keys >= t->decode_wide_min_keys && units <= max_units);
        }
        *v = pa_variant_of(vk);
        pa_variant_set(v, PA_KEY_DTYPE, p->dtype);
        pa_variant_set(v, PA_KEY_D, D);
        pa_variant_set(v, PA_KEY_KV, kv);
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
        /* (the Hopper kernels read 16-bit caches only: fp8 on mma.sync; where a
         * 16-bit copy of the keys applies, cuda_dequant.c plans that instead) */
        const bool hopper = caps->sm90a && pa_variant_allows(&h) && kv == 0;
        pa_variant tv = pa_variant_of(PA_VK_PREFILL_WS);
        pa_variant_set(pa_variant_set(&tv, PA_KEY_PAGE, page), PA_KEY_TMA, 1);
        const bool tma = hopper && caps->tma && t->prefill_tma && pa_variant_allows(&tv) && s->tma_fits;
        const bool ws = hopper && (force ? force == 1 : s->allow_ws && tma);
        const bool wgmma = hopper && !ws && force != 3;
        *v = pa_variant_of(ws ? PA_VK_PREFILL_WS : wgmma ? PA_VK_PREFILL_WGMMA : PA_VK_PREFILL);
        pa_variant_set(v, PA_KEY_DTYPE, p->dtype);
        if (!hopper) pa_variant_set(v, PA_KEY_KV, kv);
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
        pa_variant_set(v, PA_KEY_KV, kv);
    }
}

/* The kernel of situation s, with its launch facts. */
pa_status pa_plan_kernel(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_caps *caps, const pa_cuda_tuning *t,
                         const pa_cuda_kernels *k, pa_situation s, pa_kernel_plan *kp) {
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

/* Whether the short units' kernel may give each of its four warps a head
 * tile of its own (hw=1): the head tiles come in fours and the Q of four fit
 * the kernel's rows (the variant's rule), at most 4 rows a tile where q is
 * rotated in the call (an f32 q takes two rows a row). */
bool pa_plan_hw_fits(const pa_attn_problem *p, const pa_kernel_plan *kp) {
    pa_variant v = pa_variant_of(PA_VK_DECODE_MMA);
    pa_variant_set(pa_variant_set(&v, PA_KEY_NQ, kp->q_tile), PA_KEY_GT, kp->gt);
    pa_variant_set(pa_variant_set(&v, PA_KEY_HW, 1), PA_KEY_NW, 4);
    return kp->head_tiles % 4 == 0 && pa_variant_allows(&v) && (p->rotary_cos == NULL || kp->q_tile * kp->gt <= 4);
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
    if (shape->kv_dtype != 0 && !pa_dtype_is_fp8((pa_dtype)shape->kv_dtype))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: kv_dtype %d is not fp8 (4, 5) or 0", shape->kv_dtype);
    if (shape->head_dim < 1 || shape->head_dim > PA_MAX_HEAD_DIM || shape->kv_heads < 1 ||
        shape->heads < shape->kv_heads || shape->heads % shape->kv_heads != 0 || shape->page_size < 0 ||
        shape->seqlen_q < 1)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: head_dim %d, heads %d / kv_heads %d, page_size %d, "
                       "seqlen_q %d: not a shape of attention", shape->head_dim, shape->heads, shape->kv_heads,
                       shape->page_size, shape->seqlen_q);
    pa_attn_problem p;
    memset(&p, 0, sizeof p);
    p.dtype = (pa_dtype)shape->dtype;
    p.cache_dtype = shape->kv_dtype ? (pa_dtype)shape->kv_dtype : p.dtype;
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
    const pa_kind_rules rules = pa_plan_kind_rules(&p, t);
    const int32_t max_nq = rules.decode_max_q;
    pa_variant v;
    pa_kernel_plan kp;
    pa_situation s;
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
                    if (!kp.hw || pa_plan_hw_fits(&p, &kp)) offer(c, &v);
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

