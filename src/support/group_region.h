/*
 * shared_limit's region: one small file of shared memory per group name,
 * /dev/shm/cudalloc-groups.<uid>/<name>, through which every process of
 * the group books its device memory against one cap per device. The
 * directory is this user's, 0700, and the file this user's, 0600; one
 * found otherwise (another owner, another mode, a link, not a file, a
 * size or figures this layout cannot have) is refused, never used.
 *
 * The layout below is the whole interface between the processes of a
 * group and `cudalloc top`. Its head (magic, version, size) never moves,
 * so a region made by another version of the library is refused by its
 * version, never misread. A file is linked under its name only once made
 * whole, so no process sees half of one. Every figure changes under the
 * region's lock (robust and process-shared: a process killed while it
 * holds the lock leaves it to the next, which makes the figures whole
 * again); each is atomic, so a reader without the lock (`cudalloc top`)
 * reads whole numbers.
 *
 * Whether a process of the group still lives is the kernel's word: each
 * holds a record lock on one byte of the file for its entry (past the
 * region's end), which the kernel drops when the process ends, however it
 * ends (SIGKILL included), in whatever pid namespace it ran. A record lock
 * is the process's, not its descriptor's: a forked child holds none of
 * its parent's, and a process of the group must never open and close the
 * file a second time (closing any descriptor of a file drops the process's
 * locks on it).
 *
 * Plain POSIX, no CUDA: the library (support/group.c) and cudalloc-top
 * use it.
 */
#ifndef CA_GROUP_REGION_H
#define CA_GROUP_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CA_GROUP_MAGIC "cudalloc-group\n" /* 16 bytes with its NUL */
#define CA_GROUP_VERSION 1u
#define CA_GROUP_PROCS 128   /* processes of a group at once */
#define CA_GROUP_DEVICES 16  /* devices a group books on */
#define CA_GROUP_NAME_MAX 64 /* a group's name, its NUL excluded */
#define CA_GROUP_DIR_FORMAT "/dev/shm/cudalloc-groups.%u"
/* Entry i's life lock is the byte at CA_GROUP_LIVE_BASE + i; the gate
 * (ca_group_gate) the byte before them. */
#define CA_GROUP_LIVE_BASE ((off_t)1 << 30)
/* The smallest cap: one segment (memory_limit_mb's own minimum). */
#define CA_GROUP_CAP_MIN ((uint64_t)2 << 20)

/* One device, named by its UUID (the same GPU under any
 * CUDA_VISIBLE_DEVICES numbering). */
typedef struct ca_group_dev {
  uint8_t uuid[16];      /* all zero: an entry not used yet */
  _Atomic uint64_t held; /* bytes the group books on it: at most the cap */
} ca_group_dev;

/* One process of the group. */
typedef struct ca_group_proc {
  _Atomic int32_t pid;       /* 0: a free entry */
  _Atomic uint32_t asked;    /* bumped by each process that asks it for room */
  _Atomic uint32_t answered; /* the last `asked` it answered */
  _Atomic uint32_t want;     /* the devices (a bit per entry) to give back on */
  char command[32];          /* the program's name */
  _Atomic uint64_t booked[CA_GROUP_DEVICES]; /* held on each device */
  _Atomic uint64_t cached[CA_GROUP_DEVICES]; /* of it, cached (once a second) */
} ca_group_proc;

typedef struct ca_group_region {
  char magic[16];   /* CA_GROUP_MAGIC */
  uint32_t version; /* CA_GROUP_VERSION */
  uint32_t size;    /* sizeof(ca_group_region) */
  uint32_t procs, devices, lock_size; /* this layout's, checked */
  _Atomic int32_t cap_pid; /* the process whose memory_limit_mb the cap is */
  _Atomic uint64_t cap;    /* bytes per device */
  _Alignas(64) pthread_mutex_t lock;
  ca_group_dev device[CA_GROUP_DEVICES];
  ca_group_proc proc[CA_GROUP_PROCS];
} ca_group_region;

/* Whether `name` may name a group: 1 to CA_GROUP_NAME_MAX bytes of
 * letters, digits, '.', '_' and '-', not starting with '.'. */
bool ca_group_name_ok(const char *name);

/* This user's directory of regions, into `buf`. */
void ca_group_dir(char *buf, size_t size);

/* The names of this user's regions, at most `max` into names[] (*n how
 * many); false, with why, when the directory is there but refused (true,
 * none, when there is none). */
bool ca_group_names(char (*names)[CA_GROUP_NAME_MAX + 1], size_t max,
                    size_t *n, char *why, size_t size);

/* How a region is opened: to read it (cudalloc top: mapped read-only,
 * never made), or to join it (mapped read-write, made with `cap` when
 * absent). */
typedef enum ca_group_open { CA_GROUP_READ, CA_GROUP_JOIN } ca_group_open;

/* Maps the region `name`; *fd is its descriptor, kept open (the life
 * locks live on it). NULL when refused or impossible, with why in `why`
 * (one clause naming the file). */
ca_group_region *ca_group_region_open(const char *name, ca_group_open how,
                                      uint64_t cap, int *fd, char *why,
                                      size_t size);
void ca_group_region_close(ca_group_region *r, int fd);

/* What in the figures of region `name` no process of this layout could
 * have written, in `why`; false when nothing. Read under its lock. */
bool ca_group_region_impossible(const ca_group_region *r, const char *name,
                                char *why, size_t size);

/* Whether the process of entry `i` still lives: another process holds its
 * life lock. Asked by a process of the group about another, or by a
 * reader; a process asking about its own entry is told no. */
bool ca_group_proc_alive(int fd, int i);

/* Takes (F_WRLCK) or drops (F_UNLCK) this process's life lock for entry
 * `i`: false when another process holds it. */
bool ca_group_proc_life(int fd, int i, short type);

/* A region whose processes have all ended is removed by the next process
 * that looks (ca_group_sweep), so that none stays behind in /dev/shm. Its
 * gate keeps removing and joining apart: a process takes its life lock,
 * then checks that the region's name still names its file, holding the
 * gate shared (F_RDLCK, waiting; F_UNLCK after); a remover holds it alone
 * while it finds no life lock held and removes the name. So no process
 * keeps a region no longer named, and none is removed under a process. */
void ca_group_gate(int fd, short type);

/* Whether the region of `fd` is still named in the directory. */
bool ca_group_linked(int fd);

/* Removes this user's regions whose processes have all ended, except the
 * one open at `own_fd` (-1: none): a process of a group must not open its
 * own region a second time (closing it would drop its life lock). Returns
 * how many were removed. Regions refused (another owner, mode or version)
 * are left alone. */
size_t ca_group_sweep(int own_fd);

#endif /* CA_GROUP_REGION_H */
