/* cuda_compile.c — the CUDA compile conformance test (issue #4's CI check, no GPU needed): every
 * built-in kernel (em_lang_builtins) and every kernel of the conformance corpus, specialized for
 * representative bindings with an H200's / A100's capabilities, goes through the CUDA code
 * generator exactly as the CUDA driver generates it (em_rt_cuda_driver.generate) and through NVRTC
 * to a cubin for sm_80 and for sm_90. Kernels are compiled in batches (each batch holds one
 * specialization per kernel name); a failing batch is retried kernel by kernel so that every
 * failing kernel is named. Skipped (exit code 77 for CTest) when libnvrtc is absent. With
 * EMBER_CONF_CODEGEN_ONLY=1 (conformance.cuda_codegen, the sanitizer build) the same sources are
 * generated and checked to hold every kernel, without NVRTC: the code generator under the
 * sanitizers, NVRTC's time left to the plain build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "conformance.h"
#include "kernel/codegen/codegen.h"
#include "runtime/driver.h"
#include "runtime/drivers/nvrtc.h"

static bool g_skipped;

/* EMBER_CONF_CODEGEN_ONLY=1: generate the sources, do not compile them. */
static bool codegen_only(void)
{
    const char *v = getenv("EMBER_CONF_CODEGEN_ONLY");
    return v && strcmp(v, "1") == 0;
}

/* What the summaries say was done to each specialization. */
static const char *done_verb(void)
{
    return codegen_only() ? "generated" : "compiled";
}

#define SKIP_WITHOUT_NVRTC()                                                                       \
    do {                                                                                           \
        char why_[512];                                                                            \
        if (!codegen_only() && !em_nvrtc_available(why_, sizeof(why_))) {                          \
            printf("skipped: %s\n", why_);                                                         \
            g_skipped = true;                                                                      \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* The capabilities of a GPU of compute capability sm (80: A100, 90: H200). */
static em_caps gpu_caps(int sm)
{
    em_caps caps;
    memset(&caps, 0, sizeof(caps));
    snprintf(caps.target, sizeof(caps.target), "cuda");
    snprintf(caps.arch, sizeof(caps.arch), "sm_%d", sm);
    snprintf(caps.device_name, sizeof(caps.device_name), "sm_%d", sm);
    caps.plane_dim = 32;
    caps.max_cube_units = 1024;
    caps.max_cube_dim[0] = caps.max_cube_dim[1] = 1024;
    caps.max_cube_dim[2] = 64;
    caps.max_shared = sm >= 90 ? 232448 : 166912;
    caps.compute_units = sm >= 90 ? 132 : 108;
    for (int s = 0; s < EM_SCALAR_COUNT; s++) caps.dtype[s] = true;
    caps.float_atomic_add = caps.plane_ops = caps.matrix = caps.print = true;
    return caps;
}

/* True when image is an ELF cubin for an NVIDIA GPU (e_machine 190). */
static bool is_cubin(const void *image, size_t size)
{
    const unsigned char *p = image;
    return size > 64 && memcmp(p, "\177ELF", 4) == 0 && (p[18] | p[19] << 8) == 190;
}

/* Specializes `kernel` with `binds`, dropping bindings the kernel does not have (so that one set
 * of representative bindings serves every kernel). NULL (message in why) when it cannot be
 * specialized. */
static void make_label(const char *kernel, const em_lang_bind *b, size_t n, unsigned w, char *out,
                       size_t size)
{
    size_t len = (size_t)snprintf(out, size, "%s<", kernel);
    for (size_t i = 0; i < n && len < size; i++) {
        if (b[i].kind == EM_BIND_TYPE)
            len += (size_t)snprintf(out + len, size - len, "%s%s=%s", i ? "," : "", b[i].name,
                                    em_scalar_name(b[i].type));
        else
            len += (size_t)snprintf(out + len, size - len, "%s%s=%lld", i ? "," : "", b[i].name,
                                    (long long)(b[i].kind == EM_BIND_BOOL ? b[i].b : b[i].i));
    }
    if (len < size) snprintf(out + len, size - len, "> w%u", w);
}

static em_ir_kernel *specialize_adaptive(const em_lang_module *m, const char *kernel,
                                         const em_lang_bind *binds, size_t nbinds,
                                         unsigned line_width, const em_caps *caps, char *why,
                                         size_t why_size, char *label, size_t label_size)
{
    em_lang_bind use[32];
    size_t n = nbinds < 32 ? nbinds : 32;
    memcpy(use, binds, n * sizeof(*use));
    for (int attempt = 0; attempt < 4; attempt++) {
        em_lang_spec spec = {use, n, line_width, caps};
        em_lang_diags *d = em_lang_diags_new();
        em_ir_kernel *k = em_lang_specialize(m, kernel, &spec, d);
        if (label) make_label(kernel, use, n, line_width, label, label_size);
        if (k) {
            em_lang_diags_free(d);
            if (em_ir_verify(k, 0) != EM_OK || em_ir_simplify(k) != EM_OK) {
                snprintf(why, why_size, "%s", em_last_error());
                em_ir_kernel_free(k);
                return NULL;
            }
            return k;
        }
        bool dropped = false;
        for (size_t i = 0; i < em_lang_diags_count(d); i++) {
            const char *msg = em_lang_diags_at(d, i)->message;
            /* "... has no generic or comptime parameter named 'X'" or "parameter 'X' of kernel
             * 'k' is not comptime: pass it at launch" */
            const char *q = strstr(msg, "comptime parameter named '");
            if (q)
                q += strlen("comptime parameter named '");
            else if (strncmp(msg, "parameter '", 11) == 0 && strstr(msg, "is not comptime"))
                q = msg + 11;
            else
                continue;
            for (size_t j = 0; j < n; j++) {
                size_t len = strlen(use[j].name);
                if (strncmp(q, use[j].name, len) == 0 && q[len] == '\'') {
                    use[j] = use[--n];
                    dropped = true;
                    break;
                }
            }
        }
        if (!dropped) {
            snprintf(why, why_size, "%s", em_lang_diags_count(d) ? em_lang_diags_at(d, 0)->message
                                                                 : em_last_error());
            em_lang_diags_free(d);
            return NULL;
        }
        em_lang_diags_free(d);
    }
    snprintf(why, why_size, "bindings could not be matched");
    return NULL;
}

/* Generates (as the CUDA driver does) and compiles ks for sm_XY; on failure of a batch, compiles
 * each kernel alone and records each failure. Returns the number of kernels that failed. */
static size_t compile_batch(em_ir_kernel **ks, const char *const *labels, size_t n, int sm)
{
    if (n == 0) return 0;
    em_caps caps = gpu_caps(sm);
    char arch[16];
    snprintf(arch, sizeof(arch), "sm_%d", sm);
    char *src = em_rt_cuda_driver.generate(NULL, (const em_ir_kernel *const *)ks, n, &caps);
    void *bin = NULL;
    size_t size = 0;
    bool only = codegen_only();
    em_status st = !src   ? em_last_status()
                   : only ? EM_OK
                          : em_nvrtc_compile(src, arch, NULL, &bin, &size);
    bool ok = st == EM_OK && (only || is_cubin(bin, size));
    for (size_t i = 0; ok && i < n; i++) {
        /* the cubin (or, generating only, the source) holds each kernel's entry point */
        const char *name = em_ir_kernel_name(ks[i]);
        if (only ? !strstr(src, name) : !memmem(bin, size, name, strlen(name))) ok = false;
    }
    free(bin);
    free(src);
    if (ok) return 0;
    if (n == 1) {
        printf("  FAIL %s for %s: %s\n", labels[0], arch,
               st != EM_OK ? em_last_error()
               : only      ? "the source does not hold the kernel"
                           : "not a cubin holding the kernel");
        return 1;
    }
    size_t failed = 0;
    for (size_t i = 0; i < n; i++) failed += compile_batch(&ks[i], &labels[i], 1, sm);
    if (!failed) printf("  FAIL batch of %zu kernels for %s, though each compiles alone\n", n, arch);
    return failed ? failed : 1;
}

/* One specialization to compile: a kernel, its bindings and line width. */
typedef struct spec_item {
    const char *kernel;
    em_lang_bind binds[24];
    size_t nbinds;
    unsigned line_width;
} spec_item;

/* Compiles the items in rounds (one specialization per kernel name per batch) for sm_80 and
 * sm_90; items that cannot be specialized count as failures when `must_specialize`. */
static void compile_items(const em_lang_module *m, const spec_item *items, size_t nitems,
                          bool must_specialize, size_t *compiled, size_t *failed, size_t *unspec)
{
    static const int sms[] = {80, 90};
    bool *done = calloc(nitems, 1);
    em_ir_kernel **ks = calloc(nitems, sizeof(*ks));
    char (*labels)[160] = calloc(nitems, sizeof(*labels));
    const char **lp = calloc(nitems, sizeof(*lp));
    for (size_t s = 0; s < 2; s++) {
        memset(done, 0, nitems);
        for (;;) {
            size_t n = 0;
            for (size_t i = 0; i < nitems; i++) {
                if (done[i]) continue;
                bool clash = false;
                for (size_t j = 0; j < n && !clash; j++)
                    clash = strcmp(em_ir_kernel_name(ks[j]), items[i].kernel) == 0;
                if (clash) continue;
                done[i] = true;
                em_caps caps = gpu_caps(sms[s]);
                char why[512];
                em_ir_kernel *k = specialize_adaptive(m, items[i].kernel, items[i].binds,
                                                      items[i].nbinds, items[i].line_width, &caps,
                                                      why, sizeof(why), labels[n], sizeof(labels[n]));
                if (!k) {
                    if (s == 0) {
                        printf("  %s %s: not specialized: %s\n", must_specialize ? "FAIL" : "note",
                               labels[n], why);
                        (*unspec)++;
                        if (must_specialize) (*failed)++;
                    }
                    continue;
                }
                lp[n] = labels[n];
                ks[n++] = k;
            }
            if (n == 0) break;
            *failed += compile_batch(ks, lp, n, sms[s]);
            *compiled += n;
            for (size_t j = 0; j < n; j++) em_ir_kernel_free(ks[j]);
        }
    }
    free(done), free(ks), free(labels), free(lp);
}

static spec_item item(const char *kernel, unsigned w, size_t nb, const em_lang_bind *b)
{
    spec_item it;
    memset(&it, 0, sizeof(it));
    it.kernel = kernel;
    it.line_width = w;
    it.nbinds = nb < 24 ? nb : 24;
    if (it.nbinds) memcpy(it.binds, b, it.nbinds * sizeof(*b));
    return it;
}

static void test_builtins_compile(void **state)
{
    (void)state;
    SKIP_WITHOUT_NVRTC();
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    static const em_scalar types[] = {EM_F32, EM_F16, EM_BF16};
    size_t nk = em_lang_kernel_count(m), nitems = 0;
    spec_item *items = calloc(nk * 3, sizeof(*items));
    for (size_t t = 0; t < 3; t++) {
        for (size_t i = 0; i < nk; i++) {
            em_scalar ty = types[t];
            em_lang_bind b[] = {
                em_lang_bind_type("F", ty),   em_lang_bind_type("T", ty),
                em_lang_bind_type("U", ty),   em_lang_bind_type("C", EM_F32),
                em_lang_bind_type("M", EM_F32), em_lang_bind_type("I", EM_I32),
                em_lang_bind_int("R", 2),     em_lang_bind_int("K", 1),
                em_lang_bind_int("DIM", 1),   em_lang_bind_int("OP", 0),
                em_lang_bind_int("TILE", 16), em_lang_bind_int("DIST", 0),
                em_lang_bind_int("KIND", 0),  em_lang_bind_int("CUBE", 256),
                em_lang_bind_int("LOG", 8),   em_lang_bind_int("FLIP", 1),
                em_lang_bind_bool("HAS_B", true), em_lang_bind_bool("HAS_W", true),
                em_lang_bind_bool("ADD", true), em_lang_bind_bool("MAX", false),
                em_lang_bind_bool("LOG_SOFTMAX", false), em_lang_bind_bool("RMS", false),
                em_lang_bind_bool("DESC", false), em_lang_bind_bool("UPPER", true)};
            /* every kernel drops the bindings it does not have (specialize_adaptive) */
            items[nitems++] = item(em_lang_kernel_name(m, i), t == 1 ? 4 : 1, sizeof(b) / sizeof(b[0]), b);
        }
    }
    size_t compiled = 0, failed = 0, unspec = 0;
    compile_items(m, items, nitems, false, &compiled, &failed, &unspec);
    /* every built-in kernel must have compiled at least in its f32 binding */
    size_t f32_unspec = 0;
    for (size_t i = 0; i < nk; i++) {
        char why[512];
        em_caps caps = gpu_caps(90);
        em_ir_kernel *k = specialize_adaptive(m, items[i].kernel, items[i].binds, items[i].nbinds,
                                              1, &caps, why, sizeof(why), NULL, 0);
        if (!k) {
            printf("  FAIL %s: no f32 specialization: %s\n", items[i].kernel, why);
            f32_unspec++;
        }
        em_ir_kernel_free(k);
    }
    printf("built-in kernels: %zu kernels, %zu specializations %s for sm_80 and sm_90 "
           "(%zu compiles), %zu failed, %zu bindings not applicable\n",
           nk, compiled / 2, done_verb(), compiled, failed, unspec);
    free(items);
    if (failed || f32_unspec) fail_msg("%zu CUDA compile failures, %zu kernels without an f32 specialization", failed, f32_unspec);
}

static void test_corpus_compiles(void **state)
{
    (void)state;
    SKIP_WITHOUT_NVRTC();
    em_lang_module *m = conf_load_corpus();
    assert_non_null(m);
    spec_item items[96];
    size_t n = 0;
    static const em_scalar floats[] = {EM_F32, EM_F16, EM_BF16, EM_F64};
    static const em_scalar nums[] = {EM_F16, EM_BF16, EM_F32, EM_F64, EM_I32, EM_U32, EM_I64};
    static const em_scalar ints[] = {EM_I32, EM_U32, EM_I64, EM_U64};
    static const unsigned widths[] = {1, 2, 4, 8};
    for (size_t t = 0; t < 4; t++) {
        em_lang_bind f = em_lang_bind_type("F", floats[t]);
        items[n++] = item("ew_lines", widths[t], 1, &f);
        items[n++] = item("math_all", 1, 1, &f);
        em_lang_bind cr[] = {f, em_lang_bind_int("CUBE", 128)};
        items[n++] = item("cube_reduce", 1, 2, cr);
        em_lang_bind ib = em_lang_bind_type("I", ints[t]);
        items[n++] = item("int_ops", 1, 1, &ib);
    }
    for (size_t t = 0; t < 7; t++) {
        em_lang_bind b = em_lang_bind_type("T", nums[t]);
        items[n++] = item("ew_generic", 1, 1, &b);
        if (t < 3) items[n++] = item("select_bool", 1, 1, &b);
    }
    static const em_scalar casts[][2] = {{EM_F32, EM_I32}, {EM_U32, EM_F32}, {EM_F32, EM_F16},
                                         {EM_BF16, EM_F32}, {EM_F64, EM_I64}, {EM_I32, EM_U8}};
    for (size_t k = 0; k < 6; k++) {
        em_lang_bind b[] = {em_lang_bind_type("S", casts[k][0]), em_lang_bind_type("D", casts[k][1])};
        items[n++] = item("cast_pair", 1, 2, b);
    }
    em_lang_bind tile = em_lang_bind_int("TILE", 8), cube = em_lang_bind_int("CUBE", 64);
    items[n++] = item("bitcasts", 1, 0, NULL);
    items[n++] = item("control", 1, 0, NULL);
    items[n++] = item("matmul_tiled", 1, 1, &tile);
    items[n++] = item("plane_ops", 1, 0, NULL);
    items[n++] = item("atomics_int", 1, 1, &cube);
    items[n++] = item("atomics_f32", 1, 0, NULL);
    items[n++] = item("dims3", 1, 0, NULL);
    items[n++] = item("mma16", 1, 0, NULL);
    items[n++] = item("mma_tiled", 1, 0, NULL);
    em_lang_bind p1[] = {em_lang_bind_type("F", EM_F32), em_lang_bind_int("DEGREE", 7),
                         em_lang_bind_bool("SQUARE", true), em_lang_bind_bool("LINE4", true)};
    em_lang_bind p2[] = {em_lang_bind_type("F", EM_F16), em_lang_bind_int("DEGREE", 5)};
    items[n++] = item("poly", 1, 4, p1);
    items[n++] = item("poly", 1, 2, p2);
    /* every corpus kernel is in the list */
    for (size_t i = 0; i < em_lang_kernel_count(m); i++) {
        bool found = false;
        for (size_t j = 0; j < n && !found; j++)
            found = strcmp(items[j].kernel, em_lang_kernel_name(m, i)) == 0;
        if (!found) fail_msg("corpus kernel %s has no specialization in this test", em_lang_kernel_name(m, i));
    }
    size_t compiled = 0, failed = 0, unspec = 0;
    compile_items(m, items, n, true, &compiled, &failed, &unspec);
    printf("corpus kernels: %zu specializations %s for sm_80 and sm_90 (%zu compiles), %zu "
           "failed\n",
           compiled / 2, done_verb(), compiled, failed);
    em_lang_module_free(m);
    if (failed) fail_msg("%zu CUDA compile failures in the corpus", failed);
}

/* The matmul kernels in the configurations src/tensor/matmul_config.c picks on CUDA (tensor-core
 * tiles and plans per dtype, SIMT tiles, split-K partials, every epilogue flag and activation,
 * GELU's backward (ACT 4, 5) included), beyond the
 * defaults that test_builtins_compile covers. */
static void test_matmul_configs_compile(void **state)
{
    (void)state;
    SKIP_WITHOUT_NVRTC();
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    spec_item items[96];
    size_t n = 0;
    static const em_scalar mma_types[] = {EM_F16, EM_BF16, EM_F32};
    static const int warps[][3] = {{4, 2, 32}, {2, 2, 32}, {2, 4, 32}, {4, 4, 32}, {2, 1, 64}, {1, 2, 64}};
    for (size_t t = 0; t < 3; t++) {
        for (size_t w = 0; w < 6; w++) {
            bool raw = w == 1, epi = w == 0;
            em_lang_bind b[] = {em_lang_bind_type("T", mma_types[t]),
                                em_lang_bind_type("O", raw ? EM_F32 : mma_types[t]),
                                em_lang_bind_int("R", w == 2 ? 3 : 2),
                                em_lang_bind_int("WARPS_M", warps[w][0]),
                                em_lang_bind_int("WARPS_N", warps[w][1]),
                                em_lang_bind_int("BK", warps[w][2]),
                                em_lang_bind_int("PLANE", 32),
                                em_lang_bind_bool("RAW", raw),
                                em_lang_bind_bool("BIAS", epi),
                                em_lang_bind_int("ACT", epi ? 3 : 0),
                                em_lang_bind_bool("RES", epi)};
            items[n++] = item("matmul_mma", 1, sizeof(b) / sizeof(b[0]), b);
        }
    }
    /* the plans of mm_mma_plan_of: fragments per plane, stages, transposed tiles, 16-byte
     * asynchronous copies (cp.async) or element-wise reads, per operand */
    static const struct {
        int wm, wn, fm, fn, bk, stages;
        bool at, bt, va, vb, raw, epi;
    } plans[] = {
        {4, 2, 2, 4, 32, 4, false, false, true, true, false, true},
        {2, 2, 4, 4, 32, 3, true, true, true, true, false, false},
        {2, 4, 4, 4, 32, 3, false, false, true, true, true, false},
        {2, 2, 1, 1, 16, 2, true, false, false, true, false, false},
        {4, 2, 2, 2, 48, 3, false, true, true, false, false, true},
    };
    for (size_t t = 0; t < 3; t++) {
        int v = mma_types[t] == EM_F32 ? 4 : 8;
        for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++) {
            em_lang_bind b[] = {
                em_lang_bind_type("T", mma_types[t]),
                em_lang_bind_type("O", plans[i].raw ? EM_F32 : mma_types[t]),
                em_lang_bind_int("R", plans[i].raw ? 3 : 2),
                em_lang_bind_int("WARPS_M", plans[i].wm), em_lang_bind_int("WARPS_N", plans[i].wn),
                em_lang_bind_int("FM", plans[i].fm), em_lang_bind_int("FN", plans[i].fn),
                em_lang_bind_int("BK", plans[i].bk), em_lang_bind_int("STAGES", plans[i].stages),
                em_lang_bind_bool("AT", plans[i].at), em_lang_bind_bool("BT", plans[i].bt),
                em_lang_bind_int("VA", plans[i].va ? v : 1),
                em_lang_bind_int("VB", plans[i].vb ? v : 1), em_lang_bind_int("PLANE", 32),
                em_lang_bind_bool("RAW", plans[i].raw), em_lang_bind_bool("BIAS", plans[i].epi),
                /* GELU's backward (4) in one epilogue, GELU in the other */
                em_lang_bind_int("ACT", plans[i].epi ? (i == 0 ? 4 : 2) : 0),
                em_lang_bind_bool("RES", plans[i].epi)};
            items[n++] = item("matmul_mma", 1, sizeof(b) / sizeof(b[0]), b);
        }
    }
    static const int simt[][5] = {{64, 64, 8, 4, 4}, {128, 128, 8, 8, 8}, {128, 64, 8, 8, 4},
                                  {32, 32, 8, 2, 2}, {64, 64, 16, 4, 4}, {64, 128, 8, 4, 8},
                                  {32, 64, 8, 2, 4}};
    static const em_scalar simt_types[][2] = {{EM_F32, EM_F32}, {EM_F16, EM_F32}, {EM_BF16, EM_F32},
                                              {EM_F64, EM_F64}, {EM_I32, EM_I32}, {EM_I64, EM_I64},
                                              {EM_U8, EM_I32}};
    for (size_t c = 0; c < 7; c++) {
        size_t t = c % 7;
        bool raw = c == 3, epi = c == 0 || c == 2;
        em_lang_bind b[] = {em_lang_bind_type("T", simt_types[t][0]),
                            em_lang_bind_type("C", simt_types[t][1]),
                            em_lang_bind_type("O", raw ? simt_types[t][1] : simt_types[t][0]),
                            em_lang_bind_int("R", c == 1 ? 4 : 2),
                            em_lang_bind_int("BM", simt[c][0]), em_lang_bind_int("BN", simt[c][1]),
                            em_lang_bind_int("BK", simt[c][2]), em_lang_bind_int("TM", simt[c][3]),
                            em_lang_bind_int("TN", simt[c][4]), em_lang_bind_bool("RAW", raw),
                            em_lang_bind_bool("BIAS", epi),
                            em_lang_bind_int("ACT", epi && em_scalar_is_float(simt_types[t][0]) ? 2 : epi),
                            em_lang_bind_bool("RES", epi)};
        items[n++] = item("matmul_simt", 1, sizeof(b) / sizeof(b[0]), b);
    }
    for (size_t t = 0; t < 3; t++) {
        em_lang_bind b[] = {em_lang_bind_type("T", mma_types[t]), em_lang_bind_type("C", EM_F32),
                            em_lang_bind_int("R", 3), em_lang_bind_bool("BIAS", true),
                            /* ReLU, GELU-tanh's backward (5), GELU's (4) */
                            em_lang_bind_int("ACT", t == 0   ? 1
                                                    : t == 1 ? 5
                                                             : 4),
                            em_lang_bind_bool("RES", true)};
        items[n++] = item("matmul_splitk_reduce", 1, sizeof(b) / sizeof(b[0]), b);
    }
    /* the skinny kernel (few rows: decoding) as the H200's defaults make it: row-major b with
     * units side by side along N and a plane's rest along K, transposed b with a plane along K;
     * one row and sixteen, the epilogue and split-K's raw partial sums; lines of 16 bytes; the
     * layer-norm prologue (ln: with its weight and bias) both ways; b's first lines loaded
     * before the dependency wait (pre: settled weights) both ways */
    static const struct {
        int mr, nu, ks, pk, nl, uk;
        bool bt, raw, epi, ln, pre;
    } skinny[] = {
        {1, 2, 16, 6, 1, 4, false, false, true, false, false},
        {16, 2, 16, 4, 1, 4, false, true, false, false, false},
        {1, 1, 32, 2, 2, 2, true, false, false, false, false},
        {16, 1, 32, 2, 1, 2, true, false, true, false, false},
        {1, 2, 16, 6, 1, 4, false, false, true, true, true},
        {4, 1, 32, 2, 2, 2, true, false, false, true, true},
        {1, 1, 32, 2, 2, 2, true, false, false, false, true},
    };
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof(skinny) / sizeof(skinny[0]); i++) {
            em_lang_bind b[] = {em_lang_bind_type("T", mma_types[t]),
                                em_lang_bind_type("C", EM_F32),
                                em_lang_bind_type("O", skinny[i].raw ? EM_F32 : mma_types[t]),
                                em_lang_bind_int("R", skinny[i].raw ? 3 : 2),
                                em_lang_bind_int("MR", skinny[i].mr),
                                em_lang_bind_int("NU", skinny[i].nu),
                                em_lang_bind_int("KS", skinny[i].ks),
                                em_lang_bind_int("PK", skinny[i].pk),
                                em_lang_bind_int("NL", skinny[i].nl),
                                em_lang_bind_int("UK", skinny[i].uk),
                                em_lang_bind_bool("BT", skinny[i].bt),
                                em_lang_bind_bool("RAW", skinny[i].raw),
                                em_lang_bind_bool("BIAS", skinny[i].epi),
                                em_lang_bind_int("ACT", skinny[i].epi ? (i == 0 ? 5 : 2) : 0),
                                em_lang_bind_bool("RES", skinny[i].epi),
                                em_lang_bind_bool("LN", skinny[i].ln),
                                em_lang_bind_bool("LNW", skinny[i].ln),
                                em_lang_bind_bool("LNB", skinny[i].ln),
                                em_lang_bind_bool("PRE", skinny[i].pre)};
            unsigned lw = mma_types[t] == EM_F32 ? 4 : 8;
            items[n++] = item("matmul_skinny", lw, sizeof(b) / sizeof(b[0]), b);
        }
    size_t compiled = 0, failed = 0, unspec = 0;
    compile_items(m, items, n, true, &compiled, &failed, &unspec);
    printf("matmul configurations: %zu specializations %s for sm_80 and sm_90, %zu failed\n",
           compiled / 2, done_verb(), failed);
    if (failed) fail_msg("%zu CUDA compile failures among the matmul configurations", failed);
}

/* The attention kernels (src/kernels/tensor_attention.ek) as src/tensor/ops_attention.c binds
 * them, beyond the defaults (DMAX 64, f32/f16/bf16) that test_builtins_compile covers: the SIMT
 * kernels for GPT's f16/bf16 at DMAX 128, f32 at the largest DMAX (256) and f64, with the tile
 * the host picks for 16 KiB of staged rows; the tensor-core forward and the tiled tensor-core
 * backward (dk/dv and dq passes) for f16 and bf16 at D 64 and 128, the backward with 16-byte
 * copies (V 8, aligned rows) and, for f16 at D 64, element by element (V 1). */
static void test_attention_compile(void **state)
{
    (void)state;
    SKIP_WITHOUT_NVRTC();
    const em_lang_module *m = em_lang_builtins();
    assert_non_null(m);
    spec_item items[48];
    size_t n = 0;
    static const char *const simt[] = {"tensor_attention_fwd", "tensor_attention_bwd_kv",
                                       "tensor_attention_bwd_q"};
    static const struct {
        em_scalar t;
        int dmax;
    } cfg[] = {{EM_F16, 128}, {EM_BF16, 128}, {EM_F32, 256}, {EM_F64, 64}};
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        em_scalar ct = cfg[c].t == EM_F64 ? EM_F64 : EM_F32;
        int tile = 16384 / (2 * cfg[c].dmax * (int)em_scalar_size(cfg[c].t));
        tile = tile > 64 ? 64 : tile < 4 ? 4 : tile;
        for (size_t k = 0; k < 3; k++) {
            em_lang_bind b[] = {
                em_lang_bind_type("T", cfg[c].t), em_lang_bind_type("C", ct),
                em_lang_bind_type("M", ct),       em_lang_bind_int("DMAX", cfg[c].dmax),
                em_lang_bind_int("TILE", tile),   em_lang_bind_int("CUBE", 64)};
            items[n++] = item(simt[k], 1, sizeof(b) / sizeof(b[0]), b);
        }
    }
    em_lang_bind d[] = {em_lang_bind_type("T", EM_F64), em_lang_bind_type("C", EM_F64)};
    items[n++] = item("tensor_attention_delta", 1, 2, d);
    for (int t = 0; t < 2; t++)
        for (int dd = 64; dd <= 128; dd += 64) {
            em_scalar ty = t ? EM_BF16 : EM_F16;
            int nvec = !t && dd == 64 ? 2 : 1; /* V 8; also V 1 for f16 at D 64 */
            for (int vi = 0; vi < nvec; vi++) {
                int vec = vi ? 1 : 8;
                em_lang_bind g[] = {em_lang_bind_type("T", ty),     em_lang_bind_type("S", ty),
                                    em_lang_bind_type("M", EM_F32), em_lang_bind_int("D", dd),
                                    em_lang_bind_int("PLANE", 32), em_lang_bind_int("V", vec)};
                items[n++] = item("tensor_attention_fwd_mma", 1, sizeof(g) / sizeof(g[0]), g);
                items[n++] = item("tensor_attention_bwd_kv_mma", 1, sizeof(g) / sizeof(g[0]), g);
                items[n++] = item("tensor_attention_bwd_q_mma", 1, sizeof(g) / sizeof(g[0]), g);
            }
        }
    /* decoding (ops_attention_decode.c): lines of 16 bytes, groups of KL units, split or not */
    static const struct {
        em_scalar t;
        int d, v, kl;
        bool split;
    } dec[] = {{EM_F32, 64, 4, 16, true}, {EM_F32, 80, 4, 32, false}, {EM_BF16, 128, 8, 16, true}};
    for (size_t c = 0; c < sizeof(dec) / sizeof(dec[0]); c++) {
        em_lang_bind b[] = {em_lang_bind_type("T", dec[c].t),   em_lang_bind_type("C", EM_F32),
                            em_lang_bind_type("M", EM_F32),     em_lang_bind_int("D", dec[c].d),
                            em_lang_bind_int("KL", dec[c].kl),  em_lang_bind_int("UK", 4),
                            em_lang_bind_int("CUBE", 128),      em_lang_bind_bool("SPLIT", dec[c].split)};
        items[n++] = item("tensor_attention_decode", (unsigned)dec[c].v, 8, b);
        items[n++] = item("tensor_attention_decode_combine", 1, 4, b);
        /* em_attention_decode_append: the new keys stored, the splits merged by the last cube;
         * and the same with the first keys and values loaded before the dependency wait */
        em_lang_bind ba[11] = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                               em_lang_bind_bool("APPEND", true),
                               em_lang_bind_bool("LAST", dec[c].split),
                               em_lang_bind_bool("PRE", true)};
        items[n++] = item("tensor_attention_decode", (unsigned)dec[c].v, 10, ba);
        items[n++] = item("tensor_attention_decode", (unsigned)dec[c].v, 11, ba);
    }
    size_t compiled = 0, failed = 0, unspec = 0;
    compile_items(m, items, n, true, &compiled, &failed, &unspec);
    printf("attention kernels: %zu specializations %s for sm_80 and sm_90, %zu failed\n",
           compiled / 2, done_verb(), failed);
    if (failed) fail_msg("%zu CUDA compile failures among the attention kernels", failed);
}

int main(void)
{
    if (codegen_only()) printf("EMBER_CONF_CODEGEN_ONLY=1: sources generated, not compiled\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builtins_compile),
        cmocka_unit_test(test_corpus_compiles),
        cmocka_unit_test(test_matmul_configs_compile),
        cmocka_unit_test(test_attention_compile),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed ? 1 : g_skipped ? 77 : 0;
}
