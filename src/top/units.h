/*
 * How cudalloc top writes a number of bytes: "5.4 GiB", "12.0 MiB", "512 B".
 */
#ifndef CA_TOP_UNITS_H
#define CA_TOP_UNITS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

static inline void ca_top_bytes(char *buf, size_t len, uint64_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%llu B", (unsigned long long)n);
  else
    snprintf(buf, len, "%.1f %s", v, units[u]);
}

#endif /* CA_TOP_UNITS_H */
