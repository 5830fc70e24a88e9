/*
 * What the layer nvtx_regions (concerns/) tells an attached NVTX tool of
 * each pooled block: the block as a region of its segment (found through
 * the registry), named after its allocation site when stacks are on
 * (support/nvtx.h says what the tool is told).
 */
#ifndef CA_REGIONS_H
#define CA_REGIONS_H

#include "concerns/concern.h"

/* The operations, or NULL when no NVTX tool is attached. */
const ca_region_ops *ca_regions_for_tool(void);

#endif /* CA_REGIONS_H */
