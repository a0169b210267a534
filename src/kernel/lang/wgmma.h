/* wgmma.h — the arithmetic of Hopper's warpgroup matrix multiply-accumulate (PTX
 * wgmma.mma_async .m64nNk16, f16/bf16 inputs from shared memory, f32 accumulators), in one place:
 * the 64-bit shared-memory matrix descriptor, the 128-byte swizzled operand layouts it describes,
 * and which accumulator element each unit of the warpgroup holds. The kernel language's
 * wgmma_mma lowers to the instruction on CUDA sm_90 (codegen/cuda.c builds the descriptor with
 * em_wgmma_desc_bits) and to loops that follow em_wgmma_byte and em_wgmma_d_coord elsewhere
 * (lower_wgmma.c), so the CPU runs kernels that use it exactly as the hardware reads its operands;
 * tests/kernel/test_wgmma.c checks these functions against independent references.
 *
 * Operand layouts (16-bit elements, 128-byte swizzle; "row" r runs along M for A and N for B):
 *   K-major  (no transpose): 8-row groups of 1024 bytes, SBO = 1024 apart; row r % 8 at
 *            128 (r % 8) in its group; k at 2 k from the descriptor's start.
 *   MN-major (transpose bit set): 64-row atoms LBO bytes apart; k groups of 8 at 1024 bytes;
 *            k % 8 at 128 (k % 8); row r % 64 at 2 (r % 64).
 * The address so formed has bits [4, 7) XORed with bits [7, 10) (the swizzle), which needs every
 * 1024-byte group of the operand to start 1024-aligned in shared memory. */
#ifndef EM_KERNEL_LANG_WGMMA_H
#define EM_KERNEL_LANG_WGMMA_H
#include <stdint.h>

#define EM_WGMMA_SBO 1024u  /* bytes between 8-row (K-major) / 8-k (MN-major) groups */
#define EM_WGMMA_UNITS 128u /* units of a warpgroup (4 warps) */
#define EM_WGMMA_K 16u      /* k of one instruction (16-bit inputs) */

/* The descriptor's fields other than the start address: leading byte offset (lbo_bytes for an
 * MN-major operand; 0 for K-major, where the field is unused and set to 1), stride byte offset
 * EM_WGMMA_SBO, base offset 0, layout 1 (128-byte swizzle). */
uint64_t em_wgmma_desc_bits(uint32_t lbo_bytes);
/* The whole descriptor of an operand starting at shared-memory byte address `addr`. */
uint64_t em_wgmma_desc(uint32_t addr, uint32_t lbo_bytes);
/* The swizzled shared-memory byte address of element (r, k) of an operand that starts at byte
 * `start` (lbo_bytes 0: K-major, else MN-major with that leading byte offset). */
uint32_t em_wgmma_byte(uint32_t start, uint32_t lbo_bytes, uint32_t r, uint32_t k);
/* The row and column of the 64 x N accumulator held in register i (0 .. N/2) by unit `unit`
 * (0 .. 127) of the warpgroup. */
void em_wgmma_d_coord(uint32_t unit, uint32_t i, uint32_t *row, uint32_t *col);
/* The row and column of the 64 x 16 A operand that unit `unit` holds in half `half` (0: the low
 * 16 bits) of fragment register `reg` (0 .. 3) when A comes from registers (wgmma_mma_rs). They
 * are the accumulator's: register reg, half h holds what accumulator register 2 reg + h of the
 * same unit holds in a 16-column slice, so a 64 x 16k f32 accumulator packed pairwise (registers
 * 2 j and 2 j + 1 into fragment register j) is the A operand of k instructions. */
void em_wgmma_a_coord(uint32_t unit, uint32_t reg, uint32_t half, uint32_t *row, uint32_t *col);

#endif
