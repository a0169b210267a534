/* safetensors_write.c — writing safetensors files.
 *
 * A writer collects named tensors (retained) and metadata pairs; em_safetensors_write lays them out
 * in the order they were added: the 8-byte little-endian header length, the JSON header (metadata
 * first, then each tensor's dtype, shape and data_offsets), padded with spaces to a multiple of 8
 * bytes as the reference implementation does, then each tensor's bytes, contiguous row-major. The
 * whole file is assembled in host memory (each tensor copied once, with em_to_host, straight into
 * place) and written with em_file_write_atomic: a temp file in the same directory, fsync, rename.
 * An interrupted or failed save leaves the previous file as it was. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "record/internal.h"

typedef struct st_item {
    char *name;   /* owned */
    em_tensor *t; /* retained */
} st_item;

struct em_safetensors_writer {
    st_item *items; /* tensors in the order added */
    size_t len, cap;
    cJSON *meta;  /* metadata object (NULL when none) */
    em_map names; /* name -> item index + 1 (duplicate check) */
};

em_safetensors_writer *em_safetensors_writer_new(void)
{
    em_safetensors_writer *w = calloc(1, sizeof *w);
    if (!w) {
        em_set_error(EM_ERR_NOMEM, "safetensors writer: out of memory");
        return NULL;
    }
    em_map_init(&w->names);
    return w;
}

void em_safetensors_writer_free(em_safetensors_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->len; i++) {
        free(w->items[i].name);
        em_release(w->items[i].t);
    }
    free(w->items);
    cJSON_Delete(w->meta);
    em_map_free(&w->names);
    free(w);
}

em_status em_safetensors_add(em_safetensors_writer *w, const char *name, const em_tensor *t)
{
    if (!w || !name || !t) return em_set_error(EM_ERR_INVALID, "safetensors_add: NULL argument");
    if (strcmp(name, "__metadata__") == 0)
        return em_set_error(EM_ERR_INVALID, "safetensors_add: \"__metadata__\" is reserved");
    if (em_map_gets(&w->names, name))
        return em_set_error(EM_ERR_INVALID, "safetensors_add: tensor \"%s\" added twice", name);
    if (!rec_dtype_name(em_dtype(t)))
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "safetensors_add: \"%s\": dtype %s has no "
                            "safetensors name",
                            name, em_scalar_name(em_dtype(t)));
    st_item it = {strdup(name), (em_tensor *)t};
    if (!it.name || !EM_VEC_PUSH(w, it)) {
        free(it.name);
        return em_set_error(EM_ERR_NOMEM, "safetensors_add: out of memory");
    }
    if (!em_map_puts(&w->names, name, (void *)(uintptr_t)w->len)) {
        free(it.name);
        w->len--;
        return em_last_status();
    }
    /* retained only once nothing can fail, so the caller's reference count stays balanced */
    em_retain((em_tensor *)t);
    return EM_OK;
}

em_status em_safetensors_add_metadata(em_safetensors_writer *w, const char *key, const char *value)
{
    if (!w || !key || !value)
        return em_set_error(EM_ERR_INVALID, "safetensors_add_metadata: NULL argument");
    if (!w->meta && !(w->meta = cJSON_CreateObject()))
        return em_set_error(EM_ERR_NOMEM, "safetensors_add_metadata: out of memory");
    cJSON *v = cJSON_CreateString(value);
    if (!v) return em_set_error(EM_ERR_NOMEM, "safetensors_add_metadata: out of memory");
    if (cJSON_GetObjectItemCaseSensitive(w->meta, key)) {
        cJSON_ReplaceItemInObjectCaseSensitive(w->meta, key, v);
    } else if (!cJSON_AddItemToObject(w->meta, key, v)) {
        cJSON_Delete(v);
        return em_set_error(EM_ERR_NOMEM, "safetensors_add_metadata: out of memory");
    }
    return EM_OK;
}

/* The header JSON (unpadded, malloc'd) with each tensor's offsets; NULL with the error set. */
static char *build_header(const em_safetensors_writer *w, size_t *data_size)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && w->meta) {
        cJSON *m = cJSON_Duplicate(w->meta, true);
        ok = m && cJSON_AddItemToObject(root, "__metadata__", m);
        if (!ok) cJSON_Delete(m);
    }
    size_t off = 0;
    for (size_t i = 0; ok && i < w->len; i++) {
        const em_tensor *t = w->items[i].t;
        size_t bytes = (size_t)em_numel(t) * em_scalar_size(em_dtype(t));
        em_shape s = em_shape_of(t);
        double dims[EM_MAX_RANK], offs[2] = {(double)off, (double)(off + bytes)};
        for (int d = 0; d < s.rank; d++) dims[d] = (double)s.d[d];
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToObject(root, w->items[i].name, e);
        if (!ok) {
            cJSON_Delete(e);
            break;
        }
        cJSON *sh = cJSON_CreateDoubleArray(dims, s.rank);
        cJSON *of = cJSON_CreateDoubleArray(offs, 2);
        ok = cJSON_AddStringToObject(e, "dtype", rec_dtype_name(em_dtype(t))) && sh && of;
        if (sh && !cJSON_AddItemToObject(e, "shape", sh)) cJSON_Delete(sh), ok = false;
        if (of && !cJSON_AddItemToObject(e, "data_offsets", of)) cJSON_Delete(of), ok = false;
        off += bytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) em_set_error(EM_ERR_NOMEM, "safetensors: out of memory building the header");
    *data_size = off;
    return json;
}

em_status em_safetensors_write(em_safetensors_writer *w, const char *path)
{
    if (!w || !path) return em_set_error(EM_ERR_INVALID, "safetensors_write: NULL argument");
    size_t data_size;
    char *json = build_header(w, &data_size);
    if (!json) return em_last_status();
    size_t hlen = strlen(json), padded = (hlen + 7) / 8 * 8;
    size_t total = 8 + padded + data_size;
    uint8_t *buf = malloc(total ? total : 1);
    if (!buf) {
        free(json);
        return em_set_error(EM_ERR_NOMEM, "cannot write %s: out of memory (%zu bytes)", path,
                            total);
    }
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    free(json);
    em_status st = EM_OK;
    size_t off = 8 + padded;
    for (size_t i = 0; i < w->len && st == EM_OK; i++) {
        const em_tensor *t = w->items[i].t;
        size_t bytes = (size_t)em_numel(t) * em_scalar_size(em_dtype(t));
        if (bytes) st = em_to_host(t, buf + off, bytes);
        if (st != EM_OK) em_error_context("cannot write %s: tensor \"%s\"", path, w->items[i].name);
        off += bytes;
    }
    if (st == EM_OK) st = em_file_write_atomic(path, buf, total);
    free(buf);
    return st;
}
