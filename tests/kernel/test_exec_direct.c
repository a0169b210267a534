/* test_exec_direct.c — tests of the C code generator that need the generated source itself rather
 * than the runtime: every sample kernel compiles warning-free under gcc and clang at -Wall -Wextra
 * (-O0 and -O2), errors name the instruction (intrinsics, unknown targets, invalid IR, bad names),
 * print writes to stderr, the source is readable (user names survive), several kernels share one
 * translation unit, and randomly built kernels that the verifier accepts always generate C that
 * compiles warning-free and runs without crashing. */
#include <fcntl.h>

#include "test_exec_common.h"

static bool have_compiler(const char *cc)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s > /dev/null 2>&1", cc);
    return system(cmd) == 0;
}

/* Generates C for the kernels and compiles it with every compiler present, at -O0 and -O2, with
 * -Wall -Werror, and -Wextra -Wshadow too when `extra` (the sample kernels, whose comparisons are
 * all meaningful; random kernels compare unsigned values with 0, which -Wextra dislikes). */
static void compile_everywhere(em_ir_kernel *const *ks, size_t n, const char *tag, bool extra)
{
    char *src = em_codegen_c((const em_ir_kernel *const *)ks, n, NULL);
    if (!src) fail_msg("em_codegen_c (%s): %s", tag, em_last_error());
    char path[512], so[600], log[600];
    xwrite_source(src, tag, path, sizeof path);
    free(src);
    snprintf(so, sizeof so, "%s.so", path);
    snprintf(log, sizeof log, "%s.log", path);
    static const char *const ccs[] = {"gcc", "clang"};
    const char *const flags[] = {extra ? "-O0 -Wextra" : "-O0",
                                 extra ? "-O2 -Wextra -Wshadow" : "-O2"};
    for (int c = 0; c < 2; c++) {
        if (!have_compiler(ccs[c])) continue;
        for (int f = 0; f < 2; f++)
            if (xcc(ccs[c], flags[f], path, so, log) != 0) {
                xdump_file(log);
                fail_msg("%s %s rejects the generated C of %s (%s)", ccs[c], flags[f], tag, path);
            }
    }
    unlink(so);
    unlink(log);
    unlink(path);
}

static void test_examples_warning_free(void **state)
{
    (void)state;
    const char *const *names = em_ir_example_names();
    size_t n = 0;
    em_ir_kernel *ks[16];
    for (; names[n]; n++) {
        ks[n] = em_ir_example(names[n]);
        assert_non_null(ks[n]);
        compile_everywhere(&ks[n], 1, names[n], true);
    }
    assert_true(n >= 5);
    compile_everywhere(ks, n, "all_examples", true); /* one translation unit for all of them */
    for (size_t i = 0; i < n; i++) em_ir_kernel_free(ks[i]);
    assert_null(em_ir_example("no_such_example"));
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
}

/* ---- errors -------------------------------------------------------------------------------- */

static em_ir_kernel *k_small(const char *name)
{
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_store(k, out, em_ir_builtin(k, EM_ABSOLUTE_POS), em_ir_u32(k, 1));
    return k;
}

static void test_codegen_errors(void **state)
{
    (void)state;
    /* an intrinsic: rejected, naming the instruction */
    em_ir_kernel *k = em_ir_kernel_new("with_intrinsic");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 0);
    em_ir_val r = em_ir_intrinsic(k, "cuda.ptx:mov.u32 %0, %laneid;", em_ty(EM_U32), NULL, 0);
    em_ir_store(k, out, em_ir_u32(k, 0), r);
    const em_ir_kernel *one[1] = {k};
    assert_null(em_codegen_c(one, 1, NULL));
    assert_int_equal(em_last_status(), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "with_intrinsic"));
    assert_non_null(strstr(em_last_error(), "inst 0 `"));
    assert_non_null(strstr(em_last_error(), "intrinsic"));
    assert_non_null(strstr(em_last_error(), "not available on the C target"));
    em_ir_kernel_free(k);

    /* dispatch by target name: "c" here, unknown names refused (the GPU targets have their own
     * tests) */
    em_ir_kernel *ok = k_small("fine");
    one[0] = ok;
    assert_null(em_codegen("metal-9000", one, 1, NULL));
    assert_int_equal(em_last_status(), EM_ERR_UNSUPPORTED);
    assert_non_null(strstr(em_last_error(), "metal-9000"));
    assert_null(em_codegen(NULL, one, 1, NULL));
    char *src = em_codegen("c", one, 1, NULL);
    assert_non_null(src);
    assert_non_null(strstr(src, "void emk_fine(const em_cpu_launch *"));
    free(src);

    /* two kernels with one name, a name that is not an identifier, no kernels */
    const em_ir_kernel *two[2] = {ok, ok};
    assert_null(em_codegen_c(two, 2, NULL));
    assert_non_null(strstr(em_last_error(), "two kernels named 'fine'"));
    em_ir_kernel *bad = k_small("not-an-identifier");
    one[0] = bad;
    assert_null(em_codegen_c(one, 1, NULL));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_null(em_codegen_c(NULL, 1, NULL));
    em_ir_kernel_free(bad);

    /* ill-formed IR: the verifier's message, naming the instruction */
    em_ir_kernel *ill = em_ir_kernel_new("ill");
    em_ir_mem o = em_ir_param_buffer(ill, "o", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_store(ill, o, em_ir_u32(ill, 0), em_ir_u32(ill, 3)); /* u32 into f32 memory */
    one[0] = ill;
    assert_null(em_codegen_c(one, 1, NULL));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "kernel ill: inst 0"));
    em_ir_kernel_free(ill);
    em_ir_kernel_free(ok);

    /* an empty kernel is fine */
    em_ir_kernel *empty = em_ir_kernel_new("empty");
    compile_everywhere(&empty, 1, "empty", true);
    em_ir_kernel_free(empty);
}

/* ---- readability, several kernels, print ------------------------------------------------------
 */

static void test_readable_source(void **state)
{
    (void)state;
    em_ir_kernel *ks[2] = {em_ir_example("matmul_tiled"), em_ir_example("reduce_sum")};
    char *src = em_codegen_c((const em_ir_kernel *const *)ks, 2, NULL);
    assert_non_null(src);
    static const char *const expect[] = {"void emk_matmul_tiled(",
                                         "void emk_reduce_sum(",
                                         "float *const a_tile",
                                         "const uint32_t M = ",
                                         "acc[u_]",
                                         "/* region 1",
                                         "for (t = 0u; t < ",
                                         "typedef struct em_cpu_launch"};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
        if (!strstr(src, expect[i])) fail_msg("generated C lacks \"%s\":\n%s", expect[i], src);
    /* the prelude appears once for both kernels */
    const char *first = strstr(src, "typedef struct em_cpu_launch");
    assert_null(strstr(first + 1, "typedef struct em_cpu_launch"));
    free(src);
    em_ir_kernel_free(ks[0]);
    em_ir_kernel_free(ks[1]);
}

/* Names that clash with C keywords, macros of the standard headers, library functions the
 * generated code calls, or the generator's own names are renamed; the kernel still runs. */
static void test_hostile_names(void **state)
{
    (void)state;
    static const char *const names[] = {
        "float",   "EOF",    "M_PI",   "expf",     "em_pad",
        "launch_", "u_",     "x y",    "9lives",   "math_errhandling",
        "memcpy",  "state_", "units_", "scratch_", "cube_",
        "l_"};
    enum { NN = sizeof names / sizeof names[0] };
    em_ir_kernel *k = em_ir_kernel_new("hostile");
    em_ir_mem out = em_ir_param_buffer(k, "stderr", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val p = em_ir_param_scalar(k, "NULL", em_ty(EM_F32));
    em_ir_mem sh = em_ir_shared(k, "free", em_ty(EM_F32), 16);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val acc = em_ir_var(k, em_ty(EM_F32), "calloc");
    em_ir_assign(k, acc, p);
    for (int i = 0; i < NN; i++) {
        em_ir_val v = em_ir_var(k, em_ty(EM_F32), names[i]);
        em_ir_assign(k, v, em_ir_unary(k, EM_OP_EXP, em_ir_const_float(k, em_ty(EM_F32), 0.0)));
        em_ir_assign(k, acc, em_ir_binary(k, EM_OP_ADD, acc, v));
    }
    em_ir_store(k, sh, u, acc);
    em_ir_sync_cube(k);
    em_ir_store(k, out, u, em_ir_load(k, sh, u));
    compile_everywhere(&k, 1, "hostile", true);
    float res[4] = {0};
    xarg a[] = {xbuf(res, sizeof res, 4), xscalar_f(0.5)};
    xrun(k, XGRID(1, 1, 1), XGRID(4, 1, 1), a, 2);
    for (int i = 0; i < 4; i++) assert_true(res[i] == 0.5f + NN);
    em_ir_kernel_free(k);
}

static void test_print(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("printer");
    em_ir_mem in = em_ir_param_buffer(k, "input", em_line(EM_F32, 2), EM_READ, 0);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val args[4] = {u, em_ir_load(k, in, u), em_ir_binary(k, EM_OP_EQ, u, em_ir_u32(k, 1)),
                         em_ir_cast(k, em_ty(EM_F16), em_ir_cast(k, em_ty(EM_F32), u))};
    em_ir_print(k, "unit %v: %v %v %v 100%% \"q\" %d\n", args, 4);
    float data[4] = {1.5f, -2, 0.25f, 3};
    fflush(stderr);
    char path[512];
    snprintf(path, sizeof path, "%s/print_%d.txt", EMBER_TEST_TMP, (int)getpid());
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    xarg a[] = {xbuf(data, sizeof data, 2)};
    xmod *m = xcompile(&k, 1);
    xlaunch(m, 0, XGRID(1, 1, 1), XGRID(2, 1, 1), a, 1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    xmod_free(m);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char text[512] = {0};
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    unlink(path);
    text[got] = 0;
    const char *want =
        "unit 0: [1.5, -2] false 0 100% \"q\" %d\nunit 1: [0.25, 3] true 1 100% \"q\" %d\n";
    if (strcmp(text, want) != 0) fail_msg("print wrote \"%s\", want \"%s\"", text, want);
    em_ir_kernel_free(k);
}

/* ---- random kernels ----------------------------------------------------------------------------
 */

typedef struct gen {
    em_ir_kernel *k;
    uint64_t rng;
    em_ir_val vals[512]; /* values in scope */
    int nvals;
    em_ir_val vars[16]; /* variables */
    int nvars;
    em_ir_mem mems[12]; /* memory: global buffers (len >= 1 at launch), shared, local */
    int nmems;
    em_ir_val frags[3]; /* A, B, accumulator (2x2x2 f32) */
    em_ir_mem fmem;     /* shared f32[16] the fragments use */
    int depth, loops;
    bool in_range[64]; /* per open loop: a range (continue is safe) or a while-loop */
} gen;

static unsigned pick(gen *g, unsigned n)
{
    return (unsigned)(xrand_state(&g->rng) % n);
}

static em_type rand_type(gen *g)
{
    static const uint8_t lanes[] = {1, 1, 1, 2, 3, 4, 8, 16};
    return em_line((em_scalar)pick(g, EM_SCALAR_COUNT), lanes[pick(g, sizeof lanes)]);
}

static em_type type_of(gen *g, em_ir_val v)
{
    return em_ir_value_at(g->k, v)->type;
}

static void push(gen *g, em_ir_val v)
{
    if (v && g->nvals < 512) g->vals[g->nvals++] = v;
}

static em_ir_val konst(gen *g, em_type t)
{
    if (t.scalar == EM_BOOL) return em_ir_const_int(g->k, t, (int64_t)pick(g, 2));
    if (em_scalar_is_float((em_scalar)t.scalar))
        return em_ir_const_float(g->k, t, (double)pick(g, 200) / 8 - 12);
    return em_ir_const_int(g->k, t, (int64_t)pick(g, 300) - 100);
}

/* A value of type t: one in scope when there is, else a constant. */
static em_ir_val value_of(gen *g, em_type t)
{
    for (int tries = 0; tries < 8 && g->nvals; tries++) {
        em_ir_val v = g->vals[pick(g, (unsigned)g->nvals)];
        if (em_type_eq(type_of(g, v), t)) return v;
    }
    for (int i = g->nvals - 1; i >= 0; i--)
        if (em_type_eq(type_of(g, g->vals[i]), t)) return g->vals[i];
    return konst(g, t);
}

static em_ir_val any_value(gen *g)
{
    if (!g->nvals || pick(g, 5) == 0) {
        em_ir_val c = konst(g, rand_type(g));
        push(g, c);
        return c;
    }
    return g->vals[pick(g, (unsigned)g->nvals)];
}

static em_ir_val u32_value(gen *g)
{
    if (pick(g, 3) == 0) return em_ir_builtin(g->k, (em_builtin)pick(g, EM_BUILTIN_COUNT));
    return value_of(g, em_ty(EM_U32));
}

/* An index into memory m that is always in range at launch. */
static em_ir_val index_for(gen *g, em_ir_mem m)
{
    const em_ir_memory *mm = em_ir_mem_at(g->k, m);
    em_ir_val len = mm->space == EM_MEM_GLOBAL ? em_ir_len(g->k, m) : em_ir_u32(g->k, mm->length);
    return em_ir_binary(g->k, EM_OP_REM, u32_value(g), len);
}

static void gen_block(gen *g, int budget);

static void gen_arith(gen *g)
{
    em_ir_kernel *k = g->k;
    em_ir_val a = any_value(g);
    em_type t = type_of(g, a);
    em_scalar s = (em_scalar)t.scalar;
    bool flt = em_scalar_is_float(s), integer = em_scalar_is_int(s);
    em_ir_val b = value_of(g, pick(g, 4) == 0 ? em_ty(s) : t);
    switch (pick(g, 5)) {
    case 0: { /* binary */
        static const em_ir_op fops[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                        EM_OP_REM, EM_OP_MIN, EM_OP_MAX, EM_OP_POW};
        static const em_ir_op iops[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                        EM_OP_REM, EM_OP_MIN, EM_OP_MAX, EM_OP_AND,
                                        EM_OP_OR,  EM_OP_XOR, EM_OP_SHL, EM_OP_SHR};
        static const em_ir_op bops[] = {EM_OP_AND, EM_OP_OR, EM_OP_XOR, EM_OP_EQ, EM_OP_NE};
        em_ir_op op = flt ? fops[pick(g, 8)] : integer ? iops[pick(g, 12)] : bops[pick(g, 5)];
        push(g, em_ir_binary(k, op, a, b));
        break;
    }
    case 1: { /* compare */
        static const em_ir_op cops[] = {EM_OP_EQ, EM_OP_NE, EM_OP_LT, EM_OP_LE, EM_OP_GT, EM_OP_GE};
        push(g, em_ir_binary(k, s == EM_BOOL ? cops[pick(g, 2)] : cops[pick(g, 6)], a, b));
        break;
    }
    case 2: { /* unary */
        static const em_ir_op fops[] = {
            EM_OP_NEG,   EM_OP_ABS,   EM_OP_EXP,   EM_OP_EXP2,  EM_OP_LOG,  EM_OP_LOG2,
            EM_OP_SQRT,  EM_OP_RSQRT, EM_OP_ERF,   EM_OP_TANH,  EM_OP_SIN,  EM_OP_COS,
            EM_OP_FLOOR, EM_OP_CEIL,  EM_OP_ROUND, EM_OP_ISNAN, EM_OP_ISINF};
        static const em_ir_op iops[] = {EM_OP_NEG,      EM_OP_NOT, EM_OP_ABS,
                                        EM_OP_POPCOUNT, EM_OP_CLZ, EM_OP_CTZ};
        em_ir_op op = flt ? fops[pick(g, 17)] : integer ? iops[pick(g, 6)] : EM_OP_NOT;
        push(g, em_ir_unary(k, op, a));
        break;
    }
    case 3: { /* ternary */
        if (flt && pick(g, 2))
            push(g, em_ir_ternary(k, EM_OP_FMA, a, b, value_of(g, t)));
        else if (s != EM_BOOL && pick(g, 2))
            push(g, em_ir_ternary(k, EM_OP_CLAMP, a, b, value_of(g, em_ty(s))));
        else
            push(g, em_ir_ternary(k, EM_OP_SELECT,
                                  value_of(g, em_line(EM_BOOL, pick(g, 2) ? 1 : t.lanes)), a, b));
        break;
    }
    default: { /* conversions and lanes */
        unsigned what = pick(g, 4);
        if (what == 0) {
            em_type to = rand_type(g);
            if (t.lanes != 1) to.lanes = t.lanes;
            push(g, em_ir_cast(k, to, a));
        } else if (what == 1 && s != EM_BOOL) {
            static const em_type b4[] = {{EM_U32, 1}, {EM_F32, 1},  {EM_I16, 2},
                                         {EM_F16, 2}, {EM_BF16, 2}, {EM_U8, 4}};
            static const em_type b8[] = {
                {EM_F64, 1}, {EM_I64, 1}, {EM_F32, 2}, {EM_U16, 4}, {EM_I8, 8}};
            size_t bytes = em_scalar_size(s) * t.lanes;
            if (bytes == 4) push(g, em_ir_bitcast(k, b4[pick(g, 6)], a));
            if (bytes == 8) push(g, em_ir_bitcast(k, b8[pick(g, 5)], a));
        } else if (what == 2 && t.lanes > 1) {
            push(g, em_ir_extract(k, a,
                                  em_ir_binary(k, EM_OP_REM, u32_value(g), em_ir_u32(k, t.lanes))));
        } else if (t.lanes > 1) {
            push(g, em_ir_insert(k, a, em_ir_u32(k, pick(g, t.lanes)), value_of(g, em_ty(s))));
        } else {
            static const em_ir_op pops[] = {EM_OP_PLANE_SUM, EM_OP_PLANE_MAX,
                                            EM_OP_PLANE_INCLUSIVE_SUM, EM_OP_PLANE_EXCLUSIVE_SUM,
                                            EM_OP_PLANE_SHUFFLE_XOR};
            if (s != EM_BOOL)
                push(g, em_ir_plane(k, pops[pick(g, 5)], a, em_ir_u32(k, 1)));
            else
                push(g, em_ir_plane(k, EM_OP_PLANE_BALLOT, a, EM_IR_NONE));
        }
        break;
    }
    }
}

static void gen_memory(gen *g)
{
    em_ir_kernel *k = g->k;
    em_ir_mem m = g->mems[pick(g, (unsigned)g->nmems)];
    const em_ir_memory *mm = em_ir_mem_at(k, m);
    em_scalar s = (em_scalar)mm->elem.scalar;
    unsigned what = pick(g, 3);
    if (what == 0 && (mm->access & EM_READ)) {
        push(g, em_ir_load(k, m, index_for(g, m)));
    } else if (what == 1 && mm->elem.lanes == 1 && mm->space != EM_MEM_LOCAL &&
               mm->access == EM_READ_WRITE &&
               (s == EM_U32 || s == EM_I32 || s == EM_F32 || s == EM_U64)) {
        static const em_ir_op iops[] = {EM_OP_ATOMIC_ADD,  EM_OP_ATOMIC_SUB,  EM_OP_ATOMIC_MIN,
                                        EM_OP_ATOMIC_MAX,  EM_OP_ATOMIC_AND,  EM_OP_ATOMIC_OR,
                                        EM_OP_ATOMIC_XOR,  EM_OP_ATOMIC_XCHG, EM_OP_ATOMIC_CAS,
                                        EM_OP_ATOMIC_LOAD, EM_OP_ATOMIC_STORE};
        static const em_ir_op fops[] = {EM_OP_ATOMIC_ADD, EM_OP_ATOMIC_SUB, EM_OP_ATOMIC_XCHG,
                                        EM_OP_ATOMIC_LOAD, EM_OP_ATOMIC_STORE};
        em_ir_op op = s == EM_F32 ? fops[pick(g, 5)] : iops[pick(g, 11)];
        em_ir_val idx = index_for(g, m),
                  v = op == EM_OP_ATOMIC_LOAD ? EM_IR_NONE : value_of(g, em_ty(s));
        em_ir_val r = em_ir_atomic(k, op, m, idx, v,
                                   op == EM_OP_ATOMIC_CAS ? value_of(g, em_ty(s)) : EM_IR_NONE);
        push(g, r);
    } else if (mm->access & EM_WRITE) {
        em_ir_store(k, m, index_for(g, m), value_of(g, mm->elem));
    }
}

static void gen_matrix(gen *g)
{
    em_ir_kernel *k = g->k;
    switch (pick(g, 4)) {
    case 0:
        em_ir_mat_fill(k, g->frags[2], value_of(g, em_ty(EM_F32)));
        break;
    case 1:
        em_ir_mat_load(k, g->frags[pick(g, 3)], g->fmem, em_ir_u32(k, pick(g, 8)), em_ir_u32(k, 2),
                       (em_mat_layout)pick(g, 2));
        break;
    case 2:
        em_ir_mat_mma(k, g->frags[2], g->frags[0], g->frags[1], g->frags[2]);
        break;
    default:
        em_ir_mat_store(k, g->fmem, em_ir_u32(k, pick(g, 8)), em_ir_u32(k, 2), g->frags[2],
                        (em_mat_layout)pick(g, 2));
        break;
    }
}

static void gen_control(gen *g, int budget)
{
    em_ir_kernel *k = g->k;
    int mark = g->nvals;
    switch (pick(g, 6)) {
    case 0:
    case 1:
        em_ir_if_begin(k, value_of(g, em_ty(EM_BOOL)));
        gen_block(g, budget / 2);
        g->nvals = mark;
        if (pick(g, 2)) {
            em_ir_else(k);
            gen_block(g, budget / 2);
            g->nvals = mark;
        }
        em_ir_end(k);
        break;
    case 2:
    case 3: {
        static const em_scalar ks[] = {EM_U32, EM_I32, EM_I64, EM_U8};
        em_scalar s = ks[pick(g, 4)];
        em_ir_val v = em_ir_var(k, em_ty(s), "i"); /* read in the body, never assigned: a counter
                                                    * written by units would make the loop run on */
        em_ir_range_begin(k, v, em_ir_const_int(k, em_ty(s), 0),
                          em_ir_const_int(k, em_ty(s), 1 + pick(g, 3)),
                          em_ir_const_int(k, em_ty(s), 1), pick(g, 3) == 0);
        g->in_range[g->loops++ & 63] = true;
        push(g, v);
        gen_block(g, budget / 2);
        g->loops--;
        g->nvals = mark;
        em_ir_end(k);
        break;
    }
    case 4: /* a loop that always ends in its first pass */
        em_ir_loop_begin(k);
        g->in_range[g->loops++ & 63] = false;
        gen_block(g, budget / 3);
        g->nvals = mark;
        em_ir_break(k);
        g->loops--;
        em_ir_end(k);
        break;
    default:
        em_ir_sync_cube(k);
        break;
    }
}

static void gen_block(gen *g, int budget)
{
    if (++g->depth > 4) budget = 1;
    for (int i = 0; i < budget; i++) {
        unsigned what = pick(g, 20);
        if (what < 9)
            gen_arith(g);
        else if (what < 13)
            gen_memory(g);
        else if (what < 14)
            gen_matrix(g);
        else if (what < 16 && g->nvars) {
            em_ir_val v = g->vars[pick(g, (unsigned)g->nvars)];
            em_ir_assign(g->k, v, value_of(g, type_of(g, v)));
        } else if (what < 17 && g->nvars < 16) {
            em_ir_val v = em_ir_var(g->k, rand_type(g), pick(g, 2) ? "acc" : NULL);
            em_ir_assign(g->k, v, value_of(g, type_of(g, v)));
            g->vars[g->nvars++] = v;
            push(g, v);
        } else if (what < 19 && budget > 2) {
            gen_control(g, budget - i);
        } else if (what == 19 && pick(g, 4) == 0) {
            if (g->loops && pick(g, 2)) {
                em_ir_if_begin(g->k, value_of(g, em_ty(EM_BOOL)));
                /* continue in a while-loop could spin forever: only ranges get it */
                if (pick(g, 2) || !g->in_range[(g->loops - 1) & 63])
                    em_ir_break(g->k);
                else
                    em_ir_continue(g->k);
                em_ir_end(g->k);
            } else if (pick(g, 3) == 0) {
                em_ir_if_begin(g->k, value_of(g, em_ty(EM_BOOL)));
                em_ir_return(g->k);
                em_ir_end(g->k);
            } else if (g->nvals) {
                em_ir_val a = g->vals[pick(g, (unsigned)g->nvals)];
                em_ir_print(g->k, "r %v\n", &a, 1);
            }
        }
    }
    g->depth--;
}

/* A random kernel that the verifier accepts: buffers of random types (with len >= 1 at launch),
 * shared and local memory, values, variables, control flow with barriers, atomics, matrices. */
static em_ir_kernel *random_kernel(uint64_t seed, em_type *buf_types, int *nbufs)
{
    char name[32];
    snprintf(name, sizeof name, "random_%llu", (unsigned long long)seed);
    gen g = {.k = em_ir_kernel_new(name), .rng = seed * 2654435761u + 1};
    *nbufs = 3 + (int)pick(&g, 3);
    for (int i = 0; i < *nbufs; i++) {
        buf_types[i] = i == 0 ? em_ty(EM_U32) : i == 1 ? em_ty(EM_F32) : rand_type(&g);
        g.mems[g.nmems++] = em_ir_param_buffer(g.k, "buf", buf_types[i],
                                               i == 2 ? EM_READ : EM_READ_WRITE, pick(&g, 2));
    }
    em_ir_val p = em_ir_param_scalar(g.k, "scale", em_ty(EM_F32));
    push(&g, p);
    push(&g, em_ir_param_scalar(g.k, "count", em_ty(EM_U32)));
    g.mems[g.nmems++] = em_ir_shared(g.k, "tile", rand_type(&g), 1 + pick(&g, 40));
    g.mems[g.nmems++] = em_ir_shared(g.k, "counts", em_ty(EM_U32), 8);
    g.mems[g.nmems++] = em_ir_local(g.k, "scratch", rand_type(&g), 1 + pick(&g, 8));
    g.fmem = em_ir_shared(g.k, "frag_mem", em_ty(EM_F32), 16);
    g.frags[0] = em_ir_matrix(g.k, EM_MAT_A, EM_F32, 2, 2, 2, EM_ROW_MAJOR, "fa");
    g.frags[1] = em_ir_matrix(g.k, EM_MAT_B, EM_F32, 2, 2, 2, EM_COL_MAJOR, NULL);
    g.frags[2] = em_ir_matrix(g.k, EM_MAT_ACC, EM_F32, 2, 2, 2, EM_ROW_MAJOR, "facc");
    push(&g, em_ir_builtin(g.k, EM_ABSOLUTE_POS));
    gen_block(&g, 40);
    /* keep something alive */
    em_ir_store(g.k, g.mems[0],
                em_ir_binary(g.k, EM_OP_REM, em_ir_builtin(g.k, EM_ABSOLUTE_POS),
                             em_ir_len(g.k, g.mems[0])),
                value_of(&g, em_ty(EM_U32)));
    return g.k;
}

static void test_random_kernels(void **state)
{
    (void)state;
    enum { PER_TU = 8, ELEMS = 64 };
    /* EXEC_RANDOM_KERNELS / EXEC_RANDOM_SEED widen the search when hunting bugs */
    int kernels = getenv("EXEC_RANDOM_KERNELS") ? atoi(getenv("EXEC_RANDOM_KERNELS")) : 40;
    int seed0 = getenv("EXEC_RANDOM_SEED") ? atoi(getenv("EXEC_RANDOM_SEED")) : 0;
    kernels = (kernels + PER_TU - 1) / PER_TU * PER_TU;
    int accepted = 0;
    for (int base = seed0; base < seed0 + kernels; base += PER_TU) {
        em_ir_kernel *ks[PER_TU];
        em_type types[PER_TU][8];
        int nbufs[PER_TU], n = 0;
        for (int i = 0; i < PER_TU; i++) {
            em_ir_kernel *k = random_kernel((uint64_t)(base + i + 1), types[n], &nbufs[n]);
            if (em_ir_verify(k, 0) != EM_OK)
                fail_msg("random kernel %d is ill-formed: %s", base + i + 1, em_last_error());
            if ((base + i) % 2) assert_int_equal(em_ir_simplify(k), EM_OK);
            ks[n++] = k;
        }
        accepted += n;
        compile_everywhere(ks, (size_t)n, "random", false);
        /* and run them: every index is taken modulo a length, so nothing may crash (what they
         * print goes to /dev/null) */
        xmod *m = xcompile(ks, (size_t)n);
        fflush(stderr);
        int saved = dup(2), null = open("/dev/null", O_WRONLY);
        assert_true(saved >= 0 && null >= 0);
        dup2(null, 2);
        for (int i = 0; i < n; i++) {
            xarg args[10];
            void *mem[8];
            for (int b = 0; b < nbufs[i]; b++) {
                size_t bytes =
                    ELEMS * em_scalar_size((em_scalar)types[i][b].scalar) * types[i][b].lanes;
                mem[b] = malloc(bytes);
                for (size_t j = 0; j < bytes; j++) ((uint8_t *)mem[b])[j] = (uint8_t)(j * 37 % 2);
                args[b] = xbuf(mem[b], bytes, ELEMS);
            }
            args[nbufs[i]] = xscalar_f(1.5);
            args[nbufs[i] + 1] = xscalar_u(3);
            xlaunch(m, (size_t)i, XGRID(3, 2, 1), XGRID(4, 2, 1), args, (size_t)nbufs[i] + 2);
            for (int b = 0; b < nbufs[i]; b++) free(mem[b]);
        }
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        close(null);
        xmod_free(m);
        for (int i = 0; i < n; i++) em_ir_kernel_free(ks[i]);
    }
    assert_int_equal(accepted, kernels);
}

int main(void)
{
    alarm(400); /* a kernel that never ends fails the test instead of hanging it */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples_warning_free),
        cmocka_unit_test(test_codegen_errors),
        cmocka_unit_test(test_readable_source),
        cmocka_unit_test(test_hostile_names),
        cmocka_unit_test(test_print),
        cmocka_unit_test(test_random_kernels),
    };
    return cmocka_run_group_tests_name("C generator, direct", tests, xsetup_direct, xteardown);
}
