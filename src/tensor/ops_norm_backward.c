/* ops_norm_backward.c — em_norm_backward (tensor_grad.h): the gradients of layer_norm and
 * rms_norm from the forward's input, weight and output gradient.
 *
 * On the row-wise path (the CPU, and devices with plane ops, when x's and the gradient's rows are
 * contiguous: tn_norm_backward_plan) one launch of tensor_norm_backward
 * (src/kernels/tensor_norm_backward.ek) recomputes each row's mean and rstd, writes dx and leaves
 * partial column sums of g * xhat and of g, one row per cube (per group of units on the CPU); two
 * column sums (tensor_cols.ek) add those into the weight's and the bias's gradients. Where the
 * path does not apply (devices without plane ops, rows that are not contiguous) the same formulas
 * run as public ops, each step fused by the fusion layer. A residual gradient (what the input has
 * received from its other consumers: a transformer block's skip connection) is added to dx in the
 * same pass. */
#include <stdlib.h>
#include <string.h>

#include "ember/tensor_grad.h"
#include "tensor/fusion.h"
#include "tensor/internal.h"

/* The values of each array a unit keeps in registers (x, g, and its sums of g * xhat and of g). */
#define NB_VALUES 24

/* Checks the inputs; false with the error set (naming both shapes where they disagree). */
static bool check_inputs(const char *op, const em_tensor *g, const em_tensor *x, int nnorm,
                         const em_tensor *w, bool rms, const em_tensor *resid, em_tensor **dw,
                         em_tensor **db)
{
    char a[128], b[128];
    if (!em_scalar_is_float(x->dtype)) {
        em_set_error(EM_ERR_INVALID, "%s: needs a floating-point tensor, got %s", op,
                     em_scalar_name(x->dtype));
        return false;
    }
    if (nnorm < 1 || nnorm > x->rank) {
        em_set_error(EM_ERR_INVALID, "%s: cannot normalize over the last %d dims of a tensor of rank %d",
                     op, nnorm, x->rank);
        return false;
    }
    bool same = g->rank == x->rank && g->dtype == x->dtype &&
                !memcmp(g->shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    if (!same) {
        em_set_error(EM_ERR_INVALID, "%s: the output gradient %s does not match the input %s", op,
                     em_describe(g, a, sizeof a), em_describe(x, b, sizeof b));
        return false;
    }
    if (resid && !(resid->rank == x->rank && resid->dtype == x->dtype &&
                   !memcmp(resid->shape, x->shape, sizeof(int64_t) * (size_t)x->rank))) {
        em_set_error(EM_ERR_INVALID, "%s: the residual gradient %s does not match the input %s", op,
                     em_describe(resid, a, sizeof a), em_describe(x, b, sizeof b));
        return false;
    }
    if (w) {
        bool ok = w->rank == nnorm && w->dtype == x->dtype;
        for (int i = 0; ok && i < nnorm; i++) ok = w->shape[i] == x->shape[x->rank - nnorm + i];
        if (!ok) {
            em_set_error(EM_ERR_INVALID, "%s: weight %s does not match the normalized dims of %s", op,
                         em_describe(w, a, sizeof a), em_describe(x, b, sizeof b));
            return false;
        }
    }
    if (dw && !w) {
        em_set_error(EM_ERR_INVALID, "%s: a weight gradient asked for without a weight", op);
        return false;
    }
    if (db && rms) {
        em_set_error(EM_ERR_INVALID, "%s: rms_norm has no bias", op);
        return false;
    }
    return tn_same_device(op, x, g) && (!w || tn_same_device(op, x, w)) &&
           (!resid || tn_same_device(op, x, resid));
}

/* The sums of t over its leading dims (all but the last nnorm), as a tensor of the last nnorm
 * dims' shape (t itself when there are none). */
static em_tensor *sum_leading(const em_tensor *t, int nnorm)
{
    int lead = em_rank(t) - nnorm, dims[EM_MAX_RANK];
    if (lead == 0) return (em_tensor *)t;
    for (int i = 0; i < lead; i++) dims[i] = i;
    return em_sum(t, dims, lead, false);
}

/* The backward through public ops (rules_reduce.c held it before this op existed):
 *   d b = sum g, d w = sum g xhat (over the leading dims);
 *   d x = rstd (gh - mean(gh) - xhat mean(gh xhat)), gh = g w (rms_norm: no mean(gh) term). */
static em_status backward_ops(const char *op, const em_tensor *g, const em_tensor *x, int nnorm,
                              const em_tensor *w, double eps, bool rms, const em_tensor *resid,
                              const bool *want, em_tensor **res)
{
    int rank = em_rank(x), dims[EM_MAX_RANK];
    for (int i = 0; i < nnorm; i++) dims[i] = rank - nnorm + i;
    em_scope_begin();
    em_tensor *xc = (em_tensor *)x, *rstd;
    if (!rms) xc = em_sub(x, em_mean(x, dims, nnorm, true));
    rstd = em_rsqrt(em_add_scalar(em_mean(em_mul(xc, xc), dims, nnorm, true), eps));
    em_tensor *xhat = em_mul(xc, rstd);
    if (want[0]) {
        em_tensor *gh = w ? em_mul(g, w) : (em_tensor *)g;
        em_tensor *inner = em_sub(gh, em_mul(xhat, em_mean(em_mul(gh, xhat), dims, nnorm, true)));
        if (!rms) inner = em_sub(inner, em_mean(gh, dims, nnorm, true));
        res[0] = em_mul(rstd, inner);
        if (resid) res[0] = em_add(resid, res[0]);
    }
    if (want[1]) res[1] = sum_leading(em_mul(g, xhat), nnorm);
    if (want[2]) res[2] = sum_leading(g, nnorm);
    bool ok = true;
    for (int i = 0; i < 3; i++) ok = ok && (!want[i] || res[i]);
    em_scope_end(res, 3);
    if (!ok) {
        for (int i = 0; i < 3; i++) {
            em_release(res[i]);
            res[i] = NULL;
        }
        return em_error_context("%s", op);
    }
    return EM_OK;
}

bool tn_norm_backward_plan(const em_caps *c, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                           const int64_t *al, int na, tn_rows_plan *p)
{
    /* 16-byte loads, and NB_VALUES values of each of x and g in registers (the sums and the weight
     * are in shared memory) */
    return tn_rows_plan_caps(c, dt, rows, n, x_rs, al, na, 16 / (unsigned)em_scalar_size(dt), NB_VALUES, p);
}

/* The number of cubes the kernel runs for `rows` rows, `per` groups of units to a cube: as many as
 * stay resident together, about five per compute unit (ptxas gives the kernel 95 registers a unit
 * at GPT-2's rows, and five cubes of 128 units fill an H100's 64K registers; each group then
 * takes several rows in turn, and the partial sums stay few), never more than the rows need. */
static uint32_t cubes_for(em_device *dev, int64_t rows, unsigned per)
{
    const em_caps *c = em_device_caps(dev);
    int64_t want = (int64_t)(c && c->compute_units ? c->compute_units : 64) * 5;
    int64_t need = (rows + per - 1) / per;
    return (uint32_t)(need < want ? need : want);
}

/* Whether the weight's and the bias's gradients go into neighbouring destinations, into[0]'s n
 * elements then into[1]'s in one buffer, contiguous and of one dtype, so that one column sum
 * writes both (the default since session 27's A/B on an H100; EMBER_NORM_SUMS_PAIR=0 for two). */
static bool both_into(em_tensor *const *into, int64_t n)
{
    const char *env = getenv("EMBER_NORM_SUMS_PAIR");
    if (env && !strcmp(env, "0")) return false;
    const em_tensor *w = into[0], *b = into[1];
    return w && b && w->st == b->st && w->dtype == b->dtype && em_is_contiguous(w) &&
           em_is_contiguous(b) && em_numel(w) == n && em_numel(b) == n &&
           b->offset == w->offset + n;
}

/* The row-wise kernel and the column sums into res (dx, dw, db where want[] says so). *taken
 * false (nothing run) when the path does not apply. EM_OK or the error set. */
static em_status backward_rows(const char *op, const em_tensor *g, const em_tensor *x, int nnorm,
                               const em_tensor *w, double eps, bool rms, const em_tensor *resid,
                               const bool *want, em_tensor *const *into, em_tensor **res,
                               bool *taken)
{
    int64_t rows, n, rs, grows, gn, grs;
    *taken = false;
    if (!tn_rows_geometry(x, nnorm, &rows, &n, &rs) || !tn_rows_geometry(g, nnorm, &grows, &gn, &grs) ||
        grows != rows || gn != n)
        return EM_OK;
    em_device *dev = x->st->dev;
    int64_t al[5] = {x->offset, rs, g->offset, grs, w ? w->offset : 0};
    tn_rows_plan p;
    if (!tn_norm_backward_plan(em_device_caps(dev), x->dtype, rows, n, rs, al, 5, &p) || grs / p.lw > UINT32_MAX)
        return EM_OK;
    unsigned per = p.cube / p.g;
    uint32_t cubes = cubes_for(dev, rows, per), groups = cubes * per, prows = p.v ? cubes : groups;
    if ((int64_t)2 * prows * n > UINT32_MAX) return EM_OK;
    *taken = true;
    bool want_dx = want[0], want_sums = want[1] || want[2];
    /* the residual is read in the kernel when its rows are laid out as dx's; else added after */
    int64_t r_rows, r_n, r_rs;
    bool res_in = want_dx && resid && tn_rows_geometry(resid, nnorm, &r_rows, &r_n, &r_rs) && r_rs == n &&
                  r_rows == rows && resid->offset % p.lw == 0;
    if (tn_realize(x) != EM_OK || tn_realize(g) != EM_OK || (w && tn_realize(w) != EM_OK) ||
        (res_in && tn_realize(resid) != EM_OK))
        return em_error_context("%s", op);
    em_scalar dt = x->dtype, ct = tn_compute_type(dt);
    /* results not wanted are bound to a placeholder of a line */
    em_tensor *dx = tn_new(dev, dt, want_dx ? x->rank : 1, want_dx ? x->shape : (int64_t[]){p.lw});
    em_tensor *part =
        tn_new(dev, ct, 2, want_sums ? (int64_t[]){prows, 2 * n} : (int64_t[]){1, p.lw});
    em_status st = EM_OK;
    if (!dx || !part) goto fail;
    em_lang_bind b[5] = {em_lang_bind_type("T", dt), em_lang_bind_type("C", ct)};
    size_t nb = 2 + tn_rows_binds(&p, b + 2);
    const em_tensor *wt = w ? w : x;
    const em_tensor *rt = res_in ? resid : x;
    em_arg a[18] = {tn_flat_buffer(x, dt, p.lw),
                    em_arg_u32((uint32_t)(x->offset / p.lw)),
                    tn_flat_buffer(g, dt, p.lw),
                    em_arg_u32((uint32_t)(g->offset / p.lw)),
                    tn_flat_buffer(wt, dt, p.lw),
                    em_arg_u32((uint32_t)(w ? w->offset / p.lw : 0)),
                    tn_flat_buffer(rt, dt, p.lw),
                    em_arg_u32((uint32_t)(res_in ? resid->offset / p.lw : 0)),
                    tn_flat_buffer(dx, dt, p.lw),
                    em_arg_u32(0),
                    tn_flat_buffer(part, ct, p.lw),
                    em_arg_u32(p.rows),
                    em_arg_u32(p.nl),
                    em_arg_u32(p.x_rs),
                    em_arg_u32((uint32_t)(grs / p.lw)),
                    em_arg_u32(groups),
                    tn_scalar_arg(dt, eps),
                    em_arg_u32((w ? 1u : 0u) | (rms ? 2u : 0u) | (want_dx ? 4u : 0u) |
                               (want_sums ? 8u : 0u) | (res_in ? 16u : 0u))};
    const em_lang_module *m = em_lang_builtins();
    if (!m) goto fail;
    uint32_t grid[3] = {cubes, 1, 1}, units[3] = {p.cube, 1, 1};
    em_lang_spec spec = {b, nb, p.lw, NULL};
    if (em_lang_launch(dev, m, "tensor_norm_backward", &spec, grid, units, a, 18) != EM_OK)
        goto fail;
    uint64_t row_bytes = (uint64_t)n * em_scalar_size(dt), part_bytes = (uint64_t)2 * prows * n * em_scalar_size(ct);
    fu_count_launch("tensor_norm_backward", (res_in ? 3 : 2) * (uint64_t)rows * row_bytes + (w ? row_bytes : 0),
                    (want_dx ? (uint64_t)rows * row_bytes : 0) + (want_sums ? part_bytes : 0));
    if (want_dx && resid && !res_in) { /* the residual added after */
        em_tensor *sum = em_add(resid, dx);
        em_release(dx);
        if (!(dx = sum)) goto fail;
    }
    res[0] = want_dx ? dx : NULL;
    if (!want_dx) em_release(dx);
    dx = NULL;
    if (want_sums && both_into(into, n)) {
        /* the two destinations are neighbours (the optimizer's slots of a norm's weight and bias):
         * one column sum of part's whole rows writes both */
        em_tensor *pair = tn_view(into[0], 1, (int64_t[]){2 * n}, (int64_t[]){1}, into[0]->offset);
        st = pair ? tn_cols_sum_rows(op, part, pair) : em_error_context("%s", op);
        em_release(pair);
        if (st != EM_OK) goto fail;
        res[1] = em_retain(into[0]);
        res[2] = em_retain(into[1]);
    } else if (want_sums) {
        for (int k = 0; k < 2; k++) {
            if (!want[1 + k]) continue;
            em_tensor *rowsv =
                tn_view(part, 2, (int64_t[]){prows, n}, (int64_t[]){2 * n, 1}, (int64_t)k * n);
            /* straight into the caller's tensor where it is contiguous (the column sum writes any
             * float dtype at any offset), else into a new one (copied in by the caller) */
            em_tensor *in = into[k] && em_is_contiguous(into[k]) ? into[k] : NULL;
            em_tensor *out = !rowsv ? NULL
                             : in   ? em_retain(in)
                                    : tn_new(dev, dt, nnorm, x->shape + x->rank - nnorm);
            if (out) st = tn_cols_sum_rows(op, rowsv, out);
            em_release(rowsv);
            if (!out || st != EM_OK) {
                em_release(out);
                goto fail;
            }
            res[1 + k] = out;
        }
    }
    em_release(part);
    return EM_OK;
fail:
    for (int i = 0; i < 3; i++) {
        em_release(res[i]);
        res[i] = NULL;
    }
    em_release(dx);
    em_release(part);
    return em_error_context("%s", op);
}

em_status em_norm_backward(const em_tensor *grad_out, const em_tensor *x, int nnorm,
                           const em_tensor *weight, double eps, bool rms, const em_tensor *residual,
                           em_tensor **dx, em_tensor **dw, em_tensor **db)
{
    return em_norm_backward_into(grad_out, x, nnorm, weight, eps, rms, residual, dx, dw, db, NULL,
                                 NULL);
}

/* Whether t (a gradient's destination, or NULL) has the normalized dims' shape of x, a float
 * dtype, x's device and is writable; false with the error set. */
static bool check_into(const char *op, const char *what, em_tensor *t, const em_tensor *x,
                       int nnorm)
{
    if (!t) return true;
    char a[128], b[128];
    bool ok = t->rank == nnorm && em_scalar_is_float(t->dtype);
    for (int i = 0; ok && i < nnorm; i++) ok = t->shape[i] == x->shape[x->rank - nnorm + i];
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: the %s gradient's destination %s does not fit the normalized dims of %s",
                     op, what, em_describe(t, a, sizeof a), em_describe(x, b, sizeof b));
        return false;
    }
    return tn_same_device(op, x, t) && tn_check_write(t, op) == EM_OK;
}

em_status em_norm_backward_into(const em_tensor *grad_out, const em_tensor *x, int nnorm,
                                const em_tensor *weight, double eps, bool rms,
                                const em_tensor *residual, em_tensor **dx, em_tensor **dw,
                                em_tensor **db, em_tensor *dw_into, em_tensor *db_into)
{
    const char *op = rms ? "rms_norm backward" : "layer_norm backward";
    if (dx) *dx = NULL;
    if (dw) *dw = NULL;
    if (db) *db = NULL;
    if (!grad_out || !x) {
        if (em_last_status() == EM_OK) em_set_error(EM_ERR_INVALID, "%s: NULL input", op);
        return em_last_status();
    }
    if (!check_inputs(op, grad_out, x, nnorm, weight, rms, residual, dw, db)) return em_last_status();
    em_tensor *into[2] = {dw ? dw_into : NULL, db ? db_into : NULL};
    if (!check_into(op, "weight", into[0], x, nnorm) || !check_into(op, "bias", into[1], x, nnorm))
        return em_last_status();
    const bool want[3] = {dx != NULL, dw != NULL, db != NULL};
    em_tensor *res[3] = {NULL, NULL, NULL};
    if (!want[0] && !want[1] && !want[2]) return EM_OK;
    bool taken = false;
    em_status st = em_numel(x) == 0 ? EM_OK
                                    : backward_rows(op, grad_out, x, nnorm, weight, eps, rms,
                                                    residual, want, into, res, &taken);
    if (st == EM_OK && !taken) st = backward_ops(op, grad_out, x, nnorm, weight, eps, rms, residual, want, res);
    /* the sums made elsewhere (no rows: zeros) are copied into the destinations */
    for (int k = 0; k < 2 && st == EM_OK; k++) {
        if (!into[k] || res[1 + k] == into[k]) continue;
        em_tensor *made = res[1 + k];
        res[1 + k] = NULL;
        st = made ? em_copy_(into[k], em_take(made)) : tn_fill(into[k], 0);
        if (st == EM_OK) res[1 + k] = em_retain(into[k]);
    }
    if (st != EM_OK) {
        for (int i = 0; i < 3; i++) em_release(res[i]);
        return st;
    }
    if (dx) *dx = res[0];
    if (dw) *dw = res[1];
    if (db) *db = res[2];
    return EM_OK;
}
