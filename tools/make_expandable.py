#!/usr/bin/env python3
"""Fabricate CUDA memory snapshots with expandable segments (tests/replay/data/exp_*.pickle).

An independent, deliberately small simulator of c10/cuda/CUDACachingAllocator.cpp with
``expandable_segments:True`` (written from the PyTorch source, not from memforensics' model), used
as the oracle of tests/replay/expandable_test.cc. What it copies, by function:

  malloc                 round_size, get_pool (<= 1 MiB small), get_free_block, then alloc_block,
                         then release_cached_blocks + alloc_block (the OOM retry), else an ``oom``
                         entry with device_free and the ROUNDED size (params.size()).
  get_free_block         lower_bound on (stream, size, address) in the pool; with expandable
                         segments a block followed by an unmapped block counts at its expandable
                         size (size + the unmapped block's size) and the search moves on while
                         the next block's expandable size is smaller.
  alloc_found_block      should_split with expandable segments: remainder >= 512 stays free.
  find_expandable_block  the pool's unmapped blocks of the stream in address order; a free block
                         just before one is used too; the first with enough free/unmapped room
                         wins; else a NEW reservation (ExpandableSegment) of 1.125 x device memory
                         in pages (2 MiB small pool, 20 MiB large pool).
  try_allocate_expandable_block / map_block
                         map the candidate (if unmapped), then the next blocks until the block is
                         big enough; every successful map is one ``segment_map`` (the pages
                         mapped, recorded only after the map succeeded); a map that would pass the
                         physical memory limit fails as a whole (cuMemCreate OOM) and is not
                         recorded, leaving the earlier maps of the same malloc mapped and free.
  release_cached_blocks / release_blocks / unmap_block
                         every free mapped block of the large pool, then the small pool, in
                         (stream, size, address) order: its fully free pages are unmapped (one
                         ``segment_unmap`` each); a reservation left as one unmapped block is
                         released (no trace entry).
  free / free_block      free_requested then free_completed (no stream uses), merging with free
                         neighbours of the same mapped state.
  snapshot               one segment per contiguous mapped range (head = a block whose prev is
                         unmapped or absent), segment_type from the pool.

For every scenario NAME it writes NAME.pickle (the snapshot) and NAME.expected.json (what the
simulator knows that the file does not say: "start_reserved", the mapped bytes per device when
the trace begins, so a test can tell a phantom start state from the real one).

Usage:
    python3 tools/make_expandable.py --out tests/replay/data
    python3 tools/make_expandable.py --check [--out tests/replay/data]

Python 3 standard library only; deterministic (fixed seeds, no wall clock).
"""

import argparse
import json
import os
import pickle
import random
import sys
import tempfile

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MIB
K_SMALL_BUFFER = 2 * MIB
K_LARGE_BUFFER = 20 * MIB
T0 = 1767225600000000
VA_BASE = 0x7F0000000000
SIDE_STREAM = 94373802471424


def round_size(n):
    if n < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return K_MIN_BLOCK * ((n + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


class OutOfMemory(Exception):
    pass


class Block:
    __slots__ = ("ptr", "size", "stream", "pool", "allocated", "mapped", "prev", "next", "es",
                 "req", "frames")

    def __init__(self, ptr, size, stream, pool, es, mapped=True):
        self.ptr, self.size, self.stream, self.pool, self.es = ptr, size, stream, pool, es
        self.allocated, self.mapped = False, mapped
        self.prev = self.next = None
        self.req = 0
        self.frames = []


class Reservation:  # ExpandableSegment
    def __init__(self, base, page, npages, stream):
        self.base, self.page, self.npages, self.stream = base, page, npages, stream

    def size(self):
        return self.page * self.npages


class Pool:  # BlockPool
    def __init__(self, is_small):
        self.is_small = is_small
        self.blocks = set()    # free mapped blocks
        self.unmapped = set()  # unmapped blocks

    def sorted_blocks(self):  # BlockComparatorSize
        return sorted(self.blocks, key=lambda b: (b.stream, b.size, b.ptr))


class Allocator:
    def __init__(self, device, total_mem, phys_limit):
        self.device = device
        self.total_mem = total_mem
        self.limit = phys_limit      # bytes of physical pages that can be created
        self.phys = 0
        self.small, self.large = Pool(True), Pool(False)
        self.active = set()
        self.next_va = VA_BASE + device * (1 << 40)
        self.trace = []
        self.t = T0
        self.stats = {"map": 0, "unmap": 0, "oom": 0, "failed_map": 0, "partial": 0,
                      "released": 0, "reservations": 0}
        self.live = {}  # ptr -> block
        self.phys_after = []     # mapped bytes after each trace entry (the start state's reserved)
        self.cut = None          # the trace keeps entries [cut:] (recording started late)
        self.max_entries = None  # the trace keeps the newest entries (ring buffer), see build()
        # For callers that want stacks (tools/make_scenarios.py dp_imbalance_oom): the frames list
        # of the malloc being served (its segment_map/segment_unmap/oom entries get it), and
        # fields added to every entry before "frames" (e.g. compile_context for 2.8-era files).
        self.cur_frames = None
        self.entry_fields = {}

    # -- trace --
    def record(self, action, addr, size, stream, frames=None, **extra):
        self.t += 7
        self.phys_after.append(self.phys)  # map/unmap change self.phys before they record
        e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": self.t}
        e.update(self.entry_fields)
        if frames is None:
            frames = self.cur_frames
        e["frames"] = frames if frames is not None else []
        if action == "oom":
            del e["addr"]
            e["device_free"] = extra["device_free"]
        self.trace.append(e)

    # -- block list helpers --
    @staticmethod
    def splice(b, before, after):
        if before:
            before.next = b
        b.prev = before
        if after:
            after.prev = b
        b.next = after

    def try_merge(self, dst, src, pool):
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next:
                dst.next.prev = dst
        dst.size += src.size
        (pool.blocks if src.mapped else pool.unmapped).discard(src)
        return src.size

    # -- malloc --
    def malloc(self, orig, stream, frames=None):
        """frames: the stack list of this allocation (shared by its alloc/free entries and its
        block in the snapshot); None = an empty stack, as before."""
        self.cur_frames = frames
        size = round_size(orig)
        pool = self.small if size <= K_SMALL_SIZE else self.large
        block = self.get_free_block(pool, size, stream)
        if block is None:
            block = self.try_allocate_expandable_block(pool, size, stream)
            if block is None:
                self.release_cached_blocks()
                block = self.try_allocate_expandable_block(pool, size, stream)
        if block is None:
            self.stats["oom"] += 1
            self.record("oom", 0, size, stream, device_free=max(0, self.limit - self.phys))
            self.cur_frames = None
            raise OutOfMemory()
        # alloc_found_block, should_split with expandable segments
        if block.size - size >= K_MIN_BLOCK:
            rest = Block(block.ptr + size, block.size - size, stream, pool, block.es)
            self.splice(rest, block, block.next)
            block.size = size
            pool.blocks.add(rest)
        block.allocated = True
        block.req = orig
        if frames is not None:
            block.frames = frames
        self.active.add(block)
        self.live[block.ptr] = block
        self.record("alloc", block.ptr, orig, stream)
        self.cur_frames = None
        return block.ptr

    def get_free_block(self, pool, size, stream):
        cands = [b for b in pool.sorted_blocks() if b.stream == stream and b.size >= size]
        if not cands:
            return None

        def exp_size(b):
            return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

        i = 0
        while i + 1 < len(cands) and exp_size(cands[i + 1]) < exp_size(cands[i]):
            i += 1
        b = cands[i]
        pool.blocks.discard(b)
        return b

    def find_expandable_block(self, pool, size, stream):
        def allocatable(b):
            return b is not None and not b.allocated

        def has_room(b):
            n = 0
            while n < size and allocatable(b):
                n += b.size
                b = b.next
            return n >= size

        for c in sorted((u for u in pool.unmapped if u.stream == stream), key=lambda u: u.ptr):
            if allocatable(c.prev):
                c = c.prev
            if has_room(c):
                return c
        page = K_SMALL_BUFFER if pool.is_small else K_LARGE_BUFFER
        npages = -(-(self.total_mem + self.total_mem // 8) // page)
        base = self.next_va
        self.next_va += npages * page + 2 * MIB  # the driver leaves a gap between reservations
        es = Reservation(base, page, npages, stream)
        self.stats["reservations"] += 1
        c = Block(base, es.size(), stream, pool, es, mapped=False)
        pool.unmapped.add(c)
        return c

    def map_block(self, b, size):
        es = b.es
        begin = (b.ptr - es.base) // es.page
        end = -(-(b.ptr + size - es.base) // es.page)
        nbytes = (end - begin) * es.page
        if self.phys + nbytes > self.limit:
            self.stats["failed_map"] += 1
            return False
        self.phys += nbytes
        pool = b.pool
        pool.unmapped.discard(b)
        b.mapped = True
        if nbytes < b.size:
            rest = Block(b.ptr + nbytes, b.size - nbytes, b.stream, pool, es, mapped=False)
            self.splice(rest, b, b.next)
            pool.unmapped.add(rest)
            b.size = nbytes
        mapped_ptr = b.ptr
        self.try_merge(b, b.prev, pool)
        self.try_merge(b, b.next, pool)
        pool.blocks.add(b)
        self.stats["map"] += 1
        self.record("segment_map", mapped_ptr, nbytes, b.stream)
        return True

    def try_allocate_expandable_block(self, pool, size, stream):
        c = self.find_expandable_block(pool, size, stream)
        if not c.mapped and not self.map_block(c, min(c.size, size)):
            return None
        maps = 1
        while c.size < size:
            nc = c.next
            if not self.map_block(nc, min(size - c.size, nc.size)):
                self.stats["partial"] += 1
                return None
            maps += 1
            c = nc
        pool.blocks.discard(c)
        return c

    # -- free --
    def free(self, ptr):
        b = self.live.pop(ptr)
        b.allocated = False
        fr = b.frames if b.frames else None
        self.record("free_requested", b.ptr, b.req, b.stream, frames=fr)
        self.record("free_completed", b.ptr, b.req, b.stream, frames=fr)
        b.frames = []
        self.active.discard(b)
        pool = b.pool
        prev, nxt = b.prev, b.next
        self.try_merge(b, prev, pool)
        self.try_merge(b, nxt, pool)
        b.req = 0
        pool.blocks.add(b)

    # -- release --
    def empty_cache(self):
        self.release_cached_blocks()

    def release_cached_blocks(self):
        for pool in (self.large, self.small):
            to_unmap = [b for b in pool.sorted_blocks() if b.es is not None]
            for b in to_unmap:
                self.unmap_block(b)
                if b.prev is None and b.next is None and not b.mapped:
                    pool.unmapped.discard(b)
                    self.stats["released"] += 1

    def unmap_block(self, b):
        es, pool = b.es, b.pool
        begin = -(-(b.ptr - es.base) // es.page)
        end = (b.ptr + b.size - es.base) // es.page
        if begin >= end:
            return
        pool.blocks.discard(b)
        uptr = es.base + begin * es.page
        usize = (end - begin) * es.page
        before = uptr - b.ptr
        if before > 0:
            f = Block(b.ptr, before, b.stream, pool, es)
            self.splice(f, b.prev, b)
            pool.blocks.add(f)
        after = b.size - before - usize
        if after > 0:
            f = Block(uptr + usize, after, b.stream, pool, es)
            self.splice(f, b, b.next)
            pool.blocks.add(f)
        b.ptr, b.size, b.mapped = uptr, usize, False
        self.try_merge(b, b.prev, pool)
        self.try_merge(b, b.next, pool)
        pool.unmapped.add(b)
        self.phys -= usize
        self.stats["unmap"] += 1
        self.record("segment_unmap", uptr, usize, b.stream)

    # -- snapshot --
    def segments(self):
        heads = [b for b in list(self.small.blocks) + list(self.large.blocks) + list(self.active)
                 if not (b.prev is not None and b.prev.mapped)]
        out = []
        for h in sorted(heads, key=lambda b: b.ptr):
            blocks = []
            total = alloc = req = 0
            b = h
            while b is not None and b.mapped:
                state = "active_allocated" if b.allocated else "inactive"
                blocks.append({"address": b.ptr, "size": b.size,
                               "requested_size": b.req if b.allocated else 0,
                               "state": state,
                               "frames": b.frames if b.allocated and b.frames else []})
                total += b.size
                if b.allocated:
                    alloc += b.size
                    req += b.req
                b = b.next
            out.append({"device": self.device, "address": h.ptr, "total_size": total,
                        "allocated_size": alloc, "active_size": alloc, "requested_size": req,
                        "stream": h.stream, "segment_type": "small" if h.pool.is_small else "large",
                        "segment_pool_id": (0, 0), "is_expandable": True, "frames": [],
                        "blocks": blocks})
        return out


def settings(era=None):
    """allocator_settings with expandable_segments:True; era "2.9"+ adds
    graph_capture_record_stream_reuse (the default None keeps this script's own files as they
    were)."""
    s = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
         "garbage_collection_threshold": 0.0, "expandable_segments": True,
         "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
         "pinned_use_cuda_host_register": False}
    if era is not None and era not in ("2.6", "2.7", "2.8"):
        s["graph_capture_record_stream_reuse"] = False
    s["roundup_power2_divisions"] = {str(1 << i): 0 for i in range(16)}
    return s


def snapshot(allocs):
    traces, segments = [], []
    for a in allocs:
        traces.append(a.trace)
        segments.extend(a.segments())
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings(),
            "external_annotations": []}


# ---------------------------------------------------------------------------------------------
# Workloads.

SMALL_SIZES = [512, 4 * KIB, 8 * KIB + 100, 64 * KIB, 300 * KIB, 1 * MIB]
LARGE_SIZES = [int(1.5 * MIB), 3 * MIB, 7 * MIB + 512, 12 * MIB, 30 * MIB, 45 * MIB + 4096,
               64 * MIB, 100 * MIB, 250 * MIB]


def random_workload(a, rng, steps, streams, small_ratio, flush_every=0, big=None):
    """Random allocs/frees (OOMs are caught, as a training script's except would)."""
    live = []
    for i in range(steps):
        if flush_every and i % flush_every == flush_every - 1:
            a.empty_cache()
        if live and rng.random() < 0.45:
            a.free(live.pop(rng.randrange(len(live))))
            continue
        stream = rng.choice(streams)
        if big and rng.random() < 0.05:
            n = big
        elif rng.random() < small_ratio:
            n = rng.choice(SMALL_SIZES) + rng.randrange(0, 4) * 512
        else:
            n = rng.choice(LARGE_SIZES) + rng.randrange(0, 8) * 512
        try:
            live.append(a.malloc(n, stream))
        except OutOfMemory:
            pass
    return live


def scenario_grow():
    """Large pool, one stream: maps grow one reservation; blocks span later map boundaries."""
    a = Allocator(0, 80 * GIB, 80 * GIB)
    p1 = a.malloc(30 * MIB, 0)          # map 40 MiB
    p2 = a.malloc(15 * MIB, 0)          # 10 MiB free + map 20 MiB: spans the map boundary
    p3 = a.malloc(3 * MIB, 0)
    a.free(p1)
    p4 = a.malloc(25 * MIB, 0)          # best fit in the freed 30 MiB
    p5 = a.malloc(200 * MIB, 0)         # grows the tail block across several pages
    a.free(p3)
    a.free(p2)
    p6 = a.malloc(1200 * MIB, 0)        # a big block over many pages
    a.free(p4)
    p7 = a.malloc(4 * MIB, 0)
    rng = random.Random(11)
    random_workload(a, rng, 300, [0], 0.0)
    # An unmapped gap in the middle (empty_cache), then a malloc larger than the gap: the gap is
    # mapped, merges with the free block after it, and the next unmapped block is mapped too.
    q1 = a.malloc(60 * MIB, 0)
    q2 = a.malloc(60 * MIB, 0)
    q3 = a.malloc(60 * MIB, 0)
    q4 = a.malloc(60 * MIB, 0)
    a.free(q2)
    a.empty_cache()
    a.free(q3)
    a.malloc(150 * MIB, 0)
    del p5, p6, p7, q1, q4
    return [a]


def scenario_pools_streams():
    """Small and large expandable pools on two streams: four reservations."""
    a = Allocator(0, 40 * GIB, 40 * GIB)
    rng = random.Random(22)
    random_workload(a, rng, 900, [0, SIDE_STREAM], 0.5)
    return [a]


def scenario_oom_flush():
    """A physical limit: maps fail (some after an earlier map of the same malloc succeeded), the
    OOM retry's release_cached_blocks unmaps free pages, then the retry or the OOM."""
    a = Allocator(0, 2 * GIB, 1 * GIB)
    # A map that succeeds, then one that fails in the same malloc: the gap [x, x + 100 MiB) is
    # mapped and merges with the free block after it; mapping the tail would pass the limit.
    x = a.malloc(100 * MIB, 0)
    y = a.malloc(100 * MIB, 0)
    z = a.malloc(100 * MIB, 0)
    a.free(y)
    a.empty_cache()
    a.free(z)
    try:
        a.malloc(1500 * MIB, 0)  # map, failed map, release_cached_blocks (unmap), retry, oom
    except OutOfMemory:
        pass
    a.free(x)
    # A map, a failed map, then the retry's release_cached_blocks unmaps the gap AND the free
    # pages of another stream's reservation, and the retry maps again and succeeds.
    x = a.malloc(100 * MIB, 0)
    y = a.malloc(100 * MIB, 0)
    z = a.malloc(100 * MIB, 0)
    w = a.malloc(300 * MIB, SIDE_STREAM)
    a.free(y)
    a.empty_cache()
    a.free(z)
    a.free(w)
    v = a.malloc(700 * MIB, 0)  # map gap, failed map of the tail, unmaps, map, alloc
    a.free(v)
    a.free(x)
    rng = random.Random(33)
    random_workload(a, rng, 1200, [0, SIDE_STREAM], 0.35, flush_every=97, big=700 * MIB)
    return [a]


def scenario_ring():
    """Two devices whose traces are the newest entries of a ring buffer: the start state has
    mapped ranges and live blocks, the trace starts with a segment_map and has unmaps; a map at
    the low end of a reservation that was unmapped before the trace began."""
    out = []
    # Device 0: the low end of the reservation is unmapped before the trace starts; the first
    # entry maps it again and the new block runs on into the range mapped at the start.
    a = Allocator(0, 4 * GIB, 3 * GIB)
    x = a.malloc(200 * MIB, 0)
    y = a.malloc(100 * MIB, 0)
    w = a.malloc(50 * MIB, 0)
    a.free(x)
    a.empty_cache()
    a.free(y)
    a.cut = len(a.trace)
    a.malloc(280 * MIB, 0)
    random_workload(a, random.Random(44), 500, [0], 0.3, flush_every=53, big=900 * MIB)
    del w
    out.append(a)
    # Device 1: the newest entries of a ring buffer, from the first segment_map among them.
    a = Allocator(1, 4 * GIB, 3 * GIB)
    random_workload(a, random.Random(45), 900, [0], 0.3, flush_every=53, big=900 * MIB)
    a.max_entries = 700
    out.append(a)
    return out


def random_config(seed):
    """A random device size, physical limit, 1-3 streams, small/large mix, flush period and big
    requests; 60 % of them keep only the trace from a segment_map in its second half on."""
    r = random.Random(seed)
    total = r.choice([2, 4, 8, 16]) * GIB
    a = Allocator(0, total, int(total * r.uniform(0.3, 1.0)))
    streams = [0, SIDE_STREAM, SIDE_STREAM + 4096][:r.randint(1, 3)]
    random_workload(a, r, r.randint(500, 6000), streams, r.uniform(0, 1),
                    flush_every=r.choice([0, 37, 101, 499]),
                    big=r.choice([None, total // 3, total // 2]))
    if r.random() < 0.6 and len(a.trace) > 10:
        start = r.randrange(len(a.trace) // 2)
        while start < len(a.trace) and a.trace[start]["action"] != "segment_map":
            start += 1
        a.cut = start
    return a


def scenario_random():
    """Two random configurations (seeds 1 and 25 of random_config) where a reservation's unknown
    end matters: a new reservation begins inside the unmapped tail the model guessed for an older
    one (the model cuts it there and bounds later reservations of the kind)."""
    a, b = random_config(1), random_config(25)
    b.device = 1  # segments() writes the device; addresses stay those of device 0's VA range
    return [a, b]


SCENARIOS = {
    "exp_grow": scenario_grow,
    "exp_pools_streams": scenario_pools_streams,
    "exp_oom_flush": scenario_oom_flush,
    "exp_ring": scenario_ring,
    "exp_random": scenario_random,
}


def trimmed_start(trace, max_entries):
    """Index of the first kept entry that is a segment_map, so the kept trace starts with one."""
    start = max(0, len(trace) - max_entries)
    while start < len(trace) and trace[start]["action"] != "segment_map":
        start += 1
    return start


def build(name):
    allocs = SCENARIOS[name]()
    expected = {"start_reserved": []}
    for a in allocs:
        start = 0
        if a.cut is not None:
            start = a.cut
        elif a.max_entries is not None:
            start = trimmed_start(a.trace, a.max_entries)
        expected["start_reserved"].append(a.phys_after[start - 1] if start > 0 else 0)
        a.trace = a.trace[start:]
    return allocs, snapshot(allocs), expected


def describe(name, allocs):
    lines = []
    for a in allocs:
        acts = {}
        for e in a.trace:
            acts[e["action"]] = acts.get(e["action"], 0) + 1
        lines.append("%s device %d: %s; %s" % (name, a.device, a.stats,
                                                 ", ".join("%s=%d" % kv for kv in sorted(acts.items()))))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "replay", "data"))
    ap.add_argument("--check", action="store_true",
                    help="fail when a committed file differs from what this script generates")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    bad = 0
    if not args.check:
        os.makedirs(args.out, exist_ok=True)
    for name in SCENARIOS:
        allocs, obj, expected = build(name)
        if args.verbose:
            print("\n".join(describe(name, allocs)))
        outputs = {name + ".pickle": pickle.dumps(obj, protocol=4),
                   name + ".expected.json": (json.dumps(expected, indent=1, sort_keys=True)
                                             + "\n").encode()}
        for fname, data in outputs.items():
            path = os.path.join(args.out, fname)
            if args.check:
                try:
                    with open(path, "rb") as f:
                        same = f.read() == data
                except OSError:
                    same = False
                if not same:
                    print("%s: differs from what tools/make_expandable.py generates" % path)
                    bad += 1
            else:
                with open(path, "wb") as f:
                    f.write(data)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
