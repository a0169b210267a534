/* tokenize.c — `ember tokenize`: prints the token ids of a text file (or standard input) as
 * whitespace-separated integers, or with --decode turns such ids back into text. The tokenizer is
 * gpt2, char (an alphabet built from the input itself; --save-tokenizer keeps it for decoding),
 * or a file (tiktoken ranks, or a tokenizer saved by ember). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/data.h"
#include "cli.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ember tokenize [--tokenizer gpt2|char|FILE] [--decode] [--no-special] [--chat]\n"
        "                      [--save-tokenizer FILE] [TEXTFILE]\n\n"
        "Prints the token ids of TEXTFILE (or standard input) as whitespace-separated integers;\n"
        "with --decode, reads such ids and prints the text they stand for.\n\n"
        "  --tokenizer T        gpt2 (default): GPT-2's byte-level BPE (encoder.json + vocab.bpe\n"
        "                       from ember's data directory); char: one id per character of the\n"
        "                       input's own alphabet; FILE: a tiktoken rank file, a directory "
        "with\n"
        "                       encoder.json + vocab.bpe, or a tokenizer saved by ember\n"
        "  --decode             ids in, text out\n"
        "  --no-special         encode special tokens such as <|endoftext|> as plain text\n"
        "  --chat               add the chat-template tokens <|im_start|> and <|im_end|>\n"
        "  --save-tokenizer F   also save the tokenizer (e.g. a char alphabet) to F\n");
}

/* Reads a whole file, or standard input for NULL / "-". */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = (!path || strcmp(path, "-") == 0) ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ember tokenize: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || err) {
        fprintf(stderr, "ember tokenize: cannot read %s\n", path ? path : "standard input");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int decode(em_tokenizer *t, const char *text, size_t len)
{
    em_tokens ids = {0};
    size_t i = 0;
    while (i < len) {
        while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r'))
            i++;
        if (i >= len) break;
        unsigned long long v = 0;
        size_t start = i;
        while (i < len && text[i] >= '0' && text[i] <= '9' && v <= UINT32_MAX)
            v = v * 10 + (unsigned)(text[i++] - '0');
        bool sep =
            i >= len || text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r';
        if (i == start || !sep || v >= UINT32_MAX) {
            fprintf(stderr,
                    "ember tokenize: byte %zu of the input: expected a token id, found '%.*s'\n",
                    start, (int)(i - start + 1 < 20 ? i - start + 1 : 20), text + start);
            em_tokens_free(&ids);
            return 1;
        }
        if (ids.len == ids.cap) {
            size_t cap = ids.cap ? ids.cap * 2 : 1024;
            uint32_t *p = realloc(ids.ids, cap * sizeof *p);
            if (!p) {
                fprintf(stderr, "ember tokenize: out of memory\n");
                em_tokens_free(&ids);
                return 1;
            }
            ids.ids = p;
            ids.cap = cap;
        }
        ids.ids[ids.len++] = (uint32_t)v;
    }
    char *out;
    size_t n;
    if (em_tok_decode(t, ids.ids, ids.len, &out, &n) != EM_OK) {
        fprintf(stderr, "ember tokenize: %s\n", em_last_error());
        em_tokens_free(&ids);
        return 1;
    }
    fwrite(out, 1, n, stdout);
    free(out);
    em_tokens_free(&ids);
    return 0;
}

static int encode(em_tokenizer *t, const char *text, size_t len, bool special)
{
    em_tokens ids = {0};
    if (em_tok_encode(t, text, len, special, &ids) != EM_OK) {
        fprintf(stderr, "ember tokenize: %s\n", em_last_error());
        em_tokens_free(&ids);
        return 1;
    }
    for (size_t i = 0; i < ids.len; i++)
        printf(i + 1 == ids.len || (i + 1) % 16 == 0 ? "%u\n" : "%u ", ids.ids[i]);
    em_tokens_free(&ids);
    return 0;
}

int em_cli_tokenize(int argc, char **argv)
{
    const char *tok_name = "gpt2", *input = NULL, *save = NULL;
    bool dec = false, special = true, chat = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            tok_name = argv[++i];
        } else if (strcmp(a, "--save-tokenizer") == 0 && i + 1 < argc) {
            save = argv[++i];
        } else if (strcmp(a, "--decode") == 0) {
            dec = true;
        } else if (strcmp(a, "--no-special") == 0) {
            special = false;
        } else if (strcmp(a, "--chat") == 0) {
            chat = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ember tokenize: unknown or incomplete option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (!input) {
            input = a;
        } else {
            fprintf(stderr, "ember tokenize: one input file at most ('%s' and '%s')\n", input, a);
            return 2;
        }
    }
    size_t len;
    char *text = slurp(input, &len);
    if (!text) return 1;
    em_tokenizer *t;
    if (strcmp(tok_name, "char") == 0) {
        if (dec) {
            fprintf(stderr,
                    "ember tokenize: --decode with a char tokenizer needs its saved alphabet "
                    "(--tokenizer FILE from --save-tokenizer)\n");
            free(text);
            return 2;
        }
        const char *specials[] = {"<|endoftext|>"};
        t = em_tok_char_from_text(text, len, specials, 1);
    } else {
        t = em_tok_load(tok_name);
    }
    if (!t || (chat && em_tok_add_chat_specials(t) != EM_OK)) {
        fprintf(stderr, "ember tokenize: %s\n", em_last_error());
        em_tok_free(t);
        free(text);
        return 1;
    }
    int rc = dec ? decode(t, text, len) : encode(t, text, len, special);
    if (rc == 0 && save && em_tok_save(t, save) != EM_OK) {
        fprintf(stderr, "ember tokenize: %s\n", em_last_error());
        rc = 1;
    }
    em_tok_free(t);
    free(text);
    return rc;
}
