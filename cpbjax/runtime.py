"""Backend choice, matmul precision, jax.distributed start, and device and version facts."""

from __future__ import annotations

import functools
import importlib.metadata
import logging as std_logging
import math
import os
import sys

import jax
import jax.extend.random
from absl import logging
from jax.interpreters import mlir

from cpbjax import workdir
from cpbjax.version import __version__

_BACKENDS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}


class PlatformError(RuntimeError):
    """The requested platform is not usable here; never fall back silently."""


class _NoTpuProbeLog(std_logging.Filter):
    """Drops JAX's "Unable to initialize backend 'tpu': ..." record.

    With jax_platforms unset (config.platform=auto) JAX probes every backend, and on a
    machine without a TPU every command started with that line (it is logged at INFO,
    which absl shows). Only that record goes; JAX's other messages stay."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Unable to initialize backend 'tpu'")


_NO_TPU_PROBE_LOG = _NoTpuProbeLog()


def compilation_cache() -> str:
    """The persistent XLA compilation cache's folder, "" for none: $CPBJAX_COMPILATION_CACHE
    (set empty, no cache; benchmarks point it at an empty folder to compile cold), else
    the user's JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/cpbjax/xla (~/.cache/cpbjax/xla
    when that is unset or empty), beside the parsed arrays (data/parsed_cache.py)."""
    for name in ("CPBJAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR"):
        if name in os.environ:
            return os.path.expanduser(os.environ[name])
    return workdir.user_cache("xla")


def configure(config) -> str:
    """Applies config.platform and config.matmul_precision; returns the backend used.

    Raises:
      PlatformError: `gpu` or `tpu` asked for on a machine that has none. The
        replaced system silently fell back to the CPU, which cost users hours.
    """
    if config.platform != "tpu":  # a TPU asked for and missing still says why
        std_logging.getLogger("jax._src.xla_bridge").addFilter(_NO_TPU_PROBE_LOG)
    jax.config.update("jax_default_matmul_precision", config.matmul_precision)
    # A rerun (resume, evaluate, predict) reuses compiled programs instead of paying
    # the compile again (measured: a tiny GRU rerun 44 s -> 15 s on 2 CPU cores).
    if cache := compilation_cache():
        jax.config.update("jax_compilation_cache_dir", cache)
    fast_threefry()
    if config.distributed.enabled:
        _initialize_distributed(config.distributed)
    if config.platform == "auto":
        backend = jax.default_backend()
        logging.info("platform=auto chose backend %r", backend)
        return backend
    # Restrict JAX to the asked backend BEFORE it initialises any, so a missing GPU
    # is an error here rather than a silent CPU run.
    jax.config.update("jax_platforms", _BACKENDS[config.platform])
    try:
        jax.devices()
    except Exception:  # noqa: BLE001 (jax raises RuntimeError or AssertionError here)
        raise PlatformError(
            f"config.platform={config.platform!r} but JAX finds no usable "
            f"{config.platform.upper()} on this machine. On a GPU machine install "
            '`pip install -e ".[cuda12]"`; otherwise use --config.platform=cpu or auto.'
        ) from None
    return config.platform


# Hashes of at least this many words are unrolled on the CPU (`fast_threefry`): dropout
# masks and parameter inits; below it, the per-coin and per-member keys flax derives for
# each of them stay rolled.
UNROLLED_THREEFRY_WORDS = 1024


def fast_threefry() -> None:
    """Lowers the threefry hash behind every random draw (dropout masks, param init,
    shuffles) the way that compiles fastest, with the same bits.

    Why: each dropout site hashes its whole mask [K, Y, B, L, D] in-program, ~20 sites per
    transformer step. On a GPU that inlines the 20 rounds into a fused kernel per site;
    jax's handwritten kernel (jax_threefry_gpu_kernel_lowering) exists to spare that
    compile. On the CPU jax 0.10 rolls the rounds into a while loop whose rotation amounts
    are loop-carried, and LLVM expands such a body over a 5-D mask into ~1.4 MB of IR
    (the transformer default's epoch program: 17.1 MB of optimised IR, 6.5 MB with large
    hashes unrolled as later jax lowers them). Unrolled small hashes, though, are fused
    into every consumer of their keys: with them rolled that program has 49.6k HLO
    instructions after optimisation, with every hash unrolled 65.2k. Both lowerings compute
    threefry2x32-20 exactly (tests/runtime_test.py); a jax without the private lowering
    keeps its own."""
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    try:
        from jax._src.random.threefry2x32 import _threefry2x32_lowering as rounds
    except ImportError:
        return
    lowering = {
        rolled: mlir.lower_fun(
            functools.partial(rounds, use_rolled_loops=rolled), multiple_results=True
        )
        for rolled in (False, True)
    }

    def rule(ctx, *args):
        words = math.prod(ctx.avals_out[0].shape)
        return lowering[words < UNROLLED_THREEFRY_WORDS](ctx, *args)

    mlir.register_lowering(jax.extend.random.threefry2x32_p, rule, platform="cpu")


def _initialize_distributed(dist_cfg) -> None:
    """jax.distributed.initialize with the config's explicit values, or auto-detection."""
    # Cross-process transfers on the CPU backend (placing a global array, gathering
    # metrics) need a collectives library; GPU and TPU backends bring their own.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    explicit = dist_cfg.num_processes > 0
    try:
        jax.distributed.initialize(
            coordinator_address=dist_cfg.coordinator_address or None,
            num_processes=dist_cfg.num_processes if explicit else None,
            process_id=dist_cfg.process_id if explicit else None,
        )
    except (RuntimeError, ValueError) as e:
        raise PlatformError(
            f"config.distributed.enabled=True but jax.distributed.initialize failed ({e}); "
            "set coordinator_address, num_processes and process_id, or run under SLURM/Open MPI"
        ) from None
    logging.info("process %d of %d", jax.process_index(), jax.process_count())


def describe_devices() -> dict:
    """JSON-ready facts about the devices JAX will use."""
    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in devices],
        "jax": jax.__version__,
    }


def versions() -> dict:
    """Python, cpbjax and the library versions a run's results were computed with."""
    names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy")
    return {
        "python": sys.version.split()[0],
        "cpbjax": __version__,
        **{n: importlib.metadata.version(n) for n in names},
    }
