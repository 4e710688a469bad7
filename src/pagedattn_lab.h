/*
 * pagedattn_lab.h -- the laboratory's instruments, apart from the product API
 * of pagedattn.h: a device's measured ceilings, device-side timing of
 * attention calls, the CUDA kernel catalog and its run-time compiler, and
 * the ABI probes the Lua bindings check their declarations with. Benchmarks,
 * sweeps, specs and the precompiler use them; a serving program needs none.
 *
 * The block between PA_LAB_API_BEGIN and PA_LAB_API_END is read verbatim by
 * the Lua bindings after pagedattn.h's (one ffi.cdef of both): keep it free
 * of preprocessor lines and macros.
 */
#ifndef PAGEDATTN_LAB_H
#define PAGEDATTN_LAB_H

#include "pagedattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PA_LAB_API_BEGIN */

/* Ceilings measured on the device now (each runs about `seconds`): the rate
 * of a streaming read over a buffer much larger than the caches, a
 * device-to-device copy counted as read + write bytes, and the arithmetic peak
 * (fp32 FMA on the CPU, a bf16 matrix product by cuBLAS on a GPU, opened at
 * run time). 0 = not measured. */
typedef struct pa_ceilings {
    double read_gbps;
    double copy_gbps;
    double fma_gflops;    /* fp32, 2 flops per FMA */
    double matmul_gflops; /* bf16 tensor-core matmul (GPU): best short run */
    double seconds;       /* how long each measurement ran */
    double matmul_sustained_gflops; /* the same back to back for `seconds` (power cap) */
    char matmul_note[320];          /* how the matmul was measured, or why it was not */
} pa_ceilings;
pa_status pa_device_measure_ceilings(pa_context *ctx, pa_device *dev,
                                     double seconds, pa_ceilings *out);

/* ---- ABI self-check (the Lua bindings compare these with ffi.sizeof and
 * ffi.offsetof): the size of a public struct by name, or the offset of one
 * of its fields; -1 if unknown. ---- */
int64_t pa_abi_sizeof(const char *type_name);
int64_t pa_abi_offsetof(const char *type_name, const char *field_name);

/* ---- CUDA kernels: run-time compilation (works without a GPU) ----
 * The CUDA kernels are CUDA C sources embedded in the library (kernels/ of
 * the source tree; $PAGEDATTN_KERNEL_DIR may name a directory to read them
 * from instead), compiled by NVRTC at first use with their shape constants
 * baked in, and cached in memory and on disk: $PAGEDATTN_KERNEL_CACHE, else
 * $XDG_CACHE_HOME/pagedattn, else ~/.cache/pagedattn ("off": no disk cache).
 * A variant is named by a string such as
 * "decode dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024"; the catalog
 * is a list of variants that covers every kernel and code path. */
int pa_kernel_catalog_size(void);
const char *pa_kernel_catalog_name(int index); /* NULL when out of range */
/* Compiles a variant for arch ("sm_80", "sm_90a", ...; NULL or "": that of
 * CUDA device 0) through NVRTC. With use_disk_cache, a valid cached image is
 * taken and a new one stored; *was_cached (may be NULL) says which happened. */
pa_status pa_kernel_compile(pa_context *ctx, const char *variant, const char *arch,
                            int use_disk_cache, int *was_cached);

/* ---- device-side timing (CUDA devices) ----
 * While on, each attention call records device events around its kernels,
 * and first holds the stream with a short bounded wait on the device
 * (50 us) so that the host has queued the call's
 * kernels before they run: the time measured is the kernels' own, without
 * the host's part of the call (validation, downloads, launches). For
 * benchmarks. */
pa_status pa_device_timing(pa_context *ctx, pa_device *dev, int on);
/* Seconds that the last timed call's kernels took (waits for them). */
pa_status pa_device_timing_last(pa_context *ctx, pa_device *dev, double *seconds);

/* Attention's downloads of index tensors so far (all devices): the specs
 * check with it that calls on mirrored index tensors do not wait for the
 * device. */
int64_t pa_debug_index_downloads(void);

/* PA_LAB_API_END */

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_LAB_H */
