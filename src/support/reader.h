/*
 * A bounded reader over bytes of a file or of memory the library does not
 * trust (ELF and DWARF sections for the symbolizer, unwind tables for the
 * unwinder). Reads past `end` never happen: the first one marks the reader
 * bad, and every later read returns 0 or NULL, so parsers need only check
 * `bad` where a loop could otherwise keep going.
 */
#ifndef CA_READER_H
#define CA_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ca_rd {
  const uint8_t *p;
  const uint8_t *end;
  bool bad;
} ca_rd;

/* An absent range (NULL) reads as empty: NULL + 0 is undefined in C. */
static inline ca_rd ca_rd_make(const uint8_t *p, size_t n) {
  ca_rd r = {p, p != NULL ? p + n : NULL, false};
  return r;
}

static inline size_t ca_rd_left(const ca_rd *r) {
  return r->bad ? 0 : (size_t)(r->end - r->p);
}

static inline bool ca_rd_skip(ca_rd *r, uint64_t n) {
  if (r->bad || n > (uint64_t)(r->end - r->p)) {
    r->bad = true;
    r->p = r->end;
    return false;
  }
  r->p += n;
  return true;
}

/* An unsigned integer of 1 to 8 bytes in the host's byte order (the
 * callers read only files of the host's order). */
static inline uint64_t ca_rd_uint(ca_rd *r, size_t size) {
  const uint8_t *p = r->p;
  if (size == 0 || size > 8 || !ca_rd_skip(r, size))
    return 0;
  uint64_t v = 0;
  for (size_t i = 0; i < size; i++) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    v |= (uint64_t)p[i] << (8 * i);
#else
    v = (v << 8) | p[i];
#endif
  }
  return v;
}

/* DWARF's variable-length integers (LEB128): seven bits a byte, low bits
 * first, the high bit set on every byte but the last. The signed form
 * differs only in extending the last byte's sign bit, so both forms read
 * through one loop. A truncated number marks the reader bad and reads as 0. */
static inline uint64_t ca__rd_leb(ca_rd *r, bool is_signed) {
  uint64_t v = 0;
  unsigned shift = 0;
  while (ca_rd_left(r) > 0) {
    uint8_t b = *r->p++;
    if (shift < 64) {
      v |= (uint64_t)(b & 0x7f) << shift;
      shift += 7;
    }
    if (!(b & 0x80)) {
      if (is_signed && shift < 64 && (b & 0x40))
        v |= ~(uint64_t)0 << shift;
      return v;
    }
  }
  r->bad = true;
  return 0;
}

static inline uint64_t ca_rd_uleb(ca_rd *r) { return ca__rd_leb(r, false); }

static inline int64_t ca_rd_sleb(ca_rd *r) {
  return (int64_t)ca__rd_leb(r, true);
}

#endif /* CA_READER_H */
