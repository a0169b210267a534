/* test_exec_control.c — execution tests of the CPU target's control flow around barriers: units
 * that return before a barrier region, per-unit break / continue out of loops that contain
 * barriers, a while-loop with a barrier, a uniform if around a barrier, locals, lines and
 * variables that live across barriers, loops marked for unrolling (before and after
 * em_ir_simplify), and atomics of every kind on global and shared memory under contention. Each
 * case runs through the generated C directly and through the runtime (test_exec_common.h). */
#include "test_exec_common.h"

#define F32 em_ty(EM_F32)
#define U32 em_ty(EM_U32)
#define I32 em_ty(EM_I32)

static em_ir_val add(em_ir_kernel *k, em_ir_val a, em_ir_val b)
{
    return em_ir_binary(k, EM_OP_ADD, a, b);
}
static em_ir_val mul(em_ir_kernel *k, em_ir_val a, em_ir_val b)
{
    return em_ir_binary(k, EM_OP_MUL, a, b);
}
static em_ir_val rem(em_ir_kernel *k, em_ir_val a, em_ir_val b)
{
    return em_ir_binary(k, EM_OP_REM, a, b);
}
static em_ir_val cmp(em_ir_kernel *k, em_ir_op op, em_ir_val a, em_ir_val b)
{
    return em_ir_binary(k, op, a, b);
}

/* ---- early return -----------------------------------------------------------------------------
 */

/* Units with UNIT_POS >= active return at once; the others fill shared memory, meet at a barrier,
 * read a neighbour's slot; unit 0 then returns before a second barrier region. */
static em_ir_kernel *k_early_return(void)
{
    em_ir_kernel *k = em_ir_kernel_new("early_return");
    em_ir_mem in = em_ir_param_buffer(k, "input", F32, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", F32, EM_WRITE, 1);
    em_ir_mem out2 = em_ir_param_buffer(k, "out2", F32, EM_WRITE, 1);
    em_ir_val active = em_ir_param_scalar(k, "active", U32);
    em_ir_mem sh = em_ir_shared(k, "slots", F32, 64);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS), pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, cmp(k, EM_OP_GE, u, active));
    em_ir_return(k);
    em_ir_end(k);
    em_ir_val x = em_ir_load(k, in, pos);
    em_ir_store(k, sh, u, x);
    em_ir_sync_cube(k);
    em_ir_val next = em_ir_load(k, sh, rem(k, add(k, u, em_ir_u32(k, 1)), active));
    em_ir_store(k, out, pos, add(k, next, x)); /* x lives across the barrier */
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, u, em_ir_u32(k, 0)));
    em_ir_return(k);
    em_ir_end(k);
    em_ir_store(k, sh, u, mul(k, x, em_ir_const_float(k, F32, 2.0)));
    em_ir_sync_cube(k);
    em_ir_store(k, out2, pos, em_ir_load(k, sh, rem(k, add(k, u, em_ir_u32(k, 1)), active)));
    return k;
}

static void test_early_return_before_barrier(void **state)
{
    (void)state;
    enum { CUBES = 5, DIM = 48, ACTIVE = 37, N = CUBES * DIM };
    em_ir_kernel *k = k_early_return();
    float in[N], out[N], out2[N];
    for (int i = 0; i < N; i++) in[i] = (float)i, out[i] = out2[i] = -1;
    xarg args[] = {xbuf(in, sizeof in, N), xbuf(out, sizeof out, N), xbuf(out2, sizeof out2, N),
                   xscalar_u(ACTIVE)};
    xrun(k, XGRID(CUBES, 1, 1), XGRID(DIM, 1, 1), args, 4);
    for (int c = 0; c < CUBES; c++)
        for (int u = 0; u < DIM; u++) {
            int i = c * DIM + u, nb = c * DIM + (u + 1) % ACTIVE;
            float want = u < ACTIVE ? in[nb] + in[i] : -1;
            /* in the second phase unit 0 has left, so its slot keeps the first phase's value */
            float want2 = u < ACTIVE && u != 0 ? ((u + 1) % ACTIVE == 0 ? in[nb] : 2 * in[nb]) : -1;
            if (out[i] != want) fail_msg("out[%d] = %g, want %g", i, out[i], want);
            if (out2[i] != want2) fail_msg("out2[%d] = %g, want %g", i, out2[i], want2);
        }
    em_ir_kernel_free(k);
}

/* ---- break and continue out of loops with barriers ----------------------------------------- */

/* for t in 0..8 { if t == u % 5 break; n += 1; sync }  and
 * for t in 0..6 { if (t + u) % 2 == 0 continue; s += t; sync }  then out = n * 100 + s. */
static em_ir_kernel *k_break_continue(void)
{
    em_ir_kernel *k = em_ir_kernel_new("break_continue");
    em_ir_mem out = em_ir_param_buffer(k, "out", U32, EM_WRITE, 1);
    em_ir_mem sh = em_ir_shared(k, "scratch", U32, 128);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val n = em_ir_var(k, U32, "n"), s = em_ir_var(k, U32, "s");
    em_ir_assign(k, n, em_ir_u32(k, 0));
    em_ir_assign(k, s, em_ir_u32(k, 0));
    em_ir_val t = em_ir_var(k, U32, "t");
    em_ir_range_begin(k, t, em_ir_u32(k, 0), em_ir_u32(k, 8), em_ir_u32(k, 1), false);
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, t, rem(k, u, em_ir_u32(k, 5))));
    em_ir_break(k);
    em_ir_end(k);
    em_ir_assign(k, n, add(k, n, em_ir_u32(k, 1)));
    em_ir_store(k, sh, u, n);
    em_ir_sync_cube(k);
    em_ir_end(k);
    em_ir_val t2 = em_ir_var(k, U32, "t2");
    em_ir_range_begin(k, t2, em_ir_u32(k, 0), em_ir_u32(k, 6), em_ir_u32(k, 1), false);
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, rem(k, add(k, t2, u), em_ir_u32(k, 2)), em_ir_u32(k, 0)));
    em_ir_continue(k);
    em_ir_end(k);
    em_ir_assign(k, s, add(k, s, t2));
    em_ir_sync_cube(k);
    em_ir_end(k);
    em_ir_store(k, out, em_ir_builtin(k, EM_ABSOLUTE_POS), add(k, mul(k, n, em_ir_u32(k, 100)), s));
    return k;
}

/* A while-loop with barriers: unit 0 counts in shared memory, everyone reads it after the
 * barrier and leaves together at 5 (a per-unit break that every unit takes at once). */
static em_ir_kernel *k_while(void)
{
    em_ir_kernel *k = em_ir_kernel_new("while_barrier");
    em_ir_mem out = em_ir_param_buffer(k, "out", U32, EM_WRITE, 1);
    em_ir_mem sh = em_ir_shared(k, "counter", U32, 1);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val zero = em_ir_u32(k, 0);
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, u, zero));
    em_ir_store(k, sh, zero, zero);
    em_ir_end(k);
    em_ir_val seen = em_ir_var(k, U32, "seen"), rounds = em_ir_var(k, U32, "rounds");
    em_ir_assign(k, rounds, zero);
    em_ir_loop_begin(k);
    em_ir_sync_cube(k);
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, u, zero));
    em_ir_store(k, sh, zero, add(k, em_ir_load(k, sh, zero), em_ir_u32(k, 1)));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_assign(k, seen, em_ir_load(k, sh, zero));
    em_ir_assign(k, rounds, add(k, rounds, em_ir_u32(k, 1)));
    em_ir_if_begin(k, cmp(k, EM_OP_GE, seen, em_ir_u32(k, 5)));
    em_ir_break(k);
    em_ir_end(k);
    em_ir_end(k);
    em_ir_store(k, out, em_ir_builtin(k, EM_ABSOLUTE_POS),
                add(k, mul(k, seen, em_ir_u32(k, 10)), rounds));
    return k;
}

/* A uniform if around a barrier: even cubes rotate values through shared memory, odd cubes write
 * their unit index; the condition is a cube position, the same for every unit. A loop with a
 * barrier whose bounds are a parameter and a cube-level return complete it. */
static em_ir_kernel *k_uniform_if(void)
{
    em_ir_kernel *k = em_ir_kernel_new("uniform_if");
    em_ir_mem out = em_ir_param_buffer(k, "out", I32, EM_READ_WRITE, 1);
    em_ir_val rounds = em_ir_param_scalar(k, "rounds", I32);
    em_ir_mem sh = em_ir_shared(k, "ring", I32, 32);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS), pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val even =
        cmp(k, EM_OP_EQ, rem(k, em_ir_builtin(k, EM_CUBE_POS_X), em_ir_u32(k, 2)), em_ir_u32(k, 0));
    em_ir_val v = em_ir_var(k, I32, "v");
    em_ir_assign(k, v, em_ir_cast(k, I32, u));
    em_ir_if_begin(k, even);
    em_ir_val r = em_ir_var(k, I32, "r");
    em_ir_range_begin(k, r, em_ir_const_int(k, I32, 0), rounds, em_ir_const_int(k, I32, 1), false);
    em_ir_store(k, sh, u, v);
    em_ir_sync_cube(k);
    em_ir_assign(
        k, v, em_ir_load(k, sh, rem(k, add(k, u, em_ir_u32(k, 1)), em_ir_builtin(k, EM_CUBE_DIM))));
    em_ir_sync_cube(k);
    em_ir_end(k);
    em_ir_store(k, out, pos, v);
    em_ir_else(k);
    em_ir_store(k, out, pos, em_ir_binary(k, EM_OP_SUB, em_ir_const_int(k, I32, -1), v));
    em_ir_sync_cube(k);
    em_ir_return(k); /* every unit of the cube returns: the rest is not reached */
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_store(k, out, pos, add(k, em_ir_load(k, out, pos), em_ir_const_int(k, I32, 1000)));
    return k;
}

/* Unit 0 returns at once; the others read a trip count from memory and loop over a barrier that
 * many times. The count is a per-unit value read at cube level: it must come from a unit that
 * still runs (unit 0 never loaded it). */
static em_ir_kernel *k_lead_unit(void)
{
    em_ir_kernel *k = em_ir_kernel_new("lead_unit");
    em_ir_mem cfg = em_ir_param_buffer(k, "cfg", U32, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", U32, EM_WRITE, 1);
    em_ir_mem sh = em_ir_shared(k, "seen", U32, 64);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, u, em_ir_u32(k, 0)));
    em_ir_return(k);
    em_ir_end(k);
    em_ir_val n = em_ir_load(k, cfg, em_ir_u32(k, 0));
    em_ir_val acc = em_ir_var(k, U32, "acc");
    em_ir_assign(k, acc, em_ir_u32(k, 0));
    em_ir_val t = em_ir_var(k, U32, "t");
    em_ir_range_begin(k, t, em_ir_u32(k, 0), n, em_ir_u32(k, 1), false);
    em_ir_store(k, sh, u, t);
    em_ir_sync_cube(k);
    em_ir_assign(k, acc, add(k, acc, em_ir_load(k, sh, em_ir_u32(k, 1))));
    em_ir_sync_cube(k);
    em_ir_end(k);
    em_ir_store(k, out, em_ir_builtin(k, EM_ABSOLUTE_POS), acc);
    return k;
}

static void test_break_continue_while_if(void **state)
{
    (void)state;
    enum { CUBES = 3, DIM = 32, N = CUBES * DIM, ROUNDS = 3 };
    em_ir_kernel *ks[4] = {k_break_continue(), k_while(), k_uniform_if(), k_lead_unit()};
    xmod *m = xcompile(ks, 4);
    uint32_t out[N];
    memset(out, 0xff, sizeof out);
    xarg args[] = {xbuf(out, sizeof out, N)};
    xlaunch(m, 0, XGRID(CUBES, 1, 1), XGRID(DIM, 1, 1), args, 1);
    for (int i = 0; i < N; i++) {
        unsigned u = (unsigned)i % DIM, n = u % 5, s = 0;
        for (unsigned t = 0; t < 6; t++)
            if ((t + u) % 2) s += t;
        if (out[i] != n * 100 + s)
            fail_msg("break_continue[%d] = %u, want %u", i, out[i], n * 100 + s);
    }
    xlaunch(m, 1, XGRID(CUBES, 1, 1), XGRID(DIM, 1, 1), args, 1);
    for (int i = 0; i < N; i++)
        if (out[i] != 55) fail_msg("while_barrier[%d] = %u, want 55", i, out[i]);
    int32_t iout[N];
    xarg iargs[] = {xbuf(iout, sizeof iout, N), xscalar_i(ROUNDS)};
    xlaunch(m, 2, XGRID(CUBES, 1, 1), XGRID(DIM, 1, 1), iargs, 2);
    for (int i = 0; i < N; i++) {
        int c = i / DIM, u = i % DIM;
        int want = c % 2 == 0 ? (u + ROUNDS) % DIM + 1000 : -1 - u;
        if (iout[i] != want) fail_msg("uniform_if[%d] = %d, want %d", i, iout[i], want);
    }
    uint32_t cfg[1] = {6};
    memset(out, 0xff, sizeof out);
    xarg largs[] = {xbuf(cfg, sizeof cfg, 1), xbuf(out, sizeof out, N)};
    xlaunch(m, 3, XGRID(CUBES, 1, 1), XGRID(DIM, 1, 1), largs, 2);
    for (int i = 0; i < N; i++) {
        uint32_t want = i % DIM == 0 ? 0xffffffffu : 15; /* 0 + 1 + ... + 5 */
        if (out[i] != want) fail_msg("lead_unit[%d] = %u, want %u", i, out[i], want);
    }
    xmod_free(m);
    for (int i = 0; i < 4; i++) em_ir_kernel_free(ks[i]);
}

/* ---- values across barriers ------------------------------------------------------------------ */

/* A local array, a line and a variable are written before a barrier and read after it, in a loop
 * whose body has two barriers. */
static em_ir_kernel *k_across(void)
{
    em_ir_kernel *k = em_ir_kernel_new("across_barriers");
    em_type f4 = em_line(EM_F32, 4);
    em_ir_mem in = em_ir_param_buffer(k, "input", f4, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", f4, EM_WRITE, 1);
    em_ir_mem loc = em_ir_local(k, "hist", F32, 4);
    em_ir_mem sh = em_ir_shared(k, "lines", f4, 64);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS), pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val x = em_ir_load(k, in, pos); /* a line temp used after the barriers */
    em_ir_val acc = em_ir_var(k, f4, "acc");
    em_ir_assign(k, acc, em_ir_const_float(k, f4, 0.0));
    em_ir_mem counts = em_ir_param_buffer(k, "counts", U32, EM_WRITE, 1);
    em_ir_val cnt = em_ir_var(k, U32, "cnt");
    em_ir_val j = em_ir_var(k, U32, "j");
    em_ir_range_begin(k, j, em_ir_u32(k, 0), em_ir_u32(k, 4), em_ir_u32(k, 1), false);
    em_ir_store(k, loc, j, em_ir_cast(k, F32, add(k, u, j)));
    em_ir_store(k, sh, u, em_ir_binary(k, EM_OP_MUL, x, em_ir_cast(k, F32, j)));
    em_ir_sync_cube(k);
    em_ir_val other =
        em_ir_load(k, sh, rem(k, add(k, u, em_ir_u32(k, 1)), em_ir_builtin(k, EM_CUBE_DIM)));
    em_ir_assign(k, acc, em_ir_binary(k, EM_OP_ADD, acc, other));
    /* a counter used only in this region, but carried from one pass of the loop to the next */
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, j, em_ir_u32(k, 0)));
    em_ir_assign(k, cnt, em_ir_u32(k, 10));
    em_ir_end(k);
    em_ir_assign(k, cnt, add(k, cnt, em_ir_u32(k, 1)));
    em_ir_store(k, counts, pos, cnt);
    em_ir_sync_cube(k);
    em_ir_end(k);
    /* sum of the local array: 4u + 6 */
    em_ir_val h = em_ir_var(k, F32, "h");
    em_ir_assign(k, h, em_ir_const_float(k, F32, 0.0));
    em_ir_val q = em_ir_var(k, U32, "q");
    em_ir_range_begin(k, q, em_ir_u32(k, 0), em_ir_u32(k, 4), em_ir_u32(k, 1), false);
    em_ir_assign(k, h, em_ir_binary(k, EM_OP_ADD, h, em_ir_load(k, loc, q)));
    em_ir_end(k);
    em_ir_val r = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_ADD, acc, x), h);
    em_ir_store(k, out, pos,
                em_ir_insert(k, r, em_ir_u32(k, 3), em_ir_extract(k, x, em_ir_u32(k, 0))));
    return k;
}

static void test_values_across_barriers(void **state)
{
    (void)state;
    enum { CUBES = 4, DIM = 16, N = CUBES * DIM };
    em_ir_kernel *k = k_across();
    float in[N * 4], out[N * 4];
    uint32_t counts[N];
    for (int i = 0; i < N * 4; i++) in[i] = (float)(i % 17) - 3.5f;
    xarg args[] = {xbuf(in, sizeof in, N), xbuf(out, sizeof out, N),
                   xbuf(counts, sizeof counts, N)};
    xrun(k, XGRID(CUBES, 1, 1), XGRID(DIM, 1, 1), args, 3);
    for (int i = 0; i < N; i++) {
        int c = i / DIM, u = i % DIM, nb = c * DIM + (u + 1) % DIM;
        assert_int_equal(counts[i], 14);
        for (int l = 0; l < 4; l++) {
            float acc = 0;
            for (int j = 0; j < 4; j++) acc += in[nb * 4 + l] * (float)j;
            float want = l == 3 ? in[i * 4] : acc + in[i * 4 + l] + (float)(4 * u + 6);
            xcheck_close("across", (size_t)(i * 4 + l), out[i * 4 + l], want, 1e-6);
        }
    }
    em_ir_kernel_free(k);
}

/* ---- unrolled loops ------------------------------------------------------------------------- */

/* out[i] = sum over j < 8 of in[i * 8 + j] * (j + 1), the loop marked for unrolling; a nested
 * unrolled loop adds sum over p, q < 3 of p * q = 9. */
static em_ir_kernel *k_unrolled(const char *name)
{
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_ir_mem in = em_ir_param_buffer(k, "input", I32, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", I32, EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, cmp(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val acc = em_ir_var(k, I32, "acc");
    em_ir_assign(k, acc, em_ir_const_int(k, I32, 0));
    em_ir_val j = em_ir_var(k, U32, "j");
    em_ir_range_begin(k, j, em_ir_u32(k, 0), em_ir_u32(k, 8), em_ir_u32(k, 1), true);
    em_ir_val x = em_ir_load(k, in, add(k, mul(k, i, em_ir_u32(k, 8)), j));
    em_ir_assign(k, acc, add(k, acc, mul(k, x, em_ir_cast(k, I32, add(k, j, em_ir_u32(k, 1))))));
    em_ir_end(k);
    em_ir_val p = em_ir_var(k, I32, "p"), q = em_ir_var(k, I32, "q");
    em_ir_range_begin(k, p, em_ir_const_int(k, I32, 0), em_ir_const_int(k, I32, 3),
                      em_ir_const_int(k, I32, 1), true);
    em_ir_range_begin(k, q, em_ir_const_int(k, I32, 0), em_ir_const_int(k, I32, 3),
                      em_ir_const_int(k, I32, 1), true);
    em_ir_assign(k, acc, add(k, acc, mul(k, p, q)));
    em_ir_end(k);
    em_ir_end(k);
    em_ir_store(k, out, i, acc);
    em_ir_end(k);
    return k;
}

static void test_unrolled_loops(void **state)
{
    (void)state;
    enum { N = 100 };
    em_ir_kernel *raw = k_unrolled("unrolled_raw"), *simple = k_unrolled("unrolled_simplified");
    assert_int_equal(em_ir_simplify(simple), EM_OK);
    assert_int_equal(em_ir_verify(simple, 0), EM_OK);
    int32_t in[N * 8], out[N];
    for (int i = 0; i < N * 8; i++) in[i] = (i * 7919) % 201 - 100;
    em_ir_kernel *ks[2] = {raw, simple};
    xmod *m = xcompile(ks, 2);
    for (size_t which = 0; which < 2; which++) {
        memset(out, 0, sizeof out);
        xarg args[] = {xbuf(in, sizeof in, N * 8), xbuf(out, sizeof out, N)};
        xlaunch(m, which, XGRID(4, 1, 1), XGRID(32, 1, 1), args, 2);
        for (int i = 0; i < N; i++) {
            int32_t want = 9;
            for (int j = 0; j < 8; j++) want += in[i * 8 + j] * (j + 1);
            if (out[i] != want)
                fail_msg("%s[%d] = %d, want %d", em_ir_kernel_name(ks[which]), i, out[i], want);
        }
    }
    xmod_free(m);
    em_ir_kernel_free(raw);
    em_ir_kernel_free(simple);
}

/* ---- atomics -------------------------------------------------------------------------------- */

enum {
    A_ADD,
    A_SUB,
    A_MAX,
    A_MIN,
    A_AND,
    A_OR,
    A_XOR,
    A_XCHG,
    A_STORE,
    A_CAS_COUNT,
    A_SHARED,
    A_N
};

/* Every atomic op under contention from every unit of many cubes: u32 add/sub/and/or/xor/xchg/
 * store, i32 max, u32 min, a counter bumped through a compare-exchange loop, f32 and f64 adds,
 * u64 add, a load of a read-only buffer, and a histogram in shared memory flushed to global. */
static em_ir_kernel *k_atomics(void)
{
    em_ir_kernel *k = em_ir_kernel_new("atomics_mix");
    em_ir_mem in = em_ir_param_buffer(k, "input", U32, EM_READ, 1);
    em_ir_mem g = em_ir_param_buffer(k, "g", U32, EM_READ_WRITE, 1);
    em_ir_mem gi = em_ir_param_buffer(k, "gi", I32, EM_READ_WRITE, 1);
    em_ir_mem gf = em_ir_param_buffer(k, "gf", F32, EM_READ_WRITE, 1);
    em_ir_mem gd = em_ir_param_buffer(k, "gd", em_ty(EM_F64), EM_READ_WRITE, 1);
    em_ir_mem g64 = em_ir_param_buffer(k, "g64", em_ty(EM_U64), EM_READ_WRITE, 1);
    em_ir_mem bins = em_ir_param_buffer(k, "bins", U32, EM_READ_WRITE, 1);
    em_ir_mem local_bins = em_ir_shared(k, "local_bins", U32, 16);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS), i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val n = em_ir_len(k, in);
    em_ir_if_begin(k, cmp(k, EM_OP_LT, u, em_ir_u32(k, 16)));
    em_ir_store(k, local_bins, u, em_ir_u32(k, 0));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_if_begin(k, cmp(k, EM_OP_LT, i, n));
    em_ir_val x = em_ir_atomic(k, EM_OP_ATOMIC_LOAD, in, i, EM_IR_NONE, EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, g, em_ir_u32(k, A_ADD), x, EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_SUB, g, em_ir_u32(k, A_SUB), em_ir_u32(k, 3), EM_IR_NONE);
    em_ir_val sx = em_ir_binary(k, EM_OP_SUB, em_ir_cast(k, I32, rem(k, x, em_ir_u32(k, 1000))),
                                em_ir_const_int(k, I32, 500));
    em_ir_atomic(k, EM_OP_ATOMIC_MAX, gi, em_ir_const_int(k, I32, 0), sx, EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_MIN, gi, em_ir_const_int(k, I32, 1), sx, EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_MIN, g, em_ir_u32(k, A_MIN), x, EM_IR_NONE);
    em_ir_val bit = em_ir_binary(k, EM_OP_SHL, em_ir_u32(k, 1), rem(k, i, em_ir_u32(k, 32)));
    em_ir_atomic(k, EM_OP_ATOMIC_AND, g, em_ir_u32(k, A_AND), em_ir_unary(k, EM_OP_NOT, bit),
                 EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_OR, g, em_ir_u32(k, A_OR), bit, EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_XOR, g, em_ir_u32(k, A_XOR), x, EM_IR_NONE);
    em_ir_val old = em_ir_atomic(k, EM_OP_ATOMIC_XCHG, g, em_ir_u32(k, A_XCHG), i, EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_MAX, g, em_ir_u32(k, A_MAX), old, EM_IR_NONE);
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, i, em_ir_u32(k, 0)));
    em_ir_atomic(k, EM_OP_ATOMIC_STORE, g, em_ir_u32(k, A_STORE), em_ir_u32(k, 42), EM_IR_NONE);
    em_ir_end(k);
    /* a counter bumped with compare-exchange, retried until it sticks */
    em_ir_loop_begin(k);
    em_ir_val seen =
        em_ir_atomic(k, EM_OP_ATOMIC_LOAD, g, em_ir_u32(k, A_CAS_COUNT), EM_IR_NONE, EM_IR_NONE);
    em_ir_val got = em_ir_atomic(k, EM_OP_ATOMIC_CAS, g, em_ir_u32(k, A_CAS_COUNT), seen,
                                 add(k, seen, em_ir_u32(k, 1)));
    em_ir_if_begin(k, cmp(k, EM_OP_EQ, got, seen));
    em_ir_break(k);
    em_ir_end(k);
    em_ir_end(k);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, gf, em_ir_u32(k, 0), em_ir_const_float(k, F32, 1.0),
                 EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_SUB, gf, em_ir_u32(k, 1), em_ir_const_float(k, F32, 0.5),
                 EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, gd, em_ir_u32(k, 0),
                 em_ir_const_float(k, em_ty(EM_F64), 0.25), EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, g64, em_ir_u32(k, 0), em_ir_cast(k, em_ty(EM_U64), x),
                 EM_IR_NONE);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, local_bins, rem(k, x, em_ir_u32(k, 16)), em_ir_u32(k, 1),
                 EM_IR_NONE);
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_if_begin(k, cmp(k, EM_OP_LT, u, em_ir_u32(k, 16)));
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, bins, u, em_ir_load(k, local_bins, u), EM_IR_NONE);
    em_ir_end(k);
    return k;
}

static void test_atomics_contention(void **state)
{
    (void)state;
    enum { N = 30000, DIM = 96 };
    em_ir_kernel *k = k_atomics();
    uint32_t *in = malloc(N * sizeof(uint32_t)), g[A_N] = {0}, bins[16] = {0}, wbins[16] = {0};
    int32_t gi[2] = {INT32_MIN, INT32_MAX};
    float gf[2] = {0, 0};
    double gd[1] = {0};
    uint64_t g64[1] = {0};
    uint64_t rng = 77;
    uint32_t want_xor = 0, want_min = UINT32_MAX, want_add = 0;
    int32_t want_max = INT32_MIN, want_imin = INT32_MAX;
    uint64_t want64 = 0;
    for (int i = 0; i < N; i++) {
        in[i] = (uint32_t)(xrand_state(&rng) >> 33);
        want_add += in[i];
        want_xor ^= in[i];
        want_min = in[i] < want_min ? in[i] : want_min;
        int32_t sx = (int32_t)(in[i] % 1000) - 500;
        want_max = sx > want_max ? sx : want_max;
        want_imin = sx < want_imin ? sx : want_imin;
        want64 += in[i];
        wbins[in[i] % 16]++;
    }
    g[A_SUB] = 3u * N + 17;
    g[A_MIN] = UINT32_MAX;
    g[A_AND] = 0xffffffffu;
    xarg args[] = {xbuf(in, N * sizeof(uint32_t), N),
                   xbuf(g, sizeof g, A_N),
                   xbuf(gi, sizeof gi, 2),
                   xbuf(gf, sizeof gf, 2),
                   xbuf(gd, sizeof gd, 1),
                   xbuf(g64, sizeof g64, 1),
                   xbuf(bins, sizeof bins, 16)};
    xrun(k, XGRID((N + DIM - 1) / DIM, 1, 1), XGRID(DIM, 1, 1), args, 7);
    assert_int_equal(g[A_ADD], want_add);
    assert_int_equal(g[A_SUB], 17);
    assert_int_equal(g[A_MIN], want_min);
    assert_int_equal(g[A_AND], 0);
    assert_int_equal(g[A_OR], 0xffffffffu);
    assert_int_equal(g[A_XOR], want_xor);
    assert_true(g[A_XCHG] < N);
    /* every index but the one left in place came back from the exchange */
    assert_int_equal(g[A_MAX], g[A_XCHG] == N - 1 ? N - 2 : N - 1);
    assert_int_equal(g[A_STORE], 42);
    assert_int_equal(g[A_CAS_COUNT], N);
    assert_int_equal(gi[0], want_max);
    assert_int_equal(gi[1], want_imin);
    assert_true(gf[0] == (float)N);
    assert_true(gf[1] == -0.5f * N);
    assert_true(gd[0] == 0.25 * N);
    assert_true(g64[0] == want64);
    for (int b = 0; b < 16; b++) assert_int_equal(bins[b], wbins[b]);
    em_ir_kernel_free(k);
    free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_early_return_before_barrier),
        cmocka_unit_test(test_break_continue_while_if),
        cmocka_unit_test(test_values_across_barriers),
        cmocka_unit_test(test_unrolled_loops),
        cmocka_unit_test(test_atomics_contention),
    };
    return XRUN_BOTH(tests);
}
