/*
 * Suppressions: the file's leak:<pattern> rules, read without blocking,
 * and matching them against a group's frames.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* ---- Suppressions ------------------------------------------------------- */

typedef struct ca__rules {
  char *text; /* the file, NUL-terminated, patterns cut in place */
  size_t text_bytes;
  const char *pattern[CA__MAX_RULES];
  size_t n;
} ca__rules;

static char *ca__rule_trim(char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\r')
    s++;
  char *end = s + strlen(s);
  while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
    *--end = '\0';
  return s;
}

/* Bad lines of a suppressions file named one by one; the rest counted. */
#define CA__MAX_RULE_WARNINGS 5

static void ca__parse_rules(ca__rules *r, const char *path, bool json) {
  size_t line_no = 0, dropped = 0, bad = 0;
  for (char *line = r->text; line != NULL;) {
    char *next = strchr(line, '\n');
    if (next != NULL)
      *next++ = '\0';
    line_no++;
    char *t = ca__rule_trim(line);
    if (t[0] != '\0' && t[0] != '#') {
      char *pattern = ca__starts(t, "leak:") ? ca__rule_trim(t + 5) : NULL;
      if (pattern != NULL && pattern[0] != '\0' && r->n < CA__MAX_RULES)
        r->pattern[r->n++] = pattern;
      else if (pattern != NULL && pattern[0] != '\0')
        dropped++;
      else if (++bad <= CA__MAX_RULE_WARNINGS)
        ca__report_warn(json,
                        "suppressions: %s:%zu: '%.60s' ignored (expected "
                        "leak:<pattern>)",
                        path, line_no, t);
    }
    line = next;
  }
  if (bad > CA__MAX_RULE_WARNINGS)
    ca__report_warn(json,
                    "suppressions: %s: ... and %zu more bad lines ignored",
                    path, bad - CA__MAX_RULE_WARNINGS);
  if (dropped > 0)
    ca__report_warn(json,
                    "suppressions: %s: only the first %d rules are used; "
                    "%zu more ignored",
                    path, CA__MAX_RULES, dropped);
}

/* Reads the suppressions file, if one is configured. Opening never blocks
 * (a FIFO with no writer) and only a regular file is read. */
static void ca__load_rules(ca__rules *r, const char *path, bool json) {
  *r = (ca__rules){0};
  if (path[0] == '\0')
    return;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  struct stat st;
  const char *why = fd < 0 || fstat(fd, &st) != 0 ? strerror(errno)
                    : !S_ISREG(st.st_mode)
                        ? "not a regular file (a FIFO, a device, a socket "
                          "or a directory)"
                        : NULL;
  if (why != NULL) {
    ca__report_warn(json,
                    "suppressions: cannot read '%s': %s; no leak is "
                    "suppressed",
                    path, why);
    if (fd >= 0)
      close(fd);
    return;
  }
  size_t size = st.st_size > (off_t)CA__MAX_RULES_FILE ? CA__MAX_RULES_FILE
                                                       : (size_t)st.st_size;
  if (size < (size_t)st.st_size)
    ca__report_warn(json, "suppressions: %s: only the first %u bytes are read",
                    path, CA__MAX_RULES_FILE);
  r->text_bytes = size + 1;
  r->text = ca__scratch(r->text_bytes); /* zero-filled: NUL-terminated */
  size_t got = 0;
  while (r->text != NULL && got < size) {
    ssize_t k = read(fd, r->text + got, size - got);
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  if (r->text != NULL)
    ca__parse_rules(r, path, json);
}

/* Whether text[0..] matches glob p[0..pn) ('*' = any run) as a whole. */
static bool ca__glob(const char *p, size_t pn, const char *text) {
  size_t pi = 0, star = SIZE_MAX;
  const char *t = text, *star_t = NULL;
  while (*t) {
    if (pi < pn && p[pi] == '*') {
      star = pi++;
      star_t = t;
    } else if (pi < pn && p[pi] == *t) {
      pi++;
      t++;
    } else if (star != SIZE_MAX) {
      pi = star + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (pi < pn && p[pi] == '*')
    pi++;
  return pi == pn;
}

/* A pattern matches anywhere in the name unless anchored by ^ or $. */
static bool ca__rule_matches(const char *pattern, const char *name) {
  if (name[0] == '\0')
    return false;
  char glob[512];
  size_t n = 0, len = strlen(pattern);
  bool head = pattern[0] == '^', tail = len > 0 && pattern[len - 1] == '$';
  const char *from = pattern + head, *to = pattern + len - tail;
  if (to < from || (size_t)(to - from) + 2 >= sizeof(glob))
    return false;
  if (!head)
    glob[n++] = '*';
  memcpy(glob + n, from, (size_t)(to - from));
  n += (size_t)(to - from);
  if (!tail)
    glob[n++] = '*';
  return ca__glob(glob, n, name);
}

/* Whether any rule matches a function or module of any frame. */
static bool ca__suppressed(const ca__rules *r, const uintptr_t *pcs, size_t n,
                           const ca__symbols *s) {
  for (size_t i = 0; i < n; i++) {
    const ca_symbol *sym = ca__symbol(s, pcs[i]);
    if (sym == NULL)
      continue;
    for (size_t k = 0; k < r->n; k++)
      if (ca__rule_matches(r->pattern[k], sym->function) ||
          ca__rule_matches(r->pattern[k], sym->module))
        return true;
  }
  return false;
}
