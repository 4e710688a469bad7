/*
 * spec/plan_equiv.c -- the equivalence harness of the CUDA planner: the same
 * random attention calls planned and "launched" by two builds of the CUDA
 * backend's attention code, on a stubbed driver, each writing a trace that
 * must match byte for byte (scripts/lab/plan_equiv.sh builds both and
 * compares). Built with -DEQUIV_OLD against a tree from before the planner
 * was split out (its src/cuda/cuda_attention.c alone, tuning from the
 * environment), else against this tree (cuda_attention.c, the planner, the
 * work list, the launches, the variant table, the tuning).
 *
 * The trace of a call: its status and error, the staging, scratch and counter
 * sizes asked for, the uploaded plan (every byte: sequence facts, work items
 * in launch order, first-page and first-box lists), and each launch: the
 * variant and entry, grid, block, shared bytes, programmatic or not, the
 * parameter struct's bytes, and for prefill_ws (the one kernel that takes
 * it) the TMA descriptors' inputs. Kernel facts and occupancy come from
 * spec/fake_kernels.h, salted per call.
 *
 * Usage: plan_equiv SEED CALLS > trace (a summary on stderr).
 */
#define _GNU_SOURCE
#include "cuda/cuda_internal.h"
#include "fake_kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- the stubbed driver and backend ---- */

pa_cuda_driver pa_cu;
static FILE *trace;
static unsigned salt;
static long long n_launches, n_items, n_bytes;

/* the loaded "modules" and "functions", by name (hash chains) */
typedef struct fn_rec {
    struct fn_rec *next;
    char variant[192];
    const char *entry;
} fn_rec;
typedef struct mod_rec {
    struct mod_rec *next;
    pa_kmodule *m;
} mod_rec;
#define BUCKETS 65536
static fn_rec *fns[BUCKETS];
static mod_rec *mods[BUCKETS];
static unsigned hash(const char *a, const char *b) {
    unsigned h = 2166136261u;
    for (; *a; a++) h = (h ^ (unsigned char)*a) * 16777619u;
    for (; b && *b; b++) h = (h ^ (unsigned char)*b) * 16777619u;
    return h % BUCKETS;
}

static void put(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(trace, fmt, ap);
    va_end(ap);
}

static char last_error[4096];
pa_status pa_fail(pa_context *ctx, pa_status status, const char *fmt, ...) {
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}
pa_status pa_cu_fail(pa_context *ctx, CUresult r, const char *call, const char *file, int line) {
    (void)file;
    (void)line;
    return pa_fail(ctx, PA_ERR_DEVICE, "%s failed: %d", call, r);
}
#ifdef EQUIV_OLD
bool pa_env_flag(const char *name) { /* (the older tree read a flag of the environment) */
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}
#endif

pa_status pa_cuda_module(pa_context *ctx, cuda_impl *impl, const char *variant, pa_kmodule **out) {
    (void)ctx;
    (void)impl;
    const unsigned h = hash(variant, NULL);
    for (mod_rec *r = mods[h]; r; r = r->next)
        if (strcmp(r->m->name, variant) == 0) {
            *out = r->m;
            return PA_OK;
        }
    mod_rec *r = calloc(1, sizeof *r);
    r->m = calloc(1, sizeof *r->m);
    snprintf(r->m->name, sizeof r->m->name, "%s", variant);
    fake_info(variant, r->m->info);
    r->next = mods[h];
    mods[h] = r;
    *out = r->m;
    return PA_OK;
}

pa_status pa_cuda_function(pa_context *ctx, cuda_impl *impl, pa_kmodule *m, const char *entry, int smem,
                           CUfunction *out) {
    (void)ctx;
    (void)impl;
    (void)smem;
    const unsigned h = hash(m->name, entry);
    for (fn_rec *f = fns[h]; f; f = f->next)
        if (strcmp(f->variant, m->name) == 0 && strcmp(f->entry, entry) == 0) {
            *out = (CUfunction)f;
            return PA_OK;
        }
    fn_rec *f = calloc(1, sizeof *f);
    snprintf(f->variant, sizeof f->variant, "%s", m->name);
    f->entry = entry;
    f->next = fns[h];
    fns[h] = f;
    *out = (CUfunction)f;
    return PA_OK;
}

static CUresult occupancy(int *blocks, CUfunction fn, int threads, size_t smem) {
    *blocks = fake_blocks_per_sm(((fn_rec *)fn)->variant, threads, (int)smem, salt);
    return CUDA_SUCCESS;
}

/* a descriptor: its inputs, packed (rank <= 5) */
static CUresult encode(CUtensorMap *map, int dtype, uint32_t rank, void *global, const uint64_t *dims,
                       const uint64_t *strides, const uint32_t *box, const uint32_t *elem_strides, int interleave,
                       int swizzle, int l2, int oob) {
    memset(map, 0, sizeof *map);
    uint64_t *o = map->opaque;
    o[0] = (uint64_t)dtype | (uint64_t)rank << 8 | (uint64_t)interleave << 16 | (uint64_t)swizzle << 24 |
           (uint64_t)l2 << 32 | (uint64_t)oob << 40 | (uint64_t)elem_strides[0] << 48;
    o[1] = (uint64_t)(uintptr_t)global;
    for (uint32_t i = 0; i < rank && i < 5; i++) o[2 + i] = dims[i];
    for (uint32_t i = 0; i + 1 < rank && i < 4; i++) o[7 + i] = strides[i];
    for (uint32_t i = 0; i < rank && i < 5; i++) o[11 + i / 2] |= (uint64_t)box[i] << (32 * (i % 2));
    return CUDA_SUCCESS;
}

static void record_launch(CUfunction fn, unsigned gx, unsigned bx, unsigned smem, void **params, int ex) {
    const fn_rec *f = (const fn_rec *)fn;
    const bool append = strncmp(f->entry, "pa_append", 9) == 0;
    put("launch %s | %s grid=%u block=%u smem=%u ex=%d\n", f->variant, f->entry, gx, bx, smem, ex);
    fwrite(params[0], 1, append ? sizeof(pa_append_params) : sizeof(pa_attn_params), trace);
    /* (the second parameter: read by prefill_ws only, a kernel of one parameter reads one) */
    if (strcmp(f->entry, "pa_prefill_ws") == 0) fwrite(params[1], 1, sizeof(pa_tma_maps), trace);
    if (!append) n_items += ((const pa_attn_params *)params[0])->num_work;
    n_launches++;
}
static CUresult launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned smem, CUstream stream, void **params, void **extra) {
    (void)gy, (void)gz, (void)by, (void)bz, (void)stream, (void)extra;
    record_launch(fn, gx, bx, smem, params, 0);
    return CUDA_SUCCESS;
}
static CUresult launch_ex(const CUlaunchConfig *c, CUfunction fn, void **params, void **extra) {
    (void)extra;
    record_launch(fn, c->grid_x, c->block_x, c->smem, params, 1 + c->attrs[0].id * 10);
    return CUDA_SUCCESS;
}

static unsigned char *staging;
static size_t staging_bytes;
pa_status pa_cuda_enter(pa_context *ctx, cuda_impl *impl) {
    (void)ctx, (void)impl;
    return PA_OK;
}
void pa_cuda_leave(cuda_impl *impl) { (void)impl; }
pa_status pa_cuda_staging(pa_context *ctx, cuda_impl *impl, size_t bytes, void **out, int *slot) {
    (void)ctx, (void)impl;
    free(staging);
    staging = malloc(bytes ? bytes : 1);
    memset(staging, 0xab, bytes); /* (bytes the plan does not write read alike) */
    staging_bytes = bytes;
    put("staging %zu\n", bytes);
    *out = staging;
    *slot = 0;
    return PA_OK;
}
pa_status pa_cuda_scratch(pa_context *ctx, cuda_impl *impl, size_t bytes, CUdeviceptr *out) {
    (void)ctx, (void)impl;
    put("scratch %zu\n", bytes);
    *out = 0x5000000000ull;
    return PA_OK;
}
pa_status pa_cuda_counters(pa_context *ctx, cuda_impl *impl, size_t n, CUdeviceptr *out) {
    (void)ctx, (void)impl;
    put("counters %zu\n", n);
    *out = 0x6000000000ull;
    return PA_OK;
}
pa_status pa_cuda_plan_upload(pa_context *ctx, cuda_impl *impl, int slot, size_t bytes, CUdeviceptr *dev) {
    (void)ctx, (void)impl, (void)slot;
    put("upload %zu of %zu\n", bytes, staging_bytes);
    fwrite(staging, 1, bytes, trace);
    n_bytes += (long long)bytes;
    *dev = 0x7000000000ull;
    return PA_OK;
}
pa_status pa_cuda_plan_release(pa_context *ctx, cuda_impl *impl, int slot) {
    (void)ctx, (void)impl, (void)slot;
    put("release\n");
    return PA_OK;
}
pa_status pa_cuda_timing_begin(pa_context *ctx, cuda_impl *impl) {
    (void)ctx, (void)impl;
    return PA_OK;
}
pa_status pa_cuda_timing_end(pa_context *ctx, cuda_impl *impl) {
    (void)ctx, (void)impl;
    return PA_OK;
}

/* ---- tuning: one table, as fields (this tree) or as the environment
 * variables of the tree before (EQUIV_OLD) ---- */

typedef struct setting {
    const char *env, *value;
} setting;
typedef struct config {
    bool sm90_only; /* (decode_wide 2: the older tree failed a call where eight warps did not fit) */
    setting s[8];
} config;
static const config configs[] = {
    {false, {{NULL, NULL}}},
    {false, {{"PAGEDATTN_DECODE_KPW", "8"}, {"PAGEDATTN_DECODE_STAGES", "4"}}},
    {false, {{"PAGEDATTN_DECODE_PERSIST", "0"}, {"PAGEDATTN_SPLIT_CHUNK", "1024"}, {"PAGEDATTN_DECODE_CLAIM_MIN", "0"}}},
    {false, {{"PAGEDATTN_DECODE_WIDE", "0"}, {"PAGEDATTN_DECODE_HW", "0"}, {"PAGEDATTN_DECODE_SPLIT_SHORT", "0"}}},
    {false, {{"PAGEDATTN_DECODE_HW_PERSIST", "2"}, {"PAGEDATTN_DECODE_BLOCKS", "5"},
             {"PAGEDATTN_DECODE_PERSIST_MIN_KEYS", "0"}}},
    {false, {{"PAGEDATTN_DECODE_GUIDED", "1"}, {"PAGEDATTN_DECODE_MIN_CHUNK", "64"}, {"PAGEDATTN_DECODE_GUIDE", "64"}}},
    {false, {{"PAGEDATTN_PREFILL_KERNEL", "ws"}, {"PAGEDATTN_PREFILL_PAGE_BOXES", "0"}, {"PAGEDATTN_PREFILL_ORDER", "0"},
             {"PAGEDATTN_PREFILL_STAGES", "4"}}},
    {false, {{"PAGEDATTN_PREFILL_KERNEL", "wgmma"}, {"PAGEDATTN_PREFILL_TMA", "0"}, {"PAGEDATTN_PREFILL_MINB", "1"}}},
    {false, {{"PAGEDATTN_PREFILL_KERNEL", "mma"}, {"PAGEDATTN_PREFILL_STAGES", "3"}}},
    {false, {{"PAGEDATTN_PREFILL_TMA_Q", "0"}, {"PAGEDATTN_PREFILL_TMA_O", "0"}, {"PAGEDATTN_PREFILL_FIRST_BOXES", "0"}}},
    {false, {{"PAGEDATTN_DECODE_KERNEL", "simt"}, {"PAGEDATTN_SPLIT_WAVES", "2"}, {"PAGEDATTN_DECODE_CLAIM_ORDER", "0"},
             {"PAGEDATTN_DECODE_FIRST_PAGES", "0"}, {"PAGEDATTN_DECODE_OVERLAP", "0"}}},
    {false, {{"PAGEDATTN_CUDA_FALLBACK", "1"}}},
    {false, {{"PAGEDATTN_DECODE_SHORT_KPW", "16"}, {"PAGEDATTN_DECODE_SHORT_STAGES", "4"},
             {"PAGEDATTN_DECODE_SHORT_MINB", "1"}, {"PAGEDATTN_DECODE_HW_MAX_KEYS", "100000"},
             {"PAGEDATTN_DECODE_HW_MIN_WAVES", "0"}, {"PAGEDATTN_DECODE_WIDE_MIN_KEYS", "0"},
             {"PAGEDATTN_DECODE_WIDE_MAX_UNITS", "1000"}}},
    {true, {{"PAGEDATTN_DECODE_WIDE", "2"}, {"PAGEDATTN_DECODE_CLAIM", "0"}}},
    {false, {{"PAGEDATTN_DECODE_STAGES", "2"}, {"PAGEDATTN_DECODE_SHORT_KPW", "8"}, {"PAGEDATTN_PREFILL_STAGES", "2"}}},
};
#define NCONFIGS ((int)(sizeof configs / sizeof configs[0]))

static void apply(cuda_impl *impl, const config *c) {
#ifdef EQUIV_OLD
    (void)impl;
    for (int i = 0; i < NCONFIGS; i++)
        for (int j = 0; j < 8 && configs[i].s[j].env; j++) unsetenv(configs[i].s[j].env);
    for (int j = 0; j < 8 && c->s[j].env; j++) setenv(c->s[j].env, c->s[j].value, 1);
#else
    pa_cuda_tuning *t = &impl->tuning;
    pa_cuda_tuning_set_defaults(t);
    static const struct { const char *env; size_t off; } map[] = {
#define F(env, field) {"PAGEDATTN_" env, offsetof(pa_cuda_tuning, field)}
        F("DECODE_KPW", decode_kpw), F("DECODE_STAGES", decode_stages), F("DECODE_PERSIST", decode_persist),
        F("SPLIT_CHUNK", split_chunk), F("DECODE_CLAIM_MIN", decode_claim_min), F("DECODE_WIDE", decode_wide),
        F("DECODE_HW", decode_hw), F("DECODE_SPLIT_SHORT", decode_split_short),
        F("DECODE_HW_PERSIST", decode_hw_persist), F("DECODE_BLOCKS", decode_max_blocks),
        F("DECODE_PERSIST_MIN_KEYS", decode_persist_min_keys), F("DECODE_GUIDED", decode_guided),
        F("DECODE_MIN_CHUNK", decode_min_chunk), F("DECODE_GUIDE", decode_guide),
        F("PREFILL_PAGE_BOXES", prefill_page_boxes), F("PREFILL_ORDER", prefill_order),
        F("PREFILL_STAGES", prefill_stages), F("PREFILL_TMA", prefill_tma), F("PREFILL_MINB", prefill_minb),
        F("PREFILL_TMA_Q", prefill_tma_q), F("PREFILL_TMA_O", prefill_tma_o),
        F("PREFILL_FIRST_BOXES", prefill_first_boxes), F("SPLIT_WAVES", split_waves),
        F("DECODE_CLAIM_ORDER", decode_claim_order), F("DECODE_FIRST_PAGES", decode_first_pages),
        F("DECODE_OVERLAP", decode_overlap), F("CUDA_FALLBACK", fallback), F("DECODE_SHORT_KPW", decode_short_kpw),
        F("DECODE_SHORT_STAGES", decode_short_stages), F("DECODE_SHORT_MINB", decode_short_minb),
        F("DECODE_HW_MAX_KEYS", decode_hw_max_keys), F("DECODE_HW_MIN_WAVES", decode_hw_min_waves),
        F("DECODE_WIDE_MIN_KEYS", decode_wide_min_keys), F("DECODE_WIDE_MAX_UNITS", decode_wide_max_units),
        F("DECODE_CLAIM", decode_claim),
#undef F
    };
    for (int j = 0; j < 8 && c->s[j].env; j++) {
        int32_t v = atoi(c->s[j].value);
        if (strcmp(c->s[j].env, "PAGEDATTN_DECODE_KERNEL") == 0) {
            t->decode_kernel = strcmp(c->s[j].value, "simt") == 0 ? 1 : 0;
            continue;
        }
        if (strcmp(c->s[j].env, "PAGEDATTN_PREFILL_KERNEL") == 0) {
            t->prefill_kernel = strcmp(c->s[j].value, "ws") == 0 ? 1 : strcmp(c->s[j].value, "mma") == 0 ? 3 : 2;
            continue;
        }
        size_t k = 0;
        while (k < sizeof map / sizeof map[0] && strcmp(map[k].env, c->s[j].env) != 0) k++;
        if (k == sizeof map / sizeof map[0]) {
            fprintf(stderr, "plan_equiv: no field for %s\n", c->s[j].env);
            exit(2);
        }
        memcpy((char *)t + map[k].off, &v, sizeof v);
    }
#endif
}

/* ---- random calls ---- */

static uint64_t rs;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static int64_t ri(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }
static int pick(const int *v, int n) { return v[rnd() % (unsigned)n]; }

typedef struct call {
    pa_attn_problem p;
    int32_t *sq, *sk, *num_new, *append_pos, *bt, *cbi;
    int64_t *q_start, *lse_start, *new_row;
} call;

static void call_free(call *c) {
    free(c->sq), free(c->sk), free(c->num_new), free(c->append_pos), free(c->bt), free(c->cbi);
    free(c->q_start), free(c->lse_start), free(c->new_row);
}

static void call_random(call *c) {
    memset(c, 0, sizeof *c);
    pa_attn_problem *p = &c->p;
    static const int dims[] = {128, 128, 64, 256, 96, 80, 40, 32, 16, 8, 24, 192};
    static const int groups[] = {1, 2, 4, 4, 8, 3, 5, 16, 32};
    static const int pages[] = {16, 16, 16, 1, 3, 8, 32, 64, 256, 100, 0, 0};
    const int kind = (int)(rnd() % 4); /* 0 decode, 1 prefill, 2 mixed, 3 short decode batches */
    /* (batches of thousands decode; long prefill batches stay a few: the
     * traces of both builds stay within a few GB of memory) */
    const int B = (int)(kind == 1 ? ri(1, 8) : rnd() % 20 == 0 && kind != 2 ? ri(300, 2000) : ri(1, 300));
    p->dtype = (pa_dtype)(rnd() % 5 == 0 ? PA_F32 : rnd() % 2 ? PA_BF16 : PA_F16);
    p->head_dim = pick(dims, 12);
    const int G = pick(groups, 9);
    p->kv_heads = (int)ri(1, 8);
    p->heads = p->kv_heads * G;
    p->group = G;
    p->batch = B;
    const int page = kind != 1 && rnd() % 3 == 0 ? (rnd() % 4 ? 16 : 0) : pick(pages, 12);
    p->paged = page > 0;
    c->sq = calloc((size_t)B, 4), c->sk = calloc((size_t)B, 4), c->num_new = calloc((size_t)B, 4);
    c->append_pos = calloc((size_t)B, 4), c->q_start = calloc((size_t)B, 8), c->lse_start = calloc((size_t)B, 8);
    c->new_row = calloc((size_t)B, 8);
    const int32_t maxk = (int32_t)(rnd() % 3 == 0 ? ri(1, 300) : rnd() % 2 ? ri(1, 8192) : ri(1, 70000));
    int64_t total_q = 0, total_new = 0;
    const bool with_new = rnd() % 4 == 0, dense = rnd() % 3 != 0;
    int32_t max_k = 1;
    /* a third of the calls: a serving shape (32 / 8 heads of 128 or 64, 16-token
     * pages) decoding sequences of one length or two, where every decode path runs */
    static const int lens[] = {32, 64, 100, 128, 200, 256, 300, 400, 511, 512, 1024, 2048, 4096, 8192, 32768};
    const bool serving = kind != 1 && rnd() % 3 == 0;
    const int32_t len_a = (int32_t)pick(lens, 15), len_b = (int32_t)pick(lens, 15);
    const int32_t mix = (int32_t)(rnd() % 3 == 0 ? ri(1, 99) : 0); /* percent of len_b */
    if (serving) {
        p->dtype = rnd() % 4 ? PA_BF16 : PA_F16;
        p->head_dim = rnd() % 4 ? 128 : 64;
        p->kv_heads = rnd() % 4 ? 8 : 2;
        p->group = G == 1 ? 1 : 4;
        p->heads = p->kv_heads * p->group;
    }
    for (int b = 0; b < B; b++) {
        const bool long_q = kind == 1 || (kind == 2 && rnd() % 3 == 0);
        c->sq[b] = long_q ? (int32_t)ri(9, rnd() % 4 ? 600 : 3000) : (int32_t)(kind == 3 ? 1 : ri(rnd() % 10 == 0 ? 0 : 1, 8));
        c->sk[b] = (int32_t)(rnd() % 2 ? maxk : ri(0, maxk));
        if (kind == 2 && rnd() % 2) c->sk[b] = (int32_t)ri(1, 300);
        if (serving) {
            c->sq[b] = long_q ? c->sq[b] : rnd() % 8 ? 1 : (int32_t)ri(1, 4);
            c->sk[b] = (int32_t)(rnd() % 100) < mix ? len_b : rnd() % 4 ? len_a : (int32_t)ri(len_a / 2, len_a);
        }
        if (with_new) {
            c->num_new[b] = c->sq[b] < c->sk[b] ? c->sq[b] : c->sk[b];
            c->append_pos[b] = c->sk[b] - c->num_new[b];
            c->new_row[b] = dense ? total_new : total_new + b;
            total_new += c->num_new[b];
        }
        c->q_start[b] = total_q;
        c->lse_start[b] = total_q * p->heads;
        total_q += c->sq[b];
        if (c->sk[b] > max_k) max_k = c->sk[b];
    }
    p->total_q = total_q;
    p->total_new = total_new;
    p->lse_head_stride = total_q;
    p->page_size = page > 0 ? page : max_k + (int32_t)ri(0, 5);
    if (page > 0) {
        const int64_t width = (max_k + page - 1) / page + ri(0, 3);
        p->num_pages = width * B + ri(0, 100);
        if (rnd() % 50 == 0) p->num_pages = ((int64_t)1 << 31) / page + 1; /* past TMA's int32 rows */
        c->bt = calloc((size_t)(width * B), 4);
        for (int64_t i = 0; i < width * B; i++)
            c->bt[i] = (int32_t)(rnd() % (uint64_t)(p->num_pages < INT32_MAX ? p->num_pages : INT32_MAX));
        p->bt_stride = width;
        p->block_table = (const int32_t *)0xb00000000ull; /* (a device's: the host copy is h_block_table) */
        p->h_block_table = c->bt;
    } else {
        p->num_pages = B + ri(0, 3);
        if (rnd() % 3 == 0) {
            c->cbi = calloc((size_t)B, 4);
            for (int b = 0; b < B; b++) c->cbi[b] = (int32_t)((b * 7 + 3) % p->num_pages);
            p->h_cache_batch_idx = c->cbi;
            p->cache_batch_idx = (const int32_t *)0xc00000000ull;
        }
    }
    const uintptr_t odd = rnd() % 8 == 0 ? 2 : 0;
    p->q = (void *)(0x100000000ull + odd);
    p->out = (void *)(0x200000000ull + (rnd() % 8 == 0 ? 2 : 0));
    p->k_cache = (void *)0x300000000ull;
    p->v_cache = (void *)(0x400000000ull + (rnd() % 16 == 0 ? 2 : 0));
    if (with_new) {
        p->k_new = (void *)0x500000000ull;
        p->v_new = (void *)(0x600000000ull + (rnd() % 8 == 0 ? 4 : 0));
    }
    p->lse = rnd() % 2 ? (float *)0x700000000ull : NULL;
    p->scale = rnd() % 10 == 0 ? 0.f : 0.125f;
    p->softcap = rnd() % 8 == 0 ? 30.f : 0.f;
    p->alibi = rnd() % 8 == 0 ? (const float *)0x800000000ull : NULL;
    p->alibi_batch_stride = p->alibi && rnd() % 2 ? p->heads : 0;
    p->causal = rnd() % 2;
    p->window_left = rnd() % 6 == 0 ? (int32_t)ri(0, 5000) : -1;
    p->window_right = p->causal ? 0 : rnd() % 6 == 0 ? (int32_t)ri(0, 300) : -1;
    p->num_splits = rnd() % 8 == 0 ? (int32_t)ri(1, rnd() % 2 || B > 16 ? 8 : 2000) : 0;
    if (rnd() % 3 == 0 && p->head_dim % 2 == 0) {
        p->rotary_cos = (void *)0x900000000ull;
        p->rotary_sin = (void *)0xa00000000ull;
        p->rotary_dim = rnd() % 2 ? p->head_dim : p->head_dim / 2 / 2 * 2;
        if (p->rotary_dim < 2) p->rotary_dim = 2;
        p->rotary_interleaved = rnd() % 2;
        p->rotary_dtype = p->dtype;
        p->seqlen_ro = max_k + 1;
    }
    p->rope_q_step = p->causal || p->window_left >= 0 || p->window_right >= 0;
    p->max_seqlen_k = max_k;
    p->h_seqlen_q = c->sq;
    p->h_seqlen_k = c->sk;
    p->h_num_new = c->num_new;
    p->h_append_pos = c->append_pos;
    p->h_q_start = c->q_start;
    p->h_lse_start = c->lse_start;
    p->h_new_start_row = c->new_row;
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    const int calls = argc > 2 ? atoi(argv[2]) : 5000;
    rs = seed * 2654435761u + 88172645463325252ull;
    trace = stdout;
    pa_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor = occupancy;
    pa_cu.cuLaunchKernel = launch;
    for (int i = 0; i < NCONFIGS; i++)
        for (int j = 0; j < 8 && configs[i].s[j].env; j++) unsetenv(configs[i].s[j].env);
    int failed = 0, per_config[NCONFIGS] = {0};
    for (int n = 0; n < calls; n++) {
        /* the device: H100 SXM (132 SMs), H100 PCIe (114), an sm_90 part of 78, A100 (108) */
        static const int sms[] = {132, 114, 78, 108};
        const int dev = (int)(rnd() % 4);
        cuda_impl *impl = calloc(1, sizeof *impl);
        impl->sm_count = sms[dev];
        impl->cc_major = dev == 3 ? 8 : 9;
        impl->smem_optin = dev == 3 ? 163 * 1024 : 227 * 1024;
        snprintf(impl->arch, sizeof impl->arch, "%s", dev == 3 ? "sm_80" : rnd() % 10 == 0 ? "compute_90" : "sm_90a");
        pa_cu.cuTensorMapEncodeTiled = rnd() % 20 == 0 ? NULL : encode;
        pa_cu.cuLaunchKernelEx = rnd() % 20 == 0 ? NULL : launch_ex;
        salt = (unsigned)rnd();
        int ci = rnd() % 2 ? 0 : (int)ri(1, NCONFIGS - 1);
        if (configs[ci].sm90_only && impl->smem_optin < 227 * 1024) ci = 0;
        per_config[ci]++;
        apply(impl, &configs[ci]);
        call c;
        call_random(&c);
        c.p.dev = NULL;
        put("call %d config %d sm %d %s tma %d ex %d\n", n, ci, impl->sm_count, impl->arch,
            pa_cu.cuTensorMapEncodeTiled != NULL, pa_cu.cuLaunchKernelEx != NULL);
        /* (pa_cuda_attention reads the device from the problem) */
        pa_device d;
        memset(&d, 0, sizeof d);
        d.impl = impl;
        c.p.dev = &d;
        last_error[0] = '\0';
        const pa_status st = pa_cuda_attention(NULL, &c.p);
        put("status %d %s\n", (int)st, st ? last_error : "");
        if (st) failed++;
        call_free(&c);
        free(impl);
    }
    fprintf(stderr, "plan_equiv: %d calls (%d failed alike), %lld launches, %lld work items, %lld plan bytes; "
            "calls per tuning config:", calls, failed, n_launches, n_items, n_bytes);
    for (int i = 0; i < NCONFIGS; i++) fprintf(stderr, " %d", per_config[i]);
    fprintf(stderr, "\n");
    return 0;
}
