"""Model speed: compile time of one training step and time per batch, per model.

For each model at its default config (batch size from config.train.batch_size,
L=30, H=10, F=C=4), a fresh jitted training step (value_and_grad of the MSE with
train=True and teacher forcing 0.5, then an optax adam update) is traced and
compiled `--compile_repeats` times, each time from a new function object so no
compilation cache is hit. The compiled step (forward + backward + adam) and the
compiled evaluation forward (train=False) are then each timed `--repeats` times.
Every figure is a median.

Usage:
  python benchmarks/model_bench.py [--models transformer,gru,lstm]
      [--decoding autoregressive] [--dtype float32] [--compile_repeats 3] [--repeats 20]
      [--threefry_partitionable default|true|false] [--records-dir benchmarks/records]
  Each run also writes its table to a new file benchmarks/records/model_bench-<UTC time>.md
  (--records-dir DIR elsewhere, --records-dir "" none).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # Run as a script: make the repo root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks import common  # noqa: E402
from cpbjax import models  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _train_step_fn(module, optimizer):
    """A new (uncached) jitted training step: loss, grads, adam update."""

    def step(params, opt_state, x, y, key):
        k_dropout, k_teacher = jax.random.split(key)
        rngs = {"dropout": k_dropout, "teacher": k_teacher}

        def loss(p):
            y_hat = module.apply({"params": p}, x, y, train=True, teacher_forcing=0.5, rngs=rngs)
            return jnp.mean((y_hat - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return jax.jit(step)


def _time_compiles(module, optimizer, inputs, repeats: int):
    """Traces and compiles a fresh training step `repeats` times: the last compiled step and
    the trace and compile seconds of each time."""
    trace_s, compile_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        lowered = _train_step_fn(module, optimizer).lower(*inputs)
        traced = time.perf_counter()
        step = lowered.compile()
        trace_s.append(traced - start)
        compile_s.append(time.perf_counter() - traced)
    return step, trace_s, compile_s


def _bench_model(name: str, args) -> dict:
    config = config_lib.load(str(REPO / f"configs/{name}.py"))
    config.model.decoding, config.dtype = args.decoding, args.dtype
    # Autoregressive takes neither; the band and the window scale cost about nothing.
    config.model.baseline, config.model.window_scale = "none", "none"
    config = config_lib.validate(config)
    model_cfg = models.make_config(config)
    module = models.build(model_cfg)
    batch = config.train.batch_size
    rng = np.random.default_rng(0)
    x = jnp.float32(0.01 * rng.normal(size=(batch, model_cfg.lookback, model_cfg.num_features)))
    y = jnp.float32(0.01 * rng.normal(size=(batch, model_cfg.horizon, model_cfg.num_targets)))
    params = jax.jit(lambda k: module.init({"params": k}, x, y)["params"])(jax.random.key(0))
    optimizer = optax.adam(config.train.learning_rate)
    inputs = (params, optimizer.init(params), x, y, jax.random.key(1))

    step, trace_s, compile_s = _time_compiles(module, optimizer, inputs, args.compile_repeats)
    step_s, _ = common.median_time(lambda: jax.block_until_ready(step(*inputs)), args.repeats)
    forward = jax.jit(lambda p, x: module.apply({"params": p}, x))
    jax.block_until_ready(forward(params, x))  # Compile outside the timing.
    forward_s, _ = common.median_time(
        lambda: jax.block_until_ready(forward(params, x)), args.repeats
    )
    return {
        "model": name,
        "decoding": args.decoding,
        "dtype": args.dtype,
        "params": sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)),
        "batch": batch,
        "trace_s": statistics.median(trace_s),
        "compile_s": statistics.median(compile_s),
        "step_ms": 1e3 * step_s,
        "forward_ms": 1e3 * forward_s,
    }


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="transformer,gru,lstm")
    p.add_argument("--decoding", default="autoregressive", choices=["autoregressive", "direct"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--compile_repeats", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--threefry_partitionable",
        default="default",
        choices=["default", "true", "false"],
        help="set jax_threefry_partitionable (dropout RNG; changes compile time)",
    )
    common.add_records_dir_flag(p)
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = _args(argv)
    if args.threefry_partitionable != "default":
        jax.config.update("jax_threefry_partitionable", args.threefry_partitionable == "true")
    rows = [_bench_model(name, args) for name in args.models.split(",")]
    facts = common.machine_facts()
    facts["device"] = jax.devices()[0].device_kind
    facts["threefry_partitionable"] = jax.config.jax_threefry_partitionable
    columns = [
        "model",
        "decoding",
        "dtype",
        "params",
        "batch",
        "trace_s",
        "compile_s",
        "step_ms",
        "forward_ms",
    ]
    table = common.markdown_table(rows, columns)
    print(f"Command: {common.command_line('model_bench', argv)}")
    print("Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    title = "Models: train-step compile time and time per batch"
    common.print_and_record(args.records_dir, "model_bench", title, table, argv, facts)
    return rows


if __name__ == "__main__":
    main()
