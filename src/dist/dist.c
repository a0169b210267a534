/* dist.c — the communicator (ember/dist.h): finding rank and world size in the launcher's
 * environment, starting MPI when there is more than one rank, binding NCCL to a CUDA device, and
 * the collectives on tensors.
 *
 * Each collective picks a path for its tensor:
 * - NCCL when the tensor lives on the CUDA device NCCL is bound to: in place on the device buffer
 *   (a non-contiguous view goes through a contiguous copy);
 * - MPI otherwise: a contiguous tensor of the CPU device is reduced in place in its host buffer;
 *   any other tensor is copied to host memory, reduced there and copied back. MPI has no 16-bit
 *   floats, so f16 / bf16 tensors are reduced as f32 and rounded back;
 * - none in a world of one without an engine: every collective is the identity.
 * The tensor layer's internals (tensor/internal.h, runtime/rt.h) give the buffer addresses, as
 * they do for nn/module.c and `ember bench`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "dist/internal.h"
#include "ember/autodiff.h"
#include "runtime/rt.h"
#include "tensor/internal.h"

#define DEFAULT_BUCKET ((size_t)25 << 20)

bool em_dist_mode_parse(const char *name, em_dist_mode *out)
{
    static const char *const names[] = {"auto", "off", "mpi", "nccl"};
    for (int i = 0; name && i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (em_dist_mode)i;
            return true;
        }
    em_set_error(EM_ERR_INVALID, "the distributed mode is auto, off, mpi or nccl, not '%s'",
                 name ? name : "(null)");
    return false;
}

/* ---- the communicator ------------------------------------------------------------------------ */

static bool env_int(const char *name, int *out)
{
    const char *s = getenv(name);
    if (!s || !*s) return false;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1 << 24) return false;
    *out = (int)v;
    return true;
}

/* Rank, size and local rank from Open MPI's or Hydra's (MPICH) environment; false when the
 * process was not started by a launcher. */
static bool launcher(int *rank, int *world, int *local)
{
    *local = 0;
    if (env_int("OMPI_COMM_WORLD_SIZE", world) && env_int("OMPI_COMM_WORLD_RANK", rank)) {
        env_int("OMPI_COMM_WORLD_LOCAL_RANK", local);
        return true;
    }
    if (env_int("PMI_SIZE", world) && env_int("PMI_RANK", rank)) {
        if (!env_int("MPI_LOCALRANKID", local)) env_int("PMI_LOCAL_RANK", local);
        return true;
    }
    return false;
}

em_dist *em_dist_init(em_dist_mode mode)
{
    em_dist *d = calloc(1, sizeof *d);
    if (!d) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    d->mode = mode;
    d->world = 1;
    int rank = 0, world = 1, local = 0;
    bool launched = mode != EM_DIST_OFF && launcher(&rank, &world, &local);
    if (mode == EM_DIST_MPI || (launched && world > 1)) {
        int mrank = 0, mworld = 1;
        d->mpi = ds_mpi_open(&mrank, &mworld);
        if (!d->mpi) {
            if (launched)
                em_error_context("started as rank %d of %d by a launcher, but MPI cannot start",
                                 rank, world);
            free(d);
            return NULL;
        }
        if (launched && (mrank != rank || mworld != world))
            EM_LOGW("dist: the launcher says rank %d of %d, MPI says %d of %d (using MPI's)", rank,
                    world, mrank, mworld);
        rank = mrank;
        world = mworld;
    }
    d->rank = rank;
    d->world = world;
    d->local_rank = local;
    return d;
}

void em_dist_free(em_dist *d)
{
    if (!d) return;
    ds_nccl_close(d->nccl);
    if (d->nccl_dev) em_device_close(d->nccl_dev);
    ds_mpi_close(d->mpi);
    free(d);
}

void em_dist_abort(em_dist *d, int code)
{
    if (d && d->mpi) ds_mpi_abort(d->mpi, code);
    fflush(NULL);
    exit(code);
}

int em_dist_rank(const em_dist *d)
{
    return d ? d->rank : 0;
}
int em_dist_world(const em_dist *d)
{
    return d ? d->world : 1;
}
int em_dist_local_rank(const em_dist *d)
{
    return d ? d->local_rank : 0;
}
const char *em_dist_engine(const em_dist *d)
{
    return !d ? "none" : d->nccl ? "nccl" : d->mpi ? "mpi" : "none";
}

/* NCCL for a CUDA device: every rank loads NCCL and they agree on whether all of them could
 * (so that none waits for the id forever); rank 0 makes the unique id and MPI carries it. */
static em_status start_nccl(em_dist *d, em_device *dev, int ordinal)
{
    em_status st = ds_nccl_load();
    unsigned char id[DS_NCCL_ID_BYTES] = {0};
    if (st == EM_OK && d->rank == 0) st = ds_nccl_unique_id(id);
    if (d->mpi) {
        char why[512];
        snprintf(why, sizeof why, "%s", st == EM_OK ? "" : em_last_error());
        int32_t ok = st == EM_OK;
        em_status cst = ds_mpi_all_reduce(d->mpi, &ok, 1, EM_I32, EM_DIST_MIN);
        if (cst != EM_OK) return cst;
        if (!ok)
            return st != EM_OK ? em_set_error(st, "%s", why)
                               : em_set_error(EM_ERR_UNSUPPORTED, "NCCL failed on another rank");
        st = ds_mpi_broadcast(d->mpi, id, sizeof id, 0);
    }
    if (st != EM_OK) return st;
    d->nccl = ds_nccl_open(ordinal, d->rank, d->world, id);
    if (!d->nccl) return em_last_status();
    d->nccl_dev = dev;
    em_device_open(em_device_name(dev)); /* our reference (the same device, counted) */
    EM_LOGI("dist: rank %d of %d: %s on %s", d->rank, d->world, ds_nccl_version(),
            em_device_name(dev));
    return EM_OK;
}

em_status em_dist_use_device(em_dist *d, em_device *dev)
{
    if (!d || !dev) return EM_OK;
    const char *name = em_device_name(dev);
    if (d->nccl_dev == dev) return EM_OK;
    if (d->nccl) {
        ds_nccl_close(d->nccl);
        em_device_close(d->nccl_dev);
        d->nccl = NULL;
        d->nccl_dev = NULL;
    }
    bool cuda = strncmp(name, "cuda:", 5) == 0;
    bool want = d->mode == EM_DIST_NCCL || (d->mode == EM_DIST_AUTO && d->world > 1);
    if (!cuda || !want) {
        if (d->mode == EM_DIST_NCCL && !cuda)
            EM_LOGW("dist: --dist nccl on %s: NCCL is for CUDA devices; using %s", name,
                    d->mpi ? "MPI" : "no engine (one rank)");
        return EM_OK;
    }
    em_status st = start_nccl(d, dev, atoi(name + 5));
    if (st == EM_OK) return EM_OK;
    if (d->mode == EM_DIST_NCCL) return em_error_context("--dist nccl");
    EM_LOGW("dist: %s; CUDA tensors go through host memory with MPI instead", em_last_error());
    em_clear_error();
    return EM_OK;
}

/* ---- tensor access --------------------------------------------------------------------------- */

typedef enum path { PATH_NONE, PATH_MPI, PATH_NCCL } path;

static path path_of(const em_dist *d, const em_tensor *t)
{
    if (!d) return PATH_NONE;
    if (d->nccl && em_tensor_device(t) == d->nccl_dev) return PATH_NCCL;
    return d->mpi ? PATH_MPI : PATH_NONE;
}

/* The address of t's first element in its buffer (host memory on the CPU, a CUdeviceptr on
 * CUDA); t must be contiguous and not empty. The buffer is marked as one whose address went out
 * (a graph's memory plan does not move it). */
static void *buffer_addr(const em_tensor *t)
{
    t->st->buf->addr_fixed = true;
    return (char *)t->st->buf->mem + (size_t)t->offset * em_scalar_size(t->dtype);
}

/* The host address of a contiguous, non-empty tensor of the CPU device; NULL otherwise. */
static void *host_addr(const em_tensor *t)
{
    if (em_numel(t) == 0 || !em_is_contiguous(t) || !t->st || !t->st->buf) return NULL;
    if (strcmp(em_device_name(em_tensor_device(t)), "cpu") != 0) return NULL;
    return buffer_addr(t);
}

static bool half(em_scalar dt)
{
    return dt == EM_F16 || dt == EM_BF16;
}

static em_status check(const char *op, const em_tensor *t, em_dist_op rop, bool reduces)
{
    if (!t) return em_set_error(EM_ERR_INVALID, "%s: no tensor", op);
    /* collectives read and write the buffer itself: pending fused work on it runs first */
    if (em_realize(t) != EM_OK) return em_error_context("%s", op);
    if (reduces && rop == EM_DIST_MEAN && !em_scalar_is_float(em_dtype(t)))
        return em_set_error(EM_ERR_INVALID, "%s: a mean needs a floating-point tensor, not %s", op,
                            em_scalar_name(em_dtype(t)));
    if (reduces && (rop < EM_DIST_SUM || rop > EM_DIST_MIN))
        return em_set_error(EM_ERR_INVALID, "%s: unknown reduction %d", op, (int)rop);
    if (reduces && em_dtype(t) == EM_BOOL)
        return em_set_error(EM_ERR_INVALID, "%s: bool tensors cannot be reduced", op);
    return EM_OK;
}

/* MPI's half of MEAN: the sum divided by the world size. */
static void divide(void *p, size_t n, em_scalar dt, int world)
{
    if (dt == EM_F32)
        for (size_t i = 0; i < n; i++) ((float *)p)[i] /= (float)world;
    else if (dt == EM_F64)
        for (size_t i = 0; i < n; i++) ((double *)p)[i] /= (double)world;
}

/* MPI all-reduce of host memory, MEAN included. */
static em_status mpi_reduce(em_dist *d, void *p, size_t n, em_scalar dt, em_dist_op op)
{
    em_status st = ds_mpi_all_reduce(d->mpi, p, n, dt, op == EM_DIST_MEAN ? EM_DIST_SUM : op);
    if (st == EM_OK && op == EM_DIST_MEAN) divide(p, n, dt, d->world);
    return st;
}

/* Writes host data (t's dtype, row-major) into t, whatever its layout and device. */
static em_status write_back(em_tensor *t, const void *data)
{
    em_tensor *tmp = em_from_host(em_tensor_device(t), em_dtype(t), em_shape_of(t), data);
    em_status st = tmp ? em_copy_(t, tmp) : em_last_status();
    em_release(tmp);
    return st;
}

/* Reduces, in a contiguous tensor on the NCCL device, in place. */
static em_status nccl_in_place(em_dist *d, em_tensor *c, em_dist_op op, bool bcast, int root)
{
    em_status st = em_realize(c);
    if (st == EM_OK) st = em_device_sync(em_tensor_device(c));
    void *p = buffer_addr(c);
    size_t n = (size_t)em_numel(c);
    if (st == EM_OK)
        st = bcast ? ds_nccl_broadcast(d->nccl, p, p, n, em_dtype(c), root)
                   : ds_nccl_all_reduce(d->nccl, p, p, n, em_dtype(c), op);
    if (st == EM_OK) st = ds_nccl_sync(d->nccl);
    return st;
}

/* All-reduce (or broadcast when bcast) of t in place, inside a scope and no-grad. */
static em_status reduce_tensor(em_dist *d, em_tensor *t, em_dist_op op, bool bcast, int root)
{
    path p = path_of(d, t);
    size_t n = (size_t)em_numel(t);
    if (p == PATH_NONE || n == 0) return EM_OK;
    em_scalar dt = em_dtype(t);
    if (p == PATH_NCCL) {
        if (em_is_contiguous(t)) return nccl_in_place(d, t, op, bcast, root);
        em_tensor *c = em_clone(t);
        em_status st = c ? nccl_in_place(d, c, op, bcast, root) : em_last_status();
        return st == EM_OK ? em_copy_(t, c) : st;
    }
    if (!bcast && half(dt)) { /* MPI has no 16-bit floats: reduce in f32 */
        em_tensor *f = em_cast(t, EM_F32);
        em_status st = f ? reduce_tensor(d, f, op, false, 0) : em_last_status();
        em_tensor *back = st == EM_OK ? em_cast(f, dt) : NULL;
        return st != EM_OK ? st : back ? em_copy_(t, back) : em_last_status();
    }
    size_t bytes = n * em_scalar_size(dt);
    void *h = host_addr(t);
    if (h && em_realize(t) != EM_OK) return em_last_status();
    if (h) return bcast ? ds_mpi_broadcast(d->mpi, h, bytes, root) : mpi_reduce(d, h, n, dt, op);
    void *buf = malloc(bytes);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "out of memory staging %zu bytes", bytes);
    em_status st = EM_OK;
    if (!bcast || d->rank == root) st = em_to_host(t, buf, bytes);
    if (st == EM_OK)
        st = bcast ? ds_mpi_broadcast(d->mpi, buf, bytes, root) : mpi_reduce(d, buf, n, dt, op);
    if (st == EM_OK && (!bcast || d->rank != root)) st = write_back(t, buf);
    free(buf);
    return st;
}

em_status em_dist_all_reduce(em_dist *d, em_tensor *t, em_dist_op op)
{
    em_status st = check("em_dist_all_reduce", t, op, true);
    if (st != EM_OK) return st;
    em_no_grad_begin();
    em_scope_begin();
    st = reduce_tensor(d, t, op, false, 0);
    em_scope_end(NULL, 0);
    em_no_grad_end();
    return st == EM_OK ? EM_OK : em_error_context("all-reduce");
}

em_status em_dist_broadcast(em_dist *d, em_tensor *t, int root)
{
    em_status st = check("em_dist_broadcast", t, EM_DIST_SUM, false);
    if (st != EM_OK) return st;
    if (root < 0 || root >= em_dist_world(d))
        return em_set_error(EM_ERR_INVALID, "em_dist_broadcast: root %d is not a rank of %d", root,
                            em_dist_world(d));
    em_no_grad_begin();
    em_scope_begin();
    st = reduce_tensor(d, t, EM_DIST_SUM, true, root);
    em_scope_end(NULL, 0);
    em_no_grad_end();
    return st == EM_OK ? EM_OK : em_error_context("broadcast");
}

/* t's shape with dim 0 multiplied (mul) or divided (div) by k; a 0-d shape becomes [k]. */
static em_shape scaled_shape(const em_tensor *t, int mul, int div)
{
    em_shape s = em_shape_of(t);
    if (s.rank == 0) return EM_SHAPE(mul);
    s.d[0] = s.d[0] * mul / div;
    return s;
}

static em_tensor *gather_or_scatter(em_dist *d, const em_tensor *t, bool gather, em_dist_op op)
{
    int w = em_dist_world(d);
    em_shape out_shape = gather ? scaled_shape(t, w, 1) : scaled_shape(t, 1, w);
    path p = path_of(d, t);
    em_scalar dt = em_dtype(t);
    em_device *dev = em_tensor_device(t);
    size_t n_in = (size_t)em_numel(t), n_out = (size_t)tn_numel(out_shape.rank, out_shape.d);
    if (p == PATH_NONE || n_in == 0) {
        em_tensor *c = em_clone(t);
        em_tensor *r = c ? em_reshape(c, out_shape) : NULL;
        em_release(c);
        return r;
    }
    if (!gather && p == PATH_MPI && half(dt)) {
        em_tensor *f = em_cast(t, EM_F32);
        em_tensor *r = f ? gather_or_scatter(d, f, false, op) : NULL;
        return r ? em_cast(r, dt) : NULL;
    }
    em_tensor *in = em_contiguous(t);
    em_tensor *out = in ? em_empty(dev, dt, out_shape) : NULL;
    if (!out) return NULL;
    /* the collective reads in's buffer and writes out's: pending fused work on them runs first */
    em_status st = em_realize(in);
    if (st == EM_OK) st = em_realize(out);
    if (st != EM_OK) return NULL;
    if (p == PATH_NCCL) {
        st = em_device_sync(dev);
        if (st == EM_OK)
            st = gather ? ds_nccl_all_gather(d->nccl, buffer_addr(in), buffer_addr(out), n_in, dt)
                        : ds_nccl_reduce_scatter(d->nccl, buffer_addr(in), buffer_addr(out), n_out,
                                                 dt, op);
        if (st == EM_OK) st = ds_nccl_sync(d->nccl);
        return st == EM_OK ? out : NULL;
    }
    size_t es = em_scalar_size(dt);
    void *send = host_addr(in), *recv = host_addr(out);
    void *sbuf = send ? NULL : malloc(n_in * es), *rbuf = recv ? NULL : malloc(n_out * es);
    if ((!send && !sbuf) || (!recv && !rbuf)) st = em_set_error(EM_ERR_NOMEM, "out of memory");
    if (st == EM_OK && !send) st = em_to_host(in, send = sbuf, n_in * es);
    if (!recv) recv = rbuf;
    if (st == EM_OK)
        st = gather ? ds_mpi_all_gather(d->mpi, send, recv, n_in * es)
                    : ds_mpi_reduce_scatter(d->mpi, send, recv, n_out, dt,
                                            op == EM_DIST_MEAN ? EM_DIST_SUM : op);
    if (st == EM_OK && !gather && op == EM_DIST_MEAN) divide(recv, n_out, dt, d->world);
    if (st == EM_OK && rbuf) st = write_back(out, rbuf);
    free(sbuf);
    free(rbuf);
    return st == EM_OK ? out : NULL;
}

em_tensor *em_dist_all_gather(em_dist *d, const em_tensor *t)
{
    if (check("em_dist_all_gather", t, EM_DIST_SUM, false) != EM_OK) return NULL;
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *r = gather_or_scatter(d, t, true, EM_DIST_SUM);
    if (!r) em_error_context("all-gather");
    em_scope_end(&r, 1);
    em_no_grad_end();
    return r;
}

em_tensor *em_dist_reduce_scatter(em_dist *d, const em_tensor *t, em_dist_op op)
{
    if (check("em_dist_reduce_scatter", t, op, true) != EM_OK) return NULL;
    int w = em_dist_world(d);
    if (em_rank(t) == 0 || em_dim(t, 0) % w != 0) {
        char s[96];
        em_set_error(EM_ERR_INVALID,
                     "em_dist_reduce_scatter: dim 0 of %s must be a multiple of the world size %d",
                     em_describe(t, s, sizeof s), w);
        return NULL;
    }
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *r = gather_or_scatter(d, t, false, op);
    if (!r) em_error_context("reduce-scatter");
    em_scope_end(&r, 1);
    em_no_grad_end();
    return r;
}

em_status em_dist_barrier(em_dist *d)
{
    if (d && d->mpi) return ds_mpi_barrier(d->mpi);
    return EM_OK;
}

/* ---- many tensors, in buckets ---------------------------------------------------------------- */

/* One bucket on the NCCL device: the members packed into one flat buffer, reduced, unpacked. */
static em_status nccl_bucket(em_dist *d, em_tensor *const *in, const int *idx, int k, em_dist_op op,
                             em_tensor **out)
{
    em_scalar dt = em_dtype(in[idx[0]]);
    int64_t total = 0;
    for (int j = 0; j < k; j++) total += em_numel(in[idx[j]]);
    em_tensor *flat = em_empty(em_tensor_device(in[idx[0]]), dt, EM_SHAPE(total));
    em_status st = flat ? EM_OK : em_last_status();
    int64_t off = 0;
    for (int j = 0; st == EM_OK && j < k; j++) {
        const em_tensor *x = in[idx[j]];
        em_tensor *slot = em_view(em_narrow(flat, 0, off, em_numel(x)), em_shape_of(x));
        st = slot ? em_copy_(slot, x) : em_last_status();
        off += em_numel(x);
    }
    if (st == EM_OK) st = nccl_in_place(d, flat, op, false, 0);
    off = 0;
    for (int j = 0; st == EM_OK && j < k; j++) {
        const em_tensor *x = in[idx[j]];
        out[idx[j]] = em_clone(em_view(em_narrow(flat, 0, off, em_numel(x)), em_shape_of(x)));
        if (!out[idx[j]]) st = em_last_status();
        off += em_numel(x);
    }
    return st;
}

/* One bucket through MPI: the members read into one host buffer, reduced, written to new
 * tensors. */
static em_status mpi_bucket(em_dist *d, em_tensor *const *in, const int *idx, int k, em_dist_op op,
                            em_tensor **out, void *host)
{
    em_scalar dt = em_dtype(in[idx[0]]);
    size_t es = em_scalar_size(dt), off = 0;
    em_status st = EM_OK;
    for (int j = 0; st == EM_OK && j < k; j++) {
        size_t n = (size_t)em_numel(in[idx[j]]);
        st = em_to_host(in[idx[j]], (char *)host + off * es, n * es);
        off += n;
    }
    if (st == EM_OK) st = mpi_reduce(d, host, off, dt, op);
    off = 0;
    for (int j = 0; st == EM_OK && j < k; j++) {
        const em_tensor *x = in[idx[j]];
        out[idx[j]] =
            em_from_host(em_tensor_device(x), dt, em_shape_of(x), (char *)host + off * es);
        if (!out[idx[j]]) st = em_last_status();
        off += (size_t)em_numel(x);
    }
    return st;
}

/* Every tensor of one (path, dtype) group, in order, in buckets of about `limit` bytes. */
static em_status reduce_group(em_dist *d, em_tensor *const *in, const int *members, int m,
                              em_dist_op op, size_t limit, em_tensor **out)
{
    path p = path_of(d, in[members[0]]);
    size_t es = em_scalar_size(em_dtype(in[members[0]]));
    void *host = NULL;
    size_t host_cap = 0;
    em_status st = EM_OK;
    for (int start = 0; st == EM_OK && start < m;) {
        size_t bytes = (size_t)em_numel(in[members[start]]) * es;
        int end = start + 1;
        while (end < m && bytes + (size_t)em_numel(in[members[end]]) * es <= limit)
            bytes += (size_t)em_numel(in[members[end++]]) * es;
        if (p == PATH_NCCL)
            st = nccl_bucket(d, in, members + start, end - start, op, out);
        else {
            if (bytes > host_cap) {
                free(host);
                host = malloc(bytes);
                host_cap = host ? bytes : 0;
                if (!host)
                    st = em_set_error(EM_ERR_NOMEM, "out of memory (a %zu-byte bucket)", bytes);
            }
            if (st == EM_OK) st = mpi_bucket(d, in, members + start, end - start, op, out, host);
        }
        start = end;
    }
    free(host);
    return st;
}

em_status em_dist_all_reduce_many(em_dist *d, em_tensor *const *in, int n, em_dist_op op,
                                  size_t bucket_bytes, em_tensor **out)
{
    for (int i = 0; i < n; i++) out[i] = NULL;
    em_status st = EM_OK;
    for (int i = 0; st == EM_OK && i < n; i++)
        if (in[i]) st = check("em_dist_all_reduce_many", in[i], op, true);
    if (st != EM_OK) return st;
    int *members = malloc((size_t)(n > 0 ? n : 1) * sizeof *members);
    bool *done = calloc((size_t)(n > 0 ? n : 1), sizeof *done);
    if (!members || !done) {
        free(members);
        free(done);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    if (bucket_bytes == 0) bucket_bytes = DEFAULT_BUCKET;
    em_no_grad_begin();
    em_scope_begin();
    for (int i = 0; st == EM_OK && i < n; i++) {
        if (!in[i] || done[i]) continue;
        path p = path_of(d, in[i]);
        em_scalar dt = em_dtype(in[i]);
        if (p == PATH_NONE || em_numel(in[i]) == 0 || (p == PATH_MPI && half(dt))) {
            /* the identity, an empty tensor, or a 16-bit float for MPI: one at a time */
            done[i] = true;
            out[i] = em_clone(in[i]);
            st = out[i] ? reduce_tensor(d, out[i], op, false, 0) : em_last_status();
            continue;
        }
        int m = 0;
        for (int j = i; j < n; j++)
            if (in[j] && !done[j] && em_numel(in[j]) > 0 && path_of(d, in[j]) == p &&
                em_dtype(in[j]) == dt)
                members[m++] = j, done[j] = true;
        st = reduce_group(d, in, members, m, op, bucket_bytes, out);
    }
    if (st != EM_OK)
        for (int i = 0; i < n; i++) out[i] = NULL; /* released by the scope */
    em_scope_end(out, (size_t)n);
    em_no_grad_end();
    free(members);
    free(done);
    return st == EM_OK ? EM_OK : em_error_context("all-reduce of %d tensors", n);
}

/* ---- host values ----------------------------------------------------------------------------- */

em_status em_dist_all_reduce_host(em_dist *d, void *values, size_t n, em_scalar dtype,
                                  em_dist_op op)
{
    if (op == EM_DIST_MEAN && dtype != EM_F32 && dtype != EM_F64)
        return em_set_error(EM_ERR_INVALID, "em_dist_all_reduce_host: a mean needs f32 or f64");
    if (!d || !d->mpi || n == 0) return EM_OK;
    em_status st = mpi_reduce(d, values, n, dtype, op);
    return st == EM_OK ? EM_OK : em_error_context("all-reduce of %zu host values", n);
}

em_status em_dist_broadcast_host(em_dist *d, void *data, size_t bytes, int root)
{
    if (root < 0 || root >= em_dist_world(d))
        return em_set_error(EM_ERR_INVALID, "em_dist_broadcast_host: root %d is not a rank of %d",
                            root, em_dist_world(d));
    if (!d || !d->mpi || bytes == 0) return EM_OK;
    return ds_mpi_broadcast(d->mpi, data, bytes, root);
}
