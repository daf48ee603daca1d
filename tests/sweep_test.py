"""Tests of sweeps: every (series, setting) coin in one program, chosen on val loss only
(what trains nothing, the choice, the grid and the config checks: sweep_grid_test.py).

One sweep of 2 tiny series x 2 learning rates x 2 weight decays runs once in a subprocess (module
fixture) with a persistent compilation cache at XLA optimisation level 0, as the
backtest tests do; the runs it is compared with (one setting alone, the pooled sweep and
its setting alone, the compacted sweep) share one more subprocess (`run_others`).
"""

import math
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import logging

from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.modes import sweep
from cpbjax.training import checkpoint, ledger
from tests import helpers
from tests.helpers import sweep_config

SERIES, RATES, DECAYS = helpers.SWEEP_SERIES, helpers.SWEEP_RATES, helpers.SWEEP_DECAYS
# The coin trained again on its own (the config's own are lr 1e-3, decay 1e-2).
ALONE_SERIES, ALONE_SETTING = "ETHUSDT-1h", {"learning_rate": 3e-3, "weight_decay": 0.0}


def run(workdir: str) -> None:
    logging.set_verbosity(logging.INFO)  # the resume test reads what was skipped
    sweep.run_sweep(sweep_config(), workdir)


def run_pooled(workdir: str) -> None:
    logging.set_verbosity(logging.INFO)  # the test reads what was skipped
    config = sweep_config()
    config.sweep.select = "pooled"
    sweep.run_sweep(config, workdir)


def run_alone(workdir: str) -> None:
    """ALONE_SERIES as the only coin of a plain run with ALONE_SETTING's values in
    config.train (same symbols, so its coin key is the sweep coin's)."""
    from cpbjax.modes import driver, plan
    from cpbjax.report.runlog import StageClock

    config = sweep_config()
    config.sweep.learning_rate, config.sweep.weight_decay = (), ()
    config.train.update(ALONE_SETTING)
    preps = [p for p in plan.prepare_all(config)[0] if p.name == ALONE_SERIES]
    entries, _ = driver.train_groups(config, workdir, plan.chunked(config, preps), StageClock())
    writers.write_json(os.path.join(workdir, "alone.json"), entries)


# The pooled sweep's setting trained again alone; its decay is not the config's (0.0), so
# a decay that never reached the pooled step would show.
POOLED_ALONE = {"learning_rate": 3e-3, "weight_decay": 0.05}


def pooled_sweep_config():
    """The sweep with train.share=pooled: one pooled model of both series per setting, 2
    settings (both learning rates at POOLED_ALONE's decay)."""
    c = sweep_config()
    c.train.share, c.train.group_size = "pooled", 0
    c.sweep.weight_decay = (POOLED_ALONE["weight_decay"],)
    return config_lib.validate(c)


def _pooled_settings():
    return [f"lr={r!r},wd={POOLED_ALONE['weight_decay']!r}" for r in RATES]


def run_pooled_share(workdir: str) -> None:
    sweep.run_sweep(pooled_sweep_config(), workdir)


def run_pooled_alone(workdir: str) -> None:
    """A pooled train run of both series with POOLED_ALONE's values in config.train."""
    from cpbjax.modes import driver

    config = pooled_sweep_config()
    config.sweep.learning_rate, config.sweep.weight_decay = (), ()
    config.train.update(POOLED_ALONE)
    driver.train_and_evaluate(config, workdir)


def run_compacted(workdir: str) -> None:
    """The sweep with patience 1, so coins stop at scattered epochs, run twice: whole, and
    with group compaction forced whenever at most half the coins train."""
    from cpbjax.training import compaction

    config = sweep_config()
    config.train.epochs, config.train.patience, config.train.compact_groups = 6, 1, False
    sweep.run_sweep(config, os.path.join(workdir, "whole"))
    compaction.compaction_pays = lambda *args: True
    config.train.compact_groups = True
    sweep.run_sweep(config, os.path.join(workdir, "compacted"))


def run_others(root: str) -> None:
    """<root>/alone (`run_alone`), <root>/pooled/{sweep,alone} (`run_pooled_share`,
    `run_pooled_alone`) and <root>/compacted (`run_compacted`, last: it forces compaction)
    in one process, sharing their compiled programs."""
    run_alone(os.path.join(root, "alone"))
    run_pooled_share(os.path.join(root, "pooled", "sweep"))
    run_pooled_alone(os.path.join(root, "pooled", "alone"))
    run_compacted(os.path.join(root, "compacted"))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One CPU device and a compilation cache shared by this module's runs."""
    return helpers.cached_env(tmp_path_factory.mktemp("jax-cache"))


@pytest.fixture(scope="module")
def finished(env, tmp_path_factory):
    """(workdir, what it printed) of the sweep."""
    workdir = tmp_path_factory.mktemp("sweep")
    proc = helpers.spawn("sweep_test", "run", workdir, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir, proc.stdout


@pytest.fixture(scope="module")
def full(finished):
    return finished[0]


@pytest.fixture(scope="module")
def others(env, tmp_path_factory):
    """The root of `run_others`' workdirs."""
    root = tmp_path_factory.mktemp("others")
    proc = helpers.spawn("sweep_test", "run_others", root, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def _read(workdir, name="sweep.json") -> dict:
    return writers.read_json(os.path.join(workdir, name))


def _settings():
    """The setting names, written out by hand in grid order."""
    return [f"lr={r!r},wd={w!r}" for r in RATES for w in DECAYS]


def _coins():
    return [f"{s}@{name}" for s in SERIES for name in _settings()]


def test_the_whole_grid_trains_in_one_program(full):
    records = writers.MetricsLog(os.path.join(full, "sweep")).records()
    assert {r["group"] for r in records} == {"group-000"}
    assert all(r["series"] == _coins() and r["coins_computed"] == 8 for r in records)
    compiles = [c["program"] for c in _read(full, "timings.json")["compiles"]]
    assert compiles.count("jit(run_epoch)") == 1


def test_a_sweep_coin_trains_as_that_setting_alone(full, others):
    alone_dir = others / "alone"
    alone = writers.read_json(os.path.join(alone_dir, "alone.json"))[ALONE_SERIES]
    alone_name = "lr={learning_rate!r},wd={weight_decay!r}".format(**ALONE_SETTING)
    cell = _read(full)["series"][ALONE_SERIES]["settings"][alone_name]
    for field in ("status", "best_epoch", "epochs_run", "num_params"):
        assert alone[field] == cell[field], field
    # Another program (and schedule x lr_mult for the peak): equal up to float32 rounding,
    # the tolerance of the backtest's fold-alone test.
    assert alone["best_val_loss"] == pytest.approx(cell["best_val_loss"], rel=1e-5)
    for col in ("close", "high", "low"):
        got, want = alone["test"]["columns"][col], cell["test"]["columns"][col]
        assert got["mae"] == pytest.approx(want["mae"], rel=1e-5)
    p_alone, _ = checkpoint.load_series_model(os.path.join(alone_dir, "models", ALONE_SERIES))
    p_coin, _ = checkpoint.load_series_model(os.path.join(full, "sweep", "models", cell["coin"]))
    np.testing.assert_allclose(_flat(p_alone), _flat(p_coin), **helpers.CROSS_PROGRAM)
    # ... and each other setting of the same series, which starts from the same init,
    # ends elsewhere: each of its per-coin values reached the step.
    for name in _settings():
        if name != alone_name:
            path = os.path.join(full, "sweep", "models", f"{ALONE_SERIES}@{name}")
            other, _ = checkpoint.load_series_model(path)
            assert np.abs(_flat(other) - _flat(p_coin)).max() > 1e-4, name


def _flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(params)])


def test_series_choice_is_the_argmin_of_val_loss_from_metrics(full):
    out = _read(full)
    records = writers.MetricsLog(os.path.join(full, "sweep")).records()
    best = {}  # coin -> lowest val loss over its epochs (min_delta 0, baseline none)
    for r in records:
        for name, v in zip(r["series"], r["val_loss"], strict=True):
            best[name] = min(best.get(name, math.inf), v)
    for series in SERIES:
        by_setting = {name: best[f"{series}@{name}"] for name in _settings()}
        want = min(by_setting, key=by_setting.get)
        assert out["series"][series]["chosen"] == want
        for name, v in by_setting.items():
            assert out["series"][series]["settings"][name]["best_val_loss"] == pytest.approx(v)


def test_chosen_settings_are_published_as_the_run(full):
    out, results = _read(full), _read(full, "results.json")
    assert set(results["series"]) == set(SERIES)
    for series in SERIES:
        name = out["series"][series]["chosen"]
        cell = out["series"][series]["settings"][name]
        assert results["series"][series]["sweep"]["coin"] == cell["coin"]
        assert results["series"][series]["best_val_loss"] == cell["best_val_loss"]
        params, meta = checkpoint.load_series_model(os.path.join(full, "models", series))
        want, _ = checkpoint.load_series_model(os.path.join(full, "sweep", "models", cell["coin"]))
        np.testing.assert_array_equal(_flat(params), _flat(want))
        assert meta["series"] == series
        for field in ("learning_rate", "weight_decay"):
            assert meta["config"]["train"][field] == cell[field]
            assert meta["config"]["sweep"][field] == []


def test_the_choice_is_printed_and_each_setting_reported(finished):
    workdir, printed = finished
    out = _read(workdir)
    chosen = [out["series"][s]["chosen"] for s in SERIES]
    counts = {name: chosen.count(name) for name in _settings()}
    text = " ".join(printed.split())  # the console wraps long lines
    said = ", ".join(f"{n} by {c}" for n, c in counts.items() if c)
    assert f"Sweep choice (sweep.select=series, by each series' val loss): {said} series." in text
    with open(os.path.join(workdir, "report.md")) as f:
        md = f.read()
    assert "## Sweep" in md
    for name in _settings():
        losses = [out["series"][s]["settings"][name]["best_val_loss"] for s in SERIES]
        row = md.split(f"| {name} | ")[1].split("\n")[0].split(" | ")
        assert float(row[0]) == pytest.approx(float(np.median(losses)), rel=1e-3)
        assert int(row[2]) == counts[name]
    with open(os.path.join(workdir, "report.html")) as f:
        page = f.read()
    assert '<section id="sweep">' in page and 'id="sweep-table"' in page


def test_evaluate_mode_rescores_the_published_models(full, env, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(full, workdir)
    cmd = [sys.executable, "launch.py", "--mode=evaluate", f"--workdir={workdir}"]
    proc = subprocess.run(cmd, env=env, cwd=helpers.ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (evaluated,) = [f for f in os.listdir(workdir) if f.startswith("eval-") and f.endswith("json")]
    got, want = _read(workdir, evaluated)["series"], _read(full, "results.json")["series"]
    for series in SERIES:
        close = lambda e: e["test"]["columns"]["close"]["mae"]  # noqa: E731
        assert close(got[series]) == pytest.approx(close(want[series]), rel=1e-6)


def test_rerun_with_another_grid_is_refused(full):
    path = os.path.join(full, "sweep.json")
    with open(path, "rb") as f:
        before = f.read()
    config = sweep_config()
    config.sweep.learning_rate = (1e-3, 1e-2)
    with pytest.raises(ledger.RunMismatch):
        sweep.run_sweep(config, str(full))
    with open(path, "rb") as f:
        assert f.read() == before


def test_rerun_with_pooled_select_resumes_and_only_chooses_again(full, env, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(full, again)
    proc = helpers.spawn("sweep_test", "run_pooled", again, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "group-000 already finished" in proc.stderr
    a, b = _read(again), _read(full)
    assert a["sweep"] == {**b["sweep"], "select": "pooled"}
    for series in SERIES:  # the same trained coins
        assert a["series"][series]["settings"] == b["series"][series]["settings"]
    # The pooled choice, recomputed by a plain loop from sweep.json's val losses.
    ratios = {name: [] for name in _settings()}
    for series in SERIES:
        cells = b["series"][series]["settings"]
        low = min(cells[n]["best_val_loss"] for n in _settings())
        for name in _settings():
            ratios[name].append(cells[name]["best_val_loss"] / low)
    mean = {name: sum(r) / len(r) for name, r in ratios.items()}
    want = min(mean, key=mean.get)
    assert a["pooled_scores"] == pytest.approx(mean)
    assert {s: a["series"][s]["chosen"] for s in SERIES} == dict.fromkeys(SERIES, want)
    results = _read(again, "results.json")["series"]
    assert {s: results[s]["sweep"]["setting"] for s in SERIES} == dict.fromkeys(SERIES, want)


def test_a_pooled_sweep_trains_each_setting_as_one_pooled_model_alone(others):
    pooled = others / "pooled"
    records = writers.MetricsLog(os.path.join(pooled, "sweep", "sweep")).records()
    groups = {r["group"]: r["series"] for r in records}
    # One group per setting in grid order, each holding every series at that setting ...
    assert list(groups.values()) == [[f"{s}@{name}" for s in SERIES] for name in _pooled_settings()]
    compiles = [c["program"] for c in _read(pooled / "sweep", "timings.json")["compiles"]]
    assert compiles.count("jit(run_epoch)") == 1  # ... all run by one compiled program.
    models = os.path.join(pooled, "sweep", "sweep", "models")
    flat = {}
    for name in _pooled_settings():  # Each setting is ONE model: its coins keep the same params.
        first, second = (
            checkpoint.load_series_model(os.path.join(models, f"{s}@{name}"))[0] for s in SERIES
        )
        np.testing.assert_array_equal(_flat(first), _flat(second))
        flat[name] = _flat(first)
    # The setting equals a pooled run with its values in config.train (another program's
    # schedule x lr_mult: equal up to float32 rounding), and every other setting differs.
    alone_name = "lr={learning_rate!r},wd={weight_decay!r}".format(**POOLED_ALONE)
    cells = _read(pooled / "sweep")["series"]
    alone = _read(pooled / "alone", "results.json")["series"]
    for series in SERIES:
        cell = cells[series]["settings"][alone_name]
        assert alone[series]["best_epoch"] == cell["best_epoch"] >= 1
        assert alone[series]["best_val_loss"] == pytest.approx(cell["best_val_loss"], rel=1e-5)
        for col in ("close", "high", "low"):
            got, want = alone[series]["test"]["columns"][col], cell["test"]["columns"][col]
            assert got["mae"] == pytest.approx(want["mae"], rel=1e-5)
    p_alone, _ = checkpoint.load_series_model(os.path.join(pooled, "alone", "models", SERIES[0]))
    # Adam's step on a param whose gradient is ~0 follows the gradient's rounding: with the
    # decay's L2 term one of 2281 params ended 2.4e-4 apart (of params ~0.3), so atol 1e-3.
    np.testing.assert_allclose(_flat(p_alone), flat[alone_name], rtol=1e-4, atol=1e-3)
    for name in _pooled_settings():
        if name != alone_name:
            assert np.abs(flat[name] - flat[alone_name]).max() > 1e-4, name


def test_a_compacted_sweep_trains_and_chooses_as_the_whole_one(others):
    root = others / "compacted"
    records = writers.MetricsLog(os.path.join(root, "compacted", "sweep")).records()
    assert min(r["coins_computed"] for r in records) < 8  # the program did shrink
    whole, compacted = _read(root / "whole"), _read(root / "compacted")
    for series in SERIES:
        a, b = whole["series"][series], compacted["series"][series]
        assert a["chosen"] == b["chosen"]
        for name in _settings():
            for field in ("status", "best_epoch", "epochs_run"):
                assert a["settings"][name][field] == b["settings"][name][field], (name, field)
            # Another program size: equal up to float32 rounding (as the fold-alone test).
            want = a["settings"][name]["best_val_loss"]
            assert b["settings"][name]["best_val_loss"] == pytest.approx(want, rel=1e-5)
