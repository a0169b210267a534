/* log.h — leveled logging to stderr. The level comes from EMBER_LOG (error, warn, info, debug,
 * trace; default warn), read once. Thread-safe: each message is one write. */
#ifndef EM_BASE_LOG_H
#define EM_BASE_LOG_H

typedef enum em_log_level {
    EM_LOG_ERROR = 0,
    EM_LOG_WARN,
    EM_LOG_INFO,
    EM_LOG_DEBUG,
    EM_LOG_TRACE,
} em_log_level;

void em_log(em_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True when messages at `level` are printed (to skip building expensive messages). */
int em_log_enabled(em_log_level level);
/* Overrides the level from EMBER_LOG (tests use it). */
void em_log_set_level(em_log_level level);
/* The current level (EMBER_LOG's, or the last em_log_set_level). */
em_log_level em_log_get_level(void);
/* Parses a level name (error, warn or warning, info, debug, trace; any case) into *level.
 * Returns 0 on success, -1 (and *level untouched) for anything else. */
int em_log_parse_level(const char *name, em_log_level *level);
/* The lowercase name of a level ("warn"). */
const char *em_log_level_name(em_log_level level);

#define EM_LOGE(...) em_log(EM_LOG_ERROR, __VA_ARGS__)
#define EM_LOGW(...) em_log(EM_LOG_WARN, __VA_ARGS__)
#define EM_LOGI(...) em_log(EM_LOG_INFO, __VA_ARGS__)
#define EM_LOGD(...) em_log(EM_LOG_DEBUG, __VA_ARGS__)

#endif
