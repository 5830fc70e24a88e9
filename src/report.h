/*
 * What the library prints about memory: the per-device summary and the list
 * of live allocations. Output goes through ca_log, never allocates, and
 * makes no CUDA call, so it is safe at exit.
 */
#ifndef CA_REPORT_H
#define CA_REPORT_H

#include <stddef.h>
#include <stdint.h>

/* Formats `bytes` for people: "512 B", "1.5 KiB", "12.0 MiB", "3.2 GiB". */
void ca_format_bytes(char *buf, size_t len, uint64_t bytes);

/* Prints the memory summary of every device that has a pool. */
void ca_report_stats(void);

/* Prints every live device allocation, pooled and passed through. */
void ca_report_live(void);

#endif /* CA_REPORT_H */
