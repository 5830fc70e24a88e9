/*
 * CUDA graphs captured through the allocator slot (PyTorch's
 * torch.cuda.graph, which the Python helper reports): the blocks each graph
 * holds. A graph replays into every block its capture was given, freed or
 * not, so none of them may serve anyone else while the graph lives: PyTorch
 * keeps a private pool per graph for this; here a block served during a
 * capture stays the graph's, live in its pool, and a free of it only makes
 * it available to the same graph's capture again, for a request of exactly
 * its size. When the graph is released the blocks the program freed go
 * back to the pool. A side module: it keeps the lists; the policy
 * (slot.c) serves and frees.
 */
#ifndef CA_GRAPHS_H
#define CA_GRAPHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Graphs held at once (captured and not yet released). */
#define CA_GRAPHS_MAX 256

/* A capture began on `stream` (a handle as a number) of `device`. Returns
 * the graph's number (> 0), or 0 when CA_GRAPHS_MAX graphs are held. */
int ca_graphs_begin(int device, uint64_t stream);

/* `graph`'s capture ended; the graph lives on and keeps its blocks. */
void ca_graphs_end(int graph);

/* The device and capturing stream of `graph`; false when no such graph is
 * held. */
bool ca_graphs_where(int graph, int *device, uint64_t *stream);

/* Whether any capture is open (one atomic load). */
bool ca_graphs_any_open(void);

/* The graph whose capture is open on `stream` of `device`; else, when
 * `stream_captures` (the driver says the stream is in a capture: one
 * forked from the capturing stream), the latest one open on `device`; 0
 * for none. */
int ca_graphs_open(int device, uint64_t stream, bool stream_captures);

/* The block at `addr` (`requested` bytes) was served for `graph`'s
 * capture: the graph holds it until released. False when the table is
 * full (the caller must not hand the block out). */
bool ca_graphs_hold(int graph, uint64_t addr, uint64_t requested);

/* The program freed `addr`: true when a graph holds it, which then stays
 * held (and may serve the same graph's capture again). One atomic load
 * when no graph holds a block. */
bool ca_graphs_freed(uint64_t addr);

/* A block `graph` holds that the program freed, of exactly `requested`
 * bytes, handed out again for the graph's capture; 0 for none. */
uint64_t ca_graphs_reuse(int graph, uint64_t requested);

/* `graph` is released: fn is called (under the module's lock: it must not
 * call back here) for each of its blocks that the program freed, which
 * the caller gives back to the pool; the ones still in use are held no
 * longer, so that their free goes to the pool as any other. */
void ca_graphs_release(int graph, void (*fn)(uint64_t addr, void *arg),
                       void *arg);

#endif /* CA_GRAPHS_H */
