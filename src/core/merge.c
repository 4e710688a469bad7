/*
 * merge.c -- merging partial attention results by their log-sum-exp
 * (pa_merge_states: validation, then the backend's merge op, all states in
 * one pass so that nothing is rounded to the dtype before the end), and the
 * two entry points the cascade uses on validated problems (merge with row
 * maps, copying and rotating rows of q).
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

void pa_merge_params_init(pa_merge_params *p) {
    if (p) memset(p, 0, sizeof *p);
}

#define TRY(expr)                     \
    do {                              \
        pa_status st_ = (expr);       \
        if (st_ != PA_OK) return st_; \
    } while (0)

static bool is_float(pa_dtype d) { return d == PA_F32 || d == PA_F16 || d == PA_BF16; }

/* "[2, 3, 4]" of dims, n of them */
static const char *dims_str(const int64_t *dims, int n, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && k < len; i++) k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

static pa_status same_shape(pa_context *ctx, const char *name, const pa_tensor *t, const int64_t *dims, int ndim,
                            const char *layout) {
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == dims[i];
    if (ok) return PA_OK;
    char want[160], got[160];
    return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: expected shape %s %s, got %s", name, dims_str(dims, ndim, want, sizeof want),
                   layout, pa_shape_str(t, got, sizeof got));
}

pa_status pa_merge_run(pa_context *ctx, const pa_merge_problem *p) {
    if (p->rows == 0) return PA_OK;
    if (!p->dev->ops->merge)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "merge_states: the %s backend cannot merge states", p->dev->ops->name);
    return p->dev->ops->merge(ctx, p);
}

pa_status pa_gather_rows_run(pa_context *ctx, const pa_rows_problem *p) {
    if (p->rows == 0) return PA_OK;
    if (!p->dev->ops->gather_rows)
        return pa_fail(ctx, PA_ERR_UNSUPPORTED, "attention: the %s backend cannot copy rows of q", p->dev->ops->name);
    return p->dev->ops->gather_rows(ctx, p);
}

pa_status pa_merge_states(pa_context *ctx, const pa_merge_params *p) {
    if (!p) return pa_fail(ctx, PA_ERR_ARGUMENT, "params: NULL");
    const int32_t S = p->num_states;
    if (S < 1 || S > PA_MERGE_MAX_STATES)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "num_states: %d, expected 1 to %d", S, PA_MERGE_MAX_STATES);
    if (!p->o) return pa_fail(ctx, PA_ERR_ARGUMENT, "o: NULL (num_states tensors expected)");
    if (!p->lse) return pa_fail(ctx, PA_ERR_ARGUMENT, "lse: NULL (num_states tensors expected)");
    for (int32_t s = 0; s < S; s++) {
        if (!p->o[s]) return pa_fail(ctx, PA_ERR_ARGUMENT, "o[%d]: missing", s);
        if (!p->lse[s]) return pa_fail(ctx, PA_ERR_ARGUMENT, "lse[%d]: missing", s);
    }
    const pa_tensor *o0 = p->o[0];
    pa_device *dev = o0->dev;
    char got[160];
    if (o0->ndim != 3 && o0->ndim != 4)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "o[0]: expected [T, H, D] or [B, Sq, H, D], got shape %s",
                       pa_shape_str(o0, got, sizeof got));
    if (!is_float(o0->dtype))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "o[0]: dtype %s, expected f32, f16 or bf16", pa_dtype_name(o0->dtype));
    const bool varlen = o0->ndim == 3;
    const char *o_layout = varlen ? "[T, H, D]" : "[B, Sq, H, D]";
    const char *lse_layout = varlen ? "[H, T]" : "[B, H, Sq]";
    const int64_t H = o0->shape[o0->ndim - 2], D = o0->shape[o0->ndim - 1];
    if (D < 1 || D > PA_MAX_HEAD_DIM)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "o[0]: head dim %lld is not in [1, %d]", (long long)D, PA_MAX_HEAD_DIM);
    if (H > INT32_MAX) return pa_fail(ctx, PA_ERR_ARGUMENT, "o[0]: %lld heads is too many", (long long)H);
    int64_t lse_dims[3];
    int lse_ndim;
    int64_t rows, lse_seq;
    if (varlen) {
        rows = o0->shape[0];
        lse_seq = rows;
        lse_dims[0] = H;
        lse_dims[1] = rows;
        lse_ndim = 2;
    } else {
        rows = o0->shape[0] * o0->shape[1];
        lse_seq = o0->shape[1];
        lse_dims[0] = o0->shape[0];
        lse_dims[1] = H;
        lse_dims[2] = o0->shape[1];
        lse_ndim = 3;
    }
    for (int32_t s = 0; s < S; s++) {
        char name[32];
        snprintf(name, sizeof name, "o[%d]", s);
        const pa_tensor *o = p->o[s], *l = p->lse[s];
        if (o->dev != dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: on device %s, but o[0] is on %s", name, o->dev->name, dev->name);
        TRY(same_shape(ctx, name, o, o0->shape, o0->ndim, o_layout));
        if (o->dtype != o0->dtype)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: dtype %s, but o[0] is %s", name, pa_dtype_name(o->dtype),
                           pa_dtype_name(o0->dtype));
        snprintf(name, sizeof name, "lse[%d]", s);
        if (l->dev != dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: on device %s, but o[0] is on %s", name, l->dev->name, dev->name);
        if (l->dtype != PA_F32) return pa_fail(ctx, PA_ERR_ARGUMENT, "%s: dtype %s, expected f32", name, pa_dtype_name(l->dtype));
        TRY(same_shape(ctx, name, l, lse_dims, lse_ndim, lse_layout));
    }
    pa_tensor *out = p->out, *out_lse = p->out_lse;
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: missing");
    if (out->dev != dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: on device %s, but o[0] is on %s", out->dev->name, dev->name);
    TRY(same_shape(ctx, "out", out, o0->shape, o0->ndim, o_layout));
    if (out->dtype != o0->dtype)
        return pa_fail(ctx, PA_ERR_ARGUMENT, "out: dtype %s, but o[0] is %s", pa_dtype_name(out->dtype), pa_dtype_name(o0->dtype));
    if (out_lse) {
        if (out_lse->dev != dev)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "out_lse: on device %s, but o[0] is on %s", out_lse->dev->name, dev->name);
        if (out_lse->dtype != PA_F32)
            return pa_fail(ctx, PA_ERR_ARGUMENT, "out_lse: dtype %s, expected f32", pa_dtype_name(out_lse->dtype));
        TRY(same_shape(ctx, "out_lse", out_lse, lse_dims, lse_ndim, lse_layout));
    }

    pa_merge_problem mp;
    memset(&mp, 0, sizeof mp);
    mp.dev = dev;
    mp.dtype = mp.state_dtype = o0->dtype;
    mp.num_states = S;
    mp.heads = (int32_t)H;
    mp.head_dim = (int32_t)D;
    mp.rows = rows;
    for (int32_t s = 0; s < S; s++) {
        mp.states[s].o = p->o[s]->data;
        mp.states[s].lse = p->lse[s]->data;
        mp.states[s].lse_seq = lse_seq;
    }
    mp.out = out->data;
    mp.out_lse = out_lse ? out_lse->data : NULL;
    mp.out_lse_seq = lse_seq;
    pa_mirror_invalidate(out);
    if (out_lse) pa_mirror_invalidate(out_lse);
    return pa_merge_run(ctx, &mp);
}
