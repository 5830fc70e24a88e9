#!/usr/bin/env python3
"""group_test.py [CHECK...]: shared_limit, one cap shared by a group of
processes, checked by what the processes and the device observe.

Runs several tests/e2e/e2e_group processes at once under libcudalloc.so,
against the mock driver with MOCKCUDA_SHARED_MEM, so that they share one
device as the processes of a machine share a GPU: the mock then refuses
past the device's capacity across them and keeps the device's peak in use
across them, which the checks read. Each check uses a group of its own,
whose region (/dev/shm/cudalloc-groups.<uid>/<name>) it removes after.

  churn       8 processes allocating and freeing at random under one cap:
              the device never holds more than the cap across them, every
              byte reads back as written, and nothing stays booked
  give_back   one process caching 64 MiB, another asking 80 MiB under a
              100 MiB cap: the first gives its cache back, the second is
              served
  full        the same with the 64 MiB in use: cuMemGetInfo says the cap and
              what the group leaves; refused with CUDA_ERROR_OUT_OF_MEMORY
              and one line naming the cap, the key and who holds what
  slot        both through the allocator slot (cudalloc_stream_try_malloc):
              served once the other gives back its cache; refused (NULL)
              with the same line, and the slot's own advice names the group
  sigkill     a process booking and giving back in a loop, killed with
              SIGKILL again and again: within a second its bookings are
              gone, the rest of the group goes on, the figures stay whole
  version     a region made by another version: refused with one line
  mode        a region, or its directory, with a wider mode, or a link:
              refused with one line
  owner       a region, or its directory, of another user: refused with one
              line (needs root to make one; skipped otherwise)
  impossible  a region whose figures no process could have written: refused
  cap         the cap is the memory_limit_mb of the process that found the
              group empty; another says so, once
  top         cudalloc top shows the group, its devices and each process's
              part
  fork        a child that never touches CUDA takes nothing and leaves its
              parent's part alone; one that allocates takes an entry of its
              own
  off         without shared_limit nothing is made
  ended       a group whose processes all ended (exited, or SIGKILLed)
              leaves no region once cudalloc top or a process joining any
              group looks; a group with a living process stays
  ended_race  80 short-lived processes of one group, in waves of 4, each
              asking 40 MiB of a 100 MiB cap, while cudalloc top removes
              ended groups without pause: the device never holds more than
              the cap (one region for the group at any time; without the
              gate's check that a joined region is still named, the device
              held 126 MiB in two runs of three)

Environment (tests/e2e/CMakeLists.txt): E2E_GROUP_PROG, E2E_MOCK_DIR,
E2E_PRELOAD, CUDALLOC_COMMAND and CUDALLOC_TOP, as for top_test.py.
"""
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

from leak_report_test import CheckFailed, env_path, expect, main

PROG = env_path("E2E_GROUP_PROG")
MOCK_DIR = env_path("E2E_MOCK_DIR")
PRELOAD = env_path("E2E_PRELOAD")
COMMAND = env_path("CUDALLOC_COMMAND")
TOP = env_path("CUDALLOC_TOP")
MIB = 1 << 20
GROUP_DIR = "/dev/shm/cudalloc-groups.%d" % os.geteuid()
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY


class Member:
    """One e2e_group process of a group, in the background."""

    def __init__(self, tmp, group, cap, *args, conf=""):
        items = [f"memory_limit_mb:{cap}"] if cap else []
        items += [f"shared_limit:{group}"] if group else []
        items += [conf] if conf else []
        env = dict(os.environ, LD_LIBRARY_PATH=MOCK_DIR, LD_PRELOAD=PRELOAD,
                   CUDALLOC_CONF=",".join(items), MOCKCUDA_DEVICES="1",
                   MOCKCUDA_MEM_MB="4096", MOCKCUDA_SHARED_MEM=os.path.join(tmp, "gpu"),
                   ASAN_OPTIONS="detect_leaks=0")
        for key in ("E2E_GROUP_PROG", "CUDALLOC_TOP"):
            env.pop(key, None)
        self.args = args
        self.conf = env["CUDALLOC_CONF"]
        self.proc = subprocess.Popen([PROG, *args], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)
        self.pid = self.proc.pid
        self.out, self.err = "", ""

    def line(self, prefix, timeout=10):
        """The next line of stdout starting with `prefix`, waiting for it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    break
                self.out += line
                if line.startswith(prefix):
                    return line.strip()
        raise CheckFailed(f"pid {self.pid}: no line '{prefix}...' within {timeout} s", [self])

    def go(self):
        """The line it waits for: it frees what it holds and ends."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60):
        out, err = self.proc.communicate(timeout=timeout)
        self.out += out
        self.err += err
        return self.proc.returncode

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def describe(self):
        return "\n".join([f"  run: CUDALLOC_CONF={self.conf} e2e_group {' '.join(self.args)}"
                          f"  pid {self.pid}, exit {self.proc.returncode}"] +
                         ["  | " + l for l in (self.out + self.err).splitlines()[-20:]])


class Text:
    """Something printed, for a failure's report."""

    def __init__(self, title, text):
        self.title, self.text = title, text

    def describe(self):
        return "\n".join([f"  --- {self.title}"] + ["  | " + l for l in self.text.splitlines()])


def group_name(check):
    return "t%d-%s" % (os.getpid(), check)


def region_path(group):
    return os.path.join(GROUP_DIR, group)


def remove_region(group):
    try:
        os.unlink(region_path(group))
    except FileNotFoundError:
        pass


def mock_peak(tmp):
    """The most device 0 ever held across the processes (mockcuda_gpu.c)."""
    with open(os.path.join(tmp, "gpu"), "rb") as f:
        data = f.read(16)
    expect(data[:8] == b"mockgpu1", "the mock's shared file has no header")
    return struct.unpack_from("<Q", data, 8)[0]


def size_of(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


def top_text():
    env = dict(os.environ, CUDALLOC_TOP=TOP)
    r = subprocess.run(["sh", COMMAND, "top", "--once"], env=env, capture_output=True,
                       text=True, timeout=30)
    return r.stdout + r.stderr


DEVICE = re.compile(r"^  (GPU-[0-9a-f-]{36}) +([0-9.]+ \S+) +([0-9.]+ \S+) +([0-9.]+ \S+)$")
PROC = re.compile(r"^ +(\d+) (\S+) +([0-9.]+ \S+) +(\S+(?: \S+)?)(  .*)?$")


def top_group(group):
    """What cudalloc top shows of `group`: (header, [device rows with their
    process rows]), or None; and the whole text."""
    text = top_text()
    lines = text.splitlines()
    head = f"shared_limit:{group} - "
    for i, line in enumerate(lines):
        if not line.startswith(head):
            continue
        devices = []
        for row in lines[i + 1:]:
            if row.startswith("shared_limit:") or not row.strip():
                break
            m = DEVICE.match(row)
            if m:
                devices.append({"uuid": m.group(1), "held": size_of(m.group(2)),
                                "cached": size_of(m.group(3)), "room": size_of(m.group(4)),
                                "procs": {}})
                continue
            m = PROC.match(row)
            if m and devices:
                devices[-1]["procs"][int(m.group(1))] = {
                    "command": m.group(2), "held": size_of(m.group(3)),
                    "ended": m.group(2) == "(ended)"}
        return line, devices, text
    return None, [], text


def while_held(tmp, group, held, asked, cap=100, asked_cap=None):
    """Runs the member `asked` to its end while one running `held` waits,
    ready, beside it; then lets that one end too. Both, finished."""
    first = Member(tmp, group, cap, *held)
    first.line("ready")
    second = Member(tmp, group, asked_cap or cap, *asked)
    second.finish()
    first.go()
    first.finish()
    return first, second


def wait_until(cond, timeout, step=0.05):
    """How long `cond` took to hold, or None past `timeout` seconds."""
    start = time.time()
    while time.time() - start < timeout:
        if cond():
            return time.time() - start
        time.sleep(step)
    return None


def refusal_lines(text):
    return [l for l in text.splitlines() if "out of memory:" in l and "shared_limit:" in l]


# ---- the checks ---------------------------------------------------------------

def check_churn(tmp):
    group, cap, n = group_name("churn"), 96, 8
    try:
        members = [Member(tmp, group, cap, "churn", str(seed), "400") for seed in range(1, n + 1)]
        codes = [m.finish(timeout=120) for m in members]
        for m, rc in zip(members, codes):
            expect(rc == 0 and "ops=400" in m.out, f"pid {m.pid} exit {rc}", m)
        refused = sum(int(re.search(r"refused=(\d+)", m.out).group(1)) for m in members)
        peak = mock_peak(tmp)
        expect(peak <= cap * MIB, f"the device held {peak / MIB:.1f} MiB at once across the "
               f"group, past its cap of {cap} MiB", *members)
        expect(peak > cap * MIB // 2 and refused > 0,
               f"the group never came near its cap (peak {peak / MIB:.1f} MiB, {refused} "
               "refusals): the check proves nothing", *members)
        for m in members:
            for line in refusal_lines(m.err):
                expect(f"shared_limit:{group}" in line and f"{cap}.0 MiB per device" in line,
                       f"refusal line: {line}", m)
        # Nothing stays booked: a process joining now takes back whatever the
        # ended ones held, and is served the whole cap.
        last = Member(tmp, group, cap, "need", str(cap - 2))
        last.finish()
        expect("rc=0" in last.out, "the whole cap, asked after all had ended, was refused", last)
        return (f"{n} processes, 400 operations each, {refused} refusals at the cap; the device "
                f"peaked at {peak / MIB:.0f} MiB of a {cap} MiB cap; every byte read back; "
                f"then the whole cap served to one process")
    finally:
        remove_region(group)


def check_give_back(tmp):
    group = group_name("give_back")
    try:
        holder, asker = while_held(tmp, group, ("hold", "64"), ("need", "80"))
        m = re.search(r"rc=(-?\d+) ms=(\d+)", asker.out)
        expect(m and m.group(1) == "0", "80 MiB under a 100 MiB cap with 64 MiB cached by "
               "another process: refused", holder, asker)
        r = re.search(r"reserved=(\d+)", holder.out)
        expect(r and int(r.group(1)) < 64 * MIB,
               "the holder still reserves its cache", holder, asker)
        expect(not refusal_lines(asker.err + holder.err), "a refusal was said", holder, asker)
        return (f"80 MiB served in {m.group(2)} ms once the other process gave back its 64 MiB "
                f"cache (it reserves {int(r.group(1)) // MIB} MiB after)")
    finally:
        remove_region(group)


def check_full(tmp):
    group = group_name("full")
    try:
        keeper, asker = while_held(tmp, group, ("keep", "64"), ("need", "80"))
        expect(f"rc={OOM} " in asker.out, "80 MiB past the cap not refused with "
               "CUDA_ERROR_OUT_OF_MEMORY", keeper, asker)
        expect(f"free={28 * MIB} total={100 * MIB}" in asker.out, "cuMemGetInfo does not "
               "answer for the group (want free 28 MiB of a total of 100 MiB)", keeper, asker)
        lines = refusal_lines(asker.err)
        expect(len(lines) == 1, f"{len(lines)} refusal lines, want 1", keeper, asker)
        line = lines[0]
        for want in (f"shared_limit:{group}", "100.0 MiB per device", "memory_limit_mb",
                     "80.0 MiB asked", f"pid {keeper.pid} (e2e_group) 72.0 MiB"):
            expect(want in line, f"the refusal line names no '{want}': {line}", keeper, asker)
        expect(not refusal_lines(keeper.err), "the keeper said a refusal", keeper)
        return "refused with CUDA_ERROR_OUT_OF_MEMORY and: " + line.split("cudalloc: ", 1)[-1]
    finally:
        remove_region(group)


def check_slot(tmp):
    group = group_name("slot")
    try:
        holder, asker = while_held(tmp, group, ("hold", "64"), ("slot", "80"))
        expect("rc=0 " in asker.out, "80 MiB through the slot, 64 MiB cached by another "
               "process: refused", holder, asker)
        keeper, refused = while_held(tmp, group, ("keep", "64"), ("slot", "80"))
        expect(f"rc={OOM} " in refused.out, "80 MiB past the cap through the slot: served",
               keeper, refused)
        lines = refusal_lines(refused.err)
        advice = [l for l in refused.err.splitlines() if "what would help:" in l]
        expect(len(lines) == 1 and f"pid {keeper.pid} (e2e_group) 72.0 MiB" in lines[0],
               f"the group's refusal line: {lines}", keeper, refused)
        expect(len(advice) == 1 and "processes of shared_limit hold its cap" in advice[0]
               and "(the allocator slot)" in refused.err,
               f"the slot's out-of-memory report advises: {advice}", keeper, refused)
        return "served once the other gave back its cache; past the cap, NULL and: " + \
            advice[0].split("cudalloc: ", 1)[-1]
    finally:
        remove_region(group)


def check_sigkill(tmp):
    group, cap = group_name("sigkill"), 64
    rng = random.Random(os.getpid())
    try:
        keeper = Member(tmp, group, cap, "keep", "16")
        keeper.line("ready")
        slowest = 0.0
        for round_ in range(12):
            victim = Member(tmp, group, cap, "cycle")
            victim.line("cycling")
            time.sleep(rng.uniform(0.05, 0.3))
            victim.kill()
            killed_at = time.time()

            def gone():
                _, devices, _ = top_group(group)
                procs = devices[0]["procs"] if devices else {}
                return victim.pid not in procs and devices and devices[0]["held"] == 18 * MIB

            took = wait_until(gone, 3)
            header, devices, text = top_group(group)
            expect(took is not None and time.time() - killed_at <= 1.5,
                   f"round {round_}: the killed process's bookings still stand "
                   f"{time.time() - killed_at:.2f} s after SIGKILL", keeper, victim,
                   Text("cudalloc top", text))
            slowest = max(slowest, took)
        # The rest of the group goes on, with the whole room the dead left.
        asker = Member(tmp, group, cap, "need", str(cap - 18 - 2))
        asker.finish()
        expect("rc=0" in asker.out, "after the kills, the room left is refused", keeper, asker)
        keeper.go()
        expect(keeper.finish() == 0, "the keeper failed", keeper)
        return (f"12 processes killed while booking: each one's bookings gone from the group "
                f"within {slowest:.2f} s at most, while another process held its part; then "
                f"the room they left served")
    finally:
        remove_region(group)


def make_region(tmp, group, cap=100):
    """A region as the library makes it: a process of the group ran."""
    m = Member(tmp, group, cap, "need", "4")
    m.finish()
    expect(os.path.exists(region_path(group)), "no region was made", m)
    return m


def refused_once(tmp, group, *wants):
    """A process of the group under a region it must refuse: served under
    its own cap, having said so in exactly one line."""
    m = Member(tmp, group, 100, "need", "8")
    m.finish()
    lines = [l for l in m.err.splitlines() if "region refused" in l]
    expect("rc=0" in m.out, "a process with a refused region was not served", m)
    expect(len(lines) == 1, f"{len(lines)} 'region refused' lines, want 1", m)
    for want in wants:
        expect(want in lines[0], f"the line names no '{want}': {lines[0]}", m)
    expect("memory_limit_mb=100 caps this process alone" in lines[0],
           f"the line says no fallback: {lines[0]}", m)
    return lines[0].split("cudalloc: ", 1)[-1]


def patch(path, offset, fmt, value):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))


def check_version(tmp):
    group = group_name("version")
    try:
        make_region(tmp, group)
        path = region_path(group)
        patch(path, 16, "<I", 2)  # the layout version, where every version keeps it
        before = open(path, "rb").read()
        line = refused_once(tmp, group, "another version of cudalloc", "layout 2")
        expect(open(path, "rb").read() == before, "the region of another version was written")
        return line
    finally:
        remove_region(group)


def refused_while(tmp, group, change, undo, *wants):
    """refused_once with the region changed by change() meanwhile; undo()
    puts it back."""
    change()
    try:
        return refused_once(tmp, group, *wants)
    finally:
        undo()


def check_mode(tmp):
    group = group_name("mode")
    try:
        make_region(tmp, group)
        path = region_path(group)
        said = [refused_while(tmp, group, lambda: os.chmod(path, 0o644),
                              lambda: os.chmod(path, 0o600), "mode 0644", "wanted uid"),
                refused_while(tmp, group, lambda: os.chmod(GROUP_DIR, 0o755),
                              lambda: os.chmod(GROUP_DIR, 0o700),
                              "not a directory of this user's alone", "mode 0755")]
        os.unlink(path)
        os.symlink(os.path.join(tmp, "elsewhere"), path)
        said.append(refused_once(tmp, group, "a symbolic link"))
        expect(not os.path.exists(os.path.join(tmp, "elsewhere")),
               "a file was made through the link")
        return "; ".join(said)
    finally:
        remove_region(group)


def check_owner(tmp):
    group = group_name("owner")
    if os.geteuid() != 0:
        print("SKIP group owner: making a file of another user needs root")
        sys.exit(77)
    try:
        make_region(tmp, group)
        path = region_path(group)
        return "; ".join([
            refused_while(tmp, group, lambda: os.chown(path, 65534, -1),
                          lambda: os.chown(path, 0, -1), "owner uid 65534"),
            refused_while(tmp, group, lambda: os.chown(GROUP_DIR, 65534, -1),
                          lambda: os.chown(GROUP_DIR, 0, -1),
                          "not a directory of this user's alone", "owner uid 65534")])
    finally:
        remove_region(group)


def check_impossible(tmp):
    group = group_name("impossible")
    said = []
    try:
        make_region(tmp, group)
        path = region_path(group)
        good = open(path, "rb").read()
        patch(path, 40, "<Q", 4096)  # a cap below one segment
        said.append(refused_once(tmp, group, "impossible figures"))
        with open(path, "wb") as f:
            f.write(good)
        patch(path, 28, "<I", 7)  # a table of 7 devices: not this layout's
        said.append(refused_once(tmp, group, "impossible figures", "7 devices"))
        with open(path, "wb") as f:
            f.write(good[:1000])
        os.chmod(path, 0o600)
        said.append(refused_once(tmp, group, "impossible size"))
        return "; ".join(said)
    finally:
        remove_region(group)


def check_cap(tmp):
    group = group_name("cap")
    try:
        first, second = while_held(tmp, group, ("keep", "16"), ("need", "90"), asked_cap=200)
        notes = [l for l in second.err.splitlines() if "the group's cap is" in l]
        expect(len(notes) == 1 and "100.0 MiB" in notes[0] and f"pid {first.pid}" in notes[0]
               and "memory_limit_mb=200 here is not used" in notes[0],
               f"the second process's note on the cap: {notes}", first, second)
        expect(f"rc={OOM} " in second.out, "90 MiB beside 18 MiB under the first process's "
               "100 MiB cap was served", first, second)
        expect(not [l for l in first.err.splitlines() if "cap is" in l],
               "the first process said something of the cap", first)
        # Once every process has ended, the next one's memory_limit_mb is the cap.
        third = Member(tmp, group, 200, "need", "150")
        third.finish()
        expect("rc=0" in third.out and "cap is" not in third.err,
               "a process alone in the group is not held to its own cap", third)
        return notes[0].split("cudalloc: ", 1)[-1]
    finally:
        remove_region(group)


def check_top(tmp):
    group = group_name("top")
    try:
        holder = Member(tmp, group, 100, "hold", "32")
        keeper = Member(tmp, group, 100, "keep", "16")
        holder.line("ready")
        keeper.line("ready")
        # What each caches is said every 100 ms.
        took = wait_until(lambda: (lambda d: d and d[0]["cached"] == 36 * MIB)(
            top_group(group)[1]), 3)
        header, devices, text = top_group(group)
        holder.go()
        keeper.go()
        holder.finish()
        keeper.finish()
        why = [holder, keeper, Text("cudalloc top --once", text)]
        expect(header is not None and "cap 100.0 MiB per device" in header
               and "2 process(es)" in header, f"group header: {header}", *why)
        expect(len(devices) == 1 and took is not None, "want one device, its cache said", *why)
        d = devices[0]
        expect(d["held"] == 54 * MIB and d["room"] == 46 * MIB,
               f"device row: held {d['held'] / MIB} MiB, room {d['room'] / MIB} MiB; want 54, 46",
               *why)
        expect(d["procs"].get(holder.pid, {}).get("held") == 36 * MIB and
               d["procs"].get(keeper.pid, {}).get("held") == 18 * MIB,
               "each process's part: want 36 MiB and 18 MiB", *why)
        return ("the group, its device (held 54 MiB, 36 MiB of it cached, room 46 MiB) and "
                "each process's part")
    finally:
        remove_region(group)


def check_fork(tmp):
    group = group_name("fork")
    try:
        parent = Member(tmp, group, 100, "fork", "16")
        first = parent.line("ready pid=")
        second = parent.line("ready pid=")
        pids = sorted(int(l.split("=")[1]) for l in (first, second))
        _, devices, text = top_group(group)
        parent.go()
        parent.go()
        rc = parent.finish()
        why = [parent, Text("cudalloc top --once", text)]
        expect(rc == 0 and "child status=0" in parent.out, "the parent or its child failed",
               *why)
        expect(devices and sorted(devices[0]["procs"]) == pids and
               all(p["held"] == 18 * MIB for p in devices[0]["procs"].values()),
               f"want parent and child ({pids}) with 18 MiB each", *why)
        return "a child without CUDA took nothing; parent and child each hold their own 18 MiB"
    finally:
        remove_region(group)


def check_off(tmp):
    group = group_name("off")
    m = Member(tmp, None, 100, "need", "8")
    m.finish()
    n = Member(tmp, group, None, "need", "8")
    n.finish()
    expect("rc=0" in m.out and "rc=0" in n.out, "a process was not served", m, n)
    expect(not os.path.exists(region_path(group)), "a region was made without "
           "memory_limit_mb", n)
    expect("has no memory_limit_mb to share" in n.err, "shared_limit without memory_limit_mb "
           "said nothing", n)
    expect("shared_limit" not in m.err, "a process without shared_limit spoke of it", m)
    return "no region without shared_limit, nor without memory_limit_mb (which is said)"


def check_ended(tmp):
    gone, killed, living, other = (group_name(x) for x in ("ended", "killed", "living", "other"))
    try:
        m = Member(tmp, gone, 100, "need", "8")
        m.finish()
        expect(os.path.exists(region_path(gone)), "no region was made", m)
        k = Member(tmp, killed, 100, "keep", "16")
        k.line("ready")
        k.kill()
        h = Member(tmp, living, 100, "keep", "16")
        h.line("ready")
        text = top_text()
        why = [m, k, h, Text("cudalloc top --once", text)]
        expect(not os.path.exists(region_path(gone)) and not os.path.exists(region_path(killed)),
               "an ended group's region is still there after cudalloc top looked", *why)
        expect(f"shared_limit:{gone} " not in text and f"shared_limit:{killed} " not in text,
               "cudalloc top lists an ended group", *why)
        expect(os.path.exists(region_path(living)) and f"shared_limit:{living} - " in text,
               "the living group's region was removed, or is not listed", *why)
        again = Member(tmp, gone, 100, "need", "8")
        again.finish()
        expect(os.path.exists(region_path(gone)) and "rc=0" in again.out,
               "the group could not be made anew", again)
        o = Member(tmp, other, 100, "need", "8")
        o.finish()
        expect(not os.path.exists(region_path(gone)),
               "a process joining another group left an ended group's region", again, o)
        expect(os.path.exists(region_path(living)), "a process joining another group removed "
               "a living group's region", h, o)
        h.go()
        expect(h.finish() == 0, "the living group's process failed", h)
        return ("exited and SIGKILLed groups removed when cudalloc top looked, and when a "
                "process joined another group; the living one kept")
    finally:
        for g in (gone, killed, living, other):
            remove_region(g)


def check_ended_race(tmp):
    group, cap, size = group_name("ended_race"), 100, 40
    members, looks, done = [], [0], threading.Event()

    def look():
        while not done.is_set():
            top_text()
            looks[0] += 1

    looker = threading.Thread(target=look)
    looker.start()
    try:
        for _ in range(20):
            wave = [Member(tmp, group, cap, "need", str(size)) for _ in range(4)]
            for m in wave:
                m.finish()
            members += wave
        done.set()
        looker.join()
        served = sum("rc=0" in m.out for m in members)
        for m in members:
            expect(re.search(r"rc=(0|2) ", m.out), f"pid {m.pid}: neither served nor refused "
                   "for memory", m)
        peak = mock_peak(tmp)
        expect(peak <= cap * MIB, f"the device held {peak / MIB:.0f} MiB at once, past the cap "
               f"of {cap} MiB: two regions of one group", *members)
        expect(served > 0, "no process was served", *members)
        return (f"{len(members)} processes of {size} MiB in waves of 4, {served} served, "
                f"{looks[0]} looks of cudalloc top meanwhile; the device peaked at "
                f"{peak / MIB:.0f} MiB of {cap}")
    finally:
        done.set()
        looker.join()
        remove_region(group)


CHECKS = {
    "churn": check_churn,
    "give_back": check_give_back,
    "full": check_full,
    "slot": check_slot,
    "sigkill": check_sigkill,
    "version": check_version,
    "mode": check_mode,
    "owner": check_owner,
    "impossible": check_impossible,
    "cap": check_cap,
    "top": check_top,
    "fork": check_fork,
    "off": check_off,
    "ended": check_ended,
    "ended_race": check_ended_race,
}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "group"))
