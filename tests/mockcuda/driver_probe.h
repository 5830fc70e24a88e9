/* driver_probe's parts (driver_probe*.c). */
#ifndef DRIVER_PROBE_H
#define DRIVER_PROBE_H

#include <stdio.h>

#include <cuda.h>

/* The name of a driver result ("CUDA_ERROR_INVALID_VALUE"). */
const char *rc_name(CUresult r);

/* One "question: answer" line. */
#define Q(what, call) printf("%s: %s\n", what, rc_name(call))

/* What describes an allocation: attributes, address ranges, SYNC_MEMOPS. */
void probe_pointers(CUcontext ctx);
/* Whether what cuMemGetInfo calls free can be allocated (less 4 MiB). */
void probe_free_memory(void);
/* CUDA IPC: handles, and a second process (this program run again as
 * `self ipc-import IN OUT`) that opens them. */
void probe_ipc(const char *self);
int probe_ipc_import(int in, int out);
/* The virtual-memory API: reserving, mapping, unmapping, and what a pointer
 * in a mapping answers. */
void probe_vmm(void);
/* Memsets and copies that leave their allocation, frees during a capture of
 * what is no allocation, and the alignment of allocations by size. */
void probe_ranges(CUcontext ctx);
/* Modules and launches: the library's gather kernel loaded and run. */
void probe_kernels(void);

#endif /* DRIVER_PROBE_H */
