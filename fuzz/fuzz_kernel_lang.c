/* fuzz_kernel_lang.c — a libFuzzer target over the whole kernel-language front end: each input is
 * loaded as a module (lexer, parser, resolver); when it loads, every kernel is checked with its
 * defaults and specialized again for a CUDA-like target with lines of 4, the diagnostics are
 * formatted, and everything is freed. Any crash, hang, leak or sanitizer report is a bug. Built
 * by fuzz/CMakeLists.txt when the compiler is clang; CTest runs it for 60 seconds over the
 * built-in kernels and fuzz/corpus/kernel_lang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ember/lang.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 16)) return 0;
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    em_lang_diags *d = em_lang_diags_new();
    em_lang_module *m = em_lang_module_from_string("fuzz.ek", src, d);
    if (m) {
        em_lang_check(m, d);
        em_caps caps = {0};
        strcpy(caps.target, "cuda");
        caps.plane_ops = caps.print = true;
        em_lang_bind binds[] = {em_lang_bind_text("F", "f16"), em_lang_bind_text("N", "3")};
        em_lang_spec spec = {binds, 2, 4, &caps};
        for (size_t i = 0; i < em_lang_kernel_count(m); i++) {
            em_ir_kernel *k = em_lang_specialize(m, em_lang_kernel_name(m, i), &spec, d);
            em_ir_kernel_free(k);
        }
    }
    char *text = em_lang_diags_format(d);
    free(text);
    em_lang_module_free(m);
    em_lang_diags_free(d);
    free(src);
    return 0;
}
