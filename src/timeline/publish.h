/*
 * The figures a process under the library publishes for `cudalloc top`:
 * one small file of shared memory, /dev/shm/cudalloc.<uid>.<pid>, created
 * 0600 (never through a link, never another user's) on the process's first
 * use of device memory, on the program's own thread (a descriptor the
 * watcher opened, even for a moment, could take a number the program is
 * about to reuse), rewritten by the library's watcher thread once a second (never on an allocation's path, so the program never
 * waits on it), removed at exit. `cudalloc top` (src/top/top.c) removes the
 * files of processes that died without exiting.
 *
 * The layout below is the whole interface between the two: versioned, and
 * copied by a reader under its sequence number, which is odd while the
 * writer is inside. Nothing here calls CUDA or the program's malloc.
 */
#ifndef CA_PUBLISH_H
#define CA_PUBLISH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CA_PUBLISH_MAGIC 0x3162757061636163ull /* "cacapub1" */
#define CA_PUBLISH_VERSION 1u
#define CA_PUBLISH_DIR "/dev/shm"
#define CA_PUBLISH_PREFIX "cudalloc."
#define CA_PUBLISH_DEVICES 16

/* One device's pools, as cudalloc_get_stats gives them. */
typedef struct ca_published_device {
  int32_t device;
  uint32_t unused;
  uint64_t in_use;        /* allocated_bytes.current */
  uint64_t cached;        /* free_cached_bytes + pending_free_bytes */
  uint64_t reserved;      /* reserved_bytes.current */
  uint64_t peak;          /* reserved_bytes.peak */
  uint64_t allocs;        /* allocations served, in all */
  double fragmentation;   /* 1 - largest free block / cached */
} ca_published_device;

typedef struct ca_published {
  uint64_t magic;
  uint32_t version, size; /* CA_PUBLISH_VERSION, sizeof(ca_published) */
  uint64_t seq;           /* odd while being written */
  int32_t pid;
  uint32_t uid;
  uint64_t updated_ns;    /* CLOCK_MONOTONIC, system-wide */
  uint32_t ndevices, unused;
  char command[64];       /* the program's name */
  char top_site[192];     /* the site whose live bytes grew most, or "" */
  ca_published_device devices[CA_PUBLISH_DEVICES];
} ca_published;

/* Creates this process's file, on the first call only (false where it
 * cannot: no /dev/shm, a file there that is not ours); a later call says
 * whether the first made it, and opens nothing. */
bool ca_publish_open(void);

/* Rewrites the figures: `n` devices, the growing site's line ("" for none). */
void ca_publish_write(const ca_published_device *devices, size_t n,
                      const char *top_site);

/* Removes this process's file (at exit). */
void ca_publish_close(void);

/* In a forked child: forgets the parent's file without removing it. */
void ca_publish_forget(void);

#endif /* CA_PUBLISH_H */
