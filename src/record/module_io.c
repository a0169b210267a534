/* module_io.c — saving and loading a module tree's tensors (parameters and buffers) by full name
 * through safetensors files.
 *
 * Save writes every entry under its full name, in the tree's visit order, with the entry's dtype.
 * Load first matches every file tensor (after the optional rename callback) to a module entry and
 * checks shapes, and only then copies anything: a failed load leaves the module untouched. The
 * copy converts to the entry's dtype and goes into the existing tensor (em_copy_, no gradient
 * recorded), so references held elsewhere (optimizers) stay valid. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "record/internal.h"

#define LIST_MAX 8 /* names listed per kind in an error message before "and N more" */

/* ---- save --------------------------------------------------------------------------------------
 */

typedef struct save_ctx {
    em_safetensors_writer *w;
    em_status st;
} save_ctx;

static bool save_one(const char *full_name, em_module_entry *e, void *user)
{
    save_ctx *c = user;
    c->st = em_safetensors_add(c->w, full_name, e->t);
    return c->st == EM_OK;
}

em_status em_module_save(em_module *m, const char *path)
{
    if (!m || !path) return em_set_error(EM_ERR_INVALID, "module_save: NULL argument");
    save_ctx c = {em_safetensors_writer_new(), EM_OK};
    if (!c.w) return em_last_status();
    em_module_visit(m, save_one, &c);
    if (c.st == EM_OK) c.st = em_safetensors_write(c.w, path);
    em_safetensors_writer_free(c.w);
    return c.st;
}

/* ---- load --------------------------------------------------------------------------------------
 */

/* One module entry and the file tensor matched to it. */
typedef struct slot {
    char *name;            /* full name (owned) */
    em_module_entry *e;    /* borrowed from the module */
    const char *file_name; /* the matched file tensor (borrowed from the file), or NULL */
    bool seen;             /* some file tensor maps to it (possibly mis-shaped) */
} slot;

typedef struct load_ctx {
    slot *items;
    size_t len, cap;
    em_map by_name; /* full name -> slot index + 1 */
    bool oom;
} load_ctx;

static bool collect(const char *full_name, em_module_entry *e, void *user)
{
    load_ctx *c = user;
    slot s = {strdup(full_name), e, NULL, false};
    if (!s.name || !EM_VEC_PUSH(c, s)) {
        free(s.name);
        c->oom = true;
        return false;
    }
    /* from here the slot owns the name (freed with the list) */
    c->oom = !em_map_puts(&c->by_name, full_name, (void *)(uintptr_t)c->len);
    return !c->oom;
}

/* A list of names for messages: "a, b, c and 4 more". */
typedef struct name_list {
    em_strbuf sb;
    int n;
} name_list;

static void list_add(name_list *l, const char *fmt, const char *name, const char *extra)
{
    if (l->n++ >= LIST_MAX) return;
    if (l->n > 1) em_sb_append(&l->sb, ", ");
    em_sb_printf(&l->sb, fmt, name, extra);
}

static void list_end(name_list *l)
{
    if (l->n > LIST_MAX) em_sb_printf(&l->sb, " and %d more", l->n - LIST_MAX);
}

static bool same_shape(em_shape a, em_shape b)
{
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

static void shape_text(em_shape s, char *buf, size_t size)
{
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < s.rank && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)s.d[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
}

/* Matches the file's tensors to c's slots; fills the three lists. */
static void match(const em_safetensors *f, load_ctx *c, em_name_map_fn rename, void *user,
                  name_list *unexpected, name_list *misshaped)
{
    char buf[1024];
    for (int i = 0; i < em_safetensors_count(f); i++) {
        const char *fname = em_safetensors_name(f, i);
        const char *mname = rename ? rename(fname, buf, sizeof buf, user) : fname;
        if (!mname) continue; /* skipped by the caller's mapping */
        uintptr_t k = (uintptr_t)em_map_gets(&c->by_name, mname);
        if (!k) {
            list_add(unexpected, "%s%s", fname, "");
            continue;
        }
        slot *s = &c->items[k - 1];
        if (s->seen) { /* two file tensors map to one name */
            list_add(unexpected, "%s%s", fname, " (duplicate)");
            continue;
        }
        s->seen = true;
        em_shape fs;
        em_scalar dt;
        em_safetensors_info(f, fname, &dt, &fs);
        em_shape ms = em_shape_of(s->e->t);
        char why[400];
        if (!same_shape(fs, ms)) {
            char a[160], b[160];
            shape_text(fs, a, sizeof a);
            shape_text(ms, b, sizeof b);
            snprintf(why, sizeof why, " (file %s vs model %s)", a, b);
            list_add(misshaped, "%s%s", mname, why);
            continue;
        }
        if (!rec_dtype_loadable(dt)) { /* refused before anything is copied */
            snprintf(why, sizeof why, " (dtype %s not supported)", rec_dtype_name(dt));
            list_add(misshaped, "%s%s", mname, why);
            continue;
        }
        s->file_name = fname;
    }
}

/* Copies every matched file tensor into its entry. */
static em_status copy_matched(const em_safetensors *f, load_ctx *c)
{
    em_status st = EM_OK;
    em_no_grad_begin();
    for (size_t i = 0; i < c->len && st == EM_OK; i++) {
        slot *s = &c->items[i];
        if (!s->file_name) continue;
        em_tensor *t =
            em_safetensors_load(f, s->file_name, em_tensor_device(s->e->t), em_dtype(s->e->t));
        st = t ? em_copy_(s->e->t, t) : em_last_status();
        em_release(t);
        if (st != EM_OK) em_error_context("loading \"%s\"", s->name);
    }
    em_no_grad_end();
    return st;
}

em_status em_module_load(em_module *m, const char *path, bool strict, em_name_map_fn rename,
                         void *user)
{
    if (!m || !path) return em_set_error(EM_ERR_INVALID, "module_load: NULL argument");
    em_safetensors *f = em_safetensors_open(path);
    if (!f) return em_last_status();
    load_ctx c = {0};
    em_map_init(&c.by_name);
    em_module_visit(m, collect, &c);
    name_list missing = {0}, unexpected = {0}, misshaped = {0};
    em_sb_init(&missing.sb);
    em_sb_init(&unexpected.sb);
    em_sb_init(&misshaped.sb);
    em_status st = EM_OK;
    if (c.oom) {
        st = em_set_error(EM_ERR_NOMEM, "module_load %s: out of memory", path);
    } else {
        match(f, &c, rename, user, &unexpected, &misshaped);
        for (size_t i = 0; i < c.len; i++)
            if (!c.items[i].seen) list_add(&missing, "%s%s", c.items[i].name, "");
        list_end(&missing);
        list_end(&unexpected);
        list_end(&misshaped);
        if (misshaped.n || (strict && (missing.n || unexpected.n))) {
            st = em_set_error(EM_ERR_INVALID,
                              "module_load %s: %d missing%s%s, %d unexpected%s%s, "
                              "%d mis-shaped%s%s",
                              path, missing.n, missing.n ? ": " : "", missing.sb.data, unexpected.n,
                              unexpected.n ? ": " : "", unexpected.sb.data, misshaped.n,
                              misshaped.n ? ": " : "", misshaped.sb.data);
        } else {
            if (missing.n)
                EM_LOGW("module_load %s: %d missing: %s", path, missing.n, missing.sb.data);
            if (unexpected.n)
                EM_LOGW("module_load %s: %d unexpected (ignored): %s", path, unexpected.n,
                        unexpected.sb.data);
            st = copy_matched(f, &c);
        }
    }
    em_sb_free(&missing.sb);
    em_sb_free(&unexpected.sb);
    em_sb_free(&misshaped.sb);
    for (size_t i = 0; i < c.len; i++) free(c.items[i].name);
    free(c.items);
    em_map_free(&c.by_name);
    em_safetensors_close(f);
    return st;
}
