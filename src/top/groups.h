/*
 * cudalloc top's shared_limit section: each group of this user's (the
 * regions of support/group_region.h), its cap, and each device's part of
 * it held by each living process.
 */
#ifndef CA_TOP_GROUPS_H
#define CA_TOP_GROUPS_H

#include <stdbool.h>

/* Prints every group after the process table (`tty`: each line clears
 * the rest of its row). Prints nothing where no group was ever made. */
void ca_top_print_groups(bool tty);

#endif /* CA_TOP_GROUPS_H */
