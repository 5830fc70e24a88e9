/*
 * libFuzzer target for CUDALLOC_CONF parsing: any text must parse without a
 * crash, a sanitizer report or a setting outside what the keys accept, and
 * print one line per bad item (after five, one line for the rest), each
 * whole, with no control byte in it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/config.h"
#include "support/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with the broken invariant, so libFuzzer saves the input. The check
 * is explicit because assert() vanishes under NDEBUG in release builds. */
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_config: invariant broken: %s\n", #cond);           \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#define MIB_MASK ((UINT64_C(1) << 20) - 1)

/* Every bad item is reported, and an item cannot be bad twice: there are
 * never more errors than comma-separated items. */
static size_t count_items(const char *text) {
  size_t items = 1;
  for (; *text; text++)
    items += *text == ',';
  return items;
}

/* Messages go to this memory file rather than stderr, where one line per
 * bad item would flood the fuzzer's own output, and are checked there. */
static int log_fd = -1;

#define PREFIX "cudalloc: CUDALLOC_CONF: "
/* ca_log's cut: an echo may grow fourfold as its bytes are escaped. */
#define LINE_MAX_LEN 1024
/* Bad items named one by one before the line that counts the rest. */
#define NAMED 5

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  log_fd = memfd_create("fuzz_config_log", MFD_CLOEXEC);
  CHECK(log_fd >= 0);
  ca_log_set_fd(log_fd);
  return 0;
}

/* Returns how many lines were printed since the last call, checking that
 * each is a whole, short config message, and empties the log. */
static size_t take_log_lines(void) {
  char buf[64 * 1024];
  size_t lines = 0, column = 0;
  off_t at = 0;
  ssize_t n;
  while ((n = pread(log_fd, buf, sizeof(buf), at)) > 0) {
    for (ssize_t i = 0; i < n; i++) {
      if (column < sizeof(PREFIX) - 1)
        CHECK(buf[i] == PREFIX[column]);
      unsigned char ch = (unsigned char)buf[i];
      CHECK(ch == '\n' || (ch >= 0x20 && ch != 0x7f));
      if (buf[i] == '\n') {
        CHECK(column + 1 <= LINE_MAX_LEN);
        lines++;
        column = 0;
      } else {
        column++;
      }
    }
    at += n;
  }
  CHECK(n == 0 && column == 0);
  CHECK(ftruncate(log_fd, 0) == 0);
  CHECK(lseek(log_fd, 0, SEEK_SET) == 0);
  return lines;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exactly sized copy, so that AddressSanitizer catches a read past the
   * terminating NUL. */
  char *text = malloc(size + 1);
  if (!text)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';

  ca_config c;
  ca_config_defaults(&c);
  int errors = ca_config_parse(&c, text);

  CHECK(errors >= 0 && (size_t)errors <= count_items(text));
  CHECK(take_log_lines() == (size_t)(errors > NAMED ? NAMED + 1 : errors));
  CHECK(c.gc_threshold == 0 || (c.gc_threshold > 0 && c.gc_threshold < 1));
  CHECK(c.max_split_size == UINT64_MAX ||
        (c.max_split_size >= (UINT64_C(20) << 20) &&
         (c.max_split_size & MIB_MASK) == 0));
  CHECK((c.memory_limit & MIB_MASK) == 0 &&
        (c.memory_limit == 0 || c.memory_limit >= (UINT64_C(2) << 20)));
  CHECK(c.verbose >= 0 && c.verbose <= 2);
  free(text);
  return 0;
}
