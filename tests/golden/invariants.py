"""What the derived outputs must agree on with `analyze --json` (docs/testing.md, "Invariants").

The timeline, the report's data, the Perfetto export and the folded stacks are views of the same
replay that `analyze --json` summarises; their byte layout is theirs to change, their figures are
not. Each check_* function takes the output and analyze's parsed document and returns a list of
problems (empty when every invariant holds). Nothing here knows the expected figures of an input:
every number is compared with another output of the same run, or with a sum over the same output.
"""
import json

PEAKS = ("reserved", "allocated", "requested", "active")
COLUMNS = ["event", "time_us", "reserved", "allocated", "requested", "pending_free"]


def _devices(an):
    return {d["device"]: d for d in an["devices"]}


def _peak(dev, kind):
    return (dev[f"peak_{kind}_bytes"], dev[f"peak_{kind}_event"], dev[f"peak_{kind}_time_us"])


def _report_rows(pts):
    """The report's points (a column per field) as timeline rows (COLUMNS), times as analyze
    writes them (null where unknown)."""
    cols = [pts.get("pending" if c == "pending_free" else c) for c in COLUMNS]
    cols[1] = [_nt(x) for x in cols[1]] if cols[1] else [None] * len(cols[0])
    return [list(r) for r in zip(*cols)]


def _perfetto_devices(doc):
    """pid -> device of the export's GPU processes."""
    pid_dev = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            name = e["args"]["name"]
            if name.startswith("GPU "):
                pid_dev[e["pid"]] = int(name[4:])
    return pid_dev


def _perfetto_ts(doc):
    """The export's ts of the moment after an event (with its time_us): 0 for the start state,
    else microseconds since time_origin_us, or event + 1 when the file has no times."""
    od = doc["otherData"]
    origin = int(od.get("time_origin_us", 0))
    timed = od.get("time_axis") == "time_us"
    return lambda ev, t: 0 if ev in (None, -1) else (t - origin if timed else ev + 1)


def _series(where, rows, dev, out):
    """A device's series of points (rows of COLUMNS) against analyze's device: the start state,
    the peaks reached at their events and never exceeded, the end state, event order."""
    n = dev["events"]
    if not rows:
        out.append(f"{where}: no points")
        return
    events = [r[0] for r in rows]
    if events[0] != -1:
        out.append(f"{where}: the first point is event {events[0]}, not the start state (-1)")
    if any(b <= a for a, b in zip(events, events[1:])):
        out.append(f"{where}: point events are not strictly increasing")
    if n and events[-1] != n - 1:
        out.append(f"{where}: the last point is event {events[-1]}, not the last event {n - 1}")
    at = {r[0]: r for r in rows}
    for col, kind in ((2, "reserved"), (3, "allocated"), (4, "requested")):
        peak, ev, _ = _peak(dev, kind)
        top = max(r[col] for r in rows)
        if top != peak:
            out.append(f"{where}: highest {kind} point {top} != analyze's peak {peak}")
        if n and ev is not None and ev in at and at[ev][col] != peak:
            out.append(f"{where}: {kind} at the peak's event {ev} is {at[ev][col]}, not {peak}")
        if n and ev is not None and ev not in at:
            out.append(f"{where}: the {kind} peak's event {ev} has no point")
    start = rows[0]
    if start[2] != dev["start_reserved_bytes"] or start[4] != dev["start_requested_bytes"]:
        out.append(f"{where}: start point {start[2:5]} != analyze's start "
                   f"(reserved {dev['start_reserved_bytes']}, requested "
                   f"{dev['start_requested_bytes']})")
    final = dev.get("final")
    if n and final:
        last = rows[-1]
        want = [final["reserved_bytes"], final["allocated_bytes"], final["requested_bytes"],
                final["pending_free_bytes"]]
        if list(last[2:6]) != want:
            out.append(f"{where}: last point {list(last[2:6])} != analyze's final state {want}")


def _ooms(where, got, dev, out):
    want = [(o["event"], o["request_bytes"]) for o in dev.get("ooms", [])]
    have = [(o["event"], o["request_bytes"]) for o in got]
    if have[: len(want)] != want or len(have) != dev.get("oom_count", len(want)):
        out.append(f"{where}: OOMs {have[:4]}... ({len(have)}) != analyze's {want[:4]}... "
                   f"({dev.get('oom_count')})")


def check_timeline(doc, an):
    out = []
    devs = _devices(an)
    got = {d["device"]: d for d in doc["devices"]}
    if sorted(got) != sorted(devs):
        out.append(f"timeline devices {sorted(got)} != analyze's {sorted(devs)}")
    if doc.get("point_columns") != COLUMNS:
        out.append(f"timeline point_columns {doc.get('point_columns')}")
    for d, t in got.items():
        dev = devs.get(d)
        if dev is None:
            continue
        where = f"timeline cuda:{d}"
        if t["events"] != dev["events"] or t["total_points"] != dev["events"] + 1:
            out.append(f"{where}: events {t['events']} / points {t['total_points']} != analyze's "
                       f"{dev['events']} events")
        if t["kept_points"] != len(t["points"]):
            out.append(f"{where}: kept_points {t['kept_points']} != {len(t['points'])} points")
        if not t["downsampled"] and (t["bucket_size"] != 1 or
                                     len(t["points"]) != t["total_points"]):
            out.append(f"{where}: not downsampled but {len(t['points'])} of "
                       f"{t['total_points']} points kept (bucket {t['bucket_size']})")
        for kind in PEAKS:
            mine = (t[f"peak_{kind}_bytes"], t[f"peak_{kind}_event"], t[f"peak_{kind}_time_us"])
            if mine != _peak(dev, kind):
                out.append(f"{where}: peak {kind} {mine} != analyze's {_peak(dev, kind)}")
        _series(where, t["points"], dev, out)
        if t["points"] and t["peak_pending_free_bytes"] != max(r[5] for r in t["points"]):
            out.append(f"{where}: peak_pending_free_bytes is not the highest pending point")
        _ooms(where, t["ooms"], dev, out)
        for p in t["phases"]:
            # An empty phase ends one event before it starts.
            if not (0 <= p["first_event"] <= p["last_event"] + 1 <= dev["events"]):
                out.append(f"{where}: phase {p['name']!r} spans events {p['first_event']}.."
                           f"{p['last_event']} outside 0..{dev['events'] - 1}")
            if (p["peak_requested_bytes"] or 0) > dev["peak_requested_bytes"]:
                out.append(f"{where}: phase {p['name']!r} peaks above the device's peak")
    return out + check_timeline_extra(doc, an)


def check_collapsed(text, an, value, user=False):
    """Folded stacks of the live blocks at a peak: per `cuda:N` root the bytes add up to the
    device's peak (requested, or allocated with --value allocated)."""
    out = []
    sums = {}
    for i, line in enumerate(text.splitlines(), 1):
        stack, _, num = line.rpartition(" ")
        if not stack or not num.isdigit() or int(num) == 0:
            out.append(f"collapsed line {i}: not 'frames BYTES' with BYTES > 0: {line[:80]!r}")
            continue
        root = stack.split(";")[0]
        sums[root] = sums.get(root, 0) + int(num)
    for d, dev in _devices(an).items():
        want = dev[f"peak_{value}_bytes"]
        got = sums.pop(f"cuda:{d}", 0)
        if got != want:
            out.append(f"collapsed cuda:{d}: {got} bytes != analyze's peak {value} {want}")
    if sums:
        out.append(f"collapsed roots with no device in analyze: {sorted(sums)[:4]}")
    return out + check_collapsed_extra(text, an, value, user)


def check_perfetto(doc, an):
    """Counter tracks per device: highest value = analyze's peak, last value = its final state;
    one instant per peak, one per OOM; begin and end slices balanced."""
    out = []
    events = doc["traceEvents"]
    pid_dev = _perfetto_devices(doc)
    devs = _devices(an)
    if sorted(pid_dev.values()) != sorted(devs):
        out.append(f"perfetto devices {sorted(pid_dev.values())} != analyze's {sorted(devs)}")
    counters, instants, depth, last_ts = {}, {}, {}, {}
    for e in events:
        d = pid_dev.get(e.get("pid"))
        ph = e.get("ph")
        if ph == "M":
            continue
        if d is None:
            out.append(f"perfetto: event on pid {e.get('pid')} with no GPU process")
            break
        if e["ts"] < 0:
            out.append(f"perfetto cuda:{d}: negative ts {e['ts']}")
        if ph == "C":
            key = (d, e["name"])
            if e["ts"] < last_ts.get(key, 0):
                out.append(f"perfetto cuda:{d} {e['name']}: counter goes back in time")
            last_ts[key] = e["ts"]
            s = counters.setdefault(key, [None, 0])
            s[0] = e["args"]["bytes"]
            s[1] = max(s[1], s[0])
        elif ph == "i":
            instants[(d, e["name"])] = instants.get((d, e["name"]), 0) + 1
        elif ph in ("B", "E"):
            k = (d, e.get("tid"))
            depth[k] = depth.get(k, 0) + (1 if ph == "B" else -1)
            if depth[k] < 0:
                out.append(f"perfetto cuda:{d}: an end with no begin")
    if any(v != 0 for v in depth.values()):
        out.append("perfetto: begin and end slices are not balanced")
    for d, dev in devs.items():
        final = dev.get("final")
        for kind, fkey in (("reserved", "reserved_bytes"), ("allocated", "allocated_bytes"),
                           ("requested", "requested_bytes")):
            last, top = counters.get((d, kind), [0, 0])
            if top != dev[f"peak_{kind}_bytes"]:
                out.append(f"perfetto cuda:{d}: highest {kind} {top} != analyze's peak "
                           f"{dev[f'peak_{kind}_bytes']}")
            if final and dev["events"] and last != final[fkey]:
                out.append(f"perfetto cuda:{d}: last {kind} {last} != analyze's final "
                           f"{final[fkey]}")
        if dev["events"]:
            for kind in ("reserved", "allocated", "requested"):
                if instants.get((d, f"peak {kind}"), 0) != 1:
                    out.append(f"perfetto cuda:{d}: {instants.get((d, f'peak {kind}'), 0)} "
                               f"'peak {kind}' instants, not 1")
        if instants.get((d, "OOM"), 0) != dev.get("oom_count", 0):
            out.append(f"perfetto cuda:{d}: {instants.get((d, 'OOM'), 0)} OOM instants != "
                       f"analyze's {dev.get('oom_count', 0)}")
    return out + check_perfetto_extra(doc, an)


def _icicle(where, t, out, root_bytes, at_most):
    n = len(t["frame"])
    if not n:
        if at_most and root_bytes is not None and root_bytes[0]:
            out.append(f"{where}: no call tree, with {root_bytes[0]} bytes held")
        return
    if not all(len(t[k]) == n for k in ("parent", "bytes", "self", "blocks")):
        out.append(f"{where}: icicle arrays of different lengths")
        return
    child = [0] * n
    for i in range(1, n):
        p = t["parent"][i]
        if not 0 <= p < i:
            out.append(f"{where}: icicle node {i} has parent {p}")
            return
        child[p] += t["bytes"][i]
    for i in range(n):
        if t["self"][i] + child[i] != t["bytes"][i]:
            out.append(f"{where}: icicle node {i}: self {t['self'][i]} + children {child[i]} != "
                       f"{t['bytes'][i]}")
            return
    if root_bytes is not None and not root_bytes[0] <= t["bytes"][0] <= root_bytes[1]:
        out.append(f"{where}: icicle root {t['bytes'][0]} outside {root_bytes}, the requested "
                   "bytes of the allocated blocks")
    if t["bytes"][0] > at_most:
        out.append(f"{where}: icicle root {t['bytes'][0]} > {at_most} requested")


def _keyframe(where, k, out):
    """A block map covers its segments exactly and adds up to the moment's counters. Returns the
    range (low, high) of the requested bytes of its allocated (not pending-free) blocks (a run
    mixing allocated and pending-free blocks makes it a range), or None without a map."""
    seg, blk = k["segments"], k["blocks"]
    if not seg:
        return None
    reserved = allocated = requested = pending = held = mixed = 0
    pos = 0
    for s in range(0, len(seg), 6):
        size, n = seg[s + 1], seg[s + 5]
        reserved += size
        covered = 0
        end = pos + n
        while pos < end:
            bsize, breq, code = blk[pos], blk[pos + 1], blk[pos + 2]
            covered += bsize
            if code & 32:  # a run of small blocks: count, free bytes, pending bytes
                free, pend = blk[pos + 4], blk[pos + 5]
                allocated += bsize - free - pend
                pending += pend
                requested += breq
                if pend:  # a run's requested bytes are not split by state: some may be held
                    mixed += breq
                else:
                    held += breq
                pos += 6
            else:
                state = code & 3
                if state == 1:
                    allocated += bsize
                    held += breq
                elif state == 2:
                    pending += bsize
                if state:
                    requested += breq
                pos += 5
        if covered != size:
            out.append(f"{where}: segment at {seg[s]}: blocks cover {covered} of {size} bytes")
            return None
    if pos != len(blk):
        out.append(f"{where}: {len(blk) - pos} block values belong to no segment")
    at = k["at"]
    if reserved != at["reserved_bytes"]:
        out.append(f"{where}: segments add up to {reserved}, reserved is {at['reserved_bytes']}")
    if (allocated, pending) != (at["allocated_bytes"], at["pending_free_bytes"]):
        out.append(f"{where}: blocks add up to {allocated} allocated and {pending} pending "
                   f"free, the counters say {at['allocated_bytes']} and "
                   f"{at['pending_free_bytes']}")
    if requested != at["requested_bytes"]:
        out.append(f"{where}: requested bytes of the blocks add up to {requested}, requested "
                   f"is {at['requested_bytes']}")
    return (held, held + mixed)


def check_report(doc, an):
    """The report's data: its analysis is analyze's document, its series and block maps are the
    same replay's."""
    out = []
    mine = json.loads(json.dumps(doc["analysis"]))
    for d in mine["devices"]:
        d.pop("top_frames_at_requested_peak", None)
    if mine != an:
        out.append("report: its analysis differs from analyze --json")
    # The page's headline box: analyze's headline, the count of warnings left out of it included.
    if doc["headline"] != an["headline"]:
        out.append("report: its headline differs from analyze's")
    devs = _devices(an)
    for t in doc["devices"]:
        d = t["device"]
        dev = devs.get(d)
        where = f"report cuda:{d}"
        if dev is None:
            out.append(f"{where}: no such device in analyze")
            continue
        if t["events"] != dev["events"] or t["total_points"] != dev["events"] + 1:
            out.append(f"{where}: {t['events']} events != analyze's {dev['events']}")
        for kind in PEAKS:
            p = t["peaks"][kind]
            # The page writes an unknown moment as -1.
            if (p["bytes"], _nt(p["event"]), _nt(p["time_us"])) != _peak(dev, kind):
                out.append(f"{where}: peak {kind} {p} != analyze's {_peak(dev, kind)}")
        pts = t["points"]
        if pts is None:
            if dev["events"]:
                out.append(f"{where}: no points for {dev['events']} events")
            continue
        rows = _report_rows(pts)
        _series(where, rows, dev, out)
        _ooms(where, t["ooms"], dev, out)
        # Call trees leave pending-free blocks out (as `analyze --top-frames` does): a tree's root
        # is the requested bytes of the moment's allocated blocks, from its block map where the
        # moment has one, and never more than the moment's requested bytes.
        at = {r[0]: r for r in rows}
        held = {}
        for k in t["keyframes"]:
            kw = f"{where} keyframe at event {k['event']}"
            if t["layout_exact"]:
                held[k["event"]] = _keyframe(kw, k, out)
            r = at.get(k["event"])
            c = k["at"]
            if r is not None and t["layout_exact"]:
                # The model's blocks keep a large block's unsplit slack (up to 1 MiB), which the
                # trace does not record: its allocated and pending-free bytes can only be higher,
                # and equal the timeline's where analyze says allocated bytes are exact.
                same = (r[2], r[4]) == (c["reserved_bytes"], c["requested_bytes"])
                slack = [c["allocated_bytes"] - r[3], c["pending_free_bytes"] - r[5]]
                if not same or min(slack) < 0 or (dev["allocated_exact"] and any(slack)):
                    out.append(f"{kw}: counters {c} against the timeline's point {list(r[2:6])}")
            if k["icicle_source"] != "none" and k["icicle"]["frame"]:
                _icicle(kw, k["icicle"], out, held.get(k["event"]), c["requested_bytes"])
        _icicle(f"{where} peak tree", t["icicle"], out, held.get(t["icicle_event"]),
                dev["peak_requested_bytes"])
    w = doc.get("whatif") or {}
    if w.get("present"):
        dev = devs.get(w["device"])
        base = [r for r in w["rows"] if r["baseline"]]
        if len(base) != 1:
            out.append(f"report what-if: {len(base)} baseline rows")
        elif dev is not None and w["complete_history"] and base[0]["exact"]:
            b = base[0]
            if (b["peak_reserved_bytes"], b["oom_count"]) != (dev["peak_reserved_bytes"],
                                                             dev["oom_count"]):
                out.append(f"report what-if: the exact baseline gives peak "
                           f"{b['peak_reserved_bytes']} and {b['oom_count']} OOMs, the file "
                           f"{dev['peak_reserved_bytes']} and {dev['oom_count']}")
    return out + check_report_extra(doc, an)


# ---- Second round (a red-team read of the first): moments, views against each other ------------

def _nt(x):
    """The page and the exports write an unknown moment as -1, analyze as null."""
    return None if x in (None, -1) else x


def _points_vs_analyze(where, rows, dev, downsampled, out):
    """rows: [event, time_us|None, reserved, allocated, requested, pending]."""
    at = {r[0]: r for r in rows}
    times = [r[1] for r in rows[1:]]
    if any(t is not None for t in times) and any(b < a for a, b in zip(times, times[1:])):
        out.append(f"{where}: point times go back")
    for kind in ("reserved", "allocated", "requested"):
        ev, t = dev[f"peak_{kind}_event"], dev[f"peak_{kind}_time_us"]
        if ev is not None and ev in at and at[ev][1] != t:
            out.append(f"{where}: time at the {kind} peak {at[ev][1]} != analyze's {t}")
    if dev["events"] and rows[-1][1] != dev.get("last_time_us"):
        out.append(f"{where}: last point time {rows[-1][1]} != analyze's {dev.get('last_time_us')}")
    for r in rows:
        if r[3] + r[5] > r[2] or r[4] > r[3] + r[5]:
            out.append(f"{where}: event {r[0]}: requested <= allocated + pending <= reserved fails "
                       f"{list(r[2:6])}")
            break
    for o in dev.get("ooms", []):
        r, st = at.get(o["event"]), o["state"]
        want = [st["reserved_bytes"], st["allocated_bytes"], st["requested_bytes"],
                st["pending_free_bytes"]]
        if r is None or list(r[2:6]) != want or r[1] != o["time_us"]:
            out.append(f"{where}: point at OOM event {o['event']} {r} != analyze's state {want}")
    if not downsampled and dev["events"]:
        ea = dev["events_by_action"]
        ups = lambda c, sign: sum(1 for a, b in zip(rows, rows[1:]) if (b[c] - a[c]) * sign > 0)
        got = (ups(2, 1), ups(2, -1), ups(4, 1))
        want = (ea.get("segment_alloc", 0) + ea.get("segment_map", 0),
                ea.get("segment_free", 0) + ea.get("segment_unmap", 0), ea.get("alloc", 0))
        if got != want:
            out.append(f"{where}: reserved up/down and requested up steps {got} != analyze's "
                       f"segment allocs/frees and allocs {want}")


def check_timeline_extra(doc, an):
    out = []
    devs = _devices(an)
    for t in doc["devices"]:
        dev = devs.get(t["device"])
        if dev is None:
            continue
        where = f"timeline cuda:{t['device']}"
        rows = t["points"]
        _points_vs_analyze(where, rows, dev, t["downsampled"], out)
        for a, b in zip(t["ooms"], dev.get("ooms", [])):
            if (a["time_us"], a["device_free_bytes"]) != (b["time_us"], b["device_free_bytes"]):
                out.append(f"{where}: OOM at {a['event']}: time/free {a['time_us']}, "
                           f"{a['device_free_bytes']} != analyze's")
        sp = t["requested_sparkline_bytes"]
        if dev["events"] and sp and max(sp) != dev["peak_requested_bytes"]:
            out.append(f"{where}: sparkline max {max(sp)} != peak requested")
        for kind in ("streams", "pools"):
            for i, r in enumerate(rows if t[kind] else []):
                if [sum(x["points"][i][c] for x in t[kind]) for c in (2, 3, 4, 5)] != list(r[2:6]):
                    out.append(f"{where}: {kind} do not add up to the device at event {r[0]}")
                    break
        req = {r[0]: r[4] for r in rows}
        for p in t["phases"]:
            if p["first_event"] > p["last_event"]:
                continue
            inside = [v for e, v in req.items() if p["first_event"] <= e <= p["last_event"]]
            top = max(inside) if inside else None
            e = p["peak_requested_event"]
            peak = p["peak_requested_bytes"]
            if not p["first_event"] <= e <= p["last_event"] or (
                    top is not None and (top > peak or (not t["downsampled"] and top != peak))):
                out.append(f"{where}: phase {p['name']!r} peak {p['peak_requested_bytes']} at {e}, "
                           f"series max inside {top}")
    return out


def check_report_extra(doc, an):
    out = []
    devs = _devices(an)
    got = sorted(t["device"] for t in doc["devices"])
    if len(devs) <= 16 and got != sorted(devs):
        out.append(f"report devices {got} != analyze's {sorted(devs)}")
    for t in doc["devices"]:
        dev = devs.get(t["device"])
        pts = t["points"]
        if dev is None or pts is None:
            continue
        where = f"report cuda:{t['device']}"
        rows = _report_rows(pts)
        _points_vs_analyze(where, rows, dev, t["downsampled"], out)
        at = {r[0]: r for r in rows}
        kf = {k["event"]: k for k in t["keyframes"]}
        if dev["events"]:
            for kind in PEAKS[:3]:
                ev = dev[f"peak_{kind}_event"]
                if ev is not None and ev not in kf:
                    out.append(f"{where}: no keyframe at the {kind} peak (event {ev})")
            for o in dev.get("ooms", [])[:16]:
                if o["event"] not in kf:
                    out.append(f"{where}: no keyframe at the OOM (event {o['event']})")
        for e, k in kf.items():
            if e in at and _nt(k["time_us"]) != at[e][1]:
                out.append(f"{where}: keyframe {e} time {k['time_us']} != its point's {at[e][1]}")
        if dev["events"] and _nt(t["icicle_event"]) != dev["peak_requested_event"]:
            out.append(f"{where}: peak tree at {t['icicle_event']}, the peak is at "
                       f"{dev['peak_requested_event']}")
        if dev["live_blocks_at_requested_peak"] and not t["icicle"]["frame"]:
            out.append(f"{where}: empty peak tree with {dev['live_blocks_at_requested_peak']} "
                       "blocks live")
        b = t["allocations"]["buckets"]
        if b["total"] and max(b["total"]) != dev["peak_requested_bytes"]:
            out.append(f"{where}: allocation view peaks at {max(b['total'])}")
        for e, tot in zip(b["at_event"], b["total"]):
            if e in at and at[e][4] != tot:
                out.append(f"{where}: allocation view at {e}: {tot} != requested {at[e][4]}")
                break
    return out


def check_perfetto_extra(doc, an):
    out = []
    ts_of = _perfetto_ts(doc)
    pid = _perfetto_devices(doc)
    for d, dev in _devices(an).items():
        mine = [e for e in doc["traceEvents"] if pid.get(e.get("pid")) == d]
        where = f"perfetto cuda:{d}"
        ser = {k: [e["args"]["bytes"] for e in mine if e["ph"] == "C" and e["name"] == k]
               for k in ("reserved", "allocated", "requested", "pending_free")}
        start = dev["start"]
        if [v[:1] for v in ser.values()] != [[start[k + "_bytes"]] for k in ser]:
            out.append(f"{where}: first counters != analyze's start state")
        ea = dev["events_by_action"]
        ups = lambda v, s: sum(1 for a, b in zip(v, v[1:]) if (b - a) * s > 0)
        got = (ups(ser["reserved"], 1), ups(ser["reserved"], -1), ups(ser["requested"], 1))
        want = (ea.get("segment_alloc", 0) + ea.get("segment_map", 0),
                ea.get("segment_free", 0) + ea.get("segment_unmap", 0), ea.get("alloc", 0))
        if got != want:
            out.append(f"{where}: counter up/down steps {got} != analyze's events {want}")
        for kind in PEAKS[:3]:
            want = _peak(dev, kind)
            for e in mine:
                if e["ph"] == "i" and e["name"] == f"peak {kind}":
                    a = e["args"]
                    if ((a["bytes"], _nt(a["event"]), a["time_us"]) != want or
                            e["ts"] != ts_of(want[1], want[2])):
                        out.append(f"{where}: 'peak {kind}' instant {a} at ts {e['ts']} != {want}")
        oi = [e for e in mine if e["ph"] == "i" and e["name"] == "OOM"]
        for e, o in zip(oi, dev.get("ooms", [])):
            a, st = e["args"], o["state"]
            if ([a[k] for k in ("event", "request_bytes", "device_free_bytes", "time_us", "stream")]
                    != [o[k] for k in ("event", "request_bytes", "device_free_bytes", "time_us",
                                       "stream")] or
                    any(a[k] != st[k] for k in st) or e["ts"] != ts_of(o["event"], o["time_us"])):
                out.append(f"{where}: OOM instant at event {a['event']} != analyze's OOM "
                           f"{o['event']}")
    return out


def check_collapsed_extra(text, an, value, user=False, blocks=None):
    """blocks: device -> blocks --json --at peak document (optional)."""
    out = []
    lines = text.splitlines()
    if len(set(l.rpartition(" ")[0] for l in lines)) != len(lines) or lines != sorted(lines):
        out.append("collapsed: stacks repeated or not sorted")
    for d, dev in _devices(an).items():
        root = f"cuda:{d}"
        rows = [(l.rpartition(" ")[0].split(";")[1:], int(l.rpartition(" ")[2])) for l in lines
                if l.split(";")[0] == root]
        pend = sum(n for fs, n in rows if fs[-1:] == ["[pending free]"])
        held = [(fs, n) for fs, n in rows if fs[-1:] != ["[pending free]"]]
        if value == "requested" and blocks and d in blocks:
            bl = [b for s in blocks[d]["segments"] for b in s["blocks"]]
            want = [sum(b.get("requested_size", 0) for b in bl if b["state"] == st)
                    for st in ("active_pending_free", "active_allocated")]
            if [pend, sum(n for _, n in held)] != want:
                out.append(f"collapsed {root}: pending/held {pend}/{sum(n for _, n in held)} != "
                           f"blocks --at peak {want}")
        if value == "requested" and user:
            frame = lambda f: (f"{f['name']} ({f['filename']}" +
                               (f":{f['line']})" if f["line"] is not None else ")")
                               if f["filename"] else f["name"])
            sums = {}
            for fs, n in held:
                k = tuple(reversed(fs[-3:]))
                sums[k] = sums.get(k, 0) + n
            for g in dev["top_allocations_at_requested_peak"]:
                keys = ([("[empty stack]",), ("[no stack recorded]",)] if not g["frames"]
                        else [tuple(frame(f) for f in g["frames"])])
                if sum(sums.get(k, 0) for k in keys) != g["requested_bytes"]:
                    out.append(f"collapsed {root}: {keys[0][:1]}... holds "
                               f"{sum(sums.get(k, 0) for k in keys)}, analyze's group "
                               f"{g['requested_bytes']}")
    return out


def check_collapsed_pair(req_text, alloc_text, an):
    """At a device whose allocated and requested peaks are one event: the same stacks (pending
    free left out), each holding at least its requested bytes."""
    out = []
    parse = lambda t: {l.rpartition(" ")[0]: int(l.rpartition(" ")[2]) for l in t.splitlines()}
    req, alc = parse(req_text), parse(alloc_text)
    for d, dev in _devices(an).items():
        if dev["peak_allocated_event"] != dev["peak_requested_event"]:
            continue
        r = {k: v for k, v in req.items() if k.split(";")[0] == f"cuda:{d}"
             and not k.endswith(";[pending free]")}
        a = {k: v for k, v in alc.items() if k.split(";")[0] == f"cuda:{d}"}
        if set(r) != set(a) or any(a[k] < r[k] for k in r):
            out.append(f"collapsed cuda:{d}: allocated stacks differ from requested ones")
    return out


def check_cross(timeline, report, perfetto, an):
    """The views agree with each other: the report's points are the timeline's where both keep
    the event; Perfetto's counters are the timeline's series' changes at its points' times; the
    report's and Perfetto's phases are the timeline's."""
    out = []
    ts_of = _perfetto_ts(perfetto)
    origin = int(perfetto["otherData"].get("time_origin_us", 0))
    pid = _perfetto_devices(perfetto)
    rep = {t["device"]: t for t in report["devices"]}
    key = lambda p, pk: (p["name"], p["kind"], p["first_event"], p["last_event"],
                         _nt(p["start_us"]), _nt(p["end_us"]), p[pk] or 0)
    for t in timeline["devices"]:
        d, where = t["device"], f"cuda:{t['device']}"
        tp = {r[0]: list(r) for r in t["points"]}
        r = rep.get(d)
        if r is not None and r["points"] is not None:
            bad = [row for row in _report_rows(r["points"]) if row[0] in tp and tp[row[0]] != row]
            if bad:
                out.append(f"report {where}: point {bad[0]} != the timeline's {tp[bad[0][0]]}")
            if [key(p, "peak_requested") for p in r["phases"]] != [
                    key(p, "peak_requested_bytes") for p in t["phases"]][:len(r["phases"])]:
                out.append(f"report {where}: phases differ from the timeline's")
        if not t["downsampled"]:
            for c, k in ((2, "reserved"), (3, "allocated"), (4, "requested"), (5, "pending_free")):
                want, last = [], None
                for p in t["points"]:
                    if p[c] != last:
                        want.append((ts_of(p[0], p[1]), p[c]))
                        last = p[c]
                got = [(e["ts"], e["args"]["bytes"]) for e in perfetto["traceEvents"]
                       if e.get("ph") == "C" and pid.get(e["pid"]) == d and e["name"] == k]
                if got != want:
                    out.append(f"perfetto {where} {k}: counters != the timeline's series")
        slices, stack = [], {}
        for e in perfetto["traceEvents"]:
            if pid.get(e.get("pid")) != d or e["ph"] not in "BE":
                continue
            if e["ph"] == "B":
                stack.setdefault(e["tid"], []).append(e)
            elif stack.get(e["tid"]):
                b = stack[e["tid"]].pop()
                slices.append((b["name"], b["ts"], e["ts"]))
        want = [(p["name"], p["start_us"] - origin, p["end_us"] - origin) for p in t["phases"]
                if p["source"] == "annotation" and not p["open"]]
        if sorted(slices) != sorted(want):
            out.append(f"perfetto {where}: slices != the timeline's annotation phases")
    return out
