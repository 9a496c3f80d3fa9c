#!/usr/bin/env python3
"""make_hostile.py OUT_DIR: writes the hostile-input corpus of issues 11 and 30, deterministically.

One file per shape of classes 1-9 of issue 11 (each class at least two shapes) and of class 10
(issue 30: profiler traces, memory timelines, native traces within budget), as hand-written
pickles (raw opcodes where Python's pickler cannot produce the shape), JSON, memory_viz HTML, gzip
and native traces (docs/trace-format.md, written here byte by byte, CRC-32C included). Special files
(/dev/zero, /dev/urandom, a FIFO with no writer) and hostile outputs are the runner's
(tests/hostile/run_hostile.py), not files here.

Large files are sparse (a small valid prefix, then a hole made with truncate), so a 1 GiB input
costs no disk. Everything else together is under 300 MB. Fixed seeds; no timestamps: two runs
write identical bytes.

Used as a module by the runner: generate(out_dir) returns the list of Entry (name, class, note,
flags). Run alone, it writes the files and prints that list.
"""

import copy
import glob
import json
import os
import pickle
import random
import struct
import sys
from dataclasses import dataclass, field

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
U64 = (1 << 64) - 1

REAL_DIR_DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "snapshots-real")


@dataclass
class Entry:
    name: str  # file name inside OUT_DIR
    cls: int  # issue 11 class (1-9), 10: issue 30 (the third round's readers)
    note: str  # what the shape is
    # flags the runner understands:
    #   "derive_bin": also run every command on `convert -o X.bin` of this input
    #   "flag_wrong": analyze --json must refuse it (exit 2) or say so (an anomaly of severity error
    #                 or an input warning): class 6, numbers that would otherwise be silently wrong
    #   "budget": class 10, sized to show time and memory out of proportion; a sanitizer build
    #             runs only `analyze --json` and `convert -o X.bin` on it
    flags: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# A hand pickler: protocol 4 opcodes, no memo unless asked (Put/Get), so that every shape is exact.


class Raw:
    """Bytes copied into the pickle as they are."""

    def __init__(self, b):
        self.b = b


class RawStr:
    """A BINUNICODE whose payload is the given bytes (may be invalid UTF-8)."""

    def __init__(self, b):
        self.b = b


class OneByOne(list):
    """A list written as EMPTY_LIST then one APPEND per item (what the old pickler wrote)."""


class Put:
    """Writes obj, then LONG_BINPUT idx (leaves obj on the stack)."""

    def __init__(self, obj, idx):
        self.obj, self.idx = obj, idx


class Get:
    """LONG_BINGET idx."""

    def __init__(self, idx):
        self.idx = idx


def _enc(o, out):
    if isinstance(o, Raw):
        out += o.b
    elif isinstance(o, RawStr):
        out += b"X" + struct.pack("<I", len(o.b)) + o.b
    elif isinstance(o, Put):
        _enc(o.obj, out)
        out += b"r" + struct.pack("<I", o.idx)
    elif isinstance(o, Get):
        out += b"j" + struct.pack("<I", o.idx)
    elif o is None:
        out += b"N"
    elif o is True:
        out += b"\x88"
    elif o is False:
        out += b"\x89"
    elif isinstance(o, int):
        if 0 <= o < 256:
            out += b"K" + bytes([o])
        elif -(1 << 31) <= o < (1 << 31):
            out += b"J" + struct.pack("<i", o)
        else:
            n = (o.bit_length() + 8) // 8
            out += b"\x8a" + bytes([n]) + o.to_bytes(n, "little", signed=True)
    elif isinstance(o, float):
        out += b"G" + struct.pack(">d", o)
    elif isinstance(o, str):
        b = o.encode("utf-8", "surrogatepass")
        out += b"X" + struct.pack("<I", len(b)) + b
    elif isinstance(o, OneByOne):
        out += b"]"
        for x in o:
            _enc(x, out)
            out += b"a"
    elif isinstance(o, list):
        out += b"]"
        for i in range(0, len(o), 1000):
            out += b"("
            for x in o[i:i + 1000]:
                _enc(x, out)
            out += b"e"
    elif isinstance(o, tuple):
        out += b"("
        for x in o:
            _enc(x, out)
        out += b"t"
    elif isinstance(o, dict):
        out += b"}"
        if o:
            out += b"("
            for k, v in o.items():
                _enc(k, out)
                _enc(v, out)
            out += b"u"
    else:
        raise TypeError(type(o))


class StrMemo:
    """Strings defined once in a prefix (LONG_BINPUT, POP) and referenced by LONG_BINGET: lets the
    generator write millions of frames quickly, as Python's pickler would (shared strings)."""

    def __init__(self, first=1):
        self.ids = {}
        self.prefix = bytearray()
        self.next = first

    def get(self, text):
        ref = self.ids.get(text)
        if ref is None:
            i = self.next
            self.next += 1
            _enc(text, self.prefix)
            self.prefix += b"r" + struct.pack("<I", i) + b"0"
            ref = self.ids[text] = b"j" + struct.pack("<I", i)
        return ref

    def frames(self, specs):
        """A frames list (name, filename, line) as one Raw: EMPTY_LIST, then APPENDS per 1000."""
        g = self.get
        kf, kl, kn = g("filename"), g("line"), g("name")
        parts = [b"]"]
        for i, (name, filename, line) in enumerate(specs):
            if i % 1000 == 0:
                parts.append(b"e(" if i else b"(")
            lb = b"K" + bytes([line]) if 0 <= line < 256 else b"J" + struct.pack("<i", line)
            parts.append(b"}(" + kf + g(filename) + kl + lb + kn + g(name) + b"u")
        if specs:
            parts.append(b"e")
        return Raw(b"".join(parts))


def hand_pickle(obj, prefix=b""):
    out = bytearray(b"\x80\x04")
    out += prefix
    _enc(obj, out)
    out += b"."
    return bytes(out)


def py_pickle(obj):
    return pickle.dumps(obj, protocol=4)


# ---------------------------------------------------------------------------------------------
# memory_viz-shaped snapshot pieces.

FR = [{"filename": "train.py", "line": 10, "name": "step"}, {"filename": "model.py", "line": 42, "name": "forward"}]


def frame(name="forward", filename="model.py", line=42):
    return {"filename": filename, "line": line, "name": name}


def blk(addr, size, state="active_allocated", requested=None, frames=None):
    return {"address": addr, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": FR if frames is None else frames}


def seg(addr, total, blocks=None, device=0, expandable=False, stream=0, stype="large"):
    if blocks is None:
        blocks = [blk(addr, total, "inactive", 0, [])]
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    req = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": addr, "total_size": total, "allocated_size": alloc,
            "active_size": alloc, "requested_size": req, "stream": stream, "segment_type": stype,
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": [], "blocks": blocks}


def ev(action, addr, size, t=None, frames=None, stream=0):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "frames": FR if frames is None else frames}
    if t is not None:
        e["time_us"] = t
    return e


def snap(segments, traces, annotations=None):
    d = {"segments": segments, "device_traces": traces}
    if annotations is not None:
        d["external_annotations"] = annotations
    return d


def small_valid(frames=None, t0=1000):
    """A consistent one-segment run: segment_alloc, two allocs, one freed."""
    base = 0x7F0000000000
    fr = FR if frames is None else frames
    blocks = [blk(base, 1 * MiB, frames=fr), blk(base + MiB, MiB, "inactive", 0, [])]
    trace = [ev("segment_alloc", base, 2 * MiB, t0, fr), ev("alloc", base, MiB, t0 + 1, fr),
             ev("alloc", base + MiB, MiB, t0 + 2, fr), ev("free_requested", base + MiB, MiB, t0 + 3, fr),
             ev("free_completed", base + MiB, MiB, t0 + 4, fr)]
    return snap([seg(base, 2 * MiB, blocks)], [trace])


# ---------------------------------------------------------------------------------------------
# Native trace writer (docs/trace-format.md).


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_T = _crc_table()
_ZERO_CRC = {}


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    t = _CRC_T
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def var(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def svar(v):
    return var(((v << 1) ^ (v >> 63)) & U64)


def tlv_var(tag, v):
    return var(tag << 1) + var(v)


def tlv_bytes(tag, b):
    return var(tag << 1 | 1) + var(len(b)) + b


class Native:
    def __init__(self, meta_extra=b""):
        h = bytearray(b"\x89MFTRACE" + struct.pack("<HHIIQ", 1, 0, 32, 0, 1700000000000000))
        h += struct.pack("<I", crc32c(h))
        self.out = h
        self.chunks = 0
        self.events = 0
        self.per_device = {}
        self.chunk(1, tlv_bytes(1, b"make_hostile.py") + tlv_bytes(2, b"json") + meta_extra)

    def chunk(self, ctype, payload, codec=0):
        h = struct.pack("<BBHI", ctype, codec, 0, len(payload))
        self.out += h + struct.pack("<I", crc32c(payload, crc32c(h))) + payload
        self.chunks += 1

    def strings(self, first, strs):
        p = var(first) + var(len(strs))
        for s in strs:
            p += var(len(s)) + s
        self.chunk(2, p)

    def frames(self, first, frames):  # (file id, name id, line)
        p = bytearray(var(first) + var(len(frames)))
        pf = pn = 0
        for f, n, line in frames:
            p += svar(f - pf) + svar(n - pn) + var(line + 1)
            pf, pn = f, n
        self.chunk(3, bytes(p))

    def stacks(self, first, nodes):  # (parent id, frame id)
        p = bytearray(var(first) + var(len(nodes)))
        pframe = 0
        for i, (parent, fr) in enumerate(nodes):
            p += var(first + i - parent) + svar(fr - pframe)
            pframe = fr
        self.chunk(4, bytes(p))

    @staticmethod
    def records(evs):
        """evs: (action, device, addr, size, stack, time_us) -> record bytes (no count)."""
        p = bytearray()
        dev = stack = addr = 0
        t = 0
        for action, d, a, size, st, tus in evs:
            head = action
            if d != dev:
                head |= 0x10
            if st == stack:
                head |= 0x80
            p.append(head)
            if d != dev:
                p += var(d)
                dev = d
            if st != stack:
                p += svar(st - stack)
                stack = st
            p += svar(a - addr) + var(size) + svar((tus + 1) - t)
            addr, t = a, tus + 1
        return p

    def segments(self, segs):
        """segs: (device, addr, total, stack, [(size, stack)]) -> a Segments chunk; blocks are
        active_allocated, packed from the segment's start, requested = size."""
        nblocks = sum(len(b) for *_, b in segs)
        p = bytearray(var(len(segs)) + var(nblocks))
        for d, addr, total, st, blocks in segs:
            used = sum(sz for sz, _ in blocks)
            p += var(d & U64) + var(addr) + var(total) + var(used) + var(used) + var(used)
            p += svar(0) + var(0) + var(0) + var(st) + bytes([1 | 4])
            p += var(len(blocks))
            for sz, bst in blocks:
                p += svar(0) + bytes([0]) + var(sz) + var(bst)
        self.chunk(7, bytes(p))

    def events_chunk(self, evs):
        self.chunk(5, var(len(evs)) + bytes(self.records(evs)))
        self.count(evs)

    def count(self, evs):
        self.events += len(evs)
        for e in evs:
            self.per_device[e[1]] = self.per_device.get(e[1], 0) + 1

    def finish(self, events=None, trailer=True, final_state=False):
        if trailer:
            off = len(self.out)
            per = b"".join(var(d) + var(n) for d, n in sorted(self.per_device.items()))
            p = tlv_var(1, self.events if events is None else events) + tlv_var(2, self.chunks) + tlv_bytes(9, per)
            if final_state:
                p += tlv_var(10, 1)
            self.chunk(15, p)
            self.out += struct.pack("<Q", off) + b"MFTREND\0"
        return bytes(self.out)


def zstd_rle_frame(content_size, head=b"", fill=0):
    """One zstd frame: a raw block holding `head`, then RLE blocks of `fill` up to content_size."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out.append(0xA0)  # single segment, 4-byte frame content size, no checksum, no dictionary
    out += struct.pack("<I", content_size)
    blocks = []
    if head:
        blocks.append((0, len(head), head))
    left = content_size - len(head)
    while left > 0:
        n = min(left, 128 * KiB)
        blocks.append((1, n, bytes([fill])))
        left -= n
    for i, (btype, n, body) in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        out += struct.pack("<I", last | (btype << 1) | (n << 3))[:3] + body
    return bytes(out)


def zstd_skippable(n):
    return struct.pack("<II", 0x184D2A50, n) + bytes(n)


# ---------------------------------------------------------------------------------------------
# The shapes.


def write(out_dir, name, data):
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(data)


def write_sparse(out_dir, name, prefix, total):
    p = os.path.join(out_dir, name)
    with open(p, "wb") as f:
        f.write(prefix)
        f.truncate(total)  # a hole: no disk blocks


def c1_shapes(out, E):
    base = 0x7F0000000000
    s = snap([], [[ev("segment_unmap", 0, 0, None, []), ev("segment_unmap", base, 1, None, [])]])
    write(out, "c1_unmap_zero_2events.pickle", py_pickle(s))
    write(out, "c1_unmap_zero_2events.json", json.dumps(s).encode())
    E += [Entry("c1_unmap_zero_2events.pickle", 1, "2-event trace: segment_unmap addr 0 size 0, then addr 0x7f0000000000 size 1", ["derive_bin"]),
          Entry("c1_unmap_zero_2events.json", 1, "the same 2-event trace as JSON")]
    # One expandable 2 MiB segment with an unmap at address 0 size 0.
    blocks = [blk(base, MiB), blk(base + MiB, MiB, "inactive", 0, [])]
    tr = [ev("segment_map", base, 2 * MiB, 1), ev("alloc", base, MiB, 2), ev("segment_unmap", 0, 0, 3),
          ev("alloc", base + MiB, 4096, 4)]
    write(out, "c1_expandable_unmap_zero.pickle", py_pickle(snap([seg(base, 2 * MiB, blocks, expandable=True)], [tr])))
    E.append(Entry("c1_expandable_unmap_zero.pickle", 1, "expandable 2 MiB segment, segment_unmap at address 0 size 0", ["derive_bin"]))
    # Unmap whose addr + size wraps 2^64.
    tr = [ev("segment_map", base, 2 * MiB, 1), ev("alloc", base, MiB, 2), ev("segment_unmap", U64 - 4095, 2 * MiB, 3),
          ev("alloc", base + MiB, 4096, 4)]
    write(out, "c1_unmap_wraps.pickle", py_pickle(snap([seg(base, 2 * MiB, blocks, expandable=True)], [tr])))
    E.append(Entry("c1_unmap_wraps.pickle", 1, "segment_unmap whose addr+size wraps 2^64", ["derive_bin"]))
    # The same two with the segment only in the final state and the unmap as the whole trace.
    s = snap([seg(base, 2 * MiB, expandable=True)], [[ev("segment_unmap", 0, 0, 1, [])]])
    write(out, "c1_expandable_final_unmap_zero.pickle", py_pickle(s))
    E.append(Entry("c1_expandable_final_unmap_zero.pickle", 1, "final state: one expandable 2 MiB segment; trace: segment_unmap addr 0 size 0", ["derive_bin"]))
    s = snap([seg(base, 2 * MiB, expandable=True)], [[ev("segment_unmap", base + MiB, U64 - base - MiB + 2, 1, [])]])
    write(out, "c1_expandable_final_unmap_wraps.pickle", py_pickle(s))
    E.append(Entry("c1_expandable_final_unmap_wraps.pickle", 1, "final state: one expandable 2 MiB segment; trace: an unmap from its middle whose end wraps 2^64", ["derive_bin"]))
    # Unmap of the middle of a live block, then allocs into the hole.
    tr = [ev("segment_map", base, 4 * MiB, 1), ev("alloc", base, 3 * MiB, 2), ev("segment_unmap", base + MiB, MiB, 3),
          ev("alloc", base + MiB, 512, 4), ev("segment_unmap", base, 4 * MiB, 5), ev("segment_unmap", base, 4 * MiB, 6)]
    write(out, "c1_unmap_inside_live_block.pickle", py_pickle(snap([], [tr])))
    E.append(Entry("c1_unmap_inside_live_block.pickle", 1, "segment_unmap through a live block, twice", ["derive_bin"]))


def c2_shapes(out, E):
    # Frames lists filled one APPEND at a time (each APPEND is a new list state).
    for n, label in ((5000, "90k"), (17000, "300k")):
        # memo 1..5 = the strings, defined once up front (BINPUT, then POP)
        prefix = bytearray()
        for i, text in enumerate(("f.py", "name", "filename", "line", "fn"), 1):
            _enc(text, prefix)
            prefix += b"q" + bytes([i]) + b"0"
        frames = OneByOne(Raw(b"}(h\x03h\x01h\x04K" + bytes([i % 250]) + b"h\x02h\x05u") for i in range(n))
        e = {"action": "alloc", "addr": 0x7F0000000000, "size": 512, "stream": 0, "frames": frames}
        data = hand_pickle(snap([], [[e]]), bytes(prefix))
        write(out, f"c2_frames_one_append_{label}.pickle", data)
        E.append(Entry(f"c2_frames_one_append_{label}.pickle", 2, f"one stack of {n} frames filled one APPEND at a time ({len(data)} bytes)"))
    # The batches of 1000 Python's pickler writes: one 100,000-frame stack of distinct frame dicts.
    frames = [{"filename": "f.py", "line": i % 1000, "name": "fn"} for i in range(100000)]
    write(out, "c2_frames_appends_batches.pickle", py_pickle(snap([], [[ev("alloc", 0x7F0000000000, 512, 1, frames)]])))
    E.append(Entry("c2_frames_appends_batches.pickle", 2, "100,000-frame stack, APPENDS batches of 1000 (Python's pickler)"))
    # Memo grown by LONG_BINPUT strides of 65,536 (47,000 steps: indices up to 3.08e9).
    prefix = b"".join(b"Nr" + struct.pack("<I", i * 65536) + b"0" for i in range(47000))
    write(out, "c2_memo_stride_65536.pickle", hand_pickle(small_valid(), prefix))
    E.append(Entry("c2_memo_stride_65536.pickle", 2, "47,000 LONG_BINPUTs 65,536 apart (memo index up to 3.1e9), then a valid snapshot"))
    prefix = b"Nr\xff\xff\xff\xff0" + b"j\xff\xff\xff\xff0"
    write(out, "c2_memo_one_huge_index.pickle", hand_pickle(small_valid(), prefix))
    E.append(Entry("c2_memo_one_huge_index.pickle", 2, "one LONG_BINPUT/LONG_BINGET at index 2^32-1"))
    # One memoized list referenced 1,000 times (Python's pickler shares it: BINGET per reference).
    rnd = random.Random(11)
    base = 0x7F0000000000
    L = []
    for i in range(1000):
        a = base + i * 4096
        L.append(ev("alloc", a, rnd.randrange(1, 4096), 2 * i))
        L.append(ev("free_requested", a, L[-1]["size"], 2 * i + 1))
    write(out, "c2_memo_list_x1000_device_traces.pickle", py_pickle(snap([], [L] * 1000)))
    E.append(Entry("c2_memo_list_x1000_device_traces.pickle", 2, "one memoized 2,000-event list as 1,000 device traces"))
    S = seg(base, 64 * MiB, [blk(base + i * 65536, 65536, frames=[frame(f"fn{i}")]) for i in range(1024)])
    write(out, "c2_memo_segment_x1000.pickle", py_pickle(snap([S] * 1000, [[]])))
    E.append(Entry("c2_memo_segment_x1000.pickle", 2, "one memoized 1,024-block segment dict listed 1,000 times in segments"))
    F = [frame(f"fn{i}", "deep.py", i) for i in range(1000)]
    tr = []
    for i in range(10000):
        tr.append(ev("alloc", base + i * 512, 512, i, F))
    write(out, "c2_memo_frames_x10000.pickle", py_pickle(snap([], [tr])))
    E.append(Entry("c2_memo_frames_x10000.pickle", 2, "one memoized 1,000-frame list referenced by 10,000 events"))
    # Native: a 100,000-node stack trie chain, every event on a different node.
    n = Native()
    n.strings(1, [b"chain.py", b"link"])
    n.frames(0, [(1, 2, 7)])
    N = 100000
    n.stacks(2, [(1 + i, 0) for i in range(N)])  # node 2+i, parent 1+i (the root for i = 0)
    evs = [(0, 0, base + i * 512, 512, 2 + i, i) for i in range(N)]
    n.events_chunk(evs)
    data = n.finish()
    write(out, "c2_trie_chain_100k.bin", data)
    E.append(Entry("c2_trie_chain_100k.bin", 2, f"native trace: 100,000-node stack trie chain, one alloc per node ({len(data)} bytes)"))
    # Native: a forged trailer event count on a 2.1 MB file (padding: a chunk of unknown type).
    n = Native()
    n.events_chunk([(0, 0, base, 512, 0, 1), (2, 0, base, 512, 0, 2)])
    n.chunk(20, bytes(2100 * KiB))
    write(out, "c2_forged_trailer_count.bin", n.finish(events=1 << 40))
    E.append(Entry("c2_forged_trailer_count.bin", 2, "native trace, 2.1 MB, trailer claims 2^40 events"))
    n = Native()
    n.events_chunk([(0, 0, base, 512, 0, 1)])
    n.per_device[65535] = 1 << 40
    write(out, "c2_forged_trailer_per_device.bin", n.finish(events=(1 << 40) + 1))
    E.append(Entry("c2_forged_trailer_per_device.bin", 2, "native trace, trailer claims 2^40 events on device 65535"))
    # Native: zstd Events chunks at the 256x ratio limit, padded with a skippable frame. Records are
    # five zero bytes (alloc addr 0 size 0): 64 MiB decode to 13.4 M events per chunk.
    n = Native()
    raw = 64 * MiB - 16
    nev = (raw - 4) // 5
    head = var(nev)
    raw = len(head) + nev * 5
    fr = zstd_rle_frame(raw, head, 0)
    stored = raw // 256
    payload = fr + zstd_skippable(stored - len(fr) - 8)
    for _ in range(5):
        n.chunk(5, payload, codec=1)
        n.events += nev
        n.per_device[0] = n.per_device.get(0, 0) + nev
    data = n.finish()
    write(out, "c2_zstd_ratio_padded.bin", data)
    E.append(Entry("c2_zstd_ratio_padded.bin", 2, f"native trace: 5 zstd chunks of 64 MiB at the 256x limit via a skippable frame ({len(data)} bytes, {5 * nev} events)"))
    n = Native()
    fr = zstd_rle_frame(raw, head, 0)
    n.chunk(5, fr, codec=1)
    n.events += nev
    n.per_device[0] = nev
    write(out, "c2_zstd_bomb_unpadded.bin", n.finish())
    E.append(Entry("c2_zstd_bomb_unpadded.bin", 2, "native trace: one zstd chunk of 3 KB that decodes to 64 MiB"))
    # A valid pickle zero-padded to 1 GiB (sparse), and a native trace with a 1 GiB zero tail.
    write_sparse(out, "c2_zero_padded_1g.pickle", py_pickle(small_valid()), GiB)
    E.append(Entry("c2_zero_padded_1g.pickle", 2, "valid pickle followed by zeros up to 1 GiB (sparse)"))
    n = Native()
    n.events_chunk([(0, 0, base, 512, 0, 1)])
    write_sparse(out, "c2_zero_tail_1g.bin", n.finish(trailer=False), GiB)
    E.append(Entry("c2_zero_tail_1g.bin", 2, "native trace without trailer followed by a 1 GiB zero tail (sparse)"))
    write_sparse(out, "c2_zero_padded_1g.json", json.dumps(small_valid()).encode() + b" " * 4096, GiB)
    E.append(Entry("c2_zero_padded_1g.json", 2, "JSON snapshot followed by NUL bytes up to 1 GiB (sparse)"))


def annotations_nested(n):
    ann = []
    for i in range(n):
        ann.append({"device": 0, "stage": "START", "name": f"range{i}", "time_us": i})
    for i in reversed(range(n)):
        ann.append({"device": 0, "stage": "END", "name": f"range{i}", "time_us": 2 * n - i})
    return ann


def events_over_time(n, t0=0, step=2):
    base = 0x7F0000000000
    tr = [ev("segment_alloc", base, 64 * MiB, t0, [])]
    for i in range(n - 1):
        a = base + (i % 1000) * 65536
        tr.append(ev("alloc" if (i // 1000) % 2 == 0 else "free_completed", a, 65536, t0 + 1 + i * step // 2, FR))
    return tr


def c3_shapes(out, E):
    N = 100000
    tr = events_over_time(N, 0, 4)
    write(out, "c3_nested_annotations_100k.pickle", py_pickle(snap([], [tr], annotations_nested(N))))
    E.append(Entry("c3_nested_annotations_100k.pickle", 3, "100,000 nested external_annotations ranges over 100,000 events"))
    ann = []
    for i in range(N):
        ann.append({"device": -1, "stage": "START", "name": f"ProfilerStep#{i}", "time_us": 2 * i})
        ann.append({"device": -1, "stage": "END", "name": f"ProfilerStep#{i}", "time_us": 2 * i + 1})
    write(out, "c3_profiler_steps_100k.pickle", py_pickle(snap([], [tr], ann)))
    E.append(Entry("c3_profiler_steps_100k.pickle", 3, "100,000 ProfilerStep# iterations (device -1) over 100,000 events"))
    ann = [{"device": 0, "stage": "START", "name": "## forward ##", "time_us": i} for i in range(N)]
    write(out, "c3_unclosed_starts_100k.pickle", py_pickle(snap([], [tr], ann)))
    E.append(Entry("c3_unclosed_starts_100k.pickle", 3, "100,000 START annotations without END (each runs to the end)"))


def replicated_real(real_dir, devices=100, per_device=11000):
    paths = sorted(glob.glob(os.path.join(real_dir, "sidsoc12__*.pickle")))
    if not paths:
        return None
    with open(paths[0], "rb") as f:
        s = pickle.load(f)  # plain data (dicts, lists, str, int): safe
    tr = s["device_traces"][0][-per_device:]
    segs, traces = [], []
    for d in range(devices):
        for sg in s["segments"]:
            c = dict(sg)
            c["device"] = d
            segs.append(c)
        traces.append([dict(e) for e in tr])
    out = dict(s)
    out["segments"], out["device_traces"] = segs, traces
    out["external_annotations"] = s.get("external_annotations", [])
    return out


def c4_shapes(out, E, real_dir):
    base = 0x7F0000000000
    r = replicated_real(real_dir)
    if r is not None:
        write(out, "c4_real_x100_devices.pickle", py_pickle(r))
        E.append(Entry("c4_real_x100_devices.pickle", 4, "the largest real snapshot's last 11,000 events replicated over 100 devices (1.1 M events)"))
    tr = [ev("segment_alloc", base, 2 * MiB, 0)]
    for i in range(3000):
        tr.append(ev("alloc", base, 512, 2 * i + 1))
        tr.append(ev("free_completed", base, 512, 2 * i + 2))
    write(out, "c4_alloc_free_loop_6000.pickle", py_pickle(snap([seg(base, 2 * MiB)], [tr])))
    E.append(Entry("c4_alloc_free_loop_6000.pickle", 4, "6,000-event alloc/free loop (identical records)"))
    tr = [ev("segment_alloc", base, 2 * MiB, 0, [])]
    for i in range(100000):
        tr.append(ev("alloc", base, 512, 2 * i + 1, []))
        tr.append(ev("free_completed", base, 512, 2 * i + 2, []))
    write(out, "c4_alloc_free_loop_200k.pickle", py_pickle(snap([seg(base, 2 * MiB)], [tr])))
    E.append(Entry("c4_alloc_free_loop_200k.pickle", 4, "200,000-event alloc/free loop, no frames"))
    frames = [{"filename": "rec.py", "line": 3, "name": "recurse"} for _ in range(100000)]
    write(out, "c4_stack_100k_frames.pickle", py_pickle(snap([], [[ev("alloc", base, 512, 1, frames), ev("free_completed", base, 512, 2, frames)]])))
    E.append(Entry("c4_stack_100k_frames.pickle", 4, "a 100,000-frame stack of identical frames (repetitive)"))
    s = small_valid()
    s["segments"][0]["device"] = 65536
    s["device_traces"] = [[] for _ in range(1)]
    write(out, "c4_device_65536.pickle", py_pickle(s))
    E.append(Entry("c4_device_65536.pickle", 4, "segment on device ordinal 65536"))
    s = small_valid()
    s["segments"][0]["device"] = 65535
    write(out, "c4_device_65535.pickle", py_pickle(s))
    E.append(Entry("c4_device_65535.pickle", 4, "segment on device ordinal 65535, trace on device 0"))
    s = snap([seg(base, 2 * MiB)], [[]])
    write(out, "c4_empty_device_trace.pickle", py_pickle(s))
    E.append(Entry("c4_empty_device_trace.pickle", 4, "device_traces [[]] with a segment on device 0", ["derive_bin"]))
    s = small_valid()
    s["segments"].append(seg(base + 8 * MiB, 2 * MiB, device=2))
    s["device_traces"] = [s["device_traces"][0], [], []]
    write(out, "c4_empty_traces_middle.pickle", py_pickle(s))
    E.append(Entry("c4_empty_traces_middle.pickle", 4, "device_traces [[...], [], []] with a segment on device 2", ["derive_bin"]))


def c6_shapes(out, E):
    base = 0x7F0000000000
    W = ["flag_wrong", "derive_bin"]

    def one(name, note, s):
        write(out, name, py_pickle(s))
        E.append(Entry(name, 6, note, W))

    # Each shape is otherwise consistent (the final state matches the trace), so that only the
    # number under test can make analyze say something.
    one("c6_negative_size.pickle", "alloc, free of size -100 inside a segment that is then freed",
        snap([], [[ev("segment_alloc", base, 2 * MiB, 1), ev("alloc", base, -100, 2), ev("free_requested", base, -100, 3),
                   ev("free_completed", base, -100, 4), ev("segment_free", base, 2 * MiB, 5)]]))
    one("c6_negative_size_open.pickle", "alloc of size -100 left live (issue 11's shape)",
        snap([], [[ev("segment_alloc", base, 2 * MiB, 1), ev("alloc", base, -100, 2)]]))
    one("c6_negative_addr_segment.pickle", "segment at address -4096, block size -1",
        snap([seg(-4096, 2 * MiB, [blk(-4096, -1)])], [[]]))
    one("c6_two_allocs_2p63.pickle", "two allocs of 2^63 bytes (counters wrap)",
        snap([], [[ev("alloc", base, 1 << 63, 1), ev("alloc", base + (1 << 62), 1 << 63, 2)]]))
    one("c6_segment_2p64_minus_1.pickle", "two segment_allocs of 2^64-1 bytes",
        snap([], [[ev("segment_alloc", 0, U64, 1), ev("segment_alloc", 1, U64, 2)]]))
    one("c6_requested_gt_size.pickle", "10^12 requested bytes in a 512-byte block",
        snap([seg(base, 2 * MiB, [blk(base, 512, requested=10 ** 12), blk(base + 512, 2 * MiB - 512, "inactive", 0, [])])], [[]]))
    sg = seg(base, KiB, [blk(base, U64), blk(base + 1, 1025)])
    sg["allocated_size"] = sg["active_size"] = sg["requested_size"] = (U64 + 1025) % (1 << 64)  # = 1024
    one("c6_block_sizes_wrap.pickle", "blocks of 2^64-1 and 1025 bytes in a 1 KiB segment (sums wrap to 1024)",
        {"segments": [sg]})
    one("c6_overlapping_segments.pickle", "two 2 MiB segments overlapping by 1 MiB",
        snap([seg(base, 2 * MiB, [blk(base, 2 * MiB)]), seg(base + MiB, 2 * MiB, [blk(base + MiB, 2 * MiB)])], [[]]))
    one("c6_segment_wraps.pickle", "a segment whose address + size wraps 2^64",
        snap([seg(U64 - MiB + 1, 2 * MiB, [blk(U64 - MiB + 1, 2 * MiB)])], [[]]))
    s = small_valid(t0=-5)
    s["device_traces"][0][2]["time_us"] = U64
    one("c6_time_negative_and_max.pickle", "events with time_us -5 .. -1 and 2^64-1", s)
    write(out, "c6_bytes_above_2p53.pickle", py_pickle(snap([], [[ev("segment_alloc", base, (1 << 53) + 1, 1),
                                                                  ev("alloc", base, (1 << 53) + 1, 2)]])))
    E.append(Entry("c6_bytes_above_2p53.pickle", 6, "byte counts of 2^53+1 (not exact in a double)", ["derive_bin"]))


NASTY = {
    "osc": "\x1b]0;pwned title\x07",
    "csi": "\x1b[2J\x1b[31mred",
    "cr": "ok\rFAKE LINE",
    "nul": "nul\x00byte",
    "bidi": "\u202egnp.exe",
}
BAD_UTF8 = b"bad\xff\xfe\xc3(\xed\xa0\x80\xf8\x88\x80\x80\x80end"


def nasty_snapshot(label, text):
    base = 0x7F0000000000
    fr = [frame(text, text + ".py", 7), frame("caller", "train.py", 1)]
    s = small_valid(frames=fr)
    s["device_traces"][0].append(ev("oom", 1234, 64 * MiB, 2000, fr))
    s["segments"][0]["segment_type"] = "large"
    s["external_annotations"] = [{"device": 0, "stage": "START", "name": text, "time_us": 1000},
                                 {"device": 0, "stage": "END", "name": text, "time_us": 1003}]
    s["device_traces"][0][1]["compile_context"] = text
    s["device_traces"][0][1]["user_metadata"] = text
    return s


def c7_shapes(out, E):
    for label, text in NASTY.items():
        s = nasty_snapshot(label, text)
        write(out, f"c7_names_{label}.pickle", py_pickle(s))
        E.append(Entry(f"c7_names_{label}.pickle", 7, f"frame, file, annotation, compile_context names with {text!r}"))
    s = nasty_snapshot("all", "".join(NASTY.values()))
    write(out, "c7_names_all.json", json.dumps(s).encode())
    E.append(Entry("c7_names_all.json", 7, "every terminal-control name, JSON (escaped \\u001b)"))
    # Invalid UTF-8: Python cannot write it through str; a placeholder of the same length is swapped.
    ph = "Q" * len(BAD_UTF8)
    data = py_pickle(nasty_snapshot("utf8", ph))
    data = data.replace(ph.encode(), BAD_UTF8)
    write(out, "c7_invalid_utf8.pickle", data)
    E.append(Entry("c7_invalid_utf8.pickle", 7, "names that are invalid UTF-8 (raw BINUNICODE bytes)"))
    raw = json.dumps(nasty_snapshot("utf8", ph)).encode().replace(ph.encode(), BAD_UTF8)
    write(out, "c7_invalid_utf8.json", raw)
    E.append(Entry("c7_invalid_utf8.json", 7, "JSON with raw invalid UTF-8 bytes in strings"))
    # Same names in a native trace (strings are bytes there).
    n = Native()
    strs = [b"\x1b]0;pwned\x07.py", b"\x1b[2J" + BAD_UTF8 + b"\r\x00"]
    n.strings(1, strs)
    n.frames(0, [(1, 2, 3)])
    n.stacks(2, [(1, 0)])
    base = 0x7F0000000000
    n.events_chunk([(3, 0, base, 2 * MiB, 2, 1), (0, 0, base, 4096, 2, 2), (8, 0, 1234, 64 * MiB, 2, 3)])
    write(out, "c7_names_native.bin", n.finish())
    E.append(Entry("c7_names_native.bin", 7, "native trace whose frame strings hold ESC, BEL, CR, NUL and invalid UTF-8"))
    # The memory_viz HTML form carrying the same pickle.
    import base64
    b64 = base64.b64encode(data).decode()
    html = f'<!DOCTYPE html><html><body><script>\nconst snapshot = {{"base64": "{b64}"}};\n</script></body></html>\n'
    write(out, "c7_invalid_utf8.html", html.encode())
    E.append(Entry("c7_invalid_utf8.html", 7, "memory_viz HTML page embedding the invalid-UTF-8 pickle"))


def c8_shapes(out, E):
    base = 0x7F0000000000
    big = [frame(chr(65 + i) * MiB, "big.py", i) for i in range(21)]
    tr = [ev("segment_alloc", base, 64 * MiB, 0, [])]
    for i in range(21):
        tr.append(ev("alloc", base + i * MiB, MiB, 1 + i, [big[i], big[(i + 1) % 21]]))
    write(out, "c8_frame_names_21x1MiB.pickle", py_pickle(snap([], [tr])))
    E.append(Entry("c8_frame_names_21x1MiB.pickle", 8, "21 frame names of 1 MiB each"))
    m = StrMemo()
    frames = m.frames([(f"fn{i % 1000}", f"f{i % 97}.py", i) for i in range(1000000)])
    data = hand_pickle(snap([], [[ev("segment_alloc", base, 2 * MiB, 0, []), ev("alloc", base, 512, 1, frames)]]), bytes(m.prefix))
    write(out, "c8_stack_1m_frames.pickle", data)
    E.append(Entry("c8_stack_1m_frames.pickle", 8, "one stack of 1,000,000 distinct frames"))
    # Many distinct stacks: 10,000 allocs, each with its own 50-frame stack.
    m = StrMemo()
    tr = [ev("segment_alloc", base, 1 << 40, 0, [])]
    for i in range(10000):
        tr.append(ev("alloc", base + i * 4096, 4096, 1 + i, m.frames([(f"op{i}_{k}", f"mod{i % 100}.py", k) for k in range(50)])))
    write(out, "c8_stacks_10k_distinct.pickle", hand_pickle(snap([], [tr]), bytes(m.prefix)))
    E.append(Entry("c8_stacks_10k_distinct.pickle", 8, "10,000 live allocations, each with its own 50-frame stack of distinct names"))


def c9_shapes(out, E):
    # Unclosed MARKs.
    write(out, "c9_unclosed_mark.pickle", b"\x80\x04((}.")
    E.append(Entry("c9_unclosed_mark.pickle", 9, "STOP with two unclosed MARKs under the dict"))
    s = py_pickle(small_valid())
    write(out, "c9_unclosed_mark_after.pickle", s[:-1] + b"(.")
    E.append(Entry("c9_unclosed_mark_after.pickle", 9, "a valid snapshot, then MARK before STOP"))
    write(out, "c9_mark_only.pickle", b"\x80\x04(.")
    E.append(Entry("c9_mark_only.pickle", 9, "MARK then STOP"))
    # Huge LONG1 / LONG4 values.
    s = snap([], [[ev("alloc", 0x7F0000000000, 1 << 100, 1)]])
    write(out, "c9_long1_2p100.pickle", hand_pickle(s))
    E.append(Entry("c9_long1_2p100.pickle", 9, "event size 2^100 (LONG1)"))
    s = snap([], [[ev("alloc", Raw(b"\x8b\x00\x00\x00\x01" + bytes(16)), 512, 1)]])
    write(out, "c9_long4_claims_16m.pickle", hand_pickle(s))
    E.append(Entry("c9_long4_claims_16m.pickle", 9, "LONG4 that claims 16 MiB of digits, 16 present"))
    s = snap([], [[ev("alloc", Raw(b"\x8a\xff" + b"\xff" * 255), 512, 1)]])
    write(out, "c9_long1_255_bytes.pickle", hand_pickle(s))
    E.append(Entry("c9_long1_255_bytes.pickle", 9, "LONG1 of 255 bytes (-1) as an address"))
    # 11-byte varints in a native trace.
    n = Native()
    n.chunk(5, b"\x80" * 10 + b"\x00")
    write(out, "c9_varint_11_bytes.bin", n.finish())
    E.append(Entry("c9_varint_11_bytes.bin", 9, "native Events chunk whose count is an 11-byte varint"))
    n = Native()
    n.chunk(2, var(1) + b"\xff" * 10 + b"\x01")
    write(out, "c9_varint_strings_count.bin", n.finish())
    E.append(Entry("c9_varint_strings_count.bin", 9, "native Strings chunk whose count is an 11-byte varint"))
    # Deep nesting.
    depth = 1000000
    write(out, "c9_deep_list.pickle", b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b".")
    E.append(Entry("c9_deep_list.pickle", 9, "1,000,000 nested lists (pickle)"))
    write(out, "c9_deep_list.json", b"[" * depth + b"]" * depth)
    E.append(Entry("c9_deep_list.json", 9, "1,000,000 nested arrays (JSON)"))
    # 65,536 distinct two-frame stacks (the reader caches each frames list's bytes), then 5,000,000
    # rebinds of memo slot 0 before STOP: each rebind drops the cache, and dropping it must cost
    # what the cache held, not its capacity (a clear per 2-byte BINPUT took minutes for this file).
    fr = [frame("fn%d" % i, "f%d.py" % i, i) for i in range(256)]
    evs = [{"action": "alloc", "addr": 4096 * (k + 1), "size": 512, "stream": 0,
            "frames": [fr[k >> 8], fr[k & 255]]} for k in range(65536)]
    s = pickle.dumps({"segments": [], "device_traces": [evs]}, protocol=2)
    write(out, "c9_rebinds_after_frames_runs.pickle", s[:-1] + b"q\x00" * 5000000 + b".")
    E.append(Entry("c9_rebinds_after_frames_runs.pickle", 9,
                   "65,536 cached frames lists, then 5,000,000 memo rebinds (BINPUT 0)"))
    write(out, "c9_empty.pickle", b"")
    E.append(Entry("c9_empty.pickle", 9, "an empty file"))
    write(out, "c9_proto_only.pickle", b"\x80\x04")
    E.append(Entry("c9_proto_only.pickle", 9, "PROTO and nothing else"))
    write(out, "c9_html_unterminated.html", b'<html><script>{"base64": "gAR9cQAu')
    E.append(Entry("c9_html_unterminated.html", 9, "HTML whose base64 field is not terminated"))


# Class 10 (issue 30): the readers added in the third round: within budget, or refused at it.


def gz_bytes(data):
    import gzip
    import io
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()


def gz_repeat(head, unit, count, tail):
    """gzip of head + unit * count + tail, compressed piece by piece (never held whole)."""
    import zlib
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [c.compress(head)]
    per = max(1, (1 << 20) // max(1, len(unit)))  # units a piece: one at least (a unit > 1 MiB)
    piece = unit * per
    left = count
    while left >= per:
        out.append(c.compress(piece))
        left -= per
    out.append(c.compress(unit * left))
    out.append(c.compress(tail))
    out.append(c.flush())
    return b"".join(out)


def kmem(ts, nbytes, addr=None, dev=0):
    a = {"Device Type": 1, "Device Id": dev, "Bytes": nbytes}
    if addr is not None:
        a["Addr"] = addr
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7, "tid": 1, "ts": ts, "args": a}


def kop(name, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": 1, "ts": ts, "dur": dur}


def ktrace(evs):
    return json.dumps({"schemaVersion": 1, "traceEvents": evs}, separators=(",", ":")).encode()


def c10_shapes(out, E):
    base = 0x7F0000000000
    # Ops that end exactly when the next starts, one allocation inside each (freed in the next).
    N = 150000
    evs = []
    for i in range(N):
        evs.append(kop("aten::add", 10 * i, 10))
        evs.append(kmem(10 * i + 5, 512, base + (i % 2) * 512))
        if i:
            evs.append(kmem(10 * i + 6, -512, base + ((i - 1) % 2) * 512))
    data = gz_bytes(ktrace(evs))
    write(out, "c10_profiler_touching_ops_150k.json.gz", data)
    E.append(Entry("c10_profiler_touching_ops_150k.json.gz", 10, f"Kineto: 150,000 ops each ending when the next starts, an alloc and a free in each ({len(data)} bytes)"))
    evs = [kop(f"op{i}", 10 * i, 10) for i in range(N)] + [kmem(10 * N - 5, 512, base)]
    data = gz_bytes(ktrace(evs))
    write(out, "c10_profiler_chained_distinct_ops.json.gz", data)
    E.append(Entry("c10_profiler_chained_distinct_ops.json.gz", 10, f"Kineto: 150,000 chained ops of distinct names, one alloc at the end ({len(data)} bytes)"))
    # Deep stacks: 300 nested ops, then 60,000 innermost ops of distinct names with an alloc each.
    D, M = 300, 60000
    evs = [kop(f"outer{k}", k, 10 * M * 2 + 2 * D - 2 * k) for k in range(D)]
    for i in range(M):
        t = D + 20 * i
        evs.append(kop(f"inner{i}", t, 10))
        evs.append(kmem(t + 1, 512, base + i * 512))
    data = gz_bytes(ktrace(evs))
    write(out, "c10_profiler_deep_distinct_stacks.json.gz", data)
    E.append(Entry("c10_profiler_deep_distinct_stacks.json.gz", 10, f"Kineto: 60,000 allocations, each under its own 300-op stack ({len(data)} bytes)"))
    # The 2021 format (Bytes only): identical allocations up to the old gzip floor (256 MiB of text,
    # 1.6 GB of memory then); refused as a bomb at the floor of 64 MiB now. So are the next three.
    unit = b'{"ph":"i","name":"[memory]","pid":7,"tid":1,"ts":1,"args":{"Device Type":1,"Device Id":0,"Bytes":512}},'
    n = (255 * MiB) // len(unit)
    data = gz_repeat(b'{"traceEvents":[', unit, n, unit[:-1] + b"]}")
    write(out, "c10_profiler_2021_identical.json.gz", data)
    E.append(Entry("c10_profiler_2021_identical.json.gz", 10, f"Kineto 2021 form: {n + 1} identical allocations, 255 MiB of text ({len(data)} bytes gzip)"))
    # Whitespace inside the trace list, 1 GiB of it.
    data = gz_repeat(b'{"traceEvents":[', b" ", GiB, b"]}")
    write(out, "c10_profiler_whitespace_bomb.json.gz", data)
    E.append(Entry("c10_profiler_whitespace_bomb.json.gz", 10, f"Kineto: 1 GiB of whitespace in the event list ({len(data)} bytes gzip)"))
    # Memory timelines: raw rows at the smallest text per row, gzip.
    unit = b"[1,2,512,4],"
    n = (250 * MiB) // len(unit)
    data = gz_repeat(b"[", unit, n, b"[1,2,512,4]]")
    write(out, "c10_timeline_raw_rows.json.gz", data)
    E.append(Entry("c10_timeline_raw_rows.json.gz", 10, f"memory timeline: {n + 1} raw rows, 250 MiB of text ({len(data)} bytes gzip)"))
    # One row of numbers (a raw row with millions of values).
    data = gz_repeat(b"[[1,2,512,4,", b"1,", 120 * MiB, b"1]]")
    write(out, "c10_timeline_one_long_row.json.gz", data)
    E.append(Entry("c10_timeline_one_long_row.json.gz", 10, f"memory timeline: one raw row of 120 M numbers ({len(data)} bytes gzip)"))
    # The [times, sizes] form, plain JSON: 100,000 times, 8 categories moving up and down.
    T = 50000
    times = list(range(T))
    sizes = [[0] + [512 * ((t * (c + 3)) % 17) for c in range(8)] for t in range(T)]
    data = json.dumps([times, sizes], separators=(",", ":")).encode()
    write(out, "c10_timeline_levels.json", data)
    E.append(Entry("c10_timeline_levels.json", 10, f"memory timeline [times, sizes]: 50,000 times x 8 categories, every level moving ({len(data)} bytes)"))
    # Native: 100,000 devices, one segment and one allocation each, with the final state.
    n = Native()
    evs = []
    segs = []
    for d in range(100000):
        evs.append((3, d, base, 2 * MiB, 0, d))
        evs.append((0, d, base, 512, 0, d))
        segs.append((d, base, 2 * MiB, 0, [(512, 0), (2 * MiB - 512, 0)]))
    for k in range(0, len(evs), 200000):
        n.events_chunk(evs[k:k + 200000])
    n.segments(segs)
    data = n.finish(final_state=True)
    write(out, "c10_native_100k_devices.bin", data)
    E.append(Entry("c10_native_100k_devices.bin", 10, f"native: 100,000 devices, one segment and allocation each, final state ({len(data)} bytes)"))
    # Native: a Meta chunk whose source warnings are 16 M empty lines.
    n = Native(meta_extra=tlv_bytes(8, b"\n" * (16 * MiB)))
    n.events_chunk([(0, 0, base, 512, 0, 1)])
    data = n.finish()
    write(out, "c10_native_16m_warning_lines.bin", data)
    E.append(Entry("c10_native_16m_warning_lines.bin", 10, "native: Meta source warnings of 16 M empty lines"))
    # Native: a 100,000-frame chain referenced by 600 blocks of the final state and their allocs.
    n = Native()
    n.strings(1, [b"chain.py", b"link"])
    n.frames(0, [(1, 2, 7)])
    C = 100000
    n.stacks(2, [(1 + i, 0) for i in range(C)])
    deep = 1 + C
    # 150 distinct stacks of 99,851 to 100,000 frames (15 M frames: under the trace's floor of 16 M),
    # four blocks on each, allocated and live at the end.
    stk = [deep - i // 4 for i in range(600)]
    evs = [(3, 0, base, 64 * MiB, 0, 0)] + [(0, 0, base + i * 512, 512, stk[i], 1 + i) for i in range(600)]
    evs.append((0, 0, base + 600 * 512, 64 * MiB - 600 * 512, 0, 601))
    n.events_chunk(evs)
    n.segments([(0, base, 64 * MiB, 0, [(512, stk[i]) for i in range(600)] + [(64 * MiB - 600 * 512, 0)])])
    data = n.finish(final_state=True)
    write(out, "c10_native_chain_blocks.bin", data)
    E.append(Entry("c10_native_chain_blocks.bin", 10, f"native: 600 live blocks on 150 distinct stacks of about 100,000 frames ({len(data)} bytes)"))
    # Native: 100,000 OOMs, each with a distinct 20-frame stack.
    n = Native()
    n.strings(1, [b"oom.py"] + [b"fn%d" % i for i in range(20)])
    n.frames(0, [(1, 2 + k, k) for k in range(20)])
    nodes, nid = [], 2
    for j in range(1000):
        parent = 1
        for k in range(20):
            nodes.append((parent, (k + j) % 20))
            parent = nid
            nid += 1
    n.stacks(2, nodes)
    evs = [(3, 0, base, 2 * MiB, 0, 0)] + [(8, 0, 1 << 30, 1 << 40, 2 + 20 * (i % 1000) + 19, 1 + i) for i in range(100000)]
    n.events_chunk(evs)
    data = n.finish()
    write(out, "c10_native_100k_ooms.bin", data)
    E.append(Entry("c10_native_100k_ooms.bin", 10, f"native: 100,000 OOMs with 1,000 distinct 20-frame stacks ({len(data)} bytes)"))
    # Pickle: 60,000 OOMs sharing one memoized 30-frame stack.
    F = [frame(f"fn{i}", "oom.py", i) for i in range(30)]
    tr = [ev("segment_alloc", base, 2 * MiB, 0, F)] + [ev("oom", 1 << 30, 1 << 40, 1 + i, F) for i in range(60000)]
    data = py_pickle(snap([], [tr]))
    write(out, "c10_pickle_60k_ooms.pickle", data)
    E.append(Entry("c10_pickle_60k_ooms.pickle", 10, f"pickle: 60,000 OOMs on one 30-frame stack ({len(data)} bytes)"))
    # Native: one event on device 2^20-1 (a 144-byte trace).
    n = Native()
    n.events_chunk([(0, (1 << 20) - 1, base, 512, 0, 1)])
    data = n.finish()
    write(out, "c10_native_device_2p20m1.bin", data)
    E.append(Entry("c10_native_device_2p20m1.bin", 10, f"native: one allocation on device 2^20-1 ({len(data)} bytes)"))


def generate(out_dir, real_dir=None):
    os.makedirs(out_dir, exist_ok=True)
    real_dir = real_dir or os.environ.get("MEMF_REAL_SNAPSHOTS") or REAL_DIR_DEFAULT
    random.seed(11)
    E = []
    c1_shapes(out_dir, E)
    c2_shapes(out_dir, E)
    c3_shapes(out_dir, E)
    c4_shapes(out_dir, E, real_dir)
    c6_shapes(out_dir, E)
    c7_shapes(out_dir, E)
    c8_shapes(out_dir, E)
    c9_shapes(out_dir, E)
    c10_shapes(out_dir, E)
    for e in E:
        if e.cls == 10:
            e.flags.append("budget")  # the runner's sanitizer build runs fewer commands on these
    write(out_dir, "sample_valid.pickle", py_pickle(small_valid()))
    E.append(Entry("sample_valid.pickle", 0, "a small valid snapshot (control)", ["derive_bin"]))
    with open(os.path.join(out_dir, "MANIFEST.tsv"), "w") as f:
        for e in E:
            f.write(f"{e.name}\t{e.cls}\t{','.join(e.flags)}\t{e.note}\n")
    return E


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("out_dir", help="folder to write the corpus into (created if absent)")
    ap.add_argument("real_dir", nargs="?", default=None,
                    help="folder of real snapshots to derive inputs from (optional)")
    args = ap.parse_args()
    for e in generate(args.out_dir, args.real_dir):
        st = os.stat(os.path.join(args.out_dir, e.name))
        print(f"{e.name}\tclass {e.cls}\t{st.st_size} bytes ({st.st_blocks * 512} on disk)\t{e.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
