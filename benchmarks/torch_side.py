"""The replaced torch loop's side of train_bench: its windows, its timed model-epochs on a
device, and the alternated rounds against one cpbjax group epoch that give the ratio.

The torch side is optional (`pip install -e ".[bench]"`): without torch, `torch_baseline`
is None and `MISSING` says why.
"""

from __future__ import annotations

import contextlib
import os
import statistics

MISSING = ""  # why the torch side is off, when it is
try:
    import torch

    from benchmarks import torch_baseline
except ImportError as _torch_error:
    torch = torch_baseline = None
    MISSING = str(_torch_error)


@contextlib.contextmanager
def torch_on(device: str):
    """While open, torch_baseline builds its models on `device`.

    `time_torch_epochs` has no device argument. Its loop runs unchanged on any device
    once the model and the window tensors live there (the shuffle index stays on the
    host, which torch's indexing accepts), so only the model's placement is swapped in.
    """
    if device == "cpu":
        yield
        return
    build = torch_baseline.build_model
    torch_baseline.build_model = lambda *args: build(*args).to(device)
    try:
        yield
    finally:
        torch_baseline.build_model = build


def torch_windows(series: list, config, n_series: int, device: str) -> list[dict]:
    """torch_baseline's materialised windows of the first `n_series` series, on `device`."""
    chosen = [series[i % len(series)] for i in range(n_series)]
    out = torch_baseline.prepare_windows(chosen, config.data)
    for w in out:
        for split in ("train", "val"):
            w[split] = tuple(t.to(device) for t in w[split])
    return out


def torch_samples(model: str, series_windows: list, threads: int, device: str, decoding: str):
    """Seconds of each model-epoch of one `time_torch_epochs` call, its warm-up left out."""
    with torch_on(device):
        result = torch_baseline.time_torch_epochs(
            model, series_windows, 1, threads, decoding=decoding
        )
    return result["epoch_s"][1:]


def thread_settings(device: str) -> list[int]:
    """Torch intra-op threads to time: 1 and all cores on CPU; all cores on a GPU."""
    cores = os.cpu_count() or 1
    return sorted({1, cores}) if device == "cpu" else [cores]


# A thread setting this many times slower than the fastest after round 1 cannot become
# the faster figure, so later rounds skip it (on a loaded 2-core machine torch at 2
# threads was seen 8-23x slower than at 1, which would have cost tens of minutes).
_HOPELESS = 2.0


def side_by_side(model, group, tw: list, rounds: int, device: str, decoding: str):
    """Alternates torch (every thread setting) and one cpbjax epoch, `rounds` times.

    Torch decodes like the cpbjax group (`decoding`), so the ratio is like for like.

    After the first round, a thread setting more than _HOPELESS times slower than the
    fastest is skipped; its samples are still reported.

    Returns:
      (torch seconds per model-epoch by thread count: all samples, cpbjax epoch seconds).
    """
    torch_s = {threads: [] for threads in thread_settings(device)}
    cpbjax_s = []
    for r in range(rounds):
        fastest = min((statistics.median(s) for s in torch_s.values() if s), default=None)
        for threads, samples in torch_s.items():
            if r and statistics.median(samples) > _HOPELESS * fastest:
                continue
            samples += torch_samples(model, tw, threads, device, decoding)
            print(f"  round {r + 1} torch {threads} thread(s): {samples[-1]:.2f} s", flush=True)
        cpbjax_s.append(group.epoch())
        print(f"  round {r + 1} cpbjax K={group.k}: {cpbjax_s[-1]:.2f} s", flush=True)
    return torch_s, cpbjax_s


def _alternation(alternated: bool, torch_s: dict) -> str:
    """How the torch and cpbjax timings were interleaved, for the ratio table."""
    if not alternated:
        return "no (torch of the same run)"
    rounds = max(len(s) for s in torch_s.values())
    return "yes (A B A B)" if rounds > 1 else "one round (A B)"


def ratio_row(config, k: int, torch_s: dict, cpbjax_epoch_s: float, alternated: bool) -> dict:
    """The headline ratio (torch s/model-epoch x K) / (cpbjax s/epoch of K coins)."""
    medians = {t: statistics.median(s) for t, s in torch_s.items()}
    best_threads = min(medians, key=medians.get)
    row = {
        "model": config.model.name,
        "decoding": config.model.decoding,
        "dtype": config.dtype,
        "K": k,
        "torch_decoding": config.model.decoding,  # Always the same as cpbjax's.
        "cpbjax_s_per_epoch": cpbjax_epoch_s,
        "torch_best_threads": best_threads,
        "ratio": medians[best_threads] * k / cpbjax_epoch_s,
        "alternated": _alternation(alternated, torch_s),
    }
    for threads, seconds in medians.items():
        row[f"torch_{threads}t_s"] = seconds
        row[f"torch_{threads}t_n"] = len(torch_s[threads])
    return row
