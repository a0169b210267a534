/* template.c — the chat template, the same as `ember chat` writes (tools/ember/chat.c), so a model
 * answers the API as it answers in the terminal:
 *   ChatML (the tokenizer has <|im_start|> and <|im_end|>): "<|im_start|>ROLE\nTEXT<|im_end|>\n"
 *     per message, then "<|im_start|>assistant\n"; the reply ends at <|im_end|>.
 *   plain: a system message as "TEXT\n", "User: TEXT\n", "Assistant:TEXT\n", then "Assistant:";
 *     the reply ends before "\nUser:".
 *   bare (a character tokenizer that cannot spell "User:"): each message as "TEXT\n"; the reply
 *     ends at the next newline.
 * Only the template's own markers are special tokens: the messages' text is encoded as plain text,
 * so a user cannot forge a turn. Characters outside a character tokenizer's alphabet are left
 * out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

static bool encodable(const em_tokenizer *tok, const char *text)
{
    em_tokens t = {0};
    bool ok = em_tok_encode(tok, text, strlen(text), false, &t) == EM_OK;
    em_tokens_free(&t);
    em_clear_error();
    return ok;
}

void serve_template_init(serve_template *t, const em_tokenizer *tok)
{
    int64_t ims = em_tok_special_id(tok, "<|im_start|>");
    t->im_end = em_tok_special_id(tok, "<|im_end|>");
    if (ims >= 0 && t->im_end >= 0)
        t->kind = SERVE_TPL_CHATML;
    else
        t->kind = encodable(tok, "User: \nAssistant:") ? SERVE_TPL_PLAIN : SERVE_TPL_BARE;
    if (t->kind != SERVE_TPL_CHATML) t->im_end = -1;
}

const char *serve_template_name(const serve_template *t)
{
    return t->kind == SERVE_TPL_CHATML ? "chatml" : t->kind == SERVE_TPL_PLAIN ? "plain" : "bare";
}

const char *const *serve_template_stops(const serve_template *t, int *n)
{
    static const char *const chatml[] = {"<|im_end|>", "<|endoftext|>"};
    static const char *const plain[] = {"\nUser:", "<|endoftext|>"};
    static const char *const bare[] = {"\n", "<|endoftext|>"};
    *n = 2;
    return t->kind == SERVE_TPL_CHATML ? chatml : t->kind == SERVE_TPL_PLAIN ? plain : bare;
}

/* A growable id list. */
typedef struct ids {
    int64_t *v;
    int64_t n, cap;
} ids;

static bool push(ids *a, const em_tokens *t)
{
    if (a->n + (int64_t)t->len > a->cap) {
        int64_t cap = (a->n + (int64_t)t->len) * 2 + 64;
        int64_t *nv = realloc(a->v, (size_t)cap * sizeof *nv);
        if (!nv) return false;
        a->v = nv;
        a->cap = cap;
    }
    for (size_t i = 0; i < t->len; i++) a->v[a->n++] = t->ids[i];
    return true;
}

/* Appends text's ids; characters that cannot be encoded are skipped one by one (a character
 * tokenizer knows only its alphabet). False on no memory. */
static bool append(ids *a, const em_tokenizer *tok, const char *text, bool special)
{
    em_tokens t = {0};
    if (em_tok_encode(tok, text, strlen(text), special, &t) == EM_OK) {
        bool ok = push(a, &t);
        em_tokens_free(&t);
        return ok;
    }
    em_tokens_free(&t);
    em_clear_error();
    for (const char *p = text; *p;) {
        size_t n = 1;
        while (n < 4 && ((unsigned char)p[n] & 0xC0) == 0x80) n++;
        em_tokens c = {0};
        bool ok = em_tok_encode(tok, p, n, special, &c) != EM_OK || push(a, &c);
        em_tokens_free(&c);
        em_clear_error();
        if (!ok) return false;
        p += n;
    }
    return true;
}

/* One message in the template. */
static bool message(ids *a, const serve_template *t, const em_tokenizer *tok, const serve_msg *m)
{
    bool sys = strcmp(m->role, "system") == 0, user = strcmp(m->role, "user") == 0;
    switch (t->kind) {
    case SERVE_TPL_CHATML: {
        char open[48];
        snprintf(open, sizeof open, "<|im_start|>%s\n",
                 sys    ? "system"
                 : user ? "user"
                        : "assistant");
        return append(a, tok, open, true) && append(a, tok, m->content, false) &&
               append(a, tok, "<|im_end|>\n", true);
    }
    case SERVE_TPL_PLAIN:
        return (sys || append(a, tok, user ? "User: " : "Assistant:", false)) &&
               append(a, tok, m->content, false) && append(a, tok, "\n", false);
    default:
        return append(a, tok, m->content, false) && append(a, tok, "\n", false);
    }
}

static bool cue(ids *a, const serve_template *t, const em_tokenizer *tok)
{
    if (t->kind == SERVE_TPL_CHATML) return append(a, tok, "<|im_start|>assistant\n", true);
    if (t->kind == SERVE_TPL_PLAIN) return append(a, tok, "Assistant:", false);
    return true;
}

em_status serve_template_encode(const serve_template *t, const em_tokenizer *tok,
                                const serve_msg *msgs, int n, int64_t ctx, int64_t room,
                                int64_t **out, int64_t *nout)
{
    *out = NULL;
    *nout = 0;
    ids *part = calloc((size_t)n + 1, sizeof *part); /* each message, then the cue */
    bool *keep = calloc((size_t)n + 1, sizeof *keep);
    bool ok = part && keep;
    int64_t total = 0;
    for (int i = 0; ok && i < n; i++) {
        ok = message(&part[i], t, tok, &msgs[i]);
        keep[i] = true;
        total += part[i].n;
    }
    ok = ok && cue(&part[n], t, tok);
    if (ok) {
        total += part[n].n;
        /* Drop the oldest messages other than system ones (never the last) until it fits. */
        for (int i = 0; i < n - 1 && total + room > ctx; i++) {
            if (strcmp(msgs[i].role, "system") == 0) continue;
            keep[i] = false;
            total -= part[i].n;
        }
        ids all = {0};
        all.v = malloc((size_t)(total > 0 ? total : 1) * sizeof *all.v);
        ok = all.v != NULL;
        for (int i = 0; ok && i <= n; i++) {
            if ((i < n && !keep[i]) || part[i].n == 0) continue;
            memcpy(all.v + all.n, part[i].v, (size_t)part[i].n * sizeof *all.v);
            all.n += part[i].n;
        }
        if (ok) *out = all.v, *nout = all.n;
    }
    for (int i = 0; part && i <= n; i++) free(part[i].v);
    free(part);
    free(keep);
    return ok ? EM_OK : em_set_error(EM_ERR_NOMEM, "chat template: out of memory");
}
