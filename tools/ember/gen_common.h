/* gen_common.h — what `ember sample` and `ember chat` share: option parsing from a table, opening
 * a checkpoint with its tokenizer on the best device, and streaming generated tokens to a file
 * as text while watching for stop strings (text up to a stop string is printed, the stop string
 * is not). */
#ifndef EMBER_GEN_COMMON_H
#define EMBER_GEN_COMMON_H

#include <stdio.h>

#include "ember/gpt.h"

/* ---- options ------------------------------------------------------------------------------- */

typedef enum gc_opt_kind { GC_INT, GC_I64, GC_U64, GC_DBL, GC_STR, GC_FLAG, GC_STRS } gc_opt_kind;

typedef struct gc_opt {
    const char *name; /* "--top-k" */
    gc_opt_kind kind; /* what it takes */
    void *dst;        /* int*, int64_t*, uint64_t*, double*, const char**, bool*, gc_strs* */
} gc_opt;

/* A repeatable string option. */
typedef struct gc_strs {
    const char *v[16];
    int n;
} gc_strs;

/* Parses argv[1..] ("--name value" or "--name=value") into the table. Returns 0, 1 for --help,
 * or 2 after printing "<cmd>: <problem>" to stderr. */
int gc_parse(const char *cmd, int argc, char **argv, const gc_opt *opts, int nopts);

/* ---- model and tokenizer ------------------------------------------------------------------- */

/* The safetensors file a --checkpoint argument names: a file as it is, or in a folder its
 * ckpt.safetensors (else model.safetensors); dir gets the folder (for tokenizer.json). */
void gc_checkpoint_path(const char *checkpoint, char *path, size_t path_size, char *dir,
                        size_t dir_size);
/* Opens a checkpoint (a file, or a folder holding ckpt.safetensors or model.safetensors) on
 * `device` (NULL or "auto": the best present) with its tokenizer (`tokenizer`, else
 * tokenizer.json beside the checkpoint, else GPT-2's when the vocabulary is GPT-2's). Prints the
 * problem and returns false on failure. */
bool gc_open(const char *cmd, const char *checkpoint, const char *tokenizer, const char *device,
             em_device **dev, em_gpt **g, em_tokenizer **tok);

/* ---- streaming ----------------------------------------------------------------------------- */

typedef struct gc_stream {
    em_tok_stream dec;        /* UTF-8 assembly */
    FILE *out;                /* where text goes */
    const char *const *stops; /* stop strings */
    int nstops;
    char *text;               /* generated text so far (malloc'd) */
    size_t len, cap, printed; /* bytes held, and how many of them were written */
    bool stopped;             /* a stop string was found */
    int64_t eot;              /* <|endoftext|>: ends the text, not printed (-1: none) */
} gc_stream;

void gc_stream_init(gc_stream *s, const em_tokenizer *tok, FILE *out, const char *const *stops,
                    int nstops);
/* The em_token_fn for em_gpt_generate: user is a gc_stream. */
bool gc_stream_token(int64_t token, void *user);
/* Writes what is held back (unless a stop string cut it) and frees. */
void gc_stream_finish(gc_stream *s);

#endif
