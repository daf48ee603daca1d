"""Tests of cpbjax/score/baseline_cache.py: a series scored through the cache equals it
scored without, bit for bit, cold and warm; a warm score fits no baseline; a damaged entry
is named, recomputed and rewritten; other candles, windows, settings or code miss."""

import dataclasses
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from cpbjax import band
from cpbjax.config import schema as config_lib
from cpbjax.score import baseline_cache, baselines, evaluate, forecast, intervals
from cpbjax.score.series_arrays import SeriesArrays
from tests.fake_data import H, L, Probe, make_prep, probe_params

# A blended scale, so the interval is also compared with the scaled band.
SPEC = evaluate.EvalSpec(L, H, (0.1, 0.9), interval_vol=intervals.VOL_BLEND)


def _scores(prep, root: str) -> str:
    """Both splits' evaluate_split of a probe model with its calibrated interval, through
    the cache under root ("" for none), as JSON text (NaN compares equal as text)."""
    spec = dataclasses.replace(SPEC, baseline_cache=root)
    params, arrays = probe_params(), SeriesArrays(prep.ohlc)
    fcs = {
        s: forecast.split_forecast(Probe(), params, prep, s, spec) for s in ("train", "val", "test")
    }
    out = {}
    for split in ("val", "test"):
        point = {s: fcs[s].prices_NHC for s in (*baselines.SPLITS_BEFORE[split], split)}
        cal = intervals.fit_before(prep, split, point, spec, arrays)
        out[split] = evaluate.evaluate_split(prep, fcs[split], split, spec, cal, arrays)
    return json.dumps(out)


def _entries(root) -> list[str]:
    folder = os.path.join(root, f"v{baseline_cache.FORMAT}")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def _no_fits(monkeypatch):
    """Makes every baseline fit that the cached blocks run raise."""

    def refuse(*args, **kwargs):
        raise AssertionError("a baseline was fitted")

    for owner, name in (
        (baselines, "fit_ridge"),
        (baselines, "fit_har"),
        (band, "band_factors"),
        (intervals, "fit_band_quantiles"),
        (intervals, "scaled_band"),
    ):
        monkeypatch.setattr(owner, name, refuse)


def test_scores_through_the_cache_equal_those_without_and_a_rerun_fits_nothing(
    tmp_path, monkeypatch
):
    prep, root = make_prep(), str(tmp_path / "cache")
    plain = _scores(prep, "")
    assert not os.path.exists(root)
    assert _scores(prep, root) == plain  # cold: computed, stored
    assert len(_entries(root)) == 4  # two blocks (fitted baselines, band losses) per split
    assert baseline_cache.counts(root) == (0, 4)
    assert '"scaled_band_pinball"' in plain and '"har"' in plain  # both blocks are scored
    _no_fits(monkeypatch)
    assert _scores(prep, root) == plain  # warm: read back, nothing fitted
    assert baseline_cache.counts(root) == (4, 4)
    with pytest.raises(AssertionError, match="fitted"):
        _scores(prep, "")  # the fits that were skipped do run without the cache


@pytest.mark.parametrize("damage", ["flipped", "cut", "renamed"])
def test_a_damaged_entry_is_named_recomputed_and_rewritten(tmp_path, caplog, damage):
    prep, root = make_prep(), str(tmp_path / "cache")
    plain = _scores(prep, root)
    first, second = _entries(root)[:2]
    data = Path(first).read_bytes()
    if damage == "flipped":  # one bit in the middle of the JSON
        at = len(data) // 2
        data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]
    elif damage == "cut":
        data = data[: len(data) - 7]
    else:  # another entry's intact bytes under this name
        data = Path(second).read_bytes()
    Path(first).write_bytes(data)
    with caplog.at_level(logging.WARNING):
        assert _scores(prep, root) == plain
    warned = [r.getMessage() for r in caplog.records if "Baseline cache entry" in r.getMessage()]
    assert len(warned) == 1 and first in warned[0] and "damaged" in warned[0]
    key = os.path.basename(first).removesuffix(".json")
    assert baseline_cache._cache(root).load(key) is not None  # rewritten intact


def test_other_candles_windows_settings_or_code_miss(tmp_path, monkeypatch):
    prep, root = make_prep(), str(tmp_path / "cache")
    _scores(prep, root)
    arrays = SeriesArrays(prep.ohlc)
    key = baseline_cache.entry_key("b", {"lookback": L}, prep, arrays, {"fit": prep.ends["train"]})
    ohlc = prep.ohlc.copy()
    ohlc[5, 1] *= 1 + 1e-12  # one high, by one part in 10^12
    moved = dataclasses.replace(prep, ohlc=ohlc)
    others = [
        ("b", {"lookback": L}, moved, SeriesArrays(ohlc), {"fit": prep.ends["train"]}),
        ("b", {"lookback": L + 1}, prep, arrays, {"fit": prep.ends["train"]}),
        ("b", {"lookback": L}, prep, arrays, {"fit": prep.ends["train"][1:]}),
        ("c", {"lookback": L}, prep, arrays, {"fit": prep.ends["train"]}),
    ]
    keys = {baseline_cache.entry_key(*other) for other in others}
    assert len(keys) == len(others) and key not in keys
    assert _scores(moved, root) == _scores(moved, "")
    assert len(_entries(root)) == 8  # the moved candle missed every entry

    # A change to any of the package's sources changes every key.
    package = tmp_path / "pkg"
    (package / "score").mkdir(parents=True)
    (package / "score" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(baseline_cache, "_PACKAGE", package)
    baseline_cache.code_digest.cache_clear()
    before = baseline_cache.code_digest()
    (package / "score" / "a.py").write_text("x = 2\n")
    baseline_cache.code_digest.cache_clear()
    assert baseline_cache.code_digest() != before
    baseline_cache.code_digest.cache_clear()


def test_an_unwritable_folder_warns_once_and_scores_the_same(tmp_path, caplog):
    prep = make_prep()
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        assert _scores(prep, str(blocker / "cache")) == _scores(prep, "")
    warned = [r for r in caplog.records if "Cannot write to the baseline cache" in r.getMessage()]
    assert len(warned) == 1


def test_the_config_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    c = config_lib.base_config()
    assert evaluate.make_spec(c).baseline_cache == str(tmp_path / "cpbjax" / "baselines")
    c.eval.baseline_cache = "off"
    assert evaluate.make_spec(c).baseline_cache == ""
    c.eval.baseline_cache = "~/scores"
    assert evaluate.make_spec(c).baseline_cache == os.path.expanduser("~/scores")
    del c.eval.baseline_cache  # a saved model's config from before the field
    assert evaluate.make_spec(c).baseline_cache == str(tmp_path / "cpbjax" / "baselines")
    calls = []
    assert baseline_cache.cached("", "b", {}, None, None, {}, lambda: calls.append(1)) is None
    assert calls == [1]  # off: computed, nothing read or written


def test_numpy_values_are_kept_as_the_python_values_they_hold(tmp_path):
    prep, root = make_prep(), str(tmp_path / "cache")
    arrays = SeriesArrays(prep.ohlc)
    block = {"n": np.int64(3), "k": np.arange(2.0), "x": np.float32(0.5), "nan": float("nan")}
    args = (root, "b", {}, prep, arrays, {"fit": prep.ends["train"]})
    for _ in range(2):  # stored, then read back
        got = baseline_cache.cached(*args, lambda b=block: b)
        assert got["n"] == 3 and got["k"] == [0.0, 1.0] and got["x"] == 0.5
        assert np.isnan(got["nan"])
    assert len(_entries(root)) == 1
