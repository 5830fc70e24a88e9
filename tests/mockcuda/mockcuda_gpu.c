/*
 * mockcuda's devices shared by processes: with MOCKCUDA_SHARED_MEM=FILE,
 * every process that loads the mock with the same FILE uses the same
 * devices, as the processes of one machine share its GPUs. A device's
 * memory in use is then every living process's (an ended process's
 * memory goes with it as its descriptors close, as the driver frees a
 * process's when its device files close: a zombie holds none), allocations are
 * refused past the device's capacity across all of them, cuMemGetInfo
 * answers for all of them, and the file keeps each device's peak across
 * all of them, for a test to read:
 *
 *   [0..7]    "mockgpu1"
 *   [8..135]  peak bytes in use, per device (MOCK_MAX_DEVICES x u64)
 *   [136..]   MOCK_GPU_PROCS x { i32 pid, u32 0, u64 used[MOCK_MAX_DEVICES] }
 *
 * Every change is made under an exclusive flock of the file; each process
 * holds a record lock on byte MOCK_GPU_LIFE + its entry while it lives.
 * Without the variable, each process has devices of its own.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mockcuda_internal.h"

#define MOCK_GPU_PROCS 64
#define MOCK_GPU_LIFE ((off_t)1 << 20)

typedef struct mock_gpu_proc {
  int32_t pid;
  uint32_t zero;
  uint64_t used[MOCK_MAX_DEVICES];
} mock_gpu_proc;

typedef struct mock_gpu_file {
  char magic[8];
  uint64_t peak[MOCK_MAX_DEVICES];
  mock_gpu_proc proc[MOCK_GPU_PROCS];
} mock_gpu_file;

static mock_gpu_file *g_gpu; /* NULL: devices of this process alone */
static int g_gpu_fd = -1, g_gpu_me = -1;
static pid_t g_gpu_pid;

static struct flock mock_gpu_life(int i, short type) {
  return (struct flock){.l_type = type, .l_whence = SEEK_SET,
                        .l_start = MOCK_GPU_LIFE + i, .l_len = 1};
}

/* Whether entry i's process has not ended (another process holds its
 * life lock). */
static int mock_gpu_alive(int i) {
  struct flock l = mock_gpu_life(i, F_WRLCK);
  return g_gpu->proc[i].pid != 0 &&
         (fcntl(g_gpu_fd, F_GETLK, &l) != 0 || l.l_type != F_UNLCK);
}

/* The file, mapped; this process's entry, taken (once per process: a
 * forked child takes its own). */
static int mock_gpu_open(void) {
  if (g_gpu && g_gpu_pid == getpid())
    return 1;
  const char *path = getenv("MOCKCUDA_SHARED_MEM");
  if (!path || !*path)
    return 0;
  if (!g_gpu) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(mock_gpu_file)) != 0)
      abort(); /* a test asked for it: never run with devices of its own */
    void *p = mmap(NULL, sizeof(mock_gpu_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      abort();
    g_gpu = p;
    g_gpu_fd = fd;
  }
  g_gpu_pid = getpid();
  g_gpu_me = -1;
  flock(g_gpu_fd, LOCK_EX);
  memcpy(g_gpu->magic, "mockgpu1", 8);
  for (int i = 0; i < MOCK_GPU_PROCS && g_gpu_me < 0; i++) {
    struct flock l = mock_gpu_life(i, F_WRLCK);
    if (!mock_gpu_alive(i) && fcntl(g_gpu_fd, F_SETLK, &l) == 0) {
      memset(&g_gpu->proc[i], 0, sizeof(g_gpu->proc[i]));
      g_gpu->proc[i].pid = (int32_t)g_gpu_pid;
      g_gpu_me = i;
    }
  }
  flock(g_gpu_fd, LOCK_UN);
  if (g_gpu_me < 0)
    abort();
  return 1;
}

/* Bytes in use on `dev` by the living processes but this one. */
static uint64_t mock_gpu_others(int dev) {
  uint64_t sum = 0;
  for (int i = 0; i < MOCK_GPU_PROCS; i++)
    if (i != g_gpu_me && mock_gpu_alive(i))
      sum += g_gpu->proc[i].used[dev];
  return sum;
}

uint64_t mock_device_used(int dev) {
  if (!mock_gpu_open())
    return g_dev[dev].used;
  flock(g_gpu_fd, LOCK_SH);
  uint64_t used = mock_gpu_others(dev) + g_dev[dev].used;
  flock(g_gpu_fd, LOCK_UN);
  return used;
}

void mock_device_changed(int dev) {
  if (!mock_gpu_open())
    return;
  flock(g_gpu_fd, LOCK_EX);
  g_gpu->proc[g_gpu_me].used[dev] = g_dev[dev].used;
  uint64_t all = mock_gpu_others(dev) + g_dev[dev].used;
  if (all > g_gpu->peak[dev])
    g_gpu->peak[dev] = all;
  flock(g_gpu_fd, LOCK_UN);
}
