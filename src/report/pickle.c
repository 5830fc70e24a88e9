/*
 * A pickle writer (protocol 2, what Python's pickle.load reads): dicts,
 * lists, tuples, strings, integers, booleans and None, with a memo for
 * objects written once and referred to again. Written through a buffer to
 * a file descriptor.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
typedef struct ca__pickle {
  int fd;
  bool failed; /* a write failed: the rest is dropped */
  size_t len;
  unsigned char buf[16384];
} ca__pickle;

static void ca__pk_flush(ca__pickle *p) {
  for (size_t at = 0; at < p->len && !p->failed;) {
    ssize_t w = write(p->fd, p->buf + at, p->len - at);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      p->failed = true;
    else
      at += (size_t)w;
  }
  p->len = 0;
}

static void ca__pk_bytes(ca__pickle *p, const void *data, size_t n) {
  const unsigned char *s = data;
  while (n > 0) {
    if (p->len == sizeof(p->buf))
      ca__pk_flush(p);
    size_t take = sizeof(p->buf) - p->len < n ? sizeof(p->buf) - p->len : n;
    memcpy(p->buf + p->len, s, take);
    p->len += take;
    s += take;
    n -= take;
  }
}

static void ca__pk_op(ca__pickle *p, unsigned char op) { ca__pk_bytes(p, &op, 1); }

static void ca__pk_u32(ca__pickle *p, uint32_t v) {
  unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                         (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  ca__pk_bytes(p, le, 4);
}

/* Opcodes of protocol 2 (Python's Lib/pickletools.py names them). */
#define CA__PK_PROTO 0x80
#define CA__PK_STOP '.'
#define CA__PK_MARK '('
#define CA__PK_DICT '}'
#define CA__PK_SETITEMS 'u'
#define CA__PK_LIST ']'
#define CA__PK_APPENDS 'e'
#define CA__PK_TUPLE 't'
#define CA__PK_STR 'X'
#define CA__PK_INT 'J'
#define CA__PK_LONG1 0x8a
#define CA__PK_TRUE 0x88
#define CA__PK_FALSE 0x89
#define CA__PK_NONE 'N'
#define CA__PK_PUT 'r'
#define CA__PK_GET 'j'

static void ca__pk_begin(ca__pickle *p, int fd) {
  p->fd = fd;
  p->failed = false;
  p->len = 0;
  unsigned char head[2] = {CA__PK_PROTO, 2};
  ca__pk_bytes(p, head, 2);
}

static bool ca__pk_end(ca__pickle *p) {
  ca__pk_op(p, CA__PK_STOP);
  ca__pk_flush(p);
  return !p->failed;
}

/* A string, as UTF-8: a byte of no printable character (a path's stray
 * byte, a control) becomes '?', which pickle.load would otherwise refuse. */
static void ca__pk_str(ca__pickle *p, const char *s) {
  size_t n = strlen(s);
  ca__pk_op(p, CA__PK_STR);
  ca__pk_u32(p, (uint32_t)n);
  while (n > 0) {
    size_t k = ca_log_printable(s, n);
    ca__pk_bytes(p, k ? s : "?", k ? k : 1);
    k = k ? k : 1;
    s += k;
    n -= k;
  }
}

/* A non-negative integer: 4 bytes while it fits a signed one, else the
 * fewest little-endian bytes with a clear top bit. */
static void ca__pk_uint(ca__pickle *p, uint64_t v) {
  if (v <= INT32_MAX) {
    ca__pk_op(p, CA__PK_INT);
    ca__pk_u32(p, (uint32_t)v);
    return;
  }
  unsigned char le[9];
  unsigned char n = 0;
  for (uint64_t x = v; x; x >>= 8)
    le[n++] = (unsigned char)x;
  if (le[n - 1] & 0x80)
    le[n++] = 0;
  unsigned char head[2] = {CA__PK_LONG1, n};
  ca__pk_bytes(p, head, 2);
  ca__pk_bytes(p, le, n);
}

static void ca__pk_int(ca__pickle *p, int v) {
  ca__pk_op(p, CA__PK_INT);
  ca__pk_u32(p, (uint32_t)v);
}

static void ca__pk_bool(ca__pickle *p, bool v) {
  ca__pk_op(p, v ? CA__PK_TRUE : CA__PK_FALSE);
}

/* A key and its value follow until ca__pk_close_dict. */
static void ca__pk_open_dict(ca__pickle *p) {
  ca__pk_op(p, CA__PK_DICT);
  ca__pk_op(p, CA__PK_MARK);
}

static void ca__pk_close_dict(ca__pickle *p) { ca__pk_op(p, CA__PK_SETITEMS); }

static void ca__pk_open_list(ca__pickle *p) {
  ca__pk_op(p, CA__PK_LIST);
  ca__pk_op(p, CA__PK_MARK);
}

static void ca__pk_close_list(ca__pickle *p) { ca__pk_op(p, CA__PK_APPENDS); }

/* The object just written, kept as memo entry `i`; put again by
 * ca__pk_get. */
static void ca__pk_put(ca__pickle *p, uint32_t i) {
  ca__pk_op(p, CA__PK_PUT);
  ca__pk_u32(p, i);
}

static void ca__pk_get(ca__pickle *p, uint32_t i) {
  ca__pk_op(p, CA__PK_GET);
  ca__pk_u32(p, i);
}
