"""Results as Python objects: the CLI's JSON documents with attribute access, plus the tables and the
notebook view of an analysis."""
import re

from . import _cli


class Doc(dict):
    """A JSON object that also reads as attributes: ``doc.devices[0].peak_reserved_bytes`` is
    ``doc["devices"][0]["peak_reserved_bytes"]``. It is a plain dict otherwise (it compares equal
    to the CLI's JSON and serializes back with ``json.dumps``). Keys that are also dict methods
    (``items``, ``keys``, ``values``, ``get``...) are read with brackets: ``headline["items"]``."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __dir__(self):
        return sorted(set(super().__dir__()) | {k for k in self if k.isidentifier()})


def _frame(df_rows, columns):
    """A pandas DataFrame of the rows when pandas is installed, else the list of dicts. ``columns``
    come first, in that order, and are there even when no row has them (an empty table keeps its
    columns); fields only some rows have follow."""
    try:
        import pandas
    except ImportError:
        return df_rows
    extra = []
    for r in df_rows:
        extra += [k for k in r if k not in columns and k not in extra]
    # Nullable dtypes: integer columns stay exact integers where some rows lack the field.
    return pandas.DataFrame(df_rows, columns=[*columns, *extra]).convert_dtypes()


# `dump` event lines (docs/cli.md): DEVICE:INDEX [t=TIME] ACTION key=value ... (no t= for an
# event without a time; ACTION quoted when it is not a plain word); stack frames:
# `  "FILE":LINE "NAME"`, LINE `?` when unknown.
_EVENT = re.compile(r'^(\d+):(\d+) (?:t=(-?\d+) )?("(?:[^"\\]|\\.)*"|[^ ]+)(.*)$')
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
_FRAME = re.compile(r'^  "((?:[^"\\]|\\.)*)":(\d+|\?) "((?:[^"\\]|\\.)*)"$')
_ESCAPE = re.compile(r'\\x([0-9a-f]{2})|\\(.)')


def _unescape(v):
    """The text the CLI's escaper wrote (docs/cli.md, "Text output"): \\xNN is a byte, \\\\ and
    \\" the character; bytes that are not UTF-8 come back as U+FFFD."""
    out, pos = bytearray(), 0
    for m in _ESCAPE.finditer(v):
        out += v[pos:m.start()].encode("utf-8")
        out += bytes([int(m.group(1), 16)]) if m.group(1) else m.group(2).encode("utf-8")
        pos = m.end()
    out += v[pos:].encode("utf-8")
    return out.decode("utf-8", errors="replace")


def _unquote(v):
    if len(v) >= 2 and v.startswith('"') and v.endswith('"'):
        return _unescape(v[1:-1])
    return v


def _number(v):
    try:
        return int(v, 0)
    except ValueError:
        return v


def parse_dump(text, device=None):
    """Event rows and stacks of `memforensics dump --stacks` output."""
    rows, stacks, current = [], {}, None
    for line in text.split("\n"):  # not splitlines(): U+2028 may be inside a name
        m = _EVENT.match(line)
        if m:
            dev = int(m.group(1))
            if device is not None and dev != int(device):
                continue
            row = {"device": dev, "event": int(m.group(2)),
                   "time_us": int(m.group(3)) if m.group(3) is not None else None,
                   "action": _unquote(m.group(4)) if m.group(4).startswith('"') else _unescape(m.group(4))}
            for k, v in _FIELD.findall(m.group(5)):
                row[k] = _unquote(v) if v.startswith('"') else _number(v)
            rows.append(row)
            continue
        if line.startswith("stack "):
            current = stacks.setdefault(line[6:].strip(), [])
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            line_no = None if f.group(2) == "?" else int(f.group(2))
            current.append((_unescape(f.group(1)), line_no, _unescape(f.group(3))))
        elif not line.startswith("  "):
            current = None
    return rows, stacks


# The columns every events() / live_at() table has, rows or not.
EVENT_COLUMNS = ("device", "event", "time_us", "action", "addr", "size", "stream", "stack", "frames")
BLOCK_COLUMNS = ("device", "event", "segment_address", "segment_size", "pool", "stream", "address",
                 "size", "requested_size", "state", "alloc_event")


class Analysis(Doc):
    """`memforensics analyze --json` of one file, as an object; see ``analyze``."""

    __slots__ = ("_source", "_keep", "_view")

    def _attach(self, source, keep=None):
        object.__setattr__(self, "_source", str(source))
        object.__setattr__(self, "_keep", keep)  # a temporary directory to keep alive
        object.__setattr__(self, "_view", None)
        return self

    @property
    def source(self):
        """The file analysed (a temporary pickle when a snapshot dict was given)."""
        return self._source

    def report(self, path):
        """Writes the self-contained HTML report (`memforensics report`); returns the path."""
        _cli.run(["report", self._source, "-o", _cli.path_arg(path)])
        return str(path)

    def timeline(self, device=None, max_points=None):
        """`memforensics timeline --json`: the watermark series, peaks and phases per device."""
        args = ["timeline", self._source]
        if device is not None:
            args += ["--device", device]
        if max_points is not None:
            args += ["--max-points", max_points]
        return _cli.run_json(args, object_hook=Doc)

    def events(self, device=None):
        """Every event of the history, one row each: device, event, time_us, action, addr, size,
        stream, stack, frames (innermost first, as (file, line, function)) and the action's other
        fields. A pandas DataFrame when pandas is installed, else a list of dicts."""
        out = _cli.run(["dump", "--stacks", self._source]).stdout
        rows, stacks = parse_dump(out, device)
        for r in rows:
            r["frames"] = tuple(stacks.get(str(r.get("stack")), ()))
        return _frame(rows, EVENT_COLUMNS)

    def live_at(self, moment="peak", device=None):
        """The blocks of every segment at a moment (`memforensics blocks --at`: peak, oom, an event
        index, tTIME_US or t+DURATION), one row per block with its segment. A pandas DataFrame when
        pandas is installed, else a list of dicts."""
        args = ["blocks", self._source, "--at", moment]
        if device is not None:
            args += ["--device", device]
        doc = _cli.run_json(args)
        rows = []
        for s in doc.get("segments", []):
            for b in s.get("blocks", []):
                rows.append({"device": doc.get("device"), "event": doc.get("event"),
                             "segment_address": s.get("address"), "segment_size": s.get("size"),
                             "pool": s.get("pool"), "stream": s.get("stream"),
                             "address": b.get("address"), "size": b.get("size"),
                             "requested_size": b.get("requested_size"), "state": b.get("state"),
                             "alloc_event": b.get("alloc_event")})
        return _frame(rows, BLOCK_COLUMNS)

    def _repr_html_(self):
        from ._html import analysis_html
        if self._view is None:  # computed once: a notebook redraws often
            try:
                tl = self.timeline(max_points=240)
            except _cli.MemforensicsError:
                tl = None
            object.__setattr__(self, "_view", analysis_html(self, tl))
        return self._view

    def __repr__(self):
        devs = self.get("devices", [])
        head = self.get("headline") or {}
        items = head.get("items") or []
        first = items[0]["title"] if items else "no OOM and no high-severity finding"
        return f"<memforensics.Analysis {self._source!r}: {len(devs)} device(s); {first}>"
