"""Tests of eval.fit_days (cpbjax/score/fit_span.py): the band refit and the calibrated
interval read only the windows of the splits before the scored one that end within
fit_days of the newest of them; train is forecast only that far back.

The reference is a plain loop over the windows' open times, and the refit and interval
fitted on the windows it picks (band_refit.fit_shift, intervals.fit_calibration).
"""

import json

import numpy as np
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.score import band_refit, evaluate, fit_span, forecast, intervals
from tests.band_refit_test import _model, _perturbed

L, H, LEVELS = 30, 10, (0.1, 0.9)
DAY_MS = 86_400_000


def _plain_fit_ends(prep, before, days):
    """The windows of the splits `before` ending within `days` of the newest, by a loop."""
    ends = [int(e) for s in before for e in prep.ends[s]]
    newest = max(prep.open_time_ms[e] for e in ends)
    return np.array([e for e in ends if prep.open_time_ms[e] >= newest - days * DAY_MS])


def _spec(days):
    return evaluate.EvalSpec(
        L, H, LEVELS, refit_band=True, interval_vol=intervals.VOL_BLEND, fit_days=days
    )


def test_the_refit_and_the_interval_read_the_windows_within_fit_days():
    _, prep, module, params = _model()
    params, days = _perturbed(params, 2), 3.0
    entry, _, calibration, _, _ = evaluate.evaluate_model(module, params, prep, _spec(days))
    for split, before in (("val", ("train",)), ("test", ("train", "val"))):
        ends = _plain_fit_ends(prep, before, days)
        assert 0 < len(ends) < sum(len(prep.ends[s]) for s in before)  # the span cut some
        fit = forecast.forecast_ends(module, params, prep, ends, L, H)
        shift = band_refit.fit_shift(prep, {"fit": fit}, ("fit",), L, H)
        got = [entry[split]["band_refit"][c] for c in ("high", "low")]
        # float32 forecasts of other batches than evaluate's: the same picks, to rounding
        np.testing.assert_allclose(np.stack(got, -1), shift, rtol=1e-6)
        refit = band_refit.shifted_forecast(prep, fit, shift, L)
        want = intervals.fit_calibration(
            prep,
            ends,
            refit.prices_NHC,
            _spec(days),
            "sigma",
            intervals.scale_settings("1h", 7, 0.25),
        )
        fitted_on = entry[split]["calibrated_interval"]["fitted_on"]
        assert fitted_on["fitted_on_windows"] == len(ends)
        assert fitted_on["first_window_end"] == want["first_window_end"]
    assert calibration["fitted_on_windows"] == want["fitted_on_windows"]
    np.testing.assert_allclose(calibration["k"], want["k"], rtol=1e-6)


def test_train_is_forecast_as_far_back_as_the_fits_read():
    _, prep, _, _ = _model()
    for days in (0.5, 3.0, 6.0):
        kept = fit_span.forecast_ends(prep, "train", days)
        np.testing.assert_array_equal(kept, _plain_fit_ends(prep, ("train",), days))
        test_reads = _plain_fit_ends(prep, ("train", "val"), days)
        assert set(test_reads) <= set(kept) | set(prep.ends["val"])
    np.testing.assert_array_equal(fit_span.forecast_ends(prep, "train", 0), prep.ends["train"])
    assert fit_span.forecast_ends(prep, "val", 0.5) is prep.ends["val"]


def test_a_span_longer_than_the_history_scores_as_every_window_does():
    _, prep, module, params = _model()
    params = _perturbed(params, 3)
    every = evaluate.evaluate_model(module, params, prep, _spec(0.0))
    longer = evaluate.evaluate_model(module, params, prep, _spec(10_000.0))
    assert json.dumps(every.entry) == json.dumps(longer.entry)
    assert every.calibration == longer.calibration


@pytest.mark.parametrize("days", [-1.0, 1e9, float("nan")])
def test_a_bad_fit_days_is_refused(days):
    c = config_lib.load("configs/gru.py:tiny")
    c.eval.fit_days = days
    with pytest.raises(ConfigError, match="eval.fit_days"):
        config_lib.validate(c)
