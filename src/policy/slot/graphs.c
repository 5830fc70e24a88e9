/*
 * The blocks of CUDA graphs captured through the allocator slot (see
 * graphs.h): the graphs in a small table, their blocks in an address map
 * in the library's own data, all under one lock (captures and releases are
 * rare; a free looks only while some graph holds blocks).
 */
#include "policy/slot/graphs.h"

#include <pthread.h>
#include <stdatomic.h>

#include "policy/slot/addrmap.h"
#include "support/fork.h"

typedef struct ca__graph {
  int device;
  uint64_t stream;
  bool held; /* captured and not yet released */
  bool open; /* its capture is under way */
  uint32_t freed; /* blocks the program freed, ready for its capture */
} ca__graph;

typedef struct ca__held {
  uint64_t addr;
  uint64_t requested;
  int graph;
  bool freed;
} ca__held;

static ca__graph ca__graphs[CA_GRAPHS_MAX + 1]; /* by number; 0 unused */
static ca__held ca__blocks[65536];
static ca_addrmap ca__map = CA_ADDRMAP_INIT(ca__blocks);
static atomic_int ca__open;
static atomic_uint ca__nheld;
static pthread_mutex_t ca__lock = PTHREAD_MUTEX_INITIALIZER;

/* A forked child has none of its parent's graphs (CUDA does not survive a
 * fork). */
static void ca__graphs_child(void) {
  pthread_mutex_init(&ca__lock, NULL);
  for (int i = 0; i <= CA_GRAPHS_MAX; i++)
    ca__graphs[i] = (ca__graph){0};
  ca_addrmap_clear(&ca__map);
  atomic_store(&ca__open, 0);
  atomic_store(&ca__nheld, 0);
}

static const ca_fork_handlers ca__graphs_fork = {.child = ca__graphs_child};

static bool ca__valid(int graph) {
  return graph > 0 && graph <= CA_GRAPHS_MAX && ca__graphs[graph].held;
}

int ca_graphs_begin(int device, uint64_t stream) {
  ca_fork_register(CA_FORK_GRAPHS, &ca__graphs_fork);
  pthread_mutex_lock(&ca__lock);
  int graph = 0;
  for (int i = 1; i <= CA_GRAPHS_MAX && graph == 0; i++)
    if (!ca__graphs[i].held)
      graph = i;
  if (graph) {
    ca__graphs[graph] = (ca__graph){device, stream, true, true, 0};
    atomic_fetch_add(&ca__open, 1);
  }
  pthread_mutex_unlock(&ca__lock);
  return graph;
}

void ca_graphs_end(int graph) {
  pthread_mutex_lock(&ca__lock);
  if (ca__valid(graph) && ca__graphs[graph].open) {
    ca__graphs[graph].open = false;
    atomic_fetch_sub(&ca__open, 1);
  }
  pthread_mutex_unlock(&ca__lock);
}

bool ca_graphs_where(int graph, int *device, uint64_t *stream) {
  pthread_mutex_lock(&ca__lock);
  bool held = ca__valid(graph);
  if (held) {
    *device = ca__graphs[graph].device;
    *stream = ca__graphs[graph].stream;
  }
  pthread_mutex_unlock(&ca__lock);
  return held;
}

bool ca_graphs_any_open(void) {
  return atomic_load_explicit(&ca__open, memory_order_relaxed) > 0;
}

int ca_graphs_open(int device, uint64_t stream, bool stream_captures) {
  pthread_mutex_lock(&ca__lock);
  int found = 0, latest = 0;
  for (int i = 1; i <= CA_GRAPHS_MAX && found == 0; i++) {
    const ca__graph *g = &ca__graphs[i];
    if (!g->held || !g->open || g->device != device)
      continue;
    if (g->stream == stream)
      found = i;
    latest = i;
  }
  pthread_mutex_unlock(&ca__lock);
  return found ? found : stream_captures ? latest : 0;
}

bool ca_graphs_hold(int graph, uint64_t addr, uint64_t requested) {
  pthread_mutex_lock(&ca__lock);
  ca__held *h = ca__valid(graph) ? ca_addrmap_put(&ca__map, addr) : NULL;
  if (h) {
    *h = (ca__held){addr, requested, graph, false};
    atomic_store(&ca__nheld, ca__map.used);
  }
  pthread_mutex_unlock(&ca__lock);
  return h != NULL;
}

bool ca_graphs_freed(uint64_t addr) {
  if (atomic_load_explicit(&ca__nheld, memory_order_relaxed) == 0)
    return false;
  pthread_mutex_lock(&ca__lock);
  ca__held *h = ca_addrmap_find(&ca__map, addr);
  if (h && !h->freed) {
    h->freed = true;
    ca__graphs[h->graph].freed++;
  }
  pthread_mutex_unlock(&ca__lock);
  return h != NULL;
}

uint64_t ca_graphs_reuse(int graph, uint64_t requested) {
  uint64_t addr = 0;
  pthread_mutex_lock(&ca__lock);
  for (unsigned i = 0; ca__valid(graph) && ca__graphs[graph].freed > 0 &&
                       addr == 0 && i < ca__map.cap;
       i++) {
    ca__held *h = ca_addrmap_slot(&ca__map, i);
    if (h->addr && h->freed && h->graph == graph && h->requested == requested) {
      h->freed = false;
      ca__graphs[graph].freed--;
      addr = h->addr;
    }
  }
  pthread_mutex_unlock(&ca__lock);
  return addr;
}

void ca_graphs_release(int graph, void (*fn)(uint64_t addr, void *arg),
                       void *arg) {
  pthread_mutex_lock(&ca__lock);
  if (ca__valid(graph)) {
    /* A removal moves entries back into the hole, past the end of the
     * table too: passes until one finds none of the graph's. */
    for (bool again = true; again;) {
      again = false;
      for (unsigned i = 0; i < ca__map.cap; i++) {
        ca__held *h = ca_addrmap_slot(&ca__map, i);
        if (h->addr == 0 || h->graph != graph)
          continue;
        if (h->freed)
          fn(h->addr, arg);
        ca_addrmap_remove(&ca__map, h);
        again = true;
      }
    }
    if (ca__graphs[graph].open)
      atomic_fetch_sub(&ca__open, 1);
    ca__graphs[graph] = (ca__graph){0};
    atomic_store(&ca__nheld, ca__map.used);
  }
  pthread_mutex_unlock(&ca__lock);
}
