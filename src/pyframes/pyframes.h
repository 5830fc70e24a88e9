/*
 * Python frames in allocation stacks: when the process runs CPython 3.9 to
 * 3.13, the Python frames (file:line in function) of the thread making an
 * allocation are merged into its native stack, where the interpreter's
 * eval loop stands, so that a PyTorch, CuPy or JAX user sees the line of
 * their own script that made the tensor.
 *
 * The frames are read from the calling thread's own interpreter state,
 * without the GIL (PyTorch releases it around every operator, and its
 * autograd threads never hold it) and without calling the interpreter:
 * while this thread is inside an allocation, its frames cannot change.
 * The structures' layouts are those of each supported minor version's
 * headers (tests/e2e/py_frames_test.py runs every supported interpreter
 * installed on the machine and checks the frames and lines it reports); a
 * process running any other Python (another version, a debug or
 * free-threaded build, which a check of the object layout at start-up
 * tells apart) gets native frames only. Each frame
 * read is checked (its code object's type, its pointers' shape) before it
 * is used.
 *
 * A Python frame is stored in a stack (stacks.h) as a tagged word, CA_PY_TAG
 * | id, whose file, function and line ca_pyframes_describe gives back; ids
 * are handed out once per distinct (file, function, line). Nothing here
 * calls the interpreter after start-up, takes the GIL or uses the program's
 * malloc (memory comes from mmap).
 */
#ifndef CA_PYFRAMES_H
#define CA_PYFRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The tag of a Python frame in a stack: no return address has this bit. */
#define CA_PY_TAG ((uintptr_t)1 << 63)

static inline bool ca_pyframes_is(uintptr_t pc) { return (pc & CA_PY_TAG) != 0; }

/* Merges the calling thread's Python frames, at most `py_max` of them, into
 * the native stack pcs[0..n) (innermost first), in place, at most `cap`
 * entries in all: each native frame of the interpreter's eval loop is
 * replaced by the Python frames it was running; those the native stack did
 * not reach go at its end. Returns the new count; n where the process runs
 * no supported Python or the thread runs no Python code. */
size_t ca_pyframes_merge(uintptr_t *pcs, size_t n, size_t cap, size_t py_max);

/* What a Python frame word stands for. */
typedef struct ca_pyframe {
  const char *file;     /* the code's co_filename, as UTF-8 */
  const char *function; /* its co_qualname (co_name before 3.11) */
  unsigned line;        /* 0 when the interpreter knows none */
} ca_pyframe;

/* Fills *out for a word ca_pyframes_merge stored; false for any other. */
bool ca_pyframes_describe(uintptr_t pc, ca_pyframe *out);

/* The minor version of the CPython 3 whose frames are read (9 to 13), or 0
 * when none is (no Python, or one not supported). */
int ca_pyframes_python(void);

#endif /* CA_PYFRAMES_H */
