"""<workdir>/report.html (and backtest.html): the whole report in one self-contained page.

The page holds what report.md holds (run facts, summary, the per-series results and
baseline tables, skipped series) with every plot inlined as a data: URI, a sortable
table (a few lines of inline JavaScript) and inline CSS. It loads nothing from anywhere
else, so it opens the same from the file system, offline, or served by --mode serve.
"""

from __future__ import annotations

import base64
import html
import os

from cpbjax.report import ablate_section, backtest_tables, tables
from cpbjax.report import plots as plots_lib
from cpbjax.report import sweep_section as report_sweep
from cpbjax.report.spec import ReportSpec

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c9d1e0;font-size:14px}
nav{padding:8px 24px;background:#e8ebf0;font-size:14px}nav a{margin-right:14px}
main{padding:8px 24px 40px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px 18px;margin:14px 0}
h2{font-size:18px;margin:6px 0 10px}h3{font-size:16px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px;font-variant-numeric:tabular-nums}
th,td{border-bottom:1px solid #e3e6ec;padding:4px 9px;text-align:right;white-space:nowrap}
th:first-child,td:first-child,th.text,td.text{text-align:left}
thead th{background:#f0f2f5;position:sticky;top:0}
th button{font:inherit;font-weight:600;background:none;border:0;padding:0;cursor:pointer}
th[aria-sort=ascending] button::after{content:" \\25B2"}
th[aria-sort=descending] button::after{content:" \\25BC"}
td.pos{color:#11703a}td.neg{color:#a8261b}
.legend{color:#4a5263;font-size:13px;max-width:1100px}
.figs{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
figure{margin:0}img{max-width:100%;height:auto;border:1px solid #e3e6ec}
figcaption{font-size:12px;color:#4a5263}
details{margin:6px 0}ul.facts{columns:2;font-size:13px;color:#4a5263}
"""

# Clicking a header sorts its table by that column: numbers numerically ("54.8 (45.2)"
# sorts by 54.8), text alphabetically, "-" (no value) always last.
SORT_JS = """
(function () {
  "use strict";
  function key(cell) {
    var text = cell.textContent.trim();
    if (text === "-" || text === "") return null;
    var x = parseFloat(text);
    return isNaN(x) ? text.toLowerCase() : x;
  }
  function compare(a, b) {
    if (a === null || b === null) return a === null ? (b === null ? 0 : 1) : -1;
    if (typeof a !== typeof b) return typeof a === "number" ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function sortBy(table, th, col) {
    var asc = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var c = compare(key(r.cells[col]), key(s.cells[col]));
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th, col) {
      th.querySelector("button").addEventListener("click", function () {
        sortBy(table, th, col);
      });
    });
  });
})();
"""

TEXT_COLUMNS = ("series", "model", "status", "dir%(up%)", "setting")
SKILL_COLUMNS = ("skill%", "model close", "model high", "model low", "ridge close")


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def data_uri(path: str) -> str:
    """A PNG file as a data: URI, so the page needs no file beside it."""
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


def _anchor(series: str) -> str:
    return "s-" + "".join(c if c.isalnum() else "-" for c in series)


def _skill_class(value: str) -> str:
    """ "pos"/"neg" for a skill cell (in %) that clears noise, else "". The bar is the
    project's: |skill| < 1% (plots.NOISE_BAND) on a single series is noise. A per-series
    DM p exists for close only, so the one rule serves every skill column."""
    try:
        pct = float(value)
    except ValueError:  # "-": not scored
        return ""
    if abs(pct) < 100 * plots_lib.NOISE_BAND:
        return ""
    return "pos" if pct > 0 else "neg"


def _cell(header: str, value: str, link_series: bool) -> str:
    cls = "text" if header in TEXT_COLUMNS else ""
    if header in SKILL_COLUMNS:
        cls = _skill_class(value)
    link = link_series and header == "series"
    value_html = f'<a href="#{_anchor(value)}">{_e(value)}</a>' if link else _e(value)
    return f'<td class="{cls}">{value_html}</td>' if cls else f"<td>{value_html}</td>"


def table_html(table_id: str, headers, rows, link_series: bool = True) -> str:
    """A sortable table: every header is a button that sorts by its column; with
    link_series, a "series" cell links to that series' section."""
    head = "".join(
        f'<th class="{"text" if h in TEXT_COLUMNS else ""}" scope="col">'
        f'<button type="button">{_e(h)}</button></th>'
        for h in headers
    )
    body = "".join(
        "<tr>"
        + "".join(_cell(h, v, link_series) for h, v in zip(headers, row, strict=True))
        + "</tr>"
        for row in rows
    )
    return (
        f'<table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


def _figure(path: str | None, alt: str, caption: str) -> str:
    if not path or not os.path.exists(path):
        return ""
    return (
        f'<figure><img src="{data_uri(path)}" alt="{_e(alt)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _kept_epoch(entry: dict) -> str:
    """The kept epoch in words: an epoch, 0 for the untrained baseline, "-" for none."""
    kept = tables.kept_epoch(entry)
    return "0 (the untrained baseline, kept)" if kept == "0" else kept


def _series_facts(entry: dict) -> str:
    """One line on how a series trained: status, best epoch, epochs run, close skill."""
    skill = plots_lib.skill_of(entry, "close")
    parts = [
        f"status {entry.get('status', '-')}",
        f"best epoch {_kept_epoch(entry)} of {entry.get('epochs_run') or '-'} run",
        "test close skill " + ("-" if skill is None else f"{100 * skill:+.2f}%"),
    ]
    return ", ".join(parts)


def _series_sections(results: dict, by_name: dict) -> str:
    """One block per series: its training facts, loss curves and forecast plot."""
    blocks = []
    for name, entry in sorted(results.get("series", {}).items()):
        loss = by_name.get(plots_lib.plot_name("loss", name))
        fc = by_name.get(plots_lib.plot_name("forecast", name))
        figs = _figure(
            loss,
            f"{name} loss curves",
            "train and validation loss; the star marks the kept model (epoch 0: the "
            "untrained baseline)",
        ) + _figure(
            fc,
            f"{name} forecasts",
            "predicted vs actual close of test windows, with persistence (the last close "
            "held); bars are each predicted candle's low-high range, not an uncertainty band",
        )
        blocks.append(
            f'<article id="{_anchor(name)}"><h3>{_e(name)}</h3>'
            f"<p>{_e(_series_facts(entry))}</p>"
            f'<div class="figs">{figs or "<p>(no plots)</p>"}</div></article>'
        )
    return "".join(blocks) or "<p>No series was scored.</p>"


def _header(results: dict, spec: ReportSpec, title: str) -> str:
    d = spec.data
    model = (
        f"{spec.model} ({spec.decoding}), lookback {d.lookback} -> horizon "
        f"{d.horizon}, normalization {d.normalization}"
    )
    return (
        f"<header><h1>{_e(title)}</h1><p>{_e(model)}</p>"
        f"<p>data: {_e(tables.data_description(d, results))}</p></header>"
    )


def _summary(results: dict) -> str:
    lines = "".join(f"<li>{_e(s)}</li>" for s in tables.summary_lines(results))
    facts = "".join(
        f"<li>{_e(line[2:])}</li>" for line in tables.fact_lines("", results.get("run") or {})
    )
    return (
        f'<section id="summary"><h2>Summary</h2><ul>{lines}</ul>'
        f'<details><summary>Run facts</summary><ul class="facts">{facts}</ul></details>'
        "</section>"
    )


def _tables(results: dict, model: str) -> str:
    rows = tables.table_rows(results, model)
    baselines = tables.baseline_rows(results)
    return (
        '<section id="results"><h2>Results (test split, price units)</h2>'
        + table_html("results-table", tables.HEADERS, rows)
        + f'<p class="legend">{_e(tables.LEGEND)}</p>'
        + f'<p class="legend">{_e(tables.STATUS_LEGEND)}</p></section>'
        + '<section id="baselines"><h2>Baselines: test skill % against the better naive '
        "forecast</h2>"
        + table_html("baselines-table", tables.BASELINE_HEADERS, baselines)
        + '<p class="legend">Ridge, band and HAR are fitted on train+val only.</p></section>'
    )


def _sweep(results: dict) -> str:
    """A sweep run's section (as report.md's); "" for any other run."""
    rows = report_sweep.setting_rows(results)
    if not rows:
        return ""
    lines = "".join(f"<li>{_e(s)}</li>" for s in report_sweep.choice_lines(results))
    return (
        f'<section id="sweep"><h2>Sweep</h2><ul>{lines}</ul>'
        + table_html("sweep-table", report_sweep.HEADERS, rows, link_series=False)
        + f'<p class="legend">{_e(report_sweep.LEGEND)}</p></section>'
    )


def _ablate(results: dict) -> str:
    """An ablate run's section (as report.md's); "" for any other run."""
    if not results.get("ablate"):
        return ""
    lines = "".join(f"<li>{_e(s)}</li>" for s in results["ablate"]["sentences"])
    settings = ablate_section.setting_rows(results)
    gains = ablate_section.gain_rows(results)
    return (
        f'<section id="ablate"><h2>Ablation</h2><ul>{lines}</ul>'
        + table_html("ablate-settings", ablate_section.SETTING_HEADERS, settings, link_series=False)
        + table_html("ablate-gains", ablate_section.GAIN_HEADERS, gains, link_series=False)
        + f'<p class="legend">{_e(ablate_section.LEGEND)}</p></section>'
    )


def _skipped(results: dict, heading: str = "Skipped series") -> str:
    skipped = results.get("skipped") or {}
    if not skipped:
        return ""
    items = "".join(f"<li>{_e(n)}: {_e(r)}</li>" for n, r in sorted(skipped.items()))
    return f'<section id="skipped"><h2>{_e(heading)}</h2><ul>{items}</ul></section>'


def _page(title: str, header: str, nav_items, body: str) -> str:
    """A whole self-contained page: head, header, nav, main body, sort script."""
    nav = "".join(f'<a href="#{i}">{t}</a>' for i, t in nav_items)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{_e(title)}</title><style>{CSS}</style></head>'
        f"<body>{header}<nav>{nav}</nav><main>{body}"
        f"</main><script>{SORT_JS}</script></body></html>\n"
    )


def render_html(
    results: dict, spec: ReportSpec, plots: list[str], title: str = "cpbjax report"
) -> str:
    """The report page.

    Args:
      results: the results.json dict ({"run", "series", "skipped"}).
      spec: the run's ReportSpec (model and data facts).
      plots: paths of the PNGs `tables.write_plots` wrote (named by `plots.plot_name`);
        empty when eval.plots is off.
      title: the page title.
    """
    by_name = {os.path.basename(p): p for p in plots}
    skill = _figure(by_name.get(plots_lib.plot_name("skill")), "skill chart", "")
    no_plots = "" if plots else "<p>Plots are off (eval.plots=False) or there was none.</p>"
    nav = (
        ("summary", "Summary"),
        ("results", "Results"),
        ("baselines", "Baselines"),
        *((("sweep", "Sweep"),) if report_sweep.setting_rows(results) else ()),
        *((("ablate", "Ablation"),) if results.get("ablate") else ()),
        ("skill", "Skill"),
        ("series", "Series"),
    )
    body = (
        _summary(results)
        + _tables(results, spec.model)
        + _sweep(results)
        + _ablate(results)
        + f'<section id="skill"><h2>Skill per series</h2>{skill or no_plots}</section>'
        + f'<section id="series"><h2>Series</h2>{_series_sections(results, by_name)}</section>'
        + _skipped(results)
    )
    return _page(title, _header(results, spec, title), nav, body)


def render_backtest_html(backtest: dict, spec: ReportSpec, chart: str | None) -> str:
    """The backtest page: what backtest.md holds, and the skill-per-fold chart.

    Args:
      backtest: the backtest.json dict. spec: the run's ReportSpec.
      chart: the path of `plots.plot_fold_skill`'s PNG, or None (eval.plots off).
    """
    title = "cpbjax backtest"
    settings = tables.fact_lines("backtest.", backtest.get("backtest") or {}, skip=())
    settings += tables.fact_lines("", backtest.get("run") or {})
    facts = "".join(f"<li>{_e(line[2:])}</li>" for line in settings)
    figure = _figure(chart, "skill per fold", "each dot one series' test skill in that fold")
    body = (
        f'<section id="run"><h2>Run</h2><ul class="facts">{facts}</ul></section>'
        '<section id="folds"><h2>Skill per fold over time (test blocks, price units)</h2>'
        + (figure or "<p>Plots are off (eval.plots=False).</p>")
        + table_html(
            "folds-table", backtest_tables.FOLD_HEADERS, backtest_tables.fold_rows(backtest), False
        )
        + f'<p class="legend">{_e(backtest_tables.FOLD_LEGEND)}</p></section>'
        '<section id="pooled"><h2>Pooled over folds</h2>'
        + table_html(
            "pooled-table", backtest_tables.POOLED_HEADERS, backtest_tables.pooled_rows(backtest)
        )
        + f'<p class="legend">{_e(backtest_tables.POOLED_LEGEND)}</p></section>'
        + _skipped(backtest, "Skipped series and folds")
    )
    nav = (("run", "Run"), ("folds", "Folds"), ("pooled", "Pooled"))
    return _page(title, _header(backtest, spec, title), nav, body)
