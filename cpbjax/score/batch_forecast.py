"""Forecasts of many series' windows at once: every series that shares one model's params
(a pooled run's global model) is forecast in large jitted batches that mix series.

Scoring (cpbjax/score/evaluate.py) asks for the windows of many (params, series, ends)
jobs. Jobs whose params are equal (bit for bit) form one group. A group spanning two or
more series is forecast together: its series' inputs are concatenated into one
device-resident source (at most SOURCE_CANDLES candles; a longer group takes several),
each window's end is offset into it, and batches of up to EVAL_BATCH windows (CPU_BATCH
on the CPU) gather their windows on the device (stacking.gather_inputs, the arithmetic
of the host's gather) and apply the model in one jitted call. Only the [N] ends travel
per batch, and the device holds one source and one batch of windows (EVAL_BATCH x L x F
floats), never all windows.
A group of one series of a per-series run is forecast as before, series by series
(forecast.predict_windows), side by side in threads; a pooled run's is batched too.

Each window's forecast is independent of the others in its batch; on the CPU, XLA's
rounding depends on the batch size only below 64 windows for the global MLP (256 for a
GRU, 512 for the transformer), so a pooled split that was forecast in such a small batch
may move by float32 rounding.
Shapes (docs/design.md): T candles, F features, N windows, L lookback, H horizon, C columns.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
from typing import NamedTuple

import jax
import numpy as np

from cpbjax import columns, process_pool
from cpbjax.data import stacking
from cpbjax.data.windows import PreparedSeries
from cpbjax.score import forecast

# Windows of one batch on an accelerator, and on the CPU (where 8192 ran 2.5x slower than
# 1024: 256-wide activations of 8192 windows overflow its caches; measured on the 2-core
# CPU, loaded, 2026-11-28). Batches are padded to a power of two up to it, so a run
# compiles a few programs.
EVAL_BATCH = 8192
CPU_BATCH = 1024
# Candles of one device-resident source (2^21 x 30 features x 4 bytes = 250 MB); its
# length is padded to a power of two, so sources share programs.
SOURCE_CANDLES = 1 << 21
# Single-series groups forecast side by side: their jitted calls release the GIL.
FORECAST_THREADS = process_pool.threads()


class Job(NamedTuple):
    """The windows of one series to forecast with one model's params."""

    params: dict
    prep: PreparedSeries
    ends_N: np.ndarray  # int window end indices into prep


def forecast_jobs(
    module, jobs: list[Job], lookback: int, horizon: int, pooled: bool = False
) -> list[np.ndarray]:
    """Deterministic normalised forecasts of every job's windows (module applied with
    train=False), float32 [N, H, C] each, in the order of `jobs`. `pooled` (a pooled
    run's models, EvalSpec.pooled): a series alone in its group is batched too (a long one
    may fill a wave of scoring by itself; its params differ in its own band refit after
    --mode evaluate loads it)."""
    out: list = [None] * len(jobs)
    singles = []
    for members in _groups_by_params(jobs).values():
        if not pooled and len({id(jobs[i].prep) for i in members}) < 2:
            singles += members
            continue
        group = [jobs[i] for i in members]
        norms = _forecast_group(module, group, lookback, horizon)
        for i, norm in zip(members, norms, strict=True):
            out[i] = norm

    def single(i):
        job = jobs[i]
        return forecast.predict_windows(module, job.params, job.prep, job.ends_N, lookback, horizon)

    with concurrent.futures.ThreadPoolExecutor(FORECAST_THREADS) as pool:
        for i, norm in zip(singles, pool.map(single, singles), strict=True):
            out[i] = norm
    return out


def params_key(params) -> str:
    """A digest of params' tree and every leaf's dtype, shape and bytes: equal exactly when
    the params forecast the same."""
    leaves, treedef = jax.tree.flatten(params)
    digest = hashlib.blake2b(str(treedef).encode(), digest_size=16)
    for leaf in leaves:
        a = np.ascontiguousarray(leaf)
        digest.update(f"{a.dtype}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def _groups_by_params(jobs: list[Job]) -> dict:
    """params_key -> the indices of the jobs with those params, in order."""
    groups: dict = {}
    keys: dict = {}  # id(params) -> key: the splits of one series share one params object
    for i, job in enumerate(jobs):
        if id(job.params) not in keys:
            keys[id(job.params)] = params_key(job.params)
        key = keys[id(job.params)]
        groups.setdefault(key, []).append(i)
    return groups


def _forecast_group(module, group: list[Job], lookback: int, horizon: int) -> list[np.ndarray]:
    """The forecasts of jobs that share params, one source of series at a time."""
    params = jax.device_put(group[0].params)
    out = []
    for chunk in _source_chunks(group):
        source, offsets = _source(chunk)
        ends = [offsets[id(job.prep)] + np.asarray(job.ends_N, np.int64) for job in chunk]
        all_ends = np.concatenate(ends)
        norm = _predict_gathered(module, params, source, all_ends, lookback, horizon)
        out += np.split(norm, np.cumsum([len(e) for e in ends])[:-1])
    return out


def _source_chunks(group: list[Job]) -> list[list[Job]]:
    """The group's jobs in runs whose distinct series hold at most SOURCE_CANDLES
    candles together (a longer series alone)."""
    chunks, seen, candles = [], set(), 0
    for job in group:
        new = id(job.prep) not in seen
        if chunks and new and candles + len(job.prep.inputs) > SOURCE_CANDLES:
            chunks.append([])
            seen, candles = set(), 0
        if not chunks:
            chunks.append([])
        if new:
            seen.add(id(job.prep))
            candles += len(job.prep.inputs)
        chunks[-1].append(job)
    return chunks


def _source(chunk: list[Job]) -> tuple[stacking.WindowSource, dict]:
    """(the chunk's series concatenated on the device, id(prep) -> its first candle's
    index there). Zero candles pad the length to a power of two; no window reads them."""
    preps = list({id(job.prep): job.prep for job in chunk}.values())
    lengths = [len(p.inputs) for p in preps]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    padded = 1 << max(sum(lengths) - 1, 0).bit_length()
    inputs_TF = np.zeros((padded, preps[0].inputs.shape[1]), np.float32)
    anchor_T = np.zeros(padded, np.float32)
    for p, start, n in zip(preps, starts, lengths, strict=True):
        inputs_TF[start : start + n] = p.inputs
        anchor_T[start : start + n] = p.anchor
    price_mask_F = np.asarray(preps[0].price_mask, np.float32)
    source = stacking.WindowSource(inputs_TF, None, anchor_T, price_mask_F)
    offsets = {id(p): int(start) for p, start in zip(preps, starts, strict=True)}
    return jax.device_put(source), offsets


def _predict_gathered(module, params, source, ends_N, lookback: int, horizon: int):
    """float32 [N, H, C] forecasts of the windows of `source` ending at ends_N, in batches
    of a power of two up to EVAL_BATCH (CPU_BATCH on the CPU), padded with the first end;
    every batch is dispatched before the first result is read, so the device never waits
    on the host."""
    n = len(ends_N)
    if n == 0:
        return np.zeros((0, horizon, columns.NUM_TARGETS), np.float32)
    limit = CPU_BATCH if jax.default_backend() == "cpu" else EVAL_BATCH
    b = min(limit, 1 << max(n - 1, 0).bit_length())
    padded = np.concatenate([ends_N, np.full(-n % b, ends_N[0])]).astype(np.int32)
    outs = [
        _forecast_gathered(module, params, source, padded[i : i + b], lookback)
        for i in range(0, len(padded), b)
    ]
    return np.concatenate([np.asarray(o) for o in outs])[:n].astype(np.float32)


@functools.partial(jax.jit, static_argnames=("module", "lookback"))
def _forecast_gathered(module, params, source, ends_B, lookback):
    x_BLF = stacking.gather_inputs(source, ends_B, lookback)
    return module.apply({"params": params}, x_BLF, None, train=False)
