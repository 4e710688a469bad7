/* tensor.c -- dense tensors on a device, and host copies with dtype conversion. */
#include "internal.h"

#include <stdlib.h>

size_t pa_dtype_size(pa_dtype dtype) {
    switch (dtype) {
    case PA_F32: return 4;
    case PA_F16: return 2;
    case PA_BF16: return 2;
    case PA_I32: return 4;
    }
    return 0;
}

const char *pa_dtype_name(pa_dtype dtype) {
    switch (dtype) {
    case PA_F32: return "f32";
    case PA_F16: return "f16";
    case PA_BF16: return "bf16";
    case PA_I32: return "i32";
    }
    return "?";
}

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
    pa_device_release(t->dev);
    free(t);
}

int pa_tensor_ndim(const pa_tensor *t) { return t->ndim; }
int64_t pa_tensor_dim(const pa_tensor *t, int i) { return i >= 0 && i < t->ndim ? t->shape[i] : -1; }
int64_t pa_tensor_numel(const pa_tensor *t) { return t->numel; }
pa_dtype pa_tensor_dtype(const pa_tensor *t) { return t->dtype; }
pa_device *pa_tensor_device(const pa_tensor *t) { return t->dev; }
void *pa_tensor_data(const pa_tensor *t) { return t->data; }

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
    return t->dev->ops->upload(ctx, t->dev, (char *)t->data + offset * es, src, (size_t)count * es);
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
    for (int64_t i = 0; i < count; i++) dst[i] = pa_load_f64(src, t->dtype, i);
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
    return dst->dev->ops->copy(ctx, dst->dev, dst->data, src->data, dst->bytes);
}

pa_status pa_tensor_fill(pa_context *ctx, pa_tensor *t, double value) {
    if (!t) return pa_fail(ctx, PA_ERR_ARGUMENT, "tensor: NULL");
    if (t->dtype == PA_I32 && (!(value >= INT32_MIN && value <= INT32_MAX) || value != floor(value)))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "value: %g is not a 32-bit integer", value);
    if (!t->numel) return PA_OK;
    return t->dev->ops->fill(ctx, t, value);
}

pa_status pa_tensor_fill_randn(pa_context *ctx, pa_tensor *t, uint64_t seed) {
    if (!t) return pa_fail(ctx, PA_ERR_ARGUMENT, "tensor: NULL");
    if (t->dtype == PA_I32) return pa_fail(ctx, PA_ERR_ARGUMENT, "dtype: randn needs a floating-point tensor, got i32");
    if (!t->numel) return PA_OK;
    return t->dev->ops->fill_randn(ctx, t, seed);
}
