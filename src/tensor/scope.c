/* scope.c — thread-local nested scopes. A scope holds the creation reference of every tensor made
 * while it is the innermost open one; em_scope_end releases them, except those kept, which move to
 * the enclosing scope (or to the caller when there is none). A scope-held tensor whose last
 * reference is released explicitly leaves its scope as it is freed, so nothing is released twice;
 * a retain/release pair leaves the scope's reference in place. */
#include <stdlib.h>

#include "tensor/internal.h"

typedef struct scope {
    struct scope *parent; /* the enclosing scope */
    em_tensor **items;    /* held tensors; NULL slots were released or kept */
    size_t len, cap;
} scope;

static _Thread_local scope *g_top; /* the innermost open scope of this thread */

void em_scope_begin(void)
{
    scope *s = calloc(1, sizeof *s);
    if (!s) {
        /* Without memory the scope cannot track; tensors then belong to the enclosing scope. */
        em_set_error(EM_ERR_NOMEM, "scope: out of host memory");
        return;
    }
    s->parent = g_top;
    g_top = s;
}

static void scope_add(scope *s, em_tensor *t)
{
    if (!em_vec_grow((void **)&s->items, &s->cap, s->len + 1, sizeof *s->items)) {
        t->scope = NULL; /* untracked: the caller owns it */
        return;
    }
    t->scope = s;
    t->scope_slot = s->len;
    s->items[s->len++] = t;
}

em_tensor *tn_scope_track(em_tensor *t)
{
    if (t && g_top) scope_add(g_top, t);
    return t;
}

void tn_scope_forget(em_tensor *t)
{
    scope *s = t->scope;
    if (s && t->scope_slot < s->len && s->items[t->scope_slot] == t) s->items[t->scope_slot] = NULL;
    t->scope = NULL;
}

/* Moves t from its scope to the parent of the current scope (or to the caller). */
static void keep_one(em_tensor *t)
{
    if (!t || !t->scope) return;
    scope *s = t->scope;
    tn_scope_forget(t);
    if (s->parent) scope_add(s->parent, t);
}

em_tensor *em_keep(em_tensor *t)
{
    keep_one(t);
    return t;
}

void em_scope_end(em_tensor *const *keep, size_t nkeep)
{
    scope *s = g_top;
    if (!s) return;
    for (size_t i = 0; i < nkeep; i++)
        if (keep[i] && keep[i]->scope == s) keep_one(keep[i]);
    g_top = s->parent;
    for (size_t i = 0; i < s->len; i++) {
        em_tensor *t = s->items[i];
        if (t) {
            t->scope = NULL;
            em_release(t);
        }
    }
    free(s->items);
    free(s);
}
