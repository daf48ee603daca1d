"""Auxiliary training targets (config.model.aux_targets), one row per window.

At a window's end t: realized_vol, the population std of the H close log returns
r_{t+1..t+H}, and bb_position, `features`' Bollinger position (20 periods, 2 std) of
the last forecast candle t+H. Neither reads a candle after t+H, the last OHLC target,
so both inherit its purge. Each is z-scored with the mean/std of its values on the
train windows, then scaled to the RMS of those windows' OHLC targets, so an aux MSE
weighs like the OHLC MSE whatever the normalisation (under last_close the OHLC targets
are log ratios of about 1e-2, and unit-variance aux targets would swamp them).

`FUNCTIONS` is the one list of aux target names; config validation reads it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cpbjax.data import normalize
from cpbjax.data.series import SeriesSkipped


def _bb_position(close_T, bb_position_T, ends_N, horizon):
    return bb_position_T[ends_N + horizon]


def _realized_vol(close_T, bb_position_T, ends_N, horizon):
    r_T = np.diff(np.log(close_T))  # r_T[i] = log(c[i+1] / c[i]), the return of candle i+1
    return r_T[ends_N[:, None] + np.arange(horizon)].std(axis=1)  # returns of t+1..t+H


# Aux target name -> f(close [T], bb_position [T], ends [N], H) -> raw float64 [N].
FUNCTIONS = {"bb_position": _bb_position, "realized_vol": _realized_vol}


def target_rms(targets_TC, anchor_T, ends_N, horizon: int) -> float:
    """RMS of the normalised OHLC targets of the windows ending at ends_N (what `gather` gives)."""
    y_NHC = targets_TC[ends_N[:, None] + np.arange(1, horizon + 1)] - anchor_T[ends_N, None, None]
    return float(np.sqrt(np.mean(np.square(y_NHC))))


def _fitted_aux_stats(fitted: dict, names: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) float64 [A] of `names` from a saved `norm`, matched by name."""
    saved = list(fitted.get("aux_targets", ()))
    missing = [n for n in names if n not in saved]
    if missing:
        raise ValueError(
            f"saved normalisation has no statistics of aux targets {missing} "
            f"(it has {saved}): use the model's config.model.aux_targets"
        )
    mu, sd = normalize.fitted_stats(fitted, "aux_mean", "aux_std", len(saved))
    order = [saved.index(n) for n in names]
    return mu[order], sd[order]


class AuxInputs(NamedTuple):
    """The per-candle columns of one series every aux target is computed from, in the order
    FUNCTIONS take them."""

    close_T: np.ndarray  # float64 [T] closes
    bb_position_T: np.ndarray  # float64 [T] Bollinger positions (`features`)


def compute(
    names, series: AuxInputs, y_scale: float, ends: dict, horizon: int, fitted: dict | None
):
    """(aux float32 [T, A] indexed by window end, its `norm` entries).

    Args:
      names: the aux target names (keys of FUNCTIONS).
      series: the series' closes and Bollinger positions.
      y_scale: the RMS of the train windows' normalised OHLC targets (`target_rms`).
      ends: split name -> int [N_split] window ends, the train split first.
      horizon: H.
      fitted: a saved model's `norm` to scale with; None fits on the train windows.
    """
    ends_N = np.concatenate(list(ends.values()))  # train windows first
    raw_NA = np.stack([FUNCTIONS[n](*series, ends_N, horizon) for n in names], axis=1)
    if fitted is None:
        mu, sd = normalize.train_stats(raw_NA[: len(ends["train"])])
        sd = sd / (y_scale if y_scale > 0 else 1.0)
    else:
        mu, sd = _fitted_aux_stats(fitted, names)
    aux_TA = np.zeros((len(series.close_T), len(names)))
    aux_TA[ends_N] = (raw_NA - mu) / sd
    bad = [n for j, n in enumerate(names) if not np.isfinite(aux_TA[:, j]).all()]
    if bad:
        raise SeriesSkipped(f"non-finite aux targets {bad} (model.aux_targets)")
    return aux_TA.astype(np.float32), {"aux_targets": names, "aux_mean": mu, "aux_std": sd}
