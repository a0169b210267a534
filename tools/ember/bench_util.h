/* bench_util.h — small helpers the `ember bench` subcommands share (bench_decode.c,
 * bench_train.c): a monotonic clock, strict parsing of a positive integer argument, and the
 * splitmix64 generator their random tokens come from. Header-only. */
#ifndef EMBER_BENCH_UTIL_H
#define EMBER_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A positive integer argument (the whole string), or -1. */
static inline int64_t bu_positive(const char *s)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    return errno || end == s || *end || v <= 0 ? -1 : (int64_t)v;
}

/* splitmix64: the next value of the sequence that *s walks. */
static inline uint64_t bu_next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
