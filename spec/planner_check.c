/*
 * spec/planner_check.c -- the CUDA backend's planner on the host
 * (spec/planner_spec.lua builds and runs it; CI has no GPU, and the planner
 * is host code). It links with the library's objects (src/cuda/cuda_planner.h
 * is the planner's interface) and
 *
 * 1. plans random problems with pa_plan_rule and pa_plan_items: random query
 * tiles (empty ones too), key-stage sizes, page-id caps, head tiles,
 * capacities, split models, guided pieces, claims, forced chunks and
 * num_splits. For each it checks what the kernels rely on:
 *   - counting (no items) and writing give the same list, rows and counters;
 *   - each tile's items are consecutive, splits 0..n-1 of n, its sequence
 *     and query tile; an empty tile is one empty item at its start;
 *   - fixed pieces cover the tile's keys exactly, in order, none empty, none
 *     over the page-id cap, all but the last whole key stages;
 *   - claiming splits start their static stages claim_keys apart from the
 *     tile's start and end at its end, and the tile is long enough for them;
 *   - a split tile's counters follow the previous ones (twice as many with
 *     claims), and the total is the plan's;
 *   - a sequence with a split tile has partial rows for its widest split,
 *     placed after the previous such sequences; the total is the plan's;
 *   - pa_plan_order's list (claiming splits reordered split-major) holds
 *     the same items as pa_plan_items', each once;
 *   - the warp-a-tile blocks run persistent on the shapes where that was
 *     measured faster, and only there (pa_hw_persist_pays).
 * 2. plans whole calls with pa_cuda_plan_make, the kernels' facts from
 * spec/fake_kernels.h, and checks the kernel each chooses and how it cuts
 * the work, with the tuning at its defaults and with fields set: the checks
 * that specs once made by turning a missed heuristic into an error of the
 * library (claims, a warp a head tile, eight-warp blocks, short and long
 * sequences as two launches), now here (choice_checks below); and on random
 * calls, that every kernel a plan launches is one pa_cuda_plan_variants lists
 * for its shape (what scripts/precompile.lua compiles ahead).
 * 3. checks the variant table's catalog: each name parses and names back the
 * same, none twice, every kind; and the partial rules the planner asks.
 * Usage: planner_check SEED PROBLEMS. Prints "N problems, M items: ok", or
 * the first violation (and exits 1).
 */
#include "../src/cuda/cuda_launch.h"
#include "../src/cuda/cuda_planner.h"
#include "../src/cuda/cuda_tuning.h"
#include "fake_kernels.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t rs;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static int64_t ri(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* (an order of work items, to compare two lists as sets: memcmp, pa_work has no padding) */
_Static_assert(sizeof(pa_work) == 3 * 8 + 10 * 4, "pa_work: padding would make memcmp compare garbage");
static int by_item(const void *a, const void *b) { return memcmp(a, b, sizeof(pa_work)); }

static int problem;
#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("problem %d: %s: ", problem, #cond);                      \
            printf(__VA_ARGS__);                                             \
            printf("\n");                                                    \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* ---- 2. whole calls: the kernel chosen and how the work is cut ---- */

/* A call: B sequences of q[b] queries over k[b] keys, H / Hk heads of dim D,
 * pages of `page` tokens (0: a contiguous cache), causal or not. */
typedef struct call {
    pa_attn_problem p;
    int32_t *sq, *sk, *num_new, *append_pos, *bt;
    int64_t *q_start, *lse_start, *new_row;
} call;

static void call_make(call *c, int B, const int32_t *q, const int32_t *k, pa_dtype dt, int H, int Hk, int D, int page,
                      bool causal) {
    memset(c, 0, sizeof *c);
    c->sq = calloc((size_t)B, 4);
    c->sk = calloc((size_t)B, 4);
    c->num_new = calloc((size_t)B, 4);
    c->append_pos = calloc((size_t)B, 4);
    c->q_start = calloc((size_t)B, 8);
    c->lse_start = calloc((size_t)B, 8);
    c->new_row = calloc((size_t)B, 8);
    int32_t max_k = 1, max_q = 0;
    int64_t total_q = 0;
    for (int b = 0; b < B; b++) {
        if (q[b] > max_q) max_q = q[b];
        c->sq[b] = q[b];
        c->sk[b] = k[b];
        c->q_start[b] = total_q;
        c->lse_start[b] = total_q * H;
        total_q += q[b];
        if (k[b] > max_k) max_k = k[b];
    }
    pa_attn_problem *p = &c->p;
    p->dtype = dt;
    p->cache_dtype = dt;
    p->batch = B;
    p->heads = H;
    p->kv_heads = Hk;
    p->group = H / Hk;
    p->head_dim = D;
    p->total_q = total_q;
    p->max_seqlen_q = max_q;
    p->max_seqlen_k = max_k;
    p->q = p->out = p->k_cache = p->v_cache = (void *)(uintptr_t)0x100000;
    p->scale = 1.0f;
    p->window_left = -1;
    p->window_right = causal ? 0 : -1;
    p->causal = causal;
    p->paged = page > 0;
    p->page_size = page > 0 ? page : max_k;
    const int64_t width = page > 0 ? (max_k + page - 1) / page : 1;
    p->num_pages = page > 0 ? width * B : B;
    if (page > 0) {
        c->bt = calloc((size_t)(width * B), 4);
        for (int64_t i = 0; i < width * B; i++) c->bt[i] = (int32_t)((i * 7919) % (width * B));
        p->block_table = c->bt;
        p->h_block_table = c->bt;
        p->bt_stride = width;
    }
    p->h_seqlen_q = c->sq;
    p->h_seqlen_k = c->sk;
    p->h_num_new = c->num_new;
    p->h_append_pos = c->append_pos;
    p->h_q_start = c->q_start;
    p->h_lse_start = c->lse_start;
    p->h_new_start_row = c->new_row;
    p->lse_head_stride = total_q;
}

static void call_free(call *c) {
    free(c->sq);
    free(c->sk);
    free(c->num_new);
    free(c->append_pos);
    free(c->q_start);
    free(c->lse_start);
    free(c->new_row);
    free(c->bt);
}

/* the kernels' facts: spec/fake_kernels.h; their names kept until the end */
static char *names[4096];
static int nnames;
static pa_status fake_load(void *user, pa_context *ctx, const char *variant, pa_cuda_loaded *out) {
    (void)user;
    (void)ctx;
    out->name = NULL;
    for (int i = 0; i < nnames && !out->name; i++)
        if (strcmp(names[i], variant) == 0) out->name = names[i];
    if (!out->name) {
        CHECK(nnames < 4096, "too many variants");
        out->name = names[nnames++] = strdup(variant);
    }
    out->module = NULL;
    fake_info(variant, out->info);
    return PA_OK;
}
static pa_status fake_occupancy(void *user, pa_context *ctx, const pa_cuda_loaded *k, const char *entry, int threads,
                                int smem, void **fn, int *blocks) {
    (void)user;
    (void)ctx;
    (void)entry;
    *fn = (void *)k->name;
    *blocks = fake_blocks_per_sm(k->name, threads, smem, 0);
    return PA_OK;
}
static const pa_cuda_kernels fake = {NULL, fake_load, fake_occupancy};
static const pa_cuda_caps H100 = {132, 9, 227 * 1024, true, true, true};
static const pa_cuda_caps A100 = {108, 8, 163 * 1024, false, true, true};

static const char *check_name;
#define EXPECT(cond, ...)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("%s: %s: ", check_name, #cond);                           \
            printf(__VA_ARGS__);                                             \
            printf("\n");                                                    \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

/* Every variant a default-tuning plan launches is among those
 * pa_cuda_plan_variants lists for its shape (what scripts/precompile.lua
 * compiles ahead). */
typedef struct listed {
    char names[64][160];
    int n;
} listed;
static void list_one(void *user, const char *name) {
    listed *l = user;
    if (l->n < 64) snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
}
static void expect_listed(const call *c, const pa_cuda_caps *caps, const pa_cuda_plan *plan) {
    pa_cuda_tuning t;
    pa_cuda_tuning_set_defaults(&t);
    listed *l = calloc(1, sizeof *l);
    for (int i = 0; i < plan->nparts; i++) {
        /* (a decode part's query tile is its sequences' longest, rounded up: the same kernel) */
        const pa_kernel_shape shape = {c->p.dtype, c->p.head_dim, c->p.heads, c->p.kv_heads,
                                       c->p.paged ? c->p.page_size : 0,
                                       plan->parts[i].kind == PA_PART_DECODE ? plan->parts[i].kp.q_tile : 9,
                                       c->p.softcap > 0.f || c->p.alibi || !(c->p.scale > 0.f), c->p.rotary_cos != NULL,
                                       pa_dtype_is_fp8(c->p.cache_dtype) ? (int32_t)c->p.cache_dtype : 0};
        l->n = 0;
        EXPECT(pa_cuda_plan_variants(NULL, &shape, &t, caps, list_one, l) == PA_OK, "variants");
        bool found = false;
        for (int j = 0; j < l->n; j++) found = found || strcmp(l->names[j], plan->parts[i].kp.variant) == 0;
        EXPECT(found, "%s is not among the %d variants listed for its shape", plan->parts[i].kp.variant, l->n);
    }
    free(l);
}

/* Plans a call of B sequences of q queries and k keys (each), with tuning
 * t (NULL: the defaults); the plan stays for the caller's checks. */
static void plan_of(const char *name, call *c, const pa_cuda_caps *caps, const pa_cuda_tuning *t, pa_cuda_plan *plan) {
    check_name = name;
    pa_cuda_tuning d;
    pa_cuda_tuning_set_defaults(&d);
    pa_context *ctx = NULL;
    EXPECT(pa_context_create(&ctx) == PA_OK, "context");
    const pa_status st = pa_cuda_plan_make(ctx, &c->p, caps, t ? t : &d, &fake, plan);
    EXPECT(st == PA_OK, "%s", pa_context_error(ctx));
    pa_context_destroy(ctx);
    if (!t) expect_listed(c, caps, plan);
}

static bool has(const pa_plan_part *pt, const char *what) { return strstr(pt->kp.variant, what) != NULL; }

/* Uniform batches: B sequences of q queries and k keys. */
static void uniform(call *c, int B, int32_t q, int32_t k, pa_dtype dt, int D, int page, bool causal) {
    int32_t *qs = malloc(4 * (size_t)B), *ks = malloc(4 * (size_t)B);
    for (int b = 0; b < B; b++) {
        qs[b] = q;
        ks[b] = k;
    }
    call_make(c, B, qs, ks, dt, 32, 8, D, page, causal);
    free(qs);
    free(ks);
}

/* fp8 prefill over a 16-bit copy (cuda_dequant.c), c: 4 x 2048 causal bf16
 * queries over fp8 pages of 16: wanted on Hopper by default; p16 is the call
 * over the copy (entry (b, j) -> page b * width + j, scale 1), whose plan
 * runs on prefill_ws; the key counts and the table go in the upload, the
 * copies in the scratch. Not wanted with prefill_fp8 0, on an A100, for
 * decodes, for contiguous caches; not taken past prefill_fp8_max_mb. */
static void dequant_checks(call *c) {
    pa_cuda_tuning d;
    pa_cuda_tuning_set_defaults(&d);
    check_name = "fp8 prefill over a 16-bit copy";
    EXPECT(d.prefill_fp8 == 1, "prefill_fp8 defaults to 1");
    EXPECT(pa_cuda_dequant_wanted(&c->p, &H100, &d), "wanted on Hopper");
    EXPECT(!pa_cuda_dequant_wanted(&c->p, &A100, &d), "not on an A100");
    d.prefill_fp8 = 0;
    EXPECT(!pa_cuda_dequant_wanted(&c->p, &H100, &d), "not with prefill_fp8 0");
    d.prefill_fp8 = 1;
    pa_attn_problem q = c->p;
    q.max_seqlen_q = 1;
    EXPECT(!pa_cuda_dequant_wanted(&q, &H100, &d), "not for decodes");
    q = c->p;
    q.paged = false;
    EXPECT(!pa_cuda_dequant_wanted(&q, &H100, &d), "not for contiguous caches");
    pa_context *ctx = NULL;
    EXPECT(pa_context_create(&ctx) == PA_OK, "context");
    pa_dequant_plan dq;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && dq.on, "%s", pa_context_error(ctx));
    const pa_attn_problem *p16 = &dq.p16;
    EXPECT(dq.width == 128 && p16->num_pages == 4 * 128 && p16->bt_stride == 128 && p16->cache_dtype == PA_BF16 &&
               p16->k_scale == 1.f && p16->v_scale == 1.f && !p16->k_scales && !p16->v_scales,
           "width %d, pages %lld", dq.width, (long long)p16->num_pages);
    for (int i = 0; i < 4 * 128; i++) EXPECT(p16->h_block_table[i] == i, "the copy's table at %d: %d", i, p16->h_block_table[i]);
    EXPECT(dq.copy_bytes == (size_t)4 * 128 * 16 * 8 * 128 * 2, "copy bytes %zu", dq.copy_bytes);
    pa_cuda_plan plan;
    const pa_status st = pa_cuda_plan_make(ctx, p16, &H100, &d, &fake, &plan);
    EXPECT(st == PA_OK, "%s", pa_context_error(ctx));
    EXPECT(pa_cuda_dequant_fits(&plan) && has(&plan.parts[0], "prefill_ws dtype=bf16 D=128") &&
               !has(&plan.parts[0], "kv="),
           "%s", plan.parts[0].kp.variant);
    const size_t up = plan.upload_bytes, scratch = plan.scratch_bytes;
    pa_cuda_dequant_layout(&dq, &c->p, &plan);
    EXPECT(dq.upload_off >= up && dq.upload_off % 256 == 0 && plan.upload_bytes == dq.upload_off + (4 + 4 * 128) * 4,
           "upload %zu at %zu of %zu", up, dq.upload_off, plan.upload_bytes);
    EXPECT(dq.scratch_off >= scratch && plan.scratch_bytes >= dq.scratch_off + 2 * dq.copy_bytes, "scratch");
    char *host = calloc(plan.upload_bytes, 1);
    pa_cuda_dequant_write(&dq, &c->p, host);
    const int32_t *at = (const int32_t *)(host + dq.upload_off);
    for (int b = 0; b < 4; b++) EXPECT(at[b] == 2048, "key count %d: %d", b, at[b]);
    for (int i = 0; i < 4 * 128; i++) EXPECT(at[4 + i] == i, "uploaded table at %d", i);
    free(host);
    pa_cuda_plan_free(&plan);
    pa_cuda_dequant_free(&dq);
    /* a sequence shorter than the rest: the width is the longest's pages */
    c->sk[2] = 100;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && dq.on && dq.width == 128, "width %d", dq.width);
    pa_cuda_dequant_free(&dq);
    c->sk[2] = 2048;
    /* the copy's cap: 2 x 16 MiB here (4 x 128 pages of 16 keys x 8 x 128 x 2 bytes) */
    EXPECT(d.prefill_fp8_max_mb == 1024, "prefill_fp8_max_mb defaults to 1024");
    d.prefill_fp8_max_mb = 32;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && dq.on, "a copy of 32 MiB fits 32");
    pa_cuda_dequant_free(&dq);
    d.prefill_fp8_max_mb = 31;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && !dq.on && !dq.h_table, "a copy of 32 MiB past 31");
    pa_cuda_dequant_free(&dq);
    d.prefill_fp8_max_mb = 1024;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && dq.on && !dq.f8, "prefill_fp8 1: no tiles");
    pa_cuda_dequant_free(&dq);
    /* prefill_fp8 = 2: the e4m3 tensor cores (prefill_f8) take the parts of
     * the plan on prefill_ws (as cuda_attention.c plans it: forced), with
     * the call's scales, over tiles of 128 keys (16 a sequence here, 16 KB a
     * tile, K's and V^T's); not with softcap (natural units) */
    d.prefill_fp8 = 2;
    c->p.k_scale = 0.5f;
    c->p.v_scale = 0.25f;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && dq.on && dq.f8 && dq.ntile == 16 &&
               dq.tile_bytes == (size_t)4 * 8 * 16 * 16384,
           "tiles: %d, %zu bytes", dq.ntile, dq.tile_bytes);
    pa_cuda_tuning ws = d;
    ws.prefill_kernel = 1;
    EXPECT(pa_cuda_plan_make(ctx, &dq.p16, &H100, &ws, &fake, &plan) == PA_OK, "%s", pa_context_error(ctx));
    EXPECT(pa_cuda_dequant_fits(&plan), "fits");
    EXPECT(pa_cuda_dequant_f8(ctx, &fake, &d, &c->p, &dq, &plan) == PA_OK && dq.f8, "%s", pa_context_error(ctx));
    for (int i = 0; i < plan.nparts; i++) {
        const pa_kernel_plan *kp = &plan.parts[i].kp;
        EXPECT(has(&plan.parts[i], "prefill_f8 dtype=bf16 D=128 gt=") && has(&plan.parts[i], " stages=4 kv=fp8_e") &&
                   has(&plan.parts[i], pa_dtype_name(c->p.cache_dtype)) &&
                   strcmp(kp->entry, "pa_prefill_f8") == 0 && kp->threads == 384 && kp->tma_rows == 0 &&
                   plan.parts[i].boxes0 == -1,
               "part %d: %s | %s", i, kp->variant, kp->entry);
    }
    EXPECT(dq.copy_bytes == dq.tile_bytes && dq.p16.k_scale == 0.5f && dq.p16.v_scale == 0.25f &&
               pa_cuda_dequant_grid(&dq, 4) == 4 * 8 * 16 && strcmp(pa_cuda_dequant_entry(&dq), "pa_f8_tiles") == 0,
           "the tiles and the call's scales");
    pa_cuda_plan_free(&plan);
    pa_cuda_dequant_free(&dq);
    c->p.softcap = 30.f;
    EXPECT(pa_cuda_dequant_problem(ctx, &c->p, &d, &dq) == PA_OK && dq.on && !dq.f8, "softcap: the copy");
    pa_cuda_dequant_free(&dq);
    c->p.softcap = 0.f;
    c->p.k_scale = c->p.v_scale = 1.f;
    d.prefill_fp8 = 1;
    pa_context_destroy(ctx);
}

/* ---- 3. the variant table's catalog ---- */

static void catalog_checks(void) {
    check_name = "catalog";
    pa_context *ctx = NULL;
    EXPECT(pa_context_create(&ctx) == PA_OK, "context");
    const int n = pa_cuda_kernel_catalog_size();
    int per_kind[PA_VK_COUNT] = {0};
    /* (168: decode_mma's block modes with 16-bit and with fp8 caches) */
    EXPECT(n >= 70 && n <= 200, "%d variants", n);
    for (int i = 0; i < n; i++) {
        const char *name = pa_cuda_kernel_catalog_name(i);
        pa_variant v;
        EXPECT(pa_variant_parse(ctx, name, &v) == PA_OK, "%s: %s", name, pa_context_error(ctx));
        char again[192];
        EXPECT(pa_variant_name(&v, again, sizeof again) && strcmp(again, name) == 0, "%s names back as %s", name, again);
        for (int j = 0; j < i; j++) EXPECT(strcmp(pa_cuda_kernel_catalog_name(j), name) != 0, "%s twice", name);
        per_kind[v.kind]++;
    }
    for (int k = 0; k < PA_VK_COUNT; k++) EXPECT(per_kind[k] > 0, "no %s variant", pa_variant_kind_name((pa_vkind)k));
    EXPECT(pa_cuda_kernel_catalog_name(n) == NULL && pa_cuda_kernel_catalog_name(-1) == NULL, "out of range");
    /* kv, the caches' dtype: left out of a name at its default, parsed as such */
    {
        pa_variant a;
        EXPECT(pa_variant_parse(ctx, "fallback dtype=bf16", &a) == PA_OK && a.v[PA_KEY_KV] == 0, "kv's default");
        EXPECT(pa_variant_parse(ctx, "fallback dtype=bf16 kv=fp8_e5m2", &a) == PA_OK && a.v[PA_KEY_KV] == PA_FP8_E5M2,
               "kv=fp8_e5m2");
        char d[PA_KEY_COUNT][PA_VARIANT_DEFINE_LEN];
        EXPECT(pa_variant_defines(&a, d) == 2 && strcmp(d[1], "-DPA_KV=5") == 0, "kv's define");
        EXPECT(pa_variant_parse(ctx, "fallback dtype=bf16 kv=bf16", &a) == PA_ERR_ARGUMENT, "kv=bf16");
        EXPECT(pa_variant_parse(ctx, "decode_mma dtype=bf16 D=96 nq=1 gt=4 page=16 stages=3 maxp=1024 kpw=8 persist=0 "
                                     "minb=1 hw=0 nw=4 kv=fp8_e4m3", &a) == PA_ERR_ARGUMENT &&
                   strstr(pa_context_error(ctx), "fp8 caches (kv=) at D 64 or 128"),
               "decode_mma fp8 at D 96: %s", pa_context_error(ctx));
        EXPECT(pa_variant_parse(ctx, "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0 tma=2 kv=fp8_e4m3", &a) ==
                   PA_ERR_ARGUMENT, "prefill_ws takes no kv");
    }
    /* the rules, partially set: what the planner asks */
    pa_variant v = pa_variant_of(PA_VK_DECODE_MMA);
    pa_variant_set(pa_variant_set(&v, PA_KEY_D, 96), PA_KEY_KPW, 16);
    EXPECT(!pa_variant_allows(&v), "kpw 16 at head dim 96");
    pa_variant_set(&v, PA_KEY_D, 256); /* (the tensor-core rule reads dtype too: not set, not asked) */
    EXPECT(pa_variant_allows(&v), "kpw 16 at head dim 256, dtype unset");
    pa_variant w = pa_variant_of(PA_VK_PREFILL_WS);
    pa_variant_set(&w, PA_KEY_D, 128);
    EXPECT(pa_variant_clamp(&w, PA_KEY_STAGES, 8) == 3 && pa_variant_clamp(&w, PA_KEY_STAGES, 2) == 2, "ws stages");
    pa_variant_set(&w, PA_KEY_D, 64);
    EXPECT(pa_variant_clamp(&w, PA_KEY_STAGES, 8) == 4, "ws stages at 64");
    w = pa_variant_of(PA_VK_PREFILL_WGMMA);
    EXPECT(pa_variant_clamp(&w, PA_KEY_STAGES, 2) == 3, "wgmma stages");
    EXPECT(pa_variant_key_max(PA_VK_DECODE, PA_KEY_NQ) == 8 && pa_variant_key_max(PA_VK_PREFILL, PA_KEY_GT) == 16,
           "maxima");
    EXPECT(pa_variant_page_key(false, 7) == PA_PAGE_CONTIG && pa_variant_page_key(true, 48) == PA_PAGE_ANY &&
               pa_variant_page_key(true, 64) == 64 && pa_variant_page_key(true, 1 << 21) == PA_PAGE_ANY,
           "page keys");
    pa_context_destroy(ctx);
}

static void choice_checks(void) {
    call c;
    pa_cuda_plan plan;
    pa_cuda_tuning t;
    problem = -2;

    /* decode of long sequences: persistent blocks of eight warps where their
     * shared memory fits; four where it does not (A100) or decode_wide 0 */
    uniform(&c, 64, 1, 4096, PA_BF16, 128, 16, false);
    plan_of("decode 64 x 4096", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 1 && has(&plan.parts[0], "decode_mma ") && has(&plan.parts[0], "persist=1") &&
               has(&plan.parts[0], "nw=8") && plan.parts[0].blocks <= plan.parts[0].kp.capacity,
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_wide = 0;
    plan_of("decode 64 x 4096, decode_wide 0", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "persist=1") && has(&plan.parts[0], "nw=4"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    t.decode_wide = 2;
    plan_of("decode 64 x 4096 on an A100, decode_wide 2", &c, &A100, &t, &plan);
    EXPECT(has(&plan.parts[0], "persist=1") && has(&plan.parts[0], "nw=4"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    t.decode_max_blocks = 5;
    plan_of("decode 64 x 4096, decode_max_blocks 5", &c, &H100, &t, &plan);
    EXPECT(plan.parts[0].kp.persistent && plan.parts[0].blocks == 5, "%lld blocks", (long long)plan.parts[0].blocks);
    pa_cuda_plan_free(&plan);
    /* over an fp8 cache: four warps unless decode_wide 2 (eight measured slower there) */
    c.p.cache_dtype = PA_FP8_E4M3;
    plan_of("decode 64 x 4096, e4m3 cache", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "kv=fp8_e4m3") && has(&plan.parts[0], "persist=1") && has(&plan.parts[0], "nw=4"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_wide = 2;
    plan_of("decode 64 x 4096, e4m3 cache, decode_wide 2", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "kv=fp8_e4m3") && has(&plan.parts[0], "nw=8"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    c.p.cache_dtype = c.p.dtype;
    call_free(&c);
    /* eight warps at any length with decode_wide 2 (four by default at 512 keys) */
    uniform(&c, 64, 1, 512, PA_BF16, 128, 16, false);
    plan_of("decode 64 x 512", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "persist=1") && has(&plan.parts[0], "nw=4"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_wide = 2;
    plan_of("decode 64 x 512, decode_wide 2", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "persist=1") && has(&plan.parts[0], "nw=8"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);

    /* few long paged sequences: one block a unit, the splits claim their
     * keys; not with decode_claim 0, nor where a split is under claim_min */
    uniform(&c, 8, 1, 32768, PA_BF16, 128, 16, false);
    plan_of("decode 8 x 32768", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 1 && has(&plan.parts[0], "persist=0") && plan.parts[0].rule.claims &&
               plan.parts[0].part_rows > 0,
           "%s claims %d", plan.parts[0].kp.variant, plan.parts[0].rule.claims);
    EXPECT(plan.parts[0].ncounters == 2 * 8 * 8 && plan.ncounters == plan.parts[0].ncounters,
           "%lld counters", (long long)plan.parts[0].ncounters);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_persist = 0;
    t.split_chunk = 1024;
    t.decode_claim_min = 0;
    plan_of("decode 8 x 32768, chunks of 1024, claim_min 0", &c, &H100, &t, &plan);
    EXPECT(plan.parts[0].rule.claims && plan.parts[0].rule.base == 1024, "claims %d, base %lld",
           plan.parts[0].rule.claims, (long long)plan.parts[0].rule.base);
    pa_cuda_plan_free(&plan);
    t.decode_claim = 0;
    plan_of("decode 8 x 32768, decode_claim 0", &c, &H100, &t, &plan);
    EXPECT(!plan.parts[0].rule.claims && plan.parts[0].part_rows > 0, "claims %d", plan.parts[0].rule.claims);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_claim_min = 16384;
    plan_of("decode 8 x 32768, claim_min 16384", &c, &H100, &t, &plan);
    EXPECT(!plan.parts[0].rule.claims, "claims %d", plan.parts[0].rule.claims);
    pa_cuda_plan_free(&plan);
    /* over an fp8 cache: fixed ranges unless decode_claim 2 (claims measured slower there) */
    c.p.cache_dtype = PA_FP8_E5M2;
    plan_of("decode 8 x 32768, e5m2 cache", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "kv=fp8_e5m2") && has(&plan.parts[0], "persist=0") && !plan.parts[0].rule.claims &&
               plan.parts[0].part_rows > 0,
           "%s claims %d", plan.parts[0].kp.variant, plan.parts[0].rule.claims);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_claim = 2;
    plan_of("decode 8 x 32768, e5m2 cache, decode_claim 2", &c, &H100, &t, &plan);
    EXPECT(plan.parts[0].rule.claims, "claims %d", plan.parts[0].rule.claims);
    pa_cuda_plan_free(&plan);
    c.p.cache_dtype = c.p.dtype;
    call_free(&c);
    /* contiguous caches keep fixed ranges */
    uniform(&c, 8, 1, 32768, PA_BF16, 128, 0, false);
    plan_of("decode 8 x 32768 contiguous", &c, &H100, NULL, &plan);
    EXPECT(!plan.parts[0].rule.claims && plan.parts[0].part_rows > 0, "claims %d", plan.parts[0].rule.claims);
    pa_cuda_plan_free(&plan);
    call_free(&c);

    /* short and long sequences: two launches, the short ones' started in the
     * long ones' tail on sm_90 */
    {
        int32_t q[576], k[576];
        for (int b = 0; b < 576; b++) {
            q[b] = 1;
            k[b] = b < 64 ? 4096 : 64;
        }
        call_make(&c, 576, q, k, PA_BF16, 32, 8, 128, 16, false);
    }
    plan_of("decode 64 x 4096 + 512 x 64", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 2 && plan.parts[0].key_lo == 256 && plan.parts[1].key_hi == 256 && plan.parts[1].overlap &&
               !plan.parts[0].overlap && plan.parts[0].nwork + plan.parts[1].nwork == plan.nwork,
           "%d parts", plan.nparts);
    EXPECT(plan.parts[1].kp.short_kernel && !plan.parts[1].kp.persistent, "%s", plan.parts[1].kp.variant);
    pa_cuda_plan_free(&plan);
    plan_of("decode 64 x 4096 + 512 x 64 on an A100", &c, &A100, NULL, &plan);
    EXPECT(plan.nparts == 2 && !plan.parts[1].overlap, "%d parts", plan.nparts);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_split_short = 0;
    plan_of("decode 64 x 4096 + 512 x 64, decode_split_short 0", &c, &H100, &t, &plan);
    EXPECT(plan.nparts == 1, "%d parts", plan.nparts);
    pa_cuda_plan_free(&plan);
    t.decode_split_short = 1;
    t.decode_overlap = 0;
    plan_of("decode 64 x 4096 + 512 x 64, decode_overlap 0", &c, &H100, &t, &plan);
    EXPECT(plan.nparts == 2 && !plan.parts[1].overlap, "%d parts", plan.nparts);
    pa_cuda_plan_free(&plan);
    call_free(&c);

    /* units of 256-511 keys: a warp a head tile, 16 keys a warp; not with
     * decode_hw 0; persistent with decode_hw_persist 2 */
    {
        int32_t q[240], k[240];
        for (int b = 0; b < 240; b++) {
            q[b] = 1;
            k[b] = 256 + (b * 37) % 256;
        }
        call_make(&c, 240, q, k, PA_BF16, 32, 8, 128, 16, false);
    }
    plan_of("decode 240 x 256-511", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 1 && has(&plan.parts[0], "kpw=16") && has(&plan.parts[0], "hw=1") &&
               has(&plan.parts[0], "persist=0") && plan.parts[0].blocks * 4 == plan.parts[0].nwork * 8,
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_hw = 0;
    plan_of("decode 240 x 256-511, decode_hw 0", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "hw=0") && has(&plan.parts[0], "persist=1"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_hw_persist = 2;
    plan_of("decode 240 x 256-511, decode_hw_persist 2", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "hw=1") && has(&plan.parts[0], "persist=1") && plan.parts[0].kp.persistent,
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    /* under half a wave of warp-a-tile blocks: not by default, yes with decode_hw 2 */
    uniform(&c, 20, 1, 300, PA_BF16, 128, 16, false);
    plan_of("decode 20 x 300", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "hw=0") && has(&plan.parts[0], "persist=0"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_hw = 2;
    plan_of("decode 20 x 300, decode_hw 2", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "hw=1"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);

    /* decode kernels by dtype and tuning: CUDA cores for f32 and with
     * decode_kernel simt, the fallback kernel with fallback 1 */
    uniform(&c, 4, 1, 1000, PA_F32, 128, 16, false);
    plan_of("decode f32", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "decode dtype=f32 D=128 nq=1 gt=4 page=16 stages=3 maxp=1024"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 4, 2, 1000, PA_BF16, 96, 0, false);
    pa_cuda_tuning_set_defaults(&t);
    t.decode_kernel = 1;
    plan_of("decode D 96, decode_kernel simt", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "decode dtype=bf16 D=96 nq=2 gt=4 page=contig stages=4 maxp=1024"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.fallback = 1;
    plan_of("decode, fallback 1", &c, &H100, &t, &plan);
    EXPECT(plan.nparts == 1 && plan.parts[0].kind == PA_PART_FALLBACK && has(&plan.parts[0], "fallback dtype=bf16"),
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);

    /* fp8 caches: decode_mma at head dims 64 and 128 (4 stages at 16 keys a
     * warp), the CUDA-core decode at other multiples of 16 and for f32 q,
     * the fallback elsewhere; prefill on mma.sync (the Hopper kernels read
     * 16-bit caches: dequant_checks plans the 16-bit copy); the append on its
     * 16-byte path where the 16-bit append's rules allow */
    uniform(&c, 64, 1, 4096, PA_BF16, 128, 16, false);
    c.p.cache_dtype = PA_FP8_E4M3;
    plan_of("decode fp8 e4m3", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "decode_mma dtype=bf16 D=128 nq=1 gt=4 page=16 stages=4") &&
               has(&plan.parts[0], " kv=fp8_e4m3") && has(&plan.parts[0], "persist=1"),
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    c.p.total_new = 64;
    c.p.k_new = c.p.v_new = (void *)(uintptr_t)0x200000;
    plan_of("decode fp8 e4m3 with an append", &c, &H100, NULL, &plan);
    EXPECT(plan.append && plan.append_new8, "the fp8 append (no rotary) takes pa_append_new8");
    pa_cuda_plan_free(&plan);
    c.p.k_new = c.p.v_new = (void *)(uintptr_t)0x200008;
    plan_of("decode fp8 e4m3 with an append from rows 8-byte aligned", &c, &H100, NULL, &plan);
    EXPECT(plan.append && !plan.append_new8, "the fp8 append from rows not 16-byte aligned takes pa_append");
    c.p.k_new = c.p.v_new = (void *)(uintptr_t)0x200000;
    pa_cuda_plan_free(&plan);
    c.p.cache_dtype = PA_BF16;
    plan_of("decode bf16 with an append", &c, &H100, NULL, &plan);
    EXPECT(plan.append && plan.append_new8, "the bf16 append takes pa_append_new8");
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 4, 2, 1000, PA_F16, 96, 16, false);
    c.p.cache_dtype = PA_FP8_E5M2;
    plan_of("decode fp8 e5m2 D 96", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "decode dtype=f16 D=96 nq=2 gt=4 page=16 stages=4 maxp=1024 kv=fp8_e5m2"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 4, 1, 1000, PA_F32, 256, 0, false);
    c.p.cache_dtype = PA_FP8_E4M3;
    plan_of("decode fp8 f32 q", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "decode dtype=f32 D=256") && has(&plan.parts[0], "kv=fp8_e4m3"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 4, 1, 1000, PA_BF16, 40, 16, false);
    c.p.cache_dtype = PA_FP8_E4M3;
    plan_of("decode fp8 D 40", &c, &H100, NULL, &plan);
    EXPECT(plan.parts[0].kind == PA_PART_FALLBACK && has(&plan.parts[0], "fallback dtype=bf16 kv=fp8_e4m3"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 4, 2048, 2048, PA_BF16, 128, 16, true);
    c.p.cache_dtype = PA_FP8_E5M2;
    plan_of("prefill fp8", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 1 && has(&plan.parts[0], "prefill dtype=bf16 D=128 gt=4 page=16 stages=2 natural=0 minb=2 "
                                                   "kv=fp8_e5m2"),
           "%s", plan.parts[0].kp.variant);
    EXPECT(!pa_cuda_dequant_fits(&plan), "mma.sync over fp8 is not the Hopper kernels");
    pa_cuda_plan_free(&plan);
    dequant_checks(&c);
    call_free(&c);

    /* the cascade's shared level (256 decodes' queries over a 4096-token
     * prefix, unmasked: 64 query tiles, half a wave): alone, wgmma split over
     * a wave; on lane 1 beside the suffix level (cascade_overlap), planned
     * for cascade_share percent of a wave: split over that share, or
     * prefill_ws unsplit where the tiles fill it; cascade_overlap 0 as alone */
    {
        pa_cuda_tuning_set_defaults(&t);
        EXPECT(t.cascade_overlap == 1 && t.cascade_share == 25, "cascade_overlap %d, cascade_share %d",
               t.cascade_overlap, t.cascade_share);
        static const struct {
            const char *name;
            int lane, overlap, share; /* (share 0: the default) */
            const char *kernel;
            long long min_blocks, max_blocks;
        } cases[] = {
            {"shared level alone", 0, 1, 0, "prefill_wgmma", 67, 132},
            {"shared level on lane 1", 1, 1, 0, "prefill_ws", 64, 64},
            {"shared level on lane 1, share 50", 1, 1, 50, "prefill_wgmma", 64, 64},
            {"shared level on lane 1, cascade_overlap 0", 1, 0, 0, "prefill_wgmma", 67, 132},
        };
        uniform(&c, 1, 256, 4096, PA_BF16, 128, 16, false);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            pa_cuda_tuning_set_defaults(&t);
            t.cascade_overlap = cases[i].overlap;
            if (cases[i].share) t.cascade_share = cases[i].share;
            c.p.lane = cases[i].lane;
            const bool defaults = cases[i].lane == 0 && cases[i].overlap == 1 && !cases[i].share;
            plan_of(cases[i].name, &c, &H100, defaults ? NULL : &t, &plan); /* (NULL: also checks the listing) */
            const long long blocks = (long long)plan.parts[0].nwork * plan.parts[0].kp.head_tiles;
            EXPECT(plan.nparts == 1 && has(&plan.parts[0], cases[i].kernel) && blocks >= cases[i].min_blocks &&
                       blocks <= cases[i].max_blocks,
                   "%s, %lld blocks", plan.parts[0].kp.variant, blocks);
            pa_cuda_plan_free(&plan);
        }
        call_free(&c);
    }

    /* prefill on Hopper: prefill_ws with page boxes (paged) or boxes of 64
     * columns (contiguous); wgmma where TMA does not apply or the tiles do
     * not fill the GPU; mma.sync elsewhere */
    uniform(&c, 4, 2048, 2048, PA_BF16, 128, 16, true);
    plan_of("prefill 4 x 2048", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 1 && has(&plan.parts[0], "prefill_ws dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0 tma=2") &&
               plan.parts[0].kp.tma_rows == 16 && plan.parts[0].boxes0 == 0 && plan.nboxed == plan.nwork &&
               plan.parts[0].part_rows == 0,
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.prefill_page_boxes = 0;
    t.prefill_first_boxes = 0;
    plan_of("prefill 4 x 2048, page boxes 0", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "tma=1") && plan.parts[0].boxes0 < 0, "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    t.prefill_tma = 0;
    plan_of("prefill 4 x 2048, tma 0", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "prefill_wgmma dtype=bf16 D=128 gt=4 page=16 stages=3 natural=0"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    t.prefill_kernel = 1;
    plan_of("prefill 4 x 2048, tma 0, kernel ws", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "prefill_ws") && has(&plan.parts[0], "tma=0") && plan.parts[0].kp.tma_rows == 0, "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.prefill_kernel = 3;
    t.prefill_stages = 8;
    plan_of("prefill 4 x 2048, kernel mma, stages 8", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "prefill dtype=bf16 D=128 gt=4 page=16 stages=4 natural=0 minb=2"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    t.prefill_kernel = 0;
    plan_of("prefill 4 x 2048, stages 8", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "prefill_ws") && has(&plan.parts[0], "stages=3"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    plan_of("prefill 4 x 2048 on an A100", &c, &A100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "prefill dtype=bf16 D=128 gt=4 page=16 stages=2 natural=0 minb=2"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 1, 8192, 8192, PA_BF16, 128, 0, true);
    plan_of("prefill 8192 contiguous", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "prefill_ws") && has(&plan.parts[0], "page=contig") && has(&plan.parts[0], "tma=1") &&
               plan.parts[0].kp.tma_rows == 128 && plan.parts[0].boxes0 < 0,
           "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 4, 2048, 2048, PA_BF16, 128, 8, true);
    plan_of("prefill at page 8", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "prefill_wgmma") && has(&plan.parts[0], "page=8"), "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 1, 64, 4096, PA_BF16, 128, 16, true);
    plan_of("prefill of two query tiles", &c, &H100, NULL, &plan);
    EXPECT(has(&plan.parts[0], "prefill_wgmma") && plan.parts[0].part_rows > 0, "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    pa_cuda_tuning_set_defaults(&t);
    t.prefill_kernel = 1;
    plan_of("prefill of two query tiles, kernel ws", &c, &H100, &t, &plan);
    EXPECT(has(&plan.parts[0], "prefill_ws") && plan.parts[0].part_rows == 0, "%s", plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    uniform(&c, 2, 40, 100, PA_F32, 64, 16, true);
    plan_of("prefill f32", &c, &H100, NULL, &plan);
    EXPECT(plan.parts[0].kind == PA_PART_FALLBACK && has(&plan.parts[0], "fallback dtype=f32"), "%s",
           plan.parts[0].kp.variant);
    pa_cuda_plan_free(&plan);
    call_free(&c);
    /* a mixed varlen batch: each part on its kernel */
    {
        int32_t q[6] = {512, 1, 1, 300, 1, 1}, k[6] = {4608, 4096, 4096, 4396, 4096, 4096};
        call_make(&c, 6, q, k, PA_BF16, 32, 8, 128, 16, true);
    }
    plan_of("mixed batch", &c, &H100, NULL, &plan);
    EXPECT(plan.nparts == 2 && plan.parts[0].kind == PA_PART_DECODE && plan.parts[1].kind == PA_PART_PREFILL &&
               plan.parts[1].work0 == plan.parts[0].nwork,
           "%d parts", plan.nparts);
    pa_cuda_plan_free(&plan);
    call_free(&c);

    /* random calls: every kernel a default plan launches is listed for its
     * shape (pa_cuda_plan_variants, what scripts/precompile.lua compiles) */
    static const int dims[] = {128, 64, 256, 96, 80, 40, 32, 16, 8};
    static const int pages[] = {16, 1, 3, 8, 32, 256, 0};
    static const int lens[] = {1, 33, 64, 100, 256, 300, 511, 1024, 4096, 32768};
    for (int i = 0; i < 400; i++) {
        const int B = (int)ri(1, rnd() % 4 ? 64 : 700), G = (int)(1u << ri(0, 3)), Hk = (int)ri(1, 8);
        int32_t *q = malloc(4 * (size_t)B), *k = malloc(4 * (size_t)B);
        const int32_t qa = (int32_t)(rnd() % 3 ? ri(1, 8) : ri(9, 700)), ka = lens[rnd() % 10], kb = lens[rnd() % 10];
        for (int b = 0; b < B; b++) {
            q[b] = rnd() % 4 ? qa : (int32_t)ri(1, 12);
            k[b] = rnd() % 3 ? ka : kb;
        }
        call_make(&c, B, q, k, (pa_dtype)(rnd() % 3), G * Hk, Hk, dims[rnd() % 9], pages[rnd() % 7], rnd() & 1);
        if (rnd() % 3 == 0) c.p.cache_dtype = rnd() % 2 ? PA_FP8_E4M3 : PA_FP8_E5M2; /* fp8 caches */
        char label[64];
        snprintf(label, sizeof label, "random call %d", i);
        plan_of(label, &c, rnd() % 3 ? &H100 : &A100, NULL, &plan);
        pa_cuda_plan_free(&plan);
        call_free(&c);
        free(q);
        free(k);
    }

    /* the tuning's check names the field */
    check_name = "tuning check";
    pa_context *ctx = NULL;
    EXPECT(pa_context_create(&ctx) == PA_OK, "context");
    pa_cuda_tuning_set_defaults(&t);
    EXPECT(pa_cuda_tuning_check(ctx, &t) == PA_OK, "defaults: %s", pa_context_error(ctx));
    t.decode_kpw = 12;
    EXPECT(pa_cuda_tuning_check(ctx, &t) == PA_ERR_ARGUMENT && strstr(pa_context_error(ctx), "decode_kpw: 12"),
           "%s", pa_context_error(ctx));
    pa_cuda_tuning_set_defaults(&t);
    t.decode_stages = 1;
    EXPECT(pa_cuda_tuning_check(ctx, &t) == PA_ERR_ARGUMENT && strstr(pa_context_error(ctx), "decode_stages: 1"),
           "%s", pa_context_error(ctx));
    pa_cuda_tuning_set_defaults(&t);
    t.split_waves = 0;
    EXPECT(pa_cuda_tuning_check(ctx, &t) == PA_ERR_ARGUMENT && strstr(pa_context_error(ctx), "split_waves: 0"),
           "%s", pa_context_error(ctx));
    pa_cuda_tuning_set_defaults(&t);
    memset(t.kernel_dir, 'x', sizeof t.kernel_dir);
    EXPECT(pa_cuda_tuning_check(ctx, &t) == PA_ERR_ARGUMENT && strstr(pa_context_error(ctx), "kernel_dir: longer"),
           "%s", pa_context_error(ctx));
    pa_context_destroy(ctx);
    for (int i = 0; i < nnames; i++) free(names[i]);
}

int main(int argc, char **argv) {
    rs = argc > 1 ? strtoull(argv[1], NULL, 10) * 2654435761u + 88172645463325252ull : 88172645463325252ull;
    const int problems = argc > 2 ? atoi(argv[2]) : 2000;
    long long items_total = 0;
    for (problem = 0; problem < problems; problem++) {
        const int B = (int)ri(1, problem % 10 == 0 ? 2000 : 64);
        pa_attn_problem p;
        memset(&p, 0, sizeof p);
        p.batch = B;
        p.paged = rnd() & 1;
        p.page_size = 16;
        p.window_left = p.window_right = -1;
        p.num_splits = rnd() % 4 == 0 ? (int32_t)ri(1, 2000) : 0;
        int32_t *sq = malloc(4 * (size_t)B), *sk = malloc(4 * (size_t)B);
        int64_t *qs = malloc(8 * (size_t)B), *ls = malloc(8 * (size_t)B);
        pa_tile_range *tiles = malloc(sizeof *tiles * 2 * (size_t)B);
        const int maxk = (int)(rnd() % 3 == 0 ? ri(1, 200) : rnd() % 2 ? ri(1, 5000) : ri(1, 300000));
        int64_t ntiles = 0;
        for (int b = 0; b < B; b++) {
            sq[b] = (int32_t)ri(1, 4);
            sk[b] = (int32_t)(rnd() % 2 ? maxk : ri(0, maxk));
            qs[b] = (int64_t)b * 4;
            ls[b] = (int64_t)b * 100;
            const int nt = (int)ri(1, 2);
            for (int i = 0; i < nt; i++) {
                const int32_t lo = rnd() % 5 == 0 ? 0 : (int32_t)ri(0, sk[b] / 2);
                tiles[ntiles++] = (pa_tile_range){b, i, lo, rnd() % 9 == 0 ? lo : sk[b]};
            }
        }
        p.h_seqlen_q = sq;
        p.h_seqlen_k = sk;
        p.h_q_start = qs;
        p.h_lse_start = ls;
        pa_kernel_plan kp;
        memset(&kp, 0, sizeof kp);
        static const int toks[] = {8, 16, 64, 128, 3};
        kp.tokens = toks[rnd() % 5];
        kp.max_chunk = rnd() % 3 == 0 ? 0 : (int)(ri(1, 1000) * kp.tokens);
        kp.head_tiles = (int)ri(1, 16);
        kp.capacity = (int)ri(1, 600);
        kp.tail_splits = rnd() & 1;
        kp.guided = rnd() % 5 == 0;
        kp.claim = rnd() & 1;
        kp.claim_stages = (int)ri(4, 10);
        kp.no_split = rnd() % 6 == 0;
        kp.persistent = rnd() & 1;
        pa_cuda_tuning tu;
        pa_cuda_tuning_set_defaults(&tu);
        const int32_t chunk = (int32_t)ri(1, 5000);
        if (rnd() % 8 == 0) tu.split_chunk = chunk;
        if (rnd() % 8 == 0) tu.decode_claim_min = 100;
        const int64_t claim_min = tu.decode_claim_min;

        pa_work_rule r;
        pa_plan_rule(&p, &kp, &tu, tiles, ntiles, &r);
        int64_t rows0, counters0, rows, counters;
        const int64_t n = pa_plan_items(&p, &kp, &r, tiles, ntiles, NULL, &rows0, &counters0);
        pa_work *items = calloc((size_t)n + 1, sizeof *items);
        CHECK(pa_plan_items(&p, &kp, &r, tiles, ntiles, items, &rows, &counters) == n,
              "items counted and written differ");
        CHECK(rows == rows0 && counters == counters0, "rows %lld / %lld, counters %lld / %lld", (long long)rows,
              (long long)rows0, (long long)counters, (long long)counters0);

        int64_t i = 0, next_counter = 0, next_row = 0;
        int32_t seq = -1, seq_ns = 1;
        int64_t seq_first = 0;
        for (int64_t t = 0; t <= ntiles; t++) {
            if (t == ntiles || tiles[t].b != seq) { /* the previous sequence's partial rows */
                for (int64_t j = seq_first; j < i; j++)
                    CHECK(items[j].part_row == (seq_ns > 1 ? next_row : 0), "sequence %d: part_row %lld, want %lld",
                          seq, (long long)items[j].part_row, (long long)(seq_ns > 1 ? next_row : 0));
                if (seq >= 0 && seq_ns > 1) next_row += (int64_t)seq_ns * sq[seq];
                if (t == ntiles) break;
                seq = tiles[t].b;
                seq_ns = 1;
                seq_first = i;
            }
            const pa_tile_range tr = tiles[t];
            const int64_t len = tr.hi - tr.lo;
            CHECK(i < n, "tile %lld has no items", (long long)t);
            const int32_t ns = items[i].nsplit;
            CHECK(ns >= 1 && i + ns <= n, "tile %lld: %d splits", (long long)t, ns);
            if (ns > seq_ns) seq_ns = ns;
            const bool claimed = r.claims && ns > 1;
            if (ns > 1) {
                CHECK(items[i].counter == next_counter, "tile %lld: counter %d, want %lld", (long long)t,
                      items[i].counter, (long long)next_counter);
                next_counter += (r.claims ? 2 : 1) * kp.head_tiles;
            }
            if (claimed)
                CHECK(len >= ns * r.claim_keys && len >= ns * claim_min, "tile %lld: %lld keys for %d claiming splits",
                      (long long)t, (long long)len, ns);
            int64_t pos = tr.lo;
            for (int32_t s = 0; s < ns; s++, i++) {
                const pa_work *w = &items[i];
                CHECK(w->split == s && w->nsplit == ns && w->b == tr.b && w->i0 == tr.i0, "tile %lld: item %d of %d",
                      (long long)t, s, ns);
                CHECK(w->seqlen_q == sq[tr.b] && w->seqlen_k == sk[tr.b] && w->q_start == qs[tr.b] &&
                          w->lse_start == ls[tr.b], "tile %lld: the sequence's facts", (long long)t);
                if (len == 0) {
                    CHECK(ns == 1 && w->k0 == tr.lo && w->k1 == tr.lo, "empty tile %lld: [%d, %d)", (long long)t,
                          w->k0, w->k1);
                } else if (claimed) {
                    CHECK(w->k0 == tr.lo + s * r.claim_keys && w->k1 == tr.hi, "tile %lld split %d: [%d, %d)",
                          (long long)t, s, w->k0, w->k1);
                } else {
                    const int64_t piece = w->k1 - w->k0;
                    CHECK(w->k0 == pos && piece > 0, "tile %lld split %d: [%d, %d) after %lld", (long long)t, s, w->k0,
                          w->k1, (long long)pos);
                    CHECK(kp.max_chunk == 0 || piece <= kp.max_chunk, "tile %lld split %d: %lld keys over the cap %d",
                          (long long)t, s, (long long)piece, kp.max_chunk);
                    CHECK(s == ns - 1 || piece % kp.tokens == 0, "tile %lld split %d: %lld keys, stages of %d",
                          (long long)t, s, (long long)piece, kp.tokens);
                    pos = w->k1;
                }
            }
            if (len > 0 && !claimed) CHECK(pos == tr.hi, "tile %lld: covered to %lld of %d", (long long)t, (long long)pos,
                                           tr.hi);
        }
        CHECK(i == n, "%lld items past the last tile", (long long)(n - i));
        CHECK(next_counter == counters, "counters %lld, want %lld", (long long)counters, (long long)next_counter);
        CHECK(next_row == rows, "partial rows %lld, want %lld", (long long)rows, (long long)next_row);
        /* pa_plan_order: the same items (a permutation) */
        pa_plan_part pt;
        memset(&pt, 0, sizeof pt);
        pt.kp = kp;
        pt.rule = r;
        pt.tiles = tiles;
        pt.ntiles = ntiles;
        pt.nwork = n;
        pa_work *order = calloc((size_t)n + 1, sizeof *order), *sorted = calloc((size_t)n + 1, sizeof *sorted);
        void *scratch = malloc(pa_plan_order_scratch(n, B));
        pa_plan_order(&p, &pt, true, true, scratch, order);
        free(scratch);
        memcpy(sorted, items, sizeof *items * (size_t)n);
        qsort(sorted, (size_t)n, sizeof *sorted, by_item);
        qsort(order, (size_t)n, sizeof *order, by_item);
        CHECK(memcmp(sorted, order, sizeof *order * (size_t)n) == 0, "pa_plan_order's items are not the plan's");
        free(sorted);
        free(order);
        items_total += n;
        free(items);
        free(sq);
        free(sk);
        free(qs);
        free(ls);
        free(tiles);
    }
    /* The warp-a-tile blocks' persistence (pa_hw_persist_pays) on the shapes
     * measured for it (docs/planner.md): B x L at 32 query
     * heads over 8 kv heads (eight head tiles a sequence, four a block),
     * 132 SMs, 3 stages, 16 keys a warp at two blocks a SM, 8 at three */
    problem = -1;
    static const struct { int kpw, split, seqs, keys; bool pays; } hwp[] = {
        {16, 0, 512, 128, true},  {16, 0, 2048, 128, true}, {16, 0, 384, 128, true}, {16, 0, 1024, 256, true},
        {16, 0, 512, 96, false},  {16, 0, 512, 112, false}, {16, 0, 128, 128, false}, {16, 0, 200, 128, false},
        {16, 0, 256, 256, false}, {16, 2, 1024, 128, false}, {16, 1, 1024, 128, true}, {8, 0, 2048, 64, false},
    };
    for (size_t i = 0; i < sizeof hwp / sizeof hwp[0]; i++) {
        const bool pays = pa_hw_persist_pays(hwp[i].kpw, 3, hwp[i].kpw == 16 ? 2 : 3, hwp[i].split, hwp[i].keys,
                                          (int64_t)hwp[i].seqs * 8 / 4, 132);
        CHECK(pays == hwp[i].pays, "pa_hw_persist_pays at %d keys a warp, split %d, %d x %d: %d, measured %d",
              hwp[i].kpw, hwp[i].split, hwp[i].seqs, hwp[i].keys, pays, hwp[i].pays);
    }
    choice_checks();
    catalog_checks();
    printf("%d problems, %lld items: ok\n", problems, items_total);
    return 0;
}
