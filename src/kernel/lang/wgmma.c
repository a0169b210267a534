/* wgmma.c — descriptor, operand-address and accumulator-layout arithmetic of warpgroup MMAs
 * (see wgmma.h; PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": matrix
 * descriptor format, shared-memory matrix layouts, register fragment of D for .m64nNk16). */
#include "kernel/lang/wgmma.h"

uint64_t em_wgmma_desc_bits(uint32_t lbo_bytes)
{
    uint64_t lbo = lbo_bytes ? (lbo_bytes >> 4) & 0x3fffu : 1u;
    uint64_t sbo = (EM_WGMMA_SBO >> 4) & 0x3fffu;
    return (lbo << 16) | (sbo << 32) | (1ull << 62);
}

uint64_t em_wgmma_desc(uint32_t addr, uint32_t lbo_bytes)
{
    return em_wgmma_desc_bits(lbo_bytes) | (uint64_t)((addr & 0x3ffffu) >> 4);
}

uint32_t em_wgmma_byte(uint32_t start, uint32_t lbo_bytes, uint32_t r, uint32_t k)
{
    uint32_t x;
    if (lbo_bytes == 0)
        x = start + r / 8 * EM_WGMMA_SBO + r % 8 * 128 + k * 2;
    else
        x = start + r / 64 * lbo_bytes + k / 8 * EM_WGMMA_SBO + k % 8 * 128 + r % 64 * 2;
    return x ^ (((x >> 7) & 7u) << 4);
}

void em_wgmma_d_coord(uint32_t unit, uint32_t i, uint32_t *row, uint32_t *col)
{
    uint32_t warp = unit / 32, lane = unit % 32;
    *row = warp * 16 + lane / 4 + (i / 2) % 2 * 8;
    *col = i / 4 * 8 + lane % 4 * 2 + i % 2;
}

void em_wgmma_a_coord(uint32_t unit, uint32_t reg, uint32_t half, uint32_t *row, uint32_t *col)
{
    uint32_t warp = unit / 32, lane = unit % 32;
    *row = warp * 16 + lane / 4 + reg % 2 * 8;
    *col = reg / 2 * 8 + lane % 4 * 2 + half;
}
