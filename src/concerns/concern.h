/*
 * The concerns around a pooled request, as layers with one interface.
 *
 * A request goes down a chain of layers, outermost first, to the pool at
 * the bottom. Each layer does its concern before or after it hands the
 * request on (RMM's resource adaptors are the model): the stack of the
 * allocation and its site's bytes, the timeline's events, the room a
 * memory limit may find in the device's other pools, the rule of stream
 * captures. Which concerns a chain holds is decided once, from the
 * configuration (compose.c): a concern that is off is not in the chain
 * and costs nothing.
 *
 * A layer knows nothing of CUDA or of the layers around it: what it needs
 * of them (the out-of-memory status, making room in the device's other
 * pools, whether a capture allows allocating now) comes in the chain's
 * environment, which the policy fills and a unit test fakes.
 *
 * Adding a concern: one file here defining a `ca_concern`, and one line in
 * compose.c's list (docs/ARCHITECTURE.md, "Adding a concern").
 */
#ifndef CA_CONCERN_H
#define CA_CONCERN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool/pool.h"
#include "support/config.h"

/* One allocation, as it goes down. */
typedef struct ca_ask {
  ca_pool *pool;          /* the pool that serves it */
  uint64_t size;          /* bytes asked */
  const uint64_t *stream; /* stream-ordered on *stream, or NULL */
  uint32_t stack;         /* its stack id: 0 until a layer sets one */
  uint64_t addr;          /* the block, once served */
} ca_ask;

/* One free, as it goes down. */
typedef struct ca_give {
  uint64_t addr;          /* where the block starts */
  const uint64_t *stream; /* freed on *stream, or NULL */
  bool describe;          /* a layer wants `block`: the pool fills it */
  ca_live_block block;    /* the block as it was, when described */
} ca_give;

/* A free's result besides 0 (given back) and a refusal's status (> 0): no
 * live pooled block starts at the address. */
#define CA_GIVE_NOT_POOLED (-1)

/* What the layers ask of the code around them. */
typedef struct ca_layer_env {
  const ca_config *cfg;
  int oom; /* the status of out of memory */
  /* The device's pools give back what they cache, and under shared_limit
   * the group's other processes too when `bytes` more would pass its cap:
   * whether any did. */
  bool (*make_room)(int device, uint64_t bytes);
  /* A request of `bytes` found no room even so: says why, when a cap the
   * process shares refused it. */
  void (*no_room)(int device, uint64_t bytes);
  /* 0 when allocating and freeing are allowed now, else the status that
   * refuses them (a stream capture forbids them); asked only while
   * *capturing is not 0 (captures in progress). */
  int (*allowed)(void);
  const atomic_int *capturing;
  /* What an attached NVTX tool is told of each block (nvtx_regions.c);
   * NULL when no tool is attached. */
  const struct ca_region_ops *regions;
  /* The live pooled block that starts at `addr`, and its pool (memcheck
   * reads the block a free names); NULL where none is asked. */
  bool (*block)(uint64_t addr, ca_pool **pool, ca_live_block *out);
  /* A trace was started at run time (cudalloc_trace_start), without
   * trace_path: its layer joins the chains composed since. */
  bool traced;
} ca_layer_env;

/* An NVTX tool told of blocks: `add` once a block is handed out (the ask
 * as served), `remove` before a free goes down (an address that is no
 * block it was told of is left alone). */
typedef struct ca_region_ops {
  void (*add)(const ca_ask *ask);
  void (*remove)(uint64_t addr);
} ca_region_ops;

typedef struct ca_layer ca_layer;
struct ca_layer {
  const char *name;
  /* 0 with ask->addr set, or the status of the refusal. */
  int (*alloc)(const ca_layer *self, ca_ask *ask);
  /* 0, CA_GIVE_NOT_POOLED, or the status of the refusal. */
  int (*free)(const ca_layer *self, ca_give *give);
  const ca_layer *next; /* toward the pool; NULL at the bottom */
  const ca_layer_env *env;
};

/* Whether a stream capture the policy saw begin may be running: one load. */
static inline bool ca_layer_capturing(const ca_layer_env *env) {
  return atomic_load_explicit(env->capturing, memory_order_acquire) > 0;
}

static inline int ca_layer_alloc(const ca_layer *l, ca_ask *ask) {
  return l->alloc(l, ask);
}

static inline int ca_layer_free(const ca_layer *l, ca_give *give) {
  return l->free(l, give);
}

/* Which requests a chain serves: the driver's own cuMemAlloc and cuMemFree
 * (a capture may forbid them), or stream-ordered ones (the allocator slot,
 * cuMemFreeAsync), which a capture allows. */
typedef enum ca_path { CA_PATH_SYNC, CA_PATH_ORDERED } ca_path;

/* A concern: whether a chain's environment (its configuration, a tool
 * attached) wants it on a path, and its layer's
 * two functions, which call self->next to go on (`free` NULL: nothing to
 * do at a free, which goes on untouched). */
typedef struct ca_concern {
  const char *name;
  bool (*wanted)(const ca_layer_env *env, ca_path path);
  int (*alloc)(const ca_layer *self, ca_ask *ask);
  int (*free)(const ca_layer *self, ca_give *give);
} ca_concern;

/* The most layers a chain holds: every concern, and the bottom. */
#define CA_CHAIN_MAX 8

typedef struct ca_chain {
  ca_layer layers[CA_CHAIN_MAX];
  size_t n;
} ca_chain;

/* Builds in *chain the layers `env->cfg` wants on `path`, above `bottom`
 * (copied as the chain's last layer), and returns the outermost: the
 * bottom itself when no concern is wanted. `chain` must stay in place
 * while the layers are used. */
const ca_layer *ca_compose(ca_chain *chain, const ca_layer_env *env,
                           ca_path path, const ca_layer *bottom);

/* The names of the chain's layers, outermost first, "+"-joined, the
 * bottom's as `bottom`: for tests and the verbose start-up line. */
void ca_chain_describe(const ca_chain *chain, char *buf, size_t len);

#endif /* CA_CONCERN_H */
