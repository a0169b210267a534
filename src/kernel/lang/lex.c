/* lex.c — the kernel language's lexer: source bytes to tokens (identifiers, keywords, scalar type
 * names, integer/float/string literals, punctuation and operators), skipping white space and
 * comments. Every malformed character or literal gets a diagnostic and is skipped, so the parser
 * always receives a well-formed token stream ending in T_EOF. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/internal.h"

typedef struct lexer {
    const char *src;   /* file text */
    size_t len;        /* bytes */
    size_t i;          /* next byte */
    uint32_t line;     /* current line (1-based) */
    size_t line_start; /* offset of the current line's first byte */
    uint32_t file;     /* file index for positions */
    em_arena *arena;   /* strings */
    lang_sink *sink;   /* diagnostics */
} lexer;

static const struct {
    const char *text;
    tok_kind kind;
} keywords[] = {
    {"kernel", T_KERNEL},
    {"inline", T_INLINE},
    {"void", T_VOID},
    {"const", T_CONST},
    {"comptime", T_COMPTIME},
    {"shared", T_SHARED},
    {"if", T_IF},
    {"else", T_ELSE},
    {"for", T_FOR},
    {"in", T_IN},
    {"while", T_WHILE},
    {"break", T_BREAK},
    {"continue", T_CONTINUE},
    {"return", T_RETURN},
    {"true", T_TRUE},
    {"false", T_FALSE},
    {"auto", T_AUTO},
    {"line", T_LINE},
    {"tensor", T_TENSOR},
    {"array", T_ARRAY},
    {"matrix", T_MATRIX},
    {"bitcast", T_BITCAST},
    {"intrinsic", T_INTRINSIC},
    {"cube_dim", T_CUBE_DIM},
    {"cluster_dim", T_CLUSTER_DIM},
};

static const char *const tok_names[T_COUNT] = {
    [T_EOF] = "end of file",
    [T_IDENT] = "identifier",
    [T_INT] = "integer literal",
    [T_FLOAT] = "float literal",
    [T_STRING] = "string literal",
    [T_TYPE] = "type name",
    [T_LPAREN] = "'('",
    [T_RPAREN] = "')'",
    [T_LBRACE] = "'{'",
    [T_RBRACE] = "'}'",
    [T_LBRACKET] = "'['",
    [T_RBRACKET] = "']'",
    [T_COMMA] = "','",
    [T_SEMI] = "';'",
    [T_COLON] = "':'",
    [T_DOT] = "'.'",
    [T_QUESTION] = "'?'",
    [T_PLUS] = "'+'",
    [T_MINUS] = "'-'",
    [T_STAR] = "'*'",
    [T_SLASH] = "'/'",
    [T_PERCENT] = "'%'",
    [T_AMP] = "'&'",
    [T_PIPE] = "'|'",
    [T_CARET] = "'^'",
    [T_TILDE] = "'~'",
    [T_BANG] = "'!'",
    [T_LT] = "'<'",
    [T_GT] = "'>'",
    [T_LE] = "'<='",
    [T_GE] = "'>='",
    [T_EQEQ] = "'=='",
    [T_NE] = "'!='",
    [T_SHL] = "'<<'",
    [T_SHR] = "'>>'",
    [T_ANDAND] = "'&&'",
    [T_OROR] = "'||'",
    [T_ASSIGN] = "'='",
    [T_PLUSEQ] = "'+='",
    [T_MINUSEQ] = "'-='",
    [T_STAREQ] = "'*='",
    [T_SLASHEQ] = "'/='",
    [T_PERCENTEQ] = "'%='",
    [T_AMPEQ] = "'&='",
    [T_PIPEEQ] = "'|='",
    [T_CARETEQ] = "'^='",
    [T_SHLEQ] = "'<<='",
    [T_SHREQ] = "'>>='",
    [T_PLUSPLUS] = "'++'",
    [T_MINUSMINUS] = "'--'",
    [T_KERNEL] = "'kernel'",
    [T_INLINE] = "'inline'",
    [T_VOID] = "'void'",
    [T_CONST] = "'const'",
    [T_COMPTIME] = "'comptime'",
    [T_SHARED] = "'shared'",
    [T_IF] = "'if'",
    [T_ELSE] = "'else'",
    [T_FOR] = "'for'",
    [T_IN] = "'in'",
    [T_WHILE] = "'while'",
    [T_BREAK] = "'break'",
    [T_CONTINUE] = "'continue'",
    [T_RETURN] = "'return'",
    [T_TRUE] = "'true'",
    [T_FALSE] = "'false'",
    [T_AUTO] = "'auto'",
    [T_LINE] = "'line'",
    [T_TENSOR] = "'tensor'",
    [T_ARRAY] = "'array'",
    [T_MATRIX] = "'matrix'",
    [T_BITCAST] = "'bitcast'",
    [T_INTRINSIC] = "'intrinsic'",
    [T_CUBE_DIM] = "'cube_dim'",
    [T_CLUSTER_DIM] = "'cluster_dim'",
};

const char *em_lang_tok_name(tok_kind k)
{
    return k < T_COUNT && tok_names[k] ? tok_names[k] : "token";
}

static lpos here(const lexer *L)
{
    return (lpos){L->file, L->line, (uint32_t)(L->i - L->line_start + 1)};
}

static lpos at(const lexer *L, size_t offset)
{
    return (lpos){L->file, L->line, (uint32_t)(offset - L->line_start + 1)};
}

static int peekc(const lexer *L, size_t ahead)
{
    return L->i + ahead < L->len ? (unsigned char)L->src[L->i + ahead] : 0;
}

static void newline(lexer *L)
{
    L->line++;
    L->line_start = L->i;
}

/* Skips spaces and comments; reports an unterminated block comment. */
static void skip_space(lexer *L)
{
    for (;;) {
        int c = peekc(L, 0);
        if (c == '\n') {
            L->i++;
            newline(L);
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
            L->i++;
        } else if (c == '/' && peekc(L, 1) == '/') {
            while (L->i < L->len && L->src[L->i] != '\n') L->i++;
        } else if (c == '/' && peekc(L, 1) == '*') {
            lpos start = here(L);
            L->i += 2;
            bool closed = false;
            while (L->i < L->len) {
                if (L->src[L->i] == '*' && peekc(L, 1) == '/') {
                    L->i += 2;
                    closed = true;
                    break;
                }
                if (L->src[L->i++] == '\n') newline(L);
            }
            if (!closed) em_lang_error(L->sink, start, NULL, "unterminated comment");
        } else {
            return;
        }
    }
}

static bool is_ident_start(int c)
{
    return isalpha(c) || c == '_';
}
static bool is_ident_char(int c)
{
    return isalnum(c) || c == '_';
}

static void lex_ident(lexer *L, token *t)
{
    size_t start = L->i;
    while (is_ident_char(peekc(L, 0))) L->i++;
    t->text = L->src + start;
    t->len = (uint32_t)(L->i - start);
    t->str = em_arena_strndup(L->arena, t->text, t->len);
    t->kind = T_IDENT;
    for (size_t k = 0; k < EM_ARRAY_LEN(keywords); k++) {
        if (strlen(keywords[k].text) == t->len && !memcmp(keywords[k].text, t->text, t->len)) {
            t->kind = (uint16_t)keywords[k].kind;
            return;
        }
    }
    if (t->str) {
        em_scalar s = em_scalar_parse(t->str);
        if (s < EM_SCALAR_COUNT) {
            t->kind = T_TYPE;
            t->scalar = (uint8_t)s;
        }
    }
}

/* Integer literals: decimal, 0x hex, 0b binary; without a suffix they are untyped (they take
 * their type from where they are used), with u/U they are u32. Float literals: digits with '.',
 * an exponent, and an optional f/F suffix that is accepted for C habits and changes nothing. */
static void lex_number(lexer *L, token *t)
{
    size_t start = L->i;
    bool is_float = false;
    int base = 10;
    if (peekc(L, 0) == '0' && (peekc(L, 1) == 'x' || peekc(L, 1) == 'X')) {
        base = 16;
        L->i += 2;
        while (isxdigit(peekc(L, 0)) || peekc(L, 0) == '_') L->i++;
    } else if (peekc(L, 0) == '0' && (peekc(L, 1) == 'b' || peekc(L, 1) == 'B')) {
        base = 2;
        L->i += 2;
        while (peekc(L, 0) == '0' || peekc(L, 0) == '1' || peekc(L, 0) == '_') L->i++;
    } else {
        while (isdigit(peekc(L, 0))) L->i++;
        if (peekc(L, 0) == '.' && isdigit(peekc(L, 1))) {
            is_float = true;
            L->i++;
            while (isdigit(peekc(L, 0))) L->i++;
        } else if (peekc(L, 0) == '.' && !is_ident_start(peekc(L, 1)) && peekc(L, 1) != '.') {
            is_float = true; /* "1." */
            L->i++;
        }
        if ((peekc(L, 0) == 'e' || peekc(L, 0) == 'E') &&
            (isdigit(peekc(L, 1)) ||
             ((peekc(L, 1) == '+' || peekc(L, 1) == '-') && isdigit(peekc(L, 2))))) {
            is_float = true;
            L->i += 2;
            while (isdigit(peekc(L, 0))) L->i++;
        }
    }
    size_t end = L->i;
    t->pos = at(L, start);
    t->text = L->src + start;
    t->len = (uint32_t)(end - start);
    char buf[128];
    size_t n = 0;
    for (size_t j = start; j < end && n + 1 < sizeof(buf); j++)
        if (L->src[j] != '_') buf[n++] = L->src[j];
    buf[n] = 0;
    bool bad_suffix = false;
    if (is_float) {
        if (peekc(L, 0) == 'f' || peekc(L, 0) == 'F') L->i++;
    } else if (peekc(L, 0) == 'u' || peekc(L, 0) == 'U') {
        L->i++;
        t->is_unsigned = true;
    } else if ((peekc(L, 0) == 'f' || peekc(L, 0) == 'F') && base == 10) {
        L->i++; /* "1f": an integer written as a float */
        is_float = true;
    }
    if (is_ident_char(peekc(L, 0))) {
        bad_suffix = true;
        while (is_ident_char(peekc(L, 0))) L->i++;
    }
    if (bad_suffix) {
        em_lang_error(L->sink, t->pos, NULL, "invalid suffix on number '%.*s'", (int)(L->i - start),
                      L->src + start);
        t->kind = T_INT;
        t->ival = 0;
        return;
    }
    if (end - start >= sizeof(buf) - 1) {
        em_lang_error(L->sink, t->pos, NULL, "number literal too long");
        t->kind = T_INT;
        return;
    }
    if (is_float) {
        t->kind = T_FLOAT;
        t->fval = strtod(buf, NULL);
        if (isinf(t->fval)) em_lang_error(L->sink, t->pos, NULL, "float literal out of range");
        return;
    }
    t->kind = T_INT;
    const char *digits = base == 10 ? buf : buf + 2;
    if (!*digits) {
        em_lang_error(L->sink, t->pos, NULL, "number '%s' has no digits", buf);
        return;
    }
    errno = 0;
    unsigned long long v = strtoull(digits, NULL, base);
    if (errno == ERANGE || v > (unsigned long long)INT64_MAX) {
        em_lang_error(L->sink, t->pos, NULL,
                      "integer literal '%s' is too large (the limit is %lld)", buf,
                      (long long)INT64_MAX);
        v = 0;
    }
    t->ival = (int64_t)v;
}

static void lex_string(lexer *L, token *t)
{
    size_t start = L->i++;
    em_strbuf sb;
    em_sb_init(&sb);
    bool closed = false;
    while (L->i < L->len && L->src[L->i] != '\n') {
        char c = L->src[L->i++];
        if (c == '"') {
            closed = true;
            break;
        }
        if (c == '\\' && L->i < L->len) {
            char e = L->src[L->i++];
            switch (e) {
            case 'n':
                c = '\n';
                break;
            case 't':
                c = '\t';
                break;
            case '\\':
                c = '\\';
                break;
            case '"':
                c = '"';
                break;
            case '0':
                c = 0;
                break;
            default:
                em_lang_error(L->sink, at(L, L->i - 2), NULL, "unknown escape sequence '\\%c'",
                              isprint((unsigned char)e) ? e : '?');
                c = e;
            }
            if (!c) {
                em_lang_error(L->sink, at(L, L->i - 2), NULL, "strings cannot contain NUL");
                continue;
            }
        }
        em_sb_appendc(&sb, c);
    }
    t->kind = T_STRING;
    t->text = L->src + start;
    t->len = (uint32_t)(L->i - start);
    if (!closed) em_lang_error(L->sink, t->pos, NULL, "unterminated string literal");
    t->str = em_arena_strdup(L->arena, sb.data ? sb.data : "");
    em_sb_free(&sb);
}

/* Operators, longest first. */
static const struct {
    const char *text;
    tok_kind kind;
} ops[] = {
    {"<<=", T_SHLEQ},  {">>=", T_SHREQ},  {"<=", T_LE},        {">=", T_GE},
    {"==", T_EQEQ},    {"!=", T_NE},      {"<<", T_SHL},       {">>", T_SHR},
    {"&&", T_ANDAND},  {"||", T_OROR},    {"+=", T_PLUSEQ},    {"-=", T_MINUSEQ},
    {"*=", T_STAREQ},  {"/=", T_SLASHEQ}, {"%=", T_PERCENTEQ}, {"&=", T_AMPEQ},
    {"|=", T_PIPEEQ},  {"^=", T_CARETEQ}, {"++", T_PLUSPLUS},  {"--", T_MINUSMINUS},
    {"(", T_LPAREN},   {")", T_RPAREN},   {"{", T_LBRACE},     {"}", T_RBRACE},
    {"[", T_LBRACKET}, {"]", T_RBRACKET}, {",", T_COMMA},      {";", T_SEMI},
    {":", T_COLON},    {".", T_DOT},      {"?", T_QUESTION},   {"+", T_PLUS},
    {"-", T_MINUS},    {"*", T_STAR},     {"/", T_SLASH},      {"%", T_PERCENT},
    {"&", T_AMP},      {"|", T_PIPE},     {"^", T_CARET},      {"~", T_TILDE},
    {"!", T_BANG},     {"<", T_LT},       {">", T_GT},         {"=", T_ASSIGN},
};

bool em_lang_lex(const lang_file *f, uint32_t file, em_arena *arena, lang_sink *sink,
                 token_vec *out)
{
    lexer L = {f->text, f->len, 0, 1, 0, file, arena, sink};
    for (;;) {
        skip_space(&L);
        token t = {0};
        t.pos = here(&L);
        if (L.i >= L.len) {
            t.kind = T_EOF;
            return EM_VEC_PUSH(out, t);
        }
        int c = peekc(&L, 0);
        if (is_ident_start(c)) {
            lex_ident(&L, &t);
        } else if (isdigit(c) || (c == '.' && isdigit(peekc(&L, 1)))) {
            lex_number(&L, &t);
        } else if (c == '"') {
            lex_string(&L, &t);
        } else {
            size_t k = 0;
            for (; k < EM_ARRAY_LEN(ops); k++) {
                size_t n = strlen(ops[k].text);
                if (L.i + n <= L.len && !memcmp(L.src + L.i, ops[k].text, n)) break;
            }
            if (k == EM_ARRAY_LEN(ops)) {
                if (c == 0)
                    em_lang_error(sink, t.pos, NULL, "unexpected NUL byte in source");
                else if (isprint(c))
                    em_lang_error(sink, t.pos, NULL, "unexpected character '%c'", c);
                else
                    em_lang_error(sink, t.pos, NULL, "unexpected byte 0x%02x", (unsigned)c);
                L.i++;
                if (em_lang_sink_full(sink)) {
                    t.kind = T_EOF;
                    return EM_VEC_PUSH(out, t);
                }
                continue;
            }
            t.kind = (uint16_t)ops[k].kind;
            t.text = L.src + L.i;
            t.len = (uint32_t)strlen(ops[k].text);
            L.i += t.len;
        }
        if (!EM_VEC_PUSH(out, t)) return false;
    }
}
