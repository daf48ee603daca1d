"""Streamed epochs (train.stream_chunk_steps = J > 0): the windows come from host memory.

Why: the default epoch (cpbjax/training/group.py) keeps every coin's whole series [K, T, F] in
device memory and slices the windows from it inside the jitted epoch. With every candle
of many series that outgrows an accelerator's memory while the host's RAM holds it.
Streamed, the devices hold the state, the group's small per-coin arrays (window ends and
masks, bands, loss scales: `stacking.GroupArrays` less its series, T = 0) and at most
two chunks of windows. The host gathers the windows of J steps at a time from its own
copy of the series (`stacking.gather` on numpy, the device's own float32 arithmetic) into
a `Chunk`, x [J, K, B, L, F] and y [J, K, B, H, C], and puts it on the devices.

Double-buffered (`stream`): JAX dispatches asynchronously, so the host gathers and puts
chunk i while the devices run chunk i - 1's program, queues chunk i's program behind it,
and only then waits for chunk i - 1's. The devices find the next program queued whenever
the host gathers a chunk faster than they train on one, and at most two chunks are
alive on them.

The same epoch as the default path (tests/streaming_test.py): the shuffle is the device's
own (`batching.train_batches`, a small program whose window ends [S, K, B] come to the
host), each chunk runs step.py's or pooled.py's `train_steps` on the gathered windows,
and the epoch ends with their `finish_epoch`. The val pass is streamed too, as
`validation.val_steps` over the val windows for the epoch's params and the kept ones:
left on the devices, it would need the series there, which is what does not fit. The
init (a baseline's bar) and train.init_from's start stream their val pass the same way.

Shape letters (docs/design.md): K coins, T candles, S steps of an epoch, J steps of one
streamed chunk, B windows per step, L lookback, H horizon, F features, C OHLC targets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cpbjax import sharding
from cpbjax.columns import NUM_TARGETS
from cpbjax.data import stacking
from cpbjax.training import batching, epoch_spec, step, validation

# Shard specs of a chunk's [J, K, ...] leaves and of per-coin [K] sums.
CHUNK_SPEC = P(None, sharding.COIN_AXIS)
COIN_SPEC = P(sharding.COIN_AXIS)


class Chunk(NamedTuple):
    """The windows of J consecutive steps of every coin (numpy on the host, then on the
    devices, sharded over the coin axis)."""

    windows: batching.Windows  # x [J, K, B, L, F], y [J, K, B, H, C]
    mask_JKB: np.ndarray | jax.Array  # bool: valid windows


class StreamedArrays(NamedTuple):
    """A group's data for streamed epochs: what GroupTrainer.stack returns with streaming."""

    host: stacking.GroupArrays  # numpy, with the series the windows are gathered from
    device: stacking.GroupArrays  # on the devices, less the series (`without_series`)
    val_ends_SKB: np.ndarray  # int32: the val pass's window ends (batching.val_batches)
    val_mask_SKB: np.ndarray  # bool: its valid windows
    val_mask_on_devices: jax.Array  # bool [S, K, B]: the same, for finish_epoch


def without_series(arrays: stacking.GroupArrays) -> stacking.GroupArrays:
    """`arrays` less the series that windows are sliced from (inputs, targets, anchor
    with T = 0): what a streamed epoch places on the devices."""
    empty = lambda a: a[:, :0]
    series = ("inputs", "targets", "anchor")
    return arrays.replace(**{name: empty(getattr(arrays, name)) for name in series})


def host_chunk(host: stacking.GroupArrays, ends_JKB, mask_JKB, lookback: int, horizon: int):
    """The Chunk of every coin's windows ending at ends_JKB (int32 [J, K, B]), gathered
    from the host series by the device path's `stacking.gather`, coin by coin."""
    per_coin = []
    for k in range(ends_JKB.shape[1]):
        source = stacking.WindowSource(
            host.inputs[k], host.targets[k], host.anchor[k], host.price_mask
        )
        x_JBLF, y_JBHC = stacking.gather(source, ends_JKB[:, k], lookback, horizon)
        per_coin.append(batching.Windows(x_JBLF, y_JBHC))
    return Chunk(jax.tree.map(lambda *a: np.stack(a, axis=1), *per_coin), mask_JKB)


def host_chunks(
    host: stacking.GroupArrays, ends_SKB, mask_SKB, chunk_steps: int, lookback: int, horizon: int
) -> Iterator[tuple[int, Chunk]]:
    """(first step, Chunk) of each J = chunk_steps steps in order (the last may be
    shorter), each gathered only when asked for."""
    for first in range(0, ends_SKB.shape[0], chunk_steps):
        steps = slice(first, first + chunk_steps)
        yield first, host_chunk(host, ends_SKB[steps], mask_SKB[steps], lookback, horizon)


def stream(program: Callable, carry, chunks: Iterator[tuple[int, Chunk]], put: Callable):
    """Runs program(carry, first step, chunk on the devices) -> (carry, out) over `chunks`
    in order; returns (the last carry, [each chunk's out]).

    The host gathers and puts chunk i while chunk i - 1's program runs, queues chunk i's
    program, then waits for chunk i - 1's (its output `carry`, which is why no program
    here donates its carry): the next program is always queued before the devices finish
    one, and at most two chunks are alive on them.
    """
    outs = []
    for first, chunk in chunks:
        previous = carry
        carry, out = program(carry, first, put(chunk))
        jax.block_until_ready(previous)
        outs.append(out)
    return carry, outs


class Placement(NamedTuple):
    """Where a group's programs place their data (GroupTrainer's mesh and shardings)."""

    mesh: Mesh  # the 1-D coin mesh
    num_coins: int  # K, a multiple of the mesh size
    state_sharding: Any  # NamedShardings of a GroupState
    arrays_sharding: Any  # NamedShardings of GroupArrays less their series
    coin_sharding: NamedSharding  # one [K, ...] array, its coin axis over the mesh


class StreamedEpoch:
    """The programs of streamed epochs of one group's K coins, and the host loops that
    feed them chunks (GroupTrainer delegates stack, init, start and epochs here)."""

    def __init__(
        self,
        spec: epoch_spec.EpochSpec,
        placement: Placement,
        chunk_steps: int,
        math,
        fresh: Callable,
        per_device: Callable,
        state_specs,
        arrays_specs,
        metrics_specs: dict,
    ):
        """Args:
        spec: the epoch's spec, as the default epoch's programs close over it.
        placement: the group's mesh, K and shardings (GroupTrainer's).
        chunk_steps: J, the train steps of windows per chunk (train.stream_chunk_steps).
        math: the epoch_math.EpochMath of the group's sharing.Sharing (step or pooled).
        fresh: the jitted math.fresh_state, placed as the state.
        per_device: group.py's shard_map over the coin mesh.
        state_specs, arrays_specs, metrics_specs: the shard specs of the GroupState, the
          GroupArrays less their series, and step.EPOCH_METRICS.
        """
        self.placement, self.spec, self.fresh = placement, spec, fresh
        self.chunk_steps = chunk_steps
        self.chunk_sharding = NamedSharding(placement.mesh, CHUNK_SPEC)
        pass_specs = epoch_spec.TrainPass(
            state_specs.params, state_specs.opt_state, COIN_SPEC, COIN_SPEC, COIN_SPEC
        )
        self._order = jax.jit(functools.partial(batching.train_batches, self.spec))
        self._fresh_pass = jax.jit(
            step.fresh_pass, out_shardings=sharding.named(placement.mesh, pass_specs)
        )
        self._build_chunk_programs(math, per_device, state_specs, arrays_specs, pass_specs)
        self._build_finish_program(math, per_device, state_specs, pass_specs, metrics_specs)
        self._build_start_programs(math)

    def _build_finish_program(self, math, per_device, state_specs, pass_specs, metrics_specs):
        """The epoch's end: the state donated, placed as the default epoch places it."""
        val_specs = ((COIN_SPEC, COIN_SPEC), CHUNK_SPEC)  # (sums, every chunk's losses)
        mesh = self.placement.mesh
        self._finish = jax.jit(
            per_device(
                functools.partial(_finish_epoch, math.finish_epoch, self.spec),
                in_specs=(state_specs, pass_specs, val_specs, val_specs, CHUNK_SPEC),
                out_specs=(state_specs, metrics_specs),
            ),
            out_shardings=(self.placement.state_sharding, sharding.named(mesh, metrics_specs)),
            donate_argnums=0,
        )

    def _build_chunk_programs(self, math, per_device, state_specs, arrays_specs, pass_specs):
        """The programs of one chunk: its train steps (the TrainPass carried from chunk to
        chunk) and its val steps (one model's sums carried, its window losses out)."""
        self._train = jax.jit(
            per_device(
                functools.partial(_train_chunk, math.train_steps, self.spec),
                in_specs=(state_specs, arrays_specs, pass_specs, P(), CHUNK_SPEC),
                out_specs=pass_specs,
            ),
            out_shardings=sharding.named(self.placement.mesh, pass_specs),
        )
        sums_specs = (COIN_SPEC, COIN_SPEC)
        self._val = jax.jit(
            per_device(
                functools.partial(_val_chunk, self.spec),
                in_specs=(state_specs.params, arrays_specs, sums_specs, CHUNK_SPEC),
                out_specs=(sums_specs, CHUNK_SPEC),
            )
        )

    def _build_start_programs(self, math) -> None:
        """The bar and train.init_from's restart: one program each, partitioned by XLA (a
        pooled model's read every coin, as its init does; a per-series one's each coin)."""
        on_state = {"out_shardings": self.placement.state_sharding, "donate_argnums": 0}
        self._bar = jax.jit(math.with_bar, **on_state)
        self._restart = jax.jit(functools.partial(math.restart, self.spec), **on_state)

    def stack(self, host: stacking.GroupArrays) -> StreamedArrays:
        """The group's StreamedArrays from its host arrays (`stacking.stack_group`)."""
        val_ends_SKB, val_mask_SKB = jax.device_get(batching.val_batches(self.spec, host))
        return StreamedArrays(
            host,
            sharding.place(without_series(host), self.placement.arrays_sharding),
            val_ends_SKB,
            val_mask_SKB,
            sharding.place(val_mask_SKB, self.chunk_sharding),
        )

    def init_state(self, keys_K2, arrays: StreamedArrays) -> epoch_spec.GroupState:
        """step/pooled.fresh_state (a baseline's bar comes with the first epoch)."""
        return self.fresh(keys_K2, arrays.device)

    def start_from(self, state: epoch_spec.GroupState, params, arrays: StreamedArrays):
        """step/pooled.start_from (train.init_from), the bar from a streamed val pass."""
        state = self._restart(state, params)
        return self._bar(state, *self.val_sums(state.params, arrays))

    def val_sums(self, params, arrays: StreamedArrays):
        """validation.val_sums of `params` [K, ...] over the streamed val windows."""
        run = lambda sums, _, chunk: self._val(params, arrays.device, sums, chunk)
        sums, _ = stream(run, self._zero_sums(), self._val_chunks(arrays), self._put)
        return sums

    def run_epoch(self, state: epoch_spec.GroupState, arrays: StreamedArrays):
        """One epoch, as the default path's run_epoch; `state` is donated."""
        ends_SKB, mask_SKB = sharding.to_host(self._order(state, arrays.device))
        chunks = host_chunks(
            arrays.host, ends_SKB, mask_SKB, self.chunk_steps, self.spec.lookback, self.spec.horizon
        )
        train = lambda trained, first, chunk: (
            self._train(state, arrays.device, trained, first, chunk),
            None,
        )
        trained, _ = stream(train, self._fresh_pass(state), chunks, self._put)

        def val_both(sums, _, chunk):  # the epoch's params and the kept ones, on one chunk
            val_sums, val_err_JKB = self._val(trained.params, arrays.device, sums[0], chunk)
            best_sums, best_err_JKB = self._val(state.best_params, arrays.device, sums[1], chunk)
            return (val_sums, best_sums), (val_err_JKB, best_err_JKB)

        zero = self._zero_sums()
        sums, errs = stream(val_both, (zero, zero), self._val_chunks(arrays), self._put)
        val_errs, best_errs = zip(*errs, strict=True)
        val, best = (sums[0], val_errs), (sums[1], best_errs)
        return self._finish(state, trained, val, best, arrays.val_mask_on_devices)

    def lowered_epoch(self, state: epoch_spec.GroupState, arrays: StreamedArrays):
        """The lowered program of one full chunk of train steps: the memory check's."""
        trained = jax.eval_shape(step.fresh_pass, state)
        return self._train.lower(state, arrays.device, trained, 0, self._abstract_chunk())

    def in_flight_bytes(self) -> int:
        """The bytes on each device of the two chunks alive at once (the one a program
        reads, the next one being put), which no program's buffers count."""
        chunk = self._abstract_chunk()
        nbytes = sum(np.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(chunk))
        return 2 * int(nbytes) // self.placement.mesh.size

    def _abstract_chunk(self) -> Chunk:
        """A full chunk of J steps as jax.ShapeDtypeStructs, sharded as `_put` places it."""
        spec = self.spec
        leading = (self.chunk_steps, self.placement.num_coins, spec.batch_size)
        sds = functools.partial(jax.ShapeDtypeStruct, sharding=self.chunk_sharding)
        windows = batching.Windows(
            sds(leading + (spec.lookback, spec.num_features), jnp.float32),
            sds(leading + (spec.horizon, NUM_TARGETS), jnp.float32),
        )
        return Chunk(windows, sds(leading, jnp.bool_))

    def _val_chunks(self, arrays: StreamedArrays):
        """The val pass's chunks, gathered one at a time (`host_chunks`)."""
        return host_chunks(
            arrays.host,
            arrays.val_ends_SKB,
            arrays.val_mask_SKB,
            self.chunk_steps,
            self.spec.lookback,
            self.spec.horizon,
        )

    def _zero_sums(self):
        """(float32 [K], int32 [K]) zeros on the devices: a val pass's sums before its first step."""
        k = self.placement.num_coins
        zeros = (np.zeros(k, np.float32), np.zeros(k, np.int32))
        return sharding.place(zeros, (self.placement.coin_sharding,) * 2)

    def _put(self, chunk: Chunk) -> Chunk:
        """The chunk on the devices, each its coins' shard (asynchronous)."""
        return sharding.place(chunk, jax.tree.map(lambda _: self.chunk_sharding, chunk))


def _train_chunk(train_steps, spec, state, arrays, trained, first_step, chunk: Chunk):
    """`train_steps` (step's or pooled's) over one chunk's steps first_step, ..., their
    windows as the host gathered them."""
    steps_J = first_step + jnp.arange(chunk.mask_JKB.shape[0])
    windows_of = lambda windows_KB: batching.HostWindows(windows_KB, arrays.target_scale)
    return train_steps(spec, state, arrays, trained, (steps_J, *chunk), windows_of)


def _val_chunk(spec, params, arrays, sums, chunk: Chunk):
    """validation.val_steps over one chunk of val steps: (sums, window losses [J, K, B])."""
    windows_of = lambda windows_KB: batching.HostWindows(windows_KB, arrays.target_scale)
    return validation.val_steps(spec, params, sums, tuple(chunk), windows_of)


def _finish_epoch(finish_epoch, spec, state, trained, val, best, val_mask_SKB):
    """`finish_epoch` (step's or pooled's) given each model's (sums, window losses of
    every val chunk)."""
    as_pass = lambda v: validation.val_result(v[0], jnp.concatenate(v[1]), val_mask_SKB)
    return finish_epoch(spec, state, trained, as_pass(val), as_pass(best))
