"""Tests of eval.column_fallback (cpbjax/score/column_fallback.py): each column keeps the network's
correction unless it is significantly worse than the baseline on val.

References are independent: a plain numpy loop for the decision (Newey-West with Bartlett
weights written out), the last close (persistence) for a close that falls back, and the
forecasts the evaluation path scored for every later path (load, predict, export).
"""

import dataclasses

import jax
import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import band, columns, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import sources, stacking
from cpbjax.models import heads
from cpbjax.modes import export as portable
from cpbjax.report import tables as report_tables
from cpbjax.score import column_fallback, evaluate, forecast, metrics, saved
from tests.helpers import levers_config, levers_init_params, levers_preps

L, H = 30, 10
OPEN, HIGH, LOW, CLOSE = range(4)


def _loop_keep(model_CN, base_CN, lag):
    """The decision, column by column: the mean error is not above the baseline's by one
    Newey-West standard error of the per-window difference (or more)."""
    keep = []
    for m, b in zip(model_CN, base_CN, strict=True):
        d = [float(x) - float(y) for x, y in zip(m, b, strict=True)]
        n = len(d)
        mean = sum(d) / n
        dev = [x - mean for x in d]
        var = sum(x * x for x in dev)
        for gap in range(1, lag + 1):
            weight = 1.0 - gap / (lag + 1)
            var += 2.0 * weight * sum(dev[i] * dev[i - gap] for i in range(gap, n))
        se = max(var, 0.0) ** 0.5 / n
        keep.append(sum(m) / n < sum(b) / n + se)
    return np.array(keep)


def test_the_mask_is_the_loop_decision_with_the_margin():
    assert column_fallback.MARGIN == -1.0
    rng = np.random.default_rng(0)
    decisions = []
    for _ in range(12):
        n, lag = 60, 4
        base = np.abs(rng.normal(1.0, 0.3, (4, n)))
        # Gains around the bar: per column a shift of a few hundredths, either sign.
        model = base + rng.normal(0.03, 0.05, (4, 1)) + rng.normal(0.0, 0.1, (4, n))
        got = column_fallback.keep_mask(model, base, lag)
        want = _loop_keep(model, base, lag)
        np.testing.assert_array_equal(got, want)
        decisions.extend(want)
    assert any(decisions) and not all(decisions)  # both outcomes were checked


def test_window_errors_are_the_loss_of_each_column_averaged_over_steps():
    rng = np.random.default_rng(1)
    pred, y = rng.normal(size=(5, 3, 4)), rng.normal(size=(5, 3, 4))
    for kind, f in (("mae", abs), ("mse", lambda r: r * r)):
        got = column_fallback.window_errors(kind, pred, y)
        for c in range(4):
            for i in range(5):
                want = sum(f(pred[i, h, c] - y[i, h, c]) for h in range(3)) / 3
                assert got[c, i] == pytest.approx(want, rel=1e-12)


# How far the forced model's band is moved the wrong way, in window ranges.
WRONG = 3.0


def _forced_model():
    """(config, prep, module, params): the tiny vol_band GRU whose band is moved WRONG
    window ranges the wrong way (high toward and below the last close, low above it),
    and whose correction is a constant per column: high and low moved back by WRONG
    times the median range of the train windows (far better than that baseline), close
    5% too high (far worse than persistence), open none (the baseline itself)."""
    cfg = levers_config()
    prep = levers_preps()[0]
    band_H2 = stacking.band_factors(prep, L, H) - WRONG
    module, params = levers_init_params(cfg, prep, band_H2)
    sigma = np.median(band.ewma_range(prep.ohlc, prep.ends["train"], L))
    bias_HC = np.zeros((H, 4), np.float32)
    bias_HC[:, HIGH], bias_HC[:, LOW] = WRONG * sigma, -WRONG * sigma
    bias_HC[:, CLOSE] = 0.05
    params = jax.tree.map(np.asarray, params)
    params["head_out"] = {**params["head_out"], "bias": bias_HC.reshape(-1)}
    return cfg, prep, module, params


def _spec(cfg, **kw):
    return evaluate.EvalSpec(L, H, column_fallback=True, loss=cfg.train.loss, **kw)


def test_a_bad_column_falls_back_to_its_baseline_and_the_others_keep_the_model():
    cfg, prep, module, params = _forced_model()
    scored = evaluate.evaluate_model(module, params, prep, _spec(cfg))
    assert scored.entry["baseline_columns"] == ["open", "close"]
    np.testing.assert_array_equal(heads.keep_columns(scored.params), [False, True, True, False])
    test = scored.record
    # Close is persistence exactly: the last close of each window.
    np.testing.assert_array_equal(
        test["predicted"][..., CLOSE],
        np.broadcast_to(test["last_candle"][:, None, CLOSE], test["predicted"].shape[:2]),
    )
    unmasked = forecast.split_forecast(module, params, prep, "test", _spec(cfg))
    baseline = heads.with_keep(params, np.zeros(4, bool))
    base = forecast.split_forecast(module, baseline, prep, "test", _spec(cfg))
    np.testing.assert_array_equal(
        test["predicted"][..., [OPEN, CLOSE]], base.prices_NHC[..., [0, 3]]
    )
    np.testing.assert_array_equal(
        test["predicted"][..., [HIGH, LOW]], unmasked.prices_NHC[..., 1:3]
    )
    # The model's close is worse than persistence, its high and low better than the band.
    unmasked_cols = metrics.errors(test["actual"], unmasked.prices_NHC)
    scored_cols = scored.entry["test"]["columns"]
    assert scored_cols["close"]["mae"] < unmasked_cols["close"]["mae"]
    assert scored_cols["high"]["mae"] == pytest.approx(unmasked_cols["high"]["mae"], rel=1e-12)


def test_without_the_switch_nothing_changes():
    cfg, prep, module, params = _forced_model()
    off = evaluate.evaluate_model(module, params, prep, evaluate.EvalSpec(L, H))
    assert "baseline_columns" not in off.entry and heads.keep_columns(off.params) is None
    unmasked = forecast.split_forecast(module, params, prep, "test", evaluate.EvalSpec(L, H))
    np.testing.assert_array_equal(off.record["predicted"], unmasked.prices_NHC)


def _frame(cfg, prep, t: int) -> pd.DataFrame:
    """The source candles up to and including prep's row t, as Model.predict takes them."""
    loaded, _ = sources.load_all(cfg.data)
    series = next(s for s in loaded if s.name == prep.name)
    rows = series.open_time_ms <= prep.open_time_ms[t]
    frame = pd.DataFrame(series.ohlcv[rows], columns=["open", "high", "low", "close", "volume"])
    frame.index = pd.to_datetime(series.open_time_ms[rows], unit="ms", utc=True)
    return frame


def test_load_predict_and_export_apply_the_saved_mask(tmp_path):
    cfg, prep, module, params = _forced_model()
    spec = evaluate.make_spec(cfg)  # the run's own: band refit, interval and fallback
    assert spec.column_fallback
    scored = evaluate.evaluate_model(module, params, prep, spec)
    entry = {"num_params": 0, "status": "trained", "best_epoch": 1, "best_val_loss": 0.0}
    entry.update(scored.entry)
    workdir = str(tmp_path)
    saved.keep_model(workdir, saved.RunMeta.from_config(cfg), prep, scored, entry)
    model_dir = workdir_lib.series_model(workdir, prep.name)
    export_dir = portable.export_series(model_dir, entry, str(tmp_path / "export" / prep.name))
    i = len(scored.record["predicted"]) // 2  # a test window in the middle
    t = int(prep.ends["test"][i])
    want = forecast.consistent_ohlc(scored.record["predicted"][i])
    frame = _frame(cfg, prep, t)
    for path in (model_dir, export_dir):
        got = cpbjax.load(path).predict(frame)[list(columns.COLUMNS)].to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_array_equal(got[:, CLOSE], prep.ohlc[t, CLOSE])  # persistence
    assert saved.load_model(model_dir).trained.eval.column_fallback
    assert writers.read_json(f"{model_dir}/meta.json")["baseline_columns"] == ["open", "close"]
    # --mode evaluate scores the saved mask as it is, without deciding again.
    loaded = saved.load_model(model_dir)
    keep_as_saved = dataclasses.replace(spec, column_fallback=False)
    again = evaluate.evaluate_model(loaded.module, loaded.params, prep, keep_as_saved)
    assert again.entry["baseline_columns"] == ["open", "close"]
    np.testing.assert_allclose(again.record["predicted"], scored.record["predicted"], rtol=1e-6)


def test_the_switch_without_a_baseline_is_refused_by_name():
    c = levers_config()
    c.model.baseline, c.eval.refit_band, c.eval.column_fallback = "none", True, False
    with pytest.raises(ConfigError, match=r"eval\.column_fallback.*model\.baseline"):
        config_lib.validate(c)
    assert evaluate.make_spec(levers_config()).column_fallback  # on by default with a band
    c.eval.column_fallback = True  # the default: no baseline, nothing to fall back to
    assert not evaluate.make_spec(config_lib.validate(c)).column_fallback


def test_the_report_counts_each_column_forecast_by_its_baseline():
    results = {
        "series": {
            "A-1h": {"baseline_columns": ["close"]},
            "B-1h": {"baseline_columns": ["open", "close"]},
            "C-1h": {"baseline_columns": []},
            "D-1h": {},  # decided nothing (eval.column_fallback off, an earlier run)
        }
    }
    (line,) = report_tables.fallback_lines(results)
    assert line.endswith("of 3 series: open 1, high 0, low 0, close 2.")
    assert report_tables.fallback_lines({"series": {"D-1h": {}}}) == []


def test_a_mask_comes_off_as_it_went_on():
    _, _, module, params = _forced_model()
    for p in (params, {"members": jax.tree.map(lambda a: np.stack([a, a]), params)}):
        masked = heads.with_keep(p, [True, False, True, False])
        np.testing.assert_array_equal(heads.keep_columns(masked), [True, False, True, False])
        stripped = heads.without_keep(masked)
        assert heads.keep_columns(stripped) is None
        assert jax.tree.structure(stripped) == jax.tree.structure(p)


def test_series_scored_side_by_side_score_as_one_by_one(monkeypatch):
    # The driver scores a group's series in threads (evaluate.map_series): each result
    # must be the one a plain loop gives, the column fallback's jitted bar included.
    cfg, prep, module, params = _forced_model()
    variants = [jax.tree.map(lambda a, k=k: a * np.float32(1 + 0.1 * k), params) for k in range(4)]

    def score(p):
        scored = evaluate.evaluate_model(module, p, prep, _spec(cfg, refit_band=True))
        return writers.to_jsonable(scored.entry), scored.record["predicted"]

    monkeypatch.setattr(evaluate, "SCORING_THREADS", 4)
    side_by_side = evaluate.map_series(score, variants)
    for (entry, predicted), p in zip(side_by_side, variants, strict=True):
        want_entry, want_predicted = score(p)
        assert entry == want_entry
        np.testing.assert_array_equal(predicted, want_predicted)
    assert len({e["test"]["columns"]["high"]["mae"] for e, _ in side_by_side}) == 4
