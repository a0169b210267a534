/* codegen.h — code generators, one per target (c.c, later cuda.c, opencl.c, glsl.c). Each turns a
 * batch of verified, simplified IR kernels into one source text for its target's compiler. */
#ifndef EM_KERNEL_CODEGEN_H
#define EM_KERNEL_CODEGEN_H
#include "ember/kernel.h"

/* C for the CPU target: one translation unit exporting emk_NAME (see c_abi.h) for every kernel.
 * caps may be NULL (defaults). Returns malloc'd source, or NULL with the error set (e.g. a
 * construct the target cannot express, naming the instruction). */
char *em_codegen_c(const em_ir_kernel *const *ks, size_t n, const em_caps *caps);

/* Dispatches on a target name ("c", ...). Unknown or not-yet-built targets get EM_ERR_UNSUPPORTED
 * with a message saying so. */
char *em_codegen(const char *target, const em_ir_kernel *const *ks, size_t n, const em_caps *caps);

#endif
