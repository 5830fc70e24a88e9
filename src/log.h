/*
 * Output that never allocates: formatted into a stack buffer and written with
 * one write(2), so it is safe in a preload constructor, at exit, after fork
 * and in a signal handler (ca_log_raw only).
 */
#ifndef CA_LOG_H
#define CA_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Every line the library prints starts with this. */
#define CA_LOG_PREFIX "cudalloc: "

/* Where output goes: stderr unless redirected. ca_log_set_fd sends it to an
 * open descriptor; ca_log_set_path to a file opened on the first line each
 * process writes, named by `path_template` with "%p" replaced by the
 * process id ("%%" is a '%'). The template must outlive the process's
 * output (the settings' own copy does). NULL or "" means stderr. */
void ca_log_set_fd(int fd);
void ca_log_set_path(const char *path_template);
int ca_log_fd(void);

/* Prints CA_LOG_PREFIX, the formatted text and a newline as one write.
 * Lines longer than 1 KiB are cut. */
void ca_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ca_logv(const char *fmt, va_list ap);

/* Writes `len` bytes as they are, retrying short writes; async-signal-safe
 * once the process's log file is open. */
void ca_log_raw(const char *buf, size_t len);

#endif /* CA_LOG_H */
