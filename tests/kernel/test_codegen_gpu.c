/* test_codegen_gpu.c — the GPU code generators (CUDA, OpenCL, GLSL; src/kernel/codegen/spmd.c and
 * its dialects): kernels built with the IR builder that cover every op class are generated for
 * each target and compiled by the real compilers found on this machine (NVRTC for CUDA, clang's
 * OpenCL front end and PoCL for OpenCL, glslangValidator + spirv-val for GLSL); missing compilers
 * are skipped and reported. Key strings of each target are checked, and so are the rejections
 * (named instruction and target) and the parameter ABI. Random kernels that the verifier accepts
 * must either generate code that compiles or be rejected with a message — never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ember/kernel.h"
#include "kernel/codegen/codegen.h"

#ifndef EMBER_TEST_TMP
#define EMBER_TEST_TMP "/tmp"
#endif

/* ---- compilers ------------------------------------------------------------------------------- */

enum { MISSING = -1, FAILED = 0, PASSED = 1 };

static const char *tmp_dir(void)
{
    static char dir[512];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/codegen_gpu", EMBER_TEST_TMP);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        if (system(cmd) != 0) snprintf(dir, sizeof dir, "/tmp");
    }
    return dir;
}

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fputs(text, f);
    return fclose(f) == 0;
}

static bool have_tool(const char *tool)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
    return system(cmd) == 0;
}

/* Runs a shell command; on failure prints its output (in `log`) with the source's name. */
static bool run_tool(const char *cmd, const char *log, const char *what)
{
    if (system(cmd) == 0) return true;
    print_message("%s failed:\n", what);
    char show[1024];
    snprintf(show, sizeof show, "head -c 6000 '%s' >&2", log);
    if (system(show) != 0) print_message("(no log)\n");
    return false;
}

/* NVRTC through dlopen, as the CUDA driver loads it. */
typedef int (*nvrtc_create_fn)(void **, const char *, const char *, int, const char *const *,
                               const char *const *);
typedef int (*nvrtc_compile_fn)(void *, int, const char *const *);
typedef int (*nvrtc_logsize_fn)(void *, size_t *);
typedef int (*nvrtc_log_fn)(void *, char *);
typedef int (*nvrtc_destroy_fn)(void **);

static void *nvrtc_lib(void)
{
    static void *lib;
    static bool tried;
    if (tried) return lib;
    tried = true;
    static const char *const names[] = {"/usr/local/cuda/lib64/libnvrtc.so",
                                        "/usr/local/cuda/lib64/libnvrtc.so.13",
                                        "/usr/local/cuda/lib64/libnvrtc.so.12", "libnvrtc.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    return lib;
}

static int compile_cuda(const char *src, const char *name)
{
    void *lib = nvrtc_lib();
    if (!lib) return MISSING;
    nvrtc_create_fn create = (nvrtc_create_fn)dlsym(lib, "nvrtcCreateProgram");
    nvrtc_compile_fn compile = (nvrtc_compile_fn)dlsym(lib, "nvrtcCompileProgram");
    nvrtc_logsize_fn logsize = (nvrtc_logsize_fn)dlsym(lib, "nvrtcGetProgramLogSize");
    nvrtc_log_fn getlog = (nvrtc_log_fn)dlsym(lib, "nvrtcGetProgramLog");
    nvrtc_destroy_fn destroy = (nvrtc_destroy_fn)dlsym(lib, "nvrtcDestroyProgram");
    if (!create || !compile || !logsize || !getlog || !destroy) return MISSING;
    void *prog = NULL;
    if (create(&prog, src, name, 0, NULL, NULL) != 0) return FAILED;
    const char *opts[4] = {"--gpu-architecture=sm_90", "-default-device"};
    int nopts = 2;
    struct stat st;
    if (stat("/usr/local/cuda/include/mma.h", &st) == 0)
        opts[nopts++] = "-I/usr/local/cuda/include";
    int rc = compile(prog, nopts, opts);
    size_t n = 0;
    logsize(prog, &n);
    char *log = calloc(n + 1, 1);
    if (log) getlog(prog, log);
    if (rc != 0) {
        print_message(
            "NVRTC failed on %s (NVRTC_SUCCESS expected, got %d):\n%s\n--- source ---\n%s\n", name,
            rc, log ? log : "", src);
    }
    free(log);
    destroy(&prog);
    return rc == 0 ? PASSED : FAILED;
}

/* clang's OpenCL front end; extra: more flags (e.g. extension macros). */
static int compile_opencl_clang(const char *src, const char *std, const char *extra,
                                const char *name)
{
    if (!have_tool("clang")) return MISSING;
    char path[600], log[600], cmd[2048];
    snprintf(path, sizeof path, "%s/%s.cl", tmp_dir(), name);
    snprintf(log, sizeof log, "%s/%s.cl.log", tmp_dir(), name);
    if (!write_file(path, src)) return FAILED;
    snprintf(
        cmd, sizeof cmd,
        "clang -x cl -cl-std=%s -fsyntax-only -Xclang -finclude-default-header %s '%s' >'%s' 2>&1",
        std, extra ? extra : "", path, log);
    char what[700];
    snprintf(what, sizeof what, "clang -cl-std=%s on %s", std, path);
    return run_tool(cmd, log, what) ? PASSED : FAILED;
}

/* PoCL (or any OpenCL platform) through libOpenCL, as the OpenCL driver loads it. */
typedef int (*cl_platforms_fn)(unsigned, void **, unsigned *);
typedef int (*cl_devices_fn)(void *, uint64_t, unsigned, void **, unsigned *);
typedef void *(*cl_context_fn)(const intptr_t *, unsigned, void *const *, void *, void *, int *);
typedef void *(*cl_program_fn)(void *, unsigned, const char **, const size_t *, int *);
typedef int (*cl_build_fn)(void *, unsigned, void *const *, const char *, void *, void *);
typedef int (*cl_buildinfo_fn)(void *, void *, unsigned, size_t, void *, size_t *);
typedef int (*cl_release_fn)(void *);

static int compile_opencl_driver(const char *src, const char *name)
{
    static void *lib;
    static bool tried;
    if (!tried) {
        tried = true;
        lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    }
    if (!lib) return MISSING;
    cl_platforms_fn platforms = (cl_platforms_fn)dlsym(lib, "clGetPlatformIDs");
    cl_devices_fn devices = (cl_devices_fn)dlsym(lib, "clGetDeviceIDs");
    cl_context_fn context = (cl_context_fn)dlsym(lib, "clCreateContext");
    cl_program_fn program = (cl_program_fn)dlsym(lib, "clCreateProgramWithSource");
    cl_build_fn build = (cl_build_fn)dlsym(lib, "clBuildProgram");
    cl_buildinfo_fn info = (cl_buildinfo_fn)dlsym(lib, "clGetProgramBuildInfo");
    cl_release_fn release_prog = (cl_release_fn)dlsym(lib, "clReleaseProgram");
    cl_release_fn release_ctx = (cl_release_fn)dlsym(lib, "clReleaseContext");
    if (!platforms || !devices || !context || !program || !build || !info || !release_prog ||
        !release_ctx)
        return MISSING;
    void *platform = NULL, *device = NULL;
    unsigned n = 0;
    if (platforms(1, &platform, &n) != 0 || !n) return MISSING;
    if (devices(platform, 0xFFFFFFFFull /* CL_DEVICE_TYPE_ALL */, 1, &device, &n) != 0 || !n)
        return MISSING;
    int err = 0;
    void *ctx = context(NULL, 1, &device, NULL, NULL, &err);
    if (!ctx) return MISSING;
    void *prog = program(ctx, 1, &src, NULL, &err);
    int rc = prog ? build(prog, 1, &device, "-cl-std=CL1.2", NULL, NULL) : -1;
    if (rc != 0) {
        char *log = calloc(1 << 16, 1);
        if (log && prog)
            info(prog, device, 0x1183 /* CL_PROGRAM_BUILD_LOG */, (1 << 16) - 1, log, NULL);
        print_message("OpenCL driver build of %s failed (%d):\n%s\n", name, rc, log ? log : "");
        free(log);
    }
    if (prog) release_prog(prog);
    release_ctx(ctx);
    return rc == 0 ? PASSED : FAILED;
}

/* Every shader of a GLSL batch through glslangValidator (Vulkan 1.2) and spirv-val. */
static int compile_glsl(const char *src, const char *name)
{
    if (!have_tool("glslangValidator")) return MISSING;
    bool val = have_tool("spirv-val");
    const char *sep = "//@@ember-kernel ";
    const char *p = strstr(src, sep);
    int result = p == src ? PASSED : FAILED;
    if (result == FAILED) print_message("GLSL batch does not start with the separator line\n");
    for (int i = 0; p && result == PASSED; i++) {
        const char *next = strstr(p + 1, sep);
        size_t len = next ? (size_t)(next - p) : strlen(p);
        char *piece = malloc(len + 1);
        memcpy(piece, p, len);
        piece[len] = 0;
        char path[600], spv[600], log[600], cmd[2400];
        snprintf(path, sizeof path, "%s/%s_%d.comp", tmp_dir(), name, i);
        snprintf(spv, sizeof spv, "%s/%s_%d.spv", tmp_dir(), name, i);
        snprintf(log, sizeof log, "%s/%s_%d.log", tmp_dir(), name, i);
        write_file(path, piece);
        free(piece);
        snprintf(cmd, sizeof cmd,
                 "glslangValidator -V --target-env vulkan1.2 -o '%s' '%s' >'%s' 2>&1", spv, path,
                 log);
        if (!run_tool(cmd, log, path)) result = FAILED;
        if (result == PASSED && val) {
            snprintf(cmd, sizeof cmd, "spirv-val --target-env vulkan1.2 '%s' >'%s' 2>&1", spv, log);
            if (!run_tool(cmd, log, spv)) result = FAILED;
        }
        p = next;
    }
    return result;
}

/* Asserts a compile result, or skips (saying so) when the compiler is missing. */
static void expect_compiled(int r, const char *compiler)
{
    if (r == MISSING) {
        print_message("%s not found on this machine: skipping this compile check\n", compiler);
        skip();
    }
    assert_int_equal(r, PASSED);
}

/* ---- preparing kernels ------------------------------------------------------------------------
 */

/* Verifies and simplifies a clone, as callers of the generators do; frees k. */
static em_ir_kernel *prepare(em_ir_kernel *k)
{
    assert_non_null(k);
    if (em_ir_verify(k, 0) != EM_OK) print_message("verify: %s\n", em_last_error());
    assert_int_equal(em_ir_verify(k, 0), EM_OK);
    em_ir_kernel *c = em_ir_kernel_clone(k);
    assert_non_null(c);
    assert_int_equal(em_ir_simplify(c), EM_OK);
    assert_int_equal(em_ir_verify(c, 0), EM_OK);
    em_ir_kernel_free(k);
    return c;
}

static void free_all(em_ir_kernel **ks, size_t n)
{
    for (size_t i = 0; i < n; i++) em_ir_kernel_free(ks[i]);
}

static void expect_has(const char *src, const char *needle)
{
    if (!strstr(src, needle)) print_message("expected `%s` in the generated source\n", needle);
    assert_non_null(strstr(src, needle));
}

static em_caps caps_for(const char *target, bool plane_ops, uint32_t plane_dim)
{
    em_caps c;
    memset(&c, 0, sizeof c);
    snprintf(c.target, sizeof c.target, "%s", target);
    snprintf(c.arch, sizeof c.arch, "%s", strcmp(target, "cuda") ? "test" : "sm_90");
    c.plane_dim = plane_dim;
    c.plane_ops = plane_ops;
    c.max_cube_units = 1024;
    c.max_shared = 48 * 1024;
    for (int s = 0; s < EM_SCALAR_COUNT; s++) c.dtype[s] = true;
    c.matrix = !strcmp(target, "cuda");
    c.print = true;
    return c;
}

/* ---- kernels covering every op class ----------------------------------------------------------
 */

static em_ir_val f32c(em_ir_kernel *k, double v)
{
    return em_ir_const_float(k, em_ty(EM_F32), v);
}
static em_ir_val u32c(em_ir_kernel *k, uint32_t v)
{
    return em_ir_u32(k, v);
}

/* GELU and friends on lines of 4, 3, 5 and 16 lanes: float math, broadcasting, select. */
static em_ir_kernel *build_elementwise(void)
{
    em_ir_kernel *k = em_ir_kernel_new("gelu_lines");
    em_ir_mem in = em_ir_param_buffer(k, "input", em_line(EM_F32, 4), EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "output", em_line(EM_F32, 4), EM_WRITE, 1);
    em_ir_mem in3 = em_ir_param_buffer(k, "in3", em_line(EM_F32, 3), EM_READ, 1);
    em_ir_mem out3 = em_ir_param_buffer(k, "out3", em_line(EM_F32, 3), EM_WRITE, 1);
    em_ir_mem in5 = em_ir_param_buffer(k, "in5", em_line(EM_F32, 5), EM_READ, 1);
    em_ir_mem out5 = em_ir_param_buffer(k, "out5", em_line(EM_F32, 5), EM_WRITE, 1);
    em_ir_mem in16 = em_ir_param_buffer(k, "in16", em_line(EM_F32, 16), EM_READ, 1);
    em_ir_mem out16 = em_ir_param_buffer(k, "out16", em_line(EM_F32, 16), EM_READ_WRITE, 1);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_len(k, out)));
    em_ir_val x = em_ir_load(k, in, pos);
    em_ir_val t =
        em_ir_unary(k, EM_OP_ERF, em_ir_binary(k, EM_OP_MUL, x, f32c(k, 0.7071067811865476)));
    em_ir_val g = em_ir_binary(k, EM_OP_MUL, em_ir_binary(k, EM_OP_MUL, x, f32c(k, 0.5)),
                               em_ir_binary(k, EM_OP_ADD, t, f32c(k, 1.0)));
    em_ir_store(k, out, pos, g);
    em_ir_val x3 = em_ir_load(k, in3, pos);
    em_ir_val c3 =
        em_ir_ternary(k, EM_OP_CLAMP, em_ir_unary(k, EM_OP_TANH, x3), f32c(k, -0.5), f32c(k, 0.5));
    em_ir_val f3 = em_ir_ternary(k, EM_OP_FMA, x3, c3, f32c(k, 2.0));
    em_ir_val p3 = em_ir_binary(k, EM_OP_POW, em_ir_unary(k, EM_OP_ABS, f3), f32c(k, 1.5));
    em_ir_val r3 = em_ir_binary(k, EM_OP_REM, p3, f32c(k, 3.0));
    em_ir_val s3 = em_ir_ternary(k, EM_OP_SELECT, em_ir_binary(k, EM_OP_GT, x3, f32c(k, 0)), r3,
                                 em_ir_unary(k, EM_OP_NEG, x3));
    em_ir_val m3 = em_ir_binary(k, EM_OP_MAX, em_ir_binary(k, EM_OP_MIN, s3, f32c(k, 100)),
                                em_ir_unary(k, EM_OP_EXP, x3));
    em_ir_store(k, out3, pos, em_ir_unary(k, EM_OP_LOG, m3));
    em_ir_val x5 = em_ir_load(k, in5, pos);
    em_ir_val a5 =
        em_ir_binary(k, EM_OP_ADD, em_ir_unary(k, EM_OP_SQRT, x5), em_ir_unary(k, EM_OP_RSQRT, x5));
    a5 = em_ir_binary(k, EM_OP_ADD, a5, em_ir_unary(k, EM_OP_SIN, em_ir_unary(k, EM_OP_COS, x5)));
    a5 = em_ir_binary(k, EM_OP_SUB, a5, em_ir_unary(k, EM_OP_EXP2, em_ir_unary(k, EM_OP_LOG2, x5)));
    a5 =
        em_ir_binary(k, EM_OP_DIV, em_ir_unary(k, EM_OP_FLOOR, a5), em_ir_unary(k, EM_OP_CEIL, x5));
    em_ir_val nan5 =
        em_ir_binary(k, EM_OP_OR, em_ir_unary(k, EM_OP_ISNAN, a5), em_ir_unary(k, EM_OP_ISINF, a5));
    a5 = em_ir_ternary(k, EM_OP_SELECT, nan5, em_ir_const_float(k, em_line(EM_F32, 5), 0.25),
                       em_ir_unary(k, EM_OP_ROUND, a5));
    em_ir_store(k, out5, pos, a5);
    em_ir_val x16 = em_ir_load(k, in16, pos);
    em_ir_val y16 =
        em_ir_binary(k, EM_OP_DIV, em_ir_binary(k, EM_OP_MUL, x16, x16), em_ir_load(k, out16, pos));
    em_ir_store(
        k, out16, pos,
        em_ir_binary(k, EM_OP_SUB, em_ir_binary(k, EM_OP_ADD, y16, f32c(k, INFINITY)), x16));
    em_ir_end(k);
    return k;
}

/* A cube-wide sum through shared memory: barriers inside a loop, break, fences. */
static em_ir_kernel *build_reduce(void)
{
    em_ir_kernel *k = em_ir_kernel_new("block_sum");
    em_ir_set_cube_dim(k, 256, 1, 1);
    em_ir_mem in = em_ir_param_buffer(k, "input", em_ty(EM_F32), EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "partial", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem tile = em_ir_shared(k, "tile", em_ty(EM_F32), 256);
    em_ir_val unit = em_ir_builtin(k, EM_UNIT_POS), pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val acc = em_ir_var(k, em_ty(EM_F32), "acc");
    em_ir_assign(k, acc, f32c(k, 0));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, pos, em_ir_len(k, in)));
    em_ir_assign(k, acc, em_ir_load(k, in, pos));
    em_ir_end(k);
    em_ir_store(k, tile, unit, acc);
    em_ir_sync_cube(k);
    em_ir_val stride = em_ir_var(k, em_ty(EM_U32), "stride");
    em_ir_assign(k, stride, u32c(k, 128));
    em_ir_loop_begin(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, stride, u32c(k, 0)));
    em_ir_break(k);
    em_ir_end(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, unit, stride));
    em_ir_val a = em_ir_load(k, tile, unit);
    em_ir_val b = em_ir_load(k, tile, em_ir_binary(k, EM_OP_ADD, unit, stride));
    em_ir_store(k, tile, unit, em_ir_binary(k, EM_OP_ADD, a, b));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_assign(k, stride, em_ir_binary(k, EM_OP_SHR, stride, u32c(k, 1)));
    em_ir_end(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, unit, u32c(k, 0)));
    em_ir_store(k, out, em_ir_builtin(k, EM_CUBE_POS), em_ir_load(k, tile, u32c(k, 0)));
    em_ir_fence(k, 1);
    em_ir_end(k);
    em_ir_fence(k, 0);
    return k;
}

/* Atomics of every kind on global and shared memory, integer and float. */
static em_ir_kernel *build_atomics(void)
{
    em_ir_kernel *k = em_ir_kernel_new("atomics");
    em_ir_mem counts = em_ir_param_buffer(k, "counts", em_ty(EM_I32), EM_READ_WRITE, 1);
    em_ir_mem wide = em_ir_param_buffer(k, "wide", em_ty(EM_U64), EM_READ_WRITE, 1);
    em_ir_mem swide = em_ir_param_buffer(k, "swide", em_ty(EM_I64), EM_READ_WRITE, 1);
    em_ir_mem sums = em_ir_param_buffer(k, "sums", em_ty(EM_F32), EM_READ_WRITE, 1);
    em_ir_mem dsum = em_ir_param_buffer(k, "dsum", em_ty(EM_F64), EM_READ_WRITE, 1);
    em_ir_mem ro = em_ir_param_buffer(k, "ro", em_ty(EM_U32), EM_READ, 1);
    em_ir_mem shi = em_ir_shared(k, "shi", em_ty(EM_I32), 32);
    em_ir_mem shf = em_ir_shared(k, "shf", em_ty(EM_F32), 32);
    em_type i32 = em_ty(EM_I32), u64 = em_ty(EM_U64), i64 = em_ty(EM_I64);
    em_ir_val one = em_ir_const_int(k, i32, 1), pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val old = em_ir_atomic(k, EM_OP_ATOMIC_ADD, counts, u32c(k, 0), one, 0);
    static const em_ir_op ops[] = {EM_OP_ATOMIC_SUB, EM_OP_ATOMIC_MIN, EM_OP_ATOMIC_MAX,
                                   EM_OP_ATOMIC_AND, EM_OP_ATOMIC_OR,  EM_OP_ATOMIC_XOR,
                                   EM_OP_ATOMIC_XCHG};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        em_ir_val r = em_ir_atomic(k, ops[i], counts, u32c(k, (uint32_t)i + 1), old, 0);
        old = em_ir_binary(k, EM_OP_ADD, old, r);
        em_ir_val w =
            em_ir_atomic(k, ops[i], wide, u32c(k, (uint32_t)i), em_ir_cast(k, u64, old), 0);
        em_ir_val sw =
            em_ir_atomic(k, ops[i], swide, u32c(k, (uint32_t)i), em_ir_cast(k, i64, w), 0);
        old = em_ir_binary(k, EM_OP_ADD, old, em_ir_cast(k, i32, sw));
    }
    em_ir_val cas = em_ir_atomic(k, EM_OP_ATOMIC_CAS, counts, u32c(k, 9), old, one);
    em_ir_val wcas = em_ir_atomic(k, EM_OP_ATOMIC_CAS, wide, u32c(k, 9),
                                  em_ir_const_uint(k, u64, 0), em_ir_cast(k, u64, cas));
    em_ir_atomic(k, EM_OP_ATOMIC_CAS, swide, u32c(k, 9), em_ir_const_int(k, i64, -1),
                 em_ir_cast(k, i64, wcas));
    em_ir_val ld = em_ir_atomic(k, EM_OP_ATOMIC_LOAD, ro, pos, 0, 0);
    em_ir_atomic(k, EM_OP_ATOMIC_STORE, counts, u32c(k, 10), em_ir_cast(k, i32, ld), 0);
    em_ir_val x = em_ir_cast(k, em_ty(EM_F32), pos);
    em_ir_val f = em_ir_atomic(k, EM_OP_ATOMIC_ADD, sums, u32c(k, 0), x, 0);
    f = em_ir_atomic(k, EM_OP_ATOMIC_SUB, sums, u32c(k, 1), f, 0);
    f = em_ir_atomic(k, EM_OP_ATOMIC_XCHG, sums, u32c(k, 2), f, 0);
    f = em_ir_binary(k, EM_OP_ADD, f, em_ir_atomic(k, EM_OP_ATOMIC_LOAD, sums, u32c(k, 3), 0, 0));
    em_ir_atomic(k, EM_OP_ATOMIC_STORE, sums, u32c(k, 4), f, 0);
    em_ir_val d =
        em_ir_atomic(k, EM_OP_ATOMIC_ADD, dsum, u32c(k, 0), em_ir_cast(k, em_ty(EM_F64), f), 0);
    d = em_ir_atomic(k, EM_OP_ATOMIC_XCHG, dsum, u32c(k, 1), d, 0);
    em_ir_atomic(k, EM_OP_ATOMIC_STORE, dsum, u32c(k, 2), d, 0);
    em_ir_val lane = em_ir_binary(k, EM_OP_REM, em_ir_builtin(k, EM_UNIT_POS), u32c(k, 32));
    em_ir_store(k, shi, lane, em_ir_const_int(k, i32, 0));
    em_ir_store(k, shf, lane, f32c(k, 0));
    em_ir_sync_cube(k);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, shi, lane, old, 0);
    em_ir_atomic(k, EM_OP_ATOMIC_MAX, shi, u32c(k, 0), old, 0);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, shf, lane, x, 0);
    em_ir_sync_cube(k);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, counts, u32c(k, 11), em_ir_load(k, shi, lane), 0);
    em_ir_atomic(k, EM_OP_ATOMIC_ADD, sums, u32c(k, 5), em_ir_load(k, shf, lane), 0);
    return k;
}

/* Every plane op, on floats, integers, bools and a line; plane positions and barrier. */
static em_ir_kernel *build_plane(void)
{
    em_ir_kernel *k = em_ir_kernel_new("plane_ops");
    em_ir_mem in = em_ir_param_buffer(k, "x", em_ty(EM_F32), EM_READ, 1);
    em_ir_mem iin = em_ir_param_buffer(k, "ix", em_ty(EM_I32), EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem uout = em_ir_param_buffer(k, "uout", em_ty(EM_U32), EM_WRITE, 1);
    em_ir_mem lout = em_ir_param_buffer(k, "lout", em_line(EM_F32, 2), EM_WRITE, 1);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val x = em_ir_load(k, in, pos), i = em_ir_load(k, iin, pos);
    static const em_ir_op arith[] = {EM_OP_PLANE_SUM,           EM_OP_PLANE_PROD,
                                     EM_OP_PLANE_MIN,           EM_OP_PLANE_MAX,
                                     EM_OP_PLANE_INCLUSIVE_SUM, EM_OP_PLANE_EXCLUSIVE_SUM};
    em_ir_val acc = x, iacc = i;
    for (size_t j = 0; j < sizeof arith / sizeof arith[0]; j++) {
        acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_plane(k, arith[j], x, 0));
        iacc = em_ir_binary(k, EM_OP_ADD, iacc, em_ir_plane(k, arith[j], i, 0));
    }
    em_ir_val u = em_ir_cast(k, em_ty(EM_U32), iacc);
    u = em_ir_binary(k, EM_OP_ADD, u, em_ir_plane(k, EM_OP_PLANE_MAX, u, 0));
    em_ir_val pos_bool = em_ir_binary(k, EM_OP_GT, x, f32c(k, 0));
    em_ir_val all = em_ir_plane(k, EM_OP_PLANE_ALL, pos_bool, 0),
              any = em_ir_plane(k, EM_OP_PLANE_ANY, pos_bool, 0);
    u = em_ir_binary(k, EM_OP_ADD, u,
                     em_ir_plane(k, EM_OP_PLANE_BALLOT, em_ir_binary(k, EM_OP_AND, all, any), 0));
    em_ir_val lane_dyn = em_ir_binary(k, EM_OP_AND, em_ir_builtin(k, EM_CUBE_POS_X), u32c(k, 3));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_plane(k, EM_OP_PLANE_BROADCAST, x, u32c(k, 0)));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_plane(k, EM_OP_PLANE_BROADCAST, x, lane_dyn));
    acc = em_ir_binary(k, EM_OP_ADD, acc,
                       em_ir_plane(k, EM_OP_PLANE_SHUFFLE, x, em_ir_builtin(k, EM_UNIT_POS_PLANE)));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_plane(k, EM_OP_PLANE_SHUFFLE_XOR, x, u32c(k, 1)));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_plane(k, EM_OP_PLANE_SHUFFLE_UP, x, u32c(k, 1)));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_plane(k, EM_OP_PLANE_SHUFFLE_DOWN, x, u32c(k, 2)));
    em_ir_val bs = em_ir_plane(k, EM_OP_PLANE_SHUFFLE_XOR, pos_bool, u32c(k, 2));
    acc = em_ir_ternary(k, EM_OP_SELECT, bs, acc, em_ir_unary(k, EM_OP_NEG, acc));
    em_ir_val line = em_ir_cast(k, em_line(EM_F32, 2), acc);
    em_ir_store(k, lout, pos, em_ir_plane(k, EM_OP_PLANE_INCLUSIVE_SUM, line, 0));
    em_ir_sync_plane(k);
    em_ir_val dims =
        em_ir_binary(k, EM_OP_ADD, em_ir_builtin(k, EM_PLANE_DIM), em_ir_builtin(k, EM_PLANE_POS));
    em_ir_store(k, uout, pos, em_ir_binary(k, EM_OP_ADD, u, dims));
    em_ir_store(k, out, pos, acc);
    return k;
}

static const em_scalar all_kinds[] = {EM_BOOL, EM_I8,  EM_I16, EM_I32,  EM_I64, EM_U8, EM_U16,
                                      EM_U32,  EM_U64, EM_F16, EM_BF16, EM_F32, EM_F64};
#define NKINDS (sizeof all_kinds / sizeof all_kinds[0])

/* Every scalar kind cast to every other through buffers of each kind; bitcasts of many widths. */
static em_ir_kernel *build_casts(void)
{
    em_ir_kernel *k = em_ir_kernel_new("casts");
    em_ir_mem in[NKINDS], out[NKINDS];
    for (size_t i = 0; i < NKINDS; i++) {
        char name[32];
        snprintf(name, sizeof name, "in_%s", em_scalar_name(all_kinds[i]));
        in[i] = em_ir_param_buffer(k, name, em_ty(all_kinds[i]), EM_READ, 1);
    }
    for (size_t i = 0; i < NKINDS; i++) {
        char name[32];
        snprintf(name, sizeof name, "out_%s", em_scalar_name(all_kinds[i]));
        out[i] = em_ir_param_buffer(k, name, em_ty(all_kinds[i]), EM_WRITE, 1);
    }
    em_ir_mem bits = em_ir_param_buffer(k, "bits", em_ty(EM_U32), EM_WRITE, 1);
    em_ir_mem half2 = em_ir_param_buffer(k, "half2", em_line(EM_F16, 2), EM_READ, 1);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val base = em_ir_binary(k, EM_OP_MUL, pos, u32c(k, (uint32_t)NKINDS));
    em_ir_val v[NKINDS];
    for (size_t i = 0; i < NKINDS; i++) v[i] = em_ir_load(k, in[i], pos);
    for (size_t to = 0; to < NKINDS; to++)
        for (size_t from = 0; from < NKINDS; from++) {
            em_ir_val idx = em_ir_binary(k, EM_OP_ADD, base, u32c(k, (uint32_t)from));
            em_ir_store(k, out[to], idx, em_ir_cast(k, em_ty(all_kinds[to]), v[from]));
        }
    /* bitcasts: same width, narrow to wide, wide to narrow, 64-bit */
    em_ir_val u = em_ir_bitcast(k, em_ty(EM_U32), v[11]);
    u = em_ir_binary(k, EM_OP_ADD, u, em_ir_bitcast(k, em_ty(EM_U32), em_ir_load(k, half2, pos)));
    em_ir_val b4 = em_ir_bitcast(k, em_line(EM_U8, 4), u);
    u = em_ir_binary(k, EM_OP_ADD, u,
                     em_ir_cast(k, em_ty(EM_U32), em_ir_extract(k, b4, u32c(k, 3))));
    em_ir_val d2 = em_ir_bitcast(k, em_line(EM_U32, 2), v[12]);
    u = em_ir_binary(k, EM_OP_ADD, u, em_ir_extract(k, d2, u32c(k, 1)));
    em_ir_val hb = em_ir_bitcast(k, em_ty(EM_F16), v[6]);
    em_ir_val bi = em_ir_bitcast(k, em_ty(EM_I16), v[10]);
    em_ir_val f2 = em_ir_bitcast(k, em_line(EM_F32, 2), em_ir_bitcast(k, em_ty(EM_F64), v[4]));
    em_ir_val w = em_ir_bitcast(k, em_ty(EM_U64), f2);
    em_ir_val bf4 = em_ir_bitcast(k, em_line(EM_BF16, 4), w);
    em_ir_val back = em_ir_bitcast(k, em_ty(EM_I64), bf4);
    u = em_ir_binary(k, EM_OP_ADD, u, em_ir_cast(k, em_ty(EM_U32), hb));
    u = em_ir_binary(k, EM_OP_ADD, u, em_ir_cast(k, em_ty(EM_U32), bi));
    u = em_ir_binary(k, EM_OP_ADD, u, em_ir_cast(k, em_ty(EM_U32), back));
    u = em_ir_binary(k, EM_OP_ADD, u,
                     em_ir_bitcast(k, em_ty(EM_U32), em_ir_bitcast(k, em_ty(EM_I32), u)));
    em_ir_store(k, bits, pos, u);
    return k;
}

/* Integer ops of one kind (division, remainder, shifts, bit counts...) folded into one value. */
static em_ir_val int_ops(em_ir_kernel *k, em_ir_val a, em_ir_val b)
{
    static const em_ir_op bin[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                   EM_OP_REM, EM_OP_MIN, EM_OP_MAX, EM_OP_AND,
                                   EM_OP_OR,  EM_OP_XOR, EM_OP_SHL, EM_OP_SHR};
    em_type t = em_ir_value_at(k, a)->type;
    em_ir_val acc = a;
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++)
        acc = em_ir_binary(k, EM_OP_XOR, acc, em_ir_binary(k, bin[i], a, b));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_unary(k, EM_OP_NEG, acc));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_unary(k, EM_OP_NOT, b));
    acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_unary(k, EM_OP_ABS, b));
    acc = em_ir_ternary(k, EM_OP_CLAMP, acc, a, b);
    static const em_ir_op counts[] = {EM_OP_POPCOUNT, EM_OP_CLZ, EM_OP_CTZ};
    for (size_t i = 0; i < 3; i++)
        acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_cast(k, t, em_ir_unary(k, counts[i], acc)));
    em_ir_val lt = em_ir_binary(k, EM_OP_LT, a, b), ge = em_ir_binary(k, EM_OP_GE, a, b);
    return em_ir_ternary(k, EM_OP_SELECT,
                         em_ir_binary(k, EM_OP_XOR, lt, em_ir_unary(k, EM_OP_NOT, ge)), acc, b);
}

/* Float ops of one kind folded into one value. */
static em_ir_val float_ops(em_ir_kernel *k, em_ir_val a, em_ir_val b, bool transcendental)
{
    static const em_ir_op bin[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                   EM_OP_REM, EM_OP_MIN, EM_OP_MAX};
    em_ir_val acc = a;
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++)
        acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_binary(k, bin[i], a, b));
    static const em_ir_op un[] = {EM_OP_NEG,   EM_OP_ABS,  EM_OP_SQRT, EM_OP_RSQRT,
                                  EM_OP_FLOOR, EM_OP_CEIL, EM_OP_ROUND};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++)
        acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_unary(k, un[i], acc));
    if (transcendental) {
        static const em_ir_op tr[] = {EM_OP_EXP, EM_OP_LOG, EM_OP_TANH,
                                      EM_OP_ERF, EM_OP_SIN, EM_OP_EXP2};
        for (size_t i = 0; i < sizeof tr / sizeof tr[0]; i++)
            acc = em_ir_binary(k, EM_OP_ADD, acc, em_ir_unary(k, tr[i], acc));
        acc = em_ir_binary(k, EM_OP_POW, acc, b);
    }
    acc = em_ir_ternary(k, EM_OP_FMA, acc, a, b);
    acc = em_ir_ternary(k, EM_OP_CLAMP, acc, a, b);
    return em_ir_ternary(k, EM_OP_SELECT, em_ir_unary(k, EM_OP_ISNAN, acc), b, acc);
}

/* f16, bf16 and f64 arithmetic (lines too); narrow and 64-bit integers. */
static em_ir_kernel *build_numerics(bool f64_transcendental)
{
    em_ir_kernel *k = em_ir_kernel_new("numerics");
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    struct {
        em_type t;
        const char *name;
    } bufs[] = {
        {em_line(EM_F16, 4), "h4"},    {em_line(EM_BF16, 2), "b2"}, {em_line(EM_F64, 2), "d2"},
        {em_ty(EM_F16), "h"},          {em_line(EM_I8, 4), "c4"},   {em_ty(EM_U16), "us"},
        {em_ty(EM_I64), "l"},          {em_line(EM_U64, 2), "ul2"}, {em_ty(EM_I16), "s"},
        {em_line(EM_U8, 3), "uc3"},    {em_ty(EM_I32), "i"},        {em_line(EM_U32, 4), "u4"},
        {em_line(EM_BOOL, 3), "flags"}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        em_ir_mem m = em_ir_param_buffer(k, bufs[i].name, bufs[i].t, EM_READ_WRITE, 1);
        em_ir_val a = em_ir_load(k, m, pos);
        em_ir_val b = em_ir_load(k, m, em_ir_binary(k, EM_OP_ADD, pos, u32c(k, 1)));
        em_ir_val r;
        em_scalar s = (em_scalar)bufs[i].t.scalar;
        if (s == EM_BOOL)
            r = em_ir_binary(k, EM_OP_XOR, em_ir_binary(k, EM_OP_AND, a, b),
                             em_ir_unary(k, EM_OP_NOT, em_ir_binary(k, EM_OP_OR, a, b)));
        else if (em_scalar_is_float(s))
            r = float_ops(k, a, b, s != EM_F64 || f64_transcendental);
        else
            r = int_ops(k, a, b);
        em_ir_store(k, m, pos, r);
    }
    return k;
}

/* f32 lines rounded to bf16 lines and stored, of an even and an odd width (the CUDA target rounds
 * pairs of lanes with one packed conversion, the odd lane alone). */
static em_ir_kernel *build_bf16_line_casts(void)
{
    em_ir_kernel *k = em_ir_kernel_new("bf16_line_casts");
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    for (unsigned lanes = 3; lanes <= 4; lanes++) {
        em_ir_mem in = em_ir_param_buffer(k, lanes == 3 ? "f3" : "f4", em_line(EM_F32, lanes),
                                          EM_READ, 1);
        em_ir_mem out = em_ir_param_buffer(k, lanes == 3 ? "b3" : "b4", em_line(EM_BF16, lanes),
                                           EM_READ_WRITE, 1);
        em_ir_val x = em_ir_load(k, in, pos);
        em_ir_val r = em_ir_cast(k, em_line(EM_BF16, lanes), x);
        em_ir_store(k, out, pos, em_ir_binary(k, EM_OP_ADD, r, em_ir_load(k, out, pos)));
    }
    return k;
}

/* Structured control flow, variables (also lines), local arrays, metadata and scalar parameters,
 * dynamic lane access, print. */
static em_ir_kernel *build_control(void)
{
    em_ir_kernel *k = em_ir_kernel_new("control");
    em_ir_mem mat = em_ir_param_buffer(k, "mat", em_ty(EM_F32), EM_READ, 2);
    em_ir_val n = em_ir_param_scalar(k, "n", em_ty(EM_U32));
    em_ir_val scale = em_ir_param_scalar(k, "scale", em_ty(EM_F32));
    em_ir_mem out = em_ir_param_buffer(k, "out", em_line(EM_F32, 4), EM_WRITE, 1);
    em_ir_val flag = em_ir_param_scalar(k, "flag", em_ty(EM_BOOL));
    em_ir_val h = em_ir_param_scalar(k, "h", em_ty(EM_F16));
    em_ir_val big = em_ir_param_scalar(k, "big", em_ty(EM_I64));
    em_ir_val small = em_ir_param_scalar(k, "small", em_ty(EM_I8));
    em_ir_mem acc = em_ir_local(k, "acc", em_ty(EM_F32), 8);
    em_ir_mem lines = em_ir_local(k, "lines", em_line(EM_F32, 4), 4);
    em_ir_mem odd = em_ir_local(k, "odd", em_line(EM_I32, 5), 2);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_GE, pos, n));
    em_ir_return(k);
    em_ir_end(k);
    em_ir_val rows = em_ir_shape(k, mat, 0), cols = em_ir_shape(k, mat, 1);
    em_ir_val rs = em_ir_stride(k, mat, 0), cs = em_ir_stride(k, mat, 1);
    em_ir_val row = em_ir_binary(k, EM_OP_REM, pos, rows);
    em_ir_val sum = em_ir_var(k, em_ty(EM_F32), "sum"), i = em_ir_var(k, em_ty(EM_U32), "i");
    em_ir_assign(k, sum, em_ir_cast(k, em_ty(EM_F32), h));
    em_ir_range_begin(k, i, u32c(k, 0), cols, u32c(k, 1), true);
    em_ir_val idx = em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, row, rs),
                                 em_ir_binary(k, EM_OP_MUL, i, cs));
    em_ir_assign(k, sum, em_ir_binary(k, EM_OP_ADD, sum, em_ir_load(k, mat, idx)));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_EQ, i, u32c(k, 3)));
    em_ir_continue(k);
    em_ir_end(k);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_GT, i, u32c(k, 100)));
    em_ir_break(k);
    em_ir_end(k);
    em_ir_store(k, acc, em_ir_binary(k, EM_OP_AND, i, u32c(k, 7)), sum);
    em_ir_end(k);
    /* a range whose end and step live in variables, on a narrow counter */
    em_ir_val j = em_ir_var(k, em_ty(EM_I8), "j"), end = em_ir_var(k, em_ty(EM_I8), "end");
    em_ir_val step = em_ir_var(k, em_ty(EM_I8), "step");
    em_ir_assign(k, end, small);
    em_ir_assign(k, step, em_ir_const_int(k, em_ty(EM_I8), 3));
    em_ir_range_begin(k, j, em_ir_const_int(k, em_ty(EM_I8), -4), end, step, false);
    em_ir_assign(k, end, em_ir_binary(k, EM_OP_SUB, end, em_ir_const_int(k, em_ty(EM_I8), 1)));
    em_ir_assign(k, sum, em_ir_binary(k, EM_OP_ADD, sum, em_ir_cast(k, em_ty(EM_F32), j)));
    em_ir_end(k);
    em_ir_val lv = em_ir_var(k, em_line(EM_F32, 4), "lv");
    em_ir_assign(k, lv, em_ir_cast(k, em_line(EM_F32, 4), sum));
    em_ir_val lane = em_ir_binary(k, EM_OP_AND, pos, u32c(k, 3));
    em_ir_loop_begin(k);
    em_ir_assign(
        k, lv,
        em_ir_insert(k, lv, lane, em_ir_binary(k, EM_OP_MUL, em_ir_extract(k, lv, lane), scale)));
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_GT, em_ir_extract(k, lv, u32c(k, 0)), f32c(k, 10)));
    em_ir_assign(k, lv, em_ir_insert(k, lv, u32c(k, 1), f32c(k, 0)));
    em_ir_else(k);
    em_ir_break(k);
    em_ir_end(k);
    em_ir_end(k);
    em_ir_if_begin(k, flag);
    em_ir_store(k, lines, u32c(k, 0), lv);
    em_ir_else(k);
    em_ir_store(k, lines, u32c(k, 0), em_ir_const_float(k, em_line(EM_F32, 4), 2.0));
    em_ir_end(k);
    em_ir_val bigf = em_ir_cast(k, em_ty(EM_F32),
                                em_ir_binary(k, EM_OP_DIV, big, em_ir_cast(k, em_ty(EM_I64), pos)));
    em_ir_val o5 = em_ir_cast(k, em_line(EM_I32, 5), em_ir_cast(k, em_ty(EM_I32), bigf));
    em_ir_store(k, odd, u32c(k, 1), em_ir_binary(k, EM_OP_ADD, o5, em_ir_load(k, odd, u32c(k, 0))));
    em_ir_val back = em_ir_binary(k, EM_OP_ADD, em_ir_load(k, lines, u32c(k, 0)),
                                  em_ir_load(k, acc, u32c(k, 2)));
    back = em_ir_binary(
        k, EM_OP_ADD, back,
        em_ir_cast(k, em_ty(EM_F32), em_ir_extract(k, em_ir_load(k, odd, u32c(k, 1)), lane)));
    em_ir_val args[2] = {sum, back};
    em_ir_print(k, "pos sum %v line %v \"100%%\"\n", args, 2);
    em_ir_store(k, out, pos,
                em_ir_binary(k, EM_OP_ADD, back, em_ir_cast(k, em_ty(EM_F32), em_ir_len(k, out))));
    return k;
}

/* D = A * B + C on 16x16x16 tiles: A (f16) from global memory, B (f16) through shared memory, C
 * and D f32. */
static em_ir_kernel *build_matrix(void)
{
    em_ir_kernel *k = em_ir_kernel_new("tile_mma");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F16), EM_READ, 2);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_F16), EM_READ, 2);
    em_ir_mem c = em_ir_param_buffer(k, "c", em_ty(EM_F32), EM_READ_WRITE, 2);
    em_ir_mem sb = em_ir_shared(k, "b_tile", em_ty(EM_F16), 256);
    em_ir_val fa = em_ir_matrix(k, EM_MAT_A, EM_F16, 16, 16, 16, EM_ROW_MAJOR, "fa");
    em_ir_val fb = em_ir_matrix(k, EM_MAT_B, EM_F16, 16, 16, 16, EM_COL_MAJOR, "fb");
    em_ir_val acc = em_ir_matrix(k, EM_MAT_ACC, EM_F32, 16, 16, 16, EM_ROW_MAJOR, "acc");
    em_ir_val unit = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val i = em_ir_var(k, em_ty(EM_U32), "i");
    em_ir_range_begin(k, i, unit, u32c(k, 256), em_ir_builtin(k, EM_CUBE_DIM), false);
    em_ir_store(k, sb, i, em_ir_load(k, b, i));
    em_ir_end(k);
    em_ir_sync_cube(k);
    em_ir_mat_fill(k, acc, f32c(k, 0));
    em_ir_mat_load(k, acc, c, u32c(k, 0), u32c(k, 16), EM_ROW_MAJOR);
    em_ir_mat_load(k, fa, a, u32c(k, 0), em_ir_stride(k, a, 0), EM_ROW_MAJOR);
    em_ir_mat_load(k, fb, sb, u32c(k, 0), u32c(k, 16), EM_COL_MAJOR);
    em_ir_mat_mma(k, acc, fa, fb, acc);
    em_ir_mat_store(k, c, u32c(k, 0), u32c(k, 16), acc, EM_ROW_MAJOR);
    return k;
}

/* Asynchronous copies into shared memory: 16-byte chunks of f16 with a condition (zero-fill), a
 * 4-byte f32 copy without one, commit and wait; then every unit reads back. */
static em_ir_kernel *build_copy_async(void)
{
    em_ir_kernel *k = em_ir_kernel_new("copy_async");
    em_ir_mem h = em_ir_param_buffer(k, "h", em_ty(EM_F16), EM_READ, 1);
    em_ir_mem f = em_ir_param_buffer(k, "f", em_ty(EM_F32), EM_READ, 1);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem sh = em_ir_shared(k, "sh", em_ty(EM_F16), 8 * 64);
    em_ir_mem sf = em_ir_shared(k, "sf", em_ty(EM_F32), 64);
    em_ir_val u = em_ir_builtin(k, EM_UNIT_POS);
    em_ir_val u8 = em_ir_binary(k, EM_OP_MUL, u, u32c(k, 8));
    em_ir_val inside = em_ir_binary(k, EM_OP_LT, u8, em_ir_len(k, h));
    em_ir_copy_async(k, sh, u8, h, u8, 8, inside);
    em_ir_copy_commit(k);
    em_ir_copy_async(k, sf, u, f, u, 1, EM_IR_NONE);
    em_ir_copy_commit(k);
    em_ir_copy_wait(k, 1);
    em_ir_copy_wait(k, 0);
    em_ir_sync_cube(k);
    em_ir_val x = em_ir_cast(k, em_ty(EM_F32), em_ir_load(k, sh, u8));
    em_ir_store(k, out, u, em_ir_binary(k, EM_OP_ADD, x, em_ir_load(k, sf, u)));
    return k;
}

/* Target intrinsics: inline PTX and plain calls. */
static em_ir_kernel *build_intrinsics(const char *target)
{
    em_ir_kernel *k = em_ir_kernel_new("intrinsics");
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_U32), EM_WRITE, 1);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val args[2] = {pos, u32c(k, 7)};
    em_ir_val r;
    if (!strcmp(target, "cuda")) {
        r = em_ir_intrinsic(k, "cuda.ptx:add.u32 %0, %1, %2;", em_ty(EM_U32), args, 2);
        em_ir_val one[1] = {r};
        r = em_ir_intrinsic(k, "cuda.call:__brev", em_ty(EM_U32), one, 1);
        em_ir_intrinsic(k, "cuda.ptx:membar.gl;", (em_type){0, 0}, NULL, 0);
    } else if (!strcmp(target, "opencl")) {
        r = em_ir_intrinsic(k, "opencl.call:rotate", em_ty(EM_U32), args, 2);
    } else {
        em_ir_val one[1] = {pos};
        r = em_ir_intrinsic(k, "glsl.call:bitfieldReverse", em_ty(EM_U32), one, 1);
    }
    em_ir_store(k, out, pos, r);
    return k;
}

/* The kernels every target gets (matrix kernels are added where they apply). */
static size_t common_kernels(em_ir_kernel **ks, bool f64_transcendental)
{
    size_t n = 0;
    ks[n++] = prepare(build_elementwise());
    ks[n++] = prepare(build_reduce());
    ks[n++] = prepare(build_atomics());
    ks[n++] = prepare(build_plane());
    ks[n++] = prepare(build_casts());
    ks[n++] = prepare(build_numerics(f64_transcendental));
    ks[n++] = prepare(build_control());
    return n;
}

static char *gen_cuda(em_ir_kernel **ks, size_t n, const em_caps *caps)
{
    char *src = em_codegen_cuda((const em_ir_kernel *const *)ks, n, caps);
    if (!src) print_message("em_codegen_cuda: %s\n", em_last_error());
    return src;
}

static char *gen_opencl(em_ir_kernel **ks, size_t n, const em_caps *caps)
{
    char *src = em_codegen_opencl((const em_ir_kernel *const *)ks, n, caps);
    if (!src) print_message("em_codegen_opencl: %s\n", em_last_error());
    return src;
}

static char *gen_glsl(em_ir_kernel **ks, size_t n, const em_caps *caps)
{
    char *src = em_codegen_glsl((const em_ir_kernel *const *)ks, n, caps);
    if (!src) print_message("em_codegen_glsl: %s\n", em_last_error());
    return src;
}

/* Generates and compiles every kernel of ks on its own (a kernel's prelude must not rely on what
 * another kernel of a batch pulled in). Returns MISSING, FAILED or PASSED. */
static int compile_each(em_ir_kernel **ks, size_t n, const em_caps *caps, bool cuda)
{
    int result = PASSED;
    for (size_t i = 0; i < n && result == PASSED; i++) {
        const em_ir_kernel *const *one = (const em_ir_kernel *const *)&ks[i];
        char *src = cuda ? em_codegen_cuda(one, 1, caps) : em_codegen_opencl(one, 1, caps);
        if (!src) {
            print_message("%s\n", em_last_error());
            return FAILED;
        }
        char name[80];
        snprintf(name, sizeof name, "alone_%s", em_ir_kernel_name(ks[i]));
        result = cuda ? compile_cuda(src, name) : compile_opencl_clang(src, "CL1.2", NULL, name);
        free(src);
    }
    return result;
}

/* ---- CUDA -------------------------------------------------------------------------------------
 */

static void test_cuda_all_ops(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, true);
    ks[n++] = prepare(build_matrix());
    ks[n++] = prepare(build_intrinsics("cuda"));
    ks[n++] = prepare(build_copy_async());
    ks[n++] = prepare(build_bf16_line_casts());
    em_caps caps = caps_for("cuda", true, 32);
    char *src = gen_cuda(ks, n, &caps);
    assert_non_null(src);
    expect_has(src, "cp.async.cg.shared.global [%0], [%1], 16, %2;");
    expect_has(src, "em_cp_async<16>(sh_m");
    expect_has(src, "em_cp_async<4>(sf_m");
    expect_has(src, "em_cp_async_commit();");
    expect_has(src, "em_cp_async_wait<1>();");
    expect_has(src, "extern \"C\" __global__ void gelu_lines(const emv<float, 4> *input_m1, "
                    "emv<float, 4> *output_m2");
    expect_has(src, "__launch_bounds__(256) block_sum(");
    expect_has(src, "__syncthreads();");
    expect_has(src, "__threadfence();");
    expect_has(src, "__shfl_xor_sync(EM_FULL_MASK");
    expect_has(src, "__reduce_add_sync(EM_FULL_MASK");
    expect_has(src, "__ballot_sync(EM_FULL_MASK");
    expect_has(src, "__all_sync(EM_FULL_MASK");
    expect_has(src, "__syncwarp();");
    expect_has(src, "atomicAdd(&sums_m");
    expect_has(src, "atomicCAS(&counts_m");
    expect_has(src, "#include <mma.h>");
    expect_has(src, "wmma::mma_sync(acc_");
    expect_has(src, "wmma::load_matrix_sync(fb_");
    expect_has(src, "asm volatile(\"add.u32 %0, %1, %2;\"");
    expect_has(src, "__brev(");
    expect_has(src, "printf(\"pos sum %g line [%g, %g, %g, %g] \\\"100%%\\\"\\n\"");
    expect_has(src, "const unsigned long long *em_meta)");
    expect_has(src, "em_rh(");  /* f16 rounding after operations */
    expect_has(src, "cvt.rn.bf16x2.f32 %0, %1, %2;");
    expect_has(src, "= em_rb_line("); /* f32 lines to bf16: packed, both widths */
    expect_has(src, "== 0 ||"); /* guarded signed division */
    int r = compile_cuda(src, "all_ops.cu");
    int alone = r == PASSED ? compile_each(ks, n, &caps, true) : r;
    free(src);
    free_all(ks, n);
    expect_compiled(r, "NVRTC (/usr/local/cuda/lib64/libnvrtc.so)");
    expect_compiled(alone, "NVRTC");
}

/* Without matrix ops the source needs no header at all (NVRTC without include paths); an older
 * architecture uses shuffles instead of __reduce_*_sync; big shared memory goes dynamic. */
static void test_cuda_header_free_and_dynamic_smem(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, true);
    em_ir_kernel *big = em_ir_kernel_new("big_shared");
    em_ir_mem out = em_ir_param_buffer(big, "out", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_mem tile = em_ir_shared(big, "tile", em_ty(EM_F32), 16384);
    em_ir_mem tile2 = em_ir_shared(big, "tile2", em_line(EM_F16, 2), 100);
    em_ir_val u = em_ir_builtin(big, EM_UNIT_POS);
    em_ir_store(big, tile, u, f32c(big, 1));
    em_ir_store(big, tile2, u, em_ir_const_float(big, em_line(EM_F16, 2), 0.5));
    em_ir_sync_cube(big);
    em_ir_val h = em_ir_extract(big, em_ir_load(big, tile2, u), u32c(big, 1));
    em_ir_store(
        big, out, u,
        em_ir_binary(big, EM_OP_ADD, em_ir_load(big, tile, u), em_ir_cast(big, em_ty(EM_F32), h)));
    ks[n++] = prepare(big);
    assert_int_equal(em_codegen_cuda_dynamic_smem(ks[n - 1]), 65536 + 400);
    assert_int_equal(em_codegen_cuda_dynamic_smem(ks[1]), 0);
    em_caps caps = caps_for("cuda", true, 32);
    snprintf(caps.arch, sizeof caps.arch, "sm_70");
    char *src = gen_cuda(ks, n, &caps);
    assert_non_null(src);
    assert_null(strstr(src, "#include"));
    assert_null(strstr(src, "__reduce_add_sync"));
    expect_has(src, "em_plane_sum(");
    expect_has(src, "extern __shared__ __align__(32) unsigned char em_smem[];");
    expect_has(src, "float *tile_m2 = reinterpret_cast<float *>(em_smem + 0);");
    expect_has(src, "emv<unsigned short, 2> *tile2_m3 = reinterpret_cast<emv<unsigned short, 2> "
                    "*>(em_smem + 65536);");
    void *lib = nvrtc_lib();
    int r = MISSING;
    if (lib) {
        /* compile without any include path */
        nvrtc_create_fn create = (nvrtc_create_fn)dlsym(lib, "nvrtcCreateProgram");
        nvrtc_compile_fn compile = (nvrtc_compile_fn)dlsym(lib, "nvrtcCompileProgram");
        nvrtc_destroy_fn destroy = (nvrtc_destroy_fn)dlsym(lib, "nvrtcDestroyProgram");
        void *prog = NULL;
        const char *opts[] = {"--gpu-architecture=sm_70", "-default-device"};
        r = create && compile && destroy && create(&prog, src, "noheader.cu", 0, NULL, NULL) == 0
                ? FAILED
                : MISSING;
        if (prog) {
            r = compile(prog, 2, opts) == 0 ? PASSED : FAILED;
            destroy(&prog);
        }
        if (r == FAILED) r = compile_cuda(src, "noheader.cu"); /* shows the log */
    }
    free(src);
    free_all(ks, n);
    expect_compiled(r, "NVRTC");
}

/* Programmatic dependent launch: for sm_90 every kernel of a module starts with
 * griddepcontrol.wait (before any of its loads and stores) and the module carries the global
 * `ember_pdl` the driver looks for before launching with the attribute; older architectures get
 * neither. The sm_90 source compiles through NVRTC. */
static size_t count_of(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void test_cuda_programmatic_dependent_launch(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, true);
    em_caps caps = caps_for("cuda", true, 32);
    char *src = gen_cuda(ks, n, &caps); /* sm_90 */
    assert_non_null(src);
    expect_has(src, "extern \"C\" __device__ int ember_pdl = 1;");
    assert_int_equal(count_of(src, "griddepcontrol.wait;"), n);
    assert_int_equal(count_of(src, "griddepcontrol.launch_dependents;"), n);
    /* each kernel's first statement is the wait: nothing reads or writes memory before it */
    size_t kernels = 0;
    for (const char *p = strstr(src, "__global__"); p; p = strstr(p + 1, "__global__")) {
        const char *body = strstr(p, ")\n{\n");
        assert_non_null(body);
        body += 4;
        while (*body == ' ') body++;
        if (strncmp(body, "asm volatile(\"griddepcontrol.wait;\"", 34))
            fail_msg("a kernel does not begin with the wait:\n%.200s", body);
        kernels++;
    }
    assert_int_equal(kernels, n);
    int r = compile_cuda(src, "pdl.cu");
    free(src);
    snprintf(caps.arch, sizeof caps.arch, "sm_80");
    src = gen_cuda(ks, n, &caps);
    assert_non_null(src);
    assert_null(strstr(src, "griddepcontrol"));
    assert_null(strstr(src, "ember_pdl"));
    free(src);
    free_all(ks, n);
    expect_compiled(r, "NVRTC");
}

/* ---- OpenCL -----------------------------------------------------------------------------------
 */

static void test_opencl_all_ops(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, true);
    ks[n++] = prepare(build_matrix());
    ks[n++] = prepare(build_intrinsics("opencl"));
    em_caps caps = caps_for("opencl", false, 1); /* PoCL: no sub-groups, PLANE_DIM 1 */
    char *src = gen_opencl(ks, n, &caps);
    assert_non_null(src);
    expect_has(
        src, "__kernel void gelu_lines(__global const float *input_m1, __global float *output_m2");
    expect_has(src, "__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void block_sum(");
    expect_has(src, "barrier(CLK_LOCAL_MEM_FENCE);");
    expect_has(src, "vload4(");
    expect_has(src, "vstore3(");
    expect_has(src, "vload_half4(");
    expect_has(src, "(uint)get_local_id(0)");
    expect_has(src, "em_atomic_add_f32_global(");
    expect_has(src, "em_atomic_add_f32_local(");
    expect_has(src, "atom_cmpxchg(");
    expect_has(src, "#pragma OPENCL EXTENSION cl_khr_fp64 : enable");
    expect_has(src, "em_acc = em_acc + "); /* matrix ops as loops */
    expect_has(src, "rotate(");
    expect_has(src, "__global const ulong *em_meta)");
    assert_null(strstr(src, "sub_group"));
    int r12 = compile_opencl_clang(src, "CL1.2", NULL, "all_ops_12");
    int r20 = compile_opencl_clang(src, "CL2.0", NULL, "all_ops_20");
    int rdrv = compile_opencl_driver(src, "all_ops");
    int alone = r12 == PASSED ? compile_each(ks, n, &caps, false) : r12;
    free(src);
    free_all(ks, n);
    expect_compiled(alone, "clang (OpenCL C 1.2)");
    expect_compiled(r12, "clang (OpenCL C 1.2)");
    expect_compiled(r20, "clang (OpenCL C 2.0)");
    expect_compiled(rdrv, "an OpenCL platform (libOpenCL.so.1)");
}

static const char subgroup_macros[] =
    "-Dcl_khr_subgroup_shuffle -Dcl_khr_subgroup_shuffle_relative "
    "-Dcl_khr_subgroup_ballot -Dcl_khr_subgroup_non_uniform_arithmetic";

static void test_opencl_subgroups(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, true);
    em_caps caps = caps_for("opencl", true, 32);
    char *src = gen_opencl(ks, n, &caps);
    assert_non_null(src);
    expect_has(src, "#pragma OPENCL EXTENSION cl_khr_subgroups : enable");
    expect_has(src, "sub_group_reduce_add(");
    expect_has(src, "sub_group_scan_exclusive_add(");
    expect_has(src, "sub_group_non_uniform_reduce_mul(");
    expect_has(src, "sub_group_shuffle_xor(");
    expect_has(src, "sub_group_shuffle_up(");
    expect_has(src, "sub_group_ballot(");
    expect_has(src, "sub_group_barrier(CLK_LOCAL_MEM_FENCE);");
    expect_has(src, "get_sub_group_size()");
    int r = compile_opencl_clang(src, "CL2.0", subgroup_macros, "subgroups_20");
    free(src);
    free_all(ks, n);
    expect_compiled(r, "clang (OpenCL C 2.0)");
}

/* ---- GLSL -------------------------------------------------------------------------------------
 */

static void test_glsl_all_ops(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, false); /* GLSL has no f64 transcendentals */
    ks[n++] = prepare(build_intrinsics("glsl"));
    em_caps caps = caps_for("glsl", true, 32);
    char *src = gen_glsl(ks, n, &caps);
    assert_non_null(src);
    expect_has(src, "//@@ember-kernel gelu_lines\n#version 450\n");
    expect_has(src, "//@@ember-kernel block_sum\n");
    expect_has(src, "layout(local_size_x_id = 0) in;");
    expect_has(src, "layout(constant_id = 3) const uint em_dim_x");
    expect_has(src, "layout(local_size_x = 256) in;");
    expect_has(src, "layout(constant_id = 4) const uint em_dim_y = 1u;");
    expect_has(
        src, "layout(std430, set = 0, binding = 0) readonly buffer em_b0 { vec4 d[]; } input_m1;");
    expect_has(src, "memoryBarrierShared();\n    barrier();");
    expect_has(src, "subgroupAdd(");
    expect_has(src, "subgroupExclusiveAdd(");
    expect_has(src, "subgroupShuffleXor(");
    expect_has(src, "subgroupBallot(");
    expect_has(src, "subgroupBroadcast(");
    expect_has(src, "#extension GL_KHR_shader_subgroup_arithmetic : require");
    expect_has(src, "atomicCompSwap(");
    expect_has(
        src, "buffer em_b3_bits { uint d[]; } sums_m4_u;"); /* float atomics through a uint view */
    expect_has(src, "layout(push_constant) uniform em_push_block {");
    expect_has(src, "/* print dropped");
    expect_has(src, "bitfieldReverse(");
    expect_has(src, "em_erf(");
    int r = compile_glsl(src, "all_ops");
    free(src);
    free_all(ks, n);
    expect_compiled(r, "glslangValidator");
}

/* Without sub-groups PLANE_DIM is 1 and matrix ops lower to loops; native float atomics. */
static void test_glsl_plane_one_and_matrix(void **state)
{
    (void)state;
    em_ir_kernel *ks[16];
    size_t n = common_kernels(ks, false);
    ks[n++] = prepare(build_matrix());
    em_caps caps = caps_for("glsl", false, 1);
    caps.float_atomic_add = true;
    char *src = gen_glsl(ks, n, &caps);
    assert_non_null(src);
    assert_null(strstr(src, "subgroup"));
    expect_has(src, "//@@ember-kernel tile_mma\n");
    expect_has(src, "em_acc = em_acc + ");
    expect_has(src, "#extension GL_EXT_shader_atomic_float : require");
    int r = compile_glsl(src, "plane_one");
    free(src);
    free_all(ks, n);
    expect_compiled(r, "glslangValidator");
}

/* ---- rejections -------------------------------------------------------------------------------
 */

static void expect_error_has(const char *needle)
{
    const char *msg = em_last_error();
    if (!strstr(msg, needle)) print_message("expected `%s` in the error: %s\n", needle, msg);
    assert_non_null(strstr(msg, needle));
}

static void test_rejections_name_instruction_and_target(void **state)
{
    (void)state;
    /* GLSL has no exp on doubles */
    em_ir_kernel *k = em_ir_kernel_new("f64exp");
    em_ir_mem m = em_ir_param_buffer(k, "d", em_ty(EM_F64), EM_READ_WRITE, 1);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_store(k, m, pos, em_ir_unary(k, EM_OP_EXP, em_ir_load(k, m, pos)));
    k = prepare(k);
    em_caps glsl = caps_for("glsl", true, 32);
    assert_null(em_codegen_glsl((const em_ir_kernel *const *)&k, 1, &glsl));
    expect_error_has("GLSL: kernel f64exp: inst ");
    expect_error_has("= exp ");
    /* ... and without shaderFloat64 not even an add */
    glsl.dtype[EM_F64] = false;
    assert_null(em_codegen_glsl((const em_ir_kernel *const *)&k, 1, &glsl));
    expect_error_has("shaderFloat64");
    /* OpenCL without cl_khr_fp64 */
    em_caps cl = caps_for("opencl", false, 1);
    cl.dtype[EM_F64] = false;
    assert_null(em_codegen_opencl((const em_ir_kernel *const *)&k, 1, &cl));
    expect_error_has("cl_khr_fp64");
    /* CUDA takes it */
    char *src = em_codegen_cuda((const em_ir_kernel *const *)&k, 1, NULL);
    assert_non_null(src);
    free(src);
    em_ir_kernel_free(k);

    /* matrix ops where planes have more than one unit (no loop lowering) */
    k = prepare(build_matrix());
    em_caps cl32 = caps_for("opencl", true, 32);
    assert_null(em_codegen_opencl((const em_ir_kernel *const *)&k, 1, &cl32));
    expect_error_has("OpenCL: kernel tile_mma: inst ");
    expect_error_has("PLANE_DIM is 1");
    em_caps glsl32 = caps_for("glsl", true, 32);
    assert_null(em_codegen_glsl((const em_ir_kernel *const *)&k, 1, &glsl32));
    expect_error_has("GLSL: kernel tile_mma: inst ");
    /* CUDA on a device without matrix units */
    em_caps nomma = caps_for("cuda", true, 32);
    nomma.matrix = false;
    assert_null(em_codegen_cuda((const em_ir_kernel *const *)&k, 1, &nomma));
    expect_error_has("caps.matrix");
    em_ir_kernel_free(k);

    /* asynchronous copies are CUDA's (the kernel language lowers them for other targets) */
    k = prepare(build_copy_async());
    em_caps cl1 = caps_for("opencl", false, 1);
    assert_null(em_codegen_opencl((const em_ir_kernel *const *)&k, 1, &cl1));
    expect_error_has("copy_async is not supported by the OpenCL generator");
    em_ir_kernel_free(k);

    /* a shape WMMA does not have, and a layout the fragment was not declared with */
    k = em_ir_kernel_new("bad_mma");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F16), EM_READ, 1);
    em_ir_val fa = em_ir_matrix(k, EM_MAT_A, EM_F16, 16, 16, 8, EM_ROW_MAJOR, "fa");
    em_ir_mat_load(k, fa, a, u32c(k, 0), u32c(k, 16), EM_ROW_MAJOR);
    k = prepare(k);
    assert_null(em_codegen_cuda((const em_ir_kernel *const *)&k, 1, NULL));
    expect_error_has("CUDA: kernel bad_mma: inst ");
    expect_error_has("not a WMMA shape");
    em_ir_kernel_free(k);
    k = em_ir_kernel_new("bad_layout");
    a = em_ir_param_buffer(k, "a", em_ty(EM_F16), EM_READ, 1);
    fa = em_ir_matrix(k, EM_MAT_A, EM_F16, 16, 16, 16, EM_ROW_MAJOR, "fa");
    em_ir_mat_load(k, fa, a, u32c(k, 0), u32c(k, 16), EM_COL_MAJOR);
    k = prepare(k);
    assert_null(em_codegen_cuda((const em_ir_kernel *const *)&k, 1, NULL));
    expect_error_has("mat_load");
    expect_error_has("row-major but loaded column-major");
    em_ir_kernel_free(k);

    /* an intrinsic of another target; print on GLSL is dropped, not rejected */
    k = em_ir_kernel_new("foreign");
    em_ir_val none[1] = {0};
    em_ir_intrinsic(k, "opencl.call:rotate", (em_type){0, 0}, none, 0);
    k = prepare(k);
    assert_null(em_codegen_cuda((const em_ir_kernel *const *)&k, 1, NULL));
    expect_error_has("CUDA: kernel foreign: inst ");
    expect_error_has("intrinsic `opencl.call:rotate` is not available on CUDA");
    em_ir_kernel_free(k);

    /* ill-formed IR is reported by the verifier, never crashes a generator */
    k = em_ir_kernel_new("broken");
    em_ir_mem o = em_ir_param_buffer(k, "o", em_ty(EM_F32), EM_WRITE, 1);
    em_ir_store(k, o, em_ir_builtin(k, EM_ABSOLUTE_POS), em_ir_u32(k, 1));
    em_ir_store(k, 77, 99, 123);
    assert_null(em_codegen_cuda((const em_ir_kernel *const *)&k, 1, NULL));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_null(em_codegen_opencl((const em_ir_kernel *const *)&k, 1, NULL));
    assert_null(em_codegen_glsl((const em_ir_kernel *const *)&k, 1, NULL));
    em_ir_kernel_free(k);
    assert_null(em_codegen_glsl(NULL, 0, NULL));
    assert_null(em_codegen_cuda(NULL, 1, NULL));
    /* one batch cannot hold two kernels of one name */
    em_ir_kernel *twins[2] = {prepare(build_reduce()), prepare(build_reduce())};
    assert_null(em_codegen_opencl((const em_ir_kernel *const *)twins, 2, NULL));
    expect_error_has("two kernels named 'block_sum'");
    assert_null(em_codegen_glsl((const em_ir_kernel *const *)twins, 2, NULL));
    free_all(twins, 2);
}

/* ---- the parameter ABI ------------------------------------------------------------------------
 */

static void test_parameter_abi(void **state)
{
    (void)state;
    em_ir_kernel *k = em_ir_kernel_new("abi");
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 2);
    em_ir_val alpha = em_ir_param_scalar(k, "alpha", em_ty(EM_F32));
    em_ir_mem b = em_ir_param_buffer(k, "b", em_line(EM_F32, 4), EM_READ_WRITE, 1);
    em_ir_val flag = em_ir_param_scalar(k, "flag", em_ty(EM_BOOL));
    em_ir_mem c = em_ir_param_buffer(k, "c", em_ty(EM_U8), EM_WRITE, 0);
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_val s = em_ir_binary(k, EM_OP_ADD, em_ir_len(k, a), em_ir_shape(k, a, 1));
    s = em_ir_binary(k, EM_OP_ADD, s, em_ir_stride(k, a, 1));
    s = em_ir_binary(k, EM_OP_ADD, s, em_ir_len(k, b));
    s = em_ir_binary(k, EM_OP_ADD, s, em_ir_stride(k, b, 0));
    s = em_ir_binary(k, EM_OP_ADD, s, em_ir_len(k, c));
    em_ir_val x = em_ir_binary(k, EM_OP_MUL, em_ir_load(k, a, pos), alpha);
    em_ir_val v =
        em_ir_binary(k, EM_OP_ADD, em_ir_load(k, b, pos), em_ir_cast(k, em_ty(EM_F32), s));
    em_ir_store(k, b, pos,
                em_ir_ternary(k, EM_OP_SELECT, flag, v, em_ir_cast(k, em_line(EM_F32, 4), x)));
    em_ir_store(k, c, pos, em_ir_cast(k, em_ty(EM_U8), flag));
    k = prepare(k);
    const em_ir_kernel *const *ks = (const em_ir_kernel *const *)&k;

    char *cu = em_codegen_cuda(ks, 1, NULL);
    assert_non_null(cu);
    expect_has(
        cu,
        "void abi(const float *a_m1, float alpha_1, emv<float, 4> *b_m2, unsigned char flag_2_in, "
        "unsigned char *c_m3, const unsigned long long *em_meta)");
    expect_has(cu, "const bool flag_2 = flag_2_in != 0;");
    expect_has(cu, "(unsigned)em_meta[0]"); /* len(a) */
    expect_has(cu, "(unsigned)em_meta[2]"); /* shape(a, 1) */
    expect_has(cu, "(unsigned)em_meta[4]"); /* stride(a, 1) */
    expect_has(cu, "(unsigned)em_meta[5]"); /* len(b) */
    expect_has(cu, "(unsigned)em_meta[7]"); /* stride(b, 0) */
    expect_has(cu, "(unsigned)em_meta[8]"); /* len(c) */
    char *cl = em_codegen_opencl(ks, 1, NULL);
    assert_non_null(cl);
    expect_has(cl, "void abi(__global const float *a_m1, const float alpha_1, __global float "
                   "*b_m2, const uchar flag_2_in, "
                   "__global uchar *c_m3, __global const ulong *em_meta)");
    expect_has(cl, "(uint)em_meta[7]");
    char *gl = em_codegen_glsl(ks, 1, NULL);
    assert_non_null(gl);
    expect_has(gl,
               "layout(std430, set = 0, binding = 0) readonly buffer em_b0 { float d[]; } a_m1;");
    expect_has(gl, "layout(std430, set = 0, binding = 2) buffer em_b2 { vec4 d[]; } b_m2;");
    expect_has(gl, "layout(std430, set = 0, binding = 4) buffer em_b4 { uint8_t d[]; } c_m3;");
    expect_has(gl, "layout(std430, set = 0, binding = 5) readonly buffer em_meta_block { uint m[]; "
                   "} em_meta;");
    expect_has(gl, "layout(offset = 0) float alpha_1;");
    expect_has(gl, "layout(offset = 8) uint flag_2;");
    expect_has(gl, "em_meta.m[14]"); /* stride(b, 0): word 7, low half */
    int rc = compile_cuda(cu, "abi.cu"), rl = compile_opencl_clang(cl, "CL1.2", NULL, "abi"),
        rg = compile_glsl(gl, "abi");
    free(cu);
    free(cl);
    free(gl);
    em_ir_kernel_free(k);
    expect_compiled(rc, "NVRTC");
    expect_compiled(rl, "clang (OpenCL C 1.2)");
    expect_compiled(rg, "glslangValidator");
}

/* ---- random kernels
 * ------------------------------------------------------------------------------ */

typedef struct rng {
    uint64_t s;
} rng;

static uint32_t rnd(rng *r, uint32_t n)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return n ? (uint32_t)((r->s >> 11) % n) : 0;
}

static const unsigned widths[] = {1, 1, 1, 2, 3, 4, 5, 8, 16};

static em_type random_type(rng *r)
{
    return em_line(all_kinds[rnd(r, NKINDS)], widths[rnd(r, sizeof widths / sizeof widths[0])]);
}

typedef struct pool {
    em_ir_val v[96];
    size_t n;
} pool;

static void pool_add(pool *p, em_ir_val v)
{
    if (v && p->n < sizeof p->v / sizeof p->v[0]) p->v[p->n++] = v;
}

static em_type vtype(em_ir_kernel *k, em_ir_val v)
{
    return em_ir_value_at(k, v)->type;
}

/* A pooled value of kind s whose width suits a (equal, or a scalar); else a constant. */
static em_ir_val partner(em_ir_kernel *k, rng *r, pool *p, em_type t)
{
    for (int tries = 0; tries < 8; tries++) {
        em_ir_val v = p->v[rnd(r, (uint32_t)p->n)];
        em_type u = vtype(k, v);
        if (u.scalar == t.scalar && (u.lanes == t.lanes || u.lanes == 1)) return v;
    }
    if (t.scalar == EM_BOOL) return em_ir_const_bool(k, rnd(r, 2));
    if (em_scalar_is_float(t.scalar))
        return em_ir_const_float(k, em_ty(t.scalar), (double)rnd(r, 100) / 8 - 3);
    return em_ir_const_int(k, em_ty(t.scalar),
                           (int64_t)rnd(r, 50) - (em_scalar_is_signed(t.scalar) ? 25 : 0));
}

static em_ir_val random_op(em_ir_kernel *k, rng *r, pool *p, em_ir_mem *outs, size_t *nouts)
{
    em_ir_val a = p->v[rnd(r, (uint32_t)p->n)];
    em_type t = vtype(k, a);
    em_scalar s = (em_scalar)t.scalar;
    bool fl = em_scalar_is_float(s), bl = s == EM_BOOL;
    static const em_ir_op fbin[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                    EM_OP_REM, EM_OP_MIN, EM_OP_MAX, EM_OP_POW};
    static const em_ir_op ibin[] = {EM_OP_ADD, EM_OP_SUB, EM_OP_MUL, EM_OP_DIV,
                                    EM_OP_REM, EM_OP_MIN, EM_OP_MAX, EM_OP_AND,
                                    EM_OP_OR,  EM_OP_XOR, EM_OP_SHL, EM_OP_SHR};
    static const em_ir_op bbin[] = {EM_OP_AND, EM_OP_OR, EM_OP_XOR, EM_OP_EQ, EM_OP_NE};
    static const em_ir_op fun[] = {EM_OP_NEG,   EM_OP_ABS,  EM_OP_EXP,   EM_OP_EXP2, EM_OP_LOG,
                                   EM_OP_LOG2,  EM_OP_SQRT, EM_OP_RSQRT, EM_OP_ERF,  EM_OP_TANH,
                                   EM_OP_SIN,   EM_OP_COS,  EM_OP_FLOOR, EM_OP_CEIL, EM_OP_ROUND,
                                   EM_OP_ISNAN, EM_OP_ISINF};
    static const em_ir_op iun[] = {EM_OP_NEG,      EM_OP_NOT, EM_OP_ABS,
                                   EM_OP_POPCOUNT, EM_OP_CLZ, EM_OP_CTZ};
    static const em_ir_op cmp[] = {EM_OP_EQ, EM_OP_NE, EM_OP_LT, EM_OP_LE, EM_OP_GT, EM_OP_GE};
    static const em_ir_op plane_num[] = {EM_OP_PLANE_SUM,           EM_OP_PLANE_PROD,
                                         EM_OP_PLANE_MIN,           EM_OP_PLANE_MAX,
                                         EM_OP_PLANE_INCLUSIVE_SUM, EM_OP_PLANE_EXCLUSIVE_SUM};
    static const em_ir_op plane_any[] = {EM_OP_PLANE_BROADCAST, EM_OP_PLANE_SHUFFLE,
                                         EM_OP_PLANE_SHUFFLE_XOR, EM_OP_PLANE_SHUFFLE_UP,
                                         EM_OP_PLANE_SHUFFLE_DOWN};
#define PICK(arr) arr[rnd(r, sizeof arr / sizeof arr[0])]
    switch (rnd(r, 11)) {
    case 0:
        if (bl) return em_ir_binary(k, PICK(bbin), a, partner(k, r, p, t));
        return em_ir_binary(k, fl ? PICK(fbin) : PICK(ibin), a, partner(k, r, p, t));
    case 1:
        return em_ir_binary(k, bl ? EM_OP_NE : PICK(cmp), a, partner(k, r, p, t));
    case 2:
        if (bl) return em_ir_unary(k, EM_OP_NOT, a);
        return em_ir_unary(k, fl ? PICK(fun) : PICK(iun), a);
    case 3: {
        em_ir_val b = partner(k, r, p, t), c = partner(k, r, p, t);
        if (fl && rnd(r, 2)) return em_ir_ternary(k, EM_OP_FMA, a, b, c);
        if (!bl && rnd(r, 2)) return em_ir_ternary(k, EM_OP_CLAMP, a, b, c);
        em_ir_val cond = partner(k, r, p, em_line(EM_BOOL, t.lanes));
        return em_ir_ternary(k, EM_OP_SELECT, cond, a, b);
    }
    case 4:
        return em_ir_cast(k, em_line(all_kinds[rnd(r, NKINDS)], t.lanes), a);
    case 5: {
        if (bl) return em_ir_cast(k, em_line(EM_U8, t.lanes), a);
        size_t bits = em_scalar_size(s) * 8 * t.lanes;
        for (int tries = 0; tries < 8; tries++) {
            em_scalar to = all_kinds[1 + rnd(r, NKINDS - 1)];
            size_t w = em_scalar_size(to) * 8;
            if (bits % w == 0 && bits / w >= 1 && bits / w <= 16)
                return em_ir_bitcast(k, em_line(to, (unsigned)(bits / w)), a);
        }
        return em_ir_bitcast(k, t, a);
    }
    case 6: {
        if (t.lanes == 1) return em_ir_cast(k, em_line(s, 2 + rnd(r, 3)), a);
        em_ir_val lane =
            rnd(r, 2) ? u32c(k, rnd(r, t.lanes))
                      : em_ir_binary(k, EM_OP_REM, em_ir_builtin(k, EM_UNIT_POS), u32c(k, t.lanes));
        if (rnd(r, 2)) return em_ir_extract(k, a, lane);
        return em_ir_insert(k, a, lane, partner(k, r, p, em_ty(s)));
    }
    case 7:
        if (bl && t.lanes == 1 && rnd(r, 2))
            return em_ir_plane(k,
                               rnd(r, 3) == 0 ? EM_OP_PLANE_BALLOT
                               : rnd(r, 2)    ? EM_OP_PLANE_ALL
                                              : EM_OP_PLANE_ANY,
                               a, 0);
        if (!bl && rnd(r, 2)) return em_ir_plane(k, PICK(plane_num), a, 0);
        return em_ir_plane(k, PICK(plane_any), a, u32c(k, rnd(r, 4)));
    case 8: { /* a branch that stores inside */
        em_ir_val cond =
            em_ir_binary(k, EM_OP_LT, em_ir_builtin(k, EM_UNIT_POS), u32c(k, rnd(r, 64)));
        em_ir_if_begin(k, cond);
        em_ir_val x = bl ? em_ir_unary(k, EM_OP_NOT, a) : em_ir_unary(k, EM_OP_NEG, a);
        if (*nouts < 32) {
            outs[*nouts] = em_ir_param_buffer(k, "side", t, EM_WRITE, 1);
            em_ir_store(k, outs[(*nouts)++], em_ir_builtin(k, EM_ABSOLUTE_POS), x);
        }
        if (rnd(r, 2)) {
            em_ir_else(k);
            em_ir_return(k);
        }
        em_ir_end(k);
        return 0;
    }
    case 9: { /* an accumulating loop */
        em_ir_val acc = em_ir_var(k, t, "acc"), i = em_ir_var(k, em_ty(EM_U32), "i");
        em_ir_assign(k, acc, a);
        em_ir_range_begin(k, i, u32c(k, 0),
                          em_ir_binary(k, EM_OP_AND, em_ir_builtin(k, EM_UNIT_POS), u32c(k, 3)),
                          u32c(k, 1), rnd(r, 2));
        em_ir_assign(k, acc,
                     bl ? em_ir_binary(k, EM_OP_XOR, acc, a) : em_ir_binary(k, EM_OP_ADD, acc, a));
        em_ir_end(k);
        return acc;
    }
    default: { /* memory: shared or local round trip */
        em_ir_mem m = rnd(r, 2) ? em_ir_shared(k, "sh", t, 64) : em_ir_local(k, "loc", t, 4);
        em_ir_val idx = u32c(k, rnd(r, 4));
        em_ir_store(k, m, idx, a);
        return em_ir_load(k, m, idx);
    }
    }
#undef PICK
}

static em_ir_kernel *random_kernel(rng *r, int id)
{
    char name[32];
    snprintf(name, sizeof name, "random%d", id);
    em_ir_kernel *k = em_ir_kernel_new(name);
    pool p = {.n = 0};
    em_ir_mem outs[40];
    size_t nouts = 0;
    em_ir_val pos = em_ir_builtin(k, EM_ABSOLUTE_POS);
    pool_add(&p, pos);
    for (int i = 0; i < 3; i++) {
        em_ir_mem in = em_ir_param_buffer(k, "in", random_type(r), EM_READ, 1);
        pool_add(&p, em_ir_load(k, in, pos));
    }
    pool_add(&p, em_ir_param_scalar(k, "s", em_ty(all_kinds[rnd(r, NKINDS)])));
    for (int step = 0; step < 30; step++) pool_add(&p, random_op(k, r, &p, outs, &nouts));
    for (int i = 0; i < 4; i++) {
        em_ir_val v = p.v[p.n - 1 - (size_t)rnd(r, (uint32_t)(p.n < 8 ? p.n : 8))];
        em_ir_mem out = em_ir_param_buffer(k, "out", vtype(k, v), EM_WRITE, 1);
        em_ir_store(k, out, pos, v);
    }
    return k;
}

/* Random verified kernels: every generator returns code or an error, and what it returns compiles.
 */
static void test_random_kernels(void **state)
{
    (void)state;
    enum { N = 40 };
    rng r = {0x9E3779B97F4A7C15ull};
    em_ir_kernel *ks[N];
    for (int i = 0; i < N; i++) {
        em_ir_kernel *k = random_kernel(&r, i);
        if (em_ir_verify(k, 0) != EM_OK) {
            char *text = em_ir_print_kernel(k);
            print_message("random kernel %d does not verify: %s\n%s\n", i, em_last_error(), text);
            free(text);
        }
        ks[i] = prepare(k);
    }
    em_caps cuda = caps_for("cuda", true, 32), cl = caps_for("opencl", false, 1),
            cl32 = caps_for("opencl", true, 32);
    em_caps glsl = caps_for("glsl", true, 32);
    char *cu = gen_cuda(ks, N, &cuda), *c1 = gen_opencl(ks, N, &cl),
         *c32 = gen_opencl(ks, N, &cl32);
    assert_non_null(cu);
    assert_non_null(c1);
    assert_non_null(c32);
    /* GLSL rejects f64 transcendentals: keep the kernels it takes, check the others say why */
    em_ir_kernel *ok[N];
    size_t nok = 0;
    for (int i = 0; i < N; i++) {
        char *one = em_codegen_glsl((const em_ir_kernel *const *)&ks[i], 1, &glsl);
        if (one)
            ok[nok++] = ks[i];
        else
            assert_non_null(strstr(em_last_error(), "GLSL: kernel random"));
        free(one);
    }
    assert_true(nok > N / 2);
    char *gl = gen_glsl(ok, nok, &glsl);
    assert_non_null(gl);
    int rcu = compile_cuda(cu, "random.cu"),
        rc1 = compile_opencl_clang(c1, "CL1.2", "-w", "random_12");
    char flags[512];
    snprintf(flags, sizeof flags, "-w %s", subgroup_macros);
    int rc32 = compile_opencl_clang(c32, "CL2.0", flags, "random_20");
    int rdrv = compile_opencl_driver(c1, "random"), rgl = compile_glsl(gl, "random");
    free(cu);
    free(c1);
    free(c32);
    free(gl);
    free_all(ks, N);
    print_message("random kernels: %zu of %d taken by GLSL\n", nok, N);
    expect_compiled(rcu, "NVRTC");
    expect_compiled(rc1, "clang (OpenCL C 1.2)");
    expect_compiled(rc32, "clang (OpenCL C 2.0)");
    expect_compiled(rdrv, "an OpenCL platform (libOpenCL.so.1)");
    expect_compiled(rgl, "glslangValidator");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_all_ops),
        cmocka_unit_test(test_cuda_header_free_and_dynamic_smem),
        cmocka_unit_test(test_cuda_programmatic_dependent_launch),
        cmocka_unit_test(test_opencl_all_ops),
        cmocka_unit_test(test_opencl_subgroups),
        cmocka_unit_test(test_glsl_all_ops),
        cmocka_unit_test(test_glsl_plane_one_and_matrix),
        cmocka_unit_test(test_rejections_name_instruction_and_target),
        cmocka_unit_test(test_parameter_abi),
        cmocka_unit_test(test_random_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
