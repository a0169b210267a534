/* test_ir.c — the IR builder, verifier, printer, structural hash and simplification passes, on
 * kernels built by hand. Execution on devices is tested elsewhere (test_exec_*.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "ember/kernel.h"

/* out[i] = a[i] + b[i] for i < len(out): the smallest complete kernel. */
static em_ir_kernel *build_add(const char *name, bool reversed_alloc)
{
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_type f = em_ty(EM_F32);
    em_ir_mem a = em_ir_param_buffer(k, "a", f, EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", f, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_WRITE, 1);
    if (reversed_alloc) em_ir_const_float(k, f, 3.0); /* an extra unused constant shifts ids */
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val n = em_ir_len(k, out);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, n));
    em_ir_val x = em_ir_load(k, a, pos);
    em_ir_val y = em_ir_load(k, b, pos);
    em_ir_store(k, out, pos, em_ir_binary(k, EM_OP_ADD, x, y));
    em_ir_end(k);
    return k;
}

static void test_builder_verifies_and_prints(void **state)
{
    (void)state;
    em_ir_kernel *k = build_add("add", false);
    assert_non_null(k);
    assert_int_equal(em_ir_verify(k, 0), EM_OK);
    assert_int_equal(em_ir_param_count(k), 3);
    char *text = em_ir_print_kernel(k);
    assert_non_null(text);
    assert_non_null(strstr(text, "kernel add(@1.a: global f32 rank 1 read"));
    assert_non_null(strstr(text, "builtin ABSOLUTE_POS"));
    assert_non_null(strstr(text, "= lt %"));
    assert_non_null(strstr(text, "store @3.out["));
    assert_non_null(strstr(text, "if %"));
    free(text);
    em_ir_kernel_free(k);
}

static void test_print_is_stable(void **state)
{
    (void)state;
    em_ir_kernel *k1 = build_add("add", false), *k2 = build_add("add", false);
    char *t1 = em_ir_print_kernel(k1), *t2 = em_ir_print_kernel(k2);
    assert_string_equal(t1, t2);
    free(t1);
    free(t2);
    em_ir_kernel_free(k1);
    em_ir_kernel_free(k2);
}

static void test_hash_structural(void **state)
{
    (void)state;
    em_ir_kernel *k1 = build_add("add", false), *k2 = build_add("add", true);
    em_ir_kernel *k3 = build_add("add2", false);
    char h1[33], h2[33], h3[33];
    em_ir_hash(k1, h1);
    em_ir_hash(k2, h2);
    em_ir_hash(k3, h3);
    assert_int_equal(strlen(h1), 32);
    assert_string_equal(h1, h2);     /* id allocation order does not matter */
    assert_string_not_equal(h1, h3); /* the kernel name (its symbol) does */
    /* changing an op changes the hash */
    em_ir_kernel *k4 = em_ir_kernel_new("add");
    em_ir_mem a = em_ir_param_buffer(k4, "a", em_ty(EM_F32), EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k4, "b", em_ty(EM_F32), EM_READ, 1);
    em_ir_mem o = em_ir_param_buffer(k4, "out", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_val pos = em_ir_builtin(k4, EM_ABSOLUTE_POS);
    em_ir_if_begin(k4, em_ir_binary(k4, EM_OP_LT, pos, em_ir_len(k4, o)));
    em_ir_store(k4, o, pos, em_ir_binary(k4, EM_OP_MUL, em_ir_load(k4, a, pos), em_ir_load(k4, b, pos)));
    em_ir_end(k4);
    char h4[33];
    em_ir_hash(k4, h4);
    assert_string_not_equal(h1, h4);
    em_ir_kernel_free(k1);
    em_ir_kernel_free(k2);
    em_ir_kernel_free(k3);
    em_ir_kernel_free(k4);
}

static void test_clone_is_equal(void **state)
{
    (void)state;
    em_ir_kernel *k = build_add("add", false);
    em_ir_kernel *c = em_ir_kernel_clone(k);
    char *t1 = em_ir_print_kernel(k), *t2 = em_ir_print_kernel(c);
    assert_string_equal(t1, t2);
    free(t1);
    free(t2);
    em_ir_kernel_free(k);
    em_ir_kernel_free(c);
}

/* ---- ill-formed kernels: each must be rejected with a message naming the instruction -------- */

typedef em_ir_kernel *(*bad_builder)(void);

static em_ir_kernel *bad_type_mismatch(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_val a = em_ir_const_float(k, em_ty(EM_F32), 1);
    em_ir_val b = em_ir_const_int(k, em_ty(EM_I32), 1);
    em_ir_binary(k, EM_OP_ADD, a, b);
    return k;
}

static em_ir_kernel *bad_store_readonly(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 1);
    em_ir_store(k, a, em_ir_u32(k, 0), em_ir_const_float(k, em_ty(EM_F32), 1));
    return k;
}

static em_ir_kernel *bad_scope(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_u32(k, 4)));
    em_ir_val inner = em_ir_binary(k, EM_OP_ADD, pos, em_ir_u32(k, 1));
    em_ir_end(k);
    em_ir_binary(k, EM_OP_MUL, inner, pos); /* used after its scope ended */
    return k;
}

static em_ir_kernel *bad_break_outside_loop(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_break(k);
    return k;
}

static em_ir_kernel *bad_unclosed_if(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_if_begin(k, em_ir_const_bool(k, true));
    return k;
}

static em_ir_kernel *bad_value_id(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_emit(k, EM_OP_NEG, em_ty(EM_F32), 9999, 0, 0, 0, 0, 0);
    return k;
}

static em_ir_kernel *bad_mem_id(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_load(k, 77, em_ir_u32(k, 0));
    return k;
}

static em_ir_kernel *bad_float_index(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 1);
    em_ir_load(k, a, em_ir_const_float(k, em_ty(EM_F32), 0));
    return k;
}

static em_ir_kernel *bad_shape_dim(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 2);
    em_ir_shape(k, a, 5);
    return k;
}

static em_ir_kernel *bad_range_counter(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_val c = em_ir_u32(k, 0);
    em_ir_range_begin(k, c, c, em_ir_u32(k, 4), em_ir_u32(k, 1), false); /* counter is a constant */
    em_ir_end(k);
    return k;
}

static em_ir_kernel *bad_float_exp_on_int(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_unary(k, EM_OP_EXP, em_ir_u32(k, 3));
    return k;
}

static em_ir_kernel *bad_line_widths(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_line(EM_F32, 4), EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_line(EM_F32, 2), EM_READ, 1);
    em_ir_val i = em_ir_u32(k, 0);
    em_ir_binary(k, EM_OP_ADD, em_ir_load(k, a, i), em_ir_load(k, b, i));
    return k;
}

static em_ir_kernel *bad_atomic_on_lines(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_line(EM_U32, 4), EM_READ_WRITE, 1);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, a, em_ir_u32(k, 0), em_ir_u32(k, 1), 0);
    return k;
}

static em_ir_kernel *bad_bitcast_size(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_bitcast(k, em_ty(EM_U64), em_ir_const_float(k, em_ty(EM_F32), 1));
    return k;
}

static em_ir_kernel *bad_mma_roles(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_val a = em_ir_matrix(k, EM_MAT_A, EM_F16, 16, 16, 16, EM_ROW_MAJOR, "a");
    em_ir_val acc = em_ir_matrix(k, EM_MAT_ACC, EM_F32, 16, 16, 16, EM_ROW_MAJOR, "acc");
    em_ir_mat_mma(k, acc, a, a, acc); /* B given an A fragment */
    return k;
}

static em_ir_kernel *bad_assign_to_constant(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_assign(k, em_ir_u32(k, 1), em_ir_u32(k, 2));
    return k;
}

static em_ir_kernel *bad_lane_out_of_range(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_line(EM_F32, 4), EM_READ, 1);
    em_ir_extract(k, em_ir_load(k, a, em_ir_u32(k, 0)), em_ir_u32(k, 4));
    return k;
}

static em_ir_kernel *bad_if_condition(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_if_begin(k, em_ir_u32(k, 1));
    em_ir_end(k);
    return k;
}

static em_ir_kernel *bad_unknown_op(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_emit(k, (em_ir_op)999, em_ty(EM_F32), 0, 0, 0, 0, 0, 0);
    return k;
}

static em_ir_kernel *bad_extra_end(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_end(k);
    return k;
}

static em_ir_kernel *bad_zero_shared(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_shared(k, "tile", em_ty(EM_F32), 0);
    return k;
}

typedef struct bad_case {
    bad_builder build;
    const char *expect;   /* substring of the message */
    bool names_inst;      /* the message quotes the instruction */
} bad_case;

static const bad_case bad_cases[] = {
    {bad_type_mismatch, "operand types differ: f32 and i32", true},
    {bad_store_readonly, "store to read-only buffer", true},
    {bad_scope, "used outside the scope of its definition", true},
    {bad_break_outside_loop, "break outside a loop", true},
    {bad_unclosed_if, "never closed with em_ir_end", true},
    {bad_value_id, "%?9999 is not a value of this kernel", true},
    {bad_mem_id, "memory @?77 is not memory of this kernel", true},
    {bad_float_index, "index must be an integer scalar", true},
    {bad_shape_dim, "dimension 5 out of range for rank 2", true},
    {bad_range_counter, "range needs an integer scalar variable", true},
    {bad_float_exp_on_int, "exp needs floats, not u32", true},
    {bad_line_widths, "line widths differ: 4 and 2", true},
    {bad_atomic_on_lines, "atomics need scalar memory", true},
    {bad_bitcast_size, "bitcast between 4 and 8 bytes", true},
    {bad_mma_roles, "B has the wrong role", true},
    {bad_assign_to_constant, "is a constant and cannot be written", true},
    {bad_lane_out_of_range, "lane 4 is out of range for a line of 4", true},
    {bad_if_condition, "if condition must be a bool scalar", true},
    {bad_unknown_op, "unknown opcode 999", true},
    {bad_extra_end, "em_ir_end without an open", false},
    {bad_zero_shared, "has length 0", false},
};

static void test_verifier_rejects(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        em_ir_kernel *k = bad_cases[i].build();
        assert_non_null(k);
        em_status st = em_ir_verify(k, 0);
        const char *msg = em_last_error();
        if (st != EM_ERR_INVALID || !strstr(msg, bad_cases[i].expect) ||
            (bad_cases[i].names_inst && !strstr(msg, "inst "))) {
            print_error("case %zu: status %d, message:\n%s\nexpected: %s\n", i, st, msg,
                        bad_cases[i].expect);
            fail();
        }
        assert_non_null(strstr(msg, "kernel bad: "));
        /* printing an ill-formed kernel never crashes */
        char *text = em_ir_print_kernel(k);
        assert_non_null(text);
        free(text);
        em_ir_kernel_free(k);
    }
}

static void test_verifier_collects_several(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("bad");
    em_ir_break(k);
    em_ir_continue(k);
    em_ir_unary(k, EM_OP_EXP, em_ir_u32(k, 3));
    assert_int_equal(em_ir_verify(k, 0), EM_ERR_INVALID);
    const char *msg = em_last_error();
    assert_non_null(strstr(msg, "break outside a loop"));
    assert_non_null(strstr(msg, "continue outside a loop"));
    assert_non_null(strstr(msg, "exp needs floats"));
    em_ir_kernel_free(k);
}

/* ---- passes --------------------------------------------------------------------------------- */

static size_t count_op(const em_ir_kernel *k, uint32_t b, em_ir_op op)
{
    size_t n = 0;
    const em_ir_block *blk = em_ir_block_at(k, b);
    for (size_t i = 0; blk && i < blk->len; i++) {
        const em_ir_inst *in = em_ir_inst_at(k, blk->items[i]);
        n += in->op == op;
        if (in->op == EM_OP_IF || in->op == EM_OP_RANGE || in->op == EM_OP_LOOP)
            n += count_op(k, in->blocks[0], op) + count_op(k, in->blocks[1], op);
    }
    return n;
}

static void test_simplify_folds_constants(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("fold");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_I32), EM_WRITE, 1);
    em_ir_val two = em_ir_const_int(k, em_ty(EM_I32), 2);
    em_ir_val x = em_ir_binary(k, EM_OP_MUL, two, em_ir_const_int(k, em_ty(EM_I32), 21));
    em_ir_val y = em_ir_binary(k, EM_OP_SUB, x, em_ir_const_int(k, em_ty(EM_I32), 50));
    em_ir_store(k, out, em_ir_u32(k, 0), y);
    /* an integer overflow wraps like the target would */
    em_ir_val big = em_ir_binary(k, EM_OP_ADD, em_ir_const_int(k, em_ty(EM_I32), INT32_MAX), em_ir_const_int(k, em_ty(EM_I32), 1));
    em_ir_store(k, out, em_ir_u32(k, 1), big);
    /* division by zero is left for run time */
    em_ir_val dz = em_ir_binary(k, EM_OP_DIV, two, em_ir_const_int(k, em_ty(EM_I32), 0));
    em_ir_store(k, out, em_ir_u32(k, 2), dz);
    assert_int_equal(em_ir_simplify(k), EM_OK);
    char *text = em_ir_print_kernel(k);
    assert_non_null(strstr(text, "store @1.out[0u32], -8i32"));
    assert_non_null(strstr(text, "store @1.out[1u32], -2147483648i32"));
    assert_non_null(strstr(text, "= div 2i32, 0i32"));
    assert_null(strstr(text, "= mul"));
    free(text);
    em_ir_kernel_free(k);
}

static void test_simplify_constant_if_and_dead_code(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("branch");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_val unused = em_ir_unary(k, EM_OP_EXP, em_ir_load(k, em_ir_param_buffer(k, "in", em_ty(EM_F32), EM_READ, 1), em_ir_u32(k, 0)));
    (void)unused;
    em_ir_val c = em_ir_binary(k, EM_OP_GT, em_ir_u32(k, 3), em_ir_u32(k, 2));
    em_ir_if_begin(k, c);
    em_ir_store(k, out, em_ir_u32(k, 0), em_ir_const_float(k, em_ty(EM_F32), 1));
    em_ir_else(k);
    em_ir_store(k, out, em_ir_u32(k, 0), em_ir_const_float(k, em_ty(EM_F32), 2));
    em_ir_end(k);
    assert_int_equal(em_ir_simplify(k), EM_OK);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_IF), 0);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_STORE), 1);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_EXP), 0);  /* dead */
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_LOAD), 0); /* dead after exp went */
    char *text = em_ir_print_kernel(k);
    assert_non_null(strstr(text, "store @1.out[0u32], 1f32"));
    free(text);
    em_ir_kernel_free(k);
}

static void test_simplify_unrolls(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("unroll");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 1);
    em_ir_val i = em_ir_var(k, em_ty(EM_U32), "i");
    em_ir_range_begin(k, i, em_ir_u32(k, 0), em_ir_u32(k, 4), em_ir_u32(k, 1), true);
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_MUL, i, em_ir_u32(k, 10)));
    em_ir_end(k);
    assert_int_equal(em_ir_simplify(k), EM_OK);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_RANGE), 0);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_STORE), 4);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_MUL), 0); /* folded per iteration */
    char *text = em_ir_print_kernel(k);
    assert_non_null(strstr(text, "store @1.out[3u32], 30u32"));
    free(text);
    /* a loop with a break is left alone */
    em_ir_kernel *k2 = em_ir_kernel_new("nounroll");
    em_ir_val j = em_ir_var(k2, em_ty(EM_U32), "j");
    em_ir_range_begin(k2, j, em_ir_u32(k2, 0), em_ir_u32(k2, 4), em_ir_u32(k2, 1), true);
    em_ir_break(k2);
    em_ir_end(k2);
    assert_int_equal(em_ir_simplify(k2), EM_OK);
    assert_int_equal(count_op(k2, em_ir_body(k2), EM_OP_RANGE), 1);
    em_ir_kernel_free(k);
    em_ir_kernel_free(k2);
}

static void test_simplify_merges_invariant_reads(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("reads");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ_WRITE, 2);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_len(k, a)));
    em_ir_val again = em_ir_builtin(k, EM_ABSOLUTE_POS); /* the same read, in another block */
    em_ir_val s0 = em_ir_shape(k, a, 0), s0b = em_ir_shape(k, a, 0), s1 = em_ir_shape(k, a, 1);
    em_ir_val sum = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_ADD, s0, s0b), s1);
    em_ir_store(k, a, again, em_ir_cast(k, em_ty(EM_F32), sum));
    em_ir_end(k);
    assert_int_equal(em_ir_simplify(k), EM_OK);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_BUILTIN), 2); /* reads never change block */
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_SHAPE), 2); /* dims 0 and 1 stay distinct */
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_LEN), 1);
    em_ir_kernel_free(k);
    /* a barrier between two identical reads keeps both */
    k = em_ir_kernel_new("reads_barrier");
    em_ir_mem o = em_ir_param_buffer(k, "o", em_ty(EM_U32), EM_WRITE, 1);
    em_ir_val u0 = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_store(k, o, u0, u0);
    em_ir_sync_cube(k);
    em_ir_val u1 = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val u2 = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_store(k, o, u1, u2);
    assert_int_equal(em_ir_simplify(k), EM_OK);
    assert_int_equal(count_op(k, em_ir_body(k), EM_OP_BUILTIN), 2);
    em_ir_kernel_free(k);
}

static void test_simplify_rejects_invalid(void **state)
{
    (void)state;
    em_ir_kernel *k = bad_type_mismatch();
    assert_int_equal(em_ir_simplify(k), EM_ERR_INVALID);
    em_ir_kernel_free(k);
}

static void test_scalar_tables(void **state)
{
    (void)state;
    for (int s = 0; s < EM_SCALAR_COUNT; s++) {
        assert_non_null(em_scalar_name((em_scalar)s));
        assert_int_equal(em_scalar_parse(em_scalar_name((em_scalar)s)), s);
        assert_true(em_scalar_size((em_scalar)s) >= 1);
    }
    assert_int_equal(em_scalar_parse("f128"), EM_SCALAR_COUNT);
    assert_null(em_scalar_name(EM_SCALAR_COUNT));
    for (int op = 0; op < EM_OP_COUNT; op++) assert_string_not_equal(em_ir_op_name((em_ir_op)op), "?");
    for (int b = 0; b < EM_BUILTIN_COUNT; b++) assert_non_null(em_builtin_name((em_builtin)b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_verifies_and_prints),
        cmocka_unit_test(test_print_is_stable),
        cmocka_unit_test(test_hash_structural),
        cmocka_unit_test(test_clone_is_equal),
        cmocka_unit_test(test_verifier_rejects),
        cmocka_unit_test(test_verifier_collects_several),
        cmocka_unit_test(test_simplify_folds_constants),
        cmocka_unit_test(test_simplify_constant_if_and_dead_code),
        cmocka_unit_test(test_simplify_unrolls),
        cmocka_unit_test(test_simplify_merges_invariant_reads),
        cmocka_unit_test(test_simplify_rejects_invalid),
        cmocka_unit_test(test_scalar_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
