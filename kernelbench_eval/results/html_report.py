"""One self-contained HTML report: a sortable leaderboard and an inline-SVG speedup chart; nothing loads from the net.

All text from verdicts (names, errors, logs) goes through `html.escape`: errors hold `<`, `&` and quotes.
"""

from __future__ import annotations

import math
from html import escape

import pandas as pd

from kernelbench_eval import statuses
from kernelbench_eval.results.formatting import number, runtime_text

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.summary span { display: inline-block; margin-right: 10px; padding: 2px 8px; border-radius: 10px; color: #fff;
  font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; cursor: pointer; user-select: none; white-space: nowrap; }
th.asc::after { content: " \\25B2"; } th.desc::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.err { font-family: ui-monospace, monospace; font-size: 12px; white-space: pre-wrap; max-width: 560px;
  word-break: break-word; color: #57606a; }
.status { font-weight: 600; padding: 1px 6px; border-radius: 4px; color: #fff; white-space: nowrap; }
tr.fail td { background: #fff8f8; }
svg text { font-family: system-ui, sans-serif; font-size: 12px; fill: #1f2328; }
"""

JS = """
(function () {
  var table = document.getElementById("leaderboard");
  var headers = table.tHead.rows[0].cells;
  function key(cell) {
    var raw = cell.getAttribute("data-sort");
    if (raw === null) { raw = cell.textContent; }
    var num = parseFloat(raw);
    return (raw !== "" && !isNaN(num) && isFinite(raw)) ? {n: num} : {s: raw.toLowerCase()};
  }
  function compare(a, b) {
    if (a.n !== undefined && b.n !== undefined) { return a.n - b.n; }
    if (a.n !== undefined) { return -1; }
    if (b.n !== undefined) { return 1; }
    return a.s < b.s ? -1 : (a.s > b.s ? 1 : 0);
  }
  Array.prototype.forEach.call(headers, function (th, index) {
    th.addEventListener("click", function () {
      var asc = !th.classList.contains("asc");
      Array.prototype.forEach.call(headers, function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (r1, r2) {
        var c = compare(key(r1.cells[index]), key(r2.cells[index]));
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  document.title = "kbeval report ok";
})();
"""


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def speedup_svg(df: pd.DataFrame, width: int = 900) -> str:
    """Horizontal bars of each correct candidate's speedup, grouped by problem, on a log x axis with a 1x line."""
    groups: list[tuple[str, list[tuple[str, float]]]] = []
    for problem, group in df.groupby("problem", sort=True):
        good = group[group["correct"] & group["speedup"].notna() & (group["speedup"] > 0)]
        good = good.sort_values(["speedup", "candidate"], ascending=[False, True])
        groups.append((str(problem), [(str(r.candidate), float(r.speedup)) for r in good.itertuples()]))
    speeds = [s for _, items in groups for _, s in items]
    lo = min([*speeds, 0.5]) / 1.3
    hi = max([*speeds, 2.0]) * 1.3
    left, right, row_h, head_h, top = 230, 70, 20, 24, 30
    plot_w = width - left - right

    def x(value: float) -> float:
        return left + plot_w * (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    body: list[str] = []
    y = top
    for problem, items in groups:
        body.append(f'<text x="8" y="{y + 15}" font-weight="bold">{escape(problem)}</text>')
        y += head_h
        if not items:
            body.append(f'<text x="24" y="{y + 14}" fill="#6e7781" font-style="italic">no correct candidate</text>')
            y += row_h
        for name, speed in items:
            x0, x1 = sorted((x(1.0), x(speed)))
            colour = "#1a7f37" if speed >= 1.0 else "#cf222e"
            label = name if len(name) <= 30 else name[:27] + "..."
            body.append(f'<text x="24" y="{y + 14}">{escape(label)}</text>')
            body.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1.5):.1f}" height="{row_h - 6}" '
                        f'fill="{colour}" opacity="0.85"><title>{escape(problem)} / {escape(name)}: '
                        f'{speed:.3g}x</title></rect>')
            body.append(f'<circle cx="{x(speed):.1f}" cy="{y + row_h / 2}" r="3.5" fill="{colour}"/>')
            body.append(f'<text x="{x(speed) + 6 if speed >= 1 else x(1.0) + 6:.1f}" y="{y + 14}">'
                        f'{speed:.2f}x</text>')
            y += row_h
    height = y + 36
    ticks: list[str] = []
    for exponent in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for mantissa in (1, 2, 5):
            tick = mantissa * 10.0**exponent
            if lo <= tick <= hi:
                tx = x(tick)
                ticks.append(f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{y}" stroke="#eaeef2"/>')
                ticks.append(f'<text x="{tx:.1f}" y="{y + 16}" text-anchor="middle">{tick:g}x</text>')
    one = x(1.0)
    ref = (f'<line x1="{one:.1f}" y1="{top - 6}" x2="{one:.1f}" y2="{y}" stroke="#1f2328" stroke-width="1.5" '
           f'stroke-dasharray="4 3"/><text x="{one:.1f}" y="{top - 10}" text-anchor="middle">1x (reference)</text>')
    caption = (f'<text x="{left + plot_w / 2:.1f}" y="{y + 32}" text-anchor="middle" fill="#57606a">'
               f'speedup over the eager reference (log scale)</text>')
    return (f'<svg role="img" aria-label="speedup per candidate" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            + "".join(ticks) + ref + "".join(body) + caption + "</svg>")


def aggregates_html(agg: dict | None) -> str:
    """Geomean speedups, pass@k per problem and per-folder rows (`aggregates.aggregates`), as small tables."""
    if not agg:
        return ""

    def fmt(value: float | None, spec: str = ".3g", suffix: str = "") -> str:
        return escape(number(value, spec, suffix))

    geo = agg["geomean_speedup"]
    parts = [f'<p id="geomean">Geometric-mean speedup of the {geo["candidates"]} ok candidates: '
             f'{fmt(geo["vs_eager"], ".3g", "x") or "n/a"} vs eager, '
             f'{fmt(geo["vs_compile"], ".3g", "x") or "n/a"} vs torch.compile.</p>']
    ks = ("pass@1", "pass@5", "pass@10")
    rows = "".join(f"<tr><td>{escape(p)}</td><td class=num>{e['n']}</td><td class=num>{e['c']}</td>"
                   + "".join(f"<td class=num>{fmt(e.get(k), '.2f')}</td>" for k in ks) + "</tr>"
                   for p, e in agg["pass_at_k"]["problems"].items())
    parts.append('<table id="pass-at-k"><thead><tr><th>problem</th><th>n</th><th>correct</th>'
                 + "".join(f"<th>{k}</th>" for k in ks) + f"</tr></thead><tbody>{rows}</tbody></table>")
    if agg["groups"]:
        rows = "".join(f"<tr><td>{escape(g)}</td><td class=num>{e['problems']}</td><td class=num>{e['candidates']}"
                       f"</td><td class=num>{e['correct']}</td>"
                       f"<td class=num>{fmt(e['geomean_speedup']['vs_eager'], '.3g', 'x')}</td>"
                       + "".join(f"<td class=num>{fmt(e['pass_at_k'].get(k), '.2f')}</td>" for k in ks) + "</tr>"
                       for g, e in agg["groups"].items())
        parts.append('<h3>Per folder</h3><table id="groups"><thead><tr><th>folder</th><th>problems</th>'
                     "<th>candidates</th><th>correct</th><th>geomean vs eager</th>"
                     + "".join(f"<th>mean {k}</th>" for k in ks) + f"</tr></thead><tbody>{rows}</tbody></table>")
    return "<h2>Aggregates</h2>\n" + "\n".join(parts)


def render_html(df: pd.DataFrame, title: str = "kbeval report", aggregates: dict | None = None) -> str:
    counts = statuses.counts(str(s) for s in df["status"])
    summary = "".join(f'<span style="background:{statuses.colour(s)}">{escape(s)}: {n}</span>'
                      for s, n in counts.items())
    head = ("problem", "candidate", "status", "runtime ms", "ref ms", "speedup", "max abs diff", "error", "log")
    rows: list[str] = []
    for r in df.itertuples():
        status = str(r.status)
        cells = [f"<td>{escape(_text(r.problem))}</td>", f"<td>{escape(_text(r.candidate))}</td>",
                 f'<td data-sort="{escape(status)}"><span class="status" '
                 f'style="background:{statuses.colour(status)}">{escape(status)}</span></td>']
        for value, text in ((r.runtime_ms, runtime_text(r.runtime_ms)),
                            (r.ref_runtime_ms, runtime_text(r.ref_runtime_ms)),
                            (r.speedup, number(r.speedup, ".2f", "x")),
                            (r.max_abs_diff, number(r.max_abs_diff, ".2g"))):  # sorted by value, not by text
            sort_key = repr(float(value)) if text else ""
            cells.append(f'<td class="num" data-sort="{escape(sort_key)}">{escape(text)}</td>')
        cells.append(f'<td class="err">{escape(_text(r.error))}</td>')
        cells.append(f'<td class="err">{escape(_text(r.log))}</td>')
        rows.append(f'<tr class="{"ok" if r.correct else "fail"}">' + "".join(cells) + "</tr>")
    table = ('<table id="leaderboard"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
             + "</tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<p class="summary">{len(df)} candidates, {df["problem"].nunique()} problems &nbsp; {summary}</p>
<h2>Speedup of correct candidates</h2>
{speedup_svg(df)}
{aggregates_html(aggregates)}
<h2>Leaderboard</h2>
<p>Click a column header to sort.</p>
{table}
<script>{JS}</script>
</body>
</html>
"""
