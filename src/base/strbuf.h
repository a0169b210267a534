/* strbuf.h — a growable NUL-terminated string builder, used by printers and code generators. */
#ifndef EM_BASE_STRBUF_H
#define EM_BASE_STRBUF_H
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct em_strbuf {
    char *data;   /* NUL-terminated contents (never NULL after init) */
    size_t len;   /* bytes used, excluding the NUL */
    size_t cap;   /* bytes allocated */
    bool oom;     /* set when a growth failed; later appends are ignored */
} em_strbuf;

void em_sb_init(em_strbuf *sb);
void em_sb_free(em_strbuf *sb);
void em_sb_clear(em_strbuf *sb);
void em_sb_append(em_strbuf *sb, const char *s);
void em_sb_appendn(em_strbuf *sb, const char *s, size_t n);
void em_sb_appendc(em_strbuf *sb, char c);
/* v in decimal, as "%lld" prints it, without printf's cost (hot cache keys). */
void em_sb_append_int(em_strbuf *sb, long long v);
void em_sb_printf(em_strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void em_sb_vprintf(em_strbuf *sb, const char *fmt, va_list ap);
/* Appends `n` spaces times 4 (indentation for generated code). */
void em_sb_indent(em_strbuf *sb, int level);
/* Hands the buffer to the caller (free() it) and resets sb to empty. NULL if oom was hit. */
char *em_sb_take(em_strbuf *sb);

#endif
