/* internal.h — what the distributed layer's files share: the communicator, and the two engines
 * behind it. mpi.c loads libmpi with dlopen and runs collectives on host buffers; nccl.c loads
 * libnccl (and libcuda, for a stream and the device's context) and runs them on device pointers.
 * dist.c holds the public API: launcher detection, and the choice between reducing a tensor in
 * place (CPU buffers, CUDA buffers with NCCL) and staging it through host memory. */
#ifndef EM_DIST_INTERNAL_H
#define EM_DIST_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "ember/dist.h"

typedef struct ds_mpi ds_mpi;
typedef struct ds_nccl ds_nccl;

struct em_dist {
    em_dist_mode mode;   /* as given to em_dist_init */
    int rank;            /* this process */
    int world;           /* processes */
    int local_rank;      /* among this host's processes */
    ds_mpi *mpi;         /* the MPI engine, or NULL (a world of one without MPI) */
    ds_nccl *nccl;       /* NCCL for nccl_dev, or NULL */
    em_device *nccl_dev; /* the CUDA device NCCL works on (a reference), or NULL */
};

/* ---- MPI (mpi.c) ---------------------------------------------------------------------------- */

/* Loads libmpi (EMBER_MPI_LIB, then libmpi.so.40, then libmpi.so), starts MPI unless the program
 * did, and reads rank and size. NULL with the error set. */
ds_mpi *ds_mpi_open(int *rank, int *world);
/* MPI_Finalize when ds_mpi_open called MPI_Init; frees. */
void ds_mpi_close(ds_mpi *m);
void ds_mpi_abort(ds_mpi *m, int code) __attribute__((noreturn));
/* In place on host memory: n elements of dtype (f32, f64, i8..u64; SUM, MAX, MIN). */
em_status ds_mpi_all_reduce(ds_mpi *m, void *buf, size_t n, em_scalar dtype, em_dist_op op);
em_status ds_mpi_broadcast(ds_mpi *m, void *buf, size_t bytes, int root);
/* send: bytes; recv: world * bytes. */
em_status ds_mpi_all_gather(ds_mpi *m, const void *send, void *recv, size_t bytes);
/* send: world * n elements; recv: n elements (SUM, MAX, MIN). */
em_status ds_mpi_reduce_scatter(ds_mpi *m, const void *send, void *recv, size_t n, em_scalar dtype,
                                em_dist_op op);
em_status ds_mpi_barrier(ds_mpi *m);

/* ---- NCCL (nccl.c) -------------------------------------------------------------------------- */

#define DS_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* Loads libnccl (EMBER_NCCL_LIB, then libnccl.so.2, then libnccl.so) and libcuda. EM_OK or an
 * error saying which library is missing. Thread-safe, loads once. */
em_status ds_nccl_load(void);
/* ncclGetUniqueId (rank 0 makes it; the others receive it through MPI). */
em_status ds_nccl_unique_id(unsigned char id[DS_NCCL_ID_BYTES]);
/* A communicator of `world` ranks on CUDA device ordinal `ordinal`, with its own stream. */
ds_nccl *ds_nccl_open(int ordinal, int rank, int world, const unsigned char id[DS_NCCL_ID_BYTES]);
void ds_nccl_close(ds_nccl *c);
/* "NCCL 2.21.5" */
const char *ds_nccl_version(void);
/* Collectives on device addresses (CUdeviceptr values), queued on the communicator's stream;
 * ds_nccl_sync waits for the stream. */
em_status ds_nccl_all_reduce(ds_nccl *c, const void *send, void *recv, size_t n, em_scalar dtype,
                             em_dist_op op);
em_status ds_nccl_broadcast(ds_nccl *c, const void *send, void *recv, size_t n, em_scalar dtype,
                            int root);
em_status ds_nccl_all_gather(ds_nccl *c, const void *send, void *recv, size_t n, em_scalar dtype);
em_status ds_nccl_reduce_scatter(ds_nccl *c, const void *send, void *recv, size_t n,
                                 em_scalar dtype, em_dist_op op);
em_status ds_nccl_sync(ds_nccl *c);

#endif
