/* nccl.c — the NCCL engine: collectives between CUDA devices, through libnccl loaded with dlopen
 * (so ember builds without NCCL and says clearly when it is missing).
 *
 * NCCL works on device addresses and a CUDA stream. ember's CUDA driver keeps its stream to
 * itself, so the engine makes its own: it retains the device's primary context through libcuda
 * (the one ember's driver uses, so addresses are shared), creates a non-blocking stream in it,
 * and dist.c synchronizes ember's device before each collective and this stream after it. The
 * collectives are therefore ordered with ember's kernels without touching the driver; the cost is
 * that communication does not overlap computation (see docs/distributed.md).
 *
 * Types, values and signatures are copied from nccl.h (NCCL 2.x, a stable C ABI): ncclResult_t,
 * ncclDataType_t and ncclRedOp_t are ints; ncclUniqueId is a 128-byte struct passed by value;
 * ncclAvg needs NCCL 2.10 or later. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "dist/internal.h"
#include "runtime/drivers/cuda_api.h"

typedef int nccl_result;            /* ncclResult_t: ncclSuccess = 0 */
typedef struct ncclComm *nccl_comm; /* ncclComm_t */
typedef struct nccl_uid {
    char internal[DS_NCCL_ID_BYTES];
} nccl_uid; /* ncclUniqueId */

/* ncclDataType_t and ncclRedOp_t values. */
enum {
    NC_INT8 = 0,
    NC_UINT8 = 1,
    NC_INT32 = 2,
    NC_UINT32 = 3,
    NC_INT64 = 4,
    NC_UINT64 = 5,
    NC_FLOAT16 = 6,
    NC_FLOAT32 = 7,
    NC_FLOAT64 = 8,
    NC_BFLOAT16 = 9
};
enum { NC_SUM = 0, NC_PROD = 1, NC_MAX = 2, NC_MIN = 3, NC_AVG = 4 };

typedef struct nccl_api {
    nccl_result (*GetVersion)(int *);
    nccl_result (*GetUniqueId)(nccl_uid *);
    nccl_result (*CommInitRank)(nccl_comm *, int, nccl_uid, int);
    nccl_result (*CommDestroy)(nccl_comm);
    const char *(*GetErrorString)(nccl_result);
    nccl_result (*AllReduce)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
    nccl_result (*Broadcast)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
    nccl_result (*AllGather)(const void *, void *, size_t, int, nccl_comm, CUstream);
    nccl_result (*ReduceScatter)(const void *, void *, size_t, int, int, nccl_comm, CUstream);
} nccl_api;

/* The libcuda calls the engine needs (signatures of cuda.h, as in runtime/drivers/cuda_api.h). */
typedef struct cu_api {
    CUresult (*Init)(unsigned int);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamDestroy)(CUstream);
} cu_api;

static struct {
    pthread_once_t once;
    em_status status;  /* of the load */
    char why[768];     /* its message when it failed */
    void *nccl, *cuda; /* dlopen handles */
    nccl_api nc;
    cu_api cu;
    int version; /* ncclGetVersion's code */
    char version_str[32];
} lib = {.once = PTHREAD_ONCE_INIT};

struct ds_nccl {
    nccl_comm comm;  /* the communicator */
    CUdevice dev;    /* the device */
    CUcontext ctx;   /* its primary context (retained) */
    CUstream stream; /* the engine's stream */
    int ordinal;     /* the device ordinal */
};

static void *open_first(const char *const *names, size_t n, char *tried, size_t size)
{
    size_t used = strlen(tried);
    for (size_t i = 0; i < n; i++) {
        if (!names[i]) continue;
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        if (used < size)
            used += (size_t)snprintf(tried + used, size - used, "%s%s", used ? ", " : "", names[i]);
    }
    return NULL;
}

static bool sym(void *h, void **out, const char *name, char *missing, size_t size)
{
    *out = dlsym(h, name);
    if (!*out && !missing[0]) snprintf(missing, size, "%s", name);
    return *out != NULL;
}

static void load_once(void)
{
    const char *env = getenv("EMBER_NCCL_LIB");
    const char *nccl_names[] = {env && *env ? env : NULL, "libnccl.so.2", "libnccl.so"};
    const char *cenv = getenv("EMBER_LIBCUDA");
    const char *cuda_names[] = {
        cenv && *cenv ? cenv : NULL, "libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1"};
    char tried[512] = "";
    lib.cuda =
        open_first(cuda_names, sizeof cuda_names / sizeof cuda_names[0], tried, sizeof tried);
    if (!lib.cuda) {
        lib.status = EM_ERR_UNSUPPORTED;
        snprintf(lib.why, sizeof lib.why,
                 "NCCL needs the CUDA driver: libcuda not found (tried %s)", tried);
        return;
    }
    tried[0] = 0;
    lib.nccl =
        open_first(nccl_names, sizeof nccl_names / sizeof nccl_names[0], tried, sizeof tried);
    if (!lib.nccl) {
        lib.status = EM_ERR_UNSUPPORTED;
        snprintf(lib.why, sizeof lib.why,
                 "NCCL is not available: libnccl not found (tried %s); install NCCL (libnccl2) or "
                 "set EMBER_NCCL_LIB to its path",
                 tried);
        return;
    }
    char missing[64] = "";
    void *h = lib.nccl;
    sym(h, (void **)&lib.nc.GetVersion, "ncclGetVersion", missing, sizeof missing);
    sym(h, (void **)&lib.nc.GetUniqueId, "ncclGetUniqueId", missing, sizeof missing);
    sym(h, (void **)&lib.nc.CommInitRank, "ncclCommInitRank", missing, sizeof missing);
    sym(h, (void **)&lib.nc.CommDestroy, "ncclCommDestroy", missing, sizeof missing);
    sym(h, (void **)&lib.nc.GetErrorString, "ncclGetErrorString", missing, sizeof missing);
    sym(h, (void **)&lib.nc.AllReduce, "ncclAllReduce", missing, sizeof missing);
    sym(h, (void **)&lib.nc.Broadcast, "ncclBroadcast", missing, sizeof missing);
    sym(h, (void **)&lib.nc.AllGather, "ncclAllGather", missing, sizeof missing);
    sym(h, (void **)&lib.nc.ReduceScatter, "ncclReduceScatter", missing, sizeof missing);
    h = lib.cuda;
    sym(h, (void **)&lib.cu.Init, "cuInit", missing, sizeof missing);
    sym(h, (void **)&lib.cu.GetErrorName, "cuGetErrorName", missing, sizeof missing);
    sym(h, (void **)&lib.cu.DeviceGet, "cuDeviceGet", missing, sizeof missing);
    sym(h, (void **)&lib.cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", missing,
        sizeof missing);
    sym(h, (void **)&lib.cu.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", missing,
        sizeof missing);
    sym(h, (void **)&lib.cu.CtxSetCurrent, "cuCtxSetCurrent", missing, sizeof missing);
    sym(h, (void **)&lib.cu.StreamCreate, "cuStreamCreate", missing, sizeof missing);
    sym(h, (void **)&lib.cu.StreamSynchronize, "cuStreamSynchronize", missing, sizeof missing);
    sym(h, (void **)&lib.cu.StreamDestroy, "cuStreamDestroy_v2", missing, sizeof missing);
    if (missing[0]) {
        lib.status = EM_ERR_UNSUPPORTED;
        snprintf(lib.why, sizeof lib.why, "NCCL: %s is missing from libnccl / libcuda", missing);
        return;
    }
    int v = 0;
    if (lib.nc.GetVersion(&v) != 0) v = 0;
    lib.version = v;
    /* NCCL_VERSION_CODE: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z since 2.9. */
    int major = v >= 10000 ? v / 10000 : v / 1000;
    int minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
    snprintf(lib.version_str, sizeof lib.version_str, "NCCL %d.%d.%d", major, minor, v % 100);
    CUresult r = lib.cu.Init(0);
    if (r != CUDA_SUCCESS) {
        lib.status = EM_ERR_UNSUPPORTED;
        snprintf(lib.why, sizeof lib.why, "NCCL: cuInit failed (CUDA error %d)", r);
        return;
    }
    lib.status = EM_OK;
}

em_status ds_nccl_load(void)
{
    pthread_once(&lib.once, load_once);
    return lib.status == EM_OK ? EM_OK : em_set_error(lib.status, "%s", lib.why);
}

const char *ds_nccl_version(void)
{
    return lib.status == EM_OK ? lib.version_str : "";
}

static em_status nccl_fail(nccl_result r, const char *call)
{
    const char *s = lib.nc.GetErrorString ? lib.nc.GetErrorString(r) : NULL;
    return em_set_error(EM_ERR_DEVICE, "%s failed: %s (NCCL error %d)", call, s ? s : "?", r);
}

static em_status cu_fail(CUresult r, const char *call)
{
    const char *name = NULL;
    if (lib.cu.GetErrorName) lib.cu.GetErrorName(r, &name);
    return em_set_error(EM_ERR_DEVICE, "NCCL engine: %s failed: %s", call,
                        name ? name : "CUDA error");
}

em_status ds_nccl_unique_id(unsigned char id[DS_NCCL_ID_BYTES])
{
    em_status st = ds_nccl_load();
    if (st != EM_OK) return st;
    nccl_uid u;
    nccl_result r = lib.nc.GetUniqueId(&u);
    if (r != 0) return nccl_fail(r, "ncclGetUniqueId");
    memcpy(id, u.internal, DS_NCCL_ID_BYTES);
    return EM_OK;
}

static em_status bind(ds_nccl *c)
{
    CUresult r = lib.cu.CtxSetCurrent(c->ctx);
    return r == CUDA_SUCCESS ? EM_OK : cu_fail(r, "cuCtxSetCurrent");
}

ds_nccl *ds_nccl_open(int ordinal, int rank, int world, const unsigned char id[DS_NCCL_ID_BYTES])
{
    if (ds_nccl_load() != EM_OK) return NULL;
    ds_nccl *c = calloc(1, sizeof *c);
    if (!c) {
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->ordinal = ordinal;
    em_status st = EM_OK;
    CUresult r = lib.cu.DeviceGet(&c->dev, ordinal);
    if (r != CUDA_SUCCESS) st = cu_fail(r, "cuDeviceGet");
    if (st == EM_OK && (r = lib.cu.DevicePrimaryCtxRetain(&c->ctx, c->dev)) != CUDA_SUCCESS) {
        c->ctx = NULL;
        st = cu_fail(r, "cuDevicePrimaryCtxRetain");
    }
    if (st == EM_OK) st = bind(c);
    if (st == EM_OK &&
        (r = lib.cu.StreamCreate(&c->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
        st = cu_fail(r, "cuStreamCreate");
    if (st == EM_OK) {
        nccl_uid u;
        memcpy(u.internal, id, DS_NCCL_ID_BYTES);
        nccl_result nr = lib.nc.CommInitRank(&c->comm, world, u, rank);
        if (nr != 0) {
            c->comm = NULL;
            st = nccl_fail(nr, "ncclCommInitRank");
        }
    }
    if (st != EM_OK) {
        em_error_context("NCCL on cuda:%d (rank %d of %d)", ordinal, rank, world);
        ds_nccl_close(c);
        return NULL;
    }
    return c;
}

void ds_nccl_close(ds_nccl *c)
{
    if (!c) return;
    if (c->ctx) lib.cu.CtxSetCurrent(c->ctx);
    if (c->comm) lib.nc.CommDestroy(c->comm);
    if (c->stream) {
        lib.cu.StreamSynchronize(c->stream);
        lib.cu.StreamDestroy(c->stream);
    }
    if (c->ctx) lib.cu.DevicePrimaryCtxRelease(c->dev);
    free(c);
}

static int nccl_dtype(em_scalar dt)
{
    switch (dt) {
    case EM_I8:
        return NC_INT8;
    case EM_BOOL:
    case EM_U8:
        return NC_UINT8;
    case EM_I32:
        return NC_INT32;
    case EM_U32:
        return NC_UINT32;
    case EM_I64:
        return NC_INT64;
    case EM_U64:
        return NC_UINT64;
    case EM_F16:
        return NC_FLOAT16;
    case EM_F32:
        return NC_FLOAT32;
    case EM_F64:
        return NC_FLOAT64;
    case EM_BF16:
        return NC_BFLOAT16;
    default:
        return -1;
    }
}

static em_status types(em_scalar dt, em_dist_op op, int *ndt, int *nop)
{
    *ndt = nccl_dtype(dt);
    if (*ndt < 0)
        return em_set_error(EM_ERR_UNSUPPORTED, "NCCL has no dtype %s",
                            em_scalar_name(dt) ? em_scalar_name(dt) : "?");
    if (op == EM_DIST_MEAN && lib.version < 21000)
        return em_set_error(EM_ERR_UNSUPPORTED, "NCCL mean (ncclAvg) needs NCCL 2.10; this is %s",
                            lib.version_str);
    *nop = op == EM_DIST_SUM    ? NC_SUM
           : op == EM_DIST_MEAN ? NC_AVG
           : op == EM_DIST_MAX  ? NC_MAX
                                : NC_MIN;
    return EM_OK;
}

em_status ds_nccl_all_reduce(ds_nccl *c, const void *send, void *recv, size_t n, em_scalar dtype,
                             em_dist_op op)
{
    int ndt = 0, nop = 0;
    em_status st = types(dtype, op, &ndt, &nop);
    if (st == EM_OK) st = bind(c);
    if (st != EM_OK) return st;
    nccl_result r = lib.nc.AllReduce(send, recv, n, ndt, nop, c->comm, c->stream);
    return r == 0 ? EM_OK : nccl_fail(r, "ncclAllReduce");
}

em_status ds_nccl_broadcast(ds_nccl *c, const void *send, void *recv, size_t n, em_scalar dtype,
                            int root)
{
    int ndt = 0, nop = 0;
    em_status st = types(dtype, EM_DIST_SUM, &ndt, &nop);
    if (st == EM_OK) st = bind(c);
    if (st != EM_OK) return st;
    nccl_result r = lib.nc.Broadcast(send, recv, n, ndt, root, c->comm, c->stream);
    return r == 0 ? EM_OK : nccl_fail(r, "ncclBroadcast");
}

em_status ds_nccl_all_gather(ds_nccl *c, const void *send, void *recv, size_t n, em_scalar dtype)
{
    int ndt = 0, nop = 0;
    em_status st = types(dtype, EM_DIST_SUM, &ndt, &nop);
    if (st == EM_OK) st = bind(c);
    if (st != EM_OK) return st;
    nccl_result r = lib.nc.AllGather(send, recv, n, ndt, c->comm, c->stream);
    return r == 0 ? EM_OK : nccl_fail(r, "ncclAllGather");
}

em_status ds_nccl_reduce_scatter(ds_nccl *c, const void *send, void *recv, size_t n,
                                 em_scalar dtype, em_dist_op op)
{
    int ndt = 0, nop = 0;
    em_status st = types(dtype, op, &ndt, &nop);
    if (st == EM_OK) st = bind(c);
    if (st != EM_OK) return st;
    nccl_result r = lib.nc.ReduceScatter(send, recv, n, ndt, nop, c->comm, c->stream);
    return r == 0 ? EM_OK : nccl_fail(r, "ncclReduceScatter");
}

em_status ds_nccl_sync(ds_nccl *c)
{
    em_status st = bind(c);
    if (st != EM_OK) return st;
    CUresult r = lib.cu.StreamSynchronize(c->stream);
    return r == CUDA_SUCCESS ? EM_OK : cu_fail(r, "cuStreamSynchronize (NCCL's stream)");
}
