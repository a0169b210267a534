/* rt_util.h — helpers shared by the runtime tests: tiny kernels built with the IR builder,
 * running the f32 "axpb" kernel and checking its result, fresh temporary directories, capturing
 * stderr, and starting this test binary again as a child process (to test what several processes
 * see of the kernel cache). Header-only: each test includes it once. */
#ifndef EM_TEST_RT_UTIL_H
#define EM_TEST_RT_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "ember/kernel.h"
#include "ember/runtime.h"

extern char **environ;

#ifdef cmocka_unit_test
/* Opens `device`, or skips the test (saying why) when this machine has no device of `backend`
 * ("opencl", "vulkan"); fails the test when the backend has devices but the open fails. */
static inline em_device *rt_open_or_skip(const char *backend, const char *device)
{
    em_backend_info info[8];
    size_t n = em_backend_list(info, 8);
    for (size_t i = 0; i < n && i < 8; i++) {
        if (strcmp(info[i].name, backend) == 0 && info[i].device_count == 0) {
            fprintf(stderr, "skipped: no %s device (%s)\n", backend, info[i].why);
            skip();
        }
    }
    em_device *dev = em_device_open(device);
    if (!dev) fail_msg("em_device_open(%s): %s", device, em_last_error());
    return dev;
}
#endif

/* out[i] = a[i] * scale + b[i] for i < len(out): distinct `scale`s give distinct kernels. */
static inline em_ir_kernel *rt_kernel_axpb(const char *name, double scale)
{
    em_ir_kernel *k = em_ir_kernel_new(name);
    if (!k)
        return NULL;
    em_ir_mem a = em_ir_param_buffer(k, "a", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem b = em_ir_param_buffer(k, "b", em_ty(EM_F32), EM_READ, 0);
    em_ir_mem out = em_ir_param_buffer(k, "out", em_ty(EM_F32), EM_WRITE, 0);
    em_ir_val i = em_ir_builtin(k, EM_ABSOLUTE_POS);
    em_ir_if_begin(k, em_ir_binary(k, EM_OP_LT, i, em_ir_len(k, out)));
    em_ir_val x = em_ir_load(k, a, i);
    em_ir_val y = em_ir_load(k, b, i);
    em_ir_val s = em_ir_const_float(k, em_ty(EM_F32), scale);
    em_ir_store(k, out, i, em_ir_binary(k, EM_OP_ADD, em_ir_binary(k, EM_OP_MUL, x, s), y));
    em_ir_end(k);
    return k;
}

/* Allocates a, b, out of n floats, runs kern (an axpb of `scale`) over them and checks every
 * output. Returns 0 when all is right, else -1 (and prints what went wrong). */
static inline int rt_run_axpb(em_device *dev, em_kernel *kern, double scale, uint32_t n)
{
    size_t bytes = (size_t)n * sizeof(float);
    float *ha = malloc(bytes), *hb = malloc(bytes), *ho = malloc(bytes);
    em_buffer *a = em_buffer_alloc(dev, bytes), *b = em_buffer_alloc(dev, bytes);
    em_buffer *out = em_buffer_alloc(dev, bytes);
    int rc = -1;
    if (!ha || !hb || !ho || !a || !b || !out) {
        fprintf(stderr, "rt_run_axpb: allocation failed: %s\n", em_last_error());
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        ha[i] = (float)i * 0.5f;
        hb[i] = (float)(n - i);
    }
    em_buffer_write(a, 0, ha, bytes);
    em_buffer_write(b, 0, hb, bytes);
    em_buffer_fill_zero(out);
    em_arg args[3] = {em_arg_buffer(a, n), em_arg_buffer(b, n), em_arg_buffer(out, n)};
    uint32_t dim[3] = {64, 1, 1}, count[3] = {(n + 63) / 64, 1, 1};
    if (em_launch(kern, count, dim, args, 3) != EM_OK) {
        fprintf(stderr, "rt_run_axpb: launch failed: %s\n", em_last_error());
        goto done;
    }
    em_buffer_read(out, 0, ho, bytes);
    rc = 0;
    for (uint32_t i = 0; i < n; i++) {
        float want = (float)((double)ha[i] * (float)scale + hb[i]);
        if (fabsf(ho[i] - want) > 1e-4f * (1.0f + fabsf(want))) {
            fprintf(stderr, "rt_run_axpb: out[%u] = %g, want %g\n", i, ho[i], want);
            rc = -1;
            break;
        }
    }
done:
    em_buffer_free(a);
    em_buffer_free(b);
    em_buffer_free(out);
    free(ha);
    free(hb);
    free(ho);
    return rc;
}

/* A fresh directory under the build's test-tmp (or $TMPDIR), written into out. */
static inline void rt_fresh_dir(const char *prefix, char *out, size_t size)
{
    const char *base = EMBER_TEST_TMP;
    em_mkdir_p(base);
    snprintf(out, size, "%s/%s-XXXXXX", base, prefix);
    if (!mkdtemp(out)) {
        snprintf(out, size, "/tmp/%s-XXXXXX", prefix);
        if (!mkdtemp(out))
            out[0] = '\0';
    }
}

/* Writes an executable shell script. */
static inline void rt_write_script(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    chmod(path, 0755);
}

/* Counts the files in dir whose names end in `suffix`. */
static inline int rt_count_files(const char *dir, const char *suffix)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "ls -1 '%s' 2>/dev/null | grep -c -- '%s$'", dir, suffix);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

/* Starts this test binary again with args (NULL-terminated), in a new process group when asked.
 * Returns the pid, or -1. */
static inline pid_t rt_spawn_self(const char *const *args, bool new_group)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return -1;
    exe[n] = '\0';
    char *argv[16];
    size_t argc = 0;
    argv[argc++] = exe;
    for (size_t i = 0; args[i] && argc < 15; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    if (new_group) {
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attr, 0);
    }
    pid_t pid;
    int err = posix_spawn(&pid, exe, NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    return err ? -1 : pid;
}

/* Waits for a child: its exit code, or 128 + signal. */
static inline int rt_wait(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

/* Redirects stderr into a temp file until rt_stderr_end, which returns what was written
 * (malloc'd). */
typedef struct rt_capture {
    int saved;      /* the original stderr */
    char path[256]; /* the temp file */
} rt_capture;

static inline void rt_stderr_begin(rt_capture *c)
{
    fflush(stderr);
    snprintf(c->path, sizeof(c->path), "/tmp/ember-test-stderr-XXXXXX");
    int fd = mkstemp(c->path);
    c->saved = dup(2);
    dup2(fd, 2);
    close(fd);
}

static inline char *rt_stderr_end(rt_capture *c)
{
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    char *text = em_file_read(c->path, NULL);
    unlink(c->path);
    return text ? text : strdup("");
}

#endif
