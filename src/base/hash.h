/* hash.h — non-cryptographic hashing: 64-bit for hash maps, 128-bit (printed as 32 hex digits)
 * for content-addressed cache keys. Stable across runs, processes and machines. */
#ifndef EM_BASE_HASH_H
#define EM_BASE_HASH_H
#include <stddef.h>
#include <stdint.h>

/* A 64-bit hash of len bytes; different seeds give unrelated hashes. Not for adversarial input. */
uint64_t em_hash64(const void *data, size_t len, uint64_t seed);

/* An incremental 128-bit hash. The result depends only on the bytes absorbed, not on how they
 * were split between calls, and is the same on every host (words are read little-endian). */
typedef struct em_hasher {
    uint64_t a, b; /* running state */
    uint64_t len;  /* bytes absorbed */
    uint64_t tail; /* the unfinished 8-byte word: its first len % 8 bytes, little-endian */
} em_hasher;

void em_hasher_init(em_hasher *h);
void em_hasher_bytes(em_hasher *h, const void *data, size_t len);
void em_hasher_u64(em_hasher *h, uint64_t v); /* the same as absorbing its 8 little-endian bytes */
/* Absorbs the length too, so "ab","c" != "a","bc"; NULL is absorbed as a distinct marker. */
void em_hasher_str(em_hasher *h, const char *s);
/* The finished 128-bit digest as two words; h stays usable for more input. */
void em_hasher_digest(const em_hasher *h, uint64_t out[2]);
/* Writes 32 lowercase hex digits (out[0] then out[1] of the digest) and a NUL into out[33]. */
void em_hasher_hex(const em_hasher *h, char out[33]);

#endif
