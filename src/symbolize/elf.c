/*
 * Mapped ELF files: sections, notes, the build-id and .gnu_debuglink,
 * every byte read through the bounded reader.
 *
 * Part of symbolize's one compilation unit (src/symbolize/symbolize.c
 * includes the files in order); not compiled alone.
 */
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
