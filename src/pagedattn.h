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
 *
 * The block between PA_API_BEGIN and PA_API_END is read verbatim by the Lua
 * bindings (ffi.cdef): keep it free of preprocessor lines and macros.
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
    PA_I32 = 3
} pa_dtype;

typedef enum pa_device_kind {
    PA_DEVICE_CPU = 0,
    PA_DEVICE_CUDA = 1
} pa_device_kind;

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
 * first usable CUDA device, else the CPU. Release with pa_device_release. */
pa_status pa_device_open(pa_context *ctx, const char *name, pa_device **out);
void pa_device_release(pa_device *dev);
pa_device_kind pa_device_get_kind(const pa_device *dev);
int pa_device_index(const pa_device *dev);
const char *pa_device_name(const pa_device *dev);        /* "cpu", "cuda:0" */
const char *pa_device_description(const pa_device *dev); /* model, cores/SMs */
int pa_device_num_threads(const pa_device *dev);         /* CPU worker count */
pa_status pa_device_synchronize(pa_context *ctx, pa_device *dev);

/* Ceilings measured on the device now (they take a fraction of a second):
 * the rate of a streaming read over a buffer much larger than the caches, a
 * device-to-device copy counted as read + write bytes, and the arithmetic peak
 * (fp32 FMA on the CPU, a bf16 matrix product on a GPU). 0 = not measured. */
typedef struct pa_ceilings {
    double read_gbps;
    double copy_gbps;
    double fma_gflops;    /* fp32, 2 flops per FMA */
    double matmul_gflops; /* bf16 tensor-core matmul (GPU) */
    double seconds;       /* how long each measurement ran */
} pa_ceilings;
pa_status pa_device_measure_ceilings(pa_context *ctx, pa_device *dev,
                                     double seconds, pa_ceilings *out);

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
/* Host pointer for CPU tensors, device address for CUDA tensors. */
void *pa_tensor_data(const pa_tensor *t);

/* Copies of `count` elements starting at element `offset`, in the tensor's own
 * dtype (src/dst hold count * pa_dtype_size bytes on the host). */
pa_status pa_tensor_write(pa_context *ctx, pa_tensor *t, int64_t offset,
                          const void *src, int64_t count);
pa_status pa_tensor_read(pa_context *ctx, const pa_tensor *t, int64_t offset,
                         void *dst, int64_t count);
/* Copies converting from/to double (round to nearest even into f16/bf16/f32;
 * i32 values must be integers in range). */
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
 * Optional tensors are NULL when absent. Zero-initialise the struct and set
 * what you need (pa_attention_params_init does that with the defaults). */
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
    float softmax_scale;      /* 0 = head_dim^-0.5 */
    float softcap;            /* 0 = off */
} pa_attention_params;

void pa_attention_params_init(pa_attention_params *p);
pa_status pa_attention_with_kvcache(pa_context *ctx, const pa_attention_params *p);
pa_status pa_attention_varlen(pa_context *ctx, const pa_attention_params *p);

/* ---- ABI self-check (the Lua bindings compare these with ffi.sizeof and
 * ffi.offsetof): the size of a public struct by name, or the offset of one
 * of its fields; -1 if unknown. ---- */
int64_t pa_abi_sizeof(const char *type_name);
int64_t pa_abi_offsetof(const char *type_name, const char *field_name);

/* PA_API_END */

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_H */
