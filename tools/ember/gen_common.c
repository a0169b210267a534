/* gen_common.c — option table parsing, opening a checkpoint with its tokenizer, and streaming
 * generated text with stop strings, for `ember sample` and `ember chat` (gen_common.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/train.h"
#include "gen_common.h"

int gc_parse(const char *cmd, int argc, char **argv, const gc_opt *opts, int nopts)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        const gc_opt *o = NULL;
        for (int k = 0; k < nopts && !o; k++)
            if (strlen(opts[k].name) == nlen && strncmp(opts[k].name, a, nlen) == 0) o = &opts[k];
        if (!o) {
            fprintf(stderr, "%s: unknown option '%s'\n", cmd, a);
            return 2;
        }
        if (o->kind == GC_FLAG) {
            if (eq) {
                fprintf(stderr, "%s: %s takes no value\n", cmd, o->name);
                return 2;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "%s: %s needs a value\n", cmd, o->name);
            return 2;
        }
        char *end = NULL;
        switch (o->kind) {
        case GC_INT: {
            long x = strtol(v, &end, 10);
            if (*v && !*end && x >= -2147483647L && x <= 2147483647L)
                *(int *)o->dst = (int)x;
            else
                end = NULL;
            break;
        }
        case GC_I64: {
            long long x = strtoll(v, &end, 10);
            if (*v && !*end)
                *(int64_t *)o->dst = x;
            else
                end = NULL;
            break;
        }
        case GC_U64: {
            unsigned long long x = strtoull(v, &end, 10);
            if (*v && !*end && *v != '-')
                *(uint64_t *)o->dst = x;
            else
                end = NULL;
            break;
        }
        case GC_DBL: {
            double x = strtod(v, &end);
            if (*v && !*end)
                *(double *)o->dst = x;
            else
                end = NULL;
            break;
        }
        case GC_STR:
            *(const char **)o->dst = v;
            end = (char *)"";
            break;
        case GC_STRS: {
            gc_strs *s = o->dst;
            if (s->n < 16) s->v[s->n++] = v;
            end = (char *)"";
            break;
        }
        default:
            break;
        }
        if (!end) {
            fprintf(stderr, "%s: %s wants a number, not '%s'\n", cmd, o->name, v);
            return 2;
        }
    }
    return 0;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

void gc_checkpoint_path(const char *checkpoint, char *path, size_t path_size, char *dir,
                        size_t dir_size)
{
    if (is_dir(checkpoint)) {
        snprintf(dir, dir_size, "%s", checkpoint);
        snprintf(path, path_size, "%s/ckpt.safetensors", checkpoint);
        struct stat st;
        if (stat(path, &st) != 0) snprintf(path, path_size, "%s/model.safetensors", checkpoint);
    } else {
        snprintf(path, path_size, "%s", checkpoint);
        const char *slash = strrchr(checkpoint, '/');
        snprintf(dir, dir_size, "%.*s", slash ? (int)(slash - checkpoint) : 1,
                 slash ? checkpoint : ".");
    }
}

bool gc_open(const char *cmd, const char *checkpoint, const char *tokenizer, const char *device,
             em_device **dev, em_gpt **g, em_tokenizer **tok)
{
    *dev = NULL, *g = NULL, *tok = NULL;
    char path[4096], dir[4096];
    gc_checkpoint_path(checkpoint, path, sizeof path, dir, sizeof dir);
    if (device && *device && strcmp(device, "auto") != 0)
        *dev = em_device_open(device);
    else
        *dev = em_train_best_device();
    if (!*dev) {
        fprintf(stderr, "%s: %s\n", cmd, em_last_error());
        return false;
    }
    *g = em_gpt_load(path, *dev, EM_F32);
    if (!*g) {
        fprintf(stderr, "%s: %s\n", cmd, em_last_error());
        em_device_close(*dev);
        *dev = NULL;
        return false;
    }
    if (tokenizer) {
        *tok = em_tok_load(tokenizer);
    } else {
        char tp[4200];
        snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
        struct stat st;
        if (stat(tp, &st) == 0)
            *tok = em_tok_load(tp);
        else if (em_gpt_config_of(*g)->vocab_size >= 50257)
            *tok = em_tok_gpt2(NULL);
        else
            em_set_error(EM_ERR_NOT_FOUND,
                         "no tokenizer: %s has no tokenizer.json beside it; give --tokenizer",
                         path);
    }
    if (*tok && em_tok_vocab_size(*tok) > (uint32_t)em_gpt_config_of(*g)->vocab_size) {
        em_set_error(EM_ERR_INVALID, "the tokenizer has %u ids, the model only %lld",
                     em_tok_vocab_size(*tok), (long long)em_gpt_config_of(*g)->vocab_size);
        em_tok_free(*tok);
        *tok = NULL;
    }
    if (!*tok) {
        fprintf(stderr, "%s: %s\n", cmd, em_last_error());
        em_gpt_free(*g);
        em_device_close(*dev);
        *g = NULL, *dev = NULL;
        return false;
    }
    return true;
}

void gc_stream_init(gc_stream *s, const em_tokenizer *tok, FILE *out, const char *const *stops,
                    int nstops)
{
    memset(s, 0, sizeof *s);
    em_tok_stream_init(&s->dec, tok);
    s->out = out;
    s->stops = stops;
    s->nstops = nstops;
    s->eot = em_tok_eot(tok);
}

/* Writes text[printed, upto). */
static void emit(gc_stream *s, size_t upto)
{
    if (upto > s->printed) {
        fwrite(s->text + s->printed, 1, upto - s->printed, s->out);
        fflush(s->out);
        s->printed = upto;
    }
}

bool gc_stream_token(int64_t token, void *user)
{
    gc_stream *s = user;
    if (token == s->eot) return false;
    size_t blen;
    const uint8_t *b = em_tok_token_bytes(s->dec.tok, (uint32_t)token, &blen);
    size_t need = (b ? blen : 0) * 3 + 64;
    if (s->len + need + 1 > s->cap) {
        size_t cap = (s->cap + need + 1) * 2;
        char *nt = realloc(s->text, cap);
        if (!nt) return false;
        s->text = nt;
        s->cap = cap;
    }
    long n = em_tok_stream_feed(&s->dec, (uint32_t)token, s->text + s->len, s->cap - s->len);
    if (n < 0) return false;
    s->len += (size_t)n;
    s->text[s->len] = 0;
    /* A stop string anywhere in what is not printed yet (or straddling it). */
    size_t longest = 0;
    for (int i = 0; i < s->nstops; i++) {
        size_t sl = strlen(s->stops[i]);
        if (sl > longest) longest = sl;
        size_t from = s->printed > sl ? s->printed - sl : 0;
        char *hit = sl ? strstr(s->text + from, s->stops[i]) : NULL;
        if (hit) {
            emit(s, (size_t)(hit - s->text));
            s->len = (size_t)(hit - s->text);
            s->text[s->len] = 0;
            s->stopped = true;
            return false;
        }
    }
    /* Print all but what could still begin a stop string, on a UTF-8 character boundary. */
    size_t safe =
        longest > 1 && s->len >= longest - 1 ? s->len - (longest - 1) : (longest > 1 ? 0 : s->len);
    while (safe > s->printed && safe < s->len && ((unsigned char)s->text[safe] & 0xC0) == 0x80)
        safe--;
    emit(s, safe);
    return true;
}

void gc_stream_finish(gc_stream *s)
{
    if (!s->stopped) {
        char tail[64];
        long n = em_tok_stream_finish(&s->dec, tail, sizeof tail);
        emit(s, s->len);
        if (n > 0) fwrite(tail, 1, (size_t)n, s->out);
        fflush(s->out);
    }
    free(s->text);
    s->text = NULL;
}
