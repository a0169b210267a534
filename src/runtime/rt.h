/* rt.h — the runtime's internal structures, shared by its files: the device (device.c), its
 * memory pool and buffers (pool.c), compiled kernels and loaded modules (cache.c), and the
 * registry of backends (registry.c). Nothing outside src/runtime includes this; the public API
 * is ember/runtime.h. Internal functions shared between files use the em_rt_ prefix. */
#ifndef EM_RUNTIME_RT_H
#define EM_RUNTIME_RT_H
#include <pthread.h>
#include <stdatomic.h>
#include "base/base.h"
#include "ember/runtime.h"
#include "runtime/driver.h"

/* ---- memory pool (pool.c) ------------------------------------------------------------------ */

/* Size classes: 256 bytes, then four classes per power of two (1.25, 1.5, 1.75 and 2 times it),
 * so a block wastes at most a quarter of its size. */
#define EM_RT_POOL_CLASSES 224
#define EM_RT_POOL_MIN_BLOCK 256

struct em_buffer {
    em_device *dev;    /* owning device */
    void *mem;         /* the driver's block */
    size_t size;       /* bytes requested (what the user sees) */
    size_t capacity;   /* bytes of the block (its size class) */
    unsigned cls;      /* size class index */
    em_buffer *prev;   /* live list (or free list: next only) */
    em_buffer *next;
    int graph_refs;    /* graphs that hold it (graph.c): its free waits for them */
    bool user_freed;   /* em_buffer_free was called while a graph held it */
    em_graph *last_graph; /* the last graph that took hold of it (no double entries) */
    uint64_t written;  /* the device's launch_seq of the last launch that may write it (launch.c) */
    size_t graph_life; /* while a graph records: 1 + the index of its open allocation there */
    bool addr_fixed;   /* its address was handed out (a tensor map, a collective): never moved */
};

typedef struct em_rt_pool {
    pthread_mutex_t lock;                   /* guards everything below */
    em_buffer *free_lists[EM_RT_POOL_CLASSES]; /* cached blocks per size class */
    em_buffer *live;                        /* buffers handed out (doubly linked) */
    uint64_t max_cached;                    /* idle bytes kept at most (0 = no limit) */
    em_pool_stats stats;                    /* counters reported by em_device_pool_stats */
    uint64_t live_count[64], live_bytes[64]; /* live blocks by power-of-two size bucket */
    uint64_t peak_count[64], peak_bytes[64]; /* the same at the peak */
    bool peak_pending;                      /* a new peak awaits its next kernel's name */
    uint64_t launches;                      /* launches since the last peak reset */
} em_rt_pool;

/* Size class of a request: writes the block size to *capacity; false when too large. */
bool em_rt_size_class(size_t bytes, unsigned *cls, size_t *capacity);
void em_rt_pool_init(em_rt_pool *pool);
/* Names the kernel launched after a new peak (launch.c); cheap when none is pending. */
void em_rt_pool_note_launch(em_device *dev, const char *kernel);
/* Frees every cached and every live block (device close). Returns how many were live. */
size_t em_rt_pool_destroy(em_device *dev);

/* ---- kernels and modules (cache.c) --------------------------------------------------------- */

typedef struct em_rt_module {
    void *handle;      /* the driver's module */
    char *path;        /* the binary it came from */
} em_rt_module;

struct em_kernel {
    em_device *dev;      /* owning device */
    em_ir_kernel *ir;    /* the simplified copy (parameters for argument checks) */
    char key[33];        /* cache key */
    void *fn;            /* the driver's function handle */
    em_rt_module *module; /* the module holding fn (shared by a batch) */
};

/* Frees every kernel and unloads every module of a device (device close). */
void em_rt_kernels_destroy(em_device *dev);

/* ---- devices (device.c, registry.c) -------------------------------------------------------- */

/* A device's constants (constants.c): EM_RT_CONST_SLOTS slots of EM_RT_CONST_BYTES in buf, a
 * host copy of each slot's bytes (len 0: empty) and their hash, the next slot to overwrite. */
enum { EM_RT_CONST_SLOTS = 256, EM_RT_CONST_BYTES = 256 };
typedef struct em_rt_constants {
    pthread_mutex_t lock;
    em_buffer *buf; /* allocated on first use */
    unsigned char bytes[EM_RT_CONST_SLOTS][EM_RT_CONST_BYTES];
    size_t len[EM_RT_CONST_SLOTS];
    uint64_t hash[EM_RT_CONST_SLOTS]; /* of each slot's bytes: most misses skip the compare */
    int used, next;
    em_buffer *counters; /* em_device_counters' block, made on first use */
} em_rt_constants;
void em_rt_constants_destroy(em_device *dev);

struct em_device {
    const em_driver *drv;  /* the backend's vtable */
    void *state;           /* the driver's device state */
    char name[32];         /* canonical name: "cpu", "cuda:0" */
    int index;             /* device index within its backend */
    int refs;              /* references; guarded by the registry lock */
    em_caps caps;          /* capabilities, filled by the driver at open */
    em_rt_pool pool;       /* memory pool */
    pthread_mutex_t kernel_lock; /* guards kernels, kernel_list and modules */
    pthread_mutex_t compile_lock; /* serializes cache misses (one compile at a time) */
    em_map kernels;        /* IR hash / cache key -> em_kernel * (two keys per kernel) */
    struct {
        em_kernel **items;
        size_t len, cap;
    } kernel_list;         /* every kernel, once, for freeing */
    em_map modules;        /* binary path -> em_rt_module * */
    em_graph *recording;   /* the graph being recorded (graph.c), or NULL; set and read by the
                            * recording thread, read under the pool lock by alloc and free */
    em_rt_constants consts; /* em_device_constant's slots */
    uint64_t launch_seq;   /* launches so far (em_rt_launch numbers them; atomic) */
    uint64_t settled;      /* every launch numbered up to this has completed (em_rt_settle after
                            * a sync or a read; lowered by a graph's replay: em_buffer_settled) */
};

/* Creates a device of `drv` (index i, canonical name) with one reference; NULL (error set). */
em_device *em_rt_device_create(const em_driver *drv, int index, const char *name);
/* Frees a device whose last reference went away. */
void em_rt_device_destroy(em_device *dev);

/* Every launch numbered up to seq has completed (a sync or a blocking read waited for it): raises
 * dev->settled to seq (em_buffer_settled). */
void em_rt_settle(em_device *dev, uint64_t seq);

/* Host monotonic clock in seconds. */
double em_rt_now(void);

/* ---- graphs (graph.c) --------------------------------------------------------------------- */

/* Called by the pool with its lock held while dev->recording is set: a block for class cls from
 * the graph's freed blocks (NULL when none), the graph taking hold of a block, and a free. */
em_buffer *em_rt_graph_take_free(em_graph *g, unsigned cls);
void em_rt_graph_hold(em_graph *g, em_buffer *b);
void em_rt_graph_put_free(em_graph *g, em_buffer *b);
/* The recording's record of an allocation (fresh: the block came from the pool) and of a free,
 * for its memory plan (graph_plan.c). Pool lock held. */
void em_rt_graph_note_alloc(em_graph *g, em_buffer *b, bool fresh);
void em_rt_graph_note_free(em_graph *g, em_buffer *b);
/* The recording side of launches, writes and copies (launch.c, pool.c): the op is appended to
 * the recording graph. */
em_status em_rt_graph_record_launch(em_graph *g, void *fn, const em_drv_launch *launch);
em_status em_rt_graph_record_write(em_graph *g, void *mem, size_t offset, const void *src,
                                   size_t bytes);
em_status em_rt_graph_record_copy(em_graph *g, void *dst, size_t dst_offset, const void *src,
                                  size_t src_offset, size_t bytes);
/* An operation that cannot be recorded (`what`: "a read", "a sync", ...) was asked for while dev
 * records: sets the error, marks the recording failed, returns EM_ERR_INVALID. */
em_status em_rt_graph_refuse(em_device *dev, const char *what);
/* Returns a block whose holders are gone to the pool (the tail of em_buffer_free). Called with
 * the pool lock held. */
void em_rt_pool_release_locked(em_device *dev, em_buffer *buf);

/* ---- the profiler (profile.c) -------------------------------------------------------------- */

/* Non-zero while the profiler is on; read with em_rt_profiling() (one relaxed load). */
extern _Atomic int em_rt_profile_on;
static inline bool em_rt_profiling(void)
{
    return __builtin_expect(atomic_load_explicit(&em_rt_profile_on, memory_order_relaxed), 0);
}

/* What the counters count (em_rt_profile_count). */
typedef enum em_rt_prof_event {
    EM_RT_PROF_ALLOC,        /* a buffer allocation */
    EM_RT_PROF_DEVICE_ALLOC, /* one that went to the driver */
    EM_RT_PROF_FREE,         /* a buffer free */
    EM_RT_PROF_WRITE,        /* host -> device, `bytes` bytes */
    EM_RT_PROF_READ,         /* device -> host */
    EM_RT_PROF_COPY,         /* em_buffer_copy */
    EM_RT_PROF_SYNC,         /* em_device_sync */
} em_rt_prof_event;
void em_rt_profile_count(em_rt_prof_event what, uint64_t bytes);
/* Reads EMBER_PROFILE once (the first device open) and turns the profiler on when it is set. */
void em_rt_profile_init_env(void);
/* em_launch while profiling: runs em_rt_launch with the timing around it. */
em_status em_rt_profile_launch(em_kernel *kernel, const uint32_t cube_count[3],
                               const uint32_t cube_dim[3], const em_arg *args, size_t nargs);
/* The unprofiled launch (launch.c). */
em_status em_rt_launch(em_kernel *kernel, const uint32_t cube_count[3], const uint32_t cube_dim[3],
                       const em_arg *args, size_t nargs);
/* Resolves the pending device timings of a device that is closing. */
void em_rt_profile_device_closing(em_device *dev);

#endif
