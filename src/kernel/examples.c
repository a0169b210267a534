/* examples.c — the sample kernels of examples.h, written with the IR builder the way the fusion
 * engine writes generated kernels: one function per sample, straight-line builder calls. */
#include <string.h>

#include "base/base.h"
#include "kernel/examples.h"

static em_ir_kernel *example_add(void)
{
    em_ir_kernel *k = em_ir_kernel_new("add");
    if (!k) return NULL;
    em_type t = em_line(EM_F32, 4);
    em_ir_mem a = em_ir_param_buffer(k, "a", t, EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", t, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", t, EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val ai = em_ir_load(k, a, i), bi = em_ir_load(k, b, i);
    em_ir_val sum = em_ir_binary(k, EM_OP_ADD, ai, bi);
    em_ir_store(k, out, i, sum);
    em_ir_end(k);
    return k;
}

static em_ir_kernel *example_gelu(void)
{
    em_ir_kernel *k = em_ir_kernel_new("gelu");
    if (!k) return NULL;
    em_type t = em_line(EM_F32, 4);
    em_ir_mem in = em_ir_param_buffer(k, "input", t, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "output", t, EM_WRITE, 1);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, in)));
    em_ir_val x = em_ir_load(k, in, i);
    em_ir_val scaled =
        em_ir_binary(k, EM_OP_MUL, x, em_ir_const_float(k, em_ty(EM_F32), 0.70710678118654752));
    em_ir_val e = em_ir_unary(k, EM_OP_ERF, scaled);
    em_ir_val one = em_ir_binary(k, EM_OP_ADD, e, em_ir_const_float(k, em_ty(EM_F32), 1.0));
    em_ir_val y = em_ir_binary(k, EM_OP_MUL, em_ir_binary(k, EM_OP_MUL, x, one),
                               em_ir_const_float(k, em_ty(EM_F32), 0.5));
    em_ir_store(k, out, i, y);
    em_ir_end(k);
    return k;
}

static em_ir_kernel *example_reduce_sum(void)
{
    em_ir_kernel *k = em_ir_kernel_new("reduce_sum");
    if (!k) return NULL;
    em_ir_set_cube_dim(k, 256, 1, 1);
    em_type f = em_ty(EM_F32), u = em_ty(EM_U32);
    em_ir_mem in = em_ir_param_buffer(k, "input", f, EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "output", f, EM_WRITE, 1);
    em_ir_mem part = em_ir_shared(k, "partial", f, 256);
    em_ir_val unit = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    /* load one element per unit (zero past the end) */
    em_ir_val x = em_ir_var(k, f, "x");
    em_ir_assign(k, x, em_ir_const_float(k, f, 0.0));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, in)));
    em_ir_assign(k, x, em_ir_load(k, in, i));
    em_ir_end(k);
    em_ir_store(k, part, unit, x);
    em_ir_sync_cube(k);
    /* tree reduction: strides 128, 64, ..., 1, a barrier after each step */
    em_ir_val step = em_ir_var(k, u, "step");
    em_ir_range_begin(k, step, em_ir_u32(k, 0), em_ir_u32(k, 8), em_ir_u32(k, 1), false);
    em_ir_val stride = em_ir_binary(k, EM_OP_SHR, em_ir_u32(k, 128), step);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, unit, stride));
    em_ir_val other = em_ir_load(k, part, em_ir_binary(k, EM_OP_ADD, unit, stride));
    em_ir_store(k, part, unit, em_ir_binary(k, EM_OP_ADD, em_ir_load(k, part, unit), other));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_end(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, unit, em_ir_u32(k, 0)));
    em_ir_val cube = em_ir_builtin(k, EM_CUBE_POS);
    em_ir_store(k, out, cube, em_ir_load(k, part, em_ir_u32(k, 0)));
    em_ir_end(k);
    return k;
}

/* shared[ty * 16 + tx] = (row < rows && col < cols) ? src[row * cols + col] : 0 */
static void load_tile(em_ir_kernel *k, em_ir_mem dst, em_ir_mem src, em_ir_val slot, em_ir_val row,
                      em_ir_val col, em_ir_val rows, em_ir_val cols)
{
    em_ir_val in_rows = em_ir_binary(k, EM_OP_LT, row, rows);
    em_ir_val inside = em_ir_binary(k, EM_OP_AND, in_rows, em_ir_binary(k, EM_OP_LT, col, cols));
    em_ir_if_begin(k, inside);
    em_ir_val at = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, row, cols), col);
    em_ir_store(k, dst, slot, em_ir_load(k, src, at));
    em_ir_else(k);
    em_ir_store(k, dst, slot, em_ir_const_float(k, em_ty(EM_F32), 0.0));
    em_ir_end(k);
}

static em_ir_kernel *example_matmul_tiled(void)
{
    enum { T = 16 };
    em_ir_kernel *k = em_ir_kernel_new("matmul_tiled");
    if (!k) return NULL;
    em_ir_set_cube_dim(k, T, T, 1);
    em_type f = em_ty(EM_F32), u = em_ty(EM_U32);
    em_ir_mem a = em_ir_param_buffer(k, "a", f, EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", f, EM_READ, 1);
    em_ir_mem c = em_ir_param_buffer(k, "c", f, EM_WRITE, 1);
    em_ir_val m = em_ir_param_scalar(k, "M", u);
    em_ir_val n = em_ir_param_scalar(k, "N", u);
    em_ir_val kd = em_ir_param_scalar(k, "K", u);
    em_ir_mem as = em_ir_shared(k, "a_tile", f, T * T);
    em_ir_mem bs = em_ir_shared(k, "b_tile", f, T * T);
    em_ir_val tx = em_ir_builtin(k, EM_UNIT_POS_X), ty = em_ir_builtin(k, EM_UNIT_POS_Y);
    em_ir_val row = em_ir_builtin(k, EM_ABSOLUTE_POS_Y), col = em_ir_builtin(k, EM_ABSOLUTE_POS_X);
    em_ir_val tile = em_ir_u32(k, T);
    em_ir_val slot = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, ty, tile), tx);
    em_ir_val tiles =
        em_ir_binary(k, EM_OP_DIV, em_ir_binary(k, EM_OP_ADD, kd, em_ir_u32(k, T - 1)), tile);
    em_ir_val acc = em_ir_var(k, f, "acc");
    em_ir_assign(k, acc, em_ir_const_float(k, f, 0.0));
    em_ir_val t = em_ir_var(k, u, "t");
    em_ir_range_begin(k, t, em_ir_u32(k, 0), tiles, em_ir_u32(k, 1), false);
    em_ir_val base = em_ir_binary(k, EM_OP_MUL, t, tile);
    load_tile(k, as, a, slot, row, em_ir_binary(k, EM_OP_ADD, base, tx), m, kd);
    load_tile(k, bs, b, slot, em_ir_binary(k, EM_OP_ADD, base, ty), col, kd, n);
    em_ir_sync_cube(k);
    em_ir_val kk = em_ir_var(k, u, "kk");
    em_ir_range_begin(k, kk, em_ir_u32(k, 0), tile, em_ir_u32(k, 1), true);
    em_ir_val av =
        em_ir_load(k, as, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, ty, tile), kk));
    em_ir_val bv =
        em_ir_load(k, bs, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, kk, tile), tx));
    em_ir_assign(k, acc, em_ir_ternary(k, EM_OP_FMA, av, bv, acc));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_end(k);
    em_ir_val in_rows = em_ir_binary(k, EM_OP_LT, row, m);
    em_ir_val inside = em_ir_binary(k, EM_OP_AND, in_rows, em_ir_binary(k, EM_OP_LT, col, n));
    em_ir_if_begin(k, inside);
    em_ir_store(k, c, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, row, n), col), acc);
    em_ir_end(k);
    return k;
}

static em_ir_kernel *example_matmul_mma(void)
{
    enum { T = 16 };
    em_ir_kernel *k = em_ir_kernel_new("matmul_mma");
    if (!k) return NULL;
    em_type u = em_ty(EM_U32);
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F16), EM_READ, 1);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_F16), EM_READ, 1);
    em_ir_mem c = em_ir_param_buffer(k, "c", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_val n = em_ir_param_scalar(k, "N", u);
    em_ir_val kd = em_ir_param_scalar(k, "K", u);
    em_ir_val fa = em_ir_matrix(k, EM_MAT_A, EM_F16, T, T, T, EM_ROW_MAJOR, "fa");
    em_ir_val fb = em_ir_matrix(k, EM_MAT_B, EM_F16, T, T, T, EM_ROW_MAJOR, "fb");
    em_ir_val acc = em_ir_matrix(k, EM_MAT_ACC, EM_F32, T, T, T, EM_ROW_MAJOR, "acc");
    /* one plane per tile: the tile is (CUBE_POS_Y * planes + PLANE_POS) over the x axis */
    em_ir_val cube_dim = em_ir_builtin(k, EM_CUBE_DIM);
    em_ir_val planes = em_ir_binary(k, EM_OP_DIV, cube_dim, em_ir_builtin(k, EM_PLANE_DIM));
    em_ir_val tile_x = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_POS_X), planes);
    tile_x = em_ir_binary(k, EM_OP_ADD, tile_x, em_ir_builtin(k, EM_PLANE_POS));
    em_ir_val row0 = em_ir_binary(k, EM_OP_MUL, em_ir_builtin(k, EM_CUBE_POS_Y), em_ir_u32(k, T));
    em_ir_val col0 = em_ir_binary(k, EM_OP_MUL, tile_x, em_ir_u32(k, T));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, col0, n));
    em_ir_mat_fill(k, acc, em_ir_const_float(k, em_ty(EM_F32), 0.0));
    em_ir_val kk = em_ir_var(k, u, "kk");
    em_ir_range_begin(k, kk, em_ir_u32(k, 0), kd, em_ir_u32(k, T), false);
    em_ir_mat_load(k, fa, a, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, row0, kd), kk),
                   kd, EM_ROW_MAJOR);
    em_ir_mat_load(k, fb, b, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, kk, n), col0), n,
                   EM_ROW_MAJOR);
    em_ir_mat_mma(k, acc, fa, fb, acc);
    em_ir_end(k);
    em_ir_mat_store(k, c, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, row0, n), col0), n,
                    acc, EM_ROW_MAJOR);
    em_ir_end(k);
    return k;
}

static em_ir_kernel *example_histogram(void)
{
    em_ir_kernel *k = em_ir_kernel_new("histogram");
    if (!k) return NULL;
    em_type u = em_ty(EM_U32);
    em_ir_mem in = em_ir_param_buffer(k, "input", u, EM_READ, 1);
    em_ir_mem bins = em_ir_param_buffer(k, "bins", u, EM_READ_WRITE, 1);
    em_ir_val nbins = em_ir_param_scalar(k, "nbins", u);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, in)));
    em_ir_val bin = em_ir_binary(k, EM_OP_REM, em_ir_load(k, in, i), nbins);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, bins, bin, em_ir_u32(k, 1), EM_IR_NONE);
    em_ir_end(k);
    return k;
}

typedef struct example {
    const char *name;             /* sample name */
    em_ir_kernel *(*build)(void); /* builds a fresh kernel */
} example;

static const example examples[] = {
    {"add", example_add},
    {"gelu", example_gelu},
    {"reduce_sum", example_reduce_sum},
    {"matmul_tiled", example_matmul_tiled},
    {"matmul_mma", example_matmul_mma},
    {"histogram", example_histogram},
};

static const char *const example_names[] = {"add",        "gelu",      "reduce_sum", "matmul_tiled",
                                            "matmul_mma", "histogram", NULL};

const char *const *em_ir_example_names(void)
{
    return example_names;
}

em_ir_kernel *em_ir_example(const char *name)
{
    for (size_t i = 0; name && i < EM_ARRAY_LEN(examples); i++)
        if (strcmp(name, examples[i].name) == 0) return examples[i].build();
    em_set_error(EM_ERR_NOT_FOUND,
                 "no example kernel named '%s' (there are: add, gelu, reduce_sum, matmul_tiled, "
                 "matmul_mma, histogram)",
                 name ? name : "");
    return NULL;
}
