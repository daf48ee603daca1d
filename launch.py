"""Entry point: flags, workdir, device log, then one call into the cpbjax package.

python launch.py --config configs/transformer.py [--config.train.learning_rate=3e-4]
    [--workdir runs/my-run] [--mode train|backtest|ablate|evaluate|predict|export|serve]

--mode evaluate|predict|export|serve without --config use the run's own config
(configs/workdir.py:<workdir>, read from <workdir>/config.json).
"""

import logging as std_logging
import os
import tempfile
import time

# timings.json's "startup" stage starts here, before the heavy imports (absl, jax), the
# device start and the config.
LAUNCHED = time.monotonic()

# One XLA host device per core, set before jax is imported, so the coin axis can be
# sharded over the CPU cores (measured +30-40% throughput on a 2-core machine).
# A user's own XLA_FLAGS win.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
# numpy's BLAS only sees the baselines' small fits (40,000 x 30 at most), where its threads
# fight XLA's and each other for the cores: one thread fits HAR 9x faster on the 2-core
# CPU (docs/performance.md "Evaluation: one BLAS thread"). Set before numpy loads; a user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from cpbjax import process_pool  # noqa: E402 (light: no jax, no numpy)

# One malloc arena per core, before any thread starts (process_pool.limit_malloc_arenas).
process_pool.limit_malloc_arenas()

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from cpbjax import runtime  # noqa: E402
from cpbjax import workdir as workdir_lib  # noqa: E402
from cpbjax.config import (  # noqa: E402
    cli_errors,
    sweep_grid,  # noqa: E402
)
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.config_rules import ConfigError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/gru.py:tiny.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder; default runs/<model>-<time>.")
MODES = ("train", "backtest", "ablate", "evaluate", "predict", "export", "serve", "data")
_MODE = flags.DEFINE_enum("mode", "train", list(MODES), "What to run.")
flags.mark_flags_as_required(["config"])
TRAINING_MODES = ("train", "backtest", "ablate")  # the modes that train, from a --config
RUN_MODES = ("evaluate", "predict", "export", "serve")  # the modes that read a trained run
RUN_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "workdir.py")


def _flag_value(argv, name: str) -> str | None:
    """The value of --name=V or --name V in argv, else None."""
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _with_run_config(argv):
    """argv, with --config=configs/workdir.py:<workdir> first where a mode that reads a
    trained run (evaluate, predict, serve) is given a --workdir and no --config."""
    mode, workdir = _flag_value(argv, "mode"), _flag_value(argv, "workdir")
    if _flag_value(argv, "config") is None and mode not in (None, *TRAINING_MODES) and workdir:
        return [argv[0], f"--config={RUN_CONFIG}:{workdir}", *argv[1:]]
    return argv


def _parse_flags(argv):
    """absl parsing (cli_errors: a bad config key or file, or a stray argument, is one
    line, exit 2), with the run's own config where a mode that reads a trained run is
    given no --config."""
    mode = _flag_value(argv, "mode")
    if mode in RUN_MODES and not _flag_value(argv, "workdir") and not _flag_value(argv, "config"):
        # Checked before absl, whose required --config would be the wrong thing to ask for.
        cli_errors.fail(f"--mode {mode} needs --workdir of a trained run")
    if mode not in RUN_MODES and not _flag_value(argv, "config"):
        cli_errors.fail(
            f"--mode {mode or 'train'} needs --config, e.g. --config configs/mlp.py:demo "
            "(configs/ holds one file per model)"
        )
    rest = cli_errors.parse_flags(_with_run_config(argv))
    cli_errors.refuse_extra_arguments(rest, MODES)
    return rest


def _quiet_orbax() -> None:
    """Orbax logs every checkpoint step at INFO; keep only its warnings and errors, less
    its threads' tracebacks of a full disk (the error line names the file instead)."""
    logging.get_absl_handler().addFilter(_shown)


def _shown(record) -> bool:
    orbax, loop = "orbax" in record.pathname, "asyncio" in record.pathname
    if orbax and record.levelno < std_logging.WARNING:
        return False
    if not (orbax or loop):
        return True
    # Orbax's threads, and asyncio for each write future they leave, log a full disk with
    # a traceback before it reaches run_mode, which says it in one line naming the file.
    errors = [Exception(record.getMessage()), record.exc_info[1] if record.exc_info else None]
    return all(cli_errors.disk_full(e, "") is None for e in errors)


def _workdir_problem(workdir: str) -> str | None:
    """Why `workdir` cannot hold a run (not a folder, under a file, read-only), or None."""
    try:
        probe = tempfile.NamedTemporaryFile(dir=workdir, prefix=".cpbjax-probe-")  # noqa: SIM115
        probe.close()
    except OSError as e:
        return f"--workdir {workdir} cannot hold a run: {e.strerror or e}"
    return None


def _make_workdir(workdir: str) -> list[str]:
    """Makes `workdir`; returns the folders it made (exits 2 if it cannot hold a run)."""
    try:
        made = workdir_lib.make(workdir)
    except OSError as e:
        cli_errors.fail(f"--workdir {workdir} cannot hold a run: {e.strerror or e}")
    problem = _workdir_problem(workdir)
    if problem:
        workdir_lib.remove_if_empty(made)
        cli_errors.fail(problem)
    return made


def main(argv):
    del argv
    _quiet_orbax()
    try:
        config = _CONFIG.value
        config.to_dict()  # a config file that failed to load raises only when read
    except (OSError, ValueError) as e:
        cli_errors.fail(cli_errors.load_error(e))
    if _MODE.value == "data":  # a table of the config's series: no workdir, no devices
        _data_table(config)
        return
    if _MODE.value not in TRAINING_MODES and not _WORKDIR.value:
        cli_errors.fail(f"--mode {_MODE.value} needs --workdir of a trained run")
    try:
        config_lib.validate(config)
        distributed = config.distributed.enabled
        if distributed and (_MODE.value not in ("train", "backtest") or not _WORKDIR.value):
            # Every process must write into the same folder; evaluate and predict run on one
            # (ablate too: no multi-host run of it has been tested).
            cli_errors.fail(
                "config.distributed.enabled=True needs --mode train or backtest and a --workdir on a "
                "filesystem that all processes share"
            )
        runtime.configure(config)
    except (ConfigError, runtime.PlatformError) as e:
        cli_errors.fail(str(e))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = _WORKDIR.value or os.path.join("runs", f"{config.model.name}-{stamp}")
    made = _make_workdir(workdir)
    logging.info(
        "cpbjax %s: workdir %s, devices %s", _MODE.value, workdir, runtime.describe_devices()
    )
    if _MODE.value in TRAINING_MODES:  # the run's StageClock starts at LAUNCHED
        from cpbjax.report import runlog

        runlog.mark_process_start(LAUNCHED)
    try:
        run_mode(_MODE.value, config, workdir)
    except BaseException:
        # A run that fails before writing anything (a bad data.base_url, no series)
        # leaves no empty folder behind; a folder that existed before is never removed.
        workdir_lib.remove_if_empty(made)
        raise


def _data_table(config) -> None:
    """--mode data: the table of the config's series, or one line and exit 2."""
    from cpbjax.modes import data_table

    try:
        data_table.run_data_table(config_lib.validate(config))
    except ConfigError as e:
        cli_errors.fail(str(e))


def run_mode(mode: str, config, workdir: str) -> None:
    """Runs `mode` in `workdir`; its known failures, and a write that finds the disk full
    (whose file is named, where the error holds it), exit 2 with one line."""
    run, known_errors = _mode_entry(mode, config)
    try:
        run(config, workdir)
    except (ConfigError, *known_errors) as e:
        cli_errors.fail(str(e))
    except Exception as e:
        full = cli_errors.disk_full(e, workdir)
        if full is None:
            raise
        cli_errors.fail(full)


def _mode_entry(mode: str, config):
    """(run(config, workdir), the errors it ends with one line) of `mode`; each mode's
    modules are imported only when it runs."""
    if mode in TRAINING_MODES:
        from cpbjax.training import ledger

        if mode == "backtest":
            from cpbjax.modes import backtest

            return backtest.run_backtest, (ledger.RunMismatch, backtest.NothingBacktested)
        if mode == "ablate":
            from cpbjax.modes import ablate, driver

            return ablate.run_ablate, (
                ledger.RunMismatch,
                driver.NothingTrained,
                ablate.NoCovariates,
            )
        from cpbjax.modes import driver, sweep

        run = sweep.run_sweep if sweep_grid.is_sweep(config) else driver.train_and_evaluate
        return run, (ledger.RunMismatch, driver.NothingTrained)
    from cpbjax.modes import evaluate, export, http_server, predict, serve
    from cpbjax.score import saved

    runs = {
        "evaluate": evaluate.run_evaluate,
        "predict": predict.run_predict,
        "export": export.run_export,
        "serve": serve.run_serve,
    }
    known_errors = (
        saved.ModelNotFound,
        predict.NothingToForecast,
        evaluate.NothingEvaluated,
        export.NothingToExport,
        http_server.ServeError,
    )
    return runs[mode], known_errors


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
