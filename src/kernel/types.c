/* types.c — names and sizes of the IR's scalar kinds, built-in positions and instructions: the
 * tables every other part of the kernel layer looks things up in. */
#include <float.h>
#include <string.h>

#include "kernel/ir_internal.h"

static const char *const scalar_names[EM_SCALAR_COUNT] = {
    "bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64",
};
static const uint8_t scalar_sizes[EM_SCALAR_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};

const char *em_scalar_name(em_scalar s)
{
    return (unsigned)s < EM_SCALAR_COUNT ? scalar_names[s] : NULL;
}

em_scalar em_scalar_parse(const char *name)
{
    for (unsigned i = 0; name && i < EM_SCALAR_COUNT; i++)
        if (strcmp(name, scalar_names[i]) == 0) return (em_scalar)i;
    return EM_SCALAR_COUNT;
}

size_t em_scalar_size(em_scalar s) { return (unsigned)s < EM_SCALAR_COUNT ? scalar_sizes[s] : 0; }
bool em_scalar_is_float(em_scalar s) { return s >= EM_F16 && s <= EM_F64; }
bool em_scalar_is_int(em_scalar s) { return s >= EM_I8 && s <= EM_U64; }
bool em_scalar_is_signed(em_scalar s) { return (s >= EM_I8 && s <= EM_I64) || em_scalar_is_float(s); }

double em_scalar_lowest(em_scalar s)
{
    switch (s) {
    case EM_F16: return -65504.0;
    case EM_BF16: return -3.3895313892515355e38; /* -FLT_MAX would round to -inf */
    case EM_F32: return -FLT_MAX;
    default: return -DBL_MAX;
    }
}

static const char *const builtin_names[EM_BUILTIN_COUNT] = {
    "ABSOLUTE_POS", "ABSOLUTE_POS_X", "ABSOLUTE_POS_Y", "ABSOLUTE_POS_Z", "UNIT_POS",
    "UNIT_POS_X",   "UNIT_POS_Y",     "UNIT_POS_Z",     "CUBE_POS",       "CUBE_POS_X",
    "CUBE_POS_Y",   "CUBE_POS_Z",     "CUBE_DIM",       "CUBE_DIM_X",     "CUBE_DIM_Y",
    "CUBE_DIM_Z",   "CUBE_COUNT",     "CUBE_COUNT_X",   "CUBE_COUNT_Y",   "CUBE_COUNT_Z",
    "PLANE_DIM",    "UNIT_POS_PLANE", "PLANE_POS",
};

const char *em_builtin_name(em_builtin b)
{
    return (unsigned)b < EM_BUILTIN_COUNT ? builtin_names[b] : NULL;
}

#define B(n) {n, EM_OPC_BINARY, 2, true, false}
#define C(n) {n, EM_OPC_COMPARE, 2, true, false}
#define U(n) {n, EM_OPC_UNARY, 1, true, false}
#define T(n) {n, EM_OPC_TERNARY, 3, true, false}
#define P(n, a) {n, EM_OPC_PLANE, a, true, false}
#define A(n, a) {n, EM_OPC_ATOMIC, a, true, true}

static const em_op_info op_table[EM_OP_COUNT] = {
    [EM_OP_ASSIGN] = {"assign", EM_OPC_ASSIGN, 1, true, false},
    [EM_OP_ADD] = B("add"),
    [EM_OP_SUB] = B("sub"),
    [EM_OP_MUL] = B("mul"),
    [EM_OP_DIV] = B("div"),
    [EM_OP_REM] = B("rem"),
    [EM_OP_MIN] = B("min"),
    [EM_OP_MAX] = B("max"),
    [EM_OP_POW] = B("pow"),
    [EM_OP_AND] = B("and"),
    [EM_OP_OR] = B("or"),
    [EM_OP_XOR] = B("xor"),
    [EM_OP_SHL] = B("shl"),
    [EM_OP_SHR] = B("shr"),
    [EM_OP_EQ] = C("eq"),
    [EM_OP_NE] = C("ne"),
    [EM_OP_LT] = C("lt"),
    [EM_OP_LE] = C("le"),
    [EM_OP_GT] = C("gt"),
    [EM_OP_GE] = C("ge"),
    [EM_OP_NEG] = U("neg"),
    [EM_OP_NOT] = U("not"),
    [EM_OP_ABS] = U("abs"),
    [EM_OP_EXP] = U("exp"),
    [EM_OP_EXP2] = U("exp2"),
    [EM_OP_LOG] = U("log"),
    [EM_OP_LOG2] = U("log2"),
    [EM_OP_SQRT] = U("sqrt"),
    [EM_OP_RSQRT] = U("rsqrt"),
    [EM_OP_ERF] = U("erf"),
    [EM_OP_TANH] = U("tanh"),
    [EM_OP_SIN] = U("sin"),
    [EM_OP_COS] = U("cos"),
    [EM_OP_FLOOR] = U("floor"),
    [EM_OP_CEIL] = U("ceil"),
    [EM_OP_ROUND] = U("round"),
    [EM_OP_ISNAN] = U("isnan"),
    [EM_OP_ISINF] = U("isinf"),
    [EM_OP_POPCOUNT] = U("popcount"),
    [EM_OP_CLZ] = U("clz"),
    [EM_OP_CTZ] = U("ctz"),
    [EM_OP_FMA] = T("fma"),
    [EM_OP_CLAMP] = T("clamp"),
    [EM_OP_SELECT] = T("select"),
    [EM_OP_CAST] = {"cast", EM_OPC_CONVERT, 1, true, false},
    [EM_OP_BITCAST] = {"bitcast", EM_OPC_CONVERT, 1, true, false},
    [EM_OP_EXTRACT] = {"extract", EM_OPC_LINE, 2, true, false},
    [EM_OP_INSERT] = {"insert", EM_OPC_LINE, 3, true, false},
    [EM_OP_LOAD] = {"load", EM_OPC_MEMORY, 1, true, false},
    [EM_OP_STORE] = {"store", EM_OPC_MEMORY, 2, false, true},
    [EM_OP_LEN] = {"len", EM_OPC_META, 0, true, false},
    [EM_OP_SHAPE] = {"shape", EM_OPC_META, 0, true, false},
    [EM_OP_STRIDE] = {"stride", EM_OPC_META, 0, true, false},
    [EM_OP_BUILTIN] = {"builtin", EM_OPC_BUILTIN, 0, true, false},
    [EM_OP_SYNC_CUBE] = {"sync_cube", EM_OPC_SYNC, 0, false, true},
    [EM_OP_SYNC_PLANE] = {"sync_plane", EM_OPC_SYNC, 0, false, true},
    [EM_OP_FENCE] = {"fence", EM_OPC_SYNC, 0, false, true},
    [EM_OP_PLANE_SUM] = P("plane_sum", 1),
    [EM_OP_PLANE_PROD] = P("plane_prod", 1),
    [EM_OP_PLANE_MIN] = P("plane_min", 1),
    [EM_OP_PLANE_MAX] = P("plane_max", 1),
    [EM_OP_PLANE_INCLUSIVE_SUM] = P("plane_inclusive_sum", 1),
    [EM_OP_PLANE_EXCLUSIVE_SUM] = P("plane_exclusive_sum", 1),
    [EM_OP_PLANE_ALL] = P("plane_all", 1),
    [EM_OP_PLANE_ANY] = P("plane_any", 1),
    [EM_OP_PLANE_BALLOT] = P("plane_ballot", 1),
    [EM_OP_PLANE_BROADCAST] = P("plane_broadcast", 2),
    [EM_OP_PLANE_SHUFFLE] = P("plane_shuffle", 2),
    [EM_OP_PLANE_SHUFFLE_XOR] = P("plane_shuffle_xor", 2),
    [EM_OP_PLANE_SHUFFLE_UP] = P("plane_shuffle_up", 2),
    [EM_OP_PLANE_SHUFFLE_DOWN] = P("plane_shuffle_down", 2),
    [EM_OP_ATOMIC_ADD] = A("atomic_add", 2),
    [EM_OP_ATOMIC_SUB] = A("atomic_sub", 2),
    [EM_OP_ATOMIC_MIN] = A("atomic_min", 2),
    [EM_OP_ATOMIC_MAX] = A("atomic_max", 2),
    [EM_OP_ATOMIC_AND] = A("atomic_and", 2),
    [EM_OP_ATOMIC_OR] = A("atomic_or", 2),
    [EM_OP_ATOMIC_XOR] = A("atomic_xor", 2),
    [EM_OP_ATOMIC_XCHG] = A("atomic_xchg", 2),
    [EM_OP_ATOMIC_CAS] = A("atomic_cas", 3),
    [EM_OP_ATOMIC_LOAD] = A("atomic_load", 1),
    [EM_OP_ATOMIC_STORE] = {"atomic_store", EM_OPC_ATOMIC, 2, false, true},
    [EM_OP_MAT_FILL] = {"mat_fill", EM_OPC_MATRIX, 2, false, true},
    [EM_OP_MAT_LOAD] = {"mat_load", EM_OPC_MATRIX, 3, false, true},
    [EM_OP_MAT_MMA] = {"mat_mma", EM_OPC_MATRIX, 4, false, true},
    [EM_OP_MAT_STORE] = {"mat_store", EM_OPC_MATRIX, 3, false, true},
    [EM_OP_COPY_ASYNC] = {"copy_async", EM_OPC_MEMORY, 4, false, true},
    [EM_OP_COPY_COMMIT] = {"copy_commit", EM_OPC_SYNC, 0, false, true},
    [EM_OP_COPY_WAIT] = {"copy_wait", EM_OPC_SYNC, 0, false, true},
    [EM_OP_IF] = {"if", EM_OPC_CONTROL, 1, false, true},
    [EM_OP_RANGE] = {"range", EM_OPC_CONTROL, 4, false, true},
    [EM_OP_LOOP] = {"loop", EM_OPC_CONTROL, 0, false, true},
    [EM_OP_BREAK] = {"break", EM_OPC_CONTROL, 0, false, true},
    [EM_OP_CONTINUE] = {"continue", EM_OPC_CONTROL, 0, false, true},
    [EM_OP_RETURN] = {"return", EM_OPC_CONTROL, 0, false, true},
    [EM_OP_PRINT] = {"print", EM_OPC_DEBUG, 4, false, true},
    [EM_OP_INTRINSIC] = {"intrinsic", EM_OPC_DEBUG, 4, false, true},
};

const em_op_info *em_ir_op_info(unsigned op) { return op < EM_OP_COUNT ? &op_table[op] : NULL; }
const char *em_ir_op_name(em_ir_op op) { return (unsigned)op < EM_OP_COUNT ? op_table[op].name : "?"; }
