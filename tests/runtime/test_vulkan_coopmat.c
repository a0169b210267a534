/* test_vulkan_coopmat.c — cooperative matrices on Vulkan. Without a device that has them (CI's
 * lavapipe has none), the GLSL the generator writes for an mma kernel and a shared-memory matmul
 * is compiled with glslangValidator and checked with `spirv-val --target-env vulkan1.3`, in both
 * dialects (GL_NV_cooperative_matrix always; GL_KHR_cooperative_matrix where the installed glslang
 * knows it, else that step is skipped, saying so); errors name what is missing (no cooperative
 * matrices, a combination the device does not list, bf16 fragments); the driver's choice between
 * KHR, NV and none (vulkan_coopmat.c: the compiler probe, $EMBER_VK_COOPMAT, no memory model,
 * extension absent) is checked on made-up extension lists. On vulkan:0 (or
 * $EMBER_TEST_DEVICE): the caps are consistent, and the shared-memory matmul either runs and
 * matches a float64 reference (caps.matrix) or is rejected naming caps.matrix (planes wider than
 * one unit and no cooperative matrices), or runs as loops (planes of one unit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sys/wait.h>
#include "kernel/codegen/codegen.h"
#include "ember/lang.h"
#include "runtime/drivers/vulkan_internal.h"
#include "runtime/rt_util.h"

static char tmp_dir[1024];

static int setup(void **state)
{
    (void)state;
    rt_fresh_dir("vkcoop", tmp_dir, sizeof(tmp_dir));
    setenv("EMBER_CACHE_DIR", tmp_dir, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    em_remove_tree(tmp_dir);
    return 0;
}

/* ---- kernels ------------------------------------------------------------------------------- */

/* c = a (M x K, row-major) * b (K x N, column-major) + 1 on one tile (matrix.ek's mma16), with the
 * given fragment shape and kinds. */
static em_ir_kernel *mma_kernel(unsigned m, unsigned n, unsigned kd, em_scalar ab, em_scalar acc,
                                em_scalar amem)
{
    em_ir_kernel *k = em_ir_kernel_new("mma_tile");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(amem), EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(ab), EM_READ, 0);
    em_ir_mem c = em_ir_param_buffer(k, "c", em_ty(acc), EM_WRITE, 0);
    em_ir_val fa = em_ir_matrix(k, EM_MAT_A, ab, m, n, kd, EM_ROW_MAJOR, "fa");
    em_ir_val fb = em_ir_matrix(k, EM_MAT_B, ab, m, n, kd, EM_COL_MAJOR, "fb");
    em_ir_val fc = em_ir_matrix(k, EM_MAT_ACC, acc, m, n, kd, EM_ROW_MAJOR, "fc");
    em_ir_mat_fill(k, fc, em_ir_const_float(k, em_ty(acc), 1.0));
    em_ir_mat_load(k, fa, a, em_ir_u32(k, 0), em_ir_u32(k, kd), EM_ROW_MAJOR);
    em_ir_mat_load(k, fb, b, em_ir_u32(k, 0), em_ir_u32(k, kd), EM_COL_MAJOR);
    em_ir_mat_mma(k, fc, fa, fb, fc);
    em_ir_mat_store(k, c, em_ir_u32(k, 0), em_ir_u32(k, n), fc, EM_ROW_MAJOR);
    return k;
}

/* c (M x N f32) = a (M x K f16, row-major) * b (K x N f16, row-major): one cube of one plane per
 * 16 x 16 output tile (cube (x, y) = tile column, row); K in steps of 16 through shared tiles. */
static em_ir_kernel *matmul_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("coop_matmul");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F16), EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_F16), EM_READ, 0);
    em_ir_mem c = em_ir_param_buffer(k, "c", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val N = em_ir_param_scalar(k, "n", em_ty(EM_U32));
    em_ir_val K = em_ir_param_scalar(k, "kk", em_ty(EM_U32));
    em_ir_mem sa = em_ir_shared(k, "sa", em_ty(EM_F16), 256);
    em_ir_mem sb = em_ir_shared(k, "sb", em_ty(EM_F16), 256);
    em_ir_val fa = em_ir_matrix(k, EM_MAT_A, EM_F16, 16, 16, 16, EM_ROW_MAJOR, "fa");
    em_ir_val fb = em_ir_matrix(k, EM_MAT_B, EM_F16, 16, 16, 16, EM_ROW_MAJOR, "fb");
    em_ir_val fc = em_ir_matrix(k, EM_MAT_ACC, EM_F32, 16, 16, 16, EM_ROW_MAJOR, "fc");
    em_ir_val u16 = em_ir_u32(k, 16);
    em_ir_val row0 = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_POS_Y), u16);
    em_ir_val col0 = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_POS_X), u16);
    em_ir_mat_fill(k, fc, em_ir_const_float(k, em_ty(EM_F32), 0.0));
    em_ir_val k0 = em_ir_var(k, em_ty(EM_U32), "k0");
    em_ir_range_begin(k, k0, em_ir_u32(k, 0), K, u16, false);
    {
        em_ir_val i = em_ir_var(k, em_ty(EM_U32), "i");
        em_ir_range_begin(k, i, em_ir_builtin(k, EM_UNIT_POS), em_ir_u32(k, 256),
                          em_ir_builtin(k, EM_CUBE_DIM_X), false);
        {
            em_ir_val r = em_ir_binary(k, EM_OP_DIV, i, u16);
            em_ir_val col = em_ir_binary(k, EM_OP_REM, i, u16);
            em_ir_val ai = em_ir_binary(
                k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, em_ir_binary(k, EM_OP_ADD, row0, r), K),
                em_ir_binary(k, EM_OP_ADD, k0, col));
            em_ir_val bi = em_ir_binary(
                k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, em_ir_binary(k, EM_OP_ADD, k0, r), N),
                em_ir_binary(k, EM_OP_ADD, col0, col));
            em_ir_store(k, sa, i, em_ir_load(k, a, ai));
            em_ir_store(k, sb, i, em_ir_load(k, b, bi));
        }
        em_ir_end(k);
        em_ir_sync_cube(k);
        em_ir_mat_load(k, fa, sa, em_ir_u32(k, 0), u16, EM_ROW_MAJOR);
        em_ir_mat_load(k, fb, sb, em_ir_u32(k, 0), u16, EM_ROW_MAJOR);
        em_ir_mat_mma(k, fc, fa, fb, fc);
        em_ir_sync_cube(k);
    }
    em_ir_end(k);
    em_ir_mat_store(k, c, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, row0, N), col0), N,
                    fc, EM_ROW_MAJOR);
    return k;
}

/* ---- GLSL generation and SPIR-V validation ------------------------------------------------ */

static em_caps coop_caps(const char *api)
{
    em_caps c;
    memset(&c, 0, sizeof(c));
    snprintf(c.target, sizeof(c.target), "glsl");
    snprintf(c.arch, sizeof(c.arch), "spirv-vulkan1.2");
    c.plane_dim = 32;
    c.plane_ops = true;
    c.max_cube_units = 1024;
    c.max_cube_dim[0] = c.max_cube_dim[1] = 1024;
    c.max_cube_dim[2] = 64;
    c.max_shared = 48 * 1024;
    for (int s = 0; s < EM_SCALAR_COUNT; s++) c.dtype[s] = s != EM_BF16;
    c.matrix = api != NULL;
    if (api) {
        snprintf(c.matrix_api, sizeof(c.matrix_api), "%s", api);
        c.matrix_shapes[0] = (em_matrix_shape){16, 16, 16, EM_F16, EM_F16, EM_F32, EM_F32};
        c.matrix_shapes[1] = (em_matrix_shape){16, 16, 16, EM_F16, EM_F16, EM_F16, EM_F16};
        c.matrix_shape_count = 2;
    }
    return c;
}

/* GLSL for k (freed here) with caps c; NULL with the error set. */
static char *generate(em_ir_kernel *k, const em_caps *c)
{
    if (em_ir_simplify(k) != EM_OK) fail_msg("simplify: %s", em_last_error());
    const em_ir_kernel *ks[1] = {k};
    char *text = em_codegen_glsl(ks, 1, c);
    em_ir_kernel_free(k);
    return text;
}

static int run_shell(const char *cmd)
{
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) return 1;
    return WEXITSTATUS(rc);
}

/* Compiles GLSL text to SPIR-V (glslangValidator, target vulkan1.2 as the driver does for 1.2+
 * devices) and validates it (spirv-val, vulkan1.3). 0: valid; 1: rejected; -1: a tool is missing;
 * -2: glslang does not know `ext`. */
static int compile_and_validate(const char *text, const char *tag, const char *ext)
{
    bool ext_used = strstr(text, "cooperative_matrix : require") != NULL;
    char src[1200], spv[1200], log[1200], cmd[4096];
    snprintf(src, sizeof(src), "%s/%s.comp", tmp_dir, tag);
    snprintf(spv, sizeof(spv), "%s/%s.spv", tmp_dir, tag);
    snprintf(log, sizeof(log), "%s/%s.log", tmp_dir, tag);
    assert_int_equal(em_file_write_atomic(src, text, strlen(text)), EM_OK);
    if (run_shell("command -v glslangValidator >/dev/null 2>&1 && "
                  "command -v spirv-val >/dev/null 2>&1") != 0)
        return -1;
    snprintf(cmd, sizeof(cmd),
             "glslangValidator -V --target-env vulkan1.2 -S comp -o '%s' '%s' > '%s' 2>&1", spv,
             src, log);
    if (run_shell(cmd) != 0) {
        size_t n = 0;
        char *out = em_file_read(log, &n);
        bool unknown = out && ext && strstr(out, "extension not supported") && strstr(out, ext);
        if (!unknown) fprintf(stderr, "glslangValidator rejects %s:\n%s\n%s\n", tag, out, text);
        free(out);
        return unknown ? -2 : 1;
    }
    snprintf(cmd, sizeof(cmd), "spirv-val --target-env vulkan1.3 '%s'", spv);
    if (run_shell(cmd) != 0) {
        fprintf(stderr, "spirv-val rejects %s:\n%s\n", tag, text);
        return 1;
    }
    snprintf(cmd, sizeof(cmd),
             "spirv-dis '%s' 2>/dev/null | grep -q 'OpMemoryModel Logical Vulkan'", spv);
    /* cooperative-matrix shaders declare the Vulkan memory model (the driver enables it) */
    if (ext_used && run_shell(cmd) != 0) {
        fprintf(stderr, "%s does not use the Vulkan memory model\n", tag);
        return 1;
    }
    return 0;
}

static void expect_has(const char *text, const char *what)
{
    if (!strstr(text, what)) {
        fprintf(stderr, "%s\n", text);
        fail_msg("expected `%s` in the GLSL above", what);
    }
}

static void check_valid(const char *text, const char *tag, const char *ext)
{
    int rc = compile_and_validate(text, tag, ext);
    if (rc == -1)
        fprintf(stderr, "glslangValidator or spirv-val not installed: %s not compiled\n", tag);
    if (rc == -2)
        fprintf(stderr,
                "skipped: this glslang does not know %s (glslang 13+ does): %s generated, not "
                "compiled\n",
                ext, tag);
    if (rc == 1) fail_msg("%s: GLSL or SPIR-V rejected (see above)", tag);
}

static void test_nv_dialect_compiles(void **state)
{
    (void)state;
    em_caps c = coop_caps("VK_NV_cooperative_matrix");
    char *t = generate(mma_kernel(16, 16, 16, EM_F16, EM_F32, EM_F16), &c);
    if (!t) fail_msg("%s", em_last_error());
    expect_has(t, "#extension GL_NV_cooperative_matrix : require");
    expect_has(t, "#extension GL_KHR_memory_scope_semantics : require");
    expect_has(t, "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa_");
    expect_has(t, "fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> fc_");
    expect_has(t, "coopMatLoadNV(fb_");
    expect_has(t, ", true);"); /* b is loaded column-major */
    expect_has(t, " = coopMatMulAddNV(fa_");
    expect_has(t, "coopMatStoreNV(fc_");
    check_valid(t, "nv_mma", NULL);
    free(t);

    t = generate(matmul_kernel(), &c);
    if (!t) fail_msg("%s", em_last_error());
    expect_has(t, "shared float16_t "); /* matrix tiles in shared memory keep their type */
    expect_has(t, "float16_t(");        /* and ordinary stores into them convert */
    check_valid(t, "nv_matmul", NULL);
    free(t);

    /* f16 accumulators (listed) */
    t = generate(mma_kernel(16, 16, 16, EM_F16, EM_F16, EM_F16), &c);
    if (!t) fail_msg("%s", em_last_error());
    expect_has(t, "fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fc_");
    check_valid(t, "nv_mma_f16acc", NULL);
    free(t);
}

static void test_khr_dialect(void **state)
{
    (void)state;
    em_caps c = coop_caps("VK_KHR_cooperative_matrix");
    char *t = generate(mma_kernel(16, 16, 16, EM_F16, EM_F32, EM_F16), &c);
    if (!t) fail_msg("%s", em_last_error());
    expect_has(t, "#extension GL_KHR_cooperative_matrix : require");
    expect_has(t, "#extension GL_KHR_memory_scope_semantics : require");
    expect_has(t, "coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> fa_");
    expect_has(t, "coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> fb_");
    expect_has(t, "coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> fc_");
    expect_has(t, "gl_CooperativeMatrixLayoutColumnMajor);");
    expect_has(t, " = coopMatMulAdd(fa_");
    expect_has(t, "coopMatStore(fc_");
    check_valid(t, "khr_mma", "GL_KHR_cooperative_matrix");
    free(t);
    t = generate(matmul_kernel(), &c);
    if (!t) fail_msg("%s", em_last_error());
    expect_has(t, "shared float16_t ");
    check_valid(t, "khr_matmul", "GL_KHR_cooperative_matrix");
    free(t);
}

static void expect_error(em_ir_kernel *k, const em_caps *c, const char *w1, const char *w2)
{
    char *t = generate(k, c);
    if (t) fail_msg("expected an error, got:\n%s", t);
    const char *e = em_last_error();
    if (!strstr(e, w1) || (w2 && !strstr(e, w2)))
        fail_msg("error `%s` should name `%s` and `%s`", e, w1, w2 ? w2 : "");
}

static void test_errors_and_fallbacks(void **state)
{
    (void)state;
    /* no cooperative matrices, planes of 32: rejected, naming what is missing */
    em_caps none = coop_caps(NULL);
    expect_error(mma_kernel(16, 16, 16, EM_F16, EM_F32, EM_F16), &none, "caps.matrix",
                 "VK_KHR_cooperative_matrix");
    /* a shape the device does not list */
    em_caps c = coop_caps("VK_KHR_cooperative_matrix");
    expect_error(mma_kernel(16, 8, 16, EM_F16, EM_F32, EM_F16), &c, "lists no such combination",
                 "f16 x f16 + f32 -> f32 16x16x16");
    /* f32 A/B is not listed either */
    expect_error(mma_kernel(16, 16, 16, EM_F32, EM_F32, EM_F32), &c, "lists no such combination",
                 "fa");
    /* bf16 has no cooperative-matrix type in GLSL */
    em_caps any = c;
    any.matrix_shape_count = 0;
    any.dtype[EM_BF16] = true;
    expect_error(mma_kernel(16, 16, 16, EM_BF16, EM_F32, EM_BF16), &any, "bf16", "fa");
    /* an mma whose combination is not listed although each fragment is */
    em_caps only32 = c;
    only32.matrix_shapes[1] = (em_matrix_shape){16, 16, 16, EM_F32, EM_F32, EM_F16, EM_F16};
    expect_error(mma_kernel(16, 16, 16, EM_F16, EM_F16, EM_F16), &only32,
                 "no cooperative-matrix mma", "f16 x f16 + f16 -> f16");
    /* planes of one unit: loops, as before */
    em_caps one = coop_caps(NULL);
    one.plane_dim = 1;
    one.plane_ops = false;
    char *t = generate(mma_kernel(16, 16, 16, EM_F16, EM_F32, EM_F16), &one);
    if (!t) fail_msg("%s", em_last_error());
    assert_null(strstr(t, "coopmat"));
    assert_null(strstr(t, "cooperative_matrix"));
    check_valid(t, "loops_mma", NULL);
    free(t);
}

/* The kernel-language kernels with matrix ops: the conformance corpus's (matrix.ek) and the
 * built-in tensor-core matmul (f16 in, f32 and f16 out; when the build has it), in both dialects.
 */
static void lang_kernel(const em_lang_module *m, const char *kernel, const em_lang_bind *b,
                        size_t nb, const char *tag, const char *api, const char *ext)
{
    em_caps c = coop_caps(api);
    em_lang_spec spec = {b, nb, 1, &c};
    em_ir_kernel *k = em_lang_specialize(m, kernel, &spec, NULL);
    if (!k) fail_msg("specialize %s: %s", kernel, em_last_error());
    char *t = generate(k, &c);
    if (!t) fail_msg("%s: %s", tag, em_last_error());
    expect_has(t, "cooperative_matrix : require");
    check_valid(t, tag, ext);
    free(t);
}

static void test_language_kernels(void **state)
{
    (void)state;
    em_lang_module *corpus =
        em_lang_module_from_file(EMBER_SOURCE_DIR "/tests/conformance/kernels/matrix.ek", NULL);
    if (!corpus) fail_msg("matrix.ek: %s", em_last_error());
    static const char *const apis[2][2] = {
        {"VK_NV_cooperative_matrix", NULL},
        {"VK_KHR_cooperative_matrix", "GL_KHR_cooperative_matrix"}};
    for (int i = 0; i < 2; i++) {
        char tag[64];
        snprintf(tag, sizeof(tag), "mma16_%d", i);
        lang_kernel(corpus, "mma16", NULL, 0, tag, apis[i][0], apis[i][1]);
        snprintf(tag, sizeof(tag), "mma_tiled_%d", i);
        lang_kernel(corpus, "mma_tiled", NULL, 0, tag, apis[i][0], apis[i][1]);
    }
    em_lang_module_free(corpus);
    const em_lang_module *b = em_lang_builtins();
    if (!b || !em_lang_has_kernel(b, "matmul_mma")) {
        fprintf(stderr, "no built-in matmul_mma in this build: not checked\n");
        return;
    }
    for (int i = 0; i < 2; i++)
        for (int o = 0; o < 2; o++) {
            em_lang_bind binds[] = {em_lang_bind_type("T", EM_F16),
                                    em_lang_bind_type("O", o ? EM_F16 : EM_F32),
                                    em_lang_bind_int("PLANE", 32)};
            char tag[64];
            snprintf(tag, sizeof(tag), "matmul_mma_%d_%d", i, o);
            lang_kernel(b, "matmul_mma", binds, 3, tag, apis[i][0], apis[i][1]);
        }
}

/* ---- the driver's choice (vulkan_coopmat.c), without a device ---------------------------------
 */

static const char khr_src[] =
    "#version 450\n#extension GL_KHR_cooperative_matrix : require\n"
    "#extension GL_KHR_memory_scope_semantics : require\nlayout(local_size_x = 32) in;\n"
    "layout(std430, binding = 0) buffer B { float d[]; } b;\nvoid main() {\n"
    "    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> m =\n"
    "        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(1.0);\n"
    "    coopMatStore(m, b.d, 0, 16, gl_CooperativeMatrixLayoutRowMajor);\n}\n";

static void test_driver_choice(void **state)
{
    (void)state;
    if (run_shell("command -v glslangValidator >/dev/null 2>&1") != 0 &&
        !getenv("EMBER_SHADERC_LIB"))
        fprintf(stderr, "note: no glslangValidator: the compiler probes below answer false\n");
    em_vk_device *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    d->env_name = "vulkan1.2";
    d->spirv_env = (1u << 22) | (2u << 12);
    /* the probe: a plain shader compiles, a broken one does not; the error state is kept */
    em_set_error(EM_ERR_NOT_FOUND, "an earlier error");
    bool plain =
        em_rt_vk_glsl_compiles(d, "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n");
    assert_false(em_rt_vk_glsl_compiles(d, "#version 450\nvoid main() { nonsense }\n"));
    assert_string_equal(em_last_error(), "an earlier error");
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
    bool khr_compiles = em_rt_vk_glsl_compiles(d, khr_src);
    fprintf(stderr, "the GLSL compiler %s GL_KHR_cooperative_matrix\n",
            khr_compiles ? "knows" : "does not know");

    em_vk_coopmat cm;
    memset(&cm, 0, sizeof(cm));
    unsetenv("EMBER_VK_COOPMAT");
    /* extension absent: nothing, and no reason to give */
    em_rt_vk_coopmat_choose(d, true, &cm);
    assert_int_equal(cm.api, EM_VK_COOPMAT_NONE);
    assert_int_equal(cm.count, 0);
    assert_string_equal(cm.why, "");
    void *feature = NULL;
    uint64_t storage[8];
    assert_null(em_rt_vk_coopmat_enable(&cm, storage, sizeof(storage), &feature));
    assert_null(feature);
    /* both listed (an NVIDIA driver) */
    cm.khr = cm.nv = true;
    cm.nkhr = 2;
    cm.khr_shapes[0] = (em_matrix_shape){16, 16, 16, EM_F16, EM_F16, EM_F32, EM_F32};
    cm.khr_shapes[1] = (em_matrix_shape){16, 8, 16, EM_F16, EM_F16, EM_F16, EM_F16};
    cm.nnv = 1;
    cm.nv_shapes[0] = (em_matrix_shape){16, 8, 8, EM_F16, EM_F16, EM_F32, EM_F32};
    em_rt_vk_coopmat_choose(d, true, &cm);
    if (plain) {
        assert_int_equal(cm.api, khr_compiles ? EM_VK_COOPMAT_KHR : EM_VK_COOPMAT_NV);
        assert_int_equal(cm.count, khr_compiles ? 2 : 1);
        assert_int_equal(cm.shapes[0].n, khr_compiles ? 16 : 8);
    }
    assert_string_equal(em_rt_vk_coopmat_enable(&cm, storage, sizeof(storage), &feature),
                        cm.api == EM_VK_COOPMAT_KHR ? "VK_KHR_cooperative_matrix"
                                                    : "VK_NV_cooperative_matrix");
    assert_non_null(feature);
    /* no Vulkan memory model: none, saying why */
    em_rt_vk_coopmat_choose(d, false, &cm);
    assert_int_equal(cm.api, EM_VK_COOPMAT_NONE);
    assert_non_null(strstr(cm.why, "vulkanMemoryModel"));
    /* forced */
    setenv("EMBER_VK_COOPMAT", "khr", 1);
    em_rt_vk_coopmat_choose(d, true, &cm);
    assert_int_equal(cm.api, EM_VK_COOPMAT_KHR);
    assert_int_equal(cm.count, 2);
    setenv("EMBER_VK_COOPMAT", "off", 1);
    em_rt_vk_coopmat_choose(d, true, &cm);
    assert_int_equal(cm.api, EM_VK_COOPMAT_NONE);
    assert_non_null(strstr(cm.why, "EMBER_VK_COOPMAT=off"));
    /* only KHR, and a compiler that does not know it: none, saying so */
    unsetenv("EMBER_VK_COOPMAT");
    cm.nv = false;
    em_rt_vk_coopmat_choose(d, true, &cm);
    if (!khr_compiles) {
        assert_int_equal(cm.api, EM_VK_COOPMAT_NONE);
        assert_non_null(strstr(cm.why, "GL_KHR_cooperative_matrix"));
    }
    free(d);
    em_clear_error();
}

/* ---- on the device -------------------------------------------------------------------------- */

static const char *test_device(void)
{
    const char *e = getenv("EMBER_TEST_DEVICE");
    return e && strncmp(e, "vulkan:", 7) == 0 ? e : "vulkan:0";
}

static uint16_t to_half(double v) /* exact for the small multiples of 1/4 used here */
{
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    double a = fabs(v);
    int e = 0;
    while (a >= 2) {
        a /= 2;
        e++;
    }
    while (a < 1) {
        a *= 2;
        e--;
    }
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1) * 1024 + 0.5));
}

static em_buffer *upload(em_device *dev, const void *data, size_t bytes)
{
    em_buffer *b = em_buffer_alloc(dev, bytes);
    if (!b) fail_msg("alloc: %s", em_last_error());
    if (data && em_buffer_write(b, 0, data, bytes) != EM_OK) fail_msg("write: %s", em_last_error());
    return b;
}

/* Runs the shared-memory matmul (M x K) * (K x N) and compares with a float64 reference. */
static void run_matmul(em_device *dev, em_kernel *kern, uint32_t P)
{
    enum { M = 32, N = 48, K = 64 };
    static uint16_t ha[M * K], hb[K * N];
    static float hc[M * N];
    static double a[M * K], b[K * N];
    for (int i = 0; i < M * K; i++) a[i] = ((i * 7) % 11 - 5) * 0.25;
    for (int i = 0; i < K * N; i++) b[i] = ((i * 3) % 13 - 6) * 0.5;
    for (int i = 0; i < M * K; i++) ha[i] = to_half(a[i]);
    for (int i = 0; i < K * N; i++) hb[i] = to_half(b[i]);
    em_buffer *ba = upload(dev, ha, sizeof(ha)), *bb = upload(dev, hb, sizeof(hb)),
              *bc = upload(dev, NULL, sizeof(hc));
    em_arg args[] = {em_arg_buffer(ba, M * K), em_arg_buffer(bb, K * N), em_arg_buffer(bc, M * N),
                     em_arg_u32(N), em_arg_u32(K)};
    uint32_t count[3] = {N / 16, M / 16, 1}, dim[3] = {P, 1, 1};
    if (em_launch(kern, count, dim, args, 5) != EM_OK) fail_msg("launch: %s", em_last_error());
    if (em_buffer_read(bc, 0, hc, sizeof(hc)) != EM_OK) fail_msg("read: %s", em_last_error());
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += a[m * K + k] * b[k * N + n];
            if (fabs(hc[m * N + n] - s) > 1e-3)
                fail_msg("c[%d][%d] = %.9g, expected %.9g", m, n, hc[m * N + n], s);
        }
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bc);
}

static void test_device_caps_and_run(void **state)
{
    (void)state;
    em_device *dev = rt_open_or_skip("vulkan", test_device());
    const em_caps *c = em_device_caps(dev);
    fprintf(stderr, "%s: %s, plane size %u, matrix %s%s%s\n", test_device(), c->device_name,
            c->plane_dim, c->matrix ? "yes" : "no", c->matrix_api[0] ? " through " : "",
            c->matrix_api);
    for (uint32_t i = 0; i < c->matrix_shape_count; i++) {
        const em_matrix_shape *x = &c->matrix_shapes[i];
        fprintf(stderr, "  %s x %s + %s -> %s %ux%ux%u\n", em_scalar_name((em_scalar)x->a),
                em_scalar_name((em_scalar)x->b), em_scalar_name((em_scalar)x->c),
                em_scalar_name((em_scalar)x->d), x->m, x->n, x->k);
    }
    /* "extension absent" is clean: no API, no combinations */
    assert_true(c->matrix_shape_count <= EM_CAPS_MATRIX_SHAPES);
    if (!c->matrix) assert_int_equal(c->matrix_shape_count, 0);
    if (c->matrix) {
        assert_true(strcmp(c->matrix_api, "VK_KHR_cooperative_matrix") == 0 ||
                    strcmp(c->matrix_api, "VK_NV_cooperative_matrix") == 0);
        for (uint32_t i = 0; i < c->matrix_shape_count; i++)
            assert_true(c->matrix_shapes[i].m && c->matrix_shapes[i].n && c->matrix_shapes[i].k);
    }
    bool plane_one = !c->plane_ops || c->plane_dim <= 1;
    bool f16mma = !c->matrix_shape_count;
    for (uint32_t i = 0; i < c->matrix_shape_count; i++) {
        const em_matrix_shape *x = &c->matrix_shapes[i];
        f16mma |= x->m == 16 && x->n == 16 && x->k == 16 && x->a == EM_F16 && x->b == EM_F16 &&
                  x->c == EM_F32 && x->d == EM_F32;
    }
    if (!c->dtype[EM_F16]) {
        fprintf(stderr, "skipped the runs: no f16 buffers on this device\n");
        em_device_close(dev);
        return;
    }
    em_ir_kernel *ir = matmul_kernel();
    em_kernel *kern = em_kernel_compile(dev, ir);
    em_ir_kernel_free(ir);
    if (!c->matrix && !plane_one) {
        assert_null(kern);
        if (!strstr(em_last_error(), "caps.matrix"))
            fail_msg("the error should name caps.matrix: %s", em_last_error());
    } else if (c->matrix && !f16mma) {
        fprintf(stderr, "the device lists no f16 x f16 + f32 16x16x16: %s\n",
                kern ? "compiled anyway" : em_last_error());
    } else {
        if (!kern) fail_msg("compile: %s", em_last_error());
        run_matmul(dev, kern, c->plane_dim ? c->plane_dim : 1);
        fprintf(stderr, "coop_matmul ran and matched (%s)\n", c->matrix ? c->matrix_api : "loops");
    }
    em_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nv_dialect_compiles),  cmocka_unit_test(test_khr_dialect),
        cmocka_unit_test(test_errors_and_fallbacks), cmocka_unit_test(test_language_kernels),
        cmocka_unit_test(test_driver_choice),        cmocka_unit_test(test_device_caps_and_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
