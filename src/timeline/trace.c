/*
 * The allocation timeline (see trace.h): a ring the allocating threads fill
 * and the watcher drains into a Chrome trace.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "timeline/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "support/log.h"
#include "support/meta.h"

bool ca_trace_recording;

/* One event. `seq` publishes it (Vyukov's bounded queue): a producer owns
 * slot pos once seq == pos, the consumer once seq == pos + 1. */
typedef struct ca__event {
  uint64_t seq;
  uint64_t ns;
  uint64_t addr, bytes;
  uint32_t stack;
  int16_t device;
  uint8_t kind; /* ca_trace_kind */
} ca__event;

#define CA__RING (1u << 18) /* 10 MiB: over a second of 200k allocations */
#define CA__OUT (64u << 10)

static ca__event *ca__ring;
static uint64_t ca__head;    /* next slot to claim (atomic) */
static uint64_t ca__tail;    /* next slot to drain (the writer's) */
static uint64_t ca__dropped; /* events lost to a full ring (atomic) */
static uint64_t ca__dropped_said;

/* The writer's state, under its lock: the watcher and exit both write. */
static pthread_mutex_t ca__write_lock = PTHREAD_MUTEX_INITIALIZER;
static int ca__fd = -1;
static bool ca__allocations;
static char ca__out[CA__OUT];
static size_t ca__out_len;
static uint64_t *ca__named; /* a bit per stack id whose frames were written */
static size_t ca__named_words;
static int ca__pid;
static char ca__path[600]; /* the file, once open */

/* Each device's requested bytes live, as the events tell them, and their
 * peak: written at most once a millisecond of the events' own time while
 * it climbs, and at the end of each drain, so a run's every plateau shows
 * and the file stays small while a program ramps up. */
#define CA__DEVICES 64
#define CA__PEAK_GAP_NS 1000000u
typedef struct ca__level {
  uint64_t live, peak, peak_ns, written, written_ns;
} ca__level;
static ca__level ca__levels[CA__DEVICES];

static uint64_t ca__now_us(uint64_t ns) { return ns / 1000; }

static uint64_t ca__trace_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- Producers -------------------------------------------------------------- */

static void ca__push(int device, uint64_t addr, uint64_t bytes, uint32_t stack,
                     ca_trace_kind kind) {
  uint64_t pos = __atomic_load_n(&ca__head, __ATOMIC_RELAXED);
  for (;;) {
    ca__event *e = &ca__ring[pos & (CA__RING - 1)];
    uint64_t seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      if (__atomic_compare_exchange_n(&ca__head, &pos, pos + 1, true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        e->ns = ca__trace_ns();
        e->addr = addr;
        e->bytes = bytes;
        e->stack = stack;
        e->device = (int16_t)device;
        e->kind = (uint8_t)kind;
        __atomic_store_n(&e->seq, pos + 1, __ATOMIC_RELEASE);
        return;
      }
    } else if (dif < 0) {
      __atomic_fetch_add(&ca__dropped, 1, __ATOMIC_RELAXED); /* full */
      return;
    } else {
      pos = __atomic_load_n(&ca__head, __ATOMIC_RELAXED);
    }
  }
}

void ca_trace_slow(int device, uint64_t addr, uint64_t bytes, uint32_t stack,
                   ca_trace_kind kind) {
  if (ca__allocations)
    ca__push(device, addr, bytes, stack, kind);
}

/* ---- The file ------------------------------------------------------------------ */

static void ca__trace_flush(void) {
  if (ca__fd >= 0 && ca__out_len > 0) {
    size_t done = 0;
    while (done < ca__out_len) {
      ssize_t n = write(ca__fd, ca__out + done, ca__out_len - done);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      done += (size_t)n;
    }
  }
  ca__out_len = 0;
}

static void ca__put(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void ca__put(const char *fmt, ...) {
  va_list ap;
  for (int attempt = 0; attempt < 2; attempt++) {
    va_start(ap, fmt);
    int n = vsnprintf(ca__out + ca__out_len, CA__OUT - ca__out_len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < CA__OUT - ca__out_len) {
      ca__out_len += (size_t)n;
      return;
    }
    ca__trace_flush(); /* then once more into an empty buffer */
  }
}

/* A JSON string's body: quotes, backslashes and controls escaped. */
static void ca__put_string(const char *s) {
  ca__put("\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      ca__put("\\%c", c);
    else if (c < 0x20)
      ca__put("\\u%04x", c);
    else
      ca__put("%c", c);
  }
  ca__put("\"");
}

/* The file, named after this process, created 0600 without following a
 * link, refused when it is not a regular file of this user. */
static int ca__open(const char *template) {
  char path[600];
  if (!ca_log_expand_path(template, (int)getpid(), path, sizeof(path))) {
    ca_log("trace_path:%.80s...: too long a path: no trace", template);
    return -1;
  }
  size_t n = strlen(path);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                0600);
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid())) {
    close(fd);
    fd = -1;
    errno = EPERM;
  }
  if (fd < 0)
    ca_log("trace_path:%s: cannot write the trace there (%s): no trace", path,
           strerror(errno));
  else
    memcpy(ca__path, path, n + 1);
  return fd;
}

bool ca_trace_start(const char *path_template, bool allocations, uint64_t start_ns) {
  pthread_mutex_lock(&ca__write_lock);
  bool ok = ca__fd >= 0;
  if (!ok && (!allocations || (ca__ring = ca_meta_alloc(CA__RING * sizeof(*ca__ring)))))
    ca__fd = ca__open(path_template);
  ok = ca__fd >= 0;
  if (ok && !ca_trace_recording) {
    for (uint32_t i = 0; allocations && i < CA__RING; i++)
      ca__ring[i].seq = i;
    ca__allocations = allocations;
    ca__pid = (int)getpid();
    ca__put("[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":", ca__pid);
    ca__put_string(program_invocation_short_name);
    ca__put("}},\n{\"name\":\"cudalloc_trace\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"version\":%d",
            ca__pid, CA_TRACE_VERSION);
    ca__put("}},\n{\"name\":\"program start\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%" PRIu64
            ",\"pid\":%d}", ca__now_us(start_ns), ca__pid);
    ca__trace_flush();
    __atomic_store_n(&ca_trace_recording, true, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&ca__write_lock);
  return ok;
}

/* ---- The writer ------------------------------------------------------------------- */

static void ca__line_out(const char *text, void *arg) {
  bool *first = arg;
  ca__put("%s", *first ? "" : ",");
  ca__put_string(text);
  *first = false;
}

/* A stack's frames, the first time an allocation names it. */
static void ca__name_stack(uint32_t stack, ca_trace_namer name) {
  if (stack == 0 || name == NULL)
    return;
  size_t word = stack / 64;
  if (word >= ca__named_words) {
    size_t words = word * 2 + 64;
    uint64_t *v = ca_meta_grow(ca__named, ca__named_words * 8, words * 8);
    if (v == NULL)
      return;
    ca__named = v;
    ca__named_words = words;
  }
  if (ca__named[word] & (1ull << (stack % 64)))
    return;
  ca__named[word] |= 1ull << (stack % 64);
  ca__put(",\n{\"name\":\"cudalloc_stack\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"id\":%u,"
          "\"frames\":[", ca__pid, stack);
  bool first = true;
  name(stack, ca__line_out, &first);
  ca__put("]}}");
}

/* One of a device's counters, `what`, alone: a peak, stamped when it came. */
static void ca__put_peak(int device, uint64_t ns, const char *what, uint64_t bytes) {
  ca__put(",\n{\"name\":\"device %d\",\"ph\":\"C\",\"ts\":%" PRIu64 ",\"pid\":%d,"
          "\"args\":{\"%s\":%" PRIu64 "}}", device, ca__now_us(ns), ca__pid, what, bytes);
}

/* Under the lock: the event's bytes in its device's level; a new peak
 * written when the last was a millisecond ago. */
static void ca__count_event(const ca__event *e) {
  if (e->device < 0 || e->device >= CA__DEVICES || e->kind > CA_TRACE_FREE)
    return;
  ca__level *l = &ca__levels[e->device];
  if (e->kind == CA_TRACE_FREE) {
    l->live -= e->bytes < l->live ? e->bytes : l->live; /* dropped events */
    return;
  }
  l->live += e->bytes;
  if (l->live <= l->peak)
    return;
  l->peak = l->live;
  l->peak_ns = e->ns;
  if (l->written == 0 || e->ns - l->written_ns >= CA__PEAK_GAP_NS) {
    ca__put_peak(e->device, e->ns, "requested", l->peak);
    l->written = l->peak;
    l->written_ns = e->ns;
  }
}

/* Under the lock, after a drain: each device's peak not yet written. */
static void ca__write_peaks(void) {
  for (int d = 0; d < CA__DEVICES; d++) {
    ca__level *l = &ca__levels[d];
    if (l->peak > l->written) {
      ca__put_peak(d, l->peak_ns, "requested", l->peak);
      l->written = l->peak;
      l->written_ns = l->peak_ns;
    }
  }
}

/* The pool's memory: a segment as an async slice of its own name, pages
 * as instants (an unmapping need not match one mapping). */
static void ca__write_memory(const ca__event *e) {
  if (e->kind == CA_TRACE_SEGMENT || e->kind == CA_TRACE_RELEASE) {
    ca__put(",\n{\"name\":\"segment\",\"cat\":\"cudalloc_segment\",\"ph\":\"%s\",\"id\":\"0x%" PRIx64
            "\",\"ts\":%" PRIu64 ",\"pid\":%d,\"tid\":1,\"args\":{\"device\":%d,\"bytes\":%" PRIu64
            "}}", e->kind == CA_TRACE_SEGMENT ? "b" : "e", e->addr, ca__now_us(e->ns), ca__pid,
            (int)e->device, e->bytes);
    return;
  }
  ca__put(",\n{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%" PRIu64 ",\"pid\":%d,"
          "\"args\":{\"device\":%d,\"addr\":\"0x%" PRIx64 "\",\"bytes\":%" PRIu64 "}}",
          e->kind == CA_TRACE_MAP ? "segment map" : "segment unmap", ca__now_us(e->ns), ca__pid,
          (int)e->device, e->addr, e->bytes);
}

static void ca__write_event(const ca__event *e, ca_trace_namer name) {
  if (e->kind > CA_TRACE_FREE) {
    ca__write_memory(e);
    return;
  }
  if (e->kind == CA_TRACE_FREE) {
    ca__put(",\n{\"name\":\"allocation\",\"cat\":\"cudalloc\",\"ph\":\"e\",\"id\":\"0x%" PRIx64
            "\",\"ts\":%" PRIu64 ",\"pid\":%d,\"tid\":0}", e->addr, ca__now_us(e->ns), ca__pid);
    return;
  }
  ca__name_stack(e->stack, name);
  ca__put(",\n{\"name\":\"allocation\",\"cat\":\"cudalloc\",\"ph\":\"b\",\"id\":\"0x%" PRIx64
          "\",\"ts\":%" PRIu64 ",\"pid\":%d,\"tid\":0,\"args\":{\"device\":%d,\"bytes\":%" PRIu64
          ",\"stack\":%u}}", e->addr, ca__now_us(e->ns), ca__pid, (int)e->device, e->bytes,
          e->stack);
}

/* Under the lock: every event published so far. */
static void ca__drain_ring(ca_trace_namer name) {
  for (; ca__ring != NULL; ca__tail++) {
    ca__event *e = &ca__ring[ca__tail & (CA__RING - 1)];
    if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != ca__tail + 1)
      break;
    ca__event copy = *e;
    __atomic_store_n(&e->seq, ca__tail + CA__RING, __ATOMIC_RELEASE);
    ca__write_event(&copy, name);
    ca__count_event(&copy);
  }
  ca__write_peaks();
  uint64_t dropped = __atomic_load_n(&ca__dropped, __ATOMIC_RELAXED);
  if (dropped != ca__dropped_said) {
    ca__put(",\n{\"name\":\"events dropped (ring full)\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%" PRIu64
            ",\"pid\":%d,\"args\":{\"dropped\":%" PRIu64 "}}", ca__now_us(ca__trace_ns()),
            ca__pid, dropped);
    ca__dropped_said = dropped;
  }
}

void ca_trace_counter(int device, uint64_t requested, uint64_t allocated,
                      uint64_t reserved) {
  pthread_mutex_lock(&ca__write_lock);
  if (ca__fd >= 0)
    ca__put(",\n{\"name\":\"device %d\",\"ph\":\"C\",\"ts\":%" PRIu64 ",\"pid\":%d,"
            "\"args\":{\"requested\":%" PRIu64 ",\"allocated\":%" PRIu64
            ",\"reserved\":%" PRIu64 "}}",
            device, ca__now_us(ca__trace_ns()), ca__pid, requested, allocated, reserved);
  pthread_mutex_unlock(&ca__write_lock);
}

void ca_trace_reserved_peak(int device, uint64_t at_ns, uint64_t reserved) {
  pthread_mutex_lock(&ca__write_lock);
  if (ca__fd >= 0)
    ca__put_peak(device, at_ns, "reserved", reserved);
  pthread_mutex_unlock(&ca__write_lock);
}

void ca_trace_instant(int device, const char *what) {
  pthread_mutex_lock(&ca__write_lock);
  if (ca__fd >= 0) {
    ca__put(",\n{\"name\":");
    ca__put_string(what);
    ca__put(",\"ph\":\"i\",\"s\":\"p\",\"ts\":%" PRIu64 ",\"pid\":%d,\"args\":{\"device\":%d}}",
            ca__now_us(ca__trace_ns()), ca__pid, device);
  }
  pthread_mutex_unlock(&ca__write_lock);
}

void ca_trace_drain(ca_trace_namer name) {
  pthread_mutex_lock(&ca__write_lock);
  if (ca__fd >= 0) {
    ca__drain_ring(name);
    ca__trace_flush();
  }
  pthread_mutex_unlock(&ca__write_lock);
}

void ca_trace_finish(ca_trace_namer name) {
  pthread_mutex_lock(&ca__write_lock);
  if (ca__fd >= 0 && ca__pid == (int)getpid()) {
    __atomic_store_n(&ca_trace_recording, false, __ATOMIC_RELEASE);
    ca__drain_ring(name);
    ca__put("\n]\n");
    ca__trace_flush();
    close(ca__fd);
    ca__fd = -1;
  }
  pthread_mutex_unlock(&ca__write_lock);
}

void ca_trace_forget(void) {
  pthread_mutex_init(&ca__write_lock, NULL);
  __atomic_store_n(&ca_trace_recording, false, __ATOMIC_RELAXED);
  if (ca__fd >= 0)
    close(ca__fd);
  ca__fd = -1;
  ca__out_len = 0;
}

const char *ca_trace_file(void) {
  return __atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE) ? ca__path : NULL;
}
