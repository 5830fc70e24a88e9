/*
 * cudalloc-top: a live view of every process of this user running under
 * cudalloc on this machine, from the figures each publishes once a second
 * (src/timeline/publish.h: /dev/shm/cudalloc.<uid>.<pid>), and of each
 * shared_limit group (groups.c). Started by `cudalloc top`.
 *
 *   cudalloc-top [--once] [--interval SECONDS] [--dir DIR]
 *
 * Refreshes every second (like nvidia-smi -l 1) until q; --once prints the
 * table once, with no terminal control (for scripts). A file whose process
 * is gone (killed: no exit to remove it) is removed. Reads only regular
 * files of this user, never through a link.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "timeline/publish.h"
#include "top/groups.h"
#include "top/units.h"

#define CA__MAX_PROCS 256

/* What one refresh read of one process, and what the one before did (for
 * allocations per second). */
typedef struct ca__proc {
  ca_published fig;
  uint64_t prev_allocs, prev_ns;
  bool seen_before;
} ca__proc;

static ca__proc ca__procs[CA__MAX_PROCS];
static size_t ca__nprocs;

static uint64_t ca__allocs(const ca_published *p) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < p->ndevices && i < CA_PUBLISH_DEVICES; i++)
    n += p->devices[i].allocs;
  return n;
}

/* A consistent copy of a mapped page, or false (being written each try, or
 * not a page of this layout). */
static bool ca__copy_page(const ca_published *page, ca_published *out) {
  for (int attempt = 0; attempt < 100; attempt++) {
    uint64_t before = __atomic_load_n(&page->seq, __ATOMIC_ACQUIRE);
    if (before & 1) {
      usleep(100);
      continue;
    }
    memcpy(out, page, sizeof(*out));
#ifndef __SANITIZE_THREAD__ /* the writer is another process: nothing to see */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
    if (__atomic_load_n(&page->seq, __ATOMIC_RELAXED) == before)
      return out->magic == CA_PUBLISH_MAGIC && out->version == CA_PUBLISH_VERSION &&
             out->size == sizeof(*out);
  }
  return false;
}

static bool ca__alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

/* Reads one file of the directory; removes it when its process is gone. */
static void ca__read_one(const char *dir, const char *name, ca_published *out,
                         bool *ok) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  *ok = false;
  const char *dot = strrchr(name, '.');
  pid_t named = dot ? (pid_t)atoi(dot + 1) : 0;
  struct stat lst;
  if (named > 0 && !ca__alive(named) && lstat(path, &lst) == 0 &&
      S_ISREG(lst.st_mode) && lst.st_uid == getuid()) {
    unlink(path); /* its process is gone, whatever the file holds */
    return;
  }
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return;
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid() &&
      (size_t)st.st_size >= sizeof(ca_published))
    p = mmap(NULL, sizeof(ca_published), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return;
  *ok = ca__copy_page(p, out);
  munmap(p, sizeof(ca_published));
  if (*ok && !ca__alive(out->pid)) {
    unlink(path); /* a stale file of a process that did not exit */
    *ok = false;
  }
}

static ca__proc *ca__find_proc(int32_t pid, ca__proc *old, size_t nold) {
  for (size_t i = 0; i < nold; i++)
    if (old[i].fig.pid == pid)
      return &old[i];
  return NULL;
}

static int ca__by_pid(const void *a, const void *b) {
  const ca__proc *x = a, *y = b;
  return (x->fig.pid > y->fig.pid) - (x->fig.pid < y->fig.pid);
}

/* Every process's figures now, keeping the last refresh's for rates. */
static void ca__refresh(const char *dir) {
  static ca__proc old[CA__MAX_PROCS];
  size_t nold = ca__nprocs;
  memcpy(old, ca__procs, nold * sizeof(*old));
  ca__nprocs = 0;
  char prefix[64];
  snprintf(prefix, sizeof(prefix), CA_PUBLISH_PREFIX "%u.", (unsigned)getuid());
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL && ca__nprocs < CA__MAX_PROCS;) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
      continue;
    ca__proc *p = &ca__procs[ca__nprocs];
    bool ok;
    ca__read_one(dir, e->d_name, &p->fig, &ok);
    if (!ok)
      continue;
    const ca__proc *before = ca__find_proc(p->fig.pid, old, nold);
    p->seen_before = before != NULL;
    p->prev_allocs = before ? ca__allocs(&before->fig) : 0;
    p->prev_ns = before ? before->fig.updated_ns : 0;
    ca__nprocs++;
  }
  closedir(d);
  qsort(ca__procs, ca__nprocs, sizeof(*ca__procs), ca__by_pid);
}

static void ca__print(bool tty) {
  time_t now = time(NULL);
  char clock[16];
  strftime(clock, sizeof(clock), "%H:%M:%S", localtime(&now));
  printf("cudalloc top - %zu process(es) - %s%s%s\n", ca__nprocs, clock,
         tty ? "    (q quits)" : "", tty ? "\033[K" : "");
  printf("%7s %-16s %3s %10s %10s %10s %10s %6s %9s  %s%s\n", "PID", "COMMAND", "DEV",
         "IN USE", "CACHED", "RESERVED", "PEAK", "FRAG", "ALLOC/S", "TOP GROWING SITE",
         tty ? "\033[K" : "");
  for (size_t i = 0; i < ca__nprocs; i++) {
    const ca__proc *p = &ca__procs[i];
    char rate[24] = "-";
    uint64_t dt = p->fig.updated_ns - p->prev_ns;
    if (p->seen_before && dt > 0)
      snprintf(rate, sizeof(rate), "%.0f",
               (double)(ca__allocs(&p->fig) - p->prev_allocs) * 1e9 / (double)dt);
    for (uint32_t k = 0; k < p->fig.ndevices && k < CA_PUBLISH_DEVICES; k++) {
      const ca_published_device *d = &p->fig.devices[k];
      char use[16], cached[16], res[16], peak[16];
      ca_top_bytes(use, sizeof(use), d->in_use);
      ca_top_bytes(cached, sizeof(cached), d->cached);
      ca_top_bytes(res, sizeof(res), d->reserved);
      ca_top_bytes(peak, sizeof(peak), d->peak);
      printf("%7d %-16.16s %3d %10s %10s %10s %10s %5.1f%% %9s  %s%s\n", (int)p->fig.pid,
             p->fig.command, (int)d->device, use, cached, res, peak,
             100.0 * d->fragmentation, k == 0 ? rate : "",
             k == 0 && p->fig.top_site[0] ? p->fig.top_site : (k == 0 ? "-" : ""),
             tty ? "\033[K" : "");
    }
    if (p->fig.ndevices == 0)
      printf("%7d %-16.16s %3s%s\n", (int)p->fig.pid, p->fig.command, "-",
             tty ? "\033[K" : "");
  }
  ca_top_print_groups(tty);
  if (tty)
    printf("\033[J");
  fflush(stdout);
}

/* ---- The terminal ----------------------------------------------------------- */

static struct termios ca__saved;
static bool ca__raw;

static void ca__restore(void) {
  if (ca__raw) {
    tcsetattr(STDIN_FILENO, TCSANOW, &ca__saved);
    printf("\033[?25h\033[?1049l");
    fflush(stdout);
    ca__raw = false;
  }
}

static void ca__on_signal(int sig) {
  ca__restore();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void ca__enter_raw(void) {
  if (tcgetattr(STDIN_FILENO, &ca__saved) != 0)
    return;
  struct termios raw = ca__saved;
  raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
  raw.c_cc[VMIN] = 0;
  raw.c_cc[VTIME] = 0;
  if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0)
    return;
  ca__raw = true;
  atexit(ca__restore);
  signal(SIGINT, ca__on_signal);
  signal(SIGTERM, ca__on_signal);
  printf("\033[?1049h\033[?25l"); /* the alternate screen, no cursor */
}

/* Waits up to `ms` for a key; true when it is q (or the input ended). */
static bool ca__wait_for_quit(int ms) {
  struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
  if (poll(&p, 1, ms) <= 0)
    return false;
  char c;
  ssize_t n = read(STDIN_FILENO, &c, 1);
  return n <= 0 || c == 'q' || c == 'Q';
}

static int ca__usage(FILE *to, int status) {
  fprintf(to, "usage: cudalloc top [--once] [--interval SECONDS] [--dir DIR]\n"
              "  a live view of this user's processes under cudalloc; q quits\n");
  return status;
}

int main(int argc, char **argv) {
  bool once = false;
  double interval = 1.0;
  const char *dir = CA_PUBLISH_DIR;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--once"))
      once = true;
    else if (!strcmp(argv[i], "--interval") && i + 1 < argc)
      interval = atof(argv[++i]);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
      dir = argv[++i];
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return ca__usage(stdout, 0);
    else
      return ca__usage(stderr, 2);
  }
  if (interval < 0.1)
    interval = 0.1;
  if (once) {
    ca__refresh(dir);
    ca__print(false);
    return 0;
  }
  bool tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
  if (tty)
    ca__enter_raw();
  for (;;) {
    ca__refresh(dir);
    if (tty)
      printf("\033[H");
    ca__print(tty);
    if (ca__wait_for_quit((int)(interval * 1000)))
      break;
  }
  ca__restore();
  return 0;
}
