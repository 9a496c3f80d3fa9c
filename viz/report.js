// report.js: draws the memforensics report from the JSON document embedded in the page.
// Every string from the snapshot reaches the DOM through textContent or canvas text, never as HTML.
"use strict";
(function () {
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
  function fmtTimeUs(us, base) {
    if (us === null || us === undefined || us < 0) return "";
    const d = us - base;
    if (Math.abs(d) < 1000) return "+" + d + " µs";
    if (Math.abs(d) < 1e6) return "+" + (d / 1000).toFixed(3) + " ms";
    return "+" + (d / 1e6).toFixed(3) + " s";
  }
  function frameText(f) {
    if (Array.isArray(f)) return f[0] + ":" + f[2] + " " + f[1];
    return f.filename + ":" + f.line + " " + f.name;
  }
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

  const SERIES = [
    { key: "reserved", label: "reserved", colour: "#8a94a6", fill: "rgba(138,148,166,0.18)" },
    { key: "allocated", label: "allocated", colour: "#2f6fd6" },
    { key: "requested", label: "requested", colour: "#16a34a" },
    { key: "pending", label: "pending free", colour: "#e08600" },
  ];
  const STATE_COLOURS = ["#e3e6eb", "#2f6fd6", "#e08600"];  // free, allocated, pending free
  const STATE_NAMES = ["free", "allocated", "pending free"];
  const CATEGORY_COLOURS = ["#7c3aed", "#db2777", "#2563eb", "#0d9488", "#f59e0b", "#64748b"];
  const PHASE_COLOURS = { iteration: "rgba(47,111,214,0.06)", forward: "rgba(22,163,74,0.35)",
    backward: "rgba(219,39,119,0.35)", optimizer: "rgba(245,158,11,0.45)", other: "rgba(100,116,139,0.25)" };

  // ---------- state ----------
  const S = { dev: 0, kf: 0, colourBy: "state", view: null, hoverX: null, block: null, icicleRoot: 0, search: "" };
  // S.dev indexes analysis devices (all of them); drawings exist for D.devices (maybe fewer).
  const drawn = new Map(D.devices.map((d) => [d.device, d]));
  const devA = () => A.devices[S.dev];
  const dev = () => drawn.get(devA().device);

  // ---------- summary ----------
  function renderHeader() {
    $("file").textContent = A.path;
    document.title = "memforensics: " + A.path;
    const sel = $("device");
    sel.textContent = "";
    A.devices.forEach((d, i) => sel.append(el("option", { value: String(i), text: "cuda:" + d.device + (drawn.has(d.device) ? "" : " (summary only)") })));
    sel.value = String(S.dev);
    sel.addEventListener("change", () => { S.dev = Number(sel.value); selectDevice(); });
  }

  function stat(key, label, bytes, note) {
    const box = el("div", { cls: "stat", "data-stat": key, "data-bytes": String(bytes) },
      el("div", { cls: "label", text: label }),
      el("div", { cls: "value", text: fmtBytes(bytes) }),
      el("div", { cls: "exact", text: exact(bytes) + (note ? " · " + note : "") }));
    return box;
  }
  function countStat(key, label, n) {
    return el("div", { cls: "stat", "data-stat": key, "data-value": String(n) },
      el("div", { cls: "label", text: label }), el("div", { cls: "value", text: Number(n).toLocaleString("en-US") }));
  }
  function eventNote(ev, t, base) {
    if (ev === null || ev === undefined) return "";
    return ev < 0 ? "at the start" : "after event " + ev + (t ? " (" + fmtTimeUs(t, base) + ")" : "");
  }

  // Exact only where the allocator model reproduced the whole device (the page never says more).
  function layoutText(d) {
    if (!d) return "not drawn for this device in this report (see below)";
    const m = d.model;
    const counts = "the allocator model predicted " + m.alloc_matches + " of " + m.allocs + " allocations and " +
      m.segment_matches + " of " + m.segment_events + " segment events";
    if (d.layout_exact) return "exact (" + counts + (m.final_compared ? ", and the file's final layout" : "") + ")";
    return "estimate: " + (m.estimate_reason || "the allocator model did not reproduce the trace") + " (" + counts + ")";
  }
  function renderSummary() {
    const a = devA(), d = dev(), inp = A.input;
    const facts = $("facts");
    facts.textContent = "";
    const base = a.first_time_us;
    const span = a.first_time_us !== null && a.last_time_us !== null ? fmtTimeUs(a.last_time_us, a.first_time_us).slice(1) : "no times in the file";
    const rows = [
      ["File", A.path], ["Format", inp.format + (inp.pickle_protocol ? " (protocol " + inp.pickle_protocol + ")" : "") +
        (inp.origin ? (inp.origin.startsWith("live capture") ? ", recorded by " : ", converted from ") + inp.origin : "")],
      ["Size", fmtBytes(inp.bytes)], ["PyTorch era", inp.pytorch_era],
      ["Devices", A.devices.map((x) => "cuda:" + x.device).join(", ")],
      ["Events on this device", Number(a.events).toLocaleString("en-US")], ["Time span", span],
      ["Segments at the end", String(a.segments)],
      ["Block layout", layoutText(d), "layout"],
      ["Replay", a.consistent ? "consistent with the file's final state" :
        "not consistent with the file's final state: not exact here: " + (a.untrusted || []).join(", "), "replay"],
    ];
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
    st.append(stat("peak_reserved_bytes", "Peak reserved", a.peak_reserved_bytes, eventNote(a.peak_reserved_event, a.peak_reserved_time_us, base)));
    st.append(stat("peak_allocated_bytes", "Peak allocated", a.peak_allocated_bytes, eventNote(a.peak_allocated_event, a.peak_allocated_time_us, base)));
    st.append(stat("peak_requested_bytes", "Peak requested", a.peak_requested_bytes, eventNote(a.peak_requested_event, a.peak_requested_time_us, base)));
    st.append(stat("peak_active_bytes", "Peak active", a.peak_active_bytes, eventNote(a.peak_active_event, a.peak_active_time_us, base)));
    st.append(stat("final_reserved_bytes", "Reserved at the end", a.final_reserved_bytes));
    st.append(countStat("oom_count", "OOMs", a.oom_count));
    st.append(countStat("events", "Events", a.events));

    const oo = $("ooms");
    oo.textContent = "";
    if (a.ooms.length) {
      oo.append(el("h3", { text: "Out-of-memory events" }));
      const t = el("table", { cls: "small" }, el("tr", null, el("th", { text: "event" }), el("th", { text: "request" }),
        el("th", { text: "device free" }), el("th", { text: "allocated then" }), el("th", { text: "reserved then" }), el("th", { text: "from" })));
      for (const o of a.ooms) {
        t.append(el("tr", { "data-oom-event": String(o.event) }, el("td", null, eventLink(o.event)), el("td", { text: fmtBytes(o.request_bytes) }),
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
        const first = x.first_event === null || x.first_event === undefined || x.first_event < 0 ? "" : ", first at event " + x.first_event;
        ul.append(el("li", { text: x.severity + ": " + x.description + " (" + x.count + "×" + first + ")" }));
      }
      an.append(ul);
    }
    const caps = $("caps");
    caps.textContent = "";
    for (const c of D.caps) caps.append(el("div", { text: "Shown in part: " + c }));
  }

  function eventLink(ev) {
    if (ev === null || ev === undefined || ev < -1) return el("span", { text: "—" });
    const b = el("button", { cls: "link", type: "button", "data-goto-event": String(ev), text: ev < 0 ? "start" : "event " + ev });
    b.addEventListener("click", () => gotoEvent(ev));
    return b;
  }

  function renderFindings() {
    const ol = $("findings");
    ol.textContent = "";
    const fs = devA().findings;
    if (!fs.length) { ol.append(el("li", { text: "No findings on this device." })); return; }
    for (const f of fs) {
      const li = el("li", { "data-kind": f.kind, "data-severity": f.severity, "data-bytes": String(f.bytes) },
        el("span", { cls: "sev " + f.severity, text: f.severity }), el("span", { cls: "bytes", text: fmtBytes(f.bytes) }),
        el("span", { cls: "finding-title", text: f.title }));
      li.append(el("div", { cls: "fix", text: "Fix: " + f.fix }));
      if (f.where.length) li.append(el("div", { cls: "where", text: "Where: " + f.where.map(frameText).join("  ←  ") }));
      const ev = el("ul", { cls: "evidence" });
      for (const e of f.evidence) {
        const item = el("li", null, e.text + (e.bytes ? ": " + fmtBytes(e.bytes) : ""));
        if (e.event !== null && e.event !== undefined) { item.append(" · "); item.append(eventLink(e.event)); }
        if (e.frames.length) item.append(el("span", { cls: "mono", text: " · " + frameText(e.frames[0]) }));
        ev.append(item);
      }
      li.append(ev, el("div", { cls: "where", text: "Basis: " + f.basis }));
      ol.append(li);
    }
  }

  // ---------- timeline ----------
  function xsOf(d) {
    const p = d.points;
    if (!d.has_times || !p.time_us) return p.event.slice();
    const first = p.time_us.find((t) => t >= 0);
    return p.time_us.map((t) => (t >= 0 ? t : first === undefined ? 0 : first));
  }
  let TL = null;  // per device: xs, range
  function prepTimeline() {
    const d = dev();
    const xs = xsOf(d);
    let lo = xs.length ? xs[0] : 0, hi = xs.length ? xs[xs.length - 1] : 1;
    if (hi <= lo) hi = lo + 1;
    let ymax = 1;
    for (const s of SERIES) for (const v of d.points[s.key]) if (v > ymax) ymax = v;
    TL = { xs, lo, hi, ymax, base: d.has_times ? lo : 0 };
    S.view = [lo, hi];
    const lg = $("timeline-legend");
    lg.textContent = "";
    for (const s of SERIES) lg.append(el("span", null, el("i", { style: "background:" + s.colour }), s.label));
    lg.append(el("span", null, el("i", { style: "background:#b3261e" }), "OOM"));
  }
  function xOfEvent(ev) {
    const d = dev();
    if (!d.has_times) return ev;
    // the time of the nearest kept point at or before the event
    const i = Math.max(0, lowerBound(d.points.event, ev + 1) - 1);
    return TL.xs[Math.min(i, TL.xs.length - 1)];
  }
  function timeXOf(ev, t) { return dev().has_times && t !== null && t !== undefined && t >= 0 ? t : xOfEvent(ev); }
  const PAD = { l: 64, r: 12, t: 22, b: 26 };
  function drawTimeline() {
    const c = $("timeline");
    const { g, w, h } = dprCanvas(c);
    const d = dev(), xs = TL.xs, [v0, v1] = S.view;
    const pw = w - PAD.l - PAD.r, ph = h - PAD.t - PAD.b;
    const X = (x) => PAD.l + ((x - v0) / (v1 - v0)) * pw;
    const Y = (y) => PAD.t + ph - (y / TL.ymax) * ph;
    g.clearRect(0, 0, w, h);
    g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
    // phase bands: iterations alternate as the background, other phases as a strip on top
    let it = 0;
    for (const p of d.phases) {
      if (p.last_event < p.first_event) continue;
      const xa = X(timeXOf(p.first_event, p.start_us)), xb = X(timeXOf(p.last_event, p.end_us));
      if (xb < PAD.l || xa > w - PAD.r) { if (p.kind === "iteration") it++; continue; }
      if (p.kind === "iteration") {
        if (it++ % 2 === 0) { g.fillStyle = PHASE_COLOURS.iteration; g.fillRect(Math.max(PAD.l, xa), PAD.t, Math.min(xb, w - PAD.r) - Math.max(PAD.l, xa), ph); }
      } else {
        g.fillStyle = PHASE_COLOURS[p.kind] || PHASE_COLOURS.other;
        g.fillRect(Math.max(PAD.l, xa), PAD.t - 8, Math.max(1, Math.min(xb, w - PAD.r) - Math.max(PAD.l, xa)), 6);
      }
    }
    // axes
    g.strokeStyle = "#d9dde5"; g.fillStyle = "#5b6475"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = PAD.t + (ph * i) / 4;
      g.beginPath(); g.moveTo(PAD.l, y + 0.5); g.lineTo(w - PAD.r, y + 0.5); g.stroke();
      g.textAlign = "right"; g.fillText(fmtBytes(Math.round(TL.ymax * (1 - i / 4))), PAD.l - 4, y + 4);
    }
    g.textAlign = "center";
    for (let i = 0; i <= 5; i++) {
      const x = v0 + ((v1 - v0) * i) / 5;
      const label = d.has_times ? fmtTimeUs(Math.round(x), TL.base) : "event " + Math.round(x);
      g.fillText(label, PAD.l + (pw * i) / 5, h - 8);
    }
    // series (step lines over the kept points)
    g.save();
    g.beginPath(); g.rect(PAD.l, PAD.t - 10, pw, ph + 10); g.clip();
    const i0 = Math.max(0, lowerBound(xs, v0) - 1), i1 = Math.min(xs.length, lowerBound(xs, v1) + 1);
    for (const s of SERIES) {
      const ys = d.points[s.key];
      if (i1 <= i0) break;
      g.beginPath();
      g.moveTo(X(xs[i0]), Y(ys[i0]));
      for (let i = i0 + 1; i < i1; i++) { g.lineTo(X(xs[i]), Y(ys[i - 1])); g.lineTo(X(xs[i]), Y(ys[i])); }
      g.lineTo(X(xs[i1 - 1]) + (i1 === xs.length ? 0 : 0), Y(ys[i1 - 1]));
      if (s.fill) {
        g.save(); g.lineTo(X(xs[i1 - 1]), Y(0)); g.lineTo(X(xs[i0]), Y(0)); g.closePath();
        g.fillStyle = s.fill; g.fill(); g.restore();
        g.beginPath(); g.moveTo(X(xs[i0]), Y(ys[i0]));
        for (let i = i0 + 1; i < i1; i++) { g.lineTo(X(xs[i]), Y(ys[i - 1])); g.lineTo(X(xs[i]), Y(ys[i])); }
      }
      g.strokeStyle = s.colour; g.lineWidth = 1.4; g.stroke();
    }
    // markers: peaks, OOMs, the block map's moment
    const pk = d.peaks;
    const marks = [["reserved peak", pk.reserved, "#8a94a6"], ["requested peak", pk.requested, "#16a34a"]];
    for (const [label, p, colour] of marks) {
      if (p.event < -1) continue;
      const x = X(timeXOf(p.event, p.time_us));
      g.setLineDash([4, 3]); g.strokeStyle = colour; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke(); g.setLineDash([]);
      const right = x > PAD.l + pw * 0.65;  // label on the side with room
      g.fillStyle = colour; g.textAlign = right ? "right" : "left";
      g.fillText(label + " " + fmtBytes(p.bytes), right ? x - 3 : x + 3, Math.max(PAD.t + 10, Y(p.bytes) - 4));
    }
    for (const o of d.ooms) {
      const x = X(timeXOf(o.event, o.time_us));
      g.fillStyle = "#b3261e"; g.beginPath(); g.moveTo(x, PAD.t + ph); g.lineTo(x - 5, PAD.t + ph + 9); g.lineTo(x + 5, PAD.t + ph + 9); g.closePath(); g.fill();
      g.strokeStyle = "rgba(179,38,30,0.6)"; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke();
    }
    const kf = d.keyframes[S.kf];
    if (kf) {
      const x = X(timeXOf(kf.event, kf.time_us));
      g.strokeStyle = "#1d2330"; g.lineWidth = 2; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke(); g.lineWidth = 1;
    }
    if (S.hoverX !== null) {
      g.strokeStyle = "rgba(29,35,48,0.35)"; g.beginPath(); g.moveTo(S.hoverX, PAD.t); g.lineTo(S.hoverX, PAD.t + ph); g.stroke();
    }
    g.restore();
  }
  function xToValue(px) {
    const c = $("timeline"), w = c.getBoundingClientRect().width;
    const pw = w - PAD.l - PAD.r, [v0, v1] = S.view;
    return v0 + ((px - PAD.l) / pw) * (v1 - v0);
  }
  function pointIndexAt(px) {
    const v = xToValue(px), xs = TL.xs;
    let i = lowerBound(xs, v);
    if (i >= xs.length) i = xs.length - 1;
    if (i > 0 && Math.abs(xs[i - 1] - v) <= Math.abs(xs[i] - v)) i--;
    return Math.max(0, i);
  }
  function timelineReadout(i) {
    const d = dev(), p = d.points;
    if (!p.event.length) return;
    const ev = p.event[i];
    let s = (ev < 0 ? "start" : "event " + ev) + (d.has_times && p.time_us[i] >= 0 ? "  " + fmtTimeUs(p.time_us[i], TL.base) : "");
    for (const se of SERIES) s += "   " + se.label + " " + fmtBytes(p[se.key][i]);
    const ph = d.phases.filter((x) => x.first_event <= ev && ev <= x.last_event).map((x) => x.name);
    if (ph.length) s += "   in " + ph.join(" › ");
    $("timeline-readout").textContent = s;
  }
  function installTimeline() {
    const c = $("timeline");
    let drag = null;
    c.addEventListener("mousemove", (e) => { if (!dev()) return;
      const r = c.getBoundingClientRect(), px = e.clientX - r.left;
      if (drag) {
        const pw = r.width - PAD.l - PAD.r, dv = ((px - drag.px) / pw) * (drag.view[1] - drag.view[0]);
        if (Math.abs(px - drag.px) > 3) drag.moved = true;
        S.view = [drag.view[0] - dv, drag.view[1] - dv];
      }
      S.hoverX = px;
      if (TL.xs.length) timelineReadout(pointIndexAt(px));
      drawTimeline();
    });
    c.addEventListener("mouseleave", () => { if (!dev()) return; S.hoverX = null; drag = null; drawTimeline(); });
    c.addEventListener("mousedown", (e) => { if (!dev()) return; const r = c.getBoundingClientRect(); drag = { px: e.clientX - r.left, view: S.view.slice(), moved: false }; });
    c.addEventListener("mouseup", (e) => { if (!dev()) return;
      const moved = drag && drag.moved;
      drag = null;
      if (moved || !TL.xs.length) return;
      const r = c.getBoundingClientRect();
      const i = pointIndexAt(e.clientX - r.left);
      gotoEvent(dev().points.event[i]);
    });
    c.addEventListener("wheel", (e) => { if (!dev()) return;
      e.preventDefault();
      const r = c.getBoundingClientRect(), v = xToValue(e.clientX - r.left);
      const f = e.deltaY > 0 ? 1.25 : 0.8, [v0, v1] = S.view;
      let a = v - (v - v0) * f, b = v + (v1 - v) * f;
      if (b - a < 1e-6) return;
      if (b - a > TL.hi - TL.lo) { a = TL.lo; b = TL.hi; }
      S.view = [a, b];
      drawTimeline();
    }, { passive: false });
    c.addEventListener("dblclick", () => { if (!dev()) return; S.view = [TL.lo, TL.hi]; drawTimeline(); });
    $("timeline-reset").addEventListener("click", () => { if (!dev()) return; S.view = [TL.lo, TL.hi]; drawTimeline(); });
  }

  // ---------- block map ----------
  function nearestKeyframe(ev) {
    const ks = dev().keyframes;
    let best = 0;
    for (let i = 1; i < ks.length; i++) if (Math.abs(ks[i].event - ev) < Math.abs(ks[best].event - ev)) best = i;
    return best;
  }
  function gotoEvent(ev) {
    S.kf = nearestKeyframe(ev);
    S.picked = ev;
    S.block = null;
    renderBlockmap();
    drawTimeline();
  }
  function kfLabel(k, base) {
    let s = k.event < 0 ? "start" : "after event " + k.event;
    if (k.time_us !== null && k.time_us >= 0) s += " (" + fmtTimeUs(k.time_us, base) + ")";
    if (k.labels.length) s += " — " + k.labels.join(", ");
    return s;
  }
  // Decoded blocks of the current keyframe: flat arrays for drawing and hit tests.
  let BM = null;
  function decodeKeyframe(k) {
    const start = [], size = [], code = [], req = [], stack = [], ev = [], count = [], free = [], pend = [], seg = [];
    const segs = [], segStart = [];
    const sg = k.segments, b = k.blocks, pools = dev().pool_names;
    let pos = 0, at = 0;
    for (let j = 0; j < sg.length; j += 6) {
      const si = segs.length;
      segs.push({ address: sg[j], size: sg[j + 1], stream: sg[j + 2], pool: pools[sg[j + 3]], expandable: sg[j + 4] === 1 });
      segStart.push(pos);
      const end = at + sg[j + 5];
      let p = pos;
      for (let i = at; i < end;) {
        const c = b[i + 2];
        start.push(p); size.push(b[i]); req.push(b[i + 1]); code.push(c); seg.push(si);
        p += b[i];
        if (c & 32) { count.push(b[i + 3]); free.push(b[i + 4]); pend.push(b[i + 5]); stack.push(-1); ev.push(-1); i += 6; }
        else { count.push(1); free.push(0); pend.push(0); stack.push(b[i + 3]); ev.push(b[i + 4]); i += 5; }
      }
      at = end;
      pos += sg[j + 1];
    }
    return { start, size, code, req, stack, ev, count, free, pend, seg, segs, segStart, total: pos };
  }
  function blockColour(code) {
    const state = code & 3, cat = (code >> 2) & 7, run = code & 32;
    let col = S.colourBy === "category" && state !== 0 ? CATEGORY_COLOURS[cat] || CATEGORY_COLOURS[5] : STATE_COLOURS[state];
    return { col, run };
  }
  function renderBlockmap() {
    const d = dev(), k = d.keyframes[S.kf];
    const sel = $("keyframe");
    if (sel.value !== String(S.kf)) sel.value = String(S.kf);
    const cap = $("blockmap-caption");
    cap.dataset.event = String(k.event);
    cap.dataset.keyframe = String(S.kf);
    const base = TL ? TL.base : 0;
    let text = "Layout " + kfLabel(k, base) + ": reserved " + fmtBytes(k.at.reserved_bytes) + ", allocated " + fmtBytes(k.at.allocated_bytes) +
      ", pending free " + fmtBytes(k.at.pending_free_bytes) + ", " + k.segments.length / 6 + " segment(s), " + k.blocks_before_merge.toLocaleString("en-US") + " blocks.";
    if (S.picked !== undefined && S.picked !== null && S.picked !== k.event) text += " (nearest precomputed moment to event " + S.picked + ")";
    text += d.layout_exact ? " Exact layout." : " Estimated layout (see Block layout above).";
    cap.textContent = text;
    BM = decodeKeyframe(k);
    drawBlockmap();
    $("block-stack").textContent = "";
    const lg = $("blockmap-legend");
    lg.textContent = "";
    if (S.colourBy === "category") {
      D.categories.forEach((c, i) => lg.append(el("span", null, el("i", { style: "background:" + CATEGORY_COLOURS[i] }), c)));
      lg.append(el("span", null, el("i", { style: "background:" + STATE_COLOURS[0] }), "free"));
    } else {
      STATE_NAMES.forEach((c, i) => lg.append(el("span", null, el("i", { style: "background:" + STATE_COLOURS[i] }), c)));
    }
  }
  const ROW_H = 10, ROW_GAP = 3;
  function bmGeometry(w, h) {
    const rows = Math.max(1, Math.floor((h - 8) / (ROW_H + ROW_GAP)));
    const bpr = Math.max(1, Math.ceil(BM.total / rows));
    return { rows, bpr, left: 4, width: w - 8 };
  }
  function drawBlockmap() {
    const c = $("blockmap");
    const { g, w, h } = dprCanvas(c);
    g.clearRect(0, 0, w, h);
    g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
    if (!BM || BM.total === 0) {
      g.fillStyle = "#5b6475"; g.font = "13px system-ui, sans-serif"; g.fillText("No reserved memory at this moment.", 10, 24);
      return;
    }
    const G = bmGeometry(w, h);
    const span = (from, len, colour, hatch) => {
      let p = from, end = from + len;
      while (p < end) {
        const row = Math.floor(p / G.bpr), rowEnd = (row + 1) * G.bpr, q = Math.min(end, rowEnd);
        const x0 = G.left + ((p - row * G.bpr) / G.bpr) * G.width, x1 = G.left + ((q - row * G.bpr) / G.bpr) * G.width;
        const y = 4 + row * (ROW_H + ROW_GAP);
        g.fillStyle = colour; g.fillRect(x0, y, Math.max(0.6, x1 - x0), ROW_H);
        if (hatch && x1 - x0 > 3) { g.fillStyle = "rgba(255,255,255,0.35)"; g.fillRect(x0, y + ROW_H / 2, x1 - x0, ROW_H / 2); }
        p = q;
      }
    };
    for (let i = 0; i < BM.start.length; i++) {
      const { col, run } = blockColour(BM.code[i]);
      span(BM.start[i], BM.size[i], col, run);
    }
    // segment boundaries
    g.fillStyle = "#1d2330";
    for (const s0 of BM.segStart) {
      const row = Math.floor(s0 / G.bpr), x = G.left + ((s0 - row * G.bpr) / G.bpr) * G.width;
      g.fillRect(x, 2 + row * (ROW_H + ROW_GAP), 1.2, ROW_H + 4);
    }
    if (S.block !== null && S.block < BM.start.length) span(BM.start[S.block], BM.size[S.block], "rgba(0,0,0,0.45)", false);
  }
  function blockAt(px, py) {
    const c = $("blockmap"), r = c.getBoundingClientRect();
    const G = bmGeometry(r.width, r.height);
    const row = Math.floor((py - 4) / (ROW_H + ROW_GAP));
    if (row < 0 || row >= G.rows || px < G.left || px > G.left + G.width) return -1;
    const pos = row * G.bpr + ((px - G.left) / G.width) * G.bpr;
    if (pos >= BM.total) return -1;
    const i = lowerBound(BM.start, pos + 1) - 1;
    return i >= 0 && pos < BM.start[i] + BM.size[i] ? i : -1;
  }
  function blockText(i) {
    const s = BM.segs[BM.seg[i]];
    const code = BM.code[i], state = code & 3;
    const addr = s.address + (BM.start[i] - BM.segStart[BM.seg[i]]);
    let t = "segment 0x" + s.address.toString(16) + " (" + fmtBytes(s.size) + ", " + s.pool + " pool, stream " + s.stream + (s.expandable ? ", expandable" : "") + ")\n";
    if (code & 32) {
      t += BM.count[i] + " small blocks drawn as one run at 0x" + addr.toString(16) + ": " + fmtBytes(BM.size[i]) + " (" + fmtBytes(BM.size[i] - BM.free[i] - BM.pend[i]) +
        " allocated, " + fmtBytes(BM.pend[i]) + " pending free, " + fmtBytes(BM.free[i]) + " free)";
    } else {
      t += "block 0x" + addr.toString(16) + ": " + fmtBytes(BM.size[i]) + " " + STATE_NAMES[state];
      if (state !== 0) t += ", requested " + fmtBytes(BM.req[i]) + ", " + D.categories[(code >> 2) & 7] + " (inferred)" +
        (BM.ev[i] >= 0 ? ", allocated at event " + BM.ev[i] : ", allocated before the trace began");
    }
    return t;
  }
  function showStack(i) {
    const box = $("block-stack");
    box.textContent = "";
    if (i < 0) return;
    const st = BM.stack[i];
    if (BM.code[i] & 32) { box.append(el("div", { text: "A run of small blocks: zoom is not possible here; its blocks have no single stack." })); return; }
    if ((BM.code[i] & 3) === 0) return;
    if (st < 0) { box.append(el("div", { text: "No stack recorded for this block (or the report's stack table is full)." })); return; }
    box.append(el("div", { text: "Allocated from (innermost first):" }));
    const ol = el("ol");
    for (const f of D.stacks[st]) ol.append(el("li", { text: frameText(D.frames[f]) }));
    box.append(ol);
  }
  function installBlockmap() {
    const c = $("blockmap");
    c.addEventListener("mousemove", (e) => { if (!dev()) return;
      const r = c.getBoundingClientRect(), i = blockAt(e.clientX - r.left, e.clientY - r.top);
      $("blockmap-readout").textContent = i >= 0 ? blockText(i) : " ";
    });
    c.addEventListener("click", (e) => { if (!dev()) return;
      const r = c.getBoundingClientRect(), i = blockAt(e.clientX - r.left, e.clientY - r.top);
      S.block = i >= 0 ? i : null;
      drawBlockmap();
      showStack(i);
    });
    $("keyframe").addEventListener("change", () => { if (!dev()) return; S.kf = Number($("keyframe").value); S.picked = null; S.block = null; renderBlockmap(); drawTimeline(); });
    $("colour-by").addEventListener("change", () => { if (!dev()) return; S.colourBy = $("colour-by").value; renderBlockmap(); });
  }
  function fillKeyframes() {
    const sel = $("keyframe"), d = dev();
    sel.textContent = "";
    d.keyframes.forEach((k, i) => sel.append(el("option", { value: String(i), text: kfLabel(k, TL.base) })));
  }

  // ---------- icicle ----------
  let IC = null;
  function prepIcicle() {
    const t = dev().icicle, n = t.bytes.length;
    const kids = Array.from({ length: n }, () => []);
    const depth = new Array(n).fill(0);
    for (let i = 1; i < n; i++) { if (t.parent[i] >= 0) { kids[t.parent[i]].push(i); depth[i] = depth[t.parent[i]] + 1; } }
    for (const k of kids) k.sort((a, b) => t.bytes[b] - t.bytes[a]);
    // Bars read function first, then the file's last two path parts; the read-out has it all.
    const short = (f) => f[1] + "  " + f[0].split("/").slice(-2).join("/") + ":" + f[2];
    const label = (i) => (t.label[String(i)] !== undefined ? t.label[String(i)] : t.frame[i] >= 0 ? frameText(D.frames[t.frame[i]]) : "?");
    const barLabel = (i) => (t.label[String(i)] !== undefined || t.frame[i] < 0 ? label(i) : short(D.frames[t.frame[i]]));
    IC = { t, kids, depth, label, barLabel, rects: [] };
    S.icicleRoot = 0;
  }
  function matches(i) {
    return S.search && IC.label(i).toLowerCase().includes(S.search);
  }
  function drawIcicle() {
    const c = $("icicle");
    const { g, w, h } = dprCanvas(c);
    g.clearRect(0, 0, w, h); g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
    const t = IC.t;
    IC.rects = [];
    if (!t.bytes.length || t.bytes[0] === 0) {
      g.fillStyle = "#5b6475"; g.font = "13px system-ui, sans-serif"; g.fillText("Nothing was live at the requested peak.", 10, 24);
      return;
    }
    const RH = 18, root = S.icicleRoot, d0 = IC.depth[root];
    g.font = "11px system-ui, sans-serif"; g.textBaseline = "middle";
    const draw = (i, x, wd) => {
      const y = (IC.depth[i] - d0) * RH;
      if (y + RH > h || wd < 0.5) return;
      const m = matches(i);
      const hue = (t.frame[i] * 47) % 60;
      g.fillStyle = S.search ? (m ? "#e11d48" : "#d6dae2") : i === root && root !== 0 ? "#94a3b8" : "hsl(" + (20 + hue) + ",85%," + (62 + (IC.depth[i] % 3) * 5) + "%)";
      g.fillRect(x, y, Math.max(0.5, wd - 1), RH - 1);
      if (wd > 40) {
        g.fillStyle = "#1d2330";
        let s = IC.barLabel(i) + " · " + fmtBytes(t.bytes[i]);
        const max = Math.floor((wd - 6) / 6);
        if (s.length > max) s = s.slice(0, Math.max(0, max - 1)) + "…";
        g.fillText(s, x + 3, y + RH / 2);
      }
      IC.rects.push([i, x, y, wd, RH]);
      let cx = x;
      for (const k of IC.kids[i]) { const kw = (t.bytes[k] / t.bytes[i]) * wd; draw(k, cx, kw); cx += kw; }
    };
    draw(root, 0, w);
    // matched bytes: matches with no matching ancestor
    if (S.search) {
      let total = 0;
      const walk = (i, inside) => { const m = matches(i); if (m && !inside) total += t.bytes[i]; for (const k of IC.kids[i]) walk(k, inside || m); };
      walk(0, false);
      $("icicle-match").textContent = fmtBytes(total) + " of " + fmtBytes(t.bytes[0]) + " under matching frames";
      $("icicle-match").dataset.bytes = String(total);
    } else { $("icicle-match").textContent = ""; }
  }
  function icicleAt(px, py) {
    for (let j = IC.rects.length - 1; j >= 0; j--) {
      const [i, x, y, wd, rh] = IC.rects[j];
      if (px >= x && px < x + wd && py >= y && py < y + rh) return i;
    }
    return -1;
  }
  function installIcicle() {
    const c = $("icicle");
    c.addEventListener("mousemove", (e) => { if (!dev()) return;
      const r = c.getBoundingClientRect(), i = icicleAt(e.clientX - r.left, e.clientY - r.top);
      if (i < 0) { $("icicle-readout").textContent = " "; return; }
      const t = IC.t;
      $("icicle-readout").textContent = IC.label(i) + "\n" + fmtBytes(t.bytes[i]) + " (" + exact(t.bytes[i]) + ", " + ((100 * t.bytes[i]) / t.bytes[0]).toFixed(1) +
        "% of live) · self " + fmtBytes(t.self[i]) + " · " + t.blocks[i] + " block(s)";
    });
    c.addEventListener("click", (e) => { if (!dev()) return;
      const r = c.getBoundingClientRect(), i = icicleAt(e.clientX - r.left, e.clientY - r.top);
      if (i < 0) return;
      S.icicleRoot = i === S.icicleRoot ? Math.max(0, IC.t.parent[i]) : i;
      drawIcicle();
    });
    $("icicle-search").addEventListener("input", () => { if (!dev()) return; S.search = $("icicle-search").value.trim().toLowerCase(); drawIcicle(); });
  }

  // ---------- wiring ----------
  function placeholder(id, text) {
    const { g, w, h } = dprCanvas($(id));
    g.clearRect(0, 0, w, h); g.fillStyle = "#f6f7f9"; g.fillRect(0, 0, w, h);
    g.fillStyle = "#5b6475"; g.font = "13px system-ui, sans-serif"; g.fillText(text, 12, 24);
  }
  function selectDevice() {
    renderSummary();
    renderFindings();
    const d = dev();
    document.body.dataset.detail = d ? "1" : "0";
    if (!d) {
      const why = "cuda:" + devA().device + " is not drawn in this report (see the summary); memforensics report --device " + devA().device + " draws it.";
      TL = null; BM = null; IC = null;
      $("keyframe").textContent = "";
      $("blockmap-caption").textContent = why;
      delete $("blockmap-caption").dataset.event;
      for (const id of ["timeline", "blockmap", "icicle"]) placeholder(id, why);
      return;
    }
    prepTimeline();
    fillKeyframes();
    const peakKf = d.keyframes.findIndex((k) => k.labels.includes("requested peak"));
    S.kf = peakKf >= 0 ? peakKf : 0;
    S.picked = null;
    S.block = null;
    renderBlockmap();
    drawTimeline();
    prepIcicle();
    drawIcicle();
  }
  function main() {
    if (!A.devices.length) {
      $("file").textContent = A.path;
      $("facts").append(el("dt", { text: "Devices" }), el("dd", { text: "none: the file has no device with events or segments" }));
      document.body.dataset.ready = "1";
      return;
    }
    renderHeader();
    installTimeline();
    installBlockmap();
    installIcicle();
    selectDevice();
    window.addEventListener("resize", () => { if (dev()) { drawTimeline(); drawBlockmap(); drawIcicle(); } });
    document.body.dataset.ready = "1";
  }
  main();
})();
