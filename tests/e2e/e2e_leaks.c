/*
 * e2e_leaks: a driver-API program, linked to libcuda (the mock, by RPATH),
 * whose leaks leak_report_test.py checks in cudalloc's report at exit
 * (docs/LEAKS.md). Built with -g -O0 so that the frames the report prints
 * (function, file, line) are exactly those of the calls below.
 *
 *   e2e_leaks leaks    leaks 2 x 1 MiB from leak_big() and 4096 B from
 *                      leak_small(); allocates and frees 50 other blocks and
 *                      one managed block
 *   e2e_leaks clean    the same work, everything freed
 *   e2e_leaks fork     leaks 1 MiB, forks; the child sets up its own context
 *                      and leaks 8192 B; both exit
 *   e2e_leaks reset    leaks 2 MiB, resets the primary context, uses it again
 *                      (one block allocated and freed), exits with no leak
 *   e2e_leaks signal [LOG]
 *                      one live block, raise(SIGUSR1), waits up to 2 s for
 *                      the summary (for "memory summary", or a JSON
 *                      "signal" document, to appear in LOG, "%p" replaced
 *                      by the pid, when given; else the full 2 s), frees
 *                      it, exits
 *   e2e_leaks none     never touches CUDA
 *   e2e_leaks daemon DATA
 *                      leaks 1 MiB, asks for 64 GiB (refused: the library
 *                      reports it, so its log file is open), then
 *                      closes every descriptor above 2, as daemons do, and
 *                      opens DATA (O_WRONLY|O_CREAT|O_TRUNC), which gets the
 *                      log's old number, writes "program data" to it, exits
 *   e2e_leaks stderrfile DATA
 *                      leaks 1 MiB, closes stderr and opens DATA (O_RDWR|
 *                      O_CREAT|O_TRUNC) as descriptor 2, writes "program
 *                      data" to it, exits
 *   e2e_leaks stderrlog LOG
 *                      leaks 1 MiB, points stderr at LOG opened to append
 *                      (a log of the program's own), exits
 *   e2e_leaks growth [marks]
 *                      40 "training steps": each allocates and frees 20
 *                      temporaries of 64 KiB (scratch_step) and keeps one
 *                      1 MiB block (keep_step); with "marks", calls
 *                      cudalloc_mark() after each step; frees everything
 *                      at the end, so nothing leaks at exit
 *   e2e_leaks steady   the same steps, keeping nothing
 *   e2e_leaks oom      (under memory_limit_mb:80) hold_big() keeps 3 x 16 MiB
 *                      and hold_small() 8 MiB; then 32 MiB is asked and
 *                      refused, and 40 MiB, refused again; frees all
 *
 * stdout: "key=value" lines the checker reads: preloaded=0|1 (whether
 * cudalloc is loaded), big_line=/small_line= (the source lines of the two
 * leaking cuMemAlloc calls), keep_line= (keep_step's cuMemAlloc), leak=0x...
 * (each leaked address), hold_big_line=/hold_small_line= (the oom mode's
 * two holding calls), oom_32=/oom_40= (the two refused requests' status),
 * allocations=N (device allocations made), child_pid=N, log_fd=N (the
 * descriptor the library's log was at), data_fd=N, done=MODE.
 * Failures: "FAIL e2e_leaks: ..." on stderr and exit status 1 (the library
 * writes nothing else to stderr with log_path, so the checker can tell).
 */
#include <cuda.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define E2E_PROG "e2e_leaks"
#include "e2e_direct.h"

#define NOINLINE __attribute__((noinline))

static int allocations; /* device allocations this program made */


static void print_leak(CUdeviceptr p) { printf("leak=0x%llx\n", (unsigned long long)p); }

/* The two leaking call sites. The cuMemAlloc call and __LINE__ share a line,
 * so the line printed is the one the report must name. */
NOINLINE static void leak_big(int *line) {
  for (int i = 0; i < 2; i++) {
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc(&p, 1u << 20); *line = __LINE__;
    if (rc != CUDA_SUCCESS)
      fail("cuMemAlloc(1 MiB) in leak_big", (int)rc);
    allocations++;
    print_leak(p);
  }
}

NOINLINE static void leak_small(int *line) {
  CUdeviceptr p = 0;
  CUresult rc = cuMemAlloc(&p, 4096); *line = __LINE__;
  if (rc != CUDA_SUCCESS)
    fail("cuMemAlloc(4096) in leak_small", (int)rc);
  allocations++;
  print_leak(p);
}

/* Work that frees what it allocates: 50 pairs of assorted sizes (some live
 * at once), and a managed block. */
NOINLINE static void balanced_work(void) {
  CUdeviceptr live[5] = {0};
  for (int i = 0; i < 50; i++) {
    size_t size = (size_t)(256 + 4099 * i) * (size_t)(1 + i % 7);
    CUdeviceptr *slot = &live[i % 5];
    if (*slot)
      CHECK(cuMemFree(*slot));
    CHECK(cuMemAlloc(slot, size));
    allocations++;
  }
  for (int i = 0; i < 5; i++)
    CHECK(cuMemFree(live[i]));
  CUdeviceptr managed = 0;
  CHECK(cuMemAllocManaged(&managed, 65536, CU_MEM_ATTACH_GLOBAL));
  allocations++;
  CHECK(cuMemFree(managed));
}

/* One block allocated, leaked, from a plain helper (no line reported). */
NOINLINE static CUdeviceptr leak_one(size_t size) {
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, size));
  allocations++;
  print_leak(p);
  return p;
}

static int mode_leaks(int clean) {
  setup();
  balanced_work();
  if (clean) {
    CUdeviceptr a = 0, b = 0;
    CHECK(cuMemAlloc(&a, 1u << 20));
    CHECK(cuMemAlloc(&b, 4096));
    allocations += 2;
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
  } else {
    int big_line = 0, small_line = 0;
    leak_big(&big_line);
    leak_small(&small_line);
    printf("big_line=%d\nsmall_line=%d\n", big_line, small_line);
  }
  printf("allocations=%d\n", allocations);
  return 0;
}

static int mode_fork(void) {
  setup();
  leak_one(1u << 20);
  fflush(stdout); /* or the child's exit writes the parent's lines again */
  pid_t child = fork();
  if (child < 0) {
    perror("FAIL e2e_leaks: fork");
    return 1;
  }
  if (child == 0) {
    /* A child cannot use its parent's context: it sets up its own. */
    setup();
    leak_one(8192);
    printf("done=fork-child\n");
    exit(0);
  }
  printf("child_pid=%d\n", (int)child);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "FAIL e2e_leaks: child %d ended with status 0x%x\n", (int)child, status);
    return 1;
  }
  return 0;
}

static int mode_reset(void) {
  setup();
  leak_one(2u << 20);
  CHECK(cuDevicePrimaryCtxReset(0)); /* every allocation of the context dies */
  setup();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 12345));
  allocations++;
  CHECK(cuMemFree(p));
  printf("allocations=%d\n", allocations);
  return 0;
}

static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  char buf[65536];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, needle) != NULL;
}

static int mode_signal(const char *log_template) {
  char log[4096] = "";
  if (log_template) { /* "%p" -> our pid, as the library names its file */
    size_t len = 0;
    for (const char *t = log_template; *t && len + 16 < sizeof log; t++) {
      if (t[0] == '%' && t[1] == 'p') {
        len += (size_t)snprintf(log + len, sizeof log - len, "%d", (int)getpid());
        t++;
      } else {
        log[len++] = *t;
      }
    }
    log[len] = '\0';
  }
  setup();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1u << 20));
  allocations++;
  fflush(stdout);
  raise(SIGUSR1); /* the library's handler, or the default action: death */
  printf("raised=1\n");
  struct timespec step = {0, 20 * 1000 * 1000};
  int waited = 0;
  for (; waited < 100; waited++) { /* 100 x 20 ms */
    if (log[0] && (file_has(log, "memory summary") || file_has(log, "\"event\":\"signal\"")))
      break;
    nanosleep(&step, NULL);
  }
  printf("waited_ms=%d\n", waited * 20);
  CHECK(cuMemFree(p));
  printf("allocations=%d\n", allocations);
  return 0;
}

static const char program_data[] = "program data\n";

/* The lowest descriptor above 2 that is open, or -1. */
static int lowest_open_above_2(void) {
  for (int fd = 3; fd < 1024; fd++)
    if (fcntl(fd, F_GETFD) >= 0)
      return fd;
  return -1;
}

static int write_data(int fd) {
  if (write(fd, program_data, sizeof program_data - 1) !=
      (ssize_t)(sizeof program_data - 1)) {
    perror("FAIL e2e_leaks: writing the data file");
    return 1;
  }
  return 0;
}

static int mode_daemon(const char *data) {
  setup();
  leak_one(1u << 20);
  int before = lowest_open_above_2();
  CUdeviceptr huge = 0;
  if (cuMemAlloc(&huge, (size_t)64 << 30) == CUDA_SUCCESS)
    fail("cuMemAlloc(64 GiB) on the mock's 1 GiB", 0);
  int log_fd = lowest_open_above_2();
  if (before != -1 || log_fd < 0) {
    fprintf(stderr, "FAIL e2e_leaks: descriptors above 2: %d before the "
                    "refused call, %d after (want none, then the log)\n",
            before, log_fd);
    return 1;
  }
  printf("log_fd=%d\n", log_fd);
  fflush(stdout);
  for (int fd = 3; fd < 1024; fd++)
    close(fd);
  int fd = open(data, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  printf("data_fd=%d\n", fd);
  return fd < 0 ? 1 : write_data(fd);
}

static int mode_stderr_file(const char *data) {
  setup();
  leak_one(1u << 20);
  fflush(stderr);
  close(2);
  int fd = open(data, O_RDWR | O_CREAT | O_TRUNC, 0644);
  printf("data_fd=%d\n", fd);
  return fd != 2 ? 1 : write_data(fd);
}

static int mode_stderr_log(const char *log) {
  setup();
  leak_one(1u << 20);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0 || dup2(fd, 2) != 2) {
    perror("FAIL e2e_leaks: pointing stderr at the log");
    return 1;
  }
  close(fd);
  return 0;
}

/* A step's temporaries: allocated, some live at once, all freed. */
NOINLINE static void scratch_step(void) {
  CUdeviceptr t[4] = {0};
  for (int i = 0; i < 20; i++) {
    if (t[i % 4])
      CHECK(cuMemFree(t[i % 4]));
    CHECK(cuMemAlloc(&t[i % 4], 65536));
    allocations++;
  }
  for (int i = 0; i < 4; i++)
    CHECK(cuMemFree(t[i]));
}

/* What a leaky training loop keeps each step (a loss tensor "for later"). */
NOINLINE static CUdeviceptr keep_step(int *line) {
  CUdeviceptr p = 0;
  CUresult rc = cuMemAlloc(&p, 1u << 20); *line = __LINE__;
  if (rc != CUDA_SUCCESS)
    fail("cuMemAlloc(1 MiB) in keep_step", (int)rc);
  allocations++;
  return p;
}

#define GROWTH_STEPS 40

/* What a training holds when it runs out of memory: weights from one
 * function, activations from another. */
NOINLINE static void hold_big(CUdeviceptr *p, int *line) {
  for (int i = 0; i < 3; i++) {
    CUresult rc = cuMemAlloc(&p[i], 16u << 20); *line = __LINE__;
    if (rc != CUDA_SUCCESS)
      fail("cuMemAlloc(16 MiB) in hold_big", (int)rc);
    allocations++;
  }
}

NOINLINE static void hold_small(CUdeviceptr *p, int *line) {
  CUresult rc = cuMemAlloc(p, 8u << 20); *line = __LINE__;
  if (rc != CUDA_SUCCESS)
    fail("cuMemAlloc(8 MiB) in hold_small", (int)rc);
  allocations++;
}

static int mode_oom(void) {
  setup();
  CUdeviceptr held[4] = {0}, more = 0;
  int big_line = 0, small_line = 0;
  hold_big(held, &big_line);
  hold_small(&held[3], &small_line);
  printf("hold_big_line=%d\nhold_small_line=%d\n", big_line, small_line);
  fflush(stdout);
  printf("oom_32=%d\n", (int)cuMemAlloc(&more, 32u << 20));
  printf("oom_40=%d\n", (int)cuMemAlloc(&more, 40u << 20));
  for (int i = 0; i < 4; i++)
    CHECK(cuMemFree(held[i]));
  printf("allocations=%d\n", allocations);
  return 0;
}

static int mode_growth(int keep, int marks) {
  setup();
  void (*mark)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "cudalloc_mark");
  CUdeviceptr kept[GROWTH_STEPS] = {0};
  int line = 0;
  for (int s = 0; s < GROWTH_STEPS; s++) {
    scratch_step();
    if (keep)
      kept[s] = keep_step(&line);
    if (marks && mark)
      mark();
  }
  for (int s = 0; s < GROWTH_STEPS; s++)
    if (kept[s])
      CHECK(cuMemFree(kept[s]));
  if (keep)
    printf("keep_line=%d\n", line);
  printf("allocations=%d\n", allocations);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  /* The same test as the library sees it: is it in this process? */
  printf("preloaded=%d\n", dlsym(RTLD_DEFAULT, "cudalloc_version") != NULL);
  int rc;
  if (!strcmp(mode, "leaks"))
    rc = mode_leaks(0);
  else if (!strcmp(mode, "clean"))
    rc = mode_leaks(1);
  else if (!strcmp(mode, "fork"))
    rc = mode_fork();
  else if (!strcmp(mode, "reset"))
    rc = mode_reset();
  else if (!strcmp(mode, "signal"))
    rc = mode_signal(argc > 2 ? argv[2] : NULL);
  else if (!strcmp(mode, "none"))
    rc = 0;
  else if (!strcmp(mode, "daemon") && argc > 2)
    rc = mode_daemon(argv[2]);
  else if (!strcmp(mode, "stderrfile") && argc > 2)
    rc = mode_stderr_file(argv[2]);
  else if (!strcmp(mode, "stderrlog") && argc > 2)
    rc = mode_stderr_log(argv[2]);
  else if (!strcmp(mode, "growth"))
    rc = mode_growth(1, argc > 2 && !strcmp(argv[2], "marks"));
  else if (!strcmp(mode, "steady"))
    rc = mode_growth(0, 0);
  else if (!strcmp(mode, "oom"))
    rc = mode_oom();
  else {
    fprintf(stderr, "usage: e2e_leaks leaks|clean|fork|reset|signal [LOG]|"
                    "none|daemon DATA|stderrfile DATA|stderrlog LOG|"
                    "growth [marks]|steady|oom\n");
    return 2;
  }
  if (rc == 0)
    printf("done=%s\n", mode);
  return rc;
}
