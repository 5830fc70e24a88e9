/*
 * The layouts of the CPython structures read, per minor version, and
 * finding the interpreter in the process.
 *
 * Part of pyframes' one compilation unit (src/pyframes/pyframes.c includes
 * the files in order); not compiled alone.
 */
/* ---- Layouts ---------------------------------------------------------------- */

/* How frames are chained: PyFrameObject (3.9, 3.10), _PyInterpreterFrame
 * with entry frames flagged (3.11) or marked by a C-stack shim (3.12, 3.13). */
enum { CA__FRAMES_OBJECT, CA__FRAMES_ENTRY_FLAG, CA__FRAMES_SHIM };
/* How a code object maps instructions to lines: co_lnotab (3.9),
 * co_linetable's pairs (3.10), the location table (3.11 on). */
enum { CA__LINES_LNOTAB, CA__LINES_PAIRS, CA__LINES_LOCATIONS };

/* Offsets in bytes, from each version's headers (offsetof on a program
 * built against 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0 with
 * Py_BUILD_CORE; 64-bit release builds); tests/e2e/py_frames_test.py
 * checks what they read under every such interpreter it finds. */
typedef struct ca__pyabi {
  int minor;
  int frames, lines;
  int ts_frame;       /* thread state: frame, cframe or current_frame */
  int cframe_current; /* _PyCFrame.current_frame; -1: none (3.9, 3.10, 3.13) */
  int fr_code, fr_back;
  int fr_instr;       /* f_lasti (an int) or prev_instr/instr_ptr (a pointer) */
  int fr_entry;       /* is_entry (3.11); -1 none */
  int fr_owner;       /* owner (3.12, 3.13); -1 none */
  int co_filename, co_name, co_firstlineno, co_linetable;
  int co_code;        /* the code units (co_code_adaptive, 3.11 on); -1 none */
  int ascii_size, compact_size, compact_utf8; /* unicode objects */
} ca__pyabi;

#define CA__OWNED_BY_CSTACK 3

static const ca__pyabi ca__abis[] = {
    {9, CA__FRAMES_OBJECT, CA__LINES_LNOTAB, 24, -1, 32, 24, 104, -1, -1,
     104, 112, 40, 120, -1, 48, 72, 56},
    {10, CA__FRAMES_OBJECT, CA__LINES_PAIRS, 24, -1, 32, 24, 96, -1, -1,
     104, 112, 40, 120, -1, 48, 72, 56},
    {11, CA__FRAMES_ENTRY_FLAG, CA__LINES_LOCATIONS, 56, 8, 32, 48, 56, 68, -1,
     112, 128, 72, 136, 184, 48, 72, 56},
    {12, CA__FRAMES_SHIM, CA__LINES_LOCATIONS, 56, 0, 0, 8, 56, -1, 70,
     112, 128, 68, 136, 192, 40, 56, 48},
    {13, CA__FRAMES_SHIM, CA__LINES_LOCATIONS, 72, -1, 0, 8, 56, -1, 70,
     112, 128, 68, 136, 200, 40, 56, 48},
};

/* ---- Finding the interpreter ---------------------------------------------- */

/* What start-up found; minor 0: no Python frames in this process. */
typedef struct ca__python {
  const ca__pyabi *abi;
  int minor;
  const void *code_type;              /* &PyCode_Type */
  int (*is_initialized)(void);        /* Py_IsInitialized */
  void *(*this_thread_state)(void);   /* PyGILState_GetThisThreadState */
  uintptr_t eval_lo, eval_hi;         /* _PyEval_EvalFrameDefault's code */
} ca__python;

static ca_lazy ca__python_lazy = CA_LAZY_INIT;
static ca__python ca__python_fallback;

/* The minor version of "3.MINOR.PATCH ..."; 0 for any other. */
static int ca__minor_of(const char *version) {
  if (version == NULL || version[0] != '3' || version[1] != '.')
    return 0;
  int minor = 0;
  for (const char *p = version + 2; *p >= '0' && *p <= '9'; p++)
    minor = minor * 10 + (*p - '0');
  return minor;
}

static const ca__pyabi *ca__abi_of(int minor) {
  for (size_t i = 0; i < sizeof(ca__abis) / sizeof(ca__abis[0]); i++)
    if (ca__abis[i].minor == minor)
      return &ca__abis[i];
  return NULL;
}

/* Whether objects are laid out as the tables assume: PyCode_Type's own
 * type, read where ob_type is in a release build, is PyType_Type. A debug
 * build (two more pointers first) or a free-threaded one (another header)
 * fails this. */
static bool ca__layout_matches(const void *code_type, const void *type_type) {
  const void *const *slot = (const void *const *)((const char *)code_type + 8);
  return code_type != NULL && type_type != NULL && *slot == type_type;
}

static void ca__find_python(ca__python *py) {
  memset(py, 0, sizeof(*py));
  const char *(*version)(void) =
      (const char *(*)(void))ca_dl_sym(RTLD_DEFAULT, "Py_GetVersion");
  if (version == NULL)
    return;
  int minor = ca__minor_of(version());
  const ca__pyabi *abi = ca__abi_of(minor);
  py->code_type = ca_dl_sym(RTLD_DEFAULT, "PyCode_Type");
  py->is_initialized = (int (*)(void))ca_dl_sym(RTLD_DEFAULT, "Py_IsInitialized");
  py->this_thread_state =
      (void *(*)(void))ca_dl_sym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
  void *eval = ca_dl_sym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (abi == NULL || py->is_initialized == NULL || py->this_thread_state == NULL ||
      eval == NULL || !ca__layout_matches(py->code_type, ca_dl_sym(RTLD_DEFAULT, "PyType_Type")) ||
      dladdr1(eval, &info, (void **)&sym, RTLD_DL_SYMENT) == 0 || sym == NULL)
    return;
  py->eval_lo = (uintptr_t)eval;
  py->eval_hi = (uintptr_t)eval + (sym->st_size ? sym->st_size : 1);
  py->abi = abi;
  py->minor = minor;
}

/* The interpreter, found once (ca_lazy: no lock held across the loader). */
static const ca__python *ca__python_get(void) {
  return CA_LAZY_ONCE(&ca__python_lazy, ca__python, ca__find_python, &ca__python_fallback);
}

int ca_pyframes_python(void) { return ca__python_get()->minor; }
