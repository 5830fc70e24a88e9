/*
 * The leak report and the memory summary (see report.h, docs/LEAKS.md).
 *
 * A report is built in four steps: the live blocks are sorted into groups
 * (same device, same allocating call, same stack; or same size when there
 * is no stack), the groups are ordered by total bytes, every frame of every
 * stack shown (the groups', the peak's and the growing sites') is
 * symbolized in one batch (each object file is parsed once), and the
 * groups are printed, after the suppressions have set some aside, then
 * memory over time: the peak and the sites that kept growing. memcheck's
 * findings and the report of a request refused for memory print through
 * the same groups, symbols and output.
 *
 * Compiled as one unit: the files of src/report/ are included below, each
 * one concern, in the order they build on each other.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include "report/report.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/config.h"
#include "support/log.h"
#include "pyframes/pyframes.h"
#include "leaks/stacks.h"
#include "support/stats.h"
#include "symbolize/symbolize.h"

/* Allocation numbers listed per group without stacks, and in JSON. */
#define CA__TEXT_SAMPLES 3
#define CA__JSON_SAMPLES 8
/* Suppression rules read from the file, at most. */
#define CA__MAX_RULES 256
/* A suppressions file larger than this is read only this far. */
#define CA__MAX_RULES_FILE (1u << 20)

#define CA__STR2(x) #x
#define CA__STR(x) CA__STR2(x)
#define CA__VERSION                                                            \
  CA__STR(CUDALLOC_VERSION_MAJOR)                                              \
  "." CA__STR(CUDALLOC_VERSION_MINOR) "." CA__STR(CUDALLOC_VERSION_PATCH)

#include "report/out.c"
#include "report/summary.c"
#include "report/groups.c"
#include "report/suppressions.c"
#include "report/text.c"
#include "report/json.c"
#include "report/over_time.c"
#include "report/findings.c"
#include "report/oom.c"
#include "report/pickle.c"
#include "report/snapshot.c"
#include "report/entry.c"
