"""Every path under a run's <workdir>: the one place that names its files and folders;
and the user's cache folders that every run shares (`user_cache`).

<workdir>/config.json                 the resolved config
<workdir>/metrics.jsonl               one JSON object per (group, epoch)
<workdir>/results.json                per series: status, losses, test/val metrics
<workdir>/checkpoints/groups.json     the resume ledger (group plan, finished groups)
<workdir>/checkpoints/finished/<group>.json  a finished group's results.json entries (ledger)
<workdir>/checkpoints/<group>/        Orbax checkpoints of one group's train state
<workdir>/models/<SERIES>/            one series' best model (meta.json + params/)
<workdir>/forecasts/<SERIES>.npz      test forecasts (eval.save_forecasts)
<workdir>/report.md, plots/           the report and its figures
<workdir>/timings.json                wall seconds of the run's stages (load ... report)
<workdir>/report.html                 the same report in one self-contained page
<workdir>/forecast.json, forecast.csv --mode predict (the latest)
<workdir>/predictions/forecast-<UTC time>.json  every --mode predict forecast
<workdir>/eval-<stamp>.json, .md, .html --mode evaluate
<workdir>/tb/<group>/                 TensorBoard event files (logging.tensorboard;
                                      named by report/tensorboard.py)
<workdir>/export/<SERIES>/            --mode export: a portable model folder
<workdir>/frames/<SERIES>.parquet     cpbjax.fit's candles, read as the run's `local` source
<workdir>/backtest.json, .md, .html   --mode backtest: per series x fold and pooled scores
<workdir>/backtest/                   --mode backtest's own run folder (config.json,
                                      metrics.jsonl, checkpoints/, forecasts/<SERIES>@fold<f>.npz),
                                      so a backtest never touches a train run's files
<workdir>/sweep.json                  a sweep (non-empty sweep.<field>): every series x
                                      setting's val/test scores and the chosen settings
<workdir>/sweep/                      a sweep's own run folder (config.json, metrics.jsonl,
                                      checkpoints/, models/<SERIES>@<setting>/); models/,
                                      results.json and the report hold the chosen settings
"""

from __future__ import annotations

import os

# The user's cache folders, $XDG_CACHE_HOME/cpbjax/<name> (~/.cache/cpbjax/<name> when it
# is unset or empty): "parsed" (data.parsed_cache), "baselines" (eval.baseline_cache) and
# "xla" (runtime.compilation_cache). A cache setting: "auto" (or "") for that folder,
# "off" for none, else a folder path.
CACHE_OFF = "off"
CACHE_DEFAULT = ("", "auto")

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"
TIMINGS_FILE = "timings.json"
REPORT_STEM = "report"
FORECAST_JSON = "forecast.json"
FORECAST_CSV = "forecast.csv"
CHECKPOINTS_DIR = "checkpoints"
LEDGER_FILE = "groups.json"
FINISHED_DIR = "finished"  # checkpoints/finished/<group>.json, the ledger's finished groups
MODELS_DIR = "models"
FORECASTS_DIR = "forecasts"
WINDOW_MAE_DIR = "window_mae"  # --mode ablate: each scored coin's per-window MAE
PLOTS_DIR = "plots"
EXPORT_DIR = "export"
PREDICTIONS_DIR = "predictions"
FRAMES_DIR = "frames"
BACKTEST_STEM = "backtest"  # backtest.json, backtest.md and the backtest/ run folder
SWEEP_STEM = "sweep"  # sweep.json and the sweep/ run folder
ABLATE_STEM = "ablate"  # ablate.json and the ablate/ run folder
# Inside a saved series model folder (models/<SERIES>/).
MODEL_META_FILE = "meta.json"
MODEL_PARAMS_DIR = "params"


def config_json(workdir: str) -> str:
    return os.path.join(workdir, CONFIG_FILE)


def metrics_jsonl(workdir: str) -> str:
    return os.path.join(workdir, METRICS_FILE)


def results_json(workdir: str) -> str:
    return os.path.join(workdir, RESULTS_FILE)


def ledger(workdir: str) -> str:
    return os.path.join(workdir, CHECKPOINTS_DIR, LEDGER_FILE)


def finished_group(workdir: str, group: str) -> str:
    """checkpoints/finished/<group>.json: a finished group's results.json entries."""
    return os.path.join(workdir, CHECKPOINTS_DIR, FINISHED_DIR, f"{group}.json")


def group_checkpoints(workdir: str, group: str) -> str:
    return os.path.join(workdir, CHECKPOINTS_DIR, group)


def models_dir(workdir: str) -> str:
    return os.path.join(workdir, MODELS_DIR)


def series_model(workdir: str, series: str) -> str:
    return os.path.join(workdir, MODELS_DIR, series)


def forecasts_file(workdir: str, series: str) -> str:
    return os.path.join(workdir, FORECASTS_DIR, f"{series}.npz")


def window_mae_file(workdir: str, series: str) -> str:
    return os.path.join(workdir, WINDOW_MAE_DIR, f"{series}.npz")


def report_md(workdir: str, stem: str = REPORT_STEM) -> str:
    return os.path.join(workdir, f"{stem}.md")


def report_html(workdir: str, stem: str = REPORT_STEM) -> str:
    return os.path.join(workdir, f"{stem}.html")


def plots_dir(workdir: str, stem: str = REPORT_STEM) -> str:
    """plots/ for the training report, plots/<stem>/ for an evaluate report."""
    return os.path.join(workdir, PLOTS_DIR, *([] if stem == REPORT_STEM else [stem]))


def forecast_json(workdir: str) -> str:
    return os.path.join(workdir, FORECAST_JSON)


def forecast_csv(workdir: str) -> str:
    return os.path.join(workdir, FORECAST_CSV)


def export_dir(workdir: str, series: str) -> str:
    return os.path.join(workdir, EXPORT_DIR, series)


def frames_dir(workdir: str) -> str:
    """frames/: the candles given to cpbjax.fit, the run's data.local_dir."""
    return os.path.join(workdir, FRAMES_DIR)


def frames_file(workdir: str, series: str) -> str:
    """frames/<SERIES>.parquet: one series' candles given to cpbjax.fit."""
    return os.path.join(frames_dir(workdir), f"{series}.parquet")


def prediction_archive(workdir: str, stamp: str) -> str:
    """predictions/forecast-<stamp>.json: one forecast of --mode predict, kept."""
    return os.path.join(workdir, PREDICTIONS_DIR, f"forecast-{stamp}.json")


def timings_json(workdir: str) -> str:
    return os.path.join(workdir, TIMINGS_FILE)


def backtest_json(workdir: str) -> str:
    return os.path.join(workdir, f"{BACKTEST_STEM}.json")


def backtest_run(workdir: str) -> str:
    """backtest/: the folder the backtest's fold coins train in, laid out as a run's."""
    return os.path.join(workdir, BACKTEST_STEM)


def sweep_json(workdir: str) -> str:
    return os.path.join(workdir, f"{SWEEP_STEM}.json")


def ablate_json(workdir: str) -> str:
    return os.path.join(workdir, f"{ABLATE_STEM}.json")


def ablate_run(workdir: str) -> str:
    """ablate/: the folder the ablation's setting coins train in, laid out as a run's."""
    return os.path.join(workdir, ABLATE_STEM)


def sweep_run(workdir: str) -> str:
    """sweep/: the folder a sweep's (series, setting) coins train in, laid out as a run's."""
    return os.path.join(workdir, SWEEP_STEM)


def make(workdir: str) -> list[str]:
    """Makes `workdir` and its missing parents; returns the folders it made, deepest first."""
    made, path = [], os.path.abspath(workdir)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        made.append(path)
        path = os.path.dirname(path)
    os.makedirs(workdir, exist_ok=True)
    return made


def remove_if_empty(folders: list[str]) -> None:
    """Removes `folders` (from `make`, deepest first) while each is empty: a run that
    failed before writing anything leaves nothing. os.rmdir refuses a folder with
    anything in it, so no file is ever removed."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def user_cache(name: str) -> str:
    """The user's cache folder `name`: $XDG_CACHE_HOME/cpbjax/<name>, or
    ~/.cache/cpbjax/<name> when $XDG_CACHE_HOME is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cpbjax", name)


def cache_setting(setting: str, name: str) -> str | None:
    """The folder a cache setting names: None for "off", user_cache(name) for "auto" or
    "", else the path (~ expanded)."""
    if setting == CACHE_OFF:
        return None
    if setting in CACHE_DEFAULT:
        return user_cache(name)
    return os.path.expanduser(setting)
