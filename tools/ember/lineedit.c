/* lineedit.c — a small line editor over a raw-mode terminal (termios + ANSI escapes) with a
 * history, for `ember chat` (lineedit.h). Positions move by UTF-8 character; each character is
 * taken to be one column wide. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "lineedit.h"

typedef struct line {
    char *buf;       /* contents, NUL-terminated */
    size_t len, cap; /* bytes used and allocated */
    size_t pos;      /* cursor (byte offset, on a character boundary) */
} line;

static bool cont(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

static size_t columns(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += !cont((unsigned char)s[i]);
    return c;
}

static void out(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, s, n);
        if (w <= 0) return;
        s += w, n -= (size_t)w;
    }
}

static void refresh(const char *prompt, const line *l)
{
    char esc[32];
    out("\r", 1);
    out(prompt, strlen(prompt));
    out(l->buf, l->len);
    out("\x1b[K", 3);
    size_t back = columns(l->buf + l->pos, l->len - l->pos);
    if (back) {
        int n = snprintf(esc, sizeof esc, "\x1b[%zuD", back);
        out(esc, (size_t)n);
    }
}

static bool set(line *l, const char *s)
{
    size_t n = strlen(s);
    if (n + 1 > l->cap) {
        char *b = realloc(l->buf, n + 64);
        if (!b) return false;
        l->buf = b, l->cap = n + 64;
    }
    memcpy(l->buf, s, n + 1);
    l->len = l->pos = n;
    return true;
}

static bool insert(line *l, const char *s, size_t n)
{
    if (l->len + n + 1 > l->cap) {
        size_t cap = (l->len + n + 1) * 2;
        char *b = realloc(l->buf, cap);
        if (!b) return false;
        l->buf = b, l->cap = cap;
    }
    memmove(l->buf + l->pos + n, l->buf + l->pos, l->len - l->pos + 1);
    memcpy(l->buf + l->pos, s, n);
    l->len += n, l->pos += n;
    return true;
}

static void erase_range(line *l, size_t from, size_t to)
{
    memmove(l->buf + from, l->buf + to, l->len - to + 1);
    l->len -= to - from;
    l->pos = from;
}

static size_t prev_char(const line *l, size_t p)
{
    while (p > 0 && cont((unsigned char)l->buf[--p])) {
    }
    return p;
}

static size_t next_char(const line *l, size_t p)
{
    if (p < l->len) p++;
    while (p < l->len && cont((unsigned char)l->buf[p])) p++;
    return p;
}

static void add_history(le_history *h, const char *s)
{
    if (!*s || (h->n && strcmp(h->lines[h->n - 1], s) == 0)) return;
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 32;
        char **nl = realloc(h->lines, cap * sizeof *nl);
        if (!nl) return;
        h->lines = nl, h->cap = cap;
    }
    char *c = strdup(s);
    if (c) h->lines[h->n++] = c;
}

static char *plain_readline(const char *prompt)
{
    fputs(prompt, stdout);
    fflush(stdout);
    char *s = NULL;
    size_t cap = 0;
    ssize_t n = getline(&s, &cap, stdin);
    if (n < 0) {
        free(s);
        return NULL;
    }
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

char *le_readline(const char *prompt, le_history *h)
{
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) return plain_readline(prompt);
    struct termios old, raw;
    if (tcgetattr(STDIN_FILENO, &old) != 0) return plain_readline(prompt);
    raw = old;
    raw.c_lflag &= ~(tcflag_t)(ECHO | ICANON | ISIG | IEXTEN);
    raw.c_iflag &= ~(tcflag_t)(IXON | ICRNL);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    fflush(stdout);
    if (tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) != 0) return plain_readline(prompt);
    line l = {0};
    set(&l, "");
    size_t hi = h ? h->n : 0; /* history index; n = the line being edited */
    char *saved = NULL;       /* the line being edited while browsing the history */
    bool eof = false, done = false;
    refresh(prompt, &l);
    while (!done) {
        unsigned char c;
        if (read(STDIN_FILENO, &c, 1) != 1) {
            eof = true;
            break;
        }
        if (c == '\r' || c == '\n') {
            done = true;
        } else if (c == 4) { /* Ctrl-D */
            if (l.len == 0)
                eof = done = true;
            else if (l.pos < l.len)
                erase_range(&l, l.pos, next_char(&l, l.pos));
        } else if (c == 3) { /* Ctrl-C: drop the line */
            set(&l, "");
            out("^C\r\n", 4);
        } else if (c == 127 || c == 8) {
            if (l.pos > 0) erase_range(&l, prev_char(&l, l.pos), l.pos);
        } else if (c == 1) {
            l.pos = 0;
        } else if (c == 5) {
            l.pos = l.len;
        } else if (c == 21) { /* Ctrl-U */
            erase_range(&l, 0, l.pos);
        } else if (c == 11) { /* Ctrl-K */
            l.buf[l.pos] = 0, l.len = l.pos;
        } else if (c == 23) { /* Ctrl-W: the word before the cursor */
            size_t p = l.pos;
            while (p > 0 && l.buf[p - 1] == ' ') p--;
            while (p > 0 && l.buf[p - 1] != ' ') p--;
            erase_range(&l, p, l.pos);
        } else if (c == 27) { /* escape sequences: arrows, Home, End, Delete */
            unsigned char s[3] = {0};
            if (read(STDIN_FILENO, &s[0], 1) != 1 || read(STDIN_FILENO, &s[1], 1) != 1) continue;
            if (s[0] == '[' && s[1] >= '0' && s[1] <= '9') {
                if (read(STDIN_FILENO, &s[2], 1) != 1) continue;
                if (s[2] == '~' && s[1] == '3' && l.pos < l.len)
                    erase_range(&l, l.pos, next_char(&l, l.pos));
                if (s[2] == '~' && (s[1] == '1' || s[1] == '7')) l.pos = 0;
                if (s[2] == '~' && (s[1] == '4' || s[1] == '8')) l.pos = l.len;
            } else if (s[0] == '[' || s[0] == 'O') {
                if (s[1] == 'D') l.pos = prev_char(&l, l.pos);
                if (s[1] == 'C') l.pos = next_char(&l, l.pos);
                if (s[1] == 'H') l.pos = 0;
                if (s[1] == 'F') l.pos = l.len;
                if ((s[1] == 'A' && hi > 0) || (s[1] == 'B' && h && hi < h->n)) {
                    if (hi == h->n) {
                        free(saved);
                        saved = strdup(l.buf);
                    }
                    hi += s[1] == 'A' ? (size_t)-1 : 1;
                    set(&l, hi < h->n ? h->lines[hi] : (saved ? saved : ""));
                }
            }
        } else if (c >= 32) {
            insert(&l, (const char *)&c, 1);
        }
        refresh(prompt, &l);
    }
    tcsetattr(STDIN_FILENO, TCSADRAIN, &old);
    out("\r\n", 2);
    free(saved);
    if (eof && l.len == 0) {
        free(l.buf);
        return NULL;
    }
    if (h) add_history(h, l.buf);
    return l.buf;
}

void le_history_free(le_history *h)
{
    for (size_t i = 0; i < h->n; i++) free(h->lines[i]);
    free(h->lines);
    memset(h, 0, sizeof *h);
}
