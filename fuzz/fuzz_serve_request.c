/* fuzz_serve_request.c — libFuzzer target over the request side of `ember serve` (src/serve/api.c
 * and template.c): a POST body becomes a request, as the server's connection handler makes it.
 * The first input byte picks the route and the tokenizer; the rest is the body:
 *   bit 0: /v1/chat/completions (set) or /v1/completions;
 *   bits 1-2: the chat template's tokenizer — 0 a byte-level BPE (plain template; GPT-2's when
 *     its files are installed), 1 the same with ChatML's tokens (ChatML template), 2 a character
 *     tokenizer (bare template), 3 none (the template is skipped).
 * A body that is refused must give a 400 (or a 500 for no memory) with a message, an error object
 * that is valid JSON carrying that message, and cleared parameters. A body that is accepted must
 * give parameters inside their documented ranges; the responses built from them (whole, streamed
 * chunks, the usage chunk) must be valid JSON that gives the text back byte for byte; and a chat's
 * messages must go through the chat template into ids inside the vocabulary. Any crash,
 * sanitizer report or broken check (__builtin_trap) is a bug. Seeds are in
 * fuzz/corpus/serve_request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/internal.h"

static em_tokenizer *g_tok[3]; /* plain (BPE), ChatML (BPE + its tokens), bare (characters) */

static em_tokenizer *small_bpe(void)
{
    const char *text = "User: the quick brown fox\nAssistant: jumps over the lazy dog, it's 42\n"
                       "\xe6\x97\xa5\xe6\x9c\xac";
    em_bpe_train_opts o = {.vocab_size = 300};
    em_tokenizer *t = em_bpe_train(text, strlen(text), &o);
    if (t) em_tok_add_special(t, "<|endoftext|>", -1);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_tok[0] = em_tok_gpt2(NULL);
    if (!g_tok[0]) g_tok[0] = small_bpe();
    g_tok[1] = small_bpe();
    if (g_tok[1] && em_tok_add_chat_specials(g_tok[1]) != EM_OK) __builtin_trap();
    const char *alphabet = "abcdefghijklmnopqrstuvwxyz .,?!\n";
    g_tok[2] = em_tok_char_from_text(alphabet, strlen(alphabet), NULL, 0);
    if (!g_tok[0] || !g_tok[1] || !g_tok[2]) __builtin_trap();
    return 0;
}

/* A refused body: the error is well formed and p holds nothing. */
static void check_refusal(int st, const serve_error *e, const serve_params *p)
{
    if ((st != 400 && st != 500) || e->status != st || !e->type || !e->message[0]) __builtin_trap();
    if (p->prompt || p->msgs || p->nmsgs || p->nstops) __builtin_trap();
    char *json = serve_error_json(e);
    if (!json) return; /* no memory */
    cJSON *o = cJSON_Parse(json);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    if (!cJSON_IsString(msg) || strcmp(msg->valuestring, e->message) != 0) __builtin_trap();
    cJSON_Delete(o);
    free(json);
}

/* An accepted body: every field inside its range. */
static void check_params(const serve_params *p, bool chat)
{
    if (p->chat != chat) __builtin_trap();
    if (chat) {
        if (!p->msgs || p->nmsgs < 1 || p->prompt) __builtin_trap();
        for (int i = 0; i < p->nmsgs; i++) {
            const char *r = p->msgs[i].role;
            if (!r || !p->msgs[i].content ||
                (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
                __builtin_trap();
        }
    } else if (!p->prompt || p->msgs) {
        __builtin_trap();
    }
    if (p->max_tokens != -1 && p->max_tokens < 1) __builtin_trap();
    const em_sample_config *sc = &p->sc;
    if (!(sc->temperature >= 0 && sc->temperature <= 2) || !(sc->top_p >= 0 && sc->top_p <= 1) ||
        sc->top_k < 0 || !(sc->repetition_penalty > 0))
        __builtin_trap();
    if (p->nstops < 0 || p->nstops > SERVE_MAX_STOPS) __builtin_trap();
    for (int i = 0; i < p->nstops; i++)
        if (!p->stops[i] || !p->stops[i][0]) __builtin_trap();
}

/* The text member of a response's first choice: choices[0].text, .message.content or
 * .delta.content. */
static const char *choice_text(const cJSON *o)
{
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "message"),
                                             "content");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "delta"),
                                             "content");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* json (freed here) must parse; with want, its first choice's text must be want. */
static void check_response(char *json, const char *want)
{
    if (!json) return; /* no memory */
    cJSON *o = cJSON_Parse(json);
    if (!cJSON_IsObject(o)) __builtin_trap();
    if (want) {
        const char *got = choice_text(o);
        if (!got || strcmp(got, want) != 0) __builtin_trap();
    }
    cJSON_Delete(o);
    free(json);
}

/* The responses a request's text would go back in. */
static void check_responses(const serve_params *p)
{
    const char *text = p->chat ? p->msgs[p->nmsgs - 1].content : p->prompt;
    size_t len = strlen(text);
    serve_usage u = {(int64_t)len, p->max_tokens};
    const char *id = p->chat ? "chatcmpl-1" : "cmpl-1";
    check_response(serve_completion_json(p, id, 1, "m", text, len, "stop", &u), text);
    check_response(serve_chunk_json(p, id, 1, "m", text, len, false, NULL), text);
    check_response(serve_chunk_json(p, id, 1, "m", NULL, 0, true, NULL), "");
    check_response(serve_chunk_json(p, id, 1, "m", NULL, 0, false, "length"), NULL);
    check_response(serve_usage_chunk_json(p, id, 1, "m", &u), NULL);
}

/* A chat's messages through the template of tokenizer `which`. */
static void check_template(const serve_params *p, int which)
{
    if (which > 2) return;
    const em_tokenizer *tok = g_tok[which];
    serve_template t;
    serve_template_init(&t, tok);
    if ((which == 1) != (t.kind == SERVE_TPL_CHATML)) __builtin_trap();
    int64_t *ids = NULL, n = 0;
    if (serve_template_encode(&t, tok, p->msgs, p->nmsgs, 64, 16, &ids, &n) != EM_OK) {
        if (ids || n) __builtin_trap();
        return; /* no memory */
    }
    uint32_t vocab = em_tok_vocab_size(tok);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= (int64_t)vocab) __builtin_trap();
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bool chat = data[0] & 1;
    int which = (data[0] >> 1) & 3;
    size_t len = size - 1;
    char *body = malloc(len ? len : 1); /* no NUL after it: reads past the body are caught */
    if (!body) return 0;
    memcpy(body, data + 1, len);
    serve_params p;
    serve_error e;
    memset(&e, 0, sizeof e);
    int st = serve_parse_request(body, len, chat, &p, &e);
    free(body);
    if (st) {
        check_refusal(st, &e, &p);
        return 0;
    }
    check_params(&p, chat);
    check_responses(&p);
    if (chat) check_template(&p, which);
    serve_params_free(&p);
    return 0;
}
