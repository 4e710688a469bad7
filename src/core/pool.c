/*
 * pool.c -- the page pool and its sequences: O(1) page allocation from a free
 * stack, refcounted sharing between forked sequences, copy-on-write of a
 * shared partial page, and an invariant checker for the property specs.
 *
 * Every operation plans first and changes nothing until it cannot fail any
 * more: host memory is grown and device copies are made before the pool's
 * state moves, so a failed call (out of pages, out of memory, a device error)
 * leaves the pool exactly as it was.
 */
#include "pool.h"

#include <stdio.h>
#include <stdlib.h>

#define INITIAL_SEQ_SLOTS 64

void pa_pool_params_init(pa_pool_params *p) {
    if (p) memset(p, 0, sizeof *p);
}

/* ---- pages ---- */

int32_t pa_pool_pop_page(pa_pool *pool) {
    if (pool->free_top > 0) return pool->free_stack[--pool->free_top];
    return pa_prefix_evict(pool->pc); /* only idle cached pages are left */
}

void pa_pool_push_page(pa_pool *pool, int32_t page) { pool->free_stack[pool->free_top++] = page; }

void pa_pool_page_ref(pa_pool *pool, int32_t page) {
    if (++pool->refcount[page] == 2) pool->shared_pages++;
    pool->page_refs++;
}

void pa_pool_page_unref(pa_pool *pool, int32_t page) {
    int32_t rc = --pool->refcount[page];
    pool->page_refs--;
    if (rc == 1) pool->shared_pages--;
    else if (rc == 0) {
        if (pool->pc && (pool->pc->state[page] & PA_PC_CACHED)) pa_prefix_release(pool->pc, page);
        else pa_pool_push_page(pool, page);
    }
}

static void note_peak(pa_pool *pool) {
    int64_t used = pool->num_pages - pa_pool_available(pool);
    if (used > pool->peak_used) pool->peak_used = used;
}

pa_status pa_pool_copy_page(pa_context *ctx, pa_pool *pool, int32_t dst, int32_t src,
                            int64_t slots) {
    if (slots <= 0) return PA_OK;
    for (int32_t l = 0; l < pool->num_layers; l++) {
        const pa_cache_pair *c = &pool->layers[l];
        size_t bytes = (size_t)slots * c->token_bytes;
        size_t d = (size_t)dst * c->page_bytes, s = (size_t)src * c->page_bytes;
        pa_device *dev = c->k->dev;
        pa_status st = dev->ops->copy(ctx, dev, (char *)c->k->data + d, (char *)c->k->data + s, bytes);
        if (st == PA_OK)
            st = dev->ops->copy(ctx, dev, (char *)c->v->data + d, (char *)c->v->data + s, bytes);
        pa_mirror_invalidate(c->k); /* (caches are not i32 in practice) */
        pa_mirror_invalidate(c->v);
        if (st != PA_OK) return pa_fail_prefix(ctx, st, "copy-on-write of a shared page");
    }
    return PA_OK;
}

uint32_t pa_pool_next_epoch(pa_pool *pool) {
    if (++pool->epoch == 0) {
        memset(pool->page_stamp, 0, sizeof(uint32_t) * (size_t)pool->num_pages);
        for (int32_t i = 0; i < pool->seq_cap; i++) pool->seqs[i].stamp = 0;
        pool->epoch = 1;
    }
    return pool->epoch;
}

/* ---- create / destroy ---- */

static pa_status check_layers(pa_context *ctx, const pa_pool_params *p, int64_t *num_pages,
                              int32_t *page_size) {
    if (!p->k_caches) return pa_fail(ctx, PA_ERR_ARGUMENT, "k_caches: NULL with num_layers = %d", p->num_layers);
    if (!p->v_caches) return pa_fail(ctx, PA_ERR_ARGUMENT, "v_caches: NULL with num_layers = %d", p->num_layers);
    const pa_device *dev = NULL;
    for (int32_t l = 0; l < p->num_layers; l++) {
        const pa_tensor *k = p->k_caches[l], *v = p->v_caches[l];
        char got[160], want[160];
        if (!k) return pa_fail(ctx, PA_ERR_ARGUMENT, "k_caches[%d]: NULL", l);
        if (!v) return pa_fail(ctx, PA_ERR_ARGUMENT, "v_caches[%d]: NULL", l);
        if (k->ndim != 4)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "k_caches[%d]: expected 4 dimensions [num_pages, page_size, Hk, D], got %s",
                           l, pa_shape_str(k, got, sizeof got));
        if (l == 0) {
            dev = k->dev;
            if (*num_pages == 0) *num_pages = k->shape[0];
            if (*page_size == 0) {
                if (k->shape[1] > INT32_MAX)
                    return pa_fail(ctx, PA_ERR_ARGUMENT, "k_caches[0]: page_size %lld exceeds 2^31 - 1",
                                   (long long)k->shape[1]);
                *page_size = (int32_t)k->shape[1];
            }
        }
        if (k->shape[0] != *num_pages || k->shape[1] != *page_size)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "k_caches[%d]: shape %s, expected [%lld, %d, Hk, D] (num_pages, page_size)",
                           l, pa_shape_str(k, got, sizeof got), (long long)*num_pages, *page_size);
        if (v->ndim != 4 || memcmp(v->shape, k->shape, 4 * sizeof k->shape[0]) != 0)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "v_caches[%d]: shape %s differs from k_caches[%d] %s",
                           l, pa_shape_str(v, got, sizeof got), l, pa_shape_str(k, want, sizeof want));
        if (v->dtype != k->dtype)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "v_caches[%d]: dtype %s differs from k_caches[%d] %s", l,
                           pa_dtype_name(v->dtype), l, pa_dtype_name(k->dtype));
        if (k->dev != dev)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "k_caches[%d]: on %s, but k_caches[0] is on %s", l,
                           k->dev->name, dev->name);
        if (v->dev != dev)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "v_caches[%d]: on %s, but k_caches[0] is on %s", l,
                           v->dev->name, dev->name);
        if (k == v)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "v_caches[%d]: is the same tensor as k_caches[%d]", l, l);
        for (int32_t m = 0; m < l; m++)
            if (p->k_caches[m] == k || p->v_caches[m] == k || p->k_caches[m] == v || p->v_caches[m] == v)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "%s[%d]: the same tensor serves layer %d too (each layer needs its own)",
                               (p->k_caches[m] == k || p->v_caches[m] == k) ? "k_caches" : "v_caches", l, m);
    }
    return PA_OK;
}

pa_status pa_pool_create(pa_context *ctx, const pa_pool_params *p, pa_pool **out) {
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: out is NULL");
    *out = NULL;
    if (!p) return pa_fail(ctx, PA_ERR_ARGUMENT, "params: NULL");
    if (p->num_layers < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "num_layers: %d is negative", p->num_layers);
    if (p->num_pages < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "num_pages: %lld is negative", (long long)p->num_pages);
    if (p->page_size < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "page_size: %d is negative", p->page_size);
    int64_t num_pages = p->num_pages;
    int32_t page_size = p->page_size;
    if (p->num_layers > 0) {
        pa_status st = check_layers(ctx, p, &num_pages, &page_size);
        if (st) return st;
    } else {
        if (num_pages == 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "num_pages: required without caches (num_layers = 0)");
        if (page_size == 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "page_size: required without caches (num_layers = 0)");
    }
    if (num_pages < 1 || num_pages > INT32_MAX)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "num_pages: %lld is not in [1, 2^31 - 1]", (long long)num_pages);
    if (page_size < 1) return pa_fail(ctx, PA_ERR_ARGUMENT, "page_size: %d must be >= 1", page_size);

    pa_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: out of host memory");
    size_t np = (size_t)num_pages;
    pool->num_pages = num_pages;
    pool->page_size = page_size;
    pool->num_layers = p->num_layers;
    pool->refcount = calloc(np, sizeof(int32_t));
    pool->free_stack = malloc(np * sizeof(int32_t));
    pool->page_stamp = calloc(np, sizeof(uint32_t));
    pool->page_drops = calloc(np, sizeof(int32_t));
    pool->seqs = calloc(INITIAL_SEQ_SLOTS, sizeof(pa_seq));
    pool->free_slots = malloc(INITIAL_SEQ_SLOTS * sizeof(int32_t));
    if (p->num_layers > 0) pool->layers = calloc((size_t)p->num_layers, sizeof(pa_cache_pair));
    if (!pool->refcount || !pool->free_stack || !pool->page_stamp || !pool->page_drops ||
        !pool->seqs || !pool->free_slots || (p->num_layers > 0 && !pool->layers)) {
        pa_pool_destroy(pool);
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: out of host memory for %lld pages",
                       (long long)num_pages);
    }
    /* pop order 0, 1, 2, ...: the stack's top is page 0 */
    for (int64_t i = 0; i < num_pages; i++) pool->free_stack[i] = (int32_t)(num_pages - 1 - i);
    pool->free_top = num_pages;
    pool->seq_cap = INITIAL_SEQ_SLOTS;
    for (int32_t i = 0; i < INITIAL_SEQ_SLOTS; i++) {
        pool->seqs[i].id = -1;
        pool->free_slots[i] = i;
    }
    pool->free_head = 0;
    pool->free_count = INITIAL_SEQ_SLOTS;
    for (int32_t l = 0; l < p->num_layers; l++) {
        pa_cache_pair *c = &pool->layers[l];
        c->k = p->k_caches[l];
        c->v = p->v_caches[l];
        c->token_bytes = (size_t)(c->k->shape[2] * c->k->shape[3]) * pa_dtype_size(c->k->dtype);
        c->page_bytes = c->token_bytes * (size_t)page_size;
    }
    pool->dev = p->num_layers > 0 ? p->k_caches[0]->dev : NULL;
    pool->ps_shift = -1;
    if ((page_size & (page_size - 1)) == 0)
        for (int32_t sh = 0; sh < 31; sh++)
            if ((1 << sh) == page_size) pool->ps_shift = sh;
    *out = pool;
    return PA_OK;
}

void pa_pool_destroy(pa_pool *pool) {
    if (!pool) return;
    if (pool->seqs)
        for (int32_t i = 0; i < pool->seq_cap; i++) free(pool->seqs[i].pages);
    free(pool->seqs);
    free(pool->free_slots);
    free(pool->refcount);
    free(pool->free_stack);
    free(pool->page_stamp);
    free(pool->page_drops);
    free(pool->layers);
    pa_prefix_destroy(pool->pc);
    free(pool);
}

void pa_pool_get_stats(const pa_pool *pool, pa_pool_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!pool) return;
    out->num_pages = pool->num_pages;
    out->page_size = pool->page_size;
    out->free_pages = pa_pool_available(pool);
    out->used_pages = pool->num_pages - out->free_pages;
    out->shared_pages = pool->shared_pages;
    out->page_refs = pool->page_refs;
    out->peak_used_pages = pool->peak_used;
    out->sequences = pool->live;
    out->tokens = pool->tokens;
    out->cow_copies = pool->cow_copies;
    if (pool->pc) {
        out->cached_pages = pool->pc->cached;
        out->prefix_hits = pool->pc->hits;
        out->prefix_misses = pool->pc->misses;
        out->prefix_evictions = pool->pc->evictions;
    }
}

int64_t pa_pool_num_pages(const pa_pool *pool) { return pool ? pool->num_pages : 0; }
int32_t pa_pool_page_size(const pa_pool *pool) { return pool ? pool->page_size : 0; }

int32_t pa_pool_page_refcount(const pa_pool *pool, int64_t page) {
    if (!pool || page < 0 || page >= pool->num_pages) return -1;
    return pool->refcount[page];
}

int64_t pa_pool_unused_slots(const pa_pool *pool) {
    if (!pool) return -1;
    int32_t *fill = calloc((size_t)pool->num_pages, sizeof(int32_t));
    if (!fill) return -1;
    const int32_t ps = pool->page_size;
    for (int32_t i = 0; i < pool->seq_cap; i++) {
        const pa_seq *s = &pool->seqs[i];
        if (s->id < 0) continue;
        int64_t covering = pa_pages_for(s->len, ps);
        for (int64_t j = 0; j < covering; j++) {
            int64_t f = s->len - j * ps;
            int32_t slots = f > ps ? ps : (int32_t)f;
            if (slots > fill[s->pages[j]]) fill[s->pages[j]] = slots;
        }
    }
    int64_t unused = 0;
    for (int64_t p = 0; p < pool->num_pages; p++)
        if (pool->refcount[p] > 0) unused += ps - fill[p];
    free(fill);
    return unused;
}

pa_status pa_pool_validate(pa_context *ctx, const pa_pool *pool) {
    if (!pool) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: NULL");
    const int64_t N = pool->num_pages;
    int32_t *refs = calloc((size_t)N, sizeof(int32_t));
    int32_t *in_stack = calloc((size_t)N, sizeof(int32_t));
    if (!refs || !in_stack) {
        free(refs);
        free(in_stack);
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: out of host memory to validate");
    }
    pa_status st = PA_OK;
#define BAD(...) do { st = pa_fail(ctx, PA_ERR_INTERNAL, "pool: " __VA_ARGS__); goto done; } while (0)
    int64_t live = 0, tokens = 0, page_refs = 0, shared = 0;
    for (int32_t i = 0; i < pool->seq_cap; i++) {
        const pa_seq *s = &pool->seqs[i];
        if (s->id < 0) continue;
        live++;
        tokens += s->len;
        if ((s->id & PA_SEQ_SLOT_MASK) != i) BAD("sequence %d sits in slot %d", s->id, i);
        if (s->len < 0 || s->num_pages < pa_pages_for(s->len, pool->page_size) || s->num_pages > s->cap)
            BAD("sequence %d: %lld tokens in %d pages (capacity %d)", s->id, (long long)s->len,
                s->num_pages, s->cap);
        for (int32_t j = 0; j < s->num_pages; j++) {
            int32_t p = s->pages[j];
            if (p < 0 || p >= N) BAD("sequence %d: page %d is %d, not a page of the pool", s->id, j, p);
            refs[p]++;
        }
    }
    for (int32_t i = 0; i < pool->seq_cap; i++) {
        const pa_seq *s = &pool->seqs[i];
        if (s->id < 0) continue;
        for (int32_t j = (int32_t)pa_pages_for(s->len, pool->page_size); j < s->num_pages; j++)
            if (refs[s->pages[j]] != 1)
                BAD("sequence %d: reserved page %d (page %d) is held %d times", s->id, j, s->pages[j],
                    refs[s->pages[j]]);
    }
    if (pool->free_top < 0 || pool->free_top > N) BAD("free stack top %lld", (long long)pool->free_top);
    for (int64_t k = 0; k < pool->free_top; k++) {
        int32_t p = pool->free_stack[k];
        if (p < 0 || p >= N) BAD("free stack entry %lld is %d", (long long)k, p);
        if (in_stack[p]++) BAD("page %d is on the free stack twice", p);
    }
    for (int64_t p = 0; p < N; p++) {
        if (pool->refcount[p] != refs[p])
            BAD("page %lld has refcount %d but %d references", (long long)p, pool->refcount[p], refs[p]);
        /* an unheld page is free: on the free stack, or cached and idle */
        const bool idle = pool->pc && (pool->pc->state[p] & PA_PC_IDLE);
        if ((refs[p] == 0) != (in_stack[p] != 0 || idle))
            BAD("page %lld has %d references and is %son the free stack%s", (long long)p, refs[p],
                in_stack[p] ? "" : "not ", idle ? " (idle in the prefix cache)" : "");
        if (in_stack[p] && idle) BAD("page %lld is both on the free stack and idle in the prefix cache", (long long)p);
        page_refs += refs[p];
        if (refs[p] >= 2) shared++;
    }
    if (live != pool->live) BAD("%lld live sequences, counted %d", (long long)live, pool->live);
    if (tokens != pool->tokens) BAD("%lld tokens, counted %lld", (long long)tokens, (long long)pool->tokens);
    if (page_refs != pool->page_refs)
        BAD("%lld page references, counted %lld", (long long)page_refs, (long long)pool->page_refs);
    if (shared != pool->shared_pages)
        BAD("%lld shared pages, counted %lld", (long long)shared, (long long)pool->shared_pages);
    if (pool->free_count + pool->live != pool->seq_cap)
        BAD("%d free slots + %d live sequences != %d slots", pool->free_count, pool->live, pool->seq_cap);
    if (pool->free_head < 0 || pool->free_head >= pool->seq_cap)
        BAD("free slot ring starts at %d of %d", pool->free_head, pool->seq_cap);
    for (int32_t k = 0; k < pool->free_count; k++) {
        int32_t slot = pool->free_slots[(pool->free_head + k) % pool->seq_cap];
        if (slot < 0 || slot >= pool->seq_cap || pool->seqs[slot].id != -1)
            BAD("free slot ring entry %d is slot %d, not a free slot", k, slot);
    }
    if (pool->pc) st = pa_prefix_validate(ctx, pool, refs, in_stack);
#undef BAD
done:
    free(refs);
    free(in_stack);
    return st;
}

/* ---- sequences ---- */

pa_status pa_seq_ensure_cap(pa_context *ctx, pa_seq *s, int64_t pages) {
    if (pages <= s->cap) return PA_OK;
    if (pages > INT32_MAX) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "sequence: more than 2^31 - 1 pages");
    int64_t cap = s->cap ? s->cap : 4;
    while (cap < pages) cap *= 2;
    if (cap > INT32_MAX) cap = INT32_MAX;
    int32_t *grown = realloc(s->pages, (size_t)cap * sizeof(int32_t));
    if (!grown) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "sequence: out of host memory for %lld pages", (long long)pages);
    s->pages = grown;
    s->cap = (int32_t)cap;
    return PA_OK;
}

void pa_seq_shrink(pa_pool *pool, pa_seq *s, int64_t len, int32_t keep_pages) {
    for (int32_t j = s->num_pages - 1; j >= keep_pages; j--) pa_pool_page_unref(pool, s->pages[j]);
    if (keep_pages < s->num_pages) s->num_pages = keep_pages;
    /* kept pages past the tokens (reserved) are written without a copy: out
     * of the cache (a partial last page stays: a write copies it first) */
    if (pool->pc) pa_prefix_uncache_from(pool->pc, s, pa_pages_for(len, pool->page_size));
    pool->tokens += len - s->len;
    s->len = len;
}

/* Makes sure a slot can be taken: grows the slot table while fewer than
 * PA_SEQ_SLOT_QUARANTINE slots are free (so that a freed slot waits behind
 * at least that many others before its next id), up to PA_SEQ_MAX_SLOTS.
 * Changes nothing visible: the slot is only taken by the caller's commit. */
static pa_status reserve_slot(pa_context *ctx, pa_pool *pool) {
    if (pool->free_count > PA_SEQ_SLOT_QUARANTINE) return PA_OK;
    if (pool->seq_cap >= PA_SEQ_MAX_SLOTS) {
        if (pool->free_count > 0) return PA_OK;
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: %d live sequences, the most one pool holds",
                       pool->seq_cap);
    }
    int32_t cap = pool->seq_cap * 2;
    pa_seq *seqs = realloc(pool->seqs, (size_t)cap * sizeof(pa_seq));
    if (!seqs) return pool->free_count > 0 ? PA_OK : pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: out of host memory for sequences");
    pool->seqs = seqs;
    int32_t *slots = malloc((size_t)cap * sizeof(int32_t));
    if (!slots) return pool->free_count > 0 ? PA_OK : pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: out of host memory for sequences");
    /* the ring in order, oldest first, then the new slots */
    for (int32_t k = 0; k < pool->free_count; k++)
        slots[k] = pool->free_slots[(pool->free_head + k) % pool->seq_cap];
    memset(seqs + pool->seq_cap, 0, (size_t)(cap - pool->seq_cap) * sizeof(pa_seq));
    int32_t count = pool->free_count;
    for (int32_t i = pool->seq_cap; i < cap; i++) {
        seqs[i].id = -1;
        slots[count++] = i;
    }
    free(pool->free_slots);
    pool->free_slots = slots;
    pool->free_head = 0;
    pool->free_count = count;
    pool->seq_cap = cap;
    return PA_OK;
}

static pa_seq *take_slot(pa_pool *pool) {
    int32_t slot = pool->free_slots[pool->free_head];
    pool->free_head = (pool->free_head + 1) % pool->seq_cap;
    pool->free_count--;
    pa_seq *s = &pool->seqs[slot];
    s->id = (s->gen << PA_SEQ_SLOT_BITS) | slot;
    s->len = 0;
    s->num_pages = 0;
    pool->live++;
    return s;
}

static pa_status lookup(pa_context *ctx, pa_pool *pool, int32_t id, const char *name, pa_seq **out) {
    if (!pool) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: NULL");
    *out = pa_pool_seq(pool, id);
    if (!*out) return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: %d is not a live sequence of this pool (freed, or never created)", name, id);
    return PA_OK;
}

pa_status pa_seq_create(pa_context *ctx, pa_pool *pool, int32_t *out_seq) {
    if (!pool) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: NULL");
    if (!out_seq) return pa_fail(ctx, PA_ERR_ARGUMENT, "seq: out is NULL");
    pa_status st = reserve_slot(ctx, pool);
    if (st) return st;
    *out_seq = take_slot(pool)->id;
    return PA_OK;
}

pa_status pa_seq_fork(pa_context *ctx, pa_pool *pool, int32_t parent, int32_t *out_seq) {
    pa_seq *s;
    pa_status st = lookup(ctx, pool, parent, "parent", &s);
    if (st) return st;
    if (!out_seq) return pa_fail(ctx, PA_ERR_ARGUMENT, "seq: out is NULL");
    st = reserve_slot(ctx, pool); /* may move pool->seqs */
    if (st) return st;
    s = pa_pool_seq(pool, parent);
    int32_t shared = (int32_t)pa_pages_for(s->len, pool->page_size);
    /* grow the child's page list before taking the slot: a failure then leaves nothing */
    pa_seq *child = &pool->seqs[pool->free_slots[pool->free_head]];
    st = pa_seq_ensure_cap(ctx, child, shared);
    if (st) return st;
    child = take_slot(pool);
    for (int32_t j = 0; j < shared; j++) {
        child->pages[j] = s->pages[j];
        pa_pool_page_ref(pool, s->pages[j]);
    }
    child->num_pages = shared;
    child->len = s->len;
    pool->tokens += s->len;
    *out_seq = child->id;
    return PA_OK;
}

/* reserve (advance = false) and append (advance = true) */
static pa_status seq_write(pa_context *ctx, pa_pool *pool, int32_t id, int64_t n, bool advance) {
    pa_seq *s;
    pa_status st = lookup(ctx, pool, id, "seq", &s);
    if (st) return st;
    if (n < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "n: %lld is negative", (long long)n);
    if (n > PA_MAX_SEQ_LEN - s->len)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "n: %lld more tokens would make the sequence (%lld tokens) longer than 2^30 (PA_MAX_SEQLEN)",
                       (long long)n, (long long)s->len);
    if (n == 0) return PA_OK;
    bool cow;
    int64_t need = pa_seq_plan(pool, s, n, &cow);
    if (need > pa_pool_available(pool))
        return pa_fail(ctx, PA_ERR_OUT_OF_PAGES,
                       "n: out of pages: %lld more tokens need %lld more pages%s, the pool has %lld free of %lld",
                       (long long)n, (long long)need, cow ? " (one a copy of a shared page)" : "",
                       (long long)pa_pool_available(pool), (long long)pool->num_pages);
    int64_t fresh = need - (cow ? 1 : 0);
    st = pa_seq_ensure_cap(ctx, s, s->num_pages + fresh);
    if (st) return st;
    if (cow) {
        int64_t idx = s->len / pool->page_size;
        int32_t old = s->pages[idx], copy = pa_pool_pop_page(pool);
        st = pa_pool_copy_page(ctx, pool, copy, old, s->len % pool->page_size);
        if (st) {
            pa_pool_push_page(pool, copy);
            return st;
        }
        pa_pool_page_ref(pool, copy);
        s->pages[idx] = copy;
        pa_pool_page_unref(pool, old);
        pool->cow_copies++;
    }
    for (int64_t j = 0; j < fresh; j++) {
        int32_t p = pa_pool_pop_page(pool);
        pa_pool_page_ref(pool, p);
        s->pages[s->num_pages++] = p;
    }
    note_peak(pool);
    if (advance) {
        s->len += n;
        pool->tokens += n;
    }
    return PA_OK;
}

pa_status pa_seq_reserve(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t n) {
    return seq_write(ctx, pool, seq, n, false);
}

pa_status pa_seq_append(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t n) {
    return seq_write(ctx, pool, seq, n, true);
}

pa_status pa_seq_truncate(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t len) {
    pa_seq *s;
    pa_status st = lookup(ctx, pool, seq, "seq", &s);
    if (st) return st;
    if (len < 0 || len > s->len)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "len: %lld is not in [0, %lld] (the sequence's length)",
                       (long long)len, (long long)s->len);
    pa_seq_shrink(pool, s, len, (int32_t)pa_pages_for(len, pool->page_size));
    return PA_OK;
}

pa_status pa_seq_free(pa_context *ctx, pa_pool *pool, int32_t seq) {
    pa_seq *s;
    pa_status st = lookup(ctx, pool, seq, "seq", &s);
    if (st) return st;
    pa_seq_shrink(pool, s, 0, 0);
    int32_t slot = seq & PA_SEQ_SLOT_MASK;
    s->id = -1;
    s->gen = (s->gen + 1) % PA_SEQ_GEN_LIMIT;
    s->stamp = 0;
    pool->free_slots[(pool->free_head + pool->free_count) % pool->seq_cap] = slot;
    pool->free_count++;
    pool->live--;
    return PA_OK;
}

int64_t pa_seq_len(const pa_pool *pool, int32_t seq) {
    const pa_seq *s = pool ? pa_pool_seq(pool, seq) : NULL;
    return s ? s->len : -1;
}

int64_t pa_seq_num_pages(const pa_pool *pool, int32_t seq) {
    const pa_seq *s = pool ? pa_pool_seq(pool, seq) : NULL;
    return s ? s->num_pages : -1;
}

int64_t pa_seq_pages_needed(const pa_pool *pool, int32_t seq, int64_t n) {
    const pa_seq *s = pool ? pa_pool_seq(pool, seq) : NULL;
    if (!s || n < 0 || n > PA_MAX_SEQ_LEN - s->len) return -1;
    bool cow;
    return pa_seq_plan(pool, s, n, &cow);
}

int64_t pa_seq_pages(const pa_pool *pool, int32_t seq, int32_t *dst, int64_t cap) {
    const pa_seq *s = pool ? pa_pool_seq(pool, seq) : NULL;
    if (!s) return -1;
    int64_t n = s->num_pages < cap ? s->num_pages : cap;
    if (n > 0 && dst) memcpy(dst, s->pages, (size_t)n * sizeof(int32_t));
    return s->num_pages;
}
