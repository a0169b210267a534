/* tensor.c — the tensor type: views on reference-counted storage, accessors, reference counting,
 * donation with em_take (a storage freed while a fused computation is still pending drops it
 * uncomputed: tensor/fusion.h; a deferred storage gets its buffer only when that computation runs
 * or a kernel binds it), and the argument checks every op shares (dims, dtypes, devices), which
 * set errors in the house style ("add: shapes f32[2, 3] and f32[4] cannot be broadcast"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion.h"
#include "tensor/internal.h"

em_scalar em_dtype(const em_tensor *t) { return t ? t->dtype : EM_SCALAR_COUNT; }
int em_rank(const em_tensor *t) { return t ? t->rank : -1; }

em_shape em_shape_of(const em_tensor *t)
{
    em_shape s = {0, {0}};
    if (!t) return s;
    s.rank = t->rank;
    for (int i = 0; i < t->rank; i++) s.d[i] = t->shape[i];
    return s;
}

int64_t em_dim(const em_tensor *t, int dim)
{
    if (!t) return -1;
    int d = tn_dim("dim", dim, t->rank);
    return d < 0 ? -1 : t->shape[d];
}

int64_t em_stride(const em_tensor *t, int dim)
{
    if (!t) return -1;
    int d = tn_dim("stride", dim, t->rank);
    return d < 0 ? -1 : t->stride[d];
}

int64_t em_numel(const em_tensor *t) { return t ? tn_numel(t->rank, t->shape) : 0; }
em_device *em_tensor_device(const em_tensor *t) { return t ? t->st->dev : NULL; }

bool em_is_contiguous(const em_tensor *t)
{
    if (!t) return false;
    int64_t expect = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

void tn_describe_shape(em_scalar dt, int rank, const int64_t *shape, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "%s[", em_scalar_name(dt) ? em_scalar_name(dt) : "?");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

const char *em_describe(const em_tensor *t, char *buf, size_t size)
{
    if (!buf || !size) return buf;
    if (!t) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    tn_describe_shape(t->dtype, t->rank, t->shape, buf, size);
    return buf;
}

/* ---- reference counting ---------------------------------------------------------------------- */

void tn_storage_retain(tn_storage *st)
{
    if (st) atomic_fetch_add(&st->refs, 1);
}

void tn_storage_release(tn_storage *st)
{
    if (st && atomic_fetch_sub(&st->refs, 1) == 1) {
        if (st->pending) fu_drop(st); /* nobody can read it any more: never computed */
        em_buffer_free(st->buf);
        free(st);
    }
}

em_tensor *em_retain(em_tensor *t)
{
    if (t) atomic_fetch_add(&t->refs, 1);
    return t;
}

static void tensor_free(em_tensor *t)
{
    if (t->annotation) tn_release_annotation(t);
    tn_storage_release(t->st);
    free(t);
}

void em_release(em_tensor *t)
{
    if (!t) return;
    if (atomic_fetch_sub(&t->refs, 1) == 1) {
        /* The last reference: a scope still listing the tensor forgets it. */
        if (t->scope) tn_scope_forget(t);
        tensor_free(t);
    }
}

em_tensor *em_take(em_tensor *t)
{
    if (t) t->taken = true;
    return t;
}

void tn_done(const em_tensor *t)
{
    if (t && t->taken) em_release((em_tensor *)t);
}

bool tn_reusable(const em_tensor *t)
{
    /* An annotated tensor may be saved by (or recorded into) the op recorder's graph. */
    return t && t->taken && !t->annotation && atomic_load(&t->refs) == 1 &&
           atomic_load(&t->st->refs) == 1 && em_is_contiguous(t) && t->offset == 0;
}

bool em_tensor_exclusive(const em_tensor *t)
{
    return t && atomic_load(&t->refs) == 1 && atomic_load(&t->st->refs) == 1;
}

void em_tensor_untrack(em_tensor *t)
{
    if (t && t->scope) tn_scope_forget(t);
}

em_tensor *em_tensor_alias(const em_tensor *t)
{
    if (!t) return NULL;
    em_tensor *v = tn_view(t, t->rank, t->shape, t->stride, t->offset);
    em_tensor_untrack(v);
    return v;
}

/* ---- construction ---------------------------------------------------------------------------- */

int64_t tn_numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

void tn_contig_strides(int rank, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

static em_tensor *tensor_alloc(void)
{
    em_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        em_set_error(EM_ERR_NOMEM, "tensor: out of host memory");
        return NULL;
    }
    atomic_init(&t->refs, 1);
    return t;
}

em_tensor *tn_view(const em_tensor *base, int rank, const int64_t *shape, const int64_t *stride,
                   int64_t offset)
{
    em_tensor *t = tensor_alloc();
    if (!t) return NULL;
    t->st = base->st;
    tn_storage_retain(t->st);
    t->dtype = base->dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) {
        t->shape[i] = shape[i];
        t->stride[i] = stride[i];
    }
    t->offset = offset;
    return tn_scope_track(t);
}

em_status tn_rebase(em_tensor *t, const em_tensor *region)
{
    char a[128], b[128];
    if (!t || !region || region->dtype != t->dtype || region->st->dev != t->st->dev ||
        em_numel(region) != em_numel(t) || !em_is_contiguous(region) || region->st == t->st)
        return em_set_error(EM_ERR_INVALID, "rebase: %s cannot move into %s",
                            t ? em_describe(t, a, sizeof a) : "NULL",
                            region ? em_describe(region, b, sizeof b) : "NULL");
    em_status st = em_realize(t); /* also runs what reads t, so only views hold the storage */
    if (st != EM_OK) return st;
    if (atomic_load(&t->st->refs) != 1)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "rebase: the storage of %s is shared with another view, which "
                            "would keep the old values",
                            em_describe(t, a, sizeof a));
    int64_t stride[EM_MAX_RANK];
    tn_contig_strides(t->rank, t->shape, stride);
    em_tensor *dst = tn_view(region, t->rank, t->shape, stride, region->offset);
    if (!dst) return em_last_status();
    em_tensor_untrack(dst);
    st = em_copy_(dst, t);
    if (st == EM_OK) st = em_realize(dst);
    if (st == EM_OK) {
        tn_storage_retain(region->st);
        tn_storage_release(t->st);
        t->st = region->st;
        t->offset = region->offset;
        memcpy(t->stride, stride, sizeof stride);
    }
    em_release(dst);
    return st;
}

bool tn_check_dtype_supported(const char *op, em_scalar dt)
{
    switch (dt) {
    case EM_F32: case EM_F16: case EM_BF16: case EM_F64: case EM_I32: case EM_I64: case EM_U8:
    case EM_BOOL:
        return true;
    default:
        em_set_error(EM_ERR_INVALID, "%s: unsupported dtype %s (tensors hold f32, f16, bf16, f64, i32, "
                     "i64, u8 or bool)", op, em_scalar_name(dt) ? em_scalar_name(dt) : "(invalid)");
        return false;
    }
}

/* A new contiguous tensor; its buffer is allocated now, or when first needed when deferred. */
static em_tensor *new_tensor(em_device *dev, em_scalar dtype, int rank, const int64_t *shape,
                             bool deferred)
{
    if (!dev) {
        em_set_error(EM_ERR_INVALID, "tensor: no device given");
        return NULL;
    }
    if (!tn_check_dtype_supported("tensor", dtype)) return NULL;
    const em_caps *caps = em_device_caps(dev);
    if (caps && !caps->dtype[dtype]) {
        em_set_error(EM_ERR_UNSUPPORTED, "tensor: device %s does not support %s", em_device_name(dev),
                     em_scalar_name(dtype));
        return NULL;
    }
    if (rank < 0 || rank > EM_MAX_RANK) {
        em_set_error(EM_ERR_INVALID, "tensor: rank %d is out of range (0..%d)", rank, EM_MAX_RANK);
        return NULL;
    }
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) {
            em_set_error(EM_ERR_INVALID, "tensor: negative size %lld in dim %d", (long long)shape[i], i);
            return NULL;
        }
    }
    int64_t n = tn_numel(rank, shape);
    if (n > (int64_t)UINT32_MAX) {
        em_set_error(EM_ERR_UNSUPPORTED, "tensor: %lld elements is more than the 2^32 - 1 supported",
                     (long long)n);
        return NULL;
    }
    tn_storage *st = calloc(1, sizeof *st);
    em_tensor *t = tensor_alloc();
    if (!st || !t) {
        free(st);
        free(t);
        em_set_error(EM_ERR_NOMEM, "tensor: out of host memory");
        return NULL;
    }
    atomic_init(&st->refs, 1);
    st->dev = dev;
    st->bytes = (size_t)n * em_scalar_size(dtype);
    /* Zero-size tensors still get a small buffer, so that every view has one to name. A deferred
     * one gets its buffer from fu_realize, when its pending computation runs or a kernel binds
     * it. */
    bool now = !deferred || !st->bytes;
    if (now) st->buf = em_buffer_alloc(dev, st->bytes ? st->bytes : 16);
    if (now && !st->buf) {
        em_error_context("tensor of %lld elements", (long long)n);
        free(st);
        free(t);
        return NULL;
    }
    t->st = st;
    t->dtype = dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->shape[i] = shape[i];
    tn_contig_strides(rank, shape, t->stride);
    return tn_scope_track(t);
}

em_tensor *tn_new(em_device *dev, em_scalar dtype, int rank, const int64_t *shape)
{
    return new_tensor(dev, dtype, rank, shape, false);
}

em_tensor *tn_new_deferred(em_device *dev, em_scalar dtype, int rank, const int64_t *shape)
{
    return new_tensor(dev, dtype, rank, shape, fu_enabled()); /* unfused, the op runs at once */
}

/* ---- checks ---------------------------------------------------------------------------------- */

int tn_dim(const char *op, int dim, int rank)
{
    int r = rank ? rank : 1;
    if (dim < -r || dim >= r) {
        em_set_error(EM_ERR_INVALID, "%s: dim %d is out of range for a tensor of rank %d (expected %d..%d)",
                     op, dim, rank, -r, r - 1);
        return -1;
    }
    return dim < 0 ? dim + r : dim;
}

bool tn_same_device(const char *op, const em_tensor *a, const em_tensor *b)
{
    if (a->st->dev == b->st->dev) return true;
    em_set_error(EM_ERR_INVALID, "%s: tensors are on different devices (%s and %s)", op,
                 em_device_name(a->st->dev), em_device_name(b->st->dev));
    return false;
}
