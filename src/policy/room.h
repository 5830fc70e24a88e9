/*
 * Room for a request refused for memory: this process's cache given back
 * first; under shared_limit, when the group's cap still has no room, the
 * group's other processes asked for theirs; and when even that leaves
 * none, one line saying who holds the cap.
 */
#ifndef CA_ROOM_H
#define CA_ROOM_H

#include <stdbool.h>
#include <stdint.h>

/* Every pool of `device` (one per context) gives back what it caches,
 * waiting for its pending frees first. Whether anything was given back;
 * an unknown device (-1) has none. */
bool ca_room_give_back(int device);

/* So that a request of `bytes` on `device` that the driver or the limit
 * refused can be tried once more: this process's cache, then, in a group
 * whose cap still leaves no room, the others' (waiting up to a second for
 * their answers). Whether anything was given back. */
bool ca_room_make(int device, uint64_t bytes);

/* Whether the group's cap, rather than the device, refuses `bytes` more
 * on `device` now: false outside a group. */
bool ca_room_capped(int device, uint64_t bytes);

/* A request of `bytes` on `device` failed for memory after ca_room_make:
 * when the group's cap refused it, one line says so, and who holds what. */
void ca_room_refused(int device, uint64_t bytes);

#endif /* CA_ROOM_H */
