/*
 * From an FDE to a rule, and the cache of rules shared by all threads.
 *
 * Part of unwind's one compilation unit (src/unwind/unwind.c includes the
 * files in order); not compiled alone.
 */
/* --- From an FDE to a rule ----------------------------------------------- */

/* The CIE header and augmentation (LSB 4.1, "The Common Information
 * Entry Format"); leaves `instr` on the initial instructions. Unknown
 * augmentation letters are fine after a 'z', whose length says where the
 * instructions start, and fatal without one. */
static bool ca__parse_cie(ca__cfi *c, const uint8_t *cie, ca_rd *instr) {
  ca_rd rd;
  if (!ca__open_entry(&rd, cie) || ca_rd_uint(&rd, 4) != 0)
    return false;
  uint8_t version = (uint8_t)ca_rd_uint(&rd, 1);
  const char *aug = (const char *)rd.p;
  size_t aug_len = strnlen(aug, (size_t)(rd.end - rd.p));
  ca_rd_skip(&rd, aug_len + 1);
  if (rd.bad) /* no terminating NUL inside the entry */
    return false;
  if (aug[0] == 'e' && aug[1] == 'h') { /* gcc 2's "eh": an old pointer */
    ca_rd_skip(&rd, 8);
    aug += 2;
  }
  if (version == 4)
    ca_rd_skip(&rd, 2); /* address and segment selector sizes */
  c->code_align = ca_rd_uleb(&rd);
  c->data_align = ca_rd_sleb(&rd);
  c->ra_reg = version == 1 ? ca_rd_uint(&rd, 1) : ca_rd_uleb(&rd);
  c->fde_enc = 0;
  c->has_z = aug[0] == 'z';
  if (c->has_z) {
    uint64_t len = ca_rd_uleb(&rd);
    if (rd.bad || len > (uint64_t)(rd.end - rd.p))
      return false;
    ca_rd data = {rd.p, rd.p + len, false};
    for (const char *a = aug + 1; *a != '\0' && !data.bad; a++) {
      if (*a == 'R')
        c->fde_enc = (uint8_t)ca_rd_uint(&data, 1);
      else if (*a == 'L')
        ca_rd_uint(&data, 1);
      else if (*a == 'P')
        ca__pe_read(&data, (uint8_t)ca_rd_uint(&data, 1), NULL);
      else if (*a == 'S')
        c->signal = true;
      else if (*a != 'B' && *a != 'G')
        break;
    }
    if (data.bad)
      return false;
    ca_rd_skip(&rd, len);
  } else if (aug[0] != '\0') {
    return false;
  }
  *instr = rd;
  return !rd.bad && (version == 1 || version == 3 || version == 4);
}

/* The row the program defines at c->target, reduced to a rule. */
static uint64_t ca__rule_of(const ca__cfi *c) {
  const ca__row *row = &c->row;
  /* The outermost frame: libgcc ends the walk there too. */
  if (row->ra.how == CA__R_UNDEF)
    return CA__RULE_END;
  if (c->signal || c->ra_reg != CA__REG_RA || row->cfa_expr ||
      (row->cfa_reg != CA__REG_RSP && row->cfa_reg != CA__REG_RBP) ||
      row->cfa_off != (int32_t)row->cfa_off || row->ra.how != CA__R_OFFSET ||
      row->ra.off != -8 || row->sp.how == CA__R_OFFSET ||
      row->sp.how == CA__R_OTHER || row->bp.how == CA__R_OTHER)
    return CA__RULE_NONE;
  uint64_t rule = (uint64_t)CA__STEP << CA__KIND_SHIFT |
                  (uint64_t)(uint32_t)(int32_t)row->cfa_off;
  if (row->cfa_reg == CA__REG_RBP)
    rule |= CA__CFA_RBP;
  if (row->bp.how == CA__R_OFFSET) {
    if (row->bp.off <= -CA__BP_OFF_LIMIT || row->bp.off >= CA__BP_OFF_LIMIT)
      return CA__RULE_NONE;
    rule |= CA__RBP_SAVED | ((uint64_t)row->bp.off & 0xffffff) << 32;
  }
  return rule;
}

/* Opens an FDE and finds its CIE. */
static bool ca__open_fde(const uint8_t *fde, ca_rd *rd, const uint8_t **cie) {
  if (!ca__open_entry(rd, fde))
    return false;
  uint32_t delta = (uint32_t)ca_rd_uint(rd, 4);
  *cie = fde + 4 - delta; /* relative to the CIE pointer field itself */
  return !rd->bad && delta != 0;
}

/* Moves past the FDE's address range and augmentation data, onto its
 * instructions. */
static bool ca__fde_body(ca__cfi *c, ca_rd *rd) {
  ca__pe_read(rd, c->fde_enc, c->bases); /* pc_begin: bases->func has it */
  ca__pe_value(rd, c->fde_enc & 0x0f);   /* pc_range */
  if (c->has_z)
    ca_rd_skip(rd, ca_rd_uleb(rd));
  return !rd->bad;
}

/* Interprets the unwind program for code address `addr` (a return address
 * minus one, or the exact pc of the capture's first frame). */
static uint64_t ca__compute_rule(uintptr_t addr) {
  ca__eh_bases bases;
  const uint8_t *fde = ca__libgcc_get()->find_fde((void *)addr, &bases);
  static const ca__cfi zero;
  ca__cfi c = zero;
  ca_rd rd, instr;
  const uint8_t *cie;
  if (fde == NULL || !ca__open_fde(fde, &rd, &cie))
    return CA__RULE_NONE;
  c.bases = &bases;
  c.row.cfa_reg = UINT64_MAX; /* no CFA until the program defines one */
  if (!ca__parse_cie(&c, cie, &instr) || !ca__cfi_run(&c, &instr, false))
    return CA__RULE_NONE;
  c.initial = c.row;
  c.depth = 0;
  c.loc = (uintptr_t)bases.func;
  c.target = addr;
  if (!ca__fde_body(&c, &rd) || !ca__cfi_run(&c, &rd, true))
    return CA__RULE_NONE;
  return ca__rule_of(&c);
}

/* --- The cache ----------------------------------------------------------- */

/* Open addressing over code addresses, shared by every thread. A slot is
 * claimed by a CAS of its key from 0; its rule is published after, so a
 * reader may meet a claimed key with rule 0 (still being computed, or the
 * claim was cut short by fork): it then computes the rule itself and stores
 * the same value. Slots are never freed, so a probe ends at the first empty
 * one. 16K slots of 16 bytes: 256 KiB of zero pages until touched. */
#define CA__CACHE_BITS 14
#define CA__CACHE_SLOTS (1u << CA__CACHE_BITS)
#define CA__CACHE_PROBES 32

typedef struct ca__slot {
  _Atomic uintptr_t key;
  _Atomic uint64_t rule;
} ca__slot;

static ca__slot ca__cache[CA__CACHE_SLOTS];

static size_t ca__pc_hash(uintptr_t addr) {
  return (size_t)((addr * 0x9e3779b97f4a7c15ull) >> (64 - CA__CACHE_BITS));
}

static uint64_t ca__fill(ca__slot *slot, uintptr_t addr) {
  uint64_t rule = ca__compute_rule(addr);
  atomic_store_explicit(&slot->rule, rule, memory_order_release);
  return rule;
}

static uint64_t ca__rule_for(uintptr_t addr) {
  size_t i = ca__pc_hash(addr);
  for (int probe = 0; probe < CA__CACHE_PROBES; probe++) {
    ca__slot *slot = &ca__cache[i];
    uintptr_t key = atomic_load_explicit(&slot->key, memory_order_acquire);
    if (key == 0) {
      uintptr_t expected = 0;
      key = atomic_compare_exchange_strong_explicit(&slot->key, &expected, addr,
                                                    memory_order_acq_rel,
                                                    memory_order_acquire)
                ? addr
                : expected;
    }
    if (key == addr) {
      uint64_t rule = atomic_load_explicit(&slot->rule, memory_order_acquire);
      return rule != 0 ? rule : ca__fill(slot, addr);
    }
    i = (i + 1) & (CA__CACHE_SLOTS - 1);
  }
  return ca__compute_rule(addr); /* a crowded neighbourhood: uncached */
}
