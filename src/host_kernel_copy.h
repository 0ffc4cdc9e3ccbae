/* host_kernel_copy.h: one instruction-set copy of the host kernels, forward and backward.
 * host_kernels.c defines the copy's parameters (HK, HK_TARGET, HK_FMA, HK_MR, HK_NR and,
 * where the target has it, HK_F16C: see host_kernel_body.h), includes this file, and gets
 * them undefined again for the next copy. No include guard: included once per copy. */
#include "host_kernel_body.h"
#include "host_backward_body.h"
#undef HK
#undef HK_TARGET
#undef HK_FMA
#undef HK_MR
#undef HK_NR
#undef HK_F16C
