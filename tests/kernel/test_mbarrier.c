/* test_mbarrier.c — the kernel language's Hopper pipeline builtins (shared-memory barriers with
 * phases, copy_async_arrive, setmaxnreg; src/kernel/lang/lower_mbarrier.c), without a GPU:
 *  - a producer/consumer ring (copies into stage s, an arrival on full[s]; consumers wait for
 *    full[s], read another unit's copy, arrive on empty[s]) run on the CPU, where the ops do
 *    nothing and the kernel's per-turn cube barrier orders the units;
 *  - the CUDA source for an sm_90a device (the PTX of every op), compiled by NVRTC for sm_90a
 *    when it is installed;
 *  - the diagnostics: targets without these barriers, wrong barrier arrays, register counts. */
#include "lang/lang_util.h"

#include "ember/kernel.h"
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/nvrtc.h"
#include "kernel/hopper_util.h"

/* P producer units copy tile i (P chunks of 4 floats) into stage i % S; P consumer units sum
 * tile i - 1, unit u reading producer (u + i - 1) % P's chunk. */
static const char *pipe_src =
    "kernel void pipe(const tensor(f32) src, tensor(f32) out, comptime u32 S = 3,\n"
    "                 comptime u32 P = 32)\n"
    "{\n"
    "    shared f32 ring[S * P * 4];\n"
    "    shared u64 full[S];\n"
    "    shared u64 empty[S];\n"
    "    u32 n = len(src) / (P * 4);\n"
    "    if (UNIT_POS == 0) {\n"
    "        for (u32 s in range(S)) {\n"
    "            mbarrier_init(full, s, P);\n"
    "            mbarrier_init(empty, s, P);\n"
    "        }\n"
    "    }\n"
    "    sync_cube();\n"
    "    f32 sum = 0.0;\n"
    "    if (!mbarrier_try_wait(full, 0, 1)) { sum = -1000.0; }\n"
    "    for (u32 i in range(n + 1)) {\n"
    "        if (UNIT_POS < P) {\n"
    "            if (i < n) {\n"
    "                u32 s = i % S;\n"
    "                mbarrier_wait(empty, s, (i / S + 1) % 2);\n"
    "                copy_async(ring, (s * P + UNIT_POS) * 4, src, (i * P + UNIT_POS) * 4, 4);\n"
    "                copy_async_arrive(full, s);\n"
    "            }\n"
    "        } else if (i >= 1) {\n"
    "            u32 t = i - 1;\n"
    "            u32 s = t % S;\n"
    "            mbarrier_wait(full, s, t / S % 2);\n"
    "            u32 w = (UNIT_POS - P + t) % P;\n"
    "            for (u32 j in range(4)) { sum += ring[(s * P + w) * 4 + j]; }\n"
    "            mbarrier_arrive(empty, s);\n"
    "        }\n"
    "        comptime if (has(c)) { sync_cube(); }\n"
    "    }\n"
    "    if (UNIT_POS >= P) { out[UNIT_POS - P] = sum; }\n"
    "}\n"
    "kernel void regs(tensor(u32) out)\n"
    "{\n"
    "    shared u64 bar[1];\n"
    "    if (UNIT_POS == 0) { mbarrier_init(bar, 0, 1); }\n"
    "    sync_cube();\n"
    "    if (UNIT_POS / 128 == 0) { setmaxnreg_dec(40); } else { setmaxnreg_inc(232); }\n"
    "    if (UNIT_POS == 0) { mbarrier_arrive_tx(bar, 0, 0); }\n"
    "    mbarrier_wait(bar, 0, 0);\n"
    "    if (mbarrier_try_wait(bar, 0, 0)) { out[UNIT_POS] = 1; }\n"
    "}\n"
    "kernel void pairs(tensor(u32) out)\n"
    "{\n"
    "    shared bf16 h[64];\n"
    "    h[UNIT_POS] = bf16(f32(UNIT_POS));\n"
    "    sync_cube();\n"
    "    comptime if (has(mbarrier)) { out[UNIT_POS] = shared_load_u32(h, UNIT_POS / 2 * 2); }\n"
    "}\n";

static void run_pipe(em_lang_module *m, unsigned stages, unsigned tiles)
{
    enum { P = 32 };
    size_t n = (size_t)tiles * P * 4;
    float *src = malloc(n * sizeof(float)), out[P];
    assert_non_null(src);
    for (size_t i = 0; i < n; i++) src[i] = (float)((i * 7 + 3) % 17) - 8.0f;
    em_buffer *bs = buf_new(src, n * sizeof(float)), *bo = buf_new(NULL, sizeof out);
    em_lang_bind binds[] = {em_lang_bind_int("S", stages)};
    em_lang_spec spec = {binds, 1, 1, NULL};
    em_arg args[] = {em_arg_buffer(bs, n), em_arg_buffer(bo, P)};
    launch_x(m, "pipe", &spec, 1, 2 * P, args, 2);
    buf_get(bo, out, sizeof out);
    for (unsigned u = 0; u < P; u++) {
        double want = 0;
        for (unsigned t = 0; t < tiles; t++)
            for (unsigned j = 0; j < 4; j++) want += src[((size_t)t * P + (u + t) % P) * 4 + j];
        if ((double)out[u] != want)
            fail_msg("S=%u tiles=%u: consumer %u summed %g, want %g", stages, tiles, u,
                     (double)out[u], want);
    }
    em_buffer_free(bs);
    em_buffer_free(bo);
    free(src);
}

static void test_pipeline_on_cpu(void **state)
{
    (void)state;
    em_lang_module *m = must_load(pipe_src);
    run_pipe(m, 3, 7);
    run_pipe(m, 2, 1);
    run_pipe(m, 4, 12);
    /* setmaxnreg does nothing, waits return at once, try_wait is true */
    uint32_t out[256];
    em_buffer *bo = buf_new(NULL, sizeof out);
    em_arg args[] = {em_arg_buffer(bo, 256)};
    em_lang_spec spec = {NULL, 0, 1, NULL};
    launch_x(m, "regs", &spec, 1, 256, args, 1);
    buf_get(bo, out, sizeof out);
    for (int i = 0; i < 256; i++) assert_int_equal(out[i], 1);
    em_buffer_free(bo);
    em_lang_module_free(m);
}

/* ---- CUDA ------------------------------------------------------------------------------------ */

/* Kernel `name` of m for caps, simplified; NULL with the diagnostics in `why`. */
static em_ir_kernel *specialize(const em_lang_module *m, const char *name, const em_caps *caps,
                                char *why, size_t whysize)
{
    em_lang_spec spec = {NULL, 0, 1, caps};
    em_lang_diags *d = em_lang_diags_new();
    em_ir_kernel *k = em_lang_specialize(m, name, &spec, d);
    if (!k) {
        char *text = em_lang_diags_format(d);
        snprintf(why, whysize, "%s", text ? text : em_last_error());
        free(text);
    }
    em_lang_diags_free(d);
    if (k) {
        assert_int_equal(em_ir_verify(k, 0), EM_OK);
        assert_int_equal(em_ir_simplify(k), EM_OK);
    }
    return k;
}

static void test_cuda_source(void **state)
{
    (void)state;
    em_lang_module *m = must_load(pipe_src);
    em_caps caps = cuda_caps("sm_90a");
    char why[2048] = "";
    em_ir_kernel *ks[2] = {specialize(m, "pipe", &caps, why, sizeof why), NULL};
    if (!ks[0]) fail_msg("%s", why);
    ks[1] = specialize(m, "regs", &caps, why, sizeof why);
    if (!ks[1]) fail_msg("%s", why);
    em_ir_kernel *pk = specialize(m, "pairs", &caps, why, sizeof why);
    if (!pk) fail_msg("%s", why);
    char *psrc = em_codegen_cuda((const em_ir_kernel *const *)&pk, 1, &caps);
    if (!psrc) fail_msg("%s", em_last_error());
    static const char *const pwant[] = {"(*(const unsigned *)(h_m"};
    expect_sm90a_source(psrc, pwant, 1);
    free(psrc);
    em_ir_kernel_free(pk);
    char *src = em_codegen_cuda((const em_ir_kernel *const *)ks, 2, &caps);
    if (!src) fail_msg("%s", em_last_error());
    static const char *const want[] = {
        "mbarrier.init.shared::cta.b64 [%0], %1;",
        "mbarrier.arrive.shared::cta.b64 _, [%0];",
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;",
        "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];",
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;",
        "} while (!em_mbar_ok",
        "setmaxnreg.dec.sync.aligned.u32 40;",
        "setmaxnreg.inc.sync.aligned.u32 232;",
        "cp.async.ca.shared.global",
        "__cvta_generic_to_shared(",
    };
    expect_sm90a_source(src, want, sizeof want / sizeof want[0]);
    free(src);
    /* the same IR for a CUDA device without sm_90a is refused by the generator */
    em_caps old = cuda_caps("sm_90");
    src = em_codegen_cuda((const em_ir_kernel *const *)ks, 2, &old);
    assert_null(src);
    assert_non_null(strstr(em_last_error(), "need compute capability 9.0 (sm_90a)"));
    em_ir_kernel_free(ks[0]);
    em_ir_kernel_free(ks[1]);
    em_lang_module_free(m);
}

static void expect_refused(const em_lang_module *m, const em_caps *caps, const char *what)
{
    char why[2048] = "";
    em_ir_kernel *k = specialize(m, "pipe", caps, why, sizeof why);
    assert_null(k);
    if (!strstr(why, what) || !strstr(why, "needs shared-memory barriers with phases") ||
        !strstr(why, "test.ek:") || !strstr(why, "has(mbarrier)"))
        fail_msg("unexpected diagnostic: %s", why);
}

static void test_refused_elsewhere(void **state)
{
    (void)state;
    em_lang_module *m = must_load(pipe_src);
    em_caps c = cuda_caps("sm_80");
    expect_refused(m, &c, "this CUDA device (sm_80)");
    snprintf(c.target, sizeof c.target, "opencl");
    expect_refused(m, &c, "the opencl target");
    snprintf(c.target, sizeof c.target, "glsl");
    expect_refused(m, &c, "the glsl target");
    em_lang_module_free(m);
    const char *bad = "kernel void bad(tensor(f32) out)\n{\n    shared u32 b[4];\n"
                      "    mbarrier_arrive(b, 0);\n    out[0] = 1.0;\n}\n";
    assert_true(check_error_at(bad, 4, 21,
                               "'mbarrier_arrive' needs a shared array of u64 as its "
                               "barriers",
                               "declare them as 'shared u64 bar[N];'"));
    const char *bad2 = "kernel void bad(tensor(f32) out)\n{\n    setmaxnreg_inc(250);\n"
                       "    out[0] = 1.0;\n}\n";
    assert_true(check_error_at(bad2, 3, 20, "'setmaxnreg_inc' of 250 registers per unit",
                               "a multiple of 8 from 24 to 256"));
    /* shared_load_u32: not emulated (the CPU runs its guard's other path), 2- or 4-byte scalars */
    const char *bad3 = "kernel void bad(tensor(u32) out)\n{\n    shared bf16 h[8];\n"
                       "    out[0] = shared_load_u32(h, 0);\n}\n";
    assert_true(check_error_at(
        bad3, 4, 14, "'shared_load_u32' has no emulation on the portable target",
        "guard it with 'comptime if (has(mbarrier))' and give the kernel another path"));
    em_caps hc = cuda_caps("sm_90a");
    const char *bad4 = "kernel void bad(tensor(u32) out)\n{\n    shared f64 h[8];\n"
                       "    out[0] = shared_load_u32(h, 0);\n}\n";
    em_lang_module *m4 = must_load(bad4);
    char why[1024] = "";
    assert_null(specialize(m4, "bad", &hc, why, sizeof why));
    if (!strstr(why, "reads a shared array of 2- or 4-byte scalars"))
        fail_msg("unexpected: %s", why);
    em_lang_module_free(m4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_on_cpu),
        cmocka_unit_test(test_cuda_source),
        cmocka_unit_test(test_refused_elsewhere),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
