/*
 * cuda_internal.h -- what the files of the CUDA backend share: the loaded
 * driver and NVRTC tables, error helpers, the per-device state, and each
 * file's functions that others call. The planner (cuda_planner.h) and the
 * variant table (cuda_variants.h) need none of it.
 */
#ifndef PA_CUDA_INTERNAL_H
#define PA_CUDA_INTERNAL_H

#include "../core/internal.h"
#include "cuda_api.h"
#include "cuda_tuning.h"
#include "cuda_variants.h"
#include "../../kernels/params.h"

#include <pthread.h>

/* ---- cuda_loader.c: libcuda and NVRTC, opened once with dlopen ---- */

extern pa_cuda_driver pa_cu;  /* valid once pa_cuda_driver_ready() returned true */
extern pa_nvrtc pa_rtc;       /* valid once pa_nvrtc_ready() returned true */

/* Load the driver (cuInit, >= 1 device) / NVRTC; on failure *why says why.
 * Both are cheap after the first call and safe to call from any thread. */
bool pa_cuda_driver_ready(char *why, size_t why_len);
bool pa_nvrtc_ready(char *why, size_t why_len);
int pa_nvrtc_version(void); /* major * 10 + minor: 130 for 13.0 */
/* A symbol to resolve: its name, where its address goes, whether it must exist. */
typedef struct pa_sym {
    const char *name;
    void **slot;
    bool required;
} pa_sym;
/* dlopen(path) and resolve syms: the handle, or NULL (every slot cleared, the
 * handle closed, err saying why) where it does not open or lacks a required
 * symbol. */
void *pa_dlopen_syms(const char *path, const pa_sym *syms, size_t n, char *err, size_t err_len);

/* Opens a CUDA toolkit library with try_open: the path in $env when set (that
 * one only), else by stem ("libnvrtc"): its sonames (13, 12, unversioned),
 * /usr/local/cuda/lib64 and lib, $CUDA_HOME (or $CUDA_PATH)/lib64 and lib.
 * On failure `why` says so, naming `what` ("NVRTC"), env and the last error. */
bool pa_cuda_open_toolkit_lib(const char *env, const char *stem, const char *what,
                              bool (*try_open)(const char *path, char *err, size_t err_len), char *why,
                              size_t why_len);

/* Records a failed driver call (its text, the file and line) on ctx. */
pa_status pa_cu_fail(pa_context *ctx, CUresult r, const char *call, const char *file, int line);
/* Whether a CUDA device can be opened here (sets *why when not). */
bool pa_cuda_usable(char *why, size_t why_len);
#define CU_TRY(ctx, call)                                                   \
    do {                                                                    \
        CUresult r_ = (call);                                               \
        if (r_ != CUDA_SUCCESS) return pa_cu_fail(ctx, r_, #call, __FILE__, __LINE__); \
    } while (0)

/* ---- per-device state (cuda_device.c) ---- */

typedef struct pa_kmodule pa_kmodule;

/* Pinned host staging for uploads: a small ring, so that an upload waits only
 * for the one that used its slot PA_STAGING_SLOTS uploads ago, not for the
 * stream. An attention plan goes to the slot's own device buffer on the copy
 * stream, ahead of the kernels that read it (an upload queued on the stream
 * itself delays the next kernel: docs/planner.md). */
#define PA_STAGING_SLOTS 4
typedef struct cuda_staging {
    void *host; /* pinned */
    size_t bytes;
    CUevent done; /* recorded after the upload from it */
    bool pending; /* an upload from it may still be queued */
    CUdeviceptr dev; /* the plan uploaded from it (pa_cuda_plan_upload) */
    size_t dev_bytes;
    CUevent used;    /* recorded on the stream after the kernels that read dev */
    bool used_recorded;
} cuda_staging;

/* One launch of an attention call, as pa_device_last_plan tells it. */
#define PA_LAUNCH_RECORDS 6 /* the append, the fp8 widening, four parts */
typedef struct pa_cuda_launch_record {
    const char *variant, *entry; /* the module cache's names (live as long as the device) */
    int64_t grid;
    int threads, smem;
    int64_t items;
    int head_tiles, split; /* split: the append's warps a token (0: an attention launch) */
    bool splits, claims, persistent, overlap;
    int tma_rows;
    int32_t key_lo, key_hi;
} pa_cuda_launch_record;

/* A queue of the device's work (pa_call_flags.lane): its stream and the
 * per-call scratch and counters of the calls queued on it, which calls on
 * the other lane may overlap. Lane 0's stream is the device's stream. */
#define PA_LANES 2
typedef struct cuda_lane {
    CUstream stream;
    CUdeviceptr scratch; /* grown on demand */
    size_t scratch_bytes;
    CUdeviceptr counters; /* u32 arrival counters, zero between calls */
    size_t counters_bytes;
    CUevent mark; /* lane 0's at a fork, lane 1's at a join */
} cuda_lane;

typedef struct cuda_impl {
    CUdevice cudev;
    CUcontext cuctx; /* the primary context, retained */
    CUstream stream; /* all work of this device, in order */
    CUstream copy_stream; /* attention plans, uploaded while the stream runs what came before */
    int sm_count, cc_major, cc_minor;
    int smem_optin; /* shared bytes a block may opt into */
    char arch[16];  /* what NVRTC compiles for: "sm_90a", "sm_80", ... */
    /* one call at a time: the caches, scratch, staging and tuning below are shared */
    pthread_mutex_t lock;
    pa_cuda_tuning tuning;      /* what the planner and the kernel cache follow */
    pa_cuda_tuning tuning_open; /* the tuning the device opened with */
    pa_kmodule *modules;
    atomic_llong *setup_ns; /* the device's pa_device_setup_seconds counter */
    cuda_lane lanes[PA_LANES]; /* [0].stream is `stream`; [1] is the cascade's shared level's */
    /* pinned staging for uploads (attention plans, tensor writes) */
    cuda_staging staging[PA_STAGING_SLOTS];
    int staging_next; /* the slot the next upload takes */
    /* device-side timing of attention calls (pa_device_timing) */
    bool timing, timed;
    CUevent t_start, t_end;
    CUfunction hold; /* util's pa_hold: keeps the stream busy while a call is queued */
    /* the last attention call's launches */
    pa_cuda_launch_record last[PA_LAUNCH_RECORDS];
    int nlast;
} cuda_impl;

static inline cuda_impl *pa_cuda_impl(const pa_device *dev) { return (cuda_impl *)dev->impl; }

/* ---- cuda_staging.c: the context, scratch and the staging ring ---- */

/* Makes the device's context current for the duration of a call. */
pa_status pa_cuda_enter(pa_context *ctx, cuda_impl *impl);
void pa_cuda_leave(cuda_impl *impl);

/* The lane that call p queues on: lane 1 where it asks for it and the
 * tuning lets the cascade's levels overlap (pa_lane_beside), else lane 0. */
cuda_lane *pa_cuda_lane(cuda_impl *impl, const pa_attn_problem *p);
/* Drains every lane's stream. */
CUresult pa_cuda_lanes_sync(cuda_impl *impl);
/* The backend table's lane_fork and lane_join (pa_backend_ops). */
pa_status pa_cuda_lane_fork(pa_context *ctx, pa_device *dev);
pa_status pa_cuda_lane_join(pa_context *ctx, pa_device *dev);
/* Device scratch of lane L of at least `bytes` (contents undefined) /
 * counters of at least `n` entries (zero). May synchronise L's stream to
 * grow. */
pa_status pa_cuda_scratch(pa_context *ctx, cuda_lane *L, size_t bytes, CUdeviceptr *out);
pa_status pa_cuda_counters(pa_context *ctx, cuda_lane *L, size_t n, CUdeviceptr *out);
/* Pinned host staging of at least `bytes`, free to overwrite: the ring's
 * next slot (*slot), once the upload that last used it has left. Fill it,
 * then queue it with pa_cuda_staging_upload. Call with impl->lock held and
 * the context current. */
pa_status pa_cuda_staging(pa_context *ctx, cuda_impl *impl, size_t bytes, void **out, int *slot);
/* Uploads `bytes` of staging slot `slot` to the slot's device buffer on the
 * copy stream (once the kernels of the slot's previous plan are done) and
 * makes `stream` wait for it; *dev: the buffer. pa_cuda_plan_release, after
 * the kernels that read it are queued on `stream`, marks it free again.
 * Call with impl->lock held. */
pa_status pa_cuda_plan_upload(pa_context *ctx, cuda_impl *impl, CUstream stream, int slot, size_t bytes,
                              CUdeviceptr *dev);
pa_status pa_cuda_plan_release(pa_context *ctx, cuda_impl *impl, CUstream stream, int slot);
/* Queues the copy of `bytes` from staging slot `slot` to dst on the stream
 * (`what` names it in errors) and moves the ring on; does not wait. */
pa_status pa_cuda_staging_upload(pa_context *ctx, cuda_impl *impl, int slot, CUdeviceptr dst,
                                 size_t bytes, const char *what);
/* Frees what the above hold (the device's destruction). */
void pa_cuda_staging_free(cuda_impl *impl);

/* ---- cuda_measure.c: the laboratory's measurements ---- */

/* Timing brackets around the kernels of one attention call, queued on
 * `stream` (no-ops unless on). */
pa_status pa_cuda_timing_begin(pa_context *ctx, cuda_impl *impl, CUstream stream);
pa_status pa_cuda_timing_end(pa_context *ctx, cuda_impl *impl, CUstream stream);
/* The backend table's timing and ceilings entries. */
pa_status pa_cuda_timing(pa_context *ctx, pa_device *dev, int on);
pa_status pa_cuda_timing_last(pa_context *ctx, pa_device *dev, double *seconds);
pa_status pa_cuda_measure_ceilings(pa_context *ctx, pa_device *dev, double seconds, pa_ceilings *out);

/* ---- cuda_compile.c: kernel sources, NVRTC and the disk cache ---- */

/* Where a compile takes its sources and extra options from, and the names
 * its errors give them ("kernel_dir" of a device's tuning, or the
 * environment's PAGEDATTN_KERNEL_DIR for pa_kernel_compile). */
typedef struct pa_compile_from {
    const char *dir, *dir_name;         /* "" or NULL: the embedded sources */
    const char *options, *options_name; /* "" or NULL: none */
} pa_compile_from;
enum { PA_IMAGE_CUBIN = 1, PA_IMAGE_PTX = 2 };
/* The image of a parsed variant for arch: from the disk cache when allowed
 * and valid, else compiled (and then stored). */
pa_status pa_cuda_variant_image(pa_context *ctx, const char *name, const pa_variant *v, const char *arch,
                                int image_kind, bool use_disk, const pa_compile_from *from, void **image,
                                size_t *size, bool *was_cached);
/* pagedattn_lab.h's compiler, offered through the registry */
pa_status pa_cuda_kernel_compile(pa_context *ctx, const char *variant, const char *arch, int use_disk_cache,
                                 int *was_cached);
/* The target NVRTC compiles for on compute capability major.minor ("sm_90a",
 * "sm_80", or "compute_XX" PTX when NVRTC does not know the device). */
void pa_cuda_pick_arch(int major, int minor, char *arch, size_t len, int *image_kind);
/* The arch of CUDA device 0 (pa_kernel_compile's default). */
pa_status pa_cuda_device0_arch(pa_context *ctx, const char *what, char *arch, size_t len, int *image_kind);

/* ---- cuda_modules.c: compiled modules loaded on a device ---- */

#define PA_KMODULE_FUNCS 8
struct pa_kmodule {
    pa_kmodule *next;
    char name[192];
    char srcdir[256];   /* the tuning's kernel_dir when it was built ("": the embedded sources) */
    char options[512];  /* the tuning's nvrtc_options when it was built */
    CUmodule module;
    int info[8]; /* the module's pa_<kind>_info constants, if any */
    int nfuncs;
    const char *func_names[PA_KMODULE_FUNCS];
    CUfunction funcs[PA_KMODULE_FUNCS];
    int smem_set[PA_KMODULE_FUNCS]; /* dynamic shared limit raised to */
};

/* The module of a variant ("decode dtype=bf16 D=128 ..."), from memory, the
 * disk cache, or NVRTC, built from the device's tuning's kernel_dir and
 * nvrtc_options. Call with impl->lock held and the context current. */
pa_status pa_cuda_module(pa_context *ctx, cuda_impl *impl, const char *variant, pa_kmodule **out);
/* One of its kernels; raises its dynamic shared memory limit to smem_bytes. */
pa_status pa_cuda_function(pa_context *ctx, cuda_impl *impl, pa_kmodule *m, const char *entry,
                           int smem_bytes, CUfunction *out);
void pa_cuda_modules_free(cuda_impl *impl);

/* ---- kernel_sources.c: the kernels/ sources, embedded at build time ---- */

typedef struct pa_kernel_source {
    const char *name; /* file name in kernels/ */
    const char *text;
    size_t len;
} pa_kernel_source;
#define PA_KERNEL_SOURCES 21
int pa_kernel_sources(pa_kernel_source out[PA_KERNEL_SOURCES]);

/* ---- cuda_blas.c: the bf16 matmul ceiling by cuBLAS (opened at run time) ----
 * Fills matmul_gflops, matmul_sustained_gflops and matmul_note; without
 * cuBLAS (or when it fails) only the note, and it still returns PA_OK. Call
 * with impl->lock held and the context current. */
pa_status pa_cuda_matmul_ceiling(pa_context *ctx, cuda_impl *impl, double seconds, pa_ceilings *out);

/* ---- cuda_attention.c ---- */
pa_status pa_cuda_attention(pa_context *ctx, const pa_attn_problem *p);

/* ---- cuda_merge.c: the merge and row-copy ops (kernels/merge.cu) ---- */
pa_status pa_cuda_merge(pa_context *ctx, const pa_merge_problem *p);
pa_status pa_cuda_gather_rows(pa_context *ctx, const pa_rows_problem *p);

#endif /* PA_CUDA_INTERNAL_H */
