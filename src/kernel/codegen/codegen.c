/* codegen.c — em_codegen: picks the code generator for a target name: "c" (the CPU target, c.c),
 * "cuda" (CUDA C++ for NVRTC), "opencl" (OpenCL C) and "glsl" (GLSL compute for Vulkan), the last
 * three sharing the SPMD emitter of spmd.c. */
#include <string.h>

#include "kernel/codegen/codegen.h"

typedef char *(*codegen_fn)(const em_ir_kernel *const *ks, size_t n, const em_caps *caps);

static const struct {
    const char *name; /* target name */
    codegen_fn fn;    /* its generator */
} targets[] = {
    {"c", em_codegen_c},
    {"cuda", em_codegen_cuda},
    {"opencl", em_codegen_opencl},
    {"glsl", em_codegen_glsl},
};

char *em_codegen(const char *target, const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    if (!target) {
        em_set_error(EM_ERR_INVALID, "em_codegen: no target named");
        return NULL;
    }
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        if (strcmp(target, targets[i].name) == 0) return targets[i].fn(ks, n, caps);
    em_set_error(EM_ERR_UNSUPPORTED,
                 "unknown code generation target '%s' (known: c, cuda, opencl, glsl)", target);
    return NULL;
}
