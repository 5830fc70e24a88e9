/*
 * memcheck's check of many blocks' rows as one kernel launch (gather.c).
 *
 * Each copy is an operation in the program's stream, and the device runs
 * a stream's small operations one after another, a few microseconds each
 * whatever their bytes: GPT-2 small's training step frees some 4,400
 * blocks, and a copy of each checked one cost its step more than the
 * check's bytes did (docs/BENCHMARKS.md). One launch of the library's own
 * kernel checks a batch's rows instead: each block of its grid compares a
 * set's bytes with the fill, and only a set that differs (a finding, or a
 * red zone the pool could not set) is copied into its pinned slot, which
 * the device writes directly (pinned memory is mapped at the same address
 * on every device, with unified addressing), its *copied set to 1.
 */
#ifndef CA_GATHER_H
#define CA_GATHER_H

#include <cuda.h>
#include <stddef.h>

#include "backend/backend.h"
#include "backend/streams.h"

/* Starts the copies of the first of sets[0..n) to the host on `s`, in w's
 * context (current), as one launch of the gather kernel, those whose
 * bytes all hold `expect` left out (their *copied set to 0 first, by the
 * host); returns how many (up to CA_GATHER_MAX, gather_kernel.h), or 0,
 * launching nothing, where the kernel does not serve them: a single set
 * (one copy costs less than a launch), a row wider than 4 GiB, a context
 * whose driver cannot load the kernel (tried once per context), a launch
 * refused, or an NVTX tool attached, which checks kernels' accesses
 * against the program's live blocks (a compute-sanitizer run) and would
 * take the kernel's reads of freed blocks for the program's errors. The
 * hosts must be memory from the backend's host_alloc: the device writes
 * them. */
size_t ca_gather(const ca_where *w, const ca_backend_rows *sets, size_t n,
                 unsigned char expect, CUstream s);

/* Forgets the kernels of what died (a context's modules die with it), to
 * be loaded again at their next use: of a context, or of every context of
 * a device whose primary context went (which handle it had is not known). */
void ca_gather_bury(const ca_grave *g);

#endif /* CA_GATHER_H */
