"""A pooled run's model on a series it never saw: its per-series parts fitted on that
series' own candles (--mode predict and `cpbjax.load(<workdir>)`).

Every series of a pooled run (train.share=pooled) holds the same network params, so a
new pair or interval uses them as they are. What a trained series has of its own is
fitted from its history, and for a new series it is fitted the same way from the
candles given, never taken from another series:
- the normalisation statistics (latest.prepare_latest re-fits them on the candles),
  those of the data.covariates columns too (covariates.latest): the run's are each
  trained series' own;
- with eval.refit_band, the volatility band's factors: the least-absolute-deviation fit
  of band_refit.fit_shift, here from factors of zero, so the fit is the whole factor
  and no trained series' own refit enters (a run without the refit keeps the pooled
  band it trained, the same on every series);
- with eval.interval_levels, the calibrated interval (intervals.fit_calibration, the
  sigma-weighted fit with the run's volatility blend, as fit_before fits test's).
Both fits use every gap-free window of the candles that has H candles after it, as a
trained series' test model is fitted on all its windows before test. Fewer than
MIN_FIT_WINDOWS such windows is refused rather than fitted on noise.
`from_candles` is any saved model's forecast of a Series of given candles (a frame of
`Model.predict`, serve's POST): a zero-shot model fits these parts first.
Shapes (docs/design.md): N windows, H steps, C OHLC columns.
"""

from __future__ import annotations

import numpy as np

from cpbjax.data import covariates, latest, windows
from cpbjax.data.series import INTERVAL_MS, SeriesSkipped
from cpbjax.models import heads
from cpbjax.score import band_refit, evaluate, forecast, intervals

# The fewest windows the band and the interval of an unseen series are fitted on: the
# interval's 10% and 90% quantiles then rest on at least 20 windows each.
MIN_FIT_WINDOWS = 200
# Days of windows --mode predict loads on top of a forecast's history for those fits.
FIT_DAYS = 28.0


def fit_ends(prep, lookback: int, horizon: int) -> np.ndarray:
    """int64 [N]: the ends of every gap-free window of `prep` with H candles after it
    whose lookback holds every covariate (as training's windows, windows.window_ends)."""
    step_ms = INTERVAL_MS[prep.interval]
    ends_N = windows.contiguous_ends(prep.open_time_ms, step_ms, lookback, horizon)
    missing_T = prep.notes.get(windows.COVARIATE_MISSING)
    if missing_T is not None:
        ends_N = covariates.complete_ends(ends_N, missing_T, lookback)
    return ends_N


def fit_series(model, prep):
    """`model` (a saved.LoadedModel with zero_shot=True) with the per-series parts of the
    series `prep` (latest.prepare_latest of its candles) fitted on its own windows.

    Returns:
      (the fitted LoadedModel, the number of windows fitted on).

    Raises:
      SeriesSkipped: fewer than MIN_FIT_WINDOWS windows.
    """
    spec = evaluate.make_spec(model.trained)
    ends_N = fit_ends(prep, spec.lookback, spec.horizon)
    if len(ends_N) < MIN_FIT_WINDOWS:
        raise SeriesSkipped(
            f"a series the pooled run never trained on needs at least {MIN_FIT_WINDOWS} "
            f"gap-free windows of {spec.lookback}+{spec.horizon} candles to fit its band "
            f"and interval on, and the candles give {len(ends_N)}"
        )
    params, fc = model.params, None
    if spec.refit_band and band_refit.applies(model.module):
        zero_H2 = np.zeros((spec.horizon, 2), np.float32)
        params = heads.with_band(params, zero_H2)
        fc = forecast.forecast_ends(model.module, params, prep, ends_N, *_sizes(spec))
        shift_H2 = band_refit.fit_shift(prep, {"fit": fc}, ("fit",), *_sizes(spec))
        params = band_refit.shifted(params, shift_H2)
        fc = band_refit.shifted_forecast(prep, fc, shift_H2, spec.lookback)
    calibration = None
    if spec.interval_levels:
        if fc is None:
            fc = forecast.forecast_ends(model.module, params, prep, ends_N, *_sizes(spec))
        scale = intervals.scale_settings(prep.interval, *spec.interval_vol)
        calibration = intervals.fit_calibration(prep, ends_N, fc.prices_NHC, spec, "sigma", scale)
    fitted = model._replace(params=params, calibration=calibration, norm=prep.norm)
    return fitted, len(ends_N)


def from_candles(model, series) -> dict:
    """forecast.next_candles' entry of `series` (the newest candles, a Series) from `model`
    (a saved.LoadedModel): normalised with its saved statistics, or, for a zero-shot
    model, with the series' own parts fitted first (`fit_series`).

    Raises:
      SeriesSkipped: too few candles, a gap or a covariate missing in the newest window.
      CovariateError: the series lacks a column the model reads.
      forecast.NonFiniteForecast: NaN or inf prices.
    """
    d = model.trained.data
    prep = latest.prepare_latest(series, d, model.norm)
    if model.zero_shot:
        model, _ = fit_series(model, prep)
    return forecast.next_candles(
        model.module, model.params, prep, d.lookback, d.horizon, model.calibration
    )


def _sizes(spec) -> tuple[int, int]:
    return spec.lookback, spec.horizon
