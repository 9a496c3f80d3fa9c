"""memforensics.analyze and its result object, against the CLI's own JSON."""
import html
import json
import pickle
import subprocess

import pytest

import memforensics
from memforensics import _cli


def cli_json(*args):
    r = subprocess.run([_cli.binary(), *args, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[0])


def test_package_is_the_installed_one():
    assert "site-packages" in memforensics.__file__, memforensics.__file__
    assert (_cli.bin_dir() / "memforensics").is_file()
    # A platform wheel for any Python 3: it carries executables, no extension module.
    from importlib.metadata import distribution
    wheel = distribution("memforensics").read_text("WHEEL") or ""
    assert "Tag: py3-none-linux_" in wheel, wheel


def test_analyze_equals_the_cli_on_every_real_file(real_file):
    doc = memforensics.analyze(real_file)
    assert doc == cli_json("analyze", str(real_file))
    assert isinstance(doc, memforensics.Analysis)


def test_attribute_and_dict_access(sample):
    doc = memforensics.analyze(sample)
    d0 = doc.devices[0]
    assert d0.peak_reserved_bytes == doc["devices"][0]["peak_reserved_bytes"] > 0
    assert doc.headline["items"][0].kind == "oom_verdict"  # `items` is a dict method: brackets
    assert doc.headline["items"][0].where[0].filename == "model.py"
    assert "peak_reserved_bytes" in dir(d0)
    with pytest.raises(AttributeError):
        d0.no_such_field
    assert json.loads(json.dumps(doc)) == doc
    assert "4.00 GiB request failed" in repr(doc)


def test_a_snapshot_dict_is_analysed_like_its_file(sample):
    with open(sample, "rb") as f:
        snap = pickle.load(f)  # our own sample: a trusted file
    from_dict = memforensics.analyze(snap)
    from_file = memforensics.analyze(sample)
    assert from_dict.devices == from_file.devices
    assert from_dict.headline == from_file.headline
    assert from_dict.source.endswith(".pickle") and from_dict.source != sample


def test_device_selection(sample):
    assert [d.device for d in memforensics.analyze(sample, device=0).devices] == [0]


def test_errors_carry_the_tools_message(tmp_path):
    with pytest.raises(memforensics.MemforensicsError, match="cannot open|No such file"):
        memforensics.analyze(tmp_path / "missing.pickle")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04garbage")
    with pytest.raises(memforensics.MemforensicsError):
        memforensics.analyze(bad)
    with pytest.raises(memforensics.MemforensicsError):
        memforensics.analyze({"segments": "not a list"})


def test_report_writes_the_html_page(sample, tmp_path):
    out = memforensics.analyze(sample).report(tmp_path / "r.html")
    text = open(out, encoding="utf-8").read()
    assert text.lower().startswith("<!doctype html>") and "4.00 GiB request failed" in text


def records(table):
    """Rows as plain dicts whether the table is a DataFrame (pandas installed) or a list; a field a
    row lacks (pandas.NA in a DataFrame) is left out."""
    if isinstance(table, list):
        return table
    import pandas
    out = []
    for r in table.to_dict("records"):
        row = {}
        for k, v in r.items():
            if v is None or (not isinstance(v, (tuple, list)) and pandas.isna(v)):
                continue
            row[k] = int(v) if hasattr(v, "dtype") and v.dtype.kind in "iu" else v
        out.append(row)
    return out


def test_tables_are_dataframes_when_pandas_is_installed(sample):
    pandas = pytest.importorskip("pandas")
    ev = memforensics.analyze(sample).events()
    assert isinstance(ev, pandas.DataFrame) and str(ev["size"].dtype) == "Int64"
    assert int(ev["addr"].max()) == max(r["addr"] for r in records(ev) if "addr" in r) > 1 << 46


def test_events_are_every_event_with_its_frames(sample):
    doc = memforensics.analyze(sample)
    rows = records(doc.events())
    assert len(rows) == doc.devices[0].events
    counts = {}
    for r in rows:
        counts[r["action"]] = counts.get(r["action"], 0) + 1
    assert counts == doc.devices[0].events_by_action
    oom = [r for r in rows if r["action"] == "oom"]
    assert oom and oom[0]["size"] == 4 << 30
    assert oom[0]["frames"][0] == ("model.py", 37, "forward")
    first = rows[0]
    assert first["event"] == 0 and first["action"] == "segment_alloc" and first["size"] == 33554432
    assert all(isinstance(r["addr"], int) for r in rows if "addr" in r)


def test_events_on_every_real_file_are_every_event(real_file):
    dump = subprocess.run([_cli.binary(), "dump", str(real_file)], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    per_device = {int(l.split()[1].split("=")[1]): int(l.split()[2].split("=")[1])
                  for l in dump.stdout.splitlines() if l.startswith("trace device=")}
    rows = records(memforensics.analyze(real_file).events())
    counts = {}
    for r in rows:
        counts[r["device"]] = counts.get(r["device"], 0) + 1
    assert counts == {d: n for d, n in per_device.items() if n}
    with_stack = [r for r in rows if isinstance(r.get("stack"), int)]
    assert all(r["frames"] for r in with_stack) or not with_stack


def test_live_at_the_peak_adds_up(sample):
    doc = memforensics.analyze(sample)
    rows = records(doc.live_at("peak"))
    blocks = cli_json("blocks", sample, "--at", "peak")
    assert len(rows) == sum(len(s["blocks"]) for s in blocks["segments"])
    live = sum(r["size"] for r in rows if r["state"] == "active_allocated")
    assert live == sum(s["allocated_bytes"] for s in blocks["segments"])
    assert {r["event"] for r in rows} == {blocks["event"]}
    at5 = records(doc.live_at(5))
    blocks5 = cli_json("blocks", sample, "--at", "5")
    assert [(r["address"], r["size"], r["state"]) for r in at5] == [
        (b["address"], b["size"], b["state"]) for s in blocks5["segments"] for b in s["blocks"]]
    assert at5 and {r["event"] for r in at5} == {5}
    assert sum(r["size"] for r in at5 if r["state"] == "active_allocated") == sum(
        s["allocated_bytes"] for s in blocks5["segments"])


def test_timeline(sample):
    tl = memforensics.analyze(sample).timeline(max_points=50)
    d = tl.devices[0]
    assert d.peak_reserved_bytes == memforensics.analyze(sample).devices[0].peak_reserved_bytes
    assert d.downsampled and len(d.points) == d.kept_points < d.total_points == d.events + 1


def test_events_keep_names_with_line_separators_and_escapes(sample):
    snap = pickle.load(open(sample, "rb"))
    odd = "a\u2029b\x1b\"q\".py"
    for ev in snap["device_traces"][0]:
        for f in ev.get("frames", []):
            f["filename"] = odd
    rows = records(memforensics.analyze(snap).events())
    oom = [r for r in rows if r["action"] == "oom"][0]
    assert len(oom["frames"]) == 11 and oom["frames"][0] == (odd, 37, "forward")


def test_notebook_view_is_self_contained_and_escaped(sample, tmp_path):
    page = memforensics.analyze(sample)._repr_html_()
    assert "<script" not in page and "http" not in page
    assert "a 4.00 GiB request failed" in page and "<svg" in page and "model.py:37 forward" in page
    snap = pickle.load(open(sample, "rb"))
    for seg in snap["segments"]:
        for b in seg.get("blocks", []):
            for f in b.get("frames", []):
                f["filename"] = "<img src=x onerror=alert(1)>.py"
    for ev in snap["device_traces"][0]:
        for f in ev.get("frames", []):
            f["filename"] = "<img src=x onerror=alert(1)>.py"
    page = memforensics.analyze(snap)._repr_html_()
    assert "<img" not in page and html.escape("<img src=x onerror=alert(1)>.py") in page


def test_check(sample):
    ok = memforensics.check(sample, max_peak="2 GiB")
    assert ok.passed and ok.violations == []
    bad = memforensics.check(sample, max_peak="100 MiB")
    assert not bad.passed and bad.violations[0].figure == "peak_reserved"
    assert bad.violations[0].line == "train.py:116 main < train.py:148 <module>"


def test_python_dash_m_is_the_cli(sample):
    import sys
    r = subprocess.run([sys.executable, "-m", "memforensics", "analyze", "--json", sample],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0]) == cli_json("analyze", sample)
    r = subprocess.run([sys.executable, "-m", "memforensics", "check", "--max-peak-reserved", "1MiB", sample],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "FAIL" in r.stdout


def test_action_names_that_are_not_one_word_come_back_whole(sample):
    snap = pickle.load(open(sample, "rb"))
    trace = snap["device_traces"][0]
    trace[3]["action"] = 'a new "action"'
    trace[4]["action"] = "plain_new"
    trace[5]["action"] = "x\u00a0user_metadata=evil"  # a no-break space, then a would-be field
    trace[6]["action"] = "t=5"
    del trace[6]["time_us"]  # a would-be time where the line has none
    doc = memforensics.analyze(snap)
    assert doc.devices[0].events_by_action["unknown"] == 4
    rows = records(doc.events())
    assert [r["action"] for r in rows[3:7]] == ['a new "action"', "plain_new",
                                                "x\u00a0user_metadata=evil", "t=5"]
    assert rows[3]["size"] == trace[3]["size"]  # the fields after it still parse
    assert "user_metadata" not in rows[5] and rows[6].get("time_us") is None
    assert rows[6]["addr"] == trace[6]["addr"]


def test_empty_tables_keep_their_columns(sample):
    pandas = pytest.importorskip("pandas")
    doc = memforensics.analyze(sample)
    before = doc.live_at(-1)  # before the first event: no block yet
    assert isinstance(before, pandas.DataFrame) and len(before) == 0
    assert int(before["size"].sum()) == 0
    assert list(doc.events().columns[:9]) == ["device", "event", "time_us", "action", "addr", "size",
                                               "stream", "stack", "frames"]


def test_a_relative_path_survives_a_chdir(sample, tmp_path, monkeypatch):
    import shutil
    shutil.copy(sample, tmp_path / "s.pickle")
    monkeypatch.chdir(tmp_path)
    doc = memforensics.analyze("s.pickle")
    monkeypatch.chdir("/")
    assert len(records(doc.events())) == doc.devices[0].events


def test_a_dict_the_tool_refuses_is_named_as_the_dict(sample):
    snap = pickle.load(open(sample, "rb"))
    snap["extra"] = {1, 2}  # a set: not plain snapshot data
    with pytest.raises(memforensics.MemforensicsError) as e:
        memforensics.analyze(snap)
    assert "the snapshot dict" in str(e.value) and "plain data" in str(e.value)
    assert "snapshot.pickle" not in str(e.value)
    with pytest.raises(Exception):
        memforensics.analyze({"segments": [], "f": lambda: 0})  # not picklable: pickle's own error
