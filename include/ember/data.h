/* ember/data.h — tokenizers, token shards and the data loader (the data layer, src/data).
 *
 * Tokenizers: GPT-2's byte-level BPE (loaded from encoder.json + vocab.bpe, from a tiktoken rank
 * file, or trained here from a corpus) and a character-level tokenizer. The BPE pre-tokenizer is
 * GPT-2's regex with the Unicode letter/number categories of PCRE2. Special tokens
 * (<|endoftext|>, chat-template tokens such as <|im_start|>) are matched before the regex when the
 * caller allows them.
 *
 * Shards: llm.c's .bin format — a header of 256 little-endian int32 (magic 20240520, version,
 * token count), then the tokens: uint16 (version 1) or uint32 (version 2, vocabularies over
 * 65,536 tokens).
 *
 * Loader: memory-maps a set of shards and yields (inputs, targets) batches of B x T tokens,
 * sequential or shuffled by a seed, split between ranks, with a position that can be saved and
 * restored, filled ahead of time by a background thread.
 *
 * Errors follow ember/base.h: NULL or an em_status, with em_last_error() saying what went wrong.
 * Nothing here aborts on bad input. */
#ifndef EMBER_DATA_H
#define EMBER_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tokenizers ------------------------------------------------------------------------------ */

typedef struct em_tokenizer em_tokenizer;

typedef enum em_tok_kind {
    EM_TOK_BPE,  /* byte-level BPE (GPT-2 style) */
    EM_TOK_CHAR, /* one token per Unicode code point of a fixed alphabet */
} em_tok_kind;

/* GPT-2's tokenizer: encoder.json + vocab.bpe from `dir`, or (dir == NULL) from ember's data
 * directory: $EMBER_DATA_DIR/gpt2, $XDG_DATA_HOME/ember/gpt2 (or ~/.local/share/ember/gpt2), then
 * the npm package that scripts/bootstrap installs in the source tree. <|endoftext|> is 50256.
 * Returns a new tokenizer (free with em_tok_free) or NULL. */
em_tokenizer *em_tok_gpt2(const char *dir);
/* Byte-level BPE from a tiktoken rank file ("base64-token rank" per line), with GPT-2's
 * pre-tokenizer. Special tokens are added with em_tok_add_special. */
em_tokenizer *em_tok_load_tiktoken(const char *path);
/* Any tokenizer by name or path: "gpt2", a directory holding encoder.json + vocab.bpe, a tiktoken
 * rank file, or a tokenizer saved by em_tok_save (ember's JSON format). */
em_tokenizer *em_tok_load(const char *name_or_path);
/* Saves a tokenizer in ember's JSON format (atomically). */
em_status em_tok_save(const em_tokenizer *tok, const char *path);
void em_tok_free(em_tokenizer *tok);

em_tok_kind em_tok_kind_of(const em_tokenizer *tok);
/* Number of token ids (ordinary and special): every id is below this. */
uint32_t em_tok_vocab_size(const em_tokenizer *tok);
/* Adds a special token; id < 0 takes the next free id. Returns the id, or -1 (error set) when the
 * text is empty or already a special token, or the id is taken by another token. */
int64_t em_tok_add_special(em_tokenizer *tok, const char *text, int64_t id);
/* Adds the chat-template tokens <|im_start|> and <|im_end|> (ChatML), at the next free ids, unless
 * the tokenizer has them already. With GPT-2 they become 50257 and 50258. */
em_status em_tok_add_chat_specials(em_tokenizer *tok);
/* The id of a special token, or -1. */
int64_t em_tok_special_id(const em_tokenizer *tok, const char *text);
/* The id of <|endoftext|>, or -1 when the tokenizer has none. */
int64_t em_tok_eot(const em_tokenizer *tok);
/* The bytes of token `id` (not NUL-terminated; *len gets the length), or NULL for an unknown id.
 * Owned by the tokenizer. */
const uint8_t *em_tok_token_bytes(const em_tokenizer *tok, uint32_t id, size_t *len);

/* A growable array of token ids. */
typedef struct em_tokens {
    uint32_t *ids; /* malloc'd ids */
    size_t len;    /* number of ids */
    size_t cap;    /* allocated ids */
} em_tokens;
void em_tokens_free(em_tokens *t);

/* Encodes `len` bytes (any bytes: invalid UTF-8 is encoded byte by byte through the BPE, so decode
 * gives it back exactly) and appends the ids to `out`. With allow_special, the text of each special
 * token becomes its id; without, it is encoded as ordinary text. A character tokenizer fails
 * (EM_ERR_INVALID, naming the character and its offset) on a character outside its alphabet.
 * Thread-safe: one tokenizer may encode on several threads at once. */
em_status em_tok_encode(const em_tokenizer *tok, const char *text, size_t len, bool allow_special,
                        em_tokens *out);
/* Decodes ids into bytes appended to a malloc'd, NUL-terminated buffer (*out, length *out_len).
 * Fails on an id outside the vocabulary. */
em_status em_tok_decode(const em_tokenizer *tok, const uint32_t *ids, size_t n, char **out,
                        size_t *out_len);

/* The first offset at or after `min` where text[0, len) can be cut so that both sides encode as
 * they would in one piece (before the space between two ASCII letters, or after a newline between
 * two non-space ASCII characters); len when there is none. Used to encode a large text in
 * parallel chunks with the same result as one call. */
size_t em_tok_safe_cut(const char *text, size_t len, size_t min);

/* A streaming decoder: feed ids one at a time and receive only complete UTF-8 characters; bytes
 * that can never become valid UTF-8 come out as U+FFFD. */
typedef struct em_tok_stream {
    const em_tokenizer *tok; /* borrowed */
    uint8_t pending[8];      /* an incomplete UTF-8 sequence held back */
    size_t npending;         /* its length */
} em_tok_stream;
void em_tok_stream_init(em_tok_stream *s, const em_tokenizer *tok);
/* Writes the complete characters that id completes into out (capacity cap; 3 x the token's length
 * + 32 always suffices, as each invalid byte becomes the 3 bytes of U+FFFD) and returns how many
 * bytes were written, or -1 (error set) for an unknown id or a too small buffer. */
long em_tok_stream_feed(em_tok_stream *s, uint32_t id, char *out, size_t cap);
/* Flushes what is held back (as U+FFFD; 32 bytes always suffice); returns bytes written. */
long em_tok_stream_finish(em_tok_stream *s, char *out, size_t cap);

/* ---- training ------------------------------------------------------------------------------- */

typedef struct em_bpe_train_opts {
    uint32_t vocab_size;         /* total ids wanted, specials included (>= 256 + specials) */
    const char *const *specials; /* special tokens appended after the merges (may be NULL) */
    size_t nspecials;            /* how many */
    bool verbose;                /* progress on stderr */
} em_bpe_train_opts;

/* Trains a byte-level BPE on text (GPT-2's pre-tokenizer; merges chosen by pair count, ties by
 * smallest pair; pair counts are updated incrementally after each merge). Returns a new tokenizer
 * or NULL. */
em_tokenizer *em_bpe_train(const char *text, size_t len, const em_bpe_train_opts *opts);

/* A character tokenizer whose alphabet is every code point in text (sorted), plus the specials
 * (after it). Invalid UTF-8 bytes in text are an error. */
em_tokenizer *em_tok_char_from_text(const char *text, size_t len, const char *const *specials,
                                    size_t nspecials);

/* ---- shards ---------------------------------------------------------------------------------- */

#define EM_SHARD_MAGIC 20240520
#define EM_SHARD_HEADER_INTS 256
#define EM_SHARD_VERSION_U16 1 /* uint16 tokens */
#define EM_SHARD_VERSION_U32 2 /* uint32 tokens */

/* Writes ids as one shard (atomically): uint16 when every id fits (vocab_size <= 65536), else
 * uint32 with version 2. Fails if an id is >= vocab_size. */
em_status em_shard_write(const char *path, const uint32_t *ids, size_t n, uint32_t vocab_size);

/* A shard opened read-only (memory-mapped). */
typedef struct em_shard {
    char *path;         /* malloc'd copy of the path */
    void *map;          /* the mapping */
    size_t map_size;    /* its size */
    int version;        /* 1 or 2 */
    size_t ntokens;     /* token count from the header */
    const void *tokens; /* first token (uint16 or uint32 by version) */
} em_shard;
/* Opens and checks a shard: magic, version, and that the size matches the count. */
em_status em_shard_open(em_shard *s, const char *path);
void em_shard_close(em_shard *s);
/* Token i (no bounds check beyond an assert). */
static inline uint32_t em_shard_token(const em_shard *s, size_t i)
{
    return s->version == EM_SHARD_VERSION_U16 ? ((const uint16_t *)s->tokens)[i]
                                              : ((const uint32_t *)s->tokens)[i];
}

/* ---- loader ---------------------------------------------------------------------------------- */

typedef struct em_loader em_loader;

typedef struct em_loader_opts {
    const char *path; /* a shard, a directory of *.bin shards, or a glob ("data/train_*.bin") */
    int batch;        /* B: rows per batch */
    int seq;          /* T: tokens per row */
    bool shuffle;     /* random sample order (reshuffled each epoch) instead of sequential */
    uint64_t seed;    /* shuffle seed */
    int rank;         /* this process's rank, 0..world-1 */
    int world;        /* number of processes (0 counts as 1) */
    bool prefetch;    /* fill batches ahead on a background thread */
} em_loader_opts;

/* Where a loader is: the epoch and the batch within it (for this rank). */
typedef struct em_loader_pos {
    uint64_t epoch; /* full passes over the data so far */
    uint64_t step;  /* batches taken in this epoch */
} em_loader_pos;

/* Opens the shards and plans the samples: each sample is T+1 tokens starting at a multiple of T
 * inside one shard; the targets are the inputs shifted by one. Batch s of rank r takes samples
 * [(s * world + r) * B, + B) of the epoch's order, so ranks never share a sample. */
em_loader *em_loader_open(const em_loader_opts *opts);
void em_loader_close(em_loader *l);
/* Batches per epoch for each rank. */
uint64_t em_loader_batches_per_epoch(const em_loader *l);
/* Fills inputs and targets (B*T int32 each, row-major) with the next batch; moves to the next
 * epoch (with a new order when shuffling) after the last batch of an epoch. */
em_status em_loader_next(em_loader *l, int32_t *inputs, int32_t *targets);
/* The position of the next batch. */
em_loader_pos em_loader_tell(const em_loader *l);
/* Resumes at a position (from em_loader_tell, possibly of another run with the same options). */
em_status em_loader_seek(em_loader *l, em_loader_pos pos);
/* Total tokens in the loader's shards. */
uint64_t em_loader_tokens(const em_loader *l);

/* The next batch as two new int32 tensors of shape [B, T] on dev (the caller owns both), copied
 * from the host batch em_loader_next prepares. On failure both are NULL and the error is set. */
typedef struct em_device em_device; /* ember/runtime.h */
typedef struct em_tensor em_tensor; /* ember/tensor.h */
em_status em_loader_next_tensors(em_loader *l, em_device *dev, em_tensor **inputs,
                                 em_tensor **targets);

#ifdef __cplusplus
}
#endif
#endif
