/* test_bpe.c — GPT-2 byte-level BPE: token-for-token equality with the npm packages gpt-3-encoder
 * and js-tiktoken (run through node on the same text), special tokens, decode(encode(x)) == x for
 * random byte strings (invalid UTF-8 included), the streaming decoder, tiktoken rank files,
 * chunked encoding, and clear errors for missing or corrupt files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "data_util.h"

/* Unicode scripts, emoji and ZWJ sequences, whitespace runs (JavaScript's \s: NBSP, ideographic
 * space, BOM; not NEL), CRLF, contractions, digits and code. */
static const char VARIED[] =
    "Hello, world! It's a test: don't, can't, won't, I'm, you're, we've, they'll, she'd. IT'S "
    "LOUD.\r\n"
    "Numbers: 0 7 42 1234567890 3.14159 1,000,000 -17 +3e10 0x1F 2024-05-20 ①②③ ² ¾ Ⅻ ١٢٣ ๓๔\r\n"
    "    Indented line\twith\ttabs   and  double  spaces   \n\n\n   \n"
    "Ελληνικά κείμενα, русский текст, עברית, العربية, हिन्दी भाषा, ภาษาไทย, 日本語のテキスト, "
    "中文文本, 한국어 텍스트, Tiếng Việt, ქართული, Ṁüłţïƀÿţę ŝţřïñĝ.\n"
    "Emoji: 😀 😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 ❤️ 🧑🏿‍💻 e\xcc\x81 "
    "n\xcc\x83 "
    "\xe2\x80\x8b zero-width.\n"
    "Before a letter: x \xef\xbb\xbfy x \xc2\x85y x \xc2\xa0y x \xe3\x80\x80y x \xe2\x80\x8by x "
    "\xe1\x9a\x80y\n"
    "Spaces:\xc2\xa0nbsp\xe3\x80\x80ideographic\xef\xbb\xbf bom "
    "\xc2\x85nel\xe2\x80\xa8ls\xe2\x80\xa9ps\n"
    "int main(void) { for (int i = 0; i < 10; i++) printf(\"%d\\n\", i * 2); return 0; }\n"
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n"
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html> ~!@#$%^&*()_+-=[]{}|;:,.<>/?\n"
    "url: https://example.com/path?q=1&r=two#frag email: someone@example.org\n"
    "Supercalifragilisticexpialidocious"
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "bcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbc"
    "xyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzyxyzzy end\n"
    "----------------------------------------------------------------================\n"
    "Trailing whitespace at the very end   \t ";

static em_tokenizer *gpt2_or_skip(void)
{
    em_tokenizer *t = em_tok_gpt2(NULL);
    if (!t) {
        /* missing files skip the test; files that are there but do not load fail it */
        fprintf(stderr, "%s: %s\n", em_last_status() == EM_ERR_NOT_FOUND ? "SKIP" : "ERROR",
                em_last_error());
        assert_int_equal(em_last_status(), EM_ERR_NOT_FOUND);
    }
    return t;
}

/* Encodes text with ember and with both npm packages; the three must agree token for token. */
static void check_against_node(em_tokenizer *t, const char *text, size_t len)
{
    char dir[512], path[1200], cmd[4096];
    scratch_dir("bpe-node", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/text.txt", dir);
    assert_int_equal(write_file(path, text, len), 0);
    snprintf(cmd, sizeof cmd, "node '%s/tests/data/gpt2_ref.js' '%s' '%s' encode", EMBER_SOURCE_DIR,
             NPM_MODULES, path);
    int st;
    char *out = run_capture(cmd, &st);
    assert_non_null(out);
    assert_int_equal(st, 0);
    em_tokens mine = {0};
    assert_int_equal(em_tok_encode(t, text, len, false, &mine), EM_OK);
    size_t cap = mine.len + 4096;
    uint32_t *ref = malloc(cap * sizeof *ref);
    const char *p = out;
    const char *names[2] = {"gpt-3-encoder", "js-tiktoken"};
    for (int k = 0; k < 2; k++) {
        size_t n = parse_ids(&p, ref, cap);
        size_t common = n < mine.len ? n : mine.len;
        for (size_t i = 0; i < common; i++)
            if (ref[i] != mine.ids[i]) {
                fprintf(stderr, "%s: token %zu differs: ember %u, reference %u\n", names[k], i,
                        mine.ids[i], ref[i]);
                fail();
            }
        if (n != mine.len) fprintf(stderr, "%s: %zu tokens, ember %zu\n", names[k], n, mine.len);
        assert_int_equal(n, mine.len);
    }
    free(ref);
    free(out);
    em_tokens_free(&mine);
    remove_dir(dir);
}

static void test_matches_npm_packages(void **state)
{
    (void)state;
    if (!have_node_refs()) skip();
    em_tokenizer *t = gpt2_or_skip();
    if (!t) skip();
    check_against_node(t, VARIED, sizeof VARIED - 1);
    /* the text of the default corpus, when it is there */
    FILE *f = popen("bible 'Genesis 1:1-50:26' 2>/dev/null | head -c 40000", "r");
    size_t n = 0;
    char *bible = f ? read_all(f, &n) : NULL;
    if (f) pclose(f);
    if (bible && n > 1000)
        check_against_node(t, bible, n);
    else
        fprintf(stderr, "note: bible-kjv is not installed; compared on the varied text only\n");
    free(bible);
    em_tok_free(t);
}

static void test_special_tokens(void **state)
{
    (void)state;
    em_tokenizer *t = gpt2_or_skip();
    if (!t) skip();
    assert_int_equal(em_tok_vocab_size(t), 50257);
    assert_int_equal(em_tok_eot(t), 50256);
    const char *text = "Hi<|endoftext|> there <|endoftext|><|endoftext|>x<|endoftext";
    em_tokens with = {0}, without = {0};
    assert_int_equal(em_tok_encode(t, text, strlen(text), true, &with), EM_OK);
    assert_int_equal(em_tok_encode(t, text, strlen(text), false, &without), EM_OK);
    size_t eots = 0;
    for (size_t i = 0; i < with.len; i++) eots += with.ids[i] == 50256;
    assert_int_equal(eots, 3);
    for (size_t i = 0; i < without.len; i++) assert_true(without.ids[i] != 50256);
    if (have_node_refs()) {
        char dir[512], path[1200], cmd[4096];
        scratch_dir("bpe-special", dir, sizeof dir);
        snprintf(path, sizeof path, "%s/t.txt", dir);
        assert_int_equal(write_file(path, text, strlen(text)), 0);
        snprintf(cmd, sizeof cmd, "node '%s/tests/data/gpt2_ref.js' '%s' '%s' special",
                 EMBER_SOURCE_DIR, NPM_MODULES, path);
        char *out = run_capture(cmd, NULL);
        assert_non_null(out);
        uint32_t ref[256];
        const char *p = out;
        size_t n = parse_ids(&p, ref, 256);
        assert_int_equal(n, with.len);
        assert_memory_equal(ref, with.ids, n * sizeof *ref);
        free(out);
        remove_dir(dir);
    }
    /* chat-template tokens */
    assert_int_equal(em_tok_add_special(t, "<|im_start|>", -1), 50257);
    assert_int_equal(em_tok_add_special(t, "<|im_end|>", -1), 50258);
    assert_int_equal(em_tok_add_special(t, "<|im_end|>", -1), -1); /* twice */
    assert_int_equal(em_tok_add_chat_specials(t), EM_OK); /* already there: nothing changes */
    assert_int_equal(em_tok_vocab_size(t), 50259);
    assert_int_equal(em_tok_add_special(t, "<|x|>", 100), -1); /* id taken */
    assert_non_null(strstr(em_last_error(), "taken"));
    const char *chat = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n";
    em_tokens c = {0};
    assert_int_equal(em_tok_encode(t, chat, strlen(chat), true, &c), EM_OK);
    assert_int_equal(c.ids[0], 50257);
    char *back;
    size_t blen;
    assert_int_equal(em_tok_decode(t, c.ids, c.len, &back, &blen), EM_OK);
    assert_string_equal(back, chat);
    free(back);
    em_tokens_free(&c);
    em_tokens_free(&with);
    em_tokens_free(&without);
    em_tok_free(t);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_roundtrip_random_bytes(void **state)
{
    (void)state;
    em_tokenizer *t = gpt2_or_skip();
    if (!t) skip();
    static const char *pieces[] = {
        "a", " ",  "\n",       "\r\n",          "'s", "é", "日", "😀", "\xe2\x80\x8d",
        "1", "\t", "\xc2\xa0", "<|endoftext|>", "'"};
    uint64_t seed = 12345;
    char buf[1200];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0, want = rng_next(&seed) % 400;
        while (n < want) {
            uint64_t r = rng_next(&seed);
            if (r % 3 == 0) { /* a random byte: lone continuations, bad leads, truncations */
                buf[n++] = (char)(r >> 8);
            } else {
                const char *p = pieces[(r >> 8) % (sizeof pieces / sizeof *pieces)];
                size_t k = strlen(p);
                if (r % 7 == 1 && k > 1) k--; /* truncate a multi-byte character */
                memcpy(buf + n, p, k);
                n += k;
            }
        }
        em_tokens tk = {0};
        bool special = iter % 2;
        assert_int_equal(em_tok_encode(t, buf, n, special, &tk), EM_OK);
        char *back;
        size_t blen;
        assert_int_equal(em_tok_decode(t, tk.ids, tk.len, &back, &blen), EM_OK);
        assert_int_equal(blen, n);
        assert_memory_equal(back, buf, n);
        free(back);
        em_tokens_free(&tk);
    }
    /* a long piece (heap merge path) and a huge single "word" */
    size_t big = 200000;
    char *w = malloc(big);
    for (size_t i = 0; i < big; i++) w[i] = "abcab"[i % 5];
    em_tokens tk = {0};
    assert_int_equal(em_tok_encode(t, w, big, false, &tk), EM_OK);
    char *back;
    size_t blen;
    assert_int_equal(em_tok_decode(t, tk.ids, tk.len, &back, &blen), EM_OK);
    assert_int_equal(blen, big);
    assert_memory_equal(back, w, big);
    assert_true(tk.len < big / 2);
    free(back);
    free(w);
    em_tokens_free(&tk);
    em_tok_free(t);
}

/* An independent UTF-8 check (well-formed sequences only; no overlongs or surrogates). */
static int valid_utf8(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], k = c < 0x80                ? 1
                               : c >= 0xc2 && c < 0xe0 ? 2
                               : c >= 0xe0 && c < 0xf0 ? 3
                               : c >= 0xf0 && c < 0xf5 ? 4
                                                       : 0;
        if (!k || i + k > n) return 0;
        for (unsigned j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0) ||
            (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90))
            return 0;
        i += k;
    }
    return 1;
}

static void test_stream_decoder(void **state)
{
    (void)state;
    em_tokenizer *t = gpt2_or_skip();
    if (!t) skip();
    em_tokens tk = {0};
    assert_int_equal(em_tok_encode(t, VARIED, sizeof VARIED - 1, false, &tk), EM_OK);
    em_tok_stream s;
    em_tok_stream_init(&s, t);
    char *all = malloc(sizeof VARIED + 64);
    size_t n = 0;
    int split_tokens = 0;
    for (size_t i = 0; i < tk.len; i++) {
        char out[3 * 256 + 32]; /* GPT-2's longest token is 128 bytes */
        long w = em_tok_stream_feed(&s, tk.ids[i], out, sizeof out);
        assert_true(w >= 0);
        assert_true(valid_utf8(out, (size_t)w));
        size_t tl;
        em_tok_token_bytes(t, tk.ids[i], &tl);
        split_tokens += (size_t)w != tl;
        memcpy(all + n, out, (size_t)w);
        n += (size_t)w;
    }
    assert_true(split_tokens > 0); /* the emoji really were split across tokens */
    char out[64];
    assert_int_equal(em_tok_stream_finish(&s, out, sizeof out), 0);
    assert_int_equal(n, sizeof VARIED - 1);
    assert_memory_equal(all, VARIED, n);
    free(all);
    /* invalid bytes come out as U+FFFD; an unfinished character is held back, then replaced */
    em_tok_stream_init(&s, t);
    em_tokens bad = {0};
    assert_int_equal(em_tok_encode(t,
                                   "a\xff"
                                   "b\xe6\x97",
                                   5, false, &bad),
                     EM_OK);
    char acc[64];
    size_t an = 0;
    for (size_t i = 0; i < bad.len; i++)
        an += (size_t)em_tok_stream_feed(&s, bad.ids[i], acc + an, sizeof acc - an);
    assert_int_equal(an, 5); /* "a", U+FFFD, "b"; the two bytes of 日 are held */
    an += (size_t)em_tok_stream_finish(&s, acc + an, sizeof acc - an);
    assert_memory_equal(acc,
                        "a\xef\xbf\xbd"
                        "b\xef\xbf\xbd",
                        an);
    assert_int_equal(em_tok_stream_feed(&s, 999999, acc, sizeof acc), -1);
    em_tokens_free(&bad);
    em_tokens_free(&tk);
    em_tok_free(t);
}

static void test_tiktoken_file_and_chunks(void **state)
{
    (void)state;
    em_tokenizer *t = gpt2_or_skip();
    if (!t) skip();
    char dir[512], path[1200];
    scratch_dir("bpe-tiktoken", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/gpt2.tiktoken", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (uint32_t id = 0; id < 50256; id++) {
        size_t n;
        const uint8_t *b = em_tok_token_bytes(t, id, &n);
        assert_non_null(b);
        for (size_t i = 0; i < n; i += 3) {
            uint32_t v =
                (uint32_t)b[i] << 16 | (i + 1 < n ? b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
            fprintf(f, "%c%c%c%c", B64[v >> 18], B64[(v >> 12) & 63],
                    i + 1 < n ? B64[(v >> 6) & 63] : '=', i + 2 < n ? B64[v & 63] : '=');
        }
        fprintf(f, " %u\n", id);
    }
    fclose(f);
    em_tokenizer *tt = em_tok_load(path);
    assert_non_null(tt);
    assert_int_equal(em_tok_add_special(tt, "<|endoftext|>", 50256), 50256);
    em_tokens a = {0}, b = {0}, c = {0};
    assert_int_equal(em_tok_encode(t, VARIED, sizeof VARIED - 1, true, &a), EM_OK);
    assert_int_equal(em_tok_encode(tt, VARIED, sizeof VARIED - 1, true, &b), EM_OK);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.ids, b.ids, a.len * sizeof *a.ids);
    /* saved in ember's format and loaded back */
    snprintf(path, sizeof path, "%s/gpt2.json", dir);
    assert_int_equal(em_tok_save(tt, path), EM_OK);
    em_tokenizer *tj = em_tok_load(path);
    assert_non_null(tj);
    assert_int_equal(em_tok_encode(tj, VARIED, sizeof VARIED - 1, true, &c), EM_OK);
    assert_int_equal(c.len, a.len);
    assert_memory_equal(a.ids, c.ids, a.len * sizeof *a.ids);
    /* encoding in chunks cut with em_tok_safe_cut gives the same ids */
    em_tokens d = {0};
    size_t pos = 0, len = sizeof VARIED - 1;
    int cuts = 0;
    while (pos < len) {
        size_t cut = em_tok_safe_cut(VARIED + pos, len - pos, 16);
        cuts += cut < len - pos;
        assert_int_equal(em_tok_encode(t, VARIED + pos, cut, true, &d), EM_OK);
        pos += cut;
    }
    assert_true(cuts > 2);
    assert_int_equal(d.len, a.len);
    assert_memory_equal(a.ids, d.ids, a.len * sizeof *a.ids);
    /* random texts made of the characters the cut rules look at, cut at every safe point */
    static const char *bits[] = {"a", "b", " ",  "  ",       "\n",           "\n\n", "'s",  "'",
                                 "1", ".", "\t", "\xc3\xa9", "\xe3\x80\x80", "\xff", "\r\n"};
    uint64_t seed = 777;
    for (int iter = 0; iter < 2000; iter++) {
        char txt[256];
        size_t n = 0;
        while (n < 200) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const char *bit = bits[(seed >> 33) % (sizeof bits / sizeof *bits)];
            memcpy(txt + n, bit, strlen(bit));
            n += strlen(bit);
        }
        em_tokens whole = {0}, parts = {0};
        assert_int_equal(em_tok_encode(t, txt, n, false, &whole), EM_OK);
        for (size_t p = 0; p < n;) {
            size_t cut = em_tok_safe_cut(txt + p, n - p, 1);
            assert_int_equal(em_tok_encode(t, txt + p, cut, false, &parts), EM_OK);
            p += cut;
        }
        assert_int_equal(whole.len, parts.len);
        assert_memory_equal(whole.ids, parts.ids, whole.len * sizeof *whole.ids);
        em_tokens_free(&whole);
        em_tokens_free(&parts);
    }
    em_tokens_free(&a);
    em_tokens_free(&b);
    em_tokens_free(&c);
    em_tokens_free(&d);
    em_tok_free(tt);
    em_tok_free(tj);
    em_tok_free(t);
    remove_dir(dir);
}

static void test_errors(void **state)
{
    (void)state;
    char dir[512], path[1200];
    scratch_dir("bpe-errors", dir, sizeof dir);
    assert_null(em_tok_gpt2(dir));
    assert_non_null(strstr(em_last_error(), "encoder.json"));
    assert_null(em_tok_load("/no/such/tokenizer.json"));
    assert_non_null(strstr(em_last_error(), "no such file"));
    /* a corrupt vocab.bpe */
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    write_file(path, "{\"a\": 0}", 8);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    write_file(path, "#version: 0.2\nnospace\n", 22);
    assert_null(em_tok_gpt2(dir));
    assert_non_null(strstr(em_last_error(), "vocab.bpe:2"));
    /* a corrupt tiktoken file, and a JSON of the wrong kind */
    snprintf(path, sizeof path, "%s/bad.tiktoken", dir);
    write_file(path, "IQ== 0\n!!!! 1\n", 14);
    assert_null(em_tok_load(path));
    assert_non_null(strstr(em_last_error(), ":2"));
    snprintf(path, sizeof path, "%s/bad.json", dir);
    write_file(path, "{\"kind\": \"wordpiece\"}", strlen("{\"kind\": \"wordpiece\"}"));
    assert_null(em_tok_load(path));
    assert_non_null(strstr(em_last_error(), "wordpiece"));
    {
        const char *j = "{\"kind\": \"bpe\", \"tokens\": [\"QQ==\"]}";
        write_file(path, j, strlen(j));
    }
    assert_null(em_tok_load(path));
    assert_non_null(strstr(em_last_error(), "byte 0x00"));
    em_tokenizer *t = em_tok_gpt2(NULL);
    if (t) {
        uint32_t ids[2] = {1, 60000};
        char *out;
        assert_int_equal(em_tok_decode(t, ids, 2, &out, NULL), EM_ERR_INVALID);
        assert_non_null(strstr(em_last_error(), "60000"));
        em_tok_free(t);
    }
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_npm_packages),     cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_roundtrip_random_bytes),   cmocka_unit_test(test_stream_decoder),
        cmocka_unit_test(test_tiktoken_file_and_chunks), cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
