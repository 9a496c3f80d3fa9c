#!/usr/bin/env python3
"""whatif_cli: `whatif` through the built executable (docs/whatif.md, docs/cli.md "whatif").

Under the file's own settings the baseline reproduces the file's peak reserved and OOMs on every
complete history (real snapshots, the sample, the scenarios, the fabricated expandable traces
where the simulation is exact); a fabricated fragmentation OOM that max_split_size_mb and
expandable segments avoid (yes) and one where live bytes plus the request exceed the card (no);
refused keys; --capacity parsing; the JSON fields. Usage: whatif_cli_test.py BIN SOURCE_DIR REAL_DIR
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

BIN, SRC, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
MIB, GIB = 2**20, 2**30
failures = []


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def whatif(*args):
    rc, out, err = run("whatif", "--json", *args)
    if rc != 0:
        check(False, f"whatif {' '.join(args)} exits 0 (got {rc}: {err.strip()})")
        return None
    return json.loads(out)


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# ---- the baseline reproduces the file on every complete history ----
inputs = sorted(glob.glob(os.path.join(REAL, "*.pickle")))
inputs += [os.path.join(SRC, "snapshots", "sample_training.pickle")]
inputs += sorted(glob.glob(os.path.join(SRC, "snapshots", "scenarios", "*.pickle")))
inputs += sorted(glob.glob(os.path.join(SRC, "tests", "replay", "data", "exp_*.pickle")))
complete = 0
untrusted = 0
for path in inputs:
    name = os.path.basename(path)
    rc, out, err = run("whatif", "--json", path)
    if rc == 2 and "no device with a trace" in err:
        # A snapshot without device traces (memory_snapshot without history): nothing to replay.
        check(not out and "replays the recorded requests" in err, f"{name}: no trace, says why")
        continue
    doc = whatif(path)
    if doc is None:
        continue
    expandable = "expandable_segments=True" in doc["baseline_settings"]
    for d in doc["devices"]:
        b = d["baseline"]
        for k in ("peak_reserved_bytes", "peak_allocated_bytes", "oom_count", "ooms", "exact",
                  "estimate_reason", "capacity_bytes"):
            check(k in b and k in d["whatif"], f"{name}: baseline and whatif have {k}")
        # No --set, no --capacity: the what-if is the baseline.
        check(d["whatif"]["peak_reserved_bytes"] == b["peak_reserved_bytes"],
              f"{name} device {d['device']}: what-if without options = baseline")
        if not d["complete_history"]:
            check(not b["exact"] and "history incomplete" in b["estimate_reason"],
                  f"{name} device {d['device']}: an incomplete history is an estimate")
            continue
        # A trace that cannot lead to the file's final state (analyze: consistent false; drisspg)
        # is not the whole program: an estimate, even where every address checks out.
        rc2, out2, _ = run("analyze", "--json", "--device", str(d["device"]), path)
        consistent = rc2 == 0 and json.loads(out2)["devices"][0]["consistent"]
        if not consistent:
            check(not b["exact"] and "final state" in b["estimate_reason"],
                  f"{name} device {d['device']}: a replay analyze does not trust is an estimate "
                  f"({b['estimate_reason']})")
            untrusted += 1
            continue
        if expandable and not b["exact"]:
            # Recorded with expandable segments, an estimate (a reservation's end is not in the
            # file, docs/whatif.md): the peak reserved is still the recorded one.
            rec = d["recorded_peak_reserved_bytes"]
            check(b["peak_reserved_bytes"] == rec,
                  f"{name} device {d['device']}: expandable estimate's peak reserved "
                  f"({b['peak_reserved_bytes']} vs {rec})")
            a = b["address_agreement"]
            check(a["predicted"] < a["total"] or b["segment_allocs"] != d["recorded_segment_allocs"],
                  f"{name} device {d['device']}: an estimate says what did not check out")
            continue
        a = b["address_agreement"]
        check(a["predicted"] == a["total"] and a["total"] > 0,
              f"{name} device {d['device']}: every alloc at its recorded address ({a})")
        complete += 1
        check(b["peak_reserved_bytes"] == d["recorded_peak_reserved_bytes"],
              f"{name} device {d['device']}: baseline peak reserved {b['peak_reserved_bytes']} "
              f"= recorded {d['recorded_peak_reserved_bytes']}")
        check(b["oom_count"] == d["recorded_oom_count"],
              f"{name} device {d['device']}: baseline OOMs {b['oom_count']} = recorded "
              f"{d['recorded_oom_count']}")
        check(b["segment_allocs"] == d["recorded_segment_allocs"] and
              b["segment_frees"] == d["recorded_segment_frees"],
              f"{name} device {d['device']}: the recorded segment events, in number")
        check(b["exact"], f"{name} device {d['device']}: labelled exact")
check(complete >= 15, f"at least 15 complete histories checked (got {complete})")
if os.path.exists(os.path.join(REAL, "drisspg__transformer_nuggets__mini_snapshot.pickle")):
    check(untrusted >= 1, "drisspg's trace, which cannot lead to its final state, was checked")

# Peak allocated is CCA's allocated_bytes (down at free_requested, the block reused only after
# free_completed): analyze's figure, pending frees across streams included.
for name in ("pending_free_cross_stream", "clean_adam"):
    path = os.path.join(SRC, "snapshots", "scenarios", name + ".pickle")
    rc, out, err = run("analyze", "--json", path)
    doc = whatif(path)
    if rc == 0 and doc:
        want = json.loads(out)["devices"][0]["peak_allocated_bytes"]
        got = doc["devices"][0]["baseline"]["peak_allocated_bytes"]
        check(got == want, f"{name}: baseline peak allocated {got} = analyze's {want}")

# ---- fabricated: yes and no ----
tmp = tempfile.mkdtemp(prefix="whatif_cli_")


def fixture(name, body):
    src, out = os.path.join(tmp, name + ".fixture"), os.path.join(tmp, name + ".pickle")
    with open(src, "w") as f:
        f.write("era 2.11\ndevice 0\nstack fwd = train.py:7:fwd\n" + body)
    p = subprocess.run([sys.executable, os.path.join(SRC, "tools", "snapshot_fixture.py"), src,
                        "-o", out], capture_output=True, text=True)
    check(p.returncode == 0, f"fixture {name} compiles ({p.stderr.strip()})")
    return out


# A freed 100 MiB block split for a live 30 MiB request; the 100 MiB request fails on the
# 150 MiB card (100 MiB reserved + 50 MiB free) though live bytes (130 MiB) fit: fragmentation.
frag = fixture("frag", """
t 1 segment_alloc 0x7f0000000000 100MiB
t 2 alloc 0x7f0000000000 100MiB
t 3 free 0x7f0000000000
t 4 alloc 0x7f0000000000 30MiB
t 5 oom 100MiB device_free=50MiB stack=fwd
""")
doc = whatif(frag)
if doc:
    d = doc["devices"][0]
    check(d["baseline"]["oom_count"] == 1 and d["baseline"]["capacity_bytes"] == 150 * MIB,
          "frag: the baseline has the recorded OOM on the implied 150 MiB card")
    check(d["baseline"]["ooms"][0]["recorded"] and not d["baseline"]["ooms"][0]["avoided"],
          "frag: baseline: the recorded OOM is not avoided")
    # No option: one replay, and the smallest capacity that avoids the OOM. Below 200 MiB the
    # 100 MiB request finds no room: the first segment's 70 MiB free tail is pinned by the live
    # 30 MiB block, so the search over whole 2 MiB units ends at 200 MiB exactly (slack 0).
    check(d["whatif_is_baseline"], "frag: no option, the what-if is the baseline")
    check(d["smallest_capacity_bytes"] == 200 * MIB and d["smallest_capacity_slack_bytes"] == 0,
          f"frag: smallest capacity 200 MiB (got {d['smallest_capacity_bytes']}, slack "
          f"{d['smallest_capacity_slack_bytes']})")
rc, out, err = run("whatif", frag)
check(rc == 0 and "  replay (capacity" in out and "  what-if  (" not in out and "  baseline (" not in out,
      "frag text without options: the result said once, as 'replay'")
check("smallest capacity without an OOM (memory the allocator may reserve): 200.00 MiB" in out,
      "frag text: the smallest capacity")
for setting, peak in (("max_split_size_mb=64", 130 * MIB), ("expandable_segments=True", 140 * MIB)):
    doc = whatif(frag, "--set", setting)
    if doc:
        w = doc["devices"][0]["whatif"]
        check(w["oom_count"] == 0 and w["ooms"][0]["recorded"] and w["ooms"][0]["avoided"],
              f"frag: {setting} avoids the OOM")
        check(w["peak_reserved_bytes"] == peak, f"frag: {setting} peak reserved {peak} "
              f"(got {w['peak_reserved_bytes']})")
rc, out, err = run("whatif", frag, "--set", "max_split_size_mb=64")
check(rc == 0 and "recorded OOM avoided" in out and "cannot change what the program asked for" in out,
      "frag text: 'recorded OOM avoided' and the limits note")

# 100 MiB live and a 100 MiB request on the 150 MiB card: no setting helps, a 250 MiB card does.
live = fixture("live", """
t 1 segment_alloc 0x7f0000000000 100MiB
t 2 alloc 0x7f0000000000 100MiB
t 3 oom 100MiB device_free=50MiB stack=fwd
""")
for setting in ("expandable_segments=True", "max_split_size_mb=64", "roundup_power2_divisions=4",
                "garbage_collection_threshold=0.5", "roundup_power2_divisions=[64:2,>:4]"):
    doc = whatif(live, "--set", setting)
    if doc:
        o = doc["devices"][0]["whatif"]["ooms"][0]
        check(o["recorded"] and not o["avoided"] and "no allocator setting" in o["why"],
              f"live: {setting} does not avoid it, and says why ({o['why']})")
        check(o["line"] == "train.py:7 fwd", "live: the OOM's line")
doc = whatif(live, "--capacity", "250MiB")
if doc:
    w = doc["devices"][0]["whatif"]
    check(w["oom_count"] == 0 and w["ooms"][0]["avoided"] and w["peak_reserved_bytes"] == 200 * MIB,
          "live: a 250 MiB card avoids it at 200 MiB reserved")
    check(not doc["devices"][0]["whatif_is_baseline"] and
          doc["devices"][0]["smallest_capacity_bytes"] is None,
          "live on 250 MiB: a what-if of its own, without an OOM (no smallest capacity)")
doc = whatif(live)
if doc:
    check(doc["devices"][0]["smallest_capacity_bytes"] == 200 * MIB and
          doc["devices"][0]["smallest_capacity_slack_bytes"] == 0,
          "live: the smallest capacity is the live bytes plus the request, exactly")

# The same on a real-shaped file: the sample's 4 GiB request with 546 MiB live on an 890 MiB card.
sample = os.path.join(SRC, "snapshots", "sample_training.pickle")
doc = whatif(sample, "--set", "expandable_segments=True")
if doc:
    o = doc["devices"][0]["whatif"]["ooms"][0]
    check(not o["avoided"] and "no allocator setting" in o["why"], "sample: expandable does not help")
doc = whatif(sample, "--capacity", "5GiB")
if doc:
    check(doc["devices"][0]["whatif"]["oom_count"] == 0, "sample: a 5 GiB card avoids the OOM")

# A card too small for anything: every request fails; the text lists the first 64 OOMs and says
# how many more, as the JSON's complete oom_count does.
rc, out, err = run("whatif", sample, "--capacity", "1")
doc = whatif(sample, "--capacity", "1")
if doc:
    n = doc["devices"][0]["whatif"]["oom_count"]
    listed = len(doc["devices"][0]["whatif"]["ooms"])
    check(n > 64 and listed == 64, f"sample on a 1-byte card: {n} OOMs, {listed} listed")
    check(rc == 0 and f"... and {n - 64} more" in out,
          f"whatif text says how many OOMs are not listed (got {rc}: {out[-400:]})")

# A real history on a smaller card: a new OOM that max_split_size_mb avoids (fragmentation).
silmont = os.path.join(REAL, "silmont2000__assignment2-systems__mem_snapshot.pickle")
if os.path.exists(silmont):
    doc = whatif(silmont, "--capacity", "3.3GiB")
    if doc:
        w = doc["devices"][0]["whatif"]
        check(w["oom_count"] >= 1 and not w["ooms"][0]["recorded"],
              "silmont2000 on a 3.3 GiB card: a new OOM")
    doc = whatif(silmont, "--capacity", "3.3GiB", "--set", "max_split_size_mb=512")
    if doc:
        check(doc["devices"][0]["whatif"]["oom_count"] == 0,
              "silmont2000 on a 3.3 GiB card with max_split_size_mb=512: no OOM")

# ---- refused settings and option parsing ----
for bad in ("pinned_use_cuda_host_register=True", "pinned_num_register_threads=8", "no_such_key=1",
            "max_split_size_mb=10", "roundup_power2_divisions=[3:1]",
            "garbage_collection_threshold=1.5"):
    rc, out, err = run("whatif", frag, "--set", bad)
    check(rc == 1 and "error" in err and bad.split("=")[0] in err,
          f"--set {bad}: exit 1 (bad usage) with a message naming the key (got {rc}: {err.strip()})")
rc, out, err = run("whatif", frag, "--set", "pinned_use_cuda_host_register=True")
check("pinned" in err and "host" in err, "a pinned_* key is refused as a host memory setting")
rc, out, err = run("whatif", frag, "--set", "novalue")
check(rc == 1 and "KEY=VALUE" in err, f"--set without = is a usage error (got {rc})")
rc, out, err = run("whatif", frag, "--device", "7")
check(rc == 1 and "no device 7" in err, f"--device of a device the file lacks is a usage error (got {rc})")
for text, want in (("20GiB", 20 * GIB), ("40GB", 40 * 10**9), ("150MiB", 150 * MIB),
                   ("1073741824", GIB)):
    doc = whatif(frag, "--capacity", text)
    if doc:
        got = doc["devices"][0]["whatif"]["capacity_bytes"]
        check(got == want, f"--capacity {text} = {want} (got {got})")
        check(doc["devices"][0]["baseline"]["capacity_bytes"] == 150 * MIB,
              f"--capacity {text}: the baseline keeps the implied card")
for text in ("abc", "-5GiB", "12XB", "", "0", "0B", "18446744073709551615", "2PiB"):
    rc, out, err = run("whatif", frag, "--capacity", text)
    check(rc == 1 and "--capacity" in err, f"--capacity '{text}' is a usage error (got {rc})")
doc = whatif(frag, "--set", "roundup_power2_divisions=[256:1,512:2,>:4]")
if doc:
    check("roundup_power2_divisions=[<512MiB:1,512-1023MiB:2,>=1024MiB:4]" in doc["whatif_settings"],
          f"the list form is described per interval ({doc['whatif_settings']})")
rc, out, err = run("whatif", os.path.join(REAL, "no_such_file.pickle"))
check(rc == 2, "a missing file exits 2")

# ---- the report: the what-if panel and --baseline (the figures of `diff`) ----
def page_data(html_path):
    import re
    with open(html_path, encoding="utf-8") as f:
        m = re.search(r'<script id="memf-data" type="application/json">(.*?)</script>', f.read(), re.S)
    return json.loads(m.group(1))


scn = os.path.join(SRC, "snapshots", "scenarios")
base_file, new_file = os.path.join(scn, "clean_adam.pickle"), os.path.join(scn, "leak_list_append.pickle")
page = os.path.join(tmp, "r.html")
rc, out, err = run("report", new_file, "--baseline", base_file, "-o", page)
check(rc == 0, f"report --baseline exits 0 (got {rc}: {err.strip()})")
if rc == 0:
    data = page_data(page)
    rc2, diff_out, _ = run("diff", "--json", base_file, new_file)
    want = json.loads(diff_out)
    got = data.get("baseline_diff", {})
    check(got.get("devices") == want["devices"], "report --baseline embeds diff --json's devices")
    check(got["devices"][0]["delta"]["peak_reserved_bytes"] == 288 * MIB, "the +288 MiB delta")
    w = data.get("whatif", {})
    check(w.get("present") and w["device"] == 0 and 1 <= len(w["rows"]) <= w["max_runs"] == 8,
          "report: a what-if panel of at most 8 rows")
    check(w["rows"][0]["baseline"] and w["rows"][0]["exact"] == (w["complete_history"]),
          "report: the baseline row first, exact iff the history is complete")
rc, out, err = run("report", frag, "-o", page)
if rc == 0:
    w = page_data(page)["whatif"]
    labels = [r["label"] for r in w["rows"]]
    check(labels[:3] == ["the file's own settings", "expandable_segments:True", "max_split_size_mb:64"],
          f"frag report rows ({labels})")
    check(w["rows"][1]["answer"] == "avoids the OOM" and w["rows"][2]["answer"] == "avoids the OOM",
          "frag report: expandable and max_split_size_mb avoid the OOM")
    check("baseline_diff" not in page_data(page), "no --baseline: no baseline_diff")
rc, out, err = run("report", frag, "--baseline", os.path.join(tmp, "missing.pickle"), "-o", page)
check(rc == 2 and "--baseline" in err, f"an unreadable baseline exits 2 (got {rc})")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("whatif_cli: all checks passed")
