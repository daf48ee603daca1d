"""Tests of eval.refit_band (cpbjax/score/band_refit.py): the band factors of a trained vol_band
model refit by least absolute deviation on its own errors over the splits before each
scored one.

References are independent: a plain loop over windows for the least-absolute-deviation
objective, baselines.py's float64 volatility band for the untrained model. (That a
trained run saves the model its test split scored: tests/api_test.py.)
"""

import math

import jax
import numpy as np
import pytest

from cpbjax import band
from cpbjax.data import stacking
from cpbjax.score import band_refit, baselines, evaluate, forecast
from tests.helpers import levers_config, levers_init_params, levers_preps

L, H = 30, 10


def _plain_sigma(ohlc, t: int) -> float:
    weights = [band.EWMA_DECAY**age for age in range(L)]
    logs = [math.log(ohlc[t - age, 1] / ohlc[t - age, 2]) for age in range(L)]
    return sum(w * x for w, x in zip(weights, logs, strict=True)) / sum(weights)


def _lad_objective(prep, fc, h: int, col: int, d: float) -> float:
    """sum over windows of |log(actual / close) - log(forecast / close) -+ d * sigma|: the
    forecast's log error once its band factor moves by d (high: +d; low: -d)."""
    sign = 1.0 if col == 1 else -1.0
    total = 0.0
    for i, t in enumerate(fc.ends_N):
        actual, pred = prep.ohlc[t + h + 1, col], fc.prices_NHC[i, h, col]
        total += abs(math.log(actual / pred) - sign * d * _plain_sigma(prep.ohlc, t))
    return total


def _perturbed(params, seed: int) -> dict:
    """params with every weight but the band moved at random: a model whose network
    corrects the band (as a trained one does), not the untrained band alone."""
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))

    def move(path, leaf):
        if "band_" in jax.tree_util.keystr(path):
            return leaf
        return leaf + 0.05 * jax.random.normal(next(keys), leaf.shape, leaf.dtype)

    return jax.tree_util.tree_map_with_path(move, params)


def _model(loss="mae", **model):
    """(config, prep, module, untrained params) of the tiny vol_band GRU: its band
    starts at the fit on prep's train windows, as training starts it."""
    cfg = levers_config(loss=loss, **model)
    prep = levers_preps()[0]
    module, params = levers_init_params(cfg, prep, stacking.band_factors(prep, L, H))
    return cfg, prep, module, params


def test_the_shift_minimises_the_absolute_log_error_of_each_step():
    _, prep, module, params = _model()
    params = _perturbed(params, 0)
    fcs = {
        s: forecast.split_forecast(module, params, prep, s, evaluate.EvalSpec(L, H))
        for s in ("train", "val")
    }
    shift = band_refit.fit_shift(prep, fcs, ("val",), L, H)
    for h in (0, 4, 9):
        for j, col in enumerate((1, 2)):
            best = _lad_objective(prep, fcs["val"], h, col, shift[h, j])
            for d in np.linspace(-1.0, 1.0, 41):  # a grid through the plausible shifts
                assert best <= _lad_objective(prep, fcs["val"], h, col, d) + 1e-9
    # The refit model's own errors leave nothing to shift (the LAD optimum is reached).
    refit = band_refit.shifted(params, shift)
    again = {"val": forecast.split_forecast(module, refit, prep, "val", evaluate.EvalSpec(L, H))}
    np.testing.assert_allclose(band_refit.fit_shift(prep, again, ("val",), L, H), 0, atol=1e-4)


def test_an_untrained_model_refit_is_the_fitted_band_of_each_split():
    """The untrained model is the band fitted on train; refit, each split is scored by the
    band the report fits for it (train for val, train+val for test), to float32."""
    _, prep, module, params = _model()
    entry, _, _, test_params, _ = evaluate.evaluate_model(
        module, params, prep, evaluate.EvalSpec(L, H, refit_band=True)
    )
    np.testing.assert_allclose(entry["val"]["band_refit"]["high"], 0, atol=1e-5)
    fit = band.fit_vol_band(prep.ohlc, baselines.fit_ends(prep, "test"), L, H)
    np.testing.assert_allclose(test_params["output"]["band_high"], fit["k_high_h"], rtol=1e-5)
    np.testing.assert_allclose(test_params["output"]["band_low"], fit["k_low_h"], rtol=1e-5)
    for split in ("val", "test"):
        for col in ("high", "low"):
            band_mae = entry[split]["vol_band"]["columns"][col]["mae"]
            assert entry[split]["columns"][col]["mae"] == pytest.approx(band_mae, rel=1e-5)


def test_each_split_is_scored_by_the_refit_on_the_splits_before_it():
    _, prep, module, params = _model()
    params = _perturbed(params, 1)
    entry, record, _, test_params, _ = evaluate.evaluate_model(
        module, params, prep, evaluate.EvalSpec(L, H, (0.1, 0.9), refit_band=True)
    )
    fcs = {
        s: forecast.split_forecast(module, params, prep, s, evaluate.EvalSpec(L, H))
        for s in ("train", "val")
    }
    for split, before in (("val", ("train",)), ("test", ("train", "val"))):
        want = band_refit.fit_shift(prep, fcs, before, L, H)
        got = np.stack([entry[split]["band_refit"]["high"], entry[split]["band_refit"]["low"]], -1)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        scored = band_refit.shifted(params, want)
        fc = forecast.split_forecast(module, scored, prep, split, evaluate.EvalSpec(L, H))
        np.testing.assert_allclose(
            entry[split]["columns"]["high"]["mae"],
            np.abs(
                prep.ohlc[fc.ends_N[:, None] + np.arange(1, H + 1), 1] - fc.prices_NHC[..., 1]
            ).mean(),
            rtol=1e-6,  # the scored forecasts are shifted, not forecast again: float32 rounding
        )
    np.testing.assert_allclose(record["predicted"], fc.prices_NHC, rtol=1e-6)
    np.testing.assert_array_equal(test_params["output"]["band_high"], scored["output"]["band_high"])
    assert not np.allclose(want, 0, atol=1e-3)  # the perturbed model had something to refit


@pytest.mark.parametrize("ensemble", [1, 2])
def test_a_shifted_forecast_is_the_forward_pass_of_the_shifted_model(ensemble):
    """Evaluation moves the trained model's forecasts by the refit instead of forecasting
    again; the result is the refit model's own forward pass, to float32 rounding (for an
    ensemble, the mean forecast of its members each shifted)."""
    _, prep, module, params = _model(ensemble=ensemble)
    params = _perturbed(params, 2)
    shift_H2 = np.random.default_rng(0).uniform(-0.5, 0.5, (H, 2))
    for split in ("train", "test"):
        trained = forecast.split_forecast(module, params, prep, split, evaluate.EvalSpec(L, H))
        got = band_refit.shifted_forecast(prep, trained, shift_H2, L)
        want = forecast.split_forecast(
            module, band_refit.shifted(params, shift_H2), prep, split, evaluate.EvalSpec(L, H)
        )
        np.testing.assert_array_equal(got.ends_N, want.ends_N)
        np.testing.assert_allclose(got.prices_NHC, want.prices_NHC, rtol=2e-6)
        np.testing.assert_allclose(got.norm_NHC, want.norm_NHC, rtol=0, atol=2e-6)
        # The shift moved high and low and nothing else.
        moved = ~np.isclose(got.prices_NHC, trained.prices_NHC, rtol=1e-4)
        assert moved[..., 1].any() and moved[..., 2].any()
        assert not moved[..., 0].any() and not moved[..., 3].any()


def test_without_the_option_or_a_band_nothing_is_refit():
    for model, refit in (({}, False), ({"baseline": "none"}, True)):
        cfg = levers_config(**model)
        prep = levers_preps()[0]
        module, params = levers_init_params(cfg, prep, np.zeros((H, 2), np.float32))
        entry, _, _, test_params, _ = evaluate.evaluate_model(
            module, params, prep, evaluate.EvalSpec(L, H, refit_band=refit)
        )
        assert "band_refit" not in entry["val"] and "band_refit" not in entry["test"]
        assert test_params is params
