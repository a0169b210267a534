/* cache.c — compiling kernels through the kernel cache: in memory (per device), then on disk
 * under the cache directory, else generate + build + store.
 *
 * A kernel's key hashes its simplified IR (em_ir_hash), the source the target's generator makes
 * for it alone (so a change in a code generator never loads a stale binary), the target, the
 * device architecture and the driver's compiler identity (compiler version, flags, ABI version).
 *
 * On disk (DIR = em_cache_dir()):
 *   DIR/kernels/KEY.idx          one per kernel: which binary holds it (text, written atomically)
 *   DIR/kernels/HASH.so          binaries, named by the hash of their own contents
 *   DIR/tmp/tPID_N_HOST.*        compiler outputs in progress
 * A batch is one compiler run producing one binary; each of its kernels gets its own index entry,
 * so it is found by its own key later. A binary is written to DIR/tmp, fsync'd and renamed into
 * DIR/kernels; then the index entries are written (temp + rename). Readers check the binary's
 * size and content hash against the index before loading it, so a truncated or corrupt entry is
 * detected (and deleted, and rebuilt), never loaded. Concurrent processes compiling the same
 * kernel both succeed: renames are atomic and binaries are immutable once named. Temp files left
 * by killed processes are removed when a process next opens the directory.
 *
 * Locking: a device's kernel_lock guards its kernel map (memory hits take only that lock);
 * compile_lock serializes the slow path (disk lookups, builds, module loads) per device. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "kernel/codegen/codegen.h"
#include "runtime/cache.h"
#include "runtime/rt.h"

#define INDEX_MAGIC "ember-kernel-index 1"
#define KEY_SALT "ember-kernel-cache-1"
#define STALE_TEMP_SECONDS (24 * 3600)

/* ---- statistics ------------------------------------------------------------------------------ */

static _Atomic uint64_t stat_memory_hits, stat_disk_hits, stat_compiles, stat_kernels_built;

void em_cache_stats_get(em_cache_stats *out)
{
    if (!out)
        return;
    out->memory_hits = atomic_load(&stat_memory_hits);
    out->disk_hits = atomic_load(&stat_disk_hits);
    out->compiles = atomic_load(&stat_compiles);
    out->kernels_built = atomic_load(&stat_kernels_built);
}

/* ---- the cache directory --------------------------------------------------------------------- */

typedef struct interned {
    struct interned *next; /* older strings */
    char text[];           /* NUL-terminated */
} interned;

static pthread_mutex_t dir_lock = PTHREAD_MUTEX_INITIALIZER;
static char *dir_spec;          /* the environment the current directory was resolved from */
static const char *dir_current; /* resolved directory (interned: valid for the process) */
static interned *dir_strings;   /* every resolved directory, kept so returned pointers stay valid */
static char host_name[64];      /* sanitized host name, for temp-file names */
static _Atomic unsigned temp_counter;

static const char *intern(const char *s)
{
    size_t n = strlen(s) + 1;
    interned *it = malloc(sizeof(*it) + n);
    if (!it)
        return NULL;
    memcpy(it->text, s, n);
    it->next = dir_strings;
    dir_strings = it;
    return it->text;
}

static void init_host_name(void)
{
    char raw[64] = "";
    if (gethostname(raw, sizeof(raw) - 1) != 0 || !raw[0])
        snprintf(raw, sizeof(raw), "host");
    size_t j = 0;
    for (size_t i = 0; raw[i] && j < 40; i++) {
        char c = raw[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')
            host_name[j++] = c;
    }
    host_name[j] = '\0';
    if (!j)
        snprintf(host_name, sizeof(host_name), "host");
}

/* Creates DIR/kernels and DIR/tmp and proves a file can be created in them. */
static bool prepare_dir(const char *dir, char *why, size_t why_size)
{
    char path[4096];
    const char *subs[] = {"kernels", "tmp"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, subs[i]);
        if (em_mkdir_p(path) != EM_OK) {
            snprintf(why, why_size, "%s", em_last_error());
            return false;
        }
        snprintf(path, sizeof(path), "%s/%s/.probe-XXXXXX", dir, subs[i]);
        int fd = mkstemp(path);
        if (fd < 0) {
            snprintf(why, why_size, "cannot create files in %s/%s: %s", dir, subs[i],
                     strerror(errno));
            return false;
        }
        close(fd);
        unlink(path);
    }
    return true;
}

/* Removes temp files of this host's dead processes, and any older than a day. */
static void clean_temps(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tmp", dir);
    DIR *d = opendir(path);
    if (!d)
        return;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid = 0;
        unsigned n = 0;
        char host[64] = "";
        if (e->d_name[0] != 't' || sscanf(e->d_name, "t%d_%u_%63[^.]", &pid, &n, host) != 3)
            continue;
        snprintf(path, sizeof(path), "%s/tmp/%s", dir, e->d_name);
        bool dead = strcmp(host, host_name) == 0 && pid > 0 && pid != (int)getpid() &&
                    kill(pid, 0) != 0 && errno == ESRCH;
        struct stat st;
        bool old = stat(path, &st) == 0 && now - st.st_mtime > STALE_TEMP_SECONDS;
        if (dead || old) {
            EM_LOGD("kernel cache: removing stale temp file %s", path);
            unlink(path);
        }
    }
    closedir(d);
}

/* $TMPDIR/ember-cache-UID (private to this user), else a fresh private temp dir. */
static const char *fallback_dir(char *out, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    snprintf(out, size, "%s/ember-cache-%u", tmp, (unsigned)getuid());
    mkdir(out, 0700);
    struct stat st;
    char why[512];
    if (lstat(out, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() &&
        (st.st_mode & 022) == 0 && prepare_dir(out, why, sizeof(why)))
        return out;
    if (em_temp_dir("ember-cache", out, size) == EM_OK && prepare_dir(out, why, sizeof(why)))
        return out;
    return NULL;
}

/* Resolves the directory for the current environment. Called with dir_lock held. */
static const char *resolve_dir_locked(void)
{
    const char *env = getenv("EMBER_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    em_strbuf spec;
    em_sb_init(&spec);
    em_sb_printf(&spec, "%s\n%s\n%s", env ? env : "", xdg ? xdg : "", home ? home : "");
    if (spec.oom) {
        em_sb_free(&spec);
        em_set_error(EM_ERR_NOMEM, "out of memory resolving the kernel cache directory");
        return NULL;
    }
    if (dir_current && dir_spec && strcmp(dir_spec, spec.data) == 0) {
        em_sb_free(&spec);
        return dir_current;
    }
    if (!host_name[0])
        init_host_name();

    char configured[4096] = "";
    if (env && *env)
        snprintf(configured, sizeof(configured), "%s", env);
    else if (xdg && *xdg)
        snprintf(configured, sizeof(configured), "%s/ember", xdg);
    else if (home && *home)
        snprintf(configured, sizeof(configured), "%s/.cache/ember", home);

    char why[512] = "no $EMBER_CACHE_DIR, $XDG_CACHE_HOME or $HOME";
    char chosen[4096];
    const char *dir = NULL;
    if (configured[0] && prepare_dir(configured, why, sizeof(why))) {
        dir = configured;
    } else if ((dir = fallback_dir(chosen, sizeof(chosen)))) {
        EM_LOGW("kernel cache: %s%s%s; using %s instead", configured[0] ? configured : "",
                configured[0] ? " is not writable: " : "", why, dir);
    }
    if (!dir) {
        em_sb_free(&spec);
        em_set_error(EM_ERR_IO, "kernel cache: no writable directory (%s, and no temp dir)", why);
        return NULL;
    }
    const char *kept = intern(dir);
    if (!kept) {
        em_sb_free(&spec);
        em_set_error(EM_ERR_NOMEM, "out of memory resolving the kernel cache directory");
        return NULL;
    }
    free(dir_spec);
    dir_spec = em_sb_take(&spec);
    dir_current = kept;
    clean_temps(kept);
    EM_LOGD("kernel cache: %s", kept);
    return kept;
}

const char *em_cache_dir(void)
{
    pthread_mutex_lock(&dir_lock);
    const char *dir = resolve_dir_locked();
    pthread_mutex_unlock(&dir_lock);
    return dir;
}

/* ---- small file helpers ---------------------------------------------------------------------- */

static void fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static void content_hash(const void *data, size_t len, char out[33])
{
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_bytes(&h, data, len);
    em_hasher_hex(&h, out);
}

static bool is_hex32(const char *s, size_t n)
{
    if (n != 32)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* ---- modules and kernels --------------------------------------------------------------------- */

/* The module loaded from path (loading it once per device). If `hash` is given, the file's size
 * and content hash must match first. Called with compile_lock held. */
static em_rt_module *get_module(em_device *dev, const char *path, const char *hash, uint64_t size)
{
    em_rt_module *m = em_map_gets(&dev->modules, path);
    if (m)
        return m;
    if (hash) {
        size_t len = 0;
        char *data = em_file_read(path, &len);
        if (!data)
            return NULL;
        char got[33];
        content_hash(data, len, got);
        free(data);
        if (len != size || strcmp(got, hash) != 0) {
            em_set_error(EM_ERR_CORRUPT, "%s: %zu bytes with hash %s, expected %llu bytes with "
                         "hash %s", path, len, got, (unsigned long long)size, hash);
            return NULL;
        }
    }
    void *handle = NULL;
    if (dev->drv->load(dev->state, path, &handle) != EM_OK)
        return NULL;
    m = calloc(1, sizeof(*m));
    char *p = strdup(path);
    if (!m || !p || !em_map_puts(&dev->modules, path, m)) {
        free(m);
        free(p);
        dev->drv->unload(dev->state, handle);
        em_set_error(EM_ERR_NOMEM, "out of memory loading %s", path);
        return NULL;
    }
    m->handle = handle;
    m->path = p;
    return m;
}

/* Makes an em_kernel for `ir` (taking ownership) from a module and registers it under its IR
 * hash and its key. Called with compile_lock held; NULL (error set) on failure. */
static em_kernel *make_kernel(em_device *dev, em_ir_kernel *ir, const char *ir_hash,
                              const char *key, em_rt_module *m)
{
    void *fn = NULL;
    if (dev->drv->function(dev->state, m->handle, em_ir_kernel_name(ir), &fn) != EM_OK)
        return NULL;
    em_kernel *kern = calloc(1, sizeof(*kern));
    if (!kern) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    kern->dev = dev;
    kern->ir = ir;
    kern->fn = fn;
    kern->module = m;
    snprintf(kern->key, sizeof(kern->key), "%s", key);
    char ir_key[40], key_key[40];
    snprintf(ir_key, sizeof(ir_key), "ir:%s", ir_hash);
    snprintf(key_key, sizeof(key_key), "key:%s", key);
    pthread_mutex_lock(&dev->kernel_lock);
    bool pushed = EM_VEC_PUSH(&dev->kernel_list, kern);
    bool ok = pushed && em_map_puts(&dev->kernels, key_key, kern) &&
              em_map_puts(&dev->kernels, ir_key, kern);
    if (!ok) { /* undo, so the caller still owns ir */
        if (pushed)
            dev->kernel_list.len--;
        em_map_remove(&dev->kernels, key_key, strlen(key_key));
        em_map_remove(&dev->kernels, ir_key, strlen(ir_key));
    }
    pthread_mutex_unlock(&dev->kernel_lock);
    if (!ok) {
        free(kern);
        em_set_error(EM_ERR_NOMEM, "out of memory registering kernel %s", em_ir_kernel_name(ir));
        return NULL;
    }
    return kern;
}

static em_kernel *memory_get(em_device *dev, const char *prefix, const char *hash)
{
    char k[40]; /* "PREFIX:HASH", built without printf: this runs on every launch */
    size_t np = strlen(prefix), nh = strnlen(hash, 32);
    if (np + 1 + nh >= sizeof(k))
        return NULL;
    memcpy(k, prefix, np);
    k[np] = ':';
    memcpy(k + np + 1, hash, nh);
    k[np + 1 + nh] = 0;
    pthread_mutex_lock(&dev->kernel_lock);
    em_kernel *kern = em_map_gets(&dev->kernels, k);
    pthread_mutex_unlock(&dev->kernel_lock);
    return kern;
}

void em_rt_kernels_destroy(em_device *dev)
{
    for (size_t i = 0; i < dev->kernel_list.len; i++) {
        em_ir_kernel_free(dev->kernel_list.items[i]->ir);
        free(dev->kernel_list.items[i]);
    }
    dev->kernel_list.len = 0;
    size_t iter = 0;
    const char *key;
    size_t key_len;
    void *value;
    while (em_map_next(&dev->modules, &iter, &key, &key_len, &value)) {
        em_rt_module *m = value;
        dev->drv->unload(dev->state, m->handle);
        free(m->path);
        free(m);
    }
}

/* ---- the disk index -------------------------------------------------------------------------- */

typedef struct index_entry {
    char binary[64]; /* file name of the binary in DIR/kernels */
    char name[256];  /* kernel name inside it */
    uint64_t size;   /* binary size in bytes */
    char hash[33];   /* binary content hash */
} index_entry;

static bool parse_index(const char *text, index_entry *e)
{
    memset(e, 0, sizeof(*e));
    unsigned long long size = 0;
    int used = 0;
    if (sscanf(text, INDEX_MAGIC "\nbinary %63s\nname %255s\nsize %llu\nhash %32s\n%n", e->binary,
               e->name, &size, e->hash, &used) != 4 || used == 0)
        return false;
    e->size = size;
    /* the binary name must be HASH.EXT with HASH its content hash: no path can sneak in */
    return strncmp(e->binary, e->hash, 32) == 0 && is_hex32(e->hash, strlen(e->hash)) &&
           e->binary[32] == '.' && !strchr(e->binary, '/');
}

static void index_path(const char *dir, const char *key, char *out, size_t size)
{
    snprintf(out, size, "%s/kernels/%s.idx", dir, key);
}

/* Finds a kernel in the disk cache. NULL without an error when absent; a corrupt entry is
 * deleted (and NULL returned, so the caller rebuilds it). Takes ownership of ir on success. */
static em_kernel *disk_get(em_device *dev, const char *dir, em_ir_kernel *ir, const char *ir_hash,
                           const char *key)
{
    char ipath[4096], bpath[4096];
    index_path(dir, key, ipath, sizeof(ipath));
    if (!em_file_exists(ipath))
        return NULL;
    char *text = em_file_read(ipath, NULL);
    if (!text) {
        EM_LOGW("kernel cache: cannot read %s: %s", ipath, em_last_error());
        return NULL;
    }
    index_entry e;
    bool parsed = parse_index(text, &e);
    free(text);
    if (!parsed) {
        EM_LOGW("kernel cache: %s is malformed; deleting it and rebuilding", ipath);
        unlink(ipath);
        return NULL;
    }
    if (strcmp(e.name, em_ir_kernel_name(ir)) != 0) {
        EM_LOGW("kernel cache: %s names kernel %s, expected %s; rebuilding", ipath, e.name,
                em_ir_kernel_name(ir));
        unlink(ipath);
        return NULL;
    }
    snprintf(bpath, sizeof(bpath), "%s/kernels/%s", dir, e.binary);
    em_rt_module *m = get_module(dev, bpath, e.hash, e.size);
    em_kernel *kern = m ? make_kernel(dev, ir, ir_hash, key, m) : NULL;
    if (!kern) {
        EM_LOGW("kernel cache: entry %s for kernel %s is broken (%s); deleting it and rebuilding",
                key, e.name, em_last_error());
        unlink(ipath);
        if (!m && em_last_status() == EM_ERR_CORRUPT)
            unlink(bpath);
        em_clear_error();
        return NULL;
    }
    return kern;
}

/* ---- building -------------------------------------------------------------------------------- */

typedef struct pending {
    em_ir_kernel *ir;  /* simplified copy (owned until a kernel takes it) */
    char ir_hash[33];  /* hash of the kernel as given */
    char key[33];      /* cache key */
    size_t slot;       /* index in the caller's batch */
    int group;         /* compiler run it belongs to */
} pending;

static void temp_path(const char *dir, const char *ext, char *out, size_t size)
{
    unsigned n = atomic_fetch_add(&temp_counter, 1);
    snprintf(out, size, "%s/tmp/t%d_%u_%s%s", dir, (int)getpid(), n, host_name, ext);
}

/* Moves a finished binary from tmp into DIR/kernels under its content hash; writes the name to
 * final (size final_size), and the hash and size to hash/size. */
static em_status store_binary(em_device *dev, const char *dir, const char *tmp, char *final,
                              size_t final_size, char hash[33], uint64_t *size)
{
    size_t len = 0;
    char *data = em_file_read(tmp, &len);
    if (!data)
        return em_error_context("kernel cache: reading the compiler's output");
    content_hash(data, len, hash);
    free(data);
    *size = len;
    snprintf(final, final_size, "%s/kernels/%s%s", dir, hash, dev->drv->binary_ext);
    fsync_path(tmp);
    if (rename(tmp, final) != 0)
        return em_set_error(EM_ERR_IO, "kernel cache: cannot rename %s to %s: %s", tmp, final,
                            strerror(errno));
    char kdir[4096];
    snprintf(kdir, sizeof(kdir), "%s/kernels", dir);
    fsync_path(kdir);
    return EM_OK;
}

static void write_index(const char *dir, const char *key, const char *binary_path,
                        const char *name, uint64_t size, const char *hash)
{
    const char *base = strrchr(binary_path, '/');
    base = base ? base + 1 : binary_path;
    char text[512], ipath[4096];
    int n = snprintf(text, sizeof(text), INDEX_MAGIC "\nbinary %s\nname %s\nsize %llu\nhash %s\n",
                     base, name, (unsigned long long)size, hash);
    index_path(dir, key, ipath, sizeof(ipath));
    if (n < 0 || (size_t)n >= sizeof(text) || em_file_write_atomic(ipath, text, (size_t)n) != EM_OK)
        EM_LOGW("kernel cache: cannot write %s: %s", ipath, em_last_error());
}

/* One compiler run for the kernels of group g; registers them and fills out[]. */
static em_status build_group(em_device *dev, const char *dir, pending *ps, size_t np, int g,
                             em_kernel **out)
{
    const em_ir_kernel **ks = malloc(np * sizeof(*ks));
    if (!ks)
        return em_set_error(EM_ERR_NOMEM, "out of memory building kernels");
    size_t n = 0;
    for (size_t i = 0; i < np; i++)
        if (ps[i].group == g)
            ks[n++] = ps[i].ir;
    const char *first = em_ir_kernel_name(ks[0]);
    char *source = dev->drv->generate(dev->state, ks, n, &dev->caps);
    free(ks);
    if (!source)
        return em_error_context("generating %s code for %s", dev->caps.target, first);
    char tmp[4096], final[4096], hash[33];
    uint64_t size = 0;
    temp_path(dir, dev->drv->binary_ext, tmp, sizeof(tmp));
    atomic_fetch_add(&stat_compiles, 1);
    double t0 = em_rt_now();
    em_status st = dev->drv->build(dev->state, source, tmp);
    free(source);
    if (st != EM_OK) {
        unlink(tmp);
        return n == 1 ? em_error_context("building kernel %s for %s", first, dev->name)
                      : em_error_context("building %zu kernels (%s, ...) for %s", n, first,
                                         dev->name);
    }
    atomic_fetch_add(&stat_kernels_built, n);
    EM_LOGD("kernel cache: built %zu kernel%s (%s...) in %.0f ms", n, n == 1 ? "" : "s", first,
            (em_rt_now() - t0) * 1e3);
    st = store_binary(dev, dir, tmp, final, sizeof(final), hash, &size);
    bool stored = st == EM_OK;
    if (!stored) {
        EM_LOGW("%s; using the binary without caching it", em_last_error());
        snprintf(final, sizeof(final), "%s", tmp);
    }
    em_rt_module *m = get_module(dev, final, NULL, 0);
    if (!stored)
        unlink(tmp); /* a loaded module no longer needs its file */
    if (!m)
        return em_error_context("loading the freshly built %s", final);
    for (size_t i = 0; i < np; i++) {
        if (ps[i].group != g)
            continue;
        em_kernel *kern = make_kernel(dev, ps[i].ir, ps[i].ir_hash, ps[i].key, m);
        if (!kern)
            return em_error_context("kernel %s", em_ir_kernel_name(ps[i].ir));
        ps[i].ir = NULL; /* owned by the kernel now */
        out[ps[i].slot] = kern;
        if (stored)
            write_index(dir, ps[i].key, final, em_ir_kernel_name(kern->ir), size, hash);
    }
    return EM_OK;
}

/* Splits pending kernels into compiler runs in which every kernel name is unique (one binary
 * cannot export two functions of one name). Returns the number of groups. */
static int assign_groups(pending *ps, size_t np)
{
    int groups = 0;
    for (size_t i = 0; i < np; i++) {
        int g = 0;
        for (;; g++) {
            bool clash = false;
            for (size_t j = 0; j < i && !clash; j++)
                clash = ps[j].group == g &&
                        strcmp(em_ir_kernel_name(ps[j].ir), em_ir_kernel_name(ps[i].ir)) == 0;
            if (!clash)
                break;
        }
        ps[i].group = g;
        if (g + 1 > groups)
            groups = g + 1;
    }
    return groups;
}

/* The cache key of a simplified kernel (see the top of this file). */
static em_status kernel_key(em_device *dev, const em_ir_kernel *ir, const char *compiler,
                            char key[33])
{
    char ir_hash[33];
    em_ir_hash(ir, ir_hash);
    char *source = dev->drv->generate(dev->state, &ir, 1, &dev->caps);
    if (!source)
        return em_error_context("generating %s code for %s", dev->caps.target,
                                em_ir_kernel_name(ir));
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_str(&h, KEY_SALT);
    em_hasher_str(&h, ir_hash);
    em_hasher_str(&h, source);
    em_hasher_str(&h, dev->caps.target);
    em_hasher_str(&h, dev->caps.arch);
    em_hasher_str(&h, compiler);
    em_hasher_hex(&h, key);
    free(source);
    return EM_OK;
}

/* Verifies and simplifies a copy of k. */
static em_ir_kernel *prepare_ir(em_device *dev, const em_ir_kernel *k)
{
    if (em_ir_verify(k, 0) != EM_OK) {
        em_error_context("compiling kernel %s for %s", em_ir_kernel_name(k), dev->name);
        return NULL;
    }
    em_ir_kernel *c = em_ir_kernel_clone(k);
    if (!c) {
        em_error_context("compiling kernel %s", em_ir_kernel_name(k));
        return NULL;
    }
    if (em_ir_simplify(c) != EM_OK) {
        em_error_context("simplifying kernel %s", em_ir_kernel_name(k));
        em_ir_kernel_free(c);
        return NULL;
    }
    return c;
}

/* Looks up kernel i of a batch in memory and on disk; on a miss, appends it to ps. */
static em_status lookup_one(em_device *dev, const char *dir, const char *compiler,
                            const em_ir_kernel *k, size_t slot, pending *ps, size_t *np,
                            em_kernel **out)
{
    char ir_hash[33], key[33];
    em_ir_hash(k, ir_hash);
    if ((out[slot] = memory_get(dev, "ir", ir_hash))) {
        atomic_fetch_add(&stat_memory_hits, 1);
        return EM_OK;
    }
    em_ir_kernel *ir = prepare_ir(dev, k);
    if (!ir)
        return em_last_status();
    em_status st = kernel_key(dev, ir, compiler, key);
    if (st != EM_OK) {
        em_ir_kernel_free(ir);
        return st;
    }
    em_kernel *kern = memory_get(dev, "key", key);
    if (kern) {
        em_ir_kernel_free(ir);
        char ir_key[40];
        snprintf(ir_key, sizeof(ir_key), "ir:%s", ir_hash);
        pthread_mutex_lock(&dev->kernel_lock);
        em_map_puts(&dev->kernels, ir_key, kern); /* best effort: only a shortcut */
        pthread_mutex_unlock(&dev->kernel_lock);
        atomic_fetch_add(&stat_memory_hits, 1);
        out[slot] = kern;
        return EM_OK;
    }
    for (size_t i = 0; i < *np; i++) {
        if (strcmp(ps[i].key, key) == 0) { /* the same kernel twice in one batch */
            em_ir_kernel_free(ir);
            return EM_OK; /* filled in after the build */
        }
    }
    if ((kern = disk_get(dev, dir, ir, ir_hash, key))) {
        atomic_fetch_add(&stat_disk_hits, 1);
        out[slot] = kern;
        return EM_OK;
    }
    pending *p = &ps[(*np)++];
    p->ir = ir;
    p->slot = slot;
    p->group = 0;
    memcpy(p->ir_hash, ir_hash, sizeof(ir_hash));
    memcpy(p->key, key, sizeof(key));
    return EM_OK;
}

static em_status compile_locked(em_device *dev, const em_ir_kernel *const *ks, size_t n,
                                em_kernel **out, pending *ps)
{
    const char *dir = em_cache_dir();
    if (!dir)
        return em_last_status();
    char compiler[1024];
    em_status st = dev->drv->compiler_id(dev->state, compiler, sizeof(compiler));
    if (st != EM_OK)
        return st;
    size_t np = 0;
    for (size_t i = 0; i < n && st == EM_OK; i++)
        st = lookup_one(dev, dir, compiler, ks[i], i, ps, &np, out);
    if (st == EM_OK && np) {
        int groups = assign_groups(ps, np);
        for (int g = 0; g < groups && st == EM_OK; g++)
            st = build_group(dev, dir, ps, np, g, out);
    }
    for (size_t i = 0; i < np; i++)
        em_ir_kernel_free(ps[i].ir); /* those not taken by a kernel */
    if (st != EM_OK)
        return st;
    /* duplicates inside the batch: fill from their twin */
    for (size_t i = 0; i < n; i++) {
        if (out[i])
            continue;
        char ir_hash[33];
        em_ir_hash(ks[i], ir_hash);
        if (!(out[i] = memory_get(dev, "ir", ir_hash)))
            return em_set_error(EM_ERR_INTERNAL, "kernel cache lost kernel %s",
                                em_ir_kernel_name(ks[i]));
    }
    return EM_OK;
}

em_status em_kernel_compile_batch(em_device *dev, const em_ir_kernel *const *ks, size_t n,
                                  em_kernel **out)
{
    if (!dev || (!ks && n) || (!out && n))
        return em_set_error(EM_ERR_INVALID, "em_kernel_compile_batch: no device, kernels or output");
    for (size_t i = 0; i < n; i++) {
        out[i] = NULL;
        if (!ks[i])
            return em_set_error(EM_ERR_INVALID, "em_kernel_compile_batch: kernel %zu is NULL", i);
    }
    if (!n)
        return EM_OK;
    pending *ps = calloc(n, sizeof(*ps));
    if (!ps)
        return em_set_error(EM_ERR_NOMEM, "out of memory compiling %zu kernels", n);
    pthread_mutex_lock(&dev->compile_lock);
    em_status st = compile_locked(dev, ks, n, out, ps);
    pthread_mutex_unlock(&dev->compile_lock);
    free(ps);
    if (st != EM_OK)
        for (size_t i = 0; i < n; i++)
            out[i] = NULL;
    return st;
}

em_kernel *em_rt_kernel_compile_hashed(em_device *dev, const em_ir_kernel *k,
                                       const char ir_hash[33])
{
    if (!dev || !k || !ir_hash) {
        em_set_error(EM_ERR_INVALID, "em_kernel_compile: no device or kernel");
        return NULL;
    }
    em_kernel *kern = memory_get(dev, "ir", ir_hash);
    if (kern) {
        atomic_fetch_add(&stat_memory_hits, 1);
        return kern;
    }
    return em_kernel_compile_batch(dev, &k, 1, &kern) == EM_OK ? kern : NULL;
}

em_kernel *em_kernel_compile(em_device *dev, const em_ir_kernel *k)
{
    if (!dev || !k) {
        em_set_error(EM_ERR_INVALID, "em_kernel_compile: no device or kernel");
        return NULL;
    }
    char ir_hash[33];
    em_ir_hash(k, ir_hash);
    return em_rt_kernel_compile_hashed(dev, k, ir_hash);
}

char *em_kernel_source(const em_ir_kernel *k, const char *target)
{
    em_caps caps = {0};
    snprintf(caps.target, sizeof caps.target, "%s", target ? target : "");
    return em_kernel_source_caps(k, &caps);
}

char *em_kernel_source_caps(const em_ir_kernel *k, const em_caps *caps)
{
    if (!k || !caps || !caps->target[0]) {
        em_set_error(EM_ERR_INVALID, "em_kernel_source: no kernel or target");
        return NULL;
    }
    const char *target = caps->target;
    if (em_ir_verify(k, 0) != EM_OK) {
        em_error_context("kernel %s", em_ir_kernel_name(k));
        return NULL;
    }
    em_ir_kernel *c = em_ir_kernel_clone(k);
    if (!c)
        return NULL;
    char *source = NULL;
    if (em_ir_simplify(c) == EM_OK) {
        const em_ir_kernel *one = c;
        source = em_codegen(target, &one, 1, caps->arch[0] ? caps : NULL);
    }
    em_ir_kernel_free(c);
    return source;
}

const char *em_kernel_name(const em_kernel *kernel)
{
    return kernel ? em_ir_kernel_name(kernel->ir) : "(null)";
}

const em_ir_kernel *em_kernel_ir(const em_kernel *kernel)
{
    return kernel ? kernel->ir : NULL;
}
