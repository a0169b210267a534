/* ember/base.h — status codes and the thread-local error message shared by every layer.
 *
 * Every fallible ember function either returns an em_status (EM_OK on success) or returns NULL /
 * a sentinel and sets the calling thread's last error. em_last_error() returns that message; it
 * stays valid until the next ember call on the same thread that fails. User mistakes never abort. */
#ifndef EMBER_BASE_H
#define EMBER_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum em_status {
    EM_OK = 0,
    EM_ERR_INVALID,     /* bad argument: wrong shape, dtype, ill-formed IR, malformed source */
    EM_ERR_NOMEM,       /* host or device memory exhausted */
    EM_ERR_IO,          /* file system or pipe failure */
    EM_ERR_UNSUPPORTED, /* the device or build lacks the feature */
    EM_ERR_COMPILE,     /* a kernel failed to compile (system compiler, NVRTC, ...) */
    EM_ERR_DEVICE,      /* a driver call failed */
    EM_ERR_NOT_FOUND,   /* a named thing (device, kernel, file, tensor) does not exist */
    EM_ERR_CORRUPT,     /* a file or cache entry is malformed */
    EM_ERR_INTERNAL,    /* a bug in ember */
} em_status;

/* The calling thread's last error message ("" when none was set). Owned by ember. */
const char *em_last_error(void);
/* The status that accompanied the last error (EM_OK when none). */
em_status em_last_status(void);
/* Sets the last error; returns `status` so that callers can `return em_set_error(...)`. */
em_status em_set_error(em_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with more context: "context: previous message". Returns the
 * current status. */
em_status em_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Clears the last error. */
void em_clear_error(void);
/* A short fixed name for a status ("invalid argument", "out of memory", ...). */
const char *em_status_name(em_status status);

#ifdef __cplusplus
}
#endif
#endif
