/* cuda_backend.c -- placeholder until the CUDA backend lands (issue 4): the
 * library loads everywhere, and asking for a CUDA device says why it fails. */
#include "../core/internal.h"

#include <stdio.h>

bool pa_cuda_usable(char *why, size_t why_len) {
    snprintf(why, why_len, "this build of pagedattn has no CUDA backend yet");
    return false;
}

pa_status pa_cuda_device_create(pa_context *ctx, int index, pa_device **out) {
    (void)index;
    *out = NULL;
    char why[256];
    pa_cuda_usable(why, sizeof why);
    return pa_fail(ctx, PA_ERR_UNSUPPORTED, "device: cuda is not available: %s", why);
}
