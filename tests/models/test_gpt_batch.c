/* test_gpt_batch.c — batched decoding (src/models/gpt/batch.c): sequences of different lengths
 * that join and leave a slot batch at different steps, decoded one batched forward pass per step,
 * give exactly the tokens of em_gpt_generate run on each alone (greedy and seeded sampling), also
 * across the sliding window when a slot fills its context; a step's logits match a full forward
 * pass; misuse (bad slots, empty or full slots, duplicates, bad tokens) is an error, never an
 * abort, and the batch goes on working after it; the greedy entry points (argmax on the device)
 * pick exactly the host's argmax of the logits. On the CPU or $EMBER_TEST_DEVICE. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ember/gpt.h"

static em_device *dev;

static int setup(void **state)
{
    (void)state;
    const char *name = getenv("EMBER_TEST_DEVICE");
    dev = em_device_open(name && *name ? name : "cpu");
    if (!dev) fprintf(stderr, "[gpt_batch] cannot open %s: %s\n", name, em_last_error());
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    return 0;
}

enum { VOCAB = 61, CTX = 24 };

static em_gpt *tiny(void)
{
    em_gpt_config c = {.vocab_size = VOCAB,
                       .block_size = CTX,
                       .n_layer = 2,
                       .n_head = 2,
                       .n_embd = 32,
                       .dropout = 0.1, /* eval mode must switch it off */
                       .bias = true,
                       .tied = false}; /* its own head: greedy moves from token to token (a tied
                                        * one repeats the token just fed) */
    em_gpt *g = em_gpt_new(dev, EM_F32, &c, 11);
    assert_non_null(g);
    return g;
}

/* ---- the reference: em_gpt_generate alone ---------------------------------------------------- */

typedef struct collect {
    int64_t *out;
    int64_t n;
} collect;

static bool collect_tok(int64_t tok, void *user)
{
    collect *c = user;
    c->out[c->n++] = tok;
    return true;
}

/* ---- a small scheduler over the batch API, as a server runs it ------------------------------- */

enum { MAXTOK = 128 };

typedef struct seq {
    int64_t np;          /* prompt length */
    int64_t max_new;     /* tokens to make */
    int64_t join;        /* first step at which it may join */
    em_sample_config sc; /* sampling */
    int64_t hist[MAXTOK];
    int64_t n, made;
    int64_t slot; /* -1 while waiting or done */
    bool done;
    uint64_t rng;
    float logits[VOCAB];
    int64_t ref[MAXTOK]; /* em_gpt_generate's tokens */
    int64_t nref;
} seq;

static void run_batched(em_gpt *g, seq *s, int ns, int64_t slots)
{
    em_gpt_batch *b = em_gpt_batch_new(g, slots, 0);
    assert_non_null(b);
    assert_int_equal(em_gpt_batch_max_len(b), CTX);
    assert_int_equal(em_gpt_batch_slots(b), slots);
    bool *used = calloc((size_t)slots, sizeof *used);
    int64_t list_slot[16], list_tok[16];
    float *rows = malloc(sizeof(float) * VOCAB * 16);
    assert_non_null(used);
    assert_non_null(rows);
    int left = ns;
    for (int step = 0; left > 0 && step < 1000; step++) {
        /* Join: waiting sequences whose time has come take the lowest free slot. */
        for (int i = 0; i < ns; i++) {
            if (s[i].done || s[i].slot >= 0 || s[i].join > step) continue;
            int64_t free_slot = -1;
            for (int64_t k = 0; k < slots && free_slot < 0; k++)
                if (!used[k]) free_slot = k;
            if (free_slot < 0) break;
            used[free_slot] = true;
            s[i].slot = free_slot;
            s[i].rng = s[i].sc.seed;
            int64_t first = s[i].n > CTX ? s[i].n - CTX : 0;
            assert_int_equal(
                em_gpt_batch_prefill(b, free_slot, s[i].hist + first, s[i].n - first, s[i].logits),
                EM_OK);
        }
        /* Sample for every active sequence, then feed the new tokens in one pass. */
        int nl = 0;
        for (int i = 0; i < ns; i++) {
            seq *q = &s[i];
            if (q->slot < 0) continue;
            int64_t tok = em_sample_token(q->logits, VOCAB, q->hist, q->n, &q->sc, &q->rng);
            assert_true(tok >= 0);
            q->hist[q->n++] = tok;
            q->made++;
            if (q->made == q->max_new) { /* leaves the batch */
                em_gpt_batch_clear(b, q->slot);
                assert_int_equal(em_gpt_batch_len(b, q->slot), 0);
                used[q->slot] = false;
                q->slot = -1;
                q->done = true;
                left--;
                continue;
            }
            if (em_gpt_batch_len(b, q->slot) >= CTX) { /* full: rebuild from the last half */
                int64_t keep = CTX / 2;
                assert_int_equal(
                    em_gpt_batch_prefill(b, q->slot, q->hist + q->n - keep, keep, q->logits),
                    EM_OK);
                continue;
            }
            list_slot[nl] = q->slot;
            list_tok[nl] = tok;
            nl++;
        }
        if (nl == 0) continue;
        assert_int_equal(em_gpt_batch_step(b, list_slot, list_tok, nl, rows), EM_OK);
        for (int k = 0; k < nl; k++)
            for (int i = 0; i < ns; i++)
                if (s[i].slot == list_slot[k])
                    memcpy(s[i].logits, rows + (size_t)k * VOCAB, sizeof s[i].logits);
    }
    assert_int_equal(left, 0);
    free(used);
    free(rows);
    em_gpt_batch_free(b);
}

/* Prompts of lengths 1 to 30 (one longer than the context), joining at steps 0 to 9 into 3 slots
 * (so some wait for a slot to free), one running past the context (the window slides). */
static void check_against_generate(double temperature)
{
    em_gpt *g = tiny();
    static const int64_t lens[] = {1, 5, 9, 17, 30, 3};
    static const int64_t max_new[] = {6, 40, 3, 12, 8, 20};
    static const int64_t join[] = {0, 0, 2, 4, 7, 9};
    enum { NS = 6 };
    seq *s = calloc(NS, sizeof *s);
    assert_non_null(s);
    for (int i = 0; i < NS; i++) {
        s[i].np = lens[i];
        s[i].max_new = max_new[i];
        s[i].join = join[i];
        s[i].sc = (em_sample_config){temperature, temperature > 0 ? 20 : 0, 0.95, 1.0,
                                     1000 + (uint64_t)i};
        for (int64_t t = 0; t < lens[i]; t++) s[i].hist[t] = (i * 7 + t * 13 + 1) % VOCAB;
        s[i].n = lens[i];
        s[i].slot = -1;
        collect c = {s[i].ref, 0};
        int64_t made = 0;
        assert_int_equal(em_gpt_generate(g, s[i].hist, s[i].np, s[i].max_new, &s[i].sc, -1,
                                         collect_tok, &c, &made),
                         EM_OK);
        assert_int_equal(made, max_new[i]);
        s[i].nref = c.n;
    }
    run_batched(g, s, NS, 3);
    for (int i = 0; i < NS; i++) {
        assert_int_equal(s[i].made, s[i].nref);
        for (int64_t t = 0; t < s[i].nref; t++)
            if (s[i].hist[s[i].np + t] != s[i].ref[t])
                fail_msg("sequence %d token %lld: batched %lld, alone %lld (temperature %g)", i,
                         (long long)t, (long long)s[i].hist[s[i].np + t], (long long)s[i].ref[t],
                         temperature);
    }
    free(s);
    em_gpt_free(g);
}

static void test_greedy_matches_generate(void **state)
{
    (void)state;
    check_against_generate(0.0);
}

static void test_sampled_matches_generate(void **state)
{
    (void)state;
    check_against_generate(0.9);
}

/* A step's logits for each row equal a full forward pass over that row's whole sequence. */
static void test_step_logits_match_forward(void **state)
{
    (void)state;
    em_gpt *g = tiny();
    em_gpt_batch *b = em_gpt_batch_new(g, 4, 0);
    assert_non_null(b);
    int64_t a[8] = {3, 1, 4, 1, 5, 9, 2, 6}, c[3] = {27, 18, 28};
    assert_int_equal(em_gpt_batch_prefill(b, 0, a, 7, NULL), EM_OK);
    assert_int_equal(em_gpt_batch_prefill(b, 2, c, 2, NULL), EM_OK);
    int64_t slots[2] = {2, 0}, toks[2] = {c[2], a[7]};
    float got[2 * VOCAB], want[VOCAB];
    assert_int_equal(em_gpt_batch_step(b, slots, toks, 2, got), EM_OK);
    assert_int_equal(em_gpt_batch_len(b, 0), 8);
    assert_int_equal(em_gpt_batch_len(b, 2), 3);
    assert_int_equal(em_gpt_batch_len(b, 1), 0);
    const int64_t *seqs[2] = {c, a};
    int64_t lens[2] = {3, 8};
    em_module_train(em_gpt_module(g), false);
    em_no_grad_begin();
    for (int r = 0; r < 2; r++) {
        em_scope_begin();
        em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(1, lens[r]), seqs[r]);
        em_tensor *out = em_gpt_forward(g, x, NULL);
        assert_non_null(out);
        em_tensor *last = em_select(em_select(out, 0, 0), 0, lens[r] - 1);
        assert_int_equal(em_to_host(last, want, sizeof want), EM_OK);
        double worst = 0;
        for (int v = 0; v < VOCAB; v++) {
            double d = fabs((double)got[r * VOCAB + v] - want[v]);
            if (d > worst) worst = d;
        }
        if (worst > 1e-4) fail_msg("row %d: logits differ by %g", r, worst);
        em_scope_end(NULL, 0);
    }
    em_no_grad_end();
    em_gpt_batch_free(b);
    em_gpt_free(g);
}

/* ---- device-side greedy ----------------------------------------------------------------------- */

/* The first largest of x[0, n): what em_sample_token picks at temperature 0. */
static int64_t host_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The last position's logits of a full forward pass over ids[0, n). */
static void forward_last(em_gpt *g, const int64_t *ids, int64_t n, float *out)
{
    em_module_train(em_gpt_module(g), false);
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(1, n), ids);
    em_tensor *logits = em_gpt_forward(g, x, NULL);
    assert_non_null(logits);
    assert_int_equal(em_to_host(em_select(em_select(logits, 0, 0), 0, n - 1), out,
                                VOCAB * sizeof *out),
                     EM_OK);
    em_scope_end(NULL, 0);
    em_no_grad_end();
}

/* Two batches fed alike, one through the logits (host argmax), one through the greedy entry
 * points (argmax on the device), give the same tokens at every prefill and step: one slot alone
 * (the one-row pass), rows listed out of order at different positions (masked), rows in
 * lockstep (one shared position), and a gap of unlisted rows. The logits path also matches a
 * full forward pass over each sequence. */
static void test_device_greedy_matches_host(void **state)
{
    (void)state;
    em_gpt *g = tiny();
    em_gpt_batch *bl = em_gpt_batch_new(g, 4, 0), *bg = em_gpt_batch_new(g, 4, 0);
    assert_non_null(bl);
    assert_non_null(bg);
    int64_t hist[4][CTX], len[4] = {5, 3, 0, 5};
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < CTX; t++) hist[r][t] = (r * 17 + t * 5 + 2) % VOCAB;
    float lg[4 * VOCAB], want[VOCAB];
    for (int r = 0; r < 4; r++) {
        if (!len[r]) continue;
        int64_t next = -1;
        assert_int_equal(em_gpt_batch_prefill(bl, r, hist[r], len[r], lg), EM_OK);
        assert_int_equal(em_gpt_batch_prefill_greedy(bg, r, hist[r], len[r], &next), EM_OK);
        assert_int_equal(next, host_argmax(lg, VOCAB));
        assert_int_equal(em_gpt_batch_len(bg, r), len[r]);
        hist[r][len[r]] = next; /* the token the next step feeds */
    }
    /* the slot lists of the steps, -1 ending each */
    static const int64_t lists[][5] = {{0, -1}, {3, 1, -1}, {0, 3, -1}, {1, 0, 3, -1}, {0, -1},
                                       {3, -1}, {0, 1, -1}, {1, -1}};
    for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++) {
        int64_t slots[4], toks[4], next[4];
        int n = 0;
        for (; lists[k][n] >= 0; n++) {
            slots[n] = lists[k][n];
            toks[n] = hist[slots[n]][len[slots[n]]];
        }
        assert_int_equal(em_gpt_batch_step(bl, slots, toks, n, lg), EM_OK);
        assert_int_equal(em_gpt_batch_step_greedy(bg, slots, toks, n, next), EM_OK);
        for (int i = 0; i < n; i++) {
            int64_t r = slots[i];
            len[r]++;
            assert_int_equal(em_gpt_batch_len(bg, r), len[r]);
            forward_last(g, hist[r], len[r], want);
            for (int v = 0; v < VOCAB; v++)
                if (fabs((double)lg[i * VOCAB + v] - want[v]) > 1e-4)
                    fail_msg("step %zu, slot %lld: logit %d is %g, a full pass gives %g", k,
                             (long long)r, v, lg[i * VOCAB + v], want[v]);
            if (next[i] != host_argmax(lg + i * VOCAB, VOCAB))
                fail_msg("step %zu, slot %lld: device greedy %lld, host %lld", k, (long long)r,
                         (long long)next[i], (long long)host_argmax(lg + i * VOCAB, VOCAB));
            hist[r][len[r]] = next[i];
        }
    }
    /* next may be the tokens array itself */
    int64_t one[1] = {0}, tok[1] = {hist[0][len[0]]};
    assert_int_equal(em_gpt_batch_step_greedy(bg, one, tok, 1, tok), EM_OK);
    assert_true(tok[0] >= 0 && tok[0] < VOCAB);
    /* misuse */
    assert_int_equal(em_gpt_batch_step_greedy(bg, one, tok, 1, NULL), EM_ERR_INVALID);
    assert_int_equal(em_gpt_batch_prefill_greedy(bg, 0, hist[0], 2, NULL), EM_ERR_INVALID);
    int64_t two[2] = {1, 1}, t2[2] = {0, 0}, n2[2];
    assert_int_equal(em_gpt_batch_step_greedy(bg, two, t2, 2, n2), EM_ERR_INVALID);
    em_gpt_batch_free(bl);
    em_gpt_batch_free(bg);
    em_gpt_free(g);
}

static void expect_error(em_status st, const char *what)
{
    assert_int_equal(st, EM_ERR_INVALID);
    if (!strstr(em_last_error(), what))
        fail_msg("error '%s' does not mention '%s'", em_last_error(), what);
}

static void test_misuse(void **state)
{
    (void)state;
    em_gpt *g = tiny();
    assert_null(em_gpt_batch_new(NULL, 2, 0));
    assert_null(em_gpt_batch_new(g, 0, 0));
    em_gpt_batch *b = em_gpt_batch_new(g, 2, 8);
    assert_non_null(b);
    assert_int_equal(em_gpt_batch_max_len(b), 8);
    int64_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, bad[2] = {1, VOCAB};
    float lg[2 * VOCAB];
    expect_error(em_gpt_batch_prefill(b, 2, ids, 3, lg), "slot 2");
    expect_error(em_gpt_batch_prefill(b, -1, ids, 3, lg), "slot -1");
    expect_error(em_gpt_batch_prefill(b, 0, ids, 9, lg), "9 tokens");
    expect_error(em_gpt_batch_prefill(b, 0, ids, 0, lg), "0 tokens");
    expect_error(em_gpt_batch_prefill(b, 0, bad, 2, lg), "vocabulary");
    expect_error(em_gpt_batch_prefill(b, 0, NULL, 2, lg), "NULL");
    int64_t s0[2] = {0, 0}, t0[2] = {1, 2};
    expect_error(em_gpt_batch_step(b, s0, t0, 1, lg), "holds 0 of 8"); /* empty slot */
    assert_int_equal(em_gpt_batch_prefill(b, 0, ids, 8, lg), EM_OK);
    expect_error(em_gpt_batch_step(b, s0, t0, 1, lg), "holds 8 of 8"); /* full slot */
    assert_int_equal(em_gpt_batch_prefill(b, 0, ids, 3, lg), EM_OK);
    expect_error(em_gpt_batch_step(b, s0, t0, 2, lg), "twice");
    int64_t s5[1] = {5};
    expect_error(em_gpt_batch_step(b, s5, t0, 1, lg), "slot 5");
    int64_t tb[1] = {-3};
    expect_error(em_gpt_batch_step(b, s0, tb, 1, lg), "vocabulary");
    assert_int_equal(em_gpt_batch_step(b, s0, t0, 0, lg), EM_OK); /* nothing to do */
    /* Still usable after the errors. */
    assert_int_equal(em_gpt_batch_len(b, 0), 3);
    assert_int_equal(em_gpt_batch_step(b, s0, t0, 1, lg), EM_OK);
    assert_int_equal(em_gpt_batch_len(b, 0), 4);
    assert_int_equal(em_gpt_batch_len(b, 7), 0);
    em_gpt_batch_clear(b, 9); /* ignored */
    em_gpt_batch_free(b);
    em_gpt_batch_free(NULL);
    em_gpt_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_generate),
        cmocka_unit_test(test_sampled_matches_generate),
        cmocka_unit_test(test_step_logits_match_forward),
        cmocka_unit_test(test_device_greedy_matches_host),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests_name("gpt_batch", tests, setup, teardown);
}
