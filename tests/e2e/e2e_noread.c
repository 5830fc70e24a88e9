/*
 * libe2e_noread.so: preloaded before libcudalloc.so, it refuses what a
 * sandbox may refuse, process_vm_readv (EPERM) and opening /proc/self/mem
 * (EACCES), so that reach_test.py can check that a scan which cannot read
 * memory classes nothing as lost.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/uio.h>

__attribute__((visibility("default"))) ssize_t process_vm_readv(pid_t pid, const struct iovec *local, unsigned long nlocal,
                         const struct iovec *remote, unsigned long nremote,
                         unsigned long flags) {
  (void)pid, (void)local, (void)nlocal, (void)remote, (void)nremote, (void)flags;
  errno = EPERM;
  return -1;
}

__attribute__((visibility("default"))) int open(const char *path, int flags, ...) {
  static int (*real)(const char *, int, ...);
  mode_t mode = 0;
  if (flags & O_CREAT) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  if (strcmp(path, "/proc/self/mem") == 0) {
    errno = EACCES;
    return -1;
  }
  if (real == NULL)
    real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
  return real(path, flags, mode);
}
