/* nvrtc.h — NVRTC, NVIDIA's run-time CUDA C++ compiler, loaded with dlopen (never linked), so
 * that ember builds and runs on machines without the CUDA toolkit. The CUDA driver (cuda.c) uses
 * it to turn generated CUDA source into cubins; tests and `ember kernel dump --target cuda` use
 * em_nvrtc_compile to compile for an architecture without any GPU present.
 *
 * The library is looked for as $EMBER_NVRTC (a path, when set), then libnvrtc.so.13, .so.12 and
 * .so through the dynamic loader, then under $CUDA_HOME / $CUDA_PATH and /usr/local/cuda
 * (lib64/, lib/). It is loaded once per process; every function here is thread-safe. */
#ifndef EM_RUNTIME_DRIVERS_NVRTC_H
#define EM_RUNTIME_DRIVERS_NVRTC_H
#include <stdbool.h>
#include <stddef.h>
#include "ember/base.h"

/* Loads NVRTC (the first call does the work). EM_OK, or EM_ERR_UNSUPPORTED with a message that
 * starts "libnvrtc not found" and lists the places tried. */
em_status em_nvrtc_load(void);

/* True when NVRTC is loaded (or loadable); otherwise writes why into `why` (may be NULL). Does not
 * touch the thread's error. */
bool em_nvrtc_available(char *why, size_t why_size);

/* NVRTC's version (e.g. 13, 0); EM_ERR_UNSUPPORTED (error set) when NVRTC is missing. */
em_status em_nvrtc_version(int *major, int *minor);

/* The file NVRTC was loaded from ("" when it is not loaded). Owned by this module. */
const char *em_nvrtc_library(void);

/* True when NVRTC can generate code for compute capability `sm` (e.g. 90 for sm_90); false when
 * it is missing or too old or too new for it. */
bool em_nvrtc_supports_arch(int sm);
/* The newest architecture NVRTC supports (e.g. 120), 0 when NVRTC is missing. */
int em_nvrtc_max_arch(void);

/* The options every compile uses besides the architecture, joined by spaces (for compiler ids):
 * the language standard, -default-device, the include path of the toolkit's headers (cuda_fp16.h)
 * and anything in $EMBER_NVRTC_OPTIONS. Owned here. */
const char *em_nvrtc_common_options(void);

/* Compiles CUDA C++ `src` for `arch`: "sm_XY" or "sm_XYa" gives a cubin (an ELF image), and
 * "compute_XY" gives PTX text (NUL-terminated; *size counts the NUL), which the driver JIT-compiles
 * at load time. On success *binary (malloc'd) and *size receive the result. When `log` is not
 * NULL it receives NVRTC's log (malloc'd, possibly empty; the caller frees it) on success and on
 * failure. Errors: EM_ERR_UNSUPPORTED when NVRTC is missing, EM_ERR_COMPILE with the NVRTC log
 * in the message when the source does not compile, EM_ERR_INVALID for a malformed arch. */
em_status em_nvrtc_compile(const char *src, const char *arch, char **log, void **binary,
                           size_t *size);

#endif
