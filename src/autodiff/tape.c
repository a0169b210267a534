/* tape.c — the tape: autodiff's op recorder (installed into the tensor layer through
 * em_set_op_recorder), the nodes it builds, leaves and their gradients, and the user API on
 * tensors (requires_grad, grad, detach, stats).
 *
 * Every tensor that takes part in differentiation carries a node in its annotation slot: a leaf
 * node for tensors marked with em_set_requires_grad (it holds the accumulated gradient), an op
 * node for results of recorded ops. An op node holds its op and params, an edge to the node of
 * each input that wants a gradient, and what its backward rule reads (ad_saved: detached aliases,
 * or recipes under the recompute policy). Nodes are reference-counted: by the annotation of their
 * output tensor and by their consumers' edges; releasing a long chain is iterative. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff/tape.h"

/* ---- stats ----------------------------------------------------------------------------------- */

static atomic_llong g_nodes, g_bytes;

void ad_stats_nodes(int64_t delta)
{
    atomic_fetch_add(&g_nodes, (long long)delta);
}
void ad_stats_bytes(int64_t delta)
{
    atomic_fetch_add(&g_bytes, (long long)delta);
}

em_tape_stats em_tape_stats_get(void)
{
    em_tape_stats s = {atomic_load(&g_nodes), atomic_load(&g_bytes)};
    return s;
}

/* ---- nodes ----------------------------------------------------------------------------------- */

ad_node *ad_node_of(const em_tensor *t)
{
    return (ad_node *)em_tensor_annotation(t);
}

ad_node *ad_node_retain(ad_node *n)
{
    if (n) atomic_fetch_add(&n->refs, 1);
    return n;
}

void ad_node_free_state(ad_node *n)
{
    if (!n || n->leaf || n->freed) return;
    n->freed = true;
    ad_cs_drop(n);
    for (int i = 0; i < n->nin; i++) {
        ad_saved_release(n->saved_in[i]);
        n->saved_in[i] = NULL;
    }
    ad_saved_release(n->saved_out);
    ad_saved_release(n->recipe);
    n->saved_out = n->recipe = NULL;
    em_release(n->acc);
    n->acc = NULL;
    for (int i = 0; i < n->nin; i++) {
        ad_node *e = n->edge[i];
        n->edge[i] = NULL;
        ad_node_release(e);
    }
    ad_stats_nodes(-1);
}

/* Releasing a node may release its inputs' nodes, and so on down a chain of thousands: the nodes
 * to release are kept on a per-thread stack, drained by the outermost call. */
static _Thread_local ad_node **g_pending;
static _Thread_local size_t g_npending, g_cap_pending;
static _Thread_local bool g_draining;

static void node_destroy(ad_node *n)
{
    ad_node_free_state(n); /* pushes the edges (we are draining) */
    em_release(n->grad);
    em_release(n->dest);
    free(n);
}

void ad_node_release(ad_node *n)
{
    if (!n) return;
    if (g_draining) {
        if (em_vec_grow((void **)&g_pending, &g_cap_pending, g_npending + 1, sizeof *g_pending)) {
            g_pending[g_npending++] = n;
            return;
        }
        /* no memory for the stack: release right here (recursion, but correct) */
        if (atomic_fetch_sub(&n->refs, 1) == 1) node_destroy(n);
        return;
    }
    g_draining = true;
    if (atomic_fetch_sub(&n->refs, 1) == 1) node_destroy(n);
    while (g_npending) {
        ad_node *m = g_pending[--g_npending];
        if (atomic_fetch_sub(&m->refs, 1) == 1) node_destroy(m);
    }
    free(g_pending);
    g_pending = NULL;
    g_cap_pending = 0;
    g_draining = false;
}

bool ad_node_wants(const ad_node *n)
{
    return n && (n->leaf ? n->requires_grad : !n->freed);
}

/* ---- recording ------------------------------------------------------------------------------- */

/* What a node keeps of input or output t: the recipe of the op that made it, when that op was
 * recorded under the recompute policy, else a held alias. */
static ad_saved *save_tensor(const em_tensor *t)
{
    ad_node *m = ad_node_of(t);
    if (m && !m->leaf && m->recipe) return ad_saved_retain(m->recipe);
    return ad_saved_hold(t);
}

static ad_saved *new_recipe(const ad_node *n, const em_tensor *const *in)
{
    ad_saved *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    atomic_init(&r->refs, 1);
    r->op = n->op;
    r->p = n->p;
    r->nin = n->nin;
    r->dtype = n->out_dtype;
    r->shape = n->out_shape;
    for (int i = 0; i < n->nin; i++) {
        if (!in[i]) continue;
        r->in[i] = n->saved_in[i] ? ad_saved_retain(n->saved_in[i]) : save_tensor(in[i]);
        if (!r->in[i]) {
            ad_saved_release(r);
            return NULL;
        }
    }
    return r;
}

/* A reshape or permute of a tensor that is itself a recipe: a recipe too (replayed as the same
 * view of the recomputed tensor). Otherwise a consumer saving the view (a Linear saves its input
 * reshaped to 2-D) would hold the recomputable tensor's storage through it. */
static bool view_of_recipe(const ad_node *n, const em_tensor *const *in)
{
    if (n->op != EM_TOP_RESHAPE && n->op != EM_TOP_PERMUTE) return false;
    const ad_node *m = n->nin >= 1 && in[0] ? ad_node_of(in[0]) : NULL;
    return m && !m->leaf && m->recipe;
}

static bool save_all(ad_node *n, const ad_rule *r, const em_tensor *const *in, em_tensor *out)
{
    for (int i = 0; i < n->nin; i++)
        if ((r->save_inputs >> i) & 1u && in[i] && !(n->saved_in[i] = save_tensor(in[i])))
            return false;
    if (em_recompute_policy_get() == EM_RECOMPUTE_ELEMENTWISE &&
        (ad_recomputable(n->op) || view_of_recipe(n, in)) && !(n->recipe = new_recipe(n, in)))
        return false;
    if (r->save_output &&
        !(n->saved_out = n->recipe ? ad_saved_retain(n->recipe) : ad_saved_hold(out)))
        return false;
    return true;
}

static void record(em_tensor_op op, const em_top_params *p, const em_tensor *const *in, int nin,
                   em_tensor *out)
{
    if (!em_grad_enabled() || ad_node_of(out) || nin > EM_TOP_MAX_INPUTS) return;
    const ad_rule *r = ad_rule_for(op);
    if (!r->backward) return;
    bool any = false;
    for (int i = 0; i < nin; i++)
        if (in[i] && ad_node_wants(ad_node_of(in[i])) && em_scalar_is_float(em_dtype(in[i])))
            any = true;
    if (!any) return;
    ad_node *n = calloc(1, sizeof *n);
    if (!n) return; /* no memory even for the node: the result does not require gradients */
    atomic_init(&n->refs, 1); /* the annotation's */
    n->requires_grad = true;
    n->op = op;
    n->p = *p;
    n->nin = nin;
    for (int i = 0; i < nin; i++) {
        n->in_present[i] = in[i] != NULL;
        if (!in[i]) continue;
        n->in_shape[i] = em_shape_of(in[i]);
        n->in_dtype[i] = em_dtype(in[i]);
        ad_node *e = ad_node_of(in[i]);
        if (ad_node_wants(e) && em_scalar_is_float(em_dtype(in[i]))) n->edge[i] = ad_node_retain(e);
    }
    n->out_shape = em_shape_of(out);
    n->out_dtype = em_dtype(out);
    ad_stats_nodes(1);
    if (!save_all(n, r, in, out)) n->broken = true; /* backward reports it */
    em_tensor_set_annotation(out, n);
}

static void release_annotation(em_tensor *t, void *annotation)
{
    (void)t;
    ad_node *n = annotation;
    if (!n->leaf && n->recipe) {
        /* no new consumer can ask for the output's recipe */
        ad_saved_release(n->recipe);
        n->recipe = NULL;
    }
    ad_node_release(n);
}

static em_status check_write(const em_tensor *t, const char *op)
{
    ad_node *n = ad_node_of(t);
    if (!n || !em_grad_enabled()) return EM_OK;
    if (!n->leaf && !n->freed)
        return em_set_error(EM_ERR_INVALID,
                            "%s: cannot write in place into the result of a recorded "
                            "op (its value may be needed for backward); write under no-grad "
                            "(em_no_grad_begin) or into a detached copy",
                            op);
    if (n->leaf && n->requires_grad)
        return em_set_error(EM_ERR_INVALID,
                            "%s: cannot write in place into a leaf tensor that "
                            "requires gradients while gradients are recorded; do it under no-grad "
                            "(em_no_grad_begin / em_no_grad_end)",
                            op);
    return EM_OK;
}

static bool active(void)
{
    return em_grad_enabled();
}

/* Whether recording op keeps input i's value: its rule reads it, or (under the recompute policy)
 * the op's recipe replays it from its inputs. */
static bool keeps_input(em_tensor_op op, int i)
{
    const ad_rule *r = ad_rule_for(op);
    if (i < 0 || i >= 32 || ((r->save_inputs >> i) & 1u)) return true;
    return r->backward && em_recompute_policy_get() == EM_RECOMPUTE_ELEMENTWISE && ad_recomputable(op);
}

static const em_op_recorder g_recorder = {record, release_annotation, check_write, active,
                                          keeps_input};
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

static void install(void)
{
    em_set_op_recorder(&g_recorder);
}

void em_autodiff_init(void)
{
    pthread_once(&g_init_once, install);
}

/* ---- leaves and gradients -------------------------------------------------------------------- */

static ad_node *new_leaf(em_tensor *t)
{
    ad_node *n = calloc(1, sizeof *n);
    if (!n) {
        em_set_error(EM_ERR_NOMEM, "autodiff: out of host memory");
        return NULL;
    }
    atomic_init(&n->refs, 1);
    n->leaf = true;
    em_tensor_set_annotation(t, n);
    return n;
}

em_status em_set_requires_grad(em_tensor *t, bool requires_grad)
{
    em_autodiff_init();
    if (!t) return em_set_error(EM_ERR_INVALID, "set_requires_grad: no tensor given");
    ad_node *n = ad_node_of(t);
    if (n && !n->leaf)
        return em_set_error(EM_ERR_INVALID,
                            "set_requires_grad: only leaf tensors can be marked (this "
                            "one is the result of a recorded %s; use em_detach for a leaf)",
                            em_top_name(n->op));
    if (requires_grad && !em_scalar_is_float(em_dtype(t))) {
        char d[128];
        return em_set_error(EM_ERR_INVALID,
                            "set_requires_grad: only floating-point tensors can require "
                            "gradients, got %s",
                            em_describe(t, d, sizeof d));
    }
    if (!n) {
        if (!requires_grad) return EM_OK;
        if (!(n = new_leaf(t))) return EM_ERR_NOMEM;
    }
    n->requires_grad = requires_grad;
    return EM_OK;
}

bool em_requires_grad(const em_tensor *t)
{
    return ad_node_wants(ad_node_of(t));
}

bool em_is_leaf(const em_tensor *t)
{
    ad_node *n = ad_node_of(t);
    return !n || n->leaf;
}

em_tensor *em_grad(const em_tensor *t)
{
    ad_node *n = ad_node_of(t);
    return n && n->leaf ? n->grad : NULL;
}

void em_zero_grad(em_tensor *t)
{
    ad_node *n = ad_node_of(t);
    if (!n || !n->leaf) return;
    em_release(n->grad);
    n->grad = NULL;
}

/* Stores g (retained; NULL clears) in *field of t's leaf node (made when g is given) for op
 * (set_grad, set_grad_into; `what` names g in the error), after checking that t is a leaf and g
 * has t's shape, dtype and device. */
static em_status set_leaf_field(const char *op, const char *what, em_tensor *t, em_tensor *g,
                                size_t field)
{
    em_autodiff_init();
    if (!t) return em_set_error(EM_ERR_INVALID, "%s: no tensor given", op);
    ad_node *n = ad_node_of(t);
    if (n && !n->leaf)
        return em_set_error(EM_ERR_INVALID,
                            "%s: only leaf tensors keep gradients (this one is the result of a "
                            "recorded %s)",
                            op, em_top_name(n->op));
    if (g) {
        em_shape a = em_shape_of(t), b = em_shape_of(g);
        if (em_dtype(g) != em_dtype(t) || a.rank != b.rank ||
            memcmp(a.d, b.d, sizeof(int64_t) * (size_t)a.rank) != 0 ||
            em_tensor_device(g) != em_tensor_device(t)) {
            char sa[128], sb[128];
            return em_set_error(EM_ERR_INVALID,
                                "%s: %s %s does not match tensor %s (same shape, dtype and device "
                                "needed)",
                                op, what, em_describe(g, sb, sizeof sb),
                                em_describe(t, sa, sizeof sa));
        }
        if (!n && !(n = new_leaf(t))) return EM_ERR_NOMEM;
    }
    if (!n) return EM_OK;
    em_tensor **slot = (em_tensor **)((char *)n + field);
    em_retain(g);
    em_release(*slot);
    *slot = g;
    return EM_OK;
}

em_status em_set_grad(em_tensor *t, em_tensor *g)
{
    return set_leaf_field("set_grad", "gradient", t, g, offsetof(ad_node, grad));
}

em_status em_set_grad_into(em_tensor *t, em_tensor *dest)
{
    return set_leaf_field("set_grad_into", "destination", t, dest, offsetof(ad_node, dest));
}

em_tensor *em_detach(const em_tensor *t)
{
    if (!t) return NULL;
    em_autodiff_init();
    em_no_grad_begin(); /* a same-shape expand is a plain view; nothing is recorded */
    em_tensor *v = em_expand(t, em_shape_of(t));
    em_no_grad_end();
    return v;
}
