/* codegen.c — em_codegen: picks the code generator for a target name. The CPU target ("c") is
 * built; the GPU targets are named here so that asking for one gives a clear "not built yet"
 * until their generators land (cuda.c, opencl.c, glsl.c). */
#include <string.h>

#include "kernel/codegen/codegen.h"

static const char *const planned[] = {"cuda", "opencl", "glsl"};

char *em_codegen(const char *target, const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    if (!target) {
        em_set_error(EM_ERR_INVALID, "em_codegen: no target named");
        return NULL;
    }
    if (strcmp(target, "c") == 0) return em_codegen_c(ks, n, caps);
    for (size_t i = 0; i < sizeof planned / sizeof planned[0]; i++) {
        if (strcmp(target, planned[i]) == 0) {
            em_set_error(EM_ERR_UNSUPPORTED, "target '%s' is not built yet", target);
            return NULL;
        }
    }
    em_set_error(EM_ERR_UNSUPPORTED, "unknown code generation target '%s' (known: c, cuda, opencl, glsl)",
                 target);
    return NULL;
}
