/* threadpool.c -- workers sleep on a condition variable between jobs, spin
 * briefly first so that back-to-back decode steps do not pay a wake-up each. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

struct pa_threadpool {
    int nthreads;
    pthread_t *threads;
    pthread_mutex_t run_lock; /* one job at a time */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    /* the current job */
    pa_parallel_fn fn;
    void *arg;
    int64_t n;
    atomic_llong next;
    atomic_uint generation;
    int busy; /* workers still inside the current job (under lock) */
    int stop;
};

typedef struct {
    pa_threadpool *pool;
    int id;
} worker_arg;

static void work(pa_threadpool *pool, int id) {
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (i >= pool->n) break;
        pool->fn(pool->arg, i, id);
    }
}

static void *worker_main(void *p) {
    worker_arg wa = *(worker_arg *)p;
    free(p);
    pa_threadpool *pool = wa.pool;
    unsigned seen = 0;
    for (;;) {
        /* spin a little: a new job usually follows soon */
        for (int spin = 0; spin < 20000; spin++) {
            if (atomic_load_explicit(&pool->generation, memory_order_acquire) != seen) break;
            if ((spin & 255) == 255) sched_yield();
        }
        pthread_mutex_lock(&pool->lock);
        while (!pool->stop && atomic_load(&pool->generation) == seen)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        seen = atomic_load(&pool->generation);
        pthread_mutex_unlock(&pool->lock);

        work(pool, wa.id);

        pthread_mutex_lock(&pool->lock);
        if (--pool->busy == 0) pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->lock);
    }
}

pa_threadpool *pa_threadpool_create(int nthreads) {
    if (nthreads < 1) nthreads = 1;
    pa_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->nthreads = nthreads;
    pthread_mutex_init(&pool->run_lock, NULL);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!pool->threads) {
        free(pool);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            pool->nthreads = i;
            break;
        }
        wa->pool = pool;
        wa->id = i;
        if (pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->nthreads = i; /* run with the workers we got */
            break;
        }
    }
    return pool;
}

void pa_threadpool_destroy(pa_threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->nthreads; i++) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool->threads);
    free(pool);
}

int pa_threadpool_size(const pa_threadpool *pool) { return pool->nthreads; }

void pa_threadpool_run(pa_threadpool *pool, int64_t n, pa_parallel_fn fn, void *arg) {
    if (n <= 0) return;
    if (pool->nthreads == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++) fn(arg, i, 0);
        return;
    }
    pthread_mutex_lock(&pool->run_lock);
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    atomic_store(&pool->next, 0);
    pool->busy = pool->nthreads - 1;
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    work(pool, 0);

    pthread_mutex_lock(&pool->lock);
    while (pool->busy > 0) pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_unlock(&pool->run_lock);
}
