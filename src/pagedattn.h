/*
 * pagedattn.h -- the one public header of libpagedattn.
 *
 * Paged attention (prefill, chunked prefill, decode; GQA; any page size >= 1),
 * rotary append, and devices/tensors to hold the data, behind a small C API that
 * LuaJIT binds through FFI.
 *
 * Conventions
 *   - Every function that can fail returns pa_status; the message of the last
 *     failure is kept on the pa_context passed to the call (pa_context_error).
 *     Nothing aborts, nothing longjmps, and a failed call changes nothing.
 *   - Handles are opaque. Each create/open has a destroy/release that accepts NULL.
 *   - Indices, positions and page ids are 0-based; element offsets are 64-bit.
 *   - Long argument lists travel as a params struct passed by pointer.
 *   - Threads: one pa_context per thread. Devices may be shared, and so may
 *     tensors that every thread only reads (an attention call writes only
 *     out, softmax_lse, and the caches when it appends); a tensor written by
 *     one thread must not be used by another at the same time; a pool, its
 *     sequences and batches belong to one thread at a time.
 *
 * The block between PA_API_BEGIN and PA_API_END is read verbatim by the Lua
 * bindings (ffi.cdef): keep it free of preprocessor lines and macros.
 *
 * The instruments of the laboratory (ceilings, kernel timing, the kernel
 * catalog and its compiler, ABI probes) are in pagedattn_lab.h.
 */
#ifndef PAGEDATTN_H
#define PAGEDATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* PA_API_BEGIN */

typedef enum pa_status {
    PA_OK = 0,
    PA_ERR_ARGUMENT = 1,      /* the caller passed something invalid */
    PA_ERR_OUT_OF_MEMORY = 2, /* host or device allocation failed */
    PA_ERR_OUT_OF_PAGES = 3,  /* a page pool has too few free pages */
    PA_ERR_UNSUPPORTED = 4,   /* valid, but this device cannot do it */
    PA_ERR_DEVICE = 5,        /* driver or run-time failure on the device */
    PA_ERR_COMPILE = 6,       /* run-time kernel compilation failed */
    PA_ERR_INTERNAL = 7       /* a bug in pagedattn */
} pa_status;

typedef enum pa_dtype {
    PA_F32 = 0,
    PA_F16 = 1,
    PA_BF16 = 2,
    PA_I32 = 3,
    /* 8-bit floats, for KV caches (one byte an element): e4m3fn (largest
     * finite 448, no infinities, NaN = S.1111.111) and e5m2 (largest finite
     * 57344, infinities and NaNs as IEEE). Writes round to nearest even and
     * saturate at the largest finite value (infinities too); NaN stays NaN. */
    PA_FP8_E4M3 = 4,
    PA_FP8_E5M2 = 5
} pa_dtype;

typedef enum pa_device_kind {
    PA_DEVICE_CPU = 0,
    PA_DEVICE_CUDA = 1
} pa_device_kind;

/* The longest sequence: the most keys (cache_seqlens + new tokens, or
 * seqused_k) and the most queries of one sequence in an attention call, and
 * the most tokens of a pool's sequence. 2^30, so that every per-sequence
 * position, and a position plus a tile, fits an int32 on every backend. */
enum { PA_MAX_SEQLEN = 1073741824 };

typedef struct pa_context pa_context; /* error messages; one per thread of use */
typedef struct pa_device pa_device;   /* refcounted; tensors hold a reference */
typedef struct pa_tensor pa_tensor;   /* dense, row-major, on one device */

/* ---- library, context, errors ---- */

const char *pa_version(void);
const char *pa_status_str(pa_status status);
/* Seconds on a monotonic wall clock (for timing from scripts). */
double pa_clock_seconds(void);

pa_status pa_context_create(pa_context **out);
void pa_context_destroy(pa_context *ctx);
/* The message of the last failed call made with ctx ("" if none). */
const char *pa_context_error(const pa_context *ctx);
pa_status pa_context_status(const pa_context *ctx);
void pa_context_clear(pa_context *ctx);

/* ---- devices ---- */

/* name: "cpu", "cuda", "cuda:N"; NULL or "" picks $PAGEDATTN_DEVICE, else the
 * first usable CUDA device, else the CPU. "cpu:staged" is the CPU behind the
 * interface of a discrete device (the library reaches its memory only by
 * copies, as a GPU's), for tests. Release with pa_device_release. */
pa_status pa_device_open(pa_context *ctx, const char *name, pa_device **out);
void pa_device_release(pa_device *dev);
pa_device_kind pa_device_get_kind(const pa_device *dev);
int pa_device_index(const pa_device *dev);
const char *pa_device_name(const pa_device *dev);        /* "cpu", "cuda:0" */
const char *pa_device_description(const pa_device *dev); /* model, cores/SMs */
int pa_device_num_threads(const pa_device *dev);         /* CPU worker count */
pa_status pa_device_synchronize(pa_context *ctx, pa_device *dev);
/* Seconds this device has spent making kernels ready in calls so far: run-time
 * compiles, reads of the kernel cache, module loads (0 on the CPU). These are
 * one-time costs inside the first call that uses a kernel; a timer around
 * calls subtracts the change to time the work alone. */
double pa_device_setup_seconds(const pa_device *dev);

/* ---- tensors ---- */

size_t pa_dtype_size(pa_dtype dtype);
const char *pa_dtype_name(pa_dtype dtype);

/* A zero-filled tensor of ndim <= 8 dimensions (each >= 0). */
pa_status pa_tensor_create(pa_context *ctx, pa_device *dev, pa_dtype dtype, int ndim,
                           const int64_t *shape, pa_tensor **out);
void pa_tensor_destroy(pa_tensor *t);
int pa_tensor_ndim(const pa_tensor *t);
int64_t pa_tensor_dim(const pa_tensor *t, int i);
int64_t pa_tensor_numel(const pa_tensor *t);
pa_dtype pa_tensor_dtype(const pa_tensor *t);
pa_device *pa_tensor_device(const pa_tensor *t);
/* Host pointer for CPU tensors, device address for CUDA tensors. On a GPU the
 * library keeps a host copy of the i32 tensors it wrote from host data, so
 * that attention need not download them (which waits for the device); once
 * a tensor's address was taken, its owner may write it behind the library's
 * back, so that tensor is downloaded whenever attention reads it. */
void *pa_tensor_data(const pa_tensor *t);

/* Copies of `count` elements starting at element `offset`, in the tensor's own
 * dtype (src/dst hold count * pa_dtype_size bytes on the host). On a CUDA
 * device a write of up to 1 MiB is queued on the device's stream and returns
 * without waiting (src is free again); pagedattn's later work sees it, other
 * users of the memory must pa_device_synchronize first. */
pa_status pa_tensor_write(pa_context *ctx, pa_tensor *t, int64_t offset,
                          const void *src, int64_t count);
pa_status pa_tensor_read(pa_context *ctx, const pa_tensor *t, int64_t offset,
                         void *dst, int64_t count);
/* Copies converting from/to double (round to nearest even into f16/bf16/f32,
 * and into the fp8 dtypes saturating at their largest finite value; reads
 * decode exactly; i32 values must be integers in range). */
pa_status pa_tensor_write_f64(pa_context *ctx, pa_tensor *t, int64_t offset,
                              const double *src, int64_t count);
pa_status pa_tensor_read_f64(pa_context *ctx, const pa_tensor *t, int64_t offset,
                             double *dst, int64_t count);
/* dst and src: same device, dtype and number of elements. */
pa_status pa_tensor_copy(pa_context *ctx, pa_tensor *dst, const pa_tensor *src);
pa_status pa_tensor_fill(pa_context *ctx, pa_tensor *t, double value);
/* Standard normal values from Philox-4x32-10 keyed by seed; element i gets the
 * same value on every device (up to the dtype's rounding). */
pa_status pa_tensor_fill_randn(pa_context *ctx, pa_tensor *t, uint64_t seed);

/* ---- attention ----
 *
 * One params struct serves both forms:
 *  attention_with_kvcache: q [B, Sq, H, D]; caches [B_cache, S_cache, Hk, D], or
 *    paged [num_pages, page_size, Hk, D] with block_table i32 [B, max_pages];
 *    optional k, v [B, S_new, Hk, D] appended at cache_seqlens; out like q;
 *    softmax_lse f32 [B, H, Sq].
 *  attention_varlen: q [total_q, H, D] with cu_seqlens_q i32 [B + 1] and
 *    seqused_k i32 [B] (keys attended, after any append); optional k, v
 *    [total_q, Hk, D] appended at seqused_k - seqlen_q; out like q;
 *    softmax_lse f32 [H, total_q].
 * Optional tensors are NULL when absent. Start from pa_attention_params_init
 * (the defaults: no window, default scale, interleaved rotary, keys = the
 * cache's capacity) and set what you need. Per sequence, at most
 * PA_MAX_SEQLEN keys and queries. */
typedef struct pa_attention_params {
    const pa_tensor *q;
    pa_tensor *k_cache;
    pa_tensor *v_cache;
    pa_tensor *out; /* required: same shape and dtype as q */

    const pa_tensor *k;                /* maybe: new keys to append */
    const pa_tensor *v;                /* maybe: new values to append */
    const pa_tensor *rotary_cos;       /* maybe: [seqlen_ro, rotary_dim / 2] */
    const pa_tensor *rotary_sin;       /* maybe: same shape as rotary_cos */
    const pa_tensor *cache_seqlens;    /* maybe: i32 [B] (with_kvcache) */
    const pa_tensor *cache_batch_idx;  /* maybe: i32 [B], contiguous caches only */
    const pa_tensor *block_table;      /* maybe: i32 [B, max_pages] */
    const pa_tensor *alibi_slopes;     /* maybe: f32 [H] or [B, H] */
    const pa_tensor *cu_seqlens_q;     /* varlen: i32 [B + 1] */
    const pa_tensor *seqused_k;        /* varlen: i32 [B] */
    pa_tensor *softmax_lse;            /* maybe: f32 output */

    int64_t cache_seqlen;     /* with_kvcache when cache_seqlens is NULL: the
                                 same length for every sequence; -1 = capacity */
    int32_t max_seqlen_q;     /* varlen: 0 = derive from cu_seqlens_q */
    int32_t causal;           /* bottom-right aligned */
    int32_t window_left;      /* -1 = unbounded */
    int32_t window_right;     /* -1 = unbounded */
    int32_t rotary_interleaved; /* 1 = GPT-J pairs (2i, 2i+1), 0 = GPT-NeoX */
    int32_t num_splits;       /* 0 = choose */
    float softmax_scale;      /* NaN (pa_attention_params_init) = head_dim^-0.5;
                                 any other finite value is used as given */
    float softcap;            /* 0 = off */

    /* maybe, instead of block_table: the pages in FlashInfer's CSR form (a
     * batch stages both): those of sequence b are
     * kv_indices[kv_indptr[b] .. kv_indptr[b + 1] - 1], i32 [B + 1] and
     * [nnz]. kv_last_page_len (maybe, i32 [B]): the keys in each sequence's
     * last page, checked against the keys the call attends. The call makes
     * the padded block table from them (an upload, and on a GPU a wait for
     * the device when it is freed): pass block_table in a loop. */
    const pa_tensor *kv_indptr;
    const pa_tensor *kv_indices;
    const pa_tensor *kv_last_page_len;

    /* FP8 caches: k_cache and v_cache of one fp8 dtype (PA_FP8_E4M3 or
     * PA_FP8_E5M2) next to q, k, v and out in f16 or bf16 (f32 too on the
     * CPU). The caches hold x / scale; attention reads fp8 * scale, and an
     * append rotates the new k, divides by the scale and rounds (nearest
     * even, saturating). The scale of each: k_scale / v_scale, one number
     * for the tensor (pa_attention_params_init: 1), or k_scales / v_scales
     * (maybe), f32 [Hk], one per kv head, with the number left at 1. A scale
     * is a positive finite number; caches of other dtypes take only 1. */
    float k_scale;
    float v_scale;
    const pa_tensor *k_scales;
    const pa_tensor *v_scales;
} pa_attention_params;

void pa_attention_params_init(pa_attention_params *p);
pa_status pa_attention_with_kvcache(pa_context *ctx, const pa_attention_params *p);
pa_status pa_attention_varlen(pa_context *ctx, const pa_attention_params *p);

/* ---- merging partial attention results ----
 * Attention over keys split into disjoint parts is the merge of the parts'
 * results by their log-sum-exp. For each query row and head, with
 * m = max_s lse_s and w_s = exp(lse_s - m) / sum_t exp(lse_t - m):
 *   out = sum_s w_s o_s,   out_lse = m + log(sum_s exp(lse_s - m)).
 * A state with lse -inf (no key, or every key masked) has weight 0 and its o
 * is not read; when every state is empty, out is zeros and out_lse -inf (a
 * fully masked row of an attention call). The weights are normalised before
 * the sum and the result kept between the states' values, so out is finite
 * wherever the states are. Every state has the layout of one attention
 * call's out and lse: o [T, H, D] with lse f32 [H, T] (attention_varlen), or
 * o [B, Sq, H, D] with lse f32 [B, H, Sq] (attention_with_kvcache). */
typedef struct pa_merge_params {
    int32_t num_states;          /* 1 to 32 */
    const pa_tensor *const *o;   /* [num_states]: one shape and dtype (f32, f16, bf16) */
    const pa_tensor *const *lse; /* [num_states]: f32, the layout above */
    pa_tensor *out;              /* o's shape and dtype; may be one of the o (in place) */
    pa_tensor *out_lse;          /* maybe: lse's shape; may be one of the lse */
} pa_merge_params;

void pa_merge_params_init(pa_merge_params *p);
pa_status pa_merge_states(pa_context *ctx, const pa_merge_params *p);

/* ==== page pool, sequences, batch staging ==================================
 *
 * A pool hands out the pages of one or more pairs of KV cache tensors
 * (k_caches[l], v_caches[l]: [num_pages, page_size, Hk, D], one pair per
 * layer, all on one device; the pool borrows them: they must outlive it).
 * Page ids are 0-based int32. Allocation and release are O(1) (a free stack);
 * every page has a refcount (the number of sequences that hold it).
 *
 * A sequence is an int32 id (>= 0) naming a list of pages and a length in
 * tokens; token t lives in page pages[t / page_size] at slot t % page_size.
 * Ids of freed sequences are not reused soon (a generation count in the id),
 * so a stale id is reported, not silently aliased.
 *  - reserve(n): make room for n more tokens (allocate pages; copy a shared
 *    partial last page first, so writes need no further pages); length unchanged.
 *  - append(n): reserve(n), then length += n (the caller writes the k/v).
 *  - fork: a new sequence sharing every page that holds the parent's tokens
 *    (refcounted; reserved pages past the length are not shared).
 *  - truncate(len): drop tokens from the end; pages past them go back.
 *  - free: release every page.
 * Writing into a page that another sequence also holds copies it first
 * (copy-on-write, on the caches' device, for every layer's k and v).
 * A pool or batch is not thread-safe: use it from one thread at a time.
 * Running out of pages fails with PA_ERR_OUT_OF_PAGES and takes nothing. */

typedef struct pa_pool pa_pool;

typedef struct pa_pool_params {
    int64_t num_pages;          /* 0 = dimension 1 of k_caches[0] */
    int32_t page_size;          /* 0 = dimension 2 of k_caches[0] */
    int32_t num_layers;         /* entries in k_caches and v_caches; 0 = no
                                   tensors (bookkeeping only: nothing to copy) */
    pa_tensor *const *k_caches; /* [num_layers] */
    pa_tensor *const *v_caches; /* [num_layers] */
} pa_pool_params;

typedef struct pa_pool_stats {
    int64_t num_pages;
    int64_t page_size;
    int64_t free_pages;
    int64_t used_pages;      /* refcount >= 1 */
    int64_t shared_pages;    /* refcount >= 2 */
    int64_t page_refs;       /* sum of refcounts: pages the sequences hold */
    int64_t peak_used_pages; /* since the pool was created */
    int64_t sequences;       /* live sequences */
    int64_t tokens;          /* sum of the live sequences' lengths */
    int64_t cow_copies;      /* pages copied on write so far */
    /* prefix caching (zero while it is off); free_pages includes the cached
     * pages that no sequence holds: they are evicted when needed */
    int64_t cached_pages;     /* pages registered under a hash, held or not */
    int64_t prefix_hits;      /* pages taken from the cache by attach */
    int64_t prefix_misses;    /* pages attach asked for and did not find */
    int64_t prefix_evictions; /* cached pages reused for other contents */
} pa_pool_stats;

void pa_pool_params_init(pa_pool_params *p);
pa_status pa_pool_create(pa_context *ctx, const pa_pool_params *p, pa_pool **out);
/* Frees the pool and all its sequences. Destroy its batches first. */
void pa_pool_destroy(pa_pool *pool);
void pa_pool_get_stats(const pa_pool *pool, pa_pool_stats *out);
int64_t pa_pool_num_pages(const pa_pool *pool);
int32_t pa_pool_page_size(const pa_pool *pool);
/* The page's refcount; -1 if page is not in [0, num_pages). */
int32_t pa_pool_page_refcount(const pa_pool *pool, int64_t page);
/* Slots in used pages that hold no token of any sequence (internal
 * fragmentation, counted once per page); O(page refs). */
int64_t pa_pool_unused_slots(const pa_pool *pool);
/* Checks every invariant (refcounts = references, the free stack, stats);
 * PA_ERR_INTERNAL with the first violation. O(num_pages + page refs). */
pa_status pa_pool_validate(pa_context *ctx, const pa_pool *pool);

pa_status pa_seq_create(pa_context *ctx, pa_pool *pool, int32_t *out_seq);
pa_status pa_seq_fork(pa_context *ctx, pa_pool *pool, int32_t parent, int32_t *out_seq);
pa_status pa_seq_reserve(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t n);
pa_status pa_seq_append(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t n);
pa_status pa_seq_truncate(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t len);
pa_status pa_seq_free(pa_context *ctx, pa_pool *pool, int32_t seq);
/* Queries: -1 when seq is not a live sequence of the pool. */
int64_t pa_seq_len(const pa_pool *pool, int32_t seq);
int64_t pa_seq_num_pages(const pa_pool *pool, int32_t seq); /* held, incl. reserved */
/* Pages that reserve(n) or append(n) would take from the pool now
 * (new pages + 1 if a shared partial page must be copied); -1 when seq is
 * not live, n < 0, or n more tokens would pass PA_MAX_SEQLEN. */
int64_t pa_seq_pages_needed(const pa_pool *pool, int32_t seq, int64_t n);
/* Copies up to cap page ids into dst; returns how many the sequence holds
 * (-1 if not live). */
int64_t pa_seq_pages(const pa_pool *pool, int32_t seq, int32_t *dst, int64_t cap);

/* ---- automatic prefix caching ----
 * With caching on, a full page can carry a 64-bit chain hash that names its
 * tokens and those of every page before it in its sequence (pa_prefix_hashes
 * computes them from token ids or from one key per page, e.g. a trace's
 * block ids). A sequence registers its full pages under their hashes
 * (pa_seq_prefix_insert); a new, empty sequence starts with the longest run
 * of its hashes that the pool holds (pa_seq_prefix_attach), sharing those
 * pages (refcounted, as a fork does). A cached page whose last holder lets it
 * go stays cached, unheld, on a least-recently-released list, and counts as
 * free: when the free stack is empty, allocation evicts the oldest of them.
 * Lookup, insert and evict are O(1) per page (an open-addressing table with
 * twice as many slots as pages; the list is linked through the pages).
 * A cached page is never written: a write into a cached page (a sequence cut
 * back into it) copies it first, as copy-on-write does for a shared page, and
 * a sequence's reserved pages past its tokens are never cached.
 * pa_pool_validate checks all of this: no unheld page outside the free
 * stack and the list, no page on both, no held page on either. */
typedef struct pa_prefix_params {
    int64_t num_pages;     /* hashes to compute (out[0 .. num_pages - 1]) */
    int32_t page_size;     /* tokens per page (with tokens) */
    uint64_t parent;       /* the hash of the page before the first; 0 at a sequence's start */
    const int32_t *tokens; /* maybe: token ids [num_pages * page_size] */
    const uint64_t *keys;  /* maybe: one key per page instead of its tokens */
} pa_prefix_params;

void pa_prefix_params_init(pa_prefix_params *p);
/* out[i] = chain(out[i - 1], key of page i), out[-1] = parent, where a page's
 * key is keys[i] or a hash of its page_size tokens; exactly one of the two. */
pa_status pa_prefix_hashes(pa_context *ctx, const pa_prefix_params *p, uint64_t *out);
/* on != 0 starts caching (nothing is cached yet; again: no change); 0 stops
 * it: every page leaves the cache, the unheld ones go to the free stack.
 * Starting allocates ~(16 + 17 x num_pages) bytes of host memory. */
pa_status pa_pool_prefix_cache(pa_context *ctx, pa_pool *pool, int32_t on);
/* How many of hashes[0 .. n-1], from the first, the pool holds (0 when
 * caching is off). *idle (maybe NULL): how many of those pages no sequence
 * holds, which attaching them takes from the free pages. Changes nothing. */
int64_t pa_pool_prefix_lookup(const pa_pool *pool, int64_t n, const uint64_t *hashes, int64_t *idle);
/* seq: live and empty (no pages). Gives it the pages of the longest cached
 * prefix of hashes[0 .. n-1] and their matched * page_size tokens; counts
 * matched hits and n - matched misses. *matched (maybe NULL) receives it. */
pa_status pa_seq_prefix_attach(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t n,
                               const uint64_t *hashes, int64_t *matched);
/* Registers seq's pages [first, first + n), which must be full
 * ((first + n) * page_size <= its length), under hashes[0 .. n-1]. A hash
 * the pool holds already stays with its page (this one is not cached); a page
 * cached already under the same hash is left; under another hash it is an
 * error. *inserted (maybe NULL): pages newly cached. */
pa_status pa_seq_prefix_insert(pa_context *ctx, pa_pool *pool, int32_t seq, int64_t first, int64_t n,
                               const uint64_t *hashes, int64_t *inserted);

/* A batch: staging buffers, reused from step to step, that turn a list of
 * (sequence, number of new tokens) into the index tensors the attention
 * calls take. pa_batch_stage appends the new tokens to every sequence (as
 * pa_seq_append, all or nothing for the whole list) and writes, on the
 * batch's device, for B = n sequences and total_q new tokens:
 *   block_table     i32 [B, max_pages]  pages holding each sequence's keys
 *                                       after the step, padded with 0
 *   cache_seqlens   i32 [B]      keys before the step (where k/v are appended)
 *   seqused_k       i32 [B]      keys after it (cache_seqlens + new tokens)
 *   cu_seqlens_q    i32 [B + 1]  prefix sums of the new tokens
 *   positions       i32 [total_q] position of each new token
 *   batch_indices   i32 [total_q] the entry (0..B-1) each new token belongs to
 *   kv_indptr       i32 [B + 1]  CSR form (FlashInfer): pages of entry b are
 *   kv_indices      i32 [kv_indptr[B]]   kv_indices[kv_indptr[b] .. kv_indptr[b+1]-1]
 *   kv_last_page_len i32 [B]     tokens in each entry's last page (0 if none)
 * The tensors are views owned by the batch: valid until its next stage or
 * destroy; never pass them to pa_tensor_destroy. */
typedef struct pa_batch pa_batch;

typedef enum pa_batch_field {
    PA_BATCH_BLOCK_TABLE = 0,
    PA_BATCH_CACHE_SEQLENS = 1,
    PA_BATCH_SEQUSED_K = 2,
    PA_BATCH_CU_SEQLENS_Q = 3,
    PA_BATCH_POSITIONS = 4,
    PA_BATCH_BATCH_INDICES = 5,
    PA_BATCH_KV_INDPTR = 6,
    PA_BATCH_KV_INDICES = 7,
    PA_BATCH_KV_LAST_PAGE_LEN = 8,
    /* the two-level (cascade) plan of a PA_BATCH_CASCADE batch (empty when
     * no group shares a page): G groups, S = their queries (shared_q) */
    PA_BATCH_PREFIX_BLOCK_TABLE = 9,   /* [G, prefix_width] each group's shared pages */
    PA_BATCH_PREFIX_SEQUSED_K = 10,    /* [G] keys of each group's shared prefix */
    PA_BATCH_PREFIX_CU_SEQLENS_Q = 11, /* [G + 1] the shared level's queries by group */
    PA_BATCH_PREFIX_ROWS = 12,         /* [S] the q row (0..total_q-1) of each shared-level query */
    PA_BATCH_PREFIX_ROW_OF = 13,       /* [total_q] the shared-level row of each q row, -1: none */
    PA_BATCH_SUFFIX_BLOCK_TABLE = 14,  /* [B, suffix_width] each entry's pages past its shared prefix */
    PA_BATCH_SUFFIX_CACHE_SEQLENS = 15, /* [B] cache_seqlens less the shared prefix */
    PA_BATCH_SUFFIX_SEQUSED_K = 16,    /* [B] seqused_k less the shared prefix */
    PA_BATCH_NUM_FIELDS = 17
} pa_batch_field;

typedef struct pa_batch_info {
    int32_t batch;        /* B */
    int32_t total_q;      /* new tokens in the step */
    int32_t max_seqlen_q; /* most new tokens of one entry */
    int32_t max_seqlen_k; /* most keys of one entry, after the step */
    int32_t max_pages;    /* block_table columns (>= 1) */
    int32_t num_indices;  /* kv_indices entries */
    int32_t new_pages;    /* pages the step took from the pool */
    int32_t cow_copies;   /* of which copies of shared pages */
} pa_batch_info;

typedef enum pa_batch_flags {
    PA_BATCH_DEFAULT = 0,
    PA_BATCH_NO_CSR = 1, /* skip kv_indptr, kv_indices, kv_last_page_len (left
                           empty): half the bytes to write and upload */
    PA_BATCH_CASCADE = 2 /* stage a two-level plan for shared prefixes (below) */
} pa_batch_flags;

/* dev: where the staged tensors live; NULL = the caches' device (required
 * when the pool has no tensors). flags: pa_batch_flags. The pool must
 * outlive the batch. */
pa_status pa_batch_create(pa_context *ctx, pa_pool *pool, pa_device *dev, int32_t flags,
                          pa_batch **out);
void pa_batch_destroy(pa_batch *batch);
/* seqs[i], num_new[i] for i < n: distinct live sequences and counts >= 0.
 * info (maybe NULL) receives the shapes. */
pa_status pa_batch_stage(pa_context *ctx, pa_batch *batch, int32_t n, const int32_t *seqs,
                         const int32_t *num_new, pa_batch_info *info);
/* Undoes the last successful stage (lengths and pages taken), e.g. when the
 * attention call that was to write the new tokens failed. */
pa_status pa_batch_unstage(pa_context *ctx, pa_batch *batch);
pa_tensor *pa_batch_tensor(const pa_batch *batch, pa_batch_field field);

/* ---- shared prefixes read once (cascade attention) ----
 * A PA_BATCH_CASCADE batch finds, at each stage, groups of entries whose
 * leading pages are the same pages of the pool, and stages a two-level plan:
 * each group's shared prefix, then each entry's own suffix. Only whole pages
 * that hold keys from before the step are shared (a partial page, and every
 * page the step writes, belongs to the suffix). Automatic groups come from
 * the page lists themselves (a trie of the entries' pages; where sharing
 * nests, as forks of forks do, each entry joins the group that saves the
 * most page reads, one level deep); given groups (pa_batch_stage_groups)
 * share the longest run of pages common to all their entries. A group needs
 * two entries with new tokens; the others run as today.
 *
 * pa_batch_attention runs one attention over the staged batch: the shared
 * level as one attention_varlen call whose queries are all the group's new
 * tokens over the group's prefix (every query sees every prefix key: they all
 * come after it), the suffix level as the plain call over the suffix tables,
 * and merges the two by their log-sum-exp (the results are the plain call's
 * within the tolerance rule). It runs the plain call instead where the
 * levels would not give its results: ALiBi (its bias needs each query's true
 * position inside the prefix), a left window that does not reach back to the
 * first key, or q rows that are not the staged new tokens. */
typedef enum pa_cascade_fallback {
    PA_CASCADE_USED = 0,      /* the last call ran the two levels */
    PA_CASCADE_OFF = 1,       /* the batch was made without PA_BATCH_CASCADE */
    PA_CASCADE_NO_GROUPS = 2, /* no two entries share a whole page */
    PA_CASCADE_ALIBI = 3,     /* alibi_slopes given */
    PA_CASCADE_WINDOW = 4,    /* a left window that cuts into a shared prefix */
    PA_CASCADE_ROWS = 5       /* q's rows are not the staged new tokens */
} pa_cascade_fallback;

typedef struct pa_batch_cascade_info {
    int32_t groups;          /* groups with a shared level */
    int32_t grouped;         /* entries in them */
    int32_t shared_q;        /* queries of the shared level */
    int32_t prefix_width;    /* most shared pages of a group (prefix_block_table columns) */
    int32_t suffix_width;    /* suffix_block_table columns */
    int32_t max_grouped_pos; /* the last position of a grouped query (-1: none) */
    int64_t prefix_pages;    /* shared pages, over all groups (each read once) */
    int64_t saved_pages;     /* page reads the shared level saves: per group (entries - 1) x pages */
    int32_t last_fallback;   /* pa_cascade_fallback of the last pa_batch_attention */
    int32_t last_calls;      /* attention calls it made (1: the plain call) */
} pa_batch_cascade_info;

/* pa_batch_stage with groups (maybe NULL: automatic): entries i and j with
 * groups[i] == groups[j] >= 0 form one group; an entry with a negative label
 * has none. Only for PA_BATCH_CASCADE batches. */
pa_status pa_batch_stage_groups(pa_context *ctx, pa_batch *batch, int32_t n, const int32_t *seqs,
                                const int32_t *num_new, const int32_t *groups, pa_batch_info *info);
void pa_batch_get_cascade(const pa_batch *batch, pa_batch_cascade_info *out);
/* Automatic groups only where a group saves at least `pages` page reads a
 * call ((entries - 1) x shared pages; default 0: every group that saves
 * any), from the next stage on; given groups stay as given. A shared level
 * costs launches of its own (on an H100 a short system prompt that the L2
 * serves to the plain call made steps slower): the threshold is where a
 * study finds it pays. Only for PA_BATCH_CASCADE batches; pages >= 0. */
pa_status pa_batch_set_cascade_min_saved(pa_context *ctx, pa_batch *batch, int64_t pages);
/* One attention over the last stage: p as for attention_varlen (q
 * [total_q, H, D]) or attention_with_kvcache (q [B, Sq, H, D]; with k
 * [B, S_new, Hk, D] every entry must have staged S_new new tokens), without
 * the index tensors (block_table, cache_seqlens, cu_seqlens_q, seqused_k,
 * max_seqlen_q, the CSR form): the batch sets them. k and v, when given, are
 * appended first. Two levels where the batch staged groups and the call
 * allows them (above), else the plain call. A caller's mistake changes
 * nothing. */
pa_status pa_batch_attention(pa_context *ctx, pa_batch *batch, const pa_attention_params *p);

/* PA_API_END */

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_H */
