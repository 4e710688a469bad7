/*
 * pool_prefix.c -- the pool's prefix-caching calls: turning the cache on and
 * off, looking a prefix up, attaching cached pages to a new sequence, and
 * registering a sequence's full pages. They change both the pool (refcounts,
 * the free stack, sequences) and its cache index (prefix_cache.c), which
 * itself never calls back into the pool.
 */
#include "pool.h"

pa_status pa_pool_prefix_cache(pa_context *ctx, pa_pool *pool, int32_t on) {
    if (!pool) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: NULL");
    if (on && pool->pc) return PA_OK;
    if (!on) {
        pa_prefix_cache *pc = pool->pc;
        if (!pc) return PA_OK;
        /* idle pages are free pages: back on the stack, oldest release on top last */
        for (int32_t p = pc->head; p >= 0; p = pc->next[p]) pa_pool_push_page(pool, p);
        pool->pc = NULL;
        pa_prefix_destroy(pc);
        return PA_OK;
    }
    pa_prefix_cache *pc = pa_prefix_create(pool->num_pages);
    if (!pc)
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "pool: out of host memory for the prefix cache of %lld pages",
                       (long long)pool->num_pages);
    pool->pc = pc;
    return PA_OK;
}

/* ---- lookup, attach, insert ---- */

int64_t pa_pool_prefix_lookup(const pa_pool *pool, int64_t n, const uint64_t *hashes, int64_t *idle) {
    int64_t m = 0, unheld = 0;
    if (pool && pool->pc && hashes) {
        const pa_prefix_cache *pc = pool->pc;
        for (; m < n; m++) {
            int32_t p = pa_prefix_find(pc, hashes[m]);
            if (p < 0) break;
            if (pc->state[p] & PA_PC_IDLE) unheld++;
        }
    }
    if (idle) *idle = unheld;
    return m;
}

static pa_status live_seq(pa_context *ctx, pa_pool *pool, int32_t id, pa_seq **out) {
    *out = NULL;
    if (!pool) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: NULL");
    *out = pa_pool_seq(pool, id);
    if (!*out) return pa_fail(ctx, PA_ERR_ARGUMENT, "seq: %d is not a live sequence of this pool (freed, or never created)", id);
    if (!pool->pc) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: prefix caching is off (pa_pool_prefix_cache)");
    return PA_OK;
}

pa_status pa_seq_prefix_attach(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t n,
                               const uint64_t *hashes, int64_t *matched) {
    pa_seq *s = NULL;
    pa_status st = live_seq(ctx, pool, seq, &s);
    if (st) return st;
    if (n < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "n: %lld is negative", (long long)n);
    if (n > 0 && !hashes) return pa_fail(ctx, PA_ERR_ARGUMENT, "hashes: NULL");
    if (s->num_pages != 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "seq: %d holds %d pages; attach starts an empty sequence", seq, s->num_pages);
    pa_prefix_cache *pc = pool->pc;
    const int64_t m = pa_pool_prefix_lookup(pool, n, hashes, NULL);
    if (m * (int64_t)pool->page_size > PA_MAX_SEQ_LEN)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "n: %lld matched pages are more than 2^30 (PA_MAX_SEQLEN) tokens", (long long)m);
    st = pa_seq_ensure_cap(ctx, s, m); /* the one thing that can fail: before any change */
    if (st) return st;
    for (int64_t i = 0; i < m; i++) {
        int32_t p = pa_prefix_find(pc, hashes[i]);
        pa_prefix_acquire(pc, p);
        pa_pool_page_ref(pool, p);
        s->pages[i] = p;
    }
    s->num_pages = (int32_t)m;
    s->len = m * pool->page_size;
    pool->tokens += s->len;
    pc->hits += m;
    pc->misses += n - m;
    int64_t used = pool->num_pages - pa_pool_available(pool);
    if (used > pool->peak_used) pool->peak_used = used;
    if (matched) *matched = m;
    return PA_OK;
}

pa_status pa_seq_prefix_insert(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t first, int64_t n,
                               const uint64_t *hashes, int64_t *inserted) {
    pa_seq *s = NULL;
    pa_status st = live_seq(ctx, pool, seq, &s);
    if (st) return st;
    if (first < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "first: %lld is negative", (long long)first);
    if (n < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "n: %lld is negative", (long long)n);
    if (n > 0 && !hashes) return pa_fail(ctx, PA_ERR_ARGUMENT, "hashes: NULL");
    const int64_t full = s->len / pool->page_size;
    if (first + n > full)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "n: pages [%lld, %lld) of sequence %d are not all full (it has %lld tokens: %lld full pages of %d)",
                       (long long)first, (long long)(first + n), seq, (long long)s->len, (long long)full,
                       pool->page_size);
    pa_prefix_cache *pc = pool->pc;
    for (int64_t i = 0; i < n; i++) {
        int32_t p = s->pages[first + i];
        if ((pc->state[p] & PA_PC_CACHED) && pc->hash[p] != hashes[i])
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "hashes: entry %lld differs from the hash page %d (page %lld of sequence %d) is cached under",
                           (long long)i, p, (long long)(first + i), seq);
    }
    int64_t added = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t p = s->pages[first + i];
        if (pc->state[p] & PA_PC_CACHED) continue;
        if (pa_prefix_find(pc, hashes[i]) >= 0) continue; /* the same contents in another page: first come stays */
        pa_prefix_insert(pc, p, hashes[i]);
        added++;
    }
    if (inserted) *inserted = added;
    return PA_OK;
}
