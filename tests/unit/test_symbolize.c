/*
 * The symbolizer: return addresses captured in this very test resolve to
 * the function, the exact line and this file; a libc function resolves to
 * libc; an address in no object leaves every field empty; a batch that
 * mixes objects and duplicates gives what each address gives alone; and
 * truncated or corrupted copies of this binary never crash the parser.
 *
 * Built with -g -O0 (tests/unit/CMakeLists.txt), so that every call keeps
 * its own line and no function here is inlined.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <elf.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "symbolize/symbolize.h"

/* ---- addresses with a known answer --------------------------------------- */

/* Returns the address its caller will return to: a pc as a backtrace would
 * capture it, inside the caller, just after the call. */
__attribute__((noinline)) static uintptr_t return_address(void) {
  return (uintptr_t)__builtin_return_address(0);
}

/* The same, stored: a call with no result to use, so the instruction after
 * it already belongs to the next line, and only a lookup at pc - 1 finds
 * the call's own line. */
__attribute__((noinline)) static void store_return_address(uintptr_t *pc) {
  *pc = (uintptr_t)__builtin_return_address(0);
}

/* A static function: only .symtab names it. Its line is the line it starts
 * on, which is where its first instructions' rows point; the enum shares
 * that line to record it, so the formatter must leave the line alone. */
/* clang-format off */
enum { TARGET_LINE = __LINE__ }; __attribute__((noinline)) static int static_target(int x) {
  return x * 3 + 1;
}
/* clang-format on */

static const char *this_file = "test_symbolize.c";

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void expect_here(const ca_symbol *s, const char *function,
                        unsigned line) {
  if (strcmp(s->function, function) != 0 || !ends_with(s->file, this_file) ||
      s->line != line)
    fail_msg("pc %#lx: got %s %s:%u, want %s ...%s:%u", (unsigned long)s->pc,
             s->function, s->file, s->line, function, this_file, line);
}

static void exe_path(char *buf, size_t len) {
  ssize_t n = readlink("/proc/self/exe", buf, len - 1);
  assert_true(n > 0);
  buf[n] = '\0';
}

/* libc's own `write`, not a sanitizer's interceptor of the same name. */
static uintptr_t libc_write(void) {
  void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  assert_non_null(libc);
  void *fn = dlsym(libc, "write");
  assert_non_null(fn);
  dlclose(libc);
  return (uintptr_t)fn;
}

static bool same_symbol(const ca_symbol *a, const ca_symbol *b) {
  return a->pc == b->pc && strcmp(a->module, b->module) == 0 &&
         a->module_offset == b->module_offset &&
         strcmp(a->function, b->function) == 0 &&
         a->function_offset == b->function_offset &&
         strcmp(a->file, b->file) == 0 && a->line == b->line;
}

/* ---- live process -------------------------------------------------------- */

static void test_return_address_in_this_file(void **state) {
  (void)state;
  uintptr_t pc;
  store_return_address(&pc);
  unsigned line = __LINE__ - 1;
  ca_symbol s;
  ca_symbolize(&pc, 1, &s);
  expect_here(&s, "test_return_address_in_this_file", line);
  char exe[PATH_MAX];
  exe_path(exe, sizeof(exe));
  assert_string_equal(s.module, exe);
  assert_int_equal(s.pc, pc);
  Dl_info info;
  struct link_map *map;
  assert_true(dladdr1((void *)pc, &info, (void **)&map, RTLD_DL_LINKMAP) != 0);
  assert_int_equal(s.module_offset, pc - map->l_addr);
  assert_true(s.function_offset > 0);
}

static void test_static_function(void **state) {
  (void)state;
  assert_int_equal(static_target(1), 4);
  uintptr_t pc = (uintptr_t)&static_target + 2;
  ca_symbol s;
  ca_symbolize(&pc, 1, &s);
  expect_here(&s, "static_target", TARGET_LINE);
  assert_int_equal(s.function_offset, 2);
}

static void test_libc_function(void **state) {
  (void)state;
  uintptr_t pc = libc_write() + 1;
  ca_symbol s;
  ca_symbolize(&pc, 1, &s);
  assert_non_null(strstr(s.module, "libc.so"));
  assert_non_null(strstr(s.function, "write"));
  assert_int_equal(s.function_offset, 1);
  assert_true(s.module_offset > 0);
}

/* Addresses outside every loaded object: the stack, the heap, 0 and 1. */
static void test_address_in_no_module(void **state) {
  (void)state;
  int local = 0;
  void *heap = malloc(64);
  assert_non_null(heap);
  uintptr_t pcs[] = {(uintptr_t)&local, (uintptr_t)heap, 0, 1};
  ca_symbol out[4];
  ca_symbolize(pcs, 4, out);
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(out[i].pc, pcs[i]);
    assert_string_equal(out[i].module, "");
    assert_string_equal(out[i].function, "");
    assert_string_equal(out[i].file, "");
    assert_int_equal(out[i].line, 0);
    assert_int_equal(out[i].module_offset, 0);
    assert_int_equal(out[i].function_offset, 0);
  }
  free(heap);
}

/* A batch gives, in the caller's order, exactly what each pc gives alone,
 * whatever the mix of objects and repeats. */
static void test_batch_mixing_modules(void **state) {
  (void)state;
  uintptr_t here;
  store_return_address(&here);
  unsigned here_line = __LINE__ - 1;
  uintptr_t cmocka = (uintptr_t)dlsym(RTLD_DEFAULT, "_cmocka_run_group_tests");
  assert_true(cmocka != 0);
  int local;
  uintptr_t pcs[] = {libc_write() + 4,
                     here,
                     cmocka + 8,
                     (uintptr_t)&local,
                     here,
                     (uintptr_t)&static_target + 1,
                     libc_write() + 4,
                     cmocka + 8,
                     here,
                     0};
  enum { N = sizeof(pcs) / sizeof(pcs[0]) };
  ca_symbol batch[N], alone;
  ca_symbolize(pcs, N, batch);
  for (size_t i = 0; i < N; i++) {
    ca_symbolize(&pcs[i], 1, &alone);
    if (!same_symbol(&batch[i], &alone))
      fail_msg("entry %zu (pc %#lx): batch %s %s:%u, alone %s %s:%u", i,
               (unsigned long)pcs[i], batch[i].function, batch[i].file,
               batch[i].line, alone.function, alone.file, alone.line);
  }
  expect_here(&batch[1], "test_batch_mixing_modules", here_line);
  assert_non_null(strstr(batch[2].module, "cmocka"));
  assert_string_equal(batch[2].function, "_cmocka_run_group_tests");
  assert_non_null(strstr(batch[0].module, "libc.so"));
  assert_string_equal(batch[3].module, "");
  expect_here(&batch[5], "static_target", TARGET_LINE);
}

/* ---- copies of this binary, whole, truncated and corrupted ----------------
 */

typedef struct image {
  uint8_t *bytes;
  size_t size;
  uintptr_t bias;
  uintptr_t pcs[3];
  ca_symbol want[3];
} image;

static image img;

/* Reads this binary and symbolizes a few of its pcs in the live process: a
 * good copy must give the same answers. */
static int load_image(void **state) {
  (void)state;
  FILE *f = fopen("/proc/self/exe", "rb");
  if (f == NULL)
    return -1;
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || st.st_size <= 0)
    return -1;
  img.size = (size_t)st.st_size;
  img.bytes = malloc(img.size);
  if (img.bytes == NULL || fread(img.bytes, 1, img.size, f) != img.size)
    return -1;
  fclose(f);
  img.pcs[0] = return_address();
  img.pcs[1] = (uintptr_t)&static_target + 3;
  img.pcs[2] = (uintptr_t)&load_image + 1;
  ca_symbolize(img.pcs, 3, img.want);
  img.bias = img.pcs[0] - (uintptr_t)img.want[0].module_offset;
  return 0;
}

static int free_image(void **state) {
  (void)state;
  free(img.bytes);
  return 0;
}

/* Symbolizes img.pcs against `len` bytes of `bytes`, held in a memory file
 * that the symbolizer opens by its /proc path like any object file. */
static void symbolize_copy(const uint8_t *bytes, size_t len, ca_symbol *out) {
  int fd = memfd_create("test_symbolize_copy", 0);
  assert_true(fd >= 0);
  for (size_t done = 0; done < len;) {
    ssize_t n = write(fd, bytes + done, len - done);
    assert_true(n > 0);
    done += (size_t)n;
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ca_symbolize_in_file(path, img.bias, img.pcs, 3, out);
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(out[i].pc, img.pcs[i]);
    assert_string_equal(out[i].module, path);
  }
  close(fd);
}

static void test_whole_copy_matches_live(void **state) {
  (void)state;
  ca_symbol out[3];
  symbolize_copy(img.bytes, img.size, out);
  for (size_t i = 0; i < 3; i++) {
    assert_string_equal(out[i].function, img.want[i].function);
    assert_string_equal(out[i].file, img.want[i].file);
    assert_int_equal(out[i].line, img.want[i].line);
    assert_int_equal(out[i].function_offset, img.want[i].function_offset);
    assert_int_equal(out[i].module_offset, img.want[i].module_offset);
  }
  expect_here(&out[1], "static_target", TARGET_LINE);
}

/* Every prefix length class: inside the ELF header, inside the section
 * headers' targets, at page boundaries (where a read past the end faults)
 * and one byte short of whole. */
static void test_truncated_copies(void **state) {
  (void)state;
  ca_symbol out[3];
  size_t fixed[] = {0, 1, 4, 16, 52, 63, 64, 65, 100, 4096, 8192};
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    if (fixed[i] < img.size)
      symbolize_copy(img.bytes, fixed[i], out);
  for (size_t k = 1; k < 64; k++)
    symbolize_copy(img.bytes, img.size * k / 64, out);
  for (size_t len = 4096; len < img.size;
       len += img.size / 16 / 4096 * 4096 + 4096)
    symbolize_copy(img.bytes, len, out);
  symbolize_copy(img.bytes, img.size - 1, out);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* The file range [*off, *off + *len) of the section called `name`, read
 * with the system's elf.h (the test trusts its own binary). */
static bool find_section(const char *name, size_t *off, size_t *len) {
  Elf64_Ehdr eh;
  memcpy(&eh, img.bytes, sizeof(eh));
  Elf64_Shdr names;
  memcpy(&names, img.bytes + eh.e_shoff + eh.e_shstrndx * sizeof(names),
         sizeof(names));
  for (size_t i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    memcpy(&sh, img.bytes + eh.e_shoff + i * sizeof(sh), sizeof(sh));
    if (strcmp((const char *)img.bytes + names.sh_offset + sh.sh_name, name) ==
        0) {
      *off = sh.sh_offset;
      *len = sh.sh_size;
      return true;
    }
  }
  return false;
}

/* Overwrites `count` random bytes (or runs of one value) in [off, off+len). */
static void scribble(uint8_t *bytes, size_t off, size_t len, int count) {
  static const uint8_t values[] = {0x00, 0xff, 0x7f, 0x80, 0x01};
  for (int i = 0; i < count && len > 0; i++) {
    size_t at = off + rng() % len;
    size_t run = 1 + rng() % 8;
    uint8_t v = rng() % 2 ? (uint8_t)rng() : values[rng() % sizeof(values)];
    for (size_t k = 0; k < run && at + k < off + len; k++)
      bytes[at + k] = v;
  }
}

/* Random damage to the parts the parser reads: the ELF header, the section
 * header table, the symbol and string tables and the line tables. */
static void test_corrupted_copies(void **state) {
  (void)state;
  Elf64_Ehdr eh;
  memcpy(&eh, img.bytes, sizeof(eh));
  struct {
    const char *name;
    size_t off, len;
  } regions[] = {
      {"ELF header", 0, sizeof(eh)},
      {"section headers", eh.e_shoff, (size_t)eh.e_shnum * sizeof(Elf64_Shdr)},
      {".symtab", 0, 0},
      {".strtab", 0, 0},
      {".debug_line", 0, 0},
      {".debug_line_str", 0, 0},
      {".debug_info", 0, 0},
      {".debug_abbrev", 0, 0}};
  enum { R = sizeof(regions) / sizeof(regions[0]) };
  for (size_t r = 2; r < R; r++)
    find_section(regions[r].name, &regions[r].off, &regions[r].len);
  assert_true(regions[4].len > 0); /* built with -g: a line table is there */
  uint8_t *copy = malloc(img.size);
  assert_non_null(copy);
  ca_symbol out[3];
  for (int round = 0; round < 400; round++) {
    memcpy(copy, img.bytes, img.size);
    size_t r = (size_t)round % R;
    scribble(copy, regions[r].off, regions[r].len, 1 + (int)(rng() % 16));
    symbolize_copy(copy, img.size, out);
  }
  /* A line table of nothing but one byte value must end, not spin. */
  static const uint8_t fills[] = {0x00, 0xff, 0x01, 0x80, 0x02};
  for (size_t f = 0; f < sizeof(fills); f++) {
    memcpy(copy, img.bytes, img.size);
    memset(copy + regions[4].off + 4, fills[f], regions[4].len - 4);
    symbolize_copy(copy, img.size, out);
    assert_string_equal(out[1].function, "static_target");
  }
  free(copy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_return_address_in_this_file),
      cmocka_unit_test(test_static_function),
      cmocka_unit_test(test_libc_function),
      cmocka_unit_test(test_address_in_no_module),
      cmocka_unit_test(test_batch_mixing_modules),
      cmocka_unit_test(test_whole_copy_matches_live),
      cmocka_unit_test(test_truncated_copies),
      cmocka_unit_test(test_corrupted_copies),
  };
  return cmocka_run_group_tests(tests, load_image, free_image);
}
