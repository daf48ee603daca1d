"""The run driver: plan the groups, train each one (or resume it), finish it, write the workdir.

A group of up to K series trains as one compiled program (cpbjax/group.py over the pure
step functions of cpbjax/step.py). The driver only sequences the groups: it restores or
initialises a group's state, runs epochs until every coin has stopped (moving live coins
to smaller programs, cpbjax/compaction.py), checkpoints, saves each series' best model,
scores it (cpbjax/evaluate.py) and records the group in the resume ledger
(cpbjax/ledger.py). Rerunning with the same workdir resumes: finished groups are skipped
and an unfinished one continues from its latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh

from cpbjax import (
    checkpoint,
    evaluate,
    forecast,
    memory,
    metrics,
    models,
    platform,
    report,
    sharding,
    writers,
)
from cpbjax import config as config_lib
from cpbjax import config_rules as rules
from cpbjax import workdir as workdir_lib
from cpbjax.compaction import LiveCoins
from cpbjax.data import pooling, sources, stacking, windows
from cpbjax.group import GroupTrainer, coin_keys
from cpbjax.ledger import Ledger, fingerprint
from cpbjax.plot_workers import PlotWorkers
from cpbjax.runlog import RunLog, StageClock
from cpbjax.step import GroupState


class NothingTrained(RuntimeError):
    """Every series was skipped; results.json lists each reason."""


MAX_GROUP_SIZE = 64  # train.group_size=0 puts up to this many series in one program ...
# ... except on CPU devices, where a coin's step is fastest while the group's working set
# stays in cache: 4 coins per device (docs/performance.md, "Group size on the CPU").
CPU_COINS_PER_DEVICE = 4


def group_size(num_series: int, train_cfg, num_devices: int, backend: str) -> int:
    """Coins per program, a multiple of the device count so the coin axis shards evenly.

    train.group_size if set, else as many as fit: up to 64 on accelerators and
    CPU_COINS_PER_DEVICE per device on the CPU backend; never more than the series
    (rounded up to the device count).
    """
    if train_cfg.share == "pooled":
        return pooled_group_size(num_series, train_cfg)
    fit = CPU_COINS_PER_DEVICE * num_devices if backend == "cpu" else MAX_GROUP_SIZE
    k = min(train_cfg.group_size or fit, num_series)
    return -(-k // num_devices) * num_devices


def pooled_group_size(num_series: int, train_cfg) -> int:
    """train.share=pooled: every series in one group (one model; its mesh is one device,
    `coin_mesh`).

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
    return num_series


def coin_mesh(train_cfg) -> Mesh:
    """The run's coin mesh: every device, or one for a pooled model, whose gradient is
    not split across devices (cpbjax/pooled.py).

    Raises:
      ConfigError: train.share=pooled in a multi-host run.
    """
    if train_cfg.share == "series":
        return sharding.coin_mesh()
    rules.check(
        jax.process_count() == 1,
        "train.share",
        train_cfg.share,
        "'series' in a multi-host run (a pooled model trains on one device)",
    )
    return sharding.coin_mesh(jax.local_devices()[:1])


def prepare_all(config, clock: StageClock | None = None) -> tuple[list, dict]:
    """Loads and prepares every series; returns (PreparedSeries list, name -> skip reason)."""
    clock = clock or StageClock()
    with clock.stage("load"):
        series, skipped = sources.load_all(config.data)
    with clock.stage("prepare"):
        preps, unusable = windows.prepare_all(
            series, config.data, aux_targets=config.model.aux_targets
        )
    return preps, {**skipped, **unusable}


@dataclasses.dataclass
class _Run:
    """What every group of one run shares."""

    config: object
    workdir: str
    module: object
    mesh: Mesh
    ledger: Ledger
    log: RunLog
    clock: StageClock  # the run's stage timings (timings.json)
    index: dict  # series name -> position in the run (its key's fold-in index)
    group_coins: int  # K of the run's groups
    t_max: int  # T, the padded length of the run's series (stacking.padded_length)
    # False for backtest folds: no model is saved, the test forecasts always are (the
    # backtest pools them), so a backtest never writes a series' model.
    keep_models: bool = True
    # train.share=pooled: series name -> the train and val ends the pooled model learns
    # from (data/pooling.py), in place of the series' own; None in any other run.
    pool_ends: dict | None = None
    trainers: dict = dataclasses.field(default_factory=dict)  # K -> GroupTrainer

    def trainer_for(self, num_coins: int) -> GroupTrainer:
        """The run's trainer for programs of `num_coins` coins (each size compiles once)."""
        if num_coins not in self.trainers:
            self.trainers[num_coins] = GroupTrainer(
                self.config, self.module, num_coins, self.mesh, self.t_max
            )
        return self.trainers[num_coins]

    def training_view(self, preps: list) -> list:
        """The preps as the programs train on them: with `pool_ends`, each series' train
        and val windows purged across series; evaluation still scores all its windows."""
        if self.pool_ends is None:
            return preps
        return [dataclasses.replace(p, ends={**p.ends, **self.pool_ends[p.name]}) for p in preps]

    def checkpoints(self, group: str) -> checkpoint.GroupCheckpoints:
        c = self.config.ckpt
        path = workdir_lib.group_checkpoints(self.workdir, group)
        return checkpoint.GroupCheckpoints(path, c.every_epochs, c.keep)


def _epoch_record(group: str, names: list[str], m: dict, seconds: float, coins: int) -> dict:
    """One metrics.jsonl line from the host copy of `run_epoch`'s metrics (real coins only)."""
    n = len(names)
    return {
        "group": group,
        "epoch": int(m["epoch"]),
        "series": names,
        "train_loss": m["train_loss"][:n],
        "val_loss": m["val_loss"][:n],
        "best_val_loss": m["best_val_loss"][:n],
        "improved": m["improved"][:n],
        "lr": float(m["lr"]),
        "active": m["active"][:n],
        "seconds": seconds,
        "coins_computed": coins,
    }


def _log_divergence(names: list[str], m: dict, before: np.ndarray) -> np.ndarray:
    """Warns for each series that diverged in the epoch just run; returns who has diverged.

    Args:
      names: the group's series. m: host metrics of the epoch. before: bool [K], the
        coins that had diverged before it.
    """
    now = np.asarray(m["diverged"], bool)
    for i in np.flatnonzero(now[: len(names)] & ~before[: len(names)]):
        logging.warning(
            "%s diverged in epoch %d (a non-finite loss or gradient): it stops with its best "
            "params so far",
            names[i],
            int(m["epoch"]),
        )
    return now


def _run_epochs(run: _Run, group: str, preps: list, state, arrays, start: int):
    """Runs epochs until every coin stopped or train.epochs; checkpoints as configured.

    Returns:
      (final state, training seconds, peak device memory bytes or None).
    """
    t = run.config.train
    names = [p.name for p in preps]
    ckpts = run.checkpoints(group)
    run.log.start_group(group, len(names), t.epochs, start)
    began = time.monotonic()
    live = LiveCoins(run.trainer_for, preps, state, arrays)
    first_s, steady_s = [], []  # each program's first epoch (with its compile); the others
    host = sharding.to_host({"active": state.active, "diverged": state.diverged})
    finished = start >= t.epochs or not host["active"].any()
    diverged = np.asarray(host["diverged"], bool)
    if not finished:
        _check_memory(run, group, state, arrays)
    while not finished:
        computed = live.trainer.num_coins
        m = live.run_epoch()
        (first_s if len(live.epoch_seconds) == 1 else steady_s).append(live.epoch_seconds[-1])
        record = _epoch_record(group, names, m, live.epoch_seconds[-1], computed)
        if t.reduce_on_plateau:
            record["lr_scale"] = m["lr_scale"][: len(names)]
        if t.get("min_delta_mode") == "se":
            record["val_gain_se"] = m["val_gain_se"][: len(names)]
        if t.share == "pooled":  # what its early stopping judged (coin 0 is always real)
            record["pooled_val_loss"] = m["stop_val_loss"][0]
        run.log.epoch(writers.to_jsonable(record), sharding.memory_bytes()[0])
        diverged = _log_divergence(names, m, diverged)
        finished = record["epoch"] >= t.epochs or not m["active"].any()
        if ckpts.due(record["epoch"], force=finished):  # All processes save.
            ckpts.maybe_save(record["epoch"], live.full_state(), force=finished)
        # A pooled group is one model: its coins stop together, nothing to compact.
        if t.compact_groups and t.share == "series" and not finished:
            live.maybe_compact(m, t.patience, t.epochs)
    ckpts.close()
    run.log.end_group()
    seconds = time.monotonic() - began
    run.clock.add_epochs(first_s, steady_s, seconds)
    return live.full_state(), seconds, sharding.memory_bytes()[1]


def _check_memory(run: _Run, group: str, state, arrays) -> None:
    """Compiles the group's epoch program before its first epoch, which then reuses it,
    and stops the run with one line if the program cannot fit (cpbjax/memory.py). Once
    per program size: every group of the run has the same shapes."""
    trainer = run.trainer_for(run.group_coins)
    if trainer.num_coins in run.clock.epoch_needs:
        return
    with run.clock.stage("compile"):
        compiled = trainer.lowered_epoch(state, arrays).compile()
    local = [d for d in trainer.mesh.devices.flat if d.process_index == jax.process_index()]
    need = memory.epoch_need(compiled, len(local))
    run.clock.epoch_needs[trainer.num_coins] = need
    if need is None:
        return
    backend = jax.default_backend()
    capacity = memory.host_memory() if backend == "cpu" else memory.device_memory(local)
    fix = memory.remedy(run.config.train, trainer.num_coins)
    memory.check(group, need, backend, capacity, fix)


def _start_state(run: _Run, group: str, preps: list, arrays) -> tuple[GroupState, int]:
    """The group's latest checkpoint and its epoch, or a fresh state and 0."""
    trainer = run.trainer_for(run.group_coins)
    ckpts = run.checkpoints(group)
    restored = ckpts.restore_latest(trainer.abstract_state())
    ckpts.close()
    if restored is not None:
        logging.info("%s: resuming after epoch %d", group, restored[1])
        return restored
    pad = [len(run.index) + i for i in range(trainer.num_coins - len(preps))]
    # A backtest fold's or sweep setting's coin gets its series' key (its symbol-interval
    # name): every fold and setting starts as the series would.
    series = [run.index[f"{p.symbol}-{p.interval}"] for p in preps]
    keys = coin_keys(run.config.seed, series + pad)
    return trainer.init_state(keys, arrays), 0


def _train_group(run: _Run, group: str, preps: list) -> tuple[dict, dict]:
    """Trains one group from scratch or from its latest checkpoint and finishes it.

    Returns:
      (series name -> results.json entry, series name -> test forecast record).
    """
    with run.clock.stage("setup"):
        # The windows the programs train on; compaction restacks from the same view.
        training = run.training_view(preps)
        arrays = run.trainer_for(run.group_coins).stack(training)
        state, start = _start_state(run, group, preps, arrays)
    state, seconds, peak = _run_epochs(run, group, training, state, arrays, start)
    return _finish_group(run, group, preps, state, seconds, peak)


def _status(active: bool, diverged: bool) -> str:
    return "diverged" if diverged else ("trained" if active else "stopped_early")


def _model_meta(run: _Run, prep, entry: dict) -> dict:
    """meta.json of a saved series model: enough to rebuild the module and map prices."""
    return {
        "series": prep.name,
        "symbol": prep.symbol,
        "interval": prep.interval,
        "model": dataclasses.asdict(models.make_config(run.config)),
        "config": run.config.to_dict(),
        "data": run.config.data.to_dict(),
        "norm": prep.norm,
        "price_mask": prep.price_mask,
        **{k: entry[k] for k in ("num_params", "status", "best_epoch", "best_val_loss")},
    }


def _series_entry(host: dict, i: int, group: str, seconds: float, num_series: int) -> dict:
    """The training part of one series' results.json entry, from the group's host state."""
    return {
        "status": _status(host["active"][i], host["diverged"][i]),
        "best_val_loss": host["best_val"][i],
        "best_epoch": int(host["best_epoch"][i]) or None,
        "epochs_run": int(host["epochs_run"][i]),
        "diverged_epoch": int(host["diverged_epoch"][i]) or None,
        "group": group,
        "train_seconds": seconds / num_series,
        "group_train_seconds": seconds,
    }


# A val loss this many times the zero forecast's marks a model worse than no training.
WORSE_THAN_UNTRAINED = 10.0


def _flag_worse_than_untrained(run: _Run, prep, entry: dict, last_params) -> None:
    """Adds a `warning` to a scored entry whose training went far above the zero forecast.

    Without a baseline that is the kept model's val loss. With one (model.baseline) an
    epoch is kept only if it beats the untrained model, so a run that went wrong keeps
    the baseline (best_epoch None); the warning then looks at the last epoch's params.
    """
    val = entry.get("val") or {}
    loss, zero = val.get("normalized_mse"), val.get("zero_forecast_mse")
    if loss is None or not zero:
        return
    kept = "the kept model"
    if run.config.model.baseline != "none" and entry["best_epoch"] is None:
        spec = evaluate.make_spec(run.config)
        fc = forecast.split_forecast(run.module, last_params, prep, "val", spec)
        loss = metrics.normalized_mse(prep, fc.ends_N, fc.norm_NHC, spec.horizon)
        kept = "the last epoch (the untrained baseline is kept)"
    if loss <= WORSE_THAN_UNTRAINED * zero:
        return
    entry["warning"] = (
        f"val loss {loss:.3g} of {kept} is {loss / zero:.3g}x the zero forecast's {zero:.3g}: "
        "the model learned something worse than not training (check train.learning_rate)"
    )
    logging.warning("%s: %s", prep.name, entry["warning"])


def _save_and_score(run: _Run, prep, params, last_params, entry: dict) -> dict | None:
    """Scores one series' best model, adds its val/test metrics to `entry` and saves it
    with its interval calibration (process 0).

    `last_params` (the last epoch's; None without model.baseline) only feed the warning
    of `_flag_worse_than_untrained`.
    Returns its test forecast record (None when the normalisation keeps no price level).
    """
    c = run.config
    forecasts_dir = run.workdir if c.eval.save_forecasts or not run.keep_models else None
    spec = evaluate.make_spec(c)
    scored = evaluate.evaluate_model(run.module, params, prep, spec, forecasts_dir)
    entry.update(scored.entry)
    _flag_worse_than_untrained(run, prep, entry, last_params)
    if run.keep_models:
        model_dir = workdir_lib.series_model(run.workdir, prep.name)
        meta = _model_meta(run, prep, entry)
        if scored.calibration is not None:
            meta["interval_calibration"] = scored.calibration
        # The model test scored: with eval.refit_band, its band refit on train+val.
        checkpoint.save_series_model(model_dir, scored.params, meta)
    return scored.record


def _finish_group(run: _Run, group: str, preps: list, state: GroupState, seconds, peak):
    """Saves each series' best model, evaluates it and records the group as finished.

    Returns:
      (series name -> results.json entry (without evaluation on processes other than
      0), series name -> test forecast record).
    """
    fields = ("best_params", "best_val", "best_epoch", "epochs_run", "active", "diverged")
    # The last params only serve the warning on a run that kept its untrained baseline.
    last = ("params",) if run.config.model.baseline != "none" else ()
    host = sharding.to_host({f: getattr(state, f) for f in (*fields, *last, "diverged_epoch")})
    leaves = jax.tree.leaves(host["best_params"])
    num_params = sum(leaf.size for leaf in leaves) // len(host["active"])
    entries, records = {}, {}
    for i, prep in enumerate(preps):
        params = jax.tree.map(lambda a, i=i: a[i], host["best_params"])
        entry = _series_entry(host, i, group, seconds, len(preps))
        entry.update(num_params=num_params, peak_memory_bytes=peak, data=prep.notes)
        if sharding.is_primary():
            with run.clock.stage("evaluate"):
                last_params = host.get("params")
                if last_params is not None:
                    last_params = jax.tree.map(lambda a, i=i: a[i], last_params)
                record = _save_and_score(run, prep, params, last_params, entry)
            if record is not None:
                records[prep.name] = record
        entries[prep.name] = writers.to_jsonable(entry)
    run.ledger.finish(group, entries)
    sharding.barrier(f"cpbjax {group} finished")
    return entries, records


def _reload_forecasts(run: _Run, preps: list) -> dict:
    """Test forecast records of a group finished by an earlier process: for the plots, and
    saved to forecasts/ when eval.save_forecasts asks for files that are missing."""
    c = run.config
    plots = c.eval.plots and c.eval.plot_windows and c.data.normalization != "candle_minmax"
    if not ((plots or c.eval.save_forecasts) and sharding.is_primary()):
        return {}
    records = {}
    for prep in preps:
        model_dir = workdir_lib.series_model(run.workdir, prep.name)
        try:
            params, meta = checkpoint.load_series_model(model_dir)
        except (OSError, ValueError) as e:  # its results stand; only its forecasts are lost
            logging.warning(
                "%s: no test forecasts: its saved model is unreadable (%s)", prep.name, e
            )
            continue
        spec = evaluate.make_spec(c)
        fc = forecast.split_forecast(run.module, params, prep, "test", spec)
        if fc.prices_NHC is None:
            continue
        levels, calibration = forecast.quantile_levels(run.module), meta.get("interval_calibration")
        records[prep.name] = forecast.forecast_record(prep, fc, spec, levels, calibration)
        if c.eval.save_forecasts:
            forecast.save_forecasts(run.workdir, records[prep.name])
    return records


def _plot_workers(config, workdir: str) -> PlotWorkers | None:
    """The pool drawing each group's plots while the next one trains (process 0, when
    eval.plots and eval.plot_workers ask for it), else None: plots drawn at the end."""
    if not (config.eval.plots and config.eval.plot_workers and sharding.is_primary()):
        return None
    folder = workdir_lib.plots_dir(workdir, "report")
    return PlotWorkers(folder, config, config.eval.plot_workers)


def _submit_plots(workers, workdir: str, group: str, entries: dict, records: dict) -> None:
    """Hands a finished group's series, their loss history and forecasts to the plot pool."""
    if workers is None:
        return
    history = [r for r in writers.MetricsLog(workdir).records() if r.get("group") == group]
    workers.submit(entries, history, records)


def _results(config, entries: dict, skipped: dict, started: float, plan: list) -> dict:
    """The results.json dict. `run.wall_seconds` counts this process only (not resumed parts)."""
    run = run_facts(config, started, plan)
    return writers.to_jsonable({"run": run, "series": entries, "skipped": skipped})


def run_facts(config, started: float, plan: list) -> dict:
    """The "run" block of results.json (and backtest.json): model, versions, devices, groups."""
    devices = platform.describe_devices()
    run = {
        "model": config.model.name,
        "seed": config.seed,
        "versions": platform.versions(),
        "platform": devices["backend"],
        "device_count": devices["device_count"],
        "process_count": devices["process_count"],
        "devices": devices["devices"],
        "groups": len(plan),
        "group_size": max((len(g) for g in plan), default=0),
        "share": config.train.share,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_seconds": time.time() - started,
    }
    return run


def _make_run(
    config,
    workdir: str,
    preps: list,
    mesh: Mesh,
    clock,
    keep_models=True,
    extra_print=None,
    pool_ends=None,
    plan=None,
) -> tuple[_Run, list]:
    """Builds the shared context of a run and its plan (a list of groups of PreparedSeries).

    A pooled run's fingerprint holds its purged window counts, so a run checkpointed
    before the purge (or with other data) is refused instead of resumed.

    Raises:
      RunMismatch: the workdir's ledger belongs to another run.
    """
    platform = mesh.devices.flat[0].platform
    if plan is None:
        k = group_size(len(preps), config.train, mesh.size, platform)
        plan = [preps[i : i + k] for i in range(0, len(preps), k)]
    else:
        k = group_size(max(len(g) for g in plan), config.train, mesh.size, platform)
    t_max = stacking.padded_length(preps, config.data)
    pairs = itertools.product(config.data.symbols, config.data.intervals)
    run_print = fingerprint(config, [[p.name for p in g] for g in plan], t_max)
    if pool_ends is not None:
        run_print["pool_windows"] = {
            n: [len(e["train"]), len(e["val"])] for n, e in pool_ends.items()
        }
    run = _Run(
        config=config,
        workdir=workdir,
        module=models.build(models.make_config(config)),
        mesh=mesh,
        ledger=Ledger(workdir, {**run_print, **(extra_print or {})}),
        log=RunLog(workdir, config.logging, sharding.is_primary()),
        clock=clock,
        index={f"{s}-{i}": j for j, (s, i) in enumerate(pairs)},
        group_coins=k,
        t_max=t_max,
        keep_models=keep_models,
        pool_ends=pool_ends,
    )
    return run, plan


def train_groups(
    config,
    workdir: str,
    preps: list,
    clock,
    keep_models=True,
    extra_print=None,
    workers=None,
    pool_ends=None,
    plan=None,
):
    """Trains, or resumes, every group of `preps` in `workdir`; writes its config.json.

    Args:
      config: the validated run config. workdir: the run folder (checkpoints/, metrics.jsonl).
      preps: the PreparedSeries to train as coins (series, or backtest folds).
      clock: the run's StageClock.
      keep_models: False for backtest folds (see `_Run.keep_models`).
      extra_print: entries added to the ledger fingerprint (a backtest's fold settings).
      workers: the PlotWorkers drawing each finished group's plots, or None.
      pool_ends: a pooled run's purged train and val ends (`data.pooling.pool_ends`).
      plan: the groups (lists of `preps`) when the caller plans them (a pooled backtest
        trains one group per fold); default: `preps` in chunks of `group_size`.

    Returns:
      (name -> results entry, name -> test forecast record, the plan: lists of preps).

    Raises:
      RunMismatch: the workdir's ledger belongs to another run.
    """
    mesh = coin_mesh(config.train)
    run, plan = _make_run(
        config, workdir, preps, mesh, clock, keep_models, extra_print, pool_ends, plan
    )
    if sharding.is_primary():
        writers.write_config(workdir, config)
    entries, records = {}, {}
    try:
        for g, group_preps in enumerate(plan):
            group = f"group-{g:03d}"
            finished = run.ledger.finished(group)
            if finished is None:
                finished, group_records = _train_group(run, group, group_preps)
            else:
                logging.info("%s already finished in %s; skipping it", group, workdir)
                with run.clock.stage("evaluate"):
                    group_records = _reload_forecasts(run, group_preps) if keep_models else {}
            entries.update(finished)
            records.update(group_records)
            _submit_plots(workers, workdir, group, finished, group_records)
    finally:
        run.log.close()
    return entries, records, plan


def train_and_evaluate(config, workdir: str) -> dict:
    """Trains every series of `config` group by group, evaluates it, and writes the workdir.

    Writes config.json, metrics.jsonl, checkpoints/, models/<SERIES>/, results.json
    and the report. Rerunning with the same workdir resumes: finished groups are
    skipped and an unfinished one continues from its latest checkpoint.

    In a multi-host run (config.distributed) every process runs this with the same
    config and a workdir on a shared filesystem: the coin axis is sharded over all
    processes' devices, every process saves its shards of the group checkpoints, and
    process 0 alone writes the other files and evaluates.

    Args:
      config: the run config (validated here again).
      workdir: the run folder; created if missing.

    Returns:
      The results dict written to results.json.

    Raises:
      ConfigError: a bad config value. RunMismatch: the workdir holds a different run.
      NothingTrained: every series was skipped (results.json still lists why).
    """
    # -- prepare the data and the run ---------------------------------------------------
    config_lib.validate(config)
    started = time.time()
    primary = sharding.is_primary()
    os.makedirs(workdir, exist_ok=True)
    clock = StageClock()
    preps, skipped = prepare_all(config, clock)
    pool = None
    if config.train.share == "pooled":
        preps, pool, emptied = pooling.pooled_series(preps, config.data)
        skipped = {**skipped, **emptied}
    if not preps:
        # A workdir that already holds a run keeps its files: a failing rerun never
        # overwrites what an earlier one finished.
        started_before = os.path.exists(workdir_lib.ledger(workdir))
        if primary and not started_before:
            writers.write_config(workdir, config)
            writers.write_results(workdir, _results(config, {}, skipped, started, []))
        kept = f"; {workdir} is left as it was" if started_before else ""
        raise NothingTrained(f"no series could be trained{kept}; skipped: {skipped}")
    workers = _plot_workers(config, workdir)
    try:
        entries, records, plan = train_groups(
            config, workdir, preps, clock, workers=workers, pool_ends=pool
        )
    except BaseException:
        if workers is not None:
            workers.close()
        raise

    # -- results and report --------------------------------------------------------------
    results = _results(config, entries, skipped, started, plan)
    if primary:
        writers.write_results(workdir, results)
        with clock.stage("report"):
            drawn = workers.finish() if workers is not None else None
            report.write_reports(workdir, results, config, forecasts=records, drawn=drawn)
        writers.write_json(workdir_lib.timings_json(workdir), clock.timings(started))
    sharding.barrier("cpbjax run finished")
    return results
