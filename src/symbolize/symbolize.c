/*
 * The symbolizer (see symbolize.h): function names from the ELF symbol
 * tables, file:line from the DWARF line tables, both read from object files
 * mapped read-only, with separate debug files found by build-id or
 * .gnu_debuglink. Every byte is read through a bounded reader, so a corrupt
 * file can only make a field come out empty.
 *
 * Compiled as one unit: the files of src/symbolize/ are included below,
 * each one concern, in the order they build on each other.
 */
#include "symbolize/symbolize.h"

#include "support/dl.h"
#include "support/reader.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Only objects of our own class and byte order can be loaded in this
 * process, so only those are parsed. */
#if __ELF_NATIVE_CLASS == 64
#define CA__ELFCLASS ELFCLASS64
#else
#define CA__ELFCLASS ELFCLASS32
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CA__ELFDATA ELFDATA2LSB
#else
#define CA__ELFDATA ELFDATA2MSB
#endif

/* A lookup that lies in no loaded object. */
#define CA__NO_MODULE SIZE_MAX

#include "symbolize/elf.c"
#include "symbolize/functions.c"
#include "symbolize/dwarf_units.c"
#include "symbolize/dwarf_lines.c"
#include "symbolize/objects.c"
