/*
 * A fake backend: simulated device memory for driving the pool without a GPU.
 *
 * Each device has a capacity; reserve hands out fresh, never-reused address
 * ranges (or real host memory, with host_backed, so tests can write through
 * the pointers), remembers every live segment, and refuses with
 * CA_FAKE_OOM past the capacity. Markers model the device's progress: the
 * n-th marker made is n, and it has passed once the fake's `passed` clock
 * reaches n (at once with auto_pass, an idle device; else when the test moves
 * the clock or the pool waits). Tests can inject failures, make markers and
 * synchronize refuse (as during a stream capture), and read call counts.
 * Thread-safe.
 */
#ifndef CA_FAKE_BACKEND_H
#define CA_FAKE_BACKEND_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

#define CA_FAKE_OOM 2 /* what CUDA calls CUDA_ERROR_OUT_OF_MEMORY */
#define CA_FAKE_DEVICES 4
#define CA_FAKE_MAX_SEGMENTS 8192

typedef struct ca_fake_segment {
  uint64_t addr, size;
  int device;
} ca_fake_segment;

/* Address ranges (the backend's expandable-segment calls), once
 * ca_fake_enable_ranges is called: pages of CA_FAKE_PAGE bytes, mapped
 * ones counted against the capacity like segments. */
#define CA_FAKE_PAGE (2ull << 20)
#define CA_FAKE_MAX_RANGES 64

typedef struct ca_fake_range {
  uint64_t addr, size;
  int device;
  unsigned char *mapped; /* one byte per page */
  void *host;            /* host_backed: the mapping reserved, its length */
  size_t host_len;
} ca_fake_range;

typedef struct ca_fake_backend {
  ca_backend backend; /* hand &fake->backend to the pool */
  pthread_mutex_t lock;
  bool host_backed;
  uint64_t capacity[CA_FAKE_DEVICES];
  uint64_t used[CA_FAKE_DEVICES];
  uint64_t peak_used[CA_FAKE_DEVICES]; /* the most ever reserved at once */
  uint64_t next_addr[CA_FAKE_DEVICES];
  ca_fake_segment segments[CA_FAKE_MAX_SEGMENTS];
  int nsegments;
  /* Call counts. */
  int reserves, releases, mem_infos, syncs, refused_syncs;
  int marks, refused_marks, polls, waits, forgets, fences, refused_fences;
  int marks_on;              /* markers on one stream (mark_on) */
  uint64_t last_mark_stream; /* the stream of the latest of them */
  int bad_releases; /* releases of unknown ranges or with a wrong size */
  /* Injection: the next `fail_reserves` reserves return `fail_code`. */
  int fail_reserves;
  int fail_code;
  /* When nonzero, the next non-host-backed reserve hands out this address
   * (once), as a driver reusing a range does. */
  uint64_t next_reserve_at;
  /* While true, synchronize, mark and wait refuse, as during a capture. */
  bool refuse_sync;
  /* The device's progress: markers up to `passed` have passed. */
  uint64_t passed;
  bool auto_pass; /* every marker passes as soon as it is made */
  /* Ranges and their call counts; bad_maps: maps and unmaps of pages not
   * whole, outside a range, or already (not) mapped. */
  ca_fake_range ranges[CA_FAKE_MAX_RANGES];
  int nranges;
  int va_reserves, va_releases, maps, unmaps, bad_maps;
  uint64_t mapped_now;   /* bytes mapped, all devices */
  uint64_t mapped_total; /* bytes ever mapped */
  /* Injection: the next `fail_maps` maps or va_reserves return
   * `fail_code`; while
   * busy_maps, maps and va_reserves answer CA_BACKEND_BUSY (a capture). */
  int fail_maps;
  bool busy_maps;
  /* Byte calls, once ca_fake_enable_bytes is called: fills, the copies
   * fetches started, fetch calls, and the copies made (those whose bytes
   * did not all hold the byte expected). */
  int fills, fetches, fetch_calls, fetch_copies;
  bool refuse_fills;  /* fills answer 1 (refused, as during a capture) */
  /* Positive: a fetch starts at most this many copies, then answers 1 (a
   * launch or copy refused); negative: it starts none; 0: all. */
  int fetch_cap;
  /* The order in which segments were released, for LRU tests. */
  uint64_t released_addrs[CA_FAKE_MAX_SEGMENTS];
} ca_fake_backend;

/* Sets up a fake with `capacity` bytes per device. `with_sync` installs
 * synchronize and the markers (so a pool can use reuse_policy safe and
 * device_sync); auto_pass starts true. Fences are left out (a pool then
 * relies on markers); install ca_fake_fence in backend.fence to have them.
 * A fence is only counted (refused while refuse_sync): the model has no
 * streams to order. */
void ca_fake_init(ca_fake_backend *f, uint64_t capacity, bool with_sync,
                  bool host_backed);

int ca_fake_fence(void *ctx, int device);

/* Gives the fake the backend's range calls (va_reserve, map, ...): a pool
 * with expandable set then uses them. Host-backed ranges are reserved host
 * address space whose pages are readable and writable only while mapped
 * (an unmapped page's bytes are gone). */
void ca_fake_enable_ranges(ca_fake_backend *f);

/* Gives a host-backed fake the backend's byte calls (fill, fetch,
 * host_alloc: memcheck's), done at once on the host memory behind the
 * addresses; streams play no part. A fetch compares as the CUDA backend's
 * kernel does, copying only sets that differ. Counted in fills and
 * fetches. */
void ca_fake_enable_bytes(ca_fake_backend *f);

/* Frees host memory still held by a host-backed fake. */
void ca_fake_fini(ca_fake_backend *f);

/* Forgets the live segment based at `addr`, as if someone had freed it
 * with the driver directly, behind the pool's back. Returns its size, or 0
 * when none is based there. */
uint64_t ca_fake_free_behind(ca_fake_backend *f, int device, uint64_t addr);

/* Whether [addr, addr + size) lies inside one live segment of `device`. */
bool ca_fake_owns(ca_fake_backend *f, int device, uint64_t addr,
                  uint64_t size);

#endif /* CA_FAKE_BACKEND_H */
