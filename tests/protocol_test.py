"""Tests of the evaluation protocol (issue 42): the tuning / confirmation split of the
mirror's pairs, calendar splits (data.split_dates) and all the history (data.months=0,
data.max_candles=0).

Calendar splits are checked against plain loops over the candles: which split each
window falls in, and that no training window of any series overlaps another series'
val or test span in a pooled run. Nothing here reads the shared mirror: the history
tests build their own small mirror.
"""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import (
    folds,
    pairs,
    pooling,
    sources,
    split_dates,
    stacking,
    synthetic,
    windows,
)
from cpbjax.data.series import INTERVAL_MS, Series, split_date_ms
from tests import binance_test, launch_test
from tests.fake_data import make_series

L, H = 8, 3
HOUR = INTERVAL_MS["1h"]
DAY = 24 * HOUR
JAN_1 = split_date_ms("2025-01-01")
DATES = ("2025-01-15", "2025-01-20")  # val from Jan 15, test from Jan 20 (UTC)
BOUNDS = (split_date_ms(DATES[0]), split_date_ms(DATES[1]))
server = binance_test.server  # the fixture: a mirror served on 127.0.0.1


# ---------------------------------------------------------------------------------------
# The tuning / confirmation split.


def test_the_rule_reproduces_the_lists_and_they_partition_the_mirror():
    assert len(pairs.MIRROR_SYMBOLS) == 67 == len(set(pairs.MIRROR_SYMBOLS))
    assert all(s.endswith("USDT") for s in pairs.MIRROR_SYMBOLS)
    # The rule, counted by hand: every fourth symbol in alphabetical order is confirmation.
    tuning, confirmation = [], []
    for position, symbol in enumerate(sorted(pairs.MIRROR_SYMBOLS), start=1):
        (confirmation if position % 4 == 0 else tuning).append(symbol)
    assert tuple(confirmation) == pairs.CONFIRMATION_SYMBOLS
    assert tuple(tuning) == pairs.TUNING_SYMBOLS
    assert (len(tuning), len(confirmation)) == (51, 16)
    assert pairs.CONFIRMATION_SYMBOLS[:3] == ("ARBUSDT", "BATUSDT", "CHZUSDT")
    assert not set(tuning) & set(confirmation)
    assert sorted(tuning + confirmation) == sorted(pairs.MIRROR_SYMBOLS)
    for held in pairs.HELD_OUT:
        for listed in (pairs.MIRROR_SYMBOLS, tuning, confirmation, config_lib.DEFAULT_SYMBOLS):
            assert held not in listed
    assert config_lib.TUNING_SYMBOLS is pairs.TUNING_SYMBOLS
    assert config_lib.CONFIRMATION_SYMBOLS is pairs.CONFIRMATION_SYMBOLS


@pytest.mark.parametrize(
    "name,expected",
    [
        ("@tuning", pairs.TUNING_SYMBOLS),
        ("@confirmation", pairs.CONFIRMATION_SYMBOLS),
        ("@mirror", pairs.MIRROR_SYMBOLS),
    ],
)
def test_a_named_list_expands_when_the_config_is_validated(name, expected):
    c = config_lib.load("configs/gru.py")
    c.data.symbols = (name,)
    assert config_lib.validate(c).data.symbols == expected
    assert config_lib.validate(c).data.symbols == expected  # validating again keeps it


@pytest.mark.parametrize(
    "symbols", [("@held_out",), ("@tuning", "BTCUSDT"), ("@tuning", "@confirmation")]
)
def test_an_unknown_or_mixed_named_list_is_a_config_error(symbols):
    c = config_lib.load("configs/gru.py")
    c.data.symbols = symbols
    with pytest.raises(ConfigError, match=r"data\.symbols=.*a named list stands alone"):
        config_lib.validate(c)


def test_launch_expands_a_named_list_and_config_json_records_the_symbols(tmp_path):
    # Series of 100 candles, all below data.min_candles: every series is skipped, and
    # the run writes config.json and results.json before it exits 2 (nothing trains).
    workdir = str(tmp_path / "run")
    proc = launch_test._launch(
        "--config",
        "configs/gru.py:tiny",
        "--workdir",
        workdir,
        "--config.data.symbols=('@confirmation',)",
        "--config.data.intervals=('1h',)",
        "--config.data.synthetic_candles=100",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no series could be trained" in proc.stderr
    with open(os.path.join(workdir, "config.json")) as f:
        assert tuple(json.load(f)["data"]["symbols"]) == pairs.CONFIRMATION_SYMBOLS
    with open(os.path.join(workdir, "results.json")) as f:
        skipped = json.load(f)["skipped"]
    assert sorted(skipped) == sorted(f"{s}-1h" for s in pairs.CONFIRMATION_SYMBOLS)


# ---------------------------------------------------------------------------------------
# Calendar splits.


def _data_cfg(**overrides):
    d = config_lib.base_config().data
    d.lookback, d.horizon, d.max_candles, d.min_candles = L, H, 0, 50
    d.split_dates = DATES
    for key, value in overrides.items():
        d[key] = value
    return d


def _reference_split(series, t, bounds, lookback=L, horizon=H):
    """The split of the window ending at t by a loop over its candles, or None."""
    step, times = INTERVAL_MS[series.interval], series.open_time_ms
    if t - lookback + 1 < 0 or t + horizon >= len(times):
        return None
    rows = range(t - lookback + 1, t + horizon + 1)
    if any(times[i + 1] - times[i] != step for i in rows[:-1]):
        return None  # the window would span a gap
    val_start, test_start = bounds
    targets = range(t + 1, t + horizon + 1)
    if all(times[i] + step <= val_start for i in rows):
        return "train"
    if all(val_start <= times[i] and times[i] + step <= test_start for i in targets):
        return "val"
    if all(times[i] >= test_start for i in targets):
        return "test"
    return None


SERIES = (
    # 1h from Jan 1 with a gap in the train span; 1h from Jan 6 03:00 with a gap in the
    # val span (Jan 15 05:00); 15m from Jan 12 (3 days of train); 1h from Jan 3 to Jan 26.
    make_series(26 * 24, symbol="AAAUSDT", first_open_ms=JAN_1, missing=(100, 101, 102)),
    make_series(
        19 * 24,
        symbol="BBBUSDT",
        first_open_ms=JAN_1 + 5 * DAY + 3 * HOUR,
        missing=(218, 219),
        seed=1,
    ),
    make_series(12 * 96, symbol="CCCUSDT", interval="15m", first_open_ms=JAN_1 + 11 * DAY, seed=2),
    make_series(23 * 24, symbol="DDDUSDT", first_open_ms=JAN_1 + 2 * DAY, seed=3),
)


@pytest.mark.parametrize("series", SERIES, ids=lambda s: s.name)
def test_calendar_splits_match_a_loop_over_the_candles(series):
    cfg, bounds = _data_cfg(), BOUNDS
    prep = windows.prepare_series(series, cfg)
    assert len(prep.inputs) == len(series.ohlcv)  # max_candles=0 keeps every candle
    expected = {split: [] for split in windows.SPLITS}
    for t in range(len(series.open_time_ms)):
        split = _reference_split(series, t, bounds)
        if split:
            expected[split].append(t)
    for split in windows.SPLITS:
        assert prep.ends[split].tolist() == expected[split], split
        assert len(expected[split]) > 0
    sizes = stacking.padded_sizes(cfg, stacking.padded_length([prep], cfg))
    assert all(len(prep.ends[s]) <= sizes[s] for s in windows.SPLITS)


def _candles(prep, rows):
    """[open, close) of each candle row, a list of pairs (epoch ms)."""
    step = INTERVAL_MS[prep.interval]
    return [(int(prep.open_time_ms[i]), int(prep.open_time_ms[i]) + step) for i in rows]


def _span(prep, split):
    """[first open, last close) of the target candles of a series' windows of `split`."""
    spans = _candles(prep, [i for t in prep.ends[split] for i in range(t + 1, t + H + 1)])
    return min(a for a, _ in spans), max(b for _, b in spans)


EARLY = make_series(
    13 * 24, symbol="EEEUSDT", first_open_ms=JAN_1, seed=4
)  # ends Jan 14, before the val span


def test_no_training_window_of_any_series_overlaps_another_series_val_or_test_span():
    cfg = _data_cfg()
    series = [*SERIES, EARLY]
    preps, skipped = windows.prepare_all(series, cfg, keep_train_only=True)  # a pooled run's
    assert skipped == {} and len(preps) == len(series)
    assert [split_dates.is_train_only(p) for p in preps] == [False] * len(SERIES) + [True]
    kept, ends, emptied = pooling.pooled_series(preps, cfg)  # the pooled run's windows
    assert emptied == {} and [p.name for p in kept] == [p.name for p in preps]
    val_start, test_start = split_date_ms(DATES[0]), split_date_ms(DATES[1])
    for p in preps:
        # By construction the pooled purge has nothing left to remove.
        for split in ("train", "val"):
            np.testing.assert_array_equal(ends[p.name][split], p.ends[split])
        assert len(ends[p.name]["train"]) > 0
        if split_dates.is_train_only(p):
            assert not len(p.ends["val"]) and not len(p.ends["test"])
            continue
        lo, hi = _span(p, "val")
        assert val_start <= lo and hi <= test_start  # every series' val span is the same
        assert _span(p, "test")[0] >= test_start
    for p in preps:
        for other in preps:
            if other is p or split_dates.is_train_only(other):  # it has no val or test span
                continue
            scored = {split: _span(other, split) for split in ("val", "test")}
            for split, against in (("train", ("val", "test")), ("val", ("test",))):
                for t in ends[p.name][split]:
                    for a, b in _candles(p, range(t - L + 1, t + H + 1)):
                        for s in against:
                            lo, hi = scored[s]
                            assert b <= lo or a >= hi, (p.name, split, t, other.name, s)


def test_a_series_ending_before_the_val_span_is_training_data_only():
    preps, skipped = windows.prepare_all([EARLY, SERIES[0]], _data_cfg())
    assert [p.name for p in preps] == ["AAAUSDT-1h"]
    expected = [t for t in range(len(EARLY.ohlcv)) if _reference_split(EARLY, t, BOUNDS)]
    assert skipped["EEEUSDT-1h"] == (
        f"training data only: ends before data.split_dates[0] (2025-01-15): {len(expected)} "
        "train windows, no val or test window to score"
    )
    kept = windows.prepare_series(EARLY, _data_cfg(), keep_train_only=True)
    assert kept.ends["train"].tolist() == expected
    assert kept.notes[split_dates.TRAIN_ONLY] == skipped["EEEUSDT-1h"]


def test_fractional_splits_stay_the_default():
    cfg = _data_cfg(split_dates=(), max_candles=360)
    assert config_lib.base_config().data.split_dates == ()
    prep = windows.prepare_series(SERIES[3], cfg)
    ends = windows.contiguous_ends(prep.open_time_ms, HOUR, L, H)
    expected = windows.split_ends(ends, cfg.splits, H)
    for split in windows.SPLITS:
        np.testing.assert_array_equal(prep.ends[split], expected[split])


@pytest.mark.parametrize(
    "dates,message",
    [
        (("2025-01", "2024-12"), "in order"),
        (("2025-01", "2025-01"), "in order"),
        (("2025-13", "2026-01"), "month must be in 1..12"),
        (("2025-02-30", "2026-01"), "day is out of range"),
        (("2025/01", "2026-01"), "not a date as YYYY-MM or YYYY-MM-DD"),
        (("2025-01",), "two dates"),
    ],
)
def test_bad_split_dates_are_config_errors(dates, message):
    c = config_lib.load("configs/gru.py")
    c.data.split_dates = dates
    with pytest.raises(ConfigError, match=r"data\.split_dates") as e:
        config_lib.validate(c)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "dates,empty", [(("2025-02", "2025-03"), "val"), (("2024-12-01", "2024-12-20"), "train")]
)
@pytest.mark.parametrize("keep_train_only", [False, True])
def test_a_split_without_any_window_is_a_config_error(dates, empty, keep_train_only):
    with pytest.raises(ConfigError, match=rf"data\.split_dates.*no series has a {empty}"):
        windows.prepare_all(
            list(SERIES), _data_cfg(split_dates=dates), keep_train_only=keep_train_only
        )


def test_a_backtest_refuses_split_dates():
    c = config_lib.load("configs/gru.py:tiny")
    with pytest.raises(ConfigError, match=r"data\.split_dates=.*--mode backtest"):
        folds.prepare_all(list(SERIES), _data_cfg(), c.backtest)


def test_launch_refuses_unordered_split_dates_with_exit_2():
    proc = launch_test._launch(
        "--config", "configs/gru.py:tiny", "--config.data.split_dates=('2025-06','2025-05')"
    )
    assert proc.returncode == 2
    assert "data.split_dates" in proc.stderr


def _launch_tiny(workdir, overrides):
    flags = [f"--config.{k}={v if isinstance(v, str) else repr(v)}" for k, v in overrides.items()]
    return launch_test._launch(
        "--config", "configs/gru.py:tiny", "--workdir", workdir, *flags, timeout=600
    )


def _pooled_overrides(dates, **data) -> dict:
    """The overrides of a one-epoch pooled tiny run split at `dates`; data: data.* fields."""
    fields = {f"data.{key}": value for key, value in data.items()}
    return fields | {
        "data.split_dates": dates,
        "train.share": "pooled",
        "train.epochs": 1,
        "eval.plots": False,
    }


def test_a_pooled_run_with_split_dates_trains_and_scores_the_calendar_windows(tmp_path):
    """End to end through launch.py: a pooled tiny run of a 15m and a 1h series."""
    workdir, dates = str(tmp_path / "run"), ("2025-06-20", "2025-06-25")
    overrides = _pooled_overrides(dates, symbols=("BTCUSDT",))
    proc = _launch_tiny(workdir, overrides)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(workdir, "config.json")) as f:
        assert tuple(json.load(f)["data"]["split_dates"]) == dates
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert results["skipped"] == {} and len(results["series"]) == 2
    c = config_lib.load("configs/gru.py:tiny")
    c.update_from_flattened_dict(overrides)
    series, _ = sources.load_all(config_lib.validate(c).data)
    n, window = c.data.max_candles, (c.data.lookback, c.data.horizon)
    bounds = (split_date_ms(dates[0]), split_date_ms(dates[1]))
    for s in series:  # the newest max_candles candles (OHLC inputs have no warm-up)
        kept = Series(s.symbol, s.interval, s.open_time_ms[-n:], s.ohlcv[-n:])
        found = [_reference_split(kept, t, bounds, *window) for t in range(n)]
        entry = results["series"][s.name]
        for split in ("val", "test"):
            assert entry[split]["windows"] == found.count(split) > 0, (s.name, split)


def _write_csv(folder, symbol, last_open_ms, n):
    """A <symbol>-1h.csv of n synthetic candles for the `local` source; the last opens at
    last_open_ms."""
    s = synthetic.generate(symbol, "1h", n, end_ms=last_open_ms + HOUR - 1)
    frame = pd.DataFrame(s.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame.insert(0, "open_time", s.open_time_ms)
    frame.to_csv(os.path.join(folder, f"{symbol}-1h.csv"), index=False)
    return Series(symbol, "1h", s.open_time_ms, s.ohlcv)


def _reference_splits(series: tuple[Series, ...], dates) -> dict[str, list]:
    """Per series name, the split (`_reference_split`) of the tiny config's window ending
    at each of its newest max_candles candles (OHLC inputs have no warm-up)."""
    c = config_lib.load("configs/gru.py:tiny")
    n, window = c.data.max_candles, (c.data.lookback, c.data.horizon)
    bounds = (split_date_ms(dates[0]), split_date_ms(dates[1]))
    kept = (Series(s.symbol, s.interval, s.open_time_ms[-n:], s.ohlcv[-n:]) for s in series)
    return {k.name: [_reference_split(k, t, bounds, *window) for t in range(n)] for k in kept}


def test_a_pooled_run_trains_on_a_train_only_series_and_scores_the_others(tmp_path):
    """End to end through launch.py: one series ends before the val span; the pooled
    model trains on its windows, and results.json scores only the other one."""
    folder, dates = tmp_path / "csv", ("2025-06-15", "2025-06-22")
    folder.mkdir()
    full = _write_csv(folder, "AAAUSDT", split_date_ms("2025-06-30"), 1400)
    early = _write_csv(folder, "BBBUSDT", split_date_ms("2025-06-10"), 1400)
    workdir = str(tmp_path / "run")
    overrides = _pooled_overrides(
        dates,
        source="local",
        local_dir=str(folder),
        symbols=("AAAUSDT", "BBBUSDT"),
        intervals=("1h",),
    )
    proc = _launch_tiny(workdir, overrides)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert list(results["series"]) == ["AAAUSDT-1h"]
    assert results["skipped"]["BBBUSDT-1h"].startswith("training data only")
    assert not os.path.exists(os.path.join(workdir, "models", "BBBUSDT-1h"))
    found = _reference_splits((full, early), dates)
    for split in ("val", "test"):
        assert results["series"]["AAAUSDT-1h"][split]["windows"] == found["AAAUSDT-1h"].count(split)
    with open(workdir_lib.ledger(workdir)) as f:  # the windows the pooled model trained on
        trained = json.load(f)["fingerprint"]["pool_windows"]
    assert trained == {
        name: [windows_of.count("train"), windows_of.count("val")]
        for name, windows_of in found.items()
    }
    assert trained["BBBUSDT-1h"][0] > 0 and trained["BBBUSDT-1h"][1] == 0
    # ... and the epochs did train on them: a training-data-only coin reports a train loss
    # of its windows, and the pooled val loss its early stopping judged.
    with open(workdir_lib.metrics_jsonl(workdir)) as f:
        records = [json.loads(line) for line in f]
    for record in records:
        losses = dict(zip(record["series"], record["train_loss"], strict=True))
        assert losses["BBBUSDT-1h"] is not None and math.isfinite(losses["BBBUSDT-1h"])
        assert record["pooled_val_loss"] is not None


# ---------------------------------------------------------------------------------------
# All the history.


def _history_cfg(root, cache, **overrides):
    return binance_test._cfg(root, cache, ["BTCUSDT"], months=0, **overrides)


def test_months_0_loads_every_month_of_a_directory_mirror(tmp_path):
    root = binance_test._mirror(tmp_path / "mirror", ["BTCUSDT"])
    os.remove(binance_test._zip(root, "BTCUSDT", "2024-11"))  # a hole stays a gap
    loaded, skipped = binance_test._load(_history_cfg(root, tmp_path / "cache"))
    assert skipped == {}
    s = loaded["BTCUSDT-1h"]
    kept = [m for m in binance_test.MONTHS if m != "2024-11"]
    times, ohlcv = binance_test._reference("BTCUSDT", kept)
    np.testing.assert_array_equal(s.open_time_ms, times)
    np.testing.assert_allclose(s.ohlcv, ohlcv, rtol=0, atol=1e-8)
    assert s.notes["months"] == kept
    assert s.notes["failed_months"] == {"2024-11": "missing from the mirror"}
    assert s.notes["gaps"] == binance_test.HOURS["2024-11"]


def test_months_0_probes_every_month_over_http(server, tmp_path):
    base_url, root, _ = server
    binance_test._mirror(root, ["BTCUSDT"])
    loaded, skipped = binance_test._load(_history_cfg(base_url, tmp_path / "cache"))
    assert skipped == {}
    assert loaded["BTCUSDT-1h"].notes["months"] == binance_test.MONTHS
    times, _ = binance_test._reference("BTCUSDT", binance_test.MONTHS)
    np.testing.assert_array_equal(loaded["BTCUSDT-1h"].open_time_ms, times)


def test_max_candles_0_keeps_every_candle_and_pads_to_the_data(tmp_path):
    c = config_lib.load("configs/gru.py")
    c.data.months, c.data.max_candles = 0, 0  # min_candles (5000) needs no cap above it
    config_lib.validate(c)
    root = binance_test._mirror(tmp_path / "mirror", ["BTCUSDT"])
    d = _history_cfg(root, tmp_path / "cache", max_candles=0, lookback=L, horizon=H)
    loaded, _ = binance_test._load(d)
    prep = windows.prepare_series(loaded["BTCUSDT-1h"], d)
    assert len(prep.inputs) == sum(binance_test.HOURS.values())
    t_max = stacking.padded_length([prep], d)
    assert t_max == -(-len(prep.inputs) // stacking.LENGTH_BUCKET) * stacking.LENGTH_BUCKET
    sizes = stacking.padded_sizes(d, t_max)
    assert all(len(prep.ends[s]) <= sizes[s] for s in windows.SPLITS)
