"""The replaced system's PyTorch training loop, kept as slow as it was: the speed baseline.

What is faithful to the old system, on purpose (cpbjax removes each of these):
  - one model per series, trained one after another;
  - windows materialised as tensors, a Python loop over shuffled index batches, and
    `loss.item()` (a host synchronisation) after every step;
  - the transformer re-runs its UNMASKED decoder over the whole growing target
    sequence at every one of the H steps (O(H^2)), decides teacher forcing per step
    with a host `random.random()`, and uses teacher forcing even in validation;
  - the GRU decides teacher forcing once per batch (all or nothing) with a host draw;
    the LSTM does the same, and its nn.MultiheadAttention re-projects the encoder
    keys and values at every decoding step.
The models are in benchmarks/torch_models.py. The batches are index gathers on pre-built
tensors rather than a torch DataLoader, which is slightly faster than the old loop, so
the baseline errs in torch's favour.

decoding="direct" (--decoding direct) swaps only the decoder for cpbjax's direct one,
so cpbjax's default can be compared direct against direct: the transformer feeds H
learned queries through its decoder in one unmasked pass, the GRU and the LSTM map
[last encoder output; attention context] to all H candles with their head and have no
decoder. No teacher forcing and no host draws then; the loop's quirks above stay.

Data, batch sizes and optimiser settings are read from cpbjax's own default configs
(configs/<model>.py), and windows are normalised like cpbjax's default `last_close`:
x = log(ohlc[t-L+1..t] / close[t]), y = log(ohlc[t+1..t+H] / close[t]).

Threads: torch.set_num_threads(os.cpu_count()) unless --threads says otherwise, so
torch may use every core, as cpbjax's XLA does. On a shared, loaded machine torch's
OpenMP workers spin-wait for each other, and a step can be far slower with 2 threads
than with 1 (a GRU step: 1.7 s against 0.12 s at load 8 on 2 cores), so time torch
at both thread counts and quote its faster figure; otherwise the ratio flatters cpbjax.

Usage:
  python benchmarks/torch_baseline.py --model gru --series 2 --epochs 2 [--decoding direct]
  Each run also writes its table to a new file benchmarks/records/torch_baseline-<UTC time>.md
  (--records-dir DIR elsewhere, --records-dir "" none).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):  # Run as a script: make the repo root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from benchmarks.torch_models import (  # noqa: E402
    DECODINGS,
    EXPECTED_PARAMS,
    MODELS,
    build_model,
)
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.data import sources, windows  # noqa: E402
from cpbjax.data.series import Series  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- data


def load_series(data_cfg, n_series: int) -> list[Series]:
    """The first `n_series` series of data.symbols x data.intervals, from cpbjax's source.

    Uses the first symbols of the config at every interval, in config order, so
    the baseline trains on exactly the series a cpbjax run of that config loads.

    Raises:
      ValueError: if fewer than `n_series` series load (the skip reasons are named).
    """
    n_symbols = math.ceil(n_series / len(data_cfg.intervals))
    data_cfg.symbols = tuple(data_cfg.symbols)[:n_symbols]
    series, skipped = sources.load_all(data_cfg)
    if len(series) < n_series:
        raise ValueError(f"only {len(series)} of {n_series} series loaded; skipped: {skipped}")
    return series[:n_series]


def materialise_windows(ohlc_T4: np.ndarray, ends_N: np.ndarray, lookback: int, horizon: int):
    """All windows ending at `ends_N`, as the old loop held them: one big tensor each.

    Returns:
      x_NLF: float32 [N, L, 4] = log(ohlc[t-L+1..t] / close[t]);
      y_NHC: float32 [N, H, 4] = log(ohlc[t+1..t+H] / close[t]).
    """
    close_N = ohlc_T4[ends_N, 3]
    in_idx_NL = ends_N[:, None] + np.arange(-lookback + 1, 1)[None, :]
    out_idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    x_NLF = np.log(ohlc_T4[in_idx_NL] / close_N[:, None, None])
    y_NHC = np.log(ohlc_T4[out_idx_NH] / close_N[:, None, None])
    return torch.from_numpy(x_NLF.astype(np.float32)), torch.from_numpy(y_NHC.astype(np.float32))


def prepare_windows(series: list[Series], data_cfg) -> list[dict]:
    """Materialised train/val windows of each series, split and purged by cpbjax.

    Returns:
      One dict per series: {"name", "train": (x_NLF, y_NHC), "val": (x_NLF, y_NHC)}.

    Raises:
      ValueError: if the data config is not OHLC features with last_close windows.
    """
    if tuple(data_cfg.features) != ("open", "high", "low", "close"):
        raise ValueError(f"data.features={tuple(data_cfg.features)!r}: the baseline is OHLC only")
    if data_cfg.normalization != "last_close":
        raise ValueError(f"data.normalization={data_cfg.normalization!r}: expected last_close")
    out = []
    for s in series:
        prep = windows.prepare_series(s, data_cfg)
        split = {
            k: materialise_windows(prep.ohlc, prep.ends[k], data_cfg.lookback, data_cfg.horizon)
            for k in ("train", "val")
        }
        out.append({"name": s.name, **split})
    return out


def default_config(model_name: str):
    """cpbjax's config for `model_name` as the replaced system trained it
    (`configs/<model>.py:replaced`: one model per series at its old size and learning
    rate, unscaled windows, MSE)."""
    if model_name not in MODELS:
        raise ValueError(f"model {model_name!r} is not one of {', '.join(MODELS)}")
    return config_lib.load(str(REPO / "configs" / f"{model_name}.py") + ":replaced")


def benchmark_windows(model_name: str, n_series: int, n_candles: int) -> list[dict]:
    """Windows of `n_series` synthetic series of `n_candles`, with the model's data config.

    The series are cpbjax's `synthetic` source (GARCH candles) for the default symbols.
    """
    data_cfg = default_config(model_name).data
    data_cfg.source = "synthetic"
    data_cfg.synthetic_candles = data_cfg.max_candles = data_cfg.min_candles = n_candles
    return prepare_windows(load_series(data_cfg, n_series), data_cfg)


# ---------------------------------------------------------------- the old loop


def make_optimizer(model: nn.Module, train_cfg) -> torch.optim.Optimizer:
    """Adam (L2 weight decay) or AdamW (decoupled), as cpbjax's config names it."""
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[train_cfg.optimizer]
    return opt(model.parameters(), lr=train_cfg.learning_rate, weight_decay=train_cfg.weight_decay)


def train_epoch(model, opt, x_NLF, y_NHC, train_cfg, generator=None) -> float:
    """One pass over shuffled batches; returns the mean training MSE."""
    model.train()
    perm = torch.randperm(len(x_NLF), generator=generator)
    total = 0.0
    for i in range(0, len(perm), train_cfg.batch_size):
        idx = perm[i : i + train_cfg.batch_size]
        x_BLF, y_BHC = x_NLF[idx], y_NHC[idx]
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x_BLF, y_BHC, train_cfg.teacher_forcing), y_BHC)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        opt.step()
        total += loss.item() * len(idx)  # A host sync every step, as the old loop had.
    return total / len(perm)


@torch.no_grad()
def validate_epoch(model, x_NLF, y_NHC, train_cfg) -> float:
    """The mean validation MSE (teacher forcing only where the old model used it)."""
    model.eval()
    tf = train_cfg.teacher_forcing if model.teacher_forcing_in_validation else 0.0
    total = 0.0
    for i in range(0, len(x_NLF), train_cfg.batch_size):
        x_BLF, y_BHC = x_NLF[i : i + train_cfg.batch_size], y_NHC[i : i + train_cfg.batch_size]
        total += nn.functional.mse_loss(model(x_BLF, y_BHC, tf), y_BHC).item() * len(x_BLF)
    return total / len(x_NLF)


def _train_one_series(model_name, windows_s, epochs, cfg, decoding, seed) -> list[dict]:
    """Trains one fresh model on one series; returns per-epoch timings and losses."""
    torch.manual_seed(seed)
    random.seed(seed)
    train_cfg = cfg.train
    model = build_model(model_name, cfg.data.horizon, decoding)
    opt = make_optimizer(model, train_cfg)
    gen = torch.Generator().manual_seed(seed)
    stats = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        train_loss = train_epoch(model, opt, *windows_s["train"], train_cfg, gen)
        t1 = time.perf_counter()
        val_loss = validate_epoch(model, *windows_s["val"], train_cfg)
        t2 = time.perf_counter()
        stats.append(
            {
                "train_s": t1 - t0,
                "val_s": t2 - t1,
                "epoch_s": t2 - t0,
                "train_loss": train_loss,
                "val_loss": val_loss,
            }
        )
    return stats


def time_torch_epochs(
    model_name: str,
    series_windows: list[dict],
    epochs: int,
    threads=None,
    seed: int = 0,
    decoding: str = "autoregressive",
) -> dict:
    """Trains one model per series, one after another, and times every model-epoch.

    A model-epoch is one training pass plus one validation pass of one series'
    model. The very first model-epoch of the run is the warm-up (torch's allocator
    and thread pool) and is reported apart; the figure is the median of the rest.

    Args:
      model_name: transformer | gru | lstm; hyperparameters come from configs/<model>.py.
      series_windows: from `prepare_windows` / `benchmark_windows`.
      epochs: epochs per series.
      threads: torch intra-op threads; None = os.cpu_count().
      seed: seeds torch, the host `random` and the shuffles (series i uses seed + i).
      decoding: autoregressive (the old loop's) | direct (cpbjax's default).

    Returns:
      {"model", "decoding", "params", "series", "epochs", "threads", "warmup_epoch_s",
       "seconds_per_model_epoch", "train_s", "val_s" (medians), "epoch_s" (all),
       "train_loss", "val_loss" (last model's last epoch)}.

    Raises:
      ValueError: if fewer than two model-epochs would run (nothing left to measure).
    """
    if len(series_windows) * epochs < 2:
        raise ValueError(f"{len(series_windows)} series x {epochs} epochs: need >= 2 model-epochs")
    cfg = default_config(model_name)
    threads = os.cpu_count() if threads is None else threads
    torch.set_num_threads(threads)
    stats = []
    for i, windows_s in enumerate(series_windows):
        stats += _train_one_series(model_name, windows_s, epochs, cfg, decoding, seed + i)
    return _timing_record(model_name, decoding, len(series_windows), epochs, threads, stats)


def _timing_record(
    model_name: str, decoding: str, n_series: int, epochs: int, threads: int, stats: list[dict]
) -> dict:
    """`time_torch_epochs`'s result from its per-model-epoch `stats`: the first model-epoch
    (the warm-up) apart, medians of the rest, and the last model-epoch's losses."""
    measured = stats[1:]
    return {
        "model": model_name,
        "decoding": decoding,
        "params": EXPECTED_PARAMS[model_name, decoding],
        "series": n_series,
        "epochs": epochs,
        "threads": threads,
        "warmup_epoch_s": stats[0]["epoch_s"],
        "seconds_per_model_epoch": statistics.median(s["epoch_s"] for s in measured),
        "train_s": statistics.median(s["train_s"] for s in measured),
        "val_s": statistics.median(s["val_s"] for s in measured),
        "epoch_s": [s["epoch_s"] for s in stats],
        "train_loss": stats[-1]["train_loss"],
        "val_loss": stats[-1]["val_loss"],
    }


# ---------------------------------------------------------------- command line

_COLUMNS = (
    "model",
    "decoding",
    "params",
    "threads",
    "series",
    "epochs",
    "train_windows",
    "batch_size",
    "warmup_epoch_s",
    "seconds_per_model_epoch",
    "train_s",
    "val_s",
)


def _parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="transformer,gru,lstm", help="comma-separated models")
    p.add_argument("--series", type=int, default=2, help="series, one model each")
    p.add_argument("--epochs", type=int, default=2, help="epochs per series")
    p.add_argument("--decoding", default="autoregressive", help="comma list: autoregressive,direct")
    p.add_argument("--candles", type=int, default=5000, help="candles per synthetic series")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="torch, host random and shuffle seed")
    common.add_records_dir_flag(p)
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.model.split(",") if m.strip()]
    args.decodings = [d.strip() for d in args.decoding.split(",") if d.strip()]
    for flag, values, allowed in (
        ("model", args.models, MODELS),
        ("decoding", args.decodings, DECODINGS),
    ):
        for v in values or [""]:
            if v not in allowed:
                p.error(f"--{flag}: {v!r} is not one of {', '.join(allowed)}")
    return args


def main(argv=None) -> list[dict]:
    """Runs the baseline for each model and prints seconds per model-epoch."""
    args = _parse_args(argv)
    rows = []
    for name, decoding in itertools.product(args.models, args.decodings):
        series_windows = benchmark_windows(name, args.series, args.candles)
        row = time_torch_epochs(
            name, series_windows, args.epochs, args.threads, args.seed, decoding
        )
        row["train_windows"] = len(series_windows[0]["train"][0])
        row["batch_size"] = default_config(name).train.batch_size
        rows.append(row)
        print(
            f"{name} {decoding}: {row['seconds_per_model_epoch']:.3f} s per model-epoch "
            f"(warm-up {row['warmup_epoch_s']:.3f} s; all {np.round(row['epoch_s'], 3)})",
            flush=True,
        )
    table = common.markdown_table(rows, _COLUMNS)
    title = "Torch baseline: seconds per model-epoch"
    common.print_and_record(args.records_dir, "torch_baseline", title, table, argv)
    return rows


if __name__ == "__main__":
    main()
