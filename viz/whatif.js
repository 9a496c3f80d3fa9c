// whatif.js: the report's what-if panel (report/html/whatif_data.h) and, with `report --baseline`,
// the diff against the baseline run (the document `memforensics diff --json` prints). It reads the
// same embedded JSON as report.js and adds its own sections; every string reaches the DOM as text.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("memf-data").textContent);
  const W = D.whatif, B = D.baseline_diff;
  if (!W && !B) return;
  const { el, fmtBytes, frameText } = window.memfViz;  // report.js, embedded before this script
  const signed = (n) => (n > 0 ? "+" : "") + fmtBytes(n);
  const frames = (fs) => (fs || []).map(frameText).join(" < ") || "(no stack recorded)";
  const main = document.querySelector("main"), nav = document.querySelector("nav");
  let after = document.getElementById("findings-section");
  function addSection(id, title, link) {
    const s = el("section", { id }, el("h2", { text: title }));
    if (after && after.parentNode === main) main.insertBefore(s, after.nextSibling); else main.append(s);
    after = s;
    if (nav) nav.append(" ", el("a", { href: "#" + id, text: link }));
    return s;
  }

  // ---------- what-if ----------
  function renderWhatIf() {
    const s = addSection("whatif-section", "What if: allocator settings and card size", "What if");
    if (!W.present) { s.append(el("p", { cls: "hint", text: W.absent_reason })); return; }
    s.append(el("p", { cls: "caption", text: "Device " + W.device + " (" + W.focus_rule + "): the recorded requests replayed through the caching allocator under each setting. Recorded: peak reserved " +
      fmtBytes(W.recorded_peak_reserved_bytes) + ", " + W.recorded_oom_count + " OOM(s); card " +
      (W.implied_capacity_bytes === null ? "not implied (no OOM)" : fmtBytes(W.implied_capacity_bytes) + " (reserved + device free at the OOM)") + "." }));
    if (!W.complete_history)
      s.append(el("p", { cls: "hint", text: "History incomplete: " + W.start_blocks + " blocks were alive when the trace began; every row is an estimate." }));
    const t = el("table", { cls: "small whatif" });
    t.append(el("tr", null, el("th", { text: "setting" }), el("th", { text: "card" }), el("th", { text: "peak reserved" }),
      el("th", { text: "peak allocated" }), el("th", { text: "OOMs" }), el("th", { text: "answer" }), el("th", { text: "exact / estimate" })));
    for (const r of W.rows) {
      const det = el("details", null, el("summary", { text: r.answer }), el("div", { cls: "hint", text: r.why }),
        el("div", { cls: "mono", text: r.settings }));
      for (const o of r.ooms) {
        det.append(el("div", { cls: "mono", text: (o.recorded ? (o.avoided ? "recorded OOM avoided" : "recorded OOM not avoided") : "new OOM") +
          " at event " + o.event + ": " + fmtBytes(o.requested_bytes) + (o.line ? " at " + o.line : "") + " - " + o.why }));
      }
      if (r.oom_count > r.ooms.length) det.append(el("div", { cls: "hint", text: (r.oom_count - r.ooms.length) + " more OOM(s) not listed" }));
      det.append(el("div", { cls: "mono", text: "memforensics whatif " + W.file + " --device " + W.device + (r.cli ? " " + r.cli : "") }));
      t.append(el("tr", null, el("td", { text: r.label }), el("td", { text: r.capacity_text }),
        el("td", { text: fmtBytes(r.peak_reserved_bytes) }), el("td", { text: fmtBytes(r.peak_allocated_bytes) }),
        el("td", { text: String(r.oom_count) }), el("td", null, det),
        el("td", { text: r.exact ? "exact" : "estimate", title: r.estimate_reason })));
    }
    s.append(t);
    for (const n of W.notes) s.append(el("p", { cls: "hint", text: n }));
    s.append(el("p", { cls: "hint", text: "Limits: " + W.limits + ". At most " + W.max_runs + " simulations; docs/whatif.md." }));
  }

  // ---------- against the baseline run ----------
  function renderBaseline() {
    const s = addSection("baseline-section", "Against the baseline run", "Baseline");
    s.append(el("p", { cls: "caption", text: "base: " + B.base + " · new: " + B.new + " (memforensics diff)" }));
    for (const d of B.devices) {
      s.append(el("h3", { text: "Device " + d.device + (d.in_base ? "" : " (only in this run)") + (d.in_new ? "" : " (only in the baseline)") }));
      if (d.verdict) s.append(el("p", { cls: "verdict", text: d.verdict }));
      const t = el("table", { cls: "small" });
      t.append(el("tr", null, el("th", { text: "" }), el("th", { text: "baseline" }), el("th", { text: "this run" }), el("th", { text: "delta" })));
      for (const k of ["reserved", "requested", "allocated"]) {
        const key = "peak_" + k + "_bytes";
        t.append(el("tr", null, el("td", { text: "peak " + k }), el("td", { text: fmtBytes(d.base[key]) }),
          el("td", { text: fmtBytes(d.new[key]) }), el("td", { text: signed(d.delta[key]) })));
      }
      t.append(el("tr", null, el("td", { text: "OOMs" }), el("td", { text: String(d.base.ooms) }), el("td", { text: String(d.new.ooms) }),
        el("td", { text: (d.delta.ooms > 0 ? "+" : "") + d.delta.ooms })));
      s.append(t);
      const req = (d.peaks || []).find((p) => p.kind === "requested");
      if (req && req.has_live && req.stacks) {
        const list = (title, v) => {
          if (!v.length) return;
          s.append(el("div", { cls: "hint", text: title + " (live at the requested peak):" }));
          const ol = el("ol", { cls: "stack" });
          for (const x of v) ol.append(el("li", null, signed(x.delta_bytes) + "  " + frames(x.frames) + (x.match === "exact" || x.match === "new" ? "" : " [" + x.match.replace(/_/g, " ") + "]")));
          s.append(ol);
        };
        list("Stacks that grew most", req.stacks.grew);
        list("New stacks", req.stacks.new_stacks);
      }
      const f = d.findings || { appeared: [], disappeared: [] };
      for (const [title, v] of [["Findings that appeared", f.appeared], ["Findings that disappeared", f.disappeared]]) {
        if (!v.length) continue;
        s.append(el("div", { cls: "hint", text: title + ":" }));
        const ul = el("ul", { cls: "evidence" });
        for (const x of v) ul.append(el("li", null, "[" + x.severity + "] " + x.title + (x.where ? " at " + x.where : "")));
        s.append(ul);
      }
    }
  }

  if (W) renderWhatIf();
  if (B) renderBaseline();
})();
