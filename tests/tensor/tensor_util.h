/* tensor_util.h — helpers shared by the tensor conformance tests (tests/tensor/test_*.c): the
 * devices to run on (every backend em_device_open accepts, or only $EMBER_TEST_DEVICE), tensors
 * made from double arrays in any dtype, reading any tensor back as doubles, inputs rounded to
 * the dtype (so that the float64 reference sees exactly what the device sees), and a checker
 * with a normalized-error tolerance per dtype and NaN/Inf agreement. Header-only. */
#ifndef EM_TESTS_TENSOR_UTIL_H
#define EM_TESTS_TENSOR_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ember/tensor.h"
#include "tensor/internal.h"

#define TU_MAX_DEVICES 4
static em_device *tu_devs[TU_MAX_DEVICES]; /* the devices opened for this run */
static int tu_ndev;

static inline int tu_setup(void **state)
{
    (void)state;
    static const char *names[] = {"cpu", "opencl:0", "vulkan:0", "cuda:0"};
    const char *only = getenv("EMBER_TEST_DEVICE");
    tu_ndev = 0;
    for (size_t i = 0; i < 4; i++) {
        if (only && *only && strcmp(only, names[i]) != 0) continue;
        em_device *d = em_device_open(names[i]);
        if (!d) {
            fprintf(stderr, "[tensor] skipping %s: %s\n", names[i], em_last_error());
            continue;
        }
        fprintf(stderr, "[tensor] running on %s\n", names[i]);
        tu_devs[tu_ndev++] = d;
    }
    em_clear_error();
    return tu_ndev ? 0 : -1;
}

static inline int tu_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < tu_ndev; i++) em_device_close(tu_devs[i]);
    tu_ndev = 0;
    return 0;
}

static inline bool tu_is_cpu(em_device *d) { return strcmp(em_device_name(d), "cpu") == 0; }

/* Rounds v as the dtype would store it. */
static inline double tu_round(em_scalar dt, double v)
{
    uint8_t b[8];
    tn_host_set(dt, b, 0, v);
    return tn_host_get(dt, b, 0);
}

/* Deterministic pseudo-random doubles in [lo, hi). */
static inline void tu_fill(double *v, size_t n, double lo, double hi, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v[i] = lo + (hi - lo) * (double)(s % 1000003u) / 1000003.0;
    }
}

/* A tensor of dtype holding v (rounded to the dtype, in place, so v matches what is stored). */
static inline em_tensor *tu_tensor(em_device *dev, em_scalar dt, em_shape shape, double *v)
{
    size_t n = 1;
    for (int i = 0; i < shape.rank; i++) n *= (size_t)shape.d[i];
    uint8_t *host = malloc(n * 8 + 8);
    assert_non_null(host);
    for (size_t i = 0; i < n; i++) {
        tn_host_set(dt, host, i, v[i]);
        v[i] = tn_host_get(dt, host, i);
    }
    em_tensor *t = em_from_host(dev, dt, shape, host);
    free(host);
    if (!t) fprintf(stderr, "from_host: %s\n", em_last_error());
    assert_non_null(t);
    return t;
}

/* All elements of t (row-major) as doubles; the caller frees. Fails the test on error. */
static inline double *tu_read(const em_tensor *t)
{
    if (!t) fprintf(stderr, "tensor is NULL: %s\n", em_last_error());
    assert_non_null(t);
    size_t n = (size_t)em_numel(t);
    uint8_t *host = malloc(n * 8 + 8);
    double *out = malloc(n * sizeof(double) + 8);
    assert_non_null(host);
    assert_non_null(out);
    em_status st = em_to_host(t, host, n * 8 + 8);
    if (st != EM_OK) fprintf(stderr, "to_host: %s\n", em_last_error());
    assert_int_equal(st, EM_OK);
    for (size_t i = 0; i < n; i++) out[i] = tn_host_get(em_dtype(t), host, i);
    free(host);
    return out;
}

static inline double tu_tol(em_scalar dt)
{
    switch (dt) {
    case EM_F16: case EM_BF16: return 1e-2;
    case EM_F32: return 2e-5;
    case EM_F64: return 1e-10;
    default: return 0;
    }
}

/* Compares got against the reference ref (n elements) with tolerance tol on the error normalized
 * by max(1, |ref|); NaN and Inf must agree exactly. Prints the first mismatch. */
static inline bool tu_close_n(const char *what, const double *got, const double *ref, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        bool ok;
        if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g)) ok = g == r;
        else ok = fabs(g - r) <= tol * (fabs(r) > 1 ? fabs(r) : 1);
        if (!ok) {
            fprintf(stderr, "%s: element %zu is %.9g, expected %.9g (tolerance %g)\n", what, i, g, r, tol);
            return false;
        }
    }
    return true;
}

/* Reads t and checks its shape and values against ref. */
static inline void tu_check(const char *what, const em_tensor *t, em_shape shape, const double *ref, double tol)
{
    if (!t) fprintf(stderr, "%s: NULL: %s\n", what, em_last_error());
    assert_non_null(t);
    em_shape s = em_shape_of(t);
    if (s.rank != shape.rank) fprintf(stderr, "%s: rank %d, expected %d\n", what, s.rank, shape.rank);
    assert_int_equal(s.rank, shape.rank);
    for (int i = 0; i < s.rank; i++) assert_int_equal(s.d[i], shape.d[i]);
    double *got = tu_read(t);
    bool ok = tu_close_n(what, got, ref, (size_t)em_numel(t), tol);
    free(got);
    if (!ok) fail_msg("%s on %s", what, em_device_name(em_tensor_device(t)));
}

/* Checks that the last op failed with a message containing `part`. */
static inline void tu_expect_error(const em_tensor *t, const char *part)
{
    if (t || !strstr(em_last_error(), part))
        fprintf(stderr, "expected an error containing \"%s\", got %s \"%s\"\n", part, t ? "a tensor and" : "",
                em_last_error());
    assert_null(t);
    assert_non_null(strstr(em_last_error(), part));
}

/* Whether the device holds tensors of dt (lavapipe has no 16-bit storage, for instance). */
static inline bool tu_has(em_device *dev, em_scalar dt)
{
    const em_caps *c = em_device_caps(dev);
    return c && c->dtype[dt];
}

/* The tolerance for dt on dev: f64 math runs in f32 on Vulkan (GLSL has no f64 exp/log). */
static inline double tu_tol_on(em_device *dev, em_scalar dt)
{
    if (dt == EM_F64 && !strcmp(em_device_caps(dev)->target, "glsl")) return 2e-6;
    return tu_tol(dt);
}

static const em_scalar tu_float_types[] = {EM_F32, EM_F16, EM_BF16, EM_F64};

#endif
