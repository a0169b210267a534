/* cache.h — the kernel cache's entry point for callers that keep a kernel's IR hash themselves
 * (the kernel language's specialization cache, src/kernel/lang/module.c): they hash a kernel once
 * when they make it, and every later compile of it is a map lookup, with no printing or hashing
 * of the IR. Defined in cache.c; the public entry points are in ember/runtime.h. */
#ifndef EM_RUNTIME_CACHE_H
#define EM_RUNTIME_CACHE_H

#include "ember/kernel.h"
#include "ember/runtime.h"

/* em_kernel_compile(dev, k) for a kernel whose em_ir_hash is ir_hash (the caller vouches for it:
 * a wrong hash would find another kernel). Returns the device's kernel (owned by the device), or
 * NULL with the error set. */
em_kernel *em_rt_kernel_compile_hashed(em_device *dev, const em_ir_kernel *k,
                                       const char ir_hash[33]);

#endif
