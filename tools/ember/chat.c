/* chat.c — `ember chat`: a terminal conversation with a model. Each turn is added to a transcript
 * in a chat template — ChatML (<|im_start|>user ... <|im_end|>) when the tokenizer has those
 * tokens (`ember data prepare --chat`), else a plain one ("User: ...\nAssistant: ...") that a
 * model trained on plain text can follow — and the reply is generated from the whole transcript
 * and streamed as it comes. The oldest turns are dropped when the transcript no longer fits the
 * context window with room for a reply. /reset starts over, /quit (or end of input) leaves. Lines
 * are read with editing and a history of earlier lines (lineedit.h). A
 * character-level model whose alphabet cannot spell "User:" gets the bare template: the user's
 * line, then the reply up to the next newline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gen_common.h"
#include "lineedit.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ember chat --checkpoint PATH [--max-tokens N] [--temperature T] [--top-k K]\n"
        "                  [--top-p P] [--repetition-penalty R] [--seed S] [--system TEXT]\n"
        "                  [--tokenizer T] [--device D]\n\n"
        "Talks with a model in the terminal: type a message and press enter; the reply streams\n"
        "back. Commands: /reset (forget the conversation), /quit (or Ctrl-D), /help.\n"
        "  --max-tokens N   longest reply in tokens (default 200)\n"
        "  --temperature T  default 0.8; --top-k default 40; --top-p default 0.95\n"
        "  --system TEXT    a first line of instructions kept at the top of the transcript\n"
        "The template is ChatML when the tokenizer has <|im_start|>/<|im_end|>, else\n"
        "\"User: ...\\nAssistant: ...\".\n");
}

typedef struct chat {
    em_gpt *g;
    em_tokenizer *tok;
    bool chatml;    /* ChatML template */
    bool bare;      /* the tokenizer cannot spell "User:": lines alternate, nothing else */
    int64_t im_end; /* its end token, or -1 */
    int64_t *ids;   /* the transcript */
    size_t n, cap;
    size_t *turns; /* start offset of each turn in ids */
    size_t nturns, capturns;
    size_t keep; /* tokens at the front never dropped (the system line) */
} chat;

static bool append_text(chat *c, const char *text, bool special)
{
    em_tokens t = {0};
    if (em_tok_encode(c->tok, text, strlen(text), special, &t) != EM_OK) {
        em_tokens_free(&t);
        return false;
    }
    if (c->n + t.len > c->cap) {
        size_t cap = (c->n + t.len) * 2 + 64;
        int64_t *ni = realloc(c->ids, cap * sizeof *ni);
        if (!ni) {
            em_tokens_free(&t);
            return false;
        }
        c->ids = ni;
        c->cap = cap;
    }
    for (size_t i = 0; i < t.len; i++) c->ids[c->n++] = t.ids[i];
    em_tokens_free(&t);
    return true;
}

/* As append_text, dropping characters the tokenizer cannot encode (a character tokenizer knows
 * only its training text's alphabet). */
static bool append_lenient(chat *c, const char *text)
{
    if (append_text(c, text, false)) return true;
    bool dropped = false;
    for (const char *p = text; *p;) {
        size_t n = 1;
        while (((unsigned char)p[n] & 0xC0) == 0x80) n++;
        char ch[8] = {0};
        memcpy(ch, p, n < 7 ? n : 7);
        if (!append_text(c, ch, false)) dropped = true;
        p += n;
    }
    if (dropped) fprintf(stderr, "(characters the model does not know were left out)\n");
    return true;
}

static bool encodable(const em_tokenizer *tok, const char *text)
{
    em_tokens t = {0};
    bool ok = em_tok_encode(tok, text, strlen(text), false, &t) == EM_OK;
    em_tokens_free(&t);
    em_clear_error();
    return ok;
}

static bool begin_turn(chat *c)
{
    if (c->nturns == c->capturns) {
        size_t cap = c->capturns * 2 + 8;
        size_t *nt = realloc(c->turns, cap * sizeof *nt);
        if (!nt) return false;
        c->turns = nt;
        c->capturns = cap;
    }
    c->turns[c->nturns++] = c->n;
    return true;
}

/* Drops the oldest turns (after the kept front) until `room` more tokens fit the context. */
static void fit(chat *c, int64_t room)
{
    int64_t ctx = em_gpt_config_of(c->g)->block_size;
    while ((int64_t)c->n + room > ctx && c->nturns > 1) {
        size_t from = c->turns[0], to = c->turns[1], cut = to - from;
        memmove(c->ids + from, c->ids + to, (c->n - to) * sizeof *c->ids);
        c->n -= cut;
        memmove(c->turns, c->turns + 1, (c->nturns - 1) * sizeof *c->turns);
        c->nturns--;
        for (size_t i = 0; i < c->nturns; i++) c->turns[i] -= cut;
    }
    /* One turn longer than the window: keep its end (generation also keeps the last block). */
}

int em_cli_chat(int argc, char **argv)
{
    const char *ckpt = NULL, *tokenizer = NULL, *device = NULL, *system = NULL;
    int64_t max_tokens = 200, top_k = 40;
    double temperature = 0.8, top_p = 0.95, rep = 1.0;
    uint64_t seed = 1337;
    const gc_opt opts[] = {
        {"--checkpoint", GC_STR, &ckpt},
        {"--max-tokens", GC_I64, &max_tokens},
        {"--temperature", GC_DBL, &temperature},
        {"--top-k", GC_I64, &top_k},
        {"--top-p", GC_DBL, &top_p},
        {"--repetition-penalty", GC_DBL, &rep},
        {"--seed", GC_U64, &seed},
        {"--system", GC_STR, &system},
        {"--tokenizer", GC_STR, &tokenizer},
        {"--device", GC_STR, &device},
    };
    int r = gc_parse("ember chat", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == 1) {
        usage(stdout);
        return 0;
    }
    const char *bad = NULL;
    if (r == 0 && !ckpt)
        bad = "--checkpoint is required";
    else if (r == 0 && max_tokens <= 0)
        bad = "--max-tokens must be positive";
    else if (r == 0 && (temperature < 0 || top_k < 0 || !(top_p > 0 && top_p <= 1) || !(rep > 0)))
        bad = "sampling options out of range (temperature >= 0, top-k >= 0, 0 < top-p <= 1, "
              "repetition-penalty > 0)";
    if (bad) fprintf(stderr, "ember chat: %s\n", bad);
    if (r != 0 || bad) {
        fprintf(stderr, "\n");
        usage(stderr);
        return 2;
    }
    em_device *dev;
    chat c = {0};
    if (!gc_open("ember chat", ckpt, tokenizer, device, &dev, &c.g, &c.tok)) return 1;
    int64_t ims = em_tok_special_id(c.tok, "<|im_start|>");
    c.im_end = em_tok_special_id(c.tok, "<|im_end|>");
    c.chatml = ims >= 0 && c.im_end >= 0;
    c.bare = !c.chatml && !encodable(c.tok, "User: \nAssistant:");
    int64_t ctx = em_gpt_config_of(c.g)->block_size;
    if (max_tokens > ctx / 2) max_tokens = ctx / 2 > 0 ? ctx / 2 : 1;
    bool tty = isatty(STDIN_FILENO);
    if (tty)
        printf("ember chat: %s template, context %lld tokens. /reset, /quit, /help.\n",
               c.chatml ? "ChatML"
               : c.bare ? "line-by-line"
                        : "plain",
               (long long)ctx);
    int rc = 0, turn = 0;
    char *line = NULL;
    le_history hist = {0};
    for (;;) {
        if (c.n == 0 && system && *system) {
            char *s = malloc(strlen(system) + 64);
            if (s) {
                sprintf(s, c.chatml ? "<|im_start|>system\n%s<|im_end|>\n" : "%s\n", system);
                append_text(&c, s, c.chatml);
                free(s);
            }
            c.keep = c.n;
        }
        if (tty) printf("\n");
        free(line);
        line = le_readline(tty ? "you> " : "", &hist);
        if (!line) break;
        if (!*line) continue;
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0) break;
        if (strcmp(line, "/help") == 0) {
            usage(stdout);
            continue;
        }
        if (strcmp(line, "/reset") == 0) {
            c.n = c.nturns = 0;
            printf("(conversation reset)\n");
            continue;
        }
        /* Only the template's own tokens are special; the user's text is plain. */
        const char *pre = c.chatml ? "<|im_start|>user\n" : c.bare ? "" : "User: ";
        const char *post = c.chatml ? "<|im_end|>\n<|im_start|>assistant\n"
                           : c.bare ? "\n"
                                    : "\nAssistant:";
        bool ok = begin_turn(&c) && (!*pre || append_text(&c, pre, c.chatml)) &&
                  append_lenient(&c, line) &&
                  (c.bare ? append_lenient(&c, post) : append_text(&c, post, c.chatml));
        if (!ok) {
            fprintf(stderr, "ember chat: %s\n", em_last_error());
            rc = 1;
            break;
        }
        fit(&c, max_tokens);
        if (tty) printf("model> ");
        fflush(stdout);
        static const char *const plain_stops[] = {"\nUser:", "<|endoftext|>"};
        static const char *const chatml_stops[] = {"<|im_end|>", "<|endoftext|>"};
        static const char *const bare_stops[] = {"\n", "<|endoftext|>"};
        gc_stream st;
        gc_stream_init(&st, c.tok, stdout,
                       c.chatml ? chatml_stops
                       : c.bare ? bare_stops
                                : plain_stops,
                       2);
        if (c.chatml) st.eot = c.im_end;
        em_sample_config sc = {temperature, top_k, top_p, rep, seed + (uint64_t)turn++};
        int64_t first = (int64_t)c.n > ctx ? (int64_t)c.n - ctx : 0;
        if (em_gpt_generate(c.g, c.ids + first, (int64_t)c.n - first, max_tokens, &sc, -1,
                            gc_stream_token, &st, NULL) != EM_OK) {
            fprintf(stderr, "\nember chat: %s\n", em_last_error());
            rc = 1;
        }
        /* The reply joins the transcript as text (cut at the stop string), closed by the
         * template. */
        char *reply = st.text ? strndup(st.text, st.len) : strdup("");
        gc_stream_finish(&st);
        printf("\n");
        if (rc != 0 || !reply) {
            free(reply);
            break;
        }
        append_lenient(&c, reply);
        if (c.chatml)
            append_text(&c, "<|im_end|>\n", true);
        else
            append_lenient(&c, "\n");
        free(reply);
    }
    free(line);
    le_history_free(&hist);
    free(c.ids);
    free(c.turns);
    em_tok_free(c.tok);
    em_gpt_free(c.g);
    em_device_close(dev);
    return rc;
}
