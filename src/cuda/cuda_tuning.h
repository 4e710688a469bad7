/*
 * cuda_tuning.h -- the CUDA backend's tuning struct (pa_cuda_tuning, in
 * pagedattn_lab.h): its defaults, its fields' ranges and the check of a
 * whole struct. Pure code: the device reads the environment once when it
 * opens (cuda_device.c), the planner only reads the struct.
 */
#ifndef PA_CUDA_TUNING_H
#define PA_CUDA_TUNING_H

#include "../core/internal.h"

/* The defaults (kernel_dir and nvrtc_options empty). */
void pa_cuda_tuning_set_defaults(pa_cuda_tuning *out);
/* PA_OK, or PA_ERR_ARGUMENT naming the first field out of its range. */
pa_status pa_cuda_tuning_check(pa_context *ctx, const pa_cuda_tuning *t);
/* The words of an NVRTC options text (at most PA_NVRTC_EXTRA of them, else
 * -1): what nvrtc_options and $PAGEDATTN_NVRTC_OPTIONS may hold. */
#define PA_NVRTC_EXTRA 16
int pa_nvrtc_option_words(const char *text);

int pa_cuda_tuning_field_count_impl(void);
const pa_tuning_field *pa_cuda_tuning_field_impl(int index);

#endif /* PA_CUDA_TUNING_H */
