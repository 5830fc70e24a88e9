/*
 * shared_limit: this process's part in a group of processes that book
 * their device memory against one cap per device, through the region of
 * group_region.h.
 *
 * A process joins at its first booking on a device (ca_group_join), taking
 * an entry of its own; a forked child takes its own at its first booking.
 * The cap is the memory_limit_mb of the process that found the group
 * empty; one that names another is told so, once. A device takes part
 * through its entry in the region, which a budget (budget.h) keeps as
 * `group` (the entry plus one; 0: not in a group).
 *
 * A booking past the cap is refused, after the bookings of processes that
 * died are taken back; the caller then gives back its own cache, asks the
 * others for theirs (ca_group_ask), and only then fails, saying who holds
 * what (ca_group_say_refused). Each process's watcher answers the asks made
 * of it (ca_group_wanted, ca_group_answer), publishes what it caches, and
 * takes back dead processes' bookings once a second (ca_group_reap).
 *
 * Plain C, no CUDA. A process in no group never reaches this module.
 */
#ifndef CA_GROUP_H
#define CA_GROUP_H

#include <stdbool.h>
#include <stdint.h>

/* Joins the group shared_limit names, once; later calls say whether the
 * first joined. A region that is refused is said in one line, and the
 * process keeps memory_limit_mb as its own cap. */
bool ca_group_join(void);

/* Whether this process has joined a group: one load, no joining. */
bool ca_group_joined(void);

/* The group's entry for the device of `uuid`, plus one (made when new);
 * 0, with one line, when the region names CA_GROUP_DEVICES others. */
uint32_t ca_group_device(const uint8_t uuid[16]);

/* The group's cap, in bytes per device; 0 outside a group. */
uint64_t ca_group_cap(void);

/* Books `bytes` on entry `group` (ca_group_device's answer), or books
 * nothing and returns false when the group would pass its cap. */
bool ca_group_book(uint32_t group, uint64_t bytes);
void ca_group_unbook(uint32_t group, uint64_t bytes);

/* Bytes the whole group holds on entry `group`. */
uint64_t ca_group_held(uint32_t group);

/* Asks every other process holding memory on `group` to give back its
 * cache there, and waits until each has answered, `bytes` more fit, or
 * `wait_ms` passed. Returns whether the group holds less than before. */
bool ca_group_ask(uint32_t group, uint64_t bytes, int wait_ms);

/* Whether others asked this process for room since it last answered:
 * then *devices (a bit per entry: 1 << (group - 1)) are the devices to
 * give back its cache on, and *ticket what to answer with once it has. */
bool ca_group_wanted(uint32_t *devices, uint32_t *ticket);
void ca_group_answer(uint32_t ticket);

/* This process's cached bytes on entry `group`, as the others see them. */
void ca_group_note_cached(uint32_t group, uint64_t bytes);

/* Takes back the bookings of the group's processes that have died. */
void ca_group_reap(void);

/* Says, in one line, that `asked` bytes on `device` (entry `group`) were
 * refused because `need` more would pass the group's cap, and who holds
 * what. Nothing when `need` fits now (the cap was not what refused). */
void ca_group_say_refused(uint32_t group, int device, uint64_t asked,
                          uint64_t need);

#endif /* CA_GROUP_H */
