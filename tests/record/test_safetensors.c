/* test_safetensors.c — safetensors files: a round trip of every dtype ember holds (bytes exact,
 * on every device), a file whose bytes are written out here as the format's specification
 * describes them (header length, JSON, data), the exact bytes ember writes (padding to 8, order),
 * loading with dtype conversion, corrupt files (each gives a message naming the problem, never a
 * crash), writer misuse, and an interrupted write that leaves the previous file intact. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <dirent.h>

#include <cmocka.h>

#include "base/file.h"
#include "ember/record.h"
#include "tensor/tensor_util.h"

static char g_dir[512];

static int setup(void **state)
{
    if (em_temp_dir("ember-st", g_dir, sizeof g_dir) != EM_OK) return -1;
    return tu_setup(state);
}

static int teardown(void **state)
{
    em_remove_tree(g_dir);
    return tu_teardown(state);
}

static void path_of(const char *name, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", g_dir, name);
}

/* Writes a file: the 8-byte little-endian length of json, json, then data. */
static void write_raw(const char *path, const char *json, const void *data, size_t ndata)
{
    size_t hl = strlen(json);
    uint8_t *buf = malloc(8 + hl + ndata + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    if (ndata) memcpy(buf + 8 + hl, data, ndata);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, 8 + hl + ndata, f), 8 + hl + ndata);
    fclose(f);
    free(buf);
}

static em_safetensors *open_ok(const char *path)
{
    em_safetensors *f = em_safetensors_open(path);
    if (!f) fail_msg("open %s: %s", path, em_last_error());
    return f;
}

/* ---- round trips
 * ---------------------------------------------------------------------------------- */

static void test_roundtrip_every_dtype(void **state)
{
    (void)state;
    static const em_scalar dts[] = {EM_F64, EM_F32, EM_F16, EM_BF16,
                                    EM_I64, EM_I32, EM_U8,  EM_BOOL};
    static const char *names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL"};
    char path[600];
    path_of("all.safetensors", path, sizeof path);
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        em_safetensors_writer *w = em_safetensors_writer_new();
        em_tensor *ts[8] = {0};
        double vals[8][6];
        for (int i = 0; i < 8; i++) {
            if (!tu_has(dev, dts[i])) continue;
            tu_fill(vals[i], 6, -100, 100, (uint32_t)i + 1);
            if (dts[i] == EM_U8)
                for (int k = 0; k < 6; k++) vals[i][k] = fabs(vals[i][k]);
            if (dts[i] == EM_BOOL)
                for (int k = 0; k < 6; k++) vals[i][k] = vals[i][k] > 0;
            ts[i] = tu_tensor(dev, dts[i], EM_SHAPE(2, 3), vals[i]);
            char name[32];
            snprintf(name, sizeof name, "t.%s", names[i]);
            assert_int_equal(em_safetensors_add(w, name, ts[i]), EM_OK);
        }
        /* a 0-d tensor, an empty one and a transposed (non-contiguous) view */
        em_tensor *s0 = em_scalar_tensor(dev, EM_F32, 2.5);
        em_tensor *empty = em_zeros(dev, EM_F32, EM_SHAPE(0, 4));
        double tv[6] = {1, 2, 3, 4, 5, 6};
        em_tensor *base = tu_tensor(dev, EM_F32, EM_SHAPE(2, 3), tv);
        em_tensor *tr = em_transpose(base, 0, 1);
        assert_int_equal(em_safetensors_add(w, "scalar", s0), EM_OK);
        assert_int_equal(em_safetensors_add(w, "empty", empty), EM_OK);
        assert_int_equal(em_safetensors_add(w, "transposed", tr), EM_OK);
        assert_int_equal(em_safetensors_add_metadata(w, "format", "pt"), EM_OK);
        /* the writer holds its own references */
        em_release(s0);
        em_release(empty);
        em_release(tr);
        em_status st = em_safetensors_write(w, path);
        if (st != EM_OK) fail_msg("write: %s", em_last_error());
        em_safetensors_writer_free(w);

        em_safetensors *f = open_ok(path);
        assert_string_equal(em_safetensors_metadata(f, "format"), "pt");
        assert_null(em_safetensors_metadata(f, "nope"));
        for (int i = 0; i < 8; i++) {
            if (!ts[i]) continue;
            char name[32];
            snprintf(name, sizeof name, "t.%s", names[i]);
            em_scalar dt;
            em_shape sh;
            assert_true(em_safetensors_info(f, name, &dt, &sh));
            assert_int_equal(dt, dts[i]);
            assert_int_equal(sh.rank, 2);
            em_tensor *back = em_safetensors_load(f, name, dev, EM_SCALAR_COUNT);
            assert_int_equal(em_dtype(back), dts[i]);
            tu_check(name, back, EM_SHAPE(2, 3), vals[i], 0);
            em_release(back);
            em_release(ts[i]);
        }
        em_tensor *b0 = em_safetensors_load(f, "scalar", dev, EM_SCALAR_COUNT);
        tu_check("scalar", b0, EM_SHAPE(), (double[]){2.5}, 0);
        em_tensor *be = em_safetensors_load(f, "empty", dev, EM_SCALAR_COUNT);
        assert_non_null(be);
        assert_int_equal(em_numel(be), 0);
        assert_int_equal(em_dim(be, 1), 4);
        em_tensor *bt = em_safetensors_load(f, "transposed", dev, EM_SCALAR_COUNT);
        tu_check("transposed", bt, EM_SHAPE(3, 2), (double[]){1, 4, 2, 5, 3, 6}, 0);
        em_release(b0);
        em_release(be);
        em_release(bt);
        em_release(base);
        em_safetensors_close(f);
    }
}

/* A file as the specification describes it, bytes written here by hand. */
static void test_hand_written_file(void **state)
{
    (void)state;
    char path[600];
    path_of("hand.safetensors", path, sizeof path);
    /* "b" comes first in the data but second in the header; "a" is f32 [2], "b" i32 [1],
     * "c" bf16 [2] (1.0 = 0x3f80, -2.0 = 0xc000) */
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                       "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]}}   ";
    uint8_t data[16] = {
        0xf9, 0xff, 0xff, 0xff, /* b: -7 */
        0x00, 0x00, 0xc0, 0x3f, /* a[0]: 1.5f */
        0x00, 0x00, 0x20, 0xc1, /* a[1]: -10.0f */
        0x80, 0x3f, 0x00, 0xc0, /* c: 1.0, -2.0 */
    };
    write_raw(path, json, data, sizeof data);
    em_safetensors *f = open_ok(path);
    assert_int_equal(em_safetensors_count(f), 3);
    assert_string_equal(em_safetensors_name(f, 0), "a"); /* header order */
    assert_string_equal(em_safetensors_name(f, 1), "b");
    assert_string_equal(em_safetensors_name(f, 2), "c");
    assert_null(em_safetensors_name(f, 3));
    assert_string_equal(em_safetensors_metadata(f, "k"), "v");
    em_device *cpu = tu_devs[0];
    em_tensor *a = em_safetensors_load(f, "a", cpu, EM_SCALAR_COUNT);
    tu_check("a", a, EM_SHAPE(2), (double[]){1.5, -10.0}, 0);
    em_tensor *b = em_safetensors_load(f, "b", cpu, EM_SCALAR_COUNT);
    assert_int_equal(em_dtype(b), EM_I32);
    tu_check("b", b, EM_SHAPE(1), (double[]){-7}, 0);
    em_tensor *c = em_safetensors_load(f, "c", cpu, EM_F32);
    assert_int_equal(em_dtype(c), EM_F32);
    tu_check("c", c, EM_SHAPE(2), (double[]){1.0, -2.0}, 0);
    assert_null(em_safetensors_load(f, "zz", cpu, EM_SCALAR_COUNT));
    assert_non_null(strstr(em_last_error(), "zz"));
    em_release(a);
    em_release(b);
    em_release(c);
    em_safetensors_close(f);
}

/* The exact bytes ember writes: header padded with spaces to 8, tensors in the order added. */
static void test_written_bytes(void **state)
{
    (void)state;
    char path[600];
    path_of("exact.safetensors", path, sizeof path);
    em_device *cpu = tu_devs[0];
    em_tensor *z = em_from_host(cpu, EM_I32, EM_SHAPE(1), (int32_t[]){258});
    em_tensor *y = em_from_host(cpu, EM_U8, EM_SHAPE(2), (uint8_t[]){7, 9});
    em_safetensors_writer *w = em_safetensors_writer_new();
    assert_int_equal(em_safetensors_add(w, "z", z), EM_OK);
    assert_int_equal(em_safetensors_add(w, "y", y), EM_OK);
    assert_int_equal(em_safetensors_write(w, path), EM_OK);
    em_safetensors_writer_free(w);
    em_release(z);
    em_release(y);
    const char *json = "{\"z\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"y\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}";
    size_t hl = strlen(json), padded = (hl + 7) / 8 * 8, len = 0;
    char *got = em_file_read(path, &len);
    assert_non_null(got);
    assert_int_equal(len, 8 + padded + 6);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | (uint8_t)got[i];
    assert_int_equal(n, padded);
    assert_memory_equal(got + 8, json, hl);
    for (size_t i = hl; i < padded; i++) assert_int_equal(got[8 + i], ' ');
    const uint8_t data[6] = {2, 1, 0, 0, 7, 9};
    assert_memory_equal(got + 8 + padded, data, 6);
    free(got);
}

static void test_load_converts(void **state)
{
    (void)state;
    char path[600];
    path_of("conv.safetensors", path, sizeof path);
    double v[4] = {1.0, -2.5, 1.0 / 3.0, 65504.0 * 2};
    em_tensor *t = tu_tensor(tu_devs[0], EM_F64, EM_SHAPE(4), v);
    em_safetensors_writer *w = em_safetensors_writer_new();
    assert_int_equal(em_safetensors_add(w, "x", t), EM_OK);
    assert_int_equal(em_safetensors_write(w, path), EM_OK);
    em_safetensors_writer_free(w);
    em_release(t);
    em_safetensors *f = open_ok(path);
    for (int d = 0; d < tu_ndev; d++) {
        em_device *dev = tu_devs[d];
        static const em_scalar to[] = {EM_F32, EM_F16, EM_BF16, EM_I32};
        for (int k = 0; k < 4; k++) {
            if (!tu_has(dev, to[k])) continue;
            em_tensor *x = em_safetensors_load(f, "x", dev, to[k]);
            if (!x) fail_msg("load as %s: %s", em_scalar_name(to[k]), em_last_error());
            assert_int_equal(em_dtype(x), to[k]);
            double ref[4];
            for (int i = 0; i < 4; i++)
                ref[i] = to[k] == EM_I32 ? trunc(v[i]) : tu_round(to[k], v[i]);
            tu_check(em_scalar_name(to[k]), x, EM_SHAPE(4), ref, 0);
            em_release(x);
        }
    }
    em_safetensors_close(f);
}

/* ---- corrupt files
 * ---------------------------------------------------------------------------------- */

static void expect_open_error(const char *name, const char *json, size_t ndata, const char *part)
{
    char path[600];
    path_of(name, path, sizeof path);
    uint8_t data[64] = {0};
    assert_true(ndata <= sizeof data);
    write_raw(path, json, data, ndata);
    em_safetensors *f = em_safetensors_open(path);
    if (f || !strstr(em_last_error(), part))
        fail_msg("%s: expected an error containing \"%s\", got %s \"%s\"", name, part,
                 f ? "a file and" : "", em_last_error());
    assert_non_null(strstr(em_last_error(), path)); /* the message names the file */
}

static void test_corrupt_files(void **state)
{
    (void)state;
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_open_error("ok-but-short", ok, 4, "exceed the data section");
    expect_open_error("badjson", "{\"a\":{\"dtype\":\"F32\",", 8, "not valid JSON");
    expect_open_error("array", "[1, 2, 3]", 0, "not a JSON object");
    expect_open_error("trailing", "{} xyz", 0, "after the header");
    expect_open_error("offsets-range",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8,
                      "exceed the data section");
    expect_open_error("offsets-reversed",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8,
                      "begin <= end");
    expect_open_error("mismatch",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                      "does not take the 8 bytes");
    expect_open_error("mismatch-dtype",
                      "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                      "does not take");
    expect_open_error("dtype", "{\"a\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                      8, "unknown dtype \"F17\"");
    expect_open_error("negative",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                      "not a non-negative integer");
    expect_open_error("fraction",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8,
                      "not a non-negative integer");
    expect_open_error("huge-dims",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296,"
                      "4294967296],\"data_offsets\":[0,8]}}",
                      8, "does not take");
    expect_open_error("huge-empty",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,4294967296,4294967296],"
                      "\"data_offsets\":[0,0]}}",
                      8, "does not take");
    expect_open_error("rank",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
                      "1,1,1,1],\"data_offsets\":[0,4]}}",
                      8, "rank");
    expect_open_error("no-offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    expect_open_error("overlap",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, "overlap");
    expect_open_error("duplicate",
                      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                      8, "twice");
    expect_open_error("meta", "{\"__metadata__\":{\"k\":3}}", 0, "not a string");
    expect_open_error("entry", "{\"a\":5}", 0, "not a JSON object");

    /* too short for the length; header length past the end; header length huge */
    char path[600];
    path_of("tiny", path, sizeof path);
    FILE *f = fopen(path, "wb");
    fwrite("\x05\0\0", 1, 3, f);
    fclose(f);
    assert_null(em_safetensors_open(path));
    assert_non_null(strstr(em_last_error(), "too short"));
    uint8_t hdr[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    path_of("huge", path, sizeof path);
    f = fopen(path, "wb");
    fwrite(hdr, 1, 10, f);
    fclose(f);
    assert_null(em_safetensors_open(path));
    assert_non_null(strstr(em_last_error(), "header length"));
    hdr[0] = 200, memset(hdr + 1, 0, 7);
    path_of("past", path, sizeof path);
    f = fopen(path, "wb");
    fwrite(hdr, 1, 10, f);
    fclose(f);
    assert_null(em_safetensors_open(path));
    assert_non_null(strstr(em_last_error(), "header length 200"));
    /* a truncated copy of a good file */
    char good[600];
    path_of("good", good, sizeof good);
    write_raw(good, ok, (float[]){1, 2}, 8);
    size_t len;
    char *bytes = em_file_read(good, &len);
    for (size_t cut = 0; cut < len; cut += 3) {
        path_of("cut", path, sizeof path);
        f = fopen(path, "wb");
        fwrite(bytes, 1, cut, f);
        fclose(f);
        em_safetensors *s = em_safetensors_open(path);
        if (s) fail_msg("a file cut at %zu of %zu bytes opened", cut, len);
    }
    free(bytes);
    path_of("missing-file", path, sizeof path);
    assert_null(em_safetensors_open(path));
    assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
}

/* Gaps in the data section and entries out of offset order are allowed; zero-size tensors may
 * share an offset. Unsupported dtypes open but refuse to load. */
static void test_lenient_and_unsupported(void **state)
{
    (void)state;
    char path[600];
    path_of("lenient", path, sizeof path);
    const char *json = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]},"
                       "\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[6,6]},"
                       "\"e2\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[6,6]},"
                       "\"i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]}}";
    write_raw(path, json, (uint8_t[]){1, 2, 0, 0, 0, 0, 5, 6, 0}, 9);
    em_safetensors *f = open_ok(path);
    em_tensor *b = em_safetensors_load(f, "b", tu_devs[0], EM_SCALAR_COUNT);
    tu_check("b", b, EM_SHAPE(2), (double[]){5, 6}, 0);
    em_release(b);
    em_scalar dt;
    assert_true(em_safetensors_info(f, "i8", &dt, NULL));
    assert_int_equal(dt, EM_I8);
    assert_null(em_safetensors_load(f, "i8", tu_devs[0], EM_SCALAR_COUNT));
    assert_non_null(strstr(em_last_error(), "dtype I8 is not supported"));
    em_safetensors_close(f);
}

/* ---- the writer
 * ----------------------------------------------------------------------------------- */

static void test_writer_misuse(void **state)
{
    (void)state;
    em_tensor *t = em_zeros(tu_devs[0], EM_F32, EM_SHAPE(2));
    em_safetensors_writer *w = em_safetensors_writer_new();
    assert_int_equal(em_safetensors_add(w, "a", t), EM_OK);
    assert_int_equal(em_safetensors_add(w, "a", t), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "\"a\" added twice"));
    assert_int_equal(em_safetensors_add(w, "__metadata__", t), EM_ERR_INVALID);
    assert_int_equal(em_safetensors_add(w, NULL, t), EM_ERR_INVALID);
    char path[600];
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", g_dir);
    assert_int_not_equal(em_safetensors_write(w, path), EM_OK);
    assert_non_null(strstr(em_last_error(), "no/such/dir"));
    em_safetensors_writer_free(w);
    em_release(t);
}

static size_t count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

/* A write that fails midway (the file size limit cuts it) leaves the old file as it was and no
 * temp file behind. */
static void test_interrupted_write_keeps_old_file(void **state)
{
    (void)state;
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/atomic", g_dir);
    assert_int_equal(em_mkdir_p(dir), EM_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    em_device *cpu = tu_devs[0];
    em_tensor *small = em_full(cpu, EM_F32, EM_SHAPE(4), 3.0);
    em_safetensors_writer *w = em_safetensors_writer_new();
    assert_int_equal(em_safetensors_add(w, "w", small), EM_OK);
    assert_int_equal(em_safetensors_write(w, path), EM_OK);
    em_safetensors_writer_free(w);
    size_t old_len;
    char *old = em_file_read(path, &old_len);

    em_tensor *big = em_full(cpu, EM_F32, EM_SHAPE(256, 1024), 7.0); /* 1 MiB */
    w = em_safetensors_writer_new();
    assert_int_equal(em_safetensors_add(w, "w", big), EM_OK);
    struct rlimit saved, lim;
    getrlimit(RLIMIT_FSIZE, &saved);
    lim = saved;
    lim.rlim_cur = 64 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    em_status st = em_safetensors_write(w, path);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    assert_int_not_equal(st, EM_OK);
    assert_non_null(strstr(em_last_error(), path));
    em_safetensors_writer_free(w);

    size_t now_len;
    char *now = em_file_read(path, &now_len);
    assert_int_equal(now_len, old_len);
    assert_memory_equal(now, old, old_len);
    assert_int_equal(count_entries(dir), 1); /* no temp file left */
    em_safetensors *f = open_ok(path);
    em_tensor *back = em_safetensors_load(f, "w", cpu, EM_SCALAR_COUNT);
    tu_check("old", back, EM_SHAPE(4), (double[]){3, 3, 3, 3}, 0);
    em_release(back);
    em_safetensors_close(f);
    free(old);
    free(now);
    em_release(small);
    em_release(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_dtype),
        cmocka_unit_test(test_hand_written_file),
        cmocka_unit_test(test_written_bytes),
        cmocka_unit_test(test_load_converts),
        cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_lenient_and_unsupported),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_interrupted_write_keeps_old_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
