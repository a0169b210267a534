/* serve.h — the serve layer: an OpenAI-compatible HTTP server for a GPT (src/serve).
 *
 * POST /v1/completions and /v1/chat/completions (whole responses, or server-sent events with
 * "stream": true), GET /v1/models, GET /health, and a web chat page at / (web/, embedded at build
 * time). HTTP is libmicrohttpd's (one thread per connection), JSON is cJSON's. One scheduler
 * thread owns the model and decodes every admitted request together by continuous batching: each
 * step is one batched forward pass over the active sequences (em_gpt_batch_step), new requests
 * join after their prefill and finished ones leave, up to max_batch at once; beyond that requests
 * wait in a queue of max_queue, and past the queue they are answered 503. Errors are OpenAI error
 * objects with the matching status; nothing a client sends can stop the server. docs/serve.md has
 * the details. */
#ifndef EM_SERVE_SERVE_H
#define EM_SERVE_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/gpt.h"

typedef struct em_serve_config {
    const char *host;         /* address to bind: "127.0.0.1" (default), "0.0.0.0", "::1", a name */
    int port;                 /* TCP port; 0 takes a free one (em_server_port says which) */
    const char *api_key;      /* NULL or "": none; else /v1/ needs "Authorization: Bearer KEY" */
    const char *model_name;   /* the model's id in /v1/models and in responses */
    int max_batch;            /* sequences decoded together (8) */
    int max_queue;            /* requests waiting for a place in the batch (32); more get 503 */
    size_t max_body;          /* request body bytes (1 MiB); more get 413 */
    int64_t max_tokens;       /* the largest max_tokens a request may ask (1024), and the default */
    double request_timeout;   /* seconds from a request's arrival to its last token (300) */
    unsigned conn_timeout;    /* seconds a connection may stay idle (15) */
    double read_timeout;      /* seconds to receive a whole request (30): against trickling */
    unsigned max_connections; /* open connections at once (256); more are closed at accept */
    bool log_requests;        /* one line per request on stderr */
} em_serve_config;

/* The defaults above. */
void em_serve_config_init(em_serve_config *c);

typedef struct em_server em_server;

/* Starts serving g with tok (both borrowed; they must outlive the server, and nothing else may
 * use g while it runs): warms the kernels up, starts the scheduler thread and the HTTP daemon.
 * NULL with the error set (a bad config, a port in use, ...). */
em_server *em_server_start(em_gpt *g, const em_tokenizer *tok, const em_serve_config *cfg);
/* The port it listens on. */
int em_server_port(const em_server *s);

/* Counters, for tests and /health. */
typedef struct em_server_stats {
    int64_t active;    /* sequences in the batch now */
    int64_t queued;    /* requests waiting now */
    int64_t completed; /* requests answered in full */
    int64_t rejected;  /* 503s for a full queue */
    int64_t cancelled; /* requests whose client left before the end */
    int64_t steps;     /* batched forward passes */
    int64_t max_rows;  /* the most sequences one pass has carried */
} em_server_stats;
void em_server_stats_get(em_server *s, em_server_stats *out);

/* Stops accepting, ends every request (those still running get an error), joins the threads and
 * frees the server. NULL is ignored. */
void em_server_stop(em_server *s);

#endif
