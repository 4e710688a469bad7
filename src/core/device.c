/* device.c -- opening devices by name; one shared instance per physical device. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define PA_MAX_CUDA_DEVICES 64

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pa_device *cpu_devices[2]; /* "cpu", "cpu:staged" */
static pa_device *cuda_devices[PA_MAX_CUDA_DEVICES];

static pa_device **registry_slot(pa_device_kind kind, int index) {
    return kind == PA_DEVICE_CPU ? &cpu_devices[index ? 1 : 0] : &cuda_devices[index];
}

void pa_device_retain(pa_device *dev) { atomic_fetch_add(&dev->refcount, 1); }

void pa_device_release(pa_device *dev) {
    if (!dev) return;
    pthread_mutex_lock(&registry_lock);
    if (atomic_fetch_sub(&dev->refcount, 1) == 1) {
        pa_device **slot = registry_slot(dev->kind, dev->index);
        if (*slot == dev) *slot = NULL;
        dev->ops->destroy(dev);
    }
    pthread_mutex_unlock(&registry_lock);
}

/* Parses "cpu", "cpu:staged" (index 1: the CPU reached by copies, for
 * tests), "cuda", "cuda:N". */
static pa_status parse_name(pa_context *ctx, const char *name, pa_device_kind *kind, int *index) {
    *index = 0;
    if (strcmp(name, "cpu") == 0 || strcmp(name, "cpu:staged") == 0) {
        *kind = PA_DEVICE_CPU;
        *index = name[3] == ':';
        return PA_OK;
    }
    if (strncmp(name, "cuda", 4) == 0) {
        *kind = PA_DEVICE_CUDA;
        if (name[4] == '\0') return PA_OK;
        if (name[4] == ':') {
            char *end = NULL;
            long v = strtol(name + 5, &end, 10);
            if (end != name + 5 && *end == '\0' && v >= 0 && v < PA_MAX_CUDA_DEVICES) {
                *index = (int)v;
                return PA_OK;
            }
        }
    }
    return pa_fail(ctx, PA_ERR_ARGUMENT,
                   "device: unknown device name '%s' (expected \"cpu\", \"cuda\" or \"cuda:N\")",
                   name);
}

pa_status pa_device_open(pa_context *ctx, const char *name, pa_device **out) {
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: out is NULL");
    *out = NULL;
    if (!name || !*name) name = getenv("PAGEDATTN_DEVICE");
    if (!name || !*name) {
        char why[256];
        name = pa_cuda_usable(why, sizeof why) ? "cuda" : "cpu";
    }
    pa_device_kind kind;
    int index;
    pa_status st = parse_name(ctx, name, &kind, &index);
    if (st) return st;

    pthread_mutex_lock(&registry_lock);
    pa_device **slot = registry_slot(kind, index);
    if (*slot) {
        pa_device_retain(*slot);
        *out = *slot;
    } else {
        st = kind == PA_DEVICE_CPU ? pa_cpu_device_create(ctx, index == 1, out)
                                   : pa_cuda_device_create(ctx, index, out);
        if (st == PA_OK) {
            atomic_store(&(*out)->refcount, 1);
            *slot = *out;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

pa_device_kind pa_device_get_kind(const pa_device *dev) { return dev->kind; }
int pa_device_index(const pa_device *dev) { return dev->index; }
const char *pa_device_name(const pa_device *dev) { return dev->name; }
const char *pa_device_description(const pa_device *dev) { return dev->description; }
int pa_device_num_threads(const pa_device *dev) { return dev->num_threads; }

pa_status pa_device_synchronize(pa_context *ctx, pa_device *dev) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    return dev->ops->synchronize(ctx, dev);
}

pa_status pa_device_measure_ceilings(pa_context *ctx, pa_device *dev, double seconds,
                                     pa_ceilings *out) {
    if (!dev) return pa_fail(ctx, PA_ERR_ARGUMENT, "device: NULL");
    if (!out) return pa_fail(ctx, PA_ERR_ARGUMENT, "out: NULL");
    if (!(seconds > 0 && seconds < 600))
        return pa_fail(ctx, PA_ERR_ARGUMENT, "seconds: %g is not in (0, 600)", seconds);
    memset(out, 0, sizeof *out);
    return dev->ops->measure_ceilings(ctx, dev, seconds, out);
}
