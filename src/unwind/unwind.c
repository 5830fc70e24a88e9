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
 *
 * Compiled as one unit: the files of src/unwind/ are included below, each
 * one concern, in the order they build on each other.
 */
#include "unwind/unwind.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "support/dl.h"
#include "support/lazy.h"
#include "support/reader.h"

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

#include "unwind/libgcc.c"
/* The fast path: x86-64 only. */
#if defined(__x86_64__)
#include "unwind/eh_frame.c"
#include "unwind/cfa.c"
#include "unwind/rules.c"
#include "unwind/walk.c"
#endif
#include "unwind/captures.c"
