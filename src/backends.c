/* backends.c -- the registry of backends, in order of preference: the
 * default device is the first one usable here (a GPU when there is one,
 * else the CPU). The one place that names them; the core only walks the
 * list. A new backend adds its pa_backend_reg here. */
#include "core/internal.h"

extern const pa_backend_reg pa_cuda_backend;
extern const pa_backend_reg pa_cpu_backend;

const pa_backend_reg *const pa_backends[] = {&pa_cuda_backend, &pa_cpu_backend, NULL};
