/* char_tok.c — the character-level tokenizer: one id per Unicode code point of a fixed alphabet
 * (sorted, so the same text always gives the same ids), special tokens after it. The alphabet
 * comes from a corpus (em_tok_char_from_text) or a saved tokenizer (tok_io.c). A character outside
 * the alphabet is an error that names it, never a silent substitution. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tok_internal.h"

static size_t utf8_put(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

em_tokenizer *tok_char_from_codepoints(const uint32_t *cps, size_t n);
em_tokenizer *tok_char_from_codepoints(const uint32_t *cps, size_t n)
{
    em_tokenizer *t = tok_new(EM_TOK_CHAR);
    if (!t) return NULL;
    t->chars = malloc((n ? n : 1) * sizeof *t->chars);
    if (!t->chars) {
        em_tok_free(t);
        em_set_error(EM_ERR_NOMEM, "out of memory building a character tokenizer");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (cps[i] > 0x10ffff || (cps[i] >= 0xd800 && cps[i] <= 0xdfff)) {
            em_tok_free(t);
            em_set_error(EM_ERR_INVALID, "U+%04X is not a Unicode scalar value", cps[i]);
            return NULL;
        }
        uint8_t b[4];
        size_t k = utf8_put(cps[i], b);
        if (!tok_set(t, (uint32_t)i, b, k, false)) {
            em_tok_free(t);
            return NULL;
        }
        t->chars[i] = cps[i];
    }
    t->nchars = n;
    return t;
}

em_tokenizer *em_tok_char_from_text(const char *text, size_t len, const char *const *specials,
                                    size_t nspecials)
{
    const uint8_t *s = (const uint8_t *)text;
    uint8_t *seen_bmp = calloc(0x110000 / 8, 1);
    if (!seen_bmp) {
        em_set_error(EM_ERR_NOMEM, "out of memory building a character tokenizer");
        return NULL;
    }
    size_t i = 0, count = 0;
    while (i < len) {
        bool inc;
        uint32_t cp;
        size_t k = tok_utf8_char(s + i, len - i, &inc, &cp);
        if (!k) {
            free(seen_bmp);
            em_set_error(EM_ERR_INVALID,
                         "byte %zu: invalid UTF-8 (0x%02x); a character tokenizer "
                         "needs valid text",
                         i, s[i]);
            return NULL;
        }
        if (!(seen_bmp[cp >> 3] & (1u << (cp & 7)))) {
            seen_bmp[cp >> 3] |= (uint8_t)(1u << (cp & 7));
            count++;
        }
        i += k;
    }
    uint32_t *cps = malloc((count ? count : 1) * sizeof *cps);
    if (!cps) {
        free(seen_bmp);
        em_set_error(EM_ERR_NOMEM, "out of memory building a character tokenizer");
        return NULL;
    }
    size_t n = 0;
    for (uint32_t cp = 0; cp < 0x110000; cp++)
        if (seen_bmp[cp >> 3] & (1u << (cp & 7))) cps[n++] = cp;
    free(seen_bmp);
    em_tokenizer *t = tok_char_from_codepoints(cps, n);
    free(cps);
    for (size_t j = 0; t && j < nspecials; j++)
        if (em_tok_add_special(t, specials[j], -1) < 0) {
            em_tok_free(t);
            t = NULL;
        }
    return t;
}

em_status tok_char_encode_ordinary(const em_tokenizer *t, const uint8_t *s, size_t n,
                                   size_t base_offset, em_tokens *out)
{
    size_t i = 0;
    while (i < n) {
        bool inc;
        uint32_t cp;
        size_t k = tok_utf8_char(s + i, n - i, &inc, &cp);
        if (!k)
            return em_set_error(EM_ERR_INVALID,
                                "byte %zu: invalid UTF-8 (0x%02x) for a character "
                                "tokenizer",
                                base_offset + i, s[i]);
        size_t lo = 0, hi = t->nchars;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (t->chars[mid] < cp)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == t->nchars || t->chars[lo] != cp)
            return em_set_error(EM_ERR_INVALID,
                                "byte %zu: character U+%04X ('%.*s') is not in the "
                                "tokenizer's alphabet",
                                base_offset + i, cp, (int)k, (const char *)s + i);
        if (!tok_push(out, (uint32_t)lo)) return em_last_status();
        i += k;
    }
    return EM_OK;
}
