/*
 * cuda_blas.c -- the GPU's compute ceiling: a large bf16 matrix product by
 * cuBLAS (bf16 in and out, f32 accumulation, tensor cores), timed with device
 * events on the device's stream. Prefill kernels are judged against it.
 *
 * cuBLAS is opened at run time with dlopen, like the driver and NVRTC
 * (cuda_loader.c), and only for this measurement: nothing links against it,
 * and a machine without it still measures the other ceilings (matmul_gflops
 * stays 0 and matmul_note says why).
 *
 * Two rates: "short" is the best single product after a warm-up (the clocks
 * of a cool GPU), "sustained" is products back to back for `seconds`, rated
 * over the last half of that time (on an H200 the power cap pulls the rate
 * from ~780 to ~670 TFLOP/s). Inputs are random, not zeros: zeros draw less
 * power and would overstate the sustained rate.
 *
 *   PAGEDATTN_CUBLAS=path  opens cuBLAS from there; "off": no matmul ceiling
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The slice of cublas_api.h / library_types.h used here (values of CUDA 12
 * and 13; no cuBLAS headers at build time). cudaStream_t is a CUstream. */
typedef int cublasStatus_t;
typedef struct cublasContext *cublasHandle_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_OP_N = 0,
    CUDA_R_16BF = 14,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
};

typedef struct pa_cublas {
    cublasStatus_t (*cublasCreate_v2)(cublasHandle_t *handle);
    cublasStatus_t (*cublasDestroy_v2)(cublasHandle_t handle);
    cublasStatus_t (*cublasSetStream_v2)(cublasHandle_t handle, CUstream stream);
    cublasStatus_t (*cublasGetVersion_v2)(cublasHandle_t handle, int *version);
    cublasStatus_t (*cublasGemmEx)(cublasHandle_t handle, int transa, int transb, int m, int n, int k,
                                   const void *alpha, const void *A, int Atype, int lda, const void *B,
                                   int Btype, int ldb, const void *beta, void *C, int Ctype, int ldc,
                                   int compute_type, int algo);
    const char *(*cublasGetStatusString)(cublasStatus_t status); /* optional */
} pa_cublas;

static pa_cublas blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static bool blas_ok;
static char blas_why[sizeof ((pa_ceilings *)0)->matmul_note];
static char blas_path[300]; /* what was opened */

#define BLAS(name, required) {#name, (void **)&blas.name, required}

static bool try_cublas(const char *path, char *err, size_t err_len) {
    const pa_sym syms[] = {
        BLAS(cublasCreate_v2, true),     BLAS(cublasDestroy_v2, true),
        BLAS(cublasSetStream_v2, true),  BLAS(cublasGetVersion_v2, true),
        BLAS(cublasGemmEx, true),        BLAS(cublasGetStatusString, false),
    };
    if (!pa_dlopen_syms(path, syms, sizeof syms / sizeof syms[0], err, err_len)) return false;
    snprintf(blas_path, sizeof blas_path, "%s", path);
    return true;
}

static void load_cublas(void) {
    const char *env = getenv("PAGEDATTN_CUBLAS");
    if (env && strcmp(env, "off") == 0) {
        snprintf(blas_why, sizeof blas_why, "not measured: PAGEDATTN_CUBLAS=off");
        return;
    }
    /* libcublas finds its libcublasLt beside itself (RUNPATH $ORIGIN) */
    char why[sizeof blas_why - 16];
    blas_ok = pa_cuda_open_toolkit_lib("PAGEDATTN_CUBLAS", "libcublas", "cuBLAS", try_cublas, why, sizeof why);
    if (!blas_ok) snprintf(blas_why, sizeof blas_why, "not measured: %s", why);
}

static const char *status_str(cublasStatus_t s) {
    const char *str = blas.cublasGetStatusString ? blas.cublasGetStatusString(s) : NULL;
    return str ? str : "cuBLAS error";
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Standard normal bf16 values (util's pa_randn_bf16, as pa_randn does). */
static pa_status fill_random(pa_context *ctx, cuda_impl *impl, CUdeviceptr p, long long n,
                             unsigned long long seed) {
    pa_kmodule *m;
    pa_status st = pa_cuda_module(ctx, impl, "util", &m);
    if (st) return st;
    CUfunction fn;
    st = pa_cuda_function(ctx, impl, m, "pa_randn_bf16", 0, &fn);
    if (st) return st;
    long long grid = ((n + 3) / 4 + 255) / 256;
    if (grid > (long long)impl->sm_count * 64) grid = (long long)impl->sm_count * 64;
    void *args[] = {&p, &n, &seed};
    CU_TRY(ctx, pa_cu.cuLaunchKernel(fn, (unsigned)grid, 1, 1, 256, 1, 1, 0, impl->stream, args, NULL));
    return PA_OK;
}

#define MAX_CHUNKS 128

typedef struct matmul_run {
    cuda_impl *impl;
    cublasHandle_t handle;
    CUdeviceptr a, b, c;
    int n; /* C[n, n] = A[n, n] B[n, n] */
    CUevent ev[MAX_CHUNKS + 1];
    int nev;
} matmul_run;

/* Queues `count` products; a cuBLAS failure is written to note (then 1). */
static int queue_products(matmul_run *r, int count, char *note, size_t note_len) {
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < count; i++) {
        cublasStatus_t s = blas.cublasGemmEx(r->handle, CUBLAS_OP_N, CUBLAS_OP_N, r->n, r->n, r->n, &alpha,
                                             (const void *)(uintptr_t)r->a, CUDA_R_16BF, r->n,
                                             (const void *)(uintptr_t)r->b, CUDA_R_16BF, r->n, &beta,
                                             (void *)(uintptr_t)r->c, CUDA_R_16BF, r->n, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT_TENSOR_OP);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(note, note_len, "not measured: cublasGemmEx (bf16, %d^3) failed: %.100s (%d)", r->n,
                     status_str(s), s);
            return 1;
        }
    }
    return 0;
}

static pa_status elapsed(pa_context *ctx, CUevent a, CUevent b, double *seconds) {
    float ms = 0;
    CU_TRY(ctx, pa_cu.cuEventSynchronize(b));
    CU_TRY(ctx, pa_cu.cuEventElapsedTime(&ms, a, b));
    *seconds = ms * 1e-3;
    return PA_OK;
}

static pa_status measure(pa_context *ctx, matmul_run *r, double seconds, pa_ceilings *out) {
    cuda_impl *impl = r->impl;
    char *note = out->matmul_note;
    const size_t note_len = sizeof out->matmul_note;
    for (; r->nev < MAX_CHUNKS + 1; r->nev++)
        CU_TRY(ctx, pa_cu.cuEventCreate(&r->ev[r->nev], CU_EVENT_DEFAULT));
    const double flops = 2.0 * (double)r->n * r->n * r->n;

    /* short: single products after a warm-up (cuBLAS picks and loads its
     * kernel), queued back to back with an event between two: the host is
     * ahead, so no launch gap is timed; the first interval may hold one */
    if (queue_products(r, 3, note, note_len)) return PA_OK;
    CU_TRY(ctx, pa_cu.cuStreamSynchronize(impl->stream));
    enum { SHORT = 9 };
    for (int i = 0; i < SHORT; i++) {
        CU_TRY(ctx, pa_cu.cuEventRecord(r->ev[i], impl->stream));
        if (queue_products(r, 1, note, note_len)) return PA_OK;
    }
    CU_TRY(ctx, pa_cu.cuEventRecord(r->ev[SHORT], impl->stream));
    double best = 1e30;
    for (int i = 1; i < SHORT; i++) {
        double s;
        pa_status st = elapsed(ctx, r->ev[i], r->ev[i + 1], &s);
        if (st) return st;
        if (s > 0 && s < best) best = s;
    }
    if (best >= 1e30) {
        snprintf(note, note_len, "not measured: the products took no time (events)");
        return PA_OK;
    }
    out->matmul_gflops = flops / best / 1e9;

    /* sustained: chunks of products back to back, one event between chunks,
     * the next chunk queued before the last one is waited for (no gaps) */
    int per_chunk = (int)(seconds / MAX_CHUNKS / best + 0.5);
    if (per_chunk < 1) per_chunk = 1;
    if ((double)per_chunk * best < 0.02) per_chunk = (int)(0.02 / best) + 1; /* >= ~20 ms a chunk */
    double chunk_s[MAX_CHUNKS];
    int chunks = 0;
    const double start = now_seconds();
    CU_TRY(ctx, pa_cu.cuEventRecord(r->ev[0], impl->stream));
    for (;;) {
        if (queue_products(r, per_chunk, note, note_len)) {
            out->matmul_gflops = 0; /* one verdict: not measured */
            return PA_OK;
        }
        CU_TRY(ctx, pa_cu.cuEventRecord(r->ev[chunks + 1], impl->stream));
        chunks++;
        if (chunks >= 2) { /* wait for the chunk before this one */
            pa_status st = elapsed(ctx, r->ev[chunks - 2], r->ev[chunks - 1], &chunk_s[chunks - 2]);
            if (st) return st;
        }
        if (chunks == MAX_CHUNKS || (now_seconds() - start >= seconds && chunks >= 4)) break;
    }
    pa_status st = elapsed(ctx, r->ev[chunks - 1], r->ev[chunks], &chunk_s[chunks - 1]);
    if (st) return st;
    double t = 0;
    int first = chunks / 2, rated = 0;
    for (int i = first; i < chunks; i++) {
        t += chunk_s[i];
        rated += per_chunk;
    }
    if (t > 0) out->matmul_sustained_gflops = flops * rated / t / 1e9;
    double total = 0;
    for (int i = 0; i < chunks; i++) total += chunk_s[i];
    int version = 0;
    blas.cublasGetVersion_v2(r->handle, &version);
    snprintf(note, note_len,
             "cuBLAS %d.%d.%d, %d^3 bf16 GemmEx, f32 accumulate: short = the best of 8 single products, "
             "sustained = the last %d of %d products back to back in %.2f s (%.100s)",
             version / 10000, version / 100 % 100, version % 100, r->n, rated, chunks * per_chunk, total,
             blas_path);
    return PA_OK;
}

pa_status pa_cuda_matmul_ceiling(pa_context *ctx, cuda_impl *impl, double seconds, pa_ceilings *out) {
    pthread_once(&blas_once, load_cublas);
    if (!blas_ok) {
        snprintf(out->matmul_note, sizeof out->matmul_note, "%s", blas_why);
        return PA_OK;
    }
    matmul_run r;
    memset(&r, 0, sizeof r);
    r.impl = impl;
    /* 8192^3 (three 128 MiB matrices), smaller when memory is short */
    size_t free_b = 0, total_b = 0;
    CU_TRY(ctx, pa_cu.cuMemGetInfo(&free_b, &total_b));
    r.n = 8192;
    while (r.n > 1024 && (size_t)r.n * r.n * 2 * 3 > free_b / 2) r.n /= 2;
    const size_t bytes = (size_t)r.n * r.n * 2;
    pa_status st = PA_OK;
    CUresult cr = pa_cu.cuMemAlloc(&r.a, bytes);
    if (cr == CUDA_SUCCESS) cr = pa_cu.cuMemAlloc(&r.b, bytes);
    if (cr == CUDA_SUCCESS) cr = pa_cu.cuMemAlloc(&r.c, bytes);
    if (cr != CUDA_SUCCESS) st = pa_cu_fail(ctx, cr, "cuMemAlloc(matmul ceiling)", __FILE__, __LINE__);
    if (st == PA_OK) st = fill_random(ctx, impl, r.a, (long long)r.n * r.n, 11);
    if (st == PA_OK) st = fill_random(ctx, impl, r.b, (long long)r.n * r.n, 12);
    if (st == PA_OK) {
        cublasStatus_t s = blas.cublasCreate_v2(&r.handle);
        if (s == CUBLAS_STATUS_SUCCESS) s = blas.cublasSetStream_v2(r.handle, impl->stream);
        if (s != CUBLAS_STATUS_SUCCESS)
            snprintf(out->matmul_note, sizeof out->matmul_note,
                     "not measured: cublasCreate/cublasSetStream failed: %.100s (%d) (%.100s)", status_str(s), s,
                     blas_path);
        else st = measure(ctx, &r, seconds, out);
    }
    pa_cu.cuStreamSynchronize(impl->stream);
    if (r.handle) blas.cublasDestroy_v2(r.handle);
    for (int i = 0; i < r.nev; i++) pa_cu.cuEventDestroy(r.ev[i]);
    if (r.a) pa_cu.cuMemFree(r.a);
    if (r.b) pa_cu.cuMemFree(r.b);
    if (r.c) pa_cu.cuMemFree(r.c);
    if (st == PA_OK && out->matmul_gflops == 0 && !out->matmul_note[0])
        snprintf(out->matmul_note, sizeof out->matmul_note, "not measured");
    return st;
}
