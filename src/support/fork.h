/*
 * One fork registry, in one fixed order, for every module that holds a
 * lock or per-process state.
 *
 * A fork while another thread holds one of the library's locks would leave
 * the child's copy locked forever, and a forked child owns none of its
 * parent's CUDA contexts, pools or threads. Modules that hold locks take
 * them before the fork (prepare) and let them go after, in both processes;
 * every module forgets in the child what was the parent's. A module
 * registers its handlers on first use (so a process that never touches
 * CUDA runs none); one pthread_atfork runs them all: prepare in the order
 * of the slots below, the order in which their locks nest (outermost
 * first), parent and child in reverse.
 */
#ifndef CA_FORK_H
#define CA_FORK_H

typedef enum ca_fork_slot {
  CA_FORK_LIFECYCLE, /* the report lock, SIGUSR1, the watcher thread */
  CA_FORK_MEMCHECK,  /* memcheck's quarantine (held over pool frees) */
  CA_FORK_REGISTRY,  /* the pool slots, the budgets */
  CA_FORK_GROUP,     /* this process's entry in its shared_limit group */
  CA_FORK_TRACK,     /* the table of passed-through allocations */
  CA_FORK_RECORDED,  /* blocks used on other streams (record_stream) */
  CA_FORK_GRAPHS,    /* blocks held by graphs captured through the slot */
  CA_FORK_POOL,      /* the threads counted on each arena */
  CA_FORK_STREAMS,   /* the program's streams (outer lock) */
  CA_FORK_MARKS,     /* markers, spare events, fences (inner lock) */
  CA_FORK_GATHER,    /* memcheck's gather kernel, by context */
  CA_FORK_CAPTURES,  /* the captures in progress */
  CA_FORK_DRIVER,    /* the primary contexts retained */
  CA_FORK_SITES,     /* live bytes by site, growth snapshots, the peak */
  CA_FORK_PYFRAMES,  /* the Python frame store's insert lock */
  CA_FORK_STACKS,    /* the stack depot's insert lock */
  CA_FORK_NVTX,      /* the heaps and regions told to an NVTX tool */
  CA_FORK_LOG,       /* the log lock */
  CA_FORK_META,      /* the library's own memory (taken under any other) */
  CA_FORK_SLOTS
} ca_fork_slot;

typedef struct ca_fork_handlers {
  void (*prepare)(void); /* each may be NULL */
  void (*parent)(void);
  void (*child)(void);
} ca_fork_handlers;

/* Puts `h` (static storage) in `slot`; the first call for a slot wins.
 * Cheap after the first: call it on every first use. A fork already under
 * way when a module registers runs without it: a fork runs the handlers
 * of the slots filled when it began, all three of each. */
void ca_fork_register(ca_fork_slot slot, const ca_fork_handlers *h);

#endif /* CA_FORK_H */
