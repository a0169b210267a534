/* create.c — creation of tensors (empty, zeros, ones, full, arange, linspace, eye, from host data)
 * and the way back to the host (em_to_host for any view, em_item), plus copies across devices.
 * Filling runs (or, with fusion on, records) the elementwise kernel, so a full tensor's buffer is
 * allocated when the fill runs (tn_new_deferred); arange/linspace/eye are computed on the host in
 * double and uploaded, so they are exact and identical on every device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/internal.h"

static bool check_shape(const char *op, em_shape s)
{
    if (s.rank < 0 || s.rank > EM_MAX_RANK) {
        em_set_error(EM_ERR_INVALID, "%s: rank %d is out of range (0..%d)", op, s.rank, EM_MAX_RANK);
        return false;
    }
    for (int i = 0; i < s.rank; i++) {
        if (s.d[i] < 0) {
            em_set_error(EM_ERR_INVALID, "%s: negative size %lld in dim %d", op, (long long)s.d[i], i);
            return false;
        }
    }
    return true;
}

em_tensor *em_empty(em_device *dev, em_scalar dtype, em_shape shape)
{
    if (!check_shape("empty", shape)) return NULL;
    return tn_new(dev, dtype, shape.rank, shape.d);
}

em_tensor *em_full(em_device *dev, em_scalar dtype, em_shape shape, double value)
{
    if (!check_shape("full", shape)) return NULL;
    em_tensor *t = tn_new_deferred(dev, dtype, shape.rank, shape.d);
    if (t && tn_fill(t, value) != EM_OK) {
        em_release(t);
        return NULL;
    }
    return t;
}

em_tensor *em_zeros(em_device *dev, em_scalar dtype, em_shape shape)
{
    return em_full(dev, dtype, shape, 0);
}

em_tensor *em_ones(em_device *dev, em_scalar dtype, em_shape shape)
{
    return em_full(dev, dtype, shape, 1);
}

em_tensor *em_scalar_tensor(em_device *dev, em_scalar dtype, double value)
{
    return em_full(dev, dtype, EM_SHAPE(), value);
}

em_tensor *em_from_host(em_device *dev, em_scalar dtype, em_shape shape, const void *data)
{
    if (!check_shape("from_host", shape)) return NULL;
    em_tensor *t = tn_new(dev, dtype, shape.rank, shape.d);
    if (!t) return NULL;
    size_t bytes = (size_t)tn_numel(shape.rank, shape.d) * em_scalar_size(dtype);
    if (bytes && !data) {
        em_set_error(EM_ERR_INVALID, "from_host: no data given");
        em_release(t);
        return NULL;
    }
    if (bytes && em_buffer_write(t->st->buf, 0, data, bytes) != EM_OK) {
        em_error_context("from_host");
        em_release(t);
        return NULL;
    }
    return t;
}

/* Uploads n doubles converted to dtype as a new 1-D or 2-D tensor. */
static em_tensor *from_doubles(const char *op, em_device *dev, em_scalar dtype, em_shape shape,
                               const double *v)
{
    if (!tn_check_dtype_supported(op, dtype)) return NULL;
    size_t n = (size_t)tn_numel(shape.rank, shape.d);
    void *host = malloc(n * em_scalar_size(dtype) + 1);
    if (!host) {
        em_set_error(EM_ERR_NOMEM, "%s: out of host memory", op);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) tn_host_set(dtype, host, i, v[i]);
    em_tensor *t = em_from_host(dev, dtype, shape, host);
    free(host);
    return t;
}

em_tensor *em_arange(em_device *dev, em_scalar dtype, double start, double end, double step)
{
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step) ||
        (step > 0 && end < start) || (step < 0 && end > start)) {
        em_set_error(EM_ERR_INVALID, "arange: bad range [%g, %g) with step %g", start, end, step);
        return NULL;
    }
    double cnt = ceil((end - start) / step);
    if (cnt > 1e9) {
        em_set_error(EM_ERR_INVALID, "arange: %g elements is too many", cnt);
        return NULL;
    }
    int64_t n = (int64_t)cnt;
    double *v = malloc(sizeof(double) * (size_t)(n + 1));
    if (!v) {
        em_set_error(EM_ERR_NOMEM, "arange: out of host memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) v[i] = start + (double)i * step;
    em_tensor *t = from_doubles("arange", dev, dtype, EM_SHAPE(n), v);
    free(v);
    return t;
}

em_tensor *em_linspace(em_device *dev, em_scalar dtype, double start, double end, int64_t steps)
{
    if (steps < 0 || steps > 1000000000) {
        em_set_error(EM_ERR_INVALID, "linspace: steps must be in 0..1e9, got %lld", (long long)steps);
        return NULL;
    }
    double *v = malloc(sizeof(double) * (size_t)(steps + 1));
    if (!v) {
        em_set_error(EM_ERR_NOMEM, "linspace: out of host memory");
        return NULL;
    }
    double h = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
    /* Symmetric from both ends, as PyTorch does, so that the last point is exactly `end`. */
    for (int64_t i = 0; i < steps; i++)
        v[i] = i < steps / 2 ? start + h * (double)i : end - h * (double)(steps - 1 - i);
    em_tensor *t = from_doubles("linspace", dev, dtype, EM_SHAPE(steps), v);
    free(v);
    return t;
}

em_tensor *em_eye(em_device *dev, em_scalar dtype, int64_t n, int64_t m)
{
    if (m < 0) m = n;
    if (n < 0 || n * m > 100000000) {
        em_set_error(EM_ERR_INVALID, "eye: bad size %lld x %lld", (long long)n, (long long)m);
        return NULL;
    }
    double *v = calloc((size_t)(n * m + 1), sizeof(double));
    if (!v) {
        em_set_error(EM_ERR_NOMEM, "eye: out of host memory");
        return NULL;
    }
    for (int64_t i = 0; i < n && i < m; i++) v[i * m + i] = 1;
    em_tensor *t = from_doubles("eye", dev, dtype, EM_SHAPE(n, m), v);
    free(v);
    return t;
}

em_status em_to_host(const em_tensor *t, void *dst, size_t dst_bytes)
{
    if (!t) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_INVALID, "to_host: no tensor");
    size_t bytes = (size_t)em_numel(t) * em_scalar_size(t->dtype);
    if (dst_bytes < bytes) {
        char d[128];
        return em_set_error(EM_ERR_INVALID, "to_host: %s needs %zu bytes, the destination has %zu",
                            em_describe(t, d, sizeof d), bytes, dst_bytes);
    }
    if (!bytes) return EM_OK;
    em_tensor *c = tn_contig(t);
    if (!c) return em_last_status();
    em_status st = em_device_sync(c->st->dev);
    if (st == EM_OK)
        st = em_buffer_read(c->st->buf, (size_t)c->offset * em_scalar_size(c->dtype), dst, bytes);
    if (st != EM_OK) em_error_context("to_host");
    em_release(c);
    return st;
}

double em_item(const em_tensor *t)
{
    if (!t) return NAN;
    if (em_numel(t) != 1) {
        char d[128];
        em_set_error(EM_ERR_INVALID, "item: %s has %lld elements, not one", em_describe(t, d, sizeof d),
                     (long long)em_numel(t));
        return NAN;
    }
    uint8_t buf[8];
    if (em_to_host(t, buf, sizeof buf) != EM_OK) return NAN;
    return tn_host_get(t->dtype, buf, 0);
}

em_tensor *em_to_device(const em_tensor *t, em_device *dev)
{
    if (!t) return NULL;
    size_t bytes = (size_t)em_numel(t) * em_scalar_size(t->dtype);
    void *host = malloc(bytes + 1);
    if (!host) {
        em_set_error(EM_ERR_NOMEM, "to_device: out of host memory");
        return NULL;
    }
    em_tensor *out = NULL;
    if (em_to_host(t, host, bytes) == EM_OK) out = em_from_host(dev, t->dtype, em_shape_of(t), host);
    free(host);
    tn_done(t);
    return out;
}
