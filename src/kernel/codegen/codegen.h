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

/* GPU targets (cuda.c, opencl.c, glsl.c; one shared emitter, spmd.c). Each returns malloc'd source
 * for the whole batch, or NULL with the error set (naming the instruction the target cannot
 * express); caps may be NULL (defaults: everything available). The parameter ABI of each target
 * is documented at the top of its file.
 * CUDA C++ for NVRTC: `extern "C" __global__ void NAME(...)` per kernel. */
char *em_codegen_cuda(const em_ir_kernel *const *ks, size_t n, const em_caps *caps);
/* Bytes of dynamic shared memory a CUDA kernel must be launched with (0: static shared only). */
size_t em_codegen_cuda_dynamic_smem(const em_ir_kernel *k);
/* OpenCL C (1.2 and 2.0): `__kernel void NAME(...)` per kernel. */
char *em_codegen_opencl(const em_ir_kernel *const *ks, size_t n, const em_caps *caps);
/* GLSL 450 compute shaders for Vulkan: one shader per kernel, each starting with the line
 * "//@@ember-kernel NAME" (split the batch there; the shader's entry point is main). */
char *em_codegen_glsl(const em_ir_kernel *const *ks, size_t n, const em_caps *caps);

#endif
