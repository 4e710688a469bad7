/*
 * cpu_kernels.h -- the interface between the CPU attention driver and its
 * per-ISA kernels (cpu_kernel.inc compiled once per instruction set).
 */
#ifndef PA_CPU_KERNELS_H
#define PA_CPU_KERNELS_H

#include "../core/internal.h"

/* One unit of work: query rows [i0, i0 + nq) of sequence b, with the query heads
 * of kv heads hk .. hk + nh - 1 (their GQA groups), over keys [k0, k1). */
typedef struct pa_cpu_tile {
    int32_t b, hk, nh, i0, nq; /* kv heads [hk, hk + nh) */
    int32_t k0, k1;
    /* where the result goes: the final out/lse, or a split's partial slot */
    int64_t partial; /* -1: final; else index of the partial (o, lse) slot */
} pa_cpu_tile;

/* Per-thread working memory, sized by pa_cpu_scratch_floats. */
typedef struct pa_cpu_scratch {
    float *buf;
    int64_t floats;
} pa_cpu_scratch;

#define PA_CPU_MAX_KEY_BLOCK 128
#define PA_CPU_MAX_SPLITS 256 /* splits of one tile's keys (num_splits is clamped to it) */

typedef struct pa_cpu_plan {
    const pa_attn_problem *p;
    int32_t tile_q;       /* queries per tile */
    int32_t rows;         /* tile_q * group: rows of the Q tile of one kv head */
    int32_t heads_per_tile; /* kv heads a tile may take */
    int64_t tile_rows;    /* rows * heads_per_tile: a tile's rows in partial slots */
    int32_t dpad;         /* head dim padded to the vector width */
    int32_t key_block;    /* keys per inner block */
    float *partial_o;     /* [slots][tile_rows][head_dim] */
    float *partial_lse;   /* [slots][tile_rows] */
} pa_cpu_plan;

typedef struct pa_cpu_isa {
    const char *name;
    int vector_width; /* floats */
    int64_t (*scratch_floats)(const pa_cpu_plan *plan);
    void (*tile)(const pa_cpu_plan *plan, const pa_cpu_tile *tile, float *scratch);
    /* fp32 FMA throughput of one thread over `iters` iterations: returns flops */
    double (*fma_loop)(int64_t iters, float *sink);
    /* sums a buffer with wide loads (the streaming-read ceiling) */
    float (*read_sum)(const float *buf, int64_t n);
} pa_cpu_isa;

/* cpu_merge.c: the merge and row-copy ops (core/internal.h describes them) */
struct pa_threadpool;
pa_status pa_cpu_merge(struct pa_threadpool *pool, const pa_merge_problem *p);
pa_status pa_cpu_gather_rows(struct pa_threadpool *pool, const pa_rows_problem *p);

extern const pa_cpu_isa pa_cpu_isa_avx512;
extern const pa_cpu_isa pa_cpu_isa_avx2;
extern const pa_cpu_isa pa_cpu_isa_generic;

#endif
