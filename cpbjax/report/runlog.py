"""The run log: each epoch record fans out to metrics.jsonl, the progress display and TensorBoard.

It is built once per run knowing whether this process writes the workdir (process 0 of
a multi-host run), so the driver never asks again. The progress display is a rich live
bar on a terminal and one absl log line per epoch elsewhere (CI, log files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import sys
import time

import jax
from absl import logging

from cpbjax import writers
from cpbjax.report import tensorboard
from cpbjax.training import sharing

# jax.monitoring's event for each XLA program built: compiled, or read from the persistent
# compile cache (then it times the read).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_COMPILES: list[dict] = []  # every compilation of this process: program name, seconds
_LISTENING: list = []  # the listener, once registered (jax keeps it for the process)
_PROCESS_START: list[float] = []  # launch.py's first monotonic second, until a clock takes it


def _on_duration(event: str, seconds: float, **kwargs) -> None:
    if event == COMPILE_EVENT:
        _COMPILES.append({"program": str(kwargs.get("fun_name")), "seconds": round(seconds, 3)})


def epoch_record(group: str, names: list[str], m: dict, seconds: float, coins: int, train_cfg):
    """One metrics.jsonl line from the host copy of an epoch's metrics (real coins only):
    `names` the group's series, `coins` the coins its program computed, and the fields
    that train_cfg's options add."""
    n = len(names)
    record = {
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
    record["val_gain_se"] = m["val_gain_se"][:n]
    judged_key = sharing.from_config(train_cfg).judged_val_key
    if judged_key:  # what its early stopping judged, the same on every coin that trains;
        # coin 0 may not (data.split_dates: a series with no train windows).
        judged = [v for v in m["stop_val_loss"][:n] if v is not None and math.isfinite(v)]
        record[judged_key] = judged[0] if judged else None
    return record


def mark_process_start(monotonic_s: float) -> None:
    """launch.py's time.monotonic() at its first line: the next StageClock starts there, so
    its "startup" stage holds the imports, device start and config before the mode runs."""
    _PROCESS_START[:] = [monotonic_s]


class StageClock:
    """Wall seconds of a run's stages, for <workdir>/timings.json and benchmarks/whole_run.py.

    The stages partition the run's wall time: every second since the clock started is in
    exactly one stage, so they sum to timings.json's "wall_seconds". A `stage` block
    inside another counts only for the inner one; time outside every block is "other".
    Stages: startup (from launch.py's first line to the clock's start, `mark_process_start`;
    absent when the run was not launched by launch.py), load, prepare (features, windows,
    normalisation), setup (stacking, restoring or initialising a group), compile (the run's
    first epoch program, compiled ahead of its first epoch for the memory check, and each
    later program's first epoch beyond its steady epoch time), train (the epochs' steady
    time), host (the epoch loop's own work between epochs: metrics, checkpoints,
    compaction), evaluate (saving and scoring the models), report, other. `compiles()` lists
    the XLA programs built since the clock started (timings.json "compiles"), so a run shows
    how many programs it compiled and how long each took.
    """

    def __init__(self, now=time.monotonic):
        """`now`: the monotonic seconds the clock reads (a test gives a scripted one)."""
        self._now = now
        self._since = now()  # when the running interval began; it counts for self._current
        self._current = "other"
        # The first clock of a launched process starts at launch.py's first line.
        self.began = _PROCESS_START.pop() if _PROCESS_START else self._since
        self.seconds: dict[str, float] = {}
        if self.began < self._since:
            self.seconds["startup"] = self._since - self.began
        # K -> memory.Need of the K-coin epoch program, measured before its first epoch
        self.epoch_needs: dict = {}
        if not _LISTENING:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _LISTENING.append(_on_duration)
        self._first_compile = len(_COMPILES)

    def compiles(self) -> list[dict]:
        """The XLA compilations since this clock started: {"program", "seconds"} each."""
        return _COMPILES[self._first_compile :]

    def timings(self, started: float) -> dict:
        """timings.json: stage seconds and their sum, the wall seconds since the clock's
        start (`wall_seconds`), the driver's wall seconds since `started` (epoch seconds),
        each XLA program built (compiled or read from the cache), and the memory each epoch
        program needs beyond its data (cpbjax/training/memory.py; None where the backend
        does not say)."""
        self._charge()
        return {
            "stages": dict(self.seconds),
            "wall_seconds": self._since - self.began,
            "driver_seconds": time.time() - started,
            "compiles": self.compiles(),
            "epoch_memory": [
                {"coins": k, **(dataclasses.asdict(n) if n else {"per_device": None})}
                for k, n in sorted(self.epoch_needs.items())
            ],
        }

    def _charge(self) -> None:
        """Counts the running interval for the current stage and starts the next one."""
        now = self._now()
        self.seconds[self._current] = self.seconds.get(self._current, 0.0) + now - self._since
        self._since = now

    def _move(self, source: str, target: str, seconds: float) -> None:
        """Recounts up to `seconds` of `source` as `target` (their sum stays)."""
        moved = min(max(seconds, 0.0), self.seconds.get(source, 0.0))
        self.seconds[source] = self.seconds.get(source, 0.0) - moved
        self.seconds[target] = self.seconds.get(target, 0.0) + moved

    @contextlib.contextmanager
    def stage(self, stage: str):
        self._charge()
        outer, self._current = self._current, stage
        try:
            yield
        finally:
            self._charge()
            self._current = outer

    def add_epochs(self, first_s: list[float], steady_s: list[float]) -> None:
        """Splits the epochs of a group's epoch loop, run inside stage("host"), out of host:
        `first_s` are each program's first epoch (with its compile), `steady_s` the other
        epochs. What stays in host is the loop's work between epochs."""
        steady = statistics.median(steady_s) if steady_s else 0.0
        compile_s = sum(max(f - steady, 0.0) for f in first_s)
        epochs_s = sum(first_s) + sum(steady_s)
        self._charge()
        self._move("host", "compile", compile_s)
        self._move("host", "train", epochs_s - compile_s)


class RunLog:
    """Where a run's per-epoch records go; every method is a no-op off the primary process."""

    def __init__(self, workdir: str, logging_cfg, primary: bool):
        """Args:
        workdir: the run folder (metrics.jsonl, tb/).
        logging_cfg: config.logging (progress: auto | rich | plain; tensorboard: bool).
        primary: whether this process writes the workdir.
        """
        self.primary = primary
        self.metrics = writers.MetricsLog(workdir)
        self.progress = make_progress(logging_cfg.progress)
        use_tb = logging_cfg.tensorboard and primary
        self.tensorboard = tensorboard.TensorBoardLog(workdir) if use_tb else None

    def start_group(self, group: str, num_series: int, max_epochs: int, start_epoch: int):
        """A group starts (or resumes after `start_epoch`): its later lines are dropped, as
        those epochs are re-run."""
        if not self.primary:
            return
        self.metrics.keep(lambda r: r["group"] != group or r["epoch"] <= start_epoch)
        self.progress.start_group(group, num_series, max_epochs, start_epoch)
        if self.tensorboard:
            self.tensorboard.start_group(group, start_epoch)

    def epoch(self, record: dict, memory_bytes: int | None) -> None:
        """One metrics.jsonl record (JSON types) of the epoch just run."""
        if not self.primary:
            return
        self.metrics.append(record)
        self.progress.update(record, memory_bytes)
        if self.tensorboard:
            self.tensorboard.append(record)

    def end_group(self) -> None:
        if self.primary:
            self.progress.end_group()

    def close(self) -> None:
        """Closes the TensorBoard file; call in a `finally`."""
        if self.tensorboard:
            self.tensorboard.close()


def _fmt_loss(values) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "-"
    return f"{min(finite):.4g}/{statistics.median(finite):.4g}"


def _fmt_bytes(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


@dataclasses.dataclass
class _GroupInfo:
    name: str
    num_series: int
    max_epochs: int
    start_epoch: int
    started: float


class PlainProgress:
    """One absl log line per epoch (CI, log files)."""

    def __init__(self):
        self._group = None

    def start_group(self, name: str, num_series: int, max_epochs: int, start_epoch: int) -> None:
        self._group = _GroupInfo(name, num_series, max_epochs, start_epoch, time.monotonic())
        resumed = f", resumed after epoch {start_epoch}" if start_epoch else ""
        logging.info(
            "%s: training %d series for up to %d epochs%s", name, num_series, max_epochs, resumed
        )

    def update(self, record: dict, memory_bytes: int | None) -> None:
        g = self._group
        done = record["epoch"] - g.start_epoch
        eta = (time.monotonic() - g.started) / max(done, 1) * (g.max_epochs - record["epoch"])
        pooled = record.get("pooled_val_loss")  # the number a pooled run's early stopping judged
        logging.info(
            "%s epoch %d/%d: active %d/%d, train loss min/median %s, best val min/median %s%s, "
            "lr %.3g, %.2fs, ETA <= %.0fs, device memory %s",
            g.name,
            record["epoch"],
            g.max_epochs,
            sum(record["active"]),
            g.num_series,
            _fmt_loss(record["train_loss"]),
            _fmt_loss(record["best_val_loss"]),
            "" if pooled is None else f", pooled val {pooled:.4g}",
            record["lr"],
            record["seconds"],
            eta,
            _fmt_bytes(memory_bytes),
        )

    def end_group(self) -> None:
        logging.info("%s: done in %.1fs", self._group.name, time.monotonic() - self._group.started)


class RichProgress:
    """A live rich progress bar per group (interactive terminals)."""

    def __init__(self):
        from rich import progress as rp  # noqa: PLC0415 (only needed on a TTY)

        self._progress = rp.Progress(
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TextColumn("active {task.fields[active]}"),
            rp.TextColumn("best val min/med {task.fields[best]}"),
            rp.TimeRemainingColumn(),
            rp.TextColumn("{task.fields[memory]}"),
        )
        self._task = None
        self._num_series = 0

    def start_group(self, name: str, num_series: int, max_epochs: int, start_epoch: int) -> None:
        self._num_series = num_series
        self._progress.start()
        self._task = self._progress.add_task(
            name,
            total=max_epochs,
            completed=start_epoch,
            active=f"{num_series}/{num_series}",
            best="-",
            memory="",
        )

    def update(self, record: dict, memory_bytes: int | None) -> None:
        self._progress.update(
            self._task,
            completed=record["epoch"],
            active=f"{sum(record['active'])}/{self._num_series}",
            best=_fmt_loss(record["best_val_loss"]),
            memory=_fmt_bytes(memory_bytes),
        )

    def end_group(self) -> None:
        self._progress.stop()


def make_progress(mode: str) -> PlainProgress | RichProgress:
    """config.logging.progress: `rich`, `plain`, or `auto` (rich on a TTY, else plain)."""
    if mode == "rich" or (mode == "auto" and sys.stderr.isatty()):
        return RichProgress()
    return PlainProgress()
