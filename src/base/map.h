/* map.h — an open-addressing hash map from byte-string keys to pointers. Not thread-safe: callers
 * that share one guard it with their own lock (see the kernel cache). */
#ifndef EM_BASE_MAP_H
#define EM_BASE_MAP_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct em_map_entry {
    char *key;      /* owned copy of the key (NUL-terminated; may contain any bytes before len) */
    size_t key_len; /* key length in bytes */
    uint64_t hash;  /* cached hash of the key */
    void *value;    /* borrowed: the map never frees values */
} em_map_entry;

typedef struct em_map {
    em_map_entry *slots; /* capacity entries; key == NULL means empty, key == tombstone deleted */
    size_t cap;          /* power of two, or 0 */
    size_t count;        /* live entries */
    size_t used;         /* live + deleted slots */
} em_map;

void em_map_init(em_map *m);
/* Frees the map's own storage and keys (not the values). */
void em_map_free(em_map *m);
/* Returns the value for key, or NULL when absent. */
void *em_map_get(const em_map *m, const void *key, size_t key_len);
/* Sets key to value (replacing any previous value). Returns false (error set) when out of memory. */
bool em_map_put(em_map *m, const void *key, size_t key_len, void *value);
/* Removes key; returns the value it had (NULL if absent). */
void *em_map_remove(em_map *m, const void *key, size_t key_len);
/* Convenience wrappers for NUL-terminated keys. */
void *em_map_gets(const em_map *m, const char *key);
bool em_map_puts(em_map *m, const char *key, void *value);
/* Iteration: start with *iter = 0; returns false when done. */
bool em_map_next(const em_map *m, size_t *iter, const char **key, size_t *key_len, void **value);

#endif
