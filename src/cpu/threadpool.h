/* threadpool.h -- a small pthread pool for the CPU backend.
 *
 * Plain pthreads rather than OpenMP: libgomp loaded into LuaJIT through ffi.load
 * crashed in a worker at its first parallel region on Ubuntu 24.04 (DESIGN.md). */
#ifndef PA_THREADPOOL_H
#define PA_THREADPOOL_H

#include <stdint.h>

typedef struct pa_threadpool pa_threadpool;

/* fn(arg, item, thread) for every item in [0, n); thread in [0, nthreads). */
typedef void (*pa_parallel_fn)(void *arg, int64_t item, int thread);

/* nthreads counts the calling thread, which works too; returns NULL on failure. */
pa_threadpool *pa_threadpool_create(int nthreads);
void pa_threadpool_destroy(pa_threadpool *pool);
int pa_threadpool_size(const pa_threadpool *pool);
/* Runs items in parallel, hands them out dynamically in order, returns when all
 * are done. Calls from several threads are serialised. */
void pa_threadpool_run(pa_threadpool *pool, int64_t n, pa_parallel_fn fn, void *arg);

#endif
