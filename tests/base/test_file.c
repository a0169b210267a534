/* test_file.c — files: whole reads (and the message for a missing file), atomic writes (replace,
 * failures that leave the old file and no temp file: unwritable directory, a write cut short by
 * RLIMIT_FSIZE, a rename onto a directory), mkdir -p, writability, mmap, the file lock against a
 * second process, temp dirs and tree removal. Every test works in its own temp dir. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"

#define NOBODY_UID 65534

/* Each test gets a fresh directory under EMBER_TEST_TMP, removed afterwards. */
static int setup_dir(void **state)
{
    if (em_mkdir_p(EMBER_TEST_TMP) != EM_OK) return -1;
    setenv("TMPDIR", EMBER_TEST_TMP, 1);
    char *dir = malloc(PATH_MAX);
    if (!dir || em_temp_dir("ember-test-file", dir, PATH_MAX) != EM_OK) {
        free(dir);
        return -1;
    }
    *state = dir;
    return 0;
}

static int teardown_dir(void **state)
{
    em_remove_tree(*state);
    free(*state);
    return 0;
}

static void path_in(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
    assert_true(n > 0 && n < PATH_MAX);
}

/* Number of entries in dir other than . and .. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void assert_file_is(const char *path, const char *want)
{
    size_t len = 0;
    char *got = em_file_read(path, &len);
    assert_non_null(got);
    assert_int_equal(len, strlen(want));
    assert_string_equal(got, want);
    free(got);
}

static void test_read_missing(void **state)
{
    char path[PATH_MAX];
    path_in(path, *state, "no-such-file.txt");
    em_clear_error();
    size_t len = 123;
    assert_null(em_file_read(path, &len));
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_last_error(), path));
    assert_non_null(strstr(em_last_error(), strerror(ENOENT)));
    assert_false(em_file_exists(path));
}

static void test_read_directory_fails(void **state)
{
    em_clear_error();
    assert_null(em_file_read(*state, NULL));
    assert_int_equal(em_last_status(), EM_ERR_IO);
    assert_non_null(strstr(em_last_error(), (char *)*state));
}

static void test_write_and_replace(void **state)
{
    char path[PATH_MAX];
    path_in(path, *state, "data.txt");
    assert_int_equal(em_file_write_atomic(path, "first version", 13), EM_OK);
    assert_true(em_file_exists(path));
    assert_file_is(path, "first version");
    assert_int_equal(em_file_write_atomic(path, "second", 6), EM_OK);
    assert_file_is(path, "second");
    assert_int_equal(em_file_write_atomic(path, "", 0), EM_OK);
    assert_file_is(path, "");
    assert_int_equal(count_entries(*state), 1); /* no temp file left behind */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);

    /* a big file, read back exactly (binary, with NULs) */
    size_t n = 3u << 20;
    unsigned char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 131 + (i >> 9));
    assert_int_equal(em_file_write_atomic(path, big, n), EM_OK);
    size_t len = 0;
    char *back = em_file_read(path, &len);
    assert_int_equal(len, n);
    assert_memory_equal(back, big, n);
    assert_int_equal(back[n], '\0');
    free(back);
    free(big);
}

static void test_write_missing_dir(void **state)
{
    char path[PATH_MAX];
    path_in(path, *state, "no/such/dir/file.txt");
    em_clear_error();
    assert_int_not_equal(em_file_write_atomic(path, "x", 1), EM_OK);
    assert_non_null(strstr(em_last_error(), path));
    assert_int_equal(count_entries(*state), 0);
}

/* Runs em_file_write_atomic(path, data) in a child; as root the child drops to nobody first, so
 * that directory permissions apply. Returns the child's exit code: 0 when the write failed with
 * a message naming the path, 1 when it succeeded, 2 when it failed without the path, 3 setup. */
static int failing_write_in_child(const char *path, const char *data, size_t len, rlim_t fsize)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (fsize) {
            struct rlimit rl = {fsize, fsize};
            signal(SIGXFSZ, SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        } else if (geteuid() == 0 && (setgid(NOBODY_UID) != 0 || setuid(NOBODY_UID) != 0)) {
            _exit(3);
        }
        if (em_file_write_atomic(path, data, len) == EM_OK) _exit(1);
        _exit(strstr(em_last_error(), path) ? 0 : 2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static void test_failed_write_unwritable_dir(void **state)
{
    /* under /tmp, so that the unprivileged child can reach it */
    char dir[] = "/tmp/ember-test-ro-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[PATH_MAX];
    path_in(path, dir, "keep.txt");
    assert_int_equal(em_file_write_atomic(path, "old contents", 12), EM_OK);
    assert_int_equal(chmod(dir, 0555), 0);
    assert_false(geteuid() != 0 && em_dir_writable(dir));
    assert_int_equal(failing_write_in_child(path, "new contents", 12, 0), 0);
    assert_file_is(path, "old contents");
    assert_int_equal(count_entries(dir), 1);
    chmod(dir, 0755);
    em_remove_tree(dir);
}

static void test_failed_write_cut_short(void **state)
{
    char path[PATH_MAX];
    path_in(path, *state, "keep.bin");
    assert_int_equal(em_file_write_atomic(path, "old contents", 12), EM_OK);
    static char big[200000];
    memset(big, 'n', sizeof big);
    /* the write stops at 4096 bytes with EFBIG: the temp file must go, the old file stay */
    assert_int_equal(failing_write_in_child(path, big, sizeof big, 4096), 0);
    assert_file_is(path, "old contents");
    assert_int_equal(count_entries(*state), 1);
}

static void test_failed_rename(void **state)
{
    char path[PATH_MAX], inner[PATH_MAX];
    path_in(path, *state, "a-directory");
    assert_int_equal(em_mkdir_p(path), EM_OK);
    path_in(inner, path, "child");
    assert_int_equal(em_file_write_atomic(inner, "x", 1), EM_OK);
    em_clear_error();
    assert_int_not_equal(em_file_write_atomic(path, "data", 4), EM_OK);
    assert_non_null(strstr(em_last_error(), path));
    assert_int_equal(count_entries(*state), 1); /* only the directory: the temp file is gone */
    assert_file_is(inner, "x");
}

static void test_mkdir_p_and_writable(void **state)
{
    char path[PATH_MAX], file[PATH_MAX], below[PATH_MAX];
    path_in(path, *state, "a/b/c/d/");
    assert_int_equal(em_mkdir_p(path), EM_OK);
    assert_int_equal(em_mkdir_p(path), EM_OK); /* existing is fine */
    assert_true(em_dir_writable(path));
    path_in(file, *state, "a/b/file");
    assert_int_equal(em_file_write_atomic(file, "f", 1), EM_OK);
    assert_false(em_dir_writable(file));
    path_in(below, *state, "a/b/file/sub");
    em_clear_error();
    assert_int_not_equal(em_mkdir_p(below), EM_OK);
    assert_non_null(strstr(em_last_error(), file));
    path_in(path, *state, "missing");
    assert_false(em_dir_writable(path));
    assert_int_equal(em_mkdir_p(""), EM_ERR_INVALID);
}

static void test_mmap(void **state)
{
    char path[PATH_MAX];
    path_in(path, *state, "mapped.bin");
    char data[10000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)(i * 7);
    assert_int_equal(em_file_write_atomic(path, data, sizeof data), EM_OK);
    em_mmap m;
    assert_int_equal(em_mmap_open(&m, path), EM_OK);
    assert_int_equal(m.size, sizeof data);
    assert_memory_equal(m.data, data, sizeof data);
    em_mmap_close(&m);
    assert_null(m.data);
    assert_int_equal(m.size, 0);

    assert_int_equal(em_file_write_atomic(path, "", 0), EM_OK);
    assert_int_equal(em_mmap_open(&m, path), EM_OK);
    assert_null(m.data);
    assert_int_equal(m.size, 0);
    em_mmap_close(&m);

    path_in(path, *state, "absent.bin");
    assert_int_equal(em_mmap_open(&m, path), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_last_error(), path));
    assert_int_equal(em_mmap_open(&m, *state), EM_ERR_IO); /* a directory */
}

/* True when fd becomes readable within ms milliseconds. */
static int readable_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

static void test_lock_excludes_other_process(void **state)
{
    char path[PATH_MAX];
    path_in(path, *state, "the.lock");
    em_file_lock lock;
    assert_int_equal(em_file_lock_acquire(&lock, path), EM_OK);
    assert_true(lock.fd >= 0);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) { /* the second process: blocks until the parent releases */
        close(pipefd[0]);
        em_file_lock mine;
        if (em_file_lock_acquire(&mine, path) != EM_OK) _exit(2);
        char c = 'L';
        if (write(pipefd[1], &c, 1) != 1) _exit(3);
        em_file_lock_release(&mine);
        _exit(0);
    }
    close(pipefd[1]);
    assert_false(readable_within(pipefd[0], 300)); /* the child must still be waiting */
    em_file_lock_release(&lock);
    assert_int_equal(lock.fd, -1);
    assert_true(readable_within(pipefd[0], 10000)); /* and gets it once released */
    char c = 0;
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    assert_int_equal(c, 'L');
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    em_file_lock_release(&lock); /* releasing twice is harmless */

    path_in(path, *state, "no/dir/the.lock");
    assert_int_not_equal(em_file_lock_acquire(&lock, path), EM_OK);
    assert_non_null(strstr(em_last_error(), path));
    assert_int_equal(lock.fd, -1);
}

static void test_temp_dir_and_remove_tree(void **state)
{
    char a[PATH_MAX], b[PATH_MAX];
    assert_int_equal(em_temp_dir("ember-tt", a, sizeof a), EM_OK);
    assert_int_equal(em_temp_dir("ember-tt", b, sizeof b), EM_OK);
    assert_string_not_equal(a, b);
    assert_non_null(strstr(a, EMBER_TEST_TMP "/ember-tt-"));
    assert_true(em_dir_writable(a));
    struct stat st;
    assert_int_equal(stat(a, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);

    /* a tree with files, nested dirs and a symlink to something outside it */
    char p[PATH_MAX], outside[PATH_MAX];
    path_in(outside, *state, "outside.txt");
    assert_int_equal(em_file_write_atomic(outside, "stay", 4), EM_OK);
    path_in(p, a, "x/y/z");
    assert_int_equal(em_mkdir_p(p), EM_OK);
    for (int i = 0; i < 20; i++) {
        char name[64];
        snprintf(name, sizeof name, "x/y/file%d", i);
        path_in(p, a, name);
        assert_int_equal(em_file_write_atomic(p, "data", 4), EM_OK);
    }
    path_in(p, a, "x/link");
    assert_int_equal(symlink(outside, p), 0);
    path_in(p, a, "x/dirlink");
    assert_int_equal(symlink(*state, p), 0);
    em_remove_tree(a);
    assert_false(em_file_exists(a));
    assert_file_is(outside, "stay"); /* links are removed, not followed */
    em_remove_tree(a);               /* already gone: harmless */
    em_remove_tree(b);
    assert_false(em_file_exists(b));

    char tiny[8];
    assert_int_equal(em_temp_dir("ember-tt", tiny, sizeof tiny), EM_ERR_INVALID);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_dir, teardown_dir)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_read_missing),
        T(test_read_directory_fails),
        T(test_write_and_replace),
        T(test_write_missing_dir),
        T(test_failed_write_unwritable_dir),
        T(test_failed_write_cut_short),
        T(test_failed_rename),
        T(test_mkdir_p_and_writable),
        T(test_mmap),
        T(test_lock_excludes_other_process),
        T(test_temp_dir_and_remove_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
