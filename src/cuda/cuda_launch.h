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

/* prefill_ws's TMA descriptors of each part (host work only: before anything
 * is queued, so that a failure queues nothing). */
pa_status pa_cuda_launch_prepare(pa_context *ctx, const pa_attn_problem *p, const pa_cuda_plan *plan,
                                 const pa_cuda_tuning *t, pa_tma_maps maps[4]);
/* Queues the rotary append (append_fn) and each part's kernel on stream. */
pa_status pa_cuda_launch(pa_context *ctx, CUstream stream, const pa_attn_problem *p, const pa_cuda_plan *plan,
                         const pa_cuda_buffers *buf, CUfunction append_fn, pa_tma_maps maps[4]);

int pa_cuda_records(const pa_cuda_plan *plan, const char *append_variant, const char *append_entry,
                    pa_cuda_launch_record out[PA_LAUNCH_RECORDS]);
pa_status pa_cuda_describe(pa_context *ctx, const pa_cuda_launch_record *r, int n, char *out, size_t len);

#endif /* PA_CUDA_LAUNCH_H */
