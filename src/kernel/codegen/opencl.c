/* opencl.c — the OpenCL target: OpenCL C that compiles as 1.2 and as 2.0, written by the shared
 * SPMD emitter (spmd.c) with the dialect below. Lines of 2, 3, 4, 8 or 16 lanes are OpenCL vector
 * types (loaded and stored with vloadN / vstoreN, so buffers only need scalar alignment); other
 * widths, and bool lines, are arrays handled lane by lane. f16 needs no cl_khr_fp16: it is read
 * and written with vload_half / vstore_half and computed as float rounded after every operation;
 * bf16 is ushort bits converted in code.
 *
 * ---- parameter ABI (the OpenCL driver follows it) --------------------------------------------
 * Every kernel NAME of a batch becomes
 *     __kernel void NAME(P0, P1, ..., __global const ulong *em_meta)
 * with one Pi per IR parameter, in order (clSetKernelArg index = parameter index):
 *   - buffer of scalar kind s: `__global [const] T *` pointing at element 0 (pass a cl_mem; an
 *     element offset needs a sub-buffer), T the storage type: bool and u8 uchar (bool 0/1),
 *     i8 char, i16 short, u16 ushort, i32 int, u32 uint, i64 long, u64 ulong, f16 half (binary16
 *     bits), bf16 ushort (bfloat16 bits), f32 float, f64 double. Line buffers use the same
 *     scalar pointer: element i of an N-lane buffer is scalars [i*N, i*N+N).
 *   - scalar of kind s: by value, as bool uchar (0/1), i8 char, i16 short, i32 int, i64 long,
 *     u8 uchar, u16 ushort, u32 uint, u64 ulong, f16 / bf16 float (the value as a 32-bit float),
 *     f32 float, f64 double (clSetKernelArg with that type's size).
 *   - last, always: em_meta, a buffer of ulong: for each buffer parameter in order, len
 *     (elements, i.e. lines for line buffers), shape[0..rank), stride[0..rank) (in scalars):
 *     1 + 2*rank words per buffer. Kernels without buffers still take it (pass a one-word
 *     buffer).
 * Launch: local size = the cube's units per axis, global size = local size * cube count.
 * f64 needs cl_khr_fp64 (caps.dtype[EM_F64]); 64-bit atomics use cl_khr_int64_base_atomics and
 * cl_khr_int64_extended_atomics.
 * Planes: with caps.plane_ops, plane ops are sub-group functions (cl_khr_subgroups; shuffles need
 * cl_khr_subgroup_shuffle / _shuffle_relative, ballot cl_khr_subgroup_ballot, product
 * cl_khr_subgroup_non_uniform_arithmetic; the device compiler reports a missing one). Without
 * plane_ops, PLANE_DIM is 1, as on the CPU target.
 * Matrix ops lower to per-unit loops, which is only right when each unit is its own plane: they
 * are rejected when caps.plane_ops is set with a plane size above 1.
 * print is printf; intrinsics: "opencl.call:NAME" calls a function. */
#include <stdio.h>
#include <string.h>

#include "kernel/codegen/codegen.h"
#include "kernel/codegen/spmd.h"

static const char *const storage_type[EM_SCALAR_COUNT] = {
    [EM_BOOL] = "uchar", [EM_I8] = "char",  [EM_I16] = "short",   [EM_I32] = "int",
    [EM_I64] = "long",   [EM_U8] = "uchar", [EM_U16] = "ushort",  [EM_U32] = "uint",
    [EM_U64] = "ulong",  [EM_F16] = "half", [EM_BF16] = "ushort", [EM_F32] = "float",
    [EM_F64] = "double"};

/* Element type of shared and private arrays (compute types; bool as uchar). */
static const char *const array_type[EM_SCALAR_COUNT] = {
    [EM_BOOL] = "uchar", [EM_I8] = "char",   [EM_I16] = "short",  [EM_I32] = "int",
    [EM_I64] = "long",   [EM_U8] = "uchar",  [EM_U16] = "ushort", [EM_U32] = "uint",
    [EM_U64] = "ulong",  [EM_F16] = "float", [EM_BF16] = "float", [EM_F32] = "float",
    [EM_F64] = "double"};

static bool native_width(unsigned n)
{
    return n == 2 || n == 3 || n == 4 || n == 8 || n == 16;
}

/* A line type that is an OpenCL vector. */
static bool is_vector(em_type t)
{
    return t.lanes > 1 && native_width(t.lanes) && t.scalar != EM_BOOL;
}

/* ---- types, literals, conversions ------------------------------------------------------------ */

static void cl_decl(em_spmd *e, em_type t, const char *name, em_strbuf *sb)
{
    if (t.lanes == 1)
        em_sb_printf(sb, "%s %s", e->d->ctype[t.scalar], name);
    else if (is_vector(t))
        em_sb_printf(sb, "%s%u %s", e->d->ctype[t.scalar], t.lanes, name);
    else
        em_sb_printf(sb, "%s %s[%u]", e->d->ctype[t.scalar], name, t.lanes);
}

static void cl_lane(em_spmd *e, em_type t, const char *name, unsigned i, em_strbuf *sb)
{
    (void)e;
    if (is_vector(t))
        em_sb_printf(sb, "%s.s%x", name, i);
    else
        em_sb_printf(sb, "%s[%u]", name, i);
}

static int cl_line_kind(em_spmd *e, em_type t)
{
    (void)e;
    return is_vector(t) ? EM_LINE_OPS : EM_LINE_LANES;
}

static const char *cl_dtype_missing(em_spmd *e, em_scalar s, int space)
{
    (void)space;
    if (s == EM_F64 && !e->caps.dtype[EM_F64])
        return "f64 needs cl_khr_fp64, which this device lacks (caps.dtype)";
    return NULL;
}

static void cl_literal(em_spmd *e, em_scalar s, em_ir_const c, em_strbuf *sb)
{
    static const char *const special[4] = {"INFINITY", "NAN", "((double)INFINITY)",
                                           "((double)NAN)"};
    em_spmd_c_literal(e, s, c, "L", "UL", special, sb);
}

static void cl_zero(em_spmd *e, em_type t, em_strbuf *sb)
{
    if (t.lanes == 1)
        em_sb_append(sb, " = 0");
    else if (is_vector(t))
        em_sb_printf(sb, " = (%s%u)(0)", e->d->ctype[t.scalar], t.lanes);
    else
        em_sb_append(sb, " = {0}");
}

static void cl_wrap(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb)
{
    if (em_spmd_narrow(s))
        em_sb_printf(sb, "(%s)(%s)", e->d->ctype[s], x);
    else if (s == EM_F16)
        em_sb_printf(sb, "em_rh(%s)", x);
    else if (s == EM_BF16)
        em_sb_printf(sb, "em_rb(%s)", x);
    else
        em_sb_append(sb, x);
}

static void cl_convert(em_spmd *e, em_scalar from, em_scalar to, const char *x, em_strbuf *sb)
{
    (void)from;
    if (to == EM_F16 || to == EM_BF16)
        em_sb_printf(sb, "%s((float)(%s))", to == EM_F16 ? "em_rh" : "em_rb", x);
    else
        em_sb_printf(sb, "(%s)(%s)", e->d->ctype[to], x);
}

static const char *cl_float_fn(em_spmd *e, em_ir_op op, em_scalar s)
{
    (void)e;
    (void)s; /* OpenCL's math functions are overloaded by type */
    return em_spmd_libm_name(op, false);
}

static const char *unsigned_of(em_scalar s)
{
    unsigned w = em_spmd_bits(s);
    return w == 8 ? "uchar" : w == 16 ? "ushort" : w == 32 ? "uint" : "ulong";
}

static void cl_bit_count(em_spmd *e, em_ir_op op, em_scalar s, const char *x, em_strbuf *sb)
{
    (void)e;
    /* popcount and clz keep the operand's width (clz(0) is the width) */
    if (op == EM_OP_POPCOUNT)
        em_sb_printf(sb, "(uint)popcount(%s)", x);
    else if (op == EM_OP_CLZ)
        em_sb_printf(sb, "(uint)clz(%s)", x);
    else /* trailing zeros = ones of ~x & (x - 1), which is the width for 0 */
        em_sb_printf(sb, "(uint)popcount((%s)(~(%s) & ((%s) - 1)))", unsigned_of(s), x, x);
}

static void cl_to_bits(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb)
{
    (void)e;
    switch (s) {
    case EM_F32:
        em_sb_printf(sb, "as_uint(%s)", x);
        break;
    case EM_F64:
        em_sb_printf(sb, "as_ulong(%s)", x);
        break;
    case EM_F16:
        em_sb_printf(sb, "(uint)em_f2h(%s)", x);
        break;
    case EM_BF16:
        em_sb_printf(sb, "(uint)em_f2b(%s)", x);
        break;
    case EM_I64:
    case EM_U64:
        em_sb_printf(sb, "(ulong)(%s)", x);
        break;
    default:
        em_sb_printf(sb, "(uint)(%s)(%s)", unsigned_of(s), x);
        break;
    }
}

static void cl_from_bits(em_spmd *e, em_scalar s, const char *b, em_strbuf *sb)
{
    switch (s) {
    case EM_F32:
        em_sb_printf(sb, "as_float((uint)(%s))", b);
        break;
    case EM_F64:
        em_sb_printf(sb, "as_double((ulong)(%s))", b);
        break;
    case EM_F16:
        em_sb_printf(sb, "em_h2f((ushort)(%s))", b);
        break;
    case EM_BF16:
        em_sb_printf(sb, "em_b2f((ushort)(%s))", b);
        break;
    default:
        em_sb_printf(sb, "(%s)(%s)", e->d->ctype[s], b);
        break;
    }
}

static void cl_builtin(em_spmd *e, em_builtin b, em_strbuf *sb)
{
    (void)e;
    static const char *const fns[EM_BUILTIN_COUNT] = {[EM_UNIT_POS_X] = "get_local_id",
                                                      [EM_CUBE_POS_X] = "get_group_id",
                                                      [EM_CUBE_DIM_X] = "get_local_size",
                                                      [EM_CUBE_COUNT_X] = "get_num_groups"};
    if (b == EM_PLANE_DIM) {
        em_sb_append(sb, "get_sub_group_size()");
    } else if (b == EM_UNIT_POS_PLANE) {
        em_sb_append(sb, "get_sub_group_local_id()");
    } else {
        /* each linear position is followed by its X, Y, Z entries */
        int axis = ((int)b - (int)EM_UNIT_POS) % 4 - 1;
        int base = (int)b - axis;
        if (b < EM_UNIT_POS_X || b > EM_CUBE_COUNT_Z || axis < 0 || !fns[base])
            em_sb_append(sb, "0u");
        else
            em_sb_printf(sb, "(uint)%s(%d)", fns[base], axis);
    }
}

static void cl_meta(em_spmd *e, uint32_t off, em_strbuf *sb)
{
    (void)e;
    em_sb_printf(sb, "(uint)em_meta[%u]", off);
}

/* ---- memory ------------------------------------------------------------------------------------
 */

static const em_ir_memory *mem(em_spmd *e, em_ir_mem m)
{
    return em_ir_mem_at(e->k, m);
}

/* Element `index` (lane `lane` when >= 0) of a shared or private array: vector lines by .sN, other
 * lines (bool lines too, whose arrays hold uchar) by an inner index. */
static void array_elem(em_spmd *e, const em_ir_memory *x, const char *name, const char *index,
                       int lane, em_strbuf *sb)
{
    em_strbuf el;
    em_sb_init(&el);
    em_sb_printf(&el, "%s[%s]", name, index);
    if (lane < 0)
        em_sb_append(sb, el.data);
    else
        cl_lane(e, x->elem, el.data, (unsigned)lane, sb);
    em_sb_free(&el);
}

/* Buffers hold storage scalars (lines flattened); shared and private arrays hold compute-typed
 * lines (bool as uchar). */
static void cl_mem_load(em_spmd *e, em_ir_mem m, const char *index, int lane, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    const char *name = e->mname[m];
    em_strbuf el;
    em_sb_init(&el);
    if (x->space == EM_MEM_GLOBAL) {
        if (lane < 0)
            em_sb_append(&el, index);
        else
            em_sb_printf(&el, "(%s) * %u + %d", index, x->elem.lanes, lane);
        if (s == EM_F16)
            em_sb_printf(sb, "vload_half(%s, %s)", el.data, name);
        else if (s == EM_BF16)
            em_sb_printf(sb, "em_b2f(%s[%s])", name, el.data);
        else if (s == EM_BOOL)
            em_sb_printf(sb, "(%s[%s] != 0)", name, el.data);
        else
            em_sb_printf(sb, "%s[%s]", name, el.data);
    } else {
        array_elem(e, x, name, index, lane, &el);
        if (s == EM_BOOL)
            em_sb_printf(sb, "(%s != 0)", el.data);
        else
            em_sb_append(sb, el.data);
    }
    em_sb_free(&el);
}

static void cl_mem_store(em_spmd *e, em_ir_mem m, const char *index, int lane, const char *value)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    const char *name = e->mname[m];
    em_strbuf el;
    em_sb_init(&el);
    if (x->space == EM_MEM_GLOBAL) {
        if (lane < 0)
            em_sb_append(&el, index);
        else
            em_sb_printf(&el, "(%s) * %u + %d", index, x->elem.lanes, lane);
        if (s == EM_F16)
            em_spmd_line(e, "vstore_half_rte(%s, %s, %s);", value, el.data, name);
        else if (s == EM_BF16)
            em_spmd_line(e, "%s[%s] = em_f2b(%s);", name, el.data, value);
        else if (s == EM_BOOL)
            em_spmd_line(e, "%s[%s] = (%s) ? 1 : 0;", name, el.data, value);
        else
            em_spmd_line(e, "%s[%s] = %s;", name, el.data, value);
    } else {
        array_elem(e, x, name, index, lane, &el);
        if (s == EM_BOOL)
            em_spmd_line(e, "%s = (%s) ? 1 : 0;", el.data, value);
        else
            em_spmd_line(e, "%s = %s;", el.data, value);
    }
    em_sb_free(&el);
}

static bool cl_mem_load_line(em_spmd *e, em_ir_mem m, const char *index, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    if (!is_vector(x->elem) || s == EM_BF16) return false;
    if (x->space != EM_MEM_GLOBAL)
        em_sb_printf(sb, "%s[%s]", e->mname[m], index);
    else if (s == EM_F16)
        em_sb_printf(sb, "vload_half%u(%s, %s)", x->elem.lanes, index, e->mname[m]);
    else
        em_sb_printf(sb, "vload%u(%s, %s)", x->elem.lanes, index, e->mname[m]);
    return true;
}

static bool cl_mem_store_line(em_spmd *e, em_ir_mem m, const char *index, const char *value)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    if (!is_vector(x->elem) || s == EM_BF16) return false;
    if (x->space != EM_MEM_GLOBAL)
        em_spmd_line(e, "%s[%s] = %s;", e->mname[m], index, value);
    else if (s == EM_F16)
        em_spmd_line(e, "vstore_half%u_rte(%s, %s, %s);", x->elem.lanes, value, index, e->mname[m]);
    else
        em_spmd_line(e, "vstore%u(%s, %s, %s);", x->elem.lanes, value, index, e->mname[m]);
    return true;
}

/* ---- synchronization, planes, atomics ------------------------------------------------------- */

static void cl_sync(em_spmd *e, const em_ir_inst *in)
{
    if (in->op == EM_OP_SYNC_CUBE) {
        em_spmd_line(e, "barrier(CLK_LOCAL_MEM_FENCE);");
    } else if (in->op == EM_OP_SYNC_PLANE) {
        e->needs |= EM_NEED_PLANE;
        em_spmd_line(e, "sub_group_barrier(CLK_LOCAL_MEM_FENCE);");
    } else {
        em_spmd_line(e, in->imm ? "mem_fence(CLK_GLOBAL_MEM_FENCE);"
                                : "mem_fence(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);");
    }
}

/* Sub-group functions take 32/64-bit and float operands: narrow integers and bool go as int/uint.
 */
static const char *plane_arg_type(em_scalar s)
{
    if (s == EM_BOOL || s == EM_I8 || s == EM_I16) return "int";
    if (s == EM_U8 || s == EM_U16) return "uint";
    return NULL;
}

static void cl_plane(em_spmd *e, const em_ir_inst *in, em_scalar s, const char *a, const char *b,
                     em_strbuf *sb)
{
    e->needs |= EM_NEED_PLANE;
    const char *wide = plane_arg_type(s);
    em_strbuf arg, call;
    em_sb_init(&arg);
    em_sb_init(&call);
    if (wide)
        em_sb_printf(&arg, "(%s)(%s)", wide, a);
    else
        em_sb_append(&arg, a);
    switch (in->op) {
    case EM_OP_PLANE_SUM:
        em_sb_printf(&call, "sub_group_reduce_add(%s)", arg.data);
        break;
    case EM_OP_PLANE_MIN:
        em_sb_printf(&call, "sub_group_reduce_min(%s)", arg.data);
        break;
    case EM_OP_PLANE_MAX:
        em_sb_printf(&call, "sub_group_reduce_max(%s)", arg.data);
        break;
    case EM_OP_PLANE_PROD:
        e->needs |= EM_NEED_PLANE_MUL;
        em_sb_printf(&call, "sub_group_non_uniform_reduce_mul(%s)", arg.data);
        break;
    case EM_OP_PLANE_INCLUSIVE_SUM:
        em_sb_printf(&call, "sub_group_scan_inclusive_add(%s)", arg.data);
        break;
    case EM_OP_PLANE_EXCLUSIVE_SUM:
        em_sb_printf(&call, "sub_group_scan_exclusive_add(%s)", arg.data);
        break;
    case EM_OP_PLANE_ALL:
        em_sb_printf(sb, "(sub_group_all((int)(%s)) != 0)", a);
        break;
    case EM_OP_PLANE_ANY:
        em_sb_printf(sb, "(sub_group_any((int)(%s)) != 0)", a);
        break;
    case EM_OP_PLANE_BALLOT:
        e->needs |= EM_NEED_PLANE_BALLOT;
        em_sb_printf(sb, "sub_group_ballot((int)(%s)).s0", a);
        break;
    case EM_OP_PLANE_BROADCAST:
        em_sb_printf(&call, "sub_group_broadcast(%s, (uint)(%s))", arg.data, b);
        break;
    case EM_OP_PLANE_SHUFFLE:
        e->needs |= EM_NEED_SHUFFLE;
        em_sb_printf(&call, "sub_group_shuffle(%s, (uint)(%s))", arg.data, b);
        break;
    case EM_OP_PLANE_SHUFFLE_XOR:
        e->needs |= EM_NEED_SHUFFLE;
        em_sb_printf(&call, "sub_group_shuffle_xor(%s, (uint)(%s))", arg.data, b);
        break;
    case EM_OP_PLANE_SHUFFLE_UP:
    case EM_OP_PLANE_SHUFFLE_DOWN: {
        /* out-of-range lanes keep their own value; the shuffle itself runs on every lane */
        bool up = in->op == EM_OP_PLANE_SHUFFLE_UP;
        e->needs |= EM_NEED_SHUFFLE_REL;
        char tmp[32];
        em_spmd_fresh(e, "sh", tmp);
        em_spmd_line(e, "%s %s = sub_group_shuffle_%s(%s, (uint)(%s));",
                     wide ? wide : e->d->ctype[s], tmp, up ? "up" : "down", arg.data, b);
        em_sb_printf(
            &call,
            up ? "(get_sub_group_local_id() >= (uint)(%s) ? %s : %s)"
               : "(get_sub_group_local_id() + (uint)(%s) < get_sub_group_size() ? %s : %s)",
            b, tmp, arg.data);
        break;
    }
    default:
        em_spmd_fail(e, "unknown plane op");
        break;
    }
    if (call.len) {
        if (s == EM_BOOL)
            em_sb_printf(sb, "(%s != 0)", call.data);
        else if (wide)
            em_sb_printf(sb, "(%s)%s", e->d->ctype[s], call.data);
        else
            em_sb_append(sb, call.data);
    }
    em_sb_free(&arg);
    em_sb_free(&call);
}

static void cl_atomic(em_spmd *e, const em_ir_inst *in, const char *index, em_strbuf *sb)
{
    const em_ir_memory *m = mem(e, in->mem);
    em_scalar s = (em_scalar)m->elem.scalar;
    bool global = m->space == EM_MEM_GLOBAL, is64 = em_spmd_bits(s) == 64;
    const char *space = global ? "__global" : "__local";
    em_strbuf p, v, c;
    em_sb_init(&p);
    em_sb_init(&v);
    em_sb_init(&c);
    em_sb_printf(&p, "&%s[%s]", e->mname[in->mem], index);
    if (in->args[1]) em_spmd_val(e, in->args[1], &v);
    if (in->args[2]) em_spmd_val(e, in->args[2], &c);
    if (is64) e->needs |= EM_NEED_ATOMIC64;
    static const char *const names[] = {"add", "sub", "min",  "max",    "and",
                                        "or",  "xor", "xchg", "cmpxchg"};
    em_ir_op op = (em_ir_op)in->op;
    const char *pre = is64 ? "atom_" : "atomic_";
    if (op == EM_OP_ATOMIC_LOAD) {
        em_sb_printf(sb, "*(volatile %s %s *)%s", space, storage_type[s], p.data);
    } else if (em_scalar_is_float(s) && (op == EM_OP_ATOMIC_ADD || op == EM_OP_ATOMIC_SUB)) {
        e->needs |= global ? EM_NEED_FATOMIC_G : EM_NEED_FATOMIC_L;
        em_sb_printf(sb, "em_atomic_add_%s_%s(%s, %s(%s))", s == EM_F64 ? "f64" : "f32",
                     global ? "global" : "local", p.data, op == EM_OP_ATOMIC_SUB ? "-" : "",
                     v.data);
    } else if (s == EM_F64) { /* XCHG, STORE */
        em_sb_printf(sb, "%satom_xchg((volatile %s long *)%s, as_long(%s))%s",
                     op == EM_OP_ATOMIC_XCHG ? "as_double(" : "", space, p.data, v.data,
                     op == EM_OP_ATOMIC_XCHG ? ")" : "");
    } else if (op == EM_OP_ATOMIC_STORE) {
        em_sb_printf(sb, "%sxchg(%s, %s)", pre, p.data, v.data);
    } else if (op == EM_OP_ATOMIC_CAS) {
        em_sb_printf(sb, "%scmpxchg(%s, %s, %s)", pre, p.data, v.data, c.data);
    } else if (op >= EM_OP_ATOMIC_ADD && op <= EM_OP_ATOMIC_XCHG) {
        em_sb_printf(sb, "%s%s(%s, %s)", pre, names[op - EM_OP_ATOMIC_ADD], p.data, v.data);
    } else {
        em_spmd_fail(e, "unknown atomic op");
    }
    em_sb_free(&p);
    em_sb_free(&v);
    em_sb_free(&c);
}

static void cl_print(em_spmd *e, const em_ir_inst *in)
{
    em_spmd_printf(e, in, false, "", 64);
}

/* ---- kernels ------------------------------------------------------------------------------------
 */

/* "T name[len]" for a shared or private array of elem (lines as vectors or inner arrays). */
static void array_decl(em_type elem, const char *name, uint32_t len, em_strbuf *sb)
{
    const char *t = array_type[elem.scalar];
    if (elem.lanes == 1)
        em_sb_printf(sb, "%s %s[%u]", t, name, len);
    else if (is_vector(elem))
        em_sb_printf(sb, "%s%u %s[%u]", t, elem.lanes, name, len);
    else
        em_sb_printf(sb, "%s %s[%u][%u]", t, name, len, elem.lanes);
}

static void cl_open(em_spmd *e)
{
    const em_ir_kernel *k = e->k;
    em_strbuf *sb = e->sb;
    uint32_t dim[3];
    em_ir_cube_dim(k, dim);
    em_sb_append(sb, "__kernel ");
    if (dim[0] && dim[1] && dim[2])
        em_sb_printf(sb, "__attribute__((reqd_work_group_size(%u, %u, %u))) ", dim[0], dim[1],
                     dim[2]);
    em_sb_printf(sb, "void %s(", em_ir_kernel_name(k));
    for (size_t i = 0; i < em_ir_param_count(k); i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind == EM_PARAM_BUFFER) {
            const em_ir_memory *m = em_ir_mem_at(k, p->id);
            em_sb_printf(sb, "__global %s%s *%s, ", m->access == EM_READ ? "const " : "",
                         storage_type[m->elem.scalar], e->mname[p->id]);
        } else {
            em_scalar s = (em_scalar)em_spmd_value(e, p->id)->type.scalar;
            if (s == EM_BOOL)
                em_sb_printf(sb, "const uchar %s_in, ", e->vname[p->id]);
            else
                em_sb_printf(sb, "const %s %s, ", e->d->ctype[s], e->vname[p->id]);
        }
    }
    em_sb_append(sb, "__global const ulong *em_meta)\n{\n");
    e->depth = 1;
    for (size_t m = 1; m <= em_ir_mem_count(k); m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        if (x->space == EM_MEM_GLOBAL || !(e->mflags[m] & EM_MEMF_USED)) continue;
        em_strbuf d;
        em_sb_init(&d);
        array_decl(x->elem, e->mname[m], x->length, &d);
        em_spmd_line(e, "%s%s;", x->space == EM_MEM_SHARED ? "__local " : "", d.data);
        em_sb_free(&d);
    }
    for (size_t i = 0; i < em_ir_param_count(k); i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind == EM_PARAM_SCALAR && em_spmd_value(e, p->id)->type.scalar == EM_BOOL)
            em_spmd_line(e, "const bool %s = %s_in != 0;", e->vname[p->id], e->vname[p->id]);
    }
}

static const em_spmd_dialect opencl_dialect = {
    .name = "OpenCL",
    .ns = "opencl",
    .ctype = {[EM_BOOL] = "bool",
              [EM_I8] = "char",
              [EM_I16] = "short",
              [EM_I32] = "int",
              [EM_I64] = "long",
              [EM_U8] = "uchar",
              [EM_U16] = "ushort",
              [EM_U32] = "uint",
              [EM_U64] = "ulong",
              [EM_F16] = "float",
              [EM_BF16] = "float",
              [EM_F32] = "float",
              [EM_F64] = "double"},
    .fn_prefix = "",
    .vector_math = true,
    .unroll =
        NULL, /* loops left to unroll have run-time bounds; clang-based compilers warn on a hint */
    .decl = cl_decl,
    .lane = cl_lane,
    .line_kind = cl_line_kind,
    .dtype_missing = cl_dtype_missing,
    .literal = cl_literal,
    .zero = cl_zero,
    .convert = cl_convert,
    .wrap = cl_wrap,
    .float_fn = cl_float_fn,
    .bit_count = cl_bit_count,
    .to_bits = cl_to_bits,
    .from_bits = cl_from_bits,
    .builtin = cl_builtin,
    .meta = cl_meta,
    .mem_load = cl_mem_load,
    .mem_store = cl_mem_store,
    .mem_load_line = cl_mem_load_line,
    .mem_store_line = cl_mem_store_line,
    .sync = cl_sync,
    .plane = cl_plane,
    .atomic = cl_atomic,
    .print = cl_print,
    .open = cl_open,
};

/* ---- the source's prelude -----------------------------------------------------------------------
 */

static const char prelude_f16[] =
    "/* f16: binary16 in memory (vload_half / vstore_half), float in registers, rounded after "
    "every operation. */\n"
    "ushort em_f2h(float x) { ushort h; vstore_half_rte(x, 0, (__private half *)&h); return h; }\n"
    "float em_h2f(ushort h) { return vload_half(0, (__private const half *)&h); }\n"
    "float em_rh(float x) { return em_h2f(em_f2h(x)); }\n";

static const char prelude_bf16[] =
    "/* bf16: bfloat16 bits in memory, float in registers, rounded (to nearest even) after every "
    "operation. */\n"
    "ushort em_f2b(float x)\n"
    "{\n"
    "    uint u = as_uint(x);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);\n"
    "    return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "float em_b2f(ushort b) { return as_float((uint)b << 16); }\n"
    "float em_rb(float x) { return em_b2f(em_f2b(x)); }\n";

/* Float atomic add as a compare-exchange loop on the bits, for address space SPACE. */
static void fatomic_helpers(em_strbuf *sb, const char *space, bool f64)
{
    const char *ft = f64 ? "double" : "float", *ut = f64 ? "ulong" : "uint",
               *cas = f64 ? "atom_cmpxchg" : "atomic_cmpxchg";
    const char *as_u = f64 ? "as_ulong" : "as_uint", *as_f = f64 ? "as_double" : "as_float";
    em_sb_printf(sb,
                 "%s em_atomic_add_%s_%s(volatile __%s %s *p, %s v)\n"
                 "{\n"
                 "    volatile __%s %s *u = (volatile __%s %s *)p;\n"
                 "    %s seen, old = *u;\n"
                 "    do {\n"
                 "        seen = old;\n"
                 "        old = %s(u, seen, %s(%s(seen) + v));\n"
                 "    } while (old != seen);\n"
                 "    return %s(old);\n"
                 "}\n",
                 ft, f64 ? "f64" : "f32", space, space, ft, ft, space, ut, space, ut, ut, cas, as_u,
                 as_f, as_f);
}

static void prelude(const em_caps *caps, uint32_t needs, em_strbuf *sb)
{
    em_sb_append(sb, "/* ember: OpenCL C (1.2 / 2.0), generated by src/kernel/codegen/opencl.c "
                     "(its top comment gives\n"
                     " * the parameter ABI). */\n");
    if (needs & EM_NEED_F64) em_sb_append(sb, "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n");
    if (needs & EM_NEED_ATOMIC64)
        em_sb_append(sb, "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable\n"
                         "#pragma OPENCL EXTENSION cl_khr_int64_extended_atomics : enable\n");
    if (needs & EM_NEED_PLANE)
        em_sb_append(sb, "#pragma OPENCL EXTENSION cl_khr_subgroups : enable\n");
    em_sb_append(sb, "\n");
    if (needs & EM_NEED_F16) em_sb_append(sb, prelude_f16);
    if (needs & EM_NEED_BF16) em_sb_append(sb, prelude_bf16);
    bool d = (needs & EM_NEED_F64) != 0;
    if (needs & EM_NEED_FATOMIC_G) {
        fatomic_helpers(sb, "global", false);
        if (d) fatomic_helpers(sb, "global", true);
    }
    if (needs & EM_NEED_FATOMIC_L) {
        fatomic_helpers(sb, "local", false);
        if (d) fatomic_helpers(sb, "local", true);
    }
    em_sb_append(sb, "/* Positions. */\n");
    em_spmd_position_helpers(&opencl_dialect, caps, NULL, "void", sb);
    em_sb_append(sb, "\n");
}

char *em_codegen_opencl(const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    em_caps c = caps ? *caps : em_spmd_default_caps("opencl", 1);
    return em_spmd_translation_unit(&opencl_dialect, ks, n, &c, prelude, "OpenCL");
}
