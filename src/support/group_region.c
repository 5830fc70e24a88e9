/*
 * shared_limit's region (group_region.h): finding, making, checking and
 * mapping it, and whether a process of it lives.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "support/group_region.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the region's figures are atomic across processes only when "
               "lock-free");
_Static_assert(CA_GROUP_DEVICES <= 32, "`want` has a bit per device");
_Static_assert(sizeof(CA_GROUP_MAGIC) == 16, "the magic fills its field");
_Static_assert(offsetof(ca_group_region, version) == 16 &&
                   offsetof(ca_group_region, size) == 20,
               "the head every version reads stays where it is");

/* A descriptor kept for the process's life sits above the numbers a
 * program reopens its own files at (a daemon closing and reopening 0-2). */
#define CA__FD_FLOOR 100
/* Regions a sweep looks at, at most. */
#define CA__SWEEP_MAX 64

bool ca_group_name_ok(const char *name) {
  size_t n = strnlen(name, CA_GROUP_NAME_MAX + 1);
  if (n == 0 || n > CA_GROUP_NAME_MAX || name[0] == '.')
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

void ca_group_dir(char *buf, size_t size) {
  snprintf(buf, size, CA_GROUP_DIR_FORMAT, (unsigned)geteuid());
}

/* Whether an open file is this user's alone with mode `mode`. */
static bool ca__ours(int fd, mode_t type, mode_t mode, const char *path,
                     const char *what, char *why, size_t size) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(why, size, "cannot read %s (%s)", path, strerror(errno));
    return false;
  }
  if ((st.st_mode & S_IFMT) == type && st.st_uid == geteuid() &&
      (st.st_mode & 07777) == mode)
    return true;
  snprintf(why, size,
           "%s is not a %s of this user's alone (owner uid %u, mode %04o; "
           "wanted uid %u, %04o)",
           path, what, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
           (unsigned)geteuid(), (unsigned)mode);
  return false;
}

/* The directory, opened (made first when joining); refused unless it is
 * a directory of this user's alone, never through a link. */
static int ca__dir_open(ca_group_open how, char *dir, size_t dir_size,
                        char *why, size_t size) {
  ca_group_dir(dir, dir_size);
  bool made = how == CA_GROUP_JOIN && mkdir(dir, 0700) == 0;
  if (how == CA_GROUP_JOIN && !made && errno != EEXIST) {
    snprintf(why, size, "cannot make %s (%s)", dir, strerror(errno));
    return -1;
  }
  int d = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) {
    int e = errno; /* ENOENT: no region made yet (ca_group_names) */
    snprintf(why, size, "cannot open %s (%s)", dir,
             e == ELOOP || e == ENOTDIR ? "not a directory" : strerror(e));
    errno = e;
    return -1;
  }
  if (made)
    fchmod(d, 0700); /* whatever the umask took away */
  if (!ca__ours(d, S_IFDIR, 0700, dir, "directory", why, size)) {
    close(d);
    errno = EPERM;
    return -1;
  }
  return d;
}

bool ca_group_names(char (*names)[CA_GROUP_NAME_MAX + 1], size_t max,
                    size_t *n, char *why, size_t size) {
  char dir[64];
  *n = 0;
  int d = ca__dir_open(CA_GROUP_READ, dir, sizeof(dir), why, size);
  if (d < 0)
    return errno == ENOENT;
  DIR *list = fdopendir(d);
  if (list == NULL) {
    close(d);
    return true;
  }
  for (struct dirent *e; *n < max && (e = readdir(list)) != NULL;)
    if (ca_group_name_ok(e->d_name)) /* at most CA_GROUP_NAME_MAX bytes */
      memcpy(names[(*n)++], e->d_name, strlen(e->d_name) + 1);
  closedir(list);
  return true;
}

static void ca__init_lock(pthread_mutex_t *lock) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(lock, &a);
  pthread_mutexattr_destroy(&a);
}

/* Makes the region whole under a name of its own in `d`, then links it
 * as `name`. Losing the race to another process that linked one first is
 * no failure: the caller opens theirs. Anything else is said in `why`. */
static bool ca__make(int d, const char *name, uint64_t cap, char *why,
                     size_t size) {
  char tmp[CA_GROUP_NAME_MAX + 32];
  snprintf(tmp, sizeof(tmp), ".%s.%d.new", name, (int)getpid());
  int fd = openat(d, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  0600);
  if (fd < 0) {
    snprintf(why, size, "cannot make %s (%s)", tmp, strerror(errno));
    return false;
  }
  bool made = false;
  void *p = MAP_FAILED;
  if (fchmod(fd, 0600) == 0 && ftruncate(fd, sizeof(ca_group_region)) == 0)
    p = mmap(NULL, sizeof(ca_group_region), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    ca_group_region *r = p;
    r->version = CA_GROUP_VERSION;
    r->size = sizeof(*r);
    r->procs = CA_GROUP_PROCS;
    r->devices = CA_GROUP_DEVICES;
    r->lock_size = sizeof(r->lock);
    atomic_store(&r->cap, cap);
    ca__init_lock(&r->lock);
    memcpy(r->magic, CA_GROUP_MAGIC, sizeof(r->magic));
    munmap(p, sizeof(*r));
    made = linkat(d, tmp, d, name, 0) == 0 || errno == EEXIST;
  }
  if (!made)
    snprintf(why, size, "cannot make %s (%s)", name, strerror(errno));
  unlinkat(d, tmp, 0);
  close(fd);
  return made;
}

/* Refuses a file that is not this user's region of this layout. */
static bool ca__region_file(int fd, const char *path, char *why,
                            size_t size) {
  if (!ca__ours(fd, S_IFREG, 0600, path, "file", why, size))
    return false;
  struct {
    char magic[16];
    uint32_t version, size;
  } head = {{0}, 0, 0};
  struct stat st;
  if (pread(fd, &head, sizeof(head), 0) != (ssize_t)sizeof(head) ||
      memcmp(head.magic, CA_GROUP_MAGIC, sizeof(head.magic)) != 0) {
    snprintf(why, size, "%s is not a cudalloc group region", path);
    return false;
  }
  if (head.version != CA_GROUP_VERSION) {
    snprintf(why, size,
             "%s was made by another version of cudalloc (layout %u; this "
             "one reads layout %u only)",
             path, head.version, CA_GROUP_VERSION);
    return false;
  }
  if (fstat(fd, &st) != 0 || head.size != sizeof(ca_group_region) ||
      st.st_size != (off_t)sizeof(ca_group_region)) {
    snprintf(why, size,
             "%s has an impossible size (%lld bytes, says %u; layout %u has "
             "%zu)",
             path, (long long)st.st_size, head.size, CA_GROUP_VERSION,
             sizeof(ca_group_region));
    return false;
  }
  return true;
}

/* `fd` moved above CA__FD_FLOOR where the limit allows. Done before any
 * life lock is taken: closing a descriptor drops the process's record
 * locks on its file. */
static int ca__raise_fd(int fd) {
  int high = fcntl(fd, F_DUPFD_CLOEXEC, CA__FD_FLOOR);
  if (high < 0)
    return fd;
  close(fd);
  return high;
}

ca_group_region *ca_group_region_open(const char *name, ca_group_open how,
                                      uint64_t cap, int *fd, char *why,
                                      size_t size) {
  char dir[64], path[64 + CA_GROUP_NAME_MAX + 2];
  if (!ca_group_name_ok(name)) {
    snprintf(why, size, "'%.80s' cannot name a group", name);
    return NULL;
  }
  int d = ca__dir_open(how, dir, sizeof(dir), why, size);
  if (d < 0)
    return NULL;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  int flags = (how == CA_GROUP_JOIN ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC;
  int f = openat(d, name, flags);
  if (f < 0 && errno == ENOENT && how == CA_GROUP_JOIN) {
    if (!ca__make(d, name, cap, why, size)) {
      close(d);
      return NULL;
    }
    f = openat(d, name, flags);
  }
  close(d);
  if (f < 0) {
    snprintf(why, size, "cannot open %s (%s)", path,
             errno == ELOOP ? "a symbolic link" : strerror(errno));
    return NULL;
  }
  if (!ca__region_file(f, path, why, size)) {
    close(f);
    return NULL;
  }
  int prot = how == CA_GROUP_JOIN ? PROT_READ | PROT_WRITE : PROT_READ;
  void *p = mmap(NULL, sizeof(ca_group_region), prot, MAP_SHARED, f, 0);
  if (p == MAP_FAILED) {
    snprintf(why, size, "cannot map %s (%s)", path, strerror(errno));
    close(f);
    return NULL;
  }
  *fd = how == CA_GROUP_JOIN ? ca__raise_fd(f) : f;
  return p;
}

void ca_group_region_close(ca_group_region *r, int fd) {
  munmap(r, sizeof(*r));
  close(fd);
}

/* Entry i's figures, checked: a pid, and bookings within the cap (none on
 * a free entry). */
static bool ca__proc_impossible(const ca_group_region *r, int i,
                                const char *path, char *why, size_t size) {
  const ca_group_proc *p = &r->proc[i];
  int32_t pid = atomic_load(&p->pid);
  uint64_t cap = atomic_load(&r->cap);
  for (int d = 0; d < CA_GROUP_DEVICES; d++) {
    uint64_t b = atomic_load(&p->booked[d]);
    if (pid < 0 || b > cap || (pid == 0 && b != 0)) {
      snprintf(why, size,
               "%s has impossible figures: process entry %d (pid %d) holds "
               "%llu bytes of a %llu-byte cap on device entry %d",
               path, i, (int)pid, (unsigned long long)b,
               (unsigned long long)cap, d);
      return true;
    }
  }
  return false;
}

bool ca_group_region_impossible(const ca_group_region *r, const char *name,
                                char *why, size_t size) {
  char path[64 + CA_GROUP_NAME_MAX + 2];
  ca_group_dir(path, sizeof(path));
  snprintf(path + strlen(path), sizeof(path) - strlen(path), "/%s", name);
  uint64_t cap = atomic_load(&r->cap);
  if (r->procs != CA_GROUP_PROCS || r->devices != CA_GROUP_DEVICES ||
      r->lock_size != sizeof(r->lock) || cap < CA_GROUP_CAP_MIN) {
    snprintf(why, size,
             "%s has impossible figures: %u processes, %u devices, a %u-byte "
             "lock, a cap of %llu bytes",
             path, r->procs, r->devices, r->lock_size, (unsigned long long)cap);
    return true;
  }
  for (int i = 0; i < CA_GROUP_PROCS; i++)
    if (ca__proc_impossible(r, i, path, why, size))
      return true;
  for (int d = 0; d < CA_GROUP_DEVICES; d++) {
    uint64_t held = atomic_load(&r->device[d].held), sum = 0;
    for (int i = 0; i < CA_GROUP_PROCS; i++)
      sum += atomic_load(&r->proc[i].booked[d]);
    if (held > cap || held != sum) {
      snprintf(why, size,
               "%s has impossible figures: device entry %d holds %llu bytes "
               "of a %llu-byte cap, its processes %llu",
               path, d, (unsigned long long)held, (unsigned long long)cap,
               (unsigned long long)sum);
      return true;
    }
  }
  return false;
}

static struct flock ca__life(int i, short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET,
                        .l_start = CA_GROUP_LIVE_BASE + i, .l_len = 1};
}

bool ca_group_proc_alive(int fd, int i) {
  struct flock l = ca__life(i, F_WRLCK);
  if (fcntl(fd, F_GETLK, &l) != 0)
    return true; /* cannot tell: never take a living process's bookings */
  return l.l_type != F_UNLCK;
}

bool ca_group_proc_life(int fd, int i, short type) {
  struct flock l = ca__life(i, type);
  return fcntl(fd, F_SETLK, &l) == 0;
}

static struct flock ca__gate(short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET,
                        .l_start = CA_GROUP_LIVE_BASE - 1, .l_len = 1};
}

void ca_group_gate(int fd, short type) {
  struct flock l = ca__gate(type);
  while (fcntl(fd, F_SETLKW, &l) != 0 && errno == EINTR)
    ;
}

bool ca_group_linked(int fd) {
  struct stat st;
  return fstat(fd, &st) != 0 || st.st_nlink > 0; /* cannot tell: keep it */
}

/* Whether no process holds a life lock of the region of `fd`. */
static bool ca__all_ended(int fd) {
  struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                    .l_start = CA_GROUP_LIVE_BASE, .l_len = CA_GROUP_PROCS};
  return fcntl(fd, F_GETLK, &l) == 0 && l.l_type == F_UNLCK;
}

/* Removes the region `name` of directory `d` if its processes all ended,
 * under its gate held alone (without waiting: a process joining it now
 * lives). */
static bool ca__sweep_one(int d, const char *name, const struct stat *own) {
  char why[256];
  struct stat st;
  /* Looked at by name first: the process's own region is never opened. */
  if (fstatat(d, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
      (own && st.st_dev == own->st_dev && st.st_ino == own->st_ino))
    return false;
  int fd = openat(d, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return false;
  bool removed = false;
  struct flock alone = ca__gate(F_WRLCK);
  if (ca__region_file(fd, name, why, sizeof(why)) &&
      fcntl(fd, F_SETLK, &alone) == 0) {
    removed = ca__all_ended(fd) && unlinkat(d, name, 0) == 0;
    ca_group_gate(fd, F_UNLCK);
  }
  close(fd);
  return removed;
}

size_t ca_group_sweep(int own_fd) {
  char dir[64], why[256];
  char names[CA__SWEEP_MAX][CA_GROUP_NAME_MAX + 1];
  size_t n = 0, removed = 0;
  struct stat own;
  bool has_own = own_fd >= 0 && fstat(own_fd, &own) == 0;
  if (!ca_group_names(names, CA__SWEEP_MAX, &n, why, sizeof(why)) || n == 0)
    return 0;
  int d = ca__dir_open(CA_GROUP_READ, dir, sizeof(dir), why, sizeof(why));
  if (d < 0)
    return 0;
  for (size_t i = 0; i < n; i++)
    removed += ca__sweep_one(d, names[i], has_own ? &own : NULL);
  close(d);
  return removed;
}
