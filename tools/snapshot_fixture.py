#!/usr/bin/env python3
"""Compile a text-form allocator trace ("fixture") into a PyTorch CUDA memory snapshot.

The output is what ``torch.cuda.memory._dump_snapshot`` writes: ``pickle.dump(obj, f)`` with
protocol 4 of plain dicts/lists/str/int/bool/float/tuples.  As in PyTorch, every distinct frame is
one dict object and every distinct stack is one list object, shared by all entries that use it
(the pickle memo then writes BINGET references), and all empty ``frames`` lists of blocks/segments
are one shared list.  The final ``segments`` state is never written by hand: it is derived by
replaying the trace with a small model of the caching allocator's block layout.

Usage:
    python3 tools/snapshot_fixture.py IN.fixture -o OUT.pickle [--json OUT.json]

Text form (one statement per line; ``#`` starts a comment when it begins a line or follows
whitespace outside quotes; a trailing ``\\`` continues a line):

    era 2.0|2.1|2.6|2.11     field set to emit (default 2.11), see "Eras" below; once, before events
    device N                 following events/annotations belong to CUDA device N (default 0)
    stack NAME = FRAME ; FRAME ; ...
                             a named Python stack, innermost frame first.  FRAME is
                             FILE:LINE:FUNCTION (split at the first ":<digits>:", so Windows
                             paths and C++ names with "::" work); "@OTHER" splices in the frames
                             of an earlier stack (typically the outer part of the call chain);
                             an empty right-hand side gives a recorded but empty stack
                             (frames == [], e.g. autograd-thread allocations with Python stacks)
    setting KEY VALUE        override one allocator_settings entry (eras 2.6/2.11); VALUE is
                             true/false, an int, a float or a string
    strict on|off            allocator-policy checks (default on), see "Checks"
    context alloc|event      where free events take their frames when they have no stack=:
                             "alloc" (default, like record_memory_history(context="alloc")) reuses
                             the allocation's stack list; "event" writes no frames key
    skip_actions A,B,...     model these actions but leave them out of the trace (skip_actions=)
    max_entries N            keep only the newest N entries of each device trace and of each
                             device's external_annotations (ring buffers of that capacity)
    annotation TIME NAME START|END
                             an external_annotations record (eras 2.6/2.11) on the current device
    t TIME ACTION ARGS... [KEY=VALUE ...]
                             one trace entry; TIME is time_us, or +N for "previous t line + N"

Actions and their positional ARGS (ADDR/SIZE are expressions, see below):

    segment_alloc ADDR SIZE [small|large]   new segment (cudaMalloc).  Pool: small if the keyword
                                            says so, else large unless SIZE is exactly 2 MiB
    segment_free  ADDR [SIZE]               cudaFree; the segment must be completely free
    alloc ADDR|auto SIZE                    SIZE = requested bytes.  "auto" picks the address
                                            like the allocator does (best fit among free blocks
                                            of the same pool and stream: smallest, then lowest)
    free_requested ADDR [SIZE]              SIZE defaults to (and must equal) the requested size
    free_completed ADDR [SIZE]              block becomes free, coalesces with free neighbours
    free ADDR [SIZE]                        shorthand: free_requested + free_completed, same time
    snapshot [SIZE]                         SIZE defaults to the device's active bytes now
    oom [ADDR] SIZE device_free=N           SIZE = rounded request; an ADDR of 0 or "-" is ignored

Keywords: stream=S (default: the segment's stream; 0 for segments and auto allocs),
stack=NAME (or "-" for none), name=ID (binds @ID to this block/segment address),
pool=small|large, meta=STR (user_metadata), ctx=STR (compile_context), device_free=N.
Values may be quoted with '...' or "...".

Expressions: decimal or 0x-hex integers (underscores allowed) with an optional binary suffix
K/KiB/M/MiB/G/GiB, "@ID" for a bound name, and sums with "+", e.g. ``@seg3+4MiB`` or ``20MiB``.

Block model (PyTorch native caching allocator, roundup_power2_divisions 0, no max_split_size):
the block size is round_size(request) = max(512, request rounded up to a multiple of 512); the
allocated block is the front of the free block at ADDR; the rest stays a free (inactive) block
if the remainder is >= 512 bytes (small pool) or > 1 MiB (large pool), otherwise the whole free
block is handed out (block size > rounded request, as in PyTorch).  free_completed merges the
block with free neighbours in the same segment.  Blocks between free_requested and
free_completed are "active_pending_free".  An inactive block keeps the stale requested_size of
the block object it came from, as PyTorch does.

Checks: inconsistent fixtures are rejected with "FILE:LINE: error: ..." (alloc outside any
segment, overlapping allocs or segments, free of an unknown address, size mismatches, time going
backwards, segment_free of a segment still in use, ...).  With "strict on" the allocator's
policy is also enforced: an alloc must start at the beginning of a free block, must use the pool
its rounded size selects (small iff <= 1 MiB) and the segment's stream; small segments are
exactly 2 MiB and large ones a multiple of 2 MiB; free_completed needs a free_requested first;
oom SIZE must be a rounded size.

Eras (fields emitted):
    2.0   {segments, device_traces}; blocks {size, requested_size, state, history}
          (history = [{addr, real_size, frames}] on active blocks); no segment frames/pool id;
          frames dicts in the 2.0 key order filename, name, line; no time_us
    2.1   blocks {address, size, requested_size, state, frames}; segments gain segment_pool_id,
          is_expandable, frames; still no time_us
    2.6   + time_us on trace entries, allocator_settings, external_annotations
    2.11  + compile_context ("N/A" unless ctx=) and user_metadata ("" unless meta=) on trace
          entries, graph_capture_record_stream_reuse in allocator_settings
"""

import argparse
import bisect
import json
import pickle
import re
import shlex
import sys

KIB = 1024
MIB = 1024 * 1024
GIB = 1024 * MIB
SMALL_SEGMENT = 2 * MIB       # kSmallBuffer
SMALL_SIZE = 1 * MIB          # kSmallSize
MIN_BLOCK = 512               # kMinBlockSize
ROUND_LARGE = 2 * MIB         # kRoundLarge

ERAS = ("2.0", "2.1", "2.6", "2.11")
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "snapshot", "oom")
U64_MAX = (1 << 64) - 1


class FixtureError(Exception):
    def __init__(self, lineno, message):
        super().__init__(message)
        self.lineno = lineno
        self.message = message


def round_size(n):
    """PyTorch round_size with roundup_power2_divisions = 0."""
    if n < MIN_BLOCK:
        return MIN_BLOCK
    return (n + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def pool_for(rounded):
    return "small" if rounded <= SMALL_SIZE else "large"


def fmt_addr(a):
    return "0x%x" % a


# --------------------------------------------------------------------------------------------
# allocator model


class Block:
    __slots__ = ("addr", "size", "req", "state", "stack", "line")

    def __init__(self, addr, size, req, state="inactive", stack=None, line=0):
        self.addr = addr
        self.size = size
        self.req = req
        self.state = state
        self.stack = stack   # stack key (tuple of frames) of the owning allocation, or None
        self.line = line     # fixture line that last changed the block (for messages)

    @property
    def end(self):
        return self.addr + self.size


class Segment:
    __slots__ = ("device", "addr", "size", "stream", "pool", "stack", "blocks", "line")

    def __init__(self, device, addr, size, stream, pool, stack, line):
        self.device = device
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.stack = stack
        self.line = line
        self.blocks = [Block(addr, size, 0)]   # address order, covering the segment

    @property
    def end(self):
        return self.addr + self.size

    def block_index(self, addr):
        """Index of the block containing addr."""
        starts = [b.addr for b in self.blocks]
        i = bisect.bisect_right(starts, addr) - 1
        return i

    def active_bytes(self):
        return sum(b.size for b in self.blocks if b.state != "inactive")


class DeviceState:
    def __init__(self, device):
        self.device = device
        self.segments = []       # sorted by address
        self.events = []         # emitted trace entries (internal form)
        self.last_time = None

    def segment_at(self, addr):
        starts = [s.addr for s in self.segments]
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and addr < self.segments[i].end:
            return self.segments[i]
        return None

    def live_block(self, addr):
        seg = self.segment_at(addr)
        if seg is None:
            return None, None
        b = seg.blocks[seg.block_index(addr)]
        if b.addr != addr:
            return seg, None
        return seg, b


# --------------------------------------------------------------------------------------------
# lexical helpers

_NUM_RE = re.compile(r"^(0x[0-9a-f_]+|[0-9][0-9_]*)(k|kib|m|mib|g|gib)?$", re.I)
_UNITS = {None: 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB}
_FRAME_RE = re.compile(r"^(.*?):(-?[0-9]+):(.*)$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def strip_comment(line):
    """Remove a '#' comment that starts a line or follows whitespace, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


class Compiler:
    def __init__(self, path):
        self.path = path
        self.era = None
        self.era_line = None
        self.strict = True
        self.context = "alloc"
        self.skip = set()
        self.max_entries = None
        self.device = 0
        self.devices = {}
        self.stacks = {}          # name -> tuple of (filename, line, name)
        self.names = {}           # @ID -> address (per device)
        self.settings = {}
        self.annotations = []
        self.prev_t = None
        self.lineno = 0

    # ---- helpers -----------------------------------------------------------------------
    def err(self, msg):
        raise FixtureError(self.lineno, msg)

    def dev(self):
        d = self.devices.get(self.device)
        if d is None:
            d = self.devices[self.device] = DeviceState(self.device)
        return d

    def parse_int(self, tok, what):
        total = 0
        if tok == "":
            self.err("missing %s" % what)
        for term in tok.split("+"):
            term = term.strip()
            if term.startswith("@"):
                key = (self.device, term[1:])
                if key not in self.names:
                    self.err("%s: unknown name %s on device %d" % (what, term, self.device))
                total += self.names[key]
                continue
            m = _NUM_RE.match(term)
            if not m:
                self.err("%s: %r is not a number" % (what, tok))
            digits = m.group(1).replace("_", "")
            value = int(digits, 16) if digits.lower().startswith("0x") else int(digits)
            unit = m.group(2).lower() if m.group(2) else None
            total += value * _UNITS[unit]
        return total

    def stack_key(self, name):
        if name is None or name == "-":
            return None
        if name not in self.stacks:
            self.err("unknown stack %r (define it with 'stack %s = ...' first)" % (name, name))
        return self.stacks[name]

    # ---- statements --------------------------------------------------------------------
    def run(self, text):
        pending = ""
        start = 0
        for n, raw in enumerate(text.splitlines(), 1):
            line = strip_comment(raw).rstrip()
            if line.endswith("\\"):
                if not pending:
                    start = n
                pending += line[:-1] + " "
                continue
            if pending:
                line = pending + line
                pending = ""
                self.lineno = start
            else:
                self.lineno = n
            if line.strip():
                self.statement(line.strip())
        if pending:
            self.lineno = start
            self.err("line continuation at end of file")

    def statement(self, line):
        word = line.split(None, 1)[0]
        if word == "stack":
            return self.do_stack(line)
        try:
            toks = shlex.split(line, comments=False, posix=True)
        except ValueError as e:
            self.err("cannot tokenize line: %s" % e)
        handler = {
            "era": self.do_era, "device": self.do_device, "setting": self.do_setting,
            "strict": self.do_strict, "context": self.do_context,
            "skip_actions": self.do_skip, "max_entries": self.do_max_entries,
            "annotation": self.do_annotation, "t": self.do_event,
        }.get(word)
        if handler is None:
            self.err("unknown statement %r" % word)
        handler(toks)

    def do_era(self, toks):
        if len(toks) != 2 or toks[1] not in ERAS:
            self.err("era must be one of %s" % ", ".join(ERAS))
        if self.era is not None:
            self.err("era given twice (first on line %d)" % self.era_line)
        if self.devices or self.annotations:
            self.err("era must come before the first event")
        self.era = toks[1]
        self.era_line = self.lineno

    def do_device(self, toks):
        if len(toks) != 2 or not toks[1].isdigit():
            self.err("usage: device N")
        self.device = int(toks[1])

    def do_setting(self, toks):
        if len(toks) != 3:
            self.err("usage: setting KEY VALUE")
        v = toks[2]
        if v.lower() in ("true", "false"):
            value = v.lower() == "true"
        else:
            try:
                value = int(v)
            except ValueError:
                try:
                    value = float(v)
                except ValueError:
                    value = v
        self.settings[toks[1]] = value

    def do_strict(self, toks):
        if len(toks) != 2 or toks[1] not in ("on", "off"):
            self.err("usage: strict on|off")
        self.strict = toks[1] == "on"

    def do_context(self, toks):
        if len(toks) != 2 or toks[1] not in ("alloc", "event"):
            self.err("usage: context alloc|event")
        self.context = toks[1]

    def do_skip(self, toks):
        if len(toks) != 2:
            self.err("usage: skip_actions ACTION[,ACTION...]")
        for a in toks[1].split(","):
            if a not in ACTIONS:
                self.err("unknown action %r in skip_actions" % a)
            self.skip.add(a)

    def do_max_entries(self, toks):
        if len(toks) != 2 or not toks[1].isdigit() or int(toks[1]) < 1:
            self.err("usage: max_entries N (N >= 1)")
        self.max_entries = int(toks[1])

    def do_stack(self, line):
        m = re.match(r"^stack\s+(\S+)\s*=\s*(.*)$", line)
        if not m:
            self.err("usage: stack NAME = FILE:LINE:FUNC ; FILE:LINE:FUNC ; ...")
        name, body = m.group(1), m.group(2)
        if not _NAME_RE.match(name):
            self.err("bad stack name %r" % name)
        if name in self.stacks:
            self.err("stack %r defined twice" % name)
        frames = []
        if not body.strip():
            self.stacks[name] = ()   # recorded but empty traceback: frames == []
            return
        for part in body.split(";"):
            part = part.strip()
            if not part:
                self.err("empty frame in stack %r" % name)
            if part.startswith("@"):
                other = part[1:]
                if other not in self.stacks:
                    self.err("stack %r refers to unknown stack @%s" % (name, other))
                frames.extend(self.stacks[other])
                continue
            fm = _FRAME_RE.match(part)
            if not fm:
                self.err("frame %r is not FILE:LINE:FUNCTION" % part)
            lineno = int(fm.group(2))
            if lineno == -1:
                lineno = U64_MAX   # unknown line, as PyTorch stores it
            if not 0 <= lineno <= U64_MAX:
                self.err("frame line %d out of range" % lineno)
            frames.append((fm.group(1), lineno, fm.group(3)))
        self.stacks[name] = tuple(frames)

    def parse_time(self, tok):
        if tok.startswith("+"):
            if self.prev_t is None:
                self.err("relative time %s before any absolute time" % tok)
            return self.prev_t + self.parse_int(tok[1:], "time")
        return self.parse_int(tok, "time")

    def do_annotation(self, toks):
        if len(toks) != 4 or toks[3] not in ("START", "END"):
            self.err("usage: annotation TIME NAME START|END")
        t = self.parse_time(toks[1])
        self.annotations.append({"stage": toks[3], "name": toks[2], "device": self.device,
                                 "time_us": t})

    # ---- events -------------------------------------------------------------------------
    def do_event(self, toks):
        if len(toks) < 3:
            self.err("usage: t TIME ACTION ARGS...")
        t = self.parse_time(toks[1])
        action = toks[2]
        pos, kw = [], {}
        for tok in toks[3:]:
            if "=" in tok and re.match(r"^[a-z_]+=", tok):
                k, v = tok.split("=", 1)
                if k in kw:
                    self.err("keyword %s given twice" % k)
                kw[k] = v
            else:
                pos.append(tok)
        d = self.dev()
        if d.last_time is not None and t < d.last_time:
            self.err("time %d goes backwards (previous event on device %d at %d)"
                     % (t, self.device, d.last_time))
        d.last_time = t
        self.prev_t = t
        allowed = {"stream", "stack", "meta", "ctx"}
        handler = {
            "segment_alloc": (self.ev_segment_alloc, allowed | {"name", "pool"}),
            "segment_free": (self.ev_segment_free, allowed),
            "alloc": (self.ev_alloc, allowed | {"name"}),
            "free_requested": (self.ev_free_requested, allowed),
            "free_completed": (self.ev_free_completed, allowed),
            "free": (self.ev_free, allowed),
            "snapshot": (self.ev_snapshot, allowed),
            "oom": (self.ev_oom, allowed | {"device_free"}),
        }.get(action)
        if handler is None:
            self.err("unknown action %r" % action)
        fn, ok = handler
        for k in kw:
            if k not in ok:
                self.err("keyword %s= is not valid for %s" % (k, action))
        fn(t, pos, kw)

    def record(self, t, action, addr, size, stream, stack, kw, device_free=None):
        d = self.dev()
        d.events.append({"action": action, "addr": addr, "size": size, "stream": stream,
                         "time": t, "stack": stack, "meta": kw.get("meta", ""),
                         "ctx": kw.get("ctx", "N/A"), "device_free": device_free,
                         "line": self.lineno})

    def nargs(self, pos, lo, hi, usage):
        if not lo <= len(pos) <= hi:
            self.err("usage: %s" % usage)

    def bind(self, kw, addr):
        if "name" in kw:
            if not _NAME_RE.match(kw["name"]):
                self.err("bad name %r" % kw["name"])
            self.names[(self.device, kw["name"])] = addr

    def ev_segment_alloc(self, t, pos, kw):
        pool = kw.get("pool")
        rest = []
        for p in pos:
            if p in ("small", "large"):
                if pool is not None and pool != p:
                    self.err("conflicting pool keywords")
                pool = p
            else:
                rest.append(p)
        self.nargs(rest, 2, 2, "segment_alloc ADDR SIZE [small|large] [stream=S] [stack=NAME]")
        addr = self.parse_int(rest[0], "segment address")
        size = self.parse_int(rest[1], "segment size")
        if pool is None:
            pool = "small" if size == SMALL_SEGMENT else "large"
        if pool not in ("small", "large"):
            self.err("pool must be small or large")
        if size <= 0:
            self.err("segment size must be positive")
        if self.strict:
            if pool == "small" and size != SMALL_SEGMENT:
                self.err("small-pool segments are exactly 2 MiB (2097152), got %d "
                         "(use 'strict off' to allow)" % size)
            if pool == "large" and size % ROUND_LARGE:
                self.err("large-pool segments are a multiple of 2 MiB, got %d "
                         "(use 'strict off' to allow)" % size)
            if addr % MIN_BLOCK:
                self.err("segment address %s is not 512-byte aligned" % fmt_addr(addr))
        d = self.dev()
        for s in d.segments:
            if addr < s.end and s.addr < addr + size:
                self.err("segment [%s, %s) overlaps segment [%s, %s) from line %d"
                         % (fmt_addr(addr), fmt_addr(addr + size), fmt_addr(s.addr),
                            fmt_addr(s.end), s.line))
        stream = self.parse_int(kw.get("stream", "0"), "stream")
        stack = self.stack_key(kw.get("stack"))
        seg = Segment(self.device, addr, size, stream, pool, stack, self.lineno)
        bisect.insort(d.segments, seg, key=lambda s: s.addr)
        self.bind(kw, addr)
        self.record(t, "segment_alloc", addr, size, stream, stack, kw)

    def ev_segment_free(self, t, pos, kw):
        self.nargs(pos, 1, 2, "segment_free ADDR [SIZE]")
        d = self.dev()
        addr = self.parse_int(pos[0], "segment address")
        seg = d.segment_at(addr)
        if seg is None or seg.addr != addr:
            self.err("segment_free of %s: no segment starts there on device %d"
                     % (fmt_addr(addr), self.device))
        if len(pos) > 1 and self.parse_int(pos[1], "size") != seg.size:
            self.err("segment_free size %s does not match segment size %d"
                     % (pos[1], seg.size))
        busy = [b for b in seg.blocks if b.state != "inactive"]
        if busy:
            self.err("segment_free of %s: segment still has %d live block(s), first at %s "
                     "(line %d)" % (fmt_addr(addr), len(busy), fmt_addr(busy[0].addr),
                                    busy[0].line))
        assert len(seg.blocks) == 1
        stream = self.parse_int(kw["stream"], "stream") if "stream" in kw else seg.stream
        d.segments.remove(seg)
        self.record(t, "segment_free", addr, seg.size, stream,
                    self.stack_key(kw.get("stack")), kw)

    def find_auto(self, rounded, stream):
        pool = pool_for(rounded)
        best = None
        for seg in self.dev().segments:
            if seg.pool != pool or seg.stream != stream:
                continue
            for b in seg.blocks:
                if b.state == "inactive" and b.size >= rounded:
                    if best is None or (b.size, b.addr) < (best.size, best.addr):
                        best = b
        if best is None:
            self.err("alloc auto: no free %s-pool block of >= %d bytes on stream %d; add a "
                     "segment_alloc before this line" % (pool, rounded, stream))
        return best.addr

    def ev_alloc(self, t, pos, kw):
        self.nargs(pos, 2, 2, "alloc ADDR|auto SIZE [stream=S] [stack=NAME] [name=ID]")
        size = self.parse_int(pos[1], "alloc size")
        if size <= 0:
            self.err("alloc size must be positive")
        rounded = round_size(size)
        d = self.dev()
        if pos[0] == "auto":
            stream = self.parse_int(kw.get("stream", "0"), "stream")
            addr = self.find_auto(rounded, stream)
        else:
            addr = self.parse_int(pos[0], "alloc address")
        seg = d.segment_at(addr)
        if seg is None:
            self.err("alloc at %s is outside every segment of device %d"
                     % (fmt_addr(addr), self.device))
        stream = self.parse_int(kw["stream"], "stream") if "stream" in kw else seg.stream
        i = seg.block_index(addr)
        b = seg.blocks[i]
        if b.state != "inactive":
            self.err("alloc at %s overlaps live block [%s, %s) allocated on line %d"
                     % (fmt_addr(addr), fmt_addr(b.addr), fmt_addr(b.end), b.line))
        if addr + rounded > b.end:
            self.err("alloc of %d bytes (rounded %d) at %s does not fit in free block "
                     "[%s, %s) of segment %s" % (size, rounded, fmt_addr(addr),
                                                 fmt_addr(b.addr), fmt_addr(b.end),
                                                 fmt_addr(seg.addr)))
        if self.strict:
            if addr != b.addr:
                self.err("alloc at %s is not at the start of free block [%s, %s) "
                         "(the allocator always uses the front; 'strict off' allows it)"
                         % (fmt_addr(addr), fmt_addr(b.addr), fmt_addr(b.end)))
            if pool_for(rounded) != seg.pool:
                self.err("alloc of %d bytes (rounded %d) belongs to the %s pool but segment %s "
                         "is %s" % (size, rounded, pool_for(rounded), fmt_addr(seg.addr),
                                    seg.pool))
            if stream != seg.stream:
                self.err("alloc on stream %d in a segment of stream %d" % (stream, seg.stream))
        stack = self.stack_key(kw.get("stack"))
        # leading free part (only possible with strict off): stays the old block object
        if addr > b.addr:
            lead = Block(b.addr, addr - b.addr, b.req, line=b.line)
            b.addr = addr
            b.size -= lead.size
            seg.blocks.insert(i, lead)
            i += 1
        remainder = b.size - rounded
        if seg.pool == "small":
            split = remainder >= MIN_BLOCK
        else:
            split = remainder > SMALL_SIZE
        if split:
            # new block for the front, the old object keeps the tail (and its stale request)
            nb = Block(addr, rounded, size, "active_allocated", stack, self.lineno)
            b.addr += rounded
            b.size -= rounded
            seg.blocks.insert(i, nb)
        else:
            b.req = size
            b.state = "active_allocated"
            b.stack = stack
            b.line = self.lineno
        self.bind(kw, addr)
        self.record(t, "alloc", addr, size, stream, stack, kw)

    def free_target(self, pos, action):
        self.nargs(pos, 1, 2, "%s ADDR [SIZE]" % action)
        addr = self.parse_int(pos[0], "address")
        seg, b = self.dev().live_block(addr)
        if b is None or b.state == "inactive":
            self.err("%s of %s: no live block starts there on device %d"
                     % (action, fmt_addr(addr), self.device))
        if len(pos) > 1:
            size = self.parse_int(pos[1], "size")
            if size != b.req:
                self.err("%s size %d does not match the block's requested size %d "
                         "(alloc on line %d)" % (action, size, b.req, b.line))
        return seg, b

    def free_stack(self, kw, b):
        if "stack" in kw:
            return self.stack_key(kw["stack"])
        return b.stack if self.context == "alloc" else None

    def ev_free_requested(self, t, pos, kw):
        seg, b = self.free_target(pos, "free_requested")
        if b.state == "active_pending_free":
            self.err("free_requested of %s: already requested on line %d"
                     % (fmt_addr(b.addr), b.line))
        stream = self.parse_int(kw["stream"], "stream") if "stream" in kw else seg.stream
        stack = self.free_stack(kw, b)
        b.state = "active_pending_free"
        b.line = self.lineno
        self.record(t, "free_requested", b.addr, b.req, stream, stack, kw)

    def ev_free_completed(self, t, pos, kw):
        seg, b = self.free_target(pos, "free_completed")
        if b.state != "active_pending_free" and self.strict:
            self.err("free_completed of %s without a free_requested (use skip_actions to "
                     "leave free_requested out of the trace)" % fmt_addr(b.addr))
        stream = self.parse_int(kw["stream"], "stream") if "stream" in kw else seg.stream
        stack = self.free_stack(kw, b)
        addr, req = b.addr, b.req
        b.state = "inactive"
        b.stack = None
        b.line = self.lineno
        # coalesce: the freed block object absorbs free neighbours
        i = seg.blocks.index(b)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            b.size += seg.blocks[i + 1].size
            del seg.blocks[i + 1]
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            prev = seg.blocks[i - 1]
            b.addr = prev.addr
            b.size += prev.size
            del seg.blocks[i - 1]
        self.record(t, "free_completed", addr, req, stream, stack, kw)

    def ev_free(self, t, pos, kw):
        self.ev_free_requested(t, pos, kw)
        self.ev_free_completed(t, pos, kw)

    def ev_snapshot(self, t, pos, kw):
        self.nargs(pos, 0, 1, "snapshot [SIZE]")
        active = sum(s.active_bytes() for s in self.dev().segments)
        if pos and self.parse_int(pos[0], "size") != active:
            self.err("snapshot size %s does not match the active bytes %d" % (pos[0], active))
        self.record(t, "snapshot", 0, active, 0, self.stack_key(kw.get("stack")), kw)

    def ev_oom(self, t, pos, kw):
        if len(pos) == 2:
            if pos[0] not in ("-", "0"):
                self.err("oom takes SIZE device_free=N (an ADDR, if given, must be 0 or -)")
            pos = pos[1:]
        self.nargs(pos, 1, 1, "oom SIZE device_free=N")
        size = self.parse_int(pos[0], "oom size")
        if self.strict and size != round_size(size):
            self.err("oom size must be the rounded request: round_size(%d) = %d"
                     % (size, round_size(size)))
        if "device_free" not in kw:
            self.err("oom needs device_free=N")
        free = self.parse_int(kw["device_free"], "device_free")
        stream = self.parse_int(kw.get("stream", "0"), "stream")
        self.record(t, "oom", None, size, stream, self.stack_key(kw.get("stack")), kw,
                    device_free=free)

    # ---- output -------------------------------------------------------------------------
    def build(self):
        era = self.era or "2.11"
        old = era == "2.0"
        has_time = era in ("2.6", "2.11")
        newest = era == "2.11"
        frame_objs = {}
        stack_objs = {}
        empty = []   # PyTorch shares one empty frames list

        def frame(f):
            o = frame_objs.get(f)
            if o is None:
                fn, ln, name = f
                if old:
                    o = {"filename": fn, "name": name, "line": ln}
                else:
                    o = {"name": name, "filename": fn, "line": ln}
                frame_objs[f] = o
            return o

        def frames(key):
            if key is None:
                return None
            o = stack_objs.get(key)
            if o is None:
                o = stack_objs[key] = [frame(f) for f in key]
            return o

        ndev = max(self.devices) + 1 if self.devices else 0
        traces = []
        for dev in range(ndev):
            d = self.devices.get(dev)
            out = []
            for e in (d.events if d else []):
                if e["action"] in self.skip:
                    continue
                te = {"action": e["action"]}
                if e["action"] == "oom":
                    te["device_free"] = e["device_free"]
                else:
                    te["addr"] = e["addr"]
                te["size"] = e["size"]
                te["stream"] = e["stream"]
                if has_time:
                    te["time_us"] = e["time"]
                if newest:
                    te["compile_context"] = e["ctx"]
                    te["user_metadata"] = e["meta"]
                fr = frames(e["stack"])
                if fr is not None:
                    te["frames"] = fr
                out.append(te)
            if self.max_entries is not None and len(out) > self.max_entries:
                out = out[-self.max_entries:]
            traces.append(out)

        segments = []
        for dev in sorted(self.devices):
            for s in self.devices[dev].segments:
                blocks = []
                allocated = active = requested = 0
                for b in s.blocks:
                    is_active = b.state != "inactive"
                    if is_active:
                        active += b.size
                        requested += b.req
                        if b.state == "active_allocated":
                            allocated += b.size
                    fr = frames(b.stack) if is_active else None
                    if old:
                        bd = {"size": b.size, "requested_size": b.req, "state": b.state}
                        if is_active:
                            bd["history"] = [{"addr": b.addr, "real_size": b.req,
                                              "frames": fr if fr is not None else []}]
                    else:
                        bd = {"address": b.addr, "size": b.size, "requested_size": b.req,
                              "state": b.state, "frames": fr if fr is not None else empty}
                    blocks.append(bd)
                sd = {"device": s.device, "address": s.addr, "total_size": s.size,
                      "allocated_size": allocated, "active_size": active,
                      "requested_size": requested, "stream": s.stream,
                      "segment_type": s.pool}
                if not old:
                    sd["segment_pool_id"] = (0, 0)
                    sd["is_expandable"] = False
                    fr = frames(s.stack)
                    sd["frames"] = fr if fr is not None else empty
                sd["blocks"] = blocks
                segments.append(sd)

        obj = {"segments": segments, "device_traces": traces}
        if has_time:
            settings = {
                "PYTORCH_CUDA_ALLOC_CONF": "",
                "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "expandable_segments": False,
                "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
            }
            if newest:
                settings["graph_capture_record_stream_reuse"] = False
            settings["roundup_power2_divisions"] = {str(1 << i): 0 for i in range(16)}
            settings.update(self.settings)
            obj["allocator_settings"] = settings
            anns = list(self.annotations)
            if self.max_entries is not None:
                # each device's annotations are a ring buffer of the same capacity as its trace
                keep, seen = [], {}
                for a in reversed(anns):
                    seen[a["device"]] = seen.get(a["device"], 0) + 1
                    if seen[a["device"]] <= self.max_entries:
                        keep.append(a)
                anns = keep[::-1]
            obj["external_annotations"] = anns
        else:
            if self.annotations:
                warn("%s: era %s has no external_annotations; %d annotation(s) dropped"
                     % (self.path, era, len(self.annotations)))
            if self.settings:
                warn("%s: era %s has no allocator_settings; setting lines ignored"
                     % (self.path, era))
        return obj


def warn(msg):
    print("warning: " + msg, file=sys.stderr)


def compile_fixture(path, text=None):
    """Parse and replay a fixture; return the snapshot object (raises FixtureError)."""
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    c = Compiler(path)
    c.run(text)
    return c.build()


def main(argv=None):
    ap = argparse.ArgumentParser(description="Compile a text fixture into a PyTorch memory "
                                             "snapshot pickle (see the module docstring).")
    ap.add_argument("fixture")
    ap.add_argument("-o", "--output", help="write the snapshot pickle (protocol 4) here")
    ap.add_argument("--json", help="write the same object as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print a summary to stderr")
    args = ap.parse_args(argv)
    if not args.output and not args.json:
        ap.error("give -o OUT.pickle and/or --json OUT.json")
    try:
        obj = compile_fixture(args.fixture)
    except FixtureError as e:
        print("%s:%d: error: %s" % (args.fixture, e.lineno, e.message), file=sys.stderr)
        return 1
    except OSError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, "wb") as f:
            pickle.dump(obj, f, protocol=4)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(obj, f)
            f.write("\n")
    if args.verbose:
        counts = {}
        for tr in obj["device_traces"]:
            for e in tr:
                counts[e["action"]] = counts.get(e["action"], 0) + 1
        print("%d segment(s), %d trace entries %s" % (
            len(obj["segments"]), sum(counts.values()), counts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
