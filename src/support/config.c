/*
 * CUDALLOC_CONF: the key table, its parser and its help text (see config.h).
 *
 * Nothing here allocates: the text is scanned in place as pointer+length
 * spans, numbers are converted by hand, and messages are formatted into stack
 * buffers by ca_log. Numbers are read without strtod because strtod follows
 * the program's locale, whose decimal separator may be ','.
 */
#include "support/config.h"

#include "support/group_region.h"
#include "support/log.h"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Read directly rather than through getenv so that no other library's
 * getenv (or its locking) runs inside a preload constructor. */
extern char **environ;

#define CA__ENV_NAME "CUDALLOC_CONF"

/* How a key's text becomes its value, and what type its field has. */
typedef enum ca__kind {
  CA__FRACTION, /* decimal strictly between 0 and 1, in a double */
  CA__MIB,      /* integer MiB in [min, max], stored in bytes in a uint64_t */
  CA__INT,      /* integer in [min, max] (never negative), in an int */
  CA__BOOL,     /* one of ca__bool_words, in a bool */
  CA__TEXT,     /* up to max bytes of text, in a char array */
  CA__NAME,     /* a name (group_region.h) of up to max bytes, likewise */
  CA__CHOICE,   /* one word of the row's choices, its index in an int */
} ca__kind;

/* A piece of the CUDALLOC_CONF text, which stays where it is. */
typedef struct ca__span {
  const char *p;
  size_t n;
} ca__span;

/* A value on its way into a field: `fraction` for CA__FRACTION, `text` for
 * CA__TEXT, `integer` (bytes for CA__MIB, the index for CA__CHOICE) for
 * every other kind. */
typedef union ca__value {
  double fraction;
  uint64_t integer;
  ca__span text;
} ca__value;

/* One row of the table: everything the parser and the help text need. */
typedef struct ca__key {
  const char *name;
  ca__kind kind;
  size_t offset;     /* where the field lives in ca_config */
  const char *const *choices; /* CA__CHOICE: the words, NULL-terminated */
  /* Accepted integers (MiB for CA__MIB); 0 as well when it is the default
   * (which then means off) though min is above it. */
  uint64_t min, max;
  ca__value def;     /* the default, in the field's units */
  const char *def_text;
  const char *accepted;
  const char *doc;
} ca__key;

/* The field's offset, checked at compile time to have type T: a row whose
 * kind and field disagree fails to build (negative array size) instead of
 * writing the wrong number of bytes. */
#define CA__OFFSET(field, T)                                                   \
  (offsetof(ca_config, field) +                                                \
   0 * sizeof(char[_Generic(((ca_config *)0)->field, T : 1, default : -1)]))

static const char *const ca__report_formats[] = {"text", "json", NULL};
/* What a boolean takes, in any case: each false word, then its true one. */
static const char *const ca__bool_words[] = {"0",   "1",  "false", "true",
                                             "off", "on", "no",    "yes",
                                             NULL};
#define CA__BOOL_ACCEPTED "0, 1, false, true, off, on, no or yes"
static const char *const ca__reuse_policies[] = {"safe", "immediate",
                                                 "device_sync", NULL};

#define CA__MIB_SHIFT 20
/* The most MiB whose byte count still fits in a uint64_t. */
#define CA__MIB_MAX (UINT64_MAX >> CA__MIB_SHIFT)

/* A row's kind in the table: the kind, the field's offset, its words and
 * the bounds of the number given, written together so that they match. A
 * text field is a char array, whose size bounds the text (NUL included); a
 * choice is stored as the index of its word in `words`. */
#define CA__AT_FRACTION(f, words, lo, hi)                                      \
  CA__FRACTION, CA__OFFSET(f, double), NULL, lo, hi
#define CA__AT_MIB(f, words, lo, hi) CA__MIB, CA__OFFSET(f, uint64_t), NULL, lo, hi
#define CA__AT_INT(f, words, lo, hi) CA__INT, CA__OFFSET(f, int), NULL, lo, hi
#define CA__AT_BOOL(f, words, lo, hi) CA__BOOL, CA__OFFSET(f, bool), NULL, lo, hi
#define CA__AT_TEXT(f, words, lo, hi)                                          \
  CA__TEXT, CA__OFFSET(f, char *), NULL, 0, sizeof(((ca_config *)0)->f) - 1
#define CA__AT_NAME(f, words, lo, hi)                                          \
  CA__NAME, CA__OFFSET(f, char *), NULL, 0, sizeof(((ca_config *)0)->f) - 1
#define CA__AT_CHOICE(f, words, lo, hi)                                        \
  CA__CHOICE, CA__OFFSET(f, int), words, lo, hi
/* A text key's default: unset. */
#define CA__NO_TEXT {.text = {"", 0}}
#define CA__KEY_ROW(field, key, kind, words, lo, hi, def, def_text, accepted, \
                    doc)                                                       \
  {#key, CA__AT_##kind(field, words, lo, hi), def, def_text, accepted, doc},

/* Every key: the rows of config.h. */
static const ca__key ca__keys[] = {CA_CONFIG_KEYS(CA__KEY_ROW)};

#define CA__NKEYS (sizeof(ca__keys) / sizeof(ca__keys[0]))

/* At most this much user text is echoed per field of a message, so that a
 * huge value cannot make a huge line. */
#define CA__ECHO_MAX 48

/* A row names its field by offset, so the field is written and read through
 * the type its kind stands for (CA__OFFSET checked that they agree). */
static void ca__store(ca_config *c, const ca__key *k, ca__value v) {
  char *field = (char *)c + k->offset;
  switch (k->kind) {
  case CA__FRACTION:
    *(double *)field = v.fraction;
    break;
  case CA__MIB:
    *(uint64_t *)field = v.integer;
    break;
  case CA__INT:
    *(int *)field = (int)v.integer;
    break;
  case CA__BOOL:
    *(bool *)field = v.integer != 0;
    break;
  case CA__TEXT:
  case CA__NAME:
    /* ca__parse_value has checked that the text fits. */
    memcpy(field, v.text.p, v.text.n);
    field[v.text.n] = '\0';
    break;
  case CA__CHOICE:
    *(int *)field = (int)v.integer;
    break;
  }
}

static ca__value ca__load(const ca_config *c, const ca__key *k) {
  const char *field = (const char *)c + k->offset;
  ca__value v = {.integer = 0};
  switch (k->kind) {
  case CA__FRACTION:
    v.fraction = *(const double *)field;
    break;
  case CA__MIB:
    v.integer = *(const uint64_t *)field;
    break;
  case CA__INT:
    v.integer = (uint64_t)*(const int *)field;
    break;
  case CA__BOOL:
    v.integer = *(const bool *)field;
    break;
  case CA__TEXT:
  case CA__NAME:
    v.text = (ca__span){field, strlen(field)};
    break;
  case CA__CHOICE:
    v.integer = (uint64_t)*(const int *)field;
    break;
  }
  return v;
}

void ca_config_defaults(ca_config *c) {
  memset(c, 0, sizeof(*c));
  for (size_t i = 0; i < CA__NKEYS; i++)
    ca__store(c, &ca__keys[i], ca__keys[i].def);
}

/* Writes a fraction as the parser leaves it, strictly inside (0,1), with up
 * to 9 decimals; clamped so that it never reads as 0 or 1. snprintf's %g is
 * not used because its decimal separator follows the program's locale. */
static void ca__format_fraction(double v, char *buf, size_t size) {
  double scaled = v * 1e9 + 0.5;
  uint64_t nano = !(scaled >= 1)         ? 1
                  : scaled >= 999999999 ? 999999999
                                        : (uint64_t)scaled;
  int decimals = 9;
  while (nano % 10 == 0) {
    nano /= 10;
    decimals--;
  }
  snprintf(buf, size, "0.%0*" PRIu64, decimals, nano);
}

/* Copies at most CA__ECHO_MAX bytes of user text into `out`, "..."
 * appended when the text was cut. (ca_log escapes what is not printable,
 * so the message stays one line.) */
static const char *ca__echo(ca__span s, char out[CA__ECHO_MAX + 4]) {
  size_t n = s.n < CA__ECHO_MAX ? s.n : CA__ECHO_MAX;
  memcpy(out, s.p, n);
  if (s.n > n)
    memcpy(out + n, "...", 4);
  else
    out[n] = '\0';
  return out;
}

/* Writes the key's value in *c as a message shows it: its default text when
 * it still has its default. */
static void ca__format_current(const ca_config *c, const ca__key *k, char *buf,
                               size_t size) {
  ca__value v = ca__load(c, k);
  if (k->kind == CA__FRACTION) {
    if (v.fraction == k->def.fraction)
      snprintf(buf, size, "%s", k->def_text);
    else
      ca__format_fraction(v.fraction, buf, size);
  } else if (k->kind == CA__TEXT || k->kind == CA__NAME) {
    /* The text is the user's: echoed like any user text. */
    char echo[CA__ECHO_MAX + 4];
    snprintf(buf, size, "%s", v.text.n ? ca__echo(v.text, echo) : k->def_text);
  } else if (k->kind == CA__CHOICE) {
    snprintf(buf, size, "%s", k->choices[v.integer]);
  } else if (v.integer == k->def.integer) {
    snprintf(buf, size, "%s", k->def_text);
  } else {
    uint64_t shown =
        k->kind == CA__MIB ? v.integer >> CA__MIB_SHIFT : v.integer;
    snprintf(buf, size, "%" PRIu64, shown);
  }
}

static bool ca__is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' ||
         ch == '\f';
}

static ca__span ca__trim(ca__span s) {
  while (s.n > 0 && ca__is_space(s.p[0])) {
    s.p++;
    s.n--;
  }
  while (s.n > 0 && ca__is_space(s.p[s.n - 1]))
    s.n--;
  return s;
}

static bool ca__span_is(ca__span s, const char *word) {
  return strlen(word) == s.n && memcmp(s.p, word, s.n) == 0;
}

/* Like ca__span_is, ignoring ASCII case without the locale's help. */
static bool ca__span_is_nocase(ca__span s, const char *word) {
  if (strlen(word) != s.n)
    return false;
  for (size_t i = 0; i < s.n; i++) {
    char ch = s.p[i];
    if (ch >= 'A' && ch <= 'Z')
      ch = (char)(ch - 'A' + 'a');
    if (ch != word[i])
      return false;
  }
  return true;
}

/* A decimal number as written: [-]digits[.digits], at least one digit. */
typedef struct ca__number {
  bool negative;
  bool has_dot;     /* written with a '.': integer keys refuse it */
  bool nonzero;     /* some digit is not 0: the number is not zero */
  uint64_t integer; /* the digits before any '.'; UINT64_MAX on overflow */
  double value;     /* the magnitude, sign left out */
} ca__number;

/* Returns m x 10^-scale. Each side is exact for the short numbers people
 * write, so their one division rounds correctly, like strtod. */
static double ca__scale(uint64_t m, long scale) {
  double p = 1;
  for (long i = 0; i < (scale < 0 ? -scale : scale) && p <= DBL_MAX; i++)
    p *= 10;
  return scale < 0 ? (double)m * p : (double)m / p;
}

static bool ca__scan_number(ca__span s, ca__number *num) {
  *num = (ca__number){.negative = false};
  size_t i = 0, digits = 0;
  uint64_t mantissa = 0; /* the first ~19 significant digits */
  long scale = 0;        /* value = mantissa x 10^-scale */
  if (s.n > 0 && s.p[0] == '-') {
    num->negative = true;
    i = 1;
  }
  for (; i < s.n; i++) {
    if (s.p[i] == '.' && !num->has_dot) {
      num->has_dot = true;
      continue;
    }
    if (s.p[i] < '0' || s.p[i] > '9')
      return false;
    unsigned d = (unsigned)(s.p[i] - '0');
    digits++;
    num->nonzero = num->nonzero || d != 0;
    if (!num->has_dot)
      num->integer = num->integer > (UINT64_MAX - d) / 10
                         ? UINT64_MAX
                         : num->integer * 10 + d;
    if (mantissa <= (UINT64_MAX - 9) / 10) {
      mantissa = mantissa * 10 + d;
      scale += num->has_dot;
    } else if (!num->has_dot) {
      scale--; /* A dropped integer digit still multiplies by ten. */
    }
  }
  num->value = ca__scale(mantissa, scale);
  return digits > 0;
}

/* A fraction is in (0,1) as written: no integer part, some digit not 0.
 * Its double may still round to 0 or 1 (0.99999999999999999999): it is
 * kept just inside. */
static const char *ca__parse_fraction(ca__span s, double *out) {
  ca__number num;
  if (!ca__scan_number(s, &num))
    return "is not a decimal number";
  if (num.negative || num.integer != 0 || !num.nonzero)
    return "is out of range";
  *out = num.value >= 1   ? 1.0 - DBL_EPSILON / 2 /* the largest below 1 */
         : num.value <= 0 ? DBL_TRUE_MIN
                          : num.value;
  return NULL;
}

/* Whether a span (of at most CA_CONFIG_NAME_MAX - 1 bytes) is a name. */
static bool ca__is_group_name(ca__span s) {
  char name[CA_CONFIG_NAME_MAX];
  memcpy(name, s.p, s.n);
  name[s.n] = '\0';
  return ca_group_name_ok(name);
}

/* Turns the value text of key `k` into *out. Returns NULL when accepted,
 * else the problem as the message words it (into `buf` when it needs
 * numbers). */
static const char *ca__parse_value(const ca__key *k, ca__span s,
                                   ca__value *out, char *buf, size_t size) {
  ca__number num;
  if (s.n == 0)
    return "has an empty value";
  if (k->kind == CA__TEXT || k->kind == CA__NAME) {
    if (s.n > k->max) {
      snprintf(buf, size, "is too long (%zu bytes; at most %" PRIu64 ")", s.n,
               k->max);
      return buf;
    }
    if (k->kind == CA__NAME && !ca__is_group_name(s))
      return "is not a name";
    out->text = s;
    return NULL;
  }
  const char *const *words =
      k->kind == CA__BOOL ? ca__bool_words : k->choices;
  for (uint64_t i = 0; words != NULL && words[i] != NULL; i++) {
    if (k->kind == CA__BOOL ? ca__span_is_nocase(s, words[i])
                            : ca__span_is(s, words[i])) {
      out->integer = k->kind == CA__BOOL ? i % 2 : i;
      return NULL;
    }
  }
  if (k->kind == CA__CHOICE)
    return "is not one of the choices";
  if (k->kind == CA__BOOL)
    return "is not a boolean";
  if (k->kind == CA__FRACTION)
    return ca__parse_fraction(s, &out->fraction);
  if (!ca__scan_number(s, &num))
    return "is not a decimal number";
  if (num.has_dot)
    return "is not an integer";
  bool off = num.integer == 0 && k->def.integer == 0;
  if (num.negative || (!off && num.integer < k->min) || num.integer > k->max)
    return "is out of range";
  out->integer =
      k->kind == CA__MIB ? num.integer << CA__MIB_SHIFT : num.integer;
  return NULL;
}

static const ca__key *ca__find_key(ca__span name) {
  for (size_t i = 0; i < CA__NKEYS; i++)
    if (ca__span_is(name, ca__keys[i].name))
      return &ca__keys[i];
  return NULL;
}

/* Writes "name, name, ..." of every key, cut with "..." should the table
 * outgrow the buffer. */
static void ca__known_keys(char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < CA__NKEYS; i++) {
    int n = snprintf(buf + len, size - len, "%s%s", i ? ", " : "",
                     ca__keys[i].name);
    if (n < 0 || (size_t)n >= size - len) {
      memcpy(buf + size - 4, "...", 4); /* Callers pass far more than 4. */
      return;
    }
    len += (size_t)n;
  }
}

static void ca__report_unknown(ca__span item, ca__span name, bool has_colon) {
  char known[512], item_echo[CA__ECHO_MAX + 4], name_echo[CA__ECHO_MAX + 4];
  ca__known_keys(known, sizeof(known));
  if (has_colon)
    ca_log(CA__ENV_NAME ": unknown key '%s' in '%s' (known keys: %s; help:1 "
                        "lists them)",
           ca__echo(name, name_echo), ca__echo(item, item_echo), known);
  else
    ca_log(CA__ENV_NAME ": '%s' is neither key:value nor a known key (known "
                        "keys: %s; help:1 lists them)",
           ca__echo(item, item_echo), known);
}

static void ca__report_value(const ca_config *c, const ca__key *k,
                             bool has_colon, ca__span value,
                             const char *problem) {
  char now[CA__ECHO_MAX + 4], value_echo[CA__ECHO_MAX + 4];
  ca__format_current(c, k, now, sizeof(now));
  ca_log(CA__ENV_NAME ": %s%s%s %s (accepted: %s); %s stays %s", k->name,
         has_colon ? ":" : "", ca__echo(value, value_echo), problem,
         k->accepted, k->name, now);
}

/* Applies one non-empty, trimmed item. Returns false when it is bad, after
 * one message if `say`. */
static bool ca__apply_item(ca_config *c, ca__span item, bool say) {
  const char *colon = memchr(item.p, ':', item.n);
  size_t name_len = colon ? (size_t)(colon - item.p) : item.n;
  ca__span name = ca__trim((ca__span){item.p, name_len});
  const ca__key *k = ca__find_key(name);
  if (!k) {
    if (say)
      ca__report_unknown(item, name, colon != NULL);
    return false;
  }
  if (!colon) {
    if (say)
      ca__report_value(c, k, false, (ca__span){"", 0}, "has no ':value'");
    return false;
  }
  ca__span value = ca__trim((ca__span){colon + 1, item.n - name_len - 1});
  ca__value v = {.text = {"", 0}};
  char why[96];
  const char *problem = ca__parse_value(k, value, &v, why, sizeof(why));
  if (problem) {
    if (say)
      ca__report_value(c, k, true, value, problem);
    return false;
  }
  ca__store(c, k, v);
  return true;
}

/* Bad items named one by one; the rest are counted in one line. */
#define CA__MAX_COMPLAINTS 5

int ca_config_parse(ca_config *c, const char *text) {
  int bad = 0;
  if (!text)
    return 0;
  for (const char *p = text;; p++) {
    size_t n = strcspn(p, ",");
    ca__span item = ca__trim((ca__span){p, n});
    if (item.n > 0 && !ca__apply_item(c, item, bad < CA__MAX_COMPLAINTS) &&
        bad < INT_MAX)
      bad++;
    p += n;
    if (*p == '\0')
      break;
  }
  /* A group shares memory_limit_mb: without one it has no cap. A bad item
   * like any other, named while there is room. */
  if (c->shared_limit[0] != '\0' && c->memory_limit == 0) {
    if (bad < CA__MAX_COMPLAINTS)
      ca_log(CA__ENV_NAME ": shared_limit:%s has no memory_limit_mb to share "
             "(accepted: a group name, with memory_limit_mb set: the group's "
             "cap per device); shared_limit stays (none)",
             c->shared_limit);
    c->shared_limit[0] = '\0';
    if (bad < INT_MAX)
      bad++;
  }
  if (bad > CA__MAX_COMPLAINTS)
    ca_log(CA__ENV_NAME ": ... and %d more bad items, ignored like those",
           bad - CA__MAX_COMPLAINTS);
  return bad;
}

static const char *ca__env(const char *name) {
  size_t len = strlen(name);
  for (char **e = environ; e && *e; e++)
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
      return *e + len + 1;
  return NULL;
}

ca_config ca_config_settings;
atomic_bool ca_config_ready; /* ca_config_settings is read */
static pthread_once_t ca__config_once = PTHREAD_ONCE_INIT;

static void ca__config_read(void) {
  ca_config_defaults(&ca_config_settings);
  ca_config_parse(&ca_config_settings, ca__env(CA__ENV_NAME));
  /* Complaints about the settings themselves went to stderr: the log file
   * could not be known before they were read. */
  ca_log_set_path(ca_config_settings.log_path);
  if (ca_config_settings.help)
    ca_config_print_help();
  atomic_store_explicit(&ca_config_ready, true, memory_order_release);
}

const ca_config *ca_config_load(void) {
  pthread_once(&ca__config_once, ca__config_read);
  return &ca_config_settings;
}

/* Set, the settings are read as the library loads, so that help:1 and a
 * bad item speak in a process that never reaches CUDA (`cudalloc run --
 * true` printed nothing); valid ones say nothing. Unset, there is nothing
 * to report, and nothing is read before the library needs it. */
__attribute__((constructor)) static void ca__config_at_load(void) {
  if (ca__env(CA__ENV_NAME) != NULL)
    (void)ca_config_get();
}

static int ca__width(size_t len, int widest) {
  return (int)len > widest ? (int)len : widest;
}

/* A row's meaning as help:1 prints it: its Markdown without the marks. */
static void ca__plain(const char *md, char *out, size_t size) {
  size_t n = 0;
  for (; *md && n + 1 < size; md++)
    if (*md != '`' && *md != '*')
      out[n++] = *md;
  out[n] = '\0';
}

void ca_config_print_help(void) {
  int name_w = 0, def_w = 0, acc_w = 0;
  for (size_t i = 0; i < CA__NKEYS; i++) {
    name_w = ca__width(strlen(ca__keys[i].name), name_w);
    def_w = ca__width(strlen(ca__keys[i].def_text), def_w);
    acc_w = ca__width(strlen(ca__keys[i].accepted), acc_w);
  }
  ca_log(CA__ENV_NAME "=key:value,key:value,... (e.g. " CA__ENV_NAME
                      "=garbage_collection_threshold:0.8,max_split_size_mb:128)"
                      "; keys, with default, accepted values and meaning:");
  for (size_t i = 0; i < CA__NKEYS; i++) {
    char doc[768];
    ca__plain(ca__keys[i].doc, doc, sizeof(doc));
    ca_log("  %-*s  %-*s  %-*s  %s", name_w, ca__keys[i].name, def_w,
           ca__keys[i].def_text, acc_w, ca__keys[i].accepted, doc);
  }
}

bool ca_config_doc_row(size_t i, char *buf, size_t size) {
  if (i >= CA__NKEYS)
    return false;
  const ca__key *k = &ca__keys[i];
  snprintf(buf, size, "| `%s` | %s | %s | %s |", k->name, k->def_text,
           k->accepted, k->doc);
  return true;
}
