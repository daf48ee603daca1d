"""Issue #55 items 3 and 5: a month's file holding other months' candles, and a full disk.

A monthly kline file whose candles fall outside its month is skipped like a file that
fails verification (its month under failed_months, naming the file and the span), on
parsed and on cached arrays alike. A write that fails with ENOSPC ends the run in one
`error:` line naming the file, exit 2, and a failing rerun leaves config.json as it was.
"""

import datetime
import os

import numpy as np

from cpbjax.config import schema as config_lib
from cpbjax.data import binance, parsing, sources, synthetic

MONTHS = ["2024-12", "2025-01", "2025-02"]
BAD = "BTCUSDT-1h-2025-01.zip"
OUTSIDE = f"{BAD} holds candles from 2019-01-01 to 2019-01-31, outside 2025-01: skipped"


def _ms(day: str) -> int:
    return int(np.datetime64(day, "ms").astype(np.int64))


def _mirror_with_2019_in_january(root) -> None:
    """A mirror of BTCUSDT and ETHUSDT whose BTCUSDT 2025-01 zip (with a matching CHECKSUM)
    holds January 2019's candles."""
    synthetic.write_vision_mirror(str(root), ["BTCUSDT", "ETHUSDT"], ["1h"], MONTHS, seed=7)
    old = synthetic.generate("BTCUSDT", "1h", 744, 7, _ms("2019-02-01") - 1)
    path = os.path.join(root, "data/spot/monthly/klines/BTCUSDT/1h", BAD)
    synthetic.write_zip(path, synthetic.kline_csv(old.open_time_ms, old.ohlcv, "1h", False))


def _data_cfg(root, parsed_cache="off"):
    d = config_lib.base_config().data
    d.update(
        base_url=str(root),
        symbols=("BTCUSDT", "ETHUSDT"),
        intervals=("1h",),
        months=3,
        end="2025-02",
        min_candles=24,
        parsed_cache=str(parsed_cache),
    )
    return d


def _load(d):
    pairs = [(s, i) for s in d.symbols for i in d.intervals]
    return binance.load(d, pairs, today=datetime.date(2025, 3, 3))


def _assert_month_skipped(loaded, skipped) -> None:
    assert skipped == {}
    btc = loaded["BTCUSDT-1h"]
    assert btc.notes["months"] == ["2024-12", "2025-02"]
    assert btc.notes["failed_months"] == {"2025-01": OUTSIDE}
    assert btc.open_time_ms.min() >= _ms("2024-12-01")
    assert loaded["ETHUSDT-1h"].notes["failed_months"] == {}  # the other series untouched
    lines = sources.summary_lines(list(loaded.values()), skipped)
    assert lines == [f"BTCUSDT-1h: partly loaded: 2025-01 {OUTSIDE}"]


def test_a_month_holding_2019_candles_is_skipped_naming_file_and_span(tmp_path):
    _mirror_with_2019_in_january(tmp_path / "mirror")
    _assert_month_skipped(*_load(_data_cfg(tmp_path / "mirror")))


def test_the_month_check_also_runs_on_cached_arrays(tmp_path, monkeypatch):
    _mirror_with_2019_in_january(tmp_path / "mirror")
    d = _data_cfg(tmp_path / "mirror", parsed_cache=tmp_path / "parsed")
    _assert_month_skipped(*_load(d))  # parses, and caches what each zip holds
    assert len(os.listdir(tmp_path / "parsed" / "v1")) == 6  # the bad month's arrays too

    def no_parse(*args, **kwargs):
        raise AssertionError("a cached zip was parsed again")

    monkeypatch.setattr(parsing, "read_kline_zip", no_parse)
    _assert_month_skipped(*_load(d))


def test_a_day_file_holding_another_day_is_skipped(tmp_path):
    from cpbjax.data import mirrors

    ref = mirrors.FileRef("BTCUSDT", "1h", "2025-03-02")
    day = _ms("2025-03-02")
    inside = np.arange(day, day + 86_400_000, 3_600_000)
    assert mirrors._outside_period(ref, inside) is None
    assert mirrors._outside_period(ref, inside + 3_600_000) == (
        "BTCUSDT-1h-2025-03-02.zip holds candles from 2025-03-02 to 2025-03-03, "
        "outside 2025-03-02: skipped"
    )
