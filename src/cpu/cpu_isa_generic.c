/* cpu_isa_generic.c -- the CPU kernel for any target (4-wide vectors). */
#define ISA_SYM generic
#define ISA_NAME "generic"
#define VW 4
#define MK_RB 6
#include "cpu_kernel.inc"
