/* ember/dist.h — collectives between processes (src/dist): a communicator of `world` ranks and
 * the collectives data-parallel training needs — all-reduce (sum, mean, max, min), broadcast,
 * all-gather, reduce-scatter and barrier — on tensors of any device.
 *
 * Processes are started by a launcher, `mpirun -np N program ...`; em_dist_init finds the rank
 * and world size in its environment (Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, or
 * PMI_RANK / PMI_SIZE / MPI_LOCALRANKID of MPICH's Hydra). Without a launcher the process is a
 * world of one and every collective is the identity, so code written for N ranks runs unchanged
 * in one process. NULL is a valid communicator everywhere: a world of one.
 *
 * Two engines move the data, both loaded with dlopen so that every build runs without them:
 * - MPI (libmpi.so.40, Open MPI 4 as Debian ships it; or libmpi.so) for processes on CPUs:
 *   tensors of the CPU device are reduced in place in their host buffers; tensors of other
 *   devices are staged through host memory.
 * - NCCL (libnccl.so.2) for CUDA tensors, once em_dist_use_device has bound a CUDA device: the
 *   collectives run on the GPU on a stream of their own (ember's stream is synchronized first,
 *   and the collective has finished when the call returns). MPI, when there is more than one
 *   rank, only carries NCCL's unique id.
 *
 * Collectives are blocking and must be called by every rank in the same order with tensors of
 * the same shape and dtype (as with MPI); they are not thread-safe: call them from one thread.
 * Errors follow ember/base.h: an em_status or NULL, with em_last_error() saying what happened. An
 * error on one rank leaves the others waiting in their next collective: a program that fails
 * should call em_dist_abort, which ends every rank (MPI_Abort). */
#ifndef EMBER_DIST_H
#define EMBER_DIST_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_dist em_dist;

/* How em_dist_init chooses the engine. */
typedef enum em_dist_mode {
    EM_DIST_AUTO = 0, /* MPI when a launcher started more than one rank, else one process; NCCL
                         for a bound CUDA device when libnccl loads (else MPI, with a warning) */
    EM_DIST_OFF,      /* one process, whatever the environment says */
    EM_DIST_MPI,      /* MPI even for one rank (MPI_Init as a singleton); no NCCL */
    EM_DIST_NCCL,     /* as AUTO, but a CUDA device must get NCCL (an error otherwise), even for
                         one rank */
} em_dist_mode;

/* Parses "auto", "off", "mpi", "nccl"; false with the error set otherwise. */
bool em_dist_mode_parse(const char *name, em_dist_mode *out);

/* Reductions. MEAN is SUM divided by the world size (floating-point tensors only). */
typedef enum em_dist_op {
    EM_DIST_SUM = 0,
    EM_DIST_MEAN,
    EM_DIST_MAX,
    EM_DIST_MIN,
} em_dist_op;

/* A communicator for this process: reads the launcher's environment and, for MPI, loads libmpi
 * and calls MPI_Init (unless the program did already: then MPI is left for it to finalize).
 * Returns a new communicator (free with em_dist_free) or NULL with the error set: a launcher
 * said N > 1 ranks but libmpi cannot be loaded, or MPI failed to start. */
em_dist *em_dist_init(em_dist_mode mode);
/* Finalizes what em_dist_init started (NCCL communicator, MPI). NULL is ignored. */
void em_dist_free(em_dist *d);
/* Ends every rank with `code` (MPI_Abort); in a world of one, exit(code). Does not return. */
void em_dist_abort(em_dist *d, int code) __attribute__((noreturn));

/* Binds the device this rank computes on. A CUDA device gets an NCCL communicator when the mode
 * asks for it (see em_dist_mode); other devices need nothing. EM_OK, or an error (NCCL mode and
 * libnccl / libcuda missing, NCCL failing to start). Call it on every rank, with one device per
 * rank. */
em_status em_dist_use_device(em_dist *d, em_device *dev);

int em_dist_rank(const em_dist *d);       /* 0..world-1 (0 for NULL) */
int em_dist_world(const em_dist *d);      /* ranks (1 for NULL) */
int em_dist_local_rank(const em_dist *d); /* rank among the processes of this host (0 for NULL) */
/* "none" (a world of one without an engine), "mpi" or "nccl" (the engine for a bound CUDA
 * device; other tensors still go through MPI). */
const char *em_dist_engine(const em_dist *d);

/* ---- collectives on tensors ---------------------------------------------------------------- */

/* Reduces t element by element across ranks, in place: afterwards every rank holds the result.
 * Any dtype for SUM / MAX / MIN (f16 and bf16 are reduced in f32 through MPI), floating point for
 * MEAN; any layout (a non-contiguous view is staged). */
em_status em_dist_all_reduce(em_dist *d, em_tensor *t, em_dist_op op);
/* Copies root's t into every rank's t (same shape and dtype on every rank). */
em_status em_dist_broadcast(em_dist *d, em_tensor *t, int root);
/* The ranks' tensors concatenated along dim 0, rank 0 first: a new tensor of shape
 * [world * d0, ...] (a 0-d tensor gives [world]), on t's device. The caller owns it. */
em_tensor *em_dist_all_gather(em_dist *d, const em_tensor *t);
/* Reduces t across ranks and keeps this rank's share of dim 0: a new tensor of shape
 * [d0 / world, ...] holding rows [rank * d0 / world, (rank + 1) * d0 / world) of the reduction.
 * d0 must be a multiple of the world size. */
em_tensor *em_dist_reduce_scatter(em_dist *d, const em_tensor *t, em_dist_op op);
/* Waits until every rank has called it. */
em_status em_dist_barrier(em_dist *d);

/* Reduces n tensors at once, packed into buckets of about bucket_bytes (0: 25 MiB) so that a
 * model's many small gradients travel in a few large messages. in[i] is not changed; out[i]
 * receives a new contiguous tensor of in[i]'s shape, dtype and device holding the reduction (the
 * caller owns it). in[i] may be NULL (then out[i] is NULL). On failure every out[i] is NULL. */
em_status em_dist_all_reduce_many(em_dist *d, em_tensor *const *in, int n, em_dist_op op,
                                  size_t bucket_bytes, em_tensor **out);

/* ---- host values --------------------------------------------------------------------------- */

/* Reduces n host values of dtype (f32, f64, i32, i64) in place: a loss, a flag. */
em_status em_dist_all_reduce_host(em_dist *d, void *values, size_t n, em_scalar dtype,
                                  em_dist_op op);
/* Copies root's bytes into every rank's buffer. */
em_status em_dist_broadcast_host(em_dist *d, void *data, size_t bytes, int root);

#ifdef __cplusplus
}
#endif
#endif
