/*
 * Output that never allocates: formatted into a stack buffer and written with
 * one write(2), so it is safe in a preload constructor, at exit and after
 * fork. Writers take one lock, counted as the library's (lock.h), so that an
 * exit() from a signal handler that interrupted one skips the exit report.
 */
#ifndef CA_LOG_H
#define CA_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every line the library prints starts with this. */
#define CA_LOG_PREFIX "cudalloc: "

/* Where output goes: stderr unless redirected. ca_log_set_fd sends it to an
 * open descriptor; ca_log_set_path to a file opened on the first line each
 * process writes, named by `path_template` with "%p" replaced by the
 * process id ("%%" is a '%'). The template must outlive the process's
 * output (the settings' own copy does). NULL, "" or "stderr" means stderr;
 * "stdout" stdout.
 *
 * Lines go only to the file chosen: stderr (or stdout) as it was when the
 * library was loaded, or the log file as it was opened, checked before
 * each write (a program may close the descriptor and get its number back
 * for a file of its own: the log file is then opened again, and a standard
 * descriptor the program re-pointed gets nothing). The log file is opened
 * without blocking and without following a symbolic link at its last
 * component, created readable by its owner only, and refused when it is
 * not a regular file of this user (one line on stderr says why; lines then
 * go to stderr). */
void ca_log_set_fd(int fd);
void ca_log_set_path(const char *path_template);

/* Prints CA_LOG_PREFIX, the formatted text and a newline as one write; a
 * byte of the text that is not part of a printable character is printed as
 * its \xHH escape. Lines longer than 1 KiB are cut. */
void ca_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ca_logv(const char *fmt, va_list ap);

/* The length of the printable character s[0..n) starts with: 1 for
 * printable ASCII, 2 to 4 for a well-formed UTF-8 sequence that is no C1
 * control; 0 for a byte to be escaped (a control, DEL, or no part of
 * well-formed UTF-8). */
size_t ca_log_printable(const char *s, size_t n);

/* Writes a path `template` (log_path, trace_path, oom_snapshot) with each
 * "%p" replaced by `pid` and "%%" by "%" into out; false when it does not
 * fit. */
bool ca_log_expand_path(const char *template, int pid, char *out, size_t size);

/* Writes `len` bytes as they are, retrying short writes, with SIGPIPE held
 * back (a closed pipe never ends the program). */
void ca_log_raw(const char *buf, size_t len);

/* Formats `bytes` for people: "512 B", "1.5 KiB", "12.0 MiB", "3.2 GiB". */
void ca_format_bytes(char *buf, size_t len, uint64_t bytes);

#endif /* CA_LOG_H */
