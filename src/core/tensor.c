/* tensor.c -- dense tensors on a device, host copies with dtype conversion,
 * and the host mirrors of i32 tensors on devices the host cannot address.
 *
 * Mirrors: attention reads its index tensors (block tables, seqlens,
 * cu_seqlens) on the host to validate and plan; downloading them waits for
 * the device. When the library itself wrote a tensor's contents from host
 * data (pa_tensor_write, from_table, fill, a copy from a mirrored tensor,
 * batch staging), it keeps that data as the tensor's mirror. Every write is
 * queued on the device's one stream in the order of the calls, so the mirror
 * is what the device will hold when the next queued kernel reads it. Any
 * write the library cannot replay on the host (a failed copy, a partial
 * write over unknown contents) clears it, and a tensor whose address was
 * handed out (pa_tensor_data) is never mirrored again: its owner may write it
 * behind our back. */
#include "internal.h"

#include <stdlib.h>

/* Bigger i32 tensors are not mirrored (they are downloaded when read). */
#define PA_MIRROR_MAX_BYTES ((size_t)64 << 20)

pa_status pa_tensor_create(pa_context *ctx, pa_device *dev, pa_dtype dtype, int ndim,
                           const int64_t *shape, pa_tensor **out) {
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "tensor: out is NULL");
    *out = NULL;
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (pa_dtype_size(dtype) == 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "dtype: unknown (%d)", (int)dtype);
    if (ndim < 0 || ndim > PA_MAX_DIMS)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: %d dimensions (0 to %d allowed)", ndim, PA_MAX_DIMS);
    if (ndim > 0 && !shape) return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: NULL");
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: dimension %d is negative (%lld)", i + 1, (long long)shape[i]);
        if (shape[i] > 0 && numel > INT64_MAX / 16 / shape[i])
            return pa_fail(ctx, PA_ERR_ARGUMENT, "shape: too many elements");
        numel *= shape[i];
    }
    pa_tensor *t = calloc(1, sizeof *t);
    if (!t) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "tensor: out of host memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = numel;
    t->bytes = (size_t)numel * pa_dtype_size(dtype);
    if (t->bytes) {
        pa_status st = dev->ops->alloc(ctx, dev, t->bytes, &t->data);
        if (st) {
            free(t);
            return st;
        }
    }
    pa_device_retain(dev);
    t->dev = dev;
    *out = t;
    return PA_OK;
}

void pa_tensor_destroy(pa_tensor *t) {
    if (!t) return;
    if (t->data) t->dev->ops->free(t->dev, t->data);
    if (t->mirror_owned) free(t->mirror);
    pa_device_release(t->dev);
    free(t);
}

int pa_tensor_ndim(const pa_tensor *t) { return t->ndim; }
int64_t pa_tensor_dim(const pa_tensor *t, int i) { return i >= 0 && i < t->ndim ? t->shape[i] : -1; }
int64_t pa_tensor_numel(const pa_tensor *t) { return t->numel; }
pa_dtype pa_tensor_dtype(const pa_tensor *t) { return t->dtype; }
pa_device *pa_tensor_device(const pa_tensor *t) { return t->dev; }
void *pa_tensor_data(const pa_tensor *t) {
    /* the caller may write through the address: from now on only the device
     * knows the contents (tensors are never defined const: the cast is sound) */
    pa_tensor *w = (pa_tensor *)t;
    w->exposed = true;
    w->mirror_valid = false;
    return t->data;
}

/* ---- host mirrors ---- */

/* Small f32 tensors are mirrored too: the per-kv-head scales of fp8 caches,
 * which attention checks on the host at every call. */
#define PA_MIRROR_F32_MAX_BYTES ((size_t)64 << 10)

static bool mirrorable(const pa_tensor *t) {
    const bool kind = t->dtype == PA_I32 || (t->dtype == PA_F32 && t->bytes <= PA_MIRROR_F32_MAX_BYTES);
    return !t->dev->host_accessible && kind && !t->exposed && t->numel > 0;
}

/* The mirror's storage (allocated on first use), or NULL: too big, no memory. */
static int32_t *mirror_buffer(pa_tensor *t) {
    if (!t->mirror) {
        if (t->bytes > PA_MIRROR_MAX_BYTES) return NULL;
        t->mirror = malloc(t->bytes);
        t->mirror_owned = t->mirror != NULL;
    }
    return t->mirror;
}

void pa_mirror_changed(pa_tensor *t) {
    static _Atomic uint64_t stamp;
    t->mirror_gen = atomic_fetch_add(&stamp, 1) + 1;
}

void pa_mirror_invalidate(pa_tensor *t) {
    /* only a valid mirror is written: a tensor that has none (every float
     * tensor but small f32 ones the library wrote) is left untouched, so
     * readers on other threads see no write */
    if (t && t->mirror_valid) t->mirror_valid = false;
}

void pa_mirror_record(pa_tensor *t, int64_t offset, const int32_t *src, int64_t count,
                      pa_status st) {
    if (!t || t->dev->host_accessible) return;
    if (st != PA_OK || !mirrorable(t)) {
        t->mirror_valid = false; /* a failed write may have written part of it */
        return;
    }
    if (count <= 0) return;
    const bool whole = offset == 0 && count == t->numel;
    if (!whole && !t->mirror_valid) return; /* the rest is unknown: stays invalid */
    int32_t *m = mirror_buffer(t);
    if (!m) {
        t->mirror_valid = false;
        return;
    }
    memcpy(m + offset, src, (size_t)count * sizeof(int32_t));
    t->mirror_valid = true;
    pa_mirror_changed(t);
}

const int32_t *pa_mirror_get(const pa_tensor *t) {
    if (!t || t->dev->host_accessible || !t->mirror_valid || t->exposed) return NULL;
    return t->mirror;
}

/* value: the element's bits (an i32, or an f32's pattern) */
static void mirror_fill(pa_tensor *t, int32_t value, pa_status st) {
    if (t->dev->host_accessible) return;
    int32_t *m = st == PA_OK && mirrorable(t) ? mirror_buffer(t) : NULL;
    if (!m) {
        t->mirror_valid = false;
        return;
    }
    for (int64_t i = 0; i < t->numel; i++) m[i] = value;
    t->mirror_valid = true;
    pa_mirror_changed(t);
}

static pa_status check_range(pa_context *ctx, const pa_tensor *t, int64_t offset, int64_t count,
                             const void *buf) {
    if (!t) return pa_fail(ctx, PA_ERR_ARGUMENT, "tensor: NULL");
    if (offset < 0 || count < 0 || offset > t->numel || count > t->numel - offset)
        return pa_fail(ctx, PA_ERR_ARGUMENT,
                       "range: elements [%lld, %lld) are outside the tensor's %lld elements",
                       (long long)offset, (long long)(offset + count), (long long)t->numel);
    if (count > 0 && !buf) return pa_fail(ctx, PA_ERR_ARGUMENT, "buffer: NULL");
    return PA_OK;
}

pa_status pa_tensor_write(pa_context *ctx, pa_tensor *t, int64_t offset, const void *src,
                          int64_t count) {
    pa_status st = check_range(ctx, t, offset, count, src);
    if (st || count == 0) return st;
    size_t es = pa_dtype_size(t->dtype);
    st = t->dev->ops->upload(ctx, t->dev, (char *)t->data + offset * es, src, (size_t)count * es);
    pa_mirror_record(t, offset, src, count, st); /* src holds i32 when t does */
    return st;
}

pa_status pa_tensor_read(pa_context *ctx, const pa_tensor *t, int64_t offset, void *dst,
                         int64_t count) {
    pa_status st = check_range(ctx, t, offset, count, dst);
    if (st || count == 0) return st;
    size_t es = pa_dtype_size(t->dtype);
    return t->dev->ops->download(ctx, t->dev, dst, (const char *)t->data + offset * es,
                                 (size_t)count * es);
}

pa_status pa_tensor_write_f64(pa_context *ctx, pa_tensor *t, int64_t offset, const double *src,
                              int64_t count) {
    pa_status st = check_range(ctx, t, offset, count, src);
    if (st || count == 0) return st;
    size_t es = pa_dtype_size(t->dtype);
    if (t->dtype == PA_I32) {
        for (int64_t i = 0; i < count; i++) {
            double v = src[i];
            if (!(v >= INT32_MIN && v <= INT32_MAX) || v != floor(v))
                return pa_fail(ctx, PA_ERR_ARGUMENT,
                               "values: element %lld (%g) is not a 32-bit integer",
                               (long long)(offset + i + 1), v);
        }
    }
    /* convert on the host into a staging buffer (the tensor may live on a GPU) */
    void *tmp = t->dev->host_accessible ? (char *)t->data + offset * es : malloc((size_t)count * es);
    if (!tmp) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "tensor: out of host memory");
    for (int64_t i = 0; i < count; i++) pa_store_f64(tmp, t->dtype, i, src[i]);
    if (!t->dev->host_accessible) {
        st = t->dev->ops->upload(ctx, t->dev, (char *)t->data + offset * es, tmp, (size_t)count * es);
        pa_mirror_record(t, offset, tmp, count, st); /* tmp holds i32 when t does */
        free(tmp);
    }
    return st;
}

pa_status pa_tensor_read_f64(pa_context *ctx, const pa_tensor *t, int64_t offset, double *dst,
                             int64_t count) {
    pa_status st = check_range(ctx, t, offset, count, dst);
    if (st || count == 0) return st;
    size_t es = pa_dtype_size(t->dtype);
    const void *src = (const char *)t->data + offset * es;
    void *tmp = NULL;
    if (!t->dev->host_accessible) {
        tmp = malloc((size_t)count * es);
        if (!tmp) return pa_fail(ctx, PA_ERR_OUT_OF_MEMORY, "tensor: out of host memory");
        st = t->dev->ops->download(ctx, t->dev, tmp, src, (size_t)count * es);
        if (st) {
            free(tmp);
            return st;
        }
        src = tmp;
    }
    for (int64_t i = 0; i < count; i++) {
        const double v = pa_load_f64(src, t->dtype, i);
        /* one NaN for every NaN: LuaJIT reads some NaN payloads (a negative
         * one with high mantissa bits, as an e5m2 NaN widens to) as tags */
        dst[i] = v == v ? v : (double)NAN;
    }
    free(tmp);
    return PA_OK;
}

pa_status pa_tensor_copy(pa_context *ctx, pa_tensor *dst, const pa_tensor *src) {
    if (!dst) return pa_fail(ctx, PA_ERR_ARGUMENT, "dst: NULL");
    if (!src) return pa_fail(ctx, PA_ERR_ARGUMENT, "src: NULL");
    if (dst->dev != src->dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "src: on %s, dst on %s", src->dev->name, dst->dev->name);
    if (dst->dtype != src->dtype)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "src: dtype %s, dst has %s", pa_dtype_name(src->dtype), pa_dtype_name(dst->dtype));
    if (dst->numel != src->numel)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "src: %lld elements, dst has %lld", (long long)src->numel, (long long)dst->numel);
    if (!dst->bytes || dst == src) return PA_OK;
    pa_status st = dst->dev->ops->copy(ctx, dst->dev, dst->data, src->data, dst->bytes);
    /* dst now holds what src holds at this point of the stream: src's mirror
     * when it has a valid one (same dtype and size), else unknown */
    const int32_t *m = pa_mirror_get(src);
    if (m) pa_mirror_record(dst, 0, m, dst->numel, st);
    else pa_mirror_invalidate(dst);
    return st;
}

pa_status pa_tensor_fill(pa_context *ctx, pa_tensor *t, double value) {
    if (!t) return pa_fail(ctx, PA_ERR_ARGUMENT, "tensor: NULL");
    if (t->dtype == PA_I32 && (!(value >= INT32_MIN && value <= INT32_MAX) || value != floor(value)))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "value: %g is not a 32-bit integer", value);
    if (!t->numel) return PA_OK;
    pa_status st = t->dev->ops->fill(ctx, t, value);
    int32_t bits = 0;
    if (t->dtype == PA_I32) bits = (int32_t)value;
    else if (t->dtype == PA_F32) pa_store_f64(&bits, PA_F32, 0, value);
    mirror_fill(t, bits, st);
    return st;
}

pa_status pa_tensor_fill_randn(pa_context *ctx, pa_tensor *t, uint64_t seed) {
    if (!t) return pa_fail(ctx, PA_ERR_ARGUMENT, "tensor: NULL");
    if (t->dtype == PA_I32) return pa_fail(ctx, PA_ERR_ARGUMENT, "dtype: randn needs a floating-point tensor, got i32");
    if (!t->numel) return PA_OK;
    pa_status st = t->dev->ops->fill_randn(ctx, t, seed);
    pa_mirror_invalidate(t); /* (never i32: nothing was mirrored) */
    return st;
}
