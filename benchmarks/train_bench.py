"""Training speed: cpbjax's compiled group epoch against the hardware and the old torch loop.

For each model as the replaced system trained it (configs/<model>.py:replaced) and each
group size K:
  - trace+lower and compile seconds of the one-epoch program, apart from running it;
  - seconds per epoch (median over measured epochs, metrics blocked on);
  - achieved matmul FLOP/s and its share of a large-matmul peak measured in the same run;
  - per-device program memory (XLA's memory analysis) and the process's peak memory.
Then, side by side in ONE run, for each model and decoding: the old torch loop
(benchmarks/torch_baseline.py) decoding the same way and cpbjax at K = --torch-coins,
alternated A B A B, and
  ratio = torch seconds per model-epoch x K / cpbjax seconds per epoch of K coins,
with torch timed at 1 thread and at all cores and its FASTER figure used (on a loaded
machine torch's spinning OpenMP workers can make all cores slower than one), and
ratio_at_peak = ratio x 100 / pct_of_peak, the ratio had cpbjax's matmuls run at the
measured peak: a ceiling for any program that does the same matmul work. Both sides
train MSE on the raw network output (model.baseline, train.loss and train.loss_scale
are pinned), as the torch loop does.
Last, the time to train the whole suite (all series of the config) at default epochs.

FLOPs are the matmul FLOPs counted from the epoch's jaxpr, scans times their length
(benchmarks/hardware.py says why XLA's count cannot be used); XLA's own figure is shown
beside it (`xla_flops`). The torch side is benchmarks/torch_side.py, the tables
benchmarks/train_bench_report.py.

Usage:
  python benchmarks/train_bench.py --models transformer,gru,lstm --coins 1,4,8,20,40
      [--torch-coins 20] [--repeats 3] [--epochs-measured 2] [--candles 5000]
      [--source synthetic|binance --base-url DIR] [--decoding autoregressive,direct]
      [--dtype float32,bfloat16] [--device cpu|cuda]
      [--records-dir benchmarks/records] [--quick]
  The tables also go to a new record file, benchmarks/records/train_bench-<UTC time>.md.
  --quick: a smoke test (tiny configs, K=2, 200 candles, one round; about a minute per
  model on 2 cores; no record unless --records-dir is given). --torch-coins 0 or no torch installed: cpbjax only. On a GPU
  machine JAX uses the GPU by itself; --device cuda puts the torch loop there too.
"""

from __future__ import annotations

import os

# One XLA host device per core, set before jax is imported (as launch.py does), so the
# coin axis is sharded over the CPU cores. A user's own XLA_FLAGS win.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):  # Run as a script: make the repo root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from benchmarks import common, hardware, torch_side  # noqa: E402
from benchmarks.train_bench_report import (  # noqa: E402
    Results,
    add_peak_share,
    add_ratio_ceiling,
    report,
    suite_rows,
)
from cpbjax import models, sharding  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.data import sources, windows  # noqa: E402
from cpbjax.data.series import SeriesSkipped  # noqa: E402
from cpbjax.training import epoch_spec  # noqa: E402
from cpbjax.training.group import GroupTrainer, coin_keys  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODELS = ("transformer", "gru", "lstm")


# ---------------------------------------------------------------- data


def bench_config(model: str, args, decoding: str, dtype: str):
    """The model as the replaced system trained it (`replaced`; `tiny` under --quick) with
    the benchmark's data settings."""
    config = config_lib.load(
        str(REPO / "configs" / f"{model}.py") + (":tiny" if args.quick else ":replaced")
    )
    set_bench_data(config, args)
    config.model.decoding, config.dtype = decoding, dtype
    # Like for like with the torch loop (MSE on the raw output): `tiny` has today's
    # objective, `replaced` already has this one; both train one model per series on
    # unscaled windows.
    config.model.baseline, config.train.loss, config.train.loss_scale = "none", "mse", "none"
    return config_lib.validate(config)


def set_bench_data(config, args) -> None:
    """Points config.data at the benchmark's source (--source, --base-url) and length
    (--candles): every series is cut to the same number of candles."""
    d = config.data
    d.source = args.source
    d.max_candles = args.candles
    d.min_candles = min(d.min_candles, args.candles)
    if args.source == "synthetic":
        d.synthetic_candles = d.min_candles = args.candles
    else:
        d.base_url = args.base_url


def load_group_data(config) -> tuple[list, list]:
    """(Series, PreparedSeries) of every series of the config that loads and prepares.

    Raises:
      ValueError: if no series is usable (the skip reasons are named).
    """
    series, skipped = sources.load_all(config.data)
    kept, preps = [], []
    for s in series:
        try:
            preps.append(windows.prepare_series(s, config.data))
            kept.append(s)
        except SeriesSkipped as e:
            skipped[s.name] = str(e)
    if not preps:
        raise ValueError(f"no usable series from data.source={config.data.source!r}: {skipped}")
    return kept, preps


# ---------------------------------------------------------------- cpbjax


@dataclasses.dataclass
class Group:
    """One compiled group epoch of K coins and its state, ready to be timed."""

    k: int
    k_padded: int
    compiled: object
    state: object
    arrays: object
    lower_s: float
    compile_s: float
    flops: float  # Matmul FLOPs of one epoch, all coins (from the jaxpr).
    xla_flops: float | None
    program_mib: float | None

    def epoch(self) -> float:
        """Runs one epoch (the state is donated and replaced); returns its seconds."""
        start = time.perf_counter()
        self.state, metrics = self.compiled(self.state, self.arrays)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start


def build_group(config, preps: list, k: int) -> Group:
    """Stacks K series (cycling through `preps`), inits, lowers and compiles one epoch.

    K is padded up to a multiple of the device count, as the run driver does; the
    padded coins are inactive but still computed.
    """
    mesh = sharding.coin_mesh()
    k_padded = -(-k // mesh.size) * mesh.size
    module = models.build(models.make_config(config))
    trainer = GroupTrainer(epoch_spec.make_spec(config, module), k_padded, mesh)
    arrays = trainer.stack([preps[i % len(preps)] for i in range(k)])
    state = trainer.init_state(coin_keys(config.seed, range(k_padded)), arrays)
    jax.block_until_ready(state)
    start = time.perf_counter()
    lowered = trainer.lowered_epoch(state, arrays)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    flops = hardware.matmul_flops(jax.make_jaxpr(trainer.run_epoch)(state, arrays).jaxpr)
    return Group(
        k=k,
        k_padded=k_padded,
        compiled=compiled,
        state=state,
        arrays=arrays,
        lower_s=lowered_at - start,
        compile_s=compiled_at - lowered_at,
        flops=flops,
        xla_flops=hardware.xla_flops(compiled),
        program_mib=hardware.program_mib(compiled),
    )


def throughput_row(config, group: Group, epoch_s: list[float]) -> dict:
    """One throughput table row from a group and its measured epoch seconds.

    `pct_of_peak` is filled in by `add_peak_share` once the matmul peak is measured.
    """
    seconds = statistics.median(epoch_s)
    memory, memory_kind = hardware.peak_memory()
    return {
        "model": config.model.name,
        "decoding": config.model.decoding,
        "dtype": config.dtype,
        "K": group.k,
        "K_padded": group.k_padded,
        "lower_s": group.lower_s,
        "compile_s": group.compile_s,
        "epochs": len(epoch_s),
        "s_per_epoch": seconds,
        "s_per_coin_epoch": seconds / group.k,
        "gflop_per_epoch": group.flops / 1e9,
        "xla_flops": group.xla_flops,
        "achieved_tflops": group.flops / seconds / 1e12,
        "program_mib": group.program_mib,
        "peak_mib": memory,
        "peak_kind": memory_kind,
        "epoch_s_all": [round(s, 3) for s in epoch_s],
    }


def measure_group(config, preps, k: int, warmup: int, epochs: int) -> tuple[Group, list[float]]:
    """Builds a group, runs `warmup` epochs untimed, then times `epochs` epochs."""
    group = build_group(config, preps, k)
    for _ in range(warmup):
        group.epoch()
    return group, [group.epoch() for _ in range(epochs)]


# ---------------------------------------------------------------- one model


def _group_sizes(args, with_torch: bool) -> list[int]:
    return sorted(set(args.coins) | ({args.torch_coins} if with_torch else set()))


def _time_group(model: str, config, preps, k: int, args, tw: list | None):
    """Builds a group of k series and times its epochs: alone, or with torch windows `tw`
    alternated with torch (`torch_side.side_by_side`, decoding as the group does).

    Returns:
      (the group, its epoch seconds, torch seconds per model-epoch by thread count or None).
    """
    if tw is None:
        group, epoch_s = measure_group(config, preps, k, args.warmup_epochs, args.epochs_measured)
        return group, epoch_s, None
    group = build_group(config, preps, k)
    for _ in range(args.warmup_epochs):
        group.epoch()
    torch_s, epoch_s = torch_side.side_by_side(
        model, group, tw, args.repeats, args.device, config.model.decoding
    )
    return group, epoch_s, torch_s


def run_model(model: str, args, results: Results) -> None:
    """Throughput of every decoding, dtype and K, the side-by-side rounds and the suite estimate.

    Torch runs once per decoding, beside that decoding's first dtype; the other dtypes'
    ratios reuse its figure (not alternated).
    """
    base = bench_config(model, args, args.decodings[0], args.dtypes[0])
    series, preps = load_group_data(base)
    with_torch = torch_side.torch_baseline is not None and args.torch_coins > 0
    tw = (
        torch_side.torch_windows(series, base, args.torch_series, args.device)
        if with_torch
        else None
    )
    n_suite = len(base.data.symbols) * len(base.data.intervals)
    torch_by_decoding = {}  # decoding -> {threads: torch seconds per model-epoch}
    for decoding, dtype in itertools.product(args.decodings, args.dtypes):
        config = bench_config(model, args, decoding, dtype)
        alternated = with_torch and dtype == args.dtypes[0]
        rows = []
        for k in _group_sizes(args, with_torch):
            print(f"{model} {decoding} {dtype} K={k}: compiling", flush=True)
            beside_torch = alternated and k == args.torch_coins
            group, epoch_s, torch_s = _time_group(
                model, config, preps, k, args, tw if beside_torch else None
            )
            if beside_torch:
                torch_by_decoding[decoding] = torch_s
            rows.append(throughput_row(config, group, epoch_s))
            print(f"  {rows[-1]}", flush=True)
            del group  # Frees the device state and data before the next K.
            if decoding in torch_by_decoding and k == args.torch_coins:
                torch_s = torch_by_decoding[decoding]
                ratio = torch_side.ratio_row(
                    config, k, torch_s, rows[-1]["s_per_epoch"], alternated
                )
                results.ratios.append(ratio)
        torch_s = torch_by_decoding.get(decoding) if alternated else None
        results.suite += suite_rows(config, rows, torch_s, n_suite)
        results.throughput += rows


# ---------------------------------------------------------------- command line

_REL_RECORDS = "benchmarks/records"

# Flag defaults, and what --quick shrinks them to (a flag given explicitly wins).
_DEFAULTS = {
    "coins": "1,4,8,20,40",
    "torch_coins": 20,
    "repeats": 3,
    "epochs_measured": 2,
    "warmup_epochs": 1,
    "candles": 5000,
    "peak_size": 0,
    "records_dir": common.RECORDS_DIR,
}
_QUICK = {
    "coins": "2",
    "torch_coins": 2,
    "repeats": 1,
    "epochs_measured": 1,
    "warmup_epochs": 0,
    "candles": 200,
    "peak_size": 1024,
    "records_dir": "",
}


def _csv(text: str, allowed=None, kind=str, flag=""):
    items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"{flag}={text!r}: expected a comma list of {allowed}")
    return items


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma list of models")
    p.add_argument("--coins", help=f"comma list of group sizes K (default {_DEFAULTS['coins']})")
    p.add_argument("--torch-coins", type=int, help="K of the side-by-side ratio; 0 = no torch")
    p.add_argument("--torch-series", type=int, default=2, help="series torch trains per call")
    p.add_argument("--repeats", type=int, help="side-by-side rounds (torch A, cpbjax B)")
    p.add_argument("--epochs-measured", type=int, help="timed epochs per throughput row")
    p.add_argument("--warmup-epochs", type=int, help="untimed epochs after compiling")
    p.add_argument("--candles", type=int, help="candles per series (data.max_candles)")
    p.add_argument("--source", default="synthetic", choices=["synthetic", "binance"])
    p.add_argument("--base-url", default="", help="binance mirror directory or URL")
    p.add_argument("--decoding", default="autoregressive", help="autoregressive,direct")
    p.add_argument("--dtype", default="float32", help="float32,bfloat16")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="torch's device")
    p.add_argument("--peak-size", type=int, help="n of the matmul peak; 0 = 4096 CPU, 8192 GPU")
    p.add_argument(
        "--records-dir",
        help=f"write this run's record to a new file in this folder (default {_REL_RECORDS},"
        ' none with --quick; "" = none)',
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke test: tiny configs, K=2, 200 candles, one round"
    )
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parses and checks the flags; --quick fills the ones not given with small values."""
    p = _parser()
    args = p.parse_args(argv)
    for key, value in (_QUICK if args.quick else _DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.models = _csv(args.models, MODELS, flag="--models")
        args.coins = _csv(str(args.coins), kind=int, flag="--coins")
        args.decodings = _csv(args.decoding, ("autoregressive", "direct"), flag="--decoding")
        args.dtypes = _csv(args.dtype, ("float32", "bfloat16"), flag="--dtype")
    except (argparse.ArgumentTypeError, ValueError) as e:
        p.error(str(e))
    positive = ("repeats", "epochs_measured", "candles")
    for key in positive:
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')}={getattr(args, key)} must be >= 1")
    if min(args.coins) < 1 or min(args.torch_coins, args.warmup_epochs, args.peak_size) < 0:
        p.error("--coins must be >= 1; --torch-coins, --warmup-epochs and --peak-size >= 0")
    if args.torch_series < 2:
        p.error("--torch-series must be >= 2 (the first model-epoch of each call is a warm-up)")
    return args


def _check_torch(args) -> list[str]:
    """Notes about the torch side; exits 2 if --device cuda has no CUDA device."""
    if torch_side.torch_baseline is None:
        return [
            f"torch side skipped: torch is not installed ({torch_side.MISSING}); "
            'install it with `pip install -e ".[bench]"`.'
        ]
    if args.device == "cuda" and not torch_side.torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        sys.exit(2)
    return []


def _facts(args) -> dict:
    facts = common.machine_facts()
    devices = jax.devices()
    facts.update(
        {
            "jax_backend": jax.default_backend(),
            "jax_devices": len(devices),
            "device": devices[0].device_kind,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "torch_device": args.device,
            "load_avg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        }
    )
    return facts


def main(argv=None) -> Results:
    """Runs every model, then the matmul peak; prints (and optionally appends) the tables."""
    args = parse_args(argv)
    notes = _check_torch(args)
    for line in notes:
        print(line, flush=True)
    command = common.command_line("train_bench", argv)
    facts = _facts(args)
    print(f"Command: {command}\nMachine: {facts}", flush=True)
    results = Results()
    for model in args.models:
        run_model(model, args, results)
    # The peak runs last, so its buffers do not count in the training rows' memory.
    precision = bench_config(args.models[0], args, "autoregressive", "float32").matmul_precision
    peak_dtypes = ["float32"]
    if jax.default_backend() != "cpu" or "bfloat16" in args.dtypes:
        peak_dtypes.append("bfloat16")
    size = args.peak_size or (4096 if jax.default_backend() == "cpu" else 8192)
    peaks = {
        d: hardware.matmul_peak(size, d, hardware.PEAK_REPEATS, precision) for d in peak_dtypes
    }
    add_peak_share(results.throughput, peaks)
    add_ratio_ceiling(results.ratios, results.throughput)
    facts["load_avg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    notes.append(
        f"Load average (1, 5, 15 min) at start {facts['load_avg_start']}, "
        f"at end {facts['load_avg_end']}."
    )
    text = report(results, peaks, notes)
    title = "Training throughput: cpbjax group epoch vs the torch loop"
    common.print_and_record(args.records_dir, "train_bench", title, text, argv, facts)
    return results


if __name__ == "__main__":
    main()
