/* diag.c — diagnostics of the kernel language: the public list (em_lang_diags_*), the sink the
 * front end reports into (error limit, source line capture), the text format with a caret under
 * the column, and "did you mean" hints by edit distance. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/internal.h"

struct em_lang_diags {
    struct {
        em_lang_diag *items;
        size_t len, cap;
    } list;         /* kept diagnostics (strings owned) */
    size_t dropped; /* errors beyond the limit */
    bool stopped;   /* a call reached the limit and stopped */
};

em_lang_diags *em_lang_diags_new(void)
{
    em_lang_diags *d = calloc(1, sizeof(*d));
    if (!d) em_set_error(EM_ERR_NOMEM, "out of memory");
    return d;
}

static void diag_release(em_lang_diag *g)
{
    free((char *)g->file);
    free((char *)g->message);
    free((char *)g->hint);
    free((char *)g->src_line);
}

void em_lang_diags_clear(em_lang_diags *d)
{
    if (!d) return;
    for (size_t i = 0; i < d->list.len; i++) diag_release(&d->list.items[i]);
    d->list.len = 0;
    d->dropped = 0;
    d->stopped = false;
}

void em_lang_diags_free(em_lang_diags *d)
{
    if (!d) return;
    em_lang_diags_clear(d);
    free(d->list.items);
    free(d);
}

size_t em_lang_diags_count(const em_lang_diags *d)
{
    return d ? d->list.len : 0;
}
size_t em_lang_diags_dropped(const em_lang_diags *d)
{
    return d ? d->dropped : 0;
}

const em_lang_diag *em_lang_diags_at(const em_lang_diags *d, size_t i)
{
    return d && i < d->list.len ? &d->list.items[i] : NULL;
}

void em_lang_diags_move(em_lang_diags *to, em_lang_diags *from)
{
    if (!to || !from || to == from) return;
    for (size_t i = 0; i < from->list.len; i++) {
        if (!EM_VEC_PUSH(&to->list, from->list.items[i])) diag_release(&from->list.items[i]);
    }
    to->dropped += from->dropped;
    to->stopped |= from->stopped;
    from->list.len = 0;
    from->dropped = 0;
    from->stopped = false;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Copies line `line` (1-based) of text, without its newline. */
static char *copy_line(const char *text, size_t len, uint32_t line)
{
    if (!text) return NULL;
    size_t i = 0;
    for (uint32_t l = 1; l < line && i < len; i++)
        if (text[i] == '\n') l++;
    size_t j = i;
    while (j < len && text[j] != '\n' && text[j] != '\r') j++;
    char *out = malloc(j - i + 1);
    if (!out) return NULL;
    memcpy(out, text + i, j - i);
    out[j - i] = 0;
    return out;
}

static void push(lang_sink *s, const char *file, uint32_t line, uint32_t col, char *src_line,
                 const char *hint, const char *msg)
{
    if (!s || !s->diags) {
        free(src_line);
        return;
    }
    /* the same error at the same place (a helper inlined twice, an unrolled loop) is kept once */
    for (size_t i = 0; i < s->diags->list.len && line; i++) {
        const em_lang_diag *g = &s->diags->list.items[i];
        if (g->line == line && g->col == col && !strcmp(g->message, msg) && g->file && file &&
            !strcmp(g->file, file)) {
            s->errors++;
            free(src_line);
            return;
        }
    }
    s->errors++;
    if (s->errors >= EM_LANG_MAX_ERRORS) s->diags->stopped = true;
    if (s->errors > EM_LANG_MAX_ERRORS) {
        s->diags->dropped++;
        free(src_line);
        return;
    }
    em_lang_diag g = {dup_or_null(file), line, col, dup_or_null(msg), dup_or_null(hint), src_line};
    if (!g.message || !EM_VEC_PUSH(&s->diags->list, g)) diag_release(&g);
}

bool em_lang_error(lang_sink *s, lpos pos, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    em_lang_verror(s, pos, hint, fmt, ap);
    va_end(ap);
    return false;
}

bool em_lang_verror(lang_sink *s, lpos pos, const char *hint, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    const lang_file *f = s && pos.file < s->nfiles ? &s->files[pos.file] : NULL;
    push(s, f ? f->name : "<input>", pos.line, pos.col,
         f ? copy_line(f->text, f->len, pos.line) : NULL, hint, msg);
    return false;
}

void em_lang_error_nopos(lang_sink *s, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    push(s, NULL, 0, 0, NULL, NULL, msg);
}

bool em_lang_sink_full(const lang_sink *s)
{
    return s && s->errors >= EM_LANG_MAX_ERRORS;
}

char *em_lang_diags_format(const em_lang_diags *d)
{
    em_strbuf sb;
    em_sb_init(&sb);
    for (size_t i = 0; d && i < d->list.len; i++) {
        const em_lang_diag *g = &d->list.items[i];
        if (g->file && g->line)
            em_sb_printf(&sb, "%s:%u:%u: error: %s\n", g->file, g->line, g->col, g->message);
        else
            em_sb_printf(&sb, "error: %s\n", g->message);
        if (g->src_line && g->line) {
            em_sb_printf(&sb, "%s\n", g->src_line);
            /* keep tabs so that the caret lines up with the column in any tab width */
            size_t n = strlen(g->src_line);
            for (uint32_t c = 1; c < g->col; c++)
                em_sb_appendc(&sb, c - 1 < n && g->src_line[c - 1] == '\t' ? '\t' : ' ');
            em_sb_append(&sb, "^\n");
        }
        if (g->hint) em_sb_printf(&sb, "hint: %s\n", g->hint);
    }
    if (d && d->stopped)
        em_sb_printf(&sb, "error: too many errors; stopped after %d\n", EM_LANG_MAX_ERRORS);
    return em_sb_take(&sb);
}

/* ---- hints ------------------------------------------------------------------------------------
 */

/* Levenshtein distance, giving up (returning limit + 1) past `limit`. */
static unsigned edit_distance(const char *a, const char *b, unsigned limit)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return limit + 1;
    if ((la > lb ? la - lb : lb - la) > limit) return limit + 1;
    unsigned row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = (unsigned)j;
    for (size_t i = 1; i <= la; i++) {
        unsigned diag = row[0], best = row[0] = (unsigned)i;
        for (size_t j = 1; j <= lb; j++) {
            unsigned up = row[j];
            unsigned cost = a[i - 1] == b[j - 1] ? 0 : 1;
            unsigned v = diag + cost;
            if (up + 1 < v) v = up + 1;
            if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < best) best = v;
        }
        if (best > limit) return limit + 1;
    }
    return row[lb];
}

bool em_lang_nearest(const char *name, const char *const *cands, size_t n, char *out, size_t outsz)
{
    size_t len = strlen(name);
    unsigned limit = len <= 2 ? 1 : len <= 5 ? 2 : 3;
    unsigned best = limit + 1;
    const char *pick[3];
    size_t npick = 0;
    for (size_t i = 0; i < n; i++) {
        if (!cands[i] || !strcmp(cands[i], name)) continue;
        bool seen = false;
        for (size_t j = 0; j < npick; j++) seen |= !strcmp(pick[j], cands[i]);
        if (seen) continue;
        unsigned dist = edit_distance(name, cands[i], limit);
        if (dist > limit || dist > best) continue;
        if (dist < best) {
            best = dist;
            npick = 0;
        }
        if (npick < 3) pick[npick++] = cands[i];
    }
    if (!npick) return false;
    em_strbuf sb;
    em_sb_init(&sb);
    em_sb_append(&sb, "did you mean ");
    for (size_t i = 0; i < npick; i++) {
        if (i) em_sb_append(&sb, i + 1 == npick ? " or " : ", ");
        em_sb_printf(&sb, "'%s'", pick[i]);
    }
    em_sb_append(&sb, "?");
    snprintf(out, outsz, "%s", sb.data ? sb.data : "");
    em_sb_free(&sb);
    return true;
}
