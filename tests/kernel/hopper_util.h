/* hopper_util.h — what the kernel tests of CUDA-only language features share: the capabilities
 * of an H200-like CUDA device for a given architecture (and another target's, for refusals),
 * and "this source compiles through NVRTC" where NVRTC is installed. */
#ifndef EMBER_TESTS_KERNEL_HOPPER_UTIL_H
#define EMBER_TESTS_KERNEL_HOPPER_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/kernel.h"
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/nvrtc.h"

/* An H200's capabilities as target `target` ("cuda", "opencl", ...) reports them, with `arch`. */
static inline em_caps hopper_caps_as(const char *target, const char *arch)
{
    em_caps c;
    memset(&c, 0, sizeof c);
    snprintf(c.target, sizeof c.target, "%s", target);
    snprintf(c.arch, sizeof c.arch, "%s", arch);
    c.plane_dim = 32;
    c.max_cube_units = 1024;
    c.max_cube_dim[0] = c.max_cube_dim[1] = 1024;
    c.max_cube_dim[2] = 64;
    c.max_shared = 232448;
    c.compute_units = 132;
    for (int s = 0; s < EM_SCALAR_COUNT; s++) c.dtype[s] = true;
    c.plane_ops = c.matrix = c.float_atomic_add = c.print = true;
    return c;
}

static inline em_caps cuda_caps(const char *arch)
{
    return hopper_caps_as("cuda", arch);
}

/* Fails the test when NVRTC (where installed) does not compile src for arch; says so when it is
 * not installed. */
static inline void expect_nvrtc_compiles(const char *src, const char *arch)
{
    char nv[512];
    if (!em_nvrtc_available(nv, sizeof nv)) {
        print_message("NVRTC compile skipped: %s\n", nv);
        return;
    }
    char *log = NULL;
    void *bin = NULL;
    size_t size = 0;
    if (em_nvrtc_compile(src, arch, &log, &bin, &size) != EM_OK)
        fail_msg("NVRTC (%s): %s\n%s", arch, em_last_error(), src);
    assert_true(size > 0);
    free(log);
    free(bin);
}

/* Fails the test unless CUDA source src holds every string of want (n of them) and compiles
 * for sm_90a (where NVRTC is installed). */
static inline void expect_sm90a_source(const char *src, const char *const *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strstr(src, want[i])) fail_msg("no `%s` in the CUDA source:\n%s", want[i], src);
    expect_nvrtc_compiles(src, "sm_90a");
}

/* Skips the calling cmocka test (saying why) where NVRTC is not installed. */
#define SKIP_UNLESS_NVRTC()                                                                        \
    do {                                                                                           \
        char why_[512];                                                                            \
        if (!em_nvrtc_available(why_, sizeof why_)) {                                              \
            print_message("skipped: %s\n", why_);                                                  \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* ptxas's register line in an NVRTC log compiled with --ptxas-options=-v ("Used 119 registers,
 * ..."), or a placeholder when there is none. */
static inline const char *nvrtc_used(const char *log)
{
    const char *u = log ? strstr(log, "Used ") : NULL;
    return u ? u : "(no ptxas report)";
}

/* The problems ptxas reports in log, each printed after `label` with the whole log: spills,
 * setmaxnreg ignored, warpgroup MMAs serialized. Returns how many. */
static inline int nvrtc_problems(const char *log, const char *label)
{
    static const struct {
        const char *mark, *what;
    } bad[] = {{"'setmaxnreg' ignored", "ptxas ignores setmaxnreg"},
               {"wgmma.mma_async instructions are serialized", "ptxas serializes the MMAs"}};
    int n = 0;
    if (log && strstr(log, "bytes spill") && !strstr(log, " 0 bytes spill stores")) {
        print_message("%s spills:\n%s\n", label, log);
        n++;
    }
    for (size_t i = 0; log && i < sizeof bad / sizeof bad[0]; i++)
        if (strstr(log, bad[i].mark)) {
            print_message("%s: %s:\n%s\n", label, bad[i].what, log);
            n++;
        }
    return n;
}

/* The CUDA source of built-in kernel `name` specialized with binds[0..nb) at line width lw for
 * caps (the caller frees it); fails the test with the language's diagnostics when it does not
 * specialize. */
static inline char *builtin_cuda_source(const char *name, const em_lang_bind *binds, size_t nb,
                                        unsigned lw, const em_caps *caps)
{
    const em_lang_module *m = em_lang_builtins();
    if (!m) fail_msg("%s", em_last_error());
    em_lang_spec spec = {binds, nb, lw, caps};
    em_lang_diags *dg = em_lang_diags_new();
    em_ir_kernel *k = em_lang_specialize(m, name, &spec, dg);
    if (!k) {
        char *text = em_lang_diags_format(dg);
        fail_msg("%s: %s", name, text ? text : em_last_error());
    }
    em_lang_diags_free(dg);
    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, caps);
    if (!src) fail_msg("%s: %s", name, em_last_error());
    em_ir_kernel_free(k);
    return src;
}

/* expect_nvrtc_compiles with ptxas's report (--ptxas-options=-v): prints its register line
 * after `label` and fails the test on any of nvrtc_problems'. */
static inline void expect_nvrtc_clean(const char *src, const char *arch, const char *label)
{
    char nv[512];
    if (!em_nvrtc_available(nv, sizeof nv)) {
        print_message("NVRTC compile skipped: %s\n", nv);
        return;
    }
    setenv("EMBER_NVRTC_OPTIONS", "--ptxas-options=-v", 1);
    char *log = NULL;
    void *bin = NULL;
    size_t size = 0;
    if (em_nvrtc_compile(src, arch, &log, &bin, &size) != EM_OK)
        fail_msg("NVRTC (%s): %s\n%s", arch, em_last_error(), src);
    print_message("%s: %.60s\n", label, nvrtc_used(log));
    int problems = nvrtc_problems(log, label);
    free(log);
    free(bin);
    assert_int_equal(problems, 0);
}

#endif
