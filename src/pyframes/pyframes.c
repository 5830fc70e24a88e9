/*
 * Python frames in allocation stacks (see pyframes.h).
 *
 * Compiled as one unit: the files of src/pyframes/ are included below, each
 * one concern, in the order they build on each other.
 */
#include "pyframes/pyframes.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdatomic.h>
#include <string.h>

#include "support/depot.h"
#include "support/dl.h"
#include "support/fork.h"
#include "support/lazy.h"
#include "support/lock.h"
#include "leaks/stacks.h"

#include "pyframes/abi.c"
#include "pyframes/lines.c"
#include "pyframes/store.c"
#include "pyframes/frames.c"
