/*
 * batch.c -- batch staging: from (sequence, new tokens) pairs, append to every
 * sequence (all or nothing) and write the index tensors of one attention step
 * (padded block table, seqlens, cu_seqlens_q, positions, and FlashInfer's CSR
 * form) into one device buffer that is reused from step to step.
 *
 * This is the hot path of a serving loop (hundreds of sequences, every decode
 * step), so it is one pass to plan, one to commit and one to write, with no
 * allocation once the buffers have grown to the workload. All arrays are
 * written into one host buffer (the device buffer itself when the host can
 * address it) and go to the device in one upload. That host buffer is then
 * the views' host mirror (tensor.c), until the next stage starts: attention
 * on the views plans from it without downloading them.
 */
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>

#define ALIGN_ELEMS 16 /* each array starts on a 64-byte boundary */

pa_status pa_batch_create(pa_context *ctx, pa_pool *pool, pa_device *dev, int32_t flags,
                          pa_batch **out) {
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: out is NULL");
    *out = NULL;
    if (!pool) return pa_fail(ctx, PA_ERR_ARGUMENT, "pool: NULL");
    if (flags & ~(int32_t)(PA_BATCH_NO_CSR | PA_BATCH_CASCADE))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "flags: unknown bits 0x%x", (unsigned)flags);
    if (!dev) dev = pool->dev;
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "dev: required (the pool has no cache tensors)");
    pa_batch *b = calloc(1, sizeof *b);
    if (!b) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory");
    b->pool = pool;
    pa_device_retain(dev);
    b->dev = dev;
    b->staged_n = -1;
    b->csr = !(flags & PA_BATCH_NO_CSR);
    b->cascade = (flags & PA_BATCH_CASCADE) != 0;
    for (int f = 0; f < PA_BATCH_NUM_FIELDS; f++) {
        pa_tensor *t = &b->views[f];
        t->dev = dev;
        t->dtype = PA_I32;
        t->ndim = f == PA_BATCH_BLOCK_TABLE || f == PA_BATCH_PREFIX_BLOCK_TABLE || f == PA_BATCH_SUFFIX_BLOCK_TABLE ? 2 : 1;
    }
    b->views[PA_BATCH_CU_SEQLENS_Q].shape[0] = 1;
    b->views[PA_BATCH_CU_SEQLENS_Q].numel = 1;
    b->views[PA_BATCH_KV_INDPTR].shape[0] = 1;
    b->views[PA_BATCH_KV_INDPTR].numel = 1;
    b->views[PA_BATCH_PREFIX_CU_SEQLENS_Q].shape[0] = 1;
    b->views[PA_BATCH_PREFIX_CU_SEQLENS_Q].numel = 1;
    b->cascade_info.max_grouped_pos = -1;
    b->cascade_info.last_fallback = b->cascade ? PA_CASCADE_NO_GROUPS : PA_CASCADE_OFF;
    *out = b;
    return PA_OK;
}

/* The views stop using the host buffer as their mirror (before it changes). */
static void views_drop_mirrors(pa_batch *b) {
    for (int f = 0; f < PA_BATCH_NUM_FIELDS; f++) {
        pa_tensor *t = &b->views[f];
        if (t->mirror_owned) free(t->mirror); /* one a user write made (tensor.c) */
        t->mirror = NULL;
        t->mirror_owned = false;
        t->mirror_valid = false;
    }
}

void pa_batch_destroy(pa_batch *b) {
    if (!b) return;
    views_drop_mirrors(b);
    if (b->dev_buf) {
        /* kernels queued by earlier steps may still read the buffer */
        b->dev->ops->synchronize(NULL, b->dev);
        b->dev->ops->free(b->dev, b->dev_buf);
    }
    pa_cascade_release(b); /* (after the synchronize: its scratch too may be read) */
    free(b->host_buf);
    free(b->entries);
    free(b->undo);
    pa_device_release(b->dev);
    free(b);
}

pa_tensor *pa_batch_tensor(const pa_batch *b, pa_batch_field field) {
    if (!b || (int)field < 0 || field >= PA_BATCH_NUM_FIELDS) return NULL;
    return (pa_tensor *)&b->views[field];
}

static pa_status grow_entries(pa_context *ctx, pa_batch *b, int32_t n) {
    if (n <= b->entry_cap) return PA_OK;
    int64_t cap = b->entry_cap ? b->entry_cap : 64;
    while (cap < n) cap *= 2;
    if (cap > INT32_MAX) cap = INT32_MAX;
    entry *e = realloc(b->entries, (size_t)cap * sizeof *e);
    if (!e) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory");
    b->entries = e;
    b->entry_cap = (int32_t)cap;
    return PA_OK;
}

/* Room for the undo record of n entries (the record itself is kept). */
static pa_status grow_undo(pa_context *ctx, pa_batch *b, int32_t n) {
    if (n <= b->undo_cap) return PA_OK;
    undo_entry *u = realloc(b->undo, (size_t)b->entry_cap * sizeof *u);
    if (!u) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory");
    b->undo = u;
    b->undo_cap = b->entry_cap;
    return PA_OK;
}

/* New staging buffers, made by prepare_buffer and put in place by
 * install_buffer once the stage can no longer fail: until then the views of
 * the last stage keep reading the old ones. */
typedef struct buffer_swap {
    void *dev_buf;
    int32_t *host_buf;
    size_t cap;
} buffer_swap;

/* Makes buffers for `elems` int32 when the current ones are smaller, and
 * waits for queued kernels (which may read the old buffer, freed at install). */
static pa_status prepare_buffer(pa_context *ctx, pa_batch *b, size_t elems, buffer_swap *sw) {
    memset(sw, 0, sizeof *sw);
    if (elems <= b->cap_elems) return PA_OK;
    if (elems > SIZE_MAX / 2 / sizeof(int32_t))
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: %zu staging elements is too many", elems);
    size_t cap = b->cap_elems ? b->cap_elems : 4096;
    while (cap < elems) cap *= 2;
    void *dbuf = NULL;
    pa_status st = b->dev->ops->alloc(ctx, b->dev, cap * sizeof(int32_t), &dbuf);
    if (st) return pa_fail_prefix(ctx, st, "batch: staging buffer");
    int32_t *hbuf = NULL;
    if (!b->dev->host_accessible) {
        hbuf = malloc(cap * sizeof(int32_t));
        if (!hbuf) {
            b->dev->ops->free(b->dev, dbuf);
            return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "batch: out of host memory for staging");
        }
    }
    if (b->dev_buf) {
        st = b->dev->ops->synchronize(ctx, b->dev);
        if (st) {
            b->dev->ops->free(b->dev, dbuf);
            free(hbuf);
            return st;
        }
    }
    sw->dev_buf = dbuf;
    sw->host_buf = hbuf;
    sw->cap = cap;
    return PA_OK;
}

static void drop_buffer(pa_batch *b, buffer_swap *sw) {
    if (sw->dev_buf) b->dev->ops->free(b->dev, sw->dev_buf);
    free(sw->host_buf);
    memset(sw, 0, sizeof *sw);
}

static void install_buffer(pa_batch *b, buffer_swap *sw) {
    if (!sw->dev_buf) return;
    if (b->dev_buf) b->dev->ops->free(b->dev, b->dev_buf);
    free(b->host_buf);
    b->dev_buf = sw->dev_buf;
    b->host_buf = sw->host_buf;
    b->cap_elems = sw->cap;
}

static size_t align_up(size_t n) { return (n + ALIGN_ELEMS - 1) & ~(size_t)(ALIGN_ELEMS - 1); }

/* After a successful upload: the view's shape, and its mirror (the host
 * buffer holds exactly what was uploaded; none when the host addresses the
 * device buffer, or when the view's address was handed out). */
static void set_view(pa_batch *b, pa_batch_field f, size_t off, int64_t d0, int64_t d1) {
    pa_tensor *t = &b->views[f];
    t->data = (int32_t *)b->dev_buf + off;
    t->shape[0] = d0;
    t->numel = d0;
    if (t->ndim == 2) {
        t->shape[1] = d1;
        t->numel = d0 * d1;
    }
    t->bytes = (size_t)t->numel * sizeof(int32_t);
    t->mirror = b->host_buf ? b->host_buf + off : NULL;
    t->mirror_owned = false;
    t->mirror_valid = t->mirror != NULL && !t->exposed;
    pa_mirror_changed(t); /* new contents, in the same tensor as last step's */
}

/* Writes the two-level plan's arrays (b->plan, after the commit: each
 * entry's pages are final) next to the plain ones already in base. */
static void write_cascade(pa_batch *b, int32_t n, int32_t *base, const size_t *off) {
    const pa_cascade_plan *cp = &b->plan;
    const int32_t G = cp->info.groups, PW = cp->info.prefix_width, SW = cp->info.suffix_width;
    const int32_t ps = b->pool->page_size;
    const int32_t *cache_seqlens = base + off[PA_BATCH_CACHE_SEQLENS];
    const int32_t *seqused = base + off[PA_BATCH_SEQUSED_K];
    const int32_t *cu = base + off[PA_BATCH_CU_SEQLENS_Q];
    int32_t *pbt = base + off[PA_BATCH_PREFIX_BLOCK_TABLE];
    int32_t *pk = base + off[PA_BATCH_PREFIX_SEQUSED_K];
    int32_t *pcu = base + off[PA_BATCH_PREFIX_CU_SEQLENS_Q];
    int32_t *prows = base + off[PA_BATCH_PREFIX_ROWS];
    int32_t *row_of = base + off[PA_BATCH_PREFIX_ROW_OF];
    int32_t *sbt = base + off[PA_BATCH_SUFFIX_BLOCK_TABLE];
    int32_t *scs = base + off[PA_BATCH_SUFFIX_CACHE_SEQLENS];
    int32_t *ssu = base + off[PA_BATCH_SUFFIX_SEQUSED_K];
    bool in_order = true;
    pcu[0] = 0;
    for (int32_t g = 0; g < G; g++) {
        const pa_seq *lead = b->entries[cp->group_lead[g]].seq;
        const int32_t pages = cp->group_pages[g];
        int32_t *row = pbt + (size_t)g * (size_t)PW;
        memcpy(row, lead->pages, (size_t)pages * sizeof(int32_t));
        if (pages < PW) memset(row + pages, 0, (size_t)(PW - pages) * sizeof(int32_t));
        pk[g] = pages * ps;
        pcu[g + 1] = pcu[g] + cp->group_q[g];
        cp->group_q[g] = pcu[g]; /* from here on: the next row of group g */
    }
    for (int32_t i = 0; i < n; i++) {
        const entry *e = &b->entries[i];
        const int32_t pre = cp->prefix[i], g = cp->group[i];
        const int32_t q0 = cu[i], nq = cu[i + 1] - cu[i];
        for (int32_t t = 0; t < nq; t++) {
            if (g >= 0) {
                const int32_t at = cp->group_q[g]++;
                prows[at] = q0 + t;
                row_of[q0 + t] = at;
                in_order = in_order && at == q0 + t;
            } else {
                row_of[q0 + t] = -1;
            }
        }
        const int32_t pages = e->pages_after - pre;
        int32_t *row = sbt + (size_t)i * (size_t)SW;
        if (pages > 0) memcpy(row, e->seq->pages + pre, (size_t)pages * sizeof(int32_t));
        if (pages < SW) memset(row + (pages > 0 ? pages : 0), 0, (size_t)(SW - (pages > 0 ? pages : 0)) * sizeof(int32_t));
        scs[i] = cache_seqlens[i] - pre * ps;
        ssu[i] = seqused[i] - pre * ps;
    }
    b->plan.rows_in_order = in_order;
}

/* Returns the sequences of the undo record's first n entries to their state
 * before the stage. */
static void rollback(pa_batch *b, int32_t n) {
    for (int32_t i = n - 1; i >= 0; i--) {
        const undo_entry *u = &b->undo[i];
        pa_seq_shrink(b->pool, pa_pool_seq(b->pool, u->id), u->before_len, u->before_pages);
    }
}

pa_status pa_batch_stage(pa_context *ctx, pa_batch *b, int32_t n, const int32_t *seqs,
                         const int32_t *num_new, pa_batch_info *info) {
    return pa_batch_stage_groups(ctx, b, n, seqs, num_new, NULL, info);
}

pa_status pa_batch_stage_groups(pa_context *ctx, pa_batch *b, int32_t n, const int32_t *seqs,
                                const int32_t *num_new, const int32_t *groups, pa_batch_info *info) {
    if (!b) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: NULL");
    if (groups && !b->cascade)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "groups: the batch stages no cascade plan (made without PA_BATCH_CASCADE)");
    if (n < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "n: %d is negative", n);
    if (n > 0 && !seqs) return pa_fail(ctx, PA_ERR_ARGUMENT, "seqs: NULL");
    if (n > 0 && !num_new) return pa_fail(ctx, PA_ERR_ARGUMENT, "num_new: NULL");
    pa_pool *pool = b->pool;
    const int32_t ps = pool->page_size;
    pa_status st = grow_entries(ctx, b, n);
    if (st == PA_OK) st = grow_undo(ctx, b, n);
    if (st) return st;

    /* 1. validate and plan: which pages each entry takes, and the shapes */
    const uint32_t epoch = pa_pool_next_epoch(pool);
    int64_t need = 0, cows = 0, total_q = 0, nnz = 0;
    int32_t width = 1, max_q = 0, max_k = 0;
    for (int32_t i = 0; i < n; i++) {
        pa_seq *s = pa_pool_seq(pool, seqs[i]);
        if (!s)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "seqs: entry %d (%d) is not a live sequence of the pool", i, seqs[i]);
        if (s->stamp == epoch)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "seqs: sequence %d appears twice (entries %d and %d)",
                           seqs[i], s->entry, i);
        s->stamp = epoch;
        s->entry = i;
        const int32_t nn = num_new[i];
        if (nn < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "num_new: entry %d is %d (negative)", i, nn);
        const int64_t len = s->len, end = len + nn;
        if (end > PA_MAX_SEQ_LEN)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "num_new: entry %d: %d more tokens make sequence %d longer than 2^30 (PA_MAX_SEQLEN)",
                           i, nn, seqs[i]);
        const int32_t pages_after = pa_pool_pages_for(pool, end);
        entry *e = &b->entries[i];
        e->seq = s;
        e->num_new = nn;
        e->pages_after = pages_after;
        e->fresh = pages_after > s->num_pages ? pages_after - s->num_pages : 0;
        e->cow = false;
        e->cow_page = -1;
        if (nn > 0 && pa_page_slot(pool, len) != 0) {
            /* several entries may share this page: the last writer keeps it.
             * (An unshared page, the usual case, needs no look at the stamps.) */
            const int32_t p = s->pages[pa_page_index(pool, len)];
            const int32_t rc = pool->refcount[p];
            const bool cached = pa_pool_page_cached(pool, p); /* never written: every writer copies */
            if (rc > 1 || cached) {
                if (pool->page_stamp[p] != epoch) {
                    pool->page_stamp[p] = epoch;
                    pool->page_drops[p] = 0;
                }
                if (cached || rc - pool->page_drops[p] > 1) {
                    e->cow = true;
                    pool->page_drops[p]++;
                    cows++;
                }
            }
        }
        need += e->fresh;
        total_q += nn;
        nnz += pages_after;
        if (pages_after > width) width = pages_after;
        if (nn > max_q) max_q = nn;
        if (end > max_k) max_k = (int32_t)end;
    }
    need += cows;
    if (total_q > INT32_MAX || nnz > INT32_MAX)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "seqs: the batch has more than 2^31 - 1 new tokens or pages");
    if (need > pa_pool_available(pool))
        return pa_fail(ctx, PA_ERR_OUT_OF_PAGES,
                       "seqs: out of pages: the batch needs %lld more pages (%lld of them copies of shared pages), the pool has %lld free of %lld",
                       (long long)need, (long long)cows, (long long)pa_pool_available(pool), (long long)pool->num_pages);
    /* the shared prefixes: pages before every entry's new tokens, which the
     * commit below does not touch */
    const pa_batch_cascade_info *cinfo = NULL;
    if (b->cascade) {
        st = pa_cascade_plan_stage(ctx, b, n, groups);
        if (st) return st;
        cinfo = &b->plan.info;
    }
    const bool two_level = cinfo && cinfo->groups > 0;

    /* layout of the staging buffer */
    const size_t B = (size_t)n, T = (size_t)total_q;
    size_t off[PA_BATCH_NUM_FIELDS], total = 0;
    const size_t len_of[PA_BATCH_NUM_FIELDS] = {
        [PA_BATCH_BLOCK_TABLE] = B * (size_t)width, [PA_BATCH_CACHE_SEQLENS] = B,
        [PA_BATCH_SEQUSED_K] = B, [PA_BATCH_CU_SEQLENS_Q] = B + 1, [PA_BATCH_POSITIONS] = T,
        [PA_BATCH_BATCH_INDICES] = T, [PA_BATCH_KV_INDPTR] = b->csr ? B + 1 : 0,
        [PA_BATCH_KV_INDICES] = b->csr ? (size_t)nnz : 0, [PA_BATCH_KV_LAST_PAGE_LEN] = b->csr ? B : 0,
        [PA_BATCH_PREFIX_BLOCK_TABLE] = two_level ? (size_t)cinfo->groups * (size_t)cinfo->prefix_width : 0,
        [PA_BATCH_PREFIX_SEQUSED_K] = two_level ? (size_t)cinfo->groups : 0,
        [PA_BATCH_PREFIX_CU_SEQLENS_Q] = two_level ? (size_t)cinfo->groups + 1 : 0,
        [PA_BATCH_PREFIX_ROWS] = two_level ? (size_t)cinfo->shared_q : 0,
        [PA_BATCH_PREFIX_ROW_OF] = two_level ? T : 0,
        [PA_BATCH_SUFFIX_BLOCK_TABLE] = two_level ? B * (size_t)cinfo->suffix_width : 0,
        [PA_BATCH_SUFFIX_CACHE_SEQLENS] = two_level ? B : 0,
        [PA_BATCH_SUFFIX_SEQUSED_K] = two_level ? B : 0,
    };
    for (int f = 0; f < PA_BATCH_NUM_FIELDS; f++) {
        off[f] = total;
        total += align_up(len_of[f]);
    }

    /* 2. everything that can fail, before anything moves (the last stage's
     * views, their mirrors and its undo record stay as they were) */
    buffer_swap sw;
    st = prepare_buffer(ctx, b, total, &sw);
    if (st) return st;
    for (int32_t i = 0; i < n; i++) {
        entry *e = &b->entries[i];
        if (e->fresh > 0) {
            st = pa_seq_ensure_cap(ctx, e->seq, (int64_t)e->seq->num_pages + e->fresh);
            if (st) {
                drop_buffer(b, &sw);
                return st;
            }
        }
    }
    for (int32_t i = 0; i < n && cows > 0; i++) {
        entry *e = &b->entries[i];
        if (!e->cow) continue;
        const pa_seq *s = e->seq;
        e->cow_page = pa_pool_pop_page(pool);
        st = pa_pool_copy_page(ctx, pool, e->cow_page, s->pages[pa_page_index(pool, s->len)],
                               pa_page_slot(pool, s->len));
        if (st) {
            for (int32_t j = i; j >= 0; j--) /* reverse order restores the stack */
                if (b->entries[j].cow_page >= 0) pa_pool_push_page(pool, b->entries[j].cow_page);
            drop_buffer(b, &sw);
            return st;
        }
    }

    /* 3. commit (cannot fail) and write the arrays, in one pass; the host
     * buffer is rewritten, so the views lose their mirrors (and read the
     * device) until set_view below */
    views_drop_mirrors(b);
    install_buffer(b, &sw);
    int32_t *base = b->dev->host_accessible ? (int32_t *)b->dev_buf : b->host_buf;
    int32_t *bt = base + off[PA_BATCH_BLOCK_TABLE];
    int32_t *cache_seqlens = base + off[PA_BATCH_CACHE_SEQLENS];
    int32_t *seqused = base + off[PA_BATCH_SEQUSED_K];
    int32_t *cu = base + off[PA_BATCH_CU_SEQLENS_Q];
    int32_t *pos = base + off[PA_BATCH_POSITIONS];
    int32_t *bidx = base + off[PA_BATCH_BATCH_INDICES];
    int32_t *indptr = base + off[PA_BATCH_KV_INDPTR];
    int32_t *indices = base + off[PA_BATCH_KV_INDICES];
    int32_t *last = base + off[PA_BATCH_KV_LAST_PAGE_LEN];
    int32_t q_at = 0, k_at = 0;
    const bool csr = b->csr;
    cu[0] = 0;
    if (csr) indptr[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        entry *e = &b->entries[i];
        pa_seq *s = e->seq;
        const int32_t before = (int32_t)s->len, nn = e->num_new, pages = e->pages_after;
        undo_entry *u = &b->undo[i];
        u->id = seqs[i];
        u->before_len = before;
        u->before_pages = s->num_pages;
        u->num_new = nn;
        u->fresh = e->fresh;
        if (e->cow_page >= 0) {
            int32_t *slot = &s->pages[pa_page_index(pool, before)];
            const int32_t old = *slot;
            pa_pool_page_ref(pool, e->cow_page);
            *slot = e->cow_page;
            pa_pool_page_unref(pool, old);
            pool->cow_copies++;
        }
        for (int32_t j = 0; j < e->fresh; j++) {
            const int32_t p = pa_pool_pop_page(pool);
            pa_pool_page_ref(pool, p);
            s->pages[s->num_pages++] = p;
        }
        const int32_t after = before + nn;
        s->len = after;

        cache_seqlens[i] = before;
        seqused[i] = after;
        for (int32_t t = 0; t < nn; t++) {
            pos[q_at + t] = before + t;
            bidx[q_at + t] = i;
        }
        q_at += nn;
        cu[i + 1] = q_at;
        int32_t *row = bt + (size_t)i * (size_t)width;
        if (pages > 0) memcpy(row, s->pages, (size_t)pages * sizeof(int32_t));
        if (pages < width) memset(row + pages, 0, (size_t)(width - pages) * sizeof(int32_t));
        if (csr) {
            if (pages > 0) memcpy(indices + k_at, row, (size_t)pages * sizeof(int32_t));
            k_at += pages;
            indptr[i + 1] = k_at;
            last[i] = pages ? after - (pages - 1) * ps : 0;
        }
    }
    if (two_level) write_cascade(b, n, base, off);
    pool->tokens += total_q;
    {
        int64_t used = pool->num_pages - pa_pool_available(pool);
        if (used > pool->peak_used) pool->peak_used = used;
    }
    if (!b->dev->host_accessible && total > 0) {
        st = b->dev->ops->upload(ctx, b->dev, b->dev_buf, b->host_buf, total * sizeof(int32_t));
        if (st) {
            rollback(b, n);
            b->staged_n = -1;
            /* the old buffer may be gone: the views hold nothing until a stage succeeds */
            for (int f = 0; f < PA_BATCH_NUM_FIELDS; f++) {
                pa_tensor *t = &b->views[f];
                t->data = NULL;
                t->numel = 0;
                t->bytes = 0;
                t->shape[0] = 0;
            }
            return pa_fail_prefix(ctx, st, "batch: uploading the staged tables");
        }
    }

    set_view(b, PA_BATCH_BLOCK_TABLE, off[PA_BATCH_BLOCK_TABLE], n, width);
    set_view(b, PA_BATCH_CACHE_SEQLENS, off[PA_BATCH_CACHE_SEQLENS], n, 0);
    set_view(b, PA_BATCH_SEQUSED_K, off[PA_BATCH_SEQUSED_K], n, 0);
    set_view(b, PA_BATCH_CU_SEQLENS_Q, off[PA_BATCH_CU_SEQLENS_Q], n + 1, 0);
    set_view(b, PA_BATCH_POSITIONS, off[PA_BATCH_POSITIONS], total_q, 0);
    set_view(b, PA_BATCH_BATCH_INDICES, off[PA_BATCH_BATCH_INDICES], total_q, 0);
    set_view(b, PA_BATCH_KV_INDPTR, off[PA_BATCH_KV_INDPTR], csr ? n + 1 : 0, 0);
    set_view(b, PA_BATCH_KV_INDICES, off[PA_BATCH_KV_INDICES], csr ? nnz : 0, 0);
    set_view(b, PA_BATCH_KV_LAST_PAGE_LEN, off[PA_BATCH_KV_LAST_PAGE_LEN], csr ? n : 0, 0);
    {
        const int32_t G = two_level ? cinfo->groups : 0;
        set_view(b, PA_BATCH_PREFIX_BLOCK_TABLE, off[PA_BATCH_PREFIX_BLOCK_TABLE], G, two_level ? cinfo->prefix_width : 1);
        set_view(b, PA_BATCH_PREFIX_SEQUSED_K, off[PA_BATCH_PREFIX_SEQUSED_K], G, 0);
        set_view(b, PA_BATCH_PREFIX_CU_SEQLENS_Q, off[PA_BATCH_PREFIX_CU_SEQLENS_Q], two_level ? G + 1 : 0, 0);
        set_view(b, PA_BATCH_PREFIX_ROWS, off[PA_BATCH_PREFIX_ROWS], two_level ? cinfo->shared_q : 0, 0);
        set_view(b, PA_BATCH_PREFIX_ROW_OF, off[PA_BATCH_PREFIX_ROW_OF], two_level ? total_q : 0, 0);
        set_view(b, PA_BATCH_SUFFIX_BLOCK_TABLE, off[PA_BATCH_SUFFIX_BLOCK_TABLE], two_level ? n : 0,
                 two_level ? cinfo->suffix_width : 1);
        set_view(b, PA_BATCH_SUFFIX_CACHE_SEQLENS, off[PA_BATCH_SUFFIX_CACHE_SEQLENS], two_level ? n : 0, 0);
        set_view(b, PA_BATCH_SUFFIX_SEQUSED_K, off[PA_BATCH_SUFFIX_SEQUSED_K], two_level ? n : 0, 0);
        if (b->cascade) {
            const int32_t fallback = b->cascade_info.last_fallback, calls = b->cascade_info.last_calls;
            b->cascade_info = *cinfo;
            b->cascade_info.last_fallback = fallback;
            b->cascade_info.last_calls = calls;
        }
    }
    b->staged_n = n;
    b->info.batch = n;
    b->info.total_q = (int32_t)total_q;
    b->info.max_seqlen_q = max_q;
    b->info.max_seqlen_k = max_k;
    b->info.max_pages = width;
    b->info.num_indices = csr ? (int32_t)nnz : 0;
    b->info.new_pages = (int32_t)need;
    b->info.cow_copies = (int32_t)cows;
    if (info) {
        info->batch = n;
        info->total_q = (int32_t)total_q;
        info->max_seqlen_q = max_q;
        info->max_seqlen_k = max_k;
        info->max_pages = width;
        info->num_indices = csr ? (int32_t)nnz : 0;
        info->new_pages = (int32_t)need;
        info->cow_copies = (int32_t)cows;
    }
    return PA_OK;
}

pa_status pa_batch_unstage(pa_context *ctx, pa_batch *b) {
    if (!b) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: NULL");
    if (b->staged_n < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "batch: nothing staged to undo");
    /* check first, so that a refusal changes nothing */
    for (int32_t i = 0; i < b->staged_n; i++) {
        const undo_entry *u = &b->undo[i];
        const pa_seq *s = pa_pool_seq(b->pool, u->id);
        if (!s || s->len != (int64_t)u->before_len + u->num_new ||
            s->num_pages != u->before_pages + u->fresh)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "batch: sequence %d was freed or changed since it was staged; cannot undo the stage",
                           u->id);
        /* pages it held reserved before the stage, which the staged tokens
         * fill, become reserved again: a fork since shares them, and the
         * sequence would write them again (a reserved page has one holder);
         * pages the stage took go back, shared or not */
        for (int64_t j = pa_pages_for(u->before_len, b->pool->page_size); j < u->before_pages; j++)
            if (b->pool->refcount[s->pages[j]] > 1)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "batch: sequence %d's staged tokens are shared now (forked since the stage); "
                               "cannot undo the stage", u->id);
    }
    rollback(b, b->staged_n);
    b->staged_n = -1;
    return PA_OK;
}
