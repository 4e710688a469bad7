/*
 * cpu_merge.c -- the CPU backend's merge of attention states by their
 * log-sum-exp, and its row copy (with rotary) of q, for the cascade
 * (src/core/merge.c describes both problems).
 */
#include "cpu_kernels.h"
#include "threadpool.h"

#define MERGE_ROWS 16  /* rows (tokens) per work item */
#define GATHER_ROWS 16

/* A row of D elements as f32, the dtype switch outside the loop (so that
 * the loops vectorise). */
static void load_row(float *dst, const void *base, pa_dtype dt, int64_t off, int D) {
    switch (dt) {
    case PA_BF16: {
        const uint16_t *src = (const uint16_t *)base + off;
        for (int d = 0; d < D; d++) {
            const uint32_t u = (uint32_t)src[d] << 16;
            memcpy(&dst[d], &u, 4);
        }
        break;
    }
    case PA_F16: {
        const uint16_t *src = (const uint16_t *)base + off;
        for (int d = 0; d < D; d++) dst[d] = pa_f16_to_f32(src[d]);
        break;
    }
    default: memcpy(dst, (const float *)base + off, (size_t)D * sizeof(float)); break;
    }
}

static void store_row(void *base, pa_dtype dt, int64_t off, const float *src, int D) {
    switch (dt) {
    case PA_BF16: {
        uint16_t *dst = (uint16_t *)base + off;
        for (int d = 0; d < D; d++) dst[d] = pa_f32_to_bf16(src[d]);
        break;
    }
    case PA_F16: {
        uint16_t *dst = (uint16_t *)base + off;
        for (int d = 0; d < D; d++) dst[d] = pa_f32_to_f16(src[d]);
        break;
    }
    default: memcpy((float *)base + off, src, (size_t)D * sizeof(float)); break;
    }
}

static void merge_item(void *arg, int64_t item, int thread) {
    (void)thread;
    const pa_merge_problem *p = arg;
    const int H = p->heads, D = p->head_dim, S = p->num_states;
    const int64_t r0 = item * MERGE_ROWS, r1 = r0 + MERGE_ROWS < p->rows ? r0 + MERGE_ROWS : p->rows;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t ro = p->out_rows ? p->out_rows[r] : r;
        int64_t row[PA_MERGE_MAX_STATES];
        for (int s = 0; s < S; s++) row[s] = p->states[s].rows ? p->states[s].rows[r] : r;
        for (int h = 0; h < H; h++) {
            float lse[PA_MERGE_MAX_STATES], mx = -INFINITY;
            bool nan = false;
            for (int s = 0; s < S; s++) {
                const pa_merge_state *st = &p->states[s];
                lse[s] = row[s] < 0 ? -INFINITY
                                    : st->lse[row[s] / st->lse_seq * H * st->lse_seq + (int64_t)h * st->lse_seq +
                                              row[s] % st->lse_seq];
                if (isnan(lse[s])) nan = true;
                if (lse[s] > mx) mx = lse[s];
            }
            float acc[PA_MAX_HEAD_DIM], lo[PA_MAX_HEAD_DIM], hi[PA_MAX_HEAD_DIM], v[PA_MAX_HEAD_DIM];
            float out_lse;
            if (nan) {
                for (int d = 0; d < D; d++) acc[d] = NAN;
                out_lse = NAN;
            } else if (mx == -INFINITY) { /* every state empty: a fully masked row */
                for (int d = 0; d < D; d++) acc[d] = 0;
                out_lse = -INFINITY;
            } else {
                float w[PA_MERGE_MAX_STATES], sum = 0;
                for (int s = 0; s < S; s++) {
                    w[s] = expf(lse[s] - mx); /* 0 for an empty state */
                    sum += w[s];
                }
                const float inv = 1.0f / sum;
                for (int d = 0; d < D; d++) {
                    acc[d] = 0;
                    lo[d] = INFINITY;
                    hi[d] = -INFINITY;
                }
                for (int s = 0; s < S; s++) {
                    if (w[s] == 0) continue; /* not read: an empty state's o may hold anything */
                    const float ws = w[s] * inv;
                    load_row(v, p->states[s].o, p->state_dtype, (row[s] * H + h) * (int64_t)D, D);
                    for (int d = 0; d < D; d++) {
                        acc[d] += ws * v[d];
                        lo[d] = v[d] < lo[d] ? v[d] : lo[d];
                        hi[d] = v[d] > hi[d] ? v[d] : hi[d];
                    }
                }
                /* the exact result is a convex combination: it lies between
                 * the states' values, and rounding must not take it past them
                 * (v near the largest float would become inf) */
                for (int d = 0; d < D; d++) {
                    acc[d] = acc[d] < lo[d] ? lo[d] : acc[d];
                    acc[d] = acc[d] > hi[d] ? hi[d] : acc[d];
                }
                out_lse = mx + logf(sum);
            }
            store_row(p->out, p->dtype, (ro * H + h) * (int64_t)D, acc, D);
            if (p->out_lse)
                p->out_lse[ro / p->out_lse_seq * H * p->out_lse_seq + (int64_t)h * p->out_lse_seq + ro % p->out_lse_seq] =
                    out_lse;
        }
    }
}

pa_status pa_cpu_merge(pa_threadpool *pool, const pa_merge_problem *p) {
    pa_threadpool_run(pool, (p->rows + MERGE_ROWS - 1) / MERGE_ROWS, merge_item, (void *)p);
    return PA_OK;
}

/* pa_f64_to_f32_odd (internal.h) without the libm call: toward zero by one
 * step of the bit pattern where rounding went away from zero (nextafterf
 * took ~20 ns a call, most of the time of rotating q). */
static inline float f32_odd(double x) {
    float f = (float)x;
    if (!isfinite(f) || (double)f == x) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(x)) u -= 1; /* (f != 0 here: |f| > |x| > 0) */
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

static void gather_item(void *arg, int64_t item, int thread) {
    (void)thread;
    const pa_rows_problem *p = arg;
    const int H = p->heads, D = p->head_dim, half = p->rotary_dim / 2;
    const size_t es = pa_dtype_size(p->dtype), row_bytes = (size_t)H * (size_t)D * es;
    const int64_t r0 = item * GATHER_ROWS, r1 = r0 + GATHER_ROWS < p->rows ? r0 + GATHER_ROWS : p->rows;
    float x[PA_MAX_HEAD_DIM], y[PA_MAX_HEAD_DIM];
    double c[PA_MAX_HEAD_DIM / 2], sn[PA_MAX_HEAD_DIM / 2];
    for (int64_t r = r0; r < r1; r++) {
        const int64_t s = p->row_map ? p->row_map[r] : r;
        if (!p->rotary_cos) {
            memcpy((char *)p->dst + r * (int64_t)row_bytes, (const char *)p->src + s * (int64_t)row_bytes, row_bytes);
            continue;
        }
        /* the row's position: its cos and sin once, then every head */
        const int64_t pos = p->pos[p->pos_index ? p->pos_index[s] : s];
        for (int j = 0; j < half; j++) {
            c[j] = pa_load_f64(p->rotary_cos, p->rotary_dtype, pos * half + j);
            sn[j] = pa_load_f64(p->rotary_sin, p->rotary_dtype, pos * half + j);
        }
        for (int h = 0; h < H; h++) {
            load_row(x, p->src, p->dtype, (s * H + h) * (int64_t)D, D);
            memcpy(y, x, (size_t)D * sizeof(float));
            /* in double, rounded once to the dtype: to f32 by rounding to
             * odd, which store_row's rounding to f16 / bf16 then makes the
             * correctly rounded result (as pa_store_f64) */
            const bool odd = p->dtype != PA_F32;
            for (int j = 0; j < half; j++) {
                const int i0 = p->rotary_interleaved ? 2 * j : j;
                const int i1 = p->rotary_interleaved ? 2 * j + 1 : j + half;
                const double x0 = x[i0], x1 = x[i1];
                const double v0 = x0 * c[j] - x1 * sn[j], v1 = x0 * sn[j] + x1 * c[j];
                y[i0] = odd ? f32_odd(v0) : (float)v0;
                y[i1] = odd ? f32_odd(v1) : (float)v1;
            }
            store_row(p->dst, p->dtype, (r * H + h) * (int64_t)D, y, D);
        }
    }
}

pa_status pa_cpu_gather_rows(pa_threadpool *pool, const pa_rows_problem *p) {
    pa_threadpool_run(pool, (p->rows + GATHER_ROWS - 1) / GATHER_ROWS, gather_item, (void *)p);
    return PA_OK;
}
