/* test_wgmma.c — Hopper's warpgroup MMA in the kernel language (issue #11), without a GPU:
 *  - the arithmetic of src/kernel/lang/wgmma.c (descriptor bits, the swizzled operand addresses,
 *    the accumulator's register layout) against references written here from the PTX ISA's
 *    tables, and against the tile layout that src/kernels/matmul_wgmma.ek copies into;
 *  - a kernel using wgmma_mma with every operand layout, run on the CPU (where the ops are
 *    emulated as the hardware addresses its operands) against a float64 product, and with its
 *    first MMA overwriting a non-zero accumulator (add false);
 *  - the CUDA source of the ops for an sm_90a device (PTX text, descriptor constant, accumulator
 *    operands, 1024-byte shared alignment), compiled by NVRTC for sm_90a when it is installed,
 *    with the built-in matmul_wgmma and matmul_wgmma_ws kernels in the configurations the host
 *    picks (no spills);
 *  - the diagnostics on targets without warpgroup MMAs. */
#include "lang/lang_util.h"

#include "ember/kernel.h"
#include "kernel/codegen/codegen.h"
#include "kernel/lang/wgmma.h"
#include "runtime/drivers/nvrtc.h"
#include "kernel/hopper_util.h"

/* ---- arithmetic ------------------------------------------------------------------------------ */

/* The descriptor built field by field from the PTX table (bits 0-13 start >> 4, 16-29 leading
 * byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset, 62-63 swizzle mode with
 * 1 = 128-byte swizzle), one bit at a time. */
static uint64_t ref_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    uint64_t d = 0;
    struct {
        uint32_t v;
        int at, bits;
    } f[] = {{(addr & 0x3ffff) >> 4, 0, 14},
             {lbo >> 4, 16, 14},
             {sbo >> 4, 32, 14},
             {0, 49, 3},
             {1, 62, 2}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        for (int b = 0; b < f[i].bits; b++)
            if (f[i].v >> b & 1) d |= 1ull << (f[i].at + b);
    return d;
}

static void test_descriptor(void **state)
{
    (void)state;
    static const uint32_t addrs[] = {0, 1024, 2048 + 32, 0x1fc00 + 96, 227 * 1024};
    static const uint32_t lbos[] = {8192, 16384, 2048};
    for (size_t i = 0; i < 5; i++) {
        /* K-major: the leading byte offset is unused and set to 1 (16 bytes) */
        assert_true(em_wgmma_desc(addrs[i], 0) == ref_desc(addrs[i], 16, EM_WGMMA_SBO));
        for (size_t j = 0; j < 3; j++)
            assert_true(em_wgmma_desc(addrs[i], lbos[j]) ==
                        ref_desc(addrs[i], lbos[j], EM_WGMMA_SBO));
    }
}

/* The accumulator layout: warp w of the warpgroup holds rows 16 w .. 16 w + 15, and within them
 * each 8-column block as mma.m16n8's C fragment (c0, c1 at row lane / 4, columns 2 (lane % 4)
 * and + 1; c2, c3 eight rows below). Every element of 64 x N is held exactly once. */
static void test_accumulator_layout(void **state)
{
    (void)state;
    static unsigned char seen[64 * 256];
    for (uint32_t n = 8; n <= 256; n += 8) {
        memset(seen, 0, sizeof seen);
        for (uint32_t u = 0; u < 128; u++)
            for (uint32_t i = 0; i < n / 2; i++) {
                uint32_t row, col, w = u / 32, lane = u % 32, block = i / 4, c = i % 4;
                em_wgmma_d_coord(u, i, &row, &col);
                assert_int_equal(row, 16 * w + lane / 4 + (c >= 2 ? 8 : 0));
                assert_int_equal(col, 8 * block + 2 * (lane % 4) + (c & 1));
                assert_true(row < 64 && col < n);
                assert_int_equal(seen[row * n + col]++, 0);
            }
    }
}

/* The A fragment of wgmma_mma_rs: as mma.m16n8k16's A fragment within each warp's 16 rows (a0,
 * a1 at row lane / 4, columns 2 (lane % 4) and + 1; a2, a3 eight rows below; a4 .. a7 eight
 * columns right), two 16-bit halves a register; every element of 64 x 16 held exactly once, and
 * by the unit whose accumulator holds it (register 2 reg + half of a 16-column slice). */
static void test_fragment_layout(void **state)
{
    (void)state;
    unsigned char seen[64 * 16] = {0};
    for (uint32_t u = 0; u < 128; u++)
        for (uint32_t r = 0; r < 4; r++)
            for (uint32_t h = 0; h < 2; h++) {
                uint32_t row, col, lane = u % 32, j = 2 * r + h, drow, dcol;
                em_wgmma_a_coord(u, r, h, &row, &col);
                assert_int_equal(row, 16 * (u / 32) + lane / 4 + (j / 2 % 2) * 8);
                assert_int_equal(col, 2 * (lane % 4) + j % 2 + (j / 4) * 8);
                assert_true(row < 64 && col < 16);
                assert_int_equal(seen[row * 16 + col]++, 0);
                for (uint32_t slice = 0; slice < 4; slice++) {
                    em_wgmma_d_coord(u, 8 * slice + j, &drow, &dcol);
                    assert_int_equal(drow, row);
                    assert_int_equal(dcol, 16 * slice + col);
                }
            }
}

/* The 128-byte swizzle as CuTe writes it, Swizzle<3,4,3> on byte offsets. */
static uint32_t swizzle128(uint32_t x)
{
    return x ^ ((x & (7u << 7)) >> 3);
}

/* The operand layouts of wgmma.h against (1) the canonical layouts (row r of a K-major operand
 * at r * 128 within its 8-row group, groups 1024 apart; an MN-major operand's k at k * 128,
 * 64-row atoms LBO apart) swizzled, (2) the element index at which matmul_wgmma.ek's copies put
 * element (r, c) of a ROWS x COLS tile (COLS its contiguous dim), for the k slices the kernel
 * passes to wgmma_mma, and (3) 16-byte chunks staying whole, every address distinct. */
static uint32_t kernel_index(uint32_t r, uint32_t c, uint32_t rows)
{
    return c / 64 * (64 * rows) + r * 64 + ((c % 64 / 8) ^ (r % 8)) * 8 + c % 8;
}

static void test_operand_layouts(void **state)
{
    (void)state;
    enum { BK = 64 };
    static unsigned char used[2 * 256 * BK * 2];
    for (int mn = 0; mn < 2; mn++) {
        uint32_t rows = 256, lbo = mn ? 64 * BK * 2 : 0; /* an operand of 256 rows (B, N = 256) */
        memset(used, 0, sizeof used);
        for (uint32_t kk = 0; kk < BK / 16; kk++) {
            uint32_t base = 3 * rows * BK * 2; /* stage 3 of a ring: 1024-aligned */
            uint32_t start = base + (mn ? kk * 16 * 64 * 2 : kk * 16 * 2);
            for (uint32_t r = 0; r < rows; r++)
                for (uint32_t k = 0; k < 16; k++) {
                    uint32_t got = em_wgmma_byte(start, lbo, r, k);
                    uint32_t plain =
                        mn ? start + r / 64 * lbo + k / 8 * 1024 + k % 8 * 128 + r % 64 * 2
                           : start + r / 8 * 1024 + r % 8 * 128 + k * 2;
                    assert_int_equal(got, swizzle128(plain));
                    uint32_t kg = kk * 16 + k; /* the tile's k */
                    uint32_t want = mn ? kernel_index(kg, r, BK) : kernel_index(r, kg, rows);
                    assert_int_equal(got, base + want * 2);
                    /* 16-byte chunks along the contiguous dim (k for K-major, r for MN-major) */
                    if (!mn && k % 8)
                        assert_int_equal(got, em_wgmma_byte(start, lbo, r, k - 1) + 2);
                    if (mn && r % 8) assert_int_equal(got, em_wgmma_byte(start, lbo, r - 1, k) + 2);
                    uint32_t at = got - base;
                    assert_true(at < sizeof used);
                    assert_int_equal(used[at]++, 0);
                }
        }
    }
}

/* ---- the ops on the CPU -----------------------------------------------------------------------
 */

/* acc = A (64 x 64) * B (64 x N) in four wgmma_mma of k 16, with A and B staged as matmul_wgmma
 * stages them (K-major or MN-major per AMN / BMN), then written out by the register layout. */
static const char *wg_src =
    "inline u32 at(u32 r, u32 c, comptime u32 ROWS)\n"
    "{\n"
    "    return c / 64 * (64 * ROWS) + r * 64 + ((c % 64 / 8) ^ (r % 8)) * 8 + c % 8;\n"
    "}\n"
    "kernel<T: float> void wg(const tensor(T) a, const tensor(T) b, tensor(f32) out,\n"
    "                         comptime u32 N = 64, comptime bool AMN = false,\n"
    "                         comptime bool BMN = false, comptime bool OVER = false)\n"
    "{\n"
    "    shared T sa[64 * 64];\n"
    "    shared T sb[N * 64];\n"
    "    f32 acc[N / 2];\n"
    "    for (u32 e in range(UNIT_POS, 64 * 64, 128)) {\n"
    "        u32 m = e / 64;\n"
    "        u32 k = e % 64;\n"
    "        sa[AMN ? at(k, m, 64) : at(m, k, 64)] = a[e];\n"
    "    }\n"
    "    for (u32 e in range(UNIT_POS, 64 * N, 128)) {\n"
    "        u32 k = e / N;\n"
    "        u32 n = e % N;\n"
    "        sb[BMN ? at(k, n, 64) : at(n, k, N)] = b[e];\n"
    "    }\n"
    "    for (u32 i in range(N / 2)) { acc[i] = OVER ? 1000.0 : 0.0; }\n"
    "    wgmma_fence();\n"
    "    sync_cube();\n"
    "    comptime for (u32 kk in range(4)) {\n"
    "        wgmma_mma(acc, sa, AMN ? kk * 1024 : kk * 16, AMN ? 4096 : 0, sb,\n"
    "                  BMN ? kk * 1024 : kk * 16, BMN ? 4096 : 0, !OVER || kk > 0);\n"
    "    }\n"
    "    wgmma_commit();\n"
    "    wgmma_wait(acc, 0);\n"
    "    u32 t = UNIT_POS;\n"
    "    comptime for (u32 i in range(N / 2)) {\n"
    "        u32 row = t / 32 * 16 + t % 32 / 4 + i / 2 % 2 * 8;\n"
    "        u32 col = i / 4 * 8 + t % 4 * 2 + i % 2;\n"
    "        out[row * N + col] = acc[i];\n"
    "    }\n"
    "}\n";

static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* the test's values are exact in bf16 */
}

/* With over, acc starts at 1000 and the first MMA overwrites it (add false): the product alone
 * comes out either way. */
static void run_wg(em_lang_module *m, unsigned n, bool amn, bool bmn, bool over)
{
    uint16_t a[64 * 64], b[64 * 256];
    float fa[64 * 64], fb[64 * 256], out[64 * 256];
    for (int i = 0; i < 64 * 64; i++) fa[i] = (float)((i * 7 + 3) % 13 - 6) * 0.25f;
    for (unsigned i = 0; i < 64 * n; i++) fb[i] = (float)((int)(i * 5 + 1) % 11 - 5) * 0.5f;
    for (int i = 0; i < 64 * 64; i++) a[i] = bf16_bits(fa[i]);
    for (unsigned i = 0; i < 64 * n; i++) b[i] = bf16_bits(fb[i]);
    em_buffer *ba = buf_new(a, sizeof a), *bb = buf_new(b, 64 * n * 2),
              *bo = buf_new(NULL, 64 * n * 4);
    em_lang_bind binds[] = {em_lang_bind_type("T", EM_BF16), em_lang_bind_int("N", n),
                            em_lang_bind_bool("AMN", amn), em_lang_bind_bool("BMN", bmn),
                            em_lang_bind_bool("OVER", over)};
    em_lang_spec spec = {binds, 5, 1, NULL};
    em_arg args[] = {em_arg_buffer(ba, 64 * 64), em_arg_buffer(bb, 64 * n),
                     em_arg_buffer(bo, 64 * n)};
    launch_x(m, "wg", &spec, 1, 128, args, 3);
    buf_get(bo, out, 64 * n * 4);
    size_t bad = 0;
    for (unsigned r = 0; r < 64; r++)
        for (unsigned c = 0; c < n; c++) {
            double want = 0;
            for (unsigned k = 0; k < 64; k++) want += (double)fa[r * 64 + k] * fb[k * n + c];
            if ((double)out[r * n + c] != want && bad++ < 4)
                print_message("N=%u amn=%d bmn=%d: out[%u][%u] = %g, want %g\n", n, amn, bmn, r, c,
                              (double)out[r * n + c], want);
        }
    assert_int_equal(bad, 0);
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bo);
}

static void test_emulated_on_cpu(void **state)
{
    (void)state;
    em_lang_module *m = must_load(wg_src);
    run_wg(m, 64, false, false, false);
    run_wg(m, 256, false, true, false); /* the forward pass: row-major a, row-major (MN-major) b */
    run_wg(m, 128, true, false, false); /* a^T b and a b^T of backward passes */
    run_wg(m, 128, true, true, false);
    run_wg(m, 8, false, false, false);
    run_wg(m, 64, false, true, true); /* the first MMA overwrites acc (add false) */
    em_lang_module_free(m);
}

/* out = T(a b) c: S = a (64 x 64) b (64 x 64) with wgmma_mma from shared memory, then S rounded
 * to T and packed pairwise is the register A operand of wgmma_mma_rs with c (64 x N, row-major:
 * MN-major B), as attention's O += P V. */
static const char *chain_src =
    "inline u32 at(u32 r, u32 c, comptime u32 ROWS)\n"
    "{\n"
    "    return c / 64 * (64 * ROWS) + r * 64 + ((c % 64 / 8) ^ (r % 8)) * 8 + c % 8;\n"
    "}\n"
    "inline<T: float> u32 pack(T lo, T hi)\n"
    "{\n"
    "    return u32(bitcast<u16>(lo)) | (u32(bitcast<u16>(hi)) << 16);\n"
    "}\n"
    "kernel<T: float> void chain(const tensor(T) a, const tensor(T) b, const tensor(T) c,\n"
    "                            tensor(f32) out, comptime u32 N = 64)\n"
    "{\n"
    "    shared T sa[64 * 64];\n"
    "    shared T sb[64 * 64];\n"
    "    shared T sc[64 * 64 * ((N + 63) / 64)];\n"
    "    f32 s[32];\n"
    "    f32 o[N / 2];\n"
    "    u32 p[16];\n"
    "    for (u32 e in range(UNIT_POS, 64 * 64, 128)) {\n"
    "        sa[at(e / 64, e % 64, 64)] = a[e];\n"
    "        sb[at(e / 64, e % 64, 64)] = b[e];\n"
    "    }\n"
    "    for (u32 e in range(UNIT_POS, 64 * N, 128)) { sc[at(e / N, e % N, 64)] = c[e]; }\n"
    "    comptime for (u32 i in range(32)) { s[i] = 0.0; }\n"
    "    comptime for (u32 i in range(N / 2)) { o[i] = 0.0; }\n"
    "    wgmma_fence();\n"
    "    sync_cube();\n"
    "    comptime for (u32 kk in range(4)) { wgmma_mma(s, sa, kk * 16, 0, sb, kk * 1024, 4096); }\n"
    "    wgmma_commit();\n"
    "    wgmma_wait(s, 0);\n"
    "    comptime for (u32 i in range(16)) { p[i] = pack(T(s[2 * i]), T(s[2 * i + 1])); }\n"
    "    wgmma_fence_regs(p);\n"
    "    comptime for (u32 kk in range(4)) { wgmma_mma_rs(o, p, kk * 4, sc, kk * 1024, 4096); }\n"
    "    wgmma_commit();\n"
    "    wgmma_wait(o, 0);\n"
    "    u32 t = UNIT_POS;\n"
    "    comptime for (u32 i in range(N / 2)) {\n"
    "        u32 row = t / 32 * 16 + t % 32 / 4 + i / 2 % 2 * 8;\n"
    "        u32 col = i / 4 * 8 + t % 4 * 2 + i % 2;\n"
    "        out[row * N + col] = o[i];\n"
    "    }\n"
    "}\n";

/* f rounded to bf16 (to nearest, ties to even), as a float */
static float bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static void run_chain(em_lang_module *m, unsigned n, unsigned seed)
{
    uint16_t a[64 * 64], b[64 * 64], c[64 * 256];
    float fa[64 * 64], fb[64 * 64], fc[64 * 256], out[64 * 256];
    uint32_t x = seed;
    for (int i = 0; i < 64 * 64; i++) {
        x = x * 1664525u + 1013904223u;
        fa[i] = (float)((int)(x >> 24) % 17 - 8) * 0.125f;
        x = x * 1664525u + 1013904223u;
        fb[i] = (float)((int)(x >> 24) % 13 - 6) * 0.25f;
        a[i] = bf16_bits(fa[i]);
        b[i] = bf16_bits(fb[i]);
    }
    for (unsigned i = 0; i < 64 * n; i++) {
        x = x * 1664525u + 1013904223u;
        fc[i] = (float)((int)(x >> 24) % 11 - 5) * 0.5f;
        c[i] = bf16_bits(fc[i]);
    }
    em_buffer *ba = buf_new(a, sizeof a), *bb = buf_new(b, sizeof b), *bc = buf_new(c, 64 * n * 2),
              *bo = buf_new(NULL, 64 * n * 4);
    em_lang_bind binds[] = {em_lang_bind_type("T", EM_BF16), em_lang_bind_int("N", n)};
    em_lang_spec spec = {binds, 2, 1, NULL};
    em_arg args[] = {em_arg_buffer(ba, 64 * 64), em_arg_buffer(bb, 64 * 64),
                     em_arg_buffer(bc, 64 * n), em_arg_buffer(bo, 64 * n)};
    launch_x(m, "chain", &spec, 1, 128, args, 4);
    buf_get(bo, out, 64 * n * 4);
    static float p[64 * 64];
    for (unsigned r = 0; r < 64; r++)
        for (unsigned k = 0; k < 64; k++) {
            double s = 0; /* exact: small multiples of 1/32 */
            for (unsigned j = 0; j < 64; j++) s += (double)fa[r * 64 + j] * fb[j * 64 + k];
            p[r * 64 + k] = bf16_round((float)s);
        }
    size_t bad = 0;
    for (unsigned r = 0; r < 64; r++)
        for (unsigned col = 0; col < n; col++) {
            double want = 0;
            for (unsigned k = 0; k < 64; k++) want += (double)p[r * 64 + k] * fc[k * n + col];
            if (fabs((double)out[r * n + col] - want) > 1e-6 * (1 + fabs(want)) && bad++ < 4)
                print_message("N=%u: out[%u][%u] = %.9g, want %.9g\n", n, r, col,
                              (double)out[r * n + col], want);
        }
    assert_int_equal(bad, 0);
    em_buffer_free(ba);
    em_buffer_free(bb);
    em_buffer_free(bc);
    em_buffer_free(bo);
}

/* wgmma_mma_rs: the register operand read as the hardware reads it (on the device under test:
 * the CPU's emulation, or the H200 with EMBER_TEST_DEVICE=cuda:0). */
static void test_register_operand(void **state)
{
    (void)state;
    em_lang_module *m = must_load(chain_src);
    run_chain(m, 64, 1);
    run_chain(m, 128, 2);
    run_chain(m, 8, 3);
    em_lang_module_free(m);
}

/* ---- CUDA -------------------------------------------------------------------------------------
 */

/* The kernel `name` of m specialized for caps (simplified); NULL with the first diagnostic in
 * `why`. */
static em_ir_kernel *specialize(const em_lang_module *m, const char *name, const em_lang_bind *b,
                                size_t nb, const em_caps *caps, char *why, size_t whysize)
{
    em_lang_spec spec = {b, nb, 1, caps};
    em_lang_diags *d = em_lang_diags_new();
    em_ir_kernel *k = em_lang_specialize(m, name, &spec, d);
    if (!k && why) {
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
    em_lang_module *m = must_load(wg_src);
    em_caps caps = cuda_caps("sm_90a");
    em_lang_bind b[] = {em_lang_bind_type("T", EM_BF16), em_lang_bind_int("N", 256),
                        em_lang_bind_bool("AMN", true), em_lang_bind_bool("BMN", false),
                        em_lang_bind_bool("OVER", true)};
    char why[2048] = "";
    em_ir_kernel *k = specialize(m, "wg", b, 5, &caps, why, sizeof why);
    if (!k) fail_msg("%s", why);
    char *ir = em_ir_print_kernel(k);
    assert_non_null(strstr(ir, "cuda.wgmma.mma:256,bf16,1,0@"));
    assert_non_null(strstr(ir, "cuda.wgmma.desc:8192@"));
    assert_non_null(strstr(ir, "cuda.wgmma.desc:0@"));
    free(ir);
    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
    if (!src) fail_msg("%s", em_last_error());
    assert_non_null(strstr(src, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, "));
    assert_non_null(strstr(src, "%126, %127}, %128, %129, p, 1, 1, 1, 0;"));
    /* the scale-d predicate's operand: the first MMA overwrites (0), the others add (1) */
    assert_non_null(strstr(src, "\"r\"(0u) : \"memory\");"));
    assert_non_null(strstr(src, "\"r\"(1u) : \"memory\");"));
    assert_non_null(strstr(src, "fence.proxy.async.shared::cta;\\nwgmma.fence.sync.aligned;"));
    assert_non_null(strstr(src, "wgmma.commit_group.sync.aligned;"));
    assert_non_null(strstr(src, "wgmma.wait_group.sync.aligned 0;"));
    assert_non_null(strstr(src, "[127])"));
    assert_null(strstr(src, "[128])"));
    char desc[64];
    snprintf(desc, sizeof desc, "(0x%llxull | ", (unsigned long long)ref_desc(0, 8192, 1024));
    assert_non_null(strstr(src, desc)); /* a's MN-major descriptor: atoms 8192 bytes apart */
    snprintf(desc, sizeof desc, "(0x%llxull | ", (unsigned long long)ref_desc(0, 16, 1024));
    assert_non_null(strstr(src, desc)); /* b's K-major one */
    assert_non_null(strstr(src, "__cvta_generic_to_shared("));
    assert_non_null(strstr(src, "__align__(1024)"));
    free(src);
    /* the same IR for a CUDA device without sm_90a is refused by the generator */
    em_caps old = cuda_caps("sm_90");
    src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &old);
    assert_null(src);
    assert_non_null(strstr(em_last_error(), "need compute capability 9.0 (sm_90a)"));
    em_ir_kernel_free(k);
    em_lang_module_free(m);
}

/* wgmma_mma_rs on CUDA: the fragment registers as "r" operands of the instruction, pinned before
 * the fence; through NVRTC, ptxas compiles it without serializing the MMAs or spilling. */
static void test_cuda_register_operand(void **state)
{
    (void)state;
    em_lang_module *m = must_load(chain_src);
    em_caps caps = cuda_caps("sm_90a");
    em_lang_bind b[] = {em_lang_bind_type("T", EM_BF16), em_lang_bind_int("N", 64)};
    char why[2048] = "";
    em_ir_kernel *k = specialize(m, "chain", b, 2, &caps, why, sizeof why);
    if (!k) fail_msg("%s", why);
    char *ir = em_ir_print_kernel(k);
    assert_non_null(strstr(ir, "cuda.wgmma.mma_rs:64,bf16,1,"));
    assert_non_null(strstr(ir, "cuda.wgmma.pin@"));
    free(ir);
    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
    if (!src) fail_msg("%s", em_last_error());
    assert_non_null(strstr(src, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, "));
    assert_non_null(strstr(src, "%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;"));
    assert_non_null(strstr(src, "asm volatile(\"\" : \"+r\"("));
    /* the pack's bitcasts read a bf16 register's bits (its top half), not a second rounding */
    assert_non_null(strstr(src, "(unsigned)em_f2b_exact("));
    assert_null(strstr(src, "(unsigned)em_f2b("));
    expect_nvrtc_clean(src, "sm_90a", "chain");
    free(src);
    em_ir_kernel_free(k);
    /* a fragment that is no u32 array, and registers past its end */
    const char *bad =
        "kernel void bad(tensor(f32) out)\n{\n    shared bf16 s[4096];\n    f32 acc[32];\n"
        "    wgmma_mma_rs(acc, acc, 0, s, 0, 4096);\n    out[0] = acc[0];\n}\n";
    assert_true(check_error_at(bad, 5, 23,
                               "'wgmma_mma_rs' takes its A fragment from a local u32 array", NULL));
    const char *bad2 =
        "kernel void bad(tensor(f32) out)\n{\n    shared bf16 s[4096];\n    f32 acc[32];\n"
        "    u32 p[8];\n    wgmma_mma_rs(acc, p, 6, s, 0, 4096);\n    out[0] = acc[0];\n}\n";
    assert_true(
        check_error_at(bad2, 6, 26, "'wgmma_mma_rs': registers 6 .. 9 of an array of 8", NULL));
    const char *bad3 = "kernel void bad(tensor(f32) out)\n{\n    f32 acc[32];\n    bf16 q[8];\n"
                       "    wgmma_fence_regs(acc, q);\n    out[0] = acc[0];\n}\n";
    assert_true(check_error_at(
        bad3, 5, 27, "a wgmma fence pins local arrays of u32, i32 or f32 (MMA operands)", NULL));
    em_lang_module_free(m);
}

static void expect_refused(const em_lang_module *m, const em_caps *caps, const char *what)
{
    em_lang_bind b[] = {em_lang_bind_type("T", EM_BF16)};
    char why[2048] = "";
    em_ir_kernel *k = specialize(m, "wg", b, 1, caps, why, sizeof why);
    assert_null(k);
    if (!strstr(why, what) || !strstr(why, "needs warpgroup MMAs") || !strstr(why, "test.ek:"))
        fail_msg("unexpected diagnostic: %s", why);
}

static void test_refused_elsewhere(void **state)
{
    (void)state;
    em_lang_module *m = must_load(wg_src);
    em_caps c = cuda_caps("sm_90");
    expect_refused(m, &c, "this CUDA device (sm_90)");
    c = cuda_caps("sm_80");
    expect_refused(m, &c, "this CUDA device (sm_80)");
    snprintf(c.target, sizeof c.target, "opencl");
    expect_refused(m, &c, "the opencl target");
    snprintf(c.target, sizeof c.target, "glsl");
    expect_refused(m, &c, "the glsl target");
    /* wrong operands: f32 shared arrays, an accumulator of the wrong size */
    const char *bad =
        "kernel void bad(tensor(f32) out)\n{\n    shared f32 s[4096];\n    f32 acc[32];\n"
        "    wgmma_mma(acc, s, 0, 0, s, 0, 0);\n    out[0] = acc[0];\n}\n";
    assert_true(check_error_at(
        bad, 5, 20, "'wgmma_mma' reads its operands from shared arrays of f16 or bf16", NULL));
    const char *bad2 =
        "kernel void bad(tensor(f32) out)\n{\n    shared bf16 s[4096];\n    f32 acc[6];\n"
        "    wgmma_mma(acc, s, 0, 0, s, 0, 100);\n    out[0] = acc[0];\n}\n";
    assert_true(check_error_at(bad2, 5, 15,
                               "'wgmma_mma': an accumulator of 6 elements is no 64 x N tile",
                               "N (twice its length) is a multiple of 8 from 8 to 256"));
    /* the add flag is a bool */
    const char *bad3 =
        "kernel void bad(tensor(f32) out)\n{\n    shared bf16 s[4096];\n    f32 acc[32];\n"
        "    wgmma_mma(acc, s, 0, 0, s, 0, 0, 1u);\n    out[0] = acc[0];\n}\n";
    assert_true(check_error_at(
        bad3, 5, 38, "cannot convert 'u32' to 'bool' in add (whether to add to acc)", NULL));
    em_lang_module_free(m);
}

/* The built-in kernel in the configurations of src/tensor/matmul_config.c, through NVRTC for
 * sm_90a with ptxas's report: it must compile and spill nothing. */
static void test_matmul_wgmma_compiles(void **state)
{
    (void)state;
    setenv("EMBER_NVRTC_OPTIONS", "--ptxas-options=-v", 1);
    SKIP_UNLESS_NVRTC();
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    em_caps caps = cuda_caps("sm_90a");
    static const struct {
        int wg, bn, stages;
        bool at, bt, raw, epi;
        em_scalar t;
        int r;
        bool ws;   /* matmul_wgmma_ws */
        bool regs; /* with setmaxnreg: the producer keeps 56 registers, two consumers 224 */
    } cfg[] = {
        {2, 256, 4, false, false, false, false, EM_BF16, 2, false, false},
        {2, 128, 5, false, false, false, true, EM_BF16, 2, false, false},
        {2, 256, 4, true, false, false, false, EM_BF16, 3, false, false},
        {2, 256, 4, false, true, false, true, EM_F16, 2, false, false},
        {1, 128, 6, true, true, true, false, EM_BF16, 3, false, false},
        {2, 192, 4, false, false, false, false, EM_BF16, 2, false, false},
        {2, 256, 4, false, false, false, false, EM_BF16, 2, true, false},
        {2, 256, 4, false, false, false, false, EM_BF16, 2, true, true},
        {2, 128, 6, false, true, false, true, EM_BF16, 2, true, true},
        {2, 256, 4, true, false, true, false, EM_F16, 3, true, true},
        {2, 192, 4, true, true, false, true, EM_BF16, 2, true, false},
        {3, 128, 5, false, false, false, false, EM_BF16, 2, true, false},
    };
    size_t failed = 0;
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        em_lang_bind b[] = {em_lang_bind_type("T", cfg[i].t),
                            em_lang_bind_type("O", cfg[i].raw ? EM_F32 : cfg[i].t),
                            em_lang_bind_int("R", cfg[i].r),
                            em_lang_bind_int("WG", cfg[i].wg),
                            em_lang_bind_int("BN", cfg[i].bn),
                            em_lang_bind_int("STAGES", cfg[i].stages),
                            em_lang_bind_bool("AT", cfg[i].at),
                            em_lang_bind_bool("BT", cfg[i].bt),
                            em_lang_bind_bool("RAW", cfg[i].raw),
                            em_lang_bind_bool("BIAS", cfg[i].epi),
                            em_lang_bind_int("ACT", cfg[i].epi ? 2 : 0),
                            em_lang_bind_bool("RES", cfg[i].epi),
                            em_lang_bind_int("PREGS", cfg[i].regs ? 56 : 0)};
        const char *kname = cfg[i].ws ? "matmul_wgmma_ws" : "matmul_wgmma";
        char w2[2048] = "";
        em_ir_kernel *k = specialize(m, kname, b, sizeof b / sizeof b[0] - (cfg[i].ws ? 0 : 1),
                                     &caps, w2, sizeof w2);
        if (!k) fail_msg("matmul_wgmma config %zu: %s", i, w2);
        char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &caps);
        if (!src) fail_msg("config %zu: %s", i, em_last_error());
        assert_non_null(strstr(src, "wgmma.mma_async.sync.aligned"));
        char *log = NULL;
        void *bin = NULL;
        size_t size = 0;
        em_status st = em_nvrtc_compile(src, "sm_90a", &log, &bin, &size);
        if (st != EM_OK) {
            print_message("config %zu: %s\n", i, em_last_error());
            failed++;
        } else {
            print_message("config %zu (%s, wg %d, bn %d, %d stages): %.60s\n", i, kname, cfg[i].wg,
                          cfg[i].bn, cfg[i].stages, nvrtc_used(log));
            if (cfg[i].ws) {
                /* the barriers' PTX, and setmaxnreg only with two consumers */
                assert_non_null(strstr(src, "cp.async.mbarrier.arrive.noinc.shared::cta.b64"));
                assert_non_null(strstr(src, "mbarrier.try_wait.parity.shared::cta.b64"));
                assert_true((strstr(src, "setmaxnreg.inc.sync.aligned.u32 224;") != NULL) ==
                            cfg[i].regs);
                assert_true((strstr(src, "setmaxnreg.dec.sync.aligned.u32 56;") != NULL) ==
                            cfg[i].regs);
                assert_non_null(strstr(src, "__launch_bounds__("));
            }
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor),        cmocka_unit_test(test_accumulator_layout),
        cmocka_unit_test(test_fragment_layout),   cmocka_unit_test(test_operand_layouts),
        cmocka_unit_test(test_emulated_on_cpu),   cmocka_unit_test(test_register_operand),
        cmocka_unit_test(test_cuda_source),       cmocka_unit_test(test_cuda_register_operand),
        cmocka_unit_test(test_refused_elsewhere), cmocka_unit_test(test_matmul_wgmma_compiles),
    };
    return cmocka_run_group_tests(tests, dev_setup, dev_teardown);
}
