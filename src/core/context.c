/* context.c -- error state, status strings, version, small helpers. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

const char *pa_version(void) { return "0.1.0"; }

double pa_clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *pa_status_str(pa_status status) {
    switch (status) {
    case PA_OK: return "ok";
    case PA_ERR_ARGUMENT: return "invalid argument";
    case PA_ERR_OUT_OF_MEMORY: return "out of memory";
    case PA_ERR_OUT_OF_PAGES: return "out of pages";
    case PA_ERR_UNSUPPORTED: return "unsupported";
    case PA_ERR_DEVICE: return "device error";
    case PA_ERR_COMPILE: return "kernel compilation failed";
    case PA_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

pa_status pa_context_create(pa_context **out) {
    if (!out) return PA_ERR_ARGUMENT;
    *out = calloc(1, sizeof(pa_context));
    return *out ? PA_OK : PA_ERR_OUT_OF_MEMORY;
}

void pa_context_destroy(pa_context *ctx) {
    if (ctx) free(ctx->bt.valid);
    free(ctx);
}

const char *pa_context_error(const pa_context *ctx) { return ctx ? ctx->message : ""; }

pa_status pa_context_status(const pa_context *ctx) { return ctx ? ctx->status : PA_OK; }

void pa_context_clear(pa_context *ctx) {
    if (!ctx) return;
    ctx->status = PA_OK;
    ctx->message[0] = '\0';
}

pa_status pa_fail(pa_context *ctx, pa_status status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->message, sizeof ctx->message, fmt, ap);
        va_end(ap);
        ctx->status = status;
    }
    return status;
}

pa_status pa_fail_prefix(pa_context *ctx, pa_status status, const char *where) {
    if (ctx) {
        char old[PA_ERRMSG_LEN];
        memcpy(old, ctx->message, sizeof old);
        /* a message longer than the buffer is cut at its end: the start names the failure */
        if (snprintf(ctx->message, sizeof ctx->message, "%s: %s", where, old) < 0)
            ctx->message[0] = '\0';
        ctx->status = status;
    }
    return status;
}

const char *pa_shape_str(const pa_tensor *t, char *buf, size_t len) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

