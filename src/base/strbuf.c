/* strbuf.c — the growable string builder. An empty builder points at a shared read-only "" (cap
 * 0) so that init cannot fail and `data` is never NULL; the first append allocates. A failed growth
 * sets `oom` and the error, and every later append is ignored until em_sb_take or em_sb_free. */
#include "base/strbuf.h"
#include "ember/base.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char empty_string[1]; /* never written: buffers with cap 0 point here */

void em_sb_init(em_strbuf *sb)
{
    sb->data = empty_string;
    sb->len = 0;
    sb->cap = 0;
    sb->oom = false;
}

void em_sb_free(em_strbuf *sb)
{
    if (sb->cap) free(sb->data);
    em_sb_init(sb);
}

void em_sb_clear(em_strbuf *sb)
{
    sb->len = 0;
    if (sb->cap) sb->data[0] = '\0';
}

/* Makes room for `extra` more bytes plus the NUL; false (oom set) when that fails. */
static bool reserve(em_strbuf *sb, size_t extra)
{
    if (sb->oom) return false;
    if (extra < sb->cap - sb->len) return true; /* cap 0 never passes: len is 0 then */
    if (extra > SIZE_MAX / 2 - sb->len) goto fail;
    size_t need = sb->len + extra + 1;
    size_t cap = sb->cap ? sb->cap : 64;
    while (cap < need) cap *= 2;
    char *data = realloc(sb->cap ? sb->data : NULL, cap);
    if (!data) goto fail;
    if (!sb->cap) data[0] = '\0';
    sb->data = data;
    sb->cap = cap;
    return true;
fail:
    sb->oom = true;
    em_set_error(EM_ERR_NOMEM, "string builder: out of memory growing past %zu bytes", sb->len);
    return false;
}

void em_sb_appendn(em_strbuf *sb, const char *s, size_t n)
{
    if (!reserve(sb, n)) return;
    memcpy(sb->data + sb->len, s, n);
    sb->len += n;
    sb->data[sb->len] = '\0';
}

void em_sb_append(em_strbuf *sb, const char *s)
{
    em_sb_appendn(sb, s, strlen(s));
}

void em_sb_appendc(em_strbuf *sb, char c)
{
    em_sb_appendn(sb, &c, 1);
}

void em_sb_append_int(em_strbuf *sb, long long v)
{
    char buf[24];
    char *p = buf + sizeof buf;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    em_sb_appendn(sb, p, (size_t)(buf + sizeof buf - p));
}

void em_sb_vprintf(em_strbuf *sb, const char *fmt, va_list ap)
{
    if (sb->oom) return;
    va_list copy;
    va_copy(copy, ap);
    size_t room = sb->cap ? sb->cap - sb->len : 0;
    int n = room ? vsnprintf(sb->data + sb->len, room, fmt, copy) : vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) {
        if (sb->cap) sb->data[sb->len] = '\0';
        return;
    }
    if ((size_t)n >= room) {
        if (!reserve(sb, (size_t)n)) return;
        vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
    }
    sb->len += (size_t)n;
}

void em_sb_printf(em_strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    em_sb_vprintf(sb, fmt, ap);
    va_end(ap);
}

void em_sb_indent(em_strbuf *sb, int level)
{
    if (level <= 0 || !reserve(sb, (size_t)level * 4)) return;
    memset(sb->data + sb->len, ' ', (size_t)level * 4);
    sb->len += (size_t)level * 4;
    sb->data[sb->len] = '\0';
}

char *em_sb_take(em_strbuf *sb)
{
    char *s = NULL;
    if (sb->oom) {
        em_set_error(EM_ERR_NOMEM, "string builder: out of memory");
    } else if (sb->cap) {
        s = sb->data;
        sb->cap = 0; /* ownership moves to the caller */
    } else {
        s = strdup("");
        if (!s) em_set_error(EM_ERR_NOMEM, "string builder: out of memory");
    }
    em_sb_free(sb);
    return s;
}
