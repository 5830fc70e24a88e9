"""pytorch_policy: the memory PyTorch's caching allocator's placement would
reserve for a recorded trace (tests/bench/traces), the peer bench_replay's
figures are read against. A model of its documented rules, our own code:

- requests rounded to 512 B; up to 1 MiB from the small pool's 2 MiB
  segments, under 10 MiB from 20 MiB segments, larger ones a segment of
  their own, rounded to 2 MiB;
- the best fit among the pool's free blocks, by size then address;
- a block splits when the rest is at least 512 B (small pool) or over
  1 MiB (large pool); freed blocks merge with free neighbours at once;
- nothing is given back (no memory limit on the replay: no out-of-memory).

One stream, every free at once: on the single-stream traces, what PyTorch
does with a default `PYTORCH_CUDA_ALLOC_CONF`. Checked against the H200:
gpt2-step gives 7.527 GiB, PyTorch's `max_memory_reserved` there 7.53 GiB
(docs/BENCHMARKS.md).

Usage: pytorch_policy.py TRACE.trace.gz ...
Prints per trace:
  pytorch_policy: <trace> peak requested <GiB> GiB, reserved <GiB> GiB, overhead <x>%
"""
import bisect
import gzip
import os
import sys

MIB = 1 << 20
SMALL_REQUEST = MIB       # the small pool's requests
MEDIUM_REQUEST = 10 * MIB  # below this, 20 MiB segments
ROUND_LARGE = 2 * MIB


class Block:
    __slots__ = ("addr", "size", "free", "prev", "next", "small")


def segment_size(size):
    if size <= SMALL_REQUEST:
        return 2 * MIB
    if size < MEDIUM_REQUEST:
        return 20 * MIB
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class Pools:
    def __init__(self):
        self.free = {True: [], False: []}  # per pool: sorted (size, addr, block)
        self.next_addr = 1 << 40
        self.reserved = self.reserved_peak = 0

    def insert(self, b):
        bisect.insort(self.free[b.small], (b.size, b.addr, b))

    def remove(self, b):
        pool = self.free[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr))
        del pool[i]

    def new_segment(self, size, small):
        b = Block()
        b.addr, b.size, b.free, b.prev, b.next, b.small = (
            self.next_addr, segment_size(size), True, None, None, small)
        self.next_addr += b.size + (1 << 30)  # segments never touch
        self.reserved += b.size
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        return b

    def alloc(self, request):
        size = max(512, (request + 511) // 512 * 512)
        small = size <= SMALL_REQUEST
        pool = self.free[small]
        i = bisect.bisect_left(pool, (size, 0))
        if i < len(pool):
            b = pool[i][2]
            del pool[i]
        else:
            b = self.new_segment(size, small)
        rest = b.size - size
        if rest >= 512 if small else rest > MIB:
            r = Block()
            r.addr, r.size, r.free, r.small = b.addr + size, rest, True, small
            r.prev, r.next = b, b.next
            if b.next:
                b.next.prev = r
            b.next, b.size = r, size
            self.insert(r)
        b.free = False
        return b

    def release(self, b):
        b.free = True
        p = b.prev
        if p and p.free:
            self.remove(p)
            b.addr, b.size, b.prev = p.addr, b.size + p.size, p.prev
            if p.prev:
                p.prev.next = b
        n = b.next
        if n and n.free:
            self.remove(n)
            b.size, b.next = b.size + n.size, n.next
            if n.next:
                n.next.prev = b
        self.insert(b)


def replay(path):
    pools, live = Pools(), {}
    requested = requested_peak = 0
    with gzip.open(path, "rt") as f:
        for line in f:
            op = line.split()
            if op[0] == "a":
                size = int(op[2])
                live[op[1]] = (pools.alloc(size), size)
                requested += size
                requested_peak = max(requested_peak, requested)
            elif op[0] == "f":
                block, size = live.pop(op[1])
                requested -= size
                pools.release(block)
    return requested_peak, pools.reserved_peak


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: pytorch_policy.py TRACE.trace.gz ...")
    for path in sys.argv[1:]:
        requested, reserved = replay(path)
        name = os.path.basename(path).split(".")[0]
        print("pytorch_policy: %s peak requested %.3f GiB, reserved %.3f GiB, "
              "overhead %.1f%%" % (name, requested / 2**30, reserved / 2**30,
                                   100.0 * (reserved / requested - 1)))


if __name__ == "__main__":
    main()
