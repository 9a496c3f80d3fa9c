#!/usr/bin/env python3
"""compare_cli: `diff`, `ranks` and `check` through the built executable (exit codes, JSON fields,
the outlier, the merge of shards, hostile inputs). Usage: compare_cli_test.py BIN SOURCE_DIR REAL_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

BIN, SRC, REAL = sys.argv[1], sys.argv[2], sys.argv[3]
SCN = os.path.join(SRC, "snapshots", "scenarios")
failures = []


def sc(name):
    return os.path.join(SCN, name + ".pickle")


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# ---- diff ----
rc, out, err = run("diff", sc("clean_adam"), sc("leak_list_append"))
check(rc == 0, f"diff clean vs leak exits 0 (got {rc}: {err})")
check("findings appeared: 1" in out and "leak (high)" in out, "diff text names the leak that appeared")
check("+288.00 MiB" in out, "diff text shows +288 MiB")

rc, out, err = run("diff", "--json", sc("clean_adam"), sc("leak_list_append"))
doc = json.loads(out)
d = doc["devices"][0]
check(doc["command"] == "diff" and rc == 0, "diff --json command and exit")
for k in ("peak_reserved_bytes", "peak_requested_bytes", "peak_allocated_bytes"):
    check(d["delta"][k] == 288 * 2**20, f"delta.{k} is +288 MiB (got {d['delta'][k]})")
check(d["findings"]["appeared"][0]["kind"] == "leak", "appeared[0] is the leak")
check(d["segments"]["only_new_count"] == 9, "9 segments only in new")

rc, out, err = run("diff", "--json", sc("leak_list_append"), sc("clean_adam"))
d = json.loads(out)["devices"][0]
check(d["delta"]["peak_reserved_bytes"] == -288 * 2**20, "reversed delta is negative")
check(len(d["findings"]["disappeared"]) == 1 and not d["findings"]["appeared"],
      "reversed: the leak disappeared")

rc, out, err = run("diff", "--json", sc("clean_adam"), sc("clean_adam"))
d = json.loads(out)["devices"][0]
check(all(v == 0 for v in d["delta"].values()), "same file twice: every delta 0")
check(all(not p["stacks"]["new_stacks"] and not p["stacks"]["gone_stacks"] for p in d["peaks"]),
      "same file twice: no new or gone stack")

# A leak against a clean run (fabricated scenarios, one address space): the verdict names the leak's
# line, the segments by role are the leak's, the address lists are shown.
rc, out, err = run("diff", "--json", sc("clean_adam"), sc("leak_list_append"))
d = json.loads(out)["devices"][0]
check(d["verdict"] == "peak reserved +288.00 MiB (+77.4 %); at the requested peak uncategorized "
      "memory +288.00 MiB (new: was 16.00 KiB); most from /home/user/tinygpt/train.py:58 "
      "train_step (+288.00 MiB, a new stack)", f"scenario verdict: {d['verdict']}")
role = d["segments"]["by_role"]
check(role["more_in_base_count"] == 0 and role["more_in_new"] == [
    {"size": 32 << 20, "stream": 0, "is_large": True, "is_expandable": False, "count": 9}],
      f"scenario: 9 more 32 MiB segments in new ({role})")
check(d["segments"]["matched_by_address"] == 22, "scenario: 22 segments at the same address")
rc, text, err = run("diff", sc("clean_adam"), sc("leak_list_append"))
check(re.search(r"22 in common\n    only in base: 0 \(0 B\)\n    only in new: 9 \(288\.00 MiB\)\n"
                r"\s+0x[0-9a-f]+ +32\.00 MiB", text) is not None,
      "scenario: one address space, the address lists are shown")

fp32 = os.path.join(REAL, "silmont2000__assignment2-systems__memory_forward_fp32_128.pickle")
bf16 = os.path.join(REAL, "silmont2000__assignment2-systems__memory_forward_bf16_128.pickle")
if os.path.exists(fp32) and os.path.exists(bf16):
    rc, out, err = run("diff", "--json", fp32, bf16)
    d = json.loads(out)["devices"][0]
    check(d["delta"]["peak_reserved_bytes"] == 251658240, "real fp32->bf16 reserved +240 MiB")
    check(d["delta"]["peak_requested_bytes"] == 222994432, "real fp32->bf16 requested delta")
    rq = [p for p in d["peaks"] if p["kind"] == "requested"][0]
    check(rq["stacks"]["matched_function_only"] == 1, "real: one stack matched by function only")
    # The verdict comes first and names the change, the category and the line (issue 29 item 9).
    check(d["verdict"].startswith("peak reserved +240.00 MiB (+41.2 %); at the requested peak "
                                  "activation memory +201.38 MiB (new: was 1.00 KiB); most from "),
          f"real: the verdict names the delta and the category ({d['verdict']})")
    top = max(rq["stacks"]["grew"] + rq["stacks"]["new_stacks"], key=lambda s: s["delta_bytes"])
    check(top["frames"][0]["filename"].rsplit("/", 1)[-1] + ":" + str(top["frames"][0]["line"])
          in d["verdict"], f"real: the verdict names the stack that grew most ({top['frames'][0]})")
    # Segments by role: two processes share no address; the groups add up to the reserved delta.
    seg = d["segments"]
    role = seg["by_role"]
    check(seg["matched_by_address"] == 0, "real: two processes share no segment address")
    for side in ("base", "new"):
        groups = role[f"more_in_{side}"]
        check(sum(g["count"] * g["size"] for g in groups) == role[f"more_in_{side}_bytes"] and
              sum(g["count"] for g in groups) == role[f"more_in_{side}_count"],
              f"real: the {side} groups add up (all listed)")
    check(role["more_in_new_bytes"] - role["more_in_base_bytes"] ==
          d["delta"]["final_reserved_bytes"], "real: by role, the groups are the reserved delta")
    rc, text, err = run("diff", fp32, bf16)
    check(rc == 0 and text.index("verdict: peak reserved +240.00 MiB") < text.index("peak reserved "
                                                                                    "   "),
          "real: the text starts with the verdict")
    check("%)" not in "".join(l for l in text.splitlines() if l.lstrip().startswith("activation"))
          and
          "(new: was 1.00 KiB)" in text, "real: no percentage of a near-zero base")
    check(not re.search(r"^\s+0x[0-9a-f]+ ", text, re.M) and "none in common" in text,
          "real: no address list when the runs share no address")
    check(re.search(r"more in new \(240\.00 MiB\):\n\s+11 x 20\.00 MiB\s+stream 0, large\n\s+1 x 16\.00 MiB", text)
          is not None, f"real: segments by role in the text:\n{text[text.find('final seg'):][:400]}")

with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, "bad.pickle")
    with open(bad, "wb") as f:
        f.write(b"\x80\x04garbage")
    cut = os.path.join(tmp, "cut.pickle")
    with open(sc("clean_adam"), "rb") as f:
        data = f.read()
    with open(cut, "wb") as f:
        f.write(data[: len(data) // 2])

    rc, out, err = run("diff", sc("clean_adam"), bad)
    check(rc == 2 and "error" in err, f"diff with an unreadable input exits 2 (got {rc})")
    rc, out, err = run("diff", sc("clean_adam"))
    check(rc == 1, f"diff with one file is a usage error (got {rc})")

    # ---- ranks ----
    ranks = [sc("clean_adam"), sc("clean_era20"), sc("clean_no_annotations"), sc("leak_list_append")]
    rc, out, err = run("ranks", "--json", *ranks)
    check(rc == 0, f"ranks exits 0 (got {rc}: {err})")
    doc = json.loads(out)
    rows = doc["ranks"]
    check([r["path"] for r in rows] == ranks, "ranks keep the input order")
    check([r["outlier"] for r in rows] == [False, False, False, True], "the leaking rank is the outlier")
    check(rows[3]["outlier_line"]["line"] == "/home/user/tinygpt/train.py:58 train_step",
          f"outlier line is train.py:58 (got {rows[3]['outlier_line']})")
    check(doc["summary"]["outliers"] == 1, "summary.outliers 1")
    rc1, out1, _ = run("ranks", "--json", "--jobs", "1", *ranks)
    check(out1 == out, "ranks output does not depend on --jobs")

    rc, out, err = run("ranks", "--json", sc("clean_adam"), sc("clean_era20"), sc("clean_no_annotations"))
    check(json.loads(out)["summary"]["outliers"] == 0, "equal ranks: no outlier")

    # A bad file is one row with the error, exit 2 at the end, the other rows kept.
    rc, out, err = run("ranks", "--json", sc("clean_adam"), bad, cut, sc("leak_list_append"))
    doc = json.loads(out)
    check(rc == 2, f"ranks with bad files exits 2 (got {rc})")
    check(len(doc["ranks"]) == 4 and doc["summary"]["failed"] == 2, "bad files are rows with errors")
    check(doc["ranks"][1]["error"] and doc["ranks"][2]["error"] and not doc["ranks"][0]["error"],
          "the error rows are the bad files")
    rc, out, err = run("ranks", sc("clean_adam"), bad)
    check(rc == 2 and "error:" in out, "ranks text shows the error row")

    # Merge: two shards give the rows and outliers of one run over all files.
    s1, s2 = os.path.join(tmp, "s1.json"), os.path.join(tmp, "s2.json")
    for path, files in ((s1, ranks[:2]), (s2, ranks[2:])):
        rc, out, err = run("ranks", "--json", *files)
        with open(path, "w") as f:
            f.write(out)
    rc, merged, err = run("ranks", "--json", "--merge", s1, s2)
    rc_all, whole, _ = run("ranks", "--json", *ranks)
    check(rc == 0 and json.loads(merged) == json.loads(whole), "merge of two shards == one run")
    # A shard of two documents (xargs split the list): JSON Lines.
    s12 = os.path.join(tmp, "s12.json")
    with open(s12, "w") as f:
        f.write(open(s1).read() + open(s2).read())
    rc, merged2, err = run("ranks", "--json", "--merge", s12)
    check(rc == 0 and json.loads(merged2) == json.loads(whole), "a JSON Lines shard merges the same")
    rc, out, err = run("ranks", "--merge", s1, bad)
    check(rc == 2, f"merge with a bad shard exits 2 (got {rc})")
    # Shards that are not regular files are refused before a byte is read (issue 30: /dev/zero
    # was read to 2 GB, a FIFO with no writer blocked forever, a directory was "larger than").
    fifo = os.path.join(tmp, "fifo.json")
    os.mkfifo(fifo)
    for shard, why in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                       (tmp, "is a directory")):
        p = subprocess.run([BIN, "ranks", "--json", "--merge", s1, shard], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode == 2 and why in p.stdout,
              f"merge of {shard}: exit 2, '{why}' (got {p.returncode}: {p.stdout[-300:]})")
    # Hostile figures: a device that is no CUDA ordinal is refused; a huge OOM count keeps its
    # column apart from the next.
    doc = json.loads(open(s1).read())
    doc["ranks"][0]["device"] = -2**63
    neg = os.path.join(tmp, "neg.json")
    with open(neg, "w") as f:
        json.dump(doc, f)
    rc, out, err = run("ranks", "--merge", neg)
    check(rc == 2 and "not a CUDA ordinal" in out, f"device -2^63 refused (got {rc}: {out[-200:]})")
    doc["ranks"][0]["device"] = 0
    doc["ranks"][0]["ooms"] = 2**64 - 1
    many = os.path.join(tmp, "many.json")
    with open(many, "w") as f:
        json.dump(doc, f)
    rc, out, err = run("ranks", "--merge", many)
    check(rc == 0 and " 18446744073709551615 " in out,
          f"2^64 - 1 OOMs: a column of its own (got {rc}: {out[-300:]})")

    # ---- check ----
    rc, out, err = run("check", sc("clean_adam"), "--max-peak-reserved", "500MiB",
                       "--max-growth-per-step", "16MiB", "--fail-on", "high")
    check(rc == 0 and "PASS" in out, f"check passes on the clean run (got {rc}: {out}{err})")
    rc, out, err = run("check", sc("leak_list_append"), "--max-peak-reserved", "500MiB",
                       "--max-growth-per-step", "16MiB", "--fail-on", "high")
    check(rc == 3 and "FAIL" in out, f"check fails on the leak with 3 (got {rc})")
    check("growth_per_step" in out and "train.py:58 train_step" in out, "violation names the line")
    rc, out, err = run("check", "--json", sc("leak_list_append"), "--max-peak-reserved", "0.5GB")
    doc = json.loads(out)
    check(rc == 3 and doc["passed"] is False, "check --json fails")
    v = doc["violations"][0]
    check(v["figure"] == "peak_reserved" and v["limit_bytes"] == 500000000 and v["device"] == 0,
          "violation: figure, limit, device")
    rc, out, err = run("check", sc("leak_list_append"), "--baseline", sc("clean_adam"),
                       "--max-increase", "10")
    check(rc == 3 and "peak_reserved increase" in out, "baseline increase fails")
    rc, out, err = run("check", sc("clean_adam"), "--baseline", sc("clean_era20"), "--max-increase", "10")
    check(rc == 0, f"baseline equal run passes (got {rc})")
    rc, out, err = run("check", sc("clean_adam"))
    check(rc == 1 and "at least one limit" in err, "check without a limit is a usage error")
    rc, out, err = run("check", sc("clean_adam"), "--max-peak-reserved", "20G")
    check(rc == 1 and "20GiB" in err, "an ambiguous size is a usage error")
    rc, out, err = run("check", sc("clean_adam"), "--max-increase", "5")
    check(rc == 1, "--max-increase without --baseline is a usage error")
    rc, out, err = run("check", bad, "--max-peak-reserved", "1GiB")
    check(rc == 2, f"check of an unreadable file exits 2 (got {rc})")
    # Gates fail closed (issue 30): no limit that checks nothing, no pass over a missing device.
    for pct in ("nan", "NaN", "inf", "-1", "", "1e7", "5%"):
        rc, out, err = run("check", sc("leak_list_append"), "--baseline", sc("clean_adam"),
                           "--max-increase", pct)
        check(rc == 1 and "PASS" not in out, f"--max-increase {pct!r} is a usage error (got {rc})")
    for flag in ("--max-peak-reserved", "--max-peak-requested", "--max-growth-per-step"):
        rc, out, err = run("check", sc("leak_list_append"), flag, "", "--fail-on", "high")
        check(rc == 1 and "PASS" not in out and flag in err,
              f"an empty {flag} is a usage error, not dropped (got {rc}: {err})")
    rc, out, err = run("check", "--json", sc("clean_adam"), "--device", "7",
                       "--max-peak-reserved", "1TiB")
    check(rc == 1 and "has no device 7" in err and json.loads(out)["passed"] is False,
          f"check --device of a device the file lacks fails (got {rc}: {out})")
    rc, out, err = run("check", sc("clean_adam"), "--device", "7", "--baseline", sc("clean_adam"),
                       "--max-increase", "10")
    check(rc == 1 and "has no device 7" in err, f"a baseline without the device fails (got {rc})")
    rc, out, err = run("check", sc("clean_adam"), bad, "--device", "7", "--max-peak-reserved", "1TiB")
    check(rc == 2, f"an unreadable file outranks a missing device: exit 2 (got {rc})")
    rc, out, err = run("diff", sc("clean_adam"), sc("leak_list_append"), "--device", "3")
    check(rc == 1 and "has no device 3" in err, f"diff --device of a missing device (got {rc})")
    rc, out, err = run("check", sc("replicas_uneven"), "--device", "1", "--max-peak-reserved",
                       "1TiB")
    check(rc == 0 and "PASS" in out, f"check --device of a device the file has (got {rc}: {err})")
    # The JSON document is written when the baseline lacks the device too.
    rc, out, err = run("check", "--json", sc("replicas_uneven"), "--device", "1", "--baseline",
                       sc("clean_adam"), "--max-increase", "5")
    doc = json.loads(out) if out.strip() else {}
    check(rc == 1 and doc.get("passed") is False and "baseline" in doc["files"][0]["error"],
          f"check --json with a baseline that lacks the device: a document (got {rc}: {out!r})")
    # Nothing seen is nothing passed: a dump of no device, a native trace cut short.
    empty = os.path.join(tmp, "empty.pickle")
    import pickle
    with open(empty, "wb") as fh:
        pickle.dump({"segments": [], "device_traces": [[]]}, fh, protocol=4)
    rc, out, err = run("check", "--json", empty, "--max-peak-reserved", "1B")
    doc = json.loads(out)
    check(rc == 2 and doc["passed"] is False and "nothing to check" in doc["files"][0]["error"],
          f"check of a file with no device exits 2 (got {rc}: {out})")
    rc, out, err = run("check", sc("clean_adam"), "--baseline", empty, "--max-increase", "5")
    check(rc == 2 and "PASS" not in out and "nothing to check" in err,
          f"a baseline with no device is no baseline (got {rc}: {out}{err})")
    whole = os.path.join(tmp, "whole.bin")
    rc, out, err = run("convert", sc("clean_adam"), "-o", whole, "--zstd-level", "0")
    check(rc == 0, f"convert for the cut-short check (got {rc}: {err})")
    data = open(whole, "rb").read()
    cut_bin = os.path.join(tmp, "cut.bin")
    with open(cut_bin, "wb") as fh:
        fh.write(data[: len(data) * 9 // 10])
    rc, out, err = run("check", cut_bin, "--max-peak-reserved", "1TiB")
    check(rc == 2 and "PASS" not in out and "incomplete" in out,
          f"check of a native trace cut short exits 2, never PASS (got {rc}: {out})")
    rc, out, err = run("check", sc("clean_adam"), "--baseline", cut_bin, "--max-increase", "5")
    check(rc == 2 and "PASS" not in out and "incomplete" in err,
          f"an incomplete baseline is no baseline (got {rc}: {out}{err})")
    rc, out, err = run("check", whole, "--max-peak-reserved", "1TiB")
    check(rc == 0 and "PASS" in out, f"the whole trace passes (got {rc}: {out}{err})")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("compare_cli: all checks passed")
