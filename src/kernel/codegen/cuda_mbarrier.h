/* cuda_mbarrier.h — the CUDA code generator's PTX for the language's shared-memory barriers and
 * setmaxnreg (cuda_mbarrier.c; lowered by src/kernel/lang/lower_mbarrier.c). */
#ifndef EMBER_KERNEL_CODEGEN_CUDA_MBARRIER_H
#define EMBER_KERNEL_CODEGEN_CUDA_MBARRIER_H

#include "kernel/codegen/spmd.h"

/* Emits intrinsic `in`, named "cuda.mbar.OP@MEM" or "cuda.setmaxnreg:ACTION,N" (`what`: the name
 * after "cuda."), for an sm_90a device; writes the result's expression or "(void)0" to sb.
 * Returns false when the name is none of these. */
bool em_cuda_mbarrier(em_spmd *e, const em_ir_inst *in, const char *what, em_strbuf *sb);

#endif
