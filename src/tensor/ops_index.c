/* ops_index.c — indexing: index_select, embedding, gather, scatter and scatter_add, through the
 * kernels of src/kernels/tensor_index.ek. Index tensors (i32 or i64) are read back and checked on
 * the host first, so an out-of-range index is an error with a message rather than a stray read.
 * Two ops leave their indices on the device (no read-back, so a step that uses them can be
 * replayed as a captured graph): em_embedding_clamped clamps each index into the table, and
 * em_scatter_rows_ drops the rows whose position is out of range; neither touches memory
 * outside its tensors whatever the indices hold. */
#include <stdlib.h>
#include <string.h>

#include "ember/tensor_grad.h"
#include "tensor/internal.h"

/* Reads idx back (i32 or i64) as i64 into a malloc'd array (*out, NULL when idx is empty) and
 * checks every index lies in [0, n); false with the error naming the first bad one. */
static bool read_indices(const char *op, const em_tensor *idx, int64_t n, int64_t **out)
{
    *out = NULL;
    if (idx->dtype != EM_I32 && idx->dtype != EM_I64) {
        em_set_error(EM_ERR_INVALID, "%s: indices must be i32 or i64, got %s", op, em_scalar_name(idx->dtype));
        return false;
    }
    size_t cnt = (size_t)em_numel(idx);
    if (!cnt) return true;
    int64_t *host = malloc(cnt * 8);
    if (!host) {
        em_set_error(EM_ERR_NOMEM, "%s: out of host memory", op);
        return false;
    }
    bool ok = em_to_host(idx, host, cnt * 8) == EM_OK;
    if (ok && idx->dtype == EM_I32) /* widen in place, from the end */
        for (size_t i = cnt; i-- > 0;) host[i] = ((int32_t *)host)[i];
    for (size_t i = 0; ok && i < cnt; i++) {
        if (host[i] < 0 || host[i] >= n) {
            em_set_error(EM_ERR_INVALID, "%s: index %lld is out of range for a dim of size %lld", op,
                         (long long)host[i], (long long)n);
            ok = false;
        }
    }
    if (ok) {
        *out = host;
    } else {
        free(host);
    }
    return ok;
}

/* Checks every index of idx lies in [0, n); false with the error naming the first bad one. */
static bool check_indices(const char *op, const em_tensor *idx, int64_t n)
{
    int64_t *host;
    bool ok = read_indices(op, idx, n, &host);
    free(host);
    return ok;
}

static bool check_pair(const char *op, const em_tensor *t, const em_tensor *idx)
{
    return tn_same_device(op, t, idx);
}

/* index_select, or with clamp its unchecked form (the indices stay on the device and are clamped
 * into the dim in the kernel). op names the entry point in errors. */
static em_tensor *index_select(const char *op, const em_tensor *t, int dim, const em_tensor *index,
                               bool clamp)
{
    em_tensor *out = NULL;
    clamp = clamp || em_trusted_indices(); /* ops_index_device.c */
    if (!t || !index) goto done;
    if (!check_pair(op, t, index)) goto done;
    int d = tn_dim(op, dim, t->rank);
    if (d < 0) goto done;
    char s[128];
    if (index->rank != 1) {
        em_set_error(EM_ERR_INVALID, "%s: the index must be 1-D, got %s", op, em_describe(index, s, sizeof s));
        goto done;
    }
    if (t->rank == 0) {
        em_set_error(EM_ERR_INVALID, "%s: a 0-d tensor has no dims to index", op);
        goto done;
    }
    if (!clamp && !check_indices(op, index, t->shape[d])) goto done;
    if (clamp && index->dtype != EM_I32 && index->dtype != EM_I64) {
        em_set_error(EM_ERR_INVALID, "%s: indices must be i32 or i64, got %s", op, em_scalar_name(index->dtype));
        goto done;
    }
    if (clamp && t->shape[d] == 0 && index->shape[0] > 0) {
        em_set_error(EM_ERR_INVALID, "%s: nothing to select from dim %d of %s", op, d,
                     em_describe(t, s, sizeof s));
        goto done;
    }
    int64_t sh[EM_MAX_RANK];
    memcpy(sh, t->shape, sizeof sh);
    sh[d] = index->shape[0];
    out = tn_new(t->st->dev, t->dtype, t->rank, sh);
    if (!out || em_numel(out) == 0) goto done;
    em_tensor *ic = tn_contig(index);
    if (!ic) goto fail;
    em_lang_bind b[5] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("I", index->dtype),
                         em_lang_bind_int("R", t->rank), em_lang_bind_int("DIM", d),
                         em_lang_bind_bool("CLAMP", clamp)};
    tn_arg args[3] = {tn_arg_t(t), tn_arg_flat(ic), tn_arg_t(out)};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(out), cubes, units);
    em_status st = tn_launch(op, t->st->dev, "tensor_index_select", b, 5, 1, cubes, units, args, 3);
    em_release(ic);
    if (st == EM_OK) goto done;
fail:
    em_release(out);
    out = NULL;
done:
    if (out) { /* the gradient is index_select's (whose backward checks the indices) */
        em_top_params p = tn_params_k(tn_dim(op, dim, t->rank));
        const em_tensor *ins[2] = {t, index};
        tn_record(EM_TOP_INDEX_SELECT, &p, ins, 2, out);
    }
    tn_done(t);
    if (index != t) tn_done(index);
    return out;
}

em_tensor *em_index_select(const em_tensor *t, int dim, const em_tensor *index)
{
    return index_select("index_select", t, dim, index, false);
}

/* embedding through index_select (clamped or checked); op names the entry point in errors. */
static em_tensor *embedding(const char *op, const em_tensor *weight, const em_tensor *ids, bool clamp)
{
    if (!weight || !ids) {
        tn_done(weight);
        tn_done(ids);
        return NULL;
    }
    if (weight->rank != 2) {
        char s[128];
        em_set_error(EM_ERR_INVALID, "%s: the weight must be 2-D [V, D], got %s", op, em_describe(weight, s, sizeof s));
        tn_done(weight);
        tn_done(ids);
        return NULL;
    }
    if (ids->rank >= EM_MAX_RANK) {
        em_set_error(EM_ERR_INVALID, "%s: ids of rank %d leave no room for the embedding dim", op, ids->rank);
        tn_done(weight);
        tn_done(ids);
        return NULL;
    }
    em_shape s = em_shape_of(ids);
    s.d[s.rank++] = weight->shape[1];
    em_tensor *flat = em_reshape(ids, EM_SHAPE(em_numel(ids))); /* releases a donated ids */
    em_tensor *rows = index_select(op, weight, 0, flat, clamp);
    em_release(flat);
    em_tensor *out = rows ? em_view(rows, s) : NULL;
    em_release(rows);
    return out;
}

em_tensor *em_embedding(const em_tensor *weight, const em_tensor *ids)
{
    return embedding("embedding", weight, ids, false);
}

em_tensor *em_embedding_clamped(const em_tensor *weight, const em_tensor *ids)
{
    return embedding("embedding_clamped", weight, ids, true);
}

em_tensor *em_gather(const em_tensor *t, int dim, const em_tensor *index)
{
    em_tensor *out = NULL;
    if (!t || !index) goto done;
    if (!check_pair("gather", t, index)) goto done;
    int d = tn_dim("gather", dim, t->rank);
    if (d < 0) goto done;
    char s1[128], s2[128];
    bool ok = index->rank == t->rank && t->rank > 0;
    for (int i = 0; ok && i < t->rank; i++)
        if (i != d && index->shape[i] > t->shape[i]) ok = false;
    if (!ok) {
        em_set_error(EM_ERR_INVALID, "gather: index %s does not fit input %s", em_describe(index, s1, sizeof s1),
                     em_describe(t, s2, sizeof s2));
        goto done;
    }
    if (!check_indices("gather", index, t->shape[d])) goto done;
    out = tn_new(t->st->dev, t->dtype, index->rank, index->shape);
    if (!out || em_numel(out) == 0) goto done;
    em_lang_bind b[4] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("I", index->dtype),
                         em_lang_bind_int("R", t->rank), em_lang_bind_int("DIM", d)};
    tn_arg args[3] = {tn_arg_t(t), tn_arg_t(index), tn_arg_t(out)};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(out), cubes, units);
    if (tn_launch("gather", t->st->dev, "tensor_gather", b, 4, 1, cubes, units, args, 3) == EM_OK) goto done;
    em_release(out);
    out = NULL;
done:
    if (out) {
        em_top_params p = tn_params_k(tn_dim("gather", dim, t->rank));
        const em_tensor *ins[2] = {t, index};
        tn_record(EM_TOP_GATHER, &p, ins, 2, out);
    }
    tn_done(t);
    if (index != t) tn_done(index);
    return out;
}

static em_tensor *scatter(const char *op, const em_tensor *t, int dim, const em_tensor *index,
                          const em_tensor *src, bool add)
{
    em_tensor *out = NULL;
    char s1[128], s2[128];
    if (!tn_same_device(op, t, index) || !tn_same_device(op, t, src)) return NULL;
    int d = tn_dim(op, dim, t->rank);
    if (d < 0) return NULL;
    if (src->dtype != t->dtype || t->dtype == EM_BOOL) {
        em_set_error(EM_ERR_INVALID, "%s: src dtype %s must match the numeric target dtype %s", op,
                     em_scalar_name(src->dtype), em_scalar_name(t->dtype));
        return NULL;
    }
    bool ok = index->rank == t->rank && src->rank == t->rank && t->rank > 0;
    for (int i = 0; ok && i < t->rank; i++)
        if ((i != d && index->shape[i] > t->shape[i]) || index->shape[i] > src->shape[i]) ok = false;
    if (!ok) {
        em_set_error(EM_ERR_INVALID, "%s: index %s does not fit target %s and src", op,
                     em_describe(index, s1, sizeof s1), em_describe(t, s2, sizeof s2));
        return NULL;
    }
    if (!check_indices(op, index, t->shape[d])) return NULL;
    out = tn_contig(t);
    if (out && out->st == t->st) { /* a view of t: scatter into a copy instead */
        em_release(out);
        out = tn_new(t->st->dev, t->dtype, t->rank, t->shape);
        if (out && tn_copy_into(op, out, t) != EM_OK) {
            em_release(out);
            out = NULL;
        }
    }
    if (!out || em_numel(out) == 0 || em_numel(index) == 0) return out;
    em_lang_bind b[5] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("I", index->dtype),
                         em_lang_bind_int("R", t->rank), em_lang_bind_int("DIM", d), em_lang_bind_bool("ADD", add)};
    tn_arg args[3] = {tn_arg_t(src), tn_arg_t(index), tn_arg_t(out)};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(out), cubes, units);
    if (tn_launch(op, t->st->dev, "tensor_scatter", b, 5, 1, cubes, units, args, 3) != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

static void record_scatter(em_tensor_op op, const em_tensor *t, int dim, const em_tensor *index,
                           const em_tensor *src, em_tensor *out)
{
    if (!out) return;
    em_top_params p = tn_params_k(tn_dim(em_top_name(op), dim, t->rank));
    const em_tensor *ins[3] = {t, index, src};
    tn_record(op, &p, ins, 3, out);
}

em_tensor *em_scatter(const em_tensor *t, int dim, const em_tensor *index, const em_tensor *src)
{
    em_tensor *out = t && index && src ? scatter("scatter", t, dim, index, src, false) : NULL;
    record_scatter(EM_TOP_SCATTER, t, dim, index, src, out);
    tn_done(t);
    tn_done(index);
    tn_done(src);
    return out;
}

em_tensor *em_scatter_add(const em_tensor *t, int dim, const em_tensor *index, const em_tensor *src)
{
    em_tensor *out = t && index && src ? scatter("scatter_add", t, dim, index, src, true) : NULL;
    record_scatter(EM_TOP_SCATTER_ADD, t, dim, index, src, out);
    tn_done(t);
    tn_done(index);
    tn_done(src);
    return out;
}

em_status em_scatter_rows_(em_tensor *dst, int dim, const em_tensor *index, const em_tensor *src)
{
    const char *op = "scatter_rows_";
    if (!dst || !index || !src) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INVALID;
    if (!tn_same_device(op, dst, index) || !tn_same_device(op, dst, src)) return EM_ERR_INVALID;
    em_status st = tn_check_write(dst, op);
    if (st != EM_OK) return st;
    int d = tn_dim(op, dim, dst->rank);
    if (d < 0) return em_last_status();
    char s1[128], s2[128], s3[128];
    if (d == 0)
        return em_set_error(EM_ERR_INVALID, "%s: dim 0 holds the rows; the positions must be along another dim of %s",
                            op, em_describe(dst, s1, sizeof s1));
    if (src->dtype != dst->dtype)
        return em_set_error(EM_ERR_INVALID, "%s: src dtype %s must match the destination's %s", op,
                            em_scalar_name(src->dtype), em_scalar_name(dst->dtype));
    if (index->dtype != EM_I32 && index->dtype != EM_I64)
        return em_set_error(EM_ERR_INVALID, "%s: indices must be i32 or i64, got %s", op, em_scalar_name(index->dtype));
    bool ok = index->rank == 1 && index->shape[0] == dst->shape[0] && src->rank == dst->rank && src->shape[d] == 1;
    for (int i = 0; ok && i < dst->rank; i++)
        if (i != d && src->shape[i] != dst->shape[i]) ok = false;
    if (!ok)
        return em_set_error(EM_ERR_INVALID,
                            "%s: src %s and index %s do not fit destination %s along dim %d (expected src of "
                            "the destination's shape with 1 at dim %d, and one index per row of dim 0)",
                            op, em_describe(src, s1, sizeof s1), em_describe(index, s2, sizeof s2),
                            em_describe(dst, s3, sizeof s3), d, d);
    if (em_numel(src) == 0) return EM_OK;
    em_tensor *ic = tn_contig(index);
    if (!ic) return em_last_status();
    em_lang_bind b[4] = {em_lang_bind_type("T", dst->dtype), em_lang_bind_type("I", index->dtype),
                         em_lang_bind_int("R", dst->rank), em_lang_bind_int("DIM", d)};
    tn_arg args[3] = {tn_arg_t(src), tn_arg_flat(ic), tn_arg_t(dst)};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)em_numel(src), cubes, units);
    st = tn_launch(op, dst->st->dev, "tensor_scatter_rows", b, 4, 1, cubes, units, args, 3);
    em_release(ic);
    return st;
}

em_tensor *em_embedding_backward(const em_tensor *grad, const em_tensor *ids, int64_t num_embeddings)
{
    const char *op = "embedding_backward";
    if (!grad || !ids) return NULL;
    char s1[128], s2[128];
    if (!tn_same_device(op, grad, ids)) return NULL;
    bool ok = em_scalar_is_float(grad->dtype) && grad->rank == ids->rank + 1 &&
              num_embeddings > 0 && num_embeddings < INT32_MAX;
    for (int i = 0; ok && i < ids->rank; i++) ok = grad->shape[i] == ids->shape[i];
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: grad %s and ids %s do not match (expected float grad [..., D] over ids "
                     "[...]) or %lld embeddings is out of range",
                     op, em_describe(grad, s1, sizeof s1), em_describe(ids, s2, sizeof s2),
                     (long long)num_embeddings);
        return NULL;
    }
    int64_t n = em_numel(ids), D = grad->shape[grad->rank - 1], V = num_embeddings;
    if (V * D >= (int64_t)UINT32_MAX) {
        em_set_error(EM_ERR_INVALID, "%s: a table of %lld x %lld is too large for one launch", op,
                     (long long)V, (long long)D);
        return NULL;
    }
    if (n >= INT32_MAX) {
        em_set_error(EM_ERR_INVALID, "%s: %lld ids are too many", op, (long long)n);
        return NULL;
    }
    if (em_trusted_indices()) return tn_embedding_backward_device(op, grad, ids, V);
    int64_t *host; /* the ids, read back once: checked, then sorted */
    if (!read_indices(op, ids, V, &host)) return NULL;
    int64_t shape[2] = {V, D};
    em_tensor *out = tn_new(grad->st->dev, grad->dtype, 2, shape);
    if (!out || V * D == 0 || n == 0) {
        free(host);
        if (out && V * D > 0 && tn_fill(out, 0) != EM_OK) {
            em_release(out);
            return NULL;
        }
        return out;
    }
    /* the positions sorted by id (counting sort: stable, so ascending within an id) */
    int32_t *order = malloc((size_t)n * sizeof *order), *starts = calloc((size_t)V + 1, sizeof *starts);
    em_tensor *g2 = NULL, *to = NULL, *ts = NULL;
    em_status st = order && starts ? EM_OK : em_set_error(EM_ERR_NOMEM, "%s: out of host memory", op);
    if (st == EM_OK) {
        for (int64_t i = 0; i < n; i++) starts[host[i] + 1]++;
        for (int64_t v = 0; v < V; v++) starts[v + 1] += starts[v];
        int32_t *next = malloc((size_t)V * sizeof *next);
        if (!next) {
            st = em_set_error(EM_ERR_NOMEM, "%s: out of host memory", op);
        } else {
            memcpy(next, starts, (size_t)V * sizeof *next);
            for (int64_t i = 0; i < n; i++) order[next[host[i]]++] = (int32_t)i;
            free(next);
        }
    }
    if (st == EM_OK) {
        to = em_from_host(grad->st->dev, EM_I32, EM_SHAPE(n), order);
        ts = em_from_host(grad->st->dev, EM_I32, EM_SHAPE(V + 1), starts);
        g2 = em_reshape(grad, EM_SHAPE(n, D));
        if (!to || !ts || !g2) st = em_last_status();
    }
    if (st == EM_OK) {
        em_lang_bind b[2] = {em_lang_bind_type("T", grad->dtype),
                             em_lang_bind_type("C", tn_compute_type(grad->dtype))};
        tn_arg args[4] = {tn_arg_t(g2), tn_arg_flat(to), tn_arg_flat(ts), tn_arg_t(out)};
        uint32_t cubes[3], units[3];
        tn_grid_1d((uint64_t)(V * D), cubes, units);
        st = tn_launch(op, grad->st->dev, "tensor_embedding_backward", b, 2, 1, cubes, units, args, 4);
    }
    free(host);
    free(order);
    free(starts);
    em_release(g2);
    em_release(to);
    em_release(ts);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}
