/*
 * The CFA program: interpreting a frame's call frame instructions down to
 * the three numbers a frame of x86-64 code almost always needs.
 *
 * Part of unwind's one compilation unit (src/unwind/unwind.c includes the
 * files in order); not compiled alone.
 */
/* --- The CFA program ----------------------------------------------------- */

/* How a register is recovered; only the registers the fast walk needs are
 * followed, and every other rule (register, expression, ...) is OTHER. */
enum { CA__R_SAME, CA__R_UNDEF, CA__R_OFFSET, CA__R_OTHER };

typedef struct ca__reg_rule {
  int how;
  int64_t off;
} ca__reg_rule;

typedef struct ca__row {
  uint64_t cfa_reg;
  int64_t cfa_off;
  bool cfa_expr;
  ca__reg_rule bp, sp, ra;
} ca__row;

/* Compilers nest DW_CFA_remember_state once or twice; a program that nests
 * deeper than this gets no rule. */
#define CA__STATE_DEPTH 8

/* The interpreter: the current row, the CIE's initial row (for
 * DW_CFA_restore) and the remembered rows, and where the program stands. */
typedef struct ca__cfi {
  ca__row row, initial;
  ca__row saved[CA__STATE_DEPTH];
  int depth;
  uint64_t code_align;
  int64_t data_align;
  uint64_t ra_reg;
  uint8_t fde_enc;
  bool has_z, signal;
  uintptr_t loc, target;
  const ca__eh_bases *bases;
} ca__cfi;

static ca__reg_rule *ca__reg_slot(ca__row *row, uint64_t reg) {
  switch (reg) {
  case CA__REG_RBP:
    return &row->bp;
  case CA__REG_RSP:
    return &row->sp;
  case CA__REG_RA:
    return &row->ra;
  default:
    return NULL;
  }
}

static void ca__set_reg(ca__cfi *c, uint64_t reg, int how, int64_t off) {
  ca__reg_rule *slot = ca__reg_slot(&c->row, reg);
  if (slot != NULL) {
    slot->how = how;
    slot->off = off;
  }
}

static void ca__restore_reg(ca__cfi *c, uint64_t reg) {
  ca__reg_rule *slot = ca__reg_slot(&c->row, reg);
  if (slot != NULL)
    *slot = *ca__reg_slot(&c->initial, reg);
}

static bool ca__remember(ca__cfi *c, bool push) {
  if (push) {
    if (c->depth == CA__STATE_DEPTH)
      return false;
    c->saved[c->depth++] = c->row;
  } else {
    if (c->depth == 0)
      return false;
    c->row = c->saved[--c->depth];
  }
  return true;
}

/* The DW_CFA_* opcodes whose top two bits are 0, operands following the
 * opcode byte (DWARF 5, 6.4.2; the GNU extensions last). */
enum {
  CA__CFA_nop = 0x00,
  CA__CFA_set_loc = 0x01,
  CA__CFA_advance_loc1 = 0x02,
  CA__CFA_advance_loc2 = 0x03,
  CA__CFA_advance_loc4 = 0x04,
  CA__CFA_offset_extended = 0x05,
  CA__CFA_restore_extended = 0x06,
  CA__CFA_undefined = 0x07,
  CA__CFA_same_value = 0x08,
  CA__CFA_register = 0x09,
  CA__CFA_remember_state = 0x0a,
  CA__CFA_restore_state = 0x0b,
  CA__CFA_def_cfa = 0x0c,
  CA__CFA_def_cfa_register = 0x0d,
  CA__CFA_def_cfa_offset = 0x0e,
  CA__CFA_def_cfa_expression = 0x0f,
  CA__CFA_expression = 0x10,
  CA__CFA_offset_extended_sf = 0x11,
  CA__CFA_def_cfa_sf = 0x12,
  CA__CFA_def_cfa_offset_sf = 0x13,
  CA__CFA_val_offset = 0x14,
  CA__CFA_val_offset_sf = 0x15,
  CA__CFA_val_expression = 0x16,
  CA__CFA_MIPS_advance_loc8 = 0x1d,
  CA__CFA_GNU_args_size = 0x2e,
  CA__CFA_GNU_negative_offset_extended = 0x2f,
};

/* The CFA-defining opcodes. */
static bool ca__cfa_op(ca__cfi *c, ca_rd *rd, uint8_t op) {
  ca__row *row = &c->row;
  switch (op) {
  case CA__CFA_def_cfa:
    row->cfa_reg = ca_rd_uleb(rd);
    row->cfa_off = (int64_t)ca_rd_uleb(rd);
    row->cfa_expr = false;
    return true;
  case CA__CFA_def_cfa_sf:
    row->cfa_reg = ca_rd_uleb(rd);
    row->cfa_off = ca_rd_sleb(rd) * c->data_align;
    row->cfa_expr = false;
    return true;
  case CA__CFA_def_cfa_register:
    row->cfa_reg = ca_rd_uleb(rd);
    row->cfa_expr = false;
    return true;
  case CA__CFA_def_cfa_offset:
    row->cfa_off = (int64_t)ca_rd_uleb(rd);
    return true;
  case CA__CFA_def_cfa_offset_sf:
    row->cfa_off = ca_rd_sleb(rd) * c->data_align;
    return true;
  case CA__CFA_def_cfa_expression:
    ca_rd_skip(rd, ca_rd_uleb(rd));
    row->cfa_expr = true;
    return true;
  default:
    return false;
  }
}

/* The register-rule opcodes with an extended (ULEB) register operand. */
static bool ca__reg_op(ca__cfi *c, ca_rd *rd, uint8_t op) {
  uint64_t reg = ca_rd_uleb(rd);
  switch (op) {
  case CA__CFA_offset_extended:
    ca__set_reg(c, reg, CA__R_OFFSET, (int64_t)ca_rd_uleb(rd) * c->data_align);
    return true;
  case CA__CFA_offset_extended_sf:
    ca__set_reg(c, reg, CA__R_OFFSET, ca_rd_sleb(rd) * c->data_align);
    return true;
  case CA__CFA_GNU_negative_offset_extended:
    ca__set_reg(c, reg, CA__R_OFFSET, -(int64_t)ca_rd_uleb(rd) * c->data_align);
    return true;
  case CA__CFA_restore_extended:
    ca__restore_reg(c, reg);
    return true;
  case CA__CFA_undefined:
    ca__set_reg(c, reg, CA__R_UNDEF, 0);
    return true;
  case CA__CFA_same_value:
    ca__set_reg(c, reg, CA__R_SAME, 0);
    return true;
  case CA__CFA_register:
    ca_rd_uleb(rd);
    ca__set_reg(c, reg, CA__R_OTHER, 0);
    return true;
  case CA__CFA_val_offset:
  case CA__CFA_val_offset_sf:
    /* The value (not the address) is CFA+n: no saved slot to load. */
    if (op == CA__CFA_val_offset)
      ca_rd_uleb(rd);
    else
      ca_rd_sleb(rd);
    ca__set_reg(c, reg, CA__R_OTHER, 0);
    return true;
  case CA__CFA_expression:
  case CA__CFA_val_expression:
    ca_rd_skip(rd, ca_rd_uleb(rd));
    ca__set_reg(c, reg, CA__R_OTHER, 0);
    return true;
  default:
    return false;
  }
}

static bool ca__is_reg_op(uint8_t op) {
  return (op >= CA__CFA_offset_extended && op <= CA__CFA_register) ||
         op == CA__CFA_expression || op == CA__CFA_offset_extended_sf ||
         (op >= CA__CFA_val_offset && op <= CA__CFA_val_expression) ||
         op == CA__CFA_GNU_negative_offset_extended;
}

/* The opcodes that move the location or keep state. */
static bool ca__loc_op(ca__cfi *c, ca_rd *rd, uint8_t op) {
  switch (op) {
  case CA__CFA_nop:
    return true;
  case CA__CFA_set_loc:
    if (c->fde_enc & CA__PE_INDIRECT)
      return false;
    c->loc = ca__pe_read(rd, c->fde_enc, c->bases);
    return true;
  case CA__CFA_advance_loc1:
    c->loc += ca_rd_uint(rd, 1) * c->code_align;
    return true;
  case CA__CFA_advance_loc2:
    c->loc += ca_rd_uint(rd, 2) * c->code_align;
    return true;
  case CA__CFA_advance_loc4:
    c->loc += ca_rd_uint(rd, 4) * c->code_align;
    return true;
  case CA__CFA_MIPS_advance_loc8:
    c->loc += ca_rd_uint(rd, 8) * c->code_align;
    return true;
  case CA__CFA_remember_state:
    return ca__remember(c, true);
  case CA__CFA_restore_state:
    return ca__remember(c, false);
  case CA__CFA_GNU_args_size:
    ca_rd_uleb(rd);
    return true;
  default:
    return false;
  }
}

/* One instruction. False for an opcode we do not know (DW_CFA_GNU_window_save
 * and the like have no business in x86-64 code) or a state stack misuse. */
static bool ca__cfi_step(ca__cfi *c, ca_rd *rd) {
  uint8_t op = (uint8_t)ca_rd_uint(rd, 1);
  uint8_t low = op & 0x3f;
  switch (op >> 6) {
  case 1: /* DW_CFA_advance_loc */
    c->loc += low * c->code_align;
    return true;
  case 2: /* DW_CFA_offset */
    ca__set_reg(c, low, CA__R_OFFSET, (int64_t)ca_rd_uleb(rd) * c->data_align);
    return true;
  case 3: /* DW_CFA_restore */
    ca__restore_reg(c, low);
    return true;
  default:
    break;
  }
  if (ca__is_reg_op(op))
    return ca__reg_op(c, rd, op);
  return ca__cfa_op(c, rd, op) || ca__loc_op(c, rd, op);
}

/* Runs a program to its end (the CIE's) or, when `to_target`, only while
 * the location has not passed the target: libgcc's condition, "pc < ra". */
static bool ca__cfi_run(ca__cfi *c, ca_rd *rd, bool to_target) {
  while (rd->p < rd->end && !rd->bad) {
    if (to_target && c->loc > c->target)
      break;
    if (!ca__cfi_step(c, rd))
      return false;
  }
  return !rd->bad;
}
