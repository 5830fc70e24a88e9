#!/usr/bin/env python3
"""readme_test.py CHECK: every command README.md and `cudalloc --help` show is
run, exactly as printed, and does what they say.

  setup     README.md's first section is the set-up: its sh block's lines
            (scripts/demo.sh, scripts/test.sh); scripts/demo.sh runs in a
            scratch copy of the source tree, where it builds from nothing,
            and says what the README says it does. scripts/test.sh runs
            ctest, this test among them: skipped, saying so (CI runs it).
  commands  every other line of README.md's sh blocks, and each `$ ` line of
            its other blocks, in a scratch copy of the source tree whose
            build/ is this build folder.
  help      the EXAMPLES (`$ ` lines) of `sh scripts/cudalloc --help`, its
            `backquoted` commands, and --help and run --help themselves (the
            same text); every SYNOPSIS form has an example.
  inline    every command README.md's prose quotes (below), in a scratch
            copy of the source tree of its own, which they build, install
            from and package: its build/ is the copy's, never this build
            folder.

An inline command is a code span of README.md's prose (outside fenced
blocks; a span broken across lines reads with a space, as rendered) that is
a whole command line, not a name: after any VAR=value words its first word
is a program a user runs (a file under scripts/, cudalloc, cmake, ctest,
cpack, cd, python3), and either it is a scripts/*.sh script alone (the
project's commands, which are run as they stand) or it has an argument
beyond the program's subcommand (a bare first word after the program is
its subcommand). So `cudalloc top --once`, `cudalloc --help`,
`cd build && cpack -G DEB` and `CUDALLOC_CONF=help:1 cudalloc run -- true`
are commands; `scripts/cudalloc` (a program's file), `python3`,
`cudalloc view` (a subcommand), `CUDALLOC_CONF=help:1` (a setting: no
program) and `scripts/python/cudalloc` (a package) are names. Each runs once,
where first quoted, in README order, after what README runs first: its
set-up block (scripts/demo.sh builds the copy) and its `export` lines (the
environment the everyday commands assume); a command quoted again, or one
of those, is not run twice (SAME line printed). Prose has no trailing
comment to say what a command needs, so this test knows: scripts/test.sh
is skipped as in the set-up; scripts/gpu-check.sh and scripts/bench-gpu.sh
are skipped, saying why (no GPU; where one is, they are the GPU suites,
longer than a test may run); a `ctest -L gpu` line runs where no GPU is
(each GPU test skips itself, saying why) and is skipped where one is (it is
the GPU checks themselves); scripts/bench-cpu.sh needs valgrind.

Each line runs through `sh -c LINE` in the scratch folder, stdin empty, with
the user's environment less anything of cudalloc's or of this test's
(CUDALLOC_*, E2E_*, LD_PRELOAD, LD_LIBRARY_PATH). What the documents tell a
user to run first is run first: an `export ...` line runs as printed, and
the environment it leaves is the later lines'. A line passes when it exits 0,
or with the status its text states ("exit status N", "exits N"), and a
ctest line passes only when it finds tests (outside a build folder it tests
nothing); where a plain block follows a sh block, it shows the output of
that block's last line, and a `$ ` line's block shows its own: each shown
line's shape (the part before any ';', numbers, addresses and runs of
blanks taken as any, frames outside the repository left out) must start a
line of the output.
`cudalloc top` without --once runs in a terminal (a pty) and is sent q
after its second screen (the first with rates), as a user quits it; the
README's picture of it is of two test programs (e2e_reach hold and grow,
growth_report:1), which run meanwhile.

A line's trailing comment may say what it is, in its first words:
  # pattern: ...      a form to fill in, not run (PATTERN line printed)
  # needs a GPU [and PyTorch|CuPy|JAX|tmux|chromium|nvcc]
                      run where all of these are here; else SKIP, saying which
  # without a GPU     run only where no GPU is (SKIP, saying so, elsewhere)
A line naming a build/ file that this build lacks is skipped where the build
could not make it (no CUDA compiler: the CUDA examples), and fails otherwise.
Any other line that cannot run fails the check.

Environment (tests/e2e/CMakeLists.txt): CUDALLOC_SOURCE_DIR (the source
tree), README_BUILD_DIR (this build folder), README_CUDA_COMPILER (CMake's
CUDA compiler, empty where none), README_EXAMPLES (ON where the examples are
built), E2E_REACH_PROG, E2E_MOCK_DIR, E2E_PRELOAD (the top picture's
programs). Prints ok, PATTERN, SKIP and SAME lines and one PASS or FAIL line
per check; exits 1 when a line failed. Python 3 standard library only.
"""
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from leak_report_test import CheckFailed, main as run_checks

SRC = os.environ.get("CUDALLOC_SOURCE_DIR", "")
BUILD = os.environ.get("README_BUILD_DIR", "")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STATUS = re.compile(r"\bexit(?:s| status) (\d+)\b")
NEEDS = re.compile(r"^needs (.+?)(?:[:;(]|$)")
SETUP = re.compile(r"^(?:\S+=\S*\s+)*(?:(?:ba)?sh\s+)?(?:\./)?scripts/(?:demo|test)\.sh\b")
COMMENT = re.compile(r"(?:^|\s)#(.*)$")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PROGRAMS = ("cudalloc", "cmake", "ctest", "cpack", "cd", "python3")
CTEST = re.compile(r"(?:^|[;&|(]\s*|\s)ctest\b")
GPU_LABEL = re.compile(r"\bctest\b.*\s-L\s+['\"]?\^?gpu")
# Inline commands not run from a test: (what they need, why not even then).
SUITES = {
    "scripts/test.sh": (None, "it runs ctest, this test among them, so not from here; "
                        "CI runs it (.ci/run)"),
    "scripts/gpu-check.sh": ("a GPU", "a GPU is here, but it builds and runs every GPU "
                             "check, longer than a test may run: run it by hand"),
    "scripts/bench-gpu.sh": ("a GPU", "a GPU is here, but it is the GPU benchmark suite, "
                             "longer than a test may run: run it by hand"),
}
# What the other inline commands need, as a sh block's line says '# needs ...'.
INLINE_NEEDS = {"scripts/bench-cpu.sh": "valgrind"}
FRAME = re.compile(r"^(#\d+) 0x[0-9a-f]+ in (\S+)(?: (\S+?):(\d+))?")
UNIT = re.compile(r"^(?:B|KiB|MiB|GiB|TiB)$")


class Failed(Exception):
    pass


def split_comment(line):
    """(the command, its trailing comment's text)."""
    m = COMMENT.search(line)
    if not m:
        return line.rstrip(), ""
    return line[:m.start()].rstrip(), m.group(1).strip()


# ---------------------------------------------------------------------------
# What the documents show.

class Item:
    """One command line as printed, where it is, the text said of it, and
    the output shown for it (None where none is)."""

    def __init__(self, where, line, said="", sample=None):
        self.where, self.line, self.sample = where, line, sample
        self.command, comment = split_comment(line)
        self.said = " ".join(x for x in (comment, said) if x)
        self.comment = comment


def readme_sections(path):
    """[(heading, [(kind, lang, first line number, [lines])...])...]: README.md's
    fenced blocks by second-level section ('' before the first)."""
    sections = [("", [])]
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif line.startswith("```"):
            lang, start, body = line[3:].strip(), i + 2, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            sections[-1][1].append(("block", lang, start, body))
        elif line.strip():
            sections[-1][1].append(("text", "", i + 1, [line]))
        i += 1
    return sections


def readme_items(path, wanted):
    """The Items of README.md's sections that `wanted(heading)` accepts: every
    line of a sh block (a trailing '\\' joins the next), and each `$ ` line of
    another block, whose other lines are its output. A plain block right
    after a sh block (nothing between) is the output of that block's last line."""
    items = []
    for heading, parts in readme_sections(path):
        if not wanted(heading):
            continue
        last_sh = None
        for kind, lang, start, body in parts:
            if kind == "text":
                last_sh = None
                continue
            if lang == "sh":
                pending, first, before = "", None, len(items)
                for n, line in enumerate(body):
                    if not line.strip() or line.lstrip().startswith("#"):
                        continue
                    if line.endswith("\\"):
                        pending, first = pending + line[:-1], first or start + n
                        continue
                    items.append(Item(f"README.md:{first or start + n}", pending + line))
                    pending, first = "", None
                last_sh = items[-1] if len(items) > before else None
            elif lang in ("", "text", "console"):
                shown = [(n, ln) for n, ln in enumerate(body) if ln.startswith("$ ")]
                if shown:
                    for n, ln in shown:
                        rest = [x for x in body if not x.startswith("$ ")]
                        items.append(Item(f"README.md:{start + n}", ln[2:], sample=rest))
                elif last_sh is not None:
                    last_sh.sample = body
                last_sh = None
            else:
                last_sh = None
    return items


def is_command(span):
    """Whether an inline code span is a command (the rule above), not a name."""
    words = span.split()
    while words and ASSIGN.match(words[0]):
        words = words[1:]
    if not words:
        return False
    program, rest = words[0], words[1:]
    if program not in PROGRAMS and not program.startswith("scripts/"):
        return False
    if not rest:
        return program.startswith("scripts/") and program.endswith(".sh")
    if not rest[0].startswith("-"):
        rest = rest[1:]  # its subcommand
    return bool(rest)


def inline_items(path):
    """The Items of README.md's inline commands (the rule above), each once,
    in order: the code spans of its prose, paragraph by paragraph (a heading
    or a table row is one of its own), that are commands."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    items, seen, paragraphs, para, fenced = [], set(), [], [], False
    for n, line in enumerate(lines, 1):
        fence = line.startswith("```")
        fenced ^= fence
        own = not fenced and line.startswith(("#", "|"))
        if fenced or fence or own or not line.strip():
            if para:
                paragraphs.append(para)
            para = []
            if own:
                paragraphs.append([(n, line)])
            continue
        para.append((n, line.strip()))
    if para:
        paragraphs.append(para)
    for para in paragraphs:
        text = "\n".join(ln for _, ln in para)
        for m in re.finditer(r"`([^`]+)`", text):
            span = m.group(1).replace("\n", " ")
            if span in seen or not is_command(span):
                continue
            seen.add(span)
            lineno = para[0][0] + text.count("\n", 0, m.start())
            items.append(Item(f"README.md:{lineno}", span))
    return items


def check_readme_order(path):
    """The first screen: the title and what it is, then the set-up, then the
    everyday commands."""
    sections = readme_sections(path)
    heads = [h for h, _ in sections[1:]]
    if heads[:2] != ["Set up", "Everyday commands"]:
        raise Failed(f"README.md's first sections are {heads[:2]}; want 'Set up' (the two "
                     "set-up commands) and then 'Everyday commands'")
    setup = [b for k, lang, _, b in sections[1][1] if k == "block" and lang == "sh"]
    firsts = [split_comment(ln)[0] for b in setup for ln in b
              if ln.strip() and not ln.lstrip().startswith("#")]
    if firsts != ["scripts/demo.sh", "scripts/test.sh"]:
        raise Failed(f"README.md's set-up block runs {firsts}; want scripts/demo.sh and "
                     "scripts/test.sh")


def help_items(text):
    """The EXAMPLES' `$ ` lines (the indented lines under each say what it
    does), then each backquoted command of the help, once."""
    items, seen, section, current = [], set(), "", None
    for line in text.split("\n"):
        if re.match(r"^[A-Z][A-Z ]+$", line):
            section, current = line.strip(), None
            continue
        m = re.match(r"^\s+\$ (.*)$", line)
        if section == "EXAMPLES" and m:
            current = Item("--help EXAMPLES", m.group(1))
            items.append(current)
            seen.add(current.command)
        elif section == "EXAMPLES" and current is not None and line.strip():
            current.said = (current.said + " " + line.strip()).strip()
    for m in re.finditer(r"`([^`]+)`", text):
        if m.group(1) not in seen:
            seen.add(m.group(1))
            items.append(Item("--help, backquoted", m.group(1)))
    return items


def synopsis_forms(text):
    """Each SYNOPSIS form's fixed words: 'cudalloc view --torch-snapshot'."""
    forms, section = [], ""
    for line in text.split("\n"):
        if re.match(r"^[A-Z][A-Z ]+$", line):
            section = line.strip()
            continue
        if section != "SYNOPSIS" or not line.strip():
            continue
        for form in line.strip().split(" | "):
            words = []
            for w in form.split():
                if w.startswith("[") or re.search(r"[A-Z]", w.lstrip("-")):
                    break
                words.append(w)
            forms.append(" ".join(words))
    return forms


# ---------------------------------------------------------------------------
# What this machine has.

class Machine:
    def __init__(self):
        self._known = {}

    def have(self, need):
        """None where `need` is met, else why not."""
        if need not in self._known:
            self._known[need] = self._probe(need)
        return self._known[need]

    def gpu(self):
        return self.have("a GPU") is None

    @staticmethod
    def _python_module(name, label):
        r = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                           timeout=120)
        return None if r.returncode == 0 else f"needs {label} (python3 cannot import {name})"

    def _probe(self, need):
        if need == "a GPU":
            try:
                r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                   timeout=60)
                if r.returncode == 0 and "GPU" in r.stdout:
                    return None
            except (OSError, subprocess.TimeoutExpired):
                pass
            return "needs a GPU (nvidia-smi sees none)"
        if need == "PyTorch":
            return self._python_module("torch", "PyTorch")
        if need == "CuPy":
            return self._python_module("cupy", "CuPy")
        if need == "JAX":
            return self._python_module("jax", "JAX")
        if need in ("tmux", "chromium", "valgrind"):
            names = [need] + (["chromium-browser"] if need == "chromium" else [])
            return None if any(shutil.which(n) for n in names) else f"needs {need} (not on PATH)"
        if need == "nvcc":
            cc = os.environ.get("README_CUDA_COMPILER", "")
            return None if cc and not cc.endswith("NOTFOUND") else \
                "needs nvcc (the CUDA toolkit): this build found no CUDA compiler"
        raise Failed(f"the test does not know how to tell whether this machine has '{need}'")


# ---------------------------------------------------------------------------
# Running them.

def user_env(scratch):
    """The user's environment, less what belongs to cudalloc or this test."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDALLOC_", "E2E_", "README_"))
           and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["PWD"] = scratch
    return env


def scratch_copy(dest, with_deps=False):
    """A copy of the source tree's files (git's tracked and unignored ones,
    else all but build*/ and .git), and .deps where asked and present."""
    try:
        names = subprocess.run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        names = None
    if names:
        for name in filter(None, names):
            src = os.path.join(SRC, name)
            if os.path.isfile(src) and not os.path.islink(src):
                os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, name))
    else:
        shutil.copytree(SRC, dest, dirs_exist_ok=True, symlinks=True, ignore=lambda d, n: [
            x for x in n if d == SRC and (x.startswith("build") or x == ".git")])
    if with_deps and os.path.isdir(os.path.join(SRC, ".deps")):
        shutil.copytree(os.path.join(SRC, ".deps"), os.path.join(dest, ".deps"),
                        dirs_exist_ok=True)


def shape(line):
    """A regular expression for a shown output line, or None where the line
    is not compared (blank, a frame outside the repository)."""
    body = line[len("cudalloc:"):] if line.startswith("cudalloc:") else line
    head = "cudalloc:" if body is not line else ""
    body = body.split(";")[0].rstrip()
    if body.endswith("..."):
        body = body[:-3].rstrip()
    if not body.strip():
        return None
    frame = FRAME.match(body.strip())
    if frame:
        number, function, path, lineno = frame.groups()
        local = repo_path(path) if path else None
        if local is None:
            return None
        return re.compile(rf"^{re.escape(head)}\s*{number} 0x[0-9a-f]+ in "
                          rf"{re.escape(function)} \S*{re.escape(local)}:{lineno}\b")
    parts = []
    for piece in re.split(r"(0x[0-9a-f]+|\d+(?:\.\d+)?|\s+)", body):
        if not piece:
            continue
        if piece.isspace():
            parts.append(r"\s*" if not parts else r"\s+")
        elif re.fullmatch(r"0x[0-9a-f]+", piece):
            parts.append(r"0x[0-9a-f]+")
        elif re.fullmatch(r"\d+(?:\.\d+)?", piece):
            parts.append(r"\d+(?:\.\d+)?")
        elif UNIT.match(piece):
            parts.append(r"(?:B|KiB|MiB|GiB|TiB)")
        else:
            parts.append(re.escape(piece))
    return re.compile("^" + re.escape(head) + "".join(parts))


def repo_path(path):
    """The part of a shown path that names a file of the source tree."""
    parts = path.strip("/").split("/")
    for i in range(len(parts)):
        if os.path.isfile(os.path.join(SRC, *parts[i:])):
            return "/".join(parts[i:])
    return None


def compare(item, out):
    """Problems with the output against the shown lines."""
    lines = [ln.rstrip() for ln in out.split("\n")]
    missing = []
    for shown in item.sample:
        pattern = shape(shown)
        if pattern and not any(pattern.match(ln) for ln in lines):
            missing.append(shown)
    if missing:
        return ["its output has no line shaped like " + "; nor like ".join(
            repr(m) for m in missing)]
    return []


class Scaffold:
    """The README's picture of cudalloc top: two test programs under the
    library on the mock driver, e2e_reach hold and grow (growth_report:1)."""

    def __init__(self):
        self.procs = []

    def start(self):
        if self.procs:
            return
        prog = os.environ["E2E_REACH_PROG"]
        base = dict(os.environ, LD_LIBRARY_PATH=os.environ["E2E_MOCK_DIR"],
                    LD_PRELOAD=os.environ["E2E_PRELOAD"], MOCKCUDA_DEVICES="1")
        for args, conf in ((["hold", "73", "120"], ""),
                           (["grow", "120"], "growth_report:1,backtrace_depth:8")):
            self.procs.append(subprocess.Popen([prog, *args], env=dict(base, CUDALLOC_CONF=conf),
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        # Until both publish, and the growing one names its site.
        top = os.path.join(BUILD, "cudalloc-top")
        deadline = time.time() + 15
        while time.time() < deadline:
            out = subprocess.run([top, "--once"], capture_output=True, text=True,
                                 timeout=30).stdout
            rows = [ln for ln in out.split("\n") if ln.strip().split(" ")[0].isdigit()]
            pids = {int(r.split()[0]) for r in rows}
            if all(p.pid in pids for p in self.procs) and "grow_step" in out:
                return
            time.sleep(0.3)

    def finish(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
            p.wait(timeout=30)
        if self.procs:  # top removes the files the killed programs left
            subprocess.run([os.path.join(BUILD, "cudalloc-top"), "--once"],
                           capture_output=True, timeout=30)
        self.procs = []


def run_in_terminal(line, cwd, env):
    """(status, output) of LINE in a pseudo-terminal, sent q once its second
    screen is out, the first with rates (or after 10 s)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["sh", "-c", line], cwd=cwd, env=dict(env, TERM="xterm"),
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out, sent, deadline = b"", False, time.time() + 30
    quit_at = time.time() + 10
    while time.time() < deadline:
        if not sent and (out.count(b"\x1b[J") >= 2 or time.time() > quit_at):
            os.write(master, b"q")
            sent = True
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        out += b"\n(still running 10 s after q: killed)"
    os.close(master)
    text = ANSI.sub("", out.decode(errors="replace")).replace("\r", "")
    return rc, text


class Runner:
    def __init__(self, check, scratch):
        self.check, self.scratch = check, scratch
        self.env = user_env(scratch)
        self.machine = Machine()
        self.scaffold = Scaffold()
        self.counts = {"run": 0, "skipped": 0, "patterns": 0}
        self.failures = []
        self.ran = []
        self.timeout = 240

    def say(self, word, item, text=""):
        print(f"{word} {self.check}: {item.command}{': ' + text if text else ''} "
              f"({item.where})", flush=True)

    def why_not(self, item):
        """None where the line is to run here, else why not."""
        said = item.comment
        m = NEEDS.search(said)
        if m:
            for need in re.split(r",\s*|\s+and\s+", m.group(1).strip()):
                why = self.machine.have(need.strip())
                if why:
                    return why
        if said.startswith("without a GPU") and self.machine.gpu():
            return "for a machine without a GPU, and a GPU is here"
        for path in re.findall(r"(?:^|[\s=])(?:\$PWD/)?(build/\S+)", item.command):
            if os.path.exists(os.path.join(self.scratch, path)):
                continue
            if path.startswith("build/examples/"):
                if os.environ.get("README_EXAMPLES", "ON").upper() in ("OFF", "0", "NO", "FALSE"):
                    return f"{path} is not built here (CUDALLOC_BUILD_EXAMPLES=OFF)"
                if "leaky_loop" in path:
                    why = self.machine.have("nvcc")
                    if why:
                        return f"{why}, so {path} was not built"
            build = os.path.realpath(os.path.join(self.scratch, "build"))
            raise Failed(f"{item.where}: {path} does not exist in this build ({build}), "
                         "yet the build should have made it")
        return None

    def why_not_inline(self, item):
        """None where an inline command is to run here, else why not."""
        if item.command in SUITES:
            need, why = SUITES[item.command]
            return (need and self.machine.have(need)) or why
        if GPU_LABEL.search(item.command) and self.machine.gpu():
            return ("a GPU is here, so it runs the GPU checks themselves (scripts/gpu-check.sh's "
                    "work), longer than a test may run: run it by hand")
        if item.command in INLINE_NEEDS:
            return self.machine.have(INLINE_NEEDS[item.command])
        return None

    def run(self, item, inline=False):
        try:
            if SETUP.match(item.command) and not inline:
                raise Failed(f"{item.where}: {item.command}: a set-up command outside the "
                             "set-up section, which readme_setup runs in a tree of its own")
            if item.comment.startswith("pattern"):
                self.counts["patterns"] += 1
                self.say("PATTERN", item, "a form to fill in, not run")
                return
            why = (inline and self.why_not_inline(item)) or self.why_not(item)
            if why:
                self.counts["skipped"] += 1
                self.say("SKIP", item, why)
                return
            self.execute(item)
        except Failed as e:
            self.failures.append(str(e))
            print(f"FAIL {self.check}: {e}", flush=True)

    def execute(self, item):
        command = item.command
        m = STATUS.search(item.said)
        want = int(m.group(1)) if m else 0
        if command.startswith("export "):
            with tempfile.NamedTemporaryFile(dir=self.scratch, delete=False) as f:
                dump = f.name
            r = subprocess.run(["sh", "-c", f"{item.line}\n__rc=$?; env -0 >'{dump}'; "
                                "exit $__rc"], cwd=self.scratch, env=self.env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=60)
            with open(dump, "rb") as f:
                pairs = [p.split(b"=", 1) for p in f.read().split(b"\0") if b"=" in p]
            os.unlink(dump)
            self.env = {k.decode(): v.decode() for k, v in pairs}
            rc, out = r.returncode, r.stdout + r.stderr
        elif re.match(r"^cudalloc top\b", command) and "--once" not in command.split():
            if item.sample:
                self.scaffold.start()
            rc, out = run_in_terminal(item.line, self.scratch, self.env)
        else:
            try:
                r = subprocess.run(["sh", "-c", item.line], cwd=self.scratch, env=self.env,
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=self.timeout)
            except subprocess.TimeoutExpired as e:
                raise Failed(f"{item.where}: {command}: still running after {e.timeout} s")
            rc, out = r.returncode, r.stdout + r.stderr
        problems = []
        if rc != want:
            problems.append(f"exit status {rc}, want {want}")
        if CTEST.search(command) and "No tests were found" in out:
            problems.append("ctest found no test to run (it runs in a build folder)")
        if item.sample:
            problems += compare(item, out)
        self.ran.append(command)
        if problems:
            tail = "\n".join("    | " + ln for ln in out.rstrip().split("\n")[-25:])
            raise Failed(f"{item.where}: {command}: {'; '.join(problems)}\n{tail}")
        self.counts["run"] += 1
        shown = " (output shaped as shown)" if item.sample else ""
        self.say("ok", item, f"exit status {rc}{shown}")

    def done(self, what):
        self.scaffold.finish()
        c = self.counts
        summary = (f"{c['run']} line(s) of {what} run as printed, {c['skipped']} skipped "
                   f"(SKIP lines above), {c['patterns']} pattern(s)")
        if self.failures:
            print(f"FAIL {self.check}: {len(self.failures)} line(s) failed; {summary}")
            return 1
        print(f"PASS {self.check}: {summary}")
        return 0


# ---------------------------------------------------------------------------
# The checks.

def check_setup(tmp):
    runner = Runner("readme_setup", os.path.join(tmp, "src"))
    try:
        check_readme_order(os.path.join(SRC, "README.md"))
    except Failed as e:
        print(f"FAIL readme_setup: {e}")
        return 1
    items = readme_items(os.path.join(SRC, "README.md"), lambda h: h == "Set up")
    for item in items:
        if item.command == "scripts/test.sh":
            runner.counts["skipped"] += 1
            runner.say("SKIP", item, "it runs ctest, this test among them, so not from here; "
                       "CI runs it (.ci/run)")
            continue
        if item.command != "scripts/demo.sh":
            runner.run(item)
            continue
        scratch_copy(runner.scratch, with_deps=True)
        r = subprocess.run(["sh", "-c", item.line], cwd=runner.scratch, env=runner.env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=840)
        out = r.stdout + r.stderr
        want = ["== pool_demo with cudalloc", "cache hits"]
        gpu = runner.machine.gpu()
        want.append("demo: running on" if gpu else "running against the project's mock driver")
        leaky = "leaky_loop skipped: no CUDA compiler found" not in out
        if leaky:
            want += ["== leaky_loop with cudalloc", "cudalloc: SUMMARY: ",
                     "== leaky_loop --fixed", "cudalloc: no device memory leaks"]
        missing = [w for w in want if w not in out]
        if r.returncode != 0 or missing:
            tail = "\n".join("    | " + ln for ln in out.rstrip().split("\n")[-30:])
            runner.failures.append(item.command)
            print(f"FAIL readme_setup: {item.command} ({item.where}): exit status "
                  f"{r.returncode}; missing from its output: {missing}\n{tail}")
            continue
        runner.counts["run"] += 1
        runner.say("ok", item, "exit status 0: built in a scratch copy, pool_demo under "
                   "cudalloc" + (", leaky_loop's report and its fixed twin" if leaky else "")
                   + (" on the GPU" if gpu else ", on the mock driver, saying so"))
        if not leaky:
            runner.counts["skipped"] += 1
            runner.say("SKIP", item, "its leaky_loop part needs nvcc (the CUDA toolkit), "
                       "which the demo found nowhere")
    return runner.done("README.md's set-up")


def check_commands(tmp):
    readme = os.path.join(SRC, "README.md")
    runner = Runner("readme_commands", os.path.join(tmp, "src"))
    scratch_copy(runner.scratch)
    os.symlink(BUILD, os.path.join(runner.scratch, "build"))
    try:
        items = readme_items(readme, lambda h: h != "Set up")
        if not items:
            raise Failed("README.md shows no commands outside its set-up")
        for item in items:
            runner.run(item)
    except Failed as e:
        runner.failures.append(str(e))
        print(f"FAIL readme_commands: {e}")
    return runner.done("README.md")


def check_help(tmp):
    runner = Runner("readme_help", os.path.join(tmp, "src"))
    scratch_copy(runner.scratch)
    os.symlink(BUILD, os.path.join(runner.scratch, "build"))
    command = os.path.join(runner.scratch, "scripts", "cudalloc")
    texts = {}
    for args in (["--help"], ["run", "--help"]):
        r = subprocess.run(["sh", command, *args], cwd=runner.scratch, env=runner.env,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print(f"FAIL readme_help: sh scripts/cudalloc {' '.join(args)}: exit status "
                  f"{r.returncode}\n{r.stderr}")
            return 1
        texts[" ".join(args)] = r.stdout
    text = texts["--help"]
    try:
        if texts["run --help"] != text:
            raise Failed("cudalloc run --help differs from cudalloc --help")
        items = help_items(text)
        if not any(i.where == "--help EXAMPLES" for i in items):
            raise Failed("cudalloc --help has no EXAMPLES ('$ ' lines) to run")
        for item in items:
            runner.run(item)
        # --help and run --help as the SYNOPSIS prints them, on the examples' PATH.
        for args, want in (("cudalloc --help", text), ("cudalloc run --help", text)):
            r = subprocess.run(["sh", "-c", args], cwd=runner.scratch, env=runner.env,
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or r.stdout != want:
                raise Failed(f"{args}: exit status {r.returncode}, "
                             f"{'its text' if r.returncode == 0 else 'no text'} "
                             "differs from sh scripts/cudalloc --help")
            runner.ran.append(args)
            runner.counts["run"] += 1
            print(f"ok readme_help: {args}: exit status 0, the help (SYNOPSIS)", flush=True)
        ran = [re.sub(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+", "", c) for c in runner.ran]
        missing = [f for f in synopsis_forms(text)
                   if not any(c == f or c.startswith(f + " ") for c in ran)]
        if missing:
            raise Failed(f"SYNOPSIS forms with no example run: {missing}")
    except Failed as e:
        runner.failures.append(str(e))
        print(f"FAIL readme_help: {e}")
    return runner.done("cudalloc --help")


def check_inline(tmp):
    readme = os.path.join(SRC, "README.md")
    runner = Runner("readme_inline", os.path.join(tmp, "src"))
    runner.timeout = 600  # scripts/demo.sh builds the copy from nothing
    scratch_copy(runner.scratch, with_deps=True)
    try:
        items = inline_items(readme)
        if not items:
            raise Failed("README.md's prose quotes no command")
        # What the README tells a user to run first, first: the set-up, which
        # builds the copy, and the everyday commands' export lines.
        first = readme_items(readme, lambda h: h == "Set up") + [
            i for i in readme_items(readme, lambda h: h != "Set up")
            if i.command.startswith("export ")]
        seen = {}
        for item in first + items:
            if item.command in seen:
                runner.say("SAME", item, f"the line of {seen[item.command]}, not run twice")
                continue
            seen[item.command] = item.where
            runner.run(item, inline=True)
    except Failed as e:
        runner.failures.append(str(e))
        print(f"FAIL readme_inline: {e}")
    return runner.done("README.md's prose (its set-up and exports first)")


CHECKS = {"setup": check_setup, "commands": check_commands, "help": check_help,
          "inline": check_inline}


def as_check(check):
    """A check of this file (it prints its own lines and returns 1 on
    failure) as leak_report_test's runner takes one."""
    def run(tmp):
        if check(tmp) != 0:
            raise CheckFailed("its FAIL lines are above")
        return "its lines are above"
    return run


def main(argv):
    if not SRC or not BUILD:
        print(f"usage: readme_test.py [{'|'.join(CHECKS)}]... with CUDALLOC_SOURCE_DIR and "
              "README_BUILD_DIR set")
        return 2
    return run_checks(argv, {name: as_check(c) for name, c in CHECKS.items()}, label="readme")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
