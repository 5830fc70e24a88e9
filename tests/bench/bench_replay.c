/*
 * bench_replay: how much device memory the pool reserves for a real
 * program's allocation sequence, with no GPU: a trace recorded on a GPU
 * machine by trace_alloc (see tests/bench/trace_alloc.c), or through
 * PyTorch's allocator slot by slot_trace (slot_trace.c), is replayed
 * through the pool over the fake backend.
 *
 *   bench_replay TRACE [immediate|safe[+expandable][+stream[+held]]
 *                      [LAG [HEAD]]]
 *
 * TRACE is a trace file ("-": standard input, e.g. from zcat). Under safe,
 * the fake backend fences as the CUDA one does, and the fake device runs
 * LAG operations (default 500) behind the host: a marker passes once LAG
 * more operations have been replayed after it (how far a training loop's
 * host thread runs ahead of its kernels), or at once when the pool waits
 * for it (the device catches up while the host waits). HEAD: the bytes
 * before each segment's first block (default 512, the library's under
 * leak_scan:1; 0 as under leak_scan:0). +expandable: as under
 * expandable_segments:1, the fake mapping 2 MiB pages into ranges.
 * +stream: every request and free names a stream, as through the
 * allocator slot (ca_pool_alloc_on, ca_pool_free_on: each stream's free
 * blocks, docs/POOL.md). Where the
 * trace has a stream column (slot_trace.c records one), each names its
 * own: the trace's number + 1, so that a trace of the default stream alone
 * replays as one without the column, whose operations all name stream 1.
 * A block recorded on another stream (`r` lines: Tensor.record_stream) is
 * freed on its own stream at once, as cudalloc's slot does it: there its
 * stream waits for the other's work (an event) before the block is reused,
 * so reuse on its own stream needs no delay, and reuse elsewhere waits for
 * the marker its stream's blocks are shared behind anyway.
 * +held (with +stream): PyTorch's own allocator instead: such a block's
 * free is held back LAG operations, as PyTorch keeps the block until an
 * event recorded on the other stream at the free has passed (the fake
 * device passes it LAG operations later, as a marker). The pool counts the
 * block requested until then, as PyTorch counts it allocated.
 * Without +stream, streams and `r` lines are ignored (the fences order
 * every stream).
 * Prints, for a trace with streams, how many it names and its
 * record_stream lines; the peaks of the bytes the program held
 * (requested), the pool's blocks (allocated) and the pool's segments
 * (reserved), the overhead
 * (reserved over requested, at their peaks); the growth that set the
 * reserved peak: the request, what the program held, and the cache it
 * found (free bytes, the largest block, pending bytes); the driver calls
 * the pool made: segments reserved and released, markers made and waited
 * for; the
 * least any placement could reserve that started every block over 1 MiB
 * on a 2 MiB boundary, as the driver does (docs/COMPATIBILITY.md); then
 * the segments reserved and released in each sixth of the trace (the
 * recorded traces hold six training steps, so a sixth is about a step: a
 * steady loop should make none after the first one or two).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_backend.h"
#include "pool/pool.h"

/* The trace's addresses, mapped to the pool's: open addressing. Under
 * +stream, each with the stream it was served on and whether the trace
 * recorded it on another. */
#define MAP_BITS 20
#define MAP_SIZE (1u << MAP_BITS)

typedef struct map_entry {
  uint64_t from, to, size;
  uint32_t stream;
  bool recorded;
} map_entry;

static map_entry map[MAP_SIZE];

static map_entry *map_slot(uint64_t from) {
  uint64_t i = (from * 0x9E3779B97F4A7C15ull) >> (64 - MAP_BITS);
  while (map[i].from != 0 && map[i].from != from)
    i = (i + 1) & (MAP_SIZE - 1);
  return &map[i];
}

static void map_remove(map_entry *e) {
  /* Backward-shift deletion keeps every probe chain unbroken. */
  size_t i = (size_t)(e - map);
  for (size_t j = (i + 1) & (MAP_SIZE - 1); map[j].from != 0;
       j = (j + 1) & (MAP_SIZE - 1)) {
    size_t home = (map[j].from * 0x9E3779B97F4A7C15ull) >> (64 - MAP_BITS);
    if (((j - home) & (MAP_SIZE - 1)) >= ((j - i) & (MAP_SIZE - 1))) {
      map[i] = map[j];
      i = j;
    }
  }
  map[i].from = 0;
}

/* The operation at which each marker was made (markers count from 1). */
#define MAX_MARKS (1u << 20)
static uint64_t mark_op[MAX_MARKS];
static uint64_t ops;
static int (*fake_mark)(void *ctx, int device, uint64_t *marker);
static int (*fake_mark_on)(void *ctx, int device, uint64_t stream,
                           uint64_t *marker);

static int mark_now(void *ctx, int device, uint64_t *marker) {
  int rc = fake_mark(ctx, device, marker);
  if (rc == 0 && *marker < MAX_MARKS)
    mark_op[*marker] = ops;
  return rc;
}

/* Markers of one stream's work (sharing its free blocks) are made by
 * mark_on, which the fake serves without going through backend.mark:
 * stamped here too, or they would pass at once rather than LAG operations
 * later. */
static int mark_on_now(void *ctx, int device, uint64_t stream,
                       uint64_t *marker) {
  int rc = fake_mark_on(ctx, device, stream, marker);
  if (rc == 0 && *marker < MAX_MARKS)
    mark_op[*marker] = ops;
  return rc;
}

/* A trace's operations, read whole first, so that each can be placed in
 * its sixth of the trace: `a`, `f` and `r` lines. */
typedef struct trace_op {
  char kind;
  uint64_t addr, size;
  uint32_t stream; /* the line's stream number + 1; 0: the line has none */
} trace_op;

#define SIXTHS 6

static void die(const char *what) {
  fprintf(stderr, "bench_replay: %s\n", what);
  exit(1);
}

static double gib(uint64_t bytes) { return (double)bytes / (1u << 30); }
static double mib(uint64_t bytes) { return (double)bytes / (1u << 20); }

/* Stream numbers seen (below MAX_STREAMS), for the summary. */
#define MAX_STREAMS 1024
static bool stream_seen[MAX_STREAMS];
static int streams_named;

/* Reads the allocations, frees and record_stream lines of a trace (with or
 * without the stream column: trace_alloc.c's and slot_trace.c's); other
 * lines are skipped. */
static trace_op *read_trace(FILE *in, size_t *count) {
  trace_op *ops_read = NULL;
  size_t n = 0, cap = 0;
  char line[256];
  while (fgets(line, sizeof(line), in)) {
    unsigned long long addr, size = 0, id = 0;
    int thread, got = 0;
    char kind = line[0];
    bool named = false;
    if (kind == 'a') {
      got = sscanf(line, "a %llx %llu %d %llu", &addr, &size, &thread, &id);
      named = got == 4;
    } else if (kind == 'f') {
      got = sscanf(line, "f %llx %d %llu", &addr, &thread, &id) + 1;
      named = got == 4;
    } else if (kind == 'r') {
      got = sscanf(line, "r %llx %llu", &addr, &id) == 2 ? 2 : 0;
      named = true;
    }
    if (got < 2 || id >= UINT32_MAX)
      continue;
    if (named && id < MAX_STREAMS && !stream_seen[id]) {
      stream_seen[id] = true;
      streams_named++;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 4096;
      ops_read = realloc(ops_read, cap * sizeof(*ops_read));
      if (ops_read == NULL)
        die("out of host memory");
    }
    ops_read[n++] = (trace_op){.kind = kind, .addr = addr, .size = size,
                               .stream = named ? (uint32_t)id + 1 : 0};
  }
  *count = n;
  return ops_read;
}

/* The least reserved memory that any placement starting every block over
 * DRIVER_ALIGN_FROM on a DRIVER_ALIGN boundary (the driver's alignment,
 * driver_facts.txt) needs at the trace's worst moment, whatever it packs:
 * such a block takes its whole 2 MiB granules, as segments are made of
 * them, and only requests up to 1 MiB can use the tail of its last one
 * (no other aligned block starts before the next boundary). */
#define DRIVER_ALIGN_FROM (1u << 20)
#define DRIVER_ALIGN (2u << 20)

static struct {
  uint64_t aligned, tails, unaligned, worst;
} floor_;

/* Counts a block of `size` bytes made (live) or freed. */
static void floor_count(uint64_t size, bool live) {
  uint64_t granules = (size + DRIVER_ALIGN - 1) / DRIVER_ALIGN * DRIVER_ALIGN;
  if (size > DRIVER_ALIGN_FROM) {
    floor_.aligned = live ? floor_.aligned + granules : floor_.aligned - granules;
    floor_.tails = live ? floor_.tails + (granules - size) : floor_.tails - (granules - size);
  } else {
    floor_.unaligned = live ? floor_.unaligned + size : floor_.unaligned - size;
  }
  uint64_t rest = floor_.unaligned > floor_.tails ? floor_.unaligned - floor_.tails : 0;
  if (floor_.aligned + rest > floor_.worst)
    floor_.worst = floor_.aligned + rest;
}

/* +stream: requests and frees name streams; +held: recorded blocks' frees
 * wait LAG operations. */
static bool streams, held;
static uint64_t lag;

/* The stream an operation names under +stream: its own, else 1. */
static uint32_t op_stream(const trace_op *op) {
  return op->stream ? op->stream : 1;
}

/* +held: frees waiting for the device, oldest first (all wait LAG
 * operations, so the queue is in order of release). */
typedef struct held_free {
  uint64_t addr, stream, due;
} held_free;

static held_free *held_q;
static size_t held_head, held_tail, held_cap;
static uint64_t records, records_other, frees_held;

static void hold_free(uint64_t addr, uint64_t stream) {
  if (held_tail == held_cap && held_head > 0) {
    /* Room at the end: slide the waiting ones to the front. */
    memmove(held_q, held_q + held_head,
            (held_tail - held_head) * sizeof(*held_q));
    held_tail -= held_head;
    held_head = 0;
  }
  if (held_tail == held_cap) {
    held_cap = held_cap ? 2 * held_cap : 1024;
    held_q = realloc(held_q, held_cap * sizeof(*held_q));
    if (held_q == NULL)
      die("out of host memory");
  }
  held_q[held_tail++] =
      (held_free){.addr = addr, .stream = stream, .due = ops + lag};
  frees_held++;
}

/* Frees whose stream's work has passed by now go to the pool. */
static void release_held(ca_pool *pool) {
  for (; held_head < held_tail && held_q[held_head].due <= ops; held_head++)
    if (!ca_pool_free_on(pool, held_q[held_head].addr, held_q[held_head].stream,
                         NULL))
      die("a held free of an address not allocated");
}

static void replay_op(ca_pool *pool, const trace_op *op) {
  map_entry *e = map_slot(op->addr);
  if (op->kind == 'r') {
    /* PyTorch ignores a record on the block's own stream; so does this.
     * A record of an address not live is skipped, not fatal. */
    records++;
    if (streams && e->from != 0 && op_stream(op) != e->stream) {
      e->recorded = true;
      records_other++;
    }
  } else if (op->kind == 'a') {
    if (e->from != 0)
      die("an address allocated twice");
    uint32_t s = op_stream(op);
    if ((streams ? ca_pool_alloc_on(pool, op->size, 0, s, &e->to)
                 : ca_pool_alloc(pool, op->size, 0, &e->to)) != 0)
      die("the pool failed an allocation");
    e->from = op->addr;
    e->size = (op->size + CA_GRANULE - 1) / CA_GRANULE * CA_GRANULE;
    e->stream = s;
    e->recorded = false;
    floor_count(e->size, true);
  } else {
    /* The program let go of the bytes here, whenever the pool takes them
     * back: the floor counts them free now. The trace's address is free
     * now too (the driver may hand it out again at once). */
    if (e->from == 0)
      die("a free of an address not allocated");
    if (streams && held && e->recorded)
      hold_free(e->to, op_stream(op));
    else if (!(streams ? ca_pool_free_on(pool, e->to, op_stream(op), NULL)
                       : ca_pool_free(pool, e->to, NULL)))
      die("a free of an address not allocated");
    floor_count(e->size, false);
    map_remove(e);
  }
}

/* The moment the pool reserved the most: the request that made it grow
 * there, and the cache as that request found it. It tells a peak made by
 * packing (much free, no block large enough) from one made by the program
 * holding more. */
typedef struct peak_moment {
  size_t op;
  uint64_t size, reserved, requested, free_cached, pending, largest;
} peak_moment;

/* The pool's figures now. */
static cudalloc_device_stats pool_stats(ca_pool *pool) {
  cudalloc_device_stats s = {0};
  ca_pool_get_stats(pool, &s);
  return s;
}

/* Replays op i, noting in *peak the cache it found if it made the pool
 * grow (a segment reserved or pages mapped) to a new reserved peak. */
static void replay_noting_peak(ca_pool *pool, const trace_op *op, size_t i,
                               const ca_fake_backend *fake, peak_moment *peak) {
  int calls = fake->reserves + fake->maps;
  cudalloc_device_stats before = {0};
  if (op->kind == 'a')
    before = pool_stats(pool);
  replay_op(pool, op);
  if (op->kind != 'a' || fake->reserves + fake->maps == calls)
    return;
  uint64_t reserved = pool_stats(pool).reserved_bytes.current;
  if (reserved <= peak->reserved)
    return;
  *peak = (peak_moment){.op = i,
                        .size = op->size,
                        .reserved = reserved,
                        .requested = before.requested_bytes.current,
                        .free_cached = before.free_cached_bytes,
                        .pending = before.pending_free_bytes,
                        .largest = before.largest_free_block};
}

/* Prints one count per sixth of the trace, slash-separated. */
static void print_sixths(const char *what, const int *counts) {
  printf("%s", what);
  for (int i = 0; i < SIXTHS; i++)
    printf("%s%d", i ? "/" : " ", counts[i]);
}

int main(int argc, char **argv) {
  if (argc < 2)
    die("usage: bench_replay TRACE "
        "[immediate|safe[+expandable][+stream[+held]] [LAG [HEAD]]]");
  FILE *in = strcmp(argv[1], "-") == 0 ? stdin : fopen(argv[1], "r");
  if (in == NULL)
    die("cannot open the trace");
  bool safe = argc > 2 && strncmp(argv[2], "safe", 4) == 0;
  bool expandable = argc > 2 && strstr(argv[2], "+expandable") != NULL;
  streams = argc > 2 && strstr(argv[2], "+stream") != NULL;
  held = argc > 2 && strstr(argv[2], "+held") != NULL;
  lag = argc > 3 ? strtoull(argv[3], NULL, 10) : 500;
  /* Segment heads as the library makes them by default (leak_scan:1); 0
   * for leak_scan:0. */
  uint64_t head = argc > 4 ? strtoull(argv[4], NULL, 10) : CA_GRANULE;
  size_t count;
  trace_op *trace = read_trace(in, &count);

  static ca_fake_backend fake;
  ca_fake_init(&fake, 1ull << 40, true, false);
  fake.auto_pass = false;
  fake.backend.fence = ca_fake_fence;
  fake_mark = fake.backend.mark;
  fake.backend.mark = mark_now;
  fake_mark_on = fake.backend.mark_on;
  fake.backend.mark_on = mark_on_now;
  if (expandable)
    ca_fake_enable_ranges(&fake);
  ca_pool_options opt = {.max_split_size = UINT64_MAX,
                         .reuse = safe ? CA_REUSE_SAFE : CA_REUSE_IMMEDIATE,
                         .segment_head = head,
                         .expandable = expandable};
  ca_pool *pool = ca_pool_create(&fake.backend, 0, &opt);
  if (pool == NULL)
    die("out of host memory");

  /* Segments reserved and released; pages mapped and unmapped count as
   * such calls too. */
  int reserves[SIXTHS] = {0}, releases[SIXTHS] = {0};
  peak_moment peak = {0};
  uint64_t mapped[SIXTHS] = {0};
  for (size_t i = 0; i < count; i++) {
    if (trace[i].kind == 'r') { /* no operation of the pool's: no time */
      replay_op(pool, &trace[i]);
      continue;
    }
    int sixth = (int)(i * SIXTHS / count);
    int reserves_before = fake.reserves + fake.maps;
    int releases_before = fake.releases + fake.unmaps;
    uint64_t mapped_before = fake.mapped_total;
    release_held(pool);
    replay_noting_peak(pool, &trace[i], i, &fake, &peak);
    mapped[sixth] += fake.mapped_total - mapped_before;
    reserves[sixth] += fake.reserves + fake.maps - reserves_before;
    releases[sixth] += fake.releases + fake.unmaps - releases_before;
    /* The device finishes what was queued LAG operations ago. */
    ops++;
    while (fake.passed < (uint64_t)fake.marks &&
           fake.passed + 1 < MAX_MARKS && mark_op[fake.passed + 1] + lag <= ops)
      fake.passed++;
  }
  free(trace);
  free(held_q);
  cudalloc_device_stats s;
  ca_pool_get_stats(pool, &s);
  printf("bench_replay: %llu operations, %s reuse%s%s", (unsigned long long)ops,
         safe ? "safe" : "immediate", expandable ? ", expandable segments" : "",
         !streams ? ""
         : streams_named > 1
             ? ", each operation on its own stream (the slot's way)"
             : ", one named stream (the slot's way)");
  if (streams && held)
    printf(", recorded blocks' frees held back");
  if (safe)
    printf(", the device %llu operations behind", (unsigned long long)lag);
  printf("\n");
  if (streams_named > 0 || records > 0)
    printf("bench_replay: %d streams named by the trace; %llu record_stream "
           "lines, %llu on another stream than the block's own%s; "
           "%llu frees held back\n",
           streams_named, (unsigned long long)records,
           (unsigned long long)records_other, streams ? "" : " (ignored)",
           (unsigned long long)frees_held);
  printf("bench_replay: peak requested %.3f GiB, allocated %.3f GiB, "
         "reserved %.3f GiB (%llu segments)\n",
         gib(s.requested_bytes.peak), gib(s.allocated_bytes.peak),
         gib(s.reserved_bytes.peak), (unsigned long long)s.segments.peak);
  printf("bench_replay: overhead %.1f%% (reserved over requested, at peaks)\n",
         100.0 * ((double)s.reserved_bytes.peak / (double)s.requested_bytes.peak -
                  1.0));
  printf("bench_replay: the reserved peak came at operation %zu of %zu (sixth "
         "%zu), growing the pool for a request of %.3f MiB: the program held "
         "%.3f GiB, %.1f MiB sat free in the cache, ",
         peak.op + 1, count, peak.op * SIXTHS / count + 1, mib(peak.size),
         gib(peak.requested), mib(peak.free_cached));
  printf("its largest block %.3f MiB", mib(peak.largest));
  if (peak.largest < peak.size && peak.size - peak.largest < (1u << 20))
    printf(" (%.1f KiB short)", (double)(peak.size - peak.largest) / 1024);
  printf(", %.1f MiB pending\n", mib(peak.pending));
  printf("bench_replay: blocks over 1 MiB on 2 MiB boundaries, as the "
         "driver places them, would need at least %.3f GiB reserved "
         "(any placement)\n",
         gib(floor_.worst));
  printf("bench_replay: driver calls: %d segments reserved, %d released; "
         "%d ranges reserved, %d maps, %d unmaps; "
         "%d markers made, %d waited for; %d fences\n",
         fake.reserves, fake.releases, fake.va_reserves, fake.maps,
         fake.unmaps, fake.marks, fake.waits, fake.fences);
  print_sixths("bench_replay: by sixth of the trace: segments reserved",
               reserves);
  print_sixths(", released", releases);
  if (expandable) {
    printf("; MiB mapped");
    for (int i = 0; i < SIXTHS; i++)
      printf("%s%llu", i ? "/" : " ", (unsigned long long)(mapped[i] >> 20));
  }
  printf("\n");
  ca_pool_destroy(pool);
  return 0;
}
