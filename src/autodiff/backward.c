/* backward.c — the reverse walk: em_backward and em_backward_retain. The op nodes reachable from
 * the root are put in topological order by an iterative depth-first search (graphs of tens of
 * thousands of nodes need no deep recursion); each node's gradient is accumulated on the node as
 * its consumers run, handed to its backward rule (with recording off) once every consumer ran,
 * then released. A rule's gradients are summed over broadcast dims to the input's shape
 * (ad_sum_to), cast to the input's dtype, and accumulated into the input's node, or into the
 * leaf's gradient. Without retain each node's saved tensors and edges are freed as soon as the
 * walk has passed it, so memory falls as the walk proceeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff/tape.h"

static atomic_ullong g_walk_id; /* a fresh id per walk marks the nodes it visited */

/* Puts the op nodes reachable from root in post-order (inputs first) into *out (each retained).
 * Returns the count, or -1 on out-of-memory. */
static int64_t topo_order(ad_node *root, ad_node ***out)
{
    typedef struct frame {
        ad_node *n;
        int next; /* the next edge to visit */
    } frame;
    uint64_t id = atomic_fetch_add(&g_walk_id, 1) + 1;
    frame *stack = NULL;
    ad_node **order = NULL;
    size_t nstack = 0, cstack = 0, norder = 0, corder = 0;
    if (!em_vec_grow((void **)&stack, &cstack, 1, sizeof *stack)) goto nomem;
    root->mark = id;
    stack[nstack++] = (frame){root, 0};
    while (nstack) {
        frame *f = &stack[nstack - 1];
        if (f->next < f->n->nin) {
            ad_node *e = f->n->edge[f->next++];
            if (!e || e->leaf || e->mark == id) continue;
            e->mark = id;
            if (!em_vec_grow((void **)&stack, &cstack, nstack + 1, sizeof *stack)) goto nomem;
            stack[nstack++] = (frame){e, 0};
            continue;
        }
        if (!em_vec_grow((void **)&order, &corder, norder + 1, sizeof *order)) goto nomem;
        order[norder++] = ad_node_retain(f->n);
        nstack--;
    }
    free(stack);
    *out = order;
    return (int64_t)norder;
nomem:
    for (size_t i = 0; i < norder; i++) ad_node_release(order[i]);
    free(order);
    free(stack);
    em_set_error(EM_ERR_NOMEM, "backward: out of host memory");
    return -1;
}

static em_status cs_flush(ad_node *n);

/* Adds g (a new reference, consumed) to what node n has received. */
static em_status accumulate(ad_node *n, em_tensor *g)
{
    em_tensor **slot = n->leaf ? &n->grad : &n->acc;
    if (n->leaf && !n->requires_grad) {
        em_release(g);
        return EM_OK;
    }
    if (!*slot) {
        /* the leaf's destination, written by the rule's op (ad_grad_dest), is kept as it is */
        bool dest = n->leaf && g == n->dest;
        if (n->leaf && !dest && (!em_tensor_exclusive(g) || !em_is_contiguous(g))) {
            /* a leaf's gradient is its own: never the storage of another gradient or the caller's
             */
            em_tensor *c = em_clone(g);
            em_release(g);
            if (!(g = c)) return em_last_status();
        }
        if (n->leaf && !dest) em_tensor_untrack(g);
        *slot = g;
        return EM_OK;
    }
    /* a destination whose column sums are pending (ad_defer_colsum) gets them first */
    if (n->leaf && n->cs_by) {
        em_status st = cs_flush(n->cs_by);
        if (st != EM_OK) {
            em_release(g);
            return st;
        }
    }
    em_tensor *sum = em_add(*slot, g);
    em_release(g);
    if (!sum) return em_last_status();
    if (n->leaf) em_tensor_untrack(sum);
    em_release(*slot);
    *slot = sum;
    return EM_OK;
}

void ad_cs_drop(ad_node *n)
{
    if (!n || !n->cs_g) return;
    n->cs_leaf->cs_by = NULL;
    em_release(n->cs_g);
    ad_node_release(n->cs_leaf);
    n->cs_g = NULL;
    n->cs_leaf = NULL;
}

/* Runs n's pending column sums (ad_defer_colsum) into their leaf's destination now. */
static em_status cs_flush(ad_node *n)
{
    if (!n->cs_g) return EM_OK;
    em_tensor *g = em_retain(n->cs_g), *dest = n->cs_leaf->dest; /* the leaf (a parameter's) holds it */
    ad_cs_drop(n);
    em_status st = em_sum_leading_into(dest, g);
    em_release(g);
    return st;
}

bool ad_defer_colsum(const ad_ctx *c, int i, int via, const em_tensor *g)
{
    const char *off = getenv("EMBER_MATMUL_BSUM"); /* "0": the sums at the add's rule (A/B) */
    if ((off && !strcmp(off, "0")) || !g || i < 0 || via < 0 || i >= c->nin || via >= c->nin ||
        i == via || !c->edge || !c->needs[i] || !c->needs[via] || !ad_grad_dest(c, i))
        return false;
    ad_node *leaf = c->edge[i], *mm = c->edge[via];
    em_shape gs = em_shape_of(g);
    if (!leaf->leaf || leaf->cs_by || mm->leaf || mm->op != EM_TOP_MATMUL || mm->cs_g ||
        gs.rank != c->in_shape[via].rank ||
        memcmp(gs.d, c->in_shape[via].d, sizeof(int64_t) * (size_t)gs.rank) != 0 ||
        em_dtype(g) != c->in_dtype[via])
        return false;
    mm->cs_g = em_retain((em_tensor *)g);
    mm->cs_leaf = ad_node_retain(leaf);
    leaf->cs_by = mm;
    return true;
}

em_tensor *ad_take_colsum(const ad_ctx *c, const em_tensor *g)
{
    ad_node *n = c->self;
    if (!n || !n->cs_g || n->cs_g != g) return NULL;
    em_tensor *d = n->cs_leaf->dest; /* the leaf (a parameter's) holds it */
    ad_cs_drop(n);
    return d;
}

/* The gradient for input i of n, as the input's shape and dtype (consumes g). */
static em_tensor *fit_to_input(const ad_node *n, int i, em_tensor *g)
{
    em_tensor *r = ad_sum_to(g, n->in_shape[i]);
    em_release(g);
    if (r && em_dtype(r) != n->in_dtype[i]) {
        em_tensor *c = em_cast(r, n->in_dtype[i]);
        em_release(r);
        r = c;
    }
    return r;
}

/* Prefixes the thread's error with "backward of <op>: " and returns st. */
static em_status rule_error(const ad_node *n, em_status st)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", em_last_error() ? em_last_error() : "failed");
    if (st == EM_OK) st = EM_ERR_INTERNAL;
    return em_set_error(st, "backward of %s: %s", em_top_name(n->op), msg);
}

em_tensor *ad_take_input(const ad_ctx *c, int i)
{
    if (i < 0 || i >= c->nin || !((c->takeable >> i) & 1u) || !c->owned || !c->owned[i])
        return NULL;
    em_tensor *t = c->owned[i];
    c->owned[i] = NULL;
    return em_take(t);
}

em_tensor *ad_take_out_grad(const ad_ctx *c, const em_tensor *g)
{
    if (!c->gout || *c->gout != g || !g) return (em_tensor *)g;
    em_tensor *t = *c->gout;
    *c->gout = NULL;
    em_tensor_untrack(t); /* the op's result (or nothing) owns it now, not a scope */
    return em_take(t);
}

em_tensor *ad_take_grad(const ad_ctx *c, int i)
{
    if (i < 0 || i >= c->nin || !c->needs[i] || !c->edge || !c->edge[i]) return NULL;
    ad_node *in = c->edge[i];
    em_tensor *t = in->leaf ? NULL : in->acc;
    if (!t || em_dtype(t) != c->in_dtype[i]) return NULL;
    em_shape s = em_shape_of(t);
    if (s.rank != c->in_shape[i].rank || memcmp(s.d, c->in_shape[i].d, sizeof(int64_t) * (size_t)s.rank))
        return NULL;
    in->acc = NULL;
    return t;
}

em_tensor *ad_grad_dest(const ad_ctx *c, int i)
{
    if (i < 0 || i >= c->nin || !c->needs[i] || !c->edge || !c->edge[i]) return NULL;
    ad_node *in = c->edge[i];
    em_tensor *d = in->leaf && in->requires_grad && !in->grad ? in->dest : NULL;
    if (!d || em_dtype(d) != c->in_dtype[i]) return NULL;
    em_shape s = em_shape_of(d);
    if (s.rank != c->in_shape[i].rank ||
        memcmp(s.d, c->in_shape[i].d, sizeof(int64_t) * (size_t)s.rank))
        return NULL;
    return d;
}

/* Runs n's rule on its accumulated gradient and passes the results to its inputs; with `last`
 * (the graph is not retained) a saved input the rule may take over is released by the node
 * first, so the rule's reference can be the only one. */
static em_status step(ad_node *n, bool last)
{
    em_tensor *g = n->acc;
    n->acc = NULL;
    if (!g) return cs_flush(n); /* only zero gradients reached it */
    const ad_rule *r = ad_rule_for(n->op);
    ad_ctx c;
    memset(&c, 0, sizeof c);
    c.op = n->op;
    c.p = &n->p;
    c.nin = n->nin;
    for (int i = 0; i < n->nin; i++) {
        c.in_shape[i] = n->in_shape[i];
        c.in_dtype[i] = n->in_dtype[i];
        c.in_present[i] = n->in_present[i];
        c.needs[i] = n->edge[i] != NULL;
    }
    c.out_shape = n->out_shape;
    c.out_dtype = n->out_dtype;
    c.edge = n->edge;
    c.gout = &g;
    c.self = n;
    em_tensor *gin[EM_TOP_MAX_INPUTS] = {NULL};
    em_status st = EM_OK;
    em_tensor *owned[EM_TOP_MAX_INPUTS] = {NULL};
    c.owned = owned;
    unsigned takes = ad_rule_take_inputs(n->op);
    for (int i = 0; i < n->nin && st == EM_OK; i++) {
        ad_saved *sv = n->saved_in[i];
        if (sv && !(owned[i] = ad_saved_get(sv))) {
            st = rule_error(n, em_last_status());
            break;
        }
        c.in[i] = owned[i];
        if (sv && last && ((takes >> i) & 1u) && sv->t && atomic_load(&sv->refs) == 1) {
            ad_saved_release(sv); /* the rule's reference is now the tape's only one */
            n->saved_in[i] = NULL;
            c.takeable |= 1u << i;
        }
    }
    if (st == EM_OK && n->saved_out && !(c.out = ad_saved_get(n->saved_out)))
        st = rule_error(n, em_last_status());
    if (st == EM_OK) {
        st = r->backward(&c, g, gin);
        if (st != EM_OK) st = rule_error(n, st);
    }
    /* column sums handed to this node and not taken by its rule */
    if (st == EM_OK && (st = cs_flush(n)) != EM_OK) st = rule_error(n, st);
    ad_cs_drop(n);
    for (int i = 0; i < n->nin; i++) em_release(owned[i]); /* those not taken */
    em_release((em_tensor *)c.out);
    em_release(g); /* NULL when the rule took it (ad_take_out_grad) */
    for (int i = 0; i < n->nin; i++) {
        em_tensor *gi = gin[i];
        gin[i] = NULL;
        if (!gi) continue;
        if (st != EM_OK || !n->edge[i]) {
            em_release(gi);
            continue;
        }
        em_tensor *fit = fit_to_input(n, i, gi);
        if (!fit) {
            st = rule_error(n, em_last_status());
            continue;
        }
        st = accumulate(n->edge[i], fit);
        if (st != EM_OK) st = rule_error(n, st);
    }
    return st;
}

/* The gradient of the root: grad_root (checked, cast to root's dtype) or ones for one element. */
static em_tensor *root_grad(const em_tensor *root, const em_tensor *grad_root)
{
    char a[128], b[128];
    em_shape rs = em_shape_of(root);
    if (!grad_root) {
        if (em_numel(root) != 1) {
            em_set_error(EM_ERR_INVALID,
                         "backward: grad_root may be NULL only for a tensor of one "
                         "element, got %s (pass d loss / d root)",
                         em_describe(root, a, sizeof a));
            return NULL;
        }
        return em_ones(em_tensor_device(root), em_dtype(root), rs);
    }
    em_shape gs = em_shape_of(grad_root);
    if (gs.rank != rs.rank || memcmp(gs.d, rs.d, sizeof(int64_t) * (size_t)rs.rank) != 0 ||
        em_tensor_device(grad_root) != em_tensor_device(root)) {
        em_set_error(EM_ERR_INVALID, "backward: grad_root %s does not match the root %s",
                     em_describe(grad_root, b, sizeof b), em_describe(root, a, sizeof a));
        return NULL;
    }
    if (em_dtype(grad_root) != em_dtype(root)) return em_cast(grad_root, em_dtype(root));
    return em_retain((em_tensor *)grad_root);
}

static em_status run_backward(em_tensor *root, const em_tensor *grad_root, bool retain)
{
    em_autodiff_init();
    if (!root)
        return em_last_status() != EM_OK
                   ? em_last_status()
                   : em_set_error(EM_ERR_INVALID, "backward: no tensor given");
    ad_node *rn = ad_node_of(root);
    if (!ad_node_wants(rn)) {
        if (rn && !rn->leaf)
            return em_set_error(EM_ERR_INVALID,
                                "backward: the graph of this tensor was already freed "
                                "by a backward (use em_backward_retain to backpropagate twice)");
        return em_set_error(EM_ERR_INVALID, "backward: the tensor does not require gradients (no "
                                            "tensor marked with em_set_requires_grad leads to it)");
    }
    em_status st = EM_OK;
    ad_node **order = NULL;
    int64_t norder = 0;
    em_scope_begin(); /* every tensor the walk makes is released by the end */
    em_no_grad_begin();
    em_tensor *g0 = root_grad(root, grad_root);
    if (!g0) {
        st = em_last_status();
        goto out;
    }
    if (rn->leaf) {
        st = accumulate(rn, g0);
        goto out;
    }
    norder = topo_order(rn, &order);
    if (norder < 0) {
        em_release(g0);
        st = EM_ERR_NOMEM;
        goto out;
    }
    for (int64_t i = 0; i < norder && st == EM_OK; i++) {
        if (order[i]->freed)
            st = em_set_error(EM_ERR_INVALID,
                              "backward: part of the graph (a %s) was already freed by "
                              "another backward (use em_backward_retain)",
                              em_top_name(order[i]->op));
        else if (order[i]->broken)
            st = em_set_error(EM_ERR_NOMEM, "backward: recording of a %s ran out of memory",
                              em_top_name(order[i]->op));
    }
    if (st != EM_OK) {
        em_release(g0);
        for (int64_t i = 0; i < norder; i++) ad_node_release(order[i]);
        goto out;
    }
    rn->acc = g0;
    for (int64_t i = norder - 1; i >= 0; i--) {
        ad_node *n = order[i];
        if (st == EM_OK) st = step(n, !retain);
        em_release(n->acc); /* only after an error */
        n->acc = NULL;
        if (!retain) ad_node_free_state(n);
        ad_node_release(n);
    }
out:
    free(order);
    em_no_grad_end();
    em_scope_end(NULL, 0);
    return st;
}

em_status em_backward(em_tensor *root, const em_tensor *grad_root)
{
    return run_backward(root, grad_root, false);
}

em_status em_backward_retain(em_tensor *root, const em_tensor *grad_root)
{
    return run_backward(root, grad_root, true);
}
