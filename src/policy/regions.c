/*
 * Pooled blocks told to an attached NVTX tool (see regions.h).
 */
#include "policy/regions.h"

#include "registry/registry.h"
#include "report/report.h"
#include "support/nvtx.h"

/* The block's segment is the heap it is a region of. Its name is the first
 * frame of its stack that is the program's own, as the leak report names
 * a group: read from memory only (ca_report_site_name). */
static void ca__region_add(const ca_ask *ask) {
  ca_registry_span where;
  if (!ca_registry_find(ask->addr, &where))
    return;
  char name[256];
  if (ask->stack != 0)
    ca_report_site_name(ask->stack, name, sizeof(name));
  ca_nvtx_region_add(where.span.segment, where.span.segment_size, ask->addr,
                     ask->size, ask->stack != 0 ? name : NULL);
}

static const ca_region_ops ca__regions = {
    .add = ca__region_add,
    .remove = ca_nvtx_region_remove,
};

const ca_region_ops *ca_regions_for_tool(void) {
  return ca_nvtx_attached() ? &ca__regions : NULL;
}
