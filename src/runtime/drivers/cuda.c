/* cuda.c — the CUDA driver: NVIDIA GPUs through the CUDA driver API (libcuda.so.1, opened with
 * dlopen; the declarations are in cuda_api.h), kernels compiled by NVRTC (nvrtc.c).
 *
 * Device: device i's primary context (shared with any other CUDA user in the process) and one
 * non-blocking stream on which every copy and launch is queued in order; sync waits for it. Every
 * entry point makes the context current on the calling thread first, so any thread may call.
 *
 * Memory: cuMemAlloc / cuMemFree (out-of-memory is EM_ERR_NOMEM, so the pool empties its cache
 * and retries). Host-to-device writes go through a ring of pinned staging slots: the caller's
 * bytes are copied into a free slot and an asynchronous copy is queued, so a write returns before
 * the transfer ends and the caller may reuse its memory at once. Reads use the same slots,
 * several copies in flight, and return when the bytes are in the caller's memory. When pinned
 * memory cannot be had, copies fall back to pageable asynchronous copies on the same stream.
 *
 * Compilation: the CUDA code generator writes the source (em_codegen_cuda); build runs
 * NVRTC for the device's architecture and writes the cubin (sm_90a on compute capability 9.0, so
 * that wgmma and the other sm_90a features are available, and published as caps.arch "sm_90a";
 * sm_XY elsewhere). A device newer than
 * NVRTC knows gets PTX for the newest architecture NVRTC has, which the driver JIT-compiles at
 * load. load checks the image (an ELF cubin for an NVIDIA GPU whose headers and sections lie
 * inside the file, or PTX text) before cuModuleLoadData, and maps image errors to EM_ERR_CORRUPT.
 *
 * Launch ABI (stated at the top of kernel/codegen/cuda.c): every kernel is an extern "C"
 * __global__ function taking the IR's parameters in order — buffers as device pointers to element
 * 0, scalars by value (f16 and bf16 as float, bool as unsigned char) — and last a pointer to the
 * launch's tensor metadata (u64 words: per buffer len, shape, stride). The metadata is written to
 * a pinned ring and copied to a device ring on the stream before each launch (see meta_ring).
 * Kernels whose shared memory lives in dynamic shared memory get `unsigned int emk_smem_NAME`
 * appended to their source by generate; function() reads it, and above 48 KiB allows the kernel
 * that much with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES).
 *
 * Errors: every CUresult is checked; a message names the device, the call and the CUDA error
 * (cuGetErrorName and cuGetErrorString). A kernel fault surfaces at the next synchronizing call,
 * whose message names the last kernel launched. Nothing here aborts. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/cuda.h"
#include "runtime/drivers/cuda_api.h"
#include "runtime/drivers/nvrtc.h"
#include "runtime/rt.h"

/* Bumped whenever the way arguments reach kernels changes (it is part of every cache key). */
#define CUDA_LAUNCH_ABI_VERSION 1

#define STAGING_SLOTS 4                   /* pinned staging buffers */
#define STAGING_SLOT_BYTES ((size_t)8 << 20) /* bytes each */
#define DEFAULT_STATIC_SHARED (48u << 10) /* shared memory a kernel gets without opting in */
#define PARAM_BYTES 4096                  /* kernel parameter space (CUDA's classic limit) */

/* ---- the library ----------------------------------------------------------------------------- */

/* Loaded once (pthread_once); read-only afterwards. */
static struct {
    bool loaded;      /* libcuda.so.1 opened and every symbol found */
    bool init_ok;     /* cuInit(0) succeeded */
    char why[768];    /* why not (when !loaded or !init_ok) */
    char path[256];   /* the library file */
    int version;      /* cuDriverGetVersion (e.g. 13000) */
    char versions[256]; /* for em_rt_cuda_versions */
    cuda_api cu;      /* entry points */
} lib;

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a result. */
static void describe_result(CUresult r, char *out, size_t size)
{
    const char *name = NULL, *text = NULL;
    if (lib.cu.GetErrorName && lib.cu.GetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (lib.cu.GetErrorString && lib.cu.GetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name && text)
        snprintf(out, size, "%s (%s)", name, text);
    else if (name)
        snprintf(out, size, "%s", name);
    else
        snprintf(out, size, "CUDA error %d", r);
}

static void *open_libcuda(char *tried, size_t tried_size)
{
    const char *override = getenv("EMBER_LIBCUDA");
    const char *candidates[] = {
        override && *override ? override : NULL, "libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1", "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    };
    size_t used = 0;
    tried[0] = '\0';
    for (size_t i = 0; i < EM_ARRAY_LEN(candidates); i++) {
        if (!candidates[i])
            continue;
        void *h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(lib.path, sizeof(lib.path), "%s", candidates[i]);
            return h;
        }
        if (used < tried_size)
            used += (size_t)snprintf(tried + used, tried_size - used, "%s%s", used ? ", " : "",
                                     candidates[i]);
        if (override && *override)
            break; /* an explicit choice is never second-guessed */
    }
    return NULL;
}

/* Reads the kernel module's version from /proc ("580.159.03": the first word of the first line
 * that looks like a version); "" when unknown. */
static void kernel_module_version(char *out, size_t size)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f)
        return;
    char line[512];
    if (fgets(line, sizeof(line), f)) {
        char *save = NULL;
        for (char *w = strtok_r(line, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
            unsigned major = 0, minor = 0;
            char dot = 0;
            if (sscanf(w, "%u%c%u", &major, &dot, &minor) == 3 && dot == '.') {
                snprintf(out, size, "%.32s", w);
                break;
            }
        }
    }
    fclose(f);
}

static void load_once(void)
{
    char tried[512];
    void *h = open_libcuda(tried, sizeof(tried));
    if (!h) {
        snprintf(lib.why, sizeof(lib.why), "libcuda.so.1 not found (no NVIDIA driver)");
        EM_LOGD("cuda: libcuda.so.1 not found; tried %s", tried);
        return;
    }
    struct {
        void **slot;
        const char *names[2]; /* preferred name, then a fallback (or NULL) */
    } syms[] = {
        {(void **)&lib.cu.GetErrorName, {"cuGetErrorName", NULL}},
        {(void **)&lib.cu.GetErrorString, {"cuGetErrorString", NULL}},
        {(void **)&lib.cu.Init, {"cuInit", NULL}},
        {(void **)&lib.cu.DriverGetVersion, {"cuDriverGetVersion", NULL}},
        {(void **)&lib.cu.DeviceGetCount, {"cuDeviceGetCount", NULL}},
        {(void **)&lib.cu.DeviceGet, {"cuDeviceGet", NULL}},
        {(void **)&lib.cu.DeviceGetName, {"cuDeviceGetName", NULL}},
        {(void **)&lib.cu.DeviceGetAttribute, {"cuDeviceGetAttribute", NULL}},
        {(void **)&lib.cu.DeviceTotalMem, {"cuDeviceTotalMem_v2", NULL}},
        {(void **)&lib.cu.DevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain", NULL}},
        {(void **)&lib.cu.DevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2", NULL}},
        {(void **)&lib.cu.CtxSetCurrent, {"cuCtxSetCurrent", NULL}},
        {(void **)&lib.cu.StreamCreate, {"cuStreamCreate", NULL}},
        {(void **)&lib.cu.StreamDestroy, {"cuStreamDestroy_v2", NULL}},
        {(void **)&lib.cu.StreamSynchronize, {"cuStreamSynchronize", NULL}},
        {(void **)&lib.cu.MemAlloc, {"cuMemAlloc_v2", NULL}},
        {(void **)&lib.cu.MemFree, {"cuMemFree_v2", NULL}},
        {(void **)&lib.cu.MemAllocHost, {"cuMemAllocHost_v2", NULL}},
        {(void **)&lib.cu.MemFreeHost, {"cuMemFreeHost", NULL}},
        {(void **)&lib.cu.MemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2", NULL}},
        {(void **)&lib.cu.MemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2", NULL}},
        {(void **)&lib.cu.MemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2", NULL}},
        {(void **)&lib.cu.ModuleLoadData, {"cuModuleLoadData", NULL}},
        {(void **)&lib.cu.ModuleUnload, {"cuModuleUnload", NULL}},
        {(void **)&lib.cu.ModuleGetFunction, {"cuModuleGetFunction", NULL}},
        {(void **)&lib.cu.ModuleGetGlobal, {"cuModuleGetGlobal_v2", NULL}},
        {(void **)&lib.cu.FuncGetAttribute, {"cuFuncGetAttribute", NULL}},
        {(void **)&lib.cu.FuncSetAttribute, {"cuFuncSetAttribute", NULL}},
        {(void **)&lib.cu.LaunchKernel, {"cuLaunchKernel", NULL}},
        {(void **)&lib.cu.EventCreate, {"cuEventCreate", NULL}},
        {(void **)&lib.cu.EventRecord, {"cuEventRecord", NULL}},
        {(void **)&lib.cu.EventSynchronize, {"cuEventSynchronize", NULL}},
        {(void **)&lib.cu.EventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
        {(void **)&lib.cu.EventDestroy, {"cuEventDestroy_v2", NULL}},
    };
    for (size_t i = 0; i < EM_ARRAY_LEN(syms); i++) {
        void *p = dlsym(h, syms[i].names[0]);
        if (!p && syms[i].names[1])
            p = dlsym(h, syms[i].names[1]);
        if (!p) {
            snprintf(lib.why, sizeof(lib.why), "%s has no %s (NVIDIA driver too old)", lib.path,
                     syms[i].names[0]);
            memset(&lib.cu, 0, sizeof(lib.cu));
            dlclose(h);
            return;
        }
        *syms[i].slot = p;
    }
    struct {
        void **slot;
        const char *name;
    } optional[] = {
        {(void **)&lib.cu.StreamBeginCapture, "cuStreamBeginCapture_v2"},
        {(void **)&lib.cu.StreamEndCapture, "cuStreamEndCapture"},
        {(void **)&lib.cu.GraphInstantiate, "cuGraphInstantiateWithFlags"},
        {(void **)&lib.cu.GraphLaunch, "cuGraphLaunch"},
        {(void **)&lib.cu.GraphExecDestroy, "cuGraphExecDestroy"},
        {(void **)&lib.cu.GraphDestroy, "cuGraphDestroy"},
    };
    lib.cu.TensorMapEncodeTiled = dlsym(h, "cuTensorMapEncodeTiled");
    bool graphs = true;
    for (size_t i = 0; i < EM_ARRAY_LEN(optional); i++)
        graphs = graphs && (*optional[i].slot = dlsym(h, optional[i].name)) != NULL;
    if (!graphs) /* all or none */
        for (size_t i = 0; i < EM_ARRAY_LEN(optional); i++)
            *optional[i].slot = NULL;
    lib.cu.LaunchKernelEx = (CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **))
        dlsym(h, "cuLaunchKernelEx");
    lib.loaded = true; /* the library stays loaded for the life of the process */
    CUresult r = lib.cu.Init(0);
    if (r != CUDA_SUCCESS) {
        char what[160];
        describe_result(r, what, sizeof(what));
        if (r == CUDA_ERROR_NO_DEVICE)
            snprintf(lib.why, sizeof(lib.why), "no CUDA devices (cuInit: %s)", what);
        else if (r == CUDA_ERROR_STUB_LIBRARY)
            snprintf(lib.why, sizeof(lib.why), "%s is the CUDA toolkit's stub library, not a "
                     "driver (no NVIDIA driver)", lib.path);
        else
            snprintf(lib.why, sizeof(lib.why), "cuInit failed: %s", what);
        return;
    }
    lib.init_ok = true;
    if (lib.cu.DriverGetVersion(&lib.version) != CUDA_SUCCESS)
        lib.version = 0;
    char kmod[64];
    kernel_module_version(kmod, sizeof(kmod));
    int nv_major = 0, nv_minor = 0;
    bool have_nvrtc = em_nvrtc_available(NULL, 0) &&
                      em_nvrtc_version(&nv_major, &nv_minor) == EM_OK;
    size_t used = (size_t)snprintf(lib.versions, sizeof(lib.versions), "%s%s%sCUDA %d.%d",
                                   kmod[0] ? "driver " : "", kmod, kmod[0] ? ", " : "",
                                   lib.version / 1000, lib.version % 1000 / 10);
    if (used < sizeof(lib.versions)) {
        if (have_nvrtc)
            snprintf(lib.versions + used, sizeof(lib.versions) - used, "; NVRTC %d.%d", nv_major,
                     nv_minor);
        else
            snprintf(lib.versions + used, sizeof(lib.versions) - used, "; no NVRTC");
    }
}

/* Loads libcuda and runs cuInit once; EM_OK, or EM_ERR_UNSUPPORTED with the reason. */
static em_status lib_ready(void)
{
    pthread_once(&lib_once, load_once);
    if (!lib.loaded || !lib.init_ok)
        return em_set_error(EM_ERR_UNSUPPORTED, "cuda: %s", lib.why);
    return EM_OK;
}

const char *em_rt_cuda_versions(void)
{
    pthread_once(&lib_once, load_once);
    return lib.init_ok ? lib.versions : "";
}

/* ---- device state ---------------------------------------------------------------------------- */

typedef struct staging_slot {
    void *host;     /* pinned buffer of STAGING_SLOT_BYTES (NULL until first use) */
    CUevent done;   /* recorded after the last copy that used host */
    bool busy;      /* a copy using host may still be in flight */
} staging_slot;

typedef struct cuda_fn cuda_fn;

typedef struct cuda_module {
    CUmodule mod;   /* the loaded module */
    cuda_fn *fns;   /* functions handed out from it (freed at unload) */
} cuda_module;

struct cuda_fn {
    CUfunction f;          /* the kernel */
    cuda_fn *next;         /* next function of the same module */
    unsigned dyn_smem;     /* dynamic shared memory bytes each launch gets */
    unsigned max_units;    /* most threads per block for this kernel (registers limit it) */
    int regs;              /* registers per thread (for messages) */
    bool pdl;              /* launched with programmatic stream serialization (pdl_ok) */
    char name[128];        /* kernel name (for messages) */
};

/* Tensor metadata uploaded per launch: a device ring with a pinned host mirror, cut into
 * segments. Moving on from a segment records an event after everything queued so far; coming back
 * to it waits for that event, so no launch's metadata is overwritten before the launch ran. */
#define META_RING_BYTES ((size_t)1 << 20)
#define META_SEGMENTS 8
#define META_SEGMENT_BYTES (META_RING_BYTES / META_SEGMENTS)
#define META_ALIGN 256

typedef struct meta_ring {
    CUdeviceptr dev;                 /* the device ring (0 until the first launch) */
    unsigned char *host;             /* its pinned mirror (NULL: upload from pageable memory) */
    CUevent left[META_SEGMENTS];     /* recorded when the ring moved on from each segment */
    bool busy[META_SEGMENTS];        /* left[i] was recorded and not yet waited for */
    size_t seg;                      /* the segment in use */
    size_t at;                       /* the next free byte (inside seg, or at its end) */
} meta_ring;

/* A native graph under construction or built (see "graphs" below): the captured launches'
 * metadata lives in chunks of device memory filled once when the capture ends (their host
 * shadows written meanwhile), and the captured writes copy from pinned blocks the graph owns. */
typedef struct cap_chunk {
    CUdeviceptr dev;          /* device memory the kernels read */
    unsigned char *host;      /* its contents, uploaded at the end of the capture */
    size_t size, used;
    struct cap_chunk *next;
} cap_chunk;

typedef struct cuda_graph {
    CUgraphExec exec;         /* the instantiated graph (NULL while capturing) */
    cap_chunk *meta;          /* metadata chunks, newest first */
    void **pinned;            /* sources of captured writes */
    size_t npinned, pinned_cap;
} cuda_graph;

typedef struct cuda_device {
    int index;                  /* device ordinal */
    CUdevice dev;               /* the device */
    CUcontext ctx;              /* its primary context (retained) */
    CUstream stream;            /* the one stream everything is queued on */
    int cc_major, cc_minor;     /* compute capability */
    char compile_arch[24];      /* NVRTC target: "sm_90a", "sm_86", or "compute_120" (PTX) */
    unsigned max_grid[3];       /* most blocks per grid axis */
    unsigned shared_optin;      /* most shared memory a block may opt into */
    pthread_mutex_t lock;       /* guards staging, meta and last_kernel; held across launches */
    staging_slot slots[STAGING_SLOTS]; /* the staging ring */
    unsigned next_slot;         /* where the ring continues */
    bool pinned_failed;         /* cuMemAllocHost failed once: use pageable copies */
    meta_ring meta;             /* tensor metadata of launches */
    char last_kernel[128];      /* the last kernel launched (named when a fault surfaces) */
    cuda_graph *capture;        /* the graph being captured (graph_begin .. graph_end), or NULL */
} cuda_device;

/* Sets an error for a failed call: "cuda:0: WHAT failed: CUDA_ERROR_X (text)". Returns status. */
static em_status cu_fail(const cuda_device *d, CUresult r, em_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static em_status cu_fail(const cuda_device *d, CUresult r, em_status status, const char *fmt, ...)
{
    char what[512], err[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    describe_result(r, err, sizeof(err));
    if (d)
        return em_set_error(status, "cuda:%d: %s failed: %s", d->index, what, err);
    return em_set_error(status, "cuda: %s failed: %s", what, err);
}

/* Makes the device's context current on this thread. */
static em_status bind(const cuda_device *d)
{
    CUresult r = lib.cu.CtxSetCurrent(d->ctx);
    return r == CUDA_SUCCESS ? EM_OK : cu_fail(d, r, EM_ERR_DEVICE, "cuCtxSetCurrent");
}

/* The error for a call that may report an earlier kernel's fault (copies, syncs). Called with
 * d->lock held. */
static em_status async_fail_locked(const cuda_device *d, CUresult r, const char *call)
{
    em_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_DEVICE;
    if (!d->last_kernel[0] || r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_INVALID_VALUE)
        return cu_fail(d, r, st, "%s", call);
    return cu_fail(d, r, st, "%s (this may be a fault of an earlier kernel; the last one "
                   "launched was %s)", call, d->last_kernel);
}

/* The same, taking the lock. */
static em_status async_fail(cuda_device *d, CUresult r, const char *call)
{
    pthread_mutex_lock(&d->lock);
    em_status st = async_fail_locked(d, r, call);
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* ---- probe, open, close ---------------------------------------------------------------------- */

static int cuda_probe(char *why, size_t why_size)
{
    pthread_once(&lib_once, load_once);
    if (!lib.loaded || !lib.init_ok) {
        snprintf(why, why_size, "%s", lib.why);
        return 0;
    }
    int count = 0;
    CUresult r = lib.cu.DeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        char what[160];
        describe_result(r, what, sizeof(what));
        snprintf(why, why_size, "cuDeviceGetCount failed: %s", what);
        return 0;
    }
    if (count <= 0) {
        snprintf(why, why_size, "no CUDA devices");
        return 0;
    }
    char nvwhy[256];
    if (!em_nvrtc_available(nvwhy, sizeof(nvwhy))) {
        snprintf(why, why_size, "%d CUDA device%s, but %s", count, count == 1 ? "" : "s", nvwhy);
        return 0;
    }
    return count;
}

static em_status attr(cuda_device *d, int which, const char *name, int *out)
{
    CUresult r = lib.cu.DeviceGetAttribute(out, which, d->dev);
    return r == CUDA_SUCCESS ? EM_OK
                             : cu_fail(d, r, EM_ERR_DEVICE, "cuDeviceGetAttribute(%s)", name);
}

/* Chooses what NVRTC compiles for on this device (see the top of the file). */
static em_status choose_compile_arch(cuda_device *d)
{
    int sm = d->cc_major * 10 + d->cc_minor;
    if (em_nvrtc_supports_arch(sm)) {
        snprintf(d->compile_arch, sizeof(d->compile_arch), "sm_%d%s", sm, sm == 90 ? "a" : "");
        return EM_OK;
    }
    int newest = em_nvrtc_max_arch();
    int major = 0, minor = 0;
    em_nvrtc_version(&major, &minor);
    if (newest && newest < sm) {
        snprintf(d->compile_arch, sizeof(d->compile_arch), "compute_%d", newest);
        EM_LOGW("cuda:%d: NVRTC %d.%d does not know sm_%d; compiling PTX for compute_%d, which "
                "the driver JIT-compiles (a newer CUDA toolkit gives better code)", d->index,
                major, minor, sm, newest);
        return EM_OK;
    }
    return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: compute capability %d.%d (sm_%d) is too old "
                        "for NVRTC %d.%d (%s); use the NVRTC of an older CUDA toolkit (set "
                        "EMBER_NVRTC to its libnvrtc.so)", d->index, d->cc_major, d->cc_minor,
                        sm, major, minor, em_nvrtc_library());
}

static em_status fill_caps(cuda_device *d, em_caps *caps)
{
    struct {
        int which;
        const char *name;
        int value;
    } a[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "COMPUTE_CAPABILITY_MAJOR", 0},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "COMPUTE_CAPABILITY_MINOR", 0},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, "WARP_SIZE", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, "MAX_BLOCK_DIM_X", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, "MAX_BLOCK_DIM_Y", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, "MAX_BLOCK_DIM_Z", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, "MAX_GRID_DIM_X", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, "MAX_GRID_DIM_Y", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, "MAX_GRID_DIM_Z", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, "MAX_SHARED_MEMORY_PER_BLOCK", 0},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
         0},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT", 0},
    };
    for (size_t i = 0; i < EM_ARRAY_LEN(a); i++) {
        em_status st = attr(d, a[i].which, a[i].name, &a[i].value);
        if (st != EM_OK)
            return st;
        if (a[i].value < 0)
            a[i].value = 0;
    }
    d->cc_major = a[0].value;
    d->cc_minor = a[1].value;
    for (int i = 0; i < 3; i++)
        d->max_grid[i] = (unsigned)a[7 + i].value;
    unsigned shared_default = (unsigned)a[10].value;
    d->shared_optin = EM_MAX((unsigned)a[11].value, shared_default);

    char name[96] = "";
    CUresult r = lib.cu.DeviceGetName(name, (int)sizeof(name), d->dev);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, EM_ERR_DEVICE, "cuDeviceGetName");
    size_t total = 0;
    r = lib.cu.DeviceTotalMem(&total, d->dev);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, EM_ERR_DEVICE, "cuDeviceTotalMem");

    memset(caps, 0, sizeof(*caps));
    snprintf(caps->target, sizeof(caps->target), "cuda");
    snprintf(caps->arch, sizeof(caps->arch), "sm_%d%d", d->cc_major, d->cc_minor);
    snprintf(caps->device_name, sizeof(caps->device_name), "%.48s (compute %u.%u; %.56s)", name,
             (unsigned char)d->cc_major, (unsigned char)d->cc_minor, lib.versions);
    caps->plane_dim = (uint32_t)a[2].value;
    caps->max_cube_units = (uint32_t)a[3].value;
    for (int i = 0; i < 3; i++)
        caps->max_cube_dim[i] = (uint32_t)a[4 + i].value;
    caps->max_shared = d->shared_optin;
    caps->memory_total = total;
    caps->compute_units = (uint32_t)a[12].value;
    for (int s = 0; s < EM_SCALAR_COUNT; s++)
        caps->dtype[s] = true;
    int sm = d->cc_major * 10 + d->cc_minor;
    caps->dtype[EM_F16] = sm >= 70;  /* native half arithmetic */
    caps->dtype[EM_BF16] = sm >= 80; /* native bfloat16 arithmetic */
    caps->float_atomic_add = true;
    caps->plane_ops = true;
    caps->matrix = sm >= 70; /* tensor cores (WMMA / mma.sync) */
    caps->print = true;
    return EM_OK;
}

static void release_device(cuda_device *d)
{
    if (d->ctx) {
        lib.cu.CtxSetCurrent(d->ctx);
        if (d->stream) {
            lib.cu.StreamSynchronize(d->stream);
            lib.cu.StreamDestroy(d->stream);
        }
        for (int i = 0; i < META_SEGMENTS; i++)
            if (d->meta.left[i])
                lib.cu.EventDestroy(d->meta.left[i]);
        if (d->meta.host)
            lib.cu.MemFreeHost(d->meta.host);
        if (d->meta.dev)
            lib.cu.MemFree(d->meta.dev);
        for (int i = 0; i < STAGING_SLOTS; i++) {
            if (d->slots[i].done)
                lib.cu.EventDestroy(d->slots[i].done);
            if (d->slots[i].host)
                lib.cu.MemFreeHost(d->slots[i].host);
        }
        lib.cu.CtxSetCurrent(NULL);
        lib.cu.DevicePrimaryCtxRelease(d->dev);
    }
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static em_status cuda_open(int index, em_caps *caps, void **state)
{
    em_status st = lib_ready();
    if (st != EM_OK)
        return st;
    if ((st = em_nvrtc_load()) != EM_OK)
        return em_error_context("cuda:%d", index);
    cuda_device *d = calloc(1, sizeof(*d));
    if (!d)
        return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of memory", index);
    d->index = index;
    pthread_mutex_init(&d->lock, NULL);
    CUresult r = lib.cu.DeviceGet(&d->dev, index);
    if (r != CUDA_SUCCESS) {
        st = cu_fail(d, r, r == CUDA_ERROR_INVALID_DEVICE ? EM_ERR_NOT_FOUND : EM_ERR_DEVICE,
                     "cuDeviceGet(%d)", index);
        release_device(d);
        return st;
    }
    r = lib.cu.DevicePrimaryCtxRetain(&d->ctx, d->dev);
    if (r != CUDA_SUCCESS) {
        d->ctx = NULL;
        st = cu_fail(d, r, r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                     "cuDevicePrimaryCtxRetain");
        release_device(d);
        return st;
    }
    if ((st = bind(d)) == EM_OK && (r = lib.cu.StreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)))
        st = cu_fail(d, r, EM_ERR_DEVICE, "cuStreamCreate");
    if (st == EM_OK)
        st = fill_caps(d, caps);
    if (st == EM_OK)
        st = choose_compile_arch(d);
    if (st != EM_OK) {
        release_device(d);
        return st;
    }
    /* compiling for sm_90a: the arch-specific features (wgmma) are there; the kernel language's
     * has(wgmma) and the CUDA generator read it from caps.arch */
    if (st == EM_OK && !strcmp(d->compile_arch, "sm_90a"))
        snprintf(caps->arch, sizeof(caps->arch), "sm_90a");
    EM_LOGD("cuda:%d: %s, %s, compiling for %s", index, caps->device_name, caps->arch,
            d->compile_arch);
    *state = d;
    return EM_OK;
}

static void cuda_close(void *state)
{
    release_device(state);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static inline CUdeviceptr dptr(const void *mem, size_t offset)
{
    return (CUdeviceptr)(uintptr_t)mem + offset;
}

static em_status cuda_alloc(void *state, size_t bytes, void **mem)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUdeviceptr p = 0;
    CUresult r = lib.cu.MemAlloc(&p, bytes ? bytes : 1);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return cu_fail(d, r, EM_ERR_NOMEM, "cuMemAlloc(%zu bytes)", bytes);
    if (r != CUDA_SUCCESS)
        return async_fail(d, r, "cuMemAlloc");
    *mem = (void *)(uintptr_t)p;
    return EM_OK;
}

static void cuda_free(void *state, void *mem, size_t bytes)
{
    cuda_device *d = state;
    if (bind(d) != EM_OK)
        return;
    CUresult r = lib.cu.MemFree(dptr(mem, 0));
    if (r != CUDA_SUCCESS) {
        char err[192];
        describe_result(r, err, sizeof(err));
        EM_LOGW("cuda:%d: cuMemFree of %zu bytes failed: %s", d->index, bytes, err);
    }
}

/* A staging slot ready for reuse (its last copy finished), allocating it on first use. NULL when
 * pinned memory is unavailable (*st stays EM_OK: the caller falls back) or on an error (*st set).
 * Called with d->lock held. */
static staging_slot *take_slot(cuda_device *d, em_status *st)
{
    *st = EM_OK;
    if (d->pinned_failed)
        return NULL;
    staging_slot *s = &d->slots[d->next_slot];
    d->next_slot = (d->next_slot + 1) % STAGING_SLOTS;
    if (!s->host) {
        CUresult r = lib.cu.MemAllocHost(&s->host, STAGING_SLOT_BYTES);
        if (r == CUDA_SUCCESS)
            r = lib.cu.EventCreate(&s->done, CU_EVENT_DISABLE_TIMING);
        if (r != CUDA_SUCCESS) {
            char err[192];
            describe_result(r, err, sizeof(err));
            EM_LOGW("cuda:%d: no pinned staging memory (%s); copies use pageable memory", d->index,
                    err);
            if (s->host)
                lib.cu.MemFreeHost(s->host);
            s->host = NULL;
            s->done = NULL;
            d->pinned_failed = true;
            return NULL;
        }
        s->busy = false;
    }
    if (s->busy) {
        CUresult r = lib.cu.EventSynchronize(s->done);
        if (r != CUDA_SUCCESS) {
            *st = cu_fail(d, r, EM_ERR_DEVICE, "waiting for a staging copy (cuEventSynchronize)");
            return NULL;
        }
        s->busy = false;
    }
    return s;
}

static em_status write_capture(cuda_device *d, void *mem, size_t offset, const void *src,
                               size_t bytes);

static em_status cuda_write(void *state, void *mem, size_t offset, const void *src, size_t bytes)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&d->lock);
    if (d->capture) {
        st = write_capture(d, mem, offset, src, bytes);
        pthread_mutex_unlock(&d->lock);
        return st;
    }
    for (size_t done = 0; done < bytes && st == EM_OK && r == CUDA_SUCCESS;) {
        staging_slot *s = take_slot(d, &st);
        if (st != EM_OK)
            break;
        size_t n;
        if (s) {
            n = EM_MIN(bytes - done, STAGING_SLOT_BYTES);
            memcpy(s->host, (const char *)src + done, n);
            r = lib.cu.MemcpyHtoDAsync(dptr(mem, offset + done), s->host, n, d->stream);
            if (r == CUDA_SUCCESS && (r = lib.cu.EventRecord(s->done, d->stream)) == CUDA_SUCCESS)
                s->busy = true;
        } else { /* pageable: the driver copies the source out before returning */
            n = bytes - done;
            r = lib.cu.MemcpyHtoDAsync(dptr(mem, offset + done), (const char *)src + done, n,
                                       d->stream);
        }
        done += n;
    }
    pthread_mutex_unlock(&d->lock);
    if (st == EM_OK && r != CUDA_SUCCESS)
        st = async_fail(d, r, "copying to the device (cuMemcpyHtoDAsync)");
    return st;
}

/* One device-to-host chunk in flight through a staging slot. */
typedef struct read_chunk {
    staging_slot *slot; /* where the bytes land */
    size_t at, n;       /* destination offset and size */
} read_chunk;

static em_status cuda_read(void *state, const void *mem, size_t offset, void *dst, size_t bytes)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    read_chunk q[STAGING_SLOTS];
    size_t head = 0, count = 0, issued = 0;
    CUresult r = CUDA_SUCCESS;
    const char *call = NULL;
    pthread_mutex_lock(&d->lock);
    while (st == EM_OK && r == CUDA_SUCCESS && (issued < bytes || count)) {
        /* queue copies while slots are free */
        while (issued < bytes && count < STAGING_SLOTS && st == EM_OK && r == CUDA_SUCCESS) {
            staging_slot *s = take_slot(d, &st);
            if (st != EM_OK)
                break;
            if (!s) { /* pageable: returns when the bytes have arrived */
                size_t n = bytes - issued;
                if (count == 0) {
                    call = "copying from the device (cuMemcpyDtoHAsync)";
                    r = lib.cu.MemcpyDtoHAsync((char *)dst + issued, dptr(mem, offset + issued),
                                               n, d->stream);
                    if (r == CUDA_SUCCESS) {
                        call = "waiting for a copy from the device (cuStreamSynchronize)";
                        r = lib.cu.StreamSynchronize(d->stream);
                    }
                    issued += n;
                }
                break;
            }
            size_t n = EM_MIN(bytes - issued, STAGING_SLOT_BYTES);
            call = "copying from the device (cuMemcpyDtoHAsync)";
            r = lib.cu.MemcpyDtoHAsync(s->host, dptr(mem, offset + issued), n, d->stream);
            if (r == CUDA_SUCCESS)
                r = lib.cu.EventRecord(s->done, d->stream);
            if (r != CUDA_SUCCESS)
                break;
            s->busy = true;
            q[(head + count) % STAGING_SLOTS] = (read_chunk){s, issued, n};
            count++;
            issued += n;
        }
        if (st != EM_OK || r != CUDA_SUCCESS || !count)
            continue;
        /* drain the oldest */
        read_chunk c = q[head];
        call = "waiting for a copy from the device (cuEventSynchronize)";
        r = lib.cu.EventSynchronize(c.slot->done);
        if (r != CUDA_SUCCESS)
            break;
        c.slot->busy = false;
        memcpy((char *)dst + c.at, c.slot->host, c.n);
        head = (head + 1) % STAGING_SLOTS;
        count--;
    }
    pthread_mutex_unlock(&d->lock);
    if (st == EM_OK && r != CUDA_SUCCESS)
        st = async_fail(d, r, call);
    return st;
}

static em_status cuda_copy(void *state, void *dst, size_t dst_offset, const void *src,
                           size_t src_offset, size_t bytes)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUresult r = lib.cu.MemcpyDtoDAsync(dptr(dst, dst_offset), dptr(src, src_offset), bytes,
                                        d->stream);
    return r == CUDA_SUCCESS ? EM_OK : async_fail(d, r, "device copy (cuMemcpyDtoDAsync)");
}

/* ---- compilation ----------------------------------------------------------------------------- */

/* The code generator's source, followed by `extern "C" __device__ unsigned int emk_smem_NAME = N;`
 * for each kernel that needs N bytes of dynamic shared memory: the number then travels inside the
 * cubin (and the disk cache), and function() reads it back with cuModuleGetGlobal. */
static char *cuda_generate(void *state, const em_ir_kernel *const *ks, size_t n,
                           const em_caps *caps)
{
    (void)state;
    char *src = em_codegen_cuda(ks, n, caps);
    if (!src)
        return NULL;
    em_strbuf sb;
    em_sb_init(&sb);
    for (size_t i = 0; i < n; i++) {
        size_t bytes = em_codegen_cuda_dynamic_smem(ks[i]);
        if (!bytes)
            continue;
        if (!sb.len)
            em_sb_append(&sb, "\n/* dynamic shared memory per kernel, read by the CUDA driver */\n");
        em_sb_printf(&sb, "extern \"C\" __device__ unsigned int emk_smem_%s = %zuu;\n",
                     em_ir_kernel_name(ks[i]), bytes);
    }
    if (!sb.len) {
        em_sb_free(&sb);
        return src;
    }
    em_strbuf all;
    em_sb_init(&all);
    em_sb_append(&all, src);
    em_sb_append(&all, sb.data);
    free(src);
    em_sb_free(&sb);
    char *out = em_sb_take(&all);
    if (!out)
        em_set_error(EM_ERR_NOMEM, "out of memory generating CUDA source");
    return out;
}

static em_status cuda_compiler_id(void *state, char *out, size_t out_size)
{
    cuda_device *d = state;
    int major = 0, minor = 0;
    em_status st = em_nvrtc_version(&major, &minor);
    if (st != EM_OK)
        return st;
    snprintf(out, out_size, "nvrtc %d.%d | --gpu-architecture=%s %s | launch abi %d", major,
             minor, d->compile_arch, em_nvrtc_common_options(), CUDA_LAUNCH_ABI_VERSION);
    return EM_OK;
}

static em_status cuda_build(void *state, const char *source, const char *out_path)
{
    cuda_device *d = state;
    void *binary = NULL;
    size_t size = 0;
    char *log = NULL;
    em_status st = em_nvrtc_compile(source, d->compile_arch, &log, &binary, &size);
    if (st != EM_OK) {
        free(log);
        return em_error_context("cuda:%d", d->index);
    }
    if (log && *log)
        EM_LOGD("cuda:%d: NVRTC says:\n%s", d->index, log);
    free(log);
    FILE *f = fopen(out_path, "wb");
    if (!f) {
        free(binary);
        return em_set_error(EM_ERR_IO, "cuda:%d: cannot write %s: %s", d->index, out_path,
                            strerror(errno));
    }
    bool ok = fwrite(binary, 1, size, f) == size;
    ok = fclose(f) == 0 && ok;
    free(binary);
    if (!ok)
        return em_set_error(EM_ERR_IO, "cuda:%d: cannot write %s", d->index, out_path);
    return EM_OK;
}

/* ---- modules --------------------------------------------------------------------------------- */

static uint16_t rd16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const unsigned char *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static bool span_ok(uint64_t off, uint64_t n, size_t len)
{
    return off <= len && n <= len - off;
}

/* Checks that an image is a well-formed cubin (a 64-bit little-endian ELF for EM_CUDA whose
 * tables and sections lie inside it) or PTX text. Writes the problem into why otherwise. */
static bool image_ok(const unsigned char *p, size_t len, char *why, size_t why_size)
{
    if (len >= 4 && memcmp(p, "\177ELF", 4) == 0) {
        enum { EHDR = 64, EM_CUDA_MACHINE = 190, SHT_NOBITS = 8 };
        if (len < EHDR || p[4] != 2 || p[5] != 1) {
            snprintf(why, why_size, "truncated or not a 64-bit little-endian ELF");
            return false;
        }
        if (rd16(p + 18) != EM_CUDA_MACHINE) {
            snprintf(why, why_size, "an ELF file for machine %u, not an NVIDIA GPU", rd16(p + 18));
            return false;
        }
        uint64_t phoff = rd64(p + 32), shoff = rd64(p + 40);
        uint16_t phentsize = rd16(p + 54), phnum = rd16(p + 56);
        uint16_t shentsize = rd16(p + 58), shnum = rd16(p + 60);
        if ((phnum && (phentsize < 56 || !span_ok(phoff, (uint64_t)phentsize * phnum, len))) ||
            (shnum && (shentsize < 64 || !span_ok(shoff, (uint64_t)shentsize * shnum, len)))) {
            snprintf(why, why_size, "ELF header tables lie outside the %zu-byte file", len);
            return false;
        }
        for (unsigned i = 0; i < shnum; i++) {
            const unsigned char *sh = p + shoff + (uint64_t)i * shentsize;
            if (rd32(sh + 4) != SHT_NOBITS && !span_ok(rd64(sh + 24), rd64(sh + 32), len)) {
                snprintf(why, why_size, "section %u lies outside the %zu-byte file (truncated)",
                         i, len);
                return false;
            }
        }
        for (unsigned i = 0; i < phnum; i++) {
            const unsigned char *ph = p + phoff + (uint64_t)i * phentsize;
            if (!span_ok(rd64(ph + 8), rd64(ph + 32), len)) {
                snprintf(why, why_size, "segment %u lies outside the %zu-byte file (truncated)",
                         i, len);
                return false;
            }
        }
        return true;
    }
    /* PTX: text with a .version and a .target directive, no NUL inside */
    if (memchr(p, '\0', len) == NULL && strstr((const char *)p, ".version") &&
        strstr((const char *)p, ".target"))
        return true;
    snprintf(why, why_size, "neither a cubin (ELF) nor PTX text");
    return false;
}

static em_status cuda_load(void *state, const char *path, void **module)
{
    cuda_device *d = state;
    size_t len = 0;
    char *data = em_file_read(path, &len); /* NUL-terminated, as PTX must be */
    if (!data)
        return em_error_context("cuda:%d: loading a module", d->index);
    char why[160];
    if (!image_ok((const unsigned char *)data, len, why, sizeof(why))) {
        free(data);
        return em_set_error(EM_ERR_CORRUPT, "cuda:%d: %s is not a loadable module: %s", d->index,
                            path, why);
    }
    em_status st = bind(d);
    cuda_module *m = st == EM_OK ? calloc(1, sizeof(*m)) : NULL;
    if (st == EM_OK && !m)
        st = em_set_error(EM_ERR_NOMEM, "cuda:%d: out of memory", d->index);
    if (st != EM_OK) {
        free(data);
        return st;
    }
    CUresult r = lib.cu.ModuleLoadData(&m->mod, data);
    free(data);
    if (r != CUDA_SUCCESS) {
        free(m);
        bool bad_image = r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_INVALID_PTX ||
                         r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_SOURCE ||
                         r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
        return cu_fail(d, r,
                       bad_image ? EM_ERR_CORRUPT
                       : r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM
                                                       : EM_ERR_DEVICE,
                       "cuModuleLoadData(%s)", path);
    }
    *module = m;
    return EM_OK;
}

static void cuda_unload(void *state, void *module)
{
    cuda_device *d = state;
    cuda_module *m = module;
    if (bind(d) == EM_OK) {
        CUresult r = lib.cu.ModuleUnload(m->mod);
        if (r != CUDA_SUCCESS) {
            char err[192];
            describe_result(r, err, sizeof(err));
            EM_LOGW("cuda:%d: cuModuleUnload failed: %s", d->index, err);
        }
    }
    while (m->fns) {
        cuda_fn *next = m->fns->next;
        free(m->fns);
        m->fns = next;
    }
    free(m);
}

/* Reads the optional `unsigned int emk_smem_NAME` of a module (see cuda_generate): dynamic shared
 * memory bytes. */
static em_status read_dyn_smem(cuda_device *d, cuda_module *m, const char *kernel, unsigned *out)
{
    *out = 0;
    size_t n = strlen("emk_smem_") + strlen(kernel) + 1;
    char *sym = malloc(n);
    if (!sym)
        return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of memory", d->index);
    snprintf(sym, n, "emk_smem_%s", kernel);
    CUdeviceptr p = 0;
    size_t size = 0;
    CUresult r = lib.cu.ModuleGetGlobal(&p, &size, m->mod, sym);
    em_status st = EM_OK;
    if (r == CUDA_ERROR_NOT_FOUND)
        st = EM_OK;
    else if (r != CUDA_SUCCESS)
        st = cu_fail(d, r, EM_ERR_DEVICE, "cuModuleGetGlobal(%s)", sym);
    else if (size != sizeof(unsigned))
        st = em_set_error(EM_ERR_CORRUPT, "cuda:%d: %s has %zu bytes, expected %zu", d->index,
                          sym, size, sizeof(unsigned));
    else
        st = cuda_read(d, (const void *)(uintptr_t)p, 0, out, sizeof(*out));
    free(sym);
    return st;
}

/* Whether the kernels of module m may be launched with programmatic stream serialization: the
 * code generator marks modules whose kernels all begin with griddepcontrol.wait (sm_90 on) with
 * the global `ember_pdl` (src/kernel/codegen/cuda.c); the driver needs cuLaunchKernelEx and
 * EMBER_CUDA_PDL=0 turns it off (for comparisons). A kernel without the wait launched so could
 * read its inputs before the kernel writing them finished, so anything else is launched plainly. */
static bool pdl_ok(const cuda_device *d, const cuda_module *m)
{
    const char *env = getenv("EMBER_CUDA_PDL");
    if (d->cc_major < 9 || !lib.cu.LaunchKernelEx || (env && !strcmp(env, "0")))
        return false;
    CUdeviceptr p = 0;
    size_t size = 0;
    return lib.cu.ModuleGetGlobal(&p, &size, m->mod, "ember_pdl") == CUDA_SUCCESS;
}

static em_status cuda_function(void *state, void *module, const char *kernel_name, void **fn)
{
    cuda_device *d = state;
    cuda_module *m = module;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUfunction f = NULL;
    CUresult r = lib.cu.ModuleGetFunction(&f, m->mod, kernel_name);
    if (r == CUDA_ERROR_NOT_FOUND)
        return em_set_error(EM_ERR_NOT_FOUND, "cuda:%d: the module has no kernel %s", d->index,
                            kernel_name);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, EM_ERR_DEVICE, "cuModuleGetFunction(%s)", kernel_name);
    int max_units = 0, static_smem = 0, regs = 0;
    if ((r = lib.cu.FuncGetAttribute(&max_units, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f)) ||
        (r = lib.cu.FuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f)) ||
        (r = lib.cu.FuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f)))
        return cu_fail(d, r, EM_ERR_DEVICE, "cuFuncGetAttribute(%s)", kernel_name);
    unsigned dyn = 0;
    if ((st = read_dyn_smem(d, m, kernel_name, &dyn)) != EM_OK)
        return st;
    uint64_t need = (uint64_t)dyn + (uint64_t)(static_smem > 0 ? static_smem : 0);
    if (need > d->shared_optin)
        return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: kernel %s needs %llu bytes of shared "
                            "memory; a block can have at most %u on this device", d->index,
                            kernel_name, (unsigned long long)need, d->shared_optin);
    if (dyn && need > DEFAULT_STATIC_SHARED) {
        r = lib.cu.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)dyn);
        if (r != CUDA_SUCCESS)
            return cu_fail(d, r, EM_ERR_DEVICE, "cuFuncSetAttribute(%s, MAX_DYNAMIC_SHARED_SIZE_"
                           "BYTES, %u)", kernel_name, dyn);
    }
    cuda_fn *cf = calloc(1, sizeof(*cf));
    if (!cf)
        return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of memory", d->index);
    cf->f = f;
    cf->dyn_smem = dyn;
    cf->max_units = max_units > 0 ? (unsigned)max_units : 1;
    cf->regs = regs;
    cf->pdl = pdl_ok(d, m);
    snprintf(cf->name, sizeof(cf->name), "%s", kernel_name);
    cf->next = m->fns;
    m->fns = cf;
    *fn = cf;
    return EM_OK;
}

/* ---- launching ------------------------------------------------------------------------------- */

/* Appends `size` bytes aligned to `align` to the parameter area; returns where, or NULL when the
 * area is full. */
static void *param_slot(unsigned char *area, size_t *used, size_t size, size_t align)
{
    size_t at = (*used + align - 1) / align * align;
    if (at + size > PARAM_BYTES)
        return NULL;
    *used = at + size;
    return area + at;
}

/* Stores a scalar argument as the C type of the launch ABI (f16 and bf16 travel as float);
 * returns the pointer cuLaunchKernel needs. */
static void *pack_scalar(unsigned char *area, size_t *used, const em_drv_arg *a)
{
    em_scalar kind = (em_scalar)a->type.scalar;
    bool half = kind == EM_F16 || kind == EM_BF16;
    size_t size = half ? sizeof(float) : em_scalar_size(kind);
    void *p = param_slot(area, used, size, size);
    if (!p)
        return NULL;
    union {
        uint8_t u8;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
        float f32;
        double f64;
    } v;
    v.u64 = 0;
    switch (kind) {
    case EM_F16:
    case EM_BF16:
    case EM_F32: v.f32 = (float)a->value.f; break;
    case EM_F64: v.f64 = a->value.f; break;
    case EM_BOOL: v.u8 = a->value.i != 0; break;
    default: /* integers: the low bytes, two's complement */
        if (size == 1)
            v.u8 = (uint8_t)a->value.u;
        else if (size == 2)
            v.u16 = (uint16_t)a->value.u;
        else if (size == 4)
            v.u32 = (uint32_t)a->value.u;
        else
            v.u64 = a->value.u;
        break;
    }
    memcpy(p, &v, size);
    return p;
}

/* Words of metadata a launch needs: 1 + 2 * rank per buffer, at least 1. */
static size_t meta_words(const em_drv_launch *L)
{
    size_t words = 0;
    for (size_t i = 0; i < L->nargs; i++)
        if (L->args[i].kind == EM_PARAM_BUFFER)
            words += 1 + 2 * (size_t)L->args[i].rank;
    return words ? words : 1;
}

/* Writes the launch's metadata: for each buffer, len, shape[0..rank), stride[0..rank). */
static void meta_fill(const em_drv_launch *L, uint64_t *w)
{
    size_t k = 0;
    w[0] = 0;
    for (size_t i = 0; i < L->nargs; i++) {
        const em_drv_arg *a = &L->args[i];
        if (a->kind != EM_PARAM_BUFFER)
            continue;
        w[k++] = a->len;
        for (uint32_t j = 0; j < a->rank; j++)
            w[k++] = (uint64_t)a->shape[j];
        for (uint32_t j = 0; j < a->rank; j++)
            w[k++] = (uint64_t)a->stride[j];
    }
}

/* Allocates the ring on first use. Called with d->lock held. */
static em_status meta_init(cuda_device *d)
{
    meta_ring *m = &d->meta;
    CUresult r = lib.cu.MemAlloc(&m->dev, META_RING_BYTES);
    if (r != CUDA_SUCCESS) {
        m->dev = 0;
        return cu_fail(d, r, r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                       "allocating the launch metadata ring (cuMemAlloc)");
    }
    for (int i = 0; i < META_SEGMENTS; i++) {
        if ((r = lib.cu.EventCreate(&m->left[i], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
            em_status st = cu_fail(d, r, EM_ERR_DEVICE, "cuEventCreate");
            for (int j = 0; j < i; j++)
                lib.cu.EventDestroy(m->left[j]);
            memset(m->left, 0, sizeof(m->left));
            lib.cu.MemFree(m->dev);
            m->dev = 0;
            return st;
        }
        m->busy[i] = false;
    }
    void *host = NULL;
    if (!d->pinned_failed && lib.cu.MemAllocHost(&host, META_RING_BYTES) == CUDA_SUCCESS)
        m->host = host; /* else uploads go from pageable memory */
    m->seg = 0;
    m->at = 0;
    return EM_OK;
}

/* Reserves `bytes` of the ring; *off receives where. Called with d->lock held. */
static em_status meta_reserve(cuda_device *d, size_t bytes, size_t *off)
{
    meta_ring *m = &d->meta;
    if (bytes > META_SEGMENT_BYTES)
        return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: a launch with %zu bytes of tensor "
                            "metadata (at most %zu)", d->index, bytes, META_SEGMENT_BYTES);
    if (m->at + bytes > (m->seg + 1) * META_SEGMENT_BYTES) {
        CUresult r = lib.cu.EventRecord(m->left[m->seg], d->stream);
        if (r != CUDA_SUCCESS)
            return async_fail_locked(d, r, "cuEventRecord");
        m->busy[m->seg] = true;
        m->seg = (m->seg + 1) % META_SEGMENTS;
        m->at = m->seg * META_SEGMENT_BYTES;
        if (m->busy[m->seg]) {
            if ((r = lib.cu.EventSynchronize(m->left[m->seg])) != CUDA_SUCCESS)
                return async_fail_locked(d, r, "waiting for launches to finish "
                                         "(cuEventSynchronize)");
            m->busy[m->seg] = false;
        }
    }
    *off = m->at;
    m->at += (bytes + META_ALIGN - 1) / META_ALIGN * META_ALIGN;
    return EM_OK;
}

/* Queues the upload of L's metadata; *where receives its device address. Called with d->lock
 * held (the caller launches before releasing it). */
static em_status meta_capture(cuda_device *d, const em_drv_launch *L, CUdeviceptr *where);

static em_status meta_upload(cuda_device *d, const em_drv_launch *L, CUdeviceptr *where)
{
    if (d->capture)
        return meta_capture(d, L, where);
    em_status st = d->meta.dev ? EM_OK : meta_init(d);
    size_t bytes = meta_words(L) * sizeof(uint64_t), off = 0;
    if (st == EM_OK)
        st = meta_reserve(d, bytes, &off);
    if (st != EM_OK)
        return st;
    uint64_t stack[256];
    uint64_t *w = d->meta.host ? (uint64_t *)(void *)(d->meta.host + off)
                               : bytes <= sizeof(stack) ? stack : malloc(bytes);
    if (!w)
        return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of memory", d->index);
    meta_fill(L, w);
    /* from pageable memory the driver copies the words out before returning */
    CUresult r = lib.cu.MemcpyHtoDAsync(d->meta.dev + off, w, bytes, d->stream);
    if (w != stack && !d->meta.host)
        free(w);
    if (r != CUDA_SUCCESS)
        return async_fail_locked(d, r, "uploading launch metadata (cuMemcpyHtoDAsync)");
    *where = d->meta.dev + off;
    return EM_OK;
}

/* Checks a launch against the kernel's and the device's limits. */
static em_status check_launch(const cuda_device *d, const cuda_fn *fn, const em_drv_launch *L)
{
    uint64_t units = (uint64_t)L->cube_dim[0] * L->cube_dim[1] * L->cube_dim[2];
    if (units > fn->max_units)
        return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: kernel %s can run at most %u units per "
                            "cube on this device (it uses %d registers per unit); %llu were "
                            "asked for", d->index, fn->name, fn->max_units, fn->regs,
                            (unsigned long long)units);
    for (int i = 0; i < 3; i++)
        if (L->cube_count[i] > d->max_grid[i])
            return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: kernel %s: %u cubes along axis %c; "
                                "this device allows at most %u", d->index, fn->name,
                                L->cube_count[i], "xyz"[i], d->max_grid[i]);
    return EM_OK;
}

static em_status cuda_launch(void *state, void *fn_handle, const em_drv_launch *L)
{
    cuda_device *d = state;
    cuda_fn *fn = fn_handle;
    em_status st = check_launch(d, fn, L);
    if (st != EM_OK)
        return st;
    /* the parameters: buffers as device pointers, scalars as their C type, then the metadata */
    _Alignas(16) unsigned char area[PARAM_BYTES];
    void *params_stack[64];
    size_t np = L->nargs + 1;
    void **params = np <= 64 ? params_stack : calloc(np, sizeof(*params));
    if (!params)
        return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of memory", d->index);
    size_t used = 0;
    for (size_t i = 0; i < L->nargs && st == EM_OK; i++) {
        const em_drv_arg *a = &L->args[i];
        if (a->kind == EM_PARAM_BUFFER) {
            CUdeviceptr *p = param_slot(area, &used, sizeof(CUdeviceptr), sizeof(CUdeviceptr));
            if (p)
                *p = dptr(a->mem, a->offset);
            params[i] = p;
        } else {
            params[i] = pack_scalar(area, &used, a);
        }
        if (!params[i])
            st = em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: kernel %s: the arguments need more "
                              "than %d bytes of parameter space", d->index, fn->name,
                              PARAM_BYTES);
    }
    CUdeviceptr *meta = st == EM_OK ? param_slot(area, &used, sizeof(CUdeviceptr), 8) : NULL;
    if (st == EM_OK && !meta)
        st = em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: kernel %s: the arguments need more than "
                          "%d bytes of parameter space", d->index, fn->name, PARAM_BYTES);
    params[L->nargs] = meta;
    if (st == EM_OK)
        st = bind(d);
    if (st != EM_OK) {
        if (params != params_stack)
            free(params);
        return st;
    }
    pthread_mutex_lock(&d->lock);
    st = meta_upload(d, L, meta);
    CUresult r = CUDA_SUCCESS;
    if (st == EM_OK) {
        snprintf(d->last_kernel, sizeof(d->last_kernel), "%s", fn->name);
        if (fn->pdl) {
            CUlaunchAttribute attr;
            memset(&attr, 0, sizeof attr);
            attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmatic_stream_serialization_allowed = 1;
            CUlaunchConfig cfg = {L->cube_count[0], L->cube_count[1], L->cube_count[2],
                                  L->cube_dim[0],   L->cube_dim[1],   L->cube_dim[2],
                                  fn->dyn_smem,     d->stream,        &attr,
                                  1};
            r = lib.cu.LaunchKernelEx(&cfg, fn->f, params, NULL);
        } else {
            r = lib.cu.LaunchKernel(fn->f, L->cube_count[0], L->cube_count[1], L->cube_count[2],
                                    L->cube_dim[0], L->cube_dim[1], L->cube_dim[2], fn->dyn_smem,
                                    d->stream, params, NULL);
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        st = cu_fail(d, r, EM_ERR_UNSUPPORTED, "launching %s (%u x %u x %u units per cube, %d "
                     "registers per unit, %u bytes of dynamic shared memory)", fn->name,
                     L->cube_dim[0], L->cube_dim[1], L->cube_dim[2], fn->regs, fn->dyn_smem);
    else if (r != CUDA_SUCCESS)
        st = async_fail(d, r, fn->pdl ? "cuLaunchKernelEx" : "cuLaunchKernel");
    if (params != params_stack)
        free(params);
    return st;
}

static em_status cuda_sync(void *state)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUresult r = lib.cu.StreamSynchronize(d->stream);
    return r == CUDA_SUCCESS ? EM_OK : async_fail(d, r, "cuStreamSynchronize");
}

/* ---- timing ---------------------------------------------------------------------------------- */

static em_status cuda_event_record(void *state, void **event)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUevent e = NULL;
    CUresult r = lib.cu.EventCreate(&e, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, EM_ERR_DEVICE, "cuEventCreate");
    r = lib.cu.EventRecord(e, d->stream);
    if (r != CUDA_SUCCESS) {
        lib.cu.EventDestroy(e);
        return async_fail(d, r, "cuEventRecord");
    }
    *event = e;
    return EM_OK;
}

static em_status cuda_event_elapsed(void *state, void *start, void *stop, double *seconds)
{
    cuda_device *d = state;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    CUresult r = lib.cu.EventSynchronize((CUevent)stop);
    if (r != CUDA_SUCCESS)
        return async_fail(d, r, "cuEventSynchronize");
    float ms = 0;
    r = lib.cu.EventElapsedTime(&ms, (CUevent)start, (CUevent)stop);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, EM_ERR_DEVICE, "cuEventElapsedTime");
    *seconds = (double)ms * 1e-3;
    return EM_OK;
}

static void cuda_event_destroy(void *state, void *event)
{
    cuda_device *d = state;
    if (event && bind(d) == EM_OK)
        lib.cu.EventDestroy((CUevent)event);
}

/* ---- graphs ---------------------------------------------------------------------------------- */

/* The runtime (graph.c) issues a recorded sequence between graph_begin and graph_end; the stream
 * captures it (relaxed mode: the metadata chunks and pinned blocks below may be allocated while
 * capturing). Launch metadata goes to chunks the graph owns, uploaded once after the capture, so
 * the graph holds no copy nodes for it; a write's bytes go to a pinned block the graph owns, and
 * its copy node reads them there at every replay. */

#define CAP_CHUNK_BYTES ((size_t)64 << 10)

static void graph_destroy(cuda_graph *g)
{
    if (!g)
        return;
    if (g->exec)
        lib.cu.GraphExecDestroy(g->exec);
    while (g->meta) {
        cap_chunk *c = g->meta;
        g->meta = c->next;
        if (c->dev)
            lib.cu.MemFree(c->dev);
        free(c->host);
        free(c);
    }
    for (size_t i = 0; i < g->npinned; i++)
        lib.cu.MemFreeHost(g->pinned[i]);
    free(g->pinned);
    free(g);
}

/* Metadata of a captured launch, in the capture's chunks. Called with d->lock held. */
static em_status meta_capture(cuda_device *d, const em_drv_launch *L, CUdeviceptr *where)
{
    cuda_graph *g = d->capture;
    size_t bytes = meta_words(L) * sizeof(uint64_t);
    cap_chunk *c = g->meta;
    if (!c || c->used + bytes > c->size) {
        size_t size = EM_MAX(bytes, CAP_CHUNK_BYTES);
        c = calloc(1, sizeof(*c));
        unsigned char *host = c ? malloc(size) : NULL;
        if (!host) {
            free(c);
            return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of host memory capturing a graph",
                                d->index);
        }
        CUresult r = lib.cu.MemAlloc(&c->dev, size);
        if (r != CUDA_SUCCESS) {
            free(host);
            free(c);
            return cu_fail(d, r, r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                           "allocating a graph's launch metadata (cuMemAlloc)");
        }
        c->host = host;
        c->size = size;
        c->next = g->meta;
        g->meta = c;
    }
    meta_fill(L, (uint64_t *)(void *)(c->host + c->used));
    *where = c->dev + c->used;
    c->used += (bytes + META_ALIGN - 1) / META_ALIGN * META_ALIGN;
    if (c->used > c->size)
        c->used = c->size;
    return EM_OK;
}

/* A captured write: the bytes kept in a pinned block of the graph. Called with d->lock held. */
static em_status write_capture(cuda_device *d, void *mem, size_t offset, const void *src,
                               size_t bytes)
{
    cuda_graph *g = d->capture;
    if (g->npinned == g->pinned_cap) {
        size_t cap = g->pinned_cap ? 2 * g->pinned_cap : 16;
        void **np = realloc(g->pinned, cap * sizeof(*np));
        if (!np)
            return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of host memory capturing a graph",
                                d->index);
        g->pinned = np;
        g->pinned_cap = cap;
    }
    void *host = NULL;
    CUresult r = lib.cu.MemAllocHost(&host, bytes);
    if (r != CUDA_SUCCESS)
        return cu_fail(d, r, EM_ERR_NOMEM, "pinned memory for a graph's write (cuMemAllocHost)");
    g->pinned[g->npinned++] = host;
    memcpy(host, src, bytes);
    r = lib.cu.MemcpyHtoDAsync(dptr(mem, offset), host, bytes, d->stream);
    return r == CUDA_SUCCESS ? EM_OK
                             : cu_fail(d, r, EM_ERR_DEVICE, "capturing a write (cuMemcpyHtoDAsync)");
}

static em_status cuda_graph_begin(void *state)
{
    cuda_device *d = state;
    if (!lib.cu.StreamBeginCapture)
        return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: the driver has no CUDA graphs",
                            d->index);
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    cuda_graph *g = calloc(1, sizeof(*g));
    if (!g)
        return em_set_error(EM_ERR_NOMEM, "cuda:%d: out of host memory", d->index);
    pthread_mutex_lock(&d->lock);
    CUresult r = lib.cu.StreamBeginCapture(d->stream, CU_STREAM_CAPTURE_MODE_RELAXED);
    if (r == CUDA_SUCCESS)
        d->capture = g;
    pthread_mutex_unlock(&d->lock);
    if (r != CUDA_SUCCESS) {
        free(g);
        return cu_fail(d, r, EM_ERR_DEVICE, "cuStreamBeginCapture");
    }
    return EM_OK;
}

static em_status cuda_graph_end(void *state, void **out)
{
    cuda_device *d = state;
    *out = NULL;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    pthread_mutex_lock(&d->lock);
    cuda_graph *g = d->capture;
    CUgraph graph = NULL;
    CUresult r = lib.cu.StreamEndCapture(d->stream, &graph);
    d->capture = NULL;
    const char *call = "cuStreamEndCapture";
    /* the metadata, once, now that the stream runs again */
    for (cap_chunk *c = g ? g->meta : NULL; r == CUDA_SUCCESS && c; c = c->next) {
        call = "uploading a graph's launch metadata (cuMemcpyHtoDAsync)";
        r = lib.cu.MemcpyHtoDAsync(c->dev, c->host, c->used, d->stream);
    }
    if (r == CUDA_SUCCESS) {
        call = "cuStreamSynchronize";
        r = lib.cu.StreamSynchronize(d->stream);
    }
    if (r == CUDA_SUCCESS && g) {
        call = "cuGraphInstantiateWithFlags";
        r = lib.cu.GraphInstantiate(&g->exec, graph, 0);
    }
    pthread_mutex_unlock(&d->lock);
    if (graph)
        lib.cu.GraphDestroy(graph);
    if (r != CUDA_SUCCESS || !g) {
        if (g)
            g->exec = r == CUDA_SUCCESS ? g->exec : NULL;
        graph_destroy(g);
        return g ? cu_fail(d, r, EM_ERR_DEVICE, "%s", call)
                 : em_set_error(EM_ERR_INVALID, "cuda:%d: no capture to end", d->index);
    }
    *out = g;
    return EM_OK;
}

static em_status cuda_graph_launch(void *state, void *graph)
{
    cuda_device *d = state;
    cuda_graph *g = graph;
    em_status st = bind(d);
    if (st != EM_OK)
        return st;
    pthread_mutex_lock(&d->lock);
    snprintf(d->last_kernel, sizeof(d->last_kernel), "a graph");
    CUresult r = lib.cu.GraphLaunch(g->exec, d->stream);
    pthread_mutex_unlock(&d->lock);
    return r == CUDA_SUCCESS ? EM_OK : async_fail(d, r, "cuGraphLaunch");
}

static void cuda_graph_free(void *state, void *graph)
{
    cuda_device *d = state;
    if (graph && bind(d) == EM_OK) {
        /* a replay may still be running: its memory goes only once it is done */
        lib.cu.StreamSynchronize(d->stream);
        graph_destroy(graph);
    }
}

/* ---- tensor maps ------------------------------------------------------------------------------- */

/* CUtensorMapDataType of an element type (-1: none). */
static int tmap_dtype(em_scalar s)
{
    switch (s) {
    case EM_U8: case EM_I8: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    case EM_U16: case EM_I16: return CU_TENSOR_MAP_DATA_TYPE_UINT16;
    case EM_U32: return CU_TENSOR_MAP_DATA_TYPE_UINT32;
    case EM_I32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
    case EM_U64: return CU_TENSOR_MAP_DATA_TYPE_UINT64;
    case EM_I64: return CU_TENSOR_MAP_DATA_TYPE_INT64;
    case EM_F16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case EM_BF16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case EM_F32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case EM_F64: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
    default: return -1;
    }
}

/* cuTensorMapEncodeTiled of the (checked, 3-D) map d over mem + offset: dims innermost first,
 * strides in bytes for dims 1 and 2, element strides 1, no interleave, the swizzle asked for, L2
 * promotion of 128 bytes, zeros outside the dims. */
static em_status cuda_tensor_map(void *state, void *mem, size_t offset, const em_tensor_map_desc *d,
                                 uint64_t *out)
{
    cuda_device *dv = state;
    if (!lib.cu.TensorMapEncodeTiled || strcmp(dv->compile_arch, "sm_90a"))
        return em_set_error(EM_ERR_UNSUPPORTED, "cuda:%d: tensor maps (TMA) need compute "
                            "capability 9.0 and a driver with cuTensorMapEncodeTiled; this device "
                            "is %s", dv->index, dv->compile_arch[0] ? dv->compile_arch : "of unknown architecture");
    int dt = tmap_dtype(d->dtype);
    if (dt < 0)
        return em_set_error(EM_ERR_INVALID, "cuda:%d: no tensor map of %s elements", dv->index,
                            em_scalar_name(d->dtype));
    size_t es = em_scalar_size(d->dtype);
    unsigned long long dims[3] = {d->dims[0], d->dims[1], d->dims[2]};
    unsigned long long strides[2] = {d->strides[1] * es, d->strides[2] * es};
    unsigned box[3] = {d->box[0], d->box[1], d->box[2]}, estr[3] = {1, 1, 1};
    _Alignas(128) uint64_t map[EM_TENSOR_MAP_WORDS] = {0};
    em_status st = bind(dv);
    if (st != EM_OK) return st;
    CUresult r = lib.cu.TensorMapEncodeTiled(
        map, dt, 3, (void *)(uintptr_t)dptr(mem, offset), dims, strides, box, estr,
        CU_TENSOR_MAP_INTERLEAVE_NONE,
        d->swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return cu_fail(dv, r, EM_ERR_INVALID, "cuTensorMapEncodeTiled (dims %llu x %llu x %llu, "
                       "box %u x %u x %u, %s)", dims[0], dims[1], dims[2], box[0], box[1], box[2],
                       em_scalar_name(d->dtype));
    memcpy(out, map, sizeof map);
    return EM_OK;
}

const em_driver em_rt_cuda_driver = {
    .name = "cuda",
    .target = "cuda",
    .binary_ext = ".cubin",
    .probe = cuda_probe,
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .write = cuda_write,
    .read = cuda_read,
    .copy = cuda_copy,
    .generate = cuda_generate,
    .compiler_id = cuda_compiler_id,
    .build = cuda_build,
    .load = cuda_load,
    .unload = cuda_unload,
    .function = cuda_function,
    .launch = cuda_launch,
    .sync = cuda_sync,
    .event_record = cuda_event_record,
    .event_elapsed = cuda_event_elapsed,
    .event_destroy = cuda_event_destroy,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .tensor_map = cuda_tensor_map,
};
