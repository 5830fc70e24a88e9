/*
 * Output that never allocates (see log.h).
 *
 * The library writes only to files it chose: stderr as it was when the
 * library was loaded, or the log_path file it opened. A descriptor number
 * is not a file: a program that closes its descriptors (daemons do) and
 * opens files of its own gets the same numbers back, so every write first
 * checks that the descriptor still is that file (device and inode), and a
 * log file that is no longer there is opened again. Nothing it writes can
 * raise SIGPIPE in the program.
 */
#include "support/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "support/fork.h"
#include "support/lock.h"

/* A place lines go: a descriptor and the file it was when chosen. */
typedef struct ca__sink {
  int fd;
  bool valid; /* open, and its identity below recorded */
  dev_t dev;
  ino_t ino;
} ca__sink;

/* Under ca__log_lock. The standard descriptors as they were at load (or as
 * ca_log_set_fd set them); the log_path file of process `file_pid`. */
static ca__sink ca__std[3];
static int ca__target = 2; /* which of ca__std, with no log_path */
static const char *ca__template;
static ca__sink ca__file;
static int ca__file_pid;
static bool ca__file_failed; /* this process could not open it: said once */
static ca_lock ca__log_lock = CA_LOCK_INIT;

static ca__sink ca__sink_of(int fd) {
  struct stat st;
  ca__sink s = {.fd = fd};
  if (fd >= 0 && fstat(fd, &st) == 0) {
    s.valid = true;
    s.dev = st.st_dev;
    s.ino = st.st_ino;
  }
  return s;
}

/* Whether the sink's descriptor still is the file it was when chosen. */
static bool ca__still(const ca__sink *s) {
  ca__sink now = ca__sink_of(s->fd);
  return s->valid && now.valid && now.dev == s->dev && now.ino == s->ino;
}

/* The standard descriptors as the program starts: what "stderr" means to
 * the library from then on. A forked child keeps them. */
__attribute__((constructor)) static void ca__log_load(void) {
  for (int fd = 1; fd <= 2; fd++)
    ca__std[fd] = ca__sink_of(fd);
}

/* A forked child may have been forked while another thread wrote. */
static void ca__log_child(void) { atomic_store(&ca__log_lock.state, 0); }

static const ca_fork_handlers ca__log_fork = {.child = ca__log_child};

void ca_log_set_fd(int fd) {
  ca_fork_register(CA_FORK_LOG, &ca__log_fork);
  ca_lock_acquire(&ca__log_lock);
  ca__template = NULL;
  ca__target = fd == 1 ? 1 : 2;
  ca__std[ca__target] = ca__sink_of(fd);
  ca_lock_release(&ca__log_lock);
}

void ca_log_set_path(const char *path_template) {
  ca_fork_register(CA_FORK_LOG, &ca__log_fork);
  ca_lock_acquire(&ca__log_lock);
  bool none = path_template == NULL || path_template[0] == '\0';
  ca__target = !none && strcmp(path_template, "stdout") == 0 ? 1 : 2;
  ca__template = none || strcmp(path_template, "stderr") == 0 ||
                         strcmp(path_template, "stdout") == 0
                     ? NULL
                     : path_template;
  ca__file = (ca__sink){.fd = -1};
  ca__file_pid = 0;
  ca__file_failed = false;
  ca_lock_release(&ca__log_lock);
}

bool ca_log_expand_path(const char *template, int pid, char *out,
                        size_t size) {
  size_t len = 0;
  for (const char *p = template; *p; p++) {
    char num[16];
    const char *piece = p;
    size_t n = 1;
    if (p[0] == '%' && p[1] == 'p') {
      n = (size_t)snprintf(num, sizeof(num), "%d", pid);
      piece = num;
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      p++;
    }
    if (len + n >= size)
      return false;
    memcpy(out + len, piece, n);
    len += n;
  }
  out[len] = '\0';
  return true;
}

/* A standard descriptor that is no longer the file it was at load: the
 * program re-pointed it, or closed it and got the number back for a file of
 * its own. Still an output channel when it is no regular file (a pipe, a
 * terminal, a socket, /dev/null) or a regular file opened to append (a log
 * the program redirected to); a file opened otherwise is the program's
 * data, and gets nothing. */
static bool ca__output_channel(int fd) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    return false;
  if (!S_ISREG(st.st_mode))
    return true;
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_APPEND) && (flags & O_ACCMODE) != O_RDONLY;
}

/* Under the lock: the standard descriptor lines go to, or -1 for none. */
static int ca__std_fd(void) {
  ca__sink *s = &ca__std[ca__target];
  if (ca__still(s))
    return s->fd;
  return ca__output_channel(s->fd) ? s->fd : -1;
}

/* Why a log file cannot be ours, or NULL when fd (just opened) can be: a
 * regular file of this user. */
static const char *ca__refuse_file(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return strerror(errno);
  if (!S_ISREG(st.st_mode))
    return "not a regular file (a FIFO, a device, a socket or a directory)";
  if (st.st_uid != geteuid())
    return "it belongs to another user";
  return NULL;
}

static const char *ca__open_error(int err) {
  if (err == ELOOP)
    return "it is a symbolic link, which is not followed";
  if (err == ENXIO)
    return "not a regular file (a FIFO with no reader)";
  return strerror(err);
}

static void ca__write_all(int fd, const char *buf, size_t len);
static size_t ca__format_line(char line[1024], const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Under the lock: opens this process's log file, safely. Never blocks (a
 * FIFO with no reader), never follows a symbolic link at the last
 * component (one planted in a shared directory under a predictable name),
 * never writes into a file of another user or one that is not a regular
 * file; creates it readable by its owner only. On failure says why once,
 * on stderr. */
static void ca__open_file(int pid) {
  char path[4096];
  const char *why = "the path is too long (at most 4095 bytes with %p "
                    "expanded)";
  int fd = -1;
  ca__file = (ca__sink){.fd = -1};
  ca__file_pid = pid;
  if (ca_log_expand_path(ca__template, pid, path, sizeof(path))) {
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW |
                        O_NONBLOCK | O_NOCTTY,
              0600);
    why = fd < 0 ? ca__open_error(errno) : ca__refuse_file(fd);
  }
  if (why == NULL) {
    ca__file = ca__sink_of(fd);
    return;
  }
  if (fd >= 0)
    close(fd);
  if (!ca__file_failed) {
    ca__file_failed = true;
    char line[1024];
    size_t n = ca__format_line(line, "log_path: cannot write to '%.300s': "
                                     "%s; writing to stderr instead",
                               ca__template, why);
    ca__write_all(ca__std_fd(), line, n);
  }
}

/* Under the lock: the descriptor this line goes to, or -1 for none. */
static int ca__fd_now(void) {
  if (ca__template != NULL) {
    int pid = (int)getpid();
    if (pid != ca__file_pid || (ca__file.valid && !ca__still(&ca__file)))
      ca__open_file(pid); /* a new process, or the program took the number */
    if (ca__file.valid)
      return ca__file.fd;
  }
  return ca__std_fd();
}

/* write(2) with SIGPIPE blocked in this thread: a reader that went away
 * (prog | head, a dead log collector) gives EPIPE here, not a signal that
 * ends the program; a SIGPIPE this write raised is taken back. */
static ssize_t ca__write_quietly(int fd, const char *buf, size_t len) {
  sigset_t pipe_only, old, pending;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  sigpending(&pending);
  bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  ssize_t n = write(fd, buf, len);
  if (n < 0 && errno == EPIPE && !was_pending) {
    int saved = errno;
    struct timespec zero = {0, 0};
    sigtimedwait(&pipe_only, NULL, &zero);
    errno = saved;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return n;
}

/* Writes all of buf to fd (nothing for -1), retrying short writes. */
static void ca__write_all(int fd, const char *buf, size_t len) {
  while (fd >= 0 && len > 0) {
    ssize_t n = ca__write_quietly(fd, buf, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; /* Nowhere to report a failed report: drop it. */
    buf += n;
    len -= (size_t)n;
  }
}

void ca_log_raw(const char *buf, size_t len) {
  ca_lock_acquire(&ca__log_lock);
  ca__write_all(ca__fd_now(), buf, len);
  ca_lock_release(&ca__log_lock);
}

size_t ca_log_printable(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  if (n == 0 || u[0] < 0x20 || u[0] == 0x7f)
    return 0;
  if (u[0] < 0x80)
    return 1;
  /* The length a lead byte announces, and the least code point that
   * length may carry (shorter forms are overlong). */
  size_t len = u[0] >= 0xc2 && u[0] <= 0xdf   ? 2
               : u[0] >= 0xe0 && u[0] <= 0xef ? 3
               : u[0] >= 0xf0 && u[0] <= 0xf4 ? 4
                                              : 0;
  if (len == 0 || len > n)
    return 0;
  uint32_t cp = u[0] & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if ((u[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (u[i] & 0x3f);
  }
  static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  bool c1 = cp < 0xa0; /* U+0080..U+009F, the C1 controls */
  bool bad = cp < least[len] || (cp >= 0xd800 && cp <= 0xdfff) ||
             cp > 0x10ffff;
  return c1 || bad ? 0 : len;
}

/* Copies text[0..len) into out (of `cap` bytes) with each byte that is not
 * part of a printable character (ca_log_printable) written as its \xHH
 * escape: whatever bytes a message echoes (the user's settings, a file's
 * lines, a binary's symbol names), what the library prints is one line,
 * and no byte of it can drive a terminal. Returns the length written (cut
 * at `cap`, never inside an escape or a character). */
static size_t ca__escape(const char *text, size_t len, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t k = ca_log_printable(text + i, len - i);
    if (o + (k ? k : 4) > cap)
      break;
    if (k) {
      memcpy(out + o, text + i, k);
      o += k;
      i += k;
      continue;
    }
    unsigned char ch = (unsigned char)text[i++];
    out[o++] = '\\';
    out[o++] = 'x';
    out[o++] = hex[ch >> 4];
    out[o++] = hex[ch & 15];
  }
  return o;
}

/* One line as ca_log prints it, into line: the prefix, the text escaped,
 * a newline. Returns its length. */
static size_t ca__format_vline(char line[1024], const char *fmt,
                               va_list ap) {
  char text[1024];
  int n = vsnprintf(text, sizeof(text), fmt, ap);
  size_t len = n < 0 ? 0 : (size_t)n < sizeof(text) ? (size_t)n
                                                       : sizeof(text) - 1;
  size_t prefix = sizeof(CA_LOG_PREFIX) - 1;
  memcpy(line, CA_LOG_PREFIX, prefix);
  len = prefix + ca__escape(text, len, line + prefix, 1024 - prefix - 1);
  line[len++] = '\n';
  return len;
}

static size_t ca__format_line(char line[1024], const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t len = ca__format_vline(line, fmt, ap);
  va_end(ap);
  return len;
}

void ca_logv(const char *fmt, va_list ap) {
  char line[1024];
  size_t len = ca__format_vline(line, fmt, ap);
  ca_log_raw(line, len);
}

void ca_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ca_logv(fmt, ap);
  va_end(ap);
}

void ca_format_bytes(char *buf, size_t len, uint64_t bytes) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", bytes);
    return;
  }
  double v = (double)bytes / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, len, "%.1f %s", v, units[u]);
}
