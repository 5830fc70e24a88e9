/*
 * The fast path (x86-64 only): reading .eh_frame, the call frame
 * information every frame's rule comes from.
 *
 * Part of unwind's one compilation unit (src/unwind/unwind.c includes the
 * files in order); not compiled alone.
 */
/* DWARF register numbers of x86-64 (System V psABI, figure 3.36). */
#define CA__REG_RBP 6
#define CA__REG_RSP 7
#define CA__REG_RA 16

/* A rule in one word, so the cache can publish it with one atomic store.
 *   bits 0-31   CFA offset (signed)
 *   bits 32-55  offset from the CFA of the saved RBP (signed)
 *   bits 56-57  kind; bit 58: CFA is RBP-based; bit 59: RBP is saved.
 * No rule is 0, which the cache reads as "not filled yet". */
enum { CA__STEP = 1, CA__END = 2, CA__NONE = 3 };
#define CA__KIND_SHIFT 56
#define CA__CFA_RBP (1ull << 58)
#define CA__RBP_SAVED (1ull << 59)
#define CA__RULE_NONE ((uint64_t)CA__NONE << CA__KIND_SHIFT)
#define CA__RULE_END ((uint64_t)CA__END << CA__KIND_SHIFT)
#define CA__BP_OFF_LIMIT (1 << 23)

static unsigned ca__rule_kind(uint64_t r) { return (r >> CA__KIND_SHIFT) & 3; }
/* Sign extension by xor and subtraction: defined for every bit pattern. */
static int32_t ca__rule_cfa_off(uint64_t r) {
  return (int32_t)((int64_t)((r & 0xffffffffu) ^ 0x80000000u) - 0x80000000ll);
}
static int32_t ca__rule_bp_off(uint64_t r) {
  return (int32_t)(((r >> 32) & 0xffffff) ^ 0x800000) - 0x800000;
}

/* --- Reading .eh_frame --------------------------------------------------- */

/* Pointer encodings (DW_EH_PE_*, LSB 4.1 "Exception Frames"). */
#define CA__PE_OMIT 0xff
#define CA__PE_INDIRECT 0x80

/* A value in the format of an encoding's low nibble, sign-extended where
 * the format is signed. */
static uint64_t ca__pe_value(ca_rd *rd, uint8_t format) {
  switch (format) {
  case 0x00: /* absptr */
  case 0x04: /* udata8 */
  case 0x08: /* signed absptr */
  case 0x0c: /* sdata8 */
    return ca_rd_uint(rd, 8);
  case 0x01:
    return ca_rd_uleb(rd);
  case 0x02:
    return ca_rd_uint(rd, 2);
  case 0x03:
    return ca_rd_uint(rd, 4);
  case 0x09:
    return (uint64_t)ca_rd_sleb(rd);
  case 0x0a:
    return (uint64_t)(int64_t)(int16_t)ca_rd_uint(rd, 2);
  case 0x0b:
    return (uint64_t)(int64_t)(int32_t)ca_rd_uint(rd, 4);
  default:
    rd->bad = true;
    return 0;
  }
}

/* An encoded pointer with its base applied (bases may be NULL where only
 * the pointer's size matters). An indirect pointer is returned undereferenced:
 * only DW_CFA_set_loc needs a value, and there indirection is invalid. */
static uintptr_t ca__pe_read(ca_rd *rd, uint8_t enc, const ca__eh_bases *b) {
  uintptr_t base = 0;
  if (enc == CA__PE_OMIT)
    return 0;
  switch (enc & 0x70) {
  case 0x00:
    break;
  case 0x10: /* pcrel */
    base = (uintptr_t)rd->p;
    break;
  case 0x20: /* textrel */
    base = b != NULL ? (uintptr_t)b->tbase : 0;
    break;
  case 0x30: /* datarel */
    base = b != NULL ? (uintptr_t)b->dbase : 0;
    break;
  case 0x40: /* funcrel */
    base = b != NULL ? (uintptr_t)b->func : 0;
    break;
  case 0x50: /* aligned: an absolute pointer at the next 8-byte boundary */
    ca_rd_skip(rd, (uint64_t)(-(uintptr_t)rd->p & 7));
    return (uintptr_t)ca_rd_uint(rd, 8);
  default:
    rd->bad = true;
    return 0;
  }
  return base + (uintptr_t)ca__pe_value(rd, enc & 0x0f);
}

/* Opens the CIE or FDE at `at`: its length word bounds the cursor. A zero
 * length ends a section, and 64-bit lengths are not used in .eh_frame by
 * any compiler we meet; both are refused. */
static bool ca__open_entry(ca_rd *rd, const uint8_t *at) {
  uint32_t len;
  memcpy(&len, at, sizeof(len));
  if (len == 0 || len == 0xffffffffu)
    return false;
  rd->p = at + 4;
  rd->end = at + 4 + len;
  rd->bad = false;
  return true;
}
