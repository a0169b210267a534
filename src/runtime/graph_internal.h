/* graph_internal.h — a recorded graph's structures, shared by graph.c (recording and replay) and
 * graph_plan.c (the memory plan made at em_graph_end). */
#ifndef EM_RUNTIME_GRAPH_INTERNAL_H
#define EM_RUNTIME_GRAPH_INTERNAL_H
#include "runtime/rt.h"

enum { OP_LAUNCH, OP_WRITE, OP_COPY };

typedef struct graph_op {
    int kind;
    /* launch */
    void *fn;                /* the driver's function */
    em_drv_launch launch;    /* grid and arguments (args owned: see op_free) */
    /* write and copy */
    void *mem;               /* destination block */
    size_t offset;           /* destination offset */
    void *bytes;             /* write: the bytes (owned) */
    const void *src;         /* copy: source block */
    size_t src_offset;
    size_t size;             /* write and copy: bytes */
} graph_op;

/* One allocation made while recording: its block and the ops it spans, from the one recorded
 * next when it was allocated (begin) to the one recorded next when it was freed (end;
 * GRAPH_LIFE_OPEN while the caller still holds it). fresh: the block came from the pool, not
 * from the graph's own freed blocks. */
#define GRAPH_LIFE_OPEN ((size_t)-1)
typedef struct graph_life {
    em_buffer *buf;
    void *mem;
    size_t size; /* bytes asked for */
    size_t begin, end;
    bool fresh;
} graph_life;

/* How many size classes larger a block freed while recording may be and still serve an
 * allocation of the recording (four classes per power of two: up to twice the size). */
#define GRAPH_REUSE_CLASSES 4

struct em_graph {
    em_device *dev;
    graph_op *ops;
    size_t nops, cap;
    size_t max_ops;          /* EMBER_GRAPH_MAX_OPS at em_graph_begin (0: no limit) */
    em_buffer **bufs;        /* the buffers it holds */
    size_t nbufs, bufs_cap;
    em_buffer *free_lists[EM_RT_POOL_CLASSES]; /* while recording: blocks freed by it */
    em_status failed;        /* EM_OK, or why the recording cannot become a graph */
    char why[512];           /* the failure's message */
    void *native;            /* the driver's executable graph, or NULL (replay call by call) */
    uint64_t first_seq;      /* the device's number for its first recorded launch */
    graph_life *lives;       /* every allocation made while recording, in order */
    size_t nlives, lives_cap;
    bool unplanned;          /* a life went unrecorded (out of host memory): no plan */
    void *arena;             /* the planned temporaries' block (graph_plan.c), or NULL */
    size_t arena_size;       /* its bytes */
};

/* Moves the recording's temporaries into one arena (graph_plan.c): called by em_graph_end before
 * the ops are issued. Leaves g as it was when the plan gains nothing or cannot be made. */
void em_rt_graph_plan(em_graph *g);

/* The arena's grain for a device of caps: 256 bytes, or its buffer_align where larger (rounded up
 * to a multiple of 256), so that every temporary's offset in it is one the device takes. */
size_t em_rt_graph_plan_align(const em_caps *caps);
/* Gives the arena back (em_graph_free, after a device sync: a replay may still run, and the
 * arena goes to the driver, not to the stream-ordered pool). Called with the pool lock held. */
void em_rt_graph_arena_free_locked(em_graph *g);

#endif
