/* examples.h — sample kernels built with the IR builder, by name: used by `ember kernel dump
 * --example NAME`, by the docs and by the execution tests. Each shows one pattern:
 *   add           elementwise over f32 lines of 4:      out[i] = a[i] + b[i] for i < len(out)
 *   gelu          elementwise with math builtins:       out[i] = x * (erf(x / sqrt 2) + 1) / 2
 *   reduce_sum    shared memory and barriers in a loop: out[cube] = sum of a 256-element block
 *                 (cube_dim 256; input read as zero past its end)
 *   matmul_tiled  shared tiles, a barrier inside a loop: c[M,N] = a[M,K] * b[K,N], row-major f32
 *                 (cube_dim 16x16, one unit per element of c; scalars M, N, K)
 *   matmul_mma    cooperative matrices: c[M,N] = a[M,K] * b[K,N] with f16 inputs, f32 output,
 *                 one plane per 16x16 tile of c (M, N, K multiples of 16; scalars N, K; the grid
 *                 has M / 16 cubes along y and enough planes along x to cover N / 16 tiles)
 *   histogram     atomics: bins[in[i] % nbins] += 1 (scalar nbins)
 * Parameters come in the order listed in each kernel's IR (em_ir_print_kernel shows them). */
#ifndef EM_KERNEL_EXAMPLES_H
#define EM_KERNEL_EXAMPLES_H
#include "ember/kernel.h"

/* A new kernel built from the named sample; the caller frees it with em_ir_kernel_free. NULL
 * (EM_ERR_NOT_FOUND, the message listing the names) when there is no such sample. */
em_ir_kernel *em_ir_example(const char *name);
/* The sample names, NULL-terminated. */
const char *const *em_ir_example_names(void);

#endif
