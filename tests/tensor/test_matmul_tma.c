/* test_matmul_tma.c — the TMA-fed warp-specialized Hopper matmul (matmul_wgmma_tma.ek,
 * configuration "wgmma-tma") forced through $EMBER_MATMUL_CONFIG on the CPU, whose tma_load
 * copies boxes with the hardware's swizzle and zero fill and whose warpgroup MMAs read them as
 * the hardware does (and natively on CUDA sm_90a devices): one to three consumers, BN 64 to 256,
 * odd sizes (edges off every tile, K tails), all four operand layouts, batches (flattened and
 * broadcast), split-K and the epilogue, against float64; the profiler shows that this kernel
 * ran. Operands TMA cannot describe (K = 70: rows not 16-byte multiples; batch dims that do not
 * flatten to one stride) must fall back to another kernel, still right. Also the configuration's
 * text, its plan and its place in the default autotune candidates of an sm_90a device. All of it
 * again for "wgmma-tma-se" (the epilogue in 16-byte lines through shared memory) and
 * "wgmma-tma-p" (that and persistent cubes, also with more tiles than cubes); and the ping-pong
 * form "wgmma-tma-pp" (two consumers taking a cube's tiles in turns: 128 x 128 and 64 x 256 a
 * consumer), with three tiles a cube so that one consumer skips the other's tile in the ring;
 * and the cooperative 256 x 128 (and 256 x 192) tile "wgmma-tma-p 256x128x64 2x1" (two consumers
 * of 128 rows each on one tile, two accumulator sets a unit). The lines-of-4 form "wgmma-tma-ppr"
 * also with GELU-tanh's backward moved into its epilogue by fusion, and with the column sums of
 * its result (a bias's gradient) taken in the epilogue, and with an activation whose input is
 * kept written by the epilogue as well. */
#include "tensor_util.h"
#include "tensor/matmul_internal.h"
#include "ember/tensor_grad.h"

/* a [Ba?, M, K] x b [Bb?, K, N] (+ bias[n], ReLU, + residual [M, N]) in float64; a batch of 1
 * or none broadcasts. */
static double *ref_mm(const em_tensor *a, const em_tensor *b, const em_matmul_epilogue *ep,
                      int64_t *nb_out)
{
    em_shape as = em_shape_of(a), bs = em_shape_of(b);
    int64_t M = as.d[as.rank - 2], K = as.d[as.rank - 1], N = bs.d[bs.rank - 1];
    int64_t ba = as.rank > 2 ? as.d[0] : 1, bb = bs.rank > 2 ? bs.d[0] : 1;
    int64_t nb = ba > bb ? ba : bb;
    double *ad = tu_read(a), *bd = tu_read(b), *bias = NULL, *res = NULL;
    if (ep && ep->bias) bias = tu_read(ep->bias);
    if (ep && ep->residual) res = tu_read(ep->residual);
    double *out = calloc((size_t)(nb * M * N), sizeof(double));
    assert_non_null(out);
    for (int64_t z = 0; z < nb; z++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                const double *ar = ad + ((ba > 1 ? z : 0) * M + m) * K;
                const double *bc = bd + (bb > 1 ? z : 0) * K * N + n;
                for (int64_t k = 0; k < K; k++) s += ar[k] * bc[k * N];
                if (bias) s += bias[n];
                if (ep && ep->act == EM_MATMUL_ACT_RELU) s = s > 0 ? s : 0;
                if (res) s += res[m * N + n];
                out[(z * M + m) * N + n] = s;
            }
    free(ad), free(bd), free(bias), free(res);
    *nb_out = nb;
    return out;
}

static em_tensor *rnd(em_device *dev, em_scalar dt, em_shape s, uint32_t seed)
{
    size_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= (size_t)s.d[i];
    double *v = malloc((n + 1) * sizeof(double));
    assert_non_null(v);
    tu_fill(v, n, -1, 1, seed);
    em_tensor *t = tu_tensor(dev, dt, s, v);
    free(v);
    return t;
}

/* Checks a x b (+ ep) under the configuration `cfg` against float64, and whether the TMA kernel
 * ran (tma) or another one did. */
static void check_ref(const char *what, const char *cfg, bool tma, const em_tensor *a,
                      const em_tensor *b, const em_matmul_epilogue *ep, const em_tensor *ref_a)
{
    assert_non_null(a);
    assert_non_null(b);
    setenv("EMBER_MATMUL_CONFIG", cfg, 1);
    em_profile_reset();
    em_tensor *y = em_matmul_ex(a, b, ep);
    if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_non_null(y);
    int64_t nb = 0;
    double *ref = ref_mm(ref_a ? ref_a : a, b, ep, &nb);
    em_shape rs = em_shape_of(y);
    char label[256];
    snprintf(label, sizeof label, "%s (%s, %s)", what, cfg, em_scalar_name(em_dtype(a)));
    tu_check(label, y, rs, ref, tu_tol(em_dtype(a))); /* reading y runs the pending matmul */
    em_profile_kernel pk;
    bool ran = em_profile_kernel_get("matmul_wgmma_tma", &pk) && pk.launches > 0;
    if (ran != tma) fail_msg("%s: the TMA kernel %s", what, ran ? "ran" : "did not run");
    assert_int_equal(em_numel(y), nb * rs.d[rs.rank - 2] * rs.d[rs.rank - 1]);
    free(ref);
    em_release(y);
    unsetenv("EMBER_MATMUL_CONFIG");
}

static void check(const char *what, const char *cfg, bool tma, const em_tensor *a,
                  const em_tensor *b, const em_matmul_epilogue *ep)
{
    check_ref(what, cfg, tma, a, b, ep, NULL);
}

/* The cases every form of the kernel must get right; kind is "wgmma-tma", "wgmma-tma-se"
 * (the epilogue in 16-byte lines through shared memory) or "wgmma-tma-p" (that and persistent
 * cubes). */
static void tma_cases(em_device *dev, const char *kind)
{
    char c2[64], c256[64], c1[64], c3[64];
    snprintf(c2, sizeof c2, "%s 128x128x64 2x1 s1", kind);
    snprintf(c256, sizeof c256, "%s 128x256x64 2x1 s1", kind);
    snprintf(c1, sizeof c1, "%s 64x256x64 1x1 s1", kind);
    snprintf(c3, sizeof c3, "%s 192x64x64 3x1 s2", kind);
    check("2x128 row-major, edges and K tail", c2, true, rnd(dev, EM_BF16, EM_SHAPE(257, 200), 1),
          rnd(dev, EM_BF16, EM_SHAPE(200, 136), 2), NULL);
    check("2x128 one row", c2, true, rnd(dev, EM_BF16, EM_SHAPE(1, 48), 3),
          rnd(dev, EM_BF16, EM_SHAPE(48, 8), 4), NULL);
    check("2x128 a^T b (MN-major a)", c2, true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(136, 72), 5), 0, 1),
          rnd(dev, EM_BF16, EM_SHAPE(136, 80), 6), NULL);
    check("2x256 a b^T (K-major b), setmaxnreg", c256, true,
          rnd(dev, EM_F16, EM_SHAPE(70, 264), 7),
          em_transpose(rnd(dev, EM_F16, EM_SHAPE(264, 264), 8), 0, 1), NULL);
    check("1x256 batched both", c1, true, rnd(dev, EM_BF16, EM_SHAPE(3, 33, 72), 9),
          rnd(dev, EM_BF16, EM_SHAPE(3, 72, 40), 10), NULL);
    check("1x256 b broadcast over the batch", c1, true, rnd(dev, EM_BF16, EM_SHAPE(2, 65, 64), 11),
          rnd(dev, EM_BF16, EM_SHAPE(64, 24), 12), NULL);
    em_tensor *bias = rnd(dev, EM_BF16, EM_SHAPE(72), 13);
    em_matmul_epilogue ep = {.bias = bias,
                             .act = EM_MATMUL_ACT_RELU,
                             .residual = rnd(dev, EM_BF16, EM_SHAPE(40, 72), 14)};
    /* split-K: the partials go out element by element in every form */
    check("3x64 split-K, epilogue, both transposed", c3, true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(520, 40), 15), 0, 1),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(72, 520), 16), 0, 1), &ep);
    /* N = 76 (b K-major): out's rows are not whole lines of 8, so the element-wise epilogue
     * runs in every form; M ends inside a tile */
    em_matmul_epilogue ep2 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(76), 21),
                              .act = EM_MATMUL_ACT_RELU,
                              .residual = rnd(dev, EM_BF16, EM_SHAPE(131, 76), 22)};
    check("2x128 epilogue, N = 76", c2, true, rnd(dev, EM_BF16, EM_SHAPE(131, 96), 23),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(76, 96), 24), 0, 1), &ep2);
    /* the epilogue on the line path: N = 200 ends inside a chunk of 32, M inside a tile */
    em_matmul_epilogue ep4 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(200), 28),
                              .act = EM_MATMUL_ACT_RELU,
                              .residual = rnd(dev, EM_BF16, EM_SHAPE(131, 200), 29)};
    check("2x128 epilogue, edges", c2, true, rnd(dev, EM_BF16, EM_SHAPE(131, 96), 30),
          rnd(dev, EM_BF16, EM_SHAPE(96, 200), 37), &ep4);
    em_matmul_epilogue ep3 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(264), 25)};
    check("2x256 bias, a^T b^T", c256, true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(64, 136), 26), 0, 1),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(264, 64), 27), 0, 1), &ep3);
    /* K = 70: rows of a are not 16-byte multiples; the configuration is invalid and the
     * heuristic's kernel runs */
    check("K = 70 falls back", c2, false, rnd(dev, EM_BF16, EM_SHAPE(30, 70), 17),
          rnd(dev, EM_BF16, EM_SHAPE(70, 24), 18), NULL);
    /* batch dims that do not flatten to one stride (a [3, 2, ...] with its batch dims
     * swapped): no 3-D map describes it */
    em_tensor *sw = em_transpose(rnd(dev, EM_BF16, EM_SHAPE(3, 2, 16, 64), 19), 0, 1);
    em_tensor *flat = em_reshape(em_contiguous(sw), EM_SHAPE(6, 16, 64));
    check_ref("uneven batch falls back", c2, false, sw, rnd(dev, EM_BF16, EM_SHAPE(64, 16), 20),
              NULL, flat);
}

/* A multi-tile form's cases (the ping-pong consumers', the cooperative 256-row tile's): rows
 * around its tile's edges, every operand layout, batches, the epilogue (16-byte lines and
 * element-wise), split-K chunks of unequal length; and the configurations it refuses. main is
 * the form's usual configuration, alt another tile of it (used where the field says), split
 * main's split-K form; the row counts are chosen per form so that the edges fall inside tiles
 * (m_mn, m_lines and m_split multiples of 8: 16-byte rows of an MN-major a or the result). */
typedef struct tile_form {
    const char *name, *main, *alt, *split;
    bool alt_kb, alt_batch, alt_tt; /* which cases take alt */
    int64_t m_edge, m_mn, m_kb, m_batch, m_bcast, m_lines, m_mn_epi, m_elem, m_split;
    const char *refused[4];
} tile_form;

static void tile_form_cases(em_device *dev, const tile_form *f, uint32_t seed)
{
    char what[128];
#define CASE(txt) (snprintf(what, sizeof what, "%s %s", f->name, txt), what)
    check(CASE("row-major, edges and K tail"), f->main, true,
          rnd(dev, EM_BF16, EM_SHAPE(f->m_edge, 200), seed), rnd(dev, EM_BF16, EM_SHAPE(200, 136), seed + 1),
          NULL);
    check(CASE("one row"), f->main, true, rnd(dev, EM_BF16, EM_SHAPE(1, 48), seed + 2),
          rnd(dev, EM_BF16, EM_SHAPE(48, 8), seed + 3), NULL);
    check(CASE("a^T b (MN-major a)"), f->main, true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(136, f->m_mn), seed + 4), 0, 1),
          rnd(dev, EM_BF16, EM_SHAPE(136, 80), seed + 5), NULL);
    check(CASE("a b^T (K-major b), f16"), f->alt_kb ? f->alt : f->main, true,
          rnd(dev, EM_F16, EM_SHAPE(f->m_kb, 264), seed + 6),
          em_transpose(rnd(dev, EM_F16, EM_SHAPE(264, 264), seed + 7), 0, 1), NULL);
    check(CASE("batched both"), f->alt_batch ? f->alt : f->main, true,
          rnd(dev, EM_BF16, EM_SHAPE(3, f->m_batch, 72), seed + 8),
          rnd(dev, EM_BF16, EM_SHAPE(3, 72, 40), seed + 9), NULL);
    check(CASE("b broadcast over the batch"), f->main, true,
          rnd(dev, EM_BF16, EM_SHAPE(2, f->m_bcast, 64), seed + 10),
          rnd(dev, EM_BF16, EM_SHAPE(64, 24), seed + 11), NULL);
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_BF16, EM_SHAPE(200), seed + 12),
                             .act = EM_MATMUL_ACT_RELU,
                             .residual = rnd(dev, EM_BF16, EM_SHAPE(f->m_lines, 200), seed + 13)};
    check(CASE("epilogue, edges (16-byte lines)"), f->main, true,
          rnd(dev, EM_BF16, EM_SHAPE(f->m_lines, 96), seed + 14),
          rnd(dev, EM_BF16, EM_SHAPE(96, 200), seed + 15), &ep);
    em_matmul_epilogue ep1 = {.bias = ep.bias,
                              .act = EM_MATMUL_ACT_RELU,
                              .residual = rnd(dev, EM_BF16, EM_SHAPE(f->m_mn_epi, 200), seed + 16)};
    check(CASE("epilogue, a^T b^T"), f->alt_tt ? f->alt : f->main, true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(96, f->m_mn_epi), seed + 17), 0, 1),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(200, 96), seed + 18), 0, 1), &ep1);
    /* N = 76: rows not whole lines of 8, the element-wise epilogue */
    em_matmul_epilogue ep2 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(76), seed + 19),
                              .act = EM_MATMUL_ACT_RELU,
                              .residual = rnd(dev, EM_BF16, EM_SHAPE(f->m_elem, 76), seed + 20)};
    check(CASE("epilogue, N = 76"), f->main, true, rnd(dev, EM_BF16, EM_SHAPE(f->m_elem, 96), seed + 21),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(76, 96), seed + 22), 0, 1), &ep2);
    /* split-K: K = 520 in chunks of 320 and 200 (5 and 4 k tiles), partials element-wise */
    em_matmul_epilogue ep3 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(72), seed + 23),
                              .act = EM_MATMUL_ACT_RELU,
                              .residual = rnd(dev, EM_BF16, EM_SHAPE(f->m_split, 72), seed + 24)};
    check(CASE("split-K, epilogue, both transposed"), f->split, true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(520, f->m_split), seed + 25), 0, 1),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(72, 520), seed + 26), 0, 1), &ep3);
    for (int i = 0; i < 4 && f->refused[i]; i++)
        check(CASE("refused form"), f->refused[i], false, rnd(dev, EM_BF16, EM_SHAPE(30, 64), seed + 27),
              rnd(dev, EM_BF16, EM_SHAPE(64, 24), seed + 28), NULL);
#undef CASE
}

/* The ping-pong form (a consumer's tile of 128 x 128: two accumulator sets; or 64 x 256) and the
 * cooperative 256-row tile (consumer 2's second accumulator set, rows 192 .. 255, in use in every
 * case but the one-row one; bn 192 too). */
static void multi_tile_cases(em_device *dev)
{
    static const tile_form pp = {"pp", "wgmma-tma-pp 128x128x64 2x1 s1",
                                 "wgmma-tma-pp 64x256x64 2x1 s1", "wgmma-tma-pp 128x128x64 2x1 s2",
                                 true, true, true, 257, 200, 70, 133, 130, 131, 136, 131, 136,
                                 /* 256 accumulators a unit; one consumer */
                                 {"wgmma-tma-pp 128x256x64 2x1 s1", "wgmma-tma-pp 64x128x64 1x1 s1"}};
    static const tile_form coop = {"coop", "wgmma-tma-p 256x128x64 2x1 s1",
                                   "wgmma-tma-p 256x192x64 2x1 s1", "wgmma-tma-p 256x128x64 2x1 s2",
                                   false, false, false, 301, 264, 250, 233, 260, 251, 248, 231, 256,
                                   /* 256 accumulators a unit, one consumer, the other forms */
                                   {"wgmma-tma-p 256x256x64 2x1 s1", "wgmma-tma-p 256x128x64 1x1 s1",
                                    "wgmma-tma-se 256x128x64 2x1 s1", "wgmma-tma 256x128x64 2x1 s1"}};
    /* both in clusters of two cubes on two row tiles (b's tile multicast on CUDA; on the CPU the
     * cluster's order of tiles, with the second row tile past M where the rows of tiles are
     * odd: the ping-pong form there, whose binaries are the slow part of this test); refused:
     * no persistent form, b's tile one 64-column box (nothing to share out), 3 cubes */
    static const tile_form ppc = {"pp cluster",
                                  "wgmma-tma-pp 128x128x64 2x2 s1",
                                  "wgmma-tma-pp 64x256x64 2x2 s1",
                                  "wgmma-tma-pp 128x128x64 2x2 s2",
                                  true,
                                  true,
                                  true,
                                  257,
                                  200,
                                  70,
                                  133,
                                  130,
                                  131,
                                  136,
                                  131,
                                  136,
                                  {"wgmma-tma-se 128x128x64 2x2 s1", "wgmma-tma-p 128x64x64 2x2 s1",
                                   "wgmma-tma-pp 128x128x64 2x3 s1"}};
    static const tile_form coopc = {
        "coop cluster",
        "wgmma-tma-p 256x128x64 2x2 s1",
        "wgmma-tma-p 128x256x64 2x2 s1",
        "wgmma-tma-p 256x128x64 2x2 s2",
        true,
        false,
        true,
        301,
        264,
        250,
        233,
        260,
        251,
        248,
        231,
        256,
        {"wgmma-tma 128x128x64 2x2 s1", "wgmma-tma-p 256x64x64 2x2 s1"}};
    tile_form_cases(dev, &pp, 41);
    tile_form_cases(dev, &coop, 81);
    tile_form_cases(dev, &ppc, 121);
    if (!strcmp(em_device_caps(dev)->target, "cuda")) tile_form_cases(dev, &coopc, 161);
    check("coop 256x192 row-major, edges", coop.alt, true, rnd(dev, EM_BF16, EM_SHAPE(253, 136), 108),
          rnd(dev, EM_BF16, EM_SHAPE(136, 200), 109), NULL);
}

/* dev's compute units (1 where it does not say). */
static int64_t compute_units(em_device *dev)
{
    uint32_t n = em_device_caps(dev)->compute_units;
    return n ? n : 1;
}

/* Runs cases on every test device that runs the TMA kernel (the CPU target's emulation, or an
 * sm_90a GPU), with launch profiling on so that check() can see which kernel ran. */
static void on_tma_devices(void (*cases)(em_device *))
{
    em_profile_enable(true);
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const em_caps *caps = em_device_caps(dev);
        bool native = !strcmp(caps->target, "cuda") && !strcmp(caps->arch, "sm_90a");
        if (strcmp(caps->target, "c") != 0 && !native) continue;
        em_scope_begin();
        cases(dev);
        em_scope_end(NULL, 0);
    }
    em_profile_enable(false);
}

static void tma_kernel_cases(em_device *dev)
{
    tma_cases(dev, "wgmma-tma");
    tma_cases(dev, "wgmma-tma-se");
    tma_cases(dev, "wgmma-tma-p");
    multi_tile_cases(dev);
}

static void test_tma_kernel(void **state)
{
    (void)state;
    on_tma_devices(tma_kernel_cases);
}

/* Persistent cubes with more tiles than cubes (a cube runs several, the ring's phases going on
 * from tile to tile), over a batch and with the whole epilogue (GELU). */
static void tma_persistent_cases(em_device *dev)
{
    /* 64 x 64 tiles, 3 along N: at least 2 compute units' worth of tiles plus one */
    int64_t cus = compute_units(dev);
    int64_t tiles = 2 * cus + 1, batch = 2;
    int64_t m = ((tiles + 3 * batch - 1) / (3 * batch)) * 64 - 9;
    const char *cfg = "wgmma-tma-p 64x64x64 1x1 s1";
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_BF16, EM_SHAPE(136), 31),
                             .act = EM_MATMUL_ACT_RELU,
                             .residual = rnd(dev, EM_BF16, EM_SHAPE(m, 136), 32)};
    check("persistent 1x64, batch, epilogue", cfg, true,
          rnd(dev, EM_BF16, EM_SHAPE(batch, m, 200), 33),
          rnd(dev, EM_BF16, EM_SHAPE(batch, 200, 136), 34), &ep);
    /* two consumers, K of one k tile (each tile is one ring use) */
    check("persistent 2x128, K = 64", "wgmma-tma-p 128x128x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(m * 2 + 3, 64), 35),
          rnd(dev, EM_BF16, EM_SHAPE(64, 520), 36), NULL);
}

static void test_tma_persistent(void **state)
{
    (void)state;
    on_tma_devices(tma_persistent_cases);
}

/* The ping-pong form with three tiles a cube (one per compute unit: cube c runs tiles c, c + cus,
 * c + 2 cus): consumer 1 runs the first and the third, counting the second's ring uses (consumer
 * 2's) in between; k tiles a tile not a multiple of the ring's stages, so a wrong count reads
 * another stage. Over a batch with the whole epilogue, b broadcast, and split-K chunks of 3, 3
 * and 2 k tiles. */
static void tma_pingpong_cases(em_device *dev)
{
    int64_t cus = compute_units(dev);
    /* a batch of 3, one tile along N, cus along M: 3 cus tiles */
    int64_t m = cus * 128 - 9;
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_BF16, EM_SHAPE(120), 71),
                             .act = EM_MATMUL_ACT_RELU,
                             .residual = rnd(dev, EM_BF16, EM_SHAPE(m, 120), 72)};
    check("pp 128x128, 3 tiles a cube, batch, epilogue", "wgmma-tma-pp 128x128x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(3, m, 200), 73),
          rnd(dev, EM_BF16, EM_SHAPE(3, 200, 120), 74), &ep);
    check("pp 64x256, 3 tiles a cube, b broadcast", "wgmma-tma-pp 64x256x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(3, cus * 64 - 5, 136), 75),
          rnd(dev, EM_BF16, EM_SHAPE(136, 200), 76), NULL);
    /* split-K 3: K = 456 in chunks of 192, 192 and 72 (3, 3 and 2 k tiles); MN-major a */
    em_matmul_epilogue ep2 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(72), 77),
                              .act = EM_MATMUL_ACT_RELU};
    check("pp 128x128, 3 split-K chunks a cube", "wgmma-tma-pp 128x128x64 2x1 s3", true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(456, cus * 128 - 8), 78), 0, 1),
          rnd(dev, EM_BF16, EM_SHAPE(456, 72), 79), &ep2);
}

static void test_tma_pingpong(void **state)
{
    (void)state;
    on_tma_devices(tma_pingpong_cases);
}

/* The cooperative 256 x 128 tile with more tiles than cubes (2 cus + 1: a cube runs two or three,
 * the ring's phases going on from tile to tile, k tiles a tile not a multiple of the 4 stages),
 * over a batch with the whole epilogue; and MN-major a with split-K chunks of 3 and 2 k tiles. */
static void tma_coop_cases(em_device *dev)
{
    int64_t cus = compute_units(dev);
    int64_t tiles = 2 * cus + 1, batch = 2;
    /* 2 tiles along N (200), (tiles / 4 rounded up) along M a batch entry */
    int64_t m = ((tiles + 2 * batch - 1) / (2 * batch)) * 256 - 13;
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_BF16, EM_SHAPE(200), 112),
                             .act = EM_MATMUL_ACT_RELU,
                             .residual = rnd(dev, EM_BF16, EM_SHAPE(m, 200), 113)};
    check("coop 256x128, more tiles than cubes, batch, epilogue",
          "wgmma-tma-p 256x128x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(batch, m, 328), 114),
          rnd(dev, EM_BF16, EM_SHAPE(batch, 328, 200), 115), &ep);
    check("coop 256x128, split-K 2, MN-major a", "wgmma-tma-p 256x128x64 2x1 s2", true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(320, cus * 256 - 8), 116), 0, 1),
          rnd(dev, EM_BF16, EM_SHAPE(320, 72), 117), NULL);
}

static void test_tma_coop(void **state)
{
    (void)state;
    on_tma_devices(tma_coop_cases);
}

/* GELU-tanh's backward moved into the matmul's epilogue (fusion_matmul.c: em_gelu_backward of
 * the donated product, x the GELU's input, read as the residual is) under configuration cfg:
 * (a b) gelu_tanh'(x) against float64, in `launches` kernels (the TMA kernel, and split-K's
 * reduction where it splits), none of them the op's own. */
static void check_gelu_grad(const char *what, const char *cfg, em_tensor *a, em_tensor *b,
                            em_tensor *x, uint64_t launches)
{
    int64_t nb = 0;
    double *ref = ref_mm(a, b, NULL, &nb), *xv = tu_read(x); /* (reading b^T launches a copy) */
    setenv("EMBER_MATMUL_CONFIG", cfg, 1);
    setenv("EMBER_MATMUL_GELU_GRAD", "1", 1); /* opt-in */
    em_profile_reset();
    assert_int_equal(em_flush(), EM_OK);
    uint64_t l0 = em_tensor_stats_get().launches;
    em_tensor *y = em_gelu_backward(em_take(em_matmul(a, b)), x, true);
    if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_non_null(y);
    em_shape rs = em_shape_of(y);
    for (int64_t i = 0; i < em_numel(y); i++) {
        double v = xv[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v), t = tanh(u);
        ref[i] *=
            0.5 * (1 + t) + 0.5 * v * (1 - t * t) * 0.7978845608028654 * (1 + 0.134145 * v * v);
    }
    char label[256];
    snprintf(label, sizeof label, "%s (%s, gelu_tanh backward)", what, cfg);
    tu_check(label, y, rs, ref, tu_tol(em_dtype(a)));
    uint64_t ran = em_tensor_stats_get().launches - l0;
    em_profile_kernel pk;
    if (!em_profile_kernel_get("matmul_wgmma_tma", &pk) || pk.launches != 1 || ran != launches)
        fail_msg("%s: %llu launches (want %llu, the TMA kernel's one of them)", label,
                 (unsigned long long)ran, (unsigned long long)launches);
    free(ref);
    free(xv);
    em_release(y);
    unsetenv("EMBER_MATMUL_CONFIG");
    unsetenv("EMBER_MATMUL_GELU_GRAD");
}

/* "wgmma-tma-ppr": the ping-pong form with the results as lines of 4 (2 where 4 do not fit)
 * straight from the registers in place of the staged 16-byte epilogue: edges, the epilogue, a
 * batch, clusters. On the CPU the neighbouring units swap their pairs through shared memory,
 * on CUDA by plane shuffles. */
static void tma_pairs_cases(em_device *dev)
{
    check("pairs pp 64x256, edges", "wgmma-tma-ppr 64x256x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(131, 200), 201), rnd(dev, EM_BF16, EM_SHAPE(200, 264), 202),
          NULL);
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_BF16, EM_SHAPE(88), 203),
                             .act = EM_MATMUL_ACT_RELU,
                             .residual = rnd(dev, EM_BF16, EM_SHAPE(70, 88), 204)};
    check("pairs pp 128x128 clusters, epilogue, N = 88", "wgmma-tma-ppr 128x128x64 2x2 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(70, 96), 205), rnd(dev, EM_BF16, EM_SHAPE(96, 88), 206), &ep);
    check("pairs pp 128x128, batched", "wgmma-tma-ppr 128x128x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(2, 140, 64), 207), rnd(dev, EM_BF16, EM_SHAPE(2, 64, 72), 208),
          NULL);
    /* 192 columns a consumer (192 accumulators a unit): edges along N and M, the epilogue */
    em_matmul_epilogue ep2 = {.bias = rnd(dev, EM_BF16, EM_SHAPE(400), 213),
                              .act = EM_MATMUL_ACT_RELU,
                              .residual = rnd(dev, EM_BF16, EM_SHAPE(300, 400), 214)};
    check("pairs pp 128x192, edges, epilogue", "wgmma-tma-ppr 128x192x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(300, 200), 215), rnd(dev, EM_BF16, EM_SHAPE(200, 400), 216),
          &ep2);
    /* in clusters of two (on CUDA b's three boxes multicast two from one cube, one from the
     * other; K-major b in halves of 96 rows) */
    check("pairs pp 128x192 clusters, edges, epilogue", "wgmma-tma-ppr 128x192x64 2x2 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(300, 200), 215), rnd(dev, EM_BF16, EM_SHAPE(200, 400), 216),
          &ep2);
    /* split-K 4 (the weight gradients' form): K = 600 in chunks of 192, 192, 192 and 24, an
     * MN-major a as x^T is */
    check("pairs pp 128x192, 4 split-K chunks, MN-major a", "wgmma-tma-ppr 128x192x64 2x1 s4", true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 221), 0, 1),
          rnd(dev, EM_BF16, EM_SHAPE(600, 200), 222), NULL);
    /* lines of 2 where lines of 4 do not fit (partials' rows of N = 202: even, not a multiple
     * of 4) or are turned off; every other case here stores lines of 4 */
    check("pairs pp 128x192, 4 split-K chunks, N = 202, K-major b",
          "wgmma-tma-ppr 128x192x64 2x1 s4", true, rnd(dev, EM_BF16, EM_SHAPE(136, 600), 223),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(202, 600), 224), 0, 1), NULL);
    setenv("EMBER_MATMUL_QUADS", "0", 1);
    check("pairs pp 128x192, edges, epilogue, lines of 2", "wgmma-tma-ppr 128x192x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(300, 200), 215), rnd(dev, EM_BF16, EM_SHAPE(200, 400), 216),
          &ep2);
    unsetenv("EMBER_MATMUL_QUADS");
    check("pairs pp 128x192 clusters, K-major b", "wgmma-tma-ppr 128x192x64 2x2 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(520, 136), 219),
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(392, 136), 220), 0, 1), NULL);
    /* GELU-tanh's backward in the epilogue (an MLP's input gradient: dy W^T, K-major b), from
     * the registers and through split-K's reduction */
    check_gelu_grad("pairs pp 128x192, gelu backward, edges", "wgmma-tma-ppr 128x192x64 2x1 s1",
                    rnd(dev, EM_BF16, EM_SHAPE(300, 200), 225),
                    em_transpose(rnd(dev, EM_BF16, EM_SHAPE(400, 200), 226), 0, 1),
                    rnd(dev, EM_BF16, EM_SHAPE(300, 400), 227), 1);
    check_gelu_grad("pairs pp 128x192, gelu backward, 4 split-K chunks",
                    "wgmma-tma-ppr 128x192x64 2x1 s4", rnd(dev, EM_BF16, EM_SHAPE(136, 600), 228),
                    rnd(dev, EM_BF16, EM_SHAPE(600, 200), 229),
                    rnd(dev, EM_BF16, EM_SHAPE(136, 200), 230), 2);
    /* "wgmma-tma-pr": the persistent cooperative forms with that epilogue */
    check("pairs coop 256x192, edges, MN-major a", "wgmma-tma-pr 256x192x64 2x1 s1", true,
          em_transpose(rnd(dev, EM_BF16, EM_SHAPE(136, 264), 217), 0, 1),
          rnd(dev, EM_BF16, EM_SHAPE(136, 400), 218), NULL);
    check("pairs coop 256x128, edges", "wgmma-tma-pr 256x128x64 2x1 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(300, 136), 209), rnd(dev, EM_BF16, EM_SHAPE(136, 200), 210),
          NULL);
    check("pairs coop 256x128 clusters, epilogue, N = 88", "wgmma-tma-pr 256x128x64 2x2 s1", true,
          rnd(dev, EM_BF16, EM_SHAPE(70, 96), 205), rnd(dev, EM_BF16, EM_SHAPE(96, 88), 206), &ep);
    check("pairs coop 128x256 clusters, batched, K-major b", "wgmma-tma-pr 128x256x64 2x2 s1",
          true, rnd(dev, EM_F16, EM_SHAPE(2, 140, 72), 211),
          em_transpose(rnd(dev, EM_F16, EM_SHAPE(2, 264, 72), 212), 1, 2), NULL);
}

static void test_tma_pairs(void **state)
{
    (void)state;
    on_tma_devices(tma_pairs_cases);
}

/* How check_colsum's sums and check_pre's kept input are made: by a launch after the product
 * (the switch on, the configuration unable), in the kernel's epilogue, or with the switch off
 * (the default). */
enum { AFTER, IN_EPILOGUE, SWITCH_OFF };

/* The column sums of a pending product taken with it (em_sum_leading_into on its whole result:
 * fusion_matmul.c's fu_mm_colsum_into, mm_problem.colsum): with GELU-tanh's backward of x in the
 * epilogue where x is given (an MLP's fc bias gradient), under configuration cfg. The sums
 * (into an f32 [N]) match float64 sums of the result as stored, and the result still matches
 * float64. IN_EPILOGUE: the kernel's epilogue took them (CS), so the column-sum launch read only
 * its partials (f32, a row per 64 mw rows); else (AFTER, SWITCH_OFF) it read the whole result. */
static void check_colsum(const char *what, const char *cfg, em_tensor *a, em_tensor *b,
                         em_tensor *x, int how)
{
    bool cs = how == IN_EPILOGUE;
    int64_t nb = 0;
    double *ref = ref_mm(a, b, NULL, &nb), *xv = x ? tu_read(x) : NULL;
    setenv("EMBER_MATMUL_CONFIG", cfg, 1);
    em_device *dev = em_tensor_device(a);
    em_shape as = em_shape_of(a), bs = em_shape_of(b);
    int64_t M = as.d[as.rank - 2], N = bs.d[bs.rank - 1];
    em_tensor *sums = em_zeros(dev, EM_F32, EM_SHAPE(N));
    assert_non_null(sums);
    assert_int_equal(em_flush(), EM_OK);
    if (how != SWITCH_OFF) setenv("EMBER_MATMUL_COLSUM", "1", 1); /* opt-in */
    setenv("EMBER_MATMUL_GELU_GRAD", "1", 1);
    em_profile_reset();
    em_tensor *y = em_matmul(a, b); /* (not taken: em_sum_leading_into would consume it) */
    if (x) y = em_gelu_backward(em_take(y), x, true);
    assert_non_null(y);
    em_status st = em_sum_leading_into(sums, y);
    if (st != EM_OK) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_int_equal(st, EM_OK);
    char label[256];
    snprintf(label, sizeof label, "%s (%s, column sums)", what, cfg);
    if (xv)
        for (int64_t i = 0; i < nb * M * N; i++) {
            double v = xv[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v), t = tanh(u);
            ref[i] *=
                0.5 * (1 + t) + 0.5 * v * (1 - t * t) * 0.7978845608028654 * (1 + 0.134145 * v * v);
        }
    tu_check(label, y, em_shape_of(y), ref, tu_tol(em_dtype(a)));
    double *yv = tu_read(y), *got = tu_read(sums), *want = calloc((size_t)N, sizeof(double));
    assert_non_null(want);
    for (int64_t r = 0; r < nb * M; r++)
        for (int64_t n = 0; n < N; n++) want[n] += yv[r * N + n];
    tu_check(label, sums, EM_SHAPE(N), want, 1e-4);
    em_profile_kernel pk;
    uint64_t whole = (uint64_t)(nb * M * N) * em_scalar_size(em_dtype(a));
    if (!em_profile_kernel_get("tensor_cols_sum", &pk) || pk.launches != 1 ||
        (cs ? pk.bytes_read >= whole / 2 : pk.bytes_read < whole))
        fail_msg("%s: the column sums read %llu bytes in %llu launches (the result is %llu bytes; "
                 "want %s)",
                 label, (unsigned long long)pk.bytes_read, (unsigned long long)pk.launches,
                 (unsigned long long)whole, cs ? "the epilogue's partials" : "the result");
    free(ref), free(xv), free(yv), free(got), free(want);
    em_release(y);
    em_release(sums);
    unsetenv("EMBER_MATMUL_CONFIG");
    unsetenv("EMBER_MATMUL_COLSUM");
    unsetenv("EMBER_MATMUL_GELU_GRAD");
}

/* The column sums in the epilogue (CS) of the lines-of-4 forms: ping-pong with one and two
 * accumulator sets, the cooperative 256-row tile, clusters, edges along M and N, a batch, with
 * and without GELU-tanh's backward; and where the kernel cannot (split-K, lines of 2), the
 * column sum after it. */
static void tma_colsum_cases(em_device *dev)
{
    check_colsum("pp 128x192, gelu backward, edges", "wgmma-tma-ppr 128x192x64 2x1 s1",
                 rnd(dev, EM_BF16, EM_SHAPE(300, 200), 231),
                 em_transpose(rnd(dev, EM_BF16, EM_SHAPE(400, 200), 232), 0, 1),
                 rnd(dev, EM_BF16, EM_SHAPE(300, 400), 233), IN_EPILOGUE);
    check_colsum("pp 64x256, edges", "wgmma-tma-ppr 64x256x64 2x1 s1",
                 rnd(dev, EM_BF16, EM_SHAPE(131, 200), 234),
                 rnd(dev, EM_BF16, EM_SHAPE(200, 264), 235), NULL, IN_EPILOGUE);
    check_colsum("coop 256x128 clusters, N = 88", "wgmma-tma-pr 256x128x64 2x2 s1",
                 rnd(dev, EM_BF16, EM_SHAPE(300, 96), 236),
                 rnd(dev, EM_BF16, EM_SHAPE(96, 88), 237), NULL, IN_EPILOGUE);
    check_colsum("pp 128x128, batched", "wgmma-tma-ppr 128x128x64 2x1 s1",
                 rnd(dev, EM_BF16, EM_SHAPE(2, 140, 64), 238),
                 rnd(dev, EM_BF16, EM_SHAPE(2, 64, 72), 239), NULL, IN_EPILOGUE);
    check_colsum("pp 128x192, 4 split-K chunks: after", "wgmma-tma-ppr 128x192x64 2x1 s4",
                 rnd(dev, EM_BF16, EM_SHAPE(136, 600), 240),
                 rnd(dev, EM_BF16, EM_SHAPE(600, 200), 241),
                 rnd(dev, EM_BF16, EM_SHAPE(136, 200), 242), AFTER);
    setenv("EMBER_MATMUL_QUADS", "0", 1);
    check_colsum("pp 128x192, lines of 2: after", "wgmma-tma-ppr 128x192x64 2x1 s1",
                 rnd(dev, EM_BF16, EM_SHAPE(300, 200), 231),
                 rnd(dev, EM_BF16, EM_SHAPE(200, 400), 243), NULL, AFTER);
    unsetenv("EMBER_MATMUL_QUADS");
    check_colsum("pp 128x192, gelu backward, switch off", "wgmma-tma-ppr 128x192x64 2x1 s1",
                 rnd(dev, EM_BF16, EM_SHAPE(300, 200), 231),
                 em_transpose(rnd(dev, EM_BF16, EM_SHAPE(400, 200), 232), 0, 1),
                 rnd(dev, EM_BF16, EM_SHAPE(300, 400), 233), SWITCH_OFF);
}

static void test_tma_colsum(void **state)
{
    (void)state;
    on_tma_devices(tma_colsum_cases);
}

/* A GELU-tanh of a pending product (with its bias) that is kept, as a GELU's input is for its
 * backward: with EMBER_MATMUL_PRE=1 the matmul writes both (fu_mm_act_pre, mm_problem.pre) under
 * configuration cfg. Both match float64; IN_EPILOGUE: the kernel's epilogue wrote both (PRE, no
 * other launch); AFTER: the product and then the activation from it (tensor_unary); SWITCH_OFF
 * (the default): the product, then the GELU as a fused elementwise kernel. */
static void check_pre(const char *what, const char *cfg, em_tensor *a, em_tensor *b,
                      em_tensor *bias, int how)
{
    em_matmul_epilogue ep = {.bias = bias};
    int64_t nb = 0;
    double *ref = ref_mm(a, b, &ep, &nb);
    em_shape as = em_shape_of(a), bs = em_shape_of(b);
    int64_t n = nb * as.d[as.rank - 2] * bs.d[bs.rank - 1];
    double *act = malloc((size_t)n * sizeof(double));
    assert_non_null(act);
    for (int64_t i = 0; i < n; i++) {
        double v = ref[i], u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
        act[i] = 0.5 * v * (1 + tanh(u));
    }
    setenv("EMBER_MATMUL_CONFIG", cfg, 1);
    if (how != SWITCH_OFF) setenv("EMBER_MATMUL_PRE", "1", 1);
    assert_int_equal(em_flush(), EM_OK);
    em_profile_reset();
    em_tensor *y = em_add(em_take(em_matmul(a, b)), bias); /* the bias absorbed */
    /* y donated but kept by another reference, as em_mlp_forward's em_take of c_fc's result is
     * while the tape keeps the GELU's input */
    em_tensor *h = em_gelu_tanh(em_take(em_retain(y)));
    if (!h) fprintf(stderr, "%s: %s\n", what, em_last_error());
    assert_non_null(h);
    char label[256];
    snprintf(label, sizeof label, "%s (%s, gelu_tanh kept)", what, cfg);
    tu_check(label, y, em_shape_of(y), ref, tu_tol(em_dtype(a)));
    tu_check(label, h, em_shape_of(h), act, tu_tol(em_dtype(a)));
    em_profile_kernel pk;
    bool unary = em_profile_kernel_get("tensor_unary", &pk) && pk.launches > 0;
    bool fused = em_profile_kernel_get("fused", &pk) && pk.launches > 0;
    if (!em_profile_kernel_get("matmul_wgmma_tma", &pk) || pk.launches != 1)
        fail_msg("%s: the TMA kernel did not run once", label);
    if (unary != (how == AFTER) || fused != (how == SWITCH_OFF))
        fail_msg("%s: the activation ran %s", label,
                 unary   ? "as tensor_unary"
                 : fused ? "as a fused kernel"
                         : "in the epilogue");
    free(ref), free(act);
    em_release(h);
    em_release(y);
    unsetenv("EMBER_MATMUL_CONFIG");
    unsetenv("EMBER_MATMUL_PRE");
}

/* The activation and its input both from the epilogue (PRE) of the lines-of-4 forms: ping-pong
 * with one and two accumulator sets, the cooperative tile in clusters, edges along M and N; and
 * where the kernel cannot (split-K; N not a multiple of 4), the product and then the
 * activation. */
static void tma_pre_cases(em_device *dev)
{
    check_pre("pp 128x192, edges", "wgmma-tma-ppr 128x192x64 2x1 s1",
              rnd(dev, EM_BF16, EM_SHAPE(300, 200), 251),
              rnd(dev, EM_BF16, EM_SHAPE(200, 400), 252), rnd(dev, EM_BF16, EM_SHAPE(400), 253),
              true);
    check_pre("pp 64x256, edges", "wgmma-tma-ppr 64x256x64 2x1 s1",
              rnd(dev, EM_BF16, EM_SHAPE(131, 200), 254),
              rnd(dev, EM_BF16, EM_SHAPE(200, 264), 255), rnd(dev, EM_BF16, EM_SHAPE(264), 256),
              true);
    check_pre("coop 256x128 clusters, N = 88", "wgmma-tma-pr 256x128x64 2x2 s1",
              rnd(dev, EM_BF16, EM_SHAPE(300, 96), 257), rnd(dev, EM_BF16, EM_SHAPE(96, 88), 258),
              rnd(dev, EM_BF16, EM_SHAPE(88), 259), IN_EPILOGUE);
    check_pre("pp 128x192, 4 split-K chunks: after", "wgmma-tma-ppr 128x192x64 2x1 s4",
              rnd(dev, EM_BF16, EM_SHAPE(136, 600), 260),
              rnd(dev, EM_BF16, EM_SHAPE(600, 200), 261), rnd(dev, EM_BF16, EM_SHAPE(200), 262),
              false);
    check_pre("pp 128x192, N = 202, K-major b: after", "wgmma-tma-ppr 128x192x64 2x1 s1",
              rnd(dev, EM_BF16, EM_SHAPE(136, 64), 263),
              em_transpose(rnd(dev, EM_BF16, EM_SHAPE(202, 64), 264), 0, 1),
              rnd(dev, EM_BF16, EM_SHAPE(202), 265), AFTER);
    check_pre("pp 128x192, switch off", "wgmma-tma-ppr 128x192x64 2x1 s1",
              rnd(dev, EM_BF16, EM_SHAPE(300, 200), 251),
              rnd(dev, EM_BF16, EM_SHAPE(200, 400), 252), rnd(dev, EM_BF16, EM_SHAPE(400), 253),
              SWITCH_OFF);
}

static void test_tma_pre(void **state)
{
    (void)state;
    on_tma_devices(tma_pre_cases);
}

/* Whether every counter of dev's block (em_device_counters) is zero again. */
static bool counters_zero(em_device *dev)
{
    em_buffer *buf = NULL;
    assert_int_equal(em_device_counters(dev, &buf), EM_OK);
    static uint32_t c[EM_DEVICE_COUNTERS];
    assert_int_equal(em_buffer_read(buf, 0, c, sizeof c), EM_OK);
    for (int i = 0; i < EM_DEVICE_COUNTERS; i++)
        if (c[i]) return false;
    return true;
}

/* em_matmul_sum_b(a, b, sums) under configuration cfg: the product and b's column sums against
 * float64. IN_KERNEL: the kernel adds b's columns up (BS: the producer warpgroup's planes add up
 * the b tiles) and the last plane of each column tile adds the partial rows into sums (LAST: sums
 * in b's dtype), so no column-sum launch runs; it runs twice, each right, and leaves the device's
 * counters zero. IN_EPILOGUE: the kernel adds them up, seen as a column-sum launch that reads only
 * the partials (f32 sums, or with EMBER_MATMUL_BS_LAST=0); AFTER: one that reads all of b. With
 * `into`, the product goes into a slot of a flat buffer (aligned as the optimizer's), the sums into
 * another slot of the same buffer, and the rest of the buffer is untouched. */
enum { IN_KERNEL = SWITCH_OFF + 1 };
static void check_bsum(const char *what, const char *cfg, em_tensor *a, em_tensor *b, bool into,
                       int how)
{
    int64_t nb = 0;
    double *ref = ref_mm(a, b, NULL, &nb), *bv = tu_read(b);
    setenv("EMBER_MATMUL_CONFIG", cfg, 1);
    em_device *dev = em_tensor_device(a);
    em_shape as = em_shape_of(a), bs = em_shape_of(b);
    int64_t M = as.d[0], K = as.d[1], N = bs.d[1];
    int64_t pad = 128, n = pad + M * N + pad + N;
    em_scalar sdt = how == IN_KERNEL ? em_dtype(a) : EM_F32;
    double stol = into || how == IN_KERNEL ? tu_tol(em_dtype(a)) * 4 : 1e-4;
    em_tensor *flat = into ? em_full(dev, em_dtype(a), EM_SHAPE(n), 7.0) : NULL;
    em_tensor *slot = into ? em_reshape(em_narrow(flat, 0, pad, M * N), EM_SHAPE(M, N)) : NULL;
    em_tensor *sums =
        into ? em_narrow(flat, 0, pad + M * N + pad, N) : em_zeros(dev, sdt, EM_SHAPE(N));
    assert_non_null(sums);
    double *want = calloc((size_t)N, sizeof(double));
    assert_non_null(want);
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < N; j++) want[j] += bv[k * N + j];
    char label[256];
    snprintf(label, sizeof label, "%s (%s, b's column sums)", what, cfg);
    for (int run = 0; run < (how == IN_KERNEL ? 2 : 1); run++) {
        assert_int_equal(em_flush(), EM_OK);
        em_profile_reset();
        em_tensor *y = NULL;
        if (into) {
            em_status st = em_matmul_sum_b_into(slot, a, b, sums);
            if (st != EM_OK) fprintf(stderr, "%s: %s\n", what, em_last_error());
            assert_int_equal(st, EM_OK);
            y = em_retain(slot);
        } else {
            y = em_matmul_sum_b(a, b, sums);
            if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
        }
        assert_non_null(y);
        tu_check(label, sums, EM_SHAPE(N), want, stol);
        tu_check(label, y, em_shape_of(y), ref, tu_tol(em_dtype(a)));
        em_profile_kernel pk;
        uint64_t whole = (uint64_t)(K * N) * em_scalar_size(em_dtype(b));
        bool in = how == IN_EPILOGUE;
        if (!em_profile_kernel_get("matmul_wgmma_tma", &pk) || pk.launches != 1)
            fail_msg("%s: the TMA kernel did not run once", label);
        bool sum_launch = em_profile_kernel_get("tensor_cols_sum", &pk);
        if (how == IN_KERNEL) {
            if (sum_launch && pk.launches > 0)
                fail_msg("%s: %llu column-sum launches (want the kernel's last planes)", label,
                         (unsigned long long)pk.launches);
            if (!counters_zero(dev)) fail_msg("%s: the device's counters were left nonzero", label);
        } else if (!sum_launch || pk.launches != 1 ||
                   (in ? pk.bytes_read >= whole / 2 : pk.bytes_read < whole)) {
            fail_msg("%s: the column sums read %llu bytes in %llu launches (b is %llu bytes; want "
                     "%s)",
                     label, (unsigned long long)pk.bytes_read, (unsigned long long)pk.launches,
                     (unsigned long long)whole, in ? "the kernel's partials" : "b itself");
        }
        em_release(y);
    }
    if (into) {
        double *got = tu_read(flat);
        for (int64_t i = 0; i < n; i++) {
            bool inside = (i >= pad && i < pad + M * N) || (i >= pad + M * N + pad && i < n);
            if (!inside && got[i] != 7.0)
                fail_msg("%s: flat[%lld] changed to %g", label, (long long)i, got[i]);
        }
        free(got);
    }
    free(ref), free(bv), free(want);
    em_release(sums);
    em_release(slot);
    em_release(flat);
    unsetenv("EMBER_MATMUL_CONFIG");
}

/* b's column sums in the TMA kernel (BS) beside a weight gradient's product (a = x^T, MN-major;
 * b = the output gradient, N-major): ping-pong 128 x 192 (4 row groups) and 64 x 256 (3), the
 * cooperative 256 x 128 in clusters (6), the persistent 128 x 256 and the one-tile-a-cube 128 x
 * 128, split-K chunks, edges along M, N and K, into slots of one buffer; the partial rows added
 * by the kernel's last planes (sums in b's dtype, the default) or by a second launch (f32 sums,
 * and EMBER_MATMUL_BS_LAST=0); a K-major b takes the column sum after the product. */
static void tma_bsum_cases(em_device *dev)
{
    unsetenv("EMBER_MATMUL_BS_LAST");
    check_bsum("pp 128x192, weight-gradient layout", "wgmma-tma-ppr 128x192x64 2x1 s1",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 271), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(600, 200), 272), false, IN_EPILOGUE);
    check_bsum("pp 64x256, edges", "wgmma-tma-ppr 64x256x64 2x1 s1",
               rnd(dev, EM_BF16, EM_SHAPE(131, 200), 273),
               rnd(dev, EM_BF16, EM_SHAPE(200, 264), 274), false, IN_KERNEL);
    check_bsum("coop 256x128 clusters, N = 88", "wgmma-tma-pr 256x128x64 2x2 s1",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(96, 296), 275), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(96, 88), 276), false, IN_KERNEL);
    check_bsum("persistent 128x128, tiles a cube", "wgmma-tma-p 128x128x64 2x1 s1",
               rnd(dev, EM_BF16, EM_SHAPE(200, 320), 277),
               rnd(dev, EM_BF16, EM_SHAPE(320, 296), 278), false, IN_KERNEL);
    check_bsum("one tile a cube 128x128", "wgmma-tma 128x128x64 2x1 s1",
               rnd(dev, EM_BF16, EM_SHAPE(260, 136), 279),
               rnd(dev, EM_BF16, EM_SHAPE(136, 136), 280), false, IN_EPILOGUE);
    check_bsum("pp 128x192, 4 split-K chunks, into slots", "wgmma-tma-ppr 128x192x64 2x1 s4",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 281), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(600, 200), 282), true, IN_KERNEL);
    /* and with the partials summed in the kernel too (SKL: its counters after LAST's) */
    setenv("EMBER_MATMUL_SKL", "1", 1);
    check_bsum("pp 128x192, 4 split-K chunks summed in the kernel, into slots",
               "wgmma-tma-ppr 128x192x64 2x1 s4",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 287), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(600, 200), 288), true, IN_KERNEL);
    unsetenv("EMBER_MATMUL_SKL");
    setenv("EMBER_MATMUL_BS_LAST", "0", 1);
    check_bsum("pp 128x192, 4 split-K chunks, into slots, a second launch (switched off)",
               "wgmma-tma-ppr 128x192x64 2x1 s4",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 285), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(600, 200), 286), true, IN_EPILOGUE);
    check_bsum("pp 128x192, K-major b: after", "wgmma-tma-ppr 128x192x64 2x1 s1",
               rnd(dev, EM_BF16, EM_SHAPE(136, 64), 283),
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(200, 64), 284), 0, 1), false, AFTER);
    unsetenv("EMBER_MATMUL_BS_LAST");
}

static void test_tma_bsum(void **state)
{
    (void)state;
    on_tma_devices(tma_bsum_cases);
}

/* a x b under configuration cfg (a split-K form) with the partials summed by the TMA kernel
 * itself (SKL, on with EMBER_MATMUL_SKL=1, where it applies: `in_kernel`) or by
 * matmul_splitk_reduce after it (the default, or a product SKL does not take): against float64;
 * in the kernel, one launch and no reduction, run twice with the same bits each time and the
 * same bits as the reduction's (both add the splits in order), the device's counters zero
 * afterwards. */
static void check_skl(const char *what, const char *cfg, em_tensor *a, em_tensor *b,
                      const em_matmul_epilogue *ep, bool in_kernel)
{
    int64_t nb = 0;
    double *ref = ref_mm(a, b, ep, &nb), *first = NULL;
    em_device *dev = em_tensor_device(a);
    setenv("EMBER_MATMUL_CONFIG", cfg, 1);
    char label[256];
    snprintf(label, sizeof label, "%s (%s, split-K summed %s)", what, cfg,
             in_kernel ? "in the kernel" : "after it");
    for (int run = 0; run < 3; run++) {
        /* runs 0 and 1 with the switch on, run 2 as the default has it (off) */
        if (run == 2) {
            unsetenv("EMBER_MATMUL_SKL");
        } else {
            setenv("EMBER_MATMUL_SKL", "1", 1);
        }
        assert_int_equal(em_flush(), EM_OK);
        em_profile_reset();
        em_tensor *y = em_matmul_ex(a, b, ep);
        if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
        assert_non_null(y);
        tu_check(label, y, em_shape_of(y), ref, tu_tol(em_dtype(a)));
        em_profile_kernel pk;
        if (!em_profile_kernel_get("matmul_wgmma_tma", &pk) || pk.launches != 1)
            fail_msg("%s: the TMA kernel did not run once", label);
        bool reduced = em_profile_kernel_get("matmul_splitk_reduce", &pk) && pk.launches > 0;
        if (reduced != (run == 2 || !in_kernel))
            fail_msg("%s, run %d: matmul_splitk_reduce %s", label, run,
                     reduced ? "ran" : "did not run");
        if (in_kernel && run < 2 && !counters_zero(dev))
            fail_msg("%s: the device's counters were left nonzero", label);
        double *got = tu_read(y);
        if (!first) {
            first = got;
        } else {
            for (int64_t i = 0; i < em_numel(y); i++)
                if (got[i] != first[i])
                    fail_msg("%s, run %d: element %lld is %.9g, run 0 had %.9g", label, run,
                             (long long)i, got[i], first[i]);
            free(got);
        }
        em_release(y);
    }
    unsetenv("EMBER_MATMUL_SKL");
    unsetenv("EMBER_MATMUL_CONFIG");
    free(ref);
    free(first);
}

/* Split-K's partials summed by the TMA kernel's last split of each tile (SKL, opt-in): the weight
 * gradients' ping-pong 128 x 192 in 4 chunks with an MN-major a (lines of 4; N = 202 and a
 * K-major b: lines of 2), 64 x 256 in 3 chunks with edges along M and N (one accumulator set), the
 * cooperative 256 x 128 in clusters of two in 2 chunks; and a product with a bias, which SKL leaves
 * to the reduction. b's column sums beside SKL: test_tma_bsum's split-K cases. */
static void tma_skl_cases(em_device *dev)
{
    unsetenv("EMBER_MATMUL_SKL");
    check_skl("pp 128x192, 4 split-K chunks, MN-major a", "wgmma-tma-ppr 128x192x64 2x1 s4",
              em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 291), 0, 1),
              rnd(dev, EM_BF16, EM_SHAPE(600, 200), 292), NULL, true);
    check_skl("pp 128x192, 4 split-K chunks, N = 202, K-major b", "wgmma-tma-ppr 128x192x64 2x1 s4",
              rnd(dev, EM_BF16, EM_SHAPE(136, 600), 293),
              em_transpose(rnd(dev, EM_BF16, EM_SHAPE(202, 600), 294), 0, 1), NULL, true);
    check_skl("pp 64x256, 3 split-K chunks, edges", "wgmma-tma-ppr 64x256x64 2x1 s3",
              rnd(dev, EM_BF16, EM_SHAPE(131, 520), 295),
              rnd(dev, EM_BF16, EM_SHAPE(520, 264), 296), NULL, true);
    check_skl("coop 256x128 clusters, 2 split-K chunks", "wgmma-tma-pr 256x128x64 2x2 s2",
              rnd(dev, EM_F16, EM_SHAPE(300, 456), 297), rnd(dev, EM_F16, EM_SHAPE(456, 136), 298),
              NULL, true);
    em_matmul_epilogue ep = {.bias = rnd(dev, EM_BF16, EM_SHAPE(200), 299)};
    check_skl("pp 128x192, 4 split-K chunks, bias", "wgmma-tma-ppr 128x192x64 2x1 s4",
              rnd(dev, EM_BF16, EM_SHAPE(136, 600), 300),
              rnd(dev, EM_BF16, EM_SHAPE(600, 200), 301), &ep, false);
}

static void test_tma_skl(void **state)
{
    (void)state;
    on_tma_devices(tma_skl_cases);
}

/* a x b under the stream-K configuration cfg (" sk") on `workers` cubes (EMBER_MATMUL_SK_CUBES):
 * against float64; one launch and no reduction; twice with the same bits; the device's counters
 * zero afterwards; and not the bits of the same tiles unshared (cfg without " sk"), which add
 * every k step in one chain where stream-K adds its pieces' partials: the same bits would mean
 * the launch fell back to whole tiles. */
static void check_sk(const char *what, const char *cfg, int workers, em_tensor *a, em_tensor *b)
{
    int64_t nb = 0;
    double *ref = ref_mm(a, b, NULL, &nb), *first = NULL;
    em_device *dev = em_tensor_device(a);
    char label[256], cubes[16], whole[96];
    snprintf(label, sizeof label, "%s (%s on %d cubes)", what, cfg, workers);
    snprintf(cubes, sizeof cubes, "%d", workers);
    snprintf(whole, sizeof whole, "%.*s", (int)(strstr(cfg, " sk") - cfg), cfg);
    setenv("EMBER_MATMUL_SK_CUBES", cubes, 1);
    for (int run = 0; run < 3; run++) {
        /* runs 0 and 1 stream-K, run 2 the same tiles unshared */
        setenv("EMBER_MATMUL_CONFIG", run < 2 ? cfg : whole, 1);
        assert_int_equal(em_flush(), EM_OK);
        em_profile_reset();
        em_tensor *y = em_matmul(a, b);
        if (!y) fprintf(stderr, "%s: %s\n", what, em_last_error());
        assert_non_null(y);
        tu_check(label, y, em_shape_of(y), ref, tu_tol(em_dtype(a))); /* runs it (fusion) */
        if (strcmp(mm_last_config(), run < 2 ? cfg : whole) != 0)
            fail_msg("%s, run %d: ran %s", label, run, mm_last_config());
        em_profile_kernel pk;
        if (!em_profile_kernel_get("matmul_wgmma_tma", &pk) || pk.launches != 1)
            fail_msg("%s: the TMA kernel did not run once", label);
        if (em_profile_kernel_get("matmul_splitk_reduce", &pk) && pk.launches > 0)
            fail_msg("%s: matmul_splitk_reduce ran", label);
        if (run < 2 && !counters_zero(dev))
            fail_msg("%s: the device's counters were left nonzero", label);
        double *got = tu_read(y);
        if (!first) {
            first = got;
        } else {
            int64_t differ = 0;
            for (int64_t i = 0; i < em_numel(y); i++) differ += got[i] != first[i];
            if (run == 1 && differ)
                fail_msg("%s: %lld elements differ between two runs", label, (long long)differ);
            if (run == 2 && !differ)
                fail_msg("%s: the same bits as whole tiles (%s): stream-K did not run", label,
                         whole);
            free(got);
        }
        em_release(y);
    }
    unsetenv("EMBER_MATMUL_SK_CUBES");
    unsetenv("EMBER_MATMUL_CONFIG");
    free(ref);
    free(first);
}

/* Stream-K (" sk"): tiles' k steps shared evenly among the cubes, a tile in 1 to 4 pieces, the
 * pieces summed in the kernel in k order. The weight gradients' ping-pong 128 x 192 with an
 * MN-major a (lines of 4) on 7 and 3 cubes, N = 202 with a K-major b (lines of 2), 64 x 256 with
 * edges along M, N and K on 11 cubes (3 pieces of some tiles), and the cooperative 256 x 128 in
 * clusters of two (4 workers); b's column sums beside it, through the kernel's last planes
 * (LAST) and a second launch. */
static void tma_sk_cases(em_device *dev)
{
    if (!counters_zero(dev)) fail_msg("the device's counters were nonzero before stream-K ran");
    check_sk("pp 128x192, MN-major a", "wgmma-tma-ppr 128x192x64 2x1 s1 sk", 7,
             em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 311), 0, 1),
             rnd(dev, EM_BF16, EM_SHAPE(600, 200), 312));
    check_sk("pp 128x192, MN-major a, 3 cubes", "wgmma-tma-ppr 128x192x64 2x1 s1 sk", 3,
             em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 313), 0, 1),
             rnd(dev, EM_BF16, EM_SHAPE(600, 200), 314));
    check_sk("pp 128x192, N = 202, K-major b", "wgmma-tma-ppr 128x192x64 2x1 s1 sk", 5,
             rnd(dev, EM_BF16, EM_SHAPE(136, 600), 315),
             em_transpose(rnd(dev, EM_BF16, EM_SHAPE(202, 600), 316), 0, 1));
    check_sk("pp 64x256, edges", "wgmma-tma-ppr 64x256x64 2x1 s1 sk", 11,
             rnd(dev, EM_BF16, EM_SHAPE(131, 520), 317),
             rnd(dev, EM_BF16, EM_SHAPE(520, 264), 318));
    check_sk("coop 256x128 clusters", "wgmma-tma-pr 256x128x64 2x2 s1 sk", 8,
             rnd(dev, EM_F16, EM_SHAPE(300, 456), 319), rnd(dev, EM_F16, EM_SHAPE(456, 136), 320));
    setenv("EMBER_MATMUL_SK_CUBES", "7", 1);
    check_bsum("pp 128x192 stream-K, 7 cubes, into slots", "wgmma-tma-ppr 128x192x64 2x1 s1 sk",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 321), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(600, 200), 322), true, IN_KERNEL);
    setenv("EMBER_MATMUL_SK_CUBES", "11", 1);
    check_bsum("pp 64x256 stream-K, 11 cubes, edges", "wgmma-tma-ppr 64x256x64 2x1 s1 sk",
               rnd(dev, EM_BF16, EM_SHAPE(131, 520), 323),
               rnd(dev, EM_BF16, EM_SHAPE(520, 264), 324), false, IN_KERNEL);
    setenv("EMBER_MATMUL_SK_CUBES", "6", 1);
    check_bsum("coop 256x128 clusters stream-K, 6 cubes", "wgmma-tma-pr 256x128x64 2x2 s1 sk",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(456, 296), 325), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(456, 136), 326), false, IN_KERNEL);
    setenv("EMBER_MATMUL_BS_LAST", "0", 1);
    check_bsum("pp 128x192 stream-K, 7 cubes, a second launch",
               "wgmma-tma-ppr 128x192x64 2x1 s1 sk",
               em_transpose(rnd(dev, EM_BF16, EM_SHAPE(600, 136), 327), 0, 1),
               rnd(dev, EM_BF16, EM_SHAPE(600, 200), 328), false, IN_EPILOGUE);
    unsetenv("EMBER_MATMUL_BS_LAST");
    unsetenv("EMBER_MATMUL_SK_CUBES");
}

static void test_tma_sk(void **state)
{
    (void)state;
    on_tma_devices(tma_sk_cases);
}

static mm_problem h200_problem(em_caps *caps, int64_t M, int64_t N, int64_t K, em_tensor *t)
{
    memset(caps, 0, sizeof *caps);
    snprintf(caps->target, sizeof caps->target, "cuda");
    snprintf(caps->arch, sizeof caps->arch, "sm_90a");
    caps->plane_dim = 32;
    caps->max_cube_units = 1024;
    caps->max_cube_dim[0] = caps->max_cube_dim[1] = 1024;
    caps->max_cube_dim[2] = 64;
    caps->max_shared = 232448;
    caps->compute_units = 132;
    caps->matrix = caps->plane_ops = true;
    mm_problem p;
    memset(&p, 0, sizeof p);
    p.dev = em_tensor_device(t);
    p.caps = caps;
    p.dt = EM_BF16;
    p.ct = EM_F32;
    p.R = 2;
    p.M = M, p.N = N, p.K = K, p.batch = 1;
    p.a = p.b = t;
    p.ash[0] = M, p.ash[1] = K, p.ast[0] = K, p.ast[1] = 1;
    p.bsh[0] = K, p.bsh[1] = N, p.bst[0] = N, p.bst[1] = 1;
    p.osh[0] = M, p.osh[1] = N, p.ost[0] = N, p.ost[1] = 1;
    return p;
}

static void test_tma_config(void **state)
{
    (void)state;
    em_tensor *t = em_zeros(tu_devs[0], EM_F32, EM_SHAPE(1));
    assert_non_null(t);
    em_caps caps;
    mm_problem p = h200_problem(&caps, 4096, 4096, 4096, t);
    mm_config c;
    assert_true(mm_config_parse("wgmma-tma 128x256x64 2x1 s1", &c));
    assert_int_equal(c.kind, MM_WGMMA);
    assert_int_equal(c.lanes, 3);
    char text[64];
    mm_config_format(&c, text, sizeof text);
    assert_string_equal(text, "wgmma-tma 128x256x64 2x1 s1");
    assert_true(mm_config_valid(&p, &c));
    mm_wgmma_plan q;
    assert_true(mm_wgmma_plan_of(&p, &c, &q));
    assert_true(q.tma && q.ws && q.regs && q.units == 384 && q.stages == 4 && !q.az && !q.bz);
    /* maps innermost first: a [4096 k, 4096 m] rows 4096 apart, one batch entry */
    assert_int_equal(q.adim[0], 4096);
    assert_int_equal(q.astr[1], 4096);
    assert_int_equal(q.adim[2], 1);
    /* in the default candidates of an sm_90a device, 2 x 256 and 2 x 128 */
    mm_config cand[48];
    int n = mm_candidates(&p, false, cand, 48), nt = 0;
    for (int j = 0; j < n; j++) nt += cand[j].kind == MM_WGMMA && cand[j].lanes == 3;
    assert_int_equal(nt, 2);
    /* the 16-byte epilogue and persistent forms: text both ways, their plans */
    static const char *const forms[] = {"wgmma-tma-se 128x256x64 2x1 s1",
                                        "wgmma-tma-p 128x128x64 2x1 s1"};
    for (int i = 0; i < 2; i++) {
        mm_config f;
        assert_true(mm_config_parse(forms[i], &f));
        assert_int_equal(f.lanes, 4 + i);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, forms[i]);
        assert_true(mm_config_valid(&p, &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q));
        assert_true(q.tma && q.regs && q.sepi && q.persist == (i == 1));
        assert_true(q.smem <= caps.max_shared);
        f.split = 2; /* split-K partials go out element by element */
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && !q.sepi);
    }
    assert_true(mm_wgmma_plan_of(&p, &c, &q) && !q.sepi && !q.persist);
    /* the persistent form's 2 x 256 and 2 x 128 are default candidates too, and its
     * cooperative 256 x 128 tile */
    int np = 0;
    for (int j = 0; j < n; j++) np += cand[j].kind == MM_WGMMA && cand[j].lanes == 5 && cand[j].tn == 1;
    assert_int_equal(np, 3);
    {
        /* clusters of two cubes (TN 2): text both ways, the plan (multicast on CUDA), six
         * default candidates (pp 64 x 256 and 128 x 128, p 128 x 256 and 256 x 128, ppr 128 x
         * 128 and 64 x 256) */
        mm_config f;
        assert_true(mm_config_parse("wgmma-tma-pp 64x256x64 2x2 s1", &f));
        assert_true(f.lanes == 6 && f.tm == 2 && f.tn == 2);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, "wgmma-tma-pp 64x256x64 2x2 s1");
        assert_true(mm_config_valid(&p, &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q));
        assert_true(q.cluster == 2 && q.multicast && q.ping && q.persist);
        f.tn = 1;
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.cluster == 1 && !q.multicast);
        int ncl = 0;
        for (int j = 0; j < n; j++) ncl += cand[j].kind == MM_WGMMA && cand[j].tn == 2;
        assert_int_equal(ncl, 7);
        /* the ping-pong form with the epilogue from the registers: no staging buffer */
        assert_true(mm_config_parse("wgmma-tma-ppr 128x128x64 2x2 s1", &f));
        assert_true(f.lanes == 7);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, "wgmma-tma-ppr 128x128x64 2x2 s1");
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.pairs && !q.sepi && q.ping && q.cluster == 2);
        /* the cooperative persistent form with it: 256 x 128 (MW 2) keeps 4 stages, no
         * staging slot; candidates of the full search only (256 x 128 alone and in clusters,
         * 128 x 256 in clusters) */
        assert_true(mm_config_parse("wgmma-tma-pr 256x128x64 2x2 s1", &f));
        assert_true(f.lanes == 8 && f.bm == 256 && f.tm == 2 && f.tn == 2);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, "wgmma-tma-pr 256x128x64 2x2 s1");
        assert_true(mm_config_valid(&p, &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.pairs && !q.sepi && !q.ping && q.persist);
        assert_true(q.mw == 2 && q.stages == 4 && q.cluster == 2 && q.smem <= caps.max_shared);
        /* none of them is a default candidate; the ping-pong 128 x 192 is, alone and in
         * clusters (b's three boxes shared out two and one) */
        int npr = 0, nfull = 0, npp192 = 0;
        for (int j = 0; j < n; j++) {
            npr += cand[j].kind == MM_WGMMA && cand[j].lanes == 8;
            npp192 += cand[j].kind == MM_WGMMA && cand[j].lanes == 7 && cand[j].bn == 192;
        }
        assert_int_equal(npr, 0);
        assert_int_equal(npp192, 2);
        npr = 0;
        mm_config all[64];
        int na = mm_candidates(&p, true, all, 64);
        for (int j = 0; j < na; j++) nfull += all[j].kind == MM_WGMMA && all[j].lanes == 8;
        assert_int_equal(nfull, 4);
        for (int j = 0; j < na; j++) npr += !memcmp(&all[j], &f, sizeof f);
        assert_int_equal(npr, 1);
        assert_true(mm_config_parse("wgmma-tma-pr 256x256x64 2x1 s1", &f)); /* 256 accumulators */
        assert_false(mm_wgmma_plan_of(&p, &f, &q));
        static const char *const clbad[] = {"wgmma-tma-se 128x256x64 2x2 s1", /* not persistent */
                                            "wgmma-tma-p 128x64x64 2x2 s1",   /* 1 box of b */
                                            "wgmma-tma-pp 64x256x64 2x3 s1"};
        for (int i = 0; i < 3; i++) {
            assert_true(mm_config_parse(clbad[i], &f));
            assert_false(mm_wgmma_plan_of(&p, &f, &q));
        }
    }
    {
        /* "wgmma-tma-p 256x128x64 2x1 s1": two consumers of 128 x 128 (MW 2) on one tile, 4
         * stages of 48 KiB and the staging buffers in the H200's 227 KiB */
        mm_config f;
        assert_true(mm_config_parse("wgmma-tma-p 256x128x64 2x1 s1", &f));
        assert_true(f.kind == MM_WGMMA && f.lanes == 5 && f.bm == 256 && f.bn == 128 && f.tm == 2);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, "wgmma-tma-p 256x128x64 2x1 s1");
        assert_true(mm_config_valid(&p, &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q));
        assert_true(q.tma && q.regs && q.sepi && q.persist && !q.ping && q.units == 384);
        assert_int_equal(q.mw, 2);
        assert_int_equal(q.stages, 4);
        assert_true(q.smem <= caps.max_shared);
        int nc = 0;
        for (int j = 0; j < n; j++) nc += !memcmp(&cand[j], &f, sizeof f);
        assert_int_equal(nc, 1);
        f.bn = 192; /* 3 stages of 56 KiB */
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.mw == 2 && q.stages == 3);
        assert_true(q.smem <= caps.max_shared);
        static const char *const cbad[] = {"wgmma-tma-p 256x256x64 2x1 s1",
                                           "wgmma-tma-p 256x128x64 1x1 s1",
                                           "wgmma-tma-p 256x128x64 3x1 s1",
                                           "wgmma-tma-se 256x128x64 2x1 s1"};
        for (int i = 0; i < 4; i++) {
            assert_true(mm_config_parse(cbad[i], &f));
            assert_false(mm_wgmma_plan_of(&p, &f, &q));
        }
        /* the existing strings keep their meaning: one accumulator set a consumer */
        assert_true(mm_config_parse("wgmma-tma-p 128x256x64 2x1 s1", &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.mw == 1 && !q.ping);
        assert_true(mm_config_parse("wgmma-tma-pp 128x128x64 2x1 s1", &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.mw == 2 && q.ping);
    }
    /* the ping-pong form: a consumer's tile of 128 x 128 or 64 x 256 (at most 128 accumulators
     * a unit), two consumers, persistent, the 16-byte epilogue; a default candidate each */
    static const char *const pp[] = {"wgmma-tma-pp 128x128x64 2x1 s1",
                                     "wgmma-tma-pp 64x256x64 2x1 s1"};
    for (int i = 0; i < 2; i++) {
        mm_config f;
        assert_true(mm_config_parse(pp[i], &f));
        assert_int_equal(f.lanes, 6);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, pp[i]);
        assert_true(mm_config_valid(&p, &f));
        assert_true(mm_wgmma_plan_of(&p, &f, &q));
        assert_true(q.tma && q.regs && q.sepi && q.persist && q.ping && q.units == 384);
        assert_int_equal(q.stages, i == 0 ? 6 : 5); /* the ring holds one consumer's tiles */
        assert_true(q.smem <= caps.max_shared);
        int npp = 0;
        for (int j = 0; j < n; j++) npp += !memcmp(&cand[j], &f, sizeof f);
        assert_int_equal(npp, 1);
        f.split = 2;
        assert_true(mm_wgmma_plan_of(&p, &f, &q) && q.ping && !q.sepi);
    }
    static const char *const bad[] = {"wgmma-tma-pp 128x256x64 2x1 s1", /* 256 accumulators */
                                      "wgmma-tma-pp 64x128x64 1x1 s1",  /* one consumer */
                                      "wgmma-tma-pp 192x64x64 3x1 s1",
                                      "wgmma-tma-pp 256x64x64 2x1 s1"};
    for (int i = 0; i < 4; i++) {
        mm_config f;
        assert_true(mm_config_parse(bad[i], &f));
        assert_false(mm_wgmma_plan_of(&p, &f, &q));
    }
    assert_true(mm_wgmma_plan_of(&p, &c, &q) && !q.ping);
    /* three consumers: no setmaxnreg, 512 units */
    c.tm = 3, c.bm = 192, c.bn = 128;
    assert_true(mm_wgmma_plan_of(&p, &c, &q) && q.tma && !q.regs && q.units == 512);
    /* not on sm_90 (no TMA there as this runtime uses it) */
    snprintf(caps.arch, sizeof caps.arch, "sm_90");
    assert_false(mm_config_valid(&p, &c));
    {
        /* a weight gradient's 768 x 3072 x 16384: 96 tiles of 128 x 192 on 132 compute units,
         * so the split with the fewest idle rounds (4: three rounds of a quarter of K) is a
         * candidate beside pick_split's two waves (3: 288 tiles) */
        mm_problem g = h200_problem(&caps, 768, 3072, 16384, t);
        mm_config gc[64];
        int ng = mm_candidates(&g, false, gc, 64), s4 = 0, s3 = 0;
        for (int j = 0; j < ng; j++) {
            bool pp192 =
                gc[j].kind == MM_WGMMA && gc[j].lanes == 7 && gc[j].bn == 192 && gc[j].tn == 1;
            s4 += pp192 && gc[j].split == 4;
            s3 += pp192 && gc[j].split == 3;
        }
        assert_int_equal(s4, 1);
        assert_int_equal(s3, 1);
        /* its partials go out as lines of 2 of f32 (N even), not element by element */
        mm_config f;
        mm_wgmma_plan wq;
        assert_true(mm_config_parse("wgmma-tma-ppr 128x192x64 2x1 s4", &f));
        assert_true(mm_wgmma_plan_of(&g, &f, &wq) && wq.pairs && !wq.sepi);
        /* as lines of 4 (N a multiple of 4), lines of 2 where N is only even or with
         * EMBER_MATMUL_QUADS=0 */
        assert_true(wq.quads);
        mm_problem g3 = h200_problem(&caps, 768, 3074, 16384, t); /* b K-major: any N */
        g3.bst[0] = 1, g3.bst[1] = 16384;
        assert_true(mm_wgmma_plan_of(&g3, &f, &wq) && wq.pairs && !wq.quads);
        setenv("EMBER_MATMUL_QUADS", "0", 1);
        assert_true(mm_wgmma_plan_of(&g, &f, &wq) && wq.pairs && !wq.quads);
        unsetenv("EMBER_MATMUL_QUADS");
        assert_true(mm_config_parse("wgmma-tma-ppr 128x192x64 2x2 s1", &f));
        assert_true(mm_wgmma_plan_of(&g, &f, &wq) && wq.pairs && wq.quads);
        /* its tuning bucket is its own: N 3072 and 2304 (the same layer's c_attn) apart, 36 and
         * 40 rows together (four buckets a doubling) */
        char k1[160], k2[160];
        mm_tune_key(&g, k1, sizeof k1);
        mm_problem g2 = h200_problem(&caps, 768, 2304, 16384, t);
        mm_tune_key(&g2, k2, sizeof k2);
        assert_non_null(strstr(k1, " m768 n3072 k16384 "));
        assert_non_null(strstr(k2, " m768 n2560 k16384 "));
        g2 = h200_problem(&caps, 36, 50304, 768, t);
        mm_tune_key(&g2, k1, sizeof k1);
        g2.M = 40;
        mm_tune_key(&g2, k2, sizeof k2);
        assert_string_equal(k1, k2);
        assert_non_null(strstr(k1, " m40 n57344 k768 "));
        /* split-K summed in the kernel (opt-in) tunes apart from the default */
        assert_null(strstr(k1, " skl"));
        setenv("EMBER_MATMUL_SKL", "1", 1);
        mm_tune_key(&g2, k2, sizeof k2);
        unsetenv("EMBER_MATMUL_SKL");
        assert_non_null(strstr(k2, " m40 n57344 k768 "));
        assert_non_null(strstr(k2, " skl"));
        /* stream-K: " sk" both ways; on the weight gradient (96 tiles of 128 x 192 on 132
         * compute units), not with a bias or a split; a candidate only with EMBER_MATMUL_SK=1
         * (opt-in), which tunes apart */
        g = h200_problem(&caps, 768, 3072, 16384, t);
        assert_true(mm_config_parse("wgmma-tma-ppr 128x192x64 2x2 s1 sk", &f));
        assert_true(f.sk == 1 && f.split == 1 && f.tn == 2);
        mm_config_format(&f, text, sizeof text);
        assert_string_equal(text, "wgmma-tma-ppr 128x192x64 2x2 s1 sk");
        assert_true(mm_config_valid(&g, &f));
        assert_true(mm_wgmma_plan_of(&g, &f, &wq) && wq.pairs && wq.quads && !wq.sepi);
        g.bias = t;
        assert_false(mm_config_valid(&g, &f));
        g.bias = NULL;
        f.split = 4;
        assert_false(mm_config_valid(&g, &f));
        int nsk = 0;
        ng = mm_candidates(&g, false, gc, 64);
        for (int j = 0; j < ng; j++) nsk += gc[j].sk;
        assert_int_equal(nsk, 0);
        int ng0 = ng;
        mm_config gk[96];
        setenv("EMBER_MATMUL_SK", "1", 1);
        int ngk = mm_candidates(&g, false, gk, 96);
        for (int j = 0; j < ngk; j++) nsk += gk[j].sk && gk[j].lanes == 7 && gk[j].bn == 192;
        /* ... in places of their own: the others are the same list, in the same order */
        assert_true(ngk > ng0);
        for (int j = 0; j < ng0; j++) assert_memory_equal(&gk[j], &gc[j], sizeof gc[j]);
        mm_tune_key(&g, k2, sizeof k2);
        unsetenv("EMBER_MATMUL_SK");
        assert_true(nsk >= 1);
        assert_non_null(strstr(k2, " sk"));
        assert_null(strstr(k1, " sk"));
        /* 4096^3 fills the device: no split of any form */
        g = h200_problem(&caps, 4096, 4096, 4096, t);
        ng = mm_candidates(&g, false, gc, 64);
        for (int j = 0; j < ng; j++) assert_int_equal(gc[j].split, 1);
    }
    em_release(t);
}

static int setup(void **state)
{
    setenv("EMBER_AUTOTUNE", "off", 1);
    unsetenv("EMBER_MATMUL_CONFIG");
    setenv("EMBER_CFLAGS", "-O1", 0);
    return tu_setup(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tma_kernel),   cmocka_unit_test(test_tma_persistent),
        cmocka_unit_test(test_tma_pingpong), cmocka_unit_test(test_tma_coop),
        cmocka_unit_test(test_tma_pairs),    cmocka_unit_test(test_tma_colsum),
        cmocka_unit_test(test_tma_pre),      cmocka_unit_test(test_tma_config),
        cmocka_unit_test(test_tma_bsum),     cmocka_unit_test(test_tma_skl),
        cmocka_unit_test(test_tma_sk),
    };
    if (getenv("TU_ONLY")) cmocka_set_test_filter(getenv("TU_ONLY"));
    return cmocka_run_group_tests(tests, setup, tu_teardown);
}
