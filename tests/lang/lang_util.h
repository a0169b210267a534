/* lang_util.h — helpers shared by the kernel-language tests (tests/lang/test_*.c): load a module
 * or fail the test with its diagnostics, buffers on the CPU device, launches, f16 conversion, and
 * a checker for an exact first diagnostic. Header-only (static functions) so that every test is
 * one executable. */
#ifndef EM_TESTS_LANG_UTIL_H
#define EM_TESTS_LANG_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half_ref.h"

#include <cmocka.h>

#include "ember/lang.h"
#include "ember/runtime.h"

static em_device *g_dev; /* the CPU device, opened by dev_setup */

static inline int dev_setup(void **state)
{
    (void)state;
    g_dev = em_device_open("cpu");
    if (!g_dev) fprintf(stderr, "cannot open the cpu device: %s\n", em_last_error());
    return g_dev ? 0 : -1;
}

static inline int dev_teardown(void **state)
{
    (void)state;
    em_device_close(g_dev);
    g_dev = NULL;
    return 0;
}

/* Loads `src` as one module; fails the test (printing the diagnostics) when it has errors. */
static inline em_lang_module *must_load(const char *src)
{
    em_lang_diags *d = em_lang_diags_new();
    em_lang_module *m = em_lang_module_from_string("test.ek", src, d);
    if (!m) {
        char *text = em_lang_diags_format(d);
        fprintf(stderr, "%s", text ? text : em_last_error());
        free(text);
    }
    em_lang_diags_free(d);
    assert_non_null(m);
    return m;
}

/* A device buffer holding `bytes` bytes copied from `data` (zeros when data is NULL). */
static inline em_buffer *buf_new(const void *data, size_t bytes)
{
    em_buffer *b = em_buffer_alloc(g_dev, bytes);
    assert_non_null(b);
    if (data)
        assert_int_equal(em_buffer_write(b, 0, data, bytes), EM_OK);
    else
        assert_int_equal(em_buffer_fill_zero(b), EM_OK);
    return b;
}

static inline void buf_get(em_buffer *b, void *out, size_t bytes)
{
    assert_int_equal(em_device_sync(g_dev), EM_OK);
    assert_int_equal(em_buffer_read(b, 0, out, bytes), EM_OK);
}

/* Launches kernel `name` of m over a grid of `cubes` cubes of `units` units (x only), failing the
 * test with the error on failure. */
static inline void launch_x(const em_lang_module *m, const char *name, const em_lang_spec *spec,
                            uint32_t cubes, uint32_t units, const em_arg *args, size_t nargs)
{
    uint32_t cc[3] = {cubes, 1, 1}, cd[3] = {units, 1, 1};
    em_status st = em_lang_launch(g_dev, m, name, spec, cc, cd, args, nargs);
    if (st != EM_OK) fprintf(stderr, "launch of %s failed: %s\n", name, em_last_error());
    assert_int_equal(st, EM_OK);
}

static inline void launch_3d(const em_lang_module *m, const char *name, const em_lang_spec *spec,
                             const uint32_t cubes[3], const uint32_t units[3], const em_arg *args,
                             size_t nargs)
{
    em_status st = em_lang_launch(g_dev, m, name, spec, cubes, units, args, nargs);
    if (st != EM_OK) fprintf(stderr, "launch of %s failed: %s\n", name, em_last_error());
    assert_int_equal(st, EM_OK);
}

/* Loads `src` and checks it (em_lang_check); true when the first diagnostic is exactly at
 * line:col with `message` (and `hint` when not NULL), else prints what came instead. */
static inline bool check_error_at(const char *src, uint32_t line, uint32_t col, const char *message,
                                  const char *hint)
{
    em_lang_diags *d = em_lang_diags_new();
    em_lang_module *m = em_lang_module_from_string("bad.ek", src, d);
    bool ok = m ? em_lang_check(m, d) == EM_ERR_INVALID : em_last_status() == EM_ERR_INVALID;
    const em_lang_diag *g = em_lang_diags_at(d, 0);
    if (!ok || !g || g->line != line || g->col != col || strcmp(g->message, message) != 0 ||
        (hint && (!g->hint || strcmp(g->hint, hint) != 0)) || !g->file ||
        strcmp(g->file, "bad.ek") != 0) {
        char *text = em_lang_diags_format(d);
        fprintf(stderr, "source:\n%s\nexpected %u:%u: %s%s%s\ngot:\n%s\n", src, line, col, message,
                hint ? " / hint: " : "", hint ? hint : "",
                text && *text ? text : "(no diagnostics)\n");
        free(text);
        ok = false;
    }
    em_lang_module_free(m);
    em_lang_diags_free(d);
    return ok;
}

#endif
