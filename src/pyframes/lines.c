/*
 * From an instruction to its line: the three table formats CPython has
 * used, each read only within the bytes object's own length.
 *
 * Part of pyframes' one compilation unit (src/pyframes/pyframes.c includes
 * the files in order); not compiled alone.
 */

/* 3.9's co_lnotab: pairs (bytes of code, signed lines) from the first line;
 * `at` is the instruction's byte offset. */
static int ca__line_lnotab(const uint8_t *t, size_t len, int first, long at) {
  long addr = 0;
  int line = first;
  for (size_t i = 0; i + 1 < len; i += 2) {
    addr += t[i];
    if (addr > at)
      break;
    line += (int8_t)t[i + 1];
  }
  return line;
}

/* 3.10's co_linetable: ranges of t[i] bytes of code, each with the line
 * changed by the signed t[i+1] (-128: a range with no line); `at` is the
 * instruction's byte offset. */
static int ca__line_pairs(const uint8_t *t, size_t len, int first, long at) {
  long end = 0;
  int line = first;
  for (size_t i = 0; i + 1 < len; i += 2) {
    long start = end;
    end += t[i];
    int8_t delta = (int8_t)t[i + 1];
    if (delta != -128)
      line += delta;
    if (start <= at && at < end)
      return delta == -128 ? 0 : line;
  }
  return 0;
}

/* A location table varint: 6-bit groups, least significant first, bit 6
 * set on all but the last. Stops at the table's end. */
static unsigned ca__varint(const uint8_t *t, size_t len, size_t *i) {
  unsigned v = 0, shift = 0;
  while (*i < len && shift < 32) {
    uint8_t b = t[(*i)++];
    v |= (unsigned)(b & 63) << shift;
    shift += 6;
    if (!(b & 64))
      break;
  }
  return v;
}

static int ca__svarint(const uint8_t *t, size_t len, size_t *i) {
  unsigned v = ca__varint(t, len, i);
  return (v & 1) ? -(int)(v >> 1) : (int)(v >> 1);
}

/* 3.11 on: entries of one header byte (bit 7 set; bits 3-6 the kind; bits
 * 0-2 the code units covered, less one) and their operands; `at` is the
 * instruction's index in code units. */
static int ca__line_locations(const uint8_t *t, size_t len, int first, long at) {
  long unit = 0;
  int line = first;
  size_t i = 0;
  while (i < len) {
    uint8_t head = t[i++];
    if (!(head & 0x80))
      return 0; /* not at an entry: the table is not what we think */
    int kind = (head >> 3) & 15, delta = 0;
    bool none = false;
    if (kind == 15) {
      none = true;
    } else if (kind == 14) {
      delta = ca__svarint(t, len, &i);
      for (int k = 0; k < 3; k++)
        ca__varint(t, len, &i); /* end line, columns */
    } else if (kind == 13) {
      delta = ca__svarint(t, len, &i);
    } else if (kind >= 10) {
      delta = kind - 10;
      i += 2; /* columns */
    } else {
      i += 1; /* column */
    }
    line += delta;
    unit += (head & 7) + 1;
    if (at < unit)
      return none ? 0 : line;
  }
  return 0;
}
