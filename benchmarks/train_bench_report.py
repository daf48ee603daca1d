"""train_bench's tables: the whole-suite estimate, each row's share of the matmul peak and
its ratio ceiling, and the markdown report."""

from __future__ import annotations

import dataclasses
import math
import statistics

from benchmarks import common


@dataclasses.dataclass
class Results:
    """Every table's rows, filled model by model."""

    throughput: list = dataclasses.field(default_factory=list)
    ratios: list = dataclasses.field(default_factory=list)
    suite: list = dataclasses.field(default_factory=list)


def suite_rows(config, rows: list[dict], torch_s: dict | None, n_series: int) -> list[dict]:
    """Time to train all `n_series` series at config.train.epochs, per measured K and torch.

    cpbjax: compile once (every group shares the program) + groups x epochs x s/epoch.
    Early stopping can only shorten these (a group stops when its last coin stops),
    and no typical stopping epoch was measured, so that column is an upper bound.
    """
    epochs = config.train.epochs
    out = []
    for r in rows:
        groups = math.ceil(n_series / r["K"])
        seconds = r["lower_s"] + r["compile_s"] + groups * epochs * r["s_per_epoch"]
        out.append(
            {
                "model": r["model"],
                "decoding": r["decoding"],
                "dtype": r["dtype"],
                "system": f"cpbjax K={r['K']}",
                "groups": groups,
                "epochs": epochs,
                "compile_s": r["lower_s"] + r["compile_s"],
                "no_early_stop_min": seconds / 60,
                "early_stop_min": f"<= {seconds / 60:.4g} (upper bound)",
            }
        )
    if torch_s:
        best = min(statistics.median(s) for s in torch_s.values())
        seconds = n_series * epochs * best
        out.append(
            {
                "model": config.model.name,
                "decoding": config.model.decoding,
                "system": "torch loop",
                "groups": n_series,
                "epochs": epochs,
                "no_early_stop_min": seconds / 60,
                "early_stop_min": f"<= {seconds / 60:.4g} (upper bound)",
            }
        )
    return out


def add_peak_share(rows: list[dict], peaks: dict) -> None:
    """Sets each row's `pct_of_peak`: achieved FLOP/s over the peak of its compute dtype."""
    for row in rows:
        peak = peaks.get(row["dtype"])
        row["pct_of_peak"] = 100 * row["achieved_tflops"] / peak["tflops"] if peak else None


def add_ratio_ceiling(ratios: list[dict], throughput: list[dict]) -> None:
    """Sets each ratio row's `ratio_at_peak`: the ratio if cpbjax's epoch ran its matmul
    FLOPs at the measured peak (ratio x 100 / pct_of_peak), the most that any program
    doing the same matmul work on this machine could reach against this torch figure."""
    keys = ("model", "decoding", "dtype", "K")
    share = {tuple(r[k] for k in keys): r["pct_of_peak"] for r in throughput}
    for row in ratios:
        pct = share.get(tuple(row[k] for k in keys))
        row["ratio_at_peak"] = 100 * row["ratio"] / pct if pct else None


_THROUGHPUT_COLUMNS = (
    "model",
    "decoding",
    "dtype",
    "K",
    "K_padded",
    "lower_s",
    "compile_s",
    "epochs",
    "s_per_epoch",
    "s_per_coin_epoch",
    "gflop_per_epoch",
    "xla_flops",
    "achieved_tflops",
    "pct_of_peak",
    "program_mib",
    "peak_mib",
    "peak_kind",
    "epoch_s_all",
)
_SUITE_COLUMNS = (
    "model",
    "decoding",
    "dtype",
    "system",
    "groups",
    "epochs",
    "compile_s",
    "no_early_stop_min",
    "early_stop_min",
)


def _ratio_columns(rows: list[dict]) -> list[str]:
    torch_cols = sorted(
        {c for r in rows for c in r if c.startswith("torch_") and c.endswith(("t_s", "t_n"))}
    )
    return [
        "model",
        "decoding",
        "dtype",
        "K",
        "torch_decoding",
        *torch_cols,
        "torch_best_threads",
        "cpbjax_s_per_epoch",
        "ratio",
        "ratio_at_peak",
        "alternated",
    ]


def report(results: Results, peaks: dict, notes: list[str]) -> str:
    """The markdown sections: matmul peak, throughput, side by side, suite estimate."""
    parts = [
        "Matmul peak (jitted, one n x n product per device at once, median):\n",
        common.markdown_table(list(peaks.values()), ("dtype", "shape", "seconds", "tflops")),
        "\ncpbjax throughput (seconds are wall time of one jitted epoch, metrics blocked on;"
        " FLOPs are matmul FLOPs counted from the jaxpr, scans times their length):\n",
        common.markdown_table(results.throughput, _THROUGHPUT_COLUMNS),
    ]
    if results.ratios:
        parts += [
            "\nSide by side, ratio = torch s/model-epoch x K / cpbjax s/epoch"
            " (torch: median model-epoch, warm-up of each call left out; the faster"
            " thread setting counts; torch decodes as cpbjax does, torch_decoding, so each"
            " ratio is direct vs direct or autoregressive vs autoregressive; ratio_at_peak ="
            " the ratio had cpbjax run its matmul FLOPs at the measured peak, the ceiling"
            " for any program doing the same matmul work):\n",
            common.markdown_table(results.ratios, _ratio_columns(results.ratios)),
        ]
    parts += [
        "\nWhole-suite estimate at default epochs:\n",
        common.markdown_table(results.suite, _SUITE_COLUMNS),
    ]
    return "".join(parts) + "".join(f"\n{line}\n" for line in notes)
