/*
 * Reading the calling thread's Python frames and merging them into its
 * native stack.
 *
 * Part of pyframes' one compilation unit (src/pyframes/pyframes.c includes
 * the files in order); not compiled alone.
 */
/* The most Python frames walked for one stack. */
#define CA__PY_WALK_MAX 256

#define CA__AT(p, off, type) (*(type const *)((const char *)(p) + (off)))

/* Whether p looks like a pointer to an object: aligned, and in the user
 * half of a 48-bit address space, above the first 64 KiB. */
static bool ca__plausible(const void *p) {
  uintptr_t v = (uintptr_t)p;
  return v >= 65536 && v < ((uintptr_t)1 << 47) && (v & 7) == 0;
}

/* A str object as UTF-8 into buf (room for CA__PY_NAME_MAX bytes and a
 * NUL): ASCII as is, its cached UTF-8 where it has one, Latin-1 converted;
 * anything else, or an object that is no compact string, as "?". */
static size_t ca__py_string(const ca__pyabi *abi, const void *s, char *buf) {
  size_t len = 0;
  if (ca__plausible(s)) {
    uint32_t state = CA__AT(s, 32, uint32_t);
    int64_t n = CA__AT(s, 16, int64_t);
    const uint8_t *src = NULL;
    bool latin1 = false;
    if ((state & 0x20) && (state & 0x40)) { /* compact ASCII */
      src = (const uint8_t *)s + abi->ascii_size;
    } else if (state & 0x20) { /* compact, not ASCII */
      const char *utf8 = CA__AT(s, abi->compact_utf8, const char *);
      if ((uintptr_t)utf8 >= 65536) {
        src = (const uint8_t *)utf8;
        n = CA__AT(s, abi->compact_utf8 - 8, int64_t); /* utf8_length */
      } else if (((state >> 2) & 7) == 1) {
        src = (const uint8_t *)s + abi->compact_size;
        latin1 = true;
      }
    }
    for (int64_t i = 0; src && i < n && len + 2 <= CA__PY_NAME_MAX; i++) {
      uint8_t c = src[i];
      if (latin1 && c >= 0x80) {
        buf[len++] = (char)(0xc0 | (c >> 6));
        buf[len++] = (char)(0x80 | (c & 0x3f));
      } else {
        buf[len++] = (char)c;
      }
    }
    if (src == NULL)
      buf[len++] = '?';
  }
  buf[len] = '\0';
  return len;
}

/* The line of instruction `at` of code object `code`. */
static unsigned ca__py_line(const ca__pyabi *abi, const void *code, long at) {
  const void *table = CA__AT(code, abi->co_linetable, const void *);
  int first = CA__AT(code, abi->co_firstlineno, int);
  if (!ca__plausible(table) || at < 0)
    return 0;
  const uint8_t *t = (const uint8_t *)table + 32; /* ob_sval */
  int64_t len = CA__AT(table, 16, int64_t);       /* ob_size */
  if (len < 0 || len > (1 << 24))
    return 0;
  int line = abi->lines == CA__LINES_LNOTAB   ? ca__line_lnotab(t, (size_t)len, first, at)
             : abi->lines == CA__LINES_PAIRS ? ca__line_pairs(t, (size_t)len, first, at)
                                              : ca__line_locations(t, (size_t)len, first, at);
  return line > 0 ? (unsigned)line : 0;
}

/* The code object of a frame, NULL when it is none (a shim, or not a
 * code object: the frame is not what we think). */
static const void *ca__frame_code(const ca__python *py, const void *frame) {
  const void *code = CA__AT(frame, py->abi->fr_code, const void *);
  return ca__plausible(code) && CA__AT(code, 8, const void *) == py->code_type ? code : NULL;
}

/* The instruction a frame is at: a byte offset (3.9), an index in code
 * units (3.10 on); -1 for a frame not started. */
static long ca__frame_at(const ca__pyabi *abi, const void *frame, const void *code) {
  if (abi->co_code < 0) {
    long lasti = CA__AT(frame, abi->fr_instr, int);
    return abi->lines == CA__LINES_PAIRS ? lasti * 2 : lasti;
  }
  const uint16_t *instr = CA__AT(frame, abi->fr_instr, const uint16_t *);
  const uint16_t *start = (const uint16_t *)((const char *)code + abi->co_code);
  return instr >= start ? (long)(instr - start) : -1;
}

/* The word for one frame: cached, or read and stored. 0 for none. */
static uintptr_t ca__frame_word(const ca__python *py, const void *frame) {
  const ca__pyabi *abi = py->abi;
  const void *code = ca__frame_code(py, frame);
  if (code == NULL)
    return 0;
  long at = ca__frame_at(abi, frame, code);
  if (at < 0)
    return 0;
  uintptr_t file = (uintptr_t)CA__AT(code, abi->co_filename, const void *);
  uintptr_t table = (uintptr_t)CA__AT(code, abi->co_linetable, const void *);
  uint32_t id = ca__py_cached((uintptr_t)code, file, table, at);
  if (id == 0) {
    ca__pyname n;
    n.file_len = ca__py_string(abi, (const void *)file, n.file);
    n.function_len = ca__py_string(abi, CA__AT(code, abi->co_name, const void *), n.function);
    n.line = ca__py_line(abi, code, at);
    if ((id = ca__py_intern(&n)) == 0)
      return 0;
    ca__py_cache_put((uintptr_t)code, file, table, at, id);
  }
  return CA_PY_TAG | id;
}

/* The thread's innermost Python frame, NULL when it runs none. */
static const void *ca__first_frame(const ca__python *py) {
  if (!py->is_initialized())
    return NULL;
  const void *ts = py->this_thread_state();
  if (!ca__plausible(ts))
    return NULL;
  const void *f = CA__AT(ts, py->abi->ts_frame, const void *);
  if (py->abi->cframe_current >= 0)
    f = ca__plausible(f) ? CA__AT(f, py->abi->cframe_current, const void *) : NULL;
  return ca__plausible(f) ? f : NULL;
}

/* A walk down the thread's frames. */
typedef struct ca__walk {
  const ca__python *py;
  const void *frame;
  int steps;
} ca__walk;

static const void *ca__next_frame(ca__walk *w) {
  const void *back = CA__AT(w->frame, w->py->abi->fr_back, const void *);
  return ++w->steps < CA__PY_WALK_MAX && ca__plausible(back) ? back : NULL;
}

/* Appends to out (up to *n < cap, and *left more: the walk stops there)
 * the frames one eval-loop invocation runs: one frame (3.9, 3.10), down to
 * the entry frame (3.11), down to the C-stack shim below them (3.12,
 * 3.13); `all` takes every frame left instead. */
static void ca__take_frames(ca__walk *w, uintptr_t *out, size_t *n, size_t cap,
                            size_t *left, bool all) {
  const ca__pyabi *abi = w->py->abi;
  while (w->frame != NULL && *n < cap && *left > 0) {
    const void *f = w->frame;
    if (abi->fr_owner >= 0 && CA__AT(f, abi->fr_owner, char) == CA__OWNED_BY_CSTACK) {
      w->frame = ca__next_frame(w);
      if (!all)
        return;
      continue;
    }
    uintptr_t word = ca__frame_word(w->py, f);
    if (word != 0) {
      out[(*n)++] = word;
      (*left)--;
    }
    bool entry = abi->fr_entry >= 0 && CA__AT(f, abi->fr_entry, char);
    w->frame = ca__next_frame(w);
    if (!all && (abi->frames == CA__FRAMES_OBJECT || entry))
      return;
  }
}

size_t ca_pyframes_merge(uintptr_t *pcs, size_t n, size_t cap, size_t py_max) {
  const ca__python *py = ca__python_get();
  if (py->minor == 0 || py_max == 0)
    return n;
  ca__walk w = {py, ca__first_frame(py), 0};
  if (w.frame == NULL)
    return n;
  uintptr_t native[CA_STACK_MAX_FRAMES];
  n = n < CA_STACK_MAX_FRAMES ? n : CA_STACK_MAX_FRAMES;
  memcpy(native, pcs, n * sizeof(pcs[0]));
  size_t out = 0, left = py_max;
  for (size_t i = 0; i < n && out < cap; i++) {
    if (native[i] > py->eval_lo && native[i] <= py->eval_hi)
      ca__take_frames(&w, pcs, &out, cap, &left, false);
    else
      pcs[out++] = native[i];
  }
  ca__take_frames(&w, pcs, &out, cap, &left, true);
  return out;
}
