"""Tests of cpbjax.data.windows: split, purge, leakage, normalisation and device gathers."""

import chex
import jax
import numpy as np
import pytest

from cpbjax import columns, writers
from cpbjax.data import features, latest, stacking, windows
from cpbjax.data.series import SeriesSkipped
from cpbjax.score import metrics
from tests.fake_data import STEP_MS, H, L, data_config, make_series, perturbed
from tests.references import reference_windows

INDICATORS = (
    "open",
    "high",
    "low",
    "close",
    "volume_norm",
    "rsi",
    "macd",
    "macd_signal",
    "bb_upper",
    "bb_lower",
    "bb_width",
    "log_return",
)


def _vmapped_gather(inputs, targets, anchor, price_mask, ends):
    axes = stacking.WindowSource(0, 0, 0, None)
    gather = jax.vmap(lambda source, e: stacking.gather(source, e, L, H), in_axes=(axes, 0))
    return gather(stacking.WindowSource(inputs, targets, anchor, price_mask), ends)


class GatherTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_gather_matches_plain_numpy(self):
        series = make_series()
        prep = windows.prepare_series(series, data_config(features=INDICATORS))
        ends = np.concatenate(
            [prep.ends[s][:: max(len(prep.ends[s]) // 4, 1)] for s in windows.SPLITS]
        )
        gather = self.variant(lambda source, e: stacking.gather(source, e, L, H))
        x, y = gather(stacking.window_source(prep), ends)
        chex.assert_shape(x, (len(ends), L, len(INDICATORS)))
        chex.assert_shape(y, (len(ends), H, 4))
        x_ref, y_ref = reference_windows(series, prep, INDICATORS, ends)
        np.testing.assert_allclose(x, x_ref, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_vmapped_gather_equals_per_coin(self):
        cfg = data_config(features=INDICATORS)
        preps = [windows.prepare_series(make_series(n=400 + 10 * k, seed=k), cfg) for k in range(3)]
        group = stacking.stack_group(preps, 4, cfg)
        ends_KB = group.train_ends[:, 5:21]
        x_KBLF, y_KBHC = self.variant(_vmapped_gather)(
            group.inputs, group.targets, group.anchor, group.price_mask, ends_KB
        )
        for k, prep in enumerate(preps):
            x, y = stacking.gather(stacking.window_source(prep), prep.ends["train"][5:21], L, H)
            np.testing.assert_array_equal(x_KBLF[k], x)
            np.testing.assert_array_equal(y_KBHC[k], y)


def test_last_close_round_trip_is_exact_on_host_and_float32_on_device():
    prep = windows.prepare_series(make_series(), data_config())
    ends = prep.ends["test"]
    actual = metrics.next_candles(prep.ohlc, ends, H)
    y_true = np.log(actual / prep.ohlc[ends, 3][:, None, None])  # float64, on the host
    np.testing.assert_allclose(windows.to_prices(prep, ends, y_true), actual, rtol=1e-12)
    _, y_device = stacking.gather(stacking.window_source(prep), ends, L, H)
    np.testing.assert_allclose(windows.to_prices(prep, ends, y_device), actual, rtol=2e-6)


def _train_view(prep):
    """Everything training reads: train ends and the rows, inputs and targets they touch."""
    n_train = prep.ends["train"][-1] + H + 1
    x, y = stacking.gather(stacking.window_source(prep), prep.ends["train"], L, H)
    return prep.ends["train"], prep.inputs[:n_train], prep.targets[:n_train], x, y


def test_later_candles_do_not_leak_into_training():
    cfg = data_config(features=INDICATORS)
    series = make_series(missing=(150, 300))
    prep = windows.prepare_series(series, cfg)
    offset = len(series.ohlcv) - len(prep.ohlc)
    boundary = offset + prep.ends["train"][-1] + H + 1  # first candle no training window reads
    assert boundary <= offset + prep.ends["val"][0] + 1  # ... at or before val's first target
    changed = windows.prepare_series(perturbed(series, boundary), cfg)
    for before, after in zip(_train_view(prep), _train_view(changed), strict=True):
        np.testing.assert_array_equal(before, after)
    for key, value in prep.norm.items():
        np.testing.assert_array_equal(changed.norm[key], value)
    assert not np.array_equal(prep.inputs, changed.inputs)  # the change did reach val/test
    # One candle earlier is a training target: the check above would catch it.
    touched = windows.prepare_series(perturbed(series, boundary - 1), cfg)
    assert not np.array_equal(_train_view(prep)[4], _train_view(touched)[4])


def test_a_saved_norm_scales_new_data_as_training_did():
    """evaluate/predict on new data: the training run's statistics, never re-fitted ones."""
    cfg = data_config(features=INDICATORS)
    trained_on, new = make_series(seed=0), make_series(seed=7)
    saved = writers.to_jsonable(windows.prepare_series(trained_on, cfg).norm)  # as meta.json
    prep = windows.prepare_series(new, cfg, fitted_norm=saved)
    # The training statistics, recomputed plainly from the training series.
    feats, _ = features.compute(trained_on.ohlcv, INDICATORS)
    first = len(trained_on.ohlcv) - cfg.max_candles
    n_train = windows.prepare_series(trained_on, cfg).ends["train"][-1] + H + 1
    mu, sd = feats[first:][:n_train].mean(axis=0), feats[first:][:n_train].std(axis=0)
    new_feats, _ = features.compute(new.ohlcv, INDICATORS)
    other = [j for j, n in enumerate(INDICATORS) if n not in columns.PRICE_FEATURES]
    expected = (new_feats[first:] - mu) / sd
    np.testing.assert_allclose(prep.inputs[:, other], expected[:, other], rtol=1e-5, atol=1e-5)
    refitted = windows.prepare_series(new, cfg)
    assert not np.allclose(refitted.inputs[:, other], prep.inputs[:, other], atol=1e-3)
    with pytest.raises(ValueError, match="feature_mean/feature_std do not fit 4 columns"):
        windows.prepare_series(new, data_config(), fitted_norm=saved)


@pytest.mark.parametrize("missing", [(), (260,), (250, 251, 298, 301, 305)])
def test_purged_splits_share_no_target_candle(missing):
    prep = windows.prepare_series(make_series(missing=missing), data_config())
    e = prep.ends
    assert e["train"].max() + H < e["val"].min() + 1  # last train target < first val target
    assert e["val"].max() + H < e["test"].min() + 1
    if not missing:  # without gaps, exactly the H windows before each boundary go
        all_ends = windows.contiguous_ends(prep.open_time_ms, STEP_MS, L, H)
        assert sum(len(v) for v in e.values()) == len(all_ends) - 2 * H


def test_split_ends_purges_by_index_across_gaps():
    ends = np.concatenate([np.arange(10, 18), np.arange(30, 38)])  # a gap after 17
    parts = windows.split_ends(ends, (0.5, 0.25, 0.25), horizon=3)
    # The gap already keeps train's targets (<= 20) before val's first window (30), so no
    # train window goes; val's 31..33 would read targets at or after test's anchor 34.
    np.testing.assert_array_equal(parts["train"], np.arange(10, 18))
    np.testing.assert_array_equal(parts["val"], [30])
    np.testing.assert_array_equal(parts["test"], np.arange(34, 38))


def test_windows_never_span_a_gap_and_no_candle_is_invented():
    series = make_series(missing=(200, 201, 330))
    prep = windows.prepare_series(series, data_config())
    assert np.isin(prep.open_time_ms, series.open_time_ms).all()
    assert len(np.unique(prep.open_time_ms)) == len(prep.open_time_ms)
    ends = np.concatenate([prep.ends[s] for s in windows.SPLITS])
    for t in ends:
        span = prep.open_time_ms[t - L + 1 : t + H + 1]
        assert (np.diff(span) == STEP_MS).all()
    # Every gap-free end that survives purging is used: the gaps removed only spanning ones.
    gap_rows = np.nonzero(np.diff(prep.open_time_ms) != STEP_MS)[0]
    assert len(gap_rows) == 2
    for g in gap_rows:  # a window spans the gap after row g if t-L+1 <= g < t+H
        assert not ((ends - L + 1 <= g) & (g < ends + H)).any()


@pytest.mark.parametrize("missing", [(), (200, 201, 330)])
def test_window_ends_are_every_gap_free_span_by_a_plain_loop(missing):
    """The windows are exactly the ends t whose candles t-L+1..t+H follow each other one
    step apart, found by a loop over every row: the gather tests compare each window with
    a plain reference at the ends given, so an end moved by one would pass them."""
    prep = windows.prepare_series(make_series(missing=missing), data_config())
    times = prep.open_time_ms
    expected = [
        t
        for t in range(L - 1, len(times) - H)
        if all(times[r + 1] - times[r] == STEP_MS for r in range(t - L + 1, t + H))
    ]
    np.testing.assert_array_equal(windows.contiguous_ends(times, STEP_MS, L, H), expected)
    used = np.concatenate([prep.ends[s] for s in windows.SPLITS])
    assert np.isin(used, expected).all() and len(used) > 0.9 * len(expected)


@pytest.mark.parametrize("splits", [(0.7, 0.15, 0.15), (0.5, 0.3, 0.2), (1 / 3, 1 / 3, 1 / 3)])
def test_padded_sizes_bound_every_series(splits):
    cfg = data_config(splits=splits, min_candles=60)
    sizes = stacking.padded_sizes(cfg)
    n_max = cfg.max_candles - L - H + 1
    for n in range(n_max + 1):  # every possible window count, purged or not
        parts = windows.split_ends(np.arange(n) + L - 1, splits, H)
        assert all(len(parts[s]) <= sizes[s] for s in windows.SPLITS), n
    for n_candles, missing in [(60, ()), (200, (50,)), (361, ()), (500, (400, 420)), (900, ())]:
        prep = windows.prepare_series(make_series(n=n_candles, missing=missing), cfg)
        assert len(prep.inputs) <= sizes["T"]
        assert all(len(prep.ends[s]) <= sizes[s] for s in windows.SPLITS)


def test_stack_group_pads_and_masks():
    cfg = data_config(min_candles=100)
    preps = [windows.prepare_series(make_series(n=n, seed=n), cfg) for n in (360, 150)]
    group = stacking.stack_group(preps, 3, cfg)
    sizes = stacking.padded_sizes(cfg)
    chex.assert_shape(group.inputs, (3, sizes["T"], 4))
    chex.assert_shape(group.targets, (3, sizes["T"], 4))
    for split in windows.EPOCH_SPLITS:  # the test split never reaches the devices
        ends, mask = (np.asarray(a) for a in group.ends(split))
        chex.assert_shape(ends, (3, sizes[split]))
        assert ends.min() >= L - 1 and ends.max() + H < sizes["T"]
        assert not mask[2].any()
        for k, prep in enumerate(preps):
            n = len(prep.ends[split])
            np.testing.assert_array_equal(ends[k, :n], prep.ends[split])
            assert mask[k, :n].all() and not mask[k, n:].any()
    assert not hasattr(group, "test_ends")
    np.testing.assert_array_equal(group.inputs[1, : len(preps[1].inputs)], preps[1].inputs)
    assert not np.asarray(group.inputs[1, len(preps[1].inputs) :]).any()
    assert not np.asarray(group.inputs[2]).any()
    with pytest.raises(ValueError, match="group_size=1"):
        stacking.stack_group(preps, 1, cfg)


def test_series_fits_in_threads_equal_them_one_by_one(monkeypatch):
    cfg = data_config(min_candles=100)
    preps = [windows.prepare_series(make_series(n=n, seed=n), cfg) for n in (360, 150, 300)]
    monkeypatch.setattr(stacking, "FIT_THREADS", 3)
    group = stacking.stack_group(preps, 4, cfg)
    for k, prep in enumerate(preps):  # each series' own fits, computed alone
        np.testing.assert_array_equal(group.band[k], stacking.band_factors(prep, L, H))
        np.testing.assert_array_equal(group.target_scale[k], stacking.persistence_scale(prep, H))
    np.testing.assert_array_equal(group.band[3], stacking.default_band(H))  # the padded coin


def test_warmup_is_dropped_and_costs_no_kept_candle():
    series = make_series(n=420)
    prep = windows.prepare_series(series, data_config(features=INDICATORS))
    assert len(prep.inputs) == 360  # history before the kept candles fills the warm-up
    short = windows.prepare_series(make_series(n=300), data_config(features=INDICATORS))
    assert len(short.inputs) == 300 - 33  # macd_signal's warm-up rows are dropped
    assert np.isfinite(short.inputs).all()


def test_too_few_candles_is_skipped_with_the_field_named():
    with pytest.raises(SeriesSkipped, match=r"data\.min_candles=200"):
        windows.prepare_series(make_series(n=210), data_config(features=INDICATORS))


def test_prepare_all_skips_one_bad_series_and_keeps_the_rest():
    good, short = make_series(), make_series(n=150, seed=2)
    short.symbol = "SHORTUSDT"
    preps, skipped = windows.prepare_all([good, short], data_config())
    assert [p.name for p in preps] == ["TESTUSDT-1h"]
    assert list(skipped) == ["SHORTUSDT-1h"]
    assert "data.min_candles=200" in skipped["SHORTUSDT-1h"]


def test_prepare_all_in_threads_equals_each_series_prepared_alone(monkeypatch):
    """Series are prepared side by side; each is what prepare_series gives it alone, in
    input order, and a skipped one keeps its reason."""
    series = [make_series(n=n, seed=n) for n in (420, 150, 360, 300)]
    for k, s in enumerate(series):
        s.symbol = f"S{k}USDT"
    cfg = data_config(features=INDICATORS)
    monkeypatch.setattr(windows, "PREPARE_THREADS", 3)
    preps, skipped = windows.prepare_all(series, cfg)
    assert [p.name for p in preps] == ["S0USDT-1h", "S2USDT-1h", "S3USDT-1h"]
    with pytest.raises(SeriesSkipped) as alone:
        windows.prepare_series(series[1], cfg)
    assert skipped == {"S1USDT-1h": str(alone.value)}
    for prep, s in zip(preps, [series[0], *series[2:]], strict=True):
        own = windows.prepare_series(s, cfg)
        for field in ("inputs", "targets", "anchor", "ohlc"):
            assert getattr(prep, field).tobytes() == getattr(own, field).tobytes(), field
        assert {k: e.tolist() for k, e in prep.ends.items()} == {
            k: e.tolist() for k, e in own.ends.items()
        }


def test_latest_window_is_the_newest_normalised_window():
    series = make_series()
    prep = windows.prepare_series(series, data_config())
    x = latest.latest_window(prep, L)
    expected = np.log(series.ohlcv[-L:, :4] / series.ohlcv[-1, 3])
    np.testing.assert_allclose(x[0], expected, atol=1e-6)
    gap = windows.prepare_series(make_series(missing=(415,)), data_config())
    with pytest.raises(ValueError, match="TESTUSDT-1h"):
        latest.latest_window(gap, L)


def test_groups_pad_to_the_longest_series_not_to_max_candles():
    cfg = data_config(min_candles=100)
    cfg.max_candles = 5000
    preps = [windows.prepare_series(make_series(n=n, seed=n), cfg) for n in (360, 150)]
    t_max = stacking.padded_length(preps, cfg)
    assert t_max == stacking.LENGTH_BUCKET  # the longest kept series fits one bucket
    group = stacking.stack_group(preps, 2, cfg, t_max)
    chex.assert_shape(group.inputs, (2, t_max, 4))
    assert group.train_ends.shape[1] == stacking.padded_sizes(cfg, t_max)["train"]
    assert stacking.padded_sizes(cfg, t_max)["train"] < stacking.padded_sizes(cfg)["train"]
    cfg.max_candles = 300  # never past data.max_candles
    assert stacking.padded_length(preps, cfg) == 300
