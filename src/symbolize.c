/*
 * The symbolizer (see symbolize.h): function names from the ELF symbol
 * tables, file:line from the DWARF line tables, both read from object files
 * mapped read-only, with separate debug files found by build-id or
 * .gnu_debuglink. Every byte is read through a bounded reader, so a corrupt
 * file can only make a field come out empty.
 */
#include "symbolize.h"

#include "bytes.h"
#include "dl.h"

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

/* A line table entry format never has more (type, form) pairs than this in
 * practice (DWARF 5 defines five content types); more marks a corrupt unit. */
#define CA__MAX_FORMAT 16

/* DW_LNE_define_file entries remembered per line table (DWARF 2-4; producers
 * stopped emitting them long ago). */
#define CA__MAX_DEFINED 8

/* DWARF constants under our own names: the library depends on no dwarf.h. */
enum {
  CA__FORM_ADDR = 0x01,
  CA__FORM_BLOCK2 = 0x03,
  CA__FORM_BLOCK4 = 0x04,
  CA__FORM_DATA2 = 0x05,
  CA__FORM_DATA4 = 0x06,
  CA__FORM_DATA8 = 0x07,
  CA__FORM_STRING = 0x08,
  CA__FORM_BLOCK = 0x09,
  CA__FORM_BLOCK1 = 0x0a,
  CA__FORM_DATA1 = 0x0b,
  CA__FORM_FLAG = 0x0c,
  CA__FORM_SDATA = 0x0d,
  CA__FORM_STRP = 0x0e,
  CA__FORM_UDATA = 0x0f,
  CA__FORM_REF_ADDR = 0x10,
  CA__FORM_REF1 = 0x11,
  CA__FORM_REF2 = 0x12,
  CA__FORM_REF4 = 0x13,
  CA__FORM_REF8 = 0x14,
  CA__FORM_REF_UDATA = 0x15,
  CA__FORM_INDIRECT = 0x16,
  CA__FORM_SEC_OFFSET = 0x17,
  CA__FORM_EXPRLOC = 0x18,
  CA__FORM_FLAG_PRESENT = 0x19,
  CA__FORM_STRX = 0x1a,
  CA__FORM_ADDRX = 0x1b,
  CA__FORM_REF_SUP4 = 0x1c,
  CA__FORM_STRP_SUP = 0x1d,
  CA__FORM_DATA16 = 0x1e,
  CA__FORM_LINE_STRP = 0x1f,
  CA__FORM_REF_SIG8 = 0x20,
  CA__FORM_IMPLICIT_CONST = 0x21,
  CA__FORM_LOCLISTX = 0x22,
  CA__FORM_RNGLISTX = 0x23,
  CA__FORM_REF_SUP8 = 0x24,
  CA__FORM_STRX1 = 0x25,
  CA__FORM_STRX2 = 0x26,
  CA__FORM_STRX3 = 0x27,
  CA__FORM_STRX4 = 0x28,
  CA__FORM_ADDRX1 = 0x29,
  CA__FORM_ADDRX2 = 0x2a,
  CA__FORM_ADDRX3 = 0x2b,
  CA__FORM_ADDRX4 = 0x2c,
  CA__FORM_GNU_ADDR_INDEX = 0x1f01,
  CA__FORM_GNU_STR_INDEX = 0x1f02,
  CA__FORM_GNU_REF_ALT = 0x1f20,
  CA__FORM_GNU_STRP_ALT = 0x1f21,
};

enum {
  CA__AT_STMT_LIST = 0x10,
  CA__AT_COMP_DIR = 0x1b,
  CA__UT_COMPILE = 0x01,
  CA__UT_PARTIAL = 0x03,
  CA__UT_SKELETON = 0x04,
  CA__LNCT_PATH = 0x1,
  CA__LNCT_DIRECTORY_INDEX = 0x2,
};

enum {
  CA__LNS_COPY = 1,
  CA__LNS_ADVANCE_PC = 2,
  CA__LNS_ADVANCE_LINE = 3,
  CA__LNS_SET_FILE = 4,
  CA__LNS_CONST_ADD_PC = 8,
  CA__LNS_FIXED_ADVANCE_PC = 9,
  CA__LNE_END_SEQUENCE = 1,
  CA__LNE_SET_ADDRESS = 2,
  CA__LNE_DEFINE_FILE = 3,
};

/* ---- bounded reader ------------------------------------------------------ */

/* A NUL-terminated string at the reader, or NULL when the NUL is missing. */
static const char *ca__str(ca_rd *r) {
  size_t left = ca_rd_left(r);
  const uint8_t *nul = left ? memchr(r->p, 0, left) : NULL;
  if (nul == NULL) {
    r->bad = true;
    r->p = r->end;
    return NULL;
  }
  const char *s = (const char *)r->p;
  r->p = nul + 1;
  return s;
}

/* ---- mapped ELF files ---------------------------------------------------- */

typedef struct ca__sect {
  const uint8_t *p;
  size_t n;
} ca__sect;

/* The string at offset `off` of a string section, or NULL when it does not
 * lie whole inside it. */
static const char *ca__str_at(const ca__sect *s, uint64_t off) {
  if (s->p == NULL || off >= s->n)
    return NULL;
  ca_rd r = ca_rd_make(s->p + off, s->n - (size_t)off);
  return ca__str(&r);
}

typedef struct ca__elf {
  const uint8_t *base;
  size_t size;
  ca__sect symtab, strtab, dynsym, dynstr;
  ca__sect line, line_str, str, info, abbrev;
  ca__sect build_id;
  const char *debuglink;
  bool has_crc;
  uint32_t debuglink_crc;
} ca__elf;

static bool ca__map_file(const char *path, ca__elf *e) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
      (uint64_t)st.st_size <= SIZE_MAX)
    p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return false;
  e->base = p;
  e->size = (size_t)st.st_size;
  return true;
}

static void ca__elf_close(ca__elf *e) {
  if (e->base != NULL)
    munmap((void *)e->base, e->size);
  e->base = NULL;
}

/* Section header `i`, copied out because a corrupt e_shoff may leave it
 * misaligned. */
static bool ca__shdr(const ca__elf *e, const ElfW(Ehdr) * eh, uint64_t i,
                     ElfW(Shdr) * sh) {
  uint64_t off = eh->e_shoff + i * sizeof(*sh);
  if (eh->e_shoff > e->size || i > e->size / sizeof(*sh) || off > e->size ||
      e->size - off < sizeof(*sh))
    return false;
  memcpy(sh, e->base + off, sizeof(*sh));
  return true;
}

/* The bytes of a section. Sections that are absent from the file (NOBITS, as
 * in a debug file's code) or compressed (SHF_COMPRESSED: we carry no inflate)
 * read as empty. */
static ca__sect ca__sect_of(const ca__elf *e, const ElfW(Shdr) * sh) {
  ca__sect s = {NULL, 0};
  if (sh->sh_type == SHT_NOBITS || (sh->sh_flags & SHF_COMPRESSED) ||
      sh->sh_offset > e->size || sh->sh_size > e->size - sh->sh_offset)
    return s;
  s.p = e->base + sh->sh_offset;
  s.n = (size_t)sh->sh_size;
  return s;
}

/* The section count and the index of the section-name table, which live in
 * section 0 when they do not fit the ELF header's 16-bit fields. */
static bool ca__shcounts(const ca__elf *e, const ElfW(Ehdr) * eh,
                         uint64_t *shnum, uint64_t *shstrndx) {
  *shnum = eh->e_shnum;
  *shstrndx = eh->e_shstrndx;
  if (*shnum != 0 && *shstrndx != SHN_XINDEX)
    return true;
  ElfW(Shdr) sh0;
  if (!ca__shdr(e, eh, 0, &sh0))
    return false;
  if (*shnum == 0)
    *shnum = sh0.sh_size;
  if (*shstrndx == SHN_XINDEX)
    *shstrndx = sh0.sh_link;
  return true;
}

/* Finds NT_GNU_BUILD_ID among the notes of one SHT_NOTE section. */
static void ca__scan_notes(ca__elf *e, ca__sect notes, uint64_t align) {
  size_t pad = align == 8 ? 8 : 4;
  ca_rd r = ca_rd_make(notes.p, notes.n);
  while (ca_rd_left(&r) >= 12) {
    uint32_t namesz = (uint32_t)ca_rd_uint(&r, 4);
    uint32_t descsz = (uint32_t)ca_rd_uint(&r, 4);
    uint32_t type = (uint32_t)ca_rd_uint(&r, 4);
    const uint8_t *name = r.p;
    ca_rd_skip(&r, ((uint64_t)namesz + pad - 1) / pad * pad);
    const uint8_t *desc = r.p;
    if (!ca_rd_skip(&r, ((uint64_t)descsz + pad - 1) / pad * pad))
      return;
    if (type == NT_GNU_BUILD_ID && namesz == 4 && memcmp(name, "GNU", 4) == 0) {
      e->build_id.p = desc;
      e->build_id.n = descsz;
      return;
    }
  }
}

/* .gnu_debuglink: a file name, padded to 4 bytes, then the file's CRC-32. */
static void ca__read_debuglink(ca__elf *e, ca__sect s) {
  ca_rd r = ca_rd_make(s.p, s.n);
  const char *name = ca__str(&r);
  if (name == NULL || name[0] == '\0')
    return;
  e->debuglink = name;
  size_t used = (size_t)(r.p - s.p);
  ca_rd_skip(&r, (4 - used % 4) % 4);
  if (ca_rd_left(&r) >= 4) {
    e->debuglink_crc = (uint32_t)ca_rd_uint(&r, 4);
    e->has_crc = true;
  }
}

/* Records the sections the symbolizer reads, by name. */
static void ca__note_section(ca__elf *e, const ElfW(Ehdr) * eh,
                             const ElfW(Shdr) * sh, const char *name) {
  ca__sect s = ca__sect_of(e, sh);
  if (sh->sh_type == SHT_SYMTAB || sh->sh_type == SHT_DYNSYM) {
    ElfW(Shdr) strs;
    if (!ca__shdr(e, eh, sh->sh_link, &strs))
      return;
    bool dyn = sh->sh_type == SHT_DYNSYM;
    *(dyn ? &e->dynsym : &e->symtab) = s;
    *(dyn ? &e->dynstr : &e->strtab) = ca__sect_of(e, &strs);
  } else if (sh->sh_type == SHT_NOTE) {
    ca__scan_notes(e, s, sh->sh_addralign);
  } else if (strcmp(name, ".debug_line") == 0) {
    e->line = s;
  } else if (strcmp(name, ".debug_line_str") == 0) {
    e->line_str = s;
  } else if (strcmp(name, ".debug_str") == 0) {
    e->str = s;
  } else if (strcmp(name, ".debug_info") == 0) {
    e->info = s;
  } else if (strcmp(name, ".debug_abbrev") == 0) {
    e->abbrev = s;
  } else if (strcmp(name, ".gnu_debuglink") == 0) {
    ca__read_debuglink(e, s);
  }
}

static bool ca__elf_header(const ca__elf *e, ElfW(Ehdr) * eh) {
  if (e->size < sizeof(*eh))
    return false;
  memcpy(eh, e->base, sizeof(*eh));
  return memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
         eh->e_ident[EI_CLASS] == CA__ELFCLASS &&
         eh->e_ident[EI_DATA] == CA__ELFDATA &&
         (eh->e_type == ET_EXEC || eh->e_type == ET_DYN) &&
         eh->e_shentsize == sizeof(ElfW(Shdr));
}

/* Finds the sections of a mapped file; false when it is not an ELF object
 * of ours. */
static bool ca__elf_parse(ca__elf *e) {
  ElfW(Ehdr) eh;
  uint64_t shnum, shstrndx;
  ElfW(Shdr) names_hdr;
  if (!ca__elf_header(e, &eh))
    return false;
  if (eh.e_shoff == 0)
    return true; /* No section headers: nothing to read, not an error. */
  if (!ca__shcounts(e, &eh, &shnum, &shstrndx) ||
      !ca__shdr(e, &eh, shstrndx, &names_hdr))
    return true;
  ca__sect names = ca__sect_of(e, &names_hdr);
  for (uint64_t i = 1; i < shnum; i++) {
    ElfW(Shdr) sh;
    if (!ca__shdr(e, &eh, i, &sh))
      break;
    const char *name = ca__str_at(&names, sh.sh_name);
    ca__note_section(e, &eh, &sh, name != NULL ? name : "");
  }
  return true;
}

static bool ca__elf_open(const char *path, ca__elf *e) {
  memset(e, 0, sizeof(*e));
  if (!ca__map_file(path, e))
    return false;
  if (ca__elf_parse(e))
    return true;
  ca__elf_close(e);
  return false;
}

/* ---- lookups ------------------------------------------------------------- */

typedef struct ca__lookup {
  uintptr_t pc;
  uintptr_t bias;
  size_t module; /* the object's rank in dl_iterate_phdr's order */
  bool main_program;
  size_t out;    /* index in the caller's arrays */
  uint64_t addr; /* pc - 1 - bias: inside the call, in the file's terms */
  /* The symbol found so far (its name points into a mapping). */
  const char *sym;
  uint64_t sym_start;
  /* The nearest symbol starting after the previous lookup's address and at
   * or before this one's, for symbols of size 0 (see ca__settle_sizeless). */
  const char *near;
  uint64_t near_start;
  uint64_t near_size;
  bool line_done;
} ca__lookup;

static int ca__by_module_addr(const void *a, const void *b) {
  const ca__lookup *x = a, *y = b;
  if (x->module != y->module)
    return x->module < y->module ? -1 : 1;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->out < y->out ? -1 : x->out > y->out;
}

/* The first lookup whose address is >= addr (lookups sorted by address). */
static size_t ca__lower_bound(const ca__lookup *lk, size_t n, uint64_t addr) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (lk[mid].addr < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* ---- function names ------------------------------------------------------ */

static size_t ca__underscores(const char *s) {
  size_t k = 0;
  while (s[k] == '_')
    k++;
  return k;
}

/* Of two aliases at one address (write, __write, __GI___write), the one with
 * the fewest leading underscores is the name the program called; a name
 * with a version glued on (shm_open@GLIBC_2.2.5, from .symver) comes last. */
static bool ca__nicer(const char *name, const char *than) {
  if (than == NULL)
    return true;
  bool versioned = strchr(name, '@') != NULL;
  if (versioned != (strchr(than, '@') != NULL))
    return !versioned;
  return ca__underscores(name) < ca__underscores(than);
}

/* A symbol being offered to the lookups. Its name is looked up only when
 * the symbol is kept, which few of a large object's symbols are. */
typedef struct ca__offered {
  uint64_t start;
  uint64_t size;
  const ca__sect *strs;
  uint64_t name_off;
  const char *name;
  bool looked_up;
} ca__offered;

/* The symbol's name; NULL when it is empty or lies outside the table. */
static const char *ca__offered_name(ca__offered *o) {
  if (!o->looked_up) {
    o->name = ca__str_at(o->strs, o->name_off);
    if (o->name != NULL && o->name[0] == '\0')
      o->name = NULL;
    o->looked_up = true;
  }
  return o->name;
}

/* Nearest-start candidates: the later start wins, then the sized symbol
 * (see ca__settle_sizeless), then the nicer name. */
static bool ca__beats_near(ca__offered *o, const ca__lookup *c) {
  if (c->near != NULL &&
      (o->start < c->near_start ||
       (o->start == c->near_start && o->size < c->near_size)))
    return false;
  const char *name = ca__offered_name(o);
  return name != NULL && (c->near == NULL || o->start > c->near_start ||
                          o->size > c->near_size || ca__nicer(name, c->near));
}

/* Containing symbols: the innermost (latest start) wins, then the nicer
 * name. */
static bool ca__beats_sym(ca__offered *o, const ca__lookup *l) {
  if (l->sym != NULL && o->start < l->sym_start)
    return false;
  const char *name = ca__offered_name(o);
  return name != NULL &&
         (l->sym == NULL || o->start > l->sym_start || ca__nicer(name, l->sym));
}

/* Offers one function symbol to the lookups: it names those it contains,
 * and becomes the nearest-start candidate of the first lookup past it. */
static void ca__symbol_offer(ca__lookup *lk, size_t n, ca__offered *o) {
  size_t i = ca__lower_bound(lk, n, o->start);
  if (i == n)
    return;
  if (ca__beats_near(o, &lk[i])) {
    lk[i].near = o->name;
    lk[i].near_start = o->start;
    lk[i].near_size = o->size;
  }
  uint64_t end =
      o->start + o->size < o->start ? UINT64_MAX : o->start + o->size;
  for (size_t j = i; j < n && lk[j].addr < end; j++) {
    if (ca__beats_sym(o, &lk[j])) {
      lk[j].sym = o->name;
      lk[j].sym_start = o->start;
    }
  }
}

static void ca__offer_table(ca__lookup *lk, size_t n, const ca__sect *syms,
                            const ca__sect *strs) {
  size_t count = syms->p != NULL ? syms->n / sizeof(ElfW(Sym)) : 0;
  for (size_t i = 0; i < count; i++) {
    ElfW(Sym) s;
    memcpy(&s, syms->p + i * sizeof(s), sizeof(s));
    unsigned type = s.st_info & 0xf; /* ELF32_ST_TYPE and ELF64_ST_TYPE agree */
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) ||
        s.st_shndx == SHN_UNDEF || s.st_value == 0)
      continue;
    ca__offered o = {s.st_value, s.st_size, strs, s.st_name, NULL, false};
    ca__symbol_offer(lk, n, &o);
  }
}

/* Hand-written assembly often leaves st_size 0: an address that no sized
 * symbol contains takes the nearest symbol starting at or before it, but only
 * when that one is sizeless (after a sized one it lies in a gap). The
 * candidates were filed at the first lookup past their start, so the
 * nearest for each lookup is the latest candidate at or before it. */
static void ca__settle_sizeless(ca__lookup *lk, size_t n) {
  const ca__lookup *best = NULL;
  for (size_t j = 0; j < n; j++) {
    if (lk[j].near != NULL)
      best = &lk[j];
    if (lk[j].sym == NULL && best != NULL && best->near_size == 0) {
      lk[j].sym = best->near;
      lk[j].sym_start = best->near_start;
    }
  }
}

typedef char *(*ca__demangle_fn)(const char *, char *, size_t *, int *);

static void ca__copy(char *dst, size_t cap, const char *src) {
  size_t len = strnlen(src, cap - 1);
  memcpy(dst, src, len);
  dst[len] = '\0';
}

/* The C++ runtime's demangler: from the global scope; else from a libstdc++
 * the process loaded privately (Python loads extension modules, and so
 * PyTorch's libstdc++, with RTLD_LOCAL); else from libstdc++ loaded for the
 * purpose, since even a C-looking CUDA program is C++ to nvcc and its names
 * are mangled. Reports are rare; unreadable names cost the reader more.
 * NULL when there is no libstdc++ at all. */
static ca__demangle_fn ca__demangler(void) {
  void *fn = ca_dl_sym(RTLD_DEFAULT, "__cxa_demangle");
  if (fn == NULL) {
    void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == NULL)
      lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (lib != NULL)
      fn = ca_dl_sym(lib, "__cxa_demangle");
  }
  ca__demangle_fn demangle = NULL;
  memcpy(&demangle, &fn, sizeof(fn));
  return demangle;
}

/* The demangled name when the process carries a C++ runtime, else the
 * symbol as it is. */
static void ca__set_function(char *dst, size_t cap, const char *name,
                             ca__demangle_fn demangle) {
  char *plain = NULL;
  int status = -1;
  if (demangle != NULL && name[0] == '_' && name[1] == 'Z')
    plain = demangle(name, NULL, NULL, &status);
  ca__copy(dst, cap, plain != NULL && status == 0 ? plain : name);
  free(plain);
}

static void ca__put_functions(const ca__lookup *lk, size_t n, ca_symbol *out,
                              ca__demangle_fn demangle) {
  for (size_t j = 0; j < n; j++) {
    if (lk[j].sym == NULL)
      continue;
    ca_symbol *s = &out[lk[j].out];
    ca__set_function(s->function, sizeof(s->function), lk[j].sym, demangle);
    s->function_offset = lk[j].addr + 1 - lk[j].sym_start;
  }
}

/* ---- DWARF attribute values ---------------------------------------------- */

typedef struct ca__form_ctx {
  const ca__elf *e;
  unsigned version;
  unsigned offset_size; /* 4, or 8 for DWARF64 */
  unsigned addr_size;
} ca__form_ctx;

typedef struct ca__val {
  uint64_t u;
  const char *s;
} ca__val;

/* The size of a fixed-size form, 0 for the others. */
static size_t ca__fixed_size(uint64_t form, const ca__form_ctx *c) {
  switch (form) {
  case CA__FORM_DATA1:
  case CA__FORM_REF1:
  case CA__FORM_FLAG:
  case CA__FORM_STRX1:
  case CA__FORM_ADDRX1:
    return 1;
  case CA__FORM_DATA2:
  case CA__FORM_REF2:
  case CA__FORM_STRX2:
  case CA__FORM_ADDRX2:
    return 2;
  case CA__FORM_STRX3:
  case CA__FORM_ADDRX3:
    return 3;
  case CA__FORM_DATA4:
  case CA__FORM_REF4:
  case CA__FORM_STRX4:
  case CA__FORM_ADDRX4:
  case CA__FORM_REF_SUP4:
    return 4;
  case CA__FORM_DATA8:
  case CA__FORM_REF8:
  case CA__FORM_REF_SIG8:
  case CA__FORM_REF_SUP8:
    return 8;
  case CA__FORM_DATA16:
    return 16;
  case CA__FORM_ADDR:
    return c->addr_size;
  case CA__FORM_REF_ADDR:
    return c->version <= 2 ? c->addr_size : c->offset_size;
  case CA__FORM_SEC_OFFSET:
  case CA__FORM_STRP_SUP:
  case CA__FORM_GNU_REF_ALT:
  case CA__FORM_GNU_STRP_ALT:
    return c->offset_size;
  default:
    return 0;
  }
}

/* Skips a block whose length comes first, in `len_size` bytes (0: ULEB128). */
static void ca__skip_block(ca_rd *r, size_t len_size) {
  uint64_t len = len_size == 0 ? ca_rd_uleb(r) : ca_rd_uint(r, len_size);
  ca_rd_skip(r, len);
}

/* Reads one value of `form`: strings into v->s (NULL when they need a
 * section we do not read, as .debug_str_offsets), integers into v->u, the
 * rest skipped. False for a form we do not know, whose size is unknown. */
static bool ca__read_form(ca_rd *r, uint64_t form, const ca__form_ctx *c,
                          ca__val *v) {
  v->u = 0;
  v->s = NULL;
  size_t fixed = ca__fixed_size(form, c);
  if (fixed != 0) {
    if (fixed <= 8)
      v->u = ca_rd_uint(r, fixed);
    else
      ca_rd_skip(r, fixed);
    return !r->bad;
  }
  switch (form) {
  case CA__FORM_STRING:
    v->s = ca__str(r);
    break;
  case CA__FORM_STRP:
    v->s = ca__str_at(&c->e->str, ca_rd_uint(r, c->offset_size));
    break;
  case CA__FORM_LINE_STRP:
    v->s = ca__str_at(&c->e->line_str, ca_rd_uint(r, c->offset_size));
    break;
  case CA__FORM_UDATA:
  case CA__FORM_REF_UDATA:
  case CA__FORM_STRX:
  case CA__FORM_ADDRX:
  case CA__FORM_LOCLISTX:
  case CA__FORM_RNGLISTX:
  case CA__FORM_GNU_ADDR_INDEX:
  case CA__FORM_GNU_STR_INDEX:
    v->u = ca_rd_uleb(r);
    break;
  case CA__FORM_SDATA:
    v->u = (uint64_t)ca_rd_sleb(r);
    break;
  case CA__FORM_BLOCK:
  case CA__FORM_EXPRLOC:
    ca__skip_block(r, 0);
    break;
  case CA__FORM_BLOCK1:
    ca__skip_block(r, 1);
    break;
  case CA__FORM_BLOCK2:
    ca__skip_block(r, 2);
    break;
  case CA__FORM_BLOCK4:
    ca__skip_block(r, 4);
    break;
  case CA__FORM_FLAG_PRESENT:
    v->u = 1;
    break;
  default:
    return false; /* Includes indirect and implicit_const: callers handle them.
                   */
  }
  return !r->bad;
}

/* Reads a value whose form may be DW_FORM_indirect (the form comes first). */
static bool ca__read_attr(ca_rd *r, uint64_t form, const ca__form_ctx *c,
                          ca__val *v) {
  if (form == CA__FORM_INDIRECT)
    form = ca_rd_uleb(r);
  return form != CA__FORM_INDIRECT && ca__read_form(r, form, c, v);
}

/* ---- compilation directories (DWARF 2-4 line tables leave them out) ------ */

/* Reads a unit's length (32- or 64-bit DWARF); false when it runs past the
 * section, which ends the walk over units. */
static bool ca__unit_length(ca_rd *r, unsigned *offset_size,
                            const uint8_t **end) {
  uint64_t len = ca_rd_uint(r, 4);
  *offset_size = 4;
  if (len == 0xffffffffu) {
    len = ca_rd_uint(r, 8);
    *offset_size = 8;
  } else if (len >= 0xfffffff0u) {
    return false; /* Reserved lengths. */
  }
  if (r->bad || len > ca_rd_left(r))
    return false;
  *end = r->p + len;
  return true;
}

/* Positions `a` at the attribute list of abbreviation `code`. */
static bool ca__find_abbrev(ca_rd *a, uint64_t code) {
  while (ca_rd_left(a) > 0) {
    uint64_t c = ca_rd_uleb(a);
    if (c == 0)
      return false;
    ca_rd_uleb(a);    /* tag */
    ca_rd_skip(a, 1); /* has children */
    if (c == code)
      return !a->bad;
    for (;;) {
      uint64_t attr = ca_rd_uleb(a), form = ca_rd_uleb(a);
      if (form == CA__FORM_IMPLICIT_CONST)
        ca_rd_sleb(a);
      if ((attr == 0 && form == 0) || a->bad)
        break;
    }
  }
  return false;
}

/* Reads DW_AT_comp_dir and DW_AT_stmt_list of the unit's first entry. */
static void ca__cu_attrs(const ca__form_ctx *c, ca_rd *die, ca_rd *abbrev,
                         const char **comp_dir, uint64_t *stmt_list) {
  while (ca_rd_left(abbrev) > 0) {
    uint64_t attr = ca_rd_uleb(abbrev), form = ca_rd_uleb(abbrev);
    if (attr == 0 && form == 0)
      return;
    ca__val v = {0, NULL};
    if (form == CA__FORM_IMPLICIT_CONST)
      v.u = (uint64_t)ca_rd_sleb(abbrev);
    else if (!ca__read_attr(die, form, c, &v))
      return;
    if (attr == CA__AT_COMP_DIR)
      *comp_dir = v.s;
    else if (attr == CA__AT_STMT_LIST)
      *stmt_list = v.u;
  }
}

/* Reads one compile unit header and its first entry's attributes. */
static bool ca__cu_comp_dir(const ca__elf *e, unsigned offset_size,
                            ca_rd *unit, const char **dir,
                            uint64_t *stmt_list) {
  ca__form_ctx c = {e, 0, offset_size, 0};
  c.version = (unsigned)ca_rd_uint(unit, 2);
  uint64_t abbrev_off;
  if (c.version >= 5) {
    unsigned type = (unsigned)ca_rd_uint(unit, 1);
    c.addr_size = (unsigned)ca_rd_uint(unit, 1);
    abbrev_off = ca_rd_uint(unit, c.offset_size);
    if (type != CA__UT_COMPILE && type != CA__UT_PARTIAL &&
        type != CA__UT_SKELETON)
      return false;
    if (type == CA__UT_SKELETON)
      ca_rd_skip(unit, 8); /* dwo_id */
  } else {
    abbrev_off = ca_rd_uint(unit, c.offset_size);
    c.addr_size = (unsigned)ca_rd_uint(unit, 1);
  }
  if (unit->bad || c.version < 2 || c.version > 5 || abbrev_off >= e->abbrev.n)
    return false;
  ca_rd abbrev =
      ca_rd_make(e->abbrev.p + abbrev_off, e->abbrev.n - abbrev_off);
  if (!ca__find_abbrev(&abbrev, ca_rd_uleb(unit)))
    return false;
  ca__cu_attrs(&c, unit, &abbrev, dir, stmt_list);
  return true;
}

/* The DW_AT_comp_dir of the unit whose line table is at `line_offset`. */
static const char *ca__comp_dir(const ca__elf *e, uint64_t line_offset) {
  ca_rd r = ca_rd_make(e->info.p, e->info.n);
  if (e->info.p == NULL || e->abbrev.p == NULL)
    return NULL;
  while (ca_rd_left(&r) > 0) {
    unsigned offset_size;
    const uint8_t *end;
    if (!ca__unit_length(&r, &offset_size, &end))
      return NULL;
    ca_rd unit = {r.p, end, false};
    const char *dir = NULL;
    uint64_t stmt_list = UINT64_MAX;
    if (ca__cu_comp_dir(e, offset_size, &unit, &dir, &stmt_list) &&
        stmt_list == line_offset)
      return dir;
    r.p = end;
  }
  return NULL;
}

/* ---- line table headers -------------------------------------------------- */

/* A DWARF 5 directory or file table: its entry format and its entries. */
typedef struct ca__table {
  const uint8_t *p;
  uint64_t count;
  unsigned nformat;
  uint64_t type[CA__MAX_FORMAT];
  uint64_t form[CA__MAX_FORMAT];
} ca__table;

typedef struct ca__unit {
  ca__form_ctx c;
  uint64_t offset; /* of the unit in .debug_line */
  unsigned min_inst, max_ops, line_range, opcode_base;
  int line_base;
  const uint8_t *std_lengths;
  const uint8_t *program, *end;
  /* DWARF 5 tables; for 2-4, dirs.p and files.p mark the string lists. */
  ca__table dirs, files;
  /* DWARF 2-4 only. */
  const char *defined[CA__MAX_DEFINED];
  uint64_t defined_dir[CA__MAX_DEFINED];
  unsigned ndefined;
  const char *comp_dir;
  bool comp_dir_known;
} ca__unit;

/* Line table entries may use only forms that take at least one byte, so a
 * corrupt entry count cannot make a walk spin without reading. */
static bool ca__entry_form_ok(uint64_t form) {
  switch (form) {
  case CA__FORM_STRING:
  case CA__FORM_LINE_STRP:
  case CA__FORM_STRP:
  case CA__FORM_STRX:
  case CA__FORM_STRX1:
  case CA__FORM_STRX2:
  case CA__FORM_STRX3:
  case CA__FORM_STRX4:
  case CA__FORM_UDATA:
  case CA__FORM_SDATA:
  case CA__FORM_DATA1:
  case CA__FORM_DATA2:
  case CA__FORM_DATA4:
  case CA__FORM_DATA8:
  case CA__FORM_DATA16:
  case CA__FORM_BLOCK:
  case CA__FORM_BLOCK1:
  case CA__FORM_BLOCK2:
  case CA__FORM_BLOCK4:
    return true;
  default:
    return false;
  }
}

/* Reads the entry of a DWARF 5 table at the reader, leaving its path and
 * directory index. */
static void ca__table_entry(ca_rd *r, const ca__table *t,
                            const ca__form_ctx *c, const char **path,
                            uint64_t *dir) {
  for (unsigned k = 0; k < t->nformat && !r->bad; k++) {
    ca__val v;
    if (!ca__read_form(r, t->form[k], c, &v)) {
      r->bad = true;
      return;
    }
    if (t->type[k] == CA__LNCT_PATH)
      *path = v.s;
    else if (t->type[k] == CA__LNCT_DIRECTORY_INDEX)
      *dir = v.u;
  }
}

/* Reads a DWARF 5 entry format and walks past the entries that follow it. */
static bool ca__read_table(ca_rd *h, const ca__form_ctx *c, ca__table *t) {
  t->nformat = (unsigned)ca_rd_uint(h, 1);
  if (t->nformat > CA__MAX_FORMAT)
    return false;
  for (unsigned k = 0; k < t->nformat; k++) {
    t->type[k] = ca_rd_uleb(h);
    t->form[k] = ca_rd_uleb(h);
    if (!ca__entry_form_ok(t->form[k]))
      return false;
  }
  t->count = ca_rd_uleb(h);
  t->p = h->p;
  if (t->count > 0 && t->nformat == 0)
    return false;
  for (uint64_t i = 0; i < t->count && !h->bad; i++) {
    const char *path;
    uint64_t dir;
    ca__table_entry(h, t, c, &path, &dir);
  }
  return !h->bad;
}

/* Walks past a DWARF 2-4 include_directories or file_names list, which ends
 * with an empty string; file entries carry three ULEB128s after the name. */
static bool ca__skip_v4_list(ca_rd *h, bool files, uint64_t *count) {
  *count = 0;
  for (;;) {
    const char *s = ca__str(h);
    if (s == NULL)
      return false;
    if (s[0] == '\0')
      return true;
    if (files) {
      ca_rd_uleb(h);
      ca_rd_uleb(h);
      ca_rd_uleb(h);
    }
    (*count)++;
  }
}

/* Parses a line table header, from after its unit length up to its
 * program. */
static bool ca__unit_header(ca_rd *h, ca__unit *u) {
  u->c.version = (unsigned)ca_rd_uint(h, 2);
  if (u->c.version < 2 || u->c.version > 5)
    return false;
  if (u->c.version >= 5) {
    u->c.addr_size = (unsigned)ca_rd_uint(h, 1);
    ca_rd_skip(h, 1); /* segment selector size */
  }
  uint64_t header_len = ca_rd_uint(h, u->c.offset_size);
  if (h->bad || header_len > ca_rd_left(h))
    return false;
  u->program = h->p + header_len;
  h->end = u->program;
  u->min_inst = (unsigned)ca_rd_uint(h, 1);
  u->max_ops = u->c.version >= 4 ? (unsigned)ca_rd_uint(h, 1) : 1;
  ca_rd_skip(h, 1); /* default_is_stmt */
  u->line_base = (int8_t)ca_rd_uint(h, 1);
  u->line_range = (unsigned)ca_rd_uint(h, 1);
  u->opcode_base = (unsigned)ca_rd_uint(h, 1);
  u->std_lengths = h->p;
  if (h->bad || u->line_range == 0 || u->opcode_base == 0 ||
      !ca_rd_skip(h, u->opcode_base - 1))
    return false;
  if (u->max_ops == 0)
    u->max_ops = 1;
  if (u->c.version >= 5)
    return ca__read_table(h, &u->c, &u->dirs) &&
           ca__read_table(h, &u->c, &u->files);
  u->dirs.p = h->p;
  if (!ca__skip_v4_list(h, false, &u->dirs.count))
    return false;
  u->files.p = h->p;
  return ca__skip_v4_list(h, true, &u->files.count);
}

/* ---- file names ---------------------------------------------------------- */

static void ca__append(char *dst, size_t cap, size_t *len, const char *s) {
  if (*len > 0 && dst[*len - 1] != '/' && *len + 1 < cap)
    dst[(*len)++] = '/';
  size_t k = strnlen(s, cap - 1 - *len);
  memcpy(dst + *len, s, k);
  *len += k;
  dst[*len] = '\0';
}

/* Writes name, prefixed by dir when name is relative, and by comp when dir
 * is relative too (DWARF resolves relative directories against the
 * compilation directory). */
static void ca__compose(char *dst, size_t cap, const char *comp,
                        const char *dir, const char *name) {
  size_t len = 0;
  dst[0] = '\0';
  if (name[0] != '/') {
    bool dir_abs = dir != NULL && dir[0] == '/';
    if (!dir_abs && comp != NULL && comp[0] != '\0')
      ca__append(dst, cap, &len, comp);
    if (dir != NULL && dir[0] != '\0')
      ca__append(dst, cap, &len, dir);
  }
  ca__append(dst, cap, &len, name);
}

/* The path of entry `index` of a DWARF 5 table (and its directory index). */
static const char *ca__v5_path(const ca__unit *u, const ca__table *t,
                               uint64_t index, uint64_t *dir) {
  if (index >= t->count)
    return NULL;
  ca_rd r = {t->p, u->program, false};
  const char *path = NULL;
  for (uint64_t i = 0; i <= index && !r.bad; i++) {
    path = NULL;
    ca__table_entry(&r, t, &u->c, &path, dir);
  }
  return r.bad ? NULL : path;
}

/* DWARF 5: file entries are numbered from 0, directory 0 is the compilation
 * directory. */
static void ca__v5_file(const ca__unit *u, uint64_t file, char *dst,
                        size_t cap) {
  uint64_t dir = 0, unused;
  const char *name = ca__v5_path(u, &u->files, file, &dir);
  if (name == NULL)
    return;
  const char *comp = ca__v5_path(u, &u->dirs, 0, &unused);
  const char *dpath = dir == 0 ? NULL : ca__v5_path(u, &u->dirs, dir, &unused);
  ca__compose(dst, cap, comp, dpath, name);
}

/* Returns the `index`th (from 1) string of a DWARF 2-4 list, and for file
 * entries their directory index. */
static const char *ca__v4_entry(const ca__unit *u, const uint8_t *list,
                                bool files, uint64_t index, uint64_t *dir) {
  ca_rd r = {list, u->program, false};
  for (uint64_t i = 1; !r.bad; i++) {
    const char *s = ca__str(&r);
    if (s == NULL || s[0] == '\0')
      return NULL;
    uint64_t d = files ? ca_rd_uleb(&r) : 0;
    if (files) {
      ca_rd_uleb(&r);
      ca_rd_uleb(&r);
    }
    if (i == index) {
      *dir = d;
      return r.bad ? NULL : s;
    }
  }
  return NULL;
}

/* DWARF 2-4: file entries are numbered from 1 (then come those of
 * DW_LNE_define_file), directory 0 is the compilation directory, which only
 * .debug_info knows. */
static void ca__v4_file(ca__unit *u, const ca__elf *e, uint64_t file, char *dst,
                        size_t cap) {
  uint64_t dir = 0, unused;
  const char *name = NULL;
  if (file >= 1 && file <= u->files.count)
    name = ca__v4_entry(u, u->files.p, true, file, &dir);
  else if (file > u->files.count && file - u->files.count <= u->ndefined) {
    name = u->defined[file - u->files.count - 1];
    dir = u->defined_dir[file - u->files.count - 1];
  }
  if (name == NULL)
    return;
  const char *dpath =
      dir == 0 ? NULL : ca__v4_entry(u, u->dirs.p, false, dir, &unused);
  if (!u->comp_dir_known && name[0] != '/' &&
      (dpath == NULL || dpath[0] != '/')) {
    u->comp_dir = ca__comp_dir(e, u->offset);
    u->comp_dir_known = true;
  }
  ca__compose(dst, cap, u->comp_dir, dpath, name);
}

/* ---- line programs ------------------------------------------------------- */

typedef struct ca__row {
  uint64_t addr;
  uint64_t file;
  uint64_t line;
  uint64_t op_index;
} ca__row;

/* The state of one line program run over the lookups of one object. */
typedef struct ca__run {
  ca__unit *u;
  const ca__elf *e;
  ca__lookup *lk;
  size_t n;
  ca_symbol *out;
  ca__row row;  /* the state machine's registers */
  ca__row prev; /* the last row emitted in this sequence */
  bool have_prev;
  bool live; /* false for sequences of code the linker discarded */
} ca__run;

static void ca__reset_row(ca__run *x) {
  memset(&x->row, 0, sizeof(x->row));
  x->row.file = 1;
  x->row.line = 1;
}

/* Gives the row `prev` to every lookup in [prev.addr, end). */
static void ca__assign(ca__run *x, uint64_t end) {
  const ca__row *r = &x->prev;
  if (end <= r->addr || end <= x->lk[0].addr || r->addr > x->lk[x->n - 1].addr)
    return;
  for (size_t j = ca__lower_bound(x->lk, x->n, r->addr);
       j < x->n && x->lk[j].addr < end; j++) {
    ca__lookup *l = &x->lk[j];
    if (l->line_done)
      continue;
    l->line_done = true;
    ca_symbol *s = &x->out[l->out];
    if (r->line == 0 || r->line > UINT_MAX)
      continue; /* Code that belongs to no source line. */
    s->line = (unsigned)r->line;
    if (x->u->c.version >= 5)
      ca__v5_file(x->u, r->file, s->file, sizeof(s->file));
    else
      ca__v4_file(x->u, x->e, r->file, s->file, sizeof(s->file));
  }
}

/* Appends a row: it closes the range that began at the previous one. Linkers
 * leave the sequences of discarded functions at address 0 (or -1), where no
 * code of a loaded object lies, so those are ignored. */
static void ca__emit(ca__run *x, bool end_sequence) {
  if (!x->have_prev)
    x->live = x->row.addr != 0 && x->row.addr != UINT64_MAX &&
              x->row.addr != UINT32_MAX;
  else if (x->live)
    ca__assign(x, x->row.addr);
  x->prev = x->row;
  x->have_prev = !end_sequence;
}

static void ca__advance(ca__run *x, uint64_t operation_advance) {
  ca__unit *u = x->u;
  uint64_t ops = x->row.op_index + operation_advance;
  x->row.addr += u->min_inst * (ops / u->max_ops);
  x->row.op_index = ops % u->max_ops;
}

static void ca__special(ca__run *x, unsigned op) {
  unsigned adjusted = op - x->u->opcode_base;
  ca__advance(x, adjusted / x->u->line_range);
  x->row.line +=
      (uint64_t)(int64_t)(x->u->line_base + (int)(adjusted % x->u->line_range));
  ca__emit(x, false);
}

static void ca__extended(ca__run *x, ca_rd *r) {
  uint64_t len = ca_rd_uleb(r);
  const uint8_t *start = r->p;
  if (len == 0 || len > ca_rd_left(r)) {
    r->bad = true;
    return;
  }
  ca_rd op = {start, start + len, false};
  switch (ca_rd_uint(&op, 1)) {
  case CA__LNE_END_SEQUENCE:
    ca__emit(x, true);
    ca__reset_row(x);
    break;
  case CA__LNE_SET_ADDRESS:
    x->row.addr = ca_rd_uint(&op, (size_t)(len - 1));
    x->row.op_index = 0;
    break;
  case CA__LNE_DEFINE_FILE:
    if (x->u->ndefined < CA__MAX_DEFINED) {
      const char *name = ca__str(&op);
      uint64_t dir = ca_rd_uleb(&op);
      x->u->defined[x->u->ndefined] = name;
      x->u->defined_dir[x->u->ndefined++] = dir;
    }
    break;
  default: /* DW_LNE_set_discriminator and vendor opcodes carry nothing we use.
            */
    break;
  }
  r->p = start + len;
}

static void ca__standard(ca__run *x, ca_rd *r, unsigned op) {
  switch (op) {
  case CA__LNS_COPY:
    ca__emit(x, false);
    break;
  case CA__LNS_ADVANCE_PC:
    ca__advance(x, ca_rd_uleb(r));
    break;
  case CA__LNS_ADVANCE_LINE:
    x->row.line += (uint64_t)ca_rd_sleb(r);
    break;
  case CA__LNS_SET_FILE:
    x->row.file = ca_rd_uleb(r);
    break;
  case CA__LNS_CONST_ADD_PC:
    ca__advance(x, (255 - x->u->opcode_base) / x->u->line_range);
    break;
  case CA__LNS_FIXED_ADVANCE_PC:
    x->row.addr += ca_rd_uint(r, 2);
    x->row.op_index = 0;
    break;
  default:
    /* Opcodes with nothing we use (set_column, negate_stmt, ...) and ones
     * newer than us: their operand count is in the header. */
    for (unsigned k = 0; k < x->u->std_lengths[op - 1] && !r->bad; k++)
      ca_rd_uleb(r);
    break;
  }
}

/* Runs one line program, resolving the lookups that its rows cover. */
static void ca__run_program(ca__run *x) {
  ca_rd r = {x->u->program, x->u->end, false};
  ca__reset_row(x);
  x->have_prev = false;
  while (ca_rd_left(&r) > 0) {
    unsigned op = *r.p++;
    if (op >= x->u->opcode_base)
      ca__special(x, op);
    else if (op == 0)
      ca__extended(x, &r);
    else
      ca__standard(x, &r, op);
  }
}

/* One pass over every line program of the object resolves all of its
 * lookups (sorted by address). */
static void ca__lines(const ca__elf *e, ca__lookup *lk, size_t n,
                      ca_symbol *out) {
  ca_rd r = ca_rd_make(e->line.p, e->line.n);
  if (e->line.p == NULL)
    return;
  while (ca_rd_left(&r) > 0) {
    ca__unit u;
    memset(&u, 0, sizeof(u));
    u.c.e = e;
    u.c.addr_size = sizeof(void *);
    u.offset = (uint64_t)(r.p - e->line.p);
    if (!ca__unit_length(&r, &u.c.offset_size, &u.end))
      return;
    ca_rd h = {r.p, u.end, false};
    if (ca__unit_header(&h, &u)) {
      ca__run x = {.u = &u, .e = e, .lk = lk, .n = n, .out = out};
      ca__run_program(&x);
    }
    r.p = u.end;
  }
}

/* ---- separate debug files ------------------------------------------------ */

/* The CRC-32 that .gnu_debuglink records (the zlib polynomial). */
static uint32_t ca__crc32(const uint8_t *p, size_t n) {
  uint32_t table[256];
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; i++)
    crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

/* /usr/lib/debug/.build-id/xx/rest.debug, where distributions install the
 * debug files of their packages. */
static bool ca__open_by_build_id(const ca__elf *obj, ca__elf *dbg) {
  static const char hex[] = "0123456789abcdef";
  static const char prefix[] = "/usr/lib/debug/.build-id/";
  char path[sizeof(prefix) + 2 * 64 + 16];
  if (obj->build_id.p == NULL || obj->build_id.n < 2 || obj->build_id.n > 64)
    return false;
  size_t len = sizeof(prefix) - 1;
  memcpy(path, prefix, len);
  for (size_t i = 0; i < obj->build_id.n; i++) {
    path[len++] = hex[obj->build_id.p[i] >> 4];
    path[len++] = hex[obj->build_id.p[i] & 15];
    if (i == 0)
      path[len++] = '/';
  }
  memcpy(path + len, ".debug", sizeof(".debug"));
  return ca__elf_open(path, dbg);
}

static bool ca__try_debuglink(const char *path, const char *self,
                              const ca__elf *obj, ca__elf *dbg) {
  if (strcmp(path, self) == 0 || !ca__elf_open(path, dbg))
    return false;
  if (!obj->has_crc || ca__crc32(dbg->base, dbg->size) == obj->debuglink_crc)
    return true;
  ca__elf_close(dbg);
  return false;
}

/* .gnu_debuglink names a file looked for next to the object, in .debug/
 * beside it, and under /usr/lib/debug/ plus the object's directory. */
static bool ca__open_by_debuglink(const char *real_path, const ca__elf *obj,
                                  ca__elf *dbg) {
  char self[PATH_MAX], path[PATH_MAX + 64];
  if (obj->debuglink == NULL || strchr(obj->debuglink, '/') != NULL ||
      realpath(real_path, self) == NULL)
    return false;
  char *slash = strrchr(self, '/');
  if (slash == NULL)
    return false;
  int dir_len = (int)(slash - self);
  static const char *const forms[] = {"%.*s/%s", "%.*s/.debug/%s",
                                      "/usr/lib/debug%.*s/%s"};
  for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
    int k =
        snprintf(path, sizeof(path), forms[i], dir_len, self, obj->debuglink);
    if (k > 0 && (size_t)k < sizeof(path) &&
        ca__try_debuglink(path, self, obj, dbg))
      return true;
  }
  return false;
}

/* ---- one object ---------------------------------------------------------- */

/* Fills what the object file at open_path (the loaded object real_path) can
 * tell about lookups lk[0..n), which are sorted by address. */
static void ca__symbolize_object(const char *open_path, const char *real_path,
                                 ca__lookup *lk, size_t n, ca_symbol *out,
                                 ca__demangle_fn demangle) {
  ca__elf obj, dbg;
  memset(&dbg, 0, sizeof(dbg));
  if (!ca__elf_open(open_path, &obj))
    return;
  /* A stripped object keeps its static functions' names and its line table
   * in the debug file, when one is installed. */
  bool have_dbg = (obj.line.p == NULL || obj.symtab.p == NULL) &&
                  (ca__open_by_build_id(&obj, &dbg) ||
                   ca__open_by_debuglink(real_path, &obj, &dbg));
  ca__offer_table(lk, n, &obj.symtab, &obj.strtab);
  ca__offer_table(lk, n, &obj.dynsym, &obj.dynstr);
  if (have_dbg && obj.symtab.p == NULL)
    ca__offer_table(lk, n, &dbg.symtab, &dbg.strtab);
  ca__settle_sizeless(lk, n);
  ca__put_functions(lk, n, out, demangle);
  if (obj.line.p != NULL)
    ca__lines(&obj, lk, n, out);
  else if (have_dbg)
    ca__lines(&dbg, lk, n, out);
  ca__elf_close(&dbg);
  ca__elf_close(&obj);
}

/* Symbolizes lookups sorted by (module, address), one object at a time.
 * The main program is opened through /proc/self/exe, which works even when
 * its file was replaced or deleted since it started. */
static void ca__symbolize_sorted(ca__lookup *lk, size_t n, ca_symbol *out,
                                 const char *forced_path) {
  ca__demangle_fn demangle = ca__demangler();
  for (size_t first = 0, last; first < n; first = last) {
    for (last = first + 1; last < n && lk[last].module == lk[first].module;
         last++)
      ;
    if (lk[first].module == CA__NO_MODULE)
      continue;
    const char *real_path = out[lk[first].out].module;
    const char *open_path = forced_path != NULL      ? forced_path
                            : lk[first].main_program ? "/proc/self/exe"
                                                     : real_path;
    if (open_path[0] != '\0')
      ca__symbolize_object(open_path, real_path, lk + first, last - first, out,
                           demangle);
  }
}

/* ---- loaded objects ------------------------------------------------------ */

typedef struct ca__find {
  ca__lookup *lk;
  size_t n;
  ca_symbol *out;
  size_t rank;
} ca__find;

static bool ca__in_object(const struct dl_phdr_info *info, uintptr_t addr) {
  for (ElfW(Half) k = 0; k < info->dlpi_phnum; k++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[k];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && addr >= start && addr - start < ph->p_memsz)
      return true;
  }
  return false;
}

/* Runs under the loader's lock: it only compares and copies. */
static int ca__phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
  ca__find *f = data;
  size_t rank = f->rank++;
  (void)size;
  for (size_t j = 0; j < f->n; j++) {
    ca__lookup *l = &f->lk[j];
    if (l->module != CA__NO_MODULE || l->pc == 0 ||
        !ca__in_object(info, l->pc - 1))
      continue;
    l->module = rank;
    l->bias = info->dlpi_addr;
    const char *name = info->dlpi_name != NULL ? info->dlpi_name : "";
    l->main_program = rank == 0 && name[0] == '\0';
    ca__copy(f->out[l->out].module, sizeof(f->out[l->out].module), name);
  }
  return 0;
}

/* The main program's path, resolved once per batch. */
static void ca__name_main_program(ca__lookup *lk, size_t n, ca_symbol *out) {
  char exe[sizeof(out->module)];
  bool resolved = false;
  for (size_t j = 0; j < n; j++) {
    if (!lk[j].main_program)
      continue;
    if (!resolved) {
      ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
      exe[len > 0 ? len : 0] = '\0';
      resolved = true;
    }
    ca__copy(out[lk[j].out].module, sizeof(out->module), exe);
  }
}

static void ca__start(const uintptr_t *pcs, size_t n, ca_symbol *out,
                      ca__lookup *lk) {
  for (size_t j = 0; j < n; j++) {
    memset(&out[j], 0, sizeof(out[j]));
    out[j].pc = pcs[j];
    memset(&lk[j], 0, sizeof(lk[j]));
    lk[j].pc = pcs[j];
    lk[j].out = j;
    lk[j].module = CA__NO_MODULE;
  }
}

/* Computes each lookup's address in its object, then groups them. */
static void ca__finish(ca__lookup *lk, size_t n, ca_symbol *out,
                       const char *forced_path) {
  for (size_t j = 0; j < n; j++) {
    if (lk[j].module == CA__NO_MODULE)
      continue;
    lk[j].addr = lk[j].pc - 1 - lk[j].bias;
    out[lk[j].out].module_offset = lk[j].pc - lk[j].bias;
  }
  qsort(lk, n, sizeof(*lk), ca__by_module_addr);
  ca__symbolize_sorted(lk, n, out, forced_path);
}

static void ca__batch(const uintptr_t *pcs, size_t n, ca_symbol *out,
                      ca__lookup *lk) {
  ca__start(pcs, n, out, lk);
  ca__find f = {lk, n, out, 0};
  dl_iterate_phdr(ca__phdr_cb, &f);
  ca__name_main_program(lk, n, out);
  ca__finish(lk, n, out, NULL);
}

void ca_symbolize(const uintptr_t *pcs, size_t n, ca_symbol *out) {
  ca__lookup *lk = calloc(n, sizeof(*lk));
  if (lk == NULL) {
    /* Out of memory at exit: one address at a time still works. */
    for (size_t j = 0; j < n; j++) {
      ca__lookup one;
      ca__batch(pcs + j, 1, out + j, &one);
    }
    return;
  }
  ca__batch(pcs, n, out, lk);
  free(lk);
}

static void ca__batch_in_file(const char *path, uintptr_t bias,
                              const uintptr_t *pcs, size_t n, ca_symbol *out,
                              ca__lookup *lk) {
  ca__start(pcs, n, out, lk);
  for (size_t j = 0; j < n; j++) {
    if (pcs[j] == 0)
      continue;
    lk[j].module = 0;
    lk[j].bias = bias;
    ca__copy(out[j].module, sizeof(out[j].module), path);
  }
  ca__finish(lk, n, out, path);
}

void ca_symbolize_in_file(const char *path, uintptr_t bias,
                          const uintptr_t *pcs, size_t n, ca_symbol *out) {
  ca__lookup *lk = calloc(n, sizeof(*lk));
  if (lk == NULL) {
    for (size_t j = 0; j < n; j++) {
      ca__lookup one;
      ca__batch_in_file(path, bias, pcs + j, 1, out + j, &one);
    }
    return;
  }
  ca__batch_in_file(path, bias, pcs, n, out, lk);
  free(lk);
}
