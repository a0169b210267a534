/* make_model.c — the fixture of the serve tests that run the `ember` binary: a tiny random GPT
 * saved as DIR/ckpt.safetensors (em_gpt_new + em_gpt_save), with GPT-2's tokenizer when its files
 * are installed (scripts/bootstrap puts them in ember's data directory; `ember serve` then finds
 * it for the 50257-token vocabulary) or else a character tokenizer saved beside it as
 * DIR/tokenizer.json. It also runs the model's decode path once (a prefill and a batched step, as
 * `ember serve` warms up), so the kernels land in $EMBER_CACHE_DIR here, once, rather than in
 * every server the tests start at the same time. `make_model DIR [--char]`; prints which
 * tokenizer it chose. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/gpt.h"

static const char TEXT[] =
    "In the beginning was the word. User: Assistant: Hello, how are you? I am fine, thank you.\n"
    "The quick brown fox jumps over the lazy dog! 0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
    "abcdefghijklmnopqrstuvwxyz ,.;:?!'\"()[]{}<>/\\|@#$%^&*-_+=~`\n";

/* mkdir -p. */
static void make_dirs(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: make_model DIR [--char]\n");
        return 2;
    }
    const char *dir = argv[1];
    bool want_char = argc > 2 && strcmp(argv[2], "--char") == 0;
    make_dirs(dir);
    em_tokenizer *tok = want_char ? NULL : em_tok_gpt2(NULL);
    bool gpt2 = tok != NULL;
    if (!tok) {
        const char *specials[] = {"<|endoftext|>"};
        tok = em_tok_char_from_text(TEXT, sizeof TEXT - 1, specials, 1);
    }
    if (!tok) {
        fprintf(stderr, "make_model: %s\n", em_last_error());
        return 1;
    }
    char path[4096];
    int rc = 0;
    if (!gpt2) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (em_tok_save(tok, path) != EM_OK) rc = 1;
    }
    em_device *dev = rc == 0 ? em_device_open("cpu") : NULL;
    em_gpt_config c = {.vocab_size = em_tok_vocab_size(tok),
                       .block_size = 128,
                       .n_layer = 2,
                       .n_head = 2,
                       .n_embd = 32,
                       .dropout = 0.0,
                       .bias = true,
                       .tied = true};
    em_gpt *g = dev ? em_gpt_new(dev, EM_F32, &c, 1234) : NULL;
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    if (!g || em_gpt_save(g, path) != EM_OK) rc = 1;
    em_gpt_batch *b = rc == 0 ? em_gpt_batch_new(g, 2, 0) : NULL;
    float *logits = malloc(2 * (size_t)c.vocab_size * sizeof *logits);
    int64_t ids[3] = {1, 2, 3}, slots[2] = {0, 1}, toks[2] = {4, 5};
    if (rc == 0 && (!b || !logits || em_gpt_batch_prefill(b, 0, ids, 3, logits) != EM_OK ||
                    em_gpt_batch_prefill(b, 1, ids, 2, logits) != EM_OK ||
                    em_gpt_batch_step(b, slots, toks, 2, logits) != EM_OK))
        rc = 1;
    free(logits);
    em_gpt_batch_free(b);
    if (rc)
        fprintf(stderr, "make_model: %s\n", em_last_error());
    else
        printf("make_model: %s (vocab %lld, %s tokenizer)\n", path, (long long)c.vocab_size,
               gpt2 ? "gpt2" : "char");
    em_gpt_free(g);
    if (dev) em_device_close(dev);
    em_tok_free(tok);
    return rc;
}
