/* test_tma.c — the kernel language's tensor memory accelerator builtins (tma_load, tma_acquire,
 * tma_reduce_add; src/kernel/lang/lower_tma.c) and the runtime's tensor maps
 * (em_tensor_map_encode), without a GPU:
 *  - bulk reductions (tma_reduce_add) from three cubes on the CPU, as atomic adds; their PTX,
 *    compiled by NVRTC for sm_90a;
 *  - boxes of 2-D and 3-D maps (inside, across the edges, past them) copied on the CPU, whose
 *    tma_load follows the CPU form of the map, checked element by element against the layout
 *    the hardware documents (rows of the box one after another; under the 128-byte swizzle
 *    16-byte chunk c of 128-byte row r at chunk c ^ (r % 8); zeros outside the dims);
 *  - the rules em_tensor_map_encode enforces (alignment, strides, box, swizzle, bounds);
 *  - the CUDA source for an sm_90a device (cp.async.bulk.tensor, the tensor-map fence), compiled
 *    by NVRTC for sm_90a when it is installed; the refusal on other targets. */
#include <ctype.h>
#include "lang/lang_util.h"

#include "ember/kernel.h"
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/nvrtc.h"
#include "kernel/hopper_util.h"

/* Copies the box of map 1 of `maps` at (x, y, z) into shared memory (N elements, the box's) and
 * then out; map 0 is left as garbage, so the map index is honoured. */
static const char *box_src =
    "kernel<T: num> void box(const tensor(T) src, const tensor(u64) maps, tensor(T) out, u32 x,\n"
    "                        u32 y, u32 z, comptime u32 N = 256)\n"
    "{\n"
    "    shared T tile[N];\n"
    "    shared u64 bar[2];\n"
    "    for (u32 i in range(UNIT_POS, N, CUBE_DIM_X)) { tile[i] = T(7); }\n"
    "    sync_cube();\n"
    "    if (UNIT_POS == 0) {\n"
    "        mbarrier_init(bar, 1, 1);\n"
    "        fence_proxy_async();\n"
    "        tma_acquire(maps, 1);\n"
    "        mbarrier_arrive_tx(bar, 1, N * sizeof(T));\n"
    "        tma_load(tile, 0, bar, 1, maps, 1, src, x, y, z);\n"
    "    }\n"
    "    sync_cube();\n"
    "    mbarrier_wait(bar, 1, 0);\n"
    "    for (u32 i in range(UNIT_POS, N, CUBE_DIM_X)) { out[i] = tile[i]; }\n"
    "}\n";

/* The element of the box the hardware puts at shared element e (of es bytes): the inverse of the
 * swizzle is itself (an XOR of bits [4, 7) with bits [7, 10), which it leaves alone). */
static uint32_t box_element(uint32_t e, uint32_t es, bool swizzle)
{
    uint32_t byte = e * es;
    if (swizzle) {
        uint32_t row = byte / 128, chunk = byte % 128 / 16;
        byte = row * 128 + (chunk ^ (row % 8)) * 16 + byte % 16;
    }
    return byte / es;
}

/* src: a float view of dims d (innermost first) and strides s, from element `off` of the buffer;
 * the box b at (x, y, z) must come out as the hardware lays it. */
static void check_box(em_lang_module *m, const em_tensor_map_desc *desc, size_t off, uint32_t x,
                      uint32_t y, uint32_t z)
{
    const uint64_t *d = desc->dims, *s = desc->strides;
    const uint32_t *b = desc->box;
    uint64_t d2 = desc->rank > 2 ? d[2] : 1, s2 = desc->rank > 2 ? s[2] : 0;
    uint32_t b2 = desc->rank > 2 ? b[2] : 1;
    size_t n = off + (size_t)((d2 - 1) * s2 + (d[1] - 1) * s[1] + d[0]) + 8;
    float *host = malloc(n * sizeof(float));
    assert_non_null(host);
    for (size_t i = 0; i < n; i++) host[i] = (float)(i % 1000) + 0.25f;
    em_buffer *bs = buf_new(host, n * sizeof(float));
    uint64_t maps[2 * EM_TENSOR_MAP_WORDS];
    memset(maps, 0x5a, sizeof maps);
    if (em_tensor_map_encode(bs, off * sizeof(float), desc, maps + EM_TENSOR_MAP_WORDS) != EM_OK)
        fail_msg("encode: %s", em_last_error());
    em_buffer *bm = buf_new(maps, sizeof maps);
    uint32_t N = b[0] * b[1] * b2;
    float *out = malloc(N * sizeof(float));
    assert_non_null(out);
    em_buffer *bo = buf_new(NULL, N * sizeof(float));
    em_lang_bind binds[] = {em_lang_bind_type("T", EM_F32), em_lang_bind_int("N", N)};
    em_lang_spec spec = {binds, 2, 1, NULL};
    em_arg args[] = {em_arg_buffer(bs, n), em_arg_buffer(bm, 2 * EM_TENSOR_MAP_WORDS),
                     em_arg_buffer(bo, N), em_arg_u32(x), em_arg_u32(y), em_arg_u32(z)};
    launch_x(m, "box", &spec, 1, 64, args, 6);
    buf_get(bo, out, N * sizeof(float));
    for (uint32_t e = 0; e < N; e++) {
        uint32_t k = box_element(e, 4, desc->swizzle == 128);
        uint32_t gx = x + k % b[0], gy = y + k / b[0] % b[1], gz = z + k / (b[0] * b[1]);
        bool in = gx < d[0] && gy < d[1] && gz < d2;
        float want = in ? host[off + gx + gy * s[1] + gz * s2] : 0.0f;
        if (out[e] != want)
            fail_msg("box at (%u, %u, %u) swizzle %u: shared element %u is %g, want %g "
                     "(box element %u)",
                     x, y, z, desc->swizzle, e, (double)out[e], (double)want, k);
    }
    em_buffer_free(bs);
    em_buffer_free(bm);
    em_buffer_free(bo);
    free(host);
    free(out);
}

static void test_boxes_on_cpu(void **state)
{
    (void)state;
    em_lang_module *m = must_load(box_src);
    /* 50 x 37 floats in rows of 52, from element 4; boxes of 32 x 8 (128-byte rows) */
    em_tensor_map_desc a = {EM_F32, 2, {50, 37, 0}, {1, 52, 0}, {32, 8, 0}, 128};
    check_box(m, &a, 4, 0, 0, 0);
    check_box(m, &a, 32, 8, 16, 0);  /* x past the dims: zeros on the right */
    check_box(m, &a, 4, 16, 32, 0);  /* y past them: zero rows */
    check_box(m, &a, 4, 64, 0, 0);   /* wholly outside */
    a.swizzle = 0;
    check_box(m, &a, 4, 8, 3, 0);
    /* 3-D: 40 x 20 x 3, planes 1056 apart; boxes 32 x 16 x 2 */
    em_tensor_map_desc c = {EM_F32, 3, {40, 20, 3}, {1, 44, 1056}, {32, 16, 2}, 128};
    check_box(m, &c, 0, 8, 8, 1);
    check_box(m, &c, 8, 0, 0, 0);
    em_lang_module_free(m);
}

static void expect_encode_error(em_buffer *b, size_t off, const em_tensor_map_desc *d,
                                const char *what)
{
    uint64_t out[EM_TENSOR_MAP_WORDS];
    assert_int_equal(em_tensor_map_encode(b, off, d, out), EM_ERR_INVALID);
    if (!strstr(em_last_error(), what)) fail_msg("want `%s` in: %s", what, em_last_error());
}

static void test_encode_rules(void **state)
{
    (void)state;
    em_buffer *b = buf_new(NULL, 64 * 64 * 2);
    em_tensor_map_desc d = {EM_BF16, 2, {64, 64, 0}, {1, 64, 0}, {64, 32, 0}, 128};
    uint64_t out[EM_TENSOR_MAP_WORDS];
    assert_int_equal(em_tensor_map_encode(b, 0, &d, out), EM_OK);
    expect_encode_error(b, 8, &d, "not 16-byte aligned");
    expect_encode_error(b, 16, &d, "outside the buffer");
    em_tensor_map_desc x = d;
    x.strides[1] = 60;
    expect_encode_error(b, 0, &x, "strides must be 16-byte multiples");
    x = d, x.box[0] = 32;
    expect_encode_error(b, 0, &x, "a 128-byte swizzle needs an innermost box of 128 bytes");
    x = d, x.box[1] = 512;
    expect_encode_error(b, 0, &x, "box sizes must be 1 to 256");
    x = d, x.strides[0] = 2;
    expect_encode_error(b, 0, &x, "the innermost stride must be 1");
    x = d, x.swizzle = 64;
    expect_encode_error(b, 0, &x, "swizzle of 64 bytes");
    x = d, x.rank = 4;
    expect_encode_error(b, 0, &x, "rank 4");
    em_buffer_free(b);
}

/* Each cube scales src (N floats) by its position + 1 into shared memory and adds it to dst from
 * element 4 on through the copy engine: a unit per 4 elements issues one tma_reduce_add, then
 * commits and waits until its group has read the shared memory. */
static const char *radd_src =
    "kernel void radd(tensor(f32) dst, const tensor(f32) src, comptime u32 N = 64)\n"
    "{\n"
    "    shared f32 buf[N];\n"
    "    for (u32 i in range(UNIT_POS, N, CUBE_DIM_X)) { buf[i] = src[i] * f32(CUBE_POS_X + 1); }\n"
    "    fence_proxy_async();\n"
    "    sync_cube();\n"
    "    if (UNIT_POS < N / 4) { tma_reduce_add(dst, 4 + UNIT_POS * 4, buf, UNIT_POS * 4, 4); }\n"
    "    tma_commit();\n"
    "    tma_wait_read(0);\n"
    "}\n";

/* On the CPU the reductions are atomic adds: three cubes (threads) add 1, 2 and 3 times src, and
 * the elements around the range stay as they were. */
static void test_reduce_add_on_cpu(void **state)
{
    (void)state;
    em_lang_module *m = must_load(radd_src);
    enum { N = 64, LEN = N + 12 };
    float dst[LEN], src[N], out[LEN];
    for (int i = 0; i < LEN; i++) dst[i] = (float)i + 0.5f;
    for (int i = 0; i < N; i++) src[i] = (float)i * 0.25f - 3.0f;
    em_buffer *bd = buf_new(dst, sizeof dst), *bs = buf_new(src, sizeof src);
    em_lang_spec spec = {NULL, 0, 1, NULL};
    em_arg args[] = {em_arg_buffer(bd, LEN), em_arg_buffer(bs, N)};
    launch_x(m, "radd", &spec, 3, 32, args, 2);
    buf_get(bd, out, sizeof out);
    for (int i = 0; i < LEN; i++) {
        float want = dst[i] + (i >= 4 && i < 4 + N ? 6.0f * src[i - 4] : 0.0f);
        if (out[i] != want) fail_msg("dst[%d] is %g, want %g", i, (double)out[i], (double)want);
    }
    em_buffer_free(bd);
    em_buffer_free(bs);
    em_lang_module_free(m);
}

/* ---- CUDA ------------------------------------------------------------------------------------ */

/* Kernel box<bf16> of m for caps, simplified; NULL with the diagnostics in `why`. */
static em_ir_kernel *specialize(const em_lang_module *m, const em_caps *caps, char *why,
                                size_t whysize)
{
    em_lang_bind binds[] = {em_lang_bind_type("T", EM_BF16)};
    em_lang_spec spec = {binds, 1, 1, caps};
    em_lang_diags *d = em_lang_diags_new();
    em_ir_kernel *k = em_lang_specialize(m, "box", &spec, d);
    if (!k) {
        char *text = em_lang_diags_format(d);
        snprintf(why, whysize, "%s", text ? text : em_last_error());
        free(text);
    }
    em_lang_diags_free(d);
    if (k) {
        assert_int_equal(em_ir_verify(k, 0), EM_OK);
        assert_int_equal(em_ir_simplify(k), EM_OK);
    }
    return k;
}

static void test_cuda_source(void **state)
{
    (void)state;
    em_lang_module *m = must_load(box_src);
    em_caps caps = cuda_caps("sm_90a");
    char why[2048] = "";
    em_ir_kernel *k = specialize(m, &caps, why, sizeof why);
    if (!k) fail_msg("%s", why);
    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
    if (!src) fail_msg("%s", em_last_error());
    static const char *const want[] = {
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], ",
        "::bytes [%0], [%1, {%2, %3, %4}], [%5];",
        "fence.proxy.tensormap::generic.acquire.sys [%0], 128;",
        "fence.proxy.async.shared::cta;",
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;",
        "__shared__ __align__(1024)",
    };
    expect_sm90a_source(src, want, sizeof want / sizeof want[0]);
    free(src);
    em_caps old = cuda_caps("sm_90");
    src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &old);
    assert_null(src);
    assert_non_null(strstr(em_last_error(), "need"));
    em_ir_kernel_free(k);
    em_lang_module_free(m);
}

/* radd for an sm_90a device: the bulk reduction, its commit and its wait in the source, through
 * NVRTC; refused before sm_90a; a destination of another type gets a diagnostic at it. */
static void test_reduce_add_cuda(void **state)
{
    (void)state;
    em_lang_module *m = must_load(radd_src);
    em_caps caps = cuda_caps("sm_90a");
    em_lang_spec spec = {NULL, 0, 1, &caps};
    em_lang_diags *d = em_lang_diags_new();
    em_ir_kernel *k = em_lang_specialize(m, "radd", &spec, d);
    em_lang_diags_free(d);
    assert_non_null(k);
    assert_int_equal(em_ir_simplify(k), EM_OK);
    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
    if (!src) fail_msg("%s", em_last_error());
    static const char *const want[] = {
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;",
        "cp.async.bulk.commit_group;",
        "cp.async.bulk.wait_group.read 0;",
        "fence.proxy.async.shared::cta;",
    };
    expect_sm90a_source(src, want, sizeof want / sizeof want[0]);
    free(src);
    em_ir_kernel_free(k);
    em_caps old = cuda_caps("sm_80");
    spec.caps = &old;
    d = em_lang_diags_new();
    assert_null(em_lang_specialize(m, "radd", &spec, d));
    char *text = em_lang_diags_format(d);
    if (!text || !strstr(text, "needs the tensor memory accelerator"))
        fail_msg("unexpected diagnostic: %s", text ? text : "(none)");
    free(text);
    em_lang_diags_free(d);
    em_lang_module_free(m);
    const char *bad = "kernel void bad(tensor(f16) o, const tensor(f32) s)\n"
                      "{\n    shared f32 t[64];\n    t[0] = s[0];\n"
                      "    tma_reduce_add(o, 0, t, 0, 4);\n}\n";
    assert_true(check_error_at(bad, 5, 20,
                               "'tma_reduce_add' needs an f32 tensor parameter as its "
                               "destination",
                               NULL));
    const char *ro = "kernel void bad(const tensor(f32) o, const tensor(f32) s)\n"
                     "{\n    shared f32 t[64];\n    t[0] = s[0];\n"
                     "    tma_reduce_add(o, 0, t, 0, 4);\n}\n";
    assert_true(check_error_at(ro, 5, 20, "cannot write to read-only tensor 'o'", NULL));
    const char *wait = "kernel void bad(tensor(f32) o, u32 n)\n"
                       "{\n    shared f32 t[64];\n    t[0] = o[0];\n"
                       "    tma_wait_read(n);\n}\n";
    assert_true(
        check_error_at(wait, 5, 19, "the groups left reading must be known at compile time", NULL));
    const char *many = "kernel void bad(tensor(f32) o)\n"
                       "{\n    shared f32 t[64];\n    t[0] = o[0];\n"
                       "    tma_wait_read(8);\n}\n";
    assert_true(check_error_at(many, 5, 19, "'tma_wait_read' of 8 groups", "0 to 7"));
}

static void expect_refused(const em_lang_module *m, const em_caps *caps, const char *what)
{
    char why[2048] = "";
    em_ir_kernel *k = specialize(m, caps, why, sizeof why);
    assert_null(k);
    if (!strstr(why, what) || !strstr(why, "needs the tensor memory accelerator") ||
        !strstr(why, "has(tma)"))
        fail_msg("unexpected diagnostic: %s", why);
}

static void test_refused_elsewhere(void **state)
{
    (void)state;
    em_lang_module *m = must_load(box_src);
    em_caps c = cuda_caps("sm_80");
    expect_refused(m, &c, "this CUDA device (sm_80)");
    snprintf(c.target, sizeof c.target, "opencl");
    expect_refused(m, &c, "the opencl target");
    snprintf(c.target, sizeof c.target, "glsl");
    expect_refused(m, &c, "the glsl target");
    em_lang_module_free(m);
    const char *bad = "kernel void bad(const tensor(f32) s, const tensor(u32) maps, tensor(f32) o)\n"
                      "{\n    shared f32 t[64];\n    shared u64 b[1];\n"
                      "    tma_load(t, 0, b, 0, maps, 0, s, 0, 0, 0);\n    o[0] = t[0];\n}\n";
    assert_true(check_error_at(bad, 5, 26, "'tma_load' needs a u64 tensor parameter holding the "
                               "tensor maps", NULL));
}

/* Whether generated source src indexes an array whose name starts with prefix (prefix, more
 * identifier characters, then '['). */
static bool indexed(const char *src, const char *prefix)
{
    for (const char *p = strstr(src, prefix); p; p = strstr(p + 1, prefix)) {
        const char *q = p + strlen(prefix);
        while (isalnum((unsigned char)*q) || *q == '_') q++;
        if (*q == '[') return true;
    }
    return false;
}

/* Whether generated source src calls em_shfl_xor from the kernel (codegen/cuda.c writes the
 * mask as "(int)(...)"; the prelude's own calls pass a plain int). */
static bool shuffles(const char *src)
{
    for (const char *p = strstr(src, "em_shfl_xor("); p; p = strstr(p + 1, "em_shfl_xor(")) {
        const char *eol = strchr(p, '\n');
        const char *m = strstr(p, ", (int)(");
        if (m && (!eol || m < eol)) return true;
    }
    return false;
}

/* The built-in matmul_wgmma_tma (src/kernels/matmul_wgmma_tma.ek) in the configurations the
 * host picks (matmul_config.c: two consumers with setmaxnreg 40 / 232, three without; every
 * operand layout; batched, broadcast, split-K partials, the epilogue (GELU, or GELU-tanh's backward
 * in the lines-of-4 forms); the 16-byte epilogue through
 * shared memory and persistent cubes; ping-pong consumers of 128 x 128 and 64 x 256, PING), through
 * NVRTC for sm_90a
 * with ptxas's report: it must compile, spill nothing, keep setmaxnreg and not serialize the
 * MMAs; its source must hold the TMA loads and the maps' fence. */
static void test_matmul_tma_compiles(void **state)
{
    (void)state;
    SKIP_UNLESS_NVRTC();
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    em_caps caps = cuda_caps("sm_90a");
    static const struct {
        int wg, bn, stages;
        bool at, bt, raw, epi, az, bz;
        em_scalar t;
        int r;
        bool sepi, persist; /* "wgmma-tma-se" / "wgmma-tma-p" */
        int mw; /* "wgmma-tma-pp": a consumer's tile of 64 mw rows (0: not ping-pong) */
        int cmw; /* "wgmma-tma-p 256x..": 2, both consumers 64 cmw rows of one tile (0: 64) */
        int cl;  /* "... 2x2": clusters of two cubes sharing b's tile by multicast (0: none) */
        int pairs; /* "wgmma-tma-ppr": lines of 2 (or 4, swapped between units) from the
                      registers, no staging; 0: none */
        bool fwd;  /* with the epilogue: a forward's (bias, ReLU, residual) in place of GELU-tanh's
                      backward, so lines of 4 stage the residual through shared memory (SR) */
    } cfg[] = {
        {2, 256, 4, false, false, false, false, false, false, EM_BF16, 2, false, false, 0, 0, 0, 0,
         false},
        {2, 128, 6, false, true, false, true, false, false, EM_BF16, 2, false, false, 0, 0, 0, 0,
         false},
        {2, 256, 4, true, false, true, false, true, false, EM_F16, 3, false, false, 0, 0, 0, 0,
         false},
        {2, 192, 4, true, true, false, true, true, true, EM_BF16, 3, false, false, 0, 0, 0, 0,
         false},
        {3, 128, 5, false, false, false, false, false, false, EM_BF16, 2, false, false, 0, 0, 0, 0,
         false},
        {1, 256, 5, false, false, false, false, false, false, EM_BF16, 2, false, false, 0, 0, 0, 0,
         false},
        {2, 256, 4, false, false, false, false, false, false, EM_BF16, 2, true, false, 0, 0, 0, 0,
         false},
        {2, 256, 4, false, true, false, true, false, false, EM_BF16, 2, true, true, 0, 0, 0, 0,
         false},
        {2, 128, 6, false, false, false, false, false, false, EM_BF16, 2, true, true, 0, 0, 0, 0,
         false},
        {2, 256, 4, true, false, true, false, true, false, EM_F16, 3, false, true, 0, 0, 0, 0,
         false},
        {2, 192, 4, true, true, false, true, true, true, EM_BF16, 3, true, true, 0, 0, 0, 0, false},
        {2, 128, 6, false, false, false, false, false, false, EM_BF16, 2, true, true, 2, 0, 0, 0,
         false},
        {2, 256, 5, false, true, false, true, false, false, EM_BF16, 2, true, true, 1, 0, 0, 0,
         false},
        {2, 128, 6, true, true, true, false, true, false, EM_F16, 3, false, true, 2, 0, 0, 0,
         false},
        {2, 128, 6, true, false, false, true, true, true, EM_BF16, 3, true, true, 2, 0, 0, 0,
         false},
        {2, 128, 4, false, false, false, false, false, false, EM_BF16, 2, true, true, 0, 2, 0, 0,
         false},
        {2, 128, 4, true, true, false, true, true, true, EM_BF16, 3, true, true, 0, 2, 0, 0, false},
        {2, 128, 4, true, false, true, false, true, false, EM_F16, 3, false, true, 0, 2, 0, 0,
         false},
        {2, 192, 3, false, false, false, false, false, false, EM_BF16, 2, true, true, 0, 2, 0, 0,
         false},
        {2, 256, 5, false, false, false, false, false, false, EM_BF16, 2, true, true, 1, 0, 2, 0,
         false},
        {2, 128, 6, false, true, false, true, false, false, EM_BF16, 2, true, true, 2, 0, 2, 0,
         false},
        {2, 256, 4, true, true, false, true, true, true, EM_BF16, 3, true, true, 0, 0, 2, 0, false},
        {2, 128, 4, false, false, true, false, false, false, EM_F16, 2, false, true, 0, 2, 2, 0,
         false},
        {2, 256, 5, false, false, false, true, false, false, EM_BF16, 2, false, true, 1, 0, 1, 2,
         false},
        {2, 256, 4, false, false, false, false, false, false, EM_BF16, 2, false, true, 0, 0, 2, 2,
         false},
        {2, 128, 4, false, false, false, true, false, false, EM_BF16, 2, false, true, 0, 2, 2, 2,
         false},
        {2, 128, 4, true, true, false, false, true, true, EM_F16, 3, false, true, 0, 2, 1, 2,
         false},
        {2, 192, 5, false, false, false, true, false, false, EM_BF16, 2, false, true, 2, 0, 1, 2,
         false},
        {2, 192, 5, true, true, false, false, true, true, EM_F16, 3, false, true, 2, 0, 1, 2,
         false},
        {2, 192, 5, true, false, true, false, false, false, EM_BF16, 2, false, true, 2, 0, 1, 2,
         false},
        {2, 192, 5, false, false, false, true, false, false, EM_BF16, 2, false, true, 2, 0, 2, 2,
         false},
        {2, 192, 5, false, true, false, false, false, false, EM_BF16, 2, false, true, 2, 0, 2, 2,
         false},
        {2, 192, 3, false, false, false, true, false, false, EM_BF16, 2, false, true, 0, 2, 1, 2,
         false},
        /* lines of 4: ping-pong 128 x 192 in clusters, the epilogue, split-K partials, the
         * cooperative 256 x 128 */
        {2, 192, 5, false, false, false, true, false, false, EM_BF16, 2, false, true, 2, 0, 2, 4,
         false},
        {2, 192, 5, true, true, false, false, true, true, EM_F16, 3, false, true, 2, 0, 1, 4,
         false},
        {2, 192, 5, false, false, true, false, false, false, EM_BF16, 2, false, true, 2, 0, 1, 4,
         false},
        {2, 128, 4, false, false, false, true, false, false, EM_BF16, 2, false, true, 0, 2, 2, 4,
         false},
        /* lines of 4 with a forward's epilogue: the bias and the residual staged (the training
         * step's qkv, fc, fc2 and proj forwards) */
        {2, 192, 5, false, false, false, true, false, false, EM_BF16, 2, false, true, 2, 0, 2, 4,
         true},
        {2, 192, 5, false, true, false, true, false, false, EM_BF16, 2, false, true, 2, 0, 1, 4,
         true},
    };
    size_t failed = 0;
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        bool regs = cfg[i].wg == 2;
        em_lang_bind b[] = {
            em_lang_bind_type("T", cfg[i].t),
            em_lang_bind_type("O", cfg[i].raw ? EM_F32 : cfg[i].t), em_lang_bind_int("R", cfg[i].r),
            em_lang_bind_int("WG", cfg[i].wg), em_lang_bind_int("BN", cfg[i].bn),
            em_lang_bind_int("STAGES", cfg[i].stages), em_lang_bind_bool("AT", cfg[i].at),
            em_lang_bind_bool("BT", cfg[i].bt), em_lang_bind_bool("RAW", cfg[i].raw),
            em_lang_bind_bool("BIAS", cfg[i].epi),
            /* lines of 4 (the training step's form): GELU-tanh's backward */
            em_lang_bind_int("ACT", !cfg[i].epi         ? 0
                                    : cfg[i].fwd        ? 1
                                    : cfg[i].pairs == 4 ? 5
                                                        : 2),
            em_lang_bind_bool("RES", cfg[i].epi), em_lang_bind_int("PREGS", regs ? 40 : 0),
            em_lang_bind_bool("AZ", cfg[i].az), em_lang_bind_bool("BZ", cfg[i].bz),
            em_lang_bind_bool("SEPI", cfg[i].sepi), em_lang_bind_bool("PERSIST", cfg[i].persist),
            em_lang_bind_bool("PING", cfg[i].mw > 0),
            em_lang_bind_int("MW", cfg[i].mw > 0    ? cfg[i].mw
                                   : cfg[i].cmw > 0 ? cfg[i].cmw
                                                    : 1),
            em_lang_bind_int("CL", cfg[i].cl > 0 ? cfg[i].cl : 1),
            em_lang_bind_bool("PAIRS", cfg[i].pairs != 0),
            em_lang_bind_int("OW", cfg[i].pairs ? cfg[i].pairs : 8),
            /* the residual (ACT 5: GELU-tanh's input) staged through shared memory where
             * lines of 4 take it */
            em_lang_bind_bool("RV", cfg[i].epi && cfg[i].pairs == 4)};
        em_lang_spec spec = {b, sizeof b / sizeof b[0], 1, &caps};
        em_lang_diags *d = em_lang_diags_new();
        em_ir_kernel *k = em_lang_specialize(m, "matmul_wgmma_tma", &spec, d);
        if (!k) {
            char *text = em_lang_diags_format(d);
            fail_msg("config %zu: %s", i, text ? text : em_last_error());
        }
        em_lang_diags_free(d);
        assert_int_equal(em_ir_verify(k, 0), EM_OK);
        assert_int_equal(em_ir_simplify(k), EM_OK);
        char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
        if (!src) fail_msg("config %zu: %s", i, em_last_error());
        assert_non_null(strstr(src, "wgmma.mma_async.sync.aligned"));
        /* the stages the host's plan counted fit the H200's 227 KiB of shared memory */
        size_t smem = em_codegen_cuda_dynamic_smem(k);
        assert_true(smem > 0 && smem <= 232448);
        assert_non_null(strstr(src, "cp.async.bulk.tensor.3d.shared::cluster.global"));
        assert_non_null(strstr(src, "fence.proxy.tensormap::generic.acquire.sys"));
        assert_non_null(strstr(src, "mbarrier.arrive.expect_tx.shared::cta.b64"));
        /* no per-unit copies left, but the lines of 4's residual chunks (SR) */
        bool sb = cfg[i].epi && !cfg[i].raw && cfg[i].pairs == 4;
        /* (GELU-tanh's backward, ACT 5, stages its input the same way) */
        bool sr = sb;
        assert_true((strstr(src, "cp.async.ca.shared.global") != NULL) == sr);
        assert_true((strstr(src, "setmaxnreg.dec.sync.aligned.u32 40;") != NULL) == regs);
        assert_true((strstr(src, "setmaxnreg.inc.sync.aligned.u32 232;") != NULL) == regs);
        /* named barriers: the staging buffer's, and the lines of 4's tile of bias in shared
         * memory (SB: a bias, not split-K's partials) */
        assert_true((strstr(src, "bar.sync 1, 128;") != NULL) == (cfg[i].sepi || sb));
        /* the named barriers as inline PTX with a memory clobber (no fences around them), and
         * the MMAs' fence without a proxy fence (wgmma_fence_regs: the operands came by TMA) */
        if (cfg[i].sepi) assert_non_null(strstr(src, "bar.sync 1, 128;\" :  :  : \"memory\")"));
        assert_null(strstr(src, "__threadfence_block"));
        assert_non_null(strstr(src, "asm volatile(\"wgmma.fence.sync.aligned;\""));
        assert_null(strstr(src, "fence.proxy.async.shared::cta;\\nwgmma.fence"));
        /* the epilogue's 16-byte lines: stores through outv, out's buffer as lines of 8 */
        assert_non_null(strstr(src, cfg[i].pairs == 4 ? ", 4> *outv_m"
                                    : cfg[i].pairs    ? ", 2> *outv_m"
                                                      : ", 8> *outv_m"));
        /* lines of 4: the neighbouring units' swap */
        assert_true(shuffles(src) == (cfg[i].pairs == 4));
        assert_true(indexed(src, "outv_m") == (cfg[i].sepi || cfg[i].pairs));
        /* clusters: the launch attribute, b's multicast copies, the consumers' arrivals on the
         * other cube's barriers, the cluster barrier after the inits */
        bool cl = cfg[i].cl > 1;
        assert_true((strstr(src, "__cluster_dims__(2, 1, 1)") != NULL) == cl);
        assert_true((strstr(src, "complete_tx::bytes.multicast::cluster") != NULL) == cl);
        assert_true((strstr(src, "mapa.shared::cluster.u32") != NULL) == cl);
        assert_true((strstr(src, "barrier.cluster.wait.acquire.aligned") != NULL) == cl);
        char *log = NULL;
        void *bin = NULL;
        size_t size = 0;
        em_status st = em_nvrtc_compile(src, "sm_90a", &log, &bin, &size);
        if (st != EM_OK) {
            print_message("config %zu: %s\n", i, em_last_error());
            failed++;
        } else {
            print_message("config %zu (wg %d, bn %d, %d stages%s%s%s%s, %zu B shared): %.60s\n", i,
                          cfg[i].wg,
                          cfg[i].bn, cfg[i].stages, cfg[i].sepi ? ", 16-byte epilogue" : "",
                          cfg[i].persist ? ", persistent" : "",
                          cfg[i].mw == 2    ? ", ping-pong 128 rows"
                          : cfg[i].mw == 1  ? ", ping-pong 64 rows"
                          : cfg[i].cmw == 2 ? ", cooperative 256 rows"
                                            : "",
                          cl ? ", clusters of 2" : "",
                          smem, nvrtc_used(log));
            char label[32];
            snprintf(label, sizeof label, "config %zu", i);
            failed += (size_t)nvrtc_problems(log, label);
        }
        free(log);
        free(bin);
        free(src);
        em_ir_kernel_free(k);
    }
    assert_int_equal(failed, 0);
}

/* b's column sums (BS) in the training step's weight-gradient forms for sm_90a: ping-pong 128 x
 * 192 (one column pair a unit) and 64 x 256 (two), the cooperative 256 x 128 in clusters (its
 * summers release every cube's stage), the 16-byte epilogue's persistent 128 x 256: the 4-byte
 * shared loads (shared_load_u32), the producer at 56 registers, the partial rows added up by the
 * last plane of each column tile (LAST) in two of them, split-K's partials summed by each tile's
 * last split (SKL) in the two ping-pong ones, stream-K (SK, with SKL and LAST) in ping-pong 128 x
 * 192 alone and in clusters of two (fc's and fc2's weight gradients), and through NVRTC without a
 * spill where the toolkit is installed. */
static void test_matmul_tma_bsum_compiles(void **state)
{
    (void)state;
    em_caps caps = cuda_caps("sm_90a");
    static const struct {
        int bn, stages, mw, cl;
        bool ping, sepi, sk;
    } cfg[] = {{192, 5, 2, 1, true, false, false},  {256, 4, 1, 1, true, false, false},
               {128, 4, 2, 2, false, false, false}, {256, 4, 1, 1, false, true, false},
               {192, 5, 2, 1, true, false, true},   {192, 5, 2, 2, true, false, true}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        em_lang_bind b[] = {em_lang_bind_type("T", EM_BF16),
                            em_lang_bind_type("O", EM_BF16),
                            em_lang_bind_int("R", 2),
                            em_lang_bind_int("WG", 2),
                            em_lang_bind_int("BN", cfg[i].bn),
                            em_lang_bind_int("STAGES", cfg[i].stages),
                            em_lang_bind_bool("AT", true),
                            em_lang_bind_int("PREGS", 56),
                            em_lang_bind_bool("PERSIST", true),
                            em_lang_bind_bool("PING", cfg[i].ping),
                            em_lang_bind_int("MW", cfg[i].mw),
                            em_lang_bind_int("CL", cfg[i].cl),
                            em_lang_bind_bool("SEPI", cfg[i].sepi),
                            em_lang_bind_bool("PAIRS", !cfg[i].sepi),
                            em_lang_bind_int("OW", cfg[i].sepi ? 8 : 4),
                            em_lang_bind_bool("BS", true),
                            em_lang_bind_bool("LAST", i % 2 == 0 || cfg[i].sk),
                            em_lang_bind_bool("SKL", i < 2 || cfg[i].sk),
                            em_lang_bind_bool("SK", cfg[i].sk)};
        char *src = builtin_cuda_source("matmul_wgmma_tma", b, sizeof b / sizeof b[0], 1, &caps);
        assert_non_null(strstr(src, "(*(const unsigned *)(sb_m"));
        /* LAST: the planes count themselves, the last adds the partial rows up; SKL: the
         * consumers count themselves, the tile's last split sums the partials */
        bool counts = i % 2 == 0 || i < 2 || cfg[i].sk;
        assert_true((strstr(src, "atomicAdd(") != NULL) == counts);
        assert_true((strstr(src, "__threadfence();") != NULL) == counts);
        assert_non_null(strstr(src, "setmaxnreg.dec.sync.aligned.u32 56;"));
        assert_non_null(strstr(src, "setmaxnreg.inc.sync.aligned.u32 224;"));
        assert_true((strstr(src, "mapa.shared::cluster.u32") != NULL) == (cfg[i].cl > 1));
        char label[32];
        snprintf(label, sizeof label, "BS config %zu", i);
        expect_nvrtc_clean(src, "sm_90a", label);
        free(src);
    }
}

int main(void)
{
    /* ptxas's report for test_matmul_tma_compiles (NVRTC reads the options once) */
    setenv("EMBER_NVRTC_OPTIONS", "--ptxas-options=-v", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boxes_on_cpu),        cmocka_unit_test(test_reduce_add_on_cpu),
        cmocka_unit_test(test_reduce_add_cuda),     cmocka_unit_test(test_encode_rules),
        cmocka_unit_test(test_cuda_source),         cmocka_unit_test(test_refused_elsewhere),
        cmocka_unit_test(test_matmul_tma_compiles), cmocka_unit_test(test_matmul_tma_bsum_compiles),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
