/* cuda_tma.h — the CUDA code generator's PTX for the language's tensor memory accelerator
 * builtins (cuda_tma.c; lowered by src/kernel/lang/lower_tma.c). */
#ifndef EMBER_KERNEL_CODEGEN_CUDA_TMA_H
#define EMBER_KERNEL_CODEGEN_CUDA_TMA_H

#include "kernel/codegen/spmd.h"

/* Emits intrinsic `in`, named "cuda.tma.load:DST,BAR,MAP@DST", "cuda.tma.acquire:MAP@MAP" or
 * "cuda.tma.fence_async"
 * (`what`: the name after "cuda.tma."), for an sm_90a device; writes "(void)0" to sb. */
void em_cuda_tma(em_spmd *e, const em_ir_inst *in, const char *what, em_strbuf *sb);

#endif
