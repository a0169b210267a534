/* test_train.c — BPE training and the character tokenizer. Training is checked merge for merge
 * against a naive trainer written here (recounting every pair at every step) on a corpus whose
 * pre-tokens are easy to split by hand; trained and character tokenizers round-trip text, save
 * and load, and report characters outside their alphabet clearly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "data_util.h"

/* A naive reference: words split on single spaces (" word" after the first, as GPT-2's
 * pre-tokenizer splits lowercase words), merges by recounting everything. Returns the number of
 * tokens; tok_bytes[i] / tok_len[i] describe them. */
#define MAXTOK 600
static uint8_t tok_bytes[MAXTOK][64];
static size_t tok_len[MAXTOK];

static size_t naive_train(const char *text, size_t vocab)
{
    enum { MAXW = 4000, MAXL = 40 };
    static uint32_t sym[MAXW][MAXL];
    static size_t nsym[MAXW];
    size_t nw = 0;
    for (int b = 0; b < 256; b++) {
        tok_bytes[b][0] = (uint8_t)b;
        tok_len[b] = 1;
    }
    size_t ntok = 256;
    for (const char *p = text; *p;) {
        const char *q = p + 1;
        while (*q && *q != ' ') q++;
        nsym[nw] = 0;
        for (const char *c = p; c < q; c++) sym[nw][nsym[nw]++] = (uint8_t)*c;
        nw++;
        p = q;
    }
    static int64_t count[MAXTOK][MAXTOK];
    while (ntok < vocab) {
        memset(count, 0, sizeof count);
        for (size_t w = 0; w < nw; w++)
            for (size_t i = 0; i + 1 < nsym[w]; i++) count[sym[w][i]][sym[w][i + 1]]++;
        int64_t best = 0;
        uint32_t ba = 0, bb = 0;
        for (uint32_t a = 0; a < ntok; a++)
            for (uint32_t b = 0; b < ntok; b++)
                if (count[a][b] > best) {
                    best = count[a][b];
                    ba = a;
                    bb = b;
                }
        if (best == 0) break;
        uint8_t cat[64];
        memcpy(cat, tok_bytes[ba], tok_len[ba]);
        memcpy(cat + tok_len[ba], tok_bytes[bb], tok_len[bb]);
        size_t cl = tok_len[ba] + tok_len[bb];
        uint32_t x = (uint32_t)ntok;
        for (uint32_t i = 0; i < ntok; i++)
            if (tok_len[i] == cl && memcmp(tok_bytes[i], cat, cl) == 0) x = i;
        if (x == ntok) {
            memcpy(tok_bytes[ntok], cat, cl);
            tok_len[ntok++] = cl;
        }
        for (size_t w = 0; w < nw; w++) {
            size_t o = 0;
            for (size_t i = 0; i < nsym[w]; i++) {
                if (i + 1 < nsym[w] && sym[w][i] == ba && sym[w][i + 1] == bb) {
                    sym[w][o++] = x;
                    i++;
                } else {
                    sym[w][o++] = sym[w][i];
                }
            }
            nsym[w] = o;
        }
    }
    return ntok;
}

static char *random_words(size_t nwords, uint64_t seed)
{
    static const char *syll[] = {"lo", "w",  "er",  "new", "est", "wid", "a",  "aa",
                                 "ab", "ba", "the", "th",  "e",   "n",   "nn", "o"};
    char *s = malloc(nwords * 20 + 1);
    size_t n = 0;
    for (size_t i = 0; i < nwords; i++) {
        if (i) s[n++] = ' ';
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = 1 + (int)((seed >> 40) % 4);
        for (int j = 0; j < k; j++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            /* a skewed choice, so counts differ and ties are rarer */
            size_t idx = (size_t)((seed >> 33) % 16);
            idx = idx * idx / 16;
            const char *sy = syll[idx];
            memcpy(s + n, sy, strlen(sy));
            n += strlen(sy);
        }
    }
    s[n] = 0;
    return s;
}

static void test_train_matches_naive(void **state)
{
    (void)state;
    char *text = random_words(3000, 42);
    size_t want = naive_train(text, 450);
    em_bpe_train_opts o = {.vocab_size = 451};
    const char *specials[] = {"<|endoftext|>"};
    o.specials = specials;
    o.nspecials = 1;
    em_tokenizer *t = em_bpe_train(text, strlen(text), &o);
    assert_non_null(t);
    assert_int_equal(em_tok_vocab_size(t), want + 1);
    assert_int_equal(em_tok_eot(t), (int64_t)want);
    for (uint32_t id = 256; id < want; id++) {
        size_t n;
        const uint8_t *b = em_tok_token_bytes(t, id, &n);
        assert_non_null(b);
        if (n != tok_len[id] || memcmp(b, tok_bytes[id], n) != 0) {
            fprintf(stderr, "token %u: ember '%.*s', naive '%.*s'\n", id, (int)n, (const char *)b,
                    (int)tok_len[id], (const char *)tok_bytes[id]);
            fail();
        }
    }
    /* encode/decode round trip, and fewer tokens than bytes */
    em_tokens tk = {0};
    assert_int_equal(em_tok_encode(t, text, strlen(text), true, &tk), EM_OK);
    assert_true(tk.len < strlen(text) / 2);
    char *back;
    assert_int_equal(em_tok_decode(t, tk.ids, tk.len, &back, NULL), EM_OK);
    assert_string_equal(back, text);
    free(back);
    /* save and load */
    char dir[512], path[1024];
    scratch_dir("train", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/bpe.json", dir);
    assert_int_equal(em_tok_save(t, path), EM_OK);
    em_tokenizer *t2 = em_tok_load(path);
    assert_non_null(t2);
    em_tokens tk2 = {0};
    assert_int_equal(em_tok_encode(t2, text, strlen(text), true, &tk2), EM_OK);
    assert_int_equal(tk.len, tk2.len);
    assert_memory_equal(tk.ids, tk2.ids, tk.len * sizeof *tk.ids);
    assert_int_equal(em_tok_eot(t2), em_tok_eot(t));
    em_tokens_free(&tk);
    em_tokens_free(&tk2);
    em_tok_free(t);
    em_tok_free(t2);
    free(text);
    remove_dir(dir);
    /* misuse */
    o.vocab_size = 100;
    assert_null(em_bpe_train("abc", 3, &o));
    assert_non_null(strstr(em_last_error(), "below 256"));
}

static void test_train_any_bytes(void **state)
{
    (void)state;
    /* invalid UTF-8, Unicode and whitespace runs train and round-trip too */
    const char text[] =
        "caf\xc3\xa9 caf\xc3\xa9 \xff\xfe\xff\xfe \xe6\x97\xa5\xe6\x9c\xac \xe6\x97\xa5\xe6\x9c\xac"
        "    \n\n\n  caf\xc3\xa9\xff";
    em_bpe_train_opts o = {.vocab_size = 300};
    em_tokenizer *t = em_bpe_train(text, sizeof text - 1, &o);
    assert_non_null(t);
    assert_true(em_tok_vocab_size(t) > 256);
    em_tokens tk = {0};
    assert_int_equal(em_tok_encode(t, text, sizeof text - 1, false, &tk), EM_OK);
    char *back;
    size_t n;
    assert_int_equal(em_tok_decode(t, tk.ids, tk.len, &back, &n), EM_OK);
    assert_int_equal(n, sizeof text - 1);
    assert_memory_equal(back, text, n);
    free(back);
    em_tokens_free(&tk);
    em_tok_free(t);
}

static void test_char_tokenizer(void **state)
{
    (void)state;
    const char *text = "hello, wörld! 日本 😀\n";
    const char *specials[] = {"<|endoftext|>"};
    em_tokenizer *t = em_tok_char_from_text(text, strlen(text), specials, 1);
    assert_non_null(t);
    assert_int_equal(em_tok_kind_of(t), EM_TOK_CHAR);
    /* distinct characters: \n space ! , d e h l o r w ö 日 本 😀 = 15, then the special */
    assert_int_equal(em_tok_vocab_size(t), 16);
    assert_int_equal(em_tok_eot(t), 15);
    em_tokens tk = {0};
    const char *msg = "hello<|endoftext|>日本";
    assert_int_equal(em_tok_encode(t, msg, strlen(msg), true, &tk), EM_OK);
    assert_int_equal(tk.len, 8);
    assert_int_equal(tk.ids[0], 6); /* sorted code points: \n(0) ' '(1) !(2) ,(3) d e h(6)... */
    assert_int_equal(tk.ids[5], 15);
    char *back;
    assert_int_equal(em_tok_decode(t, tk.ids, tk.len, &back, NULL), EM_OK);
    assert_string_equal(back, msg);
    free(back);
    em_tokens_free(&tk);
    /* outside the alphabet, or invalid UTF-8: errors that say where */
    assert_int_equal(em_tok_encode(t, "hex", 3, false, &tk), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "U+0078"));
    assert_int_equal(em_tok_encode(t, "h\xff", 2, false, &tk), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "byte 1"));
    assert_null(em_tok_char_from_text("a\xc3", 2, NULL, 0));
    em_tokens_free(&tk);
    /* save and load */
    char dir[512], path[1024];
    scratch_dir("char", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/char.json", dir);
    assert_int_equal(em_tok_save(t, path), EM_OK);
    em_tokenizer *t2 = em_tok_load(path);
    assert_non_null(t2);
    assert_int_equal(em_tok_vocab_size(t2), 16);
    assert_int_equal(em_tok_encode(t2, msg, strlen(msg), true, &tk), EM_OK);
    assert_int_equal(tk.ids[5], 15);
    em_tokens_free(&tk);
    em_tok_free(t2);
    em_tok_free(t);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_matches_naive),
        cmocka_unit_test(test_train_any_bytes),
        cmocka_unit_test(test_char_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
