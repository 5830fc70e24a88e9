/*
 * Output that never allocates (see log.h).
 */
#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static atomic_int ca__log_fd = 2;

void ca_log_set_fd(int fd) { atomic_store(&ca__log_fd, fd); }

int ca_log_fd(void) { return atomic_load(&ca__log_fd); }

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
