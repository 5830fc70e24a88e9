/*
 * What site_bytes.c, the concern of stacks and their sites' bytes, shares
 * with the policy: the stack of a request, which passed-through
 * allocations take too.
 */
#ifndef CA_SITE_BYTES_H
#define CA_SITE_BYTES_H

#include <stdint.h>

#include "support/config.h"

/* The stack of the program's call into the library, interned, when the
 * configuration asks for stacks (backtrace_depth, or growth_report with
 * CA_SITES_DEPTH frames), else 0: the frames outwards from the first one
 * outside the library, with the Python frames of a Python thread merged
 * in (as many again). */
uint32_t ca_site_stack(const ca_config *cfg);

#endif /* CA_SITE_BYTES_H */
