/* driver.h — the vtable every device backend fills (drivers/cpu.c; later cuda.c, opencl.c,
 * vulkan.c). The runtime (registry, pool, cache, launch) sits on top and never talks to a device
 * any other way. A driver works with opaque handles of its own: a device state, memory blocks,
 * loaded modules, functions and events. Everything above the driver — reference counts, pooling,
 * bounds and argument checks, the kernel cache, statistics — is done once, by the runtime, so a
 * driver only translates calls. Every function that can fail returns an em_status and sets the
 * error (em_set_error) with a message naming the device and what went wrong; none aborts. */
#ifndef EM_RUNTIME_DRIVER_H
#define EM_RUNTIME_DRIVER_H
#include <stddef.h>
#include <stdint.h>
#include "ember/kernel.h"
#include "ember/runtime.h"

/* One resolved launch argument, in the kernel's parameter order. The runtime has checked it
 * against the parameter (kind, rank, bounds, device) and converted scalars to the parameter's
 * class (integer or float). */
typedef struct em_drv_arg {
    uint8_t kind;          /* EM_PARAM_BUFFER or EM_PARAM_SCALAR */
    em_type type;          /* the parameter's type (buffers: element type) */
    void *mem;             /* buffers: the driver's memory block */
    size_t offset;         /* buffers: byte offset of element 0 inside mem */
    uint64_t len;          /* buffers: elements visible to the kernel */
    uint32_t rank;         /* buffers: entries in shape / stride */
    const int64_t *shape;  /* buffers: sizes per dim in scalars (NULL when rank is 0) */
    const int64_t *stride; /* buffers: strides per dim in scalars (NULL when rank is 0) */
    em_ir_const value;     /* scalars: i / u for integers and bool, f (double) for floats */
} em_drv_arg;

/* A resolved launch: the grid and the arguments. */
typedef struct em_drv_launch {
    uint32_t cube_count[3];  /* cubes per axis (each >= 1) */
    uint32_t cube_dim[3];    /* units per cube per axis (each >= 1, within the caps) */
    const em_drv_arg *args;  /* one per kernel parameter */
    size_t nargs;            /* number of args */
} em_drv_launch;

typedef struct em_driver {
    const char *name;       /* backend name: "cpu", "cuda", ... (device names are NAME or NAME:i) */
    const char *target;     /* code generator target passed to em_codegen: "c", "cuda", ... */
    const char *binary_ext; /* file extension of built binaries in the cache: ".so", ".cubin" */

    /* Returns how many devices this machine has (0 when none; then `why` says why, e.g. "libcuda
     * .so.1 not found"). Cheap and side-effect free; may be called many times. */
    int (*probe)(char *why, size_t why_size);
    /* Opens device `index` (0-based): fills caps and returns the driver's device state. */
    em_status (*open)(int index, em_caps *caps, void **dev);
    /* Releases the device state (the runtime has freed every block and unloaded every module). */
    void (*close)(void *dev);

    /* Memory. alloc returns EM_ERR_NOMEM (error set) when the device is out of memory, so that the
     * pool can empty its cache and retry. Offsets are in bytes and already bounds-checked. */
    em_status (*alloc)(void *dev, size_t bytes, void **mem);
    void (*free)(void *dev, void *mem, size_t bytes); /* bytes: as given to alloc */
    em_status (*write)(void *dev, void *mem, size_t offset, const void *src, size_t bytes);
    em_status (*read)(void *dev, const void *mem, size_t offset, void *dst, size_t bytes);
    em_status (*copy)(void *dev, void *dst, size_t dst_offset, const void *src, size_t src_offset,
                      size_t bytes);

    /* Compilation. generate returns the source for a batch of verified, simplified kernels
     * (malloc'd; usually em_codegen(target, ks, n, caps)). compiler_id writes a string that
     * identifies everything besides the source that affects the binary (compiler version, flags,
     * ABI version): it goes into cache keys. build compiles `source` into a binary file at
     * out_path (a temporary path in the cache; the runtime renames it into place). On a compiler
     * failure the error names the compiler and shows its output. */
    char *(*generate)(void *dev, const em_ir_kernel *const *ks, size_t n, const em_caps *caps);
    em_status (*compiler_id)(void *dev, char *out, size_t out_size);
    em_status (*build)(void *dev, const char *source, const char *out_path);

    /* Loading: a binary file becomes a module; a kernel name becomes a function handle. load
     * must detect a corrupt file and fail with EM_ERR_CORRUPT (never crash); the cache then
     * deletes the entry and rebuilds. */
    em_status (*load)(void *dev, const char *path, void **module);
    void (*unload)(void *dev, void *module);
    em_status (*function)(void *dev, void *module, const char *kernel_name, void **fn);

    /* Execution. launch may return before the work finishes; sync waits for all of it. */
    em_status (*launch)(void *dev, void *fn, const em_drv_launch *launch);
    em_status (*sync)(void *dev);

    /* Timing events (NULL on drivers that time with the host clock, like the CPU): record queues
     * an event, elapsed waits for both and returns the seconds between them. */
    em_status (*event_record)(void *dev, void **event);
    em_status (*event_elapsed)(void *dev, void *start, void *stop, double *seconds);
    void (*event_destroy)(void *dev, void *event);

    /* Native graphs (NULL where the driver has none; then the runtime replays recorded graphs
     * call by call). Between graph_begin and graph_end the runtime issues a recorded sequence of
     * launch, write and copy calls; the driver captures them instead of running them (sources of
     * writes and launch metadata copied into memory the graph owns) and graph_end returns an
     * executable graph, or fails with nothing left captured. graph_launch queues one run of it. */
    em_status (*graph_begin)(void *dev);
    em_status (*graph_end)(void *dev, void **graph);
    em_status (*graph_launch)(void *dev, void *graph);
    void (*graph_free)(void *dev, void *graph);

    /* Tensor maps (NULL where the device has none): encodes d (checked by the runtime: rank,
     * strides, box, swizzle, bounds) over mem from byte `offset` into out (em_tensor_map_encode). */
    em_status (*tensor_map)(void *dev, void *mem, size_t offset, const em_tensor_map_desc *d,
                            uint64_t *out);
} em_driver;

/* The drivers (drivers/NAME.c). registry.c lists the backends and which of these it uses. */
extern const em_driver em_rt_cpu_driver;
extern const em_driver em_rt_cuda_driver;
extern const em_driver em_rt_opencl_driver;
extern const em_driver em_rt_vulkan_driver;
extern const em_driver em_rt_cuda_driver;
extern const em_driver em_rt_opencl_driver;

#endif
