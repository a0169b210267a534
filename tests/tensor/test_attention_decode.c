/* test_attention_decode.c — em_attention_decode on every device against a float64 reference:
 * rows that see 1 key, a few, more than one chunk and none (pos -1), a key range past the visible
 * length whose contents must not matter, head sizes 64, 48 and 160, strided k/v views of a
 * larger cache, every float dtype; then a sweep over Tk 1, 7, 192, 1000, 2048, D 16, 64, 80, 128
 * (and 1, 33, 256), R 1 and 3, positions -1, 0, Tk / 2, Tk - 1 and past Tk, with k and v views
 * of a KV cache [R, 2, H, Tc, D] as the batched decode step reads them, with the default split
 * and forced splits (EMBER_ATTENTION_DECODE_SPLIT), each result computed twice and bitwise equal;
 * em_attention_decode_append against em_scatter_rows_ + em_attention_decode (outputs and whole
 * caches bitwise equal, rows whose position is negative or past the attended keys, the splits
 * merged by a second launch and by the last cube, counters back at zero, a second call); and the
 * errors for mismatched inputs. */
#include "tensor_util.h"

/* ref[r, h, e] = softmax over j <= pos[r] of (q . k_j) * scale, times v_j. */
static void reference(const double *q, const double *k, const double *v, const int64_t *pos,
                      int R, int H, int Tk, int D, int Tc, double scale, double *out)
{
    for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) {
            const double *qr = q + ((size_t)r * H + h) * D;
            const double *kb = k + ((size_t)r * H + h) * Tc * D;
            const double *vb = v + ((size_t)r * H + h) * Tc * D;
            double *o = out + ((size_t)r * H + h) * D;
            int n = pos[r] < 0 ? 0 : (int)(pos[r] + 1 < Tk ? pos[r] + 1 : Tk);
            double m = -INFINITY, l = 0;
            double *s = malloc(sizeof(double) * (n + 1));
            for (int j = 0; j < n; j++) {
                s[j] = 0;
                for (int e = 0; e < D; e++) s[j] += qr[e] * kb[(size_t)j * D + e];
                s[j] *= scale;
                if (s[j] > m) m = s[j];
            }
            for (int e = 0; e < D; e++) o[e] = 0;
            for (int j = 0; j < n; j++) {
                double p = exp(s[j] - m);
                l += p;
                for (int e = 0; e < D; e++) o[e] += p * vb[(size_t)j * D + e];
            }
            for (int e = 0; e < D; e++) o[e] = n ? o[e] / l : 0;
            free(s);
        }
}

/* R rows of H heads; the cache holds Tc positions of which the op sees the first Tk. */
static void check_case(em_device *dev, em_scalar dt, int H, int D, int Tc, int Tk,
                       const int64_t *pos, int R)
{
    size_t nq = (size_t)R * H * D, nk = (size_t)R * H * Tc * D;
    double *q = malloc(nq * 8), *k = malloc(nk * 8), *v = malloc(nk * 8), *ref = malloc(nq * 8);
    tu_fill(q, nq, -1, 1, 11u + (uint32_t)D);
    tu_fill(k, nk, -1, 1, 23u + (uint32_t)Tc);
    tu_fill(v, nk, -2, 2, 37u + (uint32_t)H);
    em_tensor *tq = tu_tensor(dev, dt, EM_SHAPE(R, H, 1, D), q);
    em_tensor *tk = tu_tensor(dev, dt, EM_SHAPE(R, H, Tc, D), k);
    em_tensor *tv = tu_tensor(dev, dt, EM_SHAPE(R, H, Tc, D), v);
    em_tensor *tp = em_from_host(dev, EM_I64, EM_SHAPE(R), pos);
    assert_non_null(tp);
    double scale = 1.0 / sqrt((double)D);
    reference(q, k, v, pos, R, H, Tk, D, Tc, scale, ref);
    /* the first Tk positions of the cache: a strided view */
    em_tensor *kk = em_narrow(tk, 2, 0, Tk), *vv = em_narrow(tv, 2, 0, Tk);
    em_tensor *o = em_attention_decode(tq, kk, vv, tp, scale);
    char what[96];
    snprintf(what, sizeof what, "attention_decode %s H%d D%d Tk%d", em_scalar_name(dt), H, D, Tk);
    tu_check(what, o, EM_SHAPE(R, H, 1, D), ref, tu_tol_on(dev, dt));
    em_release(o);
    em_release(kk);
    em_release(vv);
    em_release(tq);
    em_release(tk);
    em_release(tv);
    em_release(tp);
    free(q), free(k), free(v), free(ref);
}

static void test_values(void **state)
{
    (void)state;
    static const int64_t pos4[] = {0, 5, 270, -1};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t t = 0; t < sizeof tu_float_types / sizeof *tu_float_types; t++) {
            em_scalar dt = tu_float_types[t];
            if (!tu_has(dev, dt)) continue;
            check_case(dev, dt, 2, 64, 300, 288, pos4, 4); /* pos 270: two chunks */
            if (dt != EM_F32) continue;
            check_case(dev, dt, 3, 48, 20, 16, pos4, 3);   /* pos 270 past Tk: all 16 */
            check_case(dev, dt, 1, 160, 9, 9, pos4, 2);
        }
    }
}

/* o from the op with EMBER_ATTENTION_DECODE_SPLIT = split ("" for the host's choice), computed
 * twice: the two must be bitwise equal (the op is deterministic). */
static em_tensor *decode_twice(const char *what, const em_tensor *q, const em_tensor *k,
                               const em_tensor *v, const em_tensor *pos, double scale,
                               const char *split)
{
    if (*split) setenv("EMBER_ATTENTION_DECODE_SPLIT", split, 1);
    em_tensor *a = em_attention_decode(q, k, v, pos, scale);
    em_tensor *b = em_attention_decode(q, k, v, pos, scale);
    unsetenv("EMBER_ATTENTION_DECODE_SPLIT");
    if (!a || !b) fprintf(stderr, "%s split '%s': %s\n", what, split, em_last_error());
    assert_non_null(a);
    assert_non_null(b);
    size_t bytes = (size_t)em_numel(a) * em_scalar_size(em_dtype(a));
    uint8_t *ha = malloc(bytes + 1), *hb = malloc(bytes + 1);
    assert_int_equal(em_to_host(a, ha, bytes), EM_OK);
    assert_int_equal(em_to_host(b, hb, bytes), EM_OK);
    if (memcmp(ha, hb, bytes)) fail_msg("%s split '%s': two runs differ", what, split);
    free(ha), free(hb);
    em_release(b);
    return a;
}

/* R rows of H heads attending through views k = cache[:, 0, :, :Tk], v = cache[:, 1, :, :Tk] of
 * a cache [R, 2, H, Tc, D]; checked with the host's split and with `split` forced. */
static void check_cache_case(em_device *dev, em_scalar dt, int R, int H, int D, int Tk,
                             const int64_t *pos, const char *split)
{
    int Tc = Tk + 5;
    size_t nq = (size_t)R * H * D, nh = (size_t)R * H * Tc * D;
    double *q = malloc(nq * 8), *cache = malloc(2 * nh * 8), *ref = malloc(nq * 8);
    double *k = malloc(nh * 8), *v = malloc(nh * 8);
    tu_fill(q, nq, -1, 1, 5u + (uint32_t)D);
    tu_fill(cache, 2 * nh, -1.5, 1.5, 17u + (uint32_t)Tk);
    em_tensor *tq = tu_tensor(dev, dt, EM_SHAPE(R, H, 1, D), q);
    em_tensor *tc = tu_tensor(dev, dt, EM_SHAPE(R, 2, H, Tc, D), cache);
    size_t per = (size_t)H * Tc * D; /* one row's keys (or values) */
    for (int r = 0; r < R; r++) {
        memcpy(k + r * per, cache + (2 * (size_t)r) * per, per * 8);
        memcpy(v + r * per, cache + (2 * (size_t)r + 1) * per, per * 8);
    }
    em_tensor *tp = em_from_host(dev, EM_I64, EM_SHAPE(R), pos);
    assert_non_null(tp);
    em_tensor *ks = em_select(tc, 1, 0), *vs = em_select(tc, 1, 1);
    em_tensor *kk = em_narrow(ks, 2, 0, Tk), *vv = em_narrow(vs, 2, 0, Tk);
    assert_non_null(kk);
    assert_non_null(vv);
    double scale = 1.0 / sqrt((double)D);
    reference(q, k, v, pos, R, H, Tk, D, Tc, scale, ref);
    char what[128];
    snprintf(what, sizeof what, "attention_decode %s R%d H%d D%d Tk%d", em_scalar_name(dt), R, H,
             D, Tk);
    const char *splits[2] = {"", split};
    for (int i = 0; i < 2; i++) {
        em_tensor *o = decode_twice(what, tq, kk, vv, tp, scale, splits[i]);
        tu_check(what, o, EM_SHAPE(R, H, 1, D), ref, tu_tol_on(dev, dt));
        em_release(o);
    }
    em_release(kk);
    em_release(vv);
    em_release(ks);
    em_release(vs);
    em_release(tq);
    em_release(tc);
    em_release(tp);
    free(q), free(cache), free(ref), free(k), free(v);
}

/* Every Tk and head size of the sweep with three sets of positions, in f32; the 16-bit types
 * and f64 on a subset; head sizes 1, 33 (no lines: scalar reads) and 256 (the largest). */
static void test_sweep(void **state)
{
    (void)state;
    static const int tks[] = {1, 7, 192, 1000, 2048}, ds[] = {16, 64, 80, 128};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (size_t t = 0; t < 5; t++)
            for (size_t d = 0; d < 4; d++) {
                int Tk = tks[t], D = ds[d];
                int64_t a[3] = {Tk - 1, -1, Tk / 2}, b[1] = {Tk + 3}, c[3] = {0, Tk / 3, Tk + 100};
                const char *split = Tk >= 2048 ? "64" : "7";
                check_cache_case(dev, EM_F32, 3, 2, D, Tk, a, split);
                check_cache_case(dev, EM_F32, 1, 3, D, Tk, b, split);
                check_cache_case(dev, EM_F32, 3, 1, D, Tk, c, "3");
                if (D == 16 || D == 128 || Tk == 1 || Tk == 2048) continue;
                for (size_t e = 1; e < sizeof tu_float_types / sizeof *tu_float_types; e++)
                    if (tu_has(dev, tu_float_types[e]))
                        check_cache_case(dev, tu_float_types[e], 3, 2, D, Tk, a, "5");
            }
        int64_t a[3] = {191, -1, 64};
        check_cache_case(dev, EM_F32, 3, 2, 1, 192, a, "4");
        check_cache_case(dev, EM_F32, 3, 2, 33, 192, a, "4");
        check_cache_case(dev, EM_F32, 3, 2, 256, 192, a, "4");
        if (tu_has(dev, EM_F16)) check_cache_case(dev, EM_F16, 3, 2, 33, 192, a, "4");
    }
}

/* The bytes of t (realized) into a malloc'd buffer; *bytes receives the size. */
static uint8_t *host_bytes(const em_tensor *t, size_t *bytes)
{
    *bytes = (size_t)em_numel(t) * em_scalar_size(em_dtype(t));
    uint8_t *h = malloc(*bytes + 1);
    assert_int_equal(em_to_host(t, h, *bytes), EM_OK);
    return h;
}

/* Fails the test, naming what and part, unless a and b hold the same bytes. */
static void expect_same(const char *what, const char *part, const em_tensor *a, const em_tensor *b)
{
    size_t na, nb;
    assert_non_null(a);
    assert_non_null(b);
    uint8_t *ha = host_bytes(a, &na), *hb = host_bytes(b, &nb);
    assert_int_equal(na, nb);
    bool same = !memcmp(ha, hb, na);
    free(ha), free(hb);
    if (!same) fail_msg("%s: %s differs", what, part);
}

/* A cache [R, 2, H, Tc, D] as the batched step holds it, attended through its first Tk positions;
 * each row's new key and value [R, 2, H, 1, D] appended at pos by em_attention_decode_append
 * (with counters) and by em_scatter_rows_ + em_attention_decode: the outputs and the whole caches
 * must be equal bitwise, the counters zero again, and a second append call (the cache now holds
 * the new entries) gives the same output. split: EMBER_ATTENTION_DECODE_SPLIT ("" the host's);
 * combine: EMBER_ATTENTION_DECODE_COMBINE ("" by capability). */
/* test_append_preload: the appending call finds its cache settled (a sync just before), so with
 * EMBER_ATTENTION_DECODE_PRELOAD=1 it loads its first keys and values before the wait */
static bool g_preload;

static void check_append_case(em_device *dev, em_scalar dt, int R, int H, int D, int Tk,
                              const int64_t *pos, const char *split, const char *combine)
{
    int Tc = Tk + 6;
    size_t nq = (size_t)R * H * D, nc = (size_t)R * 2 * H * Tc * D;
    double *q = malloc(nq * 8), *cache = malloc(nc * 8), *kv = malloc(2 * nq * 8);
    tu_fill(q, nq, -1, 1, 3u + (uint32_t)D);
    tu_fill(cache, nc, -1.5, 1.5, 7u + (uint32_t)Tk);
    tu_fill(kv, 2 * nq, -2, 2, 13u + (uint32_t)H);
    em_tensor *tq = tu_tensor(dev, dt, EM_SHAPE(R, H, 1, D), q);
    em_tensor *ca = tu_tensor(dev, dt, EM_SHAPE(R, 2, H, Tc, D), cache);
    em_tensor *cb = tu_tensor(dev, dt, EM_SHAPE(R, 2, H, Tc, D), cache);
    em_tensor *tkv = tu_tensor(dev, dt, EM_SHAPE(R, 2, H, 1, D), kv);
    em_tensor *tp = em_from_host(dev, EM_I64, EM_SHAPE(R), pos);
    em_tensor *cnt = em_zeros(dev, EM_I32, EM_SHAPE(R * H + 3));
    if (!cnt) fprintf(stderr, "zeros: %s\n", em_last_error());
    assert_non_null(tp);
    assert_non_null(cnt);
    em_tensor *kn = em_select(tkv, 1, 0), *vn = em_select(tkv, 1, 1);
    em_tensor *ka = em_narrow(em_select(ca, 1, 0), 2, 0, Tk),
              *va = em_narrow(em_select(ca, 1, 1), 2, 0, Tk);
    em_tensor *kb = em_narrow(em_select(cb, 1, 0), 2, 0, Tk),
              *vb = em_narrow(em_select(cb, 1, 1), 2, 0, Tk);
    assert_non_null(ka);
    assert_non_null(kb);
    double scale = 1.0 / sqrt((double)D);
    if (*split) setenv("EMBER_ATTENTION_DECODE_SPLIT", split, 1);
    if (*combine) setenv("EMBER_ATTENTION_DECODE_COMBINE", combine, 1);
    /* the reference: scatter, then attend */
    assert_int_equal(em_scatter_rows_(ka, 2, tp, kn), EM_OK);
    assert_int_equal(em_scatter_rows_(va, 2, tp, vn), EM_OK);
    em_tensor *oa = em_attention_decode(tq, ka, va, tp, scale);
    /* before each call, other partials in the workspace the pool will hand out again (the
     * reference's would hide a merge that ran before every split was in) */
    em_release(em_attention_decode(kn, ka, va, tp, scale));
    if (g_preload) {
        assert_int_equal(em_device_sync(dev), EM_OK);
        assert_true(em_buffer_settled(kb->st->buf) && em_buffer_settled(vb->st->buf));
    }
    em_tensor *ob = em_attention_decode_append(tq, kn, vn, kb, vb, tp, cnt, scale);
    em_release(em_attention_decode(vn, ka, va, tp, scale));
    em_tensor *ob2 = em_attention_decode_append(tq, kn, vn, kb, vb, tp, cnt, scale);
    unsetenv("EMBER_ATTENTION_DECODE_SPLIT");
    unsetenv("EMBER_ATTENTION_DECODE_COMBINE");
    if (!oa || !ob || !ob2) fprintf(stderr, "append: %s\n", em_last_error());
    char what[160];
    snprintf(what, sizeof what,
             "attention_decode_append %s on %s R%d H%d D%d Tk%d split '%s' combine '%s'",
             em_scalar_name(dt), em_device_name(dev), R, H, D, Tk, split, combine);
    expect_same(what, "the output", oa, ob);
    expect_same(what, "the second call's output", ob, ob2);
    expect_same(what, "the cache", ca, cb);
    size_t nb;
    uint32_t *hc = (uint32_t *)host_bytes(cnt, &nb);
    for (int i = 0; i < R * H + 3; i++)
        if (hc[i]) fail_msg("%s: counter %d is %u after the call", what, i, hc[i]);
    free(hc);
    em_release(oa), em_release(ob), em_release(ob2);
    em_release(ka), em_release(va), em_release(kb), em_release(vb), em_release(kn), em_release(vn);
    em_release(tq), em_release(ca), em_release(cb), em_release(tkv);
    em_release(tp), em_release(cnt);
    free(q), free(cache), free(kv);
}

/* The appending form on every device: positions inside, negative and past the attended keys
 * (but inside the cache: a write there would show), lines and scalar reads, one split and
 * several, merged as the device does by default and the other way too (a second launch on the
 * CPU, the last cube on PoCL and lavapipe). */
static void test_append(void **state)
{
    (void)state;
    static const int64_t a[3] = {100, -1, 191}, b[4] = {0, 194, 64, 31};
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        const char *other = tu_is_cpu(dev) ? "launch" : "last";
        em_scope_begin();
        check_append_case(dev, EM_F32, 3, 2, 64, 192, a, "", "");
        check_append_case(dev, EM_F32, 4, 1, 16, 9, b, "1", "");
        for (int c = 0; c < 2; c++) {
            check_append_case(dev, EM_F32, 3, 2, 64, 192, a, "7", c ? other : "");
            check_append_case(dev, EM_F32, 4, 3, 33, 192, b, "4", c ? other : "");
        }
        if (tu_has(dev, EM_F16)) check_append_case(dev, EM_F16, 3, 2, 64, 192, a, "5", "");
        em_scope_end(NULL, 0);
    }
}

/* The appending form loading its first keys and values before its dependency_wait() (PRE: where
 * the cache is settled; EMBER_ATTENTION_DECODE_PRELOAD=1 takes it on every target, where the
 * wait is nothing): the same results as scatter + attention, one split and several, lines and
 * scalar reads, a position past the attended keys. */
static void test_append_preload(void **state)
{
    (void)state;
    static const int64_t a[3] = {100, -1, 191}, b[4] = {0, 194, 64, 31};
    setenv("EMBER_ATTENTION_DECODE_PRELOAD", "1", 1);
    g_preload = true;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        check_append_case(dev, EM_F32, 3, 2, 64, 192, a, "", "");
        check_append_case(dev, EM_F32, 3, 2, 64, 192, a, "7", "");
        check_append_case(dev, EM_F32, 4, 3, 33, 192, b, "4", "");
        em_scope_end(NULL, 0);
    }
    g_preload = false;
    unsetenv("EMBER_ATTENTION_DECODE_PRELOAD");
}

static void test_errors(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    double z[64] = {0};
    int64_t p[2] = {0, 0};
    em_tensor *q = tu_tensor(dev, EM_F32, EM_SHAPE(2, 1, 1, 4), z);
    em_tensor *k = tu_tensor(dev, EM_F32, EM_SHAPE(2, 1, 8, 4), z);
    em_tensor *k3 = tu_tensor(dev, EM_F32, EM_SHAPE(2, 1, 8, 3), z);
    em_tensor *pos = em_from_host(dev, EM_I64, EM_SHAPE(2), p);
    em_tensor *pos32 = tu_tensor(dev, EM_I32, EM_SHAPE(2), z);
    tu_expect_error(em_attention_decode(q, k3, k, pos, 1.0), "attention_decode: q f32[2, 1, 1, 4], k f32[2, 1, 8, 3]");
    tu_expect_error(em_attention_decode(q, k, k, pos32, 1.0), "pos i64 [R]");
    tu_expect_error(em_attention_decode(k, k, k, pos, 1.0), "do not match");
    tu_expect_error(em_attention_decode(q, k, k, pos, NAN), "scale must be finite");
    em_clear_error();
    tu_expect_error(em_attention_decode(q, k, NULL, pos, 1.0), "NULL");
    /* the appending form: new keys shaped like q, counters for every (row, head), a cache it can
     * write in place (a contiguous last dim) */
    em_tensor *c1 = em_from_host(dev, EM_I64, EM_SHAPE(1), p);
    em_tensor *kt = em_transpose(k, 2, 3); /* [2, 1, 4, 8] with a strided last dim */
    em_tensor *q8 = tu_tensor(dev, EM_F32, EM_SHAPE(2, 1, 1, 8), z);
    tu_expect_error(em_attention_decode_append(q, k, q, k, k, pos, NULL, 1.0),
                    "attention_decode_append: k_new f32[2, 1, 8, 4] and v_new f32[2, 1, 1, 4] must");
    tu_expect_error(em_attention_decode_append(q, q, q, k, k, pos, c1, 1.0), "n >= R H = 2");
    tu_expect_error(em_attention_decode_append(q8, q8, q8, kt, kt, pos, NULL, 1.0),
                    "cannot be written in place");
    em_clear_error();
    tu_expect_error(em_attention_decode_append(q, NULL, q, k, k, pos, NULL, 1.0), "NULL");
    em_release(c1);
    em_release(kt);
    em_release(q8);
    em_release(q);
    em_release(k);
    em_release(k3);
    em_release(pos);
    em_release(pos32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_append),
        cmocka_unit_test(test_append_preload),
        cmocka_unit_test(test_errors),
    };
    const char *only = getenv("EMBER_TEST_FILTER"); /* one test by name (cmocka's pattern) */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
