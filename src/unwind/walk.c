/*
 * The walk: the thread's stack bounds, and one frame after another.
 *
 * Part of unwind's one compilation unit (src/unwind/unwind.c includes the
 * files in order); not compiled alone.
 */
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
