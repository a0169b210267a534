/* test_loader.c — token shards and the loader: shards written by ember are read back by an
 * independent reader written here; corrupt or missing shards give clear errors; the loader's
 * batches are checked against the shard contents (inputs/targets shifted by one, every sample
 * once per epoch), deterministic by seed, disjoint between ranks, resumable from a saved
 * position, identical with and without the prefetch thread, and available as device tensors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "data_util.h"
#include "ember/runtime.h"
#include "ember/tensor.h"

/* The independent reader: llm.c's layout read with stdio, nothing shared with src/data. */
static uint32_t *read_shard(const char *path, int *version, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    int32_t header[256];
    if (fread(header, 4, 256, f) != 256 || header[0] != 20240520) {
        fclose(f);
        return NULL;
    }
    *version = header[1];
    *n = (size_t)header[2];
    uint32_t *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) {
        if (header[1] == 1) {
            uint16_t v;
            if (fread(&v, 2, 1, f) != 1) break;
            ids[i] = v;
        } else {
            if (fread(&ids[i], 4, 1, f) != 1) break;
        }
    }
    int extra = fgetc(f);
    fclose(f);
    if (extra != EOF) {
        free(ids);
        return NULL;
    }
    return ids;
}

static void test_shard_roundtrip(void **state)
{
    (void)state;
    char dir[512], path[1200];
    scratch_dir("shards", dir, sizeof dir);
    uint32_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = (uint32_t)(i * 7919) % 50257;
    snprintf(path, sizeof path, "%s/a.bin", dir);
    assert_int_equal(em_shard_write(path, ids, 1000, 50257), EM_OK);
    int version;
    size_t n;
    uint32_t *back = read_shard(path, &version, &n);
    assert_non_null(back);
    assert_int_equal(version, 1);
    assert_int_equal(n, 1000);
    assert_memory_equal(back, ids, sizeof ids);
    free(back);
    /* a vocabulary over 65,536 ids: uint32 tokens, version 2 */
    for (int i = 0; i < 1000; i++) ids[i] = (uint32_t)(i * 104729) % 100000;
    assert_int_equal(em_shard_write(path, ids, 1000, 100000), EM_OK);
    back = read_shard(path, &version, &n);
    assert_non_null(back);
    assert_int_equal(version, 2);
    assert_memory_equal(back, ids, sizeof ids);
    free(back);
    em_shard s;
    assert_int_equal(em_shard_open(&s, path), EM_OK);
    assert_int_equal(s.ntokens, 1000);
    for (int i = 0; i < 1000; i++) assert_int_equal(em_shard_token(&s, (size_t)i), ids[i]);
    em_shard_close(&s);
    /* an id outside the vocabulary */
    assert_int_equal(em_shard_write(path, ids, 1000, 50000), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "outside the vocabulary"));
    remove_dir(dir);
}

static void test_shard_errors(void **state)
{
    (void)state;
    char dir[512], path[1200];
    scratch_dir("shard-errors", dir, sizeof dir);
    em_shard s;
    snprintf(path, sizeof path, "%s/missing.bin", dir);
    assert_int_equal(em_shard_open(&s, path), EM_ERR_NOT_FOUND);
    assert_non_null(strstr(em_last_error(), "missing.bin"));
    int32_t header[256 + 8] = {20240520, 1, 16};
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    write_file(path, header, 1024 + 32); /* 16 uint16 tokens: right */
    assert_int_equal(em_shard_open(&s, path), EM_OK);
    em_shard_close(&s);
    header[0] = 12345; /* wrong magic */
    write_file(path, header, 1024 + 32);
    assert_int_equal(em_shard_open(&s, path), EM_ERR_CORRUPT);
    assert_non_null(strstr(em_last_error(), "magic"));
    header[0] = 20240520;
    header[1] = 7; /* unknown version */
    write_file(path, header, 1024 + 32);
    assert_int_equal(em_shard_open(&s, path), EM_ERR_CORRUPT);
    assert_non_null(strstr(em_last_error(), "version 7"));
    header[1] = 1;
    header[2] = 1000; /* the count disagrees with the size */
    write_file(path, header, 1024 + 32);
    assert_int_equal(em_shard_open(&s, path), EM_ERR_CORRUPT);
    assert_non_null(strstr(em_last_error(), "1000 tokens"));
    write_file(path, header, 100); /* shorter than the header */
    assert_int_equal(em_shard_open(&s, path), EM_ERR_CORRUPT);
    assert_non_null(strstr(em_last_error(), "header"));
    /* the loader names the bad shard, and explains an empty directory */
    em_loader_opts o = {.path = dir, .batch = 1, .seq = 4};
    assert_null(em_loader_open(&o));
    assert_non_null(strstr(em_last_error(), "bad.bin"));
    remove(path);
    assert_null(em_loader_open(&o));
    assert_non_null(strstr(em_last_error(), "no *.bin shards"));
    remove_dir(dir);
}

/* Three shards whose token j of shard k is k * 100000 + j (uint32 shards). */
#define NSHARD 3
static const size_t SHARD_LEN[NSHARD] = {1000, 777, 1500};

static void make_shards(char *dir, size_t cap)
{
    scratch_dir("loader", dir, cap);
    for (int k = 0; k < NSHARD; k++) {
        uint32_t *ids = malloc(SHARD_LEN[k] * sizeof *ids);
        for (size_t j = 0; j < SHARD_LEN[k]; j++) ids[j] = (uint32_t)(k * 100000 + j);
        char path[1200];
        snprintf(path, sizeof path, "%s/train_%06d.bin", dir, k);
        assert_int_equal(em_shard_write(path, ids, SHARD_LEN[k], 400000), EM_OK);
        free(ids);
    }
}

enum { B = 4, T = 16 };

/* Checks a batch against the shards; returns the sample starts (shard*100000 + offset). */
static void check_batch(const int32_t *in, const int32_t *tg, uint32_t starts[B])
{
    for (int b = 0; b < B; b++) {
        int32_t first = in[b * T];
        int k = first / 100000, off = first % 100000;
        assert_true(k >= 0 && k < NSHARD);
        assert_int_equal(off % T, 0);                     /* samples start at multiples of T */
        assert_true((size_t)off + T < SHARD_LEN[k] + 0u); /* T+1 tokens inside the shard */
        for (int j = 0; j < T; j++) {
            assert_int_equal(in[b * T + j], first + j);
            assert_int_equal(tg[b * T + j], first + j + 1); /* targets: inputs shifted by one */
        }
        starts[b] = (uint32_t)first;
    }
}

static void test_sequential_and_epochs(void **state)
{
    (void)state;
    char dir[512];
    make_shards(dir, sizeof dir);
    em_loader_opts o = {.path = dir, .batch = B, .seq = T};
    em_loader *l = em_loader_open(&o);
    assert_non_null(l);
    size_t samples = 0;
    for (int k = 0; k < NSHARD; k++) samples += (SHARD_LEN[k] - 1) / T;
    assert_int_equal(em_loader_batches_per_epoch(l), samples / B);
    assert_int_equal(em_loader_tokens(l), 1000 + 777 + 1500);
    int32_t in[B * T], tg[B * T];
    uint32_t starts[B];
    assert_int_equal(em_loader_next(l, in, tg), EM_OK);
    check_batch(in, tg, starts);
    for (int i = 0; i < B * T; i++) /* sequential: the first B*T+1 tokens of the first shard */
        assert_int_equal(in[i], i);
    for (uint64_t s = 1; s < em_loader_batches_per_epoch(l); s++)
        assert_int_equal(em_loader_next(l, in, tg), EM_OK);
    em_loader_pos p = em_loader_tell(l);
    assert_int_equal(p.epoch, 1);
    assert_int_equal(p.step, 0);
    assert_int_equal(em_loader_next(l, in, tg), EM_OK);
    assert_int_equal(in[0], 0); /* the second epoch starts over */
    em_loader_close(l);
    /* a sequence longer than any shard: a clear error */
    o.seq = 5000;
    assert_null(em_loader_open(&o));
    assert_non_null(strstr(em_last_error(), "fewer than one batch"));
    remove_dir(dir);
}

/* Collects one epoch of sample starts for rank/world. */
static size_t epoch_starts(const char *dir, uint64_t seed, int rank, int world, bool prefetch,
                           uint32_t *out)
{
    em_loader_opts o = {.path = dir,
                        .batch = B,
                        .seq = T,
                        .shuffle = true,
                        .seed = seed,
                        .rank = rank,
                        .world = world,
                        .prefetch = prefetch};
    em_loader *l = em_loader_open(&o);
    assert_non_null(l);
    size_t n = 0;
    int32_t in[B * T], tg[B * T];
    for (uint64_t s = 0; s < em_loader_batches_per_epoch(l); s++) {
        assert_int_equal(em_loader_next(l, in, tg), EM_OK);
        check_batch(in, tg, out + n);
        n += B;
    }
    em_loader_close(l);
    return n;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void test_shuffle_seed_and_ranks(void **state)
{
    (void)state;
    char dir[512];
    make_shards(dir, sizeof dir);
    static uint32_t a[400], b[400], c[400], r0[400], r1[400];
    size_t na = epoch_starts(dir, 7, 0, 1, false, a);
    size_t nb = epoch_starts(dir, 7, 0, 1, true, b); /* same seed, with prefetch: same order */
    size_t nc = epoch_starts(dir, 8, 0, 1, false, c);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    assert_int_equal(na, nc);
    assert_true(memcmp(a, c, na * sizeof *a) != 0); /* another seed, another order */
    /* every sample at most once per epoch */
    qsort(a, na, sizeof *a, cmp_u32);
    for (size_t i = 1; i < na; i++) assert_true(a[i] != a[i - 1]);
    /* two ranks: disjoint samples, the same number of batches */
    size_t n0 = epoch_starts(dir, 7, 0, 2, true, r0);
    size_t n1 = epoch_starts(dir, 7, 1, 2, false, r1);
    assert_int_equal(n0, n1);
    qsort(r0, n0, sizeof *r0, cmp_u32);
    qsort(r1, n1, sizeof *r1, cmp_u32);
    for (size_t i = 0, j = 0; i < n0 && j < n1;) {
        assert_true(r0[i] != r1[j]);
        if (r0[i] < r1[j])
            i++;
        else
            j++;
    }
    em_loader_opts bad = {.path = dir, .batch = B, .seq = T, .rank = 2, .world = 2};
    assert_null(em_loader_open(&bad));
    assert_non_null(strstr(em_last_error(), "rank 2 of 2"));
    remove_dir(dir);
}

static void test_resume(void **state)
{
    (void)state;
    char dir[512];
    make_shards(dir, sizeof dir);
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        em_loader_opts o = {
            .path = dir, .batch = B, .seq = T, .shuffle = true, .seed = 99, .prefetch = prefetch};
        em_loader *l = em_loader_open(&o);
        assert_non_null(l);
        int32_t in[B * T], tg[B * T];
        uint64_t per = em_loader_batches_per_epoch(l);
        for (uint64_t i = 0; i < per - 2; i++) /* stop just before an epoch boundary */
            assert_int_equal(em_loader_next(l, in, tg), EM_OK);
        em_loader_pos saved = em_loader_tell(l);
        int32_t expect[5][B * T];
        for (int i = 0; i < 5; i++) assert_int_equal(em_loader_next(l, expect[i], tg), EM_OK);
        em_loader_close(l);
        /* a new loader (the other prefetch setting) resumes at the saved position */
        o.prefetch = !prefetch;
        l = em_loader_open(&o);
        assert_non_null(l);
        assert_int_equal(em_loader_next(l, in, tg), EM_OK); /* something buffered, then seek */
        assert_int_equal(em_loader_seek(l, saved), EM_OK);
        for (int i = 0; i < 5; i++) {
            assert_int_equal(em_loader_next(l, in, tg), EM_OK);
            assert_memory_equal(in, expect[i], sizeof in);
        }
        em_loader_pos bad = {0, per};
        assert_int_equal(em_loader_seek(l, bad), EM_ERR_INVALID);
        em_loader_close(l);
    }
    remove_dir(dir);
}

static void test_tensors(void **state)
{
    (void)state;
    em_device *dev = em_device_open("cpu");
    if (!dev) {
        fprintf(stderr, "SKIP: no cpu device: %s\n", em_last_error());
        skip();
    }
    char dir[512];
    make_shards(dir, sizeof dir);
    em_loader_opts o = {.path = dir, .batch = B, .seq = T};
    em_loader *l = em_loader_open(&o);
    assert_non_null(l);
    em_tensor *x, *y;
    assert_int_equal(em_loader_next_tensors(l, dev, &x, &y), EM_OK);
    assert_int_equal(em_dim(x, 0), B);
    assert_int_equal(em_dim(x, 1), T);
    int32_t hx[B * T], hy[B * T];
    assert_int_equal(em_to_host(x, hx, sizeof hx), EM_OK);
    assert_int_equal(em_to_host(y, hy, sizeof hy), EM_OK);
    for (int i = 0; i < B * T; i++) {
        assert_int_equal(hx[i], i);
        assert_int_equal(hy[i], i + 1);
    }
    em_release(x);
    em_release(y);
    em_loader_close(l);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_roundtrip),
        cmocka_unit_test(test_shard_errors),
        cmocka_unit_test(test_sequential_and_epochs),
        cmocka_unit_test(test_shuffle_seed_and_ranks),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
