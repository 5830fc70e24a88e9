/*
 * Output that never allocates (see log.h).
 */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* Where lines go. With a log_path, the file is opened on the first line a
 * process writes, so a process that never prints creates no file, and a
 * forked child (whose pid differs from the opener's) opens its own. */
static atomic_int ca__log_fd = 2;
static const char *_Atomic ca__log_template;
/* With a template: the process that opened the file (high half) and the
 * descriptor (low half), in one word so that no thread can see one without
 * the other. 0 until a process opens. */
static _Atomic uint64_t ca__log_opened;

static uint64_t ca__opened(int pid, int fd) {
  return (uint64_t)(uint32_t)pid << 32 | (uint32_t)fd;
}

void ca_log_set_fd(int fd) {
  atomic_store(&ca__log_template, NULL);
  atomic_store(&ca__log_fd, fd);
}

void ca_log_set_path(const char *path_template) {
  atomic_store(&ca__log_template,
               path_template && path_template[0] ? path_template : NULL);
  atomic_store(&ca__log_opened, 0);
}

/* Writes `template` with each "%p" replaced by `pid` and "%%" by "%". Returns
 * false when the result does not fit. */
static bool ca__expand_path(const char *template, int pid, char *out,
                            size_t size) {
  size_t len = 0;
  for (const char *p = template; *p; p++) {
    char num[16];
    const char *piece = p;
    size_t n = 1;
    if (p[0] == '%' && p[1] == 'p') {
      n = (size_t)snprintf(num, sizeof(num), "%d", pid);
      piece = num;
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      p++;
    }
    if (len + n >= size)
      return false;
    memcpy(out + len, piece, n);
    len += n;
  }
  out[len] = '\0';
  return true;
}

/* Opens this process's log file; on failure says so once on stderr and
 * keeps writing there. */
static int ca__open_log(const char *template, int pid) {
  char path[4096];
  int fd = -1;
  if (ca__expand_path(template, pid, path, sizeof(path)))
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    char line[512];
    int n = snprintf(line, sizeof(line),
                     CA_LOG_PREFIX "log_path: cannot open '%s' (%s); "
                                   "writing to stderr\n",
                     template, strerror(errno));
    if (n > 0 && write(2, line, (size_t)n < sizeof(line) ? (size_t)n
                                                         : sizeof(line) - 1))
      (void)0; /* Nothing more to do about a failed warning. */
    fd = 2;
  }
  return fd;
}

int ca_log_fd(void) {
  const char *template = atomic_load(&ca__log_template);
  if (template == NULL)
    return atomic_load(&ca__log_fd);
  int pid = (int)getpid();
  uint64_t seen = atomic_load(&ca__log_opened);
  if (seen >> 32 == (uint32_t)pid)
    return (int)(uint32_t)seen;
  /* Two threads may race to open: both open the same path in append mode,
   * and the loser closes its descriptor and takes the winner's. */
  int fd = ca__open_log(template, pid);
  if (atomic_compare_exchange_strong(&ca__log_opened, &seen,
                                     ca__opened(pid, fd)))
    return fd;
  if (fd != 2)
    close(fd);
  return (int)(uint32_t)atomic_load(&ca__log_opened);
}

void ca_log_raw(const char *buf, size_t len) {
  int fd = ca_log_fd();
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* Nowhere to report a failed report: drop it. */
    buf += n;
    len -= (size_t)n;
  }
}

void ca_logv(const char *fmt, va_list ap) {
  char line[1024];
  size_t prefix = sizeof(CA_LOG_PREFIX) - 1;
  memcpy(line, CA_LOG_PREFIX, prefix);
  int n = vsnprintf(line + prefix, sizeof(line) - prefix - 1, fmt, ap);
  size_t len = prefix;
  if (n > 0)
    len += (size_t)n < sizeof(line) - prefix - 1 ? (size_t)n
                                                  : sizeof(line) - prefix - 2;
  line[len++] = '\n';
  ca_log_raw(line, len);
}

void ca_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ca_logv(fmt, ap);
  va_end(ap);
}
