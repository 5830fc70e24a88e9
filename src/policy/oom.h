/*
 * A request refused for memory, told to the program's user: the first
 * refusal of a process, and each one under verbose, as a report (the
 * request, what the device holds, the sites holding the most live memory,
 * what would help; report.h's CA_EVENT_OOM). Nothing is done before a
 * refusal: the callers compare the status their call returned.
 */
#ifndef CA_OOM_H
#define CA_OOM_H

#include <stdint.h>

/* `call` ("cuMemAlloc", "the allocator slot") was refused `bytes` on
 * `device` for memory, after room was made. `then`, when not NULL, says
 * what the caller does next (the process stops): it is said even where no
 * report is due, in the report's first line alone. Holds no library lock
 * on entry: the report symbolizes stacks. */
void ca_oom_refused(int device, uint64_t bytes, const char *call,
                    const char *then);

#endif /* CA_OOM_H */
