/* data.c — where the training data comes from: a folder made by `ember data prepare`
 * (train_*.bin, val_*.bin, tokenizer.json), a shard glob, or a plain text file, which is tokenized
 * here (a character tokenizer by default) and written as two shards in out_dir/data — the first
 * val_fraction of the tokens for validation, the rest for training, as `ember data prepare`
 * splits. The tokenizer is saved as out_dir/tokenizer.json so the checkpoint has it beside.
 * Data parallel: every rank tokenizes the text (the result is the same), rank 0 alone writes the
 * shards and the tokenizer, and the others wait for it; each rank's loader takes its share of
 * the batches (em_loader_opts rank / world). */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/log.h"
#include "train/internal.h"

static bool is_dir(const char *p)
{
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool glob_any(const char *pattern)
{
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    bool any = r == 0 && g.gl_pathc > 0;
    globfree(&g);
    return any;
}

static bool is_shard_path(const char *p)
{
    size_t n = strlen(p);
    return strchr(p, '*') || strchr(p, '?') || (n > 4 && strcmp(p + n - 4, ".bin") == 0);
}

/* Tokenizes a text file into out_dir/data/{train,val}_000000.bin. */
static em_status prepare_text(em_trainer *t, char *train_glob, char *val_glob, size_t size)
{
    size_t len;
    char *text = em_file_read(t->data, &len);
    if (!text) return em_last_status();
    const char *name = t->tokenizer_name ? t->tokenizer_name : "char";
    static const char *const specials[] = {"<|endoftext|>"};
    t->tok = strcmp(name, "char") == 0 ? em_tok_char_from_text(text, len, specials, 1)
                                       : em_tok_load(name);
    /* One document preceded by <|endoftext|>, as `ember data prepare` writes it, so samples
     * that start from <|endoftext|> start where the text does. */
    em_tokens ids = {0};
    em_status st = t->tok ? EM_OK : em_last_status();
    int64_t eot = t->tok ? em_tok_eot(t->tok) : -1;
    if (st == EM_OK && eot >= 0) {
        ids.ids = malloc(sizeof *ids.ids);
        if (!ids.ids)
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
        else
            ids.ids[0] = (uint32_t)eot, ids.len = ids.cap = 1;
    }
    if (st == EM_OK) st = em_tok_encode(t->tok, text, len, false, &ids);
    free(text);
    if (st != EM_OK) {
        em_tokens_free(&ids);
        return em_error_context("tokenizing %s", t->data);
    }
    char dir[4096];
    tr_path(t, "data", dir, sizeof dir);
    st = em_mkdir_p(dir);
    double f = t->cfg.val_fraction;
    if (f < 0 || f >= 1) f = 0.1;
    size_t nval = (size_t)((double)ids.len * f);
    size_t need = (size_t)t->cfg.batch * (size_t)t->world * (size_t)t->cfg.seq + 1;
    if (nval > 0 && nval < need) nval = need < ids.len / 2 ? need : 0;
    if (ids.len - nval < need) {
        em_tokens_free(&ids);
        return em_set_error(EM_ERR_INVALID,
                            "%s: %zu tokens are too few for one batch of %d x %d (+1) tokens%s",
                            t->data, ids.len, t->cfg.batch * t->world, t->cfg.seq,
                            t->world > 1 ? " over all ranks" : "");
    }
    uint32_t vocab = em_tok_vocab_size(t->tok);
    if ((size_t)snprintf(train_glob, size, "%s/train_000000.bin", dir) >= size ||
        (size_t)snprintf(val_glob, size, "%s/val_000000.bin", dir) >= size) {
        em_tokens_free(&ids);
        return em_set_error(EM_ERR_INVALID, "%s: output directory path too long", dir);
    }
    if (st == EM_OK && tr_lead(t))
        st = em_shard_write(train_glob, ids.ids + nval, ids.len - nval, vocab);
    if (st == EM_OK && tr_lead(t) && nval > 0) st = em_shard_write(val_glob, ids.ids, nval, vocab);
    if (nval == 0) val_glob[0] = 0;
    em_tokens_free(&ids);
    if (st == EM_OK && t->world > 1) st = em_dist_barrier(t->dist); /* the shards are written */
    return st;
}

static em_loader *open_loader(em_trainer *t, const char *path, bool shuffle)
{
    em_loader_opts o = {
        .path = path,
        .batch = t->cfg.batch,
        .seq = t->cfg.seq,
        .shuffle = shuffle,
        .seed = t->cfg.seed,
        .rank = t->rank,
        .world = t->world,
        .prefetch = false,
    };
    return em_loader_open(&o);
}

em_status tr_open_data(em_trainer *t)
{
    if (!t->data) return em_set_error(EM_ERR_INVALID, "no training data given (--data)");
    char train_glob[4096], val_glob[4096], tok_path[4096] = "";
    val_glob[0] = 0;
    em_status st = EM_OK;
    if (is_dir(t->data)) {
        snprintf(train_glob, sizeof train_glob, "%s/train_*.bin", t->data);
        snprintf(val_glob, sizeof val_glob, "%s/val_*.bin", t->data);
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", t->data);
        if (!glob_any(train_glob))
            return em_set_error(EM_ERR_NOT_FOUND,
                                "%s: no train_*.bin shards (make them with "
                                "`ember data prepare`)",
                                t->data);
    } else if (is_shard_path(t->data)) {
        snprintf(train_glob, sizeof train_glob, "%s", t->data);
        const char *slash = strrchr(t->data, '/');
        snprintf(tok_path, sizeof tok_path, "%.*s/tokenizer.json",
                 slash ? (int)(slash - t->data) : 1, slash ? t->data : ".");
    } else {
        if (!em_file_exists(t->data))
            return em_set_error(EM_ERR_NOT_FOUND, "training data %s does not exist", t->data);
        st = prepare_text(t, train_glob, val_glob, sizeof train_glob);
        if (st != EM_OK) return st;
    }
    if (t->val_data) snprintf(val_glob, sizeof val_glob, "%s", t->val_data);
    if (!t->tok) {
        if (t->tokenizer_name)
            t->tok = em_tok_load(t->tokenizer_name);
        else if (tok_path[0] && em_file_exists(tok_path))
            t->tok = em_tok_load(tok_path);
        if (!t->tok && t->tokenizer_name) return em_last_status();
        em_clear_error();
    }
    t->train = open_loader(t, train_glob, t->cfg.shuffle);
    if (!t->train) return em_error_context("training data %s", train_glob);
    if (val_glob[0] && glob_any(val_glob)) {
        t->val = open_loader(t, val_glob, false);
        if (!t->val) {
            EM_LOGW("no validation: %s", em_last_error());
            em_clear_error();
        }
    }
    if (t->tok && tr_lead(t)) {
        char out[4096];
        tr_path(t, "tokenizer.json", out, sizeof out);
        st = em_tok_save(t->tok, out);
    }
    return st;
}
