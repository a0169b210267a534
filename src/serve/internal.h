/* internal.h — what the serve layer's files share: the parsed request (api.c), the chat template
 * (template.c), a request's life between its connection and the scheduler (sched.c), the server
 * (server.c) and the embedded web page (generated from web/ at build time). */
#ifndef EM_SERVE_INTERNAL_H
#define EM_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/strbuf.h"
#include "serve/serve.h"

/* ---- errors (OpenAI's error object) ---------------------------------------------------------- */

typedef struct serve_error {
    int status;        /* HTTP status */
    const char *type;  /* "invalid_request_error", "server_error", ... (static) */
    const char *code;  /* NULL or "invalid_api_key", "context_length_exceeded", ... (static) */
    char param[64];    /* the offending field, or "" */
    char message[480]; /* for people */
} serve_error;

/* Fills e and returns its status. */
int serve_fail(serve_error *e, int status, const char *type, const char *code, const char *param,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}} (malloc'd; NULL on no memory). */
char *serve_error_json(const serve_error *e);

/* ---- requests (api.c) ------------------------------------------------------------------------ */

typedef struct serve_msg {
    char *role;    /* "system", "user", "assistant" (also "developer", as system) */
    char *content; /* the text (malloc'd) */
} serve_msg;

enum { SERVE_MAX_STOPS = 4 };

typedef struct serve_params {
    bool chat;          /* /v1/chat/completions */
    bool stream;        /* server-sent events */
    bool include_usage; /* stream_options.include_usage */
    bool echo;          /* completions: the prompt before the text */
    char *prompt;       /* completions: the text (malloc'd) */
    serve_msg *msgs;    /* chat: the conversation (malloc'd) */
    int nmsgs;
    int64_t max_tokens;           /* -1 when absent */
    em_sample_config sc;          /* temperature, top_p, top_k, repetition penalty, seed */
    bool seeded;                  /* the request gave a seed */
    char *stops[SERVE_MAX_STOPS]; /* stop strings (malloc'd) */
    int nstops;
} serve_params;

/* Parses and checks a request body. 0, or an HTTP status with e filled (p is then freed). */
int serve_parse_request(const char *body, size_t len, bool chat, serve_params *p, serve_error *e);
void serve_params_free(serve_params *p);

/* What a finished (or streaming) response reports. */
typedef struct serve_usage {
    int64_t prompt_tokens, completion_tokens;
} serve_usage;

/* Response bodies (malloc'd JSON, NULL on no memory). `id` is "cmpl-..." or "chatcmpl-...". */
char *serve_completion_json(const serve_params *p, const char *id, long created, const char *model,
                            const char *text, size_t len, const char *finish_reason,
                            const serve_usage *u);
/* One streamed chunk: a text delta (text may be NULL: the chat's opening role delta when
 * `first`), or the closing chunk when finish_reason is given. */
char *serve_chunk_json(const serve_params *p, const char *id, long created, const char *model,
                       const char *text, size_t len, bool first, const char *finish_reason);
/* The last streamed chunk of include_usage: no choices, the usage. */
char *serve_usage_chunk_json(const serve_params *p, const char *id, long created, const char *model,
                             const serve_usage *u);
char *serve_models_json(const char *model, long created);
char *serve_model_json(const char *model, long created);

/* ---- the chat template (template.c) ---------------------------------------------------------- */

typedef enum serve_tpl_kind {
    SERVE_TPL_CHATML, /* <|im_start|>role\n...<|im_end|>\n (the tokenizer has both tokens) */
    SERVE_TPL_PLAIN,  /* User: ...\nAssistant: ... */
    SERVE_TPL_BARE,   /* lines only (a character tokenizer that cannot spell "User:") */
} serve_tpl_kind;

typedef struct serve_template {
    serve_tpl_kind kind;
    int64_t im_end; /* ChatML's end token, or -1 */
} serve_template;

/* The template `ember chat` uses with this tokenizer (tools/ember/chat.c). */
void serve_template_init(serve_template *t, const em_tokenizer *tok);
const char *serve_template_name(const serve_template *t);
/* The conversation as ids in the template, ending with the assistant's cue. When it does not fit
 * ctx with `room` tokens to spare, the oldest messages after the system ones are dropped (the
 * last message always stays; generation keeps its end). Characters the tokenizer cannot encode
 * are left out. *ids is malloc'd. EM_OK, or an error status (no memory) with the error set. */
em_status serve_template_encode(const serve_template *t, const em_tokenizer *tok,
                                const serve_msg *msgs, int n, int64_t ctx, int64_t room,
                                int64_t **ids, int64_t *nids);
/* The stop strings the template adds (static; *n gets the count). */
const char *const *serve_template_stops(const serve_template *t, int *n);

/* ---- a request's life (sched.c) -------------------------------------------------------------- */

enum { SERVE_MAX_REQ_STOPS = SERVE_MAX_STOPS + 3, SERVE_MAX_STOP_TOKENS = 2 };

typedef struct serve_req {
    /* Set by the connection before serve_submit; read-only afterwards. */
    int64_t *prompt; /* the ids to continue (malloc'd) */
    int64_t nprompt;
    int64_t max_new;                  /* tokens to make at most */
    em_sample_config sc;              /* sampling */
    char *stops[SERVE_MAX_REQ_STOPS]; /* stop strings (malloc'd): the text ends before one */
    int nstops;
    int64_t stop_tokens[SERVE_MAX_STOP_TOKENS]; /* ids that end the text (<|endoftext|>, ...) */
    int nstop_tokens;
    double deadline; /* monotonic seconds: the text ends ("length") past it */

    /* Shared between the connection and the scheduler, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* signalled on new text and at the end */
    em_strbuf text;            /* the text released so far (stop strings cut, UTF-8 whole) */
    int64_t completion_tokens; /* tokens generated */
    bool done;                 /* finished: finish_reason or error set */
    const char *finish_reason; /* "stop" or "length" (static) */
    serve_error error;         /* error.status != 0: failed */
    atomic_bool cancel;        /* the client left: leave the batch */
    int refs;                  /* holders: the connection, the scheduler */

    /* The scheduler's own. */
    struct serve_req *next; /* queue link */
    int64_t slot;           /* its slot in the batch, -1 when none */
    int64_t *hist;          /* prompt and generated ids */
    int64_t n;              /* ids in hist */
    int64_t made;           /* tokens generated */
    uint64_t rng;           /* the sampler's state */
    float *logits;          /* next-token logits [vocab] (sampled requests) */
    int64_t greedy_next;    /* greedy requests: the next token, picked on the device */
    bool finished;          /* leaves the batch after this step */
    em_tok_stream dec;      /* ids to UTF-8 */
    em_strbuf raw;          /* decoded text, some of it held back (a stop string may start) */
    size_t released;        /* bytes of raw passed to text */
} serve_req;

/* A request with one reference (the caller's). NULL on no memory. */
serve_req *serve_req_new(void);
/* Drops one reference; the last frees it. */
void serve_req_release(serve_req *r);

/* ---- the server (server.c, sched.c) ---------------------------------------------------------- */

struct MHD_Daemon;

struct em_server {
    em_serve_config cfg; /* the config, strings copied below */
    char *host, *api_key, *model_name;
    em_gpt *g;                    /* the model (borrowed; only the scheduler thread runs it) */
    const em_tokenizer *tok;      /* the tokenizer (borrowed; thread-safe) */
    int64_t ctx, vocab;           /* the model's context and vocabulary */
    serve_template tpl;           /* the chat template */
    long created;                 /* start time (Unix seconds) */
    struct MHD_Daemon *mhd;       /* the HTTP daemon */
    int port;                     /* where it listens */
    atomic_uint_fast64_t next_id; /* request ids and default seeds */
    atomic_int inflight;          /* connections with a request handed to the scheduler */

    /* The scheduler (sched.c), under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work arrived, or stopping */
    pthread_t thread;
    bool thread_started;
    bool stopping;
    serve_req *qhead, *qtail; /* waiting requests, oldest first */
    int nqueued;
    serve_req **active; /* the batch (max_batch entries) */
    int nactive;
    bool *slot_used;       /* per slot of the batch */
    em_gpt_batch *batch;   /* the slot KV cache */
    em_server_stats stats; /* counters (active/queued filled on read) */
};

/* Monotonic seconds. */
double serve_now(void);

/* Starts / stops the scheduler thread (and makes / frees the batch); s->mu and s->cv are the
 * server's, made before. */
em_status serve_sched_start(em_server *s);
void serve_sched_stop(em_server *s);
/* Runs a short generation to compile the kernels before the first request. */
em_status serve_sched_warmup(em_server *s);
/* Queues r (the scheduler takes its own reference). 0, or 503 when the queue is full or the
 * server is stopping (e filled). */
int serve_submit(em_server *s, serve_req *r, serve_error *e);

/* ---- the web page (generated from web/ by src/serve/embed_web.cmake) ------------------------- */

typedef struct serve_asset {
    const char *path;         /* "/index.html" */
    const char *content_type; /* "text/html; charset=utf-8" */
    const unsigned char *data;
    size_t size;
} serve_asset;
extern const serve_asset em_serve_web_assets[]; /* ends with a NULL path */

#endif
