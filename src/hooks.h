/*
 * The hook layer: how a program's driver calls reach us (exported driver
 * names, our dlsym, our cuGetProcAddress). It is the only part of the library
 * that knows about dlsym and cuGetProcAddress; the one thing it offers the
 * rest is the real dlsym, for the backend's own look-ups.
 */
#ifndef CA_HOOKS_H
#define CA_HOOKS_H

/* The C library's dlsym, never ours: look-ups made through it are never
 * rerouted to our hooks. Returns NULL when the name is not found (or, in a
 * process where the real dlsym cannot be found, always). */
void *ca_real_dlsym(void *handle, const char *name);

#endif /* CA_HOOKS_H */
