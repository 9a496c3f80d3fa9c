// allocations.js: the report's allocation view (memory_viz's "Active Memory Timeline"): every
// allocation of the window as a band stacked by address order, the grey band of what is not drawn
// and its split, hover and click read-outs. report.js makes it once with what the two share
// (window.memfParts.allocations(R)); every string from the snapshot reaches the DOM as text.
(window.memfParts = window.memfParts || {}).allocations = function (R) {
  "use strict";
  const { $, CATEGORY_HUES, D, OOM_COLOUR, PAD, S, byteTicks, dev, dprCanvas, drawAxes, drawn, el, evWhen, exact, fmtBytes, frameText, gotoEvent, installPlot, lowerBound, pointIndexAt, shownMoment, timeAxis, timeXOf, xOfEvent, xToValue } = R;
  // TL: report.js reassigns it, so it is read through R at each use.
  // ---------- allocation view (memory_viz's "Active Memory Timeline") ----------
  // Each drawn allocation is a band from its alloc to its free, stacked in allocation order: when
  // one is freed, those above it move down (as memory_viz stacks them). The rest (smaller
  // allocations, blocks alive before the trace began) is one band on top, per bucket of events.
  // Stacking is O(drawn^2) in the worst case; beyond MAX_BREAKS breakpoints frees no longer move
  // the bands above them (gaps stay) and the caption says so.
  const MAX_BREAKS = 2000000;
  let AV = null;
  // Segments over time in the allocation view's shape: a band per segment (or mapped range of an
  // expandable reservation) from its creation to its release (src/report/html/segment_view.h);
  // no rest band.
  function segmentsAl(d) {
    const st = d.segment_timeline, L = st.lives, n = L.length / 7, a = d.allocations;
    const drawn = [], times = st.times ? [] : null;
    for (let i = 0; i < n; i++) {
      drawn.push(L[7 * i], L[7 * i + 1], L[7 * i + 3], L[7 * i + 5], L[7 * i + 6] ? 0 : 2);
      if (times) times.push(st.times[2 * i], st.times[2 * i + 1]);
    }
    const zeros = a.buckets.first_event.map(() => 0);
    return { drawn, times, allocations: n, capped: st.left_out > 0, seg: st,
      buckets: { first_event: a.buckets.first_event, first_time_us: a.buckets.first_time_us, at_event: a.buckets.at_event, total: zeros, rest: zeros } };
  }
  // The grey band split on demand (allocation_view.h AllocationBucket::split and stacks): per
  // bucket its parts by inferred category, then blocks alive before the trace, and two lists of
  // its largest stacks, each exact: the allocations the Detail slider hides (the page's own
  // sums), and the ones the page never drew (the C++ list).
  function restSplitOf(al, hidden) {
    const bk = al.buckets, nb = bk.at_event.length, K = D.categories.length + 1, r = al.drawn;
    if (!bk.split || bk.split.length !== nb * K || !bk.stacks) return null;
    const split = [], stacks = [], hiddenStacks = [], hid = [];
    for (let i = 0; i < hidden.length; i++) if (hidden[i]) hid.push(i);
    for (let b = 0; b < nb; b++) {
      const at = bk.at_event[b], parts = bk.split.slice(b * K, b * K + K), src = bk.stacks[b] || [], list = [], byStack = new Map();
      for (let j = 0; j + 3 < src.length; j += 4) list.push({ stack: src[j], bytes: src[j + 1], n: src[j + 2], exact: src[j + 3] === 1 });
      for (const i of hid) {
        const j = 5 * i;
        if (!(r[j] <= at && (r[j + 1] < 0 || r[j + 1] > at))) continue;
        if (r[j] < 0) { parts[K - 1] += r[j + 2]; continue; }
        parts[r[j + 4]] += r[j + 2];
        let e = byStack.get(r[j + 3]);
        if (!e) { e = { stack: r[j + 3], bytes: 0, n: 0, exact: true }; byStack.set(e.stack, e); }
        e.bytes += r[j + 2]; e.n++;
      }
      split.push(parts); stacks.push(list);
      hiddenStacks.push(Array.from(byStack.values()).sort((x, y) => y.bytes - x.bytes || x.stack - y.stack).slice(0, 3));
    }
    return { split, stacks, hiddenStacks };
  }
  function prepAllocations() {
    const d = dev(), segMode = S.allocMode === "segments" && d.segment_timeline && d.allocations;
    const al = segMode ? segmentsAl(d) : d.allocations;
    AV = null;
    S.restBucket = -1;  // the split's box belongs to the view it was made in
    $("allocations").dataset.mode = segMode ? "segments" : "allocations";
    if (!al) return;
    const n = al.drawn.length / 5;
    const x0 = new Float64Array(n), x1 = new Float64Array(n), bytes = new Float64Array(n);
    const xOf = (ev, t) => (timeAxis() ? (t !== null && t !== undefined && t >= 0 ? t : xOfEvent(ev)) : ev);
    const ops = [];
    // The detail slider (log scale): the `shown` largest of the drawn allocations are drawn one by
    // one; the others join the rest band, which grows by what they hold at each bucket's moment.
    const shown = segMode ? n : Math.max(n ? 1 : 0, Math.min(n, Math.round(Math.exp((S.allocDetail / 1000) * Math.log(Math.max(1, n))))));
    const hidden = new Uint8Array(n);
    if (shown < n) {
      const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => al.drawn[5 * b + 2] - al.drawn[5 * a + 2] || a - b);
      for (let k = shown; k < n; k++) hidden[order[k]] = 1;
    }
    const rest = al.buckets.rest.slice();
    for (let i = 0; i < n; i++) {
      const r = al.drawn, j = 5 * i;
      bytes[i] = r[j + 2];
      x0[i] = r[j] >= 0 ? xOf(r[j], al.times ? al.times[2 * i] : null) : R.TL().lo;
      x1[i] = r[j + 1] >= 0 ? xOf(r[j + 1], al.times ? al.times[2 * i + 1] : null) : R.TL().hi;
      if (hidden[i]) {
        al.buckets.at_event.forEach((at, b) => { if (r[j] <= at && (r[j + 1] < 0 || r[j + 1] > at)) rest[b] += r[j + 2]; });
        continue;
      }
      ops.push([r[j], 1, i]);
      if (r[j + 1] >= 0) ops.push([r[j + 1], 0, i]);
    }
    ops.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const bx = Array.from({ length: n }, () => []), by = Array.from({ length: n }, () => []);
    const live = [];  // bottom to top
    const off = new Float64Array(n);
    let total = 0, breaks = 0, simplified = false;
    const totX = [], totY = [];  // the drawn bytes over x (the rest band sits on it)
    for (const [, isAlloc, i] of ops) {
      if (isAlloc) {
        off[i] = total; live.push(i); total += bytes[i];
        bx[i].push(x0[i]); by[i].push(off[i]); breaks++;
        totX.push(x0[i]); totY.push(total);
      } else {
        const p = live.indexOf(i);
        if (p >= 0) {
          live.splice(p, 1);
          if (!simplified) {
            for (let k = p; k < live.length; k++) {
              const j = live[k];
              off[j] -= bytes[i]; bx[j].push(x1[i]); by[j].push(off[j]);
            }
            breaks += live.length - p;
            if (breaks > MAX_BREAKS) simplified = true;
            total -= bytes[i];
          }
          totX.push(x1[i]); totY.push(simplified ? total : total);
        }
      }
    }
    let ymax = 1;
    for (const t of al.buckets.total) if (t > ymax) ymax = t;
    for (const t of totY) if (t > ymax) ymax = t;
    const bxs = al.buckets.first_event.map((ev, b) => xOf(ev, al.buckets.first_time_us ? al.buckets.first_time_us[b] : null));
    AV = { n, x0, x1, bytes, bx, by, totX, totY, bxs, ymax: ymax * 1.04, simplified, al, hidden, rest, shown, split: segMode ? null : restSplitOf(al, hidden) };
    let smallest = 0;
    for (let i = 0; i < n; i++) if (!hidden[i] && (!smallest || bytes[i] < smallest)) smallest = bytes[i];
    const c = $("allocations");
    c.dataset.drawn = String(shown);
    c.dataset.restSum = String(rest.reduce((a, b) => a + b, 0));
    $("alloc-detail-n").textContent = n ? shown.toLocaleString("en-US") + " of " + n.toLocaleString("en-US") + " drawn" : "";
    $("alloc-detail").disabled = n < 2 || segMode;
    $("alloc-split").disabled = segMode || !AV.split;
    c.dataset.split = S.restSplit && AV.split ? "1" : "0";
    const cap = $("allocations-caption");
    const lg = $("allocations-legend");
    lg.textContent = "";
    if (segMode) {
      const st = al.seg;
      cap.textContent = "Segments over time (memory_viz's Active Cached Segment Timeline): each cudaMalloc'd segment and each mapped range of an expandable reservation " +
        "a band from the event that created it to the one that released it, stacked in creation order; " + n.toLocaleString("en-US") + " band(s)" +
        (st.left_out ? ", the " + st.left_out.toLocaleString("en-US") + " smallest left out" : "") + ". " +
        (st.agrees ? "Checked: their bytes equal the replayed reserved bytes after every event." :
          "Estimate: their bytes differ from the replayed reserved bytes" + (st.first_disagreement >= -1 ? " from " + evWhen(st.first_disagreement) : "") +
          " (the file's history does not hold every segment event).");
      cap.dataset.agrees = st.agrees ? "1" : "0";
      lg.append(el("span", null, el("i", { style: "background:hsl(220,62%,55%)" }), "segment"),
        el("span", null, el("i", { style: "background:hsl(265,62%,55%)" }), "expandable mapped range"));
      return;
    }
    delete cap.dataset.agrees;
    const what = n ? "the " + shown.toLocaleString("en-US") + " largest of " + (al.allocations + (al.before_trace || 0)).toLocaleString("en-US") + " allocations drawn one by one (" +
      fmtBytes(smallest) + " and up" + (shown < n ? "; the Detail slider draws up to " + n.toLocaleString("en-US") : "") + ")" : "no allocation with a recorded alloc event";
    const before = al.before_trace ? " Of the blocks alive before the trace began, those it frees are drawn from its start with the stack that freed them (" +
      al.before_trace.toLocaleString("en-US") + ")." : "";
    cap.textContent = "Requested bytes of each allocation over its lifetime, stacked in allocation order; " + what +
      (al.capped || shown < n ? "; the others, and blocks alive before the trace began, form the grey band on top (per bucket of events, at the bucket's highest requested total)" : "; the grey band on top: blocks alive before the trace began") +
      "." + (simplified ? " Stacking simplified: past " + MAX_BREAKS.toLocaleString("en-US") + " moves, frees leave gaps." : "") + before;
    D.categories.forEach((c, i) => lg.append(el("span", null, el("i", { style: "background:hsl(" + CATEGORY_HUES[i] + "," + (i === 5 ? 15 : 62) + "%,55%)" }), c)));
    lg.append(el("span", null, el("i", { style: "background:#cbd1db" }), S.restSplit && AV.split ? "rest: alive before the trace" : "rest"));
    if (S.restSplit && AV.split) {
      D.categories.forEach((c, i) => {
        if (AV.split.split.some((p) => p[i] > 0)) lg.append(el("span", null, el("i", { style: "background:" + restColour(i) }), "rest: " + c));
      });
    }
  }
  function restColour(c) {
    return c >= D.categories.length ? "#cbd1db" : "hsl(" + CATEGORY_HUES[c] + "," + (c === 5 ? 10 : 45) + "%,82%)";
  }
  function allocColour(i) {
    const cat = AV.al.drawn[5 * i + 4], light = 45 + ((i * 37) % 5) * 6;
    return "hsl(" + (CATEGORY_HUES[cat] || 215) + "," + (cat === 5 ? 15 : 62) + "%," + light + "%)";
  }
  // The drawn bytes just after x (the top of the drawn stack).
  function drawnTotalAt(x) {
    const i = lowerBound(AV.totX, x + 1e-9) - 1;
    return i >= 0 ? AV.totY[i] : 0;
  }
  function drawAllocations() {
    const c = $("allocations");
    const { g, w, h } = dprCanvas(c);
    g.clearRect(0, 0, w, h); g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
    if (!AV) return;
    const [v0, v1] = S.view;
    const { X, Y, pw, ph } = drawAxes(g, w, h, AV.ymax, "requested bytes");
    g.save(); g.beginPath(); g.rect(PAD.l, PAD.t, pw, ph); g.clip();
    // the rest band, per bucket, on top of the drawn stack
    const al = AV.al, nb = AV.bxs.length;
    g.fillStyle = "#cbd1db";
    let biggest = null;  // the band's largest drawn piece: its centre is on the canvas's dataset

    for (let b = 0; b < nb; b++) {
      const xa = AV.bxs[b], xb = b + 1 < nb ? AV.bxs[b + 1] : R.TL().hi;
      if (xb < v0 || xa > v1 || AV.rest[b] <= 0) continue;
      // the drawn total changes inside the bucket: one rectangle per change
      const tx = AV.totX, ty = AV.totY;
      let k = Math.max(0, lowerBound(tx, xa + 1e-9) - 1), x = xa;
      while (x < xb) {
        while (k + 1 < tx.length && tx[k + 1] <= x) k++;
        const base = tx.length && tx[k] <= x ? ty[k] : 0;
        const next = k + 1 < tx.length ? Math.min(xb, tx[k + 1]) : xb;
        const xw = Math.max(0.5, X(next) - X(x));
        const hb = Y(base) - Y(base + AV.rest[b]);
        if (!biggest || xw * hb > biggest[2]) biggest = [X(x) + xw / 2, Y(base + AV.rest[b]) + hb / 2, xw * hb];
        if (S.restSplit && AV.split) {
          // the band split: its parts bottom up, the blocks from before the trace on top
          let acc = base;
          AV.split.split[b].forEach((p, c) => {
            if (p <= 0) return;
            g.fillStyle = restColour(c);
            const ya = Y(acc + p), yb = Y(acc);
            g.fillRect(X(x), ya, xw, yb - ya);
            acc += p;
          });
        } else {
          const ya = Y(base + AV.rest[b]), yb = Y(base);
          g.fillRect(X(x), ya, xw, yb - ya);
        }
        x = next;
      }
    }
    c.dataset.restPoint = biggest ? Math.round(biggest[0]) + "," + Math.round(biggest[1]) : "";
    // the drawn allocations
    for (let i = 0; i < AV.n; i++) {
      if (AV.hidden[i] || AV.x1[i] < v0 || AV.x0[i] > v1) continue;
      const xs = AV.bx[i], os = AV.by[i], sz = AV.bytes[i];
      g.fillStyle = i === S.alloc ? "#111827" : allocColour(i);
      for (let s = 0; s < xs.length; s++) {
        const xa = xs[s], xb = s + 1 < xs.length ? xs[s + 1] : AV.x1[i];
        if (xb < v0 || xa > v1) continue;
        const ya = Y(os[s] + sz), yb = Y(os[s]);
        g.fillRect(X(xa), ya, Math.max(0.6, X(xb) - X(xa)), Math.max(0.4, yb - ya));
      }
    }
    // OOMs, the current moment, the pointer
    const d = dev();
    for (const o of d.ooms) {
      const x = Math.round(X(timeXOf(o.event, o.time_us))) + 0.5;
      g.strokeStyle = OOM_COLOUR; g.lineWidth = 2.5; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke(); g.lineWidth = 1;
    }
    const me = shownMoment();
    if (me) {
      const x = X(timeXOf(me.ev, me.t));
      g.strokeStyle = "#1d2330"; g.lineWidth = 2; g.beginPath(); g.moveTo(x, PAD.t); g.lineTo(x, PAD.t + ph); g.stroke(); g.lineWidth = 1;
    }
    if (S.hoverX !== null) { g.strokeStyle = "rgba(29,35,48,0.35)"; g.beginPath(); g.moveTo(S.hoverX, PAD.t); g.lineTo(S.hoverX, PAD.t + ph); g.stroke(); }
    g.restore();
  }
  // The drawn allocation under the pointer (-1: none; -2: the rest band).
  function allocationAt(px, py) {
    if (!AV) return -1;
    const c = $("allocations"), r = c.getBoundingClientRect();
    const v = xToValue(c, px);
    const ph = r.height - PAD.t - PAD.b, top = byteTicks(AV.ymax, Math.max(2, Math.floor(ph / 45))).top;
    const y = ((PAD.t + ph - py) / ph) * top;
    if (y < 0) return -1;
    for (let i = 0; i < AV.n; i++) {
      if (AV.hidden[i] || v < AV.x0[i] || v >= AV.x1[i]) continue;
      const s = lowerBound(AV.bx[i], v + 1e-9) - 1;
      if (s < 0) continue;
      const o = AV.by[i][s];
      if (y >= o && y < o + AV.bytes[i]) return i;
    }
    const b = lowerBound(AV.bxs, v + 1e-9) - 1;
    if (b >= 0) { const base = drawnTotalAt(v); if (y >= base && y < base + AV.rest[b]) return -2 - b; }
    return -1;
  }
  function allocationText(i) {
    const r = AV.al.drawn, j = 5 * i, t = AV.al.times;
    if (AV.al.seg) {
      const L = AV.al.seg.lives;
      return (L[7 * i + 6] ? "mapped range" : "segment") + " 0x" + L[7 * i + 2].toString(16) + ": " + fmtBytes(r[j + 2]) + ", stream " + L[7 * i + 4] + " · " +
        (r[j] >= 0 ? "created at " + evWhen(r[j], t ? t[2 * i] : null) : "there before the trace began") + ", " +
        (r[j + 1] >= 0 ? "released at " + evWhen(r[j + 1], t ? t[2 * i + 1] : null) : "still there at the end");
    }
    const freed = r[j + 1] >= 0 ? "freed at " + evWhen(r[j + 1], t ? t[2 * i + 1] : null) : "alive at the end of the trace";
    if (r[j] < 0) return fmtBytes(r[j + 2]) + " (" + exact(r[j + 2]) + ") requested · alive before the trace began, " + freed + " (the stack below freed it)";
    return fmtBytes(r[j + 2]) + " (" + exact(r[j + 2]) + ") requested · " + D.categories[r[j + 4]] + " (inferred) · allocated at " +
      evWhen(r[j], t ? t[2 * i] : null) + ", " + freed;
  }
  // The grey band's parts at bucket b, largest first.
  function restPartsText(b) {
    const parts = AV.split.split[b].map((p, c) => [p, c]).filter((x) => x[0] > 0).sort((x, y) => y[0] - x[0]);
    const name = (c) => (c >= D.categories.length ? "alive before the trace" : D.categories[c] + " (inferred)");
    return parts.length ? parts.map(([p, c]) => fmtBytes(p) + " " + name(c)).join(" · ") : "nothing";
  }
  // The grey band split at bucket b (a click on it): its parts and its largest stacks; a stack's
  // row shows its frames.
  function showRestSplit(b) {
    const box = $("allocation-stack"), bk = AV.al.buckets, sp = AV.split;
    box.textContent = "";
    box.dataset.restBucket = String(b);
    box.dataset.restParts = JSON.stringify(AV.split.split[b]);
    const cut = AV.al.split_cut ? " Estimate: on " + AV.al.split_cut.toLocaleString("en-US") +
      " bucket(s) the allocations not drawn held more than the band (the replay caps a request at its block), cut to fit." : "";
    box.append(el("div", { text: "The grey band at " + evWhen(bk.at_event[b]) + " (the highest requested total of events " + bk.first_event[b].toLocaleString("en-US") +
      (b + 1 < bk.first_event.length ? "–" + (bk.first_event[b + 1] - 1).toLocaleString("en-US") : " on") + "): " + fmtBytes(AV.rest[b]) + " = " + restPartsText(b) + "." + cut }));
    const frames = el("div");
    const listOf = (list, title) => {
      if (!list.length) return;
      box.append(el("div", { text: title }));
      const ol = el("ol", { class: "rest-stacks" });
      list.forEach((e) => rowOf(ol, e));
      box.append(ol);
    };
    const rowOf = (ol, e) => {
      const st = e.stack >= 0 ? D.stacks[e.stack] : null;
      const top = st && st.length ? frameText(D.frames[st[0]]) : "(no stack recorded, or the report's stack table is full)";
      const li = el("li", { text: (e.exact ? "" : "at least ") + fmtBytes(e.bytes) + " in " + e.n.toLocaleString("en-US") + " allocation(s) · " + top });
      li.dataset.bytes = String(e.bytes);
      if (st) {
        li.style.cursor = "pointer";
        li.addEventListener("click", () => {
          frames.textContent = "";
          const f = el("ol");
          for (const x of st) f.append(el("li", { text: frameText(D.frames[x]) }));
          frames.append(el("div", { text: "Allocated from (innermost first):" }), f);
        });
      }
      ol.append(li);
    };
    listOf(sp.hiddenStacks[b], "Its largest stacks among the allocations the Detail slider hides:");
    listOf(sp.stacks[b], "Its largest stacks among the allocations too small to be drawn one by one in this page:");
    box.append(frames);
  }
  function showAllocStack(i) {
    const box = $("allocation-stack");
    box.textContent = "";
    delete box.dataset.restBucket;
    delete box.dataset.restParts;
    if (i < 0) return;
    const st = AV.al.drawn[5 * i + 3];
    if (st < 0) { box.append(el("div", { text: "No stack recorded for this allocation (or the report's stack table is full)." })); return; }
    const before = !AV.al.seg && AV.al.drawn[5 * i] < 0;
    box.append(el("div", { text: (AV.al.seg ? "Created by the allocation from" : before ? "Allocated before the trace began; freed from" : "Allocated from") + " (innermost first):" }));
    const ol = el("ol");
    for (const f of D.stacks[st]) ol.append(el("li", { text: frameText(D.frames[f]) }));
    box.append(ol);
  }
  function installAllocations() {
    const c = $("allocations");
    installPlot(c, (px, py) => {
      const i = allocationAt(px, py);
      let s = " ";
      if (i >= 0) s = allocationText(i);
      else if (i <= -2) {
        const b = -2 - i, bk = AV.al.buckets;
        s = "rest: " + fmtBytes(AV.rest[b]) + " in allocations not drawn one by one and blocks alive before the trace, at " + evWhen(bk.at_event[b]) +
          " (of " + fmtBytes(bk.total[b]) + " requested then)" + (AV.split ? ": " + restPartsText(b) + " · click to split it" : "");
      }
      $("allocations-readout").textContent = s;
      // the band's split, once clicked, stays in the box below until the next click
      if (S.restBucket < 0 && i !== S.alloc && (i >= 0 || S.alloc >= 0)) { S.alloc = i >= 0 ? i : -1; showAllocStack(S.alloc); }
    }, (px, py) => {
      // a click on the grey band splits it (and says what it holds there); elsewhere it moves
      // the moment
      const i = allocationAt(px, py);
      if (i <= -2 && AV.split) {
        S.alloc = -1;
        setRestSplit(true);
        S.restBucket = -2 - i;
        showRestSplit(S.restBucket);
        return;
      }
      if (S.restBucket >= 0) { S.restBucket = -1; S.alloc = -1; showAllocStack(-1); }
      gotoEvent(dev().points.event[pointIndexAt(c, px)]);
    });
    $("alloc-split").addEventListener("change", () => setRestSplit($("alloc-split").checked));
    $("alloc-mode").addEventListener("change", () => {
      S.allocMode = $("alloc-mode").value;
      if (!dev() || !R.TL()) return;
      S.alloc = -1;
      $("allocation-stack").textContent = "";
      prepAllocations();
      drawAllocations();
    });
    $("alloc-detail").addEventListener("input", () => {
      S.allocDetail = Number($("alloc-detail").value);
      if (!dev() || !R.TL()) return;
      S.alloc = -1;
      $("allocation-stack").textContent = "";
      prepAllocations();
      drawAllocations();
    });
  }

  function setRestSplit(on) {
    S.restSplit = on;
    $("alloc-split").checked = on;
    if (!dev() || !R.TL()) return;
    prepAllocations();
    drawAllocations();
  }
  return { reset: () => { AV = null; }, ready: () => AV !== null, drawAllocations, installAllocations, prepAllocations };
};
