/*
 * Set-up that calls into the dynamic loader (dlopen, dlsym, dladdr,
 * dl_iterate_phdr), done without holding any lock of ours.
 *
 * The loader's own lock is held by a thread inside dlopen while the new
 * object's constructors run, and a constructor may call a hooked driver
 * function. A pthread_once around the set-up would then deadlock: one
 * thread inside the once waiting for the loader's lock, the other holding
 * that lock and waiting for the once. So each thread that finds the set-up
 * undone does it into a copy of its own, and the first to finish publishes
 * its copy; later threads take the published one. The set-up must give the
 * same answer whoever does it, and be cheap enough to be done twice now and
 * then.
 */
#ifndef CA_LAZY_H
#define CA_LAZY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ca_lazy {
  _Atomic(const void *) published;
  atomic_bool fallback_taken;
} ca_lazy;

#define CA_LAZY_INIT {NULL, false}

/* The published copy, or NULL when no thread has published yet. */
static inline const void *ca_lazy_get(ca_lazy *l) {
  return atomic_load_explicit(&l->published, memory_order_acquire);
}

/* Publishes a copy of the `size` bytes at `mine`, unless another thread
 * published first, and returns the published copy. The copy is malloc'd;
 * when the host is out of memory it is `fallback` (a static buffer of
 * `size` bytes, written at most once). Never NULL. */
const void *ca_lazy_publish(ca_lazy *l, const void *mine, size_t size,
                            void *fallback);

/* The published `type`, or one made now by build(&mine) (a function that
 * fills a `type`) and published: every lazy set-up is this. */
#define CA_LAZY_ONCE(lazy, type, build, fallback)                              \
  ({                                                                           \
    const type *ca_lazy_p_ = ca_lazy_get(lazy);                                \
    if (ca_lazy_p_ == NULL) {                                                  \
      type ca_lazy_mine_;                                                      \
      build(&ca_lazy_mine_);                                                   \
      ca_lazy_p_ = ca_lazy_publish(lazy, &ca_lazy_mine_, sizeof(type),         \
                                   fallback);                                  \
    }                                                                          \
    ca_lazy_p_;                                                                \
  })

#endif /* CA_LAZY_H */
