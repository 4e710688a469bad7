/*
 * cascade.c -- shared prefixes read once: the two-level plan a
 * PA_BATCH_CASCADE batch stages (which entries share which leading pages),
 * and pa_batch_attention, which runs the shared level, the suffix level and
 * their merge.
 *
 * Planning happens inside a stage, before its commit, from the pool's page
 * lists: entries whose first pages are the same physical pages hold the same
 * keys there (a page is only ever shared read-only; a write copies it first),
 * so no key is compared, only page ids. The pages shared are those that lie
 * wholly before an entry's new tokens: the step writes none of them, and
 * every query of the step comes after all of them.
 */
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>

#define TRY(expr)                     \
    do {                              \
        pa_status st_ = (expr);       \
        if (st_ != PA_OK) return st_; \
    } while (0)

/* ---- planning --------------------------------------------------------------- */

static pa_status grow_plan(pa_context *ctx, pa_cascade_plan *cp, int32_t n) {
    if (n <= cp->cap) return PA_OK;
    int64_t cap = cp->cap ? cp->cap : 64;
    while (cap < n) cap *= 2;
    if (cap > INT32_MAX - 2) cap = INT32_MAX - 2;
    const size_t c = (size_t)cap;
    int32_t **arrays[] = {&cp->prefix, &cp->group, &cp->group_lead, &cp->group_pages, &cp->group_q,
                          &cp->members, &cp->tmp, &cp->leaf_node, &cp->bucket};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        int32_t *a = realloc(*arrays[i], c * sizeof(int32_t));
        if (!a) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory for the cascade plan");
        *arrays[i] = a;
    }
    pa_cascade_node *nodes = realloc(cp->nodes, (c + 2) * sizeof *nodes);
    if (!nodes) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory for the cascade plan");
    cp->nodes = nodes;
    void *stack = realloc(cp->stack, (c + 2) * sizeof *cp->stack);
    if (!stack) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory for the cascade plan");
    cp->stack = stack;
    cp->cap = (int32_t)cap;
    return PA_OK;
}

void pa_cascade_release(pa_batch *b) {
    pa_cascade_plan *cp = &b->plan;
    free(cp->prefix);
    free(cp->group);
    free(cp->group_lead);
    free(cp->group_pages);
    free(cp->group_q);
    free(cp->members);
    free(cp->tmp);
    free(cp->leaf_node);
    free(cp->bucket);
    free(cp->nodes);
    free(cp->stack);
    memset(cp, 0, sizeof *cp);
    if (b->scratch) b->dev->ops->free(b->dev, b->scratch);
    if (b->zeros) b->dev->ops->free(b->dev, b->zeros);
    b->scratch = b->zeros = NULL;
    b->scratch_bytes = b->zeros_bytes = 0;
}

/* Whole pages of entry e that lie before its new tokens. */
static int32_t full_pages(const pa_pool *pool, const entry *e) {
    return pa_page_index(pool, e->seq->len); /* len: before the step (planning precedes the commit) */
}

/* How many of a[0..n) and b[0..n) agree from the start. Every page is
 * compared (a page shared at index j does not prove the pages before it
 * shared: prefix-cache hashes are the caller's), with memcmp, which the C
 * library runs at the machine's vector width: all of them first (members of
 * a group agree), then blocks of 64 to find where they part. */
static int32_t common_run(const int32_t *a, const int32_t *b, int32_t n) {
    if (n <= 0 || memcmp(a, b, (size_t)n * sizeof(int32_t)) == 0) return n > 0 ? n : 0;
    int32_t j = 0;
    while (j + 64 <= n && memcmp(a + j, b + j, 64 * sizeof(int32_t)) == 0) j += 64;
    while (j < n && a[j] == b[j]) j++;
    return j;
}

/* The pages the members m[a..b) share from page d0 on (they share [0, d0)):
 * up to the shortest member's whole pages. */
static int32_t shared_depth(const pa_batch *b, const int32_t *m, int32_t a, int32_t e, int32_t d0) {
    const pa_pool *pool = b->pool;
    int32_t lim = INT32_MAX;
    for (int32_t j = a; j < e; j++) {
        const int32_t f = full_pages(pool, &b->entries[m[j]]);
        if (f < lim) lim = f;
    }
    const int32_t *first = b->entries[m[a]].seq->pages;
    int32_t d = lim;
    for (int32_t j = a + 1; j < e && d > d0; j++)
        d = d0 + common_run(first + d0, b->entries[m[j]].seq->pages + d0, d - d0);
    return d < d0 ? d0 : d;
}

/* Automatic groups take entries of at most this many new tokens: decodes
 * and short chunks, whose attention is bound by the keys it reads (the
 * CUDA decode kernels' queries). A longer chunk reads its keys once per tile
 * of many queries anyway, so a shared level saves it little and costs a
 * copy and a merge of all its rows: the Mooncake sample on the CPU
 * (docs/cascade.md) spent 4.8-4.9% more time in attention than the plain
 * call with chunks in the groups, 1.6-2.5% with this limit. */
#define AUTO_MAX_NEW 8

/* Automatic groups: the trie of the candidates' page lists, built by
 * splitting sets of members on the page where they part, and a pass over it
 * that decides, bottom up, whether each subtree keeps its own groups or
 * joins its parent's (whichever saves more page reads: a group of k entries
 * sharing d pages saves (k - 1) d). Each member ends in one group: nested
 * sharing (forks of forks) gets the level that pays most, not two levels.
 * Returns the number of groups; writes cp->group and cp->prefix. */
static int32_t plan_auto(pa_batch *b, int32_t n) {
    pa_cascade_plan *cp = &b->plan;
    pa_pool *pool = b->pool;
    int32_t *m = cp->members, nm = 0;
    for (int32_t i = 0; i < n; i++) {
        cp->leaf_node[i] = -1;
        cp->group[i] = -1;
        cp->prefix[i] = 0;
        if (b->entries[i].num_new > 0 && b->entries[i].num_new <= AUTO_MAX_NEW && full_pages(pool, &b->entries[i]) >= 1)
            m[nm++] = i;
    }
    if (nm < 2) return 0;

    /* the trie, depth first (a node's children come after it) */
    pa_cascade_node *nodes = cp->nodes;
    int32_t nn = 0, top = 0;
    nodes[nn++] = (pa_cascade_node){0, -1, nm, 0, 0, 0, 0, 0, false};
    cp->stack[top].node = 0;
    cp->stack[top].a = 0;
    cp->stack[top].b = nm;
    cp->stack[top].d0 = 0;
    top++;
    while (top > 0) {
        top--;
        const int32_t v = cp->stack[top].node, a = cp->stack[top].a, e = cp->stack[top].b, d0 = cp->stack[top].d0;
        /* the root shares nothing; a child shares [0, d0) and maybe more */
        const int32_t d = v == 0 ? 0 : shared_depth(b, m, a, e, d0);
        nodes[v].depth = d;
        /* members that end at d stay here; the others split on page d */
        const uint32_t ep = pa_pool_next_epoch(pool);
        int32_t nb = 0, ends = 0;
        for (int32_t j = a; j < e; j++) {
            const entry *en = &b->entries[m[j]];
            if (full_pages(pool, en) == d) {
                ends++;
                continue;
            }
            const int32_t pg = en->seq->pages[d];
            if (pool->page_stamp[pg] != ep) {
                pool->page_stamp[pg] = ep;
                pool->page_drops[pg] = nb;
                cp->bucket[nb++] = 0;
            }
            cp->bucket[pool->page_drops[pg]]++;
        }
        /* bucket k's members go to tmp[a + ends + start_k ..]: starts in place */
        for (int32_t k = 0, at = a + ends; k < nb; k++) {
            const int32_t c = cp->bucket[k];
            cp->bucket[k] = at;
            at += c;
        }
        for (int32_t j = a, at = a; j < e; j++) {
            const entry *en = &b->entries[m[j]];
            if (full_pages(pool, en) == d) {
                cp->tmp[at++] = m[j];
                cp->leaf_node[m[j]] = v;
            } else {
                cp->tmp[cp->bucket[pool->page_drops[en->seq->pages[d]]]++] = m[j];
            }
        }
        memcpy(m + a, cp->tmp + a, (size_t)(e - a) * sizeof(int32_t));
        nodes[v].direct = ends;
        /* bucket k now ends at bucket[k]; it started where k - 1 ended */
        for (int32_t k = 0, start = a + ends; k < nb; k++) {
            const int32_t end = cp->bucket[k];
            if (end - start == 1) { /* a member alone past d: it joins this node */
                cp->leaf_node[m[start]] = v;
                nodes[v].direct++;
            } else {
                nodes[nn] = (pa_cascade_node){0, v, end - start, 0, 0, 0, 0, 0, false};
                cp->stack[top].node = nn;
                cp->stack[top].a = start;
                cp->stack[top].b = end;
                cp->stack[top].d0 = d + 1;
                top++;
                nn++;
            }
            start = end;
        }
    }

    /* bottom up: the reads each subtree saves, and whether it joins its parent */
    for (int32_t v = nn - 1; v >= 0; v--) {
        pa_cascade_node *x = &nodes[v];
        x->joined += x->direct;
        x->value = x->internal + (x->joined >= 1 ? (int64_t)(x->joined - 1) * x->depth : 0);
        if (x->parent < 0) continue;
        pa_cascade_node *p = &nodes[x->parent];
        const int64_t join = (int64_t)x->size * p->depth;
        x->absorbed = join >= x->value; /* ties join: fewer, larger groups */
        if (x->absorbed) p->joined += x->size;
        else p->internal += x->value;
    }
    /* top down: a subtree that joined its parent joins it whole */
    for (int32_t v = 0; v < nn; v++) {
        pa_cascade_node *x = &nodes[v];
        if (x->parent >= 0 && (x->absorbed || nodes[x->parent].absorbed)) {
            x->absorbed = true; /* (now: joined some ancestor's group) */
            x->gnode = nodes[x->parent].gnode;
        } else {
            x->gnode = v;
        }
    }
    /* groups numbered in the order of their first entry */
    for (int32_t v = 0; v < nn; v++) nodes[v].internal = -1; /* reused: the node's group id */
    int32_t groups = 0;
    for (int32_t i = 0; i < n; i++) {
        if (cp->leaf_node[i] < 0) continue;
        pa_cascade_node *g = &nodes[nodes[cp->leaf_node[i]].gnode];
        if (g->depth < 1 || g->joined < 2) continue;
        if ((int64_t)(g->joined - 1) * g->depth < b->cascade_min_saved) continue; /* (its members run plain) */
        if (g->internal < 0) {
            g->internal = groups;
            cp->group_lead[groups] = i;
            cp->group_pages[groups] = g->depth;
            groups++;
        }
        cp->group[i] = (int32_t)g->internal;
        cp->prefix[i] = g->depth;
    }
    return groups;
}

/* the labels qsort's comparator sorts by (per thread: threads stage their
 * own pools' batches at the same time) */
static _Thread_local const int32_t *sort_labels;
static int cmp_by_label(const void *x, const void *y) {
    const int32_t i = *(const int32_t *)x, j = *(const int32_t *)y;
    if (sort_labels[i] != sort_labels[j]) return sort_labels[i] < sort_labels[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* The caller's groups: each label's entries with new tokens share the
 * longest run of whole pages common to all of them. */
static int32_t plan_labels(pa_batch *b, int32_t n, const int32_t *labels) {
    pa_cascade_plan *cp = &b->plan;
    int32_t *m = cp->members, nm = 0;
    for (int32_t i = 0; i < n; i++) {
        cp->group[i] = -1;
        cp->prefix[i] = 0;
        cp->tmp[i] = 0;        /* the pages its label's entries share */
        cp->bucket[i] = -1;    /* the first entry of its label */
        cp->leaf_node[i] = -1; /* (a first entry's) group */
        if (labels[i] >= 0 && b->entries[i].num_new > 0 && full_pages(b->pool, &b->entries[i]) >= 1) m[nm++] = i;
    }
    sort_labels = labels;
    qsort(m, (size_t)nm, sizeof *m, cmp_by_label);
    sort_labels = NULL;
    for (int32_t a = 0; a < nm;) {
        int32_t e = a + 1;
        while (e < nm && labels[m[e]] == labels[m[a]]) e++;
        const int32_t d = e - a >= 2 ? shared_depth(b, m, a, e, 0) : 0;
        for (int32_t j = a; j < e; j++) {
            cp->tmp[m[j]] = d;
            cp->bucket[m[j]] = m[a]; /* sorted by (label, entry): m[a] comes first */
        }
        a = e;
    }
    int32_t groups = 0;
    for (int32_t i = 0; i < n; i++) { /* numbered in the order of their first entry */
        if (cp->tmp[i] < 1) continue;
        if (cp->bucket[i] == i) {
            cp->leaf_node[i] = groups;
            cp->group_lead[groups] = i;
            cp->group_pages[groups] = cp->tmp[i];
            groups++;
        }
        cp->group[i] = cp->leaf_node[cp->bucket[i]];
        cp->prefix[i] = cp->tmp[i];
    }
    return groups;
}

pa_status pa_cascade_plan_stage(pa_context *ctx, pa_batch *b, int32_t n, const int32_t *labels) {
    pa_cascade_plan *cp = &b->plan;
    TRY(grow_plan(ctx, cp, n));
    const int32_t groups = labels ? plan_labels(b, n, labels) : plan_auto(b, n);
    pa_batch_cascade_info *ci = &cp->info;
    memset(ci, 0, sizeof *ci);
    ci->groups = groups;
    ci->max_grouped_pos = -1;
    ci->prefix_width = 1;
    ci->suffix_width = 1;
    for (int32_t g = 0; g < groups; g++) {
        cp->group_q[g] = 0;
        ci->prefix_pages += cp->group_pages[g];
        if (cp->group_pages[g] > ci->prefix_width) ci->prefix_width = cp->group_pages[g];
    }
    int64_t shared_q = 0;
    for (int32_t i = 0; i < n; i++) {
        const entry *e = &b->entries[i];
        const int32_t g = cp->group[i];
        if (e->pages_after - cp->prefix[i] > ci->suffix_width) ci->suffix_width = e->pages_after - cp->prefix[i];
        if (g < 0) continue;
        ci->grouped++;
        cp->group_q[g] += e->num_new;
        shared_q += e->num_new;
        ci->saved_pages += cp->group_pages[g];
        const int64_t last = e->seq->len + e->num_new - 1;
        if (last > ci->max_grouped_pos) ci->max_grouped_pos = (int32_t)last;
    }
    for (int32_t g = 0; g < groups; g++) ci->saved_pages -= cp->group_pages[g]; /* one read each */
    ci->shared_q = (int32_t)shared_q; /* <= total_q, checked by the stage */
    return PA_OK;
}

pa_status pa_batch_set_cascade_min_saved(pa_context *ctx, pa_batch *b, int64_t pages) {
    if (!b) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: NULL");
    if (!b->cascade) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: made without PA_BATCH_CASCADE");
    if (pages < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "pages: %lld is negative", (long long)pages);
    b->cascade_min_saved = pages;
    return PA_OK;
}

void pa_batch_get_cascade(const pa_batch *b, pa_batch_cascade_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    out->max_grouped_pos = -1;
    if (!b) return;
    *out = b->cascade_info;
    if (!b->cascade || b->staged_n < 0) {
        const int32_t fallback = out->last_fallback, calls = out->last_calls;
        memset(out, 0, sizeof *out);
        out->max_grouped_pos = -1;
        out->last_fallback = fallback;
        out->last_calls = calls;
    }
}

/* ---- attention over a staged batch ------------------------------------------ */

/* A tensor header over memory the batch owns (never destroyed). */
static pa_tensor view_of(pa_device *dev, pa_dtype dt, void *data, int ndim, const int64_t *shape) {
    pa_tensor t;
    memset(&t, 0, sizeof t);
    t.dev = dev;
    t.dtype = dt;
    t.ndim = ndim;
    t.numel = 1;
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        t.numel *= shape[i];
    }
    t.bytes = (size_t)t.numel * pa_dtype_size(dt);
    t.data = data;
    return t;
}

/* Device memory of at least `need` bytes in *buf (zero-filled when new). */
static pa_status ensure(pa_context *ctx, pa_batch *b, void **buf, size_t *have, size_t need) {
    if (need <= *have) return PA_OK;
    size_t cap = 4096;
    while (cap < need) cap *= 2;
    void *nb = NULL;
    pa_status st = b->dev->ops->alloc(ctx, b->dev, cap, &nb);
    if (st) return pa_fail_prefix(ctx, st, "batch:attention: scratch");
    if (*buf) {
        /* kernels queued by earlier calls may still use the old one */
        st = b->dev->ops->synchronize(ctx, b->dev);
        if (st) {
            b->dev->ops->free(b->dev, nb);
            return st;
        }
        b->dev->ops->free(b->dev, *buf);
    }
    *buf = nb;
    *have = cap;
    return PA_OK;
}

static size_t align_bytes(size_t n) { return (n + 255) & ~(size_t)255; }

static pa_tensor *field(pa_batch *b, pa_batch_field f) { return &b->views[f]; }

/* The plain call's parameters: p with the batch's full tables. */
static pa_status plain_params(pa_context *ctx, pa_batch *b, const pa_attention_params *p, bool varlen,
                              pa_attention_params *pp) {
    *pp = *p;
    pp->block_table = field(b, PA_BATCH_BLOCK_TABLE);
    if (varlen) {
        pp->cu_seqlens_q = field(b, PA_BATCH_CU_SEQLENS_Q);
        pp->seqused_k = field(b, PA_BATCH_SEQUSED_K);
        pp->max_seqlen_q = b->info.max_seqlen_q;
        return PA_OK;
    }
    const int32_t n = b->info.batch;
    if (p->q->shape[0] != n)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "q: batch of %lld, but the batch staged %d entries", (long long)p->q->shape[0], n);
    if (p->k && p->k->ndim == 4) {
        const int64_t s_new = p->k->shape[1];
        if ((int64_t)b->info.total_q != n * s_new || (n > 0 && b->info.max_seqlen_q != s_new))
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "k: shape [B, S_new, Hk, D] needs every entry to have S_new = %lld new tokens "
                           "(use q [total_q, H, D] for mixed batches)",
                           (long long)s_new);
    }
    /* with new k/v: appended at the keys before the step; else the keys after it */
    pp->cache_seqlens = field(b, p->k ? PA_BATCH_CACHE_SEQLENS : PA_BATCH_SEQUSED_K);
    return PA_OK;
}

/* rows of q [rows, H, D] copied from src to dst (the callers add a row map
 * or a rotation) */
static pa_rows_problem rows_problem(pa_device *dev, pa_dtype dt, int64_t H, int64_t D, int64_t rows,
                                    const void *src, void *dst) {
    pa_rows_problem rp;
    memset(&rp, 0, sizeof rp);
    rp.dev = dev;
    rp.dtype = dt;
    rp.heads = (int32_t)H;
    rp.head_dim = (int32_t)D;
    rp.rows = rows;
    rp.src = src;
    rp.dst = dst;
    return rp;
}

/* an fp8 cache's scales go with it into every call that reads or writes it */
static void copy_scales(pa_attention_params *dst, const pa_attention_params *p) {
    dst->k_scale = p->k_scale;
    dst->v_scale = p->v_scale;
    dst->k_scales = p->k_scales;
    dst->v_scales = p->v_scales;
}

pa_status pa_batch_attention(pa_context *ctx, pa_batch *b, const pa_attention_params *p) {
    if (!b) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: NULL");
    if (!p) return pa_fail(ctx, PA_ERR_ARGUMENT, "params: NULL");
    if (!p->q) return pa_fail(ctx, PA_ERR_ARGUMENT, "q: missing");
    if (b->staged_n < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: nothing staged (stage it first)");
    static const struct { size_t off; const char *name; } set_by_batch[] = {
        {offsetof(pa_attention_params, block_table), "block_table"},
        {offsetof(pa_attention_params, cache_seqlens), "cache_seqlens"},
        {offsetof(pa_attention_params, cu_seqlens_q), "cu_seqlens_q"},
        {offsetof(pa_attention_params, seqused_k), "seqused_k"},
        {offsetof(pa_attention_params, kv_indptr), "kv_indptr"},
        {offsetof(pa_attention_params, kv_indices), "kv_indices"},
        {offsetof(pa_attention_params, kv_last_page_len), "kv_last_page_len"},
        {offsetof(pa_attention_params, cache_batch_idx), "cache_batch_idx"},
    };
    for (size_t i = 0; i < sizeof set_by_batch / sizeof set_by_batch[0]; i++)
        if (*(const pa_tensor *const *)((const char *)p + set_by_batch[i].off))
            return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: set by the batch", set_by_batch[i].name);
    if (p->cache_seqlen != -1) return pa_fail(ctx, PA_ERR_ARGUMENT, "cache_seqlens: set by the batch");
    if (p->max_seqlen_q != 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "max_seqlen_q: set by the batch");
    const pa_tensor *q = p->q;
    if (q->ndim != 3 && q->ndim != 4) {
        char got[160];
        return pa_fail(ctx, PA_ERR_ARGUMENT, "q: expected [total_q, H, D] or [B, Sq, H, D], got shape %s",
                       pa_shape_str(q, got, sizeof got));
    }
    const bool varlen = q->ndim == 3;
    pa_attention_params pp;
    TRY(plain_params(ctx, b, p, varlen, &pp));

    pa_batch_cascade_info *ci = &b->cascade_info;
    const int32_t T = b->info.total_q, n = b->info.batch;
    const int32_t causal_right = p->causal ? 0 : p->window_right;
    int32_t fb = PA_CASCADE_USED;
    if (!b->cascade) fb = PA_CASCADE_OFF;
    else if (ci->groups == 0) fb = PA_CASCADE_NO_GROUPS;
    else if (p->alibi_slopes) fb = PA_CASCADE_ALIBI;
    else if (p->window_left >= 0 && p->window_left < ci->max_grouped_pos) fb = PA_CASCADE_WINDOW;
    else if (!varlen && (q->shape[1] * (int64_t)n != T || b->info.max_seqlen_q != q->shape[1])) fb = PA_CASCADE_ROWS;
    if (fb != PA_CASCADE_USED) { /* (which checks everything before it writes anything) */
        ci->last_fallback = fb;
        ci->last_calls = 1;
        return varlen ? pa_attention_varlen(ctx, &pp) : pa_attention_with_kvcache(ctx, &pp);
    }
    /* every mistake of the caller's, before the first of several calls writes anything */
    TRY(pa_attention_check(ctx, &pp, varlen));
    ci->last_fallback = fb;

    /* the two levels */
    pa_device *dev = q->dev;
    const pa_dtype dt = q->dtype;
    const int64_t H = q->shape[q->ndim - 2], D = q->shape[q->ndim - 1], Hk = p->k_cache->shape[2];
    const int64_t S = ci->shared_q;
    const size_t es = pa_dtype_size(dt);
    const bool rotary = p->rotary_cos != NULL;
    const bool step = p->causal || p->window_left >= 0 || causal_right >= 0; /* q rotated at each token's position */
    /* both levels write f32 (o_sh, o_u), which the merge rounds once to
     * the dtype, as a plain call rounds its output once */
    const size_t q_sh_off = 0;
    const size_t o_sh_off = q_sh_off + align_bytes((size_t)(S * H * D) * es);
    const size_t lse_sh_off = o_sh_off + align_bytes((size_t)(S * H * D) * 4);
    const size_t o_u_off = lse_sh_off + align_bytes((size_t)(S * H) * 4);
    const size_t lse_u_off = o_u_off + align_bytes((size_t)T * (size_t)(H * D) * 4);
    const size_t q_rot_off = lse_u_off + (p->softmax_lse ? 0 : align_bytes((size_t)T * (size_t)H * 4));
    const size_t dummy_off = q_rot_off + (rotary ? align_bytes((size_t)T * (size_t)(H * D) * es) : 0);
    const size_t total = dummy_off + (rotary ? align_bytes((size_t)T * (size_t)(Hk * D) * es) : 0);
    TRY(ensure(ctx, b, &b->scratch, &b->scratch_bytes, total));
    if (rotary) TRY(ensure(ctx, b, &b->zeros, &b->zeros_bytes, (size_t)T * (size_t)(Hk * D) * es));
    char *base = b->scratch;
    ci->last_calls = 0;

    const pa_tensor *q_use = q, *k_use = p->k, *v_use = p->v;
    pa_tensor q_rot, k_rows, v_rows;
    pa_status st = PA_OK;
    if (rotary) {
        /* The suffix level sees positions less the prefix, so it cannot
         * rotate: k is appended (rotated at its true position) by a call of
         * one key per token, and q rotated into scratch for both levels. */
        const int64_t kv_shape[3] = {T, Hk, D};
        pa_tensor zq = view_of(dev, dt, b->zeros, 3, kv_shape);
        pa_tensor dummy = view_of(dev, dt, base + dummy_off, 3, kv_shape);
        k_rows = view_of(dev, dt, p->k->data, 3, kv_shape);
        v_rows = view_of(dev, dt, p->v->data, 3, kv_shape);
        pa_attention_params ap;
        pa_attention_params_init(&ap);
        ap.q = &zq;
        ap.out = &dummy;
        ap.k_cache = p->k_cache;
        ap.v_cache = p->v_cache;
        copy_scales(&ap, p);
        ap.k = &k_rows;
        ap.v = &v_rows;
        ap.rotary_cos = p->rotary_cos;
        ap.rotary_sin = p->rotary_sin;
        ap.rotary_interleaved = p->rotary_interleaved;
        ap.block_table = field(b, PA_BATCH_BLOCK_TABLE);
        ap.cu_seqlens_q = field(b, PA_BATCH_CU_SEQLENS_Q);
        ap.seqused_k = field(b, PA_BATCH_SEQUSED_K);
        ap.max_seqlen_q = b->info.max_seqlen_q;
        ap.window_left = 0;
        ap.window_right = 0;
        st = pa_attention_varlen(ctx, &ap);
        if (st) return pa_fail_prefix(ctx, st, "batch:attention (append)");
        ci->last_calls++;
        q_rot = view_of(dev, dt, base + q_rot_off, q->ndim, q->shape);
        pa_rows_problem rp = rows_problem(dev, dt, H, D, T, q->data, q_rot.data);
        rp.rotary_cos = p->rotary_cos->data;
        rp.rotary_sin = p->rotary_sin->data;
        rp.rotary_dtype = p->rotary_cos->dtype;
        rp.rotary_dim = (int32_t)(2 * p->rotary_cos->shape[1]);
        rp.rotary_interleaved = p->rotary_interleaved != 0;
        /* a token's position, or (not causal, no window) its entry's first */
        rp.pos = field(b, step ? PA_BATCH_POSITIONS : PA_BATCH_CACHE_SEQLENS)->data;
        rp.pos_index = step ? NULL : field(b, PA_BATCH_BATCH_INDICES)->data;
        st = pa_gather_rows_run(ctx, &rp);
        if (st) return pa_fail_prefix(ctx, st, "batch:attention (rotating q)");
        q_use = &q_rot;
        k_use = v_use = NULL;
    }

    /* the shared level: each group's queries over its prefix, unmasked */
    const int64_t sh_shape[3] = {S, H, D}, sh_lse_shape[2] = {H, S};
    pa_tensor q_sh = view_of(dev, dt, b->plan.rows_in_order ? q_use->data : base + q_sh_off, 3, sh_shape);
    pa_tensor o_sh = view_of(dev, PA_F32, base + o_sh_off, 3, sh_shape);
    pa_tensor lse_sh = view_of(dev, PA_F32, base + lse_sh_off, 2, sh_lse_shape);
    if (!b->plan.rows_in_order) { /* (in order: the groups' rows are q's first S) */
        pa_rows_problem rp = rows_problem(dev, dt, H, D, S, q_use->data, q_sh.data);
        rp.row_map = field(b, PA_BATCH_PREFIX_ROWS)->data;
        st = pa_gather_rows_run(ctx, &rp);
        if (st) return pa_fail_prefix(ctx, st, "batch:attention (gathering the shared queries)");
    }
    pa_attention_params sp;
    pa_attention_params_init(&sp);
    sp.q = &q_sh;
    sp.out = &o_sh;
    sp.softmax_lse = &lse_sh;
    sp.k_cache = p->k_cache;
    sp.v_cache = p->v_cache;
    copy_scales(&sp, p);
    sp.block_table = field(b, PA_BATCH_PREFIX_BLOCK_TABLE);
    sp.cu_seqlens_q = field(b, PA_BATCH_PREFIX_CU_SEQLENS_Q);
    sp.seqused_k = field(b, PA_BATCH_PREFIX_SEQUSED_K);
    sp.softmax_scale = p->softmax_scale;
    sp.softcap = p->softcap;
    sp.num_splits = p->num_splits;
    /* The shared level is compute-bound (many queries over few keys), the
     * suffix level bound by its reads: on a backend with lanes the shared
     * level runs on lane 1 beside the suffix level, queued first so that its
     * blocks take their SMs before the suffix level's fill the rest. */
    const pa_backend_ops *ops = dev->ops;
    const bool lanes = ops->lane_fork && ops->lane_join;
    if (lanes && (st = ops->lane_fork(ctx, dev)) != PA_OK)
        return pa_fail_prefix(ctx, st, "batch:attention (the second queue)");
    const pa_call_flags shared_flags = {.out_f32 = true, .lane = lanes ? 1 : 0};
    st = pa_attention_flagged(ctx, &sp, true, &shared_flags);
    if (st) {
        if (lanes) ops->lane_join(ctx, dev); /* (the failure is the call's, not the join's) */
        return pa_fail_prefix(ctx, st, "batch:attention (shared level)");
    }
    ci->last_calls++;

    /* the suffix level: the plain call over the pages past each prefix */
    pa_tensor lse_u;
    const int64_t lse_seq = varlen ? T : q->shape[1];
    pa_tensor o_u = view_of(dev, PA_F32, base + o_u_off, q->ndim, q->shape);
    {
        pa_attention_params up = pp;
        up.q = q_use;
        up.out = &o_u;
        up.k = k_use;
        up.v = v_use;
        if (rotary) up.rotary_cos = up.rotary_sin = NULL;
        up.block_table = field(b, PA_BATCH_SUFFIX_BLOCK_TABLE);
        if (varlen) up.seqused_k = field(b, PA_BATCH_SUFFIX_SEQUSED_K);
        else up.cache_seqlens = field(b, k_use ? PA_BATCH_SUFFIX_CACHE_SEQLENS : PA_BATCH_SUFFIX_SEQUSED_K);
        if (!p->softmax_lse) {
            const int64_t l2[2] = {H, T}, l3[3] = {n, H, q->ndim == 4 ? q->shape[1] : 0};
            lse_u = varlen ? view_of(dev, PA_F32, base + lse_u_off, 2, l2) : view_of(dev, PA_F32, base + lse_u_off, 3, l3);
            up.softmax_lse = &lse_u;
        }
        const pa_call_flags suffix_flags = {.out_f32 = true};
        st = pa_attention_flagged(ctx, &up, varlen, &suffix_flags);
        pa_status st_join = lanes ? ops->lane_join(ctx, dev) : PA_OK;
        if (st) return pa_fail_prefix(ctx, st, "batch:attention (suffix level)");
        if (st_join) return pa_fail_prefix(ctx, st_join, "batch:attention (joining the second queue)");
        ci->last_calls++;
    }

    /* out: every row from the suffix level's, merged with the shared
     * level's where the row has one (row_of: -1 where not), rounded once;
     * lse in place */
    pa_merge_problem mp;
    memset(&mp, 0, sizeof mp);
    mp.dev = dev;
    mp.dtype = dt;
    mp.state_dtype = PA_F32;
    mp.num_states = 2;
    mp.heads = (int32_t)H;
    mp.head_dim = (int32_t)D;
    mp.rows = T;
    mp.states[0].o = o_u.data;
    mp.states[0].lse = p->softmax_lse ? p->softmax_lse->data : lse_u.data;
    mp.states[0].lse_seq = lse_seq;
    mp.states[1].o = o_sh.data;
    mp.states[1].lse = lse_sh.data;
    mp.states[1].lse_seq = S;
    mp.states[1].rows = field(b, PA_BATCH_PREFIX_ROW_OF)->data;
    mp.out = p->out->data;
    mp.out_lse = p->softmax_lse ? p->softmax_lse->data : NULL;
    mp.out_lse_seq = lse_seq;
    pa_mirror_invalidate(p->out);
    st = pa_merge_run(ctx, &mp);
    if (st) return pa_fail_prefix(ctx, st, "batch:attention (merge)");
    return PA_OK;
}
