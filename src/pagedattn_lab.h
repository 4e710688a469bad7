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
 * the source tree; $PAGEDATTN_KERNEL_DIR, or a device's tuning field
 * kernel_dir, may name a directory to read them from instead), compiled by
 * NVRTC at first use with their shape constants baked in, and cached in
 * memory and on disk: $PAGEDATTN_KERNEL_CACHE, else $XDG_CACHE_HOME/pagedattn,
 * else ~/.cache/pagedattn ("off": no disk cache). A variant is named by a
 * string such as "decode dtype=bf16 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024";
 * the catalog, derived from the table of variants, covers every kernel and
 * code path. */
int pa_kernel_catalog_size(void);
const char *pa_kernel_catalog_name(int index); /* NULL when out of range */
/* Compiles a variant for arch ("sm_80", "sm_90a", ...; NULL or "": that of
 * CUDA device 0) through NVRTC, with the sources and options of the
 * environment ($PAGEDATTN_KERNEL_DIR, $PAGEDATTN_NVRTC_OPTIONS, read at each
 * call). With use_disk_cache, a valid cached image is taken and a new one
 * stored; *was_cached (may be NULL) says which happened. */
pa_status pa_kernel_compile(pa_context *ctx, const char *variant, const char *arch,
                            int use_disk_cache, int *was_cached);

/* ---- device-side timing (CUDA devices) ----
 * While on, each attention call records device events around its kernels,
 * and first holds the stream with a short bounded wait on the device (the
 * tuning's timing_hold_us, 50 us) so that the host has queued the call's
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

/* ---- tuning of the CUDA kernels' choice and plan ----
 * Every choice the CUDA planner makes that is not forced by the problem, as
 * one struct per device: read when the device opens (the defaults below;
 * kernel_dir and nvrtc_options from $PAGEDATTN_KERNEL_DIR and
 * $PAGEDATTN_NVRTC_OPTIONS), changed only by pa_device_set_tuning (sweeps,
 * benchmarks, specs). A device is shared by the process: set it back after
 * use. "0: auto" fields take the default described. pa_cuda_tuning_field
 * lists the fields with their ranges. */
typedef struct pa_cuda_tuning {
    /* kernel choice */
    int32_t fallback;       /* 1: every sequence on the plain fallback kernel (tests); default 0 */
    int32_t decode_kernel;  /* 0 auto (tensor cores for f16/bf16 at head dims up to 128), 1 simt (CUDA cores) */
    int32_t prefill_kernel; /* 0 auto, 1 ws, 2 wgmma (Hopper), 3 mma (mma.sync) */
    /* decode */
    int32_t decode_kpw;              /* tensor-core decode: keys a warp and stage at head dims 64 and 128: 16 or 8 */
    int32_t decode_stages;           /* 0: 3 at 16 keys a warp, 4 at 8; else 2..8 */
    int32_t decode_persist;          /* 1: persistent blocks where units outnumber the resident blocks; 0 never */
    int32_t decode_persist_min_keys; /* persistent blocks only where query tiles average this many keys (256) */
    int32_t decode_max_blocks;       /* persistent blocks launched at most; 0: as many as are resident */
    int32_t decode_wide;             /* eight-warp persistent blocks: 0 never, 1 where they pay, 2 always (where they fit) */
    int32_t decode_wide_min_keys;    /* ... where the sequences average this many keys (1024) */
    int32_t decode_wide_max_units;   /* ... in at most this many units a SM (6) */
    int32_t decode_short_kpw;        /* short units' kernel: 0 (16 where a warp takes a tile of >= 96 keys, else 8), 8, 16 */
    int32_t decode_short_stages;     /* short units' kernel: stages (3) */
    int32_t decode_short_minb;       /* short units' kernel: blocks a SM its registers allow; 0: 3 at 8 keys a warp, 2 at 16 */
    int32_t decode_hw;               /* a warp a head tile: 0 never, 1 where it pays, 2 also under hw_min_waves */
    int32_t decode_hw_persist;       /* ... in persistent blocks: 0 never, 1 where it pays, 2 wherever a warp takes a tile */
    int32_t decode_hw_max_keys;      /* ... for units under this many keys on average (512) */
    int32_t decode_hw_min_waves;     /* ... where its blocks fill this many hundredths of a wave (50) */
    int32_t decode_split_short;      /* 1: short and long sequences of a call as two launches; 0: one */
    int32_t decode_overlap;          /* 1: the second of those launched programmatically (sm_90+); 0: after the first */
    int32_t decode_claim;            /* splits of a tile claim its keys two stages at a time: 0 never, 1 16-bit caches, 2 always */
    int32_t decode_claim_min;        /* ... where every split has this many keys (4096) */
    int32_t decode_claim_order;      /* 1: claiming splits launched split-major; 0 sequence-major */
    int32_t decode_first_pages;      /* 1: the host lists each first unit's first page ids; 0: blocks read them */
    int32_t decode_guided;           /* 1: key ranges cut into pieces that shrink towards the list's end; 0 */
    int32_t decode_guide;            /* ... pieces of 1 / (guide x resident blocks) of what is left (2) */
    int32_t decode_min_chunk;        /* ... of at least this many keys; 0: 512 persistent, 256 else */
    /* splits */
    int32_t split_chunk;             /* keys a split; 0: the planner's (about a wave of blocks) */
    int32_t split_waves;             /* waves of blocks the split aims at below one wave (1) */
    /* prefill */
    int32_t prefill_stages;          /* 0: each kernel's default; else clamped to the kernel's range */
    int32_t prefill_minb;            /* mma.sync prefill: blocks a SM; 0: 2, 1 at head dim 256 */
    int32_t prefill_tma;             /* ws: 1 TMA boxes where they apply; 0 cp.async gather */
    int32_t prefill_page_boxes;      /* ws with TMA, paged: 1 a box a page of every column; 0 of 64 columns */
    int32_t prefill_tma_q;           /* ws with TMA: 1 the Q tile by TMA where it may; 0 cp.async */
    int32_t prefill_tma_o;           /* ws with TMA: 1 O stored by TMA where it may; 0 16-byte stores */
    int32_t prefill_first_boxes;     /* ws with TMA, paged: 1 the host lists the first tile's boxes; 0 */
    int32_t prefill_order;           /* ws: 1 blocks by sequence, longest first; 0 longest first over all */
    int32_t prefill_fp8;             /* fp8 caches: 1 prefill on the Hopper kernels over a 16-bit copy; 2 on the
                                        e4m3 tensor cores where they apply (prefill_f8), else as 1; 0 mma.sync */
    int32_t prefill_fp8_max_mb;      /* ... where the copy (K and V) takes at most this many MiB (1024) */
    /* cascade */
    int32_t cascade_overlap;         /* 1: the shared level on a second stream beside the suffix level; 0 one stream */
    int32_t cascade_share;           /* ... its tiles split over this percent of a wave (25) */
    /* laboratory */
    int32_t timing_hold_us;          /* pa_device_timing: the stream held this long before a timed call (50) */
    char kernel_dir[256];            /* kernel sources read from here ("": the embedded ones) */
    char nvrtc_options[512];         /* more NVRTC options, split at blanks ("no-lineinfo" drops -lineinfo) */
} pa_cuda_tuning;

/* One field of pa_cuda_tuning: its name, an int32_t in [min, max] (names:
 * its values' names by number, "auto|simt", else NULL) or, with is_text, a
 * char array of max bytes; doc says what it does. */
typedef struct pa_tuning_field {
    const char *name;
    int32_t is_text;
    int64_t min, max;
    const char *names;
    const char *doc;
} pa_tuning_field;
int pa_cuda_tuning_field_count(void);
const pa_tuning_field *pa_cuda_tuning_field(int index); /* NULL when out of range */
/* The defaults (kernel_dir and nvrtc_options empty: a device opens with the
 * environment's). */
void pa_cuda_tuning_defaults(pa_cuda_tuning *out);

/* The device's tuning now, or the one it opened with (defaults != 0). */
pa_status pa_device_get_tuning(pa_context *ctx, pa_device *dev, pa_cuda_tuning *out, int defaults);
/* Sets it (for the calls queued after): every field checked first, a clear
 * error naming the first one out of range; a failed call changes nothing. */
pa_status pa_device_set_tuning(pa_context *ctx, pa_device *dev, const pa_cuda_tuning *tuning);
/* The kernels the last attention call on the device launched, one line
 * each: "<variant> | <entry> grid=N threads=N smem=N items=N ..." */
pa_status pa_device_last_plan(pa_context *ctx, pa_device *dev, char *out, size_t len);

/* A shape of attention, for the kernels the planner may choose for it. */
typedef struct pa_kernel_shape {
    int32_t dtype;          /* pa_dtype of q and the caches */
    int32_t head_dim, heads, kv_heads;
    int32_t page_size;      /* 0: contiguous caches */
    int32_t seqlen_q;       /* queries of each sequence: up to 8 a decode kernel's, more a prefill kernel's */
    int32_t natural;        /* 1: softcap, alibi or no softmax scale */
    int32_t rotary;         /* 1: q rotated in the call */
    int32_t kv_dtype;       /* the caches' pa_dtype where fp8 (PA_FP8_E4M3, PA_FP8_E5M2), else 0: dtype's */
} pa_kernel_shape;
/* The kernel variants the CUDA planner may choose for sequences of a shape on
 * arch ("sm_90a", "sm_80", ...; NULL or "": CUDA device 0's) under tuning
 * (NULL: the defaults), whatever their number and keys: written to out one a
 * line, *count of them. (What scripts/precompile.lua compiles ahead.) */
pa_status pa_kernel_variants_for(pa_context *ctx, const pa_kernel_shape *shape, const pa_cuda_tuning *tuning,
                                 const char *arch, char *out, size_t out_len, int *count);

/* PA_LAB_API_END */

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_LAB_H */
