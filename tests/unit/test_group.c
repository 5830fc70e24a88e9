/*
 * shared_limit's group (support/group.c) over a real region in /dev/shm:
 * booking against the cap, threads booking while the watcher's part
 * answers and reaps (run under ThreadSanitizer too), a process killed
 * while it holds the region's lock in the middle of a booking, a process
 * that ends holding bookings, and asks for room answered by another
 * process. Other processes of the group are forked children, which take
 * entries of their own as a forked child of a program does.
 *
 * The group is named after this process, and its region removed at the
 * end.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/config.h"
#include "support/group.h"
#include "support/group_region.h"

#define MiB (1ull << 20)
#define CAP (64 * MiB)
#define THREADS 4
#define OPS 20000

static char name[64];
static uint32_t group; /* the device's entry, plus one */

static const uint8_t uuid[16] = "unit-test-gpu-01";

static int setup(void **state) {
  (void)state;
  snprintf(name, sizeof(name), "unit-%d", (int)getpid());
  char conf[128];
  snprintf(conf, sizeof(conf), "memory_limit_mb:64,shared_limit:%s", name);
  setenv("CUDALLOC_CONF", conf, 1);
  if (!ca_group_join() || (group = ca_group_device(uuid)) == 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char dir[64], path[160];
  ca_group_dir(dir, sizeof(dir));
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  unlink(path);
  return 0;
}

static void test_books_within_the_cap(void **state) {
  (void)state;
  assert_int_equal(ca_group_cap(), CAP);
  assert_true(ca_group_book(group, 40 * MiB));
  assert_false(ca_group_book(group, 30 * MiB));
  assert_true(ca_group_book(group, 24 * MiB));
  assert_int_equal(ca_group_held(group), CAP);
  assert_false(ca_group_book(group, 1));
  ca_group_unbook(group, 64 * MiB);
  assert_int_equal(ca_group_held(group), 0);
  /* Another name of the same device is the same entry. */
  assert_int_equal(ca_group_device(uuid), group);
}

/* ---- Threads -------------------------------------------------------------- */

static atomic_bool stop;
static atomic_int over; /* bookings seen past the cap */

static void *booker(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  uint64_t mine[8] = {0};
  for (int op = 0; op < OPS; op++) {
    int i = rand_r(&seed) % 8;
    if (mine[i]) {
      ca_group_unbook(group, mine[i]);
      mine[i] = 0;
    } else {
      uint64_t bytes = (uint64_t)(1 + rand_r(&seed) % 8) * MiB;
      if (ca_group_book(group, bytes)) {
        mine[i] = bytes;
        if (ca_group_held(group) > CAP)
          atomic_fetch_add(&over, 1);
      }
    }
  }
  for (int i = 0; i < 8; i++)
    if (mine[i])
      ca_group_unbook(group, mine[i]);
  return NULL;
}

/* What the watcher does every tick: answers asks, reaps, says its cache. */
static void *watcher(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    uint32_t want, ticket;
    if (ca_group_wanted(&want, &ticket))
      ca_group_answer(ticket);
    ca_group_reap();
    ca_group_note_cached(group, ca_group_held(group) / 2);
  }
  return NULL;
}

static void test_threads_never_pass_the_cap(void **state) {
  (void)state;
  pthread_t t[THREADS], w;
  atomic_store(&stop, false);
  assert_int_equal(pthread_create(&w, NULL, watcher, NULL), 0);
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, booker, (void *)(uintptr_t)(i + 1)), 0);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  atomic_store(&stop, true);
  pthread_join(w, NULL);
  assert_int_equal(atomic_load(&over), 0);
  assert_int_equal(ca_group_held(group), 0);
}

/* ---- Other processes ------------------------------------------------------ */

static int wait_child(pid_t pid) {
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return status;
}

/* A process killed while it holds the region's lock, half-way through a
 * booking (the device's figure raised, its own not yet): the next booking
 * takes the lock over, makes the figures whole, and takes the dead
 * process's part back. */
static void test_a_process_killed_inside_the_lock(void **state) {
  (void)state;
  assert_true(ca_group_book(group, 10 * MiB));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    assert_true(ca_group_book(group, 20 * MiB)); /* an entry of its own */
    /* Its own map of the region (closing a second descriptor of the file
     * drops its life lock too: it is about to die anyway). */
    int fd;
    char why[256];
    ca_group_region *r = ca_group_region_open(name, CA_GROUP_JOIN, CAP, &fd, why, sizeof(why));
    if (r == NULL || pthread_mutex_lock(&r->lock) != 0)
      _exit(3);
    atomic_fetch_add(&r->device[group - 1].held, 8 * MiB);
    raise(SIGKILL);
  }
  int status = wait_child(pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  assert_int_equal(ca_group_held(group), 38 * MiB);
  /* 54 MiB more fits only once the dead child's 28 MiB are gone. */
  assert_true(ca_group_book(group, 54 * MiB));
  assert_int_equal(ca_group_held(group), CAP);
  ca_group_unbook(group, 64 * MiB);
  assert_int_equal(ca_group_held(group), 0);
}

/* A process that ends holding bookings (exit or _exit, as a worker of a
 * framework ends) holds nothing once it has: the next look takes its part
 * back. */
static void test_an_ended_process_holds_nothing(void **state) {
  (void)state;
  for (int how = 0; how < 2; how++) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      if (!ca_group_book(group, 32 * MiB))
        _exit(3);
      if (how)
        exit(0);
      _exit(0);
    }
    assert_int_equal(wait_child(pid), 0);
    assert_int_equal(ca_group_held(group), 32 * MiB);
    ca_group_reap();
    assert_int_equal(ca_group_held(group), 0);
  }
}

/* Asked for room, another process gives back what it caches (here: all
 * it booked) from its watcher, and answers; the asker sees the room. */
static void test_an_ask_is_answered_by_another_process(void **state) {
  (void)state;
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    if (!ca_group_book(group, 48 * MiB))
      _exit(3);
    if (write(ready[1], "r", 1) != 1)
      _exit(4);
    for (int tick = 0; tick < 500; tick++) {
      uint32_t want = 0, ticket;
      if (ca_group_wanted(&want, &ticket)) {
        if (want & (1u << (group - 1)))
          ca_group_unbook(group, 48 * MiB);
        ca_group_answer(ticket);
        _exit(0);
      }
      usleep(10000);
    }
    _exit(5);
  }
  close(ready[1]);
  char c;
  assert_int_equal(read(ready[0], &c, 1), 1);
  close(ready[0]);
  assert_false(ca_group_book(group, 32 * MiB));
  assert_true(ca_group_ask(group, 32 * MiB, 2000));
  assert_true(ca_group_book(group, 32 * MiB));
  assert_int_equal(wait_child(pid), 0);
  ca_group_unbook(group, 32 * MiB);
  assert_int_equal(ca_group_held(group), 0);
}

static void test_names(void **state) {
  (void)state;
  assert_true(ca_group_name_ok("train-1.a_B"));
  static const char *const bad[] = {"", ".x", "..", "a/b", "a b", "x\n",
                                    "0123456789012345678901234567890123456789012345678901234567890123456789"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_false(ca_group_name_ok(bad[i]));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_books_within_the_cap),
      cmocka_unit_test(test_threads_never_pass_the_cap),
      cmocka_unit_test(test_a_process_killed_inside_the_lock),
      cmocka_unit_test(test_an_ended_process_holds_nothing),
      cmocka_unit_test(test_an_ask_is_answered_by_another_process),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
