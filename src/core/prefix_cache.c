/*
 * prefix_cache.c -- automatic prefix caching in the page pool: full pages
 * registered under chain hashes of their contents, found again by later
 * sequences with the same prefix, kept after their last holder lets them go,
 * and evicted least recently released first when the free stack runs dry.
 *
 * A page's state: held or not (its refcount), and cached or not. Cached and
 * unheld ("idle") pages sit on a doubly linked list through the pages,
 * oldest release at the head; they count as free (pa_pool_available), and
 * pa_pool_pop_page takes the head when the free stack is empty. Pages are
 * released last page first (pa_seq_shrink), so a sequence's tail leaves the
 * cache before the prefix it shares with others.
 *
 * The table: open addressing over page ids with linear probing and
 * backward-shift deletion, at least twice as many slots as pages (so at most
 * half full, a handful of probes). Each page is in it at most once.
 *
 * This file is the index and its invariants; it calls nothing of the pool
 * (pool_prefix.c holds the pool's calls that use it: on/off, lookup, attach,
 * insert).
 *
 * A failed call of the pool changes nothing visible except this: a device
 * copy that fails after an allocation evicted an idle page leaves that page
 * free but no longer cached (its contents were about to be overwritten).
 */
#include "pool.h"

#include <stdlib.h>

void pa_prefix_params_init(pa_prefix_params *p) {
    if (p) memset(p, 0, sizeof *p);
}

/* splitmix64's finalizer: a bijection that spreads every input bit */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static inline uint64_t chain(uint64_t parent, uint64_t key) {
    return mix64(parent * 0x9e3779b97f4a7c15ULL ^ mix64(key + 0x632be59bd9b4e019ULL));
}

pa_status pa_prefix_hashes(pa_context *ctx, const pa_prefix_params *p, uint64_t *out) {
    if (!p) return pa_fail(ctx, PA_ERR_ARGUMENT, "params: NULL");
    if (p->num_pages < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "num_pages: %lld is negative", (long long)p->num_pages);
    if (p->num_pages == 0) return PA_OK;
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: NULL");
    if (!p->tokens == !p->keys)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "tokens, keys: give exactly one of them");
    if (p->tokens && p->page_size < 1)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "page_size: %d must be >= 1 with tokens", p->page_size);
    uint64_t h = p->parent;
    for (int64_t i = 0; i < p->num_pages; i++) {
        uint64_t key;
        if (p->keys) {
            key = p->keys[i];
        } else {
            /* a page's tokens, position by position */
            const int32_t *t = p->tokens + i * (int64_t)p->page_size;
            key = 0x84222325cbf29ce4ULL;
            for (int32_t j = 0; j < p->page_size; j++) key = mix64(key ^ (uint32_t)t[j]) + (uint64_t)j;
        }
        h = chain(h, key);
        out[i] = h;
    }
    return PA_OK;
}

/* ---- the table ---- */

static inline uint64_t home(const pa_prefix_cache *pc, uint64_t h) { return (h ^ (h >> 32)) & pc->mask; }

/* The page cached under h, or -1. */
static int32_t table_find(const pa_prefix_cache *pc, uint64_t h) {
    for (uint64_t i = home(pc, h);; i = (i + 1) & pc->mask) {
        int32_t p = pc->table[i];
        if (p < 0) return -1;
        if (pc->hash[p] == h) return p;
    }
}

static void table_insert(pa_prefix_cache *pc, int32_t page, uint64_t h) {
    uint64_t i = home(pc, h);
    while (pc->table[i] >= 0) i = (i + 1) & pc->mask;
    pc->table[i] = page;
    pc->hash[page] = h;
    pc->state[page] |= PA_PC_CACHED;
    pc->cached++;
}

/* Takes page out of the table; the entries after it in its probe run move
 * back, so that every entry stays reachable from its home slot. */
static void table_remove(pa_prefix_cache *pc, int32_t page) {
    uint64_t i = home(pc, pc->hash[page]);
    while (pc->table[i] != page) i = (i + 1) & pc->mask;
    uint64_t j = i;
    for (;;) {
        pc->table[i] = -1;
        for (;;) {
            j = (j + 1) & pc->mask;
            int32_t q = pc->table[j];
            if (q < 0) goto done;
            uint64_t k = home(pc, pc->hash[q]);
            /* q stays where it is if its home lies cyclically in (i, j] */
            bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
            if (!stays) {
                pc->table[i] = q;
                i = j;
                break;
            }
        }
    }
done:
    pc->state[page] &= (uint8_t)~PA_PC_CACHED;
    pc->cached--;
}

/* ---- the idle list ---- */

static void idle_push(pa_prefix_cache *pc, int32_t page) {
    pc->prev[page] = pc->tail;
    pc->next[page] = -1;
    if (pc->tail >= 0) pc->next[pc->tail] = page;
    else pc->head = page;
    pc->tail = page;
    pc->state[page] |= PA_PC_IDLE;
    pc->idle++;
}

static void idle_unlink(pa_prefix_cache *pc, int32_t page) {
    int32_t a = pc->prev[page], b = pc->next[page];
    if (a >= 0) pc->next[a] = b;
    else pc->head = b;
    if (b >= 0) pc->prev[b] = a;
    else pc->tail = a;
    pc->prev[page] = pc->next[page] = -1;
    pc->state[page] &= (uint8_t)~PA_PC_IDLE;
    pc->idle--;
}

int32_t pa_prefix_evict(pa_prefix_cache *pc) {
    int32_t page = pc->head;
    idle_unlink(pc, page);
    table_remove(pc, page);
    pc->evictions++;
    return page;
}

void pa_prefix_release(pa_prefix_cache *pc, int32_t page) { idle_push(pc, page); }

void pa_prefix_acquire(pa_prefix_cache *pc, int32_t page) {
    if (pc->state[page] & PA_PC_IDLE) idle_unlink(pc, page);
}

int32_t pa_prefix_find(const pa_prefix_cache *pc, uint64_t h) { return table_find(pc, h); }

void pa_prefix_insert(pa_prefix_cache *pc, int32_t page, uint64_t h) { table_insert(pc, page, h); }

void pa_prefix_uncache_from(pa_prefix_cache *pc, const pa_seq *s, int64_t from) {
    for (int64_t j = from; j < s->num_pages; j++) {
        int32_t p = s->pages[j];
        if (pc->state[p] & PA_PC_CACHED) table_remove(pc, p); /* held: never idle */
    }
}

/* ---- make, drop ---- */

void pa_prefix_destroy(pa_prefix_cache *pc) {
    if (!pc) return;
    free(pc->table);
    free(pc->hash);
    free(pc->prev);
    free(pc->next);
    free(pc->state);
    free(pc);
}

pa_prefix_cache *pa_prefix_create(int64_t num_pages) {
    const size_t n = (size_t)num_pages;
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)n) slots *= 2;
    pa_prefix_cache *pc = calloc(1, sizeof *pc);
    if (pc) {
        pc->table = malloc((size_t)slots * sizeof(int32_t));
        pc->hash = calloc(n, sizeof(uint64_t));
        pc->prev = malloc(n * sizeof(int32_t));
        pc->next = malloc(n * sizeof(int32_t));
        pc->state = calloc(n, 1);
    }
    if (!pc || !pc->table || !pc->hash || !pc->prev || !pc->next || !pc->state) {
        pa_prefix_destroy(pc);
        return NULL;
    }
    memset(pc->table, 0xff, (size_t)slots * sizeof(int32_t));
    memset(pc->prev, 0xff, n * sizeof(int32_t));
    memset(pc->next, 0xff, n * sizeof(int32_t));
    pc->mask = slots - 1;
    pc->head = pc->tail = -1;
    return pc;
}

/* ---- invariants ---- */

pa_status pa_prefix_validate(pa_context *ctx, const pa_pool *pool, const int32_t *refs,
                             const int32_t *in_stack) {
    const pa_prefix_cache *pc = pool->pc;
    const int64_t N = pool->num_pages;
#define BAD(...) return pa_fail(ctx, PA_ERR_INTERNAL, "prefix cache: " __VA_ARGS__)
    int64_t cached = 0, idle = 0, entries = 0;
    for (int64_t p = 0; p < N; p++) {
        const uint8_t st = pc->state[p];
        if (st & ~(PA_PC_CACHED | PA_PC_IDLE)) BAD("page %lld has state bits 0x%x", (long long)p, st);
        if ((st & PA_PC_IDLE) && !(st & PA_PC_CACHED)) BAD("page %lld is idle but not cached", (long long)p);
        if (st & PA_PC_CACHED) {
            cached++;
            if (table_find(pc, pc->hash[p]) != p)
                BAD("page %lld is not found under its hash %016llx", (long long)p, (unsigned long long)pc->hash[p]);
            /* an unheld cached page is idle; a held one is not (nor freed, nor evicted) */
            if ((refs[p] == 0) != ((st & PA_PC_IDLE) != 0))
                BAD("page %lld is cached with %d references but %sidle", (long long)p, refs[p],
                    (st & PA_PC_IDLE) ? "" : "not ");
            if (in_stack[p]) BAD("page %lld is cached and on the free stack", (long long)p);
        }
    }
    for (uint64_t i = 0; i <= pc->mask; i++) {
        int32_t p = pc->table[i];
        if (p < -1 || p >= N) BAD("slot %llu holds %d", (unsigned long long)i, p);
        if (p >= 0) {
            entries++;
            if (!(pc->state[p] & PA_PC_CACHED)) BAD("slot %llu holds page %d, which is not cached", (unsigned long long)i, p);
        }
    }
    if (cached != pc->cached || entries != cached)
        BAD("%lld cached pages, %lld table entries, counted %lld", (long long)cached, (long long)entries,
            (long long)pc->cached);
    int32_t prev = -1;
    for (int32_t p = pc->head; p >= 0; p = pc->next[p]) {
        if (p >= N) BAD("the idle list names page %d", p);
        if (++idle > N) BAD("the idle list has a cycle");
        if (!(pc->state[p] & PA_PC_IDLE)) BAD("page %d is on the idle list but not idle", p);
        if (pc->prev[p] != prev) BAD("page %d's previous is %d, not %d", p, pc->prev[p], prev);
        prev = p;
    }
    if (prev != pc->tail) BAD("the idle list ends at %d, its tail is %d", prev, pc->tail);
    if (idle != pc->idle) BAD("%lld idle pages on the list, counted %lld", (long long)idle, (long long)pc->idle);
    /* a cached page is never written: a sequence's writes go to its partial
     * last page (copied first when cached) and to its reserved pages, which
     * must not be cached */
    for (int32_t i = 0; i < pool->seq_cap; i++) {
        const pa_seq *s = &pool->seqs[i];
        if (s->id < 0) continue;
        for (int32_t j = (int32_t)pa_pages_for(s->len, pool->page_size); j < s->num_pages; j++)
            if (pc->state[s->pages[j]] & PA_PC_CACHED)
                BAD("page %d (reserved page %d of sequence %d, %lld tokens) is cached", s->pages[j], j, s->id,
                    (long long)s->len);
    }
#undef BAD
    return PA_OK;
}
