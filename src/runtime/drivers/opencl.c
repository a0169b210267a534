/* opencl.c — the OpenCL device driver: fills em_rt_opencl_driver (see runtime/driver.h) on top of
 * whatever OpenCL platforms the ICD loader finds (PoCL on the CPU in CI, vendor drivers on GPUs).
 *
 * The library is loaded at run time (dlopen "libOpenCL.so.1", opencl_api.h), never linked. Devices
 * are numbered across every platform, GPUs and accelerators first, then the rest (CPUs), each group
 * in platform order: "opencl:0" is the best device the machine has.
 *
 * A device is a context and one in-order command queue with profiling enabled. Buffers are plain
 * cl_mem objects. Kernels are generated as OpenCL C by the code generator (kernel/codegen/opencl.c,
 * whose parameter ABI launch follows), built with clBuildProgram, and the program binary is what
 * goes into the kernel cache, wrapped in a small header of our own (see "binary files" below) so
 * that a truncated, corrupt or foreign file is detected before OpenCL ever sees it. Timing uses
 * profiled marker events where the platform supports them, else the host clock after clFinish.
 *
 * Every OpenCL call is checked; an error names the call and the OpenCL error code. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernel/codegen/codegen.h"
#include "runtime/rt.h"
#include "runtime/drivers/opencl_api.h"

#define OCL_LIBRARY "libOpenCL.so.1"
#define OCL_MAX_DEVICES 64
/* Binary files: "EMBERCL1", then the header fields below, the compiler id, the program binary. */
#define OCL_BINARY_MAGIC "EMBERCL1"
#define OCL_DRIVER_ABI 1 /* bump when the way launch passes arguments changes */
#define OCL_LOG_MAX 3000 /* bytes of a build log quoted in an error message */

/* ---- error codes ----------------------------------------------------------------------------- */

/* OpenCL error codes and their names. */
/* clang-format off */
#define E(x) {x, #x}
/* clang-format on */
static const struct {
    cl_int code;      /* the error code */
    const char *name; /* its name in cl.h */
} CL_ERRORS[] = {
    E(CL_SUCCESS),
    E(CL_DEVICE_NOT_FOUND),
    E(CL_DEVICE_NOT_AVAILABLE),
    E(CL_COMPILER_NOT_AVAILABLE),
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE),
    E(CL_OUT_OF_RESOURCES),
    E(CL_OUT_OF_HOST_MEMORY),
    E(CL_PROFILING_INFO_NOT_AVAILABLE),
    E(CL_MEM_COPY_OVERLAP),
    E(CL_IMAGE_FORMAT_MISMATCH),
    E(CL_IMAGE_FORMAT_NOT_SUPPORTED),
    E(CL_BUILD_PROGRAM_FAILURE),
    E(CL_MAP_FAILURE),
    E(CL_MISALIGNED_SUB_BUFFER_OFFSET),
    E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST),
    E(CL_COMPILE_PROGRAM_FAILURE),
    E(CL_LINKER_NOT_AVAILABLE),
    E(CL_LINK_PROGRAM_FAILURE),
    E(CL_DEVICE_PARTITION_FAILED),
    E(CL_KERNEL_ARG_INFO_NOT_AVAILABLE),
    E(CL_INVALID_VALUE),
    E(CL_INVALID_DEVICE_TYPE),
    E(CL_INVALID_PLATFORM),
    E(CL_INVALID_DEVICE),
    E(CL_INVALID_CONTEXT),
    E(CL_INVALID_QUEUE_PROPERTIES),
    E(CL_INVALID_COMMAND_QUEUE),
    E(CL_INVALID_HOST_PTR),
    E(CL_INVALID_MEM_OBJECT),
    E(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR),
    E(CL_INVALID_IMAGE_SIZE),
    E(CL_INVALID_SAMPLER),
    E(CL_INVALID_BINARY),
    E(CL_INVALID_BUILD_OPTIONS),
    E(CL_INVALID_PROGRAM),
    E(CL_INVALID_PROGRAM_EXECUTABLE),
    E(CL_INVALID_KERNEL_NAME),
    E(CL_INVALID_KERNEL_DEFINITION),
    E(CL_INVALID_KERNEL),
    E(CL_INVALID_ARG_INDEX),
    E(CL_INVALID_ARG_VALUE),
    E(CL_INVALID_ARG_SIZE),
    E(CL_INVALID_KERNEL_ARGS),
    E(CL_INVALID_WORK_DIMENSION),
    E(CL_INVALID_WORK_GROUP_SIZE),
    E(CL_INVALID_WORK_ITEM_SIZE),
    E(CL_INVALID_GLOBAL_OFFSET),
    E(CL_INVALID_EVENT_WAIT_LIST),
    E(CL_INVALID_EVENT),
    E(CL_INVALID_OPERATION),
    E(CL_INVALID_GL_OBJECT),
    E(CL_INVALID_BUFFER_SIZE),
    E(CL_INVALID_MIP_LEVEL),
    E(CL_INVALID_GLOBAL_WORK_SIZE),
    E(CL_INVALID_PROPERTY),
    E(CL_INVALID_IMAGE_DESCRIPTOR),
    E(CL_INVALID_COMPILER_OPTIONS),
    E(CL_INVALID_LINKER_OPTIONS),
    E(CL_INVALID_DEVICE_PARTITION_COUNT),
    E(CL_INVALID_PIPE_SIZE),
    E(CL_INVALID_DEVICE_QUEUE),
    E(CL_INVALID_SPEC_ID),
    E(CL_MAX_SIZE_RESTRICTION_EXCEEDED),
    E(CL_PLATFORM_NOT_FOUND_KHR),
};
#undef E

/* The name of an OpenCL error code ("CL_OUT_OF_RESOURCES"), or "unknown OpenCL error". */
static const char *cl_err_name(cl_int err)
{
    for (size_t i = 0; i < EM_ARRAY_LEN(CL_ERRORS); i++)
        if (CL_ERRORS[i].code == err) return CL_ERRORS[i].name;
    return "unknown OpenCL error";
}

/* Error codes that mean "the device (or the host behind it) ran out of memory". */
static bool is_oom(cl_int err)
{
    return err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
           err == CL_OUT_OF_HOST_MEMORY;
}

/* ---- the library ----------------------------------------------------------------------------- */

static em_cl_api api; /* written once, by load_api under api_once */
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static char api_why[256]; /* why the library is unusable ("" when it loaded) */

static void load_api(void)
{
    void *lib = dlopen(OCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(api_why, sizeof(api_why),
                 "%s not found (%s); install an OpenCL ICD loader (Debian: ocl-icd-libopencl1) "
                 "and a driver (e.g. pocl-opencl-icd)",
                 OCL_LIBRARY, e ? e : "dlopen failed");
        return;
    }
#define LOAD_REQUIRED(name)                                                                        \
    if (!(api.name = (__typeof__(api.name))dlsym(lib, #name))) {                                   \
        snprintf(api_why, sizeof(api_why), "%s lacks %s (an OpenCL 1.2 loader is needed)",         \
                 OCL_LIBRARY, #name);                                                              \
        dlclose(lib);                                                                              \
        memset(&api, 0, sizeof(api));                                                              \
        return;                                                                                    \
    }
    EM_CL_REQUIRED_FUNCS(LOAD_REQUIRED)
#undef LOAD_REQUIRED
    api.lib = lib;
}

/* The loaded API, or NULL with `why` saying why not. */
static const em_cl_api *get_api(char *why, size_t why_size)
{
    pthread_once(&api_once, load_api);
    if (!api.lib) {
        snprintf(why, why_size, "%s", api_why);
        return NULL;
    }
    return &api;
}

/* ---- device enumeration ---------------------------------------------------------------------- */

typedef struct dev_list {
    cl_platform_id platform[OCL_MAX_DEVICES]; /* platform of each device */
    cl_device_id device[OCL_MAX_DEVICES];     /* devices, GPUs and accelerators first */
    size_t n;                                 /* devices found */
} dev_list;

/* Lists every device of every platform; 0 devices (why set) when there are none. */
static size_t enumerate(const em_cl_api *cl, dev_list *out, char *why, size_t why_size)
{
    out->n = 0;
    cl_platform_id plats[16];
    cl_uint np = 0;
    cl_int err = cl->clGetPlatformIDs(16, plats, &np);
    if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && np == 0)) {
        snprintf(why, why_size,
                 "no OpenCL platform: the ICD loader found no driver (no usable .icd file in "
                 "/etc/OpenCL/vendors; e.g. install pocl-opencl-icd)");
        return 0;
    }
    if (err != CL_SUCCESS) {
        snprintf(why, why_size, "clGetPlatformIDs failed with %s (%d)", cl_err_name(err), err);
        return 0;
    }
    if (np > 16) np = 16;
    /* two passes: GPUs and accelerators, then everything else */
    for (int pass = 0; pass < 2; pass++) {
        for (cl_uint p = 0; p < np; p++) {
            cl_device_id devs[OCL_MAX_DEVICES];
            cl_uint nd = 0;
            if (cl->clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, OCL_MAX_DEVICES, devs, &nd) !=
                CL_SUCCESS)
                continue; /* CL_DEVICE_NOT_FOUND: a platform without devices */
            for (cl_uint d = 0; d < nd && d < OCL_MAX_DEVICES && out->n < OCL_MAX_DEVICES; d++) {
                cl_device_type type = 0;
                if (cl->clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof(type), &type, NULL) !=
                    CL_SUCCESS)
                    continue;
                bool fast = (type & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0;
                if (fast != (pass == 0)) continue;
                out->platform[out->n] = plats[p];
                out->device[out->n] = devs[d];
                out->n++;
            }
        }
    }
    if (out->n == 0)
        snprintf(why, why_size, "%u OpenCL platform%s found, but no device on %s", np,
                 np == 1 ? "" : "s", np == 1 ? "it" : "any of them");
    return out->n;
}

static int ocl_probe(char *why, size_t why_size)
{
    why[0] = '\0';
    const em_cl_api *cl = get_api(why, why_size);
    if (!cl) return 0;
    dev_list list;
    return (int)enumerate(cl, &list, why, why_size);
}

/* ---- device state ---------------------------------------------------------------------------- */

typedef struct ocl_dev {
    const em_cl_api *cl;       /* the loaded library */
    int index;                 /* device index ("opencl:INDEX") */
    cl_platform_id platform;   /* the device's platform */
    cl_device_id device;       /* the device */
    cl_context ctx;            /* a context holding the device alone */
    cl_command_queue queue;    /* in-order, profiling enabled */
    char name[160];            /* "opencl:0 (DEVICE NAME)", for messages */
    char options[64];          /* clBuildProgram options */
    char id[1024];             /* compiler identity (compiler_id; also inside binary files) */
    uint64_t mem_limit;        /* CL_DEVICE_GLOBAL_MEM_SIZE */
    uint64_t max_alloc;        /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    size_t sub_align;          /* bytes a sub-buffer's origin must be a multiple of */
    _Atomic uint64_t mem_used; /* bytes in live blocks */
    bool marker_profiling;     /* marker events carry profiling timestamps */
    /* kernel arguments are state of the cl_kernel: setting them and enqueueing is one step */
    pthread_mutex_t launch_lock;
} ocl_dev;

/* A kernel handle (owned by its module). */
typedef struct ocl_fn {
    struct ocl_fn *next; /* the module's other functions */
    cl_kernel kernel;    /* the kernel object */
    size_t max_units;    /* CL_KERNEL_WORK_GROUP_SIZE: most units per cube for this kernel */
    cl_mem meta;         /* metadata buffer of the last launch (reused while unchanged) */
    void *meta_host;     /* its contents */
    size_t meta_size;    /* its size in bytes */
    char name[];         /* kernel name */
} ocl_fn;

/* A loaded program and the kernels created from it. */
typedef struct ocl_module {
    cl_program program; /* the built program */
    ocl_fn *fns;        /* kernels, freed with the module */
} ocl_module;

/* A timing point: a profiled marker, or a host time taken after clFinish. */
typedef struct ocl_event {
    cl_event event; /* the marker (NULL in host mode) */
    double host;    /* host seconds (host mode) */
} ocl_event;

/* Sets the error for a failed OpenCL call: names the device, the call and the error code. The
 * status is EM_ERR_NOMEM for out-of-memory codes, else `status`. */
static em_status cl_fail(const ocl_dev *d, em_status status, const char *call, cl_int err,
                         const char *what)
{
    if (is_oom(err)) status = EM_ERR_NOMEM;
    return em_set_error(status, "%s: %s failed with %s (%d)%s%s", d ? d->name : "OpenCL", call,
                        cl_err_name(err), err, what && *what ? " " : "", what ? what : "");
}

/* Reads a fixed-size device property; on failure the error names it. */
static em_status dev_info(const ocl_dev *d, cl_device_info what, const char *what_name, size_t size,
                          void *out)
{
    cl_int err = d->cl->clGetDeviceInfo(d->device, what, size, out, NULL);
    if (err != CL_SUCCESS) {
        char ctx[96];
        snprintf(ctx, sizeof(ctx), "reading %s", what_name);
        return cl_fail(d, EM_ERR_DEVICE, "clGetDeviceInfo", err, ctx);
    }
    return EM_OK;
}
#define DEV_INFO(d, what, ptr) dev_info((d), (what), #what, sizeof(*(ptr)), (ptr))

/* Reads a string property (device or platform) into a malloc'd string; NULL with the error set. */
static char *info_string(const ocl_dev *d, bool platform, cl_uint what, const char *what_name)
{
    size_t n = 0;
    const char *call = platform ? "clGetPlatformInfo" : "clGetDeviceInfo";
    cl_int err = platform ? d->cl->clGetPlatformInfo(d->platform, what, 0, NULL, &n)
                          : d->cl->clGetDeviceInfo(d->device, what, 0, NULL, &n);
    char *s = err == CL_SUCCESS ? calloc(1, n + 1) : NULL;
    if (err == CL_SUCCESS && !s) {
        em_set_error(EM_ERR_NOMEM, "out of memory reading %s", what_name);
        return NULL;
    }
    if (err == CL_SUCCESS)
        err = platform ? d->cl->clGetPlatformInfo(d->platform, what, n, s, NULL)
                       : d->cl->clGetDeviceInfo(d->device, what, n, s, NULL);
    if (err != CL_SUCCESS) {
        free(s);
        char ctx[96];
        snprintf(ctx, sizeof(ctx), "reading %s", what_name);
        cl_fail(d, EM_ERR_DEVICE, call, err, ctx);
        return NULL;
    }
    /* trim the trailing spaces some drivers pad names with */
    size_t len = strlen(s);
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\n')) s[--len] = '\0';
    return s;
}
#define DEV_STR(d, what) info_string((d), false, (what), #what)
#define PLAT_STR(d, what) info_string((d), true, (what), #what)

/* True when the space-separated list `exts` contains `name`. */
static bool has_ext(const char *exts, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = exts; p && (p = strstr(p, name)); p += n)
        if ((p == exts || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
    return false;
}

/* "OpenCL C 1.2 pocl" -> 120; 0 when unparsable. */
static int c_version(const char *s)
{
    int major = 0, minor = 0;
    if (!s || sscanf(s, "OpenCL C %d.%d", &major, &minor) != 2) return 0;
    return major * 100 + minor * 10;
}

/* ---- programs -------------------------------------------------------------------------------- */

/* The build log of a program for the device (malloc'd; "" when there is none). */
static char *build_log(const ocl_dev *d, cl_program prog)
{
    size_t n = 0;
    char *log = NULL;
    if (d->cl->clGetProgramBuildInfo(prog, d->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) ==
            CL_SUCCESS &&
        (log = calloc(1, n + 1)) &&
        d->cl->clGetProgramBuildInfo(prog, d->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) !=
            CL_SUCCESS)
        log[0] = '\0';
    if (!log) log = strdup("");
    return log;
}

/* Sets the error for a failed clBuildProgram, quoting the build log; returns `status`. */
static em_status build_failed(const ocl_dev *d, cl_program prog, cl_int err, em_status status,
                              const char *what)
{
    if (err == CL_COMPILER_NOT_AVAILABLE)
        status = EM_ERR_UNSUPPORTED;
    else if (is_oom(err))
        status = EM_ERR_NOMEM;
    char *log = build_log(d, prog);
    size_t len = log ? strlen(log) : 0;
    while (len && (log[len - 1] == '\n' || log[len - 1] == ' ')) log[--len] = '\0';
    em_set_error(status,
                 "%s: %s: clBuildProgram failed with %s (%d), options \"%s\"; build log:\n%.*s%s",
                 d->name, what, cl_err_name(err), err, d->options, OCL_LOG_MAX,
                 len ? log : "(empty)", len > OCL_LOG_MAX ? "\n[build log cut]" : "");
    free(log);
    return status;
}

/* Builds OpenCL C source into a program; on failure the error quotes the build log. */
static em_status build_source(const ocl_dev *d, const char *source, cl_program *out)
{
    cl_int err = CL_SUCCESS;
    cl_program prog = d->cl->clCreateProgramWithSource(d->ctx, 1, &source, NULL, &err);
    if (err != CL_SUCCESS) return cl_fail(d, EM_ERR_DEVICE, "clCreateProgramWithSource", err, NULL);
    err = d->cl->clBuildProgram(prog, 1, &d->device, d->options, NULL, NULL);
    if (err != CL_SUCCESS) {
        em_status st = build_failed(d, prog, err, EM_ERR_COMPILE,
                                    "the OpenCL C compiler rejected the kernel source");
        d->cl->clReleaseProgram(prog);
        return st;
    }
    *out = prog;
    return EM_OK;
}

/* ---- opening a device ------------------------------------------------------------------------ */

/* Keeps letters, digits, '-', '_' and '.'; everything else becomes '_'. */
static void sanitize(char *out, size_t size, const char *in)
{
    size_t j = 0;
    for (size_t i = 0; in[i] && j + 1 < size; i++) {
        char c = in[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_' || c == '.';
        out[j++] = ok ? c : '_';
    }
    out[j] = '\0';
}

/* Fills the numeric capabilities from clGetDeviceInfo. */
static em_status query_limits(ocl_dev *d, em_caps *caps)
{
    cl_uint units = 0, dims = 0, align_bits = 0;
    size_t max_wg = 0, sizes[3] = {1, 1, 1};
    cl_ulong local = 0, global = 0, max_alloc = 0;
    em_status st;
    if ((st = DEV_INFO(d, CL_DEVICE_MAX_COMPUTE_UNITS, &units)) ||
        (st = DEV_INFO(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, &max_wg)) ||
        (st = DEV_INFO(d, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, &dims)) ||
        (st = DEV_INFO(d, CL_DEVICE_LOCAL_MEM_SIZE, &local)) ||
        (st = DEV_INFO(d, CL_DEVICE_GLOBAL_MEM_SIZE, &global)) ||
        (st = DEV_INFO(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, &max_alloc)) ||
        (st = DEV_INFO(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, &align_bits)))
        return st;
    if (dims >= 3) {
        size_t *all = calloc(dims, sizeof(*all));
        if (!all) return em_set_error(EM_ERR_NOMEM, "out of memory");
        st = dev_info(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, "CL_DEVICE_MAX_WORK_ITEM_SIZES",
                      dims * sizeof(*all), all);
        memcpy(sizes, all, sizeof(sizes));
        free(all);
    } else if (dims > 0) {
        st = dev_info(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, "CL_DEVICE_MAX_WORK_ITEM_SIZES",
                      dims * sizeof(size_t), sizes);
    }
    if (st != EM_OK) return st;
    if (max_wg > UINT32_MAX) max_wg = UINT32_MAX;
    caps->compute_units = units;
    caps->max_cube_units = (uint32_t)max_wg;
    for (int i = 0; i < 3; i++)
        caps->max_cube_dim[i] = (uint32_t)EM_MIN(EM_MIN(sizes[i], max_wg), (size_t)UINT32_MAX);
    caps->max_shared = local;
    caps->memory_total = global;
    d->mem_limit = global ? global : UINT64_MAX;
    d->max_alloc = max_alloc ? max_alloc : d->mem_limit;
    d->sub_align = align_bits >= 8 ? align_bits / 8 : 1;
    caps->buffer_align = (uint32_t)EM_MIN(d->sub_align, (size_t)UINT32_MAX);
    return EM_OK;
}

/* Element types: the integer kinds, f32, and f16 / bf16 (which the code generator stores as
 * 16-bit patterns and computes as float, so they need no extension) always; i64 / u64 on embedded
 * profiles only with cles_khr_int64; f64 with cl_khr_fp64. */
static void set_dtypes(em_caps *caps, const char *exts, bool embedded)
{
    static const em_scalar always[] = {EM_BOOL, EM_I8,  EM_I16, EM_I32, EM_U8,
                                       EM_U16,  EM_U32, EM_F32, EM_F16, EM_BF16};
    for (size_t i = 0; i < EM_ARRAY_LEN(always); i++) caps->dtype[always[i]] = true;
    bool int64 = !embedded || has_ext(exts, "cles_khr_int64");
    caps->dtype[EM_I64] = caps->dtype[EM_U64] = int64;
    caps->dtype[EM_F64] = has_ext(exts, "cl_khr_fp64");
}

/* The sub-group size, measured by running a one-cube probe kernel: 0 when the device has no
 * sub-groups or the probe fails (then plane ops are off). */
static uint32_t probe_plane_dim(ocl_dev *d, const char *exts, uint32_t cube_units)
{
    bool khr = has_ext(exts, "cl_khr_subgroups"), intel = has_ext(exts, "cl_intel_subgroups");
    if (!khr && !intel) return 0;
    char source[512];
    snprintf(source, sizeof(source),
             "%s__kernel void em_plane_probe(__global uint *out) {\n"
             "    if (get_local_id(0) == 0) out[0] = (uint)get_max_sub_group_size();\n}\n",
             khr ? "#pragma OPENCL EXTENSION cl_khr_subgroups : enable\n" : "");
    cl_program prog = NULL;
    cl_kernel kern = NULL;
    cl_mem buf = NULL;
    cl_uint value = 0;
    cl_int err = CL_SUCCESS;
    size_t wg = 0, local = 1;
    const char *call = "clCreateKernel";
    if (build_source(d, source, &prog) != EM_OK) goto done;
    kern = d->cl->clCreateKernel(prog, "em_plane_probe", &err);
    if (err == CL_SUCCESS) {
        call = "clCreateBuffer";
        buf = d->cl->clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, sizeof(value), NULL, &err);
    }
    if (err == CL_SUCCESS) {
        call = "clSetKernelArg";
        err = d->cl->clSetKernelArg(kern, 0, sizeof(buf), &buf);
    }
    if (err == CL_SUCCESS) {
        call = "clGetKernelWorkGroupInfo";
        err = d->cl->clGetKernelWorkGroupInfo(kern, d->device, CL_KERNEL_WORK_GROUP_SIZE,
                                              sizeof(wg), &wg, NULL);
        local = EM_MAX(EM_MIN(wg, (size_t)cube_units), (size_t)1);
    }
    if (err == CL_SUCCESS) {
        call = "clEnqueueNDRangeKernel";
        err = d->cl->clEnqueueNDRangeKernel(d->queue, kern, 1, NULL, &local, &local, 0, NULL, NULL);
    }
    if (err == CL_SUCCESS) {
        call = "clEnqueueReadBuffer";
        err = d->cl->clEnqueueReadBuffer(d->queue, buf, CL_TRUE, 0, sizeof(value), &value, 0, NULL,
                                         NULL);
    }
    if (err != CL_SUCCESS) cl_fail(d, EM_ERR_DEVICE, call, err, "in the sub-group probe");
done:
    if (value == 0 || err != CL_SUCCESS || !prog)
        EM_LOGD("%s: sub-groups advertised but unusable; plane ops off (%s)", d->name,
                em_last_error());
    if (buf) d->cl->clReleaseMemObject(buf);
    if (kern) d->cl->clReleaseKernel(kern);
    if (prog) d->cl->clReleaseProgram(prog);
    em_clear_error();
    return err == CL_SUCCESS && prog ? value : 0;
}

/* Whether marker events carry profiling timestamps on this platform (not all do). */
static bool probe_marker_profiling(ocl_dev *d)
{
    cl_event ev = NULL;
    cl_ulong t = 0;
    bool ok = d->cl->clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &ev) == CL_SUCCESS &&
              d->cl->clWaitForEvents(1, &ev) == CL_SUCCESS &&
              d->cl->clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(t), &t, NULL) ==
                  CL_SUCCESS &&
              t != 0;
    if (ev) d->cl->clReleaseEvent(ev);
    return ok;
}

/* The OpenCL C version to compile with, as build options: 2.0 where the device has it (the code
 * generator writes C that is valid as 1.2 and as 2.0); 3.0 on a 3.0 device whose sub-groups need
 * it (3.0 devices may report only "OpenCL C 1.2" here); else 1.2. */
static void choose_options(ocl_dev *d, const char *c_ver, const char *dev_ver, const char *exts)
{
    int c = c_version(c_ver), major = 0, minor = 0;
    if (sscanf(dev_ver, "OpenCL %d.%d", &major, &minor) != 2) major = minor = 0;
    bool subgroups = has_ext(exts, "cl_khr_subgroups") || has_ext(exts, "cl_intel_subgroups");
    const char *std = c >= 200                  ? "CL2.0"
                      : major >= 3 && subgroups ? "CL3.0"
                      : c >= 120                ? "CL1.2"
                                                : NULL;
    if (std)
        snprintf(d->options, sizeof(d->options), "-cl-std=%s", std);
    else
        d->options[0] = '\0';
}

/* Everything open does once the device is chosen: strings, limits, context, queue, probes. */
static em_status open_device(ocl_dev *d, em_caps *caps)
{
    char *dev_name = DEV_STR(d, CL_DEVICE_NAME);
    char *dev_ver = dev_name ? DEV_STR(d, CL_DEVICE_VERSION) : NULL;
    char *drv_ver = dev_ver ? DEV_STR(d, CL_DRIVER_VERSION) : NULL;
    char *c_ver = drv_ver ? DEV_STR(d, CL_DEVICE_OPENCL_C_VERSION) : NULL;
    char *exts = c_ver ? DEV_STR(d, CL_DEVICE_EXTENSIONS) : NULL;
    char *profile = exts ? DEV_STR(d, CL_DEVICE_PROFILE) : NULL;
    char *plat_name = profile ? PLAT_STR(d, CL_PLATFORM_NAME) : NULL;
    char *plat_ver = plat_name ? PLAT_STR(d, CL_PLATFORM_VERSION) : NULL;
    em_status st = plat_ver ? EM_OK : em_last_status();
    if (st == EM_OK) {
        snprintf(d->name, sizeof(d->name), "opencl:%d (%s)", d->index, dev_name);
        memset(caps, 0, sizeof(*caps));
        snprintf(caps->target, sizeof(caps->target), "opencl");
        sanitize(caps->arch, sizeof(caps->arch), dev_name);
        snprintf(caps->device_name, sizeof(caps->device_name), "%s", dev_name);
        set_dtypes(caps, exts, strcmp(profile, "EMBEDDED_PROFILE") == 0);
        caps->float_atomic_add = false;
        caps->matrix = false;
        caps->print = c_version(c_ver) >= 120; /* printf is core in OpenCL C 1.2 */
        choose_options(d, c_ver, dev_ver, exts);
        st = query_limits(d, caps);
    }
    cl_int err = CL_SUCCESS;
    if (st == EM_OK) {
        d->ctx = d->cl->clCreateContext(NULL, 1, &d->device, NULL, NULL, &err);
        if (err != CL_SUCCESS) st = cl_fail(d, EM_ERR_DEVICE, "clCreateContext", err, NULL);
    }
    if (st == EM_OK) {
        d->queue = d->cl->clCreateCommandQueue(d->ctx, d->device, CL_QUEUE_PROFILING_ENABLE, &err);
        if (err != CL_SUCCESS) st = cl_fail(d, EM_ERR_DEVICE, "clCreateCommandQueue", err, NULL);
    }
    if (st == EM_OK) {
        uint32_t plane = probe_plane_dim(d, exts, caps->max_cube_units);
        caps->plane_ops = plane > 0;
        caps->plane_dim = plane ? plane : 1;
        d->marker_profiling = probe_marker_profiling(d);
        snprintf(d->id, sizeof(d->id),
                 "opencl driver-abi %d; platform %s / %s; device %s / %s; driver %s; options %s",
                 OCL_DRIVER_ABI, plat_name, plat_ver, dev_name, dev_ver, drv_ver, d->options);
        EM_LOGD("%s: %s, %s, %u compute units, plane %u%s, timing by %s", d->name, plat_name, c_ver,
                caps->compute_units, caps->plane_dim, caps->plane_ops ? "" : " (no plane ops)",
                d->marker_profiling ? "profiled markers" : "the host clock");
    }
    free(dev_name);
    free(dev_ver);
    free(drv_ver);
    free(c_ver);
    free(exts);
    free(profile);
    free(plat_name);
    free(plat_ver);
    return st;
}

static void ocl_close(void *state)
{
    ocl_dev *d = state;
    if (!d) return;
    if (d->queue) {
        d->cl->clFinish(d->queue);
        d->cl->clReleaseCommandQueue(d->queue);
    }
    if (d->ctx) d->cl->clReleaseContext(d->ctx);
    pthread_mutex_destroy(&d->launch_lock);
    free(d);
}

static em_status ocl_open(int index, em_caps *caps, void **state)
{
    char why[256] = "";
    const em_cl_api *cl = get_api(why, sizeof(why));
    if (!cl) return em_set_error(EM_ERR_UNSUPPORTED, "OpenCL is unavailable: %s", why);
    dev_list list;
    size_t n = enumerate(cl, &list, why, sizeof(why));
    if (n == 0) return em_set_error(EM_ERR_UNSUPPORTED, "OpenCL is unavailable: %s", why);
    if (index < 0 || (size_t)index >= n)
        return em_set_error(EM_ERR_NOT_FOUND, "OpenCL has %zu device%s; there is no device %d", n,
                            n == 1 ? "" : "s", index);
    ocl_dev *d = calloc(1, sizeof(*d));
    if (!d) return em_set_error(EM_ERR_NOMEM, "out of memory opening OpenCL device %d", index);
    d->cl = cl;
    d->index = index;
    d->platform = list.platform[index];
    d->device = list.device[index];
    snprintf(d->name, sizeof(d->name), "opencl:%d", index);
    pthread_mutex_init(&d->launch_lock, NULL);
    em_status st = open_device(d, caps);
    if (st != EM_OK) {
        ocl_close(d);
        return st;
    }
    *state = d;
    return EM_OK;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static em_status ocl_alloc(void *state, size_t bytes, void **mem)
{
    ocl_dev *d = state;
    size_t n = bytes ? bytes : 1; /* OpenCL has no empty buffers */
    if (n > d->max_alloc)
        return em_set_error(EM_ERR_NOMEM,
                            "%s: cannot allocate %zu bytes: the device's largest buffer is %llu "
                            "bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE)",
                            d->name, n, (unsigned long long)d->max_alloc);
    /* many platforms allocate lazily, so keep the total within the device's memory ourselves */
    uint64_t before = atomic_fetch_add(&d->mem_used, n);
    if (before + n > d->mem_limit) {
        atomic_fetch_sub(&d->mem_used, n);
        return em_set_error(EM_ERR_NOMEM,
                            "%s: out of device memory allocating %zu bytes (%llu of %llu bytes "
                            "in use)",
                            d->name, n, (unsigned long long)before,
                            (unsigned long long)d->mem_limit);
    }
    cl_int err = CL_SUCCESS;
    cl_mem buf = d->cl->clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, n, NULL, &err);
    if (err != CL_SUCCESS) {
        atomic_fetch_sub(&d->mem_used, n);
        char what[64];
        snprintf(what, sizeof(what), "allocating %zu bytes", n);
        return cl_fail(d, err == CL_INVALID_BUFFER_SIZE ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                       "clCreateBuffer", err, what);
    }
    *mem = buf;
    return EM_OK;
}

static void ocl_free(void *state, void *mem, size_t bytes)
{
    ocl_dev *d = state;
    if (!mem) return;
    cl_int err = d->cl->clReleaseMemObject((cl_mem)mem);
    if (err != CL_SUCCESS)
        EM_LOGW("%s: clReleaseMemObject failed with %s (%d)", d->name, cl_err_name(err), err);
    atomic_fetch_sub(&d->mem_used, bytes ? bytes : 1);
}

static em_status ocl_write(void *state, void *mem, size_t offset, const void *src, size_t bytes)
{
    ocl_dev *d = state;
    if (!bytes) return EM_OK;
    cl_int err = d->cl->clEnqueueWriteBuffer(d->queue, (cl_mem)mem, CL_TRUE, offset, bytes, src, 0,
                                             NULL, NULL);
    if (err != CL_SUCCESS) {
        char what[80];
        snprintf(what, sizeof(what), "writing %zu bytes at offset %zu", bytes, offset);
        return cl_fail(d, EM_ERR_DEVICE, "clEnqueueWriteBuffer", err, what);
    }
    return EM_OK;
}

static em_status ocl_read(void *state, const void *mem, size_t offset, void *dst, size_t bytes)
{
    ocl_dev *d = state;
    if (!bytes) return EM_OK;
    cl_int err = d->cl->clEnqueueReadBuffer(d->queue, (cl_mem)mem, CL_TRUE, offset, bytes, dst, 0,
                                            NULL, NULL);
    if (err != CL_SUCCESS) {
        char what[80];
        snprintf(what, sizeof(what), "reading %zu bytes at offset %zu", bytes, offset);
        return cl_fail(d, EM_ERR_DEVICE, "clEnqueueReadBuffer", err, what);
    }
    return EM_OK;
}

static em_status enqueue_copy(ocl_dev *d, cl_mem dst, size_t dst_offset, cl_mem src,
                              size_t src_offset, size_t bytes)
{
    cl_int err = d->cl->clEnqueueCopyBuffer(d->queue, src, dst, src_offset, dst_offset, bytes, 0,
                                            NULL, NULL);
    if (err != CL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof(what), "copying %zu bytes from offset %zu to offset %zu", bytes,
                 src_offset, dst_offset);
        return cl_fail(d, EM_ERR_DEVICE, "clEnqueueCopyBuffer", err, what);
    }
    return EM_OK;
}

static em_status ocl_copy(void *state, void *dst, size_t dst_offset, const void *src,
                          size_t src_offset, size_t bytes)
{
    ocl_dev *d = state;
    if (!bytes) return EM_OK;
    bool overlap = dst == src && dst_offset < src_offset + bytes && src_offset < dst_offset + bytes;
    if (!overlap) return enqueue_copy(d, (cl_mem)dst, dst_offset, (cl_mem)src, src_offset, bytes);
    if (dst_offset == src_offset) return EM_OK;
    /* OpenCL refuses overlapping copies (CL_MEM_COPY_OVERLAP): go through a scratch buffer */
    void *tmp = NULL;
    em_status st = ocl_alloc(d, bytes, &tmp);
    if (st != EM_OK) return em_error_context("%s: overlapping copy of %zu bytes", d->name, bytes);
    st = enqueue_copy(d, (cl_mem)tmp, 0, (cl_mem)src, src_offset, bytes);
    if (st == EM_OK) st = enqueue_copy(d, (cl_mem)dst, dst_offset, (cl_mem)tmp, 0, bytes);
    ocl_free(d, tmp, bytes); /* the queue keeps it alive until the copies are done */
    return st;
}

/* ---- compiling ------------------------------------------------------------------------------- */

static char *ocl_generate(void *state, const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    (void)state;
    return em_codegen_opencl(ks, n, caps);
}

static em_status ocl_compiler_id(void *state, char *out, size_t out_size)
{
    ocl_dev *d = state;
    int n = snprintf(out, out_size, "%s", d->id);
    if (n < 0 || (size_t)n >= out_size)
        return em_set_error(EM_ERR_INTERNAL, "%s: compiler id longer than %zu bytes", d->name,
                            out_size);
    return EM_OK;
}

/* Binary files hold: this header, the compiler id (id_len bytes), the program binary (payload
 * bytes). The hash covers the id and the binary; load checks all of it and that the id is the
 * device's own, so a file made by another device or driver version is never loaded. */
typedef struct bin_header {
    char magic[8];    /* OCL_BINARY_MAGIC */
    uint32_t id_len;  /* bytes of compiler id after the header */
    uint32_t abi;     /* OCL_DRIVER_ABI */
    uint64_t payload; /* bytes of program binary after the id */
    char hash[32];    /* em_hasher hex digest of id and program binary */
} bin_header;

static void bin_hash(const char *id, size_t id_len, const void *payload, size_t size, char out[33])
{
    em_hasher h;
    em_hasher_init(&h);
    em_hasher_u64(&h, id_len);
    em_hasher_bytes(&h, id, id_len);
    em_hasher_u64(&h, size);
    em_hasher_bytes(&h, payload, size);
    em_hasher_hex(&h, out);
}

/* Writes the header, id and program binary to path. */
static em_status write_binary(const ocl_dev *d, const char *path, const unsigned char *bin,
                              size_t size)
{
    bin_header h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, OCL_BINARY_MAGIC, sizeof(h.magic));
    h.id_len = (uint32_t)strlen(d->id);
    h.abi = OCL_DRIVER_ABI;
    h.payload = size;
    char hex[33];
    bin_hash(d->id, h.id_len, bin, size, hex);
    memcpy(h.hash, hex, sizeof(h.hash));
    FILE *f = fopen(path, "wb");
    if (!f) return em_set_error(EM_ERR_IO, "%s: cannot create %s", d->name, path);
    bool ok = fwrite(&h, sizeof(h), 1, f) == 1 && fwrite(d->id, 1, h.id_len, f) == h.id_len &&
              fwrite(bin, 1, size, f) == size;
    ok = fclose(f) == 0 && ok;
    if (!ok) return em_set_error(EM_ERR_IO, "%s: cannot write %s", d->name, path);
    return EM_OK;
}

static em_status ocl_build(void *state, const char *source, const char *out_path)
{
    ocl_dev *d = state;
    cl_program prog = NULL;
    em_status st = build_source(d, source, &prog);
    if (st != EM_OK) return st;
    cl_uint ndev = 0;
    size_t size = 0;
    unsigned char *bin = NULL;
    cl_int err = d->cl->clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof(ndev), &ndev, NULL);
    if (err == CL_SUCCESS && ndev != 1)
        err = CL_INVALID_PROGRAM; /* cannot happen: the context holds one device */
    if (err == CL_SUCCESS)
        err = d->cl->clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, NULL);
    if (err != CL_SUCCESS) {
        st = cl_fail(d, EM_ERR_DEVICE, "clGetProgramInfo", err, "reading the binary size");
    } else if (size == 0) {
        st = em_set_error(EM_ERR_UNSUPPORTED,
                          "%s: the platform returns no program binary (CL_PROGRAM_BINARY_SIZES "
                          "is 0)",
                          d->name);
    } else if (!(bin = malloc(size))) {
        st = em_set_error(EM_ERR_NOMEM, "out of memory reading a %zu-byte program binary", size);
    } else {
        unsigned char *bins[1] = {bin};
        err = d->cl->clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof(bins), bins, NULL);
        st = err == CL_SUCCESS ? write_binary(d, out_path, bin, size)
                               : cl_fail(d, EM_ERR_DEVICE, "clGetProgramInfo", err,
                                         "reading CL_PROGRAM_BINARIES");
    }
    free(bin);
    d->cl->clReleaseProgram(prog);
    return st;
}

/* ---- loading --------------------------------------------------------------------------------- */

/* Checks a binary file's header, id and hash; on success *bin / *size locate the program binary
 * inside data. EM_ERR_CORRUPT (error set) otherwise. */
static em_status check_binary(const ocl_dev *d, const char *path, const char *data, size_t len,
                              const unsigned char **bin, size_t *size)
{
    bin_header h;
    if (len < sizeof(h))
        return em_set_error(EM_ERR_CORRUPT, "%s: %s is truncated (%zu bytes, no header)", d->name,
                            path, len);
    memcpy(&h, data, sizeof(h));
    if (memcmp(h.magic, OCL_BINARY_MAGIC, sizeof(h.magic)) != 0)
        return em_set_error(EM_ERR_CORRUPT, "%s: %s is not an ember OpenCL binary", d->name, path);
    if (h.abi != OCL_DRIVER_ABI)
        return em_set_error(EM_ERR_CORRUPT, "%s: %s was made for driver ABI %u, not %d", d->name,
                            path, h.abi, OCL_DRIVER_ABI);
    if (h.payload == 0 || h.id_len > len - sizeof(h) || h.payload != len - sizeof(h) - h.id_len)
        return em_set_error(EM_ERR_CORRUPT,
                            "%s: %s is truncated or has trailing bytes (%zu bytes; the header "
                            "promises %zu)",
                            d->name, path, len, sizeof(h) + (size_t)h.id_len + (size_t)h.payload);
    const char *id = data + sizeof(h);
    const unsigned char *payload = (const unsigned char *)id + h.id_len;
    char hex[33];
    bin_hash(id, h.id_len, payload, (size_t)h.payload, hex);
    if (memcmp(hex, h.hash, sizeof(h.hash)) != 0)
        return em_set_error(EM_ERR_CORRUPT, "%s: %s is corrupt (content hash mismatch)", d->name,
                            path);
    if (h.id_len != strlen(d->id) || memcmp(id, d->id, h.id_len) != 0)
        return em_set_error(EM_ERR_CORRUPT,
                            "%s: %s was built by another compiler or device (\"%.*s\")", d->name,
                            path, (int)EM_MIN(h.id_len, 300u), id);
    *bin = payload;
    *size = (size_t)h.payload;
    return EM_OK;
}

static em_status ocl_load(void *state, const char *path, void **module)
{
    ocl_dev *d = state;
    size_t len = 0;
    char *data = em_file_read(path, &len);
    if (!data) return em_error_context("%s: loading a kernel binary", d->name);
    const unsigned char *bin = NULL;
    size_t size = 0;
    em_status st = check_binary(d, path, data, len, &bin, &size);
    ocl_module *m = NULL;
    cl_program prog = NULL;
    if (st == EM_OK && !(m = calloc(1, sizeof(*m))))
        st = em_set_error(EM_ERR_NOMEM, "out of memory loading %s", path);
    if (st == EM_OK) {
        cl_int err = CL_SUCCESS, bin_status = CL_SUCCESS;
        prog =
            d->cl->clCreateProgramWithBinary(d->ctx, 1, &d->device, &size, &bin, &bin_status, &err);
        if (err == CL_SUCCESS && bin_status != CL_SUCCESS) err = bin_status;
        if (err != CL_SUCCESS) {
            st = cl_fail(d, err == CL_INVALID_BINARY ? EM_ERR_CORRUPT : EM_ERR_DEVICE,
                         "clCreateProgramWithBinary", err, path);
            if (prog) d->cl->clReleaseProgram(prog);
            prog = NULL;
        }
    }
    if (st == EM_OK) {
        cl_int err = d->cl->clBuildProgram(prog, 1, &d->device, d->options, NULL, NULL);
        if (err != CL_SUCCESS) {
            char what[160];
            snprintf(what, sizeof(what), "program binary %s is unusable", path);
            st = build_failed(d, prog, err, EM_ERR_CORRUPT, what);
            d->cl->clReleaseProgram(prog);
            prog = NULL;
        }
    }
    free(data);
    if (st != EM_OK) {
        free(m);
        return st;
    }
    m->program = prog;
    *module = m;
    return EM_OK;
}

/* Frees a function's kernel and metadata buffer. */
static void free_fn(const ocl_dev *d, ocl_fn *fn)
{
    if (fn->meta) d->cl->clReleaseMemObject(fn->meta);
    if (fn->kernel) d->cl->clReleaseKernel(fn->kernel);
    free(fn->meta_host);
    free(fn);
}

static void ocl_unload(void *state, void *module)
{
    ocl_dev *d = state;
    ocl_module *m = module;
    if (!m) return;
    for (ocl_fn *fn = m->fns, *next; fn; fn = next) {
        next = fn->next;
        free_fn(d, fn);
    }
    cl_int err = d->cl->clReleaseProgram(m->program);
    if (err != CL_SUCCESS)
        EM_LOGW("%s: clReleaseProgram failed with %s (%d)", d->name, cl_err_name(err), err);
    free(m);
}

static em_status ocl_function(void *state, void *module, const char *kernel_name, void **out)
{
    ocl_dev *d = state;
    ocl_module *m = module;
    size_t n = strlen(kernel_name);
    ocl_fn *fn = calloc(1, sizeof(*fn) + n + 1);
    if (!fn) return em_set_error(EM_ERR_NOMEM, "out of memory");
    memcpy(fn->name, kernel_name, n + 1);
    cl_int err = CL_SUCCESS;
    fn->kernel = d->cl->clCreateKernel(m->program, kernel_name, &err);
    if (err == CL_SUCCESS)
        err = d->cl->clGetKernelWorkGroupInfo(fn->kernel, d->device, CL_KERNEL_WORK_GROUP_SIZE,
                                              sizeof(fn->max_units), &fn->max_units, NULL);
    if (err != CL_SUCCESS) {
        char what[300];
        snprintf(what, sizeof(what), "for kernel %s", kernel_name);
        em_status st =
            cl_fail(d, err == CL_INVALID_KERNEL_NAME ? EM_ERR_NOT_FOUND : EM_ERR_DEVICE,
                    fn->kernel ? "clGetKernelWorkGroupInfo" : "clCreateKernel", err, what);
        free_fn(d, fn);
        return st;
    }
    pthread_mutex_lock(&d->launch_lock); /* modules are shared by kernels of a batch */
    fn->next = m->fns;
    m->fns = fn;
    pthread_mutex_unlock(&d->launch_lock);
    *out = fn;
    return EM_OK;
}

/* ---- launching ------------------------------------------------------------------------------- */

/* Launch ABI (kernel/codegen/opencl.c states it; this follows it): kernel argument i is IR
 * parameter i — a buffer as a cl_mem whose first byte is element 0 (a non-zero offset becomes a
 * sub-buffer), a scalar by value in its OpenCL type — and one more argument, last: a read-only
 * buffer of ulong metadata holding for each buffer parameter len, shape[0..rank), stride[0..rank).
 * The metadata buffer of a kernel's last launch is kept and reused while the next launch's
 * metadata is the same (the common case of a loop), so steady launches allocate nothing. */

/* Writes a scalar argument as its OpenCL type (bool as uchar, f16 and bf16 as float) into out;
 * returns its size. */
static size_t scalar_arg(em_type t, em_ir_const v, unsigned char out[8])
{
    switch ((em_scalar)t.scalar) {
    case EM_BOOL: {
        uint8_t x = v.i != 0;
        memcpy(out, &x, 1);
        return 1;
    }
    case EM_I8:
    case EM_U8: {
        uint8_t x = (uint8_t)v.u;
        memcpy(out, &x, 1);
        return 1;
    }
    case EM_I16:
    case EM_U16: {
        uint16_t x = (uint16_t)v.u;
        memcpy(out, &x, 2);
        return 2;
    }
    case EM_I32:
    case EM_U32: {
        uint32_t x = (uint32_t)v.u;
        memcpy(out, &x, 4);
        return 4;
    }
    case EM_I64:
    case EM_U64:
        memcpy(out, &v.u, 8);
        return 8;
    case EM_F16:
    case EM_BF16:
    case EM_F32: {
        float x = (float)v.f;
        memcpy(out, &x, 4);
        return 4;
    }
    case EM_F64:
        memcpy(out, &v.f, 8);
        return 8;
    default:
        return 0;
    }
}

/* Metadata words of a launch (at least one). */
static size_t meta_words(const em_drv_launch *l)
{
    size_t n = 0;
    for (size_t i = 0; i < l->nargs; i++)
        if (l->args[i].kind == EM_PARAM_BUFFER) n += 1 + 2 * (size_t)l->args[i].rank;
    return n ? n : 1;
}

static void meta_fill(uint64_t *w, const em_drv_launch *l)
{
    size_t at = 0;
    w[0] = 0;
    for (size_t i = 0; i < l->nargs; i++) {
        const em_drv_arg *a = &l->args[i];
        if (a->kind != EM_PARAM_BUFFER) continue;
        w[at++] = a->len;
        for (uint32_t r = 0; r < a->rank; r++) w[at++] = (uint64_t)a->shape[r];
        for (uint32_t r = 0; r < a->rank; r++) w[at++] = (uint64_t)a->stride[r];
    }
}

/* Makes fn->meta hold `words` (reusing it when it already does). Called with launch_lock held. */
static em_status set_meta(ocl_dev *d, ocl_fn *fn, const uint64_t *words, size_t n)
{
    size_t bytes = n * sizeof(*words);
    if (fn->meta && fn->meta_size == bytes && memcmp(fn->meta_host, words, bytes) == 0)
        return EM_OK;
    void *copy = malloc(bytes);
    if (!copy) return em_set_error(EM_ERR_NOMEM, "out of memory");
    memcpy(copy, words, bytes);
    cl_int err = CL_SUCCESS;
    cl_mem meta =
        d->cl->clCreateBuffer(d->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, copy, &err);
    if (err != CL_SUCCESS) {
        free(copy);
        return cl_fail(d, EM_ERR_DEVICE, "clCreateBuffer", err, "for launch metadata");
    }
    if (fn->meta) /* launches still queued keep it alive until they ran */
        d->cl->clReleaseMemObject(fn->meta);
    free(fn->meta_host);
    fn->meta = meta;
    fn->meta_host = copy;
    fn->meta_size = bytes;
    return EM_OK;
}

/* The cl_mem to pass for buffer argument a: the block itself, or a sub-buffer starting at the
 * offset (*sub set, to be released after the launch). */
static em_status buffer_arg(ocl_dev *d, const ocl_fn *fn, size_t i, const em_drv_arg *a,
                            cl_mem *out, cl_mem *sub)
{
    *sub = NULL;
    *out = (cl_mem)a->mem;
    size_t elem = em_scalar_size((em_scalar)a->type.scalar) * (a->type.lanes ? a->type.lanes : 1);
    if (a->offset == 0 || a->len == 0) /* an empty view is never touched */
        return EM_OK;
    if (a->offset % d->sub_align != 0)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "%s: kernel %s, argument %zu: a byte offset of "
                            "%zu is not a multiple of %zu, the alignment OpenCL sub-buffers need "
                            "(CL_DEVICE_MEM_BASE_ADDR_ALIGN); offset buffers are passed as "
                            "sub-buffers",
                            d->name, fn->name, i, a->offset, d->sub_align);
    cl_buffer_region region = {a->offset, (size_t)a->len * elem};
    cl_int err = CL_SUCCESS;
    *sub = d->cl->clCreateSubBuffer((cl_mem)a->mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION,
                                    &region, &err);
    if (err != CL_SUCCESS) {
        char what[160];
        snprintf(what, sizeof(what), "for kernel %s, argument %zu (offset %zu, %zu bytes)",
                 fn->name, i, a->offset, region.size);
        *sub = NULL;
        return cl_fail(d, EM_ERR_DEVICE, "clCreateSubBuffer", err, what);
    }
    *out = *sub;
    return EM_OK;
}

/* Sets every kernel argument and enqueues the kernel. Called with launch_lock held; sub-buffers
 * made for offsets are stored in subs (nargs entries) for the caller to release. */
static em_status enqueue_locked(ocl_dev *d, ocl_fn *fn, const em_drv_launch *l,
                                const uint64_t *meta, size_t nmeta, cl_mem *subs)
{
    em_status st = set_meta(d, fn, meta, nmeta);
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; i < l->nargs && st == EM_OK; i++) {
        const em_drv_arg *a = &l->args[i];
        if (a->kind == EM_PARAM_BUFFER) {
            cl_mem m = NULL;
            if ((st = buffer_arg(d, fn, i, a, &m, &subs[i])) == EM_OK)
                err = d->cl->clSetKernelArg(fn->kernel, (cl_uint)i, sizeof(m), &m);
        } else {
            unsigned char value[8];
            size_t size = scalar_arg(a->type, a->value, value);
            err = d->cl->clSetKernelArg(fn->kernel, (cl_uint)i, size, value);
        }
        if (st == EM_OK && err != CL_SUCCESS) {
            char what[300];
            snprintf(what, sizeof(what), "for kernel %s, argument %zu", fn->name, i);
            st = cl_fail(d, EM_ERR_DEVICE, "clSetKernelArg", err, what);
        }
    }
    if (st == EM_OK) {
        err = d->cl->clSetKernelArg(fn->kernel, (cl_uint)l->nargs, sizeof(fn->meta), &fn->meta);
        if (err != CL_SUCCESS) {
            char what[300];
            snprintf(what, sizeof(what), "for kernel %s, the metadata argument (%zu)", fn->name,
                     l->nargs);
            st = cl_fail(d, EM_ERR_DEVICE, "clSetKernelArg", err, what);
        }
    }
    if (st != EM_OK) return st;
    size_t global[3], local[3];
    for (int i = 0; i < 3; i++) {
        local[i] = l->cube_dim[i];
        global[i] = (size_t)l->cube_count[i] * l->cube_dim[i];
    }
    err =
        d->cl->clEnqueueNDRangeKernel(d->queue, fn->kernel, 3, NULL, global, local, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        char what[400];
        snprintf(what, sizeof(what),
                 "launching kernel %s on %u x %u x %u cubes of %u x %u x %u units", fn->name,
                 l->cube_count[0], l->cube_count[1], l->cube_count[2], l->cube_dim[0],
                 l->cube_dim[1], l->cube_dim[2]);
        return cl_fail(d, EM_ERR_DEVICE, "clEnqueueNDRangeKernel", err, what);
    }
    return EM_OK;
}

static em_status ocl_launch(void *state, void *fn_ptr, const em_drv_launch *l)
{
    ocl_dev *d = state;
    ocl_fn *fn = fn_ptr;
    uint64_t units = (uint64_t)l->cube_dim[0] * l->cube_dim[1] * l->cube_dim[2];
    if (units > fn->max_units)
        return em_set_error(EM_ERR_INVALID,
                            "%s: kernel %s runs at most %zu units per cube on this "
                            "device (CL_KERNEL_WORK_GROUP_SIZE); the launch asks for %u x %u x %u",
                            d->name, fn->name, fn->max_units, l->cube_dim[0], l->cube_dim[1],
                            l->cube_dim[2]);
    uint64_t stack_meta[64];
    cl_mem stack_subs[16];
    size_t nmeta = meta_words(l);
    uint64_t *meta = nmeta <= EM_ARRAY_LEN(stack_meta) ? stack_meta : malloc(nmeta * 8);
    cl_mem *subs =
        l->nargs <= EM_ARRAY_LEN(stack_subs) ? stack_subs : calloc(l->nargs, sizeof(*subs));
    em_status st = EM_OK;
    if (!meta || !subs) {
        st = em_set_error(EM_ERR_NOMEM, "out of memory launching %s", fn->name);
    } else {
        memset(subs, 0, l->nargs * sizeof(*subs));
        meta_fill(meta, l);
        pthread_mutex_lock(&d->launch_lock);
        st = enqueue_locked(d, fn, l, meta, nmeta, subs);
        pthread_mutex_unlock(&d->launch_lock);
        for (size_t i = 0; i < l->nargs; i++) /* the queued launch keeps them alive */
            if (subs[i]) d->cl->clReleaseMemObject(subs[i]);
    }
    if (meta != stack_meta) free(meta);
    if (subs != stack_subs) free(subs);
    return st;
}

static em_status ocl_sync(void *state)
{
    ocl_dev *d = state;
    cl_int err = d->cl->clFinish(d->queue);
    if (err != CL_SUCCESS) return cl_fail(d, EM_ERR_DEVICE, "clFinish", err, NULL);
    return EM_OK;
}

/* ---- timing ---------------------------------------------------------------------------------- */

static em_status ocl_event_record(void *state, void **out)
{
    ocl_dev *d = state;
    ocl_event *ev = calloc(1, sizeof(*ev));
    if (!ev) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_status st = EM_OK;
    if (d->marker_profiling) {
        cl_int err = d->cl->clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &ev->event);
        if (err != CL_SUCCESS)
            st = cl_fail(d, EM_ERR_DEVICE, "clEnqueueMarkerWithWaitList", err, NULL);
    } else {
        st = ocl_sync(d);
        ev->host = em_rt_now();
    }
    if (st != EM_OK) {
        free(ev);
        return st;
    }
    *out = ev;
    return EM_OK;
}

/* The device time (seconds) at which a marker completed. */
static em_status marker_time(ocl_dev *d, ocl_event *ev, double *seconds)
{
    cl_ulong ns = 0;
    cl_int err = d->cl->clWaitForEvents(1, &ev->event);
    if (err != CL_SUCCESS) return cl_fail(d, EM_ERR_DEVICE, "clWaitForEvents", err, NULL);
    err =
        d->cl->clGetEventProfilingInfo(ev->event, CL_PROFILING_COMMAND_END, sizeof(ns), &ns, NULL);
    if (err != CL_SUCCESS)
        return cl_fail(d, EM_ERR_DEVICE, "clGetEventProfilingInfo", err,
                       "reading CL_PROFILING_COMMAND_END");
    *seconds = (double)ns * 1e-9;
    return EM_OK;
}

static em_status ocl_event_elapsed(void *state, void *start, void *stop, double *seconds)
{
    ocl_dev *d = state;
    ocl_event *a = start, *b = stop;
    if (!a->event || !b->event) {
        *seconds = b->host - a->host;
        return EM_OK;
    }
    double ta = 0, tb = 0;
    em_status st = marker_time(d, a, &ta);
    if (st == EM_OK) st = marker_time(d, b, &tb);
    if (st == EM_OK) *seconds = tb > ta ? tb - ta : 0.0;
    return st;
}

static void ocl_event_destroy(void *state, void *event)
{
    ocl_dev *d = state;
    ocl_event *ev = event;
    if (!ev) return;
    if (ev->event) d->cl->clReleaseEvent(ev->event);
    free(ev);
}

const em_driver em_rt_opencl_driver = {
    .name = "opencl",
    .target = "opencl",
    .binary_ext = ".clbin",
    .probe = ocl_probe,
    .open = ocl_open,
    .close = ocl_close,
    .alloc = ocl_alloc,
    .free = ocl_free,
    .write = ocl_write,
    .read = ocl_read,
    .copy = ocl_copy,
    .generate = ocl_generate,
    .compiler_id = ocl_compiler_id,
    .build = ocl_build,
    .load = ocl_load,
    .unload = ocl_unload,
    .function = ocl_function,
    .launch = ocl_launch,
    .sync = ocl_sync,
    .event_record = ocl_event_record,
    .event_elapsed = ocl_event_elapsed,
    .event_destroy = ocl_event_destroy,
};
