"""The per-column fallback (eval.column_fallback): after training, each series keeps the
network's correction on a target column only where it beats the baseline on val.

With model.baseline the network's output is a correction added to a baseline forecast
(models/heads.py ForecastOutput: the last close for open and close, the vol band for
high and low). Early stopping keeps a whole epoch or the whole baseline, judged on all
columns together, so a correction that helps high and low but hurts close is kept on
close too (issue #42: a pooled GRU's close was significantly worse than persistence on
a low-volatility coin while its high and low helped). Here each column c of each series
(a pooled model's series each on its own val windows) compares, window by window, the
kept model's val error with the baseline's: the model keeps column c unless its mean
error is above the baseline's by more than one standard error of the paired per-window
difference (`MARGIN`; `early_stopping.gain_se`, Newey-West over H - 1 lags), i.e. it
falls back only where the correction is significantly worse. Why that margin: on the
tuning pairs' val split of three calendar folds, each decided on its first half and
scored on its second, it cost nothing against keeping every correction (high 0.00, low
-0.02 points on average), where falling back wherever the gain was below 0 or 1 standard
error cost 0.12 / 0.07 and 0.20 / 0.39 points (experiments/global_model). The error is
train.loss (mse or mae) in the normalised target space, as early stopping's;
train.loss_scale divides a column's errors by one constant, which moves its mean gain and
standard error alike, so the decision does not depend on it.

The decision is saved in the params (heads.KEEP_COLUMNS), so every later forecast of the
model (test scoring, --mode predict, cpbjax.load, serve, export) applies it.
Shape letters (docs/design.md): N val windows, H horizon, C OHLC targets.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import columns
from cpbjax.models import heads
from cpbjax.score import batch_forecast
from cpbjax.training import early_stopping


def window_errors(kind: str, pred_NHC, y_NHC) -> np.ndarray:
    """train.loss of each window and column, its mean over the H steps: float64 [C, N]."""
    r_NHC = np.asarray(pred_NHC, np.float64) - np.asarray(y_NHC, np.float64)
    err_NHC = np.square(r_NHC) if kind == "mse" else np.abs(r_NHC)
    return np.mean(err_NHC, axis=1).T


# Standard errors of the paired val gain a column must clear to keep its correction
# (early_stopping.bar's margin); -1: kept unless worse by one standard error.
MARGIN = -1.0


def keep_mask(model_CN, base_CN, lag: int) -> np.ndarray:
    """Which columns keep the correction, bool [C]: the model's mean val error is below
    `early_stopping.bar` at MARGIN of the baseline's (standard errors of the paired
    per-window difference, Newey-West with `lag` lags).

    model_CN, base_CN: per-window val errors of the model and of the baseline [C, N].
    """
    model_CN, base_CN = np.asarray(model_CN, np.float32), np.asarray(base_CN, np.float32)
    return np.asarray(_below_bar(model_CN, base_CN, lag))


# One program per series length; op by op, the Newey-West sum compiled each of its ops
# for every series (3.6 s of a 20-series evaluation on the 2-core CPU).
@functools.partial(jax.jit, static_argnames="lag")
def _below_bar(model_CN, base_CN, lag):
    se_C = early_stopping.gain_se(model_CN, base_CN, jnp.ones(model_CN.shape, bool), lag)
    bar_C = early_stopping.bar(MARGIN, jnp.mean(base_CN, axis=1), se_C)
    return jnp.mean(model_CN, axis=1) < bar_C


def decide(module, params, prep, spec) -> np.ndarray:
    """The fallback mask, bool [C], of one series' kept params on its val windows (spec:
    the run's evaluate.EvalSpec: its window sizes and loss): `decide_all` of one series."""
    return decide_all(module, [params], [prep], spec)[0]


def decide_all(module, params_list, preps, spec) -> list[np.ndarray]:
    """`decide` of each series (params_list[i] on preps[i]); the val forecasts of series
    that share params are batched (batch_forecast.forecast_jobs).

    The baseline's forecasts are the same params' with every column's correction masked.
    """
    num_columns = len(columns.COLUMNS)
    jobs = [
        batch_forecast.Job(
            heads.with_keep(params, np.full(num_columns, keep)), prep, prep.ends["val"]
        )
        for params, prep in zip(params_list, preps, strict=True)
        for keep in (True, False)
    ]
    norms = batch_forecast.forecast_jobs(module, jobs, spec.lookback, spec.horizon, spec.pooled)
    return [
        _keep_on_val(prep, spec, norms[2 * i], norms[2 * i + 1]) for i, prep in enumerate(preps)
    ]


def _keep_on_val(prep, spec, model_NHC, base_NHC) -> np.ndarray:
    """The mask, bool [C], of the model's and the baseline's val forecasts [N, H, C]."""
    ends_N = prep.ends["val"]
    if not len(ends_N):  # nothing to judge on: every column keeps what it had
        return np.ones(len(columns.COLUMNS), bool)
    idx_NH = ends_N[:, None] + np.arange(1, spec.horizon + 1)[None, :]
    y_NHC = prep.targets[idx_NH].astype(np.float64) - prep.anchor[ends_N][:, None, None]
    model_CN = window_errors(spec.loss, model_NHC, y_NHC)
    base_CN = window_errors(spec.loss, base_NHC, y_NHC)
    return keep_mask(model_CN, base_CN, spec.horizon - 1)


def apply(module, params, prep, spec):
    """(params, baseline_columns): the kept params with their fallback mask where a column
    falls back (unchanged where every column keeps its correction, so they forecast
    exactly as before), and the names of the columns whose forecast is the baseline's."""
    return apply_all(module, [params], [prep], spec)[0]


def apply_all(module, params_list, preps, spec) -> list[tuple]:
    """`apply` of each series (params_list[i] on preps[i]), decided by `decide_all`."""
    masks = decide_all(module, params_list, preps, spec)
    return [
        (heads.without_keep(params), [])
        if keep_C.all()
        else (heads.with_keep(params, keep_C), baseline_columns(keep_C))
        for params, keep_C in zip(params_list, masks, strict=True)
    ]


def baseline_columns(keep_C) -> list[str]:
    """The names of the columns a mask (bool [C]) gives the baseline's forecast."""
    return [c for c, keep in zip(columns.COLUMNS, keep_C, strict=True) if not keep]
