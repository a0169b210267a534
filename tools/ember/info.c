/* info.c — `ember info`: every backend this build knows, the devices this machine has for it
 * (with their capabilities), or why the backend is unavailable; and the kernel cache in use.
 * `ember info --check` also compiles a small kernel (saxpy, built with the IR builder) for every
 * device, runs it and checks the result against the host: a smoke test of the whole kernel path
 * (IR, code generation, system compiler or driver JIT, cache, launch), used by `make demo`.
 *
 * Each device is opened in a process of its own (this program run as `ember info --device NAME`),
 * so that a driver that crashes while opening or running its device (PoCL did, on the H200
 * machine, in a process that had the NVIDIA libraries loaded) is reported as such and the other
 * devices are still listed. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "ember/runtime.h"
#include "cli.h"

extern char **environ;

static void print_bytes(const char *label, uint64_t bytes)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    if (bytes == 0)
        printf("%sunknown", label);
    else
        printf("%s%.*f %s", label, u ? 1 : 0, v, units[u]);
}

static void print_caps(const char *name, const em_caps *c)
{
    printf("\n%s: %s\n", name, c->device_name);
    printf("  target %s, arch %s, %u compute units", c->target, c->arch, c->compute_units);
    print_bytes(", memory ", c->memory_total);
    printf("\n  cubes of up to %u units (%u x %u x %u), plane size %u", c->max_cube_units,
           c->max_cube_dim[0], c->max_cube_dim[1], c->max_cube_dim[2], c->plane_dim);
    print_bytes(", shared memory ", c->max_shared);
    printf("\n  dtypes:");
    for (int s = 0; s < EM_SCALAR_COUNT; s++)
        if (c->dtype[s])
            printf(" %s", em_scalar_name((em_scalar)s));
    bool loops = !c->plane_ops || c->plane_dim <= 1; /* matrix ops as loops (one unit per plane) */
    const char *mma = c->matrix ? "yes" : loops ? "no (lowered to loops)" : "no";
    printf("\n  f32 atomic add %s, plane ops %s, matrix units %s, print %s\n",
           c->float_atomic_add ? "yes" : "no", c->plane_ops ? "yes" : "no", mma,
           c->print ? "yes" : "no");
    if (c->matrix_api[0]) {
        printf("  matrix units through %s:", c->matrix_api);
        for (uint32_t i = 0; i < c->matrix_shape_count && i < EM_CAPS_MATRIX_SHAPES; i++) {
            const em_matrix_shape *x = &c->matrix_shapes[i];
            printf("%s %s x %s + %s -> %s %ux%ux%u", i ? "," : "", em_scalar_name((em_scalar)x->a),
                   em_scalar_name((em_scalar)x->b), em_scalar_name((em_scalar)x->c),
                   em_scalar_name((em_scalar)x->d), x->m, x->n, x->k);
        }
        printf("%s\n", c->matrix_shape_count ? "" : " (no combinations ember can use)");
    }
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* y[i] = a * x[i] + y[i] for i < len(y), with a an f32 parameter. */
static em_ir_kernel *saxpy_kernel(void)
{
    em_ir_kernel *k = em_ir_kernel_new("ember_info_saxpy");
    if (!k)
        return NULL;
    em_ir_mem x = em_ir_param_buffer(k, "x", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem y = em_ir_param_buffer(k, "y", em_ty(EM_F32), EM_READ_WRITE, 0);
    em_ir_val a = em_ir_param_scalar(k, "a", em_ty(EM_F32));
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, y)));
    em_ir_val ax = em_ir_binary(k, EM_OP_MUL, a, em_ir_load(k, x, i));
    em_ir_store(k, y, i, em_ir_binary(k, EM_OP_ADD, ax, em_ir_load(k, y, i)));
    em_ir_end(k);
    return k;
}

/* Compiles and runs saxpy on dev and compares with the host. Returns 0 when right, 2 when the
 * device's code generator is not built yet (skipped), 1 on any other failure. */
static int check_device(em_device *dev)
{
    const uint32_t n = 1000003;
    const float a = 1.5f;
    const char *name = em_device_name(dev);
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    em_ir_kernel *ir = saxpy_kernel();
    em_buffer *bx = em_buffer_alloc(dev, n * sizeof(float));
    em_buffer *by = em_buffer_alloc(dev, n * sizeof(float));
    int rc = 1;
    if (!x || !y || !out || !ir || !bx || !by) {
        printf("  %-10s FAILED: %s\n", name, em_last_error());
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        x[i] = (float)(i % 1000) * 0.25f;
        y[i] = (float)(i % 7) - 3.0f;
    }
    em_cache_stats before, after;
    em_cache_stats_get(&before);
    double t0 = now_seconds();
    em_kernel *k = em_kernel_compile(dev, ir);
    double t1 = now_seconds();
    em_cache_stats_get(&after);
    if (!k) {
        bool unbuilt = em_last_status() == EM_ERR_UNSUPPORTED;
        printf("  %-10s %s: %s\n", name, unbuilt ? "skipped" : "FAILED to compile",
               em_last_error());
        rc = unbuilt ? 2 : 1;
        goto done;
    }
    const uint32_t units = 256;
    uint32_t count[3] = {(n + units - 1) / units, 1, 1}, dim[3] = {units, 1, 1};
    em_arg args[3] = {em_arg_buffer(bx, n), em_arg_buffer(by, n), em_arg_f32(a)};
    em_timer timer;
    double run = -1;
    if (em_buffer_write(bx, 0, x, n * sizeof(float)) != EM_OK ||
        em_buffer_write(by, 0, y, n * sizeof(float)) != EM_OK ||
        em_timer_start(&timer, dev) != EM_OK || em_launch(k, count, dim, args, 3) != EM_OK ||
        (run = em_timer_stop(&timer)) < 0 || em_buffer_read(by, 0, out, n * sizeof(float)) != EM_OK) {
        printf("  %-10s FAILED to run: %s\n", name, em_last_error());
        goto done;
    }
    double worst = 0;
    for (uint32_t i = 0; i < n; i++) {
        double want = (double)(a * x[i]) + (double)y[i];
        double err = fabs((double)out[i] - want) / (1.0 + fabs(want));
        if (!(err <= worst)) /* catches NaN too */
            worst = isnan(err) ? INFINITY : err;
    }
    const char *how = after.compiles > before.compiles  ? "compiled"
                      : after.disk_hits > before.disk_hits ? "from the disk cache"
                                                           : "from memory";
    rc = worst <= 1e-6 ? 0 : 1;
    printf("  %-10s saxpy over %u floats: %s (max relative error %.1e); kernel %s in %.1f ms, "
           "run in %.2f ms\n",
           name, n, rc ? "WRONG" : "ok", worst, how, (t1 - t0) * 1e3, run * 1e3);
done:
    em_buffer_free(bx);
    em_buffer_free(by);
    em_ir_kernel_free(ir);
    free(x);
    free(y);
    free(out);
    return rc;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: ember info [--check] [--device NAME]\n\n"
                 "Lists every backend ember knows (cpu, cuda, opencl, vulkan), the devices this\n"
                 "machine has for each with their capabilities, or why a backend is unavailable;\n"
                 "then the kernel cache directory in use. Each device is opened in a process of\n"
                 "its own, so a driver that crashes is reported and the others are still shown.\n\n"
                 "  --check        also compile and run a small kernel (saxpy) on every device and\n"
                 "                 check its result; exit status 1 when any device fails\n"
                 "  --device NAME  only this device (cpu, cuda:0, ...), in this process; exit\n"
                 "                 status 0, 1 when it fails, 3 when --check skipped it\n");
}

enum { DEV_OK = 0, DEV_FAILED = 1, DEV_SKIPPED = 2 };

/* One device's part of the report, in this process: its capabilities, or with check its check
 * line. DEV_OK, DEV_FAILED or (check) DEV_SKIPPED. */
static int one_device(const char *name, bool check)
{
    /* fault injection for tests/cli/test_info_cli.c: a "driver" crashing on this device */
    const char *crash = getenv("EMBER_INFO_CRASH");
    if (crash && strcmp(crash, name) == 0) {
        printf("%s: opening\n", name);
        fflush(stdout);
        raise(SIGABRT); /* not SIGSEGV: AddressSanitizer would turn that into an exit */
    }
    em_device *dev = em_device_open(name);
    if (!dev) {
        if (check)
            printf("  %-10s FAILED to open: %s\n", name, em_last_error());
        else
            printf("\n%s: cannot open: %s\n", name, em_last_error());
        return DEV_FAILED;
    }
    int rc = DEV_OK;
    if (check)
        rc = check_device(dev);
    else
        print_caps(em_device_name(dev), em_device_caps(dev));
    em_device_close(dev);
    return rc;
}

/* Reads fd to its end into a malloc'd string (NULL when out of memory). */
static char *read_fd(int fd)
{
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) {
                free(buf);
                return NULL;
            }
            buf = bigger;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    if (buf) buf[len] = '\0';
    return buf;
}

/* one_device in a child process (`ember info --device NAME [--check]`), its output copied here;
 * a child killed by a signal is reported as a driver crash. In this process when no child can be
 * started. */
static int isolated_device(const char *name, bool check)
{
    int fd[2];
    fflush(stdout);
    if (pipe(fd) != 0) return one_device(name, check);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 2);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    char *args[] = {"ember", "info", "--device", (char *)name, check ? "--check" : NULL, NULL};
    pid_t pid;
    int e = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (e != 0) {
        close(fd[0]);
        return one_device(name, check);
    }
    char *out = read_fd(fd[0]);
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    /* what the child printed before a crash handler's backtrace */
    char *crash = out ? strstr(out, "ember: crashed") : NULL;
    if (crash) *crash = '\0';
    if (out) fputs(out, stdout);
    free(out);
    if (WIFEXITED(st) && !crash) {
        int code = WEXITSTATUS(st);
        return code == 0 ? DEV_OK : code == 3 ? DEV_SKIPPED : DEV_FAILED;
    }
    int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    if (check)
        printf("  %-10s FAILED: its driver crashed (%s)\n", name, sig ? strsignal(sig) : "abort");
    else
        printf("\n%s: its driver crashed while opening the device (%s); the device is unusable in "
               "this environment (`ember info --device %s` runs it alone)\n",
               name, sig ? strsignal(sig) : "abort", name);
    return DEV_FAILED;
}

int em_cli_info(int argc, char **argv)
{
    bool check = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--check") == 0) {
            check = true;
            continue;
        }
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            only = argv[++i];
            continue;
        }
        fprintf(stderr, "ember info: unexpected argument '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    if (only) {
        int rc = one_device(only, check);
        return rc == DEV_OK ? 0 : rc == DEV_SKIPPED ? 3 : 1;
    }
    em_backend_info backends[16];
    size_t n = em_backend_list(backends, 16);
    if (n > 16)
        n = 16;
    printf("backends:\n");
    for (size_t i = 0; i < n; i++) {
        if (backends[i].device_count > 0)
            printf("  %-8s %d device%s\n", backends[i].name, backends[i].device_count,
                   backends[i].device_count == 1 ? "" : "s");
        else
            printf("  %-8s unavailable: %s\n", backends[i].name, backends[i].why);
    }
    int status = 0;
    for (size_t i = 0; i < n; i++) {
        for (int d = 0; d < backends[i].device_count; d++) {
            char name[64];
            if (strcmp(backends[i].name, "cpu") == 0)
                snprintf(name, sizeof(name), "cpu");
            else
                snprintf(name, sizeof(name), "%s:%d", backends[i].name, d);
            if (isolated_device(name, false) != DEV_OK) status = 1;
        }
    }
    const char *dir = em_cache_dir();
    printf("\nkernel cache: %s\n", dir ? dir : em_last_error());
    if (!check)
        return status;
    printf("\nchecking every device:\n");
    int passed = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < n; i++) {
        for (int d = 0; d < backends[i].device_count; d++) {
            char name[64];
            if (strcmp(backends[i].name, "cpu") == 0)
                snprintf(name, sizeof(name), "cpu");
            else
                snprintf(name, sizeof(name), "%s:%d", backends[i].name, d);
            int rc = isolated_device(name, true);
            passed += rc == DEV_OK;
            failed += rc == DEV_FAILED;
            skipped += rc == DEV_SKIPPED;
        }
    }
    printf("%d device%s passed, %d failed, %d skipped\n", passed, passed == 1 ? "" : "s", failed,
           skipped);
    return failed || !passed ? 1 : status;
}
