/*
 * attention.c -- argument validation for the two attention entry points and
 * their normalisation into one pa_attn_problem for the backends.
 *
 * Everything is checked before anything is written: a failed call leaves the
 * caches and outputs untouched. Messages start with the offending argument's
 * name, as the Lua API spells it.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

void pa_attention_params_init(pa_attention_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->softmax_scale = NAN;
    p->cache_seqlen = -1;
    p->window_left = -1;
    p->window_right = -1;
    p->rotary_interleaved = 1;
    p->k_scale = 1.0f;
    p->v_scale = 1.0f;
}

typedef struct scratch {
    /* host copies of device index tensors, and per-sequence arrays */
    void *owned[24];
    int n;
} scratch;

static void *scratch_alloc(scratch *s, size_t bytes) {
    if (s->n >= (int)(sizeof s->owned / sizeof s->owned[0])) return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) s->owned[s->n++] = p;
    return p;
}

static void scratch_free(scratch *s) {
    for (int i = 0; i < s->n; i++) free(s->owned[i]);
    s->n = 0;
}

static bool is_float(pa_dtype d) { return d == PA_F32 || d == PA_F16 || d == PA_BF16; }

/* Shape check: dims[i] < 0 means "any"; writes what was found into the message. */
static pa_status check_shape(pa_context *ctx, const char *name, const pa_tensor *t,
                             const char *layout, int ndim, const int64_t *dims) {
    char got[160];
    if (t->ndim != ndim)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: expected %d dimensions %s, got shape %s", name,
                       ndim, layout, pa_shape_str(t, got, sizeof got));
    for (int i = 0; i < ndim; i++) {
        if (dims[i] >= 0 && t->shape[i] != dims[i]) {
            char want[160];
            size_t n = (size_t)snprintf(want, sizeof want, "[");
            for (int j = 0; j < ndim && n < sizeof want; j++) {
                if (dims[j] >= 0)
                    n += (size_t)snprintf(want + n, sizeof want - n, "%s%lld", j ? ", " : "",
                                          (long long)dims[j]);
                else
                    n += (size_t)snprintf(want + n, sizeof want - n, "%s*", j ? ", " : "");
            }
            if (n < sizeof want) snprintf(want + n, sizeof want - n, "]");
            return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: expected shape %s %s, got %s", name, want,
                           layout, pa_shape_str(t, got, sizeof got));
        }
    }
    return PA_OK;
}

static pa_status check_common(pa_context *ctx, const char *name, const pa_tensor *t,
                              const pa_device *dev) {
    if (t->dev != dev)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: on device %s, but q is on %s", name,
                       t->dev->name, dev->name);
    return PA_OK;
}

static pa_status check_dtype(pa_context *ctx, const char *name, const pa_tensor *t, pa_dtype want) {
    if (t->dtype != want)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: dtype %s, expected %s", name,
                       pa_dtype_name(t->dtype), pa_dtype_name(want));
    return PA_OK;
}

/* Index tensors downloaded by attention calls so far (all devices); the
 * specs read it to check that mirrored tensors are not downloaded. */
static atomic_llong index_downloads;

int64_t pa_debug_index_downloads(void) { return atomic_load(&index_downloads); }

/* Host view of an i32 tensor: its memory, its host mirror, or a downloaded
 * copy (which waits for the device) when it lives on a GPU. */
static pa_status host_i32(pa_context *ctx, scratch *s, const pa_tensor *t, const int32_t **out) {
    if (t->dev->host_accessible || t->numel == 0) {
        *out = t->data;
        return PA_OK;
    }
    const int32_t *m = pa_mirror_get(t);
    if (m) {
        *out = m;
        return PA_OK;
    }
    atomic_fetch_add(&index_downloads, 1);
    int32_t *buf = scratch_alloc(s, t->bytes);
    if (!buf) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    pa_status st = t->dev->ops->download(ctx, t->dev, buf, t->data, t->bytes);
    if (st) return st;
    *out = buf;
    return PA_OK;
}

#define TRY(expr)                      \
    do {                               \
        pa_status st_ = (expr);        \
        if (st_ != PA_OK) return st_;  \
    } while (0)

/* Host view of an f32 tensor of n elements (n > 0): its memory, its host
 * mirror, or a downloaded copy (which waits for the device). */
static pa_status host_f32(pa_context *ctx, scratch *s, const pa_tensor *t, const float **out) {
    if (t->dev->host_accessible) {
        *out = t->data;
        return PA_OK;
    }
    float *buf = scratch_alloc(s, t->bytes);
    if (!buf) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    const int32_t *m = pa_mirror_get(t); /* (a mirror holds the elements' bytes) */
    if (m) {
        memcpy(buf, m, t->bytes);
    } else {
        atomic_fetch_add(&index_downloads, 1);
        TRY(t->dev->ops->download(ctx, t->dev, buf, t->data, t->bytes));
    }
    *out = buf;
    return PA_OK;
}

/* One cache's scale: `value` for the whole tensor, or `heads` (maybe) f32
 * [Hk] per kv head, for fp8 caches; only the default 1 for others. Fills the
 * problem's scalar, device pointer and host array of Hk scales. */
static pa_status check_scale(pa_context *ctx, const char *name, float value, const pa_tensor *heads,
                             pa_attn_problem *pb, scratch *s, float *scalar, const float **dptr,
                             const float **host) {
    const int32_t Hk = pb->kv_heads;
    if (!pa_dtype_is_fp8(pb->cache_dtype)) {
        if (heads || value != 1.0f)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: scales apply to fp8 caches, and the caches are %s", name,
                           pa_dtype_name(pb->cache_dtype));
        *scalar = 1.0f;
        return PA_OK;
    }
    float *h = scratch_alloc(s, sizeof(float) * (size_t)Hk);
    if (!h) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    if (!heads) {
        if (!(value > 0) || isinf(value))
            return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: %g is not a positive finite number", name, (double)value);
        for (int32_t i = 0; i < Hk; i++) h[i] = value;
        *scalar = value;
        *host = h;
        return PA_OK;
    }
    if (value != 1.0f)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: give one number or a tensor [Hk] per kv head, not both (the number is %g)",
                       name, (double)value);
    TRY(check_common(ctx, name, heads, pb->dev));
    TRY(check_dtype(ctx, name, heads, PA_F32));
    int64_t dims[1] = {Hk};
    TRY(check_shape(ctx, name, heads, "[Hk] (one scale per kv head)", 1, dims));
    const float *v = NULL;
    TRY(host_f32(ctx, s, heads, &v));
    for (int32_t i = 0; i < Hk; i++) {
        if (!(v[i] > 0) || isinf(v[i]))
            return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: entry %d (kv head %d) is %g, not a positive finite number", name, i,
                           i, (double)v[i]);
        h[i] = v[i];
    }
    *scalar = 1.0f;
    *dptr = heads->data;
    *host = h;
    return PA_OK;
}

static pa_status check_scales(pa_context *ctx, const pa_attention_params *p, pa_attn_problem *pb, scratch *s) {
    TRY(check_scale(ctx, "k_scale", p->k_scale, p->k_scales, pb, s, &pb->k_scale, &pb->k_scales, &pb->h_k_scales));
    return check_scale(ctx, "v_scale", p->v_scale, p->v_scales, pb, s, &pb->v_scale, &pb->v_scales, &pb->h_v_scales);
}

/* Page ids in the pool are [0, num_pages): one unsigned compare, id >= bound,
 * finds the others (a negative id is >= 2^31 unsigned; a pool beyond 2^31
 * pages holds every other int32). */
static uint32_t pool_bound(int64_t num_pages) {
    return num_pages > ((int64_t)1 << 31) ? (uint32_t)1 << 31 : (uint32_t)num_pages;
}

/* How many of the n ids at `ids` lie in the pool before the first that does
 * not (n if all do): blocks of 64 compared without an exit, which
 * vectorises, then the block with the first one out, id by id. */
static int64_t ids_in_pool(const int32_t *ids, int64_t n, uint32_t bound) {
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        uint32_t out = 0;
        for (int k = 0; k < 64; k++) out |= (uint32_t)((uint32_t)ids[j + k] >= bound);
        if (out) break;
    }
    while (j < n && (uint32_t)ids[j] < bound) j++;
    return j;
}

/* Per row of a mirrored block table, how many leading entries lie in the
 * pool: kept on the context for the table's contents (its mirror_gen), so
 * that calls reusing a table (each layer of a step, a benchmark's calls)
 * check each sequence's page count against it instead of reading its pages
 * again (65536 ids took ~45 us a call on the H200 machine's host). NULL
 * where the table has no mirror (host memory can change under us; then the
 * rows are read each call) or the host is out of memory. */
static const int64_t *bt_checked_rows(pa_context *ctx, const pa_tensor *bt, const int32_t *ids,
                                      int64_t num_pages) {
    if (!ctx || !ids || ids != pa_mirror_get(bt)) return NULL;
    pa_bt_checked *c = &ctx->bt;
    const int64_t rows = bt->shape[0], cols = bt->shape[1];
    if (c->table == bt && c->gen == bt->mirror_gen && c->num_pages == num_pages && c->rows == rows &&
        c->cols == cols)
        return c->valid;
    c->table = NULL;
    if (rows > c->cap) {
        int64_t *v = realloc(c->valid, sizeof(int64_t) * (size_t)rows);
        if (!v) return NULL;
        c->valid = v;
        c->cap = rows;
    }
    const uint32_t bound = pool_bound(num_pages);
    for (int64_t r = 0; r < rows; r++) c->valid[r] = ids_in_pool(ids + r * cols, cols, bound);
    c->table = bt;
    c->gen = bt->mirror_gen;
    c->num_pages = num_pages;
    c->rows = rows;
    c->cols = cols;
    return c->valid;
}

/* The checks and derivations both forms share, after the form-specific code has
 * filled batch, seqlen arrays and the q/out/lse layouts. Without work (no
 * query, nothing to append) the per-sequence part is skipped: its arrays
 * are not there, and a call that reads and writes nothing should not cost
 * O(batch). */
static pa_status build_problem(pa_context *ctx, const pa_attention_params *p, bool varlen,
                               bool work, const int32_t *csr_rows, pa_attn_problem *pb, scratch *s) {
    const pa_tensor *q = p->q;
    pa_device *dev = q->dev;
    const int32_t B = pb->batch, H = pb->heads, D = pb->head_dim;
    const char *q_layout = varlen ? "[total_q, H, D]" : "[B, Sq, H, D]";
    const char *kv_layout_new = varlen ? "[total_q, Hk, D]" : "[B, S_new, Hk, D]";

    /* caches */
    const pa_tensor *kc = p->k_cache, *vc = p->v_cache;
    if (!kc) return pa_fail(ctx, PA_ERR_ARGUMENT, "k_cache: missing");
    if (!vc) return pa_fail(ctx, PA_ERR_ARGUMENT, "v_cache: missing");
    TRY(check_common(ctx, "k_cache", kc, dev));
    TRY(check_common(ctx, "v_cache", vc, dev));
    const bool paged = p->block_table != NULL;
    const char *cache_layout = paged ? "[num_pages, page_size, Hk, D]" : "[B_cache, S_cache, Hk, D]";
    {
        int64_t dims[4] = {-1, -1, -1, D};
        TRY(check_shape(ctx, "k_cache", kc, cache_layout, 4, dims));
    }
    /* the caches: q's dtype, or an fp8 one (both the same) */
    if (!pa_dtype_is_fp8(kc->dtype)) TRY(check_dtype(ctx, "k_cache", kc, q->dtype));
    {
        int64_t dims[4] = {kc->shape[0], kc->shape[1], kc->shape[2], D};
        TRY(check_shape(ctx, "v_cache", vc, cache_layout, 4, dims));
    }
    if (vc->dtype != kc->dtype)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "v_cache: dtype %s, expected %s (k_cache's)", pa_dtype_name(vc->dtype),
                       pa_dtype_name(kc->dtype));
    pb->cache_dtype = kc->dtype;
    const int64_t Hk = kc->shape[2];
    if (Hk <= 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "k_cache: has 0 kv heads");
    if (H % Hk != 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "q: %d heads is not a multiple of the %lld kv heads of k_cache", H,
                       (long long)Hk);
    if (kc->shape[1] <= 0 && (paged || kc->shape[0] > 0))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "k_cache: %s must be >= 1",
                       paged ? "page_size" : "S_cache");
    if (kc->shape[1] > INT32_MAX)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "k_cache: dimension 2 (%lld) exceeds 2^31 - 1",
                       (long long)kc->shape[1]);
    pb->kv_heads = (int32_t)Hk;
    pb->group = H / (int32_t)Hk;
    pb->k_cache = kc->data;
    pb->v_cache = vc->data;
    pb->num_pages = kc->shape[0];
    pb->page_size = (int32_t)kc->shape[1];
    pb->paged = paged;

    /* block table / batch index */
    int64_t capacity; /* keys a sequence can hold */
    const int64_t *bt_valid = NULL; /* leading entries in the pool, per row (or NULL) */
    if (paged) {
        const pa_tensor *bt = p->block_table;
        TRY(check_common(ctx, "block_table", bt, dev));
        TRY(check_dtype(ctx, "block_table", bt, PA_I32));
        int64_t dims[2] = {B, -1};
        TRY(check_shape(ctx, "block_table", bt, "[B, max_pages]", 2, dims));
        if (p->cache_batch_idx)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "cache_batch_idx: not supported with a paged cache (block_table given)");
        pb->block_table = bt->data;
        pb->bt_stride = bt->shape[1];
        TRY(host_i32(ctx, s, bt, &pb->h_block_table));
        bt_valid = bt_checked_rows(ctx, bt, pb->h_block_table, pb->num_pages);
        /* (saturated: no sequence holds more than PA_MAX_SEQLEN keys, and a
         * zero-row table may be 2^62 columns wide) */
        const int64_t cols_max = (PA_MAX_SEQLEN + (int64_t)pb->page_size - 1) / pb->page_size;
        capacity = (bt->shape[1] < cols_max ? bt->shape[1] : cols_max) * pb->page_size;
    } else {
        if (p->cache_batch_idx) {
            const pa_tensor *cb = p->cache_batch_idx;
            TRY(check_common(ctx, "cache_batch_idx", cb, dev));
            TRY(check_dtype(ctx, "cache_batch_idx", cb, PA_I32));
            int64_t dims[1] = {B};
            TRY(check_shape(ctx, "cache_batch_idx", cb, "[B]", 1, dims));
            TRY(host_i32(ctx, s, cb, &pb->h_cache_batch_idx));
            for (int32_t b = 0; b < B; b++) {
                int32_t v = pb->h_cache_batch_idx[b];
                if (v < 0 || v >= kc->shape[0])
                    return pa_fail(ctx, PA_ERR_ARGUMENT,
                                   "cache_batch_idx: entry %d is %d, outside the cache's batch "
                                   "[0, %lld)",
                                   b, v, (long long)kc->shape[0]);
            }
            pb->cache_batch_idx = cb->data;
        } else if (kc->shape[0] != B) {
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "k_cache: batch %lld differs from q's batch %d (pass cache_batch_idx "
                           "or block_table)",
                           (long long)kc->shape[0], B);
        }
        capacity = kc->shape[1];
    }

    /* new k/v */
    if ((p->k != NULL) != (p->v != NULL))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s", p->k ? "v: missing (k was given; pass both or neither)"
                                                        : "k: missing (v was given; pass both or neither)");
    int64_t s_new = 0;
    if (p->k) {
        TRY(check_common(ctx, "k", p->k, dev));
        TRY(check_common(ctx, "v", p->v, dev));
        if (varlen) {
            int64_t dims[3] = {pb->total_q, Hk, D};
            TRY(check_shape(ctx, "k", p->k, kv_layout_new, 3, dims));
            TRY(check_shape(ctx, "v", p->v, kv_layout_new, 3, dims));
        } else {
            int64_t dims[4] = {B, -1, Hk, D};
            TRY(check_shape(ctx, "k", p->k, kv_layout_new, 4, dims));
            dims[1] = p->k->shape[1];
            TRY(check_shape(ctx, "v", p->v, kv_layout_new, 4, dims));
            s_new = p->k->shape[1];
        }
        TRY(check_dtype(ctx, "k", p->k, q->dtype));
        TRY(check_dtype(ctx, "v", p->v, q->dtype));
        pb->k_new = p->k->data;
        pb->v_new = p->v->data;
    }

    /* rotary */
    if ((p->rotary_cos != NULL) != (p->rotary_sin != NULL))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "%s",
                       p->rotary_cos ? "rotary_sin: missing (rotary_cos was given)"
                                     : "rotary_cos: missing (rotary_sin was given)");
    if (p->rotary_cos) {
        if (!p->k)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "rotary_cos: rotary embedding needs new k and v to append");
        const pa_tensor *rc = p->rotary_cos, *rs = p->rotary_sin;
        TRY(check_common(ctx, "rotary_cos", rc, dev));
        TRY(check_common(ctx, "rotary_sin", rs, dev));
        if (!is_float(rc->dtype))
            return pa_fail(ctx, PA_ERR_ARGUMENT, "rotary_cos: dtype %s, expected f32, f16 or bf16",
                           pa_dtype_name(rc->dtype));
        int64_t dims[2] = {-1, -1};
        TRY(check_shape(ctx, "rotary_cos", rc, "[seqlen_ro, rotary_dim / 2]", 2, dims));
        int64_t dims2[2] = {rc->shape[0], rc->shape[1]};
        TRY(check_shape(ctx, "rotary_sin", rs, "[seqlen_ro, rotary_dim / 2]", 2, dims2));
        TRY(check_dtype(ctx, "rotary_sin", rs, rc->dtype));
        if (rc->shape[0] < 1)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "rotary_cos: has 0 positions (shape [seqlen_ro, rotary_dim / 2] with seqlen_ro >= 1)");
        if (rc->shape[1] < 1 || 2 * rc->shape[1] > D)
            return pa_fail(ctx, PA_ERR_ARGUMENT,
                           "rotary_cos: rotary_dim = 2 * %lld must be in [2, head dim %d]",
                           (long long)rc->shape[1], D);
        pb->rotary_cos = rc->data;
        pb->rotary_sin = rs->data;
        pb->rotary_dtype = rc->dtype;
        pb->rotary_dim = (int32_t)(2 * rc->shape[1]);
        pb->seqlen_ro = rc->shape[0];
        pb->rotary_interleaved = p->rotary_interleaved != 0;
    }

    /* alibi */
    if (p->alibi_slopes) {
        const pa_tensor *a = p->alibi_slopes;
        TRY(check_common(ctx, "alibi_slopes", a, dev));
        TRY(check_dtype(ctx, "alibi_slopes", a, PA_F32));
        if (a->ndim == 1) {
            int64_t dims[1] = {H};
            TRY(check_shape(ctx, "alibi_slopes", a, "[H]", 1, dims));
            pb->alibi_batch_stride = 0;
        } else {
            int64_t dims[2] = {B, H};
            TRY(check_shape(ctx, "alibi_slopes", a, "[B, H]", 2, dims));
            pb->alibi_batch_stride = H;
        }
        pb->alibi = a->data;
    }

    TRY(check_scales(ctx, p, pb, s));

    /* masking and scalars */
    if (p->window_left < -1)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "window_size: left is %d (use -1 for unbounded)", p->window_left);
    if (p->window_right < -1)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "window_size: right is %d (use -1 for unbounded)", p->window_right);
    if (!(p->softcap >= 0) || isinf(p->softcap))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "softcap: %g must be a finite number >= 0", (double)p->softcap);
    if (isinf(p->softmax_scale))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "softmax_scale: %g is not finite", (double)p->softmax_scale);
    if (p->num_splits < 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "num_splits: %d must be >= 0", p->num_splits);
    pb->causal = p->causal != 0;
    pb->window_left = p->window_left;
    pb->window_right = pb->causal ? 0 : p->window_right;
    if (pb->causal && p->window_right > 0)
        pb->window_right = 0; /* causal wins, as in flash-attention */
    pb->softcap = p->softcap;
    /* NaN (pa_attention_params_init) asks for the default; 0 and denormals are used as given */
    pb->scale = isnan(p->softmax_scale) ? (float)(1.0 / sqrt((double)D)) : p->softmax_scale;
    pb->num_splits = p->num_splits;
    pb->rope_q_step = pb->causal || pb->window_left >= 0 || pb->window_right >= 0;

    /* per-sequence key lengths, append positions, and the checks that need them */
    if (!varlen && p->cache_seqlens) {
        const pa_tensor *cs = p->cache_seqlens;
        TRY(check_common(ctx, "cache_seqlens", cs, dev));
        TRY(check_dtype(ctx, "cache_seqlens", cs, PA_I32));
        int64_t dims[1] = {B};
        TRY(check_shape(ctx, "cache_seqlens", cs, "[B]", 1, dims));
    }
    if (!varlen && !p->cache_seqlens && p->cache_seqlen < -1)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "cache_seqlens: %lld is negative", (long long)p->cache_seqlen);
    if (!varlen && p->k && !p->cache_seqlens && p->cache_seqlen < 0)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "cache_seqlens: required when appending k and v (where do they go?)");
    if (!work) goto outputs;
    int32_t *seqlen_k = scratch_alloc(s, sizeof(int32_t) * (size_t)B);
    int32_t *num_new = scratch_alloc(s, sizeof(int32_t) * (size_t)B);
    int32_t *append_pos = scratch_alloc(s, sizeof(int32_t) * (size_t)B);
    int64_t *new_row = scratch_alloc(s, sizeof(int64_t) * (size_t)B);
    if (!seqlen_k || !num_new || !append_pos || !new_row)
        return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    const int32_t *h_cache_seqlens = NULL, *h_seqused = NULL;
    if (!varlen && p->cache_seqlens) TRY(host_i32(ctx, s, p->cache_seqlens, &h_cache_seqlens));
    if (varlen) TRY(host_i32(ctx, s, p->seqused_k, &h_seqused));

    int64_t total_new = 0;
    int32_t max_k = 0;
    for (int32_t b = 0; b < B; b++) {
        const int32_t sq = pb->h_seqlen_q[b];
        int64_t before, nn, sk;
        if (varlen) {
            nn = p->k ? sq : 0;
            sk = h_seqused[b];
            if (sk < 0)
                return pa_fail(ctx, PA_ERR_ARGUMENT, "seqused_k: entry %d is %lld (negative)", b, (long long)sk);
            if (sk > PA_MAX_SEQLEN)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "seqused_k: entry %d is %lld keys, more than 2^30 (PA_MAX_SEQLEN), the most one sequence holds",
                               b, (long long)sk);
            before = sk - nn;
            if (before < 0)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "seqused_k: entry %d is %lld, fewer than the sequence's %lld new "
                               "tokens (seqused_k counts the appended k/v)",
                               b, (long long)sk, (long long)nn);
            if (sk > capacity)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "seqused_k: entry %d is %lld, beyond the capacity of %lld keys "
                               "(%s)",
                               b, (long long)sk, (long long)capacity,
                               paged ? "block_table columns * page_size" : "S_cache");
            new_row[b] = pb->h_q_start[b];
        } else {
            nn = s_new;
            before = h_cache_seqlens ? h_cache_seqlens[b]
                                     : (p->cache_seqlen >= 0 ? p->cache_seqlen : capacity);
            if (before < 0)
                return pa_fail(ctx, PA_ERR_ARGUMENT, "cache_seqlens: entry %d is %lld (negative)",
                               b, (long long)before);
            sk = before + nn;
            if (sk > PA_MAX_SEQLEN)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "cache_seqlens: sequence %d holds %lld keys + %lld new, more than 2^30 "
                               "(PA_MAX_SEQLEN), the most one sequence holds",
                               b, (long long)before, (long long)nn);
            if (sk > capacity)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "cache_seqlens: sequence %d holds %lld keys + %lld new > capacity "
                               "%lld (%s)",
                               b, (long long)before, (long long)nn, (long long)capacity,
                               paged ? "block_table columns * page_size" : "S_cache");
            new_row[b] = (int64_t)b * s_new;
        }
        if (pb->rotary_cos) {
            int64_t last = before + (nn > 0 ? nn - 1 : 0);
            int64_t last_q = before + (pb->rope_q_step && sq > 0 ? sq - 1 : 0);
            if (last_q > last) last = last_q;
            if ((nn > 0 || sq > 0) && last >= pb->seqlen_ro)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "rotary_cos: has %lld positions, sequence %d needs position %lld",
                               (long long)pb->seqlen_ro, b, (long long)last);
        }
        if (paged) {
            const int64_t pages = (sk + pb->page_size - 1) / pb->page_size;
            /* (a CSR row is padded to the widest: its own length bounds it) */
            if (csr_rows && pages > csr_rows[b])
                return pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indptr: sequence %d has %d page%s, its %lld keys need %lld", b,
                               csr_rows[b], csr_rows[b] == 1 ? "" : "s", (long long)sk, (long long)pages);
            const int32_t *row = pb->h_block_table + (int64_t)b * pb->bt_stride;
            const int64_t j = bt_valid ? bt_valid[b] : ids_in_pool(row, pages, pool_bound(pb->num_pages));
            if (j < pages)
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "block_table: entry [%d, %lld] is %d, outside the pool of %lld pages", b,
                               (long long)j, row[j], (long long)pb->num_pages);
        }
        seqlen_k[b] = (int32_t)sk;
        num_new[b] = (int32_t)nn;
        append_pos[b] = (int32_t)before;
        total_new += nn;
        if (sk > max_k) max_k = (int32_t)sk;
    }
    pb->h_seqlen_k = seqlen_k;
    pb->h_num_new = num_new;
    pb->h_append_pos = append_pos;
    pb->h_new_start_row = new_row;
    pb->max_seqlen_k = max_k;
    pb->total_new = total_new;

outputs:
    if (!p->out) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: missing");
    TRY(check_common(ctx, "out", p->out, dev));
    TRY(check_dtype(ctx, "out", p->out, ctx && ctx->flags.out_f32 ? PA_F32 : q->dtype));
    {
        int64_t dims[PA_MAX_DIMS];
        for (int i = 0; i < q->ndim; i++) dims[i] = q->shape[i];
        TRY(check_shape(ctx, "out", p->out, q_layout, q->ndim, dims));
    }
    if (p->out == q || p->out == kc || p->out == vc)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "out: must not be q or a cache");
    pb->out = p->out->data;
    pb->out_dtype = p->out->dtype;
    if (p->softmax_lse) {
        const pa_tensor *l = p->softmax_lse;
        TRY(check_common(ctx, "softmax_lse", l, dev));
        TRY(check_dtype(ctx, "softmax_lse", l, PA_F32));
        if (varlen) {
            int64_t dims[2] = {H, pb->total_q};
            TRY(check_shape(ctx, "softmax_lse", l, "[H, total_q]", 2, dims));
        } else {
            int64_t dims[3] = {B, H, q->shape[1]};
            TRY(check_shape(ctx, "softmax_lse", l, "[B, H, Sq]", 3, dims));
        }
        pb->lse = l->data;
    }
    if (kc == vc) return pa_fail(ctx, PA_ERR_ARGUMENT, "v_cache: is the same tensor as k_cache");
    return PA_OK;
}

static pa_status check_q(pa_context *ctx, const pa_attention_params *p, int ndim, const char *layout) {
    if (!p) return pa_fail(ctx, PA_ERR_ARGUMENT, "params: NULL");
    if (!p->q) return pa_fail(ctx, PA_ERR_ARGUMENT, "q: missing");
    const pa_tensor *q = p->q;
    int64_t dims[4] = {-1, -1, -1, -1};
    TRY(check_shape(ctx, "q", q, layout, ndim, dims));
    if (!is_float(q->dtype))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "q: dtype %s, expected f32, f16 or bf16", pa_dtype_name(q->dtype));
    int64_t H = q->shape[ndim - 2], D = q->shape[ndim - 1];
    if (D < 1 || D > PA_MAX_HEAD_DIM)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "q: head dim %lld is not in [1, %d]", (long long)D, PA_MAX_HEAD_DIM);
    if (H < 1 || H > 65536) return pa_fail(ctx, PA_ERR_ARGUMENT, "q: %lld heads is not in [1, 65536]", (long long)H);
    for (int i = 0; i < ndim - 2; i++)
        if (q->shape[i] > INT32_MAX)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "q: dimension %d (%lld) exceeds 2^31 - 1", i + 1, (long long)q->shape[i]);
    if (ndim == 4 && q->shape[1] > PA_MAX_SEQLEN)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "q: %lld queries a sequence, more than 2^30 (PA_MAX_SEQLEN)",
                       (long long)q->shape[1]);
    return PA_OK;
}

/* The padded block table [B, widest] that the CSR form (kv_indptr,
 * kv_indices) describes, as a new tensor on the call's device, for a call
 * of B sequences. */
static pa_status csr_block_table(pa_context *ctx, const pa_attention_params *p, int64_t B, pa_tensor **out,
                                 int32_t **rows_out) {
    *out = NULL;
    *rows_out = NULL;
    const pa_tensor *ip = p->kv_indptr, *ix = p->kv_indices;
    pa_device *dev = p->q->dev;
    if (p->block_table)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indptr: give block_table or the CSR form (kv_indptr, kv_indices), not both");
    if (!ix) return pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indices: missing (kv_indptr was given)");
    TRY(check_common(ctx, "kv_indptr", ip, dev));
    TRY(check_common(ctx, "kv_indices", ix, dev));
    TRY(check_dtype(ctx, "kv_indptr", ip, PA_I32));
    TRY(check_dtype(ctx, "kv_indices", ix, PA_I32));
    {
        int64_t dims[1] = {B + 1};
        TRY(check_shape(ctx, "kv_indptr", ip, "[B + 1]", 1, dims));
        int64_t any[1] = {-1};
        TRY(check_shape(ctx, "kv_indices", ix, "[nnz]", 1, any));
    }
    scratch s = {{0}, 0};
    const int32_t *h_ip = NULL, *h_ix = NULL;
    pa_status st = host_i32(ctx, &s, ip, &h_ip);
    if (st == PA_OK) st = host_i32(ctx, &s, ix, &h_ix);
    int64_t width = 0;
    for (int64_t b = 0; st == PA_OK && b < B; b++) {
        if (b == 0 && h_ip[0] != 0)
            st = pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indptr: first entry is %d, expected 0", h_ip[0]);
        else if (h_ip[b + 1] < h_ip[b])
            st = pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indptr: decreases at entry %lld (%d after %d)", (long long)b + 1,
                         h_ip[b + 1], h_ip[b]);
        else if (h_ip[b + 1] - h_ip[b] > width)
            width = h_ip[b + 1] - h_ip[b];
    }
    if (st == PA_OK && B > 0 && h_ip[B] > ix->numel)
        st = pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indptr: last entry is %d, but kv_indices has %lld entries", h_ip[B],
                     (long long)ix->numel);
    int32_t *table = NULL;
    if (st == PA_OK && B * width > 0) {
        table = scratch_alloc(&s, sizeof(int32_t) * (size_t)(B * width));
        if (!table) st = pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
        for (int64_t b = 0; st == PA_OK && b < B; b++)
            memcpy(table + b * width, h_ix + h_ip[b], sizeof(int32_t) * (size_t)(h_ip[b + 1] - h_ip[b]));
    }
    int32_t *rows = NULL;
    if (st == PA_OK) {
        rows = malloc(sizeof(int32_t) * (size_t)(B > 0 ? B : 1));
        if (!rows) st = pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
        for (int64_t b = 0; st == PA_OK && b < B; b++) rows[b] = h_ip[b + 1] - h_ip[b];
    }
    if (st == PA_OK) {
        const int64_t shape[2] = {B, width};
        st = pa_tensor_create(ctx, dev, PA_I32, 2, shape, out);
        if (st == PA_OK && table) st = pa_tensor_write(ctx, *out, 0, table, B * width);
        if (st) {
            pa_tensor_destroy(*out);
            *out = NULL;
        }
    }
    if (st == PA_OK) *rows_out = rows;
    else free(rows);
    scratch_free(&s);
    return st;
}

/* kv_last_page_len, where given, against the keys each sequence attends. */
static pa_status check_last_page_len(pa_context *ctx, const pa_attention_params *p, const pa_attn_problem *pb) {
    const pa_tensor *lp = p->kv_last_page_len;
    if (!lp) return PA_OK;
    if (!p->kv_indptr) return pa_fail(ctx, PA_ERR_ARGUMENT, "kv_last_page_len: belongs to the CSR form (kv_indptr)");
    TRY(check_common(ctx, "kv_last_page_len", lp, pb->dev));
    TRY(check_dtype(ctx, "kv_last_page_len", lp, PA_I32));
    int64_t dims[1] = {pb->batch};
    TRY(check_shape(ctx, "kv_last_page_len", lp, "[B]", 1, dims));
    if (!pb->h_seqlen_k) return PA_OK; /* nothing attended or appended */
    scratch s = {{0}, 0};
    const int32_t *h = NULL;
    pa_status st = host_i32(ctx, &s, lp, &h);
    for (int32_t b = 0; st == PA_OK && b < pb->batch; b++) {
        const int64_t sk = pb->h_seqlen_k[b], last = sk > 0 ? sk - (sk - 1) / pb->page_size * pb->page_size : 0;
        if (h[b] != last)
            st = pa_fail(ctx, PA_ERR_ARGUMENT,
                         "kv_last_page_len: entry %d is %d, but sequence %d attends %lld keys (%lld in its last page)", b,
                         h[b], b, (long long)sk, (long long)last);
    }
    scratch_free(&s);
    return st;
}

static pa_status run(pa_context *ctx, const pa_attention_params *p, pa_attn_problem *pb) {
    if (pb->total_q == 0 && pb->total_new == 0) return PA_OK;
    if (ctx && ctx->flags.check_only) return PA_OK; /* pa_attention_check: validated, nothing run */
    pb->lane = ctx ? ctx->flags.lane : 0;
    /* What the kernels write: the caches only when appending. A read-only
     * input is never written, so threads may share it (pagedattn.h). */
    if (pb->total_new > 0) {
        pa_mirror_invalidate(p->k_cache);
        pa_mirror_invalidate(p->v_cache);
    }
    pa_mirror_invalidate(p->out);
    pa_mirror_invalidate(p->softmax_lse);
    return pb->dev->ops->attention(ctx, pb);
}

static pa_status with_kvcache(pa_context *ctx, const pa_attention_params *p, const int32_t *csr_rows);
static pa_status varlen(pa_context *ctx, const pa_attention_params *p, const int32_t *csr_rows);

/* Either form, with the CSR form of the pages turned into a block table for
 * the call (B: the call's sequences). */
static pa_status with_csr(pa_context *ctx, const pa_attention_params *p, int64_t B,
                          pa_status (*form)(pa_context *, const pa_attention_params *, const int32_t *)) {
    if (!p->kv_indptr) {
        if (p->kv_indices) return pa_fail(ctx, PA_ERR_ARGUMENT, "kv_indptr: missing (kv_indices was given)");
        if (p->kv_last_page_len)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "kv_last_page_len: belongs to the CSR form (kv_indptr)");
        return form(ctx, p, NULL);
    }
    pa_tensor *table = NULL;
    int32_t *rows = NULL;
    TRY(csr_block_table(ctx, p, B, &table, &rows));
    pa_attention_params q = *p;
    q.block_table = table;
    pa_status st = form(ctx, &q, rows);
    pa_tensor_destroy(table);
    free(rows);
    if (st == PA_ERR_ARGUMENT && ctx && strncmp(ctx->message, "block_table: ", 13) == 0) {
        /* the table is the call's own: the caller gave it as kv_indices */
        char msg[PA_ERRMSG_LEN];
        snprintf(msg, sizeof msg, "%s", ctx->message + 13);
        return pa_fail(ctx, st, "kv_indices (as the block table [B, widest]): %s", msg);
    }
    return st;
}

pa_status pa_attention_with_kvcache(pa_context *ctx, const pa_attention_params *p) {
    TRY(check_q(ctx, p, 4, "[B, Sq, H, D]"));
    return with_csr(ctx, p, p->q->shape[0], with_kvcache);
}

pa_status pa_attention_varlen(pa_context *ctx, const pa_attention_params *p) {
    TRY(check_q(ctx, p, 3, "[total_q, H, D]"));
    const pa_tensor *cu = p->cu_seqlens_q;
    if (!cu) return pa_fail(ctx, PA_ERR_ARGUMENT, "cu_seqlens_q: missing");
    return with_csr(ctx, p, cu->ndim == 1 && cu->shape[0] >= 1 ? cu->shape[0] - 1 : 0, varlen);
}

static pa_status with_kvcache(pa_context *ctx, const pa_attention_params *p, const int32_t *csr_rows) {
    if (p->cu_seqlens_q)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "cu_seqlens_q: belongs to attention_varlen");
    if (p->seqused_k) return pa_fail(ctx, PA_ERR_ARGUMENT, "seqused_k: belongs to attention_varlen");
    const pa_tensor *q = p->q;
    pa_attn_problem pb;
    memset(&pb, 0, sizeof pb);
    scratch s = {{0}, 0};
    pb.dev = q->dev;
    pb.dtype = q->dtype;
    pb.batch = (int32_t)q->shape[0];
    const int32_t B = pb.batch, Sq = (int32_t)q->shape[1];
    pb.heads = (int32_t)q->shape[2];
    pb.head_dim = (int32_t)q->shape[3];
    pb.total_q = (int64_t)B * Sq;
    pb.max_seqlen_q = Sq;
    pb.q = q->data;
    pb.lse_head_stride = Sq;
    /* work: a query, or a new token to append (k's shape is checked later) */
    /* (a k of another batch is refused by build_problem's O(1) checks, before
     * anything of size B is made) */
    const bool work = (int64_t)B * Sq > 0 || (p->k && p->k->ndim == 4 && p->k->shape[0] == B && B > 0 && p->k->shape[1] > 0);
    int32_t *sq = work ? scratch_alloc(&s, sizeof(int32_t) * (size_t)B) : NULL;
    int64_t *qs = work ? scratch_alloc(&s, sizeof(int64_t) * (size_t)B) : NULL;
    int64_t *ls = work ? scratch_alloc(&s, sizeof(int64_t) * (size_t)B) : NULL;
    pa_status st = PA_OK;
    if (work && (!sq || !qs || !ls)) {
        st = pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    } else {
        for (int32_t b = 0; work && b < B; b++) {
            sq[b] = Sq;
            qs[b] = (int64_t)b * Sq;
            ls[b] = (int64_t)b * pb.heads * Sq;
        }
        pb.h_seqlen_q = sq;
        pb.h_q_start = qs;
        pb.h_lse_start = ls;
        st = build_problem(ctx, p, false, work, csr_rows, &pb, &s);
        if (st == PA_OK) st = check_last_page_len(ctx, p, &pb);
        if (st == PA_OK && work) st = run(ctx, p, &pb);
    }
    scratch_free(&s);
    return st;
}

static pa_status varlen(pa_context *ctx, const pa_attention_params *p, const int32_t *csr_rows) {
    if (p->cache_seqlens)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "cache_seqlens: belongs to attention_with_kvcache (varlen uses seqused_k)");
    const pa_tensor *q = p->q, *cu = p->cu_seqlens_q, *su = p->seqused_k;
    pa_device *dev = q->dev;
    if (!cu) return pa_fail(ctx, PA_ERR_ARGUMENT, "cu_seqlens_q: missing");
    if (!su) return pa_fail(ctx, PA_ERR_ARGUMENT, "seqused_k: missing");
    TRY(check_common(ctx, "cu_seqlens_q", cu, dev));
    TRY(check_dtype(ctx, "cu_seqlens_q", cu, PA_I32));
    if (cu->ndim != 1 || cu->shape[0] < 1) {
        char got[160];
        return pa_fail(ctx, PA_ERR_ARGUMENT, "cu_seqlens_q: expected shape [B + 1], got %s",
                       pa_shape_str(cu, got, sizeof got));
    }
    const int32_t B = (int32_t)(cu->shape[0] - 1);
    TRY(check_common(ctx, "seqused_k", su, dev));
    TRY(check_dtype(ctx, "seqused_k", su, PA_I32));
    {
        int64_t dims[1] = {B};
        TRY(check_shape(ctx, "seqused_k", su, "[B]", 1, dims));
    }
    pa_attn_problem pb;
    memset(&pb, 0, sizeof pb);
    scratch s = {{0}, 0};
    pb.dev = dev;
    pb.dtype = q->dtype;
    pb.varlen = true;
    pb.batch = B;
    pb.heads = (int32_t)q->shape[1];
    pb.head_dim = (int32_t)q->shape[2];
    pb.total_q = q->shape[0];
    pb.q = q->data;
    pb.lse_head_stride = pb.total_q;
    const int32_t *h_cu = NULL;
    int32_t *sq = scratch_alloc(&s, sizeof(int32_t) * (size_t)(B ? B : 1));
    int64_t *qs = scratch_alloc(&s, sizeof(int64_t) * (size_t)(B ? B : 1));
    int64_t *ls = scratch_alloc(&s, sizeof(int64_t) * (size_t)(B ? B : 1));
    pa_status st = PA_OK;
    if (!sq || !qs || !ls) st = pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "attention: out of host memory");
    if (st == PA_OK) st = host_i32(ctx, &s, cu, &h_cu);
    if (st == PA_OK && h_cu[0] != 0)
        st = pa_fail(ctx, PA_ERR_ARGUMENT, "cu_seqlens_q: first entry is %d, expected 0", h_cu[0]);
    int32_t max_q = 0;
    for (int32_t b = 0; st == PA_OK && b < B; b++) {
        int64_t len = (int64_t)h_cu[b + 1] - h_cu[b];
        if (len < 0)
            st = pa_fail(ctx, PA_ERR_ARGUMENT, "cu_seqlens_q: decreases at entry %d (%d after %d)",
                         b + 1, h_cu[b + 1], h_cu[b]);
        else if (len > PA_MAX_SEQLEN)
            st = pa_fail(ctx, PA_ERR_ARGUMENT,
                         "cu_seqlens_q: sequence %d has %lld queries, more than 2^30 (PA_MAX_SEQLEN)", b,
                         (long long)len);
        sq[b] = (int32_t)len;
        qs[b] = h_cu[b];
        ls[b] = h_cu[b];
        if (len > max_q) max_q = (int32_t)len;
    }
    if (st == PA_OK && h_cu[B] != pb.total_q)
        st = pa_fail(ctx, PA_ERR_ARGUMENT,
                     "cu_seqlens_q: last entry is %d, but q has %lld rows (total_q)", h_cu[B],
                     (long long)pb.total_q);
    if (st == PA_OK && p->max_seqlen_q != 0 && p->max_seqlen_q < max_q)
        st = pa_fail(ctx, PA_ERR_ARGUMENT,
                     "max_seqlen_q: %d is less than the longest sequence's %d queries",
                     p->max_seqlen_q, max_q);
    if (st == PA_OK) {
        pb.max_seqlen_q = max_q;
        pb.h_seqlen_q = sq;
        pb.h_q_start = qs;
        pb.h_lse_start = ls;
        st = build_problem(ctx, p, true, pb.total_q > 0, csr_rows, &pb, &s);
        if (st == PA_OK) st = check_last_page_len(ctx, p, &pb);
        if (st == PA_OK && pb.total_q > 0) st = run(ctx, p, &pb);
    }
    scratch_free(&s);
    return st;
}

pa_status pa_attention_flagged(pa_context *ctx, const pa_attention_params *p, bool varlen, const pa_call_flags *f) {
    pa_context local;
    if (!ctx) { /* the message has nowhere to go, but the status still says it */
        memset(&local, 0, sizeof local);
        ctx = &local;
    }
    const pa_call_flags was = ctx->flags;
    ctx->flags = *f;
    pa_status st = varlen ? pa_attention_varlen(ctx, p) : pa_attention_with_kvcache(ctx, p);
    ctx->flags = was;
    if (ctx == &local) free(local.bt.valid);
    return st;
}

pa_status pa_attention_check(pa_context *ctx, const pa_attention_params *p, bool varlen) {
    const pa_call_flags f = {.check_only = true};
    return pa_attention_flagged(ctx, p, varlen, &f);
}
