/* ops_sort.c — sort, argsort and topk along a dim, through the stable rank sort of
 * src/kernels/tensor_sort.ek (the dim is moved last by a permuted view). */
#include <string.h>

#include "tensor/internal.h"

/* The geometry of t with dim d moved last (rank 0 becomes [1]). */
static int dim_last(const em_tensor *t, int d, int64_t *shape, int64_t *stride)
{
    if (t->rank == 0) {
        shape[0] = 1;
        stride[0] = 1;
        return 1;
    }
    int j = 0;
    for (int i = 0; i < t->rank; i++)
        if (i != d) {
            shape[j] = t->shape[i];
            stride[j++] = t->stride[i];
        }
    shape[j] = t->shape[d];
    stride[j] = t->stride[d];
    return t->rank;
}

/* Sorted values are differentiable as a gather of t by the indices along d (a 0-d t: a copy). */
static void record_values(const em_tensor *t, int d, const em_tensor *ix, em_tensor *v)
{
    if (t->rank == 0) {
        tn_record1(EM_TOP_CAST, t, v);
        return;
    }
    em_top_params p = tn_params_k(d);
    const em_tensor *ins[2] = {t, ix};
    tn_record(EM_TOP_GATHER, &p, ins, 2, v);
}

static em_status sort_impl(const em_tensor *t, int dim, bool desc, em_tensor **values,
                           em_tensor **indices, bool record)
{
    int d = tn_dim("sort", dim, t->rank);
    if (d < 0) return em_last_status();
    em_tensor *v = tn_new(t->st->dev, t->dtype, t->rank, t->shape);
    em_tensor *ix = v ? tn_new(t->st->dev, EM_I64, t->rank, t->shape) : NULL;
    if (!ix) {
        em_release(v);
        return em_last_status();
    }
    if (em_numel(t) > 0) {
        int64_t xs[EM_MAX_RANK], xsh[EM_MAX_RANK], vs[EM_MAX_RANK], vsh[EM_MAX_RANK], is[EM_MAX_RANK],
            ish[EM_MAX_RANK];
        int R = dim_last(t, d, xsh, xs);
        dim_last(v, d, vsh, vs);
        dim_last(ix, d, ish, is);
        em_lang_bind b[4] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("C", tn_compute_type(t->dtype)),
                             em_lang_bind_int("R", R), em_lang_bind_bool("DESC", desc)};
        tn_arg args[3] = {tn_arg_geom(t, R, xsh, xs, t->offset), tn_arg_geom(v, R, vsh, vs, 0),
                          tn_arg_geom(ix, R, ish, is, 0)};
        uint32_t cubes[3], units[3];
        tn_grid_1d((uint64_t)em_numel(t), cubes, units);
        if (tn_launch("sort", t->st->dev, "tensor_sort", b, 4, 1, cubes, units, args, 3) != EM_OK) {
            em_release(v);
            em_release(ix);
            return em_last_status();
        }
    }
    if (values && record) record_values(t, d, ix, v);
    if (values) *values = v;
    else em_release(v);
    if (indices) *indices = ix;
    else em_release(ix);
    return EM_OK;
}

em_status em_sort(const em_tensor *t, int dim, bool descending, em_tensor **values, em_tensor **indices)
{
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!t) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INVALID;
    em_status st = sort_impl(t, dim, descending, values, indices, true);
    tn_done(t);
    return st;
}

em_tensor *em_argsort(const em_tensor *t, int dim, bool descending)
{
    em_tensor *ix = NULL;
    em_sort(t, dim, descending, NULL, &ix);
    return ix;
}

em_status em_topk(const em_tensor *t, int64_t k, int dim, bool largest, em_tensor **values, em_tensor **indices)
{
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!t) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INVALID;
    int d = tn_dim("topk", dim, t->rank);
    int64_t n = t->rank ? t->shape[d < 0 ? 0 : d] : 1;
    if (d >= 0 && (k < 0 || k > n)) {
        em_set_error(EM_ERR_INVALID, "topk: k = %lld is out of range for a dim of size %lld", (long long)k, (long long)n);
        d = -1;
    }
    if (d < 0) {
        tn_done(t);
        return em_last_status();
    }
    em_tensor *v = NULL, *ix = NULL;
    em_status st = sort_impl(t, d, largest, &v, &ix, false);
    if (st != EM_OK) {
        tn_done(t);
        return st;
    }
    if (t->rank == 0) {
        record_values(t, d, ix, v);
        tn_done(t);
        if (values) *values = v;
        else em_release(v);
        if (indices) *indices = ix;
        else em_release(ix);
        return EM_OK;
    }
    em_tensor *vk = em_contiguous(em_take(em_narrow(em_take(v), d, 0, k)));
    em_tensor *ik = em_contiguous(em_take(em_narrow(em_take(ix), d, 0, k)));
    if (!vk || !ik) {
        em_release(vk);
        em_release(ik);
        tn_done(t);
        return em_last_status();
    }
    record_values(t, d, ik, vk);
    tn_done(t);
    if (values) *values = vk;
    else em_release(vk);
    if (indices) *indices = ik;
    else em_release(ik);
    return EM_OK;
}
