/* test_matmul.c — conformance of em_matmul / em_matmul_ex on every device present: every dtype;
 * odd sizes (1, 7, 33, 129) with K not a multiple of any tile; transposed, strided and offset
 * operands; 1-D operands and broadcast batches; every SIMT tile configuration and split-K
 * (forced through $EMBER_MATMUL_CONFIG); the tensor-core kernel (cooperative matrices, lowered to
 * loops where PLANE_DIM is 1, so its indexing is checked without a GPU); the CPU kernel's
 * configurations (packed panels, micro-kernel on lines); the fused epilogue (bias,
 * ReLU, GELU, GELU-tanh, broadcast residual); error messages. Reference: float64 in C, computed
 * from the operands as read back from the device (so it sees exactly what the kernels see). */
#include "tensor_util.h"
#include "tensor/matmul_internal.h"

/* torch.matmul in float64: a [..., M, K] (or [K]) x b [..., K, N] (or [K]) with broadcast batch
 * dims, plus the epilogue: act(p + bias[n]) + residual (broadcast to the result). The result
 * shape goes to *rs; the caller frees the returned array. */
static double act_ref(int act, double v)
{
    if (act == EM_MATMUL_ACT_RELU) return v > 0 ? v : 0;
    if (act == EM_MATMUL_ACT_GELU) return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    if (act == EM_MATMUL_ACT_GELU_TANH)
        return 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    return v;
}

static double *ref_matmul(const double *a, em_shape as, const double *b, em_shape bs,
                          const double *bias, int act, const double *res, em_shape ress,
                          em_shape *rs)
{
    int64_t M = as.rank == 1 ? 1 : as.d[as.rank - 2], K = as.d[as.rank - 1];
    int64_t N = bs.rank == 1 ? 1 : bs.d[bs.rank - 1];
    int ba = as.rank > 2 ? as.rank - 2 : 0, bb = bs.rank > 2 ? bs.rank - 2 : 0;
    int br = ba > bb ? ba : bb;
    int64_t bsh[EM_MAX_RANK];
    for (int i = 0; i < br; i++) {
        int ia = i - (br - ba), ib = i - (br - bb);
        int64_t da = ia >= 0 ? as.d[ia] : 1, db = ib >= 0 ? bs.d[ib] : 1;
        bsh[i] = da == 1 ? db : da;
    }
    rs->rank = 0;
    for (int i = 0; i < br; i++) rs->d[rs->rank++] = bsh[i];
    if (as.rank > 1) rs->d[rs->rank++] = M;
    if (bs.rank > 1) rs->d[rs->rank++] = N;
    int64_t nb = 1;
    for (int i = 0; i < br; i++) nb *= bsh[i];
    double *out = calloc((size_t)(nb * M * N) + 1, sizeof(double));
    for (int64_t z = 0; z < nb; z++) {
        int64_t idx[EM_MAX_RANK], rem = z;
        for (int i = br - 1; i >= 0; i--) idx[i] = rem % bsh[i], rem /= bsh[i];
        int64_t za = 0, zb = 0;
        for (int i = 0; i < ba; i++) za = za * as.d[i] + (as.d[i] == 1 ? 0 : idx[i + br - ba]);
        for (int i = 0; i < bb; i++) zb = zb * bs.d[i] + (bs.d[i] == 1 ? 0 : idx[i + br - bb]);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += a[(za * M + m) * K + k] * b[(zb * K + k) * N + n];
                if (bias) s += bias[n];
                s = act_ref(act, s);
                int64_t o = (z * M + m) * N + n;
                if (res) {
                    /* the result index o -> residual index (broadcast from the right) */
                    int64_t ri = 0, rem2 = o, rstride = 1;
                    for (int d = rs->rank - 1, e = ress.rank - 1; d >= 0; d--, e--) {
                        int64_t c = rem2 % rs->d[d];
                        rem2 /= rs->d[d];
                        if (e >= 0) {
                            if (ress.d[e] != 1) ri += c * rstride;
                            rstride *= ress.d[e];
                        }
                    }
                    s += res[ri];
                }
                out[o] = s;
            }
    }
    return out;
}

static double tol_of(em_device *dev, em_scalar dt, int64_t K)
{
    if (!em_scalar_is_float(dt)) return 0;
    double t = tu_tol_on(dev, dt);
    if (dt == EM_F32) t *= 1 + (double)K / 64; /* f32 sums of K terms */
    return t;
}

/* Rounds the reference as an integer result type wraps (u8 results wrap mod 256). */
static void wrap_ref(em_scalar dt, double *r, size_t n)
{
    if (dt != EM_U8) return;
    for (size_t i = 0; i < n; i++) r[i] = (double)((uint8_t)(int64_t)r[i]);
}

/* Checks y = a x b (+ epilogue) against the reference computed from a and b read back. */
static void check_mm(const char *what, const em_tensor *a, const em_tensor *b,
                     const em_matmul_epilogue *ep)
{
    assert_non_null(a);
    assert_non_null(b);
    em_tensor *y = em_matmul_ex(a, b, ep);
    if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_non_null(y);
    double *ad = tu_read(a), *bd = tu_read(b), *bias = NULL, *res = NULL;
    em_shape ress = {0};
    if (ep && ep->bias) bias = tu_read(ep->bias);
    if (ep && ep->residual) res = tu_read(ep->residual), ress = em_shape_of(ep->residual);
    em_shape rs;
    double *ref = ref_matmul(ad, em_shape_of(a), bd, em_shape_of(b), bias, ep ? (int)ep->act : 0,
                             res, ress, &rs);
    em_scalar dt = em_dtype(a);
    int64_t K = em_dim(a, -1);
    wrap_ref(dt, ref, (size_t)em_numel(y));
    char label[256];
    snprintf(label, sizeof label, "%s %s", what, em_scalar_name(dt));
    tu_check(label, y, rs, ref, tol_of(em_tensor_device(a), dt, K));
    free(ad), free(bd), free(bias), free(res), free(ref);
    em_release(y);
}

/* A random tensor of dt (small integers for integer dtypes). */
static em_tensor *rnd(em_device *dev, em_scalar dt, em_shape s, uint32_t seed)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    double *v = malloc((n + 1) * sizeof(double));
    if (em_scalar_is_float(dt)) {
        tu_fill(v, n, -1, 1, seed);
    } else {
        tu_fill(v, n, dt == EM_U8 ? 0 : -3, 4, seed);
        for (size_t i = 0; i < n; i++) v[i] = floor(v[i]);
    }
    em_tensor *t = tu_tensor(dev, dt, s, v);
    free(v);
    return t;
}

static const em_scalar all_types[] = {EM_F32, EM_F16, EM_BF16, EM_F64, EM_I32, EM_I64, EM_U8};

static int setup(void **state)
{
    setenv("EMBER_AUTOTUNE", "off", 1); /* the heuristic choice here; test_autotune tunes */
    unsetenv("EMBER_MATMUL_CONFIG");
    /* the CPU's kernels at -O2 unless told otherwise: what is checked here is their results, and
     * the driver's default -O3 compiles the ~250 kernels of this file three times slower (~100 s
     * more); otherwise the default's flags, so that the CPU kernel fuses its multiply-adds as it
     * does by default (conformance.cpu and the benchmarks run the default itself) */
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
    setenv("EMBER_CFLAGS", "-O2 -march=native -ffp-contract=off", 0);
#else
    setenv("EMBER_CFLAGS", "-O2 -ffp-contract=off", 0);
#endif
    return tu_setup(state);
}

/* Every dtype, odd sizes, the heuristic configuration. */
static void test_dtypes_odd_sizes(void **state)
{
    (void)state;
    static const int64_t sizes[][3] = {
        {1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {129, 40, 70}, {3, 130, 1}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ti = 0; ti < EM_ARRAY_LEN(all_types); ti++) {
            em_scalar dt = all_types[ti];
            if (!tu_has(dev, dt)) continue;
            for (size_t si = 0; si < EM_ARRAY_LEN(sizes); si++) {
                em_scope_begin();
                int64_t M = sizes[si][0], N = sizes[si][1], K = sizes[si][2];
                em_tensor *a = rnd(dev, dt, EM_SHAPE(M, K), (uint32_t)(si * 7 + ti));
                em_tensor *b = rnd(dev, dt, EM_SHAPE(K, N), (uint32_t)(si * 11 + ti + 100));
                check_mm("odd sizes", a, b, NULL);
                em_scope_end(NULL, 0);
            }
        }
    }
}

/* Transposed, strided and offset operands; 1-D operands; broadcast batches. */
static void test_layouts_batches(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        static const em_scalar types[] = {EM_F32, EM_F16, EM_I32};
        for (size_t ti = 0; ti < EM_ARRAY_LEN(types); ti++) {
            em_scalar dt = types[ti];
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            /* a^T: stored [K, M], b^T: stored [N, K] */
            em_tensor *at = em_transpose(rnd(dev, dt, EM_SHAPE(37, 21), 1), 0, 1);
            em_tensor *bt = em_transpose(rnd(dev, dt, EM_SHAPE(19, 37), 2), 0, 1);
            em_tensor *a = rnd(dev, dt, EM_SHAPE(21, 37), 3);
            em_tensor *b = rnd(dev, dt, EM_SHAPE(37, 19), 4);
            check_mm("a^T b", at, b, NULL);
            check_mm("a b^T", a, bt, NULL);
            check_mm("a^T b^T", at, bt, NULL);
            /* strided (every other column) and offset views */
            em_tensor *as = em_slice(rnd(dev, dt, EM_SHAPE(22, 74), 5), 1, 1, 74, 2);
            em_tensor *bs = em_narrow(rnd(dev, dt, EM_SHAPE(40, 19), 6), 0, 3, 37);
            check_mm("strided", as, bs, NULL);
            /* 1-D operands */
            em_tensor *v = rnd(dev, dt, EM_SHAPE(37), 7);
            check_mm("vec x mat", v, b, NULL);
            check_mm("mat x vec", a, v, NULL);
            check_mm("vec x vec", v, v, NULL);
            /* batches: [2, 1, M, K] x [3, K, N] -> [2, 3, M, N]; [4, M, K] x [K, N] */
            em_tensor *ab = rnd(dev, dt, EM_SHAPE(2, 1, 9, 37), 8);
            em_tensor *bb = rnd(dev, dt, EM_SHAPE(3, 37, 13), 9);
            check_mm("broadcast batch", ab, bb, NULL);
            check_mm("batch x matrix", rnd(dev, dt, EM_SHAPE(4, 5, 37), 10), b, NULL);
            check_mm("batch x transposed batch", rnd(dev, dt, EM_SHAPE(3, 6, 37), 11),
                     em_transpose(rnd(dev, dt, EM_SHAPE(3, 13, 37), 12), 1, 2), NULL);
            em_scope_end(NULL, 0);
        }
    }
}

/* Every SIMT tile configuration, and split-K, forced. */
static void test_simt_configs(void **state)
{
    (void)state;
    static const char *const configs[] = {"simt 64x64x8 4x4 s1",   "simt 32x64x16 4x8 s1",
                                          "simt 128x128x8 8x8 s1", "simt 32x32x8 2x2 s3",
                                          "simt 16x16x8 1x1 s1",   "simt 32x64x16 4x8 s5",
                                          "simple 16x16x16 1x1 s1"};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        static const em_scalar types[] = {EM_F32, EM_BF16, EM_I64};
        for (size_t ci = 0; ci < EM_ARRAY_LEN(configs); ci++) {
            setenv("EMBER_MATMUL_CONFIG", configs[ci], 1);
            for (size_t ti = 0; ti < EM_ARRAY_LEN(types); ti++) {
                em_scalar dt = types[ti];
                if (!tu_has(dev, dt) || (ti > 0 && ci % 2)) continue;
                em_scope_begin();
                char what[64];
                snprintf(what, sizeof what, "config %s", configs[ci]);
                check_mm(what, rnd(dev, dt, EM_SHAPE(67, 131), 20),
                         rnd(dev, dt, EM_SHAPE(131, 45), 21), NULL);
                check_mm(what, em_transpose(rnd(dev, dt, EM_SHAPE(2, 300, 5), 22), 1, 2),
                         rnd(dev, dt, EM_SHAPE(300, 9), 23), NULL);
                em_scope_end(NULL, 0);
            }
        }
        unsetenv("EMBER_MATMUL_CONFIG");
    }
}

/* The tensor-core kernel, forced: on CUDA (WMMA), and where fragments are lowered to loops (plane
 * size 1: the CPU). */
static void test_mma_kernel(void **state)
{
    (void)state;
    static const char *const configs[] = {"mma 64x128x32 2x2 s1", "mma 128x128x32 4x2 s1",
                                          "mma 32x64x32 1x1 s3", "mma 64x64x64 2x1 s1"};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        if (strcmp(caps->target, "cuda") != 0 && caps->plane_dim != 1) continue;
        /* one dtype per configuration (each is a compiled kernel: keep CI time bounded) */
        static const em_scalar types[] = {EM_F16, EM_BF16, EM_F32, EM_BF16};
        for (size_t ci = 0; ci < EM_ARRAY_LEN(configs); ci++) {
            em_scalar dt = types[ci];
            if (!tu_has(dev, dt) || (dt == EM_F32 && caps->matrix)) continue; /* tf32: inexact */
            setenv("EMBER_MATMUL_CONFIG", configs[ci], 1);
            em_scope_begin();
            char what[64];
            snprintf(what, sizeof what, "config %s", configs[ci]);
            if (ci != 1)
                check_mm(what, rnd(dev, dt, EM_SHAPE(70, 100), 30),
                         rnd(dev, dt, EM_SHAPE(100, 130), 31), NULL);
            if (ci == 0)
                check_mm(what, em_transpose(rnd(dev, dt, EM_SHAPE(2, 33, 7), 32), 1, 2),
                         em_transpose(rnd(dev, dt, EM_SHAPE(65, 33), 33), 0, 1), NULL);
            if (ci == 1) {
                em_tensor *bias = rnd(dev, dt, EM_SHAPE(130), 34);
                em_matmul_epilogue ep = {.bias = bias,
                                         .act = EM_MATMUL_ACT_GELU_TANH,
                                         .residual = rnd(dev, dt, EM_SHAPE(130), 35)};
                check_mm(what, rnd(dev, dt, EM_SHAPE(140, 100), 30),
                         rnd(dev, dt, EM_SHAPE(100, 130), 31), &ep);
            }
            em_scope_end(NULL, 0);
        }
        unsetenv("EMBER_MATMUL_CONFIG");
    }
}

/* The mma kernel's variants (matmul_mma.ek; chosen per problem by mm_mma_plan_of): aligned
 * operands copied 16 bytes at a time (VA/VB > 1) and unaligned ones element by element, row-major
 * and transposed tiles (AT/BT), 2 to 4 stages (BK 64, 48, 32), 1x1 to 4x4 fragments per plane,
 * edges off the tile, K tails, the grouped tile order, batches with broadcast, split-K partials
 * and the epilogue. One dtype per case: each case is a compiled kernel. */
static void test_mma_variants(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        if (strcmp(caps->target, "cuda") != 0 && caps->plane_dim != 1) continue;
        bool tf32 = caps->matrix; /* f32 runs as tf32 there: inexact, so f16 instead */
        em_scope_begin();
        if (tu_has(dev, EM_BF16)) {
            /* 16-byte copies of both, 4 stages, K tail (264 = 8 steps + 8), M and N edges; then
             * fewer K steps than stages */
            setenv("EMBER_MATMUL_CONFIG", "mma 64x128x32 2x2 s1", 1);
            check_mm("mma aligned", rnd(dev, EM_BF16, EM_SHAPE(70, 264), 50),
                     rnd(dev, EM_BF16, EM_SHAPE(264, 136), 51), NULL);
            check_mm("mma aligned short K", rnd(dev, EM_BF16, EM_SHAPE(33, 40), 52),
                     rnd(dev, EM_BF16, EM_SHAPE(40, 16), 53), NULL);
            /* split-K partials (3 chunks of 96) with aligned copies */
            setenv("EMBER_MATMUL_CONFIG", "mma 32x64x32 1x1 s3", 1);
            check_mm("mma aligned split-K", rnd(dev, EM_BF16, EM_SHAPE(40, 256), 54),
                     rnd(dev, EM_BF16, EM_SHAPE(256, 72), 55), NULL);
        }
        if (tu_has(dev, EM_F16)) {
            /* transposed views of both (k-major a tile, n-major b tile), aligned: 3 stages */
            setenv("EMBER_MATMUL_CONFIG", "mma 64x64x48 2x2 s1", 1);
            check_mm("mma transposed aligned",
                     em_transpose(rnd(dev, EM_F16, EM_SHAPE(200, 72), 56), 0, 1),
                     em_transpose(rnd(dev, EM_F16, EM_SHAPE(80, 200), 57), 0, 1), NULL);
            /* transposed and batched, unaligned (M = 33, K = 70): element-wise copies */
            check_mm("mma transposed unaligned",
                     em_transpose(rnd(dev, EM_F16, EM_SHAPE(2, 70, 33), 58), 1, 2),
                     em_transpose(rnd(dev, EM_F16, EM_SHAPE(2, 45, 70), 59), 1, 2), NULL);
            /* one 16 x 16 fragment per plane; a misaligned by its offset (a slice), b aligned;
             * 11 tile rows: a full group of 8 and a short one */
            setenv("EMBER_MATMUL_CONFIG", "mma 32x32x16 2x2 s1", 1);
            check_mm("mma offset", em_slice(rnd(dev, EM_F16, EM_SHAPE(330, 65), 60), 1, 1, 65, 1),
                     rnd(dev, EM_F16, EM_SHAPE(64, 48), 61), NULL);
        }
        if (tu_has(dev, EM_BF16)) {
            /* 4 x 4 fragments per plane; a unaligned (K = 70), b aligned; bias, GELU, residual */
            setenv("EMBER_MATMUL_CONFIG", "mma 64x64x32 1x1 s1", 1);
            em_tensor *bias = rnd(dev, EM_BF16, EM_SHAPE(88), 62);
            em_matmul_epilogue ep = {.bias = bias,
                                     .act = EM_MATMUL_ACT_GELU,
                                     .residual = rnd(dev, EM_BF16, EM_SHAPE(75, 88), 63)};
            check_mm("mma 4x4 epilogue", rnd(dev, EM_BF16, EM_SHAPE(75, 70), 64),
                     rnd(dev, EM_BF16, EM_SHAPE(70, 88), 65), &ep);
        }
        if (tu_has(dev, tf32 ? EM_F16 : EM_F32)) {
            /* batched with b broadcast, a aligned (4-element copies for f32), 2 stages (BK 64) */
            em_scalar dt = tf32 ? EM_F16 : EM_F32;
            setenv("EMBER_MATMUL_CONFIG", "mma 64x64x64 2x1 s1", 1);
            check_mm("mma batched", rnd(dev, dt, EM_SHAPE(3, 40, 96), 66),
                     rnd(dev, dt, EM_SHAPE(96, 72), 67), NULL);
        }
        unsetenv("EMBER_MATMUL_CONFIG");
        em_scope_end(NULL, 0);
    }
}

/* A problem on an H200 (its capabilities, without the device): a [M, K] and b [K, N] row-major,
 * or transposed where asked, with tensors standing in for the operands' offsets. */
static mm_problem h200_problem(em_caps *caps, em_scalar dt, bool tf32, int64_t M, int64_t N,
                               int64_t K, bool at, bool bt, em_tensor *stand_in)
{
    memset(caps, 0, sizeof *caps);
    snprintf(caps->target, sizeof caps->target, "cuda");
    snprintf(caps->arch, sizeof caps->arch, "sm_90");
    caps->plane_dim = 32;
    caps->max_cube_units = 1024;
    caps->max_cube_dim[0] = caps->max_cube_dim[1] = 1024;
    caps->max_cube_dim[2] = 64;
    caps->max_shared = 232448;
    caps->compute_units = 132;
    caps->matrix = caps->plane_ops = true;
    mm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = em_tensor_device(stand_in);
    p.caps = caps;
    p.dt = dt;
    p.ct = EM_F32;
    p.R = 2;
    p.M = M, p.N = N, p.K = K, p.batch = 1;
    p.a = p.b = stand_in;
    p.ash[0] = M, p.ash[1] = K, p.ast[0] = at ? 1 : K, p.ast[1] = at ? M : 1;
    p.bsh[0] = K, p.bsh[1] = N, p.bst[0] = bt ? 1 : N, p.bst[1] = bt ? K : 1;
    p.osh[0] = M, p.osh[1] = N, p.ost[0] = N, p.ost[1] = 1;
    p.tf32 = tf32;
    return p;
}

/* On CUDA, f16/bf16 (and f32 with tf32 allowed) choose the mma kernel for large shapes, by the
 * heuristic and among every autotune candidate, with 16-byte copies where the operands allow,
 * 3 or 4 stages and two cubes' worth of shared memory per SM; exact f32 stays on SIMT. */
static void test_mma_choice_on_h200(void **state)
{
    (void)state;
    em_tensor *t = em_zeros(tu_devs[0], EM_F32, EM_SHAPE(1));
    assert_non_null(t);
    em_caps caps;
    static const em_scalar types[] = {EM_BF16, EM_F16, EM_F32};
    for (size_t i = 0; i < 3; i++) {
        mm_problem p = h200_problem(&caps, types[i], types[i] == EM_F32, 4096, 4096, 4096, false,
                                    false, t);
        mm_config c = mm_heuristic(&p);
        assert_int_equal(c.kind, MM_MMA);
        assert_int_equal(c.bm, 128);
        assert_int_equal(c.bn, 128);
        mm_mma_plan q;
        assert_true(mm_mma_plan_of(&p, &c, &q));
        assert_int_equal(q.fm * 16 * c.tm, 128);
        assert_int_equal(q.va, types[i] == EM_F32 ? 4 : 8);
        assert_int_equal(q.vb, q.va);
        assert_false(q.at || q.bt);
        assert_int_equal(q.stages, types[i] == EM_F32 ? 3 : 4); /* f32 tiles take twice the bytes */
        assert_true(q.smem * 2 <= caps.max_shared);
        mm_config cand[32];
        int n = mm_candidates(&p, true, cand, 32);
        assert_true(n >= 4);
        for (int j = 0; j < n; j++) assert_int_equal(cand[j].kind, MM_MMA);
    }
    /* GPT-2's shapes, forward and backward: x W, dY W^T (b transposed), X^T dY (a transposed) */
    mm_problem p = h200_problem(&caps, EM_BF16, false, 16384, 768, 3072, false, true, t);
    mm_config c = mm_heuristic(&p);
    mm_mma_plan q;
    assert_int_equal(c.kind, MM_MMA);
    assert_true(mm_mma_plan_of(&p, &c, &q));
    assert_true(q.bt && !q.at && q.va == 8 && q.vb == 8);
    p = h200_problem(&caps, EM_BF16, false, 768, 3072, 16384, true, false, t);
    c = mm_heuristic(&p);
    assert_int_equal(c.kind, MM_MMA);
    assert_true(mm_mma_plan_of(&p, &c, &q));
    assert_true(q.at && !q.bt && q.va == 8 && q.vb == 8);
    /* K = 70: a element-wise, b still 16 bytes at a time */
    p = h200_problem(&caps, EM_BF16, false, 4096, 4096, 70, false, false, t);
    c = mm_heuristic(&p);
    assert_true(mm_mma_plan_of(&p, &c, &q));
    assert_true(q.va == 1 && q.vb == 8);
    /* exact f32 stays exact: the SIMT kernel */
    p = h200_problem(&caps, EM_F32, false, 4096, 4096, 4096, false, false, t);
    assert_int_equal(mm_heuristic(&p).kind, MM_SIMT);
    /* decoding's 1 x 768 . 768 x 768: f32 groups of 2 units of 4-lane lines (a 32-byte sector a
     * k, 96 cubes); bf16 the narrow groups, 1 unit of an 8-lane line (96 cubes, not 48) */
    p = h200_problem(&caps, EM_F32, false, 1, 768, 768, false, false, t);
    c = mm_heuristic(&p);
    assert_true(c.kind == MM_SKINNY && c.bn == 2 && c.tm == 16);
    p = h200_problem(&caps, EM_BF16, false, 1, 768, 768, false, false, t);
    c = mm_heuristic(&p);
    assert_true(c.kind == MM_SKINNY && c.bn == 1 && c.tm == 32);
    setenv("EMBER_SKINNY_NARROW", "0", 1);
    c = mm_heuristic(&p);
    assert_true(c.kind == MM_SKINNY && c.bn == 2 && c.tm == 16);
    unsetenv("EMBER_SKINNY_NARROW");
    em_release(t);
}

/* The Hopper kernel (matmul_wgmma.ek) forced on the CPU, which emulates warpgroup MMAs as the
 * hardware addresses its swizzled operands (and on CUDA sm_90a devices natively): one, two and
 * three warpgroups, BN 64 to 256, both operand layouts each (transposed views: the backward
 * passes' a^T b and a b^T), edges off the tile, K tails, batches, the epilogue and split-K
 * partials; unaligned operands (K = 70) must fall back to another kernel. */
static void test_wgmma_kernel(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        bool native = !strcmp(caps->target, "cuda") && !strcmp(caps->arch, "sm_90a");
        if (strcmp(caps->target, "c") != 0 && !native) continue;
        em_scope_begin();
        setenv("EMBER_MATMUL_CONFIG", "wgmma 128x128x64 2x1 s1", 1);
        check_mm("wgmma 2x128, row-major", rnd(dev, EM_BF16, EM_SHAPE(140, 200), 60),
                 rnd(dev, EM_BF16, EM_SHAPE(200, 136), 61), NULL);
        check_mm("wgmma 2x128, a^T b", em_transpose(rnd(dev, EM_BF16, EM_SHAPE(72, 136), 62), 0, 1),
                 rnd(dev, EM_BF16, EM_SHAPE(72, 80), 63), NULL);
        setenv("EMBER_MATMUL_CONFIG", "wgmma 64x256x64 1x1 s1", 1);
        check_mm("wgmma 1x256, a b^T batched",
                 rnd(dev, EM_F16, EM_SHAPE(2, 70, 136), 64),
                 em_transpose(rnd(dev, EM_F16, EM_SHAPE(2, 264, 136), 65), 1, 2), NULL);
        setenv("EMBER_MATMUL_CONFIG", "wgmma 192x64x64 3x1 s2", 1);
        em_tensor *bias = rnd(dev, EM_BF16, EM_SHAPE(72), 66);
        em_matmul_epilogue ep = {.bias = bias,
                                 .act = EM_MATMUL_ACT_GELU,
                                 .residual = rnd(dev, EM_BF16, EM_SHAPE(200, 72), 67)};
        check_mm("wgmma 3x64 split-K, epilogue, both transposed",
                 em_transpose(rnd(dev, EM_BF16, EM_SHAPE(256, 200), 68), 0, 1),
                 em_transpose(rnd(dev, EM_BF16, EM_SHAPE(72, 256), 69), 0, 1), &ep);
        /* K = 70 cannot be copied 16 bytes at a time: the forced wgmma configuration is invalid,
         * and the heuristic runs (and is right) */
        setenv("EMBER_MATMUL_CONFIG", "wgmma 128x128x64 2x1 s1", 1);
        check_mm("wgmma refused for K = 70", rnd(dev, EM_BF16, EM_SHAPE(30, 70), 70),
                 rnd(dev, EM_BF16, EM_SHAPE(70, 24), 71), NULL);
        unsetenv("EMBER_MATMUL_CONFIG");
        em_scope_end(NULL, 0);
    }
}

/* The warp-specialized Hopper kernel (matmul_wgmma_ws.ek) forced on the CPU, where its barriers
 * do nothing and its loop takes turns (and on CUDA sm_90a devices natively, with setmaxnreg for
 * two consumers): one to three consumer warpgroups, BN 64 to 256, odd sizes (1, 7, 33, 257),
 * both operand layouts, batches, split-K partials and the epilogue, against float64. */
static void test_wgmma_ws_kernel(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        bool native = !strcmp(caps->target, "cuda") && !strcmp(caps->arch, "sm_90a");
        if (strcmp(caps->target, "c") != 0 && !native) continue;
        em_scope_begin();
        setenv("EMBER_MATMUL_CONFIG", "wgmma-ws 128x128x64 2x1 s1", 1);
        check_mm("ws 2x128, row-major", rnd(dev, EM_BF16, EM_SHAPE(257, 264), 80),
                 rnd(dev, EM_BF16, EM_SHAPE(264, 136), 81), NULL);
        check_mm("ws 2x128, one row", rnd(dev, EM_BF16, EM_SHAPE(1, 48), 82),
                 rnd(dev, EM_BF16, EM_SHAPE(48, 8), 83), NULL);
        check_mm("ws 2x128, a^T b", em_transpose(rnd(dev, EM_BF16, EM_SHAPE(200, 40), 84), 0, 1),
                 rnd(dev, EM_BF16, EM_SHAPE(200, 33 * 8), 85), NULL);
        setenv("EMBER_MATMUL_CONFIG", "wgmma-ws-regs 128x256x64 2x1 s1", 1);
        check_mm("ws 2x256 with setmaxnreg, K tail", rnd(dev, EM_BF16, EM_SHAPE(33, 200), 92),
                 rnd(dev, EM_BF16, EM_SHAPE(200, 264), 93), NULL);
        setenv("EMBER_MATMUL_CONFIG", "wgmma-ws 64x256x64 1x1 s1", 1);
        check_mm("ws 1x256, a b^T batched", rnd(dev, EM_F16, EM_SHAPE(2, 7, 136), 86),
                 em_transpose(rnd(dev, EM_F16, EM_SHAPE(2, 264, 136), 87), 1, 2), NULL);
        setenv("EMBER_MATMUL_CONFIG", "wgmma-ws 192x64x64 3x1 s2", 1);
        em_tensor *bias = rnd(dev, EM_BF16, EM_SHAPE(72), 88);
        em_matmul_epilogue ep = {.bias = bias,
                                 .act = EM_MATMUL_ACT_GELU,
                                 .residual = rnd(dev, EM_BF16, EM_SHAPE(40, 72), 89)};
        check_mm("ws 3x64 split-K, epilogue, both transposed",
                 em_transpose(rnd(dev, EM_BF16, EM_SHAPE(520, 40), 90), 0, 1),
                 em_transpose(rnd(dev, EM_BF16, EM_SHAPE(72, 520), 91), 0, 1), &ep);
        unsetenv("EMBER_MATMUL_CONFIG");
        em_scope_end(NULL, 0);
    }
}

/* On an sm_90a device (an H200 as the CUDA driver publishes it) f16/bf16 take the wgmma kernel
 * by the heuristic (128 x 256 tiles of two warpgroups when they fill the device, else 128 x 128)
 * with as many stages as fit, and the autotune candidates hold both kernels; GPT-2's backward
 * layouts get transposed tiles; K = 70 and exact f32 keep the other kernels. */
static void test_wgmma_choice_on_h200(void **state)
{
    (void)state;
    em_tensor *t = em_zeros(tu_devs[0], EM_F32, EM_SHAPE(1));
    assert_non_null(t);
    em_caps caps;
    mm_problem p = h200_problem(&caps, EM_BF16, false, 4096, 4096, 4096, false, false, t);
    snprintf(caps.arch, sizeof caps.arch, "sm_90a");
    mm_config c = mm_heuristic(&p);
    assert_int_equal(c.kind, MM_WGMMA);
    assert_int_equal(c.bm, 128);
    assert_int_equal(c.bn, 256);
    mm_wgmma_plan q;
    assert_true(mm_wgmma_plan_of(&p, &c, &q));
    assert_int_equal(q.stages, 4);
    assert_true(q.smem <= caps.max_shared);
    assert_false(q.at || q.bt);
    mm_config cand[32];
    int n = mm_candidates(&p, false, cand, 32), nw = 0, nm = 0, nws = 0;
    for (int j = 0; j < n; j++) {
        nw += cand[j].kind == MM_WGMMA, nm += cand[j].kind == MM_MMA;
        nws += cand[j].kind == MM_WGMMA && cand[j].lanes == 1;
    }
    assert_true(nw >= 4 && nm >= 2 && nws == 0); /* the WS kernel only in the full search */
    mm_config full[48];
    int nf = mm_candidates(&p, true, full, 48), nfws = 0;
    for (int j = 0; j < nf; j++) nfws += full[j].kind == MM_WGMMA && full[j].lanes == 1;
    assert_int_equal(nfws, 4);
    char text[64];
    mm_config_format(&c, text, sizeof text);
    mm_config back;
    assert_true(mm_config_parse(text, &back));
    assert_memory_equal(&back, &c, sizeof c);
    /* the warp-specialized kernel: 2 consumers x 256, 4 stages beside its barriers; its
     * configuration's text names it, and its setmaxnreg variant (lanes 2, two consumers only) */
    mm_config ws = c;
    ws.lanes = 1;
    assert_true(mm_config_valid(&p, &ws));
    assert_true(mm_wgmma_plan_of(&p, &ws, &q));
    assert_true(q.ws && !q.regs && q.units == 384 && q.stages == 4 && q.smem <= caps.max_shared);
    mm_config_format(&ws, text, sizeof text);
    assert_string_equal(text, "wgmma-ws 128x256x64 2x1 s1");
    assert_true(mm_config_parse(text, &back));
    assert_memory_equal(&back, &ws, sizeof ws);
    ws.lanes = 2;
    assert_true(mm_wgmma_plan_of(&p, &ws, &q) && q.ws && q.regs);
    mm_config_format(&ws, text, sizeof text);
    assert_string_equal(text, "wgmma-ws-regs 128x256x64 2x1 s1");
    assert_true(mm_config_parse(text, &back));
    assert_memory_equal(&back, &ws, sizeof ws);
    for (int j = 0; j < n; j++) assert_true(cand[j].lanes != 2); /* forced only */
    ws.tm = 3, ws.bm = 192, ws.bn = 128;
    assert_false(mm_wgmma_plan_of(&p, &ws, &q)); /* setmaxnreg with three consumers: no */
    ws.lanes = 1;
    assert_true(mm_wgmma_plan_of(&p, &ws, &q) && q.units == 512 && !q.regs);
    /* not on a device without barriers with phases (sm_90: no sm_90a) */
    snprintf(caps.arch, sizeof caps.arch, "sm_90");
    assert_false(mm_config_valid(&p, &ws));
    n = mm_candidates(&p, true, cand, 32);
    for (int j = 0; j < n; j++) assert_false(cand[j].kind == MM_WGMMA);
    /* 16384 x 768 x 768: 64 x 3 tiles of 128 x 256 do not fill 132 SMs twice: 128 x 128 */
    p = h200_problem(&caps, EM_BF16, false, 16384, 768, 768, false, false, t);
    snprintf(caps.arch, sizeof caps.arch, "sm_90a");
    c = mm_heuristic(&p);
    assert_int_equal(c.kind, MM_WGMMA);
    p = h200_problem(&caps, EM_BF16, false, 16384, 768, 3072, false, true, t);
    snprintf(caps.arch, sizeof caps.arch, "sm_90a");
    c = mm_heuristic(&p);
    assert_int_equal(c.kind, MM_WGMMA);
    assert_true(mm_wgmma_plan_of(&p, &c, &q) && q.bt && !q.at);
    p = h200_problem(&caps, EM_F16, false, 768, 3072, 16384, true, false, t);
    snprintf(caps.arch, sizeof caps.arch, "sm_90a");
    c = mm_heuristic(&p);
    assert_int_equal(c.kind, MM_WGMMA);
    assert_true(mm_wgmma_plan_of(&p, &c, &q) && q.at && !q.bt);
    p = h200_problem(&caps, EM_BF16, false, 4096, 4096, 70, false, false, t);
    snprintf(caps.arch, sizeof caps.arch, "sm_90a");
    assert_int_equal(mm_heuristic(&p).kind, MM_MMA);
    p = h200_problem(&caps, EM_F32, false, 4096, 4096, 4096, false, false, t);
    snprintf(caps.arch, sizeof caps.arch, "sm_90a");
    assert_int_equal(mm_heuristic(&p).kind, MM_SIMT);
    em_release(t);
}

/* The epilogue: bias, every activation, a broadcast residual; fused and with split-K. (Each flag
 * combination is a compiled kernel: the cases are chosen to cover each piece once per dtype
 * class, not every product.) */
static void test_epilogue(void **state)
{
    (void)state;
    static const struct {
        const char *config; /* NULL: the heuristic */
        em_scalar dt;
        int act;
        int parts; /* 1 bias, 2 residual */
    } cases[] = {
        {NULL, EM_F32, EM_MATMUL_ACT_NONE, 3},
        {NULL, EM_F32, EM_MATMUL_ACT_RELU, 3},
        {NULL, EM_F32, EM_MATMUL_ACT_GELU, 3},
        {NULL, EM_F32, EM_MATMUL_ACT_GELU_TANH, 3},
        {NULL, EM_F32, EM_MATMUL_ACT_NONE, 1},
        {NULL, EM_F32, EM_MATMUL_ACT_NONE, 2},
        {NULL, EM_F16, EM_MATMUL_ACT_GELU, 3},
        {NULL, EM_BF16, EM_MATMUL_ACT_GELU_TANH, 1},
        {NULL, EM_I32, EM_MATMUL_ACT_RELU, 3},
        {"simt 32x32x8 2x2 s4", EM_F32, EM_MATMUL_ACT_GELU_TANH, 3},
        {"simt 32x32x8 2x2 s4", EM_I32, EM_MATMUL_ACT_NONE, 1},
    };
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t ci = 0; ci < EM_ARRAY_LEN(cases); ci++) {
            em_scalar dt = cases[ci].dt;
            if (!tu_has(dev, dt)) continue;
            if (cases[ci].config)
                setenv("EMBER_MATMUL_CONFIG", cases[ci].config, 1);
            else
                unsetenv("EMBER_MATMUL_CONFIG");
            em_scope_begin();
            em_tensor *a = rnd(dev, dt, EM_SHAPE(2, 19, 70), 40);
            em_tensor *b = rnd(dev, dt, EM_SHAPE(70, 23), 41);
            /* a strided bias view, and a residual broadcast over N and the batch */
            em_tensor *bias = em_slice(rnd(dev, dt, EM_SHAPE(46), 42), 0, 0, 46, 2);
            em_tensor *res = rnd(dev, dt, EM_SHAPE(19, 1), 43);
            em_matmul_epilogue ep = {.bias = cases[ci].parts & 1 ? bias : NULL,
                                     .act = (em_matmul_act)cases[ci].act,
                                     .residual = cases[ci].parts & 2 ? res : NULL};
            char what[96];
            snprintf(what, sizeof what, "epilogue case %zu", ci);
            check_mm(what, a, b, &ep);
            em_scope_end(NULL, 0);
        }
        unsetenv("EMBER_MATMUL_CONFIG");
    }
}

/* The CPU kernel (matmul_cpu.ek: packed panels, one unit per cube, an MR x NR micro-kernel on
 * lines), forced on the CPU: partial strips on every edge, several K blocks and a K tail,
 * transposed, strided and batched operands, split-K partials, the epilogue, wide and narrow
 * types. One dtype per configuration: each case is a compiled kernel of one to a few seconds at
 * -O3. Then the heuristic's own choice on a problem large enough to take it. */
static void test_cpu_kernel(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        if (strcmp(em_device_caps(dev)->target, "c") != 0) continue;
        em_scope_begin();
        if (tu_has(dev, EM_F32)) {
            /* K = 300: two whole K blocks of 128 and a tail; M, N off the tile and the strips */
            setenv("EMBER_MATMUL_CONFIG", "cpu 96x240x128 6x24x8 s1", 1);
            check_mm("cpu edges", rnd(dev, EM_F32, EM_SHAPE(101, 300), 70),
                     rnd(dev, EM_F32, EM_SHAPE(300, 250), 71), NULL);
            check_mm("cpu a^T b^T batched",
                     em_transpose(rnd(dev, EM_F32, EM_SHAPE(2, 130, 7), 72), 1, 2),
                     em_transpose(rnd(dev, EM_F32, EM_SHAPE(2, 29, 130), 73), 1, 2), NULL);
            check_mm("cpu strided", em_slice(rnd(dev, EM_F32, EM_SHAPE(22, 74), 74), 1, 1, 74, 2),
                     em_slice(rnd(dev, EM_F32, EM_SHAPE(37, 60), 75), 1, 0, 60, 2), NULL);
            check_mm("cpu vec x mat", rnd(dev, EM_F32, EM_SHAPE(37), 76),
                     rnd(dev, EM_F32, EM_SHAPE(37, 19), 77), NULL);
        }
        if (tu_has(dev, EM_F16)) {
            /* split-K partials: 3 chunks of K (96, 96 and a tail of 8), batched */
            setenv("EMBER_MATMUL_CONFIG", "cpu 64x64x32 4x16x8 s3", 1);
            check_mm("cpu split-K", rnd(dev, EM_F16, EM_SHAPE(3, 70, 200), 78),
                     rnd(dev, EM_F16, EM_SHAPE(200, 33), 79), NULL);
        }
        if (tu_has(dev, EM_BF16)) {
            /* lines of 16; the epilogue: a strided bias, GELU-tanh, a broadcast residual */
            setenv("EMBER_MATMUL_CONFIG", "cpu 64x64x64 8x32x16 s1", 1);
            em_tensor *bias = em_slice(rnd(dev, EM_BF16, EM_SHAPE(90), 80), 0, 0, 90, 2);
            em_matmul_epilogue ep = {.bias = bias,
                                     .act = EM_MATMUL_ACT_GELU_TANH,
                                     .residual = rnd(dev, EM_BF16, EM_SHAPE(50, 1), 81)};
            check_mm("cpu epilogue", rnd(dev, EM_BF16, EM_SHAPE(50, 70), 82),
                     rnd(dev, EM_BF16, EM_SHAPE(70, 45), 83), &ep);
        }
        if (tu_has(dev, EM_F64)) {
            setenv("EMBER_MATMUL_CONFIG", "cpu 32x32x16 4x8x4 s1", 1);
            check_mm("cpu f64", rnd(dev, EM_F64, EM_SHAPE(45, 40), 84),
                     em_transpose(rnd(dev, EM_F64, EM_SHAPE(35, 40), 85), 0, 1), NULL);
        }
        if (tu_has(dev, EM_U8)) {
            /* u8 accumulates in i32 and wraps when stored; lines of 2 */
            setenv("EMBER_MATMUL_CONFIG", "cpu 16x16x16 2x4x2 s1", 1);
            check_mm("cpu u8", rnd(dev, EM_U8, EM_SHAPE(20, 50), 86),
                     rnd(dev, EM_U8, EM_SHAPE(50, 17), 87), NULL);
        }
        unsetenv("EMBER_MATMUL_CONFIG");
        if (tu_has(dev, EM_F32)) {
            /* 140 x 130 x 120 = 2.2M multiply-adds: the heuristic's CPU kernel */
            check_mm("cpu default", rnd(dev, EM_F32, EM_SHAPE(140, 120), 88),
                     rnd(dev, EM_F32, EM_SHAPE(120, 130), 89), NULL);
        }
        em_scope_end(NULL, 0);
    }
}

/* Skinny shapes take split-K by default on the heuristic path (small M * N, long K). */
static void test_split_k_default(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        check_mm("skinny", rnd(dev, EM_F32, EM_SHAPE(4, 2000), 50),
                 rnd(dev, EM_F32, EM_SHAPE(2000, 6), 51), NULL);
        check_mm("skinny batch", rnd(dev, EM_F32, EM_SHAPE(3, 2, 1000), 52),
                 rnd(dev, EM_F32, EM_SHAPE(1000, 3), 53), NULL);
        em_scope_end(NULL, 0);
    }
}

/* The skinny kernel (matmul_skinny.ek), the heuristic's choice for at most 16 rows once batches
 * fold: M in {1, 2, 3, 7, 16} (row blocks of 1 to 16, the last partly past the end) x odd and
 * line-aligned N and K, b row-major and transposed (lines along N or K, or single elements when
 * the sizes do not allow lines), every dtype, folded batches, per-batch b (attention's q k^T and
 * p v), the epilogue, and forced configurations: several groups along K meeting in shared
 * memory, split-K partials. */
static void test_skinny(void **state)
{
    (void)state;
    static const int64_t ms[] = {1, 2, 3, 7, 16};
    static const int64_t nk[][2] = {{1, 1}, {33, 1031}, {1040, 1000}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        char what[96];
        for (size_t mi = 0; mi < EM_ARRAY_LEN(ms); mi++) {
            for (size_t ni = 0; ni < EM_ARRAY_LEN(nk); ni++) {
                em_scope_begin();
                int64_t M = ms[mi], N = nk[ni][0], K = nk[ni][1];
                uint32_t seed = (uint32_t)(mi * 10 + ni);
                em_tensor *a = rnd(dev, EM_F32, EM_SHAPE(M, K), 200 + seed);
                snprintf(what, sizeof what, "skinny %lldx%lldx%lld", (long long)M, (long long)N,
                         (long long)K);
                check_mm(what, a, rnd(dev, EM_F32, EM_SHAPE(K, N), 300 + seed), NULL);
                snprintf(what, sizeof what, "skinny %lldx%lldx%lld b^T", (long long)M, (long long)N,
                         (long long)K);
                check_mm(what, a, em_transpose(rnd(dev, EM_F32, EM_SHAPE(N, K), 400 + seed), 0, 1),
                         NULL);
                em_scope_end(NULL, 0);
            }
        }
        /* every dtype, lines and single elements, b both ways */
        for (size_t ti = 1; ti < EM_ARRAY_LEN(all_types); ti++) {
            em_scalar dt = all_types[ti];
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            em_tensor *a = rnd(dev, dt, EM_SHAPE(3, 160), 500 + (uint32_t)ti);
            check_mm("skinny dtype", a, rnd(dev, dt, EM_SHAPE(160, 48), 510 + (uint32_t)ti), NULL);
            check_mm("skinny dtype b^T", a,
                     em_transpose(rnd(dev, dt, EM_SHAPE(37, 160), 520 + (uint32_t)ti), 0, 1), NULL);
            check_mm("skinny dtype odd", rnd(dev, dt, EM_SHAPE(1, 37), 530 + (uint32_t)ti),
                     rnd(dev, dt, EM_SHAPE(37, 21), 540 + (uint32_t)ti), NULL);
            em_scope_end(NULL, 0);
        }
        em_scope_begin();
        /* batches folded into rows (b shared): [2, 3, K] x [K, N] and [5, 1, K] x [K, N]^T */
        check_mm("skinny folded", rnd(dev, EM_F32, EM_SHAPE(2, 3, 96), 600),
                 rnd(dev, EM_F32, EM_SHAPE(96, 72), 601), NULL);
        check_mm("skinny folded b^T", rnd(dev, EM_F32, EM_SHAPE(5, 1, 96), 602),
                 em_transpose(rnd(dev, EM_F32, EM_SHAPE(40, 96), 603), 0, 1), NULL);
        /* attention: q [2, 3, 1, 64] x k^T (k [2, 3, 40, 64]), then p [2, 3, 1, 40] x v */
        check_mm("skinny q k^T", rnd(dev, EM_F32, EM_SHAPE(2, 3, 1, 64), 604),
                 em_transpose(rnd(dev, EM_F32, EM_SHAPE(2, 3, 40, 64), 605), 2, 3), NULL);
        check_mm("skinny p v", rnd(dev, EM_F32, EM_SHAPE(2, 3, 1, 40), 606),
                 rnd(dev, EM_F32, EM_SHAPE(2, 3, 40, 64), 607), NULL);
        /* a broadcast over b's batches, and b broadcast over a's with a transposed view */
        check_mm("skinny broadcast a", rnd(dev, EM_F32, EM_SHAPE(1, 2, 50), 608),
                 rnd(dev, EM_F32, EM_SHAPE(3, 50, 24), 609), NULL);
        /* operands still pending in the fusion stream (lazy results): realized before the launch */
        check_mm("skinny lazy operands", em_mul_scalar(rnd(dev, EM_F32, EM_SHAPE(2, 64), 628), 2.0),
                 em_add(rnd(dev, EM_F32, EM_SHAPE(64, 40), 629),
                        rnd(dev, EM_F32, EM_SHAPE(64, 40), 630)),
                 NULL);
        /* b every other column, and b broadcast from one row (strides 0 along K) */
        check_mm("skinny strided b", rnd(dev, EM_F32, EM_SHAPE(2, 50), 624),
                 em_slice(rnd(dev, EM_F32, EM_SHAPE(50, 48), 625), 1, 0, 48, 2), NULL);
        check_mm("skinny expanded b", rnd(dev, EM_F32, EM_SHAPE(3, 50), 626),
                 em_expand(rnd(dev, EM_F32, EM_SHAPE(1, 24), 627), EM_SHAPE(50, 24)), NULL);
        check_mm("skinny a^T", em_transpose(rnd(dev, EM_F32, EM_SHAPE(50, 4), 610), 0, 1),
                 rnd(dev, EM_F32, EM_SHAPE(50, 24), 611), NULL);
        /* the epilogue: bias, GELU (tanh), residual broadcast over rows; bias + ReLU on b^T */
        em_matmul_epilogue ep = {.bias = rnd(dev, EM_F32, EM_SHAPE(72), 612),
                                 .act = EM_MATMUL_ACT_GELU_TANH,
                                 .residual = rnd(dev, EM_F32, EM_SHAPE(72), 613)};
        check_mm("skinny epilogue", rnd(dev, EM_F32, EM_SHAPE(2, 3, 96), 614),
                 rnd(dev, EM_F32, EM_SHAPE(96, 72), 615), &ep);
        em_matmul_epilogue ep2 = {.bias = rnd(dev, EM_F32, EM_SHAPE(40), 616),
                                  .act = EM_MATMUL_ACT_RELU,
                                  .residual = rnd(dev, EM_F32, EM_SHAPE(1, 40), 617)};
        check_mm("skinny epilogue b^T", rnd(dev, EM_F32, EM_SHAPE(1, 96), 618),
                 em_transpose(rnd(dev, EM_F32, EM_SHAPE(40, 96), 619), 0, 1), &ep2);
        if (tu_has(dev, EM_BF16)) {
            em_matmul_epilogue ep3 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(64), 620),
                                      .act = EM_MATMUL_ACT_GELU,
                                      .residual = rnd(dev, EM_BF16, EM_SHAPE(1, 1, 64), 621)};
            check_mm("skinny epilogue bf16", rnd(dev, EM_BF16, EM_SHAPE(1, 1, 256), 622),
                     rnd(dev, EM_BF16, EM_SHAPE(256, 64), 623), &ep3);
            /* GPT-2's attention projection while decoding: the default cube is 1024 units,
             * which a CUDA kernel fits only with its registers capped (it once asked for 72) */
            em_matmul_epilogue ep5 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(768), 636),
                                      .residual = rnd(dev, EM_BF16, EM_SHAPE(1, 1, 768), 637)};
            check_mm("skinny epilogue bf16 768", rnd(dev, EM_BF16, EM_SHAPE(1, 1, 768), 638),
                     rnd(dev, EM_BF16, EM_SHAPE(768, 768), 639), &ep5);
        }
        em_scope_end(NULL, 0);
        /* forced: 3 groups along K of 2 units x 2 lines (shared-memory sums), split-K partials
         * (folded batches, the epilogue after the reduce), b both ways */
        static const char *const configs[] = {"skinny 4x2x16 1x3x2 s1", "skinny 2x1x16 1x1x1 s3"};
        for (size_t ci = 0; ci < EM_ARRAY_LEN(configs); ci++) {
            setenv("EMBER_MATMUL_CONFIG", configs[ci], 1);
            em_scope_begin();
            snprintf(what, sizeof what, "config %s", configs[ci]);
            check_mm(what, rnd(dev, EM_F32, EM_SHAPE(3, 200), 630),
                     rnd(dev, EM_F32, EM_SHAPE(200, 40), 631), NULL);
            em_matmul_epilogue ep4 = {.bias = rnd(dev, EM_F32, EM_SHAPE(37), 634),
                                      .act = EM_MATMUL_ACT_GELU,
                                      .residual = rnd(dev, EM_F32, EM_SHAPE(2, 1, 37), 635)};
            check_mm(what, rnd(dev, EM_F32, EM_SHAPE(2, 1, 200), 632),
                     em_transpose(rnd(dev, EM_F32, EM_SHAPE(37, 200), 633), 0, 1), &ep4);
            em_scope_end(NULL, 0);
        }
        unsetenv("EMBER_MATMUL_CONFIG");
    }
}

/* The skinny kernel loading its first lines of b before its dependency_wait() (PRE: taken where
 * b is settled, em_buffer_settled; EMBER_SKINNY_PRELOAD=1 takes it on every target, where the
 * wait is nothing): a b made from host data is settled after a sync, one a launch just wrote is
 * not until the device syncs again; the products on 1 to 16 rows, odd and aligned sizes, b both ways, the epilogue,
 * the layer-norm prologue and split-K, against float64. */
static void test_skinny_preload(void **state)
{
    (void)state;
    setenv("EMBER_SKINNY_PRELOAD", "1", 1);
    static const int64_t shapes[][3] = {{1, 33, 1031}, {3, 1040, 1000}, {16, 48, 160}, {1, 1, 1}};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        em_tensor *host = rnd(dev, EM_F32, EM_SHAPE(64, 40), 700);
        assert_int_equal(em_device_sync(dev), EM_OK); /* pool blocks keep their last writers */
        assert_true(em_buffer_settled(host->st->buf));
        em_tensor *made = em_add(host, host);
        assert_int_equal(em_realize(made), EM_OK);
        assert_false(em_buffer_settled(made->st->buf));
        const em_tensor *pair[2] = {host, made};
        assert_false(tn_preload_ok(dev, "EMBER_SKINNY_PRELOAD", pair, 2)); /* made: in flight */
        assert_int_equal(em_device_sync(dev), EM_OK);
        assert_true(em_buffer_settled(made->st->buf));
        /* the kernel's choice: settled buffers with the variable at 1 on any target; at 0
         * never; unset, on CUDA only */
        assert_true(tn_preload_ok(dev, "EMBER_SKINNY_PRELOAD", pair, 2));
        setenv("EMBER_SKINNY_PRELOAD", "0", 1);
        assert_false(tn_preload_ok(dev, "EMBER_SKINNY_PRELOAD", pair, 2));
        unsetenv("EMBER_SKINNY_PRELOAD");
        assert_int_equal(tn_preload_ok(dev, "EMBER_SKINNY_PRELOAD", pair, 2),
                         !strcmp(em_device_caps(dev)->target, "cuda"));
        setenv("EMBER_SKINNY_PRELOAD", "1", 1);
        check_mm("skinny preload made b", rnd(dev, EM_F32, EM_SHAPE(2, 64), 701), made, NULL);
        char what[96];
        for (size_t i = 0; i < EM_ARRAY_LEN(shapes); i++) {
            int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
            em_tensor *a = rnd(dev, EM_F32, EM_SHAPE(M, K), 710 + (uint32_t)i);
            snprintf(what, sizeof what, "skinny preload %lldx%lldx%lld", (long long)M, (long long)N,
                     (long long)K);
            check_mm(what, a, rnd(dev, EM_F32, EM_SHAPE(K, N), 720 + (uint32_t)i), NULL);
            snprintf(what, sizeof what, "skinny preload %lldx%lldx%lld b^T", (long long)M,
                     (long long)N, (long long)K);
            check_mm(what, a,
                     em_transpose(rnd(dev, EM_F32, EM_SHAPE(N, K), 730 + (uint32_t)i), 0, 1), NULL);
        }
        em_matmul_epilogue ep = {.bias = rnd(dev, EM_F32, EM_SHAPE(72), 740),
                                 .act = EM_MATMUL_ACT_GELU_TANH,
                                 .residual = rnd(dev, EM_F32, EM_SHAPE(72), 741),
                                 .ln = true,
                                 .ln_weight = rnd(dev, EM_F32, EM_SHAPE(96), 742),
                                 .ln_bias = rnd(dev, EM_F32, EM_SHAPE(96), 743),
                                 .ln_eps = 1e-5};
        em_tensor *x = rnd(dev, EM_F32, EM_SHAPE(1, 96), 744),
                  *w = rnd(dev, EM_F32, EM_SHAPE(96, 72), 745);
        em_tensor *y = em_matmul_ex(x, w, &ep);
        em_matmul_epilogue plain = ep;
        plain.ln = false;
        em_tensor *ref =
            em_matmul_ex(em_layer_norm(x, 1, ep.ln_weight, ep.ln_bias, 1e-5), w, &plain);
        assert_non_null(y);
        assert_non_null(ref);
        double *rd = tu_read(ref);
        tu_check("skinny preload ln", y, em_shape_of(ref), rd, tol_of(dev, EM_F32, 96));
        free(rd);
        em_scope_end(NULL, 0);
        setenv("EMBER_MATMUL_CONFIG", "skinny 2x1x16 1x1x1 s3", 1);
        em_scope_begin();
        check_mm("skinny preload split-K", rnd(dev, EM_F32, EM_SHAPE(3, 200), 750),
                 em_transpose(rnd(dev, EM_F32, EM_SHAPE(40, 200), 751), 0, 1), NULL);
        em_scope_end(NULL, 0);
        unsetenv("EMBER_MATMUL_CONFIG");
    }
    unsetenv("EMBER_SKINNY_PRELOAD");
}

/* The skinny kernel is the choice for at most 16 rows on an H200 (f32 and bf16, x W and x W^T,
 * decoding's batches folded), with lines of 16 bytes and its butterfly inside a plane; 17 rows
 * are not skinny. */
static void test_skinny_choice_on_h200(void **state)
{
    (void)state;
    em_caps caps;
    em_tensor *t = em_zeros(tu_devs[0], EM_F32, EM_SHAPE(1));
    static const em_scalar types[] = {EM_F32, EM_BF16};
    for (size_t i = 0; i < EM_ARRAY_LEN(types); i++) {
        for (int bt = 0; bt < 2; bt++) {
            mm_problem p =
                h200_problem(&caps, types[i], false, 1, bt ? 50304 : 2304, 768, false, bt, t);
            mm_config c = mm_heuristic(&p);
            assert_int_equal(c.kind, MM_SKINNY);
            assert_int_equal(c.bm, 1);
            mm_skinny_plan q;
            assert_true(mm_skinny_plan_of(&p, &c, &q));
            assert_int_equal(q.v, 16 / (int)em_scalar_size(types[i]));
            assert_int_equal(q.bt, bt != 0);
            assert_int_equal((c.bn * c.tm) % 32 == 0 || c.tm == 1, true);
            mm_config cand[32];
            int n = mm_candidates(&p, false, cand, 32);
            assert_true(n > 1);
            assert_int_equal(cand[0].kind, MM_SKINNY);
            p = h200_problem(&caps, types[i], false, 16, 768, 3072, false, bt, t);
            c = mm_heuristic(&p);
            assert_int_equal(c.kind, MM_SKINNY);
            assert_int_equal(c.bm, 16);
            p = h200_problem(&caps, types[i], false, 17, 768, 3072, false, bt, t);
            c = mm_heuristic(&p);
            assert_true(c.kind != MM_SKINNY);
        }
    }
    em_release(t);
}

/* Empty results and K == 0 (zeros, then the epilogue). */
static void test_empty(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *y =
        em_matmul(em_zeros(dev, EM_F32, EM_SHAPE(0, 3)), em_zeros(dev, EM_F32, EM_SHAPE(3, 4)));
    assert_non_null(y);
    assert_int_equal(em_numel(y), 0);
    check_mm("K = 0", em_zeros(dev, EM_F32, EM_SHAPE(3, 0)), em_zeros(dev, EM_F32, EM_SHAPE(0, 4)),
             NULL);
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_F32, EM_SHAPE(4), 60), .act = EM_MATMUL_ACT_RELU};
    check_mm("K = 0 with bias", em_zeros(dev, EM_F32, EM_SHAPE(3, 0)),
             em_zeros(dev, EM_F32, EM_SHAPE(0, 4)), &ep);
    em_scope_end(NULL, 0);
}

/* em_matmul_sum_b and _into on every device (the column sum after the product where the TMA
 * kernel does not run: tensor.matmul_tma has that one): f32 and bf16, b transposed, the product
 * into a slot beside the sums' slot of one buffer (aligned and not: the copy), against float64;
 * the errors name the shapes and leave the destinations as they were. */
static void test_sum_b(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int k = 0; k < 2; k++) {
            em_scalar dt = k ? EM_BF16 : EM_F32;
            if (!tu_has(dev, dt)) continue;
            em_scope_begin();
            int64_t M = 21, K = 37, N = 19;
            em_tensor *a = rnd(dev, dt, EM_SHAPE(M, K), 301);
            em_tensor *b = em_transpose(rnd(dev, dt, EM_SHAPE(N, K), 302), 0, 1);
            double *av = tu_read(a), *bv = tu_read(b), want[19] = {0};
            em_shape rs;
            double *ref = ref_matmul(av, em_shape_of(a), bv, em_shape_of(b), NULL, 0, NULL,
                                     (em_shape){0}, &rs);
            for (int64_t r = 0; r < K; r++)
                for (int64_t c = 0; c < N; c++) want[c] += bv[r * N + c];
            em_tensor *sums = em_zeros(dev, EM_F32, EM_SHAPE(N));
            em_tensor *y = em_matmul_sum_b(a, b, sums);
            assert_non_null(y);
            tu_check("matmul_sum_b product", y, rs, ref, tol_of(dev, dt, K));
            tu_check("matmul_sum_b sums", sums, EM_SHAPE(N), want, tol_of(dev, dt, K));
            for (int off = 0; off < 2; off++) {
                /* slots at 128 elements (aligned) or 3 (the copy) and after them */
                int64_t at = off ? 3 : 128, n = at + M * N + 64 + N;
                em_tensor *flat = em_full(dev, dt, EM_SHAPE(n), 5.0);
                em_tensor *slot = em_reshape(em_narrow(flat, 0, at, M * N), EM_SHAPE(M, N));
                em_tensor *bs = em_narrow(flat, 0, at + M * N + 64, N);
                assert_int_equal(em_matmul_sum_b_into(slot, a, b, bs), EM_OK);
                tu_check("matmul_sum_b_into product", slot, rs, ref, tol_of(dev, dt, K));
                tu_check("matmul_sum_b_into sums", bs, EM_SHAPE(N), want, tol_of(dev, dt, K) * 4);
                double *fv = tu_read(flat);
                for (int64_t i = 0; i < n; i++)
                    if ((i < at || (i >= at + M * N && i < at + M * N + 64)) && fv[i] != 5.0)
                        fail_msg("matmul_sum_b_into: flat[%lld] changed to %g", (long long)i,
                                 fv[i]);
                free(fv);
                /* the sums overlapping the result: an error, nothing written */
                em_tensor *over = em_narrow(flat, 0, at + M * N - 4, N);
                double *kept = tu_read(flat);
                assert_int_not_equal(em_matmul_sum_b_into(slot, a, b, over), EM_OK);
                assert_non_null(strstr(em_last_error(), "apart from the operands and the result"));
                em_clear_error();
                tu_check("matmul_sum_b_into, refused", flat, EM_SHAPE(n), kept, 0);
                free(kept);
            }
            free(av), free(bv), free(ref);
            em_scope_end(NULL, 0);
        }
    }
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *a = em_zeros(dev, EM_F32, EM_SHAPE(2, 3)),
              *b = em_zeros(dev, EM_F32, EM_SHAPE(3, 5));
    tu_expect_error(em_matmul_sum_b(a, b, em_zeros(dev, EM_F32, EM_SHAPE(4))),
                    "column sums f32[4] do not fit f32[3, 5]");
    tu_expect_error(em_matmul_sum_b(em_zeros(dev, EM_F32, EM_SHAPE(2, 2, 3)), b,
                                    em_zeros(dev, EM_F32, EM_SHAPE(5))),
                    "needs 2-D operands, got f32[2, 2, 3]");
    tu_expect_error(em_matmul_sum_b(a, b, NULL), "no tensor for the column sums");
    assert_int_not_equal(em_matmul_sum_b_into(NULL, a, b, em_zeros(dev, EM_F32, EM_SHAPE(5))), EM_OK);
    assert_non_null(strstr(em_last_error(), "no tensor for the result"));
    assert_int_not_equal(em_matmul_sum_b_into(em_zeros(dev, EM_F32, EM_SHAPE(5, 2)), a, b,
                                              em_zeros(dev, EM_F32, EM_SHAPE(5))),
                         EM_OK);
    assert_non_null(strstr(em_last_error(), "result f32[5, 2] does not fit f32[2, 3] x f32[3, 5]"));
    em_clear_error();
    em_scope_end(NULL, 0);
}

static void test_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_scope_begin();
    em_tensor *a = em_zeros(dev, EM_F32, EM_SHAPE(2, 3));
    em_tensor *b = em_zeros(dev, EM_F32, EM_SHAPE(4, 5));
    tu_expect_error(em_matmul(a, b), "f32[2, 3]");
    assert_non_null(strstr(em_last_error(), "f32[4, 5]"));
    tu_expect_error(em_matmul(a, em_zeros(dev, EM_F16, EM_SHAPE(3, 5))),
                    "dtypes f32 and f16 differ");
    em_tensor *b2 = em_zeros(dev, EM_F32, EM_SHAPE(3, 5));
    em_matmul_epilogue bad_bias = {.bias = em_zeros(dev, EM_F32, EM_SHAPE(4))};
    tu_expect_error(em_matmul_ex(a, b2, &bad_bias), "bias f32[4] does not fit result f32[2, 5]");
    em_matmul_epilogue bad_res = {.residual = em_zeros(dev, EM_F32, EM_SHAPE(3, 5))};
    tu_expect_error(em_matmul_ex(a, b2, &bad_res),
                    "residual f32[3, 5] does not broadcast to result f32[2, 5]");
    em_tensor *ai = em_zeros(dev, EM_I32, EM_SHAPE(2, 3)),
              *bi = em_zeros(dev, EM_I32, EM_SHAPE(3, 5));
    em_matmul_epilogue gelu = {.act = EM_MATMUL_ACT_GELU};
    tu_expect_error(em_matmul_ex(ai, bi, &gelu),
                    "GELU epilogue needs floating-point operands, got i32");
    em_matmul_epilogue unknown = {.act = (em_matmul_act)9};
    tu_expect_error(em_matmul_ex(a, b2, &unknown), "unknown epilogue activation 9");
    tu_expect_error(em_matmul(em_zeros(dev, EM_F32, EM_SHAPE(2, 2, 3)),
                              em_zeros(dev, EM_F32, EM_SHAPE(3, 3, 5))),
                    "cannot be broadcast");
    assert_null(em_matmul_ex(NULL, b2, &gelu));
    em_scope_end(NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes_odd_sizes),
        cmocka_unit_test(test_layouts_batches),
        cmocka_unit_test(test_simt_configs),
        cmocka_unit_test(test_mma_kernel),
        cmocka_unit_test(test_mma_variants),
        cmocka_unit_test(test_mma_choice_on_h200),
        cmocka_unit_test(test_wgmma_kernel),
        cmocka_unit_test(test_wgmma_ws_kernel),
        cmocka_unit_test(test_wgmma_choice_on_h200),
        cmocka_unit_test(test_epilogue),
        cmocka_unit_test(test_cpu_kernel),
        cmocka_unit_test(test_split_k_default),
        cmocka_unit_test(test_skinny),
        cmocka_unit_test(test_skinny_preload),
        cmocka_unit_test(test_skinny_choice_on_h200),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_sum_b),
    };
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
