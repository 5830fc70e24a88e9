/*
 * What the watcher writes at each tick (see lifecycle_parts.h): this
 * process's figures for `cudalloc top`, the timeline's counters, and under
 * shared_limit its part in the group.
 */
#include "policy/lifecycle_parts.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "backend/capture.h"
#include "policy/room.h"
#include "support/budget.h"
#include "support/config.h"
#include "support/group.h"
#include "timeline/publish.h"
#include "registry/registry.h"
#include "leaks/sites.h"
#include "timeline/trace.h"

/* ---- For cudalloc top ----------------------------------------------------- */

/* The growing site's line, "+39.0 MiB keep_step (e2e_leaks.c:120)", or ""
 * (growth_report off, or no site grew). A stack is named once, when it
 * becomes the top one. */
static void ca__top_site(char *buf, size_t len) {
  static uint32_t named;
  static char name[160];
  ca_site_growth g;
  buf[0] = '\0';
  if (!ca_config_get()->growth_report || ca_sites_growth(&g, 1, NULL) == 0)
    return;
  if (g.stack != named) {
    ca_report_site_name(g.stack, name, sizeof(name));
    named = g.stack;
  }
  snprintf(buf, len, "+%.1f MiB %s",
           (double)(g.to_bytes - g.from_bytes) / (1 << 20), name);
}

/* Each device's pools, and the growing site, into this process's file. */
void ca_lifecycle_publish_tick(const cudalloc_device_stats *all, size_t nall) {
  ca_published_device d[CA_PUBLISH_DEVICES];
  size_t n = 0;
  for (size_t i = 0; i < nall && n < CA_PUBLISH_DEVICES; i++) {
    const cudalloc_device_stats s = all[i];
    d[n++] = (ca_published_device){
        .device = s.device,
        .in_use = s.allocated_bytes.current,
        .cached = s.free_cached_bytes + s.pending_free_bytes,
        .reserved = s.reserved_bytes.current,
        .peak = s.reserved_bytes.peak,
        .allocs = s.allocs,
        .fragmentation = s.fragmentation};
  }
  char site[192];
  ca__top_site(site, sizeof(site));
  ca_publish_write(d, n, site);
}

/* ---- For the timeline ----------------------------------------------------- */

/* The trace's counters every tick, and an instant event for each
 * out-of-memory retry and collection since the last one; from the watcher,
 * and once more at exit. */
void ca_lifecycle_trace_tick(const cudalloc_device_stats *all, size_t n) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t retries[CUDALLOC_MAX_DEVICES], collected[CUDALLOC_MAX_DEVICES];
  static uint64_t peaks[CUDALLOC_MAX_DEVICES];
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n; i++) {
    const cudalloc_device_stats *s = &all[i];
    /* The device's peak when it came: a program that peaks between two
     * ticks (a short one, between start and exit) still shows it. */
    ca_budget *b = ca_registry_budget(s->device);
    uint64_t peak = b ? atomic_load(&b->peak) : 0;
    if (peak > peaks[s->device]) {
      ca_trace_reserved_peak(s->device, atomic_load(&b->peak_ns), peak);
      peaks[s->device] = peak;
    }
    ca_trace_counter(s->device, s->requested_bytes.current, s->allocated_bytes.current,
                     s->reserved_bytes.current);
    for (; retries[s->device] < s->oom_retries; retries[s->device]++)
      ca_trace_instant(s->device, "out-of-memory retry");
    for (; collected[s->device] < s->gc_segments_released; collected[s->device]++)
      ca_trace_instant(s->device, "segment given back (collection)");
  }
  pthread_mutex_unlock(&lock);
  ca_trace_drain(ca_report_stack_lines);
}

/* ---- shared_limit ------------------------------------------------------- */

/* Another process of the group asked for room: this one's cache goes back
 * on the devices asked, unless a capture is under way (a free could break
 * it), and the answer tells the asker to look again. With `look`, the dead
 * processes' bookings are taken back and what this one caches is said. */
void ca_lifecycle_group_tick(bool look) {
  uint32_t want = 0, ticket = 0;
  bool asked = ca_group_wanted(&want, &ticket);
  if (!asked && !look)
    return;
  if (look)
    ca_group_reap();
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    uint32_t g = ca_registry_group(d);
    if (g == 0)
      continue;
    if (asked && (want & (1u << (g - 1))) && !ca_capture_seen())
      ca_room_give_back(d);
    ca_group_note_cached(g, ca_registry_releasable(d));
  }
  if (asked)
    ca_group_answer(ticket);
}
