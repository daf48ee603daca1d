"""The export tamper matrix: every change to an exported folder is one ValueError naming the file.

One tiny model is trained and exported once; each case copies the export, changes one
thing as a careless user (or an attacker) would, and loads it with `cpbjax.load`.
"""

import json
import os
import shutil

import pytest

import cpbjax
from cpbjax.config import schema as config_lib
from cpbjax.modes import driver
from cpbjax.modes import export as export_mode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES = "BTCUSDT-1h"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.symbols, c.data.intervals = ("BTCUSDT",), ("1h",)
    c.train.epochs, c.eval.plots = 1, False
    c = config_lib.validate(c)
    workdir = str(tmp_path_factory.mktemp("tamper") / "run")
    driver.train_and_evaluate(c, workdir)
    return export_mode.run_export(c, workdir)[SERIES]


@pytest.fixture
def copy(export, tmp_path):
    """A fresh copy of the export, named as exported."""
    return shutil.copytree(export, str(tmp_path / SERIES))


def _edit_json(folder, name, edit):
    path = os.path.join(folder, name)
    with open(path) as f:
        obj = json.load(f)
    edit(obj)
    with open(path, "w") as f:
        json.dump(obj, f)


def _resign(folder, *names):
    """Updates the manifest's sha256 (and fields) as if `names` had been exported so."""

    def edit(manifest):
        for name in names:
            manifest["files"][name] = export_mode._sha256(os.path.join(folder, name))
        with open(os.path.join(folder, export_mode.CONFIG_FILE)) as f:
            manifest["fields"] = export_mode.shaping_fields(json.load(f))

    _edit_json(folder, export_mode.MANIFEST_FILE, edit)


def _flip_a_bit(folder):
    path = os.path.join(folder, export_mode.PARAMS_FILE)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x10]))


def _scale_interval(folder):
    def edit(cal):  # every number of the calibration, doubled
        def scale(v):
            if isinstance(v, dict):
                return {k: scale(x) for k, x in v.items()}
            if isinstance(v, list):
                return [scale(x) for x in v]
            return v * 2 if isinstance(v, float) else v

        cal.update(scale(cal))

    _edit_json(folder, export_mode.INTERVAL_FILE, edit)


def _set(group, field, value):
    return lambda folder: _edit_json(
        folder, export_mode.CONFIG_FILE, lambda c: c[group].__setitem__(field, value)
    )


def _remove(name):
    return lambda folder: os.remove(os.path.join(folder, name))


def _damage_params_and_resign(folder):
    with open(os.path.join(folder, export_mode.PARAMS_FILE), "wb") as f:
        f.write(b"\xc1 not msgpack")
    _resign(folder, export_mode.PARAMS_FILE)


def _widen_and_resign(folder):
    _set("model", "hidden", 48)(folder)
    _resign(folder, export_mode.CONFIG_FILE)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (_flip_a_bit, r"params\.msgpack does not match its sha256 in manifest\.json"),
        (_set("data", "lookback", 48), r"config\.json: data\.lookback is 48, but the model"),
        (_set("model", "baseline", "none"), r"config\.json: model\.baseline is 'none'"),
        (_remove(export_mode.INTERVAL_FILE), r"interval\.json is missing \(listed in manifest"),
        (_scale_interval, r"interval\.json does not match its sha256"),
        (_remove(export_mode.PARAMS_FILE), r"params\.msgpack is missing"),
        (_remove(export_mode.MANIFEST_FILE), r"manifest\.json is missing: .*export the run again"),
        (_damage_params_and_resign, r"params\.msgpack cannot be read"),
        (_widen_and_resign, r"params\.msgpack: .* is \(.*\), but config\.json's model \(gru\)"),
    ],
)
def test_a_tampered_export_is_one_value_error_naming_the_file(copy, tamper, message):
    tamper(copy)
    with pytest.raises(ValueError, match=message):
        cpbjax.load(copy)


def test_the_series_comes_from_the_manifest_not_the_folder(copy, tmp_path):
    renamed = shutil.move(copy, str(tmp_path / "ETHUSDT-1h"))
    with pytest.raises(
        ValueError, match=r"manifest\.json: the model is of BTCUSDT-1h, but its fold"
    ):
        cpbjax.load(renamed)
    neutral = shutil.move(renamed, str(tmp_path / "my-model"))
    model = cpbjax.load(neutral)
    assert (model.symbol, model.interval) == ("BTCUSDT", "1h")


def test_an_untouched_export_loads(copy):
    assert cpbjax.load(copy).symbol == "BTCUSDT"
