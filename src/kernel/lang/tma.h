/* tma.h — the CPU target's form of a tensor map (em_tensor_map_encode on the CPU driver) and the
 * swizzle both targets apply, in one place: the runtime writes these words, the kernel language's
 * emulated tma_load (lower_tma.c) reads them. On CUDA a map is NVIDIA's opaque CUtensorMap
 * instead; the kernel only passes its address to cp.async.bulk.tensor.
 *
 * A map is EM_TMA_WORDS u64 words. The CPU form holds the geometry, not an address: the kernel
 * also names the tensor the map describes and reads it from element OFFSET on. */
#ifndef EM_KERNEL_LANG_TMA_H
#define EM_KERNEL_LANG_TMA_H
#include <stdint.h>

#define EM_TMA_WORDS 16u           /* u64 words of a map (128 bytes) */
#define EM_TMA_MAGIC 0x706d746d65ull /* word EM_TMA_W_MAGIC of a CPU map ("emtmp") */

/* Word indices of the CPU form. */
enum {
    EM_TMA_W_MAGIC = 0,   /* EM_TMA_MAGIC */
    EM_TMA_W_DIM = 1,     /* 1..3: elements per dim, innermost first */
    EM_TMA_W_STRIDE = 4,  /* 4..5: elements between neighbours along dims 1 and 2 */
    EM_TMA_W_BOX = 6,     /* 6..8: elements of a box per dim */
    EM_TMA_W_SWIZZLE = 9, /* 0 or 128: the swizzle span in bytes */
    EM_TMA_W_ESIZE = 10,  /* bytes of an element */
    EM_TMA_W_OFFSET = 11, /* element of the tensor at coordinates (0, 0, 0) */
};

/* The shared-memory byte at which the hardware puts byte `x` of a box (counted from a
 * 1024-aligned address) under a 128-byte swizzle: bits [4, 7) XORed with bits [7, 10), the
 * layout warpgroup MMAs read (wgmma.h). */
static inline uint32_t em_tma_swizzle128(uint32_t x)
{
    return x ^ (((x >> 7) & 7u) << 4);
}

#endif
