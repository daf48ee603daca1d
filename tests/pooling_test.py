"""Tests of cpbjax/data/pooling.py: a pooled model never learns another series' scored period.

The purge is checked against a candle-by-candle loop, and end to end: a pooled run in
which one series' candles inside another's val/test period are replaced by garbage
trains exactly the same model.
"""

import dataclasses
import os
import types
from unittest import mock

import numpy as np
import pytest

from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.data import pooling
from cpbjax.data.series import INTERVAL_MS
from cpbjax.modes import driver, plan
from cpbjax.training import checkpoint
from tests import helpers

L, H = 4, 2
HOUR = INTERVAL_MS["1h"]


def _series(name, interval, first_open_ms, n, splits=(0.6, 0.2)):
    """A duck-typed PreparedSeries: n gap-free candles and chronological, purged splits."""
    step_ms = INTERVAL_MS[interval]
    ends = np.arange(L - 1, n - H, dtype=np.int64)
    b1, b2 = int(len(ends) * splits[0]), int(len(ends) * sum(splits))
    parts = {"train": ends[:b1], "val": ends[b1:b2], "test": ends[b2:]}
    parts["train"] = parts["train"][parts["train"] + H < parts["val"][0]]
    parts["val"] = parts["val"][parts["val"] + H < parts["test"][0]]
    times = first_open_ms + step_ms * np.arange(n, dtype=np.int64)
    fields = dict(name=name, interval=interval, open_time_ms=times, ends=parts, notes={})
    return types.SimpleNamespace(**fields)


def _reference(preps):
    """The kept ends by brute force: every candle a window reads against every target
    candle of the other series' scored windows, each candle its [open, close)."""

    def candles(p, idx):
        return [
            (int(p.open_time_ms[i]), int(p.open_time_ms[i]) + INTERVAL_MS[p.interval]) for i in idx
        ]

    def period(p, splits):
        targets = [i for s in splits for t in p.ends[s] for i in range(t + 1, t + H + 1)]
        spans = candles(p, targets)
        return min(a for a, _ in spans), max(b for _, b in spans)

    kept = {}
    for p in preps:
        kept[p.name] = {}
        for split, scored in (("train", ("val", "test")), ("val", ("test",))):
            others = [period(o, scored) for o in preps if o.name != p.name]
            kept[p.name][split] = [
                t
                for t in p.ends[split]
                if not any(
                    a < hi and lo < b
                    for a, b in candles(p, range(t - L + 1, t + H + 1))
                    for lo, hi in others
                )
            ]
    return kept


def test_pool_ends_equal_a_candle_by_candle_reference():
    start = 1_700_000_000_000 // HOUR * HOUR
    preps = [
        _series("A-1h", "1h", start, 200),
        _series("B-15m", "15m", start + 100 * HOUR, 200),  # its test days are A's val
        _series("C-1h", "1h", start + 60 * HOUR, 200),  # A's scored days are its train
        _series("D-1h", "1h", start, 200),  # aligned with A: nothing to purge between them
    ]
    kept, emptied = pooling.pool_ends(preps, L, H)
    want = _reference(preps)
    assert not emptied
    for p in preps:
        for split in ("train", "val"):
            np.testing.assert_array_equal(kept[p.name][split], want[p.name][split], err_msg=p.name)
    # The fixture purges something in each split (or the comparison above is weak).
    assert len(kept["C-1h"]["train"]) < len(preps[2].ends["train"])
    assert len(kept["A-1h"]["val"]) < len(preps[0].ends["val"])


def test_a_series_left_without_train_windows_is_named():
    start = 1_700_000_000_000 // HOUR * HOUR
    # B's whole history lies inside A's val and test period.
    a, b = _series("A-1h", "1h", start, 400), _series("B-15m", "15m", start + 300 * HOUR, 200)
    kept, emptied = pooling.pool_ends([a, b], L, H)
    assert set(kept) == {"A-1h"} and set(emptied) == {"B-15m"}
    assert "every train window overlaps another series' val or test period" in emptied["B-15m"]


# ---------------------------------------------------------------------------------------
# A pooled run end to end (the driver in this process, on the tiny pooled config).

SHIFT = 120  # hours: ETH's train windows cover BTC's and SOL's val and test candles


def _misaligned_preps(garbage: bool):
    """tiny_preps' 3 series with ETHUSDT-1h 120 h later; with `garbage`, ETH's candles
    inside BTC's val/test period are replaced (inputs and targets +5 in log space)."""
    btc, eth, sol = helpers.tiny_preps()
    eth = dataclasses.replace(eth, open_time_ms=eth.open_time_ms + SHIFT * HOUR)
    if garbage:
        lo, hi = pooling.scored_period(btc, "val", _data().horizon)
        rows = (eth.open_time_ms + HOUR > lo) & (eth.open_time_ms < hi)
        assert rows.sum() > 50, "the shift must put ETH's candles in BTC's scored period"
        eth = dataclasses.replace(
            eth, inputs=eth.inputs + 5.0 * rows[:, None], targets=eth.targets + 5.0 * rows[:, None]
        )
    return [btc, eth, sol]


def _data():
    return helpers.pooled_config().data


def _pooled_run(workdir, garbage):
    config = helpers.pooled_config()
    config.train.epochs, config.train.patience = 4, 4
    config.eval.plots = False
    preps = _misaligned_preps(garbage)
    with mock.patch.object(plan, "prepare_all", return_value=(preps, {})):
        results = driver.train_and_evaluate(config, str(workdir))
    params, _ = checkpoint.load_series_model(os.path.join(workdir, "models", "BTCUSDT-1h"))
    return results, params, preps


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pooling")
    return _pooled_run(root / "clean", False), _pooled_run(root / "garbage", True), root


def test_pooled_model_never_reads_another_series_scored_candles(two_runs):
    (clean, clean_params, preps), (dirty, dirty_params, _), _ = two_runs
    helpers.assert_trees_close(clean_params, dirty_params, rtol=0, atol=0)
    for name in ("BTCUSDT-1h", "SOLUSDT-1h"):
        for split in ("val", "test"):
            assert (
                clean["series"][name][split]["columns"] == dirty["series"][name][split]["columns"]
            )
    # Not vacuous: ETH's own split would have trained on the replaced candles.
    kept, _ = pooling.pool_ends(preps, _data().lookback, _data().horizon)
    eth = preps[1]
    assert len(kept["ETHUSDT-1h"]["train"]) < len(eth.ends["train"]) - 50


def test_pooled_run_scores_every_window_and_fingerprints_the_purge(two_runs):
    (clean, _, preps), _, root = two_runs
    kept, _ = pooling.pool_ends(preps, _data().lookback, _data().horizon)
    for p in preps:
        entry = clean["series"][p.name]
        assert entry["val"]["windows"] == len(p.ends["val"])
        assert entry["test"]["windows"] == len(p.ends["test"])
    ledger = writers.read_json(workdir_lib.ledger(str(root / "clean")))
    want = {n: [len(e["train"]), len(e["val"])] for n, e in kept.items()}
    assert ledger["fingerprint"]["pool_windows"] == want
