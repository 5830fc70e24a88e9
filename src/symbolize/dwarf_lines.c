/*
 * DWARF line tables: headers, file names and line programs, giving each
 * address asked about its file and line.
 *
 * Part of symbolize's one compilation unit (src/symbolize/symbolize.c
 * includes the files in order); not compiled alone.
 */
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
