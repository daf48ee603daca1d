"""The coin mesh and everything that crosses devices or processes.

Per-series coins are independent, so the cross-device traffic of a run is here: placing
host arrays on the coin-sharded mesh, gathering per-coin results back to the host, and
the multi-host barriers; a pooled model adds the collectives of its epoch over COIN_AXIS
(cpbjax/training/pooled.py). In a multi-host run (config.distributed) the coin axis spans every
process's devices; process 0 alone writes the workdir (`is_primary`).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

COIN_AXIS = "coins"


def coin_mesh(devices=None) -> Mesh:
    """A 1-D mesh named `coins` over all (or the given) devices."""
    return Mesh(np.array(devices if devices is not None else jax.devices()), (COIN_AXIS,))


def coin_specs(tree):
    """PartitionSpecs of a pytree whose non-scalar leaves carry the coin axis first."""
    return jax.tree.map(lambda leaf: P(COIN_AXIS) if leaf.ndim else P(), tree)


def named(mesh: Mesh, specs):
    """NamedShardings on `mesh` of a pytree of PartitionSpecs."""
    return jax.tree.map(lambda p: NamedSharding(mesh, p), specs)


def place(host_tree, shardings):
    """Device arrays of a host (numpy) pytree, each process placing only its own shards.

    The same call builds the global arrays of a multi-host run; on one process it is a
    sharded device_put.
    """
    return jax.tree.map(
        lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]), host_tree, shardings
    )


def is_primary() -> bool:
    """Whether this process writes the workdir's files (process 0 of a multi-host run)."""
    return jax.process_index() == 0


def to_host(tree):
    """Numpy copy of a pytree of [K, ...] device arrays.

    In a multi-host run each process holds only its own coins' shards, so the arrays
    are gathered from every process (a collective: every process must call this).
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def agree(decision: bool) -> bool:
    """Process 0's `decision`, on every process (timings differ between hosts)."""
    if jax.process_count() == 1:
        return decision
    return bool(multihost_utils.broadcast_one_to_all(np.array(decision)))


def barrier(name: str) -> None:
    """Multi-host: every process waits here until all arrive (process 0 is the slow one,
    as it alone evaluates and writes), so none runs ahead into the next collective."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def memory_bytes() -> tuple[int | None, int | None]:
    """(bytes in use, peak bytes) summed over local devices, or Nones where unsupported."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    if not all(stats):
        return None, None
    peak = [s.get("peak_bytes_in_use") for s in stats]
    return sum(s.get("bytes_in_use", 0) for s in stats), (None if None in peak else sum(peak))
