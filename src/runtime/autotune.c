/* autotune.c — the autotune cache: the winning configuration of an op per (device, key), where
 * the op's caller builds the key from what decides the choice (kernel, dtype, layout, shape
 * bucket). Results live in memory for the process and on disk under em_cache_dir()/autotune/, one
 * small file per (device, op, key) named by a hash of them and holding "key\nvalue\n", written
 * with em_file_write_atomic (temp file + rename), so concurrent processes and crashes never leave
 * a torn entry: a reader sees the old value, the new one, or none, and the last writer wins. The
 * device part of the key is its target, architecture and name, so two GPUs of one model share
 * results and a different model never sees them. EMBER_AUTOTUNE (off | on | full) is read on
 * every call. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/map.h"
#include "ember/runtime.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static em_map g_mem; /* "hash" -> malloc'd value: results seen by this process */
static bool g_mem_ready;

em_autotune_mode em_autotune_get_mode(void)
{
    const char *v = getenv("EMBER_AUTOTUNE");
    if (!v || !*v || !strcmp(v, "on") || !strcmp(v, "1")) return EM_AUTOTUNE_ON;
    if (!strcmp(v, "off") || !strcmp(v, "0")) return EM_AUTOTUNE_OFF;
    if (!strcmp(v, "full")) return EM_AUTOTUNE_FULL;
    return EM_AUTOTUNE_ON;
}

/* The file name (32 hex digits) of an entry, and the full key text stored in it. */
static void entry_id(em_device *dev, const char *op, const char *key, char hex[33], char *full,
                     size_t size)
{
    const em_caps *c = em_device_caps(dev);
    snprintf(full, size, "%s|%s|%s|%s|%s", c ? c->target : "?", c ? c->arch : "?",
             c ? c->device_name : "?", op, key);
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_str(&h, "ember-autotune-1");
    em_hasher_str(&h, full);
    em_hasher_hex(&h, hex);
}

static bool entry_path(const char *hex, char *out, size_t size, bool make_dir)
{
    const char *dir = em_cache_dir();
    if (!dir) return false;
    int n = snprintf(out, size, "%s/autotune", dir);
    if (n < 0 || (size_t)n >= size) return false;
    if (make_dir && em_mkdir_p(out) != EM_OK) return false;
    n = snprintf(out, size, "%s/autotune/%s", dir, hex);
    return n > 0 && (size_t)n < size;
}

static void remember(const char *hex, const char *value)
{
    char *copy = malloc(strlen(value) + 1);
    if (!copy) return;
    strcpy(copy, value);
    pthread_mutex_lock(&g_lock);
    if (!g_mem_ready) em_map_init(&g_mem), g_mem_ready = true;
    free(em_map_remove(&g_mem, hex, 32));
    if (!em_map_put(&g_mem, hex, 32, copy)) free(copy);
    pthread_mutex_unlock(&g_lock);
}

bool em_autotune_lookup(em_device *dev, const char *op, const char *key, char *value, size_t size)
{
    if (!dev || !op || !key || !value || size == 0) return false;
    char hex[33], full[512], path[4096];
    entry_id(dev, op, key, hex, full, sizeof full);
    pthread_mutex_lock(&g_lock);
    const char *hit = g_mem_ready ? em_map_get(&g_mem, hex, 32) : NULL;
    bool found = hit && strlen(hit) < size;
    if (found) strcpy(value, hit);
    pthread_mutex_unlock(&g_lock);
    if (found) return true;
    if (!entry_path(hex, path, sizeof path, false) || !em_file_exists(path)) return false;
    size_t len = 0;
    char *text = em_file_read(path, &len);
    if (!text) {
        em_clear_error();
        return false;
    }
    /* "full key\nvalue\n": the key must match (a hash collision reads as a miss) */
    size_t fl = strlen(full);
    found = len > fl + 1 && !strncmp(text, full, fl) && text[fl] == '\n';
    if (found) {
        char *v = text + fl + 1, *nl = strchr(v, '\n');
        if (nl) *nl = 0;
        found = *v && strlen(v) < size;
        if (found) {
            strcpy(value, v);
            remember(hex, v);
        }
    }
    free(text);
    return found;
}

em_status em_autotune_store(em_device *dev, const char *op, const char *key, const char *value)
{
    if (!dev || !op || !key || !value || !*value || strchr(value, '\n'))
        return em_set_error(EM_ERR_INVALID, "autotune: store needs a device, an op, a key and a "
                                            "one-line value");
    char hex[33], full[512], path[4096];
    entry_id(dev, op, key, hex, full, sizeof full);
    remember(hex, value);
    if (!entry_path(hex, path, sizeof path, true))
        return em_error_context("autotune: no cache directory for %s", full);
    size_t n = strlen(full) + strlen(value) + 3;
    char *text = malloc(n);
    if (!text) return em_set_error(EM_ERR_NOMEM, "autotune: out of memory");
    snprintf(text, n, "%s\n%s\n", full, value);
    em_status st = em_file_write_atomic(path, text, strlen(text));
    free(text);
    return st;
}

void em_autotune_forget_memory(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_mem_ready) {
        size_t it = 0;
        const char *k;
        size_t kl;
        void *v;
        while (em_map_next(&g_mem, &it, &k, &kl, &v)) free(v);
        em_map_free(&g_mem);
        g_mem_ready = false;
    }
    pthread_mutex_unlock(&g_lock);
}
