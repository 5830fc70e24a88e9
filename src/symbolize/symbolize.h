/*
 * Turns captured return addresses into function+offset, module+offset and
 * file:line for the leak report, at report time (at exit, possibly from a
 * destructor). It reads the ELF symbol tables and the DWARF line tables of
 * each loaded object itself, so the library needs no libdw, libbacktrace,
 * zlib or addr2line process: a preloaded library cannot count on any of them
 * being present, and forking at exit is unsafe in many programs.
 *
 * Every read of a file is bounds-checked against its mapped size: a
 * truncated, corrupt or missing file leaves fields empty, never crashes.
 * Thread-safe (no shared state); not async-signal-safe (it allocates, opens
 * and maps files).
 */
#ifndef CA_SYMBOLIZE_H
#define CA_SYMBOLIZE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ca_symbol {
  uintptr_t pc;             /* the return address as captured */
  char module[256];         /* path of the loaded object (the real path for
                               the main program); "" if none */
  uint64_t module_offset;   /* pc - the object's load bias */
  char function[256];       /* demangled when a C++ demangler is present in
                               the process; "" if unknown */
  uint64_t function_offset; /* pc - function start */
  char file[256];           /* source file, with its directory when the line
                               table gives one; "" if unknown */
  unsigned line;            /* 0 if unknown */
} ca_symbol;

/* Symbolizes n return addresses at once, opening and parsing each object
 * file once for all the addresses it holds. Each pc is looked up at pc - 1,
 * inside the call instruction, so the call's own line is found. Fields that
 * cannot be found are left "" or 0. */
void ca_symbolize(const uintptr_t *pcs, size_t n, ca_symbol *out);

/* For tests: symbolizes n addresses as if the object file at `path` were
 * loaded with load bias `bias` (module is set to `path`), so that the parser
 * can be run on truncated or corrupt copies of a real file. */
void ca_symbolize_in_file(const char *path, uintptr_t bias,
                          const uintptr_t *pcs, size_t n, ca_symbol *out);

#endif /* CA_SYMBOLIZE_H */
