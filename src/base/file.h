/* file.h — files: whole reads, mmap, atomic writes (temp file + fsync + rename, so a reader sees
 * the old or the new contents, never a torn file), advisory locks, directories and temp dirs. */
#ifndef EM_BASE_FILE_H
#define EM_BASE_FILE_H
#include <stdbool.h>
#include <stddef.h>
#include "ember/base.h"

/* Reads a whole file into a malloc'd, NUL-terminated buffer; *len gets its size (may be NULL).
 * NULL with the error set (naming the path) on failure. */
char *em_file_read(const char *path, size_t *len);
/* Writes data to path atomically: a temp file in the same directory, fsync, rename, fsync of the
 * directory. On failure the previous file (if any) is untouched and no temp file remains. */
em_status em_file_write_atomic(const char *path, const void *data, size_t len);
/* True when path exists (any type). */
bool em_file_exists(const char *path);
/* Creates a directory and its parents (like mkdir -p). */
em_status em_mkdir_p(const char *path);
/* True when the directory exists and the process can create files in it. */
bool em_dir_writable(const char *path);

/* A read-only memory map of a whole file. */
typedef struct em_mmap {
    void *data;  /* mapped bytes (NULL for an empty file) */
    size_t size; /* file size */
} em_mmap;
em_status em_mmap_open(em_mmap *m, const char *path);
void em_mmap_close(em_mmap *m);

/* An exclusive advisory lock on a lock file (created if needed); blocks until held. */
typedef struct em_file_lock {
    int fd; /* -1 when not held */
} em_file_lock;
em_status em_file_lock_acquire(em_file_lock *lock, const char *path);
void em_file_lock_release(em_file_lock *lock);

/* Creates a fresh private directory under $TMPDIR (or /tmp) named prefix-XXXXXX; writes its path
 * into out (size outsz). */
em_status em_temp_dir(const char *prefix, char *out, size_t outsz);
/* Removes a directory tree (best effort). */
void em_remove_tree(const char *path);

#endif
