"""Normalisation of a series' features and OHLC targets, fitted on its train candles (numpy).

Normalisation is arranged so that the device only ever subtracts an anchor:
  x[t-L+1..t] = inputs[...] - anchor[t] * price_mask      (price columns only)
  y[t+1..t+H] = targets[...] - anchor[t]
last_close (data.normalization, the one kind): inputs/targets of price columns hold
log(p / p0) and anchor[t] = log(close[t] / p0), so windows are log ratios to the
window's own last close. Nothing is fitted, and predictions map back exactly.
Non-price features (volume, RSI, ...) are z-scored with train-split statistics,
except the scale-free context features (features.UNSCALED_FEATURES), which
the model reads as they are (mean 0, std 1 in the saved statistics).

Shapes: T candles, N rows (candles or windows), F features, C target columns (OHLC).
"""

from __future__ import annotations

import math

import numpy as np

from cpbjax.columns import price_mask
from cpbjax.data import features as features_lib
from cpbjax.data.series import SeriesSkipped


def train_stats(x_NC: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column mean and population std of the train candles; std 1 where it is 0."""
    sd = x_NC.std(axis=0)
    return x_NC.mean(axis=0), np.where(sd > 0, sd, 1.0)


def fitted_stats(fitted: dict, mean_key: str, std_key: str, width: int):
    """(mean, std) float64 [width] of a saved `norm`, checked against the column count."""
    mu, sd = np.asarray(fitted[mean_key], np.float64), np.asarray(fitted[std_key], np.float64)
    if mu.shape != (width,) or sd.shape != (width,) or not (sd > 0).all():
        raise ValueError(
            f"saved normalisation {mean_key}/{std_key} do not fit {width} columns "
            f"with std > 0: {mu.tolist()}, {sd.tolist()}"
        )
    return mu, sd


def normalise(ohlc_TC, feats_TF, names, n_train: int, kind: str, fitted: dict | None = None):
    """Returns (inputs [T, F], targets [T, C], anchor [T], norm) as float64.

    Statistics are fitted on the first `n_train` candles (the train candles) only, or
    taken from `fitted` (the `norm` a training run saved with its model), so a saved
    model sees new data scaled exactly as its training data was.
    """
    if kind != "last_close":
        raise ValueError(f"data.normalization={kind!r} is not allowed: expected last_close")
    price = price_mask(names).astype(bool)
    if fitted is None:
        mu, sd = train_stats(feats_TF[:n_train])
        unscaled = np.array([n in features_lib.UNSCALED_FEATURES for n in names], bool)
        mu, sd = np.where(unscaled, 0.0, mu), np.where(unscaled, 1.0, sd)
    else:
        mu, sd = fitted_stats(fitted, "feature_mean", "feature_std", len(names))
    # Non-price columns keep this z-score.
    inputs_TF = (feats_TF - mu) / sd
    norm = {"kind": kind, "feature_mean": mu, "feature_std": sd}
    log_p0 = math.log(ohlc_TC[0, 3])  # cancels out of every window; kept for to_prices
    with np.errstate(divide="ignore", invalid="ignore"):  # a band <= 0 is caught later
        inputs_TF[:, price] = np.log(feats_TF[:, price]) - log_p0
    targets_TC = np.log(ohlc_TC) - log_p0
    return inputs_TF, targets_TC, targets_TC[:, 3].copy(), {**norm, "log_p0": log_p0}


def check_finite(inputs_TF: np.ndarray, names) -> None:
    """Raises SeriesSkipped naming the features with a non-finite normalised value."""
    bad = [names[j] for j in np.nonzero(~np.isfinite(inputs_TF).all(axis=0))[0]]
    if bad:
        raise SeriesSkipped(
            f"non-finite normalised values in features {bad} "
            "(under last_close a price feature such as bb_lower must stay > 0)"
        )
