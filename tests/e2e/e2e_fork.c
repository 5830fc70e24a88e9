/*
 * fork() while other threads are inside the library, against the mock
 * driver: the child must not deadlock on a lock a parent thread held at
 * the fork, and must be able to use the driver through the library.
 *
 * Four threads allocate and free (256 B to 4 MiB) in a tight loop on the
 * primary context; meanwhile the main thread forks FORKS times. Each child
 * retains the primary context, allocates BLOCKS blocks, writes each with
 * cuMemsetD8, frees them, and leaves with _exit(0) (every CHILD_EXIT_EVERY-th
 * child with exit(0), so that the exit report runs in the child too). The
 * parent waits for each child up to CHILD_TIMEOUT_S seconds, and fails on
 * a child that hangs (it is killed) or fails.
 *
 * Before forking, the parent leaks one 8 MiB block. With E2E_FORK_LOGDIR
 * set (CTest sets it with CUDALLOC_CONF=log_path:<dir>/fork.%p.log), a
 * child's own report, when it wrote one, must never mention the parent's
 * blocks: no "8388608 bytes", and nothing leaked at all (the child freed
 * everything it allocated).
 *
 * Runs plainly and preloaded (E2E_EXPECT=plain|pooled checks that the
 * preload happened). Preloaded, the forks land while workers are inside
 * the library. (The mock holds its own lock across fork, as a driver
 * does, so that a hang here is the library's.)
 * Last line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define FORKS 50
#define BLOCKS 100
#define CHILD_EXIT_EVERY 10
#define CHILD_TIMEOUT_S 10
#define LIVE_PER_THREAD 8
#define MIN_SIZE 256u
#define MAX_SIZE (4u << 20)
#define PARENT_LEAK (8u << 20) /* 8388608 bytes */
#define MAX_HUNG 3 /* then stop forking: CTest's timeout would hide why */

static int failures;
static CUdevice dev;
static CUcontext prim;
static atomic_bool stop;
static atomic_uint_fast64_t worker_ops;
static atomic_int worker_failures;
static int hung; /* children killed for hanging */

#define E2E_NAME "e2e_fork"
#include "e2e_check.h"

static uint32_t next_rand(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static size_t random_size(uint32_t *s) {
  /* Mostly small, some up to MAX_SIZE: both of the pool's segment kinds. */
  uint32_t r = next_rand(s);
  size_t max = (r & 3) ? (64u << 10) : MAX_SIZE;
  return MIN_SIZE + next_rand(s) % (max - MIN_SIZE + 1);
}

static void *worker(void *arg) {
  uint32_t seed = 0x9e3779b9u * (uint32_t)(uintptr_t)arg + 1;
  CUdeviceptr live[LIVE_PER_THREAD] = {0};
  if (cuCtxSetCurrent(prim) != CUDA_SUCCESS) {
    atomic_fetch_add(&worker_failures, 1);
    return NULL;
  }
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    int i = (int)(next_rand(&seed) % LIVE_PER_THREAD);
    if (live[i]) {
      if (cuMemFree(live[i]) != CUDA_SUCCESS)
        atomic_fetch_add(&worker_failures, 1);
      live[i] = 0;
    } else if (cuMemAlloc(&live[i], random_size(&seed)) != CUDA_SUCCESS) {
      atomic_fetch_add(&worker_failures, 1);
      live[i] = 0;
    }
    atomic_fetch_add_explicit(&worker_ops, 1, memory_order_relaxed);
  }
  for (int i = 0; i < LIVE_PER_THREAD; i++)
    if (live[i] && cuMemFree(live[i]) != CUDA_SUCCESS)
      atomic_fetch_add(&worker_failures, 1);
  return NULL;
}

/* The child: its own primary context (retained again: in the child the
 * library must not believe it holds the parent's), BLOCKS blocks, each
 * written, all freed. Returns the exit status. */
static int child(int n) {
  uint32_t seed = 0x12345u + (uint32_t)n;
  CUdeviceptr p[BLOCKS] = {0};
  size_t sz[BLOCKS];
  CUcontext ctx = NULL;
  int bad = 0;
  CUresult rc;
  if ((rc = cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS ||
      (rc = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) {
    fprintf(stderr, "FAIL e2e_fork: child %d: primary context: %d\n", n,
            (int)rc);
    return 1;
  }
  for (int i = 0; i < BLOCKS; i++) {
    sz[i] = random_size(&seed);
    if ((rc = cuMemAlloc(&p[i], sz[i])) != CUDA_SUCCESS) {
      fprintf(stderr, "FAIL e2e_fork: child %d: cuMemAlloc(%zu) = %d\n", n,
              sz[i], (int)rc);
      p[i] = 0;
      bad = 1;
      continue;
    }
    if ((rc = cuMemsetD8(p[i], (unsigned char)i, sz[i])) != CUDA_SUCCESS) {
      fprintf(stderr, "FAIL e2e_fork: child %d: cuMemsetD8(block %d, %zu) = %d\n",
              n, i, sz[i], (int)rc);
      bad = 1;
    }
  }
  for (int i = 0; i < BLOCKS; i++)
    if (p[i] && (rc = cuMemFree(p[i])) != CUDA_SUCCESS) {
      fprintf(stderr, "FAIL e2e_fork: child %d: cuMemFree(block %d) = %d\n", n,
              i, (int)rc);
      bad = 1;
    }
  if ((rc = cuDevicePrimaryCtxRelease(dev)) != CUDA_SUCCESS) {
    fprintf(stderr, "FAIL e2e_fork: child %d: release: %d\n", n, (int)rc);
    bad = 1;
  }
  return bad;
}

/* Waits for `pid` up to CHILD_TIMEOUT_S; kills it if it hangs. */
static void wait_child(pid_t pid, int n) {
  struct timespec start, now, nap = {0, 1000000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
      if (WIFEXITED(status))
        FAIL("child %d (pid %d) exited with status %d", n, (int)pid,
             WEXITSTATUS(status));
      else
        FAIL("child %d (pid %d) died of signal %d", n, (int)pid,
             WIFSIGNALED(status) ? WTERMSIG(status) : -1);
      return;
    }
    if (r < 0 && errno != EINTR) {
      FAIL("waitpid(child %d, pid %d): %s", n, (int)pid, strerror(errno));
      return;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= CHILD_TIMEOUT_S) {
      FAIL("child %d (pid %d) hung for %d s after fork: killed", n, (int)pid,
           CHILD_TIMEOUT_S);
      hung++;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return;
    }
    nanosleep(&nap, NULL);
  }
}

/* Stale logs of an earlier run could carry a reused pid. */
static void clear_logs(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, "fork.", 5) == 0) {
      char path[4096];
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      unlink(path);
    }
  closedir(d);
}

/* A child's own report must not mention the parent's blocks. Returns
 * whether the child wrote a log. */
static bool check_child_log(const char *dir, pid_t pid, int n) {
  char path[4096], line[1024];
  snprintf(path, sizeof(path), "%s/fork.%d.log", dir, (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  while (fgets(line, sizeof(line), f)) {
    if (strstr(line, "8388608 bytes"))
      FAIL("child %d's report (%s) names the parent's 8 MiB block: %s", n,
           path, line);
    else if (strstr(line, "bytes leaked"))
      FAIL("child %d's report (%s) names leaks, but it freed everything: %s",
           n, path, line);
  }
  fclose(f);
  return true;
}

int main(void) {
  bool preloaded = e2e_preloaded();
  const char *logdir = getenv("E2E_FORK_LOGDIR");
  if (logdir && !*logdir)
    logdir = NULL;
  if (logdir)
    clear_logs(logdir);

  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&prim, dev));
  CHECK(cuCtxSetCurrent(prim));
  CUdeviceptr leaked = 0;
  CHECK(cuMemAlloc(&leaked, PARENT_LEAK)); /* never freed */
  CHECK(cuMemsetD8(leaked, 1, PARENT_LEAK));

  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++)
    if (pthread_create(&threads[i], NULL, worker, (void *)(uintptr_t)i) != 0) {
      FAIL("pthread_create");
      return 1;
    }
  /* Let the workers get going before the first fork. */
  while (atomic_load(&worker_ops) < 1000 && atomic_load(&worker_failures) == 0)
    sched_yield();

  pid_t pids[FORKS];
  for (int n = 0; n < FORKS; n++)
    pids[n] = -1;
  for (int n = 0; n < FORKS && hung < MAX_HUNG; n++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      FAIL("fork: %s", strerror(errno));
      continue;
    }
    if (pid == 0) {
      int status = child(n);
      if (n % CHILD_EXIT_EVERY == 0)
        exit(status); /* atexit handlers: the exit report runs */
      _exit(status);
    }
    pids[n] = pid;
    wait_child(pid, n);
  }

  atomic_store(&stop, true);
  for (int i = 0; i < THREADS; i++)
    pthread_join(threads[i], NULL);
  if (atomic_load(&worker_failures))
    FAIL("%d worker allocation(s) or free(s) failed",
         atomic_load(&worker_failures));

  int logs = 0;
  if (logdir)
    for (int n = 0; n < FORKS; n++)
      if (pids[n] > 0)
        logs += check_child_log(logdir, pids[n], n);
  /* With a log path, the children that ran their exit report wrote one. */
  if (logdir && preloaded && logs < FORKS / CHILD_EXIT_EVERY)
    FAIL("only %d child log(s) in %s, expected at least %d", logs, logdir,
         FORKS / CHILD_EXIT_EVERY);

  printf("%s e2e_fork (%s, %d forks, %llu worker ops, %d child log(s), %d "
         "failure(s))\n",
         failures ? "FAIL" : "PASS", preloaded ? "preloaded" : "plain", FORKS,
         (unsigned long long)atomic_load(&worker_ops), logs, failures);
  return failures ? 1 : 0;
}
