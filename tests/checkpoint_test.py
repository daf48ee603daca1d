"""Tests of cpbjax.checkpoint: group state save/restore, retention, corrupt fallback, series models."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cpbjax import checkpoint


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
