/* module.c — the module tree: a module owns named parameters and buffers (in insertion order) and
 * named children; full names join the path with dots ("h.0.attn.c_attn.weight"). Visiting walks
 * the tree depth first, own entries before children, which is the order optimizers and records
 * see. Also the small helpers the concrete modules share (src/nn/internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/internal.h"
#include "tensor/internal.h"

em_tensor *nn_own(em_tensor *t)
{
    if (t) tn_scope_forget(t);
    return t;
}

const char *nn_desc(const em_tensor *t, char *buf, size_t size)
{
    if (!t) {
        snprintf(buf, size, "NULL");
        return buf;
    }
    return em_describe(t, buf, size);
}

bool nn_check_last_dim(const char *op, const em_tensor *x, int min_rank, int64_t last)
{
    char b[96];
    if (!x) return false;
    em_scalar dt = em_dtype(x);
    bool is_float = dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16;
    if (!is_float || em_rank(x) < min_rank || em_dim(x, -1) != last) {
        em_set_error(EM_ERR_INVALID, "%s: expected a float input of shape [..., %lld], got %s", op,
                     (long long)last, nn_desc(x, b, sizeof b));
        return false;
    }
    return true;
}

void *nn_fail(em_module *m)
{
    em_module_free(m);
    return NULL;
}

em_tensor *nn_param(em_module *m, const char *name, em_scalar dtype, em_shape shape, bool decay)
{
    em_tensor *t = nn_own(em_zeros(m->dev, dtype, shape));
    if (!t) return NULL;
    return em_module_param(m, name, t, decay);
}

em_module *em_module_new(const char *kind, em_device *dev, size_t size)
{
    if (size < sizeof(em_module)) size = sizeof(em_module);
    em_module *m = calloc(1, size);
    if (!m) {
        em_set_error(EM_ERR_NOMEM, "module %s: out of host memory", kind ? kind : "?");
        return NULL;
    }
    m->kind = kind ? kind : "Module";
    m->dev = dev;
    m->training = true;
    return m;
}

void em_module_free(em_module *m)
{
    if (!m) return;
    if (m->destroy) m->destroy(m);
    for (int i = 0; i < m->nentries; i++) {
        em_release(m->entries[i].t);
        free(m->entries[i].name);
    }
    for (int i = 0; i < m->nchildren; i++) {
        em_module_free(m->children[i]);
        free(m->child_names[i]);
    }
    free(m->entries);
    free(m->children);
    free(m->child_names);
    free(m);
}

/* A local name is non-empty, has no dot, and is not taken by an entry or a child of m. */
static bool check_name(const char *op, em_module *m, const char *name)
{
    if (!name || !*name || strchr(name, '.')) {
        em_set_error(EM_ERR_INVALID, "%s: invalid name \"%s\" (non-empty, without dots)", op,
                     name ? name : "(null)");
        return false;
    }
    for (int i = 0; i < m->nentries; i++)
        if (!strcmp(m->entries[i].name, name)) goto taken;
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->child_names[i], name)) goto taken;
    return true;
taken:
    em_set_error(EM_ERR_INVALID, "%s: %s already has a member named \"%s\"", op, m->kind, name);
    return false;
}

static bool grow(void **items, int *cap, int need, size_t elem)
{
    size_t c = (size_t)*cap;
    if (!em_vec_grow(items, &c, (size_t)need, elem)) return false;
    *cap = (int)c;
    return true;
}

em_module *em_module_add(em_module *m, const char *name, em_module *child)
{
    if (!m || !child) {
        em_module_free(child);
        return NULL;
    }
    if (!check_name("em_module_add", m, name)) goto fail;
    if (m->nchildren == m->cap_children) {
        int cap = m->cap_children ? 2 * m->cap_children : 4;
        em_module **kids = realloc(m->children, (size_t)cap * sizeof *kids);
        if (kids) m->children = kids;
        char **names = kids ? realloc(m->child_names, (size_t)cap * sizeof *names) : NULL;
        if (names) m->child_names = names;
        if (!kids || !names) {
            em_set_error(EM_ERR_NOMEM, "em_module_add: out of host memory");
            goto fail;
        }
        m->cap_children = cap;
    }
    char *dup = strdup(name);
    if (!dup) {
        em_set_error(EM_ERR_NOMEM, "em_module_add: out of host memory");
        goto fail;
    }
    m->children[m->nchildren] = child;
    m->child_names[m->nchildren++] = dup;
    return child;
fail:
    em_module_free(child);
    return NULL;
}

static em_tensor *add_entry(const char *op, em_module *m, const char *name, em_tensor *t,
                            bool is_param, bool decay)
{
    if (!t) return NULL;
    if (!m) {
        em_release(t);
        return NULL;
    }
    nn_own(t);
    if (!check_name(op, m, name)) goto fail;
    if (is_param && em_set_requires_grad(t, true) != EM_OK) {
        em_error_context("%s \"%s\"", op, name);
        goto fail;
    }
    if (!grow((void **)&m->entries, &m->cap_entries, m->nentries + 1, sizeof *m->entries))
        goto fail;
    char *dup = strdup(name);
    if (!dup) {
        em_set_error(EM_ERR_NOMEM, "%s: out of host memory", op);
        goto fail;
    }
    m->entries[m->nentries++] = (em_module_entry){dup, t, is_param, is_param && decay};
    return t;
fail:
    em_release(t);
    return NULL;
}

em_tensor *em_module_param(em_module *m, const char *name, em_tensor *t, bool decay)
{
    return add_entry("em_module_param", m, name, t, true, decay);
}

em_tensor *em_module_buffer(em_module *m, const char *name, em_tensor *t)
{
    return add_entry("em_module_buffer", m, name, t, false, false);
}

/* Depth-first walk with the path so far in sb; false when fn asked to stop. */
static bool visit(em_module *m, em_strbuf *sb, em_module_visit_fn fn, void *user)
{
    size_t base = sb->len;
    for (int i = 0; i < m->nentries; i++) {
        sb->len = base;
        sb->data[base] = '\0';
        em_sb_append(sb, m->entries[i].name);
        if (sb->oom) return false;
        if (!fn(sb->data, &m->entries[i], user)) return false;
    }
    for (int i = 0; i < m->nchildren; i++) {
        sb->len = base;
        sb->data[base] = '\0';
        em_sb_append(sb, m->child_names[i]);
        em_sb_appendc(sb, '.');
        if (sb->oom) return false;
        if (!visit(m->children[i], sb, fn, user)) return false;
    }
    sb->len = base;
    sb->data[base] = '\0';
    return true;
}

void em_module_visit(em_module *m, em_module_visit_fn fn, void *user)
{
    if (!m || !fn) return;
    em_strbuf sb;
    em_sb_init(&sb);
    visit(m, &sb, fn, user);
    em_sb_free(&sb);
}

em_module_entry *em_module_find(em_module *m, const char *full_name)
{
    if (!m || !full_name) return NULL;
    const char *dot = strchr(full_name, '.');
    size_t n = dot ? (size_t)(dot - full_name) : strlen(full_name);
    if (!dot) {
        for (int i = 0; i < m->nentries; i++)
            if (!strcmp(m->entries[i].name, full_name)) return &m->entries[i];
        return NULL;
    }
    for (int i = 0; i < m->nchildren; i++)
        if (strlen(m->child_names[i]) == n && !strncmp(m->child_names[i], full_name, n))
            return em_module_find(m->children[i], dot + 1);
    return NULL;
}

int64_t em_module_num_params(em_module *m)
{
    if (!m) return 0;
    int64_t n = 0;
    for (int i = 0; i < m->nentries; i++)
        if (m->entries[i].is_param) n += em_numel(m->entries[i].t);
    for (int i = 0; i < m->nchildren; i++) n += em_module_num_params(m->children[i]);
    return n;
}

void em_module_train(em_module *m, bool training)
{
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++) em_module_train(m->children[i], training);
}

void em_module_zero_grad(em_module *m)
{
    if (!m) return;
    for (int i = 0; i < m->nentries; i++)
        if (m->entries[i].is_param) em_zero_grad(m->entries[i].t);
    for (int i = 0; i < m->nchildren; i++) em_module_zero_grad(m->children[i]);
}
