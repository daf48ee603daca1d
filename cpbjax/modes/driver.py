"""The run driver: walk a run's plan group by group, train each one (or resume it), finish it.

A mode builds the plan (cpbjax/modes/plan.py: the coins, their groups of up to K, what is
kept); each group trains as one compiled program (cpbjax/training/group.py over the pure step
functions of cpbjax/training/step.py). The driver only sequences the groups: it restores or
initialises a group's state, runs epochs until every coin has stopped (moving live coins
to smaller programs, cpbjax/training/compaction.py), checkpoints, has each series' best model
scored (cpbjax/score/evaluate.py) and kept (cpbjax/score/saved.py), and records the group in the
resume ledger (cpbjax/training/ledger.py). Rerunning with the same workdir resumes: finished
groups are skipped and an unfinished one continues from its latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np
from absl import logging

from cpbjax import models, sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.data import split_dates
from cpbjax.modes import facts, init_from
from cpbjax.modes import plan as plan_lib
from cpbjax.modes.plan import Plan
from cpbjax.report import plot_workers, runlog
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report.runlog import RunLog, StageClock
from cpbjax.score import evaluate, saved
from cpbjax.training import checkpoint, epoch_spec, memory
from cpbjax.training.compaction import LiveCoins
from cpbjax.training.group import GroupTrainer, coin_keys
from cpbjax.training.ledger import Ledger, fingerprint
from cpbjax.training.step import GroupState


class NothingTrained(RuntimeError):
    """Every series was skipped; results.json lists each reason."""


@dataclasses.dataclass
class _Run:
    """What every group of one run shares."""

    config: object
    workdir: str
    plan: Plan
    module: object
    spec: evaluate.EvalSpec  # what scoring reads of the config
    epoch: epoch_spec.EpochSpec | None  # what the group programs read; None: no group
    meta: saved.RunMeta  # what a kept model's meta.json records of the config
    ledger: Ledger
    log: RunLog
    clock: StageClock  # the run's stage timings (timings.json)
    trainers: dict = dataclasses.field(default_factory=dict)  # K -> GroupTrainer

    def trainer_for(self, num_coins: int) -> GroupTrainer:
        """The run's trainer for programs of `num_coins` coins (each size compiles once)."""
        if num_coins not in self.trainers:
            self.trainers[num_coins] = GroupTrainer(self.epoch, num_coins, self.plan.mesh)
        return self.trainers[num_coins]

    def checkpoints(self, group: str) -> checkpoint.GroupCheckpoints:
        c = self.config.ckpt
        path = workdir_lib.group_checkpoints(self.workdir, group)
        return checkpoint.GroupCheckpoints(path, c.every_epochs, c.keep)


def _reload_forecasts(run: _Run, preps) -> dict:
    """evaluate.reload_forecasts of a finished group's kept models, as the config asks."""
    e = run.config.eval
    plots = bool(e.plots and e.plot_windows)
    return evaluate.reload_forecasts(
        run.spec, run.workdir, run.module, preps, plots=plots, save=e.save_forecasts
    )


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
        m = live.run_epoch()
        epoch_s = live.epoch_seconds[-1]
        (first_s if len(live.epoch_seconds) == 1 else steady_s).append(epoch_s)
        record = runlog.epoch_record(group, names, m, epoch_s, live.trainer.num_coins, t)
        run.log.epoch(writers.to_jsonable(record), sharding.memory_bytes()[0])
        epoch = record["epoch"]
        diverged = _log_divergence(names, m, diverged)
        finished = epoch >= t.epochs or not m["active"].any()
        if ckpts.due(epoch, force=finished):  # All processes save.
            ckpts.maybe_save(epoch, live.full_state(), force=finished)
        # A pooled group is one model: its coins stop together, nothing to compact.
        if t.compact_groups and run.plan.sharing.compactable and not finished:
            live.maybe_compact(m, t.patience, t.epochs)
    ckpts.close()
    run.log.end_group()
    seconds = time.monotonic() - began
    run.clock.add_epochs(first_s, steady_s)
    return live.full_state(), seconds, sharding.memory_bytes()[1]


def _check_memory(run: _Run, group: str, state, arrays) -> None:
    """Compiles the group's epoch program before its first epoch, which then reuses it,
    and stops the run with one line if the program cannot fit (cpbjax/training/memory.py). Once
    per program size: every group of the run has the same shapes."""
    trainer = run.trainer_for(run.plan.group_coins)
    if trainer.num_coins in run.clock.epoch_needs:
        return
    with run.clock.stage("compile"):
        compiled = trainer.lowered_epoch(state, arrays).compile()
    local = [d for d in trainer.mesh.devices.flat if d.process_index == jax.process_index()]
    need = memory.epoch_need(compiled, len(local), trainer.in_flight_bytes())
    run.clock.epoch_needs[trainer.num_coins] = need
    if need is None:
        return
    backend = jax.default_backend()
    capacity = memory.host_memory() if backend == "cpu" else memory.device_memory(local)
    fix = memory.remedy(run.config.train, trainer.num_coins, trainer.mesh.size)
    memory.check(group, need, backend, capacity, fix)


def _start_state(run: _Run, group: str, preps: list, arrays) -> tuple[GroupState, int]:
    """The group's latest checkpoint and its epoch, or a fresh state and 0."""
    trainer = run.trainer_for(run.plan.group_coins)
    ckpts = run.checkpoints(group)
    restored = ckpts.restore_latest(trainer.abstract_state())
    ckpts.close()
    if restored is not None:
        logging.info("%s: resuming after epoch %d", group, restored[1])
        return restored
    index = run.plan.index
    pad = [len(index) + i for i in range(trainer.num_coins - len(preps))]
    # A backtest fold's or sweep setting's coin gets its series' key (its symbol-interval
    # name): every fold and setting starts as the series would.
    series = [index[f"{p.symbol}-{p.interval}"] for p in preps]
    keys = coin_keys(run.config.seed, series + pad)
    state = trainer.init_state(keys, arrays)
    if run.config.train.init_from:  # a trained model to fine-tune, the bar to beat
        names = [f"{p.symbol}-{p.interval}" for p in preps]
        start_K = init_from.starting_params(run.config, names, trainer.num_coins)
        state = trainer.start_from(state, start_K, arrays)
    return state, 0


def _train_group(run: _Run, group: str, preps: list) -> tuple[dict, dict]:
    """Trains one group from scratch or from its latest checkpoint and finishes it.

    Returns:
      (series name -> results.json entry, series name -> test forecast record).
    """
    with run.clock.stage("setup"):
        # The windows the programs train on; compaction restacks from the same view.
        training = run.plan.training_view(preps)
        arrays = run.trainer_for(run.plan.group_coins).stack(training)
        state, start = _start_state(run, group, preps, arrays)
    with run.clock.stage("host"):  # the epoch loop; its epochs are counted as compile and train
        state, seconds, peak = _run_epochs(run, group, training, state, arrays, start)
    return _finish_group(run, group, preps, state, seconds, peak)


def _status(active: bool, diverged: bool) -> str:
    return "diverged" if diverged else ("trained" if active else "stopped_early")


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


def _score_all(run: _Run, host: dict, jobs: list) -> dict:
    """Each scored series' evaluate.Scored by name (process 0), `jobs` being (index in
    the group, prep) pairs; a backtest keeps the forecasts only."""
    keep = run.plan.keep_models
    forecasts_dir = run.workdir if run.config.eval.save_forecasts or not keep else None

    # A pooled model's coins hold the same params: their forecasts are batched together.
    params = [jax.tree.map(lambda a, i=i: a[i], host["best_params"]) for i, _ in jobs]
    preps = [prep for _, prep in jobs]
    with run.clock.stage("evaluate"):
        scored = evaluate.evaluate_models(run.module, params, preps, run.spec, forecasts_dir)
    return {prep.name: s for (_, prep), s in zip(jobs, scored, strict=True)}


def _keep_scored(run: _Run, prep, scored, entry: dict, last_params) -> None:
    """Adds a series' val/test metrics to `entry` and keeps its best model with its
    interval calibration. `last_params` (the last epoch's; None without model.baseline)
    only feed the warning of `evaluate.flag_worse_than_untrained`."""
    entry.update(scored.entry)
    evaluate.flag_worse_than_untrained(run.module, run.spec, prep, entry, last_params)
    if run.plan.keep_models:
        saved.keep_model(run.workdir, run.meta, prep, scored, entry)
    if run.plan.keep_window_mae:
        saved.save_window_mae(run.workdir, prep.name, scored.window_mae)


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
    # A series that ends before the val span is trained on, never scored (results.json: skipped).
    jobs = [(i, prep) for i, prep in enumerate(preps) if not split_dates.is_train_only(prep)]
    scored = _score_all(run, host, jobs) if sharding.is_primary() else {}
    entries, records = {}, {}
    for i, prep in jobs:
        entry = _series_entry(host, i, group, seconds, len(preps))
        entry.update(num_params=num_params, peak_memory_bytes=peak, data=prep.notes)
        if run.config.train.init_from:  # best_epoch None: no epoch beat this start, kept
            entry["started_from"] = run.config.train.init_from
        if prep.name in scored:
            last_params = host.get("params")
            if last_params is not None:
                last_params = jax.tree.map(lambda a, i=i: a[i], last_params)
            with run.clock.stage("evaluate"):
                _keep_scored(run, prep, scored[prep.name], entry, last_params)
            records[prep.name] = scored[prep.name].record
        entries[prep.name] = writers.to_jsonable(entry)
    run.ledger.finish(group, entries)
    sharding.barrier(f"cpbjax {group} finished")
    return entries, records


def _make_run(config, workdir: str, plan: Plan, clock: StageClock) -> _Run:
    """The shared context of a run walking `plan`.

    Raises:
      RunMismatch: the workdir's ledger belongs to another run.
    """
    run_print = fingerprint(config, plan.group_names(), plan.t_max)
    module = models.build(models.make_config(config))
    return _Run(
        config=config,
        workdir=workdir,
        plan=plan,
        module=module,
        spec=evaluate.make_spec(config),
        # Built once for the run's padded length T; a plan with no group compiles nothing.
        epoch=epoch_spec.make_spec(config, module, plan.t_max) if plan.groups else None,
        meta=saved.RunMeta.from_config(config),
        ledger=Ledger(workdir, {**run_print, **plan.pool_windows(), **plan.extra_print}),
        log=RunLog(workdir, config.logging, sharding.is_primary()),
        clock=clock,
    )


def train_groups(config, workdir: str, plan: Plan, clock: StageClock, workers=None):
    """Trains, or resumes, every group of `plan` in `workdir`; writes its config.json.

    Args:
      config: the validated run config. workdir: the run folder (checkpoints/, metrics.jsonl).
      plan: what to train (cpbjax/modes/plan.py). clock: the run's StageClock.
      workers: the PlotWorkers drawing each finished group's plots, or None.

    Returns:
      (name -> results entry, name -> test forecast record).

    Raises:
      RunMismatch: the workdir's ledger belongs to another run.
    """
    rerun = os.path.exists(workdir_lib.ledger(workdir))  # before _make_run writes a new one
    run = _make_run(config, workdir, plan, clock)
    if sharding.is_primary() and not rerun:  # a killed first run's folder names its config
        writers.write_config(workdir, config)
    try:
        entries, records = _walk_groups(run, workers)
    finally:
        run.log.close()
    # A rerun's config (it may differ from the finished run's in settings outside the
    # ledger's fingerprint, e.g. eval.*) is written once every group is done: a rerun
    # that fails before then leaves config.json as it was.
    if sharding.is_primary() and rerun:
        writers.write_config(workdir, config)
    return entries, records


def _walk_groups(run: _Run, workers) -> tuple[dict, dict]:
    """Trains each group of the run's plan that has not finished and reloads the forecasts
    of each that has; (entries, records) as `train_groups` returns them."""
    plan, workdir = run.plan, run.workdir
    entries, records = {}, {}
    for g, group_preps in enumerate(plan.groups):
        group = f"group-{g:03d}"
        finished = run.ledger.finished(group)
        if finished is None:
            finished, group_records = _train_group(run, group, list(group_preps))
        else:
            logging.info("%s already finished in %s; skipping it", group, workdir)
            with run.clock.stage("evaluate"):  # a backtest keeps no model to reload
                kept = group_preps if plan.keep_models else ()
                group_records = _reload_forecasts(run, kept)
        entries.update(finished)
        records.update(group_records)
        plot_workers.submit_group(workers, workdir, group, finished, group_records)
    return entries, records


def _results(config, entries: dict, plan: Plan, started: float) -> dict:
    """The results.json dict. `run.wall_seconds` counts this process only (not resumed parts)."""
    run = facts.run_facts("train", config, started, **plan.facts(config))
    return writers.to_jsonable({"run": run, "series": entries, "skipped": plan.skipped})


def _nothing_trained(config, workdir: str, plan: Plan, started: float) -> NothingTrained:
    """Writes config.json and results.json of a run where every series was skipped,
    unless the workdir already holds a run: a failing rerun never overwrites what an
    earlier one finished. Returns the error to raise."""
    started_before = os.path.exists(workdir_lib.ledger(workdir))
    if sharding.is_primary() and not started_before:
        writers.write_config(workdir, config)
        writers.write_results(workdir, _results(config, {}, plan, started))
    kept = f"; {workdir} is left as it was" if started_before else ""
    return NothingTrained(f"no series could be trained{kept}; skipped: {plan.skipped}")


def train_and_evaluate(config, workdir: str) -> dict:
    """Trains every series of `config` group by group, evaluates it, and writes the workdir
    (config.json, metrics.jsonl, checkpoints/, models/<SERIES>/, results.json, the report);
    returns the results.json dict.

    Rerunning with the same workdir resumes: finished groups are skipped and an
    unfinished one continues from its latest checkpoint. In a multi-host run
    (config.distributed) every process runs this with the same config and a workdir on
    a shared filesystem: the coin axis is sharded over all processes' devices, every
    process saves its shards of the group checkpoints, and process 0 alone writes the
    other files and evaluates.

    Raises:
      ConfigError: a bad config value. RunMismatch: the workdir holds a different run.
      NothingTrained: every series was skipped (results.json still lists why).
    """
    config_lib.validate(config)
    init_from.check_source(config, workdir)
    started, clock = time.time(), StageClock()
    os.makedirs(workdir, exist_ok=True)
    plan = plan_lib.for_train(config, clock)
    if all(split_dates.is_train_only(p) for p in plan.coins):  # none to score
        raise _nothing_trained(config, workdir, plan, started)
    with clock.stage("report"):
        shown = report_spec.make_spec(config)  # what the report and its plot workers read
        workers = plot_workers.start(shown, workdir)
    try:
        entries, records = train_groups(config, workdir, plan, clock, workers)
    except BaseException:
        if workers is not None:
            workers.close()
        raise
    results = _results(config, entries, plan, started)
    if sharding.is_primary():
        with clock.stage("report"):
            writers.write_results(workdir, results)
            drawn = workers.finish() if workers is not None else None
            report.write_reports(workdir, results, shown, report.PlotInputs(None, records, drawn))
        writers.write_json(workdir_lib.timings_json(workdir), clock.timings(started))
    sharding.barrier("cpbjax run finished")
    return results
