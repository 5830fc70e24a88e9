/*
 * shared_limit (group.h): this process's entry in its group's region, its
 * bookings, and the asks between the group's processes.
 *
 * A process never gives its entry back as it exits: its memory is its own
 * until it has ended (a program linked to the driver holds its context to
 * the end), and the kernel says when it has: the process's life lock goes
 * as its descriptors close at its end. Whoever looks next (a
 * booking the cap refuses, a watcher every 100 ms, a process joining) then
 * takes its bookings back, however it ended.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "support/group.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/config.h"
#include "support/fork.h"
#include "support/group_region.h"
#include "support/log.h"

_Static_assert(CA_CONFIG_NAME_MAX == CA_GROUP_NAME_MAX + 1,
               "shared_limit takes every name a group may have");

/* How long a booking waits for the region's lock before it is refused: a
 * process stopped (SIGSTOP, a debugger) while it holds the lock must not
 * hang the whole group. */
#define CA__LOCK_WAIT_S 5

static ca_group_region *ca__r; /* set once, before ca__joined */
static int ca__fd = -1;
static _Atomic int ca__me = -1; /* this process's entry, -1 without one */
static atomic_bool ca__joined;
static atomic_bool ca__said_lock, ca__said_full;
static bool ca__tried;
static pthread_mutex_t ca__join_lock = PTHREAD_MUTEX_INITIALIZER;

#define CA__PROC(i) (&ca__r->proc[(i)])

static const char *ca__group_name(void) { return ca_config_get()->shared_limit; }

/* ---- The region's lock ------------------------------------------------- */

static void ca__reap_locked(void);

/* Each device's figure made the sum of its entries' again, after a
 * process died holding the lock, maybe between the two. */
static void ca__resum_locked(void) {
  for (int d = 0; d < CA_GROUP_DEVICES; d++) {
    uint64_t sum = 0;
    for (int i = 0; i < CA_GROUP_PROCS; i++)
      sum += atomic_load(&CA__PROC(i)->booked[d]);
    atomic_store(&ca__r->device[d].held, sum);
  }
}

/* The lock is free nearly always: one try, and only then the wait. (A
 * ThreadSanitizer build also sees a dead owner's lock taken over only
 * through the try.) */
static int ca__take_lock(void) {
  int rc = pthread_mutex_trylock(&ca__r->lock);
  if (rc != EBUSY)
    return rc;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += CA__LOCK_WAIT_S;
  return pthread_mutex_timedlock(&ca__r->lock, &until);
}

static bool ca__lock(void) {
  int rc = ca__take_lock();
  if (rc == EOWNERDEAD) {
    ca__resum_locked();
    ca__reap_locked();
    pthread_mutex_consistent(&ca__r->lock);
    return true;
  }
  if (rc != 0 && !atomic_exchange(&ca__said_lock, true))
    ca_log("shared_limit:%s: the group's lock %s; device memory that needs "
           "it is refused meanwhile",
           ca__group_name(),
           rc == ETIMEDOUT ? "has been held by another process for "
                             "5 s (one stopped while it held it?)"
                           : "cannot be recovered");
  return rc == 0;
}

static void ca__unlock(void) { pthread_mutex_unlock(&ca__r->lock); }

/* ---- Entries ------------------------------------------------------------ */

/* Entry i's bookings leave the devices' figures, then the entry is free. */
static void ca__drop_locked(int i) {
  ca_group_proc *p = CA__PROC(i);
  for (int d = 0; d < CA_GROUP_DEVICES; d++) {
    uint64_t b = atomic_exchange(&p->booked[d], 0);
    uint64_t held = atomic_load(&ca__r->device[d].held);
    atomic_store(&ca__r->device[d].held, held > b ? held - b : 0);
    atomic_store(&p->cached[d], 0);
  }
  atomic_store(&p->want, 0);
  atomic_store(&p->pid, 0);
}

/* Every dead process's entry dropped. */
static void ca__reap_locked(void) {
  int me = atomic_load(&ca__me);
  for (int i = 0; i < CA_GROUP_PROCS; i++)
    if (i != me && atomic_load(&CA__PROC(i)->pid) != 0 &&
        !ca_group_proc_alive(ca__fd, i))
      ca__drop_locked(i);
}

static bool ca__any_living_locked(void) {
  for (int i = 0; i < CA_GROUP_PROCS; i++)
    if (atomic_load(&CA__PROC(i)->pid) != 0)
      return true;
  return false;
}

/* A free entry whose life lock this process took, while the region is
 * still named (group_region.h, the gate): -1 when every entry is a living
 * process's, CA__UNNAMED when the region was removed meanwhile. */
#define CA__UNNAMED (-2)

static int ca__life_locked(void) {
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
      ca__reap_locked();
    for (int i = 0; i < CA_GROUP_PROCS; i++) {
      if (atomic_load(&CA__PROC(i)->pid) != 0 ||
          !ca_group_proc_life(ca__fd, i, F_WRLCK))
        continue;
      if (ca_group_linked(ca__fd))
        return i;
      ca_group_proc_life(ca__fd, i, F_UNLCK);
      return CA__UNNAMED;
    }
  }
  return -1;
}

/* This process's entry: a free one whose life lock it can take. */
static int ca__take_entry_locked(void) {
  ca_group_gate(ca__fd, F_RDLCK);
  int i = ca__life_locked();
  ca_group_gate(ca__fd, F_UNLCK);
  if (i < 0)
    return i;
  ca_group_proc *p = CA__PROC(i);
  snprintf(p->command, sizeof(p->command), "%s", program_invocation_short_name);
  atomic_store(&p->want, 0);
  atomic_store(&p->answered, atomic_load(&p->asked));
  atomic_store(&p->pid, (int32_t)getpid());
  atomic_store(&ca__me, i);
  return i;
}

/* The entry of this process, taken now if it has none (a forked child's
 * first booking); -1, said once, when every entry is a living process's,
 * or CA__UNNAMED when the region was removed (its other processes ended:
 * a joining process then opens the group anew). */
static int ca__entry_locked(void) {
  int me = atomic_load(&ca__me);
  if (me < 0)
    me = ca__take_entry_locked();
  if (me == CA__UNNAMED && atomic_load(&ca__joined) &&
      !atomic_exchange(&ca__said_full, true))
    ca_log("shared_limit:%s: the group's region was removed once its other "
           "processes ended; this forked process's device memory is refused",
           ca__group_name());
  else if (me == -1 && !atomic_exchange(&ca__said_full, true))
    ca_log("shared_limit:%s: %d processes of the group live already; this "
           "one's device memory is refused until one ends",
           ca__group_name(), CA_GROUP_PROCS);
  return me;
}

/* A forked child is a process of its own: it takes an entry of its own at
 * its first booking (its parent's life lock is not inherited). */
static void ca__child_has_no_entry(void) {
  pthread_mutex_init(&ca__join_lock, NULL);
  atomic_store(&ca__me, -1);
}

static const ca_fork_handlers ca__group_fork = {.child = ca__child_has_no_entry};

/* ---- Joining ------------------------------------------------------------ */

static void ca__refused(const ca_config *cfg, const char *why) {
  ca_log("shared_limit:%s: region refused: %s; memory_limit_mb=%llu caps "
         "this process alone",
         cfg->shared_limit, why,
         (unsigned long long)(cfg->memory_limit >> 20));
}

/* Under the lock: the region checked, the dead taken out, the cap this
 * process's when it found the group empty, and its entry. False, with
 * why, when refused; *removed when the region was removed meanwhile. */
static bool ca__enter_locked(const ca_config *cfg, char *why, size_t size,
                             bool *removed) {
  if (ca_group_region_impossible(ca__r, cfg->shared_limit, why, size))
    return false;
  ca__reap_locked();
  bool first = !ca__any_living_locked();
  *removed = ca__entry_locked() == CA__UNNAMED;
  if (*removed)
    return false;
  if (first) {
    atomic_store(&ca__r->cap, cfg->memory_limit);
    atomic_store(&ca__r->cap_pid, (int32_t)getpid());
  }
  return true;
}

/* Opens the group's region and takes an entry: NULL, with why, when
 * refused; *removed when the region was removed under the opening (its
 * last process had ended), to be opened again. */
static ca_group_region *ca__enter_region(const ca_config *cfg, char *why,
                                         size_t size, bool *removed) {
  int fd = -1;
  *removed = false;
  ca_group_region *r = ca_group_region_open(
      cfg->shared_limit, CA_GROUP_JOIN, cfg->memory_limit, &fd, why, size);
  if (r == NULL)
    return NULL;
  ca__r = r;
  ca__fd = fd;
  bool locked = ca__lock();
  bool entered = locked && ca__enter_locked(cfg, why, size, removed);
  if (locked)
    ca__unlock();
  if (entered)
    return r;
  if (!locked)
    snprintf(why, size, "its lock cannot be taken");
  ca__r = NULL;
  ca__fd = -1;
  ca_group_region_close(r, fd);
  return NULL;
}

/* Tries at most this many times to open a region another process may be
 * removing (its last process had ended). */
#define CA__JOIN_TRIES 8

static void ca__join_region(const ca_config *cfg) {
  char why[512];
  bool removed = true;
  ca_group_region *r = NULL;
  for (int i = 0; r == NULL && removed && i < CA__JOIN_TRIES; i++)
    r = ca__enter_region(cfg, why, sizeof(why), &removed);
  if (r == NULL) {
    if (removed)
      snprintf(why, sizeof(why), "it was removed %d times while joining",
               CA__JOIN_TRIES);
    ca__refused(cfg, why);
    return;
  }
  uint64_t cap = atomic_load(&r->cap);
  if (cap != cfg->memory_limit) {
    char text[32];
    ca_format_bytes(text, sizeof(text), cap);
    ca_log("shared_limit:%s: the group's cap is %s per device, the "
           "memory_limit_mb of pid %d, which found the group empty; "
           "memory_limit_mb=%llu here is not used",
           cfg->shared_limit, text, (int)atomic_load(&r->cap_pid),
           (unsigned long long)(cfg->memory_limit >> 20));
  }
  ca_fork_register(CA_FORK_GROUP, &ca__group_fork);
  atomic_store_explicit(&ca__joined, true, memory_order_release);
  /* Groups whose processes all ended leave no region behind. */
  ca_group_sweep(ca__fd);
}

bool ca_group_join(void) {
  if (atomic_load_explicit(&ca__joined, memory_order_acquire))
    return true;
  const ca_config *cfg = ca_config_get();
  if (cfg->shared_limit[0] == '\0' || cfg->memory_limit == 0)
    return false;
  pthread_mutex_lock(&ca__join_lock);
  if (!ca__tried) {
    ca__tried = true;
    ca__join_region(cfg);
  }
  pthread_mutex_unlock(&ca__join_lock);
  return atomic_load_explicit(&ca__joined, memory_order_acquire);
}

bool ca_group_joined(void) {
  return atomic_load_explicit(&ca__joined, memory_order_acquire);
}

uint64_t ca_group_cap(void) {
  return ca_group_joined() ? atomic_load(&ca__r->cap) : 0;
}

uint32_t ca_group_device(const uint8_t uuid[16]) {
  static const uint8_t none[16];
  if (!ca_group_joined() || memcmp(uuid, none, 16) == 0 || !ca__lock())
    return 0;
  uint32_t found = 0;
  for (int d = 0; d < CA_GROUP_DEVICES && !found; d++) {
    uint8_t *u = ca__r->device[d].uuid;
    if (memcmp(u, none, 16) == 0)
      memcpy(u, uuid, 16);
    if (memcmp(u, uuid, 16) == 0)
      found = (uint32_t)d + 1;
  }
  ca__unlock();
  if (!found)
    ca_log("shared_limit:%s: its region names %d devices already; this one "
           "is capped by memory_limit_mb in this process alone",
           ca__group_name(), CA_GROUP_DEVICES);
  return found;
}

/* ---- Bookings ----------------------------------------------------------- */

static bool ca__fits(uint32_t e, uint64_t bytes) {
  uint64_t held = atomic_load(&ca__r->device[e].held);
  uint64_t cap = atomic_load(&ca__r->cap);
  return bytes <= cap && held <= cap - bytes;
}

bool ca_group_book(uint32_t group, uint64_t bytes) {
  if (group == 0 || !ca__lock())
    return false;
  uint32_t e = group - 1;
  int me = ca__entry_locked();
  bool ok = me >= 0 &&
            (ca__fits(e, bytes) || (ca__reap_locked(), ca__fits(e, bytes)));
  if (ok) {
    atomic_fetch_add(&ca__r->device[e].held, bytes);
    atomic_fetch_add(&CA__PROC(me)->booked[e], bytes);
  }
  ca__unlock();
  return ok;
}

void ca_group_unbook(uint32_t group, uint64_t bytes) {
  if (group == 0 || !ca__lock())
    return;
  uint32_t e = group - 1;
  int me = atomic_load(&ca__me);
  if (me >= 0) {
    ca_group_proc *p = CA__PROC(me);
    uint64_t mine = atomic_load(&p->booked[e]);
    uint64_t n = bytes < mine ? bytes : mine;
    atomic_store(&p->booked[e], mine - n);
    atomic_fetch_sub(&ca__r->device[e].held, n);
  }
  ca__unlock();
}

uint64_t ca_group_held(uint32_t group) {
  return group ? atomic_load(&ca__r->device[group - 1].held) : 0;
}

void ca_group_reap(void) {
  if (ca_group_joined() && ca__lock()) {
    ca__reap_locked();
    ca__unlock();
  }
}

/* ---- Asking for room ---------------------------------------------------- */

static uint64_t ca__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether entry i has answered the ask numbered `ticket`, or never will
 * (it ended). */
static bool ca__answered(int i, uint32_t ticket) {
  ca_group_proc *p = CA__PROC(i);
  return (int32_t)(atomic_load(&p->answered) - ticket) >= 0 ||
         atomic_load(&p->pid) == 0 || !ca_group_proc_alive(ca__fd, i);
}

/* Under the lock: asks every other process holding memory on entry `e`,
 * noting the ticket each must answer. */
static void ca__ask_locked(uint32_t e, uint32_t *ticket, bool *waiting) {
  int me = atomic_load(&ca__me);
  for (int i = 0; i < CA_GROUP_PROCS; i++) {
    ca_group_proc *p = CA__PROC(i);
    if (i == me || atomic_load(&p->pid) == 0 ||
        atomic_load(&p->booked[e]) == 0)
      continue;
    atomic_fetch_or(&p->want, 1u << e);
    ticket[i] = atomic_fetch_add(&p->asked, 1) + 1;
    waiting[i] = true;
  }
}

bool ca_group_ask(uint32_t group, uint64_t bytes, int wait_ms) {
  if (group == 0 || !ca__lock())
    return false;
  uint32_t e = group - 1, ticket[CA_GROUP_PROCS];
  bool waiting[CA_GROUP_PROCS] = {false};
  uint64_t before = atomic_load(&ca__r->device[e].held);
  ca__ask_locked(e, ticket, waiting);
  ca__unlock();
  for (uint64_t until = ca__now_ms() + (uint64_t)wait_ms;;) {
    bool all = true;
    for (int i = 0; i < CA_GROUP_PROCS; i++) {
      if (waiting[i] && ca__answered(i, ticket[i]))
        waiting[i] = false;
      all = all && !waiting[i];
    }
    if (all || ca__fits(e, bytes) || ca__now_ms() >= until)
      break;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  ca_group_reap(); /* one that ended meanwhile holds nothing any more */
  return atomic_load(&ca__r->device[e].held) < before;
}

bool ca_group_wanted(uint32_t *devices, uint32_t *ticket) {
  int me = atomic_load(&ca__me);
  if (!ca_group_joined() || me < 0)
    return false;
  ca_group_proc *p = CA__PROC(me);
  uint32_t asked = atomic_load(&p->asked);
  if (asked == atomic_load(&p->answered))
    return false;
  *ticket = asked;
  *devices = atomic_exchange(&p->want, 0);
  return true;
}

void ca_group_answer(uint32_t ticket) {
  int me = atomic_load(&ca__me);
  if (ca_group_joined() && me >= 0)
    atomic_store(&CA__PROC(me)->answered, ticket);
}

void ca_group_note_cached(uint32_t group, uint64_t bytes) {
  int me = atomic_load(&ca__me);
  if (group && me >= 0)
    atomic_store(&CA__PROC(me)->cached[group - 1], bytes);
}

/* ---- The refusal -------------------------------------------------------- */

/* " pid P (COMMAND) HELD, CACHED cached;" for each process holding memory
 * on entry `e`, appended to line[*n..size). */
static void ca__holders(uint32_t e, char *line, size_t size, int *n) {
  int me = atomic_load(&ca__me);
  const char *sep = "";
  for (int i = 0; i < CA_GROUP_PROCS && *n > 0 && (size_t)*n < size; i++) {
    ca_group_proc *p = CA__PROC(i);
    int32_t pid = atomic_load(&p->pid);
    uint64_t b = atomic_load(&p->booked[e]);
    if (pid == 0 || b == 0)
      continue;
    char held[32], cached[32];
    ca_format_bytes(held, sizeof(held), b);
    ca_format_bytes(cached, sizeof(cached), atomic_load(&p->cached[e]));
    *n += snprintf(line + *n, size - (size_t)*n, "%s pid %d (%.31s%s) %s, %s cached",
                   sep, (int)pid, p->command, i == me ? ", this process" : "",
                   held, cached);
    sep = ";";
  }
}

void ca_group_say_refused(uint32_t group, int device, uint64_t asked,
                          uint64_t need) {
  if (group == 0 || ca__fits(group - 1, need))
    return;
  uint32_t e = group - 1;
  char line[1024], what[32], cap[32], held[32];
  ca_format_bytes(what, sizeof(what), asked);
  ca_format_bytes(cap, sizeof(cap), atomic_load(&ca__r->cap));
  ca_format_bytes(held, sizeof(held), atomic_load(&ca__r->device[e].held));
  int n = snprintf(line, sizeof(line),
                   "out of memory: %s asked on device %d would pass the cap "
                   "of shared_limit:%s, %s per device for the whole group "
                   "(memory_limit_mb); after every process was asked for its "
                   "cache, the group holds %s there:",
                   what, device, ca__group_name(), cap, held);
  ca__holders(e, line, sizeof(line), &n);
  ca_log("%s", line);
}
