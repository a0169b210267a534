/* map.c — the open-addressing hash map: linear probing over a power-of-two table of slots.
 *
 * A removed entry leaves a tombstone (a key pointer to a private sentinel) so that probe chains
 * stay intact; inserts reuse the first tombstone on their probe path. The table is rebuilt when
 * live plus deleted slots would pass 70% of the capacity, sized so that the live entries fill at
 * most half of it: a map that mostly churns keeps its size, a growing one doubles. */
#include "base/map.h"
#include "base/hash.h"
#include "ember/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAP_SEED 0x6d61702e656d6265ull /* any fixed value: hashes are only compared in-process */
#define MAP_MIN_CAP 16

static char tombstone_key; /* its address marks a deleted slot */
#define TOMBSTONE (&tombstone_key)

void em_map_init(em_map *m)
{
    m->slots = NULL;
    m->cap = 0;
    m->count = 0;
    m->used = 0;
}

void em_map_free(em_map *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        char *key = m->slots[i].key;
        if (key && key != TOMBSTONE) free(key);
    }
    free(m->slots);
    em_map_init(m);
}

static bool is_live(const em_map_entry *e)
{
    return e->key && e->key != TOMBSTONE;
}

static bool entry_matches(const em_map_entry *e, uint64_t hash, const void *key, size_t key_len)
{
    return is_live(e) && e->hash == hash && e->key_len == key_len &&
           (key_len == 0 || memcmp(e->key, key, key_len) == 0);
}

/* The slot holding key, or NULL. */
static em_map_entry *find(const em_map *m, uint64_t hash, const void *key, size_t key_len)
{
    if (m->cap == 0) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        em_map_entry *e = &m->slots[i];
        if (!e->key) return NULL;
        if (entry_matches(e, hash, key, key_len)) return e;
    }
}

/* The slot a new key should go to: the first tombstone or empty slot on its probe path. The table
 * always has an empty slot, since it is rebuilt before passing 70% use. */
static em_map_entry *free_slot(const em_map *m, uint64_t hash)
{
    size_t mask = m->cap - 1;
    size_t i = hash & mask;
    while (is_live(&m->slots[i])) i = (i + 1) & mask;
    return &m->slots[i];
}

/* Rebuilds the table with room for at least `want` live entries at <= 50% load, dropping
 * tombstones. False (error set) when out of memory; the map is unchanged then. */
static bool rebuild(em_map *m, size_t want)
{
    size_t cap = MAP_MIN_CAP;
    while (cap / 2 < want) {
        if (cap > SIZE_MAX / 2 / sizeof(em_map_entry)) {
            em_set_error(EM_ERR_NOMEM, "hash map: too many entries (%zu)", want);
            return false;
        }
        cap *= 2;
    }
    em_map_entry *slots = calloc(cap, sizeof *slots);
    if (!slots) {
        em_set_error(EM_ERR_NOMEM, "hash map: out of memory growing to %zu slots", cap);
        return false;
    }
    em_map old = *m;
    m->slots = slots;
    m->cap = cap;
    m->used = m->count;
    for (size_t i = 0; i < old.cap; i++)
        if (is_live(&old.slots[i])) *free_slot(m, old.slots[i].hash) = old.slots[i];
    free(old.slots);
    return true;
}

void *em_map_get(const em_map *m, const void *key, size_t key_len)
{
    em_map_entry *e = find(m, em_hash64(key, key_len, MAP_SEED), key, key_len);
    return e ? e->value : NULL;
}

bool em_map_put(em_map *m, const void *key, size_t key_len, void *value)
{
    uint64_t hash = em_hash64(key, key_len, MAP_SEED);
    em_map_entry *e = find(m, hash, key, key_len);
    if (e) {
        e->value = value;
        return true;
    }
    if ((m->used + 1) * 10 > m->cap * 7 && !rebuild(m, m->count + 1)) return false;
    char *copy = malloc(key_len + 1);
    if (!copy) {
        em_set_error(EM_ERR_NOMEM, "hash map: out of memory copying a key of %zu bytes", key_len);
        return false;
    }
    if (key_len) memcpy(copy, key, key_len);
    copy[key_len] = '\0';
    e = free_slot(m, hash);
    if (!e->key) m->used++; /* a reused tombstone was already counted */
    *e = (em_map_entry){.key = copy, .key_len = key_len, .hash = hash, .value = value};
    m->count++;
    return true;
}

void *em_map_remove(em_map *m, const void *key, size_t key_len)
{
    em_map_entry *e = find(m, em_hash64(key, key_len, MAP_SEED), key, key_len);
    if (!e) return NULL;
    void *value = e->value;
    free(e->key);
    *e = (em_map_entry){.key = TOMBSTONE};
    m->count--;
    return value;
}

void *em_map_gets(const em_map *m, const char *key)
{
    return em_map_get(m, key, strlen(key));
}

bool em_map_puts(em_map *m, const char *key, void *value)
{
    return em_map_put(m, key, strlen(key), value);
}

bool em_map_next(const em_map *m, size_t *iter, const char **key, size_t *key_len, void **value)
{
    for (size_t i = *iter; i < m->cap; i++) {
        const em_map_entry *e = &m->slots[i];
        if (!is_live(e)) continue;
        if (key) *key = e->key;
        if (key_len) *key_len = e->key_len;
        if (value) *value = e->value;
        *iter = i + 1;
        return true;
    }
    *iter = m->cap;
    return false;
}
