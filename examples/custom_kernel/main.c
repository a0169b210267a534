/* examples/custom_kernel/main.c — a kernel of your own, on every device.
 *
 * Loads the exact GELU from gelu.ek (next to this file), chooses its element type F and its line
 * width at launch, runs it on every device this machine has (or the one named with --device),
 * and checks each result against the C reference below. --dump prints the code ember generates
 * for each target instead. Uses only the public headers; walked through in docs/tutorial.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/lang.h"
#include "ember/runtime.h"

#ifndef GELU_EK_PATH /* set by examples/CMakeLists.txt to the source tree's gelu.ek */
#define GELU_EK_PATH "gelu.ek"
#endif

typedef struct options {
    const char *device;  /* NULL: every device present */
    const char *kernel;  /* path of gelu.ek */
    em_scalar dtype;     /* what F is bound to: EM_F32 or EM_F64 */
    size_t n;            /* elements */
    bool dump;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: custom_kernel [--device NAME] [--dtype f32|f64] [--n N] [--kernel FILE] [--dump]\n"
               "  Runs the exact GELU of gelu.ek on every device present (or on NAME: cpu, cuda:0,\n"
               "  opencl:0, vulkan:0) and checks it against a C reference; exits 1 if any device\n"
               "  is wrong. --dump prints the code generated for each target instead.\n"
               "  Defaults: --dtype f32 --n 4096 --kernel %s\n", GELU_EK_PATH);
}

/* Returns 0 and fills *o, or prints why not and returns 2 (1 for --help, which is not an error). */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){NULL, GELU_EK_PATH, EM_F32, 4096, false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 1; }
        else if (!strcmp(a, "--dump")) o->dump = true;
        else if (!strcmp(a, "--device") && v) { o->device = v; i++; }
        else if (!strcmp(a, "--kernel") && v) { o->kernel = v; i++; }
        else if (!strcmp(a, "--n") && v) { o->n = strtoul(v, NULL, 10); i++; }
        else if (!strcmp(a, "--dtype") && v) { o->dtype = em_scalar_parse(v); i++; }
        else { fprintf(stderr, "custom_kernel: bad argument '%s'\n", a); usage(stderr); return 2; }
    }
    if (o->dtype != EM_F32 && o->dtype != EM_F64) {
        fprintf(stderr, "custom_kernel: --dtype takes f32 or f64\n");
        return 2;
    }
    if (o->n == 0 || o->n > (1u << 28)) {
        fprintf(stderr, "custom_kernel: --n takes 1 to 2^28 elements\n");
        return 2;
    }
    return 0;
}

/* The reference: the same formula in C, in double precision. */
static double gelu_ref(double x) { return x * (1.0 + erf(x / sqrt(2.0))) / 2.0; }

/* The input, rounded to F, and read back as double: host arrays hold F's own bytes. */
static void set_elem(void *a, em_scalar t, size_t i, double v)
{
    if (t == EM_F32) ((float *)a)[i] = (float)v;
    else ((double *)a)[i] = v;
}
static double get_elem(const void *a, em_scalar t, size_t i)
{
    return t == EM_F32 ? ((const float *)a)[i] : ((const double *)a)[i];
}

/* --dump: specializes gelu for F and the line width with no device (the portable path), and
 * prints the IR every target starts from, then each target's code. */
static int dump(const em_lang_module *m, const em_lang_spec *spec)
{
    em_ir_kernel *ir = em_lang_specialize(m, "gelu", spec, NULL);
    if (!ir) { fprintf(stderr, "%s\n", em_last_error()); return 1; }
    char *text = em_ir_print_kernel(ir);
    printf("==== IR (F = %s, line width %u) ====\n%s\n", em_scalar_name(spec->binds[0].type),
           spec->line_width, text ? text : "");
    free(text);
    static const char *const targets[] = {"c", "cuda", "opencl", "glsl"};
    for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
        char *src = em_kernel_source(ir, targets[t]);
        if (src) printf("==== target %s ====\n%s\n", targets[t], src);
        else printf("==== target %s: the generator refuses: %s ====\n\n", targets[t], em_last_error());
        free(src);
    }
    em_ir_kernel_free(ir);
    return 0;
}

/* Runs gelu on one device and prints one row of the table. Returns true when the result is
 * right (or the device lacks F and is skipped), false on an error or a wrong result. */
static bool run_on(const char *name, const em_lang_module *m, const em_lang_spec *spec,
                   const void *in, const double *want, size_t n)
{
    em_scalar t = spec->binds[0].type;
    size_t bytes = n * em_scalar_size(t), lines = n / spec->line_width;
    printf("%-10s ", name);
    em_device *dev = em_device_open(name);
    if (!dev) { printf("cannot open: %s\n", em_last_error()); return false; }
    const em_caps *caps = em_device_caps(dev);
    if (!caps->dtype[t]) {
        printf("%-7s skipped: no %s on this device\n", caps->target, em_scalar_name(t));
        em_device_close(dev);
        return true;
    }

    /* Device buffers, the input copied in. */
    em_buffer *x = em_buffer_alloc(dev, bytes), *y = em_buffer_alloc(dev, bytes);
    void *got = malloc(bytes);
    bool ok = x && y && got && em_buffer_write(x, 0, in, bytes) == EM_OK;

    /* One unit per line, 256 units per cube (fewer if the device allows fewer). The buffers are
     * passed as `lines` elements of line(F), matching the kernel's tensor(line(F)) parameters. */
    uint32_t units = caps->max_cube_units < 256 ? caps->max_cube_units : 256;
    uint32_t cube_count[3] = {(uint32_t)((lines + units - 1) / units), 1, 1};
    uint32_t cube_dim[3] = {units, 1, 1};
    em_arg args[2] = {em_arg_buffer(x, lines), em_arg_buffer(y, lines)};
    ok = ok && em_lang_launch(dev, m, "gelu", spec, cube_count, cube_dim, args, 2) == EM_OK;
    ok = ok && em_device_sync(dev) == EM_OK && em_buffer_read(y, 0, got, bytes) == EM_OK;

    if (ok) {
        /* |gelu(x)| <= 5 here, so a few rounding steps of f32 (2^-24 relative) stay far below
         * 1e-5, even with a target's own erf approximation; f64 gets 1e-12. */
        double max_err = 0, tol = t == EM_F32 ? 1e-5 : 1e-12;
        for (size_t i = 0; i < n; i++) {
            double err = fabs(get_elem(got, t, i) - want[i]);
            if (isnan(err) || err > max_err) max_err = err; /* a NaN stays, and fails */
        }
        ok = max_err <= tol;
        printf("%-7s max error %.2e  %s\n", caps->target, max_err, ok ? "ok" : "WRONG");
    } else if (em_last_status() == EM_ERR_UNSUPPORTED) {
        /* Not a wrong result: this target's generator cannot express the kernel for this F
         * (it names the instruction). Reported, not counted as a failure. */
        printf("%-7s skipped: %s\n", caps->target, em_last_error());
        ok = true;
    } else {
        printf("%-7s failed: %s\n", caps->target, em_last_error());
    }
    free(got);
    em_buffer_free(x);
    em_buffer_free(y);
    em_device_close(dev);
    return ok;
}

/* Runs gelu on the named device, or on every device of every backend present. The input is
 * spread over [-5, 5] and rounded to F; the expected output is computed once, on the host.
 * Returns true when every device got it right. */
static bool run_everywhere(const em_lang_module *m, const em_lang_spec *spec, const options *o)
{
    void *in = malloc(o->n * em_scalar_size(o->dtype));
    double *want = malloc(o->n * sizeof(double));
    bool all_ok = in && want;
    if (!all_ok) fprintf(stderr, "custom_kernel: out of memory\n");
    for (size_t i = 0; all_ok && i < o->n; i++) {
        set_elem(in, o->dtype, i, -5.0 + 10.0 * (double)i / (double)(o->n > 1 ? o->n - 1 : 1));
        want[i] = gelu_ref(get_elem(in, o->dtype, i));
    }
    if (all_ok) {
        printf("%s: gelu, F = %s, line width %u, %zu elements\n", o->kernel,
               em_scalar_name(o->dtype), spec->line_width, o->n);
        if (o->device) {
            all_ok = run_on(o->device, m, spec, in, want, o->n);
        } else {
            em_backend_info backends[16];
            size_t nb = em_backend_list(backends, 16);
            for (size_t b = 0; b < nb && b < 16; b++) {
                if (backends[b].device_count == 0)
                    printf("%-10s unavailable: %s\n", backends[b].name, backends[b].why);
                for (int d = 0; d < backends[b].device_count; d++) {
                    char name[64]; /* "cpu", else "BACKEND:INDEX" */
                    if (!strcmp(backends[b].name, "cpu")) snprintf(name, sizeof name, "cpu");
                    else snprintf(name, sizeof name, "%s:%d", backends[b].name, d);
                    all_ok = run_on(name, m, spec, in, want, o->n) && all_ok;
                }
            }
        }
    }
    free(in);
    free(want);
    return all_ok;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;

    /* 1. Load the kernel source. Errors come back as diagnostics: file:line:col, the line, a
     *    caret, and a hint when there is one. */
    em_lang_diags *diags = em_lang_diags_new();
    em_lang_module *m = diags ? em_lang_module_from_file(o.kernel, diags) : NULL;
    if (!m) {
        char *text = diags ? em_lang_diags_format(diags) : NULL;
        if (text && *text) fputs(text, stderr); /* each diagnostic ends with a newline */
        else fprintf(stderr, "%s\n", em_last_error());
        free(text);
        em_lang_diags_free(diags);
        return 1;
    }

    /* 2. Bind the kernel's generic F, and choose the line width: the widest of 8, 4, 2, 1 lanes
     *    that divides the data (one-dimensional and contiguous here). */
    int64_t shape[1] = {(int64_t)o.n}, stride[1] = {1};
    static const unsigned widths[] = {8, 4, 2, 1};
    em_lang_bind binds[1] = {em_lang_bind_type("F", o.dtype)};
    em_lang_spec spec = {binds, 1, em_pick_line_width(1, shape, stride, 0, widths, 4), NULL};

    /* 3. Print the generated code, or compile, launch and check on every device. */
    rc = o.dump ? dump(m, &spec) : run_everywhere(m, &spec, &o) ? 0 : 1;

    em_lang_module_free(m);
    em_lang_diags_free(diags);
    return rc;
}
