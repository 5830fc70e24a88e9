/*
 * For the unit tests that check what the library prints: ca_log writes to
 * a memory file while a test group runs, so that each test reads back
 * exactly what was printed. Include after cmocka.h; use capture_log and
 * release_log as the group's setup and teardown.
 */
#ifndef CA_TEST_LOG_CAPTURE_H
#define CA_TEST_LOG_CAPTURE_H

#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "support/log.h"

static int log_fd = -1;
static char log_text[256 * 1024];

static int capture_log(void **state) {
  (void)state;
  log_fd = memfd_create("cudalloc_test_log", 0);
  if (log_fd < 0)
    return -1;
  ca_log_set_fd(log_fd);
  return 0;
}

static int release_log(void **state) {
  (void)state;
  ca_log_set_fd(2);
  close(log_fd);
  return 0;
}

/* Returns what was printed since the last call and empties the log. */
static const char *take_log(void) {
  off_t end = lseek(log_fd, 0, SEEK_CUR);
  assert_true(end >= 0 && (size_t)end < sizeof(log_text));
  ssize_t n = pread(log_fd, log_text, (size_t)end, 0);
  assert_int_equal(n, end);
  log_text[n] = '\0';
  assert_int_equal(ftruncate(log_fd, 0), 0);
  assert_int_equal(lseek(log_fd, 0, SEEK_SET), 0);
  return log_text;
}

#endif /* CA_TEST_LOG_CAPTURE_H */
