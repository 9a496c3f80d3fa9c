// report.js: draws the memforensics report from the JSON document embedded in the page.
// Every string from the snapshot reaches the DOM through textContent or canvas text, never as HTML.
// Nothing here decides what the analysis found: the device the page opens on is the headline's
// (analysis/headline.h, D.headline.focus_device); the page only presents.
(function () {
  "use strict";  // inside: the views' scripts come before this one in the page's <script>
  const D = JSON.parse(document.getElementById("memf-data").textContent);
  const A = D.analysis;
  const $ = (id) => document.getElementById(id);

  // ---------- helpers ----------
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) for (const k of Object.keys(attrs)) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function fmtBytes(n) {
    if (n === null || n === undefined) return "n/a";
    if (typeof n === "string") n = Number(n);
    let v = Math.abs(n), u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    return (n < 0 ? "-" : "") + (u === 0 ? String(v) : v.toFixed(2)) + " " + UNITS[u];
  }
  // Byte counts above 2^53 arrive as decimal strings (exact); a number beyond 2^53 (drawing data)
  // is not exact in JavaScript, so it is shown as an estimate.
  const exact = (n) => {
    if (typeof n === "string") return n.replace(/\B(?=(\d{3})+(?!\d))/g, ",") + " B";
    return (Number.isFinite(n) && !Number.isSafeInteger(n) ? "≈ " : "") + Number(n).toLocaleString("en-US") + " B";
  };
  // A line is known when it is a safe non-negative integer (the files write unknown lines as null,
  // or as 2^64 - 1 that JavaScript cannot even hold): otherwise the file alone is shown.
  const knownLine = (l) => typeof l === "number" && Number.isSafeInteger(l) && l >= 0;
  function frameText(f) {
    const file = Array.isArray(f) ? f[0] : f.filename, line = Array.isArray(f) ? f[2] : f.line, name = Array.isArray(f) ? f[1] : f.name;
    return file + (knownLine(line) ? ":" + line : "") + (name ? " " + name : "");
  }
  // The helpers the page's other panels (whatif.js, embedded after this script) draw with: one
  // definition of an element, a byte count and a frame for the whole page.
  window.memfViz = Object.freeze({ el, fmtBytes, frameText });
  function dprCanvas(c) {
    const r = c.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(100, Math.round(r.width)), h = Math.max(60, Math.round(r.height));
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { g, w, h };
  }
  function lowerBound(arr, x) {
    let lo = 0, hi = arr.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] < x) lo = m + 1; else hi = m; }
    return lo;
  }
  // Round axis steps: 1, 2 or 5 times a power of ten, about `target` of them over `range`.
  function niceStep(range, target) {
    const raw = range / Math.max(1, target);
    if (!(raw > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  const stepDecimals = (step) => Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  // The byte axis: one binary unit for the whole axis, round steps in it.
  function byteTicks(ymax, target) {
    let u = 0;
    while (u < UNITS.length - 1 && ymax / Math.pow(1024, u + 1) >= 1) u++;
    const scale = Math.pow(1024, u), step = niceStep(ymax / scale, target), dec = stepDecimals(step);
    const ticks = [];
    for (let k = 0; k * step * scale <= ymax * 1.0001 && k < 100; k++) ticks.push({ v: k * step * scale, label: (k * step).toFixed(dec) + " " + UNITS[u] });
    return { ticks, unit: UNITS[u], top: Math.max(ymax, ticks.length ? ticks[ticks.length - 1].v : ymax) };
  }

  // ---------- one time for one event ----------
  // Every view names an event as "event N (+t)", t the time since the device's first event in one
  // unit per device (chosen from its span), so the same event reads the same everywhere.
  let TIME = null;  // { base, unit, div, dec, map: event -> time_us }
  function prepTimes() {
    const a = devA(), d = dev();
    const base = a.first_time_us, last = a.last_time_us;
    const span = base !== null && last !== null && base !== undefined && last !== undefined ? last - base : null;
    const unit = span === null ? null : span < 2000 ? "µs" : span < 2e6 ? "ms" : "s";
    const div = unit === "µs" ? 1 : unit === "ms" ? 1000 : 1e6;
    const map = new Map();
    const put = (ev, t) => { if (ev !== null && ev !== undefined && ev >= 0 && t !== null && t !== undefined && t >= 0 && !map.has(ev)) map.set(ev, t); };
    for (const k of ["reserved", "allocated", "requested", "active"]) put(a["peak_" + k + "_event"], a["peak_" + k + "_time_us"]);
    for (const o of a.ooms) put(o.event, o.time_us);
    for (const f of a.findings) for (const e of f.evidence) put(e.event, e.time_us);
    if (d) {
      if (d.has_times && d.points.time_us) d.points.event.forEach((ev, i) => put(ev, d.points.time_us[i]));
      for (const k of d.keyframes) put(k.event, k.time_us);
      const al = d.allocations;
      if (al && al.times) for (let i = 0, j = 0; i < al.drawn.length; i += 5, j += 2) { put(al.drawn[i], al.times[j]); put(al.drawn[i + 1], al.times[j + 1]); }
      if (al && al.buckets.first_time_us) al.buckets.first_event.forEach((ev, i) => put(ev, al.buckets.first_time_us[i]));
    }
    TIME = { base: base === null || base === undefined ? 0 : base, unit, div, dec: unit === "µs" ? 0 : 3, map };
  }
  function fmtRel(t) {
    if (!TIME || TIME.unit === null || t === null || t === undefined || t < 0) return "";
    return "+" + ((t - TIME.base) / TIME.div).toFixed(TIME.dec) + " " + TIME.unit;
  }
  function timeOf(ev, t) {
    if (t !== null && t !== undefined && t >= 0) return t;
    if (ST && ST.st.times && ev >= ST.st.first && ev <= ST.st.last && ST.st.times[ev - ST.st.first] >= 0) return ST.st.times[ev - ST.st.first];
    return TIME && TIME.map.has(ev) ? TIME.map.get(ev) : null;
  }
  // "event 123 (+1.234 s)"; the start state is "the start".
  function evWhen(ev, t) {
    if (ev === null || ev === undefined) return "";
    if (ev < 0) return "the start";
    const rel = fmtRel(timeOf(ev, t));
    return "event " + ev + (rel ? " (" + rel + ")" : "");
  }

  const SERIES = [
    { key: "reserved", label: "reserved", colour: "#8a94a6", fill: "rgba(138,148,166,0.18)" },
    { key: "allocated", label: "allocated", colour: "#2f6fd6" },
    { key: "requested", label: "requested", colour: "#16a34a" },
    { key: "pending", label: "pending free", colour: "#e08600" },
  ];
  const STATE_COLOURS = ["#e3e6eb", "#2f6fd6", "#e08600"];  // free, allocated, pending free
  const STATE_NAMES = ["free", "allocated", "pending free"];
  const CATEGORY_COLOURS = ["#7c3aed", "#db2777", "#2563eb", "#0d9488", "#f59e0b", "#64748b"];
  const CATEGORY_HUES = [265, 330, 220, 175, 38, 215];
  const PHASE_COLOURS = { iteration: "rgba(47,111,214,0.06)", forward: "rgba(22,163,74,0.35)",
    backward: "rgba(219,39,119,0.35)", optimizer: "rgba(245,158,11,0.45)", other: "rgba(100,116,139,0.25)" };
  const OOM_COLOUR = "#b3261e";

  // ---------- state ----------
  const S = { dev: 0, axis: "time", kf: 0, colourBy: "state", zoom: null, allocDetail: 1000, allocMode: "allocations", restSplit: false, restBucket: -1, view: null, hoverX: null, block: null, icicleRoot: 0, search: "", alloc: -1 };
  // S.dev indexes analysis devices (all of them up to 1,000: render_html.h kPageAnalysisDevices);
  // drawings exist for D.devices (maybe fewer).
  const drawn = new Map(D.devices.map((d) => [d.device, d]));
  const devA = () => A.devices[S.dev];
  const dev = () => drawn.get(devA().device);
  // The x of the timeline and the allocation view: time where the file has it, unless the reader
  // picked the event index (idle stretches then take no width).
  const timeAxis = () => dev().has_times && S.axis !== "event";
  function severityCounts(a) {
    const c = { high: 0, warning: 0, info: 0 };
    for (const f of a.findings) c[f.severity] = (c[f.severity] || 0) + 1;
    return c;
  }
  function switchDevice(i) {
    S.dev = i;
    $("device").value = String(i);
    selectDevice();
  }
  const indexOfDevice = (device) => A.devices.findIndex((x) => x.device === device);

  // ---------- header, headline, devices ----------
  function renderHeader() {
    $("file").textContent = A.path;
    document.title = "memforensics: " + A.path;
    const sel = $("device");
    sel.textContent = "";
    A.devices.forEach((d, i) => {
      const c = severityCounts(d), marks = [];
      if (d.oom_count) marks.push("OOM" + (d.oom_count > 1 ? " ×" + d.oom_count : ""));
      if (c.high) marks.push(c.high + " high");
      const opt = el("option", { value: String(i), text: "cuda:" + d.device + (marks.length ? " — " + marks.join(", ") : "") + (drawn.has(d.device) ? "" : " (summary only)") });
      if (d.oom_count) opt.dataset.oom = "1";
      if (c.high) opt.dataset.high = String(c.high);
      sel.append(opt);
    });
    sel.value = String(S.dev);
    sel.addEventListener("change", () => { S.dev = Number(sel.value); selectDevice(); });
  }
  // The answer above the fold: the focus, the OOM verdicts and high findings (the first few), the
  // current device's peaks and a small timeline of it (peak, OOMs, the card's memory). The box is
  // red only when it holds a high item, amber for a warning, neutral otherwise.
  const HEADLINE_ITEMS = 4;
  const noHistory = () => !devA().events;
  function renderHeadline() {
    const box = $("headline");
    box.textContent = "";
    box.hidden = false;
    const h = D.headline || { items: [] };
    const top = h.items.some((x) => x.severity === "high") ? "high" : h.items.some((x) => x.severity === "warning") ? "warning" : "none";
    box.className = "headline sev-" + top;
    box.dataset.severity = top;
    if (A.devices.length > 1 && h.focus_reason) {
      box.append(el("div", { cls: "focus", text: "Opened on cuda:" + h.focus_device + ": " + h.focus_reason + "." }));
    }
    if (!h.items.length) {
      box.append(el("div", { cls: "focus", text: "No OOM and no high finding" + (A.devices.length > 1 ? " on any device" : "") +
        (h.other_warnings ? "; " + h.other_warnings + " warning" + (h.other_warnings > 1 ? "s" : "") + " in the findings" : "") + "." }));
    }
    const ul = el("ul", { cls: "headline-items" });
    for (const it of h.items.slice(0, HEADLINE_ITEMS)) {
      const li = el("li", { "data-device": String(it.device), "data-kind": it.kind, "data-severity": it.severity },
        el("span", { cls: "sev " + it.severity, text: it.severity }));
      let title = it.title;
      if (it.device >= 0 && indexOfDevice(it.device) >= 0) {
        const b = el("button", { cls: "link", type: "button", text: "cuda:" + it.device });
        b.addEventListener("click", () => switchDevice(indexOfDevice(it.device)));
        li.append(b, ": ");
        const prefix = "cuda:" + it.device + ":";  // a title that names its device already
        if (title.startsWith(prefix)) title = title.slice(prefix.length).trimStart();
      }
      li.append(el("span", { cls: "finding-title", text: title }), el("span", { cls: "bytes", text: " " + fmtBytes(it.bytes) }));
      if (it.where && it.where.length) li.append(el("div", { cls: "where", text: "Line to change: " + frameText(it.where[0]) }));
      ul.append(li);
    }
    if (h.items.length) box.append(ul);
    if (h.items.length > HEADLINE_ITEMS) {
      box.append(el("div", { cls: "more", text: "and " + (h.items.length - HEADLINE_ITEMS) + " more OOM or high item(s): see the findings of each device" }));
    }
    const a = devA();
    const line = "cuda:" + a.device + ": peak reserved " + fmtBytes(a.peak_reserved_bytes) +
      (a.peak_reserved_event !== null && a.peak_reserved_event !== undefined && a.peak_reserved_event >= 0 ? " at " + evWhen(a.peak_reserved_event, a.peak_reserved_time_us) : "") +
      ", peak allocated " + fmtBytes(a.peak_allocated_bytes) + ", " + (a.oom_count ? a.oom_count + " OOM" + (a.oom_count > 1 ? "s" : "") : "no OOM") +
      (noHistory() ? "; no allocation history in the file for this device, so no timeline (see the findings)" : "") + ".";
    box.append(el("div", { cls: "device-line", text: line }));
    if (dev() && !noHistory()) {
      const c = el("canvas", { id: "headline-chart", cls: "mini", title: "click: the timeline at that moment" });
      c.addEventListener("click", (e) => {
        if (!TL || !TL.xs.length) return;
        const r = c.getBoundingClientRect(), m = miniGeometry(r.width, r.height);
        const v = TL.lo + ((e.clientX - r.left - m.l) / m.pw) * (TL.hi - TL.lo);
        const i = Math.min(TL.xs.length - 1, Math.max(0, lowerBound(TL.xs, v)));
        gotoEvent(dev().points.event[i]);
        $("timeline-section").scrollIntoView();
      });
      box.append(c);
    }
  }
  const miniGeometry = (w, h) => ({ l: 64, r: 12, t: 20, b: 18, pw: w - 76, ph: h - 38 });
  // The small timeline of the headline: reserved and allocated over the whole device, its peak
  // reserved, its OOMs and the card's memory when it is on the scale.
  function drawMini() {
    const c = $("headline-chart");
    if (!c || !TL || !dev()) return;
    const d = dev(), xs = TL.xs;
    const { g, w, h } = dprCanvas(c);
    const m = miniGeometry(w, h);
    g.clearRect(0, 0, w, h); g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
    const yt = byteTicks(TL.ymax, 2);
    const X = (x) => m.l + ((x - TL.lo) / (TL.hi - TL.lo)) * m.pw, Y = (y) => m.t + m.ph - (y / yt.top) * m.ph;
    g.font = "11px system-ui, sans-serif"; g.fillStyle = "#5b6475"; g.strokeStyle = "#e6e9ef";
    g.textAlign = "right"; g.textBaseline = "middle";
    for (const t of yt.ticks) {
      const y = Math.round(Y(t.v)) + 0.5;
      g.beginPath(); g.moveTo(m.l, y); g.lineTo(w - m.r, y); g.stroke();
      g.fillText(t.label, m.l - 5, y);
    }
    g.textBaseline = "alphabetic";
    for (const s of [SERIES[0], SERIES[1]]) drawSteps(g, xs, d.points[s.key], 0, xs.length, X, Y, s, 1.2);
    const labels = [];
    c.dataset.device = String(devA().device);
    c.dataset.capacity = TL.cap && TL.capOnScale ? String(TL.cap) : "";
    if (TL.cap && TL.capOnScale) {
      const y = Math.round(Y(TL.cap)) + 0.5;
      g.strokeStyle = "#111"; g.setLineDash([5, 3]); g.beginPath(); g.moveTo(m.l, y); g.lineTo(w - m.r, y); g.stroke(); g.setLineDash([]);
      g.fillStyle = "#111"; g.textAlign = "right"; g.fillText("card's memory " + fmtBytes(TL.cap), w - m.r - 4, y - 3);
    }
    const p = d.peaks.reserved;
    c.dataset.peakEvent = String(p.event);
    if (p.event >= -1) {
      const x = X(timeXOf(p.event, p.time_us));
      g.fillStyle = "#5b6475"; g.beginPath(); g.arc(x, Y(p.bytes), 3, 0, 2 * Math.PI); g.fill();
      labels.push({ x, text: "peak reserved " + fmtBytes(p.bytes), colour: "#5b6475", yTo: Y(p.bytes) });
    }
    c.dataset.ooms = String(d.ooms.length);
    d.ooms.forEach((o, i) => {
      const x = Math.round(X(timeXOf(o.event, o.time_us))) + 0.5;
      g.strokeStyle = OOM_COLOUR; g.lineWidth = 2; g.beginPath(); g.moveTo(x, m.t); g.lineTo(x, m.t + m.ph); g.stroke(); g.lineWidth = 1;
      if (i < 4) labels.push({ x, text: "OOM" + (d.ooms.length > 1 ? " " + (i + 1) : "") + ": " + fmtBytes(o.request_bytes) + " request", colour: OOM_COLOUR, yTo: m.t + m.ph });
    });
    placeLabels(g, labels, m.l, w - m.r, Math.max(m.t + 10, TL.cap && TL.capOnScale ? Y(TL.cap) + 14 : 0));
    g.fillStyle = "#5b6475"; g.textAlign = "left"; g.fillText(timeAxis() && TIME.unit ? fmtRel(xs[0]) : "event " + xs[0], m.l, h - 4);
    g.textAlign = "right";
    g.fillText(timeAxis() && TIME.unit ? fmtRel(xs[xs.length - 1]) : "event " + xs[xs.length - 1], w - m.r, h - 4);
    g.textAlign = "center"; g.fillText("reserved (grey) and allocated (blue) over the whole trace", m.l + m.pw / 2, h - 4);
  }
  function renderDevices() {
    const box = $("devices");
    box.textContent = "";
    if (A.devices.length < 2) { box.hidden = true; return; }
    box.hidden = false;
    box.append(el("h3", { text: "Devices (click a row to show it)" }));
    const t = el("table", { cls: "small devices" }, el("tr", null, ...["device", "peak reserved", "peak allocated", "capacity", "OOMs", "high", "warning", "info"].map((x) => el("th", { text: x }))));
    A.devices.forEach((a, i) => {
      const c = severityCounts(a), d = drawn.get(a.device);
      const cap = d && d.capacity_bytes ? fmtBytes(d.capacity_bytes) : "—";
      const tr = el("tr", { cls: "pick" + (i === S.dev ? " current" : "") + (a.oom_count ? " oom" : ""), "data-device": String(a.device), tabindex: "0" },
        el("td", { text: "cuda:" + a.device }), el("td", { text: fmtBytes(a.peak_reserved_bytes) }), el("td", { text: fmtBytes(a.peak_allocated_bytes) }),
        el("td", { text: cap }), el("td", { text: String(a.oom_count) }), el("td", { text: String(c.high) }), el("td", { text: String(c.warning) }), el("td", { text: String(c.info) }));
      tr.addEventListener("click", () => switchDevice(i));
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") switchDevice(i); });
      t.append(tr);
    });
    box.append(t);
    const jobs = A.job_findings || [];
    if (jobs.length) {
      box.append(el("h3", { text: "Across devices" }));
      box.append(findingList(jobs));
    }
  }

  // ---------- summary ----------
  // `estimate`: why the figure is not exact ("" or absent when it is); the box then says so and
  // carries data-estimate.
  function stat(key, label, bytes, note, estimate) {
    const box = el("div", { cls: "stat", "data-stat": key, "data-bytes": String(bytes) },
      el("div", { cls: "label", text: label + (estimate ? " (estimate)" : "") }),
      el("div", { cls: "value", text: fmtBytes(bytes) }),
      el("div", { cls: "exact", text: exact(bytes) + (note ? " · " + note : "") }));
    if (estimate) {
      box.dataset.estimate = "1";
      box.append(el("div", { cls: "estimate", text: estimate }));
    }
    return box;
  }
  // Why a device's peaks are not exact (analyze's `consistent` / `untrusted`, `allocated_exact`).
  function peakEstimate(a, key) {
    if (!a.consistent && (a.untrusted || []).includes("peaks")) {
      return "not exact: the replay is not consistent with the file's final state (see Replay)";
    }
    if (key === "peak_allocated_bytes" && a.allocated_exact === false) {
      return "blocks freed before the end are counted at PyTorch's rounding of the request; large-pool " +
        "blocks can hold up to 1 MiB more that the file does not record (the block map's allocated is " +
        "the allocator model's)";
    }
    return "";
  }
  function countStat(key, label, n) {
    return el("div", { cls: "stat", "data-stat": key, "data-value": String(n) },
      el("div", { cls: "label", text: label }), el("div", { cls: "value", text: Number(n).toLocaleString("en-US") }));
  }
  function eventNote(ev, t) {
    if (ev === null || ev === undefined) return "";
    return ev < 0 ? "at the start" : "after " + evWhen(ev, t);
  }

  // A device whose history cannot explain its state (a ring buffer of 1, no trace: the
  // incomplete_history finding at warning): its OOM count and layout say so, never "0" or "exact".
  const historyUnexplained = (a) => !!a && a.findings.some((f) => f.kind === "incomplete_history" && f.severity !== "info");
  // Exact only where the allocator model reproduced the whole device (the page never says more).
  function layoutText(d) {
    if (!d) return "not drawn for this device in this report (see below)";
    if (d.has_segment_info === false) return "not in the file: " + noSegmentsWhy();
    const m = d.model;
    const counts = "the allocator model predicted " + m.alloc_matches + " of " + m.allocs + " allocations and " +
      m.segment_matches + " of " + m.segment_events + " segment events";
    if (d.layout_exact && historyUnexplained(devA())) {
      return "the file's final layout as it is; the history cannot explain how it came about (see the incomplete_history finding: " + counts + ")";
    }
    if (d.layout_exact) return "exact (" + counts + (m.final_compared ? ", and the file's final layout" : "") + ")";
    return "estimate: " + (m.estimate_reason || "the allocator model did not reproduce the trace") + " (" + counts + ")";
  }
  const noSegmentsWhy = () => "this file (" + A.input.format + ") records allocations but not the allocator's segments, so no block map is drawn rather than an invented one";
  function renderSummary() {
    const a = devA(), d = dev(), inp = A.input;
    const facts = $("facts");
    facts.textContent = "";
    const span = a.first_time_us !== null && a.last_time_us !== null ? fmtRel(a.last_time_us).slice(1) : "no times in the file";
    const rows = [
      ["File", A.path], ["Format", inp.format + (inp.pickle_protocol ? " (protocol " + inp.pickle_protocol + ")" : "") +
        (inp.origin ? (inp.origin.startsWith("live capture") ? ", recorded by " : ", converted from ") + inp.origin : "")],
      ["Size", fmtBytes(inp.bytes)], ["PyTorch era", inp.pytorch_era],
      ["Devices", A.devices.map((x) => "cuda:" + x.device + (x.oom_count ? " (OOM)" : "")).join(", ")],
      ["Events on this device", Number(a.events).toLocaleString("en-US")], ["Time span", span],
      ["Segments at the end", String(a.segments)],
      ["Block layout", layoutText(d), "layout"],
      ["Replay", a.consistent ? "consistent with the file's final state" :
        "not consistent with the file's final state: not exact here: " + (a.untrusted || []).join(", "), "replay"],
    ];
    if (d && d.capacity_bytes) rows.push(["Card's memory", fmtBytes(d.capacity_bytes) + " (" + exact(d.capacity_bytes) + "; " + d.capacity_basis + ")", "capacity"]);
    if (d && (d.streams_omitted || d.pools_omitted)) {
      rows.push(["Breakdowns", (d.streams_omitted || 0) + " stream(s) and " + (d.pools_omitted || 0) +
        " pool(s) beyond those with the highest reserved peaks are not broken down (`timeline` names the bound)", "breakdowns"]);
    }
    for (const w of inp.warnings) rows.push(["Warning", w]);
    for (const [k, v, key] of rows) {
      const dd = el("dd", { text: v });
      if (key) dd.dataset.fact = key;
      if (key === "layout" && d) dd.dataset.exact = d.layout_exact ? "1" : "0";
      if (key === "replay") dd.dataset.consistent = a.consistent ? "1" : "0";
      facts.append(el("dt", { text: k }), dd);
    }

    const st = $("stats");
    st.textContent = "";
    for (const [key, label, ev, t] of [
      ["peak_reserved_bytes", "Peak reserved", a.peak_reserved_event, a.peak_reserved_time_us],
      ["peak_allocated_bytes", "Peak allocated", a.peak_allocated_event, a.peak_allocated_time_us],
      ["peak_requested_bytes", "Peak requested", a.peak_requested_event, a.peak_requested_time_us],
      ["peak_active_bytes", "Peak active", a.peak_active_event, a.peak_active_time_us],
    ]) st.append(stat(key, label, a[key], eventNote(ev, t), peakEstimate(a, key)));
    st.append(stat("final_reserved_bytes", "Reserved at the end", a.final_reserved_bytes));
    if (historyUnexplained(a) && !a.oom_count) {
      st.append(el("div", { cls: "stat", "data-stat": "oom_count", "data-value": "unknown" },
        el("div", { cls: "label", text: "OOMs" }), el("div", { cls: "value", text: "unknown" }),
        el("div", { cls: "exact", text: "the history cannot explain an OOM" })));
    } else {
      st.append(countStat("oom_count", "OOMs", a.oom_count));
    }
    st.append(countStat("events", "Events", a.events));

    const oo = $("ooms");
    oo.textContent = "";
    if (a.ooms.length) {
      oo.append(el("h3", { text: "Out-of-memory events" }));
      const t = el("table", { cls: "small" }, el("tr", null, el("th", { text: "event" }), el("th", { text: "request" }),
        el("th", { text: "device free" }), el("th", { text: "allocated then" }), el("th", { text: "reserved then" }), el("th", { text: "from" })));
      for (const o of a.ooms) {
        t.append(el("tr", { "data-oom-event": String(o.event) }, el("td", null, eventLink(o.event, o.time_us)), el("td", { text: fmtBytes(o.request_bytes) }),
          el("td", { text: fmtBytes(o.device_free_bytes) }), el("td", { text: fmtBytes(o.state.allocated_bytes) }),
          el("td", { text: fmtBytes(o.state.reserved_bytes) }), el("td", { cls: "mono", text: o.frames.length ? frameText(o.frames[0]) : "(no stack)" })));
      }
      oo.append(t);
    }
    const an = $("anomalies");
    an.textContent = "";
    if (a.anomalies.length) {
      an.append(el("h3", { text: "Anomalies in the file" }));
      const ul = el("ul");
      for (const x of a.anomalies) {
        const first = x.first_event === null || x.first_event === undefined || x.first_event < 0 ? "" : ", first at " + evWhen(x.first_event);
        ul.append(el("li", { text: x.severity + ": " + x.description + " (" + x.count + "×" + first + ")" }));
      }
      an.append(ul);
    }
    const caps = $("caps");
    caps.textContent = "";
    for (const c of D.caps) caps.append(el("div", { text: "Shown in part: " + c }));
  }

  function eventLink(ev, t) {
    if (ev === null || ev === undefined || ev < -1) return el("span", { text: "—" });
    const b = el("button", { cls: "link", type: "button", "data-goto-event": String(ev), text: ev < 0 ? "start" : evWhen(ev, t) });
    b.addEventListener("click", () => { if (dev()) gotoEvent(ev); });
    return b;
  }

  function findingList(fs) {
    const ol = el("ol", { cls: "findings" });
    for (const f of fs) {
      const li = el("li", { "data-kind": f.kind, "data-severity": f.severity, "data-bytes": String(f.bytes) },
        el("span", { cls: "sev " + f.severity, text: f.severity }), el("span", { cls: "bytes", text: fmtBytes(f.bytes) }),
        el("span", { cls: "finding-title", text: f.title }));
      li.append(el("div", { cls: "fix", text: "Fix: " + f.fix }));
      if (f.where.length) li.append(el("div", { cls: "where", text: "Where: " + f.where.map(frameText).join("  ←  ") }));
      const ev = el("ul", { cls: "evidence" });
      for (const e of f.evidence) {
        const item = el("li", null, e.text + (e.bytes ? ": " + fmtBytes(e.bytes) : ""));
        if (e.event !== null && e.event !== undefined) { item.append(" · "); item.append(eventLink(e.event, e.time_us)); }
        if (e.frames.length) item.append(el("span", { cls: "mono", text: " · " + frameText(e.frames[0]) }));
        ev.append(item);
      }
      li.append(ev, el("div", { cls: "where", text: "Basis: " + f.basis }));
      ol.append(li);
    }
    return ol;
  }
  function renderFindings() {
    const ol = $("findings");
    ol.textContent = "";
    const fs = devA().findings;
    if (!fs.length) { ol.append(el("li", { text: "No findings on this device." })); return; }
    for (const li of Array.from(findingList(fs).children)) ol.append(li);
  }

  // ---------- timeline ----------
  // The kept points' times (an unknown time reads as the first known one).
  function pointTimes(d) {
    const first = d.points.time_us.find((t) => t >= 0);
    return d.points.time_us.map((t) => (t >= 0 ? t : first === undefined ? 0 : first));
  }
  function xsOf(d) {
    const p = d.points;
    if (!timeAxis() || !p.time_us) return p.event.slice();
    return pointTimes(d);
  }
  let TL = null;  // per device: xs, range
  function prepTimeline() {
    const d = dev();
    const xs = xsOf(d);
    let lo = xs.length ? xs[0] : 0, hi = xs.length ? xs[xs.length - 1] : 1;
    if (hi <= lo) hi = lo + 1;
    let ymax = 1;
    for (const s of SERIES) for (const v of d.points[s.key]) if (v > ymax) ymax = v;
    // The card's memory is drawn when it is on the scale (within 1.6x of the highest series);
    // otherwise the axis says where it is.
    const cap = d.capacity_bytes || 0;
    const capOnScale = cap > 0 && cap <= ymax * 1.6;
    if (capOnScale) ymax = Math.max(ymax, cap);
    TL = { xs, lo, hi, ymax: ymax * 1.04, cap, capOnScale };
    S.view = [lo, hi];
    const lg = $("timeline-legend");
    lg.textContent = "";
    for (const s of SERIES) lg.append(el("span", null, el("i", { style: "background:" + s.colour }), s.label));
    lg.append(el("span", null, el("i", { style: "background:" + OOM_COLOUR }), "OOM"));
    if (cap) lg.append(el("span", null, el("i", { style: "background:#111;height:2px" }), "card's memory" + (capOnScale ? "" : " (" + fmtBytes(cap) + ", above the scale)")));
  }
  // The x of an event: its time when the file has times (exact where known, else the nearest kept
  // point at or before it), else its index.
  function xOfEvent(ev) {
    const d = dev();
    if (!timeAxis()) return ev;
    const t = timeOf(ev);
    if (t !== null) return t;
    const i = Math.max(0, lowerBound(d.points.event, ev + 1) - 1);
    return TL.xs[Math.min(i, TL.xs.length - 1)];
  }
  function timeXOf(ev, t) { return timeAxis() && t !== null && t !== undefined && t >= 0 ? t : xOfEvent(ev); }
  // The x axis: time since the device's first event in the device's unit, or the event index.
  function xTicks(v0, v1, target) {
    const d = dev(), ticks = [];
    if (timeAxis() && TIME.unit) {
      const a = (v0 - TIME.base) / TIME.div, b = (v1 - TIME.base) / TIME.div, step = niceStep(b - a, target), dec = stepDecimals(step);
      for (let k = Math.ceil(a / step); k * step <= b && ticks.length < 60; k++) ticks.push({ x: TIME.base + k * step * TIME.div, label: (k * step).toFixed(dec) + " " + TIME.unit });
      return { ticks, title: "time since the first event (" + TIME.unit + ")" };
    }
    const step = Math.max(1, niceStep(v1 - v0, target));
    for (let k = Math.ceil(v0 / step); k * step <= v1 && ticks.length < 60; k++) ticks.push({ x: k * step, label: String(k * step) });
    return { ticks, title: "event index" };
  }
  // One series as a step line over points [i0, i1) (a value holds until the next point), filled
  // down to zero first when the series has a fill; the big timeline and the headline's small one.
  function drawSteps(g, xs, ys, i0, i1, X, Y, s, width) {
    const steps = () => {
      g.beginPath(); g.moveTo(X(xs[i0]), Y(ys[i0]));
      for (let i = i0 + 1; i < i1; i++) { g.lineTo(X(xs[i]), Y(ys[i - 1])); g.lineTo(X(xs[i]), Y(ys[i])); }
    };
    if (s.fill) {
      steps(); g.lineTo(X(xs[i1 - 1]), Y(0)); g.lineTo(X(xs[i0]), Y(0)); g.closePath();
      g.fillStyle = s.fill; g.fill();
    }
    steps();
    g.strokeStyle = s.colour; g.lineWidth = width; g.stroke(); g.lineWidth = 1;
  }
  const PAD = { l: 70, r: 14, t: 34, b: 40 };
  // Axes, ticks and titles of a plot; returns the mappings.
  function drawAxes(g, w, h, ymax, ytitle) {
    const [v0, v1] = S.view;
    const pw = w - PAD.l - PAD.r, ph = h - PAD.t - PAD.b;
    const X = (x) => PAD.l + ((x - v0) / (v1 - v0)) * pw;
    const yt = byteTicks(ymax, Math.max(2, Math.floor(ph / 45)));
    const Y = (y) => PAD.t + ph - (y / yt.top) * ph;
    g.strokeStyle = "#e6e9ef"; g.fillStyle = "#5b6475"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
    g.textAlign = "right"; g.textBaseline = "middle";
    for (const t of yt.ticks) {
      const y = Math.round(Y(t.v)) + 0.5;
      g.beginPath(); g.moveTo(PAD.l, y); g.lineTo(w - PAD.r, y); g.stroke();
      g.fillText(t.label, PAD.l - 5, y);
    }
    const xt = xTicks(v0, v1, Math.max(2, Math.floor(pw / 110)));
    g.textAlign = "center"; g.textBaseline = "top";
    for (const t of xt.ticks) {
      const x = Math.round(X(t.x)) + 0.5;
      g.strokeStyle = "#c3c8d2"; g.beginPath(); g.moveTo(x, PAD.t + ph); g.lineTo(x, PAD.t + ph + 4); g.stroke();
      g.fillText(t.label, x, PAD.t + ph + 6);
    }
    g.fillStyle = "#1d2330"; g.font = "12px system-ui, sans-serif";
    g.fillText(xt.title, PAD.l + pw / 2, h - 15);
    g.canvas.dataset.xtitle = xt.title;
    g.save(); g.translate(13, PAD.t + ph / 2); g.rotate(-Math.PI / 2); g.textBaseline = "middle"; g.fillText(ytitle + " (" + yt.unit + ")", 0, 0); g.restore();
    g.strokeStyle = "#8a94a6"; g.beginPath(); g.moveTo(PAD.l + 0.5, PAD.t); g.lineTo(PAD.l + 0.5, PAD.t + ph); g.lineTo(w - PAD.r, PAD.t + ph + 0.5); g.stroke();
    g.textBaseline = "alphabetic"; g.font = "11px system-ui, sans-serif";
    return { X, Y, pw, ph, top: yt.top };
  }
  // Labels at the top of a plot, each next to its x, in as many rows as it takes for none to
  // overlap another.
  function placeLabels(g, labels, xmin, xmax, y0) {
    const rows = [];
    labels.sort((a, b) => a.x - b.x);
    g.font = "11px system-ui, sans-serif";
    for (const l of labels) {
      const wd = g.measureText(l.text).width + 6;
      let x0 = l.x + 3;
      if (x0 + wd > xmax) x0 = l.x - 3 - wd;
      if (x0 < xmin) x0 = xmin;
      let r = 0;
      while (r < rows.length && rows[r].some(([a, b]) => x0 < b && x0 + wd > a)) r++;
      if (r === rows.length) rows.push([]);
      rows[r].push([x0, x0 + wd]);
      const y = y0 + r * 14;
      g.fillStyle = "rgba(255,255,255,0.85)"; g.fillRect(x0, y - 10, wd, 13);
      g.fillStyle = l.colour; g.textAlign = "left"; g.fillText(l.text, x0 + 3, y);
      g.strokeStyle = l.colour; g.setLineDash([1, 2]); g.beginPath(); g.moveTo(l.x + 0.5, y + 3); g.lineTo(l.x + 0.5, l.yTo); g.stroke(); g.setLineDash([]);
    }
  }
  function drawTimeline() {
    const c = $("timeline");
    const { g, w, h } = dprCanvas(c);
    const d = dev(), xs = TL.xs, [v0, v1] = S.view;
    g.clearRect(0, 0, w, h);
    g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
    const pw0 = w - PAD.l - PAD.r, ph0 = h - PAD.t - PAD.b;
    const X0 = (x) => PAD.l + ((x - v0) / (v1 - v0)) * pw0;
    // phase bands: iterations alternate as the background (labelled by their step), other phases
    // as a labelled strip above the plot
    let it = 0;
    g.font = "10px system-ui, sans-serif"; g.textBaseline = "middle";
    const stripY = 4, stripH = 13;
    for (const p of d.phases) {
      if (p.last_event < p.first_event) continue;
      const xa = X0(timeXOf(p.first_event, p.start_us)), xb = X0(timeXOf(p.last_event, p.end_us));
      if (xb < PAD.l || xa > w - PAD.r) { if (p.kind === "iteration") it++; continue; }
      const a = Math.max(PAD.l, xa), b = Math.min(xb, w - PAD.r);
      if (p.kind === "iteration") {
        if (it % 2 === 0) { g.fillStyle = PHASE_COLOURS.iteration; g.fillRect(a, PAD.t, b - a, ph0); }
        const label = p.name || "step " + (it + 1);
        if (b - a > g.measureText(label).width + 6) { g.fillStyle = "#6b7a99"; g.textAlign = "left"; g.fillText(label, a + 3, PAD.t + ph0 - 8); }
        it++;
      } else {
        g.fillStyle = PHASE_COLOURS[p.kind] || PHASE_COLOURS.other;
        g.fillRect(a, stripY, Math.max(1, b - a), stripH);
        const label = p.name || p.kind;
        if (b - a > g.measureText(label).width + 6) { g.fillStyle = "#1d2330"; g.textAlign = "left"; g.fillText(label, a + 3, stripY + stripH / 2); }
      }
    }
    g.textBaseline = "alphabetic";
    const i0 = Math.max(0, lowerBound(xs, v0) - 1), i1 = Math.min(xs.length, lowerBound(xs, v1) + 1);
    // Zoomed in, the byte axis fits what is in view (the card's memory too when it is near).
    let ymax = TL.ymax;
    if (v0 > TL.lo || v1 < TL.hi) {
      let top = 1;
      for (const s of SERIES) { const ys = d.points[s.key]; for (let i = i0; i < i1; i++) if (ys[i] > top) top = ys[i]; }
      if (TL.capOnScale && TL.cap <= top * 1.6) top = Math.max(top, TL.cap);
      ymax = Math.min(TL.ymax, top * 1.04);
    }
    c.dataset.ymax = String(ymax);
    c.dataset.axis = timeAxis() ? "time" : "event";
    const { X, Y, pw, ph } = drawAxes(g, w, h, ymax, "bytes");
    // series (step lines over the kept points)
    g.save();
    g.beginPath(); g.rect(PAD.l, PAD.t - 2, pw, ph + 2); g.clip();
    if (i1 > i0) for (const s of SERIES) drawSteps(g, xs, d.points[s.key], i0, i1, X, Y, s, 1.4);
    // the card's memory
    if (TL.cap && TL.capOnScale) {
      const y = Math.round(Y(TL.cap)) + 0.5;
      g.strokeStyle = "#111"; g.lineWidth = 1.5; g.beginPath(); g.moveTo(PAD.l, y); g.lineTo(w - PAD.r, y); g.stroke(); g.lineWidth = 1;
      g.fillStyle = "#111"; g.textAlign = "left"; g.fillText("card's memory " + fmtBytes(TL.cap), PAD.l + 4, y - 4);
    }
    // markers: peaks and OOMs, labelled without overlap; the block map's moment
    const labels = [];
    const pk = d.peaks;
    for (const [label, p, colour] of [["reserved peak", pk.reserved, "#5b6475"], ["requested peak", pk.requested, "#15803d"]]) {
      if (p.event < -1) continue;
      const x = X(timeXOf(p.event, p.time_us));
      g.setLineDash([4, 3]); g.strokeStyle = colour; g.beginPath(); g.moveTo(x, Y(p.bytes)); g.lineTo(x, PAD.t + ph); g.stroke(); g.setLineDash([]);
      if (x >= PAD.l && x <= w - PAD.r) labels.push({ x, text: label + " " + fmtBytes(p.bytes), colour, yTo: Y(p.bytes) });
    }
    d.ooms.forEach((o, i) => {
      const x = Math.round(X(timeXOf(o.event, o.time_us))) + 0.5;
      if (x < PAD.l - 1 || x > w - PAD.r + 1) return;
      g.strokeStyle = OOM_COLOUR; g.lineWidth = 2.5; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke(); g.lineWidth = 1;
      g.fillStyle = OOM_COLOUR; g.beginPath(); g.moveTo(x, PAD.t + ph - 10); g.lineTo(x - 6, PAD.t + ph); g.lineTo(x + 6, PAD.t + ph); g.closePath(); g.fill();
      if (i < 8) labels.push({ x, text: "OOM" + (d.ooms.length > 1 ? " " + (i + 1) : "") + ": " + fmtBytes(o.request_bytes) + " request", colour: OOM_COLOUR, yTo: PAD.t + ph });
    });
    // below the card's memory line, so its label stays readable
    placeLabels(g, labels, PAD.l, w - PAD.r, Math.max(PAD.t + 12, TL.cap && TL.capOnScale ? Y(TL.cap) + 14 : 0));
    const me = shownMoment();
    if (me) {
      const x = X(timeXOf(me.ev, me.t));
      g.strokeStyle = "#1d2330"; g.lineWidth = 2; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke(); g.lineWidth = 1;
    }
    if (S.hoverX !== null) {
      g.strokeStyle = "rgba(29,35,48,0.35)"; g.beginPath(); g.moveTo(S.hoverX, PAD.t); g.lineTo(S.hoverX, PAD.t + ph); g.stroke();
    }
    g.restore();
  }
  function xToValue(c, px) {
    const w = c.getBoundingClientRect().width;
    const pw = w - PAD.l - PAD.r, [v0, v1] = S.view;
    return v0 + ((px - PAD.l) / pw) * (v1 - v0);
  }
  function pointIndexAt(c, px) {
    const v = xToValue(c, px), xs = TL.xs;
    let i = lowerBound(xs, v);
    if (i >= xs.length) i = xs.length - 1;
    // the nearer point; of points at one x (the start state and the first event share a time)
    // the later one once the pointer is at or past it
    if (i > 0 && (xs[i - 1] === xs[i] ? v < xs[i] : Math.abs(xs[i - 1] - v) <= Math.abs(xs[i] - v))) i--;
    return Math.max(0, i);
  }
  function timelineReadout(i) {
    const d = dev(), p = d.points;
    if (!p.event.length) return;
    const ev = p.event[i];
    let s = evWhen(ev, d.has_times ? p.time_us[i] : null);
    for (const se of SERIES) s += "   " + se.label + " " + fmtBytes(p[se.key][i]);
    const ph = d.phases.filter((x) => x.first_event <= ev && ev <= x.last_event).map((x) => x.name);
    if (ph.length) s += "   in " + ph.join(" › ");
    $("timeline-readout").textContent = s;
  }
  function redrawTime() { drawTimeline(); drawAllocations(); }
  // Wheel zoom, drag pan, double-click reset, click: the moment; shared by the timeline and the
  // allocation view, which show the same x range.
  function installPlot(c, onHover, onClick) {
    let drag = null;
    c.addEventListener("mousemove", (e) => { if (!dev()) return;
      const r = c.getBoundingClientRect(), px = e.clientX - r.left;
      if (drag) {
        const pw = r.width - PAD.l - PAD.r, dv = ((px - drag.px) / pw) * (drag.view[1] - drag.view[0]);
        if (Math.abs(px - drag.px) > 3) drag.moved = true;
        S.view = [drag.view[0] - dv, drag.view[1] - dv];
      }
      S.hoverX = px;
      onHover(px, e.clientY - r.top);
      redrawTime();
    });
    c.addEventListener("mouseleave", () => { if (!dev()) return; S.hoverX = null; drag = null; redrawTime(); });
    c.addEventListener("mousedown", (e) => { if (!dev()) return; const r = c.getBoundingClientRect(); drag = { px: e.clientX - r.left, view: S.view.slice(), moved: false }; });
    c.addEventListener("mouseup", (e) => { if (!dev()) return;
      const moved = drag && drag.moved;
      drag = null;
      if (moved || !TL.xs.length) return;
      const r = c.getBoundingClientRect();
      onClick(e.clientX - r.left, e.clientY - r.top);
    });
    c.addEventListener("wheel", (e) => { if (!dev()) return;
      e.preventDefault();
      const r = c.getBoundingClientRect(), v = xToValue(c, e.clientX - r.left);
      const f = e.deltaY > 0 ? 1.25 : 0.8, [v0, v1] = S.view;
      let a = v - (v - v0) * f, b = v + (v1 - v) * f;
      if (b - a < 1e-6) return;
      if (b - a > TL.hi - TL.lo) { a = TL.lo; b = TL.hi; }
      S.view = [a, b];
      redrawTime();
    }, { passive: false });
    c.addEventListener("dblclick", () => { if (!dev()) return; S.view = [TL.lo, TL.hi]; redrawTime(); });
  }
  function installTimeline() {
    const c = $("timeline");
    $("axis").addEventListener("change", () => {
      if (!dev()) return;
      S.axis = $("axis").value;
      prepTimeline();
      prepAllocations();
      drawMini();
      redrawTime();
    });
    installPlot(c, (px) => { if (TL.xs.length) timelineReadout(pointIndexAt(c, px)); },
      (px) => gotoEvent(dev().points.event[pointIndexAt(c, px)]));
    $("timeline-reset").addEventListener("click", () => { if (!dev()) return; S.view = [TL.lo, TL.hi]; redrawTime(); });
  }

  // ---------- allocation view: viz/allocations.js ----------
  const ALLOCATIONS = window.memfParts.allocations({ $, CATEGORY_HUES, D, OOM_COLOUR, PAD, S, byteTicks, dev, dprCanvas, drawAxes, drawn, el, evWhen, exact, fmtBytes, frameText, gotoEvent, installPlot, lowerBound, pointIndexAt, shownMoment, timeAxis, timeXOf, xOfEvent, xToValue, TL: () => TL });
  const { drawAllocations, installAllocations, prepAllocations } = ALLOCATIONS;
  // ---------- event stepping ----------
  // The layout after any event of the device's stepping window: the base with the event's patch
  // and every one before it applied (src/report/html/stepping_view.h; the C++ StepMirror is the
  // same rule and checked it against the allocator model). A patch replaces the blocks starting
  // in [lo, hi). Checkpoints every 256 events keep a jump cheap.
  let ST = null;
  const STEP_CP = 256;
  function stepOf(d) { const s = d && d.stepping; return s && s.patches ? s : null; }
  function decodeRecords(r) {
    if (!r.length) return null;
    const blocks = [];
    let at = r[0], i = 2;
    while (i < r.length) {
      const c = r[i];
      if (c === 64) { at += r[i + 1]; i += 2; continue; }
      const b = { a: at, size: r[i + 1], code: c, seg: r[i + 2], req: 0, stack: -1, ev: -1 };
      if (c & 3) { b.req = r[i + 3]; b.stack = r[i + 4]; b.ev = r[i + 5]; i += 6; } else i += 3;
      blocks.push(b);
      at += b.size;
    }
    return { lo: r[0], hi: r[0] + r[1], blocks };
  }
  function blockIndexAt(state, addr) {  // the first block at or after addr
    let lo = 0, hi = state.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (state[m].a < addr) lo = m + 1; else hi = m; }
    return lo;
  }
  function applyPatch(state, p) {
    if (!p) return state;
    return state.slice(0, blockIndexAt(state, p.lo)).concat(p.blocks, state.slice(blockIndexAt(state, p.hi)));
  }
  function prepStepping() {
    const st = stepOf(dev());
    ST = st ? { st, cps: [decodeRecords(st.base) ? decodeRecords(st.base).blocks : []], patches: new Array(st.patches.length) } : null;
  }
  function patchAt(i) {
    if (ST.patches[i] === undefined) ST.patches[i] = decodeRecords(ST.st.patches[i]);
    return ST.patches[i];
  }
  function inWindow(ev) { return !!ST && ev >= ST.st.first && ev <= ST.st.last; }
  function stateAfter(ev) {  // ev in the window
    const n = ev - ST.st.first + 1;  // patches applied
    const j = Math.floor(n / STEP_CP);
    while (ST.cps.length <= j) {
      const k = ST.cps.length;
      let s = ST.cps[k - 1];
      for (let i = (k - 1) * STEP_CP; i < k * STEP_CP; i++) s = applyPatch(s, patchAt(i));
      ST.cps.push(s);
    }
    let s = ST.cps[j];
    for (let i = j * STEP_CP; i < n; i++) s = applyPatch(s, patchAt(i));
    return s;
  }
  // The stepped state as decodeKeyframe's shape: a drawn segment is a run of contiguous blocks of
  // one reservation (an expandable one shows a segment per mapped range, as the file does).
  function bmOfState(state) {
    const st = ST.st, pools = dev().pool_names;
    const start = [], size = [], code = [], req = [], stack = [], ev = [], count = [], free = [], pend = [], seg = [], addr = [];
    const segs = [], segStart = [];
    const sums = { reserved: 0, allocated: 0, pending: 0 };
    let pos = 0, prevEnd = -1, prevSeg = -1;
    for (const b of state) {
      if (b.seg !== prevSeg || b.a !== prevEnd) {
        const r = 4 * b.seg;
        segs.push({ address: b.a, size: 0, stream: st.segments[r + 1], pool: pools[st.segments[r + 2]], expandable: st.segments[r + 3] === 1, reservation: st.segments[r] });
        segStart.push(pos);
      }
      segs[segs.length - 1].size += b.size;
      start.push(pos); size.push(b.size); code.push(b.code); req.push(b.req); stack.push(b.stack); ev.push(b.ev);
      count.push(1); free.push(0); pend.push(0); seg.push(segs.length - 1); addr.push(b.a);
      pos += b.size;
      sums.reserved += b.size;
      if ((b.code & 3) === 1) sums.allocated += b.size;
      if ((b.code & 3) === 2) sums.pending += b.size;
      prevEnd = b.a + b.size; prevSeg = b.seg;
    }
    return { start, size, code, req, stack, ev, count, free, pend, seg, segs, segStart, total: pos, addr, sums, blocks: state.length };
  }
  function actionName(a) { return D.actions[a] || "unknown"; }
  // The moment the block map shows (the marker of the timeline and the allocation view): the event
  // picked when the stepping window holds it, else the keyframe.
  function shownMoment() {
    const kf = dev().keyframes[S.kf];
    if (!kf) return null;
    const cur = currentEvent();
    return inWindow(cur) && cur !== kf.event ? { ev: cur, t: timeOf(cur, null) } : { ev: kf.event, t: kf.time_us };
  }
  // An event in words: an OOM's address field holds the device's free bytes (format doc).
  function eventWhat(a, addr, sz) {
    const n = actionName(a);
    if (n === "oom") return "oom: " + fmtBytes(sz) + " requested, device free " + fmtBytes(addr);
    return n + (sz ? " " + fmtBytes(sz) : "") + (addr ? " at 0x" + addr.toString(16) : "");
  }
  function topFrame(st) { return st >= 0 && D.stacks[st] && D.stacks[st].length ? frameText(D.frames[D.stacks[st][0]]) : ""; }
  // The event shown: the one picked (timeline, link, list, keys), else the keyframe's.
  function currentEvent() { const k = dev().keyframes[S.kf]; return S.picked !== undefined && S.picked !== null ? S.picked : k ? k.event : -1; }
  function stepEventBy(delta) {
    const d = dev();
    if (!d || !d.keyframes.length) return;
    const cur = currentEvent();
    // Inside the stepping window (and into it from either side); at its edge the keys go on from
    // keyframe to keyframe.
    if (ST) {
      const to = Math.min(ST.st.last, Math.max(ST.st.first, cur + delta));
      if (inWindow(cur + delta) || (inWindow(cur) && to !== cur)) { gotoEvent(to); return; }
    }
    // Outside the window: from keyframe to keyframe.
    const ks = d.keyframes;
    let i = S.kf;
    if (delta > 0) { while (i < ks.length - 1 && ks[i].event <= cur) i++; } else { while (i > 0 && ks[i].event >= cur) i--; }
    if (ks[i].event !== cur) gotoEvent(ks[i].event);
  }
  function renderEventList() {
    const box = $("event-list"), cap = $("event-list-caption"), d = dev();
    box.textContent = "";
    $("event-stack").textContent = "";
    const st = ST && ST.st;
    const events = devA().events;
    if (!st && !events) {
      cap.textContent = "No events: the file has no allocation history for cuda:" + devA().device + ", only its state at the end.";
      delete box.dataset.first;
      delete box.dataset.last;
      return;
    }
    if (!st) {
      const why = d && d.stepping && d.stepping.unavailable;
      cap.textContent = d.has_segment_info === false ? "No event stepping: " + noSegmentsWhy() + "." :
        "No event stepping for cuda:" + devA().device + (why ? ": " + why : "") + ". The arrow keys move between the precomputed moments.";
      delete box.dataset.first;
      delete box.dataset.last;
      return;
    }
    const cur = currentEvent();
    box.dataset.first = String(st.first);
    box.dataset.last = String(st.last);
    const whole = st.first === 0 && st.last === events - 1;
    cap.textContent = whole ? "Every event of cuda:" + devA().device + " (" + events.toLocaleString("en-US") + ") can be shown exactly." :
      "Events " + st.first.toLocaleString("en-US") + "–" + st.last.toLocaleString("en-US") + " of " + events.toLocaleString("en-US") +
      " can be shown exactly (a window around " + evWhen(st.focus) + ", bounded by the page's size; `memforensics blocks FILE --at EVENT` gives any other)." +
      (inWindow(cur) ? "" : " The moment shown is outside it.");
    const mid = inWindow(cur) ? cur : cur < st.first ? st.first : st.last;
    const from = Math.max(st.first, mid - 10), to = Math.min(st.last, from + 20);
    for (let e = Math.max(st.first, to - 20); e <= to; e++) {
      const i = e - st.first, a = st.events[4 * i], sz = st.events[4 * i + 2], sk = st.events[4 * i + 3];
      const addr = st.events[4 * i + 1];
      const t = st.times ? st.times[i] : null;
      const row = el("div", { cls: "ev-row" + (e === cur ? " current" : "") + (actionName(a) === "oom" ? " oom" : ""), role: "option", "data-event": String(e) },
        el("span", { text: "#" + e }), el("span", { text: t !== null && t >= 0 ? fmtRel(t) : "" }), el("span", { text: actionName(a) }),
        el("span", { text: fmtBytes(sz) }), el("span", { text: actionName(a) === "oom" ? "free " + fmtBytes(addr) : addr ? "0x" + addr.toString(16) : "" }), el("span", { text: topFrame(sk) }));
      if (e === cur) row.setAttribute("aria-selected", "true");
      row.title = sk >= 0 && D.stacks[sk] ? D.stacks[sk].map((f) => frameText(D.frames[f])).join("\n") : "no stack";
      row.addEventListener("click", () => gotoEvent(e));
      box.append(row);
    }
    if (inWindow(cur)) {
      const i = cur - st.first, sk = st.events[4 * i + 3];
      const es = $("event-stack");
      if (sk >= 0 && D.stacks[sk]) {
        es.append(el("div", { text: "Event " + cur + " (" + actionName(st.events[4 * i]) + ") from (innermost first):" }));
        const ol = el("ol");
        for (const f of D.stacks[sk]) ol.append(el("li", { text: frameText(D.frames[f]) }));
        es.append(ol);
      }
      const curRow = box.querySelector(".current");
      if (curRow) box.scrollTop = curRow.offsetTop - box.clientHeight / 2;
    }
  }
  function installStepping() {
    document.addEventListener("keydown", (e) => {
      if (!dev() || e.altKey || e.ctrlKey || e.metaKey) return;
      const t = e.target, tag = t && t.tagName;
      if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA") return;
      const list = t === $("event-list");
      let delta = 0;
      if (e.key === "ArrowRight" || (list && e.key === "ArrowDown")) delta = 1;
      else if (e.key === "ArrowLeft" || (list && e.key === "ArrowUp")) delta = -1;
      if (!delta) return;
      e.preventDefault();
      stepEventBy(e.shiftKey ? 10 * delta : delta);
    });
  }

  // ---------- block map ----------
  function nearestKeyframe(ev) {
    const ks = dev().keyframes;
    let best = 0;
    for (let i = 1; i < ks.length; i++) if (Math.abs(ks[i].event - ev) < Math.abs(ks[best].event - ev)) best = i;
    return best;
  }
  // A moment picked anywhere (timeline, allocation view, evidence link): every view follows.
  function gotoEvent(ev) {
    if (!dev().keyframes.length) return;
    S.kf = nearestKeyframe(ev);
    S.picked = ev;
    S.block = null;
    momentChanged();
  }
  function momentChanged() {
    renderBlockmap();
    renderEventList();
    redrawTime();
    selectIcicle();
    drawIcicle();
  }
  function kfLabel(k) {
    let s = k.event < 0 ? "the start" : "after " + evWhen(k.event, k.time_us);
    if (k.labels.length) s += " — " + k.labels.join(", ");
    return s;
  }
  // Decoded blocks of the current keyframe: flat arrays for drawing and hit tests.
  // ---------- block map: viz/blockmap.js ----------
  const BLOCKMAP = window.memfParts.blockmap({ $, CATEGORY_COLOURS, D, OOM_COLOUR, S, STATE_COLOURS, STATE_NAMES, actionName, bmOfState, currentEvent, dev, devA, dprCanvas, el, evWhen, eventWhat, exact, fmtBytes, frameText, inWindow, kfLabel, lowerBound, momentChanged, noSegmentsWhy, stateAfter, ST: () => ST });
  const { drawBlockmap, installBlockmap, renderBlockmap } = BLOCKMAP;
  function fillKeyframes() {
    const sel = $("keyframe"), d = dev();
    sel.textContent = "";
    d.keyframes.forEach((k, i) => sel.append(el("option", { value: String(i), text: kfLabel(k) })));
  }

  // ---------- icicle: viz/icicle.js ----------
  const ICICLE = window.memfParts.icicle({ $, D, S, dev, dprCanvas, evWhen, exact, fmtBytes, frameText, kfLabel, knownLine });
  const { drawIcicle, installIcicle, selectIcicle } = ICICLE;
  // ---------- wiring ----------
  function placeholder(id, text) {
    const { g, w, h } = dprCanvas($(id));
    g.clearRect(0, 0, w, h); g.fillStyle = "#f6f7f9"; g.fillRect(0, 0, w, h);
    g.fillStyle = "#5b6475"; g.font = "13px system-ui, sans-serif"; g.fillText(text, 12, 24);
  }
  function selectDevice() {
    prepTimes();
    renderHeadline();
    renderDevices();
    renderSummary();
    renderFindings();
    const d = dev();
    document.body.dataset.detail = d ? "1" : "0";
    document.body.dataset.device = String(devA().device);
    // No chart without data: a device with no trace entries has its state at the end only (the
    // block map and call tree show it); its timeline and allocation view say what is missing.
    // Reset for every device, drawn or not, so no note of another device stays behind.
    const empty = !!d && noHistory();
    for (const [sec, note, what] of [["timeline-section", "timeline-empty", "No timeline"], ["allocations-section", "allocations-empty", "No allocations over time"]]) {
      $(sec).classList.toggle("no-data", empty);
      $(note).hidden = !empty;
      $(note).textContent = empty ? what + " for cuda:" + devA().device + ": the file has no allocation history for this device (no trace entries), " +
        "only its state at the end, shown in the block map and the call tree. To record one, call " +
        "torch.cuda.memory._record_memory_history(max_entries=100000) before the model is built and " +
        "torch.cuda.memory._dump_snapshot(path) after the steps of interest." : "";
    }
    $("axis-pick").hidden = !d || !d.has_times;
    // Segments over time need the allocator's segments (not in torch.profiler traces).
    const segOpt = $("alloc-mode").querySelector("option[value=segments]");
    segOpt.disabled = !d || d.has_segment_info === false;
    if (segOpt.disabled && S.allocMode === "segments") { S.allocMode = "allocations"; $("alloc-mode").value = "allocations"; }
    delete $("blockmap").dataset.device;
    delete $("blockmap").dataset.event;
    if (!d) {
      const why = "cuda:" + devA().device + " is not drawn in this report (see the summary); memforensics report --device " + devA().device + " draws it.";
      TL = null; BLOCKMAP.reset(); ICICLE.reset(); ALLOCATIONS.reset(); ST = null;
      $("event-list").textContent = "";
      $("event-stack").textContent = "";
      $("event-list-caption").textContent = why;
      $("blockmap-oom").hidden = true;
      $("keyframe").textContent = "";
      $("blockmap-caption").textContent = why;
      $("allocations-caption").textContent = why;
      $("blockmap").hidden = false;
      $("blockmap").style.display = "";
      delete $("blockmap-caption").dataset.event;
      for (const id of ["timeline", "allocations", "blockmap", "icicle"]) placeholder(id, why);
      return;
    }
    prepTimeline();
    drawMini();
    prepStepping();
    prepAllocations();
    fillKeyframes();
    // The block map opens at the device's first OOM when it has one, else at the requested peak.
    const oomKf = d.keyframes.findIndex((k) => k.labels.includes("OOM 1"));
    const peakKf = d.keyframes.findIndex((k) => k.labels.includes("requested peak"));
    S.kf = oomKf >= 0 ? oomKf : peakKf >= 0 ? peakKf : 0;
    S.picked = null;
    S.block = null;
    S.zoom = null;
    S.alloc = -1;
    $("allocation-stack").textContent = "";
    ICICLE.reset();
    momentChanged();
  }
  // ---------- links to a moment ----------
  // The page reads #device=N&event=K, or #device=N&t=1.442s (105.1ms, 250us: the time since the
  // device's first event, as every view prints it), and shows that moment everywhere (the
  // nearest precomputed one in the block map, said in its caption).
  // The bound (µs since the first event) of the moments a printed time names, and whether the
  // bound is inclusive: a rounded figure names its whole rounding interval (5.759ms is
  // [5.7585, 5.7595) ms), a whole number itself (the rule of `blocks --at t+...`).
  function parseRelTime(s) {
    const m = /^\+?(\d+)(?:\.(\d+))?\s*(s|ms|us|µs)$/.exec(s.trim());
    if (!m) return null;
    const scale = m[3] === "s" ? 1e6 : m[3] === "ms" ? 1e3 : 1;
    const v = Number(m[1] + (m[2] ? "." + m[2] : "")) * scale;
    return m[2] ? { bound: v + 0.5 * Math.pow(10, -m[2].length) * scale, inclusive: false } : { bound: v, inclusive: true };
  }
  function applyHash() {
    const q = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (q.has("device")) {  // a device the page does not have: the whole link is ignored
      const i = /^\d{1,9}$/.test(q.get("device")) ? indexOfDevice(Number(q.get("device"))) : -1;
      if (i < 0) return;
      if (i !== S.dev) switchDevice(i);
    }
    const d = dev();
    if (!d || !d.keyframes.length) return;
    let ev = null;
    if (q.has("event")) {  // an event of the device, or -1 (the start)
      const e = /^-?\d{1,15}$/.test(q.get("event")) ? Number(q.get("event")) : NaN;
      if (!(e >= -1 && e < devA().events)) return;
      ev = e;
    } else if (q.has("t") && d.has_times && TIME.unit) {
      const rel = parseRelTime(q.get("t"));
      if (rel !== null) {  // the last kept timeline point within that bound
        const x = TIME.base + rel.bound, ts = pointTimes(d);
        let i = lowerBound(ts, x) - 1;
        if (rel.inclusive) while (i + 1 < ts.length && ts[i + 1] <= x) i++;
        ev = i >= 0 ? d.points.event[i] : -1;
      }
    }
    if (ev !== null) gotoEvent(ev);
  }
  function installMomentLink() {
    $("moment-link").addEventListener("click", () => {
      const d = dev();
      if (!d || !d.keyframes.length) return;
      const k = d.keyframes[S.kf], ev = S.picked !== undefined && S.picked !== null ? S.picked : k.event;
      const hash = "#device=" + devA().device + "&event=" + ev;
      history.replaceState(null, "", hash);
      const url = location.href;
      const done = (how) => { $("moment-link-status").textContent = how + ": " + url; };
      if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(url).then(() => done("copied"), () => done("in the address bar"));
      else done("in the address bar");
    });
    window.addEventListener("hashchange", applyHash);
  }
  function main() {
    if (!A.devices.length) {
      $("file").textContent = A.path;
      $("facts").append(el("dt", { text: "Devices" }), el("dd", { text: "none: the file has no device with events or segments" }));
      document.body.dataset.ready = "1";
      return;
    }
    // The page opens on the headline's focus device (the OOM's, else the most severe finding's).
    const focus = D.headline ? indexOfDevice(D.headline.focus_device) : -1;
    S.dev = focus >= 0 ? focus : 0;
    renderHeader();
    installTimeline();
    installAllocations();
    installBlockmap();
    installIcicle();
    installMomentLink();
    installStepping();
    selectDevice();
    applyHash();
    window.addEventListener("resize", () => { if (dev()) { redrawTime(); drawMini(); if (BLOCKMAP.ready()) drawBlockmap(); drawIcicle(); } });
    document.body.dataset.ready = "1";
  }
  main();
})();
