/* test_frontend.c — the kernel language's host API and the shape of the IR it produces: modules
 * from several strings and from files, kernel listing, the built-in kernels, the per-binding
 * specialization cache, golden IR text for small kernels (short-circuit guards and helper returns
 * become control flow), and the `ember kernel` command (check, list, dump). */
#include <sys/stat.h>
#include <sys/wait.h>

#include "base/file.h"
#include "lang/lang_util.h"

/* ---- modules -----------------------------------------------------------------------------------
 */

static void test_module_from_several_strings(void **state)
{
    (void)state;
    const char *names[] = {"helpers.ek", "main.ek"};
    const char *srcs[] = {
        "inline<F: float> F half(F x) { return x / F(2); }\nconst u32 BLOCK = 64;\n",
        "kernel<F: float> void halve(tensor(F) x) cube_dim(BLOCK)\n"
        "{\n    if (ABSOLUTE_POS < len(x)) { x[ABSOLUTE_POS] = half(x[ABSOLUTE_POS]); }\n}\n"
        "kernel void nothing() { }\n"};
    em_lang_module *m = em_lang_module_from_strings(names, srcs, 2, NULL);
    assert_non_null(m);
    assert_int_equal(em_lang_kernel_count(m), 2);
    assert_string_equal(em_lang_kernel_name(m, 0), "halve");
    assert_string_equal(em_lang_kernel_name(m, 1), "nothing");
    assert_null(em_lang_kernel_name(m, 2));
    assert_true(em_lang_has_kernel(m, "halve"));
    assert_false(em_lang_has_kernel(m, "half")); /* a helper, not a kernel */
    assert_int_equal(em_lang_check(m, NULL), EM_OK);
    em_ir_kernel *k = em_lang_specialize(m, "halve", NULL, NULL);
    assert_non_null(k);
    uint32_t dim[3];
    em_ir_cube_dim(k, dim);
    assert_int_equal(dim[0], 64);
    em_ir_kernel_free(k);
    em_lang_module_free(m);

    /* an error in the second file names that file */
    srcs[1] = "kernel void f() { u32 x = y; }\n";
    em_lang_diags *d = em_lang_diags_new();
    assert_null(em_lang_module_from_strings(names, srcs, 2, d));
    assert_int_equal(em_lang_diags_count(d), 1);
    assert_string_equal(em_lang_diags_at(d, 0)->file, "main.ek");
    assert_string_equal(em_lang_diags_at(d, 0)->src_line, "kernel void f() { u32 x = y; }");
    em_lang_diags_free(d);
}

static void test_module_from_file(void **state)
{
    (void)state;
    assert_int_equal(em_mkdir_p(EMBER_TEST_TMP), EM_OK);
    const char *path = EMBER_TEST_TMP "/lang_module.ek";
    const char *src = "kernel void one(tensor(u32) o) { o[0] = 1; }\n";
    assert_int_equal(em_file_write_atomic(path, src, strlen(src)), EM_OK);
    em_lang_module *m = em_lang_module_from_file(path, NULL);
    assert_non_null(m);
    assert_int_equal(em_lang_kernel_count(m), 1);
    em_lang_module_free(m);
    /* a NUL byte inside a file is reported where it is, not taken as the end of the file */
    const char *nul_path = EMBER_TEST_TMP "/lang_nul.ek";
    assert_int_equal(em_file_write_atomic(nul_path, "kernel void f() {\0 }", 21), EM_OK);
    em_lang_diags *d = em_lang_diags_new();
    assert_null(em_lang_module_from_file(nul_path, d));
    assert_int_equal(em_lang_diags_at(d, 0)->line, 1);
    assert_int_equal(em_lang_diags_at(d, 0)->col, 18);
    assert_string_equal(em_lang_diags_at(d, 0)->message, "unexpected NUL byte in source");
    em_lang_diags_free(d);
    assert_null(em_lang_module_from_file(EMBER_TEST_TMP "/no-such-file.ek", NULL));
    assert_true(em_last_status() == EM_ERR_NOT_FOUND || em_last_status() == EM_ERR_IO);
    assert_non_null(strstr(em_last_error(), "no-such-file.ek"));
}

static void test_builtins_load_and_check(void **state)
{
    (void)state;
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    assert_ptr_equal(m, em_lang_builtins());
    /* the language's own built-ins (activation.ek, elementwise.ek, reduce.ek) specialize with
     * their defaults; other layers' built-ins are tested by their layers */
    const char *mine[] = {"add", "mul", "axpy", "gelu", "gelu_tanh", "relu", "sum_cubes"};
    for (size_t i = 0; i < sizeof(mine) / sizeof(mine[0]); i++) {
        assert_true(em_lang_has_kernel(m, mine[i]));
        em_ir_kernel *k = em_lang_specialize(m, mine[i], NULL, NULL);
        if (!k) fprintf(stderr, "%s: %s\n", mine[i], em_last_error());
        assert_non_null(k);
        em_ir_kernel_free(k);
    }
}

/* ---- specialization cache
 * ----------------------------------------------------------------------------- */

static void test_one_binary_per_binding(void **state)
{
    (void)state;
    const em_lang_module *m = em_lang_builtins();
    em_lang_bind f32b[] = {em_lang_bind_type("F", EM_F32)};
    em_lang_bind f64b[] = {em_lang_bind_type("F", EM_F64)};
    em_lang_spec a = {f32b, 1, 4, NULL}, b = {f32b, 1, 4, NULL}, c = {f64b, 1, 4, NULL},
                 w = {f32b, 1, 2, NULL};
    em_kernel *ka = em_lang_compile(g_dev, m, "relu", &a);
    em_kernel *kb = em_lang_compile(g_dev, m, "relu", &b);
    em_kernel *kc = em_lang_compile(g_dev, m, "relu", &c);
    em_kernel *kw = em_lang_compile(g_dev, m, "relu", &w);
    assert_non_null(ka);
    assert_non_null(kc);
    assert_non_null(kw);
    assert_ptr_equal(ka, kb);
    assert_ptr_not_equal(ka, kc);
    assert_ptr_not_equal(ka, kw);
    assert_ptr_not_equal(kc, kw);
    /* an unknown kernel fails cleanly */
    assert_null(em_lang_compile(g_dev, m, "nope", &a));
    assert_non_null(strstr(em_last_error(), "no kernel named 'nope'"));
}

/* ---- IR shape
 * ------------------------------------------------------------------------------------------ */

static char *ir_of(const char *src, const char *kernel)
{
    em_lang_module *m = must_load(src);
    em_ir_kernel *k = em_lang_specialize(m, kernel, NULL, NULL);
    assert_non_null(k);
    char *text = em_ir_print_kernel(k);
    em_ir_kernel_free(k);
    em_lang_module_free(m);
    return text;
}

static void test_golden_ir(void **state)
{
    (void)state;
    char *text = ir_of(
        "kernel void axpb(const tensor(f32) x, tensor(f32) y, f32 a)\n"
        "{\n    if (ABSOLUTE_POS < len(x)) { y[ABSOLUTE_POS] = a * x[ABSOLUTE_POS] + 1.0; }\n}\n",
        "axpb");
    assert_string_equal(
        text, "kernel axpb(@1.x: global f32 rank 0 read, @2.y: global f32 rank 0 read_write, "
              "%1.a: f32) {\n"
              "    %2: u32 = builtin ABSOLUTE_POS\n"
              "    %3: u32 = len @1.x\n"
              "    %4: bool = lt %2, %3\n"
              "    if %4 {\n"
              "        %5: u32 = builtin ABSOLUTE_POS\n"
              "        %6: u32 = builtin ABSOLUTE_POS\n"
              "        %7: f32 = load @1.x[%6]\n"
              "        %8: f32 = mul %1.a, %7\n"
              "        %10: f32 = add %8, 1f32\n"
              "        store @2.y[%5], %10\n"
              "    }\n"
              "}\n");
    free(text);
    /* a helper returning from inside a loop: a result variable, a done flag, a break */
    text = ir_of(
        "inline u32 first_neg(const array(i32) a, u32 n)\n"
        "{\n    for (u32 i in range(n)) { if (a[i] < 0) { return i; } }\n    return n;\n}\n"
        "kernel void k(const tensor(i32) a, tensor(u32) o) { o[0] = first_neg(a, len(a)); }\n",
        "k");
    assert_string_equal(
        text, "kernel k(@1.a: global i32 rank 0 read, @2.o: global u32 rank 0 read_write) {\n"
              "    var %3.first_neg: u32\n"
              "    var %4: bool\n"
              "    var %6.i: u32\n"
              "    %2: u32 = len @1.a\n"
              "    %4 = false\n"
              "    range %6.i = 0u32 .. %2 step 1u32 {\n"
              "        %8: i32 = load @1.a[%6.i]\n"
              "        %10: bool = lt %8, 0i32\n"
              "        if %10 {\n"
              "            %3.first_neg = %6.i\n"
              "            %4 = true\n"
              "            break\n"
              "        }\n"
              "    }\n"
              "    %12: bool = not %4\n"
              "    if %12 {\n"
              "        %3.first_neg = %2\n"
              "        %4 = true\n"
              "    }\n"
              "    store @2.o[0u32], %3.first_neg\n"
              "}\n");
    free(text);
}

static void test_guarded_load_stays_guarded(void **state)
{
    (void)state;
    char *text =
        ir_of("kernel void g(const tensor(i32) a, tensor(i32) o)\n"
              "{\n    u32 i = ABSOLUTE_POS;\n    o[0] = i < len(a) && a[i] > 0 ? a[i] : 0;\n}\n",
              "g");
    /* both loads sit inside an if (indented twice), never at the top level */
    const char *p = text;
    int loads = 0;
    while ((p = strstr(p, "= load @1.a")) != NULL) {
        const char *line = p;
        while (line > text && line[-1] != '\n') line--;
        assert_true(strncmp(line, "        %", 9) == 0);
        loads++;
        p++;
    }
    assert_int_equal(loads, 2);
    free(text);
}

/* copy_async is an asynchronous copy for CUDA (the IR's copy ops, cp.async there) and plain loads
 * and stores elsewhere, where commit and wait disappear. */
static void test_copy_async_lowering(void **state)
{
    (void)state;
    em_lang_module *m = must_load(
        "kernel void cp(const tensor(bf16) x, tensor(bf16) y)\n{\n    shared bf16 s[64];\n"
        "    copy_async(s, UNIT_POS * 8, x, UNIT_POS * 8, 8, UNIT_POS < 8);\n"
        "    copy_async_commit();\n    copy_async_wait(0);\n    sync_cube();\n"
        "    y[UNIT_POS] = s[63 - UNIT_POS];\n}\n");
    em_caps caps;
    memset(&caps, 0, sizeof caps);
    snprintf(caps.target, sizeof caps.target, "cuda");
    snprintf(caps.arch, sizeof caps.arch, "sm_90");
    caps.plane_dim = 32;
    em_lang_spec spec = {NULL, 0, 1, &caps};
    for (int cuda = 0; cuda < 2; cuda++) {
        em_ir_kernel *k = em_lang_specialize(m, "cp", cuda ? &spec : NULL, NULL);
        assert_non_null(k);
        assert_int_equal(em_ir_verify(k, 0), EM_OK);
        char *text = em_ir_print_kernel(k);
        if (cuda) {
            assert_non_null(strstr(text, "copy_async @3.s["));
            assert_non_null(strstr(text, "<- @1.x["));
            assert_non_null(strstr(text, "] x 8u32 if %"));
            assert_non_null(strstr(text, "copy_commit\n"));
            assert_non_null(strstr(text, "copy_wait 0\n"));
        } else {
            assert_null(strstr(text, "copy_"));
            assert_non_null(strstr(text, "= load @1.x["));
        }
        free(text);
        em_ir_kernel_free(k);
    }
    em_lang_module_free(m);
}

/* ---- the ember kernel command
 * ------------------------------------------------------------------------------ */

/* Runs a shell command; returns its exit status and its output (stdout and stderr) in out. */
static int run(const char *cmd, char *out, size_t outsz)
{
    char full[2048];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, outsz - 1, f);
    out[n] = 0;
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_cli(void **state)
{
    (void)state;
    static char out[1 << 16];
    char cmd[1024];
    assert_int_equal(em_mkdir_p(EMBER_TEST_TMP), EM_OK);
    const char *good = EMBER_TEST_TMP "/cli_good.ek", *bad = EMBER_TEST_TMP "/cli_bad.ek";
    const char *good_src =
        "kernel<F: float> void scale(tensor(line(F)) x, comptime u32 K = 3)\n"
        "{\n    if (ABSOLUTE_POS < len(x)) { x[ABSOLUTE_POS] = x[ABSOLUTE_POS] * F(K); }\n}\n";
    const char *bad_src = "kernel void f(tensor(f32) x)\n{\n    x[0] = y;\n}\n";
    assert_int_equal(em_file_write_atomic(good, good_src, strlen(good_src)), EM_OK);
    assert_int_equal(em_file_write_atomic(bad, bad_src, strlen(bad_src)), EM_OK);

    snprintf(cmd, sizeof(cmd), "%s kernel check %s", EMBER_CLI_PATH, good);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "ok (1 kernel)"));

    snprintf(cmd, sizeof(cmd), "%s kernel check %s %s", EMBER_CLI_PATH, good, bad);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(
        strstr(out, "cli_bad.ek:3:12: error: use of undeclared identifier 'y'\n    x[0] = y;\n"
                    "           ^\nhint: did you mean 'x'?\n"));

    snprintf(cmd, sizeof(cmd),
             "%s kernel dump %s --kernel scale --set F=f64 --set K=5 --set LINE_WIDTH=2 --target c",
             EMBER_CLI_PATH, good);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "kernel scale("));
    assert_non_null(strstr(out, "f64x2"));
    assert_non_null(strstr(out, "5f64"));
    assert_non_null(strstr(out, "emk_scale"));

    snprintf(cmd, sizeof(cmd), "%s kernel dump %s --set F=i32", EMBER_CLI_PATH, good);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(
        out, "type 'i32' does not satisfy the bound 'float' of generic 'F' of kernel 'scale'"));

    snprintf(cmd, sizeof(cmd), "%s kernel dump %s --target nosuch", EMBER_CLI_PATH, good);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "nosuch"));

    snprintf(cmd, sizeof(cmd), "%s kernel dump --example add", EMBER_CLI_PATH);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "kernel add("));

    snprintf(cmd, sizeof(cmd), "%s kernel dump --builtin --kernel gelu --set F=f16",
             EMBER_CLI_PATH);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "erf"));

    /* --arch: the architecture's features (has(wgmma) on sm_90a) reach the specialization */
    const char *hop = EMBER_TEST_TMP "/cli_arch.ek";
    const char *hop_src = "kernel void w(tensor(u32) o)\n{\n    comptime if (has(wgmma)) { o[0] = "
                          "71u; } else { o[0] = 72u; }\n}\n";
    assert_int_equal(em_file_write_atomic(hop, hop_src, strlen(hop_src)), EM_OK);
    snprintf(cmd, sizeof(cmd), "%s kernel dump %s --target cuda --arch sm_90a", EMBER_CLI_PATH,
             hop);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_true(strstr(out, "71") && !strstr(out, "72"));
    snprintf(cmd, sizeof(cmd), "%s kernel dump %s --target cuda", EMBER_CLI_PATH, hop);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_true(strstr(out, "72") && !strstr(out, "71"));

    snprintf(cmd, sizeof(cmd), "%s kernel list", EMBER_CLI_PATH);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "gelu\n"));

    snprintf(cmd, sizeof(cmd), "%s kernel frobnicate", EMBER_CLI_PATH);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_module_from_several_strings),
        cmocka_unit_test(test_module_from_file),
        cmocka_unit_test(test_builtins_load_and_check),
        cmocka_unit_test(test_one_binary_per_binding),
        cmocka_unit_test(test_golden_ir),
        cmocka_unit_test(test_guarded_load_stays_guarded),
        cmocka_unit_test(test_copy_async_lowering),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
