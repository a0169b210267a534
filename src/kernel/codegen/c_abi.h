/* c_abi.h — the calling convention between C code generated for the CPU target (codegen/c.c) and
 * the CPU driver (runtime/drivers/cpu.c). The generated shared object exports, for every kernel
 * NAME in it, a function `emk_NAME` of type em_cpu_kernel_fn that runs a range of cubes: for each
 * cube it loops over the cube's units (and splits the body at barriers). The same structs are
 * re-declared in the generated source's prelude, so the two must stay identical. */
#ifndef EM_KERNEL_CODEGEN_C_ABI_H
#define EM_KERNEL_CODEGEN_C_ABI_H
#include <stdint.h>

#define EM_CPU_ABI_VERSION 1

typedef struct em_cpu_buf {
    void *data;            /* element 0 (already offset) */
    uint64_t len;          /* number of elements (lines) */
    const int64_t *shape;  /* rank entries, in scalars (NULL for plain arrays) */
    const int64_t *stride; /* rank entries, in scalars (NULL for plain arrays) */
} em_cpu_buf;

typedef union em_cpu_scalar {
    int64_t i;
    uint64_t u;
    double f; /* every float parameter arrives as double and is converted by the kernel */
} em_cpu_scalar;

typedef struct em_cpu_launch {
    const em_cpu_buf *bufs;       /* indexed by parameter index (entries of scalar params unused) */
    const em_cpu_scalar *scalars; /* indexed by parameter index (entries of buffer params unused) */
    uint32_t cube_dim[3];         /* units per cube, per axis */
    uint32_t cube_count[3];       /* cubes in the grid, per axis */
} em_cpu_launch;

/* Runs cubes [first, first + count) of the grid, cubes numbered linearly x-fastest. */
typedef void (*em_cpu_kernel_fn)(const em_cpu_launch *launch, uint64_t first, uint64_t count);

#endif
