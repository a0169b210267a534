/* glsl.c — the Vulkan target: GLSL 450 compute shaders (compiled to SPIR-V by the Vulkan driver
 * through shaderc / glslang), written by the shared SPMD emitter (spmd.c) with the dialect below.
 * Values compute in 32-bit types where GLSL has no narrower arithmetic (i8/i16 as int, u8/u16 as
 * uint, f16/bf16 as float, each wrapped or rounded after every operation); buffers hold the real
 * widths through GL_EXT_shader_8bit_storage / GL_EXT_shader_16bit_storage. Lines of 2-4 lanes are
 * vecN / ivecN / uvecN / bvecN / dvecN, wider ones arrays.
 *
 * ---- interface (the Vulkan driver follows it) -------------------------------------------------
 * A batch of kernels gives one text holding one shader per kernel, in order; each starts with the
 * line "//@@ember-kernel NAME" (a comment, so every piece compiles as it is). Entry point: main.
 * Descriptor set 0, all storage buffers (std430):
 *   - buffer parameter at parameter index i: binding i (scalar parameters leave their index
 *     unused), the buffer from element 0 (bind with the element offset), element type the
 *     storage type: bool and u8 uint8_t (bool 0/1), i8 int8_t, i16 int16_t, u16 uint16_t,
 *     i32 int, u32 uint, i64 int64_t, u64 uint64_t, f16 float16_t, bf16 uint16_t (bfloat16
 *     bits), f32 float, f64 double; 2- and 4-lane lines of 32/64-bit kinds as vecN arrays, other
 *     lines as flat scalar arrays (element i of an N-lane buffer is scalars [i*N, i*N+N));
 *   - binding P (P = the kernel's parameter count): the metadata buffer, read as uint words: the
 *     u64 words of spmd.h (for each buffer parameter in order, len, shape[0..rank),
 *     stride[0..rank)); only the low halves are read. Always present (bind a one-word buffer when
 *     there are no buffers).
 * Scalar parameters are push constants, one 8-byte slot each in the order of the scalar
 * parameters (slot j at byte offset 8*j, block size 8 * count): 32-bit values at the start of
 * the slot (bool as uint 0/1, i8/i16/i32 as int sign-extended, u8/u16/u32 as uint, f16/bf16/f32
 * as float), 64-bit values (double, int64_t, uint64_t) fill it.
 * Cube size: work groups are flat — specialization constant 0 (local_size_x_id) is X*Y*Z — and
 * constants 3, 4, 5 (em_dim_x/y/z) are the cube's axes, from which UNIT_POS_X/Y/Z are derived, so
 * sub-groups are runs of consecutive unit indices whatever the cube's shape; kernels with fixed
 * cube dims give them as the defaults. Dispatch = the cube count.
 * Needs: 64-bit integers GL_EXT_shader_explicit_arithmetic_types_int64 (caps.dtype[EM_I64/U64]);
 * f64 shaderFloat64 (caps.dtype[EM_F64], and no f64 transcendentals: GLSL has only sqrt, floor,
 * ceil, roundEven, abs, min, max, fma on doubles); 8/16-bit buffers the storage extensions
 * (caps.dtype of the kind; bool buffers need caps.dtype[EM_U8]); plane ops the
 * GL_KHR_shader_subgroup_* extensions (caps.plane_ops; without them PLANE_DIM is 1); float
 * atomic add GL_EXT_shader_atomic_float on buffers when caps.float_atomic_add, else (and on
 * shared memory) a compare-exchange loop on the bits (a second, uint-typed view of the buffer on
 * the same binding).
 * Matrix ops: cooperative matrices where caps.matrix holds (GL_KHR_cooperative_matrix, or
 * GL_NV_cooperative_matrix when caps.matrix_api is "VK_NV_cooperative_matrix"; see "matrix ops"
 * below), per-unit loops where PLANE_DIM is 1, else rejected. print is dropped (no
 * debugPrintfEXT).
 * Intrinsics: "glsl.call:NAME" calls a built-in function. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernel/codegen/codegen.h"
#include "kernel/codegen/spmd.h"

#define SEPARATOR "//@@ember-kernel "

typedef struct glsl_state {
    bool plane64;  /* plane ops on 64-bit integers */
    bool coopmat;  /* matrix ops map to cooperative matrices (caps.matrix) */
    bool nv;       /* ... through GL_NV_cooperative_matrix (else GL_KHR_cooperative_matrix) */
    bool f16;      /* float16_t values (GL_EXT_shader_explicit_arithmetic_types_float16) */
    bool i8;       /* int8_t / uint8_t values (..._int8) */
    bool i16;      /* int16_t / uint16_t values (..._int16) */
    bool coop_int; /* integer cooperative matrices (NV: GL_NV_integer_cooperative_matrix) */
} glsl_state;

static const char *const storage_type[EM_SCALAR_COUNT] = {
    [EM_BOOL] = "uint8_t", [EM_I8] = "int8_t",     [EM_I16] = "int16_t",   [EM_I32] = "int",
    [EM_I64] = "int64_t",  [EM_U8] = "uint8_t",    [EM_U16] = "uint16_t",  [EM_U32] = "uint",
    [EM_U64] = "uint64_t", [EM_F16] = "float16_t", [EM_BF16] = "uint16_t", [EM_F32] = "float",
    [EM_F64] = "double"};

static const char *const vec_prefix[EM_SCALAR_COUNT] = {
    [EM_BOOL] = "b", [EM_I8] = "i",  [EM_I16] = "i", [EM_I32] = "i",   [EM_I64] = "i64",
    [EM_U8] = "u",   [EM_U16] = "u", [EM_U32] = "u", [EM_U64] = "u64", [EM_F16] = "",
    [EM_BF16] = "",  [EM_F32] = "",  [EM_F64] = "d"};

static bool is_vec(em_type t)
{
    return t.lanes >= 2 && t.lanes <= 4;
}

/* Buffers of 2- or 4-lane lines of 32/64-bit kinds are arrays of vectors (std430 packs them). */
static bool vec_storage(em_type t)
{
    em_scalar s = (em_scalar)t.scalar;
    bool wide =
        s == EM_I32 || s == EM_U32 || s == EM_F32 || s == EM_F64 || s == EM_I64 || s == EM_U64;
    return wide && (t.lanes == 2 || t.lanes == 4);
}

/* ---- types, literals, conversions ------------------------------------------------------------ */

static void gl_decl(em_spmd *e, em_type t, const char *name, em_strbuf *sb)
{
    if (t.lanes == 1)
        em_sb_printf(sb, "%s %s", e->d->ctype[t.scalar], name);
    else if (is_vec(t))
        em_sb_printf(sb, "%svec%u %s", vec_prefix[t.scalar], t.lanes, name);
    else
        em_sb_printf(sb, "%s %s[%u]", e->d->ctype[t.scalar], name, t.lanes);
}

static void gl_lane(em_spmd *e, em_type t, const char *name, unsigned i, em_strbuf *sb)
{
    (void)e;
    (void)t;
    em_sb_printf(sb, "%s[%u]", name, i);
}

static int gl_line_kind(em_spmd *e, em_type t)
{
    (void)e;
    return is_vec(t) ? EM_LINE_OPS : EM_LINE_ASSIGN;
}

static const char *gl_dtype_missing(em_spmd *e, em_scalar s, int space)
{
    const bool *dt = e->caps.dtype;
    if ((s == EM_F64 || s == EM_I64 || s == EM_U64) && !dt[s])
        return s == EM_F64
                   ? "f64 needs shaderFloat64, which this device lacks (caps.dtype)"
                   : "64-bit integers need shaderInt64, which this device lacks (caps.dtype)";
    if (space != EM_MEM_GLOBAL) return NULL;
    if (s == EM_BOOL && !dt[EM_U8])
        return "bool buffers need 8-bit storage, which this device lacks (caps.dtype[u8])";
    if ((s == EM_I8 || s == EM_U8) && !dt[s])
        return "8-bit buffers need 8-bit storage, which this device lacks (caps.dtype)";
    if ((s == EM_I16 || s == EM_U16 || s == EM_F16 || s == EM_BF16) && !dt[s])
        return "16-bit buffers need 16-bit storage, which this device lacks (caps.dtype)";
    return NULL;
}

static void gl_literal(em_spmd *e, em_scalar s, em_ir_const c, em_strbuf *sb)
{
    static const char *const special[4] = {
        "uintBitsToFloat(0x7f800000u)", "uintBitsToFloat(0x7fc00000u)",
        "packDouble2x32(uvec2(0u, 0x7ff00000u))", "packDouble2x32(uvec2(0u, 0x7ff80000u))"};
    if (s == EM_F64 && isfinite(c.f)) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.17g", c.f);
        em_sb_append(sb, buf);
        if (!strpbrk(buf, ".eE")) em_sb_append(sb, ".0");
        em_sb_append(sb, "lf");
        return;
    }
    em_spmd_c_literal(e, s, c, "l", "ul", special, sb);
}

static void gl_zero(em_spmd *e, em_type t, em_strbuf *sb)
{
    em_strbuf z;
    em_sb_init(&z);
    em_ir_const c = {0};
    e->d->literal(e, (em_scalar)t.scalar, c, &z);
    if (t.lanes == 1) {
        em_sb_printf(sb, " = %s", z.data);
    } else if (is_vec(t)) {
        em_sb_printf(sb, " = %svec%u(%s)", vec_prefix[t.scalar], t.lanes, z.data);
    } else {
        em_sb_printf(sb, " = %s[%u](", e->d->ctype[t.scalar], t.lanes);
        for (unsigned i = 0; i < t.lanes; i++) em_sb_printf(sb, "%s%s", i ? ", " : "", z.data);
        em_sb_append(sb, ")");
    }
    em_sb_free(&z);
}

static void gl_wrap(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb)
{
    (void)e;
    switch (s) {
    case EM_I8:
        em_sb_printf(sb, "bitfieldExtract(%s, 0, 8)", x);
        break;
    case EM_I16:
        em_sb_printf(sb, "bitfieldExtract(%s, 0, 16)", x);
        break;
    case EM_U8:
        em_sb_printf(sb, "((%s) & 0xFFu)", x);
        break;
    case EM_U16:
        em_sb_printf(sb, "((%s) & 0xFFFFu)", x);
        break;
    case EM_F16:
        em_sb_printf(sb, "em_rh(%s)", x);
        break;
    case EM_BF16:
        em_sb_printf(sb, "em_rb(%s)", x);
        break;
    default:
        em_sb_append(sb, x);
        break;
    }
}

static void gl_convert(em_spmd *e, em_scalar from, em_scalar to, const char *x, em_strbuf *sb)
{
    (void)from;
    em_strbuf c;
    em_sb_init(&c);
    em_sb_printf(&c, "%s(%s)", e->d->ctype[to], x);
    gl_wrap(e, to, c.data, sb);
    em_sb_free(&c);
}

static const char *gl_float_fn(em_spmd *e, em_ir_op op, em_scalar s)
{
    static const char *const f32[EM_OP_COUNT] = {
        [EM_OP_EXP] = "exp",         [EM_OP_EXP2] = "exp2",   [EM_OP_LOG] = "log",
        [EM_OP_LOG2] = "log2",       [EM_OP_SQRT] = "sqrt",   [EM_OP_RSQRT] = "inversesqrt",
        [EM_OP_ERF] = "em_erf",      [EM_OP_TANH] = "tanh",   [EM_OP_SIN] = "sin",
        [EM_OP_COS] = "cos",         [EM_OP_FLOOR] = "floor", [EM_OP_CEIL] = "ceil",
        [EM_OP_ROUND] = "roundEven", [EM_OP_ABS] = "abs",     [EM_OP_POW] = "pow",
        [EM_OP_MIN] = "min",         [EM_OP_MAX] = "max",     [EM_OP_FMA] = "fma",
        [EM_OP_ISNAN] = "isnan",     [EM_OP_ISINF] = "isinf"};
    static const char *const f64[EM_OP_COUNT] = {
        [EM_OP_SQRT] = "sqrt",   [EM_OP_RSQRT] = "inversesqrt", [EM_OP_FLOOR] = "floor",
        [EM_OP_CEIL] = "ceil",   [EM_OP_ROUND] = "roundEven",   [EM_OP_ABS] = "abs",
        [EM_OP_MIN] = "min",     [EM_OP_MAX] = "max",           [EM_OP_FMA] = "fma",
        [EM_OP_ISNAN] = "isnan", [EM_OP_ISINF] = "isinf"};
    if (op >= EM_OP_COUNT) return NULL;
    if (s != EM_F64 && op == EM_OP_ERF) e->needs |= EM_NEED_ERF;
    return s == EM_F64 ? f64[op] : f32[op];
}

static void gl_bit_count(em_spmd *e, em_ir_op op, em_scalar s, const char *x, em_strbuf *sb)
{
    unsigned w = em_spmd_bits(s);
    if (w == 64) {
        static const char *const fn[] = {"em_popcount64", "em_clz64", "em_ctz64"};
        e->needs |= EM_NEED_BITS64;
        em_sb_printf(sb, "%s(uint64_t(%s))", fn[op - EM_OP_POPCOUNT], x);
        return;
    }
    em_strbuf m;
    em_sb_init(&m);
    if (w == 32)
        em_sb_printf(&m, "uint(%s)", x);
    else
        em_sb_printf(&m, "(uint(%s) & %su)", x, w == 8 ? "0xFF" : "0xFFFF");
    if (op == EM_OP_POPCOUNT)
        em_sb_printf(sb, "uint(bitCount(%s))", m.data);
    else if (op == EM_OP_CLZ) /* findMSB(0u) is -1 */
        em_sb_printf(sb, "uint(%u - findMSB(%s))", w - 1, m.data);
    else /* findLSB(0u) is -1, i.e. 0xffffffffu */
        em_sb_printf(sb, "min(uint(findLSB(%s)), %uu)", m.data, w);
    em_sb_free(&m);
}

static void gl_to_bits(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb)
{
    switch (s) {
    case EM_F32:
        em_sb_printf(sb, "floatBitsToUint(%s)", x);
        break;
    case EM_F64:
        em_sb_printf(sb, "doubleBitsToUint64(%s)", x);
        break;
    case EM_F16:
        em_sb_printf(sb, "(packHalf2x16(vec2(%s, 0.0)) & 0xFFFFu)", x);
        break;
    case EM_BF16:
        em_sb_printf(sb, "em_f2b(%s)", x);
        break;
    case EM_I64:
    case EM_U64:
        em_sb_printf(sb, "uint64_t(%s)", x);
        break;
    case EM_I8:
    case EM_U8:
        em_sb_printf(sb, "(uint(%s) & 0xFFu)", x);
        break;
    case EM_I16:
    case EM_U16:
        em_sb_printf(sb, "(uint(%s) & 0xFFFFu)", x);
        break;
    default:
        em_sb_printf(sb, "uint(%s)", x);
        break;
    }
    if (em_spmd_bits(s) == 64) e->needs |= EM_NEED_INT64;
}

static void gl_from_bits(em_spmd *e, em_scalar s, const char *b, em_strbuf *sb)
{
    switch (s) {
    case EM_F32:
        em_sb_printf(sb, "uintBitsToFloat(%s)", b);
        break;
    case EM_F64:
        em_sb_printf(sb, "uint64BitsToDouble(%s)", b);
        break;
    case EM_F16:
        em_sb_printf(sb, "unpackHalf2x16(%s).x", b);
        break;
    case EM_BF16:
        em_sb_printf(sb, "em_b2f(%s)", b);
        break;
    default:
        gl_convert(e, EM_U32, s, b, sb);
        break;
    }
}

static void gl_builtin(em_spmd *e, em_builtin b, em_strbuf *sb)
{
    (void)e;
    static const char *const names[EM_BUILTIN_COUNT] = {
        [EM_UNIT_POS] = "gl_LocalInvocationIndex",
        [EM_UNIT_POS_X] = "(gl_LocalInvocationIndex % em_dim_x)",
        [EM_UNIT_POS_Y] = "((gl_LocalInvocationIndex / em_dim_x) % em_dim_y)",
        [EM_UNIT_POS_Z] = "(gl_LocalInvocationIndex / (em_dim_x * em_dim_y))",
        [EM_CUBE_POS_X] = "gl_WorkGroupID.x",
        [EM_CUBE_POS_Y] = "gl_WorkGroupID.y",
        [EM_CUBE_POS_Z] = "gl_WorkGroupID.z",
        [EM_CUBE_DIM_X] = "em_dim_x",
        [EM_CUBE_DIM_Y] = "em_dim_y",
        [EM_CUBE_DIM_Z] = "em_dim_z",
        [EM_CUBE_COUNT_X] = "gl_NumWorkGroups.x",
        [EM_CUBE_COUNT_Y] = "gl_NumWorkGroups.y",
        [EM_CUBE_COUNT_Z] = "gl_NumWorkGroups.z",
        [EM_PLANE_DIM] = "gl_SubgroupSize",
        [EM_UNIT_POS_PLANE] = "gl_SubgroupInvocationID"};
    em_sb_append(sb, b < EM_BUILTIN_COUNT && names[b] ? names[b] : "0u");
}

static void gl_meta(em_spmd *e, uint32_t off, em_strbuf *sb)
{
    (void)e;
    em_sb_printf(sb, "em_meta.m[%u]", 2 * off);
}

/* ---- memory ------------------------------------------------------------------------------------
 */

static const em_ir_memory *mem(em_spmd *e, em_ir_mem m)
{
    return em_ir_mem_at(e->k, m);
}

/* Shared float memory that atomics modify holds the bits (uint / uint64_t). */
static bool shared_bits(em_spmd *e, em_ir_mem m)
{
    const em_ir_memory *x = mem(e, m);
    return x->space == EM_MEM_SHARED && (e->mflags[m] & EM_MEMF_FLOAT_RMW);
}

/* Shared arrays that cooperative-matrix loads/stores use hold the storage type (float16_t,
 * int8_t...: coopMatLoad reads the array's own element type), converted on ordinary access. */
static bool shared_typed(em_spmd *e, em_ir_mem m)
{
    const glsl_state *st = e->priv;
    const em_ir_memory *x = mem(e, m);
    return st && st->coopmat && x->space == EM_MEM_SHARED && (e->mflags[m] & EM_MEMF_MATRIX) &&
           !shared_bits(e, m) && x->elem.lanes == 1 &&
           strcmp(storage_type[x->elem.scalar], e->d->ctype[x->elem.scalar]) != 0;
}

/* The element (or lane) of memory m as an lvalue in the memory's own type. */
static void elem_ref(em_spmd *e, em_ir_mem m, const char *index, int lane, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    const char *name = e->mname[m];
    if (x->space != EM_MEM_GLOBAL) {
        em_sb_printf(sb, "%s[%s]", name, index);
        if (lane >= 0) em_sb_printf(sb, "[%d]", lane);
    } else if (lane < 0) {
        em_sb_printf(sb, "%s.d[%s]", name, index);
    } else if (vec_storage(x->elem)) {
        em_sb_printf(sb, "%s.d[%s][%d]", name, index, lane);
    } else {
        em_sb_printf(sb, "%s.d[(%s) * %uu + %du]", name, index, x->elem.lanes, lane);
    }
}

static void gl_mem_load(em_spmd *e, em_ir_mem m, const char *index, int lane, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    em_strbuf el;
    em_sb_init(&el);
    elem_ref(e, m, index, lane, &el);
    const char *E = el.data;
    if (shared_bits(e, m))
        em_sb_printf(sb, "%s(%s)", s == EM_F64 ? "uint64BitsToDouble" : "uintBitsToFloat", E);
    else if (shared_typed(e, m))
        em_sb_printf(sb, "%s(%s)", e->d->ctype[s], E);
    else if (x->space != EM_MEM_GLOBAL)
        em_sb_append(sb, E);
    else if (s == EM_BOOL)
        em_sb_printf(sb, "(uint(%s) != 0u)", E);
    else if (s == EM_I8 || s == EM_I16)
        em_sb_printf(sb, "int(%s)", E);
    else if (s == EM_U8 || s == EM_U16)
        em_sb_printf(sb, "uint(%s)", E);
    else if (s == EM_F16)
        em_sb_printf(sb, "float(%s)", E);
    else if (s == EM_BF16)
        em_sb_printf(sb, "em_b2f(uint(%s))", E);
    else
        em_sb_append(sb, E);
    em_sb_free(&el);
}

static void gl_mem_store(em_spmd *e, em_ir_mem m, const char *index, int lane, const char *value)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    em_strbuf el;
    em_sb_init(&el);
    elem_ref(e, m, index, lane, &el);
    const char *E = el.data;
    if (shared_bits(e, m))
        em_spmd_line(e, "%s = %s(%s);", E, s == EM_F64 ? "doubleBitsToUint64" : "floatBitsToUint",
                     value);
    else if (shared_typed(e, m))
        em_spmd_line(e, "%s = %s(%s);", E, storage_type[s], value);
    else if (x->space != EM_MEM_GLOBAL)
        em_spmd_line(e, "%s = %s;", E, value);
    else if (s == EM_BOOL)
        em_spmd_line(e, "%s = uint8_t((%s) ? 1u : 0u);", E, value);
    else if (s == EM_BF16)
        em_spmd_line(e, "%s = uint16_t(em_f2b(%s));", E, value);
    else if (em_spmd_narrow(s) || s == EM_F16)
        em_spmd_line(e, "%s = %s(%s);", E, storage_type[s], value);
    else
        em_spmd_line(e, "%s = %s;", E, value);
    em_sb_free(&el);
}

static bool gl_mem_load_line(em_spmd *e, em_ir_mem m, const char *index, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    if (x->space == EM_MEM_GLOBAL && !vec_storage(x->elem)) return false;
    em_sb_printf(sb, x->space == EM_MEM_GLOBAL ? "%s.d[%s]" : "%s[%s]", e->mname[m], index);
    return true;
}

static bool gl_mem_store_line(em_spmd *e, em_ir_mem m, const char *index, const char *value)
{
    const em_ir_memory *x = mem(e, m);
    if (x->space == EM_MEM_GLOBAL && !vec_storage(x->elem)) return false;
    em_spmd_line(e, x->space == EM_MEM_GLOBAL ? "%s.d[%s] = %s;" : "%s[%s] = %s;", e->mname[m],
                 index, value);
    return true;
}

/* ---- synchronization, planes, atomics ------------------------------------------------------- */

static void gl_sync(em_spmd *e, const em_ir_inst *in)
{
    if (in->op == EM_OP_SYNC_CUBE) {
        em_spmd_line(e, "memoryBarrierShared();");
        em_spmd_line(e, "barrier();");
    } else if (in->op == EM_OP_SYNC_PLANE) {
        e->needs |= EM_NEED_PLANE;
        em_spmd_line(e, "subgroupBarrier();");
    } else {
        em_spmd_line(e, in->imm ? "memoryBarrier();" : "groupMemoryBarrier();");
    }
}

static void gl_plane(em_spmd *e, const em_ir_inst *in, em_scalar s, const char *a, const char *b,
                     em_strbuf *sb)
{
    glsl_state *st = e->priv;
    e->needs |= EM_NEED_PLANE;
    if (em_spmd_bits(s) == 64 && s != EM_F64) st->plane64 = true;
    static const char *const arith[] = {"subgroupAdd",          "subgroupMul",
                                        "subgroupMin",          "subgroupMax",
                                        "subgroupInclusiveAdd", "subgroupExclusiveAdd"};
    em_ir_op op = (em_ir_op)in->op;
    const em_ir_value *bv = em_spmd_value(e, in->args[1]);
    switch (op) {
    case EM_OP_PLANE_SUM:
    case EM_OP_PLANE_PROD:
    case EM_OP_PLANE_MIN:
    case EM_OP_PLANE_MAX:
    case EM_OP_PLANE_INCLUSIVE_SUM:
    case EM_OP_PLANE_EXCLUSIVE_SUM:
        e->needs |= EM_NEED_PLANE_ARITH;
        em_sb_printf(sb, "%s(%s)", arith[op - EM_OP_PLANE_SUM], a);
        break;
    case EM_OP_PLANE_ALL:
    case EM_OP_PLANE_ANY:
        e->needs |= EM_NEED_PLANE_VOTE;
        em_sb_printf(sb, "%s(%s)", op == EM_OP_PLANE_ALL ? "subgroupAll" : "subgroupAny", a);
        break;
    case EM_OP_PLANE_BALLOT:
        e->needs |= EM_NEED_PLANE_BALLOT;
        em_sb_printf(sb, "subgroupBallot(%s).x", a);
        break;
    case EM_OP_PLANE_BROADCAST:
    case EM_OP_PLANE_SHUFFLE:
        if (op == EM_OP_PLANE_BROADCAST && bv &&
            bv->kind == EM_VAL_CONST) { /* subgroupBroadcast needs a constant */
            e->needs |= EM_NEED_PLANE_BALLOT;
            em_sb_printf(sb, "subgroupBroadcast(%s, %uu)", a, (unsigned)bv->c.u);
        } else {
            e->needs |= EM_NEED_SHUFFLE;
            em_sb_printf(sb, "subgroupShuffle(%s, uint(%s))", a, b);
        }
        break;
    case EM_OP_PLANE_SHUFFLE_XOR:
        e->needs |= EM_NEED_SHUFFLE;
        em_sb_printf(sb, "subgroupShuffleXor(%s, uint(%s))", a, b);
        break;
    case EM_OP_PLANE_SHUFFLE_UP:
    case EM_OP_PLANE_SHUFFLE_DOWN: {
        /* the shuffle runs on every lane; out-of-range lanes keep their own value */
        bool up = op == EM_OP_PLANE_SHUFFLE_UP;
        e->needs |= EM_NEED_SHUFFLE_REL;
        char tmp[32];
        em_spmd_fresh(e, "sh", tmp);
        em_spmd_line(e, "%s %s = subgroupShuffle%s(%s, uint(%s));", e->d->ctype[s], tmp,
                     up ? "Up" : "Down", a, b);
        em_sb_printf(sb,
                     up ? "(gl_SubgroupInvocationID >= uint(%s) ? %s : %s)"
                        : "(gl_SubgroupInvocationID + uint(%s) < gl_SubgroupSize ? %s : %s)",
                     b, tmp, a);
        break;
    }
    default:
        em_spmd_fail(e, "unknown plane op");
        break;
    }
}

/* Float atomics work on bits: buffers through their uint view (NAME_u), shared arrays hold bits. */
static void float_atomic(em_spmd *e, const em_ir_inst *in, const char *index, const char *v,
                         em_strbuf *sb)
{
    const em_ir_memory *m = mem(e, in->mem);
    bool f64 = m->elem.scalar == EM_F64, global = m->space == EM_MEM_GLOBAL;
    const char *bt = f64 ? "uint64_t" : "uint",
               *to = f64 ? "doubleBitsToUint64" : "floatBitsToUint",
               *from = f64 ? "uint64BitsToDouble" : "uintBitsToFloat";
    em_strbuf a;
    em_sb_init(&a);
    em_sb_printf(&a, global ? "%s_u.d[%s]" : "%s[%s]", e->mname[in->mem], index);
    if (f64) e->needs |= EM_NEED_ATOMIC64 | EM_NEED_INT64;
    em_ir_op op = (em_ir_op)in->op;
    if (op == EM_OP_ATOMIC_LOAD) {
        gl_mem_load(e, in->mem, index, -1, sb);
    } else if (op == EM_OP_ATOMIC_XCHG || op == EM_OP_ATOMIC_STORE) {
        em_sb_printf(sb,
                     op == EM_OP_ATOMIC_XCHG ? "%s(atomicExchange(%s, %s(%s)))"
                                             : "%satomicExchange(%s, %s(%s))",
                     op == EM_OP_ATOMIC_XCHG ? from : "", a.data, to, v);
    } else if (!f64 && global && e->caps.float_atomic_add) {
        e->needs |= EM_NEED_ATOMIC_FLOAT;
        em_sb_printf(sb, "atomicAdd(%s.d[%s], %s(%s))", e->mname[in->mem], index,
                     op == EM_OP_ATOMIC_SUB ? "-" : "", v);
    } else { /* add / sub: compare-exchange until no other unit got in between */
        char old[32], seen[32];
        em_spmd_fresh(e, "old", old);
        em_spmd_fresh(e, "seen", seen);
        em_spmd_line(e, "%s %s = %s;", bt, old, a.data);
        em_spmd_line(e, "for (;;) {");
        e->depth++;
        em_spmd_line(e, "%s %s = atomicCompSwap(%s, %s, %s(%s(%s) %s (%s)));", bt, seen, a.data,
                     old, to, from, old, op == EM_OP_ATOMIC_SUB ? "-" : "+", v);
        em_spmd_line(e, "if (%s == %s) break;", seen, old);
        em_spmd_line(e, "%s = %s;", old, seen);
        e->depth--;
        em_spmd_line(e, "}");
        em_sb_printf(sb, "%s(%s)", from, old);
    }
    em_sb_free(&a);
}

static void gl_atomic(em_spmd *e, const em_ir_inst *in, const char *index, em_strbuf *sb)
{
    const em_ir_memory *m = mem(e, in->mem);
    em_scalar s = (em_scalar)m->elem.scalar;
    em_strbuf v, c, E;
    em_sb_init(&v);
    em_sb_init(&c);
    em_sb_init(&E);
    if (in->args[1]) em_spmd_val(e, in->args[1], &v);
    if (in->args[2]) em_spmd_val(e, in->args[2], &c);
    elem_ref(e, in->mem, index, -1, &E);
    static const char *const fns[] = {"atomicAdd", "atomicAdd", "atomicMin", "atomicMax",
                                      "atomicAnd", "atomicOr",  "atomicXor", "atomicExchange"};
    em_ir_op op = (em_ir_op)in->op;
    if (em_spmd_bits(s) == 64 && !em_scalar_is_float(s)) e->needs |= EM_NEED_ATOMIC64;
    if (em_scalar_is_float(s))
        float_atomic(e, in, index, v.data, sb);
    else if (op == EM_OP_ATOMIC_LOAD)
        em_sb_append(sb, E.data);
    else if (op == EM_OP_ATOMIC_STORE)
        em_sb_printf(sb, "atomicExchange(%s, %s)", E.data, v.data);
    else if (op == EM_OP_ATOMIC_CAS)
        em_sb_printf(sb, "atomicCompSwap(%s, %s, %s)", E.data, v.data, c.data);
    else if (op >= EM_OP_ATOMIC_ADD && op <= EM_OP_ATOMIC_XCHG)
        em_sb_printf(sb, op == EM_OP_ATOMIC_SUB ? "%s(%s, -(%s))" : "%s(%s, %s)",
                     fns[op - EM_OP_ATOMIC_ADD], E.data, v.data);
    else
        em_spmd_fail(e, "unknown atomic op");
    em_sb_free(&v);
    em_sb_free(&c);
    em_sb_free(&E);
}

/* ---- matrix ops: cooperative matrices --------------------------------------------------------
 *
 * Where caps.matrix holds, a fragment is a cooperative matrix of the sub-group.
 * GL_KHR_cooperative_matrix:
 *     coopmat<T, gl_ScopeSubgroup, ROWS, COLS, gl_MatrixUseA / gl_MatrixUseB /
 *     gl_MatrixUseAccumulator>, coopMatLoad / coopMatStore (gl_CooperativeMatrixLayoutRowMajor
 *     or ...ColumnMajor), coopMatMulAdd.
 * GL_NV_cooperative_matrix (caps.matrix_api "VK_NV_cooperative_matrix"):
 *     fcoopmatNV<BITS, gl_ScopeSubgroup, ROWS, COLS> (icoopmatNV / ucoopmatNV for integers),
 *     coopMatLoadNV / coopMatStoreNV (a column-major flag), coopMatMulAddNV.
 * Both need GL_KHR_memory_scope_semantics (glslang then writes the Vulkan memory model: the
 * device needs vulkanMemoryModel). Memory must hold the fragment's own element type, one scalar
 * per element (coopMatLoad reads the array's element type): f16 buffers are float16_t arrays, and
 * shared arrays that matrix ops use are declared in their storage type (shared_typed). Offsets
 * and strides count elements. When the caps list the device's combinations (matrix_shapes), a
 * fragment and an mma must match one of them. */

/* Notes that a value of kind s appears as its own GLSL type (extensions for the header). */
static void note_value_type(em_spmd *e, em_scalar s)
{
    glsl_state *st = e->priv;
    if (s == EM_F16) st->f16 = true;
    if (s == EM_I8 || s == EM_U8) st->i8 = true;
    if (s == EM_I16 || s == EM_U16) st->i16 = true;
    if (s == EM_I64 || s == EM_U64) e->needs |= EM_NEED_INT64;
}

static const char *coop_elem(em_scalar s)
{
    switch (s) {
    case EM_F16:
        return "float16_t";
    case EM_F32:
        return "float";
    case EM_F64:
        return "double";
    case EM_I8:
        return "int8_t";
    case EM_U8:
        return "uint8_t";
    case EM_I16:
        return "int16_t";
    case EM_U16:
        return "uint16_t";
    case EM_I32:
        return "int";
    case EM_U32:
        return "uint";
    case EM_I64:
        return "int64_t";
    case EM_U64:
        return "uint64_t";
    default:
        return NULL; /* bool, bf16 */
    }
}

static void frag_shape(const em_ir_value *f, unsigned *rows, unsigned *cols)
{
    *rows = f->mat_role == EM_MAT_B ? f->mat_k : f->mat_m;
    *cols = f->mat_role == EM_MAT_A ? f->mat_k : f->mat_n;
}

/* The GLSL type of fragment f. */
static const char *coop_type(em_spmd *e, const em_ir_value *f)
{
    const glsl_state *st = e->priv;
    em_scalar s = (em_scalar)f->type.scalar;
    unsigned r, c;
    frag_shape(f, &r, &c);
    if (st->nv) {
        const char *kind = em_scalar_is_float(s) ? "f" : em_scalar_is_signed(s) ? "i" : "u";
        return em_spmd_str(e, "%scoopmatNV<%u, gl_ScopeSubgroup, %u, %u>", kind, em_spmd_bits(s), r,
                           c);
    }
    static const char *const use[] = {"gl_MatrixUseA", "gl_MatrixUseB", "gl_MatrixUseAccumulator"};
    return em_spmd_str(e, "coopmat<%s, gl_ScopeSubgroup, %u, %u, %s>", coop_elem(s), r, c,
                       use[f->mat_role <= EM_MAT_ACC ? f->mat_role : EM_MAT_ACC]);
}

/* True when the caps list no combinations (then any is tried) or one fits f's role and shape. */
static bool shape_listed(const em_caps *c, const em_ir_value *f)
{
    if (!c->matrix_shape_count) return true;
    for (uint32_t i = 0; i < c->matrix_shape_count && i < EM_CAPS_MATRIX_SHAPES; i++) {
        const em_matrix_shape *x = &c->matrix_shapes[i];
        if (x->m != f->mat_m || x->n != f->mat_n || x->k != f->mat_k) continue;
        unsigned t = f->type.scalar;
        if (f->mat_role == EM_MAT_A   ? x->a == t
            : f->mat_role == EM_MAT_B ? x->b == t
                                      : (x->c == t || x->d == t))
            return true;
    }
    return false;
}

/* The device's combinations as text ("f16 x f16 + f32 -> f32 16x16x16, ..."), for messages. */
static const char *shape_list(em_spmd *e)
{
    em_strbuf sb;
    em_sb_init(&sb);
    for (uint32_t i = 0; i < e->caps.matrix_shape_count && i < EM_CAPS_MATRIX_SHAPES; i++) {
        const em_matrix_shape *x = &e->caps.matrix_shapes[i];
        em_sb_printf(&sb, "%s%s x %s + %s -> %s %ux%ux%u", i ? ", " : "",
                     em_scalar_name((em_scalar)x->a), em_scalar_name((em_scalar)x->b),
                     em_scalar_name((em_scalar)x->c), em_scalar_name((em_scalar)x->d), x->m, x->n,
                     x->k);
    }
    const char *out = em_spmd_str(e, "%s", sb.data ? sb.data : "");
    em_sb_free(&sb);
    return out;
}

static void gl_fragment(em_spmd *e, em_ir_val v)
{
    const glsl_state *st = e->priv;
    const em_ir_value *f = em_spmd_value(e, v);
    em_scalar s = (em_scalar)f->type.scalar;
    const char *api = e->caps.matrix_api[0] ? e->caps.matrix_api : "VK_KHR_cooperative_matrix";
    if (!st->coopmat) {
        em_spmd_fail(e,
                     "matrix fragment %s: this Vulkan device has no cooperative matrices "
                     "(VK_KHR_cooperative_matrix / VK_NV_cooperative_matrix absent: caps.matrix), "
                     "and matrix ops lower to loops only where PLANE_DIM is 1 (here %u)",
                     e->vname[v], e->caps.plane_dim);
        return;
    }
    if (!coop_elem(s) || (st->nv && s == EM_F64)) {
        em_spmd_fail(e, "matrix fragment %s: %s has no cooperative-matrix type in %s", e->vname[v],
                     em_scalar_name(s), api);
        return;
    }
    if (!shape_listed(&e->caps, f)) {
        em_spmd_fail(e,
                     "matrix fragment %s (%s %ux%ux%u, %s): the device's %s lists no such "
                     "combination (it runs: %s)",
                     e->vname[v], em_scalar_name(s), f->mat_m, f->mat_n, f->mat_k,
                     f->mat_role == EM_MAT_A   ? "A"
                     : f->mat_role == EM_MAT_B ? "B"
                                               : "accumulator",
                     api, shape_list(e));
        return;
    }
    e->needs |= EM_NEED_MATRIX;
    note_value_type(e, s);
    if (!em_scalar_is_float(s)) ((glsl_state *)e->priv)->coop_int = true;
    em_spmd_line(e, "%s %s;", coop_type(e, f), e->vname[v]);
}

/* Memory that a matrix load / store may use with fragment f, or why not. */
static const char *matrix_mem_problem(em_spmd *e, em_ir_mem m, const em_ir_value *f)
{
    const em_ir_memory *x = mem(e, m);
    if (x->space == EM_MEM_LOCAL) return "cooperative matrices load from buffers or shared memory";
    if (x->elem.lanes != 1) return "matrix memory must hold scalars (not lines)";
    if (x->elem.scalar != f->type.scalar)
        return em_spmd_str(e, "the memory holds %s and the fragment %s (they must be one kind)",
                           em_scalar_name((em_scalar)x->elem.scalar),
                           em_scalar_name((em_scalar)f->type.scalar));
    if (x->space == EM_MEM_SHARED && shared_bits(e, m))
        return "shared memory that float atomics modify cannot hold matrices";
    return NULL;
}

static void gl_matrix(em_spmd *e, const em_ir_inst *in)
{
    const glsl_state *st = e->priv;
    if (!st->coopmat) { /* the fragment's declaration has failed already */
        em_spmd_fail(e, "matrix ops need cooperative matrices (caps.matrix)");
        return;
    }
    em_strbuf a, b;
    em_sb_init(&a);
    em_sb_init(&b);
    if (in->op == EM_OP_MAT_FILL) {
        const em_ir_value *f = em_spmd_value(e, in->args[0]);
        em_spmd_val(e, in->args[1], &a);
        em_spmd_line(e, "%s = %s(%s(%s));", e->vname[in->args[0]], coop_type(e, f),
                     coop_elem((em_scalar)f->type.scalar), a.data);
    } else if (in->op == EM_OP_MAT_MMA) {
        const em_ir_value *d = em_spmd_value(e, in->args[0]), *av = em_spmd_value(e, in->args[1]),
                          *bv = em_spmd_value(e, in->args[2]), *cv = em_spmd_value(e, in->args[3]);
        bool listed = !e->caps.matrix_shape_count;
        for (uint32_t i = 0; i < e->caps.matrix_shape_count && i < EM_CAPS_MATRIX_SHAPES; i++) {
            const em_matrix_shape *x = &e->caps.matrix_shapes[i];
            listed |= x->m == d->mat_m && x->n == d->mat_n && x->k == d->mat_k &&
                      x->a == av->type.scalar && x->b == bv->type.scalar &&
                      x->c == cv->type.scalar && x->d == d->type.scalar;
        }
        if (!listed)
            em_spmd_fail(e,
                         "no cooperative-matrix mma %s x %s + %s -> %s %ux%ux%u here (it runs: %s)",
                         em_scalar_name((em_scalar)av->type.scalar),
                         em_scalar_name((em_scalar)bv->type.scalar),
                         em_scalar_name((em_scalar)cv->type.scalar),
                         em_scalar_name((em_scalar)d->type.scalar), d->mat_m, d->mat_n, d->mat_k,
                         shape_list(e));
        else if (cv->type.scalar != d->type.scalar)
            em_spmd_fail(e, "cooperative-matrix mma needs C and D of one kind (%s, %s)",
                         em_scalar_name((em_scalar)cv->type.scalar),
                         em_scalar_name((em_scalar)d->type.scalar));
        else
            em_spmd_line(e, "%s = coopMatMulAdd%s(%s, %s, %s);", e->vname[in->args[0]],
                         st->nv ? "NV" : "", e->vname[in->args[1]], e->vname[in->args[2]],
                         e->vname[in->args[3]]);
    } else {
        bool load = in->op == EM_OP_MAT_LOAD;
        em_ir_val fv = in->args[load ? 0 : 2];
        const em_ir_value *f = em_spmd_value(e, fv);
        const char *why = matrix_mem_problem(e, in->mem, f);
        em_spmd_val_u32(e, in->args[load ? 1 : 0], &a);
        em_spmd_val_u32(e, in->args[load ? 2 : 1], &b);
        const em_ir_memory *x = mem(e, in->mem);
        const char *arr = x->space == EM_MEM_GLOBAL ? em_spmd_str(e, "%s.d", e->mname[in->mem])
                                                    : e->mname[in->mem];
        bool col = in->imm == EM_COL_MAJOR;
        const char *layout = st->nv ? (col ? "true" : "false")
                             : col  ? "gl_CooperativeMatrixLayoutColumnMajor"
                                    : "gl_CooperativeMatrixLayoutRowMajor";
        if (why)
            em_spmd_fail(e, "matrix %s of %s: %s", load ? "load" : "store", e->vname[fv], why);
        else if (load)
            em_spmd_line(e, "coopMatLoad%s(%s, %s, %s, %s, %s);", st->nv ? "NV" : "", e->vname[fv],
                         arr, a.data, b.data, layout);
        else
            em_spmd_line(e, "coopMatStore%s(%s, %s, %s, %s, %s);", st->nv ? "NV" : "", e->vname[fv],
                         arr, a.data, b.data, layout);
    }
    em_sb_free(&a);
    em_sb_free(&b);
}

/* ---- kernels ------------------------------------------------------------------------------------
 */

static void storage_elem(em_spmd *e, em_type t, em_strbuf *sb)
{
    if (vec_storage(t))
        em_sb_printf(sb, "%svec%u", vec_prefix[t.scalar], t.lanes);
    else
        em_sb_append(sb, storage_type[t.scalar]);
    unsigned w = em_spmd_bits((em_scalar)t.scalar);
    if (w == 8) e->needs |= EM_NEED_STORAGE8;
    if (w == 16) e->needs |= EM_NEED_STORAGE16;
}

static const char *push_type(em_scalar s)
{
    switch (s) {
    case EM_BOOL:
    case EM_U8:
    case EM_U16:
    case EM_U32:
        return "uint";
    case EM_I8:
    case EM_I16:
    case EM_I32:
        return "int";
    case EM_I64:
        return "int64_t";
    case EM_U64:
        return "uint64_t";
    case EM_F64:
        return "double";
    default:
        return "float";
    }
}

static void declare_interface(em_spmd *e)
{
    const em_ir_kernel *k = e->k;
    size_t np = em_ir_param_count(k), nscalars = 0;
    for (size_t i = 0; i < np; i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind != EM_PARAM_BUFFER) {
            nscalars++;
            continue;
        }
        const em_ir_memory *m = em_ir_mem_at(k, p->id);
        em_strbuf t;
        em_sb_init(&t);
        storage_elem(e, m->elem, &t);
        em_spmd_line(e, "layout(std430, set = 0, binding = %zu) %sbuffer em_b%zu { %s d[]; } %s;",
                     i, m->access == EM_READ ? "readonly " : "", i, t.data, e->mname[p->id]);
        if (e->mflags[p->id] & EM_MEMF_FLOAT_RMW)
            em_spmd_line(
                e, "layout(std430, set = 0, binding = %zu) buffer em_b%zu_bits { %s d[]; } %s_u;",
                i, i, m->elem.scalar == EM_F64 ? "uint64_t" : "uint", e->mname[p->id]);
        em_sb_free(&t);
    }
    em_spmd_line(e,
                 "layout(std430, set = 0, binding = %zu) readonly buffer em_meta_block { uint m[]; "
                 "} em_meta;",
                 np);
    if (nscalars) {
        em_spmd_line(e, "layout(push_constant) uniform em_push_block {");
        size_t slot = 0;
        for (size_t i = 0; i < np; i++) {
            const em_ir_param *p = em_ir_param_at(k, i);
            if (p->kind == EM_PARAM_BUFFER) continue;
            em_scalar s = (em_scalar)em_spmd_value(e, p->id)->type.scalar;
            em_spmd_line(e, "    layout(offset = %zu) %s %s;", 8 * slot++, push_type(s),
                         e->vname[p->id]);
        }
        em_spmd_line(e, "} em_pc;");
    }
    for (size_t m = 1; m <= em_ir_mem_count(k); m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        if (x->space != EM_MEM_SHARED || !(e->mflags[m] & EM_MEMF_USED)) continue;
        em_strbuf d, name;
        em_sb_init(&d);
        em_sb_init(&name);
        em_sb_printf(&name, "%s[%u]", e->mname[m], x->length);
        if (shared_bits(e, (em_ir_mem)m))
            em_sb_printf(&d, "%s %s", x->elem.scalar == EM_F64 ? "uint64_t" : "uint", name.data);
        else if (shared_typed(e, (em_ir_mem)m))
            em_sb_printf(&d, "%s %s", storage_type[x->elem.scalar], name.data);
        else
            gl_decl(e, x->elem, name.data, &d);
        if (shared_typed(e, (em_ir_mem)m)) note_value_type(e, (em_scalar)x->elem.scalar);
        em_spmd_line(e, "shared %s;", d.data);
        em_sb_free(&d);
        em_sb_free(&name);
    }
}

static void gl_open(em_spmd *e)
{
    const em_ir_kernel *k = e->k;
    e->depth = 0;
    declare_interface(e);
    em_sb_append(e->sb, "\nvoid main()\n{\n");
    e->depth = 1;
    for (size_t i = 0; i < em_ir_param_count(k); i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind == EM_PARAM_BUFFER) continue;
        const em_ir_value *v = em_spmd_value(e, p->id);
        em_strbuf d;
        em_sb_init(&d);
        gl_decl(e, v->type, e->vname[p->id], &d);
        if (v->type.scalar == EM_BOOL)
            em_spmd_line(e, "%s = em_pc.%s != 0u;", d.data, e->vname[p->id]);
        else
            em_spmd_line(e, "%s = em_pc.%s;", d.data, e->vname[p->id]);
        em_sb_free(&d);
    }
    for (size_t m = 1; m <= em_ir_mem_count(k); m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        if (x->space != EM_MEM_LOCAL || !(e->mflags[m] & EM_MEMF_USED)) continue;
        em_strbuf d, name;
        em_sb_init(&d);
        em_sb_init(&name);
        em_sb_printf(&name, "%s[%u]", e->mname[m], x->length);
        gl_decl(e, x->elem, name.data, &d);
        em_spmd_line(e, "%s;", d.data);
        em_sb_free(&d);
        em_sb_free(&name);
    }
}

static const em_spmd_dialect glsl_dialect = {
    .name = "GLSL",
    .ns = "glsl",
    .ctype = {[EM_BOOL] = "bool",
              [EM_I8] = "int",
              [EM_I16] = "int",
              [EM_I32] = "int",
              [EM_I64] = "int64_t",
              [EM_U8] = "uint",
              [EM_U16] = "uint",
              [EM_U32] = "uint",
              [EM_U64] = "uint64_t",
              [EM_F16] = "float",
              [EM_BF16] = "float",
              [EM_F32] = "float",
              [EM_F64] = "double"},
    .fn_prefix = "",
    .vector_math = true,
    .unroll = "[[unroll]]",
    .index32 = true,
    .rem_via_div = true,
    .float_rem_expr = true,
    .decl = gl_decl,
    .lane = gl_lane,
    .line_kind = gl_line_kind,
    .dtype_missing = gl_dtype_missing,
    .literal = gl_literal,
    .zero = gl_zero,
    .convert = gl_convert,
    .wrap = gl_wrap,
    .float_fn = gl_float_fn,
    .bit_count = gl_bit_count,
    .to_bits = gl_to_bits,
    .from_bits = gl_from_bits,
    .builtin = gl_builtin,
    .meta = gl_meta,
    .mem_load = gl_mem_load,
    .mem_store = gl_mem_store,
    .mem_load_line = gl_mem_load_line,
    .mem_store_line = gl_mem_store_line,
    .sync = gl_sync,
    .plane = gl_plane,
    .atomic = gl_atomic,
    .open = gl_open,
};

/* ---- each shader's header -----------------------------------------------------------------------
 */

static const char helper_f16[] =
    "/* f16: computed as float, rounded after every operation */\n"
    "float em_rh(float x) { return unpackHalf2x16(packHalf2x16(vec2(x, 0.0))).x; }\n";

static const char helper_bf16[] =
    "/* bf16: bfloat16 bits in memory, float in registers, rounded (to nearest even) after every "
    "operation */\n"
    "uint em_f2b(float x)\n"
    "{\n"
    "    uint u = floatBitsToUint(x);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;\n"
    "    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n"
    "}\n"
    "float em_b2f(uint b) { return uintBitsToFloat(b << 16); }\n"
    "float em_rb(float x) { return em_b2f(em_f2b(x)); }\n";

static const char helper_erf[] =
    "/* erf: Taylor series near 0, Abramowitz-Stegun 7.1.26 beyond (|error| < 2e-7) */\n"
    "float em_erf(float x)\n"
    "{\n"
    "    float a = abs(x);\n"
    "    if (a < 0.5) {\n"
    "        float x2 = x * x;\n"
    "        return 1.1283791671 * x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 + "
    "x2 * (1.0 / 216.0 - x2 / 1320.0)))));\n"
    "    }\n"
    "    float t = 1.0 / (1.0 + 0.3275911 * a);\n"
    "    float p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t "
    "* 1.061405429))));\n"
    "    return sign(x) * (1.0 - p * exp(-a * a));\n"
    "}\n";

static const char helper_bits64[] =
    "uint em_popcount64(uint64_t x) { uvec2 v = unpackUint2x32(x); return uint(bitCount(v.x) + "
    "bitCount(v.y)); }\n"
    "uint em_clz64(uint64_t x)\n"
    "{ uvec2 v = unpackUint2x32(x); return v.y != 0u ? uint(31 - findMSB(v.y)) : uint(63 - "
    "findMSB(v.x)); }\n"
    "uint em_ctz64(uint64_t x)\n"
    "{ uvec2 v = unpackUint2x32(x); return v.x != 0u ? uint(findLSB(v.x)) : v.y != 0u ? uint(32 + "
    "findLSB(v.y)) : 64u; }\n";

static void header(const em_ir_kernel *k, const em_caps *caps, uint32_t needs, const glsl_state *st,
                   em_strbuf *sb)
{
    em_sb_printf(sb, SEPARATOR "%s\n#version 450\n", em_ir_kernel_name(k));
    em_sb_append(sb, "/* ember: GLSL compute shader, generated by src/kernel/codegen/glsl.c (its "
                     "top comment gives the\n"
                     " * bindings, push constants and specialization constants). */\n");
    static const struct {
        uint32_t need;
        const char *ext;
    } exts[] = {
        {EM_NEED_INT64 | EM_NEED_BITS64, "GL_EXT_shader_explicit_arithmetic_types_int64"},
        {EM_NEED_STORAGE8, "GL_EXT_shader_8bit_storage"},
        {EM_NEED_STORAGE16, "GL_EXT_shader_16bit_storage"},
        {EM_NEED_PLANE, "GL_KHR_shader_subgroup_basic"},
        {EM_NEED_PLANE_ARITH, "GL_KHR_shader_subgroup_arithmetic"},
        {EM_NEED_PLANE_VOTE, "GL_KHR_shader_subgroup_vote"},
        {EM_NEED_PLANE_BALLOT, "GL_KHR_shader_subgroup_ballot"},
        {EM_NEED_SHUFFLE, "GL_KHR_shader_subgroup_shuffle"},
        {EM_NEED_SHUFFLE_REL, "GL_KHR_shader_subgroup_shuffle_relative"},
        {EM_NEED_ATOMIC64, "GL_EXT_shader_atomic_int64"},
        {EM_NEED_ATOMIC_FLOAT, "GL_EXT_shader_atomic_float"},
        {EM_NEED_UNROLL, "GL_EXT_control_flow_attributes"},
    };
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++)
        if (needs & exts[i].need) em_sb_printf(sb, "#extension %s : require\n", exts[i].ext);
    if (st->plane64)
        em_sb_append(sb, "#extension GL_EXT_shader_subgroup_extended_types_int64 : require\n");
    if (st->f16)
        em_sb_append(sb, "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n");
    if (st->i8)
        em_sb_append(sb, "#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require\n");
    if (st->i16)
        em_sb_append(sb, "#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require\n");
    if (needs & EM_NEED_MATRIX) {
        em_sb_append(sb, st->nv ? "#extension GL_NV_cooperative_matrix : require\n"
                                : "#extension GL_KHR_cooperative_matrix : require\n");
        if (st->nv && st->coop_int)
            em_sb_append(sb, "#extension GL_NV_integer_cooperative_matrix : require\n");
        em_sb_append(sb, "#extension GL_KHR_memory_scope_semantics : require\n");
    }
    uint32_t dim[3];
    em_ir_cube_dim(k, dim);
    /* Work groups are flat (1-D, X*Y*Z units) so that sub-groups are runs of consecutive unit
     * indices whatever the cube's shape (implementations may otherwise form sub-groups per x row);
     * the cube's axes are the spec constants em_dim_x/y/z (ids 3, 4, 5). */
    bool fixed = dim[0] && dim[1] && dim[2];
    if (fixed) em_sb_printf(sb, "layout(local_size_x = %u) in;\n", dim[0] * dim[1] * dim[2]);
    em_sb_append(sb, "layout(local_size_x_id = 0) in;\n");
    em_sb_printf(sb,
                 "layout(constant_id = 3) const uint em_dim_x = %uu;\n"
                 "layout(constant_id = 4) const uint em_dim_y = %uu;\n"
                 "layout(constant_id = 5) const uint em_dim_z = %uu;\n\n",
                 fixed ? dim[0] : 1, fixed ? dim[1] : 1, fixed ? dim[2] : 1);
    if (needs & EM_NEED_F16) em_sb_append(sb, helper_f16);
    if (needs & EM_NEED_BF16) em_sb_append(sb, helper_bf16);
    if (needs & EM_NEED_ERF) em_sb_append(sb, helper_erf);
    if (needs & EM_NEED_BITS64) em_sb_append(sb, helper_bits64);
    em_sb_append(sb, "/* positions */\n");
    em_spmd_position_helpers(&glsl_dialect, caps, NULL, "", sb);
    em_sb_append(sb, "\n");
}

char *em_codegen_glsl(const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    if (!em_spmd_check_batch(&glsl_dialect, ks, n)) return NULL;
    em_caps c = caps ? *caps : em_spmd_default_caps("glsl", 32);
    /* matrix ops: cooperative matrices where the device has them, loops where planes have one
     * unit, else an error naming what is missing (gl_fragment) */
    em_spmd_dialect coop = glsl_dialect;
    coop.fragment = gl_fragment;
    coop.matrix = gl_matrix;
    bool plane_one = !c.plane_ops || c.plane_dim <= 1;
    const em_spmd_dialect *dialect = c.matrix || !plane_one ? &coop : &glsl_dialect;
    em_strbuf out, body;
    em_sb_init(&out);
    em_sb_init(&body);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        glsl_state st = {0};
        st.coopmat = c.matrix;
        st.nv = c.matrix && !strcmp(c.matrix_api, "VK_NV_cooperative_matrix");
        uint32_t needs = 0;
        em_sb_clear(&body);
        ok = em_spmd_kernel(dialect, ks[i], &c, &st, &body, &needs);
        if (!ok) break;
        if (i) em_sb_append(&out, "\n");
        header(ks[i], &c, needs, &st, &out);
        em_sb_append(&out, body.data);
    }
    em_sb_free(&body);
    if (!ok) {
        em_sb_free(&out);
        return NULL;
    }
    char *text = em_sb_take(&out);
    if (!text) em_set_error(EM_ERR_NOMEM, "GLSL code generator: out of memory");
    return text;
}
