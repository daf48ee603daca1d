"""Tests of cpbjax.training.checkpoint: group state save/restore, retention, corrupt fallback, series models."""

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cpbjax.training import checkpoint
from tests import references


def _state(value: float):
    """A small train-state-like pytree: params, an optax state (NamedTuples) and counters."""
    params = {"dense": {"kernel": jnp.full((2, 3), value), "bias": jnp.zeros(3)}}
    opt_state = optax.adam(1e-3).init(params)
    return {
        "params": params,
        "opt": opt_state,
        "epoch": jnp.int32(value),
        "key": jnp.uint32([1, 2]),
    }


def _abstract(state):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _saved(tmp_path, epochs, every=1, keep=2):
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), every, keep)
    saved = [e for e in epochs if ckpts.maybe_save(e, _state(float(e)))]
    ckpts.close()
    return saved


def test_saves_every_n_epochs_and_keeps_the_newest(tmp_path):
    saved = _saved(tmp_path, range(1, 8), every=3, keep=2)
    assert saved == [3, 6]
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 3, 2)
    assert ckpts.maybe_save(7, _state(7.0), force=True)
    assert not ckpts.maybe_save(7, _state(7.0), force=True)  # an existing epoch is kept
    ckpts.close()
    assert sorted(int(d) for d in os.listdir(tmp_path / "group-000") if d.isdigit()) == [6, 7]


def test_restore_latest_round_trips_the_full_structure(tmp_path):
    _saved(tmp_path, [1, 2])
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    state, epoch = ckpts.restore_latest(_abstract(_state(0.0)))
    ckpts.close()
    assert epoch == 2
    _assert_trees_equal(state, _state(2.0))
    assert isinstance(state["opt"][0], optax.ScaleByAdamState)


def test_no_checkpoint_restores_none(tmp_path):
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "empty"), 1, 2)
    assert ckpts.restore_latest(_abstract(_state(0.0))) is None
    ckpts.close()


def test_corrupt_latest_falls_back_to_previous_with_warning(tmp_path, caplog):
    _saved(tmp_path, [1, 2])
    latest = tmp_path / "group-000" / "2"
    for root, _, files in os.walk(latest / "default"):
        for name in files:  # clobber every data and metadata file of the newest checkpoint
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\0garbage")
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    with caplog.at_level(logging.WARNING):
        state, epoch = ckpts.restore_latest(_abstract(_state(0.0)))
    assert epoch == 1
    _assert_trees_equal(state, _state(1.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(latest) in w and "unreadable" in w for w in warnings), warnings
    # The bad epoch is gone, so training can save epoch 2 again.
    assert ckpts.maybe_save(2, _state(2.5))
    ckpts.close()
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    state, epoch = ckpts.restore_latest(_abstract(_state(0.0)))
    ckpts.close()
    assert epoch == 2
    _assert_trees_equal(state, _state(2.5))


def test_series_model_round_trip_and_replace(tmp_path):
    path = str(tmp_path / "models" / "BTCUSDT-1h")
    params = {
        "gru": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)},
        "out": {"bias": np.ones(4, np.float32)},
    }
    meta = {"series": "BTCUSDT-1h", "num_params": 10, "norm": {"kind": "last_close", "log_p0": 1.5}}
    checkpoint.save_series_model(path, params, meta)
    checkpoint.save_series_model(path, jax.tree.map(lambda a: a + 1, params), dict(meta, v=2))
    loaded, loaded_meta = checkpoint.load_series_model(path)
    _assert_trees_equal(loaded, jax.tree.map(lambda a: a + 1, params))
    assert loaded_meta == dict(meta, v=2)
    assert sorted(os.listdir(tmp_path / "models")) == ["BTCUSDT-1h"]  # no temp folder left


def test_missing_series_model_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="ETHUSDT-15m"):
        checkpoint.load_series_model(str(tmp_path / "ETHUSDT-15m"))


def test_a_restore_that_misses_its_digest_falls_back_in_one_line(tmp_path, caplog):
    _saved(tmp_path, [1, 2])
    # What damaged array data looks like to the restore: arrays that differ from the
    # ones whose digest was recorded at save time.
    path = tmp_path / "group-000" / checkpoint.DIGESTS_FILE
    digests = json.loads(path.read_text())
    assert sorted(digests) == ["1", "2"]
    digests["2"] = checkpoint.state_digest(_state(2.5))
    path.write_text(json.dumps(digests))
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    with caplog.at_level(logging.WARNING):
        state, epoch = ckpts.restore_latest(_abstract(_state(0.0)))
    ckpts.close()
    assert epoch == 1
    _assert_trees_equal(state, _state(1.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    latest = str(tmp_path / "group-000" / "2")
    assert any(latest in w and "digest" in w for w in warnings), warnings
    assert all("\n" not in w for w in warnings)  # one line each
    assert not os.path.exists(latest)


def _random_state(seed: int):
    """Incompressible arrays, so zstd stores them raw and a flipped byte changes a value."""
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.standard_normal((64, 64), np.float32)), "epoch": jnp.int32(seed)}


def _epoch_2_largest_data_file(tmp_path):
    """Saves epochs 1 and 2 of a group; the largest array data file of epoch 2's."""
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    for epoch in (1, 2):
        ckpts.maybe_save(epoch, _random_state(epoch))
    ckpts.close()
    data = tmp_path / "group-000" / "2" / "default" / "ocdbt.process_0" / "d"
    return max(data.iterdir(), key=lambda f: f.stat().st_size)


@pytest.mark.parametrize("position", [0.3, 0.5, 0.7])
def test_flipped_bytes_in_array_data_are_caught(tmp_path, position):
    largest = _epoch_2_largest_data_file(tmp_path)
    raw = bytearray(largest.read_bytes())
    raw[int(len(raw) * position)] ^= 0xFF  # same size, as the reproduction did
    largest.write_bytes(bytes(raw))
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    state, epoch = ckpts.restore_latest(_abstract(_random_state(0)))
    ckpts.close()
    assert epoch == 1
    _assert_trees_equal(state, _random_state(1))


def test_a_truncated_array_file_is_reported_by_its_root_cause(tmp_path, caplog):
    # Orbax wraps TensorStore's read error in a bare Exception whose text is a method's
    # repr ("<bound method pybind11...spec of TensorStore(...)>"); the warning must give
    # the epoch, the folder and TensorStore's own reason instead.
    largest = _epoch_2_largest_data_file(tmp_path)
    raw = largest.read_bytes()
    largest.write_bytes(raw[: len(raw) // 2])
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 2)
    with caplog.at_level(logging.WARNING):
        _, epoch = ckpts.restore_latest(_abstract(_random_state(0)))
    ckpts.close()
    assert epoch == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    (warning,) = [w for w in warnings if "unreadable" in w]
    assert "epoch 2" in warning and str(tmp_path / "group-000" / "2") in warning
    assert "OUT_OF_RANGE" in warning, warning
    assert "bound method" not in warning and "\n" not in warning


def test_row_hashes_match_a_plain_numpy_loop():
    rng = np.random.default_rng(0)
    leaves = [
        rng.normal(size=(4, 3, 5)).astype(np.float32),
        rng.integers(0, 2, 4).astype(bool),
        jnp.asarray(rng.normal(size=(4, 7)), jnp.bfloat16),
        rng.integers(-9, 9, (4, 2, 2), dtype=np.int32),
        np.int32(3),  # a scalar: one row
        rng.integers(0, 2**32, (1, 6), dtype=np.uint32),  # one row, beside the scalar
        rng.integers(0, 2**32, (4, 2), dtype=np.uint32),
    ]
    got = jax.device_get(checkpoint._row_hashes(leaves))
    for g, want in zip(got, references.row_hashes(leaves), strict=True):
        np.testing.assert_array_equal(g, want)


def test_state_digest_sees_one_flipped_bit_and_moved_values():
    state = _state(1.5)
    digest = checkpoint.state_digest(state)
    assert digest == checkpoint.state_digest(jax.tree.map(jnp.copy, state))
    kernel = np.asarray(state["params"]["dense"]["kernel"])
    flipped = kernel.copy().view(np.uint32)
    flipped[1, 2] ^= 1 << 7
    one_bit = {
        **state,
        "params": {"dense": {**state["params"]["dense"], "kernel": flipped.view(np.float32)}},
    }
    assert checkpoint.state_digest(one_bit) != digest
    moved = {**state, "key": jnp.uint32([2, 1])}
    assert checkpoint.state_digest(moved) != digest
