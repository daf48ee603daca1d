"""Whether a group's epoch program fits in memory, asked before its first epoch runs.

XLA assigns every buffer of a program when it compiles it, so `Compiled.memory_analysis()`
tells how many bytes one epoch allocates beyond its arguments (temporaries and outputs,
less the outputs that reuse the donated state) before anything runs. The need grows with
K·B, the windows of one step: a pooled model takes one gradient over every series of the
run, so its need grows with the number of series. On the CPU backend a program that
outgrows the RAM is killed by the OS without a word; on a GPU it fails with a long XLA
trace. This module says so in one line first: the group, the need, the capacity, and the
config fields that lower it.
"""

from __future__ import annotations

import dataclasses

from absl import logging

from cpbjax.config_rules import ConfigError
from cpbjax.training import sharing

GIB = 2**30


class DoesNotFit(ConfigError):
    """A group's epoch program needs more memory than its devices (or the host) have."""


@dataclasses.dataclass(frozen=True)
class Need:
    """Bytes one epoch program allocates beyond its arguments, which are already placed."""

    per_device: int  # on each device of the program's mesh
    devices: int  # the mesh's devices on this host; on the CPU backend they share its RAM

    def on(self, backend: str) -> int:
        """The bytes that compete for one pool: the host's RAM on CPU, a device's memory
        elsewhere."""
        return self.per_device * self.devices if backend == "cpu" else self.per_device


def buffer_sizes(compiled):
    """XLA's buffer assignment of a jax.stages.Compiled (CompiledMemoryStats: argument,
    output, alias and temp sizes in bytes, per device), or None where the backend does
    not report it."""
    try:
        return compiled.memory_analysis()
    except (NotImplementedError, RuntimeError):
        return None


def epoch_need(compiled, devices: int, in_flight: int = 0) -> Need | None:
    """The Need of a compiled epoch program (jax.stages.Compiled), or None where the
    backend does not report its buffers. in_flight: bytes per device the epoch holds
    beside the program's buffers (a streamed epoch's chunks, GroupTrainer.in_flight_bytes)."""
    m = buffer_sizes(compiled)
    if m is None:
        return None
    per_device = m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    return Need(max(int(per_device), 0) + in_flight, devices)


def host_memory(meminfo: str = "/proc/meminfo") -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) bytes of this host, or None where /proc/meminfo is not
    readable (not Linux) or lacks them."""
    try:
        with open(meminfo) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        kib = [int(fields[k].split()[0]) for k in ("MemTotal", "MemAvailable")]
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return kib[0] * 1024, kib[1] * 1024


def device_memory(devices) -> tuple[int, int] | None:
    """(limit, limit - in use) bytes of the tightest device, or None where a device does
    not report them (the CPU backend)."""
    stats = [d.memory_stats() for d in devices]
    if not all(s and "bytes_limit" in s for s in stats):
        return None
    return min((s["bytes_limit"], s["bytes_limit"] - s.get("bytes_in_use", 0)) for s in stats)


def check(where: str, need: Need, backend: str, capacity, remedy: str) -> None:
    """Logs the need of `where`'s epoch program; warns when it exceeds the free memory.

    Args:
      where: the group, e.g. "group-000". need: its program's Need. backend: the devices'
        platform ("cpu", "gpu", ...). capacity: (total, free) bytes of the pool the
        program draws on (`host_memory` on CPU, `device_memory` elsewhere), or None.
      remedy: the config fields that lower the need, named in the message.

    Raises:
      DoesNotFit: the need exceeds the pool's total: the epoch cannot run on this machine.
    """
    wanted = need.on(backend)
    pool = "this host's RAM" if backend == "cpu" else f"one {backend} device's memory"
    what = f"{where}: one epoch needs about {wanted / GIB:.2f} GiB beyond its data"
    if capacity is None:
        logging.info("%s (XLA's buffer assignment)", what)
        return
    total, free = capacity
    if wanted > total:
        raise DoesNotFit(f"{what}, more than the {total / GIB:.2f} GiB of {pool}: {remedy}")
    if wanted > free:
        logging.warning(
            "%s, more than the %.2f GiB of %s free now: it may fail; %s",
            what,
            free / GIB,
            pool,
            remedy,
        )
        return
    logging.info("%s, of %.2f GiB free (%s)", what, free / GIB, pool)


def remedy(train_cfg, num_coins: int, num_devices: int = 1) -> str:
    """The config fields that lower an epoch's need, with their values now (a pooled
    model's chunks split the num_coins / num_devices coins each device holds)."""
    batch = f"lower train.batch_size ({train_cfg.batch_size} windows per coin per step)"
    if train_cfg.stream_chunk_steps:
        chunk = f"train.stream_chunk_steps, {train_cfg.stream_chunk_steps} now"
        batch = f"{batch}, fewer steps per streamed chunk ({chunk})"
    if sharing.from_config(train_cfg).chunked_gradient:
        per_device = num_coins // num_devices
        chunk = min(train_cfg.pooled_chunk or per_device, per_device)
        held = f"the {per_device} coins each device holds" if num_devices > 1 else per_device
        return (
            f"{batch}, take the gradient in smaller chunks of coins (train.pooled_chunk, "
            f"{chunk} of {held} now), or train one model per series (train.share='series')"
        )
    return f"{batch} or train.group_size ({num_coins} coins per program)"
