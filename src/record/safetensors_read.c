/* safetensors_read.c — opening, validating and loading safetensors files.
 *
 * The file is mapped read-only (em_mmap_open). Its layout: an 8-byte little-endian header length
 * N, N bytes of JSON (an object: name -> {"dtype", "shape", "data_offsets": [begin, end]}, and an
 * optional "__metadata__" object of string values; trailing spaces pad it), then the data section,
 * to which the offsets are relative. Open validates everything a later load relies on, so that no
 * input — however malformed — makes a load read outside the map:
 *   - the header length fits in the file (and under MAX_HEADER), the JSON is one object followed
 *     only by whitespace, names are unique;
 *   - each dtype is a known name, each shape a list of at most EM_MAX_RANK non-negative integers,
 *     the offsets two integers with begin <= end <= size of the data section, and
 *     numel(shape) x dtype size == end - begin (without overflow);
 *   - taken in offset order, no two tensors overlap. Entries may appear in any order in the JSON
 *     and the data section may have gaps (both are lenient: nothing can go wrong because of them).
 * Loading copies the bytes into a new tensor on the chosen device (em_from_host; no zero-copy, also
 * not on the CPU device) and converts it with em_cast. When the device cannot hold the file's
 * dtype (lavapipe has no 16-bit storage), the conversion runs on the CPU device first. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "record/internal.h"

#define MAX_HEADER (100u << 20) /* larger headers are refused (as the reference implementation) */
#define MAX_EXACT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact integers */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; big-endian hosts need byte swapping here"
#endif

/* One tensor of the file. */
typedef struct st_entry {
    char *name;      /* owned */
    em_scalar dtype; /* the file's dtype */
    em_shape shape;  /* its shape */
    uint64_t begin;  /* byte offsets into the data section */
    uint64_t end;
} st_entry;

struct em_safetensors {
    char *path;          /* owned copy, for messages */
    em_mmap map;         /* the whole file */
    const uint8_t *data; /* start of the data section (inside map) */
    uint64_t data_size;  /* its length */
    st_entry *entries;   /* in header order */
    int count;
    em_map by_name; /* name -> st_entry* */
    char **meta;    /* metadata key, value, key, value, ... (owned) */
    int nmeta;      /* number of pairs */
};

/* ---- dtype names --------------------------------------------------------------------------------
 */

static const struct {
    const char *name;
    em_scalar s;
} DTYPES[] = {
    {"F64", EM_F64}, {"F32", EM_F32}, {"F16", EM_F16},   {"BF16", EM_BF16}, {"I64", EM_I64},
    {"I32", EM_I32}, {"I16", EM_I16}, {"I8", EM_I8},     {"U64", EM_U64},   {"U32", EM_U32},
    {"U16", EM_U16}, {"U8", EM_U8},   {"BOOL", EM_BOOL},
};

const char *rec_dtype_name(em_scalar s)
{
    for (size_t i = 0; i < EM_ARRAY_LEN(DTYPES); i++)
        if (DTYPES[i].s == s) return DTYPES[i].name;
    return NULL;
}

em_scalar rec_dtype_parse(const char *name)
{
    for (size_t i = 0; i < EM_ARRAY_LEN(DTYPES); i++)
        if (strcmp(DTYPES[i].name, name) == 0) return DTYPES[i].s;
    return EM_SCALAR_COUNT;
}

bool rec_dtype_loadable(em_scalar s)
{
    switch (s) {
    case EM_F64:
    case EM_F32:
    case EM_F16:
    case EM_BF16:
    case EM_I64:
    case EM_I32:
    case EM_U8:
    case EM_BOOL:
        return true;
    default:
        return false;
    }
}

/* ---- validation ------------------------------------------------------------------------------ */

/* A JSON number that is an exact non-negative integer, in *out. */
static bool json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= MAX_EXACT) || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

/* Fills e from the JSON description of tensor `name`; the error names the file and the tensor. */
static em_status parse_entry(const em_safetensors *f, const cJSON *j, st_entry *e)
{
    const char *p = f->path, *n = e->name;
    if (!cJSON_IsObject(j))
        return em_set_error(EM_ERR_CORRUPT, "%s: tensor \"%s\": not a JSON object", p, n);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return em_set_error(EM_ERR_CORRUPT,
                            "%s: tensor \"%s\": needs \"dtype\" (a string), \"shape\" and "
                            "\"data_offsets\" (arrays)",
                            p, n);
    e->dtype = rec_dtype_parse(dt->valuestring);
    if (e->dtype == EM_SCALAR_COUNT)
        return em_set_error(EM_ERR_CORRUPT, "%s: tensor \"%s\": unknown dtype \"%.40s\"", p, n,
                            dt->valuestring);
    int rank = cJSON_GetArraySize(shape);
    if (rank > EM_MAX_RANK)
        return em_set_error(EM_ERR_UNSUPPORTED, "%s: tensor \"%s\": rank %d exceeds ember's %d", p,
                            n, rank, EM_MAX_RANK);
    e->shape.rank = rank;
    /* the byte count, computed without overflow: nonzero dims multiply `nz` (capped, as empty
     * tensors may not claim absurd dims either: the tensor layer multiplies them in int64) */
    uint64_t nz = 1, cap = (uint64_t)1 << 53;
    bool empty = false, too_big = false;
    int i = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_uint(d, &v))
            return em_set_error(EM_ERR_CORRUPT,
                                "%s: tensor \"%s\": shape dim %d is not a non-negative integer", p,
                                n, i);
        e->shape.d[i] = (int64_t)v;
        if (v == 0)
            empty = true;
        else if (nz > cap / v)
            too_big = true;
        else
            nz *= v;
    }
    uint64_t size = em_scalar_size(e->dtype);
    if (!empty && !too_big && nz > f->data_size / size) too_big = true;
    uint64_t bytes = empty || too_big ? 0 : nz * size;
    if (cJSON_GetArraySize(offs) != 2 || !json_uint(offs->child, &e->begin) ||
        !json_uint(offs->child->next, &e->end) || e->begin > e->end)
        return em_set_error(EM_ERR_CORRUPT,
                            "%s: tensor \"%s\": data_offsets must be [begin, end] with "
                            "0 <= begin <= end",
                            p, n);
    if (e->end > f->data_size)
        return em_set_error(EM_ERR_CORRUPT,
                            "%s: tensor \"%s\": data_offsets [%llu, %llu] exceed the data section "
                            "(%llu bytes)",
                            p, n, (unsigned long long)e->begin, (unsigned long long)e->end,
                            (unsigned long long)f->data_size);
    if (too_big || bytes != e->end - e->begin)
        return em_set_error(EM_ERR_CORRUPT,
                            "%s: tensor \"%s\": %s of that shape does not take the %llu bytes of "
                            "its data_offsets",
                            p, n, dt->valuestring, (unsigned long long)(e->end - e->begin));
    return EM_OK;
}

static em_status parse_metadata(em_safetensors *f, const cJSON *j)
{
    if (!cJSON_IsObject(j))
        return em_set_error(EM_ERR_CORRUPT, "%s: __metadata__ is not a JSON object", f->path);
    int n = cJSON_GetArraySize(j);
    f->meta = calloc((size_t)n * 2 + 1, sizeof(char *));
    if (!f->meta) return em_set_error(EM_ERR_NOMEM, "%s: out of memory", f->path);
    for (const cJSON *m = j->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return em_set_error(EM_ERR_CORRUPT, "%s: __metadata__ value of \"%s\" is not a string",
                                f->path, m->string);
        f->meta[2 * f->nmeta] = strdup(m->string);
        f->meta[2 * f->nmeta + 1] = strdup(m->valuestring);
        f->nmeta++;
        if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
            return em_set_error(EM_ERR_NOMEM, "%s: out of memory", f->path);
    }
    return EM_OK;
}

static int by_offset(const void *a, const void *b)
{
    const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Taken in offset order, no two tensors may share a byte. */
static em_status check_overlaps(em_safetensors *f)
{
    if (f->count < 2) return EM_OK;
    st_entry **order = malloc(sizeof *order * (size_t)f->count);
    if (!order) return em_set_error(EM_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->count; i++) order[i] = &f->entries[i];
    qsort(order, (size_t)f->count, sizeof *order, by_offset);
    em_status st = EM_OK;
    uint64_t reach = 0; /* end of the data claimed so far */
    const st_entry *last = NULL;
    for (int i = 0; i < f->count && st == EM_OK; i++) {
        const st_entry *e = order[i];
        if (e->begin == e->end) continue; /* empty tensors claim nothing */
        if (last && e->begin < reach)
            st = em_set_error(EM_ERR_CORRUPT, "%s: tensors \"%s\" and \"%s\" overlap", f->path,
                              last->name, e->name);
        reach = e->end;
        last = e;
    }
    free(order);
    return st;
}

static em_status parse_header(em_safetensors *f, const char *json, size_t len)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) return em_set_error(EM_ERR_CORRUPT, "%s: the header is not valid JSON", f->path);
    em_status st = EM_OK;
    for (const char *q = end; q && q < json + len && st == EM_OK; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r')
            st = em_set_error(EM_ERR_CORRUPT, "%s: bytes after the header's JSON", f->path);
    if (st == EM_OK && !cJSON_IsObject(root))
        st = em_set_error(EM_ERR_CORRUPT, "%s: the header is not a JSON object", f->path);
    int n = st == EM_OK ? cJSON_GetArraySize(root) : 0;
    if (st == EM_OK && n > 0 && !(f->entries = calloc((size_t)n, sizeof *f->entries)))
        st = em_set_error(EM_ERR_NOMEM, "%s: out of memory", f->path);
    for (const cJSON *j = st == EM_OK ? root->child : NULL; j && st == EM_OK; j = j->next) {
        if (strcmp(j->string, "__metadata__") == 0) {
            if (f->meta)
                st = em_set_error(EM_ERR_CORRUPT, "%s: two __metadata__", f->path);
            else
                st = parse_metadata(f, j);
            continue;
        }
        st_entry *e = &f->entries[f->count];
        if (!(e->name = strdup(j->string))) {
            st = em_set_error(EM_ERR_NOMEM, "%s: out of memory", f->path);
            break;
        }
        f->count++;
        st = parse_entry(f, j, e);
        if (st == EM_OK && em_map_gets(&f->by_name, e->name))
            st = em_set_error(EM_ERR_CORRUPT, "%s: tensor \"%s\" appears twice", f->path, e->name);
        if (st == EM_OK && !em_map_puts(&f->by_name, e->name, e)) st = em_last_status();
    }
    cJSON_Delete(root);
    return st == EM_OK ? check_overlaps(f) : st;
}

em_safetensors *em_safetensors_open(const char *path)
{
    em_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        em_set_error(EM_ERR_NOMEM, "cannot open %s: out of memory", path);
        return NULL;
    }
    em_map_init(&f->by_name);
    em_status st = em_mmap_open(&f->map, path);
    const uint8_t *bytes = f->map.data;
    uint64_t header = 0;
    if (st == EM_OK && f->map.size < 8)
        st = em_set_error(EM_ERR_CORRUPT, "%s: too short for a safetensors file (%zu bytes)", path,
                          f->map.size);
    if (st == EM_OK) {
        for (int i = 7; i >= 0; i--) header = header << 8 | bytes[i];
        if (header > f->map.size - 8 || header > MAX_HEADER)
            st = em_set_error(EM_ERR_CORRUPT,
                              "%s: header length %llu exceeds the file (%zu bytes) or %u MiB", path,
                              (unsigned long long)header, f->map.size, MAX_HEADER >> 20);
    }
    if (st == EM_OK) {
        f->data = bytes + 8 + header;
        f->data_size = f->map.size - 8 - header;
        st = parse_header(f, (const char *)bytes + 8, (size_t)header);
    }
    if (st != EM_OK) {
        em_safetensors_close(f);
        return NULL;
    }
    return f;
}

void em_safetensors_close(em_safetensors *f)
{
    if (!f) return;
    for (int i = 0; i < f->count; i++) free(f->entries[i].name);
    free(f->entries);
    for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
    free(f->meta);
    em_map_free(&f->by_name);
    em_mmap_close(&f->map);
    free(f->path);
    free(f);
}

/* ---- queries --------------------------------------------------------------------------------- */

int em_safetensors_count(const em_safetensors *f)
{
    return f ? f->count : 0;
}

const char *em_safetensors_name(const em_safetensors *f, int i)
{
    return f && i >= 0 && i < f->count ? f->entries[i].name : NULL;
}

bool em_safetensors_info(const em_safetensors *f, const char *name, em_scalar *dtype,
                         em_shape *shape)
{
    const st_entry *e = f && name ? em_map_gets(&f->by_name, name) : NULL;
    if (!e) return false;
    if (dtype) *dtype = e->dtype;
    if (shape) *shape = e->shape;
    return true;
}

const char *em_safetensors_metadata(const em_safetensors *f, const char *key)
{
    for (int i = 0; f && key && i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

/* ---- loading -----------------------------------------------------------------------------------
 */

/* A tensor of the file's dtype on dev holding e's bytes (bool bytes normalized to 0/1). */
static em_tensor *raw_tensor(const em_safetensors *f, const st_entry *e, em_device *dev)
{
    const uint8_t *src = f->data + e->begin;
    size_t n = (size_t)(e->end - e->begin);
    if (e->dtype != EM_BOOL || n == 0) return em_from_host(dev, e->dtype, e->shape, src);
    uint8_t *b = malloc(n);
    if (!b) {
        em_set_error(EM_ERR_NOMEM, "%s: out of memory loading \"%s\"", f->path, e->name);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) b[i] = src[i] != 0;
    em_tensor *t = em_from_host(dev, EM_BOOL, e->shape, b);
    free(b);
    return t;
}

em_tensor *em_safetensors_load(const em_safetensors *f, const char *name, em_device *dev,
                               em_scalar dtype)
{
    if (!f || !name || !dev) {
        em_set_error(EM_ERR_INVALID, "safetensors_load: NULL argument");
        return NULL;
    }
    const st_entry *e = em_map_gets(&f->by_name, name);
    if (!e) {
        em_set_error(EM_ERR_NOT_FOUND, "%s: no tensor \"%s\"", f->path, name);
        return NULL;
    }
    if (!rec_dtype_loadable(e->dtype)) {
        em_set_error(EM_ERR_UNSUPPORTED,
                     "%s: tensor \"%s\": dtype %s is not supported (ember tensors hold F64 F32 "
                     "F16 BF16 I64 I32 U8 BOOL)",
                     f->path, name, rec_dtype_name(e->dtype));
        return NULL;
    }
    if (dtype != EM_SCALAR_COUNT && !rec_dtype_loadable(dtype)) {
        em_set_error(EM_ERR_UNSUPPORTED, "%s: cannot load \"%s\" as %s", f->path, name,
                     em_scalar_name(dtype));
        return NULL;
    }
    if (dtype == EM_SCALAR_COUNT) dtype = e->dtype;
    const em_caps *caps = em_device_caps(dev);
    em_tensor *out = NULL;
    if (dtype == e->dtype || !caps || caps->dtype[e->dtype]) {
        em_tensor *raw = raw_tensor(f, e, dev);
        out = raw && dtype != e->dtype ? em_cast(raw, dtype) : em_retain(raw);
        em_release(raw);
    } else { /* the device cannot hold the file's dtype: convert on the CPU device first */
        em_device *cpu = em_device_open("cpu");
        em_tensor *raw = cpu ? raw_tensor(f, e, cpu) : NULL;
        em_tensor *conv = raw ? em_cast(raw, dtype) : NULL;
        out = conv ? em_to_device(conv, dev) : NULL;
        em_release(conv);
        em_release(raw);
        if (cpu) em_device_close(cpu);
    }
    if (!out) em_error_context("%s: loading \"%s\"", f->path, name);
    return out;
}
