"""The plan of a run: which coins train, grouped how, on which mesh, and what is kept.

Every mode builds one `Plan` from its config and prepared data (a train run here,
`for_train`; a backtest in cpbjax/modes/backtest.py, a sweep in cpbjax/modes/sweep.py, both with
`chunked` or `of_groups`), and cpbjax/modes/driver.py walks it group by group. A coin is one
PreparedSeries: a series, a backtest fold or a sweep setting of a series. A group of up
to K coins trains as one compiled program (cpbjax/training/group.py); with train.share=pooled a
group is ONE model over its coins, their train and val windows purged across series
(cpbjax/data/pooling.py). The plan holds the run's `sharing.Sharing`, chosen here once
from train.share, for the driver and the programs it builds.
"""

from __future__ import annotations

import dataclasses
import itertools

from jax.sharding import Mesh

from cpbjax import config_rules as rules
from cpbjax import sharding
from cpbjax.data import pooling, sources, split_dates, stacking, windows
from cpbjax.report.runlog import StageClock
from cpbjax.training import sharing as sharing_lib

MAX_GROUP_SIZE = 64  # train.group_size=0 puts up to this many series in one program ...
# ... except on CPU devices, where a coin's step is fastest while the group's working set
# stays in cache: 4 coins per device (docs/performance.md, "Group size on the CPU").
CPU_COINS_PER_DEVICE = 4


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run trains; cpbjax/modes/driver.py walks `groups` in order."""

    groups: tuple  # tuples of PreparedSeries, each group's coins (empty: nothing to train)
    group_coins: int  # K of every group's program (a multiple of the mesh's devices)
    mesh: Mesh | None  # the coin mesh over every device; None when there is nothing to train
    t_max: int  # T, the padded length of the coins (stacking.padded_length)
    index: dict  # series name -> its position in config.data: its coin key's fold-in
    sharing: sharing_lib.Sharing  # what train.share decides (one model or one per coin)
    skipped: dict = dataclasses.field(default_factory=dict)  # name -> why it does not train
    # False for backtest folds: no model is saved, the test forecasts always are (the
    # backtest pools them), so a backtest never writes a series' model.
    keep_models: bool = True
    # --mode ablate: each scored coin's per-window MAE is saved (saved.save_window_mae).
    keep_window_mae: bool = False
    # train.share=pooled: coin name -> the train and val ends the pooled model learns
    # from (data/pooling.py), in place of the coin's own; None in any other run.
    pool_ends: dict | None = None
    # Ledger fingerprint entries of the mode (a backtest's fold settings, a sweep's grid).
    extra_print: dict = dataclasses.field(default_factory=dict)

    @property
    def coins(self) -> list:
        return [p for g in self.groups for p in g]

    def group_names(self) -> list[list[str]]:
        return [[p.name for p in g] for g in self.groups]

    def facts(self, config) -> dict:
        """The plan's part of a results file's "run" block."""
        return {
            "groups": len(self.groups),
            "group_size": max((len(g) for g in self.groups), default=0),
            "share": self.sharing.name,
        }

    def training_view(self, preps: list) -> list:
        """The preps as the programs train on them: with `pool_ends`, each coin's train
        and val windows purged across series; evaluation still scores all its windows."""
        if self.pool_ends is None:
            return preps
        return [dataclasses.replace(p, ends={**p.ends, **self.pool_ends[p.name]}) for p in preps]

    def pool_windows(self) -> dict:
        """The fingerprint's purged window counts of a pooled run, so a run checkpointed
        before the purge (or with other data) is refused instead of resumed; {} otherwise."""
        if self.pool_ends is None:
            return {}
        ends = self.pool_ends.items()
        return {"pool_windows": {n: [len(e["train"]), len(e["val"])] for n, e in ends}}


def group_size(num_series: int, train_cfg, num_devices: int, backend: str) -> int:
    """Coins per program, a multiple of the device count so the coin axis shards evenly.

    train.group_size if set, else as many as fit: up to 64 on accelerators and
    CPU_COINS_PER_DEVICE per device on the CPU backend; never more than the series
    (rounded up to the device count).
    """
    if sharing_lib.from_config(train_cfg).one_group:
        return pooled_group_size(num_series, train_cfg, num_devices)
    fit = CPU_COINS_PER_DEVICE * num_devices if backend == "cpu" else MAX_GROUP_SIZE
    k = min(train_cfg.group_size or fit, num_series)
    return -(-k // num_devices) * num_devices


def pooled_group_size(num_series: int, train_cfg, num_devices: int) -> int:
    """train.share=pooled: every series in one group (one model), rounded up to the device
    count, as each device trains on its share of the coins (cpbjax/training/pooled.py).

    Raises:
      ConfigError: a train.group_size that would split the series.
    """
    rules.check(
        train_cfg.group_size == 0 or train_cfg.group_size >= num_series,
        "train.group_size",
        train_cfg.group_size,
        f"0 or at least the run's {num_series} series with train.share='pooled' (one "
        "model trains on all of them in one group)",
    )
    return -(-num_series // num_devices) * num_devices


def prepare_all(config, clock: StageClock | None = None, keep_train_only=False):
    """Loads and prepares every series; returns (PreparedSeries list, name -> skip reason).
    keep_train_only: keep training-data-only series (`windows.prepare_all`)."""
    clock = clock or StageClock()
    with clock.stage("load"):
        series, skipped = sources.load_all(config.data)
    with clock.stage("prepare"):
        preps, unusable = windows.prepare_all(series, config.data, keep_train_only=keep_train_only)
    return preps, {**skipped, **unusable}


def _series_index(config) -> dict:
    pairs = itertools.product(config.data.symbols, config.data.intervals)
    return {f"{s}-{i}": j for j, (s, i) in enumerate(pairs)}


def of_groups(config, groups: list, **fields) -> Plan:
    """The plan training `groups` (lists of PreparedSeries) as given, K fitted to the
    largest; `fields`: the other Plan fields (skipped, keep_models, pool_ends, extra_print).

    Raises:
      ConfigError: a train.group_size a pooled run cannot have (`pooled_group_size`).
    """
    groups = tuple(tuple(g) for g in groups)
    index, shared = _series_index(config), sharing_lib.from_config(config.train)
    if not any(groups):  # nothing to train: no mesh to build
        return Plan((), 0, None, 0, index, shared, **fields)
    mesh = sharding.coin_mesh()
    backend = mesh.devices.flat[0].platform
    k = group_size(max(len(g) for g in groups), config.train, mesh.size, backend)
    t_max = stacking.padded_length([p for g in groups for p in g], config.data)
    return Plan(groups, k, mesh, t_max, index, shared, **fields)


def chunked(config, coins: list, **fields) -> Plan:
    """The plan training `coins` in order, in groups of `group_size` coins; `fields` as
    `of_groups`'."""
    if not coins:
        return of_groups(config, [], **fields)
    mesh = sharding.coin_mesh()
    k = group_size(len(coins), config.train, mesh.size, mesh.devices.flat[0].platform)
    return of_groups(config, [coins[i : i + k] for i in range(0, len(coins), k)], **fields)


def for_train(config, clock: StageClock) -> Plan:
    """A train run's plan: every series in chunks of group_size, or with
    train.share=pooled one group of the series that keep purged windows, training-data-only
    series among them (data.split_dates: trained on, never scored; listed as skipped)."""
    if not sharing_lib.from_config(config.train).pools_windows:
        preps, skipped = prepare_all(config, clock)
        return chunked(config, preps, skipped=skipped)
    preps, skipped = prepare_all(config, clock, keep_train_only=True)
    preps, pool, emptied = pooling.pooled_series(preps, config.data)
    train_only = {
        p.name: p.notes[split_dates.TRAIN_ONLY] for p in preps if split_dates.is_train_only(p)
    }
    return chunked(config, preps, skipped={**skipped, **emptied, **train_only}, pool_ends=pool)
