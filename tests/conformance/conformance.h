/* conformance.h — helpers shared by the conformance suite (conformance_main.c, which runs the
 * kernel corpus of tests/conformance/kernels on every backend, and cuda_compile.c, which compiles
 * it through NVRTC): loading the corpus, host-side dtype conversions (f16, bf16, integer widths),
 * device buffers with sentinel guard regions, and result comparison with a normalized-error
 * tolerance per dtype and NaN/Inf agreement. Header-only (static functions): each test program
 * includes it once. */
#ifndef EM_TESTS_CONFORMANCE_H
#define EM_TESTS_CONFORMANCE_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half_ref.h"

#include "ember/lang.h"
#include "ember/runtime.h"

#ifndef CONF_KERNEL_DIR
#define CONF_KERNEL_DIR EMBER_SOURCE_DIR "/tests/conformance/kernels"
#endif

/* The corpus files, in load order (one module, one namespace). */
static const char *const CONF_FILES[] = {"elementwise.ek", "math.ek",  "intbits.ek", "control.ek",
                                         "shared.ek",      "plane.ek", "atomics.ek", "dims.ek",
                                         "comptime.ek",    "matrix.ek"};
#define CONF_NFILES (sizeof(CONF_FILES) / sizeof(CONF_FILES[0]))

static inline char *conf_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* Loads every corpus file into one module; NULL (diagnostics printed) on failure. */
static inline em_lang_module *conf_load_corpus(void)
{
    char *src[CONF_NFILES];
    const char *names[CONF_NFILES];
    em_lang_module *m = NULL;
    size_t n = 0;
    for (; n < CONF_NFILES; n++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", CONF_KERNEL_DIR, CONF_FILES[n]);
        src[n] = conf_read_file(path);
        names[n] = CONF_FILES[n];
        if (!src[n]) {
            fprintf(stderr, "conformance: cannot read %s\n", path);
            goto done;
        }
    }
    em_lang_diags *d = em_lang_diags_new();
    m = em_lang_module_from_strings(names, (const char *const *)src, n, d);
    if (!m) {
        char *t = em_lang_diags_format(d);
        fprintf(stderr, "conformance: the corpus does not load:\n%s\n", t ? t : em_last_error());
        free(t);
    }
    em_lang_diags_free(d);
done:
    for (size_t i = 0; i < n; i++) free(src[i]);
    return m;
}

/* ---- dtype conversions ------------------------------------------------------------------- */

static inline uint16_t conf_f16_from(double d) { return f16_from_float((float)d); }
static inline double conf_f16_to(uint16_t h) { return f16_to_float(h); }

static inline uint16_t conf_bf16_from(double d)
{
    float f = (float)d;
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);                                           /* to nearest even */
    return (uint16_t)(x >> 16);
}

static inline double conf_bf16_to(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* `v` rounded to float dtype `t` (as a device holding it in memory would see it). */
static inline double conf_round(em_scalar t, double v)
{
    switch (t) {
    case EM_F16: return conf_f16_to(conf_f16_from(v));
    case EM_BF16: return conf_bf16_to(conf_bf16_from(v));
    case EM_F32: return (float)v;
    default: return v;
    }
}

/* Normalizes an integer to dtype t: keeps the low bits, sign-extends signed kinds. */
static inline int64_t conf_int_norm(em_scalar t, int64_t v)
{
    unsigned bits = (unsigned)em_scalar_size(t) * 8;
    if (bits >= 64) return v;
    uint64_t m = ((uint64_t)1 << bits) - 1, u = (uint64_t)v & m;
    if (em_scalar_is_signed(t) && (u >> (bits - 1))) u |= ~m;
    return (int64_t)u;
}

/* Writes n values of dtype t into dst: floats from f (rounded), integers from i (low bytes). */
static inline void conf_pack(em_scalar t, const double *f, const int64_t *iv, size_t n, void *dst)
{
    unsigned char *o = dst;
    size_t es = em_scalar_size(t);
    for (size_t k = 0; k < n; k++, o += es) {
        if (t == EM_F16) {
            uint16_t h = conf_f16_from(f[k]);
            memcpy(o, &h, 2);
        } else if (t == EM_BF16) {
            uint16_t h = conf_bf16_from(f[k]);
            memcpy(o, &h, 2);
        } else if (t == EM_F32) {
            float x = (float)f[k];
            memcpy(o, &x, 4);
        } else if (t == EM_F64) {
            memcpy(o, &f[k], 8);
        } else {
            uint64_t u = (uint64_t)iv[k]; /* little-endian: the low bytes come first */
            memcpy(o, &u, es);
        }
    }
}

/* Reads n values of dtype t from src into f (floats, and integers as doubles) and iv (integers,
 * normalized; may be NULL). */
static inline void conf_unpack(em_scalar t, const void *src, size_t n, double *f, int64_t *iv)
{
    const unsigned char *s = src;
    size_t es = em_scalar_size(t);
    for (size_t k = 0; k < n; k++, s += es) {
        double d = 0;
        int64_t i = 0;
        if (t == EM_F16 || t == EM_BF16) {
            uint16_t h;
            memcpy(&h, s, 2);
            d = t == EM_F16 ? conf_f16_to(h) : conf_bf16_to(h);
        } else if (t == EM_F32) {
            float x;
            memcpy(&x, s, 4);
            d = x;
        } else if (t == EM_F64) {
            memcpy(&d, s, 8);
        } else {
            uint64_t u = 0;
            memcpy(&u, s, es);
            i = conf_int_norm(t, (int64_t)u);
            d = em_scalar_is_signed(t) ? (double)i : (double)(uint64_t)i;
        }
        if (f) f[k] = d;
        if (iv) iv[k] = i;
    }
}

/* The normalized-error tolerance of results computed in dtype t. */
static inline double conf_tol(em_scalar t)
{
    switch (t) {
    case EM_F16: return 4e-3;
    case EM_BF16: return 3e-2;
    case EM_F32: return 2e-5;
    case EM_F64: return 1e-11;
    default: return 0;
    }
}

/* ---- a test run's context and results ------------------------------------------------------ */

typedef enum conf_result {
    CONF_PASS = 0, /* ran natively and matched */
    CONF_EMUL,     /* matched, but the device lacks the feature natively (emulated / lowered) */
    CONF_UNSUP,    /* the device lacks the feature (caps), or the compiler said EM_ERR_UNSUPPORTED */
    CONF_FAIL,     /* wrong results, out-of-bounds writes, or an unexpected error */
    CONF_NOTRUN,   /* no such device */
} conf_result;

static const char *const CONF_RESULT_NAME[] = {"pass", "emulated", "unsupported", "FAIL", "-"};

typedef struct conf_ctx {
    em_device *dev;          /* the device under test */
    const em_caps *caps;     /* its capabilities */
    const em_lang_module *m; /* the corpus */
    bool emulated;           /* a case sets it when it relies on a feature caps says is missing */
    char why[2048];          /* the first problem (FAIL) or the reason (UNSUPPORTED) */
} conf_ctx;

/* Records the first problem of a case (later ones are dropped); returns CONF_FAIL. */
static inline conf_result conf_fail(conf_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline conf_result conf_fail(conf_ctx *c, const char *fmt, ...)
{
    if (!c->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->why, sizeof(c->why), fmt, ap);
        va_end(ap);
    }
    return CONF_FAIL;
}

static inline conf_result conf_unsup(conf_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline conf_result conf_unsup(conf_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof(c->why), fmt, ap);
    va_end(ap);
    return CONF_UNSUP;
}

/* ---- buffers with guards ---------------------------------------------------------------------- */

#define CONF_GUARD 256      /* bytes of sentinel after every output */
#define CONF_SENTINEL 0xA5u /* the byte pattern of guards and of unwritten outputs */

typedef struct conf_buf {
    em_buffer *b; /* the device buffer: bytes + CONF_GUARD */
    size_t bytes; /* the payload */
} conf_buf;

/* A buffer of `bytes` payload bytes (+ guard): copied from data, or all sentinel when NULL. */
static inline conf_buf conf_buf_new(conf_ctx *c, const void *data, size_t bytes)
{
    conf_buf r = {em_buffer_alloc(c->dev, bytes + CONF_GUARD), bytes};
    if (!r.b) return r;
    unsigned char *tmp = malloc(bytes + CONF_GUARD);
    memset(tmp, (int)CONF_SENTINEL, bytes + CONF_GUARD);
    if (data) memcpy(tmp, data, bytes);
    if (em_buffer_write(r.b, 0, tmp, bytes + CONF_GUARD) != EM_OK) {
        em_buffer_free(r.b);
        r.b = NULL;
    }
    free(tmp);
    return r;
}

/* Reads the payload into dst and checks the guard; false (problem recorded) on any failure. */
static inline bool conf_buf_read(conf_ctx *c, const conf_buf *b, void *dst, const char *what)
{
    unsigned char *tmp = malloc(b->bytes + CONF_GUARD);
    bool ok = em_device_sync(c->dev) == EM_OK &&
              em_buffer_read(b->b, 0, tmp, b->bytes + CONF_GUARD) == EM_OK;
    if (!ok) {
        conf_fail(c, "reading %s: %s", what, em_last_error());
    } else {
        for (size_t k = 0; k < CONF_GUARD; k++) {
            if (tmp[b->bytes + k] != CONF_SENTINEL) {
                conf_fail(c, "%s: out-of-bounds write %zu bytes past the end (byte 0x%02x)", what,
                          k, tmp[b->bytes + k]);
                ok = false;
                break;
            }
        }
        memcpy(dst, tmp, b->bytes);
    }
    free(tmp);
    return ok;
}

static inline void conf_buf_free(conf_buf *b)
{
    em_buffer_free(b->b);
    b->b = NULL;
}

static inline em_arg conf_arg(const conf_buf *b, uint64_t len) { return em_arg_buffer(b->b, len); }

/* ---- launching and comparing ------------------------------------------------------------------ */

/* Launches `kernel` of the corpus; on failure records the error: UNSUPPORTED when the compiler or
 * driver said EM_ERR_UNSUPPORTED, else FAIL. Returns CONF_PASS when it launched. */
static inline conf_result conf_launch(conf_ctx *c, const char *kernel, const em_lang_bind *binds,
                               size_t nbinds, unsigned line_width, const uint32_t cubes[3],
                               const uint32_t dims[3], const em_arg *args, size_t nargs)
{
    em_lang_spec spec = {binds, nbinds, line_width, NULL};
    em_status st = em_lang_launch(c->dev, c->m, kernel, &spec, cubes, dims, args, nargs);
    if (st == EM_OK) return CONF_PASS;
    if (st == EM_ERR_UNSUPPORTED) return conf_unsup(c, "%s: %s", kernel, em_last_error());
    return conf_fail(c, "%s: launch failed (%s): %s", kernel, em_status_name(st), em_last_error());
}

/* Compares floats: NaN must meet NaN, an infinity the same infinity, and otherwise
 * |got - ref| <= tol * max(scale, |ref|) (scale: the magnitude errors are relative to).
 * skip (may be NULL) marks entries not checked. */
static inline bool conf_cmp_f(conf_ctx *c, const char *what, const double *got, const double *ref,
                       const bool *skip, size_t n, double tol, double scale)
{
    for (size_t k = 0; k < n; k++) {
        if (skip && skip[k]) continue;
        double g = got[k], r = ref[k];
        bool ok;
        if (isnan(r) || isnan(g))
            ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g))
            ok = g == r;
        else
            ok = fabs(g - r) <= tol * fmax(scale, fabs(r));
        if (!ok) {
            conf_fail(c, "%s[%zu]: got %.9g, expected %.9g (tolerance %.1e)", what, k, g, r, tol);
            return false;
        }
    }
    return true;
}

static inline bool conf_cmp_i(conf_ctx *c, const char *what, const int64_t *got, const int64_t *ref,
                       size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (got[k] != ref[k]) {
            conf_fail(c, "%s[%zu]: got %lld (0x%llx), expected %lld (0x%llx)", what, k,
                      (long long)got[k], (unsigned long long)got[k], (long long)ref[k],
                      (unsigned long long)ref[k]);
            return false;
        }
    }
    return true;
}

static inline bool conf_cmp_u32(conf_ctx *c, const char *what, const uint32_t *got, const uint32_t *ref,
                         size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (got[k] != ref[k]) {
            conf_fail(c, "%s[%zu]: got %u (0x%x), expected %u (0x%x)", what, k, got[k], got[k],
                      ref[k], ref[k]);
            return false;
        }
    }
    return true;
}

/* A small deterministic generator (splitmix64) for inputs. */
static inline uint64_t conf_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline double conf_uniform(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * (double)(conf_rand(s) >> 11) / 9007199254740992.0;
}

#endif
