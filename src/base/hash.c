/* hash.c — non-cryptographic hashing.
 *
 * em_hash64 is a multiply-fold hash in the family of mum-hash and wyhash: 64-bit words are mixed
 * pairwise through a full 64x64->128-bit multiply whose halves are folded together by xor. Inputs
 * above 32 bytes run two independent lanes of 16 bytes each, so the multiplies overlap.
 *
 * em_hasher is a streaming 128-bit hash: two lanes absorb every 8-byte word, one with an
 * xxHash-style round (add, rotate, multiply) and one that also takes in the first lane, and the
 * pair goes through a murmur-style avalanche at the end. Each step is a bijection of the state for
 * a fixed word, so no input can collapse the state. Both hashes read words little-endian on every
 * host; the results are part of the cache key format, so changing them invalidates caches. */
#include "base/hash.h"

#include <string.h>

#define K0 0x9e3779b97f4a7c15ull /* 2^64 / golden ratio */
#define K1 0xbf58476d1ce4e5b9ull /* splitmix64 multipliers */
#define K2 0x94d049bb133111ebull
#define K3 0xc2b2ae3d27d4eb4full /* odd constants with well-spread bits */
#define K4 0x165667b19e3779f9ull

static uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static uint64_t load32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

/* The full 128-bit product of a and b, split into its halves in place. */
static void mul128(uint64_t *a, uint64_t *b)
{
    unsigned __int128 r = (unsigned __int128)*a * *b;
    *a = (uint64_t)r;
    *b = (uint64_t)(r >> 64);
}

/* The product of a and b with its halves folded together. */
static uint64_t fold_mul(uint64_t a, uint64_t b)
{
    mul128(&a, &b);
    return a ^ b;
}

/* Reads the 0..16 bytes of a short input into two words; overlapping reads are fine because the
 * length is mixed in at the end. */
static void read_short(const unsigned char *p, size_t len, uint64_t *a, uint64_t *b)
{
    if (len >= 8) {
        *a = load64(p);
        *b = load64(p + len - 8);
    } else if (len >= 4) {
        *a = load32(p);
        *b = load32(p + len - 4);
    } else if (len > 0) {
        *a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len / 2] << 8) | p[len - 1];
        *b = 0;
    } else {
        *a = *b = 0;
    }
}

/* Absorbs all but the last 1..16 bytes of a long input (len > 16) into the state s. */
static const unsigned char *absorb_long(const unsigned char *p, size_t *len, uint64_t *s)
{
    size_t n = *len;
    if (n > 32) {
        uint64_t s1 = *s ^ K2;
        do {
            *s = fold_mul(load64(p) ^ K1, load64(p + 8) ^ *s);
            s1 = fold_mul(load64(p + 16) ^ K3, load64(p + 24) ^ s1);
            p += 32;
            n -= 32;
        } while (n > 32);
        *s ^= s1;
    }
    while (n > 16) {
        *s = fold_mul(load64(p) ^ K1, load64(p + 8) ^ *s);
        p += 16;
        n -= 16;
    }
    *len = n;
    return p;
}

uint64_t em_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t s = seed ^ fold_mul(seed ^ K0, K1);
    uint64_t a, b;
    if (len <= 16) {
        read_short(p, len, &a, &b);
    } else {
        size_t rest = len;
        p = absorb_long(p, &rest, &s);
        a = load64(p + rest - 16); /* the last 16 bytes, overlapping what was absorbed */
        b = load64(p + rest - 8);
    }
    a ^= K1;
    b ^= s;
    mul128(&a, &b);
    return fold_mul(a ^ K0 ^ (uint64_t)len, b ^ K2);
}

/* --- the streaming 128-bit hash --------------------------------------------------------------- */

void em_hasher_init(em_hasher *h)
{
    h->a = K0;
    h->b = K3;
    h->len = 0;
    h->tail = 0;
}

/* One word into both lanes. */
static void absorb_word(uint64_t *a, uint64_t *b, uint64_t w)
{
    *a = rotl(*a + w * K2, 31) * K1;
    *b = rotl(*b ^ (w + *a), 27) * K4 + K0;
}

void em_hasher_bytes(em_hasher *h, const void *data, size_t len)
{
    const unsigned char *p = data;
    unsigned fill = (unsigned)(h->len & 7);
    h->len += len;
    if (fill) { /* finish the pending word first */
        while (fill < 8 && len > 0) {
            h->tail |= (uint64_t)*p++ << (8 * fill++);
            len--;
        }
        if (fill < 8) return;
        absorb_word(&h->a, &h->b, h->tail);
        h->tail = 0;
    }
    for (; len >= 8; p += 8, len -= 8) absorb_word(&h->a, &h->b, load64(p));
    for (unsigned i = 0; i < len; i++) h->tail |= (uint64_t)p[i] << (8 * i);
}

void em_hasher_u64(em_hasher *h, uint64_t v)
{
    unsigned char bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)(v >> (8 * i));
    em_hasher_bytes(h, bytes, 8);
}

void em_hasher_str(em_hasher *h, const char *s)
{
    if (!s) {
        em_hasher_u64(h, UINT64_MAX);
        return;
    }
    size_t n = strlen(s);
    em_hasher_u64(h, (uint64_t)n);
    em_hasher_bytes(h, s, n);
}

/* The murmur3 64-bit finalizer: every input bit affects every output bit. */
static uint64_t avalanche(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

void em_hasher_digest(const em_hasher *h, uint64_t out[2])
{
    uint64_t a = h->a, b = h->b;
    if (h->len & 7) absorb_word(&a, &b, h->tail); /* zero padding: the length tells it apart */
    a ^= h->len;
    b ^= h->len * K3;
    a += b;
    b += a;
    a = avalanche(a);
    b = avalanche(b);
    a += b;
    b += a;
    out[0] = a;
    out[1] = b;
}

void em_hasher_hex(const em_hasher *h, char out[33])
{
    static const char digits[] = "0123456789abcdef";
    uint64_t d[2];
    em_hasher_digest(h, d);
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 16; i++) out[w * 16 + i] = digits[(d[w] >> (60 - 4 * i)) & 15];
    out[32] = '\0';
}
