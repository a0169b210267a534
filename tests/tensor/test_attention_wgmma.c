/* test_attention_wgmma.c — the warpgroup-MMA attention kernels (src/kernels/
 * tensor_attention_wgmma.ek), forced with EMBER_ATTENTION=wgmma: on the CPU, which emulates the
 * MMAs (so CI checks the kernels' indexing and softmax without a GPU), and on a CUDA sm_90a device
 * when one is present (EMBER_TEST_DEVICE=cuda:0). The output and the gradients against the
 * float64 reference of attention_case.h for f16 and bf16, D 64 and 128, causal and not, Tq < Tk,
 * lengths off the tiles (1, 33, 100, 200), B * H > 1, k's rows unaligned (element copies), with
 * the profiler's launch counts showing that the wgmma kernels ran (and the fused backward, with dq
 * summed by bulk reductions, where EMBER_ATTENTION_FUSED_BWD=1 asks for it); other tiles per kernel
 * (EMBER_ATTENTION_TILES); the pipelined forward (EMBER_ATTENTION_FWD_PIPE=1); and the kernels'
 * CUDA source through NVRTC for sm_90a where NVRTC is installed. */
#include <stdlib.h>

#include "attention_case.h"
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/nvrtc.h"
#include "kernel/hopper_util.h"

/* Whether dev runs the wgmma kernels: the CPU (emulated) or CUDA on sm_90a. */
static bool runs_wgmma(em_device *dev)
{
    const em_caps *c = em_device_caps(dev);
    return c &&
           (!strcmp(c->target, "c") || (!strcmp(c->target, "cuda") && !strcmp(c->arch, "sm_90a")));
}

static const struct {
    em_scalar dt;
    acase c;
} cases[] = {
    {EM_F16, {2, 2, 33, 33, 64, true, true, false}},
    {EM_F16, {1, 2, 1, 40, 64, true, false, false}},
    {EM_BF16, {1, 2, 100, 100, 128, false, false, false}},
    {EM_BF16, {2, 1, 65, 200, 128, true, false, false}},
    {EM_F16, {1, 1, 200, 200, 64, true, false, false}},
    {EM_BF16, {1, 2, 33, 70, 64, false, false, false}},
    {EM_F16, {1, 2, 33, 45, 64, true, false, true}},
    {EM_F16, {2, 3, 7, 7, 128, false, false, false}},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static void test_wgmma_path(void **state)
{
    (void)state;
    em_profile_kernel fwd, other;
    setenv("EMBER_ATTENTION", "wgmma", 1);
    unsetenv("EMBER_ATTENTION_BWD");
    em_profile_enable(true);
    int ran = 0;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!runs_wgmma(dev)) continue;
        em_profile_reset();
        for (size_t i = 0; i < NCASES; i++)
            run_case(dev, cases[i].dt, cases[i].c, (uint32_t)(500 + i));
        /* every forward ran the wgmma kernel, none the matrix-op or SIMT one */
        assert_true(em_profile_kernel_get("tensor_attention_fwd_wgmma", &fwd));
        assert_int_equal(fwd.launches, NCASES);
        assert_false(em_profile_kernel_get("tensor_attention_fwd_mma", &other));
        assert_false(em_profile_kernel_get("tensor_attention_fwd", &other));
        /* and every backward the two wgmma passes, once each (the fused pass is opt-in) */
        assert_true(em_profile_kernel_get("tensor_attention_bwd_kv_wgmma", &other));
        assert_int_equal(other.launches, NCASES);
        assert_true(em_profile_kernel_get("tensor_attention_bwd_q_wgmma", &other));
        assert_int_equal(other.launches, NCASES);
        assert_false(em_profile_kernel_get("tensor_attention_dq_finish", &other));
        assert_false(em_profile_kernel_get("tensor_attention_bwd_kv_mma", &other));
        assert_false(em_profile_kernel_get("tensor_attention_bwd_q_mma", &other));
        ran++;
    }
    em_profile_enable(false);
    em_profile_reset();
    unsetenv("EMBER_ATTENTION");
    if (!ran) skip();
}

/* EMBER_ATTENTION_FUSED_BWD: =0 keeps two passes (the dq pass runs, no rounding kernel), =1
 * fuses them, at head size 64 and 128 (with one warpgroup of keys a cube, which the fused pass
 * needs); both against the same references. */
static void test_wgmma_fused_modes(void **state)
{
    (void)state;
    static const size_t picks[] = {0, 5, 3, 7}; /* D 64, 64, 128, 128 */
    em_profile_kernel kv, dq, fin;
    setenv("EMBER_ATTENTION", "wgmma", 1);
    unsetenv("EMBER_ATTENTION_BWD");
    em_profile_enable(true);
    int ran = 0;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!runs_wgmma(dev)) continue;
        for (int fused = 0; fused < 2; fused++) {
            setenv("EMBER_ATTENTION_FUSED_BWD", fused ? "1" : "0", 1);
            /* the fused pass takes one warpgroup of keys a cube, also at head size 128 */
            if (fused)
                setenv("EMBER_ATTENTION_TILES", "2:128:1:64:2:64", 1);
            else
                unsetenv("EMBER_ATTENTION_TILES");
            em_profile_reset();
            for (size_t i = 0; i < EM_ARRAY_LEN(picks); i++)
                run_case(dev, cases[picks[i]].dt, cases[picks[i]].c,
                         (uint32_t)(600 + 10 * fused + i));
            assert_true(em_profile_kernel_get("tensor_attention_bwd_kv_wgmma", &kv));
            assert_int_equal(kv.launches, EM_ARRAY_LEN(picks));
            bool has_dq = em_profile_kernel_get("tensor_attention_bwd_q_wgmma", &dq);
            bool has_fin = em_profile_kernel_get("tensor_attention_dq_finish", &fin);
            assert_true(fused ? !has_dq && has_fin && fin.launches == EM_ARRAY_LEN(picks)
                              : has_dq && !has_fin && dq.launches == EM_ARRAY_LEN(picks));
        }
        ran++;
    }
    unsetenv("EMBER_ATTENTION_FUSED_BWD");
    unsetenv("EMBER_ATTENTION_TILES");
    em_profile_enable(false);
    em_profile_reset();
    unsetenv("EMBER_ATTENTION");
    if (!ran) skip();
}

/* Other tiles (EMBER_ATTENTION_TILES: warpgroups per cube and streamed tile per kernel), 1 to 3
 * warpgroups and tiles of 16 to 128, against the same references: the kernels' indexing holds
 * for every configuration the host may launch. */
static void test_wgmma_tiles(void **state)
{
    (void)state;
    static const char *const tiles[] = {"1:128:1:32:3:32", "3:48:2:16:1:128"};
    static const size_t picks[] = {1, 2, 4, 5};
    setenv("EMBER_ATTENTION", "wgmma", 1);
    unsetenv("EMBER_ATTENTION_BWD");
    int ran = 0;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!runs_wgmma(dev)) continue;
        for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
            setenv("EMBER_ATTENTION_TILES", tiles[t], 1);
            for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++)
                run_case(dev, cases[picks[i]].dt, cases[picks[i]].c, (uint32_t)(700 + 10 * t + i));
        }
        ran++;
    }
    unsetenv("EMBER_ATTENTION_TILES");
    unsetenv("EMBER_ATTENTION");
    if (!ran) skip();
}

/* The pipelined forward (EMBER_ATTENTION_FWD_PIPE=1: tile j's S issued with tile j - 1's P V,
 * the stages turned over by halves): against the float64 references (the backward reading its
 * log-sum-exp) with the default tiles and others (key tiles of 16, so many tiles a cube; two and
 * three warpgroups), and bit for bit the same output as the default form, whose arithmetic it
 * keeps in the same order. */
/* EMBER_ATTENTION_TILES set to tiles, or unset for NULL (the default tiles) */
static void use_tiles(const char *tiles)
{
    if (tiles)
        setenv("EMBER_ATTENTION_TILES", tiles, 1);
    else
        unsetenv("EMBER_ATTENTION_TILES");
}

static void test_wgmma_fwd_pipe(void **state)
{
    (void)state;
    static const char *const tiles[] = {NULL, "1:16:1:48:1:64", "2:128:1:48:1:64",
                                        "3:48:1:48:1:64"};
    static const size_t picks[] = {0, 1, 3, 4, 6};
    setenv("EMBER_ATTENTION", "wgmma", 1);
    unsetenv("EMBER_ATTENTION_BWD");
    int ran = 0;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!runs_wgmma(dev)) continue;
        for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
            use_tiles(tiles[t]);
            setenv("EMBER_ATTENTION_FWD_PIPE", "1", 1);
            for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++)
                run_case(dev, cases[picks[i]].dt, cases[picks[i]].c, (uint32_t)(900 + 10 * t + i));
            /* the same output as the default form, bit for bit */
            em_scope_begin();
            int64_t nq = 2 * 3 * 200 * 64, nk = 2 * 3 * 260 * 64;
            double *q = malloc((size_t)nq * sizeof *q), *kv = malloc((size_t)nk * sizeof *kv);
            assert_true(q && kv);
            tu_fill(q, (size_t)nq, -2, 2, 950 + (uint32_t)t);
            tu_fill(kv, (size_t)nk, -2, 2, 960 + (uint32_t)t);
            em_tensor *qt = tu_tensor(dev, EM_BF16, EM_SHAPE(2, 3, 200, 64), q);
            em_tensor *kt = tu_tensor(dev, EM_BF16, EM_SHAPE(2, 3, 260, 64), kv);
            em_tensor *o[2];
            for (int pipe = 0; pipe < 2; pipe++) {
                setenv("EMBER_ATTENTION_FWD_PIPE", pipe ? "1" : "0", 1);
                o[pipe] = em_attention(qt, kt, kt, true, 0.125);
                assert_non_null(o[pipe]);
                assert_int_equal(em_realize(o[pipe]), EM_OK);
            }
            double *a = tu_read(o[0]), *b = tu_read(o[1]);
            for (int64_t i = 0; i < nq; i++)
                if (a[i] != b[i])
                    fail_msg("pipelined forward (tiles %s) on %s: element %lld is %g, the default "
                             "form's %g",
                             tiles[t] ? tiles[t] : "default", em_device_name(dev), (long long)i,
                             b[i], a[i]);
            free(a), free(b), free(q), free(kv);
            em_scope_end(NULL, 0);
        }
        ran++;
    }
    unsetenv("EMBER_ATTENTION_FWD_PIPE");
    unsetenv("EMBER_ATTENTION_TILES");
    unsetenv("EMBER_ATTENTION");
    if (!ran) skip();
}

/* Causality of the wgmma forward, bit for bit: with keys and values past position p replaced
 * by others, every output row up to p is unchanged, for p at and around the tile edges (the
 * default tiles and two others; T 300 over several key tiles, head size 64 and 128). */
static void test_wgmma_causal_exact(void **state)
{
    (void)state;
    static const char *const tiles[] = {NULL, "1:16:1:48:1:64", "2:128:1:48:1:64"};
    static const int64_t edges[] = {15, 16, 47, 48, 63, 64, 127, 128, 191, 255};
    static const int64_t dims[] = {64, 128};
    setenv("EMBER_ATTENTION", "wgmma", 1);
    int ran = 0;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (!runs_wgmma(dev)) continue;
        for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
            use_tiles(tiles[t]);
            for (size_t di2 = 0; di2 < 2; di2++) {
                int64_t T = 300, D = dims[di2], n = 2 * T * D;
                em_scope_begin();
                double *q = malloc((size_t)n * sizeof *q), *k = malloc((size_t)n * sizeof *k),
                       *v = malloc((size_t)n * sizeof *v), *k2 = malloc((size_t)n * sizeof *k2),
                       *v2 = malloc((size_t)n * sizeof *v2);
                assert_true(q && k && v && k2 && v2);
                tu_fill(q, (size_t)n, -2, 2, 1100 + (uint32_t)t);
                tu_fill(k, (size_t)n, -2, 2, 1110 + (uint32_t)t);
                tu_fill(v, (size_t)n, -2, 2, 1120 + (uint32_t)t);
                em_tensor *qt = tu_tensor(dev, EM_BF16, EM_SHAPE(1, 2, T, D), q);
                em_tensor *o =
                    em_attention(qt, tu_tensor(dev, EM_BF16, EM_SHAPE(1, 2, T, D), k),
                                 tu_tensor(dev, EM_BF16, EM_SHAPE(1, 2, T, D), v), true, 0.125);
                assert_non_null(o);
                double *base = tu_read(o);
                for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
                    int64_t p = edges[e];
                    /* keys and values past p: large, so that a leak would show */
                    memcpy(k2, k, (size_t)n * sizeof *k), memcpy(v2, v, (size_t)n * sizeof *v);
                    for (int64_t h = 0; h < 2; h++)
                        for (int64_t i = p + 1; i < T; i++)
                            for (int64_t d = 0; d < D; d++) {
                                k2[(h * T + i) * D + d] = 4.0;
                                v2[(h * T + i) * D + d] = 100.0;
                            }
                    em_tensor *o2 = em_attention(
                        qt, tu_tensor(dev, EM_BF16, EM_SHAPE(1, 2, T, D), k2),
                        tu_tensor(dev, EM_BF16, EM_SHAPE(1, 2, T, D), v2), true, 0.125);
                    assert_non_null(o2);
                    double *got = tu_read(o2);
                    for (int64_t h = 0; h < 2; h++)
                        for (int64_t i = 0; i <= p; i++)
                            for (int64_t d = 0; d < D; d++) {
                                int64_t at = (h * T + i) * D + d;
                                if (got[at] != base[at])
                                    fail_msg("causal forward (tiles %s, D %lld) on %s: row %lld "
                                             "changed with the keys past %lld (%g, was %g)",
                                             tiles[t] ? tiles[t] : "default", (long long)D,
                                             em_device_name(dev), (long long)i, (long long)p,
                                             got[at], base[at]);
                            }
                    free(got);
                }
                free(base), free(q), free(k), free(v), free(k2), free(v2);
                em_scope_end(NULL, 0);
            }
        }
        ran++;
    }
    unsetenv("EMBER_ATTENTION_TILES");
    unsetenv("EMBER_ATTENTION");
    if (!ran) skip();
}

/* em_attention_fast under EMBER_ATTENTION=wgmma on the CPU: true for f16/bf16 at D 64 and 128
 * (the emulated wgmma kernels run), false for other head sizes and dtypes (SIMT). */
static void test_wgmma_fast_predicate(void **state)
{
    (void)state;
    em_device *cpu = NULL;
    for (int di = 0; di < tu_ndev; di++)
        if (tu_is_cpu(tu_devs[di])) cpu = tu_devs[di];
    if (!cpu) skip();
    em_scope_begin();
    setenv("EMBER_ATTENTION", "wgmma", 1);
    assert_true(em_attention_fast(em_zeros(cpu, EM_BF16, EM_SHAPE(1, 2, 8, 64))));
    assert_true(em_attention_fast(em_zeros(cpu, EM_F16, EM_SHAPE(1, 2, 8, 128))));
    assert_false(em_attention_fast(em_zeros(cpu, EM_BF16, EM_SHAPE(1, 2, 8, 40))));
    assert_false(em_attention_fast(em_zeros(cpu, EM_F32, EM_SHAPE(1, 2, 8, 64))));
    unsetenv("EMBER_ATTENTION");
    assert_false(em_attention_fast(em_zeros(cpu, EM_BF16, EM_SHAPE(1, 2, 8, 64))));
    em_scope_end(NULL, 0);
}

/* The capabilities of an H200 as the CUDA driver publishes them (sm_90a: warpgroup MMAs). */
static em_caps h200_caps(void)
{
    em_caps caps = cuda_caps("sm_90a");
    snprintf(caps.device_name, sizeof caps.device_name, "sm_90a");
    return caps;
}

/* The kernels as src/tensor/ops_attention.c binds them for an H200 (f16 and bf16, D 64 and 128,
 * 16-byte copies; element copies for f16 at D 64), through NVRTC for sm_90a: they must use the
 * warpgroup MMAs, compile, and spill nothing (ptxas's report). */
static void test_wgmma_compiles(void **state)
{
    (void)state;
    SKIP_UNLESS_NVRTC();
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    em_caps caps = h200_caps();
    /* the dk/dv pass twice: alone and as the fused backward (DQ, which the host takes at head
     * size 64 only) */
    static const char *const kernels[] = {
        "tensor_attention_fwd_wgmma", "tensor_attention_bwd_kv_wgmma",
        "tensor_attention_bwd_q_wgmma", "tensor_attention_bwd_kv_wgmma",
        "tensor_attention_fwd_wgmma"};
    size_t failed = 0;
    for (size_t kn = 0; kn < sizeof kernels / sizeof kernels[0]; kn++)
        for (int t = 0; t < 2; t++)
            for (int d = 64; d <= 128; d += 64)
                for (int vec = 8; vec >= 1; vec -= 7) {
                    size_t ki = kn == 3 ? 1 : kn == 4 ? 0 : kn;
                    bool dq = kn == 3, pipe = kn == 4;
                    if (vec == 1 && (t || d != 64)) continue;
                    if (dq && d != 64) continue;
                    em_scalar ty = t ? EM_BF16 : EM_F16;
                    /* the default tiles at D: warpgroups and streamed tile per kernel */
                    char tiles[64];
                    int tl[6];
                    tn_attention_tiles(d, tiles, sizeof tiles);
                    assert_int_equal(sscanf(tiles, "%d:%d:%d:%d:%d:%d", &tl[0], &tl[1], &tl[2],
                                            &tl[3], &tl[4], &tl[5]),
                                     6);
                    em_lang_bind b[] = {em_lang_bind_type("T", ty),
                                        em_lang_bind_type("M", EM_F32),
                                        em_lang_bind_int("D", d),
                                        em_lang_bind_int("WG", tl[2 * ki]),
                                        em_lang_bind_int("V", vec),
                                        em_lang_bind_int(ki == 1 ? "BQ" : "BK", tl[2 * ki + 1]),
                                        em_lang_bind_int("PLANE", 32),
                                        em_lang_bind_bool("PIPE", pipe)};
                    size_t nb = sizeof b / sizeof b[0];
                    if (ki) nb = 6;
                    if (dq) b[6] = em_lang_bind_bool("DQ", true), nb = 7;
                    em_lang_spec spec = {b, nb, 1, &caps};
                    em_lang_diags *dg = em_lang_diags_new();
                    em_ir_kernel *k = em_lang_specialize(m, kernels[ki], &spec, dg);
                    if (!k) {
                        char *text = em_lang_diags_format(dg);
                        print_message("%s: %s\n", kernels[ki], text ? text : em_last_error());
                        free(text);
                        em_lang_diags_free(dg);
                        failed++;
                        continue;
                    }
                    em_lang_diags_free(dg);
                    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
                    if (!src) fail_msg("%s: %s", kernels[ki], em_last_error());
                    assert_non_null(strstr(src, "wgmma.mma_async.sync.aligned"));
                    char *log = NULL;
                    void *bin = NULL;
                    size_t size = 0;
                    if (em_nvrtc_compile(src, "sm_90a", &log, &bin, &size) != EM_OK) {
                        print_message("%s %s D %d V %d: %s\n", kernels[ki], em_scalar_name(ty), d,
                                      vec, em_last_error());
                        failed++;
                    } else {
                        print_message("%s%s %s D %d V %d: %.60s\n", kernels[ki],
                                      dq     ? " DQ"
                                      : pipe ? " PIPE"
                                             : "",
                                      em_scalar_name(ty), d, vec, nvrtc_used(log));
                        failed += (size_t)nvrtc_problems(log, kernels[ki]);
                    }
                    free(log);
                    free(bin);
                    free(src);
                    em_ir_kernel_free(k);
                }
    assert_int_equal(failed, 0);
}

/* The backward's statistics in 16-byte lines (tensor_attention_delta_lines) as ops_attention.c
 * binds them on CUDA (16-bit types and f32, D 64 and 128: DL = D / lanes units a row within a
 * plane of 32), through NVRTC for sm_90a: it compiles clean and loads each line with one 16-byte
 * vector load (the generated source reads 16-byte line types). */
static void test_delta_lines_compiles(void **state)
{
    (void)state;
    SKIP_UNLESS_NVRTC();
    em_caps caps = h200_caps();
    static const em_scalar types[] = {EM_F16, EM_BF16, EM_F32};
    for (size_t ti = 0; ti < 3; ti++)
        for (int d = 64; d <= 128; d += 64) {
            unsigned lanes = 16 / (unsigned)em_scalar_size(types[ti]);
            em_lang_bind b[] = {em_lang_bind_type("T", types[ti]), em_lang_bind_type("C", EM_F32),
                                em_lang_bind_int("DL", d / (int)lanes)};
            char *src = builtin_cuda_source("tensor_attention_delta_lines", b, 3, lanes, &caps);
            char line_type[64], label[96];
            snprintf(line_type, sizeof line_type, "emv<%s, %u> *dout",
                     types[ti] == EM_F32 ? "float" : "unsigned short", lanes);
            if (!strstr(src, line_type)) fail_msg("no %s in:\n%s", line_type, src);
            snprintf(label, sizeof label, "tensor_attention_delta_lines %s D %d",
                     em_scalar_name(types[ti]), d);
            expect_nvrtc_clean(src, "sm_90a", label);
            free(src);
        }
}

int main(void)
{
    /* ptxas's report of registers and spills (NVRTC reads its options once) */
    setenv("EMBER_NVRTC_OPTIONS", "--ptxas-options=-v", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wgmma_path),     cmocka_unit_test(test_wgmma_fused_modes),
        cmocka_unit_test(test_wgmma_tiles),    cmocka_unit_test(test_wgmma_fast_predicate),
        cmocka_unit_test(test_wgmma_compiles), cmocka_unit_test(test_delta_lines_compiles),
        cmocka_unit_test(test_wgmma_fwd_pipe), cmocka_unit_test(test_wgmma_causal_exact),
    };
    if (getenv("TU_ONLY")) cmocka_set_test_filter(getenv("TU_ONLY"));
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
