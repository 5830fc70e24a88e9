/*
 * A request refused for memory, told (see oom.h).
 */
#include "policy/oom.h"

#include <stdatomic.h>
#include <unistd.h>

#include "policy/lifecycle.h"
#include "policy/room.h"
#include "registry/registry.h"
#include "support/budget.h"
#include "support/config.h"
#include "support/log.h"

/* What would have made room for a request of `size` the device could not
 * serve: the setting to change, or why none would. */
static const char *ca__advice(const cudalloc_device_stats *s, uint64_t size,
                              uint64_t limit) {
  const ca_config *cfg = ca_config_get();
  uint64_t cached = s->free_cached_bytes + s->pending_free_bytes;
  if (ca_room_capped(s->device, size))
    return "the processes of shared_limit hold its cap (the line before this "
           "report says who holds what): raise memory_limit_mb for the "
           "group, or run fewer of them";
  if (limit && s->reserved_bytes.current + size > limit)
    return "memory_limit_mb caps the device below what is asked: raise it";
  if (cached >= size && !cfg->expandable_segments)
    return "enough is cached, in pieces too small: expandable_segments:1 "
           "maps it where needed";
  if (cached >= size)
    return "enough is cached, in pieces too small even for "
           "expandable_segments: a lower max_split_size_mb keeps large "
           "blocks whole";
  return "the device is full: no setting makes room (free memory the "
         "program holds, above the largest sites, or ask for less)";
}

/* With oom_snapshot, PyTorch's snapshot of the first refusal. The device's
 * free bytes are what the limit leaves, where one is set (unknown, 0,
 * without: asking the driver here could be asked in another context). */
static void ca__write_snapshot(int device, uint64_t bytes, const ca_report_oom *oom) {
  const char *template = ca_config_get()->oom_snapshot;
  char path[CA_CONFIG_PATH_MAX + 16];
  if (template[0] == '\0')
    return;
  if (!ca_log_expand_path(template, (int)getpid(), path, sizeof(path))) {
    ca_log("oom_snapshot:%.80s...: too long a path: no snapshot", template);
    return;
  }
  uint64_t held = oom->stats.reserved_bytes.current;
  ca_lifecycle_oom_snapshot(path, device, bytes,
                            oom->limit > held ? oom->limit - held : 0);
}

/* The process that made the first report: a forked child makes its own. */
static atomic_int ca__reported_by;

void ca_oom_refused(int device, uint64_t bytes, const char *call,
                    const char *then) {
  int pid = (int)getpid();
  bool first = atomic_exchange(&ca__reported_by, pid) != pid;
  bool full = first || ca_config_get()->verbose >= 1;
  if (!full && then == NULL)
    return;
  ca_report_oom oom = {.call = call, .requested = bytes, .then = then,
                       .brief = !full};
  if (device < 0 || !ca_registry_device_stats(device, &oom.stats))
    oom.stats.device = device;
  const ca_budget *b = device >= 0 ? ca_registry_budget(device) : NULL;
  oom.limit = b ? ca_budget_limit(b) : 0;
  oom.advice = ca__advice(&oom.stats, bytes, oom.limit);
  ca_lifecycle_report_oom(device, &oom);
  if (first)
    ca__write_snapshot(device, bytes, &oom);
}
