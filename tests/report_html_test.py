"""Tests of cpbjax/report/html_page.py: the page's content, and its render in headless Chromium.

The browser test drives the OS's Chromium (/usr/bin/chromium, or $CPBJAX_CHROMIUM) with
the `playwright` package; it never downloads a browser. Without either it skips and
says why. Its screenshot goes to the pytest tmp dir and, when $CPBJAX_ARTIFACTS is set,
is copied there; the test prints both paths.
"""

import io
import os
import re
import shutil

import pytest
from rich.console import Console

from cpbjax.report import html_page as report_html
from cpbjax.report import plots
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report import tables as report_tables
from tests.fake_data import forecast_record, report_config, report_history, report_results

NAMES = ("BTCUSDT-1h", "ETHUSDT-1h")
CHROMIUM = os.environ.get("CPBJAX_CHROMIUM", "/usr/bin/chromium")
# Headless as root, offline: no sandbox (root), no GPU, no background traffic of any kind.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
SKILL_COLUMN = report_tables.HEADERS.index("skill%") + 1  # 1-based, for :nth-child


# A sweep run's results.json "sweep" block (cpbjax/modes/sweep.py): 2 settings, both series
# tied on the second, which the first (grid order) won.
SWEEP = {
    "fields": {"learning_rate": [0.001, 0.003]},
    "settings": ["lr=0.001", "lr=0.003"],
    "select": "series",
    "by_setting": {
        "lr=0.001": {
            "median_val_loss": 0.8,
            "relative_val_loss": 1.0,
            "chosen_by": 2,
            "lowest_on": 2,
        },
        "lr=0.003": {
            "median_val_loss": 0.8,
            "relative_val_loss": 1.0,
            "chosen_by": 0,
            "lowest_on": 2,
        },
    },
    "tied_series": list(NAMES),
}


def _write(workdir, plots_on=True, results=None, sweep=None):
    records = {n: forecast_record(n, i) for i, n in enumerate(NAMES)}
    results = results or report_results(records)
    if sweep:
        results["sweep"] = sweep
    for i, name in enumerate(NAMES):
        results["series"][name]["best_epoch"] = 2 + i
    report.write_reports(
        str(workdir),
        results,
        report_spec.make_spec(report_config(plots=plots_on)),
        report.PlotInputs(report_history(NAMES), records),
        console=Console(file=io.StringIO()),
    )
    with open(os.path.join(workdir, "report.html")) as f:
        return f.read()


def test_page_is_self_contained(tmp_path):
    page = _write(tmp_path)
    assert page.startswith("<!doctype html>")
    # Nothing is fetched from anywhere: no external src/href, no script or style file.
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<script src" not in page and 'rel="stylesheet"' not in page
    # The skill chart, then loss curves and forecasts of both series, inlined.
    assert page.count('src="data:image/png;base64,') == 1 + 2 * len(NAMES)
    assert 'id="results-table"' in page and 'id="baselines-table"' in page
    for name in NAMES:
        assert f'<a href="#s-{name}">{name}</a>' in page
        assert f'<article id="s-{name}">' in page
    assert page.count(report_tables.LEGEND.split(";")[0]) == 1
    assert "stopped_early = no validation improvement" in page
    assert "best epoch 2 of 3 run" in page and "best epoch 3 of 3 run" in page
    assert "LUNAUSDT-1h: only 10 usable candles" in page


def test_page_without_plots_and_escaping(tmp_path):
    records = {n: forecast_record(n, i) for i, n in enumerate(NAMES)}
    results = report_results(records)
    results["skipped"] = {"X-1h": "<script>alert(1)</script>"}
    page = _write(tmp_path, plots_on=False, results=results)
    assert "data:image/png" not in page and "Plots are off" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page
    assert "(no plots)" in page


def test_markdown_fixes(tmp_path):
    _write(tmp_path)
    with open(os.path.join(tmp_path, "report.md")) as f:
        md = f.read()
    assert md.count("- model:") == 1  # the run facts' own "model" is not repeated
    assert md.count(report_tables.LEGEND) == 1 and md.count(report_tables.STATUS_LEGEND) == 1
    for line in report_tables.summary_lines(
        report_results({n: forecast_record(n, i) for i, n in enumerate(NAMES)})
    ):
        assert md.count(line) == 1
    assert "- data: synthetic (generated offline" in md and "months" not in md
    assert "### BTCUSDT-1h" in md


def test_table_cells_link_and_colour():
    rows = [["A-1h", "+1.50"], ["B-1h", "-"], ["C-1h", "+0.00"], ["D-1h", "-0.99"], ["E", "-1.00"]]
    table = report_html.table_html("t", ("series", "skill%"), rows)
    assert '<td class="text"><a href="#s-A-1h">A-1h</a></td>' in table
    assert '<td class="pos">+1.50</td>' in table and "<td>-</td>" in table
    # Only a skill that clears the noise band (|skill| >= 1% on one series) is coloured.
    assert "<td>+0.00</td>" in table and "<td>-0.99</td>" in table
    assert '<td class="neg">-1.00</td>' in table
    assert table.count("<button") == 2


def test_a_sweep_run_has_a_sweep_section(tmp_path):
    page = _write(tmp_path, sweep=SWEEP)
    assert '<a href="#sweep">Sweep</a>' in page and '<section id="sweep">' in page
    section = page.split('<section id="sweep">')[1].split("</section>")[0]
    assert "lr=0.001 by 2 series" in section
    assert "2 of 2 series had several settings at their lowest val loss" in section
    assert (
        '<td class="text">lr=0.003</td><td>0.8</td><td>1.0000</td><td>0</td><td>2</td>' in section
    )
    with open(os.path.join(tmp_path, "report.md")) as f:
        md = f.read()
    assert "## Sweep" in md and "| lr=0.003 | 0.8 | 1.0000 | 0 | 2 |" in md
    assert "sweep" not in _write(tmp_path / "plain")  # no section without a sweep


def test_fact_lines_round_seconds():
    lines = report_tables.fact_lines(
        "", {"wall_seconds": 29.033158540725708, "model": "gru", "x": 0.1}
    )
    assert lines == ["- wall_seconds: 29.0", "- x: 0.1"]


def test_quote_asset_and_plot_names():
    assert plots.quote_asset("BTCUSDT") == "USDT" and plots.quote_asset("ETHBTC") == "BTC"
    assert plots.quote_asset("USDT") == "price"
    assert plots.plot_name("loss", "BTCUSDT-1h") == "loss-BTCUSDT-1h.png"


def _skip(reason: str):
    print(f"SKIPPED headless-browser test: {reason}")
    pytest.skip(reason)


def _sync_playwright():
    try:
        from playwright.sync_api import sync_playwright  # noqa: PLC0415
    except ImportError as e:
        _skip(f"the playwright package is not installed ({e}); pip install -e '.[test]'")
    if not os.access(CHROMIUM, os.X_OK):
        _skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (as .ci/run does)")
    return sync_playwright


def _keep_screenshot(path: str) -> None:
    print(f"report.html screenshot: {path}")
    folder = os.environ.get("CPBJAX_ARTIFACTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        kept = shutil.copy(path, os.path.join(folder, "report_html.png"))
        print(f"report.html screenshot kept as an artifact: {kept}")


def _open(context, url: str, errors: list, blocked: list):
    """A page at `url` that records console errors and blocks every non-local request."""

    def route(r):
        local = r.request.url.startswith(("file://", "data:"))
        (r.continue_ if local else r.abort)()
        if not local:
            blocked.append(r.request.url)

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load", timeout=30_000)
    return page


def _skill_values(page) -> list[float]:
    cells = page.locator(f"#results-table tbody td:nth-child({SKILL_COLUMN})").all_inner_texts()
    return [float(c) for c in cells]


@pytest.mark.slow
def test_page_renders_in_headless_chromium(tmp_path):
    sync_playwright = _sync_playwright()
    _write(tmp_path, sweep=SWEEP)
    url = "file://" + os.path.join(tmp_path, "report.html")
    shot = str(tmp_path / "report_html.png")
    errors, blocked = [], []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1366, "height": 900},
            timeout=60_000,
        )
        try:
            page = _open(context, url, errors, blocked)
            rows = page.locator("#results-table tbody tr").count()
            sweep_rows = page.locator("#sweep-table tbody tr").count()
            images = page.evaluate(
                "Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)"
            )
            page.click(f"#results-table th:nth-child({SKILL_COLUMN}) button")
            ascending = _skill_values(page)
            page.click(f"#results-table th:nth-child({SKILL_COLUMN}) button")
            descending = _skill_values(page)
            page.screenshot(path=shot, full_page=True, timeout=30_000)
        finally:
            context.close()
    _keep_screenshot(shot)
    assert errors == [] and blocked == []
    assert rows == len(NAMES) and sweep_rows == len(SWEEP["by_setting"])
    assert images == [True] * (1 + 2 * len(NAMES))
    assert ascending == sorted(ascending) and descending == sorted(ascending, reverse=True)
    assert os.path.getsize(shot) > 10_000
