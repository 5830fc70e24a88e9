/*
 * This process's figures for `cudalloc top` (see publish.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "timeline/publish.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The watcher thread opens and writes; exit closes, while the watcher may
 * still be writing (the lock keeps the page mapped until it is done); a
 * forked child, which has no watcher, forgets. */
static pthread_mutex_t ca__page_lock = PTHREAD_MUTEX_INITIALIZER;
static ca_published *ca__page;
static bool ca__closed; /* at exit: no file may be made after */
static bool ca__tried;  /* the file is made once, or never */
static char ca__path[96];
static pid_t ca__owner;

static void ca__path_of(pid_t pid) {
  snprintf(ca__path, sizeof(ca__path), CA_PUBLISH_DIR "/" CA_PUBLISH_PREFIX "%u.%d",
           (unsigned)getuid(), (int)pid);
}

/* A file left by a process that had this pid before (killed: no exit to
 * remove it) is removed if it is this user's; anything else stays. */
static int ca__create(void) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = open(ca__path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST)
      return fd;
    struct stat st;
    if (lstat(ca__path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid())
      return -1;
    unlink(ca__path);
  }
  return -1;
}

/* Under the lock: this process's file, made and mapped. */
static bool ca__map_new(void) {
  pid_t pid = getpid();
  ca__path_of(pid);
  int fd = ca__create();
  if (fd < 0)
    return false;
  void *p = MAP_FAILED;
  if (fchmod(fd, 0600) == 0 && ftruncate(fd, sizeof(ca_published)) == 0)
    p = mmap(NULL, sizeof(ca_published), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    unlink(ca__path);
    return false;
  }
  ca_published *page = p;
  page->version = CA_PUBLISH_VERSION;
  page->size = sizeof(ca_published);
  page->pid = (int32_t)pid;
  page->uid = (uint32_t)getuid();
  snprintf(page->command, sizeof(page->command), "%s", program_invocation_short_name);
  __atomic_store_n(&page->magic, CA_PUBLISH_MAGIC, __ATOMIC_RELEASE);
  ca__owner = pid;
  ca__page = page;
  return true;
}

bool ca_publish_open(void) {
  pthread_mutex_lock(&ca__page_lock);
  bool ok = ca__page != NULL;
  if (!ok && !ca__closed && !ca__tried) {
    ca__tried = true;
    ok = ca__map_new();
  }
  pthread_mutex_unlock(&ca__page_lock);
  return ok;
}

void ca_publish_write(const ca_published_device *devices, size_t n,
                      const char *top_site) {
  pthread_mutex_lock(&ca__page_lock);
  ca_published *page = ca__page;
  if (page == NULL) {
    pthread_mutex_unlock(&ca__page_lock);
    return;
  }
  if (n > CA_PUBLISH_DEVICES)
    n = CA_PUBLISH_DEVICES;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  /* Odd: a reader that sees it, or sees it change, copies again. The
   * exchange orders the writes below after it; the release, before the
   * even number. */
  uint64_t seq = __atomic_load_n(&page->seq, __ATOMIC_RELAXED);
  __atomic_exchange_n(&page->seq, seq + 1, __ATOMIC_ACQ_REL);
  page->updated_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  page->ndevices = (uint32_t)n;
  memcpy(page->devices, devices, n * sizeof(*devices));
  snprintf(page->top_site, sizeof(page->top_site), "%s", top_site ? top_site : "");
  __atomic_store_n(&page->seq, seq + 2, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&ca__page_lock);
}

void ca_publish_close(void) {
  pthread_mutex_lock(&ca__page_lock);
  ca_published *page = ca__page;
  ca__closed = true;
  if (page != NULL && ca__owner == getpid()) {
    ca__page = NULL;
    unlink(ca__path);
    munmap(page, sizeof(*page));
  }
  pthread_mutex_unlock(&ca__page_lock);
}

void ca_publish_forget(void) {
  pthread_mutex_init(&ca__page_lock, NULL);
  ca__closed = false;
  ca__tried = false;
  if (ca__page != NULL)
    munmap(ca__page, sizeof(*ca__page));
  ca__page = NULL;
  ca__owner = 0;
}
