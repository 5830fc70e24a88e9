/*
 * cudalloc top's shared_limit section (see groups.h). Reads each region
 * without its lock, as the figures are atomic, and asks the kernel which
 * of its processes still live; never writes a figure. A region whose
 * processes all ended is removed first (ca_group_sweep), as any process
 * of a group removes them when it joins.
 */
#include "top/groups.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/group_region.h"
#include "top/units.h"

#define CA__GROUPS_MAX 64

static const char *ca__eol(bool tty) { return tty ? "\033[K" : ""; }

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi names GPUs. */
static void ca__uuid(char *buf, size_t len, const uint8_t u[16]) {
  snprintf(buf, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
}

/* One device of a group: its figures, then each process's part. */
static void ca__print_device(const ca_group_region *r, int fd, int d,
                             bool tty) {
  static const uint8_t none[16];
  const ca_group_dev *dev = &r->device[d];
  if (memcmp(dev->uuid, none, 16) == 0)
    return;
  /* What the living hold: an ended process's part is taken back at the
   * group's next look, and nobody is refused for it meanwhile. */
  uint64_t held = 0, cached = 0, cap = atomic_load(&r->cap);
  for (int i = 0; i < CA_GROUP_PROCS; i++)
    if (atomic_load(&r->proc[i].pid) != 0 && ca_group_proc_alive(fd, i)) {
      held += atomic_load(&r->proc[i].booked[d]);
      cached += atomic_load(&r->proc[i].cached[d]);
    }
  char name[48], h[32], c[32], room[32];
  ca__uuid(name, sizeof(name), dev->uuid);
  ca_top_bytes(h, sizeof(h), held);
  ca_top_bytes(c, sizeof(c), cached);
  ca_top_bytes(room, sizeof(room), cap > held ? cap - held : 0);
  printf("  %-42s %10s %10s %10s%s\n", name, h, c, room, ca__eol(tty));
  printf("    %7s %-32s %10s %10s%s\n", "PID", "COMMAND", "HELD", "CACHED", ca__eol(tty));
  for (int i = 0; i < CA_GROUP_PROCS; i++) {
    const ca_group_proc *p = &r->proc[i];
    int32_t pid = atomic_load(&p->pid);
    uint64_t b = atomic_load(&p->booked[d]);
    if (pid == 0 || b == 0)
      continue;
    bool alive = ca_group_proc_alive(fd, i);
    ca_top_bytes(h, sizeof(h), b);
    ca_top_bytes(c, sizeof(c), atomic_load(&p->cached[d]));
    printf("    %7d %-32.31s %10s %10s%s%s\n", (int)pid,
           alive ? p->command : "(ended)", h, alive ? c : "-",
           alive ? "" : "  taken back at the group's next look", ca__eol(tty));
  }
}

static void ca__print_group(const char *name, bool tty) {
  char why[512];
  int fd = -1;
  ca_group_region *r = ca_group_region_open(name, CA_GROUP_READ, 0, &fd, why, sizeof(why));
  if (r == NULL) {
    printf("shared_limit:%s: region refused: %s%s\n", name, why, ca__eol(tty));
    return;
  }
  int living = 0, entries = 0;
  for (int i = 0; i < CA_GROUP_PROCS; i++) {
    entries += atomic_load(&r->proc[i].pid) != 0;
    living += atomic_load(&r->proc[i].pid) != 0 && ca_group_proc_alive(fd, i);
  }
  char cap[32];
  ca_top_bytes(cap, sizeof(cap), atomic_load(&r->cap));
  printf("%s\nshared_limit:%s - cap %s per device (memory_limit_mb of pid %d) - ",
         ca__eol(tty), name, cap, (int)atomic_load(&r->cap_pid));
  if (living == 0) {
    printf("no process%s%s\n",
           entries ? " (those that ended: their part is taken back at the "
                     "group's next look)" : "",
           ca__eol(tty));
  } else {
    printf("%d process(es)%s\n  %-42s %10s %10s %10s%s\n", living, ca__eol(tty),
           "DEVICE", "HELD", "CACHED", "ROOM", ca__eol(tty));
    for (int d = 0; d < CA_GROUP_DEVICES; d++)
      ca__print_device(r, fd, d, tty);
  }
  ca_group_region_close(r, fd);
}

static int ca__by_name(const void *a, const void *b) { return strcmp(a, b); }

void ca_top_print_groups(bool tty) {
  static char names[CA__GROUPS_MAX][CA_GROUP_NAME_MAX + 1];
  char why[512];
  size_t n = 0;
  ca_group_sweep(-1);
  if (!ca_group_names(names, CA__GROUPS_MAX, &n, why, sizeof(why))) {
    printf("%s\nshared_limit groups: %s%s\n", ca__eol(tty), why, ca__eol(tty));
    return;
  }
  qsort(names, n, sizeof(names[0]), ca__by_name);
  for (size_t i = 0; i < n; i++)
    ca__print_group(names[i], tty);
}
