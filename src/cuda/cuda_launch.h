/*
 * cuda_launch.h -- the launches of a planned attention call (cuda_launch.c)
 * and the record of what they were (pa_device_last_plan).
 */
#ifndef PA_CUDA_LAUNCH_H
#define PA_CUDA_LAUNCH_H

#include "cuda_internal.h"
#include "cuda_planner.h"

/* The call's device buffers: the uploaded plan, scratch, arrival counters. */
typedef struct pa_cuda_buffers {
    CUdeviceptr plan, scratch, counters;
} pa_cuda_buffers;

/* ---- cuda_dequant.c: prefill over fp8 caches on the Hopper kernels ----
 * A call that takes it: its parts planned (and run) for p16, the same call
 * over a 16-bit copy of the keys it attends; pa_dequant (the append module's
 * entry, pa_cuda_launch queues it) widens them into the copy after the append. */
typedef struct pa_dequant_plan {
    bool on;
    int32_t width;      /* copy pages a sequence: entry (b, j) is page b * width + j */
    size_t copy_bytes;  /* the K copy's (and the V copy's) bytes */
    size_t scratch_off; /* the K copy, then the V copy, in the call's scratch */
    size_t upload_off;  /* i32 key counts [batch], then the copy's block table, in the upload */
    int32_t *h_table;   /* the copy's block table on the host */
    CUdeviceptr seqlen; /* the key counts on the device (bound at the upload) */
    pa_attn_problem p16;
    /* tuning prefill_fp8 = 2: the e4m3 tensor cores (prefill_f8.cu) where
     * they apply. f8 wanted (then p16 is planned on prefill_ws), and once
     * adopted (pa_cuda_dequant_f8) the copy is pa_f8_tiles's tiles, each
     * part runs prefill_f8 over them with p's scales, and the widening is
     * pa_f8_tiles of f8_module */
    bool f8;
    /* tuning prefill_fp8 = 3: prefill_ws reads the fp8 pages and widens
     * them in the block (kv=) where every part would run on it; then no
     * copy (on false once adopted: pa_cuda_dequant_ws8; wanted even where
     * the copy would not fit) */
    bool ws8;
    int32_t ntile;        /* 128-key tiles a (sequence, kv head) */
    size_t tile_bytes;    /* the K tiles' (and the V^T tiles') bytes */
    void *f8_module;      /* (pa_kmodule) */
} pa_dequant_plan;

/* Whether a call may take it (then the plan of p16 decides: fits). */
bool pa_cuda_dequant_wanted(const pa_attn_problem *p, const pa_cuda_caps *caps, const pa_cuda_tuning *t);
/* dq for p: p16 with its host block table (dq->on false: the call stays on
 * fp8). pa_cuda_dequant_free after. */
pa_status pa_cuda_dequant_problem(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_tuning *t,
                                  pa_dequant_plan *dq);
/* The widening's entry point ("pa_dequant", or "pa_f8_tiles" in the f8
 * module) and its blocks: a block-table entry of p, or (f8) a (sequence, kv
 * head, 128-key tile). */
const char *pa_cuda_dequant_entry(const pa_dequant_plan *dq);
int64_t pa_cuda_dequant_grid(const pa_dequant_plan *dq, int32_t batch);
/* Whether every part of the plan of p16 runs on a Hopper prefill kernel. */
bool pa_cuda_dequant_fits(const pa_cuda_plan *plan);
/* Where dq->f8 is wanted and every part of the plan (of p16, on prefill_ws)
 * may run on prefill_f8: the parts' kernels swapped, dq->f8 kept; else
 * dq->f8 false (the plan to be made again without forcing prefill_ws). */
pa_status pa_cuda_dequant_f8(pa_context *ctx, const pa_cuda_kernels *k, const pa_cuda_tuning *t,
                             const pa_attn_problem *p, pa_dequant_plan *dq, pa_cuda_plan *plan);
/* Where dq->ws8 is wanted and every part of the plan (of p with 16-bit
 * caches, on prefill_ws) may read the fp8 pages itself: the parts' kernels
 * swapped to prefill_ws kv=, *adopted true; else *adopted false (the plan to
 * be made again). */
pa_status pa_cuda_dequant_ws8(pa_context *ctx, const pa_cuda_kernels *k, const pa_attn_problem *p,
                              pa_cuda_plan *plan, bool *adopted);
/* The copies in the plan's scratch, the key counts and table in its upload. */
void pa_cuda_dequant_layout(pa_dequant_plan *dq, const pa_attn_problem *p, pa_cuda_plan *plan);
void pa_cuda_dequant_write(const pa_dequant_plan *dq, const pa_attn_problem *p, void *host);
void pa_cuda_dequant_bind_scratch(pa_dequant_plan *dq, CUdeviceptr scratch);
void pa_cuda_dequant_bind_upload(pa_dequant_plan *dq, const pa_attn_problem *p, CUdeviceptr plan);
void pa_cuda_dequant_free(pa_dequant_plan *dq);

/* An fp8 append's 1 / scale of each kv head (f64, k's then v's) in the
 * upload, after what is there (plan->inv_off; 0 where the call writes no
 * fp8 cache), and their values (from p's host copies of the scales). */
void pa_cuda_append_scales_layout(const pa_attn_problem *p, pa_cuda_plan *plan);
void pa_cuda_append_scales_write(const pa_attn_problem *p, const pa_cuda_plan *plan, void *host);

/* prefill_ws's TMA descriptors of each part (host work only: before anything
 * is queued, so that a failure queues nothing). */
pa_status pa_cuda_launch_prepare(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_plan *plan,
                                 const pa_cuda_tuning *t, pa_tma_maps maps[4]);
/* Queues the rotary append (append_fn, over p), the widening of the keys
 * (dq maybe NULL: none) and each part's kernel (over dq's p16, else p) on
 * stream. */
pa_status pa_cuda_launch(pa_context *ctx, CUstream stream, const pa_attn_problem *p, const pa_cuda_plan *plan,
                         const pa_cuda_buffers *buf, CUfunction append_fn, const pa_dequant_plan *dq,
                         CUfunction dequant_fn, pa_tma_maps maps[4]);

/* What the call launched, in order (dq maybe NULL). */
int pa_cuda_records(const pa_cuda_plan *plan, const char *append_variant, const char *append_entry,
                    const pa_dequant_plan *dq, int32_t batch, pa_cuda_launch_record out[PA_LAUNCH_RECORDS]);
pa_status pa_cuda_describe(pa_context *ctx, const pa_cuda_launch_record *r, int n, char *out, size_t len);

#endif /* PA_CUDA_LAUNCH_H */
