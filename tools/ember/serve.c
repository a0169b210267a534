/* serve.c — `ember serve`: an OpenAI-compatible HTTP server (POST /v1/completions and
 * /v1/chat/completions, streamed or whole, GET /v1/models, GET /health) with a web chat page at /,
 * for a checkpoint of `ember train` or Hugging Face GPT-2 weights. The server itself is the serve
 * layer (src/serve); this file parses the options, opens the model and its tokenizer as `ember
 * sample` does, and runs until SIGINT or SIGTERM. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gen_common.h"
#include "serve/serve.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ember serve --checkpoint PATH [--host H] [--port P] [--api-key KEY]\n"
        "                   [--max-batch N] [--max-queue N] [--max-tokens N] [options]\n\n"
        "Serves a model over HTTP with OpenAI's API (POST /v1/completions,\n"
        "POST /v1/chat/completions, streamed with \"stream\": true; GET /v1/models, GET /health)\n"
        "and a chat page at /. Concurrent requests share the model by continuous batching.\n"
        "  --checkpoint PATH    ckpt.safetensors of `ember train`, a folder holding one, or a\n"
        "                       Hugging Face GPT-2 model.safetensors (also --model)\n"
        "  --tokenizer T        default: tokenizer.json beside the checkpoint, else gpt2\n"
        "  --device D           cpu, cuda:0, vulkan:0, opencl:0 (default: the best present)\n"
        "  --host H             address to bind (default 127.0.0.1: this machine only)\n"
        "  --port P             TCP port (default 8080; 0 picks a free one)\n"
        "  --api-key KEY        require \"Authorization: Bearer KEY\" on /v1/ (default: none;\n"
        "                       also $EMBER_API_KEY)\n"
        "  --model-name NAME    the model's id in the API (default: the checkpoint's folder)\n"
        "  --max-batch N        sequences decoded together (default 8)\n"
        "  --max-queue N        requests waiting beyond those; more get 503 (default 32)\n"
        "  --max-tokens N       the largest max_tokens a request may ask (default 1024)\n"
        "  --max-body BYTES     request body limit; more get 413 (default 1048576)\n"
        "  --timeout S          seconds a request may take in all (default 300)\n"
        "  --conn-timeout S     seconds a connection may stay idle (default 15)\n"
        "  --read-timeout S     seconds to send a whole request (default 30)\n"
        "  --max-connections N  open connections at once (default 256)\n"
        "  --log-requests       one line per request on stderr\n");
}

/* The folder name of the checkpoint ("out/tiny/ckpt.safetensors" -> "tiny"). */
static void default_name(const char *ckpt, char *out, size_t cap)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", ckpt);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    const char *ext = strstr(buf, ".safetensors");
    if (ext && ext[12] == 0) { /* a file: its folder */
        char *slash = strrchr(buf, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(buf, sizeof buf, ".");
    }
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) base = "ember-gpt";
    snprintf(out, cap, "%s", base);
}

int em_cli_serve(int argc, char **argv)
{
    const char *ckpt = NULL, *model = NULL, *tokenizer = NULL, *device = NULL;
    em_serve_config cfg;
    em_serve_config_init(&cfg);
    const char *host = cfg.host, *api_key = getenv("EMBER_API_KEY"), *name = NULL;
    int port = cfg.port, max_batch = cfg.max_batch, max_queue = cfg.max_queue;
    int conn_timeout = (int)cfg.conn_timeout, max_conn = (int)cfg.max_connections;
    int64_t max_tokens = cfg.max_tokens, max_body = (int64_t)cfg.max_body;
    double timeout = cfg.request_timeout, read_timeout = cfg.read_timeout;
    bool log_requests = false;
    const gc_opt opts[] = {
        {"--checkpoint", GC_STR, &ckpt},
        {"--model", GC_STR, &model},
        {"--tokenizer", GC_STR, &tokenizer},
        {"--device", GC_STR, &device},
        {"--host", GC_STR, &host},
        {"--port", GC_INT, &port},
        {"--api-key", GC_STR, &api_key},
        {"--model-name", GC_STR, &name},
        {"--max-batch", GC_INT, &max_batch},
        {"--max-queue", GC_INT, &max_queue},
        {"--max-tokens", GC_I64, &max_tokens},
        {"--max-body", GC_I64, &max_body},
        {"--timeout", GC_DBL, &timeout},
        {"--conn-timeout", GC_INT, &conn_timeout},
        {"--read-timeout", GC_DBL, &read_timeout},
        {"--max-connections", GC_INT, &max_conn},
        {"--log-requests", GC_FLAG, &log_requests},
    };
    int r = gc_parse("ember serve", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (r == 1) {
        usage(stdout);
        return 0;
    }
    if (!ckpt) ckpt = model;
    const char *bad = NULL;
    if (r == 0 && !ckpt)
        bad = "--checkpoint is required";
    else if (r == 0 && (port < 0 || port > 65535))
        bad = "--port must be in [0, 65535]";
    else if (r == 0 && (max_batch < 1 || max_batch > 1024))
        bad = "--max-batch must be in [1, 1024]";
    else if (r == 0 && max_queue < 0)
        bad = "--max-queue must not be negative";
    else if (r == 0 && max_tokens < 1)
        bad = "--max-tokens must be at least 1";
    else if (r == 0 && max_body < 64)
        bad = "--max-body must be at least 64";
    else if (r == 0 && (!(timeout > 0) || !(read_timeout > 0) || conn_timeout < 1))
        bad = "the timeouts must be positive";
    else if (r == 0 && max_conn < 4)
        bad = "--max-connections must be at least 4";
    if (bad) fprintf(stderr, "ember serve: %s\n", bad);
    if (r != 0 || bad) {
        fprintf(stderr, "\n");
        usage(stderr);
        return 2;
    }

    /* SIGINT / SIGTERM are taken by sigwait below: blocked before any thread starts, so every
     * thread inherits the mask. A client gone mid-write must not kill the process. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    em_device *dev;
    em_gpt *g;
    em_tokenizer *tok;
    if (!gc_open("ember serve", ckpt, tokenizer, device, &dev, &g, &tok)) return 1;
    char model_name[256];
    if (name && *name)
        snprintf(model_name, sizeof model_name, "%s", name);
    else
        default_name(ckpt, model_name, sizeof model_name);
    cfg.host = host;
    cfg.port = port;
    cfg.api_key = api_key;
    cfg.model_name = model_name;
    cfg.max_batch = max_batch;
    cfg.max_queue = max_queue;
    cfg.max_tokens = max_tokens;
    cfg.max_body = (size_t)max_body;
    cfg.request_timeout = timeout;
    cfg.conn_timeout = (unsigned)conn_timeout;
    cfg.read_timeout = read_timeout;
    cfg.max_connections = (unsigned)max_conn;
    cfg.log_requests = log_requests;
    fprintf(stderr, "ember serve: warming up %s on %s...\n", model_name, em_device_name(dev));
    em_server *srv = em_server_start(g, tok, &cfg);
    int rc = 0;
    if (!srv) {
        fprintf(stderr, "ember serve: %s\n", em_last_error());
        rc = 1;
    } else {
        const em_gpt_config *mc = em_gpt_config_of(g);
        bool v6 = strchr(host, ':') != NULL;
        printf("ember serve: listening on http://%s%s%s:%d (model %s: %lld layers, context %lld; "
               "batch %d, queue %d%s)\n",
               v6 ? "[" : "", host, v6 ? "]" : "", em_server_port(srv), model_name,
               (long long)mc->n_layer, (long long)mc->block_size, max_batch, max_queue,
               api_key && *api_key ? ", API key required" : "");
        fflush(stdout);
        int sig = 0;
        sigwait(&stop_signals, &sig);
        fprintf(stderr, "ember serve: %s, stopping\n",
                sig == SIGINT ? "interrupted" : "terminated");
        em_server_stop(srv);
    }
    em_tok_free(tok);
    em_gpt_free(g);
    em_device_close(dev);
    return rc;
}
