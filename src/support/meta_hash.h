/*
 * uthash, as every table of the library uses it: its memory is the
 * library's own (meta.h), since the tables hold device addresses the leak
 * scan must not find, and a host out of memory never ends the program
 * (uthash's default is exit(-1)): a failed bucket expansion only makes
 * chains longer, and a failed first insertion leaves the element out,
 * which CA_HASH_ADDED tells. The only file that includes uthash.h
 * (tests/layers_test.py); a user may define HASH_FUNCTION and HASH_KEYCMP
 * before including it.
 */
#ifndef CA_META_HASH_H
#define CA_META_HASH_H

#include "support/meta.h"

#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) ca_meta_alloc(sz)
#define uthash_free(ptr, sz) ca_meta_free(ptr, sz)
#include <uthash.h>

/* Whether the HASH_ADD just made put `elt` in its table: uthash clears
 * the element's table pointer when it could not. */
#define CA_HASH_ADDED(elt) ((elt)->hh.tbl != NULL)

#endif /* CA_META_HASH_H */
