"""The benchmarks' shared config helpers (benchmarks/common.py)."""

import json
import os

import pytest

from benchmarks import common


def test_parse_overrides_keeps_commas_inside_brackets_and_reads_literals():
    got = common.parse_overrides(
        "train.share=series,model.quantiles=(0.1,0.5,0.9),train.batch_size=64,"
        "eval.plots=False,data.source=synthetic"
    )
    assert got == {
        "train.share": "series",
        "model.quantiles": (0.1, 0.5, 0.9),
        "train.batch_size": 64,
        "eval.plots": False,
        "data.source": "synthetic",
    }
    assert common.parse_overrides("") == {}


@pytest.mark.parametrize("text", ["train.share", "=3", "a=1,b"])
def test_parse_overrides_names_an_item_without_a_field_and_value(text):
    with pytest.raises(ValueError, match="is not field=value"):
        common.parse_overrides(text)


def test_bench_config_synthetic_series_then_overrides():
    c = common.bench_config("configs/gru.py", {"train.pooled_chunk": 8}, "", 3)
    assert c.data.source == "synthetic"
    assert c.data.symbols == ("S0000USDT", "S0001USDT", "S0002USDT")
    assert c.data.intervals == ("1h",)
    assert (c.train.pooled_chunk, c.logging.progress, c.eval.plots) == (8, "plain", False)


def test_bench_config_mirror_keeps_the_configs_series():
    default = common.bench_config("configs/gru.py", {}, "", 1)
    mirror = common.bench_config("configs/gru.py", {}, "/some/mirror", None)
    assert (mirror.data.source, mirror.data.base_url) == ("binance", "/some/mirror")
    assert len(mirror.data.symbols) == 20 and mirror.data.intervals == ("15m", "1h")
    assert default.data.symbols != mirror.data.symbols


def test_write_record_with_data_writes_a_json_twin(tmp_path):
    facts = {"date": "2026-01-02 03:04 UTC", "cpu": "Test CPU"}
    args = (str(tmp_path), "x_bench", "Title", "python x.py", "| a |\n", facts)
    md = common.write_record(*args, data={"runs": [{"wall": 1.5}]})
    twin = json.loads((tmp_path / "x_bench-20260102T0304Z.json").read_text())
    assert twin == {
        "title": "Title",
        "command": "python x.py",
        "machine": facts,
        "runs": [{"wall": 1.5}],
    }
    second = common.write_record(*args)  # without data: the markdown alone, its own name
    assert (md, second) == (str(tmp_path / "x_bench-20260102T0304Z.md"), md[:-3] + "-2.md")
    assert sorted(os.listdir(tmp_path)) == [
        "x_bench-20260102T0304Z-2.md",
        "x_bench-20260102T0304Z.json",
        "x_bench-20260102T0304Z.md",
    ]
