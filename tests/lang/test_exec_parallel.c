/* test_exec_parallel.c — kernel-language programs that use cubes, memory and cooperation, run on
 * the CPU device and compared with references computed here in C: a tiled matmul with shared
 * memory, the built-in cube reduction (plane ops + shared memory), a prefix sum, an atomic
 * histogram (shared and global atomics), every atomic, every plane op, cooperative matrices,
 * positions in a 3-D launch, tensor shape/stride with a line width picked by em_pick_line_width
 * for contiguous and strided inputs, and one generic kernel instantiated for f16, f32 and f64. */
#include "lang/lang_util.h"

/* ---- matmul with shared memory ----------------------------------------------------------------
 */

static const char *matmul_src =
    "kernel<F: float> void matmul(const tensor(F) a, const tensor(F) b, tensor(F) c, u32 M, u32 "
    "N,\n"
    "                             u32 K, comptime u32 TILE = 8)\n"
    "{\n"
    "    shared F ta[TILE * TILE];\n"
    "    shared F tb[TILE * TILE];\n"
    "    u32 row = CUBE_POS_Y * TILE + UNIT_POS_Y;\n"
    "    u32 col = CUBE_POS_X * TILE + UNIT_POS_X;\n"
    "    F acc = F(0);\n"
    "    for (u32 t in range(0, K, TILE)) {\n"
    "        u32 ak = t + UNIT_POS_X;\n"
    "        u32 bk = t + UNIT_POS_Y;\n"
    "        ta[UNIT_POS_Y * TILE + UNIT_POS_X] = row < M && ak < K ? a[row * K + ak] : F(0);\n"
    "        tb[UNIT_POS_Y * TILE + UNIT_POS_X] = bk < K && col < N ? b[bk * N + col] : F(0);\n"
    "        sync_cube();\n"
    "        comptime for (u32 k in range(TILE)) {\n"
    "            acc += ta[UNIT_POS_Y * TILE + k] * tb[k * TILE + UNIT_POS_X];\n"
    "        }\n"
    "        sync_cube();\n"
    "    }\n"
    "    if (row < M && col < N) { c[row * N + col] = acc; }\n"
    "}\n";

static void test_tiled_matmul_shared(void **state)
{
    (void)state;
    em_lang_module *m = must_load(matmul_src);
    enum { M = 19, K = 23, NN = 13, T = 8 };
    float a[M * K], b[K * NN], c[M * NN];
    for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7) % 11) - 5.0f;
    for (int i = 0; i < K * NN; i++) b[i] = (float)((i * 5) % 13) * 0.25f - 1.0f;
    em_buffer *ba = buf_new(a, sizeof(a)), *bb = buf_new(b, sizeof(b)),
              *bc = buf_new(NULL, sizeof(c));
    em_lang_bind binds[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("TILE", T)};
    em_lang_spec spec = {binds, 2, 1, NULL};
    em_arg args[] = {em_arg_buffer(ba, M * K),
                     em_arg_buffer(bb, K * NN),
                     em_arg_buffer(bc, M * NN),
                     em_arg_u32(M),
                     em_arg_u32(NN),
                     em_arg_u32(K)};
    uint32_t cubes[3] = {(NN + T - 1) / T, (M + T - 1) / T, 1}, units[3] = {T, T, 1};
    launch_3d(m, "matmul", &spec, cubes, units, args, 6);
    buf_get(bc, c, sizeof(c));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < NN; j++) {
            double ref = 0;
            for (int k = 0; k < K; k++) ref += (double)a[i * K + k] * b[k * NN + j];
            assert_true(fabs(c[i * NN + j] - ref) < 1e-3);
        }
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bc);
    em_lang_module_free(m);
}

/* ---- reduction, prefix sum, histogram ---------------------------------------------------------
 */

static void test_builtin_cube_reduction(void **state)
{
    (void)state;
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    enum { L = 1000, CUBE = 64, ITEMS = 4, CUBES = (L + CUBE * ITEMS - 1) / (CUBE * ITEMS) };
    int32_t x[L], out[CUBES];
    for (int i = 0; i < L; i++) x[i] = (i * 31) % 97 - 40;
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(out));
    em_lang_bind binds[] = {em_lang_bind_type("F", EM_I32), em_lang_bind_int("CUBE", CUBE),
                            em_lang_bind_int("ITEMS", ITEMS)};
    em_lang_spec spec = {binds, 3, 1, NULL};
    em_arg args[] = {em_arg_buffer(a, L), em_arg_buffer(b, CUBES)};
    launch_x(m, "sum_cubes", &spec, CUBES, CUBE, args, 2);
    buf_get(b, out, sizeof(out));
    for (int c = 0; c < CUBES; c++) {
        int32_t ref = 0;
        for (int i = c * CUBE * ITEMS; i < (c + 1) * CUBE * ITEMS && i < L; i++) ref += x[i];
        assert_int_equal(out[c], ref);
    }
    em_buffer_free(a);
    em_buffer_free(b);
}

static const char *scan_src =
    "/* inclusive prefix sum of each cube's block: Hillis-Steele steps unrolled at compile time,\n"
    " * ping-ponging between the two halves of a shared buffer; plane_inclusive_sum first scans "
    "each\n"
    " * plane, so that the shared steps only have to combine whole planes on wide planes */\n"
    "kernel void scan(const tensor(u32) input, tensor(u32) output, comptime u32 CUBE = 64,\n"
    "                 comptime u32 LOG = 6)\n"
    "{\n"
    "    shared u32 buf[2 * CUBE];\n"
    "    u32 i = ABSOLUTE_POS;\n"
    "    u32 x = i < len(input) ? input[i] : 0;\n"
    "    u32 inplane = plane_inclusive_sum(x) - plane_exclusive_sum(x);\n"
    "    buf[UNIT_POS] = inplane;\n"
    "    sync_cube();\n"
    "    comptime for (u32 s in range(LOG)) {\n"
    "        comptime u32 src = (s % 2) * CUBE;\n"
    "        comptime u32 dst = CUBE - src;\n"
    "        u32 v = buf[src + UNIT_POS];\n"
    "        if (UNIT_POS >= 1 << s) { v += buf[src + UNIT_POS - (1 << s)]; }\n"
    "        buf[dst + UNIT_POS] = v;\n"
    "        sync_cube();\n"
    "    }\n"
    "    if (i < len(output)) { output[i] = buf[(LOG % 2) * CUBE + UNIT_POS]; }\n"
    "}\n";

static void test_prefix_sum(void **state)
{
    (void)state;
    em_lang_module *m = must_load(scan_src);
    enum { L = 300, CUBE = 64 };
    uint32_t x[L], out[L];
    for (int i = 0; i < L; i++) x[i] = (uint32_t)((i * 13) % 17);
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(a, L), em_arg_buffer(b, L)};
    launch_x(m, "scan", NULL, (L + CUBE - 1) / CUBE, CUBE, args, 2);
    buf_get(b, out, sizeof(out));
    uint32_t run = 0;
    for (int i = 0; i < L; i++) {
        if (i % CUBE == 0) run = 0;
        run += x[i];
        assert_int_equal(out[i], run);
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

static const char *hist_src =
    "/* per-cube counts in shared memory, then one global atomic per bin and cube */\n"
    "kernel void histogram(const tensor(u32) input, tensor(u32) bins, comptime u32 NBINS = 16)\n"
    "{\n"
    "    shared u32 local[NBINS];\n"
    "    for (u32 b in range(UNIT_POS, NBINS, CUBE_DIM)) { local[b] = 0; }\n"
    "    sync_cube();\n"
    "    for (u32 i in range(ABSOLUTE_POS, len(input), CUBE_DIM * CUBE_COUNT)) {\n"
    "        atomic_add(local, input[i] % NBINS, 1);\n"
    "    }\n"
    "    sync_cube();\n"
    "    for (u32 b in range(UNIT_POS, NBINS, CUBE_DIM)) {\n"
    "        if (local[b] > 0) { atomic_add(bins, b, local[b]); }\n"
    "    }\n"
    "}\n";

static void test_atomic_histogram(void **state)
{
    (void)state;
    em_lang_module *m = must_load(hist_src);
    enum { L = 5000, NB = 16 };
    uint32_t x[L], bins[NB], ref[NB] = {0};
    for (int i = 0; i < L; i++) {
        x[i] = (uint32_t)(i * i * 7 + i) % 1009;
        ref[x[i] % NB]++;
    }
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(bins));
    em_arg args[] = {em_arg_buffer(a, L), em_arg_buffer(b, NB)};
    launch_x(m, "histogram", NULL, 7, 32, args, 2);
    buf_get(b, bins, sizeof(bins));
    for (int i = 0; i < NB; i++) assert_int_equal(bins[i], ref[i]);
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- atomics and plane ops ---------------------------------------------------------------------
 */

static const char *atomics_src =
    "kernel void atomics(tensor(i32) v, tensor(f32) f, tensor(i32) old)\n"
    "{\n"
    "    i32 x = i32(ABSOLUTE_POS) - 20;\n"
    "    atomic_add(v, 0, x);\n"
    "    atomic_sub(v, 1, x);\n"
    "    atomic_min(v, 2, x);\n"
    "    atomic_max(v, 3, x);\n"
    "    atomic_and(v, 4, ~(1 << (ABSOLUTE_POS % 31)));\n"
    "    atomic_or(v, 5, 1 << (ABSOLUTE_POS % 31));\n"
    "    atomic_xor(v, 6, x);\n"
    "    atomic_add(f, 0, 0.5);\n"
    "    if (ABSOLUTE_POS == 7) {\n"
    "        old[0] = atomic_exchange(v, 7, 42);\n"
    "        old[1] = atomic_compare_exchange(v, 8, 5, 9);\n"
    "        old[2] = atomic_compare_exchange(v, 9, 6, 9);\n"
    "        atomic_store(v, 10, 77);\n"
    "        old[3] = atomic_load(v, 10);\n"
    "        f32 prev = atomic_exchange(f, 1, 2.5);\n"
    "        old[4] = i32(prev);\n"
    "    }\n"
    "}\n";

static void test_all_atomics(void **state)
{
    (void)state;
    em_lang_module *m = must_load(atomics_src);
    enum { U = 100 };
    int32_t v[11] = {0, 0, 1000, -1000, -1, 0, 0, 3, 5, 5, 0}, old[5];
    float f[2] = {0, 1.5f};
    em_buffer *bv = buf_new(v, sizeof(v)), *bf = buf_new(f, sizeof(f)),
              *bo = buf_new(NULL, sizeof(old));
    em_arg args[] = {em_arg_buffer(bv, 11), em_arg_buffer(bf, 2), em_arg_buffer(bo, 5)};
    launch_x(m, "atomics", NULL, 4, U / 4, args, 3);
    buf_get(bv, v, sizeof(v));
    buf_get(bf, f, sizeof(f));
    buf_get(bo, old, sizeof(old));
    int32_t sum = 0, xr = 0;
    uint32_t bits = 0;
    for (int i = 0; i < U; i++) {
        sum += i - 20;
        xr ^= i - 20;
        bits |= 1u << (i % 31);
    }
    assert_int_equal(v[0], sum);
    assert_int_equal(v[1], -sum);
    assert_int_equal(v[2], -20);
    assert_int_equal(v[3], U - 21);
    assert_int_equal((uint32_t)v[4], ~bits);
    assert_int_equal((uint32_t)v[5], bits);
    assert_int_equal(v[6], xr);
    assert_int_equal(v[7], 42);
    assert_int_equal(v[8], 9); /* 5 == 5: swapped */
    assert_int_equal(v[9], 5); /* 5 != 6: kept */
    assert_int_equal(v[10], 77);
    assert_int_equal(old[0], 3);
    assert_int_equal(old[1], 5);
    assert_int_equal(old[2], 5);
    assert_int_equal(old[3], 77);
    assert_int_equal(old[4], 1);
    assert_true(fabsf(f[0] - U * 0.5f) < 1e-4f);
    assert_true(fabsf(f[1] - 2.5f) < 1e-6f);
    em_buffer_free(bv);
    em_buffer_free(bf);
    em_buffer_free(bo);
    em_lang_module_free(m);
}

static const char *plane_src = "kernel void planes(const tensor(f32) x, tensor(f32) out)\n"
                               "{\n"
                               "    u32 i = ABSOLUTE_POS;\n"
                               "    f32 v = x[i];\n"
                               "    bool pos = v > 0.0;\n"
                               "    u32 o = i * 16;\n"
                               "    out[o + 0] = plane_sum(v);\n"
                               "    out[o + 1] = plane_prod(v);\n"
                               "    out[o + 2] = plane_min(v);\n"
                               "    out[o + 3] = plane_max(v);\n"
                               "    out[o + 4] = plane_inclusive_sum(v);\n"
                               "    out[o + 5] = plane_exclusive_sum(v);\n"
                               "    out[o + 6] = plane_all(pos) ? 1.0 : 0.0;\n"
                               "    out[o + 7] = plane_any(pos) ? 1.0 : 0.0;\n"
                               "    out[o + 8] = f32(plane_ballot(pos));\n"
                               "    out[o + 9] = plane_broadcast(v, 0);\n"
                               "    out[o + 10] = plane_shuffle(v, UNIT_POS_PLANE);\n"
                               "    out[o + 11] = plane_shuffle_xor(v, 0);\n"
                               "    out[o + 12] = plane_shuffle_up(v, 1);\n"
                               "    out[o + 13] = plane_shuffle_down(v, 1);\n"
                               "    sync_plane();\n"
                               "    fence_cube();\n"
                               "    fence_device();\n"
                               "    out[o + 14] = f32(PLANE_DIM);\n"
                               "    out[o + 15] = f32(UNIT_POS_PLANE);\n"
                               "}\n";

/* On the CPU a plane is one unit (PLANE_DIM 1): every op sees only the unit's own value. */
static void test_plane_ops(void **state)
{
    (void)state;
    assert_int_equal(em_device_caps(g_dev)->plane_dim, 1);
    em_lang_module *m = must_load(plane_src);
    enum { U = 32 };
    float x[U], out[U * 16];
    for (int i = 0; i < U; i++) x[i] = (float)(i % 5) - 2.0f;
    em_buffer *a = buf_new(x, sizeof(x)), *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(a, U), em_arg_buffer(b, U * 16)};
    launch_x(m, "planes", NULL, 2, U / 2, args, 2);
    buf_get(b, out, sizeof(out));
    for (int i = 0; i < U; i++) {
        float v = x[i], p = v > 0 ? 1.0f : 0.0f;
        float want[16] = {v, v, v, v, v, 0, p, p, p, v, v, v, v, v, 1, 0};
        for (int k = 0; k < 16; k++) {
            if (out[i * 16 + k] != want[k]) {
                fprintf(stderr, "unit %d plane op #%d: got %g want %g\n", i, k, out[i * 16 + k],
                        want[k]);
                fail();
            }
        }
    }
    em_buffer_free(a);
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- cooperative matrices
 * ------------------------------------------------------------------------ */

static const char *mma_src =
    "/* c = a * b + bias for 16x16 blocks: f16 inputs, f32 accumulation */\n"
    "kernel void mma16(const tensor(f16) a, const tensor(f16) b, tensor(f32) c, f32 bias)\n"
    "{\n"
    "    matrix(a, f16, 16, 16, 16, row_major) fa;\n"
    "    matrix(b, f16, 16, 16, 16, row_major) fb;\n"
    "    matrix(acc, f32, 16, 16, 16) fc;\n"
    "    mat_fill(fc, bias);\n"
    "    mat_load(fa, a, 0, 16);\n"
    "    mat_load(fb, b, 0, 16, row_major);\n"
    "    mat_mma(fc, fa, fb, fc);\n"
    "    mat_store(fc, c, 0, 16, row_major);\n"
    "}\n";

static void test_cooperative_matrix(void **state)
{
    (void)state;
    em_lang_module *m = must_load(mma_src);
    uint16_t a[256], b[256];
    float fa[256], fb[256], c[256];
    for (int i = 0; i < 256; i++) {
        fa[i] = (float)((i * 3) % 7) - 3.0f;
        fb[i] = (float)((i * 5) % 9) * 0.5f - 2.0f;
        a[i] = f16_from_float(fa[i]);
        b[i] = f16_from_float(fb[i]);
    }
    em_buffer *ba = buf_new(a, sizeof(a)), *bb = buf_new(b, sizeof(b)),
              *bc = buf_new(NULL, sizeof(c));
    em_arg args[] = {em_arg_buffer(ba, 256), em_arg_buffer(bb, 256), em_arg_buffer(bc, 256),
                     em_arg_f32(0.25f)};
    launch_x(m, "mma16", NULL, 1, 1, args, 4);
    buf_get(bc, c, sizeof(c));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double ref = 0.25;
            for (int k = 0; k < 16; k++) ref += (double)fa[i * 16 + k] * fb[k * 16 + j];
            assert_true(fabs(c[i * 16 + j] - ref) < 1e-3);
        }
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bc);
    em_lang_module_free(m);
}

/* The fragment layout as a comptime choice: b stored transposed and read column-major when T. */
static const char *mma_layout_src =
    "kernel void mma_t(const tensor(f16) a, const tensor(f16) b, tensor(f32) c,\n"
    "                  comptime bool T = false)\n"
    "{\n"
    "    matrix(a, f16, 16, 16, 16) fa;\n"
    "    matrix(b, f16, 16, 16, 16, T ? col_major : row_major) fb;\n"
    "    matrix(acc, f32, 16, 16, 16) fc;\n"
    "    mat_fill(fc, 0.0);\n"
    "    mat_load(fa, a, 0, 16);\n"
    "    mat_load(fb, b, 0, 16, T ? col_major : row_major);\n"
    "    mat_mma(fc, fa, fb, fc);\n"
    "    mat_store(fc, c, 0, 16, row_major);\n"
    "}\n";

static void test_matrix_layout_comptime(void **state)
{
    (void)state;
    em_lang_module *m = must_load(mma_layout_src);
    uint16_t a[256], b[256], bt[256];
    float fa[256], fb[256], c[2][256];
    for (int i = 0; i < 256; i++) {
        fa[i] = (float)((i * 5) % 7) - 3.0f;
        fb[i] = (float)((i * 3) % 11) * 0.25f - 1.0f;
        a[i] = f16_from_float(fa[i]);
        b[i] = f16_from_float(fb[i]);
    }
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < 16; j++) bt[j * 16 + k] = b[k * 16 + j];
    for (int t = 0; t < 2; t++) {
        em_buffer *ba = buf_new(a, sizeof(a)), *bb = buf_new(t ? bt : b, sizeof(b)),
                  *bc = buf_new(NULL, sizeof(c[t]));
        em_arg args[] = {em_arg_buffer(ba, 256), em_arg_buffer(bb, 256), em_arg_buffer(bc, 256)};
        em_lang_bind bind = em_lang_bind_bool("T", t == 1);
        em_lang_spec spec = {&bind, 1, 1, NULL};
        launch_x(m, "mma_t", &spec, 1, 1, args, 3);
        buf_get(bc, c[t], sizeof(c[t]));
        em_buffer_free(ba);
        em_buffer_free(bb);
        em_buffer_free(bc);
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double ref = 0;
            for (int k = 0; k < 16; k++) ref += (double)fa[i * 16 + k] * fb[k * 16 + j];
            assert_true(fabs(c[0][i * 16 + j] - ref) < 1e-3);
            assert_true(fabs(c[1][i * 16 + j] - ref) < 1e-3);
        }
    em_lang_module_free(m);
}

/* ---- asynchronous copies (plain copies on the CPU) ------------------------------------------- */

static const char *copy_src =
    "kernel void stage(const tensor(f16) h, const tensor(f32) f, tensor(f32) out, u32 n)\n"
    "    cube_dim(8)\n"
    "{\n"
    "    shared f16 sh[64];\n"
    "    shared f32 sf[8];\n"
    "    u32 u = UNIT_POS;\n"
    "    copy_async(sh, u * 8, h, u * 8, 8, u * 8 < n); // 16 bytes; zeros past n\n"
    "    copy_async_commit();\n"
    "    copy_async(sf, u, f, u, 1);\n"
    "    copy_async_commit();\n"
    "    copy_async_wait(1);\n"
    "    copy_async_wait(0);\n"
    "    sync_cube();\n"
    "    for (u32 j in range(8)) {\n"
    "        out[u * 8 + j] = f32(sh[(u * 8 + j + 8) % 64]) + sf[(u + 1) % 8];\n"
    "    }\n"
    "}\n";

static void test_copy_async(void **state)
{
    (void)state;
    em_lang_module *m = must_load(copy_src);
    uint16_t h[64];
    float f[8], out[64];
    for (int i = 0; i < 64; i++) h[i] = f16_from_float((float)i * 0.5f);
    for (int i = 0; i < 8; i++) f[i] = 1000.0f * (float)i;
    em_buffer *bh = buf_new(h, sizeof(h)), *bf = buf_new(f, sizeof(f)),
              *bo = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(bh, 64), em_arg_buffer(bf, 8), em_arg_buffer(bo, 64),
                     em_arg_u32(40)};
    launch_x(m, "stage", NULL, 1, 8, args, 4);
    buf_get(bo, out, sizeof(out));
    for (int u = 0; u < 8; u++)
        for (int j = 0; j < 8; j++) {
            int s = (u * 8 + j + 8) % 64;
            float want = (s < 40 ? (float)s * 0.5f : 0.0f) + 1000.0f * (float)((u + 1) % 8);
            assert_true(out[u * 8 + j] == want);
        }
    em_buffer_free(bh);
    em_buffer_free(bf);
    em_buffer_free(bo);
    em_lang_module_free(m);
}

/* ---- clusters: cluster_dim ---------------------------------------------------------------------
 * The IR keeps the size, CUDA compiles it as __cluster_dims__, the CPU runs the cubes as ordinary
 * ones (a rank each from CUBE_POS_X), a launch whose cubes along x are no multiple is refused,
 * and sizes outside 1..8 or more than one of them are diagnosed at their position. */

static const char *cluster_src =
    "kernel void ranks(tensor(u32) out, comptime u32 CL = 2) cube_dim(4) cluster_dim(CL)\n"
    "{\n"
    "    out[ABSOLUTE_POS] = CUBE_POS_X % CL + 10 * (CUBE_POS_X / CL);\n"
    "}\n";

static void test_cluster_dim(void **state)
{
    (void)state;
    em_lang_module *m = must_load(cluster_src);
    em_ir_kernel *k = em_lang_specialize(m, "ranks", NULL, NULL);
    assert_non_null(k);
    assert_int_equal(em_ir_cluster_dim(k), 2);
    em_caps caps = {0};
    snprintf(caps.target, sizeof caps.target, "cuda");
    char *src = em_kernel_source_caps(k, &caps);
    assert_non_null(src);
    assert_non_null(strstr(src, "__cluster_dims__(2, 1, 1)"));
    free(src);
    em_ir_kernel_free(k);
    em_buffer *b = buf_new(NULL, 6 * 4 * sizeof(uint32_t));
    em_arg args[] = {em_arg_buffer(b, 6 * 4)};
    launch_x(m, "ranks", NULL, 6, 4, args, 1);
    uint32_t out[24];
    buf_get(b, out, sizeof out);
    for (uint32_t i = 0; i < 24; i++) assert_int_equal(out[i], (i / 4) % 2 + 10 * (i / 8));
    uint32_t cc[3] = {3, 1, 1}, cd[3] = {4, 1, 1};
    assert_int_equal(em_lang_launch(g_dev, m, "ranks", NULL, cc, cd, args, 1), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "not a multiple"));
    em_buffer_free(b);
    em_lang_module_free(m);
    /* the size is comptime, so it is checked where the kernel is specialized */
    m = must_load("kernel void k(tensor(u32) o, comptime u32 C = 9) cluster_dim(C)\n{\n}\n");
    em_lang_diags *d = em_lang_diags_new();
    assert_null(em_lang_specialize(m, "k", NULL, d));
    char *text = em_lang_diags_format(d);
    if (!strstr(text, "test.ek:1:62: error: a cluster size must be between 1 and 8, got 9"))
        fail_msg("got: %s", text);
    free(text);
    em_lang_diags_free(d);
    em_lang_module_free(m);
    assert_true(check_error_at("kernel void k(tensor(u32) o) cluster_dim(2, 1)\n{\n}\n", 1, 30,
                               "cluster_dim takes one size (cubes along x)", NULL));
}

/* ---- positions ---------------------------------------------------------------------------------
 */

static const char *pos_src =
    "kernel void positions(tensor(u32) out) cube_dim(4, 2, 2)\n"
    "{\n"
    "    u32 o = ABSOLUTE_POS * 8;\n"
    "    out[o + 0] = ABSOLUTE_POS_X + 100 * ABSOLUTE_POS_Y + 10000 * ABSOLUTE_POS_Z;\n"
    "    out[o + 1] = UNIT_POS;\n"
    "    out[o + 2] = UNIT_POS_X + 10 * UNIT_POS_Y + 100 * UNIT_POS_Z;\n"
    "    out[o + 3] = CUBE_POS;\n"
    "    out[o + 4] = CUBE_POS_X + 10 * CUBE_POS_Y + 100 * CUBE_POS_Z;\n"
    "    out[o + 5] = CUBE_DIM + 100 * (CUBE_DIM_X + 10 * CUBE_DIM_Y + 100 * CUBE_DIM_Z);\n"
    "    out[o + 6] = CUBE_COUNT + 100 * (CUBE_COUNT_X + 10 * CUBE_COUNT_Y + 100 * CUBE_COUNT_Z);\n"
    "    out[o + 7] = PLANE_POS;\n"
    "}\n";

static void test_positions_3d(void **state)
{
    (void)state;
    em_lang_module *m = must_load(pos_src);
    em_ir_kernel *k = em_lang_specialize(m, "positions", NULL, NULL);
    assert_non_null(k);
    uint32_t dim[3];
    em_ir_cube_dim(k, dim);
    assert_int_equal(dim[0], 4);
    assert_int_equal(dim[1], 2);
    assert_int_equal(dim[2], 2);
    em_ir_kernel_free(k);
    uint32_t cubes[3] = {2, 3, 1}, units[3] = {4, 2, 2};
    enum { TOTAL = 2 * 3 * 1 * 16 };
    uint32_t out[TOTAL * 8];
    em_buffer *b = buf_new(NULL, sizeof(out));
    em_arg args[] = {em_arg_buffer(b, TOTAL * 8)};
    launch_3d(m, "positions", NULL, cubes, units, args, 1);
    buf_get(b, out, sizeof(out));
    for (uint32_t cz = 0; cz < 1; cz++)
        for (uint32_t cy = 0; cy < 3; cy++)
            for (uint32_t cx = 0; cx < 2; cx++)
                for (uint32_t uz = 0; uz < 2; uz++)
                    for (uint32_t uy = 0; uy < 2; uy++)
                        for (uint32_t ux = 0; ux < 4; ux++) {
                            uint32_t cube = cx + 2 * (cy + 3 * cz), unit = ux + 4 * (uy + 2 * uz);
                            uint32_t abs = cube * 16 + unit;
                            const uint32_t *o = &out[abs * 8];
                            assert_int_equal(o[0], (cx * 4 + ux) + 100 * (cy * 2 + uy) +
                                                       10000 * (cz * 2 + uz));
                            assert_int_equal(o[1], unit);
                            assert_int_equal(o[2], ux + 10 * uy + 100 * uz);
                            assert_int_equal(o[3], cube);
                            assert_int_equal(o[4], cx + 10 * cy + 100 * cz);
                            assert_int_equal(o[5], 16 + 100 * (4 + 20 + 200));
                            assert_int_equal(o[6], 6 + 100 * (2 + 30 + 100));
                            assert_int_equal(o[7], unit);
                        }
    em_buffer_free(b);
    em_lang_module_free(m);
}

/* ---- shapes, strides and the line width
 * ------------------------------------------------------------ */

static const char *scale_src =
    "/* out = x * factor for an R x C matrix: out is contiguous, x is read through its strides, "
    "one\n"
    " * unit per line of out */\n"
    "kernel<F: float> void scale2d(const tensor(line(F), 2) x, tensor(line(F), 2) out, F factor)\n"
    "{\n"
    "    u32 per_row = shape(out, 1) / LINE_WIDTH;\n"
    "    u32 r = ABSOLUTE_POS / per_row;\n"
    "    u32 cl = ABSOLUTE_POS % per_row;\n"
    "    if (r < shape(out, 0)) {\n"
    "        u32 xi = (r * stride(x, 0) + cl * LINE_WIDTH * stride(x, 1)) / LINE_WIDTH;\n"
    "        out[ABSOLUTE_POS] = x[xi] * factor;\n"
    "    }\n"
    "}\n";

/* Runs scale2d on x (R x C through `xstride`) with the width picked for both tensors; returns it.
 */
static unsigned run_scale(const em_lang_module *m, const float *storage, size_t nstore,
                          const int64_t xstride[2], float *out)
{
    enum { R = 6, C = 12 };
    int64_t shape[2] = {R, C}, ostride[2] = {C, 1};
    const unsigned cands[] = {8, 4, 2, 1};
    unsigned wx = em_pick_line_width(2, shape, xstride, 0, cands, 4);
    unsigned wo = em_pick_line_width(2, shape, ostride, 0, cands, 4);
    unsigned w = wx < wo ? wx : wo;
    em_buffer *bx = buf_new(storage, nstore * sizeof(float)),
              *bo = buf_new(NULL, R * C * sizeof(float));
    em_lang_bind binds[] = {em_lang_bind_type("F", EM_F32)};
    em_lang_spec spec = {binds, 1, w, NULL};
    em_arg args[] = {em_arg_tensor(bx, 0, nstore / w, 2, shape, xstride),
                     em_arg_tensor(bo, 0, R * C / w, 2, shape, ostride), em_arg_f32(3.0f)};
    launch_x(m, "scale2d", &spec, 1, R * C / w, args, 3);
    buf_get(bo, out, R * C * sizeof(float));
    em_buffer_free(bx);
    em_buffer_free(bo);
    return w;
}

static void test_line_width_picked_for_layout(void **state)
{
    (void)state;
    em_lang_module *m = must_load(scale_src);
    enum { R = 6, C = 12 };
    float rowmajor[R * C], colmajor[R * C], out[R * C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            rowmajor[r * C + c] = (float)(r * 100 + c);
            colmajor[c * R + r] = (float)(r * 100 + c);
        }
    int64_t contiguous[2] = {C, 1}, transposed[2] = {1, R};
    assert_int_equal(run_scale(m, rowmajor, R * C, contiguous, out), 4);
    for (int i = 0; i < R * C; i++) assert_true(out[i] == rowmajor[i] * 3.0f);
    memset(out, 0, sizeof(out));
    assert_int_equal(run_scale(m, colmajor, R * C, transposed, out), 1);
    for (int i = 0; i < R * C; i++) assert_true(out[i] == rowmajor[i] * 3.0f);
    em_lang_module_free(m);
}

/* ---- generics
 * --------------------------------------------------------------------------------------- */

static const char *generic_src =
    "inline<T: float> T square_plus(T v, T c) { return v * v + c; }\n"
    "kernel<F: float> void sq(const tensor(F) x, tensor(F) out)\n"
    "{\n"
    "    if (ABSOLUTE_POS < len(x)) { out[ABSOLUTE_POS] = square_plus(x[ABSOLUTE_POS], F(0.5)); }\n"
    "}\n";

static void test_generic_f16_f32_f64(void **state)
{
    (void)state;
    em_lang_module *m = must_load(generic_src);
    enum { L = 50 };
    const em_scalar types[3] = {EM_F16, EM_F32, EM_F64};
    char hashes[3][33];
    for (int t = 0; t < 3; t++) {
        em_lang_bind binds[] = {em_lang_bind_type("F", types[t])};
        em_lang_spec spec = {binds, 1, 1, NULL};
        em_ir_kernel *k = em_lang_specialize(m, "sq", &spec, NULL);
        assert_non_null(k);
        em_ir_hash(k, hashes[t]);
        em_ir_kernel_free(k);
        size_t esz = em_scalar_size(types[t]);
        unsigned char in[L * 8], out[L * 8];
        double xs[L];
        for (int i = 0; i < L; i++) {
            xs[i] = (double)(i - 25) / 8.0;
            if (types[t] == EM_F16) {
                uint16_t h = f16_from_float((float)xs[i]);
                memcpy(in + i * esz, &h, 2);
            } else if (types[t] == EM_F32) {
                float f = (float)xs[i];
                memcpy(in + i * esz, &f, 4);
            } else {
                memcpy(in + i * esz, &xs[i], 8);
            }
        }
        em_buffer *a = buf_new(in, L * esz), *b = buf_new(NULL, L * esz);
        em_arg args[] = {em_arg_buffer(a, L), em_arg_buffer(b, L)};
        launch_x(m, "sq", &spec, 1, 64, args, 2);
        buf_get(b, out, L * esz);
        for (int i = 0; i < L; i++) {
            double got, want = xs[i] * xs[i] + 0.5;
            if (types[t] == EM_F16) {
                uint16_t h;
                memcpy(&h, out + i * esz, 2);
                got = f16_to_float(h);
            } else if (types[t] == EM_F32) {
                float f;
                memcpy(&f, out + i * esz, 4);
                got = f;
            } else {
                memcpy(&got, out + i * esz, 8);
            }
            double tol = types[t] == EM_F16 ? 2e-2 : types[t] == EM_F32 ? 1e-5 : 1e-12;
            assert_true(fabs(got - want) <= tol * (1 + fabs(want)));
        }
        em_buffer_free(a);
        em_buffer_free(b);
    }
    assert_string_not_equal(hashes[0], hashes[1]);
    assert_string_not_equal(hashes[1], hashes[2]);
    em_lang_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiled_matmul_shared),
        cmocka_unit_test(test_builtin_cube_reduction),
        cmocka_unit_test(test_prefix_sum),
        cmocka_unit_test(test_atomic_histogram),
        cmocka_unit_test(test_all_atomics),
        cmocka_unit_test(test_plane_ops),
        cmocka_unit_test(test_cooperative_matrix),
        cmocka_unit_test(test_matrix_layout_comptime),
        cmocka_unit_test(test_copy_async),
        cmocka_unit_test(test_positions_3d),
        cmocka_unit_test(test_cluster_dim),
        cmocka_unit_test(test_line_width_picked_for_layout),
        cmocka_unit_test(test_generic_f16_f32_f64),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
