"""Tests of cpbjax.score.batch_forecast: the windows of many series forecast in batches that
mix series, against each series forecast on its own (forecast.predict_windows)."""

import jax
import numpy as np
import pytest

from cpbjax.data import windows
from cpbjax.score import batch_forecast, evaluate, forecast
from tests.fake_data import H, L, Probe, data_config, make_series, probe_params


def _preps():
    """Series of different lengths, one with gaps (windows across them are skipped)."""
    cfg = data_config(max_candles=0)
    series = [
        make_series(420, seed=0, symbol="AAAUSDT"),
        make_series(333, seed=1, symbol="BBBUSDT", missing=(60, 61, 200)),
        make_series(260, seed=2, symbol="CCCUSDT"),
    ]
    return [windows.prepare_series(s, cfg) for s in series]


def _oracle(params, job):
    return forecast.predict_windows(Probe(), params, job.prep, job.ends_N, L, H)


@pytest.mark.parametrize("batch, source_candles", [(8192, 1 << 21), (16, 500)])
def test_shared_params_mixed_batches_equal_each_series_alone(monkeypatch, batch, source_candles):
    # (16, 500): several batches per source and one source per series or two.
    monkeypatch.setattr(batch_forecast, "EVAL_BATCH", batch)
    monkeypatch.setattr(batch_forecast, "CPU_BATCH", batch)
    monkeypatch.setattr(batch_forecast, "SOURCE_CANDLES", source_candles)
    preps = _preps()
    assert preps[1].ends["train"][-1] - preps[1].ends["train"][0] >= len(preps[1].ends["train"])
    params = probe_params()
    copy = jax.tree.map(np.array, params)  # equal params, another object: one group
    jobs = [batch_forecast.Job(params, p, p.ends[s]) for p in preps for s in windows.SPLITS]
    jobs.append(batch_forecast.Job(copy, preps[2], np.array([], np.int64)))  # an empty split
    jobs.append(batch_forecast.Job(copy, preps[0], preps[0].ends["val"][::7]))
    got = batch_forecast.forecast_jobs(Probe(), jobs, L, H)
    assert len(got) == len(jobs)
    for job, norm in zip(jobs, got, strict=True):
        want = _oracle(params, job)
        assert norm.shape == want.shape == (len(job.ends_N), H, 4)
        assert norm.dtype == np.float32
        np.testing.assert_allclose(norm, want, rtol=1e-6, atol=1e-7)


def test_a_pooled_series_alone_is_batched_as_with_others(monkeypatch):
    monkeypatch.setattr(batch_forecast, "EVAL_BATCH", 64)  # several batches of its splits
    monkeypatch.setattr(batch_forecast, "CPU_BATCH", 64)
    prep, params = _preps()[0], probe_params()
    jobs = [batch_forecast.Job(params, prep, prep.ends[s]) for s in windows.SPLITS]
    calls = []
    monkeypatch.setattr(forecast, "predict_windows", lambda *a: calls.append(a))
    got = batch_forecast.forecast_jobs(Probe(), jobs, L, H, pooled=True)
    monkeypatch.undo()
    assert not calls  # not the per-series path
    for job, norm in zip(jobs, got, strict=True):
        np.testing.assert_allclose(norm, _oracle(params, job), rtol=1e-6, atol=1e-7)


def test_series_with_their_own_params_are_forecast_as_before():
    preps = _preps()
    jobs = [
        batch_forecast.Job(probe_params(seed=i), p, p.ends[s])
        for i, p in enumerate(preps)
        for s in ("val", "test")
    ]
    got = batch_forecast.forecast_jobs(Probe(), jobs, L, H)
    for job, norm in zip(jobs, got, strict=True):
        np.testing.assert_array_equal(norm, _oracle(job.params, job))


def test_params_key_tells_equal_params_from_others():
    params = probe_params()
    key = batch_forecast.params_key(params)
    assert batch_forecast.params_key(jax.tree.map(np.array, params)) == key
    moved = jax.tree.map(lambda a: np.array(a).copy(), params)
    moved["Dense_0"]["bias"][0] += np.float32(1e-7)
    assert batch_forecast.params_key(moved) != key
    assert batch_forecast.params_key(probe_params(seed=1)) != key


@pytest.mark.parametrize("wave_windows", [1 << 18, 100])
def test_evaluate_models_scores_each_series_as_alone(monkeypatch, wave_windows):
    # 100 windows: one series per wave. The pooled series share params; their entries
    # equal each one scored on its own (evaluate_model) to float32 forecast rounding.
    monkeypatch.setattr(evaluate, "WAVE_WINDOWS", wave_windows)
    preps, params = _preps(), probe_params()
    spec = evaluate.EvalSpec(L, H, interval_levels=(0.1, 0.9))
    together = evaluate.evaluate_models(Probe(), [params] * len(preps), preps, spec)
    for prep, scored in zip(preps, together, strict=True):
        alone = evaluate.evaluate_model(Probe(), params, prep, spec)
        assert scored.entry.keys() == alone.entry.keys() == {"val", "test"}
        for split in ("val", "test"):
            _assert_close(scored.entry[split], alone.entry[split])
        np.testing.assert_allclose(scored.record["predicted"], alone.record["predicted"], 1e-6)
        np.testing.assert_array_equal(scored.record["actual"], alone.record["actual"])


def _assert_close(got, want):
    """Nested results entries equal, their floats to float32 forecast rounding."""
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _assert_close(got[k], want[k])
    elif isinstance(want, float):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
    elif isinstance(want, list):
        np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), 1e-5, 1e-9)
    else:
        assert got == want
