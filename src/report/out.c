/*
 * Output: scratch memory from mmap, and writes gathered into a few KiB
 * (JSON strings escaped).
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* ---- Scratch memory ------------------------------------------------------ */

/* Scratch comes from mmap: the report runs at exit, where the program's
 * malloc may be in any state (a profiler's, torn down, or the one that
 * leaked), and must not be made to hold our garbage either. */
static void *ca__scratch(size_t bytes) {
  if (bytes == 0)
    bytes = 1;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void ca__unscratch(void *p, size_t bytes) {
  if (p != NULL)
    munmap(p, bytes ? bytes : 1);
}

/* ---- Output ------------------------------------------------------------- */

/* Unprefixed output (JSON), gathered into writes of a few KiB. */
typedef struct ca__out {
  size_t len;
  char buf[8192];
} ca__out;

static void ca__flush(ca__out *o) {
  ca_log_raw(o->buf, o->len);
  o->len = 0;
}

static void ca__out_put(ca__out *o, const char *s, size_t n) {
  while (n > 0) {
    if (o->len == sizeof(o->buf))
      ca__flush(o);
    size_t room = sizeof(o->buf) - o->len;
    size_t take = n < room ? n : room;
    memcpy(o->buf + o->len, s, take);
    o->len += take;
    s += take;
    n -= take;
  }
}

static void ca__printf(ca__out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ca__printf(ca__out *o, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n > 0)
    ca__out_put(o, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* A JSON string, or null for NULL and "". */
static void ca__put_json_string(ca__out *o, const char *s) {
  if (s == NULL || s[0] == '\0') {
    ca__out_put(o, "null", 4);
    return;
  }
  ca__out_put(o, "\"", 1);
  for (size_t left = strlen(s); left > 0;) {
    unsigned char ch = (unsigned char)*s;
    size_t k = ca_log_printable(s, left);
    if (ch == '"' || ch == '\\') {
      char esc[2] = {'\\', (char)ch};
      ca__out_put(o, esc, 2);
    } else if (k > 0) {
      ca__out_put(o, s, k);
    } else {
      /* A control, or a byte of no UTF-8 character: as the code point of
       * the same number, so that the document stays valid JSON. */
      ca__printf(o, "\\u%04x", ch);
    }
    k = k ? k : 1;
    s += k;
    left -= k;
  }
  ca__out_put(o, "\"", 1);
}

/* Opens a JSON document with the fields every one of ours starts with, so
 * that tools can tell them apart from other lines and from each other. */
static void ca__json_begin(ca__out *o, const char *event) {
  o->len = 0;
  ca__printf(o,
             "{\"tool\":\"cudalloc\",\"version\":\"" CA__VERSION
             "\",\"pid\":%d,\"event\":\"%s\"",
             (int)getpid(), event);
}

/* A problem found while reporting (a bad suppressions line, say): a line
 * of its own, as JSON when the report is JSON, so that a log file of JSON
 * documents stays one document per line. */
static void ca__report_warn(bool json, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ca__report_warn(bool json, const char *fmt, ...) {
  char message[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof(message), fmt, ap);
  va_end(ap);
  if (!json) {
    ca_log("%s", message);
    return;
  }
  ca__out o;
  ca__json_begin(&o, "warning");
  ca__out_put(&o, ",\"message\":", 11);
  ca__put_json_string(&o, message);
  ca__out_put(&o, "}\n", 2);
  ca__flush(&o);
}
