/* ops_layout.c — layout ops. Views (no copy): view/reshape when the strides allow, permute,
 * transpose, expand, squeeze, unsqueeze, slice with steps, narrow, select, split, chunk.
 * Copies: reshape otherwise, flip and tril/triu (kernels of src/kernels/tensor_layout.ek), and
 * cat, stack and pad (strided copies into views of the result). */
#include <stdlib.h>
#include <string.h>

#include "tensor/internal.h"

/* A view of t with the given geometry, reported as op with params p (NULL: none); releases t when
 * it was donated. */
static em_tensor *make_view(const em_tensor *t, int rank, const int64_t *shape, const int64_t *stride,
                            int64_t offset, em_tensor_op op, const em_top_params *p)
{
    em_tensor *v = tn_view(t, rank, shape, stride, offset);
    tn_record(op, p, &t, 1, v);
    tn_done(t);
    return v;
}

static em_tensor *fail(const em_tensor *t)
{
    tn_done(t);
    return NULL;
}

/* Resolves a -1 in shape against numel; false with the error set on mismatch. */
static bool infer_shape(const char *op, const em_tensor *t, em_shape *s)
{
    int infer = -1;
    int64_t known = 1, n = em_numel(t);
    if (s->rank < 0 || s->rank > EM_MAX_RANK) {
        em_set_error(EM_ERR_INVALID, "%s: rank %d is out of range (0..%d)", op, s->rank, EM_MAX_RANK);
        return false;
    }
    for (int i = 0; i < s->rank; i++) {
        if (s->d[i] == -1 && infer < 0) {
            infer = i;
        } else if (s->d[i] < 0) {
            em_set_error(EM_ERR_INVALID, "%s: bad size %lld in dim %d", op, (long long)s->d[i], i);
            return false;
        } else {
            known *= s->d[i];
        }
    }
    if (infer >= 0 && known > 0 && n % known == 0) s->d[infer] = n / known;
    if (tn_numel(s->rank, s->d) != n || (infer >= 0 && known == 0)) {
        char d[128], want[128];
        tn_describe_shape(t->dtype, s->rank, s->d, want, sizeof want);
        em_set_error(EM_ERR_INVALID, "%s: cannot view %s (%lld elements) as %s", op, em_describe(t, d, sizeof d),
                     (long long)n, want);
        return false;
    }
    return true;
}

/* Strides of t viewed as shape s (as PyTorch's computeStride); false when impossible. */
static bool view_strides(const em_tensor *t, const em_shape *s, int64_t *out)
{
    if (em_numel(t) == 0) {
        tn_contig_strides(s->rank, s->d, out);
        return true;
    }
    int view_d = s->rank - 1;
    int64_t chunk_base = t->rank ? t->stride[t->rank - 1] : 1, tensor_numel = 1, view_numel = 1;
    for (int td = t->rank - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        if (td == 0 || (t->shape[td - 1] != 1 && t->stride[td - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || s->d[view_d] == 1)) {
                out[view_d] = view_numel * chunk_base;
                view_numel *= s->d[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base = t->stride[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    while (view_d >= 0) out[view_d--] = 1; /* leading size-1 dims */
    return true;
}

em_tensor *em_view(const em_tensor *t, em_shape shape)
{
    if (!t) return NULL;
    if (!infer_shape("view", t, &shape)) return fail(t);
    int64_t st[EM_MAX_RANK];
    if (!view_strides(t, &shape, st)) {
        char d[128], want[128];
        tn_describe_shape(t->dtype, shape.rank, shape.d, want, sizeof want);
        em_set_error(EM_ERR_INVALID, "view: the strides of %s do not allow a view as %s (use reshape)",
                     em_describe(t, d, sizeof d), want);
        return fail(t);
    }
    return make_view(t, shape.rank, shape.d, st, t->offset, EM_TOP_RESHAPE, NULL);
}

em_tensor *em_reshape(const em_tensor *t, em_shape shape)
{
    if (!t) return NULL;
    if (!infer_shape("reshape", t, &shape)) return fail(t);
    int64_t st[EM_MAX_RANK];
    if (view_strides(t, &shape, st))
        return make_view(t, shape.rank, shape.d, st, t->offset, EM_TOP_RESHAPE, NULL);
    em_tensor *c = em_clone(t); /* releases t when donated */
    if (!c) return NULL;
    tn_contig_strides(shape.rank, shape.d, st);
    em_tensor *v = tn_view(c, shape.rank, shape.d, st, 0);
    tn_record1(EM_TOP_RESHAPE, c, v);
    em_release(c);
    return v;
}

em_tensor *em_flatten(const em_tensor *t)
{
    return t ? em_reshape(t, EM_SHAPE(em_numel(t))) : NULL;
}

em_tensor *em_permute(const em_tensor *t, const int *perm, int n)
{
    if (!t) return NULL;
    if (n != t->rank || !perm) {
        em_set_error(EM_ERR_INVALID, "permute: %d dims given for a tensor of rank %d", n, t->rank);
        return fail(t);
    }
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    bool seen[EM_MAX_RANK] = {false};
    em_top_params p = tn_params_k(0);
    p.ni = n;
    for (int i = 0; i < n; i++) {
        int d = tn_dim("permute", perm[i], t->rank);
        if (d < 0) return fail(t);
        if (seen[d]) {
            em_set_error(EM_ERR_INVALID, "permute: dim %d appears twice", d);
            return fail(t);
        }
        seen[d] = true;
        p.i[i] = d;
        sh[i] = t->shape[d];
        st[i] = t->stride[d];
    }
    return make_view(t, n, sh, st, t->offset, EM_TOP_PERMUTE, &p);
}

em_tensor *em_transpose(const em_tensor *t, int d0, int d1)
{
    if (!t) return NULL;
    int a = tn_dim("transpose", d0, t->rank), b = a < 0 ? -1 : tn_dim("transpose", d1, t->rank);
    if (a < 0 || b < 0) return fail(t);
    if (t->rank == 0) return make_view(t, 0, t->shape, t->stride, t->offset, EM_TOP_RESHAPE, NULL);
    em_top_params p = tn_params_k(0);
    p.ni = t->rank;
    for (int i = 0; i < t->rank; i++) p.i[i] = i == a ? b : i == b ? a : i;
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->stride, sizeof st);
    sh[a] = t->shape[b];
    st[a] = t->stride[b];
    sh[b] = t->shape[a];
    st[b] = t->stride[a];
    return make_view(t, t->rank, sh, st, t->offset, EM_TOP_PERMUTE, &p);
}

em_tensor *em_expand(const em_tensor *t, em_shape shape)
{
    if (!t) return NULL;
    if (shape.rank < t->rank || shape.rank > EM_MAX_RANK) goto bad;
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    int off = shape.rank - t->rank;
    for (int i = 0; i < shape.rank; i++) {
        int j = i - off;
        int64_t want = shape.d[i];
        if (j < 0) {
            if (want < 0) goto bad;
            sh[i] = want;
            st[i] = 0;
        } else if (want == -1 || want == t->shape[j]) {
            sh[i] = t->shape[j];
            st[i] = t->stride[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            goto bad;
        }
    }
    return make_view(t, shape.rank, sh, st, t->offset, EM_TOP_EXPAND, NULL);
bad: {
    char d[128], want[128];
    tn_describe_shape(t->dtype, shape.rank, shape.d, want, sizeof want);
    em_set_error(EM_ERR_INVALID, "expand: cannot expand %s to %s", em_describe(t, d, sizeof d), want);
    return fail(t);
}
}

em_tensor *em_squeeze(const em_tensor *t, int dim)
{
    if (!t) return NULL;
    int only = -1;
    if (dim != EM_ALL_DIMS) {
        only = tn_dim("squeeze", dim, t->rank);
        if (only < 0) return fail(t);
    }
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    int r = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] == 1 && (only < 0 || only == i)) continue;
        sh[r] = t->shape[i];
        st[r++] = t->stride[i];
    }
    return make_view(t, r, sh, st, t->offset, EM_TOP_RESHAPE, NULL);
}

em_tensor *em_unsqueeze(const em_tensor *t, int dim)
{
    if (!t) return NULL;
    if (t->rank >= EM_MAX_RANK) {
        em_set_error(EM_ERR_INVALID, "unsqueeze: a tensor of rank %d cannot grow", t->rank);
        return fail(t);
    }
    int d = tn_dim("unsqueeze", dim, t->rank + 1);
    if (d < 0) return fail(t);
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    for (int i = 0, j = 0; i <= t->rank; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = d < t->rank ? t->stride[d] * t->shape[d] : 1;
        } else {
            sh[i] = t->shape[j];
            st[i] = t->stride[j++];
        }
    }
    return make_view(t, t->rank + 1, sh, st, t->offset, EM_TOP_RESHAPE, NULL);
}

em_tensor *em_slice(const em_tensor *t, int dim, int64_t start, int64_t end, int64_t step)
{
    if (!t) return NULL;
    if (t->rank == 0) {
        em_set_error(EM_ERR_INVALID, "slice: a 0-d tensor has no dims to slice");
        return fail(t);
    }
    int d = tn_dim("slice", dim, t->rank);
    if (d < 0) return fail(t);
    if (step < 1) {
        em_set_error(EM_ERR_INVALID, "slice: step must be at least 1, got %lld", (long long)step);
        return fail(t);
    }
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < start ? start : end > n ? n : end;
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->stride, sizeof st);
    sh[d] = (end - start + step - 1) / step;
    st[d] = t->stride[d] * step;
    em_top_params p = tn_params_k(d);
    p.ni = 3;
    p.i[0] = start;
    p.i[1] = end;
    p.i[2] = step;
    return make_view(t, t->rank, sh, st, t->offset + start * t->stride[d], EM_TOP_SLICE, &p);
}

em_tensor *em_narrow(const em_tensor *t, int dim, int64_t start, int64_t length)
{
    if (!t) return NULL;
    int d = tn_dim("narrow", dim, t->rank);
    if (d < 0 || t->rank == 0) return fail(t);
    if (start < 0) start += t->shape[d];
    if (start < 0 || length < 0 || start + length > t->shape[d]) {
        em_set_error(EM_ERR_INVALID, "narrow: [%lld, %lld) is out of range for dim %d of size %lld",
                     (long long)start, (long long)(start + length), d, (long long)t->shape[d]);
        return fail(t);
    }
    return em_slice(t, d, start, start + length, 1);
}

em_tensor *em_select(const em_tensor *t, int dim, int64_t index)
{
    if (!t) return NULL;
    int d = tn_dim("select", dim, t->rank);
    if (d < 0 || t->rank == 0) return fail(t);
    int64_t n = t->shape[d];
    if (index < -n || index >= n) {
        em_set_error(EM_ERR_INVALID, "select: index %lld is out of range for dim %d of size %lld",
                     (long long)index, d, (long long)n);
        return fail(t);
    }
    if (index < 0) index += n;
    int64_t sh[EM_MAX_RANK], st[EM_MAX_RANK];
    int r = 0;
    for (int i = 0; i < t->rank; i++) {
        if (i == d) continue;
        sh[r] = t->shape[i];
        st[r++] = t->stride[i];
    }
    em_top_params p = tn_params_k(d);
    p.ni = 1;
    p.i[0] = index;
    return make_view(t, r, sh, st, t->offset + index * t->stride[d], EM_TOP_SELECT, &p);
}

int em_split(const em_tensor *t, int64_t size, int dim, em_tensor **out, int max_out)
{
    if (!t) return -1;
    int d = tn_dim("split", dim, t->rank);
    if (d < 0 || t->rank == 0 || size < 1 || !out) {
        if (d >= 0) em_set_error(EM_ERR_INVALID, "split: bad split size %lld or no output array", (long long)size);
        tn_done(t);
        return -1;
    }
    int64_t n = t->shape[d];
    int64_t pieces = n == 0 ? 1 : (n + size - 1) / size;
    if (pieces > max_out) {
        em_set_error(EM_ERR_INVALID, "split: %lld pieces do not fit in %d outputs", (long long)pieces, max_out);
        tn_done(t);
        return -1;
    }
    for (int64_t i = 0; i < pieces; i++) {
        out[i] = em_slice(t, d, i * size, (i + 1) * size, 1);
        if (!out[i]) {
            for (int64_t j = 0; j < i; j++) em_release(out[j]);
            tn_done(t);
            return -1;
        }
    }
    tn_done(t);
    return (int)pieces;
}

int em_chunk(const em_tensor *t, int n, int dim, em_tensor **out, int max_out)
{
    if (!t) return -1;
    int d = tn_dim("chunk", dim, t->rank);
    if (d < 0 || n < 1) {
        if (d >= 0) em_set_error(EM_ERR_INVALID, "chunk: the number of chunks must be at least 1, got %d", n);
        tn_done(t);
        return -1;
    }
    int64_t len = t->rank ? t->shape[d] : 1;
    int64_t size = (len + n - 1) / n;
    return em_split(t, size ? size : 1, d, out, max_out);
}

/* ---- copies ---------------------------------------------------------------------------------- */

static em_tensor *launch_simple(const char *op, const char *kernel, const em_tensor *t,
                                const em_lang_bind *extra, size_t nextra, tn_arg *scalar)
{
    em_tensor *out = tn_new(t->st->dev, t->dtype, t->rank, t->shape);
    if (!out) return NULL;
    int64_t n = em_numel(t);
    if (n == 0) return out;
    int rank = t->rank ? t->rank : 1;
    int64_t one = 1;
    em_lang_bind b[6] = {em_lang_bind_type("T", t->dtype), em_lang_bind_int("R", rank)};
    for (size_t i = 0; i < nextra; i++) b[2 + i] = extra[i];
    tn_arg args[3] = {t->rank ? tn_arg_t(t) : tn_arg_geom(t, 1, &one, &one, t->offset),
                      t->rank ? tn_arg_t(out) : tn_arg_geom(out, 1, &one, &one, 0)};
    size_t na = 2;
    if (scalar) args[na++] = *scalar;
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)n, cubes, units);
    if (tn_launch(op, t->st->dev, kernel, b, 2 + nextra, 1, cubes, units, args, na) != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em_flip(const em_tensor *t, const int *dims, int ndims)
{
    if (!t) return NULL;
    uint32_t mask = 0;
    for (int i = 0; i < ndims; i++) {
        int d = tn_dim("flip", dims[i], t->rank);
        if (d < 0) return fail(t);
        mask |= 1u << d;
    }
    if (t->rank == 0) mask = 0;
    em_lang_bind b = em_lang_bind_int("FLIP", mask);
    em_tensor *out = launch_simple("flip", "tensor_flip", t, &b, 1, NULL);
    em_top_params p = tn_params_k(0);
    for (int d = 0; d < t->rank; d++)
        if (mask & (1u << d)) p.i[p.ni++] = d;
    tn_record(EM_TOP_FLIP, &p, &t, 1, out);
    tn_done(t);
    return out;
}

static em_tensor *tri(const char *op, const em_tensor *t, int64_t k, bool upper)
{
    if (!t) return NULL;
    if (t->rank < 2) {
        em_set_error(EM_ERR_INVALID, "%s: needs a tensor of rank 2 or more, got rank %d", op, t->rank);
        return fail(t);
    }
    em_lang_bind b = em_lang_bind_bool("UPPER", upper);
    em_arg ka = em_arg_i32(0);
    ka.value_class = EM_ARG_INT;
    ka.value.i = k;
    tn_arg s = tn_arg_s(ka);
    em_tensor *out = launch_simple(op, "tensor_tri", t, &b, 1, &s);
    em_top_params p = tn_params_k(k);
    tn_record(upper ? EM_TOP_TRIU : EM_TOP_TRIL, &p, &t, 1, out);
    tn_done(t);
    return out;
}

em_tensor *em_tril(const em_tensor *t, int64_t k) { return tri("tril", t, k, false); }
em_tensor *em_triu(const em_tensor *t, int64_t k) { return tri("triu", t, k, true); }

static em_tensor *cat_chunked(em_tensor *const *ts, int n, int dim);

em_tensor *em_cat(em_tensor *const *ts, int n, int dim)
{
    em_tensor *out = NULL;
    if (!ts || n < 1) {
        em_set_error(EM_ERR_INVALID, "cat: no tensors given");
        return NULL;
    }
    if (n > EM_TOP_MAX_INPUTS && tn_recording((const em_tensor *const *)ts, n))
        return cat_chunked(ts, n, dim);
    for (int i = 0; i < n; i++)
        if (!ts[i]) goto done;
    const em_tensor *a = ts[0];
    int d = tn_dim("cat", dim, a->rank);
    if (d < 0) goto done;
    if (a->rank == 0) {
        em_set_error(EM_ERR_INVALID, "cat: 0-d tensors cannot be concatenated (use stack)");
        goto done;
    }
    int64_t shape[EM_MAX_RANK];
    memcpy(shape, a->shape, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const em_tensor *b = ts[i];
        if (!tn_same_device("cat", a, b)) goto done;
        bool ok = b->rank == a->rank && b->dtype == a->dtype;
        for (int j = 0; ok && j < a->rank; j++)
            if (j != d && b->shape[j] != a->shape[j]) ok = false;
        if (!ok) {
            char sa[128], sb[128];
            em_set_error(EM_ERR_INVALID, "cat: tensors %s and %s do not match outside dim %d",
                         em_describe(a, sa, sizeof sa), em_describe(b, sb, sizeof sb), d);
            goto done;
        }
        shape[d] += b->shape[d];
    }
    out = tn_new(a->st->dev, a->dtype, a->rank, shape);
    if (!out) goto done;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t sh[EM_MAX_RANK];
        memcpy(sh, out->shape, sizeof sh);
        sh[d] = ts[i]->shape[d];
        em_tensor *dst = tn_view(out, out->rank, sh, out->stride, at * out->stride[d]);
        em_status st = dst ? tn_copy_into("cat", dst, ts[i]) : EM_ERR_NOMEM;
        em_release(dst);
        if (st != EM_OK) {
            em_release(out);
            out = NULL;
            goto done;
        }
        at += ts[i]->shape[d];
    }
    if (tn_recording((const em_tensor *const *)ts, n)) {
        em_top_params p = tn_params_k(d);
        tn_record(EM_TOP_CAT, &p, (const em_tensor *const *)ts, n, out);
    }
done:
    for (int i = 0; i < n; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup |= ts[j] == ts[i];
        if (!dup) tn_done(ts[i]);
    }
    return out;
}

/* A recorded cat of more inputs than an op reports: cats of chunks, then a cat of those (each
 * reported). Donated inputs are released once at the end. */
static em_tensor *cat_chunked(em_tensor *const *ts, int n, int dim)
{
    bool *taken = calloc((size_t)n, sizeof *taken);
    size_t nparts = (size_t)(n + EM_TOP_MAX_INPUTS - 1) / EM_TOP_MAX_INPUTS;
    em_tensor **parts = calloc(nparts, sizeof *parts);
    em_tensor *out = NULL;
    int np = 0;
    if (!taken || !parts) {
        em_set_error(EM_ERR_NOMEM, "cat: out of host memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        taken[i] = ts[i] && ts[i]->taken;
        if (ts[i]) ts[i]->taken = false;
    }
    for (int i = 0; i < n; i += EM_TOP_MAX_INPUTS) {
        int m = n - i < EM_TOP_MAX_INPUTS ? n - i : EM_TOP_MAX_INPUTS;
        parts[np] = em_cat(ts + i, m, dim);
        if (!parts[np]) goto done;
        np++;
    }
    out = em_cat(parts, np, dim);
done:
    for (int i = 0; i < np; i++) em_release(parts[i]);
    for (int i = 0; taken && i < n; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup |= ts[j] == ts[i];
        if (ts[i]) ts[i]->taken = taken[i];
        if (!dup && taken[i]) tn_done(ts[i]);
    }
    free(taken);
    free(parts);
    return out;
}

em_tensor *em_stack(em_tensor *const *ts, int n, int dim)
{
    if (!ts || n < 1 || n > 4096) {
        em_set_error(EM_ERR_INVALID, "stack: bad number of tensors %d", n);
        return NULL;
    }
    em_tensor *views[4096];
    em_tensor *out = NULL;
    int made = 0;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) goto done;
        if (i > 0 && (ts[i]->rank != ts[0]->rank ||
                      memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * (size_t)ts[0]->rank))) {
            char sa[128], sb[128];
            em_set_error(EM_ERR_INVALID, "stack: shapes %s and %s differ", em_describe(ts[0], sa, sizeof sa),
                         em_describe(ts[i], sb, sizeof sb));
            goto done;
        }
        bool taken = ts[i]->taken;
        ts[i]->taken = false;
        views[i] = em_unsqueeze(ts[i], dim);
        ts[i]->taken = taken;
        if (!views[i]) goto done;
        made++;
    }
    out = em_cat(views, n, dim);
done:
    for (int i = 0; i < made; i++) em_release(views[i]);
    for (int i = 0; i < n; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup |= ts[j] == ts[i];
        if (!dup) tn_done(ts[i]);
    }
    return out;
}

em_tensor *em_pad(const em_tensor *t, const int64_t *pads, int npads, double value)
{
    if (!t) return NULL;
    if (npads < 0 || npads % 2 || npads > 2 * t->rank || (npads && !pads)) {
        em_set_error(EM_ERR_INVALID, "pad: %d pad values for a tensor of rank %d (need an even count up to %d)",
                     npads, t->rank, 2 * t->rank);
        return fail(t);
    }
    int64_t shape[EM_MAX_RANK], off[EM_MAX_RANK] = {0};
    memcpy(shape, t->shape, sizeof shape);
    for (int i = 0; i < npads / 2; i++) {
        int d = t->rank - 1 - i;
        if (pads[2 * i] < 0 || pads[2 * i + 1] < 0) {
            em_set_error(EM_ERR_INVALID, "pad: negative padding is not supported");
            return fail(t);
        }
        shape[d] += pads[2 * i] + pads[2 * i + 1];
        off[d] = pads[2 * i];
    }
    em_shape s = {t->rank, {0}};
    memcpy(s.d, shape, sizeof shape);
    em_tensor *out = em_full(t->st->dev, t->dtype, s, value);
    if (!out) return fail(t);
    int64_t start = 0;
    for (int i = 0; i < t->rank; i++) start += off[i] * out->stride[i];
    em_tensor *dst = tn_view(out, t->rank, t->shape, out->stride, start);
    em_status st = dst ? tn_copy_into("pad", dst, t) : EM_ERR_NOMEM;
    em_release(dst);
    if (st == EM_OK) {
        em_top_params p = tn_params_k(0);
        p.f[0] = value;
        p.ni = npads;
        for (int i = 0; i < npads; i++) p.i[i] = pads[i];
        tn_record(EM_TOP_PAD, &p, &t, 1, out);
    }
    tn_done(t);
    if (st != EM_OK) {
        em_release(out);
        return NULL;
    }
    return out;
}
