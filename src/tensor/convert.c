/* convert.c — host-side dtype conversions: f16 and bf16 to and from f32 with round to nearest
 * even, and reading/writing one element of a host array of any tensor dtype as a double (used by
 * creation from host data, em_item, printing and index checks). Device-side casts are kernels. */
#include <math.h>
#include <string.h>

#include "tensor/internal.h"

uint16_t tn_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)half;
}

float tn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, x;
    if (exp == 0) {
        if (!mant) {
            x = sign;
        } else {
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400u));
            x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t tn_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float tn_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

double tn_host_get(em_scalar dt, const void *p, size_t i)
{
    switch (dt) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_F16: return tn_f16_to_f32(((const uint16_t *)p)[i]);
    case EM_BF16: return tn_bf16_to_f32(((const uint16_t *)p)[i]);
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_I64: return (double)((const int64_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    case EM_BOOL: return ((const uint8_t *)p)[i] ? 1 : 0;
    default: return NAN;
    }
}

/* Float to integer as the device casts do: truncation, NaN to 0, saturated at the range. */
static int64_t to_int(double v, double lo, double hi)
{
    if (isnan(v)) return 0;
    if (v < lo) return (int64_t)lo;
    if (v > hi) return (int64_t)hi;
    return (int64_t)v;
}

void tn_host_set(em_scalar dt, void *p, size_t i, double v)
{
    switch (dt) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_F16: ((uint16_t *)p)[i] = tn_f32_to_f16((float)v); break;
    case EM_BF16: ((uint16_t *)p)[i] = tn_f32_to_bf16((float)v); break;
    case EM_I32: ((int32_t *)p)[i] = (int32_t)to_int(v, -2147483648.0, 2147483647.0); break;
    case EM_I64: ((int64_t *)p)[i] = to_int(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)to_int(v, 0, 255); break;
    case EM_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
    }
}
