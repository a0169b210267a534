/* file.c — file system helpers: whole-file reads, atomic writes, directories, memory maps,
 * advisory locks, temp dirs and tree removal. Every failure sets the error with the path and
 * strerror(errno); a missing file gives EM_ERR_NOT_FOUND, other failures EM_ERR_IO.
 *
 * An atomic write goes to a temp file next to the target (".<name>.tmp-XXXXXX", made by
 * mkostemp), which is written in full, fsync'd, renamed over the target, and followed by an fsync
 * of the directory; on any failure the temp file is unlinked and the target left as it was. */
#include "base/file.h"
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NEW_FILE_MODE 0644 /* mode of files created by em_file_write_atomic */

/* Sets the error for a failed call on path, from errno; returns the status. */
static em_status file_error(const char *what, const char *path)
{
    int err = errno;
    em_status status = err == ENOENT ? EM_ERR_NOT_FOUND : EM_ERR_IO;
    return em_set_error(status, "%s %s: %s", what, path, strerror(err));
}

/* read() of up to len bytes, retried on EINTR. */
static ssize_t read_retry(int fd, void *buf, size_t len)
{
    ssize_t n;
    do n = read(fd, buf, len);
    while (n < 0 && errno == EINTR);
    return n;
}

/* Writes all of data to fd; false (errno set) on failure. */
static bool write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* Reads fd to its end into a growing buffer that starts at `cap` bytes. */
static char *read_to_end(int fd, size_t cap, size_t *len, const char *path)
{
    size_t used = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            em_set_error(EM_ERR_NOMEM, "cannot read %s: out of memory", path);
            return NULL;
        }
        ssize_t n = read_retry(fd, buf + used, cap - used - 1);
        if (n < 0) {
            file_error("cannot read", path);
            free(buf);
            return NULL;
        }
        if (n == 0) break;
        used += (size_t)n;
        if (cap - used == 1) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) free(buf);
            buf = bigger;
            cap *= 2;
        }
    }
    buf[used] = '\0';
    if (len) *len = used;
    return buf;
}

char *em_file_read(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        file_error("cannot open", path);
        return NULL;
    }
    struct stat st;
    size_t cap = 4096;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size >= cap)
        cap = (size_t)st.st_size + 2; /* +1 for the NUL, +1 to see the end without growing */
    char *buf = read_to_end(fd, cap, len, path);
    close(fd);
    return buf;
}

bool em_file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The directory part of path, in out (PATH_MAX bytes). */
static em_status dir_of(const char *path, char *out)
{
    char copy[PATH_MAX];
    if (snprintf(copy, sizeof copy, "%s", path) >= (int)sizeof copy)
        return em_set_error(EM_ERR_INVALID, "path too long: %.200s...", path);
    snprintf(out, PATH_MAX, "%s", dirname(copy));
    return EM_OK;
}

/* Fsyncs a directory, so that a rename in it is durable. File systems that cannot (EINVAL) pass. */
static em_status sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return file_error("cannot open directory", dir);
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc == 0 || err == EINVAL) return EM_OK;
    errno = err;
    return file_error("cannot sync directory", dir);
}

/* The mode for the new file: the old file's mode when it exists, else NEW_FILE_MODE. */
static mode_t target_mode(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) return st.st_mode & 07777;
    return NEW_FILE_MODE;
}

/* Writes, syncs and closes the temp file fd; the error names the target path. */
static em_status fill_temp(int fd, const char *path, const void *data, size_t len)
{
    em_status status = EM_OK;
    if (fchmod(fd, target_mode(path)) != 0) status = file_error("cannot set the mode of", path);
    if (status == EM_OK && !write_all(fd, data, len)) status = file_error("cannot write", path);
    if (status == EM_OK && fsync(fd) != 0) status = file_error("cannot sync", path);
    if (close(fd) != 0 && status == EM_OK) status = file_error("cannot close", path);
    return status;
}

em_status em_file_write_atomic(const char *path, const void *data, size_t len)
{
    char dir[PATH_MAX], tmp[PATH_MAX], copy[PATH_MAX];
    if (dir_of(path, dir) != EM_OK) return em_last_status();
    snprintf(copy, sizeof copy, "%s", path);
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp-XXXXXX", dir, basename(copy)) >= (int)sizeof tmp)
        return em_set_error(EM_ERR_INVALID, "path too long: %.200s...", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        return em_set_error(err == ENOENT ? EM_ERR_NOT_FOUND : EM_ERR_IO,
                            "cannot write %s: cannot create a temp file in %s: %s", path, dir,
                            strerror(err));
    }
    em_status status = fill_temp(fd, path, data, len);
    if (status == EM_OK && rename(tmp, path) != 0) status = file_error("cannot replace", path);
    if (status != EM_OK) {
        unlink(tmp);
        return status;
    }
    return sync_dir(dir);
}

em_status em_mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0) return em_set_error(EM_ERR_INVALID, "cannot create a directory with an empty path");
    if (n >= sizeof buf) return em_set_error(EM_ERR_INVALID, "path too long: %.200s...", path);
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return file_error("cannot create directory", buf);
        if (stat(buf, &st) != 0) return file_error("cannot create directory", buf);
        if (!S_ISDIR(st.st_mode))
            return em_set_error(EM_ERR_IO, "cannot create directory %s: a file is in the way", buf);
        *p = saved;
        if (saved == '\0') return EM_OK;
    }
}

bool em_dir_writable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) && eaccess(path, W_OK | X_OK) == 0;
}

em_status em_mmap_open(em_mmap *m, const char *path)
{
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return file_error("cannot open", path);
    struct stat st;
    em_status status = EM_OK;
    if (fstat(fd, &st) != 0) {
        status = file_error("cannot stat", path);
    } else if (!S_ISREG(st.st_mode)) {
        status = em_set_error(EM_ERR_IO, "cannot map %s: not a regular file", path);
    } else if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            status = file_error("cannot map", path);
        } else {
            m->data = p;
            m->size = (size_t)st.st_size;
        }
    }
    close(fd);
    return status;
}

void em_mmap_close(em_mmap *m)
{
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

em_status em_file_lock_acquire(em_file_lock *lock, const char *path)
{
    lock->fd = -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return file_error("cannot open lock file", path);
    int rc;
    do rc = flock(fd, LOCK_EX);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        em_status status = file_error("cannot lock", path);
        close(fd);
        return status;
    }
    lock->fd = fd;
    return EM_OK;
}

void em_file_lock_release(em_file_lock *lock)
{
    if (lock->fd < 0) return;
    flock(lock->fd, LOCK_UN);
    close(lock->fd);
    lock->fd = -1;
}

em_status em_temp_dir(const char *prefix, char *out, size_t outsz)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    int n = snprintf(out, outsz, "%s/%s-XXXXXX", base, prefix);
    if (n < 0 || (size_t)n >= outsz)
        return em_set_error(EM_ERR_INVALID, "temp dir path %s/%s-XXXXXX does not fit in %zu bytes",
                            base, prefix, outsz);
    if (!mkdtemp(out)) {
        em_status status = file_error("cannot create temp dir", out);
        out[0] = '\0';
        return status;
    }
    return EM_OK;
}

/* nftw callback: removes each entry, children first. Keeps going past failures. */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void em_remove_tree(const char *path)
{
    if (!path || !*path) return;
    nftw(path, remove_entry, 32, FTW_DEPTH | FTW_PHYS);
}
