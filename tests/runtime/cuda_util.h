/* cuda_util.h — helpers shared by the CUDA tests (test_cuda_compile.c, test_cuda_driver.c):
 * hand-written CUDA kernels that follow the CUDA driver's launch ABI, IR kernels for the code
 * generator, checks on compiled images, and skipping when NVRTC or a CUDA device is missing.
 * Header-only: each test includes it once. */
#ifndef EM_TEST_CUDA_UTIL_H
#define EM_TEST_CUDA_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ember/kernel.h"
#include "ember/runtime.h"
#include "runtime/drivers/nvrtc.h"

/* Hand-written kernels in the driver's launch ABI (the top of kernel/codegen/cuda.c): a buffer
 * parameter is a pointer to element 0, a scalar its C type (f16 and bf16 as float, bool as
 * unsigned char), and the last parameter points to the tensor metadata, u64 words: for each
 * buffer in order len, shape[rank], stride[rank]. `emk_smem_NAME` gives a kernel's dynamic shared
 * memory in bytes. */
static const char CU_TEST_SOURCE[] =
    "#include <cuda_fp16.h>\n"
    "#include <cuda_bf16.h>\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "\n"
    "/* out[i] = a[i] * scale + b[i * stride], b a 1-D strided view; meta: a.len, b.len, b.shape[0],\n"
    " * b.stride[0], out.len */\n"
    "extern \"C\" __global__ void axpb(const float *a, const float *b, float *out, float scale,\n"
    "                                 const u64 *meta)\n"
    "{\n"
    "    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;\n"
    "    if (i < meta[4] && i < meta[2] && i < meta[0])\n"
    "        out[i] = a[i] * scale + b[i * meta[3]];\n"
    "}\n"
    "\n"
    "/* out[0] += sum(in) via a shared-memory tree per block and one atomic per block; shared\n"
    " * memory is dynamic and larger than 48 KiB (each unit owns SPREAD slots) */\n"
    "#define SPREAD 64\n"
    "extern \"C\" __device__ u32 emk_smem_block_sum = 256 * SPREAD * sizeof(float);\n"
    "extern \"C\" __global__ void block_sum(const float *in, float *out, const u64 *meta)\n"
    "{\n"
    "    extern __shared__ float s[];\n"
    "    u32 t = threadIdx.x, i = blockIdx.x * blockDim.x + t;\n"
    "    for (u32 j = 0; j < SPREAD; j++) s[t * SPREAD + j] = 0.0f;\n"
    "    s[t * SPREAD] = i < meta[0] ? in[i] : 0.0f;\n"
    "    __syncthreads();\n"
    "    for (u32 half = blockDim.x / 2; half > 0; half /= 2) {\n"
    "        if (t < half) s[t * SPREAD] += s[(t + half) * SPREAD];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (t == 0) atomicAdd(out, s[0]);\n"
    "}\n"
    "\n"
    "/* counts[0] += 1 per unit (u32), sums[0] += x (f32), maxes[0] = max(pos), warp sums */\n"
    "extern \"C\" __global__ void atomics(u32 *counts, float *sums, u32 *maxes, float *warp_sums,\n"
    "                                    float x, const u64 *meta)\n"
    "{\n"
    "    u32 i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    atomicAdd(counts, 1u);\n"
    "    atomicAdd(sums, x);\n"
    "    atomicMax(maxes, i);\n"
    "    float v = (float)(i % 32);\n"
    "    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    if (threadIdx.x % 32 == 0) atomicAdd(warp_sums, v);\n"
    "}\n"
    "\n"
    "/* out[i] = (float)(h[i] + hs) + (float)(b[i] + bs) + ds + ls in half and bfloat16 arithmetic;\n"
    " * scalars of every width between the buffers (f16/bf16 scalars travel as float, bool as\n"
    " * unsigned char) */\n"
    "extern \"C\" __global__ void halves(const __half *h, const __nv_bfloat16 *b, float *out,\n"
    "                                   float hs, float bs, double ds, long long ls,\n"
    "                                   unsigned char flag, signed char c, short sh, const u64 *meta)\n"
    "{\n"
    "    u32 i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < meta[2])\n"
    "        out[i] = __half2float(h[i] + __float2half(hs)) +\n"
    "                 __bfloat162float(b[i] + __float2bfloat16(bs)) + (float)ds + (float)ls +\n"
    "                 (flag ? 1000.0f : 0.0f) + (float)c + (float)sh;\n"
    "}\n"
    "\n"
    "/* spins for roughly `cycles` clock ticks (for timing events) */\n"
    "extern \"C\" __global__ void spin(u64 *out, u64 cycles, const u64 *meta)\n"
    "{\n"
    "    u64 t0 = clock64();\n"
    "    while (clock64() - t0 < cycles) {}\n"
    "    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = clock64() - t0;\n"
    "}\n"
    "\n"
    "/* out[0] = the number of metadata words this launch got, counted up to a sentinel: checks\n"
    " * that metadata of many launches in a row stays intact (out[j] = meta[j] for j < n) */\n"
    "extern \"C\" __global__ void meta_echo(u64 *out, u32 n, const u64 *meta)\n"
    "{\n"
    "    u32 j = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (j < n) out[j] = meta[j];\n"
    "}\n";

/* Skips the calling test when NVRTC cannot be loaded. */
#define CU_SKIP_WITHOUT_NVRTC()                                                                    \
    do {                                                                                           \
        char why_[512];                                                                            \
        if (!em_nvrtc_available(why_, sizeof(why_))) {                                             \
            fprintf(stderr, "skipped: %s\n", why_);                                                \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* True when image is an ELF cubin for an NVIDIA GPU (machine 190) of the given sm (e.g. 90): the
 * low byte of e_flags holds the SM version in cubins. */
static inline bool cu_is_cubin(const void *image, size_t size, unsigned sm)
{
    const unsigned char *p = image;
    if (size < 64 || memcmp(p, "\177ELF", 4) != 0 || p[4] != 2)
        return false;
    unsigned machine = (unsigned)(p[18] | p[19] << 8);
    unsigned flags = (unsigned)(p[48] | p[49] << 8 | p[50] << 16);
    return machine == 190 && ((flags & 0xff) == sm || ((flags >> 8) & 0xff) == sm);
}

/* ---- IR kernels for the CUDA code generator ------------------------------------------------ */

/* out[0] += sum(in): each cube sums its units' values through shared memory (after a barrier);
 * unit 0 adds the cube's sum atomically. Unit u's value sits at s[u * spread], so the shared
 * array holds 256 * spread floats: spread 64 makes 64 KiB, more than fits statically, which the
 * generator puts in dynamic shared memory. Launch with cube_dim.x == 256. */
static inline em_ir_kernel *cu_ir_shared_sum_spread(const char *name, uint32_t spread)
{
    em_ir_kernel *k = em_ir_kernel_new(name);
    em_type f = em_ty(EM_F32), u = em_ty(EM_U32);
    em_ir_mem in = em_ir_param_buffer(k, "in", f, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_READ_WRITE, 0);
    em_ir_mem s = em_ir_shared(k, "s", f, 256 * spread);
    em_ir_val unit = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val sp = em_ir_u32(k, spread);
    em_ir_val v = em_ir_var(k, f, "v");
    em_ir_assign(k, v, em_ir_const_float(k, f, 0.0));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_len(k, in)));
    em_ir_assign(k, v, em_ir_load(k, in, pos));
    em_ir_end(k);
    em_ir_store(k, s, em_ir_binary(k, EM_OP_MUL, unit, sp), v);
    em_ir_sync_cube(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, unit, em_ir_u32(k, 0)));
    em_ir_val acc = em_ir_var(k, f, "acc");
    em_ir_assign(k, acc, em_ir_const_float(k, f, 0.0));
    em_ir_val j = em_ir_var(k, u, "j");
    em_ir_range_begin(k, j, em_ir_u32(k, 0), em_ir_u32(k, 256), em_ir_u32(k, 1), false);
    em_ir_assign(k, acc, em_ir_binary(k, EM_OP_ADD, acc,
                                      em_ir_load(k, s, em_ir_binary(k, EM_OP_MUL, j, sp))));
    em_ir_end(k);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, out, em_ir_u32(k, 0), acc, EM_IR_NONE);
    em_ir_end(k);
    return k;
}

static inline em_ir_kernel *cu_ir_shared_sum(void)
{
    return cu_ir_shared_sum_spread("shared_sum", 1);
}

/* The same in 64 KiB of shared memory (dynamic shared memory on CUDA). */
static inline em_ir_kernel *cu_ir_big_shared_sum(void)
{
    return cu_ir_shared_sum_spread("big_shared_sum", 64);
}

/* out[0] += sum(in) through plane sums: lane 0 of each plane adds its plane's sum. */
static inline em_ir_kernel *cu_ir_plane_sum(void)
{
    em_ir_kernel *k = em_ir_kernel_new("plane_sum");
    em_type f = em_ty(EM_F32);
    em_ir_mem in = em_ir_param_buffer(k, "in", f, EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_READ_WRITE, 0);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val v = em_ir_var(k, f, "v");
    em_ir_assign(k, v, em_ir_const_float(k, f, 0.0));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_len(k, in)));
    em_ir_assign(k, v, em_ir_load(k, in, pos));
    em_ir_end(k);
    em_ir_val total = em_ir_plane(k, EM_OP_PLANE_SUM, v, EM_IR_NONE);
    em_ir_val lane = em_ir_builtin(k, EM_UNIT_POS_PLANE);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, lane, em_ir_u32(k, 0)));
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, out, em_ir_u32(k, 0), total, EM_IR_NONE);
    em_ir_end(k);
    return k;
}

/* out[i] = x[i] * s + (f32)h[i] over a rank-2 tensor view of x (shape and strides read from the
 * metadata) and a plain f16 array h; s is a scalar parameter. */
static inline em_ir_kernel *cu_ir_tensor_scale(void)
{
    em_ir_kernel *k = em_ir_kernel_new("tensor_scale");
    em_type f = em_ty(EM_F32);
    em_ir_mem x = em_ir_param_buffer(k, "x", f, EM_READ, 2);
    em_ir_mem h = em_ir_param_buffer(k, "h", em_ty(EM_F16), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", f, EM_WRITE, 0);
    em_ir_val s = em_ir_param_scalar(k, "s", f);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val rows = em_ir_shape(k, x, 0), cols = em_ir_shape(k, x, 1);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_binary(k, EM_OP_MUL, rows, cols)));
    em_ir_val r = em_ir_binary(k, EM_OP_DIV, pos, cols);
    em_ir_val c = em_ir_binary(k, EM_OP_REM, pos, cols);
    em_ir_val at = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, r, em_ir_stride(k, x, 0)),
                                em_ir_binary(k, EM_OP_MUL, c, em_ir_stride(k, x, 1)));
    em_ir_val hv = em_ir_cast(k, f, em_ir_load(k, h, pos));
    em_ir_val y = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, em_ir_load(k, x, at), s),
                               hv);
    em_ir_store(k, out, pos, y);
    em_ir_end(k);
    return k;
}

/* The device named by $EMBER_TEST_DEVICE when it is a CUDA device, else "cuda:0". */
static inline const char *cu_test_device(void)
{
    const char *env = getenv("EMBER_TEST_DEVICE");
    return env && strncmp(env, "cuda", 4) == 0 ? env : "cuda:0";
}

#endif
