/*
 * PyTorch's memory snapshot of a moment (report.h, oom_snapshot): the
 * pools' segments tiled with their blocks, and each device's trace of
 * allocations and frees, pickled as torch.cuda.memory._snapshot() returns
 * it, so that torch.cuda._memory_viz and pytorch.org/memory_viz read it.
 * A stack's frames are written once and recalled from the pickle's memo.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
typedef struct ca__snap {
  ca__pickle pk;
  const ca_report_snapshot *in;
  ca__symbols symbols;
  uint32_t *stacks; /* the distinct stack ids, sorted: memo entry = index */
  bool *written;    /* whether stack i's frames were written already */
  size_t nstacks, stacks_bytes, written_bytes;
} ca__snap;

static int ca__cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Every stack the snapshot names, sorted and distinct, symbolized in one
 * batch. False when scratch memory ran out. */
static bool ca__snap_stacks(ca__snap *s) {
  const ca_report_snapshot *in = s->in;
  size_t n = in->nblocks + in->nsteps, k = 0;
  s->stacks_bytes = (n ? n : 1) * sizeof(uint32_t);
  s->stacks = ca__scratch(s->stacks_bytes);
  if (s->stacks == NULL)
    return false;
  for (size_t i = 0; i < in->nblocks; i++)
    if (in->blocks[i].stack)
      s->stacks[k++] = in->blocks[i].stack;
  for (size_t i = 0; i < in->nsteps; i++)
    if (in->steps[i].stack)
      s->stacks[k++] = in->steps[i].stack;
  qsort(s->stacks, k, sizeof(uint32_t), ca__cmp_u32);
  size_t unique = 0;
  for (size_t i = 0; i < k; i++)
    if (unique == 0 || s->stacks[unique - 1] != s->stacks[i])
      s->stacks[unique++] = s->stacks[i];
  s->nstacks = unique;
  s->written_bytes = (unique ? unique : 1) * sizeof(bool);
  s->written = ca__scratch(s->written_bytes); /* zeroed: none written */
  if (s->written == NULL)
    return false;
  ca__symbolize_stacks(s->stacks, unique, &s->symbols);
  return true;
}

static void ca__snap_free(ca__snap *s) {
  ca__symbols_free(&s->symbols);
  ca__unscratch(s->stacks, s->stacks_bytes);
  ca__unscratch(s->written, s->written_bytes);
}

/* {"filename", "line", "name"}: a Python frame's file; a native one's
 * source file where known, else its object. */
static void ca__snap_frame(ca__pickle *p, const ca_symbol *sym) {
  const char *file = "??", *name = "??";
  unsigned line = 0;
  if (sym != NULL) {
    file = sym->file[0] ? sym->file
           : sym->module[0] ? ca__basename(sym->module) : "??";
    name = sym->function[0] ? sym->function : "??";
    line = sym->line;
  }
  ca__pk_open_dict(p);
  ca__pk_str(p, "filename");
  ca__pk_str(p, file);
  ca__pk_str(p, "line");
  ca__pk_uint(p, line);
  ca__pk_str(p, "name");
  ca__pk_str(p, name);
  ca__pk_close_dict(p);
}

/* A stack's frames, innermost first, the library's and the runtime's
 * folded away as the reports fold them. */
static void ca__snap_frames(ca__snap *s, uint32_t stack) {
  uint32_t *hit = stack ? bsearch(&stack, s->stacks, s->nstacks,
                                  sizeof(uint32_t), ca__cmp_u32)
                        : NULL;
  size_t i = hit ? (size_t)(hit - s->stacks) : 0;
  if (hit && s->written[i]) {
    ca__pk_get(&s->pk, (uint32_t)i);
    return;
  }
  ca__pk_open_list(&s->pk);
  const uintptr_t *pcs;
  size_t n = hit ? ca_stacks_get(stack, &pcs) : 0;
  for (size_t k = n ? ca__first_shown(pcs, n, &s->symbols) : 0; k < n; k++)
    ca__snap_frame(&s->pk, ca__symbol(&s->symbols, pcs[k]));
  ca__pk_close_list(&s->pk);
  if (hit) {
    ca__pk_put(&s->pk, (uint32_t)i);
    s->written[i] = true;
  }
}

static void ca__snap_block(ca__snap *s, uint64_t addr, uint64_t size,
                           uint64_t requested, const char *state,
                           uint32_t stack) {
  ca__pickle *p = &s->pk;
  ca__pk_open_dict(p);
  ca__pk_str(p, "address");
  ca__pk_uint(p, addr);
  ca__pk_str(p, "size");
  ca__pk_uint(p, size);
  ca__pk_str(p, "requested_size");
  ca__pk_uint(p, requested);
  ca__pk_str(p, "state");
  ca__pk_str(p, state);
  ca__pk_str(p, "frames");
  ca__snap_frames(s, stack);
  ca__pk_close_dict(p);
}

static const char *ca__snap_state(ca_report_block_state state) {
  return state == CA_SNAP_LIVE      ? "active_allocated"
         : state == CA_SNAP_PENDING ? "active_pending_free"
                                    : "inactive";
}

/* One segment of PyTorch's: [addr, addr + size) tiled by blocks b[0..n)
 * (in address order, inside it) and the inactive bytes between them. */
static void ca__snap_segment(ca__snap *s, uint64_t addr, uint64_t size,
                             const ca_report_seg_block *b, size_t n) {
  ca__pickle *p = &s->pk;
  uint64_t allocated = 0, active = 0, requested = 0;
  for (size_t i = 0; i < n; i++) {
    allocated += b[i].state == CA_SNAP_LIVE ? b[i].size : 0;
    active += b[i].state != CA_SNAP_FREE ? b[i].size : 0;
    requested += b[i].requested;
  }
  ca__pk_open_dict(p);
  ca__pk_str(p, "device");
  ca__pk_int(p, b[0].device);
  ca__pk_str(p, "address");
  ca__pk_uint(p, addr);
  ca__pk_str(p, "total_size");
  ca__pk_uint(p, size);
  ca__pk_str(p, "allocated_size");
  ca__pk_uint(p, allocated);
  ca__pk_str(p, "active_size");
  ca__pk_uint(p, active);
  ca__pk_str(p, "requested_size");
  ca__pk_uint(p, requested);
  ca__pk_str(p, "stream");
  ca__pk_uint(p, 0);
  ca__pk_str(p, "segment_type");
  ca__pk_str(p, size <= ((uint64_t)2 << 20) ? "small" : "large");
  ca__pk_str(p, "segment_pool_id");
  ca__pk_op(p, CA__PK_MARK);
  ca__pk_uint(p, 0);
  ca__pk_uint(p, 0);
  ca__pk_op(p, CA__PK_TUPLE);
  ca__pk_str(p, "is_expandable");
  ca__pk_bool(p, b[0].expandable);
  ca__pk_str(p, "frames");
  ca__snap_frames(s, 0);
  ca__pk_str(p, "blocks");
  ca__pk_open_list(p);
  uint64_t at = addr;
  for (size_t i = 0; i < n; i++) {
    if (b[i].addr > at)
      ca__snap_block(s, at, b[i].addr - at, 0, "inactive", 0);
    ca__snap_block(s, b[i].addr, b[i].size, b[i].requested,
                   ca__snap_state(b[i].state), b[i].stack);
    at = b[i].addr + b[i].size;
  }
  if (at < addr + size)
    ca__snap_block(s, at, addr + size - at, 0, "inactive", 0);
  ca__pk_close_list(p);
  ca__pk_close_dict(p);
}

/* The blocks of one pool segment, b[0..n): one segment of PyTorch's, or,
 * expandable, one for each run of mapped blocks (as PyTorch shows them). */
static void ca__snap_pool_segment(ca__snap *s, const ca_report_seg_block *b,
                                  size_t n) {
  if (!b[0].expandable) {
    ca__snap_segment(s, b[0].seg_addr, b[0].seg_size, b, n);
    return;
  }
  for (size_t i = 0; i < n;) {
    if (b[i].state == CA_SNAP_UNMAPPED) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < n && b[j].state != CA_SNAP_UNMAPPED)
      j++;
    ca__snap_segment(s, b[i].addr, b[j - 1].addr + b[j - 1].size - b[i].addr,
                     b + i, j - i);
    i = j;
  }
}

static void ca__snap_segments(ca__snap *s) {
  const ca_report_snapshot *in = s->in;
  ca__pk_open_list(&s->pk);
  for (size_t i = 0; i < in->nblocks;) {
    size_t j = i;
    while (j < in->nblocks && in->blocks[j].device == in->blocks[i].device &&
           in->blocks[j].seg_addr == in->blocks[i].seg_addr)
      j++;
    ca__snap_pool_segment(s, in->blocks + i, j - i);
    i = j;
  }
  ca__pk_close_list(&s->pk);
}

/* One entry of a device's trace. `free_bytes`: the oom entry's. */
static void ca__snap_entry(ca__snap *s, const char *action, uint64_t addr,
                           uint64_t size, uint64_t stream, uint64_t us,
                           uint32_t stack, const uint64_t *free_bytes) {
  ca__pickle *p = &s->pk;
  ca__pk_open_dict(p);
  ca__pk_str(p, "action");
  ca__pk_str(p, action);
  ca__pk_str(p, "addr");
  ca__pk_uint(p, addr);
  ca__pk_str(p, "size");
  ca__pk_uint(p, size);
  ca__pk_str(p, "stream");
  ca__pk_uint(p, stream);
  ca__pk_str(p, "time_us");
  ca__pk_uint(p, us);
  ca__pk_str(p, "frames");
  ca__snap_frames(s, stack);
  ca__pk_str(p, "compile_context");
  ca__pk_str(p, "");
  ca__pk_str(p, "user_metadata");
  ca__pk_str(p, "");
  if (free_bytes) {
    ca__pk_str(p, "device_free");
    ca__pk_uint(p, *free_bytes);
  }
  ca__pk_close_dict(p);
}

/* A list per device, up to the highest named: its allocations (alloc),
 * its frees (free_requested and free_completed at once: the program's
 * view), and the refused request last (oom). */
static void ca__snap_traces(ca__snap *s) {
  const ca_report_snapshot *in = s->in;
  int devices = in->oom_device + 1;
  for (size_t i = 0; i < in->nsteps; i++)
    devices = in->steps[i].device >= devices ? in->steps[i].device + 1 : devices;
  ca__pk_open_list(&s->pk);
  for (int d = 0; d < devices; d++) {
    ca__pk_open_list(&s->pk);
    for (size_t i = 0; i < in->nsteps; i++) {
      const ca_report_step *e = &in->steps[i];
      if (e->device != d)
        continue;
      if (e->alloc) {
        ca__snap_entry(s, "alloc", e->addr, e->bytes, e->stream, e->us, e->stack, NULL);
        continue;
      }
      ca__snap_entry(s, "free_requested", e->addr, e->bytes, e->stream, e->us, e->stack, NULL);
      ca__snap_entry(s, "free_completed", e->addr, e->bytes, e->stream, e->us, e->stack, NULL);
    }
    if (d == in->oom_device)
      ca__snap_entry(s, "oom", 0, in->oom_bytes, 0, in->oom_us, 0, &in->oom_free);
    ca__pk_close_list(&s->pk);
  }
  ca__pk_close_list(&s->pk);
}

static void ca__snap_write(ca__snap *s) {
  ca__pickle *p = &s->pk;
  ca__pk_open_dict(p);
  ca__pk_str(p, "segments");
  ca__snap_segments(s);
  ca__pk_str(p, "device_traces");
  ca__snap_traces(s);
  ca__pk_str(p, "allocator_settings");
  ca__pk_open_dict(p);
  ca__pk_str(p, "allocator");
  ca__pk_str(p, "cudalloc (oom_snapshot)");
  ca__pk_close_dict(p);
  ca__pk_str(p, "external_annotations");
  ca__pk_open_list(p);
  ca__pk_close_list(p);
  ca__pk_close_dict(p);
}

bool ca_report_torch_snapshot(const char *path, const ca_report_snapshot *in,
                              char *why, size_t len) {
  ca__snap *s = ca__scratch(sizeof(*s)); /* zeroed */
  if (s != NULL)
    s->in = in;
  if (s == NULL || !ca__snap_stacks(s)) {
    snprintf(why, len, "out of host memory");
    if (s != NULL)
      ca__snap_free(s);
    ca__unscratch(s, sizeof(*s));
    return false;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0;
  if (ok) {
    ca__pk_begin(&s->pk, fd);
    ca__snap_write(s);
    ok = ca__pk_end(&s->pk);
    ok = close(fd) == 0 && ok;
  }
  if (!ok)
    snprintf(why, len, "%s", strerror(errno));
  ca__snap_free(s);
  ca__unscratch(s, sizeof(*s));
  return ok;
}
