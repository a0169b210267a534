/* data.c — `ember data`: turning text into training data.
 *   ember data prepare --input PATH --out DIR [--tokenizer T] [--val-fraction F] ...
 *       tokenizes a text file or a folder of text files (each file one document, preceded by
 *       <|endoftext|>) on every core and writes llm.c .bin shards (val_000000.bin, train_*.bin)
 *       plus the tokenizer (tokenizer.json) into DIR, with a progress bar on a terminal.
 *   ember data train-tokenizer --input PATH --vocab-size N --out FILE
 *       trains a byte-level BPE on the text and saves it.
 *   ember data info SHARD...
 *       checks shards and prints their headers. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/threadpool.h"
#include "ember/data.h"
#include "cli.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ember data prepare --input PATH --out DIR [--tokenizer gpt2|char|FILE]\n"
        "                          [--val-fraction F] [--shard-tokens N] [--no-eot] [--special]\n"
        "                          [--chat]\n"
        "       ember data train-tokenizer --input PATH --out FILE [--vocab-size N]\n"
        "                          [--special TOKEN]...\n"
        "       ember data info SHARD...\n\n"
        "prepare: tokenizes a text file or every file under a folder (each file is one document,\n"
        "  preceded by <|endoftext|> unless --no-eot) and writes llm.c token shards to DIR:\n"
        "  val_000000.bin (the first F of the tokens, default 0.1) and train_NNNNNN.bin (at most\n"
        "  N tokens each, default 100000000), plus DIR/tokenizer.json. Shards hold uint16 ids\n"
        "  (version 1), or uint32 (version 2) when the vocabulary exceeds 65,536 ids.\n"
        "  --special makes special-token text in the input (<|endoftext|>) count as the token;\n"
        "  --chat adds the chat-template tokens <|im_start|> and <|im_end|> to the vocabulary.\n"
        "train-tokenizer: trains a byte-level BPE (GPT-2 pre-tokenizer) with N ids (default\n"
        "  8192, specials included; default special <|endoftext|>) and saves it to FILE.\n"
        "info: checks each shard and prints its version and token count.\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- input files --------------------------------------------------------------------------------
 */

typedef struct file_list {
    char **paths; /* malloc'd paths, sorted */
    size_t n;     /* how many */
    size_t cap;   /* allocated */
} file_list;

static bool list_push(file_list *l, const char *path)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **p = realloc(l->paths, cap * sizeof *p);
        if (!p) return false;
        l->paths = p;
        l->cap = cap;
    }
    l->paths[l->n] = strdup(path);
    return l->paths[l->n++] != NULL;
}

/* Adds path if it is a regular file, or every regular file under it if it is a folder; names
 * starting with '.' are skipped. */
static bool walk(const char *path, file_list *l, int depth)
{
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (S_ISREG(st.st_mode)) return list_push(l, path);
    if (!S_ISDIR(st.st_mode) || depth > 32) return true;
    DIR *d = opendir(path);
    if (!d) return false;
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        size_t n = strlen(path) + strlen(e->d_name) + 2;
        char *child = malloc(n);
        if (!child) {
            ok = false;
            break;
        }
        snprintf(child, n, "%s/%s", path, e->d_name);
        ok = walk(child, l, depth + 1);
        free(child);
    }
    closedir(d);
    return ok;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_free(file_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
}

/* The input files: PATH itself, or every regular file under it (sorted). */
static bool list_inputs(const char *path, file_list *l)
{
    memset(l, 0, sizeof *l);
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "ember data: input %s: %s\n", path, strerror(errno));
        return false;
    }
    if (!walk(path, l, 0)) {
        fprintf(stderr, "ember data: cannot list %s\n", path);
        list_free(l);
        return false;
    }
    if (l->n == 0) {
        fprintf(stderr, "ember data: no files under %s\n", path);
        list_free(l);
        return false;
    }
    qsort(l->paths, l->n, sizeof *l->paths, cmp_str);
    return true;
}

/* All inputs concatenated (for training and character alphabets). */
static char *read_inputs(const file_list *l, size_t *len)
{
    size_t total = 0, cap = 1 << 20;
    char *buf = malloc(cap);
    for (size_t i = 0; i < l->n && buf; i++) {
        size_t n;
        char *t = em_file_read(l->paths[i], &n);
        if (!t) {
            fprintf(stderr, "ember data: %s\n", em_last_error());
            free(buf);
            return NULL;
        }
        while (total + n + 1 > cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        if (buf) {
            memcpy(buf + total, t, n);
            total += n;
        }
        free(t);
    }
    if (!buf) {
        fprintf(stderr, "ember data: out of memory reading the input\n");
        return NULL;
    }
    buf[total] = 0;
    *len = total;
    return buf;
}

/* ---- prepare ------------------------------------------------------------------------------------
 */

typedef struct chunk {
    const char *text; /* borrowed from the file's map */
    size_t len;       /* bytes */
    em_tokens out;    /* its ids */
    char err[512];    /* the worker's error message, empty when fine */
} chunk;

typedef struct encode_job {
    const em_tokenizer *tok; /* shared, read-only */
    chunk *chunks;           /* this batch */
    bool special;            /* allow special tokens */
} encode_job;

static void encode_chunk(void *ctx, size_t i, unsigned worker)
{
    (void)worker;
    encode_job *job = ctx;
    chunk *c = &job->chunks[i];
    if (em_tok_encode(job->tok, c->text, c->len, job->special, &c->out) != EM_OK)
        snprintf(c->err, sizeof c->err, "%s", em_last_error());
}

static void progress(double done, double total, double t0, bool tty)
{
    if (!tty || total <= 0) return;
    int width = 30, fill = (int)(width * done / total);
    double dt = now_s() - t0;
    fprintf(stderr, "\r[%.*s%*s] %3d%% %7.1f MB/s", fill, "##############################",
            width - fill, "", (int)(100 * done / total), dt > 0 ? done / dt / 1e6 : 0.0);
    fflush(stderr);
}

static bool append(em_tokens *all, const uint32_t *ids, size_t n)
{
    if (all->len + n > all->cap) {
        size_t cap = all->cap ? all->cap : 1 << 20;
        while (cap < all->len + n) cap *= 2;
        uint32_t *p = realloc(all->ids, cap * sizeof *p);
        if (!p) return false;
        all->ids = p;
        all->cap = cap;
    }
    memcpy(all->ids + all->len, ids, n * sizeof *ids);
    all->len += n;
    return true;
}

/* Encodes one file into all, in chunks spread over the pool. */
static bool encode_file(const char *path, const em_tokenizer *tok, bool special,
                        em_threadpool *pool, em_tokens *all, double *done, double total, double t0,
                        bool tty)
{
    em_mmap m;
    if (em_mmap_open(&m, path) != EM_OK) {
        fprintf(stderr, "ember data: %s\n", em_last_error());
        return false;
    }
    const size_t CHUNK = 1 << 20;
    size_t batch = 4 * (size_t)em_threadpool_size(pool);
    chunk *chunks = calloc(batch, sizeof *chunks);
    bool ok = chunks != NULL;
    size_t pos = 0;
    const char *text = m.data;
    while (ok && pos < m.size) {
        size_t n = 0;
        while (n < batch && pos < m.size) {
            size_t cut = em_tok_safe_cut(text + pos, m.size - pos, CHUNK);
            chunks[n] = (chunk){.text = text + pos, .len = cut};
            pos += cut;
            n++;
        }
        encode_job job = {tok, chunks, special};
        em_threadpool_parallel_for(pool, n, 1, encode_chunk, &job);
        for (size_t i = 0; i < n; i++) {
            if (ok && chunks[i].err[0]) {
                fprintf(stderr, "%sember data: %s: byte %zu on: %s\n", tty ? "\n" : "", path,
                        (size_t)(chunks[i].text - text), chunks[i].err);
                ok = false;
            }
            if (ok && !append(all, chunks[i].out.ids, chunks[i].out.len)) {
                fprintf(stderr, "ember data: out of memory holding %zu tokens\n", all->len);
                ok = false;
            }
            *done += (double)chunks[i].len;
            em_tokens_free(&chunks[i].out);
        }
        progress(*done, total, t0, tty);
    }
    free(chunks);
    em_mmap_close(&m);
    return ok;
}

static int write_shards(const char *out, const em_tokens *all, uint32_t vocab, double val_fraction,
                        size_t shard_tokens)
{
    size_t nval = (size_t)(val_fraction * (double)all->len + 0.5);
    if (val_fraction > 0 && nval == 0) nval = 1;
    char path[4096];
    size_t nshards = 0;
    if (nval) {
        snprintf(path, sizeof path, "%s/val_000000.bin", out);
        if (em_shard_write(path, all->ids, nval, vocab) != EM_OK) {
            fprintf(stderr, "ember data: %s\n", em_last_error());
            return -1;
        }
        nshards++;
    }
    for (size_t pos = nval, k = 0; pos < all->len; pos += shard_tokens, k++) {
        size_t n = all->len - pos < shard_tokens ? all->len - pos : shard_tokens;
        snprintf(path, sizeof path, "%s/train_%06zu.bin", out, k);
        if (em_shard_write(path, all->ids + pos, n, vocab) != EM_OK) {
            fprintf(stderr, "ember data: %s\n", em_last_error());
            return -1;
        }
        nshards++;
    }
    return (int)nshards;
}

static int prepare(int argc, char **argv)
{
    const char *tok_name = "gpt2", *input = NULL, *out = NULL;
    double val_fraction = 0.1;
    unsigned long long shard_tokens = 100000000ull;
    bool eot = true, special = false, chat = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            tok_name = argv[++i];
        } else if (strcmp(a, "--input") == 0 && i + 1 < argc) {
            input = argv[++i];
        } else if (strcmp(a, "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(a, "--val-fraction") == 0 && i + 1 < argc) {
            val_fraction = strtod(argv[++i], &end);
            if (*end || !(val_fraction >= 0 && val_fraction < 1)) {
                fprintf(stderr, "ember data: --val-fraction wants a number in [0, 1), not '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--shard-tokens") == 0 && i + 1 < argc) {
            shard_tokens = strtoull(argv[++i], &end, 10);
            if (*end || shard_tokens == 0 || shard_tokens > INT32_MAX) {
                fprintf(stderr, "ember data: --shard-tokens wants 1..%d, not '%s'\n", INT32_MAX,
                        argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--no-eot") == 0) {
            eot = false;
        } else if (strcmp(a, "--special") == 0) {
            special = true;
        } else if (strcmp(a, "--chat") == 0) {
            chat = true;
        } else {
            fprintf(stderr, "ember data prepare: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!input || !out) {
        fprintf(stderr, "ember data prepare: --input and --out are required\n\n");
        usage(stderr);
        return 2;
    }
    file_list files;
    if (!list_inputs(input, &files)) return 1;
    em_tokenizer *tok = NULL;
    if (strcmp(tok_name, "char") == 0) {
        size_t len;
        char *all = read_inputs(&files, &len);
        const char *specials[] = {"<|endoftext|>"};
        tok = all ? em_tok_char_from_text(all, len, specials, 1) : NULL;
        free(all);
    } else {
        tok = em_tok_load(tok_name);
    }
    int rc = 1;
    em_tokens all = {0};
    em_threadpool *pool = NULL;
    if (!tok || (chat && em_tok_add_chat_specials(tok) != EM_OK)) {
        fprintf(stderr, "ember data: %s\n", em_last_error());
        goto done;
    }
    if (em_mkdir_p(out) != EM_OK) {
        fprintf(stderr, "ember data: %s\n", em_last_error());
        goto done;
    }
    pool = em_threadpool_create(0);
    if (!pool) {
        fprintf(stderr, "ember data: %s\n", em_last_error());
        goto done;
    }
    double total = 0, done_bytes = 0, t0 = now_s();
    for (size_t i = 0; i < files.n; i++) {
        struct stat st;
        if (stat(files.paths[i], &st) == 0) total += (double)st.st_size;
    }
    bool tty = isatty(2);
    int64_t eot_id = em_tok_eot(tok);
    for (size_t i = 0; i < files.n; i++) {
        uint32_t e = (uint32_t)eot_id;
        if (eot && eot_id >= 0 && !append(&all, &e, 1)) goto done;
        if (!encode_file(files.paths[i], tok, special, pool, &all, &done_bytes, total, t0, tty))
            goto done;
    }
    if (tty) fprintf(stderr, "\n");
    double dt = now_s() - t0;
    int nshards =
        write_shards(out, &all, em_tok_vocab_size(tok), val_fraction, (size_t)shard_tokens);
    if (nshards < 0) goto done;
    char tpath[4096];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", out);
    if (em_tok_save(tok, tpath) != EM_OK) {
        fprintf(stderr, "ember data: %s\n", em_last_error());
        goto done;
    }
    size_t nval = (size_t)(val_fraction * (double)all.len + 0.5);
    if (val_fraction > 0 && nval == 0) nval = 1;
    printf("%zu file(s), %.0f bytes -> %zu tokens (val %zu, train %zu) in %d shard(s) under %s; "
           "%.2f s, %.1f MB/s\n",
           files.n, total, all.len, nval, all.len - nval, nshards, out, dt,
           dt > 0 ? total / dt / 1e6 : 0.0);
    rc = 0;
done:
    em_threadpool_destroy(pool);
    em_tokens_free(&all);
    em_tok_free(tok);
    list_free(&files);
    return rc;
}

/* ---- train-tokenizer and info -----------------------------------------------------------------
 */

static int train_tokenizer(int argc, char **argv)
{
    const char *input = NULL, *out = NULL;
    unsigned long vocab = 8192;
    const char *specials[16];
    size_t nspecials = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--input") == 0 && i + 1 < argc) {
            input = argv[++i];
        } else if (strcmp(a, "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (strcmp(a, "--vocab-size") == 0 && i + 1 < argc) {
            vocab = strtoul(argv[++i], &end, 10);
            if (*end || vocab < 257 || vocab > 10000000) {
                fprintf(stderr, "ember data: --vocab-size wants 257..10000000, not '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--special") == 0 && i + 1 < argc && nspecials < 16) {
            specials[nspecials++] = argv[++i];
        } else {
            fprintf(stderr, "ember data train-tokenizer: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!input || !out) {
        fprintf(stderr, "ember data train-tokenizer: --input and --out are required\n");
        return 2;
    }
    if (nspecials == 0) specials[nspecials++] = "<|endoftext|>";
    file_list files;
    if (!list_inputs(input, &files)) return 1;
    size_t len;
    char *text = read_inputs(&files, &len);
    list_free(&files);
    if (!text) return 1;
    double t0 = now_s();
    em_bpe_train_opts o = {.vocab_size = (uint32_t)vocab,
                           .specials = specials,
                           .nspecials = nspecials,
                           .verbose = isatty(2)};
    em_tokenizer *t = em_bpe_train(text, len, &o);
    double dt = now_s() - t0;
    free(text);
    if (!t || em_tok_save(t, out) != EM_OK) {
        fprintf(stderr, "ember data: %s\n", em_last_error());
        em_tok_free(t);
        return 1;
    }
    printf("trained %u ids on %zu bytes in %.2f s -> %s\n", em_tok_vocab_size(t), len, dt, out);
    em_tok_free(t);
    return 0;
}

static int info(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        em_shard s;
        if (em_shard_open(&s, argv[i]) != EM_OK) {
            fprintf(stderr, "ember data: %s\n", em_last_error());
            rc = 1;
            continue;
        }
        printf("%s: version %d (%s tokens), %zu tokens:", argv[i], s.version,
               s.version == EM_SHARD_VERSION_U16 ? "uint16" : "uint32", s.ntokens);
        for (size_t k = 0; k < s.ntokens && k < 8; k++) printf(" %u", em_shard_token(&s, k));
        printf("%s\n", s.ntokens > 8 ? " ..." : "");
        em_shard_close(&s);
    }
    return rc;
}

int em_cli_data(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "prepare") == 0) return prepare(argc - 1, argv + 1);
    if (strcmp(argv[1], "train-tokenizer") == 0) return train_tokenizer(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0) return info(argc - 1, argv + 1);
    fprintf(stderr, "ember data: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
