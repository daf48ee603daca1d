"""FLOPs, memory and the matmul peak of compiled JAX programs (train_bench's yardsticks).

FLOPs: XLA's `cost_analysis()` counts the body of a while loop ONCE, whatever its trip
count, and a sharded program reports one device's share, so an epoch (a scan over
batches around models that scan over time) is counted from its jaxpr instead:
2 x output size x contracted size of every dot_general, times the length of every
enclosing scan, for all coins. Elementwise work is not counted: the figure is a matmul
FLOP/s, comparable with the matmul peak.
"""

from __future__ import annotations

import math
import resource

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import common
from cpbjax import sharding
from cpbjax.training import memory

MIB = 2**20


def _sub_jaxprs(params: dict):
    """The jaxprs held in an equation's params (a Jaxpr, a ClosedJaxpr or tuples of them)."""
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(v, "eqns"):
                yield v
            elif hasattr(getattr(v, "jaxpr", None), "eqns"):
                yield v.jaxpr


def matmul_flops(jaxpr) -> float:
    """FLOPs of every dot_general in `jaxpr`, scans counted `length` times.

    A cond counts its costliest branch; a while loop (unknown trip count) counts
    its body once; a shard_map body (one device's share) counts once per device of
    its manual mesh axes. Other nested jaxprs (jit, custom_jvp, remat) count once.
    """
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = eqn.invars[0].aval.shape
            out_size = math.prod(eqn.outvars[0].aval.shape)
            total += 2.0 * out_size * math.prod(lhs_shape[d] for d in contract)
            continue
        inner = [matmul_flops(j) for j in _sub_jaxprs(eqn.params)]
        if name == "cond":
            total += max(inner, default=0.0)
        elif name == "scan":
            total += eqn.params["length"] * sum(inner)
        elif name == "shard_map":
            mesh = eqn.params["mesh"]
            axes = eqn.params.get("newly_manual_axes") or mesh.axis_names
            total += math.prod(mesh.shape[a] for a in axes) * sum(inner)
        else:
            total += sum(inner)
    return total


def xla_flops(compiled) -> float | None:
    """XLA's cost_analysis flops (a dict, or a list of one dict per module in older jax)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return (analysis or {}).get("flops")


def program_mib(compiled) -> float | None:
    """Per-device memory of one compiled program: arguments + outputs + temporaries - aliased."""
    m = memory.buffer_sizes(compiled)
    if m is None:
        return None
    used = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return (used - m.alias_size_in_bytes) / MIB


def peak_memory() -> tuple[float, str]:
    """(MiB, what it is): the devices' peak bytes in use, or the process's max RSS on CPU.

    Both are peaks since the process started, so a row shows the largest program
    measured so far (rows run in increasing K).
    """
    stats = [d.memory_stats() for d in jax.local_devices()]
    if all(s and "peak_bytes_in_use" in s for s in stats):
        return sum(s["peak_bytes_in_use"] for s in stats) / MIB, "device peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process max RSS"


# Timed products of the peak. They are cheap, and on a GPU a few short ones vary by
# over 1.5x (4096^2 on an H100: 141 to 242 TFLOP/s in three runs of 2 repeats).
PEAK_REPEATS = 5


def matmul_peak(size: int, dtype: str, repeats: int, precision: str) -> dict:
    """FLOP/s of a jitted [D, n, n] @ [D, n, n] with D = the device count, sharded over them.

    Every device multiplies its own n x n pair at once, the layout the coin axis uses.
    """
    mesh = sharding.coin_mesh()
    coin_sharding = NamedSharding(mesh, P(sharding.COIN_AXIS))
    rng = np.random.default_rng(0)
    shape = (mesh.size, size, size)
    a, b = (jax.device_put(rng.standard_normal(shape, np.float32), coin_sharding) for _ in "ab")
    a, b = a.astype(dtype), b.astype(dtype)
    with jax.default_matmul_precision(precision):
        matmul = jax.jit(jnp.matmul).lower(a, b).compile()
    jax.block_until_ready(matmul(a, b))  # First call outside the timing.
    seconds, _ = common.median_time(lambda: jax.block_until_ready(matmul(a, b)), repeats)
    flops = 2.0 * mesh.size * size**3
    return {
        "dtype": dtype,
        "shape": f"{mesh.size}x{size}x{size}",
        "seconds": seconds,
        "tflops": flops / seconds / 1e12,
    }
