/* test_crash_safety.c — a checkpoint writer killed with SIGKILL at a random moment leaves a file
 * that loads, holding either the previous checkpoint or the new one, never a mix or a torn file.
 *
 * A child process writes checkpoints in a loop (em_safetensors_write, the path every checkpoint
 * of ember takes: model, optimizer state and the training counters are tensors and metadata of
 * one safetensors file), version k holding four 1M-element tensors filled with k and the
 * metadata "step" = k. The parent kills it after a random delay, then a second child opens the
 * file and checks that every tensor is filled with the step its metadata names. 24 trials; the
 * delays spread over several write durations so kills land before, during and after renames.
 * The parent opens no device itself (threads and fork do not mix); each child opens its own. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>

#include <cmocka.h>

#include "ember/record.h"
#include "ember/tensor.h"

enum { NTENSORS = 4, NELEM = 1 << 20, TRIALS = 24 };

static char path[1024];

/* Writes versions first, first + 1, ... forever (or `count` of them); exits 2 on any error. */
static void writer(int64_t first, int64_t count)
{
    em_device *dev = em_device_open("cpu");
    if (!dev) _exit(2);
    for (int64_t k = first; count < 0 || k < first + count; k++) {
        em_safetensors_writer *w = em_safetensors_writer_new();
        em_tensor *t[NTENSORS];
        char name[32], step[32];
        snprintf(step, sizeof step, "%lld", (long long)k);
        em_status st = w ? em_safetensors_add_metadata(w, "step", step) : EM_ERR_NOMEM;
        for (int i = 0; i < NTENSORS; i++) {
            t[i] = em_full(dev, EM_F32, EM_SHAPE(NELEM), (double)k);
            snprintf(name, sizeof name, "param.%d", i);
            if (st == EM_OK) st = t[i] ? em_safetensors_add(w, name, t[i]) : EM_ERR_NOMEM;
        }
        if (st == EM_OK) st = em_safetensors_write(w, path);
        em_safetensors_writer_free(w);
        for (int i = 0; i < NTENSORS; i++) em_release(t[i]);
        if (st != EM_OK) {
            fprintf(stderr, "writer: %s\n", em_last_error());
            _exit(2);
        }
    }
    em_device_close(dev);
    _exit(0);
}

/* Exit status 0 when the file loads and is consistent, 1 otherwise (with a message). *step gets
 * the version through a pipe. */
static void verifier(int fd)
{
    em_device *dev = em_device_open("cpu");
    if (!dev) _exit(2);
    em_safetensors *f = em_safetensors_open(path);
    if (!f) {
        fprintf(stderr, "verifier: %s\n", em_last_error());
        _exit(1);
    }
    const char *step = em_safetensors_metadata(f, "step");
    if (!step || em_safetensors_count(f) != NTENSORS) {
        fprintf(stderr, "verifier: step %s, %d tensors\n", step ? step : "(none)",
                em_safetensors_count(f));
        _exit(1);
    }
    float want = (float)atoll(step);
    float *host = malloc(sizeof(float) * NELEM);
    for (int i = 0; i < NTENSORS; i++) {
        char name[32];
        snprintf(name, sizeof name, "param.%d", i);
        em_tensor *t = em_safetensors_load(f, name, dev, EM_SCALAR_COUNT);
        if (!t || em_to_host(t, host, sizeof(float) * NELEM) != EM_OK) {
            fprintf(stderr, "verifier: %s: %s\n", name, em_last_error());
            _exit(1);
        }
        for (int j = 0; j < NELEM; j++)
            if (host[j] != want) {
                fprintf(stderr, "verifier: %s[%d] = %g in a file of step %s\n", name, j, host[j],
                        step);
                _exit(1);
            }
        em_release(t);
    }
    long long k = atoll(step);
    if (write(fd, &k, sizeof k) != sizeof k) _exit(1);
    free(host);
    em_safetensors_close(f);
    em_device_close(dev);
    _exit(0);
}

static int run_child(void (*fn)(int64_t, int64_t), int64_t a, int64_t b)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) fn(a, b);
    return (int)pid;
}

static long long verify(void)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        verifier(fds[1]);
    }
    close(fds[1]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    long long k = -1;
    ssize_t got = read(fds[0], &k, sizeof k);
    close(fds[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != sizeof k)
        fail_msg("the checkpoint after a kill does not load consistently (status %d)", status);
    return k;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_sigkill_during_writes(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "%s/crash_safety.%d.safetensors", EMBER_TEST_TMP, (int)getpid());
    mkdir(EMBER_TEST_TMP, 0755);
    unlink(path);
    /* version 0, written completely, and the time one write takes */
    double t0 = now_s();
    int status = 0;
    pid_t pid = run_child(writer, 0, 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    double one = now_s() - t0;
    assert_int_equal(verify(), 0);

    srand((unsigned)time(NULL));
    long long last = 0;
    int advanced = 0;
    for (int trial = 1; trial <= TRIALS; trial++) {
        pid = run_child(writer, (int64_t)trial * 1000, -1);
        /* between 0 and 3 write durations (the first includes opening a device) */
        double delay = one * 3.0 * (double)rand() / RAND_MAX;
        usleep((useconds_t)(delay * 1e6));
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0));
        long long k = verify();
        /* the previous checkpoint, or one this trial's writer finished */
        if (k != last && (k < trial * 1000LL || k >= trial * 1000LL + 1000000))
            fail_msg("trial %d: the file holds step %lld; expected %lld or a step of this trial",
                     trial, k, last);
        if (k != last) advanced++;
        last = k;
    }
    fprintf(stderr,
            "[crash safety] %d kills (one write %.0f ms): every file loaded whole; %d held a "
            "newer checkpoint, %d the previous one\n",
            TRIALS, one * 1000, advanced, TRIALS - advanced);
    unlink(path);
    /* the temp files of writers killed before their rename (".<name>.tmp-XXXXXX") */
    DIR *d = opendir(EMBER_TEST_TMP);
    const char *base = strrchr(path, '/') + 1;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' && strncmp(e->d_name + 1, base, strlen(base)) == 0) {
            char p[2048];
            snprintf(p, sizeof p, "%s/%s", EMBER_TEST_TMP, e->d_name);
            unlink(p);
        }
    }
    if (d) closedir(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_during_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
