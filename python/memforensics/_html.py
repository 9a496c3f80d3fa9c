"""The notebook view of an analysis: headline, findings, peaks and a small watermark timeline, in
one self-contained HTML fragment (no script, no network; every string from the file escaped)."""
from html import escape


def _size(n):
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def _where(frames):
    if not frames:
        return ""
    f = frames[0]
    return f'{f.get("filename", "?")}:{f.get("line", "?")} {f.get("name", "")}'


def _sparkline(points, width=360, height=60):
    """Reserved (outline) and allocated (filled) over the event index, as inline SVG."""
    pts = [p for p in points if p[0] is not None and p[0] >= 0]
    if len(pts) < 2:
        return ""
    top = max(max(p[2] or 0, p[3] or 0) for p in pts) or 1
    x0, x1 = pts[0][0], pts[-1][0]
    span = (x1 - x0) or 1

    def xy(p, col):
        x = (p[0] - x0) / span * width
        y = height - (p[col] or 0) / top * (height - 2)
        return f"{x:.1f},{y:.1f}"

    alloc = " ".join(xy(p, 3) for p in pts)
    res = " ".join(xy(p, 2) for p in pts)
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="reserved and allocated bytes over the events">'
            f'<polygon points="0,{height} {alloc} {width},{height}" fill="#9ecae1"/>'
            f'<polyline points="{res}" fill="none" stroke="#08519c" stroke-width="1.2"/></svg>')


def analysis_html(doc, timeline):
    series = {}
    if timeline:
        for d in timeline.get("devices", []):
            series[d.get("device")] = d.get("points") or []
    out = ['<div class="memforensics">',
           f'<p><b>memforensics</b> {escape(str(doc.get("path", "")))}</p>']
    head = doc.get("headline") or {}
    items = head.get("items") or []
    if items:
        out.append("<ul>")
        for it in items:
            where = _where(it.get("where"))
            out.append(f'<li><b>{escape(str(it.get("severity", "")))}</b> '
                       f'{escape(str(it.get("title", "")))}'
                       + (f' <code>{escape(where)}</code>' if where else "") + "</li>")
        out.append("</ul>")
    else:
        out.append("<p>no OOM and no high-severity finding</p>")
    out.append('<table><tr><th>device</th><th>peak reserved</th><th>peak requested</th>'
               '<th>OOMs</th><th>findings</th><th>reserved / allocated</th></tr>')
    for d in doc.get("devices", []):
        n = len(d.get("findings") or [])
        out.append(f'<tr><td>cuda:{escape(str(d.get("device")))}</td>'
                   f'<td>{_size(d.get("peak_reserved_bytes"))}</td>'
                   f'<td>{_size(d.get("peak_requested_bytes"))}</td>'
                   f'<td>{escape(str(d.get("oom_count", 0)))}</td><td>{n}</td>'
                   f'<td>{_sparkline(series.get(d.get("device"), []))}</td></tr>')
    out.append("</table>")
    findings = [(d.get("device"), f) for d in doc.get("devices", []) for f in d.get("findings") or []]
    findings += [("job", f) for f in doc.get("job_findings") or []]
    if findings:
        out.append("<details><summary>findings</summary><ul>")
        for dev, f in findings:
            where = _where(f.get("where"))
            fix = f.get("fix")
            dev = "job" if dev == "job" else f"cuda:{dev}"
            out.append(f'<li>{escape(str(dev))} <b>{escape(str(f.get("severity", "")))}</b> '
                       f'{escape(str(f.get("title", "")))}'
                       + (f' <code>{escape(where)}</code>' if where else "")
                       + (f'<br><i>fix:</i> {escape(str(fix))}' if isinstance(fix, str) and fix else "")
                       + "</li>")
        out.append("</ul></details>")
    out.append("</div>")
    return "".join(out)
