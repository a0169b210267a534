/* mpi.c — the MPI engine: collectives on host buffers through Open MPI, loaded with dlopen so
 * that ember builds and runs where MPI is absent.
 *
 * Open MPI's predefined handles (MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM, ...) are not constants but
 * the addresses of global objects of libmpi (mpi.h: `#define MPI_FLOAT ((MPI_Datatype)
 * &ompi_mpi_float)`), so they are found with dlsym like the functions. The names and signatures
 * below are those of Open MPI 4's mpi.h (/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h on
 * Debian); they are part of its stable ABI (libmpi.so.40). MPICH's ABI uses integer handles and
 * is not supported: loading such a libmpi fails with a message saying so.
 *
 * MPI counts are C ints: all-reduce and broadcast are split into pieces of at most 2^28
 * elements; all-gather and reduce-scatter refuse larger pieces. Errors come back as return codes
 * (MPI_ERRORS_RETURN on MPI_COMM_WORLD) and become em_status values with MPI's own message. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "dist/internal.h"

typedef void *mpi_h; /* an Open MPI handle: the address of one of libmpi's objects */

#define MPI_SUCCESS 0
#define MPI_THREAD_FUNNELED 1 /* mpi.h's enum: SINGLE, FUNNELED, SERIALIZED, MULTIPLE */
#define MPI_IN_PLACE ((void *)1)
#define MPI_MAX_ERROR_STRING 256
#define MAX_PIECE ((size_t)1 << 28) /* elements per call (fits a C int in bytes too) */

/* The entry points and predefined objects, found by dlsym. */
typedef struct mpi_api {
    int (*Initialized)(int *);
    int (*Init_thread)(int *, char ***, int, int *);
    int (*Finalized)(int *);
    int (*Finalize)(void);
    int (*Comm_rank)(mpi_h, int *);
    int (*Comm_size)(mpi_h, int *);
    int (*Comm_set_errhandler)(mpi_h, mpi_h);
    int (*Error_string)(int, char *, int *);
    int (*Allreduce)(const void *, void *, int, mpi_h, mpi_h, mpi_h);
    int (*Bcast)(void *, int, mpi_h, int, mpi_h);
    int (*Allgather)(const void *, int, mpi_h, void *, int, mpi_h, mpi_h);
    int (*Reduce_scatter_block)(const void *, void *, int, mpi_h, mpi_h, mpi_h);
    int (*Barrier)(mpi_h);
    int (*Abort)(mpi_h, int);
    mpi_h comm_world, errors_return;
    mpi_h byte, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64;
    mpi_h sum, max, min;
} mpi_api;

struct ds_mpi {
    void *lib;      /* the dlopen handle */
    mpi_api api;    /* its entry points */
    bool started;   /* we called MPI_Init (so we finalize) */
    int world;      /* MPI_Comm_size */
    char path[128]; /* the library that was loaded */
};

/* Sets an error from an MPI return code: "MPI_Allreduce failed: <MPI's message>". */
static em_status mpi_fail(ds_mpi *m, int code, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    if (m->api.Error_string && m->api.Error_string(code, msg, &len) == MPI_SUCCESS && len >= 0 &&
        len <= MPI_MAX_ERROR_STRING)
        msg[len] = 0;
    else
        snprintf(msg, sizeof msg, "error %d", code);
    return em_set_error(EM_ERR_DEVICE, "%s failed: %s", call, msg);
}

static bool find(ds_mpi *m, void **out, const char *name, char *missing, size_t size)
{
    *out = dlsym(m->lib, name);
    if (!*out && !missing[0]) snprintf(missing, size, "%s", name);
    return *out != NULL;
}

#define FN(field, name) find(m, (void **)&m->api.field, name, missing, sizeof missing)
#define OBJ(field, name) find(m, &m->api.field, name, missing, sizeof missing)

static em_status load(ds_mpi *m)
{
    const char *env = getenv("EMBER_MPI_LIB");
    const char *names[] = {env && *env ? env : NULL, "libmpi.so.40", "libmpi.so"};
    char tried[512] = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !m->lib; i++) {
        if (!names[i]) continue;
        /* RTLD_GLOBAL: Open MPI's components (dlopen'd by libmpi) resolve symbols of libmpi and
         * libopen-pal through the global scope. */
        m->lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (m->lib)
            snprintf(m->path, sizeof m->path, "%s", names[i]);
        else {
            size_t n = strlen(tried);
            snprintf(tried + n, sizeof tried - n, "%s%s", n ? "; " : "", dlerror());
        }
    }
    if (!m->lib)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "MPI is not available (%s); install Open MPI (Debian: libopenmpi-dev "
                            "openmpi-bin) or set EMBER_MPI_LIB",
                            tried);
    char missing[96] = "";
    if (!dlsym(m->lib, "ompi_mpi_comm_world"))
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "%s is not Open MPI (no ompi_mpi_comm_world); only Open MPI's ABI is "
                            "supported (MPICH's integer handles are not)",
                            m->path);
    FN(Initialized, "MPI_Initialized");
    FN(Init_thread, "MPI_Init_thread");
    FN(Finalized, "MPI_Finalized");
    FN(Finalize, "MPI_Finalize");
    FN(Comm_rank, "MPI_Comm_rank");
    FN(Comm_size, "MPI_Comm_size");
    FN(Comm_set_errhandler, "MPI_Comm_set_errhandler");
    FN(Error_string, "MPI_Error_string");
    FN(Allreduce, "MPI_Allreduce");
    FN(Bcast, "MPI_Bcast");
    FN(Allgather, "MPI_Allgather");
    FN(Reduce_scatter_block, "MPI_Reduce_scatter_block");
    FN(Barrier, "MPI_Barrier");
    FN(Abort, "MPI_Abort");
    OBJ(comm_world, "ompi_mpi_comm_world");
    OBJ(errors_return, "ompi_mpi_errors_return");
    OBJ(byte, "ompi_mpi_byte");
    OBJ(f32, "ompi_mpi_float");
    OBJ(f64, "ompi_mpi_double");
    OBJ(i8, "ompi_mpi_int8_t");
    OBJ(i16, "ompi_mpi_int16_t");
    OBJ(i32, "ompi_mpi_int32_t");
    OBJ(i64, "ompi_mpi_int64_t");
    OBJ(u8, "ompi_mpi_uint8_t");
    OBJ(u16, "ompi_mpi_uint16_t");
    OBJ(u32, "ompi_mpi_uint32_t");
    OBJ(u64, "ompi_mpi_uint64_t");
    OBJ(sum, "ompi_mpi_op_sum");
    OBJ(max, "ompi_mpi_op_max");
    OBJ(min, "ompi_mpi_op_min");
    if (missing[0])
        return em_set_error(EM_ERR_UNSUPPORTED, "%s lacks %s (not Open MPI 4's ABI?)", m->path,
                            missing);
    return EM_OK;
}

ds_mpi *ds_mpi_open(int *rank, int *world)
{
    ds_mpi *m = calloc(1, sizeof *m);
    if (!m) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    em_status st = load(m);
    int flag = 0, r;
    if (st == EM_OK && (r = m->api.Initialized(&flag)) != MPI_SUCCESS)
        st = mpi_fail(m, r, "MPI_Initialized");
    if (st == EM_OK && !flag) {
        int provided = 0;
        r = m->api.Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (r != MPI_SUCCESS)
            st = mpi_fail(m, r, "MPI_Init_thread");
        else
            m->started = true;
    }
    if (st == EM_OK &&
        (r = m->api.Comm_set_errhandler(m->api.comm_world, m->api.errors_return)) != MPI_SUCCESS)
        st = mpi_fail(m, r, "MPI_Comm_set_errhandler");
    if (st == EM_OK && (r = m->api.Comm_rank(m->api.comm_world, rank)) != MPI_SUCCESS)
        st = mpi_fail(m, r, "MPI_Comm_rank");
    if (st == EM_OK && (r = m->api.Comm_size(m->api.comm_world, world)) != MPI_SUCCESS)
        st = mpi_fail(m, r, "MPI_Comm_size");
    if (st != EM_OK) {
        ds_mpi_close(m);
        return NULL;
    }
    m->world = *world;
    return m;
}

void ds_mpi_close(ds_mpi *m)
{
    if (!m) return;
    if (m->started) {
        int done = 1;
        if (m->api.Finalized(&done) == MPI_SUCCESS && !done) m->api.Finalize();
    }
    /* libmpi stays loaded: Open MPI registers atexit handlers and threads that outlive
     * MPI_Finalize, and unloading it under them crashes. */
    free(m);
}

void ds_mpi_abort(ds_mpi *m, int code)
{
    fflush(NULL);
    m->api.Abort(m->api.comm_world, code);
    exit(code); /* MPI_Abort should not return */
}

static mpi_h dtype_of(ds_mpi *m, em_scalar dt)
{
    switch (dt) {
    case EM_F32:
        return m->api.f32;
    case EM_F64:
        return m->api.f64;
    case EM_I8:
        return m->api.i8;
    case EM_I16:
        return m->api.i16;
    case EM_I32:
        return m->api.i32;
    case EM_I64:
        return m->api.i64;
    case EM_BOOL:
    case EM_U8:
        return m->api.u8;
    case EM_U16:
        return m->api.u16;
    case EM_U32:
        return m->api.u32;
    case EM_U64:
        return m->api.u64;
    default:
        return NULL;
    }
}

static mpi_h op_of(ds_mpi *m, em_dist_op op)
{
    switch (op) {
    case EM_DIST_SUM:
        return m->api.sum;
    case EM_DIST_MAX:
        return m->api.max;
    case EM_DIST_MIN:
        return m->api.min;
    default:
        return NULL;
    }
}

static em_status check_types(ds_mpi *m, em_scalar dt, em_dist_op op, mpi_h *mdt, mpi_h *mop)
{
    *mdt = dtype_of(m, dt);
    *mop = op_of(m, op);
    if (!*mdt)
        return em_set_error(EM_ERR_UNSUPPORTED, "MPI: no reduction for dtype %s",
                            em_scalar_name(dt) ? em_scalar_name(dt) : "?");
    if (!*mop) return em_set_error(EM_ERR_INTERNAL, "MPI: reduction %d is not an MPI op", (int)op);
    return EM_OK;
}

em_status ds_mpi_all_reduce(ds_mpi *m, void *buf, size_t n, em_scalar dtype, em_dist_op op)
{
    mpi_h mdt, mop;
    em_status st = check_types(m, dtype, op, &mdt, &mop);
    size_t es = em_scalar_size(dtype);
    for (size_t at = 0; st == EM_OK && at < n; at += MAX_PIECE) {
        size_t k = n - at < MAX_PIECE ? n - at : MAX_PIECE;
        int r = m->api.Allreduce(MPI_IN_PLACE, (char *)buf + at * es, (int)k, mdt, mop,
                                 m->api.comm_world);
        if (r != MPI_SUCCESS) st = mpi_fail(m, r, "MPI_Allreduce");
    }
    return st;
}

em_status ds_mpi_broadcast(ds_mpi *m, void *buf, size_t bytes, int root)
{
    em_status st = EM_OK;
    for (size_t at = 0; st == EM_OK && at < bytes; at += MAX_PIECE) {
        size_t k = bytes - at < MAX_PIECE ? bytes - at : MAX_PIECE;
        int r = m->api.Bcast((char *)buf + at, (int)k, m->api.byte, root, m->api.comm_world);
        if (r != MPI_SUCCESS) st = mpi_fail(m, r, "MPI_Bcast");
    }
    return st;
}

em_status ds_mpi_all_gather(ds_mpi *m, const void *send, void *recv, size_t bytes)
{
    if (bytes > MAX_PIECE)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "MPI all-gather: %zu bytes per rank is too many "
                            "(at most %zu)",
                            bytes, MAX_PIECE);
    int r = m->api.Allgather(send, (int)bytes, m->api.byte, recv, (int)bytes, m->api.byte,
                             m->api.comm_world);
    return r == MPI_SUCCESS ? EM_OK : mpi_fail(m, r, "MPI_Allgather");
}

em_status ds_mpi_reduce_scatter(ds_mpi *m, const void *send, void *recv, size_t n, em_scalar dtype,
                                em_dist_op op)
{
    mpi_h mdt, mop;
    em_status st = check_types(m, dtype, op, &mdt, &mop);
    if (st != EM_OK) return st;
    if (n > MAX_PIECE)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "MPI reduce-scatter: %zu elements per rank is too "
                            "many (at most %zu)",
                            n, MAX_PIECE);
    int r = m->api.Reduce_scatter_block(send, recv, (int)n, mdt, mop, m->api.comm_world);
    return r == MPI_SUCCESS ? EM_OK : mpi_fail(m, r, "MPI_Reduce_scatter_block");
}

em_status ds_mpi_barrier(ds_mpi *m)
{
    int r = m->api.Barrier(m->api.comm_world);
    return r == MPI_SUCCESS ? EM_OK : mpi_fail(m, r, "MPI_Barrier");
}
