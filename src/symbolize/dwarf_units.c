/*
 * DWARF: attribute values, and the compilation directories that DWARF 2-4
 * line tables leave out.
 *
 * Part of symbolize's one compilation unit (src/symbolize/symbolize.c
 * includes the files in order); not compiled alone.
 */

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
