/*
 * Stack capture at allocation sites: the return addresses of the calling
 * thread, cheap enough to take at every device allocation.
 *
 * On x86-64 each return address is looked up once in the DWARF call frame
 * information (.eh_frame, found through libgcc's _Unwind_Find_FDE) and
 * reduced to a compact rule (CFA = RSP or RBP + offset, return address at
 * CFA-8, RBP unchanged or saved at CFA+k), cached in a table shared by all
 * threads; a capture then costs a table probe and two stack loads a frame.
 * libgcc_s.so.1 is found at run time (dlopen, once); without it every
 * capture returns 0.
 *
 * The whole capture is redone by libgcc's _Unwind_Backtrace, so that the
 * result is always the one libgcc gives, when
 *   - the architecture is not x86-64 (aarch64 and others: libgcc only), or
 *     libgcc_s has no _Unwind_Find_FDE;
 *   - the thread's stack bounds are unknown (pthread_getattr_np failed), or
 *     the capture runs on another stack (a signal handler on sigaltstack, a
 *     coroutine's stack);
 *   - a frame the walk must step out of before max frames are stored
 *     (skipped frames count) has no fast rule: it has no unwind information
 *     at all (JIT code), its CFA is a DWARF expression (PLT stubs, some
 *     hand-written assembly), RBP, RSP or the return address has a register
 *     or expression rule, the return address is not at CFA-8, or it is a
 *     signal frame (augmentation 'S': a capture inside a signal handler
 *     falls back at the kernel's frame).
 * A frame past the max-th is never looked at, so it cannot cause a fallback.
 *
 * What a capture holds. pcs[0] is the return address of the call to the
 * capture function itself: a pc inside the function that called ca_unwind
 * (or, if that function tail-called ca_unwind, inside its caller). pcs[1] is
 * the return address into that function's caller, and so on outward. These
 * are return addresses, not call sites: a symbolizer should look up pc - 1.
 * The walk ends where libgcc's ends: at the outermost frame (the one whose
 * return address is marked undefined, as _start and the thread entry are),
 * at a return address of 0 (which is not stored: _Unwind_Backtrace reports
 * it as a last frame of 0, glibc's backtrace() drops it too), or at a frame
 * with no unwind information (stored, then the walk ends).
 *
 * The fast walk reads only inside the calling thread's stack (its bounds are
 * cached per thread) and needs each frame's CFA to lie above the last. A
 * step that would break either (a corrupt stack, or a stale rule: see
 * below) ends the walk with the frames found so far, rather than fault;
 * libgcc would have read the same address. A capture never allocates after
 * the first one of its thread (the first may: the main thread's stack
 * bounds come from /proc/self/maps, and libgcc_s may be loaded).
 *
 * Thread-safe; not async-signal-safe. A cache miss calls _Unwind_Find_FDE,
 * which takes the dynamic loader's lock, so do not capture while holding a
 * lock that code inside dlopen (a library constructor) could wait for.
 *
 * Known limit: rules are cached by address and never forgotten, so code
 * unloaded with dlclose and replaced by different code at the same address
 * would be walked with stale rules; the walk still stays inside the stack,
 * so at worst the frames past that point are wrong.
 */
#ifndef CA_UNWIND_H
#define CA_UNWIND_H

#include <stddef.h>
#include <stdint.h>

/* Fills pcs with up to max return addresses of the calling thread,
 * innermost first, as described above: the first `skip` of them are dropped
 * before max counts, so the result is frames [skip, skip + max) of the full
 * stack. Returns the number stored (0 when max is 0). */
size_t ca_unwind(uintptr_t *pcs, size_t max, size_t skip);

/* Like ca_unwind(pcs, max, 0), but first drops every leading frame whose
 * code lies in the object that holds ca_unwind itself (libcudalloc.so when
 * preloaded; the executable when the core is linked statically, as in the
 * unit tests): pcs[0] is the first return address outside it. Frames of
 * this object further out, after an outside frame, are kept. The object's
 * executable segments are found once, with dl_iterate_phdr. */
size_t ca_unwind_outside_self(uintptr_t *pcs, size_t max);

/* For tests and the benchmark: ca_unwind restricted to one path, with the
 * same meaning of pcs, max and skip. ca_unwind_fast returns
 * CA_UNWIND_NOT_FAST where ca_unwind would have fallen back to libgcc;
 * ca_unwind_libgcc always uses _Unwind_Backtrace. */
#define CA_UNWIND_NOT_FAST SIZE_MAX
size_t ca_unwind_fast(uintptr_t *pcs, size_t max, size_t skip);
size_t ca_unwind_libgcc(uintptr_t *pcs, size_t max, size_t skip);

#endif /* CA_UNWIND_H */
