/* cuda.c — the CUDA target: CUDA C++ for NVRTC, written by the shared SPMD emitter (spmd.c) with
 * the dialect below. The source needs no host headers (NVRTC has no libc): f16/bf16 travel as
 * 16-bit patterns converted with PTX cvt / bit arithmetic; only kernels with matrix ops include
 * <mma.h> (WMMA), which needs the CUDA include directory on NVRTC's path.
 *
 * ---- parameter ABI (the CUDA driver follows it) ----------------------------------------------
 * Every kernel NAME of a batch becomes
 *     extern "C" __global__ void NAME(P0, P1, ..., const unsigned long long *em_meta)
 * with one Pi per IR parameter, in order:
 *   - buffer of scalar kind s: a device pointer to element 0 (already offset), `const T *` for
 *     read-only buffers, else `T *`, T the storage type: bool and u8 unsigned char (bool 0/1),
 *     i8 signed char, i16 short, u16 unsigned short, i32 int, u32 unsigned, i64 long long,
 *     u64 unsigned long long, f16 and bf16 unsigned short (IEEE binary16 / bfloat16 bits),
 *     f32 float, f64 double. A line buffer of N lanes is `emv<T, N> *` (N consecutive scalars
 *     per element); the pointer must be aligned to min(16, N * sizeof(T)) bytes when N is a
 *     power of two, else to sizeof(T).
 *   - scalar of kind s: by value, as bool unsigned char (0/1), i8 signed char, i16 short,
 *     i32 int, i64 long long, u8 unsigned char, u16 unsigned short, u32 unsigned,
 *     u64 unsigned long long, f16 / bf16 float (the value as a 32-bit float), f32 float,
 *     f64 double. (kernelParams[i] points at a value of that C type.)
 *   - last, always: em_meta, a device pointer to unsigned 64-bit words: for each buffer
 *     parameter in order, len (elements, i.e. lines for line buffers), shape[0..rank),
 *     stride[0..rank) (in scalars): 1 + 2*rank words per buffer. A kernel without buffers still
 *     takes it (pass any valid pointer, e.g. a one-word buffer).
 * Launch: blockDim = the cube's units per axis, gridDim = the cube count per axis; PLANE_DIM is
 * the warp (32). Shared memory is static (__shared__ arrays) unless the kernel's shared arrays
 * exceed 48 KiB in total; then they live in dynamic shared memory: launch with
 * em_codegen_cuda_dynamic_smem(k) bytes and set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
 * Compile with NVRTC options --gpu-architecture=<caps.arch, e.g. sm_90> -default-device, and
 * -I<CUDA>/include (e.g. /usr/local/cuda/include) when the source includes <mma.h>.
 * Plane ops use the full warp mask: every lane of the warp must reach them.
 * Matrix ops map to WMMA: A/B f16 or bf16 (m16n16k16, m32n8k16, m8n32k16), f32 as tf32
 * (m16n16k8), f64 (m8n8k4), i8/u8 (i32 accumulators); anything else is rejected. Fragments of
 * A/B must be loaded with the layout they were declared with; matrix memory must be 32-byte
 * aligned and strides multiples of 16 bytes (WMMA's rules). bf16 and tf32 A/B fragments load from
 * shared memory through inline PTX with the .shared state space (WMMA's API gives them generic
 * addresses). COPY_ASYNC / COPY_COMMIT / COPY_WAIT become cp.async / cp.async.commit_group /
 * cp.async.wait_group from sm_80 on (plain copies before).
 * For sm_90 and later every kernel begins with PTX griddepcontrol.wait (wait for the grids it
 * depends on to complete and their writes to be visible) and griddepcontrol.launch_dependents,
 * and the module defines the global `ember_pdl`: the driver launches the kernels of a module
 * holding it with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so the next kernel's
 * cubes are scheduled while this one runs out (programmatic dependent launch; the same order of
 * effects as a plain stream, since nothing runs before the wait). A kernel that calls the
 * language's dependency_wait() ("cuda.griddep_wait", in its top-level statements) waits there
 * instead, after what it does first (prefetch: "cuda.prefetch_l2@M", prefetch.global.L2).
 * Warpgroup MMAs (the language's wgmma_*, lowered to "cuda.wgmma.*" intrinsics) become PTX
 * wgmma.mma_async / fence / commit_group / wait_group for sm_90 devices only (compile for sm_90a)
 * and are rejected elsewhere; a kernel with them aligns its shared arrays to 1024 bytes.
 * Shared-memory barriers with phases and setmaxnreg ("cuda.mbar.*", "cuda.setmaxnreg:*") become
 * PTX mbarrier / cp.async.mbarrier.arrive / setmaxnreg for sm_90a only (cuda_mbarrier.c).
 * Intrinsics: "cuda.ptx:TEMPLATE" is inline PTX (%0 is the result when there is one, then the
 * arguments; 16/32/64-bit integers and f32/f64 only); "cuda.call:NAME" calls a device function. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/codegen/codegen.h"
#include "kernel/codegen/cuda_mbarrier.h"
#include "kernel/codegen/cuda_tma.h"
#include "kernel/codegen/spmd.h"
#include "kernel/lang/wgmma.h"

#define STATIC_SMEM_LIMIT (48u * 1024u)
#define SMEM_ALIGN 32u

static const char *const storage_type[EM_SCALAR_COUNT] = {[EM_BOOL] = "unsigned char",
                                                          [EM_I8] = "signed char",
                                                          [EM_I16] = "short",
                                                          [EM_I32] = "int",
                                                          [EM_I64] = "long long",
                                                          [EM_U8] = "unsigned char",
                                                          [EM_U16] = "unsigned short",
                                                          [EM_U32] = "unsigned",
                                                          [EM_U64] = "unsigned long long",
                                                          [EM_F16] = "unsigned short",
                                                          [EM_BF16] = "unsigned short",
                                                          [EM_F32] = "float",
                                                          [EM_F64] = "double"};

static bool converted(em_scalar s)
{
    return s == EM_BOOL || s == EM_F16 || s == EM_BF16;
}

/* ---- types, literals, conversions ------------------------------------------------------------ */

static void cu_decl(em_spmd *e, em_type t, const char *name, em_strbuf *sb)
{
    if (t.lanes == 1)
        em_sb_printf(sb, "%s %s", e->d->ctype[t.scalar], name);
    else
        em_sb_printf(sb, "emv<%s, %u> %s", e->d->ctype[t.scalar], t.lanes, name);
}

static void cu_lane(em_spmd *e, em_type t, const char *name, unsigned i, em_strbuf *sb)
{
    (void)e, (void)t;
    em_sb_printf(sb, "%s.v[%u]", name, i);
}

static int cu_line_kind(em_spmd *e, em_type t)
{
    (void)e;
    (void)t;
    return EM_LINE_OPS;
}

static void cu_literal(em_spmd *e, em_scalar s, em_ir_const c, em_strbuf *sb)
{
    static const char *const special[4] = {
        "__int_as_float(0x7f800000)", "__int_as_float(0x7fffffff)",
        "__longlong_as_double(0x7ff0000000000000ll)", "__longlong_as_double(0x7fffffffffffffffll)"};
    em_spmd_c_literal(e, s, c, "ll", "ull", special, sb);
}

static void cu_zero(em_spmd *e, em_type t, em_strbuf *sb)
{
    (void)e;
    (void)t;
    em_sb_append(sb, " = {}");
}

/* f32 lines to bf16 round two lanes per instruction (cvt.rn.bf16x2.f32, sm_80+), and a store
 * of the result folds into that one word. (f16 keeps lane-by-lane rounding: its widening is a
 * cvt too, which the compiler cannot fold with a store's cvt, so packing would add work.) */
static bool cu_line_convert(em_spmd *e, em_scalar from, em_scalar to, unsigned lanes,
                            const char *x, em_strbuf *sb)
{
    (void)e;
    (void)lanes;
    if (from != EM_F32 || to != EM_BF16) return false;
    em_sb_printf(sb, "em_rb_line(%s)", x);
    return true;
}

static void cu_wrap(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb)
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

static void cu_convert(em_spmd *e, em_scalar from, em_scalar to, const char *x, em_strbuf *sb)
{
    if (to == EM_F16 || to == EM_BF16) {
        em_sb_printf(sb, "%s((float)(%s))", to == EM_F16 ? "em_rh" : "em_rb", x);
    } else if (em_scalar_is_float(to) && em_scalar_is_float(from) && to == EM_F32) {
        em_sb_printf(sb, "(float)(%s)", x);
    } else {
        em_sb_printf(sb, "(%s)(%s)", e->d->ctype[to], x);
    }
}

static const char *cu_float_fn(em_spmd *e, em_ir_op op, em_scalar s)
{
    (void)e;
    return em_spmd_libm_name(op, s != EM_F64);
}

static void cu_bit_count(em_spmd *e, em_ir_op op, em_scalar s, const char *x, em_strbuf *sb)
{
    (void)e;
    unsigned w = em_spmd_bits(s);
    if (w == 64) {
        if (op == EM_OP_POPCOUNT)
            em_sb_printf(sb, "(unsigned)__popcll((unsigned long long)(%s))", x);
        else if (op == EM_OP_CLZ)
            em_sb_printf(sb, "(unsigned)__clzll((long long)(%s))", x);
        else
            em_sb_printf(sb, "((%s) == 0 ? 64u : (unsigned)__ffsll((long long)(%s)) - 1u)", x, x);
        return;
    }
    em_strbuf m; /* the value's bits, zero-extended to 32 */
    em_sb_init(&m);
    if (w == 32)
        em_sb_printf(&m, "(unsigned)(%s)", x);
    else
        em_sb_printf(&m, "(unsigned)(%s)(%s)", w == 8 ? "unsigned char" : "unsigned short", x);
    if (op == EM_OP_POPCOUNT)
        em_sb_printf(sb, "(unsigned)__popc(%s)", m.data);
    else if (op == EM_OP_CLZ)
        em_sb_printf(sb, "((unsigned)__clz((int)(%s)) - %uu)", m.data, 32 - w);
    else
        em_sb_printf(sb, "((%s) == 0u ? %uu : (unsigned)__ffs((int)(%s)) - 1u)", m.data, w, m.data);
    em_sb_free(&m);
}

static void cu_to_bits(em_spmd *e, em_scalar s, const char *x, em_strbuf *sb)
{
    (void)e;
    switch (s) {
    case EM_F32:
        em_sb_printf(sb, "__float_as_uint(%s)", x);
        break;
    case EM_F64:
        em_sb_printf(sb, "(unsigned long long)__double_as_longlong(%s)", x);
        break;
    case EM_F16:
        em_sb_printf(sb, "(unsigned)em_f2h(%s)", x);
        break;
    case EM_BF16:
        /* a bf16 in a register is a float whose top half is its bits (prelude_bf16) */
        em_sb_printf(sb, "(unsigned)em_f2b_exact(%s)", x);
        break;
    case EM_I64:
    case EM_U64:
        em_sb_printf(sb, "(unsigned long long)(%s)", x);
        break;
    case EM_I8:
    case EM_U8:
        em_sb_printf(sb, "(unsigned)(unsigned char)(%s)", x);
        break;
    case EM_I16:
    case EM_U16:
        em_sb_printf(sb, "(unsigned)(unsigned short)(%s)", x);
        break;
    default:
        em_sb_printf(sb, "(unsigned)(%s)", x);
        break;
    }
}

static void cu_from_bits(em_spmd *e, em_scalar s, const char *b, em_strbuf *sb)
{
    switch (s) {
    case EM_F32:
        em_sb_printf(sb, "__uint_as_float(%s)", b);
        break;
    case EM_F64:
        em_sb_printf(sb, "__longlong_as_double((long long)(%s))", b);
        break;
    case EM_F16:
        em_sb_printf(sb, "em_h2f((unsigned short)(%s))", b);
        break;
    case EM_BF16:
        em_sb_printf(sb, "em_b2f((unsigned short)(%s))", b);
        break;
    default:
        em_sb_printf(sb, "(%s)(%s)", e->d->ctype[s], b);
        break;
    }
}

static void cu_builtin(em_spmd *e, em_builtin b, em_strbuf *sb)
{
    (void)e;
    static const char *const names[EM_BUILTIN_COUNT] = {[EM_UNIT_POS_X] = "threadIdx.x",
                                                        [EM_UNIT_POS_Y] = "threadIdx.y",
                                                        [EM_UNIT_POS_Z] = "threadIdx.z",
                                                        [EM_CUBE_POS_X] = "blockIdx.x",
                                                        [EM_CUBE_POS_Y] = "blockIdx.y",
                                                        [EM_CUBE_POS_Z] = "blockIdx.z",
                                                        [EM_CUBE_DIM_X] = "blockDim.x",
                                                        [EM_CUBE_DIM_Y] = "blockDim.y",
                                                        [EM_CUBE_DIM_Z] = "blockDim.z",
                                                        [EM_CUBE_COUNT_X] = "gridDim.x",
                                                        [EM_CUBE_COUNT_Y] = "gridDim.y",
                                                        [EM_CUBE_COUNT_Z] = "gridDim.z",
                                                        [EM_PLANE_DIM] = "(unsigned)warpSize",
                                                        [EM_UNIT_POS_PLANE] =
                                                            "(em_unit_pos() % (unsigned)warpSize)"};
    em_sb_append(sb, b < EM_BUILTIN_COUNT && names[b] ? names[b] : "0u");
}

static void cu_meta(em_spmd *e, uint32_t off, em_strbuf *sb)
{
    (void)e;
    em_sb_printf(sb, "(unsigned)em_meta[%u]", off);
}

/* ---- memory ------------------------------------------------------------------------------------
 */

static const em_ir_memory *mem(em_spmd *e, em_ir_mem m)
{
    return em_ir_mem_at(e->k, m);
}

/* Local memory holds compute types; global and shared memory hold storage types (bool as a byte,
 * whose converters the prelude then needs). */
static bool stored_converted(em_spmd *e, em_ir_mem m)
{
    const em_ir_memory *x = mem(e, m);
    bool conv = x->space != EM_MEM_LOCAL && converted((em_scalar)x->elem.scalar);
    if (conv && x->elem.scalar == EM_BOOL) e->needs |= EM_NEED_BOOLMEM;
    return conv;
}

static const char *from_storage_fn(em_scalar s)
{
    return s == EM_BOOL ? "em_u2b" : s == EM_F16 ? "em_h2f" : "em_b2f";
}
static const char *to_storage_fn(em_scalar s)
{
    return s == EM_BOOL ? "em_b2u" : s == EM_F16 ? "em_f2h" : "em_f2b_exact";
}

static void cu_mem_load(em_spmd *e, em_ir_mem m, const char *index, int lane, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    em_scalar s = (em_scalar)x->elem.scalar;
    char sfx[16] = "";
    if (lane >= 0) snprintf(sfx, sizeof sfx, ".v[%d]", lane);
    if (stored_converted(e, m))
        em_sb_printf(sb, "%s(%s[%s]%s)", from_storage_fn(s), e->mname[m], index, sfx);
    else
        em_sb_printf(sb, "%s[%s]%s", e->mname[m], index, sfx);
}

static void cu_mem_store(em_spmd *e, em_ir_mem m, const char *index, int lane, const char *value)
{
    const em_ir_memory *x = mem(e, m);
    char sfx[16] = "";
    if (lane >= 0) snprintf(sfx, sizeof sfx, ".v[%d]", lane);
    if (stored_converted(e, m))
        em_spmd_line(e, "%s[%s]%s = %s(%s);", e->mname[m], index, sfx,
                     to_storage_fn((em_scalar)x->elem.scalar), value);
    else
        em_spmd_line(e, "%s[%s]%s = %s;", e->mname[m], index, sfx, value);
}

static bool cu_mem_load_line(em_spmd *e, em_ir_mem m, const char *index, em_strbuf *sb)
{
    const em_ir_memory *x = mem(e, m);
    if (stored_converted(e, m)) {
        em_sb_printf(sb, "%s(%s[%s])", from_storage_fn((em_scalar)x->elem.scalar), e->mname[m],
                     index);
    } else {
        em_sb_printf(sb, "%s[%s]", e->mname[m], index);
    }
    return true;
}

static bool cu_mem_store_line(em_spmd *e, em_ir_mem m, const char *index, const char *value)
{
    const em_ir_memory *x = mem(e, m);
    if (stored_converted(e, m)) {
        em_spmd_line(e, "%s[%s] = %s(%s);", e->mname[m], index,
                     to_storage_fn((em_scalar)x->elem.scalar), value);
    } else {
        em_spmd_line(e, "%s[%s] = %s;", e->mname[m], index, value);
    }
    return true;
}

/* ---- synchronization, planes, atomics ------------------------------------------------------- */

static void cu_sync(em_spmd *e, const em_ir_inst *in)
{
    if (in->op == EM_OP_SYNC_CUBE)
        em_spmd_line(e, "__syncthreads();");
    else if (in->op == EM_OP_SYNC_PLANE)
        em_spmd_line(e, "__syncwarp();");
    else
        em_spmd_line(e, in->imm ? "__threadfence();" : "__threadfence_block();");
}

/* The compute capability from an arch ("sm_90" -> 90); 0 when unknown. */
static unsigned arch_of(const char *a)
{
    if (strncmp(a, "sm_", 3) && strncmp(a, "compute_", 8)) return 0;
    return (unsigned)strtoul(a + (a[0] == 's' ? 3 : 8), NULL, 10);
}

static unsigned arch_number(const em_spmd *e)
{
    return arch_of(e->caps.arch);
}

static void cu_plane(em_spmd *e, const em_ir_inst *in, em_scalar s, const char *a, const char *b,
                     em_strbuf *sb)
{
    e->needs |= EM_NEED_PLANE;
    bool redux = (s == EM_I32 || s == EM_U32) && arch_number(e) >= 80;
    switch (in->op) {
    case EM_OP_PLANE_SUM:
        em_sb_printf(sb, redux ? "__reduce_add_sync(EM_FULL_MASK, %s)" : "em_plane_sum(%s)", a);
        break;
    case EM_OP_PLANE_MIN:
        em_sb_printf(sb, redux ? "__reduce_min_sync(EM_FULL_MASK, %s)" : "em_plane_min(%s)", a);
        break;
    case EM_OP_PLANE_MAX:
        em_sb_printf(sb, redux ? "__reduce_max_sync(EM_FULL_MASK, %s)" : "em_plane_max(%s)", a);
        break;
    case EM_OP_PLANE_PROD:
        em_sb_printf(sb, "em_plane_prod(%s)", a);
        break;
    case EM_OP_PLANE_INCLUSIVE_SUM:
        em_sb_printf(sb, "em_plane_inclusive_sum(%s)", a);
        break;
    case EM_OP_PLANE_EXCLUSIVE_SUM:
        em_sb_printf(sb, "em_plane_exclusive_sum(%s)", a);
        break;
    case EM_OP_PLANE_ALL:
        em_sb_printf(sb, "(__all_sync(EM_FULL_MASK, %s) != 0)", a);
        break;
    case EM_OP_PLANE_ANY:
        em_sb_printf(sb, "(__any_sync(EM_FULL_MASK, %s) != 0)", a);
        break;
    case EM_OP_PLANE_BALLOT:
        em_sb_printf(sb, "__ballot_sync(EM_FULL_MASK, %s)", a);
        break;
    case EM_OP_PLANE_BROADCAST:
    case EM_OP_PLANE_SHUFFLE:
        em_sb_printf(sb, "em_shfl(%s, (int)(%s))", a, b);
        break;
    case EM_OP_PLANE_SHUFFLE_XOR:
        em_sb_printf(sb, "em_shfl_xor(%s, (int)(%s))", a, b);
        break;
    case EM_OP_PLANE_SHUFFLE_UP:
        em_sb_printf(sb, "em_shfl_up(%s, (unsigned)(%s))", a, b);
        break;
    case EM_OP_PLANE_SHUFFLE_DOWN:
        em_sb_printf(sb, "em_shfl_down(%s, (unsigned)(%s))", a, b);
        break;
    default:
        em_spmd_fail(e, "unknown plane op");
        break;
    }
}

static void cu_atomic(em_spmd *e, const em_ir_inst *in, const char *index, em_strbuf *sb)
{
    const em_ir_memory *m = mem(e, in->mem);
    em_scalar s = (em_scalar)m->elem.scalar;
    const char *T = storage_type[s];
    em_strbuf p, v, c;
    em_sb_init(&p);
    em_sb_init(&v);
    em_sb_init(&c);
    em_sb_printf(&p, "&%s[%s]", e->mname[in->mem], index);
    if (in->args[1]) em_spmd_val(e, in->args[1], &v);
    if (in->args[2]) em_spmd_val(e, in->args[2], &c);
    bool i64 = s == EM_I64, f64 = s == EM_F64, is64 = em_spmd_bits(s) == 64;
    const char *ull = "unsigned long long";
    static const char *const fn[] = {"atomicAdd", "atomicSub",  "atomicMin",
                                     "atomicMax", "atomicAnd",  "atomicOr",
                                     "atomicXor", "atomicExch", "atomicCAS"};
    em_ir_op op = (em_ir_op)in->op;
    switch (op) {
    case EM_OP_ATOMIC_SUB:
        if (em_scalar_is_float(s))
            em_sb_printf(sb, "atomicAdd(%s, -(%s))", p.data, v.data);
        else if (is64)
            em_sb_printf(sb, "(%s)atomicAdd((%s *)%s, 0ull - (%s)(%s))", T, ull, p.data, ull,
                         v.data);
        else
            em_sb_printf(sb, "atomicSub(%s, %s)", p.data, v.data);
        break;
    case EM_OP_ATOMIC_ADD:
    case EM_OP_ATOMIC_AND:
    case EM_OP_ATOMIC_OR:
    case EM_OP_ATOMIC_XOR:
    case EM_OP_ATOMIC_XCHG:
        if (i64)
            em_sb_printf(sb, "(long long)%s((%s *)%s, (%s)(%s))", fn[op - EM_OP_ATOMIC_ADD], ull,
                         p.data, ull, v.data);
        else if (f64 && op == EM_OP_ATOMIC_XCHG)
            em_sb_printf(sb,
                         "__longlong_as_double((long long)atomicExch((%s *)%s, "
                         "(%s)__double_as_longlong(%s)))",
                         ull, p.data, ull, v.data);
        else
            em_sb_printf(sb, "%s(%s, %s)", fn[op - EM_OP_ATOMIC_ADD], p.data, v.data);
        break;
    case EM_OP_ATOMIC_MIN:
    case EM_OP_ATOMIC_MAX:
        em_sb_printf(sb, "%s(%s, %s)", fn[op - EM_OP_ATOMIC_ADD], p.data, v.data);
        break;
    case EM_OP_ATOMIC_CAS:
        if (i64)
            em_sb_printf(sb, "(long long)atomicCAS((%s *)%s, (%s)(%s), (%s)(%s))", ull, p.data, ull,
                         v.data, ull, c.data);
        else
            em_sb_printf(sb, "atomicCAS(%s, %s, %s)", p.data, v.data, c.data);
        break;
    case EM_OP_ATOMIC_LOAD:
        em_sb_printf(sb, "*(volatile %s *)%s", T, p.data);
        break;
    case EM_OP_ATOMIC_STORE: /* an exchange whose old value is dropped */
        if (f64)
            em_sb_printf(sb, "atomicExch((%s *)%s, (%s)__double_as_longlong(%s))", ull, p.data, ull,
                         v.data);
        else if (i64)
            em_sb_printf(sb, "atomicExch((%s *)%s, (%s)(%s))", ull, p.data, ull, v.data);
        else
            em_sb_printf(sb, "atomicExch(%s, %s)", p.data, v.data);
        break;
    default:
        em_spmd_fail(e, "unknown atomic op");
        break;
    }
    em_sb_free(&p);
    em_sb_free(&v);
    em_sb_free(&c);
}

/* ---- matrix ops: WMMA ---------------------------------------------------------------------------
 */

static const unsigned half_shapes[3][3] = {{16, 16, 16}, {32, 8, 16}, {8, 32, 16}};
static const unsigned tf32_shape[3] = {16, 16, 8};
static const unsigned f64_shape[3] = {8, 8, 4};

static bool shape_is(const em_ir_value *f, const unsigned s[3])
{
    return f->mat_m == s[0] && f->mat_n == s[1] && f->mat_k == s[2];
}

static bool half_shape(const em_ir_value *f)
{
    for (int i = 0; i < 3; i++)
        if (shape_is(f, half_shapes[i])) return true;
    return false;
}

/* Why fragment f has no WMMA form on this device, or NULL. */
static const char *wmma_problem(em_spmd *e, const em_ir_value *f)
{
    em_scalar s = (em_scalar)f->type.scalar;
    bool ab = f->mat_role != EM_MAT_ACC, ok;
    unsigned need = 70;
    if (ab) {
        if (s == EM_F16 || s == EM_BF16 || s == EM_I8 || s == EM_U8)
            ok = half_shape(f);
        else if (s == EM_F32)
            ok = shape_is(f, tf32_shape);
        else if (s == EM_F64)
            ok = shape_is(f, f64_shape);
        else
            return "WMMA takes A/B fragments of f16, bf16, f32 (as tf32), f64, i8 or u8";
        if (s == EM_BF16 || s == EM_F32 || s == EM_F64) need = 80;
        if (s == EM_I8 || s == EM_U8) need = 72;
    } else {
        if (s == EM_F16 || s == EM_I32)
            ok = half_shape(f);
        else if (s == EM_F32)
            ok = half_shape(f) || shape_is(f, tf32_shape);
        else if (s == EM_F64)
            ok = shape_is(f, f64_shape);
        else
            return "WMMA accumulators are f16, f32, f64 or i32";
    }
    if (!ok)
        return "the shape is not a WMMA shape (f16/bf16/i8/u8: 16x16x16, 32x8x16, 8x32x16; f32 as "
               "tf32: "
               "16x16x8; f64: 8x8x4)";
    unsigned arch = arch_number(e);
    if (arch && arch < need)
        return "the device's architecture is too old for this WMMA element type";
    return NULL;
}

static const char *wmma_type(const em_ir_value *f)
{
    switch (f->type.scalar) {
    case EM_F16:
        return "__half";
    case EM_BF16:
        return "__nv_bfloat16";
    case EM_F32:
        return f->mat_role == EM_MAT_ACC ? "float" : "wmma::precision::tf32";
    case EM_F64:
        return "double";
    case EM_I8:
        return "signed char";
    case EM_U8:
        return "unsigned char";
    default:
        return "int";
    }
}

/* The element type of matrix memory as WMMA wants its pointers. */
static const char *wmma_ptr_type(em_scalar s)
{
    return s == EM_F16 ? "__half" : s == EM_BF16 ? "__nv_bfloat16" : storage_type[s];
}

static void cu_fragment(em_spmd *e, em_ir_val v)
{
    const em_ir_value *f = em_spmd_value(e, v);
    static const char *const roles[] = {"wmma::matrix_a", "wmma::matrix_b", "wmma::accumulator"};
    const char *why =
        e->caps.matrix ? wmma_problem(e, f) : "this device has no matrix units (caps.matrix)";
    if (why) {
        em_spmd_fail(e, "matrix fragment %s (%s %ux%ux%u): %s", e->vname[v],
                     em_scalar_name((em_scalar)f->type.scalar), f->mat_m, f->mat_n, f->mat_k, why);
        return;
    }
    e->needs |= EM_NEED_MATRIX;
    if (f->mat_role == EM_MAT_ACC)
        em_spmd_line(e, "wmma::fragment<%s, %u, %u, %u, %s> %s;", roles[EM_MAT_ACC], f->mat_m,
                     f->mat_n, f->mat_k, wmma_type(f), e->vname[v]);
    else
        em_spmd_line(e, "wmma::fragment<%s, %u, %u, %u, %s, wmma::%s> %s;", roles[f->mat_role],
                     f->mat_m, f->mat_n, f->mat_k, wmma_type(f),
                     f->mat_layout == EM_COL_MAJOR ? "col_major" : "row_major", e->vname[v]);
}

/* Whether A/B fragment f loads from shared memory through inline PTX: bf16 16x16x16 and tf32
 * 16x16x8, whose fragments hold four 32-bit registers. */
static bool shared_load_ptx(const em_ir_value *f)
{
    if (f->type.scalar == EM_BF16) return shape_is(f, half_shapes[0]);
    return f->type.scalar == EM_F32 && shape_is(f, tf32_shape);
}

static void cu_matrix(em_spmd *e, const em_ir_inst *in)
{
    if (in->op == EM_OP_MAT_MMA) {
        const em_ir_value *d = em_spmd_value(e, in->args[0]), *a = em_spmd_value(e, in->args[1]);
        em_scalar as = (em_scalar)a->type.scalar, ds = (em_scalar)d->type.scalar;
        bool ok = ((as == EM_F16) && (ds == EM_F16 || ds == EM_F32)) ||
                  ((as == EM_BF16 || as == EM_F32) && ds == EM_F32) ||
                  (as == EM_F64 && ds == EM_F64) || ((as == EM_I8 || as == EM_U8) && ds == EM_I32);
        if (!ok) {
            em_spmd_fail(e, "WMMA has no mma with %s inputs and %s accumulators",
                         em_scalar_name(as), em_scalar_name(ds));
            return;
        }
        em_spmd_line(e, "wmma::mma_sync(%s, %s, %s, %s);", e->vname[in->args[0]],
                     e->vname[in->args[1]], e->vname[in->args[2]], e->vname[in->args[3]]);
        return;
    }
    if (in->op == EM_OP_MAT_FILL) {
        const em_ir_value *f = em_spmd_value(e, in->args[0]);
        em_strbuf v;
        em_sb_init(&v);
        em_spmd_val(e, in->args[1], &v);
        const char *conv = f->type.scalar == EM_F16    ? "__float2half"
                           : f->type.scalar == EM_BF16 ? "__float2bfloat16"
                                                       : NULL;
        if (conv)
            em_spmd_line(e, "wmma::fill_fragment(%s, %s(%s));", e->vname[in->args[0]], conv,
                         v.data);
        else
            em_spmd_line(e, "wmma::fill_fragment(%s, %s);", e->vname[in->args[0]], v.data);
        em_sb_free(&v);
        return;
    }
    bool load = in->op == EM_OP_MAT_LOAD;
    em_ir_val fv = in->args[load ? 0 : 2];
    const em_ir_value *f = em_spmd_value(e, fv);
    const em_ir_memory *m = mem(e, in->mem);
    em_strbuf off, stride;
    em_sb_init(&off);
    em_sb_init(&stride);
    em_spmd_val_u32(e, in->args[load ? 1 : 0], &off);
    em_spmd_val_u32(e, in->args[load ? 2 : 1], &stride);
    const char *pt = wmma_ptr_type((em_scalar)m->elem.scalar), *name = e->mname[in->mem],
               *fn = e->vname[fv];
    const char *layout = in->imm == EM_COL_MAJOR ? "wmma::mem_col_major" : "wmma::mem_row_major";
    if (!load) {
        em_spmd_line(e, "wmma::store_matrix_sync((%s *)(%s + %s), %s, %s, %s);", pt, name, off.data,
                     fn, stride.data, layout);
    } else if (f->mat_role == EM_MAT_ACC) {
        em_spmd_line(e, "wmma::load_matrix_sync(%s, (const %s *)(%s + %s), %s, %s);", fn, pt, name,
                     off.data, stride.data, layout);
    } else if ((int)f->mat_layout != in->imm) {
        em_spmd_fail(
            e,
            "fragment %s is declared %s-major but loaded %s-major; WMMA fixes the layout in the "
            "fragment's type",
            fn, f->mat_layout == EM_COL_MAJOR ? "column" : "row",
            in->imm == EM_COL_MAJOR ? "column" : "row");
    } else if (m->space == EM_MEM_SHARED && shared_load_ptx(f)) {
        /* bf16 and tf32 fragments through WMMA's API load from generic addresses (NVVM does not
         * see that the pointer is shared for them, as it does for f16): say it in PTX */
        em_spmd_line(e, "{");
        em_spmd_line(e, "    unsigned *em_r = reinterpret_cast<unsigned *>(%s.x);", fn);
        em_spmd_line(e,
                     "    asm volatile(\"wmma.load.%s.sync.aligned.%s.%s.shared.%s {%%0, %%1, %%2, "
                     "%%3}, [%%4], %%5;\" : \"=r\"(em_r[0]), \"=r\"(em_r[1]), \"=r\"(em_r[2]), "
                     "\"=r\"(em_r[3]) : \"r\"((unsigned)__cvta_generic_to_shared(%s + %s)), "
                     "\"r\"((unsigned)(%s)));",
                     f->mat_role == EM_MAT_A ? "a" : "b",
                     f->mat_layout == EM_COL_MAJOR ? "col" : "row",
                     f->type.scalar == EM_F32 ? "m16n16k8" : "m16n16k16",
                     f->type.scalar == EM_F32 ? "tf32" : "bf16", name, off.data, stride.data);
        em_spmd_line(e, "}");
    } else {
        em_spmd_line(e, "wmma::load_matrix_sync(%s, (const %s *)(%s + %s), %s);", fn, pt, name,
                     off.data, stride.data);
        if (f->type.scalar == EM_F32)
            em_spmd_line(e,
                         "for (int em_i = 0; em_i < %s.num_elements; em_i++) %s.x[em_i] = "
                         "wmma::__float_to_tf32(%s.x[em_i]);",
                         fn, fn, fn);
    }
    em_sb_free(&off);
    em_sb_free(&stride);
}

/* ---- asynchronous copies: cp.async ----------------------------------------------------------- */

static void cu_copy(em_spmd *e, const em_ir_inst *in)
{
    e->needs |= EM_NEED_COPY_ASYNC;
    if (in->op == EM_OP_COPY_COMMIT) {
        em_spmd_line(e, "em_cp_async_commit();");
        return;
    }
    if (in->op == EM_OP_COPY_WAIT) {
        em_spmd_line(e, "em_cp_async_wait<%d>();", in->imm);
        return;
    }
    const em_ir_memory *d = mem(e, in->mem), *s = mem(e, (em_ir_mem)in->imm);
    const em_ir_value *n = em_spmd_value(e, in->args[2]);
    if (!d || !s || !n) return;
    unsigned bytes = (unsigned)(n->c.u * em_scalar_size((em_scalar)d->elem.scalar));
    em_strbuf di, si, v;
    em_sb_init(&di);
    em_sb_init(&si);
    em_sb_init(&v);
    em_spmd_val_u32(e, in->args[0], &di);
    em_spmd_val_u32(e, in->args[1], &si);
    const char *dn = e->mname[in->mem], *sn = e->mname[(em_ir_mem)in->imm];
    if (in->args[3]) {
        /* a false condition reads nothing, from the (always valid) start of the buffer */
        em_spmd_val(e, in->args[3], &v);
        em_spmd_line(e, "em_cp_async<%u>(%s + %s, (%s) ? %s + %s : %s, %s);", bytes, dn, di.data,
                     v.data, sn, si.data, sn, v.data);
    } else {
        em_spmd_line(e, "em_cp_async<%u>(%s + %s, %s + %s, true);", bytes, dn, di.data, sn,
                     si.data);
    }
    em_sb_free(&di);
    em_sb_free(&si);
    em_sb_free(&v);
}

/* ---- debugging, intrinsics ---------------------------------------------------------------------
 */

static void cu_print(em_spmd *e, const em_ir_inst *in)
{
    em_spmd_printf(e, in, true, "(double)", 32);
}

static const char *ptx_constraint(em_type t)
{
    if (t.lanes != 1) return NULL;
    switch (t.scalar) {
    case EM_I16:
    case EM_U16:
        return "h";
    case EM_I32:
    case EM_U32:
        return "r";
    case EM_I64:
    case EM_U64:
        return "l";
    case EM_F32:
        return "f";
    case EM_F64:
        return "d";
    default:
        return NULL;
    }
}

/* ---- warpgroup MMAs: wgmma (sm_90a) ----------------------------------------------------------
 * The kernel language lowers wgmma_* to intrinsics (src/kernel/lang/lower_wgmma.c):
 *   "cuda.wgmma.desc:LBO@M"       the u64 descriptor of shared array M (in->mem) at element a
 *   "cuda.wgmma.mma:N,T,TA,TB@M"  acc (local f32 array M, N/2 elements) += A * B, descriptors a, b
 *   "cuda.wgmma.mma_rs:N,T,TB,A,O@M"  the same with A's fragment in registers: elements O .. O+3
 *                                 of local u32 array A; argument b's descriptor
 *   "cuda.wgmma.pin@M"            an empty asm reading and writing local array M's registers, so
 *                                 their writes stay before the wgmma.fence that follows
 *   "cuda.wgmma.wait:P@M"         wait until at most P groups are pending; pins M's registers
 *   "cuda.wgmma.fence", "cuda.wgmma.fence_regs" (no proxy fence: the operands came through
 *   the async proxy, e.g. TMA), "cuda.wgmma.commit"
 * The accumulator's elements are "+f" operands of the mma and of the wait, so the compiler keeps
 * them in registers and reads them only after the wait. */

/* The accumulator's N/2 elements as "+f" operands, comma-separated. */
static void acc_operands(em_spmd *e, em_ir_mem m, unsigned n, em_strbuf *sb)
{
    for (unsigned i = 0; i < n; i++)
        em_sb_printf(sb, "%s\"+f\"(%s[%u])", i ? ", " : "", e->mname[m], i);
}

/* The scale-d predicate's operand of a warpgroup MMA into *add (initialized here): argument i
 * when the instruction has it (the add flag), else 1 (add to the accumulator). */
static void wgmma_add_operand(em_spmd *e, const em_ir_inst *in, unsigned i, em_strbuf *add)
{
    em_sb_init(add);
    if (in->imm > (int64_t)i)
        em_spmd_val_u32(e, in->args[i], add);
    else
        em_sb_append(add, "1");
}

static bool cu_wgmma(em_spmd *e, const em_ir_inst *in, const char *what, em_strbuf *sb)
{
    if (strcmp(e->caps.arch, "sm_90a")) {
        em_spmd_fail(e,
                     "warpgroup MMAs (wgmma) need compute capability 9.0 (sm_90a); this device "
                     "is %s",
                     e->caps.arch[0] ? e->caps.arch : "of unknown architecture");
        return true;
    }
    const em_ir_memory *m = mem(e, in->mem);
    if (!strcmp(what, "fence")) {
        /* the unit's shared-memory writes become visible to the async proxy that wgmma reads
         * through; then wgmma's own fence on registers and shared memory */
        em_spmd_line(e, "asm volatile(\"fence.proxy.async.shared::cta;\\n"
                        "wgmma.fence.sync.aligned;\" ::: \"memory\");");
    } else if (!strcmp(what, "fence_regs")) {
        em_spmd_line(e, "asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");");
    } else if (!strcmp(what, "commit")) {
        em_spmd_line(e, "asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");");
    } else if (!strncmp(what, "desc:", 5) && m && m->space == EM_MEM_SHARED && in->dst) {
        unsigned lbo = (unsigned)strtoul(what + 5, NULL, 10);
        em_strbuf off;
        em_sb_init(&off);
        em_spmd_val_u32(e, in->args[0], &off);
        em_sb_printf(sb,
                     "(0x%llxull | (unsigned long long)((((unsigned)__cvta_generic_to_shared(%s + "
                     "(%s))) & 0x3ffffu) >> 4))",
                     (unsigned long long)em_wgmma_desc_bits(lbo), e->mname[in->mem], off.data);
        em_sb_free(&off);
        return true;
    } else if (!strncmp(what, "wait:", 5) && m && m->space == EM_MEM_LOCAL) {
        em_strbuf ops;
        em_sb_init(&ops);
        acc_operands(e, in->mem, m->length, &ops);
        em_spmd_line(e, "asm volatile(\"wgmma.wait_group.sync.aligned %d;\" : %s :: \"memory\");",
                     atoi(what + 5), ops.data);
        em_sb_free(&ops);
    } else if (!strncmp(what, "pin@", 4) && m && m->space == EM_MEM_LOCAL) {
        em_strbuf ops;
        em_sb_init(&ops);
        const char *c = m->elem.scalar == EM_F32 ? "+f" : "+r";
        for (unsigned i = 0; i < m->length; i++)
            em_sb_printf(&ops, "%s\"%s\"(%s[%u])", i ? ", " : "", c, e->mname[in->mem], i);
        em_spmd_line(e, "asm volatile(\"\" : %s);", ops.data);
        em_sb_free(&ops);
    } else if (!strncmp(what, "mma_rs:", 7) && m && m->space == EM_MEM_LOCAL) {
        unsigned n = 0, tb = 0, am = 0, ao = 0;
        char t[8] = "";
        const em_ir_memory *fm = NULL;
        if (sscanf(what + 7, "%u,%7[a-z0-9],%u,%u,%u", &n, t, &tb, &am, &ao) != 5 ||
            n != m->length * 2 || (strcmp(t, "f16") && strcmp(t, "bf16")) || !(fm = mem(e, am)) ||
            fm->space != EM_MEM_LOCAL || ao + 4 > fm->length) {
            em_spmd_fail(e, "malformed warpgroup MMA `%s`", in->str);
            return true;
        }
        em_strbuf regs, ops, frag, db;
        em_sb_init(&regs);
        em_sb_init(&ops);
        em_sb_init(&frag);
        em_sb_init(&db);
        for (unsigned i = 0; i < n / 2; i++) em_sb_printf(&regs, "%s%%%u", i ? ", " : "", i);
        acc_operands(e, in->mem, n / 2, &ops);
        for (unsigned r = 0; r < 4; r++)
            em_sb_printf(&frag, "\"r\"(%s[%u]), ", e->mname[am], ao + r);
        em_spmd_val(e, in->args[0], &db);
        em_strbuf add;
        wgmma_add_operand(e, in, 1, &add);
        em_spmd_line(e,
                     "asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%u, 0;\\n"
                     "wgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {%s}, {%%%u, %%%u, %%%u, "
                     "%%%u}, %%%u, p, 1, 1, %u;\\n}\" : %s : %s\"l\"(%s), \"r\"(%s) : \"memory\");",
                     n / 2 + 5, n, t, t, regs.data, n / 2, n / 2 + 1, n / 2 + 2, n / 2 + 3,
                     n / 2 + 4, tb, ops.data, frag.data, db.data, add.data);
        em_sb_free(&add);
        em_sb_free(&regs);
        em_sb_free(&ops);
        em_sb_free(&frag);
        em_sb_free(&db);
    } else if (!strncmp(what, "mma:", 4) && m && m->space == EM_MEM_LOCAL) {
        unsigned n = 0, ta = 0, tb = 0;
        char t[8] = "";
        if (sscanf(what + 4, "%u,%7[a-z0-9],%u,%u", &n, t, &ta, &tb) != 4 || n != m->length * 2 ||
            (strcmp(t, "f16") && strcmp(t, "bf16"))) {
            em_spmd_fail(e, "malformed warpgroup MMA `%s`", in->str);
            return true;
        }
        em_strbuf regs, ops;
        em_sb_init(&regs);
        em_sb_init(&ops);
        for (unsigned i = 0; i < n / 2; i++) em_sb_printf(&regs, "%s%%%u", i ? ", " : "", i);
        acc_operands(e, in->mem, n / 2, &ops);
        em_strbuf da, db;
        em_sb_init(&da);
        em_sb_init(&db);
        em_spmd_val(e, in->args[0], &da);
        em_spmd_val(e, in->args[1], &db);
        em_strbuf add;
        wgmma_add_operand(e, in, 2, &add);
        em_spmd_line(e,
                     "asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%u, 0;\\n"
                     "wgmma.mma_async.sync.aligned.m64n%uk16.f32.%s.%s {%s}, %%%u, %%%u, p, 1, 1, "
                     "%u, %u;\\n}\" : %s : \"l\"(%s), \"l\"(%s), \"r\"(%s) : \"memory\");",
                     n / 2 + 2, n, t, t, regs.data, n / 2, n / 2 + 1, ta, tb, ops.data, da.data,
                     db.data, add.data);
        em_sb_free(&add);
        em_sb_free(&regs);
        em_sb_free(&ops);
        em_sb_free(&da);
        em_sb_free(&db);
    } else {
        em_spmd_fail(e, "unknown warpgroup MMA intrinsic `%s`", in->str);
        return true;
    }
    em_sb_append(sb, "(void)0");
    return true;
}

/* The griddepcontrol pair every sm_90 kernel runs once, at its start or where it calls
 * dependency_wait(): wait for the grids it depends on, then let the next one's cubes be
 * scheduled (the module's `ember_pdl` tells the driver to launch with that attribute). */
static void cu_griddep_wait(em_spmd *e)
{
    em_spmd_line(e, "asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");");
    em_spmd_line(e, "asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");");
}

/* Whether the kernel's top-level statements call dependency_wait() (lower_call.c). */
static bool cu_waits_itself(const em_ir_kernel *k)
{
    const em_ir_block *blk = em_ir_block_at(k, em_ir_body(k));
    for (size_t i = 0; blk && i < blk->len; i++) {
        const em_ir_inst *in = em_ir_inst_at(k, blk->items[i]);
        if (in && in->op == EM_OP_INTRINSIC && in->str && !strcmp(in->str, "cuda.griddep_wait"))
            return true;
    }
    return false;
}

/* "cuda.prefetch_l2@M" (i): prefetch.global.L2 of element i of global memory M;
 * "cuda.griddep_wait": the griddepcontrol pair (sm_90 on; before, launches are plain). */
static bool cu_pdl_intrinsic(em_spmd *e, const em_ir_inst *in, const char *name, em_strbuf *sb)
{
    if (!strcmp(name, "cuda.griddep_wait")) {
        if (arch_number(e) >= 90) cu_griddep_wait(e);
    } else if (!strncmp(name, "cuda.prefetch_l2@", 17) && in->imm == 1) {
        em_strbuf idx;
        em_sb_init(&idx);
        em_spmd_val_u32(e, in->args[0], &idx);
        em_spmd_line(e, "asm volatile(\"prefetch.global.L2 [%%0];\" :: \"l\"(%s + (%s)));",
                     e->mname[in->mem], idx.data);
        em_sb_free(&idx);
    } else {
        return false;
    }
    em_sb_append(sb, "(void)0");
    return true;
}

/* "cuda.ptx:TEMPLATE": inline PTX, %0 the result (when there is one), then the arguments. */
static bool cu_intrinsic(em_spmd *e, const em_ir_inst *in, em_strbuf *sb)
{
    const char *name = in->str ? in->str : "";
    if (cu_pdl_intrinsic(e, in, name, sb)) return true;
    if (!strncmp(name, "cuda.wgmma.", 11)) return cu_wgmma(e, in, name + 11, sb);
    if (!strncmp(name, "cuda.tma.", 9)) {
        em_cuda_tma(e, in, name + 9, sb);
        return true;
    }
    if (!strncmp(name, "cuda.", 5) && em_cuda_mbarrier(e, in, name + 5, sb)) return true;
    if (strncmp(name, "cuda.ptx:", 9)) return false;
    unsigned nargs = in->imm > 0 && in->imm <= EM_IR_MAX_ARGS ? (unsigned)in->imm : 0;
    em_strbuf text, outs, ins;
    em_sb_init(&text);
    em_sb_init(&outs);
    em_sb_init(&ins);
    for (const char *p = name + 9; *p; p++) {
        if (*p == '"' || *p == '\\') em_sb_appendc(&text, '\\');
        if (*p == '\n')
            em_sb_append(&text, "\\n");
        else
            em_sb_appendc(&text, *p);
    }
    char result[32] = "";
    if (in->dst) {
        const em_ir_value *d = em_spmd_value(e, in->dst);
        const char *c = ptx_constraint(d->type);
        if (!c)
            em_spmd_fail(e, "inline PTX results must be 16/32/64-bit integer or f32/f64 scalars");
        em_spmd_fresh(e, "asm", result);
        em_strbuf decl;
        em_sb_init(&decl);
        cu_decl(e, d->type, result, &decl);
        em_spmd_line(e, "%s;", decl.data);
        em_sb_free(&decl);
        em_sb_printf(&outs, "\"=%s\"(%s)", c ? c : "r", result);
    }
    for (unsigned i = 0; i < nargs; i++) {
        const char *c = ptx_constraint(
            em_spmd_value(e, in->args[i]) ? em_spmd_value(e, in->args[i])->type : em_ty(EM_BOOL));
        if (!c)
            em_spmd_fail(e, "inline PTX operands must be 16/32/64-bit integer or f32/f64 scalars");
        em_sb_printf(&ins, "%s\"%s\"(", i ? ", " : "", c ? c : "r");
        em_spmd_val(e, in->args[i], &ins);
        em_sb_append(&ins, ")");
    }
    /* a "memory" clobber: the compiler keeps memory accesses on their side of the PTX (a
     * named barrier, a fence written by hand) */
    em_spmd_line(e, "asm volatile(\"%s\" : %s : %s : \"memory\");", text.data, outs.data,
                 ins.data);
    if (in->dst)
        em_sb_append(sb, result);
    else
        em_sb_append(sb, "(void)0");
    em_sb_free(&text);
    em_sb_free(&outs);
    em_sb_free(&ins);
    return true;
}

/* ---- kernels ------------------------------------------------------------------------------------
 */

static void storage_line(em_type t, em_strbuf *sb)
{
    if (t.lanes == 1)
        em_sb_append(sb, storage_type[t.scalar]);
    else
        em_sb_printf(sb, "emv<%s, %u>", storage_type[t.scalar], t.lanes);
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* Whether the kernel has warpgroup MMAs or tensor-map loads: their swizzled operands need every
 * shared array aligned to WGMMA_ALIGN bytes of the shared address space. */
#define WGMMA_ALIGN 1024u
static bool uses_wgmma(const em_ir_kernel *k)
{
    for (size_t i = 0; i < em_ir_inst_count(k); i++) {
        const em_ir_inst *in = em_ir_inst_at(k, (uint32_t)i);
        if (in && in->op == EM_OP_INTRINSIC && in->str &&
            (!strncmp(in->str, "cuda.wgmma.", 11) || !strncmp(in->str, "cuda.tma.", 9)))
            return true;
    }
    return false;
}

/* Shared arrays in id order, each at a multiple of SMEM_ALIGN (WGMMA_ALIGN with warpgroup
 * MMAs); returns the total bytes. */
static uint64_t smem_layout(const em_ir_kernel *k, uint64_t *offsets)
{
    uint64_t total = 0;
    uint64_t align = uses_wgmma(k) ? WGMMA_ALIGN : SMEM_ALIGN;
    for (size_t m = 1; m <= em_ir_mem_count(k); m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        if (x->space != EM_MEM_SHARED) continue;
        total = round_up(total, align);
        if (offsets) offsets[m] = total;
        total += (uint64_t)x->length * x->elem.lanes * em_scalar_size((em_scalar)x->elem.scalar);
    }
    return total;
}

size_t em_codegen_cuda_dynamic_smem(const em_ir_kernel *k)
{
    if (!k) return 0;
    uint64_t total = smem_layout(k, NULL);
    /* with warpgroup MMAs the kernel aligns the dynamic block itself: WGMMA_ALIGN more bytes */
    if (total > STATIC_SMEM_LIMIT && uses_wgmma(k)) total += WGMMA_ALIGN;
    return total > STATIC_SMEM_LIMIT ? (size_t)total : 0;
}

static void declare_memory(em_spmd *e)
{
    const em_ir_kernel *k = e->k;
    size_t nm = em_ir_mem_count(k);
    uint64_t *offsets = calloc(nm + 1, sizeof(uint64_t));
    if (!offsets) {
        em_spmd_fail(e, "out of memory");
        return;
    }
    bool dynamic = smem_layout(k, offsets) > STATIC_SMEM_LIMIT, wg = uses_wgmma(k);
    if (dynamic) {
        e->needs |= EM_NEED_DYN_SMEM;
        em_spmd_line(e,
                     "extern __shared__ __align__(%u) unsigned char em_smem%s[]; /* "
                     "em_codegen_cuda_dynamic_smem bytes */",
                     SMEM_ALIGN, wg ? "_raw" : "");
        if (wg)
            em_spmd_line(e,
                         "unsigned char *em_smem = em_smem_raw + ((%uu - ((unsigned)"
                         "__cvta_generic_to_shared(em_smem_raw) & %uu)) & %uu);",
                         WGMMA_ALIGN, WGMMA_ALIGN - 1, WGMMA_ALIGN - 1);
    }
    for (size_t m = 1; m <= nm; m++) {
        const em_ir_memory *x = em_ir_mem_at(k, (em_ir_mem)m);
        em_strbuf t;
        em_sb_init(&t);
        if (x->space == EM_MEM_SHARED) {
            storage_line(x->elem, &t);
            if (dynamic)
                em_spmd_line(e, "%s *%s = reinterpret_cast<%s *>(em_smem + %llu);", t.data,
                             e->mname[m], t.data, (unsigned long long)offsets[m]);
            else
                em_spmd_line(e, "__shared__ __align__(%u) %s %s[%u];",
                             wg ? WGMMA_ALIGN : SMEM_ALIGN, t.data, e->mname[m], x->length);
        } else if (x->space == EM_MEM_LOCAL && (e->mflags[m] & EM_MEMF_USED)) {
            em_strbuf name;
            em_sb_init(&name);
            em_sb_printf(&name, "%s[%u]", e->mname[m], x->length);
            cu_decl(e, x->elem, name.data, &t);
            em_spmd_line(e, "%s;", t.data);
            em_sb_free(&name);
        }
        em_sb_free(&t);
    }
    free(offsets);
}

static void cu_open(em_spmd *e)
{
    const em_ir_kernel *k = e->k;
    em_strbuf *sb = e->sb;
    uint32_t dim[3];
    em_ir_cube_dim(k, dim);
    em_sb_append(sb, "extern \"C\" __global__ void ");
    if (dim[0] && dim[1] && dim[2])
        em_sb_printf(sb, "__launch_bounds__(%u) ", dim[0] * dim[1] * dim[2]);
    if (em_ir_cluster_dim(k) > 1) em_sb_printf(sb, "__cluster_dims__(%u, 1, 1) ", em_ir_cluster_dim(k));
    em_sb_printf(sb, "%s(", em_ir_kernel_name(k));
    for (size_t i = 0; i < em_ir_param_count(k); i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind == EM_PARAM_BUFFER) {
            const em_ir_memory *m = em_ir_mem_at(k, p->id);
            em_sb_append(sb, m->access == EM_READ ? "const " : "");
            storage_line(m->elem, sb);
            em_sb_printf(sb, " *%s, ", e->mname[p->id]);
        } else {
            em_scalar s = (em_scalar)em_spmd_value(e, p->id)->type.scalar;
            if (s == EM_BOOL)
                em_sb_printf(sb, "unsigned char %s_in, ", e->vname[p->id]);
            else
                em_sb_printf(sb, "%s %s, ", e->d->ctype[s], e->vname[p->id]);
        }
    }
    em_sb_append(sb, "const unsigned long long *em_meta)\n{\n");
    e->depth = 1;
    if (arch_number(e) >= 90 && !cu_waits_itself(k)) cu_griddep_wait(e);
    declare_memory(e);
    for (size_t i = 0; i < em_ir_param_count(k); i++) {
        const em_ir_param *p = em_ir_param_at(k, i);
        if (p->kind == EM_PARAM_SCALAR && em_spmd_value(e, p->id)->type.scalar == EM_BOOL)
            em_spmd_line(e, "const bool %s = %s_in != 0;", e->vname[p->id], e->vname[p->id]);
    }
}

static const em_spmd_dialect cuda_dialect = {
    .name = "CUDA",
    .ns = "cuda",
    .ctype = {[EM_BOOL] = "bool",
              [EM_I8] = "signed char",
              [EM_I16] = "short",
              [EM_I32] = "int",
              [EM_I64] = "long long",
              [EM_U8] = "unsigned char",
              [EM_U16] = "unsigned short",
              [EM_U32] = "unsigned",
              [EM_U64] = "unsigned long long",
              [EM_F16] = "float",
              [EM_BF16] = "float",
              [EM_F32] = "float",
              [EM_F64] = "double"},
    .fn_prefix = "__device__ __forceinline__ ",
    .unroll = "#pragma unroll",
    .decl = cu_decl,
    .lane = cu_lane,
    .line_kind = cu_line_kind,
    .literal = cu_literal,
    .zero = cu_zero,
    .convert = cu_convert,
    .line_convert = cu_line_convert,
    .wrap = cu_wrap,
    .float_fn = cu_float_fn,
    .bit_count = cu_bit_count,
    .to_bits = cu_to_bits,
    .from_bits = cu_from_bits,
    .builtin = cu_builtin,
    .meta = cu_meta,
    .mem_load = cu_mem_load,
    .mem_store = cu_mem_store,
    .mem_load_line = cu_mem_load_line,
    .mem_store_line = cu_mem_store_line,
    .sync = cu_sync,
    .plane = cu_plane,
    .atomic = cu_atomic,
    .fragment = cu_fragment,
    .matrix = cu_matrix,
    .copy = cu_copy,
    .print = cu_print,
    .intrinsic = cu_intrinsic,
    .open = cu_open,
};

/* ---- the source's prelude -----------------------------------------------------------------------
 */

static const char prelude_lines[] =
    "#define EM_FULL_MASK 0xffffffffu\n"
    "\n"
    "/* A line: N lanes of T, aligned for vector loads when N is a power of two. */\n"
    "template <typename T, int N>\n"
    "struct alignas((N & (N - 1)) != 0 ? sizeof(T) : sizeof(T) * N <= 16 ? sizeof(T) * N : 16) emv "
    "{\n"
    "    T v[N];\n"
    "};\n";

static const char prelude_vecops[] =
    "#define EM_LINE_OP(OP)                                                                       "
    "\\\n"
    "    template <typename T, int N> __device__ __forceinline__ emv<T, N> operator OP(emv<T, N> "
    "a, emv<T, N> b) \\\n"
    "    { emv<T, N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = a.v[i] OP b.v[i]; "
    "return r; } \\\n"
    "    template <typename T, int N> __device__ __forceinline__ emv<T, N> operator OP(emv<T, N> "
    "a, T b) \\\n"
    "    { emv<T, N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = a.v[i] OP b; "
    "return r; } \\\n"
    "    template <typename T, int N> __device__ __forceinline__ emv<T, N> operator OP(T a, emv<T, "
    "N> b) \\\n"
    "    { emv<T, N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = a OP b.v[i]; "
    "return r; }\n"
    "EM_LINE_OP(+)\nEM_LINE_OP(-)\nEM_LINE_OP(*)\nEM_LINE_OP(/)\n"
    "template <typename T, int N> __device__ __forceinline__ emv<T, N> operator-(emv<T, N> a)\n"
    "{ emv<T, N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = -a.v[i]; return r; "
    "}\n";

/* Scalar and line converters between storage type S and compute type C, named TO and FROM. */
#define CONVERTERS(S, C, TO, FROM)                                                                 \
    "template <int N> __device__ __forceinline__ emv<" C ", N> " FROM "(emv<" S ", N> x)\n"        \
    "{ emv<" C ", N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = " FROM            \
    "(x.v[i]); return r; }\n"                                                                      \
    "template <int N> __device__ __forceinline__ emv<" S ", N> " TO "(emv<" C ", N> x)\n"          \
    "{ emv<" S ", N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = " TO              \
    "(x.v[i]); return r; }\n"

/* A line of floats rounded to kind K two lanes per cvt (K x2 packs lane i + 1 in the high half),
 * named NAME; ROUND rounds one lane (an odd last lane; every lane before sm_80); LO and HI are
 * the two lanes of the packed word w as floats. */
#define PACKED_ROUND(NAME, K, ROUND, LO, HI)                                                       \
    "template <int N> __device__ __forceinline__ emv<float, N> " NAME "(emv<float, N> x)\n"         \
    "{\n"                                                                                         \
    "    emv<float, N> r;\n"                                                                      \
    "#if __CUDA_ARCH__ >= 800\n"                                                                 \
    "    _Pragma(\"unroll\") for (int i = 0; i + 1 < N; i += 2) {\n"                              \
    "        unsigned w; asm(\"cvt.rn." K "x2.f32 %0, %1, %2;\" : \"=r\"(w) : \"f\"(x.v[i + 1]), "  \
    "\"f\"(x.v[i]));\n"                                                                           \
    "        r.v[i] = " LO "; r.v[i + 1] = " HI ";\n"                                               \
    "    }\n"                                                                                     \
    "    if (N % 2) r.v[N - 1] = " ROUND "(x.v[N - 1]);\n"                                         \
    "#else\n"                                                                                    \
    "    _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = " ROUND "(x.v[i]);\n"           \
    "#endif\n"                                                                                   \
    "    return r;\n"                                                                             \
    "}\n"

static const char prelude_f16[] =
    "/* f16: IEEE binary16 bits in memory, float in registers, rounded after every operation. */\n"
    "__device__ __forceinline__ unsigned short em_f2h(float f)\n"
    "{ unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "__device__ __forceinline__ float em_h2f(unsigned short h)\n"
    "{ float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
    "__device__ __forceinline__ float em_rh(float f) { return em_h2f(em_f2h(f)); }\n" CONVERTERS(
        "unsigned short", "float", "em_f2h", "em_h2f");

static const char prelude_bf16[] =
    "/* bf16: bfloat16 bits in memory, float in registers, rounded (to nearest even) after every "
    "operation; one cvt instruction from sm_80 on. */\n"
    "__device__ __forceinline__ unsigned short em_f2b(float f)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    unsigned short b; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(b) : \"f\"(f)); return b;\n"
    "#else\n"
    "    unsigned u = __float_as_uint(f);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);\n"
    "    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ float em_b2f(unsigned short b) { return "
    "__uint_as_float((unsigned)b << 16); }\n"
    "__device__ __forceinline__ float em_rb(float f) { return em_b2f(em_f2b(f)); }\n"
    "/* A store: the value is already a bf16 (every bf16 value in registers went through em_rb or\n"
    " * came from memory), so its top half is the bf16 bits, NaN included; em_rb's cvt then the\n"
    " * shift fold into the one cvt. */\n"
    "__device__ __forceinline__ unsigned short em_f2b_exact(float f) { return "
    "(unsigned short)(__float_as_uint(f) >> 16); }\n"
    "/* A line load widens two lanes per 32-bit word: a shift and a mask. */\n"
    "template <int N> __device__ __forceinline__ emv<float, N> em_b2f(emv<unsigned short, N> x)\n"
    "{\n"
    "    emv<float, N> r;\n"
    "    _Pragma(\"unroll\") for (int i = 0; i + 1 < N; i += 2) {\n"
    "        unsigned w; memcpy(&w, &x.v[i], 4);\n"
    "        r.v[i] = __uint_as_float(w << 16); r.v[i + 1] = __uint_as_float(w & 0xffff0000u);\n"
    "    }\n"
    "    if (N % 2) r.v[N - 1] = em_b2f(x.v[N - 1]);\n"
    "    return r;\n"
    "}\n"
    "template <int N> __device__ __forceinline__ emv<unsigned short, N> em_f2b(emv<float, N> x)\n"
    "{ emv<unsigned short, N> r; _Pragma(\"unroll\") for (int i = 0; i < N; i++) r.v[i] = "
    "em_f2b(x.v[i]); return r; }\n"
        "/* A line store builds 32-bit words of two lanes from the top halves, so that after\n"
        " * em_rb_line (whose lanes are the halves of one packed cvt) the word is that cvt's. */\n"
        "template <int N> __device__ __forceinline__ emv<unsigned short, N> em_f2b_exact(emv<float, N> x)\n"
        "{\n"
        "    emv<unsigned short, N> r;\n"
        "    _Pragma(\"unroll\") for (int i = 0; i + 1 < N; i += 2) {\n"
        "        unsigned w = (__float_as_uint(x.v[i]) >> 16) | (__float_as_uint(x.v[i + 1]) & 0xffff0000u);\n"
        "        memcpy(&r.v[i], &w, 4);\n"
        "    }\n"
        "    if (N % 2) r.v[N - 1] = em_f2b_exact(x.v[N - 1]);\n"
        "    return r;\n"
        "}\n" PACKED_ROUND(
            "em_rb_line", "bf16", "em_rb", "__uint_as_float(w << 16)",
            "__uint_as_float(w & 0xffff0000u)");

static const char prelude_bool[] =
    "/* bool: one byte 0/1 in memory. */\n"
    "__device__ __forceinline__ bool em_u2b(unsigned char x) { return x != 0; }\n"
    "__device__ __forceinline__ unsigned char em_b2u(bool x) { return x ? 1 : 0; }\n" CONVERTERS(
        "unsigned char", "bool", "em_b2u", "em_u2b");

static const char prelude_plane[] =
    "/* Plane (warp) helpers: every lane of the warp must take part. */\n"
    "#define EM_SHFL(T, W)                                                                        "
    "\\\n"
    "    __device__ __forceinline__ T em_shfl(T x, int l) { return (T)__shfl_sync(EM_FULL_MASK, "
    "(W)x, l); } \\\n"
    "    __device__ __forceinline__ T em_shfl_xor(T x, int m) { return "
    "(T)__shfl_xor_sync(EM_FULL_MASK, (W)x, m); } \\\n"
    "    __device__ __forceinline__ T em_shfl_up(T x, unsigned d) { return "
    "(T)__shfl_up_sync(EM_FULL_MASK, (W)x, d); } \\\n"
    "    __device__ __forceinline__ T em_shfl_down(T x, unsigned d) { return "
    "(T)__shfl_down_sync(EM_FULL_MASK, (W)x, d); }\n"
    "EM_SHFL(bool, int)\nEM_SHFL(signed char, int)\nEM_SHFL(short, int)\nEM_SHFL(int, int)\n"
    "EM_SHFL(long long, long long)\nEM_SHFL(unsigned char, unsigned)\nEM_SHFL(unsigned short, "
    "unsigned)\n"
    "EM_SHFL(unsigned, unsigned)\nEM_SHFL(unsigned long long, unsigned long long)\nEM_SHFL(float, "
    "float)\n"
    "EM_SHFL(double, double)\n"
    "template <typename T> __device__ __forceinline__ T em_min(T a, T b) { return b < a ? b : a; "
    "}\n"
    "template <typename T> __device__ __forceinline__ T em_max(T a, T b) { return b > a ? b : a; "
    "}\n"
    "__device__ __forceinline__ float em_min(float a, float b) { return fminf(a, b); }\n"
    "__device__ __forceinline__ float em_max(float a, float b) { return fmaxf(a, b); }\n"
    "__device__ __forceinline__ double em_min(double a, double b) { return fmin(a, b); }\n"
    "__device__ __forceinline__ double em_max(double a, double b) { return fmax(a, b); }\n"
    "template <typename T> __device__ __forceinline__ T em_plane_sum(T x)\n"
    "{ for (int o = 16; o > 0; o >>= 1) x += em_shfl_xor(x, o); return x; }\n"
    "template <typename T> __device__ __forceinline__ T em_plane_prod(T x)\n"
    "{ for (int o = 16; o > 0; o >>= 1) x *= em_shfl_xor(x, o); return x; }\n"
    "template <typename T> __device__ __forceinline__ T em_plane_min(T x)\n"
    "{ for (int o = 16; o > 0; o >>= 1) x = em_min(x, em_shfl_xor(x, o)); return x; }\n"
    "template <typename T> __device__ __forceinline__ T em_plane_max(T x)\n"
    "{ for (int o = 16; o > 0; o >>= 1) x = em_max(x, em_shfl_xor(x, o)); return x; }\n"
    "template <typename T> __device__ __forceinline__ T em_plane_inclusive_sum(T x)\n"
    "{\n"
    "    unsigned lane = em_unit_pos() % 32u;\n"
    "    for (unsigned o = 1; o < 32u; o <<= 1) {\n"
    "        T y = em_shfl_up(x, o);\n"
    "        if (lane >= o) x += y;\n"
    "    }\n"
    "    return x;\n"
    "}\n"
    "template <typename T> __device__ __forceinline__ T em_plane_exclusive_sum(T x)\n"
    "{\n"
    "    T y = em_shfl_up(em_plane_inclusive_sum(x), 1u);\n"
    "    return em_unit_pos() % 32u == 0u ? (T)0 : y;\n"
    "}\n";

static const char prelude_copy[] =
    "/* Asynchronous global -> shared copies of B = 4, 8 or 16 bytes: cp.async from sm_80 on (a "
    "false\n"
    " * `valid` zero-fills the destination and reads nothing), plain copies before. */\n"
    "template <int B> __device__ __forceinline__ void em_cp_async(void *dst, const void *src, "
    "bool valid)\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    unsigned d = (unsigned)__cvta_generic_to_shared(dst);\n"
    "    if (B == 16)\n"
    "        asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" :: \"r\"(d), "
    "\"l\"(src), \"r\"(valid ? 16 : 0) : \"memory\");\n"
    "    else\n"
    "        asm volatile(\"cp.async.ca.shared.global [%0], [%1], %2, %3;\\n\" :: \"r\"(d), "
    "\"l\"(src), \"n\"(B), \"r\"(valid ? B : 0) : \"memory\");\n"
    "#else\n"
    "    struct alignas(B) W { unsigned char b[B]; };\n"
    "    W w = {};\n"
    "    if (valid) w = *(const W *)src;\n"
    "    *(W *)dst = w;\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ void em_cp_async_commit()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.commit_group;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "template <int N> __device__ __forceinline__ void em_cp_async_wait()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    asm volatile(\"cp.async.wait_group %0;\\n\" :: \"n\"(N) : \"memory\");\n"
    "#endif\n"
    "}\n";

static void prelude(const em_caps *caps, uint32_t needs, em_strbuf *sb)
{
    em_sb_append(sb, "/* ember: CUDA C++ for NVRTC, generated by src/kernel/codegen/cuda.c (its "
                     "top comment gives the\n"
                     " * parameter ABI). */\n");
    if (needs & EM_NEED_MATRIX)
        em_sb_append(sb, "#include <mma.h>\nnamespace wmma = nvcuda::wmma;\n\n");
    em_sb_append(sb, prelude_lines);
    if (needs & EM_NEED_VECOPS) em_sb_append(sb, prelude_vecops);
    if (needs & EM_NEED_F16) em_sb_append(sb, prelude_f16);
    if (needs & EM_NEED_BF16) em_sb_append(sb, prelude_bf16);
    if (needs & EM_NEED_BOOLMEM) em_sb_append(sb, prelude_bool);
    if (needs & EM_NEED_COPY_ASYNC) em_sb_append(sb, prelude_copy);
    if (arch_of(caps->arch) >= 90)
        em_sb_append(sb, "\n/* Every kernel of this module starts with griddepcontrol.wait: the "
                         "runtime may launch it\n * with programmatic stream serialization. */\n"
                         "extern \"C\" __device__ int ember_pdl = 1;\n");
    em_sb_append(sb, "\n/* Positions. */\n");
    em_spmd_position_helpers(&cuda_dialect, caps, NULL, "", sb);
    if (needs & EM_NEED_PLANE) em_sb_append(sb, prelude_plane);
    em_sb_append(sb, "\n");
}

char *em_codegen_cuda(const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    em_caps c = caps ? *caps : em_spmd_default_caps("cuda", 32);
    c.plane_dim = 32; /* warps: plane ops are always native */
    c.plane_ops = true;
    return em_spmd_translation_unit(&cuda_dialect, ks, n, &c, prelude, "CUDA");
}
