"""Streamed epochs (train.stream_chunk_steps, cpbjax/training/streaming.py) train exactly as the
device-resident ones.

tiny_config's 3 series (K=4 with a padded coin) train 3 epochs both ways from the same
coin keys, per series and pooled, at batch 12: 16 train steps in chunks of J=3 (5 chunks,
then a partial one of 1) and 4 val steps (3, then 1). Bit for bit on the CPU: the host
gathers each window with the device's own float32 arithmetic (`stacking.gather`), the
shuffle is the device's, and each chunk runs the same per-step functions
(`train_steps`, `validation.val_steps`, `finish_epoch`) over the same steps in the same
order, so every parameter, optimizer moment, loss, standard error and kept epoch is equal.
"""

import functools

import jax
import numpy as np
import pytest

from cpbjax import models, sharding
from cpbjax.config import schema as config_lib
from cpbjax.modes import driver
from cpbjax.training import checkpoint, epoch_spec, ledger, memory, step, streaming
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers, references

BATCH, CHUNK = 12, 3


def _config(share: str, chunk: int):
    base = helpers.pooled_config() if share == "pooled" else helpers.tiny_config()
    c = base.copy_and_resolve_references()
    c.train.batch_size, c.train.stream_chunk_steps = BATCH, chunk
    return config_lib.validate(c)


@functools.cache
def _trainer(share: str, chunk: int) -> GroupTrainer:
    config = _config(share, chunk)
    module = models.build(models.make_config(config))
    mesh = sharding.coin_mesh(jax.devices()[:1])
    return GroupTrainer(epoch_spec.make_spec(config, module), helpers.NUM_COINS, mesh)


def _train(trainer: GroupTrainer):
    """(final state, per-epoch metrics) on the host, from fresh coin keys."""
    arrays = trainer.stack(list(helpers.tiny_preps()))
    state = trainer.init_state(coin_keys(0, range(helpers.NUM_COINS)), arrays)
    history = []
    for _ in range(helpers.EPOCHS):
        state, metrics = trainer.run_epoch(state, arrays)
        history.append(jax.device_get(metrics))
    return jax.device_get(state), history


@functools.cache
def _runs(share: str):
    """The device-resident run and the streamed one of the same group."""
    return _train(_trainer(share, 0)), _train(_trainer(share, CHUNK))


def _assert_same_bits(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("share", ["series", "pooled"])
def test_streamed_chunks_train_bit_for_bit_as_device_resident_data(share):
    (state, history), (streamed_state, streamed_history) = _runs(share)
    spec = _trainer(share, CHUNK).spec
    assert (spec.train_steps, spec.val_steps) == (16, 4)  # neither a multiple of CHUNK
    _assert_same_bits(streamed_state, state)  # params, Adam's moments, kept params, epochs
    _assert_same_bits(streamed_history, history)  # every loss, standard error, flag
    assert set(history[0]) == {"epoch", "lr", *step.EPOCH_METRICS}
    # The runs learned and kept epochs (not a trivial equality of untrained states).
    assert np.isfinite(history[-1]["val_loss"][:3]).all()
    assert (state.best_epoch[:3] > 0).any() and (state.epochs_run[:3] == helpers.EPOCHS).all()


@pytest.mark.parametrize("share", ["series", "pooled"])
def test_a_streamed_start_from_trained_params_sets_the_same_bar(share):
    """train.init_from: the starting model's val loss, streamed, is the same bar."""
    (trained, _), _ = _runs(share)
    started = []
    for chunk in (0, CHUNK):
        trainer = _trainer(share, chunk)
        arrays = trainer.stack(list(helpers.tiny_preps()))
        state = trainer.init_state(coin_keys(0, range(helpers.NUM_COINS)), arrays)
        started.append(jax.device_get(trainer.start_from(state, trained.params, arrays)))
    _assert_same_bits(started[1], started[0])
    assert np.isfinite(started[0].best_val[:3]).all()


_TWO_DEVICES = r"""
import jax
from cpbjax import models, sharding
from cpbjax.training import epoch_spec
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers, streaming_test as t

assert jax.device_count() == 2, jax.devices()
runs = []
for chunk in (0, t.CHUNK):
    config = t._config("pooled", chunk)
    module = models.build(models.make_config(config))
    trainer = GroupTrainer(epoch_spec.make_spec(config, module), helpers.NUM_COINS, sharding.coin_mesh())
    arrays = trainer.stack(list(helpers.tiny_preps()))
    state = trainer.init_state(coin_keys(0, range(helpers.NUM_COINS)), arrays)
    history = []
    for _ in range(2):
        state, metrics = trainer.run_epoch(state, arrays)
        history.append(jax.device_get(metrics))
    assert len(jax.tree.leaves(state.params)[0].sharding.device_set) == 2
    runs.append((jax.device_get(state), history))
t._assert_same_bits(runs[1], runs[0])
"""


def test_streamed_chunks_sharded_over_two_devices_train_as_device_resident_data():
    """Each device gets its coins' part of every chunk: a pooled model (its bar, its
    step's all-reduce of the devices' partial gradients, its epoch's all-gathers) trains
    bit for bit as on device-resident data."""
    flags = "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"
    proc = helpers.run_python(_TWO_DEVICES, "", helpers.subprocess_env(XLA_FLAGS=flags))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_device_holds_no_series_and_the_host_gathers_the_devices_windows():
    trainer = _trainer("series", CHUNK)
    arrays = trainer.stack(list(helpers.tiny_preps()))
    assert isinstance(arrays, streaming.StreamedArrays)
    assert arrays.device.inputs.shape[1] == 0 and arrays.device.targets.shape[1] == 0
    assert arrays.host.inputs.shape[1] == trainer.t_max  # the series stay on the host
    # The host's chunk holds the windows a plain reference slices, for every coin.
    ends_JKB, mask_JKB = arrays.val_ends_SKB[:2], arrays.val_mask_SKB[:2]
    spec = trainer.spec
    chunk = streaming.host_chunk(arrays.host, ends_JKB, mask_JKB, spec.lookback, spec.horizon)
    x_shape = (2, helpers.NUM_COINS, BATCH, spec.lookback, spec.num_features)
    assert chunk.windows.x_BLF.shape == x_shape
    for k, prep in enumerate(helpers.tiny_preps()):
        ends = ends_JKB[:, k][mask_JKB[:, k]]
        x, y = references.anchored_windows(prep, ends, spec.lookback, spec.horizon)
        np.testing.assert_array_equal(chunk.windows.x_BLF[:, k][mask_JKB[:, k]], x)
        np.testing.assert_array_equal(chunk.windows.y_BHC[:, k][mask_JKB[:, k]], y)


def test_stream_queues_each_chunk_before_waiting_for_the_previous_one(monkeypatch):
    """Double buffering: chunk i is put and its program queued before the host blocks on
    chunk i - 1's result, and chunks are gathered one at a time, as they are needed."""
    events = []

    def chunks():
        for first in range(0, 7, 3):
            events.append(("gather", first))
            yield first, first

    def program(carry, first, chunk):
        events.append(("run", first))
        return carry + 1, chunk

    monkeypatch.setattr(jax, "block_until_ready", lambda x: events.append(("wait", x)))
    put = lambda chunk: events.append(("put", chunk)) or chunk
    carry, outs = streaming.stream(program, 0, chunks(), put)
    assert (carry, outs) == (3, [0, 3, 6])
    assert events == [
        ("gather", 0), ("put", 0), ("run", 0), ("wait", 0),
        ("gather", 3), ("put", 3), ("run", 3), ("wait", 1),
        ("gather", 6), ("put", 6), ("run", 6), ("wait", 2),
    ]  # fmt: skip


def test_the_memory_check_counts_the_two_chunks_in_flight():
    trainer = _trainer("series", CHUNK)
    arrays = trainer.stack(list(helpers.tiny_preps()))
    state = trainer.init_state(coin_keys(0, range(helpers.NUM_COINS)), arrays)
    compiled = trainer.lowered_epoch(state, arrays).compile()
    spec, k = trainer.spec, helpers.NUM_COINS
    floats_per_window = spec.lookback * spec.num_features + spec.horizon * 4  # x, y [H, C]
    chunk_bytes = CHUNK * k * BATCH * (4 * floats_per_window + 1)  # and the mask's bool
    assert trainer.in_flight_bytes() == 2 * chunk_bytes
    with_chunks = memory.epoch_need(compiled, 1, trainer.in_flight_bytes()).per_device
    assert with_chunks == memory.epoch_need(compiled, 1).per_device + 2 * chunk_bytes
    assert _trainer("series", 0).in_flight_bytes() == 0
    fix = memory.remedy(_config("series", CHUNK).train, k)
    assert f"fewer steps per streamed chunk (train.stream_chunk_steps, {CHUNK} now)" in fix


def test_a_streamed_driver_run_saves_the_device_resident_models(tmp_path):
    """The whole run (plan, memory check, epochs, checkpoints, the kept models) streamed:
    each saved model is the device-resident run's kept params, bit for bit."""
    (state, _), _ = _runs("series")
    results = driver.train_and_evaluate(_config("series", CHUNK), str(tmp_path))
    for i, prep in enumerate(helpers.tiny_preps()):
        params, _ = checkpoint.load_series_model(str(tmp_path / "models" / prep.name))
        _assert_same_bits(params, helpers.coin(state.best_params, i))
        assert results["series"][prep.name]["best_epoch"] == (int(state.best_epoch[i]) or None)


def test_a_streamed_checkpoint_resumes_on_device_resident_data(tmp_path):
    """The state's layout is the default's: a run checkpointed after a streamed epoch
    goes on without streaming to the device-resident run's very state."""
    (resident, _), _ = _runs("series")
    streamed, trainer = _trainer("series", CHUNK), _trainer("series", 0)
    arrays = streamed.stack(list(helpers.tiny_preps()))
    state = streamed.init_state(coin_keys(0, range(helpers.NUM_COINS)), arrays)
    state, _ = streamed.run_epoch(state, arrays)
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 1)
    ckpts.maybe_save(1, state, force=True)
    state, epoch = ckpts.restore_latest(trainer.abstract_state())
    ckpts.close()
    arrays = trainer.stack(list(helpers.tiny_preps()))
    for _ in range(epoch, helpers.EPOCHS):
        state, _ = trainer.run_epoch(state, arrays)
    _assert_same_bits(jax.device_get(state), resident)


def test_streaming_may_change_between_a_run_and_its_resume():
    """Not part of the run fingerprint: it changes how the epoch is computed, not what."""
    streamed, resident = _config("series", CHUNK), _config("series", 0)
    assert ledger.fingerprint(streamed, [[]]) == ledger.fingerprint(resident, [[]])
