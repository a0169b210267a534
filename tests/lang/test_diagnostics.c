/* test_diagnostics.c — malformed kernel programs, each with its exact first diagnostic (line,
 * column, message and, where one is given, the hint); the text format with the source line and
 * caret; the error limit; binding errors at specialization; and inputs built to exhaust the
 * front end's limits (nesting, unrolling, inlining), which must end in a diagnostic. */
#include "lang/lang_util.h"

typedef struct bad_case {
    const char *src;     /* the program */
    uint32_t line, col;  /* where the first error is */
    const char *message; /* its message */
    const char *hint;    /* its hint (NULL: not checked) */
} bad_case;

static const bad_case cases[] = {
    /* ---- lexical ---- */
    {"kernel void f()\n{\n    u32 x = 1 @ 2;\n}\n", 3, 15, "unexpected character '@'", NULL},
    {"kernel void f() {\n    /* never closed\n}\n", 2, 5, "unterminated comment", NULL},
    {"kernel void f() {\n    print(\"abc);\n}\n", 2, 11, "unterminated string literal", NULL},
    {"kernel void f() { u64 x = 99999999999999999999; }", 1, 27,
     "integer literal '99999999999999999999' is too large (the limit is 9223372036854775807)",
     NULL},
    {"kernel void f() { u32 x = 12abc; }", 1, 27, "invalid suffix on number '12abc'", NULL},
    {"kernel void f() { print(\"\\q\"); }", 1, 26, "unknown escape sequence '\\q'", NULL},
    {"kernel void f() { u32 x = 5000000000u; }", 1, 27,
     "integer literal 5000000000u does not fit in 'u32'", "write u64(...) for wider values"},
    /* ---- syntax ---- */
    {"kernel void f() {\n    u32 x = 1\n}\n", 3, 1, "expected ';' after the declaration, found '}'",
     NULL},
    {"kernel void f() {\n    u32 x = 1;\n    if x > 0 { }\n}\n", 3, 8,
     "expected '(' after 'if', found 'x'", NULL},
    {"kernel void f() { u32 x = (1 + 2; }", 1, 33, "expected ')', found ';'", NULL},
    {"kernel void f() {\n    for (u32 i = 0; i < 4; i++) { }\n}\n", 2, 16,
     "expected 'in' after the loop variable, found '='",
     "loops are written 'for (u32 i in range(start, end))'"},
    {"kernel void f() { else { } }", 1, 19, "'else' without a matching 'if'", NULL},
    {"kernal void f() { }", 1, 1,
     "expected a declaration (kernel, helper function or const), found 'kernal'",
     "did you mean 'kernel'?"},
    {"kernel void f() { u32 a = 1; u32 b = 2; a = b = 3; }", 1, 47,
     "assignments cannot be chained: an assignment is a statement", NULL},
    {"kernel void f() { u32 x = 1; u32 y = x++; }", 1, 39,
     "expected ';' after the declaration, found '++'", NULL},
    {"kernel void f() {\n    kernel void g() { }\n}\n", 2, 5,
     "functions cannot be declared inside a function", NULL},
    {"kernel<F: floot> void f() { }", 1, 11, "unknown bound 'floot'", "did you mean 'float'?"},
    {"kernel void f();", 1, 16, "expected '{' to open the body of 'f', found ';'", NULL},
    {"kernel void f() { for (u32 i in range(1, 2, 3, 4)) { } }", 1, 33,
     "range takes 1 to 3 arguments (end; start, end; start, end, step)", NULL},
    {"kernel void f() { matrix(c, f32, 16, 16, 16) m; }", 1, 26,
     "unknown matrix role 'c' (expected a, b or acc)", NULL},
    {"kernel void f() {\n    u32 x = 1;\n", 3, 1,
     "expected '}' to close the block opened at line 1", NULL},
    /* ---- names, declarations, control flow ---- */
    {"kernel void f(const tensor(f32) input, tensor(f32) out)\n{\n    out[0] = inptu[1];\n}\n", 3,
     14, "use of undeclared identifier 'inptu'", "did you mean 'input'?"},
    {"kernel void f(tensor(f32) a) { a[0] = expp(1.0); }", 1, 39,
     "call to undeclared function 'expp'", "did you mean 'exp' or 'exp2'?"},
    {"kernel void f() {\n    u32 x = 1;\n    u32 x = 2;\n}\n", 3, 9,
     "redefinition of 'x' (first declared at line 2)", NULL},
    {"kernel void f() { }\nkernel void f() { }\n", 2, 13,
     "redefinition of 'f' (first defined at line 1)", NULL},
    {"kernel void f() { break; }", 1, 19, "'break' outside of a loop", NULL},
    {"kernel void f() { comptime for (u32 i in range(4)) { continue; } }", 1, 54,
     "'continue' cannot leave a comptime for (its iterations are unrolled)", NULL},
    {"kernel void f() { return 1; }", 1, 26, "kernel 'f' cannot return a value", NULL},
    {"inline u32 g(u32 x) { if (x > 1) { return 1; } }", 1, 12,
     "non-void function 'g' does not end with a return statement", NULL},
    {"inline u32 g(u32 x) { return h(x); }\ninline u32 h(u32 x) { return g(x); }\n", 2, 30,
     "recursive call to 'g'", NULL},
    {"kernel void k() { }\nkernel void f() { k(); }\n", 2, 19,
     "'k' is a kernel; only helper functions can be called", NULL},
    {"kernel void f(tensor(f32) a) { a[0] = exp(1.0, 2.0); }", 1, 39,
     "'exp' takes 1 argument, got 2", NULL},
    {"inline f32 g(f32 x) { return x; }\nkernel void f(tensor(f32) a) { a[0] = g(1.0, 2.0); }\n", 2,
     39, "'g' takes 1 argument, got 2", NULL},
    {"kernel void f() { const u32 x = 1; x = 2; }", 1, 36, "cannot assign to constant 'x'", NULL},
    {"kernel void f() { for (u32 i in range(4)) { i = 2; } }", 1, 45,
     "cannot assign to loop variable 'i'", NULL},
    {"kernel void f(const tensor(f32) a) { a[0] = 1.0; }", 1, 38,
     "cannot write to read-only parameter 'a'", NULL},
    {"kernel void f() { int x = 1; }", 1, 19, "unknown type 'int'",
     "scalar types are named bool, i8..i64, u8..u64, f16, bf16, f32, f64: did you mean 'i32'?"},
    {"kernel void f() { intrinsic(\"cuda.ptx:trap;\"); }", 1, 19,
     "intrinsic 'cuda.ptx:trap;' is not guarded by 'comptime if (has(TARGET))' for its target",
     NULL},
    {"kernel void f() { comptime if (has(cuad)) { } }", 1, 36, "unknown capability 'cuad'",
     "did you mean 'cuda'?"},
    {"kernel void f() { u32 x = 1; x + 1; }", 1, 30, "this statement has no effect", NULL},
    {"kernel void f() { tensor(f32) t; }", 1, 19, "tensor types are only allowed for parameters",
     NULL},
    {"inline<T: float> f32 g(f32 x) { return x; }", 1, 8,
     "generic parameter 'T' of 'g' is not used by any parameter, so it cannot be inferred", NULL},
    {"kernel void f() { shared f32 t; }", 1, 30, "shared memory must be an array", NULL},
    {"kernel void f() { auto x; }", 1, 24, "'auto' variable 'x' needs an initializer", NULL},
    {"kernel void f() { u32 x = \"abc\"; }", 1, 27,
     "string literals are only allowed in print and intrinsic", NULL},
    {"kernel<F: float> void f() { F x = F; }", 1, 35, "'F' is a type, not a value", NULL},
    {"kernel<F: float> void f(comptime F x) { }", 1, 34,
     "a comptime parameter must have a scalar type such as u32 or bool", NULL},
    /* ---- types (found when the kernel is specialized) ---- */
    {"kernel void f(tensor(f32) out)\n{\n    f32 x = 1.0;\n    u32 y = 2;\n    out[0] = x * "
     "y;\n}\n",
     5, 16, "mismatched types 'f32' and 'u32' in '*'",
     "convert one operand explicitly, e.g. f32(...)"},
    {"kernel void f() { u8 x = 300; }", 1, 26, "integer literal 300 does not fit in 'u8'", NULL},
    {"kernel void f() { u32 x = 1; if (x) { } }", 1, 34, "an if condition must be 'bool', got u32",
     "compare explicitly, e.g. x != 0"},
    {"kernel void f() { u32 x = 1; bool b = !x; }", 1, 39, "'!' needs a bool, got u32", NULL},
    {"kernel void f() { f32 x = 1.0; f32 y = x << 1; }", 1, 42, "'<<' needs integers, got f32",
     NULL},
    {"kernel void f() { f32 x = 1.0; f32 y = x[1]; }", 1, 42,
     "lane 1 is out of range for 'f32' (1 lane)", NULL},
    {"kernel void f() { bool b = true; f32 y = b[0] + 1.0; }", 1, 47, "'+' needs numbers, got bool",
     NULL},
    {"kernel void f() { matrix(acc, f32, 16, 16, 16) m; f32 x = m[0]; }", 1, 60,
     "cannot index matrix 'm'", "only tensors, arrays and lines can be indexed"},
    {"kernel void f(u32 n) { comptime if (n > 2) { } }", 1, 37,
     "the condition of a comptime if must be known at compile time", NULL},
    {"kernel void f() { comptime for (u32 i in range(100000)) { } }", 1, 19,
     "comptime for would unroll 100000 iterations (the limit is 4096)", NULL},
    {"kernel void f(u32 n) { shared f32 t[n]; }", 1, 37,
     "an array length must be known at compile time", NULL},
    {"kernel void f() { shared f32 t[4]; t[4] = 1.0; }", 1, 38,
     "index 4 is out of bounds for shared array 't' of 4 elements", NULL},
    {"kernel void f() { line(f32, 4) v = 1.0; f32 x = v[4]; }", 1, 51,
     "lane 4 is out of range for 'line(f32, 4)' (4 lanes)", NULL},
    {"kernel void f() { f32 x = 1.0; u64 y = bitcast<u64>(x); }", 1, 40,
     "bitcast from 'f32' (4 bytes) to 'u64' (8 bytes): the sizes differ", NULL},
    {"kernel void f(tensor(f16) a) { atomic_add(a, 0, f16(1)); }", 1, 43,
     "'atomic_add' cannot work on elements of type 'f16' (32/64-bit integers and f32 only)", NULL},
    {"kernel void f(const tensor(u32) a) { u32 old = atomic_add(a, 0, 1); }", 1, 59,
     "cannot write to read-only tensor 'a'", NULL},
    {"kernel void f() { u32 x = 1 / 0; }", 1, 29, "division by zero in a constant expression",
     NULL},
    {"kernel void f() { u32 x = 1; print(\"x = %v %v\\n\", x); }", 1, 36,
     "print format has 2 '%v' but 1 value is given", NULL},
    {"inline<F: float> F twice(F x) { return x + x; }\nkernel void f(tensor(i32) a) { a[0] = "
     "twice(a[1]); }\n",
     2, 39, "'twice' needs F: float, got 'i32'", NULL},
    {"kernel void f() { line(f32, 4) a = 1.0; line(f32, 2) b = 2.0; auto c = a + b; }", 1, 74,
     "mismatched line widths 'line(f32, 4)' and 'line(f32, 2)' in '+'", NULL},
    {"kernel void f(tensor(f32) a) { u32 n = shape(a, 0); }", 1, 46,
     "'shape' needs a tensor, but 'a' is an array without shape", NULL},
    {"kernel void f(tensor(f32, 2) a) { u32 n = stride(a, 2); }", 1, 53,
     "dimension 2 is out of range for tensor 'a' of rank 2", NULL},
    {"kernel void f() {\n    matrix(a, f16, 16, 16, 16) x;\n    matrix(b, f16, 16, 16, 16) y;\n"
     "    matrix(acc, f32, 16, 16, 16) z;\n    mat_mma(x, z, y, z);\n}\n",
     5, 13, "argument 1 of 'mat_mma' must be a matrix of role 'acc'",
     "mat_mma(d, a, b, c) computes d = a * b + c"},
    {"kernel void f(tensor(f16) a) { matrix(a, f16, 16, 16, 16, 1 + 2) m; }", 1, 59,
     "the matrix layout must be a layout known when compiling",
     "write row_major, col_major, or COND ? col_major : row_major"},
    {"kernel void f(tensor(f16) a) { matrix(a, f16, 16, 16, 16, rowmajor) m; }", 1, 59,
     "unknown layout 'rowmajor' (expected row_major or col_major)", NULL},
    /* ---- asynchronous copies ---- */
    {"kernel void f(tensor(f32) a) { f32 l[4]; copy_async(l, 0, a, 0, 4); }", 1, 53,
     "copy_async copies into shared memory, but 'l' is not shared", NULL},
    {"kernel void f(tensor(f32) a) { shared f32 s[4]; copy_async(s, 0, a, 0, 3); }", 1, 72,
     "copy_async of 3 'f32' elements moves 12 bytes", "copy 4, 8 or 16 bytes at once"},
    {"kernel void f(tensor(f32) a) { shared f16 s[8]; copy_async(s, 0, a, 0, 4); }", 1, 66,
     "copy_async copies numbers between memories of one scalar type, got 'f16' and 'f32'", NULL},
    {"inline u32 g(f32 x) { return x; }\nkernel void f(tensor(u32) a) { a[0] = g(1.0); }\n", 1, 30,
     "cannot convert 'f32' to 'u32' in the return value", NULL},
    {"inline<T: num> T add2(T a, T b) { return a + b; }\n"
     "kernel void f() { f32 x = 1.0; f16 y = f16(1); auto z = add2(x, y); }\n",
     2, 65, "conflicting types for 'T' in call to 'add2': 'f32' and 'f16'", NULL},
    {"kernel void f() { line(f32, 32) x = 1.0; }", 1, 29,
     "a line width must be between 1 and 16, got 32", NULL},
    {"kernel void f() { u32 x = 1; bool b = x && true; }", 1, 39,
     "the left operand of '&&' must be 'bool', got u32", NULL},
    {"kernel void f() { u32 x = 1; x = 1.5; }", 1, 34, "cannot use float literal 1.5 as 'u32'",
     "write u32(1.5) to convert it explicitly"},
    {"kernel void f(tensor(f32) a) { a = 1.0; }", 1, 32, "cannot assign to tensor 'a' as a whole",
     NULL},
    {"kernel void f() { bool b = true; f32 x = b + 1.0; }", 1, 44, "'+' needs numbers, got bool",
     NULL},
    {"kernel void f() { ABSOLUTE_POS = 2; }", 1, 19, "cannot assign to 'ABSOLUTE_POS'", NULL},
    {"kernel void f(tensor(f32) a) { for (f32 x in range(4)) { } }", 1, 37,
     "a loop variable must be a scalar integer, got 'f32'", NULL},
    {"kernel void f() { for (u32 i in range(0, 8, 0)) { } }", 1, 45,
     "the step of a range must be positive", NULL},
    {"kernel void f() { f32 x = 1.0; f32 y = exp(x, x); }", 1, 40, "'exp' takes 1 argument, got 2",
     NULL},
    {"kernel void f() { u32 x = popcount(1.5); }", 1, 36, "'popcount' needs an integer, got f32",
     NULL},
    {"kernel void f(tensor(f32) a, comptime u32 N) { shared f32 t[N - 1]; }", 1, 61,
     "an array length must be between 1 and 16777216, got 0", NULL},
    {"const u32 A = 1;\nconst u32 A = 2;\n", 2, 11, "redefinition of constant 'A'", NULL},
    {"kernel void f(tensor(f32) a) { a[0] = sqrt(2, 3); }", 1, 39, "'sqrt' takes 1 argument, got 2",
     NULL},
};

static void test_malformed_programs(void **state)
{
    (void)state;
    assert_true(sizeof(cases) / sizeof(cases[0]) >= 40);
    size_t failed = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        failed += !check_error_at(cases[i].src, cases[i].line, cases[i].col, cases[i].message,
                                  cases[i].hint);
    assert_int_equal(failed, 0);
}

/* ---- the text format
 * ------------------------------------------------------------------------------- */

static void test_format_with_caret_and_hint(void **state)
{
    (void)state;
    em_lang_diags *d = em_lang_diags_new();
    const char *src = "kernel void f(tensor(f32) input)\n{\n\tinput[0] = inptu[1];\n}\n";
    assert_null(em_lang_module_from_string("gelu.ek", src, d));
    char *text = em_lang_diags_format(d);
    assert_string_equal(text, "gelu.ek:3:13: error: use of undeclared identifier 'inptu'\n"
                              "\tinput[0] = inptu[1];\n"
                              "\t           ^\n"
                              "hint: did you mean 'input'?\n");
    /* the same text is the thread's last error */
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(
        strstr(em_last_error(), "gelu.ek:3:13: error: use of undeclared identifier 'inptu'"));
    free(text);
    em_lang_diags_free(d);
}

static void test_errors_are_collected_up_to_the_limit(void **state)
{
    (void)state;
    char src[4096] = "kernel void f()\n{\n";
    for (int i = 0; i < 30; i++)
        snprintf(src + strlen(src), sizeof(src) - strlen(src), "    u32 v%d = nope%d;\n", i, i);
    strcat(src, "}\n");
    em_lang_diags *d = em_lang_diags_new();
    assert_null(em_lang_module_from_string("many.ek", src, d));
    assert_int_equal(em_lang_diags_count(d), EM_LANG_MAX_ERRORS);
    for (size_t i = 0; i < EM_LANG_MAX_ERRORS; i++)
        assert_int_equal(em_lang_diags_at(d, i)->line, 3 + i);
    char *text = em_lang_diags_format(d);
    assert_non_null(strstr(text, "error: too many errors; stopped after 20\n"));
    free(text);
    em_lang_diags_free(d);
}

static void test_several_independent_errors(void **state)
{
    (void)state;
    const char *src =
        "kernel void f() {\n    u32 x = 1\n    u32 y = 2;\n    u32 z = (3;\n    f32 w = 4.0;\n}\n";
    em_lang_diags *d = em_lang_diags_new();
    assert_null(em_lang_module_from_string("two.ek", src, d));
    assert_int_equal(em_lang_diags_count(d), 2); /* one per broken statement, no cascade */
    assert_int_equal(em_lang_diags_at(d, 0)->line, 3);
    assert_int_equal(em_lang_diags_at(d, 1)->line, 4);
    em_lang_diags_free(d);
}

/* ---- specialization errors
 * ------------------------------------------------------------------------- */

static const char *spec_src =
    "kernel<F: float> void k(tensor(F) out, comptime u32 N, comptime bool B = false)\n"
    "{\n    if (ABSOLUTE_POS < N) { out[ABSOLUTE_POS] = F(B); }\n}\n";

static const char *spec_error(const em_lang_module *m, const char *kernel, const em_lang_bind *b,
                              size_t n)
{
    static char msg[512];
    em_lang_diags *d = em_lang_diags_new();
    em_lang_spec spec = {b, n, 1, NULL};
    em_ir_kernel *k = em_lang_specialize(m, kernel, &spec, d);
    assert_null(k);
    const em_lang_diag *g = em_lang_diags_at(d, 0);
    assert_non_null(g);
    snprintf(msg, sizeof(msg), "%u:%u: %s", g->line, g->col, g->message);
    em_lang_diags_free(d);
    return msg;
}

static void test_binding_errors(void **state)
{
    (void)state;
    em_lang_module *m = must_load(spec_src);
    em_lang_bind ok_n = em_lang_bind_int("N", 4);
    assert_string_equal(spec_error(m, "k", NULL, 0),
                        "1:53: no value given for comptime parameter 'N' of kernel 'k'");
    em_lang_bind b1[] = {ok_n, em_lang_bind_type("F", EM_I32)};
    assert_string_equal(
        spec_error(m, "k", b1, 2),
        "0:0: type 'i32' does not satisfy the bound 'float' of generic 'F' of kernel 'k'");
    em_lang_bind b2[] = {ok_n, em_lang_bind_int("M", 3)};
    assert_string_equal(spec_error(m, "k", b2, 2),
                        "0:0: kernel 'k' has no generic or comptime parameter named 'M'; did you "
                        "mean 'F', 'N' or 'B'?");
    em_lang_bind b3[] = {em_lang_bind_int("N", -1)};
    assert_string_equal(
        spec_error(m, "k", b3, 1),
        "0:0: value -1 for comptime parameter 'N' of kernel 'k' does not fit in 'u32'");
    em_lang_bind b4[] = {ok_n, em_lang_bind_text("B", "maybe")};
    assert_string_equal(
        spec_error(m, "k", b4, 2),
        "0:0: bad value for comptime parameter 'B' of kernel 'k': expected a value of type 'bool'");
    em_lang_bind b5[] = {ok_n, em_lang_bind_text("out", "3")};
    assert_string_equal(spec_error(m, "k", b5, 2),
                        "0:0: parameter 'out' of kernel 'k' is not comptime: pass it at launch");
    assert_string_equal(spec_error(m, "kk", NULL, 0),
                        "0:0: no kernel named 'kk'; did you mean 'k'?");
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
    /* good bindings, as text */
    em_lang_bind good[] = {em_lang_bind_text("F", "f64"), em_lang_bind_text("N", "0x10"),
                           em_lang_bind_text("B", "true")};
    em_lang_spec spec = {good, 3, 1, NULL};
    em_ir_kernel *k = em_lang_specialize(m, "k", &spec, NULL);
    assert_non_null(k);
    char *text = em_ir_print_kernel(k);
    assert_non_null(strstr(text, "16u32"));
    assert_non_null(strstr(text, "f64"));
    free(text);
    em_ir_kernel_free(k);
    em_lang_module_free(m);
}

/* ---- limits: every input ends in a diagnostic
 * ------------------------------------------------------ */

static void expect_any_error(const char *src, const char *needle)
{
    em_lang_diags *d = em_lang_diags_new();
    em_lang_module *m = em_lang_module_from_string("limit.ek", src, d);
    if (m) assert_int_equal(em_lang_check(m, d), EM_ERR_INVALID);
    char *text = em_lang_diags_format(d);
    if (!strstr(text, needle)) {
        fprintf(stderr, "expected '%s' in:\n%s\n", needle, text);
        fail();
    }
    free(text);
    em_lang_module_free(m);
    em_lang_diags_free(d);
}

static void test_limits(void **state)
{
    (void)state;
    size_t n = 200000;
    char *src = malloc(n + 256);
    assert_non_null(src);
    /* a very deep expression */
    char *p = src + sprintf(src, "kernel void f() { u32 x = ");
    memset(p, '(', 20000);
    strcpy(p + 20000, "1; }");
    expect_any_error(src, "nested too deeply");
    /* deeply nested blocks */
    p = src + sprintf(src, "kernel void f() ");
    memset(p, '{', 5000);
    memset(p + 5000, '}', 5000);
    p[10000] = 0;
    expect_any_error(src, "statements nested too deeply");
    /* a long chain of unary operators */
    p = src + sprintf(src, "kernel void f() { i32 x = ");
    memset(p, '~', 30000);
    strcpy(p + 30000, "1; }");
    expect_any_error(src, "nested too deeply");
    /* helpers that double the work at each level: stopped by the size limit */
    strcpy(src, "inline u32 h0(u32 x) { return x + 1; }\n");
    for (int i = 1; i < 40; i++)
        snprintf(src + strlen(src), n - strlen(src),
                 "inline u32 h%d(u32 x) { return h%d(x) + h%d(x + 1); }\n", i, i - 1, i - 1);
    strcat(src, "kernel void f(tensor(u32) o) { o[0] = h39(1); }\n");
    expect_any_error(src, "is too large after inlining and unrolling");
    /* nested comptime loops: each within the unroll limit, together too much */
    expect_any_error("kernel void f(tensor(u32) o) {\n"
                     "  comptime for (u32 i in range(4000)) { comptime for (u32 j in range(4000)) "
                     "{ o[0] = i + j; } }\n"
                     "}\n",
                     "is too large after inlining and unrolling");
    /* a long else-if chain */
    strcpy(src, "kernel void f(tensor(u32) o) { ");
    for (int i = 0; i < 400; i++)
        snprintf(src + strlen(src), n - strlen(src), "if (o[0] == %d) { o[1] = 1; } else ", i);
    strcat(src, "{ } }");
    expect_any_error(src, "nested too deeply");
    free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_programs),
        cmocka_unit_test(test_format_with_caret_and_hint),
        cmocka_unit_test(test_errors_are_collected_up_to_the_limit),
        cmocka_unit_test(test_several_independent_errors),
        cmocka_unit_test(test_binding_errors),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
