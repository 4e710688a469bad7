/*
 * pool.h -- the page pool's and the sequences' internals, shared by pool.c
 * (allocation, refcounts, copy-on-write) and batch.c (staging).
 *
 * Invariants (pa_pool_validate checks them all):
 *  - refcount[p] = the number of (sequence, index) pairs naming page p;
 *  - the free stack and the prefix cache's idle list together hold exactly
 *    the pages with refcount 0, each once (prefix_cache.c: its invariants);
 *  - the pages of a sequence past ceil(len / page_size) (reserved, empty)
 *    have refcount 1: only pages holding tokens are ever shared;
 *  - shared_pages, page_refs and tokens match a recount.
 */
#ifndef PA_POOL_H
#define PA_POOL_H

#include "internal.h"

/* A sequence id is (generation << PA_SEQ_SLOT_BITS) | slot: at most 2^16
 * live sequences a pool, 2^15 generations a slot. Free slots are reused
 * first in, first out, and only while at least PA_SEQ_SLOT_QUARANTINE of
 * them are free (the table grows otherwise), so an id comes back only after
 * 2^15 * 1024 = 2^25 frees at the least: a stale id is reported, not
 * silently taken for a newer sequence. */
#define PA_SEQ_SLOT_BITS 16
#define PA_SEQ_SLOT_MASK ((1 << PA_SEQ_SLOT_BITS) - 1)
#define PA_SEQ_MAX_SLOTS (1 << PA_SEQ_SLOT_BITS)
#define PA_SEQ_GEN_LIMIT (1 << (31 - PA_SEQ_SLOT_BITS))
#define PA_SEQ_SLOT_QUARANTINE 1024
#define PA_MAX_SEQ_LEN PA_MAX_SEQLEN

typedef struct pa_seq {
    int32_t id;        /* -1 while the slot is free */
    int32_t num_pages; /* pages held, including reserved ones */
    int32_t cap;       /* capacity of pages[] */
    int32_t gen;       /* generation of the slot's current/next id */
    int64_t len;       /* tokens */
    int32_t *pages;
    uint32_t stamp;    /* batch staging: the epoch this sequence was last seen */
    int32_t entry;     /* ... and at which entry */
} pa_seq;

typedef struct pa_cache_pair {
    pa_tensor *k, *v;
    size_t page_bytes;  /* bytes of one page of one tensor */
    size_t token_bytes; /* bytes of one token (all its kv heads) */
} pa_cache_pair;

struct pa_pool {
    int64_t num_pages;
    int32_t page_size;
    int32_t num_layers;
    pa_cache_pair *layers; /* [num_layers] */
    pa_device *dev;        /* the caches' device (borrowed), NULL without tensors */

    int32_t *refcount;   /* [num_pages] */
    int32_t *free_stack; /* [num_pages]; free_stack[0 .. free_top-1] */
    int64_t free_top;

    pa_seq *seqs; /* [seq_cap] slots */
    int32_t seq_cap;
    int32_t *free_slots; /* [seq_cap]; a FIFO ring of free slot numbers: the
                            oldest at free_head, free_count of them */
    int32_t free_head, free_count;
    int32_t live;

    /* staging scratch: per page, the epoch of its last plan and how many of
     * its references the plan already dropped by copying on write */
    uint32_t epoch;
    uint32_t *page_stamp;
    int32_t *page_drops;

    int64_t shared_pages, page_refs, tokens, cow_copies, peak_used;
    int32_t ps_shift; /* log2(page_size) when a power of two, else -1 */

    struct pa_prefix_cache *pc; /* prefix caching (prefix_cache.c); NULL while off */
};

/* The prefix cache: hash -> page in an open-addressing table (linear
 * probing, backward-shift deletion), and the cached pages that no sequence
 * holds on a doubly linked list through the pages, oldest release first. */
#define PA_PC_CACHED 1u /* the page is in the table under hash[page] */
#define PA_PC_IDLE 2u   /* ... and no sequence holds it: it is on the list */

typedef struct pa_prefix_cache {
    int32_t *table; /* [mask + 1] page ids, -1 = empty */
    uint64_t mask;
    uint64_t *hash;  /* [num_pages] */
    int32_t *prev, *next; /* [num_pages] the list; -1 = none */
    uint8_t *state;  /* [num_pages] PA_PC_* bits */
    int32_t head, tail; /* oldest, newest; -1 when empty */
    int64_t idle, cached;
    int64_t hits, misses, evictions;
} pa_prefix_cache;

/* Whether page is in the prefix cache: then nobody writes it (a write into
 * it copies it first, as for a shared page). */
static inline bool pa_pool_page_cached(const pa_pool *pool, int32_t page) {
    return pool->pc && (pool->pc->state[page] & PA_PC_CACHED);
}

/* Pages an allocation can take now: the free stack and the idle cached pages. */
static inline int64_t pa_pool_available(const pa_pool *pool) {
    return pool->free_top + (pool->pc ? pool->pc->idle : 0);
}

/* prefix_cache.c, the index (it calls nothing of the pool): make one for
 * num_pages pages (NULL when out of memory) and drop it; the page cached
 * under a hash, or -1; cache a page under a hash (it is not cached yet);
 * evict the oldest idle page (the list must not be empty) and return it; a
 * cached page whose last holder released it joins the idle list, and leaves
 * it when a sequence takes it again (acquire; a no-op when held); pages of s
 * from index `from` on that are cached leave the cache (they are s's reserved
 * pages: written without a copy); the cache's part of pa_pool_validate. The
 * pool's calls that use it are in pool_prefix.c. */
pa_prefix_cache *pa_prefix_create(int64_t num_pages);
void pa_prefix_destroy(pa_prefix_cache *pc);
int32_t pa_prefix_find(const pa_prefix_cache *pc, uint64_t h);
void pa_prefix_insert(pa_prefix_cache *pc, int32_t page, uint64_t h);
int32_t pa_prefix_evict(pa_prefix_cache *pc);
void pa_prefix_release(pa_prefix_cache *pc, int32_t page);
void pa_prefix_acquire(pa_prefix_cache *pc, int32_t page);
void pa_prefix_uncache_from(pa_prefix_cache *pc, const pa_seq *s, int64_t from);
pa_status pa_prefix_validate(pa_context *ctx, const pa_pool *pool, const int32_t *refs,
                             const int32_t *in_stack);

static inline pa_seq *pa_pool_seq(const pa_pool *pool, int32_t id) {
    if (id < 0) return NULL;
    int32_t slot = id & PA_SEQ_SLOT_MASK;
    if (slot >= pool->seq_cap) return NULL;
    pa_seq *s = &pool->seqs[slot];
    return s->id == id ? s : NULL;
}

static inline int64_t pa_pages_for(int64_t tokens, int32_t page_size) {
    return (tokens + page_size - 1) / page_size;
}

/* Token position -> page index and slot, for 0 <= x < 2^32 (every length
 * fits: they are <= PA_MAX_SEQLEN = 2^30). A shift for power-of-two page sizes, else a 32-bit
 * division: a 64-bit one costs up to ~90 cycles on some x86 cores, and
 * staging needs a few per sequence per step. */
static inline int32_t pa_page_index(const pa_pool *pool, int64_t x) {
    return pool->ps_shift >= 0 ? (int32_t)((uint64_t)x >> pool->ps_shift)
                               : (int32_t)((uint32_t)x / (uint32_t)pool->page_size);
}

static inline int32_t pa_page_slot(const pa_pool *pool, int64_t x) {
    return pool->ps_shift >= 0 ? (int32_t)((uint64_t)x & (uint32_t)(pool->page_size - 1))
                               : (int32_t)((uint32_t)x % (uint32_t)pool->page_size);
}

/* Pages that hold `tokens` tokens (tokens <= PA_MAX_SEQLEN). */
static inline int32_t pa_pool_pages_for(const pa_pool *pool, int64_t tokens) {
    return tokens > 0 ? pa_page_index(pool, tokens - 1) + 1 : 0;
}

/* Pages to take from the pool to write n more tokens into s (0 < n <=
 * PA_MAX_SEQ_LEN - s->len), and whether its partial last page is shared or
 * cached (so it must be copied first). */
static inline int64_t pa_seq_plan(const pa_pool *pool, const pa_seq *s, int64_t n, bool *cow) {
    *cow = false;
    if (n <= 0) return 0;
    int64_t fresh = pa_pages_for(s->len + n, pool->page_size) - s->num_pages;
    if (fresh < 0) fresh = 0;
    if (s->len % pool->page_size != 0) {
        const int32_t last = s->pages[s->len / pool->page_size];
        if (pool->refcount[last] > 1 || pa_pool_page_cached(pool, last)) *cow = true;
    }
    return fresh + (*cow ? 1 : 0);
}

/* Grows s->pages to hold `pages` entries (host memory only; nothing else
 * changes, so a failure leaves the pool as it was). */
pa_status pa_seq_ensure_cap(pa_context *ctx, pa_seq *s, int64_t pages);

/* Page-level operations, all infallible once planned (pop evicts an idle
 * cached page when the free stack is empty). */
int32_t pa_pool_pop_page(pa_pool *pool);
void pa_pool_push_page(pa_pool *pool, int32_t page);
void pa_pool_page_ref(pa_pool *pool, int32_t page);
void pa_pool_page_unref(pa_pool *pool, int32_t page);

/* Copies the first `slots` token slots of page src into page dst, for every
 * layer's k and v (64-bit byte offsets). */
pa_status pa_pool_copy_page(pa_context *ctx, pa_pool *pool, int32_t dst, int32_t src,
                            int64_t slots);

/* Makes s hold only its first keep_pages pages and have length len
 * (len <= keep_pages * page_size), releasing the rest. */
void pa_seq_shrink(pa_pool *pool, pa_seq *s, int64_t len, int32_t keep_pages);

/* Takes a fresh epoch for a staging plan (resets the stamps on wrap-around). */
uint32_t pa_pool_next_epoch(pa_pool *pool);

#endif /* PA_POOL_H */
