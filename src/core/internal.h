/*
 * internal.h -- what the core and the backends share and users never see:
 * the handle structs, the backend vtable, the normalised attention problem,
 * error helpers and scalar dtype conversions.
 */
#ifndef PA_INTERNAL_H
#define PA_INTERNAL_H

#include "../pagedattn.h"
#include "../pagedattn_lab.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define PA_MAX_DIMS 8
#define PA_MAX_HEAD_DIM 256
#define PA_ERRMSG_LEN 4096

/* The rows' checked page ids of the last mirrored block table attention
 * validated on this context (attention.c): the table, its mirror_gen, the
 * pool size checked against, and per row how many leading entries lie in
 * the pool. Calls that reuse the table (every layer of a step) then check
 * each sequence's page count against it instead of reading the table. */
typedef struct pa_bt_checked {
    const pa_tensor *table;
    uint64_t gen;
    int64_t num_pages, rows, cols;
    int64_t *valid; /* rows entries (malloc) */
    int64_t cap;
} pa_bt_checked;

/* How the core makes an attention call (pa_attention_flagged). */
typedef struct pa_call_flags {
    bool check_only; /* validate and return (pa_attention_check) */
    /* out in f32 whatever q's dtype: the cascade's two levels, which its
     * merge then rounds once (cascade.c) */
    bool out_f32;
    /* the backend's queue: 0, or 1, which runs beside 0 from a lane_fork
     * to a lane_join (the cascade's shared level beside its suffix level) */
    int lane;
} pa_call_flags;

struct pa_context {
    pa_status status;
    char message[PA_ERRMSG_LEN];
    pa_bt_checked bt; /* one thread uses a context at a time (pagedattn.h) */
    pa_call_flags flags; /* of the attention call in progress (pa_attention_flagged) */
};

/* Records a failure on ctx (may be NULL) and returns status, so that callers
 * can write `return pa_fail(ctx, PA_ERR_ARGUMENT, "q: ...")`. */
pa_status pa_fail(pa_context *ctx, pa_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefixes the message already on ctx ("where: old message"). */
pa_status pa_fail_prefix(pa_context *ctx, pa_status status, const char *where);

typedef struct pa_attn_problem pa_attn_problem;
typedef struct pa_merge_problem pa_merge_problem;
typedef struct pa_rows_problem pa_rows_problem;

/* A backend: one implementation of this table per kind of device.
 * Memory returned by alloc is zero-filled. */
typedef struct pa_backend_ops {
    const char *name;
    pa_status (*alloc)(pa_context *ctx, pa_device *dev, size_t bytes, void **out);
    void (*free)(pa_device *dev, void *ptr);
    pa_status (*upload)(pa_context *ctx, pa_device *dev, void *dst, const void *src,
                        size_t bytes);
    pa_status (*download)(pa_context *ctx, pa_device *dev, void *dst, const void *src,
                          size_t bytes);
    pa_status (*copy)(pa_context *ctx, pa_device *dev, void *dst, const void *src,
                      size_t bytes);
    pa_status (*fill)(pa_context *ctx, pa_tensor *t, double value);
    pa_status (*fill_randn)(pa_context *ctx, pa_tensor *t, uint64_t seed);
    pa_status (*attention)(pa_context *ctx, const pa_attn_problem *p);
    pa_status (*synchronize)(pa_context *ctx, pa_device *dev);
    pa_status (*measure_ceilings)(pa_context *ctx, pa_device *dev, double seconds,
                                  pa_ceilings *out);
    void (*destroy)(pa_device *dev);
    /* maybe (NULL: the device cannot): device-side timing of attention calls */
    pa_status (*timing)(pa_context *ctx, pa_device *dev, int on);
    pa_status (*timing_last)(pa_context *ctx, pa_device *dev, double *seconds);
    /* maybe: the tuning of the device's kernel choice (pagedattn_lab.h: the
     * CUDA backend's), its setting (checked first; a failure changes
     * nothing), and what the last attention call launched */
    pa_status (*get_tuning)(pa_context *ctx, pa_device *dev, pa_cuda_tuning *out, int defaults);
    pa_status (*set_tuning)(pa_context *ctx, pa_device *dev, const pa_cuda_tuning *t);
    pa_status (*last_plan)(pa_context *ctx, pa_device *dev, char *out, size_t len);
    /* maybe (NULL: PA_ERR_UNSUPPORTED): merging attention states by their
     * log-sum-exp, and copying (and rotating) rows of q (merge.c) */
    pa_status (*merge)(pa_context *ctx, const pa_merge_problem *p);
    pa_status (*gather_rows)(pa_context *ctx, const pa_rows_problem *p);
    /* maybe (NULL: one queue, pa_attn_problem.lane ignored): attention calls
     * on lane 1 queue beside lane 0's; lane_fork makes lane 1 wait for what
     * lane 0 has queued so far, lane_join makes lane 0 wait for what lane 1
     * has. Every fork is joined before the public call returns. */
    pa_status (*lane_fork)(pa_context *ctx, pa_device *dev);
    pa_status (*lane_join)(pa_context *ctx, pa_device *dev);
} pa_backend_ops;

/* A backend as the core sees it. The registry (src/backends.c) lists them in
 * order of preference; the core finds devices, the default device and a
 * backend's extras through it and never names a backend. */
typedef struct pa_backend_reg {
    const char *name; /* what a device name starts with: "cpu", "cuda" */
    const char *names; /* the names it takes, for messages: "\"cuda\" or \"cuda:N\"" */
    int max_devices;  /* device indices 0 .. max_devices - 1 */
    /* The index that the rest of a name after `name` ("", ":1", ...) asks
     * for, or -1 when it is not this backend's. */
    int (*parse)(const char *rest);
    /* Whether it may serve as the default device (else *why says why not). */
    bool (*usable)(char *why, size_t why_len);
    pa_status (*create)(pa_context *ctx, int index, pa_device **out);
    /* An extra of the backend as a whole (not of one device), by name
     * ("kernel_catalog_size", ...), or NULL: as ggml's get_proc_address. */
    void *(*proc)(const char *name);
} pa_backend_reg;

/* NULL-terminated, by preference: the default device is the first usable. */
extern const pa_backend_reg *const pa_backends[];
/* The first backend offering extra `name`, or NULL. */
void *pa_backend_proc(const char *name);

struct pa_device {
    atomic_int refcount;
    pa_device_kind kind;
    int index;
    bool host_accessible; /* tensor data can be read by the host directly */
    char name[32];
    char description[256];
    int num_threads;
    const pa_backend_ops *ops;
    void *impl;
    int backend; /* its entry in pa_backends (set by the registry) */
    atomic_llong setup_ns; /* pa_device_setup_seconds: backends add to it */
};

void pa_device_retain(pa_device *dev);

struct pa_tensor {
    pa_device *dev; /* holds a reference */
    pa_dtype dtype;
    int ndim;
    int64_t shape[PA_MAX_DIMS];
    int64_t numel;
    size_t bytes;
    void *data;
    /* Host mirror (i32 and small f32 tensors on devices the host cannot
     * address; tensor.c):
     * a host copy of the contents, so that attention validates and plans
     * from it instead of downloading (which waits for the device). Valid only
     * while every write since it was taken was made by the library from host
     * data it saw; any other write clears mirror_valid. */
    int32_t *mirror;   /* maybe */
    bool mirror_owned; /* freed with the tensor (batch views borrow the batch's) */
    bool mirror_valid;
    uint64_t mirror_gen; /* a process-wide stamp, renewed whenever the mirror
                            becomes valid or changes while valid (pa_mirror_changed):
                            never the same for two contents of a valid mirror */
    bool exposed;      /* its address was handed out (pa_tensor_data): writes the
                          library cannot see may happen, so it is never mirrored */
};

/* ---- host mirrors (tensor.c) ----
 * Every path that writes tensor memory must call one of these after writing:
 * pa_mirror_record when it wrote elements [offset, offset + count) from the
 * host i32 values src (st: how the write went), pa_mirror_invalidate
 * otherwise. No-ops on host-accessible devices and for other dtypes. */
void pa_mirror_record(pa_tensor *t, int64_t offset, const int32_t *src, int64_t count,
                      pa_status st);
void pa_mirror_invalidate(pa_tensor *t);
/* Called by every path that makes a mirror valid or changes a valid one
 * (pa_mirror_record, fills, batch staging): renews t->mirror_gen. Whatever
 * is kept for a mirror's contents (attention.c's block-table check) is used
 * only while it is valid, so invalidating needs no new stamp. */
void pa_mirror_changed(pa_tensor *t);
/* The valid mirror of t, or NULL (then read the device). */
const int32_t *pa_mirror_get(const pa_tensor *t);

/* ---- the normalised attention problem -------------------------------------
 * Both public forms (with_kvcache, varlen) are validated by the core and turned
 * into this one description; backends implement only this.
 *
 * Layouts (elements, 64-bit offsets; all tensors dense):
 *   q, out:  row r = q_start[b] + i (i < seqlen_q[b]); offset r*H*D + h*D + d
 *   k, v:    new row r = new_start_row[b] + i (i < num_new[b]); offset r*Hk*D + hk*D + d
 *   caches:  [num_pages, page_size, Hk, D]; token t of sequence b lives in page
 *            page_of(b, t) at slot t % page_size, where page_of is
 *            block_table[b * bt_stride + t / page_size] when paged, and
 *            (cache_batch_idx ? cache_batch_idx[b] : b) for a contiguous cache,
 *            which is the same thing with page_size = S_cache.
 *   lse:     lse_start[b] + h * lse_head_stride + i
 * The new tokens of sequence b go to key positions
 *   append_pos[b] .. append_pos[b] + num_new[b] - 1, and seqlen_k[b] counts them.
 * Rotary position of query i: append_pos[b] + (rope_q_step ? i : 0).
 * Device pointers (used by kernels) live next to host copies (h_...) of the
 * small index arrays, which the core always provides. */
struct pa_attn_problem {
    pa_device *dev;
    pa_dtype dtype;
    bool varlen;
    int32_t batch, heads, kv_heads, group, head_dim;
    int64_t total_q;
    int32_t max_seqlen_q, max_seqlen_k;

    const void *q;
    void *out;
    pa_dtype out_dtype; /* dtype, or f32 (the cascade's levels: pa_call_flags.out_f32) */
    int lane;           /* the backend's queue (pa_call_flags.lane) */
    float *lse; /* maybe */
    int64_t lse_head_stride;

    void *k_cache, *v_cache;
    int64_t num_pages;
    int32_t page_size;
    bool paged;
    const int32_t *block_table; /* device pointer, maybe */
    int64_t bt_stride;
    const int32_t *cache_batch_idx; /* device pointer, maybe */

    const void *k_new, *v_new; /* maybe */
    const void *rotary_cos, *rotary_sin; /* maybe */
    pa_dtype rotary_dtype;
    int32_t rotary_dim;
    int64_t seqlen_ro;
    bool rotary_interleaved;
    bool rope_q_step;

    const float *alibi; /* maybe */
    int64_t alibi_batch_stride;

    float scale, softcap;
    bool causal;
    int32_t window_left, window_right; /* -1: unbounded; causal => right = 0 */
    int32_t num_splits;

    /* host arrays, length batch (owned by the core for the call) */
    const int32_t *h_seqlen_q, *h_seqlen_k, *h_num_new, *h_append_pos;
    const int64_t *h_q_start, *h_new_start_row, *h_lse_start;
    const int32_t *h_block_table;     /* maybe: host copy of block_table */
    const int32_t *h_cache_batch_idx; /* maybe */
    int64_t total_new;

    /* The caches' dtype: dtype, or an fp8 one (pa_dtype_is_fp8), whose
     * caches hold x / scale: a key is k_cache * k_scale of its kv head, a
     * value v_cache * v_scale, and an append stores the rotated k / k_scale
     * (v / v_scale) rounded to nearest even, saturating. Scales are 1 for
     * other caches. k_scales / v_scales (maybe; device pointers, f32
     * [kv_heads]): per kv head, else every head has k_scale / v_scale; the
     * host copies h_k_scales / h_v_scales ([kv_heads]) are always there. */
    pa_dtype cache_dtype;
    float k_scale, v_scale;
    const float *k_scales, *v_scales;
    const float *h_k_scales, *h_v_scales;
};

/* ---- merging attention states (merge.c) ------------------------------------
 * Item r of `rows` (a query token), head h: output row out_rows[r]
 * (out_rows NULL: r); from each state s its row rows_s[r] (rows_s NULL: r;
 * negative: the state is empty there), whose o is at offset
 * (row * heads + h) * head_dim and lse at
 *   (row / lse_seq) * heads * lse_seq + h * lse_seq + row % lse_seq
 * (lse_seq = T for [H, T], Sq for [B, H, Sq]); out and out_lse alike. out
 * may be the o of a state whose row is the output row (and out_lse its
 * lse): each (row, head) reads every state before it writes. Pointers are
 * the device's. */
#define PA_MERGE_MAX_STATES 32 /* pa_merge_states' num_states (pagedattn.h) */

typedef struct pa_merge_state {
    const void *o;
    const float *lse;
    int64_t lse_seq;
    const int32_t *rows; /* maybe */
} pa_merge_state;

struct pa_merge_problem {
    pa_device *dev;
    pa_dtype dtype;       /* out's */
    pa_dtype state_dtype; /* the states' o: dtype, or f32 (the cascade's levels) */
    int32_t num_states; /* 1 .. PA_MERGE_MAX_STATES */
    int32_t heads, head_dim;
    int64_t rows;
    pa_merge_state states[PA_MERGE_MAX_STATES];
    const int32_t *out_rows; /* maybe */
    void *out;
    float *out_lse; /* maybe */
    int64_t out_lse_seq;
};

/* Rows of q [*, heads, head_dim] copied, and rotated where rotary_cos is
 * given: dst row r = src row s = (row_map ? row_map[r] : r), rotated at
 * position pos[pos_index ? pos_index[s] : s] the way attention rotates q
 * (in double, rounded once to the dtype). The core checks every index and
 * position on the host first. */
struct pa_rows_problem {
    pa_device *dev;
    pa_dtype dtype;
    int32_t heads, head_dim;
    int64_t rows;
    const void *src;
    void *dst;
    const int32_t *row_map; /* maybe */
    const void *rotary_cos, *rotary_sin; /* maybe: [seqlen_ro, rotary_dim / 2] */
    pa_dtype rotary_dtype;
    int32_t rotary_dim;
    bool rotary_interleaved;
    const int32_t *pos;       /* with rotary */
    const int32_t *pos_index; /* maybe */
};

/* Validated entry points for the cascade (merge.c): the backend's op, with
 * PA_ERR_UNSUPPORTED where it has none, and longer merges chained. */
pa_status pa_merge_run(pa_context *ctx, const pa_merge_problem *p);
pa_status pa_gather_rows_run(pa_context *ctx, const pa_rows_problem *p);

/* attention.c: an attention call made with flags f (pa_call_flags; ctx may
 * be NULL, as for the public calls). */
pa_status pa_attention_flagged(pa_context *ctx, const pa_attention_params *p, bool varlen, const pa_call_flags *f);
pa_status pa_attention_check(pa_context *ctx, const pa_attention_params *p, bool varlen);

/* Key range that query i of a sequence may attend: [*lo, *hi). */
static inline void pa_mask_range(const pa_attn_problem *p, int32_t seqlen_q,
                                 int32_t seqlen_k, int32_t i, int32_t *lo, int32_t *hi) {
    int64_t r = (int64_t)i + seqlen_k - seqlen_q; /* bottom-right aligned diagonal */
    int64_t l = 0, h = seqlen_k;
    if (p->window_left >= 0 && r - p->window_left > l) l = r - p->window_left;
    if (p->window_right >= 0 && r + p->window_right + 1 < h) h = r + p->window_right + 1;
    if (h < l) h = l;
    if (l > seqlen_k) l = h = seqlen_k;
    if (h < 0) l = h = 0;
    *lo = (int32_t)l;
    *hi = (int32_t)h;
}

/* ---- scalar dtype conversions (round to nearest even) ---- */

static inline float pa_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t pa_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float pa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 5.9604644775390625e-8f;
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t pa_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;           /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;          /* >= 65520: inf */
    if (a < 0x38800000u) {                                /* below 2^-14: subnormal */
        /* a float with exponent -14 lines the f16 subnormal grid up with bit 0 */
        float af;
        memcpy(&af, &a, 4);
        float scaled = af + 0.5f; /* 0.5 = 2^-1: ulp 2^-24 at this exponent */
        uint32_t s;
        memcpy(&s, &scaled, 4);
        return sign | (uint16_t)(s - 0x3f000000u);
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round */
    return sign | (uint16_t)(a >> 13);
}

/* ---- fp8 (e4m3fn and e5m2) ----
 * e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
 * S.1111.111 is NaN, so the largest finite value is 1.75 x 2^8 = 448; the
 * subnormals are m x 2^-9. e5m2: sign, 5 exponent bits (bias 15), 2 mantissa
 * bits, the upper byte of an f16 (infinities, NaNs); largest finite 57344. */

static inline bool pa_dtype_is_fp8(pa_dtype d) { return d == PA_FP8_E4M3 || d == PA_FP8_E5M2; }

static inline float pa_fp8_e4m3_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
    uint32_t u;
    if (e == 15 && m == 7) {
        u = sign | 0x7fc00000u;
    } else if (e == 0) { /* subnormal: m x 2^-9, exact in f32 */
        float f = (float)m * 0.001953125f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign | ((e + 120u) << 23) | (m << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float pa_fp8_e5m2_to_f32(uint8_t b) { return pa_f16_to_f32((uint16_t)(b << 8)); }

/* f rounded to nearest even on the fp8 grid, saturating: |f| at or beyond
 * the largest finite value (infinities included) gives that value with f's
 * sign, NaN gives NaN. Integer arithmetic on the bits, so that the kernels'
 * twin (kernels/common.cuh) is the same code. */
static inline uint8_t pa_f32_to_fp8(float f, pa_dtype dt) {
    const bool e4 = dt == PA_FP8_E4M3;
    const int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;                       /* NaN (e4m3: S.1111.111) */
    if (a >= (e4 ? 0x43e00000u : 0x47600000u)) return sign | (e4 ? 0x7eu : 0x7bu); /* >= 448 / 57344 */
    const int E = a >= 0x00800000u ? (int)(a >> 23) - 127 : -126;  /* f's binade */
    const uint32_t m = (a & 0x7fffffu) | (a >= 0x00800000u ? 0x800000u : 0u); /* f = m 2^(E - 23) */
    int e = E < 1 - bias ? 1 - bias : E;                            /* fp8's (subnormals: the lowest) */
    const int sh = 23 - mbits + (e - E);                            /* f / quantum = m / 2^sh */
    if (sh > 24) return sign;                                       /* below half the smallest subnormal */
    uint32_t n = m >> sh;
    const uint32_t rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (n & 1u))) n++;
    if (n >= (2u << mbits)) { /* rounded up into the next binade (never past the largest: f is below it) */
        n >>= 1;
        e++;
    }
    if (n < (1u << mbits)) return sign | (uint8_t)n; /* subnormal or zero */
    return sign | (uint8_t)(((unsigned)(e + bias) << mbits) | (n - (1u << mbits)));
}

static inline float pa_fp8_to_f32(uint8_t b, pa_dtype dt) {
    return dt == PA_FP8_E4M3 ? pa_fp8_e4m3_to_f32(b) : pa_fp8_e5m2_to_f32(b);
}

static inline double pa_load_f64(const void *base, pa_dtype dt, int64_t i) {
    switch (dt) {
    case PA_F32: return ((const float *)base)[i];
    case PA_F16: return pa_f16_to_f32(((const uint16_t *)base)[i]);
    case PA_BF16: return pa_bf16_to_f32(((const uint16_t *)base)[i]);
    case PA_I32: return ((const int32_t *)base)[i];
    case PA_FP8_E4M3: return pa_fp8_e4m3_to_f32(((const uint8_t *)base)[i]);
    case PA_FP8_E5M2: return pa_fp8_e5m2_to_f32(((const uint8_t *)base)[i]);
    }
    return 0;
}

static inline float pa_load_f32(const void *base, pa_dtype dt, int64_t i) {
    switch (dt) {
    case PA_F32: return ((const float *)base)[i];
    case PA_F16: return pa_f16_to_f32(((const uint16_t *)base)[i]);
    case PA_BF16: return pa_bf16_to_f32(((const uint16_t *)base)[i]);
    case PA_I32: return (float)((const int32_t *)base)[i];
    case PA_FP8_E4M3: return pa_fp8_e4m3_to_f32(((const uint8_t *)base)[i]);
    case PA_FP8_E5M2: return pa_fp8_e5m2_to_f32(((const uint8_t *)base)[i]);
    }
    return 0;
}

static inline void pa_store_f32(void *base, pa_dtype dt, int64_t i, float v) {
    switch (dt) {
    case PA_F32: ((float *)base)[i] = v; break;
    case PA_F16: ((uint16_t *)base)[i] = pa_f32_to_f16(v); break;
    case PA_BF16: ((uint16_t *)base)[i] = pa_f32_to_bf16(v); break;
    case PA_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case PA_FP8_E4M3:
    case PA_FP8_E5M2: ((uint8_t *)base)[i] = pa_f32_to_fp8(v, dt); break;
    }
}

/* double -> float rounded to odd: truncate, and set the last bit if anything was
 * lost. Rounding that float once more to a format with at least two fewer
 * mantissa bits (f16, bf16) is then the correctly rounded result from double. */
static inline float pa_f64_to_f32_odd(double x) {
    float f = (float)x;
    if (!isfinite(f) || (double)f == x) return f;
    if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f); /* toward zero */
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

/* x rounded once to fp8 (nearest even, saturating): through f32 rounded to
 * odd, which keeps the rounding correct (f32 has 20 bits more than fp8). */
static inline uint8_t pa_f64_to_fp8(double x, pa_dtype dt) { return pa_f32_to_fp8(pa_f64_to_f32_odd(x), dt); }

/* The fp8 append, one definition for every backend (the CPU's append, the
 * GPU's 16-byte and staged paths; kernels/common.cuh holds the twins): a
 * kv head's 1 / scale rounded to f32 (FLT_MAX where it overflows: scales
 * below 2^-128); a new value x (k rotated by pa_rotate_f32) stored as
 * pa_f32_to_fp8(fl32(x * inv)). f32 arithmetic, as the GPU converts: one
 * multiply and one conversion an element (the double definition before it
 * held the GPU's append to 0.54 of its read + write rate; docs/fp8.md). */
static inline float pa_fp8_inv_scale(float scale) {
    const float r = 1.0f / scale;
    return r <= FLT_MAX ? r : FLT_MAX;
}
static inline uint8_t pa_fp8_scaled(float x, float inv, pa_dtype dt) {
    const float z = x * inv;
    return pa_f32_to_fp8(z, dt);
}
/* (x0 c - x1 s, x0 s + x1 c) in f32: each x1 product rounded, then one fused
 * multiply-add (fmaf: correctly rounded on every libm) */
static inline void pa_rotate_f32(float x0, float x1, float c, float s, float *y0, float *y1) {
    const float t0 = x1 * s, t1 = x1 * c;
    *y0 = fmaf(x0, c, -t0);
    *y1 = fmaf(x0, s, t1);
}

/* Stores a double into dtype dt with one correct rounding (nearest, ties even). */
static inline void pa_store_f64(void *base, pa_dtype dt, int64_t i, double v) {
    if (dt == PA_F16 || dt == PA_BF16) pa_store_f32(base, dt, i, pa_f64_to_f32_odd(v));
    else if (dt == PA_F32) ((float *)base)[i] = (float)v;
    else if (pa_dtype_is_fp8(dt)) ((uint8_t *)base)[i] = pa_f64_to_fp8(v, dt);
    else ((int32_t *)base)[i] = (int32_t)v;
}

/* ---- Philox-4x32-10 and Box-Muller: the same stream on every backend ----
 * Element i of a randn tensor is normal number (i & 3) of the block with
 * counter (i >> 2). kernels/common.cuh has the device twin; keep them equal. */
typedef struct { uint32_t v[4]; } pa_philox4;

static inline pa_philox4 pa_philox(uint64_t counter, uint64_t key) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    pa_philox4 out = {{c0, c1, c2, c3}};
    return out;
}

/* Four standard normals from one Philox block (two Box-Muller pairs),
 * computed in double so that the CPU values are exactly reproducible. */
static inline void pa_randn4(uint64_t block, uint64_t seed, double out[4]) {
    pa_philox4 r = pa_philox(block, seed);
    const double two_pi = 6.283185307179586476925;
    for (int k = 0; k < 2; k++) {
        /* u1 in (0, 1], u2 in [0, 1) */
        double u1 = ((double)r.v[2 * k] + 1.0) * (1.0 / 4294967296.0);
        double u2 = (double)r.v[2 * k + 1] * (1.0 / 4294967296.0);
        double rad = sqrt(-2.0 * log(u1));
        out[2 * k] = rad * cos(two_pi * u2);
        out[2 * k + 1] = rad * sin(two_pi * u2);
    }
}

/* ---- helpers shared by the core ---- */
const char *pa_shape_str(const pa_tensor *t, char *buf, size_t len);



#endif /* PA_INTERNAL_H */
