/*
 * Stack capture with cached unwind rules (see unwind.h).
 *
 * libgcc's _Unwind_Backtrace re-reads and re-interprets the DWARF call frame
 * program of every frame on every capture, about 100-200 ns a frame. Here
 * each return address's program is interpreted once, down to the three
 * numbers a frame of x86-64 code almost always needs, and kept in a table
 * shared by all threads; a capture then costs a probe and two loads a frame.
 * Whatever the three numbers cannot say goes to libgcc whole, so the two
 * paths never disagree.
 */
#include "unwind.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "bytes.h"
#include "dl.h"
#include "lazy.h"

/* Stack reads are checked against the thread's stack bounds by hand; a
 * sanitizer has nothing to add there, and a fake-stack or redzone check on a
 * saved-register slot would only cost time. */
#define CA__RAW_STACK __attribute__((no_sanitize("address", "thread")))

/* Frames of the unwinder itself (and of libgcc's driver loop) before the
 * caller's frame: a capture that meets more than this many is broken. */
#define CA__MAX_OWN_FRAMES 8

/* A walk visits at most this many frames, whatever skip asks: a corrupt
 * stack that loops must not hang libgcc's loop either. */
#define CA__MAX_VISITS 8192

/* ------------------------------------------------------------------------ */
/* libgcc, found at run time                                                 */

/* The base addresses _Unwind_Find_FDE reports with an FDE (libgcc's struct
 * dwarf_eh_bases), for pointer encodings relative to text, data or the
 * function. */
typedef struct ca__eh_bases {
  void *tbase;
  void *dbase;
  void *func;
} ca__eh_bases;

/* The libgcc entry points, with libgcc's ABI but without its header: the
 * reason codes are plain ints, the contexts opaque. */
typedef const void *(*ca__find_fde_fn)(void *pc, ca__eh_bases *bases);
typedef int (*ca__trace_fn)(void *context, void *arg);
typedef int (*ca__backtrace_fn)(ca__trace_fn trace, void *arg);
typedef uintptr_t (*ca__get_ip_fn)(void *context);

#define CA__URC_NO_REASON 0
#define CA__URC_END_OF_STACK 5

typedef struct ca__libgcc {
  ca__find_fde_fn find_fde;
  ca__backtrace_fn backtrace;
  ca__get_ip_fn get_ip;
} ca__libgcc;

/* Both found with loader calls, and published without a lock (lazy.h):
 * the first capture may run in a constructor that dlopen runs with the
 * loader's lock held. */
static ca_lazy ca__gcc = CA_LAZY_INIT;
static ca__libgcc ca__gcc_fallback;

/* POSIX makes a function pointer from dlsym valid; memcpy says so without a
 * cast warning. */
static void ca__gcc_resolve(void *handle, const char *name, void *fn_out) {
  void *sym = ca_dl_sym(handle, name);
  memcpy(fn_out, &sym, sizeof(sym));
}

/* The library links only libc, so libgcc_s is the program's: almost every
 * C++ or threaded program has it loaded already (RTLD_NOLOAD finds that
 * copy without a second search); otherwise it is loaded once, here. */
static void ca__gcc_load(ca__libgcc *gcc) {
  memset(gcc, 0, sizeof(*gcc));
  void *handle = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == NULL)
    handle = dlopen("libgcc_s.so.1", RTLD_NOW);
  if (handle == NULL)
    return;
  ca__gcc_resolve(handle, "_Unwind_Find_FDE", &gcc->find_fde);
  ca__gcc_resolve(handle, "_Unwind_Backtrace", &gcc->backtrace);
  ca__gcc_resolve(handle, "_Unwind_GetIP", &gcc->get_ip);
}

static const ca__libgcc *ca__libgcc_get(void) {
  const ca__libgcc *gcc = ca_lazy_get(&ca__gcc);
  if (gcc != NULL)
    return gcc;
  ca__libgcc mine;
  ca__gcc_load(&mine);
  return ca_lazy_publish(&ca__gcc, &mine, sizeof(mine), &ca__gcc_fallback);
}

/* ------------------------------------------------------------------------ */
/* Our own object's code, for ca_unwind_outside_self                         */

typedef struct ca__range {
  uintptr_t lo, hi;
} ca__range;

static ca_lazy ca__self = CA_LAZY_INIT;
static ca__range ca__self_fallback;

static bool ca__object_holds(const struct dl_phdr_info *info, uintptr_t addr) {
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && addr - start < ph->p_memsz)
      return true;
  }
  return false;
}

/* The span of the executable segments of the object holding this file. */
static int ca__find_self(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  ca__range *r = arg;
  if (!ca__object_holds(info, (uintptr_t)&ca__find_self))
    return 0;
  r->lo = UINTPTR_MAX;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
      continue;
    r->lo = start < r->lo ? start : r->lo;
    r->hi = start + ph->p_memsz > r->hi ? start + ph->p_memsz : r->hi;
  }
  return 1;
}

static const ca__range *ca__self_range(void) {
  const ca__range *r = ca_lazy_get(&ca__self);
  if (r != NULL)
    return r;
  ca__range mine = {0, 0};
  dl_iterate_phdr(ca__find_self, &mine);
  return ca_lazy_publish(&ca__self, &mine, sizeof(mine), &ca__self_fallback);
}

/* A return address belongs to the code of its call instruction, one byte
 * back: a call that ends the object's text returns just past it. */
static bool ca__in_self(uintptr_t pc) {
  const ca__range *r = ca__self_range();
  return pc - 1 >= r->lo && pc - 1 < r->hi;
}

/* ------------------------------------------------------------------------ */
/* Where frames go                                                           */

/* One capture's destination and filters, shared by the fast path and
 * libgcc's so that both drop exactly the same frames. */
typedef struct ca__sink {
  uintptr_t *pcs;
  size_t max, skip, n;
  uintptr_t first; /* the caller's return address: frames before are ours */
  bool seen_first; /* first has gone by */
  bool skip_self;  /* still dropping frames inside our own object */
  size_t own, visits;
} ca__sink;

static ca__sink ca__sink_make(uintptr_t *pcs, size_t max, size_t skip,
                              uintptr_t first, bool skip_self) {
  ca__sink s = {pcs, max, skip, 0, first, false, skip_self, 0, 0};
  return s;
}

enum { CA__PUT_MORE, CA__PUT_FULL, CA__PUT_BROKEN };

/* Takes the next frame outward. Frames before the caller's return address
 * are the unwinder's own and never stored; seeing too many of them means
 * the walk is not where it thinks it is. */
static int ca__sink_put(ca__sink *s, uintptr_t pc) {
  if (++s->visits > CA__MAX_VISITS)
    return CA__PUT_FULL;
  if (!s->seen_first) {
    if (pc != s->first)
      return ++s->own > CA__MAX_OWN_FRAMES ? CA__PUT_BROKEN : CA__PUT_MORE;
    s->seen_first = true;
  }
  if (s->skip_self && ca__in_self(pc))
    return CA__PUT_MORE;
  s->skip_self = false;
  if (s->skip > 0) {
    s->skip--;
    return CA__PUT_MORE;
  }
  s->pcs[s->n++] = pc;
  return s->n < s->max ? CA__PUT_MORE : CA__PUT_FULL;
}

/* ------------------------------------------------------------------------ */
/* The libgcc path                                                           */

static int ca__libgcc_frame(void *context, void *arg) {
  ca__sink *s = arg;
  uintptr_t pc = ca__libgcc_get()->get_ip(context);
  /* libgcc reports the end of the stack as one last frame of pc 0. */
  if (pc == 0 || ca__sink_put(s, pc) != CA__PUT_MORE)
    return CA__URC_END_OF_STACK;
  return CA__URC_NO_REASON;
}

static size_t ca__libgcc_capture(ca__sink *s) {
  const ca__libgcc *gcc = ca__libgcc_get();
  if (gcc->backtrace == NULL || gcc->get_ip == NULL)
    return 0;
  gcc->backtrace(ca__libgcc_frame, s);
  return s->seen_first ? s->n : 0;
}

/* ------------------------------------------------------------------------ */
/* The fast path: x86-64 only                                                */

#if defined(__x86_64__)

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

/* --- The thread's stack -------------------------------------------------- */

typedef struct ca__stack {
  uintptr_t lo, hi;
  int state; /* 0 not asked yet, 1 known, -1 unknown */
} ca__stack;

static __thread ca__stack ca__my_stack;

/* Asked once per thread: glibc knows a thread's stack from its creation,
 * and the main thread's from /proc/self/maps and the stack limit. */
static const ca__stack *ca__stack_get(void) {
  ca__stack *s = &ca__my_stack;
  if (s->state != 0)
    return s;
  pthread_attr_t attr;
  void *addr;
  size_t size;
  s->state = -1;
  if (pthread_getattr_np(pthread_self(), &attr) != 0)
    return s;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
    s->lo = (uintptr_t)addr;
    s->hi = (uintptr_t)addr + size;
    s->state = 1;
  }
  pthread_attr_destroy(&attr);
  return s;
}

/* An aligned 8-byte slot entirely inside the stack. */
static bool ca__on_stack(const ca__stack *s, uintptr_t addr) {
  return (addr & 7) == 0 && addr >= s->lo && addr < s->hi && s->hi - addr >= 8;
}

/* --- The walk ------------------------------------------------------------ */

typedef struct ca__regs {
  uintptr_t ip, sp, bp;
} ca__regs;

enum { CA__WALK_DONE, CA__WALK_FALLBACK };

/* One frame outward: the CFA, then the return address below it and RBP
 * where the rule saved it. False when a read would leave the stack or the
 * frame does not move outward: the walk has gone wrong, and ends. */
CA__RAW_STACK static bool ca__step(const ca__stack *st, uint64_t rule,
                                   ca__regs *r) {
  uintptr_t cfa = (rule & CA__CFA_RBP ? r->bp : r->sp) +
                  (uintptr_t)(intptr_t)ca__rule_cfa_off(rule);
  if (cfa <= r->sp || !ca__on_stack(st, cfa - 8))
    return false;
  if (rule & CA__RBP_SAVED) {
    uintptr_t at = cfa + (uintptr_t)(intptr_t)ca__rule_bp_off(rule);
    /* A saved register lies in the frame being left, between its stack
     * pointer and its CFA: anywhere else the rule is wrong, and the page
     * may not even be mapped (the main thread's stack grows on demand). */
    if (at < r->sp || at + sizeof(uintptr_t) > cfa || !ca__on_stack(st, at))
      return false;
    r->bp = *(const uintptr_t *)at;
  }
  r->ip = *(const uintptr_t *)(cfa - 8);
  r->sp = cfa;
  return true;
}

/* Walks from the registers of the capture's own frame. The first frame's
 * rule is looked up at its exact pc; every later one at its return address
 * minus one, inside the call instruction, as libgcc does. */
static int ca__walk(ca__regs r, ca__sink *s) {
  const ca__stack *st = ca__stack_get();
  if (st->state != 1 || !ca__on_stack(st, r.sp))
    return CA__WALK_FALLBACK;
  for (uintptr_t addr = r.ip;; addr = r.ip - 1) {
    uint64_t rule = ca__rule_for(addr);
    unsigned kind = ca__rule_kind(rule);
    if (kind == CA__END)
      return CA__WALK_DONE;
    if (kind != CA__STEP)
      return CA__WALK_FALLBACK;
    if (!ca__step(st, rule, &r) || r.ip == 0)
      return CA__WALK_DONE;
    int put = ca__sink_put(s, r.ip);
    if (put != CA__PUT_MORE)
      return put == CA__PUT_FULL ? CA__WALK_DONE : CA__WALK_FALLBACK;
  }
}

/* The registers at this point of the calling function, read in an order
 * that survives the compiler choosing RBP for an output: RBP first, the
 * label's address last. The label's pc and the RSP read share one row of
 * the unwind table, since nothing between them moves RSP. */
#define CA__READ_REGS(r)                                                       \
  __asm__ volatile("movq %%rbp, %2\n\t"                                        \
                   "movq %%rsp, %1\n"                                          \
                   "1:\n\t"                                                    \
                   "leaq 1b(%%rip), %0"                                        \
                   : "=&r"((r).ip), "=&r"((r).sp), "=&r"((r).bp))

#endif /* __x86_64__ */

/* ------------------------------------------------------------------------ */
/* Captures                                                                  */

enum { CA__ANY, CA__FAST_ONLY, CA__LIBGCC_ONLY };

/* Out of line, so that every entry point shares one register read (one
 * cached rule for its pc). The walk reads only frames above this one, which
 * stay put until it returns. */
__attribute__((noinline)) static size_t ca__capture(ca__sink *s, int path) {
#if defined(__x86_64__)
  if (path != CA__LIBGCC_ONLY && ca__libgcc_get()->find_fde != NULL) {
    ca__regs r;
    CA__READ_REGS(r);
    ca__sink fresh = *s;
    if (ca__walk(r, s) == CA__WALK_DONE && s->seen_first)
      return s->n;
    *s = fresh;
  }
#endif
  if (path == CA__FAST_ONLY)
    return CA_UNWIND_NOT_FAST;
  return ca__libgcc_capture(s);
}

/* Each entry point names its own return address as the first frame to keep,
 * so whatever the compiler inlines in between, both paths drop exactly the
 * unwinder's own frames. Entry points are never inlined: their return
 * address is the caller's pc that pcs[0] promises. */
#define CA__ENTRY(pcs, max, skip, skip_self, path)                             \
  do {                                                                         \
    if ((max) == 0)                                                            \
      return 0;                                                                \
    ca__sink s = ca__sink_make(                                                \
        pcs, max, skip, (uintptr_t)__builtin_return_address(0), skip_self);    \
    return ca__capture(&s, path);                                              \
  } while (0)

__attribute__((noinline)) size_t ca_unwind(uintptr_t *pcs, size_t max,
                                           size_t skip) {
  CA__ENTRY(pcs, max, skip, false, CA__ANY);
}

__attribute__((noinline)) size_t ca_unwind_fast(uintptr_t *pcs, size_t max,
                                                size_t skip) {
  CA__ENTRY(pcs, max, skip, false, CA__FAST_ONLY);
}

__attribute__((noinline)) size_t ca_unwind_libgcc(uintptr_t *pcs, size_t max,
                                                  size_t skip) {
  CA__ENTRY(pcs, max, skip, false, CA__LIBGCC_ONLY);
}

__attribute__((noinline)) size_t ca_unwind_outside_self(uintptr_t *pcs,
                                                        size_t max) {
  ca__self_range(); /* found before the first frame: outside the capture */
  CA__ENTRY(pcs, max, 0, true, CA__ANY);
}
