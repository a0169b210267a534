/* bench_tokenizer.c — tokenizer throughput, side by side with js-tiktoken on the same text in the
 * same run: GPT-2 encode MB/s on one thread (and on every core, cutting the text with
 * em_tok_safe_cut), js-tiktoken's encode MB/s through node (tests/data/gpt2_ref.js), with the token
 * counts compared; and BPE training time for an 8K vocabulary on the same text.
 *   ember_bench_tokenizer [TEXTFILE] [REPS]
 * TEXTFILE defaults to the default corpus (.cache/data/kjv.txt, made by scripts/corpus). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/threadpool.h"
#include "ember/data.h"

#define NPM_MODULES EMBER_SOURCE_DIR "/.cache/npm/node_modules"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct par_job {
    const em_tokenizer *tok; /* shared */
    const char **start;      /* chunk starts */
    size_t *len;             /* chunk lengths */
    em_tokens *out;          /* per chunk */
} par_job;

static void par_encode(void *ctx, size_t i, unsigned worker)
{
    (void)worker;
    par_job *j = ctx;
    j->out[i].len = 0;
    em_tok_encode(j->tok, j->start[i], j->len[i], false, &j->out[i]);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : EMBER_SOURCE_DIR "/.cache/data/kjv.txt";
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1) reps = 1;
    size_t len;
    char *text = em_file_read(path, &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: %s (run scripts/corpus, or name a text file)\n",
                em_last_error());
        return 1;
    }
    em_tokenizer *tok = em_tok_gpt2(NULL);
    if (!tok) {
        fprintf(stderr, "bench_tokenizer: %s\n", em_last_error());
        return 1;
    }
    printf("text: %s, %.2f MB\n", path, len / 1e6);

    /* one thread */
    em_tokens tk = {0};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        tk.len = 0;
        double t0 = now_s();
        if (em_tok_encode(tok, text, len, false, &tk) != EM_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", em_last_error());
            return 1;
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    double ember_mbs = len / best / 1e6;
    printf("ember gpt2 encode, 1 thread:   %8.2f MB/s  (%zu tokens, best of %d)\n", ember_mbs,
           tk.len, reps);

    /* every core */
    em_threadpool *pool = em_threadpool_create(0);
    size_t cap = len / (256 * 1024) + 2, n = 0;
    const char **start = malloc(cap * sizeof *start);
    size_t *clen = malloc(cap * sizeof *clen);
    for (size_t pos = 0; pos < len && n < cap; n++) {
        size_t cut = n + 1 == cap ? len - pos : em_tok_safe_cut(text + pos, len - pos, 256 * 1024);
        start[n] = text + pos;
        clen[n] = cut;
        pos += cut;
    }
    em_tokens *outs = calloc(n, sizeof *outs);
    par_job job = {tok, start, clen, outs};
    double pbest = 1e30;
    size_t ptokens = 0;
    for (int r = 0; r < reps && pool; r++) {
        double t0 = now_s();
        em_threadpool_parallel_for(pool, n, 1, par_encode, &job);
        double dt = now_s() - t0;
        if (dt < pbest) pbest = dt;
    }
    for (size_t i = 0; i < n; i++) {
        if (memcmp(outs[i].ids, tk.ids + ptokens, outs[i].len * sizeof *tk.ids) != 0)
            printf("WARNING: chunk %zu encodes differently from the whole text\n", i);
        ptokens += outs[i].len;
        em_tokens_free(&outs[i]);
    }
    printf("ember gpt2 encode, %u threads:  %8.2f MB/s  (%zu tokens in %zu chunks%s)\n",
           pool ? em_threadpool_size(pool) : 0, len / pbest / 1e6, ptokens, n,
           ptokens == tk.len ? ", same ids" : ", MISMATCH");

    /* js-tiktoken on the same file */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "node '%s/tests/data/gpt2_ref.js' '%s' '%s' bench %d 2>&1",
             EMBER_SOURCE_DIR, NPM_MODULES, path, reps);
    FILE *p = popen(cmd, "r");
    double js_mbs = 0;
    unsigned long js_tokens = 0;
    char line[512] = "";
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        pclose(p);
    }
    if (sscanf(line, "%lf %lu", &js_mbs, &js_tokens) == 2) {
        printf("js-tiktoken gpt2 encode:       %8.2f MB/s  (%lu tokens%s)\n", js_mbs, js_tokens,
               js_tokens == tk.len ? ", same count" : ", COUNT DIFFERS");
        printf("ratio ember/js-tiktoken:        %8.2fx (1 thread)\n", ember_mbs / js_mbs);
    } else {
        printf("js-tiktoken: not measured (%s) -- run scripts/bootstrap\n",
               line[0] ? line : "no output");
    }

    /* training */
    const char *specials[] = {"<|endoftext|>"};
    em_bpe_train_opts o = {.vocab_size = 8192, .specials = specials, .nspecials = 1};
    double t0 = now_s();
    em_tokenizer *trained = em_bpe_train(text, len, &o);
    double tt = now_s() - t0;
    if (trained)
        printf("bpe training to %u ids:        %8.2f s\n", em_tok_vocab_size(trained), tt);
    else
        printf("bpe training failed: %s\n", em_last_error());
    em_tok_free(trained);
    free(outs);
    free(start);
    free(clen);
    em_threadpool_destroy(pool);
    em_tokens_free(&tk);
    em_tok_free(tok);
    free(text);
    return 0;
}
