// blockmap.js: the report's block map (segments as rows of blocks at the moment the page shows,
// by state or inferred category), its OOM panel and its hover and click read-outs. report.js makes
// it once with what the two share (window.memfParts.blockmap(R)); every string from the snapshot
// reaches the DOM as text.
(window.memfParts = window.memfParts || {}).blockmap = function (R) {
  "use strict";
  const { $, CATEGORY_COLOURS, D, OOM_COLOUR, S, STATE_COLOURS, STATE_NAMES, actionName, bmOfState, currentEvent, dev, devA, dprCanvas, el, evWhen, eventWhat, exact, fmtBytes, frameText, inWindow, kfLabel, lowerBound, momentChanged, noSegmentsWhy, stateAfter } = R;
  // ST: report.js reassigns it, so it is read through R at each use.
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
  function blockOfAddress(bm, addr) {
    const i = lowerBound(bm.addr, addr + 1) - 1;
    return i >= 0 && addr < bm.addr[i] + bm.size[i] ? i : -1;
  }
  // By state, by inferred category, or one colour per allocation (its alloc event; a block alive
  // before the trace by its stack), hues spread by the golden angle so neighbours differ.
  function blockColour(code, i) {
    const state = code & 3, cat = (code >> 2) & 7, run = code & 32;
    let col = STATE_COLOURS[state];
    if (state !== 0 && !run && S.colourBy === "category") col = CATEGORY_COLOURS[cat] || CATEGORY_COLOURS[5];
    else if (state !== 0 && !run && S.colourBy === "allocation") {
      const id = BM.ev[i] >= 0 ? BM.ev[i] : 7919 + BM.stack[i];
      col = "hsl(" + ((id * 137.508) % 360).toFixed(1) + "," + (state === 2 ? 35 : 62) + "%," + (state === 2 ? 62 : 48) + "%)";
    }
    return { col, run };
  }
  // Zoom into one segment: the map draws that segment alone over every row. Kept across moments
  // while a segment starts at the same address; a moment without it shows every segment.
  function zoomBM(bm, si) {
    const z = { start: [], size: [], code: [], req: [], stack: [], ev: [], count: [], free: [], pend: [], seg: [], segs: [bm.segs[si]], segStart: [0],
      total: bm.segs[si].size, sums: bm.sums, blocks: 0 };
    if (bm.addr) z.addr = [];
    const from = bm.segStart[si];
    for (let i = 0; i < bm.start.length; i++) {
      if (bm.seg[i] !== si) continue;
      for (const key of ["size", "code", "req", "stack", "ev", "count", "free", "pend"]) z[key].push(bm[key][i]);
      z.start.push(bm.start[i] - from); z.seg.push(0);
      if (bm.addr) z.addr.push(bm.addr[i]);
      z.blocks++;
    }
    return z;
  }
  function renderBlockmap() {
    const d = dev(), k = d.keyframes[S.kf];
    const sel = $("keyframe");
    if (sel.value !== String(S.kf)) sel.value = String(S.kf);
    const cap = $("blockmap-caption");
    cap.dataset.event = String(k.event);
    cap.dataset.keyframe = String(S.kf);
    if (d.has_segment_info === false) {
      cap.textContent = "No block map: " + noSegmentsWhy() + ". Moment " + kfLabel(k) + ": reserved " + fmtBytes(k.at.reserved_bytes) + ", allocated " + fmtBytes(k.at.allocated_bytes) + ".";
      BM = null;
      $("blockmap-oom").hidden = true;
      $("blockmap").hidden = true;
      $("blockmap").style.display = "none";  // canvas { display: block } would show it
      $("blockmap-legend").textContent = "";
      $("block-stack").textContent = "";
      return;
    }
    $("blockmap").hidden = false;
    $("blockmap").style.display = "";
    const ev = currentEvent();
    const c = $("blockmap");
    c.dataset.device = String(devA().device);
    let text, shown = k, exact = false, touch = 0;
    if (inWindow(ev)) {
      // Any event of the window, exactly: the stepped layout.
      BM = bmOfState(stateAfter(ev));
      exact = true;
      const i = ev - R.ST().st.first, a = R.ST().st.events[4 * i], addr = R.ST().st.events[4 * i + 1], sz = R.ST().st.events[4 * i + 2];
      touch = addr && actionName(a) !== "oom" ? addr : 0;
      text = "Layout after " + evWhen(ev) + " (" + eventWhat(a, addr, sz) + "): reserved " +
        fmtBytes(BM.sums.reserved) + ", allocated " + fmtBytes(BM.sums.allocated) + ", pending free " + fmtBytes(BM.sums.pending) + ", " +
        BM.segs.length + " segment(s), " + BM.blocks.toLocaleString("en-US") + " blocks.";
      shown = d.keyframes.find((x) => x.event === ev) || null;
      cap.dataset.event = String(ev);
      c.dataset.event = String(ev);
      c.dataset.reserved = String(BM.sums.reserved);
      c.dataset.allocated = String(BM.sums.allocated);
      c.dataset.pending = String(BM.sums.pending);
    } else {
      BM = decodeKeyframe(k);
      text = "Layout " + kfLabel(k) + ": reserved " + fmtBytes(k.at.reserved_bytes) + ", allocated " + fmtBytes(k.at.allocated_bytes) +
        ", pending free " + fmtBytes(k.at.pending_free_bytes) + ", " + k.segments.length / 6 + " segment(s), " + k.blocks_before_merge.toLocaleString("en-US") + " blocks.";
      if (ev !== k.event) text += " (the nearest precomputed moment to " + evWhen(ev) + ")";
      c.dataset.event = String(k.event);
      c.dataset.reserved = String(k.at.reserved_bytes);
      c.dataset.allocated = String(k.at.allocated_bytes);
      c.dataset.pending = String(k.at.pending_free_bytes);
    }
    c.dataset.stepped = exact ? "1" : "0";
    // Zoomed into one segment: the map draws it alone.
    const zi = S.zoom !== null ? BM.segs.findIndex((x) => x.address === S.zoom) : -1;
    if (zi >= 0) {
      const sg = BM.segs[zi];
      BM = zoomBM(BM, zi);
      text += " Zoomed into segment 0x" + sg.address.toString(16) + " (" + fmtBytes(sg.size) + ", " + sg.pool + " pool, stream " + sg.stream + ", " +
        BM.blocks.toLocaleString("en-US") + " pieces); double-click or All segments for every segment.";
    } else if (S.zoom !== null) {
      text += " (Segment 0x" + S.zoom.toString(16) + " does not exist at this moment: every segment is shown.)";
    }
    c.dataset.zoom = zi >= 0 ? "0x" + S.zoom.toString(16) : "";
    $("blockmap-unzoom").hidden = S.zoom === null;
    BM.touched = touch && BM.addr ? blockOfAddress(BM, touch) : -1;
    if (BM.touched >= 0) text += " The block the event touched is outlined.";
    text += d.layout_exact ? " Exact layout." : " Estimated layout (see Block layout above).";
    cap.textContent = text;
    renderOomPanel(shown);
    drawBlockmap();
    $("block-stack").textContent = "";
    const lg = $("blockmap-legend");
    lg.textContent = "";
    if (S.colourBy === "category") {
      D.categories.forEach((c, i) => lg.append(el("span", null, el("i", { style: "background:" + CATEGORY_COLOURS[i] }), c)));
      lg.append(el("span", null, el("i", { style: "background:" + STATE_COLOURS[0] }), "free"));
    } else if (S.colourBy === "allocation") {
      lg.append(el("span", null, "a colour per allocation (hover a block for its stack); runs of small blocks by state;"),
        el("span", null, el("i", { style: "background:" + STATE_COLOURS[0] }), "free"));
    } else {
      STATE_NAMES.forEach((c, i) => lg.append(el("span", null, el("i", { style: "background:" + STATE_COLOURS[i] }), c)));
    }
  }
  // At an OOM: the request that failed drawn to scale against the largest free block of its pool
  // (and stream) and that pool's free bytes in all (the figures of `blocks --at oom`); the block
  // map outlines that largest free block.
  function renderOomPanel(k) {
    const box = $("blockmap-oom");
    box.textContent = "";
    BM.hole = -1;
    const v = k && k.oom;
    box.hidden = !v;
    if (!v) { delete box.dataset.request; return; }
    // The block to outline: a free block of the pool and stream as large as the verdict's largest;
    // where the report drew small blocks merged into runs, the run of that pool holding free bytes
    // enough to contain it (the caption says so).
    let run = -1;
    for (let i = 0; i < BM.start.length; i++) {
      const s = BM.segs[BM.seg[i]];
      if (s.pool !== v.pool || s.stream !== v.stream) continue;
      if (BM.code[i] & 32) { if (run < 0 && BM.free[i] >= v.pool_largest_free_bytes && v.pool_largest_free_bytes > 0) run = i; continue; }
      if ((BM.code[i] & 3) === 0 && BM.size[i] === v.pool_largest_free_bytes && BM.hole < 0) BM.hole = i;
    }
    const inRun = BM.hole < 0 && run >= 0;
    if (inRun) BM.hole = run;
    box.dataset.hole = BM.hole < 0 ? "" : inRun ? "run" : String(BM.size[BM.hole]);
    box.dataset.request = String(v.request_bytes);
    box.dataset.largest = String(v.pool_largest_free_bytes);
    box.append(el("div", { text: "The failed request: " + fmtBytes(v.request_bytes) + " from the " + v.pool + " pool on stream " + v.stream + ". " +
      (v.fits_block ? "A free block of that pool could have held it." :
        v.fragmentation ? "Fragmentation: the pool had the bytes free, but in pieces, none large enough." :
          "Neither the pool's largest free block nor all its free bytes could hold it.") +
      " The device had " + fmtBytes(v.device_free) + " free" + (v.short_by_bytes ? "; short by " + fmtBytes(v.short_by_bytes) : "") + "." }));
    const top = Math.max(v.request_bytes, v.pool_free_bytes, v.pool_largest_free_bytes, 1);
    for (const [label, bytes, cls] of [["request", v.request_bytes, "request"], ["largest free block of the pool", v.pool_largest_free_bytes, "hole"],
      ["free in the pool in all", v.pool_free_bytes, "pool"]]) {
      const bar = el("div", { cls: "bar " + cls });
      bar.style.width = (100 * bytes / top).toFixed(2) + "%";
      box.append(el("div", { cls: "bar-row", "data-bar": cls }, el("span", { text: label }), el("div", null, bar), el("span", { cls: "mono", text: fmtBytes(bytes) })));
    }
    if (BM.hole >= 0) box.append(el("div", { cls: "hint", text: inRun ? "That largest free block lies in a run of small blocks drawn merged: the block map outlines the run in red." :
      "The block map outlines that largest free block in red." }));
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
    // The pieces of [from, from + len) as the rows wrap it: fn(x0, x1, y) per row it touches.
    const pieces = (from, len, fn) => {
      let p = from;
      const end = from + len;
      while (p < end) {
        const row = Math.floor(p / G.bpr), q = Math.min(end, (row + 1) * G.bpr);
        fn(G.left + ((p - row * G.bpr) / G.bpr) * G.width, G.left + ((q - row * G.bpr) / G.bpr) * G.width, 4 + row * (ROW_H + ROW_GAP));
        p = q;
      }
    };
    const span = (from, len, colour, hatch) => pieces(from, len, (x0, x1, y) => {
      g.fillStyle = colour; g.fillRect(x0, y, Math.max(0.6, x1 - x0), ROW_H);
      if (hatch && x1 - x0 > 3) { g.fillStyle = "rgba(255,255,255,0.35)"; g.fillRect(x0, y + ROW_H / 2, x1 - x0, ROW_H / 2); }
    });
    for (let i = 0; i < BM.start.length; i++) {
      const { col, run } = blockColour(BM.code[i], i);
      span(BM.start[i], BM.size[i], col, run);
    }
    // segment boundaries
    g.fillStyle = "#1d2330";
    for (const s0 of BM.segStart) {
      const row = Math.floor(s0 / G.bpr), x = G.left + ((s0 - row * G.bpr) / G.bpr) * G.width;
      g.fillRect(x, 2 + row * (ROW_H + ROW_GAP), 1.2, ROW_H + 4);
    }
    if (S.block !== null && S.block < BM.start.length) span(BM.start[S.block], BM.size[S.block], "rgba(0,0,0,0.45)", false);
    if (BM.touched >= 0) {  // the block the stepped event touched
      g.strokeStyle = "#111827"; g.lineWidth = 1.5;
      pieces(BM.start[BM.touched], BM.size[BM.touched], (x0, x1, y) => g.strokeRect(x0 - 1, y - 2, Math.max(3, x1 - x0 + 2), ROW_H + 4));
      g.lineWidth = 1;
    }
    if (BM.hole >= 0) {  // the OOM's largest free block of its pool: outlined, with a floor of 3 px
      g.strokeStyle = OOM_COLOUR; g.lineWidth = 2;
      pieces(BM.start[BM.hole], BM.size[BM.hole], (x0, x1, y) => g.strokeRect(x0 - 1, y - 1, Math.max(3, x1 - x0 + 2), ROW_H + 2));
      g.lineWidth = 1;
    }
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
        (BM.ev[i] >= 0 ? ", allocated at " + evWhen(BM.ev[i]) : ", allocated before the trace began");
    }
    return t;
  }
  function showStack(i) {
    const box = $("block-stack");
    box.textContent = "";
    if (i < 0) return;
    const st = BM.stack[i];
    if (BM.code[i] & 32) { box.append(el("div", { text: "A run of small blocks drawn merged at this precomputed moment: its blocks have no single stack (inside the stepping window every block is drawn on its own)." })); return; }
    if ((BM.code[i] & 3) === 0) return;
    if (st < 0) { box.append(el("div", { text: "No stack recorded for this block (or the report's stack table is full)." })); return; }
    box.append(el("div", { text: (BM.ev[i] < 0 ? "Allocated before the trace began, from" : "Allocated from") + " (innermost first):" }));
    const ol = el("ol");
    for (const f of D.stacks[st]) ol.append(el("li", { text: frameText(D.frames[f]) }));
    box.append(ol);
  }
  function installBlockmap() {
    const c = $("blockmap");
    c.addEventListener("mousemove", (e) => { if (!dev() || !BM) return;
      const r = c.getBoundingClientRect(), i = blockAt(e.clientX - r.left, e.clientY - r.top);
      $("blockmap-readout").textContent = i >= 0 ? blockText(i) : " ";
    });
    c.addEventListener("click", (e) => { if (!dev() || !BM) return;
      const r = c.getBoundingClientRect(), i = blockAt(e.clientX - r.left, e.clientY - r.top);
      S.block = i >= 0 ? i : null;
      drawBlockmap();
      showStack(i);
    });
    $("keyframe").addEventListener("change", () => { if (!dev()) return; S.kf = Number($("keyframe").value); S.picked = null; S.block = null; momentChanged(); });
    c.addEventListener("dblclick", (e) => { if (!dev() || !BM) return;
      if (S.zoom !== null) { S.zoom = null; renderBlockmap(); return; }
      const r = c.getBoundingClientRect(), i = blockAt(e.clientX - r.left, e.clientY - r.top);
      if (i < 0) return;
      S.zoom = BM.segs[BM.seg[i]].address;
      S.block = null;
      renderBlockmap();
    });
    $("blockmap-unzoom").addEventListener("click", () => { S.zoom = null; if (dev()) renderBlockmap(); });
    $("colour-by").addEventListener("change", () => { if (!dev()) return; S.colourBy = $("colour-by").value; renderBlockmap(); });
  }
  return { reset: () => { BM = null; }, ready: () => BM !== null, drawBlockmap, installBlockmap, renderBlockmap };
};
