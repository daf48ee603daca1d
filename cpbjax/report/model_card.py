"""The model card (README.md) of an exported series model, written from its measured metrics.

Every claim in the card is computed from the series' results.json entry: its skill
against the better naive forecast and the fitted baselines on the validation and test
splits. "Intended use and limits" follows from those numbers, so a model that does not
beat persistence on close says so.
"""

from __future__ import annotations

from cpbjax import columns

NOISE = 0.01  # |skill| below this on one series is noise


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:+.2f}%"


def _skill(entry: dict, split: str, col: str, block: str | None = None):
    """Skill on `split` of the model (block None) or a fitted baseline ('ridge', 'vol_band')."""
    scores = entry.get(split) or {}
    if block is not None:
        scores = scores.get(block) or {}
    return ((scores.get("columns") or {}).get(col) or {}).get("skill")


def _metrics_table(entry: dict) -> list[str]:
    lines = [
        "| column | val skill | test skill | test: ridge | test: volatility band |",
        "|---|---|---|---|---|",
    ]
    for col in columns.COLUMNS:
        cells = [
            _skill(entry, "val", col),
            _skill(entry, "test", col),
            _skill(entry, "test", col, "ridge"),
            _skill(entry, "test", col, "vol_band"),
        ]
        lines.append(f"| {col} | " + " | ".join(_pct(c) for c in cells) + " |")
    return lines


def _limits(entry: dict) -> list[str]:
    """Plain statements of what the test metrics allow and forbid."""
    out = []
    close = _skill(entry, "test", "close")
    dm = ((entry.get("test") or {}).get("dm") or {}).get("p_value_better")
    if close is None or close < NOISE or dm is None or dm >= 0.05:
        out.append(
            f"- It does **not** beat persistence on close (test skill {_pct(close)}, "
            f"Diebold–Mariano p = {dm if dm is None else f'{dm:.3f}'}): do not use it "
            "to predict the direction or level of the close."
        )
    for col in ("high", "low"):
        model, band = _skill(entry, "test", col), _skill(entry, "test", col, "vol_band")
        if model is not None and band is not None and band >= model:
            out.append(
                f"- On {col}, the two-parameter volatility band scores {_pct(band)} against "
                f"the model's {_pct(model)}: prefer the band for {col}-based ranges."
            )
    if not out:
        out.append("- On this series' test split it beats the naive and fitted baselines above.")
    return out


def _interval(entry: dict) -> list[str]:
    """The calibrated interval's test coverage and pinball skill against the band, if any."""
    block = (entry.get("test") or {}).get("calibrated_interval")
    if not block:
        return []
    lo, hi = block["central"]
    cols = block["columns"]
    cells = ", ".join(
        f"{col} {100 * cols[col]['coverage']:.1f}% (pinball skill against the band "
        f"{_pct(cols[col]['skill_vs_band'])})"
        for col in ("close", "high", "low")
    )
    return [
        f"Forecasts carry a {100 * (hi - lo):.0f}% interval (levels {lo} and {hi}, "
        f"fitted on train+val, `interval.json`); on test it covered {cells}.",
        "",
    ]


def _best_epoch(entry: dict, model: dict) -> str:
    """The kept epoch; with a baseline, none means the untrained model (the baseline) won,
    and with train.init_from the starting model."""
    if entry.get("best_epoch"):
        return str(entry["best_epoch"])
    if entry.get("started_from"):  # train.init_from: the start was the first best
        return f"none (no epoch beat the starting model of {entry['started_from']}, which is kept)"
    if model.get("baseline", "none") == "none":
        return "none"
    return "none (no epoch beat the untrained baseline, which is kept)"


def _header(meta: dict, entry: dict) -> list[str]:
    """The title, what the model forecasts, and the Data section."""
    data = entry.get("data") or {}
    model = meta.get("model") or {}
    d = (meta.get("config") or {}).get("data") or {}
    members = model.get("ensemble", 1)
    ensemble = f", the mean forecast of {members} members trained together" if members > 1 else ""
    return [
        f"# {meta['series']}: cpbjax {model.get('name', '?')} forecaster",
        "",
        f"Forecasts the next {d.get('horizon')} {meta['interval']} OHLC candles of "
        f"{meta['symbol']} from the last {d.get('lookback')}, "
        f"{model.get('decoding', '?')} decoding, {meta.get('num_params')} parameters{ensemble}.",
        "",
        "## Data",
        "",
        f"- source: {data.get('source')}; candles {data.get('first')} to {data.get('last')} "
        f"({data.get('used_candles')} used); windows "
        + " / ".join(f"{k} {v}" for k, v in (data.get("windows") or {}).items()),
        f"- training status: {entry.get('status')}, best epoch {_best_epoch(entry, model)}",
        "",
    ]


# The card's last section: loading the export with and without cpbjax.
_USE = [
    "## Use",
    "",
    "```python",
    "import cpbjax",
    'model = cpbjax.load("path/to/this/folder")',
    "forecast = model.predict(candles_df)  # next candles, a DataFrame",
    "```",
    "",
    "Without cpbjax: `jax.export.deserialize(open('forward.jax_export', 'rb').read())"
    ".call(params, x_BLF)` on windows normalised as `normalization.json` says.",
    "",
]


def render(meta: dict, entry: dict) -> str:
    """The README.md text of an exported model (meta: its meta.json; entry: its results)."""
    synthetic = (entry.get("data") or {}).get("source") == "synthetic"
    lines = [
        *_header(meta, entry),
        "## Metrics (skill = 1 − MAE / MAE of the better naive forecast, price units)",
        "",
        *_metrics_table(entry),
        "",
        "On one series |skill| < 1% is noise. The test split was never used for any choice.",
        "",
        *_interval(entry),
        "## Intended use and limits",
        "",
        "- Research and monitoring of short-horizon ranges; not investment advice.",
        *(
            ["- Trained on synthetic data (the offline demo): it models no real market."]
            if synthetic
            else []
        ),
        *_limits(entry),
        "- Forecast candles are made consistent: high ≥ max(open, close), low ≤ min(open, close).",
        "",
        *_USE,
    ]
    return "\n".join(lines)
