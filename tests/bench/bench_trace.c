/*
 * bench_trace: what recording the timeline (trace_path, src/timeline/trace.h) costs
 * an allocating thread: N allocate+free event pairs into the ring, drained
 * by this thread into a file after every 64 Ki events (so the ring never
 * fills), the drain timed apart. Prints ns per event on the allocation
 * path and ns per event written.
 *
 *   bench_trace [PAIRS [FILE]]   (default 2,000,000 pairs into /tmp/bench_trace.json)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "timeline/trace.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 2000000;
  const char *file = argc > 2 ? argv[2] : "/tmp/bench_trace.json";
  if (!ca_trace_start(file, true, (uint64_t)now_ns()))
    return 1;
  double record = 0, write = 0;
  for (long done = 0; done < pairs;) {
    long batch = pairs - done < 32768 ? pairs - done : 32768;
    double t0 = now_ns();
    for (long i = 0; i < batch; i++) {
      uint64_t addr = 0x7f0000000000ull + (uint64_t)((done + i) % 4096) * 512;
      ca_trace_alloc(0, addr, 512, 0);
      ca_trace_free(0, addr, 512);
    }
    double t1 = now_ns();
    ca_trace_drain(NULL);
    record += t1 - t0;
    write += now_ns() - t1;
    done += batch;
  }
  printf("bench_trace: %.1f ns per event recorded (allocation path), %.1f ns per event "
         "written (watcher), %ld pairs\n", record / (2.0 * pairs), write / (2.0 * pairs), pairs);
  remove(file);
  return 0;
}
