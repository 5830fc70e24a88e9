/*
 * Growing a table by doubling, for the library's small tables (in its own
 * memory, meta.h).
 */
#ifndef CA_GROW_H
#define CA_GROW_H

#include <stddef.h>

#include "support/meta.h"

/* Grows table `v` of `*cap` elements of `elem` bytes to hold one more: the
 * new table, or NULL (the old one and *cap unchanged) when the host is out
 * of memory. */
static inline void *ca_grow(void *v, size_t *cap, size_t elem) {
  size_t n = *cap != 0 ? *cap * 2 : 16;
  void *p = ca_meta_grow(v, *cap * elem, n * elem);
  if (p != NULL)
    *cap = n;
  return p;
}

#endif /* CA_GROW_H */
