// icicle.js: the report's call tree of the bytes live at the moment the page shows (the
// keyframe's tree, the peak's, or the nearest one), with search and zoom. report.js makes it once
// with what the two share (window.memfParts.icicle(R)); every string from the snapshot reaches
// the DOM as text.
(window.memfParts = window.memfParts || {}).icicle = function (R) {
  "use strict";
  const { $, D, S, dev, dprCanvas, evWhen, exact, fmtBytes, frameText, kfLabel, knownLine } = R;
  // ---------- icicle ----------
  let IC = null;
  // The call tree follows the moment: the keyframe's own tree (from the replayer's live set, or
  // the layout's allocated blocks), the requested peak's full one at the peak, else the nearest
  // moment that has one (said in the title).
  function selectIcicle() {
    const d = dev(), k = d.keyframes[S.kf];
    let t = d.icicle, at = null, note = "";
    if (k && k.event !== d.icicle_event) {
      if (k.icicle && k.icicle.bytes.length) { t = k.icicle; at = k; }
      else {
        let best = null;
        d.keyframes.forEach((x) => { if (x.icicle && x.icicle.bytes.length && (best === null || Math.abs(x.event - k.event) < Math.abs(best.event - k.event))) best = x; });
        if (best && Math.abs(best.event - k.event) < Math.abs(d.icicle_event - k.event)) { t = best.icicle; at = best; }
        note = " (the nearest moment with a call tree)";
      }
    }
    const title = $("icicle-title");
    // What the tree counts (buildIcicle in report_data.cc), said where its total is read: it is
    // below the allocated figures by the blocks awaiting their free and the allocator's rounding.
    const counts = " (requested bytes; blocks pending free not counted)";
    if (at) {
      title.textContent = "Live memory by call stack " + kfLabel(at) + note + counts + (at.icicle_source === "layout" && !d.layout_exact ? " — from the estimated block layout" : "");
      title.dataset.event = String(at.event);
    } else {
      title.textContent = "Live memory by call stack at the requested peak, " + evWhen(d.icicle_event) + note + counts;
      title.dataset.event = String(d.icicle_event);
    }
    if (IC && IC.t === t) return;
    prepIcicle(t);
  }
  function prepIcicle(t) {
    const n = t.bytes.length;
    const kids = Array.from({ length: n }, () => []);
    const depth = new Array(n).fill(0);
    for (let i = 1; i < n; i++) { if (t.parent[i] >= 0) { kids[t.parent[i]].push(i); depth[i] = depth[t.parent[i]] + 1; } }
    for (const k of kids) k.sort((a, b) => t.bytes[b] - t.bytes[a]);
    // Bars read function first, then the file's last two path parts; the read-out has it all.
    // A C++ frame's bar shows its short name (f[3]: the function without return type and
    // arguments, "backward: " first for the autograd engine); the read-out has the signature.
    const short = (f) => (f.length > 3 && f[3] ? f[3] : f[1]) + "  " + f[0].split("/").slice(-2).join("/") + (knownLine(f[2]) ? ":" + f[2] : "");
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
      g.fillStyle = "#5b6475"; g.font = "13px system-ui, sans-serif"; g.fillText("Nothing was live at this moment.", 10, 24);
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
  return { reset: () => { IC = null; }, ready: () => IC !== null, drawIcicle, installIcicle, selectIcicle };
};
