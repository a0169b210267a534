/* api.c — OpenAI's request and response shapes, through cJSON: parsing and checking the bodies of
 * /v1/completions and /v1/chat/completions (every field's type and range, with the offending
 * field named in the error), and building the responses: whole completions, streamed chunks, the
 * usage chunk, the model list and error objects. Fields this server has no use for (user,
 * presence_penalty, ...) are accepted when well-typed and ignored; features it lacks (n > 1,
 * logprobs, several prompts) are refused with 400 rather than silently dropped. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve/internal.h"

int serve_fail(serve_error *e, int status, const char *type, const char *code, const char *param,
               const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

/* Prints and frees the object (NULL stays NULL). */
static char *print_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *serve_error_json(const serve_error *e)
{
    cJSON *o = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(o, "error");
    if (!err) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return print_free(o);
}

/* ---- parsing --------------------------------------------------------------------------------- */

static int bad(serve_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(serve_error *e, const char *param, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return serve_fail(e, 400, "invalid_request_error", NULL, param, "%s", msg);
}

static bool is_int(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
           v->valuedouble == floor(v->valuedouble) &&
           fabs(v->valuedouble) <= 9007199254740992.0; /* 2^53: exact in a double */
}

/* A number field in [lo, hi] (absent or null: *out untouched). 0 or 400. */
static int get_number(const cJSON *o, const char *name, double lo, double hi, double *out,
                      serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return bad(e, name, "'%s' must be a number", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return bad(e, name, "'%s' is %g; it must be between %g and %g", name, v->valuedouble, lo,
                   hi);
    *out = v->valuedouble;
    return 0;
}

/* An integer field in [lo, hi] (absent or null: *out untouched, *given false). */
static int get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *out,
                   bool *given, serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (given) *given = false;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!is_int(v)) return bad(e, name, "'%s' must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return bad(e, name, "'%s' is %.0f; it must be between %.0f and %.0f", name, v->valuedouble,
                   lo, hi);
    *out = (int64_t)v->valuedouble;
    if (given) *given = true;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, bool *out, serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int nomem(serve_error *e)
{
    return serve_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

static int get_stops(const cJSON *o, serve_params *p, serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        if (!v->valuestring[0]) return 0;
        if (!(p->stops[p->nstops++] = strdup(v->valuestring))) return nomem(e);
        return 0;
    }
    if (!cJSON_IsArray(v)) return bad(e, "stop", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(v) > SERVE_MAX_STOPS)
        return bad(e, "stop", "'stop' holds at most %d strings", SERVE_MAX_STOPS);
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        if (!cJSON_IsString(it)) return bad(e, "stop", "'stop' must be an array of strings");
        if (!it->valuestring[0]) continue;
        if (!(p->stops[p->nstops++] = strdup(it->valuestring))) return nomem(e);
    }
    return 0;
}

/* Text of a message's content: a string, or an array of {"type": "text", "text": ...} parts. */
static int get_content(const cJSON *m, int i, char **out, serve_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!c || cJSON_IsNull(c)) {
        *out = strdup("");
        return *out ? 0 : nomem(e);
    }
    if (cJSON_IsString(c)) {
        *out = strdup(c->valuestring);
        return *out ? 0 : nomem(e);
    }
    if (!cJSON_IsArray(c))
        return bad(e, param, "'%s' must be a string or an array of parts", param);
    em_strbuf sb;
    em_sb_init(&sb);
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text)) {
            em_sb_free(&sb);
            return bad(e, param,
                       "'%s': only parts of type \"text\" with a string \"text\" are "
                       "supported",
                       param);
        }
        em_sb_append(&sb, text->valuestring);
    }
    *out = em_sb_take(&sb);
    return *out ? 0 : nomem(e);
}

static int get_messages(const cJSON *o, serve_params *p, serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!v) return bad(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(v)) return bad(e, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad(e, "messages", "'messages' must not be empty");
    p->msgs = calloc((size_t)n, sizeof *p->msgs);
    if (!p->msgs) return nomem(e);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, v)
    {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return bad(e, param, "'%s' must be an object", param);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) return bad(e, param, "'%s' must be a string", param);
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") &&
            strcmp(r, "assistant"))
            return bad(e, param,
                       "'%s' is '%.40s'; it must be 'system', 'developer', 'user' or 'assistant'",
                       param, r);
        p->msgs[i].role = strdup(strcmp(r, "developer") == 0 ? "system" : r);
        p->nmsgs = i + 1;
        if (!p->msgs[i].role) return nomem(e);
        int st = get_content(m, i, &p->msgs[i].content, e);
        if (st) return st;
        i++;
    }
    return 0;
}

/* The completions prompt: a string or an array of one string (token-id prompts are refused). */
static int get_prompt(const cJSON *o, serve_params *p, serve_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!v) return bad(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(cJSON_GetArrayItem(v, 0)))
        v = cJSON_GetArrayItem(v, 0);
    else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 1 &&
             cJSON_IsString(cJSON_GetArrayItem(v, 0)))
        return bad(e, "prompt", "one prompt per request: 'prompt' holds %d", cJSON_GetArraySize(v));
    if (!cJSON_IsString(v)) return bad(e, "prompt", "'prompt' must be a string");
    p->prompt = strdup(v->valuestring);
    return p->prompt ? 0 : nomem(e);
}

static int parse_fields(const cJSON *o, bool chat, serve_params *p, serve_error *e)
{
    int st;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (model && !cJSON_IsString(model) && !cJSON_IsNull(model))
        return bad(e, "model", "'model' must be a string");
    if ((st = chat ? get_messages(o, p, e) : get_prompt(o, p, e))) return st;
    bool given = false;
    if ((st = get_int(o, "max_tokens", 1, 1e15, &p->max_tokens, &given, e))) return st;
    if (!given && chat &&
        (st = get_int(o, "max_completion_tokens", 1, 1e15, &p->max_tokens, &given, e)))
        return st;
    if ((st = get_number(o, "temperature", 0, 2, &p->sc.temperature, e))) return st;
    if ((st = get_number(o, "top_p", 0, 1, &p->sc.top_p, e))) return st;
    if (p->sc.top_p == 0) p->sc.temperature = 0; /* the smallest nucleus: the likeliest token */
    if ((st = get_int(o, "top_k", 0, 1e9, &p->sc.top_k, NULL, e))) return st;
    if ((st = get_number(o, "repetition_penalty", 1e-3, 1e3, &p->sc.repetition_penalty, e)))
        return st;
    double ignored = 0;
    if ((st = get_number(o, "presence_penalty", -2, 2, &ignored, e))) return st;
    if ((st = get_number(o, "frequency_penalty", -2, 2, &ignored, e))) return st;
    int64_t seed = 0;
    if ((st = get_int(o, "seed", -9007199254740992.0, 9007199254740992.0, &seed, &p->seeded, e)))
        return st;
    if (p->seeded) p->sc.seed = (uint64_t)seed;
    int64_t n = 1;
    if ((st = get_int(o, "n", 1, 128, &n, NULL, e))) return st;
    if (n != 1) return bad(e, "n", "this server makes one choice per request ('n' must be 1)");
    if ((st = get_stops(o, p, e))) return st;
    if ((st = get_bool(o, "stream", &p->stream, e))) return st;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return bad(e, "stream_options", "'stream_options' must be an object");
        if ((st = get_bool(so, "include_usage", &p->include_usage, e))) return st;
    }
    if (!chat && (st = get_bool(o, "echo", &p->echo, e))) return st;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp) &&
        !(cJSON_IsNumber(lp) && lp->valuedouble == 0))
        return bad(e, "logprobs", "log probabilities are not supported by this server");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(o, "user");
    if (user && !cJSON_IsString(user) && !cJSON_IsNull(user))
        return bad(e, "user", "'user' must be a string");
    return 0;
}

int serve_parse_request(const char *body, size_t len, bool chat, serve_params *p, serve_error *e)
{
    memset(p, 0, sizeof *p);
    p->chat = chat;
    p->max_tokens = -1;
    p->sc = (em_sample_config){1.0, 0, 1.0, 1.0, 0};
    cJSON *o = cJSON_ParseWithLength(body, len);
    int st = 0;
    if (!o)
        st = bad(e, NULL, "the body is not valid JSON (near byte %ld)",
                 cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - body) : 0L);
    else if (!cJSON_IsObject(o))
        st = bad(e, NULL, "the body must be a JSON object");
    else
        st = parse_fields(o, chat, p, e);
    cJSON_Delete(o);
    if (st) serve_params_free(p);
    return st;
}

void serve_params_free(serve_params *p)
{
    free(p->prompt);
    for (int i = 0; i < p->nmsgs; i++) {
        free(p->msgs[i].role);
        free(p->msgs[i].content);
    }
    free(p->msgs);
    for (int i = 0; i < p->nstops; i++) free(p->stops[i]);
    memset(p, 0, sizeof *p);
}

/* ---- responses ------------------------------------------------------------------------------- */

/* A string member from len bytes (which need no NUL). False on no memory. */
static bool add_text(cJSON *o, const char *name, const char *text, size_t len)
{
    char *s = malloc(len + 1);
    if (!s) return false;
    if (len) memcpy(s, text, len);
    s[len] = 0;
    bool ok = cJSON_AddStringToObject(o, name, s) != NULL;
    free(s);
    return ok;
}

/* Prints and frees the object, or only frees it when a member could not be added. */
static char *finish(cJSON *o, bool ok)
{
    if (ok) return print_free(o);
    cJSON_Delete(o);
    return NULL;
}

static cJSON *head(const serve_params *p, const char *id, long created, const char *model,
                   bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            p->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                    : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static cJSON *usage_object(const serve_usage *u)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)(u->prompt_tokens + u->completion_tokens));
    return o;
}

char *serve_completion_json(const serve_params *p, const char *id, long created, const char *model,
                            const char *text, size_t len, const char *finish_reason,
                            const serve_usage *u)
{
    cJSON *o = head(p, id, created, model, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    bool ok;
    if (p->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        ok = add_text(m, "content", text, len);
    } else {
        ok = add_text(c, "text", text, len);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_reason);
    cJSON_AddItemToObject(o, "usage", usage_object(u));
    return finish(o, ok);
}

char *serve_chunk_json(const serve_params *p, const char *id, long created, const char *model,
                       const char *text, size_t len, bool first, const char *finish_reason)
{
    cJSON *o = head(p, id, created, model, true);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    bool ok = true;
    if (p->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (first) cJSON_AddStringToObject(d, "role", "assistant");
        if (text || first) ok = add_text(d, "content", text, text ? len : 0);
    } else {
        ok = add_text(c, "text", text, text ? len : 0);
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish_reason)
        cJSON_AddStringToObject(c, "finish_reason", finish_reason);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return finish(o, ok);
}

char *serve_usage_chunk_json(const serve_params *p, const char *id, long created, const char *model,
                             const serve_usage *u)
{
    cJSON *o = head(p, id, created, model, true);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_object(u));
    return print_free(o);
}

static cJSON *model_object(const char *model, long created)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "ember");
    return m;
}

char *serve_models_json(const char *model, long created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(model, created));
    return print_free(o);
}

char *serve_model_json(const char *model, long created)
{
    return print_free(model_object(model, created));
}
