/*
 * cpu_backend.c -- the CPU device: host memory, a pthread pool, and the
 * attention driver (append with rotary, tiling, split-KV, combine) on top of
 * the per-ISA tile kernels.
 */
#define _GNU_SOURCE
#include "cpu_kernels.h"
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct cpu_impl {
    pa_threadpool *pool;
    const pa_cpu_isa *isa;
    /* per-thread attention scratch, kept between calls (grown when needed);
     * lock serialises attention calls, which use it */
    pthread_mutex_t lock;
    float **scratch;
    int64_t scratch_floats;
} cpu_impl;

static cpu_impl *impl_of(const pa_device *dev) { return dev->impl; }

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- memory ---- */

/* Host memory. Large buffers come from mmap: zero pages that cost nothing until
 * touched (a pool bigger than the data it holds stays cheap), 2 MiB aligned
 * and asked to be backed by transparent huge pages -- a paged KV cache is read
 * in random page order, and with 4 KiB pages every cache page costs TLB misses
 * (dearer still under virtualisation). A 64-byte header before the data says
 * how to give it back. */
#define HUGE_PAGE ((size_t)2 << 20)
#define ALLOC_MAGIC 0x70616765646d656dULL

typedef struct alloc_header {
    uint64_t magic;
    uint64_t mapped;
    void *base;
    size_t len;
    uint64_t pad[4];
} alloc_header;

static void *host_alloc(size_t bytes) {
    char *base, *data;
    size_t len;
    bool mapped = bytes >= HUGE_PAGE;
    if (mapped) {
        len = bytes + 2 * HUGE_PAGE;
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        data = (char *)(((uintptr_t)base + sizeof(alloc_header) + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
        madvise(data, (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    } else {
        len = sizeof(alloc_header) + ((bytes + 63) & ~(size_t)63);
        base = aligned_alloc(64, len);
        if (!base) return NULL;
        data = base + sizeof(alloc_header);
        memset(data, 0, bytes);
    }
    alloc_header *h = (alloc_header *)(data - sizeof(alloc_header));
    h->magic = ALLOC_MAGIC;
    h->mapped = mapped;
    h->base = base;
    h->len = len;
    return data;
}

static void host_free(void *ptr) {
    if (!ptr) return;
    alloc_header *h = (alloc_header *)((char *)ptr - sizeof(alloc_header));
    if (h->magic != ALLOC_MAGIC) return; /* not ours: leak rather than corrupt */
    h->magic = 0;
    if (h->mapped) munmap(h->base, h->len);
    else free(h->base);
}

static pa_status cpu_alloc(pa_context *ctx, pa_device *dev, size_t bytes, void **out) {
    (void)dev;
    void *p = host_alloc(bytes);
    if (!p)
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "tensor: cannot allocate %zu bytes of host memory", bytes);
    *out = p;
    return PA_OK;
}

static void cpu_free(pa_device *dev, void *ptr) {
    (void)dev;
    host_free(ptr);
}

static pa_status cpu_memcpy(pa_context *ctx, pa_device *dev, void *dst, const void *src, size_t n) {
    (void)ctx;
    (void)dev;
    memmove(dst, src, n);
    return PA_OK;
}

typedef struct fill_job {
    pa_tensor *t;
    double value;
    uint64_t seed;
    bool randn;
} fill_job;

#define FILL_CHUNK 16384 /* elements per work item; a multiple of 4 */

static void fill_item(void *arg, int64_t item, int thread) {
    (void)thread;
    const fill_job *job = arg;
    pa_tensor *t = job->t;
    int64_t begin = item * FILL_CHUNK, end = begin + FILL_CHUNK;
    if (end > t->numel) end = t->numel;
    if (!job->randn) {
        if (pa_dtype_size(t->dtype) == 1) { /* fp8: one byte, encoded once */
            uint8_t b[4] = {0};
            pa_store_f64(b, t->dtype, 0, job->value);
            memset((uint8_t *)t->data + begin, b[0], (size_t)(end - begin));
            return;
        }
        for (int64_t i = begin; i < end; i++) pa_store_f64(t->data, t->dtype, i, job->value);
        return;
    }
    double z[4];
    for (int64_t i = begin; i < end; i += 4) {
        pa_randn4((uint64_t)i >> 2, job->seed, z);
        for (int k = 0; k < 4 && i + k < end; k++) pa_store_f64(t->data, t->dtype, i + k, z[k]);
    }
}

static pa_status run_fill(pa_tensor *t, fill_job *job) {
    pa_threadpool_run(impl_of(t->dev)->pool, (t->numel + FILL_CHUNK - 1) / FILL_CHUNK, fill_item, job);
    return PA_OK;
}

static pa_status cpu_fill(pa_context *ctx, pa_tensor *t, double value) {
    (void)ctx;
    fill_job job = {t, value, 0, false};
    return run_fill(t, &job);
}

static pa_status cpu_fill_randn(pa_context *ctx, pa_tensor *t, uint64_t seed) {
    (void)ctx;
    fill_job job = {t, 0, seed, true};
    return run_fill(t, &job);
}

static pa_status cpu_synchronize(pa_context *ctx, pa_device *dev) {
    (void)ctx;
    (void)dev;
    return PA_OK;
}

/* ---- attention ---- */

typedef struct attn_job {
    pa_cpu_plan plan;
    const pa_cpu_isa *isa;
    pa_cpu_tile *tiles;
    int64_t ntiles;
    int32_t splits;
    int64_t scratch_floats;
    float **scratch; /* per thread (the device's) */
    const int64_t *new_offsets; /* append: prefix sums of num_new, length batch + 1 */
} attn_job;

/* Rotates a key (double, in place) at position pos. */
static void rotate_f64(const pa_attn_problem *p, double *x, int64_t pos) {
    const int half = p->rotary_dim / 2;
    for (int j = 0; j < half; j++) {
        double c = pa_load_f64(p->rotary_cos, p->rotary_dtype, pos * half + j);
        double s = pa_load_f64(p->rotary_sin, p->rotary_dtype, pos * half + j);
        int i0 = p->rotary_interleaved ? 2 * j : j;
        int i1 = p->rotary_interleaved ? 2 * j + 1 : j + half;
        double x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

/* Rotates a key (f32, in place) at position pos, as an fp8 cache stores it
 * (pa_rotate_f32). */
static void rotate_f32(const pa_attn_problem *p, float *x, int64_t pos) {
    const int half = p->rotary_dim / 2;
    for (int j = 0; j < half; j++) {
        const float c = pa_load_f32(p->rotary_cos, p->rotary_dtype, pos * half + j);
        const float s = pa_load_f32(p->rotary_sin, p->rotary_dtype, pos * half + j);
        const int i0 = p->rotary_interleaved ? 2 * j : j, i1 = p->rotary_interleaved ? 2 * j + 1 : j + half;
        pa_rotate_f32(x[i0], x[i1], c, s, &x[i0], &x[i1]);
    }
}

/* Appends token `item` (flattened over the batch) with its rotary embedding. */
static void append_item(void *arg, int64_t item, int thread) {
    (void)thread;
    const attn_job *job = arg;
    const pa_attn_problem *p = job->plan.p;
    int32_t lo = 0, hi = p->batch; /* find b with offsets[b] <= item < offsets[b+1] */
    while (hi - lo > 1) {
        int32_t mid = (lo + hi) / 2;
        if (job->new_offsets[mid] <= item) lo = mid;
        else hi = mid;
    }
    const int32_t b = lo;
    const int64_t i = item - job->new_offsets[b];
    const int64_t pos = (int64_t)p->h_append_pos[b] + i;
    const int D = p->head_dim, Hk = p->kv_heads;
    const int64_t page = p->paged ? p->h_block_table[(int64_t)b * p->bt_stride + pos / p->page_size]
                                  : (p->h_cache_batch_idx ? p->h_cache_batch_idx[b] : b);
    const int64_t slot = pos % p->page_size;
    const int64_t dst_row = (page * p->page_size + slot) * Hk;
    const int64_t src_row = (p->h_new_start_row[b] + i) * Hk;
    const size_t es = pa_dtype_size(p->dtype);
    const bool fp8 = pa_dtype_is_fp8(p->cache_dtype);
    for (int hk = 0; hk < Hk; hk++) {
        const int64_t so = (src_row + hk) * D, dof = (dst_row + hk) * D;
        if (fp8) {
            /* x times its head's 1 / scale in f32, one conversion into the
             * cache (pa_fp8_scaled: the definition every backend shares) */
            const float inv_v = pa_fp8_inv_scale(p->h_v_scales[hk]), inv_k = pa_fp8_inv_scale(p->h_k_scales[hk]);
            uint8_t *vd = (uint8_t *)p->v_cache + dof, *kd = (uint8_t *)p->k_cache + dof;
            float x[PA_MAX_HEAD_DIM];
            for (int d = 0; d < D; d++)
                vd[d] = pa_fp8_scaled(pa_load_f32(p->v_new, p->dtype, so + d), inv_v, p->cache_dtype);
            for (int d = 0; d < D; d++) x[d] = pa_load_f32(p->k_new, p->dtype, so + d);
            if (p->rotary_cos) rotate_f32(p, x, pos);
            for (int d = 0; d < D; d++) kd[d] = pa_fp8_scaled(x[d], inv_k, p->cache_dtype);
            continue;
        }
        memcpy((char *)p->v_cache + dof * (int64_t)es, (const char *)p->v_new + so * (int64_t)es,
               (size_t)D * es);
        if (!p->rotary_cos) {
            memcpy((char *)p->k_cache + dof * (int64_t)es, (const char *)p->k_new + so * (int64_t)es,
                   (size_t)D * es);
            continue;
        }
        double x[PA_MAX_HEAD_DIM];
        for (int d = 0; d < D; d++) x[d] = pa_load_f64(p->k_new, p->dtype, so + d);
        rotate_f64(p, x, pos);
        for (int d = 0; d < D; d++) pa_store_f64(p->k_cache, p->dtype, dof + d, x[d]);
    }
}

static void tile_item(void *arg, int64_t item, int thread) {
    attn_job *job = arg;
    pa_cpu_tile tile = job->tiles[item / job->splits];
    if (job->splits > 1) {
        const int32_t s = (int32_t)(item % job->splits);
        const int32_t len = tile.k1 - tile.k0;
        const int32_t kb = job->plan.key_block;
        int32_t chunk = (len + job->splits - 1) / job->splits;
        chunk = (chunk + kb - 1) / kb * kb;
        int32_t k0 = tile.k0 + s * chunk, k1 = k0 + chunk;
        if (k0 > tile.k1) k0 = tile.k1;
        if (k1 > tile.k1) k1 = tile.k1;
        tile.k0 = k0;
        tile.k1 = k1;
        tile.partial = (item / job->splits) * job->splits + s;
    }
    job->isa->tile(&job->plan, &tile, job->scratch[thread]);
}

/* Merges the splits of one tile: out = sum_s exp(lse_s - lse) o_s. */
static void combine_item(void *arg, int64_t item, int thread) {
    (void)thread;
    const attn_job *job = arg;
    const pa_cpu_plan *plan = &job->plan;
    const pa_attn_problem *p = plan->p;
    const pa_cpu_tile *t = &job->tiles[item];
    const int D = p->head_dim, G = p->group, H = p->heads, S = job->splits;
    for (int r = 0; r < t->nh * plan->rows; r++) {
        const int hi = r / plan->rows, rr = r % plan->rows;
        if (rr >= t->nq * G) continue;
        const int qi = rr / G, h = (t->hk + hi) * G + rr % G;
        const int32_t i = t->i0 + qi;
        float mx = -INFINITY;
        for (int s = 0; s < S; s++) {
            float v = plan->partial_lse[(item * S + s) * plan->tile_rows + r];
            if (v > mx) mx = v;
        }
        float acc[PA_MAX_HEAD_DIM] = {0};
        float lse = -INFINITY;
        if (mx > -INFINITY) {
            /* weights normalised before the sum: each split's output is
             * within max |v|, and so is their weighted sum (no overflow
             * where the exact result is finite) */
            float w[PA_CPU_MAX_SPLITS], sum = 0;
            for (int s = 0; s < S; s++) {
                w[s] = expf(plan->partial_lse[(item * S + s) * plan->tile_rows + r] - mx);
                sum += w[s];
            }
            const float inv = 1.0f / sum;
            for (int s = 0; s < S; s++) {
                if (w[s] == 0) continue;
                const float ws = w[s] * inv;
                const float *po = plan->partial_o + ((item * S + s) * plan->tile_rows + r) * D;
                for (int d = 0; d < D; d++) acc[d] += ws * po[d];
            }
            lse = mx + logf(sum);
        }
        const int64_t off = ((p->h_q_start[t->b] + i) * H + h) * (int64_t)D;
        for (int d = 0; d < D; d++) pa_store_f32(p->out, p->out_dtype, off + d, acc[d]);
        if (p->lse) p->lse[p->h_lse_start[t->b] + (int64_t)h * p->lse_head_stride + i] = lse;
    }
}

static int cmp_tile_cost(const void *a, const void *b) {
    const pa_cpu_tile *x = a, *y = b;
    int64_t cx = (int64_t)x->nq * (x->k1 - x->k0), cy = (int64_t)y->nq * (y->k1 - y->k0);
    return cx < cy ? 1 : cx > cy ? -1 : 0;
}

/* Frees what plan_attention allocated. */
static void release_job(attn_job *job) {
    free(job->plan.partial_o);
    free(job->plan.partial_lse);
    free(job->tiles);
    free((void *)job->new_offsets);
}

/* Plans the call and allocates everything it needs, before anything is
 * written: a failure here leaves the caches untouched. */
static pa_status plan_attention(pa_context *ctx, const pa_attn_problem *p, cpu_impl *impl,
                                attn_job *job) {
    const int nthreads = pa_threadpool_size(impl->pool);
    const int vw = impl->isa->vector_width;
    const int D = p->head_dim, G = p->group;
    memset(job, 0, sizeof *job);
    job->isa = impl->isa;
    job->plan.p = p;

    if (p->total_new > 0) {
        int64_t *offsets = malloc(sizeof(int64_t) * ((size_t)p->batch + 1));
        if (!offsets) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
        offsets[0] = 0;
        for (int32_t b = 0; b < p->batch; b++) offsets[b + 1] = offsets[b] + p->h_num_new[b];
        job->new_offsets = offsets;
    }
    if (p->total_q == 0) return PA_OK;

    /* tiles: tile_q queries x the GQA group, about 64 rows */
    int32_t tile_q = G >= 64 ? 1 : 64 / G;
    if (tile_q > p->max_seqlen_q) tile_q = p->max_seqlen_q > 0 ? p->max_seqlen_q : 1;
    job->plan.tile_q = tile_q;
    job->plan.rows = tile_q * G;
    job->plan.dpad = (D + vw - 1) / vw * vw;
    job->plan.key_block = D <= 64 ? 128 : D <= 128 ? 64 : 32;

    /* decode-like tiles (few rows per kv head) take several kv heads, so each
     * token's row is read front to back instead of one head's slice at a time */
    int32_t nh = 1;
    if (job->plan.rows <= 8 && D % vw == 0) { /* the kernel's dot-product form */
        nh = 64 / job->plan.rows;
        if (nh > p->kv_heads) nh = p->kv_heads;
        while (p->kv_heads % nh) nh--;
    }
    job->plan.heads_per_tile = nh;
    job->plan.tile_rows = (int64_t)job->plan.rows * nh;

    int64_t ntiles = 0;
    for (int32_t b = 0; b < p->batch; b++)
        ntiles += (int64_t)(p->kv_heads / nh) * ((p->h_seqlen_q[b] + tile_q - 1) / tile_q);
    pa_cpu_tile *tiles = malloc(sizeof(pa_cpu_tile) * (size_t)(ntiles ? ntiles : 1));
    if (!tiles) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    job->tiles = tiles;
    int64_t n = 0;
    for (int32_t b = 0; b < p->batch; b++) {
        const int32_t sq = p->h_seqlen_q[b], sk = p->h_seqlen_k[b];
        for (int32_t i0 = 0; i0 < sq; i0 += tile_q) {
            const int32_t nq = sq - i0 < tile_q ? sq - i0 : tile_q;
            int32_t lo0, hi0, lo1, hi1;
            pa_mask_range(p, sq, sk, i0, &lo0, &hi0);
            pa_mask_range(p, sq, sk, i0 + nq - 1, &lo1, &hi1);
            for (int32_t hk = 0; hk < p->kv_heads; hk += nh) {
                pa_cpu_tile t = {b, hk, nh, i0, nq, lo0 < lo1 ? lo0 : lo1, hi0 > hi1 ? hi0 : hi1, -1};
                if (t.k1 < t.k0) t.k1 = t.k0;
                tiles[n++] = t;
            }
        }
    }
    qsort(tiles, (size_t)ntiles, sizeof *tiles, cmp_tile_cost);

    /* split the keys when there are too few tiles to keep every thread busy:
     * aim at 8 items per thread (small items balance well, and on a 16-core
     * host B=8 x 4096 decode ran at 64, 83, 94 GB/s with 4, 8, 16 splits),
     * but no split shorter than 4 key blocks */
    int32_t splits = p->num_splits;
    if (splits == 0) {
        splits = 1;
        const int64_t min_keys = 4LL * job->plan.key_block, want_items = 8LL * nthreads;
        if (ntiles < want_items && p->max_seqlen_k >= 2 * min_keys) {
            splits = (int32_t)((want_items + ntiles - 1) / ntiles);
            if (splits > p->max_seqlen_k / min_keys) splits = (int32_t)(p->max_seqlen_k / min_keys);
        }
    }
    if (splits > PA_CPU_MAX_SPLITS) splits = PA_CPU_MAX_SPLITS;
    if (splits < 1) splits = 1;
    job->ntiles = ntiles;
    job->splits = splits;
    if (splits > 1) {
        const int64_t slots = ntiles * splits;
        job->plan.partial_o = malloc(sizeof(float) * (size_t)(slots * job->plan.tile_rows * D));
        job->plan.partial_lse = malloc(sizeof(float) * (size_t)(slots * job->plan.tile_rows));
        if (!job->plan.partial_o || !job->plan.partial_lse)
            return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory for %lld splits",
                           (long long)slots);
    }
    /* per-thread working memory (any pool thread may take an item): the
     * device's buffers, grown when this call needs more */
    job->scratch_floats = impl->isa->scratch_floats(&job->plan);
    if (job->scratch_floats > impl->scratch_floats) {
        const size_t bytes = ((size_t)job->scratch_floats * sizeof(float) + 63) & ~(size_t)63;
        for (int i = 0; i < nthreads; i++) {
            float *buf = aligned_alloc(64, bytes);
            if (!buf) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory for scratch");
            free(impl->scratch[i]);
            impl->scratch[i] = buf;
        }
        impl->scratch_floats = job->scratch_floats;
    }
    job->scratch = impl->scratch;
    return PA_OK;
}

static pa_status cpu_attention(pa_context *ctx, const pa_attn_problem *p) {
    cpu_impl *impl = impl_of(p->dev);
    attn_job job;
    pthread_mutex_lock(&impl->lock);
    pa_status st = plan_attention(ctx, p, impl, &job);
    if (st == PA_OK) {
        /* 1. append new k/v (rotated) into their pages, before anything reads them */
        if (p->total_new > 0) pa_threadpool_run(impl->pool, p->total_new, append_item, &job);
        /* 2. the tiles (and their splits), 3. merge the splits */
        if (p->total_q > 0) {
            pa_threadpool_run(impl->pool, job.ntiles * job.splits, tile_item, &job);
            if (job.splits > 1) pa_threadpool_run(impl->pool, job.ntiles, combine_item, &job);
        }
    }
    release_job(&job);
    pthread_mutex_unlock(&impl->lock);
    return st;
}

static pa_status cpu_merge(pa_context *ctx, const pa_merge_problem *p) {
    (void)ctx;
    return pa_cpu_merge(impl_of(p->dev)->pool, p);
}

static pa_status cpu_gather_rows(pa_context *ctx, const pa_rows_problem *p) {
    (void)ctx;
    return pa_cpu_gather_rows(impl_of(p->dev)->pool, p);
}

/* ---- ceilings ---- */

typedef struct ceiling_job {
    const pa_cpu_isa *isa;
    float *src, *dst;
    int64_t per_thread; /* floats */
    int mode;           /* 0 touch, 1 read, 2 copy, 3 fma */
    int64_t fma_iters;
    double flops[256];
    float sink[256];
} ceiling_job;

static void ceiling_item(void *arg, int64_t item, int thread) {
    (void)thread;
    ceiling_job *job = arg;
    float *src = job->src + item * job->per_thread;
    float *dst = job->dst ? job->dst + item * job->per_thread : NULL;
    switch (job->mode) {
    case 0:
        for (int64_t i = 0; i < job->per_thread; i++) src[i] = 1.0f;
        if (dst) memset(dst, 0, sizeof(float) * (size_t)job->per_thread);
        break;
    case 1: job->sink[item % 256] += job->isa->read_sum(src, job->per_thread); break;
    case 2: memcpy(dst, src, sizeof(float) * (size_t)job->per_thread); break;
    case 3: job->flops[item % 256] = job->isa->fma_loop(job->fma_iters, &job->sink[item % 256]); break;
    }
}

/* Runs `mode` repeatedly for about `seconds`; returns the best rate of a pass. */
static double best_rate(pa_threadpool *pool, ceiling_job *job, int nthreads, double seconds,
                        double units_per_pass) {
    double best = 0, start = now_seconds();
    int passes = 0;
    do {
        double t0 = now_seconds();
        pa_threadpool_run(pool, nthreads, ceiling_item, job);
        double dt = now_seconds() - t0;
        if (dt > 0 && units_per_pass / dt > best) best = units_per_pass / dt;
        passes++;
    } while (now_seconds() - start < seconds || passes < 3);
    return best;
}

static pa_status cpu_measure_ceilings(pa_context *ctx, pa_device *dev, double seconds, pa_ceilings *out) {
    cpu_impl *impl = impl_of(dev);
    int nthreads = pa_threadpool_size(impl->pool);
    if (nthreads > 256) nthreads = 256;
    ceiling_job *job = calloc(1, sizeof *job);
    if (!job) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "ceilings: out of host memory");
    job->isa = impl->isa;
    /* 512 MiB per buffer: far beyond any last-level cache */
    const int64_t total = (int64_t)128 << 20;
    job->per_thread = total / nthreads / 64 * 64;
    job->src = host_alloc(sizeof(float) * (size_t)(job->per_thread * nthreads));
    job->dst = host_alloc(sizeof(float) * (size_t)(job->per_thread * nthreads));
    if (!job->src || !job->dst) {
        host_free(job->src);
        host_free(job->dst);
        free(job);
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "ceilings: cannot allocate 1 GiB of host memory");
    }
    const double bytes = (double)job->per_thread * nthreads * sizeof(float);
    job->mode = 0;
    pa_threadpool_run(impl->pool, nthreads, ceiling_item, job); /* first touch, per thread */
    job->mode = 1;
    out->read_gbps = best_rate(impl->pool, job, nthreads, seconds, bytes) / 1e9;
    job->mode = 2;
    out->copy_gbps = best_rate(impl->pool, job, nthreads, seconds, 2 * bytes) / 1e9;
    job->mode = 3;
    job->fma_iters = 1 << 22;
    double flops_per_pass = job->isa->fma_loop(job->fma_iters, &job->sink[0]) * nthreads;
    out->fma_gflops = best_rate(impl->pool, job, nthreads, seconds, flops_per_pass) / 1e9;
    out->seconds = seconds;
    host_free(job->src);
    host_free(job->dst);
    free(job);
    return PA_OK;
}

/* ---- device ---- */

static void cpu_destroy(pa_device *dev) {
    cpu_impl *impl = impl_of(dev);
    if (impl) {
        pa_threadpool_destroy(impl->pool);
        if (impl->scratch)
            for (int i = 0; i < dev->num_threads; i++) free(impl->scratch[i]);
        free(impl->scratch);
        pthread_mutex_destroy(&impl->lock);
    }
    free(impl);
    free(dev);
}

static const pa_backend_ops cpu_ops = {
    "cpu",
    cpu_alloc,
    cpu_free,
    cpu_memcpy,
    cpu_memcpy,
    cpu_memcpy,
    cpu_fill,
    cpu_fill_randn,
    cpu_attention,
    cpu_synchronize,
    cpu_measure_ceilings,
    cpu_destroy,
    NULL, /* timing: events are a GPU's */
    NULL,
    NULL, /* tuning: the CPU kernels have none */
    NULL,
    NULL,
    cpu_merge,
    cpu_gather_rows,
    NULL, /* lanes: each call runs to its end on the pool's threads */
    NULL,
};

static int count_cpus(void) {
    const char *env = getenv("PAGEDATTN_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void cpu_model(char *buf, size_t len) {
    snprintf(buf, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ') c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, len, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

/* PAGEDATTN_CPU_ISA=generic|avx2|avx512 picks a kernel (for tests); else the widest. */
static const pa_cpu_isa *pick_isa(pa_context *ctx, pa_status *st) {
    const char *want = getenv("PAGEDATTN_CPU_ISA");
    const pa_cpu_isa *all[3] = {&pa_cpu_isa_avx512, &pa_cpu_isa_avx2, &pa_cpu_isa_generic};
    bool ok[3] = {false, false, true};
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    ok[0] = pa_cpu_isa_avx512.tile && __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512dq");
    ok[1] = pa_cpu_isa_avx2.tile && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c");
#endif
    *st = PA_OK;
    for (int i = 0; i < 3; i++) {
        if (want && *want) {
            if (strcmp(want, all[i]->name ? all[i]->name : "") != 0) continue;
            if (!ok[i]) break;
        } else if (!ok[i]) {
            continue;
        }
        return all[i];
    }
    *st = pa_fail(ctx, PA_ERR_UNSUPPORTED,
                  "PAGEDATTN_CPU_ISA: '%s' is not available here (generic, avx2, avx512)", want);
    return NULL;
}

/* index 1 ("cpu:staged"): the CPU behind the interface of a discrete device
 * (the host reads and writes its memory only through upload/download), so
 * that CI covers the paths a GPU takes. */
static pa_status cpu_device_create(pa_context *ctx, int index, pa_device **out) {
    const bool staged = index == 1;
    pa_status st;
    const pa_cpu_isa *isa = pick_isa(ctx, &st);
    if (!isa) return st;
    pa_device *dev = calloc(1, sizeof *dev);
    cpu_impl *impl = calloc(1, sizeof *impl);
    if (!dev || !impl) {
        free(dev);
        free(impl);
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "device: out of host memory");
    }
    impl->isa = isa;
    impl->pool = pa_threadpool_create(count_cpus());
    impl->scratch = impl->pool ? calloc((size_t)pa_threadpool_size(impl->pool), sizeof(float *)) : NULL;
    if (!impl->pool || !impl->scratch) {
        pa_threadpool_destroy(impl->pool);
        free(impl->scratch);
        free(dev);
        free(impl);
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "device: cannot start worker threads");
    }
    pthread_mutex_init(&impl->lock, NULL);
    dev->kind = PA_DEVICE_CPU;
    dev->index = staged ? 1 : 0;
    /* staged: the core treats its memory as a GPU's (reads and writes by
     * upload/download, host mirrors of index tensors); the kernels are the same */
    dev->host_accessible = !staged;
    dev->ops = &cpu_ops;
    dev->impl = impl;
    dev->num_threads = pa_threadpool_size(impl->pool);
    snprintf(dev->name, sizeof dev->name, staged ? "cpu:staged" : "cpu");
    char model[160];
    cpu_model(model, sizeof model);
    snprintf(dev->description, sizeof dev->description, "%s, %d threads, %s kernels%s", model,
             dev->num_threads, isa->name, staged ? " (staged: reached by copies, for tests)" : "");
    *out = dev;
    return PA_OK;
}

/* ---- the registry's entry (src/backends.c) ---- */

static int cpu_parse(const char *rest) {
    return rest[0] == '\0' ? 0 : strcmp(rest, ":staged") == 0 ? 1 : -1;
}

static bool cpu_usable(char *why, size_t why_len) {
    (void)why;
    (void)why_len;
    return true;
}

const pa_backend_reg pa_cpu_backend = {
    "cpu", "\"cpu\", \"cpu:staged\"", 2, cpu_parse, cpu_usable, cpu_device_create, NULL,
};
