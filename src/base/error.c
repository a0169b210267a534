/* error.c — the calling thread's last error: a status and a message in thread-local storage.
 *
 * Messages are formatted into a fixed 4 KiB buffer per thread; longer ones are cut at a UTF-8
 * character boundary and end in "...". Formatting goes through a scratch buffer first, so a
 * message may quote em_last_error() itself (as em_error_context does). */
#include "ember/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ERROR_CAP 4096 /* bytes per thread, including the NUL */

static _Thread_local char error_msg[ERROR_CAP];
static _Thread_local em_status error_status;

/* Marks a cut message: backs up to a UTF-8 lead byte and ends the text in "...". */
static void mark_truncated(char *buf, size_t cap)
{
    size_t end = cap - 4; /* room for "..." and the NUL */
    while (end > 0 && ((unsigned char)buf[end] & 0xC0) == 0x80) end--;
    memcpy(buf + end, "...", 4);
}

/* Formats into buf (cap bytes), marking truncation. */
static void format_into(char *buf, size_t cap, const char *fmt, va_list ap)
{
    int n = vsnprintf(buf, cap, fmt, ap);
    if (n < 0) {
        snprintf(buf, cap, "(unformattable error message: %s)", fmt);
        return;
    }
    if ((size_t)n >= cap) mark_truncated(buf, cap);
}

const char *em_last_error(void)
{
    return error_msg;
}

em_status em_last_status(void)
{
    return error_status;
}

void em_clear_error(void)
{
    error_msg[0] = '\0';
    error_status = EM_OK;
}

em_status em_set_error(em_status status, const char *fmt, ...)
{
    char scratch[ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    format_into(scratch, sizeof scratch, fmt, ap);
    va_end(ap);
    memcpy(error_msg, scratch, strlen(scratch) + 1);
    error_status = status;
    return status;
}

em_status em_error_context(const char *fmt, ...)
{
    char scratch[ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    format_into(scratch, sizeof scratch, fmt, ap);
    va_end(ap);
    if (error_msg[0] != '\0') {
        size_t len = strlen(scratch);
        int n = snprintf(scratch + len, sizeof scratch - len, ": %s", error_msg);
        if (n >= 0 && (size_t)n >= sizeof scratch - len) mark_truncated(scratch, sizeof scratch);
    }
    memcpy(error_msg, scratch, strlen(scratch) + 1);
    return error_status;
}

const char *em_status_name(em_status status)
{
    static const char *const names[] = {
        [EM_OK] = "ok",
        [EM_ERR_INVALID] = "invalid argument",
        [EM_ERR_NOMEM] = "out of memory",
        [EM_ERR_IO] = "i/o error",
        [EM_ERR_UNSUPPORTED] = "unsupported",
        [EM_ERR_COMPILE] = "compile error",
        [EM_ERR_DEVICE] = "device error",
        [EM_ERR_NOT_FOUND] = "not found",
        [EM_ERR_CORRUPT] = "corrupt data",
        [EM_ERR_INTERNAL] = "internal error",
    };
    if ((unsigned)status >= sizeof names / sizeof names[0] || !names[status])
        return "unknown status";
    return names[status];
}
