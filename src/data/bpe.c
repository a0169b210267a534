/* bpe.c — byte-level BPE encoding: GPT-2's pre-tokenizer (PCRE2, JIT-compiled when available) and
 * the merge loop.
 *
 * The pattern is GPT-2's, with JavaScript's meaning of \s spelled out (the reference
 * implementations, gpt-3-encoder and js-tiktoken, are JavaScript; PCRE2's \s differs on U+FEFF
 * and U+0085):
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Text is split into runs of valid UTF-8, each matched with PCRE2_NO_UTF_CHECK; a run of invalid
 * bytes becomes one piece of its own, so every byte string encodes and decodes back exactly.
 *
 * Merging follows tiktoken: among adjacent parts, the pair whose concatenated bytes have the
 * smallest rank (= id) is merged first, leftmost on ties, until no pair is a token. Short pieces
 * use a linear scan; long ones a heap, so a pathological piece costs O(n log n), not O(n^2). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "data/tok_internal.h"

#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r "                                                                         \
    "\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+"
    "|[" WS "]+(?![^" WS "])|[" WS "]+";

bool tok_bpe_init_regex(em_tokenizer *t)
{
    int err;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err,
                                   &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        em_set_error(EM_ERR_INTERNAL, "pre-tokenizer pattern: %s at %zu", (const char *)msg,
                     (size_t)erroff);
        return false;
    }
    t->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    t->re = re;
    return true;
}

void tok_bpe_free_regex(em_tokenizer *t)
{
    if (t->re) pcre2_code_free((pcre2_code *)t->re);
    t->re = NULL;
}

/* ---- pre-tokenizer --------------------------------------------------------------------------- */

typedef struct matcher {
    pcre2_code *re;            /* the pattern */
    pcre2_match_data *md;      /* one match's offsets */
    pcre2_match_context *mctx; /* holds the JIT stack */
    pcre2_jit_stack *stack;    /* JIT stack (NULL: PCRE2's default) */
    bool jit;                  /* use pcre2_jit_match */
} matcher;

static bool matcher_init(matcher *m, const em_tokenizer *t)
{
    memset(m, 0, sizeof *m);
    m->re = (pcre2_code *)t->re;
    m->jit = t->jit;
    m->md = pcre2_match_data_create_from_pattern(m->re, NULL);
    if (!m->md) return em_set_error(EM_ERR_NOMEM, "out of memory for regex match data"), false;
    if (m->jit) {
        m->mctx = pcre2_match_context_create(NULL);
        m->stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (m->mctx && m->stack) pcre2_jit_stack_assign(m->mctx, NULL, m->stack);
    }
    return true;
}

static void matcher_free(matcher *m)
{
    if (m->stack) pcre2_jit_stack_free(m->stack);
    if (m->mctx) pcre2_match_context_free(m->mctx);
    pcre2_match_data_free(m->md);
}

/* The end of the match starting at `at` in the valid UTF-8 run s[0, n); always > at. */
static size_t match_at(matcher *m, const uint8_t *s, size_t n, size_t at)
{
    int rc;
    uint32_t opts = PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED;
    if (m->jit) {
        /* JIT ignores PCRE2_ANCHORED at match time; the pattern matches at every position anyway
         * (its last alternatives cover whitespace, letters, numbers and everything else), so the
         * first match found from `at` starts at `at`. */
        rc = pcre2_jit_match(m->re, s, n, at, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
        if (rc < 0) rc = pcre2_match(m->re, s, n, at, opts, m->md, NULL);
    } else {
        rc = pcre2_match(m->re, s, n, at, opts, m->md, NULL);
    }
    if (rc > 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        if (ov[0] == at && ov[1] > at && ov[1] <= n) return ov[1];
    }
    /* cannot happen for a valid run; stay safe: one character */
    bool inc;
    size_t k = tok_utf8_char(s + at, n - at, &inc, NULL);
    return at + (k ? k : 1);
}

bool tok_pretokenize(const em_tokenizer *t, const uint8_t *s, size_t n, tok_piece_fn fn, void *ctx)
{
    matcher m;
    if (!matcher_init(&m, t)) return false;
    bool ok = true;
    size_t pos = 0;
    while (pos < n && ok) {
        size_t run = tok_utf8_valid(s + pos, n - pos);
        const uint8_t *r = s + pos;
        size_t at = 0;
        while (at < run && ok) {
            size_t end = match_at(&m, r, run, at);
            ok = fn(ctx, r + at, end - at);
            at = end;
        }
        pos += run;
        if (pos < n && ok) {
            /* a run of bytes that start no valid character */
            size_t bad = pos;
            bool inc;
            while (bad < n && !tok_utf8_char(s + bad, n - bad, &inc, NULL)) bad++;
            ok = fn(ctx, s + pos, bad - pos);
            pos = bad;
        }
    }
    matcher_free(&m);
    return ok;
}

/* ---- merging ----------------------------------------------------------------------------------
 */

#define LINEAR_MAX 128 /* pieces up to this many bytes merge with the linear scan */

/* Rank of s[a, b), TOK_NONE when not a token. */
static inline uint32_t rank_of(const em_tokenizer *t, const uint8_t *s, size_t a, size_t b)
{
    if (b - a == 1) return t->byte_id[s[a]];
    return tok_lookup(t, s + a, b - a);
}

/* Emits the token of each part s[start[i], start[i+1]); a byte that is no token cannot happen for
 * a full byte-level vocabulary but is reported rather than trusted. */
static bool emit_parts(const em_tokenizer *t, const uint8_t *s, const size_t *start, size_t nparts,
                       em_tokens *out)
{
    for (size_t i = 0; i < nparts; i++) {
        uint32_t id = rank_of(t, s, start[i], start[i + 1]);
        if (id == TOK_NONE)
            return em_set_error(EM_ERR_INVALID, "byte 0x%02x has no token in this vocabulary",
                                s[start[i]]),
                   false;
        if (!tok_push(out, id)) return false;
    }
    return true;
}

static bool merge_linear(const em_tokenizer *t, const uint8_t *s, size_t n, em_tokens *out)
{
    size_t start[LINEAR_MAX + 1];
    uint32_t rank[LINEAR_MAX + 1]; /* rank[i]: rank of parts i and i+1 merged */
    size_t np = n;                 /* number of parts */
    for (size_t i = 0; i <= n; i++) start[i] = i;
    for (size_t i = 0; i + 1 < np; i++) rank[i] = rank_of(t, s, start[i], start[i + 2]);
    if (np) rank[np - 1] = TOK_NONE;
    while (np > 1) {
        uint32_t best = TOK_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < np; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (best == TOK_NONE) break;
        /* merge parts bi and bi+1 */
        memmove(start + bi + 1, start + bi + 2, (np - bi - 1) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (np - bi - 2) * sizeof *rank);
        np--;
        rank[bi] = bi + 1 < np ? rank_of(t, s, start[bi], start[bi + 2]) : TOK_NONE;
        if (bi > 0) rank[bi - 1] = rank_of(t, s, start[bi - 1], start[bi + 1]);
        rank[np - 1] = TOK_NONE;
    }
    return emit_parts(t, s, start, np, out);
}

/* Heap version: parts are a doubly linked list over byte offsets; candidate merges (rank, left
 * part) sit in a min-heap and are checked against the list when popped. */
typedef struct cand {
    uint32_t rank; /* rank of the merged bytes */
    uint32_t left; /* offset of the left part */
    uint32_t end;  /* end offset of the right part when pushed (detects stale entries) */
} cand;

static bool cand_less(cand a, cand b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.left < b.left);
}

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    h[i] = c;
    while (i && cand_less(h[i], h[(i - 1) / 2])) {
        cand tmp = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0];
    h[0] = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && cand_less(h[l], h[m])) m = l;
        if (r < *n && cand_less(h[r], h[m])) m = r;
        if (m == i) break;
        cand tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return top;
}

static bool merge_heap(const em_tokenizer *t, const uint8_t *s, size_t n, em_tokens *out)
{
    if (n >= UINT32_MAX)
        return em_set_error(EM_ERR_INVALID, "a pre-token of %zu bytes is too long", n), false;
    /* next[i]: offset of the part after the part starting at i (n at the end); prev likewise;
     * alive[i]: a part starts at i */
    uint32_t *next = malloc((n + 1) * sizeof *next);
    uint32_t *prev = malloc((n + 1) * sizeof *prev);
    uint8_t *alive = malloc(n + 1);
    cand *heap = malloc((3 * n + 1) * sizeof *heap); /* n-1 initial + 2 per merge */
    size_t *start = NULL;
    bool ok = false;
    if (!next || !prev || !alive || !heap) {
        em_set_error(EM_ERR_NOMEM, "out of memory merging a %zu-byte pre-token", n);
        goto done;
    }
    size_t hn = 0;
    for (size_t i = 0; i <= n; i++) {
        next[i] = (uint32_t)(i + 1);
        prev[i] = i ? (uint32_t)(i - 1) : 0;
        alive[i] = 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = rank_of(t, s, i, i + 2);
        if (r != TOK_NONE) heap_push(heap, &hn, (cand){r, (uint32_t)i, (uint32_t)(i + 2)});
    }
    while (hn) {
        cand c = heap_pop(heap, &hn);
        uint32_t l = c.left;
        if (!alive[l] || next[l] >= n || next[next[l]] != c.end)
            continue; /* stale: the parts changed since this candidate was pushed */
        uint32_t mid = next[l];
        alive[mid] = 0;
        next[l] = c.end;
        if (c.end < n) prev[c.end] = l;
        /* new candidates with the left and right neighbours */
        if (c.end < n) {
            uint32_t r = rank_of(t, s, l, next[c.end]);
            if (r != TOK_NONE) heap_push(heap, &hn, (cand){r, l, next[c.end]});
        }
        if (l > 0) {
            uint32_t p = prev[l];
            uint32_t r = rank_of(t, s, p, c.end);
            if (r != TOK_NONE) heap_push(heap, &hn, (cand){r, p, c.end});
        }
    }
    size_t np = 0;
    start = malloc((n + 1) * sizeof *start);
    if (!start) {
        em_set_error(EM_ERR_NOMEM, "out of memory merging a %zu-byte pre-token", n);
        goto done;
    }
    for (size_t i = 0; i < n; i = next[i]) start[np++] = i;
    start[np] = n;
    ok = emit_parts(t, s, start, np, out);
done:
    free(next);
    free(prev);
    free(alive);
    free(heap);
    free(start);
    return ok;
}

/* Encodes one pre-token. */
static bool encode_piece(const em_tokenizer *t, const uint8_t *s, size_t n, em_tokens *out)
{
    if (n == 1) {
        uint32_t id = t->byte_id[s[0]];
        if (id == TOK_NONE)
            return em_set_error(EM_ERR_INVALID, "byte 0x%02x has no token in this vocabulary",
                                s[0]),
                   false;
        return tok_push(out, id);
    }
    uint32_t whole = tok_lookup(t, s, n);
    if (whole != TOK_NONE) return tok_push(out, whole);
    if (n <= LINEAR_MAX) return merge_linear(t, s, n, out);
    return merge_heap(t, s, n, out);
}

typedef struct encode_ctx {
    const em_tokenizer *t; /* the tokenizer */
    em_tokens *out;        /* where ids go */
} encode_ctx;

static bool encode_cb(void *ctx, const uint8_t *piece, size_t len)
{
    encode_ctx *c = ctx;
    return encode_piece(c->t, piece, len, c->out);
}

em_status tok_bpe_encode_ordinary(const em_tokenizer *t, const uint8_t *s, size_t n, em_tokens *out)
{
    if (!t->re) return em_set_error(EM_ERR_INVALID, "this BPE tokenizer has no pre-tokenizer");
    encode_ctx c = {t, out};
    return tok_pretokenize(t, s, n, encode_cb, &c) ? EM_OK : em_last_status();
}
