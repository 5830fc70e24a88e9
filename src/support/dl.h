/*
 * The C library's dlsym, for every part of the library below the hooks.
 *
 * The library exports its own dlsym (hooks.c), so a plain dlsym call from
 * inside it binds to that export and goes through the hooks. Look-ups the
 * library makes for itself (the driver's functions, libgcc's unwinder, the
 * C++ demangler) must not: they go through ca_dl_sym.
 */
#ifndef CA_DL_H
#define CA_DL_H

/* The C library's dlsym as a function pointer; NULL in a process where it
 * cannot be found. Found without a lock on first use, never through the
 * exported dlsym. */
typedef void *(*ca_dl_dlsym_fn)(void *handle, const char *name);
ca_dl_dlsym_fn ca_dl_real_dlsym(void);

/* dlsym(handle, name) by the C library's own dlsym: never rerouted to our
 * hooks. NULL when the name is not found, or the real dlsym is not. */
void *ca_dl_sym(void *handle, const char *name);

#endif /* CA_DL_H */
