/* fuzz_tokenizer.c — libFuzzer target over the data layer's parsers and encoders. The first input
 * byte picks what the rest feeds:
 *   0: GPT-2 encode (special tokens allowed or not) — decode must give the bytes back exactly;
 *      then the streaming decoder over the same ids must emit valid UTF-8
 *   1: the bytes as a tokenizer file (tiktoken ranks or ember JSON) — load, and if it loads,
 *      encode/decode a fixed text through it
 *   2: the bytes as a token shard — open it, and if it opens, run the loader over it
 *   3: a character tokenizer built from the bytes (fails cleanly on invalid UTF-8)
 *   4: a tiny BPE trained on the bytes, then a round trip through it
 * Any crash, sanitizer report or failed round trip (__builtin_trap) is a bug. When GPT-2's files
 * are missing, a BPE trained on a fixed text stands in for it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "ember/data.h"

static em_tokenizer *g_tok; /* GPT-2 (or a stand-in), loaded once per process */
static char g_dir[512];     /* a private scratch directory */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_tok = em_tok_gpt2(NULL);
    if (!g_tok) {
        const char *text =
            "the quick brown fox jumps over the lazy dog, it's 42 \xe6\x97\xa5\xe6\x9c\xac";
        em_bpe_train_opts o = {.vocab_size = 300};
        g_tok = em_bpe_train(text, strlen(text), &o);
        em_tok_add_special(g_tok, "<|endoftext|>", -1);
    }
    if (em_temp_dir("ember-fuzz-tok", g_dir, sizeof g_dir) != EM_OK)
        snprintf(g_dir, sizeof g_dir, "/tmp");
    return 0;
}

static void roundtrip(const em_tokenizer *t, const uint8_t *data, size_t size, bool special)
{
    em_tokens tk = {0};
    if (em_tok_encode(t, (const char *)data, size, special, &tk) != EM_OK) {
        if (em_tok_kind_of(t) == EM_TOK_BPE)
            __builtin_trap(); /* a byte-level BPE encodes every byte string */
        em_tokens_free(&tk);
        return;
    }
    char *back = NULL;
    size_t n = 0;
    if (em_tok_decode(t, tk.ids, tk.len, &back, &n) != EM_OK || n != size ||
        (size && memcmp(back, data, size) != 0))
        __builtin_trap();
    free(back);
    em_tok_stream s;
    em_tok_stream_init(&s, t);
    char small[64];
    for (size_t i = 0; i < tk.len; i++) {
        size_t len = 0;
        em_tok_token_bytes(t, tk.ids[i], &len);
        size_t cap = 3 * len + 32; /* what data.h promises is always enough */
        char *out = malloc(cap);
        if (!out || em_tok_stream_feed(&s, tk.ids[i], out, cap) < 0) __builtin_trap();
        free(out);
    }
    if (em_tok_stream_finish(&s, small, sizeof small) < 0) __builtin_trap();
    em_tokens_free(&tk);
}

static void as_file(const uint8_t *data, size_t size, const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        if (size) fwrite(data, 1, size, f);
        fclose(f);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || !g_tok) return 0;
    uint8_t mode = data[0] % 5;
    data++;
    size--;
    char path[1024];
    switch (mode) {
    case 0:
        roundtrip(g_tok, data, size, size % 2);
        break;
    case 1: {
        as_file(data, size, "tok.txt", path, sizeof path);
        em_tokenizer *t = em_tok_load(path);
        if (t) {
            static const char text[] = "Hello, world! <|endoftext|> 123";
            em_tokens tk = {0};
            if (em_tok_encode(t, text, sizeof text - 1, true, &tk) == EM_OK) {
                char *back = NULL;
                if (em_tok_decode(t, tk.ids, tk.len, &back, NULL) == EM_OK) free(back);
            }
            em_tokens_free(&tk);
            em_tok_free(t);
        }
        break;
    }
    case 2: {
        as_file(data, size, "shard.bin", path, sizeof path);
        em_shard s;
        if (em_shard_open(&s, path) == EM_OK) {
            uint64_t sum = 0;
            for (size_t i = 0; i < s.ntokens; i++) sum += em_shard_token(&s, i);
            (void)sum;
            em_shard_close(&s);
            em_loader_opts o = {
                .path = path, .batch = 2, .seq = 3, .shuffle = size % 2, .seed = size};
            em_loader *l = em_loader_open(&o);
            if (l) {
                int32_t in[6], tg[6];
                for (int i = 0; i < 4; i++)
                    if (em_loader_next(l, in, tg) != EM_OK) __builtin_trap();
                em_loader_close(l);
            }
        }
        break;
    }
    case 3: {
        em_tokenizer *t = em_tok_char_from_text((const char *)data, size, NULL, 0);
        if (t) {
            roundtrip(t, data, size, false);
            em_tok_free(t);
        }
        break;
    }
    case 4: {
        if (size > 4096) break;
        em_bpe_train_opts o = {.vocab_size = 256 + (uint32_t)(size % 64) + 1};
        em_tokenizer *t = em_bpe_train((const char *)data, size, &o);
        if (!t) __builtin_trap();
        roundtrip(t, data, size, false);
        em_tok_free(t);
        break;
    }
    }
    return 0;
}
