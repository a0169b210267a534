/* hash.h — non-cryptographic hashing: 64-bit for hash maps, 128-bit (printed as 32 hex digits)
 * for content-addressed cache keys. Stable across runs, processes and machines. */
#ifndef EM_BASE_HASH_H
#define EM_BASE_HASH_H
#include <stddef.h>
#include <stdint.h>

uint64_t em_hash64(const void *data, size_t len, uint64_t seed);

/* An incremental 128-bit hash. */
typedef struct em_hasher {
    uint64_t a, b; /* running state */
    uint64_t len;  /* bytes absorbed */
} em_hasher;

void em_hasher_init(em_hasher *h);
void em_hasher_bytes(em_hasher *h, const void *data, size_t len);
void em_hasher_u64(em_hasher *h, uint64_t v);
void em_hasher_str(em_hasher *h, const char *s); /* absorbs the length too, so "ab","c" != "a","bc" */
/* Writes 32 lowercase hex digits and a NUL into out[33]. */
void em_hasher_hex(const em_hasher *h, char out[33]);

#endif
