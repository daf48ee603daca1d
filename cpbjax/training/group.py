"""The compiled group program: one jitted, coin-sharded call runs one epoch of K coins.

`GroupTrainer` owns shapes and compilation only. The math is cpbjax/training/step.py's pure
functions over an `EpochSpec` fixed at construction; here they are `shard_map`ped over
the `coins` mesh (each device runs its own K / num_devices coins) and jitted with the
state donated. Per-series coins are independent, so their epoch has no collective
between devices; a pooled model's (cpbjax/training/pooled.py) has an all-reduce per step and
all-gathers per epoch, written there. The program depends only on the spec and K, so
every group of a run (same padded shapes) reuses one compilation. With
train.stream_chunk_steps the series stay on the host and the epoch's windows are streamed
to the devices in chunks (cpbjax/training/streaming.py), over the same step functions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cpbjax import columns, sharding
from cpbjax.data import stacking, windows
from cpbjax.training import epoch_spec, sharing, step, streaming


def coin_keys(seed: int, series_indices) -> np.ndarray:
    """uint32 [K, 2] keys fold_in(PRNGKey(seed), index): a coin's stream is its own.

    The index is the series' position in the run, so a coin trains the same
    whichever group or slot it lands in.
    """
    root = jax.random.PRNGKey(seed)
    return np.stack([np.asarray(jax.random.fold_in(root, int(i))) for i in series_indices])


class GroupTrainer:
    """Builds the jitted init and one-epoch programs for groups of `num_coins` coins.

    Attributes:
      spec: the epoch_spec.EpochSpec the programs close over.
      sharing: the sharing.Sharing of its train.share: the epoch math the programs run
        (cpbjax/training/step.py or pooled.py) and how the init programs are placed.
      num_coins: K, a multiple of the mesh size.
      state_sharding: NamedShardings of epoch_spec.GroupState (coin axis over the mesh).
      arrays_sharding: NamedShardings of stacking.GroupArrays (see `stack`).
      coin_sharding: NamedSharding of one [K, ...] array.
      streamed: with train.stream_chunk_steps, the streaming.StreamedEpoch that stack,
        init_state, start_from and run_epoch hand over to; None otherwise.
    """

    def __init__(self, spec: epoch_spec.EpochSpec, num_coins: int, mesh: Mesh | None = None):
        """Args:
        spec: the run's EpochSpec (`epoch_spec.make_spec` of its config, model and padded
          length T), built once by the mode.
        num_coins: K, a multiple of the mesh size.
        mesh: a 1-D `coins` mesh; default `sharding.coin_mesh()`.
        """
        self.mesh = mesh if mesh is not None else sharding.coin_mesh()
        if num_coins % self.mesh.size:
            raise ValueError(
                f"num_coins={num_coins} is not a multiple of the {self.mesh.size} devices"
            )
        self.spec = spec
        self.t_max = spec.t_max
        self.sharing = sharing.of(self.spec.share)
        self.num_coins = num_coins
        self.hparam_names = spec.hparams  # GroupArrays.hparams of a sweep
        self.matmul_precision = spec.matmul_precision
        # J steps of windows per chunk streamed from the host; 0 = the device-resident epoch.
        self.stream_chunk_steps = spec.stream_chunk_steps
        self.coin_sharding = NamedSharding(self.mesh, P(sharding.COIN_AXIS))
        self._build_programs()

    @property
    def module(self):
        return self.spec.module

    def _build_programs(self) -> None:
        """Jits the shard_mapped epoch, then the init and start programs; with
        train.stream_chunk_steps, the streamed epoch's programs instead."""
        state_specs = sharding.coin_specs(self._state_shapes())
        arrays_specs = sharding.coin_specs(self._abstract_arrays()).replace(price_mask=P())
        metrics_specs = {
            name: P() if name in ("epoch", "lr") else P(sharding.COIN_AXIS)
            for name in step.EPOCH_METRICS
        }
        self.state_sharding = sharding.named(self.mesh, state_specs)
        self.arrays_sharding = sharding.named(self.mesh, arrays_specs)
        # check_vma=False: the scalar outputs (epoch, lr) are computed from replicated
        # inputs only, so they are the same on every device by construction.
        per_device = functools.partial(jax.shard_map, mesh=self.mesh, check_vma=False)
        math = self.sharing.math
        if self.stream_chunk_steps:
            self.streamed = self._streamed_epoch(
                math, per_device, state_specs, arrays_specs, metrics_specs
            )
            return
        self.streamed = None
        # out_shardings: the state leaves the epoch exactly as the init (and a restore,
        # `abstract_state`) places it; XLA would otherwise pick P() for some leaves of a
        # 1-device mesh, and the next epoch would compile again for that placement.
        self._epoch_jit = jax.jit(
            per_device(
                functools.partial(math.run_epoch, self.spec),
                in_specs=(state_specs, arrays_specs),
                out_specs=(state_specs, metrics_specs),
            ),
            out_shardings=(self.state_sharding, sharding.named(self.mesh, metrics_specs)),
            donate_argnums=0,
        )
        self._init_jit = self._init_program(per_device, arrays_specs, state_specs)
        self._start_jit = self._start_program(per_device, arrays_specs, state_specs)

    def _streamed_epoch(self, math, per_device, state_specs, arrays_specs, metrics_specs):
        """The streamed epoch's programs (train.stream_chunk_steps), placed as this group's."""
        fresh = self._init_program(per_device, arrays_specs, state_specs)
        placement = streaming.Placement(
            self.mesh, self.num_coins, self.state_sharding, self.arrays_sharding, self.coin_sharding
        )
        return streaming.StreamedEpoch(
            self.spec,
            placement,
            self.stream_chunk_steps,
            math,
            fresh,
            per_device,
            state_specs,
            arrays_specs,
            metrics_specs,
        )

    def _init_program(self, per_device, arrays_specs, state_specs):
        """The jitted init, the math's fresh_state: (keys, arrays) -> state.

        A pooled model is one model for all K coins: its init reads coin 0's key and every
        coin's band (train.init_from's start every coin's val loss), so each is one global
        program that XLA partitions over the mesh (it runs once per group; the epoch's
        sums cross devices in pooled.py). A per-series one is shard_mapped as the epoch.
        out_shardings: the state placed as the epoch places it (`_build_programs`).
        """
        init = functools.partial(self.sharing.math.fresh_state, self.spec)
        if self.sharing.global_init:
            in_shardings = (self.coin_sharding, self.arrays_sharding)
            return jax.jit(init, in_shardings=in_shardings, out_shardings=self.state_sharding)
        init_specs = (P(sharding.COIN_AXIS), arrays_specs)
        return jax.jit(
            per_device(init, in_specs=init_specs, out_specs=state_specs),
            out_shardings=self.state_sharding,
        )

    def _start_program(self, per_device, arrays_specs, state_specs):
        """The jitted train.init_from start: (state, params, arrays) -> state, placed as
        `_init_program`'s."""
        start = functools.partial(self.sharing.math.start_from, self.spec)
        if self.sharing.global_init:
            start_shardings = (self.state_sharding, self.state_sharding.params)
            return jax.jit(
                start,
                in_shardings=start_shardings + (self.arrays_sharding,),
                out_shardings=self.state_sharding,
                donate_argnums=0,
            )
        start_specs = (state_specs, state_specs.params, arrays_specs)
        return jax.jit(
            per_device(start, in_specs=start_specs, out_specs=state_specs),
            out_shardings=self.state_sharding,
            donate_argnums=0,
        )

    def _state_shapes(self) -> epoch_spec.GroupState:
        keys = jax.ShapeDtypeStruct((self.num_coins, 2), jnp.uint32)
        fresh = functools.partial(step.fresh_state, self.spec)
        return jax.eval_shape(fresh, keys, self._abstract_arrays())

    def _abstract_arrays(self) -> stacking.GroupArrays:
        """GroupArrays of ShapeDtypeStructs: the fixed padded shapes of this config."""
        k, spec = self.num_coins, self.spec
        sizes = stacking.padded_sizes(self.spec.data, self.t_max)
        t = 0 if self.stream_chunk_steps else sizes["T"]  # streamed: no series on the devices
        sds = jax.ShapeDtypeStruct
        ends = {}
        for split in windows.EPOCH_SPLITS:
            ends[f"{split}_ends"] = sds((k, sizes[split]), jnp.int32)
            ends[f"{split}_mask"] = sds((k, sizes[split]), jnp.bool_)
        return stacking.GroupArrays(
            inputs=sds((k, t, spec.num_features), jnp.float32),
            targets=sds((k, t, columns.NUM_TARGETS), jnp.float32),
            anchor=sds((k, t), jnp.float32),
            price_mask=sds((spec.num_features,), jnp.float32),
            target_scale=sds((k, columns.NUM_TARGETS), jnp.float32),
            band=sds((k, spec.horizon, 2), jnp.float32),
            hparams={name: sds((k,), jnp.float32) for name in self.hparam_names},
            **ends,
        )

    def stack(self, preps: list) -> stacking.GroupArrays | streaming.StreamedArrays:
        """`stacking.stack_group` padded to K coins, each process placing its own shards
        (streamed: all but the series, which stay on the host)."""
        host = stacking.stack_group(preps, self.num_coins, self.spec.data, self.t_max)
        if self.streamed:
            return self.streamed.stack(host)
        return sharding.place(host, self.arrays_sharding)

    def init_state(self, keys_K2, arrays) -> epoch_spec.GroupState:
        """A fresh GroupState: `module.init` of each coin with its own key.

        Args:
          keys_K2: uint32 [K, 2] coin keys (see `coin_keys`).
          arrays: the group's data; a coin without train or val windows starts inactive.
            With model.baseline, each coin starts from its own fitted band (`band`) and
            its untrained val loss, which the first epoch measures, is the one to beat
            (step.first_bar).
        """
        with jax.default_matmul_precision(self.matmul_precision):
            keys = sharding.place(np.asarray(keys_K2, np.uint32), self.coin_sharding)
            if self.streamed:
                return self.streamed.init_state(keys, arrays)
            return self._init_jit(keys, arrays)

    def start_from(self, state: epoch_spec.GroupState, params_K, arrays) -> epoch_spec.GroupState:
        """`state` (fresh, donated) starting from the host params [K, ...] `params_K`
        (train.init_from): their val loss is the bar (step.start_from / pooled.start_from)."""
        with jax.default_matmul_precision(self.matmul_precision):
            params = sharding.place(params_K, self.state_sharding.params)
            if self.streamed:
                return self.streamed.start_from(state, params, arrays)
            return self._start_jit(state, params, arrays)

    def abstract_state(self) -> epoch_spec.GroupState:
        """GroupState of jax.ShapeDtypeStruct with shardings, the target of a restore."""
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            self._state_shapes(),
            self.state_sharding,
        )

    def run_epoch(self, state: epoch_spec.GroupState, arrays):
        """Runs one epoch of every active coin; `state` is donated (do not reuse it).

        Returns:
          (new state, metrics): device arrays; metrics holds float32 [K] train_loss,
          val_loss, best_val_loss, val_gain_se, bool [K] active, diverged, and scalars
          epoch (1-based, the epoch just run) and lr (base schedule lr of its last step).
          Losses are NaN for coins that did not train this epoch.
        """
        with jax.default_matmul_precision(self.matmul_precision):
            if self.streamed:
                return self.streamed.run_epoch(state, arrays)
            return self._epoch_jit(state, arrays)

    def in_flight_bytes(self) -> int:
        """Per device, the bytes an epoch holds beside its program's own buffers: a
        streamed epoch's two chunks of windows (cpbjax/training/streaming.py), else 0."""
        return self.streamed.in_flight_bytes() if self.streamed else 0

    def abstract_arrays(self) -> stacking.GroupArrays:
        """GroupArrays of jax.ShapeDtypeStruct with shardings, as `stack` places a group's
        (streamed: less the series), e.g. to lower the programs without data."""
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            self._abstract_arrays(),
            self.arrays_sharding,
        )

    def lowered_init(self, keys_K2, arrays):
        """The lowered init program of `init_state` (keys and arrays placed, or
        `abstract_arrays`), e.g. its compile time for benchmarks."""
        init = self.streamed.fresh if self.streamed else self._init_jit
        with jax.default_matmul_precision(self.matmul_precision):
            return init.lower(keys_K2, arrays)

    def lowered_epoch(self, state: epoch_spec.GroupState, arrays):
        """The lowered epoch program, e.g. `.compile().cost_analysis()` for benchmarks
        (streamed: the program of one full chunk of train steps)."""
        with jax.default_matmul_precision(self.matmul_precision):
            if self.streamed:
                return self.streamed.lowered_epoch(state, arrays)
            return self._epoch_jit.lower(state, arrays)
