"""Tests of cpbjax.score.forecast and cpbjax.score.evaluate: forecasts of a module, scores and forecast files."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl

from cpbjax import band
from cpbjax.data import stacking, synthetic, windows
from cpbjax.score import evaluate, forecast, metrics
from tests.fake_data import H, L, Probe, make_prep, prep_config, probe_params

# ---------------------------------------------------------------------------
# Forecasts of a module, evaluate_split and saved forecasts.


def test_forecast_batches_and_maps_to_prices(monkeypatch):
    prep = make_prep()
    params = probe_params()
    monkeypatch.setattr(forecast, "MAX_BATCH", 4)  # several padded batches
    norm = forecast.predict_windows(Probe(), params, prep, prep.ends["val"], L, H)
    monkeypatch.undo()
    fc = forecast.split_forecast(Probe(), params, prep, "val", evaluate.EvalSpec(L, H))
    ends, prices, norm_big = fc.ends_N, fc.prices_NHC, fc.norm_NHC
    np.testing.assert_array_equal(ends, prep.ends["val"])
    chex.assert_shape(norm, (len(ends), H, 4))
    np.testing.assert_allclose(norm, norm_big, rtol=1e-6, atol=1e-7)
    x, _ = stacking.gather(stacking.window_source(prep), jnp.asarray(ends[:3]), L, H)
    ref = Probe().apply({"params": params}, x)
    np.testing.assert_allclose(norm[:3], ref, rtol=1e-5, atol=1e-7)
    ref_prices = prep.ohlc[ends, 3][:, None, None] * np.exp(norm.astype(np.float64))
    np.testing.assert_allclose(prices, ref_prices, rtol=1e-12)


def test_forecast_program_does_not_depend_on_the_series_length():
    # Full histories give every series its own length: one compiled forecast per batch
    # size serves them all (a program keyed on the length compiled once per series).
    params = probe_params()
    forecast._forecast_batch.clear_cache()
    short = make_prep()
    other = windows.prepare_series(
        synthetic.generate("ETHUSDT", "1h", 260, seed=1), prep_config().data
    )
    assert short.inputs.shape[0] != other.inputs.shape[0]
    for prep in (short, other):
        forecast.predict_windows(Probe(), params, prep, prep.ends["val"][:8], L, H)
    assert forecast._forecast_batch._cache_size() == 1


def test_zero_forecast_is_persistence():
    prep = make_prep()
    zero = jax.tree.map(jnp.zeros_like, probe_params())
    fc = forecast.split_forecast(Probe(), zero, prep, "test", evaluate.EvalSpec(L, H))
    out = evaluate.evaluate_split(prep, fc, "test", evaluate.EvalSpec(L, H))
    assert out["columns"]["close"]["skill"] == 0.0
    assert out["dm"]["p_value_two_sided"] == 1.0
    assert out["direction"]["scored"] == 0  # every predicted move is a tie
    ends = prep.ends["test"]
    y = prep.targets[ends[:, None] + np.arange(1, H + 1)] - prep.anchor[ends][:, None, None]
    np.testing.assert_allclose(out["normalized_mse"], np.mean(y.astype(np.float64) ** 2))
    for block in ("ridge", "vol_band"):
        assert out[block]["fit_windows"] == len(prep.ends["train"]) + len(prep.ends["val"])
    assert set(out["vol_band"]["columns"]) == {"high", "low"}
    # The band's high MAE, recomputed with a plain loop EWMA of log(high/low).
    k_high = np.array(out["vol_band"]["k_high_h"])
    maes = []
    for t in ends:
        num = den = 0.0
        for age in range(L):
            w = band.EWMA_DECAY**age
            num += w * np.log(prep.ohlc[t - age, 1] / prep.ohlc[t - age, 2])
            den += w
        high = prep.ohlc[t, 3] * np.exp(k_high * num / den)
        maes.append(np.abs(high - prep.ohlc[t + 1 : t + 1 + H, 1]))
    np.testing.assert_allclose(out["vol_band"]["columns"]["high"]["mae"], np.mean(maes))


def test_saved_forecasts_reproduce_the_metrics(tmp_path):
    prep = make_prep()
    params = probe_params(1)
    fc = forecast.split_forecast(Probe(), params, prep, "test", evaluate.EvalSpec(L, H))
    out = evaluate.evaluate_split(prep, fc, "test", evaluate.EvalSpec(L, H))
    path = forecast.save_forecasts(
        str(tmp_path), forecast.forecast_record(prep, fc, evaluate.EvalSpec(L, H))
    )
    assert path.endswith("forecasts/BTCUSDT-1h.npz")
    rec = forecast.load_forecasts(path)
    assert str(rec["series"]) == "BTCUSDT-1h"
    last, actual, pred = rec["last_candle"], rec["actual"], rec["predicted"]
    # Independent recomputation of the headline numbers.
    err = np.abs(pred - actual)
    np.testing.assert_allclose(out["columns"]["close"]["mae"], err[..., 3].mean(), rtol=1e-12)
    np.testing.assert_allclose(out["columns"]["high"]["mae_h"], err[..., 1].mean(0), rtol=1e-12)
    naive = np.abs(last[:, None, 3] - actual[..., 3]).mean()
    np.testing.assert_allclose(out["columns"]["close"]["skill"], 1 - err[..., 3].mean() / naive)
    act = np.sign(actual[..., 3] - last[:, None, 3])
    hit = act == np.sign(pred[..., 3] - last[:, None, 3])
    np.testing.assert_allclose(out["direction"]["accuracy"], hit[act != 0].mean())
    step = 3_600_000
    np.testing.assert_array_equal(
        rec["target_open_time_ms"], rec["last_open_time_ms"][:, None] + step * np.arange(1, H + 1)
    )
    # And every price metric, via the public function on the file's arrays.
    again = metrics.score_prices(last, actual, pred)
    for key in ("columns", "direction", "dm"):
        assert again[key] == out[key]


def test_consistent_ohlc_moves_only_the_violating_high_or_low():
    raw = np.array([[10.0, 12.0, 9.0, 11.0], [10.0, 9.5, 9.0, 11.0], [10.0, 12.0, 10.5, 9.0]])
    fixed = forecast.consistent_ohlc(raw)
    np.testing.assert_array_equal(fixed[0], raw[0])  # already valid: unchanged
    np.testing.assert_array_equal(fixed[1], [10.0, 11.0, 9.0, 11.0])  # high below the close
    np.testing.assert_array_equal(fixed[2], [10.0, 12.0, 9.0, 9.0])  # low above the close
    assert (fixed[:, 1] >= fixed[:, [0, 3]].max(1)).all()
    assert (fixed[:, 2] <= fixed[:, [0, 3]].min(1)).all()


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_series_scored_in_threads_each_use_one_blas_thread(monkeypatch):
    monkeypatch.setattr(evaluate, "SCORING_THREADS", 2)
    before = _blas_threads()
    assert before, "numpy's BLAS is not visible to threadpoolctl"
    seen = evaluate.map_series(lambda job: (job, _blas_threads()), [0, 1, 2], label=None)
    assert [job for job, _ in seen] == [0, 1, 2]  # in the jobs' order
    assert all(threads == [1] * len(before) for _, threads in seen)
    assert _blas_threads() == before  # restored after
