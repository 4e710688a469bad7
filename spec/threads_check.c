/*
 * spec/threads_check.c -- the threading rule of pagedattn.h, under
 * ThreadSanitizer: one context per thread, and read-only inputs (caches,
 * block tables, seqlens, q) shared between threads that attend at the same
 * time. Built with -fsanitize=thread together with the library's sources by
 * spec/hardening_spec.lua; TSan reports any write to shared state (the caches'
 * mirror flag was one) and the two threads' outputs must match one thread's.
 * Prints "2 threads x N calls: same outputs" on success.
 */
#include "pagedattn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALLS 6
#define B 3
#define H 4
#define HK 2
#define D 16
#define PAGE 4
#define PAGES 24
#define WIDTH 6

typedef struct shared {
    pa_device *dev;
    pa_tensor *q, *k_cache, *v_cache, *block_table, *seqlens;
} shared;

typedef struct job {
    const shared *sh;
    int sq;           /* queries a sequence: 1 (decode) or several (prefill form) */
    float out[B * 8 * H * D];
    int failed;
} job;

static void *attend(void *arg) {
    job *j = arg;
    const shared *sh = j->sh;
    pa_context *ctx = NULL;
    pa_tensor *out = NULL, *q = NULL;
    if (pa_context_create(&ctx)) return (void *)1;
    const int64_t qshape[4] = {B, j->sq, H, D};
    if (pa_tensor_create(ctx, sh->dev, PA_F32, 4, qshape, &out) ||
        pa_tensor_create(ctx, sh->dev, PA_F32, 4, qshape, &q) || pa_tensor_fill_randn(ctx, q, 7)) {
        fprintf(stderr, "setup: %s\n", pa_context_error(ctx));
        j->failed = 1;
    }
    for (int c = 0; c < CALLS && !j->failed; c++) {
        pa_attention_params p;
        pa_attention_params_init(&p);
        p.q = j->sq == 1 ? sh->q : q;
        p.k_cache = sh->k_cache;
        p.v_cache = sh->v_cache;
        p.block_table = sh->block_table;
        p.cache_seqlens = sh->seqlens;
        p.causal = 1;
        p.num_splits = c % 3;
        p.out = out;
        if (pa_attention_with_kvcache(ctx, &p)) {
            fprintf(stderr, "attention: %s\n", pa_context_error(ctx));
            j->failed = 1;
        }
    }
    if (!j->failed && pa_tensor_read(ctx, out, 0, j->out, (int64_t)B * j->sq * H * D)) j->failed = 1;
    pa_tensor_destroy(out);
    pa_tensor_destroy(q);
    pa_context_destroy(ctx);
    return NULL;
}

static int run(const char *device) {
    pa_context *ctx = NULL;
    shared sh = {0};
    if (pa_context_create(&ctx) || pa_device_open(ctx, device, &sh.dev)) {
        fprintf(stderr, "%s: %s\n", device, ctx ? pa_context_error(ctx) : "no context");
        return 1;
    }
    const int64_t cshape[4] = {PAGES, PAGE, HK, D}, qshape[4] = {B, 1, H, D};
    const int64_t btshape[2] = {B, WIDTH}, sshape[1] = {B};
    int32_t bt[B * WIDTH], lens[B] = {21, 1, 9};
    for (int i = 0; i < B * WIDTH; i++) bt[i] = (i * 7 + 3) % PAGES; /* duplicates across rows */
    if (pa_tensor_create(ctx, sh.dev, PA_F32, 4, cshape, &sh.k_cache) ||
        pa_tensor_create(ctx, sh.dev, PA_F32, 4, cshape, &sh.v_cache) ||
        pa_tensor_create(ctx, sh.dev, PA_F32, 4, qshape, &sh.q) ||
        pa_tensor_create(ctx, sh.dev, PA_I32, 2, btshape, &sh.block_table) ||
        pa_tensor_create(ctx, sh.dev, PA_I32, 1, sshape, &sh.seqlens) ||
        pa_tensor_fill_randn(ctx, sh.k_cache, 1) || pa_tensor_fill_randn(ctx, sh.v_cache, 2) ||
        pa_tensor_fill_randn(ctx, sh.q, 3) || pa_tensor_write(ctx, sh.block_table, 0, bt, B * WIDTH) ||
        pa_tensor_write(ctx, sh.seqlens, 0, lens, B)) {
        fprintf(stderr, "%s: setup: %s\n", device, pa_context_error(ctx));
        return 1;
    }
    int bad = 0;
    for (int sq = 1; sq <= 5 && !bad; sq += 4) {
        static job one, two[2];
        memset(&one, 0, sizeof one);
        one.sh = &sh;
        one.sq = sq;
        attend(&one); /* the expected outputs, from one thread alone */
        pthread_t t[2];
        for (int i = 0; i < 2; i++) {
            memset(&two[i], 0, sizeof two[i]);
            two[i].sh = &sh;
            two[i].sq = sq;
            pthread_create(&t[i], NULL, attend, &two[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        const size_t n = (size_t)B * sq * H * D * sizeof(float);
        for (int i = 0; i < 2; i++)
            if (one.failed || two[i].failed || memcmp(one.out, two[i].out, n) != 0) {
                fprintf(stderr, "%s: sq %d: thread %d's output differs from one thread's\n", device, sq, i);
                bad = 1;
            }
    }
    pa_tensor_destroy(sh.q);
    pa_tensor_destroy(sh.k_cache);
    pa_tensor_destroy(sh.v_cache);
    pa_tensor_destroy(sh.block_table);
    pa_tensor_destroy(sh.seqlens);
    pa_device_release(sh.dev);
    pa_context_destroy(ctx);
    return bad;
}

int main(void) {
    if (run("cpu") || run("cpu:staged")) return 1;
    printf("2 threads x %d calls: same outputs (cpu, cpu:staged)\n", CALLS);
    return 0;
}
