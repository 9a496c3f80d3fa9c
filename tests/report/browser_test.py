#!/usr/bin/env python3
"""The HTML report opened in a real browser: headless Chromium driven through ChromeDriver.

For every input (the samples in snapshots/, the real snapshots in ../shared/snapshots-real/, and a
hostile fixture made here) it runs `memforensics report` and `memforensics analyze --json`, opens the
page from disk and checks, per device:
  - the page draws (body[data-ready]) with no JavaScript error and no console error;
  - the peak and count figures in the summary equal analyze --json's;
  - the timeline, block-map and call-tree canvases are not blank;
  - clicking the timeline far from the current moment changes the block map's moment;
  - the report is under 5 MB.
The hostile fixture puts markup such as </script><img src=x onerror=...> into frame names, file names
and the snapshot's own path; the page must show it as text and run none of it.
A screenshot of each report is kept in --artifacts. WebDriver is spoken over plain HTTP (urllib), so
nothing but Debian's chromium and chromium-driver is needed.

Usage: browser_test.py MEMFORENSICS SOURCE_DIR [REAL_SNAPSHOTS_DIR] --artifacts DIR
"""
import argparse
import base64
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

MAX_REPORT_BYTES = 5_000_000
XSS = '</script><img src=x onerror="window.__xss=1;alert(1)"><script>window.__xss=2</script>'


class WebDriver:
    def __init__(self, chromedriver, chromium, workdir):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = open(os.path.join(workdir, "chromedriver.log"), "w")
        self.proc = subprocess.Popen([chromedriver, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 30
        while True:
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("chromedriver did not start (see chromedriver.log)")
                time.sleep(0.2)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--disable-extensions", "--disable-dev-shm-usage",
                "--allow-file-access-from-files", "--window-size=1400,2600",
                f"--user-data-dir={os.path.join(workdir, 'profile')}"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {"binary": chromium, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read() or b"{}").get("value")
        except urllib.error.HTTPError as e:
            payload = json.loads(e.read() or b"{}").get("value", {})
            raise WebDriverError(payload.get("error", str(e.code)), payload.get("message", ""))

    def s(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self.s("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def alert_text(self):
        try:
            return self.s("GET", "/alert/text")
        except WebDriverError as e:
            if e.error == "no such alert":
                return None
            raise

    def browser_log(self):
        try:
            return self.s("POST", "/se/log", {"type": "browser"}) or []
        except WebDriverError:
            return []

    def element(self, css):
        v = self.s("POST", "/element", {"using": "css selector", "value": css})
        return next(iter(v.values()))

    def click_at(self, elem, x, y):
        """A real pointer click at (x, y) from the element's centre (WebDriver actions)."""
        origin = {"element-6066-11e4-a52e-4f735466cecf": elem}
        self.s("POST", "/actions", {"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
                                                 "actions": [{"type": "pointerMove", "origin": origin, "x": int(x), "y": int(y)},
                                                             {"type": "pointerDown", "button": 0},
                                                             {"type": "pointerUp", "button": 0}]}]})
        self.s("DELETE", "/actions")

    def hover_at(self, elem, x, y):
        origin = {"element-6066-11e4-a52e-4f735466cecf": elem}
        self.s("POST", "/actions", {"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
                                                 "actions": [{"type": "pointerMove", "origin": origin, "x": int(x), "y": int(y)}]}]})
        self.s("DELETE", "/actions")

    def screenshot(self, path):
        png = base64.b64decode(self.s("GET", "/screenshot"))
        with open(path, "wb") as f:
            f.write(png)

    def quit(self):
        try:
            self.s("DELETE", "")
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class WebDriverError(Exception):
    def __init__(self, error, message):
        super().__init__(f"{error}: {message}")
        self.error = error


# Fraction of sampled pixels of a canvas that are not white: > 0 means something was drawn.
INK_JS = """
const c = document.getElementById(arguments[0]);
const g = c.getContext('2d');
const d = g.getImageData(0, 0, c.width, c.height).data;
let ink = 0, n = 0;
for (let i = 0; i < d.length; i += 4 * 7) { n++; if (d[i] < 245 || d[i + 1] < 245 || d[i + 2] < 245) ink++; }
return n ? ink / n : 0;
"""

ALLOC_SUMS_JS = """
const D = JSON.parse(document.getElementById('memf-data').textContent);
const x = D.devices.find(v => v.device === arguments[0]);
if (!x || !x.allocations) return null;
const al = x.allocations, b = al.buckets, r = al.drawn;
let bad = 0, max = 0;
for (let k = 0; k < b.at_event.length; k++) {
  let live = 0;
  for (let i = 0; i < r.length; i += 5) if (r[i] <= b.at_event[k] && (r[i + 1] < 0 || r[i + 1] > b.at_event[k])) live += r[i + 2];
  // (rest 0 with more drawn: the replayer caps a request at its block's size)
  if (live + b.rest[k] !== b.total[k] && !(b.rest[k] === 0 && live > b.total[k])) bad++;
  max = Math.max(max, b.total[k]);
}
return {buckets: b.at_event.length, bad, max};
"""

ICICLE_FOLLOWS_JS = """
const D = JSON.parse(document.getElementById('memf-data').textContent);
const x = D.devices.find(v => v.device === arguments[0]);
const ev = Number(document.getElementById('blockmap-caption').dataset.event);
const k = x.keyframes.find(v => v.event === ev);
if (!k || !k.icicle || !k.icicle.bytes.length) return null;
return Number(document.getElementById('icicle-title').dataset.event) === ev;
"""

STATS_JS = """
const out = {};
for (const e of document.querySelectorAll('#stats [data-stat]')) {
  out[e.dataset.stat] = e.dataset.bytes !== undefined ? e.dataset.bytes : e.dataset.value;  // text: exact above 2^53
}
return out;
"""


def hostile_snapshot(path):
    """A small PyTorch-style snapshot whose frame names, file names and annotations carry markup."""
    frames = [{"filename": "evil" + XSS + ".py", "line": 7, "name": "forward" + XSS},
              {"filename": "train.py", "line": 3, "name": "<module>"}]
    mib = 1 << 20
    base = 0x7F0000000000
    trace = []
    t = 1_700_000_000_000_000
    for i in range(6):
        trace.append({"action": "alloc", "addr": base + i * 2 * mib, "size": 2 * mib, "stream": 0,
                      "time_us": t + i, "frames": frames})
    for i in range(3):
        trace.append({"action": "free_requested", "addr": base + i * 2 * mib, "size": 2 * mib, "stream": 0,
                      "time_us": t + 10 + i, "frames": frames})
        trace.append({"action": "free_completed", "addr": base + i * 2 * mib, "size": 2 * mib, "stream": 0,
                      "time_us": t + 10 + i, "frames": frames})
    blocks = []
    for i in range(3):
        blocks.append({"address": base + i * 2 * mib, "size": 2 * mib, "requested_size": 0, "state": "inactive",
                       "frames": []})
    for i in range(3, 6):
        blocks.append({"address": base + i * 2 * mib, "size": 2 * mib, "requested_size": 2 * mib,
                       "state": "active_allocated", "frames": frames})
    seg = {"device": 0, "address": base, "total_size": 12 * mib, "stream": 0, "segment_type": "large",
           "allocated_size": 6 * mib, "active_size": 6 * mib, "requested_size": 6 * mib,
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": blocks}
    trace_with_segment = [{"action": "segment_alloc", "addr": base, "size": 12 * mib, "stream": 0,
                           "time_us": t - 1, "frames": frames}] + trace
    # A second device, so that the device selector and per-device checks are exercised.
    base1 = 0x7E0000000000
    trace1 = [{"action": "segment_alloc", "addr": base1, "size": 20 * mib, "stream": 0, "time_us": t, "frames": frames},
              {"action": "alloc", "addr": base1, "size": 8 * mib, "stream": 0, "time_us": t + 1, "frames": frames},
              {"action": "alloc", "addr": base1 + 8 * mib, "size": 4 * mib, "stream": 0, "time_us": t + 2, "frames": frames},
              {"action": "free_requested", "addr": base1, "size": 8 * mib, "stream": 0, "time_us": t + 3, "frames": frames},
              {"action": "free_completed", "addr": base1, "size": 8 * mib, "stream": 0, "time_us": t + 3, "frames": frames}]
    seg1 = {"device": 1, "address": base1, "total_size": 20 * mib, "stream": 0, "segment_type": "large",
            "allocated_size": 4 * mib, "active_size": 4 * mib, "requested_size": 4 * mib,
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
            "blocks": [{"address": base1, "size": 8 * mib, "requested_size": 0, "state": "inactive", "frames": []},
                       {"address": base1 + 8 * mib, "size": 4 * mib, "requested_size": 4 * mib,
                        "state": "active_allocated", "frames": frames},
                       {"address": base1 + 12 * mib, "size": 8 * mib, "requested_size": 0, "state": "inactive",
                        "frames": []}]}
    snap = {"segments": [seg, seg1], "device_traces": [trace_with_segment, trace1],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": XSS},
            "external_annotations": [{"device": 0, "name": "ProfilerStep#1" + XSS, "stage": "START", "time_us": t - 2},
                                     {"device": 0, "name": "ProfilerStep#1" + XSS, "stage": "END", "time_us": t + 20}]}
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)


HEADLINE_JS = """
const box = document.getElementById('headline'), c = document.getElementById('headline-chart');
const r = c ? c.getBoundingClientRect() : null;
return {hidden: box.hidden, severity: box.dataset.severity, text: box.innerText,
        chart: r ? {bottom: r.bottom + window.scrollY, device: c.dataset.device, ooms: c.dataset.ooms,
                    peak_event: c.dataset.peakEvent} : null};
"""


def check_headline(wd, expected, name, failures):
    """The answer above the fold (the page as it opens, 1400 px wide, narrower than the issue's 1600):
    the headline box is there, red only for a high item, and the opened device's small timeline
    (its peak reserved and OOMs) ends within the first 1000 px; a device with no history has none."""
    wd.js("window.scrollTo(0, 0)")
    h = wd.js(HEADLINE_JS)
    items = expected.get("headline", {}).get("items", [])
    sev = "high" if any(i["severity"] == "high" for i in items) else \
        "warning" if any(i["severity"] == "warning" for i in items) else "none"
    if h["hidden"] or h["severity"] != sev:
        failures.append(f"{name}: headline hidden={h['hidden']} severity {h['severity']!r}, analyze's items say {sev!r}")
    opened = wd.js("return document.body.dataset.device")
    dev = next((d for d in expected["devices"] if str(d["device"]) == opened), None)
    drawn = wd.js("return document.body.dataset.detail") == "1"
    if dev is None or not drawn:
        return
    chart = h["chart"]
    if dev["events"] == 0:
        if chart is not None:
            failures.append(f"{name}: cuda:{opened} has no history, yet the headline draws a timeline")
        return
    if chart is None:
        failures.append(f"{name}: the headline has no small timeline for cuda:{opened}")
        return
    if chart["bottom"] > 1000:
        failures.append(f"{name}: the headline's timeline ends at {chart['bottom']:.0f} px, below the first 1000 px")
    peak_event = dev["peak_reserved_event"] if dev["peak_reserved_event"] is not None else -1  # null: the start
    if chart["device"] != opened or int(chart["ooms"]) != dev["oom_count"] or int(chart["peak_event"]) != peak_event:
        failures.append(f"{name}: the headline's timeline shows {chart}, analyze: cuda:{opened} with "
                        f"{dev['oom_count']} OOMs, peak reserved at event {dev['peak_reserved_event']}")
    ink = wd.js(INK_JS, "headline-chart")
    if not ink or ink <= 0.001:
        failures.append(f"{name}: the headline's timeline is blank (ink {ink})")


# Frames that only run the program (CPython's interpreter and start-up, the C runtime, thread
# start-up, the unwinder, torch's Python binding glue): none may be a bar of any call tree. Written
# here from the real snapshots' frames, independently of the classifier (frame_class.cc).
PLUMBING_NAME = re.compile(r"^(_?Py[A-Z_]|pymain_|pyrun_|run_mod|method_vectorcall|cfunction_|slot_(tp|nb|sq|mp)_|"
                           r"binary_op|vectorcall_|__libc_|start_thread|__?clone3?$|main$|dynamo_|__Pyx_|"
                           r"torch::handle_torch_function|torch::unwind|.*TypeError_to_NotImplemented_)")
PLUMBING_FILE = re.compile(r"(/Objects/|/Python/|/Modules/|/Include/)[^/]*\.[ch]$|/lib/python3\.\d+/(?!.*-packages)")

ICICLE_FRAMES_JS = """
const D = JSON.parse(document.getElementById('memf-data').textContent);
const used = new Set();
for (const d of D.devices) {
  for (const t of [d.icicle].concat(d.keyframes.map(k => k.icicle))) {
    if (!t || !t.frame) continue;
    for (const f of t.frame) if (f >= 0) used.add(f);
  }
}
return Array.from(used).map(f => D.frames[f]);
"""


# Each call tree's paths: [labels of its synthetic nodes..., [file of each frame]] per node whose
# stack ends there (self > 0). A path with frames but none in a Python file must hang under a
# "C++ stack" node; such a node never holds a Python frame.
ICICLE_PATHS_JS = """
const D = JSON.parse(document.getElementById('memf-data').textContent);
const out = [];
for (const d of D.devices) {
  for (const t of [d.icicle].concat(d.keyframes.map(k => k.icicle))) {
    if (!t || !t.frame) continue;
    for (let i = 1; i < t.frame.length; i++) {
      if (!(t.self[i] > 0)) continue;
      const labels = [], files = [];
      for (let j = i; j > 0; j = t.parent[j]) {
        if (t.frame[j] >= 0) files.push(D.frames[t.frame[j]][0] || '');
        else if (t.label[String(j)] !== undefined) labels.push(t.label[String(j)]);
      }
      out.push([labels, files]);
    }
  }
}
return out;
"""


def check_icicle_frames(wd, name, failures):
    for labels, files in wd.js(ICICLE_PATHS_JS) or []:
        grouped = any("C++ stack, no Python frame" in s for s in labels)
        python = any(f.endswith(".py") for f in files)
        if files and not python and not grouped and not any("pending" in s for s in labels):
            failures.append(f"{name}: a C++-only stack in the call tree without its category node: {labels}")
            break
        if grouped and python:
            failures.append(f"{name}: a 'C++ stack' node holds a Python frame: {labels}")
            break
    bad = []
    for f in wd.js(ICICLE_FRAMES_JS) or []:
        if (f[0] or "").endswith(".py"):
            if PLUMBING_FILE.search(f[0]):
                bad.append(f"{f[0]}:{f[1][:80]}")
            continue
        fname = re.sub(r"^.* (?=[\w:~]+\()", "", f[1]) if "(" in f[1] else f[1]  # a return type off
        if PLUMBING_NAME.match(fname) or PLUMBING_FILE.search(f[0] or ""):
            bad.append(f"{f[0]}:{f[1][:80]}")
    if bad:
        failures.append(f"{name}: plumbing frames in the call tree: {sorted(set(bad))[:5]}")


MOMENT_JS = """
const c = document.getElementById('blockmap'), cap = document.getElementById('blockmap-caption');
return [document.body.dataset.device, c.dataset.device, c.dataset.event, cap.textContent];
"""


def open_page(wd, url):
    wd.get("about:blank")  # a fresh load: a jump within the same page would only fire hashchange
    wd.get(url)
    deadline = time.time() + 60
    while time.time() < deadline and not wd.js("return document.body && document.body.dataset.ready === '1'"):
        time.sleep(0.1)


def nearest_keyframe(kfs, ev):
    best = 0
    for i, k in enumerate(kfs):
        if abs(k["event"] - ev) < abs(kfs[best]["event"] - ev):
            best = i
    return kfs[best]["event"]


def check_moment_links(wd, html, name, failures):
    """#device=N&event=K and #device=N&t=...: the page opens on that device and moment (the block
    map's data attributes), the nearest precomputed one when K has no layout of its own, said so."""
    data = wd.js("return JSON.parse(document.getElementById('memf-data').textContent)")
    devs = [d for d in data["devices"] if d.get("has_segment_info", True) and len(d["keyframes"]) >= 3]
    if not devs:
        return
    d = devs[-1]  # another device than the opened one, where there are several
    kfs = d["keyframes"]
    k = kfs[len(kfs) // 2]["event"]
    a = next((x for x in data["analysis"]["devices"] if x["device"] == d["device"]), None)
    n_events = a["events"] if a else 0
    open_page(wd, f"file://{html}#device={d['device']}&event={k}")
    got = wd.js(MOMENT_JS)
    if got[:3] != [str(d["device"])] * 2 + [str(k)]:
        failures.append(f"{name}: #device={d['device']}&event={k} shows device/event {got[:3]}")
    # A link the page cannot follow (an event past the device's last, a device it does not have)
    # changes nothing.
    for bad in (f"#device={d['device']}&event={n_events + 5}", "#device=99999&event=0"):
        wd.js("location.hash = arguments[0]", bad)
        time.sleep(0.2)
        after = wd.js(MOMENT_JS)
        if after[:3] != got[:3]:
            failures.append(f"{name}: the link {bad} moved the page from {got[:3]} to {after[:3]}")
    # An event without a keyframe: exactly that event inside the device's stepping window, else
    # the nearest precomputed moment, said so.
    st = d.get("stepping") or {}
    stepped = (lambda e: "patches" in st and st["first"] <= e <= st["last"])
    outside = [e for e in range(n_events) if not stepped(e) and all(x["event"] != e for x in kfs)]
    others = [e for e in range(k - 3, k + 4) if 0 <= e < n_events and all(x["event"] != e for x in kfs)]
    for e in ([others[0]] if others else []) + outside[:1]:
        wd.js("location.hash = arguments[0]", f"#device={d['device']}&event={e}")
        time.sleep(0.2)
        got = wd.js(MOMENT_JS)
        if stepped(e):
            if got[1:3] != [str(d["device"]), str(e)] or f"Layout after event {e} " not in got[3]:
                failures.append(f"{name}: #device={d['device']}&event={e} (in the stepping window) shows {got[1:3]}, "
                                f"caption {got[3][:120]!r}; want event {e} itself")
            continue
        want = str(nearest_keyframe(kfs, e))
        if got[1:3] != [str(d["device"]), want] or f"nearest precomputed moment to event {e}" not in got[3]:
            failures.append(f"{name}: #device={d['device']}&event={e} (no layout of its own) shows {got[1:3]}, "
                            f"caption {got[3][:120]!r}; want the nearest keyframe {want}, said so")
    p = d["points"]
    if d["has_times"] and a and a.get("first_time_us") is not None and p.get("time_us"):
        base = a["first_time_us"]
        xs = [t if t >= 0 else base for t in p["time_us"]]
        t = xs[len(xs) * 2 // 3]
        rel = t - base
        i = max(j for j in range(len(xs)) if xs[j] <= t)
        want = str(p["event"][i] if stepped(p["event"][i]) else nearest_keyframe(kfs, p["event"][i]))
        wd.js("location.hash = arguments[0]", f"#device={d['device']}&t={rel}us")
        time.sleep(0.2)
        got = wd.js(MOMENT_JS)
        if got[1:3] != [str(d["device"]), want]:
            failures.append(f"{name}: #device={d['device']}&t={rel}us shows {got[1:3]}, want keyframe {want}")


STEP_STATE_JS = """
const c = document.getElementById('blockmap'), cur = document.querySelector('#event-list .current');
return [c.dataset.event, c.dataset.stepped, cur ? cur.dataset.event : null, Number(c.dataset.reserved),
        Number(c.dataset.allocated), Number(c.dataset.pending), !document.getElementById('blockmap-oom').hidden];
"""


def press(wd, key, shift=False):
    """A real key press (WebDriver actions) on whatever has the focus."""
    keys = ([{"type": "keyDown", "value": "\ue008"}] if shift else []) + \
        [{"type": "keyDown", "value": key}, {"type": "keyUp", "value": key}] + \
        ([{"type": "keyUp", "value": "\ue008"}] if shift else [])
    wd.s("POST", "/actions", {"actions": [{"type": "key", "id": "keyboard", "actions": keys}]})
    wd.s("DELETE", "/actions")


def check_alloc_detail(wd, name, failures):
    """The allocation view's detail slider: at its lowest, the largest allocation alone is drawn and
    the rest band takes every other drawn allocation's bytes at each bucket's moment; at its
    highest, every drawn one again."""
    data = wd.js("return JSON.parse(document.getElementById('memf-data').textContent)")
    dv = wd.js("return Number(document.body.dataset.device)")
    d = next((x for x in data["devices"] if x["device"] == dv), None)
    if not d or not d.get("allocations") or len(d["allocations"]["drawn"]) < 10:
        return
    al = d["allocations"]
    r, bk = al["drawn"], al["buckets"]
    n = len(r) // 5
    top = max(range(n), key=lambda i: (r[5 * i + 2], -i))
    want = sum(bk["rest"])
    for i in range(n):
        if i == top:
            continue
        for at in bk["at_event"]:
            if r[5 * i] <= at and (r[5 * i + 1] < 0 or r[5 * i + 1] > at):
                want += r[5 * i + 2]
    set_js = ("const s = document.getElementById('alloc-detail'); s.value = arguments[0]; s.dispatchEvent(new Event('input'));"
              "const c = document.getElementById('allocations'); return [c.dataset.drawn, Number(c.dataset.restSum)];")
    got = wd.js(set_js, 0)
    if got != ["1", want]:
        failures.append(f"{name} cuda:{dv}: the detail slider at its lowest draws {got[0]} allocation(s) with a rest band of "
                        f"{got[1]} bytes; want 1 and {want}")
    check_rest_split(wd, d, top, name, failures)
    got = wd.js(set_js, 1000)
    if got != [str(n), sum(bk["rest"])]:
        failures.append(f"{name} cuda:{dv}: the detail slider at its highest draws {got}; want {n} and {sum(bk['rest'])}")
    # Segments over time: one band per segment of the data, said checked only when it agreed.
    st = d.get("segment_timeline")
    mode_js = ("const s = document.getElementById('alloc-mode'); s.value = arguments[0]; s.dispatchEvent(new Event('change'));"
               "const c = document.getElementById('allocations'), cap = document.getElementById('allocations-caption');"
               "return [c.dataset.mode, c.dataset.drawn, cap.textContent];")
    got = wd.js(mode_js, "segments")
    lives = len(st["lives"]) // 7 if st else 0
    if got[:2] != ["segments", str(lives)] or ("Checked:" in got[2]) != bool(st and st["agrees"]):
        failures.append(f"{name} cuda:{dv}: Show segments gives {got[:2]}, caption {got[2][:100]!r}; want {lives} bands, "
                        f"checked {bool(st and st['agrees'])}")
    if lives and wd.js(INK_JS, "allocations") <= 0.001:
        failures.append(f"{name} cuda:{dv}: Show segments draws nothing")
    if wd.js(mode_js, "allocations")[:2] != ["allocations", str(n)]:
        failures.append(f"{name} cuda:{dv}: back to Show allocations did not draw the allocations again")


def check_rest_split(wd, d, top, name, failures):
    """The grey band split on demand (issue 29 item 4), with the slider at its lowest: a real click
    on the band splits it (drawn split, the checkbox on) and lists what it holds at that bucket:
    the server's parts plus every hidden drawn allocation live then, by category (one before the
    trace in the last part), summing to the band."""
    al = d["allocations"]
    r, bk = al["drawn"], al["buckets"]
    if not bk.get("split"):
        failures.append(f"{name} cuda:{d['device']}: the allocation view carries no split of the rest band")
        return
    wd.js("document.getElementById('allocations').scrollIntoView({block: 'center'})")
    c = wd.element("#allocations")
    # the centre of the band's largest drawn piece (the canvas says where), from the canvas's centre
    size = wd.js("const c = document.getElementById('allocations'), r = c.getBoundingClientRect();"
                 "return [r.width, r.height, c.dataset.restPoint];")
    if not size[2]:
        return  # nothing in the band at any bucket
    px, py = (int(v) for v in size[2].split(","))
    hit = (px - size[0] / 2, py - size[1] / 2)
    wd.hover_at(c, *hit)
    if not wd.js("return document.getElementById('allocations-readout').textContent").startswith("rest:"):
        failures.append(f"{name} cuda:{d['device']}: the rest band's largest piece, at {size[2]}, does not read as the band")
        return
    wd.click_at(c, *hit)
    got = wd.js("const c = document.getElementById('allocations'), b = document.getElementById('allocation-stack');"
                "return [c.dataset.split, document.getElementById('alloc-split').checked, b.dataset.restBucket, b.dataset.restParts,"
                " Array.from(b.querySelectorAll('ol.rest-stacks')).map(ol => Array.from(ol.children).map(li => Number(li.dataset.bytes)))];")
    if got[0] != "1" or not got[1] or got[2] is None:
        failures.append(f"{name} cuda:{d['device']}: a click on the rest band did not split it: {got[:3]}")
        return
    b = int(got[2])
    K = len(bk["split"]) // len(bk["at_event"])
    want = bk["split"][b * K:(b + 1) * K]
    at = bk["at_event"][b]
    hidden_live = 0
    for i in range(len(r) // 5):
        if i == top or not (r[5 * i] <= at and (r[5 * i + 1] < 0 or r[5 * i + 1] > at)):
            continue
        want[K - 1 if r[5 * i] < 0 else r[5 * i + 4]] += r[5 * i + 2]
        hidden_live += r[5 * i + 2]
    parts = json.loads(got[3])
    if parts != want or sum(parts) != bk["rest"][b] + hidden_live:
        failures.append(f"{name} cuda:{d['device']}: the rest band at bucket {b} splits as {parts}; want {want} "
                        f"(summing to {bk['rest'][b] + hidden_live})")
    # two lists: the stacks of the allocations the slider hides (the page's sums: checked here
    # against the data), then those of the ones never drawn (the C++ list as it is)
    hidden_by_stack = {}
    for i in range(len(r) // 5):
        if i != top and r[5 * i] >= 0 and r[5 * i] <= at and (r[5 * i + 1] < 0 or r[5 * i + 1] > at):
            hidden_by_stack[r[5 * i + 3]] = hidden_by_stack.get(r[5 * i + 3], 0) + r[5 * i + 2]
    want_hidden = sorted(hidden_by_stack.values(), reverse=True)[:3]
    server = bk["stacks"][b][1::4]
    want_lists = [x for x in (want_hidden, server) if x]
    if got[4] != want_lists:
        failures.append(f"{name} cuda:{d['device']}: the rest band's stacks at bucket {b} list {got[4]} bytes; "
                        f"want {want_lists} (hidden by the slider, then never drawn)")
    wd.js("const s = document.getElementById('alloc-split'); s.checked = false; s.dispatchEvent(new Event('change'));")


def check_stepping(wd, html, name, failures):
    """Event stepping (issue 29 item 2): a link to an event of a device's stepping window shows that
    event in the block map and the event list; the arrow keys move one event (with Shift ten); at
    every keyframe inside the window the page's own replay of the patches gives the keyframe's
    reserved, allocated and pending-free bytes (the C++ model's layout there); at an OOM in the
    window the failed request is drawn."""
    data = wd.js("return JSON.parse(document.getElementById('memf-data').textContent)")
    for d in data["devices"]:
        st = d.get("stepping") or {}
        if "patches" not in st:
            continue
        first, last, dv = st["first"], st["last"], d["device"]
        kfs = d["keyframes"]
        if last - first < 30:
            continue
        mid = (first + last) // 2
        k = next(e for e in range(mid, last) if all(x["event"] != e for x in kfs))
        open_page(wd, f"file://{html}#device={dv}&event={k}")
        got = wd.js(STEP_STATE_JS)
        if got[:3] != [str(k), "1", str(k)]:
            failures.append(f"{name} cuda:{dv}: #event={k} shows block map/stepped/list {got[:3]}, want {k}, 1, {k}")
            continue
        wd.js("document.activeElement && document.activeElement.blur && document.activeElement.blur()")
        for key, shift, want in (("\ue014", False, k + 1), ("\ue012", False, k), ("\ue012", False, k - 1),
                                 ("\ue014", True, k + 9)):
            press(wd, key, shift)
            got = wd.js(STEP_STATE_JS)
            if got[:3] != [str(want), "1", str(want)]:
                failures.append(f"{name} cuda:{dv}: after {'Shift+' if shift else ''}{'right' if key == chr(0xe014) else 'left'} "
                                f"the page shows {got[:3]}, want event {want}")
                break
        # Zoom into the segment under the first row's start, then back (double-click, the button).
        wd.js("document.getElementById('blockmap').dispatchEvent(new MouseEvent('dblclick', {bubbles: true, "
              "clientX: document.getElementById('blockmap').getBoundingClientRect().left + 6, "
              "clientY: document.getElementById('blockmap').getBoundingClientRect().top + 8}))")
        zoom = wd.js("return document.getElementById('blockmap').dataset.zoom")
        cap = wd.js("return document.getElementById('blockmap-caption').textContent")
        if not zoom or f"Zoomed into segment {zoom} " not in cap or wd.js(INK_JS, "blockmap") <= 0.001:
            failures.append(f"{name} cuda:{dv}: a double-click on the block map did not zoom into a segment "
                            f"(zoom {zoom!r}, caption {cap[-160:]!r})")
        press(wd, "\ue014")  # the zoom stays while stepping
        if wd.js("return document.getElementById('blockmap').dataset.zoom") != zoom:
            failures.append(f"{name} cuda:{dv}: stepping one event left the zoom into {zoom}")
        wd.js("document.getElementById('blockmap-unzoom').click()")
        if wd.js("return document.getElementById('blockmap').dataset.zoom") != "":
            failures.append(f"{name} cuda:{dv}: All segments did not leave the zoom")
        # A click on a block shows its stack (no error: window.memfErrors is read after the checks).
        wd.js("document.getElementById('blockmap').scrollIntoView({block: 'center'})")
        wd.click_at(wd.element("#blockmap"), -wd.js("return document.getElementById('blockmap').getBoundingClientRect().width") / 2 + 8,
                    -wd.js("return document.getElementById('blockmap').getBoundingClientRect().height") / 2 + 8)
        # At the window's last event the right arrow goes on to the next precomputed moment.
        later = sorted(x["event"] for x in kfs if x["event"] > last)
        if later:
            wd.js("location.hash = arguments[0]", f"#device={dv}&event={last}")
            time.sleep(0.1)
            press(wd, "\ue014")
            got = wd.js(STEP_STATE_JS)
            if got[:2] != [str(later[0]), "0"]:
                failures.append(f"{name} cuda:{dv}: right arrow at the window's last event {last} shows {got[:2]}, "
                                f"want the next keyframe {later[0]}")
        inside = [x for x in kfs if first <= x["event"] <= last]
        for x in inside[:: max(1, len(inside) // 8)] + [x for x in inside if x.get("oom")][:2]:
            wd.js("location.hash = arguments[0]", f"#device={dv}&event={x['event']}")
            time.sleep(0.1)
            got = wd.js(STEP_STATE_JS)
            at = x["at"]
            want = [at["reserved_bytes"], at["allocated_bytes"], at["pending_free_bytes"]]
            if got[0] != str(x["event"]) or got[3:6] != want:
                failures.append(f"{name} cuda:{dv}: stepped to keyframe event {x['event']} the page shows event {got[0]} with "
                                f"reserved/allocated/pending {got[3:6]}, the keyframe says {want}")
                break
            if x.get("oom") and not got[6]:
                failures.append(f"{name} cuda:{dv}: stepped to the OOM at event {x['event']}, no failed request is drawn")


ZOOM_JS = """
const c = document.getElementById('timeline'), r = c.getBoundingClientRect();
const full = Number(c.dataset.ymax);
for (let k = 0; k < 12; k++)
  c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + 75, clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));
const zoomed = Number(c.dataset.ymax);
c.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
return [full, zoomed, Number(c.dataset.ymax)];
"""


def check_timeline_axes(wd, name, failures):
    """The x axis can be the event index where the file has times; zoomed in near the start, the
    byte axis fits what is in view (and comes back on reset)."""
    if wd.js("return document.getElementById('axis-pick').hidden"):
        return
    titles = "return ['timeline', 'allocations'].map(id => document.getElementById(id).dataset.xtitle)"
    wd.js("const s = document.getElementById('axis'); s.value = 'event'; s.dispatchEvent(new Event('change'));")
    axis, ink, ev_titles = wd.js("return document.getElementById('timeline').dataset.axis"), wd.js(INK_JS, "timeline"), wd.js(titles)
    wd.js("const s = document.getElementById('axis'); s.value = 'time'; s.dispatchEvent(new Event('change'));")
    t_titles = wd.js(titles)
    if axis != "event" or not ink or wd.js("return document.getElementById('timeline').dataset.axis") != "time" or \
            ev_titles[0] != "event index" or not (t_titles[0] or "").startswith("time since"):
        failures.append(f"{name}: the event-index axis: axis {axis!r}, ink {ink}, x titles {ev_titles} then {t_titles}")
    has_alloc = wd.js("return !!document.getElementById('allocations').dataset.xtitle")
    if has_alloc and (ev_titles[1] != "event index" or not (t_titles[1] or "").startswith("time since")):
        failures.append(f"{name}: the allocation view's x axis did not follow: {ev_titles[1]!r} then {t_titles[1]!r}")
    full, zoomed, back = wd.js(ZOOM_JS)
    if not (zoomed <= full and back == full) or (name == "sample_training" and not zoomed < full):
        failures.append(f"{name}: the byte axis on zoom: full {full}, zoomed near the start {zoomed}, after reset {back}")


def no_history_snapshot(path):
    """A snapshot with a device's state at the end and no trace entries (history not recorded)."""
    mib = 1 << 20
    base = 0x7F0000000000
    frames = [{"filename": "train.py", "line": 3, "name": "<module>"}]
    blocks = [{"address": base, "size": 8 * mib, "requested_size": 8 * mib, "state": "active_allocated",
               "frames": frames},
              {"address": base + 8 * mib, "size": 12 * mib, "requested_size": 0, "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": base, "total_size": 20 * mib, "stream": 0, "segment_type": "large",
           "allocated_size": 8 * mib, "active_size": 8 * mib, "requested_size": 8 * mib,
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames, "blocks": blocks}
    with open(path, "wb") as f:
        pickle.dump({"segments": [seg], "device_traces": [[]]}, f, protocol=4)


def check_report(wd, exe, src, workdir, artifacts, name, failures):
    html = os.path.join(workdir, "report.html")
    r = subprocess.run([exe, "report", src, "-o", html], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{name}: report exited {r.returncode}: {r.stderr.strip()[-500:]}")
        return
    size = os.path.getsize(html)
    if size >= MAX_REPORT_BYTES:
        failures.append(f"{name}: report is {size} bytes (budget {MAX_REPORT_BYTES})")
    with open(html, "rb") as f:
        page = f.read()
    if b"http://" in page.replace(b"http://www.w3.org", b"") or b"https://" in page:
        failures.append(f"{name}: the page names a network location")
    a = subprocess.run([exe, "analyze", "--json", src], capture_output=True, text=True)
    if a.returncode != 0:
        failures.append(f"{name}: analyze exited {a.returncode}")
        return
    expected = json.loads(a.stdout)
    wd.get("file://" + html)
    deadline = time.time() + 60
    while time.time() < deadline:
        if wd.alert_text() is not None:
            failures.append(f"{name}: an alert opened: {wd.alert_text()!r}")
            return
        if wd.js("return document.body && document.body.dataset.ready === '1'"):
            break
        if wd.js("return window.memfErrors && window.memfErrors.length"):
            break
        time.sleep(0.1)
    else:
        failures.append(f"{name}: the page did not finish drawing in 60 s")
    errors = wd.js("return window.memfErrors || ['memfErrors missing']")
    if errors:
        failures.append(f"{name}: JavaScript errors: {errors}")
    severe = [e["message"] for e in wd.browser_log() if e.get("level") == "SEVERE"]
    if severe:
        failures.append(f"{name}: console errors: {severe[:3]}")
    if wd.js("return document.querySelectorAll('img').length") != 0:
        failures.append(f"{name}: an <img> element exists in the page")
    if wd.js("return window.__xss !== undefined"):
        failures.append(f"{name}: injected script ran")
    devices = expected["devices"]
    n_options = wd.js("return document.querySelectorAll('#device option').length")
    if n_options != len(devices):
        failures.append(f"{name}: the device selector has {n_options} entries, analyze has {len(devices)} devices")
    # OOM first: the page opens on a device with an OOM whenever one has any (the headline's focus
    # device), and the menu marks every device with an OOM.
    opened = wd.js("return document.body.dataset.device")
    oom_devices = [str(d["device"]) for d in devices if d["oom_count"] > 0]
    if oom_devices and opened not in oom_devices:
        failures.append(f"{name}: the page opened on cuda:{opened}, not on a device with an OOM {oom_devices}")
    check_headline(wd, expected, name, failures)
    check_icicle_frames(wd, name, failures)
    marked = wd.js("return Array.from(document.querySelectorAll('#device option')).map(o => [o.dataset.oom === '1', o.textContent.includes('OOM')])")
    for d, (flag, text) in zip(devices, marked or []):
        if flag != (d["oom_count"] > 0) or text != (d["oom_count"] > 0):
            failures.append(f"{name}: the device menu marks cuda:{d['device']} oom={flag}/{text}, analyze has {d['oom_count']} OOMs")
    if len(devices) > 1:
        rows = wd.js("return document.querySelectorAll('#devices tr[data-device]').length")
        if rows != len(devices):
            failures.append(f"{name}: the cross-device table has {rows} rows for {len(devices)} devices")
    # An unknown line is never printed as a number or null: the file alone is shown.
    text = wd.js("return document.body.innerText")
    for bad in (":null", ":18446744073709551615", ":undefined"):
        if bad in text:
            failures.append(f"{name}: the page shows a frame with line {bad!r}")
    for i, dev in enumerate(devices):
        wd.js("const s = document.getElementById('device'); s.value = String(arguments[0]);"
              "s.dispatchEvent(new Event('change'));", i)
        shown = wd.js(STATS_JS)
        drawn = wd.js("return document.body.dataset.detail") == "1"
        # A history that cannot explain the state (incomplete_history at warning, e.g. a ring buffer
        # of 1): the page says the OOM count is unknown, never 0, and never calls the layout exact.
        unexplained = any(f["kind"] == "incomplete_history" and f["severity"] != "info" for f in dev["findings"])
        if unexplained and dev["oom_count"] == 0:
            if shown.get("oom_count") != "unknown":
                failures.append(f"{name} device {dev['device']}: the history cannot explain the state, yet the page shows {shown.get('oom_count')!r} OOMs, not 'unknown'")
            shown["oom_count"] = "0"
        for key in ["peak_reserved_bytes", "peak_allocated_bytes", "peak_requested_bytes", "peak_active_bytes",
                    "final_reserved_bytes", "oom_count", "events"]:
            if shown.get(key) is None or int(shown.get(key)) != dev[key]:
                failures.append(f"{name} device {dev['device']}: {key} shown {shown.get(key)} != analyze {dev[key]}")
        texts = wd.js("return Array.from(document.querySelectorAll('#stats [data-stat] .exact')).map(e => e.textContent)")
        for key, text in zip(["peak_reserved_bytes", "peak_allocated_bytes", "peak_requested_bytes"], texts):
            if f"{dev[key]:,} B" not in text:
                failures.append(f"{name} device {dev['device']}: {key} text {text!r} lacks {dev[key]:,} B")
        # A peak is called an estimate exactly where analyze says it is not exact: allocated
        # without allocated_exact, every peak of a replay whose peaks are untrusted.
        marked = wd.js("const o = {}; for (const e of document.querySelectorAll('#stats [data-stat]'))"
                       " o[e.dataset.stat] = e.dataset.estimate === '1'; return o")
        for key in ["peak_reserved_bytes", "peak_allocated_bytes", "peak_requested_bytes", "peak_active_bytes"]:
            want = "peaks" in dev["untrusted"] or (key == "peak_allocated_bytes" and not dev["allocated_exact"])
            if bool(marked.get(key)) != want:
                failures.append(f"{name} device {dev['device']}: {key} marked estimate={marked.get(key)}, "
                                f"analyze says estimate={want}")
        shown_findings = wd.js("return Array.from(document.querySelectorAll('#findings li[data-kind]'))"
                               ".map(e => [e.dataset.kind, e.dataset.severity, Number(e.dataset.bytes)])")
        want_findings = [[f["kind"], f["severity"], f["bytes"]] for f in dev["findings"]]
        if shown_findings != want_findings:
            failures.append(f"{name} device {dev['device']}: findings shown {shown_findings} != analyze {want_findings}")
        # The layout is called exact only where the model's whole-device check passed, and the
        # replay's validation is on the page.
        replay_shown = wd.js("const e = document.querySelector('#facts [data-fact=replay]'); return e ? [e.dataset.consistent, e.textContent] : null")
        if not replay_shown or replay_shown[0] != ("1" if dev["consistent"] else "0") or \
                (not dev["consistent"] and not all(u in replay_shown[1] for u in dev["untrusted"])):
            failures.append(f"{name} device {dev['device']}: replay validation shown {replay_shown}, analyze says consistent={dev['consistent']} untrusted={dev['untrusted']}")
        if drawn:
            layout_shown = wd.js("const e = document.querySelector('#facts [data-fact=layout]'); return e ? [e.dataset.exact, e.textContent] : null")
            want_exact = wd.js("const D = JSON.parse(document.getElementById('memf-data').textContent);"
                               "const x = D.devices.find(v => v.device === arguments[0]); return x ? x.layout_exact : null", dev["device"])
            if not layout_shown or (layout_shown[0] == "1") != bool(want_exact) or \
                    layout_shown[1].startswith("exact") != (bool(want_exact) and not unexplained):
                failures.append(f"{name} device {dev['device']}: block layout shown {layout_shown}, data says exact={want_exact}")
        if not drawn:
            summary_only = sum(1 for x in devices if x) - wd.js("return JSON.parse(document.getElementById('memf-data').textContent).devices.length")
            if summary_only <= 0:
                failures.append(f"{name} device {dev['device']}: not drawn, though the report draws every device")
            continue
        has_segments = wd.js("const D = JSON.parse(document.getElementById('memf-data').textContent);"
                             "const x = D.devices.find(v => v.device === arguments[0]); return x.has_segment_info", dev["device"])
        # Without segment info (profiler traces) no block map is drawn, and the caption says why.
        if not has_segments:
            hidden = wd.js("return document.getElementById('blockmap').hidden")
            why = wd.js("return document.getElementById('blockmap-caption').textContent") or ""
            if not hidden or not why.startswith("No block map"):
                failures.append(f"{name} device {dev['device']}: no segment info, but the block map is shown (hidden={hidden}, caption {why!r})")
        # The allocation view: per bucket, the drawn allocations live at its moment plus the rest
        # band are the requested bytes then; the highest is the requested peak.
        sums = wd.js(ALLOC_SUMS_JS, dev["device"])
        if sums and sums["buckets"] and (sums["bad"] or sums["max"] != dev["peak_requested_bytes"]):
            failures.append(f"{name} device {dev['device']}: allocation view sums: {sums['bad']} bad buckets, "
                            f"highest {sums['max']} != peak requested {dev['peak_requested_bytes']}")
        # No chart without data: a device with no trace entries draws no timeline and no
        # allocation view; each section says what is missing and how to record it.
        if dev["events"] == 0:
            for sec, note in (("timeline-section", "timeline-empty"), ("allocations-section", "allocations-empty")):
                shown = wd.js("const s = document.getElementById(arguments[0]), n = document.getElementById(arguments[1]);"
                              "return [s.classList.contains('no-data'), n.hidden, n.textContent,"
                              " document.getElementById(arguments[0].replace('-section', '')).getBoundingClientRect().height]",
                              sec, note)
                if not shown[0] or shown[1] or "_record_memory_history" not in shown[2] or shown[3] != 0:
                    failures.append(f"{name} device {dev['device']}: no history, but {sec} shows {shown}")
        for canvas in ["timeline", "allocations", "blockmap", "icicle"]:
            if canvas in ("timeline", "allocations") and dev["events"] == 0:
                continue
            if canvas == "blockmap" and not has_segments:
                continue
            if canvas == "allocations" and not sums["buckets"]:
                continue
            ink = wd.js(INK_JS, canvas)
            if not ink or ink <= 0.001:
                failures.append(f"{name} device {dev['device']}: the {canvas} canvas is blank (ink {ink})")
        # An OOM device's block map opens at its first OOM, with the failed request drawn against
        # its pool's largest free block: the figures `blocks --at oom` gives.
        if has_segments and dev["oom_count"] > 0 and dev["ooms"]:
            o = dev["ooms"][0]
            shown = wd.js("const c = document.getElementById('blockmap'), p = document.getElementById('blockmap-oom');"
                          "return [c.dataset.device, c.dataset.event, p.hidden, p.dataset.request, p.dataset.largest,"
                          " p.querySelectorAll('[data-bar]').length]")
            # The outlined block is that largest free block (or the merged run holding it), when
            # the pool has any free block.
            hole = wd.js("return document.getElementById('blockmap-oom').dataset.hole")
            b = subprocess.run([exe, "blocks", "--json", "--at", "oom", "--device", str(dev["device"]), src],
                               capture_output=True, text=True)
            want = json.loads(b.stdout)["oom"] if b.returncode == 0 else None
            want_hole = "" if want is None or want["pool_largest_free_bytes"] == 0 else str(want["pool_largest_free_bytes"])
            if want is None or shown != [str(dev["device"]), str(o["event"]), False, str(o["request_bytes"]),
                                         str(want["pool_largest_free_bytes"]), 3] or hole not in (want_hole, "run"):
                failures.append(f"{name} device {dev['device']}: the block map at the OOM shows {shown}, outline {hole!r}; "
                                f"analyze: OOM at event {o['event']} of {o['request_bytes']} B, blocks: {want}")
        # The block map's caption quotes the keyframe's counters (countersJson's names): a renamed
        # field would print NaN or undefined there.
        caption = wd.js("return document.getElementById('blockmap-caption').textContent") or ""
        if not has_segments:
            caption = "reserved 0"
        if "NaN" in caption or "undefined" in caption or not re.search(r"reserved [0-9]", caption):
            failures.append(f"{name} device {dev['device']}: the block map caption is {caption!r}")
        # Clicking the timeline near each end: the block map must move to another moment.
        keyframe_events = wd.js("return Array.from(document.querySelectorAll('#keyframe option')).length")
        if keyframe_events >= 2:
            canvas = wd.element("#timeline")
            width = wd.js("return document.getElementById('timeline').getBoundingClientRect().width")
            before = wd.js("return document.getElementById('blockmap-caption').dataset.event")
            moved = False
            for frac in (0.06, 0.985):
                x = (frac - 0.5) * width  # relative to the canvas centre
                wd.click_at(canvas, x, 0)
                after = wd.js("return document.getElementById('blockmap-caption').dataset.event")
                if after != before:
                    moved = True
                    # The call tree follows the moment when that moment has a tree of its own.
                    follows = wd.js(ICICLE_FOLLOWS_JS, dev["device"])
                    if follows is False:
                        failures.append(f"{name} device {dev['device']}: the call tree did not follow the clicked moment")
                    break
            distinct = wd.js("const k = Array.from(document.querySelectorAll('#keyframe option')).map(o => o.textContent);"
                             "return new Set(k).size")
            if not moved and distinct >= 2:
                failures.append(f"{name} device {dev['device']}: clicking the timeline did not change the block map")
            if moved and has_segments and wd.js(INK_JS, "blockmap") <= 0.001 and dev["final_reserved_bytes"] > 0:
                failures.append(f"{name} device {dev['device']}: the block map is blank after the click")
    if wd.js("return document.body.dataset.detail") == "1" and \
            not wd.js("return document.getElementById('timeline-section').classList.contains('no-data')"):
        check_timeline_axes(wd, name, failures)
    check_moment_links(wd, html, name, failures)
    check_alloc_detail(wd, name, failures)
    check_stepping(wd, html, name, failures)
    if i_errors := wd.js("return window.memfErrors"):
        failures.append(f"{name}: JavaScript errors after interaction: {i_errors}")
    wd.js("window.scrollTo(0, 0)")
    shot = os.path.join(artifacts, name + ".png")
    wd.screenshot(shot)
    print(f"ok   {name}: {size} bytes, {len(devices)} device(s), screenshot {shot}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("source_dir")
    ap.add_argument("real_dir", nargs="?")
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    ap.add_argument("--only", help="only inputs whose name contains this")
    ap.add_argument("--input", action="append", default=[], help="one more input (bench/report_bench.sh)")
    args = ap.parse_args()
    os.makedirs(args.artifacts, exist_ok=True)
    for tool in (args.chromium, args.chromedriver):
        if not os.path.exists(tool):
            print(f"missing {tool}: install Debian's chromium and chromium-driver (scripts/setup-debian.sh)")
            print("0 passed, 1 failed")
            return 1
    workdir = tempfile.mkdtemp(prefix="memf-browser-")
    inputs = [("sample_training", os.path.join(args.source_dir, "snapshots", "sample_training.pickle"))]
    scen = os.path.join(args.source_dir, "snapshots", "scenarios")
    for f in sorted(os.listdir(scen)):
        if f.endswith(".pickle"):
            inputs.append(("scenario_" + f[:-7], os.path.join(scen, f)))
    if args.real_dir and not os.path.isdir(args.real_dir):
        print(f"skip the real snapshots: {args.real_dir} is not there (../shared beside the clone)",
              flush=True)
    if args.real_dir and os.path.isdir(args.real_dir):
        for f in sorted(os.listdir(args.real_dir)):
            if f.endswith(".pickle"):
                inputs.append(("real_" + f[:-7], os.path.join(args.real_dir, f)))
    hostile_dir = os.path.join(workdir, "x<img src=x onerror=alert(1)>")
    os.makedirs(hostile_dir)
    hostile = os.path.join(hostile_dir, "hostile" + XSS.replace("/", "_") + ".pickle")
    hostile_snapshot(hostile)
    inputs.append(("hostile_markup", hostile))
    no_history = os.path.join(workdir, "no_history.pickle")
    no_history_snapshot(no_history)
    inputs.append(("no_history", no_history))
    for extra in args.input:
        if not os.path.exists(extra):
            # a clone without ../shared beside it: the real inputs are skipped, and said so
            print(f"skip {extra}: not there (the real files live in ../shared beside the clone)",
                  flush=True)
            continue
        inputs.append(("input_" + os.path.basename(extra).rsplit(".", 1)[0], extra))
    if args.only:
        inputs = [x for x in inputs if args.only in x[0]]

    wd = WebDriver(args.chromedriver, args.chromium, workdir)
    passed = failed = 0
    try:
        for name, path in inputs:
            failures = []
            try:
                check_report(wd, args.exe, path, workdir, args.artifacts, name, failures)
            except WebDriverError as e:
                failures.append(f"{name}: WebDriver: {e}")
            if name == "hostile_markup" and not failures:
                # The markup must be on the page as text: in the file name and in a frame.
                # Its frame, hovered in the call tree of device 0 (third row: root, <module>, the frame).
                wd.js("const s = document.getElementById('device'); s.value = '0'; s.dispatchEvent(new Event('change'));")
                height = wd.js("return document.getElementById('icicle').getBoundingClientRect().height")
                wd.hover_at(wd.element("#icicle"), 0, 2 * 18 + 9 - height / 2)
                shown = wd.js("return document.getElementById('icicle-readout').textContent")
                if "forward" + XSS not in shown:
                    failures.append(f"{name}: the hostile frame name is not shown as text: {shown!r}")
                if wd.js("return document.getElementById('file').textContent") != hostile:
                    failures.append(f"{name}: the file name is not shown verbatim")
            if failures:
                failed += 1
                for f in failures:
                    print("FAIL " + f, flush=True)
            else:
                passed += 1
    finally:
        wd.quit()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
