/* test_hash.c — hashing: pinned values (the hashes are part of the on-disk cache key format, so a
 * change must be deliberate), incremental == one-shot for every split, seeds, lengths, alignment,
 * avalanche, and no collisions over large sets of distinct keys. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

typedef struct {
    const char *input;  /* hashed without its NUL */
    uint64_t seed0;     /* em_hash64(input, len, 0) */
    uint64_t seed42;    /* em_hash64(input, len, 42) */
    const char *hex128; /* em_hasher over the bytes */
} golden;

static const golden goldens[] = {
    {"", 0xa2c9e1b2192297efull, 0x6b71882974780c47ull, "a4d656a01bd817c69a825437f13f443c"},
    {"a", 0x8db25b8aae56b7abull, 0xc71a8205f8175895ull, "31a1cfd8196237bedca08c77ad89e1eb"},
    {"abc", 0x94e6a2b55c70883full, 0x17b607181d2fc292ull, "7302bcc2128d34f3b68408710f5931e2"},
    {"hello, world", 0x8ba859722c4efba4ull, 0x8358fce347aa665dull,
     "ca4220cc86fbd6b7995c0dd5de84488a"},
    {"0123456789abcdef", 0xe2ab1ac52a483474ull, 0x39489b0fc5d86ed7ull,
     "0216f50b96d79ea3ab6c6c33a55db8b8"},
    {"0123456789abcdefg", 0xdef524b8201e1965ull, 0xb11e49fb5494e162ull,
     "8463534edd8001dce081918f3d607a61"},
    {"The quick brown fox jumps over the lazy dog; the quick brown fox jumps over the lazy dog.",
     0xfcd40907302d3d07ull, 0x9e1e9b7df2d4bbd8ull, "161cf656d373feeba138310f2ae6a703"},
};

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void hex_of(const void *data, size_t len, char out[33])
{
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_bytes(&h, data, len);
    em_hasher_hex(&h, out);
}

static void test_pinned_values(void **state)
{
    for (size_t i = 0; i < EM_ARRAY_LEN(goldens); i++) {
        const golden *g = &goldens[i];
        size_t n = strlen(g->input);
        assert_int_equal(em_hash64(g->input, n, 0), g->seed0);
        assert_int_equal(em_hash64(g->input, n, 42), g->seed42);
        char hex[33];
        hex_of(g->input, n, hex);
        assert_string_equal(hex, g->hex128);
    }
}

static void test_deterministic_and_seeded(void **state)
{
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rnd();
    for (size_t n = 0; n <= sizeof buf; n++) {
        assert_int_equal(em_hash64(buf, n, 7), em_hash64(buf, n, 7));
        assert_int_not_equal(em_hash64(buf, n, 7), em_hash64(buf, n, 8));
    }
}

static void test_alignment_independent(void **state)
{
    unsigned char base[200], shifted[216];
    for (size_t i = 0; i < sizeof base; i++) base[i] = (unsigned char)rnd();
    for (size_t off = 1; off < 16; off++) {
        memcpy(shifted + off, base, sizeof base);
        for (size_t n = 0; n <= sizeof base; n += 7) {
            assert_int_equal(em_hash64(base, n, 1), em_hash64(shifted + off, n, 1));
            char a[33], b[33];
            hex_of(base, n, a);
            hex_of(shifted + off, n, b);
            assert_string_equal(a, b);
        }
    }
}

static void test_incremental_equals_one_shot(void **state)
{
    char abc[33], ab_c[33];
    hex_of("abc", 3, abc);
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_bytes(&h, "ab", 2);
    em_hasher_bytes(&h, "c", 1);
    em_hasher_hex(&h, ab_c);
    assert_string_equal(abc, ab_c);

    unsigned char buf[100];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rnd();
    char whole[33], parts[33];
    hex_of(buf, sizeof buf, whole);
    for (size_t a = 0; a <= sizeof buf; a++) { /* every split in two, and in three */
        for (size_t b = a; b <= sizeof buf; b += 3) {
            em_hasher_init(&h);
            em_hasher_bytes(&h, buf, a);
            em_hasher_bytes(&h, buf + a, b - a);
            em_hasher_bytes(&h, buf + b, sizeof buf - b);
            em_hasher_hex(&h, parts);
            assert_string_equal(whole, parts);
        }
    }
    em_hasher_init(&h); /* byte by byte, with empty pieces in between */
    for (size_t i = 0; i < sizeof buf; i++) {
        em_hasher_bytes(&h, buf + i, 1);
        em_hasher_bytes(&h, buf, 0);
    }
    em_hasher_hex(&h, parts);
    assert_string_equal(whole, parts);
}

static void test_u64_and_str(void **state)
{
    em_hasher h1, h2;
    em_hasher_init(&h1);
    em_hasher_init(&h2);
    em_hasher_bytes(&h1, "x", 1); /* misaligned on purpose */
    em_hasher_bytes(&h2, "x", 1);
    em_hasher_u64(&h1, 0x0123456789abcdefull);
    const unsigned char le[8] = {0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};
    em_hasher_bytes(&h2, le, 8);
    char a[33], b[33];
    em_hasher_hex(&h1, a);
    em_hasher_hex(&h2, b);
    assert_string_equal(a, b);

    em_hasher_init(&h1);
    em_hasher_init(&h2);
    em_hasher_str(&h1, "ab");
    em_hasher_str(&h1, "c");
    em_hasher_str(&h2, "a");
    em_hasher_str(&h2, "bc");
    em_hasher_hex(&h1, a);
    em_hasher_hex(&h2, b);
    assert_string_not_equal(a, b);

    em_hasher_init(&h1);
    em_hasher_init(&h2);
    em_hasher_str(&h1, NULL);
    em_hasher_str(&h2, "");
    em_hasher_hex(&h1, a);
    em_hasher_hex(&h2, b);
    assert_string_not_equal(a, b);
}

static void test_hex_format(void **state)
{
    char hex[33];
    memset(hex, 'Z', sizeof hex);
    hex_of("format", 6, hex);
    assert_int_equal(strlen(hex), 32);
    for (int i = 0; i < 32; i++) assert_non_null(strchr("0123456789abcdef", hex[i]));
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_bytes(&h, "format", 6);
    uint64_t d[2];
    em_hasher_digest(&h, d);
    char want[33];
    snprintf(want, sizeof want, "%016llx%016llx", (unsigned long long)d[0],
             (unsigned long long)d[1]);
    assert_string_equal(hex, want);
    em_hasher_bytes(&h, "!", 1); /* digest did not consume the state */
    char more[33];
    em_hasher_hex(&h, more);
    char direct[33];
    hex_of("format!", 7, direct);
    assert_string_equal(more, direct);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Counts equal neighbours after sorting. */
static size_t duplicates(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    size_t d = 0;
    for (size_t i = 1; i < n; i++) d += v[i] == v[i - 1];
    return d;
}

static void test_different_inputs_differ(void **state)
{
    enum { N = 200000 };
    uint64_t *h = malloc(4 * N * sizeof *h);
    uint64_t *h128 = malloc(N * sizeof *h128);
    assert_non_null(h);
    assert_non_null(h128);
    size_t k = 0;
    /* from 1: the zero integers are the 4- and 8-byte inputs of the all-zero keys below */
    for (uint32_t i = 1; i <= N; i++) h[k++] = em_hash64(&i, 4, 0); /* small integers */
    for (uint64_t i = 1; i <= N; i++) {
        uint64_t v = i << 40; /* sparse high bits */
        h[k++] = em_hash64(&v, 8, 0);
    }
    for (int i = 0; i < N; i++) {
        char s[32];
        int n = snprintf(s, sizeof s, "name.%d.weight", i);
        h[k++] = em_hash64(s, (size_t)n, 0);
        em_hasher hh;
        em_hasher_init(&hh);
        em_hasher_bytes(&hh, s, (size_t)n);
        uint64_t d[2];
        em_hasher_digest(&hh, d);
        h128[i] = d[0] ^ d[1] * 3;
    }
    static unsigned char zeros[N / 1000];
    for (size_t n = 0; n < N / 1000; n++) h[k++] = em_hash64(zeros, n, 0); /* length matters */
    assert_int_equal(duplicates(h, k), 0);
    assert_int_equal(duplicates(h128, N), 0);
    free(h);
    free(h128);
}

/* Flipping any one input bit flips about half of the output bits. */
static void test_avalanche(void **state)
{
    static const size_t lens[] = {1, 3, 4, 8, 12, 16, 17, 31, 32, 33, 64, 100};
    for (size_t li = 0; li < EM_ARRAY_LEN(lens); li++) {
        size_t n = lens[li];
        double total = 0, total128 = 0;
        size_t flips = 0;
        unsigned char buf[128];
        for (int trial = 0; trial < 20; trial++) {
            for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)rnd();
            uint64_t h0 = em_hash64(buf, n, 0);
            em_hasher hh;
            uint64_t d0[2], d1[2];
            em_hasher_init(&hh);
            em_hasher_bytes(&hh, buf, n);
            em_hasher_digest(&hh, d0);
            for (size_t bit = 0; bit < n * 8; bit++) {
                buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
                int changed = __builtin_popcountll(h0 ^ em_hash64(buf, n, 0));
                em_hasher_init(&hh);
                em_hasher_bytes(&hh, buf, n);
                em_hasher_digest(&hh, d1);
                int changed128 =
                    __builtin_popcountll(d0[0] ^ d1[0]) + __builtin_popcountll(d0[1] ^ d1[1]);
                buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
                assert_true(changed >= 8);
                assert_true(changed128 >= 30);
                total += changed;
                total128 += changed128;
                flips++;
            }
        }
        assert_true(total / flips > 30.0 && total / flips < 34.0);
        assert_true(total128 / flips > 62.0 && total128 / flips < 66.0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_values),
        cmocka_unit_test(test_deterministic_and_seeded),
        cmocka_unit_test(test_alignment_independent),
        cmocka_unit_test(test_incremental_equals_one_shot),
        cmocka_unit_test(test_u64_and_str),
        cmocka_unit_test(test_hex_format),
        cmocka_unit_test(test_different_inputs_differ),
        cmocka_unit_test(test_avalanche),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
