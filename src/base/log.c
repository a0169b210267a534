/* log.c — leveled logging to stderr. The level lives in one atomic, set once from EMBER_LOG
 * (under pthread_once) and overridable by em_log_set_level. Each message is formatted in full,
 * "ember: <level>: <text>\n", and handed to a single write(), so lines from several threads never
 * interleave. Logging leaves errno as it found it. */
#include "base/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define LOG_DEFAULT EM_LOG_WARN
#define LOG_LINE_CAP 1024 /* messages longer than this are formatted on the heap */

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static atomic_int log_level = LOG_DEFAULT; /* guarded: atomic, first set under log_once */

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

const char *em_log_level_name(em_log_level level)
{
    if ((unsigned)level > EM_LOG_TRACE) return "?";
    return level_names[level];
}

int em_log_parse_level(const char *name, em_log_level *level)
{
    if (!name) return -1;
    for (int i = EM_LOG_ERROR; i <= EM_LOG_TRACE; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *level = (em_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(name, "warning") == 0) {
        *level = EM_LOG_WARN;
        return 0;
    }
    return -1;
}

/* Runs once: reads EMBER_LOG, complaining (at warn) about a value it does not know. */
static void log_init(void)
{
    const char *env = getenv("EMBER_LOG");
    em_log_level level = LOG_DEFAULT;
    if (!env || !*env) return;
    if (em_log_parse_level(env, &level) == 0) {
        atomic_store(&log_level, (int)level);
        return;
    }
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "ember: warn: EMBER_LOG=%.64s is not one of error, warn, info, debug, "
                     "trace; using warn\n",
                     env);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
}

em_log_level em_log_get_level(void)
{
    pthread_once(&log_once, log_init);
    return (em_log_level)atomic_load(&log_level);
}

int em_log_enabled(em_log_level level)
{
    return (int)level <= (int)em_log_get_level();
}

void em_log_set_level(em_log_level level)
{
    pthread_once(&log_once, log_init); /* so a late first read of EMBER_LOG cannot undo this */
    atomic_store(&log_level, (int)level);
}

/* Writes all of buf to stderr: one write() unless the kernel takes it in parts. */
static void write_all(const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(STDERR_FILENO, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        buf += n;
        len -= (size_t)n;
    }
}

/* Formats "ember: <level>: <text>\n" into buf (cap bytes) or, when longer, a malloc'd buffer.
 * Returns the line (buf or heap) and its length; NULL when formatting failed. */
static char *format_line(char *buf, size_t cap, em_log_level level, const char *fmt, va_list ap,
                         size_t *len)
{
    int head = snprintf(buf, cap, "ember: %s: ", em_log_level_name(level));
    if (head < 0) return NULL;
    va_list copy;
    va_copy(copy, ap);
    int body = vsnprintf(buf + head, cap - (size_t)head, fmt, copy);
    va_end(copy);
    if (body < 0) return NULL;
    size_t total = (size_t)head + (size_t)body + 1; /* with the newline */
    char *line = buf;
    if (total + 1 > cap) {
        line = malloc(total + 1);
        if (!line) { /* keep what fits */
            total = cap - 1;
            line = buf;
        } else {
            memcpy(line, buf, (size_t)head);
            vsnprintf(line + head, (size_t)body + 1, fmt, ap);
        }
    }
    line[total - 1] = '\n';
    line[total] = '\0';
    *len = total;
    return line;
}

void em_log(em_log_level level, const char *fmt, ...)
{
    if (!em_log_enabled(level)) return;
    int saved_errno = errno;
    char buf[LOG_LINE_CAP];
    size_t len = 0;
    va_list ap;
    va_start(ap, fmt);
    char *line = format_line(buf, sizeof buf, level, fmt, ap, &len);
    va_end(ap);
    if (line) write_all(line, len);
    if (line && line != buf) free(line);
    errno = saved_errno;
}
