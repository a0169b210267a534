/* tokenizer.c — what every tokenizer shares: the id ↔ bytes tables, special tokens, encoding around
 * special tokens, decoding, the streaming UTF-8 decoder, and UTF-8 / base64 helpers. The BPE and
 * character tokenizers (bpe.c, char_tok.c) plug their ordinary-text encoders in here; loading and
 * saving is in tok_io.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tok_internal.h"

/* ---- tables ------------------------------------------------------------------------------------
 */

static uint64_t bytes_hash(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ (n * 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

em_tokenizer *tok_new(em_tok_kind kind)
{
    em_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        em_set_error(EM_ERR_NOMEM, "out of memory creating a tokenizer");
        return NULL;
    }
    t->kind = kind;
    for (int i = 0; i < 256; i++) t->byte_id[i] = TOK_NONE;
    return t;
}

static bool grow_ids(em_tokenizer *t, uint32_t need)
{
    if (need <= t->nids) return true;
    if (need > t->ids_cap) {
        /* grow the arrays geometrically; nids itself moves to exactly `need` */
        uint32_t cap = t->ids_cap ? t->ids_cap : 256;
        while (cap < need) cap = cap > UINT32_MAX / 2 ? need : cap * 2;
        uint64_t *off = realloc(t->off, (size_t)cap * sizeof *off);
        if (off) t->off = off;
        uint32_t *len = realloc(t->len, (size_t)cap * sizeof *len);
        if (len) t->len = len;
        uint8_t *sp = realloc(t->is_special, cap);
        if (sp) t->is_special = sp;
        if (!off || !len || !sp) {
            em_set_error(EM_ERR_NOMEM, "out of memory growing a vocabulary to %u ids", need);
            return false;
        }
        t->ids_cap = cap;
    }
    uint32_t n = need;
    for (uint32_t i = t->nids; i < n; i++) {
        t->off[i] = 0;
        t->len[i] = 0;
        t->is_special[i] = 0;
    }
    t->nids = n;
    return true;
}

static bool hash_insert(em_tokenizer *t, uint32_t id);

static bool hash_grow(em_tokenizer *t)
{
    size_t cap = t->hcap ? t->hcap * 2 : 1024;
    uint32_t *old = t->htab;
    size_t oldcap = t->hcap;
    t->htab = malloc(cap * sizeof *t->htab);
    if (!t->htab) {
        t->htab = old;
        em_set_error(EM_ERR_NOMEM, "out of memory growing a token table");
        return false;
    }
    memset(t->htab, 0xff, cap * sizeof *t->htab);
    t->hcap = cap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i] != TOK_NONE) hash_insert(t, old[i]);
    free(old);
    return true;
}

static bool hash_insert(em_tokenizer *t, uint32_t id)
{
    /* callers keep the table at most half full, so the probe always ends */
    size_t mask = t->hcap - 1;
    size_t h = (size_t)bytes_hash(t->pool + t->off[id], t->len[id]) & mask;
    while (t->htab[h] != TOK_NONE) h = (h + 1) & mask;
    t->htab[h] = id;
    return true;
}

uint32_t tok_lookup(const em_tokenizer *t, const uint8_t *s, size_t n)
{
    if (!t->hcap) return TOK_NONE;
    size_t mask = t->hcap - 1;
    size_t h = (size_t)bytes_hash(s, n) & mask;
    for (;;) {
        uint32_t id = t->htab[h];
        if (id == TOK_NONE) return TOK_NONE;
        if (t->len[id] == n && memcmp(t->pool + t->off[id], s, n) == 0) return id;
        h = (h + 1) & mask;
    }
}

bool tok_set(em_tokenizer *t, uint32_t id, const uint8_t *s, size_t n, bool special)
{
    if (id == TOK_NONE || n == 0 || n > UINT32_MAX)
        return em_set_error(EM_ERR_INVALID, "token id %u: bad id or empty token", id), false;
    if (!grow_ids(t, id + 1)) return false;
    if (t->len[id]) return em_set_error(EM_ERR_INVALID, "token id %u is defined twice", id), false;
    if (t->pool_len + n > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 4096;
        while (cap < t->pool_len + n) cap *= 2;
        uint8_t *p = realloc(t->pool, cap);
        if (!p) return em_set_error(EM_ERR_NOMEM, "out of memory storing tokens"), false;
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    t->off[id] = t->pool_len;
    t->len[id] = (uint32_t)n;
    t->pool_len += n;
    t->is_special[id] = special;
    if (special) return true;
    if (n == 1 && t->byte_id[s[0]] == TOK_NONE) t->byte_id[s[0]] = id;
    if (tok_lookup(t, s, n) != TOK_NONE)
        return true; /* the same bytes twice: the first (lower) id keeps the rank */
    if (2 * (t->hcount + 1) > t->hcap && !hash_grow(t)) return false;
    hash_insert(t, id);
    t->hcount++;
    return true;
}

void em_tok_free(em_tokenizer *t)
{
    if (!t) return;
    tok_bpe_free_regex(t);
    for (size_t i = 0; i < t->nspecials; i++) free(t->specials[i].text);
    free(t->specials);
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->is_special);
    free(t->htab);
    free(t->chars);
    free(t);
}

em_tok_kind em_tok_kind_of(const em_tokenizer *t)
{
    return t->kind;
}

uint32_t em_tok_vocab_size(const em_tokenizer *t)
{
    return t ? t->nids : 0;
}

const uint8_t *em_tok_token_bytes(const em_tokenizer *t, uint32_t id, size_t *len)
{
    if (!t || id >= t->nids || !t->len[id]) return NULL;
    if (len) *len = t->len[id];
    return t->pool + t->off[id];
}

int64_t em_tok_special_id(const em_tokenizer *t, const char *text)
{
    if (!t || !text) return -1;
    for (size_t i = 0; i < t->nspecials; i++)
        if (strcmp(t->specials[i].text, text) == 0) return t->specials[i].id;
    return -1;
}

int64_t em_tok_eot(const em_tokenizer *t)
{
    return em_tok_special_id(t, "<|endoftext|>");
}

int64_t em_tok_add_special(em_tokenizer *t, const char *text, int64_t id)
{
    if (!t || !text || !*text)
        return em_set_error(EM_ERR_INVALID, "a special token needs a non-empty text"), -1;
    if (em_tok_special_id(t, text) >= 0)
        return em_set_error(EM_ERR_INVALID, "special token '%s' already exists", text), -1;
    if (id < 0) id = t->nids;
    if (id >= (int64_t)TOK_NONE)
        return em_set_error(EM_ERR_INVALID, "special token id %lld is out of range", (long long)id),
               -1;
    if ((uint32_t)id < t->nids && t->len[id])
        return em_set_error(EM_ERR_INVALID, "special token '%s': id %lld is already taken", text,
                            (long long)id),
               -1;
    tok_special *sp = realloc(t->specials, (t->nspecials + 1) * sizeof *sp);
    if (!sp) return em_set_error(EM_ERR_NOMEM, "out of memory adding a special token"), -1;
    t->specials = sp;
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    if (!copy) return em_set_error(EM_ERR_NOMEM, "out of memory adding a special token"), -1;
    memcpy(copy, text, n + 1);
    if (!tok_set(t, (uint32_t)id, (const uint8_t *)text, n, true)) {
        free(copy);
        return -1;
    }
    sp[t->nspecials++] = (tok_special){copy, n, (uint32_t)id};
    return id;
}

em_status em_tok_add_chat_specials(em_tokenizer *t)
{
    static const char *const chat[] = {"<|im_start|>", "<|im_end|>"};
    for (size_t i = 0; i < 2; i++)
        if (em_tok_special_id(t, chat[i]) < 0 && em_tok_add_special(t, chat[i], -1) < 0)
            return em_last_status();
    return EM_OK;
}

/* ---- token arrays ------------------------------------------------------------------------------
 */

void em_tokens_free(em_tokens *t)
{
    if (!t) return;
    free(t->ids);
    t->ids = NULL;
    t->len = t->cap = 0;
}

bool tok_push(em_tokens *out, uint32_t id)
{
    if (out->len == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        uint32_t *ids = realloc(out->ids, cap * sizeof *ids);
        if (!ids) return em_set_error(EM_ERR_NOMEM, "out of memory storing %zu tokens", cap), false;
        out->ids = ids;
        out->cap = cap;
    }
    out->ids[out->len++] = id;
    return true;
}

/* ---- encode / decode ------------------------------------------------------------------------- */

static em_status encode_ordinary(const em_tokenizer *t, const uint8_t *s, size_t n, size_t base,
                                 em_tokens *out)
{
    if (n == 0) return EM_OK;
    if (t->kind == EM_TOK_BPE) return tok_bpe_encode_ordinary(t, s, n, out);
    return tok_char_encode_ordinary(t, s, n, base, out);
}

em_status em_tok_encode(const em_tokenizer *t, const char *text, size_t len, bool allow_special,
                        em_tokens *out)
{
    if (!t || !out || (!text && len))
        return em_set_error(EM_ERR_INVALID, "em_tok_encode: NULL argument");
    const uint8_t *s = (const uint8_t *)text;
    if (!allow_special || t->nspecials == 0) return encode_ordinary(t, s, len, 0, out);
    /* next[i]: offset of the next occurrence of special i at or after the cursor (len = none) */
    size_t stack_next[8];
    size_t *next = t->nspecials <= 8 ? stack_next : malloc(t->nspecials * sizeof *next);
    if (!next) return em_set_error(EM_ERR_NOMEM, "out of memory encoding");
    for (size_t i = 0; i < t->nspecials; i++) next[i] = SIZE_MAX;
    size_t pos = 0;
    em_status st = EM_OK;
    while (pos < len && st == EM_OK) {
        size_t best = len, best_i = 0;
        for (size_t i = 0; i < t->nspecials; i++) {
            if (next[i] == SIZE_MAX || (next[i] < pos && next[i] != len)) {
                const uint8_t *hit =
                    memmem(s + pos, len - pos, t->specials[i].text, t->specials[i].len);
                next[i] = hit ? (size_t)(hit - s) : len;
            }
            /* the earliest match wins; at one offset the longest special does */
            if (next[i] < best ||
                (next[i] == best && best < len && t->specials[i].len > t->specials[best_i].len)) {
                best = next[i];
                best_i = i;
            }
        }
        st = encode_ordinary(t, s + pos, best - pos, pos, out);
        if (st != EM_OK || best == len) break;
        if (!tok_push(out, t->specials[best_i].id)) st = em_last_status();
        pos = best + t->specials[best_i].len;
        for (size_t i = 0; i < t->nspecials; i++)
            if (next[i] != len && next[i] < pos) next[i] = SIZE_MAX;
    }
    if (next != stack_next) free(next);
    return st;
}

em_status em_tok_decode(const em_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                        size_t *out_len)
{
    if (!t || !out || (!ids && n))
        return em_set_error(EM_ERR_INVALID, "em_tok_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->nids || !t->len[ids[i]])
            return em_set_error(EM_ERR_INVALID,
                                "token %zu: id %u is not in the vocabulary (size %u)", i, ids[i],
                                t->nids);
        total += t->len[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "out of memory decoding %zu tokens", n);
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + p, t->pool + t->off[ids[i]], t->len[ids[i]]);
        p += t->len[ids[i]];
    }
    buf[p] = 0;
    *out = buf;
    if (out_len) *out_len = p;
    return EM_OK;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

size_t tok_utf8_char(const uint8_t *s, size_t n, bool *incomplete, uint32_t *cp)
{
    *incomplete = false;
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) {
        if (cp) *cp = c;
        return 1;
    }
    size_t need;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf)
        need = 2, v = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        need = 3, v = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        need = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *incomplete = true;
            return 0;
        }
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
        /* reject overlong forms, surrogates and > U+10FFFF as soon as the second byte shows them */
        if (i == 1) {
            if (need == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))) return 0;
            if (need == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))) return 0;
        }
    }
    if (v < min) return 0;
    if (cp) *cp = v;
    return need;
}

size_t tok_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        /* fast path: 8 ASCII bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        bool inc;
        size_t k = tok_utf8_char(s + i, n - i, &inc, NULL);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* ---- streaming decoder ------------------------------------------------------------------------
 */

void em_tok_stream_init(em_tok_stream *st, const em_tokenizer *t)
{
    st->tok = t;
    st->npending = 0;
}

static const char REPLACEMENT[3] = {(char)0xef, (char)0xbf, (char)0xbd};

/* Moves the complete characters of pending+bytes to out; keeps an incomplete tail. */
static long stream_emit(em_tok_stream *st, const uint8_t *b, size_t n, char *out, size_t cap,
                        bool final)
{
    size_t w = 0;
    size_t i = 0;
    /* work on pending bytes followed by the new ones, one byte at a time into pending */
    for (;;) {
        while (st->npending < sizeof st->pending && i < n) st->pending[st->npending++] = b[i++];
        if (st->npending == 0) break;
        bool inc;
        size_t k = tok_utf8_char(st->pending, st->npending, &inc, NULL);
        size_t drop;
        if (k) {
            if (w + k > cap)
                return em_set_error(EM_ERR_INVALID, "stream decoder: output buffer too small"), -1;
            memcpy(out + w, st->pending, k);
            w += k;
            drop = k;
        } else if (inc && !final && i == n) {
            break; /* wait for more bytes */
        } else {
            if (w + 3 > cap)
                return em_set_error(EM_ERR_INVALID, "stream decoder: output buffer too small"), -1;
            memcpy(out + w, REPLACEMENT, 3);
            w += 3;
            drop = inc ? st->npending : 1;
        }
        memmove(st->pending, st->pending + drop, st->npending - drop);
        st->npending -= drop;
    }
    return (long)w;
}

long em_tok_stream_feed(em_tok_stream *st, uint32_t id, char *out, size_t cap)
{
    const em_tokenizer *t = st->tok;
    if (!t || id >= t->nids || !t->len[id])
        return em_set_error(EM_ERR_INVALID, "stream decoder: id %u is not in the vocabulary", id),
               -1;
    return stream_emit(st, t->pool + t->off[id], t->len[id], out, cap, false);
}

long em_tok_stream_finish(em_tok_stream *st, char *out, size_t cap)
{
    return stream_emit(st, NULL, 0, out, cap, true);
}

/* ---- chunking ----------------------------------------------------------------------------------
 */

static bool ascii_space(uint8_t c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

static bool ascii_letter(uint8_t c)
{
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}

/* A cut at p is safe when the pre-token before p surely ends at p and the one after starts
 * there, whatever lies beyond: (1) "x\ny" with x, y ASCII, not spaces, y no apostrophe: "\n" is
 * a piece of its own; (2) "a b" with a, b ASCII letters: a letter run ends at the space and " b..."
 * starts a new piece. The piece at p depends only on the text from p on (the pattern has no
 * look-behind), and the one before it only looks one character ahead. */
size_t em_tok_safe_cut(const char *text, size_t len, size_t min)
{
    const uint8_t *s = (const uint8_t *)text;
    for (size_t p = min < 2 ? 2 : min; p + 1 < len; p++) {
        uint8_t a = s[p - 1], c = s[p];
        if (c == ' ' && ascii_letter(a) && ascii_letter(s[p + 1])) return p;
        if (a != '\n') continue;
        uint8_t z = s[p - 2];
        if (z < 0x80 && !ascii_space(z) && c < 0x80 && !ascii_space(c) && c != '\'') return p;
    }
    return len;
}

/* ---- base64 --------------------------------------------------------------------------------- */

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

long tok_b64_decode(const char *s, size_t n, uint8_t *out)
{
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    size_t w = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value(s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[w++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)w;
}

char *tok_b64_encode(const uint8_t *s, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1);
    if (!o) return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n) v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n) v |= s[i + 2];
        o[w++] = A[(v >> 18) & 63];
        o[w++] = A[(v >> 12) & 63];
        o[w++] = i + 1 < n ? A[(v >> 6) & 63] : '=';
        o[w++] = i + 2 < n ? A[v & 63] : '=';
    }
    o[w] = 0;
    return o;
}
