"""Tests of cpbjax.training.ledger: the resume fingerprint and its refusals."""

import os

import pytest

from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.training import ledger
from tests.helpers import EPOCHS, tiny_config


def test_ledger_refuses_another_config_but_not_a_newer_cpbjax(tmp_path):
    config = tiny_config()
    plan = [["BTCUSDT-1h", "ETHUSDT-1h"]]
    first = ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan))
    first.finish("group-000", {"BTCUSDT-1h": {"status": "trained"}})
    assert ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan)).finished("group-000")
    changed = tiny_config()
    changed.train.epochs = EPOCHS + 2
    with pytest.raises(ledger.RunMismatch, match=rf"train.epochs: {EPOCHS} -> {EPOCHS + 2}"):
        ledger.Ledger(str(tmp_path), ledger.fingerprint(changed, plan))
    with pytest.raises(ledger.RunMismatch, match="groups"):
        ledger.Ledger(str(tmp_path), ledger.fingerprint(config, [["BTCUSDT-1h"]]))
    # A ledger written before model.ensemble existed resumes while it stays at its default,
    # and so does one that still holds retired fields at their defaults (config.upgrade).
    path = tmp_path / "checkpoints" / workdir_lib.LEDGER_FILE
    old = writers.read_json(str(path))
    del old["fingerprint"]["config"]["model"]["ensemble"]
    old["fingerprint"]["config"]["recurrent_gradient"] = "autodiff"
    old_model = old["fingerprint"]["config"]["model"]
    old_model.update(quantiles=[], aux_targets=[], aux_weight=0.1)
    writers.write_json(str(path), old)
    assert ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan)).finished("group-000")
    changed = tiny_config()
    changed.model.ensemble = 2
    with pytest.raises(ledger.RunMismatch, match=r"model.ensemble: 1 -> 2"):
        ledger.Ledger(str(tmp_path), ledger.fingerprint(changed, plan))


def test_padded_length_is_part_of_the_fingerprint_and_old_ledgers_resume(tmp_path):
    config, plan = tiny_config(), [["BTCUSDT-1h"]]
    ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan, 512))
    with pytest.raises(ledger.RunMismatch, match="padded_candles: 512 -> 300"):
        ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan, 300))
    # A ledger written before T followed the data padded to data.max_candles.
    path = tmp_path / "checkpoints" / workdir_lib.LEDGER_FILE
    old = writers.read_json(str(path))
    del old["fingerprint"]["padded_candles"]
    writers.write_json(str(path), old)
    max_candles = config.data.max_candles
    ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan, max_candles))
    with pytest.raises(ledger.RunMismatch, match="padded_candles"):
        ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan, max_candles - 1))


def test_each_finished_group_is_written_once_to_its_own_file(tmp_path):
    config, plan = tiny_config(), [["BTCUSDT-1h"], ["ETHUSDT-1h"]]
    book = ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan))
    entries = {
        f"group-00{g}": {name: {"status": "trained", "g": g}} for g, (name,) in enumerate(plan)
    }
    book.finish("group-000", entries["group-000"])
    first_file = workdir_lib.finished_group(str(tmp_path), "group-000")
    written = os.stat(first_file).st_mtime_ns
    book.finish("group-001", entries["group-001"])
    # The first group's file was not rewritten, and groups.json holds no entries.
    assert os.stat(first_file).st_mtime_ns == written
    assert writers.read_json(first_file) == entries["group-000"]
    index = writers.read_json(workdir_lib.ledger(str(tmp_path)))["finished"]
    assert index == {g: f"finished/{g}.json" for g in entries}
    reopened = ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan))
    assert {g: reopened.finished(g) for g in entries} == entries
    # A missing entries file is named, never a traceback.
    os.remove(first_file)
    with pytest.raises(ledger.RunMismatch, match="group-000.json is missing or damaged"):
        reopened.finished("group-000")


def test_a_ledger_with_entries_inline_still_resumes(tmp_path):
    """cpbjax 0.1 kept each finished group's entries inside groups.json."""
    config, plan = tiny_config(), [["BTCUSDT-1h"]]
    ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan))
    path = workdir_lib.ledger(str(tmp_path))
    old = writers.read_json(path)
    old["finished"] = {"group-000": {"BTCUSDT-1h": {"status": "trained"}}}
    writers.write_json(path, old)
    reopened = ledger.Ledger(str(tmp_path), ledger.fingerprint(config, plan))
    assert reopened.finished("group-000") == {"BTCUSDT-1h": {"status": "trained"}}
    assert reopened.finished("group-001") is None
