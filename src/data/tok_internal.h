/* tok_internal.h — the tokenizer's representation, shared by the files of src/data that build and
 * use tokenizers: tokenizer.c (common parts, decoding, saving, loading), bpe.c (GPT-2 pre-tokenizer
 * and byte-level BPE encoding), bpe_load.c (encoder.json + vocab.bpe, tiktoken files),
 * bpe_train.c (training) and char_tok.c (character tokenizer).
 *
 * Every token id names a byte string in one pool. For BPE the id is also the merge rank: a token
 * made by a later merge has a larger id, as in GPT-2 and tiktoken, so encoding merges the adjacent
 * pair whose concatenation has the smallest id. */
#ifndef EM_DATA_TOK_INTERNAL_H
#define EM_DATA_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/data.h"

#define TOK_NONE UINT32_MAX /* "no such token" in tables of ids */

typedef struct tok_special {
    char *text;  /* malloc'd, NUL-terminated */
    size_t len;  /* strlen(text) */
    uint32_t id; /* its id */
} tok_special;

struct em_tokenizer {
    em_tok_kind kind;      /* BPE or character */
    uint32_t nids;         /* id slots: every id (ordinary or special) is below this */
    uint32_t ids_cap;      /* allocated id slots */
    uint8_t *pool;         /* bytes of every token, back to back */
    size_t pool_len;       /* bytes used */
    size_t pool_cap;       /* bytes allocated */
    uint64_t *off;         /* nids offsets into pool */
    uint32_t *len;         /* nids lengths; 0 for an unused id */
    uint8_t *is_special;   /* nids flags */
    uint32_t *htab;        /* open-addressing table of ordinary ids keyed by their bytes */
    size_t hcap;           /* its capacity (power of two) */
    size_t hcount;         /* ids in it */
    uint32_t byte_id[256]; /* id of each single byte (BPE), TOK_NONE if absent */
    tok_special *specials; /* special tokens */
    size_t nspecials;      /* how many */
    uint32_t *chars;       /* character tokenizer: sorted code points; id = index */
    size_t nchars;         /* how many */
    void *re;              /* pcre2_code of the pre-tokenizer (BPE) */
    bool jit;              /* whether the pattern was JIT-compiled */
};

/* tokenizer.c */
em_tokenizer *tok_new(em_tok_kind kind);
/* Gives id the bytes s[0, n) (growing the id table); ordinary ids also enter the hash table.
 * Returns false (error set) when out of memory or the id is taken. */
bool tok_set(em_tokenizer *t, uint32_t id, const uint8_t *s, size_t n, bool special);
/* The ordinary id whose bytes are s[0, n), or TOK_NONE. */
uint32_t tok_lookup(const em_tokenizer *t, const uint8_t *s, size_t n);
/* Length of the longest valid UTF-8 prefix of s[0, n). */
size_t tok_utf8_valid(const uint8_t *s, size_t n);
/* Length of the valid UTF-8 character at s (1-4), or 0 when s does not start one (incomplete or
 * invalid). *incomplete is set when more bytes could still make it valid. */
size_t tok_utf8_char(const uint8_t *s, size_t n, bool *incomplete, uint32_t *cp);
/* Base64 (standard alphabet, padded) decode into out (capacity >= 3 * n / 4); returns the length
 * or -1 on a malformed string. */
long tok_b64_decode(const char *s, size_t n, uint8_t *out);
/* Base64-encodes s[0, n) into a malloc'd, NUL-terminated string. */
char *tok_b64_encode(const uint8_t *s, size_t n);

/* bpe.c */
/* Compiles GPT-2's pre-tokenizer into t->re. */
bool tok_bpe_init_regex(em_tokenizer *t);
void tok_bpe_free_regex(em_tokenizer *t);
/* Encodes ordinary text (no special tokens) with the BPE. */
em_status tok_bpe_encode_ordinary(const em_tokenizer *t, const uint8_t *s, size_t n,
                                  em_tokens *out);
/* Splits s[0, n) into pre-tokens, calling fn(ctx, piece, len) for each in order; invalid UTF-8
 * runs come out as pieces of their own. Returns false (error set) on failure. */
typedef bool (*tok_piece_fn)(void *ctx, const uint8_t *piece, size_t len);
bool tok_pretokenize(const em_tokenizer *t, const uint8_t *s, size_t n, tok_piece_fn fn, void *ctx);

/* char_tok.c */
em_status tok_char_encode_ordinary(const em_tokenizer *t, const uint8_t *s, size_t n,
                                   size_t base_offset, em_tokens *out);

/* Appends one id; false (error set) when out of memory. */
bool tok_push(em_tokens *out, uint32_t id);

#endif
