/* test_pdl.c — the kernel language's prefetch(t, i) and dependency_wait() (src/kernel/lang/
 * lower_call.c) and programmatic dependent launch in the CUDA source (src/kernel/codegen/cuda.c):
 *  - on the CPU both do nothing: a kernel using them computes what it computes without them;
 *  - for an sm_90 device the kernel's griddepcontrol pair sits where it calls dependency_wait()
 *    (after its prefetches, exactly once), prefetches become prefetch.global.L2, and the source
 *    compiles through NVRTC; a kernel that does not call it waits first thing; for sm_80 there is
 *    no griddepcontrol at all;
 *  - OpenCL and GLSL sources have neither;
 *  - dependency_wait() in a branch or loop is an error at its line and column. */
#include "lang/lang_util.h"

#include "ember/kernel.h"
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/nvrtc.h"
#include "kernel/hopper_util.h"

static const char *src_text =
    "kernel void axpy(const tensor(f32) x, tensor(f32) y, f32 a)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(x)) { prefetch(x, i); }\n"
    "    dependency_wait();\n"
    "    if (i < len(x)) { y[i] = a * x[i] + y[i]; }\n"
    "}\n"
    "kernel void plain(tensor(f32) y)\n"
    "{\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    if (i < len(y)) { y[i] = y[i] * 2.0; }\n"
    "}\n";

static void test_cpu_results(void **state)
{
    (void)state;
    em_lang_module *m = must_load(src_text);
    enum { N = 1000 };
    float x[N], y[N], out[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i % 13) - 6.0f, y[i] = (float)(i % 7);
    em_buffer *bx = buf_new(x, sizeof x), *by = buf_new(y, sizeof y);
    em_arg args[] = {em_arg_buffer(bx, N), em_arg_buffer(by, N), em_arg_f32(0.5f)};
    em_lang_spec spec = {NULL, 0, 1, NULL};
    launch_x(m, "axpy", &spec, (N + 63) / 64, 64, args, 3);
    buf_get(by, out, sizeof out);
    for (int i = 0; i < N; i++)
        if (out[i] != 0.5f * x[i] + y[i]) fail_msg("y[%d] = %g, want %g", i, out[i], 0.5f * x[i] + y[i]);
    em_buffer_free(bx);
    em_buffer_free(by);
    em_lang_module_free(m);
}

/* The source of both kernels for caps (generator chosen by the target). */
static char *source_for(const em_lang_module *m, const em_caps *caps)
{
    em_ir_kernel *ks[2];
    const char *names[2] = {"axpy", "plain"};
    for (int i = 0; i < 2; i++) {
        em_lang_spec spec = {NULL, 0, 1, caps};
        em_lang_diags *d = em_lang_diags_new();
        ks[i] = em_lang_specialize(m, names[i], &spec, d);
        if (!ks[i]) {
            char *text = em_lang_diags_format(d);
            fail_msg("%s: %s", names[i], text ? text : em_last_error());
        }
        em_lang_diags_free(d);
        assert_int_equal(em_ir_verify(ks[i], 0), EM_OK);
        assert_int_equal(em_ir_simplify(ks[i]), EM_OK);
    }
    const em_ir_kernel *const *kk = (const em_ir_kernel *const *)ks;
    char *src = !strcmp(caps->target, "cuda")     ? em_codegen_cuda(kk, 2, caps)
                : !strcmp(caps->target, "opencl") ? em_codegen_opencl(kk, 2, caps)
                                                  : em_codegen_glsl(kk, 2, caps);
    if (!src) fail_msg("%s: %s", caps->target, em_last_error());
    em_ir_kernel_free(ks[0]);
    em_ir_kernel_free(ks[1]);
    return src;
}

static size_t count_of(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void test_cuda_source(void **state)
{
    (void)state;
    em_lang_module *m = must_load(src_text);
    em_caps caps = hopper_caps_as("cuda", "sm_90");
    char *src = source_for(m, &caps);
    /* one wait per kernel: axpy's where it calls it, after its prefetch; plain's first */
    assert_int_equal(count_of(src, "griddepcontrol.wait;"), 2);
    assert_int_equal(count_of(src, "griddepcontrol.launch_dependents;"), 2);
    const char *axpy = strstr(src, "void axpy("), *plain = strstr(src, "void plain(");
    assert_non_null(axpy);
    assert_non_null(plain);
    const char *pf = strstr(axpy, "prefetch.global.L2 [%0];"), *w = strstr(axpy, "griddepcontrol.wait;");
    assert_non_null(pf);
    assert_true(pf < w && (plain < axpy || w < plain));
    const char *body = strstr(plain, ")\n{\n");
    assert_non_null(body);
    body += 4;
    while (*body == ' ') body++;
    assert_int_equal(strncmp(body, "asm volatile(\"griddepcontrol.wait;\"", 34), 0);
    assert_non_null(strstr(src, "extern \"C\" __device__ int ember_pdl = 1;"));
    expect_nvrtc_compiles(src, "sm_90");
    free(src);
    /* sm_80: the prefetch stays, nothing waits (no programmatic launches there) */
    caps = hopper_caps_as("cuda", "sm_80");
    src = source_for(m, &caps);
    assert_null(strstr(src, "griddepcontrol"));
    assert_null(strstr(src, "ember_pdl"));
    assert_non_null(strstr(src, "prefetch.global.L2"));
    free(src);
    /* OpenCL and GLSL: neither */
    const char *targets[] = {"opencl", "glsl"};
    for (int t = 0; t < 2; t++) {
        caps = hopper_caps_as(targets[t], "");
        src = source_for(m, &caps);
        assert_null(strstr(src, "griddepcontrol"));
        assert_null(strstr(src, "prefetch.global"));
        free(src);
    }
    em_lang_module_free(m);
}

static void test_wait_only_at_top_level(void **state)
{
    (void)state;
    const char *in_branch = "kernel void bad(tensor(f32) out)\n{\n"
                            "    if (UNIT_POS == 0) { dependency_wait(); }\n"
                            "    out[0] = 1.0;\n}\n";
    assert_true(check_error_at(in_branch, 3, 26,
                               "dependency_wait() inside a branch or loop: every unit must wait",
                               "call it among the kernel's top-level statements"));
    const char *in_loop = "kernel void bad(tensor(f32) out)\n{\n"
                          "    for (u32 i in range(2)) {\n        dependency_wait();\n    }\n"
                          "    out[0] = 1.0;\n}\n";
    assert_true(check_error_at(in_loop, 4, 9,
                               "dependency_wait() inside a branch or loop: every unit must wait",
                               NULL));
    const char *bad_mem = "kernel void bad(tensor(f32) out)\n{\n    u32 x = 3;\n"
                          "    prefetch(x, 0);\n    out[0] = 1.0;\n}\n";
    em_lang_diags *d = em_lang_diags_new();
    em_lang_module *m = em_lang_module_from_string("bad.ek", bad_mem, d);
    assert_true(!m || em_lang_check(m, d) == EM_ERR_INVALID);
    const em_lang_diag *g = em_lang_diags_at(d, 0);
    assert_non_null(g);
    assert_int_equal(g->line, 4);
    em_lang_module_free(m);
    em_lang_diags_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_results),
        cmocka_unit_test(test_cuda_source),
        cmocka_unit_test(test_wait_only_at_top_level),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
