/*
 * Objects: separate debug files, one object read whole, and the objects
 * the process has loaded (the entry points of symbolize.h).
 *
 * Part of symbolize's one compilation unit (src/symbolize/symbolize.c
 * includes the files in order); not compiled alone.
 */
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
