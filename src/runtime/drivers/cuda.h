/* cuda.h — what the CUDA driver (cuda.c) offers besides its vtable (em_rt_cuda_driver, declared
 * in runtime/driver.h with the other drivers): version information for `ember info`. */
#ifndef EM_RUNTIME_DRIVERS_CUDA_H
#define EM_RUNTIME_DRIVERS_CUDA_H

/* "driver 580.159.03, CUDA 13.0; NVRTC 13.0": the NVIDIA kernel module (when /proc tells), the
 * CUDA version the driver supports and NVRTC's version. "" when libcuda is missing or cuInit
 * fails. The string lives for the process. */
const char *em_rt_cuda_versions(void);

#endif
