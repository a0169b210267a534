/* ember/runtime.h — devices, buffers, compiled kernels and launches.
 *
 * A device is opened by name ("cpu", "cuda:0", "opencl:0", "vulkan:0"). GPU drivers are loaded at
 * run time; em_backend_list tells which backends this machine has and, for each missing one, why.
 * Buffers come from the device's memory pool. Kernels are IR kernels (ember/kernel.h) compiled for
 * the device through the kernel cache: in memory, then on disk under $EMBER_CACHE_DIR, keyed by
 * the kernel's structural hash, the target, the device architecture and the compiler version. */
#ifndef EMBER_RUNTIME_H
#define EMBER_RUNTIME_H

#include <stdio.h>
#include "ember/base.h"
#include "ember/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_device em_device;
typedef struct em_buffer em_buffer;
typedef struct em_kernel em_kernel;

/* ---- backends and devices ------------------------------------------------------------------- */

typedef struct em_backend_info {
    const char *name;   /* "cpu", "cuda", "opencl", "vulkan" */
    int device_count;   /* devices found (0 when unavailable) */
    char why[256];      /* when device_count == 0: why (library missing, no device, ...) */
} em_backend_info;

/* Fills up to `max` entries (one per known backend) and returns how many there are. */
size_t em_backend_list(em_backend_info *out, size_t max);


/* Opens a device by name; the same name returns the same device (reference counted). NULL with
 * the error set when the name is unknown or the backend is unavailable (the message says why). */
em_device *em_device_open(const char *name);
/* Drops one reference; the last one frees the device and everything it owns. */
void em_device_close(em_device *dev);
/* The canonical name ("cpu", "cuda:0"). */
const char *em_device_name(const em_device *dev);
const em_caps *em_device_caps(const em_device *dev);
/* Waits for all work queued on the device. */
em_status em_device_sync(em_device *dev);

/* ---- memory ---------------------------------------------------------------------------------- */

/* A buffer of `bytes` bytes (contents undefined) from the device's pool. On out-of-memory the pool
 * releases its cached blocks and retries before failing with EM_ERR_NOMEM. */
em_buffer *em_buffer_alloc(em_device *dev, size_t bytes);
/* Returns the buffer to its device's pool. NULL is ignored. */
void em_buffer_free(em_buffer *buf);
size_t em_buffer_size(const em_buffer *buf);
/* True when no launch that may still be running writes buf: every kernel launch given buf as a
 * writable argument was issued before the device's last completed em_device_sync or
 * em_buffer_read (each waits for the launches before it); a graph's replay unsettles what its
 * recorded launches write, and a block the pool hands out again keeps its last writer. A kernel
 * may then read buf before its dependency_wait() (docs/kernel-language.md), while the launches
 * before it run out. */
bool em_buffer_settled(const em_buffer *buf);
em_device *em_buffer_device(const em_buffer *buf);
em_status em_buffer_write(em_buffer *buf, size_t offset, const void *src, size_t bytes);
/* A device-owned copy of n <= 256 bytes that kernels read as launch-time constants (a TMA
 * matmul's tensor maps): *buf and *offset name it; the same bytes give the same place, written
 * once. Valid for launches issued before the device's next 255 calls with other bytes (a slot is
 * rewritten in queue order after them) and until the device closes. Refused while the device
 * records a graph (a replay could outlive the slot): allocate a buffer then. */
em_status em_device_constant(em_device *dev, const void *data, size_t n, em_buffer **buf,
                             size_t *offset);
/* A device-owned block of EM_DEVICE_COUNTERS u32 counters, zero, for kernels whose last cube
 * to arrive finishes the work of the others (it counts with atomic_add, and a kernel that counts
 * in it must leave every counter it used zero again when it ends): *buf names it. Made zero on
 * first use and freed with the device. Launches on the device run one after another, so one
 * block serves them all. Refused (the caller launches a second kernel instead) while the device
 * records a graph and the block is not yet made. */
enum { EM_DEVICE_COUNTERS = 8192 };
em_status em_device_counters(em_device *dev, em_buffer **buf);
em_status em_buffer_read(const em_buffer *buf, size_t offset, void *dst, size_t bytes);
em_status em_buffer_copy(em_buffer *dst, size_t dst_offset, const em_buffer *src, size_t src_offset,
                         size_t bytes);
em_status em_buffer_fill_zero(em_buffer *buf);

/* ---- tensor maps (TMA) --------------------------------------------------------------------- */

/* A tiled tensor map: the description of an up-to-3-D view of a buffer from which a kernel's
 * tma_load (docs/kernel-language.md "Tensor memory accelerator") copies boxes into shared
 * memory. Dims are innermost first; the innermost has unit stride. */
#define EM_TENSOR_MAP_WORDS 16 /* u64 words of one encoded map (128 bytes, CUtensorMap's size) */
typedef struct em_tensor_map_desc {
    em_scalar dtype;     /* element type (1, 2, 4 or 8 bytes) */
    unsigned rank;       /* 1 to 3 dims used (the rest count as 1) */
    uint64_t dims[3];    /* elements per dim, innermost first (1 to 2^32) */
    uint64_t strides[3]; /* elements between neighbours per dim; strides[0] must be 1, the others
                            16-byte multiples */
    uint32_t box[3];     /* elements of a copied box per dim (1 to 256; box[0] 16-byte multiple) */
    unsigned swizzle;    /* 0 (rows of the box one after another) or 128 (128-byte swizzle, the
                            warpgroup MMAs' layout; box[0] then spans exactly 128 bytes) */
} em_tensor_map_desc;
/* Encodes the map of d over buf from byte `offset` (16-byte aligned) into out, in the device's
 * own form: CUDA's CUtensorMap (cuTensorMapEncodeTiled: no interleave, L2 promotion 128 B, zero
 * fill outside the dims) on compute capability 9.0, the CPU target's geometry words on the CPU.
 * A kernel receives maps in a u64 tensor (each map 16 words, 128-byte aligned). EM_OK, or
 * EM_ERR_INVALID (a rule above broken, the view outside buf) / EM_ERR_UNSUPPORTED (a device
 * without tensor maps: OpenCL, Vulkan, CUDA before 9.0) with the error set. */
em_status em_tensor_map_encode(em_buffer *buf, size_t offset, const em_tensor_map_desc *d,
                               uint64_t out[EM_TENSOR_MAP_WORDS]);

/* Pool counters since the device opened. Byte counts are block sizes: requests rounded up to the
 * pool's size classes (256 bytes, then four classes per power of two). */
typedef struct em_pool_stats {
    uint64_t allocs;        /* em_buffer_alloc calls that succeeded */
    uint64_t frees;         /* em_buffer_free calls */
    uint64_t reuses;        /* allocations served from cached blocks */
    uint64_t device_allocs; /* allocations that went to the driver */
    uint64_t bytes_in_use;  /* bytes held by live buffers */
    uint64_t bytes_cached;  /* bytes in freed blocks kept for reuse */
    uint64_t bytes_in_graphs; /* bytes of freed buffers that graphs hold for their replays */
    uint64_t peak_in_use;   /* high-water mark of bytes_in_use + bytes_in_graphs (since
                             * em_device_pool_reset_peak): the memory the device's buffers
                             * take, graphs' included */
    uint64_t oom_retries;   /* times the cache was emptied to satisfy an allocation */
    char peak_kernel[64];   /* the first kernel launched after the peak was reached: where the
                             * program was ("" before any launch) */
    uint64_t peak_launch;   /* launches on the device from the last peak reset to that kernel */
    uint64_t peak_largest[8]; /* the sizes asked for of the largest live buffers at the peak */
    uint64_t requested_in_use; /* bytes asked for by live buffers (bytes_in_use before rounding
                                * to size classes) */
    uint64_t requested_in_graphs; /* the same for the buffers graphs hold */
    uint64_t peak_requested; /* high-water mark of the two above (since the last reset): what
                              * PyTorch's max_memory_allocated counts, where peak_in_use counts
                              * what the pool holds */
} em_pool_stats;
/* The live buffers at the peak, by size: bucket k holds blocks of [2^k, 2^(k+1)) bytes. Fills up
 * to max buckets that held any (largest first) and returns how many. */
typedef struct em_pool_bucket {
    uint64_t min_bytes;     /* 2^k */
    uint64_t count;         /* live blocks of that size at the peak */
    uint64_t bytes;         /* their bytes */
} em_pool_bucket;
size_t em_device_pool_peak_buckets(const em_device *dev, em_pool_bucket *out, size_t max);
void em_device_pool_stats(const em_device *dev, em_pool_stats *out);
/* Restarts peak_in_use from bytes_in_use now, so that the next peak read is that of what runs
 * after the call (one training step, say). */
void em_device_pool_reset_peak(em_device *dev);
/* Frees every cached (unused) block back to the driver. */
void em_device_pool_trim(em_device *dev);

/* ---- kernels --------------------------------------------------------------------------------- */

/* Compiles an IR kernel for the device (verifying and simplifying a copy first) or finds it in the
 * cache. The device owns the result; it lives until the device closes. NULL with the error set on
 * failure (ill-formed IR names the instruction; a failing system compiler is named and its output
 * shown). Thread-safe; compiles on one device are serialized. */
em_kernel *em_kernel_compile(em_device *dev, const em_ir_kernel *k);
/* Compiles several kernels, in one compiler run where the target allows (kernels already in
 * memory or on disk are not rebuilt; two different kernels of one name go to separate runs, since
 * one binary cannot hold both). Each kernel is later found by its own key, alone or in another
 * batch. out[i] receives each kernel. On failure every out[i] is NULL. */
em_status em_kernel_compile_batch(em_device *dev, const em_ir_kernel *const *ks, size_t n,
                                  em_kernel **out);
/* The kernel's name, and the verified, simplified IR it was compiled from (owned by the device). */
const char *em_kernel_name(const em_kernel *kernel);
const em_ir_kernel *em_kernel_ir(const em_kernel *kernel);
/* The generated source for a kernel on a target ("c", "cuda", ...) without compiling it;
 * malloc'd, the caller frees it. NULL with the error set when the target does not exist. */
char *em_kernel_source(const em_ir_kernel *k, const char *target);
/* The same for a target described by caps (caps->target; caps->arch, e.g. "sm_90a", selects the
 * architecture-specific code: warpgroup MMAs, TMA). */
char *em_kernel_source_caps(const em_ir_kernel *k, const em_caps *caps);

/* How a scalar argument's `value` is to be read: as the parameter's own type (for arguments
 * written by hand), or as what an em_arg_* helper stored. An integer value passed to a float
 * parameter is converted; a float value passed to an integer parameter is an error. */
typedef enum em_arg_class {
    EM_ARG_AS_PARAM = 0, /* value already in the parameter's class (i/u for integers, f for floats) */
    EM_ARG_INT,          /* value.i holds a signed integer */
    EM_ARG_UINT,         /* value.u holds an unsigned integer */
    EM_ARG_FLOAT,        /* value.f holds a float */
} em_arg_class;

/* One launch argument: a buffer (with optional tensor metadata) or a scalar, in the kernel's
 * parameter order. */
typedef struct em_arg {
    uint8_t kind;            /* EM_PARAM_BUFFER or EM_PARAM_SCALAR */
    uint8_t value_class;     /* scalars: an em_arg_class */
    em_buffer *buf;          /* buffers: the device buffer */
    size_t offset;           /* buffers: byte offset of element 0 */
    uint64_t len;            /* buffers: elements (of the parameter's element type) visible */
    uint32_t rank;           /* buffers: dims in shape/stride (must match the parameter's rank) */
    int64_t shape[EM_MAX_RANK];  /* buffers: sizes per dim, in scalars */
    int64_t stride[EM_MAX_RANK]; /* buffers: strides per dim, in scalars */
    em_ir_const value;       /* scalars: the value, as the parameter's type */
} em_arg;

/* Argument helpers. em_arg_buffer views the whole buffer as `len` elements. */
em_arg em_arg_buffer(em_buffer *buf, uint64_t len);
em_arg em_arg_tensor(em_buffer *buf, size_t offset, uint64_t len, unsigned rank,
                     const int64_t *shape, const int64_t *stride);
em_arg em_arg_u32(uint32_t v);
em_arg em_arg_i32(int32_t v);
em_arg em_arg_f32(float v);
em_arg em_arg_f64(double v);

/* Launches a compiled kernel over cube_count cubes of cube_dim units each. Arguments are checked
 * against the kernel's parameters, and an error names the parameter: the count, each kind, that
 * a buffer is on the kernel's device, that offset is a multiple of the element's scalar size and
 * offset + len * element size fits in the buffer, that len fits in u32, that a tensor parameter
 * gets a tensor of its rank whose shape and (non-negative) strides stay inside len, and that a
 * scalar's class fits the parameter. A rank-0 (plain array) parameter ignores tensor metadata.
 * The cube dimensions must be within the device's caps (and equal the kernel's fixed cube_dim if
 * it has one); the grid must have at most 2^32 units (positions are u32). A grid with a zero axis
 * launches nothing. Work may run asynchronously on GPU devices; em_device_sync waits. */
em_status em_launch(em_kernel *kernel, const uint32_t cube_count[3], const uint32_t cube_dim[3],
                    const em_arg *args, size_t nargs);

/* The widest line width (among `candidates`, e.g. {8, 4, 2, 1}) that divides the innermost
 * dimension, whose stride is 1, and that keeps every other stride and the offset aligned; 1 when
 * the innermost stride is not 1. Shapes and strides count scalars. */
unsigned em_pick_line_width(unsigned rank, const int64_t *shape, const int64_t *stride,
                            int64_t offset, const unsigned *candidates, size_t ncandidates);

/* The widest line (in lanes, a power of two) that memory-bound kernels should use for elements of
 * elem_bytes bytes on a device with these caps: 4 on the CPU target (wider lines only lengthen the
 * generated C); on GPUs 16 bytes per unit for 4- and 8-byte elements and 32 bytes (two 16-byte
 * accesses) for 1- and 2-byte ones, capped at EM_MAX_LANES — on the H200, bf16 GELU in 16-byte
 * lines reached 73 % of copy bandwidth and in 32-byte lines 83 % (docs/benchmarks.md). */
unsigned em_line_lanes(const em_caps *caps, unsigned elem_bytes);

/* ---- kernel cache ---------------------------------------------------------------------------- */

typedef struct em_cache_stats {
    uint64_t memory_hits;   /* found in this process */
    uint64_t disk_hits;     /* loaded from the disk cache */
    uint64_t compiles;      /* compiler runs */
    uint64_t kernels_built; /* kernels produced by those runs */
} em_cache_stats;
void em_cache_stats_get(em_cache_stats *out);
/* The cache directory in use (after fallback to a temporary one, with a warning, if the
 * configured one is not writable). Re-resolved when $EMBER_CACHE_DIR / $XDG_CACHE_HOME / $HOME
 * change; the string stays valid for the life of the process. NULL (error set) only when no
 * directory at all can be written. */
const char *em_cache_dir(void);

/* ---- autotune cache -------------------------------------------------------------------------- */

/* EMBER_AUTOTUNE: off (ops use their heuristic default and never benchmark), on (the default:
 * benchmark a short list of candidates on first use, keep the winner), full (a longer list). */
typedef enum em_autotune_mode {
    EM_AUTOTUNE_OFF = 0,
    EM_AUTOTUNE_ON,
    EM_AUTOTUNE_FULL,
} em_autotune_mode;
/* The mode from $EMBER_AUTOTUNE (read on every call; unknown values mean on). */
em_autotune_mode em_autotune_get_mode(void);
/* The winning configuration stored for (device, op, key) — key is the op's choice of kernel,
 * dtype, layout and shape bucket — copied into value (NUL-terminated). True when found, in this
 * process or on disk under em_cache_dir()/autotune/ (shared by devices of the same target,
 * architecture and name). */
bool em_autotune_lookup(em_device *dev, const char *op, const char *key, char *value, size_t size);
/* Stores a one-line value for (device, op, key), in memory and on disk (atomically: concurrent
 * processes see the old or the new value, never a torn one). EM_OK or an error status; the value
 * is remembered in memory even when the disk write fails. */
em_status em_autotune_store(em_device *dev, const char *op, const char *key, const char *value);
/* Forgets the results held in memory (the disk entries stay); for tests. */
void em_autotune_forget_memory(void);

/* ---- timing ---------------------------------------------------------------------------------- */

/* Seconds elapsed on the device between two points: em_device_timer_start records, em_device_timer
 * _stop waits and returns seconds. Host monotonic time on the CPU, events on GPUs. */
typedef struct em_timer {
    em_device *dev; /* the device timed */
    double host_t0; /* host start (seconds) */
    void *event0;   /* driver start event (GPU) */
} em_timer;
em_status em_timer_start(em_timer *t, em_device *dev);
double em_timer_stop(em_timer *t);


/* ---- graphs ---------------------------------------------------------------------------------- */

/* A recorded sequence of a device's launches, writes and copies, replayed as a whole (docs/graphs.md).
 * Between em_graph_begin and em_graph_end every em_launch, em_buffer_write (and fill_zero) and
 * same-device em_buffer_copy on the device is recorded, not run: launches with their resolved
 * arguments, writes with a copy of their bytes. em_graph_launch then runs the whole sequence; on
 * CUDA it becomes one CUDA graph (cuGraphLaunch: one host call for the whole step), elsewhere the
 * runtime replays the recorded calls through the driver (no argument checks, no tensor-layer work).
 *
 * Recording is for one thread at a time on one device. While it lasts, what needs the device's
 * results fails with EM_ERR_INVALID (em_buffer_read, em_device_sync, em_timer_start, copies between
 * devices), and the error is kept: em_graph_end then fails with it and no graph is made.
 *
 * Memory: a buffer allocated while recording, and one freed while recording, belongs to the graph
 * until em_graph_free — the replays write and read it, so it never goes back to the pool before
 * (its em_buffer_free is deferred). Buffers freed while recording are reused by later allocations
 * of the same recording (the replays run in the same order). Buffers allocated before and used by
 * the recording (inputs, weights, caches) must be kept alive by the caller while the graph lives;
 * changing their contents between replays is how inputs change. Free graphs before releasing
 * their device. */
typedef struct em_graph em_graph;
/* Starts recording on dev; EM_ERR_INVALID when it is already recording. */
em_status em_graph_begin(em_device *dev);
/* Stops recording: *out receives the graph (free it with em_graph_free). Fails (no graph, error
 * set) when something failed while recording or the driver could not build its graph; recording
 * ends either way. */
em_status em_graph_end(em_device *dev, em_graph **out);
/* Runs the recorded sequence once more, queued like launches (em_device_sync waits for it). */
em_status em_graph_launch(em_graph *g);
void em_graph_free(em_graph *g);
/* Whether dev is recording a graph. */
bool em_device_recording(const em_device *dev);
/* Recorded operations (launches + writes + copies) of a graph; whether it runs as a native
 * driver graph (CUDA) rather than replayed call by call. */
size_t em_graph_ops(const em_graph *g);
bool em_graph_native(const em_graph *g);

/* ---- profiling ------------------------------------------------------------------------------- */

/* The launch profiler (src/runtime/profile.c; docs/profiling.md). While it is on, every em_launch
 * is counted by kernel name with the host time spent inside the call and the device time of the
 * kernel (CUDA: events recorded around each launch; other backends: a sync before and after each
 * launch, so they run one kernel at a time), and buffer allocations, host<->device copies and
 * syncs are counted. Off, it costs one predictable branch per call. EMBER_PROFILE=1 (any value
 * but "" and "0") turns it on when the first device opens and prints the report to stderr at exit,
 * unless the program printed one itself with em_profile_report. Process-wide and thread-safe. */
typedef struct em_profile_counts {
    double wall_s;            /* seconds since the profiler was turned on or last reset */
    uint64_t launches;        /* successful em_launch calls */
    uint64_t kernels;         /* distinct kernel names launched */
    double launch_host_s;     /* seconds spent inside those em_launch calls (checks + driver) */
    double launch_device_s;   /* seconds the device spent running them */
    uint64_t allocs;          /* em_buffer_alloc calls that succeeded */
    uint64_t device_allocs;   /* of those, allocations that went to the driver (pool misses) */
    uint64_t frees;           /* em_buffer_free calls */
    uint64_t writes;          /* host -> device copies (em_buffer_write, em_buffer_fill_zero) */
    uint64_t write_bytes;     /* their bytes */
    uint64_t reads;           /* device -> host copies (em_buffer_read); each waits for the device */
    uint64_t read_bytes;      /* their bytes */
    uint64_t copies;          /* em_buffer_copy calls (device -> device, or between devices) */
    uint64_t copy_bytes;      /* their bytes */
    uint64_t syncs;           /* em_device_sync calls */
    uint64_t compiles;        /* compiler runs (kernel cache misses) */
    uint64_t bytes_read;      /* bytes the launches read, as the tensor layer models them (the
                               * views they bind: docs/profiling.md); 0 for other launches */
    uint64_t bytes_written;   /* bytes they wrote, likewise */
} em_profile_counts;

/* One kernel name's figures (every specialization of a kernel shares its name). */
typedef struct em_profile_kernel {
    uint64_t launches;      /* successful launches */
    double host_s;          /* seconds inside em_launch */
    double device_s;        /* seconds of device time */
    uint64_t bytes_read;    /* bytes read, as reported with em_profile_add_bytes */
    uint64_t bytes_written; /* bytes written, likewise */
} em_profile_kernel;

/* Turns the profiler on or off (the figures gathered so far are kept). Turning it on when it was
 * off starts the wall clock if nothing has been gathered since the last reset. */
void em_profile_enable(bool on);
bool em_profile_enabled(void);
/* Forgets every figure and restarts the wall clock (waits for pending device timings first). */
void em_profile_reset(void);
/* The totals since the last reset (waits for pending device timings). */
void em_profile_get(em_profile_counts *out);
/* One kernel's figures; false (out zeroed) when no kernel of that name was launched. */
bool em_profile_kernel_get(const char *name, em_profile_kernel *out);
/* Adds the bytes one launch of kernel `name` read and wrote to its row and the totals (the
 * tensor layer reports each of its launches: the elements of the views it binds times their
 * dtype's size, a model of the traffic rather than a hardware counter). Ignored while off. */
void em_profile_add_bytes(const char *name, uint64_t read, uint64_t written);
/* Prints the table (one row per kernel name, sorted by device time, then host time, with totals)
 * and the memory, copy and sync counts to out (stderr when NULL). Does not reset. */
void em_profile_report(FILE *out);
/* Labels this thread's launches (NULL or "" clears) while EMBER_PROFILE=shapes turned the
 * profiler on: each is then counted, with the bytes reported for it, under "<kernel> <label>",
 * so that one kernel's launches split by the problem they ran (the tensor layer labels its
 * matmuls with their layout, shape and epilogue). Ignored otherwise. */
void em_profile_label(const char *label);
/* Whether labels are being counted (EMBER_PROFILE=shapes, the profiler on). */
bool em_profile_labels_on(void);

#ifdef __cplusplus
}
#endif
#endif
