/*
 * bench_sites: what counting live bytes by allocation site costs
 * (src/leaks/sites.c), per allocate+free pair: 16 sites, one block live at each
 * at a time, as a loop that allocates from a few call sites does.
 *
 *   bench_sites [pairs] [growth]
 *
 * With "growth", growth snapshots are on (growth_report:1), taken every 64
 * allocations at first, less often as the run goes on. Prints the wall
 * time per pair and the snapshots taken; scripts/bench-cpu.sh counts its
 * instructions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "leaks/sites.h"

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 1000000;
  int growth = argc > 2 && strcmp(argv[2], "growth") == 0;
  ca_sites_set_growth(growth);
  double t0 = seconds();
  for (long i = 0; i < pairs; i++) {
    uint32_t site = 1 + (uint32_t)(i & 15);
    ca_sites_alloc(site, 4096);
    ca_sites_free(site, 4096);
  }
  double t = seconds() - t0;
  uint64_t snapshots = 0;
  ca_site_growth g[1];
  ca_sites_growth(g, 1, &snapshots);
  printf("bench_sites: %.1f ns per allocate+free pair, growth %s, %llu snapshots, %ld pairs\n",
         t / (double)pairs * 1e9, growth ? "on" : "off", (unsigned long long)snapshots, pairs);
  return 0;
}
